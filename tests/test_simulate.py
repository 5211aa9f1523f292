"""``locusformer simulate``: synthetic multi-batch counts of any size, with the truth."""

from __future__ import annotations

import json

import anndata as ad
import numpy as np
import pandas as pd
import pytest
from conftest import ANNOTATION
from scipy import sparse
from workflow_helpers import _snakemake, _workdir

from locusformer import simulate as sim_module
from locusformer.cli import main
from locusformer.io import read_expression, read_sample_sheet
from locusformer.simulate import SIM_CHUNK, simulate_counts, write_counts, write_simulation


def _counts(sim) -> np.ndarray:
    return sparse.vstack([block for _, block in sim.chunks()]).toarray()


def test_structure_is_reproducible_and_real_genes_are_used(annotation_table):
    a = simulate_counts(n_samples=400, n_genes=300, n_batches=3, n_groups=4, seed=5)
    b = simulate_counts(n_samples=400, n_genes=300, n_batches=3, n_groups=4, seed=5)
    c = simulate_counts(n_samples=400, n_genes=300, n_batches=3, n_groups=4, seed=6)
    X = _counts(a)
    assert X.shape == (400, 300) and X.dtype == np.float32
    assert np.array_equal(X, _counts(b)) and not np.array_equal(X, _counts(c))
    assert (X >= 0).all() and np.array_equal(X, np.round(X))
    assert 0.05 < (X > 0).mean() < 0.8  # sparse, as single-cell counts are
    # Real human genes with their coordinates, unique, on assembled chromosomes.
    genes = a.genes
    assert genes["gene_id"].is_unique and genes["gene_id"].str.startswith("ENSG").all()
    table = annotation_table.drop_duplicates("ensembl_id").set_index("ensembl_id")
    assert (table.loc[genes["gene_id"], "symbol"].to_numpy() == genes["symbol"].to_numpy()).all()
    assert genes["chrom"].isin(sim_module.SIM_CHROMOSOMES).all()
    # The truth: every batch present, groups recorded, as sheet columns.
    assert list(a.samples.columns) == ["sample_id", "batch", "group"]
    assert set(a.samples["batch"]) == {"batch1", "batch2", "batch3"}
    assert a.samples["group"].nunique() == 4


def test_groups_and_batches_leave_their_marks():
    sim = simulate_counts(n_samples=3000, n_genes=400, n_batches=2, n_groups=2, seed=1)
    counts = _counts(sim)
    X = np.log1p(counts / counts.sum(axis=1, keepdims=True) * 1e4)
    batch, group = sim.batch_code, sim.group_code
    # Within a batch, the groups differ on their programme genes as drawn: the log ratio of
    # mean counts follows the truth's log fold change (expressed genes; few counts are noise).
    b = max(range(2), key=lambda b: min(((batch == b) & (group == k)).sum() for k in range(2)))
    mean = [counts[(batch == b) & (group == k)].mean(axis=0) for k in range(2)]
    programme = (sim.effect != 0).any(axis=0) & (counts[batch == b].mean(axis=0) > 0.5)
    assert programme.sum() >= 10
    seen = np.log(mean[0][programme] / mean[1][programme])
    drawn = (sim.effect[0] - sim.effect[1])[programme]
    assert np.corrcoef(seen, drawn)[0, 1] > 0.8
    # Within one group, the batches differ gene by gene (the batch shifts).
    g0 = group == 0
    diff = X[g0 & (batch == 0)].mean(axis=0) - X[g0 & (batch == 1)].mean(axis=0)
    expressed = X[g0].mean(axis=0) > 0.5
    assert np.abs(diff[expressed]).mean() > 0.2
    # Dropout differs by batch and is recorded.
    truth = sim.truth()
    assert set(truth["batches"]) == {"batch1", "batch2"}
    assert sum(v["n_samples"] for v in truth["batches"].values()) == 3000
    assert truth["groups"]["group1"]["programme_genes"]


def test_h5ad_written_in_chunks_equals_the_parquet(tmp_path):
    sim = simulate_counts(n_samples=SIM_CHUNK + 37, n_genes=40, seed=2)  # two chunks
    write_counts(sim, tmp_path / "x.h5ad")
    write_counts(sim, tmp_path / "x.parquet")
    h5 = ad.read_h5ad(tmp_path / "x.h5ad")
    assert sparse.issparse(h5.X) and h5.shape == (SIM_CHUNK + 37, 40)
    assert list(h5.obs.columns) == ["batch", "group"]
    assert h5.obs["batch"].tolist() == sim.samples["batch"].tolist()
    assert json.loads(h5.uns["simulation"])["seed"] == 2
    parquet = pd.read_parquet(tmp_path / "x.parquet").set_index("gene_id")
    assert parquet.index.tolist() == h5.var_names.tolist() == sim.genes["gene_id"].tolist()
    assert parquet.columns.tolist() == h5.obs_names.tolist()
    assert np.array_equal(parquet.to_numpy().T, h5.X.toarray())
    # The workflow's reader takes both.
    a, b = read_expression(tmp_path / "x.h5ad"), read_expression(tmp_path / "x.parquet")
    assert np.array_equal(a.X.toarray(), b.X)


def test_parquet_is_refused_for_many_samples(tmp_path, monkeypatch):
    monkeypatch.setattr(sim_module, "PARQUET_MAX_SAMPLES", 100)
    sim = simulate_counts(n_samples=101, n_genes=10)
    with pytest.raises(sim_module.InputError, match=r"use \.h5ad"):
        write_counts(sim, tmp_path / "x.parquet")
    assert not list(tmp_path.iterdir())


def test_bad_settings_are_refused(tmp_path):
    with pytest.raises(sim_module.InputError, match="dropout"):
        simulate_counts(dropout=1.5)
    with pytest.raises(sim_module.InputError, match="places only"):
        simulate_counts(n_genes=10_000_000)
    with pytest.raises(sim_module.InputError, match="h5ad"):
        write_simulation(simulate_counts(n_samples=5, n_genes=5), tmp_path / "x.csv", "s.tsv")


def test_cli_writes_a_dataset_row_the_workflow_accepts(tmp_path, capsys):
    out = tmp_path / "sim"
    code = main(
        [
            "simulate",
            "--n-samples", "300",
            "--n-genes", "200",
            "--n-batches", "2",
            "--n-groups", "3",
            "--seed", "4",
            "--genes", str(ANNOTATION),
            "--out-expression", str(out / "counts.h5ad"),
            "--out-samples", str(out / "samples.tsv"),
            "--out-truth", str(out / "truth.json"),
            "--out-row", str(out / "datasets.tsv"),
            "--name", "sim4",
        ]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    row = pd.read_csv(out / "datasets.tsv", sep="\t", dtype=str)
    assert row.loc[0, "name"] == "sim4" and row.loc[0, "value_type"] == "counts"
    sheet = read_sample_sheet(row.loc[0, "samples"], sample_column=row.loc[0, "sample_column"])
    assert set(sheet.columns) >= {row.loc[0, "batch_key"], row.loc[0, "label_key"]}
    truth = json.loads((out / "truth.json").read_text())
    assert truth["params"]["n_samples"] == 300 and truth["n_genes"] == 200
    # The sheet passes the workflow's schema and the whole chain is planned from it.
    workdir = _workdir(tmp_path / "wd", {}, row.to_dict(orient="records"))
    result = _snakemake(workdir, "-n", "--quiet", "rules")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "train" in result.stdout
    # normalize reads it as it is.
    code = main(
        [
            "normalize",
            "--expression", row.loc[0, "expression"],
            "--samples", row.loc[0, "samples"],
            "--batch-key", "batch",
            "--label-key", "group",
            "--value-type", "counts",
            "--n-top-genes", "100",
            "--out-matrix", str(tmp_path / "n" / "normalized.parquet"),
            "--out-samples", str(tmp_path / "n" / "samples.tsv"),
            "--out-stats", str(tmp_path / "n" / "stats.json"),
        ]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    stats = json.loads((tmp_path / "n" / "stats.json").read_text())
    assert stats["n_samples"] == 300 and stats["n_genes_kept"] == 100


def test_cli_refuses_bad_input_with_one_line(tmp_path, capsys):
    code = main(
        [
            "simulate",
            "--n-samples", "10",
            "--out-expression", str(tmp_path / "x.tsv"),
            "--out-samples", str(tmp_path / "s.tsv"),
        ]
    )  # fmt: skip
    assert code == 2
    assert "error:" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
