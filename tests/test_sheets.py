"""The datasets sheet as the workflow reads it (locusformer.io.sheets), without a run.

A bad sheet stops the workflow with one line before any job runs (common.smk prints the
InputError after "locusformer workflow: error:"); these tests pin those lines word for
word, and the table a good sheet becomes.
"""

from __future__ import annotations

import re

import jsonschema
import pandas as pd
import pytest
from conftest import ROOT

from locusformer.errors import InputError
from locusformer.io import sheets

SCHEMA = sheets.load_schema(ROOT / "workflow/schemas/datasets.schema.yaml")
CONFIG_SCHEMA = sheets.load_schema(ROOT / "workflow/schemas/config.schema.yaml")
COLUMNS = ["name", "expression", "samples", "batch_key", "genes", "gene_id", "value_type"]
DEFAULTS = {"layer": "", "samples": "", "sample_column": "", "label_key": "", "model": ""}


def _row(name: str = "demo", **cells: str) -> dict[str, str]:
    row = {
        "name": name,
        "expression": "data/counts.tsv.gz",
        "samples": "data/samples.tsv",
        "batch_key": "protocol",
        "genes": "genes.tsv.gz",
        "gene_id": "ensembl_id",
        "value_type": "counts",
    }
    return {**row, **cells}


def _write(tmp_path, rows: list[dict[str, str]], *, head: str = "") -> str:
    path = tmp_path / "datasets.tsv"
    columns = list(dict.fromkeys(c for row in rows for c in row)) or COLUMNS
    lines = ["\t".join(columns)]
    lines += ["\t".join(row.get(c, "") for c in columns) for row in rows]
    path.write_text(head + "\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _refused(path: str, schema=SCHEMA) -> str:
    with pytest.raises(InputError) as caught:
        sheets.read_datasets(path, schema)
    message = str(caught.value)
    assert "\n" not in message
    return message


# --- good sheets -------------------------------------------------------------------------


def test_a_sheet_becomes_one_row_per_dataset_indexed_by_name_with_the_defaults(tmp_path):
    path = _write(tmp_path, [_row("first", label_key="cell_line"), _row("second")])
    table = sheets.read_datasets(path, SCHEMA)
    assert table.index.tolist() == ["first", "second"] and table.index.name == "name"
    assert table["name"].tolist() == ["first", "second"]
    assert table.loc["first", "label_key"] == "cell_line"
    assert table.loc["second", "label_key"] == ""  # an empty cell takes the default
    for column in ("layer", "sample_column", "model"):  # so does a column left out
        assert table[column].tolist() == ["", ""]
    assert set(table.columns) == set(COLUMNS) | set(DEFAULTS) | {"label_key"}
    assert all(isinstance(v, str) for v in table.to_numpy().ravel())


def test_comments_spaces_a_bom_and_empty_columns_are_read_past(tmp_path):
    path = tmp_path / "datasets.tsv"
    header = "\t".join([*COLUMNS, "label_key", "layer"])
    path.write_text(
        "\ufeff# the datasets\n"
        f"{header}\n"
        "  # an indented comment line\n"
        " a \tdata/#1.parquet\t\t protocol \tg.tsv\tid\tlog_expression\t\t\n"
        "b\tb.h5ad\t\tprotocol\tg.tsv\tid\tcounts\tlabel\t\n",
        encoding="utf-8",
    )
    table = sheets.read_datasets(path, SCHEMA)
    assert table.index.tolist() == ["a", "b"]
    assert table.loc["a", "expression"] == "data/#1.parquet"  # a "#" inside a cell is kept
    assert table.loc["a", "batch_key"] == "protocol"
    assert table.loc["a", "label_key"] == "" and table.loc["b", "label_key"] == "label"
    assert table["layer"].tolist() == ["", ""]  # empty throughout: dropped, then defaulted
    assert table["samples"].tolist() == ["", ""]


@pytest.mark.parametrize(
    "sheet",
    ["config/datasets.tsv", ".test/config/datasets.tsv", ".test/config/datasets_h5ad.tsv"],
)
def test_the_repositorys_own_sheets_are_read(sheet):
    table = sheets.read_datasets(ROOT / sheet, SCHEMA)
    assert len(table) == 1
    sheets.check_samples(table, sheet)
    assert sheets.model_sources(table, sheet) == {}


def test_without_a_schema_rows_are_neither_checked_nor_filled(tmp_path):
    path = _write(tmp_path, [_row(value_type="raw", extra="x")])
    table = sheets.read_datasets(path, None)
    assert table.loc["demo", "value_type"] == "raw" and "layer" not in table.columns


# --- bad sheets: the same one-line messages ----------------------------------------------


def test_a_missing_sheet(tmp_path):
    path = str(tmp_path / "nope.tsv")
    assert _refused(path) == f"{path}: datasets sheet not found"


@pytest.mark.parametrize("text", ["\t".join(COLUMNS) + "\n", "# only a comment\n", ""])
def test_a_sheet_without_datasets(tmp_path, text):
    path = tmp_path / "datasets.tsv"
    path.write_text(text)
    assert _refused(str(path)) == f"{path}: the datasets sheet lists no dataset"


def test_a_sheet_without_a_name_column(tmp_path):
    path = tmp_path / "datasets.csv"
    path.write_text("name,expression\ndemo,x.tsv\n")  # commas: one column
    assert _refused(str(path)) == (
        f"{path}: the datasets sheet has no name column (columns are tab-separated)"
    )


def test_a_row_with_more_cells_than_the_header(tmp_path):
    path = tmp_path / "datasets.tsv"
    path.write_text("name\texpression\na\tx.tsv\nb\tx.tsv\tsurplus\n")
    assert _refused(str(path)).startswith(f"{path}: cannot read the datasets sheet: ")


def test_names_that_differ_only_in_case(tmp_path):
    path = _write(tmp_path, [_row("Demo"), _row("demo"), _row("other")])
    assert _refused(path) == f"{path}: dataset name(s) listed twice (case is ignored): demo"


@pytest.mark.parametrize("name", ["index.html", "Summarize.log", "summary.tsv", "benchmarks"])
def test_a_name_of_the_workflows_own_files(tmp_path, name):
    path = _write(tmp_path, [_row("fine"), _row(name)])
    assert _refused(path) == (
        f"{path}: dataset name(s) {name} would clash with the workflow's own files"
        " (benchmarks, index.html, index.log, index.tsv, summarize.log, summarize.tsv,"
        " summary.tsv in results/, logs/, logs/benchmarks/)"
    )


@pytest.mark.parametrize(
    ("cells", "problem"),
    [
        ({"value_type": "raw"}, "value_type: 'raw' is not one of ['counts', 'log_expression']"),
        ({"gene_id": ""}, "'gene_id' is a required property"),
        (
            {"extra": "x"},
            "unknown key 'extra' (valid keys: name, expression, layer, samples,"
            " sample_column, batch_key, label_key, genes, gene_id, value_type, model)",
        ),
        (
            {"expression": "counts.xlsx"},
            "expression: 'counts.xlsx' does not match"
            " '\\\\.(csv|tsv|txt|tab)(\\\\.gz)?$|\\\\.parquet$|\\\\.pq$|\\\\.h5ad$'",
        ),
    ],
)
def test_a_row_that_fails_the_schema_names_its_dataset_and_the_key(tmp_path, cells, problem):
    path = _write(tmp_path, [_row("good"), _row("bad", **cells)])
    assert _refused(path) == f"{path}, dataset 'bad': {problem}"


@pytest.mark.parametrize("name", ["../escape", "a b", "-rf", "x;rm"])
def test_a_name_that_is_no_safe_path_component(tmp_path, name):
    path = _write(tmp_path, [_row(name)])
    assert _refused(path) == (
        f"{path}, dataset {name!r}: name: {name!r} does not match '^[A-Za-z0-9][A-Za-z0-9_.-]*$'"
    )


# --- the schema's messages, for the config too --------------------------------------------


def _first_error(instance, schema) -> jsonschema.ValidationError:
    return next(iter(jsonschema.Draft202012Validator(schema).iter_errors(instance)))


def test_an_unknown_config_key_is_named_with_the_valid_ones():
    error = _first_error({"training": {"max_epoch": 3}}, CONFIG_SCHEMA)
    problem = sheets.schema_problem(error)
    valid = ", ".join(CONFIG_SCHEMA["properties"]["training"]["properties"])
    assert problem == f"training: unknown key 'max_epoch' (valid keys: {valid})"
    assert "max_epochs" in valid
    assert str(sheets.schema_error("config", error)) == f"config: {problem}"


def test_a_float_written_as_a_string_that_is_none_is_said_to_be_no_number():
    schema = {"properties": {"lr": {"type": ["number", "string"], "pattern": "^[0-9.e-]+$"}}}
    error = _first_error({"lr": "fast"}, schema)
    assert sheets.schema_problem(error) == "lr: 'fast' is not a number >= 0"


def test_a_problem_at_the_top_level_has_no_key_before_it():
    error = _first_error({}, {"required": ["datasets"]})
    assert sheets.schema_problem(error) == "'datasets' is a required property"


def test_validate_row_fills_the_defaults_in_place():
    record = _row(samples="s.tsv")
    assert sheets.validate_row(record, SCHEMA, "sheet") is record
    assert record == {**_row(), **DEFAULTS, "samples": "s.tsv"}


# --- the checks across rows ---------------------------------------------------------------


def _table(tmp_path, rows):
    return sheets.read_datasets(_write(tmp_path, rows), SCHEMA)


def test_only_an_h5ad_can_do_without_a_sample_sheet(tmp_path):
    table = _table(tmp_path, [_row("anndata", expression="x.h5ad", samples=""), _row("csv")])
    sheets.check_samples(table, "sheet.tsv")
    table = _table(
        tmp_path, [_row("anndata", expression="x.h5ad", samples=""), _row("csv", samples="")]
    )
    with pytest.raises(InputError) as caught:
        sheets.check_samples(table, "sheet.tsv")
    assert str(caught.value) == (
        "sheet.tsv, dataset 'csv': samples is empty; only an .h5ad expression"
        " (whose obs holds the batch column) can do without a sample sheet"
    )


def test_model_sources_are_datasets_of_the_sheet_or_model_folders(tmp_path):
    folder = tmp_path / "models" / "atlas"
    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes(b"")
    (folder / "model.json").write_text("{}")
    table = _table(
        tmp_path,
        [_row("ref"), _row("query", model="ref"), _row("other", model=str(folder))],
    )
    assert sheets.model_sources(table, "s.tsv") == {
        "query": ("dataset", "ref"),
        "other": ("folder", str(folder)),
    }


def test_a_dataset_of_the_sheet_wins_over_a_folder_of_its_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # model folders are relative to the working directory
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / "model.pt").write_bytes(b"")
    (tmp_path / "ref" / "model.json").write_text("{}")
    table = _table(tmp_path, [_row("ref"), _row("query", model="ref")])
    assert sheets.model_sources(table, "s.tsv") == {"query": ("dataset", "ref")}


@pytest.mark.parametrize(
    ("rows", "said"),
    [
        (
            [_row("demo", model="demo")],
            "dataset 'demo': model 'demo' names the dataset itself; train it (leave model empty)",
        ),
        (
            [_row("ref"), _row("query", model="ref"), _row("again", model="query")],
            "dataset 'again': model 'query' is itself mapped onto a model, not trained;"
            " name the dataset (or folder) it maps onto: 'ref'",
        ),
        (
            [_row("query", model="missing/folder")],
            "dataset 'query': model 'missing/folder' is neither a dataset of the sheet nor"
            " a folder holding model.pt and model.json",
        ),
    ],
)
def test_a_model_that_cannot_be_mapped_onto(tmp_path, monkeypatch, rows, said):
    monkeypatch.chdir(tmp_path)
    table = _table(tmp_path, rows)
    with pytest.raises(InputError) as caught:
        sheets.model_sources(table, "s.tsv")
    assert str(caught.value) == f"s.tsv, {said}"


# --- small helpers -----------------------------------------------------------------------


def test_name_pattern_matches_exactly_the_names():
    pattern = sheets.name_pattern(["a.b", "c-d"])
    assert re.fullmatch(pattern, "a.b") and re.fullmatch(pattern, "c-d")
    assert not re.fullmatch(pattern, "aXb") and not re.fullmatch(pattern, "a.b/x")
    assert not re.fullmatch(sheets.name_pattern([]), "") and not re.search(
        sheets.name_pattern([]), "anything"
    )


def test_given_is_none_for_an_empty_missing_or_na_cell():
    row = pd.Series({"a": "x", "b": "", "c": float("nan")})
    assert sheets.given(row, "a") == "x"
    assert [sheets.given(row, c) for c in ("b", "c", "d")] == [None, None, None]


def test_nan_and_infinity_anywhere_in_the_config_are_refused():
    from locusformer.io.sheets import check_finite_numbers

    check_finite_numbers({"seed": 0, "normalize": {"target_sum": 1e4}, "x": [1.0, "nan"]})
    with pytest.raises(InputError, match=r"config: normalize\.target_sum: must be a finite"):
        check_finite_numbers({"normalize": {"target_sum": float("nan")}})
    with pytest.raises(InputError, match=r"config: metrics\.weights\[1\]"):
        check_finite_numbers({"metrics": {"weights": [0.4, float("-inf")]}})


def test_a_protected_batch_column_or_a_missing_one_is_refused(tmp_path):
    from locusformer.io.sheets import check_protected_columns

    samples = tmp_path / "s.tsv"
    samples.write_text("sample_id\tplate\tlab\tcell_line\ns1\tp1\tl1\tA\n")
    sheet = pd.DataFrame(
        {"batch_key": ["plate+lab"], "samples": [str(samples)]}, index=pd.Index(["d"], name="name")
    )
    check_protected_columns(sheet, ["cell_line"], "sheet.tsv")
    with pytest.raises(InputError, match="protect names 'lab', its batch column"):
        check_protected_columns(sheet, ["lab"], "sheet.tsv")
    with pytest.raises(InputError, match="protect names 'genotype', which the sample sheet"):
        check_protected_columns(sheet, ["genotype"], "sheet.tsv")
