"""Did ``torch.compile`` make training lose the batch correction on CUDA?

One run on an H200 (PyTorch 2.11, bf16 autocast) of a model trained with its encoder
compiled kept the batch in its latent (probe 1.0 against 0.51 eager), and the setting
was refused on CUDA (docs/notes/2026-12-04.md). This script separates the places such a
failure can come from, on test_correct's data (tests/quality_probe.py):

1. **One step, same weights and minibatch** (dropout off): the compiled encoder's latent,
   loss terms and every parameter's gradient against the eager encoder's, in fp32 and in
   bf16 autocast; then six AdamW steps of both copies, with and without a first call
   under ``torch.inference_mode`` (as the cluster search makes). A compiler bug in
   forward or backward shows here.
2. **Training**, per seed, eager or compiled, under bf16 autocast or in fp32: the
   probes, the first epoch at which the cluster term's gates opened (the term is 0 until
   then), and -- for a compiled run -- the probes again from an eager copy of the same
   weights. A latent that differs between the two copies means the compiled *inference*
   is wrong, not the training.

The answer (docs/notes/2026-12-04.md): no compiler fault found. Compiled and eager steps
agree to fp32 rounding in fp32; the failed run was seed 0's gates not opening within
the run, which compiled seeds 1-5 and every eager seed did.

Usage (``--device cpu`` runs the same checks here, slowly)::

    PYTHONPATH=src python benchmarks/compile_diagnosis.py --device cuda --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from quality_probe import DATA, MODEL, TRAIN, probe

import locusformer.train.loop
from locusformer.infer.correct import correct
from locusformer.model.config import ModelConfig, TrainConfig
from locusformer.model.files import TrainedModel
from locusformer.model.layout import build_layout
from locusformer.model.network import LocusFormer
from locusformer.simulate.datasets import simulate
from locusformer.train.data import batch_prior
from locusformer.train.loop import train_corrector
from locusformer.train.runtime import autocast
from locusformer.train.schedule import loss_weights


def _precision(name: str, dev: torch.device) -> contextlib.AbstractContextManager:
    return autocast(dev) if name == "bf16" else contextlib.nullcontext()


def _pair(sim, dev: torch.device) -> tuple[LocusFormer, LocusFormer, np.ndarray]:
    """A fresh model on ``dev`` in eval mode (dropout off: both copies compute the same
    function), a copy with its encoder compiled, and the data as float32."""
    mc = ModelConfig(**MODEL)
    torch.manual_seed(0)
    layout = build_layout(sim.loci, mc.patch_size, mc.position_scale, mc.coordinate_unit)
    eager = LocusFormer(mc, layout, 2)
    X = sim.X.astype(np.float32)
    eager.set_standardization(X.mean(0), X.std(0) + 1e-6)
    eager.to(dev).eval()
    compiled = copy.deepcopy(eager)
    compiled.encoder.compile()
    return eager, compiled, X


def one_step(sim, dev: torch.device, precision: str) -> dict:
    """Latent, loss and gradients of one training step, compiled against eager."""
    tc = TrainConfig(**TRAIN)
    eager, compiled, X = _pair(sim, dev)
    x = eager.standardize(torch.from_numpy(X[:64]).to(dev))
    b = torch.from_numpy(sim.batch[:64].astype(np.int64)).to(dev)
    weights = loss_weights(tc, 1.0)
    prior = batch_prior(sim.batch.astype(np.int64), 2, dev)
    result = {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        model.zero_grad(set_to_none=True)
        with _precision(precision, dev):
            out = model(x, b, adversary_weight=weights.confusion, adversary=tc.adversary)
        loss = model.loss(x, b, out, weights, prior)
        loss.total.backward()
        result[name] = (
            out.latent.detach().float(),
            torch.stack(list(loss)).detach().float(),
            {k: p.grad.detach().float().clone() for k, p in model.named_parameters()
             if p.grad is not None},
        )  # fmt: skip
    (z_e, l_e, g_e), (z_c, l_c, g_c) = result["eager"], result["compiled"]
    grads = {}
    for k in g_e:
        if k not in g_c:
            grads[k] = "no gradient in the compiled copy"
            continue
        scale = g_e[k].norm().item()
        grads[k] = (g_c[k] - g_e[k]).norm().item() / max(scale, 1e-12)
    missing = sorted(set(g_c) ^ set(g_e))
    numeric = [v for v in grads.values() if isinstance(v, float)]
    worst = sorted(((v, k) for k, v in grads.items() if isinstance(v, float)), reverse=True)[:5]
    return {
        "precision": precision,
        "latent_rel_diff": ((z_c - z_e).norm() / z_e.norm()).item(),
        "loss_terms_eager": l_e.tolist(),
        "loss_terms_compiled": l_c.tolist(),
        "grad_rel_diff_max": max(numeric) if numeric else None,
        "grad_rel_diff_median": float(np.median(numeric)) if numeric else None,
        "worst_params": [[k, v] for v, k in worst],
        "params_with_gradient_in_one_copy_only": missing,
    }


def few_steps(sim, dev: torch.device, inference_first: bool, n_steps: int = 6) -> dict:
    """Compiled and eager copies stepped by AdamW on the same minibatches (dropout off):
    the latents' relative difference after each step. ``inference_first`` calls the
    compiled encoder under ``torch.inference_mode`` first, as training's cluster search
    does at an epoch's start, to see whether that first graph leaks into training's."""
    tc = TrainConfig(**TRAIN)
    eager, compiled, X = _pair(sim, dev)
    weights = loss_weights(tc, 1.0)
    prior = batch_prior(sim.batch.astype(np.int64), 2, dev)
    xs = eager.standardize(torch.from_numpy(X).to(dev))
    bs = torch.from_numpy(sim.batch.astype(np.int64)).to(dev)
    if inference_first:
        with torch.inference_mode(), autocast(dev):
            compiled.encode(xs[:256])
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (eager, compiled)]
    diffs, moved = [], []
    start = compiled.encode(xs[:64])[0].detach().float()
    for step in range(n_steps):
        rows = slice(16 * step, 16 * step + 16)
        for model, opt in zip((eager, compiled), opts, strict=True):
            opt.zero_grad(set_to_none=True)
            with autocast(dev):
                out = model(xs[rows], bs[rows], adversary_weight=weights.confusion,
                            adversary=tc.adversary)  # fmt: skip
            model.loss(xs[rows], bs[rows], out, weights, prior).total.backward()
            opt.step()
        with torch.no_grad(), autocast(dev):
            ze = eager.encode(xs[:64])[0].float()
            zc = compiled.encode(xs[:64])[0].float()
        diffs.append(((zc - ze).norm() / ze.norm()).item())
        moved.append(((zc - start).norm() / start.norm()).item())
    return {"inference_first": inference_first, "latent_rel_diff_per_step": diffs,
            "compiled_latent_moved_from_start": moved}  # fmt: skip


def quality(model: TrainedModel, sim, dev: torch.device) -> dict:
    corrected, latent = correct(model, sim.X, [f"b{b}" for b in sim.batch], device=dev)
    return {
        "batch_corrected": probe(corrected, sim.batch),
        "batch_latent": probe(latent, sim.batch),
        "group_corrected": probe(corrected, sim.group),
        "latent": latent,
    }


def eager_copy(model: TrainedModel) -> TrainedModel:
    m = model.module
    state = {k: v.detach().cpu() for k, v in m.state_dict().items()}
    module = LocusFormer.from_state_dict(m.config, state, m.n_batches)
    return TrainedModel(module.eval(), model.record)


def train_once(sim, dev: torch.device, compiled: bool, precision: str, seed: int = 0) -> dict:
    saved = locusformer.train.loop.autocast
    if precision == "fp32":
        locusformer.train.loop.autocast = lambda device: contextlib.nullcontext()
    try:
        t0 = time.perf_counter()
        model, history = train_corrector(
            sim.X, [f"b{b}" for b in sim.batch], sim.loci, MODEL,
            {**TRAIN, "compile": compiled}, seed=seed, device=dev, progress=False,
        )  # fmt: skip
        seconds = time.perf_counter() - t0
    finally:
        locusformer.train.loop.autocast = saved
    q = quality(model, sim, dev)
    row = {k: v for k, v in q.items() if k != "latent"}
    row["seconds"] = seconds
    cols = ["epoch", "train_recon", "val_recon", "train_disc_acc"]
    cols += ["train_confusion", "train_batch_mean"]
    cols = [c for c in cols if c in history.columns]
    row["history"] = history[cols].round(4).to_dict("list")
    # The cluster term's gates (batch_mean_scope "clusters") open once the batches share
    # the latent's clusters; until then the term is 0 and the adversary alone acts.
    late = history[history["epoch"] > TRAIN["adversary_rampup_epochs"]]
    opened = late.loc[late["train_batch_mean"] != 0, "epoch"]
    row["first_epoch_with_open_gate"] = int(opened.iloc[0]) if len(opened) else None
    row["best_epoch"] = int(history["val_recon"].iloc[TRAIN["adversary_rampup_epochs"] - 1 :]
                            .idxmin()) + 1  # fmt: skip
    if compiled:
        e = quality(eager_copy(model), sim, dev)
        row["eager_copy"] = {k: v for k, v in e.items() if k != "latent"}
        row["latent_rel_diff_compiled_vs_eager_copy"] = float(
            np.linalg.norm(q["latent"] - e["latent"]) / np.linalg.norm(e["latent"])
        )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--skip-one-step", action="store_true")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument(
        "--runs", nargs="+", default=["eager bf16", "compiled bf16", "compiled fp32"],
        choices=["eager bf16", "compiled bf16", "eager fp32", "compiled fp32"],
    )  # fmt: skip
    args = parser.parse_args()
    dev = torch.device(args.device)
    sim = simulate(**DATA)
    report: dict = {"torch": torch.__version__, "device": str(dev)}
    if dev.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(dev)
    if not args.skip_one_step:
        report["one_step"] = [one_step(sim, dev, p) for p in ("fp32", "bf16")]
        report["few_steps"] = [few_steps(sim, dev, first) for first in (False, True)]
        for r in report["one_step"] + report["few_steps"]:
            print(json.dumps(r), flush=True)
    if not args.skip_training:
        report["training"] = {}
        for seed in args.seeds:
            for name in args.runs:
                mode, precision = name.split()
                row = train_once(sim, dev, mode == "compiled", precision, seed)
                report["training"][f"{name}, seed {seed}"] = row
                summary = {k: v for k, v in row.items() if k != "history"}
                print(f"{name}, seed {seed}", json.dumps(summary), flush=True)
                if args.json:  # after every run, so a run cut off by a time limit leaves the rest
                    args.json.write_text(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
