"""``locusformer normalize``: the user's matrix joined to its sample sheet, normalized and
filtered to the highly variable genes, read and written in chunks of rows."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from locusformer.pp.normalize import NormalizeParams

PathLike = str | os.PathLike

log = logging.getLogger("locusformer")


def run_normalize(
    expression: PathLike,
    params: NormalizeParams,
    *,
    batch_key: str,
    value_type: Literal["counts", "log_expression"],
    out_matrix: PathLike,
    out_samples: PathLike,
    out_stats: PathLike,
    out_counts: PathLike | None = None,
    samples: PathLike | None = None,
    sample_column: str | None = None,
    layer: str | None = None,
    label_key: str | None = None,
) -> None:
    """Normalize ``expression`` as ``params`` say and write the matrix (and the counts of
    the kept genes, for scVI), the sample table and the statistics the report shows."""
    from locusformer.io.atomic import write_text
    from locusformer.io.expression import open_expression, read_samples
    from locusformer.io.parquet import matrix_parquet_writer
    from locusformer.io.tables import write_tsv
    from locusformer.pp.normalize import plan_normalization, sample_table

    # An h5ad stays on disk and is read in chunks of rows, more than once; memory holds
    # one chunk, per-sample vectors and the rows that rank highly variable genes.
    with open_expression(expression, layer=layer, held_rows=params.hvg_max_samples) as source:
        sheet, sheet_path = read_samples(expression, samples, sample_column)
        obs = sample_table(
            source.obs_names,
            source.var_names,
            sheet,
            batch_key,
            label_key,
            matrix_path=expression,
            sheet_path=sheet_path,
        )
        plan = plan_normalization(source, obs, value_type, batch_key, params)
        stats = plan.stats
        genes = source.var_names[plan.genes]
        # Log-expression input has no counts; an empty marker keeps the rule's outputs
        # fixed while telling count-based methods (scVI) that they cannot run.
        count_genes = genes if plan.library is not None else genes[:0]
        with contextlib.ExitStack() as outputs:
            write = outputs.enter_context(matrix_parquet_writer(out_matrix, genes))
            write_counts = None
            if out_counts:
                write_counts = outputs.enter_context(matrix_parquet_writer(out_counts, count_genes))
            for rows, normalized, counts in plan.chunks(source):
                ids = obs.index[rows]
                write(normalized, ids)
                if write_counts is not None:
                    write_counts(counts if counts is not None else normalized[:, :0], ids)
    if label_key:
        labels = obs[label_key].astype(str).value_counts().sort_index()
        stats["samples_per_label"] = {str(k): int(v) for k, v in labels.items()}
    stats["batch_key"], stats["label_key"] = batch_key, label_key
    write_tsv(out_samples, obs)
    write_text(out_stats, json.dumps(stats, indent=2) + "\n")
    log.info(
        "normalized %d samples: %d of %d genes kept",
        stats["n_samples"],
        stats["n_genes_kept"],
        stats["n_genes_input"],
    )
