"""Readers for expression matrices, sample sheets and gene annotations; parquet writers.

Every reader turns a problem with the file into an :class:`~locusformer.errors.InputError`
that names the file, so the CLI can print one line and stop before writing anything.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import os
import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pandas.api.types import is_numeric_dtype
from scipy import sparse

from .atomic import atomic_path
from .errors import InputError

PathLike = str | os.PathLike

TEXT_SUFFIXES = {".csv": ",", ".tsv": "\t", ".txt": "\t", ".tab": "\t"}


def _strip_gz(path: Path) -> tuple[str, bool]:
    suffixes = [s.lower() for s in path.suffixes]
    compressed = bool(suffixes) and suffixes[-1] == ".gz"
    if compressed:
        suffixes = suffixes[:-1]
    return (suffixes[-1] if suffixes else ""), compressed


def matrix_format(path: PathLike) -> str:
    """Return ``"text"``, ``"parquet"`` or ``"h5ad"`` from the file name."""
    suffix, _ = _strip_gz(Path(path))
    if suffix in TEXT_SUFFIXES:
        return "text"
    if suffix in {".parquet", ".pq"}:
        return "parquet"
    if suffix == ".h5ad":
        return "h5ad"
    raise InputError(
        path, "unsupported file type (expected .csv, .tsv, .txt, optionally .gz, .parquet or .h5ad)"
    )


def _read_table(path: Path, **kwargs) -> pd.DataFrame:
    suffix, _ = _strip_gz(path)
    sep = TEXT_SUFFIXES.get(suffix)
    if sep is None:
        raise InputError(path, "unsupported table type (expected .csv or .tsv, optionally .gz)")
    if not path.is_file():
        raise InputError(path, "file not found")
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


def _header_fields(path: Path) -> list[str]:
    suffix, compressed = _strip_gz(path)
    opener = gzip.open if compressed else open
    try:
        with opener(path, "rt", encoding="utf-8-sig", newline="") as handle:
            row = next(csv.reader(handle, delimiter=TEXT_SUFFIXES[suffix]), [])
    except (OSError, EOFError, UnicodeDecodeError, csv.Error) as exc:
        raise InputError(path, f"cannot read header: {exc}") from None
    return [field.strip() for field in row]


def _check_values(path: PathLike, values: np.ndarray) -> None:
    if values.size and not np.isfinite(values).all():
        bad = np.argwhere(~np.isfinite(values))[0]
        raise InputError(path, f"non-finite value (NaN or infinite) at row {bad[0] + 1}")


# -- memory -------------------------------------------------------------------------------

#: Bytes per matrix value that reading certainly holds at once: the parsed float64 table
#: and the float32 matrix made from it (normalization's own copies come on top).
BYTES_PER_VALUE = 12


def available_memory() -> int | None:
    """Bytes this process can still allocate, or None where that cannot be told.

    ``MemAvailable`` of ``/proc/meminfo``, capped by the room left under the memory limit
    of the process's cgroup (what a cluster scheduler enforces); page cache counts as free.
    """
    rooms = []
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    rooms.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    rooms += _cgroup_rooms()
    return min(rooms) if rooms else None


def _cgroup_rooms() -> list[int]:
    try:
        lines = Path("/proc/self/cgroup").read_text(encoding="ascii").splitlines()
    except OSError:
        return []
    rooms = []
    for line in lines:
        _, controllers, group = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if controllers == "":  # cgroup v2
            root = Path("/sys/fs/cgroup")
            names = ("memory.max", "memory.current", "memory.stat", "file")
        elif "memory" in controllers.split(","):  # cgroup v1
            root = Path("/sys/fs/cgroup/memory")
            names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat", "cache")
        else:
            continue
        here = root / group.lstrip("/")
        while True:
            try:
                limit = (here / names[0]).read_text(encoding="ascii").strip()
                if limit != "max":
                    used = int((here / names[1]).read_text(encoding="ascii"))
                    stat = (here / names[2]).read_text(encoding="ascii").split()
                    cache = dict(zip(stat[::2], stat[1::2], strict=False)).get(names[3], "0")
                    rooms.append(max(0, int(limit) - used + int(cache)))
            except (OSError, ValueError):
                pass
            if here == root or root not in here.parents:
                break
            here = here.parent
    return rooms


def estimate_matrix_memory(path: PathLike, kind: str | None = None) -> tuple[int, str] | None:
    """Bytes that reading the matrix at ``path`` certainly takes, with its shape in words.

    Read from the file without loading it: the header and the number of lines of a text
    matrix, the metadata of parquet, the dataset sizes of an h5ad (which anndata loads in
    full). None when the file cannot tell (the reader then reports what is wrong).
    """
    path = Path(path)
    kind = kind or matrix_format(path)
    try:
        if kind == "text":
            return _estimate_text(path)
        if kind == "parquet":
            meta = pq.ParquetFile(path).metadata
            n_samples = max(meta.num_columns - 1, 1)  # one column holds the gene ids
            n = meta.num_rows * n_samples
            return n * BYTES_PER_VALUE, f"{meta.num_rows} x {n_samples} values"
        import h5py

        total = 0

        def add(_name: str, item: object) -> None:
            nonlocal total
            if isinstance(item, h5py.Dataset):
                total += item.size * item.dtype.itemsize

        with h5py.File(path, "r") as handle:
            handle.visititems(add)
        return total, f"an h5ad holding {_gib(total)} of arrays"
    except Exception:  # unreadable here means the reader will say why
        return None


def _estimate_text(path: Path) -> tuple[int, str] | None:
    _, compressed = _strip_gz(path)
    size = path.stat().st_size
    room = available_memory()
    # Each value takes at least two characters ("0,"): small plain files cannot be too big.
    if room is None or (not compressed and size // 2 * BYTES_PER_VALUE < room):
        return None
    n_columns = len(_header_fields(path))
    n_lines = 0
    opener = gzip.open if compressed else open
    with opener(path, "rb") as handle:
        while block := handle.read(1 << 24):
            n_lines += block.count(b"\n")
    n_rows = max(n_lines - 1, 0)
    n = n_rows * max(n_columns - 1, 1)
    return n * BYTES_PER_VALUE, f"{n_rows} x {max(n_columns - 1, 1)} values"


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_memory(path: PathLike, need: tuple[int, str] | None) -> None:
    """Refuse, before loading anything, a matrix that cannot fit in the memory left."""
    if need is None:
        return
    nbytes, shape = need
    room = available_memory()
    if room is not None and nbytes > room:
        raise InputError(
            path,
            f"reading {shape} needs at least {_gib(nbytes)} of memory but only {_gib(room)} "
            "is available; run this step with more memory (resources: mem_mb) or subset "
            "the matrix first",
        )


def _frame_to_anndata(path: Path, frame: pd.DataFrame) -> ad.AnnData:
    """Genes x samples frame (gene ids as index) -> samples x genes AnnData."""
    if frame.shape[0] == 0 or frame.shape[1] == 0:
        raise InputError(path, "matrix has no genes or no samples")
    missing_id = frame.index.isna() | (frame.index.map(lambda v: str(v).strip()) == "")
    if missing_id.any():
        row = int(np.flatnonzero(missing_id)[0])
        raise InputError(path, f"empty gene id in data row {row + 1}")
    frame.index = frame.index.map(lambda v: str(v).strip())
    frame.columns = [str(c).strip() for c in frame.columns]
    non_numeric = [c for c in frame.columns if not pd.api.types.is_numeric_dtype(frame[c])]
    if non_numeric:
        column = non_numeric[0]
        values = pd.to_numeric(frame[column], errors="coerce")
        row = int(np.flatnonzero(values.isna() & frame[column].notna())[:1].sum())
        raise InputError(
            path,
            f"non-numeric value {frame[column].iloc[row]!r} in sample column {column!r} "
            f"(gene {frame.index[row]!r})",
        )
    _check_unique(path, frame.index, "gene")
    _check_gene_keys(path, frame.index)
    _check_unique(path, pd.Index(frame.columns), "sample")
    values = frame.to_numpy(dtype=np.float64).T
    _check_values(path, values)
    adata = ad.AnnData(
        X=values.astype(np.float32),
        obs=pd.DataFrame(index=pd.Index(frame.columns, name="sample_id")),
        var=pd.DataFrame(index=pd.Index(frame.index, name="gene_id")),
    )
    return adata


def _check_unique(path: PathLike, index: pd.Index, what: str) -> None:
    duplicated = index[index.duplicated()].unique()
    if len(duplicated):
        shown = ", ".join(map(repr, duplicated[:5].tolist()))
        raise InputError(path, f"duplicate {what} ids: {shown}")


def _check_gene_keys(path: PathLike, gene_ids: pd.Index) -> None:
    """Refuse ids that are distinct as written but the same locus once matched.

    Matching strips Ensembl versions and ignores case (:func:`locusformer.loci.
    normalize_gene_id`), so ``ENSG1.1`` and ``ENSG1.2`` (or ``Tp53`` and ``TP53``) would
    take one locus twice; which of them is meant cannot be guessed.
    """
    from .loci import normalize_gene_id

    keys = pd.Index([normalize_gene_id(g, "") for g in gene_ids])
    clash = keys.duplicated(keep=False)
    if not clash.any():
        return
    groups = pd.Series(gene_ids[clash]).groupby(keys[clash], sort=False).agg(list)
    shown = "; ".join(" and ".join(map(repr, ids)) for ids in groups.iloc[:3])
    more = f" (and {len(groups) - 3} more)" if len(groups) > 3 else ""
    raise InputError(
        path,
        f"gene ids that are the same gene once Ensembl versions and case are ignored: "
        f"{shown}{more}; keep one row per gene",
    )


def read_expression(path: PathLike, layer: str | None = None) -> ad.AnnData:
    """Read an expression matrix as a samples x genes AnnData.

    Parameters
    ----------
    path
        Genes x samples CSV/TSV (optionally gzipped) with gene ids in the first column,
        genes x samples parquet (gene ids in the first column or the stored index), or a
        samples x genes ``.h5ad``.
    layer
        For ``.h5ad``: take the values from this layer instead of ``.X``.

    Returns
    -------
    AnnData with ``obs_names`` = sample ids and ``var_names`` = gene ids; ``.X`` is float32,
    sparse when the h5ad stored it sparse.
    """
    path = Path(path)
    kind = matrix_format(path)
    if not path.is_file():
        raise InputError(path, "file not found")
    if kind == "text":
        check_memory(path, estimate_matrix_memory(path, kind))
        frame = _read_table(path, index_col=0)
        # pandas renames a repeated column ("a", "a.1"); the header itself tells the truth.
        header = _header_fields(path)
        # A separator at the end of every line ("a,b,") adds empty, unnamed columns.
        while frame.shape[1] and header and header[-1] == "" and frame.iloc[:, -1].isna().all():
            frame, header = frame.iloc[:, :-1], header[:-1]
        if len(header) == frame.shape[1] > 1 and frame.iloc[:, -1].isna().all():
            # pandas took the lines' extra field for R's unnamed row-name column.
            raise InputError(
                path,
                "the data lines have one field more than the header and it is empty: remove "
                "the separator at the end of each line",
            )
        samples = header[-frame.shape[1] :] if frame.shape[1] else []
        if "" in samples:
            raise InputError(path, f"empty sample id in the header (column {header.index('') + 1})")
        _check_unique(path, pd.Index(samples), "sample")
        return _frame_to_anndata(path, frame)
    if kind == "parquet":
        check_memory(path, estimate_matrix_memory(path, kind))
        try:
            frame = pd.read_parquet(path)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise InputError(path, f"cannot read parquet: {exc}") from None
        if isinstance(frame.index, pd.RangeIndex) and frame.shape[1] > 0:
            frame = frame.set_index(frame.columns[0])
        return _frame_to_anndata(path, frame)
    check_memory(path, estimate_matrix_memory(path, kind))
    return _read_h5ad(path, layer)


def _read_h5ad(path: Path, layer: str | None) -> ad.AnnData:
    try:
        adata = ad.read_h5ad(path)
    except Exception as exc:  # h5py and anndata raise many types for a broken file
        raise InputError(path, f"cannot read h5ad: {type(exc).__name__}: {exc}") from None
    if layer:
        if layer not in adata.layers:
            raise InputError(
                path, f"layer {layer!r} not found (layers: {', '.join(adata.layers) or 'none'})"
            )
        matrix = adata.layers[layer]
    else:
        matrix = adata.X
    if matrix is None or adata.n_obs == 0 or adata.n_vars == 0:
        raise InputError(path, "matrix has no genes or no samples")
    if sparse.issparse(matrix):
        matrix = sparse.csr_matrix(matrix, dtype=np.float32)
        _check_values(path, matrix.data)
    else:
        matrix = np.asarray(matrix, dtype=np.float32)
        _check_values(path, matrix)
    obs_names = pd.Index(adata.obs_names.astype(str), name="sample_id")
    var_names = pd.Index(adata.var_names.astype(str), name="gene_id")
    _check_unique(path, var_names, "gene")
    _check_gene_keys(path, var_names)
    _check_unique(path, obs_names, "sample")
    return ad.AnnData(
        X=matrix,
        obs=pd.DataFrame(index=obs_names),
        var=pd.DataFrame(index=var_names),
    )


# -- row chunks ------------------------------------------------------------------------------

#: Genes read from a parquet row group at once (see :func:`iter_matrix_parquet`).
GENES_AT_ONCE = 256

#: Matrix values per chunk of rows (64 MiB of float32): what streaming steps hold at once.
CHUNK_VALUES = 1 << 24


def rows_per_chunk(n_columns: int, values: int | None = None) -> int:
    """Rows of ``n_columns`` values that make one chunk of about ``values`` values."""
    return max(1, (values or CHUNK_VALUES) // max(1, n_columns))


class RowSource:
    """A samples x genes matrix read in chunks of rows: in memory, or an h5ad on disk.

    ``chunk(start, stop)`` returns rows ``start:stop`` as float32, a ``csr_matrix`` when
    the matrix is stored sparse, else an ndarray. Steps that go through every row chunk by
    chunk hold one chunk at a time, whatever the number of samples.
    """

    def __init__(
        self,
        path: PathLike,
        obs_names: pd.Index,
        var_names: pd.Index,
        chunk: Callable[[int, int], np.ndarray | sparse.csr_matrix],
        close: Callable[[], None] | None = None,
    ) -> None:
        self.path = str(path)
        self.obs_names = obs_names
        self.var_names = var_names
        self._chunk = chunk
        self._close = close

    @classmethod
    def from_anndata(cls, adata: ad.AnnData, path: PathLike = "expression matrix") -> RowSource:
        matrix = adata.X
        if sparse.issparse(matrix):
            matrix = sparse.csr_matrix(matrix, dtype=np.float32)
        return cls(path, adata.obs_names, adata.var_names, lambda a, b: matrix[a:b])

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.obs_names), len(self.var_names)

    def chunk(self, start: int, stop: int) -> np.ndarray | sparse.csr_matrix:
        block = self._chunk(start, stop)
        if sparse.issparse(block):
            return sparse.csr_matrix(block, dtype=np.float32)
        return np.asarray(block, dtype=np.float32)

    def chunks(
        self, rows: int | None = None
    ) -> Iterator[tuple[slice, np.ndarray | sparse.csr_matrix]]:
        """Yield (row slice, rows) from the first row to the last."""
        n = len(self.obs_names)
        rows = rows or rows_per_chunk(len(self.var_names))
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            yield slice(start, stop), self.chunk(start, stop)

    def close(self) -> None:
        if self._close is not None:
            self._close()

    def __enter__(self) -> RowSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_expression(
    path: PathLike, layer: str | None = None, *, held_rows: int | None = None
) -> RowSource:
    """Open an expression matrix for reading in row chunks (see :class:`RowSource`).

    An ``.h5ad`` stays on disk: only its sample and gene ids are read now, the values
    chunk by chunk when asked for (anndata's backed mode for the ids, its on-disk sparse
    dataset for the values). A text or parquet matrix is genes x samples, so a chunk of
    samples is a set of columns spread over the whole file: it is read whole (see
    :func:`read_expression`) and served from memory. Value checks (non-finite values)
    happen on each chunk, see :func:`check_chunk`. ``held_rows``: how many rows of an
    h5ad the caller keeps in memory at once (for the memory check; default all).
    """
    path = Path(path)
    kind = matrix_format(path)
    if kind != "h5ad":
        return RowSource.from_anndata(read_expression(path), path)
    if not path.is_file():
        raise InputError(path, "file not found")
    return _open_h5ad(path, layer, held_rows)


def _open_h5ad(path: Path, layer: str | None, held_rows: int | None) -> RowSource:
    import h5py
    from anndata.io import sparse_dataset

    try:
        backed = ad.read_h5ad(path, backed="r")
        obs_names, var_names = backed.obs_names.copy(), backed.var_names.copy()
        layers = list(backed.layers.keys()) if layer else []
        backed.file.close()
        handle = h5py.File(path, "r")
    except Exception as exc:  # h5py and anndata raise many types for a broken file
        raise InputError(path, f"cannot read h5ad: {type(exc).__name__}: {exc}") from None
    try:
        if layer and layer not in layers:
            raise InputError(
                path, f"layer {layer!r} not found (layers: {', '.join(layers) or 'none'})"
            )
        element = handle["layers"][layer] if layer else handle.get("X")
        if element is None or 0 in (len(obs_names), len(var_names)):
            raise InputError(path, "matrix has no genes or no samples")
        stored = sparse_dataset(element) if isinstance(element, h5py.Group) else element
        if tuple(stored.shape) != (len(obs_names), len(var_names)):
            raise InputError(path, "matrix shape does not match its sample and gene ids")
        # Rows of a column-compressed matrix are spread over all of it: it is read once.
        whole = getattr(stored, "format", "") == "csc"
        need = estimate_matrix_memory(path, "h5ad")
        if need is not None:
            # What is held: a share of the arrays (the rows kept) and a dense chunk.
            held_share = (held_rows or len(obs_names)) / len(obs_names)
            share = 1.0 if whole else min(1.0, held_share)
            chunk = rows_per_chunk(len(var_names)) * len(var_names) * BYTES_PER_VALUE
            held = int(need[0] * share) + min(chunk, len(obs_names) * len(var_names) * 4)
            check_memory(path, (held, f"{need[1]} ({share:.0%} of its rows at once)"))
        if whole:
            stored = stored.to_memory().tocsr()
    except InputError:
        handle.close()
        raise
    except Exception as exc:  # an unexpected layout: say so in one line
        handle.close()
        raise InputError(path, f"cannot read h5ad: {type(exc).__name__}: {exc}") from None
    obs_names = pd.Index(obs_names.astype(str), name="sample_id")
    var_names = pd.Index(var_names.astype(str), name="gene_id")
    try:
        _check_unique(path, var_names, "gene")
        _check_gene_keys(path, var_names)
        _check_unique(path, obs_names, "sample")
    except InputError:
        handle.close()
        raise
    return RowSource(path, obs_names, var_names, lambda a, b: stored[a:b], handle.close)


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


def read_sample_sheet(path: PathLike, sample_column: str | None = None) -> pd.DataFrame:
    """Read a sample sheet (CSV/TSV) indexed by sample id, all columns as strings.

    The id column is ``sample_column`` when given, else ``sample_id`` when present, else
    the first column.
    """
    path = Path(path)
    frame = _read_table(path, dtype=str, keep_default_na=False)
    # A separator at the end of every line adds an unnamed, empty column: not data.
    frame = frame.drop(
        columns=[
            c
            for c in frame.columns
            if str(c).startswith("Unnamed: ") and (frame[c].str.strip() == "").all()
        ]
    )
    frame.columns = [str(c).strip() for c in frame.columns]
    if frame.shape[1] == 0 or frame.shape[0] == 0:
        raise InputError(path, "sample sheet has no rows")
    if sample_column is None:
        sample_column = "sample_id" if "sample_id" in frame.columns else frame.columns[0]
    if sample_column not in frame.columns:
        raise InputError(path, f"sample id column {sample_column!r} not found")
    ids = frame[sample_column].str.strip()
    frame = frame.drop(columns=[sample_column])
    frame.index = pd.Index(ids, name="sample_id")
    _check_unique(path, frame.index, "sample")
    if (frame.index == "").any():
        raise InputError(path, "empty sample id")
    return frame


# -- gene annotations ---------------------------------------------------------------------

ANNOTATION_COLUMNS = ["gene_id", "chrom", "start", "end"]
_GTF_ATTRIBUTE = re.compile(r'(\S+)\s+"([^"]*)"')


def annotation_format(path: PathLike) -> str:
    suffix, _ = _strip_gz(Path(path))
    if suffix in {".gtf", ".gff", ".gff2"}:
        return "gtf"
    if suffix == ".bed":
        return "bed"
    if suffix in {".tsv", ".txt", ".tab", ".csv"}:
        return "table"
    raise InputError(path, "unsupported annotation type (expected .tsv/.csv, .gtf or .bed)")


def read_annotation(path: PathLike, gene_id: str) -> pd.DataFrame:
    """Read gene coordinates as a frame with columns gene_id, chrom, start, end.

    Parameters
    ----------
    path
        A table with ``chrom``, ``start``, ``end`` and an id column (like the bundled
        ``hs_gene_coordinates.tsv.gz``), a GTF (``gene`` records; ``gene_id`` names the
        attribute) or a BED file (name column = gene id; 0-based starts made 1-based).
    gene_id
        Which column (table) or attribute (GTF) holds the ids that the matrix uses.
    """
    path = Path(path)
    kind = annotation_format(path)
    if not path.is_file():
        raise InputError(path, "file not found")
    if kind == "table":
        frame = _read_table(path, dtype=str, keep_default_na=False)
        missing = [c for c in ("chrom", "start", "end", gene_id) if c not in frame.columns]
        if missing:
            raise InputError(path, f"annotation lacks column(s): {', '.join(missing)}")
        frame = frame.rename(columns={gene_id: "gene_id"})[ANNOTATION_COLUMNS]
    elif kind == "bed":
        frame = _read_bed(path)
    else:
        frame = _read_gtf(path, gene_id)
    frame = frame[frame["gene_id"].astype(str).str.strip() != ""].copy()
    frame["start"] = pd.to_numeric(frame["start"], errors="coerce")
    frame["end"] = pd.to_numeric(frame["end"], errors="coerce")
    frame = frame.dropna(subset=["start", "end"])
    frame["start"] = frame["start"].astype(np.int64)
    frame["end"] = frame["end"].astype(np.int64)
    if frame.empty:
        raise InputError(path, f"annotation has no usable records with a {gene_id!r} id")
    return frame.reset_index(drop=True)


def _read_bed(path: Path) -> pd.DataFrame:
    _, compressed = _strip_gz(path)
    opener = gzip.open if compressed else open
    try:
        # UCSC "track" and "browser" lines have fewer fields: drop them before parsing.
        with opener(path, "rt", encoding="utf-8-sig") as handle:
            lines = [line for line in handle if not line.startswith(("track", "browser", "#"))]
        frame = pd.read_csv(
            io.StringIO("".join(lines)), sep="\t", header=None, dtype=str, usecols=[0, 1, 2, 3]
        )
    except (ValueError, pd.errors.ParserError, EOFError, OSError, zlib.error) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise InputError(path, f"cannot parse BED (need at least 4 columns): {reason}") from None
    frame.columns = ["chrom", "start", "end", "gene_id"]
    frame["start"] = pd.to_numeric(frame["start"], errors="coerce") + 1
    return frame


def _read_gtf(path: Path, gene_id: str) -> pd.DataFrame:
    try:
        frame = pd.read_csv(
            path, sep="\t", header=None, comment="#", dtype=str, usecols=[0, 2, 3, 4, 8]
        )
    except (ValueError, pd.errors.ParserError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise InputError(path, f"cannot parse GTF (need 9 columns): {exc}") from None
    frame.columns = ["chrom", "feature", "start", "end", "attributes"]
    genes = frame[frame["feature"] == "gene"]
    if genes.empty:
        raise InputError(path, "GTF has no 'gene' records")
    ids = genes["attributes"].map(lambda text: dict(_GTF_ATTRIBUTE.findall(text)).get(gene_id))
    if ids.isna().all():
        raise InputError(path, f"GTF gene records have no {gene_id!r} attribute")
    return pd.DataFrame(
        {"gene_id": ids, "chrom": genes["chrom"], "start": genes["start"], "end": genes["end"]}
    ).dropna(subset=["gene_id"])


# -- writers ------------------------------------------------------------------------------


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

#: Largest dictionary page of a column chunk before arrow falls back to plain encoding.
#: Arrow's default (1 MiB) is never reached by a float32 column of a 16k-row group, so every
#: chunk was dictionary-encoded: dense values (corrected matrices) were hashed one by one
#: into files larger than the raw floats (178 MiB for a 128 MiB group, written in 3.7 s
#: against 0.8 s plain). 8 KiB keeps the dictionary for sparse log-expression, whose
#: columns hold few distinct values, and drops it early for dense ones (measured:
#: ``benchmarks/parquet_encoding.py``).
DICTIONARY_PAGE_BYTES = 1 << 13

#: Fraction of exact zeros in a gene's first row group from which its column is
#: dictionary-encoded (log-expression of counts: few distinct values); below it, the column
#: is written with BYTE_STREAM_SPLIT, parquet's encoding for floats, which puts the
#: values' exponent bytes together where zstd finds something to compress. On a dense
#: 128 MiB row group it wrote in 0.33 s against 0.54 s plain, into 119 MiB against 125,
#: and read faster; on log-counts at 70% zeros the dictionary stays better (25 MiB
#: against 51; measured: ``benchmarks/parquet_encoding.py``).
SPARSE_ZEROS = 0.5


def _column_encoding(values: np.ndarray, columns: pd.Index) -> dict[str, Any]:
    """ParquetWriter options for gene columns whose first row group is ``values`` (genes x rows)."""
    rows = max(1, values.shape[1])
    sparse = 1.0 - np.count_nonzero(values, axis=1) / rows >= SPARSE_ZEROS
    return {
        "use_dictionary": columns[sparse].tolist(),
        "dictionary_pagesize_limit": DICTIONARY_PAGE_BYTES,
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
        sample_ids = np.concatenate(ids) if ids else np.empty(0, dtype=object)
        # A frame over the gathered values (no copy): arrow reads each gene's row in place.
        frame = pd.DataFrame(
            values.T.astype(np.float32, copy=False),
            index=pd.Index(sample_ids, name="sample_id", dtype=object),
            columns=columns,
            copy=False,
        )
        table = pa.Table.from_pandas(frame, preserve_index=True)
        if writer is None:
            writer = pq.ParquetWriter(
                tmp, table.schema, compression="zstd", **_column_encoding(values, columns)
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
        _check_unique(path, ids, "sample")  # a repeat within the block
        again = ids[np.isin(hashes, np.concatenate(seen))] if seen else ids[:0]
        raise InputError(path, f"duplicate sample ids: {(again if len(again) else ids)[0]!r}")
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


def read_matrix_parquet(path: PathLike, what: str = "matrix") -> pd.DataFrame:
    """Read a samples x genes float32 parquet written by :func:`write_matrix_parquet`.

    The one reader of the workflow's intermediate matrices (normalized, ordered, counts):
    sample ids as a str index, gene ids as str columns, every problem an InputError.
    """
    if not Path(path).is_file():
        raise InputError(path, "file not found")
    try:
        frame = pd.read_parquet(path, engine="pyarrow")
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(path, f"cannot read {what}: {' '.join(str(exc).split())}") from None
    if "sample_id" in frame.columns and frame.index.name != "sample_id":
        frame = frame.set_index("sample_id")
    if frame.shape[0] == 0 or frame.shape[1] == 0:
        raise InputError(path, f"{what} is empty ({frame.shape[0]} x {frame.shape[1]})")
    frame.index = pd.Index(frame.index.astype(str), name="sample_id")
    frame.columns = frame.columns.astype(str)
    _check_unique(path, frame.index, "sample")
    try:
        return frame.astype(np.float32)
    except (TypeError, ValueError) as exc:
        raise InputError(path, f"{what} has non-numeric values: {exc}") from None


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
