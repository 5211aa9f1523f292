"""When, during training, a reference's latent joins two cell lines (issue 14).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/trajectory.py \\
        benchmarks/out/kbet plate2 1 [--training '{"batch_mean_cover": true}'] [--show 20 26 32]

Trains LocusFormer on ``cellbench5_inner`` without the held-out set (as ``mapping.py``
trains a reference; WORK prepared by ``variants.py``) and, after every epoch, classifies
each reference cell by its ``mapping.K`` nearest other cells in the latent (labels used
for scoring only). Prints per epoch the accuracy, its errors (true -> predicted: count)
and the share of the cluster term's gates open; at the ``--show`` epochs also each
latent cluster's gates and its cells by line and batch (hard assignment). Ends with the
epoch training keeps (the lowest validation reconstruction once the ramp-up is over).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mapping import Bench, K, confusions, vote

import locusformer.train.loop as train
from locusformer.model.losses import cluster_responsibilities


def main() -> None:
    from sklearn.neighbors import NearestNeighbors

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("heldout")
    parser.add_argument("seed", type=int)
    parser.add_argument("--training", type=json.loads, default=None)
    parser.add_argument("--show", nargs="*", type=int, default=[])
    args = parser.parse_args()
    torch.set_num_threads(1)
    bench = Bench("cellbench5_inner", args.work)
    ref = bench.batches != args.heldout
    X, batches, labels = bench.X[ref], bench.batches[ref], bench.labels[ref]
    run_epoch = train._run_epoch

    def probed(run, weights, clusters, epoch):
        row = run_epoch(run, weights, clusters, epoch)
        z = train._latents(run, torch.arange(len(labels)))
        nn = NearestNeighbors(n_neighbors=K + 1).fit(z)
        own = vote(labels[nn.kneighbors(z)[1][:, 1:]])  # itself left out
        gates = "" if clusters is None else f"gates {float(clusters.gate.float().mean()):.2f}"
        print(f"epoch {epoch + 1}\tself {np.mean(own == labels):.3f}\t{gates}\t"
              f"{confusions(labels, own, top=4)}", flush=True)  # fmt: skip
        if clusters is not None and epoch + 1 in args.show:
            home = cluster_responsibilities(torch.from_numpy(z), clusters).numpy().argmax(1)
            for k in np.unique(home):
                table = pd.crosstab(labels[home == k], batches[home == k])
                cells = "; ".join(
                    f"{line}: " + ", ".join(f"{b}={n}" for b, n in row.items() if n)
                    for line, row in table.iterrows()
                )
                print(f"  cluster {k} gates {clusters.gate[k].int().tolist()}  {cells}")
        return row

    train._run_epoch = probed
    _, history = train.train_corrector(
        X, batches.tolist(), bench.loci, train_config=args.training, seed=args.seed,
        device="cpu", progress=False,
    )  # fmt: skip
    after = history[history["adversary_weight"] >= history["adversary_weight"].max()]
    print("kept epoch", int(after.loc[after["val_recon"].idxmin(), "epoch"]))


if __name__ == "__main__":
    main()
