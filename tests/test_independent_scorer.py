"""The independent scorer of benchmarks/scoring: one gene set for every method, chosen from
the uncorrected data; extra genes ignored; embeddings scored as they are; scib-metrics'
own single-start k-means."""

from __future__ import annotations

import sys
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "scoring"))
import independent

from locusformer.simulate.datasets import simulate

N_TOP = 60


@pytest.fixture(scope="module")
def data() -> ad.AnnData:
    sim = simulate(n_samples=120, n_loci=150, n_batches=2, n_groups=3, seed=1)
    obs = pd.DataFrame(
        {"batch": sim.batch.astype(str), "cell_line": sim.group.astype(str)},
        index=[f"s{i}" for i in range(sim.X.shape[0])],
    )
    adata = ad.AnnData(X=np.clip(sim.X, 0, None), obs=obs)
    adata.var_names = [f"g{j}" for j in range(sim.X.shape[1])]
    return adata


@pytest.fixture(scope="module")
def scorer(data: ad.AnnData) -> independent.Scorer:
    return independent.Scorer(data, "batch", "cell_line", n_top_genes=N_TOP, n_comps=10)


@pytest.fixture(scope="module")
def scored(data: ad.AnnData, scorer: independent.Scorer) -> pd.DataFrame:
    full = data.to_df()
    rng = np.random.default_rng(0)
    outputs = {
        # every gene, in a shuffled order: the chosen ones are scored, the rest ignored
        "all genes": full[rng.permutation(full.columns)],
        "chosen genes only": full[scorer.genes],
        "lacks five": full[scorer.genes[5:]],
        "embedding": rng.normal(size=(data.n_obs, 4)).astype(np.float32),
    }
    return independent.score_outputs(data, outputs, scorer=scorer, task="sim")


def value(long: pd.DataFrame, method: str, variant: str, metric: str) -> float:
    row = long[(long["method"] == method) & (long["variant"] == variant)]
    return float(row.loc[row["metric"] == metric, "value"].iloc[0])


def test_one_gene_set_chosen_from_the_uncorrected_data(data, scorer, scored):
    import scanpy as sc

    table = sc.pp.highly_variable_genes(data, n_top_genes=N_TOP, flavor="seurat", inplace=False)
    assert list(scorer.genes) == list(data.var_names[table["highly_variable"].to_numpy()])
    assert len(scorer.genes) == N_TOP
    chosen = scored[scored["metric"] == "n_genes_chosen"]
    assert set(chosen["method"]) == {"all genes", "chosen genes only", "lacks five", "embedding"}
    assert (chosen["value"] == N_TOP).all()
    # A method lacking genes is scored on the intersection, and says how many it lacked.
    assert value(scored, "lacks five", "info", "n_genes_missing") == 5
    assert value(scored, "lacks five", "info", "n_genes_scored") == N_TOP - 5
    assert value(scored, "all genes", "info", "n_genes_missing") == 0


def test_extra_genes_change_nothing(scored):
    for variant in independent.VARIANTS:
        a = value(scored, "all genes", variant, "Total")
        b = value(scored, "chosen genes only", variant, "Total")
        assert a == pytest.approx(b, abs=1e-6)
    assert value(scored, "all genes", "info", "n_genes_scored") == N_TOP


def test_an_embedding_is_scored_as_it_is(data, scorer, scored):
    emb = np.random.default_rng(3).normal(size=(data.n_obs, 4)).astype(np.float32)
    x, _, info = scorer.representation(emb)
    assert np.array_equal(x, emb)
    assert np.isnan(info["n_genes_scored"])
    # The same rows as a result AnnData, in another order: the rows are matched by name.
    result = ad.AnnData(obs=data.obs.iloc[::-1].copy())
    result.obsm["X_emb"] = emb[::-1]
    result.uns["representation"] = "embedding"
    x2, _, _ = scorer.representation(result)
    assert np.array_equal(x2, emb)
    assert value(scored, "embedding", "info", "n_dims") == 4
    # Scoring leaves it as it was (scib-metrics' k-means centres its input in place).
    before = emb.copy()
    scorer.score(emb)
    assert np.array_equal(emb, before)


def test_single_start_kmeans_is_scib_metrics_own(data, scorer, scored):
    import scib_metrics

    x, _, _ = scorer.representation(data.to_df())
    assert x.shape[1] == 10
    ours = scorer.metrics(x, scorer.x_pre())
    theirs = scib_metrics.nmi_ari_cluster_labels_kmeans(x, scorer.labels)
    assert ours["KMeans NMI (1)"] == pytest.approx(theirs["nmi"], abs=1e-12)
    assert ours["KMeans ARI (1)"] == pytest.approx(theirs["ari"], abs=1e-12)
    assert value(scored, "all genes", "silhouette_k1", "KMeans NMI") == pytest.approx(
        theirs["nmi"], abs=1e-12
    )


def test_totals_weigh_batch_and_bio_as_scib(scored):
    wide = independent.totals(scored)
    assert set(wide["variant"]) == set(independent.VARIANTS)
    row = wide.iloc[0]
    assert row["total"] == pytest.approx(0.4 * row["batch"] + 0.6 * row["bio"])
    sil = value(scored, "all genes", "silhouette_k10", "Silhouette batch")
    bras = value(scored, "all genes", "bras_k10", "BRAS")
    assert np.isfinite(sil) and np.isfinite(bras)
