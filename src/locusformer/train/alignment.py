"""Which batches each sample should be aligned with: the adversary's per-sample target.

The batch adversary pushes the latent until a discriminator can do no better than a
target distribution over batches. With one global target (the batch frequencies), every
cell is pushed to look as if it could come from any batch, also a cell of a type that one
batch alone holds: a correction that removes biology whenever batches differ in
composition (scIB, Luecken et al. 2022; sysVI, Hrovatin et al. 2024). Here each sample
gets its own target, nonzero only on the batches that hold its biology:

- **label-free** (:func:`shared_batches`): batch b holds a sample's biology when the
  sample has a mutual nearest neighbour in b (Haghverdi et al. 2018, the idea behind
  MNN-correct and fastMNN). Mutual pairs are found in a cosine-normalized PCA of the
  input. A batch effect shifts a whole batch, so the nearest cells of another batch are
  still the same type; a type missing from b gets no mutual pair there, because b's
  cells have closer partners of their own type.
- **protected covariates** (:func:`covariate_levels`): the sample sheet names biology to
  keep (ComBat's ``mod``); the target is the batch frequencies within the sample's level.

:func:`target_prior` turns either into the (n, N) target: the batch frequencies, restricted
to the batches that hold the sample's biology and renormalized. A sample whose biology no
other batch holds gets its own batch as target, so the adversary leaves it alone.

The batch-mean term has the same weakness, and :func:`latent_clusters` is its answer:
soft clusters of the latent (found at each epoch's start once the adversary has ramped
up), inside which the batches' means are compared, and only between the batches that hold
a fair share of the cluster (:func:`locusformer.model.losses.cluster_batch_mean_distance`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from locusformer.errors import InputError

log = logging.getLogger(__name__)

#: Neighbours searched in each other batch; fastMNN's default.
MNN_K = 20
#: Largest share of a batch that k may be (small batches get a smaller k).
MNN_SMALL_SHARE = 0.2
#: Principal components the neighbours are found in.
MNN_PCS = 50
#: Samples of a batch searched at most; larger batches are subsampled (seeded) and the
#: rest take the answer of their nearest sampled neighbour in their own batch.
MNN_MAX_PER_BATCH = 20_000
#: Share of a sample's own-batch neighbourhood with a mutual partner in a batch for that
#: batch to count as holding the sample's biology.
SMOOTH_SHARE = 0.2
#: Harmony's softness of its clusters on the cosine distance, and the rounds of soft
#: k-means run at each epoch's start.
CLUSTER_SIGMA = 0.1
CLUSTER_ROUNDS = 10
#: Share of its expected cells (the batch's overall proportion of a cluster) a batch
#: must hold in a cluster for its means there to be compared.
CLUSTER_MIN_SHARE = 0.2
#: Training samples the cluster term needs per (cluster, batch) cell: each minibatch
#: estimates a mean per cell, and with fewer the means it compares are a sample or two,
#: noise. Below ``CELL_SAMPLES * clusters * batches`` training samples the term is off
#: (:func:`enough_for_clusters`).
CELL_SAMPLES = 3
#: Latents clustered at most; larger training sets are subsampled (seeded per epoch).
#: Encoding them costs about as many rows as the epoch's own steps at 20,000; 5,000 hold
#: hundreds per cluster and scored no lower on 40,000 simulated samples (0.910 against
#: 0.893 at 20,000, one seed; benchmarks/cluster_sample.py, issue 42).
CLUSTER_MAX_SAMPLES = 5_000
#: Rows the input's levels (:func:`input_levels`) are found on, drawn uniformly, where
#: there are more (then topped up per batch, :data:`INPUT_MIN_PER_BATCH`); the others
#: take their nearest sampled neighbour's.
INPUT_MAX_SAMPLES = 20_000
#: Rows of each batch the input's levels are found on at least (all of a smaller batch):
#: a uniform sample of 20,000 from a million holds no row of a batch of ten samples
#: about four times in five, and that batch would then have no sampled row to take a
#: level from, nor ComBat an estimate of its batch effect.
INPUT_MIN_PER_BATCH = 50
#: Least :func:`structure_ratio` of the batch-corrected input, each sample's mean
#: expression taken out (:func:`without_mean_expression`), for its clusters to be used:
#: above noise, which reads 0.96 to 1.09 (60 draws of Poisson counts, 20 to 3,000 samples
#: of 1,000 to 5,000 loci). Total confounding (each batch one class of its own), where
#: ComBat leaves only the technical axis of the mean expression, reads 0.98 to 1.06
#: without it; studies of tens of samples, whose biology reads low beside the noise of so
#: few, 1.62 to 2.09 (the suite's ``n-40``; docs/notes/2026-12-07.md).
INPUT_STRUCTURE_RATIO = 1.2
#: Least agreement of the input clusters' contrasts within batches between batches
#: (:func:`cut_agreement`) for the clusters to be used. Where the quick correction
#: joined different classes of different batches (the suite's ``bulk-confounded``, each
#: batch mostly one class of its own: 0.21 to 0.40 at seeds 0-5, 0.23 to 0.44 read as
#: microarrays), the contrasts disagree; every other suite scenario reads 0.51 or more
#: (``n-40`` 0.51 to 0.63 at seeds 0-5) and every CellBench task 0.85 or more
#: (docs/notes/2026-12-06.md, docs/notes/2026-12-07.md).
LEVEL_AGREEMENT = 0.5
#: Clusters some pair of batches must share for :func:`level_agreement` to read anything
#: (every cluster where the cut has fewer): two shared clusters are a single contrast a
#: side, whose cosine with the other side's chance puts anywhere. The suite's
#: ``bulk-confounded`` at seed 5 had only two such pairs, read 0.81 and 0.67 while one
#: cluster joined three batches' three classes, and lost its biology (0.586 against the
#: uncorrected 0.685; 0.747 without the clusters). Where some pair shares three, pairs
#: sharing two still count: every other run of the suite, its shallow and microarray
#: libraries and CellBench reads as before (docs/notes/2026-12-07.md).
AGREEMENT_LEAST_SHARED = 3
#: k-means cuts of the quick correction the agreement is read on, its mean over those a
#: reading could be made on: one cut's reading moves with where k-means splits a class
#: (the suite's ``n-40`` at seeds 0-5: 0.45 to 0.71 on one cut, 0.51 to 0.63 on the mean
#: of five; ``bulk-confounded`` at most 0.46 on one, 0.40 on the mean, and on microarrays
#: 0.47 and 0.44), and the question is the quick correction's, not one cut's.
AGREEMENT_CUTS = 5
#: Axes of the variation within batches the contrasts are compared on: the clusters'
#: differences lie there, the noise of a few samples' means mostly elsewhere.
AGREEMENT_AXES = 10
#: Mutual pairs each batch's residual shift (:func:`mnn_recentred`) is a mean over, at
#: most (seeded): the mean of 2,000 differences is far inside the shift it corrects.
RECENTRE_MAX_PAIRS = 2_000
#: Quantile bins a numeric covariate is cut into (its levels).
NUMERIC_BINS = 5


def _pca(X: np.ndarray, fit_rows: np.ndarray, n_pcs: int, seed: int) -> np.ndarray:
    """(n, L) -> (n, k) principal-component scores fitted on ``fit_rows``, rows scaled to
    unit length (cosine distance, as fastMNN uses: a sample's depth does not matter)."""
    from sklearn.decomposition import PCA

    k = max(1, min(n_pcs, len(fit_rows) - 1, X.shape[1]))
    pca = PCA(n_components=k, svd_solver="randomized", random_state=seed)
    pca.fit(np.asarray(X[fit_rows], dtype=np.float32))
    scores = np.concatenate(
        [
            pca.transform(np.asarray(X[i : i + 65536], dtype=np.float32))
            for i in range(0, len(X), 65536)
        ]
    )
    norms = np.linalg.norm(scores, axis=1, keepdims=True)
    return (scores / np.maximum(norms, 1e-12)).astype(np.float32)


def _knn(reference: np.ndarray, query: np.ndarray, k: int) -> np.ndarray:
    """Indices (len(query), k) of each query row's k nearest rows of ``reference``."""
    from sklearn.neighbors import NearestNeighbors

    k = min(k, len(reference))
    return NearestNeighbors(n_neighbors=k).fit(reference).kneighbors(query)[1]


def _mutual_neighbours(
    scores: np.ndarray, ia: np.ndarray, ib: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Mutual nearest neighbours between the rows ``ia`` and ``ib`` of ``scores``:
    ``there`` (|ia|, kk), each ``ia`` row's nearest ``ib`` rows (positions in ``ib``), and
    ``mutual`` (|ia|, kk), whether that neighbour has the ``ia`` row among its own kk
    nearest in ``ia`` (Haghverdi et al. 2018).

    In small batches k neighbours would be most of the other side and every pair mutual:
    kk shrinks to a fifth of the smaller side there.
    """
    kk = max(1, min(k, math.ceil(MNN_SMALL_SHARE * min(len(ia), len(ib)))))
    there = _knn(scores[ib], scores[ia], kk)
    back = _knn(scores[ia], scores[ib], kk)  # (|ib|, kk) positions in ia
    mutual = (back[there] == np.arange(len(ia))[:, None, None]).any(axis=2)
    return there, mutual


def shared_batches(
    X: np.ndarray,
    codes: np.ndarray,
    n_batches: int,
    *,
    k: int = MNN_K,
    n_pcs: int = MNN_PCS,
    seed: int = 0,
    smooth: bool = True,
) -> np.ndarray:
    """(n, N) bool: whether batch b holds sample i's biology (True for its own batch).

    Parameters
    ----------
    X
        Samples x loci, standardized log-expression (any scale; PCA centres it).
    codes
        (n,) batch code of each sample, in ``0..n_batches-1``.
    k
        Neighbours of each sample searched in each other batch.
    """
    codes = np.asarray(codes)
    n = len(codes)
    out = np.zeros((n, n_batches), dtype=bool)
    out[np.arange(n), codes] = True
    present = [b for b in range(n_batches) if (codes == b).any()]
    if len(present) < 2:
        return out
    rng = np.random.default_rng([seed, 3])
    members = {b: np.flatnonzero(codes == b) for b in present}
    searched = {
        b: np.sort(rng.choice(idx, MNN_MAX_PER_BATCH, replace=False))
        if len(idx) > MNN_MAX_PER_BATCH
        else idx
        for b, idx in members.items()
    }
    scores = _pca(X, np.concatenate(list(searched.values())), n_pcs, seed)
    for a in present:
        for b in present:
            if b <= a:
                continue
            ia, ib = searched[a], searched[b]
            a_in_b, mutual = _mutual_neighbours(scores, ia, ib, k)
            has_a = mutual.any(axis=1)  # a's samples with a partner in b
            partners = np.unique(a_in_b[mutual])  # b's samples with a partner in a
            out[ia[has_a], b] = True
            out[ib[partners], a] = True
    if smooth:
        # Mutual pairs are sparse (cells at the edge of a type find them first): a sample
        # takes the share of its own batch's neighbourhood that has a partner in b.
        for a in present:
            ia = searched[a]
            kk = max(1, min(k, math.ceil(MNN_SMALL_SHARE * len(ia))))
            near = _knn(scores[ia], scores[ia], kk)  # (|a|, kk), itself included
            out[ia] = out[ia][near].mean(axis=1) >= SMOOTH_SHARE
            out[ia, a] = True
    # samples left out of the search take their nearest searched one's
    _fill_from_sampled(out, scores, codes, np.sort(np.concatenate(list(searched.values()))))
    return out


def _fill_from_sampled(
    values: np.ndarray, scores: np.ndarray, codes: np.ndarray, sampled: np.ndarray
) -> None:
    """In place: each row of ``values`` outside ``sampled`` (sorted row indices) takes the
    value of its nearest sampled row of its own batch in ``scores``: within a batch there
    is no batch effect to cross."""
    for b in np.unique(codes):
        mine = sampled[codes[sampled] == b]
        rest = np.setdiff1d(np.flatnonzero(codes == b), mine, assume_unique=True)
        if len(rest):
            values[rest] = values[mine[_knn(scores[mine], scores[rest], 1)[:, 0]]]


class Clustering(NamedTuple):
    """What :func:`latent_clusters` finds (numpy; :class:`locusformer.model.losses.Clusters`
    carries it as tensors)."""

    center: np.ndarray  # (Z,)
    centroids: np.ndarray  # (K, Z)
    gate: np.ndarray  # (K, N) bool


def latent_clusters(
    z: np.ndarray,
    codes: np.ndarray,
    n_batches: int,
    n_clusters: int,
    seed: int,
    *,
    sigma: float = CLUSTER_SIGMA,
    rounds: int = CLUSTER_ROUNDS,
    levels: np.ndarray | None = None,
    n_levels: int = 0,
) -> Clustering:
    """Soft clusters of latents ``z`` (n, Z), and which batches each cluster compares.

    Soft k-means on the unit sphere about the latents' mean (cosine distance
    2(1 - cos), softness ``sigma``, as Harmony's clusters; Korsunsky et al. 2019),
    started from k-means. Found once the adversary is at full strength, the latent holds
    the biology and little of the batch, so clusters follow cell types across batches.

    Harmony's diversity penalty, which pushes every cluster to hold every batch, is left
    out on purpose: it can gather cell types that different batches hold into one
    cluster, where comparing the batches removes biology (the confounded pseudo-bulk
    scored below the uncorrected data with it; issue 18). Without it, a
    cluster that a batch shift has left to one batch closes its gate: that shift stays
    (under-correction) rather than a cell type being lost.

    Returns
    -------
    Clustering
        center
            (Z,) the latents' mean, subtracted before the cosine.
        centroids
            (K, Z) unit length.
        gate
            (K, N) bool, or (K * L, N) with ``levels`` (n,) of ``n_levels`` L, a cell per
            cluster and level (:func:`~locusformer.model.losses.cross_levels`'s order):
            batch b holds cluster k's biology, with at least
            :data:`CLUSTER_MIN_SHARE` of the cells it would hold if every cluster had the
            batches' overall proportions (and two cells). A cell counts in its
            nearest cluster, or by its soft shares when that cluster compares no two
            batches.
    """
    from sklearn.cluster import KMeans

    codes = np.asarray(codes)
    center = z.mean(axis=0, dtype=np.float64)
    zn = z - center  # about the centre, as Harmony's PCA scores are
    zn /= np.maximum(np.linalg.norm(zn, axis=1, keepdims=True), 1e-12)
    k = max(1, min(n_clusters, len(zn)))
    centroids = KMeans(k, n_init=1, random_state=seed).fit(zn).cluster_centers_
    for _ in range(rounds):
        centroids /= np.maximum(np.linalg.norm(centroids, axis=1, keepdims=True), 1e-12)
        logits = -2.0 * (1.0 - zn @ centroids.T) / sigma  # (n, K)
        resp = np.exp(logits - logits.max(axis=1, keepdims=True))
        resp /= resp.sum(axis=1, keepdims=True)
        centroids = resp.T @ zn
    centroids /= np.maximum(np.linalg.norm(centroids, axis=1, keepdims=True), 1e-12)
    # A cell counts in its nearest cluster when that cluster already compares two
    # batches, and by its soft shares when it does not. Soft shares alone let a batch's
    # cells beside a cell type it lacks open that type's cluster (H838's, opened to the
    # protocols by their H1975 cells; issue 14). Nearest clusters alone
    # never open the clusters of a cell type the batch effect still splits in two, one
    # per batch, so the term does not act until the adversary has mixed them (issue
    # 14). A cell whose own cluster holds one batch is either such a shifted type or a
    # type only its batch holds; its soft share in a neighbour tells which.
    home = resp.argmax(axis=1)
    nearest = np.eye(k)[home]  # (n, K)
    if levels is not None:
        home = home * n_levels + levels
        nearest, resp = (_cross(w, levels, n_levels) for w in (nearest, resp))
    onehot = np.eye(n_batches)[codes]  # (n, N)
    alone = _gates(nearest, onehot)[home].sum(axis=1) <= 1  # (n,)
    gate = _gates(np.where(alone[:, None], resp, nearest), onehot)
    return Clustering(center.astype(np.float32), centroids.astype(np.float32), gate)


def _cross(weight: np.ndarray, levels: np.ndarray, n_levels: int) -> np.ndarray:
    """(n, K * L): numpy's :func:`~locusformer.model.losses.cross_levels`."""
    onehot = np.eye(n_levels, dtype=weight.dtype)[levels]  # (n, L)
    return (weight[:, :, None] * onehot[:, None, :]).reshape(len(weight), -1)


def _gates(weight: np.ndarray, onehot: np.ndarray) -> np.ndarray:
    """(K, N) bool: batch n holds at least :data:`CLUSTER_MIN_SHARE` of its expected
    cells of cluster k (and two cells), each cell counted by its ``weight`` (n, K) in the
    clusters; ``onehot`` (n, N) the cells' batches."""
    observed = weight.T @ onehot  # (K, N)
    expected = weight.sum(axis=0)[:, None] * onehot.mean(axis=0)[None, :]
    return (observed >= CLUSTER_MIN_SHARE * expected) & (observed >= 2.0)


class InputClusters(NamedTuple):
    """What :func:`input_clusters` finds."""

    levels: np.ndarray  # (n,) int64: each sample's cluster
    weights: np.ndarray | None  # (n, K) float32: its soft membership of each; None: hard


def input_levels(
    X: Any,
    codes: np.ndarray,
    n_clusters: int,
    seed: int,
    *,
    max_samples: int = INPUT_MAX_SAMPLES,
    from_structure: bool = False,
) -> np.ndarray | None:
    """(n,) the levels of :func:`input_clusters`, hard; None where it finds none."""
    found = input_clusters(
        X, codes, n_clusters, seed, max_samples=max_samples, from_structure=from_structure
    )
    return None if found is None else found.levels


def input_clusters(
    X: Any,
    codes: np.ndarray,
    n_clusters: int,
    seed: int,
    *,
    max_samples: int = INPUT_MAX_SAMPLES,
    from_structure: bool = False,
    softness: float = 0.0,
) -> InputClusters | None:
    """(n,) label-free level of each sample: its cluster in the input, corrected quickly;
    with ``softness`` above 0 also each sample's soft membership of every cluster
    (:func:`level_responsibilities`).

    ComBat without labels (:func:`locusformer.pp.combat.combat`, each batch's location and
    scale per locus removed) on at most ``max_samples`` rows (seeded), each batch then
    re-centred on its mutual nearest neighbours (:func:`mnn_recentred`: ComBat's location
    is the batch's mean, which follows its composition), the PCA of what that returns,
    and k-means (``n_init=10``) into ``n_clusters``, or with ``from_structure`` into as
    many as that matrix has structured axes plus one, at most ``n_clusters``
    (:func:`cluster_count`). Training removes the batch within each cluster (the level
    term, :func:`locusformer.model.losses.level_batch_share`).
    Decided on the input, the clusters do not depend on how far the model has mixed its
    latent: the latent clusters close every gate while a strong batch effect still splits
    the latent (issue 38). Unlike protected levels they leave the adversary's target
    alone: a cluster that the quick correction left split by batch would then be held
    split. Rows left out of
    the sample take the level of their nearest sampled row of their own batch, in the
    uncorrected data's PCA (within a batch there is no batch effect to cross).

    None when some batch has fewer than two samples (ComBat needs two), when there is
    one batch, or where the clusters' contrasts within batches disagree between batches
    or cannot be read (:func:`cut_agreement`, read on :data:`AGREEMENT_CUTS` cuts into
    ``n_clusters`` whatever the count, the first the one the clusters are taken from
    when the count is ``n_clusters``): a cluster would then hold, or might hold,
    different biology in different batches, and the level term would pull it together.
    Every batch has :data:`INPUT_MIN_PER_BATCH` sampled rows, or all of its rows where it
    has fewer.
    """
    codes = np.asarray(codes)
    n = len(codes)
    rows = _input_sample(codes, max_samples, seed)
    if rows is None:
        return None
    x = np.asarray(X[rows], dtype=np.float32)  # read once: X may be on disk
    quick = quick_scores(x, codes[rows], seed)
    if quick is None:
        return None
    # The agreement is read on the finest cut allowed: the contrasts of a few clusters
    # are a few pairs, and their correlation is noise (two confounded bulk studies of
    # the suite read 0.76 and 0.79 at four clusters, 0.05 and -0.07 at eight).
    cuts = agreement_cuts(quick.scores, n_clusters, seed)
    finest = cuts[0]
    agree = cut_agreement(x, codes[rows], cuts, seed)
    if agree is None:
        log.info(
            "input clusters: no two batches share enough of them to read whether they hold "
            "the same biology in each; left to the latent's clusters"
        )
        return None
    if agree < LEVEL_AGREEMENT:
        log.info(
            "input clusters: their contrasts within batches agree %.2f between batches "
            "(below %.2f): they join different biology of different batches; left to the "
            "latent's clusters",
            agree,
            LEVEL_AGREEMENT,
        )
        return None
    k = cluster_count(quick.matrix, n_clusters, seed) if from_structure else n_clusters
    found = finest if k >= n_clusters else _cut(quick.scores, k, seed)
    weights = None
    if softness > 0:
        weights = level_responsibilities(quick.scores, found, softness)
    if len(rows) == n:
        return InputClusters(found, weights)
    levels = np.empty(n, dtype=np.int64)
    levels[rows] = found
    scores = _pca(X, rows, MNN_PCS, seed)
    _fill_from_sampled(levels, scores, codes, rows)
    if weights is not None:
        sampled, weights = weights, np.empty((n, weights.shape[1]), dtype=np.float32)
        weights[rows] = sampled
        _fill_from_sampled(weights, scores, codes, rows)
    return InputClusters(levels, weights)


def level_responsibilities(scores: np.ndarray, levels: np.ndarray, softness: float) -> np.ndarray:
    """(n, K) float32 soft membership of each row of ``scores`` in the clusters ``levels``
    (K of them): a softmax over the clusters of minus the squared distance to each
    centroid, over ``softness`` times the mean squared distance to the own centroid, so
    that the softness is the same whatever the scores' scale. Rows deep in their cluster
    keep it alone; rows between two clusters share themselves between them."""
    k = int(levels.max()) + 1
    centroids = np.stack([scores[levels == c].mean(axis=0) for c in range(k)])  # (K, d)
    d2 = ((scores[:, None, :] - centroids[None]) ** 2).sum(-1)  # (n, K)
    scale = softness * max(float(d2[np.arange(len(levels)), levels].mean()), 1e-12)
    logits = -(d2 - d2.min(axis=1, keepdims=True)) / scale
    weights = np.exp(logits)
    return (weights / weights.sum(axis=1, keepdims=True)).astype(np.float32)


def _cut(scores: np.ndarray, k: int, seed: int) -> np.ndarray:
    """(n,) k-means (``n_init=10``) of ``scores`` into ``k`` clusters, at most one a row."""
    from sklearn.cluster import KMeans

    k = max(1, min(k, len(scores)))
    return KMeans(k, n_init=10, random_state=seed).fit_predict(scores).astype(np.int64)


def cluster_count(quick: np.ndarray, most: int, seed: int) -> int:
    """Clusters to cut ``quick`` (samples x loci, the quick correction) into: one more than
    its principal axes above a column-shuffled null (Horn's parallel analysis,
    :func:`structured_axes`), at least 2 and at most ``most``.

    k groups span k - 1 axes, so that many clusters can hold the structure the data show.
    More cut groups arbitrarily, and on shallow counts the level term then folded the
    latent (docs/notes/2026-12-07.md); a fixed count suits only data of that many groups.
    """
    axes = structured_axes(quick, seed)
    k = int(min(most, max(2, axes + 1)))
    log.info("input clusters: %d structured axes, %d clusters (at most %d)", axes, k, most)
    return k


def agreement_cuts(scores: np.ndarray, k: int, seed: int) -> list[np.ndarray]:
    """:data:`AGREEMENT_CUTS` k-means cuts of ``scores`` into ``k`` clusters, seeded
    apart; the first is ``_cut(scores, k, seed)``, the one the input clusters take."""
    return [_cut(scores, k, seed + 1000 * i) for i in range(AGREEMENT_CUTS)]


def cut_agreement(
    x: np.ndarray, codes: np.ndarray, cuts: list[np.ndarray], seed: int
) -> float | None:
    """:func:`level_agreement` of each of ``cuts`` (each a clustering of the rows of
    ``x``), averaged over those it reads; None where it reads none."""
    z = _within_axes(standardized_loci(x), codes, seed)
    found = [r for r in (_agreement(z, codes, levels) for levels in cuts) if r is not None]
    return float(np.mean(found)) if found else None


def level_agreement(
    x: np.ndarray, codes: np.ndarray, levels: np.ndarray, seed: int
) -> float | None:
    """How far the clusters ``levels`` hold the same biology in every batch, read from
    ``x`` (samples x loci, uncorrected): over pairs of batches, the correlation between
    the two batches' cluster means, each centred within its batch, over the clusters both
    batches hold; averaged with each pair weighted by the samples the smaller side holds
    in those clusters (a few samples' contrasts are mostly noise), over the pairs that
    share two clusters or more. None unless some pair shares
    :data:`AGREEMENT_LEAST_SHARED` (every cluster where ``levels`` has fewer).

    Within one batch the difference between two clusters' means is biology alone: a
    batch effect that shifts and scales the batch's loci moves both means alike. Where
    each cluster holds one class in every batch the two batches' contrasts agree (near 1);
    where a cluster joins one batch's class with another class of another batch they do
    not. Compared on the first :data:`AGREEMENT_AXES` principal axes of the variation
    within batches, where the clusters' differences lie.
    """
    return _agreement(_within_axes(standardized_loci(x), codes, seed), codes, levels)


def _agreement(z: np.ndarray, codes: np.ndarray, levels: np.ndarray) -> float | None:
    """:func:`level_agreement` on ``z``, the rows on the axes of the variation within
    batches."""
    cells = {
        (b, c): z[(codes == b) & (levels == c)].mean(axis=0)
        for b, c in set(zip(codes.tolist(), levels.tolist(), strict=True))
    }
    sizes = pd.crosstab(codes, levels)  # samples per (batch, cluster)
    least = min(AGREEMENT_LEAST_SHARED, sizes.shape[1])
    batches = sizes.index.tolist()
    found, weights, readable = [], [], False
    for i, a in enumerate(batches):
        for b in batches[i + 1 :]:
            both = sizes.columns[(sizes.loc[a] > 0) & (sizes.loc[b] > 0)].tolist()
            if len(both) < 2:
                continue
            readable |= len(both) >= least
            ma = np.stack([cells[a, c] for c in both])
            mb = np.stack([cells[b, c] for c in both])
            ma, mb = ma - ma.mean(axis=0), mb - mb.mean(axis=0)
            norm = np.sqrt((ma * ma).sum() * (mb * mb).sum())
            found.append(float((ma * mb).sum() / max(norm, 1e-12)))
            weights.append(min(sizes.loc[a, both].sum(), sizes.loc[b, both].sum()))
    return float(np.average(found, weights=weights)) if readable else None


def _within_axes(z: np.ndarray, codes: np.ndarray, seed: int) -> np.ndarray:
    """``z`` (samples x loci) projected on the first :data:`AGREEMENT_AXES` principal axes
    of its variation within batches (each batch centred on its own mean)."""
    from sklearn.utils.extmath import randomized_svd

    from locusformer.train.refit import batch_centred

    within = batch_centred(z, codes)
    k = max(1, min(AGREEMENT_AXES, *within.shape))
    # More power iterations than the default: the reading then lies within 0.012 of an
    # exact SVD's on the suite's small studies, where the default moved it by 0.04.
    axes = randomized_svd(within, k, n_iter=10, random_state=seed)[2]  # (k, L)
    return z @ axes.T


def _input_sample(codes: np.ndarray, max_samples: int, seed: int) -> np.ndarray | None:
    """The rows the input is read on (:func:`_input_rows` where there are more than
    ``max_samples``); None where there is one batch or one has fewer than two rows, as
    ComBat needs two."""
    n = len(codes)
    rows = np.arange(n) if n <= max_samples else _input_rows(codes, max_samples, seed)
    counts = np.bincount(codes[rows])
    if (counts > 0).sum() < 2 or counts[counts > 0].min() < 2:
        return None
    return rows


def _input_rows(codes: np.ndarray, max_samples: int, seed: int) -> np.ndarray:
    """Sorted rows to find the input's levels on: ``max_samples`` drawn uniformly (seeded),
    then each batch topped up to :data:`INPUT_MIN_PER_BATCH` rows (all of a smaller one)."""
    rng = np.random.default_rng([seed, 5])
    rows = rng.choice(len(codes), max_samples, replace=False)
    drawn = np.bincount(codes[rows], minlength=int(codes.max()) + 1)
    extra = []
    for b in np.flatnonzero(drawn < INPUT_MIN_PER_BATCH):
        left = np.setdiff1d(np.flatnonzero(codes == b), rows)
        want = min(INPUT_MIN_PER_BATCH - int(drawn[b]), len(left))
        extra.append(rng.choice(left, want, replace=False))
    return np.sort(np.concatenate([rows, *extra]))


class Quick(NamedTuple):
    """The input corrected quickly (:func:`quick_matrix`) and the space its clusters are
    cut in."""

    matrix: np.ndarray  # (n, L)
    scores: np.ndarray  # (n, k) its principal-component scores


def quick_scores(x: np.ndarray, codes: np.ndarray, seed: int) -> Quick | None:
    """:func:`quick_matrix` and its principal-component scores, None where it is None.
    The one place :func:`input_levels` gets its clusters' space from (the probes in
    benchmarks/quality/scale_levels replace it)."""
    from locusformer.pp.pca import n_pcs, pca

    quick = quick_matrix(x, codes, seed)
    return None if quick is None else Quick(quick, pca(quick, n_pcs(*quick.shape), seed))


def quick_matrix(x: np.ndarray, codes: np.ndarray, seed: int) -> np.ndarray | None:
    """``x`` (samples x loci, float32) corrected quickly and without labels: ComBat, then
    each batch re-centred on its mutual nearest neighbours (:func:`mnn_recentred`). None
    where ComBat's output holds no structure above that of shuffled loci
    (:data:`INPUT_STRUCTURE_RATIO`) once each sample's mean expression is taken out of it
    (:func:`without_mean_expression`): its clusters would be noise, or that axis cut."""
    from locusformer.pp.combat import combat

    quick = combat(x, codes)  # written to a new array
    ratio = structure_ratio(without_mean_expression(quick), seed)
    if ratio < INPUT_STRUCTURE_RATIO:
        log.info(
            "input clusters: the batch-corrected input holds no structure to cluster "
            "beyond each sample's mean expression (main axis %.1f times that of shuffled "
            "genes); left to the latent's clusters",
            ratio,
        )
        return None
    return mnn_recentred(quick, codes, seed)


def input_structured(
    X: Any, codes: np.ndarray, seed: int, *, max_samples: int = INPUT_MAX_SAMPLES
) -> bool | None:
    """Whether the input, corrected quickly, holds structure beyond each sample's mean
    expression: the floor that :func:`quick_matrix` reads (:data:`INPUT_STRUCTURE_RATIO`),
    on the rows :func:`input_clusters` reads. None where it cannot be read (one batch, or
    one with fewer than two samples: ComBat needs two).

    Where it holds none, each batch is one population as far as the data say: whether two
    batches hold the same one is then for a latent trained without the adversary to show
    (the shared check, ``training.shared_check``)."""
    from locusformer.pp.combat import combat

    codes = np.asarray(codes)
    rows = _input_sample(codes, max_samples, seed)
    if rows is None:
        return None
    quick = combat(np.asarray(X[rows], dtype=np.float32), codes[rows])
    return structure_ratio(without_mean_expression(quick), seed) >= INPUT_STRUCTURE_RATIO


def without_mean_expression(x: np.ndarray) -> np.ndarray:
    """``x`` (samples x loci) with each locus's linear dependence on the sample's mean over
    its loci removed (least squares): the axis of depth and detected genes.

    Every batch holds that axis, and ComBat keeps it. Where each batch is one class of its
    own, ComBat removes the biology with the batch and that axis is all the structure
    left (the suite's ``confounded-total``: 1.65 to 1.75 times the null, 0.96 correlated
    with the mean expression; without it 0.98 to 1.06, noise); clusters cut along it
    would let the level term pull the classes together (notes of 2026-12-07). Read for
    the floor only: the clusters are cut with it, since groups differ in their mean
    expression too.
    """
    m = x.mean(axis=1, dtype=np.float64)
    m = (m - m.mean()).astype(x.dtype)  # centred, so m @ x is m @ (x - its column means)
    beta = (m @ x) / max(float(m @ m), 1e-12)
    # One temporary of x's size and dtype: the floor reads up to 20,000 rows.
    return x - np.outer(m, beta.astype(x.dtype))


def mnn_recentred(x: np.ndarray, codes: np.ndarray, seed: int, *, k: int = MNN_K) -> np.ndarray:
    """``x`` (samples x loci, batch-corrected) with each batch moved by the per-locus
    mean difference over its mutual nearest-neighbour pairs with the other batches.

    ComBat's per-batch location is the batch's mean, so a batch made mostly of one type is
    pulled onto the others' types: on the skewed CellBench five sets its clusters paired
    different cell lines across batches. Mutual pairs compare like with like (Haghverdi
    et al. 2018), and where ComBat was right the mean over them is about zero. Found on
    ComBat's output rather than the raw input, the pairs survive a batch effect stronger
    than the biology, which pairs on the raw input did not (notes of 2026-12-05).

    The mean, not the median: ComBat equalizes each locus's batch means and variances,
    not its share of zeros. On shallow counts a batch with more dropout holds more zeros,
    and the median difference over the pairs moved every sparse locus of that batch one
    way: a batch axis, the main one of the suite's shallow studies, along which the input
    clusters were cut and the batch stayed (notes of 2026-12-07).

    Every batch moves at once, towards the pool of the others; the pool moves towards it
    too, so batch b takes the share ``1 - n_b / n`` of its mean difference (two equal
    batches meet halfway rather than trading places).
    """
    codes = np.asarray(codes)
    n = len(codes)
    scores = _pca(x, np.arange(n), MNN_PCS, seed)
    rng = np.random.default_rng([seed, 7])
    out = x.copy()
    for b in np.unique(codes):
        mine, rest = np.flatnonzero(codes == b), np.flatnonzero(codes != b)
        there, mutual = _mutual_neighbours(scores, mine, rest, k)
        p, j = np.nonzero(mutual)
        if len(p) == 0:
            continue
        if len(p) > RECENTRE_MAX_PAIRS:
            keep = np.sort(rng.choice(len(p), RECENTRE_MAX_PAIRS, replace=False))
            p, j = p[keep], j[keep]
        shift = (x[rest[there[p, j]]] - x[mine[p]]).mean(axis=0)
        out[mine] += (1.0 - len(mine) / n) * shift.astype(out.dtype)
    return out


def structure_ratio(x: np.ndarray, seed: int) -> float:
    """Variance of the main axis of ``x`` (samples x loci, each locus standardized) over
    that of the same values with every locus shuffled on its own (Horn's parallel
    analysis): about 1 when the loci vary independently, far above it when samples form
    groups or a continuum."""
    from sklearn.utils.extmath import randomized_svd

    z = standardized_loci(x)
    shuffled = shuffled_loci(z, np.random.default_rng([seed, 6]))
    top = [randomized_svd(m, 1, random_state=seed)[1][0] for m in (z, shuffled)]
    return float((top[0] / max(top[1], 1e-12)) ** 2)


#: Principal axes the structure is sought among at most.
STRUCTURE_MAX_AXES = 20
#: Column shuffles whose largest main axis is the noise level.
NULL_DRAWS = 5


def structured_axes(x: np.ndarray, seed: int) -> int:
    """Principal axes of ``x`` (samples x loci, each locus standardized) whose variance
    exceeds that of the main axis of the same values with every locus shuffled on its own
    (Horn's parallel analysis; the largest over :data:`NULL_DRAWS` shuffles), at most
    :data:`STRUCTURE_MAX_AXES`."""
    values, null = spectrum_and_null(x, seed)
    return int((values > null).sum())


def spectrum_and_null(x: np.ndarray, seed: int) -> tuple[np.ndarray, float]:
    """The singular values of ``x`` with each locus standardized (its first
    :data:`STRUCTURE_MAX_AXES` - 1 at most), and the largest main singular value of
    :data:`NULL_DRAWS` column shuffles of it: :func:`structured_axes`' two sides."""
    from sklearn.utils.extmath import randomized_svd

    z = standardized_loci(x)
    rng = np.random.default_rng([seed, 6])
    most = max(1, min(STRUCTURE_MAX_AXES, *z.shape) - 1)
    s = randomized_svd(z, most, random_state=seed)[1]
    # The largest of a few shuffles' main axes: one shuffle's varies as much as noise
    # axes differ from one another, and noise would then count as structure.
    top = 0.0
    for _ in range(NULL_DRAWS):
        top = max(top, randomized_svd(shuffled_loci(z, rng), most, random_state=seed)[1][0])
    return s, float(top)


def standardized_loci(x: np.ndarray) -> np.ndarray:
    """``x`` (samples x loci) with each varying locus centred and scaled to unit sd, the
    constant ones left out."""
    sd = x.std(axis=0)
    varying = x[:, sd > 0]
    return (varying - varying.mean(axis=0)) / sd[sd > 0]


def shuffled_loci(z: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``z`` with every locus (column) shuffled on its own: the null of parallel analysis,
    each locus's values kept, their co-variation across samples broken."""
    return np.take_along_axis(z, rng.random(z.shape).argsort(axis=0), axis=0)


def joint_levels(*levels: np.ndarray | None) -> np.ndarray | None:
    """(n,) one level per combination of the given levels (None ones left out)."""
    given = [np.asarray(v, dtype=np.int64) for v in levels if v is not None]
    if not given:
        return None
    combined = np.zeros_like(given[0])
    for v in given:
        combined = combined * (int(v.max()) + 1) + v
    return pd.factorize(combined, sort=True)[0].astype(np.int64)


def joint_weights(covariates: np.ndarray | None, weights: np.ndarray | None) -> np.ndarray | None:
    """(n, C * K) each sample's soft share of every (protected level, input cluster),
    ``covariates`` (n,) of C levels crossed with ``weights`` (n, K); None where the input
    clusters are hard (``weights`` None)."""
    if weights is None or covariates is None:
        return weights
    onehot = np.eye(int(covariates.max()) + 1, dtype=np.float32)[covariates]  # (n, C)
    return (onehot[:, :, None] * weights[:, None, :]).reshape(len(weights), -1)


def covariate_levels(
    samples: pd.DataFrame, columns: Sequence[str], source: str = "sample sheet"
) -> np.ndarray:
    """(n,) integer level of each sample's combination of the protected ``columns``.

    A column of numbers (every value parses as one) is cut into :data:`NUMERIC_BINS`
    quantile bins; any other column is categorical. An empty value is an error: a sample
    whose biology is unknown cannot be protected.
    """
    if not columns:
        raise InputError(source, "no protected column given")
    parts = []
    for column in columns:
        if column not in samples.columns:
            raise InputError(source, f"protected column {column!r} not found")
        values = samples[column]
        text = values.astype(str).str.strip()
        if (values.isna() | (text == "")).any():
            bad = samples.index[values.isna() | (text == "")][0]
            raise InputError(source, f"empty {column!r} for sample {bad!r}")
        numbers = pd.to_numeric(values, errors="coerce")
        if numbers.notna().all() and numbers.nunique() > NUMERIC_BINS:
            bins = pd.qcut(numbers.rank(method="first"), NUMERIC_BINS, labels=False)
            parts.append(bins.astype(int).astype(str).to_numpy())
        else:
            parts.append(text.to_numpy())
    joined = pd.Series(["\x1f".join(t) for t in zip(*parts, strict=True)])
    return pd.factorize(joined, sort=True)[0].astype(np.int64)


def level_batches(codes: np.ndarray, levels: np.ndarray, n_batches: int) -> np.ndarray:
    """(n, N) bool: whether batch b holds a sample of the sample's covariate level."""
    codes, levels = np.asarray(codes), np.asarray(levels)
    table = np.zeros((levels.max() + 1, n_batches), dtype=bool)
    table[levels, codes] = True
    return table[levels]


def target_prior(
    holds: np.ndarray, codes: np.ndarray, levels: np.ndarray | None = None
) -> np.ndarray:
    """(n, N) float32 adversary target of each sample.

    The batch frequencies (within the sample's covariate level when ``levels`` is given,
    else overall), kept on the batches that ``holds`` marks and renormalized to sum to 1.
    """
    codes = np.asarray(codes)
    n, n_batches = holds.shape
    if levels is None:
        levels = np.zeros(n, dtype=np.int64)
    counts = np.zeros((levels.max() + 1, n_batches))
    np.add.at(counts, (levels, codes), 1.0)
    prior = counts[levels] * holds  # (n, N)
    return (prior / prior.sum(axis=1, keepdims=True)).astype(np.float32)


def adversary_targets(
    X: Any,
    codes: np.ndarray,
    n_batches: int,
    alignment: str,
    neighbors: int,
    levels: np.ndarray | None,
    seed: int,
) -> np.ndarray | None:
    """(n, N) adversary target of every sample, or None for the batch frequencies alone.

    ``alignment="shared"`` keeps each sample's target on the batches that hold its
    biology (:func:`shared_batches`, label-free, on the standardized rows ``X``);
    protected ``levels`` ((n,), :func:`covariate_levels`) keep it on the batches that hold
    its level, at that level's batch frequencies. "global" without levels: None.
    """
    if alignment == "global" and levels is None:
        return None
    holds = np.ones((len(codes), n_batches), dtype=bool)
    if alignment == "shared":
        holds &= shared_batches(X, codes, n_batches, k=neighbors, seed=seed)
    if levels is not None:
        holds &= level_batches(codes, levels, n_batches)
    return target_prior(holds, codes, levels)


def enough_for_clusters(n_train: int, n_clusters: int, n_batches: int) -> bool:
    """Whether ``n_train`` training samples give the cluster term :data:`CELL_SAMPLES` per
    (cluster, batch) cell on average.

    A study of 40 samples in 4 batches has about one a cell at the default 8 clusters; the
    term then compared one or two samples' latents and at times removed a seed's biology
    (the suite's 40-sample studies over six seeds: 0.686, 0.866 and 0.686 without it
    against 0.667, 0.860 and 0.649 with it; CellBench's confounded pseudo-bulk, 45
    training samples in 5 batches, the same to the last digit; docs/notes/2026-12-06.md).
    """
    return n_train >= CELL_SAMPLES * n_clusters * n_batches


NEVER_COMPARED = (
    "training: no latent cluster held a fair share of two batches in any epoch, so the "
    "cluster term never acted: either the batches share no biology, or the batch effect "
    "is still in the latent; check the batch-mixing scores in the report"
)


def never_compared(history: pd.DataFrame) -> bool:
    """Whether the cluster term found latent clusters in some epoch and, in every one,
    none held a fair share of two batches: it never acted.

    Then either the batches share no biology, or the latent stayed split by batch
    because the adversary alone did not mix the batches before the run ended. The
    second left test_correct's data (300 samples, a strong shift, both batches holding
    every group) wholly uncorrected at the default settings: batch probe 1.0 on every
    seed. Comparing whole batches in such epochs fixed that and cost the confounded
    pseudo-bulk, where the batches' biology differs (issue 18), so
    training warns rather than choosing.
    """
    compared = history["clusters_compared"].dropna()
    return len(compared) > 0 and bool((compared == 0).all())
