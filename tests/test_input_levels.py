"""Levels found on the input, corrected quickly and without labels (issue 38, item 2).

``input_levels`` clusters the ComBat-corrected input, each batch re-centred on its mutual
nearest neighbours; training treats the clusters as it treats protected levels. These
tests check what it finds on data whose truth is known: two batches of the same three
groups under a strong per-gene shift (the groups found across the batches), batches of
opposite composition (ComBat's location error undone), every batch one group of its own
(nothing to cluster: None), batches each mostly one class of their own (clusters that
join different classes of different batches: not used), batches that differ in their
dropout alone (no batch axis added by the re-centring), every batch one class of its own
with a depth axis that every batch holds (nothing to cluster), and the sample's answer
carried to the rows left out of it, a batch too small for a uniform draw among them.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from locusformer.pp.combat import combat
from locusformer.train import alignment
from locusformer.train.alignment import (
    input_levels,
    input_structured,
    joint_levels,
    level_agreement,
    mnn_recentred,
    structure_ratio,
)


def _data(n_per: int, groups_per_batch: list[list[int]], shift: float, seed: int = 0):
    """Log-expression-like rows: a group programme plus a strong shift per batch."""
    rng = np.random.default_rng(seed)
    n_genes = 200
    programmes = rng.normal(0.0, 2.0, (4, n_genes))
    rows, codes, groups = [], [], []
    for b, held in enumerate(groups_per_batch):
        batch_shift = rng.normal(0.0, shift, n_genes)
        for g in held:
            rows.append(5.0 + programmes[g] + batch_shift + rng.normal(0, 1, (n_per, n_genes)))
            codes += [b] * n_per
            groups += [g] * n_per
    return np.vstack(rows).astype(np.float32), np.array(codes), np.array(groups)


def test_shared_groups_are_found_across_a_strong_batch_shift() -> None:
    x, codes, groups = _data(60, [[0, 1, 2], [0, 1, 2]], shift=6.0)
    levels = input_levels(x, codes, n_clusters=3, seed=0)
    assert levels is not None
    assert adjusted_rand_score(groups, levels) > 0.95
    # each level holds both batches: the shift did not split them
    for level in np.unique(levels):
        assert set(codes[levels == level]) == {0, 1}


def _skewed(sizes: list[tuple[int, int]], shift: float, seed: int = 0):
    """Two groups held by both batches in opposite proportions, a per-gene batch shift."""
    rng = np.random.default_rng(seed)
    programmes = rng.normal(0.0, 2.0, (2, 200))
    rows, codes, groups = [], [], []
    for b, held in enumerate(sizes):
        batch_shift = rng.normal(0.0, shift, 200)
        for g, n in enumerate(held):
            rows.append(5.0 + programmes[g] + batch_shift + rng.normal(0, 1, (n, 200)))
            codes += [b] * n
            groups += [g] * n
    return np.vstack(rows).astype(np.float32), np.array(codes), np.array(groups)


def _group_gap(x: np.ndarray, codes: np.ndarray, groups: np.ndarray) -> float:
    """Mean distance between the two batches' means of the same group."""
    means = [
        [x[(codes == b) & (groups == g)].mean(axis=0) for b in (0, 1)] for g in np.unique(groups)
    ]
    return float(np.mean([np.linalg.norm(a - b) for a, b in means]))


def test_recentring_undoes_the_location_combat_takes_from_composition() -> None:
    """ComBat's batch location is the batch mean: with 80/20 against 20/80 it moves each
    group of one batch away from the same group of the other; the mutual pairs bring them
    back together."""
    x, codes, groups = _skewed([(80, 20), (20, 80)], shift=1.0)
    quick = combat(x.copy(), codes)
    recentred = mnn_recentred(quick, codes, seed=0)
    assert _group_gap(recentred, codes, groups) < 0.25 * _group_gap(quick, codes, groups)


def test_recentring_leaves_a_right_correction_nearly_alone() -> None:
    """Same composition in every batch: ComBat's location is right and the median over the
    mutual pairs is about zero (noise sd 1)."""
    x, codes, _ = _data(60, [[0, 1, 2], [0, 1, 2]], shift=6.0)
    quick = combat(x.copy(), codes)
    assert np.abs(mnn_recentred(quick, codes, seed=0) - quick).mean() < 0.05


def _shallow(dropouts: list[float], n_per: int = 150, seed: int = 0):
    """log1p of Poisson counts of two groups held alike by every batch, each batch losing
    its own share of the counts to dropout: batches that differ in their zeros only."""
    rng = np.random.default_rng(seed)
    means = np.exp(rng.normal(-0.5, 1.0, (2, 300)))
    rows, codes = [], []
    for b, dropout in enumerate(dropouts):
        for g in (0, 1):
            counts = rng.poisson(means[g], (n_per, 300)).astype(np.float32)
            counts[rng.random(counts.shape) < dropout] = 0.0
            rows.append(np.log1p(counts))
            codes += [b] * n_per
    return np.vstack(rows), np.array(codes)


def test_recentring_adds_no_batch_axis_where_batches_differ_in_dropout() -> None:
    """ComBat equalizes each locus's batch mean and variance, not the share of zeros; a
    median over the mutual pairs then moves the sparser batch's loci all one way (a batch
    axis), the mean over them leaves ComBat's equal means alone."""
    x, codes = _shallow([0.1, 0.5])
    quick = combat(x.copy(), codes)
    recentred = mnn_recentred(quick, codes, seed=0)
    gap = recentred[codes == 0].mean(axis=0) - recentred[codes == 1].mean(axis=0)
    # the mean leaves 0.015 a locus; the median over the same pairs left 0.13
    assert np.abs(gap).mean() < 0.04


def _confounded_with_depth(seed: int = 0):
    """Three batches, each one class of its own under a per-gene batch shift, and a
    per-sample depth that lifts every locus by its own amount (the mean expression's
    axis), as a library's size does in every batch."""
    rng = np.random.default_rng(seed)
    programmes = rng.normal(0.0, 2.0, (3, 200))
    loading = rng.uniform(0.5, 1.5, 200)
    rows = []
    for b in range(3):
        depth = rng.normal(0.0, 1.0, (80, 1))
        shift = rng.normal(0.0, 1.0, 200)
        rows.append(5.0 + programmes[b] + shift + depth * loading + rng.normal(0, 1, (80, 200)))
    return np.vstack(rows).astype(np.float32), np.repeat(np.arange(3), 80)


def test_total_confounding_with_a_depth_axis_leaves_nothing_to_cluster() -> None:
    """ComBat removes each batch's class with its batch and keeps the depth axis every
    batch holds; that axis alone is no structure to cluster on."""
    x, codes = _confounded_with_depth()
    assert structure_ratio(combat(x.copy(), codes), seed=0) > 2.0  # the depth axis
    assert input_levels(x, codes, n_clusters=3, seed=0) is None


def test_one_class_per_batch_leaves_nothing_to_cluster() -> None:
    x, codes, _ = _data(80, [[0], [1], [2]], shift=0.0)
    assert input_levels(x, codes, n_clusters=3, seed=0) is None


def test_input_structured_reads_the_floor_the_clusters_are_found_above() -> None:
    """The shared check's reading: batches of one class each hold nothing within them
    once corrected (the depth axis aside), batches that share their classes do, and one
    batch, or a batch of one sample, cannot be read."""
    one_class_each, codes, _ = _data(80, [[0], [1], [2]], shift=0.0)
    assert input_structured(one_class_each, codes, seed=0) is False
    x, codes = _confounded_with_depth()
    assert input_structured(x, codes, seed=0) is False
    shared, codes, _ = _data(60, [[0, 1], [0, 1]], shift=3.0)
    assert input_structured(shared, codes, seed=0) is True
    assert input_structured(shared, np.zeros_like(codes), seed=0) is None
    codes[0] = 2  # a third batch of one sample
    assert input_structured(shared, codes, seed=0) is None


def _own_class_each(seed: int):
    """Four batches of nine samples of a class of their own and one of a shared class,
    under a strong per-gene shift: ComBat centres each batch on its own class, so the
    quick correction lays the four classes over one another."""
    rng = np.random.default_rng(seed)
    programmes = rng.normal(0.0, 2.0, (5, 200))
    rows, codes = [], []
    for b in range(4):
        shift = rng.normal(0.0, 3.0, 200)
        for g, n in ((b, 9), (4, 1)):
            rows.append(5.0 + programmes[g] + shift + rng.normal(0, 1, (n, 200)))
            codes += [b] * n
    return np.vstack(rows).astype(np.float32), np.array(codes)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clusters_joining_different_classes_of_different_batches_are_not_used(
    seed: int, monkeypatch
) -> None:
    x, codes = _own_class_each(seed)
    assert input_levels(x, codes, n_clusters=8, seed=seed) is None
    # the agreement is what turned them off: the input holds structure to cluster
    monkeypatch.setattr(alignment, "LEVEL_AGREEMENT", -np.inf)
    assert input_levels(x, codes, n_clusters=8, seed=seed) is not None
    quick = alignment.quick_scores(x, codes, seed)
    cuts = alignment.agreement_cuts(quick.scores, 8, seed)
    assert alignment.cut_agreement(x, codes, cuts, seed) < 0.5
    # Draw 0's first cut alone reads 0.55: one cut's reading is noise on 40 samples,
    # which the mean over the cuts (0.32) is not.
    if seed == 0:
        assert level_agreement(x, codes, cuts[0], seed) > 0.5


def test_agreement_reads_whether_each_cluster_holds_one_class_in_every_batch() -> None:
    x, codes, groups = _data(30, [[0, 1, 2], [0, 1, 2], [0, 1, 2]], shift=6.0)
    assert level_agreement(x, codes, groups, seed=0) > 0.95
    found = input_levels(x, codes, n_clusters=8, seed=0)
    assert found is not None and level_agreement(x, codes, found, seed=0) > 0.95
    # two batches, the second's classes relabelled in a cycle: each cluster then holds a
    # different class in each batch, and the contrasts disagree
    two = codes < 2
    swapped = np.where(codes[two] == 1, (groups[two] + 1) % 3, groups[two])
    assert level_agreement(x[two], codes[two], swapped, seed=0) < 0.0
    # a batch holding one cluster: no two batches hold two, nothing to read
    single = np.where(codes[two] == 0, groups[two], 0)
    assert level_agreement(x[two], codes[two], single, seed=0) is None


def test_agreement_is_read_only_where_some_pair_of_batches_shares_three_clusters() -> None:
    x, codes, groups = _data(30, [[0, 1, 2], [0, 1, 2], [0, 1, 2]], shift=6.0)
    two = codes < 2
    assert level_agreement(x[two], codes[two], groups[two], seed=0) > 0.95
    # the second batch's class 2 a cluster of its own: the batches share two clusters, a
    # single contrast a side, and nothing is read
    apart = np.where((codes[two] == 1) & (groups[two] == 2), 3, groups[two])
    assert level_agreement(x[two], codes[two], apart, seed=0) is None
    # a third batch sharing two clusters with each, in the wrong order: once a pair shares
    # three the reading is made, and the pairs sharing two count in it
    third = np.where(codes == 2, np.array([1, 0, 4])[groups], groups)
    assert level_agreement(x, codes, third, seed=0) < 0.5


def test_clusters_whose_agreement_cannot_be_read_are_not_used(monkeypatch) -> None:
    x, codes, _ = _data(30, [[0, 1, 2], [0, 1, 2]], shift=6.0)
    assert input_levels(x, codes, n_clusters=8, seed=0) is not None
    monkeypatch.setattr(alignment, "cut_agreement", lambda *args: None)
    assert input_levels(x, codes, n_clusters=8, seed=0) is None


def test_agreement_is_the_mean_over_the_cuts_it_can_read() -> None:
    x, codes, groups = _data(30, [[0, 1, 2], [0, 1, 2], [0, 1, 2]], shift=6.0)
    two = codes < 2
    x, codes, groups = x[two], codes[two], groups[two]
    swapped = np.where(codes == 1, (groups + 1) % 3, groups)
    unreadable = np.where((codes == 1) & (groups == 2), 3, groups)
    same, crossed = (level_agreement(x, codes, c, seed=0) for c in (groups, swapped))
    assert same > 0.95 and crossed < 0.0
    both = alignment.cut_agreement(x, codes, [groups, swapped, unreadable], seed=0)
    assert both == pytest.approx((same + crossed) / 2)
    assert alignment.cut_agreement(x, codes, [unreadable], seed=0) is None


def test_structure_ratio_tells_groups_from_noise() -> None:
    x, _, _ = _data(60, [[0, 1, 2]], shift=0.0)
    noise = np.random.default_rng(1).normal(size=x.shape).astype(np.float32)
    assert structure_ratio(x, seed=0) > 10
    assert structure_ratio(noise, seed=0) == pytest.approx(1.0, abs=0.3)


def test_rows_left_out_of_the_sample_take_their_neighbours_level() -> None:
    x, codes, groups = _data(60, [[0, 1, 2], [0, 1, 2]], shift=6.0)
    levels = input_levels(x, codes, n_clusters=3, seed=0, max_samples=150)
    assert levels is not None and len(levels) == len(codes)
    assert adjusted_rand_score(groups, levels) > 0.95


def test_a_batch_too_small_to_be_drawn_is_sampled_all_the_same() -> None:
    # a uniform draw of 150 rows from 363 misses a batch of 3 rows on most seeds; that
    # batch then had no sampled row to take a level from (a traceback) or one (clusters
    # off), by the seed's chance
    x, codes, groups = _data(60, [[0, 1, 2], [0, 1, 2]], shift=6.0)
    small, small_codes, small_groups = _data(3, [[0]], shift=6.0, seed=1)
    x = np.vstack([x, small])
    codes = np.concatenate([codes, small_codes + 2])
    groups = np.concatenate([groups, small_groups])
    for seed in range(4):
        levels = input_levels(x, codes, n_clusters=3, seed=seed, max_samples=150)
        assert levels is not None and len(levels) == len(codes)
        assert adjusted_rand_score(groups[:-3], levels[:-3]) > 0.95


def test_a_batch_of_one_sample_turns_it_off() -> None:
    x, codes, _ = _data(60, [[0, 1], [0, 1]], shift=1.0)
    codes[0] = 2  # a third batch of one sample
    assert input_levels(x, codes, n_clusters=2, seed=0) is None


def test_joint_levels_cross_the_given_ones() -> None:
    a = np.array([0, 0, 1, 1])
    b = np.array([0, 1, 0, 1])
    assert joint_levels(a, b).tolist() == [0, 1, 2, 3]
    assert joint_levels(None, b).tolist() == [0, 1, 0, 1]
    assert joint_levels(None, None) is None


#: A model small enough to train in a second or two.
SMALL = dict(patch_size=4, d_model=16, n_heads=2, n_layers=1, latent_dim=4)


def _two_groups(n_samples: int):
    """Two batches of two well-separated groups under a strong shift, and their labels."""
    from locusformer.simulate.datasets import simulate

    sim = simulate(
        n_samples=n_samples, n_loci=40, n_batches=2, n_groups=2, group_effect=4.0,
        batch_shift=2.0, seed=1,
    )  # fmt: skip
    return sim, [f"b{b}" for b in sim.batch]


def test_training_removes_the_batch_within_the_input_clusters() -> None:
    """``input_clusters`` reaches the loss: the level term is measured and the run differs
    from one with the clusters off (0)."""
    import torch

    from locusformer.train.loop import train_corrector

    torch.set_num_threads(1)
    sim, labels = _two_groups(160)
    # Without the fold check (tests/test_fold.py): a run of three epochs has not learned
    # the groups yet, reads as folded and would be trained again without the clusters.
    train = dict(
        max_epochs=3, batch_size=32, batch_mean_clusters=2, adversary_rampup_epochs=1,
        fold_check=False, refit_steps=0, refit_factor=1,
    )  # fmt: skip

    def run(**overrides):
        tc = {**train, **overrides}
        return train_corrector(sim.X, labels, sim.loci, SMALL, tc, seed=0, progress=False)

    _, plain = run(input_clusters=0)
    _, clustered = run(input_clusters=2)
    assert (plain["train_level_mean"] == 0).all()
    assert (clustered["train_level_mean"] > 0).any()
    assert not plain["train_total"].equals(clustered["train_total"])


def test_input_clusters_leave_the_adversary_target_to_the_protected_levels(monkeypatch) -> None:
    """The input's clusters feed the level term only: a cluster the quick correction left
    split by batch must not keep the adversary's target to that cluster's batches."""
    import torch

    from locusformer.train import loop

    seen = []
    real = loop.adversary_targets

    def record(*args, **kwargs):
        seen.append(kwargs["levels"])
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "adversary_targets", record)
    torch.set_num_threads(1)
    sim, labels = _two_groups(120)
    # Without the fold check, which a two-epoch run would fire (as above).
    train = dict(
        max_epochs=2, batch_size=32, input_clusters=2, adversary_rampup_epochs=1,
        fold_check=False, refit_steps=0, refit_factor=1,
    )  # fmt: skip
    protected = np.asarray(sim.group, dtype=np.int64)
    loop.train_corrector(sim.X, labels, sim.loci, SMALL, train, seed=0, progress=False)
    loop.train_corrector(
        sim.X, labels, sim.loci, SMALL, train, seed=0, progress=False, covariates=protected
    )
    assert seen[0] is None
    assert np.array_equal(seen[1], protected)


def test_input_clusters_remove_a_known_batch_effect_and_keep_the_groups() -> None:
    """Input clusters on the data ``test_correct`` judges the model's own terms by, at 32
    samples a step. Two batches, so 0.5 is chance; measured on seeds 0-2: 0.57, 0.51, 0.56
    for the corrected matrix and 0.57, 0.50, 0.51 for the latent, groups 1.0. At
    ``test_correct``'s 16 a step the cluster term's cells (latent clusters crossed with
    the input's, ``batch_mean_levels``) hold under one sample a batch in a minibatch, and
    seed 0's latent kept the batch (0.73; 0.53 with the crossing off)."""
    import torch
    from quality_probe import DATA, MODEL, TRAIN, probe

    from locusformer.infer.correct import correct
    from locusformer.simulate.datasets import simulate
    from locusformer.train.loop import train_corrector

    torch.set_num_threads(1)
    sim = simulate(**DATA)
    labels = [f"b{b}" for b in sim.batch]
    train = {**TRAIN, "input_clusters": 8, "batch_size": 32}
    model, history = train_corrector(
        sim.X, labels, sim.loci, MODEL, train, seed=0, device="cpu", progress=False
    )
    assert (history["train_level_mean"] > 0).any()  # the clusters were used
    corrected, latent = correct(model, sim.X, labels, device="cpu")
    assert probe(sim.X, sim.batch) > 0.95
    assert probe(corrected, sim.batch) < 0.7
    assert probe(latent, sim.batch) < 0.65
    assert probe(corrected, sim.group) > 0.9


@pytest.mark.parametrize("n_groups", [2, 3, 4])
def test_cluster_count_follows_the_groups_the_data_hold(n_groups: int) -> None:
    # n groups span n - 1 axes above the shuffled null: as many clusters as groups,
    # whatever the most allowed
    x, codes, groups = _data(60, [list(range(n_groups))] * 2, shift=3.0)
    quick = alignment.quick_matrix(x, codes, seed=0)
    assert alignment.cluster_count(quick, most=8, seed=0) == n_groups
    levels = input_levels(x, codes, n_clusters=8, seed=0, from_structure=True)
    assert levels is not None and len(np.unique(levels)) == n_groups
    assert adjusted_rand_score(groups, levels) > 0.95


def test_cluster_count_stays_within_its_bounds() -> None:
    x, codes, _ = _data(60, [[0, 1, 2, 3]] * 2, shift=3.0)
    quick = alignment.quick_matrix(x, codes, seed=0)
    assert alignment.cluster_count(quick, most=3, seed=0) == 3
    noise = np.random.default_rng(1).normal(size=(120, 200)).astype(np.float32)
    assert alignment.cluster_count(noise, most=8, seed=0) == 2  # no axis: two, the least


@pytest.mark.parametrize(("count", "expected"), [("structure", 2), ("fixed", 8)])
def test_the_run_cuts_as_many_clusters_as_its_count_says(monkeypatch, count, expected) -> None:
    """``input_cluster_count`` reaches the clusters the level term is given: two groups hold
    one structured axis, so "structure" cuts two of the eight allowed, "fixed" eight."""
    import torch

    from locusformer.train import loop

    found = []
    real = loop.input_clusters

    def record(*args, **kwargs):
        found.append(real(*args, **kwargs))
        return found[-1]

    monkeypatch.setattr(loop, "input_clusters", record)
    torch.set_num_threads(1)
    sim, labels = _two_groups(160)
    train = dict(
        max_epochs=1, batch_size=32, adversary_rampup_epochs=1, fold_check=False,
        refit_steps=0, refit_factor=1, input_clusters=8, input_cluster_count=count,
    )  # fmt: skip
    loop.train_corrector(sim.X, labels, sim.loci, SMALL, train, seed=0, progress=False)
    assert len(found) == 1 and len(np.unique(found[0].levels)) == expected


def test_agreement_is_read_on_the_finest_cut_whatever_the_count(monkeypatch) -> None:
    """The contrasts of a few clusters are a few pairs, whose correlation is noise: the
    agreement between batches is read on ``n_clusters`` even where the structure cuts
    fewer, and the clusters the level term gets are the fewer."""
    x, codes, groups = _data(60, [[0, 1, 2], [0, 1, 2]], shift=3.0)
    read = []
    real = alignment.cut_agreement

    def record(x, codes, cuts, seed):
        read.extend(len(np.unique(levels)) for levels in cuts)
        return real(x, codes, cuts, seed)

    monkeypatch.setattr(alignment, "cut_agreement", record)
    levels = input_levels(x, codes, n_clusters=8, seed=0, from_structure=True)
    assert read == [8] * alignment.AGREEMENT_CUTS
    assert levels is not None and len(np.unique(levels)) == 3
    assert adjusted_rand_score(groups, levels) > 0.95
