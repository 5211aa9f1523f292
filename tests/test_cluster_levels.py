"""Batch means compared within the latent's clusters crossed with the levels (issue 38).

A latent cluster that joins two classes which the batches hold in different shares
compares each batch's mean of the mix, so the term asks the classes to move toward one
another. Crossed with the levels (the input's clusters, the protected covariates), each
class is compared with itself: the composition costs nothing, a shift still does.
"""

from __future__ import annotations

import numpy as np
import torch

from locusformer.model.losses import (
    Clusters,
    cluster_batch_mean_distance,
    cluster_responsibilities,
    cross_levels,
)
from locusformer.train.alignment import CLUSTER_SIGMA, latent_clusters


def test_cross_levels_keeps_each_weight_in_its_level_s_cell() -> None:
    weight = torch.tensor([[0.25, 0.75], [1.0, 0.0]])
    crossed = cross_levels(weight, torch.tensor([2, 0]), 3)  # cell k * 3 + l
    expected = torch.tensor([[0, 0, 0.25, 0, 0, 0.75], [1.0, 0, 0, 0, 0, 0]])
    torch.testing.assert_close(crossed, expected)


def joined_classes(shift: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two classes in one cluster (2 apart on axis 0, spread 0.5), away from
    the origin; batch 0 holds them 80:20, batch 1 20:80 and is moved by ``shift``
    along axis 1."""
    rng = np.random.default_rng(seed)
    z, batch, kind = [], [], []
    for b, share in ((0, 0.8), (1, 0.2)):
        k = (rng.random(300) > share).astype(int)
        x = rng.normal(0, 0.5, size=(300, 4)) + 5.0
        x[:, 0] += 2.0 * k
        x[:, 1] += shift * b
        z.append(x)
        batch.append(np.full(300, b))
        kind.append(k)
    order = rng.permutation(600)  # as a minibatch is: in random order
    return (np.concatenate(z)[order].astype(np.float32), np.concatenate(batch)[order],
            np.concatenate(kind)[order])  # fmt: skip


def _distance(z: np.ndarray, batch: np.ndarray, kind: np.ndarray, crossed: bool) -> float:
    levels = kind if crossed else None
    found = latent_clusters(z, batch, 2, 1, seed=0, levels=levels, n_levels=2 if crossed else 0)
    clusters = Clusters(*(torch.from_numpy(a) for a in found), CLUSTER_SIGMA,
                        levels=2 if crossed else 0)  # fmt: skip
    zt, bt = torch.from_numpy(z), torch.from_numpy(batch)
    resp = cluster_responsibilities(zt, clusters)
    if crossed:
        resp = cross_levels(resp, torch.from_numpy(kind), 2)
    assert found.gate.shape == ((2 if crossed else 1), 2)
    assert found.gate.all()  # both batches hold a fair share of every cell
    return float(cluster_batch_mean_distance(zt, bt, 2, resp, torch.from_numpy(found.gate)))


def test_a_cluster_joining_two_classes_compares_each_with_itself_when_crossed() -> None:
    z, batch, kind = joined_classes(shift=0.0)
    joined = _distance(z, batch, kind, crossed=False)
    crossed = _distance(z, batch, kind, crossed=True)
    assert joined > 0.2  # the composition reads as a shift the encoder would remove ...
    assert abs(crossed) < 0.2 * joined  # ... crossed with the classes it does not
    z, batch, kind = joined_classes(shift=1.0)
    assert _distance(z, batch, kind, crossed=True) > 0.5  # a shift is still seen


def test_a_level_one_batch_alone_holds_closes_its_cell() -> None:
    z, batch, kind = joined_classes(shift=0.0)
    kind = np.where((batch == 0) & (kind == 1), 2, kind)  # batch 0's class 1 is its own
    found = latent_clusters(z, batch, 2, 1, seed=0, levels=kind, n_levels=3)
    np.testing.assert_array_equal(found.gate, [[True, True], [False, True], [True, False]])


def _train(tc: dict, monkeypatch) -> tuple[object, list]:
    """The model trained with ``tc`` on four groups in two batches, and the gates the
    cluster term was given."""
    from conftest import spy_gates

    import locusformer.train.loop as train
    from locusformer.simulate.datasets import simulate

    gates = spy_gates(monkeypatch)
    sim = simulate(n_samples=240, n_loci=40, n_batches=2, n_groups=4, seed=2)
    small = dict(patch_size=4, d_model=16, n_heads=2, n_layers=1, latent_dim=4)
    tc = dict(max_epochs=4, batch_size=32, adversary_rampup_epochs=1, refit_steps=0, refit_factor=1,
              fold_check=False, batch_mean_clusters=2, **tc)  # fmt: skip
    torch.set_num_threads(1)
    labels = [f"b{b}" for b in sim.batch]
    model, _ = train.train_corrector(
        sim.X, labels, sim.loci, small, tc, seed=0, device="cpu", progress=False
    )
    return model, gates


def test_training_crosses_the_clusters_with_the_input_s(monkeypatch) -> None:
    from conftest import same_state

    crossed, gates = _train({"input_clusters": 3, "batch_mean_levels": True}, monkeypatch)
    assert gates and all(g.shape == (2 * 3, 2) for g in gates)
    plain, gates = _train({"input_clusters": 3, "batch_mean_levels": False}, monkeypatch)
    assert gates and all(g.shape == (2, 2) for g in gates)
    assert not same_state(crossed, plain)


def test_without_levels_crossing_changes_nothing(monkeypatch) -> None:
    from conftest import same_state

    crossed, gates = _train({"input_clusters": 0, "batch_mean_levels": True}, monkeypatch)
    assert gates and all(g.shape == (2, 2) for g in gates)
    plain, _ = _train({"input_clusters": 0, "batch_mean_levels": False}, monkeypatch)
    assert same_state(crossed, plain)
