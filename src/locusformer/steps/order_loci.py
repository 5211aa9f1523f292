"""``locusformer order-loci``: genes placed on the genome, the matrix's columns put in that
order."""

from __future__ import annotations

import json
import logging
import os
from typing import Literal

PathLike = str | os.PathLike

log = logging.getLogger("locusformer")


def run_order_loci(
    *,
    matrix: PathLike,
    annotation_path: PathLike,
    gene_id: str,
    unplaced: Literal["append", "drop"],
    order: Literal["genomic", "shuffled"],
    seed: int,
    out_matrix: PathLike,
    out_loci: PathLike,
    out_stats: PathLike,
) -> None:
    """Place the genes of ``matrix`` with the annotation in ``annotation_path``; write the
    matrix with its columns in that order, the loci table and the placement statistics."""
    import pandas as pd

    from locusformer.io.annotation import read_annotation
    from locusformer.io.atomic import write_text
    from locusformer.io.parquet import (
        iter_matrix_parquet,
        matrix_parquet_writer,
        open_matrix_parquet,
    )
    from locusformer.io.tables import write_frame_parquet
    from locusformer.pp.loci import order_loci, shuffle_loci

    handle, genes = open_matrix_parquet(matrix)
    handle.close()
    annotation = read_annotation(annotation_path, gene_id)
    loci, stats = order_loci(pd.Index(genes), annotation, gene_id, unplaced, source=annotation_path)
    if order == "shuffled":
        loci = shuffle_loci(loci, seed)
    stats["order"] = order
    # Row groups in, row groups out: memory holds one block of rows, whatever the samples.
    # The matrix comes first, so a bad row ends the step before any output exists.
    order = loci["gene_id"].tolist()
    with matrix_parquet_writer(out_matrix, pd.Index(order)) as write:
        for block in iter_matrix_parquet(matrix, columns=order):
            write(block.to_numpy(), block.index)
            del block  # before the reader's next row group comes
    write_frame_parquet(out_loci, loci)
    write_text(out_stats, json.dumps(stats, indent=2) + "\n")
    log.info(
        "placed %d of %d loci (%.1f%%), unplaced: %s",
        stats["n_placed"],
        stats["n_genes"],
        100 * stats["share_placed"],
        unplaced,
    )
