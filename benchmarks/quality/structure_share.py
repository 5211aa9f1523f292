"""How much of the quick correction's variance stands above noise, per data set, without
training (issue 38): could a label-free statistic tell shallow counts, where the input
clusters cost biology, from deep ones, where they help?

For each data set, on at most 5,000 rows (seeded, as the fold check samples them): the
input corrected quickly (``locusformer.train.fold.quick_correction``: ComBat, each batch
re-centred on its mutual nearest neighbours), each locus standardized, its principal axes
against the largest main axis of five column shuffles (parallel analysis,
``alignment.spectrum_and_null``, which ``alignment.structured_axes`` reads). One row per data set
into ``--out`` (appended): the axes above the null, the share of the variance they carry
beyond it (sum of ``s_i^2 - null^2`` over the total), the share they carry, the main
axis over the null's (``alignment.structure_ratio``) and the main axis' share.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/structure_share.py --out s.tsv \\
        --scenarios middle n-3000 --library shallow --seeds 0 1 2
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/structure_share.py --out s.tsv \\
        --tasks protocols mixture --work benchmarks/out/cb
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/structure_share.py --out s.tsv \\
        --files /tmp/gen3/x.h5ad /tmp/gen3/s.tsv
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "benchmarks" / "quality"), str(ROOT / "benchmarks" / "simulated")]
from fold_guard import prepare_file  # noqa: E402
from probes import append_row  # noqa: E402
from suite import BATCH_KEY, prepare  # noqa: E402

from locusformer.simulate.scenarios import SUITE  # noqa: E402
from locusformer.train.alignment import spectrum_and_null, structure_ratio  # noqa: E402
from locusformer.train.fold import quick_correction  # noqa: E402
from locusformer.train.runtime import sampled_rows  # noqa: E402

MAX_ROWS = 5000


def shares(x: np.ndarray, codes: np.ndarray, seed: int) -> list:
    """[axes above the null, share beyond the null, share on those axes, main axis over
    the null's, main axis' share] of ``x``'s quick correction."""
    rows = sampled_rows(len(x), MAX_ROWS, [seed, 10])
    x, codes = np.asarray(x[rows], dtype=np.float32), np.asarray(codes)[rows]
    quick = quick_correction(x, codes, seed)
    s, null = spectrum_and_null(quick, seed)
    # each varying locus standardized: unit variance over the rows
    total = float(len(quick) * (quick.std(axis=0) > 0).sum())
    above = s[s > null]
    return [
        len(above), float((above**2 - null**2).sum() / total), float((above**2).sum() / total),
        structure_ratio(quick, seed), float(s[0] ** 2 / total),
    ]  # fmt: skip


def data_sets(args: argparse.Namespace):
    """(name, matrix, batch codes) of every data set the arguments name."""
    for name in args.scenarios or []:
        scenario = SUITE[name]
        if args.library is not None:
            scenario = dataclasses.replace(scenario, library=args.library)
            name = f"{name} ({args.library})"
        for seed in args.seeds:
            adata, _, _ = prepare(scenario, seed)
            yield f"{name}:{seed}", adata.X, adata.obs[BATCH_KEY].cat.codes.to_numpy()
    for task in args.tasks or []:
        from variants import load_task

        adata, _, _ = load_task(args.work, task)
        yield f"cellbench:{task}", adata.X, adata.obs["batch"].cat.codes.to_numpy()
    if args.files is not None:
        adata, _, _ = prepare_file(*args.files)
        yield str(args.files[0].parent.name), adata.X, adata.obs[BATCH_KEY].cat.codes.to_numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scenarios", nargs="+", choices=list(SUITE))
    parser.add_argument("--library", default=None, choices=("single_cell", "bulk", "shallow"))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--tasks", nargs="+", help="prepared CellBench tasks (variants.py)")
    parser.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "out" / "cb")
    parser.add_argument("--files", nargs=2, type=Path, metavar=("H5AD", "SAMPLES"))
    args = parser.parse_args()
    for name, x, codes in data_sets(args):
        row = [name, len(codes), *shares(x, codes, 0)]
        append_row(args.out, [f"{v:.4f}" if isinstance(v, float) else v for v in row])


if __name__ == "__main__":
    main()
