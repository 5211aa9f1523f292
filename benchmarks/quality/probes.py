"""What the in-process probes of issue 38 share: the data sets they run on (simulated
scenarios and prepared CellBench tasks) and their command-line arguments, and the scoring
of a corrected matrix into one row of their output file.

Used by ``pseudo_levels.py``, ``decoder_steps.py``, ``residual_combat.py``,
``level_chance.py`` and ``level_links.py``; each adds its own arguments and columns.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "simulated"))
sys.path.insert(0, str(ROOT / "benchmarks" / "quality"))


def probe_parser(doc: str) -> argparse.ArgumentParser:
    """A probe's parser (described by the first line of ``doc``) with the arguments every
    probe takes: ``--out`` and the data sets (:func:`each_dataset`)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scenarios", nargs="*", default=[])
    parser.add_argument("--tasks", nargs="*", default=[])
    parser.add_argument("--tasks-work", type=Path, default=ROOT / "benchmarks" / "out" / "variants")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    return parser


def each_dataset(args: argparse.Namespace) -> Iterator[tuple[str, object, object, tuple, int]]:
    """:func:`datasets` for a :func:`probe_parser`'s arguments, torch on one thread."""
    import torch

    torch.set_num_threads(1)
    yield from datasets(args.scenarios, args.tasks, args.tasks_work, args.seeds)


def datasets(
    scenarios: Sequence[str], tasks: Sequence[str], tasks_work: Path, seeds: Sequence[int]
) -> Iterator[tuple[str, object, object, tuple[str, str], int]]:
    """(name, normalized AnnData in genomic order, loci, (batch key, label key), seed) for
    each seed of each suite scenario (simulated anew per seed), then of each CellBench
    task prepared under ``tasks_work`` (the same data for every seed)."""
    if scenarios:
        from suite import BATCH_KEY, LABEL_KEY, prepare

        from locusformer.simulate.scenarios import SUITE

        for name in scenarios:
            for seed in seeds:
                adata, _, loci = prepare(SUITE[name], seed)
                yield name, adata, loci, (BATCH_KEY, LABEL_KEY), seed
    for task in tasks:
        from variants import load_task

        adata, loci, _ = load_task(tasks_work, task)
        for seed in seeds:
            yield task, adata, loci, ("batch", "cell_line"), seed


def score_matrix(corrected, adata, uncorrected, keys: tuple[str, str], seed: int) -> list:
    """[batch, bio, total] of LocusFormer's corrected matrix of ``adata``'s samples, scored
    by the workflow's metrics against ``uncorrected``."""
    from locusformer.io.results import make_result
    from locusformer.scoring.metrics import score_method

    batch_key, label_key = keys
    result = make_result(
        corrected, method="locusformer", representation="matrix", obs=adata.obs,
        var_names=adata.var_names, batch_key=batch_key, label_key=label_key,
    )  # fmt: skip
    v = score_method(result, uncorrected, batch_key, label_key, seed=seed)
    v = v.set_index("metric")["value"]
    return [v["Batch correction"], v["Bio conservation"], v["Total"]]


def append_row(out: Path, row: Sequence[object]) -> None:
    """Print ``row`` tab-separated and append it to ``out``."""
    line = "\t".join(map(str, row))
    print(line, flush=True)
    with open(out, "a") as fh:
        fh.write(line + "\n")
