"""``locusformer baseline``: one established corrector on a dataset's normalized files."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import anndata as ad
import numpy as np

from locusformer.baselines.methods import (
    _check_method,
    check_covariates,
    display_name,
    failed_result,
    run_method,
)
from locusformer.errors import InputError
from locusformer.io.parquet import read_matrix_parquet
from locusformer.io.results import categorical_obs, write_result
from locusformer.io.samples import read_sample_table

log = logging.getLogger(__name__)


def load_normalized(
    ordered_path: str | os.PathLike,
    samples_path: str | os.PathLike,
    batch_key: str,
    label_key: str | None = None,
    covariates: Sequence[str] = (),
) -> ad.AnnData:
    """Load ``ordered.parquet`` + ``samples.tsv`` into an AnnData (obs in matrix order).

    ``covariates`` (columns ``combat_mod`` protects) must be columns of the sample table
    without missing values, or :class:`InputError` names ``samples_path``.
    """
    matrix = read_matrix_parquet(ordered_path, "normalized matrix")
    samples = read_sample_table(samples_path)
    for key in (batch_key, label_key):
        if key is not None and key not in samples.columns:
            raise InputError(samples_path, f"no column {key!r}")
    missing = matrix.index.difference(samples.index)
    if len(missing):
        raise InputError(
            samples_path,
            f"{len(missing)} samples of {ordered_path} are missing, e.g. {missing[0]!r}",
        )
    obs = samples.loc[matrix.index].copy()
    if obs[batch_key].isna().any():
        raise InputError(samples_path, f"column {batch_key!r} has missing values")
    check_covariates(covariates, obs, batch_key, samples_path)
    obs = categorical_obs(obs, [batch_key, label_key])
    adata = ad.AnnData(X=matrix.to_numpy(dtype=np.float32), obs=obs)
    adata.var_names = list(matrix.columns)
    return adata


def run_baseline(
    method: str,
    ordered_path: str | os.PathLike,
    samples_path: str | os.PathLike,
    batch_key: str,
    label_key: str | None,
    out_h5ad: str | os.PathLike,
    seed: int,
    counts_path: str | os.PathLike | None = None,
    covariates: Sequence[str] = (),
) -> ad.AnnData:
    """Run ``method`` on a dataset's normalized files and write its integration result.

    Unreadable or inconsistent input raises :class:`InputError`, and so does
    ``combat_mod`` without ``covariates`` (the sample-sheet columns it protects; no other
    method takes them). A method that fails on the data (ComBat with a one-sample batch,
    scVI without scvi-tools, ...) writes a result with ``uns["status"] = "failed"`` and
    ``uns["error"]`` and returns normally.
    """
    covariates = list(covariates)
    _check_method(method, covariates)
    adata = load_normalized(ordered_path, samples_path, batch_key, label_key, covariates)
    counts = None
    if counts_path is not None and Path(counts_path).exists():
        counts = read_matrix_parquet(counts_path, "count matrix")
    elif counts_path is not None:
        raise InputError(counts_path, "count matrix does not exist")

    try:
        if method == "scvi" and counts is None:
            raise RuntimeError(
                "scVI needs raw counts; this dataset has none (value_type is not counts)"
            )
        # the matrix was read for this run only: ComBat may correct it in place
        result = run_method(
            method, adata, batch_key, seed, counts=counts, covariates=covariates, overwrite=True
        )
    except Exception as exc:
        # the uncorrected "method" cannot fail on readable input: anything here is a bug
        if method == "uncorrected":
            raise
        log.warning("%s failed: %s", method, exc)
        result = failed_result(
            method, adata.obs, adata.var_names, exc, batch_key=batch_key, label_key=label_key
        )
        # a failed combat_mod still says which labels it was given
        if covariates:
            result.uns["covariates"] = covariates
            result.uns["display_name"] = display_name(method, covariates)
    result.uns["seed"] = int(seed)
    write_result(result, out_h5ad)
    return result
