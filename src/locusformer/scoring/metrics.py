"""Score integration results with the scIB metrics (``scib-metrics``).

Every method of a dataset is scored the same way, on the same samples: all of them up to
``max_samples``, else one seeded subsample stratified by batch and label
(:mod:`locusformer.scoring.subsample`), cut from every result by obs name:

* the representation scored is the PCA of the corrected matrix (``n_pcs`` rule:
  ``min(50, n_samples - 1, n_genes - 1)`` components, computed on the scored samples' rows
  of the corrected matrix) for ``representation="matrix"`` results and ``.obsm["X_emb"]``
  as it is for embeddings;
* one k-nearest-neighbour graph per representation, computed the same way for every method
  by :mod:`locusformer.scoring.neighbors` (exact Euclidean kNN up to 20,000 samples, else
  pynndescent as in scib-metrics), with ``k = min(90, n_samples - 1)`` neighbours (self
  included); the 15- and 50-neighbour graphs of scIB are subsets of it (``min(15, k)``,
  ``min(50, k)``); kBET per label's neighbours in each label's diffusion map are found by
  the same rule (scib-metrics takes them from pynndescent at every size), with ARPACK's
  starting vector drawn from the seed;
* values are the ABSOLUTE metric values as scib-metrics returns them (already in [0, 1],
  higher is better), never min-max scaled across methods; the batch score is the mean of
  the batch metrics, the bio score the mean of the bio metrics (NaN metrics left out) and
  the total ``0.4 * batch + 0.6 * bio`` as in scIB.

Biological conservation (needs a label column): Isolated labels, KMeans NMI, KMeans ARI,
Silhouette label, cLISI. KMeans NMI and ARI come from the lowest-inertia clustering of
``kmeans_starts`` k-means++ starts (10 by default, scikit-learn's k-means seeded by the
run's seed); ``kmeans_starts=1`` is scib-metrics' own single start, the scores it publishes
(:func:`kmeans_nmi_ari`).

Batch correction: BRAS (``Silhouette batch`` with scib-metrics versions without BRAS),
iLISI, KBET, Graph connectivity, PCR comparison (against the PCA of the uncorrected
matrix).

Without a label column, BRAS treats all samples as one label, KBET is the global kBET
acceptance rate (:func:`scib_metrics.kbet` instead of ``kbet_per_label``), Graph
connectivity (defined per label) is left out, and biological conservation is scored by
``Within-batch kNN Jaccard``: for each sample the
Jaccard overlap of its ``min(15, batch size - 1)`` nearest same-batch neighbours in the
uncorrected PCA and in the scored representation, averaged over samples (1 = every
within-batch neighbourhood preserved; the uncorrected data score 1 by construction).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd

from locusformer.errors import InputError, one_line
from locusformer.io.results import EMBEDDING_KEY
from locusformer.pp.pca import n_pcs, pca
from locusformer.scoring import result_rows, subsample
from locusformer.scoring.neighbors import (
    WITHIN_BATCH_K,
    cache_jax_compilation,
    cache_numba_compilation,
    compute_neighbors,
    exact_diffusion_neighbors,
    neighbor_sizes,
    seeded_eigsh,
    torch_threads_kept,
    within_batch_knn_jaccard,
)
from locusformer.scoring.result_rows import ResultFile
from locusformer.scoring.tables import (
    AGGREGATES,
    BATCH_WEIGHT,
    BIO_METRICS,
    BIO_WEIGHT,
    COLUMNS,
    NO_LABEL_BIO_METRICS,
)

log = logging.getLogger(__name__)

#: k-means++ starts behind KMeans NMI and ARI (:func:`kmeans_nmi_ari`).
DEFAULT_KMEANS_STARTS = 10


def has_bras() -> bool:
    """Whether the installed scib-metrics has BRAS (``scib_metrics.bras``, 0.5.5 and later)."""
    import scib_metrics

    return hasattr(scib_metrics, "bras")


def silhouette_batch_name() -> str:
    return "BRAS" if has_bras() else "Silhouette batch"


def batch_metric_names(with_labels: bool = True) -> tuple[str, ...]:
    """Batch-correction metrics; Graph connectivity is only defined with labels."""
    if with_labels:
        return (silhouette_batch_name(), "iLISI", "KBET", "Graph connectivity", "PCR comparison")
    return (silhouette_batch_name(), "iLISI", "KBET", "PCR comparison")


def metric_names(with_labels: bool) -> list[tuple[str, str]]:
    """(metric, type) pairs in the order they are written, aggregates last."""
    bio = BIO_METRICS if with_labels else NO_LABEL_BIO_METRICS
    return (
        [(m, "bio") for m in bio]
        + [(m, "batch") for m in batch_metric_names(with_labels)]
        + [(m, "aggregate") for m in AGGREGATES]
    )


# --------------------------------------------------------------------------- building blocks


def scoring_representation(result: ad.AnnData, seed: int = 0) -> np.ndarray:
    """What is scored: PCA of ``.X`` for matrix results, ``.obsm["X_emb"]`` for embeddings."""
    representation = result.uns.get("representation", "matrix")
    if representation == "embedding":
        if EMBEDDING_KEY not in result.obsm:
            raise ValueError(f"an embedding result without .obsm[{EMBEDDING_KEY!r}]")
        return np.asarray(result.obsm[EMBEDDING_KEY], dtype=np.float32)
    if representation != "matrix":
        raise ValueError(f"unknown representation {representation!r}")
    if result.X is None:
        raise ValueError("a matrix result without .X")
    x = result.X.toarray() if hasattr(result.X, "toarray") else np.asarray(result.X)
    if not np.isfinite(x).all():
        raise ValueError("corrected matrix has non-finite values")
    return pca(x, n_pcs(x.shape[0], x.shape[1]), seed).astype(np.float32)


# --------------------------------------------------------------------------- scoring


def _rows(
    method: str,
    values: Mapping[str, float],
    with_labels: bool,
    status: str,
    error: str,
    metric_errors: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    metric_errors = metric_errors or {}
    rows = [
        {
            "method": method,
            "metric": metric,
            "type": kind,
            "value": float(values.get(metric, float("nan"))),
            "status": status,
            "error": metric_errors.get(metric, error),
        }
        for metric, kind in metric_names(with_labels)
    ]
    return pd.DataFrame(rows, columns=COLUMNS)


def failed_rows(method: str, error: str, with_labels: bool) -> pd.DataFrame:
    """Rows for a method that failed: every metric NaN, ``status="failed"``."""
    return _rows(method, {}, with_labels, "failed", one_line(error))


def _aggregate(values: dict[str, float], with_labels: bool) -> None:
    def mean(names: Iterable[str]) -> float:
        vals = [values[m] for m in names if m in values and np.isfinite(values[m])]
        return float(np.mean(vals)) if vals else float("nan")

    batch = mean(batch_metric_names(with_labels))
    bio = mean(BIO_METRICS if with_labels else NO_LABEL_BIO_METRICS)
    values["Batch correction"] = batch
    values["Bio conservation"] = bio
    values["Total"] = BATCH_WEIGHT * batch + BIO_WEIGHT * bio


def _labels_usable(obs: pd.DataFrame, label_key: str | None) -> bool:
    if label_key is None:
        return False
    if label_key not in obs.columns:
        raise InputError("integration result", f"no label column {label_key!r} in obs")
    labels = obs[label_key]
    if labels.isna().any():
        raise InputError(
            "integration result",
            f"label column {label_key!r} has {int(labels.isna().sum())} missing values",
        )
    if labels.astype(str).nunique() < 2:
        log.warning("label column %r has one value: scoring biology without labels", label_key)
        return False
    return True


def check_kmeans_starts(value: object, source: str = "kmeans_starts") -> int:
    """``value`` (an integer, or a flag's string) as k-means starts >= 1; else one line."""
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
        raise InputError(source, f"expected an integer >= 1, got {value!r}")
    return int(text)


def kmeans_nmi_ari(
    x: np.ndarray, labels: np.ndarray, starts: int = DEFAULT_KMEANS_STARTS, seed: int = 0
) -> dict[str, float]:
    """NMI and ARI of the labels against k-means clusters of ``x``, k the number of labels.

    ``starts=1`` is :func:`scib_metrics.nmi_ari_cluster_labels_kmeans` itself. One
    k-means++ start lands in a worse local minimum often enough to reorder correctors: on
    18 CellBench latents (five sets, de novo and each set mapped, three seeds each) 12-23%
    of single starts ended over 5% above the lowest inertia (a cell line split in two and
    two others joined, where looked at), 0.04-0.06 off the total (issue 14). ``starts=N``
    keeps the lowest-inertia clustering of N starts of scikit-learn's k-means (its default
    ``n_init`` for years, and about a hundred times faster on the CPU than scib-metrics'
    JAX k-means with the same starts), seeded by ``seed``.
    """
    if starts == 1:
        import scib_metrics

        # A copy: scib-metrics' k-means changes its input in place at float32 rounding,
        # which moved a later metric of the same representation (KBET of Harmony on the
        # two protocols, 0.873 -> 0.813: docs/notes/2026-12-05.md).
        return scib_metrics.nmi_ari_cluster_labels_kmeans(np.array(x, copy=True), labels)
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    km = KMeans(len(np.unique(labels)), n_init=starts, random_state=seed)
    predicted = km.fit_predict(np.asarray(x, dtype=np.float32))
    return {
        "nmi": normalized_mutual_info_score(labels, predicted, average_method="arithmetic"),
        "ari": adjusted_rand_score(labels, predicted),
    }


@torch_threads_kept()
def score_method(
    result: ad.AnnData | ResultFile,
    uncorrected: ad.AnnData | ResultFile,
    batch_key: str,
    label_key: str | None,
    seed: int = 0,
    reference: dict | None = None,
    samples: pd.Index | None = None,
    kmeans_starts: int = DEFAULT_KMEANS_STARTS,
    representations: dict | None = None,
) -> pd.DataFrame:
    """Score one integration result; long format (method, metric, type, value, status, error).

    ``uncorrected`` is the ``uncorrected`` integration result of the same dataset (its PCA
    is the pre-integration reference of PCR comparison and of the no-label bio metric).
    ``reference``, a dict kept between calls with the same ``uncorrected``, ``seed`` and
    ``samples`` (:func:`run_dataset_metrics`), holds that PCA so it is computed once, not
    once per method. ``samples`` (obs names) scores those only, in the result's order; of a
    :class:`~locusformer.scoring.result_rows.ResultFile` only their rows are read.
    ``kmeans_starts``: k-means starts behind KMeans NMI and ARI, seeded by ``seed``
    (:func:`kmeans_nmi_ari`). ``representations``, a dict, gets the scored representation
    (a copy) and its rows' sample names under the method's name, when there is one
    (:mod:`locusformer.scoring.representations`). torch's thread count is left as it
    was (:func:`~locusformer.scoring.neighbors.torch_threads_kept`).
    """
    import scib_metrics

    cache_numba_compilation()
    cache_jax_compilation()
    # scib-metrics logs every skipped kBET label at INFO level through a rich handler
    scib_metrics.settings.verbosity = logging.WARNING
    method = str(result.uns.get("method", "unknown"))
    if batch_key not in result.obs.columns:
        raise InputError("integration result", f"no batch column {batch_key!r} in obs")
    with_labels = _labels_usable(result.obs, label_key)

    if result.uns.get("status", "ok") != "ok":
        return failed_rows(method, str(result.uns.get("error", "failed")), with_labels)
    _check_same_samples(method, result, uncorrected)
    is_uncorrected, n_total = result is uncorrected, result.n_obs
    # the subsample's rows in the result's order, like any reordered result
    result = result_rows.take(result, samples, method)

    reference = {} if reference is None else reference
    try:
        x_pre, x = _representations(result, uncorrected, reference, seed, is_uncorrected)
    except ValueError as exc:
        return failed_rows(method, f"cannot score: {exc}", with_labels)
    if representations is not None:
        representations[method] = (result.obs_names.copy(), x.copy())

    batches = result.obs[batch_key].astype(str).to_numpy()
    labels = (
        result.obs[label_key].astype(str).to_numpy()
        if with_labels
        else np.full(result.n_obs, "all", dtype=object)
    )
    sizes = neighbor_sizes(result.n_obs)
    nn = compute_neighbors(x, sizes.lisi, seed)
    scored = _Scored(
        x_pre=x_pre,
        x=x,
        batches=batches,
        labels=labels,
        with_labels=with_labels,
        seed=seed,
        nn=nn,
        nn_graph=nn.subset_neighbors(sizes.graph),
        nn_kbet=nn.subset_neighbors(sizes.kbet),
    )
    metrics = _Metrics(method, n_batches=len(np.unique(batches)))
    _bio_metrics(metrics, scored, kmeans_starts)
    _batch_metrics(metrics, scored)
    _aggregate(metrics.values, with_labels)
    df = _rows(method, metrics.values, with_labels, "ok", "", metrics.errors)
    return subsample.with_subsample_rows(df, samples, n_total, seed)


def _check_same_samples(
    method: str, result: ad.AnnData | ResultFile, uncorrected: ad.AnnData | ResultFile
) -> None:
    """Raise unless the uncorrected baseline succeeded and holds the result's samples."""
    if uncorrected.uns.get("status", "ok") != "ok":
        raise InputError("uncorrected result", "the uncorrected baseline failed")
    if set(result.obs_names) != set(uncorrected.obs_names) or result.n_obs != uncorrected.n_obs:
        raise InputError(
            "integration result", f"samples of {method!r} differ from the uncorrected result"
        )


def _representations(
    result: ad.AnnData | ResultFile,
    uncorrected: ad.AnnData | ResultFile,
    reference: dict,
    seed: int,
    is_uncorrected: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """(uncorrected PCA, scored representation) of ``result``'s rows; ValueError when the
    result cannot be scored."""
    # The PCA depends on the row order: reused only for results in the same order.
    if not result.obs_names.equals(reference.get("obs_names")):
        reference.clear()
        pre = result_rows.take(uncorrected, result.obs_names, "uncorrected", True)
        reference["pca"] = scoring_representation(pre, seed)
        reference["obs_names"] = result.obs_names.copy()
    # Copies: a metric that changed its input in place would change the next method's.
    x_pre = reference["pca"].copy()
    x = x_pre.copy() if is_uncorrected else scoring_representation(result, seed)
    if not np.isfinite(x).all():
        raise ValueError("representation has non-finite values")
    return x_pre, x


@dataclass(frozen=True)
class _Scored:
    """What the metrics of one result read: both representations, batches and labels (one
    "all" label without a usable label column), and the neighbour graphs they share."""

    x_pre: np.ndarray  # PCA of the uncorrected matrix, the result's rows
    x: np.ndarray  # the scored representation
    batches: np.ndarray
    labels: np.ndarray
    with_labels: bool
    seed: int
    nn: Any  # scib-metrics NeighborsResults, k = neighbor_sizes().lisi
    nn_graph: Any  # its first neighbor_sizes().graph neighbours
    nn_kbet: Any  # its first neighbor_sizes().kbet neighbours


@dataclass
class _Metrics:
    """Each metric's value, and why each that is NaN failed."""

    method: str
    n_batches: int
    values: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def run(self, name: str, fn: Callable[[], Any], needs_batches: bool = False) -> None:
        """Record ``fn()`` under ``name`` (a dict: each of its keys); one metric failing
        leaves it NaN with its error and the others scored."""
        if needs_batches and self.n_batches < 2:
            self.values[name] = float("nan")
            self.errors[name] = "needs at least 2 batches"
            return
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = fn()
            if isinstance(out, dict):
                self.values.update({k: float(v) for k, v in out.items()})
            else:
                self.values[name] = float(out)
        except Exception as exc:
            log.warning("%s: metric %s failed: %s", self.method, name, exc)
            self.values[name] = float("nan")
            self.errors[name] = one_line(f"{type(exc).__name__}: {exc}")


@contextlib.contextmanager
def _silhouette_once(x: np.ndarray, labels: np.ndarray) -> Iterator[None]:
    """Within this context scib-metrics' ``silhouette_samples(x, labels)`` runs once.

    Isolated labels and Silhouette label each compute the silhouette of every sample of
    ``x`` by ``labels``, the same array, which is O(n^2) (22 s each on a 50,000-sample
    subsample on one core); the second call gets a copy of the first one's result, so both
    metrics are what scib-metrics computes, from one computation. A call with any other
    arrays (BRAS's per-label subsets) computes as usual.
    """
    from scib_metrics.metrics import _isolated_labels, _silhouette

    compute = _silhouette.silhouette_samples
    memo: dict[tuple, np.ndarray] = {}

    def once(X, labels_, chunk_size=256, metric="euclidean", **kwargs):
        if X is not x or labels_ is not labels or kwargs:
            return compute(X, labels_, chunk_size=chunk_size, metric=metric, **kwargs)
        key = (chunk_size, metric)
        if key not in memo:
            memo[key] = np.asarray(compute(X, labels_, chunk_size=chunk_size, metric=metric))
        return memo[key].copy()

    originals = {module: module.silhouette_samples for module in (_isolated_labels, _silhouette)}
    for module in originals:
        module.silhouette_samples = once
    try:
        yield
    finally:
        for module, original in originals.items():
            module.silhouette_samples = original


def _bio_metrics(metrics: _Metrics, s: _Scored, kmeans_starts: int) -> None:
    """The biological-conservation metrics, :data:`NO_LABEL_BIO_METRICS` without labels."""
    import scib_metrics

    x, labels, batches = s.x, s.labels, s.batches
    if not s.with_labels:
        metrics.run(
            "Within-batch kNN Jaccard",
            lambda: within_batch_knn_jaccard(s.x_pre, x, batches, WITHIN_BATCH_K),
        )
        return
    with _silhouette_once(x, labels):
        metrics.run("Isolated labels", lambda: scib_metrics.isolated_labels(x, labels, batches))
        metrics.run("Silhouette label", lambda: scib_metrics.silhouette_label(x, labels))

    def kmeans():
        res = kmeans_nmi_ari(x, labels, kmeans_starts, s.seed)
        return {"KMeans NMI": res["nmi"], "KMeans ARI": res["ari"]}

    metrics.run("KMeans NMI", kmeans)
    if "KMeans ARI" not in metrics.values:
        metrics.values["KMeans ARI"] = float("nan")
        metrics.errors["KMeans ARI"] = metrics.errors.get("KMeans NMI", "")
    metrics.run("cLISI", lambda: scib_metrics.clisi_knn(s.nn, labels))


def _batch_metrics(metrics: _Metrics, s: _Scored) -> None:
    """The batch-correction metrics (:func:`batch_metric_names`)."""
    import scib_metrics

    x, labels, batches, run = s.x, s.labels, s.batches, metrics.run
    sil_name = silhouette_batch_name()
    if has_bras():
        run(sil_name, lambda: scib_metrics.bras(x, labels, batches), needs_batches=True)
    else:  # pragma: no cover - scib-metrics < 0.5.5
        run(sil_name, lambda: scib_metrics.silhouette_batch(x, labels, batches), True)
    run("iLISI", lambda: scib_metrics.ilisi_knn(s.nn, batches), needs_batches=True)
    if s.with_labels:
        with seeded_eigsh(s.seed), exact_diffusion_neighbors():
            run("KBET", lambda: scib_metrics.kbet_per_label(s.nn_kbet, batches, labels), True)
        run("Graph connectivity", lambda: scib_metrics.graph_connectivity(s.nn_graph, labels))
    else:
        run("KBET", lambda: scib_metrics.kbet(s.nn_kbet, batches)[0], needs_batches=True)
    run(
        "PCR comparison",
        lambda: scib_metrics.pcr_comparison(s.x_pre, x, batches, categorical=True),
        needs_batches=True,
    )
