"""``locusformer confounding``: the design check, how strongly the batch predicts the
biology, measured on the normalized matrix before anything is corrected.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
import pandas as pd

from locusformer.errors import InputError
from locusformer.io import atomic
from locusformer.scoring.confounding import MAX_PCA_SAMPLES, PathLike, _finite, assess

log = logging.getLogger(__name__)


def _subsample_rows(path: PathLike, wanted: int, seed: int) -> pd.DataFrame:
    """At most ``wanted`` rows of a matrix parquet, drawn at random (seeded), block by block."""
    from locusformer.io.parquet import iter_matrix_parquet, open_matrix_parquet

    handle, _ = open_matrix_parquet(path, "normalized matrix")
    n = handle.metadata.num_rows
    handle.close()
    keep = np.zeros(n, dtype=bool)
    keep[np.random.default_rng(seed).choice(n, size=min(n, wanted), replace=False)] = True
    blocks, start = [], 0
    for block in iter_matrix_parquet(path, "normalized matrix"):
        mask = keep[start : start + len(block)]
        if mask.any():
            blocks.append(block[mask].copy())
        start += len(block)
    return pd.concat(blocks)


def run_confounding(
    matrix_path: PathLike,
    samples_path: PathLike,
    batch_key: str,
    label_key: str | None,
    out_json: PathLike,
    seed: int = 0,
    max_samples: int = MAX_PCA_SAMPLES,
) -> dict[str, Any]:
    """Check a dataset's normalized files and write ``confounding.json``.

    The label statistics use every sample of ``samples.tsv``; the principal components a
    seeded subsample of at most ``max_samples`` rows of the matrix (the R² of a few
    thousand samples is already precise to about a hundredth).
    """
    from locusformer.io.samples import read_sample_table

    samples = read_sample_table(samples_path)
    for key in (batch_key, label_key):
        if key is not None and key not in samples.columns:
            raise InputError(samples_path, f"no column {key!r}")
    if samples[batch_key].isna().any():
        raise InputError(samples_path, f"column {batch_key!r} has missing values")
    if label_key is not None and samples[label_key].isna().any():
        n = int(samples[label_key].isna().sum())
        raise InputError(samples_path, f"column {label_key!r} has {n} missing values")
    if samples[batch_key].nunique() < 2:
        raise InputError(samples_path, f"column {batch_key!r} has fewer than two batches")
    matrix = _subsample_rows(matrix_path, max_samples, seed)
    missing = matrix.index.difference(samples.index)
    if len(missing):
        raise InputError(
            samples_path,
            f"{len(missing)} samples of {matrix_path} are missing, e.g. {missing[0]!r}",
        )
    values = matrix.to_numpy(dtype=np.float64)
    if not np.isfinite(values).all():
        raise InputError(matrix_path, "normalized matrix contains non-finite values")
    check = assess(
        samples[batch_key],
        samples[label_key] if label_key is not None else None,
        x=values,
        x_batches=samples.loc[matrix.index, batch_key],
        seed=seed,
    )
    check.update(batch_key=batch_key, label_key=label_key)
    atomic.write_text(out_json, json.dumps(_finite(check), indent=2) + "\n")
    log.info(
        "design %s (Cramér's V %s, batch R² of the top %d PCs %.3f)",
        check["level"],
        "–" if check["labels"] is None else f"{check['labels']['cramers_v']:.3f}",
        check["pca"]["n_pcs"],
        check["pca"]["weighted_r2"],
    )
    return check
