"""The Snakemake workflow: validation, the rule chain, style, and an end-to-end run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import zipfile

import anndata
import numpy as np
import pandas as pd
import pytest
from browser import ARTIFACTS, CHROMIUM, probe, screenshot
from conda_envs import env_packages, own_imports, rules
from conftest import ROOT
from workflow_helpers import (
    BIN,
    TEST_DIR,
    _demo_row,
    _env,
    _snakemake,
    _test_copy,
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
    for rule in ("normalize", "order_loci", "train", "correct", "inspect", "report"):
        assert rule in result.stdout


def test_the_counts_job_is_planned_only_for_scvi():
    # The raw counts are written for scVI alone; without it no job writes them.
    planned = {}
    for extra in ([], ["--configfile", ".test/config/scvi.yaml"]):
        result = subprocess.run(
            [str(BIN / "snakemake"), "-n", "--forceall", "--quiet", "rules", "--directory",
             ".test", *extra],
            cwd=ROOT, capture_output=True, text=True, env=_env(), check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        planned[bool(extra)] = result.stdout
    assert "counts " not in planned[False] and "baseline " in planned[False]
    assert "counts " in planned[True]


def test_lint_and_format_are_clean():
    lint = subprocess.run(
        [str(BIN / "snakemake"), "--lint"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_env(),
        check=False,
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


def test_one_metrics_job_per_dataset_scores_every_method(tmp_path):
    workdir = _workdir(tmp_path, {}, [_demo_row("first"), _demo_row("second")])
    result = _snakemake(workdir, "-n", "-p")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    scoring = [line for line in lines if "-m locusformer metrics " in line]
    reports = [line for line in lines if "-m locusformer report " in line]
    assert len(scoring) == 2 and len(reports) == 2
    methods = ("uncorrected", "combat", "harmony", "locusformer", "locusformer_latent")
    for name in ("first", "second"):
        [command] = [c for c in scoring if f"results/{name}/" in c]
        for method in methods:
            assert f"--result {method}=results/{name}/integrated/{method}.h5ad" in command
            assert f"--out {method}=results/{name}/metrics/{method}.tsv" in command
        assert f"--uncorrected results/{name}/integrated/uncorrected.h5ad" in command
        assert "--max-samples 50000" in command  # metrics.max_samples's default
        [report] = [c for c in reports if f"--dataset {name} " in c]
        assert "--max-samples 50000" in report  # its embeddings: the scored subsample
        assert f"--benchmark metrics=logs/benchmarks/{name}/metrics.tsv" in report


def test_metrics_max_samples_is_passed_and_checked(tmp_path):
    workdir = _workdir(tmp_path / "ok", {"metrics": {"max_samples": 1234}}, [_demo_row()])
    result = _snakemake(workdir, "-n", "-p")
    assert result.returncode == 0, result.stdout + result.stderr
    [command] = [line for line in result.stdout.splitlines() if "-m locusformer metrics " in line]
    assert "--max-samples 1234" in command
    [report] = [line for line in result.stdout.splitlines() if "-m locusformer report " in line]
    assert "--max-samples 1234" in report  # the report draws the same subsample
    workdir = _workdir(tmp_path / "bad", {"metrics": {"max_samples": 1}}, [_demo_row()])
    result = _snakemake(workdir, "-n")
    assert result.returncode != 0
    said = result.stdout + result.stderr
    assert "config: metrics.max_samples: 1 is less than the minimum of 2" in said, said


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


# The slow tests below share one tiny run of .test/config (about 5 min on 2 cores): its
# outputs, its report and the imports of its jobs are each checked on that one run.
IMPORT_PROBE = ROOT / "tests" / "import_probe"


def _probe_env(folder) -> dict:
    """Snakemake's environment with tests/import_probe recording every job's imports."""
    folder.mkdir(exist_ok=True)
    pythonpath = [str(IMPORT_PROBE), *filter(None, [os.environ.get("PYTHONPATH")])]
    return _env(PYTHONPATH=os.pathsep.join(pythonpath), LOCUSFORMER_IMPORTS=str(folder))


def _jobs_imports(folder) -> dict[str, list[set[str]]]:
    """locusformer command -> the distributions each of its jobs' own code imported."""
    jobs: dict[str, list[set[str]]] = {}
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        argv = record["argv"]
        if argv and argv[0].endswith(os.path.join("locusformer", "__main__.py")):
            jobs.setdefault(argv[1], []).append(own_imports(record["modules"]))
    return jobs


def _assert_envs_cover(jobs: dict[str, list[set[str]]]) -> None:
    by_command = {}
    for name, rule in rules().items():
        by_command.setdefault(rule["command"], []).append((name, rule["env"]))
    missing = []
    for command, imports in jobs.items():
        for name, env in by_command[command]:
            listed = set(env_packages(env))
            for needed in imports:
                missing += [(name, env.name, dist) for dist in sorted(needed - listed)]
    assert not missing, f"imported by a job, not in its rule's conda env: {sorted(set(missing))}"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_run")
    workdir = _test_copy(root)
    started = time.monotonic()
    result = _snakemake(workdir, "--cores", "2", env=_probe_env(root / "imports"))
    assert result.returncode == 0, result.stderr[-4000:]
    print(f"tiny run: {time.monotonic() - started:.0f} s")
    return {"workdir": workdir, "imports": root / "imports", "tmp": root}


@pytest.mark.slow
def test_end_to_end_on_a_tiny_real_dataset(tiny_run):
    workdir, tmp_path = tiny_run["workdir"], tiny_run["tmp"]
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
    for rule in ("normalize", "order_loci", "train", "correct", "inspect"):
        assert (workdir / "logs" / "benchmarks" / "tiny" / f"{rule}.tsv").exists()
    trace = json.loads((out / "inspect.json").read_text())
    assert len(trace["samples"]) == 8 and trace["seed"] == 7  # .test/config: seed 7
    assert [run["first_nonfinite"] for run in trace["runs"]] == [None, None]
    assert "first non-finite value: none" in (out / "inspect.txt").read_text()
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
    assert '<section id="trace">' in html and 'id="trace-layer-0"' in html
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


def _captioned_outputs() -> list[str]:
    """The output patterns that the rules mark with report(..., caption=...)."""
    patterns = []
    for path in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        text = path.read_text()
        patterns += re.findall(r'report\(\s*(?:directory\()?\s*"([^"]+)"', text)
    return patterns


@pytest.mark.slow
def test_the_report_holds_every_captioned_output(tiny_run):
    workdir = tiny_run["workdir"]
    started = time.monotonic()
    result = _snakemake(workdir, "--report", "report.zip", timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    print(f"report: {time.monotonic() - started:.0f} s")
    # The archive holds report/report.html and each file as report/data/raw/HASH/NAME.
    with zipfile.ZipFile(workdir / "report.zip") as archive:
        inside = {}
        for name in archive.namelist():
            inside.setdefault(name.rsplit("/", 1)[-1], []).append(archive.read(name))
        html = archive.read("report/report.html").decode()
    patterns = _captioned_outputs()
    assert len(patterns) >= 6, patterns
    for pattern in patterns:
        path = workdir / pattern.replace("{dataset}", "tiny")
        # A directory (the figures) is in the report file by file, Snakemake's marker aside.
        files = [path]
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if not p.name.startswith("."))
        assert files and all(f.is_file() for f in files), path
        for file in files:
            assert file.read_bytes() in inside.get(file.name, []), (file, "not in report.zip")
    assert 'id="workflow-desc"' in html and "LocusFormer: batch-effect correction" in html


@pytest.mark.slow
def test_every_job_imports_only_what_its_rules_conda_env_lists(tiny_run):
    jobs = _jobs_imports(tiny_run["imports"])
    commands = {rule["command"] for rule in rules().values()}
    # map runs for a dataset mapped onto a trained model, not in the tiny run:
    # tests/test_workflow_mapping.py checks its job's imports; counts runs for scVI only,
    # and test_the_scvi_config_runs_the_scvi_baseline checks its job's.
    assert set(jobs) == commands - {"map", "counts"}, "every rule ran and was recorded"
    assert {"torch"} <= set().union(*jobs["train"])  # the probe saw the lazy imports
    _assert_envs_cover(jobs)


@pytest.mark.slow
def test_an_h5ad_input_normalizes_like_the_same_counts_as_csv(tiny_run, tmp_path):
    workdir = _test_copy(tmp_path)
    h5ad = workdir / "config" / "h5ad.yaml"
    target = "results/tiny_h5ad/ordered.parquet"
    result = _snakemake(workdir, target, "--cores", "2", "--configfile", str(h5ad))
    assert result.returncode == 0, result.stderr[-4000:]
    for name in ("normalized.parquet", "ordered.parquet"):
        from_h5ad = pd.read_parquet(workdir / "results" / "tiny_h5ad" / name)
        from_csv = pd.read_parquet(tiny_run["workdir"] / "results" / "tiny" / name)
        pd.testing.assert_frame_equal(from_h5ad, from_csv)


@pytest.mark.slow
def test_the_scvi_config_runs_the_scvi_baseline(tmp_path):
    pytest.importorskip("scvi")
    workdir = _test_copy(tmp_path)
    scvi = workdir / "config" / "scvi.yaml"
    target = "results/tiny/integrated/scvi.h5ad"
    env = _probe_env(tmp_path / "imports")
    result = _snakemake(workdir, target, "--cores", "2", "--configfile", str(scvi), env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    adata = anndata.read_h5ad(workdir / target)
    assert adata.uns.get("status", "ok") == "ok", adata.uns
    jobs = _jobs_imports(tmp_path / "imports")
    assert "scvi-tools" in set().union(*jobs["baseline"])
    assert "counts" in jobs  # the raw counts, written for scVI alone
    _assert_envs_cover(jobs)


@pytest.mark.slow
def test_the_workflow_runs_as_a_module_with_and_without_a_prefix(tmp_path):
    workdir = _test_copy(tmp_path)
    module = ["--snakefile", str(TEST_DIR / "module" / "Snakefile"), "--config", "baselines=[]"]
    # Planned whole, both modules: every rule of each, under its own name.
    planned = _snakemake(workdir, *module, "-n", "--quiet", "rules")
    assert planned.returncode == 0, planned.stderr[-4000:]
    for name in ("train", "metrics", "report", "summarize", "index"):
        assert f"locusformer_{name} " in planned.stdout and f"prefixed_{name} " in planned.stdout
    # Run: the prefixed module end to end, the plain one up to the ordered matrix (the tiny
    # run above is the same rules end to end without a module).
    started = time.monotonic()
    targets = ["prefixed_all", "results/tiny/ordered.parquet"]
    result = _snakemake(workdir, *targets, "--cores", "2", *module)  # --config takes the rest
    assert result.returncode == 0, result.stderr[-4000:]
    print(f"module run: {time.monotonic() - started:.0f} s")
    results = workdir / "prefixed" / "results"
    summary = pd.read_csv(results / "summary.tsv", sep="\t")
    assert set(summary["method"]) == {"uncorrected", "locusformer", "locusformer_latent"}
    assert (summary["status"] == "ok").all(), summary
    assert (results / "tiny" / "report.html").exists()
    assert 'href="tiny/report.html"' in (results / "index.html").read_text()
    assert (results / "tiny" / "checkpoints" / "train.pt").exists()
    assert (workdir / "prefixed" / "logs" / "tiny" / "train.log").exists()
    # Nothing of the prefixed module landed outside its prefix: results/ holds the plain
    # module's normalize and order_loci outputs only.
    plain = workdir / "results"
    assert {p.relative_to(plain).as_posix() for p in plain.rglob("*") if p.is_file()} == {
        f"tiny/{name}"
        for name in (
            "normalized.parquet",
            "samples.tsv",
            "stats/normalize.json",
            "loci.parquet",
            "ordered.parquet",
            "stats/loci.json",
        )
    }


def test_workflow_needs_no_shared_data():
    for path in (ROOT / "workflow").rglob("*"):
        if path.is_file():
            assert "shared/" not in path.read_text(errors="ignore"), path
    assert shutil.which("snakemake", path=str(BIN))
