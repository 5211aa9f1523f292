"""Interruptions and reruns of the workflow on a tiny real dataset.

A run killed with SIGKILL during training resumes from its checkpoint and ends with the
output of an uninterrupted run; a changed parameter reruns its step and what depends on
it, nothing else; an unchanged config reruns nothing.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from workflow_helpers import SNAKEMAKE, TINY_CONFIG, _env, _snakemake, _tiny_demo, _workdir

pytestmark = pytest.mark.slow

TARGET = "results/tiny/corrected.parquet"
CONFIG = {
    **TINY_CONFIG,
    # Enough epochs that a kill lands mid-training; patience past the end, so the run
    # always trains every epoch and the interrupted and uninterrupted runs are comparable.
    "training": {"max_epochs": 60, "batch_size": 8, "adversary_rampup_epochs": 2, "patience": 100},
}
CHECKPOINT = "results/tiny/checkpoints/train.pt"


@pytest.fixture(scope="module")
def tiny_row(tmp_path_factory) -> dict:
    return _tiny_demo(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_row) -> Path:
    """An uninterrupted run up to the corrected matrix."""
    workdir = _workdir(tmp_path_factory.mktemp("uninterrupted"), CONFIG, [tiny_row])
    result = _snakemake(workdir, "--cores", "2", TARGET)
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


def _outputs(workdir: Path) -> list[str]:
    return sorted(
        str(p.relative_to(workdir)) for p in (workdir / "results").rglob("*") if p.is_file()
    )


def test_sigkill_during_training_then_rerun_resumes_and_ends_the_same(tmp_path, tiny_row, finished):
    workdir = _workdir(tmp_path, CONFIG, [tiny_row])
    # The whole run dies at once, Snakemake included, as when a node is lost.
    run = subprocess.Popen(
        [*SNAKEMAKE, "--directory", str(workdir), "--cores", "2", TARGET],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=_env(),
        start_new_session=True,
    )
    checkpoint = workdir / CHECKPOINT
    deadline = time.monotonic() + 300
    try:
        while not checkpoint.exists():  # training has finished at least one epoch
            assert run.poll() is None, "the run ended before training wrote a checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.01)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    epochs_done = torch.load(checkpoint, weights_only=True)
    assert 0 < epochs_done["epoch"] < CONFIG["training"]["max_epochs"], "killed mid-training"

    # Nothing a later rule would take for a finished output: training's outputs are absent,
    # and whatever was being written at the kill has a temporary name.
    left = _outputs(workdir)
    assert not [p for p in left if "/model/" in p or p.endswith("corrected.parquet")], left
    assert all(p.startswith("results/tiny/") for p in left)

    # Snakemake itself was killed: its lock stays until --unlock (as Snakemake says).
    locked = _snakemake(workdir, "--cores", "2", TARGET)
    assert locked.returncode != 0 and "unlock" in locked.stdout + locked.stderr
    assert _snakemake(workdir, "--unlock").returncode == 0
    rerun = _snakemake(workdir, "--cores", "2", TARGET)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert re.search(r"^normalize\s", rerun.stdout + rerun.stderr, re.M) is None, (
        "finished steps do not run again"
    )

    # Resumed, not restarted: the epochs before the kill are the checkpoint's own records.
    history = pd.read_csv(workdir / "results/tiny/model/history.tsv", sep="\t")
    assert len(history) == CONFIG["training"]["max_epochs"]
    before = pd.DataFrame(epochs_done["history"])
    np.testing.assert_allclose(
        history["seconds"].to_numpy()[: len(before)], before["seconds"].to_numpy(), rtol=1e-12
    )
    # ... and the result is the uninterrupted run's.
    resumed = pd.read_parquet(workdir / TARGET)
    reference = pd.read_parquet(finished / TARGET)
    pd.testing.assert_index_equal(resumed.index, reference.index)
    pd.testing.assert_index_equal(resumed.columns, reference.columns)
    np.testing.assert_allclose(resumed.to_numpy(), reference.to_numpy(), rtol=0, atol=1e-6)


def _planned(workdir: Path, config: dict) -> set[str]:
    """Rules a run would execute for TARGET with this config (a dry run)."""
    path = workdir / "config" / "config.yaml"
    original = path.read_text()
    try:
        path.write_text(yaml.safe_dump({"datasets": "config/datasets.tsv", **config}))
        result = _snakemake(workdir, TARGET, "-n", "--quiet", "rules")
    finally:
        path.write_text(original)
    assert result.returncode == 0, result.stderr[-3000:]
    if "Nothing to be done" in result.stdout + result.stderr:
        return set()
    table = result.stdout.split("Job stats:", 1)[1].split("total", 1)[0]
    return {line.split()[0] for line in table.splitlines()[3:] if line.strip()}


def _changed(section: str, **values) -> dict:
    config = {k: (dict(v) if isinstance(v, dict) else v) for k, v in CONFIG.items()}
    config[section] = {**config.get(section, {}), **values}
    return config


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (CONFIG, set()),
        (_changed("training", max_epochs=59), {"train", "correct"}),
        (_changed("normalize", n_top_genes=200), {"normalize", "order_loci", "train", "correct"}),
        (_changed("correct", chunk_size=7), {"correct"}),
    ],
    ids=["nothing changed", "training", "normalize", "correct"],
)
def test_a_changed_parameter_reruns_its_step_and_what_depends_on_it(finished, config, expected):
    assert _planned(finished, config) == expected
