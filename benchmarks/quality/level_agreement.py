"""The input clusters' agreement between batches, per data set, without training (issue 38).

``locusformer.train.alignment.cut_agreement`` reads whether each input cluster holds
the same biology in every batch from the clusters' contrasts within batches, which a
batch effect of shift and scale cannot fake, averaged over ``AGREEMENT_CUTS`` k-means
cuts; below ``LEVEL_AGREEMENT``, or where no cut can be read, the input clusters are not
used. This prints, per data set and seed, the reading training makes, whether the
clusters are used, and with the truth the mismatch of the clusters ``input_levels``
would take (``level_screen.mismatch``: above zero, a cluster joins different classes of
different batches).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/level_agreement.py \\
        --scenarios bulk-confounded bulk-6-batches --seeds 0 1 2 \\
        --tasks-work benchmarks/out/cb --tasks pseudobulk_confounded
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "simulated"))
sys.path.insert(0, str(ROOT / "benchmarks" / "quality"))


def line(name: str, seed: int, x: np.ndarray, codes: np.ndarray, labels: np.ndarray) -> None:
    from level_screen import mismatch

    from locusformer.train import alignment

    quick = alignment.quick_scores(x, codes, seed)
    if quick is None:
        print(f"{name}\t{seed}\toff (no structure)\t\t", flush=True)
        return
    cuts = alignment.agreement_cuts(quick.scores, 8, seed)
    agree = alignment.cut_agreement(x, codes, cuts, seed)
    shown = "none" if agree is None else f"{agree:.3f}"
    used = agree is not None and agree >= alignment.LEVEL_AGREEMENT
    m = mismatch(cuts[0], codes, labels)  # the clusters input_levels takes at 8
    print(f"{name}\t{seed}\t{shown}\t{'used' if used else 'not used'}\t{m:.3f}", flush=True)


def _workflow_rows(folder: Path, batch_key: str, label_key: str, seed: int):
    """The rows of a workflow's ordered matrix that ``input_levels`` clusters (all of them
    up to ``INPUT_MAX_SAMPLES``; the same draw above it, so the reading is the training's),
    their batch codes and labels."""
    import pandas as pd

    from locusformer.io.parquet import read_matrix_parquet
    from locusformer.train.alignment import INPUT_MAX_SAMPLES, _input_rows

    matrix = read_matrix_parquet(folder / "ordered.parquet", "ordered matrix")
    samples = pd.read_csv(folder / "samples.tsv", sep="\t", index_col=0, dtype=str)
    samples = samples.loc[matrix.index]
    codes = samples[batch_key].astype("category").cat.codes.to_numpy()
    rows = np.arange(len(codes))
    if len(codes) > INPUT_MAX_SAMPLES:
        rows = _input_rows(codes, INPUT_MAX_SAMPLES, seed)
    labels = samples[label_key].astype(str).to_numpy()
    return matrix.to_numpy()[rows], codes[rows], labels[rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", nargs="*", default=[])
    parser.add_argument("--library", default=None, help="the scenarios' library instead")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--tasks", nargs="*", default=[])
    parser.add_argument("--tasks-work", type=Path, default=ROOT / "benchmarks" / "out" / "cb")
    parser.add_argument(
        "--results", type=Path, nargs="*", default=[],
        help="a workflow's results/DATASET folders (ordered.parquet, samples.tsv)",
    )  # fmt: skip
    parser.add_argument("--batch-key", default="batch")
    parser.add_argument("--label-key", default="group")
    args = parser.parse_args()
    print("data set\tseed\tagreement\tinput clusters\tmismatch (truth)")
    for name in args.scenarios:
        from suite import BATCH_KEY, LABEL_KEY, prepare

        from locusformer.simulate.scenarios import SUITE

        scenario = SUITE[name]
        if args.library:
            scenario = dataclasses.replace(scenario, library=args.library)
            name = f"{name} ({args.library})"
        for seed in args.seeds:
            a, _, _ = prepare(scenario, seed)
            codes = a.obs[BATCH_KEY].astype("category").cat.codes.to_numpy()
            labels = a.obs[LABEL_KEY].astype(str).to_numpy()
            line(name, seed, np.asarray(a.X, dtype=np.float32), codes, labels)
    for folder in args.results:
        for seed in args.seeds:
            x, codes, labels = _workflow_rows(folder, args.batch_key, args.label_key, seed)
            line(str(folder), seed, x, codes, labels)
    for task in args.tasks:
        from variants import load_task

        a, _, _ = load_task(args.tasks_work, task)
        codes = a.obs["batch"].cat.codes.to_numpy()
        labels = a.obs["cell_line"].astype(str).to_numpy()
        for seed in args.seeds:
            line(task, seed, np.asarray(a.X, dtype=np.float32), codes, labels)


if __name__ == "__main__":
    main()
