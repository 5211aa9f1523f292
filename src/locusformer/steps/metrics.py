"""``locusformer metrics``: every method of a dataset scored in one process."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from locusformer.errors import InputError
from locusformer.scoring import result_rows, subsample
from locusformer.scoring.metrics import DEFAULT_KMEANS_STARTS, score_method
from locusformer.scoring.representations import write_representations
from locusformer.scoring.result_rows import read_result
from locusformer.scoring.tables import write_metrics

log = logging.getLogger(__name__)


def run_metrics(
    result_h5ad: str | os.PathLike,
    uncorrected_h5ad: str | os.PathLike,
    batch_key: str,
    label_key: str | None,
    out_tsv: str | os.PathLike,
    method: str | None = None,
    seed: int = 0,
    max_samples: int = subsample.DEFAULT_MAX_SAMPLES,
    kmeans_starts: int = DEFAULT_KMEANS_STARTS,
) -> pd.DataFrame:
    """Score one result file against the uncorrected result and write its metrics TSV:
    :func:`run_dataset_metrics` with one method, by default the one the result names."""
    if method is None:
        method = str(result_rows.open_result(result_h5ad).uns.get("method", "unknown"))
    outs = {method: out_tsv}
    return run_dataset_metrics(
        {method: result_h5ad},
        uncorrected_h5ad,
        batch_key,
        label_key,
        outs,
        seed=seed,
        max_samples=max_samples,
        kmeans_starts=kmeans_starts,
    )


def run_dataset_metrics(
    results: Mapping[str, str | os.PathLike],
    uncorrected_h5ad: str | os.PathLike,
    batch_key: str,
    label_key: str | None,
    out_tsvs: Mapping[str, str | os.PathLike],
    seed: int = 0,
    max_samples: int = subsample.DEFAULT_MAX_SAMPLES,
    kmeans_starts: int = DEFAULT_KMEANS_STARTS,
    out_representations: str | os.PathLike | None = None,
) -> pd.DataFrame:
    """Score every method of a dataset in one process: ``results`` and ``out_tsvs`` map
    each method to its result file and to its metrics TSV (written once all are scored).
    ``out_representations``: where to write the representations scored, for the report
    (:mod:`locusformer.scoring.representations`).

    Each method's values are the ones :func:`run_metrics` gives it alone; what is paid once
    instead of once per method is the imports, the JIT compilation (numba's of UMAP's
    fuzzy simplicial set for kBET, JAX's for the rest: most of one method's time on small
    data) and the uncorrected result's PCA. Results are read one at a time: whole up to
    ``max_samples``, above it only the subsample's rows, the subsample drawn from the
    uncorrected result's sample table (:mod:`locusformer.scoring.result_rows`).
    """
    if set(results) != set(out_tsvs):
        raise InputError("--out", f"expected one per --result method: {', '.join(results)}")
    uncorrected = result_rows.open_result(uncorrected_h5ad, "uncorrected result")
    keep = subsample.scoring_subsample(uncorrected.obs, batch_key, label_key, max_samples, seed)
    # Above max_samples peak memory is then the subsample's rows, not the results' size.
    read = read_result if keep is None else result_rows.open_result
    if keep is None:  # read whole, as always
        uncorrected = read_result(uncorrected_h5ad, "uncorrected result")
    reference: dict = {}
    representations: dict = {}
    frames = {}
    for method, path in results.items():
        started = time.perf_counter()
        same = Path(path).resolve() == Path(uncorrected_h5ad).resolve()
        result = uncorrected if same else read(path)
        result.uns["method"] = method
        frames[method] = score_method(
            result,
            uncorrected,
            batch_key,
            label_key,
            seed=seed,
            reference=reference,
            samples=keep,
            kmeans_starts=kmeans_starts,
            representations=representations,
        )
        log.info("%s: scored in %.1f s", method, time.perf_counter() - started)
    if out_representations is not None:
        scored = uncorrected.obs_names if keep is None else keep
        write_representations(out_representations, representations, scored, seed)
    for method, df in frames.items():
        write_metrics(df, out_tsvs[method])
    return pd.concat(frames.values(), ignore_index=True)
