"""The .h5ad that correct and map write: written one block of rows at a time."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from locusformer.io import atomic


@contextlib.contextmanager
def h5ad_writer(
    path: str | os.PathLike,
    samples: pd.DataFrame,
    genes: pd.Index,
    loci: pd.DataFrame | None,
    latent_dim: int,
    uns: dict[str, Any] | None = None,
) -> Iterator[Callable[[slice, np.ndarray, np.ndarray, np.ndarray], None]]:
    """Atomically write correct's .h5ad one block of rows at a time.

    Yields ``write(rows, X, corrected, latent)``. anndata writes the skeleton (obs, var,
    empty mappings); ``X``, ``layers/corrected`` and ``obsm/X_locusformer`` are then
    filled as h5py datasets carrying anndata's encoding of a dense array, so the file
    reads back with :func:`anndata.read_h5ad` like one written from memory.
    """
    import anndata as ad  # imported here: slow to import and only needed for this output
    import h5py

    obs = samples.copy(deep=False)  # columns replaced below, not changed in place
    # This generator's frame lives until the file is closed: holding the caller's table
    # there kept every sample's id and labels through correct's whole loop (1M samples:
    # about 0.1 GB).
    del samples
    obs.index = obs.index.astype(str).rename("sample_id")
    if loci is not None and loci["gene_id"].astype(str).tolist() == genes.tolist():
        var = loci.set_index(loci["gene_id"].astype(str).rename(None)).drop(columns="gene_id")
    else:
        var = pd.DataFrame(index=genes)
    var.index = var.index.astype(str)
    for frame in (obs, var):  # what anndata would do anyway, without telling on stderr
        for column in frame.select_dtypes(include="object").columns:
            frame[column] = frame[column].astype(str).astype("category")
    n, n_loci = len(obs), len(var)
    with atomic.atomic_path(path) as tmp:
        ad.AnnData(obs=obs, var=var, uns=uns or {}).write_h5ad(Path(tmp))
        del obs, var  # written; held by this generator's frame until the end otherwise
        with h5py.File(tmp, "r+") as handle:
            datasets = [
                handle.create_dataset("X", (n, n_loci), dtype="float32"),
                handle["layers"].create_dataset("corrected", (n, n_loci), dtype="float32"),
                handle["obsm"].create_dataset("X_locusformer", (n, latent_dim), dtype="float32"),
            ]
            for dataset in datasets:
                dataset.attrs["encoding-type"] = "array"
                dataset.attrs["encoding-version"] = "0.2.0"

            def write(rows: slice, *blocks: np.ndarray) -> None:
                for dataset, block in zip(datasets, blocks, strict=True):
                    dataset[rows] = block

            yield write
