"""What the correct and map steps share: the model's genes checked against a matrix file,
reading ahead, and their outputs (corrected and latent parquet, the .h5ad).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pandas as pd

from locusformer.errors import InputError
from locusformer.io.h5ad import h5ad_writer
from locusformer.io.parquet import (
    matrix_parquet_writer,
    read_matrix_ids,
)
from locusformer.model.files import TrainedModel


def matching_ids(ordered_path: str | os.PathLike, model: TrainedModel) -> tuple[pd.Index, pd.Index]:
    """Sample ids and gene columns of ordered.parquet, the genes checked to be the model's.

    Reads the ids and the schema only, not the values.
    """
    ids, genes = read_matrix_ids(ordered_path, "ordered matrix")
    if model.gene_ids is not None and genes != model.gene_ids:
        raise InputError(
            ordered_path,
            f"gene columns differ from the {model.n_loci} loci the model was trained on "
            "(same genes in the same order required)",
        )
    return ids, pd.Index(genes)


def fewer_malloc_arenas(arenas: int = 2) -> None:
    """Cap glibc's malloc arenas for the rest of the process (no-op elsewhere).

    glibc gives threads that allocate at once arenas of their own (up to 8 per core), and
    memory freed in one is not reused by another: with correct's reader, writer and model
    threads, 2 arenas instead of glibc's default held 64 MB less at 100k samples, at the
    same speed (measured with MALLOC_ARENA_MAX=2).
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).mallopt(-8, arenas)  # -8: M_ARENA_MAX
    except (OSError, AttributeError):  # not glibc
        pass


def read_ahead(
    blocks: Generator[pd.DataFrame, None, None],
) -> Iterator[tuple[pd.Index, np.ndarray]]:
    """(ids, rows as a C-contiguous float32 copy) of each block, the next read by a thread.

    The copy is made in the thread (rows in a row, as h5py writes them and the model
    reads them), so that no view of the reader's row group outlives the block: the next
    group then takes the place of this one instead of coming beside it.
    """

    def next_copy() -> tuple[pd.Index, np.ndarray] | None:
        block = next(blocks, None)
        return None if block is None else (block.index, np.ascontiguousarray(block.to_numpy()))

    try:
        with ThreadPoolExecutor(1) as reading:
            pending = reading.submit(next_copy)
            while (item := pending.result()) is not None:
                pending = reading.submit(next_copy)
                yield item
    finally:
        blocks.close()  # after the pool's exit: no read is in flight


def open_outputs(
    outputs: contextlib.ExitStack,
    model: TrainedModel,
    samples: pd.DataFrame,
    genes: pd.Index,
    *,
    corrected_out: str | os.PathLike,
    latent_out: str | os.PathLike,
    h5ad_out: str | os.PathLike | None,
    uns: dict[str, Any] | None = None,
) -> list[Callable[..., None]]:
    """Writers of correct's outputs, each ``write(rows, ids, X, corrected, latent)``.

    ``uns`` is the .h5ad's ``uns["locusformer"]``; by default, :func:`model_uns`.
    """
    latent_cols = pd.Index([f"latent_{i}" for i in range(model.config.latent_dim)])
    corrected = outputs.enter_context(matrix_parquet_writer(corrected_out, genes))
    latent = outputs.enter_context(matrix_parquet_writer(latent_out, latent_cols))
    writers = [
        lambda rows, ids, X, c, z: corrected(c, ids),
        lambda rows, ids, X, c, z: latent(z, ids),
    ]
    if h5ad_out is not None:
        loci = model.loci
        h5ad = outputs.enter_context(
            h5ad_writer(
                h5ad_out,
                samples,
                genes,
                loci,
                model.config.latent_dim,
                {"locusformer": uns if uns is not None else model_uns(model)},
            )
        )
        writers.append(lambda rows, ids, X, c, z: h5ad(rows, X, c, z))
    return writers


def model_uns(model: TrainedModel) -> dict[str, Any]:
    """What the .h5ad says of the model that corrected it (``uns["locusformer"]``)."""
    record = model.record
    uns: dict[str, Any] = {
        "batch_names": list(record.batch_names),
        "protect": list(record.protect),
        "versions": {k: str(v) for k, v in record.versions.items()},
    }
    if record.seed is not None:
        uns["seed"] = int(record.seed)
    return uns


def mapping_uns(model: TrainedModel, report: dict[str, Any]) -> dict[str, Any]:
    """``uns["locusformer"]`` of a mapped query: the model's, and what the mapping did."""
    uns = model_uns(model)
    uns["mapping"] = {
        "new_batches": list(report["new_batches"]),
        "adapted": bool(report["adapted"]),
        "n_missing_loci": int(report["genes"]["n_missing"]),
    }
    return uns
