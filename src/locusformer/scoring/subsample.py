"""A seeded subsample of samples, stratified by batch and label, to score atlas-sized data.

The scIB metrics (:mod:`locusformer.scoring.metrics`) do not finish on a million samples: the
silhouettes are quadratic in the number of samples and kBET, LISI and the k-means runs
grow with it too. Above ``metrics.max_samples`` every method of a dataset is scored on the
same subsample, drawn here from the uncorrected result's samples:

* strata are the (batch, label) combinations, or the batches without a label column;
* each stratum keeps its proportional share ``max_samples * size / n``, rounded by largest
  remainder (so the total is exactly ``max_samples``), and at least one sample where there
  are no more strata than ``max_samples`` (taken from the strata most above their share);
* the samples of a stratum are drawn without replacement by ``numpy.random.default_rng``
  seeded with the run's seed, the strata in sorted order: the same data and seed give the
  same subsample.

Each method's metrics table then ends with the :data:`SUBSAMPLE_METRICS` rows (samples
scored, samples in all, the seed), from which the report says what was scored.
pandas and numpy only: nothing here imports scib-metrics or anndata.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Sequence

import numpy as np
import pandas as pd

from locusformer.errors import InputError
from locusformer.scoring.tables import COLUMNS

log = logging.getLogger(__name__)

#: ``metrics.max_samples``'s default, as in the config schema and ``--max-samples``
DEFAULT_MAX_SAMPLES = 50_000
#: the metrics need two samples at least (a kNN graph, a PCA)
MIN_MAX_SAMPLES = 2
#: rows (type ``subsample``) after the aggregates of a method scored on a subsample
SUBSAMPLE_METRICS: tuple[str, ...] = ("Samples scored", "Samples total", "Subsample seed")


def check_max_samples(value: object, source: str = "max_samples") -> int:
    """``value`` as an integer >= :data:`MIN_MAX_SAMPLES`; :class:`InputError` otherwise.

    Takes the string of a command-line flag too, so that ``--max-samples 1.5`` is refused
    in one line naming the flag rather than by argparse's usage message.
    """
    number: int | None = None
    if isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            number = None
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
        number = int(value)
    if number is None or number < MIN_MAX_SAMPLES:
        raise InputError(source, f"expected an integer >= {MIN_MAX_SAMPLES}, got {value!r}")
    return number


def allocate(sizes: Sequence[int] | np.ndarray, n: int) -> np.ndarray:
    """How many samples each stratum of ``sizes`` keeps in a subsample of ``n``.

    Proportional shares rounded by largest remainder (ties to the earlier stratum), then
    every empty stratum given one sample, taken from the stratum that is most above its
    share, when there are no more strata than ``n``. All kept when ``n >= sum(sizes)``.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    total = int(sizes.sum())
    if n >= total:
        return sizes.copy()
    # Integer arithmetic: the shares n * size / total are compared exactly, no float ties.
    scaled = n * sizes
    alloc = scaled // total
    remainder = scaled % total
    short = n - int(alloc.sum())  # fewer than the number of strata
    alloc[np.argsort(-remainder, kind="stable")[:short]] += 1
    if len(sizes) <= n:
        for empty in np.flatnonzero(alloc == 0):
            # excess over the share, times total: the stratum that gives one up loses least
            excess = np.where(alloc > 1, alloc * total - scaled, np.iinfo(np.int64).min)
            alloc[int(np.argmax(excess))] -= 1
            alloc[empty] = 1
    return alloc


def stratified_subsample(strata: Sequence | np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """Positions (ascending) of a seeded subsample of ``n`` samples stratified by ``strata``.

    ``strata`` holds one hashable key per sample; :func:`allocate` decides each stratum's
    count. All positions when ``n >= len(strata)``.
    """
    codes, keys = pd.factorize(pd.Series(strata), sort=True)
    if n >= len(codes):
        return np.arange(len(codes))
    sizes = np.bincount(codes, minlength=len(keys))
    alloc = allocate(sizes, n)
    # One stable sort groups the positions of each stratum in ascending order; scanning
    # the codes once per stratum would be quadratic on atlases with thousands of strata.
    order = np.argsort(codes, kind="stable")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rng = np.random.default_rng(seed)
    picked = [
        order[start + rng.choice(size, size=count, replace=False)]
        for start, size, count in zip(starts, sizes, alloc, strict=True)
        if count
    ]
    return np.sort(np.concatenate(picked))


def scoring_strata(obs: pd.DataFrame, batch_key: str, label_key: str | None) -> pd.Series:
    """Each sample's stratum: ``batch`` or ``(batch, label)`` joined into one string key."""
    if batch_key not in obs.columns:
        raise InputError("uncorrected result", f"no batch column {batch_key!r} in obs")
    strata = obs[batch_key].astype(str)
    if label_key is not None and label_key in obs.columns:
        # a separator no column value is likely to hold, so (a_b, c) and (a, b_c) differ
        strata = strata + "\x1f" + obs[label_key].astype(str)
    return strata


def scoring_subsample(
    obs: pd.DataFrame,
    batch_key: str,
    label_key: str | None,
    max_samples: int,
    seed: int = 0,
) -> pd.Index | None:
    """The obs names (in ``obs``'s order) every method is scored on; ``None`` for all.

    ``obs`` is the uncorrected result's; strata are (batch, label) when ``label_key`` is a
    column of it, else the batch. A missing label column is left for the scoring to refuse.
    """
    max_samples = check_max_samples(max_samples)
    if len(obs) <= max_samples:
        return None
    strata = scoring_strata(obs, batch_key, label_key)
    picked = obs.index[stratified_subsample(strata.to_numpy(), max_samples, seed)]
    log.info("scoring a stratified subsample of %d of %d samples", len(picked), len(obs))
    return picked


def subsample_mask(obs_names: pd.Index, samples: pd.Index, method: str) -> np.ndarray:
    """Which of a result's rows (``obs_names``, in its own order) are in ``samples``."""
    keep = obs_names.isin(samples)
    if int(keep.sum()) != len(samples):
        raise InputError("integration result", f"{method!r} lacks samples of the subsample")
    return keep


def with_subsample_rows(
    df: pd.DataFrame, samples: pd.Index | None, n_total: int, seed: int
) -> pd.DataFrame:
    """A metrics table with the :data:`SUBSAMPLE_METRICS` rows after it.

    Unchanged without a subsample, and for a failed method (nothing of it was scored).
    """
    if samples is None or df.empty or not df["status"].eq("ok").all():
        return df
    method = str(df["method"].iloc[0])
    counts = (len(samples), n_total, seed)
    rows = [
        (method, name, "subsample", float(value), "ok", "")
        for name, value in zip(SUBSAMPLE_METRICS, counts, strict=True)
    ]
    return pd.concat([df, pd.DataFrame(rows, columns=COLUMNS)[df.columns]], ignore_index=True)
