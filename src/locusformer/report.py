"""Self-contained HTML reports: one per dataset and an index over all datasets.

A report is ONE file: figures are PNGs embedded as base64 ``data:`` URIs, the CSS is inline
and there is no JavaScript, font or stylesheet to fetch, so it opens from disk (or as an
e-mail attachment) anywhere. Every user-provided name is escaped (jinja2 autoescape on; in
figures, matplotlib's mathtext ``$`` is escaped too).
"""

from __future__ import annotations

import base64
import importlib.metadata
import io
import json
import logging
import math
import os
import platform
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from locusformer import atomic
from locusformer.baselines import one_line, pca
from locusformer.errors import InputError

log = logging.getLogger(__name__)

TEMPLATES = Path(__file__).resolve().parent / "templates"
DPI = 100
#: embedding plots use UMAP from this many samples on, the first two PCs below it
UMAP_MIN_SAMPLES = 200
MAX_LEGEND = 20
MAX_HEADS = 8
VERSION_PACKAGES = (
    "locusformer",
    "torch",
    "numpy",
    "pandas",
    "scanpy",
    "anndata",
    "scib-metrics",
    "harmonypy",
    "snakemake",
    "scvi-tools",
    "jax",
    "scikit-learn",
    "matplotlib",
    "jinja2",
)

PathLike = str | os.PathLike
Paths = PathLike | Sequence[PathLike]


# --------------------------------------------------------------------------- helpers


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _mpl(text: object) -> str:
    """Text for matplotlib: no mathtext from user-provided ``$``."""
    return str(text).replace("$", r"\$")


def _png(fig) -> str:
    """A figure as a ``data:image/png;base64,...`` URI (and close it)."""
    plt = _plt()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _fmt(value: object, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value))
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(value)
    if not math.isfinite(v):
        return "–"
    return f"{v:.{digits}f}"


def _env():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["fmt"] = _fmt
    return env


def _render(template: str, out_html: PathLike, **context: Any) -> str:
    html = _env().get_template(template).render(**context)
    atomic.write_text(out_html, html)
    return html


def _chrom_key(chrom: str) -> tuple[int, int, str]:
    c = re.sub(r"^chr", "", str(chrom), flags=re.IGNORECASE)
    if c.isdigit():
        return (0, int(c), "")
    order = {"X": 1, "Y": 2, "M": 3, "MT": 3}
    return (1, order.get(c.upper(), 9), c)


def _categories(values: pd.Series) -> tuple[np.ndarray, list[str]]:
    cat = pd.Categorical(values.astype(str))
    return np.asarray(cat.codes), [str(c) for c in cat.categories]


def _read_table(path: PathLike, what: str) -> pd.DataFrame:
    try:
        return pd.read_csv(path, sep="\t")
    except Exception as exc:
        raise InputError(path, f"cannot read {what}: {one_line(exc)}") from exc


def software_versions() -> list[tuple[str, str]]:
    """(package, version) for Python and the packages in :data:`VERSION_PACKAGES` installed."""
    out = [("python", platform.python_version())]
    for name in VERSION_PACKAGES:
        try:
            out.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


# --------------------------------------------------------------------------- sections


def _summary_section(
    stats_json: PathLike | None, obs: pd.DataFrame | None, batch_key: str, label_key: str | None
) -> dict:
    section: dict[str, Any] = {
        "available": False,
        "stats": {},
        "per_batch": [],
        "per_label": [],
        "dropped": [],
        "crosstab": None,
    }
    if stats_json is not None:
        try:
            stats = json.loads(Path(stats_json).read_text(encoding="utf-8"))
        except Exception as exc:
            raise InputError(stats_json, f"cannot read dataset stats: {one_line(exc)}") from exc
        if not isinstance(stats, dict):
            raise InputError(stats_json, "dataset stats must be a JSON object")
        section["available"] = True
        section["stats"] = {
            "Samples": stats.get("n_samples"),
            "Genes in the input": stats.get("n_genes_input"),
            "Genes kept": stats.get("n_genes_kept"),
            "Value type": stats.get("value_type"),
        }
        section["per_batch"] = sorted((stats.get("samples_per_batch") or {}).items())
        section["per_label"] = sorted((stats.get("samples_per_label") or {}).items())
        section["dropped"] = list((stats.get("genes_dropped") or {}).items())
    if obs is not None and batch_key in obs.columns:
        section["available"] = True
        if not section["per_batch"]:
            section["per_batch"] = sorted(obs[batch_key].astype(str).value_counts().items())
        if label_key is not None and label_key in obs.columns:
            tab = pd.crosstab(obs[batch_key].astype(str), obs[label_key].astype(str))
            section["crosstab"] = {
                "labels": [str(c) for c in tab.columns],
                "rows": [
                    (str(b), [int(v) for v in row])
                    for b, row in zip(tab.index, tab.to_numpy(), strict=True)
                ],
            }
    return section


def _loci_section(loci_parquet: PathLike | None) -> dict:
    section: dict[str, Any] = {"available": False}
    if loci_parquet is None:
        return section
    try:
        loci = pd.read_parquet(loci_parquet)
    except Exception as exc:
        raise InputError(loci_parquet, f"cannot read loci: {one_line(exc)}") from exc
    if "chrom" not in loci.columns:
        raise InputError(loci_parquet, "no 'chrom' column")
    chrom = loci["chrom"].fillna("").astype(str)
    placed = loci["placed"].astype(bool) if "placed" in loci.columns else chrom.ne("")
    counts = chrom[placed].value_counts()
    order = sorted(counts.index, key=_chrom_key)
    counts = counts.reindex(order)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(4.0, 0.28 * len(order) + 1.5), 2.8))
    ax.bar(range(len(order)), counts.to_numpy(), color="#4c72b0")
    ax.set_xticks(range(len(order)))
    long_names = any(len(str(c)) > 3 for c in order) or len(order) > 12
    ax.set_xticklabels([_mpl(c) for c in order], rotation=90 if long_names else 0, fontsize=7)
    ax.set_ylabel("loci")
    ax.set_title("Placed loci per chromosome", fontsize=10)
    section.update(
        available=True,
        n_loci=len(loci),
        n_placed=int(placed.sum()),
        share_placed=float(placed.mean()) if len(loci) else float("nan"),
        n_chrom=len(order),
        figure=_png(fig),
    )
    return section


def _history_section(history_tsv: PathLike | None) -> dict:
    section: dict[str, Any] = {"available": False}
    if history_tsv is None:
        return section
    hist = _read_table(history_tsv, "training history")
    numeric = hist.apply(pd.to_numeric, errors="coerce")
    x = numeric["epoch"] if "epoch" in numeric.columns else pd.Series(np.arange(len(hist)))
    cols = [c for c in numeric.columns if c != "epoch" and numeric[c].notna().any()]
    lr = [c for c in cols if c.lower() in ("lr", "learning_rate") or c.lower().startswith("lr_")]
    acc = [c for c in cols if "acc" in c.lower() and c not in lr]
    # Schedules and timings are not losses: they get their own panel.
    schedule = [c for c in cols if c.lower().endswith("_weight") or c.lower() == "seconds"]
    loss = [c for c in cols if c not in lr and c not in acc and c not in schedule]
    panels = [
        (title, c)
        for title, c in (
            ("losses", loss),
            ("accuracy", acc),
            ("learning rate", lr),
            ("schedule and epoch time", schedule),
        )
        if c
    ]
    if not panels or len(hist) == 0:
        section["message"] = "the training history has no numeric columns"
        return section
    plt = _plt()
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.0), squeeze=False)
    for ax, (title, columns) in zip(axes[0], panels, strict=True):
        for c in columns:
            ax.plot(x, numeric[c], marker="." if len(hist) < 30 else None, label=_mpl(c))
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(title, fontsize=10)
        if title == "learning rate" and (numeric[columns] > 0).all().all():
            ax.set_yscale("log")
        ax.legend(fontsize=7)
    fig.tight_layout()
    section.update(available=True, figure=_png(fig), columns=cols, n_epochs=len(hist))
    return section


def _embedding_coords(result, seed: int, mode: str) -> tuple[np.ndarray, str]:
    from locusformer.metrics import scoring_representation

    rep = scoring_representation(result, seed)
    n = rep.shape[0]
    use_umap = mode == "umap" or (mode == "auto" and n >= UMAP_MIN_SAMPLES)
    if use_umap and n > 3:
        import anndata as ad
        import scanpy as sc

        tmp = ad.AnnData(X=np.zeros((n, 1), dtype=np.float32))
        tmp.obsm["X_rep"] = rep
        sc.pp.neighbors(tmp, n_neighbors=min(15, n - 1), use_rep="X_rep", random_state=seed)
        sc.tl.umap(tmp, random_state=seed)
        return np.asarray(tmp.obsm["X_umap"]), "UMAP"
    if rep.shape[1] <= 2:
        coords = rep if rep.shape[1] == 2 else np.column_stack([rep[:, 0], np.zeros(n)])
        return coords, "dim"
    return pca(rep, 2, seed), "PC"


def _scatter_panel(ax, coords: np.ndarray, values: pd.Series, title: str, axis: str) -> None:
    codes, cats = _categories(values)
    plt = _plt()
    cmap = plt.get_cmap("tab10" if len(cats) <= 10 else "tab20")
    size = max(4, min(30, 3000 / max(1, len(codes))))
    for i, cat in enumerate(cats):
        m = codes == i
        ax.scatter(
            coords[m, 0],
            coords[m, 1],
            s=size,
            color=cmap(i % cmap.N),
            label=_mpl(cat) if i < MAX_LEGEND else None,
            linewidths=0,
        )
    if len(cats) > MAX_LEGEND:
        ax.plot([], [], " ", label=f"… {len(cats) - MAX_LEGEND} more")
    ax.legend(
        fontsize=7, markerscale=1.5, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False
    )
    ax.set_title(_mpl(title), fontsize=9)
    ax.set_xlabel(f"{axis}1", fontsize=8)
    ax.set_ylabel(f"{axis}2", fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])


def _embedding_section(
    integrated: Mapping[str, PathLike], batch_key: str, label_key: str | None, seed: int, mode: str
) -> tuple[dict, Any]:
    from locusformer.metrics import read_result

    plots = []
    names: dict[str, str] = {}
    obs = None
    methods = sorted(integrated, key=lambda m: (m != "uncorrected",))
    plt = _plt()
    for method in methods:
        result = read_result(integrated[method])
        if result.uns.get("display_name"):  # combat_mod: says which labels it kept
            names[method] = str(result.uns["display_name"])
        if method == "uncorrected" or obs is None:
            obs = result.obs
        status = str(result.uns.get("status", "ok"))
        if status != "ok":
            plots.append(
                {"method": method, "failed": True, "error": str(result.uns.get("error", "failed"))}
            )
            continue
        try:
            coords, axis = _embedding_coords(result, seed, mode)
        except Exception as exc:
            plots.append(
                {"method": method, "failed": True, "error": f"cannot plot: {one_line(exc)}"}
            )
            continue
        keys = [batch_key] + ([label_key] if label_key and label_key in result.obs else [])
        fig, axes = plt.subplots(1, len(keys), figsize=(4.4 * len(keys), 3.4), squeeze=False)
        for ax, key in zip(axes[0], keys, strict=True):
            _scatter_panel(ax, coords, result.obs[key], f"{method}: {key}", axis)
        fig.tight_layout()
        plots.append(
            {
                "method": method,
                "failed": False,
                "figure": _png(fig),
                "axis": "UMAP" if axis == "UMAP" else "PCA",
            }
        )
    return {"available": bool(plots), "plots": plots, "names": names}, obs


def verdict(scores: pd.DataFrame) -> dict | None:
    """Which method a dataset's scores crown, and the sentence that says so.

    ``scores`` has one row per method with ``method``, ``total`` and ``status``. A
    correction is crowned only when its total is above that of ``uncorrected``: a method
    that scores below leaving the data as they are is never called the best, and when no
    correction beats the uncorrected data the verdict says that leaving them uncorrected
    scored best (a tie goes to the uncorrected data too: correcting gained nothing). This
    matters most in a confounded design, where a correction can remove biology. None
    when no method has a total.
    """
    ok = scores[(scores["status"] == "ok") & np.isfinite(scores["total"].astype(float))]
    if ok.empty:
        return None
    totals = ok.set_index(ok["method"].astype(str))["total"].astype(float)
    totals = totals[~totals.index.duplicated()]
    uncorrected = totals.get("uncorrected")
    corrections = totals.drop("uncorrected", errors="ignore")
    best = str(corrections.idxmax()) if len(corrections) else None
    best_total = float(corrections.max()) if len(corrections) else None
    out = {
        "uncorrected_total": None if uncorrected is None else float(uncorrected),
        "best_correction": best,
        "best_correction_total": best_total,
    }
    if uncorrected is None:
        sentence = (
            f"{best} scored best (total {best_total:.3f}); the uncorrected data have no total."
        )
        return {**out, "crowned": best, "uncorrected_best": False, "sentence": sentence}
    if best is None or best_total <= uncorrected + 1e-12:
        sentence = f"Leaving the data uncorrected scored best (total {uncorrected:.3f})"
        sentence += (
            f"; the best correction, {best}, scored {best_total:.3f}."
            if best is not None
            else ": no correction has a score."
        )
        return {**out, "crowned": "uncorrected", "uncorrected_best": True, "sentence": sentence}
    sentence = f"{best} scored best (total {best_total:.3f}; uncorrected {uncorrected:.3f})."
    return {**out, "crowned": best, "uncorrected_best": False, "sentence": sentence}


def _confounding_section(confounding_json: PathLike | None) -> dict:
    from locusformer.confounding import read_confounding

    if confounding_json is None:
        return {"available": False}
    check = read_confounding(confounding_json)
    pcs = check.get("pca") or {}
    per = pcs.get("r2_per_pc") or []
    var = pcs.get("variance_per_pc") or []
    total_var = sum(v for v in var if v is not None)
    pc_rows = [
        {
            "pc": i + 1,
            "r2": r2,
            "share": (v / total_var) if v is not None and total_var > 0 else None,
        }
        for i, (r2, v) in enumerate(zip(per, var, strict=False))
    ][:10]
    return {
        "available": True,
        "level": check["level"],
        "reasons": [str(r) for r in check.get("reasons", [])],
        "sentences": [str(r) for r in check.get("sentences", [])],
        "labels": check.get("labels"),
        "pca": pcs,
        "pc_rows": pc_rows,
        "batch_dominated": bool(check.get("batch_dominated")),
        "thresholds": check.get("thresholds") or {},
    }


def _metrics_section(metrics_tsv: PathLike | None, names: Mapping[str, str] | None = None) -> dict:
    from locusformer.metrics import method_scores, read_metrics, wide_metrics

    # method -> how the table shows it, so that a method that used labels says so
    names = dict(names or {})

    section: dict[str, Any] = {"available": False}
    if metrics_tsv is None:
        return section
    long = read_metrics(metrics_tsv)
    if long.empty:
        section["message"] = "the metrics table is empty"
        return section
    wide = wide_metrics(long)
    types = dict(zip(long["metric"], long["type"], strict=False))
    scores = method_scores(long).set_index("method")
    ok = scores.index[scores["status"] == "ok"]
    failed = scores.index[scores["status"] != "ok"]
    ranked = list(scores.loc[ok].sort_values("total", ascending=False, na_position="last").index)
    best = {
        m: (wide.loc[ok, m].max() if len(ok) and wide.loc[ok, m].notna().any() else None)
        for m in wide.columns
    }
    columns = [{"name": m, "type": types.get(m, "")} for m in wide.columns]
    rows = []
    for rank, method in enumerate(ranked, start=1):
        cells = []
        for m in wide.columns:
            v = wide.loc[method, m]
            is_best = best[m] is not None and np.isfinite(v) and v >= best[m] - 1e-12
            cells.append({"value": v, "best": bool(is_best)})
        rows.append(
            {
                "rank": rank,
                "method": names.get(method, method),
                "cells": cells,
                "failed": False,
                "error": "",
            }
        )
    for method in failed:
        rows.append(
            {
                "rank": None,
                "method": names.get(method, method),
                "cells": [],
                "failed": True,
                "error": scores.loc[method, "error"],
            }
        )
    metric_errors = [
        (r.method, r.metric, r.error)
        for r in long.itertuples()
        if r.status == "ok" and isinstance(r.error, str) and r.error
    ]
    # batch vs bio scatter
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.6, 3.8))
    pts = scores.loc[ok, ["batch", "bio"]].dropna()
    ax.scatter(pts["batch"], pts["bio"], s=40, color="#dd8452", zorder=3)
    for method, (bx, by) in pts.iterrows():
        label = _mpl(names.get(method, method))
        ax.annotate(label, (bx, by), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel("batch correction score")
    ax.set_ylabel("bio conservation score")
    lo = min([0.0, *pts["batch"], *pts["bio"]]) if len(pts) else 0.0
    ax.set_xlim(lo - 0.02, 1.02)
    ax.set_ylim(lo - 0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title("Batch correction vs bio conservation", fontsize=10)
    section.update(
        available=True,
        columns=columns,
        rows=rows,
        verdict=verdict(scores.reset_index()),
        scatter=_png(fig),
        metric_errors=metric_errors,
        n_failed=len(failed),
    )
    return section


def _attention_section(attention_npz: PathLike | None) -> dict:
    section: dict[str, Any] = {"available": False}
    if attention_npz is None:
        return section
    try:
        with np.load(attention_npz, allow_pickle=False) as npz:
            att = np.asarray(npz["attention"], dtype=np.float64)
            chrom = np.asarray(npz["token_chrom"]).astype(str)
    except KeyError as exc:
        raise InputError(
            attention_npz, f"no array {exc} (need 'attention' and 'token_chrom')"
        ) from exc
    except Exception as exc:
        raise InputError(attention_npz, f"cannot read attention maps: {one_line(exc)}") from exc
    if att.ndim == 3:
        att = att[None]
    if att.ndim != 4 or att.shape[-1] != att.shape[-2]:
        raise InputError(attention_npz, f"attention must be (layers, heads, T, T), got {att.shape}")
    t = att.shape[-1]
    if chrom.shape != (t,):
        raise InputError(attention_npz, f"token_chrom has {chrom.size} entries for {t} tokens")
    mean = np.nanmean(att, axis=0)  # heads x T x T, averaged over layers
    n_heads = mean.shape[0]
    shown = min(n_heads, MAX_HEADS)
    ncols = min(4, shown)
    nrows = math.ceil(shown / ncols)
    bounds = [i for i in range(1, t) if chrom[i] != chrom[i - 1]]
    starts = [0, *bounds]
    ends = [*bounds, t]
    mids = [(s + e) / 2 - 0.5 for s, e in zip(starts, ends, strict=True)]
    names = [chrom[s] for s in starts]
    plt = _plt()
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.4 * ncols, 3.2 * nrows), squeeze=False)
    for h in range(nrows * ncols):
        ax = axes[h // ncols][h % ncols]
        if h >= shown:
            ax.axis("off")
            continue
        im = ax.imshow(mean[h], cmap="viridis", interpolation="nearest", aspect="equal")
        for b in bounds:
            ax.axhline(b - 0.5, color="white", lw=0.6)
            ax.axvline(b - 0.5, color="white", lw=0.6)
        if len(names) <= 30:
            ax.set_xticks(mids)
            ax.set_xticklabels([_mpl(n) for n in names], rotation=90, fontsize=6)
            ax.set_yticks(mids)
            ax.set_yticklabels([_mpl(n) for n in names], fontsize=6)
        else:
            ax.set_xticks([])
            ax.set_yticks([])
        ax.set_title(f"head {h + 1}", fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
    fig.suptitle("Mean attention between locus patches (over layers)", fontsize=10)
    fig.tight_layout()
    section.update(
        available=True,
        figure=_png(fig),
        n_layers=att.shape[0],
        n_heads=n_heads,
        n_shown=shown,
        n_tokens=t,
        n_chrom=len(starts),
    )
    return section


def _runtime_section(benchmark_files: Mapping[str, Paths] | None) -> dict:
    from locusformer.metrics import read_benchmark

    section: dict[str, Any] = {"available": False, "rows": []}
    if not benchmark_files:
        return section
    rows = []
    for rule, paths in benchmark_files.items():
        usage = read_benchmark(paths)
        rows.append({"rule": str(rule), **usage})
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(8.4, max(2.2, 0.32 * len(rows) + 1.0)))
    names = [_mpl(r["rule"]) for r in rows]
    y = np.arange(len(rows))
    axes[0].barh(y, [np.nan_to_num(r["wall_s"]) for r in rows], color="#4c72b0")
    axes[0].set_xlabel("wall time (s)")
    axes[1].barh(y, [np.nan_to_num(r["max_rss_mb"]) for r in rows], color="#55a868")
    axes[1].set_xlabel("peak memory, max RSS (MB)")
    for ax in axes:
        ax.set_yticks(y)
        ax.set_yticklabels(names, fontsize=7)
        ax.invert_yaxis()
    axes[1].set_yticklabels([])
    fig.tight_layout()
    section.update(available=True, rows=rows, figure=_png(fig))
    return section


# --------------------------------------------------------------------------- public API


def render_dataset_report(
    out_html: PathLike,
    *,
    dataset: str,
    metrics_tsv: PathLike | None = None,
    stats_json: PathLike | None = None,
    loci_parquet: PathLike | None = None,
    history_tsv: PathLike | None = None,
    integrated: Mapping[str, PathLike] | None = None,
    attention_npz: PathLike | None = None,
    benchmark_files: Mapping[str, Paths] | None = None,
    confounding_json: PathLike | None = None,
    config: Mapping[str, Any] | None = None,
    seed: int | None = None,
    batch_key: str = "batch",
    label_key: str | None = None,
    embedding: str = "auto",
    figures_dir: PathLike | None = None,
) -> str:
    """Write ``results/{dataset}/report.html`` (one self-contained file); return the HTML.

    With ``figures_dir``, every figure is also written there as a PNG file (for
    ``snakemake --report``).

    Every input is optional; a section without its input says so. ``integrated`` maps
    method -> integration result h5ad (``uncorrected`` is shown first);
    ``benchmark_files`` maps rule -> Snakemake benchmark TSV(s); ``confounding_json`` is
    the design check of :mod:`locusformer.confounding` (a confounded design is stated at
    the top of the report); ``embedding`` is
    ``"auto"`` (UMAP from :data:`UMAP_MIN_SAMPLES` samples on, else PCA), ``"umap"`` or
    ``"pca"``.
    """
    import yaml

    if embedding not in ("auto", "umap", "pca"):
        raise ValueError(f"embedding must be 'auto', 'umap' or 'pca', not {embedding!r}")
    plot_seed = 0 if seed is None else int(seed)
    emb_section, obs = (
        _embedding_section(integrated, batch_key, label_key, plot_seed, embedding)
        if integrated
        else ({"available": False, "plots": []}, None)
    )
    config_text = (
        yaml.safe_dump(json.loads(json.dumps(dict(config), default=str)), sort_keys=False)
        if config
        else ""
    )
    sections = {
        "summary": _summary_section(stats_json, obs, batch_key, label_key),
        "confounding": _confounding_section(confounding_json),
        "loci": _loci_section(loci_parquet),
        "history": _history_section(history_tsv),
        "embeddings": emb_section,
        "metrics": _metrics_section(metrics_tsv, emb_section.get("names")),
        "attention": _attention_section(attention_npz),
        "runtime": _runtime_section(benchmark_files),
    }
    if figures_dir is not None:
        _write_figures(sections, Path(figures_dir))
    return _render(
        "report.html",
        out_html,
        dataset=str(dataset),
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        batch_key=batch_key,
        label_key=label_key,
        **sections,
        config_text=config_text,
        seed=seed,
        versions=software_versions(),
    )


def _write_figures(sections: Mapping[str, dict], figures_dir: Path) -> None:
    """Decode the report's figures into ``figures_dir`` as numbered, named PNG files."""
    figures = [
        ("loci", sections["loci"].get("figure")),
        ("training", sections["history"].get("figure")),
        *(
            (f"embedding_{plot['method']}", plot.get("figure"))
            for plot in sections["embeddings"].get("plots", [])
        ),
        ("scores", sections["metrics"].get("scatter")),
        ("attention", sections["attention"].get("figure")),
        ("runtime", sections["runtime"].get("figure")),
    ]
    figures_dir.mkdir(parents=True, exist_ok=True)
    for number, (name, uri) in enumerate(figures, start=1):
        if uri:
            data = base64.b64decode(uri.split(",", 1)[1])
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
            with atomic.atomic_path(figures_dir / f"{number:02d}_{safe}.png") as tmp:
                tmp.write_bytes(data)


def _design_summary(check: Mapping[str, Any]) -> dict:
    labels = check.get("labels") or {}
    pcs = check.get("pca") or {}
    return {
        "level": check["level"],
        "cramers_v": labels.get("cramers_v"),
        "share_labels_one_batch": labels.get("share_labels_one_batch"),
        "weighted_r2": pcs.get("weighted_r2"),
        "n_pcs": pcs.get("n_pcs"),
        "batch_dominated": bool(check.get("batch_dominated")),
        "reasons": [str(r) for r in check.get("reasons", [])],
    }


def _href(path: PathLike) -> str:
    href = str(path).replace(os.sep, "/")
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", href) or href.startswith("//"):
        raise ValueError(f"report links must be relative paths, got {href!r}")
    return urllib.parse.quote(href, safe="/")


def render_index(
    summary_tsv: PathLike,
    report_links: Mapping[str, PathLike],
    out_html: PathLike,
    confounding: Mapping[str, PathLike] | None = None,
) -> str:
    """Write ``results/index.html``: links to every dataset report and the summary table.

    Per dataset, the method :func:`verdict` crowns is marked (never a correction scoring
    below the uncorrected data) and said in words; ``confounding`` maps dataset -> its
    design check (:mod:`locusformer.confounding`), shown beside the dataset.
    """
    from locusformer.confounding import read_confounding

    designs = {str(k): read_confounding(v) for k, v in (confounding or {}).items()}
    summary = _read_table(summary_tsv, "summary")
    needed = ["dataset", "method", "batch", "bio", "total", "status"]
    missing = [c for c in needed if c not in summary.columns]
    if missing:
        raise InputError(summary_tsv, f"not a summary table: missing {', '.join(missing)}")
    summary["dataset"] = summary["dataset"].astype(str)
    summary["method"] = summary["method"].astype(str)
    summary["error"] = summary["error"].fillna("").astype(str) if "error" in summary else ""
    for col in ("wall_s", "max_rss_mb"):
        if col not in summary.columns:
            summary[col] = np.nan
    links = {str(k): _href(v) for k, v in report_links.items()}
    datasets = list(dict.fromkeys([*links, *summary["dataset"]]))
    groups = []
    for ds in datasets:
        sub = summary[summary["dataset"] == ds]
        crowned = verdict(sub)
        rows = [
            {
                **rec,
                "best": crowned is not None
                and rec["status"] == "ok"
                and rec["method"] == crowned["crowned"],
            }
            for rec in sub.to_dict("records")
        ]
        design = designs.get(ds)
        groups.append(
            {
                "dataset": ds,
                "href": links.get(ds),
                "rows": rows,
                "verdict": crowned,
                "design": None if design is None else _design_summary(design),
            }
        )
    return _render(
        "index.html",
        out_html,
        groups=groups,
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        versions=software_versions(),
    )
