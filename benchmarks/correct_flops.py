"""``correct``'s forward FLOP/s against the machine's fp32 matmul, in one process.

The logic of ``scale.py``'s ``forward_flops``, alone: FLOPs per sample from
``FlopCounterMode`` (plus the fused attention kernel, which it does not see), then seven
timings of ``iter_correct`` on 4096 random samples, each after ``scale.py``'s
``matmul_throughput`` of 2048 x 2048 with the same threads for each fp32 kernel
(``torch.mm``, which calls MKL, and oneDNN's linear, about twice as fast on AMD
machines); medians of each. The ratio is against the faster kernel: the machine's own
fp32 matmul throughput. The code measured is whatever ``locusformer`` imports
(``PYTHONPATH``), so an older checkout can be measured alike.

Usage: ``PYTHONPATH=src python benchmarks/correct_flops.py WORK --threads 2 --chunk-size 64``
where WORK holds ``model.pt`` and ``model.json`` (e.g. a ``scale.py`` run directory).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from scale import attention_flops_per_sample, flops_by_op, matmul_kernels, matmul_throughput

import locusformer
from locusformer.infer.correct import CHUNK_SIZE, iter_correct
from locusformer.model import attention as model_module
from locusformer.model.files import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--chunk-size", type=int, default=CHUNK_SIZE)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    threads, chunk = args.threads, args.chunk_size
    torch.set_num_threads(threads)
    model = load_model(args.work / "model.pt", args.work / "model.json")
    X = np.random.default_rng(0).normal(3, 1, size=(chunk, model.n_loci)).astype(np.float32)
    labels = [model.batch_names[0]] * chunk
    per_sample = sum(flops_by_op(model, X, labels, chunk).values()) / chunk
    per_sample += attention_flops_per_sample(model)

    def matmul(kernel: str) -> float:
        return matmul_throughput(threads=threads, repeats=2, kernel=kernel)["flops_per_s"]

    copies = max(1, 4096 // chunk)
    Xbig, many = np.tile(X, (copies, 1)), labels * copies

    def forward() -> float:
        torch.set_num_threads(threads)
        start = time.perf_counter()
        list(iter_correct(model, Xbig, many, chunk_size=chunk, device="cpu"))
        return per_sample * len(Xbig) / (time.perf_counter() - start)

    kernels = matmul_kernels()
    forward()  # warm-up
    peers: dict[str, list[float]] = {kernel: [] for kernel in kernels}
    model_rates = []
    for _ in range(args.repeats):
        for kernel in kernels:
            peers[kernel].append(matmul(kernel))  # median of two products, after one
        model_rates.append(forward())
    by_kernel = {kernel: statistics.median(rates) for kernel, rates in peers.items()}
    # The machine's fp32 matmul throughput is its fastest kernel's.
    peer, rate = max(by_kernel.values()), statistics.median(model_rates)
    print(
        json.dumps(
            {
                "code": str(Path(locusformer.__file__).parents[2]),
                "threads": threads,
                "chunk_size": chunk,
                "mflop_per_sample": round(per_sample / 1e6, 2),
                "onednn_linear": getattr(model_module, "ONEDNN", False),
                "matmul_gflops": {k: round(v / 1e9, 1) for k, v in by_kernel.items()},
                "correct_gflops": round(rate / 1e9, 1),
                "ratio": round(rate / peer, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
