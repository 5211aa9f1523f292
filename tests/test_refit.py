"""A run that stopped before it learned the data is trained again with more steps: a short
one whose decoder has not learned it, a longer one that lost the input's structure."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from conftest import same_state

from locusformer.model.config import ModelConfig, TrainConfig
from locusformer.model.network import LocusFormer
from locusformer.simulate.datasets import simulate
from locusformer.train.loop import train_corrector
from locusformer.train.refit import REFIT_BELOW, decoder_fit, gain, structure_gain
from locusformer.train.schedule import planned_steps

MODEL = dict(
    patch_size=4, d_model=16, n_heads=2, n_layers=1, latent_dim=8,
    decoder_hidden=32, discriminator_hidden=16,
)  # fmt: skip
TRAIN = dict(
    max_epochs=2,
    batch_size=32,
    adversary_rampup_epochs=1,
    input_clusters=0,
    refit_steps=0,
    refit_factor=1,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _structured(n: int = 120, genes: int = 40, seed: int = 0):
    """Two batches (a shift each), three groups (a programme each), and noise."""
    rng = np.random.default_rng(seed)
    codes = np.arange(n) % 2
    groups = rng.integers(0, 3, n)
    programmes = rng.normal(0, 3, (3, genes))
    shifts = rng.normal(0, 2, (2, genes))
    x = programmes[groups] + shifts[codes] + rng.normal(0, 1, (n, genes))
    return x, codes


def _batch_means(x: np.ndarray, codes: np.ndarray) -> np.ndarray:
    return np.stack([x[codes == b].mean(axis=0) for b in codes])


def test_gain_is_one_for_the_data_and_zero_for_each_batchs_mean() -> None:
    x, codes = _structured()
    assert gain(x, x, codes) == pytest.approx(1.0)
    assert gain(x, _batch_means(x, codes), codes) == pytest.approx(0.0, abs=1e-12)


def test_the_structure_above_noise_is_the_programmes_not_the_noise() -> None:
    x, codes = _structured()
    possible = structure_gain(x, codes, seed=0)
    # the groups' programmes hold most of the within-batch variance (3**2 against 1)
    assert 0.7 < possible < 1.0
    noise = np.random.default_rng(1).normal(size=x.shape)
    assert structure_gain(noise, codes, seed=0) < 0.1


def test_an_untrained_decoder_has_not_learned_the_data() -> None:
    from locusformer.model.layout import build_layout

    sim = simulate(n_samples=96, n_loci=40, n_batches=2, seed=5)
    config = ModelConfig.from_dict(MODEL)
    torch.manual_seed(0)
    layout = build_layout(
        sim.loci, config.patch_size, config.position_scale, config.coordinate_unit
    )
    net = LocusFormer(config, layout, n_batches=2)
    net.set_standardization(sim.X.mean(axis=0), sim.X.std(axis=0))
    fit = decoder_fit(net, sim.X, np.asarray(sim.batch), seed=0)
    assert fit is not None and fit < REFIT_BELOW


def test_planned_steps_count_every_epochs_minibatches() -> None:
    assert planned_steps(36, TrainConfig()) == 40  # one minibatch a pass, 40 passes
    assert planned_steps(36, TrainConfig(min_steps=300)) == 300
    assert planned_steps(100_000, TrainConfig()) == 2000  # step-sized epochs


@pytest.fixture(scope="module")
def data():
    sim = simulate(n_samples=64, n_loci=40, n_batches=2, seed=4)
    return sim.X, [f"b{b}" for b in sim.batch], sim.loci


def _train(data, **train):
    X, labels, loci = data
    return train_corrector(
        X, labels, loci, MODEL, dict(TRAIN, **train), seed=0, device="cpu", progress=False
    )


def test_a_short_run_that_did_not_learn_is_the_run_with_the_floor(data, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="locusformer.train.loop"):
        refit, history = _train(data, refit_steps=30)
    assert "training again with at least 30 steps" in caplog.text
    floor, floor_history = _train(data, min_steps=30)
    assert len(history) == len(floor_history) > TRAIN["max_epochs"]
    assert same_state(refit, floor)


def test_no_refit_when_off_or_when_the_run_is_long_enough(data) -> None:
    _, off = _train(data)
    assert len(off) == TRAIN["max_epochs"]
    # 58 training rows, 2 minibatches a pass: 2 epochs are 4 steps, not fewer than 4
    _, enough = _train(data, refit_steps=4)
    assert len(enough) == TRAIN["max_epochs"]


def test_a_schedule_shorter_than_its_ramp_up_is_left_as_asked(data) -> None:
    # the run that the first test trains again, its ramp-up now longer than its epochs
    _, history = _train(data, refit_steps=30, adversary_rampup_epochs=TRAIN["max_epochs"] + 1)
    assert len(history) == TRAIN["max_epochs"]


def test_a_kept_run_is_the_run_without_the_check(data, caplog, monkeypatch) -> None:
    # every reading counts as learned: the check is computed, logged and keeps the run
    monkeypatch.setattr("locusformer.train.loop.REFIT_BELOW", -np.inf)
    monkeypatch.setattr("locusformer.train.loop.FOLD_BELOW", -np.inf)
    with caplog.at_level(logging.INFO, logger="locusformer.train.loop"):
        kept, history = _train(data, refit_steps=30)
    assert "refit check" in caplog.text and ": kept" in caplog.text
    unchecked, unchecked_history = _train(data)
    assert len(history) == len(unchecked_history) == TRAIN["max_epochs"]
    assert same_state(kept, unchecked)


def test_a_short_run_that_lost_the_input_structure_is_trained_again(
    data, caplog, monkeypatch
) -> None:
    # the decoder's reading passes; the corrected matrix's reading alone decides
    monkeypatch.setattr("locusformer.train.loop.REFIT_BELOW", -np.inf)
    monkeypatch.setattr("locusformer.train.loop.FOLD_BELOW", np.inf)
    with caplog.at_level(logging.INFO, logger="locusformer.train.loop"):
        _, history = _train(data, refit_steps=30)
    assert "training again with at least 30 steps" in caplog.text
    assert len(history) > TRAIN["max_epochs"]


def _train_clustered(clustered_data, **train):
    return _train(clustered_data, **{"input_clusters": 8, **train})


def test_a_longer_run_that_lost_the_input_structure_is_trained_longer(
    clustered_data, caplog, monkeypatch
) -> None:
    monkeypatch.setattr("locusformer.train.loop.FOLD_BELOW", np.inf)  # every run reads low
    # 144 training rows, 5 minibatches a pass: 2 epochs are 10 steps, at least refit_steps
    with caplog.at_level(logging.INFO, logger="locusformer.train.loop"):
        longer, history = _train_clustered(clustered_data, refit_factor=3)
    assert (
        "after 10 steps" in caplog.text and "training again with at least 30 steps" in caplog.text
    )
    expected, expected_history = _train_clustered(clustered_data, min_steps=30)
    assert len(history) == len(expected_history) == 6
    assert same_state(longer, expected)


def test_a_longer_run_that_kept_the_input_structure_is_kept(clustered_data, monkeypatch) -> None:
    monkeypatch.setattr("locusformer.train.loop.FOLD_BELOW", -np.inf)
    kept, history = _train_clustered(clustered_data, refit_factor=3)
    assert len(history) == TRAIN["max_epochs"]
    assert same_state(kept, _train_clustered(clustered_data)[0])  # TRAIN: refit_factor 1


def test_the_longer_runs_check_needs_the_input_clusters_and_a_factor(
    clustered_data, monkeypatch
) -> None:
    def never(*args, **kwargs):
        raise AssertionError("the check read a run it does not apply to")

    monkeypatch.setattr("locusformer.train.loop.fold_capture", never)
    _train_clustered(clustered_data, refit_factor=3, input_clusters=0)
    _train_clustered(clustered_data, refit_factor=1)
    # a schedule shorter than its ramp-up is a quick look, left as asked
    _train_clustered(clustered_data, refit_factor=3, adversary_rampup_epochs=3)


def test_a_run_near_the_step_budget_is_not_trained_longer(clustered_data, monkeypatch) -> None:
    monkeypatch.setattr("locusformer.train.loop.FOLD_BELOW", np.inf)  # every run reads low
    # 10 planned steps, three times as many past max_steps = 20: the run is kept
    kept, history = _train_clustered(clustered_data, refit_factor=3, max_steps=20)
    assert len(history) == TRAIN["max_epochs"]
    assert same_state(kept, _train_clustered(clustered_data, max_steps=20)[0])
