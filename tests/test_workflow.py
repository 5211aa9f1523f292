"""The Snakemake workflow: validation, the rule chain, style, and an end-to-end run."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import numpy as np
import pandas as pd
import pytest
from browser import ARTIFACTS, CHROMIUM, probe, screenshot
from conftest import ROOT
from workflow_helpers import (
    BIN,
    TINY_CONFIG,
    _demo_row,
    _env,
    _snakemake,
    _tiny_demo,
    _workdir,
)


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


def test_a_typo_in_the_training_keys_fails_the_dry_run_in_one_line(tmp_path):
    workdir = _workdir(tmp_path, {"training": {"max_epoch": 5}}, [_demo_row()])
    started = time.monotonic()
    result = _snakemake(workdir, "-n")
    assert time.monotonic() - started < 60
    assert result.returncode == 1
    said = [line for line in (result.stdout + result.stderr).splitlines() if "error" in line]
    assert len(said) == 1, result.stdout + result.stderr
    assert said[0].startswith("locusformer workflow: error: config: training: unknown key")
    assert "'max_epoch'" in said[0] and "max_epochs" in said[0]  # the valid keys
    assert "Failed validating" not in result.stderr  # no schema dump
    assert not (workdir / "results").exists()


def test_combat_mod_without_protect_is_refused_before_any_job(tmp_path):
    workdir = _workdir(tmp_path, {"baselines": ["combat_mod"]}, [_demo_row()])
    result = _snakemake(workdir, "-n")
    assert result.returncode != 0
    assert "protect names no sample-sheet column" in result.stdout + result.stderr


def test_the_optional_baselines_are_planned_with_their_arguments(tmp_path):
    config = {"baselines": ["combat_mod", "sysvi"], "protect": ["cell_line"]}
    workdir = _workdir(tmp_path, config, [_demo_row()])
    result = _snakemake(workdir, "-n", "-p")
    assert result.returncode == 0, result.stdout + result.stderr
    commands = [line for line in result.stdout.splitlines() if "locusformer baseline" in line]
    mod = [c for c in commands if "--method combat_mod" in c]
    sysvi = [c for c in commands if "--method sysvi" in c]
    assert len(mod) == 1 and "--protect cell_line" in mod[0]
    assert len(sysvi) == 1 and "--protect" not in sysvi[0] and "--counts" not in sysvi[0]
    assert "results/demo/metrics/combat_mod.tsv" in result.stdout


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
