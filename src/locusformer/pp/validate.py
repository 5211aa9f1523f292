"""The checks of an expression matrix and its batches that every entry makes.

``normalize`` checks what users give it as it reads (:mod:`locusformer.io`,
:func:`~locusformer.pp.normalize.sample_table`); the steps that take log-expression
directly (``train``, ``correct``, ``map``) and the Python API (:func:`locusformer.api.fit`,
:func:`locusformer.api.map`) make the same checks with these, in the same words, so bad
input is one :class:`~locusformer.errors.InputError` naming where it came from, at every
door, and never a NaN result or a "diverged" training run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from locusformer.errors import InputError
from locusformer.io.checks import check_chunk
from locusformer.pp.normalize import ValueScan, strip_values

#: Rows checked at once: the checks hold one block's mask, whatever the matrix.
BLOCK_ROWS = 4096


def check_log_expression(X: np.ndarray, source: str) -> None:
    """Refuse a samples x genes matrix with NaN or infinite values, or with values that
    log-expression never reaches (raw counts given where log-expression is expected).

    Reads ``X`` block by block, so a memory-mapped matrix is not loaded whole.
    """
    scan = ValueScan("log_expression", source)
    for first in range(0, X.shape[0], BLOCK_ROWS):
        block = np.asarray(X[first : first + BLOCK_ROWS])
        check_chunk(source, block, first)
        scan.add(block)
    scan.finish()


def check_ids(ids: pd.Index, source: str, what: Sequence[str]) -> None:
    """Refuse repeated ids (``what``: the ids' name, e.g. "gene" and "var_names")."""
    repeated = ids[ids.duplicated()].unique()
    if len(repeated):
        shown = ", ".join(map(repr, repeated[:5].astype(str).tolist()))
        raise InputError(source, f"duplicate {what[0]} ids in {what[1]}: {shown}")


def batch_labels(values: pd.Series, source: str, *, min_batches: int = 2) -> list[str]:
    """Each sample's batch as a string, checked as a sample sheet's batch column is.

    A missing value (None, NaN, an empty string) is refused, not taken as a batch called
    "nan"; spaces around a value are removed with a warning (``"b1 "`` is batch ``b1`` to
    whoever wrote it); fewer than ``min_batches`` batches is refused.
    """
    missing = values.isna() | (values.astype(str).str.strip() == "")
    if missing.any():
        first = values.index[missing.to_numpy()][0]
        raise InputError(
            source,
            f"{int(missing.sum())} sample(s) have no {values.name!r} value, e.g. {first!r}",
        )
    stripped = strip_values(values.astype(str).to_frame(), [values.name], source)[values.name]
    found = stripped.nunique()
    if found < min_batches:
        raise InputError(
            source,
            f"column {values.name!r} has {found} batch; at least {min_batches} are needed",
        )
    return stripped.tolist()
