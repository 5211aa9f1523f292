"""What a batch is: one column of the sample sheet, or the combination of several.

Kept apart from preprocessing (scanpy) because the training and baseline steps ask it too,
in environments without scanpy.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from locusformer.errors import InputError


def listing(values: list) -> str:
    """The first five values, quoted, and how many more: for one-line messages."""
    shown = ", ".join(repr(v) for v in values[:5])
    return shown + (f" and {len(values) - 5} more" if len(values) > 5 else "")


BATCH_JOIN = "+"


def batch_columns(batch_key: str) -> list[str]:
    """The sheet columns a ``batch_key`` stands for: itself, or the ``+``-joined ones."""
    if BATCH_JOIN not in batch_key:
        return [batch_key]
    return [c.strip() for c in batch_key.split(BATCH_JOIN)]


def combine_batch_columns(sheet: pd.DataFrame, batch_key: str, sheet_path: str) -> pd.DataFrame:
    """``sheet`` with a column ``batch_key`` made from the ``+``-joined columns it names.

    Several technical factors (protocol and plate, lab and run) become one batch per
    combination, as scIB scores them and as a decoder conditioned on one batch code
    needs. Nested designs (plates within a protocol) lose nothing by it; a crossed design
    gets one condition per cell of the design. The sheet's own columns are left as they
    are; a ``batch_key`` that is a column, or names one column, returns ``sheet`` itself.
    """
    if batch_key in sheet.columns or BATCH_JOIN not in batch_key:
        return sheet
    columns = batch_columns(batch_key)
    if any(not c for c in columns) or len(set(columns)) < len(columns):
        raise InputError(sheet_path, f"batch_key {batch_key!r}: empty or repeated column name")
    absent = [c for c in columns if c not in sheet.columns]
    if absent:
        raise InputError(
            sheet_path,
            f"batch_key column {absent[0]!r} of {batch_key!r} not found "
            f"(columns: {listing(list(sheet))})",
        )
    parts = [sheet[c].astype(str).str.strip() for c in columns]
    for column, values in zip(columns, parts, strict=True):
        empty = sheet.index[sheet[column].isna() | (values == "")].tolist()
        if empty:
            raise InputError(sheet_path, f"empty {column!r} for sample(s) {listing(empty)}")
    combined = parts[0]
    for values in parts[1:]:
        combined = combined + BATCH_JOIN + values
    return sheet.assign(**{batch_key: combined})


def refuse_protected_batch(protect: Sequence[str], batch_key: str) -> None:
    """An InputError when ``protect`` names the batch column (or one of the columns a
    joined ``batch_key`` combines): batch would be removed only within batch levels, that
    is, not at all."""
    for name in protect:
        if name in batch_columns(batch_key):
            raise InputError("protect", f"{name!r} is the batch column; it cannot be protected")
