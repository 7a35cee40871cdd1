"""The pure-Python bounds in front of the grammar worker, and the [grammar] table they read."""

from __future__ import annotations

import dataclasses
import json

import msgspec
import pytest

from app.profiles.schema import GrammarSettings
from app.sampling.grammar import GrammarError
from app.sampling.grammar_bounds import check_gbnf, check_schema
from app.sampling.grammar_child import GrammarLimits
from ops.bench.hostile import chain_schema

LIMITS = GrammarLimits(max_ref_depth=10, max_alternatives=3, max_property_name=10, max_rules=3, max_definitions=20)


def refused(schema: dict, limits: GrammarLimits = LIMITS) -> str:
    with pytest.raises(GrammarError) as caught:
        check_schema(schema, json.dumps(schema), limits)
    return str(caught.value)


def test_every_limit_is_a_profile_key_with_the_same_default() -> None:
    settings = msgspec.structs.asdict(GrammarSettings())
    for field in dataclasses.fields(GrammarLimits):
        assert settings[field.name] == field.default, field.name


def test_a_ref_chain_is_measured_through_definitions_and_nested_pointers() -> None:
    check_schema(chain_schema(9), json.dumps(chain_schema(9)), LIMITS)
    assert "$ref chains 11 deep" in refused(chain_schema(10))
    nested = {"type": "object", "properties": {"arguments": chain_schema(12, "#/properties/arguments/$defs/")}}
    assert "(grammar.max_ref_depth)" in refused(nested)


def test_a_ref_cycle_counts_once_and_a_long_chain_does_not_recurse() -> None:
    cycle = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}, {}]}}}
    check_schema(cycle, json.dumps(cycle), LIMITS)
    deep = chain_schema(5000)  # far past Python's recursion limit: the walk is iterative
    assert "$ref chains 5001 deep" in refused(deep, GrammarLimits(max_definitions=10_000, max_bytes=1 << 30))


@pytest.mark.parametrize(
    ("schema", "key"),
    [
        ({"anyOf": [{}, {}, {}, {}]}, "grammar.max_alternatives"),
        ({"properties": {"x": {"enum": [1, 2, 3, 4]}}}, "grammar.max_alternatives"),
        ({"properties": {"a_longer_name": {}}}, "grammar.max_property_name"),
        ({"$defs": {f"d{i}": {} for i in range(21)}}, "grammar.max_definitions"),
        ({"$defs": {"unused": {"oneOf": [{}, {}, {}, {}]}}}, "grammar.max_alternatives"),
        ({"description": "x" * 300_000}, "grammar.max_bytes"),
    ],
)
def test_each_bound_names_its_key(schema: dict, key: str) -> None:
    assert key in refused(schema)


def test_gbnf_rules_and_size() -> None:
    check_gbnf('root ::= a\na ::= "x"', LIMITS)
    with pytest.raises(GrammarError, match=r"4 rules; this server accepts 3 \(grammar.max_rules\)"):
        check_gbnf("\n".join(f'r{i} ::= "x"' for i in range(4)), LIMITS)
    with pytest.raises(GrammarError, match=r"grammar\.max_bytes"):
        check_gbnf('root ::= "' + "x" * 300_000 + '"', LIMITS)


def integer(**bounds: float) -> dict:
    return {"type": "object", "properties": {"a": {"type": "integer", **bounds}}, "required": ["a"]}


@pytest.mark.parametrize(
    ("bounds", "key"),
    [
        ({"minimum": 1.23e29, "maximum": 9.9e32}, "minimum"),  # both sides: llguidance answered int64's largest
        ({"minimum": 1.23e29}, "minimum"),
        ({"maximum": -9.9e32}, "maximum"),
        ({"exclusiveMinimum": 2**53 + 1}, "exclusiveMinimum"),  # a float of 2**53 (it let 2**53 through)
        ({"minimum": 0, "exclusiveMaximum": 9223372036854775808}, "exclusiveMaximum"),
    ],
)
def test_a_bound_the_grammar_engine_would_move_names_its_key(bounds: dict, key: str) -> None:
    assert f"JSON schema: {key} " in refused(integer(**bounds))
    number = {"properties": {"x": {"type": "number", **bounds}}}
    assert f"JSON schema: {key} " in refused(number)


def test_bounds_within_two_to_the_53_pass() -> None:
    for bounds in ({"minimum": -(2**53), "maximum": 2**53}, {"exclusiveMinimum": 1.5, "exclusiveMaximum": 9.0e15}):
        check_schema(integer(**bounds), json.dumps(integer(**bounds)), LIMITS)
