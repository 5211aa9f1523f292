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


def embedding_figure(
    coords: np.ndarray, obs: pd.DataFrame, keys: Sequence[str], method: str, axis: str
) -> str:
    """One method's 2-d embedding, one panel per column of ``obs`` in ``keys``.

    ``axis`` names the coordinates on the axes (``UMAP``, ``PC`` or ``dim``).
    """
    plt = _plt()
    fig, axes = plt.subplots(1, len(keys), figsize=(4.4 * len(keys), 3.4), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        _scatter_panel(ax, coords, obs[key], f"{method}: {key}", axis)
    fig.tight_layout()
    return _png(fig)


def scores_figure(pts: pd.DataFrame, names: Mapping[str, str]) -> str:
    """Batch correction against bio conservation score, one point per method.

    ``pts`` is indexed by method with ``batch`` and ``bio``; ``names`` gives a method's
    display name (a method missing from it is shown by its key).
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.6, 3.8))
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
