"""A trained model's attention, step by step, on a few samples (``locusformer inspect``).

Per layer and head: the shapes and value ranges of Q, K and V, of the scores before and
after the ÷ √d_k scaling (and their row maxima), of the softmax weights (row sums, which
must be 1, and entropy) and of the heads' output; the first step where a non-finite value
appeared, named. Beside the softmax the model runs (row max subtracted), the trace also
computes the naive one, ``exp(s) / sum(exp(s))``, and names the step where it would turn
non-finite: the tool to reach for when training turns into NaN. It runs twice, in float32
and in the autocast dtype (bfloat16; on the CPU simulated by casting the weights and
inputs), and reports the largest difference between the two.

The trace recomputes each block's attention from the block's own weights and checks it
against the block's (fused) output; the next layer gets the block's own output.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from locusformer.errors import InputError
from locusformer.io.parquet import iter_matrix_parquet, open_matrix_parquet
from locusformer.model.attention import linear, stable_softmax
from locusformer.model.files import TrainedModel, load_model
from locusformer.model.network import LocusFormer, masked_mean
from locusformer.train.runtime import resolve_device

Precision = Literal["float32", "bfloat16"]

#: The steps of one layer, in the order the model computes them. "input" is the
#: block's LayerNorm of the token vectors, "output" the attention after W_O, "block" the
#: block's output (attention and MLP added to the residual stream).
HEAD_STEPS = ("q", "k", "v", "scores", "scaled", "weights", "heads_out")
#: The naive softmax's steps, computed beside the model's and never fed forward.
NAIVE_STEPS = ("naive_exp", "naive_sum", "naive_weights")

#: How far a softmax row's sum may stray from 1 in each dtype. A bfloat16 weight keeps 8
#: significant bits: rounding each moves the row's sum by at most 2^-9 of it, in float32
#: the sum of T rounded terms by about T x 2^-24.
SUM_TOLERANCE = {"float32": 1e-4, "bfloat16": 2.0**-7}


@dataclass(frozen=True)
class Step:
    """One traced tensor: where it is computed and its value."""

    layer: int | None  # None: before the first block or after the last
    head: int | None  # None: all heads together
    name: str
    value: Tensor


def _where(step: dict[str, Any]) -> str:
    """``layer 0 head 1 scaled`` for a step's statistics or difference."""
    parts = [] if step["layer"] is None else [f"layer {step['layer']}"]
    parts += [] if step["head"] is None else [f"head {step['head']}"]
    return " ".join([*parts, step["step"]])


def _steps(net: LocusFormer, x: Tensor, amp: contextlib.AbstractContextManager) -> Iterator[Step]:
    """The model's steps on standardized ``x`` (B, L), one layer's tensors at a time.

    ``amp`` is entered for each layer's computation and left before its steps are yielded,
    so that two traces can be walked side by side, each in its own precision.
    """
    with torch.no_grad(), amp:
        h = net.embed(x)  # (B, T, D)
    yield Step(None, None, "standardized", x)
    yield Step(None, None, "embedding", h)
    for layer, block in enumerate(net.encoder.blocks):
        attn = block.attn
        H, K = attn.n_heads, attn.head_dim
        with torch.no_grad(), amp:
            inp = block.ln_1(h)  # (B, T, D)
            q, k, v = (
                t.unflatten(-1, (H, K)).transpose(1, 2)  # (B, H, T, K)
                for t in linear(inp, attn.in_proj).split(H * K, dim=-1)
            )
            scores = q @ k.transpose(-2, -1)  # (B, H, T, T)
            scaled = scores / math.sqrt(K)
            weights = stable_softmax(scaled)
            heads_out = weights @ v  # (B, H, T, K)
            output = linear(heads_out.transpose(1, 2).flatten(2), attn.out_proj)  # (B, T, D)
            # what the model runs (the fused path), against the trace's explicit one
            module_gap = attn(inp)[0].float() - output.float()
            naive_exp = torch.exp(scaled)  # no max subtraction: overflows above ~88.7
            naive_sum = naive_exp.sum(dim=-1, keepdim=True)
            naive = {"naive_exp": naive_exp, "naive_sum": naive_sum}
            naive["naive_weights"] = naive_exp / naive_sum
            h, _ = block(h)
        per_head = dict(zip(HEAD_STEPS, (q, k, v, scores, scaled, weights, heads_out), strict=True))
        yield Step(layer, None, "input", inp)
        for name, value in per_head.items():
            for head in range(H):
                yield Step(layer, head, name, value[:, head])
        yield Step(layer, None, "output", output)
        yield Step(layer, None, "module_minus_trace", module_gap)
        yield Step(layer, None, "block", h)
        for name, value in naive.items():
            for head in range(H):
                yield Step(layer, head, name, value[:, head])
    with torch.no_grad(), amp:
        h = net.encoder.ln_f(h)
        pooled = masked_mean(h, None, scaled=net.config.pooling == "scaled_mean")
        latent = linear(pooled, net.to_latent)
    yield Step(None, None, "latent", latent)


def _range(t: Tensor) -> dict[str, float | None]:
    finite = t[torch.isfinite(t)]
    if finite.numel() == 0:
        return {"min": None, "max": None}
    return {"min": float(finite.min()), "max": float(finite.max())}


def step_stats(step: Step, dtype: Precision) -> dict[str, Any]:
    """Shape, value range and non-finite counts of a step; row statistics where they apply."""
    t = step.value.detach().float()
    out: dict[str, Any] = {
        "layer": step.layer,
        "head": step.head,
        "step": step.name,
        "shape": list(t.shape),
        **_range(t),
        "n_nan": int(torch.isnan(t).sum()),
        "n_inf": int(torch.isinf(t).sum()),
    }
    if step.name in ("scores", "scaled"):
        out["row_max"] = _range(t.amax(dim=-1))
    if step.name in ("weights", "naive_weights"):
        sums = t.sum(dim=-1)
        out["row_sum"] = _range(sums)
        deviation = (sums - 1).abs().max()
        out["rows_sum_to_one"] = bool(deviation <= SUM_TOLERANCE[dtype])  # False for NaN
    if step.name == "weights":
        # 0 log 0 = 0; the most a row can have is log T (all keys alike)
        # (a row holding one weight of 1 gives -0.0: shown as 0)
        entropy = -(t * torch.log(t.clamp_min(1e-30))).sum(dim=-1) + 0.0
        out["entropy"] = {**_range(entropy), "mean": float(entropy.mean())}
        out["entropy"]["max_possible"] = math.log(t.shape[-1])
    return out


def _precision(
    net: LocusFormer, x: Tensor, dtype: Precision
) -> tuple[LocusFormer, Tensor, contextlib.AbstractContextManager, str]:
    """The network, input and autocast context of a run in ``dtype``, and how it runs."""
    device = x.device
    if dtype == "float32":
        return net, x, contextlib.nullcontext(), f"float32 on {device.type}"
    if device.type == "cuda":
        amp = torch.autocast("cuda", dtype=torch.bfloat16)
        return net, x, amp, "bfloat16 autocast on cuda, as training and correction run"
    # CPU autocast runs few ops in bf16; a cast copy shows what bf16 does to every step.
    cast = copy.deepcopy(net).to(torch.bfloat16)
    how = "bfloat16 simulated on the cpu: weights and inputs cast to bfloat16"
    return cast, x.to(torch.bfloat16), contextlib.nullcontext(), how


def _first(steps: list[dict], names: Sequence[str]) -> dict[str, Any] | None:
    for s in steps:
        if s["step"] in names and (s["n_nan"] or s["n_inf"]):
            return {k: s[k] for k in ("layer", "head", "step")}
    return None


def trace(
    model: TrainedModel,
    X: np.ndarray,
    *,
    dtypes: Sequence[Precision] = ("float32", "bfloat16"),
    device: str | torch.device = "cpu",
) -> dict[str, Any]:
    """Trace ``model`` on raw log-expression ``X`` (n, L) in each of ``dtypes``.

    Returns a JSON-ready dict: ``model`` (its sizes), ``runs`` (per dtype: how it ran, the
    statistics of every step, the first non-finite step of the model's path and of the
    naive softmax, and the largest difference between the trace and the module's output)
    and, with two dtypes, ``difference``: the largest absolute difference between them,
    over all steps and for the attention weights, with where it is.
    """
    if X.ndim != 2 or X.shape[1] != model.n_loci:
        raise InputError("expression matrix", f"need (samples, {model.n_loci}), got {X.shape}")
    dev = resolve_device(device)
    net = model.module
    was_training = net.training
    net.eval().to(dev)
    with torch.no_grad():
        xs = net.standardize(torch.as_tensor(X, dtype=torch.float32, device=dev))
    runs = [_precision(net, xs, dtype) for dtype in dtypes]
    results: list[dict[str, Any]] = [
        {"dtype": d, "how": how, "steps": []}
        for d, (_, _, _, how) in zip(dtypes, runs, strict=True)
    ]
    walks = [_steps(n, x, amp) for n, x, amp, _ in runs]
    diffs: list[dict[str, Any]] = []
    try:
        for steps in zip(*walks, strict=True):
            for result, step in zip(results, steps, strict=True):
                result["steps"].append(step_stats(step, result["dtype"]))
            if len(steps) == 2 and steps[0].name not in (*NAIVE_STEPS, "module_minus_trace"):
                diffs.append(_difference(*steps))
    finally:
        net.train(was_training)
    for result in results:
        steps = result["steps"]
        side = {*NAIVE_STEPS, "module_minus_trace"}
        result["first_nonfinite"] = _first(
            steps, [s["step"] for s in steps if s["step"] not in side]
        )
        result["naive_first_nonfinite"] = _first(steps, NAIVE_STEPS)
        result["stable_softmax_finite"] = all(
            not (s["n_nan"] or s["n_inf"]) for s in steps if s["step"] == "weights"
        )
        gaps = [s for s in steps if s["step"] == "module_minus_trace" and s["min"] is not None]
        result["trace_vs_module"] = max(
            (max(abs(s["min"]), abs(s["max"])) for s in gaps), default=None
        )
    out: dict[str, Any] = {"model": _sizes(model), "device": dev.type, "runs": results}
    if diffs:
        compared = [d for d in diffs if d["max_abs"] is not None]
        weights = [d for d in compared if d["step"] == "weights"]
        scaled = [d for d in compared if d["scale"]]
        out["difference"] = {
            "between": list(dtypes),
            "largest": max(compared, key=lambda d: d["max_abs"]) if compared else None,
            "largest_relative": (
                max(scaled, key=lambda d: d["max_abs"] / d["scale"]) if scaled else None
            ),
            "weights": max(weights, key=lambda d: d["max_abs"]) if weights else None,
            "latent": next((d for d in compared if d["step"] == "latent"), None),
            "steps": diffs,
        }
    return out


def _difference(a: Step, b: Step) -> dict[str, Any]:
    """Largest |a - b| where both are finite, and a's largest |value| to weigh it by."""
    x, y = a.value.detach().float().cpu(), b.value.detach().float().cpu()
    both = torch.isfinite(x) & torch.isfinite(y)
    out: dict[str, Any] = {"layer": a.layer, "head": a.head, "step": a.name}
    if not bool(both.any()):
        return {**out, "max_abs": None, "scale": None}
    diff = (x - y).abs()[both]
    return {**out, "max_abs": float(diff.max()), "scale": float(x[both].abs().max())}


def _sizes(model: TrainedModel) -> dict[str, int]:
    c = model.config
    return {
        "n_layers": c.n_layers,
        "n_heads": c.n_heads,
        "d_model": c.d_model,
        "head_dim": c.d_model // c.n_heads,
        "n_tokens": model.n_tokens,
        "patch_size": c.patch_size,
        "n_loci": model.n_loci,
    }


# --------------------------------------------------------------------------------------
# Text, and the file-level step of ``locusformer inspect``
# --------------------------------------------------------------------------------------


def _num(v: float | None) -> str:
    return "–" if v is None else f"{v:.4g}"


def _span(r: dict[str, Any]) -> str:
    return f"{_num(r['min'])}..{_num(r['max'])}"


def _row(s: dict[str, Any]) -> str:
    layer = "-" if s["layer"] is None else str(s["layer"])
    head = "-" if s["head"] is None else str(s["head"])
    shape = "(" + ", ".join(map(str, s["shape"])) + ")"
    notes = []
    if s["n_nan"] or s["n_inf"]:
        notes.append(f"NON-FINITE: {s['n_nan']} nan, {s['n_inf']} inf")
    if "row_max" in s:
        notes.append(f"row max {_span(s['row_max'])}")
    if "row_sum" in s:
        ok = "ok" if s["rows_sum_to_one"] else "NOT 1"
        notes.append(f"row sums {_span(s['row_sum'])} ({ok})")
    if "entropy" in s:
        e = s["entropy"]
        notes.append(
            f"entropy {_span(e)} nats, mean {_num(e['mean'])} (at most {_num(e['max_possible'])})"
        )
    return (
        f"{layer:>5} {head:>4}  {s['step']:<18} {shape:<18} {_num(s['min']):>11} "
        f"{_num(s['max']):>11}  {'; '.join(notes)}"
    ).rstrip()


def format_trace(result: dict[str, Any], naive: bool = False) -> str:
    """The trace as text: a table per dtype, then the non-finite findings and differences.

    The naive softmax's rows are left out of the tables unless ``naive``; its first
    non-finite step is always said.
    """
    m = result["model"]
    lines = [
        f"{m['n_layers']} layers x {m['n_heads']} heads of width {m['head_dim']} "
        f"(d_model {m['d_model']}), {m['n_tokens']} tokens of {m['patch_size']} loci, "
        f"{len(result.get('samples', []))} samples, on {result['device']}",
        "steps per layer: input = LayerNorm of the tokens; per head q, k, v, scores (Q·Kᵀ), "
        "scaled (÷ √d_k), weights (softmax, row max subtracted), heads_out (× V); output "
        "(· W_O); block (after the MLP). No mask: every token is real.",
    ]
    for run in result["runs"]:
        lines += [
            "",
            f"== {run['how']}",
            f"{'layer':>5} {'head':>4}  {'step':<18} {'shape':<18} {'min':>11} {'max':>11}  notes",
        ]
        for s in run["steps"]:
            if naive or s["step"] not in (*NAIVE_STEPS, "module_minus_trace"):
                lines.append(_row(s))
        first = run["first_nonfinite"]
        lines.append(
            "first non-finite value: "
            + ("none" if first is None else f"at {_where(first)} (the steps before are finite)")
        )
        first = run["naive_first_nonfinite"]
        stable = "finite" if run["stable_softmax_finite"] else "NOT finite"
        lines.append(
            "naive softmax (exp without the row max subtracted): "
            + ("finite" if first is None else f"first non-finite at {_where(first)}")
            + f"; the model's softmax: {stable}"
        )
        lines.append(
            f"trace against the model's own (fused) attention: max |diff| "
            f"{_num(run['trace_vs_module'])}"
        )
    diff = result.get("difference")
    if diff:
        a, b = diff["between"]
        lines.append("")
        big, rel, w = diff["largest"], diff["largest_relative"], diff["weights"]
        if big is not None:
            lines.append(
                f"largest difference {a} vs {b}: {_num(big['max_abs'])} at {_where(big)} "
                f"(values up to {_num(big['scale'])})"
            )
        if rel is not None:
            lines.append(
                f"largest relative to its step's values: {rel['max_abs'] / rel['scale']:.2%} "
                f"at {_where(rel)} ({_num(rel['max_abs'])} of {_num(rel['scale'])})"
            )
        if w is not None:
            lines.append(
                f"attention weights: largest difference {_num(w['max_abs'])} at {_where(w)}"
            )
        if diff["latent"] is not None:
            lines.append(f"latent: largest difference {_num(diff['latent']['max_abs'])}")
    return "\n".join(lines) + "\n"


def read_rows(
    matrix_path: str | os.PathLike,
    model: TrainedModel,
    n_samples: int,
    samples_path: str | os.PathLike | None = None,
    sample_column: str | None = None,
    seed: int | None = None,
) -> tuple[list[str], np.ndarray]:
    """Ids and values (k, L) of the samples to trace from an ordered matrix (parquet).

    The first ``n_samples`` rows, or, with a sample sheet, the first ``n_samples`` of the
    sheet's samples, which must all be in the matrix. With ``seed``, ``n_samples`` drawn
    at random (in the order of the sheet, or of the matrix without one) instead of the
    first: the first rows of a matrix often all come from one batch. Blocks are read until
    they are found.
    """
    if n_samples < 1:
        raise InputError("--n-samples", f"must be >= 1, got {n_samples}")
    handle, genes = open_matrix_parquet(matrix_path, "ordered matrix")
    n_rows = handle.metadata.num_rows
    handle.close()
    if model.gene_ids is not None and genes != model.gene_ids:
        raise InputError(
            matrix_path,
            f"gene columns differ from the {model.n_loci} loci the model was trained on "
            "(same genes in the same order required)",
        )
    rng = None if seed is None else np.random.default_rng(seed)
    # Without a sheet, rows are chosen by position: no list of every id is needed.
    wanted: list[str] | None = None
    positions: np.ndarray | None = None
    if samples_path is not None:
        from locusformer.io.expression import read_sample_sheet

        pool = read_sample_sheet(samples_path, sample_column).index.astype(str).tolist()
        wanted = pool[:n_samples]
        if rng is not None:
            drawn = rng.choice(len(pool), size=min(n_samples, len(pool)), replace=False)
            wanted = [pool[i] for i in np.sort(drawn)]
    elif rng is not None:
        positions = np.sort(rng.choice(n_rows, size=min(n_samples, n_rows), replace=False))
    else:
        positions = np.arange(min(n_samples, n_rows))
    found: dict[str, np.ndarray] = {}
    done = 0
    for block in iter_matrix_parquet(matrix_path, "ordered matrix"):
        if positions is not None:
            lo, hi = np.searchsorted(positions, [done, done + len(block)])
            rows = block.iloc[positions[lo:hi] - done]
            found.update(zip(rows.index, rows.to_numpy(dtype=np.float32), strict=True))
            done += len(block)
            if hi == len(positions):
                break
            continue
        for sample_id in block.index.intersection(wanted):
            found[sample_id] = block.loc[sample_id].to_numpy(dtype=np.float32)
        if len(found) >= len(wanted):
            break
    ids = list(found) if wanted is None else wanted
    missing = [i for i in ids if i not in found]
    if missing:
        raise InputError(samples_path, f"sample(s) not in {matrix_path}: {', '.join(missing[:5])}")
    return ids, np.stack([found[i] for i in ids])


def inspect_model(
    model_dir: str | os.PathLike,
    matrix_path: str | os.PathLike,
    samples_path: str | os.PathLike | None = None,
    *,
    n_samples: int = 4,
    sample_column: str | None = None,
    seed: int | None = None,
    device: str = "auto",
) -> dict[str, Any]:
    """The trace (see :func:`trace`) of the model in ``model_dir`` (model.pt, model.json)
    on samples of ``matrix_path`` (see :func:`read_rows`), with ``model_dir``,
    ``samples`` (their ids) and ``seed`` added."""
    directory = Path(model_dir)
    if not directory.is_dir():
        raise InputError(model_dir, "not a model folder (model.pt and model.json)")
    model = load_model(directory / "model.pt", directory / "model.json")
    ids, X = read_rows(matrix_path, model, n_samples, samples_path, sample_column, seed)
    result = trace(model, X, device=device)
    return {"model_dir": str(model_dir), "samples": ids, "seed": seed, **result}


def dump_trace(result: dict[str, Any]) -> str:
    """The trace as JSON text, the form ``locusformer report --trace`` reads."""
    return json.dumps(result, indent=1) + "\n"
