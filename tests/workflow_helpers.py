"""Helpers shared by the workflow tests: a work directory with its own config and sheet,
the tiny real demo data set, and running Snakemake on it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml
from conftest import ROOT

BIN = Path(sys.executable).parent
SNAKEMAKE = [str(BIN / "snakemake"), "--snakefile", str(ROOT / "workflow" / "Snakefile")]

TINY_CONFIG = {
    "seed": 7,
    "normalize": {"n_top_genes": 256},
    "model": {"patch_size": 8, "d_model": 32, "n_heads": 2, "n_layers": 1, "latent_dim": 8},
    "training": {"max_epochs": 3, "batch_size": 32},
    "device": "cpu",
    "resources": {"train": {"threads": 1}},
}


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # jobs run `python -m locusformer`
    return env


def _snakemake(workdir: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SNAKEMAKE, "--directory", str(workdir), *args],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=timeout,
        check=False,
    )


def _workdir(tmp_path: Path, config: dict, rows: list[dict]) -> Path:
    (tmp_path / "config").mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(tmp_path / "config" / "datasets.tsv", sep="\t", index=False)
    config = {"datasets": "config/datasets.tsv", **config}
    (tmp_path / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    return tmp_path


def _demo_row(name: str = "demo") -> dict:
    return {
        "name": name,
        "expression": str(ROOT / "resources/demo/cellbench_counts.tsv.gz"),
        "samples": str(ROOT / "resources/demo/cellbench_samples.tsv"),
        "batch_key": "protocol",
        "label_key": "cell_line",
        "genes": str(ROOT / "resources/hs_gene_coordinates.tsv.gz"),
        "gene_id": "ensembl_id",
        "value_type": "counts",
    }


def _tiny_demo(tmp_path: Path) -> dict:
    """A quarter of the demo cells: small enough to train in seconds, still real data."""
    counts = pd.read_csv(ROOT / "resources/demo/cellbench_counts.tsv.gz", sep="\t", index_col=0)
    sheet = pd.read_csv(ROOT / "resources/demo/cellbench_samples.tsv", sep="\t", index_col=0)
    cells = sheet.groupby(["protocol", "cell_line"]).sample(frac=0.25, random_state=0)
    counts = counts[cells.index]
    counts = counts[(counts > 0).sum(axis=1) >= 10]
    data = tmp_path / "data"
    data.mkdir()
    counts.to_csv(data / "counts.csv.gz")
    cells.to_csv(data / "samples.csv")
    row = _demo_row("tiny")
    row.update(expression=str(data / "counts.csv.gz"), samples=str(data / "samples.csv"))
    return row
