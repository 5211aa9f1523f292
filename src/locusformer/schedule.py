"""How an optimizer run is planned: epochs, learning-rate schedule, loss-term ramps.

Convergence follows the number of updates, not of passes over the data, so the plan
is sized in optimizer steps (``TrainConfig.max_steps``); everything counted in epochs
shrinks with it on large data.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from locusformer.config import TrainConfig
from locusformer.model import LocusFormer, LossWeights


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

    ``max_epochs``, unless that takes more than ``max_steps`` optimizer steps (then the
    fewest whole epochs that reach ``max_steps``) or fewer than ``min_steps`` (small data:
    then the fewest whole epochs that reach ``min_steps``).
    """
    steps_per_epoch = math.ceil(n_train / config.batch_size)
    epochs = min(config.max_epochs, max(1, math.ceil(config.max_steps / steps_per_epoch)))
    epochs = max(epochs, math.ceil(config.min_steps / steps_per_epoch))
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
