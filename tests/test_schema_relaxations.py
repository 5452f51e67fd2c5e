"""Relaxations of the JSON-schema converter: where the exact grammar would be too large (or a
keyword cannot be enforced), the grammar is looser than the schema, never stricter, and a
``SchemaWarning`` names the JSON pointer and what was relaxed.

The property is checked with validator semantics under the default budget and under tiny
ones that force every relaxation on small generated schemas (alternatives merged, oneOf read
as anyOf, keys untracked, counts dropped, conversions retried, and past the last budget any
JSON value): every value ``jsonschema`` accepts, the grammar accepts. Then one test per
failure class found on real-world schemas (JSONSchemaBench), each on a schema written here."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import samplers.grammar.schema as schema_module
from samplers.grammar import Grammar
from samplers.grammar.json_schema import SchemaWarning
from samplers.grammar.schema import UnsupportedSchemaError, schema_to_gbnf
from samplers.grammar.schema._budget import LEVELS, Budget

from .test_schema_converter import combined, small_values

TINY = Budget(
    max_atoms=1, one_of_work=0, tracked=0, tracked_required=0, max_rules=20000, max_states=4, pattern_classes=0
)
#: so few rules that every budget overflows: the last resort, any JSON value
NO_ROOM = Budget(max_atoms=1, one_of_work=0, tracked=0, tracked_required=0, max_rules=8)
BUDGETS = {"default": LEVELS, "tiny": (TINY,), "retried": (Budget(**{**vars(TINY), "max_rules": 12}), TINY)}


@contextmanager
def budgets(levels: tuple[Budget, ...]) -> Iterator[None]:
    with mock.patch.object(schema_module, "LEVELS", levels):
        yield


def convert(schema: Any, **options: Any) -> tuple[Grammar, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = Grammar.from_json_schema(schema, **options)
    return g, [str(w.message) for w in caught if issubclass(w.category, SchemaWarning)]


def accepts(g: Grammar, value: Any) -> bool:
    return g.accepts(json.dumps(value, ensure_ascii=False))


_LEAVES: list[Any] = [
    {"type": "integer"},
    {"type": "string", "maxLength": 40},
    {"type": "number", "minimum": 0.5},
    {"enum": ["a", 1, None]},
    {"type": "array", "items": {"type": "integer"}},
    {"type": "object", "required": ["a", "b", "c"]},
    {"required": ["a"], "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {}}},
    {"minLength": 2},
    {"pattern": "^a"},
    {"contains": {"type": "integer"}, "minContains": 1, "maxContains": 2},
    {"properties": {"a": {"type": "boolean"}, "bb": {"const": 1}}, "additionalProperties": False},
    {"patternProperties": {"^(?!b)": {"type": "integer"}}, "additionalProperties": False},
    {
        "patternProperties": {"^b": {"type": "integer"}, "c$": {"type": "null"}},
        "additionalProperties": {"type": "string"},
    },
    {"not": {"type": "null"}},
    {"minProperties": 1, "maxProperties": 2},
    {"prefixItems": [{"type": "integer"}], "items": {"type": "string"}},
    {"propertyNames": {"maxLength": 1}},
    {"dependentRequired": {"a": ["b"]}},
    {"uniqueItems": True},
    {"oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
    {"format": "color"},
    {"type": "string", "format": "date", "maxLength": 12},
    {"not": {"format": "date"}},
    {"not": {"multipleOf": 2}},
    {"multipleOf": 0.25, "minimum": 0, "maximum": 3},
    {"not": {"type": "array", "uniqueItems": True}},
    {"not": {"additionalProperties": {"type": "integer"}}},
    True,
]
relaxable = combined(_LEAVES)


@pytest.mark.parametrize("name", sorted(BUDGETS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=relaxable, values=st.lists(small_values, min_size=1, max_size=10))
def test_relaxed_grammars_accept_every_valid_value(name: str, schema: Any, values: list[Any]) -> None:
    """With validator semantics the grammar accepts every value the schema accepts, under
    every budget: a relaxation may only loosen it. (Exactness where nothing is warned is
    tests/test_schema_converter.py's property.)"""
    with budgets(BUDGETS[name]):
        g, _ = convert(schema, validator=True)
    validator = jsonschema.Draft202012Validator(schema)
    for value in values:
        if validator.is_valid(value):
            assert accepts(g, value), (schema, value)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=relaxable, values=st.lists(small_values, min_size=1, max_size=6))
def test_past_every_budget_any_json_value(schema: Any, values: list[Any]) -> None:
    """A grammar too large under every budget is any JSON value, said in a warning;
    ``strict=True`` refuses it instead."""
    with budgets((NO_ROOM,)):
        g, found = convert(schema, validator=True)
        if any(w.endswith("; any JSON value") for w in found):
            assert all(accepts(g, v) for v in values)
            with pytest.raises(UnsupportedSchemaError):
                schema_to_gbnf(schema, validator=True, strict=True)


# --- one test per failure class found on real-world schemas ------------------------------


def _alternatives(n: int) -> list[dict[str, Any]]:
    """n object alternatives that overlap (no discriminator): oneOf must exclude each from
    the others."""
    return [
        {"type": "object", "properties": {f"k{i}": {"type": "integer"}, "name": {"type": "string"}}} for i in range(n)
    ]


def test_a_large_oneof_is_read_as_anyof_with_a_warning() -> None:
    """Excluding each of many overlapping alternatives from the others multiplies
    complements (Travis CI's schema was refused after 54 s): past the budget the oneOf is
    anyOf, warned at its pointer; valid documents are accepted."""
    schema = {"properties": {"step": {"oneOf": _alternatives(12)}}}
    g, found = convert(schema, validator=True)
    assert any(w.startswith("#/properties/step: oneOf: relaxed: read as anyOf") for w in found), found
    assert accepts(g, {"step": {"k3": 1, "name": "x"}})
    assert accepts(g, {"step": {"k3": 1, "k4": 2}})  # in two alternatives: accepted (relaxed)
    assert not accepts(g, {"step": {"name": 5}})  # in no alternative
    with pytest.raises(UnsupportedSchemaError) as info:
        schema_to_gbnf(schema, validator=True, strict=True)
    assert info.value.keyword == "oneOf" and info.value.pointer == "#/properties/step"


def test_a_discriminated_oneof_stays_exact() -> None:
    """Alternatives told apart by a required constant (or a ``^literal$`` pattern) need no
    exclusion: 48 of them convert exactly and fast, with no warning."""
    alts = [
        {
            "type": "object",
            "properties": {"type": {"const": f"T{i}"} if i % 2 else {"type": "string", "pattern": f"^T{i}$"}}
            | {f"p{i}": {"type": "integer"}},
            "required": ["type"],
            "additionalProperties": False,
        }
        for i in range(48)
    ]
    g, found = convert({"oneOf": alts}, validator=True)
    assert not found
    assert accepts(g, {"type": "T7", "p7": 1}) and accepts(g, {"type": "T8"})
    assert not accepts(g, {"type": "T7", "p8": 1}) and not accepts(g, {"type": "T48"})


def test_an_if_chain_on_a_tag_stays_exact() -> None:
    """An allOf of if/then on a required tag's constants (JsonSchemaStore cloudify: 125
    of them): two branches' conditions meet in no object, so the product of n branches
    has n + 1 alternatives (each tag with its then, and none of the tags), not 2^n merged
    into one that lets a tag take another tag's payload. 20 branches: exact, no warning."""
    branches = [
        {
            "if": {"properties": {"kind": {"const": f"k{i}"}}},
            "then": {"properties": {"v": {"const": i}}, "required": ["v"]},
        }
        for i in range(20)
    ]
    schema = {"type": "object", "properties": {"kind": {"type": "string"}}, "required": ["kind"], "allOf": branches}
    for validator in (True, False):
        g, found = convert(schema, validator=validator)
        assert not found
        assert accepts(g, {"kind": "k3", "v": 3}) and accepts(g, {"kind": "k19", "v": 19})
        assert accepts(g, {"kind": "other"})  # no condition holds: no then applies
        assert not accepts(g, {"kind": "k3", "v": 4}) and not accepts(g, {"kind": "k3"})


def test_merged_alternatives_are_reported_once_where_they_are() -> None:
    """Products too large to keep are merged, and said so once per pointer and type, at
    the subschema's pointer. Here a chain of 40 if/then on a tag (over the 32 object
    alternatives a product keeps), each then with its own anyOf for "v", next to the
    declared "v"'s anyOf: the merged object's "v" is a value the converter builds from
    them, which reported at "#", and its products were capped again at each keyword that
    met them, a warning each (11 at "#" here; cloudify had 79, now 22)."""

    def alts(i: int) -> list[dict[str, Any]]:
        return [{"properties": {f"p{j}": {"const": i}}, "required": [f"p{j}"]} for j in range(6 + i % 3)]

    branches = [
        {"if": {"properties": {"kind": {"const": f"k{i}"}}}, "then": {"properties": {"v": {"anyOf": alts(i)}}}}
        for i in range(40)
    ]
    v = {
        "type": "object",
        "anyOf": [{"properties": {f"q{j}": {"type": "integer"}}, "required": [f"q{j}"]} for j in range(7)],
    }
    node = {
        "type": "object",
        "properties": {"kind": {"type": "string"}, "v": v},
        "required": ["kind"],
        "allOf": branches,
    }
    g, found = convert({"type": "object", "properties": {"node": node}}, validator=True)
    merged = [w for w in found if "alternatives of type" in w]
    assert merged and all(w.startswith("#/properties/node") for w in merged), found
    where = [(w.split(": ")[0], w.split("alternatives of type ")[1].split()[0]) for w in merged]
    assert len(where) == len(set(where)), found
    assert accepts(g, {"node": {"kind": "k3", "v": {"q0": 1, "p0": 3}}})  # merged: accepts more, never less


def test_recursive_alternatives_are_told_apart_by_their_tags() -> None:
    """Avro's schema (Github_hard o90939): object alternatives of a recursive oneOf each
    tagged by an ``enum`` under "type". Meeting two of them lowered the recursive keys that
    sort before the tag ("items" < "type"), met the schema being lowered, was unsure, and
    the exclusion that followed relaxed "items" to any value with a warning. The tags alone
    tell them apart: exact, no warning."""
    types: dict[str, Any] = {"$ref": "#/definitions/types"}
    schema = {
        "definitions": {
            "types": {
                "oneOf": [
                    {"type": "string", "enum": ["int", "string"]},
                    {
                        "type": "object",
                        "properties": {"type": {"enum": ["array"]}, "items": types},
                        "required": ["type", "items"],
                    },
                    {
                        "type": "object",
                        "properties": {"type": {"enum": ["map"]}, "values": types},
                        "required": ["type", "values"],
                    },
                ]
            }
        },
        **types,
    }
    g, found = convert(schema, validator=True)
    assert not found
    assert accepts(g, {"type": "array", "items": "int"})
    assert accepts(g, {"type": "map", "values": {"type": "array", "items": "string"}})
    assert not accepts(g, {"type": "array", "items": 5})
    assert not accepts(g, {"type": "map", "values": []})


def test_products_of_alternatives_are_merged_not_refused() -> None:
    """allOf of anyOfs multiplies alternatives (the old converter refused past 1024): past
    the budget they are merged into atoms that accept what each accepts, warned."""
    parts = [
        {"anyOf": [{"properties": {f"a{i}": {"type": "integer"}}}, {"properties": {f"a{i}": {"type": "string"}}}]}
        for i in range(8)
    ]
    g, found = convert({"type": "object", "allOf": parts}, validator=True)
    assert any("relaxed:" in w and "alternatives of type object" in w for w in found), found
    assert accepts(g, {f"a{i}": (i if i % 2 else str(i)) for i in range(8)})
    assert not accepts(g, {"a0": None})


def test_large_bounds_are_exact_and_small() -> None:
    """A maxLength of 131072 took 131,000 parsed rules and 1.4 s; the shared base-16 rules
    keep it exact in a few dozen."""
    g, found = convert({"type": "string", "maxLength": 131072, "minLength": 70000})
    assert not found and len(g.parsed.rules) < 200
    assert accepts(g, "a" * 131072) and accepts(g, "é" * 70000)
    assert not accepts(g, "a" * 131073) and not accepts(g, "a" * 69999)


def test_many_required_keys_in_any_order_are_relaxed_not_reordered() -> None:
    """Past the tracked keys, any order no longer falls back to the schema's order (stricter
    than a validator): the untracked required keys may be missing, warned."""
    keys = [f"k{i:02d}" for i in range(12)]
    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in keys}, "required": keys}
    g, found = convert(schema, validator=True)
    assert any(w.startswith("#: required: relaxed:") for w in found), found
    doc = {k: 1 for k in reversed(keys)}
    assert accepts(g, doc)
    assert not accepts(g, {k: 1 for k in keys[1:]})  # a tracked required key is missing
    assert not accepts(g, {**doc, "k05": "x"})


def test_lookaround_pattern_properties_accept_matching_keys() -> None:
    """A key pattern the grammar cannot enforce under additionalProperties: false no longer
    rejects every such key: the warning says keys are not checked against it, and a key
    takes the pattern's value or the additional one."""
    schema = {
        "type": "object",
        "patternProperties": {"^(?!_)[a-z]+$": {"type": "integer"}},
        "additionalProperties": False,
    }
    g, found = convert(schema, validator=True)
    assert any("#: patternProperties: relaxed: keys are not checked against" in w for w in found), found
    assert accepts(g, {"abc": 1, "de": 2})
    assert not accepts(g, {"abc": "x"})


def test_a_grammar_too_large_is_converted_again_under_a_tighter_budget() -> None:
    """Past ``max_rules`` the conversion runs again under the next budget and says so."""
    schema = {"properties": {"a": {"oneOf": _alternatives(4)}, "b": {"type": "string", "maxLength": 300}}}
    levels = (Budget(**{**vars(LEVELS[0]), "max_rules": 40}), LEVELS[-1])
    with budgets(levels):
        g, found = convert(schema, validator=True)
    retried = "#: $schema: relaxed: at full precision the grammar would be too large (the grammar would have over 40"
    assert any(w.startswith(retried) for w in found), found
    assert accepts(g, {"a": {"k1": 1}, "b": "x" * 300})


def test_harmless_metaschema_errors_are_warnings() -> None:
    """Values repeated in ``enum``/``required``/``type`` and draft 4's empty ``required`` or
    ``enum`` have a plain meaning (validators that never checked them read them so): a
    warning, not a refusal; ``strict=True`` still refuses them."""
    schema = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "object",
        "properties": {"code": {"enum": ["GB", "FR", "GB"]}, "kind": {"type": ["string", "string"]}},
        "required": [],
    }
    g, found = convert(schema, validator=True)
    assert "#/properties/code: enum: repeated values are read once" in found, found
    assert any(w.startswith("#: required: an empty array") for w in found), found
    assert accepts(g, {"code": "GB", "kind": "x"}) and accepts(g, {})
    assert not accepts(g, {"code": "DE"})
    with pytest.raises(schema_module.SchemaError, match=r"non-empty|non-unique"):
        schema_to_gbnf(schema, strict=True)
    with pytest.raises(schema_module.SchemaError):  # a real error stays one
        schema_to_gbnf({**schema, "properties": {"code": {"enum": "GB"}}})


def test_harmless_errors_under_an_alternative_are_each_reported() -> None:
    """Harmless errors that the metaschema finds inside one of its ``anyOf`` alternatives
    (draft 4's ``items``: a schema or an array of them) are each a warning, the same in
    every process: one of them was reported, which one depending on the process's string
    hashes."""
    item = {"type": "object", "properties": {k: {"enum": [v, v]} for k, v in zip("abcd", "wxyz", strict=True)}}
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "properties": {"room": {"items": item}}}
    _, found = convert(schema, validator=True)
    assert [w for w in found if "repeated" in w] == [
        f"#/properties/room/items/properties/{k}: enum: repeated values are read once" for k in "abcd"
    ]


def test_identifiers_that_are_not_and_pointers_lost_in_a_scope() -> None:
    """Draft 4's ``id`` given an object (a property written where a keyword goes, in a
    schema the metaschema does not see: under an unknown keyword, reached by ``$ref``) is
    ignored with a warning; a JSON-pointer ``$ref`` that does not resolve in the scope an
    enclosing ``id`` opened is read from the document's root (Heroku's schemas)."""
    g, found = convert(
        {
            "$schema": "http://json-schema.org/draft-04/schema#",
            "systems": {"items": {"id": {"type": "integer"}, "type": "object"}, "type": "array"},
            "properties": {"cat": {"$ref": "#/systems"}},
        },
        validator=True,
    )
    assert any("/items: $id: ignored" in w for w in found), found
    assert accepts(g, {"cat": [{}]}) and not accepts(g, {"cat": [1]})
    heroku = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "definitions": {
            "app": {
                "id": "schemata/app",
                "definitions": {"name": {"type": "string", "maxLength": 3}},
                "properties": {"name": {"$ref": "#/definitions/app/definitions/name"}},
            }
        },
        "properties": {"app": {"$ref": "#/definitions/app"}},
    }
    g, found = convert(heroku, validator=True)
    assert any("does not resolve in its scope" in w for w in found), found
    assert accepts(g, {"app": {"name": "abc"}}) and not accepts(g, {"app": {"name": "abcd"}})


def test_a_document_is_crawled_once_for_its_references() -> None:
    """``referencing`` keeps a crawl of the document (its identifiers and anchors) in the
    registry it returns, not in the resolvers made before: each subschema's resolver
    crawled the whole document again at its first lookup, and a reference that did not
    resolve in its scope was asked again at each use (Github_ultra o91126: 217 crawls, 1.2
    s). Here 30 Heroku-style definitions, each with an ``id`` and pointers from the root
    used twice: the document is crawled twice (the first failed lookup's own crawl, which
    referencing drops, and the one kept), where it was crawled 30 times."""
    from referencing import Registry

    defs = {
        f"d{i}": {
            "id": f"schemata/d{i}",
            "definitions": {"name": {"type": "string", "maxLength": 3}},
            "properties": {
                "a": {"$ref": f"#/definitions/d{i}/definitions/name"},
                "b": {"$ref": f"#/definitions/d{i}/definitions/name"},
            },
        }
        for i in range(30)
    }
    schema = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "definitions": defs,
        "properties": {f"p{i}": {"$ref": f"#/definitions/d{i}"} for i in range(30)},
    }
    crawl = Registry.crawl
    with mock.patch.object(Registry, "crawl", autospec=True, side_effect=crawl) as spy:
        g, found = convert(schema, validator=True)
    assert spy.call_count <= 2, spy.call_count
    assert any("does not resolve in its scope" in w for w in found), found
    assert accepts(g, {"p7": {"a": "abc", "b": ""}}) and not accepts(g, {"p29": {"b": "abcd"}})


def test_a_schema_that_refers_to_itself_without_nesting() -> None:
    """``X = allOf [X, Y]`` before any property or item (a validator recurses without end;
    Cloudify's schema has one) is read as ``Y``, warned, where it was refused."""
    schema = {
        "$defs": {"x": {"allOf": [{"$ref": "#/$defs/x"}, {"type": "integer", "minimum": 3}]}},
        "properties": {"a": {"$ref": "#/$defs/x"}},
    }
    g, found = convert(schema, validator=True)
    assert any("ignored: the schema refers to itself without nesting" in w for w in found), found
    assert accepts(g, {"a": 3}) and not accepts(g, {"a": 2}) and not accepts(g, {"a": "x"})


def test_unions_of_unions_are_capped() -> None:
    """Alternatives nested in alternatives multiply (Cloudify: 18,176 object alternatives
    from oneOfs of oneOfs); past ``max_union`` of a type they are merged, warned."""
    inner = [{"type": "object", "properties": {"t": {"const": i}, f"p{i}": {"type": "integer"}}} for i in range(20)]
    schema = {"anyOf": [{"anyOf": inner, "required": [f"p{j}"]} for j in range(20)]}
    with budgets((Budget(**{**vars(LEVELS[0]), "max_union": 64}),)):
        g, found = convert(schema, validator=True)
    assert any("relaxed:" in w and "alternatives of type object" in w for w in found), found
    assert accepts(g, {"t": 3, "p3": 1, "p7": 2}) and not accepts(g, {"t": "q", "p1": 1}) and not accepts(g, "x")


def test_undeclared_keys_beside_very_many_declared_ones() -> None:
    """ "Any key but the declared ones" is an automaton of a rule per state (ESLint's plugin
    rules: thousands of names, over 20,000 rules); past ``max_key_states`` an undeclared
    key may be a declared one (taking an undeclared key's value), warned."""
    names = [f"{i:04d}/rule-name" for i in range(400)]  # a distinct tail each: over 4000 states
    schema = {"type": "object", "properties": {n: {"enum": ["off", "warn", "error"]} for n in names}}
    g, found = convert(schema, validator=True)
    assert any("#: properties: relaxed: undeclared keys are not told apart" in w for w in found), found
    assert accepts(g, {"plugin/0007/rule-name": "warn", "other": [1]})
    assert accepts(g, {"plugin/0007/rule-name": 5})  # relaxed: a declared key with an undeclared key's value
    g, found = convert(schema)  # the defaults invent no key: nothing to tell apart
    assert not found and not accepts(g, {"plugin/0007/rule-name": 5}) and not accepts(g, {"other": 1})
    # closed (additionalProperties false): no undeclared key at all, so none to tell
    # apart either, and no automaton of them is built (JFrog's pipelines schema warned
    # here for objects of 59-88 keys)
    g, found = convert({**schema, "additionalProperties": False}, validator=True)
    assert not found
    assert accepts(g, {"0007/rule-name": "warn"}) and not accepts(g, {"other": "warn"})


def test_an_integer_with_a_zero_fraction_is_one_from_draft_6_only() -> None:
    """Validator semantics accept ``1.0`` for an integer where the draft does (6 and
    later); draft 4's integer has no fraction part (jsonschema's Draft4Validator agrees)."""
    for draft, ok in (
        ("http://json-schema.org/draft-04/schema#", False),
        ("http://json-schema.org/draft-07/schema#", True),
    ):
        schema = {"$schema": draft, "properties": {"id": {"type": "integer"}}}
        g, _ = convert(schema, validator=True)
        assert (
            g.accepts('{"id": 12345.0}')
            == ok
            == jsonschema.validators.validator_for(schema)(schema).is_valid({"id": 12345.0})
        )
        assert g.accepts('{"id": 12345}')
        # a number that must be a multiple of 1 may be written 6000.0 in every draft
        pounds = {"$schema": draft, "type": "number", "minimum": 0, "maximum": 99999999, "multipleOf": 1}
        g, _ = convert(pounds, validator=True)
        assert g.accepts("6000.0") and g.accepts("6000") and not g.accepts("6000.5")


def test_conversion_does_not_depend_on_the_hash_seed() -> None:
    """The grammar of a schema is the same in every process: the complement of an object
    schema (``not`` with ``required``) used to list its parts in a set's order, which
    changes with ``PYTHONHASHSEED``, and with it the order of keys in the products (found
    on JSONSchemaBench's Github_medium o65945: its default grammar took or refused its valid
    documents from one run to the next)."""
    from .conftest import run_isolated

    schema = {
        "type": "object",
        "properties": {"size": {"type": "integer"}, "user": {"type": "string"}, "group": {"type": "string"}},
        "anyOf": [{"not": {"required": ["user", "group", "size"]}}, {"required": ["user"]}],
        "allOf": [{"not": {"required": ["group", "user"]}}],
    }
    code = f"""
import hashlib
from samplers.grammar.json_schema import json_schema_to_gbnf
print(hashlib.sha256(json_schema_to_gbnf({schema!r}).encode()).hexdigest())
"""
    seen = set()
    for seed in ("1", "2", "3", "4", "5"):
        out = run_isolated(code, env={"PYTHONHASHSEED": seed})
        assert out.returncode == 0, out.stderr[-2000:]
        seen.add(out.stdout.strip())
    assert len(seen) == 1, seen
