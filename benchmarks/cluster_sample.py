"""How many training latents the cluster term needs (issue 42, goal 1): time and quality.

From the end of the adversary's ramp-up, every epoch first encodes a seeded sample of the
training rows (at most ``CLUSTER_MAX_SAMPLES``) and clusters their latents; above that many
training rows this costs about as much as the epoch's own steps. This trains LocusFormer
at its defaults on one simulated data set (the suite's ``middle`` scenario grown to
``--samples``) once per ``--caps`` value, on the same seed, and prints the training time
and the scores of each model's corrected matrix (the workflow's ``score_method`` on a
stratified ``--score-samples`` subsample, the same rows for every cap).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cluster_sample.py \\
        --samples 40000 --caps 20000 5000 --seeds 0 --out benchmarks/out/cluster_sample.tsv
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "simulated"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=40_000)
    parser.add_argument("--caps", nargs="+", type=int, default=[20_000, 5_000])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--score-samples", type=int, default=10_000)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import torch
    from provenance import record_run
    from suite import BATCH_KEY, LABEL_KEY, prepare

    import locusformer.train.loop as loop
    from locusformer.baselines.methods import run_method
    from locusformer.infer.correct import correct
    from locusformer.io.results import make_result
    from locusformer.scoring.metrics import score_method
    from locusformer.scoring.subsample import scoring_subsample
    from locusformer.simulate.scenarios import SUITE

    torch.set_num_threads(1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record_run(args.out.parent, vars(args) | {"out": str(args.out)})
    scenario = dataclasses.replace(SUITE["middle"], n_samples=args.samples)
    for seed in args.seeds:
        adata, _, loci = prepare(scenario, seed)
        batches = adata.obs[BATCH_KEY].astype(str).tolist()
        keep = scoring_subsample(adata.obs, BATCH_KEY, LABEL_KEY, args.score_samples, seed)
        uncorrected = run_method("uncorrected", adata.copy(), BATCH_KEY, 0)
        for cap in args.caps:
            loop.CLUSTER_MAX_SAMPLES = cap
            start = time.perf_counter()
            model, _ = loop.train_corrector(
                adata.X, batches, loci, None, None, seed=seed, progress=False
            )
            seconds = time.perf_counter() - start
            corrected, _ = correct(model, adata.X, batches)
            result = make_result(
                corrected, method="locusformer", representation="matrix", obs=adata.obs,
                var_names=adata.var_names, batch_key=BATCH_KEY, label_key=LABEL_KEY,
            )  # fmt: skip
            v = score_method(
                result, uncorrected, BATCH_KEY, LABEL_KEY, seed=seed, samples=keep
            ).set_index("metric")["value"]
            row = [args.samples, cap, seed, round(seconds, 1)]
            scores = ("Batch correction", "Bio conservation", "Total")
            row += [round(float(v[m]), 4) for m in scores]
            line = "\t".join(map(str, row))
            print(line, flush=True)
            with open(args.out, "a") as fh:
                fh.write(line + "\n")


if __name__ == "__main__":
    main()
