"""Benchmark the attention paths: explicit vs fused (SDPA) vs torch.nn.MultiheadAttention.

Each (path, tokens) configuration runs in a fresh subprocess, which reports

* time: median wall time of ``--repeats`` forward+backward passes (``--mode train``) or
  forward passes under inference_mode (``--mode infer``), after one warm-up pass;
* peak memory: the growth of the process's peak resident set size
  (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) over the warm-up pass, relative to the
  peak after building the inputs. tracemalloc does not see torch's allocator, and a fresh
  process per configuration keeps one configuration's peak from hiding the next one's.
  On CUDA it reports ``torch.cuda.max_memory_allocated`` instead.

Usage::

    python benchmarks/attention_bench.py                  # 64..4096 tokens, CPU
    python benchmarks/attention_bench.py --device cuda --batch 16
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time


def worker(args: argparse.Namespace) -> dict:
    import torch

    from locusformer.model.attention import MultiHeadSelfAttention

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dev = torch.device(args.device)
    ref = torch.nn.MultiheadAttention(args.d_model, args.heads, batch_first=True).to(dev)
    ours = MultiHeadSelfAttention(args.d_model, args.heads).to(dev)
    ours.load_from_torch(ref)
    x = torch.randn(args.batch, args.tokens, args.d_model, device=dev)

    def call() -> torch.Tensor:
        if args.path == "explicit":
            return ours(x, need_weights=False, fused=False)[0]
        if args.path == "fused":
            return ours(x, fused=True)[0]
        return ref(x, x, x, need_weights=False)[0]

    def step() -> None:
        if args.mode == "train":
            x.requires_grad_(True)
            call().sum().backward()
            x.grad = None
            for p in [*ours.parameters(), *ref.parameters()]:
                p.grad = None
        else:
            with torch.inference_mode():
                call()
        if dev.type == "cuda":
            torch.cuda.synchronize()

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.max_memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    step()  # warm-up; its peak is the configuration's peak
    if dev.type == "cuda":
        peak_mib = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        peak_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        if sum(times) > args.budget_s:
            break
    return {"ms": 1000 * statistics.median(times), "peak_mib": peak_mib, "runs": len(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokens", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 2048, 4096]
    )
    parser.add_argument("--paths", nargs="+", default=["explicit", "fused", "torch"])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--mode", choices=["train", "infer"], default="train")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--budget-s", type=float, default=10.0, help="max timing seconds per config"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--tokens-one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        args.tokens = args.tokens_one
        print(json.dumps(worker(args)))
        return

    import torch

    what = "forward+backward" if args.mode == "train" else "forward (inference_mode)"
    print(
        f"# Self-attention, {what}: batch {args.batch}, d_model {args.d_model}, "
        f"{args.heads} heads, {args.device}, {args.threads} threads, torch {torch.__version__}\n"
    )
    print("Time: median ms. Peak: MiB above the process's peak before the first pass.\n")
    header = ["tokens"] + [f"{p} ms" for p in args.paths] + [f"{p} peak MiB" for p in args.paths]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for tokens in args.tokens:
        results = {}
        for path in args.paths:
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                "--path",
                path,
                "--tokens-one",
                str(tokens),
            ]
            for flag in [
                "batch",
                "d_model",
                "heads",
                "mode",
                "repeats",
                "budget_s",
                "threads",
                "device",
            ]:
                cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode == 0:
                results[path] = json.loads(proc.stdout.strip().splitlines()[-1])
            else:
                last = (proc.stderr.strip().splitlines() or ["failed"])[-1]
                results[path] = {"ms": float("nan"), "peak_mib": float("nan"), "error": last}
                print(f"<!-- {path} at {tokens} tokens failed: {last} -->", file=sys.stderr)
        times = [f"{results[p]['ms']:.2f}" for p in args.paths]
        peaks = [f"{results[p]['peak_mib']:.0f}" for p in args.paths]
        print(f"| {tokens} | " + " | ".join(times + peaks) + " |", flush=True)


if __name__ == "__main__":
    main()
