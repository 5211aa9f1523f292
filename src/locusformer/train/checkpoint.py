"""What outlives a process: training checkpoints, and the trained model on disk.

A trained model is its network (:class:`~locusformer.model.network.LocusFormer`, weights only)
and a :class:`ModelRecord`: the batch names, the loci in token order, the seed, the
normalization its input had and the versions that made it, everything needed to prepare
new data the way the training data was prepared, without the training data. Together
they are a :class:`TrainedModel`, which :func:`save_model` writes and :func:`load_model`
reads (scvi-tools splits its models the same way: module, training plan, save/load).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from locusformer.model.config import ModelConfig, TrainConfig
from locusformer.model.files import cpu_state, save_atomic
from locusformer.train.runtime import rng_state, set_rng_state

CHECKPOINT_FORMAT = 2


def fingerprint(
    X: np.ndarray,
    batch_labels: Sequence[str],
    loci: pd.DataFrame,
    model_config: ModelConfig,
    train_config: TrainConfig,
    seed: int,
    covariates: np.ndarray | None = None,
) -> str:
    """Hash of everything that determines a training run (not the device)."""
    h = hashlib.blake2b(digest_size=16)
    # The number of processes and where the matrix is kept do not change what is trained
    # (a checkpoint resumes with another count), and leaving them out keeps fingerprints
    # of earlier runs valid.
    unused = ("devices", "data_on_disk", "compile")
    train = {k: v for k, v in train_config.to_dict().items() if k not in unused}
    meta = {
        "model": model_config.to_dict(),
        "train": train,
        "seed": seed,
        "shape": list(X.shape),
        "batches": list(map(str, batch_labels)),
        "loci": loci.astype(str).to_dict(orient="list"),
    }
    h.update(json.dumps(meta, sort_keys=True).encode())
    h.update(memoryview(X).cast("B"))
    if covariates is not None:
        h.update(np.ascontiguousarray(covariates, dtype=np.int64).tobytes())
    return h.hexdigest()


@dataclass
class TrainingState:
    """Everything an epoch changes besides the model, optimizer and scheduler."""

    epoch: int = 0  # epochs completed
    best_loss: float = math.inf
    best_state: dict[str, torch.Tensor] | None = None
    bad_epochs: int = 0
    stopped: bool = False
    extended: bool = False  # the batches shared every cluster: the run was made longer
    history: list[dict[str, float]] = dataclasses.field(default_factory=list)


def save_checkpoint(
    path: str | os.PathLike,
    fp: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    generator: torch.Generator,
    state: TrainingState,
) -> None:
    """Everything a run needs to continue after ``state.epoch`` epochs, atomically."""
    payload = {
        "format": CHECKPOINT_FORMAT,
        "fingerprint": fp,
        "model": cpu_state(model),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": rng_state(generator),
        "epoch": state.epoch,
        "best_loss": state.best_loss,
        "best_state": state.best_state,
        "bad_epochs": state.bad_epochs,
        "stopped": state.stopped,
        "extended": state.extended,
        "history": state.history,
    }
    save_atomic(payload, path)


def resume(
    path: str | os.PathLike,
    fp: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    generator: torch.Generator,
) -> TrainingState | None:
    """Restore a matching checkpoint into the given objects; None if there is none."""
    if not Path(path).exists():
        return None
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a torn or foreign file: start over, don't crash
        warnings.warn(f"{path}: unreadable checkpoint ({err}); starting fresh", stacklevel=3)
        return None
    if not isinstance(ckpt, dict) or not _RESUMABLE <= set(ckpt):
        warnings.warn(f"{path}: not a LocusFormer checkpoint; starting fresh", stacklevel=3)
        return None
    if ckpt.get("format") != CHECKPOINT_FORMAT or ckpt.get("fingerprint") != fp:
        warnings.warn(
            f"{path}: checkpoint is from a different run (data, config or seed); starting fresh",
            stacklevel=3,
        )
        return None
    # A file with the right keys and the wrong contents must not leave the fresh objects
    # half-restored: what they held is put back before starting over.
    fresh = copy.deepcopy((model.state_dict(), optimizer.state_dict(), scheduler.state_dict()))
    try:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        set_rng_state(ckpt["rng"], generator)
        return TrainingState(
            epoch=int(ckpt["epoch"]),
            best_loss=ckpt["best_loss"],
            best_state=ckpt["best_state"],
            bad_epochs=ckpt["bad_epochs"],
            stopped=ckpt["stopped"],
            extended=ckpt["extended"],
            history=list(ckpt["history"]),
        )
    except (KeyError, RuntimeError, ValueError, TypeError, AttributeError, IndexError) as err:
        model.load_state_dict(fresh[0])
        optimizer.load_state_dict(fresh[1])
        scheduler.load_state_dict(fresh[2])
        warnings.warn(f"{path}: damaged checkpoint ({err}); starting fresh", stacklevel=3)
        return None


#: The keys every checkpoint :func:`save_checkpoint` writes holds.
_RESUMABLE = frozenset(
    {
        "format",
        "fingerprint",
        "model",
        "optimizer",
        "scheduler",
        "rng",
        "epoch",
        "best_loss",
        "best_state",
        "bad_epochs",
        "stopped",
        "extended",
        "history",
    }
)


# --------------------------------------------------------------------------------------
# The trained model
# --------------------------------------------------------------------------------------
