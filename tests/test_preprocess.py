from __future__ import annotations

import logging

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scanpy as sc
from scipy import sparse

from locusformer.errors import InputError
from locusformer.pp.normalize import NormalizeParams, attach_samples, normalize


def _adata(x, samples=None, genes=None, batches=None) -> ad.AnnData:
    x = np.asarray(x, dtype=np.float32)
    samples = samples or [f"s{i}" for i in range(x.shape[0])]
    genes = genes or [f"g{j}" for j in range(x.shape[1])]
    obs = pd.DataFrame(index=samples)
    if batches is not None:
        obs["batch"] = pd.Categorical(batches)
    return ad.AnnData(X=x, obs=obs, var=pd.DataFrame(index=genes))


def test_library_size_normalization_then_log1p_by_hand():
    # Sample s0: counts 1 and 3 sum to 4 -> scaled to target 8: 2 and 6.
    # Sample s1: counts 2 and 2 -> 4 and 4.
    adata = _adata([[1, 3], [2, 2]], batches=["a", "b"])
    params = NormalizeParams(target_sum=8, min_samples=1, n_top_genes=0)
    out, stats = normalize(adata, "counts", "batch", params)
    expected = np.log1p(np.array([[2.0, 6.0], [4.0, 4.0]], dtype=np.float32))
    np.testing.assert_allclose(out.X, expected, rtol=1e-6)
    np.testing.assert_array_equal(out.layers["counts"], [[1, 3], [2, 2]])
    assert stats["n_genes_kept"] == 2 and stats["samples_per_batch"] == {"a": 1, "b": 1}


def test_log_expression_is_kept_as_is_and_sparse_input_works():
    x = np.array([[0.5, 0.0, 2.0], [1.5, 0.0, 0.25], [0.0, 0.0, 1.0]], dtype=np.float32)
    adata = _adata(x, batches=["a", "a", "b"])
    adata.X = sparse.csr_matrix(adata.X)
    out, stats = normalize(adata, "log_expression", "batch", NormalizeParams(min_samples=1))
    assert isinstance(out.X, np.ndarray) and out.X.dtype == np.float32
    np.testing.assert_array_equal(out.X, x[:, [0, 2]])
    assert "counts" not in out.layers
    assert stats["genes_dropped"] == {"not_expressed": 1, "not_highly_variable": 0}


def test_gene_filter_and_highly_variable_selection():
    rng = np.random.default_rng(1)
    counts = rng.poisson(3, size=(40, 50)).astype(np.float32)
    counts[:, :10] *= rng.integers(0, 6, size=(40, 10))  # ten genes far more variable
    counts[:38, 49] = 0  # expressed in 2 samples only
    adata = _adata(counts, batches=["a"] * 20 + ["b"] * 20)
    out, stats = normalize(adata, "counts", "batch", NormalizeParams(min_samples=3, n_top_genes=10))
    assert out.n_vars == 10
    assert "g49" not in out.var_names
    assert stats["genes_dropped"] == {"not_expressed": 1, "not_highly_variable": 39}
    # The selection is scanpy's batch-aware call on the normalized, filtered data.
    reference = adata[:, adata.var_names != "g49"].copy()
    sc.pp.normalize_total(reference, target_sum=1e4)
    sc.pp.log1p(reference)
    table = sc.pp.highly_variable_genes(
        reference, n_top_genes=10, batch_key="batch", flavor="seurat", inplace=False
    )
    assert set(out.var_names) == set(reference.var_names[table["highly_variable"].to_numpy()])
    everything, _ = normalize(adata, "counts", "batch", NormalizeParams(n_top_genes=0))
    assert everything.n_vars == 49


def test_negative_counts_are_refused():
    with pytest.raises(InputError, match="negative values in a matrix declared as value_type"):
        normalize(
            _adata([[1, -1], [2, 2]], batches=["a", "b"]), "counts", "batch", NormalizeParams()
        )


def test_nothing_left_after_filtering_is_refused():
    adata = _adata([[1, 0], [0, 1]], batches=["a", "b"])
    with pytest.raises(InputError, match="no gene is expressed in at least 3 samples"):
        normalize(adata, "counts", "batch", NormalizeParams(min_samples=3))


SHEET = pd.DataFrame(
    {"batch": ["a", "a", "b"], "label": ["x", "y", "x"]}, index=pd.Index(["s0", "s1", "s2"])
)


def _attach(adata, sheet=SHEET, batch_key="batch", label_key="label"):
    return attach_samples(
        adata, sheet, batch_key, label_key, matrix_path="m.csv", sheet_path="s.tsv"
    )


def test_sheet_is_joined_in_matrix_order():
    adata = _adata(np.ones((3, 2)), samples=["s2", "s0", "s1"])
    out = _attach(adata)
    assert out.obs["batch"].tolist() == ["b", "a", "a"]
    assert out.obs["label"].tolist() == ["x", "x", "y"]


def test_samples_missing_on_either_side_are_listed():
    adata = _adata(np.ones((7, 2)), samples=[f"s{i}" for i in range(7)])
    with pytest.raises(InputError, match=r"s\.tsv: 4 sample\(s\) of m\.csv missing from the sheet"):
        _attach(adata)
    sheet = pd.DataFrame({"batch": ["a", "b"] * 4, "label": "x"}, index=[f"s{i}" for i in range(8)])
    sheet.loc["z1"] = ["a", "x"]
    adata = _adata(np.ones((2, 2)), samples=["s0", "s1"])
    with pytest.raises(InputError, match=r"and 2 more") as info:
        _attach(adata, sheet=sheet)
    assert str(info.value).startswith("m.csv: 7 sample(s) of s.tsv missing from the matrix")


def test_missing_columns_and_single_batch_are_refused():
    adata = _adata(np.ones((3, 2)), samples=["s0", "s1", "s2"])
    with pytest.raises(InputError, match="batch_key column 'plate' not found"):
        _attach(adata, batch_key="plate")
    with pytest.raises(InputError, match="label_key column 'cell_type' not found"):
        _attach(adata, label_key="cell_type")
    one_batch = SHEET.assign(batch="a")
    with pytest.raises(InputError, match="has 1 batch; at least 2 are needed"):
        _attach(adata, sheet=one_batch)


def test_a_single_sample_batch_is_kept_with_a_warning(caplog):
    adata = _adata(np.ones((3, 2)), samples=["s0", "s1", "s2"])
    with caplog.at_level(logging.WARNING):
        out = _attach(adata)
    assert out.n_obs == 3
    assert "single sample" in caplog.text and "'b'" in caplog.text
