"""Does CUDA training repeat for a seed, and what would deterministic kernels cost?

Trains test_correct's model on its data (tests/quality_probe.py) twice per mode on the GPU
(bf16 autocast) and prints the largest weight difference between the two runs and the
seconds per run:

* ``default``: as ``train_corrector`` runs on CUDA (PyTorch's default kernels);
* ``deterministic``: under ``torch.use_deterministic_algorithms(True)`` with
  ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (set here, before CUDA starts). An op without a
  deterministic CUDA kernel raises, and the message names it.

Usage (on a machine with an NVIDIA GPU)::

    PYTHONPATH=src python benchmarks/cuda_repeat.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from quality_probe import DATA, MODEL, TRAIN, largest_weight_difference

from locusformer.simulate.datasets import simulate
from locusformer.train.loop import train_corrector


def run(sim, mode: str, max_epochs: int) -> dict:
    labels = [f"b{b}" for b in sim.batch]
    torch.use_deterministic_algorithms(mode == "deterministic")
    states, seconds = [], []
    try:
        for _ in range(2):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model, _ = train_corrector(
                sim.X, labels, sim.loci, MODEL, {**TRAIN, "max_epochs": max_epochs}, seed=0,
                device="cuda", progress=False,
            )  # fmt: skip
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - t0)
            states.append(model.module.state_dict())
    except RuntimeError as err:  # an op without a deterministic kernel
        return {"mode": mode, "error": str(err).splitlines()[0]}
    finally:
        torch.use_deterministic_algorithms(False)
    diff = largest_weight_difference(states[0], states[1])
    return {"mode": mode, "largest_weight_difference": diff, "seconds": seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    parser.add_argument("--max-epochs", type=int, default=TRAIN["max_epochs"])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("cuda_repeat: no CUDA device; nothing to measure.")
        return 0
    sim = simulate(**DATA)
    results = []
    for mode in ("default", "deterministic"):
        results.append(run(sim, mode, args.max_epochs))
        print(results[-1], flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
