"""Batch means compared within soft clusters of the latent (issue 18).

The whole-batch mean distance asks batches holding different mixtures of cell types to
have equal means, and so removes biology. Compared within clusters, a composition
difference costs nothing, a shift of one batch still does, and a cell type that one
batch alone holds is pulled toward nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from locusformer.model.losses import (
    Clusters,
    batch_mean_distance,
    cluster_batch_mean_distance,
    cluster_cover,
    cluster_responsibilities,
)
from locusformer.train.alignment import CLUSTER_SIGMA, latent_clusters


def two_types(share_b: float, shift: float, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Two batches of 200; types at +-3 on axis 0; batch 0 half of each, batch 1
    ``share_b`` of type 0; batch 1 moved by ``shift`` on axis 1."""
    g = torch.Generator().manual_seed(seed)
    n = 200
    kinds = [torch.arange(n) % 2, (torch.arange(n) >= share_b * n).long()]
    z, batch, kind = [], [], []
    for b, k in enumerate(kinds):
        x = torch.randn(n, 4, generator=g) * 0.5
        x[:, 0] += 6.0 * k - 3.0
        x[:, 1] += shift * b
        z.append(x)
        batch.append(torch.full((n,), b))
        kind.append(k)
    order = torch.randperm(2 * n, generator=g)  # as a minibatch is: in random order
    return torch.cat(z)[order], torch.cat(batch)[order], torch.cat(kind)[order]


def by_type(kind: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.one_hot(kind, 2).float()


def test_the_estimate_has_no_noise_floor() -> None:
    # Samples of one distribution in random batches: the batches' means differ by
    # noise only. The plug-in distance is positive on every draw; the two-half
    # estimate averages to nearly zero (what is left comes from whitening with a
    # covariance estimated on the same 64 samples).
    g = torch.Generator().manual_seed(0)
    plug, halves = [], []
    for _ in range(200):
        z = torch.randn(64, 8, generator=g)
        batch = torch.randint(0, 4, (64,), generator=g)
        resp = torch.softmax(torch.randn(64, 3, generator=g), dim=-1)
        gate = torch.ones(3, 4)
        plug.append(float(batch_mean_distance(z, batch, 4)))
        halves.append(float(cluster_batch_mean_distance(z, batch, 4, resp, gate)))
    plug, halves = np.array(plug), np.array(halves)
    assert plug.min() > 0
    assert (halves < 0).mean() > 0.3  # an estimate, not a floor
    assert abs(halves.mean()) < 0.2 * plug.mean()


def test_a_composition_difference_costs_nothing_and_a_shift_still_does() -> None:
    gate = torch.ones(2, 2)
    z, batch, kind = two_types(0.9, 0.0)  # batch 1 is 90 % type 0: unequal means
    skewed_global = batch_mean_distance(z, batch, 2)
    skewed_within = cluster_batch_mean_distance(z, batch, 2, by_type(kind), gate)
    z, batch, kind = two_types(0.5, 1.0)  # the same mixture, batch 1 shifted
    shifted_within = cluster_batch_mean_distance(z, batch, 2, by_type(kind), gate)
    assert skewed_global > 0.2  # the whole-batch term sees the composition ...
    assert skewed_within < 0.02  # ... the clusters do not ...
    assert shifted_within > 0.5  # ... but they see a shift


def test_a_type_one_batch_alone_holds_is_pulled_toward_nothing() -> None:
    z, batch, kind = two_types(1.0, 1.0)  # batch 1 holds type 0 only
    z.requires_grad_(True)
    gate = torch.tensor([[1.0, 1.0], [1.0, 0.0]])  # cluster 1 (type 1): batch 1 absent
    cluster_batch_mean_distance(z, batch, 2, by_type(kind), gate).backward()
    alone = (kind == 1) & (batch == 0)
    assert z.grad[alone].abs().max() == 0
    assert z.grad[kind == 0].abs().max() > 0


def test_cover_changes_nothing_where_every_gate_is_open() -> None:
    g = torch.Generator().manual_seed(0)
    z = torch.randn(64, 8, generator=g)
    batch = torch.randint(0, 3, (64,), generator=g)
    resp = torch.softmax(torch.randn(64, 4, generator=g) * 3, dim=-1)
    gate = torch.ones(4, 3)
    cover = cluster_cover(resp, gate, batch, 3)
    assert torch.equal(cover, torch.ones_like(cover))  # exactly: the run is as without it
    plain = cluster_batch_mean_distance(z, batch, 3, resp, gate)
    assert torch.equal(cluster_batch_mean_distance(z, batch, 3, resp * cover, gate), plain)


def test_the_edge_of_a_type_one_batch_alone_holds_is_not_compared_in_its_neighbour() -> None:
    # Type 1 is batch 0's alone (its cluster gated for batch 0 only) and borders type 0,
    # which both batches hold. Soft responsibilities put 0.3 of every type-1 cell in type
    # 0's cluster, where batch 0's mean is compared with batch 1's: with no batch shift
    # at all the term sees one, which only drawing type 1 into type 0 would remove.
    # Weighed by its cover (1 - 0.7: batch 1 lacks 0.7 of it), type 1 counts little there,
    # and a real shift of batch 1 is still seen.
    z, batch, kind = two_types(1.0, 0.0)  # batch 1 holds type 0 only
    gate = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    resp = by_type(kind)
    resp[kind == 1] = torch.tensor([0.3, 0.7])
    cover = cluster_cover(resp, gate, batch, 2)
    assert torch.equal(cover[kind == 0], torch.ones_like(cover[kind == 0]))  # all hold it
    np.testing.assert_allclose(cover[kind == 1, 0].numpy(), 0.3, rtol=1e-6)
    assert torch.equal(cover[kind == 1, 1], torch.ones_like(cover[kind == 1, 1]))  # own
    leaked = cluster_batch_mean_distance(z, batch, 2, resp, gate)
    covered = cluster_batch_mean_distance(z, batch, 2, resp * cover, gate)
    shifted, _, _ = two_types(1.0, 1.0)
    seen = cluster_batch_mean_distance(shifted, batch, 2, resp * cover, gate)
    assert leaked > 0.1  # a composition artefact the encoder would remove
    assert covered < 0.3 * leaked
    assert seen > 0.5


@pytest.fixture(scope="module")
def three_groups() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Latents of three groups in two batches, group 2 in batch 0 only, batch 1 moved by
    less than a group's spread (what the adversary leaves once it has ramped up), all of
    it away from the origin."""
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 1, size=(3, 8)) * 3
    shift = rng.normal(0, 1, size=8) * 0.15
    z, batch, group = [], [], []
    for b, groups in ((0, (0, 1, 2)), (1, (0, 1))):
        for k in groups:
            z.append(centres[k] + 5 + b * shift + rng.normal(0, 0.4, size=(80, 8)))
            batch += [b] * 80
            group += [k] * 80
    return np.concatenate(z).astype(np.float32), np.array(batch), np.array(group)


def test_clusters_follow_the_groups_and_compare_the_batches_that_hold_them(three_groups):
    z, batch, group = three_groups
    found = latent_clusters(z, batch, 2, n_clusters=3, seed=0)
    gate = found.gate
    assert found.centroids.shape == (3, 8) and gate.shape == (3, 2)
    np.testing.assert_allclose(np.linalg.norm(found.centroids, axis=1), 1.0, rtol=1e-5)
    clusters = Clusters(*(torch.from_numpy(a) for a in found), CLUSTER_SIGMA)
    home = cluster_responsibilities(torch.from_numpy(z), clusters).numpy().argmax(axis=1)
    for k in range(3):
        groups = np.unique(group[home == k])
        assert len(groups) == 1, f"cluster {k} mixes groups {groups}"
        if groups[0] < 2:  # both batches hold it: compared
            assert gate[k].all(), f"cluster {k} of group {groups[0]} is one batch's"
        else:  # batch 0 alone holds it: batch 1 is not compared there
            assert gate[k, 0] and not gate[k, 1]


def test_more_clusters_than_groups_still_compare_within_a_group(three_groups):
    z, batch, group = three_groups
    found = latent_clusters(z, batch, 2, n_clusters=6, seed=0)
    clusters = Clusters(*(torch.from_numpy(a) for a in found), CLUSTER_SIGMA)
    resp = cluster_responsibilities(torch.from_numpy(z), clusters).numpy()
    home = resp.argmax(axis=1)
    for k in np.unique(home):
        if found.gate[k].all():  # a cluster that compares the batches holds one group
            assert len(np.unique(group[home == k])) == 1


def _on_a_circle(layout: tuple[tuple[int, int], ...], seed: int = 0):
    """40 latents (3-d, the third axis noise) about each (angle in degrees, batch)."""
    rng = np.random.default_rng(seed)
    z, batch = [], []
    for degrees, b in layout:
        t = np.deg2rad(degrees)
        z.append(np.stack([np.cos(t), np.sin(t), 0.0]) + rng.normal(0, 0.03, size=(40, 3)))
        batch += [b] * 40
    return np.concatenate(z).astype(np.float32), np.array(batch)


def _gates_and_resp(z, batch, n_clusters: int) -> tuple[np.ndarray, np.ndarray]:
    """The gates (K, 2) of :func:`latent_clusters` and the soft responsibilities (n, K)
    the loss gives its clusters."""
    found = latent_clusters(z, batch, 2, n_clusters=n_clusters, seed=0)
    clusters = Clusters(*(torch.from_numpy(a) for a in found), CLUSTER_SIGMA)
    return found.gate, cluster_responsibilities(torch.from_numpy(z), clusters).numpy()


def test_a_batch_beside_a_cell_type_it_lacks_does_not_open_its_gate() -> None:
    """Two cell types both batches hold (0 and 180 degrees), each with a neighbour 25
    degrees away that only batch 0 holds. The soft responsibilities carry many of batch
    1's cells into the neighbours' clusters, but those cells are compared in their own
    cluster already: batch 1 is not compared in the neighbours'."""
    layout = ((0, 0), (0, 1), (25, 0), (25, 0), (180, 0), (180, 1), (205, 0), (205, 0))
    z, batch = _on_a_circle(layout)
    cell_type = np.repeat([0, 0, 1, 1, 2, 2, 3, 3], 40)
    gate, resp = _gates_and_resp(z, batch, 4)
    home = resp.argmax(axis=1)
    for k in range(4):
        (held,) = np.unique(cell_type[home == k])  # one cell type per cluster
        lone = held in (1, 3)
        assert gate[k, 0] and gate[k, 1] != lone, f"cluster of type {held}"
        if lone:  # what soft counts alone would have let in: 5 times the threshold
            assert resp[batch == 1, k].sum() >= 10.0


def test_a_cell_type_the_batch_still_splits_is_compared() -> None:
    """Two cell types, each split by the batch (batch 1 turned 25 degrees): each cluster
    holds one batch, and the other batch's soft share in it opens its gate."""
    layout = ((0, 0), (25, 1), (180, 0), (205, 1))
    z, batch = _on_a_circle(layout)
    gate, resp = _gates_and_resp(z, batch, 4)
    home = resp.argmax(axis=1)
    for k in range(4):
        assert len(np.unique(batch[home == k])) == 1  # the clusters follow the batch
    assert gate.all()


def test_clusters_are_a_function_of_the_seed(three_groups) -> None:
    z, batch, _ = three_groups
    first = latent_clusters(z, batch, 2, n_clusters=4, seed=3)
    again = latent_clusters(z, batch, 2, n_clusters=4, seed=3)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)


def test_training_with_clusters_resumes_where_it_stopped(tmp_path) -> None:
    from locusformer.simulate.datasets import simulate
    from locusformer.train.loop import train_corrector

    sim = simulate(n_samples=80, n_loci=40, n_batches=2, n_groups=2, seed=1)
    labels = [f"b{b}" for b in sim.batch]
    small = dict(patch_size=4, d_model=16, n_heads=2, n_layers=1, latent_dim=4)
    tc = dict(
        max_epochs=4, batch_size=32, batch_mean_scope="clusters", batch_mean_clusters=3,
        adversary_rampup_epochs=1, refit_steps=0, refit_factor=1,
    )  # fmt: skip
    torch.set_num_threads(1)
    args = (sim.X, labels, sim.loci, small)
    whole, history = train_corrector(*args, tc, seed=0, device="cpu", progress=False)
    assert (history["train_batch_mean"].iloc[1:] > 0).all()
    ckpt = tmp_path / "ckpt.pt"

    class Stop(Exception):
        pass

    def interrupt(epoch: int, _row: dict) -> None:
        if epoch == 2:
            raise Stop

    with pytest.raises(Stop):
        train_corrector(
            *args, tc, seed=0, device="cpu", progress=False, checkpoint_path=ckpt,
            on_epoch_end=interrupt,
        )  # fmt: skip
    resumed, _ = train_corrector(
        *args, tc, seed=0, device="cpu", progress=False, checkpoint_path=ckpt
    )
    pairs = zip(
        whole.module.state_dict().items(), resumed.module.state_dict().values(), strict=True
    )
    for (name, a), b in pairs:
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def _trained_with_cover(X, labels, loci, cover: bool, monkeypatch) -> tuple[dict, list]:
    """Weights after 4 epochs with ``batch_mean_cover`` as given, and each epoch's gates,
    on the latent's own clusters (crossed with the input's, a cell that a level leaves empty
    is a closed gate, and the premise below is about the clusters' gates)."""
    from conftest import spy_gates

    import locusformer.train.loop as train

    gates = spy_gates(monkeypatch)
    small = dict(patch_size=4, d_model=16, n_heads=2, n_layers=1, latent_dim=4)
    tc = dict(
        max_epochs=4, batch_size=32, batch_mean_clusters=3, adversary_rampup_epochs=1,
        batch_mean_cover=cover, refit_steps=0, refit_factor=1, batch_mean_levels=False,
    )  # fmt: skip
    torch.set_num_threads(1)
    model, _ = train.train_corrector(
        X, labels, loci, small, tc, seed=0, device="cpu", progress=False
    )
    return model.module.state_dict(), gates


def test_training_with_cover_is_training_without_it_where_every_gate_is_open(monkeypatch):
    from locusformer.simulate.datasets import simulate

    sim = simulate(n_samples=120, n_loci=40, n_batches=2, n_groups=3, batch_shift=0.0,
                   batch_scale=0.0, seed=2)  # fmt: skip
    args = (sim.X, [f"b{b}" for b in sim.batch], sim.loci)
    plain, gates = _trained_with_cover(*args, False, monkeypatch)
    covered, _ = _trained_with_cover(*args, True, monkeypatch)
    assert gates and all(g.all() for g in gates)  # the premise: every gate open
    for name, a in plain.items():
        torch.testing.assert_close(covered[name], a, rtol=0, atol=0, msg=name)


def test_training_with_cover_acts_where_a_group_is_one_batch_s_alone(monkeypatch):
    from locusformer.simulate.datasets import simulate

    sim = simulate(n_samples=160, n_loci=40, n_batches=2, n_groups=3, seed=2)
    keep = ~((sim.group == 2) & (sim.batch == 1))  # group 2: batch 0 alone
    args = (sim.X[keep], [f"b{b}" for b in sim.batch[keep]], sim.loci)
    plain, gates = _trained_with_cover(*args, False, monkeypatch)
    covered, _ = _trained_with_cover(*args, True, monkeypatch)
    assert any(not g.all() for g in gates)  # the premise: some gate closed
    assert any(not torch.equal(covered[name], a) for name, a in plain.items())


def test_enough_for_clusters_asks_three_training_samples_a_cluster_and_batch() -> None:
    from locusformer.train.alignment import CELL_SAMPLES, enough_for_clusters

    assert CELL_SAMPLES == 3
    assert not enough_for_clusters(36, 8, 4)  # a 40-sample study: about one a cell
    assert enough_for_clusters(96, 8, 4)
    assert not enough_for_clusters(95, 8, 4)


def _clusters_found(sim, tc: dict, monkeypatch) -> tuple[object, int]:
    """The model trained with ``tc`` and how many times the latent was clustered."""
    from conftest import spy_gates

    import locusformer.train.loop as train

    calls = spy_gates(monkeypatch)
    small = dict(patch_size=4, d_model=16, n_heads=2, n_layers=1, latent_dim=4)
    torch.set_num_threads(1)
    labels = [f"b{b}" for b in sim.batch]
    model, _ = train.train_corrector(
        sim.X, labels, sim.loci, small, tc, seed=0, device="cpu", progress=False
    )
    return model, len(calls)


def test_a_study_too_small_for_its_clusters_trains_without_the_cluster_term(monkeypatch):
    from conftest import same_state

    from locusformer.simulate.datasets import simulate

    # 40 samples, 36 of them trained on, in 2 batches: 8 clusters would need 48
    sim = simulate(n_samples=40, n_loci=40, n_batches=2, n_groups=2, seed=1)
    tc = dict(max_epochs=6, batch_size=16, adversary_rampup_epochs=1, refit_steps=0, refit_factor=1,
              input_clusters=0)  # fmt: skip
    few, found = _clusters_found(sim, {**tc, "batch_mean_clusters": 3}, monkeypatch)
    assert found > 0  # the premise: at 3 clusters (18 needed) the term acts
    many, found = _clusters_found(sim, {**tc, "batch_mean_clusters": 8}, monkeypatch)
    assert found == 0
    without, _ = _clusters_found(sim, {**tc, "batch_mean_weight": 0.0}, monkeypatch)
    assert same_state(many, without)
    assert not same_state(few, without)
