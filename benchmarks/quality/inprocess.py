"""More seeds and ablations of the quality benchmark, in one process per call.

``run.py`` runs the whole workflow per (variant, seed): every scoring job starts a Python
that imports and JIT-compiles scib-metrics again (on this 2-core machine, under load, a
couple of minutes per job). This script calls the same library functions the rules call
(``baselines.run_method``, ``train.train_corrector``, ``correct.correct``,
``results.make_result`` as ``locusformer-result`` does, ``metrics.score_method``) in one
process, on the normalized and ordered matrices a ``run.py`` run already wrote (they do not
depend on the seed), and writes ``summary.tsv`` and ``metrics.tsv`` files in the layout
``run.py --collect-only`` reads:

    .venv/bin/python benchmarks/quality/inprocess.py --tasks protocols cellbench5 --seeds 1 2
    .venv/bin/python benchmarks/quality/inprocess.py --tasks cellbench5 --seeds 0 \\
        --variants shuffled_loci patch_16 ...
    .venv/bin/python benchmarks/quality/run.py --collect-only

``--no-baselines`` scores LocusFormer against the uncorrected data only (a check that a
change of the code leaves the corrector's scores where they were).

Times are the in-process seconds of each method (LocusFormer: train + correct); peak memory
is not measured here (the column is left empty).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import VARIANT_BASELINES, VARIANTS, label_baselines, protected_columns

from locusformer.baselines.methods import run_method
from locusformer.infer.correct import correct
from locusformer.io.parquet import read_matrix_parquet
from locusformer.io.results import make_result
from locusformer.pp.loci import shuffle_loci
from locusformer.scoring.metrics import score_method
from locusformer.scoring.tables import SUMMARY_COLUMNS
from locusformer.train.loop import split_params, train_corrector

ROOT = Path(__file__).resolve().parents[2]
BATCH, LABEL = "batch", "cell_line"


def _score(result: ad.AnnData, uncorrected: ad.AnnData, seed: int) -> pd.DataFrame:
    return score_method(result, uncorrected, BATCH, LABEL, seed=seed)


def run_task(
    task: str, source: Path, variant: str, seed: int, out: Path, baselines: bool = True
) -> None:
    ordered = read_matrix_parquet(source / "ordered.parquet", "ordered matrix")
    loci = pd.read_parquet(source / "loci.parquet")
    if VARIANTS[variant].get("loci", {}).get("order") == "shuffled":
        loci = shuffle_loci(loci, seed)  # as order-loci --order shuffled --seed does
        ordered = ordered[loci["gene_id"].astype(str).tolist()]
    samples = pd.read_csv(source / "samples.tsv", sep="\t", index_col=0, dtype=str)
    samples.index = samples.index.astype(str)
    samples = samples.loc[ordered.index]
    adata = ad.AnnData(X=ordered.to_numpy(np.float32), obs=samples.copy())
    adata.var_names = ordered.columns
    for key in (BATCH, LABEL):
        adata.obs[key] = adata.obs[key].astype("category")
    counts = read_matrix_parquet(source / "counts.parquet", "count matrix")

    timed: dict[str, tuple[ad.AnnData, float]] = {}
    methods = ["uncorrected", *(VARIANT_BASELINES.get(variant, []) if baselines else [])]
    protect = protected_columns(variant)
    for method in methods:
        covariates = protect if method in label_baselines() else []
        start = time.perf_counter()
        result = run_method(method, adata.copy(), BATCH, seed, counts=counts, covariates=covariates)
        timed[method] = (result, time.perf_counter() - start)

    overrides = VARIANTS[variant]
    params = {"model": overrides.get("model", {}), "train": overrides.get("training", {})}
    model_config, train_config = split_params(params)
    residual = overrides.get("correct", {}).get("add_residual", False)
    start = time.perf_counter()
    model, _ = train_corrector(
        adata.X, samples[BATCH].tolist(), loci, model_config, train_config,
        seed=seed, progress=False,
    )  # fmt: skip
    corrected, latent = correct(model, adata.X, samples[BATCH].tolist(), add_residual=residual)
    seconds = time.perf_counter() - start
    obs = adata.obs
    timed["locusformer"] = (
        make_result(
            corrected, method="locusformer", representation="matrix", obs=obs,
            var_names=adata.var_names, batch_key=BATCH, label_key=LABEL,
        ),
        seconds,
    )  # fmt: skip
    timed["locusformer_latent"] = (
        make_result(
            None, method="locusformer_latent", representation="embedding", obs=obs,
            embedding=latent, batch_key=BATCH, label_key=LABEL,
        ),
        seconds,
    )  # fmt: skip

    uncorrected = timed["uncorrected"][0]
    tables, rows = [], []
    for method, (result, secs) in timed.items():
        table = _score(result, uncorrected, seed)
        tables.append(table)
        value = table.set_index("metric")["value"]
        status = str(result.uns.get("status", "ok"))
        rows.append({
            "dataset": task, "method": method, "batch": value["Batch correction"],
            "bio": value["Bio conservation"], "total": value["Total"], "status": status,
            "error": result.uns.get("error", ""), "wall_s": secs, "max_rss_mb": np.nan,
        })  # fmt: skip
        print(f"[inprocess] {variant} seed {seed} {task} {method}: total {value['Total']:.3f}")
    results = out / "runs" / variant / f"seed{seed}" / "results"
    (results / task).mkdir(parents=True, exist_ok=True)
    pd.concat(tables).to_csv(results / task / "metrics.tsv", sep="\t", index=False)
    summary = results / "summary.tsv"
    frame = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    if summary.exists():
        old = pd.read_csv(summary, sep="\t")
        frame = pd.concat([old[old["dataset"] != task], frame], ignore_index=True)
    frame.to_csv(summary, sep="\t", index=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "quality")
    parser.add_argument("--source", type=Path, default=None, help="a run.py run's results/")
    parser.add_argument("--tasks", nargs="+", default=["protocols", "cellbench5"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--variants", nargs="+", default=["default"], choices=list(VARIANTS))
    parser.add_argument(
        "--no-baselines", action="store_true", help="LocusFormer and uncorrected only"
    )
    args = parser.parse_args()
    source = args.source or args.out / "runs" / "default" / "seed0" / "results"
    for variant in args.variants:
        for seed in args.seeds:
            for task in args.tasks:
                if not (source / task / "ordered.parquet").exists():
                    sys.exit(f"{source / task}/ordered.parquet not found: run run.py first")
                run_task(task, source / task, variant, seed, args.out, not args.no_baselines)


if __name__ == "__main__":
    main()
