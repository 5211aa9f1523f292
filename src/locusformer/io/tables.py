"""Plain tables as files: delimited text read with one-line errors, TSV and parquet written.

Reading turns every problem with a CSV/TSV (missing, empty, corrupt gzip, unparsable)
into an :class:`~locusformer.errors.InputError` that names the file; writing goes through
:func:`~locusformer.io.atomic.atomic_path`, so a failed step leaves no half-written table.
"""

from __future__ import annotations

import csv
import gzip
import os
import zlib
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pandas.api.types import is_numeric_dtype

from locusformer.errors import InputError
from locusformer.io.atomic import atomic_path

PathLike = str | os.PathLike

TEXT_SUFFIXES = {".csv": ",", ".tsv": "\t", ".txt": "\t", ".tab": "\t"}


def strip_gz(path: Path) -> tuple[str, bool]:
    """The last suffix of ``path`` (lower case) before any ``.gz``, and whether it had one."""
    suffixes = [s.lower() for s in path.suffixes]
    compressed = bool(suffixes) and suffixes[-1] == ".gz"
    if compressed:
        suffixes = suffixes[:-1]
    return (suffixes[-1] if suffixes else ""), compressed


def read_table(path: Path, **kwargs) -> pd.DataFrame:
    """Read a CSV/TSV (optionally gzipped) with ``pandas.read_csv`` and ``kwargs``.

    The separator comes from the suffix (:data:`TEXT_SUFFIXES`); a missing, empty,
    corrupt or unparsable file is an InputError naming it.
    """
    suffix, _ = strip_gz(path)
    sep = TEXT_SUFFIXES.get(suffix)
    if sep is None:
        raise InputError(path, "unsupported table type (expected .csv or .tsv, optionally .gz)")
    if not path.is_file():
        raise InputError(path, "file not found")
    _check_separator(path, sep)
    try:
        # utf-8-sig drops a byte-order mark that spreadsheet exports put before the header.
        return pd.read_csv(path, sep=sep, encoding="utf-8-sig", **kwargs)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise InputError(path, f"corrupt or truncated compressed file ({exc})") from None
    except pd.errors.EmptyDataError:
        raise InputError(path, "file is empty") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(path, f"cannot parse table: {first_line}") from None


def _check_separator(path: Path, sep: str) -> None:
    """Refuse a file whose name promises one separator and whose header uses the other
    (a TSV named ``.csv``): read with the wrong one, every line is a single field, and
    what went wrong would surface far from its cause."""
    _, compressed = strip_gz(path)
    opener = gzip.open if compressed else open
    try:
        with opener(path, "rt", encoding="utf-8-sig", errors="replace") as handle:
            header = handle.readline()
    except (OSError, EOFError, zlib.error):
        return  # read_csv says what is wrong with the file
    other = {",": "\t", "\t": ","}[sep]
    if sep not in header and other in header:
        named, found = {",": ("comma", "tab"), "\t": ("tab", "comma")}[sep]
        right = ".tsv" if other == "\t" else ".csv"
        raise InputError(
            path,
            f"named as {named}-separated, but its header is {found}-separated: "
            f"rename it to end in {right}",
        )


def header_fields(path: Path) -> list[str]:
    """The fields of the first line of a CSV/TSV, stripped, as written.

    pandas renames repeated or empty column names; readers check them against these.
    """
    suffix, compressed = strip_gz(path)
    opener = gzip.open if compressed else open
    try:
        with opener(path, "rt", encoding="utf-8-sig", newline="") as handle:
            row = next(csv.reader(handle, delimiter=TEXT_SUFFIXES[suffix]), [])
    except (OSError, EOFError, UnicodeDecodeError, csv.Error) as exc:
        raise InputError(path, f"cannot read header: {exc}") from None
    return [field.strip() for field in row]


def write_frame_parquet(path: PathLike, frame: pd.DataFrame) -> None:
    """Atomically write a table as parquet."""
    with atomic_path(path) as tmp:
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp)


def write_tsv(path: PathLike, frame: pd.DataFrame, index: bool = True) -> None:
    """Atomically write a table as TSV that reads back unchanged, whatever the text in it.

    pandas quotes a field with a tab, a quote or a newline, but not one with a carriage
    return, which readers take for a line break; such a table has every field quoted.
    """

    def has_cr(values: pd.Index | pd.Series) -> bool:
        return any(isinstance(v, str) and "\r" in v for v in values)

    quoting = csv.QUOTE_MINIMAL
    if has_cr(frame.columns) or (index and has_cr(frame.index)):
        quoting = csv.QUOTE_ALL
    elif any(has_cr(frame[c]) for c in frame.columns if not is_numeric_dtype(frame[c])):
        quoting = csv.QUOTE_ALL
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, sep="\t", index=index, quoting=quoting)
