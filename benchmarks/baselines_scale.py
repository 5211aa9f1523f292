"""Wall time and peak memory of the baseline rules at atlas scale (issue 15).

Writes ``--n`` samples x ``--loci`` loci (default 1,000,000 x 2,000) of float32 gaussian
log-expression, ``--groups`` cell groups and ``--batches`` batches of unequal size, each
batch with its own shift and scale per locus, as ``ordered.parquet`` (through
``locusformer.io.parquet.matrix_parquet_writer``, one row block at a time: the parent never
holds the matrix) and ``samples.tsv``. Then it runs each method as the workflow's baseline
rule does, ``python -m locusformer baseline --method M ...``, in a child process of its
own, and prints its wall seconds and peak resident size (the child's ``ru_maxrss`` from
``os.wait4``) beside the size of the float32 matrix, which the rule must hold once.

``--compare`` (at most 200,000 samples: it makes float64 copies) also measures, in a
child, how far the streamed paths that the baselines take above
``baselines.STREAM_VALUES`` are from the in-memory ones: the streamed PCA
(``pca.pca_scaled_blocks``) against sklearn's ARPACK PCA of the explicitly scaled matrix,
and Harmony's embedding from the rule against the one from the in-memory path.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/baselines_scale.py --n 100000 --compare
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/baselines_scale.py  # 1M: ~8 GB input
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from child_steps import run_child

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("uncorrected", "combat", "harmony")
BLOCK_ROWS = 20_000
COMPARE_MAX_N = 200_000


def write_inputs(args: argparse.Namespace) -> None:
    """ordered.parquet and samples.tsv, simulated and written one row block at a time."""
    import pandas as pd

    from locusformer.io.parquet import matrix_parquet_writer

    rng = np.random.default_rng(args.seed)
    share = rng.dirichlet(np.full(args.batches, 3.0))  # unequal batch sizes
    batch = rng.choice(args.batches, size=args.n, p=share)
    group = rng.integers(0, args.groups, args.n)
    loci = args.loci
    mean = rng.uniform(0.0, 6.0, loci).astype(np.float32)
    centers = rng.normal(0.0, 1.5, (args.groups, loci)).astype(np.float32)
    shift = rng.normal(0.0, 0.8, (args.batches, loci)).astype(np.float32)
    scale = rng.uniform(0.7, 1.4, (args.batches, loci)).astype(np.float32)
    ids = np.array([f"s{i:07d}" for i in range(args.n)], dtype=object)
    genes = pd.Index([f"L{j:05d}" for j in range(loci)])
    with matrix_parquet_writer(args.dir / "ordered.parquet", genes) as write:
        for a in range(0, args.n, BLOCK_ROWS):
            b = min(a + BLOCK_ROWS, args.n)
            x = rng.standard_normal((b - a, loci), dtype=np.float32)
            x += mean + centers[group[a:b]] + shift[batch[a:b]]
            x *= scale[batch[a:b]]
            write(x, pd.Index(ids[a:b]))
    pd.DataFrame(
        {"sample_id": ids, "batch": [f"b{b}" for b in batch], "label": [f"g{g}" for g in group]}
    ).to_csv(args.dir / "samples.tsv", sep="\t", index=False)


def compare(args: argparse.Namespace) -> None:
    """Streamed against in-memory: PCA scores and Harmony embeddings (printed as JSON)."""
    import anndata as ad

    from locusformer.baselines import methods as baselines
    from locusformer.pp.pca import n_pcs, pca, pca_scaled_blocks
    from locusformer.steps.baseline import load_normalized

    adata = load_normalized(
        args.dir / "ordered.parquet", args.dir / "samples.tsv", "batch", "label"
    )
    x = adata.X
    k = n_pcs(*x.shape)
    t0 = time.perf_counter()
    streamed = pca_scaled_blocks(x, k)
    t_streamed = time.perf_counter() - t0
    x64 = x.astype(np.float64)
    sd = x64.std(axis=0, ddof=1)
    sd[sd == 0] = 1.0
    x64 -= x64.mean(axis=0)
    x64 /= sd
    np.clip(x64, -10, 10, out=x64)
    t0 = time.perf_counter()
    arpack = pca(x64, k, seed=0)
    t_arpack = time.perf_counter() - t0
    del x64
    rel = np.abs(streamed - arpack).max(axis=0) / np.abs(arpack).max(axis=0)
    baselines.STREAM_VALUES = 10**18  # the in-memory path, whatever the size
    in_memory = baselines.run_method("harmony", adata, "batch", seed=0).obsm["X_emb"]
    rule = ad.read_h5ad(args.dir / "harmony.h5ad").obsm["X_emb"]
    emb = np.abs(rule - in_memory)
    row = {
        "pca_streamed_s": round(t_streamed, 1),
        "pca_arpack_s": round(t_arpack, 1),
        "pca_max_rel_diff": float(rel.max()),
        "pca_max_rel_diff_first_10": float(rel[:10].max()),
        "pca_components_rel_diff_over_1e-6": int((rel > 1e-6).sum()),
        "harmony_max_abs_diff": float(emb.max()),
        "harmony_max_abs_diff_rel_to_range": float(emb.max() / np.abs(in_memory).max()),
        "harmony_rms_diff_rel_to_rms": float(np.sqrt((emb**2).mean() / (in_memory**2).mean())),
    }
    print(json.dumps(row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="samples")
    parser.add_argument("--loci", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--groups", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", type=Path, default=None, help="default benchmarks/out/...")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--compare", action="store_true", help="streamed vs in-memory paths")
    parser.add_argument("--keep", action="store_true", help="keep the results (h5ad)")
    parser.add_argument("--reuse", action="store_true", help="reuse the written inputs")
    parser.add_argument("--compare-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dir is None:
        args.dir = ROOT / "benchmarks" / "out" / f"baselines_scale_{args.n}"
    if args.compare_only:
        compare(args)
        return
    if args.compare and (args.n > COMPARE_MAX_N or "harmony" not in args.methods):
        sys.exit(f"--compare needs harmony among the methods and --n <= {COMPARE_MAX_N:,}")
    args.dir.mkdir(parents=True, exist_ok=True)

    matrix_gb = args.n * args.loci * 4 / 1e9
    print(f"n={args.n:,} loci={args.loci:,} batches={args.batches} groups={args.groups}")
    print(f"float32 matrix: {matrix_gb:.2f} GB; files in {args.dir}", flush=True)
    if not (args.reuse and (args.dir / "ordered.parquet").exists()):
        t0 = time.perf_counter()
        write_inputs(args)
        size = (args.dir / "ordered.parquet").stat().st_size / 1e9
        print(f"wrote ordered.parquet ({size:.2f} GB) in {time.perf_counter() - t0:.1f} s")
    print(f"{'method':<12} {'wall s':>8} {'peak GB':>8} {'peak - matrix GB':>17}", flush=True)
    for method in args.methods:
        out = args.dir / f"{method}.h5ad"
        argv = [sys.executable, "-m", "locusformer", "baseline", "--method", method]
        argv += ["--matrix", str(args.dir / "ordered.parquet")]
        argv += ["--samples", str(args.dir / "samples.tsv"), "--batch-key", "batch"]
        argv += ["--label-key", "label", "--seed", "0", "--out", str(out)]
        row = run_child(method, argv, args.dir / f"{method}.log")
        extra = row["peak_gb"] - matrix_gb
        print(
            f"{method:<12} {row['wall_s']:>8.1f} {row['peak_gb']:>8.2f} {extra:>17.2f}", flush=True
        )
    if args.compare:
        argv = [sys.executable, __file__, "--compare-only", "--dir", str(args.dir)]
        log = args.dir / "compare.log"
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        log.write_text(done.stderr)
        if done.returncode:
            sys.exit(f"compare failed ({done.returncode}):\n{done.stderr[-3000:]}")
        print("streamed vs in-memory:", done.stdout.strip().splitlines()[-1])
    if not args.keep:
        for method in args.methods:
            (args.dir / f"{method}.h5ad").unlink(missing_ok=True)
    if not args.keep and not args.reuse:
        shutil.rmtree(args.dir)


if __name__ == "__main__":
    main()
