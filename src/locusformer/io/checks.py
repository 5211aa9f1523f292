"""The checks every reader applies to what it read: unique ids, finite values.

Each refusal is an :class:`~locusformer.errors.InputError` naming the file, so the user
inputs and the workflow's own matrices fail the same way, in one line.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
from scipy import sparse

from locusformer.errors import InputError

PathLike = str | os.PathLike


def check_unique(path: PathLike, index: pd.Index, what: str) -> None:
    """Refuse repeated ids in ``index`` (``what``: "gene" or "sample"), showing up to five."""
    duplicated = index[index.duplicated()].unique()
    if len(duplicated):
        shown = ", ".join(map(repr, duplicated[:5].tolist()))
        raise InputError(path, f"duplicate {what} ids: {shown}")


def check_values(path: PathLike, values: np.ndarray) -> None:
    """Refuse non-finite values (NaN or infinite) in a whole matrix, naming the first row."""
    if values.size and not np.isfinite(values).all():
        bad = np.argwhere(~np.isfinite(values))[0]
        raise InputError(path, f"non-finite value (NaN or infinite) at row {bad[0] + 1}")


def check_chunk(path: PathLike, block: np.ndarray | sparse.csr_matrix, first_row: int) -> None:
    """Refuse non-finite values in rows starting at ``first_row`` (0-based) of ``path``."""
    if sparse.issparse(block):
        bad = ~np.isfinite(block.data)
        if bad.any():
            row = int(np.searchsorted(block.indptr, np.flatnonzero(bad)[0], side="right")) - 1
            raise InputError(
                path, f"non-finite value (NaN or infinite) at row {first_row + row + 1}"
            )
        return
    if block.size and not np.isfinite(block).all():
        bad = np.argwhere(~np.isfinite(block))[0]
        raise InputError(
            path, f"non-finite value (NaN or infinite) at row {first_row + bad[0] + 1}"
        )
