"""A run whose input clusters folded the latent is trained again without them
(``fold_check``; locusformer.train.fold)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from conftest import same_state

import locusformer.train.loop as loop
from locusformer.train.fold import FOLD_BELOW, capture, structured_axes
from locusformer.train.loop import train_corrector

MODEL = dict(
    patch_size=4, d_model=16, n_heads=2, n_layers=1, latent_dim=8,
    decoder_hidden=32, discriminator_hidden=16,
)  # fmt: skip
TRAIN = dict(
    max_epochs=2,
    batch_size=32,
    adversary_rampup_epochs=1,
    refit_steps=0,
    refit_factor=1,
    fold_check=True,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _groups(n: int = 400, genes: int = 60, k: int = 5, seed: int = 0) -> np.ndarray:
    """``k`` groups, each its own programme on every gene, and unit noise."""
    rng = np.random.default_rng(seed)
    programmes = rng.normal(0, 2, (k, genes))
    return programmes[rng.integers(0, k, n)] + rng.normal(0, 1, (n, genes))


def test_the_structured_axes_are_the_groups_not_the_noise() -> None:
    # k groups span k - 1 axes about their mean; noise now and then tops the shuffles
    assert structured_axes(_groups(k=5), seed=0) == 4
    noise = [structured_axes(np.random.default_rng(s).normal(size=(400, 60)), 0) for s in range(5)]
    assert max(noise) <= 1


def test_a_matrix_keeps_its_structure_and_a_fold_onto_one_axis_loses_most_of_it() -> None:
    quick = _groups(k=5)
    assert capture(quick, quick, seed=0) == pytest.approx(1.0)
    # the same samples, the groups folded onto the main axis alone (rank one)
    centred = quick - quick.mean(axis=0)
    u, s, vt = np.linalg.svd(centred, full_matrices=False)
    folded = s[0] * np.outer(u[:, 0], vt[0])
    assert capture(folded, quick, seed=0) < FOLD_BELOW


def _train(data, **train):
    X, labels, loci = data
    return train_corrector(
        X, labels, loci, MODEL, dict(TRAIN, **train), seed=0, device="cpu", progress=False
    )


def test_a_folded_run_is_the_run_without_the_input_clusters(
    clustered_data, monkeypatch, caplog
) -> None:
    monkeypatch.setattr(loop, "FOLD_BELOW", 1.01)  # every run reads as folded
    with caplog.at_level(logging.INFO, logger="locusformer.train.loop"):
        checked, _ = _train(clustered_data)  # TRAIN turns the check on (off by default)
    assert "training again without the input clusters" in caplog.text
    assert same_state(checked, _train(clustered_data, input_clusters=0)[0])
    assert not same_state(checked, _train(clustered_data, fold_check=False)[0])


def test_a_kept_run_is_the_run_without_the_check(clustered_data, monkeypatch) -> None:
    unchecked, _ = _train(clustered_data, fold_check=False)
    monkeypatch.setattr(loop, "FOLD_BELOW", -1.0)  # no run reads as folded
    assert same_state(_train(clustered_data)[0], unchecked)


def test_the_check_does_not_run_when_off(clustered_data, monkeypatch) -> None:
    def never(*args, **kwargs):
        raise AssertionError("the check ran while off")

    monkeypatch.setattr(loop, "fold_capture", never)
    _train(clustered_data, fold_check=False)


def test_a_refit_run_that_folded_is_trained_again_without_the_input_clusters(
    clustered_data, monkeypatch, caplog
) -> None:
    monkeypatch.setattr(loop, "REFIT_BELOW", np.inf)  # the short run is trained again
    monkeypatch.setattr(loop, "FOLD_BELOW", 1.01)  # and every run reads as folded
    with caplog.at_level(logging.INFO, logger="locusformer.train.loop"):
        checked, _ = _train(clustered_data, refit_steps=30)
    assert "training again with at least 30 steps" in caplog.text
    assert "training again without the input clusters" in caplog.text
    # the third run: the refit's floor, without the clusters
    expected, _ = _train(clustered_data, refit_steps=30, min_steps=30, input_clusters=0)
    assert same_state(checked, expected)
