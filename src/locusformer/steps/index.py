"""``locusformer index``: the page that links every dataset's report."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

PathLike = str | os.PathLike


def run_index(
    summary: PathLike,
    reports: Mapping[str, PathLike],
    out: PathLike,
    confounding: Mapping[str, PathLike],
) -> None:
    """Write the index at ``out``: ``summary.tsv``'s table, each dataset linked to its
    report by a path relative to the index, and each design check's verdict."""
    from locusformer.report.render import render_index

    out_dir = Path(out).resolve().parent
    links = {name: os.path.relpath(Path(path).resolve(), out_dir) for name, path in reports.items()}
    render_index(summary, links, out, confounding=dict(confounding))
