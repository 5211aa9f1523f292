"""The terms that push batch information out of the latent.

Gradient reversal and the confusion objective act through a batch discriminator; the
whitened batch-mean distance and the MMD act on the latent's batch statistics directly.
Torch and the standard library only, like the model that weighs them.

Shapes: B samples, Z latent width, N batches.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class GradientReversal(torch.autograd.Function):
    """Identity forward; multiplies the gradient by -weight backward.

    The discriminator behind it learns to predict the batch at full strength while the
    encoder is pushed, with strength ``weight``, to make that impossible.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: float) -> Tensor:
        ctx.weight = weight
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return -ctx.weight * grad, None


def grad_reverse(x: Tensor, weight: float) -> Tensor:
    return GradientReversal.apply(x, weight)


def frozen_call(module: nn.Module, x: Tensor) -> Tensor:
    """``module(x)`` with the gradient flowing into ``x`` only, not into the parameters."""
    params = {name: p.detach() for name, p in module.named_parameters()}
    return torch.func.functional_call(module, params, (x,))


def confusion_loss(logits: Tensor, prior: Tensor) -> Tensor:
    """Cross-entropy of discriminator logits (B, N) against the batch prior (N,) or (B, N).

    The encoder's adversarial objective in "confusion" mode: the latent should leave the
    discriminator no better than the batch frequencies. Unlike maximizing the
    discriminator's error (gradient reversal), which drives a cell toward wherever the
    discriminator is surest of *another* batch, this drives it toward where the
    discriminator is unsure. That matters when batches hold different cell types: a
    cell type present in some batches only is a region the discriminator is sure about,
    and reversal pulls the other batches' cells into it.

    A per-sample prior (B, N) is zero on the batches that do not hold the sample's
    biology (:mod:`locusformer.alignment`). The discriminator's output is then compared
    over the batches that do, renormalized: the encoder is asked to leave the batch
    uncertain among those, and nothing about the others. A sample that its own batch
    alone holds adds 0, where a plain cross-entropy would push its batch into the latent.
    """
    if prior.dim() == 1:
        return -(prior.to(logits.dtype) * F.log_softmax(logits.float(), dim=-1)).sum(-1).mean()
    held = prior > 0  # (B, N)
    logp = F.log_softmax(logits.float().masked_fill(~held, float("-inf")), dim=-1)
    terms = torch.where(held, prior.float() * logp, torch.zeros_like(logp))
    return -terms.sum(-1).mean()


def batch_mean_distance(
    z: Tensor,
    batch: Tensor,
    n_batches: int,
    ridge: float = 1e-2,
    weight: Tensor | None = None,
) -> Tensor:
    """Between-batch spread of the latent means, whitened by the within-batch covariance.

    sum_b (n_b / n) (mu_b - mu)^T (S_w + ridge * tr(S_w)/Z * I)^-1 (mu_b - mu): the
    Fisher ratio a linear classifier of the batch would exploit. Whitening makes it
    scale-free, so batch information cannot hide in a low-variance direction, and being
    quadratic it does not saturate (a confident discriminator passes back almost no
    gradient; this term does). 0 when one batch only is present. Like ``batch_mmd`` it
    has no data-dependent branches, so it never waits on the GPU. ``weight`` (B,) counts
    each sample that much in every mean and covariance (0: left out); None: all count 1.
    """
    z = z.float()
    n, Z = z.shape
    onehot = F.one_hot(batch, n_batches).float()  # (B, N)
    if weight is not None:
        w = weight.float()[:, None]  # (B, 1)
        onehot = onehot * w
        n = w.sum().clamp_min(1e-8)
    counts = onehot.sum(dim=0)  # (N,)
    means = (onehot.T @ z) / counts.clamp_min(1.0 if weight is None else 1e-8)[:, None]
    centered = z - means[batch]  # (B, Z) within-batch deviations
    if weight is None:
        dof = (n - (counts > 0).sum()).clamp_min(1)
        s_w = centered.T @ centered / dof  # (Z, Z)
        mean = z.mean(dim=0)
    else:
        dof = (n - (counts > 0).sum()).clamp_min(1.0)
        s_w = (centered * w).T @ centered / dof
        mean = (w * z).sum(dim=0) / n
    s_w = s_w + ridge * (s_w.trace() / Z + 1e-8) * torch.eye(Z, device=z.device)
    d = means - mean  # (N, Z)
    solved = torch.linalg.solve(s_w, d.T).T  # (N, Z) = S_w^-1 d
    return ((counts / n)[:, None] * d * solved).sum()  # absent batches weigh 0


def batch_mmd(z: Tensor, batch: Tensor, n_batches: int) -> Tensor:
    """Mean over batches of MMD^2(latent of batch b, latent of all other batches).

    Gaussian kernels at several bandwidths around the mean squared distance, so the term
    does not depend on the scale of the latent. Batches absent from (or alone in) the
    minibatch count for nothing.
    """
    z = z.float()
    d2 = torch.cdist(z, z).pow(2)  # (B, B)
    scale = d2.detach().mean().clamp_min(1e-8)
    kernel = sum(torch.exp(-d2 / (scale * s)) for s in (0.25, 1.0, 4.0))  # (B, B)
    inside = F.one_hot(batch, n_batches).float()  # (B, N)
    outside = 1.0 - inside
    n_in, n_out = inside.sum(dim=0), outside.sum(dim=0)  # (N,)
    k_in = (inside * (kernel @ inside)).sum(dim=0) / n_in.clamp_min(1.0) ** 2
    k_out = (outside * (kernel @ outside)).sum(dim=0) / n_out.clamp_min(1.0) ** 2
    k_cross = (inside * (kernel @ outside)).sum(dim=0) / (n_in * n_out).clamp_min(1.0)
    valid = ((n_in > 0) & (n_out > 0)).float()  # (N,)
    return ((k_in + k_out - 2 * k_cross) * valid).sum() / valid.sum().clamp_min(1.0)
