"""samplers.grammar.json_schema against llama.cpp's own JSON schema converter, and the
languages of the grammars it writes (checked with llama.cpp's grammar sampler).

The oracle is ``benchmarks/native/json_schema_to_grammar.cpp``: llama.cpp's
``json_schema_to_grammar()`` at the pinned commit, built once against the cached
``common`` library (:func:`benchmarks.native_tools.build_common_cpp_tool`).
"""

from __future__ import annotations

import json
import math
import re
import string
import subprocess
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import llama_cffi
from benchmarks.native_tools import build_common_cpp_tool, llama_cpp_source_dir
from llama_cffi.errors import ParamError
from llama_cffi.sampling import LlamaSampler, SamplingError, TokenDataArray
from samplers.grammar.builtin import JSON, JSON_ARRAY, JSON_VALUE, choice, json_schema, regex
from samplers.grammar.errors import SchemaError
from samplers.grammar.json_schema import SPACE_RULE, SchemaWarning, gbnf_format_literal
from samplers.grammar.json_schema import llama_cpp_json_schema_to_gbnf as json_schema_to_gbnf

SPACE_LINE = f"space ::= {SPACE_RULE}\n"


# --------------------------------------------------------------------------- the oracle
@dataclass(frozen=True)
class Outcome:
    """A conversion's result: the grammar, or the error message; plus any warning."""

    ok: bool
    text: str  # the grammar, or the error message
    warning: str = ""
    crashed: bool = False  # llama.cpp crashed (a stack overflow)


@pytest.fixture(scope="session")
def oracle_path() -> Path:
    return build_common_cpp_tool("json_schema_to_grammar")


def run_oracle(oracle: Path, schema_text: str, dotall: bool = False) -> Outcome:
    proc = subprocess.run(
        [str(oracle), *(["--dotall"] if dotall else [])],
        input=schema_text.encode("utf-8"),
        capture_output=True,
        timeout=60,
    )
    out = proc.stdout.decode("utf-8", "surrogateescape")
    err = proc.stderr.decode("utf-8", "surrogateescape")
    if proc.returncode == 0:
        prefix = "WARNING: "
        assert err == "" or (err.startswith(prefix) and err.endswith("\n")), err
        return Outcome(True, out, err[len(prefix) : -1] if err else "")
    if proc.returncode < 0:
        return Outcome(False, f"signal {-proc.returncode}", crashed=True)
    assert proc.returncode == 1, (proc.returncode, err)  # 2 would be invalid JSON
    return Outcome(False, err)


def run_ours(schema: Any, dotall: bool = False) -> Outcome:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            grammar = json_schema_to_gbnf(schema, dotall=dotall)
        except SchemaError as e:
            return Outcome(False, str(e))
    assert len(caught) <= 1
    assert all(issubclass(w.category, SchemaWarning) for w in caught)
    return Outcome(True, grammar, str(caught[0].message) if caught else "")


def check_parity(oracle: Path, schema: Any, dotall: bool = False) -> Outcome:
    """Our conversion of ``schema`` (as Python data and as JSON text) equals llama.cpp's:
    same grammar text, or same error message; same warning."""
    text = json.dumps(schema, ensure_ascii=False)
    expected = run_oracle(oracle, text, dotall)
    results = [run_ours(text, dotall)]
    if not isinstance(schema, str):  # a str is JSON text, not a JSON string
        results.append(run_ours(schema, dotall))
    for ours in results:
        if expected.crashed:  # only where an allOf's $refs form a cycle (see test_all_of_ref_cycle)
            assert not ours.ok and "$ref cycle in allOf" in ours.text, ours
        else:
            assert ours == expected
    return expected


# ----------------------------------------------------------------- a table of schemas
TABLE: dict[str, Any] = {
    "any": {},
    "any with annotations": {"title": "x", "description": "y", "$schema": "z"},
    "type null": {"type": "null"},
    "type boolean": {"type": "boolean"},
    "type number": {"type": "number"},
    "number bounds are ignored": {"type": "number", "minimum": 1.5, "maximum": 3},
    "type integer": {"type": "integer"},
    "type string": {"type": "string"},
    "type array": {"type": "array"},
    "type object": {"type": "object"},
    "explicit null type": {"type": None, "minLength": 2},
    "type list": {"type": ["string", "null", "integer"], "minimum": 3, "maxLength": 4},
    "nested type list": {"type": [["boolean"], "null"]},
    "int min 0": {"type": "integer", "minimum": 0},
    "int min 7": {"type": "integer", "minimum": 7},
    "int min 123": {"type": "integer", "minimum": 123},
    "int min -5": {"type": "integer", "minimum": -5},
    "int min -123": {"type": "integer", "minimum": -123},
    "int max 0": {"type": "integer", "maximum": 0},
    "int max 456": {"type": "integer", "maximum": 456},
    "int max -17": {"type": "integer", "maximum": -17},
    "int range": {"type": "integer", "minimum": -30, "maximum": 1234},
    "int negative range": {"type": "integer", "minimum": -1000, "maximum": -7},
    "int single value": {"type": "integer", "minimum": 42, "maximum": 42},
    "int empty range": {"type": "integer", "minimum": 50, "maximum": 3},
    "int exclusive": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100},
    "int fractional bounds": {"type": "integer", "minimum": 1.5, "maximum": 9.9},
    "int fractional exclusive": {"type": "integer", "exclusiveMinimum": -2.5, "exclusiveMaximum": 2.5},
    "int minimum wins over exclusive": {"type": "integer", "minimum": 5, "exclusiveMinimum": 10},
    "int huge bounds": {"type": "integer", "minimum": -(2**62), "maximum": 2**62},
    "int max int64": {"type": "integer", "exclusiveMinimum": 2**63 - 1},
    "int min int64": {"type": "integer", "maximum": -(2**63)},
    "int bound beyond uint64": {"type": "integer", "minimum": 2**70},
    "int bound 1e300": {"type": "integer", "minimum": 1e300},
    "int bound -1e300": {"type": "integer", "maximum": -1e300},
    "int bound uint64": {"type": "integer", "minimum": 2**64 - 1},
    "int bound not a number": {"type": "integer", "minimum": "3"},
    "int bound bool": {"type": "integer", "maximum": True},
    "string minLength": {"type": "string", "minLength": 3},
    "string maxLength": {"type": "string", "maxLength": 5},
    "string min max": {"type": "string", "minLength": 2, "maxLength": 4},
    "string zero length": {"type": "string", "maxLength": 0},
    "string length 1 1": {"type": "string", "minLength": 1, "maxLength": 1},
    "string length inverted": {"type": "string", "minLength": 4, "maxLength": 2},
    "string bad minLength": {"type": "string", "minLength": -1},
    "string float minLength": {"type": "string", "minLength": 1.0},
    "string minLength 2**32+1": {"type": "string", "minLength": 2**32 + 1},
    "string maxLength 2**31": {"type": "string", "maxLength": 2**31},
    "no type, string keywords": {"maxLength": 3},
    "format date": {"type": "string", "format": "date"},
    "format time": {"type": "string", "format": "time"},
    "format date-time": {"type": "string", "format": "date-time"},
    "format uuid": {"type": "string", "format": "uuid"},
    "format uuid4": {"type": "string", "format": "uuid4"},
    "format uuid6 (unknown)": {"type": "string", "format": "uuid6"},
    "format email (unknown)": {"type": "string", "format": "email", "maxLength": 3},
    "format not a string": {"type": "string", "format": 3},
    "format without type": {"format": "date"},
    "format and pattern": {"type": "string", "format": "date", "pattern": "^a$"},
    "pattern literal": {"type": "string", "pattern": "^abc$"},
    "pattern classes": {"type": "string", "pattern": "^[a-z]+[0-9]*[^\\n\\x41]?$"},
    "pattern repetition": {"type": "string", "pattern": "^(ab){2,3}c{4}d{1,}e{,2}.{3}$"},
    "pattern alternation": {"type": "string", "pattern": "^(a|bc|)x|y$"},
    "pattern dot": {"type": "string", "pattern": "^a.b.$"},
    "pattern quote": {"type": "string", "pattern": '^"x"*$'},
    "pattern escapes": {"type": "string", "pattern": "^\\.\\*\\(\\u00e9\\x7e\\n\\t\\\\$"},
    "pattern reused sub rule": {"type": "string", "pattern": "^[ab]{2}-[ab]{3}-[cd]{1,2}$"},
    "pattern non-ascii quantified": {"type": "string", "pattern": "^é*ü{2}$"},
    "pattern unanchored": {"type": "string", "pattern": "abc"},
    "pattern lookahead": {"type": "string", "pattern": "^(?=a)a$"},
    "pattern shorthand": {"type": "string", "pattern": "^\\d+$"},
    "pattern inner anchor": {"type": "string", "pattern": "^a^b$"},
    "pattern bad curly": {"type": "string", "pattern": "^a{x}$"},
    "pattern curly 3 values": {"type": "string", "pattern": "^a{1,2,3}$"},
    "pattern curly whitespace": {"type": "string", "pattern": "^a{ 2 , +3x}$"},
    "pattern curly negative": {"type": "string", "pattern": "^a{-1}$"},
    "pattern unterminated curly": {"type": "string", "pattern": "^a{2$"},
    "pattern stray bracket": {"type": "string", "pattern": "^a]$"},
    "pattern unbalanced": {"type": "string", "pattern": "^(a$"},
    "pattern extra paren": {"type": "string", "pattern": "^a)$"},
    "pattern nothing to repeat": {"type": "string", "pattern": "^*a$"},
    "pattern nothing to repeat curly": {"type": "string", "pattern": "^{2}$"},
    "pattern trailing backslash": {"type": "string", "pattern": "^a\\$"},
    "pattern unterminated class": {"type": "string", "pattern": "^[abc$"},
    "pattern too deep": {"type": "string", "pattern": "^" + "(" * 101 + "a" + ")" * 101 + "$"},
    "pattern empty": {"type": "string", "pattern": "", "minLength": 1},
    "pattern not a string": {"type": "string", "pattern": 1},
    "two bad patterns": {
        "type": "object",
        "properties": {"a": {"pattern": "^(a$"}, "b": {"pattern": "^[a$"}, "c": {"pattern": "^\\w$"}},
    },
    "dot rule name collision": {
        "type": "object",
        "properties": {"dot": {"const": 1}, "s": {"type": "string", "pattern": "^.$"}},
        "required": ["dot", "s"],
    },
    "const string": {"const": 'a"b\\c\nd\re\tf\x01\x7fé'},
    "const number": {"const": 1.5},
    "const float forms": {
        "enum": [
            0.1,
            1e-5,
            1e16,
            1e15,
            123456789012345.6,
            5e-324,
            -0.0,
            2.0,
            1.7976931348623157e308,
            4.420728953552187e-199,
        ]
    },
    "const object": {"const": {"b": [1, None, True], "a": {"x": "y"}}},
    "const with type": {"type": "string", "const": 5},
    "enum": {"enum": ["a", 1, None, False, [1], {"k": "v"}]},
    "enum empty": {"enum": []},
    "enum not a list": {"enum": "a"},
    "object properties": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}, "x": {}},
        "required": ["name"],
    },
    "object all required": {
        "properties": {"a": {"type": "number"}, "b": {"type": "boolean"}},
        "required": ["b", "a", "zz", 3],
        "additionalProperties": False,
    },
    "object optional only": {"properties": {"a": {}, "b": {}, "c": {}}},
    "object additional true": {"properties": {"a": {"type": "null"}}, "additionalProperties": True},
    "object additional schema": {
        "properties": {"a": {}, "ab": {}, "b": {}},
        "additionalProperties": {"type": "integer"},
    },
    "object additional only": {"type": "object", "additionalProperties": {"type": "string"}},
    "object additional false only": {"type": "object", "additionalProperties": False},
    "object additional bad": {"type": "object", "additionalProperties": 3},
    "object additional empty-schema": {"additionalProperties": {}},
    "object properties not an object": {"type": "object", "properties": []},
    "object reserved property names": {
        "properties": {"root": {}, "string": {"type": "string"}, "value": {}, "char": {"const": 1}, "integer": {}},
        "required": ["root"],
    },
    "object odd property names": {
        "properties": {"a b": {"type": "integer"}, "é": {}, "": {"type": "null"}, 'a"b': {}, "a-b": {}, "*": {}},
        "additionalProperties": True,
    },
    "object empty name excluded": {"properties": {"": {}}, "additionalProperties": True},
    "object rule name collision": {
        "properties": {"a": {"properties": {"b": {"const": 1}}}, "a-b": {"const": 2}},
        "required": ["a", "a-b"],
    },
    "object duplicate rule bodies": {"properties": {"x": {"const": 1}, "y": {"properties": {"x": {"const": 1}}}}},
    "array items": {"type": "array", "items": {"type": "integer"}},
    "array min max": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 5},
    "array min 1": {"type": "array", "items": {"type": "boolean"}, "minItems": 1},
    "array max 1": {"type": "array", "items": {"type": "boolean"}, "maxItems": 1},
    "array max 0": {"type": "array", "items": {"type": "boolean"}, "maxItems": 0},
    "array min only": {"type": "array", "minItems": 3},
    "array inverted": {"type": "array", "items": {}, "minItems": 3, "maxItems": 1},
    "array bad maxItems": {"type": "array", "maxItems": "2"},
    "array items not a schema": {"type": "array", "items": True},
    "tuple": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "minItems": 5},
    "tuple via items": {"items": [{"type": "null"}, {}]},
    "empty tuple": {"type": "array", "items": []},
    "items wins over prefixItems": {"type": "array", "items": {"type": "null"}, "prefixItems": [{}]},
    "anyOf": {"anyOf": [{"type": "string"}, {"type": "integer", "maximum": 3}]},
    "oneOf": {"oneOf": [{"type": "null"}, {"const": "x"}]},
    "oneOf wins over anyOf": {"oneOf": [{"type": "null"}], "anyOf": [{"type": "string"}]},
    "anyOf in property": {"properties": {"p": {"anyOf": [{"type": "number"}, {"type": "null"}]}}},
    "anyOf empty": {"anyOf": []},
    "anyOf not a list": {"anyOf": {}},
    "allOf objects": {
        "allOf": [
            {"properties": {"a": {"type": "string"}}},
            {"properties": {"b": {"type": "integer"}}},
            {"anyOf": [{"properties": {"c": {}}}, {"properties": {"d": {}}}]},
        ]
    },
    "allOf enums": {"allOf": [{"enum": ["a", "b", "c"]}, {"enum": ["b", "c", "d"]}]},
    "allOf disjoint enums": {"allOf": [{"enum": ["a"]}, {"enum": ["b"]}]},
    "allOf with type string": {"type": "string", "allOf": [{"enum": ["x", "y"]}, {"enum": ["y"]}]},
    "allOf with object type": {"type": "object", "allOf": [{"properties": {"a": {}}}]},
    "allOf ignored by properties": {"properties": {"z": {}}, "allOf": [{"properties": {"a": {}}}]},
    "allOf refs": {
        "$defs": {"A": {"properties": {"a": {"type": "null"}}, "required": ["a"]}},
        "allOf": [{"$ref": "#/$defs/A"}, {"properties": {"b": {}}}],
    },
    "ref to defs": {"$ref": "#/$defs/foo", "$defs": {"foo": {"type": "integer", "minimum": 1}}},
    "ref to definitions": {"$ref": "#/definitions/foo", "definitions": {"foo": {"type": "string"}}},
    "ref nested path": {
        "properties": {"a": {"$ref": "#/$defs/x/properties/y"}},
        "$defs": {"x": {"properties": {"y": {"const": "deep"}}}},
    },
    "ref into array": {"$ref": "#/$defs/list/1", "$defs": {"list": [{"type": "null"}, {"type": "boolean"}]}},
    "ref array index sign": {"$ref": "#/$defs/list/-0", "$defs": {"list": [{"type": "null"}]}},
    "ref array index out of range": {"$ref": "#/$defs/list/2", "$defs": {"list": [{"type": "null"}]}},
    "ref array index huge": {"$ref": "#/$defs/list/" + "0" * 5000 + "1", "$defs": {"list": [{}, {"type": "null"}]}},
    "ref array index overflow": {"$ref": "#/$defs/list/" + "9" * 5000, "$defs": {"list": [{}]}},
    "pattern curly huge": {"pattern": "^a{" + "9" * 5000 + "}$"},
    "ref array index not a number": {"$ref": "#/$defs/list/x", "$defs": {"list": [{"type": "null"}]}},
    "ref recursive": {
        "$ref": "#/$defs/node",
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "value": {"type": "integer"},
                    "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]},
                },
                "required": ["value"],
            }
        },
    },
    "ref used twice": {
        "properties": {"a": {"$ref": "#/$defs/t"}, "b": {"$ref": "#/$defs/t"}},
        "$defs": {"t": {"type": "string", "maxLength": 2}},
    },
    "ref names sanitised": {"$ref": "#/$defs/a b.c", "$defs": {"a b.c": {"type": "null"}}},
    "ref names collide": {
        "properties": {"x": {"$ref": "#/$defs/a b"}, "y": {"$ref": "#/$defs/a.b"}},
        "$defs": {"a b": {"type": "null"}, "a.b": {"type": "string"}},
    },
    "ref to root": {"properties": {"self": {"$ref": "#/properties"}}},
    "ref remote": {"$ref": "https://example.com/schema.json"},
    "ref relative": {"$ref": "other.json#/$defs/a"},
    "ref fragment only": {"$ref": "#"},
    "ref missing": {"$ref": "#/$defs/missing", "$defs": {}},
    "ref not a string": {"$ref": 1},
    "ref to a non-schema": {"$ref": "#/$defs/x", "$defs": {"x": 5}},
    "ref takes precedence": {"$ref": "#/$defs/a", "type": "string", "$defs": {"a": {"type": "null"}}},
    "unknown type": {"type": "str"},
    "type not a string": {"type": 5},
    "type list empty": {"type": []},
    "bad schema in properties": {"properties": {"a": 5}},
    "bad schema in anyOf": {"anyOf": [{}, "x"]},
    "deep nesting": {"items": {"items": {"items": {"items": {"properties": {"a": {"items": {"type": "integer"}}}}}}}},
    "readme example": {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 100},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
            },
            "required": ["name", "age"],
            "additionalProperties": False,
        },
        "minItems": 10,
        "maxItems": 100,
    },
}


@pytest.mark.parametrize("name", list(TABLE))
def test_table_matches_llama_cpp(oracle_path: Path, name: str) -> None:
    check_parity(oracle_path, TABLE[name])


@pytest.mark.parametrize(
    "name", ["pattern dot", "pattern alternation", "object optional only", "type list", "pattern unanchored"]
)
def test_dotall_matches_llama_cpp(oracle_path: Path, name: str) -> None:
    check_parity(oracle_path, TABLE[name], dotall=True)


def test_all_of_ref_cycle(oracle_path: Path) -> None:
    """An allOf whose $refs only lead to each other: llama.cpp recurses until its stack
    overflows; we refuse it."""
    schema = {"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}
    assert run_oracle(oracle_path, json.dumps(schema)).crashed
    with pytest.raises(SchemaError) as err:
        json_schema_to_gbnf(schema)
    assert str(err.value) == (
        "JSON schema conversion failed:\n$ref cycle in allOf, the $refs only refer to each other: "
        "#/$defs/a -> #/$defs/b -> #/$defs/a"
    )
    # a cycle through an object is fine (the object ends the chain)
    schema = {"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"properties": {"x": {"$ref": "#/$defs/a"}}}}}
    assert check_parity(oracle_path, schema).ok


def test_dotall_dot_rule() -> None:
    plain = json_schema_to_gbnf({"pattern": "^.$"})
    dotall = json_schema_to_gbnf({"pattern": "^.$"}, dotall=True)
    assert "dot ::= [^\\x0A\\x0D]\n" in plain
    assert "dot ::= [\\U00000000-\\U0010FFFF]\n" in dotall


def test_table_outcomes_by_reasoning(oracle_path: Path) -> None:
    """A few outcomes worked out by hand from llama.cpp's source, so that a broken oracle
    cannot hide a broken converter."""
    # a primitive at the root is the root rule itself (no alias rule)
    assert json_schema_to_gbnf({"type": "boolean"}) == 'root ::= ("true" | "false")\n' + SPACE_LINE
    assert json_schema_to_gbnf({"const": "hi"}) == 'root ::= "\\"hi\\""\n' + SPACE_LINE
    assert json_schema_to_gbnf({"type": "integer", "minimum": 1}) == "root ::= ([1-9] [0-9]{0,15})\n" + SPACE_LINE
    # the bounds' order in the rule: nothing sorted but the rule names
    g = json_schema_to_gbnf({"properties": {"b": {"type": "null"}, "a": {"const": 1}}, "required": ["b", "a"]})
    assert g.splitlines() == [
        'a ::= "1"',
        'a-kv ::= "\\"a\\"" space ":" space a',
        'b-kv ::= "\\"b\\"" space ":" space null',
        'null ::= "null"',
        'root ::= "{" space b-kv "," space a-kv space "}"',
        SPACE_LINE.strip(),
    ]
    # a remote $ref is refused, naming it
    with pytest.raises(SchemaError, match=r"unsupported \$ref https://x/y, only references into the same document"):
        json_schema_to_gbnf({"$ref": "https://x/y"})
    with pytest.raises(SchemaError, match="JSON schema error at #/properties/p: unrecognized type str"):
        json_schema_to_gbnf({"properties": {"p": {"type": "str"}}})
    with pytest.warns(SchemaWarning, match=r"pattern \^\\d\$ is not supported \(unsupported escape: \\d\)"):
        assert json_schema_to_gbnf({"pattern": "^\\d$"}).startswith("char ::= ")
    with pytest.raises(SchemaError) as err:
        json_schema_to_gbnf({"pattern": "^a($"})
    assert str(err.value) == "JSON schema conversion failed:\nInvalid pattern ^a($: unbalanced parentheses"


def test_non_ascii_split_by_quantifier() -> None:
    """llama.cpp's pattern translation works on UTF-8 bytes: a quantifier after a multi-byte
    character applies to its last byte only. The output keeps those bytes (as lone
    surrogates, Python's surrogateescape)."""
    g = json_schema_to_gbnf({"pattern": "^é*$"})
    assert g.startswith('root ::= "\\"" ("\udcc3" "\udca9"*) "\\""\n')
    assert g.encode("utf-8", "surrogateescape").startswith(b'root ::= "\\"" ("\xc3" "\xa9"*) "\\""\n')


def test_gbnf_format_literal() -> None:
    assert gbnf_format_literal('a"b\\c\nd\re\tf') == '"a\\"b\\\\c\\nd\\re\tf"'
    assert gbnf_format_literal("é") == '"é"'


# ------------------------------------------------ llama.cpp's own test cases, parsed
_CASE_RE = re.compile(
    r'test\(\{\s*(SUCCESS|FAILURE),\s*"((?:[^"\\]|\\.)*)",\s*'
    r'(?:R"""\((.*?)\)"""|"((?:[^"\\]|\\.)*)"),\s*'
    r'(?:R"""\((.*?)\)"""|"")\s*\}\);',
    re.S,
)


def _trim(text: str) -> str:
    """The C++ test's trim(): strip the ends and every line's leading blanks."""
    return re.sub(r"(^|\n)[ \t]+", r"\1", text.strip(" \n\r\t"))


def _llama_cpp_cases() -> list[tuple[str, bool, str, str]]:
    src = (llama_cpp_source_dir() / "tests" / "test-json-schema-to-grammar.cpp").read_text()
    cases = []
    for m in _CASE_RE.finditer(src):
        status, name, raw_schema, quoted_schema, grammar = m.groups()
        schema = raw_schema if raw_schema is not None else json.loads(f'"{quoted_schema}"')
        cases.append((name, status == "SUCCESS", schema, grammar or ""))
    return cases


def test_llama_cpp_test_cases(oracle_path: Path) -> None:
    """Every ``test({...})`` of llama.cpp's tests/test-json-schema-to-grammar.cpp: our
    grammar (or error) equals the oracle's, and both equal the test's expectation."""
    src = (llama_cpp_source_dir() / "tests" / "test-json-schema-to-grammar.cpp").read_text()
    cases = _llama_cpp_cases()
    assert len(cases) == src.count("test({") and len(cases) >= 50
    for name, success, schema, expected in cases:
        theirs = run_oracle(oracle_path, schema)
        ours = run_ours(schema)
        assert ours == theirs, name
        assert ours.ok == success, name
        if success:
            assert _trim(ours.text) == _trim(expected), name


# ------------------------------------------------------------- random schemas (parity)
PROP_NAMES = st.sampled_from(
    ["a", "b", "c", "ab", "root", "string", "value", "char", "dot", "item", "additional", "x y", "é", "1", "",
     "a-b", "*", "kv", 'q"', "ref-defs-a", "tuple-0", "date", "space", "a-kv", "\n"]
)  # fmt: skip
TYPES = ["null", "boolean", "integer", "number", "string", "array", "object"]
REFS = st.sampled_from(
    ["#/$defs/a", "#/$defs/b", "#/$defs/0", "#/definitions/a", "#/$defs/a/properties/a", "#/$defs/arr/0",
     "#/$defs/arr/1", "#/$defs/arr/-0", "#/$defs/arr/+1", "#/$defs/arr/ 0x", "#/$defs/arr/9", "#/$defs/arr/x",
     "#/$defs/missing", "#", "#/", "https://example.com/s.json", "s.json#/a", "#/properties/a", "#/$defs/a/type",
     "#/$defs/a/anyOf/0", "#/items"]
)  # fmt: skip

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4)
)
json_values = st.recursive(
    json_scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3), max_leaves=5
)
bounds = st.one_of(
    st.integers(-1100, 1100),
    st.integers(-(2**65), 2**65),
    st.sampled_from([0, 1, 9, 10, 99, 100, 2**63 - 1, -(2**63), -(2**63) + 1, 2**64 - 1, 2**31 - 1]),
    st.floats(-1e5, 1e5),
    st.floats(allow_nan=False, allow_infinity=False),
)
counts = st.one_of(st.integers(0, 6), st.sampled_from([2**31, 2**32, 2**32 + 2, -1, 1.0, True, "1"]))
FORMATS = st.sampled_from(["date", "time", "date-time", "uuid", "uuid1", "uuid5", "uuid6", "uuid10", "email", 7])

regex_atoms = st.sampled_from(
    ["a", "b", "ab", ".", "[a-c]", "[^x]", "[\\]]", "\\.", "\\d", "\\n", "\\x41", "\\u00e9", "\\U0001F600", "é",
     '"', "-", "\\\\", "\\-", "\\w", "[\\d]", "\\/", "ü", "xyz", "]", "}", ","]
)  # fmt: skip
QUANTIFIERS = st.sampled_from(["*", "+", "?", "{2}", "{1,3}", "{2,}", "{,2}", "{0}", "{x}", "{1,2,3}", "{ 1}", "{}"])
regex_bodies = st.recursive(
    regex_atoms,
    lambda c: st.one_of(
        st.lists(c, min_size=2, max_size=3).map("".join),
        st.lists(c, min_size=2, max_size=3).map("|".join),
        st.tuples(st.sampled_from(["(", "(?:"]), c).map(lambda t: f"{t[0]}{t[1]})"),
        st.tuples(c, QUANTIFIERS).map("".join),
    ),
    max_leaves=6,
)
patterns = st.one_of(
    regex_bodies.map(lambda r: f"^{r}$"),
    regex_bodies,
    st.text(alphabet='ab^$.()[]{}|*+?\\-,0123dxu"é ', max_size=12).map(lambda r: f"^{r}$"),
)


def _keywords(draw: st.DrawFn, pairs: dict[str, st.SearchStrategy[Any]], p: float = 0.4) -> dict[str, Any]:
    """Each keyword with probability p; now and then a junk value instead."""
    out: dict[str, Any] = {}
    for key, strat in pairs.items():
        if draw(st.floats(0, 1)) < p:
            out[key] = draw(json_values) if draw(st.integers(0, 19)) == 0 else draw(strat)
    return out


@st.composite
def leaf_schemas(draw: st.DrawFn) -> Any:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return {}
    if kind == 1:
        return {"type": draw(st.sampled_from(TYPES))}
    if kind == 2:
        keys: dict[str, st.SearchStrategy[Any]] = {
            "minimum": bounds,
            "maximum": bounds,
            "exclusiveMinimum": bounds,
            "exclusiveMaximum": bounds,
        }
        return {"type": "integer", **_keywords(draw, keys)}
    if kind == 3:
        keys = {"minLength": counts, "maxLength": counts, "pattern": patterns, "format": FORMATS}
        base = {"type": "string"} if draw(st.booleans()) else {}
        return {**base, **_keywords(draw, keys)}
    if kind == 4:
        return {"const": draw(json_values)}
    if kind == 5:
        return {"enum": draw(st.lists(json_values, min_size=1, max_size=4))}
    if kind == 6:
        return {"$ref": draw(REFS)}
    if kind == 7:
        return {"type": draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=3))}
    if kind == 8:
        return {"pattern": draw(patterns)}
    return draw(json_values)  # junk: mostly not a schema at all


def _compound(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    @st.composite
    def build(draw: st.DrawFn) -> Any:
        kind = draw(st.integers(0, 5))
        if kind == 0:
            keys = {
                "type": st.just("object"),
                "properties": st.dictionaries(PROP_NAMES, children, max_size=4),
                "required": st.lists(PROP_NAMES, max_size=4),
                "additionalProperties": st.booleans() | children,
                "allOf": st.lists(children, min_size=1, max_size=2),
            }
            return _keywords(draw, keys, 0.6)
        if kind == 1:
            keys = {
                "type": st.just("array"),
                "items": children | st.lists(children, max_size=3),
                "prefixItems": st.lists(children, max_size=3),
                "minItems": counts,
                "maxItems": counts,
            }
            return _keywords(draw, keys, 0.5)
        if kind == 2:
            key = draw(st.sampled_from(["anyOf", "oneOf", "allOf"]))
            return {key: draw(st.lists(children, min_size=1, max_size=3))}
        if kind == 3:
            types = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=3))
            keys = {
                "properties": st.dictionaries(PROP_NAMES, children, max_size=2),
                "items": children,
                "minLength": counts,
                "minimum": bounds,
                "enum": st.lists(json_values, min_size=1, max_size=2),
            }
            return {"type": types, **_keywords(draw, keys, 0.3)}
        if kind == 4:
            return {
                "allOf": draw(st.lists(children, min_size=1, max_size=3)),
                **_keywords(draw, {"type": st.just("object")}),
            }
        return {"type": "string", "allOf": draw(st.lists(children, min_size=1, max_size=2))}

    return build()


schema_bodies = st.recursive(leaf_schemas(), _compound, max_leaves=8)


@st.composite
def documents(draw: st.DrawFn) -> Any:
    """A root schema, usually with ``$defs`` / ``definitions`` for the ``$ref`` leaves."""
    root = draw(schema_bodies)
    if not isinstance(root, dict) or draw(st.integers(0, 4)) == 0:
        return root
    defs = draw(st.dictionaries(st.sampled_from(["a", "b", "0"]), schema_bodies, max_size=3))
    if draw(st.booleans()):
        defs = {**defs, "arr": draw(st.lists(schema_bodies, max_size=2))}
    extra: dict[str, Any] = {"$defs": defs}
    if draw(st.booleans()):
        extra["definitions"] = {"a": draw(schema_bodies)}
    return {**root, **extra}


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(schema=documents(), dotall=st.booleans())
def test_random_schemas_match_llama_cpp(oracle_path: Path, schema: Any, dotall: bool) -> None:
    check_parity(oracle_path, schema, dotall)


@given(pattern=patterns, dotall=st.booleans(), name=PROP_NAMES)
def test_random_patterns_match_llama_cpp(oracle_path: Path, pattern: str, dotall: bool, name: str) -> None:
    check_parity(
        oracle_path, {"properties": {name: {"type": "string", "pattern": pattern}}, "required": [name]}, dotall
    )


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=20))
def test_float_constants_match_llama_cpp(oracle_path: Path, values: list[float]) -> None:
    """Doubles print as nlohmann prints them (Grisu2 digits, its %g-like layout)."""
    check_parity(oracle_path, {"enum": values})


@given(values=st.lists(st.integers(-(2**80), 2**80) | st.text(), min_size=1, max_size=20))
def test_int_and_string_constants_match_llama_cpp(oracle_path: Path, values: list[Any]) -> None:
    check_parity(oracle_path, {"enum": values})


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(lo=bounds, hi=bounds, excl=st.booleans())
def test_integer_ranges_match_llama_cpp(oracle_path: Path, lo: Any, hi: Any, excl: bool) -> None:
    keys = ("exclusiveMinimum", "exclusiveMaximum") if excl else ("minimum", "maximum")
    check_parity(oracle_path, {"type": "integer", keys[0]: lo, keys[1]: hi})


# --------------------------------------------------------------- input that is not JSON
python_junk = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text()
    | st.binary(max_size=3)
    | st.complex_numbers()
    | st.just(object())
    | st.just(math.inf),
    lambda c: (
        st.lists(c, max_size=3)
        | st.tuples(c, c)
        | st.dictionaries(st.text(max_size=2) | st.integers() | st.none(), c, max_size=3)
        | st.frozensets(st.integers(), max_size=2)
    ),
    max_leaves=8,
)


@given(value=python_junk)
def test_any_python_input_gives_a_grammar_or_schema_error(value: Any) -> None:
    out = run_ours(value)  # any exception but SchemaError fails
    assert isinstance(out.text, str)


@given(text=st.text(alphabet='{}[]":,0123456789.eE+-truefalsn \\u\n\t', max_size=30))
def test_any_text_input_gives_a_grammar_or_schema_error(text: str) -> None:
    out = run_ours(text)
    assert isinstance(out.text, str)


JSON_TEXTS = [
    '{"type": "string", "a": 1, "type": "integer"}',  # a duplicate key: the last value, first place
    '{"properties": {"a": {}, "b": {}, "a": {"type": "null"}}}',
    '{"enum": [-0, 1E2, -0.0, 1e-400, -9223372036854775809, 18446744073709551616, 1.0]}',
    '\ufeff{"type": "null"}',  # a byte order mark
    ' \n{"type": "null"}\t\n',
    '{"const": "\\u0000\\u001f\\u007f\\ud83d\\ude00"}',
    '{"type": "integer", "minimum": 18446744073709551615}',
]


@pytest.mark.parametrize("text", JSON_TEXTS)
def test_json_text_matches_llama_cpp(oracle_path: Path, text: str) -> None:
    assert run_ours(text) == run_oracle(oracle_path, text)


@pytest.mark.parametrize(
    "text", ["", "{", '{"a": NaN}', "[1e400]", '"\\ud800"', "{} x", "{'a': 1}", "Infinity", "\ud800"]
)
def test_invalid_json_text(text: str) -> None:
    with pytest.raises(SchemaError, match="invalid JSON"):
        json_schema_to_gbnf(text)


@pytest.mark.parametrize(
    "value",
    [{"const": math.nan}, {"const": {1: 2}}, {"enum": [b"x"]}, {"const": object()}, {"const": "\ud800"}, {1: {}}],
)
def test_not_json_values(value: Any) -> None:
    with pytest.raises(SchemaError, match="invalid JSON"):
        json_schema_to_gbnf(value)


def test_boolean_schema_is_refused_like_llama_cpp(oracle_path: Path) -> None:
    assert check_parity(oracle_path, True) == Outcome(
        False, "JSON schema conversion failed:\nJSON schema error at #: schema must be an object"
    )
    with pytest.raises(SchemaError):
        json_schema_to_gbnf(False)


def test_deep_nesting_is_a_schema_error() -> None:
    schema: dict[str, Any] = {}
    for _ in range(5000):
        schema = {"items": schema}
    with pytest.raises(SchemaError, match="nested too deeply"):
        json_schema_to_gbnf(schema)
    with pytest.raises(SchemaError):
        json_schema_to_gbnf("[" * 100000)


def test_cyclic_python_input_is_a_schema_error() -> None:
    schema: dict[str, Any] = {"type": "object"}
    schema["properties"] = {"a": schema}
    with pytest.raises(SchemaError):
        json_schema_to_gbnf(schema)


def test_mapping_and_tuple_input() -> None:
    from types import MappingProxyType

    schema = MappingProxyType({"enum": ("a", 1), "type": "string"})
    assert json_schema_to_gbnf(schema) == json_schema_to_gbnf({"enum": ["a", 1]})


# ------------------------------------------------------------- the grammars' languages
class Acceptor:
    """Whole-text acceptance by llama.cpp's grammar sampler: every token of the text must
    be allowed in turn, and an end-of-generation token must be allowed at the end."""

    def __init__(self, vocab: llama_cffi.Vocab) -> None:
        self.vocab = vocab
        eos = vocab.eos
        assert eos is not None
        self.eog = eos

    def sampler(self, gbnf: str) -> LlamaSampler:
        return LlamaSampler.grammar(self.vocab, gbnf)

    def accepts(self, gbnf: str, text: str) -> bool:
        with self.sampler(gbnf) as s:
            for tok in self.vocab.tokenize(text, add_special=False):
                try:
                    s.accept(int(tok))
                except SamplingError:
                    return False
            cands = TokenDataArray(1).fill([self.eog], [0.0])
            s.apply(cands)
            return bool(cands.logits[0] != -math.inf)


@pytest.fixture(scope="session")
def acceptor(tiny_model_path: Path) -> Iterator[Acceptor]:
    with llama_cffi.Model.load(tiny_model_path, vocab_only=True) as model:
        yield Acceptor(model.vocab)


def test_acceptor_sanity(acceptor: Acceptor) -> None:
    g = 'root ::= "ab" [0-9]+\n'
    assert acceptor.accepts(g, "ab1")
    assert acceptor.accepts(g, "ab123")
    assert not acceptor.accepts(g, "ab")  # incomplete
    assert not acceptor.accepts(g, "ax1")  # refused token
    assert not acceptor.accepts(g, "ab1 ")
    with pytest.raises(ParamError):
        acceptor.sampler("root ::= undefined-rule\n")


def _dumps(value: Any, style: int) -> str:
    """JSON text in a layout the converter's ``space`` rule allows (strings as nlohmann
    dumps them: only quotes, backslashes and control characters escaped)."""
    if style == 0:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if style == 1:
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, indent=2, ensure_ascii=False)


# Schemas with instances: (schema, valid instances, invalid instances), by construction.
# Valid instances list an object's required properties, then its optional ones, each in
# schema order: the order of llama.cpp's grammar.
S = string.ascii_letters + string.digits + " _-"
texts = st.text(alphabet=S, max_size=6)
scalars = texts | st.integers(-(10**6), 10**6) | st.none() | st.booleans()
instance_values = st.recursive(
    scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(texts, c, max_size=3), max_leaves=6
)


@dataclass
class Case:
    schema: dict[str, Any]
    valid: list[Any]
    invalid: list[Any]


@st.composite
def leaf_cases(draw: st.DrawFn) -> Case:
    schema: dict[str, Any]
    invalid: list[Any]
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return Case({"type": "null"}, [None], [0, "null", False])
    if kind == 1:
        return Case({"type": "boolean"}, [draw(st.booleans())], [1, "true", None])
    if kind == 2:
        lo = draw(st.none() | st.integers(-2000, 2000))
        hi = draw(st.none() | st.integers(-2000, 2000))
        if lo is not None and hi is not None and lo > hi:
            lo, hi = hi, lo
        schema = {"type": "integer"}
        invalid = ["1", 1.5, True]
        if lo is not None:
            schema["minimum"] = lo
            invalid.append(lo - draw(st.integers(1, 10**6)))
        if hi is not None:
            schema["maximum"] = hi
            invalid.append(hi + draw(st.integers(1, 10**6)))
        lo_, hi_ = -(10**12) if lo is None else lo, 10**12 if hi is None else hi
        return Case(schema, [draw(st.integers(lo_, hi_)), lo_, hi_], invalid)
    if kind == 3:
        return Case({"type": "number"}, [draw(st.integers(-(10**9), 10**9)), 0.5, -12.25], ["1", None, [1]])
    if kind == 4:
        lo = draw(st.integers(0, 4))
        hi = lo + draw(st.integers(0, 4))
        valid = draw(st.text(alphabet=S, min_size=lo, max_size=hi))
        invalid = ["x" * (hi + 1), 3]
        if lo > 0:
            invalid.append("x" * (lo - 1))
        return Case(
            {"type": "string", "minLength": lo, "maxLength": hi},
            [valid, 'é\n"\\'[:hi]] if lo == 0 else [valid],
            invalid,
        )
    if kind == 5:
        values = draw(st.lists(scalars, min_size=1, max_size=4, unique_by=json.dumps))
        other = draw(texts.filter(lambda t: t not in values))
        return Case({"enum": values}, [draw(st.sampled_from(values))], [other, [values[0]]])
    if kind == 6:
        value = draw(scalars)
        return Case({"const": value}, [value], [[value], "zz" if value != "zz" else "zy"])
    if kind == 7:
        fmt = draw(st.sampled_from(["date", "time", "date-time", "uuid"]))
        good = {
            "date": "2024-02-29",
            "time": "23:59:01.123+05:30",
            "date-time": "1999-12-31T00:00:00Z",
            "uuid": "123e4567-e89b-12d3-a456-426614174000",
        }[fmt]
        bad = {"date": "2024-13-01", "time": "24:00:00Z", "date-time": "1999-12-31 00:00:00Z", "uuid": "123e4567"}[fmt]
        return Case({"type": "string", "format": fmt}, [good], [bad, 1])
    if kind == 8:
        # pattern: a word from a small regular language
        return Case(
            {"type": "string", "pattern": "^[a-c]{2,3}(-[0-9]+)?(x|yz)*$"},
            [draw(st.from_regex(r"\A[a-c]{2,3}(-[0-9]+)?(x|yz)*\Z"))],
            ["a", "abcd", "ab-", "abx y", "ab-1q"],
        )
    return Case({}, [draw(instance_values)], [])


def _walk(v: Any) -> Iterator[Any]:
    yield v
    if isinstance(v, list):
        for x in v:
            yield from _walk(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from _walk(x)


def _has_float(v: Any) -> bool:
    return any(isinstance(x, float) for x in _walk(v))


def _case_compound(children: st.SearchStrategy[Case]) -> st.SearchStrategy[Case]:
    @st.composite
    def build(draw: st.DrawFn) -> Case:
        schema: dict[str, Any]
        invalid: list[Any]
        valid: Any
        kind = draw(st.integers(0, 3))
        if kind == 0:  # array
            item = draw(children)
            lo = draw(st.integers(0, 2))
            hi = lo + draw(st.integers(0, 2))
            count = draw(st.integers(lo, hi))
            valid = [draw(st.sampled_from(item.valid)) for _ in range(count)]
            schema = {"type": "array", "items": item.schema, "minItems": lo, "maxItems": hi}
            invalid = [[item.valid[0]] * (hi + 1), {"not": "an array"}]
            if lo > 0:
                invalid.append([item.valid[0]] * (lo - 1))
            if item.invalid and count > 0:
                invalid.append([*valid[:-1], item.invalid[0]])
            return Case(schema, [valid], invalid)
        if kind == 1:  # object
            names = draw(
                st.lists(st.sampled_from(["a", "b", "c", "long name", "é"]), min_size=1, max_size=3, unique=True)
            )
            props = {n: draw(children) for n in names}
            required = [n for n in names if draw(st.booleans())]
            additional = draw(st.sampled_from([False, None]))
            schema = {
                "type": "object",
                "properties": {n: c.schema for n, c in props.items()},
                "required": required,
            }
            if additional is False:
                schema["additionalProperties"] = False
            # the grammar's order: the required properties, then the optional ones
            chosen = [n for n in names if n in required] + [
                n for n in names if n not in required and draw(st.booleans())
            ]
            valid = {n: draw(st.sampled_from(props[n].valid)) for n in chosen}
            invalid = [["not", "an object"]]
            if required:
                invalid.append({k: v for k, v in valid.items() if k != required[0]})
            if additional is False:
                invalid.append({**valid, "zz": 1})
            for n, c in props.items():
                if c.invalid:
                    bad = {**valid, n: c.invalid[0]}
                    invalid.append(bad)
                    break
            return Case(schema, [valid], invalid)
        if kind == 2:  # tuple
            items = draw(st.lists(children, min_size=1, max_size=3))
            valid = [draw(st.sampled_from(c.valid)) for c in items]
            invalid = [valid[:-1], [*valid, valid[0]]]
            size = len(items)  # minItems / maxItems: closed, as the grammar (which ignores them) is
            schema = {"type": "array", "prefixItems": [c.schema for c in items], "minItems": size, "maxItems": size}
            return Case(schema, [valid], invalid)
        # anyOf: valid instances of either branch
        a, b = draw(children), draw(children)
        return Case(
            {"anyOf": [a.schema, b.schema]}, [draw(st.sampled_from(a.valid)), draw(st.sampled_from(b.valid))], []
        )

    return build()


cases = st.recursive(leaf_cases(), _case_compound, max_leaves=5)


def conforms(value: Any, schema: dict[str, Any]) -> bool:
    """Minimal JSON-schema validation of the constructs `cases` generates (the test's own
    check that its valid / invalid instances are what they claim)."""
    if "anyOf" in schema:
        return any(conforms(value, s) for s in schema["anyOf"])
    if "const" in schema:
        return json.dumps(value) == json.dumps(schema["const"])
    if "enum" in schema:
        return any(json.dumps(value) == json.dumps(v) for v in schema["enum"])
    t = schema.get("type")
    if t is None:
        return True
    if t == "null":
        return value is None
    if t == "boolean":
        return isinstance(value, bool)
    if t == "integer":
        return type(value) is int and value >= schema.get("minimum", value) and value <= schema.get("maximum", value)
    if t == "number":
        return type(value) in (int, float)
    if t == "string":
        if not isinstance(value, str):
            return False
        fmt = schema.get("format")
        if fmt == "date":
            return re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])", value) is not None
        if fmt == "time":
            return (
                re.fullmatch(r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{3})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)", value)
                is not None
            )
        if fmt == "date-time":
            d, sep, t_ = value.partition("T")
            return (
                bool(sep)
                and conforms(d, {"type": "string", "format": "date"})
                and conforms(t_, {"type": "string", "format": "time"})
            )
        if fmt == "uuid":
            return re.fullmatch(r"[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}", value) is not None
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            return False
        return bool(schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value)))
    if t == "array":
        if not isinstance(value, list):
            return False
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)):
            return False
        if "prefixItems" in schema:
            return all(conforms(v, s) for v, s in zip(value, schema["prefixItems"], strict=False))
        return all(conforms(v, schema["items"]) for v in value)
    if t == "object":
        if not isinstance(value, dict) or not all(k in value for k in schema["required"]):
            return False
        if schema.get("additionalProperties") is False and any(k not in schema["properties"] for k in value):
            return False
        return all(conforms(v, schema["properties"][k]) for k, v in value.items() if k in schema["properties"])
    raise AssertionError(schema)


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases, style=st.integers(0, 2))
def test_grammar_accepts_valid_and_rejects_invalid_instances(acceptor: Acceptor, case: Case, style: int) -> None:
    gbnf = json_schema_to_gbnf(case.schema)
    for value in case.valid:
        assert conforms(value, case.schema), value
        assert acceptor.accepts(gbnf, _dumps(value, style)), (value, gbnf)
    for value in case.invalid:
        assert not conforms(value, case.schema), value
        assert not acceptor.accepts(gbnf, _dumps(value, style)), (value, gbnf)


def test_property_order_and_whitespace(acceptor: Acceptor) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"]}
    g = json_schema_to_gbnf(schema)
    assert acceptor.accepts(g, '{"a": 1, "b": "x"}')
    assert acceptor.accepts(g, '{\n  "a":1\n}')
    assert acceptor.accepts(g, '{"a":1}')
    assert not acceptor.accepts(g, '{"b": "x", "a": 1}')  # llama.cpp's grammar fixes the order
    assert not acceptor.accepts(g, ' {"a": 1}')  # no leading space
    assert not acceptor.accepts(g, '{"a": 1}\n\n\n')


def test_additional_properties_language(acceptor: Acceptor) -> None:
    g = json_schema_to_gbnf({"properties": {"a": {"type": "null"}}, "additionalProperties": {"type": "integer"}})
    assert acceptor.accepts(g, '{"a": null, "x": 1, "ab": 2}')
    assert acceptor.accepts(g, '{"b": 3}')
    assert acceptor.accepts(g, "{}")
    assert not acceptor.accepts(g, '{"a": 1}')  # "a" is not an additional property
    assert not acceptor.accepts(g, '{"x": null}')


def test_ref_recursion_language(acceptor: Acceptor) -> None:
    g = json_schema_to_gbnf(TABLE["ref recursive"])
    assert acceptor.accepts(g, '{"value": 1, "next": {"value": 2, "next": null}}')
    assert acceptor.accepts(g, '{"value": 1}')
    assert not acceptor.accepts(g, '{"value": 1, "next": {"next": null}}')


def test_unsupported_pattern_accepts_any_string(acceptor: Acceptor) -> None:
    with pytest.warns(SchemaWarning):
        g = json_schema_to_gbnf({"type": "string", "pattern": "^\\d+$"})
    assert acceptor.accepts(g, '"12"')
    assert acceptor.accepts(g, '"ab"')
    assert not acceptor.accepts(g, "12")


def test_dotall_language(acceptor: Acceptor) -> None:
    plain = json_schema_to_gbnf({"pattern": "^a.b$"})
    dotall = json_schema_to_gbnf({"pattern": "^a.b$"}, dotall=True)
    assert acceptor.accepts(plain, '"axb"')
    assert not acceptor.accepts(plain, '"a\nb"')
    assert acceptor.accepts(dotall, '"a\nb"')


# --------------------------------------------------------------------------- builtins
@pytest.fixture(scope="session")
def json_gbnf_file() -> str:
    return (llama_cpp_source_dir() / "grammars" / "json.gbnf").read_text()


JSON_PROBES = [
    "{}",
    '{"a": 1}',
    '{"a":[1,2.5,-3e5,true,false,null,"x\\n\\u00e9"],"b":{"c":{}}}',
    '{\n  "a": "b"\n}\n',
    '{"a": 1} ',
    "[]",
    "[1, 2]",
    '"s"',
    "1",
    "null",
    " {}",
    "{,}",
    '{"a" 1}',
    '{"a": 01}',
    '{"a": 1e10}',
    '{"a": 1e25}',
    '{"a": 1E+5}',
    '{"a": .5}',
    '{"a": "\x01"}',
    '{"a": "\\x"}',
    '{"a": 1}}',
    '{"a": [1,]}',
    '{"a": tru}',
    '{"a": 12345678901234567}',
    '{"a": 1234567890123456}',
]


@pytest.mark.parametrize("text", JSON_PROBES)
def test_json_builtin_matches_json_gbnf(acceptor: Acceptor, json_gbnf_file: str, text: str) -> None:
    """``JSON`` accepts exactly what llama.cpp's grammars/json.gbnf accepts."""
    assert acceptor.accepts(JSON, text) == acceptor.accepts(json_gbnf_file, text)


@given(text=st.text(alphabet='{}[]":,0123456789.eE+-truefalsn \\u\n\tab', max_size=16), root=st.integers(0, 2))
def test_json_builtins_match_json_gbnf_on_random_text(
    acceptor: Acceptor, json_gbnf_file: str, text: str, root: int
) -> None:
    """Differential: JSON / JSON_ARRAY / JSON_VALUE accept what json.gbnf accepts with its
    root rule pointed at object / array / value."""
    ours = (JSON, JSON_ARRAY, JSON_VALUE)[root]
    theirs = re.sub(r"^root\s*::= object", "root ::= " + ("object", "array", "value")[root], json_gbnf_file, flags=re.M)
    assert theirs != json_gbnf_file or root == 0
    assert acceptor.accepts(ours, text) == acceptor.accepts(theirs, text)


def test_json_builtins_languages(acceptor: Acceptor) -> None:
    assert acceptor.accepts(JSON, '{"a": [1, {"b": null}]}')
    assert not acceptor.accepts(JSON, "[1]")
    assert not acceptor.accepts(JSON, '"x"')
    assert acceptor.accepts(JSON_ARRAY, '[1, {"b": null}, "x"]')
    assert not acceptor.accepts(JSON_ARRAY, "{}")
    for text in ['{"a": 1}', "[]", '"x"', "-1.5", "true", "null"]:
        assert acceptor.accepts(JSON_VALUE, text), text
    for text in ["", "nul", "[", "'x'"]:
        assert not acceptor.accepts(JSON_VALUE, text), text


@given(value=json_values.filter(lambda v: not _has_float(v)), style=st.integers(0, 1))
def test_json_value_accepts_json(acceptor: Acceptor, value: Any, style: int) -> None:
    text = json.dumps(value, separators=(",", ":") if style == 0 else None)  # ASCII, \u escapes
    assume(not re.search(r"\d{17}", text))  # json.gbnf numbers have at most 16 digits
    assert acceptor.accepts(JSON_VALUE, text)
    assert acceptor.accepts(JSON, text) == isinstance(value, dict)
    assert acceptor.accepts(JSON_ARRAY, text) == isinstance(value, list)


def test_choice(acceptor: Acceptor) -> None:
    g = choice("yes", "no", 'a "quoted"\nline', "no")
    assert g == 'root ::= "yes" | "no" | "a \\"quoted\\"\\nline"\n'
    for text in ["yes", "no", 'a "quoted"\nline']:
        assert acceptor.accepts(g, text)
    for text in ["ye", "yesno", "", "No"]:
        assert not acceptor.accepts(g, text)
    assert acceptor.accepts(choice("", "x"), "")
    assert acceptor.accepts(choice("\x01\t"), "\x01\t")
    with pytest.raises(ValueError):
        choice()
    with pytest.raises(ValueError):
        choice("a\0")


def test_regex(acceptor: Acceptor) -> None:
    g = regex("^[a-c]{2}(-[0-9]+)?$")
    assert g == 'root ::= (root-1{2,2} ("-" [0-9]+)?)\nroot-1 ::= [a-c]\n'  # {m} is written {m,m}
    for text in ["ab", "cc-12"]:
        assert acceptor.accepts(g, text)
    for text in ["a", "abc", "ab-", '"ab"']:
        assert not acceptor.accepts(g, text)
    assert regex("x|y") == regex("^x|y$") == 'root ::= ("x" | "y")\n'
    assert regex("a\\$") == 'root ::= ("a$")\n'
    assert acceptor.accepts(regex("a.b", dotall=True), "a\nb")
    assert not acceptor.accepts(regex("a.b"), "a\nb")
    with pytest.raises(SchemaError, match="unsupported escape: \\\\d"):
        regex("\\d+")
    with pytest.raises(SchemaError, match="unbalanced parentheses"):
        regex("(a")


def test_json_schema_alias() -> None:
    assert json_schema({"type": "integer"}) == json_schema_to_gbnf({"type": "integer"})
