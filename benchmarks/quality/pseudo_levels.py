"""Label-free shared biology from a quickly corrected input (issue 38, item 2): a probe.

The cluster term decides which batches share biology from the model's own latent, and a
strong batch effect that still splits the latent closes every gate. This probe decides it
instead from the input, corrected quickly: ComBat (no labels) on the normalized matrix,
its PCA, k-means into ``--clusters`` pseudo-levels. LocusFormer is then trained with those
levels as its protected covariate (the path a sample sheet's ``protect`` column takes:
the batch is removed within levels, the adversary's target kept to the batches that hold
the sample's level), at its defaults otherwise, and scored as the suite scores it.

A level that one batch alone holds (a group confounded with its batch) is then left alone;
levels that several batches hold are aligned whatever the latent looks like. What it risks:
ComBat without labels pulls confounded groups together, and levels found there open gates
between different biology.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/pseudo_levels.py \\
        --out OUT.tsv --scenarios mixtures trajectory --seeds 0
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/pseudo_levels.py \\
        --out OUT.tsv --tasks-work benchmarks/out/variants \\
        --tasks protocols cellbench5_skewed --seeds 0

One row per (data set, variant, seed) appended to ``--out``: batch, bio, total, and the
adjusted Rand index of the pseudo-levels against the true classes (a diagnostic only;
nothing in training reads a label).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "simulated"))
sys.path.insert(0, str(ROOT / "benchmarks" / "quality"))

from probes import append_row, each_dataset, probe_parser, score_matrix  # noqa: E402


def _kmeans(x: np.ndarray, n_clusters: int, seed: int) -> np.ndarray:
    from sklearn.cluster import KMeans

    from locusformer.pp.pca import n_pcs, pca

    scores = pca(x, n_pcs(*x.shape), seed)
    return KMeans(n_clusters, n_init=10, random_state=seed).fit_predict(scores).astype(np.int64)


def mnn_shifted(x: np.ndarray, codes: np.ndarray, seed: int, k: int = 20) -> np.ndarray:
    """``x`` with each batch but the largest moved by one vector: the median difference
    over its mutual nearest neighbour pairs with the other batches (cosine PCA)."""
    from sklearn.neighbors import NearestNeighbors

    from locusformer.pp.pca import n_pcs, pca

    s = pca(x, n_pcs(*x.shape), seed)
    s /= np.linalg.norm(s, axis=1, keepdims=True)
    out = x.copy()
    ref = np.bincount(codes).argmax()
    for b in np.unique(codes):
        if b == ref:
            continue
        ib, ir = np.flatnonzero(codes == b), np.flatnonzero(codes != b)
        kk = max(1, min(k, int(0.2 * min(len(ib), len(ir)))))
        b2r = NearestNeighbors(n_neighbors=kk).fit(s[ir]).kneighbors(s[ib])[1]
        r2b = NearestNeighbors(n_neighbors=kk).fit(s[ib]).kneighbors(s[ir])[1]
        pairs = [(p, q) for p in range(len(ib)) for q in b2r[p] if p in r2b[q]]
        if pairs:
            out[ib] += np.median(np.array([x[ir[q]] - x[ib[p]] for p, q in pairs]), axis=0)
    return out


def pseudo_levels(adata, batch_key: str, n_clusters: int, seed: int, quick: str) -> np.ndarray:
    """(n,) k-means cluster of each sample in the PCA of the quickly corrected matrix:
    ComBat's ("combat"), or crossed with that of the MNN-shifted matrix ("cross")."""
    from locusformer.pp.combat import combat
    from locusformer.train.alignment import joint_levels

    x = np.asarray(adata.X, dtype=np.float32)
    codes = adata.obs[batch_key].astype("category").cat.codes.to_numpy()
    levels = _kmeans(combat(x.copy(), codes), n_clusters, seed)
    if quick == "cross":
        levels = joint_levels(levels, _kmeans(mnn_shifted(x, codes, seed), n_clusters, seed))
    return levels


def run(name, adata, loci, keys, seed, clusters, training, out: Path, quick="combat") -> None:
    from sklearn.metrics import adjusted_rand_score

    from locusformer.baselines.methods import run_method
    from locusformer.infer.correct import correct
    from locusformer.train.loop import train_corrector

    batch_key, label_key = keys
    uncorrected = run_method("uncorrected", adata.copy(), batch_key, 0)
    batches = adata.obs[batch_key].astype(str).tolist()
    for k in clusters:
        start = time.perf_counter()
        levels = pseudo_levels(adata, batch_key, k, seed, quick) if k else None
        ari = adjusted_rand_score(adata.obs[label_key], levels) if k else float("nan")
        model, _ = train_corrector(
            adata.X, batches, loci, None, training, seed=seed, progress=False, covariates=levels
        )
        corrected, _ = correct(model, adata.X, batches)
        scores = score_matrix(corrected, adata, uncorrected, keys, seed)
        variant = f"pseudo_levels_{k}" + ("_cross" if quick == "cross" else "") if k else "default"
        variant += f" {json.dumps(training)}" if training else ""
        seconds = round(time.perf_counter() - start, 1)
        append_row(out, [name, variant, seed, *scores, round(ari, 3), seconds])


def main() -> None:
    parser = probe_parser(__doc__)
    parser.add_argument("--clusters", nargs="+", type=int, default=[8], help="0: the default")
    parser.add_argument("--training", type=json.loads, default=None, help="JSON overrides")
    parser.add_argument("--quick", choices=["combat", "cross"], default="combat")
    args = parser.parse_args()
    for name, adata, loci, keys, seed in each_dataset(args):
        run(name, adata, loci, keys, seed, args.clusters, args.training, args.out, args.quick)


if __name__ == "__main__":
    main()
