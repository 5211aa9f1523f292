"""GPU benchmark: training throughput, achieved TFLOP/s, attention kernels, peak memory.

One run on a machine with an NVIDIA GPU measures

* training steps of the LocusFormer model (bf16 autocast, the library's losses, AdamW)
  for a few model sizes: samples/s, TFLOP/s achieved (FLOPs of one step counted by
  ``torch.utils.flop_counter``) and that as a share of the GPU's dense bf16 peak, and
  peak GPU memory;
* end-to-end ``train_corrector`` epochs (host-to-device copies, validation included):
  samples/s;
* the attention layer alone (forward+backward, bf16) for 256 to 16384 tokens, fused
  (``scaled_dot_product_attention``) and explicit paths: time, TFLOP/s (model FLOPs,
  see ``attention_flops``), peak memory.

Without a CUDA device it prints why and exits with status 0. ``--cpu-smoke`` runs every
part tiny on the CPU, to check the script itself (the numbers mean nothing).

Usage::

    python benchmarks/gpu_bench.py                       # all parts, ~2-5 min on one GPU
    python benchmarks/gpu_bench.py --json gpu_bench.json  # also write the numbers
    python benchmarks/gpu_bench.py --peak-tflops 989      # when the GPU is not in the table
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s from the vendor data sheets,
# matched against torch.cuda.get_device_name() in this order.
BF16_PEAK_TFLOPS = [
    ("GB200", 2500.0),
    ("B200", 2250.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM
    ("H800", 989.0),
    ("GH200", 989.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10G", 70.0),
    ("A10", 125.0),
    ("A30", 165.0),
    ("A40", 150.0),
    ("RTX 6000 Ada", 364.0),
    ("RTX A6000", 155.0),
    ("RTX 4090", 165.0),
    ("RTX 3090", 71.0),
]

MODEL_SIZES = {
    # name: (ModelConfig overrides, batch size)
    "default": ({}, 64),
    "default-b256": ({}, 256),
    "patch4-d128": ({"patch_size": 4, "d_model": 128, "n_heads": 4, "n_layers": 4}, 128),
    "patch1-d256": ({"patch_size": 1, "d_model": 256, "n_heads": 8, "n_layers": 4}, 32),
}


def bf16_peak(name: str) -> float | None:
    for key, peak in BF16_PEAK_TFLOPS:
        if key.lower() in name.lower():
            return peak
    return None


class Timer:
    """Wall time of a callable: CUDA events on the GPU, perf_counter on the CPU."""

    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device.type == "cuda"

    def __call__(self, fn: Callable[[], None], repeats: int, warmup: int = 2) -> float:
        torch = self.torch
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)


def count_flops(torch, fn: Callable[[], None]) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return int(counter.get_total_flops())


def peak_memory(torch, device) -> float | None:
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**30


def reset_peak(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def fmt(value: float | None, spec: str) -> str:
    return (
        "-"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else format(value, spec)
    )


# -- training steps --------------------------------------------------------------------------


def _train_step(torch, model, optimizer, x, b, device) -> Callable[[], None]:
    """One training step as train.py takes it: the model's loss at the default weights
    at full ramp, backward, clipping, AdamW."""
    from locusformer.model.config import TrainConfig
    from locusformer.train.runtime import autocast
    from locusformer.train.schedule import loss_weights

    tc = TrainConfig()
    weights = loss_weights(tc, 1.0)
    prior = torch.full((model.n_batches,), 1.0 / model.n_batches, device=device)

    def step() -> None:
        with autocast(device):
            out = model(x, b, adversary_weight=weights.confusion, adversary=tc.adversary)
        loss = model.loss(x, b, out, weights, prior)
        optimizer.zero_grad(set_to_none=True)
        loss.total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        optimizer.step()

    return step


def bench_training_steps(torch, device, args, peak: float | None) -> list[dict]:
    from locusformer.model.config import ModelConfig, TrainConfig
    from locusformer.model.layout import build_layout
    from locusformer.model.network import LocusFormer
    from locusformer.simulate.datasets import simulate
    from locusformer.train.schedule import configure_optimizer

    sim = simulate(n_samples=args.samples, n_loci=args.loci, n_batches=3, seed=0)
    tc = TrainConfig()
    rows = []
    for name in args.sizes:
        overrides, batch_size = MODEL_SIZES[name]
        if args.cpu_smoke:
            overrides, batch_size = {**overrides, "d_model": 32, "n_layers": 1}, 16
        mc = ModelConfig(**{**overrides, "n_heads": overrides.get("n_heads", 4)})
        layout = build_layout(sim.loci, mc.patch_size, mc.position_scale, mc.coordinate_unit)
        model = LocusFormer(mc, layout, n_batches=3).to(device).train()
        optimizer = configure_optimizer(model, tc)
        g = torch.Generator().manual_seed(0)
        idx = torch.randint(0, len(sim.X), (batch_size,), generator=g)
        x = torch.from_numpy(sim.X)[idx].to(device)
        x = (x - x.mean(0)) / (x.std(0) + 1e-6)
        b = torch.from_numpy(sim.batch)[idx].to(device)

        step = _train_step(torch, model, optimizer, x, b, device)

        row = {
            "model": name,
            "tokens": model.n_tokens,
            "parameters": sum(p.numel() for p in model.parameters()),
            "batch": batch_size,
        }
        try:
            reset_peak(torch, device)
            flops = count_flops(torch, step)
            seconds = Timer(torch, device)(step, repeats=args.repeats, warmup=3)
            row.update(
                seconds_per_step=seconds,
                samples_per_s=batch_size / seconds,
                tflops=flops / seconds / 1e12,
                gflop_per_step=flops / 1e9,
                peak_gib=peak_memory(torch, device),
            )
            row["share_of_peak"] = row["tflops"] / peak if peak else None
        except torch.cuda.OutOfMemoryError:
            row["error"] = "out of memory"
        rows.append(row)
        del model, optimizer
    return rows


def bench_train_corrector(torch, device, args) -> list[dict]:
    from locusformer.model.config import ModelConfig, TrainConfig
    from locusformer.simulate.datasets import simulate
    from locusformer.train.loop import train_corrector

    sim = simulate(n_samples=args.samples, n_loci=args.loci, n_batches=3, seed=0)
    labels = [f"batch{b}" for b in sim.batch]
    rows = []
    for batch_size in (64, 256):
        tc = TrainConfig(
            max_epochs=args.epochs,
            batch_size=batch_size,
            patience=args.epochs,
            compile=args.compile,
        )
        mc = ModelConfig(d_model=32, n_layers=1) if args.cpu_smoke else ModelConfig()
        reset_peak(torch, device)
        model, history = train_corrector(
            sim.X, labels, sim.loci, mc, tc, seed=0, device=device, progress=False
        )
        seconds = history["seconds"].tolist()
        per_epoch = statistics.median(seconds[1:] if len(seconds) > 1 else seconds)
        n_train = round(args.samples * (1 - tc.val_fraction))
        rows.append(
            {
                "batch": batch_size,
                "seconds_per_epoch": per_epoch,
                "samples_per_s": n_train / per_epoch,
                "peak_gib": peak_memory(torch, device),
            }
        )
        del model
    return rows


# -- attention kernels -----------------------------------------------------------------------


def attention_flops(batch: int, tokens: int, d_model: int) -> int:
    """Model FLOPs of one attention layer, forward+backward (backward = 2x forward).

    In- and out-projections plus Q K^T and weights @ V; the same count for both paths, so
    TFLOP/s compare like with like (and the fused kernels, which torch's flop counter
    does not see on every backend, are counted).
    """
    projections = 2 * batch * tokens * d_model * 4 * d_model
    scores = 2 * 2 * batch * tokens * tokens * d_model
    return 3 * (projections + scores)


def bench_attention(torch, device, args, peak: float | None) -> list[dict]:
    from locusformer.model.attention import MultiHeadSelfAttention

    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    rows = []
    for tokens in args.tokens:
        batch = max(1, args.attention_tokens // tokens)
        for path in ("fused", "explicit"):
            torch.manual_seed(0)
            attn = MultiHeadSelfAttention(args.d_model, args.heads).to(device, dtype)
            x = torch.randn(batch, tokens, args.d_model, device=device, dtype=dtype)
            x.requires_grad_(True)

            def step(attn=attn, x=x, path=path) -> None:
                y, _ = attn(x, fused=path == "fused")
                y.sum().backward()
                x.grad = None
                for p in attn.parameters():
                    p.grad = None

            row = {"tokens": tokens, "batch": batch, "path": path}
            flops = attention_flops(batch, tokens, args.d_model)
            try:
                reset_peak(torch, device)
                seconds = Timer(torch, device)(step, repeats=args.repeats)
                row.update(
                    ms=seconds * 1e3,
                    tflops=flops / seconds / 1e12,
                    peak_gib=peak_memory(torch, device),
                )
                row["share_of_peak"] = row["tflops"] / peak if peak else None
            except torch.cuda.OutOfMemoryError:
                row["error"] = "out of memory"
            rows.append(row)
            del attn, x
    return rows


# -- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(MODEL_SIZES), choices=MODEL_SIZES)
    parser.add_argument("--samples", type=int, default=4096, help="simulated samples")
    parser.add_argument("--loci", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=4, help="train_corrector epochs")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--tokens", type=int, nargs="+", default=[2**k for k in range(8, 15)])
    parser.add_argument(
        "--attention-tokens", type=int, default=32768, help="batch x tokens per attention call"
    )
    parser.add_argument("--d-model", type=int, default=256, help="attention width")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="training.compile in the train_corrector part (the step table runs eager)",
    )
    parser.add_argument(
        "--cpu-smoke", action="store_true", help="tiny run on the CPU: checks the script only"
    )
    args = parser.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("gpu_bench: PyTorch is not installed; nothing to measure.")
        return 0
    if args.cpu_smoke:
        device = torch.device("cpu")
        args.samples, args.loci, args.epochs, args.repeats = 128, 64, 2, 2
        args.sizes, args.tokens = args.sizes[:2], [t for t in args.tokens if t <= 512][:2]
        args.attention_tokens, args.d_model, args.heads = 512, 32, 4
        name, peak = "CPU (smoke test)", None
    else:
        if not torch.cuda.is_available():
            print(
                "gpu_bench: no CUDA device (torch.cuda.is_available() is False; torch "
                f"{torch.__version__}); nothing to measure. Run it on a machine with an "
                "NVIDIA GPU and a CUDA build of PyTorch."
            )
            return 0
        device = torch.device("cuda")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        name = torch.cuda.get_device_name(device)
        peak = args.peak_tflops or bf16_peak(name)

    torch.manual_seed(0)
    header = {
        "device": name,
        "bf16_peak_tflops": peak,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "samples": args.samples,
        "loci": args.loci,
    }
    print(f"# GPU benchmark: {name}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    print(
        f"dense bf16 peak: {fmt(peak, '.0f')} TFLOP/s"
        + ("" if peak else " (unknown GPU: pass --peak-tflops)")
    )

    t0 = time.perf_counter()
    steps = bench_training_steps(torch, device, args, peak)
    print(f"\n## Training steps ({args.loci} loci; bf16 autocast; forward+backward+AdamW)\n")
    print("| model | tokens | parameters | batch | ms/step | samples/s | TFLOP/s | % of peak "
          "| peak GiB |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in steps:
        if "error" in r:
            print(f"| {r['model']} | {r['tokens']} | {r['parameters']:,} | {r['batch']} "
                  f"| {r['error']} | | | | |")  # fmt: skip
            continue
        share = r["share_of_peak"]
        print(
            f"| {r['model']} | {r['tokens']} | {r['parameters']:,} | {r['batch']} "
            f"| {r['seconds_per_step'] * 1e3:.2f} | {r['samples_per_s']:,.0f} "
            f"| {r['tflops']:.2f} | {fmt(share * 100 if share else None, '.1f')} "
            f"| {fmt(r['peak_gib'], '.2f')} |",
            flush=True,
        )

    epochs = bench_train_corrector(torch, device, args)
    print(f"\n## train_corrector end to end (default model, {args.samples} samples; "
          "validation and host copies included; first epoch left out)\n")  # fmt: skip
    print("| batch | s/epoch | samples/s | peak GiB |")
    print("|---|---|---|---|")
    for r in epochs:
        if "error" in r:
            print(f"| {r['batch']} | {r['error']} | | |")
            continue
        print(
            f"| {r['batch']} | {r['seconds_per_epoch']:.2f} | {r['samples_per_s']:,.0f} "
            f"| {fmt(r['peak_gib'], '.2f')} |",
            flush=True,
        )

    attention = bench_attention(torch, device, args, peak)
    print(f"\n## Attention kernel (d_model {args.d_model}, {args.heads} heads, bf16, "
          f"forward+backward, batch x tokens = {args.attention_tokens})\n")  # fmt: skip
    print("| tokens | batch | path | ms | TFLOP/s | % of peak | peak GiB |")
    print("|---|---|---|---|---|---|---|")
    for r in attention:
        if "error" in r:
            print(f"| {r['tokens']} | {r['batch']} | {r['path']} | {r['error']} | | | |")
            continue
        share = r["share_of_peak"]
        print(
            f"| {r['tokens']} | {r['batch']} | {r['path']} | {r['ms']:.2f} | {r['tflops']:.2f} "
            f"| {fmt(share * 100 if share else None, '.1f')} | {fmt(r['peak_gib'], '.2f')} |",
            flush=True,
        )
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(
                {**header, "training_steps": steps, "train_corrector": epochs,
                 "attention": attention},
                handle,
                indent=1,
            )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
