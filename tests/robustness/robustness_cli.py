"""Helpers of the robustness suite: small inputs written the ways users write them, and the
CLI run in-process with its stderr captured."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from locusformer.cli.main import main

GENES = [f"ENSG{i:011d}" for i in range(1, 9)]
SAMPLES = [f"s{i}" for i in range(8)]
BATCHES = ["b1", "b2"] * 4


def counts_frame(seed: int = 0) -> pd.DataFrame:
    """Genes x samples integer counts, every gene expressed."""
    rng = np.random.default_rng(seed)
    values = rng.poisson(6.0, size=(len(GENES), len(SAMPLES))) + 1
    return pd.DataFrame(values, index=pd.Index(GENES, name="gene_id"), columns=SAMPLES)


def sheet_frame(**columns: Sequence[str]) -> pd.DataFrame:
    return pd.DataFrame({"sample_id": SAMPLES, "batch": BATCHES, **columns})


def run_cli(argv: Sequence[str]) -> tuple[int, list[str]]:
    """Exit code and the lines the CLI printed on stderr (an exception propagates)."""
    buffer = io.StringIO()
    with contextlib.redirect_stderr(buffer):
        code = main([str(a) for a in argv])
    return code, buffer.getvalue().splitlines()


def normalize_argv(
    matrix: Path, sheet: Path, out: Path, *extra: str, value_type: str = "counts"
) -> list[str]:
    return [
        "normalize",
        "--expression", str(matrix),
        "--samples", str(sheet),
        "--batch-key", "batch",
        "--value-type", value_type,
        "--min-samples", "1",
        "--n-top-genes", "0",
        "--out-matrix", str(out / "normalized.parquet"),
        "--out-counts", str(out / "counts.parquet"),
        "--out-samples", str(out / "samples.tsv"),
        "--out-stats", str(out / "stats.json"),
        *extra,
    ]  # fmt: skip


def normalize(
    matrix: Path, sheet: Path, out: Path, *extra: str, value_type: str = "counts"
) -> tuple[int, list[str]]:
    return run_cli(normalize_argv(matrix, sheet, out, *extra, value_type=value_type))


def order_loci(matrix: Path, genes: Path, out: Path, gene_id: str, *extra: str):
    return run_cli(
        [
            "order-loci",
            "--matrix", matrix,
            "--genes", genes,
            "--gene-id", gene_id,
            "--out-loci", out / "loci.parquet",
            "--out-matrix", out / "ordered.parquet",
            "--out-stats", out / "loci.json",
            *extra,
        ]
    )  # fmt: skip


def files_under(path: Path) -> list[str]:
    """Every file below ``path`` (temporary ones included), relative to it."""
    if not path.exists():
        return []
    return sorted(
        str(Path(root, name).relative_to(path))
        for root, _, names in os.walk(path)
        for name in names
    )


def assert_refused(result: tuple[int, list[str]], out: Path, *fragments: str, code: int = 2):
    """Refused with exactly one line that names the problem, and nothing written."""
    status, lines = result
    assert status == code, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith("locusformer ") and ": error: " in lines[0], lines
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert files_under(out) == [], "a refused step writes nothing"
    return lines[0]
