"""The metrics tables: their columns and names, reading and writing them, scores per method.

Apart from :mod:`locusformer.scoring.metrics`, which computes the values, so that the steps
that only read and write tables (``aggregate-metrics``, ``summarize``, ``index``, the
report's tables) import pandas alone, not anndata, scib-metrics or scikit-learn.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import pandas as pd

from locusformer.errors import InputError, one_line
from locusformer.io import atomic

BATCH_WEIGHT = 0.4
BIO_WEIGHT = 0.6
BIO_METRICS: tuple[str, ...] = (
    "Isolated labels",
    "KMeans NMI",
    "KMeans ARI",
    "Silhouette label",
    "cLISI",
)
NO_LABEL_BIO_METRICS: tuple[str, ...] = ("Within-batch kNN Jaccard",)
AGGREGATES: tuple[str, ...] = ("Batch correction", "Bio conservation", "Total")
COLUMNS: list[str] = ["method", "metric", "type", "value", "status", "error"]
SUMMARY_COLUMNS: list[str] = [
    "dataset",
    "method",
    "batch",
    "bio",
    "total",
    "status",
    "error",
    "wall_s",
    "max_rss_mb",
]


def write_metrics(df: pd.DataFrame, path: str | os.PathLike) -> None:
    atomic.write_text(path, df.to_csv(sep="\t", index=False, na_rep="NaN", lineterminator="\n"))


def read_metrics(path: str | os.PathLike) -> pd.DataFrame:
    """Read a long metrics TSV written by :func:`run_metrics` or :func:`aggregate_metrics`."""
    try:
        df = pd.read_csv(path, sep="\t", dtype={"error": str, "method": str, "metric": str})
    except Exception as exc:
        raise InputError(path, f"cannot read metrics: {one_line(exc)}") from exc
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise InputError(path, f"not a metrics table: missing column(s) {', '.join(missing)}")
    df["error"] = df["error"].fillna("")
    df["value"] = pd.to_numeric(df["value"], errors="coerce")
    return df[COLUMNS]


def wide_metrics(df: pd.DataFrame) -> pd.DataFrame:
    """methods x metrics table (metric order kept) from the long format."""
    order = list(dict.fromkeys(df["metric"]))
    wide = df.pivot_table(
        index="method", columns="metric", values="value", dropna=False, sort=False
    )
    return wide.reindex(columns=order)


def read_benchmark(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> dict[str, float]:
    """Wall time (s, summed over files; mean over repeats) and peak memory (max_rss, MB).

    Reads Snakemake ``benchmark:`` TSVs (columns s, h:m:s, max_rss, max_vms, ... cpu_time).
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    wall = 0.0
    rss = float("nan")
    cpu = 0.0
    any_wall = any_cpu = False
    for p in paths:
        try:
            df = pd.read_csv(p, sep="\t")
        except Exception as exc:
            raise InputError(p, f"cannot read benchmark file: {one_line(exc)}") from exc
        if "s" not in df.columns:
            raise InputError(p, "not a Snakemake benchmark file (no 's' column)")
        s = pd.to_numeric(df["s"], errors="coerce").mean()
        if np.isfinite(s):
            wall += float(s)
            any_wall = True
        if "max_rss" in df.columns:
            r = pd.to_numeric(df["max_rss"], errors="coerce").max()
            if np.isfinite(r):
                rss = float(r) if not np.isfinite(rss) else max(rss, float(r))
        if "cpu_time" in df.columns:
            c = pd.to_numeric(df["cpu_time"], errors="coerce").mean()
            if np.isfinite(c):
                cpu += float(c)
                any_cpu = True
    return {
        "wall_s": wall if any_wall else float("nan"),
        "max_rss_mb": rss,
        "cpu_time_s": cpu if any_cpu else float("nan"),
    }


def _value(df: pd.DataFrame, metric: str) -> float:
    v = df.loc[df["metric"] == metric, "value"]
    return float(v.iloc[0]) if len(v) else float("nan")


def method_scores(df: pd.DataFrame) -> pd.DataFrame:
    """One row per method: batch, bio, total, status, error (order of first appearance)."""
    rows = []
    for method, sub in df.groupby("method", sort=False):
        failed = sub["status"].eq("failed").any()
        err = sub.loc[sub["status"].eq("failed"), "error"]
        rows.append(
            {
                "method": method,
                "batch": _value(sub, "Batch correction"),
                "bio": _value(sub, "Bio conservation"),
                "total": _value(sub, "Total"),
                "status": "failed" if failed else "ok",
                "error": str(err.iloc[0]) if failed and len(err) else "",
            }
        )
    return pd.DataFrame(rows, columns=["method", "batch", "bio", "total", "status", "error"])
