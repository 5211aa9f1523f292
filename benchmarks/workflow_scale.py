"""The whole workflow at scale (issue 15, goal 2): every rule's time and memory per size.

For each of ``--sizes`` it simulates counts of n samples x 2,500 genes in 8 batches with 6
cell groups (``locusformer simulate``, a sparse .h5ad, so the bio metrics mean something),
writes a one-dataset config (baselines ComBat and Harmony; every other setting the
workflow's default, ``metrics.max_samples`` included) and runs the workflow to its report
with ``snakemake --cores 2``. Each rule's ``benchmark:`` file (wall seconds, peak RSS) is
collected into ``OUT/rules.tsv``, one row per (size, rule), and printed as one table with a
column per size. scVI is not in the run: it is an optional extra, and on 2 CPU cores its
default training (400 epochs at 1M samples) would not finish in hours.

    .venv/bin/python benchmarks/workflow_scale.py --sizes 10000 100000
    .venv/bin/python benchmarks/workflow_scale.py --table

Work directories are ``OUT/n<size>/`` (git-ignored, under ``benchmarks/out``); a size whose
report exists is not run again.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
N_GENES, N_BATCHES, N_GROUPS = 2500, 8, 6


def simulate(n: int, work: Path) -> None:
    data = work / "data"
    if (data / "row.tsv").exists():
        return
    data.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [str(BIN / "locusformer"), "simulate", "--out-expression", str(data / "expr.h5ad"),
         "--out-samples", str(data / "samples.tsv"), "--out-row", str(data / "row.tsv"),
         "--name", "sim", "--n-samples", str(n), "--n-genes", str(N_GENES),
         "--n-batches", str(N_BATCHES), "--n-groups", str(N_GROUPS), "--seed", "0"],
        check=True,
    )  # fmt: skip


def configure(work: Path) -> None:
    (work / "config").mkdir(exist_ok=True)
    row = pd.read_csv(work / "data" / "row.tsv", sep="\t")
    for column in ("expression", "samples"):  # simulate names them relative to its cwd
        row[column] = [str((work / "data" / Path(p).name).resolve()) for p in row[column]]
    row.to_csv(work / "config" / "datasets.tsv", sep="\t", index=False)
    config = {"datasets": "config/datasets.tsv", "seed": 0, "baselines": ["combat", "harmony"]}
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(config))


def run_workflow(work: Path) -> float:
    start = time.perf_counter()
    with open(work / "snakemake.log", "w") as log:
        subprocess.run(
            [str(BIN / "snakemake"), "--snakefile", str(ROOT / "workflow" / "Snakefile"),
             "--directory", str(work), "--cores", "2"],
            check=True, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return time.perf_counter() - start


def collect(out: Path) -> pd.DataFrame:
    rows = []
    for work in sorted(out.glob("n*")):
        for tsv in sorted((work / "logs" / "benchmarks").rglob("*.tsv")):
            b = pd.read_csv(tsv, sep="\t")
            rows.append(
                {
                    "size": int(work.name[1:]),
                    "rule": tsv.stem,
                    "seconds": float(b["s"].iloc[0]),
                    "max_rss_mb": float(b["max_rss"].iloc[0]),
                }
            )
        report = next(work.glob("results/*/report.html"), None)
        if report is not None:
            rows.append(
                {
                    "size": int(work.name[1:]),
                    "rule": "report.html (MB)",
                    "seconds": float("nan"),
                    "max_rss_mb": report.stat().st_size / 1e6,
                }
            )
    return pd.DataFrame(rows)


def table(frame: pd.DataFrame) -> str:
    shown = frame.assign(
        cell=[
            f"{r.max_rss_mb:.2f}"
            if r.rule.endswith("(MB)")
            else f"{r.seconds:.0f} s, {r.max_rss_mb / 1024:.2f} GB"
            for r in frame.itertuples()
        ]
    )
    wide = shown.pivot(index="rule", columns="size", values="cell").fillna("")
    wide.columns = [f"{c:,} samples" for c in wide.columns]
    return wide.to_markdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "workflow_scale")
    parser.add_argument("--table", action="store_true", help="print the table and stop")
    args = parser.parse_args()
    if not args.table:
        for n in args.sizes:
            work = args.out / f"n{n}"
            if next(work.glob("results/*/report.html"), None) is not None:
                continue
            work.mkdir(parents=True, exist_ok=True)
            simulate(n, work)
            configure(work)
            wall = run_workflow(work)
            print(f"{n} samples: workflow {wall:.0f} s", flush=True)
    frame = collect(args.out)
    frame.to_csv(args.out / "rules.tsv", sep="\t", index=False)
    print(table(frame))


if __name__ == "__main__":
    main()
