"""Training a :class:`~locusformer.model.LocusFormer`, checkpoints, saving and loading.

One seed fixes everything: the model's initial weights, the validation split, the
shuffling (a dedicated ``torch.Generator``) and dropout. On CPU the run is bit-identical
for a seed, and a run interrupted and resumed from its checkpoint ends where an
uninterrupted one ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import math
import os
import pickle
import random
import re
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

import locusformer
from locusformer import atomic
from locusformer.errors import InputError
from locusformer.model import (
    LocusFormer,
    ModelConfig,
    ModelOutput,
    batch_mean_distance,
    batch_mmd,
    build_layout,
    config_from_dict,
    confusion_loss,
)

CHECKPOINT_FORMAT = 1
WEIGHTS_FORMAT = 1

HISTORY_COLUMNS = [
    "epoch",
    "train_recon",
    "train_adversary",
    "train_confusion",
    "train_batch_mean",
    "train_mmd",
    "train_total",
    "val_recon",
    "train_disc_acc",
    "val_disc_acc",
    "lr",
    "adversary_weight",
    "seconds",
]


@dataclass
class TrainConfig:
    """Optimization and objective settings."""

    # How the batch discriminator acts on the encoder. "confusion": the encoder minimizes
    # the cross-entropy of the (frozen) discriminator's output against the batch
    # frequencies, which pushes cells toward regions where the discriminator is unsure;
    # "reversal": the discriminator's gradient, reversed, which pushes them toward regions
    # where it is sure of another batch. With batches of different cell-type mixtures,
    # reversal pulled cells into cell types their batch lacks (CellBench's five sets:
    # protocol H1975 cells into the plate-only lines; BENCHMARKS.md).
    adversary: str = "confusion"
    # Weight of the adversary's term for the encoder. 0.3 rather than 0.1 under
    # "confusion": two-protocol task 0.917 against 0.908, five sets 0.840 against 0.844
    # (three seeds each, within the spread).
    adversary_weight: float = 0.3
    # Whitened distance between the batches' latent means (see batch_mean_distance). The
    # adversary alone saturated on simulated data (a perfect discriminator passes back no
    # gradient); this term removes what a linear classifier finds, and then the
    # adversary has something left to act on. Kept small: batches that hold different
    # mixtures of cell types have different means for a good reason, and on CellBench's
    # five sets (two lines in three of them only) a weight of 1 pulled cells of the other
    # two sets onto those lines (BENCHMARKS.md, "How the defaults were chosen").
    batch_mean_weight: float = 0.2
    mmd_weight: float = 0.0
    adversary_rampup_epochs: int = 20  # all batch-removal weights ramp up linearly
    lr: float = 1e-3
    weight_decay: float = 1e-2
    batch_size: int = 64
    # The whole cosine schedule runs (no early stopping by default, as in scvi-tools).
    # Stopped early, two of three seeds ended at epochs 33 and 47 of 80 with the learning
    # rate still high, and the score varied with the seed (cellbench5, three seeds:
    # 0.827-0.853; 40 epochs to the end: 0.838-0.853, in less time).
    max_epochs: int = 40
    # Optimizer steps an epoch-count setting is sized for. When max_epochs epochs would
    # take more (large data), fewer epochs run, and the ramp-up and patience shrink by the
    # same factor: convergence follows the number of updates, not of passes.
    max_steps: int = 2000
    warmup_fraction: float = 0.05  # of all steps, then cosine decay to 0
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping
    val_fraction: float = 0.1  # held out, stratified by batch; 0 disables validation
    # Epochs without improvement of the validation reconstruction before stopping; 0: no
    # early stopping. Either way the best epoch after the ramp-up is kept.
    patience: int = 0
    # Processes, one per device (GPU, or CPU process with gloo), trained with
    # DistributedDataParallel; launched by torchrun (the train rule does). batch_size stays
    # the global batch: each step splits it across the processes.
    devices: int = 1
    # Where run_train keeps the matrix: "never" in memory (standardized once), "always" in
    # a float32 .npy memory map read per minibatch, "auto" on disk when it would not fit
    # comfortably in memory. The same numbers either way.
    data_on_disk: str = "auto"
    # torch.compile the encoder (the attention blocks, where the time goes). Worth it on a
    # GPU for long runs; the first steps pay the compilation (tens of seconds).
    compile: bool = False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> TrainConfig:
        return config_from_dict(cls, data, "train config")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self, source: str = "train config") -> None:
        checks = {
            "adversary": self.adversary in ("confusion", "reversal"),
            "adversary_weight": self.adversary_weight >= 0,
            "adversary_rampup_epochs": self.adversary_rampup_epochs >= 0,
            "batch_mean_weight": self.batch_mean_weight >= 0,
            "mmd_weight": self.mmd_weight >= 0,
            "lr": self.lr > 0,
            "weight_decay": self.weight_decay >= 0,
            "batch_size": self.batch_size >= 1,
            "max_epochs": self.max_epochs >= 1,
            "max_steps": self.max_steps >= 1,
            "warmup_fraction": 0 <= self.warmup_fraction < 1,
            "grad_clip": self.grad_clip >= 0,
            "val_fraction": 0 <= self.val_fraction < 1,
            "patience": self.patience >= 0,
            "devices": self.devices >= 1,
            "data_on_disk": self.data_on_disk in ("auto", "always", "never"),
        }
        for name, ok in checks.items():
            if not ok:
                raise InputError(f"{source}.{name}", f"invalid value {getattr(self, name)!r}")


class TrainingDivergedError(RuntimeError):
    """A loss became NaN or infinite."""


# --------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------


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


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 - the global state third-party code uses
    torch.manual_seed(seed)


def as_matrix(X: Any, source: str = "expression matrix") -> np.ndarray:
    """A DataFrame or array -> C-contiguous float32 (n, L); a float32 memmap as it is."""
    if isinstance(X, np.memmap) and X.dtype == np.float32 and X.ndim == 2 and X.flags.c_contiguous:
        return X  # a matrix on disk stays there (see _Rows)
    arr = X.to_numpy() if isinstance(X, pd.DataFrame) else np.asarray(X)
    if arr.ndim != 2:
        raise InputError(source, f"expected a 2-d samples x loci matrix, got shape {arr.shape}")
    try:
        return np.ascontiguousarray(arr, dtype=np.float32)
    except (TypeError, ValueError) as err:
        raise InputError(source, f"values are not numeric ({err})") from None


def stratified_split(
    codes: np.ndarray, fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Hold out ``fraction`` of every batch (at least one sample of batches with >= 2)."""
    rng = np.random.default_rng([seed, 1])  # a stream of its own, independent of torch
    train, val = [], []
    for b in np.unique(codes):
        idx = np.flatnonzero(codes == b)
        rng.shuffle(idx)
        k = round(fraction * len(idx))
        if fraction > 0 and len(idx) >= 2:
            k = min(max(k, 1), len(idx) - 1)
        val.append(idx[:k])
        train.append(idx[k:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))


def warmup_cosine(total_steps: int, warmup_steps: int) -> Callable[[int], float]:
    """Linear warm-up to 1, then cosine decay to 0 at ``total_steps``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def epoch_plan(n_train: int, config: TrainConfig) -> tuple[int, float]:
    """Epochs to run on ``n_train`` samples, and the factor on epoch-counted settings.

    ``max_epochs``, unless that takes more than ``max_steps`` optimizer steps; then the
    fewest whole epochs that reach ``max_steps``.
    """
    steps_per_epoch = math.ceil(n_train / config.batch_size)
    epochs = min(config.max_epochs, max(1, math.ceil(config.max_steps / steps_per_epoch)))
    return epochs, epochs / config.max_epochs


def ramp_at(epoch: int, rampup_epochs: float) -> float:
    """Factor in (0, 1] on every batch-removal term for 0-based ``epoch``: linear ramp."""
    if rampup_epochs <= 0:
        return 1.0
    return min(1.0, (epoch + 1) / rampup_epochs)


def configure_optimizer(model: LocusFormer, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on the weight matrices of linear layers only.

    Decay pulls a parameter towards zero. For projection matrices that is regularization;
    for biases, norms, embeddings and per-locus vectors it would only fight the fit.
    """
    decay = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    params = list(model.parameters())
    groups = [
        {"params": [p for p in params if id(p) in decay], "weight_decay": config.weight_decay},
        {"params": [p for p in params if id(p) not in decay], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.lr)


def fingerprint(
    X: np.ndarray,
    batch_labels: Sequence[str],
    loci: pd.DataFrame,
    model_config: ModelConfig,
    train_config: TrainConfig,
    seed: int,
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
    return h.hexdigest()


def _rng_state(generator: torch.Generator) -> dict[str, Any]:
    np_state = np.random.get_state()  # noqa: NPY002
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "generator": generator.get_state(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "python": random.getstate(),
    }


def _set_rng_state(state: Mapping[str, Any], generator: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    generator.set_state(state["generator"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))  # noqa: NPY002
    random.setstate(state["python"])


def _cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def _write_history(path: str | os.PathLike, history: list[dict[str, float]]) -> None:
    frame = pd.DataFrame(history, columns=HISTORY_COLUMNS)
    with atomic.atomic_path(path) as tmp:
        frame.to_csv(tmp, sep="\t", index=False)


def _row_blocks(X: np.ndarray, rows: np.ndarray | None = None) -> Iterator[np.ndarray]:
    """``X[rows]`` (all rows by default) in blocks of about 64 MiB, in row order."""
    from locusformer.io import rows_per_chunk  # anndata is slow to import

    step = rows_per_chunk(X.shape[1])
    n = len(X) if rows is None else len(rows)
    for start in range(0, n, step):
        yield X[start : start + step] if rows is None else X[rows[start : start + step]]


def column_stats(X: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-column mean and standard deviation (ddof 0) of ``X[rows]``, in float64.

    One pass in blocks of rows, merging each block's mean and sum of squared deviations
    (Chan et al.), so a matrix on disk is read once and never copied whole.
    """
    count, mean = 0, np.zeros(X.shape[1], dtype=np.float64)
    m2 = np.zeros(X.shape[1], dtype=np.float64)
    for block in _row_blocks(X, np.asarray(rows)):
        k = len(block)
        block_mean = block.mean(axis=0, dtype=np.float64)
        block_m2 = ((block - block_mean) ** 2).sum(axis=0, dtype=np.float64)
        delta = block_mean - mean
        total = count + k
        mean = mean + delta * (k / total)
        m2 = m2 + block_m2 + delta**2 * (count * k / total)
        count = total
    return mean, np.sqrt(m2 / max(count, 1))


class _Rows:
    """Standardized rows of the training matrix, looked up like a tensor's.

    A matrix in memory is standardized once. A matrix on disk (a ``np.memmap``) is read
    per lookup, its rows in file order for locality, and standardized then: the same
    float32 operations on the same values, so training gives the same numbers.
    """

    def __init__(self, X: np.ndarray, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.shape = X.shape
        self._mean, self._std = mean, std
        self._X = X if isinstance(X, np.memmap) else None
        self._Xs = None if self._X is not None else (torch.from_numpy(X) - mean) / std

    def index_select(self, dim: int, rows: torch.Tensor) -> torch.Tensor:
        assert dim == 0
        if self._Xs is not None:
            return self._Xs.index_select(0, rows)
        idx = rows.numpy()
        order = np.argsort(idx, kind="stable")
        block = np.empty((len(idx), self.shape[1]), dtype=np.float32)
        block[order] = self._X[idx[order]]
        return (torch.from_numpy(block) - self._mean) / self._std


# --------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------


@dataclass
class _State:
    """Everything an epoch changes besides the model, optimizer and scheduler."""

    epoch: int = 0  # epochs completed
    best_loss: float = math.inf
    best_state: dict[str, torch.Tensor] | None = None
    bad_epochs: int = 0
    stopped: bool = False
    history: list[dict[str, float]] = dataclasses.field(default_factory=list)


@dataclass
class _Run:
    """The fixed parts of one training run."""

    model: LocusFormer
    Xs: _Rows  # (n, L) standardized expression, on the host or read from disk
    codes: torch.Tensor  # (n,) batch codes
    train_rows: torch.Tensor
    val_rows: np.ndarray
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    generator: torch.Generator  # shuffling
    tc: TrainConfig
    device: torch.device
    fingerprint: str
    n_bad_inputs: int  # non-finite input values, for the divergence message
    dist: _Dist | None = None  # set when training with DistributedDataParallel
    forward: torch.nn.Module | None = None  # the DDP wrapper of model (None: model)
    seed: int = 0
    epochs: int = 1  # to run in all (see epoch_plan)
    rampup_epochs: float = 0.0  # of the batch-removal weights, scaled like epochs
    patience: int = 0  # epochs, scaled like epochs; 0: no early stopping
    batch_prior: torch.Tensor | None = None  # (N,) batch frequencies of the training rows


def train_corrector(
    X: np.ndarray | pd.DataFrame,
    batch_labels: Sequence[str],
    loci: pd.DataFrame,
    model_config: ModelConfig | Mapping[str, Any] | None = None,
    train_config: TrainConfig | Mapping[str, Any] | None = None,
    *,
    seed: int,
    device: str | torch.device = "auto",
    checkpoint_path: str | os.PathLike | None = None,
    log_path: str | os.PathLike | None = None,
    progress: bool = True,
    on_epoch_end: Callable[[int, dict[str, float]], None] | None = None,
) -> tuple[LocusFormer, pd.DataFrame]:
    """Train a batch corrector on ``X`` (samples x loci log-expression, genomic order).

    Parameters
    ----------
    batch_labels
        One batch name per sample. Cell-type labels are never an input.
    loci
        One row per column of ``X`` (``gene_id``, ``chrom``, ``start``, ...).
    seed
        Fixes initial weights, validation split, shuffling and dropout.
    device
        "auto" (CUDA if available, else CPU), "cpu", "cuda" or "cuda:N".
    checkpoint_path
        Written atomically after every epoch; an existing checkpoint of the same run
        (same data, configs and seed) is resumed, any other is ignored with a warning.
    log_path
        Per-epoch TSV of the history, rewritten after every epoch.
    on_epoch_end
        Called with (epoch, history row) after each epoch's checkpoint is written.

    Returns
    -------
    The model with the best weights (lowest validation reconstruction once the adversary
    is at full strength), in eval mode, and the per-epoch history.
    """
    mc = (
        model_config
        if isinstance(model_config, ModelConfig)
        else ModelConfig.from_dict(model_config)
    )
    tc = (
        train_config
        if isinstance(train_config, TrainConfig)
        else TrainConfig.from_dict(train_config)
    )
    mc.validate()
    tc.validate()
    X = as_matrix(X)
    labels = [str(b) for b in batch_labels]
    n, L = X.shape
    if len(labels) != n:
        raise InputError("batch labels", f"{len(labels)} labels for {n} samples")
    if len(loci) != L:
        raise InputError("loci table", f"{len(loci)} rows for {L} loci (columns of X)")
    if n < 2:
        raise InputError("expression matrix", f"need at least 2 samples, got {n}")
    batch_names = sorted(set(labels))
    codes = np.array([batch_names.index(b) for b in labels], dtype=np.int64)
    gene_ids = loci["gene_id"].astype(str).tolist() if "gene_id" in loci.columns else None
    dist, dev = _init_distributed(tc.devices, device)
    n_bad_inputs = sum(int(block.size - np.isfinite(block).sum()) for block in _row_blocks(X))
    try:
        return _train(
            X, labels, loci, mc, tc, seed, dev, dist, codes, batch_names, gene_ids,
            n_bad_inputs, checkpoint_path, log_path, progress, on_epoch_end,
        )  # fmt: skip
    finally:
        if dist is not None and dist.owns_group:
            torch.distributed.destroy_process_group()


def _train(
    X: np.ndarray,
    labels: list[str],
    loci: pd.DataFrame,
    mc: ModelConfig,
    tc: TrainConfig,
    seed: int,
    dev: torch.device,
    dist: _Dist | None,
    codes: np.ndarray,
    batch_names: list[str],
    gene_ids: list[str] | None,
    n_bad_inputs: int,
    checkpoint_path: str | os.PathLike | None,
    log_path: str | os.PathLike | None,
    progress: bool,
    on_epoch_end: Callable[[int, dict[str, float]], None] | None,
) -> tuple[LocusFormer, pd.DataFrame]:
    rank0 = dist is None or dist.rank == 0

    with deterministic(dev.type == "cpu"):
        seed_everything(seed)
        train_idx, val_idx = stratified_split(codes, tc.val_fraction, seed)
        mean, std = column_stats(X, train_idx)
        layout = build_layout(loci, mc.patch_size, mc.position_scale, mc.coordinate_unit)
        model = LocusFormer(mc, layout, batch_names, gene_ids)
        model.set_standardization(mean, std)
        model.to(dev)
        if tc.compile:
            # In place: parameter names, and so checkpoints and saved models, stay as
            # without compilation.
            model.encoder.compile()
        Xs = _Rows(X, model.gene_mean.cpu(), model.gene_std.cpu())
        codes_t = torch.from_numpy(codes)

        optimizer = configure_optimizer(model, tc)
        steps_per_epoch = math.ceil(len(train_idx) / tc.batch_size)
        epochs, scale = epoch_plan(len(train_idx), tc)
        total_steps = steps_per_epoch * epochs
        warmup_steps = max(1, round(tc.warmup_fraction * total_steps))
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, warmup_cosine(total_steps, warmup_steps)
        )
        generator = torch.Generator().manual_seed(seed)
        state = _State()
        fp = fingerprint(X, labels, loci, mc, tc, seed)
        if checkpoint_path is not None:
            state = _resume(checkpoint_path, fp, model, optimizer, scheduler, generator) or state
        forward = None
        if dist is not None:
            # Same seed everywhere: identical initial weights (DDP also broadcasts rank
            # 0's), validation split and shuffling; each process takes its share of every
            # global batch.
            forward = torch.nn.parallel.DistributedDataParallel(
                model,
                device_ids=[dev.index] if dev.type == "cuda" else None,
                # The buffers (standardization, layout) are the same everywhere and fixed.
                forward_sync_buffers=False,
            )

        bar = tqdm(
            total=epochs,
            initial=state.epoch,
            desc="train",
            unit="epoch",
            file=sys.stderr,
            disable=not progress or not rank0,
            leave=False,
            # A log file (the workflow's case) gets a line every 30 s, not every epoch.
            mininterval=0.1 if sys.stderr.isatty() else 30.0,
        )
        run = _Run(
            model, Xs, codes_t, torch.from_numpy(train_idx), val_idx, optimizer, scheduler,
            generator, tc, dev, fp, n_bad_inputs, dist, forward, seed, epochs,
            tc.adversary_rampup_epochs * scale, tc.patience and max(1, round(tc.patience * scale)),
            batch_prior(codes[train_idx], len(batch_names), dev),
        )  # fmt: skip
        with bar:
            _train_epochs(
                run,
                state,
                checkpoint_path if rank0 else None,
                log_path if rank0 else None,
                on_epoch_end,
                bar,
            )

    if state.best_state is not None:
        model.load_state_dict(state.best_state)
    model.eval()
    model.train_seed = seed
    if log_path is not None and rank0:
        _write_history(log_path, state.history)
    return model, pd.DataFrame(state.history, columns=HISTORY_COLUMNS)


def _train_epochs(
    run: _Run,
    state: _State,
    checkpoint_path: str | os.PathLike | None,
    log_path: str | os.PathLike | None,
    on_epoch_end: Callable[[int, dict[str, float]], None] | None,
    bar: tqdm,
) -> None:
    """Run epochs until ``run.epochs`` or early stopping, updating ``state`` in place."""
    tc, model = run.tc, run.model
    while state.epoch < run.epochs and not state.stopped:
        epoch = state.epoch  # 0-based index of the epoch about to run
        t0 = time.perf_counter()
        ramp = ramp_at(epoch, run.rampup_epochs)
        model.train()
        row = {"epoch": epoch + 1, **_run_epoch(run, ramp, epoch)}
        row.update(
            _validate(model, run.Xs, run.codes, run.val_rows, tc.batch_size, run.device, run.dist)
        )
        row["lr"] = run.scheduler.get_last_lr()[0]
        row["adversary_weight"] = ramp * tc.adversary_weight
        row["seconds"] = time.perf_counter() - t0
        state.history.append(row)

        # Early stopping only once the adversary is at full strength: before, the
        # lowest reconstruction loss belongs to the least batch-corrected model.
        monitored = row["val_recon"] if len(run.val_rows) else row["train_recon"]
        if epoch + 1 >= run.rampup_epochs:
            if monitored < state.best_loss:
                state.best_loss = monitored
                state.best_state = _cpu_state(model)
                state.bad_epochs = 0
            else:
                state.bad_epochs += 1
                state.stopped = 0 < run.patience <= state.bad_epochs
        state.epoch = epoch + 1

        if checkpoint_path is not None:
            _save_checkpoint(checkpoint_path, run, state)
        if log_path is not None:
            _write_history(log_path, state.history)
        bar.set_postfix(
            recon=f"{row['train_recon']:.3f}",
            val=f"{row['val_recon']:.3f}",
            acc=f"{row['train_disc_acc']:.2f}",
            refresh=False,  # update() redraws, at most once per mininterval
        )
        bar.update(1)
        if on_epoch_end is not None:
            on_epoch_end(epoch + 1, row)


def _batches(
    Xs: _Rows, codes: torch.Tensor, rows: torch.Tensor, batch_size: int, dev: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield (x, batch) for ``rows`` in chunks, on ``dev``."""
    cuda = dev.type == "cuda"
    for chunk in rows.split(batch_size):
        xb, bb = Xs.index_select(0, chunk), codes.index_select(0, chunk)
        if cuda:
            # The caching host allocator keeps a pinned block alive until its copy is
            # done, so the non-blocking copy from a fresh pinned tensor is safe.
            xb, bb = xb.pin_memory(), bb.pin_memory()
        yield xb.to(dev, non_blocking=cuda), bb.to(dev, non_blocking=cuda)


def _run_epoch(run: _Run, ramp: float, epoch: int) -> dict[str, float]:
    """One pass over the training rows; returns mean losses and discriminator accuracy."""
    if run.dist is not None:
        return _run_epoch_distributed(run, ramp, epoch)
    model, tc, optimizer, dev = run.model, run.tc, run.optimizer, run.device
    weight = ramp * tc.adversary_weight
    order = run.train_rows[torch.randperm(len(run.train_rows), generator=run.generator)]
    # Per-step losses stay on the device (no sync per step); checked once per epoch.
    per_step, correct, seen = [], 0, 0
    for xb, bb in _batches(run.Xs, run.codes, order, tc.batch_size, dev):
        with autocast(dev):
            out = model(xb, bb, adversary_weight=weight, adversary=tc.adversary)
        recon = F.mse_loss(out.recon.float(), xb)
        # The discriminator minimizes its cross-entropy at full strength. "reversal" hands
        # the encoder -weight times that gradient; "confusion" adds weight x the confusion
        # term, whose gradient reaches the encoder only.
        adversary = F.cross_entropy(out.batch_logits.float(), bb)
        confusion = _confusion(out, run.batch_prior)
        mean_dist = batch_mean_distance(out.latent, bb, model.n_batches)
        mmd = batch_mmd(out.latent, bb, model.n_batches)
        total = (
            recon
            + adversary
            + weight * confusion
            + ramp * (tc.batch_mean_weight * mean_dist + tc.mmd_weight * mmd)
        )
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        if tc.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        optimizer.step()
        run.scheduler.step()
        per_step.append(torch.stack([recon, adversary, confusion, mean_dist, mmd, total]).detach())
        correct += (out.batch_logits.argmax(-1) == bb).sum()
        seen += len(bb)
    losses = torch.stack(per_step).cpu()  # (steps, 6)
    _check_finite(losses, epoch, run.n_bad_inputs)
    return {**_loss_means(losses), "train_disc_acc": float(correct) / max(1, seen)}


#: Per-step losses, in the order of the history's train_* columns, with the words the
#: divergence error uses for them.
_LOSSES = {
    "recon": "reconstruction",
    "adversary": "adversary",
    "confusion": "confusion",
    "batch_mean": "batch mean",
    "mmd": "mmd",
    "total": "total",
}


def _check_finite(losses: torch.Tensor, epoch: int, n_bad_inputs: int) -> None:
    """Raise TrainingDivergedError at the first step (row of ``losses``) not finite."""
    bad = (~torch.isfinite(losses)).any(dim=1)
    if not bool(bad.any()):
        return
    step = int(bad.nonzero()[0, 0])
    values = dict(zip(_LOSSES.values(), losses[step].tolist(), strict=True))
    total = values.pop("total")
    parts = ", ".join(f"{word} {value}" for word, value in values.items())
    hint = f"; the input has {n_bad_inputs} non-finite values" if n_bad_inputs else ""
    raise TrainingDivergedError(
        f"training diverged at epoch {epoch + 1}, step {step + 1}: total loss {total} "
        f"({parts}){hint}"
    )


def _loss_means(losses: torch.Tensor) -> dict[str, float]:
    """(steps, 6) per-step losses -> {"train_recon": mean, ...}."""
    means = losses.mean(dim=0).tolist()
    return {f"train_{name}": value for name, value in zip(_LOSSES, means, strict=True)}


def batch_prior(codes: np.ndarray, n_batches: int, device: torch.device) -> torch.Tensor:
    """(N,) share of each batch among ``codes``: what a discriminator of no use predicts."""
    counts = np.bincount(codes, minlength=n_batches).astype(np.float32)
    return torch.from_numpy(counts / max(1.0, counts.sum())).to(device)


def _confusion(out: ModelOutput, prior: torch.Tensor | None) -> torch.Tensor:
    """The encoder's confusion term, or 0 when the adversary is "reversal"."""
    if out.confusion_logits is None or prior is None:
        return torch.zeros((), device=out.latent.device)
    return confusion_loss(out.confusion_logits, prior)


@torch.inference_mode()
def _validate(
    model: LocusFormer,
    Xs: _Rows,
    codes: torch.Tensor,
    val_rows: np.ndarray,
    batch_size: int,
    dev: torch.device,
    dist: _Dist | None = None,
) -> dict[str, float]:
    """Reconstruction loss (own batch) and discriminator accuracy on held-out samples.

    Under DDP every process scores its share and the sums are added up, so all of them
    take the same early-stopping decision.
    """
    if len(val_rows) == 0:
        return {"val_recon": math.nan, "val_disc_acc": math.nan}
    was_training = model.training
    model.eval()
    rows = val_rows if dist is None else np.array_split(val_rows, dist.world)[dist.rank]
    sq, correct = 0.0, 0
    for xb, bb in _batches(Xs, codes, torch.from_numpy(rows), max(batch_size, 256), dev):
        with autocast(dev):
            out = model(xb, bb)
        sq += float(F.mse_loss(out.recon.float(), xb, reduction="sum"))
        correct += int((out.batch_logits.argmax(-1) == bb).sum())
    model.train(was_training)
    if dist is not None:
        sums = torch.tensor([sq, float(correct)], dtype=torch.float64, device=dist.comm_device)
        torch.distributed.all_reduce(sums)
        sq, correct = sums.tolist()
    return {
        "val_recon": sq / (len(val_rows) * Xs.shape[1]),
        "val_disc_acc": correct / len(val_rows),
    }


# --------------------------------------------------------------------------------------
# Several devices: DistributedDataParallel, one process per device (torchrun)
# --------------------------------------------------------------------------------------


@dataclass
class _Dist:
    world: int
    rank: int
    owns_group: bool  # this process initialized the process group (and destroys it)
    comm_device: torch.device  # where collectives' tensors live (cuda for nccl)


def _init_distributed(
    devices: int, device: str | torch.device
) -> tuple[_Dist | None, torch.device]:
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
    return _Dist(world, tdist.get_rank(), not initialized, comm), dev


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


def _gather_rows(z: torch.Tensor, sizes: list[int], rank: int) -> torch.Tensor:
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


def _run_epoch_distributed(run: _Run, ramp: float, epoch: int) -> dict[str, float]:
    """One epoch under DDP: the update one process makes on the same global batches.

    Every process draws the same permutation and takes a contiguous share of each global
    batch. Reconstruction and adversary losses are per-sample means, weighted by the
    share's size so that DDP's gradient average is the gradient of the global mean. The
    batch-statistic terms (whitened batch-mean distance, MMD) need the whole batch: the
    latents are gathered (with gradient) and every process computes the same value.
    """
    model, tc, optimizer, dev, dist = run.model, run.tc, run.optimizer, run.device, run.dist
    assert dist is not None and run.forward is not None
    # Dropout differs between processes and is reproducible on resume, without saving
    # every process's random state.
    stream = np.random.SeedSequence([run.seed, 2, epoch, dist.rank])
    torch.manual_seed(int(stream.generate_state(1)[0]))
    weight = ramp * tc.adversary_weight
    order = run.train_rows[torch.randperm(len(run.train_rows), generator=run.generator)]
    cuda = dev.type == "cuda"
    per_step, correct, seen = [], torch.zeros((), device=dev), 0
    for chunk in order.split(tc.batch_size):
        shares = chunk.tensor_split(dist.world)
        sizes = [len(share) for share in shares]
        rows = shares[dist.rank]
        share = len(rows) * dist.world / len(chunk)  # 0 for a process without rows
        if len(rows) == 0:
            rows = chunk[:1]  # a step of weight 0: every process takes part in each step
        xb, bb = run.Xs.index_select(0, rows), run.codes.index_select(0, rows)
        if cuda:
            xb, bb = xb.pin_memory(), bb.pin_memory()
        xb, bb = xb.to(dev, non_blocking=cuda), bb.to(dev, non_blocking=cuda)
        with autocast(dev):
            out = run.forward(xb, bb, adversary_weight=weight, adversary=tc.adversary)
        recon = F.mse_loss(out.recon.float(), xb)
        adversary = F.cross_entropy(out.batch_logits.float(), bb)
        confusion = _confusion(out, run.batch_prior)
        z_all = _gather_rows(out.latent, sizes, dist.rank)
        b_all = run.codes.index_select(0, chunk).to(dev, non_blocking=cuda)
        mean_dist = batch_mean_distance(z_all, b_all, model.n_batches)
        mmd = batch_mmd(z_all, b_all, model.n_batches)
        total = share * (recon + adversary + weight * confusion) + ramp * (
            tc.batch_mean_weight * mean_dist + tc.mmd_weight * mmd
        )
        optimizer.zero_grad(set_to_none=True)
        total.backward()  # DDP averages the gradients over the processes
        if tc.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        optimizer.step()
        run.scheduler.step()
        # This process's parts of the global means; summed over the processes below.
        w = share / dist.world
        parts = [recon * w, adversary * w, confusion * w, mean_dist / dist.world, mmd / dist.world]
        per_step.append(torch.stack(parts).detach().float())
        if sizes[dist.rank]:
            correct = correct + (out.batch_logits.argmax(-1) == bb).sum()
            seen += len(bb)
    losses = torch.stack(per_step)  # (steps, 5)
    counts = torch.stack([correct.float(), torch.tensor(float(seen), device=dev)])
    losses, counts = losses.to(dist.comm_device), counts.to(dist.comm_device)
    torch.distributed.all_reduce(losses)
    torch.distributed.all_reduce(counts)
    losses = losses.cpu()
    total = (
        losses[:, 0]
        + losses[:, 1]
        + weight * losses[:, 2]
        + ramp * (tc.batch_mean_weight * losses[:, 3] + tc.mmd_weight * losses[:, 4])
    )
    losses = torch.cat([losses, total[:, None]], dim=1)  # (steps, 6) as on one process
    _check_finite(losses, epoch, run.n_bad_inputs)
    right, total_seen = counts.tolist()
    return {**_loss_means(losses), "train_disc_acc": right / max(1.0, total_seen)}


# --------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------

_TORCH_ENFORCE = re.compile(r"\[enforce fail at [^\]]*\]\s*\.?\s*")


def save_atomic(payload: Any, path: str | os.PathLike) -> None:
    """``torch.save`` under :func:`~locusformer.atomic.atomic_path`.

    torch's zip writer reports a full disk as a ``RuntimeError`` ("PytorchStreamWriter
    failed writing file ...: file write failed"), not an ``OSError``; it becomes the same
    :class:`~locusformer.atomic.WriteError` naming ``path`` that every other writer raises.
    """
    with atomic.atomic_path(path) as tmp:
        try:
            torch.save(payload, tmp)
        except RuntimeError as err:
            reason = _TORCH_ENFORCE.sub("", " ".join(str(err).split())) or type(err).__name__
            raise OSError(errno.EIO, reason, str(tmp)) from err


def _save_checkpoint(path: str | os.PathLike, run: _Run, state: _State) -> None:
    payload = {
        "format": CHECKPOINT_FORMAT,
        "fingerprint": run.fingerprint,
        "model": _cpu_state(run.model),
        "optimizer": run.optimizer.state_dict(),
        "scheduler": run.scheduler.state_dict(),
        "rng": _rng_state(run.generator),
        "epoch": state.epoch,
        "best_loss": state.best_loss,
        "best_state": state.best_state,
        "bad_epochs": state.bad_epochs,
        "stopped": state.stopped,
        "history": state.history,
    }
    save_atomic(payload, path)


def _resume(
    path: str | os.PathLike,
    fp: str,
    model: LocusFormer,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    generator: torch.Generator,
) -> _State | None:
    """Restore a matching checkpoint into the given objects; None if there is none."""
    if not Path(path).exists():
        return None
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a torn or foreign file: start over, don't crash
        warnings.warn(f"{path}: unreadable checkpoint ({err}); starting fresh", stacklevel=3)
        return None
    if ckpt.get("format") != CHECKPOINT_FORMAT or ckpt.get("fingerprint") != fp:
        warnings.warn(
            f"{path}: checkpoint is from a different run (data, config or seed); starting fresh",
            stacklevel=3,
        )
        return None
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    _set_rng_state(ckpt["rng"], generator)
    return _State(
        epoch=ckpt["epoch"],
        best_loss=ckpt["best_loss"],
        best_state=ckpt["best_state"],
        bad_epochs=ckpt["bad_epochs"],
        stopped=ckpt["stopped"],
        history=list(ckpt["history"]),
    )


# --------------------------------------------------------------------------------------
# Saving and loading a trained model
# --------------------------------------------------------------------------------------


def save_model(
    model: LocusFormer,
    weights_path: str | os.PathLike,
    config_path: str | os.PathLike,
    *,
    seed: int | None = None,
    loci: pd.DataFrame | None = None,
) -> None:
    """Write weights (torch.save of tensors, names and the loci table) and a JSON config.

    Both writes are atomic. ``seed`` defaults to the seed the model was trained with.
    ``loci``, when given, is stored so that correction can rebuild the AnnData ``var``.
    """
    payload: dict[str, Any] = {
        "format": WEIGHTS_FORMAT,
        "state_dict": _cpu_state(model),
        "batch_names": list(model.batch_names),
        "gene_ids": list(model.gene_ids) if model.gene_ids is not None else None,
        "loci": _loci_to_plain(loci) if loci is not None else None,
    }
    config = {
        "model_config": model.config.to_dict(),
        "batch_names": list(model.batch_names),
        "n_loci": model.n_loci,
        "n_tokens": model.n_tokens,
        "locusformer_version": locusformer.__version__,
        "torch_version": torch.__version__,
        "seed": seed if seed is not None else getattr(model, "train_seed", None),
    }
    save_atomic(payload, weights_path)
    atomic.write_text(config_path, json.dumps(config, indent=2) + "\n")


def load_model(weights_path: str | os.PathLike, config_path: str | os.PathLike) -> LocusFormer:
    """Load what :func:`save_model` wrote, on CPU, in eval mode.

    The weights are read with ``torch.load(weights_only=True)``: a file that would run
    code when unpickled is refused with an :class:`InputError`.
    """
    try:
        config = json.loads(Path(config_path).read_text(encoding="utf-8"))
        model_config = ModelConfig.from_dict(config["model_config"])
    except FileNotFoundError:
        raise InputError(config_path, "model config not found") from None
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise InputError(config_path, f"not a LocusFormer model config ({err})") from None
    try:
        payload = torch.load(weights_path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise InputError(weights_path, "model weights not found") from None
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(
            weights_path,
            f"refused to load: the file holds objects other than tensors and plain data, "
            f"which could run code ({first[:120]})",
        ) from None
    except Exception as err:
        raise InputError(
            weights_path, f"cannot read model weights ({type(err).__name__}: {err})"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != WEIGHTS_FORMAT:
        raise InputError(weights_path, "not a LocusFormer weights file")
    if payload["batch_names"] != config.get("batch_names"):
        raise InputError(config_path, f"batch names do not match {weights_path}")
    try:
        model = LocusFormer.from_state_dict(
            model_config, payload["state_dict"], payload["batch_names"], payload["gene_ids"]
        )
    except (KeyError, RuntimeError, ValueError) as err:
        raise InputError(weights_path, f"weights do not match {config_path} ({err})") from None
    model.loci = _loci_from_plain(payload.get("loci"))
    model.train_seed = config.get("seed")
    return model.eval()


def _loci_to_plain(loci: pd.DataFrame) -> dict[str, list]:
    """Loci table -> dict of lists of str/int/bool/None (allowed by weights_only)."""
    out: dict[str, list] = {}
    for col in loci.columns:
        values = loci[col].astype(object).where(loci[col].notna(), None).tolist()
        out[str(col)] = [v.item() if isinstance(v, np.generic) else v for v in values]
    return out


def _loci_from_plain(data: Mapping[str, list] | None) -> pd.DataFrame | None:
    if data is None:
        return None
    frame = pd.DataFrame(dict(data))
    for col in ("start", "end", "position"):
        if col in frame.columns:
            frame[col] = pd.array(frame[col].tolist(), dtype="Int64")
    if "position" in frame.columns and not frame["position"].isna().any():
        frame["position"] = frame["position"].astype("int64")
    if "placed" in frame.columns:
        frame["placed"] = frame["placed"].astype(bool)
    if "chrom" in frame.columns:
        frame["chrom"] = frame["chrom"].fillna("").astype(str)
    return frame


# --------------------------------------------------------------------------------------
# File-level step for the CLI
# --------------------------------------------------------------------------------------


def read_ordered(path: str | os.PathLike) -> pd.DataFrame:
    """The samples x loci matrix written by preprocessing (index sample_id)."""
    from locusformer.io import read_matrix_parquet  # anndata is slow to import

    return read_matrix_parquet(path, "ordered matrix")


def read_batches(
    samples_path: str | os.PathLike, batch_key: str, sample_ids: pd.Index
) -> pd.DataFrame:
    """The sample table, indexed by sample_id and ordered like ``sample_ids``."""
    try:
        table = pd.read_csv(samples_path, sep="\t", dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise InputError(samples_path, "file not found") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as err:
        raise InputError(samples_path, f"cannot read TSV ({err})") from None
    for column in ("sample_id", batch_key):
        if column not in table.columns:
            raise InputError(samples_path, f"missing column {column!r}")
    table = table.set_index("sample_id")
    missing = sample_ids.difference(table.index)
    if len(missing):
        raise InputError(samples_path, f"no row for sample {missing[0]!r} ({len(missing)} missing)")
    table = table[~table.index.duplicated(keep="first")].loc[sample_ids]
    if (table[batch_key] == "").any():
        bad = table.index[table[batch_key] == ""][0]
        raise InputError(samples_path, f"empty {batch_key!r} for sample {bad!r}")
    return table


def split_params(params: Mapping[str, Any] | None) -> tuple[ModelConfig, TrainConfig]:
    """{"model": {...}, "train": {...}} overrides -> the two configs."""
    params = dict(params or {})
    unknown = set(params) - {"model", "train"}
    if unknown:
        raise InputError("params", f"unknown key {sorted(unknown)[0]!r} (valid keys: model, train)")
    return ModelConfig.from_dict(params.get("model")), TrainConfig.from_dict(params.get("train"))


def run_train(
    ordered_path: str | os.PathLike,
    loci_path: str | os.PathLike,
    samples_path: str | os.PathLike,
    batch_key: str,
    params: Mapping[str, Any] | None,
    weights_out: str | os.PathLike,
    config_out: str | os.PathLike,
    history_out: str | os.PathLike,
    checkpoint_path: str | os.PathLike | None,
    seed: int,
    device: str = "auto",
    *,
    attention_out: str | os.PathLike | None = None,
    progress: bool = True,
) -> LocusFormer:
    """Train from the preprocessing outputs and write weights, config and history TSV.

    ``params`` has optional sub-dicts "model" and "train" of config overrides.
    ``attention_out``, if given, receives an .npz with the mean attention map
    (``attention``: layers x heads x tokens x tokens) plus token chromosome/position.
    """
    model_config, train_config = split_params(params)
    train_config.validate()
    scratch = Path(checkpoint_path if checkpoint_path is not None else weights_out).parent
    with _ordered_matrix(ordered_path, train_config.data_on_disk, scratch) as ordered:
        X, sample_ids, columns = ordered
        try:
            loci = pd.read_parquet(loci_path, engine="pyarrow")
        except FileNotFoundError:
            raise InputError(loci_path, "file not found") from None
        except Exception as err:
            raise InputError(
                loci_path, f"cannot read parquet ({type(err).__name__}: {err})"
            ) from None
        if "gene_id" not in loci.columns:
            raise InputError(loci_path, "missing column 'gene_id'")
        genes = loci["gene_id"].astype(str).tolist()
        if genes != columns:
            raise InputError(loci_path, f"gene ids do not match the columns of {ordered_path}")
        batches = read_batches(samples_path, batch_key, sample_ids)[batch_key].tolist()
        model, history = train_corrector(
            X,
            batches,
            loci,
            model_config,
            train_config,
            seed=seed,
            device=device,
            checkpoint_path=checkpoint_path,
            progress=progress,
        )
        if train_config.devices > 1 and int(os.environ.get("RANK", "0")) != 0:
            return model  # one process per device; the first writes the outputs
        save_model(model, weights_out, config_out, seed=seed, loci=loci)
        with atomic.atomic_path(history_out) as tmp:
            history.to_csv(tmp, sep="\t", index=False)
        if attention_out is not None:
            from locusformer.correct import write_attention  # correct imports this module

            write_attention(model.cpu(), X, batches, attention_out)
    return model


#: Copies of the matrix that training in memory holds at once (the table as read, the
#: float32 matrix, its standardized copy); "auto" keeps it on disk when they would take
#: more than half the memory left.
IN_MEMORY_COPIES = 3


@contextlib.contextmanager
def _ordered_matrix(
    path: str | os.PathLike, mode: str, scratch: Path
) -> Iterator[tuple[np.ndarray, pd.Index, list[str]]]:
    """(matrix, sample ids, gene ids) of ordered.parquet, in memory or as a memmap.

    On disk, the parquet is streamed once, block by block, into a float32 ``.npy`` in a
    temporary directory in ``scratch`` (beside the checkpoint), removed afterwards.
    """
    from locusformer.io import available_memory, iter_matrix_parquet, open_matrix_parquet

    handle, genes = open_matrix_parquet(path, "ordered matrix")
    n = handle.metadata.num_rows
    handle.close()
    need = n * len(genes) * 4 * IN_MEMORY_COPIES
    room = available_memory()
    on_disk = mode == "always" or (mode == "auto" and room is not None and need > room / 2)
    if not on_disk:
        ordered = read_ordered(path)
        yield ordered.to_numpy(dtype=np.float32), ordered.index, ordered.columns.tolist()
        return
    scratch.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix=".locusformer-data-", dir=scratch))
    try:
        npy = directory / "ordered.npy"
        ids = []
        with atomic.atomic_path(npy) as tmp, open(tmp, "wb") as fh:
            header = {"descr": "<f4", "fortran_order": False, "shape": (n, len(genes))}
            np.lib.format.write_array_header_2_0(fh, header)
            # Plain writes, not a writable memmap: a full disk is an OSError, not SIGBUS.
            for block in iter_matrix_parquet(path, "ordered matrix"):
                fh.write(np.ascontiguousarray(block.to_numpy(), dtype="<f4").tobytes())
                ids.append(block.index)
        X = np.load(npy, mmap_mode="r")
        yield X, pd.Index(np.concatenate(ids), name="sample_id"), genes
        del X
    finally:
        shutil.rmtree(directory, ignore_errors=True)


__all__ = [
    "HISTORY_COLUMNS",
    "TrainConfig",
    "TrainingDivergedError",
    "load_model",
    "read_batches",
    "read_ordered",
    "resolve_device",
    "run_train",
    "save_model",
    "train_corrector",
]
