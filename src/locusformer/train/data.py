"""The training matrix and its sample table: reading, splitting, statistics, storage.

A matrix is samples x loci float32, in memory or (large data) a ``.npy`` memory map that
is read block by block; every function here gives the same numbers either way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from locusformer.errors import InputError
from locusformer.io import atomic
from locusformer.io.memory import available_memory
from locusformer.io.parquet import (
    iter_matrix_parquet,
    open_matrix_parquet,
    read_matrix_parquet,
    rows_per_chunk,
)


def as_matrix(X: Any, source: str = "expression matrix") -> np.ndarray:
    """A DataFrame or array -> C-contiguous float32 (n, L); a float32 memmap as it is."""
    if isinstance(X, np.memmap) and X.dtype == np.float32 and X.ndim == 2 and X.flags.c_contiguous:
        return X  # a matrix on disk stays there (see Rows)
    arr = X.to_numpy() if isinstance(X, pd.DataFrame) else np.asarray(X)
    if arr.ndim != 2:
        raise InputError(source, f"expected a 2-d samples x loci matrix, got shape {arr.shape}")
    try:
        return np.ascontiguousarray(arr, dtype=np.float32)
    except (TypeError, ValueError) as err:
        raise InputError(source, f"values are not numeric ({err})") from None


def stratified_split(
    codes: np.ndarray, fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Hold out ``fraction`` of every batch (at least one sample of batches with >= 2)."""
    rng = np.random.default_rng([seed, 1])  # a stream of its own, independent of torch
    train, val = [], []
    for b in np.unique(codes):
        idx = np.flatnonzero(codes == b)
        rng.shuffle(idx)
        k = round(fraction * len(idx))
        if fraction > 0 and len(idx) >= 2:
            k = min(max(k, 1), len(idx) - 1)
        val.append(idx[:k])
        train.append(idx[k:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))


def row_blocks(X: np.ndarray, rows: np.ndarray | None = None) -> Iterator[np.ndarray]:
    """``X[rows]`` (all rows by default) in blocks of about 64 MiB, in row order."""
    step = rows_per_chunk(X.shape[1])
    n = len(X) if rows is None else len(rows)
    for start in range(0, n, step):
        yield X[start : start + step] if rows is None else X[rows[start : start + step]]


def column_stats(X: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-column mean and standard deviation (ddof 0) of ``X[rows]``, in float64.

    One pass in blocks of rows, merging each block's mean and sum of squared deviations
    (Chan et al.), so a matrix on disk is read once and never copied whole.
    """
    count, mean = 0, np.zeros(X.shape[1], dtype=np.float64)
    m2 = np.zeros(X.shape[1], dtype=np.float64)
    for block in row_blocks(X, np.asarray(rows)):
        k = len(block)
        block_mean = block.mean(axis=0, dtype=np.float64)
        block_m2 = ((block - block_mean) ** 2).sum(axis=0, dtype=np.float64)
        delta = block_mean - mean
        total = count + k
        mean = mean + delta * (k / total)
        m2 = m2 + block_m2 + delta**2 * (count * k / total)
        count = total
    return mean, np.sqrt(m2 / max(count, 1))


class Rows:
    """Standardized rows of the training matrix, looked up like a tensor's.

    A matrix in memory is standardized once. A matrix on disk (a ``np.memmap``) is read
    per lookup, its rows in file order for locality, and standardized then: the same
    float32 operations on the same values, so training gives the same numbers.
    """

    def __init__(self, X: np.ndarray, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.shape = X.shape
        self._mean, self._std = mean, std
        self._X = X if isinstance(X, np.memmap) else None
        self._Xs = None if self._X is not None else (torch.from_numpy(X) - mean) / std

    def index_select(self, dim: int, rows: torch.Tensor) -> torch.Tensor:
        assert dim == 0
        if self._Xs is not None:
            return self._Xs.index_select(0, rows)
        idx = rows.numpy()
        order = np.argsort(idx, kind="stable")
        block = np.empty((len(idx), self.shape[1]), dtype=np.float32)
        block[order] = self._X[idx[order]]
        return (torch.from_numpy(block) - self._mean) / self._std


class StandardizedRows:
    """``Rows`` seen as a numpy array: ``rows[i:j]`` and ``rows[idx]`` standardized."""

    def __init__(self, rows: Rows) -> None:
        self._rows = rows
        self.shape = rows.shape

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> np.ndarray:
        # A slice (PCA's blocks) names its rows without an index of every sample.
        if isinstance(index, slice):
            idx = np.arange(*index.indices(self.shape[0]))
        else:
            idx = np.asarray(index)
        return self._rows.index_select(0, torch.from_numpy(np.atleast_1d(idx))).numpy()


def minibatches(
    Xs: Rows,
    codes: torch.Tensor,
    chunks: Iterable[torch.Tensor],
    dev: torch.device,
    targets: torch.Tensor | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """Yield (x, batch, target) for each tensor of rows in ``chunks``, on ``dev``.

    ``targets`` (n, N), when given, is each sample's adversary target; else ``None``.
    """
    cuda = dev.type == "cuda"
    for chunk in chunks:
        xb, bb = Xs.index_select(0, chunk), codes.index_select(0, chunk)
        tb = None if targets is None else targets.index_select(0, chunk)
        if cuda:
            # The caching host allocator keeps a pinned block alive until its copy is
            # done, so the non-blocking copy from a fresh pinned tensor is safe.
            xb, bb = xb.pin_memory(), bb.pin_memory()
            tb = None if tb is None else tb.pin_memory()
        tb = None if tb is None else tb.to(dev, non_blocking=cuda)
        yield xb.to(dev, non_blocking=cuda), bb.to(dev, non_blocking=cuda), tb


def batch_prior(codes: np.ndarray, n_batches: int, device: torch.device) -> torch.Tensor:
    """(N,) share of each batch among ``codes``: what a discriminator of no use predicts."""
    counts = np.bincount(codes, minlength=n_batches).astype(np.float32)
    return torch.from_numpy(counts / max(1.0, counts.sum())).to(device)


def read_ordered(path: str | os.PathLike) -> pd.DataFrame:
    """The samples x loci matrix written by preprocessing (index sample_id)."""
    return read_matrix_parquet(path, "ordered matrix")


#: Copies of the matrix that training in memory holds at once (the table as read, the
#: float32 matrix, its standardized copy); "auto" keeps it on disk when they would take
#: more than half the memory left.
IN_MEMORY_COPIES = 3


@contextlib.contextmanager
def ordered_matrix(
    path: str | os.PathLike, mode: str, scratch: Path
) -> Iterator[tuple[np.ndarray, pd.Index, list[str]]]:
    """(matrix, sample ids, gene ids) of ordered.parquet, in memory or as a memmap.

    On disk, the parquet is streamed once, block by block, into a float32 ``.npy`` in a
    temporary directory in ``scratch`` (beside the checkpoint), removed afterwards.
    """
    handle, genes = open_matrix_parquet(path, "ordered matrix")
    n = handle.metadata.num_rows
    handle.close()
    need = n * len(genes) * 4 * IN_MEMORY_COPIES
    room = available_memory()
    on_disk = mode == "always" or (mode == "auto" and room is not None and need > room / 2)
    if not on_disk:
        ordered = read_ordered(path)
        yield ordered.to_numpy(dtype=np.float32), ordered.index, ordered.columns.tolist()
        return
    scratch.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix=".locusformer-data-", dir=scratch))
    try:
        npy = directory / "ordered.npy"
        ids = []
        with atomic.atomic_path(npy) as tmp, open(tmp, "wb") as fh:
            header = {"descr": "<f4", "fortran_order": False, "shape": (n, len(genes))}
            np.lib.format.write_array_header_2_0(fh, header)
            # Plain writes, not a writable memmap: a full disk is an OSError, not SIGBUS.
            for block in iter_matrix_parquet(path, "ordered matrix"):
                fh.write(np.ascontiguousarray(block.to_numpy(), dtype="<f4").tobytes())
                ids.append(block.index)
        X = np.load(npy, mmap_mode="r")
        yield X, pd.Index(np.concatenate(ids), name="sample_id"), genes
        del X
    finally:
        shutil.rmtree(directory, ignore_errors=True)
