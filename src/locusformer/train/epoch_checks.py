"""What the training loop checks after each epoch: the held-out reconstruction and
discriminator accuracy, that every step's losses were finite, and whether the cluster
term compared any batches."""

from __future__ import annotations

import math

import numpy as np
import torch

from locusformer.errors import TrainingDivergedError
from locusformer.model.losses import Clusters, compared_clusters
from locusformer.model.network import LocusFormer, Loss, LossWeights
from locusformer.train.data import Rows, minibatches
from locusformer.train.distributed import Dist
from locusformer.train.runtime import autocast

#: The words the divergence message uses for the loss terms that are not plain names.
LOSS_WORDS = {"recon": "reconstruction", "batch_mean": "batch mean", "level_mean": "level mean"}


def check_finite(losses: torch.Tensor, epoch: int) -> None:
    """Raise TrainingDivergedError at the first step (row of ``losses``) not finite."""
    bad = (~torch.isfinite(losses)).any(dim=1)
    if not bool(bad.any()):
        return
    step = int(bad.nonzero()[0, 0])
    words = [LOSS_WORDS.get(name, name) for name in Loss._fields]
    values = dict(zip(words, losses[step].tolist(), strict=True))
    total = values.pop("total")
    parts = ", ".join(f"{word} {value}" for word, value in values.items())
    raise TrainingDivergedError(
        f"training diverged at epoch {epoch + 1}, step {step + 1}: total loss {total} ({parts})"
    )


def loss_means(losses: torch.Tensor) -> dict[str, float]:
    """(steps, terms) per-step losses -> {"train_recon": mean, ...}."""
    means = losses.mean(dim=0).tolist()
    return {f"train_{name}": value for name, value in zip(Loss._fields, means, strict=True)}


@torch.inference_mode()
def validate(
    model: LocusFormer,
    Xs: Rows,
    codes: torch.Tensor,
    val_rows: np.ndarray,
    batch_size: int,
    dev: torch.device,
    dist: Dist | None = None,
) -> dict[str, float]:
    """Reconstruction loss (own batch) and discriminator accuracy on held-out samples.

    The reconstruction is :meth:`LocusFormer.loss`'s, as in training. Under DDP every
    process scores its share and the sums are added up, so all of them take the same
    early-stopping decision.
    """
    if len(val_rows) == 0:
        return {"val_recon": math.nan, "val_disc_acc": math.nan}
    was_training = model.training
    model.eval()
    rows = val_rows if dist is None else np.array_split(val_rows, dist.world)[dist.rank]
    sq, correct = 0.0, 0
    chunks = torch.from_numpy(rows).split(max(batch_size, 256))
    for xb, bb, _ in minibatches(Xs, codes, chunks, dev):
        with autocast(dev):
            out = model(xb, bb)
        sq += float(model.loss(xb, bb, out, LossWeights()).recon) * xb.numel()
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


def clusters_compared(clusters: Clusters) -> int:
    """How many clusters (cells of cluster and level, when crossed with the levels) the
    cluster term compares batches in (:func:`compared_clusters`)."""
    return int(compared_clusters(clusters.gate).sum())
