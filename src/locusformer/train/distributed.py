"""Training on several devices: DistributedDataParallel, one process per device.

torchrun starts the processes (the workflow's train rule does); :func:`init_distributed`
joins them into a process group, and :func:`gather_rows` collects the latents of a whole
global minibatch, with gradient, for the loss terms that need every sample of it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from locusformer.errors import InputError
from locusformer.train.runtime import resolve_device


@dataclass
class Dist:
    world: int
    rank: int
    owns_group: bool  # this process initialized the process group (and destroys it)
    comm_device: torch.device  # where collectives' tensors live (cuda for nccl)


def init_distributed(devices: int, device: str | torch.device) -> tuple[Dist | None, torch.device]:
    """The process group and this process's device; (None, device) for one device.

    Under torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` set) each process takes
    ``cuda:LOCAL_RANK`` with "auto" or "cuda" when there are GPUs (backend nccl), else the
    CPU (backend gloo). A process group that the caller initialized is used as it is.
    """
    if devices == 1:
        return None, resolve_device(device)
    import torch.distributed as tdist

    if not tdist.is_available():
        raise InputError("training.devices", "this PyTorch build has no torch.distributed")
    initialized = tdist.is_initialized()
    if not initialized and "WORLD_SIZE" not in os.environ:
        raise InputError(
            "training.devices",
            f"{devices} devices need one process each: launch with "
            f"`torchrun --nproc-per-node {devices} -m locusformer train ...` "
            "(the workflow's train rule does)",
        )
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if str(device) == "cuda":
        resolve_device(device)  # says so when there is no CUDA
    if str(device) in ("auto", "cuda") and torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise InputError(
                "training.devices",
                f"process {local_rank} has no GPU: only {torch.cuda.device_count()} visible",
            )
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    elif str(device) in ("auto", "cpu"):
        dev = torch.device("cpu")
    else:
        raise InputError(
            "device",
            f"{device!r} with training.devices {devices}: use auto, cuda or cpu "
            "(each process takes the GPU of its local rank)",
        )
    if not initialized:
        tdist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    world = tdist.get_world_size()
    # The rule gives the job its threads (OMP_NUM_THREADS); its processes share them.
    torch.set_num_threads(max(1, torch.get_num_threads() // world))
    if world != devices:
        raise InputError("training.devices", f"is {devices} but {world} processes were launched")
    comm = dev if tdist.get_backend() == "nccl" else torch.device("cpu")
    return Dist(world, tdist.get_rank(), not initialized, comm), dev


class _AllGather(torch.autograd.Function):
    """(m, ...) on each of W processes -> (W, m, ...) everywhere, with gradient.

    Backward: every process's gradient with respect to the gathered tensor is summed
    (all-reduce) and each takes the slice of its own rows. All-reduce is what both gloo
    and nccl support; the tensors (latents of one batch) are small.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, world: int, rank: int) -> torch.Tensor:
        ctx.rank = rank
        parts = [torch.empty_like(x) for _ in range(world)]
        torch.distributed.all_gather(parts, x.contiguous())
        return torch.stack(parts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        grad = grad.contiguous().clone()
        torch.distributed.all_reduce(grad)
        return grad[ctx.rank], None, None


def gather_rows(z: torch.Tensor, sizes: list[int], rank: int) -> torch.Tensor:
    """Every process's valid rows of ``z``, concatenated in rank order, with gradient.

    Shares of a global batch differ in size by at most one row (and a process may hold
    none), so they are padded for the collective and trimmed after. The backward pass sums
    each process's gradient into the rows it contributed.
    """
    most = max(sizes)
    mine = z[: sizes[rank]]
    padded = F.pad(mine, (0, 0, 0, most - mine.shape[0]))
    parts = _AllGather.apply(padded, len(sizes), rank)
    return torch.cat([part[:n] for part, n in zip(parts, sizes, strict=True)])
