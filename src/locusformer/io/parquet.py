"""The workflow's matrix files: samples x genes float32 parquet, written and read by blocks.

Every intermediate matrix (normalized, counts, ordered, corrected, latent) is one of
these: index column ``sample_id``, one float32 column per gene, row groups of a bounded
size and encodings chosen per gene, so that each step streams it holding one block of
rows at a time, whatever the number of samples.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from locusformer.errors import InputError
from locusformer.io.atomic import atomic_path
from locusformer.io.checks import check_chunk, check_unique

PathLike = str | os.PathLike

# -- chunk sizes --------------------------------------------------------------------------

#: Genes read from a parquet row group at once (see :func:`iter_matrix_parquet`).
GENES_AT_ONCE = 256

#: Matrix values per chunk of rows (64 MiB of float32): what streaming steps hold at once.
CHUNK_VALUES = 1 << 24


def rows_per_chunk(n_columns: int, values: int | None = None) -> int:
    """Rows of ``n_columns`` values that make one chunk of about ``values`` values."""
    return max(1, (values or CHUNK_VALUES) // max(1, n_columns))


# -- row groups and encodings ------------------------------------------------------------

#: Bytes of values in a row group of the matrices written block by block. pyarrow holds
#: the footer of a parquet file in memory, about 0.7 KB per column chunk to read it and
#: 0.9 KB to write it (measured): with 2000 genes, 3 MB per row group. Row groups of a
#: fixed number of bytes rather than of rows keep that to 2.4% of the values whatever
#: their number of columns (it was 5.7% with the 54 MB groups of 64 MiB chunks).
ROW_GROUP_BYTES = 1 << 27

#: Most rows in such a row group. Narrow matrices (correct's 32-column latent) would
#: otherwise gather a million rows and their ids before writing one group: 128 MiB of
#: values and as many id strings held at 1M samples, growing with the samples.
ROW_GROUP_ROWS = 1 << 16

#: Fraction of exact zeros in a gene's first row group from which its column is written
#: plain; below it, with BYTE_STREAM_SPLIT, parquet's encoding for floats, which puts the
#: values' exponent bytes together where zstd finds something to compress (a dense 128 MiB
#: row group: 119 MiB against 125 plain, and faster to read). No column is
#: dictionary-encoded: arrow's dictionary (1 MiB a page by default) hashed every value of
#: dense columns into files larger than the raw floats (178 MiB for that group, written in
#: 3.7 s against 0.8 s), and even with pages of 8 KiB, on sparse log-expression, whose
#: values differ from sample to sample with the library size, it cost a third more time
#: to write for files as large or larger: 0.72 s against 0.45 s and 31 MiB against 28 for
#: a group of the simulated million, 0.14 against 0.09 s and 4.3 MiB against 3.9 for
#: CellBench's five sets. Only integer counts (scVI's input) lose by it: 10 MiB against 7
#: (all measured: ``benchmarks/parquet_encoding.py``).
SPARSE_ZEROS = 0.5


def _column_encoding(values: np.ndarray, columns: pd.Index) -> dict[str, Any]:
    """ParquetWriter options for gene columns whose first row group is ``values`` (genes x rows)."""
    rows = max(1, values.shape[1])
    sparse = 1.0 - np.count_nonzero(values, axis=1) / rows >= SPARSE_ZEROS
    return {
        "use_dictionary": False,
        "column_encoding": dict.fromkeys(columns[~sparse], "BYTE_STREAM_SPLIT"),
    }


@contextlib.contextmanager
def matrix_parquet_writer(
    path: PathLike, gene_ids: pd.Index, row_group_bytes: int | None = None
) -> Iterator[Callable[[np.ndarray, pd.Index], None]]:
    """Atomically write a samples x genes float32 parquet one block of rows at a time.

    Yields ``write(matrix, sample_ids)``. Rows are gathered, gene by gene, into row groups
    of about ``row_group_bytes`` of values (default :data:`ROW_GROUP_BYTES`) and at most
    :data:`ROW_GROUP_ROWS` rows, whatever the size of the blocks written; the gathered
    values are all that is held (arrow takes each gene's row of them without a copy). The
    file is what :func:`write_matrix_parquet` writes (index column ``sample_id``, pandas
    metadata) and appears under ``path`` only when the block ends without an error.
    """
    columns = pd.Index(pd.Index(gene_ids).astype(str))
    budget = row_group_bytes or ROW_GROUP_BYTES
    capacity = max(1, min(ROW_GROUP_ROWS, budget // (4 * max(1, len(columns)))))
    writer: pq.ParquetWriter | None = None
    gathered: np.ndarray | None = None  # (genes, capacity): one row group, gene by gene
    ids: list[np.ndarray] = []
    filled = 0

    def flush(tmp: PathLike) -> None:
        nonlocal writer, filled
        values = gathered[:, :filled] if gathered is not None else np.empty((len(columns), 0))
        values = values.astype(np.float32, copy=False)
        sample_ids = np.concatenate(ids) if ids else np.empty(0, dtype=object)
        if writer is None:
            # The first group goes through pandas, which gives the schema its pandas
            # metadata (the index, the columns' dtypes); a frame over the gathered values
            # (no copy), arrow reading each gene's row in place.
            frame = pd.DataFrame(
                values.T,
                index=pd.Index(sample_ids, name="sample_id", dtype=object),
                columns=columns,
                copy=False,
            )
            table = pa.Table.from_pandas(frame, preserve_index=True)
            writer = pq.ParquetWriter(
                tmp, table.schema, compression="zstd", **_column_encoding(values, columns)
            )
        else:
            # Later groups reuse that schema instead of pandas' conversion, column by
            # column: the same file byte for byte, 5% less time writing a 200,000 x 2,000
            # matrix.
            genes = [pa.array(row) for row in values]  # each a view of one gathered row
            table = pa.Table.from_arrays(
                [*genes, pa.array(sample_ids, type=pa.string())], schema=writer.schema
            )
        writer.write_table(table, row_group_size=max(1, filled))
        ids.clear()
        filled = 0

    with atomic_path(path) as tmp:

        def write(matrix: np.ndarray, sample_ids: pd.Index) -> None:
            nonlocal gathered, filled
            matrix = np.asarray(matrix, dtype=np.float32).reshape(len(sample_ids), len(columns))
            names = pd.Index(sample_ids).astype(str).to_numpy(dtype=object)
            done = 0
            while done < len(names):
                if gathered is None:
                    gathered = np.empty((len(columns), capacity), dtype=np.float32)
                take = min(capacity - filled, len(names) - done)
                gathered[:, filled : filled + take] = matrix[done : done + take].T
                ids.append(names[done : done + take])
                filled += take
                done += take
                if filled == capacity:
                    flush(tmp)

        try:
            yield write
            if filled or writer is None:  # the last group; no rows: a valid, empty file
                flush(tmp)
        finally:
            if writer is not None:
                writer.close()


def write_matrix_parquet(
    path: PathLike, matrix: np.ndarray, sample_ids: pd.Index, gene_ids: pd.Index
) -> None:
    """Atomically write a samples x genes float32 matrix as parquet (index ``sample_id``).

    Row groups of about :data:`ROW_GROUP_BYTES` of values (at most :data:`ROW_GROUP_ROWS`
    rows), so that readers can stream it.
    """
    rows = rows_per_chunk(len(gene_ids))
    with matrix_parquet_writer(path, gene_ids) as write:
        for start in range(0, len(sample_ids), rows):
            write(matrix[start : start + rows], sample_ids[start : start + rows])


def iter_matrix_parquet(
    path: PathLike, what: str = "matrix", columns: list[str] | None = None, rows: int | None = None
) -> Iterator[pd.DataFrame]:
    """Read a matrix written by :func:`write_matrix_parquet` in blocks of rows.

    Yields frames like :func:`read_matrix_parquet` returns (sample ids as index, float32),
    of about ``rows`` rows (default :func:`rows_per_chunk`), holding only ``columns``
    (default all) in the order given. Sample ids are checked for duplicates across blocks.
    """
    handle, genes = open_matrix_parquet(path, what)
    if columns is not None:
        missing = [c for c in columns if c not in set(genes)]
        if missing:
            raise InputError(path, f"{what} lacks gene column(s): {', '.join(missing[:5])}")
    wanted = genes if columns is None else columns
    # Sample ids already read, as sorted 64-bit hashes per block: 8 bytes a sample where a
    # set of the id strings took about 100 (0.1 GB at 1M samples).
    seen: list[np.ndarray] = []
    step = rows or rows_per_chunk(len(wanted))
    values = None
    try:
        # Row group by row group, a few hundred genes at a time, into one float32 array
        # (gene by gene) that the blocks are views of: one group's values are held and
        # nothing else of it. Reading a whole group with read_row_group held the decoded
        # group, its compressed pages and the block copied from it (3x the group's size),
        # and ParquetFile.iter_batches kept part of every batch it read.
        for i in range(handle.metadata.num_row_groups):
            n_rows = handle.metadata.row_group(i).num_rows
            ids = handle.read_row_group(i, columns=["sample_id"]).column("sample_id")
            del values
            values = np.empty((len(wanted), n_rows), dtype=np.float32)
            for a in range(0, len(wanted), GENES_AT_ONCE):
                part = handle.read_row_group(i, columns=wanted[a : a + GENES_AT_ONCE])
                for j, column in enumerate(part.itercolumns()):
                    values[a + j] = column.to_numpy(zero_copy_only=False)
                del part
            for offset in range(0, n_rows, step):
                block = slice(offset, offset + step)
                yield _matrix_block(path, ids[block], values[:, block], wanted, seen)
    except (pa.ArrowException, OSError) as exc:
        raise InputError(path, f"cannot read {what}: {' '.join(str(exc).split())}") from None
    except (TypeError, ValueError) as exc:
        raise InputError(path, f"{what} has non-numeric values: {exc}") from None
    finally:
        handle.close()


def _matrix_block(
    path: PathLike, sample_ids: pa.ChunkedArray, values: np.ndarray, wanted: list[str], seen: list
) -> pd.DataFrame:
    """One block of :func:`iter_matrix_parquet` over ``values`` (genes x rows, no copy).

    Its ids are checked against those of the blocks before (``seen``, then added to it), by
    64-bit hash: two different ids of a million collide with a chance of about 1e-8, and
    would be reported as a duplicate.
    """
    ids = pd.Index(sample_ids.to_pandas(deduplicate_objects=False).astype(str), name="sample_id")
    hashes = pd.util.hash_array(ids.to_numpy(dtype=object))
    ordered = np.sort(hashes)
    repeated = bool(np.any(ordered[1:] == ordered[:-1]))
    for earlier in seen:
        at = np.minimum(np.searchsorted(earlier, ordered), len(earlier) - 1)
        repeated = repeated or bool(np.any(earlier[at] == ordered))
    if repeated:
        check_unique(path, ids, "sample")  # a repeat within the block
        again = ids[np.isin(hashes, np.concatenate(seen))] if seen else ids[:0]
        raise InputError(path, f"duplicate sample ids: {(again if len(again) else ids)[0]!r}")
    # Every reader of a matrix refuses NaN and infinity here, naming the file: what a step
    # computed from them would be NaN too, or a training run would diverge, far from the
    # cause.
    check_chunk(path, values.T, sum(len(s) for s in seen))
    seen.append(ordered)
    return pd.DataFrame(values.T, index=ids, columns=wanted, copy=False)


def open_matrix_parquet(path: PathLike, what: str = "matrix") -> tuple[pq.ParquetFile, list[str]]:
    """The open parquet file of a matrix and its gene columns, without reading values."""
    if not Path(path).is_file():
        raise InputError(path, "file not found")
    try:
        handle = pq.ParquetFile(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(path, f"cannot read {what}: {' '.join(str(exc).split())}") from None
    names = handle.schema_arrow.names
    if "sample_id" not in names:
        handle.close()
        raise InputError(path, f"{what} has no sample_id column")
    genes = [str(n) for n in names if n != "sample_id"]
    if handle.metadata.num_rows == 0 or not genes:
        handle.close()
        raise InputError(path, f"{what} is empty ({handle.metadata.num_rows} x {len(genes)})")
    return handle, genes


def read_matrix_ids(path: PathLike, what: str = "matrix") -> tuple[pd.Index, list[str]]:
    """The sample ids (index ``sample_id``) and gene columns of a matrix, its values left
    unread."""
    handle, genes = open_matrix_parquet(path, what)
    try:
        column = handle.read(columns=["sample_id"]).column("sample_id")
    finally:
        handle.close()  # its footer (0.1 GB at 1M samples) goes before the ids come
    # Without arrow's de-duplication of the strings: ids are unique, and its hash table
    # stayed as heap that the process kept (0.15 GB at 1M samples, measured).
    ids = column.to_pandas(deduplicate_objects=False)
    return pd.Index(ids.astype(str), name="sample_id"), genes


def read_matrix_parquet(path: PathLike, what: str = "matrix") -> pd.DataFrame:
    """Read a samples x genes float32 parquet written by :func:`write_matrix_parquet`.

    The one reader of the workflow's intermediate matrices (normalized, ordered, counts):
    sample ids as a str index, gene ids as str columns, every problem an InputError.
    The values are read row group by row group (:func:`iter_matrix_parquet`) into one
    float32 array that the frame wraps without a copy: at 1M samples x 2,000 genes that is
    8 GB, where ``pandas.read_parquet`` held the Arrow table, the frame and its float32
    copy at once (about 24 GB).
    """
    handle, genes = open_matrix_parquet(path, what)
    n = handle.metadata.num_rows
    handle.close()
    values = np.empty((n, len(genes)), dtype=np.float32)
    ids: list[np.ndarray] = []
    at = 0
    for block in iter_matrix_parquet(path, what):
        values[at : at + len(block)] = block.to_numpy()
        ids.append(block.index.to_numpy(dtype=object))
        at += len(block)
    index = pd.Index(np.concatenate(ids), dtype=object, name="sample_id")
    return pd.DataFrame(values, index=index, columns=pd.Index(genes, dtype=object), copy=False)
