"""Training throughput (samples/s) on simulated data of demo size (500 samples x 2000 loci).

Trains with the default model and training configs (overridable per run with
``--patch-sizes``) for a few epochs and reports the epoch time (training plus the
validation pass) and training samples per second, leaving out the first epoch as warm-up.

Usage::

    python benchmarks/train_bench.py
    python benchmarks/train_bench.py --patch-sizes 4 16 --epochs 4 --device cuda
"""

from __future__ import annotations

import argparse
import statistics

import torch

from locusformer.model.config import ModelConfig
from locusformer.simulate.datasets import simulate
from locusformer.train.loop import TrainConfig, train_corrector
from locusformer.train.runtime import resolve_device


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--loci", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--patch-sizes", type=int, nargs="+", default=[16, 4])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    dev = resolve_device(args.device)
    sim = simulate(n_samples=args.samples, n_loci=args.loci, n_batches=args.batches, seed=0)
    labels = [f"batch{b}" for b in sim.batch]
    train_config = TrainConfig(max_epochs=args.epochs)
    n_train = round(args.samples * (1 - train_config.val_fraction))
    print(
        f"# Training throughput: {args.samples} samples x {args.loci} loci, "
        f"{args.batches} batches, {dev}, {args.threads} threads, torch {torch.__version__}\n"
    )
    print(
        f"Default configs except patch_size; batch size {train_config.batch_size}; "
        f"~{n_train} training samples per epoch; first epoch left out as warm-up.\n"
    )
    print("| patch_size | tokens | parameters | s/epoch | train samples/s |")
    print("|---|---|---|---|---|")
    for patch_size in args.patch_sizes:
        model_config = ModelConfig(patch_size=patch_size)
        model, history = train_corrector(
            sim.X, labels, sim.loci, model_config, train_config, seed=0, device=dev, progress=False
        )
        seconds = history["seconds"].tolist()
        per_epoch = statistics.median(seconds[1:] if len(seconds) > 1 else seconds)
        params = sum(p.numel() for p in model.module.parameters())
        print(
            f"| {patch_size} | {model.n_tokens} | {params:,} | {per_epoch:.2f} | "
            f"{n_train / per_epoch:.0f} |",
            flush=True,
        )
        del model


if __name__ == "__main__":
    main()
