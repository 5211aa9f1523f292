"""Outputs to score: each method's corrected matrix or embedding on prepared quality tasks.

Reads a task the workflow has prepared (``<prepared>/results/<task>/`` with ordered.parquet,
loci.parquet, samples.tsv, counts.parquet, as ``benchmarks/quality/variants.py`` leaves
them; read only) and its raw count table (``<prepared>/data/<task>_counts.tsv.gz``, genes x
samples), and writes under ``--out``/<task>/:

* ``lognorm.h5ad``: the uncorrected data, log-normalized over every gene expressed in at
  least 3 samples (library size over those genes, 1e4, log1p: the workflow's normalize
  before it picks genes), with ``batch`` and ``cell_line`` in obs. The independent scorer
  picks its own gene set from this;
* ``seed<k>/<method>.h5ad``: each method's integration result as the workflow makes it
  (``--baselines``, by default ``uncorrected``, ``combat``, ``harmony``, ``scvi`` and
  ``sysvi``, with ``locusformer.baselines.methods.run_method``; ``locusformer``, the
  corrected matrix of LocusFormer trained at its defaults, and ``locusformer_latent``, its
  latent, both from one model), with the seconds each took. An output already there is
  kept, so an interrupted run goes on where it stopped and tasks can be split across
  processes.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/scoring/produce.py \\
        --prepared benchmarks/out/cb --out benchmarks/out/indep \\
        --tasks mixture mixture_pooled protocols cellbench5 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "quality"))
from variants import load_task

sys.path.insert(0, str(Path(__file__).resolve().parent))
from independent import OUTPUTS

BASELINES = ("uncorrected", "combat", "harmony", "scvi", "sysvi")
ROOT = Path(__file__).resolve().parents[2]
PREPARED = ROOT / "benchmarks" / "out" / "variants"  # variants.py's --work


def lognorm(prepared: Path, task: str, obs: pd.DataFrame) -> ad.AnnData:
    """The task's raw counts, log-normalized as the workflow's normalize does before it
    picks genes (genes in >= 3 samples, library over those, 1e4, log1p); obs in ``obs``'s
    order."""
    import scanpy as sc

    counts = pd.read_csv(prepared / "data" / f"{task}_counts.tsv.gz", sep="\t", index_col=0)
    counts = counts[obs.index]
    adata = ad.AnnData(X=counts.T.to_numpy(np.float32), obs=obs.copy())
    adata.var_names = counts.index.astype(str)
    sc.pp.filter_genes(adata, min_cells=3)
    sc.pp.normalize_total(adata, target_sum=1e4)
    sc.pp.log1p(adata)
    adata.uns.pop("log1p", None)
    return adata


def produce(
    task: str, seeds: list[int], prepared: Path, out: Path, baselines: tuple[str, ...] = BASELINES
) -> None:
    import torch

    from locusformer.baselines.methods import run_method
    from locusformer.infer.correct import correct
    from locusformer.io.parquet import read_matrix_parquet
    from locusformer.io.results import make_result
    from locusformer.train.loop import train_corrector

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    d = prepared / "results" / task
    adata, loci, samples = load_task(prepared, task)
    (out / task).mkdir(parents=True, exist_ok=True)
    full = out / task / "lognorm.h5ad"
    if not full.exists():
        log_data = lognorm(prepared, task, adata.obs)
        # The workflow's normalized genes are these values (a check that both normalize alike).
        same = np.abs(log_data[:, adata.var_names].X - adata.X).max()
        print(f"{task}: lognorm {log_data.shape}, max |diff| on the workflow's genes {same:.2e}")
        log_data.write_h5ad(full)
    counts = read_matrix_parquet(d / "counts.parquet", "count matrix")
    for seed in seeds:
        where = out / task / f"seed{seed}"
        where.mkdir(exist_ok=True)
        for method in baselines:
            if (where / f"{method}.h5ad").exists():
                continue
            start = time.perf_counter()
            result = run_method(method, adata.copy(), "batch", seed, counts=counts)
            result.uns["seconds"] = time.perf_counter() - start
            result.write_h5ad(where / f"{method}.h5ad")
            print(f"{task}\tseed {seed}\t{method}\t{result.uns['seconds']:.1f} s", flush=True)
        if (where / "locusformer_latent.h5ad").exists():
            continue
        start = time.perf_counter()
        model, _ = train_corrector(
            adata.X, samples["batch"].tolist(), loci, None, None, seed=seed, progress=False
        )
        corrected, latent = correct(model, adata.X, samples["batch"].tolist())
        seconds = time.perf_counter() - start
        common = {"obs": adata.obs, "batch_key": "batch", "label_key": "cell_line"}
        matrix = make_result(
            corrected, method="locusformer", representation="matrix",
            var_names=adata.var_names, uns={"seconds": seconds}, **common,
        )  # fmt: skip
        matrix.write_h5ad(where / "locusformer.h5ad")
        emb = make_result(
            None, method="locusformer_latent", representation="embedding", embedding=latent,
            uns={"seconds": seconds}, **common,
        )  # fmt: skip
        emb.write_h5ad(where / "locusformer_latent.h5ad")
        print(f"{task}\tseed {seed}\tlocusformer\t{seconds:.1f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepared", type=Path, default=PREPARED)
    parser.add_argument("--out", type=Path, default=OUTPUTS)
    parser.add_argument("--tasks", nargs="+", default=["mixture"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--baselines", nargs="+", default=list(BASELINES))
    args = parser.parse_args()
    for task in args.tasks:
        produce(task, args.seeds, args.prepared, args.out, tuple(args.baselines))


if __name__ == "__main__":
    main()
