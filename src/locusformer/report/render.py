"""Self-contained HTML reports: one per dataset and an index over all datasets.

A report is ONE file: figures are PNGs embedded as base64 ``data:`` URIs, the CSS is inline
and there is no JavaScript, font or stylesheet to fetch, so it opens from disk (or as an
e-mail attachment) anywhere. Every user-provided name is escaped (jinja2 autoescape on; in
figures, matplotlib's mathtext ``$`` is escaped too).

This module renders: the sections come assembled from the workflow's outputs by
:mod:`locusformer.report.sections` (the attention's by :mod:`locusformer.report.attention`,
the attention traced step by step by :mod:`locusformer.report.trace`), with their figures
drawn by :mod:`locusformer.report.figures`, and go into the jinja2 templates here.
"""

from __future__ import annotations

import base64
import importlib.metadata
import json
import math
import os
import platform
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from locusformer.io import atomic
from locusformer.report.attention import attention_section
from locusformer.report.sections import (
    confounding_section,
    embedding_section,
    history_section,
    index_groups,
    loci_section,
    mapping_section,
    metrics_section,
    runtime_section,
    summary_section,
)
from locusformer.report.trace import trace_section

TEMPLATES = Path(__file__).resolve().parent / "templates"
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


def software_versions() -> list[tuple[str, str]]:
    """(package, version) for Python and the packages in :data:`VERSION_PACKAGES` installed."""
    out = [("python", platform.python_version())]
    for name in VERSION_PACKAGES:
        try:
            out.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


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
    representations: PathLike | None = None,
    attention_npz: PathLike | None = None,
    benchmark_files: Mapping[str, Paths] | None = None,
    confounding_json: PathLike | None = None,
    mapping_json: PathLike | None = None,
    trace_json: PathLike | None = None,
    config: Mapping[str, Any] | None = None,
    seed: int | None = None,
    seed_metrics: Sequence[PathLike] | None = None,
    batch_key: str = "batch",
    label_key: str | None = None,
    embedding: str = "auto",
    figures_dir: PathLike | None = None,
    max_samples: int | None = None,
) -> str:
    """Write ``results/{dataset}/report.html`` (one self-contained file); return the HTML.

    With ``figures_dir``, every figure is also written there as a PNG file (for
    ``snakemake --report``).

    Every input is optional; a section without its input says so. ``integrated`` maps
    method -> integration result h5ad (``uncorrected`` is shown first);
    ``benchmark_files`` maps rule -> Snakemake benchmark TSV(s); ``confounding_json`` is
    the design check of :mod:`locusformer.scoring.confounding` (a confounded design is stated at
    the top of the report); ``mapping_json``, for a dataset mapped onto a trained model
    instead of trained (``locusformer map``), says at the top which model and which
    batches were new; ``trace_json``, the ``inspect.json`` of ``locusformer inspect
    --json``, is the attention traced step by step (without it the report has no such
    section, except for a mapped dataset, whose section says the trace is its model's);
    ``embedding`` is ``"auto"`` (UMAP from
    :data:`~locusformer.report.sections.UMAP_MIN_SAMPLES` samples on, else PCA),
    ``"umap"`` or ``"pca"``; the embeddings show at most
    :data:`~locusformer.report.sections.EMBEDDING_MAX_SAMPLES` samples (10,000), a
    stratified subsample seeded by ``seed``, drawn above ``max_samples`` samples
    (``metrics.max_samples``, default 50,000) from the subsample the metrics job scored;
    the section says how many. ``representations``, the ``metrics`` job's
    ``representations.h5ad``, gives each method's representation as scored, from which
    its embedding is drawn; without it (or for a method or sample it lacks) the
    representation is computed again, the same way. The verdict says that its scores
    are one seed's, ``seed``; ``seed_metrics``, the metrics tables of the same dataset run
    with other seeds, add how far the leading methods' Totals moved between seeds (the
    table itself stays this run's).
    """

    if embedding not in ("auto", "umap", "pca"):
        raise ValueError(f"embedding must be 'auto', 'umap' or 'pca', not {embedding!r}")
    emb_section, obs = _embeddings(
        integrated,
        representations,
        batch_key=batch_key,
        label_key=label_key,
        seed=0 if seed is None else int(seed),
        mode=embedding,
        max_samples=max_samples,
    )
    config_text = _config_text(config)
    mapping = mapping_section(mapping_json)
    sections = {
        "summary": summary_section(stats_json, obs, batch_key, label_key),
        "confounding": confounding_section(confounding_json),
        "mapping": mapping,
        "loci": loci_section(loci_parquet),
        "history": history_section(history_tsv),
        "embeddings": emb_section,
        "metrics": {
            **metrics_section(
                metrics_tsv, emb_section.get("names"), seed=seed, seed_metrics=seed_metrics
            ),
            "kmeans": kmeans_sentence(config),
        },
        "attention": attention_section(attention_npz, loci_parquet),
        "trace": trace_section(trace_json, mapping.get("model")),
        "runtime": runtime_section(benchmark_files),
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


def _config_text(config: Mapping[str, Any] | None) -> str:
    """The run's configuration as the report prints it (YAML; "" without one)."""
    import yaml

    if not config:
        return ""
    return yaml.safe_dump(json.loads(json.dumps(dict(config), default=str)), sort_keys=False)


def _embeddings(
    integrated: Mapping[str, PathLike] | None,
    representations: PathLike | None,
    **settings: Any,
) -> tuple[dict, Any]:
    """The embedding section and the samples' obs (:func:`embedding_section`), or an empty
    section without results."""
    if not integrated:
        return {"available": False, "plots": [], "subsample": ""}, None
    return embedding_section(integrated, representations=representations, **settings)


def kmeans_sentence(config: Mapping[str, Any] | None) -> str:
    """How KMeans NMI and ARI were clustered, from the run's ``metrics.kmeans_starts``.

    "" when the configuration does not say. The count changes the scores, so a table read
    beside another run's must show it (:func:`locusformer.scoring.metrics.kmeans_nmi_ari`).
    """
    starts = ((config or {}).get("metrics") or {}).get("kmeans_starts")
    if starts is None:
        return ""
    if int(starts) == 1:
        return (
            "KMeans NMI and ARI come from one k-means start, as scib-metrics computes them "
            "(metrics.kmeans_starts: 1); another start can move them by a few hundredths."
        )
    return (
        f"KMeans NMI and ARI come from the lowest-inertia clustering of {int(starts)} "
        "k-means starts (metrics.kmeans_starts), not from scib-metrics' single start: "
        "compare them only with scores computed the same way."
    )


def _write_figures(sections: Mapping[str, dict], figures_dir: Path) -> None:
    """Decode the report's figures into ``figures_dir`` as numbered, named PNG files."""
    figures = [
        ("loci", sections["loci"].get("figure")),
        ("training", sections["history"].get("figure")),
        ("embedding_legend", sections["embeddings"].get("legend")),
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


def render_index(
    summary_tsv: PathLike,
    report_links: Mapping[str, PathLike],
    out_html: PathLike,
    confounding: Mapping[str, PathLike] | None = None,
) -> str:
    """Write ``results/index.html``: links to every dataset report and the summary table.

    Per dataset, the method :func:`~locusformer.report.sections.verdict` crowns is marked
    (never a correction scoring below the uncorrected data) and said in words;
    ``confounding`` maps dataset -> its design check (:mod:`locusformer.scoring.confounding`),
    shown beside the dataset.
    """
    groups = index_groups(summary_tsv, report_links, confounding)
    return _render(
        "index.html",
        out_html,
        groups=groups,
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        versions=software_versions(),
    )
