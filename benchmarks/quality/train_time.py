"""Training time of LocusFormer against scVI on one quality task, measured in one run.

The workflow's own timings (the ``benchmark:`` files behind ``summary.tsv``) come from jobs
that Snakemake may run side by side, so the two methods can share the CPU unevenly. Here
the two commands run one after the other, alternating, ``--repeats`` times each, with the
same thread count, on the files a quality run already wrote (``run.py`` first):

    .venv/bin/python benchmarks/quality/train_time.py --task cellbench5 --repeats 3

LocusFormer's time is ``train`` + ``correct`` (what a user waits for); scVI's is the
``baseline --method scvi`` command, which trains scVI with scvi-tools' default epochs and
writes its latent. Prints medians, the ratio of medians and every repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _timed(command: list[str], threads: int) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT / "src")}
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="cellbench5")
    parser.add_argument("--run", type=Path, default=None, help="a quality run's results dir")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="JSON file for the results")
    args = parser.parse_args()
    run = args.run or ROOT / "benchmarks/out/quality/runs/default/seed0/results"
    data = run / args.task
    if not (data / "ordered.parquet").exists():
        sys.exit(f"{data}/ordered.parquet not found: run benchmarks/quality/run.py first")
    python = [sys.executable, "-m", "locusformer"]
    common = ["--samples", str(data / "samples.tsv"), "--batch-key", "batch"]
    times: dict[str, list[float]] = {"locusformer": [], "scvi": []}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for repeat in range(args.repeats):
            train = [
                *python, "train", "--matrix", str(data / "ordered.parquet"),
                "--loci", str(data / "loci.parquet"), *common, "--seed", str(args.seed),
                "--out-weights", str(out / "model.pt"), "--out-config", str(out / "model.json"),
                "--out-history", str(out / "history.tsv"),
            ]  # fmt: skip
            correct = [
                *python, "correct", "--matrix", str(data / "ordered.parquet"), *common,
                "--weights", str(out / "model.pt"), "--config", str(out / "model.json"),
                "--out-corrected", str(out / "corrected.parquet"),
                "--out-latent", str(out / "latent.parquet"), "--out-h5ad", str(out / "lf.h5ad"),
            ]  # fmt: skip
            scvi = [
                *python, "baseline", "--method", "scvi", "--matrix", str(data / "ordered.parquet"),
                "--counts", str(data / "counts.parquet"), *common, "--seed", str(args.seed),
                "--out", str(out / "scvi.h5ad"),
            ]  # fmt: skip
            lf = _timed(train, args.threads) + _timed(correct, args.threads)
            sv = _timed(scvi, args.threads)
            times["locusformer"].append(lf)
            times["scvi"].append(sv)
            print(f"[train_time] repeat {repeat}: locusformer {lf:.1f} s, scvi {sv:.1f} s")
    medians = {name: statistics.median(values) for name, values in times.items()}
    result = {
        "task": args.task,
        "threads": args.threads,
        "repeats": times,
        "median_s": medians,
        "ratio": medians["locusformer"] / medians["scvi"],
    }
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
