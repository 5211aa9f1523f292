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

from locusformer.cli.main import main
from locusformer.io.expression import read_expression, read_sample_sheet
from locusformer.pp.loci import CHROM_RANK
from locusformer.simulate import datasets as sim_module
from locusformer.simulate.datasets import (
    SIM_CHUNK,
    Simulation,
    simulate,
    simulate_counts,
    write_counts,
    write_simulation,
)
from locusformer.simulate.genome import SIM_CHROMOSOMES, draw_regions


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
    assert genes["chrom"].isin(SIM_CHROMOSOMES).all()
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


# -- regional batch effects ----------------------------------------------------------------


def _weighted_sum(x: np.ndarray) -> float:
    # Weights that change with the position: a permutation of the values changes the sum.
    x = np.asarray(x, dtype=np.float64)
    return float((x * (np.arange(x.size).reshape(x.shape) % 7)).sum())


def test_the_default_batch_effect_reproduces_the_output_before_regional_effects():
    # Fingerprints of the code before batch_effect existed (same seeds and sizes).
    sim = simulate()
    assert np.isclose(sim.X.astype(np.float64).sum(), 294869.22835620306, rtol=1e-9)
    assert np.isclose(_weighted_sum(sim.X), 884971.9766279752, rtol=1e-9)
    assert np.isclose(sim.signal.astype(np.float64).sum(), 300192.52383840084, rtol=1e-9)
    assert sim.batch[:12].tolist() == [0, 1, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0]
    assert sim.group[:12].tolist() == [0, 1, 0, 0, 0, 0, 2, 2, 1, 2, 1, 0]
    assert sim.loci["start"].iloc[:3].tolist() == [1804876, 3729491, 4796401]
    assert sim.regions is None
    explicit = simulate(batch_effect="gene")
    for name in ("X", "batch", "group", "signal"):
        assert np.array_equal(getattr(sim, name), getattr(explicit, name)), name
    assert sim.loci.equals(explicit.loci)
    # Built from its first five fields, as before, a Simulation has no regions.
    assert Simulation(*sim[:5]).regions is None

    counts = simulate_counts(n_samples=300, n_genes=200, n_batches=2, n_groups=3, seed=4)
    X = _counts(counts)
    assert X.sum() == 21503.0 and X.sum(axis=0)[:6].tolist() == [11, 60, 9, 16, 4, 7]
    assert _weighted_sum(X) == 65620.0
    assert np.isclose(counts.shift.sum(), -7.712881968153322, rtol=1e-9)
    assert np.isclose(counts.scale.sum(), 419.15161631675613, rtol=1e-9)
    assert counts.genes["gene_id"].iloc[:2].tolist() == ["ENSG00000007129", "ENSG00000008323"]
    assert counts.samples["group"].iloc[:4].tolist() == ["group3", "group2", "group2", "group1"]
    assert counts.regions is None and "regions" not in counts.truth()


def test_regional_shifts_are_constant_within_a_segment_and_as_recorded():
    kw = dict(n_samples=120, n_loci=400, n_batches=3, group_effect=0.0, seed=3)
    regional = simulate(batch_effect="regional", region_size=20, **kw)
    # Without a batch effect the same draws give mu + noise: what regional added is known.
    clean = simulate(batch_effect="regional", region_size=20, batch_shift=0, batch_scale=0, **kw)
    eps = clean.X - clean.signal  # group_effect=0: signal is mu
    regions = regional.regions
    bounds = ["chrom", "start_index", "end_index"]
    assert regions is not None and regions[bounds].equals(clean.regions[bounds])
    assert 10 <= regions["n_loci"].mean() <= 30  # about region_size
    shift = np.zeros((3, 400))
    scale = np.ones((3, 400))
    for row in regions.itertuples():
        for b in range(3):
            shift[b, row.start_index : row.end_index] = getattr(row, f"shift_{b}")
            scale[b, row.start_index : row.end_index] = getattr(row, f"scale_{b}")
    b = regional.batch
    expected = regional.signal + shift[b] + scale[b] * eps
    np.testing.assert_allclose(regional.X, expected, rtol=1e-5, atol=1e-5)
    # X is the segments' values and nothing else (constant on each); neighbours differ.
    values = regions[[f"shift_{b}" for b in range(3)]].to_numpy()
    assert (np.abs(np.diff(values, axis=0)) > 1e-6).all()
    # Unplaced loci got none (X matched there too); the rest is the gene-wise data set.
    unplaced = ~regional.loci["placed"].to_numpy()
    assert unplaced.any() and (shift[:, unplaced] == 0).all()
    gene = simulate(**kw)
    assert np.array_equal(gene.batch, regional.batch) and np.array_equal(
        gene.signal, regional.signal
    )
    # "both" adds the gene-wise effect to the same segments.
    both = simulate(batch_effect="both", region_size=20, **kw)
    assert both.regions.equals(regions) and not np.allclose(both.X, regional.X)


@pytest.mark.parametrize("kind", ["segments", "arms"])
def test_segments_tile_each_chromosome_and_never_cross_one(kind):
    loci = simulate(n_samples=4, n_loci=3000, n_chromosomes=5, seed=2).loci
    regions = draw_regions(loci["chrom"], 30.0, kind, np.random.default_rng(0))
    chrom = loci["chrom"].to_numpy()
    covered = np.zeros(len(loci), dtype=int)
    for row in regions.itertuples():
        assert row.end_index > row.start_index and row.n_loci == row.end_index - row.start_index
        assert set(chrom[row.start_index : row.end_index]) == {row.chrom}
        covered[row.start_index : row.end_index] += 1
    # Every placed locus in exactly one segment, no unplaced one in any.
    assert (covered == loci["placed"].to_numpy()).all()
    per_chrom = regions.groupby("chrom")["region"].count()
    if kind == "arms":
        assert (per_chrom == 2).all()
        p_arm = (
            regions.groupby("chrom")["n_loci"].first() / regions.groupby("chrom")["n_loci"].sum()
        )
        assert p_arm.between(0.29, 0.71).all()
    else:
        assert 24 <= regions["n_loci"].mean() <= 36 and regions["n_loci"].nunique() > 10


def test_cli_writes_the_regional_truth_that_was_applied(tmp_path, capsys):
    out = tmp_path / "sim"
    args = ["--n-samples", "200", "--n-genes", "300", "--n-batches", "3", "--seed", "2"]
    code = main(
        [
            "simulate", *args,
            "--batch-effect", "regional",
            "--region-size", "15",
            "--out-expression", str(out / "counts.h5ad"),
            "--out-samples", str(out / "samples.tsv"),
            "--out-truth", str(out / "truth.json"),
            "--out-regions", str(out / "regions.tsv"),
        ]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    sim = simulate_counts(
        n_samples=200, n_genes=300, n_batches=3, seed=2, batch_effect="regional", region_size=15
    )
    written = pd.read_csv(out / "regions.tsv", sep="\t")
    pd.testing.assert_frame_equal(written, sim.regions, check_dtype=False)
    truth = json.loads((out / "truth.json").read_text())
    assert truth["params"]["batch_effect"] == "regional" and truth["params"]["region_size"] == 15
    assert len(truth["regions"]) == len(written)
    assert truth["regions"][0]["shift"]["batch2"] == pytest.approx(written.loc[0, "shift_batch2"])
    # The model's shift and scale, in genomic order, are the segments' values.
    genomic = sim.genes.assign(rank=sim.genes["chrom"].map(CHROM_RANK))
    genomic = genomic.sort_values(["rank", "start", "gene_id"]).index.to_numpy()
    shift, scale = sim.shift[:, genomic], sim.scale[:, genomic]
    ids = sim.genes["gene_id"].to_numpy()[genomic]
    for row in written.itertuples():
        span = slice(row.start_index, row.end_index)
        assert ids[row.start_index] == row.first_gene and ids[row.end_index - 1] == row.last_gene
        assert set(sim.genes["chrom"].to_numpy()[genomic][span]) == {row.chrom}
        for b in ("batch1", "batch2", "batch3"):
            np.testing.assert_allclose(shift[int(b[-1]) - 1, span], getattr(row, f"shift_{b}"))
            np.testing.assert_allclose(scale[int(b[-1]) - 1, span], getattr(row, f"scale_{b}"))
    # The samples, groups and programmes are those of the gene-wise data set.
    gene = simulate_counts(n_samples=200, n_genes=300, n_batches=3, seed=2)
    assert gene.samples.equals(sim.samples) and np.array_equal(gene.effect, sim.effect)
    assert not np.array_equal(_counts(gene), _counts(sim))


def test_bad_regional_settings_are_refused(tmp_path, capsys):
    with pytest.raises(sim_module.InputError, match="batch_effect"):
        simulate_counts(batch_effect="position")
    with pytest.raises(sim_module.InputError, match="region_size"):
        simulate(batch_effect="regional", region_size=0)
    with pytest.raises(SystemExit):
        main(["simulate", "--batch-effect", "position", "--out-expression", "x.h5ad",
              "--out-samples", "s.tsv"])  # fmt: skip
    assert "invalid choice" in capsys.readouterr().err
    sim = simulate_counts(n_samples=5, n_genes=5)
    with pytest.raises(sim_module.InputError, match="gene-wise"):
        write_simulation(sim, tmp_path / "x.h5ad", tmp_path / "s.tsv", regions=tmp_path / "r.tsv")
    assert not list(tmp_path.iterdir())
