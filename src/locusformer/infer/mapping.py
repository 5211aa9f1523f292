"""Mapping new data onto a trained model: new samples and new batches, no retraining.

A lab trains once on its reference and maps each new run onto it. The new data are
prepared to the model's loci (:func:`align_genes`: missing loci filled with the
reference's mean, extra genes ignored). Samples of batches the model was trained on are
corrected as :func:`locusformer.infer.correct.correct` does. Samples of new batches go through
the batch-free encoder and are decoded to the reference condition (zero-shot); with
``adapt_epochs`` > 0, a :class:`~locusformer.model.network.BatchAdapter` first learns a per-locus
input shift and scale (and an output shift) for each new batch, everything trained
before frozen, so the reference's outputs do not move (scArches, Lotfollahi et al. 2022;
scvi-tools' ``load_query_data`` freezes the reference the same way).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from locusformer.errors import InputError, TrainingDivergedError
from locusformer.infer.correct import CHUNK_SIZE, correct, reference_code
from locusformer.model.files import TrainedModel
from locusformer.model.losses import confusion_loss
from locusformer.model.network import BatchAdapter, LocusFormer
from locusformer.train.runtime import autocast, deterministic, resolve_device

#: The least share of the model's loci a query must measure. Below half, the filled loci
#: (each at the reference's mean) outweigh the measured ones in every token the encoder
#: reads, and the mapping says more about the reference than about the query.
MIN_SHARED_LOCI = 0.5

#: Weight of the frozen discriminator's confusion term during adaptation, as in training.
ADAPT_CONFUSION_WEIGHT = 0.3


@dataclass
class GeneMatch:
    """How a query's genes met the model's loci."""

    n_model: int
    n_present: int
    missing: list[str]  # model loci the query lacks (filled with the reference's mean)
    n_extra: int  # query genes the model does not use (ignored)

    @property
    def share_present(self) -> float:
        return self.n_present / max(1, self.n_model)

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_model_loci": self.n_model,
            "n_present": self.n_present,
            "share_present": round(self.share_present, 6),
            "n_missing": len(self.missing),
            "missing_examples": self.missing[:20],
            "n_extra_ignored": self.n_extra,
        }


def align_genes(
    frame: pd.DataFrame, model: TrainedModel, source: str = "query matrix"
) -> tuple[np.ndarray, GeneMatch]:
    """Samples x genes log-expression -> (n, L) float32 in the model's locus order.

    A locus the query lacks takes the reference's training mean (standardized value 0:
    no evidence either way); a query gene the model does not use is ignored. Fewer than
    :data:`MIN_SHARED_LOCI` of the model's loci present is an :class:`InputError`.
    """
    where, match = match_genes(frame.columns, model, source)
    present = where >= 0
    return fill_missing(model, frame.to_numpy(dtype=np.float32)[:, where[present]], where), match


def match_genes(
    columns: pd.Index, model: TrainedModel, source: str = "query matrix"
) -> tuple[np.ndarray, GeneMatch]:
    """Where each of the model's loci is among ``columns`` (-1: missing), and how they met;
    checked as :func:`align_genes` describes."""
    if model.gene_ids is None:
        raise InputError("model", "the model records no gene ids; it cannot map new data")
    columns = pd.Index(columns.astype(str))
    if columns.has_duplicates:
        raise InputError(source, f"duplicate gene {columns[columns.duplicated()][0]!r}")
    genes = pd.Index(model.gene_ids)
    where = columns.get_indexer(genes)  # -1: missing
    present = where >= 0
    match = GeneMatch(
        n_model=len(genes),
        n_present=int(present.sum()),
        missing=genes[~present].tolist(),
        n_extra=int((~columns.isin(genes)).sum()),
    )
    if match.share_present < MIN_SHARED_LOCI:
        raise InputError(
            source,
            f"measures {match.n_present} of the model's {match.n_model} loci "
            f"({100 * match.share_present:.0f}%); at least {100 * MIN_SHARED_LOCI:.0f}% needed "
            f"(missing e.g. {', '.join(match.missing[:3])})",
        )
    return where, match


def fill_missing(model: TrainedModel, present_values: np.ndarray, where: np.ndarray) -> np.ndarray:
    """(n, L) float32 in the model's locus order from the values of the loci present
    (``where >= 0``, in that order); the missing ones take the training mean."""
    mean = model.module.gene_mean.detach().cpu().numpy().astype(np.float32)
    X = np.broadcast_to(mean, (len(present_values), len(where))).copy()
    X[:, where >= 0] = present_values
    return X


@dataclass
class MappingResult:
    """Corrected values and latent of a query, and what the mapping did."""

    corrected: np.ndarray  # (n, L) float32, the model's loci
    latent: np.ndarray  # (n, Z) float32
    new_batches: list[str]  # batches of the query the model was not trained on
    adapted: bool  # whether the new batches were adapted (else zero-shot)
    history: list[dict[str, float]] = field(default_factory=list)  # adaptation epochs


def map_query(
    model: TrainedModel,
    X: np.ndarray,
    batch_labels: Sequence[Any],
    *,
    reference: str = "mean",
    adapt_epochs: int = 0,
    lr: float = 1e-2,
    batch_size: int = 64,
    seed: int = 0,
    chunk_size: int = CHUNK_SIZE,
    device: str | torch.device = "auto",
) -> MappingResult:
    """Correct query ``X`` (n, L, the model's loci) with ``model``, new batches included.

    Samples of known batches are corrected as :func:`~locusformer.infer.correct.correct` does.
    Samples of new batches are encoded (the encoder never sees the batch) and decoded to
    ``reference``; with ``adapt_epochs`` > 0 their input first passes a
    :class:`~locusformer.model.network.BatchAdapter` trained for that many epochs on them with
    every parameter of ``model`` frozen: reconstruction of their own values (through the
    adapter's output shift) plus the frozen discriminator's confusion over the reference
    batches. ``model`` is left exactly as it was.
    """
    labels = np.array([str(b) for b in batch_labels], dtype=object)
    if len(labels) != len(X):
        raise InputError("batch labels", f"{len(labels)} labels for {len(X)} samples")
    ref_code = reference_code(model, reference)
    if adapt_epochs < 0:
        raise InputError("adapt_epochs", f"must be >= 0, got {adapt_epochs}")
    X = np.ascontiguousarray(X, dtype=np.float32)
    known = np.isin(labels, model.batch_names)
    new_batches = sorted(set(labels[~known].tolist()))
    corrected = np.empty(X.shape, dtype=np.float32)
    latent = np.empty((len(X), model.config.latent_dim), dtype=np.float32)
    if known.any():
        c, z = correct(
            model,
            X[known],
            labels[known].tolist(),
            reference=reference,
            chunk_size=chunk_size,
            device=device,
        )
        corrected[known], latent[known] = c, z
    history: list[dict[str, float]] = []
    if new_batches:
        codes = np.array([new_batches.index(b) for b in labels[~known]], dtype=np.int64)
        dev = resolve_device(device)
        net = model.module.to(dev).eval()
        adapter = BatchAdapter(len(new_batches), model.n_loci).to(dev)
        if adapt_epochs:
            history = _adapt(
                net,
                adapter,
                X[~known],
                codes,
                epochs=adapt_epochs,
                lr=lr,
                batch_size=batch_size,
                seed=seed,
            )
        c, z = _decode_new(
            net, adapter, X[~known], codes, ref_code=ref_code, chunk_size=chunk_size, dev=dev
        )
        corrected[~known], latent[~known] = c, z
    return MappingResult(
        corrected, latent, new_batches, bool(adapt_epochs and new_batches), history
    )


@torch.inference_mode()
def _decode_new(
    net: LocusFormer,
    adapter: BatchAdapter,
    X: np.ndarray,
    codes: np.ndarray,
    *,
    ref_code: int | None,
    chunk_size: int,
    dev: torch.device,
) -> tuple[np.ndarray, np.ndarray]:
    out_c, out_z = [], []
    for start in range(0, len(X), chunk_size):
        x = torch.from_numpy(X[start : start + chunk_size]).to(dev)
        new = torch.from_numpy(codes[start : start + chunk_size]).to(dev)
        xs = adapter.adapt(net.standardize(x), new)
        with autocast(dev):  # as correct() runs the known batches
            z, _ = net.encode(xs)
            out = net.decode(z, net.reference_condition(ref_code, len(x), dev)).float()
        out_c.append(net.unstandardize(out).cpu().numpy())
        out_z.append(z.float().cpu().numpy())
    return np.concatenate(out_c), np.concatenate(out_z)


def _adapt(
    net: LocusFormer,
    adapter: BatchAdapter,
    X: np.ndarray,
    codes: np.ndarray,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
) -> list[dict[str, float]]:
    """Train ``adapter`` on the new batches' samples; ``net`` stays frozen (and in eval)."""
    dev = next(net.parameters()).device
    frozen = [p.requires_grad for p in net.parameters()]
    for p in net.parameters():
        p.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(adapter.parameters(), lr=lr)
    prior = torch.full((net.n_batches,), 1.0 / net.n_batches, device=dev)
    mean_cond = net.reference_condition(None, 1, dev)
    Xt, ct = torch.from_numpy(X), torch.from_numpy(codes)
    history = []
    try:
        with deterministic(dev.type == "cpu"):
            for epoch in range(epochs):
                order = torch.randperm(len(Xt), generator=generator)
                total, steps = 0.0, 0
                for rows in order.split(batch_size):
                    x = net.standardize(Xt[rows].to(dev))
                    new = ct[rows].to(dev)
                    with autocast(dev):  # as the model was trained
                        z, _ = net.encode(adapter.adapt(x, new))
                        cond = mean_cond.expand(len(x), -1)
                        recon = adapter.output(net.decode(z, cond), new)
                        logits = net.discriminator(z)
                    confusion = confusion_loss(logits.float(), prior)
                    loss = F.mse_loss(recon.float(), x) + ADAPT_CONFUSION_WEIGHT * confusion
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                    total, steps = total + float(loss.detach()), steps + 1
                mean_loss = total / max(1, steps)
                if not math.isfinite(mean_loss):
                    raise TrainingDivergedError(f"adaptation diverged at epoch {epoch + 1}")
                history.append({"epoch": epoch + 1, "loss": mean_loss})
    finally:
        for p, flag in zip(net.parameters(), frozen, strict=True):
            p.requires_grad_(flag)
    return history


# --------------------------------------------------------------------------------------
# File-level step for the CLI
# --------------------------------------------------------------------------------------
