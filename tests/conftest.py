"""Shared fixtures: small, fully known inputs written the way users write them."""

from __future__ import annotations

from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
RESOURCES = ROOT / "resources"
ANNOTATION = RESOURCES / "hs_gene_coordinates.tsv.gz"


def same_state(a, b) -> bool:
    """Whether two trained models (``TrainedModel``) hold the same weights, bit for bit."""
    import torch

    sa, sb = a.module.state_dict(), b.module.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def spy_gates(monkeypatch) -> list:
    """A list that each later clustering of the latent in training appends its gates
    (``Clustering.gate``) to; a new call starts a new list."""
    import locusformer.train.loop as train
    from locusformer.train.alignment import latent_clusters

    gates = []

    def spy(*args, **kwargs):
        found = latent_clusters(*args, **kwargs)
        gates.append(found.gate.copy())
        return found

    monkeypatch.setattr(train, "latent_clusters", spy)
    return gates


@pytest.fixture
def one_thread():
    """torch on one thread for the test, restored after. Tiny models gain nothing from
    threads, and on a busy 2-core machine two OpenMP threads spin against each other."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def annotation_table() -> pd.DataFrame:
    return pd.read_csv(ANNOTATION, sep="\t", dtype=str, keep_default_na=False)


@pytest.fixture
def counts_dataset(tmp_path: Path, annotation_table: pd.DataFrame) -> dict:
    """Genes x samples counts CSV (real Ensembl ids, two batches, two groups) + sheet."""
    rng = np.random.default_rng(0)
    genes = annotation_table.loc[annotation_table["ensembl_id"] != "", "ensembl_id"]
    genes = genes.drop_duplicates().sample(60, random_state=0).tolist()
    samples = [f"s{i:02d}" for i in range(24)]
    batch = ["b1"] * 12 + ["b2"] * 12
    group = (["g1"] * 6 + ["g2"] * 6) * 2
    counts = rng.poisson(5.0, size=(len(genes), len(samples))).astype(np.int64)
    matrix = pd.DataFrame(counts, index=pd.Index(genes, name="gene_id"), columns=samples)
    sheet = pd.DataFrame({"sample_id": samples, "batch": batch, "group": group})
    matrix_path = tmp_path / "counts.csv"
    sheet_path = tmp_path / "samples.tsv"
    matrix.to_csv(matrix_path)
    sheet.to_csv(sheet_path, sep="\t", index=False)
    return {"matrix": matrix, "sheet": sheet, "matrix_path": matrix_path, "sheet_path": sheet_path}


@pytest.fixture(scope="module")
def clustered_data() -> tuple[np.ndarray, list[str], pd.DataFrame]:
    """A simulated matrix (160 samples, 40 loci, two batches) whose input clusters are found,
    as the checks that read the quick correction's structure need: X, batch labels, loci."""
    from locusformer.simulate.datasets import simulate
    from locusformer.train.alignment import input_levels

    sim = simulate(n_samples=160, n_loci=40, n_batches=2, seed=4)
    assert input_levels(sim.X, np.asarray(sim.batch), 8, 0) is not None
    return sim.X, [f"b{b}" for b in sim.batch], sim.loci


def synthetic_groups(
    n_per: int = 30,
    groups: int = 3,
    batches: int = 2,
    genes: int = 100,
    shift: float = 1.0,
    seed: int = 0,
) -> ad.AnnData:
    """groups x batches x n_per log-scale samples; each batch adds its own per-gene shift."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 2, (groups, genes))
    shifts = rng.normal(0, shift, (batches, genes))
    x, rows = [], []
    for b in range(batches):
        for g in range(groups):
            for k in range(n_per):
                x.append(5 + centers[g] + shifts[b] + rng.normal(0, 1, genes))
                rows.append((f"s{b}_{g}_{k}", f"b{b}", f"t{g}"))
    obs = pd.DataFrame(rows, columns=["sample_id", "batch", "cell_type"]).set_index("sample_id")
    adata = ad.AnnData(np.asarray(x, dtype=np.float32), obs=obs)
    adata.var_names = [f"G{i:03d}" for i in range(genes)]
    return adata
