"""The Snakemake workflow: validation, the rule chain, style, and an end-to-end run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from browser import ARTIFACTS, CHROMIUM, probe, screenshot
from conftest import ROOT

BIN = Path(sys.executable).parent
SNAKEMAKE = [str(BIN / "snakemake"), "--snakefile", str(ROOT / "workflow" / "Snakefile")]


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


def test_dry_run_of_the_default_config_shows_the_rule_chain():
    result = subprocess.run(
        [str(BIN / "snakemake"), "-n", "--forceall", "--quiet", "rules"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_env(),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for rule in ("normalize", "order_loci", "train", "correct"):
        assert rule in result.stdout


def test_lint_and_format_are_clean():
    lint = subprocess.run(
        [str(BIN / "snakemake"), "--lint"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "Congratulations" in lint.stdout + lint.stderr
    fmt = subprocess.run(
        [str(BIN / "snakefmt"), "--check", "workflow"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert fmt.returncode == 0, fmt.stderr


def test_config_that_fails_its_schema_is_refused(tmp_path):
    workdir = _workdir(tmp_path, {"normalize": {"n_top_genes": -5}}, [_demo_row()])
    result = _snakemake(workdir, "-n")
    assert result.returncode != 0
    said = result.stdout + result.stderr
    assert "n_top_genes" in said and "minimum" in said


@pytest.mark.parametrize("name", ["../escape", "a b", "-rf", "x;rm"])
def test_dataset_name_must_be_a_safe_path_component(tmp_path, name):
    workdir = _workdir(tmp_path, {}, [_demo_row(name)])
    result = _snakemake(workdir, "-n")
    assert result.returncode != 0
    assert "does not match" in result.stdout + result.stderr
    assert not (workdir / "results").exists()


def test_another_datasets_sheet_is_chosen_from_the_command_line(tmp_path):
    workdir = _workdir(tmp_path, {}, [_demo_row("first")])
    pd.DataFrame([_demo_row("second")]).to_csv(tmp_path / "other.tsv", sep="\t", index=False)
    result = _snakemake(workdir, "-n", "--config", "datasets=other.tsv")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "results/second/report.html" in result.stdout
    assert "results/first/" not in result.stdout


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


TINY_CONFIG = {
    "seed": 7,
    "normalize": {"n_top_genes": 256},
    "model": {"patch_size": 8, "d_model": 32, "n_heads": 2, "n_layers": 1, "latent_dim": 8},
    "training": {"max_epochs": 3, "batch_size": 32},
    "device": "cpu",
    "resources": {"train": {"threads": 1}},
}


@pytest.mark.slow
def test_end_to_end_on_a_tiny_real_dataset(tmp_path):
    workdir = _workdir(tmp_path, TINY_CONFIG, [_tiny_demo(tmp_path)])
    result = _snakemake(workdir, "--cores", "2")
    assert result.returncode == 0, result.stderr[-4000:]
    out = workdir / "results" / "tiny"
    stats = json.loads((out / "stats" / "normalize.json").read_text())
    assert stats["n_genes_kept"] == 256 and set(stats["samples_per_batch"]) == {
        "CEL-seq2",
        "Drop-seq",
    }
    loci = pd.read_parquet(out / "loci.parquet")
    assert loci["placed"].mean() > 0.8
    ordered = pd.read_parquet(out / "ordered.parquet")
    corrected = pd.read_parquet(out / "corrected.parquet")
    assert corrected.columns.tolist() == ordered.columns.tolist() == loci["gene_id"].tolist()
    assert corrected.index.tolist() == ordered.index.tolist()
    assert np.isfinite(corrected.to_numpy()).all()
    latent = pd.read_parquet(out / "latent.parquet")
    assert latent.shape == (len(ordered), 8)
    history = pd.read_csv(out / "model" / "history.tsv", sep="\t")
    assert 1 <= len(history) <= 3
    for rule in ("normalize", "order_loci", "train", "correct"):
        assert (workdir / "benchmarks" / "out" / "tiny" / f"{rule}.tsv").exists()
    metrics = pd.read_csv(out / "metrics.tsv", sep="\t")
    assert set(metrics["method"]) == {
        "uncorrected",
        "combat",
        "harmony",
        "locusformer",
        "locusformer_latent",
    }
    summary = pd.read_csv(workdir / "results" / "summary.tsv", sep="\t")
    ok = summary[summary["status"] == "ok"]
    assert len(ok) == 5 and ok[["batch", "bio", "total", "wall_s"]].notna().all().all()
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "locusformer" in html and "harmony" in html
    index = (workdir / "results" / "index.html").read_text(encoding="utf-8")
    assert 'href="tiny/report.html"' in index
    assert sorted(p.name for p in (out / "figures").glob("*.png"))[:2] == [
        "01_loci.png",
        "02_training.png",
    ]
    if CHROMIUM.exists():
        page = probe(out / "report.html", tmp_path)
        assert page["errors"] == [] and page["broken"] == [] and page["images"] >= 8
        screenshot(out / "report.html", ARTIFACTS / "demo_report.png", tmp_path)
    # A second run has nothing to do.
    again = _snakemake(workdir, "-n", "--quiet", "rules")
    assert again.returncode == 0 and "train" not in again.stdout


def test_workflow_needs_no_shared_data():
    for path in (ROOT / "workflow").rglob("*"):
        if path.is_file():
            assert "shared/" not in path.read_text(errors="ignore"), path
    assert shutil.which("snakemake", path=str(BIN))
