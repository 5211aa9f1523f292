"""The SLURM profile, run for real: a single-node cluster, the tiny demo, checked with sacct.

tests/slurm/start_slurm.sh installs (Debian packages) and starts munge, slurmdbd with
MariaDB, slurmctld and slurmd with one fake GPU (a gres/gpu on /dev/null: GPU requests
schedule and are accounted, but there is no GPU). That needs root and apt-get; elsewhere
the test is skipped. A cluster the test started is stopped afterwards; one that was
already up is left alone. LOCUSFORMER_SKIP_SLURM=1 skips it on purpose.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import ROOT
from workflow_helpers import TINY_CONFIG, _cluster_env, _snakemake, _tiny_demo, _workdir

START_SLURM = ROOT / "tests" / "slurm" / "start_slurm.sh"
PROFILE = ROOT / "workflow" / "profiles" / "slurm" / "config.yaml"
# start_slurm.sh's defaults: state and daemon logs in /tmp/ci-slurm, partition "debug".
STATE_DIR = os.environ.get("SLURM_CI_DIR", "/tmp/ci-slurm")
PARTITION = os.environ.get("SLURM_PARTITION", "debug")
# The shipped profile's memory expression ("attempt * 4000").
PROFILE_MEMORY = str(yaml.safe_load(PROFILE.read_text())["default-resources"]["mem_mb"])


def _why_not() -> str | None:
    if os.environ.get("LOCUSFORMER_SKIP_SLURM") == "1":
        return "LOCUSFORMER_SKIP_SLURM=1"
    if os.geteuid() != 0:
        return "starting a SLURM cluster needs root"
    if shutil.which("apt-get") is None or shutil.which("dpkg-query") is None:
        return "starting a SLURM cluster needs apt-get (Debian packages)"
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        return "snakemake-executor-plugin-slurm is not installed (pip install -e '.[slurm]')"
    return None


def _cluster_up() -> bool:
    if shutil.which("scontrol") is None:
        return False
    ping = subprocess.run(
        ["scontrol", "ping"], capture_output=True, text=True, timeout=30, check=False
    )
    return ping.returncode == 0 and "UP" in ping.stdout


@pytest.fixture(scope="module")
def slurm_cluster():
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    env = {**os.environ, "SLURM_CI_DIR": STATE_DIR, "SLURM_PARTITION": PARTITION}
    env.pop("SLURM_FAKE_GPUS", None)  # the test needs its fake GPU
    env["SLURM_MEMORY_KILL"] = "1"  # jobs over their memory are killed, as on a real cluster
    was_up = _cluster_up()
    start = subprocess.run(
        ["bash", str(START_SLURM), "start"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    if start.returncode != 0:
        apt_log = Path(STATE_DIR, "log", "apt.log")
        tail = apt_log.read_text(errors="replace")[-2000:] if apt_log.exists() else ""
        pytest.fail(f"start_slurm.sh failed:\n{start.stderr[-3000:]}\n{tail}")
    yield
    if not was_up:
        subprocess.run(["bash", str(START_SLURM), "stop"], env=env, timeout=120, check=False)


def _test_profile(directory: Path) -> Path:
    """The shipped profile with test-sized settings on top (the GPU request is kept)."""
    profile = yaml.safe_load(PROFILE.read_text())
    profile.update(
        {
            "latency-wait": 5,
            "slurm-init-seconds-before-status-checks": 2,
            "slurm-keep-successful-logs": True,
        }
    )
    # Memory stays an expression of the attempt, as in the shipped profile; enough that
    # no job of the demo is killed for memory (a job's RSS includes the snakemake that
    # runs its rule inside it).
    profile["default-resources"].update(
        slurm_partition=PARTITION, mem_mb="attempt * 1500", runtime=5
    )
    profile["set-resources"]["correct"] = {"mem_mb": 3000}
    directory.mkdir()
    (directory / "config.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return directory


def _sacct(job_ids: list[str], done: tuple[str, ...] = ("COMPLETED",)) -> pd.DataFrame:
    fields = ["JobID", "JobName", "State", "ExitCode", "ReqTRES", "AllocTRES", "ReqMem"]
    for _ in range(20):  # slurmctld hands records to slurmdbd asynchronously
        out = subprocess.run(
            ["sacct", "-X", "-P", "-n", "-j", ",".join(job_ids), f"--format={','.join(fields)}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        rows = [line.split("|") for line in out.splitlines() if line.strip()]
        table = pd.DataFrame(rows, columns=fields).set_index("JobID")
        if set(job_ids) <= set(table.index) and table["State"].isin(done).all():
            return table
        time.sleep(1)
    return table


@pytest.mark.slow
def test_demo_runs_as_slurm_jobs_and_train_gets_its_gpu(slurm_cluster, tmp_path):
    config = {
        **TINY_CONFIG,
        "resources": {"train": {"threads": 1, "cpus_per_gpu": 1, "mem_mb": 3000, "runtime": 5}},
    }
    workdir = _workdir(tmp_path / "run", config, [_tiny_demo(tmp_path)])
    profile = _test_profile(tmp_path / "profile")
    targets = ["results/tiny/corrected.parquet", "results/tiny/latent.parquet"]
    env = _cluster_env()
    result = _snakemake(workdir, "--profile", str(profile), *targets, timeout=600, env=env)
    said = result.stdout + result.stderr
    assert result.returncode == 0, said[-5000:]

    # "Job 3 has been submitted with SLURM jobid 4 (log: .../slurm_logs/rule_train/tiny/4.log)."
    pattern = r"submitted with SLURM jobid (\d+) \(log: \S*/rule_(\w+)/"
    submitted = {rule: job for job, rule in re.findall(pattern, said)}
    assert set(submitted) == {"normalize", "order_loci", "train", "correct"}, said[-3000:]
    table = _sacct(list(submitted.values()))
    for rule, job in submitted.items():
        row = table.loc[job]
        assert row["State"] == "COMPLETED" and row["ExitCode"] == "0:0", (rule, row.to_dict())
        assert ("gres/gpu" in row["AllocTRES"]) == (rule == "train"), (rule, row.to_dict())
    train = table.loc[submitted["train"]]
    assert "gres/gpu=1" in train["ReqTRES"] and "gres/gpu=1" in train["AllocTRES"]
    assert "cpu=1," in train["AllocTRES"]  # --cpus-per-gpu from resources.train.cpus_per_gpu
    # attempt-based memory: first attempt = 1x (profile default / rule's own mem_mb)
    assert table.loc[submitted["normalize"], "ReqMem"] == "1500M"
    assert train["ReqMem"] == "3000M"

    corrected = pd.read_parquet(workdir / "results" / "tiny" / "corrected.parquet")
    assert corrected.notna().all().all() and len(corrected) > 50
    log = (
        workdir / ".snakemake" / "slurm_logs" / "rule_train" / "tiny" / f"{submitted['train']}.log"
    )
    assert "rule train:" in log.read_text()


# The job step also holds the snakemake that runs the rule inside the job (about 200-250 MB,
# 636 MB in all with 400 MB held on CI), so the retry's request leaves room for both.
HOLD_MEMORY = "import time\nheld = b'x' * (600 << 20)  # touched, so resident\ntime.sleep(6)\n"
HUNGRY_SNAKEFILE = """
rule hungry:
    output:
        "done.txt",
    shell:
        "{python} hold.py && touch {{output}}"
"""


@pytest.mark.slow
def test_a_job_killed_for_memory_is_retried_with_more(slurm_cluster, tmp_path):
    """The shipped profile's retries and attempt-scaled memory, against a cluster that kills
    a job over its request: a rule holding 600 MB asks for 600 MB (killed), then 1200 MB."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "Snakefile").write_text(HUNGRY_SNAKEFILE.format(python=sys.executable))
    (workdir / "hold.py").write_text(HOLD_MEMORY)
    profile = _test_profile(tmp_path / "profile")
    settings = yaml.safe_load((profile / "config.yaml").read_text())
    assert settings["retries"] >= 1 and "attempt" in str(PROFILE_MEMORY)
    settings["default-resources"]["mem_mb"] = PROFILE_MEMORY.replace("4000", "600")
    (profile / "config.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))
    snakefile = str(workdir / "Snakefile")  # the last --snakefile given is used
    profiled = ["--snakefile", snakefile, "--profile", str(profile)]
    result = _snakemake(workdir, *profiled, timeout=300, env=_cluster_env())
    said = result.stdout + result.stderr
    assert result.returncode == 0, said[-5000:]

    submitted = re.findall(r"submitted with SLURM jobid (\d+) \(log: (\S+)\)", said)
    assert len(submitted) == 2, said[-3000:]
    (first_job, first_log), (second_job, _) = submitted
    table = _sacct([first_job, second_job], done=("COMPLETED", "OUT_OF_MEMORY", "FAILED"))
    first, second = table.loc[first_job], table.loc[second_job]
    # Polling-based enforcement kills the step; the job then fails with it.
    assert first["State"] in {"OUT_OF_MEMORY", "FAILED"} and first["ReqMem"] == "600M", first
    assert "Exceeded job memory limit" in Path(first_log).read_text()
    assert second["State"] == "COMPLETED" and second["ReqMem"] == "1200M", second.to_dict()
    assert (workdir / "done.txt").exists()
