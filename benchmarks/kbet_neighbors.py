"""kBET per label with the diffusion map's neighbours from pynndescent and found exactly.

scib-metrics' ``kbet_per_label`` takes each label's neighbours in a diffusion-map embedding
from pynndescent; ``locusformer.scoring.neighbors.exact_diffusion_neighbors`` finds them exactly
below 20,000 samples, as every other graph the workflow scores. This script scores kBET
both ways on the same representation and prints each label's values side by side, with
the time of each call (the first pynndescent call pays numba's compilation).

    # the demo's results, after `make run`
    .venv/bin/python benchmarks/kbet_neighbors.py --results results/cellbench_demo/integrated \\
        --batch-key protocol --label-key cell_line
    # quality tasks: uncorrected, ComBat, Harmony and LocusFormer (seed 0) of each
    .venv/bin/python benchmarks/kbet_neighbors.py --tasks protocols cellbench5_inner

Needs ``../shared/data`` for ``--tasks`` (the tasks of ``benchmarks/quality/tasks.py``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "quality"))


def compare(name: str, result, uncorrected, batch_key: str, label_key: str, seed: int) -> list:
    import scib_metrics

    from locusformer.scoring.metrics import scoring_representation
    from locusformer.scoring.neighbors import (
        compute_neighbors,
        exact_diffusion_neighbors,
        neighbor_sizes,
        seeded_eigsh,
    )

    scib_metrics.settings.verbosity = 30
    x = scoring_representation(result, seed)
    batches = result.obs[batch_key].astype(str).to_numpy()
    labels = result.obs[label_key].astype(str).to_numpy()
    sizes = neighbor_sizes(result.n_obs)
    nn = compute_neighbors(x, sizes.lisi, seed).subset_neighbors(sizes.kbet)
    runs = {}
    for how in ("pynndescent", "exact"):
        started = time.perf_counter()
        with seeded_eigsh(seed):
            if how == "exact":
                with exact_diffusion_neighbors():
                    score, df = scib_metrics.kbet_per_label(nn, batches, labels, return_df=True)
            else:
                score, df = scib_metrics.kbet_per_label(nn, batches, labels, return_df=True)
        runs[how] = (score, df.set_index("cluster")["kBET"], time.perf_counter() - started)
    rows = []
    for label in runs["exact"][1].index:
        a, b = runs["pynndescent"][1][label], runs["exact"][1][label]
        rows.append([name, label, a, b])
    a, b = runs["pynndescent"][0], runs["exact"][0]
    rows.append([name, "(kBET)", a, b])
    seconds = f"{runs['pynndescent'][2]:.1f} / {runs['exact'][2]:.1f} s"
    print(f"{name}: kBET {a:.6f} (pynndescent) {b:.6f} (exact), {seconds}", flush=True)
    return rows


def demo(results: Path, batch_key: str, label_key: str, seed: int) -> list:
    from locusformer.scoring.result_rows import read_result

    uncorrected = read_result(results / "uncorrected.h5ad")
    rows = []
    for path in sorted(results.glob("*.h5ad")):
        rows += compare(path.stem, read_result(path), uncorrected, batch_key, label_key, seed)
    return rows


def tasks(names: list[str], shared: Path, work: Path, seed: int) -> list:
    import anndata as ad
    from variants import prepare

    from locusformer.baselines.methods import run_method
    from locusformer.infer.correct import correct
    from locusformer.io.parquet import read_matrix_parquet
    from locusformer.io.results import make_result
    from locusformer.train.loop import train_corrector

    prepare(names, shared, work)
    rows = []
    for task in names:
        d = work / "results" / task
        ordered = read_matrix_parquet(d / "ordered.parquet", "ordered matrix")
        loci = pd.read_parquet(d / "loci.parquet")
        samples = pd.read_csv(d / "samples.tsv", sep="\t", index_col=0, dtype=str)
        samples = samples.loc[ordered.index]
        adata = ad.AnnData(X=ordered.to_numpy(np.float32), obs=samples.copy())
        adata.var_names = ordered.columns
        uncorrected = run_method("uncorrected", adata.copy(), "batch", seed)
        for method in ("uncorrected", "combat", "harmony"):
            result = run_method(method, adata.copy(), "batch", seed)
            rows += compare(f"{task}/{method}", result, uncorrected, "batch", "cell_line", seed)
        batches = samples["batch"].tolist()
        model, _ = train_corrector(adata.X, batches, loci, seed=seed, progress=False)
        corrected, _ = correct(model, adata.X, batches)
        result = make_result(
            corrected, method="locusformer", representation="matrix", obs=adata.obs,
            var_names=adata.var_names, batch_key="batch", label_key="cell_line",
        )  # fmt: skip
        rows += compare(f"{task}/locusformer", result, uncorrected, "batch", "cell_line", seed)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, help="a dataset's results/.../integrated")
    parser.add_argument("--batch-key", default="batch")
    parser.add_argument("--label-key", default="cell_line")
    parser.add_argument("--tasks", nargs="*", default=[])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "out" / "kbet")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="TSV of every label's kBET both ways")
    args = parser.parse_args()
    rows = []
    if args.results:
        rows += demo(args.results, args.batch_key, args.label_key, args.seed)
    if args.tasks:
        rows += tasks(args.tasks, args.shared, args.work, args.seed)
    table = pd.DataFrame(rows, columns=["result", "label", "pynndescent", "exact"])
    same = np.isclose(table["pynndescent"], table["exact"], rtol=0, atol=1e-12, equal_nan=True)
    print(f"{int(same.sum())} of {len(table)} values equal; differing:")
    print(table[~same].to_string(index=False) if (~same).any() else "none")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out, sep="\t", index=False)


if __name__ == "__main__":
    main()
