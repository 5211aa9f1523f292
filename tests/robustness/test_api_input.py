"""The Python API checks its input as the workflow's steps do: each bad AnnData is one
:class:`InputError` in the CLI's words, never a NaN result, a batch called "nan" or a
pandas traceback; and a hostile matrix given to ``correct`` or ``lf.fit`` ends in a
result or an InputError, never in a traceback or a non-finite output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import locusformer as lf
from locusformer.errors import InputError
from locusformer.io.parquet import write_matrix_parquet
from locusformer.simulate.datasets import simulate

ROOT = Path(__file__).resolve().parents[2]
MODEL = dict(patch_size=4, d_model=8, n_heads=2, n_layers=1, latent_dim=4, decoder_hidden=16)
TRAIN = dict(max_epochs=2, batch_size=16)


def _adata(n: int = 40, seed: int = 0) -> ad.AnnData:
    sim = simulate(n_samples=n, n_loci=16, n_batches=2, seed=seed)
    var = sim.loci.set_index("gene_id")[["chrom", "start"]]
    obs = pd.DataFrame({"batch": [f"b{b}" for b in sim.batch]}, index=[f"c{i}" for i in range(n)])
    return ad.AnnData(X=sim.X.astype(np.float32), obs=obs, var=var)


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return lf.fit(_adata(), "batch", model=MODEL, training=TRAIN, device="cpu", progress=False)


def _fit(adata: ad.AnnData, **kwargs):
    return lf.fit(
        adata, "batch", model=MODEL, training=TRAIN, device="cpu", progress=False, **kwargs
    )


@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["nan", "inf"])
def test_non_finite_values_are_refused_by_fit_and_map(model, bad):
    adata = _adata()
    adata.X[3, 5] = bad
    with pytest.raises(InputError, match=r"adata\.X: non-finite value .* at row 4"):
        _fit(adata)
    with pytest.raises(InputError, match=r"adata\.X: non-finite value .* at row 4"):
        lf.map(adata, model, device="cpu")


def test_raw_counts_given_as_log_expression_are_refused(model):
    adata = _adata()
    adata.X = np.round(np.expm1(adata.X) * 1000).astype(np.float32)
    with pytest.raises(InputError, match="which log-expression never does"):
        _fit(adata)
    with pytest.raises(InputError, match="which log-expression never does"):
        lf.map(adata, model, device="cpu")


def test_a_missing_batch_value_is_refused_not_called_nan():
    adata = _adata()
    batch = adata.obs["batch"].astype("category")
    batch.iloc[2] = np.nan
    adata.obs["batch"] = batch
    with pytest.raises(InputError, match=r"1 sample\(s\) have no 'batch' value, e.g. 'c2'"):
        _fit(adata)


def test_one_batch_is_refused_as_the_cli_refuses_it():
    adata = _adata()
    adata.obs["batch"] = "only"
    with pytest.raises(InputError, match="has 1 batch; at least 2 are needed"):
        _fit(adata)


def test_repeated_gene_ids_are_refused():
    adata = _adata()
    adata.var_names = [adata.var_names[0], *adata.var_names[:-1]]
    with pytest.raises(InputError, match="duplicate gene ids in var_names"):
        _fit(adata)


def test_spaces_around_batch_values_are_removed(caplog):
    adata = _adata()
    adata.obs["batch"] = [f"{b} " if i == 0 else b for i, b in enumerate(adata.obs["batch"])]
    fitted = _fit(adata)
    assert fitted.batch_names == ["b0", "b1"]
    assert "leading or trailing spaces, removed" in caplog.text


def test_annotation_may_be_the_bundled_table_read_with_pandas():
    sim = simulate(n_samples=40, n_loci=16, n_batches=2, seed=0)
    table = pd.read_csv(ROOT / "resources" / "hs_gene_coordinates.tsv.gz", sep="\t", dtype=str)
    genes = table.dropna(subset=["ensembl_id"]).drop_duplicates("ensembl_id").iloc[:16]
    obs = pd.DataFrame({"batch": [f"b{b}" for b in sim.batch]}, index=[f"c{i}" for i in range(40)])
    adata = ad.AnnData(X=sim.X, obs=obs, var=pd.DataFrame(index=genes["ensembl_id"].tolist()))
    fitted = _fit(adata, annotation=table)
    assert sorted(fitted.gene_ids) == sorted(genes["ensembl_id"])
    with pytest.raises(InputError, match=r"annotation: lacks column.* start"):
        _fit(adata, annotation=table.drop(columns=["start"]))


def test_map_keeps_the_querys_own_annotations(model):
    adata = _adata(seed=1)
    adata.layers["counts"] = np.expm1(adata.X)
    adata.obsm["X_umap"] = np.zeros((adata.n_obs, 2), dtype=np.float32)
    adata.uns["mine"] = {"kept": True}
    adata.var["symbol"] = [f"g{i}" for i in range(adata.n_vars)]
    out = lf.map(adata, model, device="cpu")
    assert "counts" in out.layers and "X_umap" in out.obsm and out.uns["mine"] == {"kept": True}
    assert out.var["symbol"].notna().all()
    for key in ("X_locusformer", "X_locusformer_pca"):
        assert key in out.obsm and np.isfinite(out.obsm[key]).all()
    assert "X_locusformer" not in adata.obsm, "the user's AnnData is left as it was"
    latent = model.get_latent_representation(adata, indices=[3, 1], batch_size=1, device="cpu")
    np.testing.assert_allclose(latent, out.obsm["X_locusformer"][[3, 1]], rtol=0, atol=1e-5)


def test_save_does_not_overwrite_without_being_told(model, tmp_path):
    model.save(tmp_path)
    with pytest.raises(InputError, match=r"holds a model .* overwrite=True"):
        model.save(tmp_path)
    model.save(tmp_path, overwrite=True)


def test_fit_takes_the_common_options_as_keywords_and_keeps_the_history():
    fitted = lf.fit(
        _adata(), "batch", model=MODEL, max_epochs=2, batch_size=8, seed=1, device="cpu",
        progress=False,
    )  # fmt: skip
    assert len(fitted.history) == 2 and "val_recon" in fitted.history.columns


def test_fit_shows_a_progress_bar_by_default():
    script = (
        "import numpy as np, pandas as pd, anndata as ad, locusformer as lf\n"
        "from locusformer.simulate.datasets import simulate\n"
        "s = simulate(n_samples=30, n_loci=16, n_batches=2, seed=0)\n"
        "obs = pd.DataFrame({'b': [f'b{b}' for b in s.batch]},\n"
        "                   index=[f'c{i}' for i in range(30)])\n"
        "a = ad.AnnData(X=s.X, obs=obs, var=s.loci.set_index('gene_id')[['chrom', 'start']])\n"
        f"lf.fit(a, 'b', model={MODEL!r}, max_epochs=2, device='cpu')\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "train:" in run.stderr and "/2 [" in run.stderr and "epoch/s" in run.stderr


# -- hostile matrices: a result or an InputError, nothing else ---------------------------------

HOSTILE_VALUES = st.sampled_from([0.0, 1.0, 3.5, -2.0, np.nan, np.inf, -np.inf, 1e6, 1e-30])


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(
    values=arrays(np.float32, (24, 16), elements=HOSTILE_VALUES),
    batches=st.lists(st.sampled_from(["a", "b", " a", "", "nan"]), min_size=24, max_size=24),
)
def test_fit_on_hostile_matrices_gives_a_model_or_an_input_error(values, batches):
    adata = _adata(24)
    adata.X = values
    adata.obs["batch"] = batches
    try:
        fitted = _fit(adata)
    except InputError as err:
        assert "\n" not in str(err)
        return
    assert np.isfinite(fitted.get_latent_representation(device="cpu")).all()


@settings(max_examples=10, deadline=None, derandomize=True, database=None)
@given(values=arrays(np.float32, (12, 16), elements=HOSTILE_VALUES))
def test_correct_on_hostile_matrices_gives_finite_output_or_one_line(values, tmp_path_factory):
    from robustness_cli import run_cli

    d = tmp_path_factory.mktemp("hostile")
    ids = pd.Index([f"s{i}" for i in range(12)], name="sample_id")
    model = _model_for_correct(tmp_path_factory)
    write_matrix_parquet(d / "ordered.parquet", values, ids, model["genes"])
    pd.DataFrame({"sample_id": ids, "batch": ["b0", "b1"] * 6}).to_csv(
        d / "samples.tsv", sep="\t", index=False
    )
    code, lines = run_cli(
        [
            "correct", "--matrix", d / "ordered.parquet", "--samples", d / "samples.tsv",
            "--batch-key", "batch", "--weights", model["dir"] / "model.pt",
            "--config", model["dir"] / "model.json", "--device", "cpu",
            "--out-corrected", d / "out" / "c.parquet", "--out-latent", d / "out" / "l.parquet",
            "--out-h5ad", d / "out" / "x.h5ad",
        ]
    )  # fmt: skip
    if code == 0:
        assert np.isfinite(pd.read_parquet(d / "out" / "c.parquet").to_numpy()).all()
    else:
        assert code == 2 and len(lines) == 1, lines
        assert not (d / "out").exists() or not list((d / "out").iterdir())


_SAVED: dict = {}


def _model_for_correct(tmp_path_factory) -> dict:
    if not _SAVED:
        torch.set_num_threads(1)
        fitted = _fit(_adata())
        directory = tmp_path_factory.mktemp("model")
        fitted.save(directory)
        _SAVED.update(dir=directory, genes=pd.Index(fitted.gene_ids))
    return _SAVED
