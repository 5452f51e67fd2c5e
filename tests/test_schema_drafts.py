"""The complete converter's reading of patterns and drafts: patterns are ECMA-262 (judged by
the project's parser, never by Python's ``re``, at the metaschema check too), and a schema
without ``$schema`` is read under the draft its keywords say (``default_draft=None``)."""

from __future__ import annotations

import json
import warnings
from typing import Any

import jsonschema
import pytest

from samplers.grammar import Grammar, SchemaError
from samplers.grammar.json_schema import SchemaWarning
from samplers.grammar.schema import _drafts, schema_to_gbnf
from samplers.grammar.schema._lower import _search


def quiet(schema: Any, **options: Any) -> Grammar:
    """The grammar of a schema that must convert without any warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return Grammar.from_json_schema(schema, **options)


def warned(schema: Any, match: str, **options: Any) -> Grammar:
    """The grammar of a schema that must convert with a SchemaWarning matching ``match``."""
    with pytest.warns(SchemaWarning, match=match):
        return Grammar.from_json_schema(schema, **options)


def accepts(g: Grammar, value: Any) -> bool:
    return g.accepts(json.dumps(value, ensure_ascii=False))


# --------------------------------------------------------------------- ECMA-262 patterns


def test_unicode_property_escape_is_a_valid_pattern_and_enforced() -> None:
    g = quiet({"type": "string", "pattern": r"^[^\p{Cc}]*$"})
    assert accepts(g, "tab-free text, é")
    assert not accepts(g, "a\u0001b")
    assert not accepts(g, "line\nbreak")
    g = quiet({"type": "string", "pattern": r"^\p{Lu}\p{Ll}+$"})
    assert accepts(g, "Éclair") and not accepts(g, "éclair")


def test_named_groups_are_a_valid_pattern_and_enforced() -> None:
    g = quiet({"type": "string", "pattern": r"^(?<major>\d+)\.(?<minor>\d+)$"})
    assert accepts(g, "1.20")
    assert not accepts(g, "1.x")
    assert not accepts(g, "v1.2")


def test_ecma_pattern_property_names_are_valid_and_enforced() -> None:
    schema = {"type": "object", "patternProperties": {r"^\p{Lu}": {"type": "integer"}}, "additionalProperties": False}
    g = quiet(schema)
    assert accepts(g, {"Ärger": 1})
    assert not accepts(g, {"ärger": 1})
    assert not accepts(g, {"Ärger": "1"})


@pytest.mark.parametrize("pattern", ["(a", "[z-a]", "a{2,1}", "*"])
@pytest.mark.parametrize("draft", [None, "2020-12", "2019-09", "7", "6", "4"])
def test_an_invalid_pattern_is_a_schema_error_at_its_pointer(pattern: str, draft: str | None) -> None:
    schema = {"type": "object", "properties": {"a/b": {"type": "string", "pattern": pattern}}}
    with pytest.raises(SchemaError) as e:
        schema_to_gbnf(schema, default_draft=draft)
    assert str(e.value).startswith(
        "JSON schema error at #/properties/a~1b/pattern: not a valid ECMA-262 regular expression: "
    ), str(e.value)
    assert f"/{pattern}/" in str(e.value)


@pytest.mark.parametrize("draft", [None, "2020-12", "7"])
def test_an_invalid_pattern_property_name_is_a_schema_error(draft: str | None) -> None:
    schema = {"type": "object", "patternProperties": {"[z-a]": {"type": "integer"}}}
    with pytest.raises(SchemaError, match=r"at #/patternProperties: the name '\[z-a\]' is not a valid ECMA-262"):
        schema_to_gbnf(schema, default_draft=draft)


def test_a_lookahead_pattern_is_a_warning_not_an_error() -> None:
    g = warned({"type": "string", "pattern": "^(?!admin$)[a-z]+$"}, match="lookaround")
    assert accepts(g, "alice")  # not enforced: the grammar accepts what the schema accepts, and more


def test_unknown_pattern_matches_never_tighten_a_property() -> None:
    """Whether a pattern no automaton is built for matches a key is unknown, and not asked
    of Python's ``re`` (its ``\\d`` takes any Unicode digit, ECMA-262's only 0-9): the
    pattern's schema is not applied to the key's value."""
    assert _search(r"^(?!x)\d$", "\u0663") is None  # ARABIC-INDIC DIGIT THREE
    assert _search(r"^\d$", "\u0663") is False
    schema = {
        "type": "object",
        "properties": {"\u0663": {"type": "string"}},
        "patternProperties": {r"^(?!x)\d$": {"type": "integer"}},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SchemaWarning)
        g = Grammar.from_json_schema(schema)
    assert accepts(g, {"\u0663": "s"})  # (Python's re, as jsonschema uses it, says the pattern matches)


def test_the_metaschema_validators_are_built_once_per_draft() -> None:
    assert _drafts.meta_validator("2020-12") is _drafts.meta_validator("2020-12")
    for draft, cls in [("2020-12", jsonschema.Draft202012Validator), ("4", jsonschema.Draft4Validator)]:
        checkers = _drafts.meta_validator(draft).format_checker.checkers
        assert set(checkers) == set(cls.FORMAT_CHECKER.checkers)  # the draft's other format checks kept
        assert checkers["regex"][0] is _drafts._is_regex


# ------------------------------------------------------------------------ the drafts

TUPLE = {"type": "array", "items": [{"type": "integer"}, {"type": "string"}], "additionalItems": False}


def test_tuple_items_without_schema_are_read_as_draft_7() -> None:
    g = warned(TUPLE, match=r"read as draft 7 \(it uses `items` as an array .* at #/items\).*default_draft=")
    check = jsonschema.Draft7Validator(TUPLE)
    for value in ([1, "a"], [1], [], [1, "a", 2], ["a"], [1, 2], {"a": 1}):
        assert accepts(g, value) == check.is_valid(value), value
    assert accepts(g, [1, "a"]) and not accepts(g, [1, "a", 2])


def test_tuple_items_nested_are_found() -> None:
    schema = {"type": "object", "properties": {"pair": TUPLE}, "required": ["pair"]}
    g = warned(schema, match=r"draft 7 .* at #/properties/pair/items")
    assert accepts(g, {"pair": [1, "a"]}) and not accepts(g, {"pair": [1, "a", 2]})


def test_dependencies_without_schema_are_enforced_under_draft_7() -> None:
    schema = {
        "type": "object",
        "properties": {"card": {"type": "string"}, "billing": {"type": "string"}, "vip": {"type": "boolean"}},
        "dependencies": {"card": ["billing"], "vip": {"required": ["level"]}},
    }
    g = warned(schema, match=r"read as draft 7 \(it uses `dependencies` at #/dependencies\)", validator=True)
    check = jsonschema.Draft7Validator(schema)
    for value in (
        {},
        {"card": "x"},
        {"card": "x", "billing": "y"},
        {"billing": "y"},
        {"vip": True},
        {"vip": True, "level": 3},
    ):
        assert accepts(g, value) == check.is_valid(value), value
    assert not accepts(g, {"card": "x"}) and not accepts(g, {"vip": True})


def test_boolean_exclusive_minimum_is_read_as_draft_4() -> None:
    schema = {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1, "exclusiveMaximum": True}
    g = warned(schema, match=r"read as draft 4 \(it uses a boolean `exclusiveMinimum`")
    assert accepts(g, 0.5)
    assert not accepts(g, 0) and not accepts(g, 1)


def test_draft_4_id_is_read_as_an_identifier() -> None:
    schema = {
        "id": "http://example.com/root.json",
        "definitions": {"count": {"id": "#count", "type": "integer"}},
        "type": "object",
        "properties": {"n": {"$ref": "#count"}},
    }
    g = warned(schema, match="read as draft 4")
    assert accepts(g, {"n": 1}) and not accepts(g, {"n": "1"})


def test_an_id_without_references_decides_nothing() -> None:
    g = quiet({"id": "thing", "type": "object", "properties": {"kind": {"const": "a"}}, "required": ["kind"]})
    assert accepts(g, {"kind": "a"}) and not accepts(g, {"kind": "b"})  # const: read as 2020-12, not draft 4


def test_draft_7_plain_name_id_is_read_as_an_anchor() -> None:
    schema = {"definitions": {"count": {"$id": "#count", "type": "integer"}}, "$ref": "#count"}
    g = warned(schema, match="read as draft 7")
    assert accepts(g, 1) and not accepts(g, "1")


def test_keyword_names_outside_schema_positions_are_not_keywords() -> None:
    schema = {
        "type": "object",
        "properties": {
            "dependencies": {"type": "array", "items": {"type": "string"}},
            "items": {"type": "array", "prefixItems": [{"type": "integer"}]},
            "id": {"type": "string"},
            "meta": {"const": {"items": [1], "dependencies": {"a": ["b"]}, "exclusiveMinimum": True}},
        },
        "required": ["dependencies"],
        "default": {"dependencies": ["a"], "items": [1, 2]},
        "examples": [{"items": [{"type": "integer"}], "id": "x"}],
        "$defs": {"e": {"enum": [{"items": [], "dependencies": {}}]}},
    }
    g = quiet(schema)
    assert accepts(g, {"dependencies": ["a"], "items": [1]})
    assert not accepts(g, {"dependencies": "a"})


def test_a_2020_12_schema_is_read_as_2020_12_without_warning() -> None:
    g = quiet({"type": "array", "prefixItems": [{"type": "integer"}], "items": False})
    assert accepts(g, [1]) and not accepts(g, [1, 2])


@pytest.mark.parametrize("schema", [TUPLE, {"$schema": "https://json-schema.org/draft/2020-12/schema", **TUPLE}])
def test_an_explicit_2020_12_keeps_refusing_tuple_items(schema: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(SchemaError, match=r"at #/items: .* is not of type 'object', 'boolean'$"):
            schema_to_gbnf(schema, default_draft="2020-12" if "$schema" not in schema else None)


@pytest.mark.parametrize("options", [{"default_draft": "7"}, {"default_draft": "2019-09"}])
def test_an_explicit_draft_decides_without_warning(options: dict[str, str]) -> None:
    g = quiet(TUPLE, **options)
    assert accepts(g, [1, "a"]) and not accepts(g, [1, "a", 2])
    g = quiet({"$schema": "http://json-schema.org/draft-07/schema#", **TUPLE})
    assert not accepts(g, [1, "a", 2])


def test_valid_under_no_draft_gives_the_2020_12_error_with_a_hint() -> None:
    schema = {"type": "array", "items": [{"type": "integer"}], "minItems": "two"}
    with pytest.raises(SchemaError) as e:
        schema_to_gbnf(schema)
    message = str(e.value)
    assert message.startswith("JSON schema error at #/")
    assert "`items` as an array" in message and "read by draft 7, 6 and 4" in message
    with pytest.raises(SchemaError, match=r"boolean `exclusiveMinimum` at #/exclusiveMinimum, read by draft 4"):
        schema_to_gbnf({"exclusiveMinimum": True})  # draft 4 also wants minimum beside it


def test_the_scan_is_bounded() -> None:
    assert _drafts.scan({"not": {"anyOf": [{"items": [True]}]}}) == {"items": "#/not/anyOf/0/items"}
    deep: dict[str, Any] = {"items": [True]}
    for _ in range(_drafts.MAX_DEPTH + 1):
        deep = {"not": deep}
    assert _drafts.scan(deep) == {}
