"""A step killed while it writes leaves no temporary file behind once it is rerun.

SIGTERM (what SLURM sends at a time-out) removes the temporaries at once; SIGKILL cannot
be caught, so the next run of the step removes what the killed one left beside its own
outputs, and nothing else. Real processes, really killed, while their temporary files
exist.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from locusformer.io.atomic import remove_stale_temporaries
from locusformer.io.parquet import write_matrix_parquet
from locusformer.model.files import save_model
from locusformer.simulate.datasets import simulate
from locusformer.train.loop import train_corrector

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ROWS = 60_000  # enough that correct runs for seconds on one thread


@pytest.fixture(scope="module")
def correct_inputs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("correct")
    sim = simulate(n_samples=120, n_loci=64, seed=0)
    batches = [f"b{b}" for b in sim.batch]
    model, _ = train_corrector(
        sim.X.astype(np.float32),
        batches,
        sim.loci,
        {"d_model": 16, "n_heads": 2, "n_layers": 1, "latent_dim": 4},
        {"max_epochs": 1},
        seed=0,
        progress=False,
    )
    save_model(model, d / "model.pt", d / "model.json")
    rng = np.random.default_rng(0)
    rows = rng.integers(0, len(sim.X), ROWS)
    X = sim.X[rows].astype(np.float32) + rng.normal(0, 0.01, (ROWS, sim.X.shape[1])).astype(
        np.float32
    )
    ids = pd.Index([f"s{i}" for i in range(ROWS)], name="sample_id")
    write_matrix_parquet(d / "ordered.parquet", X, ids, sim.loci["gene_id"])
    pd.DataFrame({"sample_id": ids, "batch": [batches[r] for r in rows]}).to_csv(
        d / "samples.tsv", sep="\t", index=False
    )
    return d


def _correct_argv(d: Path, out: Path) -> list[str]:
    return [
        sys.executable, "-m", "locusformer", "correct",
        "--matrix", str(d / "ordered.parquet"), "--samples", str(d / "samples.tsv"),
        "--batch-key", "batch", "--weights", str(d / "model.pt"),
        "--config", str(d / "model.json"), "--device", "cpu",
        "--out-corrected", str(out / "corrected.parquet"),
        "--out-latent", str(out / "latent.parquet"), "--out-h5ad", str(out / "x.h5ad"),
    ]  # fmt: skip


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob(".*.tmp"))


def _kill_while_writing(argv: list[str], out: Path, sig: signal.Signals) -> int:
    """Start ``argv``, wait until it has temporary files of its own in ``out``, send ``sig``."""
    before = set(_temporaries(out))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while not set(_temporaries(out)) - before:
        assert run.poll() is None, "the step ended before it wrote anything"
        assert time.monotonic() < deadline, "no temporary file within 120 s"
        time.sleep(0.02)
    time.sleep(0.3)  # well inside the writing
    os.killpg(run.pid, sig)
    run.communicate(timeout=120)
    return run.returncode


def test_sigterm_removes_the_temporaries_at_once(correct_inputs, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    code = _kill_while_writing(_correct_argv(correct_inputs, out), out, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM
    assert _temporaries(out) == []
    assert not list(out.iterdir()), "no partial output either"


def test_a_rerun_removes_what_sigkill_left(correct_inputs, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    someone_elses = out / ".other.parquet.abcdefgh.tmp"
    someone_elses.write_text("not ours")
    code = _kill_while_writing(_correct_argv(correct_inputs, out), out, signal.SIGKILL)
    assert code == -signal.SIGKILL
    left = [name for name in _temporaries(out) if name != someone_elses.name]
    assert left, "SIGKILL cannot be caught: the killed run's temporaries are still there"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    rerun = subprocess.run(_correct_argv(correct_inputs, out), env=env, capture_output=True)
    assert rerun.returncode == 0, rerun.stderr.decode()[-2000:]
    assert _temporaries(out) == [someone_elses.name], "only another output's file is kept"
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "corrected.parquet",
        "latent.parquet",
        "x.h5ad",
    ]


def test_normalize_killed_with_sigterm_leaves_nothing(tmp_path):
    rng = np.random.default_rng(1)
    n_genes, n_cells = 400, 20_000
    counts = pd.DataFrame(
        rng.poisson(3.0, (n_genes, n_cells)),
        index=pd.Index([f"ENSG{i:011d}" for i in range(n_genes)], name="gene_id"),
        columns=[f"c{i}" for i in range(n_cells)],
    )
    matrix = tmp_path / "counts.parquet"  # genes x samples, as the workflow reads matrices
    counts.to_parquet(matrix)
    sheet = tmp_path / "samples.tsv"
    pd.DataFrame({"sample_id": counts.columns, "batch": ["a", "b"] * (n_cells // 2)}).to_csv(
        sheet, sep="\t", index=False
    )
    out = tmp_path / "out"
    out.mkdir()
    argv = [
        sys.executable, "-m", "locusformer", "normalize", "--expression", str(matrix),
        "--samples", str(sheet), "--batch-key", "batch", "--value-type", "counts",
        "--out-matrix", str(out / "normalized.parquet"),
        "--out-counts", str(out / "counts.parquet"),
        "--out-samples", str(out / "samples.tsv"), "--out-stats", str(out / "stats.json"),
    ]  # fmt: skip
    code = _kill_while_writing(argv, out, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM
    assert list(out.iterdir()) == []


def test_stale_temporaries_of_other_outputs_are_not_touched(tmp_path):
    target = tmp_path / "corrected.parquet"
    mine = tmp_path / ".corrected.parquet.k3j_9x2a.tmp"
    others = [
        tmp_path / ".corrected.parquet.old.tmp",  # not mkstemp's shape
        tmp_path / ".corrected.parquet.backup",
        tmp_path / ".latent.parquet.k3j_9x2a.tmp",  # another output's
        tmp_path / "corrected.parquet.k3j_9x2a.tmp",  # not hidden: not ours
    ]
    for path in [mine, *others]:
        path.write_text("x")
    assert remove_stale_temporaries(target) == [mine]
    assert all(p.exists() for p in others)
