"""Per-sample adversary targets: shared biology found label-free, protected covariates."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from locusformer.errors import InputError
from locusformer.train.alignment import (
    covariate_levels,
    level_batches,
    shared_batches,
    target_prior,
)


def three_types(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two batches; types 0 and 1 in both, type 2 in batch 0 only; batch 1 shifted."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 4, size=(3, 30))
    shift = rng.normal(0, 3, size=30)
    X, batch, kind = [], [], []
    for b, types in ((0, (0, 1, 2)), (1, (0, 1))):
        for t in types:
            X.append(centres[t] + b * shift + rng.normal(0, 1, size=(60, 30)))
            batch += [b] * 60
            kind += [t] * 60
    return np.concatenate(X).astype(np.float32), np.array(batch), np.array(kind)


def test_a_type_one_batch_alone_holds_is_not_shared() -> None:
    X, batch, kind = three_types()
    holds = shared_batches(X, batch, 2, k=10)
    assert holds[np.arange(len(batch)), batch].all()  # a sample's own batch always
    unique = (kind == 2) & (batch == 0)
    assert holds[unique, 1].mean() < 0.05
    assert holds[(kind < 2) & (batch == 0), 1].mean() > 0.8
    assert holds[batch == 1, 0].mean() > 0.8


def test_a_single_batch_holds_only_itself() -> None:
    X, _, _ = three_types()
    holds = shared_batches(X, np.zeros(len(X), dtype=int), 1)
    assert holds.shape == (len(X), 1) and holds.all()


def test_subsampled_search_gives_the_answer_of_the_full_search(monkeypatch) -> None:
    import locusformer.train.alignment as alignment

    X, batch, kind = three_types()
    monkeypatch.setattr(alignment, "MNN_MAX_PER_BATCH", 100)
    holds = shared_batches(X, batch, 2, k=10)
    assert holds[(kind == 2) & (batch == 0), 1].mean() < 0.05
    assert holds[(kind < 2) & (batch == 0), 1].mean() > 0.8


def test_target_prior_keeps_the_batch_frequencies_on_the_batches_that_hold_a_sample() -> None:
    codes = np.array([0, 0, 0, 1])
    holds = np.array([[True, True], [True, False], [True, True], [True, True]])
    prior = target_prior(holds, codes)
    np.testing.assert_allclose(prior, [[0.75, 0.25], [1, 0], [0.75, 0.25], [0.75, 0.25]])
    assert prior.dtype == np.float32


def test_protected_levels_align_batches_within_each_level_only() -> None:
    codes = np.array([0, 0, 1, 1, 1, 0])
    levels = np.array([0, 0, 0, 1, 1, 1])  # level 1: one sample of batch 0, two of batch 1
    holds = level_batches(codes, levels, 2)
    prior = target_prior(holds, codes, levels)
    np.testing.assert_allclose(prior[0], [2 / 3, 1 / 3])
    np.testing.assert_allclose(prior[3], [1 / 3, 2 / 3])
    only = level_batches(np.array([0, 0, 1]), np.array([0, 1, 0]), 2)
    np.testing.assert_array_equal(only[1], [True, False])  # level 1 is in batch 0 alone


def test_covariate_levels_categorical_numeric_and_combined() -> None:
    sheet = pd.DataFrame(
        {"line": ["a", "b", "a", "b", "a", "b"], "age": ["1", "2", "3", "4", "50", "60"]},
        index=[f"s{i}" for i in range(6)],
    )
    assert covariate_levels(sheet, ["line"]).tolist() == [0, 1, 0, 1, 0, 1]
    many = pd.DataFrame({"age": [str(v) for v in range(20)]})
    bins = covariate_levels(many, ["age"])
    assert sorted(set(bins.tolist())) == [0, 1, 2, 3, 4]  # quantile bins, in order
    assert (np.diff(bins) >= 0).all()
    both = covariate_levels(sheet, ["line", "age"])
    assert len(set(both.tolist())) == 6


def test_covariate_levels_refuse_a_missing_column_or_an_empty_value() -> None:
    sheet = pd.DataFrame({"line": ["a", ""]}, index=["s0", "s1"])
    with pytest.raises(InputError, match="protected column 'nope' not found"):
        covariate_levels(sheet, ["nope"])
    with pytest.raises(InputError, match="empty 'line' for sample 's1'"):
        covariate_levels(sheet, ["line"])


def test_training_with_targets_runs_and_records_them_in_the_fingerprint() -> None:
    from locusformer.model.config import ModelConfig, TrainConfig
    from locusformer.simulate.datasets import simulate
    from locusformer.train.checkpoint import fingerprint
    from locusformer.train.loop import train_corrector

    sim = simulate(n_samples=60, n_loci=40, n_batches=2, seed=1)
    labels = [f"b{b}" for b in sim.batch]
    small = dict(patch_size=4, d_model=16, n_heads=2, n_layers=1, latent_dim=4)
    tc = dict(max_epochs=2, batch_size=16, alignment="shared", alignment_neighbors=5)
    torch.set_num_threads(1)
    _, history = train_corrector(
        sim.X, labels, sim.loci, small, tc, seed=0, device="cpu", progress=False,
        covariates=np.arange(60) % 2,
    )  # fmt: skip
    assert np.isfinite(history["train_confusion"]).all()
    args = (sim.X, labels, sim.loci, ModelConfig(), TrainConfig(), 0)
    assert fingerprint(*args) != fingerprint(*args, np.arange(60) % 2)


def test_confusion_against_a_per_sample_target_ignores_batches_that_lack_the_biology() -> None:
    from locusformer.model.losses import confusion_loss

    logits = torch.tensor([[2.0, -1.0, 0.5], [0.0, 1.0, 3.0]], requires_grad=True)
    prior = torch.tensor([0.5, 0.3, 0.2])
    # The same target for every sample gives the global loss.
    torch.testing.assert_close(
        confusion_loss(logits, prior.expand(2, 3)), confusion_loss(logits, prior)
    )
    # A sample its own batch alone holds adds nothing and gets no gradient.
    own = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.5, 0.5]])
    loss = confusion_loss(logits, own)
    loss.backward()
    assert torch.count_nonzero(logits.grad[0]) == 0
    assert torch.count_nonzero(logits.grad[1, 1:]) == 2
    assert logits.grad[1, 0] == 0  # batch 0 lacks sample 1's biology: not pushed either way
    # Among the holding batches it is least when the discriminator matches the target.
    even = confusion_loss(torch.tensor([[9.0, 0.0, 0.0]]), torch.tensor([[0.0, 0.5, 0.5]]))
    skew = confusion_loss(torch.tensor([[0.0, 2.0, 0.0]]), torch.tensor([[0.0, 0.5, 0.5]]))
    assert even < skew


def test_level_batch_share_is_the_batch_share_of_variance_within_protected_levels() -> None:
    from locusformer.model.losses import level_batch_share

    g = torch.Generator().manual_seed(0)
    batch = torch.arange(48) % 2
    levels = (torch.arange(48) // 2) % 4  # every level held by both batches
    centres = 4.0 * torch.randn(4, 6, generator=g)
    z = centres[levels] + torch.randn(48, 6, generator=g)
    base = float(level_batch_share(z, batch, levels, 2))
    # Equal batch means within every level: exactly 0.
    zero = z.clone()
    for level in range(4):
        for b in range(2):
            rows = (levels == level) & (batch == b)
            zero[rows] += z[levels == level].mean(0) - z[rows].mean(0)
    assert float(level_batch_share(zero, batch, levels, 2)) < 1e-6 < base
    # A batch shift within the levels raises it; the scale of the latent does not.
    shifted = z + 3.0 * batch[:, None].float()
    assert float(level_batch_share(shifted, batch, levels, 2)) > 5 * base
    torch.testing.assert_close(
        level_batch_share(10.0 * shifted, batch, levels, 2),
        level_batch_share(shifted, batch, levels, 2),
    )
    # Moving the levels apart lowers it (the cheap way down is more biology, not less).
    apart = z + 3.0 * centres[levels]
    assert float(level_batch_share(apart, batch, levels, 2)) < base
    # A level one batch alone holds is not compared: its batch mean is its level mean.
    alone = levels.clone()
    alone[batch == 1] = 4  # level 4: batch 1 only; levels 0-3: batch 0 only
    assert float(level_batch_share(shifted, batch, alone, 2)) == 0.0


def test_protected_training_lowers_the_batch_share_within_levels() -> None:
    """The level term (on by default when a covariate is protected) does what it says:
    the trained latent's batch share within the levels is below the same run without it."""
    from locusformer.model.losses import level_batch_share
    from locusformer.simulate.datasets import simulate
    from locusformer.train.loop import train_corrector

    sim = simulate(n_samples=96, n_loci=40, n_batches=2, n_groups=3, seed=4)
    labels = [f"b{b}" for b in sim.batch]
    small = dict(patch_size=4, d_model=16, n_heads=2, n_layers=1, latent_dim=4)
    torch.set_num_threads(1)
    shares = {}
    for weight in (0.0, 1.0):
        tc = dict(max_epochs=6, batch_size=96, adversary_rampup_epochs=2, level_mean_weight=weight)
        model, history = train_corrector(
            sim.X, labels, sim.loci, small, tc, seed=0, device="cpu", progress=False,
            covariates=sim.group,
        )  # fmt: skip
        with torch.no_grad():
            z = model.module.encode(model.module.standardize(torch.from_numpy(sim.X)))[0]
        assert (history["train_level_mean"] > 0).all()  # recorded whatever its weight
        shares[weight] = float(
            level_batch_share(z, torch.from_numpy(sim.batch), torch.from_numpy(sim.group), 2)
        )
    assert shares[1.0] < 0.7 * shares[0.0], shares
