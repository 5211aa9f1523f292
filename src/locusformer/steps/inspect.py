"""``locusformer inspect``: a trained model's attention traced step by step on a few samples."""

from __future__ import annotations

import logging
import os
import sys

PathLike = str | os.PathLike

log = logging.getLogger("locusformer")


def run_inspect(
    *,
    model: PathLike,
    matrix: PathLike,
    samples: PathLike | None,
    n_samples: int,
    sample_column: str | None,
    seed: int,
    device: str,
    json: bool,
    naive_rows: bool,
    out: PathLike | None,
    out_text: PathLike | None,
) -> None:
    """Trace ``model`` on ``n_samples`` samples of ``matrix``; print the trace or write it."""
    from locusformer.infer.trace import dump_trace, format_trace, inspect_model
    from locusformer.io.atomic import write_text

    result = inspect_model(
        model,
        matrix,
        samples,
        n_samples=n_samples,
        sample_column=sample_column,
        seed=seed,
        device=device,
    )
    text = dump_trace(result) if json else format_trace(result, naive=naive_rows)
    if out:
        write_text(out, text)
    else:
        sys.stdout.write(text)
    if out_text:  # the same trace as text too: the workflow keeps both forms
        write_text(out_text, format_trace(result, naive=naive_rows))
