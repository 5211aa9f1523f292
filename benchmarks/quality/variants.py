"""LocusFormer variants and the baselines on the quality tasks, in one process per call.

Prepares each task once with the workflow's own normalize and order-loci rules (into
``--work``), then trains and scores in process, appending one row per (task, method or
variant, seed) to ``--work``/results.tsv: batch, bio and total as the workflow's metrics
compute them, and the seconds (train + correct; they depend on the machine's load). A
variant is JSON: ``{"training": {...}, "model": {...}, "protect": "cell_line"}``, with an
optional ``"name"`` that stands for it in the table. Every metric of each row goes to
``--work``/details.tsv (task, method, seed, metric, value).

    .venv/bin/python benchmarks/quality/variants.py --tasks cellbench5_inner --seeds 0 \\
        --variant '{}' --variant '{"training": {"alignment": "shared"}}'
    .venv/bin/python benchmarks/quality/variants.py --tasks protocols --baselines
    .venv/bin/python benchmarks/quality/variants.py --tasks protocols --baselines harmony sysvi
    .venv/bin/python benchmarks/quality/variants.py --table

Needs ``../shared/data`` (the CellBench files).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from provenance import record_run
from tasks import TASKS, write_task

ROOT = Path(__file__).resolve().parents[2]
BASELINES = ["uncorrected", "combat", "harmony", "scvi", "sysvi", "combat_mod"]
COLUMNS = ["task", "method", "seed", "batch", "bio", "total", "seconds"]


def prepare(tasks: list[str], shared: Path, work: Path) -> None:
    rows = pd.DataFrame([write_task(t, shared, work / "data") for t in tasks])
    sheet = work / "config" / "datasets.tsv"
    sheet.parent.mkdir(parents=True, exist_ok=True)
    # The sheet keeps every task prepared in --work, so that two calls on different
    # tasks can run at once (rewritten with only its own, one call's sheet lacked the
    # other's rule).
    if sheet.exists():
        old = pd.read_csv(sheet, sep="\t", dtype=str)
        rows = pd.concat([old[~old["name"].isin(rows["name"])], rows.astype(str)])
    rows.to_csv(sheet, sep="\t", index=False)
    config = {"datasets": "config/datasets.tsv", "seed": 0, "baselines": []}
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    files = ("ordered.parquet", "loci.parquet", "counts.parquet", "samples.tsv")
    targets = [f"results/{t}/{f}" for t in tasks for f in files]
    snakemake = str(Path(sys.executable).parent / "snakemake")
    subprocess.run(
        [snakemake, *targets, "--snakefile", str(ROOT / "workflow" / "Snakefile"),
         "--directory", str(work), "--cores", "2", "--quiet", "rules"],
        check=True,
    )  # fmt: skip


def load_task(work: Path, task: str) -> tuple[ad.AnnData, pd.DataFrame, pd.DataFrame]:
    """A prepared task: the ordered matrix as an AnnData (batch and cell line categorical in
    ``obs``), its loci table and its sample table in the matrix's order."""
    from locusformer.io.parquet import read_matrix_parquet

    d = work / "results" / task
    ordered = read_matrix_parquet(d / "ordered.parquet", "ordered matrix")
    loci = pd.read_parquet(d / "loci.parquet")
    samples = pd.read_csv(d / "samples.tsv", sep="\t", index_col=0, dtype=str).loc[ordered.index]
    adata = ad.AnnData(X=ordered.to_numpy(np.float32), obs=samples.copy())
    adata.var_names = ordered.columns
    for key in ("batch", "cell_line"):
        adata.obs[key] = adata.obs[key].astype("category")
    return adata, loci, samples


def run(task: str, seeds: list[int], variants: list[str], baselines: list[str], work: Path) -> None:
    import torch

    from locusformer.baselines.methods import run_method
    from locusformer.infer.correct import correct
    from locusformer.io.parquet import read_matrix_parquet
    from locusformer.io.results import make_result
    from locusformer.scoring.metrics import score_method
    from locusformer.train.alignment import covariate_levels
    from locusformer.train.loop import train_corrector

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    d = work / "results" / task
    adata, loci, samples = load_task(work, task)
    uncorrected = run_method("uncorrected", adata.copy(), "batch", 0)
    out = work / "results.tsv"

    def record(method: str, seed: int, result, seconds: float) -> None:
        v = score_method(result, uncorrected, "batch", "cell_line", seed=seed)
        v = v.set_index("metric")["value"]
        row = [task, method, seed, v["Batch correction"], v["Bio conservation"], v["Total"]]
        line = "\t".join(map(str, [*row, round(seconds, 1)]))
        print(line, flush=True)
        with open(out, "a") as fh:
            fh.write(line + "\n")
        # Every metric (isolated labels among them: the plate-only lines kept apart).
        with open(work / "details.tsv", "a") as fh:
            fh.writelines(f"{task}\t{method}\t{seed}\t{k}\t{x}\n" for k, x in v.items())

    for seed in seeds:
        if baselines:
            counts = read_matrix_parquet(d / "counts.parquet", "count matrix")
            for method in baselines:
                start = time.perf_counter()
                covariates = ["cell_line"] if method == "combat_mod" else ()
                result = run_method(
                    method, adata.copy(), "batch", seed, counts=counts, covariates=covariates
                )
                record(method, seed, result, time.perf_counter() - start)
        for variant in variants:
            spec = json.loads(variant)
            protect = spec.pop("protect", None)
            label = spec.pop("name", None)  # names a variant in the table instead of its JSON
            levels = covariate_levels(samples, [protect]) if protect else None
            start = time.perf_counter()
            model, _ = train_corrector(
                adata.X, samples["batch"].tolist(), loci, spec.get("model"),
                spec.get("training"), seed=seed, progress=False, covariates=levels,
            )  # fmt: skip
            corrected, _ = correct(model, adata.X, samples["batch"].tolist())
            seconds = time.perf_counter() - start
            name = f"locusformer {label or variant}" + (f" protect={protect}" if protect else "")
            matrix = make_result(
                corrected, method="locusformer", representation="matrix", obs=adata.obs,
                var_names=adata.var_names, batch_key="batch", label_key="cell_line",
            )  # fmt: skip
            record(name, seed, matrix, seconds)


def table(work: Path) -> None:
    rows = pd.read_csv(work / "results.tsv", sep="\t", header=None, names=COLUMNS)
    rows = rows.drop_duplicates(["task", "method", "seed"], keep="last")
    for task, group in rows.groupby("task"):
        print(f"\n#### {task}\n")
        agg = group.groupby("method").agg(
            seeds=("seed", "count"), batch=("batch", "mean"), bio=("bio", "mean"),
            total=("total", "mean"), sd=("total", "std"), seconds=("seconds", "median"),
        )  # fmt: skip
        print(agg.sort_values("total", ascending=False).round(3).to_markdown())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "out" / "variants")
    parser.add_argument("--tasks", nargs="+", default=["cellbench5_inner"], choices=TASKS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--variant", action="append", default=[], help="JSON overrides")
    parser.add_argument(
        "--baselines", nargs="*", choices=BASELINES, default=None,
        help="baselines to run beside the variants (all of them when given alone)",
    )  # fmt: skip
    parser.add_argument("--table", action="store_true", help="print the tables and stop")
    args = parser.parse_args()
    if args.table:
        table(args.work)
        return
    prepare(args.tasks, args.shared, args.work)
    record_run(args.work, {k: vars(args)[k] for k in ("tasks", "seeds", "variant", "baselines")})
    # Given alone, --baselines runs all of them.
    baselines = BASELINES if args.baselines == [] else args.baselines or []
    for task in args.tasks:
        run(task, args.seeds, args.variant, baselines, args.work)


if __name__ == "__main__":
    main()
