"""Config values in paths and shell commands: quotes, spaces and ``$(...)`` in file names,
column names, batch names and settings reach each command as one argument and run nothing;
outputs stay under results/; two datasets never share a file; a failed rule leaves no
file that a later rule would take for a finished output."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pandas as pd
import pytest
from workflow_helpers import TINY_CONFIG, _demo_row, _snakemake, _tiny_demo, _workdir

# Each would create a file of that name if a shell ever ran it.
MARKERS = [f"PWNED{i}" for i in range(1, 7)]
DATA_DIR = "da ta 'q' \"dq\" $(touch PWNED1) ;x"
BATCH_KEY = "pro\"to col'$(touch PWNED2)"
LABEL_KEY = "cell; touch PWNED3 #"
SAMPLE_COLUMN = 'id "x" `touch PWNED4`'
BATCH = "CEL'seq $(touch PWNED5)"
OTHER_BATCH = "<script>alert('PWNED6')</script>"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> dict:
    """A run with hostile names everywhere, beside a dataset whose annotation fails."""
    root = tmp_path_factory.mktemp("hostile")
    row = _tiny_demo(root)
    data = root / DATA_DIR
    (root / "data").rename(data)
    sheet = pd.read_csv(data / "samples.csv")
    sheet = sheet.rename(
        columns={"sample_id": SAMPLE_COLUMN, "protocol": BATCH_KEY, "cell_line": LABEL_KEY}
    )
    sheet[BATCH_KEY] = sheet[BATCH_KEY].map({"CEL-seq2": BATCH, "Drop-seq": OTHER_BATCH})
    sheet.to_csv(data / "sample's sheet.csv", index=False)
    (data / "genes $(touch PWNED1).tsv.gz").symlink_to(row["genes"])
    evil = {
        **row,
        "name": "evil",
        "expression": str(data / "counts.csv.gz"),
        "samples": str(data / "sample's sheet.csv"),
        "sample_column": SAMPLE_COLUMN,
        "batch_key": BATCH_KEY,
        "label_key": LABEL_KEY,
        "genes": str(data / "genes $(touch PWNED1).tsv.gz"),
    }
    # Matrix ids are Ensembl ids: matched as symbols, no gene is placed and order_loci fails.
    bad = {
        **row,
        "name": "bad",
        "expression": str(data / "counts.csv.gz"),
        "samples": str(data / "samples.csv"),
        "gene_id": "symbol",
    }
    config = {
        **TINY_CONFIG,
        "training": {"max_epochs": 2, "batch_size": 32},
        "correct": {"reference": BATCH},
    }
    workdir = _workdir(root / "work", config, [evil, bad])
    dry = _snakemake(workdir, "-n", "--forceall", "--printshellcmds")
    assert dry.returncode == 0, dry.stderr[-3000:]
    run = _snakemake(
        workdir,
        "--cores", "2", "--keep-going",
        "results/evil/corrected.parquet", "results/bad/ordered.parquet",
    )  # fmt: skip
    return {"root": root, "workdir": workdir, "dry": dry.stdout, "run": run}


def _jobs(dry_run: str) -> list[dict]:
    """The jobs of a dry run: rule, outputs, log, benchmark, wildcards, shell command."""
    jobs = []
    for block in re.split(r"\n(?=\[[^\n]*\]\n(?:local)?rule )", dry_run):
        rule = re.search(r"^(?:local)?rule (\w+):", block, re.M)
        if not rule:
            continue
        job = {"rule": rule.group(1), "files": [], "wildcards": {}, "shell": None}
        for key, value in re.findall(r"^    (\w+): (.*)$", block, re.M):
            if key in ("output", "log", "benchmark"):
                job["files"] += value.split(", ")
            elif key == "wildcards":
                job["wildcards"] = dict(pair.split("=", 1) for pair in value.split(", "))
        shell = re.search(r"^Shell command: (.*)$", block, re.M)
        job["shell"] = shell.group(1) if shell else None
        jobs.append(job)
    return jobs


@pytest.mark.slow
def test_hostile_values_reach_each_command_as_one_argument(hostile):
    jobs = _jobs(hostile["dry"])
    assert len(jobs) > 30
    allowed = {
        "--batch-key": {BATCH_KEY, "protocol"},
        "--label-key": {LABEL_KEY, "cell_line"},
        "--sample-column": {SAMPLE_COLUMN},
        "--reference": {BATCH},
        "--expression": {str(hostile["root"] / DATA_DIR / "counts.csv.gz")},
    }
    seen = set()
    for job in jobs:
        if job["shell"] is None:
            continue
        argv = shlex.split(job["shell"])
        for flag, values in allowed.items():
            for i, token in enumerate(argv[:-1]):
                if token == flag:
                    assert argv[i + 1] in values, (job["rule"], flag, argv[i + 1])
                    seen.add((flag, argv[i + 1]))
        # Nothing hostile stands outside an argument: no token of its own starts a command.
        assert not [t for t in argv if t in {";", "#", "touch"} or t.startswith("$(")], argv
    assert {(f, v) for f, vs in allowed.items() for v in vs if "PWNED" in v} <= seen


@pytest.mark.slow
def test_a_hostile_run_runs_no_injected_code_and_writes_only_its_own_files(hostile):
    workdir, run = hostile["workdir"], hostile["run"]
    out = workdir / "results" / "evil"
    assert (out / "corrected.parquet").exists(), run.stderr[-3000:]
    for where in (workdir, hostile["root"], Path.cwd()):
        assert not [p for p in where.rglob("PWNED*") if p.name in MARKERS]
    assert {p.name for p in workdir.iterdir()} <= {
        "config",
        "results",
        "logs",
        ".snakemake",
    }
    assert {p.name for p in (workdir / "results").iterdir()} == {"evil", "bad"}
    samples = pd.read_csv(out / "samples.tsv", sep="\t", dtype=str, keep_default_na=False)
    assert samples.columns.tolist() == ["sample_id", BATCH_KEY, LABEL_KEY]
    assert set(samples[BATCH_KEY]) == {BATCH, OTHER_BATCH}


@pytest.mark.slow
def test_a_failed_rule_leaves_no_output_a_later_rule_would_take(hostile):
    workdir, run = hostile["workdir"], hostile["run"]
    assert run.returncode != 0, "order_loci of 'bad' fails"
    bad = workdir / "results" / "bad"
    assert (bad / "normalized.parquet").exists(), "the step before it finished and stays"
    for output in ("loci.parquet", "ordered.parquet", "stats/loci.json"):
        assert not (bad / output).exists(), output
    assert not list((workdir / "results").rglob("*.tmp")), "no temporary file left behind"
    log = (workdir / "logs" / "bad" / "order_loci.log").read_text().strip().splitlines()
    assert len(log) == 1 and "error:" in log[0] and "no gene of the matrix" in log[0]


@pytest.mark.slow
def test_two_datasets_never_write_the_same_file(hostile):
    writers: dict[str, str] = {}
    for job in _jobs(hostile["dry"]):
        dataset = job["wildcards"].get("dataset")
        for path in job["files"]:
            assert path not in writers, f"{path}: {writers[path]} and {job['rule']}"
            writers[path] = job["rule"]
            parts = Path(path).parts
            if dataset:  # a dataset's job writes in that dataset's directories only
                assert parts[:2] in {("results", dataset), ("logs", dataset)} or parts[:3] == (
                    "logs",
                    "benchmarks",
                    dataset,
                ), path
            else:
                assert len(parts) <= 3 and parts[0] in {"results", "logs"}, path
    assert any("results/bad/" in p for p in writers) and any("results/evil/" in p for p in writers)


@pytest.mark.parametrize(
    ("names", "said"),
    [
        (["index.html"], "would clash with the workflow's own files"),
        (["summarize.log"], "would clash with the workflow's own files"),
        (["Demo", "demo"], "listed twice (case is ignored): demo"),
    ],
)
def test_dataset_names_that_would_share_files_are_refused(tmp_path, names, said):
    workdir = _workdir(tmp_path, {}, [_demo_row(name) for name in names])
    result = _snakemake(workdir, "-n")
    assert result.returncode != 0
    assert said in result.stdout + result.stderr
    assert not (workdir / "results").exists()


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({"normalize": {"target_sum": float("nan")}}, "normalize.target_sum: must be a finite"),
        ({"training": {"lr": float("inf")}}, "training.lr: must be a finite number"),
        ({"protect": ["protocol"]}, "protect names 'protocol', its batch column"),
        ({"protect": ["genotype"]}, "protect names 'genotype', which the sample sheet"),
    ],
    ids=["nan", "inf", "protect the batch", "protect a missing column"],
)
def test_config_problems_a_dry_run_can_see_are_refused_there(tmp_path, config, said):
    # Seen at `snakemake -n`, before normalize, order-loci and the baselines have run.
    workdir = _workdir(tmp_path, config, [_demo_row()])
    result = _snakemake(workdir, "-n")
    assert result.returncode != 0
    lines = [line for line in (result.stdout + result.stderr).splitlines() if "error" in line]
    assert len(lines) == 1 and said in lines[0], lines
    assert not (workdir / "results").exists()
