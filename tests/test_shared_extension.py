"""The cluster term acts longer when the batches share every cluster (issue 18).

Where every batch holds a fair share of every cluster of the latent when the term
starts, the batches hold the same biology and the run takes ``shared_extension`` of its
planned epochs more; where any cluster is left to some batches, the run is exactly as without
the setting.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from conftest import same_state

from locusformer.simulate.datasets import simulate
from locusformer.train.loop import train_corrector
from locusformer.train.schedule import WarmupCosine

SMALL = dict(patch_size=4, d_model=16, n_heads=2, n_layers=1, latent_dim=4)
# The extension is decided on the latent's clusters; the input's clusters are off so that
# the toy's 4-epoch latent is the one the decision reads, as the tests describe. A tenth
# held out: the decision reads the latent after one epoch, and with every sample training
# this toy's latent gives each batch a fair share of every cluster there, so the run
# would be extended (the option is off by default).
TRAIN = dict(
    max_epochs=4, batch_size=32, batch_mean_clusters=3, adversary_rampup_epochs=2,
    shared_extension=0.75, input_clusters=0, refit_steps=0, val_fraction=0.1,
)  # fmt: skip


def test_stretch_keeps_the_past_and_spreads_the_rest_of_the_decay() -> None:
    plain, stretched = WarmupCosine(100, 10), WarmupCosine(100, 10)
    stretched.stretch(40, 60)
    assert [stretched(s) for s in range(41)] == [plain(s) for s in range(41)]
    # Step 40 + 2k of the stretched schedule is step 40 + k of the plain one.
    for k in range(61):
        assert stretched(40 + 2 * k) == pytest.approx(plain(40 + k), abs=1e-12)
    assert stretched(160) == pytest.approx(0.0, abs=1e-12) and stretched(150) > 0
    values = [stretched(s) for s in range(10, 161)]
    assert all(a >= b for a, b in itertools.pairwise(values))


def test_the_stretch_travels_in_the_scheduler_state() -> None:
    param = torch.nn.Parameter(torch.zeros(1))
    schedule = WarmupCosine(100, 10)
    optimizer = torch.optim.SGD([param], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    schedule.stretch(40, 60)
    saved = scheduler.state_dict()
    fresh = WarmupCosine(100, 10)
    torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD([param], lr=1.0), fresh).load_state_dict(
        saved
    )
    assert fresh(130) == schedule(130) != WarmupCosine(100, 10)(130)


def _data(drop_group_from_batch_1: bool):
    sim = simulate(
        n_samples=160, n_loci=40, n_batches=2, n_groups=2, group_effect=4.0, batch_shift=0.3, seed=1
    )
    keep = np.ones(len(sim.batch), dtype=bool)
    if drop_group_from_batch_1:
        keep = ~((sim.batch == 1) & (sim.group == 1))
    labels = [f"b{b}" for b in sim.batch[keep]]
    return sim.X[keep], labels, sim.loci


def _train(data, **overrides):
    torch.set_num_threads(1)
    X, labels, loci = data
    tc = {**TRAIN, **overrides}
    return train_corrector(X, labels, loci, SMALL, tc, seed=0, device="cpu", progress=False)


def test_batches_that_share_every_cluster_train_longer() -> None:
    data = _data(drop_group_from_batch_1=False)
    _, longer = _train(data)
    _, plain = _train(data, shared_extension=0)
    assert len(plain) == 4 and len(longer) == 7
    # Identical up to the cluster term's first epoch (the 2nd), where the decay is spread.
    np.testing.assert_array_equal(longer["lr"].iloc[:1], plain["lr"].iloc[:1])
    assert longer["lr"].iloc[2] > plain["lr"].iloc[2]
    assert (longer["train_batch_mean"].iloc[1:] > 0).all()
    assert longer["lr"].iloc[-1] < longer["lr"].iloc[-2]


def test_a_cluster_one_batch_lacks_leaves_the_run_as_it_was() -> None:
    data = _data(drop_group_from_batch_1=True)
    model, history = _train(data)
    plain, plain_history = _train(data, shared_extension=0)
    assert len(history) == 4
    assert same_state(model, plain)
    np.testing.assert_array_equal(history["train_total"], plain_history["train_total"])


def test_a_longer_run_resumes_where_it_stopped(tmp_path) -> None:
    data = _data(drop_group_from_batch_1=False)
    whole, history = _train(data)
    assert len(history) == 7
    ckpt = tmp_path / "ckpt.pt"

    class Stop(Exception):
        pass

    def interrupt(epoch: int, _row: dict) -> None:
        if epoch == 3:
            raise Stop

    X, labels, loci = data
    common = dict(seed=0, device="cpu", progress=False, checkpoint_path=ckpt)
    with pytest.raises(Stop):
        train_corrector(X, labels, loci, SMALL, TRAIN, on_epoch_end=interrupt, **common)
    assert torch.load(ckpt, weights_only=True)["extended"]
    resumed, again = train_corrector(X, labels, loci, SMALL, TRAIN, **common)
    assert same_state(whole, resumed)
    assert math.isclose(again["lr"].iloc[-1], history["lr"].iloc[-1])
