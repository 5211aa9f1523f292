"""The AnnData API: fit, map (correct), save and load, as the rules' functions do."""

from __future__ import annotations

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import torch

import locusformer as lf
from locusformer.errors import InputError
from locusformer.simulate import simulate

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


def test_fit_needs_coordinates_or_an_annotation() -> None:
    adata = ad.AnnData(X=np.ones((4, 3), dtype=np.float32), obs=pd.DataFrame({"b": list("aabb")}))
    with pytest.raises(InputError, match="needs chrom and start columns"):
        lf.fit(adata, "b")
    with pytest.raises(InputError, match="no batch column 'x'"):
        lf.fit(adata, "x")
