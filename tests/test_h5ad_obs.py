"""An .h5ad may carry its batch and label columns in obs: the sample sheet is optional for
it; a sheet given too wins, and a column on which the two disagree is an error naming both."""

from __future__ import annotations

import json

import anndata as ad
import numpy as np
import pandas as pd
import pytest
from scipy import sparse

from locusformer.cli.main import main
from locusformer.errors import InputError
from locusformer.io.expression import read_obs, read_samples


@pytest.fixture
def h5ad_dataset(tmp_path, counts_dataset) -> dict:
    """The counts of ``counts_dataset`` as a samples x genes .h5ad with batch and group
    (and a numeric column with a gap) in obs, beside the same sheet."""
    matrix, sheet = counts_dataset["matrix"], counts_dataset["sheet"].set_index("sample_id")
    obs = sheet.copy()
    obs["batch"] = obs["batch"].astype("category")
    obs["n_reads"] = np.where(np.arange(len(obs)) == 3, np.nan, 1000.0 + np.arange(len(obs)))
    adata = ad.AnnData(
        sparse.csr_matrix(matrix.T.to_numpy(dtype=np.float32)),
        obs=obs,
        var=pd.DataFrame(index=matrix.index.astype(str)),
    )
    path = tmp_path / "counts.h5ad"
    adata.write_h5ad(path)
    return {**counts_dataset, "h5ad_path": path, "obs": obs}


def _normalize(tmp_path, expression, *extra):
    out = tmp_path / "out"
    argv = [
        "normalize", "--expression", str(expression), "--batch-key", "batch",
        "--label-key", "group", "--value-type", "counts", "--min-samples", "1",
        "--out-matrix", str(out / "normalized.parquet"),
        "--out-samples", str(out / "samples.tsv"), "--out-stats", str(out / "stats.json"),
        *map(str, extra),
    ]  # fmt: skip
    return main(argv), out


def test_obs_is_read_as_a_sheet_of_strings_without_the_matrix(h5ad_dataset):
    obs = read_obs(h5ad_dataset["h5ad_path"])
    assert obs.index.name == "sample_id"
    assert obs.index.tolist() == h5ad_dataset["obs"].index.tolist()
    assert obs["batch"].tolist() == h5ad_dataset["sheet"]["batch"].tolist()
    assert obs["n_reads"].iloc[:4].tolist() == ["1000", "1001", "1002", ""]  # no '.0', gap ''


def test_without_a_sheet_an_h5ad_normalizes_from_its_obs(tmp_path, h5ad_dataset):
    code, out = _normalize(tmp_path, h5ad_dataset["h5ad_path"])
    assert code == 0
    samples = pd.read_csv(out / "samples.tsv", sep="\t", dtype=str)
    assert samples["batch"].tolist() == h5ad_dataset["sheet"]["batch"].tolist()
    stats = json.loads((out / "stats.json").read_text())
    assert stats["samples_per_label"] == {"g1": 12, "g2": 12}
    with_sheet, out2 = _normalize(
        tmp_path / "sheet", h5ad_dataset["matrix_path"], "--samples", h5ad_dataset["sheet_path"]
    )
    assert with_sheet == 0  # the same data from the CSV and its sheet
    pd.testing.assert_frame_equal(
        pd.read_parquet(out / "normalized.parquet"), pd.read_parquet(out2 / "normalized.parquet")
    )


def test_a_matrix_other_than_h5ad_still_needs_a_sheet(tmp_path, capsys, counts_dataset):
    code, out = _normalize(tmp_path, counts_dataset["matrix_path"])
    assert code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "counts.csv: a sample sheet is needed (--samples)" in line
    assert not out.exists()


def test_a_sheet_that_disagrees_with_obs_fails_in_one_line_naming_both(
    tmp_path, capsys, h5ad_dataset
):
    sheet = h5ad_dataset["sheet"].copy()
    sheet.loc[5, "batch"] = "b2" if sheet.loc[5, "batch"] == "b1" else "b1"
    sheet.to_csv(h5ad_dataset["sheet_path"], sep="\t", index=False)
    code, out = _normalize(
        tmp_path, h5ad_dataset["h5ad_path"], "--samples", h5ad_dataset["sheet_path"]
    )
    assert code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("locusformer normalize: error: ")
    assert "samples.tsv: column 'batch' disagrees with the obs of" in line
    assert "counts.h5ad" in line and "for 1 sample(s), e.g. 's05'" in line
    assert not out.exists(), "no partial output"


def test_a_sheet_that_agrees_wins_and_adds_its_own_columns(tmp_path, h5ad_dataset):
    sheet = h5ad_dataset["sheet"].copy()
    sheet["site"] = ["x", "y"] * 12  # only in the sheet
    sheet.loc[0, "group"] = ""  # an empty cell takes the obs value
    sheet.to_csv(h5ad_dataset["sheet_path"], sep="\t", index=False)
    table, source = read_samples(h5ad_dataset["h5ad_path"], h5ad_dataset["sheet_path"])
    assert source == str(h5ad_dataset["sheet_path"])
    assert table["site"].tolist() == sheet["site"].tolist()
    assert table.loc["s00", "group"] == "g1"
    assert table["n_reads"].iloc[0] == "1000"  # obs columns the sheet lacks are added
    code, out = _normalize(
        tmp_path, h5ad_dataset["h5ad_path"], "--samples", h5ad_dataset["sheet_path"]
    )
    assert code == 0
    samples = pd.read_csv(out / "samples.tsv", sep="\t", dtype=str, keep_default_na=False)
    assert samples["site"].tolist() == sheet["site"].tolist()
    assert samples["batch"].tolist() == h5ad_dataset["sheet"]["batch"].tolist()


def test_the_sheet_wins_for_a_column_that_only_it_has(tmp_path, h5ad_dataset):
    adata = ad.read_h5ad(h5ad_dataset["h5ad_path"])
    adata.obs = adata.obs.drop(columns=["batch"])  # the batch is in the sheet only
    adata.write_h5ad(h5ad_dataset["h5ad_path"])
    with pytest.raises(InputError, match=r"counts.h5ad obs: batch_key column 'batch' not found"):
        from locusformer.io.expression import open_expression
        from locusformer.pp.normalize import sample_table

        table, source = read_samples(h5ad_dataset["h5ad_path"])
        with open_expression(h5ad_dataset["h5ad_path"]) as rows:
            sample_table(
                rows.obs_names, rows.var_names, table, "batch", "group",
                matrix_path=str(h5ad_dataset["h5ad_path"]), sheet_path=source,
            )  # fmt: skip
    code, out = _normalize(
        tmp_path, h5ad_dataset["h5ad_path"], "--samples", h5ad_dataset["sheet_path"]
    )
    assert code == 0
    samples = pd.read_csv(out / "samples.tsv", sep="\t", dtype=str)
    assert samples["batch"].tolist() == h5ad_dataset["sheet"]["batch"].tolist()
