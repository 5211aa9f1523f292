"""A run that found nothing shared between its batches is trained again without the
adversary (``shared_check``; locusformer.train.loop._unshared_config)."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest
from conftest import same_state

from locusformer.train.alignment import never_compared
from locusformer.train.loop import train_corrector

MODEL = dict(
    patch_size=4, d_model=16, n_heads=2, n_layers=1, latent_dim=8,
    decoder_hidden=32, discriminator_hidden=16,
)  # fmt: skip
# No input clusters: the latent's clusters alone say which batches share biology.
TRAIN = dict(max_epochs=3, batch_size=32, adversary_rampup_epochs=1, refit_steps=0, refit_factor=1,
             input_clusters=0, batch_mean_clusters=2)  # fmt: skip
N, GENES = 160, 40

pytestmark = pytest.mark.usefixtures("one_thread")


def _data(shared: bool, seed: int = 0):
    """Two batches of two groups. ``shared``: both batches hold both groups, a small
    shift apart; otherwise each batch is one group (total confounding)."""
    rng = np.random.default_rng(seed)
    programmes = rng.normal(0, 3, (2, GENES))
    batch = np.repeat([0, 1], N // 2)
    group = rng.integers(0, 2, N) if shared else batch
    shift = rng.normal(0, 0.3, (2, GENES))
    X = programmes[group] + shift[batch] + rng.normal(0, 1, (N, GENES))
    loci = pd.DataFrame(
        {"gene_id": [f"g{i}" for i in range(GENES)], "chrom": "1", "start": np.arange(GENES)}
    )
    return X.astype(np.float32), [f"b{b}" for b in batch], loci


def _train(data, covariates=None, **train):
    X, labels, loci = data
    return train_corrector(
        X, labels, loci, MODEL, dict(TRAIN, **train), seed=0, device="cpu",
        progress=False, covariates=covariates,
    )  # fmt: skip


def test_batches_sharing_nothing_train_without_the_adversary(caplog) -> None:
    """Each batch one group: the input holds no structure within batches, so the run is
    trained first without the adversary, and its latent clusters never hold both."""
    data = _data(shared=False)
    with caplog.at_level(logging.INFO, logger="locusformer.train.loop"):
        checked, history = _train(data)  # the check is on by default
    assert never_compared(history)
    assert "no latent cluster held two batches: kept" in caplog.text
    assert (history["adversary_weight"] == 0).all()
    assert same_state(checked, _train(data, adversary_weight=0.0)[0])
    assert not same_state(checked, _train(data, shared_check=False)[0])


def test_one_population_in_both_batches_trains_with_the_adversary(caplog) -> None:
    """Both batches hold the same single group, a small shift apart: the input holds no
    structure within batches either, but the latent trained without the adversary joins
    the batches in its clusters, so the run is trained with it."""
    rng = np.random.default_rng(0)
    batch = np.repeat([0, 1], N // 2)
    shift = rng.normal(0, 0.3, (2, GENES))
    X = (shift[batch] + rng.normal(0, 1, (N, GENES))).astype(np.float32)
    loci = _data(shared=True)[2]
    data = (X, [f"b{b}" for b in batch], loci)
    with caplog.at_level(logging.INFO, logger="locusformer.train.loop"):
        checked, history = _train(data)
    assert "latent clusters held two batches: training with it" in caplog.text
    assert history["adversary_weight"].max() > 0
    assert same_state(checked, _train(data, shared_check=False)[0])


def test_batches_that_share_their_groups_keep_the_run(caplog) -> None:
    data = _data(shared=True)
    with caplog.at_level(logging.INFO, logger="locusformer.train.loop"):
        checked, history = _train(data)
    assert not never_compared(history)
    assert "without the adversary" not in caplog.text
    assert same_state(checked, _train(data, shared_check=False)[0])


def test_protected_covariates_keep_the_run() -> None:
    # the user has said what the batches hold (here each batch's group, protected): the
    # adversary's target is then the batches within each protected level
    data = _data(shared=False)
    levels = np.repeat([0, 1], N // 2)
    checked, history = _train(data, covariates=levels)
    assert never_compared(history)
    assert same_state(checked, _train(data, covariates=levels, shared_check=False)[0])
