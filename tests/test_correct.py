"""Correction: batch removal on simulated data, chunking, references, files."""

from __future__ import annotations

from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import torch
from quality_probe import DATA, MODEL, TRAIN, probe

from locusformer.errors import InputError
from locusformer.infer.correct import attention_map, correct, iter_correct
from locusformer.simulate.datasets import simulate
from locusformer.steps.attention import run_attention
from locusformer.steps.correct import run_correct
from locusformer.steps.train import run_train
from locusformer.train.loop import TrainConfig, train_corrector

NOISE = 0.5  # simulate()'s default noise standard deviation


pytestmark = pytest.mark.usefixtures("one_thread")


def trained(batch_effect: bool):
    strength = {} if batch_effect else {"batch_shift": 0.0, "batch_scale": 0.0}
    sim = simulate(**{**DATA, **strength})
    labels = [f"b{b}" for b in sim.batch]
    torch.set_num_threads(1)
    model, history = train_corrector(
        sim.X, labels, sim.loci, MODEL, TRAIN, seed=0, device="cpu", progress=False
    )
    return sim, labels, model, history


@pytest.fixture(scope="module")
def with_batch_effect():
    return trained(batch_effect=True)


@pytest.fixture(scope="module")
def without_batch_effect():
    return trained(batch_effect=False)


def test_removes_a_known_batch_effect_and_keeps_the_groups(with_batch_effect) -> None:
    sim, labels, model, _ = with_batch_effect
    assert probe(sim.X, sim.batch) > 0.95  # the batch effect is there to begin with
    corrected, latent = correct(model, sim.X, labels, device="cpu")
    assert corrected.dtype == np.float32 and corrected.shape == sim.X.shape
    assert latent.shape == (300, 16)
    # Two batches: 0.5 is chance. Measured on seeds 0-2: 0.63, 0.65, 0.46 (with a tenth
    # held out: 0.57, 0.61, 0.49).
    assert probe(corrected, sim.batch) < 0.65
    assert probe(latent, sim.batch) < 0.65
    # Three groups; measured on seeds 0-2: 1.0, 0.95, 0.95.
    assert probe(corrected, sim.group) > 0.9


def test_without_a_batch_effect_correction_only_removes_noise(without_batch_effect) -> None:
    """The ideal corrector of batch-free data returns the noise-free signal E[x | group].

    It then moves each value by the noise alone: a mean square of NOISE^2 (measured
    0.247-0.253 against 0.25 on seeds 0-2). We allow 20 % more, and require the result
    to sit much closer to the true signal than the input does (mean square error
    < 0.2 NOISE^2; measured 0.007-0.020).
    Correlation with the input is not a sound criterion here: loci without a group effect
    are pure noise, so even the perfect answer correlates only ~0.7 with the input.
    """
    sim, labels, model, _ = without_batch_effect
    corrected, _ = correct(model, sim.X, labels, device="cpu")
    change = float(np.mean((corrected - sim.X) ** 2))
    error = float(np.mean((corrected - sim.signal) ** 2))
    assert change < 1.2 * NOISE**2
    assert error < 0.2 * NOISE**2
    assert probe(corrected, sim.group) > 0.9
    # With nothing to correct, the reference hardly matters.
    for reference in ("b0", "b1"):
        other, _ = correct(model, sim.X, labels, reference=reference, device="cpu")
        assert float(np.mean((other - corrected) ** 2)) < 0.05 * NOISE**2


def test_history_of_the_real_run(with_batch_effect) -> None:
    _, _, _, history = with_batch_effect
    assert history["train_recon"].iloc[-1] < history["train_recon"].iloc[0]
    assert history["adversary_weight"].max() == pytest.approx(TrainConfig().adversary_weight)
    # The cluster term's clusters are found from the end of the ramp-up (epoch 20) on,
    # and here came to hold both batches.
    compared = history["clusters_compared"]
    assert compared.iloc[:19].isna().all() and compared.iloc[19:].notna().all()
    assert compared.max() > 0


def test_warns_when_the_cluster_term_never_acted() -> None:
    """Left to the latent's clusters (input clusters off), the default model on this data
    (300 samples, a strong shift) never mixes the batches enough for a latent cluster to
    hold both: the term never acts and the batch stays whole (batch probe 1.0 on seeds
    0-5). Training says so."""
    sim = simulate(**DATA)
    labels = [f"b{b}" for b in sim.batch]
    with pytest.warns(UserWarning, match="cluster term never acted"):
        model, history = train_corrector(
            sim.X, labels, sim.loci, None, {"input_clusters": 0}, seed=0, progress=False
        )
    assert (history["clusters_compared"].dropna() == 0).all()
    _, latent = correct(model, sim.X, labels, device="cpu")
    assert probe(latent, sim.batch) > 0.95  # the batch the warning speaks of


def test_input_clusters_remove_the_shift_the_latent_alone_could_not() -> None:
    """The same data with the input's clusters (issue 38): the batch is removed within
    each from the first epoch, the latent mixes, and the cluster term then acts.
    Measured on seeds 0-2: latent batch probe 0.49, 0.52, 0.49; groups 1.0."""
    sim = simulate(**DATA)
    labels = [f"b{b}" for b in sim.batch]
    model, history = train_corrector(
        sim.X, labels, sim.loci, None, {"input_clusters": 8}, seed=0, progress=False
    )
    assert (history["clusters_compared"].dropna() > 0).any()
    corrected, latent = correct(model, sim.X, labels, device="cpu")
    assert probe(latent, sim.batch) < 0.65
    assert probe(corrected, sim.group) > 0.9


@pytest.fixture(scope="module")
def small():
    sim = simulate(n_samples=40, n_loci=50, n_batches=2, seed=1)
    labels = [f"b{b}" for b in sim.batch]
    model_config = dict(
        patch_size=4,
        d_model=16,
        n_heads=2,
        n_layers=2,
        latent_dim=4,
        decoder_hidden=16,
        discriminator_hidden=8,
    )
    torch.set_num_threads(1)
    model, _ = train_corrector(
        sim.X,
        labels,
        sim.loci,
        model_config,
        {"max_epochs": 2},
        seed=0,
        device="cpu",
        progress=False,
    )
    return sim, labels, model


def test_chunking_does_not_change_the_result(small) -> None:
    sim, labels, model = small
    whole = correct(model, sim.X, labels, chunk_size=512, device="cpu")
    chunked = correct(model, sim.X, labels, chunk_size=7, device="cpu")
    for a, b in zip(whole, chunked, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    pieces = list(iter_correct(model, sim.X, labels, chunk_size=16, device="cpu"))
    assert [p[0] for p in pieces] == [slice(0, 16), slice(16, 32), slice(32, 40)]
    assert not model.module.training


def test_worker_threads_give_the_same_chunks_in_order(small) -> None:
    sim, labels, model = small
    threads = torch.get_num_threads()
    alone = list(iter_correct(model, sim.X, labels, chunk_size=3, device="cpu", workers=1))
    shared = list(iter_correct(model, sim.X, labels, chunk_size=3, device="cpu", workers=3))
    assert [p[0] for p in shared] == [p[0] for p in alone]
    for a, b in zip(alone, shared, strict=True):
        np.testing.assert_allclose(a[1], b[1], rtol=0, atol=1e-6)
        np.testing.assert_allclose(a[2], b[2], rtol=0, atol=1e-6)
    assert torch.get_num_threads() == threads, "the thread count is restored"
    assert not model.module.training


def test_residual_with_the_own_batch_as_reference_returns_the_input(small) -> None:
    sim, labels, model = small
    mask = np.array(labels) == "b1"
    x = sim.X[mask]
    out, _ = correct(model, x, ["b1"] * len(x), reference="b1", add_residual=True, device="cpu")
    np.testing.assert_allclose(out, x, rtol=0, atol=1e-4)
    plain, _ = correct(model, x, ["b1"] * len(x), reference="b1", device="cpu")
    assert not np.allclose(plain, x, atol=1e-2)


def test_unknown_batches_and_references_are_input_errors(small) -> None:
    sim, labels, model = small
    with pytest.raises(InputError, match=r"not seen in training: 'b7' \(known: b0, b1\)"):
        correct(model, sim.X[:2], ["b0", "b7"], device="cpu")
    with pytest.raises(InputError, match=r"unknown batch 'b9' \(valid: mean, b0, b1\)"):
        correct(model, sim.X, labels, reference="b9", device="cpu")
    with pytest.raises(InputError, match="50"):
        correct(model, sim.X[:, :10], labels, device="cpu")


def test_attention_map(small) -> None:
    sim, labels, model = small
    attn = attention_map(model, sim.X, labels, max_samples=9)
    T = model.n_tokens
    assert attn.shape == (2, 2, T, T) and attn.dtype == np.float32
    np.testing.assert_allclose(attn.sum(-1), 1.0, atol=1e-5)


def write_inputs(tmp: Path, sim, labels) -> dict[str, Path]:
    ids = pd.Index([f"sample{i}" for i in range(len(sim.X))], name="sample_id")
    names = {"ordered": "ordered.parquet", "loci": "loci.parquet", "samples": "samples.tsv"}
    paths = {key: tmp / name for key, name in names.items()}
    pd.DataFrame(sim.X, index=ids, columns=sim.loci["gene_id"]).to_parquet(paths["ordered"])
    sim.loci.to_parquet(paths["loci"])
    table = pd.DataFrame({"sample_id": ids, "cell_type": sim.group.astype(str), "protocol": labels})
    table.to_csv(paths["samples"], sep="\t", index=False)
    return paths


def test_run_train_and_run_correct_files(small, tmp_path: Path) -> None:
    sim, labels, _ = small
    p = write_inputs(tmp_path, sim, labels)
    params = {
        "model": {"patch_size": 4, "d_model": 16, "n_heads": 2, "n_layers": 1, "latent_dim": 3},
        "train": {"max_epochs": 2},
    }
    names = ["w.pt", "c.json", "h.tsv", "ckpt.pt", "attn.npz", "corr.parquet", "latent.parquet"]
    out = {name: tmp_path / name for name in [*names, "out.h5ad"]}
    run_train(
        p["ordered"],
        p["loci"],
        p["samples"],
        "protocol",
        params,
        out["w.pt"],
        out["c.json"],
        out["h.tsv"],
        out["ckpt.pt"],
        0,
        "cpu",
        progress=False,
    )
    assert len(pd.read_csv(out["h.tsv"], sep="\t")) == 2
    run_attention(
        p["ordered"], p["loci"], p["samples"], "protocol", out["w.pt"], out["c.json"],
        out["attn.npz"], "cpu",
    )  # fmt: skip
    with np.load(out["attn.npz"], allow_pickle=False) as npz:
        assert npz["attention"].shape[:2] == (1, 2)
        assert set(npz["token_chrom"].tolist()) == {"chr1", "chr2", "chr3", "unplaced"}
    run_attention(
        p["ordered"],
        p["loci"],
        p["samples"],
        "protocol",
        out["w.pt"],
        out["c.json"],
        tmp_path / "again.npz",
        "cpu",
        max_samples=5,
    )
    with np.load(tmp_path / "again.npz") as a, np.load(out["attn.npz"]) as b:
        assert a["attention"].shape == b["attention"].shape
    run_correct(
        p["ordered"],
        p["samples"],
        "protocol",
        out["w.pt"],
        out["c.json"],
        out["corr.parquet"],
        out["latent.parquet"],
        out["out.h5ad"],
        "mean",
        False,
        16,
        "cpu",
    )

    ordered = pd.read_parquet(p["ordered"])
    corrected = pd.read_parquet(out["corr.parquet"])
    assert corrected.index.equals(ordered.index) and corrected.index.name == "sample_id"
    assert corrected.columns.equals(ordered.columns)
    assert (corrected.dtypes == np.float32).all()
    latent = pd.read_parquet(out["latent.parquet"])
    assert latent.columns.tolist() == ["latent_0", "latent_1", "latent_2"]
    assert latent.index.equals(ordered.index)

    adata = ad.read_h5ad(out["out.h5ad"])
    assert adata.obs_names.tolist() == ordered.index.tolist()
    assert adata.var_names.tolist() == ordered.columns.tolist()
    assert adata.obs["protocol"].astype(str).tolist() == labels
    assert adata.var["chrom"].astype(str).tolist() == sim.loci["chrom"].tolist()
    np.testing.assert_array_equal(adata.X, ordered.to_numpy())
    np.testing.assert_array_equal(adata.layers["corrected"], corrected.to_numpy())
    np.testing.assert_array_equal(adata.obsm["X_locusformer"], latent.to_numpy())


def test_file_level_input_errors(small, tmp_path: Path) -> None:
    sim, labels, _ = small
    p = write_inputs(tmp_path, sim, labels)
    args = (tmp_path / "w.pt", tmp_path / "c.json", tmp_path / "h.tsv", None, 0, "cpu")
    with pytest.raises(InputError, match="missing column 'batch'"):
        run_train(p["ordered"], p["loci"], p["samples"], "batch", {}, *args, progress=False)
    with pytest.raises(InputError, match="unknown key 'optim'"):
        run_train(p["ordered"], p["loci"], p["samples"], "protocol", {"optim": {}}, *args)
    sim.loci.iloc[::-1].to_parquet(tmp_path / "shuffled.parquet")
    with pytest.raises(InputError, match="gene ids do not match"):
        run_train(p["ordered"], tmp_path / "shuffled.parquet", p["samples"], "protocol", {}, *args)
    with pytest.raises(InputError, match="file not found"):
        run_train(tmp_path / "nope.parquet", p["loci"], p["samples"], "protocol", {}, *args)


def test_the_chunk_size_default_is_the_same_everywhere():
    # The CLI states it without importing torch; config and schema state it for the workflow.
    import yaml
    from conftest import ROOT

    from locusformer.cli.parser import build_parser
    from locusformer.infer.correct import CHUNK_SIZE

    required = "--matrix m --samples s --batch-key b --weights w --config c".split()
    required += "--out-corrected o --out-latent l --out-h5ad h".split()
    assert build_parser().parse_args(["correct", *required]).chunk_size == CHUNK_SIZE
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    assert schema["properties"]["correct"]["properties"]["chunk_size"]["default"] == CHUNK_SIZE
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    assert config["correct"]["chunk_size"] == CHUNK_SIZE
