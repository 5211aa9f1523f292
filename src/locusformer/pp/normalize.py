"""Join a matrix to its sample sheet, normalize, filter genes and select highly variable ones."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anndata as ad
import numpy as np
import pandas as pd
import scanpy as sc
from scipy import sparse

from locusformer.errors import InputError
from locusformer.pp.batches import combine_batch_columns, listing
from locusformer.pp.validate import ValueScan, strip_values

if TYPE_CHECKING:
    from locusformer.io.expression import RowSource

log = logging.getLogger(__name__)

VALUE_TYPES = ("counts", "log_expression")


@dataclass(frozen=True)
class NormalizeParams:
    """Parameters of :func:`normalize` (see ``config/README.md``)."""

    target_sum: float = 1e4
    min_samples: int = 3
    n_top_genes: int = 2000
    # Highly variable genes are ranked on at most this many samples (a seeded subsample).
    hvg_max_samples: int = 100_000
    seed: int = 0

    def __post_init__(self) -> None:
        # Checked where they are set, so that a nonsense value is one line naming the
        # setting, not a traceback (or a silent NaN matrix) steps later.
        if not (isinstance(self.target_sum, int | float) and math.isfinite(self.target_sum)):
            raise InputError("target_sum", f"must be a finite number, got {self.target_sum!r}")
        if self.target_sum <= 0:
            raise InputError("target_sum", f"must be > 0, got {self.target_sum!r}")
        for name, least in (("min_samples", 1), ("n_top_genes", 0), ("hvg_max_samples", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InputError(name, f"must be a whole number >= {least}, got {value!r}")


def attach_samples(
    adata: ad.AnnData,
    sheet: pd.DataFrame,
    batch_key: str,
    label_key: str | None,
    *,
    matrix_path: str,
    sheet_path: str,
) -> ad.AnnData:
    """Put the sample sheet into ``adata.obs``, checking that both list the same samples.

    The matrix's sample order is kept; the batch (and label) columns must exist and every
    sample must have a value (see :func:`sample_table`).
    """
    obs = sample_table(
        adata.obs_names,
        adata.var_names,
        sheet,
        batch_key,
        label_key,
        matrix_path=matrix_path,
        sheet_path=sheet_path,
    )
    adata = adata.copy()
    adata.obs = obs
    return adata


def sample_table(
    obs_names: pd.Index,
    var_names: pd.Index,
    sheet: pd.DataFrame,
    batch_key: str,
    label_key: str | None,
    *,
    matrix_path: str,
    sheet_path: str,
    min_batches: int = 2,
) -> pd.DataFrame:
    """The sheet's rows for the matrix's samples, in the matrix's order, checked.

    A dataset to correct needs ``min_batches`` = 2 batches; a query mapped onto a trained
    model may be one run (1).

    The batch (and label) columns must exist and every sample must have a value; both
    sides must list the same samples; a transposed matrix is refused. Only the ids of the
    matrix are needed, so a matrix on disk is not read.

    A ``batch_key`` that joins several columns with ``+`` (``protocol+plate``), and is not
    itself a column of the sheet, makes each combination of their values one batch: the
    table gains a column of that name, whose values join the columns' values with ``+``.
    """
    sheet = strip_values(sheet, [*batch_key.split("+"), batch_key, label_key], sheet_path)
    sheet = combine_batch_columns(sheet, batch_key, sheet_path)
    for key, what in ((batch_key, "batch_key"), (label_key, "label_key")):
        if key and key not in sheet.columns:
            raise InputError(
                sheet_path, f"{what} column {key!r} not found (columns: {listing(list(sheet))})"
            )
    in_matrix = pd.Index(obs_names)
    _check_orientation(in_matrix, pd.Index(var_names), sheet, matrix_path)
    missing_from_sheet = in_matrix.difference(sheet.index, sort=False).tolist()
    if missing_from_sheet:
        raise InputError(
            sheet_path,
            f"{len(missing_from_sheet)} sample(s) of {matrix_path} missing from the sheet: "
            f"{listing(missing_from_sheet)}",
        )
    missing_from_matrix = sheet.index.difference(in_matrix, sort=False).tolist()
    if missing_from_matrix:
        raise InputError(
            matrix_path,
            f"{len(missing_from_matrix)} sample(s) of {sheet_path} missing from the matrix: "
            f"{listing(missing_from_matrix)}",
        )
    obs = sheet.loc[in_matrix].copy()
    for key in (batch_key, label_key):
        if key:
            empty = obs.index[obs[key].astype(str).str.strip() == ""].tolist()
            if empty:
                raise InputError(sheet_path, f"empty {key!r} for sample(s) {listing(empty)}")
    batches = obs[batch_key].value_counts()
    if len(batches) < min_batches:
        raise InputError(
            sheet_path,
            f"column {batch_key!r} has {len(batches)} batch; at least {min_batches} are needed",
        )
    lonely = batches.index[batches == 1].tolist()
    if lonely:
        log.warning("%s: batch(es) with a single sample kept: %s", sheet_path, listing(lonely))
    for key in (batch_key, label_key):
        if key:
            obs[key] = obs[key].astype("category")
    obs.index.name = "sample_id"
    return obs


def _check_orientation(
    obs_names: pd.Index, var_names: pd.Index, sheet: pd.DataFrame, matrix_path: str
) -> None:
    """Refuse a transposed matrix: its gene ids are the sheet's sample ids."""
    as_samples = var_names.intersection(sheet.index)
    if len(as_samples) * 2 < len(sheet.index) or len(as_samples) <= len(
        obs_names.intersection(sheet.index)
    ):
        return
    orientation = (
        "samples x genes (obs = samples)"
        if str(matrix_path).endswith(".h5ad")
        else "genes x samples (one row per gene, the gene id in the first column)"
    )
    raise InputError(
        matrix_path,
        f"the matrix looks transposed: {len(as_samples)} of its gene ids are sample ids of "
        f"the sheet (e.g. {listing(as_samples.tolist()[:2])}); it must be {orientation}, "
        "so transpose it",
    )


def normalize(
    adata: ad.AnnData,
    value_type: str,
    batch_key: str,
    params: NormalizeParams,
    *,
    source: str = "expression matrix",
) -> tuple[ad.AnnData, dict]:
    """Normalize, filter and select highly variable genes.

    Parameters
    ----------
    adata
        Samples x genes; ``.X`` raw counts or log-expression, dense or sparse.
    value_type
        ``"counts"``: library-size normalization to ``target_sum`` per sample, then
        ``log1p``. ``"log_expression"``: values kept as they are.
    batch_key
        ``obs`` column used for batch-aware highly-variable-gene selection.
    params
        Target sum, minimum number of expressing samples, number of HVGs (0 = all), the
        most samples HVGs are ranked on.

    Returns
    -------
    The normalized AnnData (dense float32 ``.X`` over the kept genes, raw counts of those
    genes in ``.layers["counts"]`` for counts data) and a statistics dict. The work is
    :func:`plan_normalization` and :meth:`Normalization.chunks`, the path a matrix on disk
    takes too.
    """
    from locusformer.io.expression import RowSource

    rows = RowSource.from_anndata(adata, source)
    plan = plan_normalization(rows, adata.obs, value_type, batch_key, params)
    n, k = adata.n_obs, len(plan.genes)
    matrix = np.empty((n, k), dtype=np.float32)
    counts = np.empty((n, k), dtype=np.float32) if plan.library is not None else None
    for where, normalized, raw in plan.chunks(rows):
        matrix[where] = normalized
        if counts is not None:
            counts[where] = raw
    out = ad.AnnData(X=matrix, obs=adata.obs.copy(), var=adata.var.iloc[plan.genes].copy())
    if counts is not None:
        out.layers["counts"] = counts
    return out, plan.stats


@dataclass
class Normalization:
    """What the passes over the data decided: which genes, which library sizes."""

    genes: np.ndarray  # columns of the input kept, in input order
    library: np.ndarray | None  # per-sample counts over the kept genes (counts data)
    target_sum: float
    stats: dict

    def transform(
        self, block: np.ndarray | sparse.csr_matrix, rows: slice
    ) -> np.ndarray | sparse.csr_matrix:
        """Normalized log-expression of the input's ``rows`` (sparse stays sparse)."""
        if self.library is None:  # log-expression is used as it is
            return sparse.csr_matrix(block, dtype=np.float32) if sparse.issparse(block) else block
        scale = (self.target_sum / self.library[rows]).astype(np.float32)
        if sparse.issparse(block):
            out = sparse.csr_matrix(block, dtype=np.float32, copy=True)
            out.data *= np.repeat(scale, np.diff(out.indptr))
            np.log1p(out.data, out=out.data)
            return out
        return np.log1p(_dense32(block) * scale[:, None])

    def chunks(
        self, source: RowSource, rows: int | None = None
    ) -> Iterator[tuple[slice, np.ndarray, np.ndarray | None]]:
        """Yield (rows, normalized, counts or None), dense float32 over the kept genes."""
        for where, block in source.chunks(rows):
            block = block[:, self.genes]
            counts = _dense32(block) if self.library is not None else None
            yield where, _dense32(self.transform(block, where)), counts


def plan_normalization(
    source: RowSource,
    obs: pd.DataFrame,
    value_type: str,
    batch_key: str,
    params: NormalizeParams,
) -> Normalization:
    """Read the matrix chunk by chunk and decide genes and library sizes.

    Pass one checks values (finite, fitting ``value_type``) and counts each gene's
    expressing samples; pass two sums each sample's counts over the kept genes and keeps
    the normalized rows that highly-variable-gene selection ranks on (all samples up to
    ``params.hvg_max_samples``, else a seeded random subsample of that many, as atlas
    pipelines do). Memory holds one chunk, per-sample vectors and those rows.
    """
    from locusformer.io.checks import check_chunk

    name = source.path
    if value_type not in VALUE_TYPES:
        raise InputError(name, f"value_type must be one of {VALUE_TYPES}, not {value_type!r}")
    n, n_genes_input = source.shape
    scan = ValueScan(value_type, name)
    expressing = np.zeros(n_genes_input, dtype=np.int64)
    for where, block in source.chunks():
        check_chunk(name, block, where.start)
        if sparse.issparse(block):
            scan.add(block.data)
            expressing += np.bincount(block.indices[block.data > 0], minlength=n_genes_input)
        else:
            scan.add(block)
            expressing += (block > 0).sum(axis=0)
    whole = scan.finish()
    kept = np.flatnonzero(expressing >= params.min_samples)
    if kept.size == 0:
        raise InputError(name, f"no gene is expressed in at least {params.min_samples} samples")

    select = bool(params.n_top_genes) and kept.size > params.n_top_genes
    if select and n > params.hvg_max_samples:
        rng = np.random.default_rng(params.seed)
        ranked = np.sort(rng.choice(n, size=params.hvg_max_samples, replace=False))
    else:
        ranked = np.arange(n) if select else np.arange(0)
    counts_data = value_type == "counts"
    library = np.zeros(n, dtype=np.float64) if counts_data else None
    plan = Normalization(kept, library, params.target_sum, {})
    picked = []
    if counts_data or select:
        for where, block in source.chunks():
            block = block[:, kept]
            if library is not None:
                library[where] = np.asarray(block.sum(axis=1), dtype=np.float64).ravel()
            if select:
                lo, hi = np.searchsorted(ranked, [where.start, where.stop])
                if hi > lo:
                    here = slice(where.start, where.stop)
                    sub = plan.transform(block, here)[ranked[lo:hi] - where.start]
                    picked.append(sub)
    if library is not None:
        empty = source.obs_names[library == 0].tolist()
        if empty:
            raise InputError(name, f"sample(s) with no counts in kept genes: {listing(empty)}")

    not_variable = 0
    if select:
        stacked = (
            sparse.vstack(picked, format="csr") if sparse.issparse(picked[0]) else np.vstack(picked)
        )
        # Categories of the ranked samples only: a batch the subsample missed is no batch.
        batches = pd.Categorical(obs[batch_key].iloc[ranked].astype(str))
        ranking = ad.AnnData(X=stacked, obs=pd.DataFrame({batch_key: batches}, obs.index[ranked]))
        hvg = _highly_variable(ranking, batch_key, params.n_top_genes)
        not_variable = int((~hvg).sum())
        plan.genes = kept[hvg]

    plan.stats = {
        "value_type": value_type,
        "integer_counts": whole if counts_data else None,
        "n_samples": int(n),
        "n_genes_input": int(n_genes_input),
        "n_genes_kept": len(plan.genes),
        "genes_dropped": {
            "not_expressed": int(n_genes_input - kept.size),
            "not_highly_variable": not_variable,
        },
        "samples_per_batch": _counts(obs[batch_key]),
        "hvg_samples": len(ranked) if select else 0,
        "params": {
            "target_sum": params.target_sum,
            "min_samples": params.min_samples,
            "n_top_genes": params.n_top_genes,
            "hvg_max_samples": params.hvg_max_samples,
        },
    }
    return plan


def _highly_variable(adata: ad.AnnData, batch_key: str, n_top_genes: int) -> np.ndarray:
    """Batch-aware HVG flags (scanpy's ``seurat`` flavour on log data)."""
    sizes = adata.obs[batch_key].value_counts()
    # scanpy bins genes per batch; a batch of one sample has no variance to rank, so such
    # batches take part in the pooled ranking only.
    usable = sizes.index[sizes > 1]
    key = batch_key if len(usable) >= 2 and len(usable) == len(sizes) else None
    table = sc.pp.highly_variable_genes(
        adata, n_top_genes=n_top_genes, batch_key=key, flavor="seurat", inplace=False
    )
    return np.asarray(table["highly_variable"], dtype=bool)


def _dense32(matrix) -> np.ndarray:
    if sparse.issparse(matrix):
        matrix = matrix.toarray()
    return np.ascontiguousarray(matrix, dtype=np.float32)


def _counts(values: pd.Series) -> dict[str, int]:
    return {str(k): int(v) for k, v in values.astype(str).value_counts().sort_index().items()}
