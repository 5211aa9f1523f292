"""Every corrector on the simulated suite: one table to choose LocusFormer's defaults on.

For each scenario of :data:`locusformer.simulate.scenarios.SUITE` and each seed, simulates
the counts (truth known), normalizes them as the workflow's ``normalize`` rule does
(:func:`locusformer.pp.normalize.normalize`, ``NormalizeParams()`` defaults), orders the
loci by the simulation's own gene table (:func:`locusformer.pp.loci.order_loci`), runs
every method in process as ``benchmarks/quality/variants.py`` does (the baselines by
``run_method``; LocusFormer trained at its defaults and its corrected matrix scored) and
scores it with the workflow's ``score_method`` against the simulated label. One row per
(scenario, method, seed) is appended to ``--work``/results.tsv (scenario, method, seed,
batch, bio, total, seconds: train + correct, or the baseline's run; they depend on the
machine's load), every metric to ``--work``/details.tsv, and the call with the date,
commit and machine to ``--work``/runs.jsonl.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/simulated/suite.py --work W --seeds 0 1 2
    # a quick look: datasets of at most 300 samples and 500 genes, four methods
    .venv/bin/python benchmarks/simulated/suite.py --work W --seeds 0 --size-scale 0.5 \\
        --max-samples 300 --genes 500 --methods uncorrected combat harmony locusformer
    .venv/bin/python benchmarks/simulated/suite.py --work W --table

``--resume`` skips what ``--work`` has scored already, so a suite too long for one
sitting (three seeds, every corrector: hours on 2 cores) is run in parts.
``--training '{"max_epochs": 10}'`` trains LocusFormer with those overrides; its rows are
then named ``locusformer {"max_epochs": 10}``, not ``locusformer`` (the defaults), so the
table never passes one off as the other.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from provenance import record_run  # noqa: E402
from results_tables import SIMULATED_COLUMNS, simulated_rows, simulated_text  # noqa: E402

from locusformer.simulate.scenarios import (  # noqa: E402
    SUITE,
    Library,
    Scenario,
    simulate_scenario,
)

Method = Literal["uncorrected", "combat", "harmony", "scvi", "sysvi", "locusformer"]
METHODS: tuple[str, ...] = get_args(Method)
BATCH_KEY, LABEL_KEY = "batch", "group"
#: Methods that model counts: not run on a microarray study (as the workflow's baseline
#: step refuses them on log-expression), their cells left empty.
COUNT_METHODS = ("scvi", "sysvi")


def prepare(scenario: Scenario, seed: int):
    """The simulated data set as the workflow would hand it to the correctors.

    Returns
    -------
    The normalized matrix in genomic order (samples x loci AnnData, ``obs`` with batch
    and label), the raw counts of the same samples and loci (scVI's input; None for a
    microarray study, handed over as log-expression) and the loci table.
    """
    import anndata as ad

    from locusformer.pp.loci import order_loci
    from locusformer.pp.normalize import NormalizeParams, normalize

    sim = simulate_scenario(scenario, seed)
    obs = sim.samples.set_index("sample_id")[[BATCH_KEY, LABEL_KEY]].astype("category")
    raw = ad.AnnData(X=sim.values(), obs=obs)
    raw.var_names = sim.genes["gene_id"].to_numpy()
    normalized, _ = normalize(
        raw, sim.value_type, BATCH_KEY, NormalizeParams(), source=str(scenario)
    )
    # The simulation's genes are the annotation: every gene is placed, as a real matrix's
    # genes are by the bundled table.
    annotation = sim.genes[["gene_id", "chrom", "start", "end"]]
    loci, _ = order_loci(normalized.var_names, annotation, "ensembl_id")
    order = loci["gene_id"].tolist()
    ordered = normalized[:, order].copy()
    if "counts" not in ordered.layers:
        return ordered, None, loci
    counts = pd.DataFrame(
        ordered.layers["counts"], index=ordered.obs_names, columns=ordered.var_names
    )
    del ordered.layers["counts"]
    return ordered, counts, loci


def run_one(
    name: str,
    scenario: Scenario,
    seed: int,
    methods: list[str],
    training: dict[str, Any] | None,
    work: Path,
) -> None:
    """Every method on one simulated data set; one row each into ``work``/results.tsv."""
    from locusformer.baselines.methods import run_method
    from locusformer.errors import one_line
    from locusformer.infer.correct import correct
    from locusformer.io.results import make_result
    from locusformer.scoring.metrics import score_method
    from locusformer.train.loop import train_corrector

    adata, counts, loci = prepare(scenario, seed)
    uncorrected = run_method("uncorrected", adata.copy(), BATCH_KEY, 0)
    batches = adata.obs[BATCH_KEY].astype(str).tolist()
    for method in methods:
        if counts is None and method in COUNT_METHODS:
            print(f"{name}\t{method}\t{seed}\tskipped: needs counts", file=sys.stderr)
            continue
        start = time.perf_counter()
        label = method
        try:
            if method == "locusformer":
                # The defaults unless --training says otherwise, and then the name says so.
                label = method_label(method, training)
                model, _ = train_corrector(
                    adata.X, batches, loci, None, training, seed=seed, progress=False
                )
                corrected, _ = correct(model, adata.X, batches)
                result = make_result(
                    corrected, method="locusformer", representation="matrix", obs=adata.obs,
                    var_names=adata.var_names, batch_key=BATCH_KEY, label_key=LABEL_KEY,
                )  # fmt: skip
            else:
                result = run_method(method, adata.copy(), BATCH_KEY, seed, counts=counts)
            seconds = time.perf_counter() - start
            scores = score_method(result, uncorrected, BATCH_KEY, LABEL_KEY, seed=seed)
            values = scores.set_index("metric")["value"]
        except Exception as err:
            # One failure must not end a run of hundreds: the row says it failed (no
            # scores) and the table counts it.
            seconds = time.perf_counter() - start
            print(f"{name}\t{label}\t{seed}\tfailed: {one_line(err)}", file=sys.stderr)
            values = pd.Series({"Batch correction": np.nan, "Bio conservation": np.nan})
            values["Total"] = np.nan
        row = [name, label, seed, values["Batch correction"], values["Bio conservation"]]
        line = "\t".join(map(str, [*row, values["Total"], round(seconds, 1)]))
        print(line, flush=True)
        with open(work / "results.tsv", "a") as fh:
            fh.write(line + "\n")
        with open(work / "details.tsv", "a") as fh:
            fh.writelines(f"{name}\t{label}\t{seed}\t{k}\t{v}\n" for k, v in values.items())


def method_label(method: str, training: dict[str, Any] | None) -> str:
    """The name a method's rows carry: LocusFormer's says which overrides it trained with."""
    if method == "locusformer" and training:
        return f"locusformer {json.dumps(training)}"
    return method


def finished(work: Path) -> set[tuple[str, str, int]]:
    """(scenario, method, seed) of every scored row in ``work``/results.tsv (a row that
    failed, with no total, is not finished)."""
    if not (work / "results.tsv").exists():
        return set()
    rows = simulated_rows(work).dropna(subset=["total"])
    return set(zip(rows["scenario"], rows["method"], rows["seed"].astype(int), strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "out" / "simulated")
    parser.add_argument("--scenarios", nargs="+", default=list(SUITE), choices=list(SUITE))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument(
        "--size-scale", type=float, default=1.0,
        help="multiply every scenario's samples by this (never below 40; Scenario.scaled)",
    )  # fmt: skip
    parser.add_argument("--max-samples", type=int, default=None, help="at most this many")
    parser.add_argument("--genes", type=int, default=None, help="genes instead of 1000")
    parser.add_argument(
        "--library", choices=get_args(Library), default=None,
        help="every scenario with this library (rows then named 'SCENARIO (LIBRARY)')",
    )  # fmt: skip
    parser.add_argument(
        "--training", type=json.loads, default=None,
        help="JSON overrides of LocusFormer's training (rows then named by them)",
    )  # fmt: skip
    parser.add_argument("--table", action="store_true", help="print the table and stop")
    parser.add_argument(
        "--resume", action="store_true",
        help="skip every (scenario, method, seed) already scored in --work",
    )  # fmt: skip
    args = parser.parse_args()
    if args.table:
        print(simulated_text(args.work, simulated_rows(args.work)))
        return
    import torch

    # Threads as the table records them (OMP_NUM_THREADS), not torch's guess.
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    args.work.mkdir(parents=True, exist_ok=True)
    record_run(args.work, {
        k: getattr(args, k)
        for k in (
            "scenarios", "seeds", "methods", "size_scale", "max_samples", "genes", "library",
            "training",
        )
    })  # fmt: skip
    done = finished(args.work) if args.resume else set()
    print("\t".join(SIMULATED_COLUMNS), flush=True)
    for name in args.scenarios:
        scenario = SUITE[name].scaled(
            args.size_scale, max_samples=args.max_samples, n_genes=args.genes
        )
        if args.library is not None:
            scenario = dataclasses.replace(scenario, library=args.library)
            name = f"{name} ({args.library})"
        for seed in args.seeds:
            methods = [
                m for m in args.methods
                if (name, method_label(m, args.training), seed) not in done
            ]  # fmt: skip
            if methods:
                run_one(name, scenario, seed, methods, args.training, args.work)


if __name__ == "__main__":
    main()
