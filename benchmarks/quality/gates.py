"""The cluster term's gates on a prepared quality task: which batches hold a fair share
of each latent cluster, at every epoch where the term acts (issue 18).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/gates.py WORK protocols 0,1,2

WORK is a ``variants.py --work`` directory holding the task. Prints one JSON line per
seed: the share of (cluster, batch) gates open at the term's first epoch, whether all
are, the open batches per cluster, and whether all were open at each later epoch. An
optional fourth argument is JSON training overrides.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import locusformer.train.loop as train
from locusformer.io.parquet import read_matrix_parquet
from locusformer.train.alignment import latent_clusters


def main() -> None:
    work, task = Path(sys.argv[1]), sys.argv[2]
    seeds = [int(s) for s in sys.argv[3].split(",")]
    overrides = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
    torch.set_num_threads(1)
    d = work / "results" / task
    X = read_matrix_parquet(d / "ordered.parquet", "ordered matrix")
    loci = pd.read_parquet(d / "loci.parquet")
    samples = pd.read_csv(d / "samples.tsv", sep="\t", index_col=0, dtype=str).loc[X.index]
    gates: list[np.ndarray] = []

    def spy(*args, **kwargs):
        found = latent_clusters(*args, **kwargs)
        gates.append(found.gate.copy())
        return found

    train.latent_clusters = spy  # what train._epoch_clusters calls
    for seed in seeds:
        gates.clear()
        train.train_corrector(
            X.to_numpy(np.float32), samples["batch"].tolist(), loci, None, overrides,
            seed=seed, progress=False,
        )  # fmt: skip
        first = gates[0]
        row = {
            "task": task, "seed": seed, "n_batches": int(first.shape[1]),
            "first_open_share": float(first.mean()), "first_all_open": bool(first.all()),
            "open_per_cluster_first": first.sum(1).tolist(),
            "all_open_by_epoch": [bool(g.all()) for g in gates],
        }  # fmt: skip
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
