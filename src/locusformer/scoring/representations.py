"""The representations the metrics scored, one file per dataset, for the report to draw.

The ``metrics`` job computes each method's scored representation (the PCA of a corrected
matrix, an embedding as it is: :func:`~locusformer.scoring.metrics.scoring_representation`)
on the samples it scores. It writes them to ``results/{dataset}/metrics/representations.h5ad``:
the scored samples as ``obs`` (no ``X``), and each method's representation, aligned to
them, as ``obsm["X_<method>"]``. The report draws its embeddings from these instead of
computing every PCA again, so its plots show exactly what was scored.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from locusformer.errors import InputError, one_line
from locusformer.io.atomic import atomic_path

if TYPE_CHECKING:
    import anndata as ad

#: Scored representations by method: the rows' sample names, and the (n, d) array.
Representations = Mapping[str, tuple[pd.Index, np.ndarray]]


def write_representations(
    path: str | os.PathLike, representations: Representations, samples: pd.Index, seed: int
) -> None:
    """Write each method's representation, its rows put in the order of ``samples``.

    Every method was scored on the same samples (possibly in another order); a method
    missing from ``representations`` (it failed, or its representation could not be made)
    has no ``obsm`` entry.
    """
    import anndata as ad

    out = ad.AnnData(obs=pd.DataFrame(index=pd.Index(samples, dtype=str, name=None)))
    for method, (names, x) in representations.items():
        where = pd.Index(names).get_indexer(out.obs_names)
        if (where < 0).any() or len(names) != out.n_obs:
            raise ValueError(f"{method}: scored on other samples than {len(samples)} given")
        out.obsm[f"X_{method}"] = np.asarray(x, dtype=np.float32)[where]
    out.uns["seed"] = int(seed)
    with atomic_path(path) as tmp:
        out.write_h5ad(tmp)


def read_representations(path: str | os.PathLike | None) -> ad.AnnData | None:
    """The file :func:`write_representations` wrote (``None`` for no path);
    :class:`~locusformer.errors.InputError` naming it when it cannot be read."""
    if path is None:
        return None
    import anndata as ad

    try:
        return ad.read_h5ad(path)
    except Exception as exc:
        raise InputError(path, f"cannot read the scored representations: {one_line(exc)}") from exc


def stored_representation(
    stored: ad.AnnData | None, method: str, samples: pd.Index
) -> np.ndarray | None:
    """``method``'s scored representation of ``samples``, in their order, from ``stored``
    (:func:`read_representations`); ``None`` without a file, without the method, or when a
    sample is missing."""
    if stored is None:
        return None
    key = f"X_{method}"
    if key not in stored.obsm:
        return None
    where = stored.obs_names.get_indexer(pd.Index(samples))
    if len(where) == 0 or (where < 0).any():
        return None
    return np.asarray(stored.obsm[key])[where]
