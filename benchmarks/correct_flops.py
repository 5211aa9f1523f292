"""``correct``'s forward FLOP/s against the machine's fp32 matmul, in one process.

The logic of ``scale.py``'s ``forward_flops``, alone: FLOPs per sample from
``FlopCounterMode`` (plus the fused attention kernel, which it does not see), then seven
timings of ``iter_correct`` on 4096 random samples, each after two products of 2048 x
2048 with the same threads by each fp32 kernel (``torch.mm``, which calls MKL, and
oneDNN's linear, about twice as fast on AMD machines); medians of each. The ratio is
against the faster kernel: the machine's own fp32 matmul throughput. The code measured is whatever
``locusformer`` imports (``PYTHONPATH``), so an older checkout can be measured alike.

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
from torch.utils.flop_counter import FlopCounterMode

import locusformer
from locusformer import model as model_module
from locusformer.correct import CHUNK_SIZE, iter_correct
from locusformer.train import load_model


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
    # Counted on the plain path: FlopCounterMode does not see oneDNN's kernels.
    # getattr: an older checkout, measured alike, has no such switch.
    onednn, model_module.ONEDNN = getattr(model_module, "ONEDNN", False), False
    with FlopCounterMode(display=False) as counter:
        list(iter_correct(model, X, labels, chunk_size=chunk, device="cpu"))
    model_module.ONEDNN = onednn
    config = model.config
    attention = config.n_layers * 4 * model.n_tokens**2 * config.d_model
    per_sample = counter.get_total_flops() / chunk + attention
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)

    def matmul(kernel: str) -> float:
        torch.set_num_threads(threads)
        start = time.perf_counter()
        if kernel == "onednn":
            torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], "")
        else:
            torch.mm(a, b)
        return 2 * 2048**3 / (time.perf_counter() - start)

    copies = max(1, 4096 // chunk)
    Xbig, many = np.tile(X, (copies, 1)), labels * copies

    def forward() -> float:
        torch.set_num_threads(threads)
        start = time.perf_counter()
        list(iter_correct(model, Xbig, many, chunk_size=chunk, device="cpu"))
        return per_sample * len(Xbig) / (time.perf_counter() - start)

    kernels = ["mkl", "onednn"] if torch.backends.mkldnn.is_available() else ["mkl"]
    for kernel in kernels:
        matmul(kernel)
    forward()  # warm-up
    peers: dict[str, list[float]] = {kernel: [] for kernel in kernels}
    model_rates = []
    for _ in range(args.repeats):
        for kernel in kernels:
            peers[kernel] += [matmul(kernel), matmul(kernel)]
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
                "onednn_linear": onednn,
                "matmul_gflops": {k: round(v / 1e9, 1) for k, v in by_kernel.items()},
                "correct_gflops": round(rate / 1e9, 1),
                "ratio": round(rate / peer, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
