"""Training a :class:`~locusformer.model.network.LocusFormer`: the epoch loop and its schedule.

One seed fixes everything: the model's initial weights, the validation split, the
shuffling (a dedicated ``torch.Generator``) and dropout. On CPU the run is bit-identical
for a seed, and a run interrupted and resumed from its checkpoint ends where an
uninterrupted one ends. The objective itself is :meth:`LocusFormer.loss`; this module
decides when each of its terms weighs what, and steps the optimizer.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from locusformer.errors import InputError, TrainingDivergedError
from locusformer.io import atomic
from locusformer.io.samples import read_batches
from locusformer.model.config import ModelConfig, TrainConfig, split_params
from locusformer.model.files import ModelRecord, TrainedModel, cpu_state, load_model, save_model
from locusformer.model.layout import build_layout
from locusformer.model.losses import Clusters
from locusformer.model.network import LocusFormer, Loss, LossWeights
from locusformer.pp.validate import check_log_expression
from locusformer.train.alignment import (
    CELL_SAMPLES,
    CLUSTER_MAX_SAMPLES,
    CLUSTER_SIGMA,
    NEVER_COMPARED,
    InputClusters,
    adversary_targets,
    enough_for_clusters,
    input_clusters,
    input_structured,
    joint_levels,
    joint_weights,
    latent_clusters,
    never_compared,
)
from locusformer.train.checkpoint import TrainingState, fingerprint, resume, save_checkpoint
from locusformer.train.data import (
    Rows,
    StandardizedRows,
    as_matrix,
    batch_prior,
    column_stats,
    minibatches,
    stratified_split,
)
from locusformer.train.distributed import Dist, gather_rows, init_distributed
from locusformer.train.epoch_checks import check_finite, clusters_compared, loss_means, validate
from locusformer.train.fold import FOLD_BELOW, fold_capture
from locusformer.train.refit import REFIT_BELOW, decoder_fit
from locusformer.train.runtime import autocast, deterministic, seed_everything
from locusformer.train.schedule import (
    EpochPlan,
    WarmupCosine,
    configure_optimizer,
    epoch_minibatches,
    epoch_plan,
    loss_weights,
    planned_steps,
    ramp_at,
    validation_rows,
)

log = logging.getLogger(__name__)

HISTORY_COLUMNS = [
    "epoch",
    *(f"train_{name}" for name in Loss._fields),
    "val_recon",
    "train_disc_acc",
    "val_disc_acc",
    # Latent clusters in which the cluster term compared batches this epoch (NaN: no
    # clustering this epoch; 0: none held a fair share of two batches, the term is 0).
    "clusters_compared",
    "lr",
    "adversary_weight",
    "seconds",
]


def _write_history(path: str | os.PathLike, history: list[dict[str, float]]) -> None:
    frame = pd.DataFrame(history, columns=HISTORY_COLUMNS)
    with atomic.atomic_path(path) as tmp:
        frame.to_csv(tmp, sep="\t", index=False)


@dataclass(frozen=True)
class _RunInputs:
    """What one training run is given, checked by :func:`train_corrector`: the data, the
    configurations and seed, and where the run reports."""

    X: np.ndarray  # (n, L) log-expression, genomic order
    labels: list[str]  # (n,) batch of each sample
    loci: pd.DataFrame  # one row per column of X
    mc: ModelConfig
    tc: TrainConfig
    seed: int
    codes: np.ndarray  # (n,) int64 index of each sample's batch in batch_names
    batch_names: list[str]  # sorted
    gene_ids: list[str] | None  # loci's gene_id column, if it has one
    covariates: np.ndarray | None  # (n,) int64 protected levels, or None
    checkpoint_path: str | os.PathLike | None
    log_path: str | os.PathLike | None
    progress: bool
    on_epoch_end: Callable[[int, dict[str, float]], None] | None


@dataclass
class _Run:
    """The fixed parts of one training run."""

    model: LocusFormer
    Xs: Rows  # (n, L) standardized expression, on the host or read from disk
    codes: torch.Tensor  # (n,) batch codes
    train_rows: torch.Tensor
    val_rows: np.ndarray
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    generator: torch.Generator  # shuffling
    tc: TrainConfig
    device: torch.device
    fingerprint: str
    plan: EpochPlan  # the epochs to run, and what one is
    dist: Dist | None = None  # set when training with DistributedDataParallel
    forward: torch.nn.Module | None = None  # the DDP wrapper of model (None: model)
    seed: int = 0
    batch_prior: torch.Tensor | None = None  # (N,) batch frequencies of the training rows
    # (n, N) on the host: each sample's adversary target (see locusformer.train.alignment);
    # None: batch_prior for every sample.
    targets: torch.Tensor | None = None
    levels: torch.Tensor | None = None  # (n,) on the host: protected levels, or None
    # (n, L) on the host: each sample's soft share of each level (input_cluster_softness),
    # or None: levels hard.
    level_weights: torch.Tensor | None = None


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
    covariates: np.ndarray | None = None,
    source: str = "expression matrix",
) -> tuple[TrainedModel, pd.DataFrame]:
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
    covariates
        (n,) integer level of each sample's protected biology
        (:func:`locusformer.train.alignment.covariate_levels`): batch is removed only within
        each level, as ComBat's ``mod`` does. None: label-free.
    source
        What the input checks name when they refuse ``X`` (the file it was read from).

    Returns
    -------
    The model with the best weights (lowest validation reconstruction once the adversary
    is at full strength; the last epoch's where no samples are held out, the default), in
    eval mode, and the per-epoch history.
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
    if covariates is not None:
        covariates = np.asarray(covariates, dtype=np.int64)
        if covariates.shape != (n,) or covariates.min(initial=0) < 0:
            raise InputError("covariates", f"expected {n} levels >= 0, got {covariates.shape}")
    gene_ids = loci["gene_id"].astype(str).tolist() if "gene_id" in loci.columns else None
    # Bad input is the user's to fix, said in one line: not a run that diverges later.
    check_log_expression(X, source)
    dist, dev = init_distributed(tc.devices, device)
    try:
        inputs = _RunInputs(
            X=X,
            labels=labels,
            loci=loci,
            mc=mc,
            tc=tc,
            seed=seed,
            codes=codes,
            batch_names=batch_names,
            gene_ids=gene_ids,
            covariates=covariates,
            checkpoint_path=checkpoint_path,
            log_path=log_path,
            progress=progress,
            on_epoch_end=on_epoch_end,
        )
        return _train_and_retry(inputs, dev, dist)
    finally:
        if dist is not None and dist.owns_group:
            torch.distributed.destroy_process_group()


def _train_and_retry(
    inputs: _RunInputs, dev: torch.device, dist: Dist | None
) -> tuple[TrainedModel, pd.DataFrame]:
    """:func:`_train`; again with more steps where :func:`_refit_config` says so; again
    without the input clusters where :func:`_unfold_config` says so of the run kept by
    then, the refit's included (a second run with the clusters can fold as the first);
    and again without the adversary where :func:`_unshared_config` says so of the last.

    Where the input holds no structure within batches (:func:`_alone_config`), the first
    run is without the adversary, kept if its latent clusters never held a fair share of
    two batches, and else followed by the run with it."""
    found = _input_clusters(inputs)
    alone = None if found is not None else _alone_config(inputs)
    if alone is None:
        trained, history = _train(inputs, found, dev, dist)
    else:
        first = dataclasses.replace(inputs, tc=alone)
        trained, history = _train(first, None, dev, dist)
        held = not never_compared(history)
        log.info("shared check: trained without the adversary, %s", _alone_reading(history))
        if held:
            _, (trained, history) = _again(inputs, inputs.tc, None, dev, dist)
        else:
            inputs = first
    # Every process holds the same weights, data and history (the latent clusters are
    # found alike everywhere), so all take the same decisions.
    kept = _capture(inputs, trained)
    again = _refit_config(inputs, trained, kept, found is not None)
    if again is not None:
        inputs, (trained, history) = _again(inputs, again, found, dev, dist)
        kept = _capture(inputs, trained)
    unfold = None if found is None else _unfold_config(inputs, kept)
    if unfold is not None:
        found = None
        inputs, (trained, history) = _again(inputs, unfold, found, dev, dist)
    unshared = None if found is not None else _unshared_config(inputs, history)
    if unshared is not None:
        inputs, (trained, history) = _again(inputs, unshared, found, dev, dist)
    return trained, history


def _again(
    inputs: _RunInputs,
    tc: TrainConfig,
    found: np.ndarray | None,
    dev: torch.device,
    dist: Dist | None,
) -> tuple[_RunInputs, tuple[TrainedModel, pd.DataFrame]]:
    """A new run with ``tc``, the finished run's checkpoint removed first: its inputs
    and :func:`_train`'s result."""
    if inputs.checkpoint_path is not None and (dist is None or dist.rank == 0):
        Path(inputs.checkpoint_path).unlink(missing_ok=True)
    inputs = dataclasses.replace(inputs, tc=tc)
    return inputs, _train(inputs, found, dev, dist)


def _capture(inputs: _RunInputs, trained: TrainedModel) -> Callable[[], float | None]:
    """How much of the quick correction's structure ``trained`` kept
    (:func:`~locusformer.train.fold.fold_capture`), computed once, when the first of the
    checks that read it asks."""
    return functools.cache(
        lambda: fold_capture(trained.module, inputs.X, inputs.codes, inputs.seed)
    )


def _refit_config(
    inputs: _RunInputs,
    trained: TrainedModel,
    kept: Callable[[], float | None],
    clustered: bool,
) -> TrainConfig | None:
    """The configuration to train again with when the run stopped before it learned the
    data (:mod:`locusformer.train.refit`), else None: a short run by
    :func:`_short_refit_config`; a longer one whose input clusters were found
    (``clustered``) and that ``refit_factor`` times as long stays within ``max_steps`` by
    :func:`_longer_refit_config`.

    A schedule that ends before its own ramp-up (``max_epochs`` below
    ``adversary_rampup_epochs``) is a quick look asked for (a smoke test, a tutorial's two
    epochs), not a study too small for its epochs: it is left as asked."""
    tc = inputs.tc
    if tc.max_epochs < tc.adversary_rampup_epochs:
        return None
    n_train = len(stratified_split(inputs.codes, tc.val_fraction, inputs.seed)[0])
    steps = planned_steps(n_train, tc)
    if steps < tc.refit_steps:
        return _short_refit_config(inputs, trained, kept, steps)
    # A run already near the step budget that large data get is not a run stopped early.
    if clustered and 1 < tc.refit_factor and tc.refit_factor * steps <= tc.max_steps:
        return _longer_refit_config(tc, kept, steps)
    return None


def _short_refit_config(
    inputs: _RunInputs, trained: TrainedModel, kept: Callable[[], float | None], steps: int
) -> TrainConfig | None:
    """``min_steps`` raised to ``refit_steps`` when the run of ``steps`` steps did not
    learn the data: its decoder reconstructs less than :data:`REFIT_BELOW` of the
    structure above noise, or its corrected matrix explains less than
    :data:`FOLD_BELOW` of the quick correction's (``kept``,
    :func:`locusformer.train.fold.fold_capture`), the two readings of a decoder that
    returns about each batch's mean. None otherwise."""
    tc = inputs.tc
    if tc.refit_steps <= tc.min_steps:
        return None
    fit = decoder_fit(trained.module, inputs.X, inputs.codes, inputs.seed)
    share = kept()
    if fit is None and share is None:
        return None
    learned = (fit is None or fit >= REFIT_BELOW) and (share is None or share >= FOLD_BELOW)
    readings = (
        f"the decoder reconstructs {_reading(fit)} of the structure above noise (threshold "
        f"{REFIT_BELOW:.2f}) and the corrected matrix explains {_reading(share)} of the "
        f"quick correction's (threshold {FOLD_BELOW:.2f})"
    )
    decision = "kept" if learned else f"training again with at least {tc.refit_steps} steps"
    log.info("refit check: after %d steps %s: %s", steps, readings, decision)
    return None if learned else dataclasses.replace(tc, min_steps=tc.refit_steps)


def _longer_refit_config(
    tc: TrainConfig, kept: Callable[[], float | None], steps: int
) -> TrainConfig | None:
    """``min_steps`` raised to ``refit_factor`` times the run's ``steps`` when its
    corrected matrix explains less than :data:`FOLD_BELOW` of the quick correction's
    structure (``kept``). Read only where the input clusters were found: they say the
    batches share biology, so the quick correction's structure is that biology (where
    none is shared it removes the biology with the batch, and the reading is about 0)."""
    share = kept()
    if share is None:
        return None
    stopped = share < FOLD_BELOW
    target = math.ceil(tc.refit_factor * steps)
    log.info(
        "refit check: after %d steps the corrected matrix explains %.2f of the quick "
        "correction's structure (threshold %.2f): %s",
        steps,
        share,
        FOLD_BELOW,
        f"training again with at least {target} steps" if stopped else "kept",
    )
    return dataclasses.replace(tc, min_steps=target) if stopped else None


def _reading(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _unfold_config(inputs: _RunInputs, kept: Callable[[], float | None]) -> TrainConfig | None:
    """The configuration to train again with when the input clusters folded the latent
    (``fold_check``; :mod:`locusformer.train.fold`): the same without them. None when the
    check is off or the run kept the input's structure (``kept``, :func:`fold_capture`)."""
    tc = inputs.tc
    if not tc.fold_check:
        return None
    share = kept()
    if share is None:
        return None
    folded = share < FOLD_BELOW
    log.info(
        "fold check: the corrected matrix explains %.2f of the quick correction's structure "
        "(%s %.2f): %s",
        share,
        "below" if folded else "at least",
        FOLD_BELOW,
        "the latent folded, training again without the input clusters" if folded else "kept",
    )
    if not folded:
        return None
    return dataclasses.replace(tc, input_clusters=0)


def _shared_check_applies(inputs: _RunInputs) -> bool:
    """Whether the shared check (``shared_check``) applies: the run has an adversary and
    no protected covariates (which say what the batches hold)."""
    tc = inputs.tc
    return tc.shared_check and tc.adversary_weight > 0 and inputs.covariates is None


def _alone_config(inputs: _RunInputs) -> TrainConfig | None:
    """The configuration without the adversary that a run without input clusters trains
    first where the input, corrected quickly, holds no structure within batches
    (:func:`~locusformer.train.alignment.input_structured`); None otherwise.

    Each batch is then one population as far as the data say, and whether two batches
    hold the same one cannot be read from the input. A latent trained with the adversary
    cannot say either: the adversary draws the batches together whether or not they
    share biology, and latent clusters that then hold two batches can be its work (the
    suite's ``confounded-total`` lost its biology so at four seeds of twelve,
    docs/notes/2026-12-08.md). The latent trained without it can: where its clusters
    never hold two batches the populations differ, and the run is kept without the
    adversary; where they do (shallow counts whose groups the floor cannot read) the run
    trains with it, as where the input holds structure."""
    if not _shared_check_applies(inputs):
        return None
    if input_structured(inputs.X, inputs.codes, inputs.seed) is not False:
        return None
    return dataclasses.replace(inputs.tc, adversary_weight=0.0)


def _alone_reading(history: pd.DataFrame) -> str:
    """What the run without the adversary (:func:`_alone_config`) read, for the log."""
    if never_compared(history):
        return "no latent cluster held two batches: kept"
    if history["clusters_compared"].notna().any():
        return "latent clusters held two batches: training with it"
    return "the cluster term found no latent clusters to read: training with it"


def _unshared_config(inputs: _RunInputs, history: pd.DataFrame) -> TrainConfig | None:
    """The configuration to train again with when nothing says the batches share any
    biology (``shared_check``): the run had neither input clusters nor protected
    covariates, and its latent clusters never held a fair share of two batches
    (:func:`~locusformer.train.alignment.never_compared`). The adversary then asks
    batches that hold different biology to look alike, and removes the biology that
    tells them apart; the run is trained again without it. None otherwise."""
    if not _shared_check_applies(inputs) or not never_compared(history):
        return None
    log.info(
        "shared check: no input clusters, and no latent cluster held a fair share of two "
        "batches in any epoch: training again without the adversary"
    )
    return dataclasses.replace(inputs.tc, adversary_weight=0.0)


def _train(
    inputs: _RunInputs, found: InputClusters | None, dev: torch.device, dist: Dist | None
) -> tuple[TrainedModel, pd.DataFrame]:
    """Train on checked ``inputs`` on ``dev`` (one process of several when ``dist`` is set);
    :func:`train_corrector`'s result."""
    rank0 = dist is None or dist.rank == 0
    tc, seed, codes, covariates = inputs.tc, inputs.seed, inputs.codes, inputs.covariates
    n_batches = len(inputs.batch_names)

    with deterministic(dev.type == "cpu"):
        seed_everything(seed)
        train_idx, val_idx = stratified_split(codes, tc.val_fraction, seed)
        val_idx = validation_rows(val_idx, seed)
        model, Xs = _build_model(inputs, train_idx, dev)
        optimizer, scheduler, plan = _optimization(model, tc, len(train_idx))
        generator = torch.Generator().manual_seed(seed)
        state = TrainingState()
        fp = fingerprint(
            inputs.X,
            inputs.labels,
            inputs.loci,
            model_config=inputs.mc,
            train_config=tc,
            seed=seed,
            covariates=covariates,
        )
        if inputs.checkpoint_path is not None:
            state = (
                resume(inputs.checkpoint_path, fp, model, optimizer, scheduler, generator) or state
            )
        forward = None if dist is None else _distributed(model, dev)

        bar = tqdm(
            total=plan.epochs,
            initial=state.epoch,
            desc="train",
            unit="epoch",
            file=sys.stderr,
            disable=not inputs.progress or not rank0,
            leave=False,
            # A log file (the workflow's case) gets a line every 30 s, not every epoch.
            mininterval=0.1 if sys.stderr.isatty() else 30.0,
        )
        levels = (
            inputs.covariates if found is None else joint_levels(inputs.covariates, found.levels)
        )
        level_weights = None if found is None else joint_weights(inputs.covariates, found.weights)
        # The adversary's target follows the protected levels alone: the input's clusters
        # are a guess, and a target kept to the batches of a cluster that the quick
        # correction left split by batch would hold that split (CellBench's five sets:
        # 0.840 over three seeds against 0.856 without input clusters).
        targets = adversary_targets(
            StandardizedRows(Xs),
            codes,
            n_batches,
            alignment=tc.alignment,
            neighbors=tc.alignment_neighbors,
            levels=covariates,
            seed=seed,
        )
        run = _Run(
            model=model,
            Xs=Xs,
            codes=torch.from_numpy(codes),
            train_rows=torch.from_numpy(train_idx),
            val_rows=val_idx,
            optimizer=optimizer,
            scheduler=scheduler,
            generator=generator,
            tc=tc,
            device=dev,
            fingerprint=fp,
            plan=plan,
            dist=dist,
            forward=forward,
            seed=seed,
            batch_prior=batch_prior(codes[train_idx], n_batches, dev),
            targets=None if targets is None else torch.from_numpy(targets),
            levels=None if levels is None else torch.from_numpy(levels),
            level_weights=None if level_weights is None else torch.from_numpy(level_weights),
        )
        with bar:
            _train_epochs(
                run,
                state,
                inputs.checkpoint_path if rank0 else None,
                inputs.log_path if rank0 else None,
                inputs.on_epoch_end,
                bar,
            )

    trained, history = _best_model(inputs, model, state, rank0)
    if rank0 and never_compared(history):
        # The caller of train_corrector (through _train_and_retry), not this module.
        warnings.warn(NEVER_COMPARED, stacklevel=4)
    return trained, history


def _rows(
    values: torch.Tensor | None, rows: torch.Tensor, dev: torch.device
) -> torch.Tensor | None:
    """``values``' ``rows`` on ``dev``, or None."""
    return None if values is None else values.index_select(0, rows).to(dev)


def _input_clusters(inputs: _RunInputs) -> InputClusters | None:
    """The input's own clusters (``input_clusters``), soft as ``input_cluster_softness``
    says; the level term removes the batch within them crossed with the protected
    covariates. None when off, with one batch, or where the quick correction holds no
    structure to cluster. Found once per call: a second run that keeps them
    (``refit_steps``) trains within the same ones."""
    tc = inputs.tc
    if not tc.input_clusters or len(inputs.batch_names) < 2:
        return None
    return input_clusters(
        inputs.X,
        inputs.codes,
        tc.input_clusters,
        inputs.seed,
        from_structure=tc.input_cluster_count == "structure",
        softness=tc.input_cluster_softness,
    )


def _build_model(
    inputs: _RunInputs, train_idx: np.ndarray, dev: torch.device
) -> tuple[LocusFormer, Rows]:
    """A new model on ``dev``, standardized by the training rows' column statistics, and
    the standardized rows it trains on."""
    mc = inputs.mc
    mean, std = column_stats(inputs.X, train_idx)
    layout = build_layout(inputs.loci, mc.patch_size, mc.position_scale, mc.coordinate_unit)
    model = LocusFormer(mc, layout, len(inputs.batch_names))
    model.set_standardization(mean, std)
    model.to(dev)
    if inputs.tc.compile:
        # In place: parameter names, and so checkpoints and saved models, stay as
        # without compilation.
        model.encoder.compile()
    return model, Rows(inputs.X, model.gene_mean.cpu(), model.gene_std.cpu())


def _optimization(
    model: LocusFormer, tc: TrainConfig, n_train: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR, EpochPlan]:
    """The optimizer, its warm-up and cosine schedule over the whole run, and the epochs
    the run plans for ``n_train`` training rows."""
    optimizer = configure_optimizer(model, tc)
    plan = epoch_plan(n_train, tc)
    total_steps = (plan.steps or math.ceil(n_train / tc.batch_size)) * plan.epochs
    warmup_steps = max(1, round(tc.warmup_fraction * total_steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, WarmupCosine(total_steps, warmup_steps)
    )
    return optimizer, scheduler, plan


def _distributed(model: LocusFormer, dev: torch.device) -> torch.nn.Module:
    """``model`` wrapped by DistributedDataParallel.

    Same seed everywhere: identical initial weights (DDP also broadcasts rank 0's),
    validation split and shuffling; each process takes its share of every global batch.
    """
    return torch.nn.parallel.DistributedDataParallel(
        model,
        device_ids=[dev.index] if dev.type == "cuda" else None,
        # The buffers (standardization, layout) are the same everywhere and fixed.
        forward_sync_buffers=False,
    )


def _best_model(
    inputs: _RunInputs, model: LocusFormer, state: TrainingState, rank0: bool
) -> tuple[TrainedModel, pd.DataFrame]:
    """The trained model with the run's best weights, in eval mode, and its history (the
    history file rewritten whole)."""
    if state.best_state is not None:
        model.load_state_dict(state.best_state)
    model.eval()
    if inputs.log_path is not None and rank0:
        _write_history(inputs.log_path, state.history)
    record = ModelRecord(
        inputs.batch_names,
        inputs.gene_ids,
        loci=inputs.loci.reset_index(drop=True),
        seed=inputs.seed,
    )
    history = pd.DataFrame(state.history, columns=HISTORY_COLUMNS)
    return TrainedModel(model, record), history


def _train_epochs(
    run: _Run,
    state: TrainingState,
    checkpoint_path: str | os.PathLike | None,
    log_path: str | os.PathLike | None,
    on_epoch_end: Callable[[int, dict[str, float]], None] | None,
    bar: tqdm,
) -> None:
    """Run epochs until ``run.plan.epochs`` or early stopping, updating ``state`` in place."""
    tc, model = run.tc, run.model
    rampup, patience = run.plan.rampup(tc), run.plan.patience(tc)
    if state.extended:
        run.plan = run.plan._replace(epochs=run.plan.epochs + run.plan.extension(tc))
    fits = _clusters_fit(run)
    while state.epoch < run.plan.epochs and not state.stopped:
        epoch = state.epoch  # 0-based index of the epoch about to run
        t0 = time.perf_counter()
        ramp = ramp_at(epoch, rampup)
        weights = loss_weights(tc, ramp)
        if not fits:
            weights = weights._replace(batch_mean=0.0)
        # Under DDP every process finds the same clusters (same weights, rows and seed),
        # so all of them take the same decision.
        clusters = _epoch_clusters(run, weights, epoch)
        compared = float("nan") if clusters is None else float(clusters_compared(clusters))
        if clusters is not None and not state.extended and _all_shared(clusters, epoch, rampup):
            state.extended = _extend(run)
            bar.total = run.plan.epochs
        model.train()
        row = {"epoch": epoch + 1, **_run_epoch(run, weights, clusters, epoch)}
        row["clusters_compared"] = compared
        row.update(
            validate(
                model,
                run.Xs,
                run.codes,
                run.val_rows,
                batch_size=tc.batch_size,
                dev=run.device,
                dist=run.dist,
            )
        )
        row["lr"] = run.scheduler.get_last_lr()[0]
        row["adversary_weight"] = ramp * tc.adversary_weight
        row["seconds"] = time.perf_counter() - t0
        state.history.append(row)

        # Early stopping only once the adversary is at full strength: before, the
        # lowest reconstruction loss belongs to the least batch-corrected model.
        held_out = len(run.val_rows) > 0
        monitored = row["val_recon"] if held_out else row["train_recon"]
        if epoch + 1 >= rampup:
            if monitored < state.best_loss:
                state.best_loss = monitored
                # With nothing held out the last epoch is kept (no snapshot): the
                # training reconstruction is what the optimizer lowers, a minibatch mean
                # whose noise chose epochs that kept the batch (docs/notes/2026-12-07.md).
                if held_out:
                    state.best_state = cpu_state(model)
                state.bad_epochs = 0
            else:
                state.bad_epochs += 1
                state.stopped = 0 < patience <= state.bad_epochs
        state.epoch = epoch + 1

        if checkpoint_path is not None:
            save_checkpoint(
                checkpoint_path,
                run.fingerprint,
                model,
                optimizer=run.optimizer,
                scheduler=run.scheduler,
                generator=run.generator,
                state=state,
            )
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


def _clusters_fit(run: _Run) -> bool:
    """Whether the batch means can be compared within the latent's clusters: there are
    enough training rows for them (:func:`~locusformer.train.alignment.enough_for_clusters`).
    Where not, the term is off rather than moved to whole batches, whose means differ with
    the batches' biology (issue 18)."""
    tc = run.tc
    if tc.batch_mean_scope != "clusters" or not tc.batch_mean_weight:
        return True
    n, k, b = len(run.train_rows), tc.batch_mean_clusters, run.model.n_batches
    if enough_for_clusters(n, k, b):
        return True
    log.info(
        "cluster term: %d training samples are fewer than %d for %d clusters in %d "
        "batches (%d a cluster and batch); off",
        n,
        CELL_SAMPLES * k * b,
        k,
        b,
        CELL_SAMPLES,
    )
    return False


def _step(run: _Run, total: torch.Tensor) -> None:
    """One optimizer step on ``total``, clipped, and the schedule's step."""
    run.optimizer.zero_grad(set_to_none=True)
    total.backward()  # under DDP, the gradients are averaged over the processes here
    if run.tc.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.tc.grad_clip)
    run.optimizer.step()
    run.scheduler.step()


def _all_shared(clusters: Clusters, epoch: int, rampup: float) -> bool:
    """Whether ``epoch`` is the cluster term's first and every batch holds a fair share
    of every cluster (every gate open)."""
    return (epoch == 0 or ramp_at(epoch - 1, rampup) < 1.0) and bool(clusters.gate.all())


def _extend(run: _Run) -> bool:
    """Add ``plan.extension`` epochs to the run, the learning rate's remaining decay
    spread over them; returns whether any were added."""
    extra = run.plan.extension(run.tc)
    if extra:
        per_epoch = run.plan.steps or math.ceil(len(run.train_rows) / run.tc.batch_size)
        for schedule in run.scheduler.lr_lambdas:  # one object per group; stretch is idempotent
            schedule.stretch(run.scheduler.last_epoch, extra * per_epoch)
        run.plan = run.plan._replace(epochs=run.plan.epochs + extra)
    return extra > 0


def _run_epoch(
    run: _Run, weights: LossWeights, clusters: Clusters | None, epoch: int
) -> dict[str, float]:
    """One pass over the training rows; returns mean losses and discriminator accuracy."""
    if run.dist is not None:
        return _run_epoch_distributed(run, weights, clusters, epoch)
    model, tc, dev = run.model, run.tc, run.device
    chunks = epoch_minibatches(run.train_rows, run.plan, tc.batch_size, run.generator)
    # Per-step losses stay on the device (no sync per step); checked once per epoch.
    per_step, correct, seen = [], 0, 0
    batches = minibatches(run.Xs, run.codes, chunks, dev, run.targets)
    for (xb, bb, tb), rows in zip(batches, chunks, strict=True):
        with autocast(dev):
            out = model(
                xb,
                bb,
                adversary_weight=weights.confusion,
                adversary=tc.adversary,
                cycle_batch=_other_batches(bb, model.n_batches, weights, run.generator),
            )
        prior = run.batch_prior if tb is None else tb
        loss = model.loss(
            xb,
            bb,
            out,
            weights,
            prior,
            clusters=clusters,
            levels=_rows(run.levels, rows, dev),
            level_weights=_rows(run.level_weights, rows, dev),
        )
        _step(run, loss.total)
        per_step.append(torch.stack(list(loss)).detach())
        correct += (out.batch_logits.argmax(-1) == bb).sum()
        seen += len(bb)
    losses = torch.stack(per_step).cpu()  # (steps, terms)
    check_finite(losses, epoch)
    return {**loss_means(losses), "train_disc_acc": float(correct) / max(1, seen)}


def _epoch_clusters(run: _Run, weights: LossWeights, epoch: int) -> Clusters | None:
    """The latent's soft clusters at the start of ``epoch``, when the batch means are
    compared within clusters (``batch_mean_scope="clusters"``) and weigh something in
    this epoch's ``weights``; else None.

    Found on the training rows' latents in eval mode (at most
    :data:`~locusformer.train.alignment.CLUSTER_MAX_SAMPLES`, drawn from their own seeded stream
    so the shuffling is as without them): a function of the weights at the epoch's start,
    so a run resumed from a checkpoint finds the same clusters.
    """
    tc, model = run.tc, run.model
    if tc.batch_mean_scope != "clusters" or not weights.batch_mean:
        return None
    rows = run.train_rows
    if len(rows) > CLUSTER_MAX_SAMPLES:
        rng = np.random.default_rng([run.seed, 4, epoch])
        rows = rows[np.sort(rng.choice(len(rows), CLUSTER_MAX_SAMPLES, replace=False))]
    crossed = tc.batch_mean_levels and run.levels is not None
    n_levels = int(run.levels.max()) + 1 if crossed else 0
    found = latent_clusters(
        _latents(run, rows),
        run.codes[rows].numpy(),
        model.n_batches,
        tc.batch_mean_clusters,
        seed=run.seed,
        levels=run.levels[rows].numpy() if crossed else None,
        n_levels=n_levels,
    )
    tensors = (torch.from_numpy(a).to(run.device) for a in found)
    return Clusters(*tensors, CLUSTER_SIGMA, cover=tc.batch_mean_cover, levels=n_levels)


def _latents(run: _Run, rows: torch.Tensor) -> np.ndarray:
    """(len(rows), Z) float32 latents of the training matrix's ``rows``, in eval mode;
    the model's mode is restored after."""
    model = run.model
    was_training = model.training
    model.eval()
    latents = []
    with torch.inference_mode():
        batch_size = max(run.tc.batch_size, 256)
        for xb, _, _ in minibatches(run.Xs, run.codes, rows.split(batch_size), run.device):
            with autocast(run.device):
                latents.append(model.encode(xb)[0].float().cpu())
    model.train(was_training)
    return torch.cat(latents).numpy()


def _other_batches(
    batch: torch.Tensor, n_batches: int, weights: LossWeights, generator: torch.Generator
) -> torch.Tensor | None:
    """(B,) a batch other than each sample's own, uniformly, for the cycle term; None
    when the term weighs nothing (no draw: the random stream stays as without it)."""
    if not weights.cycle or n_batches < 2:
        return None
    shift = torch.randint(1, n_batches, batch.shape, generator=generator)
    return (batch + shift.to(batch.device)) % n_batches


def _run_epoch_distributed(
    run: _Run, weights: LossWeights, clusters: Clusters | None, epoch: int
) -> dict[str, float]:
    """One epoch under DDP: the update one process makes on the same global batches.

    Every process draws the same permutation and takes a contiguous share of each global
    batch. The per-sample terms weigh the share's size (``LocusFormer.loss``'s
    ``share``), so that DDP's gradient average is the gradient of the global mean. The
    batch-statistic terms (whitened batch-mean distance, MMD) need the whole batch: the
    latents are gathered (with gradient) and every process computes the same value.
    """
    model, tc, dev, dist = run.model, run.tc, run.device, run.dist
    assert dist is not None and run.forward is not None
    # Dropout differs between processes and is reproducible on resume, without saving
    # every process's random state.
    stream = np.random.SeedSequence([run.seed, 2, epoch, dist.rank])
    torch.manual_seed(int(stream.generate_state(1)[0]))
    chunks = epoch_minibatches(run.train_rows, run.plan, tc.batch_size, run.generator)
    cuda = dev.type == "cuda"
    per_step, correct, seen = [], torch.zeros((), device=dev), 0
    for chunk in chunks:
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
        # Drawn for the whole global batch, identically everywhere (the processes share
        # the shuffling generator's state), then each takes its share.
        cycle = _other_batches(
            run.codes.index_select(0, chunk), model.n_batches, weights, run.generator
        )
        if cycle is not None:
            start = sum(sizes[: dist.rank]) if sizes[dist.rank] else 0
            cycle = cycle[start : start + len(rows)].to(dev, non_blocking=cuda)
        with autocast(dev):
            out = run.forward(
                xb,
                bb,
                adversary_weight=weights.confusion,
                adversary=tc.adversary,
                cycle_batch=cycle,
            )
        z_all = gather_rows(out.latent, sizes, dist.rank)
        b_all = run.codes.index_select(0, chunk).to(dev, non_blocking=cuda)
        prior, t_all = run.batch_prior, None
        if run.targets is not None:
            prior = run.targets.index_select(0, rows).to(dev, non_blocking=cuda)
            t_all = run.targets.index_select(0, chunk).to(dev, non_blocking=cuda)
        stats = (z_all, b_all, t_all, _rows(run.levels, chunk, dev))
        loss = model.loss(
            xb,
            bb,
            out,
            weights,
            prior,
            share=share,
            stats=stats,
            clusters=clusters,
            level_weights=_rows(run.level_weights, chunk, dev),
        )
        _step(run, loss.total)
        # This process's parts of the global means; summed over the processes below.
        w = share / dist.world
        per_sample = [loss.recon * w, loss.adversary * w, loss.confusion * w, loss.cycle * w]
        stats = [loss.batch_mean / dist.world, loss.mmd / dist.world, loss.level_mean / dist.world]
        per_step.append(torch.stack(per_sample + stats).detach().float())
        if sizes[dist.rank]:
            correct = correct + (out.batch_logits.argmax(-1) == bb).sum()
            seen += len(bb)
    losses = torch.stack(per_step)  # (steps, terms without the total)
    counts = torch.stack([correct.float(), torch.tensor(float(seen), device=dev)])
    losses, counts = losses.to(dist.comm_device), counts.to(dist.comm_device)
    torch.distributed.all_reduce(losses)
    torch.distributed.all_reduce(counts)
    losses = losses.cpu()
    recon, adversary, confusion, cycle, batch_mean, mmd, level_mean = losses.unbind(dim=1)
    total = recon + adversary + weights.confusion * confusion + weights.cycle * cycle
    total = total + weights.ramp * (weights.batch_mean * batch_mean + weights.mmd * mmd)
    total = total + weights.level_mean * level_mean
    losses = torch.cat([losses, total[:, None]], dim=1)  # (steps, terms) as on one process
    check_finite(losses, epoch)
    right, total_seen = counts.tolist()
    return {**loss_means(losses), "train_disc_acc": right / max(1.0, total_seen)}


__all__ = [
    "HISTORY_COLUMNS",
    "ModelConfig",
    "TrainConfig",
    "TrainedModel",
    "TrainingDivergedError",
    "load_model",
    "read_batches",
    "save_model",
    "split_params",
    "train_corrector",
]
