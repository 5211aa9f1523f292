"""Time and peak memory of the streamed ComBat (locusformer.pp.combat) at atlas
scale (issue 15).

Simulates (numpy, seeded) ``n`` samples x 2,000 genes in float32, 8 batches of unequal
size, each with its own shift and scale per gene, and runs ``locusformer.pp.combat.combat``
with a block size; for ``n <= 50,000`` also ``scanpy.pp.combat`` the way
``baselines._combat`` called it before (float64 AnnData, ``inplace=False``) as the peer.

Each method runs in a child process of its own (the same script, ``--only``), so that
``ru_maxrss`` is that method's peak and not the larger of the two; the child simulates
the same data from the seed. ``input_gb`` is the child's resident size once the input is
built; peak - input is what the method needed on top. With both methods run, the parent
also reports the largest absolute difference of their float32 outputs.

    python benchmarks/combat_scale.py --n 100000
    python benchmarks/combat_scale.py --n 1000000 --block-size 64 --in-place
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

GENES = 2000
BATCHES = 8
PEER_MAX_N = 50_000  # scanpy's float64 copies above this do not fit beside the others


def simulate(n: int, genes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, genes) float32 log-expression-like matrix and (n,) batch codes, built in row
    chunks so that no (n, genes) float64 array is ever made."""
    rng = np.random.default_rng(seed)
    sizes = rng.dirichlet(np.full(BATCHES, 3.0))  # unequal batch shares
    batches = rng.choice(BATCHES, size=n, p=sizes)
    mean = rng.uniform(0.0, 6.0, genes).astype(np.float32)
    spread = rng.uniform(0.3, 2.0, genes).astype(np.float32)
    shift = rng.normal(0.0, 0.8, (BATCHES, genes)).astype(np.float32)
    scale = rng.uniform(0.7, 1.4, (BATCHES, genes)).astype(np.float32)
    x = np.empty((n, genes), dtype=np.float32)
    chunk = 20_000
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        z = rng.standard_normal((b - a, genes), dtype=np.float32)
        bb = batches[a:b]
        x[a:b] = (z * spread + mean + shift[bb]) * scale[bb]
    return x, batches


def rss_gb() -> float:
    """Current resident size (GB), from /proc."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9


def child(args: argparse.Namespace) -> None:
    """Run one method; print a JSON line with its wall time and memory."""
    if args.only == "scanpy":
        import anndata as ad
        import pandas as pd
        import scanpy as sc
    else:
        from locusformer.pp.combat import combat
    x, batches = simulate(args.n, args.genes, args.seed)
    input_gb = rss_gb()
    t0 = time.perf_counter()
    if args.only == "scanpy":
        obs = pd.DataFrame({"batch": batches.astype(str)}, index=[str(i) for i in range(args.n)])
        work = ad.AnnData(X=x.astype(np.float64), obs=obs)
        out = np.asarray(sc.pp.combat(work, key="batch", inplace=False), dtype=np.float32)
    else:
        out = combat(x, batches, block_size=args.block_size, out=x if args.in_place else None)
    wall = time.perf_counter() - t0
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # KiB on Linux
    if args.save:
        np.save(args.save, out)
    print(json.dumps({"wall_s": wall, "input_gb": input_gb, "peak_gb": peak_gb}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="samples")
    parser.add_argument("--genes", type=int, default=GENES)
    parser.add_argument("--block-size", type=int, default=256, help="genes per block")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--in-place", action="store_true", help="write into the input")
    parser.add_argument("--no-peer", action="store_true", help="skip scanpy.pp.combat")
    parser.add_argument("--only", choices=["streamed", "scanpy"], help=argparse.SUPPRESS)
    parser.add_argument("--save", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only:
        child(args)
        return

    methods = ["streamed"]
    if args.n <= PEER_MAX_N and not args.no_peer:
        methods.append("scanpy")
    label = f"block {args.block_size}" + (", in place" if args.in_place else "")
    print(f"n={args.n:,} genes={args.genes:,} batches={BATCHES} float32 input")
    print(f"{'method':<36} {'wall s':>8} {'input GB':>9} {'peak GB':>8} {'peak-input':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        saved = {}
        for method in methods:
            cmd = [sys.executable, __file__, "--only", method, "--n", str(args.n)]
            cmd += ["--genes", str(args.genes), "--seed", str(args.seed)]
            cmd += ["--block-size", str(args.block_size)] + (["--in-place"] * args.in_place)
            if len(methods) > 1:
                saved[method] = str(Path(tmp) / f"{method}.npy")
                cmd += ["--save", saved[method]]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode:
                sys.exit(f"{method} failed ({done.returncode}):\n{done.stderr[-3000:]}")
            res = json.loads(done.stdout.strip().splitlines()[-1])
            name = (
                f"locusformer.pp.combat ({label})" if method == "streamed" else "scanpy.pp.combat"
            )
            extra = res["peak_gb"] - res["input_gb"]
            print(
                f"{name:<36} {res['wall_s']:>8.1f} {res['input_gb']:>9.2f} "
                f"{res['peak_gb']:>8.2f} {extra:>10.2f}"
            )
        if len(saved) == 2:
            a, b = (np.load(p) for p in saved.values())
            print(f"largest |streamed - scanpy|: {np.abs(a - b).max():.3g}")


if __name__ == "__main__":
    main()
