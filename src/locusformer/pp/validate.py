"""The checks of an expression matrix and its batches that every entry makes.

``normalize`` checks what users give it as it reads (:mod:`locusformer.io`,
:func:`~locusformer.pp.normalize.sample_table`); the steps that take log-expression
directly (``train``, ``correct``, ``map``) and the Python API (:func:`locusformer.api.fit`,
:func:`locusformer.api.map`) make the same checks with these, in the same words, so bad
input is one :class:`~locusformer.errors.InputError` naming where it came from, at every
door, and never a NaN result or a "diverged" training run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import pandas as pd

from locusformer.errors import InputError
from locusformer.io.checks import check_chunk

log = logging.getLogger(__name__)

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


def strip_values(
    sheet: pd.DataFrame, columns: Sequence[str | None], sheet_path: str
) -> pd.DataFrame:
    """The sheet with leading and trailing spaces removed from the values of ``columns``
    (those it has), saying so: ``"CEL-seq2 "`` and ``"CEL-seq2"`` are one batch to a
    reader, and would be two to the model."""
    sheet = sheet.copy(deep=False)
    for column in dict.fromkeys(c for c in columns if c and c in sheet.columns):
        values = sheet[column].astype(str)
        stripped = values.str.strip()
        changed = values != stripped
        if changed.any():
            first = values[changed].iloc[0]
            log.warning(
                "%s: %d value(s) of %r had leading or trailing spaces, removed (e.g. %r -> %r)",
                sheet_path,
                int(changed.sum()),
                column,
                first,
                first.strip(),
            )
            sheet[column] = stripped.where(sheet[column].notna(), sheet[column])
    return sheet


#: Log-expression stays below this (log2 of a billion is 30); counts data go far above.
LOG_MAXIMUM = 30.0


def _fractional(data: np.ndarray) -> tuple[bool, float]:
    """Whether any value is not a whole number (and the first such value), chunk by chunk."""
    flat = data.reshape(-1)
    for start in range(0, flat.size, 1 << 22):
        chunk = flat[start : start + (1 << 22)]
        odd = np.flatnonzero(chunk != np.rint(chunk))
        if odd.size:
            return True, float(chunk[odd[0]])
    return False, 0.0


class ValueScan:
    """What :func:`check_value_type` decides on, gathered chunk by chunk.

    ``add`` each chunk's stored values (``.data`` of a sparse chunk: implicit zeros are
    whole and non-negative); ``finish`` then refuses or warns exactly as a check of the
    whole matrix would.
    """

    def __init__(self, value_type: str, source: str) -> None:
        self.value_type, self.source = value_type, source
        self.peak, self.low = -np.inf, np.inf
        self.example: float | None = None  # the first non-whole value, in row order

    def add(self, data: np.ndarray) -> None:
        if not data.size:
            return
        self.peak = max(self.peak, float(data.max()))
        if self.value_type == "log_expression":
            if self.peak > 100:  # refused whatever the rest holds: no need to read it
                self.finish()
            return
        self.low = min(self.low, float(data.min()))
        if self.low < 0:
            self.finish()
        if self.example is None:
            fractional, example = _fractional(data)
            self.example = example if fractional else None

    def finish(self) -> bool:
        """Refuse or warn as the values call for; True if counts are whole numbers."""
        peak, source = self.peak, self.source
        if self.value_type == "log_expression":
            if peak > 100:
                raise InputError(
                    source,
                    f"values go up to {peak:.6g}, which log-expression never does: for raw "
                    "counts set value_type: counts, else log-transform the matrix first",
                )
            return True
        if self.low < 0:
            raise InputError(source, "negative values in a matrix declared as value_type: counts")
        fractional, example = self.example is not None, self.example or 0.0
        if fractional and peak < LOG_MAXIMUM:
            raise InputError(
                source,
                f"the values look like log-expression, not counts (non-integer values such as "
                f"{example:.6g}, maximum {peak:.6g}); set value_type: log_expression for this "
                "dataset",
            )
        if fractional:
            log.warning(
                "%s: non-integer values (such as %.6g) in a matrix declared as counts: taken "
                "as estimated counts",
                source,
                example,
            )
        return not fractional


def check_value_type(data: np.ndarray, value_type: str, source: str) -> bool:
    """Refuse values that contradict the declared ``value_type``; True if counts are whole.

    Counts stored as floats are fine when every value is whole. Non-integer values whose
    maximum stays below :data:`LOG_MAXIMUM` are log-expression declared as counts; larger
    non-integer values are taken as estimated counts (salmon, RSEM) with a warning.
    Log-expression that goes above 100 is not log-expression.
    """
    scan = ValueScan(value_type, source)
    scan.add(np.asarray(data))
    return scan.finish()
