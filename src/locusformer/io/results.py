"""The integration result: what every method hands to scoring, as an AnnData in an h5ad.

Baselines (:mod:`locusformer.baselines.methods`) and LocusFormer's own output (``locusformer
locusformer-result``) are written alike, so that :mod:`locusformer.scoring.metrics` scores them
the same way. A result is an :class:`~anndata.AnnData` with

* ``obs``: the sample table (batch and label columns as categoricals),
* ``var_names``: gene ids,
* ``uns["method"]``, ``uns["status"]`` (``"ok"`` or ``"failed"``), ``uns["error"]`` (if failed),
* ``uns["representation"]``: ``"matrix"`` (score ``.X``, the corrected matrix, on its PCA)
  or ``"embedding"`` (score ``.obsm["X_emb"]`` as it is).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Literal

import anndata as ad
import numpy as np
import pandas as pd

from locusformer.errors import one_line
from locusformer.io.atomic import atomic_path

EMBEDDING_KEY = "X_emb"

Representation = Literal["matrix", "embedding"]


def categorical_obs(obs: pd.DataFrame, keys: Sequence[str | None]) -> pd.DataFrame:
    """``obs`` indexed by ``sample_id`` (as str), the columns ``keys`` as str categoricals."""
    obs = obs.copy()
    obs.index = obs.index.astype(str)
    obs.index.name = "sample_id"
    for key in keys:
        if key is not None and key in obs.columns:
            col = obs[key]
            if not isinstance(col.dtype, pd.CategoricalDtype):
                col = col.astype("string").astype("category")
            # categories must be strings so that they survive h5ad round trips unchanged
            obs[key] = col.cat.rename_categories([str(c) for c in col.cat.categories])
    return obs


def make_result(
    data: ad.AnnData | np.ndarray | pd.DataFrame | None,
    *,
    method: str,
    representation: Representation,
    obs: pd.DataFrame | None = None,
    var_names: Sequence[str] | None = None,
    embedding: np.ndarray | None = None,
    batch_key: str | None = None,
    label_key: str | None = None,
    status: Literal["ok", "failed"] = "ok",
    error: str | None = None,
    uns: Mapping[str, object] | None = None,
) -> ad.AnnData:
    """Build an integration result.

    ``data`` gives ``.X`` (the corrected matrix for ``representation="matrix"``; the input
    matrix, or ``None``, for ``"embedding"``) and, when it is an AnnData or DataFrame, the
    sample ids / gene ids. ``obs`` (the sample table) and ``var_names`` override them.
    ``embedding`` (samples x dims) goes to ``.obsm["X_emb"]`` and is required for
    ``representation="embedding"`` unless ``status="failed"``.
    """
    if representation not in ("matrix", "embedding"):
        raise ValueError(f"representation must be 'matrix' or 'embedding', not {representation!r}")
    if status not in ("ok", "failed"):
        raise ValueError(f"status must be 'ok' or 'failed', not {status!r}")

    x: np.ndarray | None
    if isinstance(data, ad.AnnData):
        x = None if data.X is None else dense(data.X)
        obs = data.obs if obs is None else obs
        var_names = list(data.var_names) if var_names is None else var_names
    elif isinstance(data, pd.DataFrame):
        x = data.to_numpy()
        if obs is None:
            obs = pd.DataFrame(index=data.index.astype(str))
        var_names = [str(c) for c in data.columns] if var_names is None else var_names
    else:
        x = None if data is None else np.asarray(data)

    n_obs = (
        len(obs)
        if obs is not None
        else (x.shape[0] if x is not None else (embedding.shape[0] if embedding is not None else 0))
    )
    if obs is None:
        obs = pd.DataFrame(index=[f"s{i}" for i in range(n_obs)])
    if x is not None and x.shape[0] != len(obs):
        raise ValueError(f"matrix has {x.shape[0]} rows but the sample table {len(obs)}")
    if var_names is None:
        var_names = [f"g{i}" for i in range(x.shape[1])] if x is not None else []
    if x is not None and x.shape[1] != len(var_names):
        raise ValueError(f"matrix has {x.shape[1]} columns but there are {len(var_names)} gene ids")

    if status == "ok":
        if representation == "matrix" and x is None:
            raise ValueError("a 'matrix' result needs the corrected matrix in data")
        if representation == "embedding" and embedding is None:
            raise ValueError("an 'embedding' result needs embedding=")

    var = pd.DataFrame(index=pd.Index([str(v) for v in var_names], name="gene_id"))
    result = ad.AnnData(
        X=None if x is None else x.astype(np.float32, copy=False),
        obs=categorical_obs(obs, [batch_key, label_key]),
        var=var,
    )
    if embedding is not None:
        emb = np.asarray(embedding, dtype=np.float32)
        if emb.ndim != 2 or emb.shape[0] != result.n_obs:
            raise ValueError(f"embedding must be samples x dims, got shape {emb.shape}")
        result.obsm[EMBEDDING_KEY] = emb
    result.uns["method"] = str(method)
    result.uns["status"] = status
    result.uns["representation"] = representation
    if status == "failed":
        result.uns["error"] = one_line(error or "failed without a message")
    for key, value in (uns or {}).items():
        if value is not None:
            result.uns[key] = value
    return result


def dense(x) -> np.ndarray:
    """A matrix as a dense ndarray (a sparse one converted)."""
    return x.toarray() if hasattr(x, "toarray") else np.asarray(x)


def write_result(result: ad.AnnData, path: str | os.PathLike) -> None:
    """Write an integration result atomically."""
    with atomic_path(path) as tmp:
        result.write_h5ad(tmp)
