"""The report's section "Attention, step by step": the trace of ``locusformer inspect``.

From ``inspect.json`` (:func:`locusformer.infer.trace.inspect_model`, which the workflow's
``inspect`` rule writes): a table per layer of the steps against the heads (the value
ranges of Q, K and V, of the scores before and after the ÷ √d_k scaling and their row
maxima, of the softmax weights, with their row sums and entropy, and of the heads'
output; the non-finite values; the difference between float32 and bfloat16), the checks
over all layers and heads, and a one-line verdict: the first non-finite value, or where
a softmax without the row maximum subtracted would overflow.

The JSON is all this module reads: the report's environment has no torch, and
:mod:`locusformer.infer.trace` imports it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from locusformer.errors import InputError, one_line

PathLike = str | os.PathLike

#: exp of more overflows float32; bfloat16 has float32's exponent range, so the same bound.
EXP_OVERFLOW = math.log(float(np.finfo(np.float32).max))

#: The per-head rows of a layer's table: (step, what of it, label). ``None`` is the step's
#: own range; the others are the row statistics :func:`locusformer.infer.trace.step_stats` adds.
HEAD_ROWS = (
    ("q", None, "Q"),
    ("k", None, "K"),
    ("v", None, "V"),
    ("scores", None, "scores Q·Kᵀ"),
    ("scaled", None, "scaled ÷ √d_k"),
    ("scaled", "row_max", "row maxima of the scaled scores"),
    ("weights", None, "softmax weights"),
    ("weights", "row_sum", "max |row sum − 1|"),
    ("weights", "entropy", "entropy of a row (nats)"),
    ("heads_out", None, "heads' output (× V)"),
)
#: The steps of a layer's table that hold every head: (step, label, before the heads).
LAYER_ROWS = (
    ("input", "input (LayerNorm of the tokens)", True),
    ("output", "output (· W_O)", False),
    ("block", "block output (+ MLP)", False),
)
#: The steps one head's count of non-finite values is over, and the naive softmax's.
HEAD_STEPS = ("q", "k", "v", "scores", "scaled", "weights", "heads_out")
NAIVE_STEPS = {
    "naive_exp": "exp of the scaled scores",
    "naive_sum": "the row sums of that exp",
    "naive_weights": "exp / sum",
}
#: The steps whose float32 vs bfloat16 difference a layer's table shows per head.
DIFFERENCE_ROWS = (
    ("scaled", "|float32 − bfloat16|, scaled"),
    ("weights", "|float32 − bfloat16|, weights"),
)

Key = tuple[int | None, int | None, str]


# --------------------------------------------------------------------------- helpers


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"


def _small(value: float | None) -> str:
    """A deviation from 1 or a difference, which spans orders of magnitude."""
    return "–" if value is None else f"{value:.2g}"


def _span(r: Mapping[str, Any]) -> str:
    return f"{_num(r['min'])} … {_num(r['max'])}"


def _shape(shape: Iterable[int]) -> str:
    return "(" + ", ".join(str(int(n)) for n in shape) + ")"


def _where(step: Mapping[str, Any]) -> str:
    """``layer 0 head 1 scaled``, as ``locusformer inspect`` names a step (no step name:
    ``layer 0 head 1``)."""
    parts = [] if step["layer"] is None else [f"layer {step['layer']}"]
    parts += [] if step["head"] is None else [f"head {step['head']}"]
    return " ".join([*parts, str(step["step"])]).strip()


def _nonfinite(stats: Mapping[str, Any]) -> int:
    return int(stats["n_nan"]) + int(stats["n_inf"])


def _sum_deviation(stats: Mapping[str, Any]) -> float | None:
    """max |row sum − 1| of a weights step; None where no row sum was finite."""
    r = stats["row_sum"]
    if r["min"] is None:
        return None
    return max(abs(float(r["min"]) - 1), abs(float(r["max"]) - 1))


def _index(run: Mapping[str, Any]) -> dict[Key, dict[str, Any]]:
    return {(s["layer"], s["head"], s["step"]): s for s in run["steps"]}


# --------------------------------------------------------------------------- tables


def _cell(key: Key, runs: list[dict[Key, dict]], dtypes: list[str], text: str) -> dict[str, Any]:
    """One cell: ``text`` (from the first run), marked where any run had a non-finite value."""
    notes = [
        f"{runs[i][key]['n_nan']} nan, {runs[i][key]['n_inf']} inf in {dtype}"
        for i, dtype in enumerate(dtypes)
        if _nonfinite(runs[i][key])
    ]
    return {"text": "; ".join([text, *notes]), "bad": bool(notes)}


def _head_cell(
    key: Key, what: str | None, runs: list[dict[Key, dict]], dtypes: list[str]
) -> dict[str, Any]:
    first = runs[0][key]
    if what is None:
        return _cell(key, runs, dtypes, _span(first))
    if what == "row_max":
        return {"text": _span(first["row_max"]), "bad": False}
    if what == "entropy":
        return {"text": _span(first["entropy"]), "bad": False}
    # row sums: every dtype's, since bfloat16's rounding is what the check is for
    text = " / ".join(_small(_sum_deviation(run[key])) for run in runs)
    return {"text": text, "bad": not all(run[key]["rows_sum_to_one"] for run in runs)}


def _layer_table(
    layer: int,
    n_heads: int,
    runs: list[dict[Key, dict]],
    dtypes: list[str],
    differences: dict[Key, dict],
) -> dict[str, Any]:
    heads = list(range(n_heads))
    first = runs[0]
    rows: list[dict[str, Any]] = []

    def wide(step: str, label: str) -> dict[str, Any]:
        key = (layer, None, step)
        cell = _cell(key, runs, dtypes, _span(first[key]))
        return {"label": label, "shape": _shape(first[key]["shape"]), "cells": [cell], "span": True}

    rows += [wide(step, label) for step, label, before in LAYER_ROWS if before]
    for step, what, label in HEAD_ROWS:
        shape = first[(layer, 0, step)]["shape"]
        rows.append(
            {
                "label": label,
                "shape": _shape(shape if what is None else shape[:-1]),
                "cells": [_head_cell((layer, h, step), what, runs, dtypes) for h in heads],
                "span": False,
            }
        )
    counts = []
    for h in heads:
        per_run = [sum(_nonfinite(run[(layer, h, s)]) for s in HEAD_STEPS) for run in runs]
        counts.append({"text": " / ".join(map(str, per_run)), "bad": any(per_run)})
    rows.append({"label": "non-finite values", "shape": "", "cells": counts, "span": False})
    naive = []
    for h in heads:
        over = [
            d for run, d in zip(runs, dtypes, strict=True) if run[(layer, h, "naive_exp")]["n_inf"]
        ]
        naive.append(
            {"text": "overflows in " + ", ".join(over) if over else "finite", "bad": False}
        )
    rows.append({"label": "naive softmax (no row max)", "shape": "", "cells": naive, "span": False})
    if differences:
        for step, label in DIFFERENCE_ROWS:
            cells = [
                {"text": _small(differences[(layer, h, step)]["max_abs"]), "bad": False}
                for h in heads
            ]
            shape = _shape(first[(layer, 0, step)]["shape"])
            rows.append({"label": label, "shape": shape, "cells": cells, "span": False})
    rows += [wide(step, label) for step, label, before in LAYER_ROWS if not before]
    return {"layer": layer, "heads": heads, "rows": rows}


# --------------------------------------------------------------------------- checks


def _checks(result: Mapping[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The softmax row-sum check, the entropy range, the largest scaled score and the
    differences, over every layer and head."""
    weights = [[s for s in run["steps"] if s["step"] == "weights"] for run in runs]
    sums = []
    for run, steps in zip(runs, weights, strict=True):
        deviations = [_sum_deviation(s) for s in steps]
        finite = [d for d in deviations if d is not None]
        sums.append(
            {
                "dtype": run["dtype"],
                "max_deviation": max(finite) if len(finite) == len(deviations) else None,
                "ok": all(s["rows_sum_to_one"] for s in steps),
            }
        )
    entropies = [s["entropy"] for s in weights[0] if s["entropy"]["min"] is not None]
    entropy = None
    if entropies:
        entropy = {
            "min": min(e["min"] for e in entropies),
            "max": max(e["max"] for e in entropies),
            "mean": float(np.mean([e["mean"] for e in entropies])),
            "max_possible": entropies[0]["max_possible"],
        }
    scaled = [s for s in runs[0]["steps"] if s["step"] == "scaled" and s["max"] is not None]
    top = max(scaled, key=lambda s: s["max"], default=None)
    out: dict[str, Any] = {
        "row_sums": sums,
        "entropy": entropy,
        "top_scaled": (
            None if top is None else {"value": top["max"], "where": _where({**top, "step": ""})}
        ),
        "trace_vs_module": [(run["dtype"], run["trace_vs_module"]) for run in runs],
        "difference": None,
    }
    diff = result.get("difference")
    if diff:
        found = {}
        for name in ("largest", "largest_relative", "weights", "latent"):
            d = diff.get(name)
            if d is not None:
                found[name] = {
                    "max_abs": d["max_abs"],
                    "scale": d["scale"],
                    "share": d["max_abs"] / d["scale"] if d["scale"] else None,
                    "where": _where(d),
                }
        out["difference"] = {"between": list(diff["between"]), **found}
    return out


def trace_verdict(runs: list[dict[str, Any]], checks: Mapping[str, Any]) -> dict[str, str]:
    """One sentence on the trace and its ``level``: ``nonfinite``, ``note`` or ``ok``.

    The first non-finite value (float32's first, then each other dtype's) wins; without
    one, where the naive softmax would overflow first, or by how far it stays finite.
    """
    dtypes = [run["dtype"] for run in runs]
    broken = [(run["dtype"], run["first_nonfinite"]) for run in runs if run["first_nonfinite"]]
    if broken:
        # one clause per place, naming the dtypes that went non-finite there
        places: dict[str, list[str]] = {}
        for dtype, first in broken:
            head = _where({**first, "step": ""})
            places.setdefault(f"{head}, step {first['step']}".lstrip(", "), []).append(dtype)
        said = [f"at {place}, in {' and '.join(d)}" for place, d in places.items()]
        clean = [d for d in dtypes if d not in {dtype for dtype, _ in broken}]
        text = "First non-finite value " + "; ".join(said)
        if clean:
            text += f" ({', '.join(clean)} finite throughout)"
        return {"text": text + ".", "level": "nonfinite"}
    text = f"No non-finite value in {' or '.join(dtypes)}"
    level = "ok"
    naive = [(run["dtype"], run["naive_first_nonfinite"]) for run in runs]
    overflow = [(dtype, first) for dtype, first in naive if first]
    if overflow:
        dtype, first = overflow[0]
        head = _where({**first, "step": ""})
        step = NAIVE_STEPS.get(first["step"], first["step"])
        text += (
            "; the naive softmax (without the row maximum subtracted) would overflow first"
            f" at {head} ({step}, in {dtype})"
        )
        level = "note"
    elif checks["top_scaled"] is not None:
        top = checks["top_scaled"]
        text += (
            f"; the naive softmax would stay finite too: the largest scaled score,"
            f" {_num(top['value'])} at {top['where']}, is below {EXP_OVERFLOW:.1f}, where exp"
            " overflows"
        )
    stray = [s for s in checks["row_sums"] if not s["ok"]]
    if stray:
        text += "; softmax rows do not sum to 1 in " + ", ".join(
            f"{s['dtype']} (max |sum − 1| {_small(s['max_deviation'])})" for s in stray
        )
        level = "note"
    return {"text": text + ".", "level": level}


# --------------------------------------------------------------------------- section


def trace_section(trace_json: PathLike | None, mapped_onto: str | None = None) -> dict:
    """The section from ``inspect.json``, or, for a dataset mapped onto a trained model
    (``mapped_onto``, its name), a note that the trace belongs with that model.

    Neither: ``shown`` is False and the report has no such section.
    """
    section: dict[str, Any] = {
        "available": False,
        "shown": mapped_onto is not None,
        "mapped_onto": mapped_onto,
    }
    if trace_json is None:
        return section
    try:
        with open(trace_json, encoding="utf-8") as handle:
            result = json.load(handle)
    except (OSError, ValueError) as exc:
        raise InputError(trace_json, f"cannot read the trace: {one_line(exc)}") from None
    try:
        section.update(_assemble(result))
    except (KeyError, TypeError, IndexError, ValueError, AttributeError) as exc:
        raise InputError(
            trace_json, f"not a trace of locusformer inspect --json ({one_line(exc)})"
        ) from None
    section.update(available=True, shown=True)
    return section


def _assemble(result: Mapping[str, Any]) -> dict[str, Any]:
    model, runs = result["model"], list(result["runs"])
    if not runs:
        raise ValueError("no run")
    dtypes = [str(run["dtype"]) for run in runs]
    indexed = [_index(run) for run in runs]
    diff = result.get("difference") or {}
    differences = {(d["layer"], d["head"], d["step"]): d for d in diff.get("steps", [])}
    layers = [
        _layer_table(layer, int(model["n_heads"]), indexed, dtypes, differences)
        for layer in range(int(model["n_layers"]))
    ]
    checks = _checks(result, runs)
    samples = [str(s) for s in result.get("samples", [])]
    return {
        "model": {k: int(v) for k, v in model.items()},
        "samples": samples,
        "n_samples": len(samples) or int(runs[0]["steps"][0]["shape"][0]),
        "seed": result.get("seed"),
        "device": str(result.get("device", "")),
        "runs": [{"dtype": d, "how": str(run["how"])} for d, run in zip(dtypes, runs, strict=True)],
        "dtypes": dtypes,
        "layers": layers,
        "checks": checks,
        "verdict": trace_verdict(runs, checks),
        "exp_overflow": EXP_OVERFLOW,
    }
