"""The neighbour graphs the scIB metrics are scored on, built the same way for every method.

One k-nearest-neighbour graph per representation: exact Euclidean kNN up to
:data:`EXACT_KNN_MAX_SAMPLES` samples, pynndescent above (as scib-metrics documents), with
scIB's 15/50/90 neighbourhood sizes capped at ``n_samples - 1``; the label-free biology
score (within-batch kNN Jaccard); and the seeding that makes kBET's diffusion embedding a
function of the data and the seed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd

log = logging.getLogger(__name__)

#: exact kNN (brute force) up to this many samples, pynndescent above
EXACT_KNN_MAX_SAMPLES = 20_000
#: scIB neighbourhood sizes (graph connectivity, kBET, LISI), capped at n_samples - 1
SCIB_NEIGHBORS = (15, 50, 90)
WITHIN_BATCH_K = 15


@dataclass(frozen=True)
class NeighborSizes:
    """Neighbourhood sizes (self included) used for every method of a dataset."""

    graph: int  # graph connectivity (scIB: 15)
    kbet: int  # kBET (scIB: 50)
    lisi: int  # iLISI / cLISI, and the size of the one graph computed (scIB: 90)


def neighbor_sizes(n_obs: int) -> NeighborSizes:
    """scIB's 15/50/90 neighbours, each capped at ``n_obs - 1``."""
    kmax = max(1, min(max(SCIB_NEIGHBORS), n_obs - 1))
    return NeighborSizes(
        graph=min(SCIB_NEIGHBORS[0], kmax), kbet=min(SCIB_NEIGHBORS[1], kmax), lisi=kmax
    )


def compute_neighbors(x: np.ndarray, n_neighbors: int, seed: int = 0):
    """Euclidean kNN of every sample (itself included) as scib-metrics ``NeighborsResults``."""
    from scib_metrics.nearest_neighbors import NeighborsResults, pynndescent

    x = np.asarray(x, dtype=np.float32)
    if x.shape[0] > EXACT_KNN_MAX_SAMPLES:
        return pynndescent(x, n_neighbors=n_neighbors, random_state=seed)
    from sklearn.neighbors import NearestNeighbors

    nn = NearestNeighbors(n_neighbors=n_neighbors, algorithm="brute").fit(x)
    distances, indices = nn.kneighbors(x)
    return NeighborsResults(indices=indices.astype(np.int64), distances=distances)


def _knn_without_self(x: np.ndarray, k: int) -> np.ndarray:
    from sklearn.neighbors import NearestNeighbors

    idx = NearestNeighbors(n_neighbors=k + 1, algorithm="brute").fit(x).kneighbors(x)[1]
    out = np.empty((x.shape[0], k), dtype=np.int64)
    for i, row in enumerate(idx):
        row = row[row != i]
        out[i] = row[:k]
    return out


def within_batch_knn_jaccard(
    x_pre: np.ndarray, x_post: np.ndarray, batches: np.ndarray, k: int = WITHIN_BATCH_K
) -> float:
    """Mean Jaccard overlap of each sample's same-batch kNN before and after integration.

    ``k`` is capped at ``batch size - 1`` per batch; batches with one sample are skipped.
    """
    batches = np.asarray(batches)
    scores: list[float] = []
    for b in pd.unique(batches):
        idx = np.flatnonzero(batches == b)
        if idx.size < 2:
            continue
        kb = min(k, idx.size - 1)
        pre = _knn_without_self(np.asarray(x_pre)[idx], kb)
        post = _knn_without_self(np.asarray(x_post)[idx], kb)
        for a, c in zip(pre, post, strict=True):
            inter = np.intersect1d(a, c, assume_unique=True).size
            scores.append(inter / (2 * kb - inter))
    return float(np.mean(scores)) if scores else float("nan")


@contextlib.contextmanager
def seeded_eigsh(seed: int) -> Iterator[None]:
    """ARPACK's starting vectors drawn from ``seed`` while the block runs.

    scib-metrics' kBET per label embeds each label's kNN graph by diffusion when it is not
    connected, through ``scipy.sparse.linalg.eigsh`` without a starting vector; SciPy 1.17
    then draws one from the operating system's entropy, so the same data scored twice gave
    different kBET values (0.0 and 0.333 for one label of a 180-sample test). Here every
    call without ``v0`` gets one from a generator seeded anew for the block, as ARPACK
    would draw it (uniform on [-1, 1]), so a score is a function of the data and the seed.
    """
    import scipy.sparse.linalg as linalg

    eigsh = linalg.eigsh
    rng = np.random.default_rng(seed)

    def seeded(A, *args, **kwargs):
        if kwargs.get("v0") is None and len(args) < 5:  # v0 is eigsh's sixth parameter
            kwargs["v0"] = rng.uniform(-1.0, 1.0, A.shape[0])
        return eigsh(A, *args, **kwargs)

    linalg.eigsh = seeded
    try:
        yield
    finally:
        linalg.eigsh = eigsh


@contextlib.contextmanager
def exact_diffusion_neighbors() -> Iterator[None]:
    """kBET per label's diffusion-map neighbours found as :func:`compute_neighbors` finds them.

    scib-metrics' ``diffusion_nn`` embeds each label's connectivities by a diffusion map and
    takes the embedding's neighbours from pynndescent at every size. Its numba compilation
    took 60 of the demo's 100 s of scoring on a Zen 3 core, for graphs of 150 samples, where
    an exact search takes milliseconds. While the block runs, embeddings of up to
    :data:`EXACT_KNN_MAX_SAMPLES` samples get the exact Euclidean neighbours (the rule every
    other graph scored here follows), larger ones pynndescent as before.

    A label of no more samples than the neighbours asked for (kBET's k0 is at least 10, so
    a label of exactly 10 samples) has no exact answer: the exact search refuses it, which
    kBET would score 0, and pynndescent returns a padded graph that kBET scores 1. Such
    labels still go to pynndescent, so every score stays what it was (on the confounded
    pseudo-bulk, labels of 10 samples, kBET is 1 for every method either way).
    """
    from scib_metrics.utils import _diffusion_nn

    module = _diffusion_nn.nearest_neighbors

    def neighbors(x: np.ndarray, n_neighbors: int) -> Any:
        # diffusion_nn calls nearest_neighbors.pynndescent(embedding, n_neighbors=k + 1)
        if n_neighbors > x.shape[0]:
            return module.pynndescent(x, n_neighbors=n_neighbors)
        return compute_neighbors(x, n_neighbors)

    _diffusion_nn.nearest_neighbors = SimpleNamespace(pynndescent=neighbors)
    try:
        yield
    finally:
        _diffusion_nn.nearest_neighbors = module


#: numba functions of umap-learn and pynndescent, as (module, name), that their packages
#: compile without numba's cache (declared without ``cache=True``). UMAP's first two make
#: its fuzzy simplicial set (the connectivities of kBET per label's graphs, and scanpy's
#: neighbour graph for the report's UMAP); the third is an epoch of the report's UMAP
#: layout. pynndescent's build the approximate neighbour graph of a scored representation
#: above :data:`EXACT_KNN_MAX_SAMPLES` samples (its ``nn_descent`` and
#: ``nn_descent_internal`` cannot be cached: numba refuses them for their globals).
UNCACHED_JIT = (
    ("umap.umap_", "smooth_knn_dist"),
    ("umap.umap_", "compute_membership_strengths"),
    ("umap.layouts", "_nb_optimize_layout_euclidean_single_epoch"),
    *(
        ("pynndescent.pynndescent_", name)
        for name in (
            "apply_sorted_graph_update_array",
            "build_candidates_owner",
            "deheap_sort",
            "generate_graph_update_array",
            "generate_graph_update_array_batched",
            "generate_leaf_updates",
            "init_random",
            "init_rp_tree",
            "process_candidates",
            "sort_updates_by_block",
        )
    ),
    ("pynndescent.distances", "alternative_dot"),
)


@contextlib.contextmanager
def torch_threads_kept() -> Iterator[None]:
    """torch's intra-op thread count after the block as it was before, where the process
    has torch (it is not imported here).

    numba's parallel functions (UMAP's, pynndescent's) start numba's OpenMP threading
    layer on first use, which sets the OpenMP thread count of the calling thread to
    ``NUMBA_NUM_THREADS`` (every core), and torch reads its own from the same runtime: a
    process that set torch to one thread and scored then trained on every core, to other
    rounding (a training after a scoring differed by up to 0.005 in total on the simulated
    suite's small studies, docs/notes/2026-12-06.md).
    """
    torch = sys.modules.get("torch")
    before = None if torch is None else torch.get_num_threads()
    try:
        yield
    finally:
        if torch is not None and torch.get_num_threads() != before:
            torch.set_num_threads(before)


@functools.cache
def cache_numba_compilation() -> None:
    """Keep numba's compilation of UMAP's and pynndescent's functions from one process to
    the next.

    Each is compiled again in every process that uses it: the fuzzy simplicial set's two
    (8-10 s on a Zen 3 core) in each ``metrics`` job and in the report's UMAP (the tiny
    test dataset's ``metrics`` job took 41 s, and 35-37 s with the compilation cached),
    the layout's epoch (1 s) in the report, pynndescent's (13 s of the 30 s that its first
    graph of 25,000 samples took) in each ``metrics`` job above 20,000 samples. Enabling
    numba's own on-disk cache for them (what ``cache=True`` does, keyed by the function's
    source and the CPU) loads the same machine code instead; the values are those of a
    fresh compilation. Where numba finds no writable cache folder (a read-only install and
    no ``NUMBA_CACHE_DIR``), they compile as before. Once per process: every method
    scored calls it.
    """
    import importlib

    for module, name in UNCACHED_JIT:
        try:
            dispatcher = getattr(importlib.import_module(module), name, None)
        except ImportError:  # another umap-learn or pynndescent: nothing to do
            continue
        enable = getattr(dispatcher, "enable_caching", None)
        if enable is None:
            continue
        with contextlib.suppress(RuntimeError):  # numba: "no locator available"
            enable()


def jax_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/locusformer/jax``, or ``~/.cache/locusformer/jax`` without one.

    The user's cache folder, where numba keeps its cache too when the package's own folder
    is not writable: one cache for every run and working directory of the user's.
    """
    base = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG specification: a relative path is invalid and is to be ignored.
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / "locusformer" / "jax"


@functools.cache
def cache_jax_compilation() -> Path | None:
    """Keep JAX's compilations of the scIB metrics from one process to the next.

    The metrics job compiles some 160 small XLA programs (silhouettes, LISI, k-means,
    PCR) in every process: about 5 of the demo's 12 s. JAX's persistent compilation cache
    (keyed by the program, its shapes, and the jaxlib version and platform) loads the
    same executables instead, so the values are bitwise those of a fresh compilation;
    XLA checks an entry's CPU features as it loads it and compiles again where they are
    not the host's (a home folder shared by a cluster's different nodes).
    JAX caches only compilations of at least 1 s by default, and none of these is: the
    thresholds are set to 0. The demo's ``metrics`` job (its command, ``python -m
    locusformer metrics`` on the five results, 2 cores shared with other work) took
    19-22 s with an empty cache and 9-10 s with a filled one (159 entries, 0.9 MB), the
    scores byte for byte those of a run without the cache.

    Where the user set a cache (``JAX_COMPILATION_CACHE_DIR``, or JAX's option set by
    their code), it is theirs and left as it is. The folder is :func:`jax_cache_dir`;
    where it cannot be made or written in, JAX compiles as before. Once per process:
    every method scored calls it.

    Returns
    -------
    pathlib.Path or None
        The cache folder set here; None where the user's is kept or there is none.
    """
    import jax

    if os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir:
        return None
    try:
        folder = jax_cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):  # a folder made earlier may be read-only
            pass
    except (OSError, RuntimeError) as e:  # RuntimeError: no home folder to be found
        log.debug("no JAX compilation cache: %s", e)
        return None
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder
