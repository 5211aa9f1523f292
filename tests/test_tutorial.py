"""docs/tutorial.py, the scanpy user's path through the API, runs on the tiny data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_tutorial_runs_from_counts_to_a_mapped_run(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run(
        [
            sys.executable, str(ROOT / "docs" / "tutorial.py"),
            "--counts", str(ROOT / ".test" / "data" / "tiny_counts.csv.gz"),
            "--samples", str(ROOT / ".test" / "data" / "tiny_samples.csv"),
            "--max-epochs", "2", "--umap", str(tmp_path / "umap.png"),
        ],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "train:" in run.stderr and "epoch/s" in run.stderr, "a visible progress bar"
    assert "trained 2 epochs" in run.stdout
    assert "UMAP of the corrected data" in run.stdout
    assert "new run ['Drop-seq, next run']" in run.stdout
    assert "['X_pca_own', 'counts'] kept" in run.stdout
    assert (tmp_path / "umap.png").stat().st_size > 1000
