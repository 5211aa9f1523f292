"""Input clusters that a batch splits, found by their mutual nearest neighbours (issue 38): a probe.

The level term removes the batch within each of the input's clusters
(:func:`locusformer.train.alignment.input_levels`), and with eight clusters and eight
batches in a minibatch of 64 it mostly pulls every sample towards its cluster's mean
(``level_chance.py``). Where the quick correction leaves one batch's share of a group
shifted, k-means can spend a cluster on it: on the 100k scale data, batch 8's group 3
sat in one cluster with a few others' group 3 cells and the rest of group 3 in a second,
and the pull then holds group 3 as two islands.

Mutual nearest neighbours across batches (Haghverdi et al. 2018) tell such a split from
biology without labels: a sample's partners in other batches hold its biology. Two
clusters are joined (variant ``linked``) when the pairs between them are at least
``LINK_SHARE`` of either's pairs *and* their batch compositions are at least
``BATCH_APART`` apart (total variation): the boundary between them then follows the
batch. Pairs alone join too much: neighbouring pieces of a continuum (mixtures, a
trajectory) share a tenth of their pairs or more, and joining them into one or two
clusters lost 0.10 on ``mixtures`` (seed 0). A cluster with no partners (biology one
batch alone holds) stays.

Two more variants read contiguity within each batch, where there is no batch effect to
fake it: ``within`` joins on nearest-neighbour edges inside each batch in place of the
pairs, ``both`` on the pairs and those edges together (a refinement of ``linked``).
Small batches defeat ``within``: with a few samples a batch, a sample's nearest ones of
its own batch are of other groups.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/level_links.py --out OUT.tsv \\
        --scenarios middle mixtures trajectory --train
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/level_links.py --out OUT.tsv \\
        --scale benchmarks/out/workflow_scale/data/n100000

Prints each data set's clusters (size, the largest batch's share over its share of all
samples, the commonest class and its share) and the pair shares between clusters. With
``--train``, data sets whose clusters the join changes are trained at the defaults once
per variant and scored as the suite scores them; one row per (data set, variant, seed)
appended to ``--out``: data set, variant, seed, batch, bio, total, clusters, seconds.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probes import append_row, each_dataset, probe_parser, score_matrix

#: Share of a cluster's pairs that another cluster must hold for the two to be joined.
LINK_SHARE = 0.1
#: Least total-variation distance between two linked clusters' batch compositions.
BATCH_APART = 0.5


def _unit(scores: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (cosine distance, as the alignment's own PCA uses)."""
    return scores / np.maximum(np.linalg.norm(scores, axis=1, keepdims=True), 1e-12)


def pair_links(scores: np.ndarray, codes: np.ndarray, found: np.ndarray) -> np.ndarray:
    """(K, K) mutual nearest-neighbour pairs across batches between the clusters
    ``found``, on unit-length ``scores``: entry (a, c) counts pairs of a sample of
    cluster a with its partner of another batch in cluster c, from both sides."""
    from locusformer.train.alignment import MNN_K, _mutual_neighbours

    unit = _unit(scores)
    k = int(found.max()) + 1
    links = np.zeros((k, k))
    for b in np.unique(codes):
        mine, rest = np.flatnonzero(codes == b), np.flatnonzero(codes != b)
        there, mutual = _mutual_neighbours(unit, mine, rest, MNN_K)
        p, j = np.nonzero(mutual)
        np.add.at(links, (found[mine[p]], found[rest[there[p, j]]]), 1.0)
    return links + links.T


def within_links(scores: np.ndarray, codes: np.ndarray, found: np.ndarray) -> np.ndarray:
    """(K, K) nearest-neighbour edges within each batch between the clusters ``found``:
    entry (a, c) counts edges from a sample of cluster a to one of its batch's own
    nearest samples in cluster c. Within a batch there is no batch effect, so two
    clusters with many such edges are one stretch of biology that the boundary cuts."""
    from locusformer.train.alignment import MNN_K, MNN_SMALL_SHARE, _knn

    unit = _unit(scores)
    k = int(found.max()) + 1
    links = np.zeros((k, k))
    for b in np.unique(codes):
        mine = np.flatnonzero(codes == b)
        kk = max(1, min(MNN_K, int(np.ceil(MNN_SMALL_SHARE * len(mine)))))
        near = _knn(unit[mine], unit[mine], kk + 1)[:, 1:]  # itself left out
        np.add.at(links, (np.repeat(found[mine], near.shape[1]), found[mine[near.ravel()]]), 1.0)
    return links + links.T


def batch_apart(codes: np.ndarray, found: np.ndarray) -> np.ndarray:
    """(K, K) total-variation distance between the clusters' batch compositions: 1 where
    two clusters share no batch, 0 where their batches come in the same proportions."""
    k, n_batches = int(found.max()) + 1, int(codes.max()) + 1
    mix = np.zeros((k, n_batches))
    np.add.at(mix, (found, codes), 1.0)
    mix /= np.maximum(mix.sum(axis=1, keepdims=True), 1.0)
    return 0.5 * np.abs(mix[:, None, :] - mix[None, :, :]).sum(axis=2)


def _near(links: np.ndarray, share: float) -> np.ndarray:
    """(K, K) bool: the links between two clusters are at least ``share`` of either's."""
    total = np.maximum(links.sum(axis=1), 1.0)
    return (links / total[:, None] >= share) | (links / total[None, :] >= share)


def linked(
    found: np.ndarray,
    links: Sequence[np.ndarray],
    codes: np.ndarray,
    share: float = LINK_SHARE,
    apart: float = BATCH_APART,
) -> np.ndarray:
    """``found`` with every two clusters joined (transitively) whose links between them
    are at least ``share`` of the links of either, in every matrix of ``links``, and
    whose batch compositions are at least ``apart`` apart (the boundary between them
    follows the batch), renumbered 0.."""
    from scipy.sparse.csgraph import connected_components

    joined = batch_apart(codes, found) >= apart
    for matrix in links:
        joined &= _near(matrix, share)
    _, component = connected_components(joined, directed=False)
    return np.unique(component[found], return_inverse=True)[1].astype(np.int64)


def describe(name: str, codes: np.ndarray, labels: np.ndarray, found: np.ndarray, links) -> None:
    """Print each cluster's size, batch skew and commonest class, and its pair shares."""
    share_all = np.bincount(codes) / len(codes)
    print(f"== {name}: {len(found)} samples, {links.shape[0]} clusters")
    for a in range(links.shape[0]):
        inside = found == a
        batch = np.bincount(codes[inside], minlength=len(share_all))
        top = int(batch.argmax())
        values, counts = np.unique(labels[inside], return_counts=True)
        row = links[a] / max(links[a].sum(), 1.0)
        skew = batch[top] / inside.sum() / share_all[top]
        print(
            f"  {a}: n={inside.sum():6d}  batch {top} x{skew:.2f}"
            f"  class {values[counts.argmax()]} {counts.max() / inside.sum():.2f}"
            f"  pairs " + " ".join(f"{v:.2f}" for v in row)
        )


def quick_clusters(x: np.ndarray, codes: np.ndarray, n_clusters: int, seed: int):
    """The input's clusters as :func:`~locusformer.train.alignment.input_levels` finds
    them on rows it keeps whole, and the scores they were found on; None, None where it
    finds none."""
    from sklearn.cluster import KMeans

    from locusformer.train.alignment import quick_scores

    quick = quick_scores(np.asarray(x, dtype=np.float32), codes, seed)
    if quick is None:
        return None, None
    scores = quick.scores
    k = max(1, min(n_clusters, len(codes)))
    found = KMeans(k, n_init=10, random_state=seed).fit_predict(scores).astype(np.int64)
    return found, scores


#: The links each variant joins clusters on (all of them must say "near").
VARIANT_LINKS = {
    "linked": (pair_links,),
    "within": (within_links,),
    "both": (pair_links, within_links),
}


def joins(found: np.ndarray, scores: np.ndarray, codes: np.ndarray) -> dict[str, np.ndarray]:
    """Each variant's joined clusters of ``found``, and ``found`` itself as the default."""
    links = {f: f(scores, codes, found) for f in (pair_links, within_links)}
    out = {"default": found}
    for variant, kinds in VARIANT_LINKS.items():
        out[variant] = linked(found, [links[f] for f in kinds], codes)
    return out


@contextmanager
def linked_levels(variant: str):
    """Training's input clusters replaced by ``variant``'s joined ones for the duration."""
    from locusformer.train import loop
    from locusformer.train.alignment import INPUT_MAX_SAMPLES

    original = loop.input_levels

    def joined(X, codes, n_clusters, seed):
        codes = np.asarray(codes)
        if len(codes) > INPUT_MAX_SAMPLES:
            raise ValueError("the probe joins clusters of data sets it clusters whole")
        if np.bincount(codes).min() < 2:
            return None
        found, scores = quick_clusters(np.asarray(X), codes, n_clusters, seed)
        if found is None:
            return None
        links = [f(scores, codes, found) for f in VARIANT_LINKS[variant]]
        return linked(found, links, codes)

    if variant != "default":
        loop.input_levels = joined
    try:
        yield
    finally:
        loop.input_levels = original


def show(name: str, codes: np.ndarray, labels: np.ndarray, found, scores) -> dict[str, int]:
    """Print a data set's clusters and how many each variant leaves; returns those counts."""
    pairs = pair_links(scores, codes, found)
    describe(name, codes, labels, found, pairs)
    counts = {v: int(levels.max()) + 1 for v, levels in joins(found, scores, codes).items()}
    others = [linked(found, [pairs], codes, apart=t).max() + 1 for t in (0.3, 0.7)]
    print(
        f"  clusters joined by pairs {counts['linked']} (batches apart 0.3 / 0.7: "
        f"{others[0]} / {others[1]}), within-batch edges {counts['within']}, "
        f"both {counts['both']}"
    )
    return counts


def run(name, adata, loci, keys, seed, out: Path, train: bool, variants) -> None:
    from locusformer.baselines.methods import run_method
    from locusformer.infer.correct import correct
    from locusformer.train.loop import train_corrector

    batch_key, label_key = keys
    codes = adata.obs[batch_key].astype("category").cat.codes.to_numpy().astype(np.int64)
    found, scores = quick_clusters(adata.X, codes, 8, seed)
    if found is None:
        print(f"== {name} seed {seed}: no input clusters")
        return
    labels = adata.obs[label_key].astype(str).to_numpy()
    clusters = show(f"{name} seed {seed}", codes, labels, found, scores)
    if not train:
        return
    uncorrected = run_method("uncorrected", adata.copy(), batch_key, 0)
    batches = adata.obs[batch_key].astype(str).tolist()
    for variant in variants:
        if variant != "default" and clusters[variant] == clusters["default"]:
            continue
        start = time.perf_counter()
        with linked_levels(variant):
            model, _ = train_corrector(adata.X, batches, loci, None, seed=seed, progress=False)
        corrected, _ = correct(model, adata.X, batches)
        scores_ = score_matrix(corrected, adata, uncorrected, keys, seed)
        seconds = round(time.perf_counter() - start, 1)
        append_row(out, [name, variant, seed, *scores_, clusters[variant], seconds])


def scale_data(folder: Path, seed: int, max_samples: int) -> None:
    """The clusters of a scale run's simulated data (``workflow_scale.py``), on the rows
    :func:`~locusformer.train.alignment.input_levels` would sample, normalized as the
    workflow normalizes them; diagnostics only."""
    import anndata as ad
    import pandas as pd

    from locusformer.pp.normalize import NormalizeParams, normalize

    raw = ad.read_h5ad(folder / "expr.h5ad")
    samples = pd.read_csv(folder / "samples.tsv", sep="\t", index_col=0)
    rows = np.arange(raw.n_obs)
    if raw.n_obs > max_samples:
        rng = np.random.default_rng([seed, 5])
        rows = np.sort(rng.choice(raw.n_obs, max_samples, replace=False))
    sub = raw[rows].copy()
    sub.obs = samples.loc[sub.obs_names]
    normalized, _ = normalize(sub, "counts", "batch", NormalizeParams(), source=str(folder))
    codes = normalized.obs["batch"].astype("category").cat.codes.to_numpy().astype(np.int64)
    x = normalized.X.toarray() if hasattr(normalized.X, "toarray") else normalized.X
    found, scores = quick_clusters(x, codes, 8, seed)
    labels = normalized.obs["group"].astype(str).to_numpy()
    show(f"{folder.name} seed {seed}", codes, labels, found, scores)


def main() -> None:
    parser = probe_parser(__doc__)
    parser.add_argument("--train", action="store_true")
    parser.add_argument(
        "--variants", nargs="+", default=["default", "linked"],
        choices=["default", *VARIANT_LINKS],
    )  # fmt: skip
    parser.add_argument("--scale", type=Path, default=None)
    parser.add_argument("--max-samples", type=int, default=20_000)
    args = parser.parse_args()
    if args.scale:
        for seed in args.seeds:
            scale_data(args.scale, seed, args.max_samples)
    for name, adata, loci, keys, seed in each_dataset(args):
        run(name, adata, loci, keys, seed, args.out, args.train, args.variants)


if __name__ == "__main__":
    main()
