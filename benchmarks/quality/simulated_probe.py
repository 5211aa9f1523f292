"""Linear probes of batch and group after correction, on simulated data, per variant.

The check behind ``tests/test_correct.py``'s batch-removal test, for any training
override: a logistic regression (half the samples to fit) predicting the batch and the
group from the corrected matrix and the latent. ``--skewed`` drops group 2 from batch 0
and group 0 from batch 1 (one group shared), the composition difference of issue 18.

    .venv/bin/python benchmarks/quality/simulated_probe.py '{}' '{"batch_mean_weight": 0}'
    .venv/bin/python benchmarks/quality/simulated_probe.py --skewed '{}'
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from test_correct import MODEL, TRAIN, probe

from locusformer.infer.correct import correct
from locusformer.simulate.datasets import simulate
from locusformer.train.loop import train_corrector


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="+", help="JSON training overrides")
    parser.add_argument("--skewed", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sim = simulate(n_samples=450 if args.skewed else 300, n_loci=200, n_groups=3, seed=0)
    X, batch, group = sim.X, sim.batch, sim.group
    if args.skewed:
        keep = ~(((batch == 0) & (group == 2)) | ((batch == 1) & (group == 0)))
        X, batch, group = X[keep], batch[keep], group[keep]
    labels = [f"b{b}" for b in batch]
    print(f"uncorrected: batch {probe(X, batch):.3f} group {probe(X, group):.3f}")
    for spec in args.variants:
        config = dict(TRAIN, **json.loads(spec))
        model, _ = train_corrector(
            X, labels, sim.loci, MODEL, config, seed=0, device="cpu", progress=False
        )
        corrected, latent = correct(model, X, labels, device="cpu")
        print(
            f"{spec}: corrected batch {probe(corrected, batch):.3f} group "
            f"{probe(corrected, group):.3f}; latent batch {probe(latent, batch):.3f} "
            f"group {probe(latent, group):.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
