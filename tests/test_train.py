"""Training: determinism, checkpoint resume, divergence, saving and loading."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import same_state

from locusformer.errors import InputError
from locusformer.infer.correct import correct
from locusformer.model.files import load_model, save_model
from locusformer.simulate.datasets import simulate
from locusformer.train.alignment import never_compared
from locusformer.train.epoch_checks import validate
from locusformer.train.loop import (
    HISTORY_COLUMNS,
    TrainConfig,
    TrainingDivergedError,
    stratified_split,
    train_corrector,
)
from locusformer.train.runtime import resolve_device

MODEL = dict(
    patch_size=4,
    d_model=16,
    n_heads=2,
    n_layers=1,
    latent_dim=8,
    decoder_hidden=32,
    discriminator_hidden=16,
)
# refit and the fold check off: the tests ask for three epochs and check what those do
# (three epochs have not learned the groups yet, and the fold check would read the run as
# folded and train it again without the input clusters)
TRAIN = dict(
    max_epochs=3,
    batch_size=16,
    adversary_rampup_epochs=2,
    refit_steps=0,
    refit_factor=1,
    fold_check=False,
)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, list[str], pd.DataFrame]:
    sim = simulate(n_samples=96, n_loci=60, n_batches=3, seed=3)
    return sim.X, [f"batch{b}" for b in sim.batch], sim.loci


def run(data, tmp: Path | None = None, seed: int = 0, **kwargs):
    X, labels, loci = data
    kwargs.setdefault("train_config", TRAIN)
    return train_corrector(
        X,
        labels,
        loci,
        kwargs.pop("model_config", MODEL),
        seed=seed,
        device="cpu",
        progress=False,
        **kwargs,
    )


def test_same_seed_is_bit_identical_and_another_seed_is_not(data) -> None:
    m1, h1 = run(data, seed=5)
    m2, h2 = run(data, seed=5)
    m3, _ = run(data, seed=6)
    assert same_state(m1, m2)
    pd.testing.assert_frame_equal(h1.drop(columns="seconds"), h2.drop(columns="seconds"))
    assert not same_state(m1, m3)


def test_never_compared_reads_the_clusters_column() -> None:
    def history(*compared: float) -> pd.DataFrame:
        return pd.DataFrame({"clusters_compared": compared})

    assert never_compared(history(np.nan, np.nan, 0.0, 0.0))  # clustered, never shared
    assert not never_compared(history(np.nan, 0.0, 3.0, 0.0))  # acted in one epoch
    assert not never_compared(history(np.nan, np.nan))  # no clustering (scope, ramp-up)
    assert not never_compared(history())


def test_history_log_and_checkpoint(data, tmp_path: Path) -> None:
    _, history = run(data, checkpoint_path=tmp_path / "ckpt.pt", log_path=tmp_path / "log.tsv")
    assert history.columns.tolist() == HISTORY_COLUMNS
    assert history["epoch"].tolist() == [1, 2, 3]
    w = TrainConfig().adversary_weight
    assert history["adversary_weight"].tolist() == pytest.approx([w / 2, w, w])
    logged = pd.read_csv(tmp_path / "log.tsv", sep="\t")
    pd.testing.assert_frame_equal(logged, history, check_dtype=False)
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["epoch"] == 3
    for key in ["model", "optimizer", "scheduler", "rng", "best_state", "bad_epochs", "history"]:
        assert key in ckpt
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]  # atomic writes


class Interrupt(Exception):
    pass


def test_resumed_run_ends_where_an_uninterrupted_run_ends(data, tmp_path: Path) -> None:
    full, full_history = run(data, checkpoint_path=tmp_path / "full.pt")

    def crash_after_first_epoch(epoch: int, row: dict) -> None:
        if epoch == 1:
            raise Interrupt

    ckpt = tmp_path / "resumed.pt"
    with pytest.raises(Interrupt):
        run(data, checkpoint_path=ckpt, on_epoch_end=crash_after_first_epoch)
    assert torch.load(ckpt, weights_only=True)["epoch"] == 1

    epochs_run: list[int] = []
    resumed, history = run(
        data, checkpoint_path=ckpt, on_epoch_end=lambda e, r: epochs_run.append(e)
    )
    assert epochs_run == [2, 3]  # resumed after epoch 1, did not start over
    assert same_state(resumed, full)
    pd.testing.assert_frame_equal(
        history.drop(columns="seconds"), full_history.drop(columns="seconds")
    )

    # A finished run's checkpoint is not trained further.
    again, _ = run(data, checkpoint_path=ckpt, on_epoch_end=lambda e, r: epochs_run.append(e))
    assert epochs_run == [2, 3] and same_state(again, full)


def test_checkpoint_of_another_run_is_ignored_with_a_warning(data, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt.pt"
    run(data, checkpoint_path=ckpt, seed=1)
    fresh, _ = run(data, seed=2)
    with pytest.warns(UserWarning, match="different run"):
        model, history = run(data, checkpoint_path=ckpt, seed=2)
    assert len(history) == 3 and same_state(model, fresh)
    ckpt.write_bytes(b"not a checkpoint")
    with pytest.warns(UserWarning, match="unreadable checkpoint"):
        run(data, checkpoint_path=ckpt, seed=2)


def test_returns_the_best_weights(data) -> None:
    X, labels, _ = data
    tc = dict(
        max_epochs=40,
        batch_size=16,
        adversary_rampup_epochs=0,
        lr=3e-2,
        patience=3,
        val_fraction=0.2,
        refit_steps=0,
        refit_factor=1,
    )
    model, history = run(data, train_config=tc)
    best = int(history["val_recon"].idxmin()) + 1
    assert len(history) == best + 3 < 40  # stopped after `patience` epochs without progress
    # patience 0 (the default): no early stopping, the whole schedule runs.
    _, full = run(data, train_config={**tc, "max_epochs": best + 6, "patience": 0})
    assert len(full) == best + 6
    # The model returned is the epoch with the lowest validation reconstruction.
    batch_names = sorted(set(labels))
    codes = np.array([batch_names.index(b) for b in labels])
    _, val = stratified_split(codes, 0.2, 0)
    Xs = model.module.standardize(torch.from_numpy(X))
    val_recon = validate(model.module, Xs, torch.from_numpy(codes), val, 16, torch.device("cpu"))[
        "val_recon"
    ]
    assert val_recon == pytest.approx(history["val_recon"].min(), rel=1e-5)


def test_without_held_out_samples_the_last_epoch_is_kept(data, tmp_path: Path) -> None:
    """No samples held out (the default): every sample trains, early stopping follows the
    training reconstruction, and the weights returned are the last epoch's, not those of
    the lowest training reconstruction."""
    tc = dict(max_epochs=40, batch_size=16, adversary_rampup_epochs=0, lr=3e-2, patience=3)
    ckpt = tmp_path / "ckpt.pt"
    model, history = run(
        data, train_config=dict(tc, refit_steps=0, refit_factor=1), checkpoint_path=ckpt
    )
    assert history["val_recon"].isna().all()
    best = int(history["train_recon"].idxmin()) + 1
    assert len(history) == best + 3 < 40
    last = torch.load(ckpt, weights_only=True)["model"]  # saved after every epoch
    kept = model.module.state_dict()
    assert all(torch.equal(kept[k], v) for k, v in last.items())


def test_stratified_split_keeps_every_batch() -> None:
    codes = np.array([0] * 50 + [1] * 10 + [2] * 2)
    train, val = stratified_split(codes, 0.1, seed=0)
    assert sorted(np.concatenate([train, val]).tolist()) == list(range(62))
    assert np.bincount(codes[val]).tolist() == [5, 1, 1]
    assert set(codes[train]) == {0, 1, 2}


@pytest.mark.parametrize(
    ("bad", "words"),
    [(np.nan, "non-finite value (NaN or infinite) at row 6"), (1e6, "values go up to 1e+06")],
)
def test_bad_input_is_refused_before_training_not_a_divergence(data, bad, words) -> None:
    # Bad input is the user's to fix: one InputError naming it, not a run that diverges.
    X, labels, loci = data
    X = X.copy()
    X[5, 7] = bad
    with pytest.raises(InputError, match=re.escape(words)) as err:
        train_corrector(X, labels, loci, MODEL, TRAIN, seed=0, device="cpu", progress=False)
    assert "\n" not in str(err.value)


def test_exploding_loss_raises_training_diverged(data) -> None:
    tc = dict(TRAIN, lr=1e30, grad_clip=0.0, warmup_fraction=0.0)
    with pytest.raises(TrainingDivergedError, match=r"epoch \d+, step \d+: total loss (nan|inf)"):
        run(data, train_config=tc)


def test_save_load_correct_is_identical(data, tmp_path: Path) -> None:
    X, labels, loci = data
    model, _ = run(data, seed=4)
    save_model(model, tmp_path / "w.pt", tmp_path / "c.json")
    config = json.loads((tmp_path / "c.json").read_text())
    assert config["seed"] == 4 and config["n_loci"] == 60
    assert config["batch_names"] == ["batch0", "batch1", "batch2"]
    assert {"model_config", "locusformer_version", "torch_version"} <= set(config)
    loaded = load_model(tmp_path / "w.pt", tmp_path / "c.json")
    assert same_state(loaded, model)
    assert loaded.gene_ids == loci["gene_id"].tolist()
    pd.testing.assert_frame_equal(loaded.loci, loci, check_dtype=False)
    for a, b in zip(
        correct(model, X, labels, device="cpu"),
        correct(loaded, X, labels, device="cpu"),
        strict=True,
    ):
        assert np.array_equal(a, b)


class Payload:
    """Unpickling this would call a function: what weights_only must refuse."""

    def __reduce__(self):
        return (os.getcwd, ())


def test_load_refuses_a_pickle_with_code(data, tmp_path: Path) -> None:
    model, _ = run(data)
    save_model(model, tmp_path / "w.pt", tmp_path / "c.json")
    payload = torch.load(tmp_path / "w.pt", weights_only=True)
    payload["batch_names"] = Payload()
    torch.save(payload, tmp_path / "evil.pt")
    with pytest.raises(InputError, match=r"evil\.pt: refused to load") as err:
        load_model(tmp_path / "evil.pt", tmp_path / "c.json")
    assert "\n" not in str(err.value)
    (tmp_path / "garbage.pt").write_bytes(b"\x00" * 10)
    with pytest.raises(InputError, match=r"garbage\.pt"):
        load_model(tmp_path / "garbage.pt", tmp_path / "c.json")
    with pytest.raises(InputError, match="not found"):
        load_model(tmp_path / "missing.pt", tmp_path / "c.json")


def test_bad_inputs_are_input_errors(data) -> None:
    X, labels, loci = data
    with pytest.raises(InputError, match="labels for 96 samples"):
        train_corrector(X, labels[:-1], loci, seed=0, device="cpu")
    with pytest.raises(InputError, match="rows for 60 loci"):
        train_corrector(X, labels, loci.iloc[:-1], seed=0, device="cpu")
    with pytest.raises(InputError, match="unknown key 'epochs'"):
        train_corrector(X, labels, loci, train_config={"epochs": 3}, seed=0, device="cpu")
    with pytest.raises(InputError, match="device"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="CUDA is not available"):
            resolve_device("cuda:1")
    assert resolve_device("auto").type in ("cpu", "cuda")


def test_epoch_plan_keeps_small_data_and_sizes_large_data_epochs_in_steps() -> None:
    from locusformer.train.loop import epoch_plan

    tc = TrainConfig(max_epochs=80, max_steps=2000, batch_size=64)
    assert epoch_plan(1_260, tc) == (80, 1.0, None)  # 20 steps per pass: 1600 steps
    # 3 steps per pass, not more than ceil(100 / 40): 34 passes reach 100 steps, scaled
    assert epoch_plan(192, TrainConfig(max_epochs=40, max_steps=100)) == (34, 34 / 40, None)
    # a pass longer than 2000 / 80 = 25 steps: 80 epochs of 25 minibatches, unscaled
    assert epoch_plan(100_000, tc) == (80, 1.0, 25)
    assert epoch_plan(10_000_000, tc) == (80, 1.0, 25)
    assert epoch_plan(100_000, TrainConfig(max_epochs=80, min_steps=4000)).epochs == 160


def test_an_epoch_is_a_pass_a_draw_without_replacement_or_several_passes() -> None:
    from locusformer.train.schedule import EpochPlan, epoch_minibatches

    rows = torch.arange(100, 200)

    def draw(plan: EpochPlan) -> list[list[int]]:
        chunks = epoch_minibatches(rows, plan, 16, torch.Generator().manual_seed(0))
        return [chunk.tolist() for chunk in chunks]

    whole = draw(EpochPlan(3, 1.0))
    assert [len(c) for c in whole] == [16] * 6 + [4]
    assert sorted(row for chunk in whole for row in chunk) == rows.tolist()
    drawn = draw(EpochPlan(3, 1.0, 2))
    assert drawn == whole[:2]  # the same shuffle, cut: a draw without replacement
    # 10 minibatches of a 7-minibatch pass: the pass, then 3 of a second shuffle, each
    # shuffle cut on its own so that no minibatch holds a row twice
    several = draw(EpochPlan(3, 1.0, 10))
    assert several[:7] == whole and len(several) == 10
    assert all(len(set(c)) == len(c) for c in several)
    assert several[7:] != whole[:3]


def test_small_data_epochs_take_min_epoch_steps() -> None:
    from locusformer.model.config import TrainConfig
    from locusformer.train.schedule import epoch_plan

    # 45 samples at batch size 64: one minibatch a pass, 40 epochs of 40 steps in all;
    # with an 8-minibatch floor, 40 epochs of 8 (the ramp-up and the rest not rescaled)
    assert epoch_plan(45, TrainConfig()) == (40, 1.0, None)
    assert epoch_plan(45, TrainConfig(min_epoch_steps=8)) == (40, 1.0, 8)
    # a pass of 8 or more minibatches is an epoch as before
    assert epoch_plan(512, TrainConfig(min_epoch_steps=8)) == (40, 1.0, None)
    # the step cap still counts: 2000 steps at 50 a epoch
    assert epoch_plan(45, TrainConfig(min_epoch_steps=100, max_steps=2000)) == (20, 0.5, 100)


def test_large_data_runs_step_sized_epochs(data) -> None:
    # 96 samples, 10% held out: 6 steps of 16 per pass, more than 8 / 4 = 2 steps, so
    # 4 epochs of 2 minibatches run and the ramp-up is not shrunk
    _, history = run(data, train_config=dict(TRAIN, max_epochs=4, max_steps=8))
    assert len(history) == 4
    assert history["adversary_weight"].is_monotonic_increasing
    assert history["adversary_weight"].iloc[0] < history["adversary_weight"].iloc[-1]


def test_validation_scores_a_fixed_draw_of_large_held_out_sets() -> None:
    from locusformer.train.schedule import VAL_MAX_SAMPLES, validation_rows

    at_cap = np.arange(0, 2 * VAL_MAX_SAMPLES, 2)
    np.testing.assert_array_equal(validation_rows(at_cap, 0), at_cap)
    large = np.arange(0, 4 * VAL_MAX_SAMPLES, 2)
    drawn = validation_rows(large, 3)
    assert len(drawn) == VAL_MAX_SAMPLES and np.all(np.diff(drawn) > 0)
    assert np.isin(drawn, large).all()
    np.testing.assert_array_equal(drawn, validation_rows(large, 3))


def test_compiled_encoder_trains_like_the_eager_one(data, tmp_path: Path) -> None:
    """training.compile runs the encoder through torch.compile, same numbers, same files."""
    # Without dropout: compiled code draws its random numbers from another generator.
    # A held-out tenth, so that the validation pass is compared too.
    model, tc = dict(MODEL, dropout=0.0), dict(TRAIN, max_epochs=2, val_fraction=0.1)
    eager, h_eager = run(data, model_config=model, train_config=tc)
    compiled, h_compiled = run(data, model_config=model, train_config=dict(tc, compile=True))
    # The same losses step by step (Adam turns rounding differences into parameter
    # differences of ~1e-3 within two epochs, so the weights are not compared)
    for column in ("train_recon", "train_total", "val_recon"):
        np.testing.assert_allclose(h_compiled[column], h_eager[column], rtol=1e-4)
    assert (
        compiled.module.state_dict().keys() == eager.module.state_dict().keys()
    )  # no _orig_mod. prefix
