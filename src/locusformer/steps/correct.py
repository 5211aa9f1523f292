"""``locusformer correct``: a trained model applied to the ordered matrix, block by block."""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from locusformer.errors import InputError
from locusformer.infer.correct import BLOCK_VALUES, CHUNK_SIZE, batch_codes, correct, reference_code
from locusformer.io.parquet import iter_matrix_parquet, rows_per_chunk
from locusformer.io.samples import read_batches
from locusformer.model.files import load_model
from locusformer.pp.validate import ValueScan
from locusformer.steps.outputs import fewer_malloc_arenas, matching_ids, open_outputs, read_ahead


def run_correct(
    ordered_path: str | os.PathLike,
    samples_path: str | os.PathLike,
    batch_key: str,
    weights_path: str | os.PathLike,
    config_path: str | os.PathLike,
    corrected_out: str | os.PathLike,
    latent_out: str | os.PathLike,
    h5ad_out: str | os.PathLike | None,
    reference: str = "mean",
    add_residual: bool = False,
    chunk_size: int = CHUNK_SIZE,
    device: str = "auto",
) -> None:
    """Correct ``ordered_path`` with a saved model; write parquet outputs and an .h5ad.

    corrected.parquet has the input's sample index and gene columns (float32);
    latent.parquet has columns latent_0..latent_{d-1}; the .h5ad holds X = input,
    layers["corrected"], obsm["X_locusformer"] = latent, obs = sample table, var = loci.

    The input is read in blocks of rows and every output written block by block, so
    memory holds three blocks (one read ahead, one corrected, one being written), a batch
    code per sample and the parquet writers' footers
    (see :data:`locusformer.io.parquet.ROW_GROUP_BYTES`), whatever the number of samples.
    """
    fewer_malloc_arenas()  # before any of its threads start
    model = load_model(weights_path, config_path)
    reference_code(model, reference)  # refused before anything is read
    if chunk_size < 1:
        raise InputError("chunk_size", f"must be >= 1, got {chunk_size}")
    sample_ids, genes = matching_ids(ordered_path, model)
    samples = read_batches(samples_path, batch_key, sample_ids)
    # Codes, not the names: 8 bytes a sample. An unknown batch is refused here, before
    # anything is written.
    codes = batch_codes(model, samples[batch_key])
    names = np.asarray(model.batch_names, dtype=object)
    with contextlib.ExitStack() as outputs, ThreadPoolExecutor(1) as writing:
        writers = open_outputs(
            outputs,
            model,
            samples,
            genes,
            corrected_out=corrected_out,
            latent_out=latent_out,
            h5ad_out=h5ad_out,
        )
        # The sample table and ids went into the .h5ad's obs; blocks bring their own ids.
        # Kept, their strings would hold memory in proportion to the samples through the loop.
        del samples, sample_ids

        def write_all(rows: slice, *arrays: Any) -> None:
            for write in writers:
                write(rows, *arrays)

        # Reading (one thread), the model (its workers) and writing (one thread) overlap,
        # one block each: on CPU, decompressing, compressing and copying into the .h5ad
        # took more than half of correct's time run between the model's blocks.
        written = None
        done = 0
        step = rows_per_chunk(model.n_loci, BLOCK_VALUES)
        # The reader refuses NaN and infinity; counts where log-expression belongs pass
        # it, and would be corrected into plausible-looking numbers.
        scale = ValueScan("log_expression", str(ordered_path))
        for ids, X in read_ahead(iter_matrix_parquet(ordered_path, "ordered matrix", rows=step)):
            scale.add(X)
            rows = slice(done, done + len(X))
            corrected, latent = correct(
                model,
                X,
                names[codes[rows]],
                reference=reference,
                add_residual=add_residual,
                chunk_size=chunk_size,
                device=device,
            )
            if written is not None:
                written.result()  # the previous block's; raises what the writer raised
            written = writing.submit(write_all, rows, ids, X, corrected, latent)
            done = rows.stop
            del X, corrected, latent  # the writer holds them until written
        if written is not None:
            written.result()
