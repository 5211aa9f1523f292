"""Join a matrix to its sample sheet, normalize, filter genes and select highly variable ones."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import anndata as ad
import numpy as np
import pandas as pd
import scanpy as sc
from scipy import sparse

from .errors import InputError

log = logging.getLogger(__name__)

VALUE_TYPES = ("counts", "log_expression")


@dataclass(frozen=True)
class NormalizeParams:
    """Parameters of :func:`normalize` (see ``config/README.md``)."""

    target_sum: float = 1e4
    min_samples: int = 3
    n_top_genes: int = 2000


def _listing(values: list[str]) -> str:
    shown = ", ".join(repr(v) for v in values[:5])
    return shown + (f" and {len(values) - 5} more" if len(values) > 5 else "")


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
    sample must have a value.
    """
    for key, what in ((batch_key, "batch_key"), (label_key, "label_key")):
        if key and key not in sheet.columns:
            raise InputError(
                sheet_path, f"{what} column {key!r} not found (columns: {_listing(list(sheet))})"
            )
    in_matrix = adata.obs_names
    _check_orientation(adata, sheet, matrix_path)
    missing_from_sheet = in_matrix.difference(sheet.index, sort=False).tolist()
    if missing_from_sheet:
        raise InputError(
            sheet_path,
            f"{len(missing_from_sheet)} sample(s) of {matrix_path} missing from the sheet: "
            f"{_listing(missing_from_sheet)}",
        )
    missing_from_matrix = sheet.index.difference(in_matrix, sort=False).tolist()
    if missing_from_matrix:
        raise InputError(
            matrix_path,
            f"{len(missing_from_matrix)} sample(s) of {sheet_path} missing from the matrix: "
            f"{_listing(missing_from_matrix)}",
        )
    obs = sheet.loc[in_matrix].copy()
    for key in (batch_key, label_key):
        if key:
            empty = obs.index[obs[key].astype(str).str.strip() == ""].tolist()
            if empty:
                raise InputError(sheet_path, f"empty {key!r} for sample(s) {_listing(empty)}")
    batches = obs[batch_key].value_counts()
    if len(batches) < 2:
        raise InputError(
            sheet_path, f"column {batch_key!r} has {len(batches)} batch; at least 2 are needed"
        )
    lonely = batches.index[batches == 1].tolist()
    if lonely:
        log.warning("%s: batch(es) with a single sample kept: %s", sheet_path, _listing(lonely))
    for key in (batch_key, label_key):
        if key:
            obs[key] = obs[key].astype("category")
    adata = adata.copy()
    adata.obs = obs
    adata.obs.index.name = "sample_id"
    return adata


def _check_orientation(adata: ad.AnnData, sheet: pd.DataFrame, matrix_path: str) -> None:
    """Refuse a transposed matrix: its gene ids are the sheet's sample ids."""
    as_samples = adata.var_names.intersection(sheet.index)
    if len(as_samples) * 2 < len(sheet.index) or len(as_samples) <= len(
        adata.obs_names.intersection(sheet.index)
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
        f"the sheet (e.g. {_listing(as_samples.tolist()[:2])}); it must be {orientation}, "
        "so transpose it",
    )


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


def check_value_type(data: np.ndarray, value_type: str, source: str) -> bool:
    """Refuse values that contradict the declared ``value_type``; True if counts are whole.

    Counts stored as floats are fine when every value is whole. Non-integer values whose
    maximum stays below :data:`LOG_MAXIMUM` are log-expression declared as counts; larger
    non-integer values are taken as estimated counts (salmon, RSEM) with a warning.
    Log-expression that goes above 100 is not log-expression.
    """
    if not data.size:
        return True
    peak = float(data.max())
    if value_type == "log_expression":
        if peak > 100:
            raise InputError(
                source,
                f"values go up to {peak:.6g}, which log-expression never does: for raw counts "
                "set value_type: counts, else log-transform the matrix first",
            )
        return True
    if float(data.min()) < 0:
        raise InputError(source, "negative values in a matrix declared as value_type: counts")
    fractional, example = _fractional(data)
    if fractional and peak < LOG_MAXIMUM:
        raise InputError(
            source,
            f"the values look like log-expression, not counts (non-integer values such as "
            f"{example:.6g}, maximum {peak:.6g}); set value_type: log_expression for this "
            "dataset",
        )
    if fractional:
        log.warning(
            "%s: non-integer values (such as %.6g) in a matrix declared as counts: taken as "
            "estimated counts",
            source,
            example,
        )
    return not fractional


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
        Target sum, minimum number of expressing samples, number of HVGs (0 = all).

    Returns
    -------
    The normalized AnnData (dense float32 ``.X`` over the kept genes, raw counts of those
    genes in ``.layers["counts"]`` for counts data) and a statistics dict.
    """
    if value_type not in VALUE_TYPES:
        raise InputError(source, f"value_type must be one of {VALUE_TYPES}, not {value_type!r}")
    matrix = adata.X
    data = matrix.data if sparse.issparse(matrix) else np.asarray(matrix)
    whole = check_value_type(data, value_type, source)

    n_genes_input = adata.n_vars
    expressed = np.asarray((matrix > 0).sum(axis=0)).ravel() >= params.min_samples
    not_expressed = int((~expressed).sum())
    adata = adata[:, expressed].copy()
    if adata.n_vars == 0:
        raise InputError(source, f"no gene is expressed in at least {params.min_samples} samples")

    if value_type == "counts":
        adata.layers["counts"] = adata.X.copy()
        library = np.asarray(adata.X.sum(axis=1)).ravel()
        empty = adata.obs_names[library == 0].tolist()
        if empty:
            raise InputError(source, f"sample(s) with no counts in kept genes: {_listing(empty)}")
        sc.pp.normalize_total(adata, target_sum=params.target_sum)
        sc.pp.log1p(adata)

    not_variable = 0
    if params.n_top_genes and adata.n_vars > params.n_top_genes:
        hvg = _highly_variable(adata, batch_key, params.n_top_genes)
        not_variable = int((~hvg).sum())
        adata = adata[:, hvg].copy()

    adata.X = _dense32(adata.X)
    if "counts" in adata.layers:
        adata.layers["counts"] = _dense32(adata.layers["counts"])
    adata.uns.pop("log1p", None)

    stats = {
        "value_type": value_type,
        "integer_counts": whole if value_type == "counts" else None,
        "n_samples": int(adata.n_obs),
        "n_genes_input": int(n_genes_input),
        "n_genes_kept": int(adata.n_vars),
        "genes_dropped": {"not_expressed": not_expressed, "not_highly_variable": not_variable},
        "samples_per_batch": _counts(adata.obs[batch_key]),
        "params": {
            "target_sum": params.target_sum,
            "min_samples": params.min_samples,
            "n_top_genes": params.n_top_genes,
        },
    }
    return adata, stats


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
