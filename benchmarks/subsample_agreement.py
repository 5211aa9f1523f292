"""Do the scIB totals on a stratified subsample agree with the full data's? (issue 15)

Simulates ``--samples`` x ``--loci`` (``locusformer simulate``'s model, with cell groups so
the bio metrics mean something), runs the uncorrected baseline, ComBat and Harmony, and
scores each on all samples and on stratified subsamples of each ``--sizes`` (seeds
``--seeds``), exactly as the ``metrics`` rule does above ``metrics.max_samples``. Writes one
row per (method, size, seed) to ``--out`` (every metric's value to ``--out`` with the suffix
``.metrics.tsv``) and prints the largest difference per size.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/subsample_agreement.py --samples 20000 \\
        --sizes 2000 5000 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import anndata as ad
import pandas as pd

from locusformer.baselines.methods import run_method
from locusformer.scoring.metrics import score_method
from locusformer.scoring.subsample import scoring_subsample
from locusformer.simulate.datasets import simulate

ROOT = Path(__file__).resolve().parents[1]


def simulated_adata(n: int, loci: int, batches: int, groups: int, seed: int) -> ad.AnnData:
    """``locusformer.simulate.datasets``'s samples as the normalized AnnData the baselines take:
    obs ``batch`` and ``label`` (the cell group), var names the gene ids."""
    sim = simulate(n_samples=n, n_loci=loci, n_batches=batches, n_groups=groups, seed=seed)
    obs = pd.DataFrame(
        {"batch": [f"b{b}" for b in sim.batch], "label": [f"g{g}" for g in sim.group]},
        index=[f"s{i}" for i in range(n)],
    ).astype("category")
    adata = ad.AnnData(X=sim.X, obs=obs)
    adata.var_names = list(sim.loci["gene_id"])
    return adata


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--loci", type=int, default=500)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--groups", type=int, default=6)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 5000])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=["uncorrected", "combat", "harmony"])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/out/subsample_agreement.tsv")
    args = parser.parse_args()

    adata = simulated_adata(args.samples, args.loci, args.batches, args.groups, seed=0)
    results = {m: run_method(m, adata.copy(), "batch", 0) for m in args.methods}
    uncorrected = results["uncorrected"]
    rows, details = [], []

    def score(method: str, size: int, seed: int, samples: pd.Index | None) -> None:
        start = time.perf_counter()
        v = score_method(results[method], uncorrected, "batch", "label", seed=seed, samples=samples)
        v = v.set_index("metric")["value"]
        rows.append({
            "method": method, "size": size, "seed": seed,
            "batch": v["Batch correction"], "bio": v["Bio conservation"], "total": v["Total"],
            "seconds": round(time.perf_counter() - start, 1),
        })  # fmt: skip
        # every metric, so that a score that moves can be traced to the metric that moved
        details.extend({"method": method, "size": size, "seed": seed, "metric": k, "value": x}
                       for k, x in v.items())  # fmt: skip
        print(rows[-1], flush=True)

    for method in args.methods:
        score(method, args.samples, 0, None)
    for size in args.sizes:
        for seed in args.seeds:
            picked = scoring_subsample(uncorrected.obs, "batch", "label", size, seed)
            for method in args.methods:
                score(method, size, seed, picked)
    table = pd.DataFrame(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, sep="\t", index=False)
    pd.DataFrame(details).to_csv(args.out.with_suffix(".metrics.tsv"), sep="\t", index=False)
    full = table[table["size"] == args.samples].set_index("method")
    sub = table[table["size"] != args.samples].copy()
    for key in ("batch", "bio", "total"):
        sub[f"d_{key}"] = sub[key] - sub["method"].map(full[key])
    print(full[["batch", "bio", "total", "seconds"]].round(4).to_markdown())
    cols = ["d_batch", "d_bio", "d_total"]
    print(sub.groupby(["size", "method"])[cols].agg(lambda x: x.abs().max()).round(4).to_markdown())
    # Does the subsample rank the methods as the full data do?
    for (size, seed), g in sub.groupby(["size", "seed"]):
        same = list(g.sort_values("total")["method"]) == list(full.sort_values("total").index)
        print(f"size {size} seed {seed}: same ranking as the full data: {same}")


if __name__ == "__main__":
    main()
