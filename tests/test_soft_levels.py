"""Soft membership of the input clusters in the level term (``input_cluster_softness``).

A sample of a continuum near the border of two input clusters falls in one of them by
its noise; with soft membership it counts in both. These tests check that soft levels
reduce to the hard term when the membership is one-hot, that the responsibilities follow
the geometry (a centroid's sample in its own cluster, a sample half-way shared, the same
whatever the scale), that the rows outside the sample and protected covariates get their
share, and that a run with a softness uses the soft term and one without does not.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from locusformer.model.losses import level_batch_share, soft_level_batch_share
from locusformer.train.alignment import input_clusters, joint_weights, level_responsibilities


def _minibatch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(48, 5, generator=gen)
    batch = torch.randint(0, 3, (48,), generator=gen)
    levels = torch.randint(0, 4, (48,), generator=gen)
    return z, batch, levels


def test_one_hot_weights_give_the_hard_term() -> None:
    z, batch, levels = _minibatch()
    hard = level_batch_share(z, batch, levels, 3)
    soft = soft_level_batch_share(z, batch, torch.nn.functional.one_hot(levels, 4).float(), 3)
    assert hard > 0
    torch.testing.assert_close(soft, hard)


def test_a_level_one_batch_holds_is_not_compared() -> None:
    """Levels held by a single batch add nothing, as in the hard term."""
    z, _, levels = _minibatch()
    alone = torch.zeros(48, dtype=torch.int64)  # one batch
    weights = torch.nn.functional.one_hot(levels, 4).float()
    assert soft_level_batch_share(z, alone, weights, 3) == 0


def test_soft_weights_move_the_term_and_carry_its_gradient() -> None:
    z, batch, levels = _minibatch()
    z.requires_grad_(True)
    weights = 0.7 * torch.nn.functional.one_hot(levels, 4).float() + 0.3 / 4
    value = soft_level_batch_share(z, batch, weights, 3)
    value.backward()
    assert value != level_batch_share(z.detach(), batch, levels, 3)
    assert torch.isfinite(z.grad).all() and z.grad.abs().sum() > 0


def _two_blobs():
    """Two mirrored blobs: their centroids are +m and -m, the origin half-way."""
    rng = np.random.default_rng(0)
    a = rng.normal(3, 1, (50, 3))
    return np.vstack([a, -a]).astype(np.float32), np.repeat([0, 1], 50)


def test_responsibilities_follow_the_geometry() -> None:
    scores, levels = _two_blobs()
    m = scores[:50].mean(axis=0)
    probes = np.vstack([m, -m, np.zeros(3), np.zeros(3)]).astype(np.float32)
    weights = level_responsibilities(np.vstack([scores, probes]), np.r_[levels, 0, 1, 0, 1], 0.1)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, rtol=1e-5)
    assert weights[-4, 0] > 0.99 and weights[-3, 1] > 0.99  # each centroid in its own
    np.testing.assert_allclose(weights[-2:], 0.5, atol=1e-4)  # half-way: shared
    assert (weights.argmax(axis=1)[:100] == levels).all()


def test_responsibilities_soften_with_the_softness_not_with_the_scale() -> None:
    scores, levels = _two_blobs()
    sharp, soft = (level_responsibilities(scores, levels, t).max(axis=1).mean() for t in (0.1, 5))
    assert sharp > soft
    np.testing.assert_allclose(
        level_responsibilities(10 * scores, levels, 0.5),
        level_responsibilities(scores, levels, 0.5),
        rtol=1e-4,
        atol=1e-6,
    )


def _shifted_groups(n_per: int, seed: int = 0):
    """Two batches of the same three groups under a per-gene batch shift."""
    rng = np.random.default_rng(seed)
    programmes = rng.normal(0.0, 2.0, (3, 200))
    rows, codes = [], []
    for b in range(2):
        shift = rng.normal(0.0, 3.0, 200)
        for g in range(3):
            rows.append(5.0 + programmes[g] + shift + rng.normal(0, 1, (n_per, 200)))
            codes += [b] * n_per
    return np.vstack(rows).astype(np.float32), np.array(codes)


@pytest.mark.parametrize("max_samples", [10_000, 150])
def test_input_clusters_give_every_row_its_share(max_samples: int) -> None:
    """Soft weights for every row, those outside the sample taken from their nearest
    sampled row; the hard levels are those of a run without a softness."""
    x, codes = _shifted_groups(40)
    hard = input_clusters(x, codes, 3, 0, max_samples=max_samples)
    soft = input_clusters(x, codes, 3, 0, max_samples=max_samples, softness=0.2)
    assert hard is not None and soft is not None and hard.weights is None
    np.testing.assert_array_equal(hard.levels, soft.levels)
    assert soft.weights.shape == (len(codes), 3)
    np.testing.assert_allclose(soft.weights.sum(axis=1), 1.0, rtol=1e-5)
    assert (soft.weights.argmax(axis=1) == soft.levels).mean() > 0.95


def test_protected_covariates_cross_the_soft_weights() -> None:
    weights = np.array([[0.8, 0.2], [0.3, 0.7], [1.0, 0.0]], dtype=np.float32)
    covariates = np.array([1, 0, 1])
    crossed = joint_weights(covariates, weights)
    assert crossed.shape == (3, 4)
    np.testing.assert_allclose(crossed[0], [0, 0, 0.8, 0.2])
    np.testing.assert_allclose(crossed[1], [0.3, 0.7, 0, 0])
    assert joint_weights(covariates, None) is None
    assert joint_weights(None, weights) is weights


def test_a_run_with_a_softness_uses_the_soft_term(monkeypatch) -> None:
    from locusformer.model import network
    from locusformer.simulate.datasets import simulate
    from locusformer.train.loop import train_corrector

    torch.set_num_threads(1)
    calls = []
    real = network.soft_level_batch_share

    def record(*args, **kwargs):
        calls.append(args[2].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(network, "soft_level_batch_share", record)
    sim = simulate(
        n_samples=160, n_loci=40, n_batches=2, n_groups=2, group_effect=4.0,
        batch_shift=2.0, seed=1,
    )  # fmt: skip
    labels = [f"b{b}" for b in sim.batch]
    model = dict(patch_size=4, d_model=16, n_heads=2, n_layers=1, latent_dim=4)
    train = dict(
        max_epochs=2, batch_size=32, adversary_rampup_epochs=1, fold_check=False,
        refit_steps=0, refit_factor=1, input_clusters=2,
    )  # fmt: skip
    _, hard = train_corrector(sim.X, labels, sim.loci, model, train, seed=0, progress=False)
    assert not calls
    soft_train = {**train, "input_cluster_softness": 0.3}
    _, soft = train_corrector(sim.X, labels, sim.loci, model, soft_train, seed=0, progress=False)
    assert calls and all(shape[1] == 2 for shape in calls)
    assert (soft["train_level_mean"] > 0).any()
    assert not hard["train_level_mean"].equals(soft["train_level_mean"])
