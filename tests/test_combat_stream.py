"""ComBat streamed over gene blocks (locusformer.pp.combat) against scanpy.pp.combat
(issue 15)."""

from __future__ import annotations

import warnings

import anndata as ad
import numpy as np
import pandas as pd
import pytest

from locusformer.baselines import methods as baselines
from locusformer.baselines.methods import run_method
from locusformer.pp.combat import NonFiniteError, combat, eb_estimates, gene_summaries

BLOCKS = [1, 7, 10_000]  # one gene, a block that does not divide the genes, all at once


def scanpy_combat(x: np.ndarray, batches: np.ndarray, cov: np.ndarray | None) -> np.ndarray:
    """scanpy.pp.combat as ``baselines._combat`` called it before the streamed version."""
    import scanpy as sc

    index = [f"s{i}" for i in range(len(batches))]
    obs = pd.DataFrame({"batch": batches.astype(str)}, index=index)
    names = []
    for j in range(0 if cov is None else cov.shape[1]):
        names.append(f"__protect0_{j + 1}")
        obs[names[-1]] = cov[:, j]
    work = ad.AnnData(X=np.asarray(x, dtype=np.float64), obs=obs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = sc.pp.combat(work, key="batch", covariates=names or None, inplace=False)
    return np.asarray(out, dtype=np.float64).astype(np.float32)


def simulate(
    seed: int, sizes: list[int], genes: int, levels: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Log-expression-like data: gene means and scales, a shift and a scale per batch,
    samples shuffled across batches; ``levels`` > 1 adds a treatment-coded covariate."""
    rng = np.random.default_rng(seed)
    batches = np.repeat(np.arange(len(sizes)), sizes)
    rng.shuffle(batches)
    n = len(batches)
    x = rng.normal(size=(n, genes)) * rng.uniform(0.3, 2.0, genes) + rng.uniform(0, 6, genes)
    x += rng.normal(0, 0.8, (len(sizes), genes))[batches]
    x *= rng.uniform(0.7, 1.4, (len(sizes), genes))[batches]
    cov = None
    if levels > 1:
        group = rng.integers(0, levels, n)
        x += rng.normal(0, 1.5, (levels, genes))[group]
        cov = (group[:, None] == np.arange(1, levels)).astype(np.float64)
    return x, batches, cov


CASES = {
    "3 batches": (0, [40, 95, 17], 30, 0),
    "5 batches, unequal": (1, [12, 300, 45, 80, 3], 23, 0),
    "4 batches, covariate": (2, [60, 25, 110, 40], 31, 3),
    "3 batches, 2-level covariate": (3, [33, 70, 51], 18, 2),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("block_size", BLOCKS)
def test_equals_scanpy(case: str, block_size: int) -> None:
    x, batches, cov = simulate(*CASES[case])
    expected = scanpy_combat(x, batches, cov)
    got = combat(x, batches, cov, block_size=block_size)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert np.abs(got - x).max() > 0.1  # it did correct


@pytest.mark.parametrize("layout", ["C32", "F32", "F64"])
def test_equals_scanpy_in_any_layout(layout: str) -> None:
    x, batches, cov = simulate(4, [50, 20, 75, 33], 26, 3)
    dtype = np.float32 if layout.endswith("32") else np.float64
    x = np.asarray(x, dtype=dtype, order=layout[0])
    expected = scanpy_combat(x, batches, cov)  # on the same (rounded) input
    for block_size in BLOCKS:
        got = combat(x, batches, cov, block_size=block_size)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_in_place_and_sorted_batches() -> None:
    x, batches, _ = simulate(5, [30, 41, 22], 15)
    order = np.argsort(batches, kind="stable")  # rows already sorted: no fancy indexing
    x, batches = x[order].astype(np.float32), batches[order]
    expected = scanpy_combat(x, batches, None)
    got = combat(x, batches, None, block_size=4, out=x)
    assert got is x
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block_size", BLOCKS)
@pytest.mark.parametrize("levels", [0, 3])
def test_baseline_equals_scanpy_with_a_gene_constant_in_one_batch(
    block_size: int, levels: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``_combat`` as a whole: constant genes copied, the others as scanpy on them alone."""
    monkeypatch.setattr(baselines, "COMBAT_BLOCK", block_size)
    x, batches, cov = simulate(6, [35, 80, 20, 55], 24, levels)
    x = x.astype(np.float32)
    x[batches == 2, 5] = 0.0  # not expressed in one batch
    x[batches == 0, 17] = 1.25
    obs = pd.DataFrame(
        {"batch": [f"b{b}" for b in batches]}, index=[f"s{i}" for i in range(len(batches))]
    )
    covariates = []
    if cov is not None:
        obs["cell_line"] = [f"line{i}" for i in cov @ np.arange(1, levels)]
        covariates = ["cell_line"]
    adata = ad.AnnData(X=x, obs=obs)
    method = "combat_mod" if covariates else "combat"
    res = run_method(method, adata, "batch", seed=0, covariates=covariates)
    got = np.asarray(res.X)
    assert got.dtype == np.float32 and res.uns["n_genes_unadjusted"] == 2
    adjust = np.ones(x.shape[1], dtype=bool)
    adjust[[5, 17]] = False
    np.testing.assert_array_equal(got[:, ~adjust], x[:, ~adjust])
    expected = scanpy_combat(x[:, adjust], batches, cov)
    np.testing.assert_allclose(got[:, adjust], expected, rtol=1e-5, atol=1e-5)


def test_summaries_are_scanpys() -> None:
    """Pass 1's per-gene numbers are scanpy's _standardize_data and first estimates."""
    from scanpy.preprocessing._combat import _standardize_data

    x, batches, cov = simulate(7, [25, 60, 40], 12, 3)
    summ = gene_summaries(x, batches, cov, block_size=5)
    obs = pd.DataFrame({"batch": batches.astype(str), "c1": cov[:, 0], "c2": cov[:, 1]})
    data = pd.DataFrame(x.T)
    s_data, _, var_pooled, _ = _standardize_data(obs, data, "batch")
    s = s_data.to_numpy()  # (G, n)
    for j in range(3):
        sb = s[:, batches == j]
        np.testing.assert_allclose(summ.gamma_hat[j], sb.mean(axis=1), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(summ.delta_hat[j], sb.var(axis=1, ddof=1), rtol=1e-10)
    np.testing.assert_allclose(summ.var_pooled, var_pooled.ravel(), rtol=1e-12)
    assert not summ.constant.any()


def test_refusals() -> None:
    x, batches, _ = simulate(8, [10, 12], 6)
    bad = x.copy()
    bad[3, 4] = np.nan
    with pytest.raises(NonFiniteError):
        combat(bad, batches, block_size=2)
    with pytest.raises(ValueError, match="at least 2 samples"):
        combat(x[:11], np.r_[np.zeros(10), 1], block_size=2)
    with pytest.raises(ValueError, match="block_size"):
        combat(x, batches, block_size=0)
    flat = np.repeat(x[:, :1], 6, axis=1)
    flat[batches == 0] = 2.0
    with pytest.raises(ValueError, match="every gene is constant"):
        eb_estimates(gene_summaries(flat, batches))
