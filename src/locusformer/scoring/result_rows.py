"""An integration result's rows for some samples only, read from its h5ad (issue 15).

At atlas scale a result is too large to read whole for what is done with it: a corrected
matrix of a million samples x 2,000 genes is 8 GB of float32, and the metrics job reads
every method of a dataset. Above ``metrics.max_samples`` the scores
(:mod:`locusformer.scoring.metrics`) and the report's embeddings
(:mod:`locusformer.report.sections`) use one stratified subsample
(:mod:`locusformer.scoring.subsample`), decided from the sample table alone. So a result
is opened in two steps:

* :func:`open_result` reads what describes it, without its matrix and embedding: the
  sample table (``obs``), the gene ids and ``uns`` (method, status, representation);
* :func:`take` then reads the rows of the given samples only, of ``.X`` for a
  ``"matrix"`` result or of ``.obsm["X_emb"]`` for an ``"embedding"`` one, and returns them
  as an in-memory AnnData, so that what is computed on it is what was computed on the
  same rows cut from the whole result before.

Memory is then bounded by the subsample's rows (and the sample table), not by the number
of samples. :func:`read_result` reads a result whole, as it is still read up to the limit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anndata as ad
import h5py
import numpy as np
import pandas as pd

from locusformer.errors import InputError, one_line
from locusformer.io.results import EMBEDDING_KEY
from locusformer.scoring.subsample import subsample_mask


def read_result(path: str | os.PathLike, what: str = "integration result") -> ad.AnnData:
    """Read an integration result h5ad whole; :class:`InputError` if it cannot be read."""
    try:
        return ad.read_h5ad(path)
    except Exception as exc:
        raise InputError(path, f"cannot read {what}: {one_line(exc)}") from exc


@dataclass
class ResultFile:
    """An integration result whose matrix and embedding stay on disk until :func:`take`.

    Has the attributes of an AnnData that the checks before scoring read (``obs``,
    ``obs_names``, ``n_obs``, ``uns``), so that :func:`~locusformer.scoring.metrics.score_method`
    checks it as it checks a result read whole.
    """

    path: Path
    obs: pd.DataFrame
    var_names: pd.Index
    uns: dict[str, Any] = field(default_factory=dict)

    @property
    def obs_names(self) -> pd.Index:
        return self.obs.index

    @property
    def n_obs(self) -> int:
        return len(self.obs)


def open_result(path: str | os.PathLike, what: str = "integration result") -> ResultFile:
    """The sample table, gene ids and ``uns`` of a result h5ad, its matrices left on disk."""
    from anndata.io import read_elem

    try:
        with h5py.File(path, "r") as f:
            obs = read_elem(f["obs"])
            var = read_elem(f["var"])
            uns = read_elem(f["uns"]) if "uns" in f else {}
    except Exception as exc:
        raise InputError(path, f"cannot read {what}: {one_line(exc)}") from exc
    # as AnnData holds them: string sample ids (its obs_names), string gene ids
    obs.index = obs.index.astype(str)
    return ResultFile(Path(path), obs, var.index.astype(str), dict(uns))


def read_element(path: str | os.PathLike, key: str, what: str = "integration result") -> Any:
    """The whole h5ad element ``key`` (e.g. ``layers/corrected``), read as AnnData reads it,
    and nothing else of the file; :class:`InputError` if it is missing or unreadable."""
    from anndata.io import read_elem

    try:
        with h5py.File(path, "r") as f:
            if key not in f:
                raise InputError(path, f"{what} has no {key!r}")
            return read_elem(f[key])
    except InputError:
        raise
    except Exception as exc:
        raise InputError(path, f"cannot read {what}: {one_line(exc)}") from exc


def read_rows(path: Path, key: str, positions: np.ndarray) -> Any:
    """Rows ``positions`` (ascending, unique) of the h5ad element ``key`` (``X``, or
    ``obsm/X_emb``): a dense array, or a scipy sparse matrix for a sparse element.

    h5py reads a contiguous dataset's selected rows directly (0.2 s for 50,000 rows of
    2,000 float32 out of 100,000 on this machine), so only those rows are read from disk.
    """
    from anndata.io import sparse_dataset

    with h5py.File(path, "r") as f:
        element = f[key]
        if isinstance(element, h5py.Group):  # csr / csc, as anndata writes them
            return sparse_dataset(element)[positions]
        return element[positions]


def _element(result: ResultFile) -> str | None:
    """Which element a result is scored on: ``X`` (matrix), ``obsm/X_emb``, or none."""
    representation = result.uns.get("representation", "matrix")
    key = f"obsm/{EMBEDDING_KEY}" if representation == "embedding" else "X"
    if representation not in ("matrix", "embedding"):
        return None  # refused by the scoring, which names the representation
    with h5py.File(result.path, "r") as f:
        return key if key in f else None


def take(
    result: ad.AnnData | ResultFile,
    samples: pd.Index | None,
    method: str,
    in_given_order: bool = False,
) -> ad.AnnData:
    """The rows of ``samples`` (obs names) of ``result``, as an in-memory AnnData.

    In the result's own order (as a boolean mask cuts it), or in the order of ``samples``
    with ``in_given_order``. A result read whole is cut as before (``result[mask]``, or
    ``result[samples]``); ``samples=None`` returns it as it is. For a :class:`ResultFile`
    only the rows of the element it is scored on are read (:func:`read_rows`); ``None``
    then reads them all. :class:`InputError` if the result lacks some of ``samples``.
    """
    if isinstance(result, ad.AnnData):
        if samples is None:
            return result
        if in_given_order:
            return result[samples]
        return result[subsample_mask(result.obs_names, samples, method)]
    if samples is None:
        positions = np.arange(result.n_obs)
    elif in_given_order:
        positions = result.obs_names.get_indexer(samples)
        if (positions < 0).any():
            raise InputError("integration result", f"{method!r} lacks samples of the subsample")
    else:
        positions = np.flatnonzero(subsample_mask(result.obs_names, samples, method))
    ascending = np.sort(positions)  # h5py reads rows in ascending order only
    reorder = np.searchsorted(ascending, positions)
    key = _element(result)
    rows = None if key is None else read_rows(result.path, key, ascending)[reorder]
    var = pd.DataFrame(index=result.var_names)
    cut = ad.AnnData(X=rows if key == "X" else None, obs=result.obs.iloc[positions], var=var)
    if key is not None and key != "X":
        cut.obsm[EMBEDDING_KEY] = rows
    cut.uns.update(result.uns)
    return cut
