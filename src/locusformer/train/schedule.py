"""How an optimizer run is planned: epochs, learning-rate schedule, loss-term ramps.

Convergence follows the number of updates, not of passes over the data, so the plan
is sized in optimizer steps (``TrainConfig.max_steps``); everything counted in epochs
shrinks with it on large data.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from locusformer.model.config import TrainConfig
from locusformer.model.network import LocusFormer, LossWeights


class WarmupCosine:
    """Linear warm-up to 1, then cosine decay to 0 at ``total_steps``; the factor on the
    learning rate at each optimizer step.

    A callable object, not a closure, so that ``LambdaLR.state_dict`` saves a
    :meth:`stretch` with the checkpoint and a resumed run decays as the original did.
    """

    def __init__(self, total_steps: int, warmup_steps: int) -> None:
        self.total_steps = total_steps
        self.warmup_steps = warmup_steps
        self.stretch_from = total_steps  # steps after this one run slower through the decay
        self.stretch_factor = 1.0

    def __call__(self, step: int) -> float:
        at: float = step
        if step > self.stretch_from:
            at = self.stretch_from + (step - self.stretch_from) / self.stretch_factor
        if at < self.warmup_steps:
            return (at + 1) / self.warmup_steps
        progress = (at - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    def stretch(self, from_step: int, extra_steps: int) -> None:
        """Spread the decay left after ``from_step`` over ``extra_steps`` more steps: the
        factor is unchanged up to ``from_step`` and reaches 0 at the new end."""
        left = max(1, self.total_steps - from_step)
        self.stretch_from = from_step
        self.stretch_factor = (left + extra_steps) / left


#: Held-out rows scored at each epoch's end, at most (see validation_rows).
VAL_MAX_SAMPLES = 10_000


class EpochPlan(NamedTuple):
    """How many epochs a run takes, what one is, and the factor on epoch-counted settings."""

    epochs: int
    scale: float  # on the ramp-up and patience, which are counted in epochs
    steps: int | None = None  # minibatches per epoch; None: one pass over the training rows

    def rampup(self, config: TrainConfig) -> float:
        """Epochs over which the batch-removal weights ramp up."""
        return config.adversary_rampup_epochs * self.scale

    def patience(self, config: TrainConfig) -> int:
        """Epochs without improvement before stopping; 0: no early stopping."""
        return config.patience and max(1, round(config.patience * self.scale))

    def extension(self, config: TrainConfig) -> int:
        """Epochs added when the batches share every cluster (see
        ``TrainConfig.shared_extension``): a share of the planned epochs."""
        return round(config.shared_extension * self.epochs)


def epoch_plan(n_train: int, config: TrainConfig) -> EpochPlan:
    """The epochs to run on ``n_train`` samples.

    Small data: ``max_epochs`` passes over the training rows, or the fewest whole passes
    that reach ``max_steps`` optimizer steps when that is less, or that reach
    ``min_steps`` when that is more; the epoch-counted settings scale alike. A pass of
    fewer than ``min_epoch_steps`` minibatches is not an epoch: an epoch is then that
    many minibatches of successive shuffles, and the epochs are counted as before.

    Large data, where one pass takes more than ``max_steps / max_epochs`` steps: an epoch
    is that many minibatches of a fresh shuffle, and ``max_epochs`` of them run, so the
    ramp-up, the clusters found at each epoch's start and validation act as on small
    data. Counted in passes, 1M samples ran one epoch of 14,063 steps whose ramp-up was
    half an epoch: the cluster term used clusters of the untrained latent throughout
    (issue 15).
    """
    steps_per_pass = math.ceil(n_train / config.batch_size)
    steps = math.ceil(config.max_steps / config.max_epochs)
    if steps_per_pass > steps:
        return EpochPlan(max(config.max_epochs, math.ceil(config.min_steps / steps)), 1.0, steps)
    per_epoch = max(steps_per_pass, config.min_epoch_steps)
    epochs = min(config.max_epochs, max(1, math.ceil(config.max_steps / per_epoch)))
    epochs = max(epochs, math.ceil(config.min_steps / per_epoch))
    steps_per_epoch = None if per_epoch == steps_per_pass else per_epoch
    return EpochPlan(epochs, epochs / config.max_epochs, steps_per_epoch)


def epoch_minibatches(
    train_rows: torch.Tensor, plan: EpochPlan, batch_size: int, generator: torch.Generator
) -> list[torch.Tensor]:
    """The minibatches of one epoch, each a tensor of training rows: a shuffled pass cut
    into ``batch_size`` rows, or the first ``plan.steps`` minibatches of successive
    shuffles (one shuffle on large data: a draw without replacement; several on small
    data, each cut on its own so that no minibatch holds a row twice)."""
    chunks: list[torch.Tensor] = []
    while True:
        order = train_rows[torch.randperm(len(train_rows), generator=generator)]
        chunks.extend(order.split(batch_size))
        if plan.steps is None:
            return chunks
        if len(chunks) >= plan.steps:
            return chunks[: plan.steps]


def validation_rows(val_idx: np.ndarray, seed: int) -> np.ndarray:
    """The held-out rows scored at every epoch's end: all of them, or above
    :data:`VAL_MAX_SAMPLES` a seeded draw of that many (the rest stay out of training).

    With step-sized epochs, 1M samples would otherwise score 100,000 held-out rows 40
    times, more than the training steps' own work.
    """
    if len(val_idx) <= VAL_MAX_SAMPLES:
        return val_idx
    rng = np.random.default_rng([seed, 5])
    return np.sort(rng.choice(val_idx, VAL_MAX_SAMPLES, replace=False))


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


def loss_weights(tc: TrainConfig, ramp: float) -> LossWeights:
    """The weights of the loss terms at ramp factor ``ramp`` of the schedule."""
    return LossWeights(
        confusion=ramp * tc.adversary_weight,
        cycle=ramp * tc.cycle_weight,
        # Within clusters the means are compared once the ramp-up is over: only then
        # does the latent hold the biology the clusters should follow (found earlier,
        # they mix cell types, and comparing batches inside them removes biology).
        batch_mean=tc.batch_mean_weight if tc.batch_mean_scope == "batches" or ramp >= 1.0 else 0.0,
        mmd=tc.mmd_weight,
        # Protected levels are known from the start, unlike the latent's clusters.
        level_mean=tc.level_mean_weight,
        ramp=ramp,
    )


def planned_steps(n_train: int, config: TrainConfig) -> int:
    """Optimizer steps :func:`epoch_plan` plans on ``n_train`` samples (an extension aside)."""
    plan = epoch_plan(n_train, config)
    return plan.epochs * (plan.steps or math.ceil(n_train / config.batch_size))
