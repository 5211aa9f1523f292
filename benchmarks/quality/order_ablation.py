"""When does genomic order help? Order, positional encoding and patch size on simulations.

The ablations on real data found shuffled loci scoring as the genomic order does. This
asks where the premise holds: :func:`locusformer.simulate.datasets.simulate` data (in memory,
group markers in contiguous blocks of loci) with a gene-wise batch effect (every locus its
own shift and scale) and with a regional one (one shift and scale per batch on segments of
about 30 consecutive loci, as position-dependent artefacts act). On each, LocusFormer runs
in the genomic order and on the same loci shuffled (:func:`locusformer.pp.loci.shuffle_loci`:
the loci table and the matrix's columns permuted together, so a token's position is its
index in the shuffled order), with the sinusoidal, a learned or no positional encoding, and
patches of 8 to 64 loci (:data:`CONFIGS`, ten per effect, plus the uncorrected data).

Training is the default but for ``min_steps`` (:data:`TRAIN`). Scores are the workflow's
metrics in process (``metrics.score_method``: total = 0.4 batch + 0.6 bio), with the
simulation's group as the biology. One row per (effect, order, encoding, patch, seed) is
appended to ``--out``, so an interrupted run resumes where it stopped; ``--table`` prints
mean ± sd per configuration and the paired difference from the default (genomic,
sinusoidal, patch 32)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/order_ablation.py
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/order_ablation.py --seeds 0 \\
        --effects regional --configs genomic/sinusoidal/32 shuffled/sinusoidal/32
    .venv/bin/python benchmarks/quality/order_ablation.py --table

The seed draws the simulation, the shuffle and the training, so the spread is over data
sets as well as runs; the paired difference compares configurations on the same data.
"""

from __future__ import annotations

import argparse
import csv
import os
import time
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ["effect", "order", "encoding", "patch", "seed", "batch", "bio", "total", "seconds"]
KEY = ["effect", "order", "encoding", "patch", "seed"]
Effect = Literal["gene", "regional", "both"]
Order = Literal["genomic", "shuffled", "uncorrected"]  # uncorrected: the data, no model
Encoding = Literal["sinusoidal", "learned", "none", "-"]
# Sized for well under a minute of training on one thread; four groups, three batches.
SIMULATION = dict(n_samples=600, n_loci=512, n_batches=3, n_groups=4, region_size=30.0)
# The default training but for its floor of updates: 600 samples give 9 steps an epoch and
# 360 in all, after which the batch was still fully predictable from the corrected matrix
# (held-out logistic regression, regional effect, seed 0: 1.00; three batches, chance
# 0.33); with 1000 steps 0.43, the groups kept (1.00), in 31 s.
TRAIN = {"min_steps": 1000}


class Config(NamedTuple):
    order: Order
    encoding: Encoding
    patch: int

    @property
    def name(self) -> str:
        return f"{self.order}/{self.encoding}/{self.patch}"


REFERENCE = Config("genomic", "sinusoidal", 32)  # the defaults
# Every patch size in the genomic order; the encodings at the default patch in both
# orders; and the smallest patch shuffled, where a token's loci matter most.
CONFIGS = [
    *(Config("genomic", "sinusoidal", p) for p in (8, 16, 32, 64)),
    Config("genomic", "learned", 32),
    Config("genomic", "none", 32),
    *(Config("shuffled", e, 32) for e in ("sinusoidal", "learned", "none")),
    Config("shuffled", "sinusoidal", 8),
]
UNCORRECTED = Config("uncorrected", "-", 0)


def done_keys(out: Path) -> set[tuple[str, ...]]:
    """The (effect, order, encoding, patch, seed) of the rows already in ``out``."""
    if not out.exists():
        return set()
    rows = pd.read_csv(out, sep="\t", dtype=str)
    return {tuple(r) for r in rows[KEY].itertuples(index=False)}


def append_row(out: Path, row: dict[str, object]) -> None:
    new = not out.exists()
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a", newline="") as handle:
        writer = csv.DictWriter(handle, COLUMNS, delimiter="\t", lineterminator="\n")
        if new:
            writer.writeheader()
        writer.writerow(row)
    print("\t".join(str(row[c]) for c in COLUMNS), flush=True)


def key_of(effect: str, config: Config, seed: int) -> tuple[str, ...]:
    return (effect, config.order, config.encoding, str(config.patch), str(seed))


def run_effect(effect: Effect, seed: int, configs: list[Config], out: Path) -> None:
    """Simulate once, score the uncorrected data and each missing configuration."""
    from locusformer.infer.correct import correct
    from locusformer.io.results import make_result
    from locusformer.pp.loci import shuffle_loci
    from locusformer.scoring.metrics import score_method
    from locusformer.simulate.datasets import simulate
    from locusformer.train.loop import train_corrector

    done = done_keys(out)
    todo = [c for c in [UNCORRECTED, *configs] if key_of(effect, c, seed) not in done]
    if not todo:
        return
    sim = simulate(**SIMULATION, batch_effect=effect, seed=seed)
    genes = sim.loci["gene_id"].astype(str).tolist()
    obs = pd.DataFrame(
        {"batch": [f"batch{b + 1}" for b in sim.batch], "group": [f"g{k}" for k in sim.group]},
        index=[f"s{i:04d}" for i in range(len(sim.batch))],
    ).astype("category")
    labels = obs["batch"].astype(str).tolist()

    def result(matrix: np.ndarray, method: str):
        return make_result(
            matrix, method=method, representation="matrix", obs=obs, var_names=genes,
            batch_key="batch", label_key="group",
        )  # fmt: skip

    uncorrected = result(sim.X, "uncorrected")
    reference: dict = {}  # the uncorrected PCA, computed once for every configuration

    def record(config: Config, corrected: np.ndarray | None, seconds: float) -> None:
        scored_result = uncorrected if corrected is None else result(corrected, config.name)
        scored = score_method(scored_result, uncorrected, "batch", "group", seed, reference)
        value = scored.set_index("metric")["value"]
        row = dict(zip(KEY, key_of(effect, config, seed), strict=True))
        row |= {
            "batch": round(value["Batch correction"], 4),
            "bio": round(value["Bio conservation"], 4),
        }
        row |= {"total": round(value["Total"], 4), "seconds": round(seconds, 1)}
        append_row(out, row)

    for config in todo:
        if config is UNCORRECTED:
            record(config, None, 0.0)
            continue
        loci, X = sim.loci, sim.X
        if config.order == "shuffled":
            # The model's tokens follow the loci table: its columns move with its rows.
            loci = shuffle_loci(sim.loci, seed)
            column = pd.Index(genes).get_indexer(loci["gene_id"].astype(str))
            X = np.ascontiguousarray(sim.X[:, column])
        start = time.perf_counter()
        model, _ = train_corrector(
            X, labels, loci, {"patch_size": config.patch, "positional_encoding": config.encoding},
            TRAIN, seed=seed, device="cpu", progress=False,
        )  # fmt: skip
        corrected, _ = correct(model, X, labels, device="cpu")
        seconds = time.perf_counter() - start
        if config.order == "shuffled":
            back = np.empty_like(corrected)
            back[:, column] = corrected  # the genomic order again, as uncorrected's
            corrected = back
        record(config, corrected, seconds)


def table(out: Path) -> None:
    """Markdown: per effect, mean ± sd of each score and the paired total difference."""
    rows = pd.read_csv(out, sep="\t", dtype={"patch": str, "seed": str})
    rows = rows.drop_duplicates(KEY, keep="last")
    rows["config"] = rows["order"] + "/" + rows["encoding"] + "/" + rows["patch"]
    rows.loc[rows["order"] == "uncorrected", "config"] = "uncorrected"
    order = ["uncorrected", *(c.name for c in CONFIGS)]

    def spread(values: pd.Series, sign: str = "") -> str:
        mean = format(values.mean(), f"{sign}.3f")
        return f"{mean} ± {values.std():.3f}" if len(values) > 1 else mean

    for effect, group in rows.groupby("effect", sort=False):
        ref = group[group["config"] == REFERENCE.name].set_index("seed")["total"]
        lines = []
        for name, runs in group.groupby("config"):
            # Paired by seed: the same simulated data set on both sides.
            paired = (runs.set_index("seed")["total"] - ref).dropna()
            delta = "" if name == REFERENCE.name or paired.empty else spread(paired, "+")
            lines.append(
                {
                    "configuration": name,
                    "seeds": len(runs),
                    "batch": spread(runs["batch"]),
                    "bio": spread(runs["bio"]),
                    "total": spread(runs["total"]),
                    f"Δ total vs {REFERENCE.name}": delta,
                    "seconds": round(runs["seconds"].median(), 1),
                }
            )
        frame = pd.DataFrame(lines).set_index("configuration")
        frame = frame.reindex(
            [n for n in order if n in frame.index] + sorted(set(frame.index) - set(order))
        )
        print(f"\n#### {effect} batch effect\n")
        print(frame.to_markdown(disable_numparse=True))  # keeps "+" and "±" as written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "out" / "order_ablation.tsv"
    )
    parser.add_argument(
        "--effects", nargs="+", default=["gene", "regional"], choices=["gene", "regional", "both"]
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    names = [c.name for c in CONFIGS]
    parser.add_argument(
        "--configs",
        nargs="+",
        default=names,
        choices=names,
        metavar="ORDER/ENCODING/PATCH",
        help=f"a subset of {', '.join(names)} (default all)",
    )
    parser.add_argument("--table", action="store_true", help="print the tables and stop")
    args = parser.parse_args()
    if args.table:
        table(args.out)
        return
    import torch

    # One thread unless told otherwise: the machine is shared, and times stay comparable.
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    configs = [c for c in CONFIGS if c.name in args.configs]
    for seed in args.seeds:
        for effect in args.effects:
            run_effect(effect, seed, configs, args.out)


if __name__ == "__main__":
    main()
