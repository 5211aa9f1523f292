"""Every step refuses bad input with one line naming the file, exit 2 and no output."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT

from locusformer.cli.main import main


def _normalize(tmp_path, matrix_path, sheet_path, *extra, batch_key="batch"):
    out = tmp_path / "out"
    argv = [
        "normalize",
        "--expression", str(matrix_path),
        "--samples", str(sheet_path),
        "--batch-key", batch_key,
        "--value-type", "counts",
        "--min-samples", "1",
        "--out-matrix", str(out / "normalized.parquet"),
        "--out-counts", str(out / "counts.parquet"),
        "--out-samples", str(out / "samples.tsv"),
        "--out-stats", str(out / "stats.json"),
        *extra,
    ]  # fmt: skip
    return main(argv), out


def _assert_refused(code, out, capsys, *fragments):
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    message = [line for line in err if "error:" in line]
    assert len(message) == 1, err
    for fragment in fragments:
        assert fragment in message[0]
    assert not out.exists() or not any(out.iterdir()), "no partial output"


def test_normalize_and_order_loci_write_their_outputs(tmp_path, counts_dataset):
    code, out = _normalize(
        tmp_path,
        counts_dataset["matrix_path"],
        counts_dataset["sheet_path"],
        "--label-key",
        "group",
    )
    assert code == 0
    normalized = pd.read_parquet(out / "normalized.parquet")
    assert normalized.shape == (24, 60) and normalized.index.name == "sample_id"
    assert (normalized.dtypes == np.float32).all()
    stats = json.loads((out / "stats.json").read_text())
    assert stats["samples_per_label"] == {"g1": 12, "g2": 12}
    samples = pd.read_csv(out / "samples.tsv", sep="\t")
    assert samples.columns.tolist() == ["sample_id", "batch", "group"]
    counts = pd.read_parquet(out / "counts.parquet")
    np.testing.assert_array_equal(
        counts.to_numpy(), counts_dataset["matrix"].loc[counts.columns].T.to_numpy()
    )
    code = main(
        [
            "order-loci",
            "--matrix", str(out / "normalized.parquet"),
            "--genes", "resources/hs_gene_coordinates.tsv.gz",
            "--gene-id", "ensembl_id",
            "--out-loci", str(out / "loci.parquet"),
            "--out-matrix", str(out / "ordered.parquet"),
            "--out-stats", str(out / "loci.json"),
        ]
    )  # fmt: skip
    assert code == 0
    loci = pd.read_parquet(out / "loci.parquet")
    ordered = pd.read_parquet(out / "ordered.parquet")
    assert ordered.columns.tolist() == loci["gene_id"].tolist()
    assert sorted(ordered.columns) == sorted(normalized.columns)
    np.testing.assert_array_equal(ordered[normalized.columns].to_numpy(), normalized.to_numpy())


def _counts(expression, normalized, out, value_type="counts"):
    argv = ["counts", "--expression", str(expression), "--value-type", value_type,
            "--matrix", str(normalized), "--out", str(out)]  # fmt: skip
    return main(argv)


@pytest.mark.parametrize("value_type", ["counts", "log_expression"])
def test_the_counts_step_writes_what_normalize_writes_byte_for_byte(
    tmp_path, counts_dataset, value_type
):
    # The workflow's counts job (scVI's input) replaces normalize's --out-counts.
    code, out = _normalize(
        tmp_path, counts_dataset["matrix_path"], counts_dataset["sheet_path"],
        "--value-type", value_type,
    )  # fmt: skip
    assert code == 0
    separate = tmp_path / "counts.parquet"
    code = _counts(counts_dataset["matrix_path"], out / "normalized.parquet", separate, value_type)
    assert code == 0
    assert separate.read_bytes() == (out / "counts.parquet").read_bytes()
    assert pd.read_parquet(separate).shape == ((24, 60) if value_type == "counts" else (24, 0))


def test_the_counts_step_refuses_a_normalized_matrix_of_other_samples(
    tmp_path, capsys, counts_dataset
):
    code, out = _normalize(tmp_path, counts_dataset["matrix_path"], counts_dataset["sheet_path"])
    assert code == 0
    counts_dataset["matrix"].iloc[:, :-1].to_csv(counts_dataset["matrix_path"])
    refused = tmp_path / "refused"
    code = _counts(
        counts_dataset["matrix_path"], out / "normalized.parquet", refused / "counts.parquet"
    )
    _assert_refused(code, refused, capsys, "normalized.parquet", "24 samples", "has 23")


@pytest.mark.parametrize(
    ("edit", "fragments"),
    [
        (lambda m, s: (m.assign(s00="x"), s), ["counts.csv", "non-numeric value 'x'"]),
        (lambda m, s: (m.assign(s00=np.nan), s), ["counts.csv", "non-finite value"]),
        (lambda m, s: (m.assign(s00=-1), s), ["counts.csv", "negative values"]),
        (lambda m, s: (m, s.iloc[:-2]), ["samples.tsv", "2 sample(s) of", "'s22', 's23'"]),
        (lambda m, s: (m.iloc[:, :-1], s), ["counts.csv", "missing from the matrix", "'s23'"]),
        (lambda m, s: (m, s.drop(columns="batch")), ["samples.tsv", "'batch' not found"]),
        (lambda m, s: (m, s.assign(batch="b1")), ["samples.tsv", "at least 2 are needed"]),
        (lambda m, s: (pd.concat([m, m.iloc[:1]]), s), ["counts.csv", "duplicate gene ids"]),
        (
            lambda m, s: (m, pd.concat([s, s.iloc[:1]])),
            ["samples.tsv", "duplicate sample ids: 's00'"],
        ),
        (lambda m, s: (m * 0, s), ["counts.csv", "no gene is expressed"]),
    ],
)
def test_normalize_refuses_bad_input(tmp_path, capsys, counts_dataset, edit, fragments):
    matrix, sheet = edit(counts_dataset["matrix"].copy(), counts_dataset["sheet"].copy())
    matrix.to_csv(counts_dataset["matrix_path"])
    sheet.to_csv(counts_dataset["sheet_path"], sep="\t", index=False)
    code, out = _normalize(tmp_path, counts_dataset["matrix_path"], counts_dataset["sheet_path"])
    _assert_refused(code, out, capsys, *fragments)


def test_missing_label_column_is_refused(tmp_path, capsys, counts_dataset):
    code, out = _normalize(
        tmp_path, counts_dataset["matrix_path"], counts_dataset["sheet_path"], "--label-key", "cell"
    )
    _assert_refused(code, out, capsys, "samples.tsv", "label_key column 'cell' not found")


def _two_factor_sheet(counts_dataset):
    """The sheet with the batch split into a protocol and, within it, a plate."""
    sheet = counts_dataset["sheet"].drop(columns="batch")
    sheet["protocol"] = ["p1"] * 12 + ["p2"] * 12
    sheet["plate"] = (["A"] * 6 + ["B"] * 6) * 2
    sheet.to_csv(counts_dataset["sheet_path"], sep="\t", index=False)
    return sheet


def test_several_batch_columns_make_one_batch_per_combination(tmp_path, counts_dataset):
    sheet = _two_factor_sheet(counts_dataset)
    code, out = _normalize(
        tmp_path, counts_dataset["matrix_path"], counts_dataset["sheet_path"],
        batch_key="protocol+plate",
    )  # fmt: skip
    assert code == 0
    samples = pd.read_csv(out / "samples.tsv", sep="\t", index_col="sample_id")
    # The sheet's own columns are kept as they were; the batch is their combination.
    pd.testing.assert_frame_equal(
        samples[["group", "protocol", "plate"]], sheet.set_index("sample_id")
    )
    expected = sheet["protocol"] + "+" + sheet["plate"]
    assert samples["protocol+plate"].tolist() == expected.tolist()
    stats = json.loads((out / "stats.json").read_text())
    assert stats["samples_per_batch"] == {"p1+A": 6, "p1+B": 6, "p2+A": 6, "p2+B": 6}


@pytest.mark.parametrize(
    ("batch_key", "edit", "fragment"),
    [
        ("protocol+lane", None, "batch_key column 'lane' of 'protocol+lane' not found"),
        ("protocol+", None, "empty or repeated column name"),
        ("plate+plate", None, "empty or repeated column name"),
        ("protocol+plate", {"plate": ""}, "empty 'plate' for sample(s) 's03'"),
    ],
)
def test_several_batch_columns_refuse_bad_input(
    tmp_path, capsys, counts_dataset, batch_key, edit, fragment
):
    sheet = _two_factor_sheet(counts_dataset)
    if edit:
        for column, value in edit.items():
            sheet.loc[3, column] = value
        sheet.to_csv(counts_dataset["sheet_path"], sep="\t", index=False)
    code, out = _normalize(
        tmp_path, counts_dataset["matrix_path"], counts_dataset["sheet_path"], batch_key=batch_key
    )
    _assert_refused(code, out, capsys, "samples.tsv", fragment)


def test_a_column_of_a_combined_batch_cannot_be_protected():
    from locusformer.errors import InputError
    from locusformer.pp.batches import refuse_protected_batch

    refuse_protected_batch(["cell_line"], "protocol+plate")
    with pytest.raises(InputError, match="'plate' is the batch column"):
        refuse_protected_batch(["cell_line", "plate"], "protocol+plate")


def test_order_loci_refuses_when_no_gene_is_placed(tmp_path, capsys, counts_dataset):
    code, out = _normalize(tmp_path, counts_dataset["matrix_path"], counts_dataset["sheet_path"])
    assert code == 0
    loci_out = tmp_path / "loci"
    code = main(
        [
            "order-loci",
            "--matrix", str(out / "normalized.parquet"),
            "--genes", "resources/hs_gene_coordinates.tsv.gz",
            "--gene-id", "symbol",
            "--out-loci", str(loci_out / "loci.parquet"),
            "--out-matrix", str(loci_out / "ordered.parquet"),
            "--out-stats", str(loci_out / "loci.json"),
        ]
    )  # fmt: skip
    _assert_refused(code, loci_out, capsys, "hs_gene_coordinates.tsv.gz", "no gene of the matrix")


def test_summary_adds_the_time_of_every_rule_a_method_needs(tmp_path):
    metrics = tmp_path / "metrics.tsv"
    pd.DataFrame(
        {
            "method": ["m"] * 3,
            "metric": ["Batch correction", "Bio conservation", "Total"],
            "type": ["aggregate"] * 3,
            "value": [0.5, 0.7, 0.62],
            "status": ["ok"] * 3,
            "error": [""] * 3,
        }
    ).to_csv(metrics, sep="\t", index=False)
    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    for name, seconds, rss in (("train", 30.0, 600.0), ("correct", 2.5, 500.0)):
        (tmp_path / f"{name}.tsv").write_text(
            header + f"{seconds}\t0:00:30\t{rss}\t0\t0\t0\t0\t0\t0\t1\n"
        )
    out = tmp_path / "summary.tsv"
    code = main(
        [
            "summarize",
            "--metrics", f"d={metrics}",
            "--benchmark", f"d/m={tmp_path / 'train.tsv'}",
            "--benchmark", f"d/m={tmp_path / 'correct.tsv'}",
            "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    row = pd.read_csv(out, sep="\t").iloc[0]
    assert row["wall_s"] == 32.5 and row["max_rss_mb"] == 600.0


def test_diverging_training_ends_in_one_line_and_exit_code_3(tmp_path, counts_dataset):
    code, out = _normalize(tmp_path, counts_dataset["matrix_path"], counts_dataset["sheet_path"])
    assert code == 0
    code = main(
        [
            "order-loci",
            "--matrix", str(out / "normalized.parquet"),
            "--genes", "resources/hs_gene_coordinates.tsv.gz",
            "--gene-id", "ensembl_id",
            "--out-loci", str(out / "loci.parquet"),
            "--out-matrix", str(out / "ordered.parquet"),
            "--out-stats", str(out / "loci.json"),
        ]
    )  # fmt: skip
    assert code == 0
    params = {
        "model": {"patch_size": 4, "d_model": 8, "n_heads": 2, "n_layers": 1, "latent_dim": 4},
        "train": {"lr": 1e30, "grad_clip": 0, "warmup_fraction": 0, "max_epochs": 3},
    }
    model = tmp_path / "model"
    # A process of its own: what a job's log receives, logging and progress included.
    result = subprocess.run(
        [
            sys.executable, "-m", "locusformer", "train",
            "--matrix", str(out / "ordered.parquet"),
            "--loci", str(out / "loci.parquet"),
            "--samples", str(out / "samples.tsv"),
            "--batch-key", "batch",
            "--params", json.dumps(params),
            "--device", "cpu",
            "--out-weights", str(model / "model.pt"),
            "--out-config", str(model / "model.json"),
            "--out-history", str(model / "history.tsv"),
        ],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("locusformer train: error: ")
    assert "diverged" in lines[-1] or "nan" in lines[-1] or "inf" in lines[-1], lines[-1]
    assert [line for line in lines if "error" in line.lower()] == [lines[-1]], lines
    assert "Traceback" not in result.stderr
    assert not model.exists() or not any(model.iterdir()), "no partial output"
