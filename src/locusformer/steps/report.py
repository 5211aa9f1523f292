"""``locusformer report``: one dataset's self-contained HTML report."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

PathLike = str | os.PathLike


def run_report(
    out: PathLike,
    *,
    dataset: str,
    metrics: PathLike,
    integrated: Mapping[str, PathLike],
    benchmarks: Mapping[str, Sequence[PathLike]],
    max_samples: Any,
    **inputs: Any,
) -> None:
    """Render the report of ``dataset`` to ``out``.

    ``integrated`` maps each method to its integration result, ``benchmarks`` each method
    to the rules' benchmark files; ``inputs`` are the optional files and settings of
    :func:`locusformer.report.render.render_dataset_report` (stats, loci, history, ...).
    """
    from locusformer.report.render import render_dataset_report
    from locusformer.scoring.subsample import check_max_samples

    render_dataset_report(
        out,
        dataset=dataset,
        metrics_tsv=metrics,
        integrated=dict(integrated),
        benchmark_files={k: list(v) for k, v in benchmarks.items()},
        max_samples=check_max_samples(max_samples, "--max-samples"),
        **inputs,
    )
