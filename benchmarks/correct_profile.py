"""Where ``correct``'s model spends its time: ``torch.profiler`` over one thread's forwards.

Runs ``iter_correct`` on 640 random samples in chunks of ``--chunk-size``, one worker
with one thread (what each of ``correct``'s workers does), after a warm-up, and prints
the self time of the top operators with the achieved FLOP/s of the two that carry the
FLOPs: the linear layers (``FlopCounterMode``'s count on the plain path) and the fused
attention kernel (2 T^2 D multiply-adds per layer and sample, counted by hand).

Usage: ``PYTHONPATH=src python benchmarks/correct_profile.py WORK [--chunk-size 64] [--plain]``
where WORK holds ``model.pt`` and ``model.json`` (e.g. a ``scale.py`` run directory).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scale import attention_flops_per_sample, flops_by_op
from torch.profiler import ProfilerActivity, profile

from locusformer.infer.correct import CHUNK_SIZE, iter_correct
from locusformer.model import attention as model_module
from locusformer.model.files import load_model

SAMPLES = 640


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--chunk-size", type=int, default=CHUNK_SIZE)
    parser.add_argument("--plain", action="store_true", help="linear layers without oneDNN")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_model(args.work / "model.pt", args.work / "model.json")
    X = np.random.default_rng(0).normal(3, 1, size=(SAMPLES, model.n_loci)).astype(np.float32)
    labels = [model.batch_names[0]] * SAMPLES

    def forwards() -> None:
        list(iter_correct(model, X, labels, chunk_size=args.chunk_size, device="cpu", workers=1))

    by_op = flops_by_op(model, X, labels, args.chunk_size)
    linear_flops = sum(n for op, n in by_op.items() if "addmm" in op)
    attention_flops = SAMPLES * attention_flops_per_sample(model)
    model_module.ONEDNN = model_module.ONEDNN and not args.plain

    forwards()  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        forwards()
    table = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in table)
    print(f"oneDNN linear: {model_module.ONEDNN}; {SAMPLES} samples, chunk {args.chunk_size}")
    print(f"self time {total / 1e3:.1f} ms")
    for event in sorted(table, key=lambda e: -e.self_cpu_time_total)[:10]:
        share = event.self_cpu_time_total / total
        print(f"  {event.key:55s} {event.self_cpu_time_total / 1e3:8.1f} ms {share:6.1%}")
    by_name = {e.key: e.self_cpu_time_total / 1e6 for e in table}
    linear_s = by_name.get("mkldnn::_linear_pointwise") or by_name.get("aten::addmm", 0.0)
    attention_s = by_name.get("aten::_scaled_dot_product_flash_attention_for_cpu", 0.0)
    if linear_s:
        print(f"linear layers: {linear_flops / linear_s / 1e9:.1f} GFLOP/s")
    if attention_s:
        print(f"attention kernel: {attention_flops / attention_s / 1e9:.1f} GFLOP/s")

    config = model.config
    attention_paths(args.chunk_size, config.n_heads, model.n_tokens, config.d_model)


def attention_paths(chunk: int, heads: int, tokens: int, d_model: int) -> None:
    width = d_model // heads
    q, k, v = (torch.randn(chunk, heads, tokens, width) for _ in range(3))

    def fused() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)

    def explicit() -> torch.Tensor:
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(width)
        return scores.softmax(-1) @ v

    times: dict[str, list[float]] = {"fused": [], "explicit": []}
    with torch.inference_mode():
        torch.testing.assert_close(explicit(), fused(), atol=1e-5, rtol=1e-5)
        for _ in range(5):
            for name, path in (("fused", fused), ("explicit", explicit)):
                path()
                start = time.perf_counter()
                for _ in range(30):
                    path()
                times[name].append((time.perf_counter() - start) / 30)
    shape = f"{chunk} x {heads} heads x {tokens} tokens x width {width}"
    for name, runs in times.items():
        print(f"attention {name} ({shape}): {statistics.median(runs) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
