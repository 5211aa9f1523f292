"""Helpers shared by the workflow tests: a work directory with its own config and sheet,
the tiny real demo data set, the test configs of .test/, and running Snakemake on them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml
from conftest import ROOT

BIN = Path(sys.executable).parent
SNAKEMAKE = [str(BIN / "snakemake"), "--snakefile", str(ROOT / "workflow" / "Snakefile")]

# The test configs and their data, as catalog workflows keep them (.test/README.md).
TEST_DIR = ROOT / ".test"
# The tiny run's settings (a one-layer model, three epochs), for tests with data of their own.
TINY_CONFIG = {
    key: value
    for key, value in yaml.safe_load((TEST_DIR / "config" / "config.yaml").read_text()).items()
    if key != "datasets"
}


def _env(**extra: str) -> dict:
    """The environment the workflow tests run Snakemake's local executor in.

    Where no ``SLURM_CONF`` is set, an empty one: the SLURM executor plugin, installed
    with the ``slurm`` extra, runs ``scontrol show config`` at every Snakemake start (for
    its help text), and where a SLURM client is installed but its controller is down (as
    after the cluster test stops its cluster) scontrol retries for the plugin's 10 s
    timeout: a dry-run test took 12 s instead of 4. With an empty configuration scontrol
    fails at once. The cluster test runs in :func:`_cluster_env`.
    """
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # jobs run `python -m locusformer`
    env.setdefault("SLURM_CONF", os.devnull)
    env.update(extra)
    return env


def _cluster_env() -> dict:
    """:func:`_env` with the machine's SLURM configuration, for runs on a SLURM cluster."""
    env = _env()
    if "SLURM_CONF" not in os.environ:
        del env["SLURM_CONF"]
    return env


def _snakemake(
    workdir: Path, *args: str, timeout: int = 900, env: dict | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SNAKEMAKE, "--directory", str(workdir), *args],
        capture_output=True,
        text=True,
        env=env or _env(),
        timeout=timeout,
        check=False,
    )


def _test_copy(tmp_path: Path) -> Path:
    """A copy of .test/ (configs and data) to run in, with ../resources beside it as in
    the repository; returns the copy's folder, the working directory of its runs."""
    workdir = tmp_path / ".test"
    for part in ("config", "data"):
        shutil.copytree(TEST_DIR / part, workdir / part)
    (tmp_path / "resources").symlink_to(ROOT / "resources")
    return workdir


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
