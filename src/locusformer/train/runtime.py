"""Where and how a run computes: the device, mixed precision, determinism and seeds.

One seed fixes every random stream of a run (Python's, NumPy's global one, torch's and
the shuffling generator); :func:`rng_state` and :func:`set_rng_state` carry them through
a checkpoint, so a resumed run draws what an uninterrupted one would have drawn.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from locusformer.errors import InputError


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """ "auto" -> CUDA when available, else CPU; "cpu", "cuda", "cuda:1" as given."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise InputError("device", f"cannot parse {device!r} ({err})") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError("device", f"{device!r} requested but CUDA is not available")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InputError("device", f"{device!r}: only {torch.cuda.device_count()} GPU(s)")
    elif dev.type != "cpu":
        raise InputError("device", f"unsupported device {device!r} (use auto, cpu or cuda[:N])")
    return dev


def autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA (no loss scaling needed); fp32 on CPU, where bf16 is slow."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def deterministic(enabled: bool) -> Iterator[None]:
    """Turn on ``torch.use_deterministic_algorithms`` for the block, then restore."""
    before = torch.are_deterministic_algorithms_enabled()
    before_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    if enabled:
        torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=before_warn)


@contextlib.contextmanager
def evaluating_on_cpu(net: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``net`` in eval mode on the CPU for the block (a check after training, in fp32),
    then back in its mode on its device."""
    was_training = net.training
    device = next(net.parameters()).device
    net.eval().cpu()
    try:
        yield net
    finally:
        net.train(was_training).to(device)


def sampled_rows(n: int, most: int, key: list[int]) -> np.ndarray:
    """Sorted rows of ``n``: all, or ``most`` drawn without replacement by the generator
    seeded with ``key`` where there are more."""
    if n <= most:
        return np.arange(n)
    return np.sort(np.random.default_rng(key).choice(n, most, False))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 - the global state third-party code uses
    torch.manual_seed(seed)


def rng_state(generator: torch.Generator) -> dict[str, Any]:
    np_state = np.random.get_state()  # noqa: NPY002
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "generator": generator.get_state(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "python": random.getstate(),
    }


def set_rng_state(state: Mapping[str, Any], generator: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    generator.set_state(state["generator"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))  # noqa: NPY002
    random.setstate(state["python"])
