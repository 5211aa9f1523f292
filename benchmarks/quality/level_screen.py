"""Screen the input's clusters against the truth, in seconds and without training (issue 38).

``training.input_clusters`` removes the batch within clusters of the quickly corrected
input (:func:`locusformer.train.alignment.input_levels`). Two label-aware diagnostics say
whether those clusters are safe to act on, before any model is trained:

- **mismatch**: within each cluster, the total-variation distance between two batches'
  class mixes, averaged over batch pairs and over clusters by size. Above zero, the level
  term would pull different classes of different batches together.
- **split**: the share of same-class pairs of samples from different batches that sit in
  different clusters. High, the level term leaves those batches apart. With more
  clusters than classes it is above zero even where no batch splits a class.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/level_screen.py \\
        --scenarios skewed strong-mixtures --tasks-work benchmarks/out/variants \\
        --tasks cellbench5_skewed

One line per data set: the diagnostics of ComBat's clusters alone and of the clusters
``input_levels`` returns (ComBat, each batch re-centred on its mutual nearest neighbours).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "simulated"))
sys.path.insert(0, str(ROOT / "benchmarks" / "quality"))


def mismatch(levels: np.ndarray, codes: np.ndarray, labels: np.ndarray) -> float:
    """Size-weighted mean over clusters of the mean class-mix distance of batch pairs."""
    total, weighted = 0, 0.0
    for level in np.unique(levels):
        inside = levels == level
        held = [b for b in np.unique(codes[inside]) if (inside & (codes == b)).sum() >= 3]
        if len(held) < 2:
            continue
        mixes = {
            b: pd.Series(labels[inside & (codes == b)]).value_counts(normalize=True) for b in held
        }
        tv = [
            0.5 * mixes[a].sub(mixes[b], fill_value=0).abs().sum()
            for i, a in enumerate(held)
            for b in held[i + 1 :]
        ]
        weighted += inside.sum() * np.mean(tv)
        total += inside.sum()
    return weighted / max(total, 1)


def split(levels: np.ndarray, codes: np.ndarray, labels: np.ndarray) -> float:
    """Share of same-class, different-batch sample pairs that sit in different clusters."""
    pairs = apart = 0.0
    for label in np.unique(labels):
        mine = labels == label
        table = pd.crosstab(levels[mine], codes[mine]).to_numpy().astype(float)
        sizes = table.sum(axis=0)
        for a in range(table.shape[1]):
            for b in range(a + 1, table.shape[1]):
                pairs += sizes[a] * sizes[b]
                apart += sizes[a] * sizes[b] - (table[:, a] * table[:, b]).sum()
    return apart / max(pairs, 1.0)


def screen(name: str, adata, batch_key: str, label_key: str, n_clusters: int) -> None:
    from sklearn.cluster import KMeans

    from locusformer.pp.combat import combat
    from locusformer.pp.pca import n_pcs, pca
    from locusformer.train.alignment import input_levels

    x = np.asarray(adata.X, dtype=np.float32)
    codes = adata.obs[batch_key].astype("category").cat.codes.to_numpy()
    labels = adata.obs[label_key].astype(str).to_numpy()
    quick = combat(x.copy(), codes)
    combat_only = KMeans(n_clusters, n_init=10, random_state=0).fit_predict(
        pca(quick, n_pcs(*quick.shape), 0)
    )
    found = input_levels(x, codes, n_clusters, seed=0)
    for variant, levels in (("combat", combat_only), ("input_levels", found)):
        if levels is None:
            print(f"{name}\t{variant}\toff (no structure)", flush=True)
            continue
        m, s = mismatch(levels, codes, labels), split(levels, codes, labels)
        print(f"{name}\t{variant}\tmismatch {m:.3f}\tsplit {s:.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", nargs="*", default=[])
    parser.add_argument("--tasks", nargs="*", default=[])
    parser.add_argument("--tasks-work", type=Path, default=ROOT / "benchmarks" / "out" / "variants")
    parser.add_argument("--clusters", type=int, default=8)
    args = parser.parse_args()
    for name in args.scenarios:
        from suite import BATCH_KEY, LABEL_KEY, prepare

        from locusformer.simulate.scenarios import SUITE

        adata, _, _ = prepare(SUITE[name], 0)
        screen(name, adata, BATCH_KEY, LABEL_KEY, args.clusters)
    for task in args.tasks:
        from variants import load_task

        adata, _, _ = load_task(args.tasks_work, task)
        screen(task, adata, "batch", "cell_line", args.clusters)


if __name__ == "__main__":
    main()
