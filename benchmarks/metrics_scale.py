"""Wall time and peak memory of the metrics and report steps at atlas scale (issue 15).

Simulates ``--n`` samples x ``--loci`` loci with cell groups (``locusformer.simulate.datasets``'s
model), writes the uncorrected and ComBat results as the workflow does
(``baselines.run_method``, ``results.write_result``), then runs the workflow's steps as
the rules do, each in a child process of its own: ``locusformer metrics`` (both methods,
``--max-samples``), ``aggregate-metrics`` and ``locusformer report``. For each step it
prints the wall seconds and the peak resident size, the child's own ``ru_maxrss`` (from
``os.wait4``: the ``RUSAGE_CHILDREN`` figure of that child alone, not the largest child so
far), and the size of the report's HTML.

``--src`` runs the steps on another source tree (e.g. a checkout of an earlier commit),
for a before / after on the same files; ``--steps`` picks the steps.

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 .venv/bin/python benchmarks/metrics_scale.py --n 100000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from child_steps import run_child

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("uncorrected", "combat")


def setup(args: argparse.Namespace) -> None:
    """Simulate and write both results (run in a child: the simulation's arrays go with it)."""

    from subsample_agreement import simulated_adata

    from locusformer.baselines.methods import run_method
    from locusformer.io.results import write_result

    adata = simulated_adata(args.n, args.loci, args.batches, args.groups, args.seed)
    args.dir.mkdir(parents=True, exist_ok=True)
    for method in METHODS:
        write_result(run_method(method, adata, "batch", args.seed), args.dir / f"{method}.h5ad")


def step(name: str, argv: list[str], src: Path, log: Path) -> dict:
    row = run_child(name, argv, log, src)
    print(row, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--loci", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--groups", type=int, default=6)
    parser.add_argument("--max-samples", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", type=Path, default=None, help="default benchmarks/out/...")
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="package source")
    parser.add_argument(
        "--steps", nargs="+", default=["setup", "metrics", "report"],
        choices=["setup", "metrics", "report"],
    )  # fmt: skip
    parser.add_argument("--setup-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.dir = args.dir or ROOT / f"benchmarks/out/metrics_scale_{args.n}"
    if args.setup_only:
        setup(args)
        return

    args.dir.mkdir(parents=True, exist_ok=True)
    py = [sys.executable]
    d, rows = args.dir, []
    paths = {m: d / f"{m}.h5ad" for m in METHODS}
    if "setup" in args.steps:
        argv = [*py, __file__, "--setup-only", "--n", str(args.n), "--loci", str(args.loci)]
        argv += ["--batches", str(args.batches), "--groups", str(args.groups)]
        argv += ["--seed", str(args.seed), "--dir", str(d)]
        rows.append(step("simulate + baselines", argv, ROOT / "src", d / "setup.log"))
    common = ["--batch-key", "batch", "--label-key", "label", "--seed", str(args.seed)]
    common += ["--max-samples", str(args.max_samples)]
    if "metrics" in args.steps:
        argv = [*py, "-m", "locusformer", "metrics", "--uncorrected", str(paths["uncorrected"])]
        for m, path in paths.items():
            argv += ["--result", f"{m}={path}", "--out", f"{m}={d / f'metrics_{m}.tsv'}"]
        rows.append(step("metrics", argv + common, args.src, d / "metrics.log"))
        argv = [*py, "-m", "locusformer", "aggregate-metrics"]
        argv += [str(d / f"metrics_{m}.tsv") for m in METHODS] + ["--out", str(d / "metrics.tsv")]
        rows.append(step("aggregate-metrics", argv, args.src, d / "aggregate.log"))
    if "report" in args.steps:
        html = d / "report.html"
        argv = [*py, "-m", "locusformer", "report", "--dataset", "sim"]
        argv += ["--metrics", str(d / "metrics.tsv"), "--figures", str(d / "figures")]
        argv += [x for m, path in paths.items() for x in ("--result", f"{m}={path}")]
        argv += ["--out", str(html)]
        if args.src.resolve() != (ROOT / "src").resolve():
            common = common[:-2]  # an earlier report command had no --max-samples
        rows.append(step("report", argv + common, args.src, d / "report.log"))
        print(f"report.html: {html.stat().st_size / 1e6:.2f} MB", flush=True)
    sizes = {m: round(path.stat().st_size / 1e9, 2) for m, path in paths.items()}
    print(f"n {args.n}, loci {args.loci}, max_samples {args.max_samples}; result GB {sizes}")
    print("| step | wall s | peak RSS GB |\n|---|---|---|")
    for row in rows:
        print(f"| {row['step']} | {row['wall_s']} | {row['peak_gb']} |")


if __name__ == "__main__":
    main()
