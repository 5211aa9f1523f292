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

import numpy as np
import pandas as pd

from locusformer.io.atomic import atomic_path

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


def stored_representation(
    path: str | os.PathLike | None, method: str, samples: pd.Index
) -> np.ndarray | None:
    """``method``'s scored representation of ``samples``, in their order, from the file at
    ``path``; ``None`` without a file, without the method, or when a sample is missing."""
    if path is None:
        return None
    import anndata as ad

    stored = ad.read_h5ad(path)
    key = f"X_{method}"
    if key not in stored.obsm:
        return None
    where = stored.obs_names.get_indexer(pd.Index(samples))
    if len(where) == 0 or (where < 0).any():
        return None
    return np.asarray(stored.obsm[key])[where]
