"""The datasets sheet (``config/datasets.tsv``): read, checked against its schema and
against itself, as the one table the workflow plans its jobs from.

Snakemake reads the sheet while it parses the workflow (``workflow/rules/common.smk``),
before any job runs; the reading and the checks live here, in plain Python, so that they
are tested without a run. Every problem is an :class:`~locusformer.errors.InputError` whose
message names the sheet (and the dataset) and the problem on one line; the workflow prints
it and stops.
"""

from __future__ import annotations

import copy
import io
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import pandas as pd
import yaml
from jsonschema import validators

from locusformer.errors import InputError, one_line

PathLike = str | os.PathLike

#: Files and folders beside the per-dataset directories of results/, logs/ and
#: logs/benchmarks/ (the rules' benchmark tables): a dataset must not be named like one of
#: them (compared case-folded).
RESERVED_NAMES = frozenset(
    {
        "benchmarks",
        "index.html",
        "summary.tsv",
        "index.log",
        "summarize.log",
        "index.tsv",
        "summarize.tsv",
    }
)
#: Where the workflow writes the files of :data:`RESERVED_NAMES`, for the message.
RESERVED_IN = "results/, logs/, logs/benchmarks/"


def load_schema(path: PathLike) -> dict:
    """A JSON schema written as YAML (``workflow/schemas/*.schema.yaml``)."""
    return yaml.safe_load(Path(path).read_text(encoding="utf-8"))


def schema_problem(error: jsonschema.ValidationError) -> str:
    """A schema violation on one line, after the dotted key it concerns (if any).

    jsonschema's own messages repeat the offending value whole: an unknown key is named
    instead, with the keys that are valid there, and a float written as a string (which a
    ``pattern`` checks) is said to be no number.
    """
    where = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "additionalProperties":
        unknown = sorted(set(error.instance) - set(error.schema["properties"]))
        valid = ", ".join(error.schema["properties"])
        problem = f"unknown key {', '.join(map(repr, unknown))} (valid keys: {valid})"
    elif error.validator == "pattern" and "number" in error.schema.get("type", ()):
        problem = f"{error.instance!r} is not a number >= 0"  # a float as a string
    else:
        problem = error.message
    return ": ".join([*filter(None, [where]), problem])


def schema_error(source: object, error: jsonschema.ValidationError) -> InputError:
    """The :class:`InputError` for a schema violation in ``source`` (a file, "config")."""
    return InputError(source, schema_problem(error))


def _filling_defaults(validator_class: type) -> type:
    """``validator_class`` that also writes each missing property's schema default into the
    instance it checks (jsonschema's recipe, the one ``snakemake.utils.validate`` uses)."""
    check_properties = validator_class.VALIDATORS["properties"]

    def properties(validator, properties, instance, schema):
        if validator.is_type(instance, "object"):
            for name, subschema in properties.items():
                if "default" in subschema:
                    instance.setdefault(name, copy.deepcopy(subschema["default"]))
        yield from check_properties(validator, properties, instance, schema)

    return validators.extend(validator_class, {"properties": properties})


_RowValidator = _filling_defaults(jsonschema.Draft202012Validator)


def validate_row(record: dict[str, Any], schema: Mapping, source: object) -> dict[str, Any]:
    """``record`` checked against ``schema``, its missing keys set to the defaults (in
    place, and returned); the first violation raises, as an :class:`InputError` of
    ``source``."""
    try:
        _RowValidator(schema).validate(record)
    except jsonschema.ValidationError as error:
        raise schema_error(source, error) from None
    return record


def read_datasets(path: PathLike, schema: Mapping | None) -> pd.DataFrame:
    """The datasets sheet at ``path``: one row per dataset, indexed by its name (which is
    also a column), every cell a string.

    Whole lines starting with "#" are comments (a "#" inside a cell, a path or a column
    name, is kept); names and cells are stripped of spaces, a column empty in every row is
    dropped and an empty cell takes the schema's default. Each row is checked against
    ``schema`` (``workflow/schemas/datasets.schema.yaml``; None: not checked, as when a
    deploying workflow skips validation).
    """
    sheet = _read_sheet(path)
    _check_names(sheet, path)
    rows = []
    for _, row in sheet.iterrows():
        record = {k: v for k, v in row.items() if v != ""}
        if schema is not None:
            validate_row(record, schema, f"{path}, dataset {row['name']!r}")
        rows.append(record)
    return pd.DataFrame(rows).set_index("name", drop=False)


def _read_sheet(path: PathLike) -> pd.DataFrame:
    """The sheet's cells as stripped strings, comment lines and empty columns left out."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputError(path, "datasets sheet not found") from None
    lines = [line for line in text.splitlines(True) if not line.lstrip().startswith("#")]
    try:
        sheet = pd.read_csv(io.StringIO("".join(lines)), sep="\t", dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise InputError(path, "the datasets sheet lists no dataset") from None
    except pd.errors.ParserError as error:
        raise InputError(path, f"cannot read the datasets sheet: {one_line(error)}") from None
    sheet.columns = [c.strip() for c in sheet.columns]
    sheet = sheet.map(str.strip)
    return sheet.drop(columns=[c for c in sheet.columns if (sheet[c] == "").all()])


def _check_names(sheet: pd.DataFrame, path: PathLike) -> None:
    """Some datasets, each with a name of its own that no file of the workflow has."""
    if sheet.empty:
        raise InputError(path, "the datasets sheet lists no dataset")
    if "name" not in sheet.columns:
        raise InputError(path, "the datasets sheet has no name column (columns are tab-separated)")
    # Names that differ only in case share a directory on case-insensitive file systems.
    folded = sheet["name"].str.casefold()
    if folded.duplicated().any():
        twice = sheet.loc[folded.duplicated(), "name"].tolist()
        raise InputError(
            path, f"dataset name(s) listed twice (case is ignored): {', '.join(twice)}"
        )
    taken = sheet.loc[folded.isin(RESERVED_NAMES), "name"].tolist()
    if taken:
        raise InputError(
            path,
            f"dataset name(s) {', '.join(taken)} would clash with the workflow's own"
            f" files ({', '.join(sorted(RESERVED_NAMES))} in {RESERVED_IN})",
        )


def given(row: Mapping | pd.Series, column: str) -> str | None:
    """The row's cell, or None where the sheet leaves it empty (or lacks the column)."""
    value = row.get(column)
    return None if value is None or pd.isna(value) or value == "" else str(value)


def check_samples(sheet: pd.DataFrame, path: PathLike) -> None:
    """Only an .h5ad (its obs holding the columns) can do without a sample sheet."""
    for name, row in sheet.iterrows():
        if given(row, "samples") is None and not row["expression"].endswith(".h5ad"):
            raise InputError(
                f"{path}, dataset {name!r}",
                "samples is empty; only an .h5ad expression"
                " (whose obs holds the batch column) can do without a sample sheet",
            )


def check_finite_numbers(config: Any, source: str = "config") -> None:
    """Refuse NaN and infinity anywhere in the config: JSON Schema's bounds let them pass
    (NaN compares false with every limit), and the step that meets one fails late."""
    if isinstance(config, Mapping):
        for key, value in config.items():
            check_finite_numbers(
                value, f"{source}: {key}" if source == "config" else f"{source}.{key}"
            )
    elif isinstance(config, list | tuple):
        for i, value in enumerate(config):
            check_finite_numbers(value, f"{source}[{i}]")
    elif isinstance(config, float) and not math.isfinite(config):
        raise InputError(source, f"must be a finite number, got {config}")


def check_protected_columns(sheet: pd.DataFrame, protect: Sequence[str], path: PathLike) -> None:
    """Refuse, before any job runs, a protected column that is a dataset's batch column
    (batch would be removed only within batch levels, that is, not at all), or that its
    sample sheet lacks (text sheets: an .h5ad's obs is read by the steps)."""
    for name, row in sheet.iterrows():
        batch_columns = str(row["batch_key"]).split("+")
        for column in protect:
            if column == row["batch_key"] or column in batch_columns:
                raise InputError(
                    f"{path}, dataset {name!r}",
                    f"protect names {column!r}, its batch column; it cannot be protected",
                )
        samples = given(row, "samples")
        if samples is None or not Path(samples).is_file() or samples.endswith(".h5ad"):
            continue
        header = _header(Path(samples))
        missing = [c for c in protect if header and c not in header]
        if missing:
            raise InputError(
                samples,
                f"protect names {', '.join(map(repr, missing))}, which the sample sheet of "
                f"dataset {name!r} lacks (columns: {', '.join(header[:10])})",
            )


def _header(path: Path) -> list[str]:
    """The first line's fields of a CSV/TSV sample sheet (empty when it cannot be read:
    the normalize step then says why)."""
    from locusformer.io.tables import TEXT_SUFFIXES, header_fields, strip_gz

    if strip_gz(path)[0] not in TEXT_SUFFIXES:
        return []
    try:
        return header_fields(path)
    except InputError:
        return []


def model_sources(sheet: pd.DataFrame, path: PathLike) -> dict[str, tuple[str, str]]:
    """Dataset -> (kind, where) for the rows mapped onto a trained model: ("dataset",
    name) for another row of the sheet, whose train rule makes the model, or ("folder",
    path) for a folder holding model.pt and model.json (relative to the working
    directory). A name of the sheet wins over a folder of the same name."""
    sources = {}
    for name, row in sheet.iterrows():
        model = given(row, "model")
        if model is None:
            continue
        where = f"{path}, dataset {name!r}"
        said = f"model {model!r}"
        if model == name:
            raise InputError(
                where, f"{said} names the dataset itself; train it (leave model empty)"
            )
        if model in sheet.index:
            if given(sheet.loc[model], "model") is not None:
                raise InputError(
                    where,
                    f"{said} is itself mapped onto a model, not trained; name the"
                    f" dataset (or folder) it maps onto: {sheet.loc[model, 'model']!r}",
                )
            sources[name] = ("dataset", model)
        elif all(Path(model, f).is_file() for f in ("model.pt", "model.json")):
            sources[name] = ("folder", model)
        else:
            raise InputError(
                where,
                f"{said} is neither a dataset of the sheet nor a folder holding"
                " model.pt and model.json",
            )
    return sources


def name_pattern(names: Iterable[str]) -> str:
    """A regular expression matching exactly these dataset names (none: nothing), for a
    wildcard constraint."""
    return "|".join(name.replace(".", r"\.") for name in names) or "(?!)"
