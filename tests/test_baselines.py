"""Baselines: the integration-result format, each method, and the file-level runner."""

from __future__ import annotations

import sys
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
from conftest import synthetic_groups

from locusformer.baselines import methods as baselines
from locusformer.baselines.methods import run_method
from locusformer.cli.main import main
from locusformer.cli.parser import build_parser
from locusformer.errors import InputError
from locusformer.io.results import make_result, write_result
from locusformer.pp.pca import pca
from locusformer.steps.baseline import load_normalized, run_baseline


def synthetic(**kwargs) -> ad.AnnData:
    return synthetic_groups(**{"shift": 0.5, **kwargs})


def write_inputs(adata: ad.AnnData, directory: Path) -> tuple[Path, Path]:
    ordered = directory / "ordered.parquet"
    samples = directory / "samples.tsv"
    frame = pd.DataFrame(
        adata.X, index=pd.Index(adata.obs_names, name="sample_id"), columns=adata.var_names
    )
    frame.to_parquet(ordered)
    adata.obs.rename_axis("sample_id").reset_index().to_csv(samples, sep="\t", index=False)
    return ordered, samples


def batch_centroid_gap(x: np.ndarray, batches: np.ndarray, groups: np.ndarray) -> float:
    """Mean distance between the two batches' centroids within each group."""
    gaps = []
    for g in np.unique(groups):
        m = groups == g
        c = [x[m & (batches == b)].mean(axis=0) for b in np.unique(batches)]
        gaps.append(np.linalg.norm(c[0] - c[1]))
    return float(np.mean(gaps))


@pytest.fixture(scope="module")
def adata() -> ad.AnnData:
    return synthetic()


# --------------------------------------------------------------------------- make_result


def test_make_result_matrix_from_dataframe() -> None:
    frame = pd.DataFrame(
        np.arange(6, dtype=float).reshape(3, 2), index=["a", "b", "c"], columns=["g1", "g2"]
    )
    obs = pd.DataFrame({"batch": ["x", "y", "x"], "label": [1, 2, 2]}, index=["a", "b", "c"])
    res = make_result(
        frame,
        method="mine",
        representation="matrix",
        obs=obs,
        batch_key="batch",
        label_key="label",
    )
    assert res.shape == (3, 2)
    assert list(res.var_names) == ["g1", "g2"]
    assert res.uns["method"] == "mine"
    assert res.uns["status"] == "ok"
    assert res.uns["representation"] == "matrix"
    assert "error" not in res.uns
    assert isinstance(res.obs["batch"].dtype, pd.CategoricalDtype)
    assert list(res.obs["label"].cat.categories) == ["1", "2"]
    np.testing.assert_array_equal(res.X, frame.to_numpy(dtype=np.float32))


def test_make_result_embedding_round_trips(tmp_path: Path, adata: ad.AnnData) -> None:
    emb = np.random.default_rng(0).normal(size=(adata.n_obs, 4))
    res = make_result(
        adata,
        method="locusformer",
        representation="embedding",
        embedding=emb,
        batch_key="batch",
        label_key="cell_type",
        uns={"epochs": 3},
    )
    write_result(res, tmp_path / "r.h5ad")
    back = ad.read_h5ad(tmp_path / "r.h5ad")
    assert back.uns["representation"] == "embedding"
    assert back.uns["epochs"] == 3
    np.testing.assert_allclose(back.obsm["X_emb"], emb.astype(np.float32))
    assert list(back.obs_names) == list(adata.obs_names)
    assert isinstance(back.obs["cell_type"].dtype, pd.CategoricalDtype)
    assert not list(tmp_path.glob(".*.tmp"))  # the temporary file was renamed


def test_make_result_rejects_inconsistent_input(adata: ad.AnnData) -> None:
    with pytest.raises(ValueError, match="embedding"):
        make_result(adata, method="m", representation="embedding")
    with pytest.raises(ValueError, match="representation"):
        make_result(adata, method="m", representation="latent")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rows"):
        make_result(np.zeros((3, 2)), method="m", representation="matrix", obs=adata.obs)


def test_failed_result_has_one_line_error(adata: ad.AnnData) -> None:
    res = baselines.failed_result("combat", adata.obs, adata.var_names, ValueError("bad\nthing"))
    assert res.uns["status"] == "failed"
    assert res.uns["error"] == "ValueError: bad thing"
    assert res.X is None


# --------------------------------------------------------------------------- methods


def test_uncorrected_is_the_input(adata: ad.AnnData) -> None:
    res = run_method("uncorrected", adata, "batch", seed=0)
    np.testing.assert_array_equal(res.X, adata.X)
    assert res.uns["representation"] == "matrix"
    assert res.uns["seed"] == 0


def test_combat_removes_the_batch_shift_and_keeps_groups(adata: ad.AnnData) -> None:
    res = run_method("combat", adata, "batch", seed=0)
    assert res.uns["method"] == "combat" and res.uns["representation"] == "matrix"
    assert res.shape == adata.shape
    batches = adata.obs["batch"].to_numpy()
    groups = adata.obs["cell_type"].to_numpy()
    before = batch_centroid_gap(np.asarray(adata.X), batches, groups)
    after = batch_centroid_gap(np.asarray(res.X), batches, groups)
    assert after < 0.5 * before
    # the group difference (biology) is still there
    x = np.asarray(res.X)
    g0 = x[groups == "t0"].mean(axis=0)
    g1 = x[groups == "t1"].mean(axis=0)
    assert np.linalg.norm(g0 - g1) > 5 * after


def test_combat_leaves_genes_constant_within_a_batch_unadjusted() -> None:
    adata = synthetic(n_per=5, genes=20)
    x = np.asarray(adata.X).copy()
    b0 = (adata.obs["batch"] == "b0").to_numpy()
    x[b0, 3] = 0.0  # not expressed at all in batch b0
    adata.X = x
    res = run_method("combat", adata, "batch", seed=0)
    assert res.uns["n_genes_unadjusted"] == 1
    np.testing.assert_array_equal(np.asarray(res.X)[:, 3], x[:, 3])
    assert np.isfinite(res.X).all()
    assert not np.allclose(np.asarray(res.X)[:, 4], x[:, 4])


@pytest.mark.parametrize("sizes", [[1, 10], [10]])
def test_combat_refuses_designs_it_cannot_fit(sizes: list[int]) -> None:
    adata = synthetic(n_per=10, groups=1, batches=2, genes=20)
    keep = np.concatenate(
        [np.flatnonzero(adata.obs["batch"] == f"b{i}")[:n] for i, n in enumerate(sizes)]
    )
    with pytest.raises(RuntimeError, match="ComBat needs at least 2"):
        run_method("combat", adata[keep].copy(), "batch", seed=0)


def test_harmony_gives_an_embedding_that_mixes_batches(adata: ad.AnnData) -> None:
    res = run_method("harmony", adata, "batch", seed=0)
    assert res.uns["representation"] == "embedding"
    emb = res.obsm["X_emb"]
    assert emb.shape == (adata.n_obs, 50)
    np.testing.assert_array_equal(res.X, adata.X)  # .X keeps the input
    batches = adata.obs["batch"].to_numpy()
    groups = adata.obs["cell_type"].to_numpy()
    x = np.asarray(adata.X, dtype=float)
    sd = x.std(axis=0, ddof=1)
    pcs = pca((x - x.mean(axis=0)) / sd, 50)
    assert batch_centroid_gap(emb, batches, groups) < 0.5 * batch_centroid_gap(pcs, batches, groups)
    again = run_method("harmony", adata, "batch", seed=0)
    np.testing.assert_allclose(again.obsm["X_emb"], emb)  # seeded


def test_harmony_on_a_tiny_study() -> None:
    adata = synthetic(n_per=3, groups=2, batches=2, genes=30)  # 12 samples
    res = run_method("harmony", adata, "batch", seed=1)
    assert res.obsm["X_emb"].shape == (12, 11)
    assert np.isfinite(res.obsm["X_emb"]).all()


def test_unknown_method_is_an_input_error(adata: ad.AnnData) -> None:
    with pytest.raises(InputError, match="unknown baseline 'mnn'"):
        run_method("mnn", adata, "batch", seed=0)


def test_scvi_needs_counts(adata: ad.AnnData) -> None:
    with pytest.raises(InputError, match="raw counts"):
        run_method("scvi", adata, "batch", seed=0)


def test_scvi_without_scvi_tools_says_so(adata: ad.AnnData, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "scvi", None)  # import scvi -> ImportError
    counts = pd.DataFrame(np.ones(adata.shape), index=adata.obs_names, columns=adata.var_names)
    with pytest.raises(RuntimeError, match="scvi-tools"):
        run_method("scvi", adata, "batch", seed=0, counts=counts)


@pytest.mark.skipif(not baselines.scvi_available(), reason="scvi-tools is not installed")
def test_scvi_on_counts(adata: ad.AnnData, monkeypatch) -> None:
    monkeypatch.setattr(baselines, "SCVI_MAX_EPOCHS", 5)
    rng = np.random.default_rng(0)
    counts = pd.DataFrame(
        rng.poisson(np.exp(np.asarray(adata.X) / 2)),
        index=adata.obs_names,
        columns=adata.var_names,
    )
    res = run_method("scvi", adata, "batch", seed=0, counts=counts)
    assert res.uns["representation"] == "embedding"
    assert res.obsm["X_emb"].shape == (adata.n_obs, 10)
    assert np.isfinite(res.obsm["X_emb"]).all()


def confounded(seed: int = 0) -> tuple[ad.AnnData, np.ndarray]:
    """Two batches, two cell lines, mostly one line per batch; returns the line effect."""
    rng = np.random.default_rng(seed)
    genes = 40
    line_effect = rng.normal(0, 1.5, genes)
    batch_shift = rng.normal(0, 1.0, genes)
    rows, x = [], []
    for b, share_b in enumerate([0.2, 0.8]):  # share of line B in batch b
        for k in range(20):
            line = "B" if k < share_b * 20 else "A"
            x.append(5 + (line == "B") * line_effect + b * batch_shift + rng.normal(0, 0.25, genes))
            rows.append((f"s{b}_{k}", f"b{b}", line))
    obs = pd.DataFrame(rows, columns=["sample_id", "batch", "cell_line"]).set_index("sample_id")
    adata = ad.AnnData(np.asarray(x, dtype=np.float32), obs=obs)
    adata.var_names = [f"G{i:03d}" for i in range(genes)]
    return adata, line_effect


def line_effect_error(x: np.ndarray, lines: np.ndarray, truth: np.ndarray) -> float:
    """Distance between the corrected data's B - A mean difference and the true one."""
    estimate = x[lines == "B"].mean(axis=0) - x[lines == "A"].mean(axis=0)
    return float(np.linalg.norm(estimate - truth))


def test_combat_mod_keeps_a_label_confounded_with_batch() -> None:
    adata, truth = confounded()
    lines = adata.obs["cell_line"].to_numpy()
    batches = adata.obs["batch"].to_numpy()
    plain = run_method("combat", adata, "batch", seed=0)
    mod = run_method("combat_mod", adata, "batch", seed=0, covariates=["cell_line"])
    assert mod.uns["method"] == "combat_mod" and mod.uns["representation"] == "matrix"
    assert list(mod.uns["covariates"]) == ["cell_line"]
    assert mod.uns["display_name"] == "combat_mod (mod: cell_line)"
    # plain ComBat takes part of the line effect for batch; the protected fit keeps it
    plain_error = line_effect_error(np.asarray(plain.X), lines, truth)
    mod_error = line_effect_error(np.asarray(mod.X), lines, truth)
    assert mod_error < 0.4 * plain_error
    assert mod_error < 0.1 * np.linalg.norm(truth)
    # and it removes the batch shift within each line, which plain ComBat, misled by the
    # lines, leaves in part
    before = batch_centroid_gap(np.asarray(adata.X), batches, lines)
    mod_gap = batch_centroid_gap(np.asarray(mod.X), batches, lines)
    assert mod_gap < 0.2 * before
    assert mod_gap < 0.5 * batch_centroid_gap(np.asarray(plain.X), batches, lines)


def test_combat_mod_needs_and_owns_its_covariates(adata: ad.AnnData) -> None:
    with pytest.raises(InputError, match="combat_mod needs at least one") as info:
        run_method("combat_mod", adata, "batch", seed=0)
    assert "\n" not in str(info.value)
    with pytest.raises(InputError, match="only combat_mod protects"):
        run_method("combat", adata, "batch", seed=0, covariates=["cell_type"])
    with pytest.raises(InputError, match="no column 'donor'"):
        run_method("combat_mod", adata, "batch", seed=0, covariates=["donor"])
    with pytest.raises(InputError, match="is the batch column"):
        run_method("combat_mod", adata, "batch", seed=0, covariates=["batch"])


def test_combat_mod_refuses_a_label_that_is_the_batch(adata: ad.AnnData) -> None:
    same = adata.copy()
    same.obs["site"] = same.obs["batch"].astype(str) + "_site"
    with pytest.raises(RuntimeError, match="confounded with batch 'batch'"):
        run_method("combat_mod", same, "batch", seed=0, covariates=["site"])


def test_run_baseline_combat_mod_records_its_labels(tmp_path: Path) -> None:
    adata, _ = confounded()
    ordered, samples = write_inputs(adata, tmp_path)
    out = tmp_path / "combat_mod.h5ad"
    run_baseline(
        "combat_mod", ordered, samples, "batch", "cell_line", out, seed=0, covariates=["cell_line"]
    )
    back = ad.read_h5ad(out)
    assert back.uns["status"] == "ok" and back.uns["method"] == "combat_mod"
    assert list(back.uns["covariates"]) == ["cell_line"]
    assert back.uns["display_name"] == "combat_mod (mod: cell_line)"
    with pytest.raises(InputError, match=r"samples\.tsv: no column 'donor'"):
        run_baseline(
            "combat_mod", ordered, samples, "batch", None, out, seed=0, covariates=["donor"]
        )
    with pytest.raises(InputError, match="combat_mod needs"):
        run_baseline("combat_mod", ordered, samples, "batch", None, out, seed=0)


def test_sysvi_refuses_bad_input(adata: ad.AnnData) -> None:
    bad = adata.copy()
    x = np.asarray(bad.X).copy()
    x[0, 0] = np.nan
    bad.X = x
    with pytest.raises(InputError, match="normalized matrix: contains non-finite") as info:
        run_method("sysvi", bad, "batch", seed=0)
    assert "\n" not in str(info.value)
    with pytest.raises(InputError, match="no batch column 'donor'"):
        run_method("sysvi", adata, "donor", seed=0)


def test_sysvi_without_scvi_tools_says_so(adata: ad.AnnData, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "scvi", None)  # import scvi -> ImportError
    with pytest.raises(RuntimeError, match="SysVI needs the optional scvi-tools"):
        run_method("sysvi", adata, "batch", seed=0)
    failed = baselines.failed_result("sysvi", adata.obs, adata.var_names, "no scvi-tools")
    assert failed.uns["representation"] == "embedding"


@pytest.mark.skipif(not baselines.scvi_available(), reason="scvi-tools is not installed")
def test_sysvi_on_the_normalized_matrix(monkeypatch) -> None:
    monkeypatch.setattr(baselines, "SYSVI_MAX_EPOCHS", 3)
    small = synthetic(n_per=5, groups=2, batches=2, genes=30)  # 20 samples
    res = run_method("sysvi", small, "batch", seed=0)
    assert res.uns["method"] == "sysvi" and res.uns["representation"] == "embedding"
    emb = res.obsm["X_emb"]
    assert emb.shape == (small.n_obs, 15)  # SysVI's 15 latent dimensions
    assert np.isfinite(emb).all()
    np.testing.assert_array_equal(res.X, small.X)  # .X keeps the input
    again = run_method("sysvi", small, "batch", seed=0)
    np.testing.assert_allclose(again.obsm["X_emb"], emb, rtol=0, atol=1e-6)
    other = run_method("sysvi", small, "batch", seed=1)
    assert not np.allclose(other.obsm["X_emb"], emb)


# --------------------------------------------------------------------------- files


def test_run_baseline_writes_a_result(tmp_path: Path, adata: ad.AnnData) -> None:
    ordered, samples = write_inputs(adata, tmp_path)
    out = tmp_path / "integrated" / "combat.h5ad"
    run_baseline("combat", ordered, samples, "batch", "cell_type", out, seed=3)
    res = ad.read_h5ad(out)
    assert res.uns["status"] == "ok" and res.uns["method"] == "combat"
    assert res.uns["seed"] == 3
    assert list(res.obs_names) == list(adata.obs_names)
    assert list(res.var_names) == list(adata.var_names)
    assert isinstance(res.obs["batch"].dtype, pd.CategoricalDtype)
    assert isinstance(res.obs["cell_type"].dtype, pd.CategoricalDtype)
    assert res.obs.index.name == "sample_id"


def test_run_baseline_aligns_the_sample_table(tmp_path: Path, adata: ad.AnnData) -> None:
    ordered, samples = write_inputs(adata, tmp_path)
    table = pd.read_csv(samples, sep="\t").iloc[::-1]  # another order, one extra column
    table["extra"] = "x"
    table.to_csv(samples, sep="\t", index=False)
    loaded = load_normalized(ordered, samples, "batch", "cell_type")
    assert list(loaded.obs_names) == list(adata.obs_names)
    assert (loaded.obs["batch"].astype(str) == adata.obs["batch"].astype(str)).all()


def test_a_failing_method_is_recorded_not_raised(tmp_path: Path) -> None:
    adata = synthetic(n_per=10, groups=2, batches=2, genes=40)
    solo = adata[:1].copy()
    solo.obs_names = ["lonely"]
    solo.obs["batch"] = "b_solo"
    adata = ad.concat([adata, solo])
    ordered, samples = write_inputs(adata, tmp_path)
    out = tmp_path / "combat.h5ad"
    result = run_baseline("combat", ordered, samples, "batch", "cell_type", out, seed=0)
    assert result.uns["status"] == "failed"
    back = ad.read_h5ad(out)
    assert back.uns["status"] == "failed"
    assert back.uns["method"] == "combat"
    assert "\n" not in back.uns["error"]
    assert "'b_solo'" in back.uns["error"] and "at least 2 samples" in back.uns["error"]
    assert back.n_obs == adata.n_obs
    # harmony copes with the one-sample batch
    ok = run_baseline("harmony", ordered, samples, "batch", None, tmp_path / "h.h5ad", seed=0)
    assert ok.uns["status"] == "ok"


def test_scvi_without_counts_is_recorded_as_failed(tmp_path: Path, adata: ad.AnnData) -> None:
    ordered, samples = write_inputs(adata, tmp_path)
    out = tmp_path / "scvi.h5ad"
    run_baseline("scvi", ordered, samples, "batch", None, out, seed=0)
    back = ad.read_h5ad(out)
    assert back.uns["status"] == "failed"
    assert "raw counts" in back.uns["error"]
    assert back.uns["representation"] == "embedding"


def test_unreadable_input_is_an_input_error(tmp_path: Path, adata: ad.AnnData) -> None:
    ordered, samples = write_inputs(adata, tmp_path)
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    with pytest.raises(InputError, match="cannot read normalized matrix"):
        run_baseline("combat", bad, samples, "batch", None, tmp_path / "o.h5ad", seed=0)
    with pytest.raises(InputError, match="no column 'donor'"):
        run_baseline("combat", ordered, samples, "donor", None, tmp_path / "o.h5ad", seed=0)
    short = tmp_path / "short.tsv"
    pd.read_csv(samples, sep="\t").iloc[1:].to_csv(short, sep="\t", index=False)
    with pytest.raises(InputError, match=r"1 samples .* are missing"):
        run_baseline("combat", ordered, short, "batch", None, tmp_path / "o.h5ad", seed=0)
    with pytest.raises(InputError, match="does not exist"):
        run_baseline(
            "scvi",
            ordered,
            samples,
            "batch",
            None,
            tmp_path / "o.h5ad",
            seed=0,
            counts_path=tmp_path / "nope.parquet",
        )
    assert not (tmp_path / "o.h5ad").exists()


# --------------------------------------------------------------------------- CLI


def test_the_cli_offers_every_method() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command")
    method = next(a for a in commands.choices["baseline"]._actions if a.dest == "method")
    assert tuple(method.choices) == baselines.METHODS


def test_cli_combat_mod_protects_or_refuses(tmp_path: Path, capsys) -> None:
    adata, _ = confounded()
    ordered, samples = write_inputs(adata, tmp_path)
    out = tmp_path / "combat_mod.h5ad"
    common = ["baseline", "--method", "combat_mod", "--matrix", str(ordered)]
    common += ["--samples", str(samples), "--batch-key", "batch", "--out", str(out)]
    assert main([*common, "--protect", "cell_line"]) == 0
    assert ad.read_h5ad(out).uns["display_name"] == "combat_mod (mod: cell_line)"
    out.unlink()
    capsys.readouterr()
    assert main(common) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "protect: combat_mod needs at least one sample-sheet column" in err
    assert main([*common, "--protect", "donor"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "samples.tsv: no column 'donor'" in err
    assert not out.exists()
