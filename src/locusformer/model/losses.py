"""The terms that push batch information out of the latent.

Gradient reversal and the confusion objective act through a batch discriminator; the
whitened batch-mean distance and the MMD act on the latent's batch statistics directly.
Torch and the standard library only, like the model that weighs them.

Shapes: B samples, Z latent width, N batches.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Clusters(NamedTuple):
    """Soft clusters of the latent, for :func:`cluster_batch_mean_distance`.

    K clusters, N batches; found by :func:`locusformer.train.alignment.latent_clusters`.
    """

    center: Tensor  # (Z,) subtracted from a latent before its cosine to the centroids
    centroids: Tensor  # (K, Z) unit length
    gate: Tensor  # (K, N) 1 where batch n holds cluster k's biology, else 0
    sigma: float  # softness of the assignment on the cosine distance
    cover: bool = False  # weigh each sample by :func:`cluster_cover` in every cluster
    levels: int = 0  # L > 0: gate is (K * L, N), a cell per cluster and level (cross_levels)


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
    biology (:mod:`locusformer.train.alignment`). The discriminator's output is then compared
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


def cluster_responsibilities(z: Tensor, clusters: Clusters) -> Tensor:
    """Soft assignment (B, K) of latents (B, Z) to the clusters' unit-length centroids.

    Harmony's (Korsunsky et al. 2019): softmax of minus the cosine distance 2(1 - cos)
    about the clusters' centre, over their ``sigma``. No gradient: the clusters say which
    samples to compare, they are not a target.
    """
    with torch.no_grad():
        unit = F.normalize(z.float() - clusters.center.float(), dim=-1)
        cos = unit @ clusters.centroids.float().T  # (B, K)
        return torch.softmax(-2.0 * (1.0 - cos) / clusters.sigma, dim=-1)


def cross_levels(weight: Tensor, levels: Tensor, n_levels: int) -> Tensor:
    """(B, K * L): each sample's ``weight`` (B, K) in the clusters, kept in the cell of its
    level (B,) of ``n_levels`` L and 0 in the others; cell k * L + l is cluster k, level l."""
    onehot = F.one_hot(levels.long(), n_levels).to(weight.dtype)  # (B, L)
    return (weight[:, :, None] * onehot[:, None, :]).reshape(len(weight), -1)


def cluster_cover(resp: Tensor, gate: Tensor, batch: Tensor, n_batches: int) -> Tensor:
    """(B, K): how far the batches compared in cluster k hold sample i's biology.

    A sample's soft responsibilities ``resp`` (B, K) spread it over neighbouring
    clusters. Where a cell type that some batches lack borders one that every batch
    holds, its edge cells then count in the shared cluster, in their batches' means
    there, and comparing those means with the other batches' draws the type into its
    neighbour (plate 2's reference; issue 14). Batch n lacks sample
    i's biology as far as i's clusters are closed to n: lacks[i, n] = sum_k resp[i, k]
    (1 - gate[k, n]), 0 for its own batch. Its cover in cluster k is 1 minus the most
    that a batch compared there lacks it: 1 where every one of them holds it (exactly,
    so where every gate is open nothing changes), near 0 where one of them holds only
    its neighbours.
    """
    with torch.no_grad():
        g = gate.float()  # (K, N)
        lacks = (resp.float() @ (1.0 - g)) * (1.0 - F.one_hot(batch, n_batches).float())
        # lacks >= 0, so masking the batches not compared in k by 0 leaves the maximum.
        return 1.0 - (lacks[:, None, :] * g[None]).amax(dim=-1)  # (B, K)


def compared_clusters(gate: Tensor) -> Tensor:
    """(K,) bool: the clusters of ``gate`` (K, N) that hold two gated batches or more,
    the only ones :func:`cluster_batch_mean_distance` compares batches in."""
    return gate.float().sum(dim=-1) >= 2


def cluster_batch_mean_distance(
    z: Tensor,
    batch: Tensor,
    n_batches: int,
    resp: Tensor,
    gate: Tensor,
    ridge: float = 1e-2,
) -> Tensor:
    """:func:`batch_mean_distance` within soft clusters: composition does not count.

    sum_k sum_b (n_kb / n) d_kb^T S^-1 d_kb with d_kb = mu_kb - mu_k, where sample i
    counts ``resp[i, k]`` in cluster k, mu_kb is the mean of batch b's samples in k and
    mu_k that of all gated batches in k, and S is the within-batch covariance of the
    minibatch as in :func:`batch_mean_distance` (so the term stays scale-free), each
    sample counted by its gated responsibilities.

    Batches are compared only where they hold the same biology: a batch that holds few
    of a cluster's samples (``gate`` (K, N) 0) is left out of that cluster's means (and
    of the whitening), so a cell type one batch lacks pulls nothing toward it, and
    batches holding cell types in different proportions are not asked for equal means.

    A minibatch holds a few samples per cluster and batch, and the squared distance of
    such small means is mostly their noise: a floor that grows with the clusters and
    that the encoder can lower only by collapsing the latent onto fewer directions.
    So d_kb^T S^-1 d_kb is estimated without it, as the product of the distances seen in
    the minibatch's two halves (even and odd positions; the minibatch is in random
    order): independent estimates of the same shift, whose product has the squared
    shift as expectation and no noise floor.
    """
    z = z.float()
    Z = z.shape[1]
    onehot = F.one_hot(batch, n_batches).float()  # (B, N)
    gate = gate.float()
    gate = gate * compared_clusters(gate)[:, None]  # a cluster of one batch: none
    w = resp.float()[:, :, None] * onehot[:, None, :] * gate[None]  # (B, K, N)
    # The whitening is that of the samples compared: one in no gated cluster counts 0,
    # so a type one batch alone holds neither moves nor is moved.
    compared = w.sum(dim=(1, 2))[:, None]  # (B, 1)
    counts_b = (onehot * compared).sum(dim=0)  # (N,)
    means_b = (onehot.T @ (compared * z)) / counts_b.clamp_min(1e-8)[:, None]  # (N, Z)
    centered = z - means_b[batch]  # (B, Z)
    dof = (counts_b.sum() - (counts_b > 0).sum()).clamp_min(1.0)
    s_w = (centered * compared).T @ centered / dof  # (Z, Z)
    s_w = s_w + ridge * (s_w.trace() / Z + 1e-8) * torch.eye(Z, device=z.device)
    shifts = []
    for half in (0, 1):
        wh = w[half::2]  # (B/2, K, N)
        sums = torch.einsum("ikn,iz->knz", wh, z[half::2])  # (K, N, Z)
        counts = wh.sum(dim=0)  # (K, N)
        means = sums / counts.clamp_min(1e-8)[..., None]
        mean_k = sums.sum(dim=1) / counts.sum(dim=1).clamp_min(1e-8)[:, None]  # (K, Z)
        # A cluster or batch missing from a half has no estimate there: 0, weighs 0.
        seen = (counts > 1e-6).float()[..., None]
        shifts.append(((means - mean_k[:, None, :]) * seen).reshape(-1, Z))  # (K*N, Z)
    solved = torch.linalg.solve(s_w, shifts[1].T).T
    counts = w.sum(dim=0)
    weight = (counts / counts.sum().clamp_min(1e-8)).reshape(-1, 1)  # (K*N, 1)
    return (weight * shifts[0] * solved).sum()


def level_batch_share(z: Tensor, batch: Tensor, levels: Tensor, n_batches: int) -> Tensor:
    """Share of the latent's variance that the batch explains within protected levels.

    sum_i ||mu_(l_i, b_i) - mu_(l_i)||^2 / sum_i ||z_i - mu||^2, the first sum over the
    samples of the levels that two or more batches hold in the minibatch, the second over
    all samples: 0 when every batch's mean within each level is that level's mean, as
    ComBat's ``mod`` asks of each gene.

    Not whitened, unlike :func:`batch_mean_distance`: a protected design often has a
    sample or two per level and batch, too few for a within-batch covariance (whitening
    with one estimated from tens of samples in the latent's dimensions collapsed the
    latent; issue 18). Divided by the total spread, it is scale-free, so
    shrinking the latent does not lower it; the total rather than the spread within
    levels, because the encoder can raise the latter by blurring the levels into one
    another, and the former most cheaply by moving the levels apart.
    """
    z = z.float()
    m = level_means(z, batch, levels, n_batches)
    kept = (m.batches_held >= 2).float()[levels]  # (B,)
    between = (kept * (m.cell - m.level).pow(2).sum(-1)).sum()
    total = (z - z.mean(dim=0)).pow(2).sum()
    return between / total.clamp_min(1e-8)


def soft_level_batch_share(z: Tensor, batch: Tensor, weights: Tensor, n_batches: int) -> Tensor:
    """:func:`level_batch_share` on soft levels: ``weights`` (B, L), each sample's share in
    each level (rows summing to 1).

    sum_(l,b) m_lb ||mu_lb - mu_l||^2 / sum_i ||z_i - mu||^2, with m_lb the mass of batch b
    in level l, mu_lb and mu_l the means weighed by it, over the levels where two or more
    batches hold a mass of half a sample: one-hot weights give :func:`level_batch_share`.
    A sample near the border of two clusters counts in both, so noise that decides which
    side a sample of a continuum falls on no longer decides which cluster's plates it is
    aligned with (CellBench's nine-cell plates, docs/notes/2026-12-07.md).
    """
    z, weights = z.float(), weights.float()
    n_levels = weights.shape[1]
    onehot = F.one_hot(batch, n_batches).float()  # (B, N)
    cell = (weights[:, :, None] * onehot[:, None, :]).flatten(1)  # (B, L*N)
    mass = cell.sum(dim=0)  # (L*N,)
    means_c = (cell.T @ z) / mass.clamp_min(1e-6)[:, None]  # (L*N, Z)
    means_l = (weights.T @ z) / weights.sum(dim=0).clamp_min(1e-6)[:, None]  # (L, Z)
    mass = mass.reshape(n_levels, n_batches)  # (L, N)
    held = ((mass >= 0.5).sum(dim=1) >= 2).float()  # (L,)
    d2 = (means_c.reshape(n_levels, n_batches, -1) - means_l[:, None]).pow(2).sum(-1)  # (L, N)
    between = (held[:, None] * mass * d2).sum()
    total = (z - z.mean(dim=0)).pow(2).sum()
    return between / total.clamp_min(1e-8)


class LevelMeans(NamedTuple):
    """What :func:`level_means` returns."""

    cell: Tensor  # (B, Z) the mean of each sample's (level, batch) cell
    level: Tensor  # (B, Z) the mean of each sample's level
    batches_held: Tensor  # (M,) batches with a sample in each level
    level_size: Tensor  # (M,) samples in each level


def level_means(z: Tensor, batch: Tensor, levels: Tensor, n_batches: int) -> LevelMeans:
    """Each sample's (level, batch) and level means of ``z`` (B, Z, float), and how many
    batches and samples each level holds in the minibatch."""
    n_levels = int(levels.max()) + 1
    cell = levels * n_batches + batch  # (B,) the (level, batch) of each sample
    onehot_c = F.one_hot(cell, n_levels * n_batches).float()  # (B, M*N)
    onehot_l = F.one_hot(levels, n_levels).float()  # (B, M)
    counts_c = onehot_c.sum(dim=0)  # (M*N,)
    counts_l = onehot_l.sum(dim=0)  # (M,)
    means_c = (onehot_c.T @ z) / counts_c.clamp_min(1.0)[:, None]  # (M*N, Z)
    means_l = (onehot_l.T @ z) / counts_l.clamp_min(1.0)[:, None]  # (M, Z)
    batches_held = (counts_c.reshape(n_levels, n_batches) > 0).sum(dim=1)  # (M,)
    return LevelMeans(means_c[cell], means_l[levels], batches_held, counts_l)


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
