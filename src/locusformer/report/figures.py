"""The reports' figures: matplotlib drawings returned as PNG ``data:`` URIs.

Each function takes what :mod:`locusformer.report.sections` assembled and returns one
figure, embedded in the HTML so that a report stays one file. Every user-provided name
drawn is passed through :func:`_mpl`, so a ``$`` in a batch or label never turns into
matplotlib mathtext.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

DPI = 100
MAX_LEGEND = 20


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


def _categories(values: pd.Series) -> tuple[np.ndarray, list[str]]:
    """Codes and names of ``values``' categories: its own when categorical (so that panels
    of several methods given the same categories colour them alike), else sorted."""
    if isinstance(values.dtype, pd.CategoricalDtype):
        return np.asarray(values.cat.codes), [str(c) for c in values.cat.categories]
    cat = pd.Categorical(values.astype(str))
    return np.asarray(cat.codes), [str(c) for c in cat.categories]


def loci_figure(order: Sequence[str], counts: pd.Series) -> str:
    """Bars of the placed loci per chromosome, in ``order`` (``counts`` indexed alike)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(4.0, 0.28 * len(order) + 1.5), 2.8))
    ax.bar(range(len(order)), counts.to_numpy(), color="#4c72b0")
    ax.set_xticks(range(len(order)))
    long_names = any(len(str(c)) > 3 for c in order) or len(order) > 12
    ax.set_xticklabels([_mpl(c) for c in order], rotation=90 if long_names else 0, fontsize=7)
    ax.set_ylabel("loci")
    ax.set_title("Placed loci per chromosome", fontsize=10)
    return _png(fig)


def history_figure(
    x: pd.Series, numeric: pd.DataFrame, panels: Sequence[tuple[str, list[str]]]
) -> str:
    """One panel per (title, columns) of the training history, against the epoch ``x``."""
    plt = _plt()
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.0), squeeze=False)
    for ax, (title, columns) in zip(axes[0], panels, strict=True):
        for c in columns:
            ax.plot(x, numeric[c], marker="." if len(numeric) < 30 else None, label=_mpl(c))
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(title, fontsize=10)
        if title == "learning rate" and (numeric[columns] > 0).all().all():
            ax.set_yscale("log")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)


def _colours(n: int):
    plt = _plt()
    return plt.get_cmap("tab10" if n <= 10 else "tab20")


def _scatter_panel(ax, coords: np.ndarray, values: pd.Series, title: str) -> None:
    codes, cats = _categories(values)
    cmap = _colours(len(cats))
    size = max(3, min(24, 2400 / max(1, len(codes))))
    for i in range(len(cats)):
        m = codes == i
        ax.scatter(coords[m, 0], coords[m, 1], s=size, color=cmap(i % cmap.N), linewidths=0)
    ax.set_title(_mpl(title), fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])


def embedding_figure(
    coords: np.ndarray, obs: pd.DataFrame, keys: Sequence[str], method: str, axis: str
) -> str:
    """One method's 2-d embedding, one small panel per column of ``obs`` in ``keys``, stacked.

    ``axis`` names the coordinates (``UMAP``, ``PC`` or ``dim``); ``method`` is not
    drawn (the report names it above the figure). The panels stand one above the other
    and carry no legend, so that the report sets several methods side by side and explains
    the colours once (:func:`legend_figure`): give ``obs``' columns the same categorical
    categories for every method, and a category has the same colour in each.
    """
    plt = _plt()
    fig, axes = plt.subplots(len(keys), 1, figsize=(2.6, 2.45 * len(keys)), squeeze=False)
    for ax, key in zip(axes[:, 0], keys, strict=True):
        _scatter_panel(ax, coords, obs[key], f"{key} ({axis}1, {axis}2)")
    fig.tight_layout()
    return _png(fig)


def legend_figure(categories: Mapping[str, Sequence[str]]) -> str:
    """The colours of the embedding panels, once for every method: one key per row.

    ``categories`` maps a key (batch, label) to its categories in the panels' order.
    """
    plt = _plt()
    from matplotlib.lines import Line2D

    ncol = 6
    heights = [0.3 + 0.22 * -(-min(len(c), MAX_LEGEND + 1) // ncol) for c in categories.values()]
    fig, axes = plt.subplots(
        len(categories), 1, figsize=(9.0, sum(heights)), squeeze=False, height_ratios=heights
    )
    for ax, (key, cats) in zip(axes[:, 0], categories.items(), strict=True):
        cmap = _colours(len(cats))
        handles = [
            Line2D([], [], marker="o", linestyle="", color=cmap(i % cmap.N), label=_mpl(cat))
            for i, cat in enumerate(cats[:MAX_LEGEND])
        ]
        if len(cats) > MAX_LEGEND:
            handles.append(Line2D([], [], linestyle="", label=f"… {len(cats) - MAX_LEGEND} more"))
        ax.axis("off")
        ax.legend(
            handles=handles,
            title=_mpl(key),
            title_fontsize=8,
            fontsize=8,
            ncol=ncol,
            loc="upper left",
            frameon=False,
            alignment="left",
        )
    return _png(fig)


#: One marker per method in the scores' scatter, with its colour: no two methods alike.
MARKERS = ("o", "s", "D", "^", "v", "P", "X", "<", ">", "h")


def _fitted_limits(values: np.ndarray) -> tuple[float, float]:
    """Axis limits around ``values`` with a margin: a tenth of their range, at least 0.02."""
    lo, hi = float(np.min(values)), float(np.max(values))
    pad = max(0.1 * (hi - lo), 0.02)
    return lo - pad, hi + pad


def scores_figure(pts: pd.DataFrame, names: Mapping[str, str]) -> str:
    """Batch correction against bio conservation score, one point per method.

    ``pts`` is indexed by method with ``batch`` and ``bio``, in the order the legend
    lists them; ``names`` gives a method's display name (a method missing from it is shown
    by its key). Each method has its own colour and marker and is named in the legend
    (labels beside close points would overlap); the axes are fitted to the points, and
    dotted lines mark the uncorrected data's scores: a point below the horizontal one kept
    less biology than no correction.
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    # tab20's dark colours, then its light ones, without the greys: grey is the uncorrected
    tab20 = plt.get_cmap("tab20").colors
    palette = [c for i, c in enumerate(tab20[0::2] + tab20[1::2]) if i not in (7, 17)]
    corrections = 0
    for method, (bx, by) in pts.iterrows():
        uncorrected = method == "uncorrected"
        i = corrections
        corrections += not uncorrected
        ax.scatter(
            bx,
            by,
            s=150 if uncorrected else 60,
            color="#555555" if uncorrected else palette[i % len(palette)],
            marker="*" if uncorrected else MARKERS[i % len(MARKERS)],
            edgecolors="white",
            linewidths=0.6,
            zorder=3,
            label=_mpl(names.get(method, method)),
        )
        if uncorrected:
            ax.axhline(by, color="#888888", linestyle=":", linewidth=1, zorder=1)
            ax.axvline(bx, color="#888888", linestyle=":", linewidth=1, zorder=1)
    ax.set_xlabel("batch correction score")
    ax.set_ylabel("bio conservation score")
    if len(pts):
        ax.set_xlim(*_fitted_limits(pts["batch"].to_numpy(dtype=float)))
        ax.set_ylim(*_fitted_limits(pts["bio"].to_numpy(dtype=float)))
        ax.legend(
            fontsize=8,
            loc="center left",
            bbox_to_anchor=(1.02, 0.5),
            frameon=False,
            title="ranked by Total",
            title_fontsize=8,
        )
    ax.grid(alpha=0.3)
    ax.set_title("Batch correction vs bio conservation", fontsize=10)
    return _png(fig)


def chromosome_attention_figure(names: Sequence[str], between: np.ndarray) -> str:
    """Heat map of the mean attention between chromosomes, (C, C) relative to uniform.

    Rows are the attending (query) chromosome, columns the attended one; the colour scale
    is centred on 1, uniform attention. With few chromosomes each cell shows its value.
    """
    plt = _plt()
    from matplotlib.colors import TwoSlopeNorm

    c = len(names)
    side = max(3.0, 0.24 * c + 1.6)
    fig, ax = plt.subplots(figsize=(side + 0.9, side))
    finite = between[np.isfinite(between)]
    lo = min(0.99, float(finite.min())) if finite.size else 0.99
    hi = max(1.01, float(finite.max())) if finite.size else 1.01
    im = ax.imshow(between, cmap="RdBu_r", norm=TwoSlopeNorm(1.0, lo, hi), interpolation="nearest")
    labels = [_mpl(str(n).removeprefix("chr")) for n in names]
    ax.set_xticks(range(c))
    ax.set_xticklabels(labels, rotation=90, fontsize=7)
    ax.set_yticks(range(c))
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_xlabel("attended chromosome (keys)", fontsize=8)
    ax.set_ylabel("attending chromosome (queries)", fontsize=8)
    if c <= 8:
        for (i, j), value in np.ndenumerate(between):
            shade = float(im.norm(value))  # white text on the dark ends of the scale
            colour = "white" if shade < 0.2 or shade > 0.8 else "black"
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7, color=colour)
    bar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
    bar.set_label("mean attention / uniform", fontsize=8)
    ax.set_title("Mean attention between chromosomes", fontsize=10)
    fig.tight_layout()
    return _png(fig)


def runtime_figure(rows: Sequence[Mapping[str, Any]]) -> str:
    """Wall time and peak memory per rule, one bar each (``rule``, ``wall_s``, ``max_rss_mb``)."""
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
    return _png(fig)
