"""Readers of the user's expression matrices and sample sheets, whole or in chunks of rows.

Every reader turns a problem with the file into an :class:`~locusformer.errors.InputError`
that names the file, so the CLI can print one line and stop before writing anything; a
matrix that cannot fit in the memory left is refused before it is loaded.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from scipy import sparse

from locusformer.errors import InputError
from locusformer.io.checks import check_unique, check_values
from locusformer.io.memory import available_memory
from locusformer.io.parquet import rows_per_chunk
from locusformer.io.tables import TEXT_SUFFIXES, header_fields, read_table, strip_gz

PathLike = str | os.PathLike


def matrix_format(path: PathLike) -> str:
    """Return ``"text"``, ``"parquet"`` or ``"h5ad"`` from the file name."""
    suffix, _ = strip_gz(Path(path))
    if suffix in TEXT_SUFFIXES:
        return "text"
    if suffix in {".parquet", ".pq"}:
        return "parquet"
    if suffix == ".h5ad":
        return "h5ad"
    raise InputError(
        path, "unsupported file type (expected .csv, .tsv, .txt, optionally .gz, .parquet or .h5ad)"
    )


# -- memory needed ------------------------------------------------------------------------

#: Bytes per matrix value that reading certainly holds at once: the parsed float64 table
#: and the float32 matrix made from it (normalization's own copies come on top).
BYTES_PER_VALUE = 12


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
    _, compressed = strip_gz(path)
    size = path.stat().st_size
    room = available_memory()
    # Each value takes at least two characters ("0,"): small plain files cannot be too big.
    if room is None or (not compressed and size // 2 * BYTES_PER_VALUE < room):
        return None
    n_columns = len(header_fields(path))
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
    check_unique(path, frame.index, "gene")
    _check_gene_keys(path, frame.index)
    check_unique(path, pd.Index(frame.columns), "sample")
    values = frame.to_numpy(dtype=np.float64).T
    check_values(path, values)
    adata = ad.AnnData(
        X=values.astype(np.float32),
        obs=pd.DataFrame(index=pd.Index(frame.columns, name="sample_id")),
        var=pd.DataFrame(index=pd.Index(frame.index, name="gene_id")),
    )
    return adata


def _check_gene_keys(path: PathLike, gene_ids: pd.Index) -> None:
    """Refuse ids that are distinct as written but the same locus once matched.

    Matching strips Ensembl versions and ignores case (:func:`locusformer.io.genes.
    normalize_gene_id`), so ``ENSG1.1`` and ``ENSG1.2`` (or ``Tp53`` and ``TP53``) would
    take one locus twice; which of them is meant cannot be guessed.
    """
    from locusformer.io.genes import normalize_gene_id

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
        frame = read_table(path, index_col=0)
        # pandas renames a repeated column ("a", "a.1"); the header itself tells the truth.
        header = header_fields(path)
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
        check_unique(path, pd.Index(samples), "sample")
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
        check_values(path, matrix.data)
    else:
        matrix = np.asarray(matrix, dtype=np.float32)
        check_values(path, matrix)
    obs_names = pd.Index(adata.obs_names.astype(str), name="sample_id")
    var_names = pd.Index(adata.var_names.astype(str), name="gene_id")
    check_unique(path, var_names, "gene")
    _check_gene_keys(path, var_names)
    check_unique(path, obs_names, "sample")
    return ad.AnnData(
        X=matrix,
        obs=pd.DataFrame(index=obs_names),
        var=pd.DataFrame(index=var_names),
    )


# -- row chunks ---------------------------------------------------------------------------


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
    happen on each chunk, see :func:`locusformer.io.checks.check_chunk`. ``held_rows``: how
    many rows of an h5ad the caller keeps in memory at once (for the memory check; default
    all).
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
        check_unique(path, var_names, "gene")
        _check_gene_keys(path, var_names)
        check_unique(path, obs_names, "sample")
    except InputError:
        handle.close()
        raise
    return RowSource(path, obs_names, var_names, lambda a, b: stored[a:b], handle.close)


# -- sample sheets ------------------------------------------------------------------------


def read_sample_sheet(path: PathLike, sample_column: str | None = None) -> pd.DataFrame:
    """Read a sample sheet (CSV/TSV) indexed by sample id, all columns as strings.

    The id column is ``sample_column`` when given, else ``sample_id`` when present, else
    the first column.
    """
    path = Path(path)
    frame = read_table(path, dtype=str, keep_default_na=False)
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
    check_unique(path, frame.index, "sample")
    if (frame.index == "").any():
        raise InputError(path, "empty sample id")
    return frame


def read_obs(path: PathLike) -> pd.DataFrame:
    """The ``obs`` of an ``.h5ad`` as a sample sheet, without reading its matrix.

    Indexed by sample id (``obs_names``); every column as strings, as
    :func:`read_sample_sheet` reads a sheet: a missing value is ``""``, a float column
    holding whole numbers (an integer column with gaps) is written without ``.0``.
    """
    import h5py
    from anndata.io import read_elem

    path = Path(path)
    if not path.is_file():
        raise InputError(path, "file not found")
    try:
        with h5py.File(path, "r") as handle:
            obs = read_elem(handle["obs"])
    except Exception as exc:  # h5py and anndata raise many types for a broken file
        raise InputError(path, f"cannot read obs: {type(exc).__name__}: {exc}") from None
    frame = pd.DataFrame(index=pd.Index(obs.index.astype(str), name="sample_id"))
    for column in obs.columns:
        values = obs[column]
        if pd.api.types.is_float_dtype(values) and (values.dropna() % 1 == 0).all():
            values = values.astype("Int64")
        text = values.astype(object).where(values.notna(), "").astype(str)
        frame[str(column)] = text.str.strip().to_numpy()
    check_unique(path, frame.index, "sample")
    return frame


def read_samples(
    expression_path: PathLike,
    samples_path: PathLike | None = None,
    sample_column: str | None = None,
) -> tuple[pd.DataFrame, str]:
    """A matrix's sample table and the file its errors name: the sheet, the ``obs`` of an
    ``.h5ad``, or both.

    Without a sheet, an ``.h5ad``'s ``obs`` is the sample table (another matrix needs a
    sheet). With one, the sheet wins: its columns and samples are the table, an empty
    cell takes the ``obs`` value, and ``obs`` columns the sheet lacks are added. A column
    in both with different values for some sample is an :class:`InputError` naming both
    files: which of them is right cannot be guessed.
    """
    is_h5ad = matrix_format(expression_path) == "h5ad"
    if samples_path is None or str(samples_path) == "":
        if not is_h5ad:
            raise InputError(
                expression_path,
                "a sample sheet is needed (--samples); only an .h5ad can do without one, "
                "its obs holding the batch column",
            )
        return read_obs(expression_path), f"{expression_path} obs"
    sheet = read_sample_sheet(samples_path, sample_column=sample_column)
    if not is_h5ad:
        return sheet, str(samples_path)
    obs = read_obs(expression_path).reindex(sheet.index).fillna("")
    for column in sheet.columns.intersection(obs.columns):
        mine, theirs = sheet[column].str.strip(), obs[column]
        differ = (mine != theirs) & (mine != "") & (theirs != "")
        if differ.any():
            first = differ.index[differ][0]
            raise InputError(
                samples_path,
                f"column {column!r} disagrees with the obs of {expression_path} for "
                f"{int(differ.sum())} sample(s), e.g. {first!r}: {mine[first]!r} in the "
                f"sheet, {theirs[first]!r} in obs; make them agree or drop the column "
                "from one of them",
            )
        sheet[column] = mine.where(mine != "", theirs)
    for column in obs.columns.difference(sheet.columns, sort=False):
        sheet[column] = obs[column]
    return sheet, str(samples_path)
