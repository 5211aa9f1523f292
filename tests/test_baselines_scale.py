"""Baselines at atlas scale (issue 15): the streamed paths above baselines.STREAM_VALUES,
run here on small data by lowering the threshold, against the in-memory computation; and
below it, bitwise the numbers of the code before the streamed paths existed."""

from __future__ import annotations

from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest

from locusformer.baselines import methods as baselines
from locusformer.baselines.methods import run_method
from locusformer.errors import InputError
from locusformer.pp import combat
from locusformer.pp.pca import n_pcs, pca, pca_scaled_blocks
from locusformer.simulate.datasets import simulate
from locusformer.steps.baseline import run_baseline

METHODS = ["uncorrected", "combat", "harmony"]


def simulated(n: int = 400, genes: int = 60, batches: int = 3, seed: int = 1) -> ad.AnnData:
    sim = simulate(n, genes, n_batches=batches, n_groups=4, seed=seed)
    obs = pd.DataFrame(
        {"batch": [f"b{b}" for b in sim.batch], "label": [f"g{g}" for g in sim.group]},
        index=[f"s{i}" for i in range(n)],
    )
    adata = ad.AnnData(np.asarray(sim.X, dtype=np.float32), obs=obs)
    adata.var_names = [f"G{i}" for i in range(genes)]
    return adata


@pytest.fixture(scope="module")
def adata() -> ad.AnnData:
    return simulated()


@pytest.fixture
def streamed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every matrix takes the streamed paths; ComBat's blocks hold 7 genes of 400 rows."""
    monkeypatch.setattr(baselines, "STREAM_VALUES", 0)
    monkeypatch.setattr(baselines, "COMBAT_BLOCK_VALUES", 400 * 7)


def explicitly_scaled(x: np.ndarray) -> np.ndarray:
    """The scaled, clipped float64 matrix, as ``_harmony`` made it before (issue 15)."""
    x = np.asarray(x, dtype=np.float64)
    sd = x.std(axis=0, ddof=1)
    sd[sd == 0] = 1.0
    return np.clip((x - x.mean(axis=0)) / sd, -10, 10)


def harmony_before(adata: ad.AnnData, seed: int) -> np.ndarray:
    """``_harmony``'s embedding as the code computed it before the streamed path."""
    import harmonypy

    x = np.asarray(adata.X).astype(np.float64)
    pcs = pca(explicitly_scaled(x), n_pcs(*x.shape), seed)
    n = x.shape[0]
    nclust = int(min(max(2, round(n / 30)), 100, n - 1))
    meta = pd.DataFrame({"batch": adata.obs["batch"].astype(str).values})
    ho = harmonypy.run_harmony(pcs, meta, "batch", nclust=nclust, random_state=seed, verbose=False)
    return np.asarray(ho.Z_corr, dtype=np.float32)


# --------------------------------------------------------------------------- streamed PCA


def with_outliers_and_a_constant(x: np.ndarray) -> np.ndarray:
    x = np.array(x, dtype=np.float32)
    # one outlier in a column of 400 lies ~20 SD out: clipped, moving the column mean off 0
    x[0, 0], x[1, 1], x[2, 2] = 1e3, -1e3, 1e3
    x[:, 5] = 2.5  # constant: sd 1, scaled to (nearly) 0
    return x


@pytest.mark.parametrize("block_rows", [1, 37, None, 10_000])
def test_streamed_pca_equals_arpack(adata: ad.AnnData, block_rows: int | None) -> None:
    x = with_outliers_and_a_constant(adata.X)
    scaled = explicitly_scaled(x)
    assert (np.abs(scaled) == 10).sum() == 3  # the clipping is exercised
    k = n_pcs(*x.shape)
    expected = pca(scaled, k, seed=0)
    got = pca_scaled_blocks(x, k, max_value=10, block_rows=block_rows)
    assert got.shape == expected.shape == (x.shape[0], k) and got.dtype == np.float64
    # the same signs (svd_flip), the same numbers to solver tolerance
    scale = np.abs(expected).max(axis=0)
    assert (np.abs(got - expected).max(axis=0) / scale).max() < 1e-9
    np.testing.assert_array_equal(x, with_outliers_and_a_constant(adata.X))  # x untouched


def test_streamed_pca_of_a_float64_memmap_and_its_refusals(tmp_path: Path) -> None:
    x = simulated(120, 25, seed=4).X.astype(np.float64)
    mm = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.float64, shape=x.shape)
    mm[:] = x
    got = pca_scaled_blocks(mm, 10, block_rows=16)
    expected = pca(explicitly_scaled(x), 10)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9 * np.abs(expected).max())
    bad = x.copy()
    bad[3, 4] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        pca_scaled_blocks(bad, 5)
    with pytest.raises(ValueError, match="cannot compute a PCA"):
        pca_scaled_blocks(x[:1], 5)


# --------------------------------------------------------------------------- streamed paths


def test_streamed_harmony_is_close_to_the_in_memory_one(adata: ad.AnnData, monkeypatch) -> None:
    in_memory = run_method("harmony", adata, "batch", seed=0).obsm["X_emb"]
    monkeypatch.setattr(baselines, "STREAM_VALUES", 0)
    got = run_method("harmony", adata, "batch", seed=0).obsm["X_emb"]
    assert got.shape == in_memory.shape
    np.testing.assert_allclose(got, in_memory, rtol=0, atol=1e-4 * np.abs(in_memory).max())


def test_streamed_harmony_refuses_non_finite_values(adata: ad.AnnData, streamed) -> None:
    bad = adata.copy()
    bad.X[2, 3] = np.inf
    with pytest.raises(InputError, match="non-finite"):
        run_method("harmony", bad, "batch", seed=0)


def test_combat_block_size() -> None:
    assert baselines.combat_block(50_000, 2_000) == baselines.COMBAT_BLOCK  # at the threshold
    assert baselines.combat_block(1_000_000, 2_000) == 2**25 // 1_000_000 == 33
    assert baselines.combat_block(10**9, 2_000) == 1


def test_combat_in_place_equals_combat_to_a_new_array(adata: ad.AnnData, streamed) -> None:
    assert baselines.combat_block(*adata.shape) == 7
    new = run_method("combat", adata, "batch", seed=0)
    mine = adata.copy()
    in_place = run_method("combat", mine, "batch", seed=0, overwrite=True)
    assert np.shares_memory(in_place.X, mine.X)  # written into the given matrix
    np.testing.assert_array_equal(in_place.X, new.X)
    assert new.X.tobytes() == in_place.X.tobytes()
    # and the block size changes no bit: ComBat in COMBAT_BLOCK genes at once
    codes = pd.Categorical(adata.obs["batch"].astype(str)).codes
    assert combat.combat(adata.X, codes, block_size=256).tobytes() == new.X.tobytes()


def test_combat_overwrite_needs_a_float32_ndarray(adata: ad.AnnData) -> None:
    x64 = ad.AnnData(adata.X.astype(np.float64), obs=adata.obs)
    before = x64.X.copy()
    res = run_method("combat", x64, "batch", seed=0, overwrite=True)
    np.testing.assert_array_equal(x64.X, before)  # a float64 matrix is not written over
    assert res.X.dtype == np.float32


@pytest.mark.parametrize("path", ["in memory", "streamed"])
@pytest.mark.parametrize("method", [*METHODS, "combat_mod"])
def test_run_method_leaves_the_callers_matrix_alone(
    adata: ad.AnnData, method: str, path: str, monkeypatch
) -> None:
    if path == "streamed":
        monkeypatch.setattr(baselines, "STREAM_VALUES", 0)
    mine = adata.copy()
    before = mine.X.copy()
    covariates = ["label"] if method == "combat_mod" else ()
    res = run_method(method, mine, "batch", seed=0, covariates=covariates)
    assert before.tobytes() == mine.X.tobytes()
    if method in ("uncorrected", "harmony"):  # the input itself, not a copy
        assert np.shares_memory(res.X, mine.X)
    else:
        assert not np.shares_memory(res.X, mine.X)


def test_run_baseline_combat_streamed_in_place(adata: ad.AnnData, tmp_path: Path, streamed) -> None:
    ordered, samples = tmp_path / "ordered.parquet", tmp_path / "samples.tsv"
    frame = pd.DataFrame(adata.X, index=pd.Index(adata.obs_names, name="sample_id"))
    frame.columns = adata.var_names
    frame.to_parquet(ordered)
    adata.obs.rename_axis("sample_id").reset_index().to_csv(samples, sep="\t", index=False)
    out = tmp_path / "combat.h5ad"
    run_baseline("combat", ordered, samples, "batch", "label", out, seed=0)
    back = ad.read_h5ad(out)
    assert back.uns["status"] == "ok"
    assert back.X.tobytes() == run_method("combat", adata, "batch", seed=0).X.tobytes()


# --------------------------------------------------------------------------- below it


@pytest.mark.parametrize("shape", [(400, 60, 3, 1), (1100, 2000, 5, 2)])
def test_below_the_threshold_the_results_are_bitwise_unchanged(shape) -> None:
    """The quality tasks (<= 1,100 x 2,000) and the demo get the numbers they always got."""
    data = simulated(*shape)
    assert data.X.size <= baselines.STREAM_VALUES
    codes = pd.Categorical(data.obs["batch"].astype(str)).codes
    before = {
        "uncorrected": data.X.astype(np.float32),
        "combat": combat.combat(data.X, codes, block_size=256),
    }
    for method in METHODS:
        res = run_method(method, data, "batch", seed=0)
        expected = before.get(method, data.X)
        assert res.X.dtype == np.float32 and res.X.tobytes() == expected.tobytes()
    emb = run_method("harmony", data, "batch", seed=0).obsm["X_emb"]
    assert emb.tobytes() == harmony_before(data, seed=0).tobytes()
