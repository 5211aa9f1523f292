"""``locusformer simulate``: a synthetic multi-batch count matrix with a known truth, as files."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from locusformer.simulate.params import CountSimulationParams

PathLike = str | os.PathLike
log = logging.getLogger("locusformer")


def run_simulate(
    params: CountSimulationParams,
    *,
    out_expression: PathLike,
    out_samples: PathLike,
    genes: PathLike | None = None,
    out_truth: PathLike | None = None,
    out_row: PathLike | None = None,
    out_regions: PathLike | None = None,
    name: str | None = None,
) -> None:
    """Draw the simulation ``params`` describe on the genome of ``genes`` and write it."""
    from locusformer.simulate.datasets import simulate_counts, write_simulation

    sim = simulate_counts(params, annotation=genes)
    stats = write_simulation(
        sim,
        out_expression,
        out_samples,
        truth=out_truth,
        row=out_row,
        name=name,
        annotation=genes,
        regions=out_regions,
    )
    log.info(
        "simulated %d samples x %d genes (%d batches, %d groups), %.1f%% non-zero",
        stats["n_samples"],
        stats["n_genes"],
        params.n_batches,
        params.n_groups,
        100 * stats["nnz"] / max(1, stats["n_samples"] * stats["n_genes"]),
    )
