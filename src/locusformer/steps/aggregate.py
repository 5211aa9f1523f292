"""``locusformer aggregate-metrics``: the per-method metric tables of a dataset in one."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import pandas as pd

from locusformer.errors import InputError
from locusformer.scoring.tables import read_metrics, write_metrics

log = logging.getLogger(__name__)


def aggregate_metrics(
    tsv_paths: Sequence[str | os.PathLike], out_tsv: str | os.PathLike
) -> pd.DataFrame:
    """Concatenate per-method metric TSVs into a dataset's ``metrics.tsv``."""
    if not tsv_paths:
        raise InputError(out_tsv, "no metric tables to aggregate")
    frames = [read_metrics(p) for p in tsv_paths]
    df = pd.concat(frames, ignore_index=True)
    write_metrics(df, out_tsv)
    return df
