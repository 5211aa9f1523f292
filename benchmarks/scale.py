"""Scaling of the large-data path: time and peak memory of each step from 1k to 1M samples.

Simulates counts of ``--sizes`` samples x 2500 genes (``locusformer simulate``, sparse
h5ad), then runs ``normalize`` (2000 highly variable genes), ``order-loci``, ``train``
(up to ``--train-max`` samples; a two-epoch run, seconds per epoch from its history) and
``correct``, each as a subprocess of its own, recording wall time and peak RSS
(``os.wait4``: that child and the children it waited for). Beside them: the machine's
fp32 matmul throughput, ``correct``'s forward FLOPs per sample (``FlopCounterMode``) and
so its achieved FLOP/s, and on ``--peer-size`` samples the peers: scVI seconds per epoch,
Harmony and ComBat wall time (the ``baseline`` command).

Raw results are appended to ``OUT/results.jsonl`` (one JSON object per measurement); the
summary (medians, log-log slopes) goes to ``OUT/summary.md`` and stdout. Every part can be
rerun alone with ``--sizes`` and ``--steps``.

Usage::

    python benchmarks/scale.py                                   # everything
    python benchmarks/scale.py --sizes 1000 10000 --repeats 3    # small sizes, 3 repeats
    python benchmarks/scale.py --sizes 1000000 --steps correct   # one step of one size
    python benchmarks/scale.py --summary                          # summarize results.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("simulate", "normalize", "order-loci", "train", "correct", "matmul", "peers")
N_GENES, N_TOP_GENES = 2500, 2000
TRAIN_EPOCHS = 2
SCVI_EPOCHS_RUN = 2
#: Samples of the throwaway model that sizes above --train-max are corrected with (the
#: weights do not change correct's cost).
SUBSET_FOR_MODEL = 10_000


def run(argv: list[str], log: Path) -> dict:
    """Run ``argv``; wall seconds and peak RSS (MB) of that command alone.

    Measured by ``/usr/bin/time``: a child forked from this (large) process would start
    with this process's peak RSS as its own.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    stats = log.with_suffix(".time")
    with open(log, "w") as handle:
        start = time.perf_counter()
        code = subprocess.call(
            ["/usr/bin/time", "-o", str(stats), "-f", "%e %M", *map(str, argv)],
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
        seconds = time.perf_counter() - start
    if code != 0:
        tail = log.read_text(errors="replace").splitlines()[-5:]
        raise RuntimeError(f"{' '.join(map(str, argv[:4]))} failed ({code}): {tail}")
    _, peak_kb = stats.read_text().split()[-2:]
    return {"seconds": seconds, "peak_rss_mb": int(peak_kb) / 1024}


def cli(*args: object) -> list[str]:
    return [sys.executable, "-m", "locusformer", *map(str, args)]


def record(out: Path, **row: object) -> None:
    row = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": platform.node(), **row}
    with open(out / "results.jsonl", "a") as handle:
        handle.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def data_dir(out: Path, n: int) -> Path:
    return out / "data" / f"n{n}"


def simulate(out: Path, n: int) -> None:
    d = data_dir(out, n)
    if (d / "expression.h5ad").exists():
        return
    res = run(
        cli(
            "simulate", "--n-samples", n, "--n-genes", N_GENES, "--seed", 0,
            "--out-expression", d / "expression.h5ad", "--out-samples", d / "samples.tsv",
        ),
        out / "logs" / f"n{n}" / "simulate.log",
    )  # fmt: skip
    record(out, step="simulate", n=n, **res)


def normalize(out: Path, n: int, work: Path) -> dict:
    d = data_dir(out, n)
    return run(
        cli(
            "normalize", "--expression", d / "expression.h5ad", "--samples", d / "samples.tsv",
            "--batch-key", "batch", "--label-key", "group", "--value-type", "counts",
            "--n-top-genes", N_TOP_GENES, "--out-matrix", work / "normalized.parquet",
            "--out-counts", work / "counts.parquet", "--out-samples", work / "samples.tsv",
            "--out-stats", work / "normalize.json",
        ),
        out / "logs" / f"n{n}" / "normalize.log",
    )  # fmt: skip


def order_loci(out: Path, n: int, work: Path) -> dict:
    return run(
        cli(
            "order-loci", "--matrix", work / "normalized.parquet",
            "--genes", ROOT / "resources" / "hs_gene_coordinates.tsv.gz",
            "--gene-id", "ensembl_id", "--out-loci", work / "loci.parquet",
            "--out-matrix", work / "ordered.parquet", "--out-stats", work / "loci.json",
        ),
        out / "logs" / f"n{n}" / "order_loci.log",
    )  # fmt: skip


def train(out: Path, n: int, work: Path, epochs: int, matrix: Path | None = None) -> dict:
    params = {"train": {"max_epochs": epochs}}
    res = run(
        cli(
            "train", "--matrix", matrix or work / "ordered.parquet",
            "--loci", work / "loci.parquet", "--samples", work / "samples.tsv",
            "--batch-key", "batch", "--params", json.dumps(params), "--device", "cpu",
            "--out-weights", work / "model.pt", "--out-config", work / "model.json",
            "--out-history", work / "history.tsv",
        ),
        out / "logs" / f"n{n}" / "train.log",
    )  # fmt: skip
    history = pd.read_csv(work / "history.tsv", sep="\t")
    res["epoch_seconds"] = history["seconds"].tolist()
    return res


def model_for(out: Path, n: int, work: Path, train_max: int, epochs: int) -> None:
    """A model for ``correct``: trained on this size, else on its first rows (not timed)."""
    if (work / "model.pt").exists():
        return
    if n <= train_max:
        record(out, step="train", n=n, **train(out, n, work, epochs))
        return
    from locusformer.io.parquet import iter_matrix_parquet, write_matrix_parquet

    rows = next(iter_matrix_parquet(work / "ordered.parquet", rows=SUBSET_FOR_MODEL))
    subset = work / "subset.parquet"
    write_matrix_parquet(subset, rows.to_numpy(), rows.index, rows.columns)
    train(out, n, work, 1, matrix=subset)


def correct(out: Path, n: int, work: Path, chunk_size: int) -> dict:
    return run(
        cli(
            "correct", "--matrix", work / "ordered.parquet", "--samples", work / "samples.tsv",
            "--batch-key", "batch", "--weights", work / "model.pt", "--config", work / "model.json",
            "--chunk-size", chunk_size, "--device", "cpu",
            "--out-corrected", work / "corrected.parquet", "--out-latent", work / "latent.parquet",
            "--out-h5ad", work / "locusformer.h5ad",
        ),
        out / "logs" / f"n{n}" / "correct.log",
    )  # fmt: skip


def forward_flops(work: Path, chunk_size: int, threads: int) -> dict:
    """Forward FLOPs per sample of ``correct`` and the model's compute-only throughput.

    The matmul peer is measured in the same process, with the same threads, between the
    timings of the model, so that both see the same machine (it was shared).
    """
    import torch

    from locusformer.infer.correct import iter_correct
    from locusformer.model import attention as model_module
    from locusformer.model.files import load_model

    torch.set_num_threads(threads)
    model = load_model(work / "model.pt", work / "model.json")
    rng = np.random.default_rng(0)
    X = rng.normal(3, 1, size=(chunk_size, model.n_loci)).astype(np.float32)
    labels = [model.batch_names[0]] * chunk_size
    by_op = flops_by_op(model, X, labels, chunk_size)
    attention = attention_flops_per_sample(model)
    per_sample = sum(by_op.values()) / chunk_size + attention
    copies = max(1, 4096 // chunk_size)  # 4096 samples a timing
    Xbig = np.tile(X, (copies, 1))
    times: list[float] = []
    peer: dict[str, list[float]] = {kernel: [] for kernel in matmul_kernels()}
    for _ in range(6):
        for kernel, rates in peer.items():
            rate = matmul_throughput(threads=threads, repeats=2, kernel=kernel)["flops_per_s"]
            rates.append(rate)
        start = time.perf_counter()
        list(iter_correct(model, Xbig, labels * copies, chunk_size=chunk_size, device="cpu"))
        times.append(time.perf_counter() - start)
    compute = statistics.median(times[1:])
    return {
        "flops_per_sample": per_sample,
        "by_op": by_op,
        "attention_flops_per_sample": attention,
        "compute_only_flops_per_s": per_sample * len(Xbig) / compute,
        "compute_only_all": [per_sample * len(Xbig) / t for t in times[1:]],
        # The machine's fp32 throughput: the faster kernel's.
        "matmul_flops_per_s": max(statistics.median(rates[1:]) for rates in peer.values()),
        "matmul_by_kernel": {k: statistics.median(rates[1:]) for k, rates in peer.items()},
        "matmul_all": {kernel: rates[1:] for kernel, rates in peer.items()},
        "onednn_linear": getattr(model_module, "ONEDNN", False),
        "chunk_size": chunk_size,
        "threads": threads,
    }


def matmul_throughput(
    size: int = 2048, repeats: int = 10, threads: int | None = None, kernel: str = "mkl"
) -> dict:
    """fp32 FLOP/s of a square product: ``torch.mm`` ("mkl") or oneDNN's linear ("onednn").

    PyTorch's CPU ``torch.mm`` calls MKL, which on AMD machines runs at about half the
    rate of oneDNN's kernel (the one ``correct`` uses): the machine's fp32 throughput is
    the faster of the two.
    """
    import torch

    threads = threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    a = torch.randn(size, size)
    b = torch.randn(size, size)

    def product() -> None:
        if kernel == "onednn":
            torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], "")
        else:
            torch.mm(a, b)

    product()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        product()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    flops = 2 * size**3 / seconds
    return {"flops_per_s": flops, "size": size, "threads": threads, "kernel": kernel}


def matmul_kernels() -> list[str]:
    """The fp32 kernels this machine's PyTorch has (the peer does not depend on the code)."""
    import torch

    return ["mkl", "onednn"] if torch.backends.mkldnn.is_available() else ["mkl"]


def flops_by_op(model: Any, X: np.ndarray, labels: list, chunk_size: int) -> dict[str, int]:
    """FLOPs of ``iter_correct`` over ``X`` by operator, as ``FlopCounterMode`` counts them.

    Counted on the plain path: the counter does not see oneDNN's linear kernel. It does
    not see the fused attention kernel either (:func:`attention_flops_per_sample`).
    """
    from torch.utils.flop_counter import FlopCounterMode

    from locusformer.infer.correct import iter_correct
    from locusformer.model import attention as model_module

    # getattr: an older checkout, measured alike, has no such switch.
    onednn, model_module.ONEDNN = getattr(model_module, "ONEDNN", False), False
    try:
        with FlopCounterMode(display=False) as counter:
            list(iter_correct(model, X, labels, chunk_size=chunk_size, device="cpu"))
    finally:
        model_module.ONEDNN = onednn
    return {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}


def attention_flops_per_sample(model: Any) -> int:
    """QK^T and AV of the fused attention kernel: 2 T^2 d_model multiply-adds each a layer."""
    config = model.config
    return config.n_layers * 4 * model.n_tokens**2 * config.d_model


SCVI_EPOCHS = """
import sys, time, numpy as np, pandas as pd, anndata as ad, scvi
from lightning.pytorch.callbacks import Callback
from locusformer.io.parquet import read_matrix_parquet
counts = read_matrix_parquet(sys.argv[1], "count matrix")
batches = pd.read_csv(sys.argv[2], sep="\\t", dtype=str).set_index("sample_id")["batch"]
work = ad.AnnData(X=counts.to_numpy(np.float32), obs=pd.DataFrame(
    {"batch": batches.loc[counts.index].to_numpy()}, index=counts.index))
scvi.settings.seed = 0
scvi.model.SCVI.setup_anndata(work, batch_key="batch")
model = scvi.model.SCVI(work, n_latent=10)
class Clock(Callback):
    seconds = []
    def on_train_epoch_start(self, *a): self.start = time.perf_counter()
    def on_train_epoch_end(self, *a): self.seconds.append(time.perf_counter() - self.start)
model.train(max_epochs=int(sys.argv[3]), accelerator="cpu", enable_progress_bar=False,
            callbacks=[Clock()])
print("EPOCH_SECONDS", ",".join(f"{s:.3f}" for s in Clock.seconds))
"""


def peers(out: Path, n: int, work: Path) -> None:
    logs = out / "logs" / f"n{n}"
    for method in ("harmony", "combat"):
        res = run(
            cli(
                "baseline", "--method", method, "--matrix", work / "ordered.parquet",
                "--samples", work / "samples.tsv", "--batch-key", "batch",
                "--label-key", "group", "--out", work / f"{method}.h5ad",
            ),
            logs / f"{method}.log",
        )  # fmt: skip
        failed = "failed:" in (logs / f"{method}.log").read_text(errors="replace")
        record(out, step=method, n=n, failed=failed, **res)
        (work / f"{method}.h5ad").unlink(missing_ok=True)
    argv = [
        sys.executable, "-c", SCVI_EPOCHS, work / "counts.parquet", work / "samples.tsv",
        SCVI_EPOCHS_RUN,
    ]  # fmt: skip
    res = run([str(a) for a in argv], logs / "scvi.log")
    line = next(
        line for line in (logs / "scvi.log").read_text().splitlines() if "EPOCH_SECONDS" in line
    )
    res["epoch_seconds"] = [float(s) for s in line.split()[1].split(",")]
    record(out, step="scvi", n=n, **res)


def measure(args: argparse.Namespace) -> None:
    out = args.out
    # The steps' subprocesses (torch, OpenMP, BLAS) use the same number of threads.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    out.mkdir(parents=True, exist_ok=True)
    if "matmul" in args.steps:
        for _ in range(args.repeats):
            for kernel in matmul_kernels():
                record(out, step="matmul", **matmul_throughput(threads=args.threads, kernel=kernel))
    for n in args.sizes:
        work = out / "runs" / f"n{n}"
        work.mkdir(parents=True, exist_ok=True)
        if "simulate" in args.steps:
            simulate(out, n)
        repeats = args.repeats if n <= args.repeat_max else 1
        if "normalize" in args.steps:
            for _ in range(repeats):
                record(out, step="normalize", n=n, **normalize(out, n, work))
        if "order-loci" in args.steps:
            for _ in range(repeats):
                record(out, step="order-loci", n=n, **order_loci(out, n, work))
        if "train" in args.steps and n <= args.train_max:
            (work / "model.pt").unlink(missing_ok=True)
            for _ in range(repeats):
                record(out, step="train", n=n, **train(out, n, work, args.train_epochs))
        if "correct" in args.steps:
            model_for(out, n, work, args.train_max, args.train_epochs)
            for _ in range(repeats):
                res = correct(out, n, work, args.chunk_size)
                config = {"chunk_size": args.chunk_size, "threads": args.threads}
                record(out, step="correct", n=n, **config, **res)
            flops = forward_flops(work, args.chunk_size, args.threads)
            record(out, step="correct-flops", n=n, **flops)
            if not args.keep:
                for name in ("corrected.parquet", "locusformer.h5ad"):
                    (work / name).unlink(missing_ok=True)
        if "peers" in args.steps and n == args.peer_size:
            peers(out, n, work)
    summarize(out)


# -- summary ---------------------------------------------------------------------------------


def slope(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of log(value) on log(n): 1 is linear growth, 0 flat."""
    points = [(n, v) for n, v in points if v > 0]
    if len({n for n, _ in points}) < 2:
        return None
    x = np.log([n for n, _ in points])
    y = np.log([v for _, v in points])
    return float(np.polyfit(x, y, 1)[0])


def summarize(out: Path) -> str:
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    lines = ["| step | samples | runs | wall s (median) | peak RSS MB (median) | s/epoch |"]
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: |")
    growth = ["", "| step | log-log slope of wall time | of peak RSS | sizes |"]
    growth.append("| --- | ---: | ---: | --- |")
    for step in ("normalize", "order-loci", "train", "correct"):
        sizes = sorted({r["n"] for r in rows if r["step"] == step})
        times, rss = [], []
        for n in sizes:
            runs = [r for r in rows if r["step"] == step and r["n"] == n]
            t = statistics.median(r["seconds"] for r in runs)
            m = statistics.median(r["peak_rss_mb"] for r in runs)
            epochs = [s for r in runs for s in r.get("epoch_seconds", [])]
            per_epoch = f"{statistics.median(epochs):.1f}" if epochs else ""
            lines.append(f"| {step} | {n:,} | {len(runs)} | {t:.1f} | {m:.0f} | {per_epoch} |")
            times.append((n, t))
            rss.append((n, m))
        s_t, s_m = slope(times), slope(rss)
        if s_t is not None:
            growth.append(
                f"| {step} | {s_t:.2f} | {s_m:.2f} | {', '.join(f'{n:,}' for n, _ in times)} |"
            )
    text = "\n".join(lines + growth)

    flops = [r for r in rows if r["step"] == "correct-flops"]
    text += "\n"
    for kernel in ("mkl", "onednn"):
        # Rows from before the kernel was recorded are torch.mm's.
        matmul = [
            r["flops_per_s"]
            for r in rows
            if r["step"] == "matmul" and r.get("kernel", "mkl") == kernel
        ]
        if matmul:
            name = "torch.mm, MKL" if kernel == "mkl" else "oneDNN linear"
            text += (
                f"\nfp32 matmul (2048 x 2048, {name}): "
                f"{statistics.median(matmul) / 1e9:.1f} GFLOP/s (median)."
            )
    for f in sorted(flops, key=lambda f: (f["n"], f["threads"], f["time"])):
        n, threads, chunk = f["n"], f["threads"], f["chunk_size"]
        # The peer measured beside the model; rows from before that, the matmul step's.
        same = [
            r["flops_per_s"]
            for r in rows
            if r["step"] == "matmul" and r["threads"] == threads and r.get("kernel", "mkl") == "mkl"
        ]
        peer = f.get("matmul_flops_per_s") or (statistics.median(same) if same else None)
        if peer is None:
            continue
        # Rows from before --threads ran at this machine's 2 threads.
        runs = [
            r["seconds"]
            for r in rows
            if r["step"] == "correct" and r["n"] == n and r.get("chunk_size") == chunk
            and r.get("threads", 2) == threads
        ]  # fmt: skip
        kernels = ""
        if f.get("matmul_by_kernel"):
            kernels = (
                " ("
                + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in f["matmul_by_kernel"].items())
                + ")"
            )
        end_to_end = ""
        if runs:
            achieved = f["flops_per_sample"] * n / statistics.median(runs)
            end_to_end = f"end to end {achieved / 1e9:.1f} GFLOP/s = {achieved / peer:.2f}; "
        text += (
            f"\ncorrect, {n:,} samples, {threads} thread(s), chunk {chunk}: "
            f"{f['flops_per_sample'] / 1e6:.1f} MFLOP/sample; matmul beside it "
            f"{peer / 1e9:.1f} GFLOP/s{kernels}; {end_to_end}model alone "
            f"{f['compute_only_flops_per_s'] / 1e9:.1f} GFLOP/s = "
            f"{f['compute_only_flops_per_s'] / peer:.2f} of matmul."
        )
    for step in ("harmony", "combat", "scvi"):
        for r in (r for r in rows if r["step"] == step):
            extra = ""
            if r.get("epoch_seconds"):
                extra = f", {statistics.median(r['epoch_seconds']):.1f} s/epoch"
            failed = " (FAILED)" if r.get("failed") else ""
            text += (
                f"\n{step}, {r['n']:,} samples: {r['seconds']:.1f} s wall, "
                f"{r['peak_rss_mb']:.0f} MB peak{extra}{failed}"
            )
    (out / "summary.md").write_text(text + "\n")
    print(text)
    return text


def main() -> None:
    from locusformer.infer.correct import CHUNK_SIZE  # the workflow's default

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000, 1000000])
    parser.add_argument("--steps", nargs="+", default=list(STEPS), choices=STEPS)
    parser.add_argument("--repeats", type=int, default=1, help="runs per step and size")
    parser.add_argument("--repeat-max", type=int, default=10000, help="repeat sizes up to this")
    parser.add_argument("--train-max", type=int, default=100000, help="train sizes up to this")
    parser.add_argument("--train-epochs", type=int, default=TRAIN_EPOCHS, help="epochs a run")
    parser.add_argument("--peer-size", type=int, default=100000, help="size the peers run on")
    parser.add_argument("--chunk-size", type=int, default=CHUNK_SIZE, help="correct --chunk-size")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads a step")
    parser.add_argument("--keep", action="store_true", help="keep correct's large outputs")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "scale")
    parser.add_argument("--summary", action="store_true", help="only summarize results.jsonl")
    args = parser.parse_args()
    if args.summary:
        summarize(args.out)
        return
    measure(args)


if __name__ == "__main__":
    main()
