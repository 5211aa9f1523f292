"""``locusformer counts``: the raw counts of the genes and samples that normalize kept, for
the baselines that model counts (scVI).

A step of its own, run only when such a baseline is asked for: at a million samples
writing them took a third of normalize's time (36 of 113 s), on the chain every other step
waits for, for a file that only scVI reads.
"""

from __future__ import annotations

import logging
import os
from typing import Literal

PathLike = str | os.PathLike

log = logging.getLogger("locusformer")


def run_counts(
    expression: PathLike,
    normalized: PathLike,
    *,
    value_type: Literal["counts", "log_expression"],
    out: PathLike,
    layer: str | None = None,
) -> None:
    """Write the values of ``expression`` for the samples and genes of ``normalized``
    (``normalize``'s matrix), rows and columns in its order, as ``normalize --out-counts``
    writes them. Log-expression has no counts: the file then holds the sample ids and no
    gene, which tells count-based methods that they cannot run."""
    import numpy as np
    import pandas as pd
    from scipy import sparse

    from locusformer.errors import InputError
    from locusformer.io.expression import open_expression
    from locusformer.io.parquet import matrix_parquet_writer, read_matrix_ids

    ids, genes = read_matrix_ids(normalized, "normalized matrix")
    wanted = pd.Index(genes if value_type == "counts" else [], dtype=object)
    with open_expression(expression, layer=layer) as source:
        if len(source.obs_names) != len(ids):
            raise InputError(
                normalized, f"{len(ids)} samples, but {expression} has {len(source.obs_names)}"
            )
        at = source.var_names.astype(str).get_indexer(wanted)
        if (at < 0).any():
            missing = wanted[at < 0][0]
            raise InputError(normalized, f"gene {missing!r} is not a gene of {expression}")
        # The input's own gene ids (and their index's name), as normalize writes them.
        with matrix_parquet_writer(out, source.var_names[at]) as write:
            for rows, block in source.chunks():
                block = block[:, at]
                block = block.toarray() if sparse.issparse(block) else block
                write(np.ascontiguousarray(block, dtype=np.float32), ids[rows])
    log.info("wrote the counts of %d samples x %d genes", len(ids), len(at))
