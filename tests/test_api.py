"""The AnnData API: fit, map (correct), save and load, as the rules' functions do."""

from __future__ import annotations

from collections.abc import Iterator

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import torch

import locusformer as lf
from locusformer.api import Model
from locusformer.errors import InputError
from locusformer.simulate.datasets import simulate

MODEL = dict(patch_size=4, d_model=16, n_heads=2, n_layers=1, latent_dim=6, decoder_hidden=32)
TRAIN = dict(max_epochs=3, batch_size=16, adversary_rampup_epochs=1)


def test_fit_map_save_load_round_trip(tmp_path) -> None:
    torch.set_num_threads(1)
    sim = simulate(n_samples=90, n_loci=40, n_batches=3, seed=2)
    var = sim.loci.set_index("gene_id")[["chrom", "start"]]
    shuffled = np.random.default_rng(0).permutation(len(var))  # not in genomic order
    obs = pd.DataFrame({"batch": [f"b{b}" for b in sim.batch]}, index=[f"c{i}" for i in range(90)])
    adata = ad.AnnData(X=sim.X[:, shuffled], obs=obs, var=var.iloc[shuffled])
    ref = adata[adata.obs["batch"] != "b2"].copy()
    model = lf.fit(ref, "batch", model=MODEL, training=TRAIN, device="cpu")
    assert model.batch_names == ["b0", "b1"]
    assert model.gene_ids == sim.loci["gene_id"].tolist()  # ordered along the genome
    out = lf.map(adata, model, device="cpu")
    assert out.layers["corrected"].shape == (90, 40) and out.obsm["X_locusformer"].shape == (90, 6)
    assert out.var_names.tolist() == model.gene_ids
    assert out.uns["locusformer"]["mapping"]["new_batches"] == ["b2"]
    lf.save(model, tmp_path / "ref")
    again = lf.map(adata, lf.load(tmp_path / "ref"), device="cpu")
    np.testing.assert_array_equal(again.layers["corrected"], out.layers["corrected"])


def test_fit_without_coordinates_places_genes_with_the_bundled_table() -> None:
    # Neither var coordinates nor annotation=: the human table is used, and ids it does
    # not know are one line, not a traceback.
    adata = ad.AnnData(X=np.ones((4, 3), dtype=np.float32), obs=pd.DataFrame({"b": list("aabb")}))
    with pytest.raises(InputError, match=r"no gene of the matrix .* has coordinates"):
        lf.fit(adata, "b")
    with pytest.raises(InputError, match="no batch column 'x'"):
        lf.fit(adata, "x")


# --------------------------------------------------------------------------------------
# scvi-tools' methods on the trained Model
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fitted() -> Iterator[tuple[Model, ad.AnnData]]:
    """A model fitted on batches b0 and b1 of a simulated AnnData that also holds b2."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    sim = simulate(n_samples=90, n_loci=40, n_batches=3, seed=3)
    var = sim.loci.set_index("gene_id")[["chrom", "start"]]
    obs = pd.DataFrame({"batch": [f"b{b}" for b in sim.batch]}, index=[f"c{i}" for i in range(90)])
    adata = ad.AnnData(X=sim.X, obs=obs, var=var)
    ref = adata[adata.obs["batch"] != "b2"].copy()
    model = lf.fit(ref, "batch", model=MODEL, training=TRAIN, device="cpu")
    yield model, adata
    torch.set_num_threads(before)


def _library_correct(model, adata: ad.AnnData, reference: str) -> tuple[np.ndarray, np.ndarray]:
    from locusformer.infer.correct import correct

    X = adata[:, model.gene_ids].X
    return correct(model, X, adata.obs["batch"].tolist(), reference=reference, device="cpu")


def test_latent_is_what_correct_writes(fitted) -> None:
    model, adata = fitted
    ref = model.adata
    assert isinstance(model, Model) and model.batch_key == "batch"
    z = model.get_latent_representation()  # the AnnData fit was given
    np.testing.assert_array_equal(z, _library_correct(model, ref, "mean")[1])
    np.testing.assert_array_equal(z, lf.map(ref, model, device="cpu").obsm["X_locusformer"])
    # A new batch (b2) gets its latent through the same batch-free encoder, zero-shot.
    z_all = model.get_latent_representation(adata)
    np.testing.assert_array_equal(z_all, lf.map(adata, model).obsm["X_locusformer"])
    assert z_all.shape == (90, MODEL["latent_dim"])


def test_normalized_expression_of_the_reference_is_the_corrected_values(fitted) -> None:
    model, _ = fitted
    ref = model.adata
    values = model.get_normalized_expression()
    assert isinstance(values, pd.DataFrame)
    assert values.index.tolist() == ref.obs_names.tolist()
    assert values.columns.tolist() == model.gene_ids
    corrected = _library_correct(model, ref, "mean")[0]
    np.testing.assert_array_equal(values.to_numpy(), corrected)
    np.testing.assert_array_equal(
        model.get_normalized_expression(ref, "mean", return_numpy=True), corrected
    )
    np.testing.assert_array_equal(values.to_numpy(), lf.map(ref, model).layers["corrected"])


def test_transform_batch_decodes_with_that_batch_code(fitted) -> None:
    model, adata = fitted
    values = model.get_normalized_expression(adata, transform_batch="b1", return_numpy=True)
    np.testing.assert_array_equal(values, lf.map(adata, model, reference="b1").layers["corrected"])
    assert np.abs(values - model.get_normalized_expression(adata, return_numpy=True)).max() > 1e-3
    # By hand: the encoder's latent decoded under batch code 1, un-standardized.
    net = model.module.eval()
    with torch.inference_mode():
        x = net.standardize(torch.from_numpy(np.ascontiguousarray(adata[:, model.gene_ids].X)))
        z, _ = net.encode(x)
        code = torch.full((len(x),), model.batch_names.index("b1"))
        expected = net.unstandardize(net.decode(z, net.condition(code))).numpy()
    np.testing.assert_allclose(values, expected, rtol=1e-5, atol=1e-5)


def test_an_unknown_transform_batch_is_named(fitted) -> None:
    model, adata = fitted
    with pytest.raises(InputError, match=r"transform_batch: unknown batch 'b2' \(valid: mean"):
        model.get_normalized_expression(adata, transform_batch="b2")


def test_save_and_load_as_methods(fitted, tmp_path) -> None:
    model, adata = fitted
    model.save(tmp_path / "m")
    loaded = Model.load(tmp_path / "m", adata)
    assert repr(loaded).startswith("Model(") and loaded.batch_names == ["b0", "b1"]
    np.testing.assert_array_equal(
        loaded.get_latent_representation(), model.get_latent_representation(adata)
    )
    with pytest.raises(InputError, match="adata: none given"):
        lf.load(tmp_path / "m").get_latent_representation()


def test_the_batch_column_cannot_be_protected(tmp_path) -> None:
    from locusformer.steps.train import run_train

    sim = simulate(n_samples=12, n_loci=8, n_batches=2, seed=0)
    var = sim.loci.set_index("gene_id")[["chrom", "start"]]
    obs = pd.DataFrame({"b": [str(b) for b in sim.batch]}, index=[f"c{i}" for i in range(12)])
    adata = ad.AnnData(X=sim.X, obs=obs, var=var)
    message = "protect: 'b' is the batch column; it cannot be protected"
    with pytest.raises(InputError, match=message):
        lf.fit(adata, "b", protect=["b"])
    # The train step refuses it before reading any of its (here absent) files.
    missing = tmp_path / "absent"
    with pytest.raises(InputError, match=message):
        run_train(missing, missing, missing, "b", None, missing, missing, missing, None, 0,
                  protect=["b"])  # fmt: skip
    assert not any(tmp_path.iterdir())


def test_a_combined_batch_key_trains_one_batch_per_combination() -> None:
    torch.set_num_threads(1)
    sim = simulate(n_samples=40, n_loci=16, n_batches=2, seed=4)
    var = sim.loci.set_index("gene_id")[["chrom", "start"]]
    obs = pd.DataFrame(
        {"lab": [f"l{b}" for b in sim.batch], "run": ["r1", "r2"] * 20},
        index=[f"c{i}" for i in range(40)],
    )
    adata = ad.AnnData(X=sim.X, obs=obs, var=var)
    model = lf.fit(adata, "lab+run", model=MODEL, training=TRAIN, device="cpu")
    assert model.batch_names == ["l0+r1", "l0+r2", "l1+r1", "l1+r2"]
    out = lf.map(adata, model, device="cpu")  # the key is found again from fit
    assert out.uns["locusformer"]["mapping"]["new_batches"] == []
    assert "lab+run" not in adata.obs.columns  # the user's AnnData is left as it was
    with pytest.raises(InputError, match="'lane' of 'lab\\+lane' not found"):
        lf.fit(adata, "lab+lane")
