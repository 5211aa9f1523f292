"""The workflow schema's `model` and `training` keys and the dataclasses behind them agree.

`workflow/schemas/config.schema.yaml` states every field of ModelConfig and TrainConfig
so that a typo fails at `snakemake -n`; these tests keep the two from drifting apart:
the same keys, types, defaults and choices, and ranges where validate() draws the line.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal

import jsonschema
import pytest
import yaml
from conftest import ROOT

from locusformer.errors import InputError
from locusformer.model.config import ModelConfig, TrainConfig, choices

SCHEMA = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
SECTIONS = {"model": ModelConfig, "training": TrainConfig}
# A float may also be a string (YAML reads 1e-3 as one); config_from_dict converts it.
TYPES = {bool: "boolean", int: "integer", float: ["number", "string"], str: "string"}
# Values a model key also takes, from configs written before it was a choice of strings.
LEGACY = {"positional_encoding": {True: "sinusoidal", False: "none"}}


def _properties(key: str) -> dict:
    return SCHEMA["properties"][key]["properties"]


def _kind(cls: type, name: str) -> type:
    hint = typing.get_type_hints(cls)[name]
    return str if typing.get_origin(hint) is Literal else hint


def test_the_schema_is_valid_and_closed():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    for key in SECTIONS:
        assert SCHEMA["properties"][key]["additionalProperties"] is False
        assert SCHEMA["properties"][key]["default"] == {}


@pytest.mark.parametrize("key", SECTIONS)
def test_every_field_is_in_the_schema_with_its_type_default_and_choices(key):
    cls, properties = SECTIONS[key], _properties(key)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    assert sorted(properties) == sorted(fields), "a key missing on one side"
    literals = choices(cls)
    for name, field in fields.items():
        prop = properties[name]
        legacy = list(LEGACY.get(name, {})) if cls is ModelConfig else []
        kind = TYPES[_kind(cls, name)]
        assert prop["type"] == ([kind, "boolean"] if legacy else kind), name
        assert prop["default"] == field.default and type(prop["default"]) is type(field.default), (
            name
        )
        enum = list(literals[name]) + legacy if name in literals else None
        assert prop.get("enum") == enum, name
        assert prop.get("description"), name


def _outside_and_edge(prop: dict, integer: bool) -> list[tuple[object, bool]]:
    """(value, allowed) pairs around each bound the schema states."""
    step = 1 if integer else 1e-9
    pairs = []
    if "minimum" in prop:
        pairs += [(prop["minimum"], True), (prop["minimum"] - step, False)]
    if "exclusiveMinimum" in prop:
        pairs += [(prop["exclusiveMinimum"], False), (prop["exclusiveMinimum"] + step, True)]
    if "maximum" in prop:
        pairs += [(prop["maximum"], True), (prop["maximum"] + step, False)]
    if "exclusiveMaximum" in prop:
        pairs += [(prop["exclusiveMaximum"], False), (prop["exclusiveMaximum"] - step, True)]
    if "maximum" not in prop and "exclusiveMaximum" not in prop:
        pairs.append((10**9 if integer else 1e9, True))
    if "minimum" not in prop and "exclusiveMinimum" not in prop:
        pairs.append((-(10**9) if integer else -1e9, True))
    return pairs


def _validates(cls: type, name: str, value: object) -> bool:
    # d_model must be even and a multiple of n_heads: keep both true but for the field
    # under test, so only that field can fail.
    base = {}
    if cls is ModelConfig:
        base = {"d_model": 2 * max(value, 1)} if name == "n_heads" else {"n_heads": 1}
    try:
        cls(**{**base, name: value}).validate()
    except InputError:
        return False
    return True


@pytest.mark.parametrize("key", SECTIONS)
def test_the_schema_ranges_are_the_ones_validate_enforces(key):
    cls, properties = SECTIONS[key], _properties(key)
    numeric = [f.name for f in dataclasses.fields(cls) if _kind(cls, f.name) in (int, float)]
    assert numeric
    for name in numeric:
        prop = properties[name]
        integer = _kind(cls, name) is int
        for value, allowed in _outside_and_edge(prop, integer):
            schema_says = jsonschema.Draft202012Validator(prop).is_valid(value)
            assert schema_says is allowed, (name, value)
            assert _validates(cls, name, value) is allowed, (name, value, "validate() differs")


def test_a_float_written_as_a_string_passes_both():
    prop = _properties("training")["lr"]
    assert jsonschema.Draft202012Validator(prop).is_valid("1e-3")
    assert not jsonschema.Draft202012Validator(prop).is_valid("-1e-3")
    assert not jsonschema.Draft202012Validator(prop).is_valid("fast")
    assert TrainConfig.from_dict({"lr": "1e-3"}).lr == 1e-3


def test_legacy_values_pass_both_and_mean_the_choice():
    for name, meaning in LEGACY.items():
        for old, new in meaning.items():
            assert jsonschema.Draft202012Validator(_properties("model")[name]).is_valid(old)
            assert getattr(ModelConfig.from_dict({name: old}), name) == new


def test_the_schema_defaults_build_the_dataclass_defaults():
    for key, cls in SECTIONS.items():
        defaults = {name: prop["default"] for name, prop in _properties(key).items()}
        assert cls.from_dict(defaults) == cls()
