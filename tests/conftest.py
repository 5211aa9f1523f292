"""Shared fixtures: small, fully known inputs written the way users write them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
RESOURCES = ROOT / "resources"
ANNOTATION = RESOURCES / "hs_gene_coordinates.tsv.gz"


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
