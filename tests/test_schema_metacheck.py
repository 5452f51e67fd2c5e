"""The fast metaschema check (``samplers.grammar.schema._metacheck``) against ``jsonschema``,
the reference (``_drafts.meta_error``): where the fast check says valid, ``jsonschema``
must too; where it is not sure, ``jsonschema`` decides (and words the error). Random
schema-shaped values, every schema of the official JSON-Schema-Test-Suite under every
draft, and each keyword's edge cases."""

from __future__ import annotations

import collections
import decimal
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from benchmarks import schema_suite as ss
from samplers.grammar import SchemaError
from samplers.grammar.schema import _drafts, _metacheck, schema_to_gbnf

DRAFTS = ["2020-12", "2019-09", "7", "6", "4"]
FOLDERS = {"draft2020-12": "2020-12", "draft2019-09": "2019-09", "draft7": "7", "draft6": "6", "draft4": "4"}


def budget(n: int) -> int:
    """Examples for a hypothesis test: ``n``, or more under a bigger profile (conftest)."""
    return max(n, settings().max_examples)


def fast(schema: Any, draft: str) -> bool:
    return _metacheck.valid(schema, draft, _drafts.meta_validator(draft).format_checker)


def reference(schema: Any, draft: str) -> bool:
    """jsonschema's verdict (a schema too deep for it is invalid, as the converter says)."""
    try:
        return _drafts.meta_error(schema, draft) is None
    except SchemaError:
        return False


# ------------------------------------------------------------------ random schema shapes

NAMES = ["a", "b", "a/b", "", "~"]
STRINGS = ["", "a", "#", "#a", "a#", "a#b", "http://x.org/s#", "urn:x", "_a", "a:b", "1a", "a b", "a\n", "string"]
PATTERNS = ["^a+$", "a|b", "(?=a)", r"(a)\1", r"\p{Lu}", "(a", "[z-a]", "*", "a{2,1}", "[", ""]
TYPES = ["array", "boolean", "integer", "null", "number", "object", "string", "any", "foo"]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-2, 3)
    | st.sampled_from([0.0, 0.5, 1.0, -1.0, 2.5])
    | st.sampled_from(STRINGS + TYPES)
)
json_values = st.recursive(
    scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(NAMES), c, max_size=3), max_leaves=6
)
names = st.sampled_from(NAMES)

#: keyword groups of every draft (a keyword may be in several: its drafts disagree)
STR_KW = (
    "title description format $comment contentMediaType contentEncoding id $schema $ref $id $recursiveRef $dynamicRef"
)
ANCHOR_KW = "$anchor $dynamicAnchor $recursiveAnchor"
BOOL_KW = "uniqueItems deprecated readOnly writeOnly exclusiveMinimum exclusiveMaximum $recursiveAnchor"
NUM_KW = "maximum minimum exclusiveMaximum exclusiveMinimum multipleOf"
COUNT_KW = "maxLength minLength maxItems minItems maxProperties minProperties maxContains minContains"
SCHEMA_KW = (
    "not additionalItems additionalProperties contains propertyNames if then else unevaluatedItems "
    "unevaluatedProperties contentSchema items"
)
SCHEMAS_KW = "allOf anyOf oneOf prefixItems items"
MAP_KW = "properties definitions $defs dependentSchemas patternProperties"
OTHER_KW = "type required enum examples default const pattern dependencies dependentRequired $vocabulary x-extra"
KEYWORDS = sorted(
    {
        k
        for group in (STR_KW, ANCHOR_KW, BOOL_KW, NUM_KW, COUNT_KW, SCHEMA_KW, SCHEMAS_KW, MAP_KW, OTHER_KW)
        for k in group.split()
    }
)


def likely(keyword: str, children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Values a draft may accept for ``keyword`` (some drafts refuse some of them)."""
    options: list[st.SearchStrategy[Any]] = []

    def among(group: str) -> bool:
        return keyword in group.split()

    if among(STR_KW):
        options.append(st.sampled_from(STRINGS))
    if among(ANCHOR_KW):
        options.append(st.sampled_from(STRINGS))
    if among(BOOL_KW):
        options.append(st.booleans())
    if among(NUM_KW):
        options.append(st.integers(-2, 5) | st.sampled_from([0.0, 0.5, 2.0, -0.5]))
    if among(COUNT_KW):
        options.append(st.integers(-1, 5) | st.sampled_from([0.0, 1.0, 1.5, True]))
    if among(SCHEMA_KW):
        options.append(children)
    if among(SCHEMAS_KW):
        options.append(st.lists(children, max_size=3))
    if keyword == "patternProperties":
        options.append(st.dictionaries(st.sampled_from(PATTERNS), children, max_size=3))
    elif among(MAP_KW):
        options.append(st.dictionaries(names, children, max_size=3))
    if keyword == "type":
        options.append(st.sampled_from(TYPES) | st.lists(st.sampled_from(TYPES), max_size=3))
    if keyword == "required":
        options.append(st.lists(names, max_size=3))
    if keyword in ("enum", "examples"):
        options.append(st.lists(json_values, max_size=3))
    if keyword == "pattern":
        options.append(st.sampled_from(PATTERNS))
    if keyword == "dependencies":
        options.append(st.dictionaries(names, children | st.lists(names, max_size=2), max_size=2))
    if keyword == "dependentRequired":
        options.append(st.dictionaries(names, st.lists(names, max_size=2), max_size=2))
    if keyword == "$vocabulary":
        options.append(st.dictionaries(st.sampled_from(STRINGS), st.booleans(), max_size=2))
    good = st.one_of(options) if options else json_values  # default, const, unknown keywords: anything
    # one value in ten of any JSON type, right or (mostly) wrong
    return st.integers(0, 9).flatmap(lambda i: json_values if i == 0 else good)


def schemas() -> st.SearchStrategy[Any]:
    def objects(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        entry = st.sampled_from(KEYWORDS).flatmap(lambda k: st.tuples(st.just(k), likely(k, children)))
        return st.lists(entry, max_size=5).map(dict)

    return st.recursive(st.booleans() | objects(st.just({}) | st.booleans()), objects, max_leaves=10)


VERDICTS = {
    (True, True): "both valid",
    (False, True): "fast not sure, jsonschema valid",
    (False, False): "both invalid",
}


@pytest.mark.parametrize("draft", DRAFTS)
def test_random_schemas_fast_valid_means_jsonschema_valid(draft: str) -> None:
    seen: collections.Counter[tuple[bool, bool]] = collections.Counter()

    @settings(max_examples=budget(400), deadline=None)
    @given(schemas())
    def check(schema: Any) -> None:
        f, r = fast(schema, draft), reference(schema, draft)
        event(VERDICTS.get((f, r), "fast valid, jsonschema invalid"))
        seen[(f, r)] += 1
        assert not (f and not r), f"the fast check says valid, jsonschema: {_drafts.meta_error(schema, draft)}"

    check()
    total = sum(seen.values())
    assert seen[(True, True)] >= 0.2 * total, seen  # the fast path is taken, often
    assert seen[(False, True)] <= 0.05 * (seen[(True, True)] + seen[(False, True)]), seen


# ------------------------------------------------------------------ the official test suite


def suite_schemas(folder: str) -> Iterator[tuple[str, Any]]:
    for g in ss.groups(folder):
        yield g.name, g.schema


@pytest.mark.parametrize("folder", list(FOLDERS))
def test_suite_schemas_agree_under_every_draft(folder: str) -> None:
    """Every group's schema, under its own draft (all valid, all decided by the fast
    check) and under every other (some invalid there): the same verdict."""
    groups = list(suite_schemas(folder))
    for draft in DRAFTS:
        wrong = []
        for name, schema in groups:
            f, r = fast(schema, draft), reference(schema, draft)
            if f != r:
                wrong.append(f"{name}: fast {f}, jsonschema {r}")
            if draft == FOLDERS[folder]:
                assert r, name
        assert not wrong, f"under {draft}:\n" + "\n".join(wrong)


# ------------------------------------------------------------------ each keyword's edges

EDGES: list[Any] = [
    {},
    True,
    False,
    [],
    "string",
    {"type": "integer", "minimum": 1.0},
    {"type": "foo"},
    {"type": []},
    {"type": ["string", "string"]},
    {"type": ["string", "null"]},
    {"type": ["any"]},
    {"minLength": 1.0},
    {"minLength": 1.5},
    {"minLength": -1},
    {"minLength": True},
    {"maxContains": -1},
    {"minContains": 1.0},
    {"multipleOf": 0},
    {"multipleOf": -1},
    {"multipleOf": 0.01},
    {"multipleOf": True},
    {"maximum": "1"},
    {"required": []},
    {"required": ["a", "a"]},
    {"required": ["a", 1]},
    {"required": "a"},
    {"enum": []},
    {"enum": [1, 1.0]},
    {"enum": [1, True]},
    {"enum": [0, False, None, "", [], {}]},
    {"enum": [[1, {"a": 2}], [1.0, {"a": 2.0}]]},
    {"enum": [{"a": [True]}, {"a": [1]}]},
    {"enum": "a"},
    {"examples": {}},
    {"examples": []},
    {"exclusiveMinimum": True},
    {"exclusiveMinimum": True, "minimum": 0},
    {"exclusiveMaximum": False, "maximum": 0},
    {"exclusiveMaximum": 1},
    {"items": [{}]},
    {"items": []},
    {"items": True},
    {"items": [True]},
    {"additionalItems": True},
    {"additionalItems": [{}]},
    {"prefixItems": []},
    {"prefixItems": [{}]},
    {"not": True},
    {"not": {"not": []}},
    {"allOf": []},
    {"allOf": {}},
    {"anyOf": [True, {}]},
    {"additionalProperties": True},
    {"additionalProperties": 1},
    {"properties": {"a": True}},
    {"properties": {"a": 1}},
    {"properties": []},
    {"definitions": {"a": {"type": 1}}},
    {"$defs": {"a": {"type": 1}}},
    {"patternProperties": {"[z-a]": {}}},
    {"patternProperties": {"(?=a)": {}}},
    {"patternProperties": {"^a": 1}},
    {"pattern": "(?=a)"},
    {"pattern": "(a"},
    {"pattern": 1},
    {"dependencies": {"a": []}},
    {"dependencies": {"a": ["b", "b"]}},
    {"dependencies": {"a": True}},
    {"dependencies": {"a": {"type": 1}}},
    {"dependencies": []},
    {"dependentRequired": {"a": [1]}},
    {"dependentRequired": {"a": []}},
    {"dependentSchemas": {"a": 1}},
    {"$vocabulary": {"x": 1}},
    {"$vocabulary": {"https://x.org/v": True}},
    {"$id": "#foo"},
    {"$id": "http://x.org/s#"},
    {"$id": 1},
    {"id": 1},
    {"$ref": 1},
    {"$ref": "#/definitions/a"},
    {"$schema": 1},
    {"$anchor": "a:b"},
    {"$anchor": "_a"},
    {"$anchor": "1a"},
    {"$anchor": "foo\n"},
    {"$dynamicAnchor": "a b"},
    {"$dynamicRef": 1},
    {"$recursiveAnchor": True},
    {"$recursiveAnchor": "a"},
    {"$recursiveRef": 1},
    {"$comment": 1},
    {"readOnly": 1},
    {"writeOnly": 1},
    {"deprecated": 1},
    {"contentSchema": 1},
    {"contentMediaType": 1},
    {"if": 1},
    {"unevaluatedProperties": 1},
    {"const": {"type": 1}},
    {"default": {"type": 1}},
    {"title": None},
    {"format": 1},
    {"x-extra": {"type": 1}},
    {"$vocabulary": {1: True}},
    {"patternProperties": {1: {}}},
    {"properties": {1: {"type": 1}}},
    {1: {"type": 1}},
]


@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("schema", EDGES, ids=[json.dumps(s)[:40] for s in EDGES])
def test_keyword_edges_agree(schema: Any, draft: str) -> None:
    assert fast(schema, draft) == reference(schema, draft)
    nested = {"properties": {"a": {"allOf": [schema]}}}  # the same, where a subschema is
    assert fast(nested, draft) == reference(nested, draft)


NOT_MODELLED: list[tuple[Any, list[str]]] = [
    ({"minimum": decimal.Decimal(1)}, DRAFTS),  # a number to jsonschema
    ({"properties": {"a": {"multipleOf": decimal.Decimal("0.5")}}}, DRAFTS),
    ({"enum": [(1,), (2,)]}, ["4"]),  # unique arrays to jsonschema
    ({"enum": [{1: 2}]}, ["4"]),
]


@pytest.mark.parametrize(("schema", "drafts"), NOT_MODELLED, ids=["decimal", "decimal-multiple", "tuples", "int-key"])
def test_what_is_not_modelled_is_left_to_jsonschema(schema: Any, drafts: list[str]) -> None:
    for draft in drafts:
        assert not fast(schema, draft)
        assert reference(schema, draft)  # and decided there


@pytest.mark.parametrize("draft", DRAFTS)
def test_deep_schemas_are_left_to_jsonschema_without_recursion(draft: str) -> None:
    deep: Any = {}
    for _ in range(100_000):
        deep = {"not": deep}
    assert not fast(deep, draft)  # no RecursionError
    shallow: Any = {}
    for _ in range(_metacheck.MAX_DEPTH):
        shallow = {"properties": {"a": shallow}}
    assert fast(shallow, draft) and reference(shallow, draft)
    assert not fast({"properties": {"a": shallow}}, draft)


def test_a_uri_format_the_validator_asserts_is_asserted() -> None:
    """``uri`` and ``uri-reference`` count only where the validator's format checker has
    them (their library installed); then they are asked."""
    import jsonschema

    asked = []

    def no(instance: object) -> bool:
        asked.append(instance)
        return False

    checker = jsonschema.FormatChecker(())
    checker.checks("uri")(no)
    checker.checks("uri-reference")(no)
    for draft in ("2020-12", "2019-09", "7", "6"):
        assert _metacheck.valid({"$ref": 1}, draft) is False
        assert _metacheck.valid({"$ref": "x"}, draft) is True
        assert _metacheck.valid({"$ref": "x"}, draft, checker) is False
        assert _metacheck.valid({"$schema": "x"}, draft, checker) is False
        assert _metacheck.valid({"title": "x"}, draft, checker) is True
    assert _metacheck.valid({"$vocabulary": {"v": True}}, "2020-12", checker) is False
    assert asked


def _documents(draft: str) -> list[Any]:
    """The draft's metaschema and its vocabularies."""
    from jsonschema_specifications import REGISTRY

    folder = next(f for f, d in FOLDERS.items() if d == draft)
    top = REGISTRY[ss.DRAFTS[folder].rstrip("#")].contents
    base = top.get("$id", "").rsplit("/", 1)[0]
    return [top, *(REGISTRY[f"{base}/{r['$ref']}"].contents for r in top.get("allOf", []))]


@pytest.mark.parametrize("draft", DRAFTS)
def test_every_keyword_the_metaschema_constrains_is_checked(draft: str) -> None:
    """The keywords of the metaschema (and its vocabularies) whose value is constrained
    are those the fast check knows; the formats its validator asserts, those it models."""
    constrained = set()
    formats = set()
    for doc in _documents(draft):
        for k, sub in doc.get("properties", {}).items():
            if sub not in ({}, True):
                constrained.add(k)
        stack = [doc]
        while stack:
            x = stack.pop()
            if isinstance(x, dict):
                if isinstance(x.get("format"), str):
                    formats.add(x["format"])
                stack.extend(x.values())
            elif isinstance(x, list):
                stack.extend(x)
    assert constrained == set(_metacheck._KEYWORDS[draft]), constrained ^ set(_metacheck._KEYWORDS[draft])
    asserted = formats & set(_drafts.meta_validator(draft).format_checker.checkers)
    assert "regex" in asserted and asserted <= {"regex", "uri", "uri-reference"}


# ------------------------------------------------------------------ the converter uses it


def test_a_valid_schema_is_not_checked_by_jsonschema(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = _drafts.meta_error

    def spy(data: Any, draft: str) -> Any:
        calls.append(draft)
        return real(data, draft)

    monkeypatch.setattr(_drafts, "meta_error", spy)
    schema = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8} for i in range(50)},
        "required": ["p0"],
    }
    for draft in (None, "2020-12", "7", "4"):
        schema_to_gbnf(schema, default_draft=draft)
        schema_to_gbnf({**schema, "$schema": "http://json-schema.org/draft-07/schema#"}, default_draft=draft)
    tuples = {"type": "array", "items": [{"type": "integer"}], "additionalItems": False}
    with pytest.warns(Warning, match="draft 7"):
        schema_to_gbnf(tuples)  # detection: 2020-12 refuses it (jsonschema words why), draft 7 is sure
    assert calls == ["2020-12"]
    with pytest.raises(SchemaError, match=r"at #/properties/a/minLength: -1 is less than the minimum of 0"):
        schema_to_gbnf({"properties": {"a": {"minLength": -1}}}, default_draft="7")


@pytest.mark.parametrize("folder", ["draft7", "draft4"])
def test_detection_is_the_same_without_the_fast_check(folder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def outcome(schema: Any) -> tuple[str, str | None] | str:
        try:
            return _drafts.detect(schema)
        except SchemaError as e:
            return str(e)

    schemas = [s for _, s in suite_schemas(folder)] + EDGES
    with_fast = [outcome(s) for s in schemas]
    monkeypatch.setattr(_metacheck, "valid", lambda *a: False)
    assert [outcome(s) for s in schemas] == with_fast
