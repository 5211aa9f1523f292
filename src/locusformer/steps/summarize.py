"""``locusformer summarize``: one row per dataset and method, scores beside time and memory."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence

import pandas as pd

from locusformer.scoring.tables import (
    SUMMARY_COLUMNS,
    method_scores,
    read_benchmark,
    read_metrics,
    write_metrics,
)

log = logging.getLogger(__name__)


def summarize(
    dataset_metrics: Mapping[str, str | os.PathLike],
    benchmark_files: Mapping[tuple[str, str], str | os.PathLike | Sequence[str | os.PathLike]],
    out_tsv: str | os.PathLike,
) -> pd.DataFrame:
    """Write ``results/summary.tsv``: one row per (dataset, method).

    ``benchmark_files`` maps ``(dataset, method)`` to the Snakemake benchmark file(s) of the
    rule(s) that ran that method (a list is summed for time, maxed for memory); keys whose
    second element is not a method of the dataset (other rules) are ignored here.
    """
    rows = []
    for dataset, path in dataset_metrics.items():
        scores = method_scores(read_metrics(path))
        for rec in scores.to_dict("records"):
            bench = benchmark_files.get((dataset, rec["method"]))
            usage = (
                read_benchmark(bench)
                if bench is not None
                else {"wall_s": float("nan"), "max_rss_mb": float("nan")}
            )
            rows.append(
                {
                    "dataset": dataset,
                    **rec,
                    "wall_s": usage["wall_s"],
                    "max_rss_mb": usage["max_rss_mb"],
                }
            )
    df = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    if len(df):
        order = {name: i for i, name in enumerate(dataset_metrics)}
        df["_dataset"] = df["dataset"].map(order)
        df["_failed"] = df["status"].eq("failed")
        df["_total"] = df["total"].fillna(-math.inf)
        df = df.sort_values(
            ["_dataset", "_failed", "_total"], ascending=[True, True, False], kind="stable"
        ).drop(columns=["_dataset", "_failed", "_total"])
    write_metrics(df, out_tsv)
    return df.reset_index(drop=True)
