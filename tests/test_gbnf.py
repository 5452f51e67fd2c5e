"""The GBNF front end (llama_cffi.gbnf: parser, checks, crash hazards), the printer
(samplers.grammar.gbnf) and the reference recognizer.

* Tables written from llama.cpp's parsing rules (``src/llama-grammar.cpp``), worked out
  by hand: the rules, ids and generated names of small grammars, and where and why bad
  text is refused (line, column, what was expected).
* llama.cpp's own ``grammars/*.gbnf``: parsed, printed and parsed back, accepted by
  llama.cpp in both forms, and matched against hand-written samples.
* llama.cpp as the oracle for what parses: mutated random grammar texts must be
  accepted by ``parse_gbnf`` + ``check_grammar`` exactly when ``llama_sampler_init_grammar``
  accepts them.
* Random grammars built from a small AST without recursion have a regular language, so
  Python's ``re`` is an independent oracle for the parser's repetition rewriting and for
  the reference recognizer; generated strings are accepted; printing round-trips.

Round-trip criterion: ``rule_renumbering(g, parse_gbnf(format_gbnf(g)))`` is not None,
i.e. the re-parsed grammar has the same rules element for element, up to a bijective
renumbering of rule ids that is computed from the printed rule names (and named tokens
compared by name).
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import llama_cffi
from llama_cffi import gbnf
from llama_cffi.errors import ParamError
from llama_cffi.gbnf import (
    MAX_DEPTH,
    Element,
    GrammarError,
    GrammarSyntaxError,
    GreType,
    LeftRecursionError,
    ParsedGrammar,
    Rule,
    _hidden_left_recursion,
    _llama_left_recursion,
    check_grammar,
    native_grammar_hazard,
    parse_gbnf,
    resolve_tokens,
)
from llama_cffi.sampling import LlamaSampler
from samplers.grammar.gbnf import format_gbnf, printed_names, rule_renumbering

from .grammar_reference import GenerationError, generate, reference_accepts


def budget(n: int) -> int:
    """Examples for a hypothesis test: ``n``, or more under a bigger profile (conftest)."""
    return max(n, settings().max_examples)


END: Element = (GreType.END, 0)
ALT: Element = (GreType.ALT, 0)


def C(s: str) -> list[Element]:
    """Plain characters (a literal, or single-character classes)."""
    return [(GreType.CHAR, ord(c)) for c in s]


def R(i: int) -> Element:
    return (GreType.RULE_REF, i)


def NOT(c: str) -> Element:
    return (GreType.CHAR_NOT, ord(c))


def OR(c: str) -> Element:
    return (GreType.CHAR_ALT, ord(c))


def UP(c: str) -> Element:
    return (GreType.CHAR_RNG_UPPER, ord(c))


ANY: Element = (GreType.CHAR_ANY, 0)


def rules_of(g: ParsedGrammar) -> list[list[Element]]:
    return [list(r) for r in g.rules]


def assert_round_trip(g: ParsedGrammar) -> None:
    text = format_gbnf(g)
    again = parse_gbnf(text)
    assert rule_renumbering(g, again) is not None, text


# ----------------------------------------------------------------------------- tables

# (grammar text, expected rules by id, expected symbol ids)
PARSE_CASES: list[tuple[str, list[list[Element]], dict[str, int]]] = [
    ('root ::= "ab"', [[*C("ab"), END]], {"root": 0}),
    (
        "root ::= [a-z0-9_]",
        [[(GreType.CHAR, ord("a")), UP("z"), OR("0"), UP("9"), OR("_"), END]],
        {"root": 0},
    ),
    ('root ::= [^"\\\\]', [[NOT('"'), OR("\\"), END]], {"root": 0}),
    ("root ::= .", [[ANY, END]], {"root": 0}),
    ('root ::= "a" | "b" |', [[*C("a"), ALT, *C("b"), ALT, END]], {"root": 0}),
    ('root ::= | "a"', [[ALT, *C("a"), END]], {"root": 0}),
    ('root ::= "a" |  | "b"', [[*C("a"), ALT, ALT, *C("b"), END]], {"root": 0}),
    ("root ::=", [[END]], {"root": 0}),
    ('root ::= ""', [[END]], {"root": 0}),
    # a group is a new rule named after the rule it is in, numbered by the symbol count
    ('root ::= ("a" | "b") "c"', [[R(1), *C("c"), END], [*C("a"), ALT, *C("b"), END]], {"root": 0, "root_1": 1}),
    # S* -> S' with S' ::= S S' |
    ('root ::= "a"*', [[R(1), END], [*C("a"), R(1), ALT, END]], {"root": 0, "root_1": 1}),
    # S+ -> S S'
    ('root ::= "a"+', [[*C("a"), R(1), END], [*C("a"), R(1), ALT, END]], {"root": 0, "root_1": 1}),
    # S? -> S' with S' ::= S |
    ('root ::= "a"?', [[R(1), END], [*C("a"), ALT, END]], {"root": 0, "root_1": 1}),
    ('root ::= "a"{3}', [[*C("aaa"), END]], {"root": 0}),
    ('root ::= "a"{2,}', [[*C("aa"), R(1), END], [*C("a"), R(1), ALT, END]], {"root": 0, "root_1": 1}),
    # S{0,3} -> S'(3); S'(1) ::= S | ; S'(x) ::= S S'(x-1) | ; generated in the order 1, 2, 3
    (
        'root ::= "a"{0,3}',
        [[R(3), END], [*C("a"), ALT, END], [*C("a"), R(1), ALT, END], [*C("a"), R(2), ALT, END]],
        {"root": 0, "root_1": 1, "root_2": 2, "root_3": 3},
    ),
    (
        'root ::= "a"{1,3}',
        [[*C("a"), R(2), END], [*C("a"), ALT, END], [*C("a"), R(1), ALT, END]],
        {"root": 0, "root_1": 1, "root_2": 2},
    ),
    ('root ::= "a"{0,0}', [[END]], {"root": 0}),
    ('root ::= "a"{ 1 , 2 }', [[*C("a"), R(1), END], [*C("a"), ALT, END]], {"root": 0, "root_1": 1}),
    ("root ::= .{2,3}", [[ANY, ANY, R(1), END], [ANY, ALT, END]], {"root": 0, "root_1": 1}),
    # a repetition applies to the whole literal string
    ('root ::= "ab"?', [[R(1), END], [*C("ab"), ALT, END]], {"root": 0, "root_1": 1}),
    # a second operator applies to what the first left (the symbol start does not move)
    (
        'root ::= "a"*?',
        [[R(2), END], [*C("a"), R(1), ALT, END], [R(1), ALT, END]],
        {"root": 0, "root_1": 1, "root_2": 2},
    ),
    ('root ::= "a"{2}?', [[R(1), END], [*C("aa"), ALT, END]], {"root": 0, "root_1": 1}),
    # nested groups: the outer group's id comes first, the inner group and its repetition
    # rule are generated while it is parsed, the outer "?" last
    (
        'root ::= (("a")+ "b")?',
        [
            [R(4), END],
            [R(2), R(3), *C("b"), END],
            [*C("a"), END],
            [R(2), R(3), ALT, END],
            [R(1), ALT, END],
        ],
        {"root": 0, "root_1": 1, "root_2": 2, "root_3": 3, "root_4": 4},
    ),
    # generated names take the name of the top-level rule being parsed
    (
        'x ::= "a"*\nroot ::= x ("b")',
        [[R(1), END], [*C("a"), R(1), ALT, END], [R(0), R(3), END], [*C("b"), END]],
        {"x": 0, "x_1": 1, "root": 2, "root_3": 3},
    ),
    # ids in order of first mention, references before definitions included
    (
        'root ::= a b\na ::= "x"\nb ::= "y"',
        [[R(1), R(2), END], [*C("x"), END], [*C("y"), END]],
        {"root": 0, "a": 1, "b": 2},
    ),
    ('my-rule2 ::= "x"\nroot ::= my-rule2', [[*C("x"), END], [R(0), END]], {"my-rule2": 0, "root": 1}),
    ('root ::= "a"\nroot ::= "b"', [[*C("b"), END]], {"root": 0}),
    # comments and newlines
    ('# top\nroot ::= "a" # trailing\n# more\n', [[*C("a"), END]], {"root": 0}),
    ('root ::= (\n  "a" # one\n  "b"\n)', [[R(1), END], [*C("ab"), END]], {"root": 0, "root_1": 1}),
    ('root ::= "a" |\n  "b"', [[*C("a"), ALT, *C("b"), END]], {"root": 0}),
    ('root ::=\n  "a"', [[*C("a"), END]], {"root": 0}),
    ("root ::= (\n)", [[R(1), END], [END]], {"root": 0, "root_1": 1}),
    ('root ::= "a" b\r\nb ::= "c"\r\n', [[*C("a"), R(1), END], [*C("c"), END]], {"root": 0, "b": 1}),
    ('root ::= "a"\rb ::= "c"', [[*C("a"), END], [*C("c"), END]], {"root": 0, "b": 1}),
    ('\n\n  root ::= "a"  \n\n', [[*C("a"), END]], {"root": 0}),
    # escapes
    (
        'root ::= "\\x41\\u00e9\\U0001F600\\t\\r\\n\\\\\\"\\[\\]\\-"',
        [[*C('A\u00e9\U0001f600\t\r\n\\"[]-'), END]],
        {"root": 0},
    ),
    ('root ::= "\\xfF\\U12345678"', [[(GreType.CHAR, 0xFF), (GreType.CHAR, 0x12345678), END]], {"root": 0}),
    ('root ::= "日本\n"', [[*C("日本\n"), END]], {"root": 0}),  # a raw newline inside quotes is a character
    # character class corner cases
    ("root ::= [a-]", [[(GreType.CHAR, ord("a")), OR("-"), END]], {"root": 0}),
    ("root ::= [-a]", [[(GreType.CHAR, ord("-")), OR("a"), END]], {"root": 0}),
    ("root ::= [a--]", [[(GreType.CHAR, ord("a")), UP("-"), END]], {"root": 0}),
    ("root ::= [z-a]", [[(GreType.CHAR, ord("z")), UP("a"), END]], {"root": 0}),
    ("root ::= [a-\\]]", [[(GreType.CHAR, ord("a")), UP("]"), END]], {"root": 0}),
    ("root ::= [\\]\\-\\\\]", [[(GreType.CHAR, ord("]")), OR("-"), OR("\\"), END]], {"root": 0}),
    ("root ::= [^^]", [[NOT("^"), END]], {"root": 0}),
    ('root ::= [] "a"', [[*C("a"), END]], {"root": 0}),  # an empty class adds nothing
    ("root ::= [^]", [[END]], {"root": 0}),
    # tokens
    (
        "root ::= <[5]> !<[7]> <[4294967295]>",
        [[(GreType.TOKEN, 5), (GreType.TOKEN_NOT, 7), (GreType.TOKEN, 4294967295), END]],
        {"root": 0},
    ),
    ("root ::= <[5]>*", [[R(1), END], [(GreType.TOKEN, 5), R(1), ALT, END]], {"root": 0, "root_1": 1}),
    # repetition limits: 2000 copies are allowed, a maximum above 2000 means no maximum
    ('root ::= "a"{2000}', [[*C("a" * 2000), END]], {"root": 0}),
    ('root ::= "a"{0,2001}', [[R(1), END], [*C("a"), R(1), ALT, END]], {"root": 0, "root_1": 1}),
    ('root ::= "a"{1,2500}', [[*C("a"), R(1), END], [*C("a"), R(1), ALT, END]], {"root": 0, "root_1": 1}),
    ('root ::= "a"{3}{600}', [[*C("a" * 1800), END]], {"root": 0}),  # 3 * 600 <= 2000
    # a group counts the symbols created while it is parsed: one here (b is known) ...
    (
        'b ::= "x"\nroot ::= ("a" b){1001}',
        [[*C("x"), END], [*[R(2)] * 1001, END], [*C("a"), R(0), END]],
        {
            "b": 0,
            "root": 1,
            "root_2": 2,
        },
    ),
]


@pytest.mark.parametrize(("text", "rules", "ids"), PARSE_CASES)
def test_parse_table(text: str, rules: list[list[Element]], ids: dict[str, int]) -> None:
    g = parse_gbnf(text)
    assert rules_of(g) == rules
    assert dict(g.symbol_ids) == ids
    assert g.token_names == ()
    assert_round_trip(g)


def test_named_tokens_are_kept_by_name() -> None:
    g = parse_gbnf("root ::= <|im_end|> !<think> <|im_end|> <[3]>")
    assert g.token_names == ("<|im_end|>", "<think>")
    assert rules_of(g) == [[(GreType.TOKEN, -1), (GreType.TOKEN_NOT, -2), (GreType.TOKEN, -1), (GreType.TOKEN, 3), END]]
    resolved = resolve_tokens(g, {"<|im_end|>": 100, "<think>": 101}.__getitem__)
    assert rules_of(resolved) == [
        [(GreType.TOKEN, 100), (GreType.TOKEN_NOT, 101), (GreType.TOKEN, 100), (GreType.TOKEN, 3), END]
    ]
    # the name runs to the first '>', whatever is inside
    assert parse_gbnf("root ::= <a b\nc>").token_names == ("<a b\nc>",)
    assert format_gbnf(g) == "root ::= <|im_end|> !<think> <|im_end|> <[3]>\n"
    assert_round_trip(g)


# (grammar text, line, column, a substring of `expected`)
ERROR_CASES: list[tuple[str, int, int, str]] = [
    ('root ::= "a', 1, 12, "'\"'"),
    ('root = "a"', 1, 6, "'::='"),
    ('root\n::= "a"', 1, 5, "'::='"),  # the newline itself is where "::=" was wanted
    ('::= "a"', 1, 1, "a name"),
    ('root ::= "\\q"', 1, 11, "escape"),
    ('root ::= "\\', 1, 12, "escape"),
    ('root ::= "\\x4"', 1, 14, "2 hex digits"),
    ('root ::= "\\u12G4"', 1, 15, "4 hex digits"),
    ('root ::= "\\U0001F60"', 1, 20, "8 hex digits"),
    ("root ::= [a", 1, 12, "']'"),
    ("root ::= [a-", 1, 13, "']'"),
    ("root ::= [a]]", 1, 13, "newline"),
    ('root ::= ("a"', 1, 14, "')'"),
    ('root ::= "a")', 1, 13, "newline"),
    ("root ::= *", 1, 10, "item"),
    ('root ::= "a" | *', 1, 16, "item"),
    ('root ::= "a"{0,0}*', 1, 18, "item"),  # {0,0} removed the item
    ("root ::= []*", 1, 12, "item"),  # so does an empty class
    ('root ::= "a"{', 1, 14, "integer"),
    ('root ::= "a"{x}', 1, 14, "integer"),
    ('root ::= "a"{1', 1, 15, "',' or '}'"),
    ('root ::= "a"{1,', 1, 16, "'}'"),
    ('root ::= "a"{1,2', 1, 17, "'}'"),
    ('root ::= "a"{99999999999999999999999}', 1, 14, "2**64"),
    ('root ::= "a"{2001}', 1, 13, "2000"),
    ('root ::= "a"{3}{700}', 1, 16, "2000"),  # 3 * 700 > 2000
    ('root ::= ("a" b){1001}\nb ::= "x"', 1, 17, "2000"),  # the group created 2 symbols (b is new)
    ('root ::= ("a"{0,3}){600}', 1, 20, "2000"),  # 4 symbols * 600
    ('root ::= "a"{3,2}', 1, 13, "maximum"),
    ("root ::= <[x]>", 1, 12, "token id"),
    ("root ::= <[5>", 1, 13, "']'"),
    ("root ::= <[5]", 1, 14, "'>'"),
    ("root ::= <[4294967296]>", 1, 12, "2**32"),
    ("root ::= !x", 1, 11, "'<'"),
    ("root ::= <abc", 1, 14, "'>'"),
    ('root ::= "a"\n"b"', 2, 1, "a name"),
    ('root ::= "a"\n  | "b"', 2, 3, "a name"),  # a newline ends the rule ("|" must come before it)
    ('root ::= "a" # c\n  | "b"', 2, 3, "a name"),
    ('root ::= "a"{\n1}', 1, 14, "integer"),  # no newline inside {} outside parentheses
    ('root ::= (\n  "a"\n  "b\\q"\n)', 3, 5, "escape"),
    ('a ::= "x"\r\nroot ::= "y" )\r\n', 2, 14, "newline"),
    ('a ::= "x"\rroot ::= ?', 2, 10, "item"),
    ('root ::= "a"\r\n\r\n  bad', 3, 6, "'::='"),
    ("root ::= é", 1, 10, "newline"),
    ('root ::= "a\0"', 1, 12, "NUL"),
    ("root ::= a_b", 1, 11, "newline"),  # "_" is not a name character
]


@pytest.mark.parametrize(("text", "line", "column", "expected"), ERROR_CASES)
def test_parse_errors(text: str, line: int, column: int, expected: str) -> None:
    with pytest.raises(GrammarSyntaxError) as info:
        parse_gbnf(text)
    err = info.value
    assert (err.line, err.column) == (line, column), str(err)
    assert expected in err.expected, err.expected
    assert f"line {line}, column {column}" in str(err)


@pytest.mark.parametrize(("text", "name"), [("root ::= foo", "foo"), ("root ::= a\na ::= (b)", "b")])
def test_undefined_rule(text: str, name: str) -> None:
    with pytest.raises(GrammarError) as info:
        parse_gbnf(text)
    assert not isinstance(info.value, GrammarSyntaxError)
    assert f"Undefined rule identifier '{name}'" in str(info.value)


def test_deep_nesting_parses() -> None:
    depth = 3000
    g = parse_gbnf("root ::= " + "(" * depth + '"a"' + ")" * depth)
    assert rules_of(g) == [[R(i + 1), END] for i in range(depth)] + [[*C("a"), END]]
    check_grammar(g)
    assert_round_trip(g)


# ----------------------------------------------------------------------------- checks


def test_check_grammar_root() -> None:
    g = parse_gbnf('a ::= "x"')
    with pytest.raises(GrammarError, match="does not contain a 'root' symbol"):
        check_grammar(g)
    check_grammar(g, "a")
    with pytest.raises(GrammarError):
        check_grammar(parse_gbnf("# only a comment\n"))
    assert parse_gbnf("  # only a comment\n").rules == ()


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ('root ::= root "a" |', "root"),
        ('root ::= a\na ::= b "x"\nb ::= root | "y"', "root"),
        ('root ::= e root "x" | "y"\ne ::= "z" |', "root"),  # e has an empty alternative
        ('root ::= "a"\nx ::= x "b"', "x"),  # also where root cannot reach it
        ('root ::= ("a" | root)', "root"),
    ],
)
def test_left_recursion(text: str, rule: str) -> None:
    g = parse_gbnf(text)
    with pytest.raises(LeftRecursionError) as info:
        check_grammar(g)
    assert info.value.rule == rule
    assert not info.value.hidden
    assert f"'{rule}'" in str(info.value)


def test_hidden_left_recursion() -> None:
    # e only derives "" through f: llama.cpp's check misses the cycle root -> e root "x",
    # then its stacks grow without bound (we refuse it)
    hidden = parse_gbnf('root ::= e root "x" | "y"\ne ::= f\nf ::= "" | "z"')
    assert _llama_left_recursion(hidden.rules) is None
    with pytest.raises(LeftRecursionError) as info:
        check_grammar(hidden)
    assert info.value.hidden and info.value.rule == "root"
    # the same cycle with nothing after the recursive reference is harmless and allowed,
    # as is the common ("a"?)* (its repetition rule refers to itself after a maybe-empty
    # group, in last position)
    check_grammar(parse_gbnf('root ::= e root | "y"\ne ::= f\nf ::= "" | "z"'))
    check_grammar(parse_gbnf('root ::= ("a"?)* "b"'))
    # the same through a long chain of rules (3000 nested groups around ""), found fast
    deep = "(" * 3000 + '""' + ")" * 3000
    with pytest.raises(LeftRecursionError) as info:
        check_grammar(parse_gbnf(f'root ::= {deep} root "x" | "y"'))
    assert info.value.hidden and info.value.rule == "root"
    check_grammar(parse_gbnf(f'root ::= {deep} root | "y"'))


def test_check_grammar_refuses_malformed_rules() -> None:
    bad = [
        ParsedGrammar(((R(1), END),), {"root": 0}),
        ParsedGrammar((((GreType.CHAR, 97),),), {"root": 0}),
        ParsedGrammar(((OR("a"), END),), {"root": 0}),
        ParsedGrammar((((GreType.TOKEN, -1), END),), {"root": 0}),
    ]
    for g in bad:
        with pytest.raises(GrammarError):
            check_grammar(g)
        with pytest.raises(GrammarError):
            format_gbnf(g)


# ----------------------------------------------------------------------------- printer


@pytest.mark.parametrize(
    ("text", "printed"),
    [
        ('root ::= [a-z] "bc" | [^x] .', 'root ::= [a-z] "bc" | [^x] .\n'),
        ('root ::= "" | "a"', 'root ::= "" | "a"\n'),
        ("root ::= [a] [b-c]", 'root ::= "a" [b-c]\n'),  # one-character classes are literals
        (
            'root ::= "q\\"\\\\\\t\\x01é😀\\u2028\\x7F\\xA0"',
            'root ::= "q\\"\\\\\\t\\x01é😀\\u2028\\x7F\\xA0"\n',
        ),
        ("root ::= [\\]\\-\\\\^]", "root ::= [\\]\\-\\\\^]\n"),
        ("root ::= [\\x5Ea] [^^]", "root ::= [\\x5Ea] [^^]\n"),  # '^' first would negate
        (
            "root ::= [\\U00110000-\\UFFFFFFFF\\uD800\\uFFFF]",
            "root ::= [\\U00110000-\\UFFFFFFFF\\uD800\\uFFFF]\n",
        ),
        ('root ::= ("a")+', 'root ::= root-1 root-2\nroot-1 ::= "a"\nroot-2 ::= root-1 root-2 | ""\n'),
        # a generated name's obvious spelling is taken: the printer finds another
        (
            'root ::= ("a") root-1\nroot-1 ::= "b"',
            'root ::= root-1-1 root-1\nroot-1-1 ::= "a"\nroot-1 ::= "b"\n',
        ),
    ],
)
def test_format_gbnf(text: str, printed: str) -> None:
    g = parse_gbnf(text)
    assert format_gbnf(g) == printed
    assert_round_trip(g)


def test_round_trip_renumbers() -> None:
    # root (0) refers to the group (1) and to "c"* (3); the group refers to "a"* (2).
    # Printed in id order, root's line mentions root-3 before root-2 is ever mentioned,
    # so the re-parse numbers them the other way round
    g = parse_gbnf('root ::= ("a"* "b") "c"*')
    assert rules_of(g) == [
        [R(1), R(3), END],
        [R(2), *C("b"), END],
        [*C("a"), R(2), ALT, END],
        [*C("c"), R(3), ALT, END],
    ]
    assert printed_names(g) == ("root", "root-1", "root-2", "root-3")
    again = parse_gbnf(format_gbnf(g))
    assert rule_renumbering(g, again) == (0, 1, 3, 2)
    g2 = parse_gbnf('root ::= a\nb ::= "1"\na ::= b')  # root 0, a 1, b 2
    again2 = parse_gbnf('b ::= "1"\nroot ::= a\na ::= b')  # b 0, root 1, a 2
    assert rule_renumbering(g2, again2) == (1, 2, 0)
    # and it notices a difference
    assert rule_renumbering(g2, parse_gbnf('root ::= a\na ::= b\nb ::= "2"')) is None
    assert rule_renumbering(g2, parse_gbnf('root ::= a\na ::= b b\nb ::= "1"')) is None
    assert rule_renumbering(g2, parse_gbnf('root ::= a\na ::= b\nb ::= "1"\nc ::= "1"')) is None


# ----------------------------------------------------------------------------- reference helpers


@pytest.mark.parametrize(
    ("text", "good", "bad"),
    [
        # nested optionals and empty alternatives
        ('root ::= (("a")?)? "b" |', ["", "b", "ab"], ["a", "aab", "ba"]),
        ('root ::= x x "c"\nx ::= | "a" | "b"', ["c", "ac", "bac", "aac"], ["abbc", "ca"]),
        # repetition forms
        ('root ::= "ab"{2,3}', ["abab", "ababab"], ["ab", "abababab", "aabb"]),
        ("root ::= [a-c]+ [^a-c]?", ["a", "cba", "cbax", "b\n"], ["", "x", "axx"]),
        ("root ::= .{2}", ["xy", "\n\U0010ffff"], ["x", "xyz"]),
        # classes with ranges, negation, empty ranges
        ('root ::= [z-a] | [^\\x00-\\U0010FFFF] | "k"', ["k"], ["a", "z", "m", ""]),
        ("root ::= [^-a\\n]", ["b", "x"], ["-", "a", "\n"]),
        # recursion (right, and even left: the recognizer is a least fixpoint)
        ('root ::= "(" root ")" | ""', ["", "()", "((()))"], ["(", "())", ")("]),
        ('root ::= root "a" | "b"', ["b", "baa"], ["", "ab", "a"]),
        # tokens match no characters
        ('root ::= <[5]> | "t"', ["t"], ["", "<[5]>"]),
    ],
)
def test_reference_accepts(text: str, good: list[str], bad: list[str]) -> None:
    g = parse_gbnf(text)
    for s in good:
        assert reference_accepts(g, s), s
    for s in bad:
        assert not reference_accepts(g, s), s


def test_reference_accepts_other_roots() -> None:
    g = parse_gbnf('root ::= a "!"\na ::= "x"+')
    assert reference_accepts(g, "xx", root="a")
    assert not reference_accepts(g, "xx")
    assert reference_accepts(g, "", root="a_2")  # "x"+ in rule a (id 1): a_2 ::= "x" a_2 |
    assert reference_accepts(g, "xxx", root="a_2")


@pytest.mark.parametrize(
    "text",
    ["root ::= <[5]>", "root ::= [^\\x00-\\U0010FFFF]", 'root ::= "x" root', 'root ::= a\na ::= "x" a | <[1]>'],
)
def test_generate_refuses_what_derives_nothing(text: str) -> None:
    with pytest.raises(GenerationError):
        generate(parse_gbnf(text), random.Random(0))


def test_generate_terminates_and_is_accepted() -> None:
    g = parse_gbnf('root ::= "(" root root ")" | "x" | [^a-y]')  # two recursive calls: bushy
    rng = random.Random(1)
    lengths = set()
    for _ in range(50):
        s = generate(g, rng, max_depth=6, max_steps=50)
        lengths.add(len(s))
        assert reference_accepts(g, s), s
    assert len(lengths) > 3


# ----------------------------------------------------------------------------- native


@pytest.fixture(scope="module")
def vocab_model(tiny_model_path: Path) -> Iterator[llama_cffi.Model]:
    with llama_cffi.Model.load(tiny_model_path, vocab_only=True) as m:
        yield m


def native_accepts(model: llama_cffi.Model, text: str, root: str = "root") -> bool:
    try:
        LlamaSampler.grammar(model, text, root)
    except ParamError:
        return False
    return True


def our_verdict(model: llama_cffi.Model, text: str, root: str = "root") -> tuple[str, str]:
    """(verdict, reason): the verdict is accept, reject, or unsafe where llama.cpp would
    not finish (it exhausts memory on {m,n} with n < m and on hidden left recursion)."""
    try:
        g = parse_gbnf(text)
        if g.token_names:
            g = resolve_tokens(g, lambda name: one_token(model, name))
        check_grammar(g, root)
    except GrammarSyntaxError as e:
        return ("unsafe" if "maximum" in e.expected else "reject"), f"syntax: expected {e.expected}"
    except LeftRecursionError as e:
        return ("unsafe" if e.hidden else "reject"), "left recursion"
    except GrammarError as e:
        return "reject", str(e).split("'")[0]
    return "accept", "ok"


def one_token(model: llama_cffi.Model, name: str) -> int:
    """llama.cpp's parse_token: the name must tokenize (special tokens parsed) to one token."""
    tokens = model.vocab.tokenize(name, add_special=False, parse_special=True)
    if len(tokens) != 1:
        raise GrammarError(f"invalid token {name!r}")
    return int(tokens[0])


def test_tables_against_native(vocab_model: llama_cffi.Model) -> None:
    for text, _rules, _ids in PARSE_CASES:
        assert native_accepts(vocab_model, text), text
    for text, *_ in ERROR_CASES:
        if "\0" in text:  # NUL cannot be passed (n < m is refused before llama.cpp sees it)
            continue
        assert not native_accepts(vocab_model, text), text
    assert not native_accepts(vocab_model, "root ::= foo")
    assert native_accepts(vocab_model, "root ::= <|im_end|> !<|im_start|> <s>")
    assert not native_accepts(vocab_model, "root ::= <nope>")
    assert not native_accepts(vocab_model, 'root ::= e root "x" | "y"\ne ::= "z" |')
    assert native_accepts(vocab_model, 'root ::= ("a"?)* "b"')
    assert native_accepts(vocab_model, 'root ::= e root | "y"\ne ::= f\nf ::= "" | "z"')
    assert native_accepts(vocab_model, "root ::= " + "(" * 2000 + '"a"' + ")" * 2000)
    assert not native_accepts(vocab_model, "root ::= " + "(" * 3000 + '"a"' + ")" * 3000)  # MAX_DEPTH


# ----------------------------------------------------------------------------- grammars/

# name -> (accepted samples, refused samples), each worked out from the grammar by hand
GRAMMAR_SAMPLES: dict[str, tuple[list[str], list[str]]] = {
    "arithmetic.gbnf": (
        ["1+2=3\n", "x *(y +2) = 10\n", "a=b\nc=d\n"],
        ["1+2=3", "=3\n", "1 + 2=3\n", "1=2=3\n"],
    ),
    "c.gbnf": (
        [
            "int main(){return 0;}",
            "int add(int a){a = a+1;return a;}float f(){}",
            "int f(){while(x<10){x = x+1;}if(x==10){return x;}else{return 0;}}",
            "int f(){// hi\n/* a*b */return 1;}",
            "",
        ],
        ["int main() {return 0;}", "main(){}", "int main(){return 0}", "int main(){return0;}"],
    ),
    "chess.gbnf": (
        [
            "1. e4 e5\n2. Nf3 Nc6\n",
            "1. d4 d5\n2. c4 dxc4\n3. O-O-O Qxd1+\n",
            "1. e4 d5\n2. exd5 e8=Q#\n",
        ],
        ["1. e4 e5\n", "1. e9 e5\n2. d4 d5\n", "1. e4 e5\n0. d4 d5\n", "1. e4  e5\n2. d4 d5\n"],
    ),
    "english.gbnf": (
        ["Hello, world!", "a-b [c] {d}\tx\ny"],
        ["Hello  world", "h\u00e9llo", "", " leading", "trailing "],
    ),
    "japanese.gbnf": (["こんにちは", "カタカナ 漢字。"], ["abc", "こんにちは!"]),
    "json.gbnf": (
        [
            "{}",
            '{"a": 1}',
            '{"key": [1, 2.5, -3e5, true, null], "s": "x\\u00e9\\n"}',
            '{\n  "a": {"b": []}\n}',
        ],
        [
            "[1, 2]",
            '{"a": 01}',
            '{"a": 1,}',
            "{'a': 1}",
            '{"a":  1}',
            '{"a": 1e10}',  # json.gbnf's exponent: one digit, then only 1-9
            '{"a": "\x01"}',
        ],
    ),
    "json_arr.gbnf": (["[\n]", '[\n{"a": 1},\n2\n]', '[\n "x"]'], ["[1]", "[\n]\n", '{"a": 1}', '[\n  "x"]']),
    "list.gbnf": (["- milk\n- eggs\n", "- a b c\n"], ["- \n", "- a\r\n", "milk\n", "", "- a\u2028b\n"]),
}


def grammar_dir() -> Path:
    from benchmarks.native_tools import llama_cpp_source_dir

    return llama_cpp_source_dir() / "grammars"


def test_every_grammar_file_has_samples() -> None:
    assert sorted(p.name for p in grammar_dir().glob("*.gbnf")) == sorted(GRAMMAR_SAMPLES)


@pytest.mark.parametrize("name", sorted(GRAMMAR_SAMPLES))
def test_grammar_file(name: str, vocab_model: llama_cffi.Model) -> None:
    text = (grammar_dir() / name).read_text(encoding="utf-8")
    g = parse_gbnf(text)
    check_grammar(g)
    printed = format_gbnf(g)
    assert rule_renumbering(g, parse_gbnf(printed)) is not None
    assert native_accepts(vocab_model, text)
    assert native_accepts(vocab_model, printed)
    good, bad = GRAMMAR_SAMPLES[name]
    for sample in good:
        assert reference_accepts(g, sample), sample
    for sample in bad:
        assert not reference_accepts(g, sample), sample
    rng = random.Random(name)
    for _ in range(5):
        s = generate(g, rng)
        assert reference_accepts(g, s), s


# ----------------------------------------------------------------------------- fuzzing

GRAMMAR_CHARS = 'ab -_:=|()[]{}<>!^"\\*+?.,#0123456789xuU\n\r\té'


@settings(max_examples=budget(300), deadline=None)
@given(st.text() | st.text(alphabet=GRAMMAR_CHARS) | st.text(alphabet=GRAMMAR_CHARS).map(lambda s: "root ::= " + s))
def test_only_grammar_errors(text: str) -> None:
    try:
        g = parse_gbnf(text)
    except GrammarSyntaxError as e:
        assert e.line >= 1 and e.column >= 1
        assert e.line <= text.count("\n") + text.count("\r") + 1
        return
    except GrammarError:
        return
    assert_round_trip(g)
    try:
        check_grammar(g)
    except GrammarError:
        pass


# ----------------------------------------------------------------------------- random grammars


@dataclass(frozen=True)
class Lit:
    text: str
    hexy: bool  # write characters as \x/\u/\U escapes


@dataclass(frozen=True)
class Cls:
    negated: bool
    ranges: tuple[tuple[int, int], ...]  # lo <= hi


@dataclass(frozen=True)
class AnyChar:
    pass


@dataclass(frozen=True)
class Ref:
    name: str


@dataclass(frozen=True)
class Tok:
    text: str  # "<[5]>", "!<|im_end|>", ...


@dataclass(frozen=True)
class Group:
    alts: tuple[tuple[Node, ...], ...]


@dataclass(frozen=True)
class Rep:
    node: Node
    lo: int
    hi: int | None
    spelling: str


Node = Lit | Cls | AnyChar | Ref | Tok | Group | Rep

CHARS = 'ab0 "\\[]-^#|()\n\t\r\x01\x7f\u00e9\u65e5\U0001f600\u2028'


def esc(c: str, in_class: bool, first: bool, hexy: bool) -> str:
    """Our own spelling of one character in GBNF (independent of format_gbnf)."""
    cp = ord(c)
    if hexy and not c.isalnum():
        return f"\\x{cp:02x}" if cp < 0x100 else f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}"
    special = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    if c in special:
        return special[c]
    if in_class and c in "]-":
        return "\\" + c
    if in_class and first and c == "^":
        return "\\x5e"
    if not in_class and c == '"':
        return '\\"'
    if cp < 0x20 or cp == 0x7F:
        return f"\\x{cp:02X}"
    return c


def node_text(node: Node, nested: bool) -> str:
    if isinstance(node, Lit):
        return '"' + "".join(esc(c, False, False, node.hexy) for c in node.text) + '"'
    if isinstance(node, Cls):
        parts = []
        for i, (lo, hi) in enumerate(node.ranges):
            first = i == 0 and not node.negated
            parts.append(esc(chr(lo), True, first, False))
            if hi != lo:
                parts.append("-" + esc(chr(hi), True, False, False))
        return "[" + ("^" if node.negated else "") + "".join(parts) + "]"
    if isinstance(node, AnyChar):
        return "."
    if isinstance(node, Ref):
        return node.name
    if isinstance(node, Tok):
        return node.text
    if isinstance(node, Group):
        sep = "\n  " if nested else " "
        return "(" + " |\n ".join(seq_text(alt, True, sep) for alt in node.alts) + ")"
    return node_text(node.node, nested) + node.spelling


def seq_text(seq: tuple[Node, ...], nested: bool, sep: str = " ") -> str:
    """A sequence; an empty one at the top level is spelled '""' (after a final "|" the
    parser would skip the newline and read on into the next rule)."""
    if not seq and not nested:
        return '""'
    return sep.join(node_text(n, nested) for n in seq)


def node_regex(node: Node, rules: dict[str, tuple[tuple[Node, ...], ...]]) -> str:
    if isinstance(node, Lit):
        return re.escape(node.text)
    if isinstance(node, Cls):
        items = "".join(f"\\U{lo:08x}" + (f"-\\U{hi:08x}" if hi != lo else "") for lo, hi in node.ranges)
        return "[" + ("^" if node.negated else "") + items + "]"
    if isinstance(node, AnyChar):
        return "."
    if isinstance(node, Ref):
        return alts_regex(rules[node.name], rules)
    if isinstance(node, Group):
        return alts_regex(node.alts, rules)
    if isinstance(node, Rep):
        quant = f"{{{node.lo},{'' if node.hi is None else node.hi}}}"
        return f"(?:{node_regex(node.node, rules)}){quant}"
    raise AssertionError(node)


def alts_regex(alts: tuple[tuple[Node, ...], ...], rules: dict[str, tuple[tuple[Node, ...], ...]]) -> str:
    return "(?:" + "|".join("".join(node_regex(n, rules) for n in alt) for alt in alts) + ")"


REPS = [("*", 0, None), ("+", 1, None), ("?", 0, 1)]


@st.composite
def reps(draw: st.DrawFn, big: bool, allow_zero_max: bool) -> tuple[str, int, int | None]:
    """A repetition operator as (spelling, min, max). ``allow_zero_max=False`` for the
    inner one of two stacked operators: "S{0,0}" leaves nothing for the next to repeat."""
    if not allow_zero_max:
        spelling, lo, hi = draw(reps(big, True))
        return ("?", 0, 1) if hi == 0 else (spelling, lo, hi)
    if draw(st.booleans()):
        return draw(st.sampled_from(REPS))
    counts = st.integers(0, 3)
    if big:
        counts = counts | st.sampled_from([0, 1, 1999, 2000, 2001, 2500, 10**20])
    lo = draw(counts)
    sp = draw(st.sampled_from(["", " "]))
    form = draw(st.sampled_from(["m", "m,", "m,n"]))
    if form == "m":
        return f"{{{sp}{lo}{sp}}}", lo, lo
    if form == "m,":
        return f"{{{lo},{sp}}}", lo, None
    hi = lo + draw(st.integers(0, 2)) if not big else draw(counts)
    return f"{{{lo},{sp}{hi}}}", lo, hi


@st.composite
def nodes(draw: st.DrawFn, names: list[str], depth: int, big: bool, tokens: bool, under_rep: bool = False) -> Node:
    kinds = ["lit", "lit", "cls", "cls", "any", "group", "rep", "rep"]
    if names:
        kinds += ["ref", "ref"]
    if tokens:
        kinds.append("tok")
    if depth <= 0:
        kinds = [k for k in kinds if k not in ("group", "rep")]
    kind = draw(st.sampled_from(kinds))
    if kind == "lit":
        return Lit(draw(st.text(alphabet=CHARS, min_size=1, max_size=3)), draw(st.booleans()))
    if kind == "cls":
        ranges = []
        for _ in range(draw(st.integers(1, 3))):
            a, b = sorted(draw(st.lists(st.sampled_from(CHARS), min_size=2, max_size=2)))
            ranges.append((ord(a), ord(a) if draw(st.booleans()) else ord(b)))
        return Cls(draw(st.booleans()), tuple(ranges))
    if kind == "any":
        return AnyChar()
    if kind == "ref":
        return Ref(draw(st.sampled_from(names)))
    if kind == "tok":
        return Tok(
            draw(st.sampled_from(["", "!"]))
            + draw(st.sampled_from(["<[5]>", "<[0]>", "<[400]>", "<|im_end|>", "<s>", "<|nope|>"]))
        )
    if kind == "group":
        return Group(draw(alternatives(names, depth - 1, big, tokens, min_items=0)))
    spelling, lo, hi = draw(reps(big, allow_zero_max=not under_rep))
    inner = draw(nodes(names, depth - 1, big, tokens, under_rep=True))
    return Rep(inner, lo, hi, spelling)


@st.composite
def alternatives(
    draw: st.DrawFn, names: list[str], depth: int, big: bool, tokens: bool, min_items: int = 0
) -> tuple[tuple[Node, ...], ...]:
    n_alts = draw(st.integers(1, 3))
    return tuple(
        tuple(draw(st.lists(nodes(names, depth, big, tokens), min_size=min_items, max_size=3))) for _ in range(n_alts)
    )


RULE_NAMES = ["root", "a", "b-2", "x9"]


@st.composite
def grammars(
    draw: st.DrawFn, dag: bool, big: bool = False, tokens: bool = False
) -> dict[str, tuple[tuple[Node, ...], ...]]:
    """Rules by name (root first). ``dag``: rule i refers only to rules after it (no
    recursion: a regular language)."""
    n = draw(st.integers(1, len(RULE_NAMES)))
    names = RULE_NAMES[:n]
    out = {}
    for i, name in enumerate(names):
        refs = names[i + 1 :] if dag else names
        out[name] = draw(alternatives(refs, 2, big, tokens))
    return out


def grammar_text(rules: dict[str, tuple[tuple[Node, ...], ...]], newline: str = "\n") -> str:
    return "".join(
        f"{name} ::= " + " | ".join(seq_text(alt, False) for alt in alts) + newline for name, alts in rules.items()
    )


def strings_for(rules: dict[str, tuple[tuple[Node, ...], ...]], g: ParsedGrammar, rng: random.Random) -> list[str]:
    """Generated strings, their mutations, and random strings over the grammar's characters."""
    alphabet = sorted(set(CHARS) | {"z", "~"})
    out: list[str] = []
    for _ in range(4):
        try:
            s = generate(g, rng, max_depth=6, max_steps=60)
        except GenerationError:
            break
        out.append(s)
        if s:
            i = rng.randrange(len(s))
            out.append(s[:i] + s[i + 1 :])
            out.append(s[:i] + rng.choice(alphabet) + s[i:])
    out += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4))) for _ in range(4)]
    return [s for s in out if len(s) <= 10]


@settings(max_examples=budget(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grammars(dag=True), st.sampled_from(["\n", "\r\n", "\r"]), st.randoms(use_true_random=False))
def test_random_regular_grammars_against_re(
    rules: dict[str, tuple[tuple[Node, ...], ...]], newline: str, rng: random.Random
) -> None:
    text = grammar_text(rules, newline)
    g = parse_gbnf(text)
    try:
        check_grammar(g)
    except LeftRecursionError as e:
        # an unbounded repetition of something with an empty alternative, e.g. ("a" |)*:
        # S' ::= S S' | is left-recursive for llama.cpp (which refuses it); its language
        # is still regular, and the recognizer does not mind
        assert not e.hidden
        event("left-recursive repetition")
    assert_round_trip(g)
    pattern = re.compile(alts_regex(rules["root"], rules), re.DOTALL)
    for s in strings_for(rules, g, rng):
        assert reference_accepts(g, s) == (pattern.fullmatch(s) is not None), (text, s)


@settings(max_examples=budget(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grammars(dag=False), st.randoms(use_true_random=False))
def test_random_recursive_grammars_generate(rules: dict[str, tuple[tuple[Node, ...], ...]], rng: random.Random) -> None:
    text = grammar_text(rules)
    g = parse_gbnf(text)
    assert_round_trip(g)
    try:
        check_grammar(g)
    except LeftRecursionError:
        event("left-recursive")
        return
    for name in g.symbol_ids:
        try:
            s = generate(g, rng, root=name, max_depth=8, max_steps=80)
        except GenerationError:
            event("derives nothing")
            continue
        assert reference_accepts(g, s, root=name), (text, name, s)


MUTATION_PIECES = [
    *'"[](){}\\|\n\r*<>!#:=-,5a é',
    *["\\q", "\\x4", "\\u00e9", "{", "{1,", "{2001}", "{0,0}", "::=", "<[", "<[99]>", "()", "[]", '""', "\r\n"],
]


@st.composite
def grammar_texts(draw: st.DrawFn) -> str:
    """Mostly-valid grammar texts: random rules (recursion, undefined names, tokens, large
    counts), spelled with random line ends, then a few random edits."""
    rules = draw(grammars(dag=False, big=True, tokens=True))
    if draw(st.booleans()):
        del rules[draw(st.sampled_from(sorted(rules)))]  # leaves references undefined
    newline = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    text = draw(st.sampled_from(["", "# grammar\n", "\n \n"])) + grammar_text(rules, newline)
    for _ in range(draw(st.integers(0, 3))):
        if not text:
            break
        i = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["delete", "insert", "insert"]))
        if op == "delete":
            text = text[:i] + text[i + 1 :]
        else:
            text = text[:i] + draw(st.sampled_from(MUTATION_PIECES)) + text[i:]
    return text


@settings(max_examples=budget(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grammar_texts(), st.sampled_from(["root", "root", "a"]))
def test_native_oracle(vocab_model: llama_cffi.Model, text: str, root: str) -> None:
    ours, reason = our_verdict(vocab_model, text, root)
    event(f"{ours}: {reason}")
    if text == "":
        return  # a no-op sampler in llama.cpp
    if ours == "unsafe":  # llama.cpp would run out of memory: LlamaSampler refuses it first
        assert native_grammar_hazard(text) is not None, text
    expected = "reject" if ours == "unsafe" else ours
    assert expected == ("accept" if native_accepts(vocab_model, text, root) else "reject"), text
    if ours == "accept":  # and the printed grammar (the same rules) is accepted too
        assert native_accepts(vocab_model, format_gbnf(parse_gbnf(text)), root), text


# ------------------------------------------------- the crash-hazard check against the checks


@st.composite
def maybe_empty_grammars(draw: st.DrawFn) -> str:
    """Small grammars rich in what hides left recursion from llama.cpp: rules and groups
    that may match nothing ("", [], [^], x?, x*, x{0,n}, empty alternatives) and rule
    references in every position, spelled with random spaces, comments and line breaks
    where GBNF allows them."""
    names = ["root", "a", "b-1", "c"][: draw(st.integers(1, 4))]

    def item(depth: int) -> str:
        kinds = ["ref", "ref", "ref", "empty", "char"] + (["group", "group"] if depth < 2 else [])
        kind = draw(st.sampled_from(kinds))
        if kind == "ref":
            body = draw(st.sampled_from(names))
        elif kind == "empty":
            return draw(st.sampled_from(['""', "[]", "[^]"]))  # nothing to repeat
        elif kind == "char":
            body = draw(st.sampled_from(['"x"', "[y]", ".", '"\\""', "<[3]>"]))
        else:
            nl = draw(st.sampled_from(["", "\n  ", " # note\n"]))
            body = "(" + nl + (" |" + nl).join(seq(depth + 1) for _ in range(draw(st.integers(1, 3)))) + nl + ")"
        return body + draw(st.sampled_from(["", "", "", "?", "*", "+", "{0,2}", "{2}", "{1,}", "{0}", "{ 0 , 3 }"]))

    def seq(depth: int) -> str:
        return " ".join(item(depth) for _ in range(draw(st.integers(0, 3))))

    rules = [f"{name} ::= " + " | ".join(seq(0) for _ in range(draw(st.integers(1, 3)))) for name in names]
    return "\n".join(rules) + draw(st.sampled_from(["", "\n", "\r\n", "  # end"]))


@settings(max_examples=budget(500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(maybe_empty_grammars() | grammar_texts())
def test_native_hazard_check_agrees_with_the_port(text: str) -> None:
    """The crash-hazard check that LlamaSampler.grammar runs on raw text flags hidden left
    recursion exactly where the checks of the parsed grammar find it (and inverted
    repetitions wherever they are spelled), so LlamaSampler.grammar refuses every
    grammar that would exhaust memory."""
    hazard = native_grammar_hazard(text)
    try:
        g = parse_gbnf(text)
    except GrammarSyntaxError as e:
        event("syntax error")
        if "maximum" in e.expected:  # {m,n} with n < m
            assert hazard is not None and "below its minimum" in hazard, text
        return  # otherwise llama.cpp refuses the text itself; the check may say anything
    except GrammarError:
        event("undefined rule")
        return
    hidden = _hidden_left_recursion(g.rules) is not None
    event(f"left recursion with more to match: {hidden}")
    assert (hazard is not None and "left-recursive" in hazard) == hidden, (text, hazard)
    if not hidden:
        assert hazard is None, (text, hazard)


@settings(max_examples=budget(300), deadline=None)
@given(st.text(alphabet=st.sampled_from(list('root:=|()"[]^*+?{},01 \t\n\r#<>!.a-\\é')), max_size=80) | st.text())
def test_native_hazard_check_takes_any_text(text: str) -> None:
    """Any text gives a reason or None, never an exception."""
    hazard = native_grammar_hazard(text)
    assert hazard is None or isinstance(hazard, str)


def chain(n: int, lead: str = "") -> str:
    """root ::= r0, r0 ::= r1, ... r<n> ::= "a", each body starting with ``lead``."""
    return "root ::= r0\n" + "".join(f"r{i} ::= {lead}r{i + 1}\n" for i in range(n)) + f'r{n} ::= "a"'


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('root ::= e root "x" | "y"\ne ::= f\nf ::= "" | "z"', "left-recursive"),
        ('root ::= [] root "x" | "y"', "left-recursive"),  # [] adds no element in llama.cpp
        ('root ::= (e root)* "x"\ne ::= "q"?', "left-recursive"),
        ('root ::= "a"{3, 2}', "below its minimum"),
        ('root ::= "a" ( [b]{ 9 , 1 } )', "below its minimum"),
        ("root ::= " + "(" * (MAX_DEPTH + 1) + '"a"' + ")" * (MAX_DEPTH + 1), "nested"),
        (chain(MAX_DEPTH), "chain"),
        ('root ::= e root | "y"\ne ::= f\nf ::= "" | "z"', None),  # nothing after the cycle
        ('root ::= ("a"?)* "b"', None),
        ('root ::= root "a"', "left-recursive"),  # llama.cpp refuses this one itself too
        (chain(MAX_DEPTH - 3), None),
        ("root ::= " + "(" * (MAX_DEPTH - 2) + '"a"' + ")" * (MAX_DEPTH - 2), None),
        (chain(20000, '"x" '), None),  # references after a character do not count
    ],
    ids=lambda v: v[:30] if isinstance(v, str) else str(v),
)
def test_native_hazards(text: str, reason: str | None) -> None:
    hazard = native_grammar_hazard(text)
    assert (hazard is None) if reason is None else (hazard is not None and reason in hazard), hazard


# ------------------------------------------ the fast parser and checks against the reference
#
# parse_gbnf reads texts it is sure of with gbnf._FastParser (lines as the schema
# converter writes them in bulk, other lines token by token, lines met before replayed
# from templates) and falls back to gbnf._Parser, the port of llama.cpp's parser, for
# anything else; check_grammar's checks work on the whole grammar at once. Both must give
# exactly what the reference gives: below, the reference parser and (test-only) the
# element-by-element checks they replaced.


def reference_parse(text: str) -> ParsedGrammar:
    return gbnf._Parser(text).parse()


def parse_outcome(parse: Callable[[str], ParsedGrammar], text: str) -> tuple[object, ...]:
    """The grammar (with the order of its symbols), or the error's type, message, line,
    column and what was expected."""
    try:
        g = parse(text)
    except GrammarError as e:
        return (type(e), str(e), getattr(e, "line", None), getattr(e, "column", None), getattr(e, "expected", None))
    return ("ok", g.rules, tuple(g.symbol_ids.items()), g.token_names, g.names)


def assert_parses_like_reference(text: str) -> bool:
    """parse_gbnf(text) is exactly the reference's; so is what the fast parser gives, by
    the C parser and by its Python path alone, met for the first time, then again (a
    template made of each line that is not of the converter's kind), then replayed; so
    is the nesting depth that native_grammar_hazard reads. Whether the fast parser read
    it."""
    expected = parse_outcome(reference_parse, text)
    assert parse_outcome(parse_gbnf, text) == expected, text
    read = False
    for c_parser in (True, False, False, False):
        fast = gbnf._FastParser(c_parser=c_parser)
        g = fast.parse(text)
        if g is None:
            continue
        read = True
        assert ("ok", g.rules, tuple(g.symbol_ids.items()), g.token_names, g.names) == expected, (c_parser, text)
        if isinstance(g._parsed, tuple):  # the C parser's: its left-cycle check is the Python one's
            leading = gbnf._Leading(g.rules)
            assert g._parsed[4] == gbnf._acyclic(leading.successors(leading.nullable)), text
        reference = gbnf._Parser(text)
        reference.parse()
        assert fast.max_nesting == reference.max_nesting, (c_parser, text)
    return read


FAST_PARSE_CASES = [
    *[text for text, _rules, _ids in PARSE_CASES],
    *[text for text, *_ in ERROR_CASES],
    # escapes, in literals and classes, at the ends of ranges
    'root ::= "\\x41\\xfF\\u00e9\\uD800\\U0001F600\\U00110000\\t\\n\\r\\\\\\"\\[\\]\\-"',
    'root ::= [\\x00-\\x1F\\u2028-\\u2029\\U00010000-\\U0010FFFF\\t\\n\\r\\\\\\]\\-\\[\\"]',
    'root ::= "\\x4G"',
    'root ::= "\\u12"',
    'root ::= "\\U1234567"',
    'root ::= "\\U1234567G"',
    'root ::= "\\x"',
    'root ::= "\\a"',
    "root ::= [\\q]",
    "root ::= [a-\\x]",
    'root ::= "\\',
    "root ::= [a-",
    "root ::= [\\",
    # classes: ranges, "-" first and last, "^", empty
    "root ::= [a-z0-9-] [-a] [a--] [^-] [^^] [^a-] [] [^] [a-\\]] [\\^a]",
    "root ::= [ ] [ \\t] [^ ] [- ]",
    'root ::= [ !#-\\[\\]-\\uD7FF\\uE000-\\U0010FFFF] | "a b" | "  " | " "',
    # the converter's kind of line, and small departures from it
    'root ::= a b | "c" [d] .\na ::= "x"\nb ::= [y]',
    'root ::= a  b\na ::= "x"\nb ::= "y"',
    'root ::= a b \na ::= "x"\nb ::= "y"',
    'root ::= a b\t\na ::= "x"\nb ::= "y"',
    'root::= a\na ::= "x"',
    'root ::=a\na ::= "x"',
    'root ::= a |\na ::= "x"',
    'root ::= a |\n  "b"\na ::= "x"',
    'root ::= a\n  | "b"\na ::= "x"',
    'root ::= a ::= "x"',
    'root ::= "a" "b" # c\nx ::= "y"',
    'root ::= "a" ("b"\n  "c") | "d"\nx ::= "y"',
    'root ::= ("a"\nx ::= "y")',
    'root ::= "a\nx ::= "y"\n"',
    'root ::= "a\nx ::= "y"\nz"',
    'root ::= "a\nx ::= "\nz ::= "y"',
    'root ::= [a\nx ::= ]\nz ::= "y"',
    'root ::= x\nx ::= "y" |',
    'root ::= x\nx ::= "y" |\n',
    "root ::= x\nx ::=",
    "root ::=\n",
    "root ::= |",
    "root ::= . | .* .+ .?",
    # line ends, blank lines, comments
    'root ::= a\r\na ::= "x"\r\n',
    'root ::= a\ra ::= "x"\r',
    'root ::= a\n\r\na ::= "x"',
    '\n\n# c\n  \nroot ::= a # c\n\n# d\na ::= "x" # e',
    'root ::= ( # c\n  "a" # d\n  | "b"\n) # e',
    "#\nroot ::= #\n  a\na ::= #\n",
    'root ::= "a" #\n',
    'root ::= "a"\x0b',
    'root ::= "a"\x0c\nb ::= "c"',
    'root ::= "a"\u2028b ::= "c"',
    # repetitions: every form, spaces, large and odd counts
    'root ::= "a"{2} "b"{0,} "c"{1,3} "d"{ 2 , 4 } "e"{0,0} "f"{ 3 , }',
    'root ::= "a"{,3}',
    'root ::= "a"{1,2,3}',
    'root ::= "a"{01}',
    'root ::= "a"{00002}',
    'root ::= "a"{0002,00003}',
    'root ::= "a"{2000} | "b"{0,2000} | "c"{0,2001} | "d"{0,99999999999999999999}',
    'root ::= "a"{2001}',
    'root ::= "a"{1,184467440737095516150}',
    'root ::= "a"{18446744073709551615}',
    'root ::= "a"{3,2}',
    'root ::= "a"{2}{1000}',
    'root ::= "a"{2}{1001}',
    'root ::= ("a" b){1000}\nb ::= "x"',
    'b ::= "x"\nroot ::= ("a" b){1000}',
    'root ::= "a"{0,0}*',
    'root ::= "a"*{2}',
    'root ::= ("a"?){3,}',
    'root ::= "a"{ # c\n1}',
    'root ::= ("a"{ # c\n1})',
    'root ::= ("a"{\n1,\n2\n})',
    'root ::= "a"{\t1\t,\t2\t}',
    # groups
    'root ::= ((("a")))*',
    "root ::= ()",
    "root ::= (|)",
    'root ::= ("a" | ("b" ("c" | "d")+)?)+ "e"',
    'root ::= ("a"',
    'root ::= "a")',
    "root ::= (\n)",
    "root ::= ((\n\n))",
    # tokens (not read by the fast parser)
    "root ::= <[5]> !<[6]> <|im_end|>",
    'root ::= "<" "!" [<!]',
    # names
    "root ::= a-b-1 ---\na-b-1 ::= ---\n--- ::= ",
    "root ::= Root\nRoot ::= ROOT\nROOT ::= ",
    "root ::= x_1",
    "root ::= é",
    "é ::= root",
    "root ::= undefined",
    'root ::= "a"\nroot ::= "b"',
    'root ::= root-1 ("a")\nroot-1 ::= "b"',
    # sizes past what the caches keep: a long literal, a line that makes many elements
    'root ::= "' + "abc\\n" * 200 + '" x\nx ::= [' + "a-z" * 100 + "]",
    'root ::= ("a" | "b") x{0,1500}\nx ::= "y"',
    # others
    "",
    " ",
    "\n",
    "# only a comment",
    'root ::= "a\0"',
    "\0",
    "::=",
    "root",
    "root ::= ::=",
]


@pytest.mark.parametrize("text", FAST_PARSE_CASES)
def test_fast_parse_cases(text: str) -> None:
    assert_parses_like_reference(text)


def test_fast_parser_reads_the_converters_grammars() -> None:
    """The fast parser reads the schema converter's grammars itself (the point of it),
    and gives what the reference gives."""
    from samplers.grammar.schema import schema_to_gbnf

    schemas: list[dict[str, Any]] = [
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"]},
        {"type": "array", "items": {"type": "number", "minimum": 0}, "minItems": 1, "maxItems": 5},
        {"type": "string", "pattern": "^[a-z]{2,8}(-[0-9]+)?$"},
        {"type": "object", "additionalProperties": {"enum": ["x y", 'q"uote', 3, None]}},
        {"anyOf": [{"type": "string", "format": "date"}, {"type": "boolean"}, {"const": {"k": [1, 2]}}]},
        {"type": "string", "minLength": 3, "maxLength": 300},
    ]
    for schema in schemas:
        for validator in (False, True):
            text = schema_to_gbnf(schema, validator=validator, formats="assert")
            assert assert_parses_like_reference(text), text
            assert gbnf._c_parse(text) is not None, text  # the C parser itself


def test_fast_parser_falls_back() -> None:
    for text in ["root ::= <[5]>", 'root ::= "\\q"', 'root ::= "a"{1,\n2}', "root ::= x", 'root ::= "a"{2001}']:
        assert gbnf._c_parse(text) is None
        assert gbnf._FastParser().parse(text) is None
        assert_parses_like_reference(text)


def test_c_parser_at_its_edges() -> None:
    """What the C parser leaves to Python (groups nested over 64 deep, a lone surrogate
    in the text) and what it reads at the edges of its arrays (repetitions that outgrow
    its first guess of the grammar's size, non-ASCII literals and classes, \\U escapes
    past the code points), all as the reference reads them."""
    deep = "root ::= " + "(" * 65 + '"x"' + ")" * 65
    assert gbnf._c_parse(deep) is None and assert_parses_like_reference(deep)
    shallow = "root ::= " + "(" * 64 + '"x"' + ")" * 64
    got = gbnf._c_parse(shallow)
    assert got is not None and got[1] == 64 and assert_parses_like_reference(shallow)
    assert gbnf._c_parse('root ::= "\\ud800"') is not None  # an escape: a value, not text
    surrogate = 'root ::= "\\ud800" "\ud800"'
    assert gbnf._c_parse(surrogate) is None and assert_parses_like_reference(surrogate)
    many = 'root ::= "a"{0,1000} "b"{0,1000} x\nx ::= ("é" [à-ü\\U0010FFFF\\UFFFFFFFF])+ "€"'
    got = gbnf._c_parse(many)
    assert got is not None and len(got[0].rules) > 2000 and assert_parses_like_reference(many)
    for text in ['root ::= "\\U0010FFF"', "root ::= [\\x4]", "root ::= ()", "root ::= x\r\nx ::= |", "a ::= b\r"]:
        assert_parses_like_reference(text)


def test_only_what_the_fast_parsers_made_skips_the_element_checks() -> None:
    """check_grammar does not check element by element what the fast parsers made (their
    mark, with the C parser's elements); a grammar built or changed by hand has no mark
    and is checked."""
    g = parse_gbnf('root ::= "a" x\nx ::= "b" | [c-d]')
    assert isinstance(g._parsed, tuple) and gbnf._FastParser(c_parser=False).parse('root ::= "a"')._parsed is True  # type: ignore[union-attr]
    check_grammar(g)
    for bad in (
        replace(g, rules=(g.rules[0][:-1], g.rules[1])),  # END dropped
        ParsedGrammar((g.rules[0], ((gbnf.GreType.CHAR_ALT, 99), *g.rules[1])), g.symbol_ids),  # a modifier first
        ParsedGrammar(((*g.rules[0][:-1], (gbnf.GreType.RULE_REF, 7), g.rules[0][-1]), g.rules[1]), g.symbol_ids),
    ):
        assert not bad._parsed
        with pytest.raises(GrammarError, match=r"malformed|undefined"):
            check_grammar(bad)


def test_the_c_parsers_rules_are_made_when_first_read() -> None:
    """A grammar the C parser made keeps its rules as the parser's arrays until something
    reads ``rules``: checking it and making its engines (either core) never does. Read,
    they are the Python parser's; equality, ``repr``, a pickle, a deep copy and
    ``dataclasses.replace`` see the same grammar; any other missing attribute is still an
    AttributeError."""
    import copy
    import pickle

    from samplers.grammar import Grammar

    text = 'root ::= "a" x y\nx ::= "b" | [c-d]+\ny ::= x? "e" | "\\u00e9"\n'
    want = gbnf._FastParser(c_parser=False).parse(text)
    assert want is not None and want._parsed is True
    g = parse_gbnf(text)
    assert isinstance(g._parsed, tuple) and "rules" not in vars(g)
    check_grammar(g)
    grammar = Grammar(g)
    grammar._engine_for("c")
    grammar._engine_for("python")
    assert "rules" not in vars(g)
    assert g.rules == want.rules and "rules" in vars(g) and g == want
    assert repr(parse_gbnf(text)) == repr(want)
    assert pickle.loads(pickle.dumps(parse_gbnf(text))) == want
    assert copy.deepcopy(parse_gbnf(text)).rules == want.rules
    assert replace(parse_gbnf(text)).rules == want.rules
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        g.nope  # type: ignore[attr-defined]  # noqa: B018


@pytest.mark.parametrize(
    ("text", "no_cycle"),
    [
        ('root ::= a\na ::= b "x" | ""\nb ::= "y"', True),
        ('root ::= root "a" | "b"', False),  # direct
        ('root ::= a "x"\na ::= b\nb ::= root | "y"', False),  # through two rules
        ('root ::= e root "x" | "y"\ne ::= "" | "z"', False),  # behind a rule that may be empty
        ('root ::= e f root | "y"\ne ::= f f\nf ::= "z"*', False),  # behind rules empty only indirectly
        ('root ::= e "q" root | "y"\ne ::= "" | "z"', True),  # a character first
        ('root ::= (a | b) "x"\na ::= b "y"\nb ::= "z" | a?', False),  # through a group and a repetition
    ],
)
def test_c_left_cycle_check_is_the_python_one(text: str, no_cycle: bool) -> None:
    """The C parser's answer to check_grammar's first question (no rule reaches itself
    before a character) is what the Python checks answer, and check_grammar then raises
    as the reference does."""
    got = gbnf._c_parse(text)
    assert got is not None
    g = got[0]
    assert isinstance(g._parsed, tuple) and g._parsed[4] is no_cycle
    leading = gbnf._Leading(g.rules)
    assert gbnf._acyclic(leading.successors(leading.nullable)) is no_cycle
    assert check_outcome(check_grammar, g, "root") == check_outcome(reference_check, g, "root")


def test_c_parser_refuses_bad_arguments() -> None:
    """The C parser checks its arguments before reading anything: -4, not a crash; past
    an array's capacity it says so (-1) and writes nothing beyond it."""
    import numpy as np

    from llama_cffi._binding import ffi, lib

    text = b'root ::= "a"'
    u32 = np.zeros(64, dtype=np.uint32)
    i32 = np.zeros(64, dtype=np.int32)

    def call(text_ptr: Any = None, n: int = len(text), cap: int = 16, syms: int = 8, hash_size: int = 16) -> int:
        return int(
            lib.llama_cffi_gbnf_parse(
                ffi.from_buffer(text) if text_ptr is None else text_ptr,
                n,
                ffi.from_buffer("uint32_t[]", u32),
                cap,
                ffi.from_buffer("uint32_t[]", u32),
                cap,
                ffi.from_buffer("int32_t[]", i32),
                ffi.from_buffer("int32_t[]", i32),
                ffi.from_buffer("int32_t[]", i32),
                syms,
                ffi.from_buffer("int32_t[]", np.zeros(hash_size, dtype=np.int32)),
                hash_size,
                ffi.from_buffer("int32_t[]", np.zeros(3, dtype=np.int32)),
            )
        )

    assert call() == 0
    assert call(text_ptr=ffi.NULL) == -4
    assert call(n=-1) == -4
    assert call(cap=-1) == -4
    assert call(syms=-1) == -4
    assert call(hash_size=12) == -4  # not a power of two
    assert call(cap=1) == -1 and call(syms=0) == -1  # past a capacity
    u32[:] = 7
    assert call(cap=1) == -1 and (u32[2:] == 7).all()  # one pair at most: nothing past it written

    # the unpacker reads the parser's offsets only once checked against what they index
    def unpack(off: int = 0, length: int = 2, name: int = 0, n_elems: int = 2, cap: int = 8, names: int = 16) -> int:
        elems = np.array([3, 97, 0, 0], dtype=np.uint32)
        rule = np.array([off, length], dtype=np.int32)
        sym = np.array([name, 4, -1], dtype=np.int32)
        return int(
            lib.llama_cffi_gbnf_unpack(
                ffi.from_buffer(text),
                len(text),
                ffi.from_buffer("uint32_t[]", elems),
                n_elems,
                ffi.from_buffer("int32_t[]", rule[:1]),
                ffi.from_buffer("int32_t[]", rule[1:]),
                ffi.from_buffer("int32_t[]", sym),
                1,
                ffi.from_buffer("int32_t[]", np.zeros(8, dtype=np.int32)),
                cap,
                ffi.from_buffer("uint32_t[]", np.zeros(16, dtype=np.uint32)),
                cap,
                ffi.from_buffer("int32_t[]", np.zeros(16, dtype=np.int32)),
                16,
                ffi.from_buffer("char[]", np.zeros(16, dtype=np.uint8)),
                names,
                ffi.from_buffer("int64_t[]", np.zeros(3, dtype=np.int64)),
            )
        )

    assert unpack() == 0
    assert unpack(off=1) == -4 and unpack(off=-1) == -4 and unpack(length=3) == -4  # past the elements
    assert unpack(name=len(text) - 3) == -4  # a name past the text
    assert unpack(cap=1) == -1 and unpack(names=3) == -1  # past a capacity

    # the left-cycle check: every reference to a rule among them, the lengths the elements'
    def cycle(ref: int = 0, lens: tuple[int, ...] = (2,), work: int = 64) -> int:
        rule_len = np.array(lens, dtype=np.int32)
        return int(
            lib.llama_cffi_gbnf_no_left_cycle(
                ffi.from_buffer(bytes([2, 0])),
                ffi.from_buffer("uint32_t[]", np.array([ref, 0], dtype=np.uint32)),
                2,
                ffi.from_buffer("int32_t[]", rule_len),
                len(rule_len),
                ffi.from_buffer("int32_t[]", np.zeros(64, dtype=np.int32)),
                work,
            )
        )

    assert cycle() == 0  # root ::= root
    assert cycle(ref=1) == -4 and cycle(lens=(3,)) == -4 and cycle(lens=(1,)) == -4
    assert cycle(work=18) == -1  # 6 * 2 + 5 * 1 + 2 = 19 ints needed


@settings(max_examples=budget(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grammars(dag=False, big=True, tokens=True), st.sampled_from(["\n", "\r\n", "\r"]))
def test_fast_parse_random_grammars(rules: dict[str, tuple[tuple[Node, ...], ...]], newline: str) -> None:
    text = grammar_text(rules, newline)
    event(f"fast: {assert_parses_like_reference(text)}")


@st.composite
def mutated(draw: st.DrawFn, texts: st.SearchStrategy[str]) -> str:
    """A text with up to 3 random edits (deletions, insertions of MUTATION_PIECES)."""
    text = draw(texts)
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(text)))
        if draw(st.booleans()) and i < len(text):
            text = text[:i] + text[i + 1 :]
        else:
            text = text[:i] + draw(st.sampled_from([*MUTATION_PIECES, " ", "  ", "\t", ".", "?", "+"])) + text[i:]
    return text


def printed(rules: dict[str, tuple[tuple[Node, ...], ...]]) -> str:
    """The grammar printed by format_gbnf: the schema converter's kind of lines."""
    try:
        return format_gbnf(parse_gbnf(grammar_text(rules)))
    except GrammarError:
        return grammar_text(rules)


@settings(max_examples=budget(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    grammar_texts()
    | maybe_empty_grammars()
    | mutated(grammars(dag=False, big=True).map(printed))
    | mutated(maybe_empty_grammars())
    | st.text(alphabet=GRAMMAR_CHARS)
    | st.text(alphabet=GRAMMAR_CHARS).map(lambda s: "root ::= " + s)
    | st.text()
)
def test_fast_parse_texts(text: str) -> None:
    event(f"fast: {assert_parses_like_reference(text)}")


# Lines that recur in grammars in other company: their templates are replayed where some
# of their names are known before and some are not (a group counts the symbols created
# inside it against llama.cpp's limit on repeated rules: "big" passes only where "d" or
# "e" is known before it)
TEMPLATE_LINES = [
    'json-number ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [+-]? [0-9]+)?',
    'ws ::= | " " | "\\n"{1,2} [ \\t]{0,20}',
    'root ::= a b c d e ws json-number "x"',
    'a ::= ("x" b c){2,3} | b*',
    'b ::= "y" | c? | d',
    "c ::= [a-z]+ b | (e (d))",
    'big ::= ("a" d e){999}',
    'd ::= "d" | e',
    "e ::= (d | )*",
    "e ::= d? e",
    'd ::= "q" root',
    "root ::= big b",
    "a ::= ( # c",
    '  "x" ) | b',
    "b ::= x |",
    'x ::= "z"',
    "",
    "# comment",
    'x ::= "z"  # trailing',
    'c ::= "[a-z]+ b"',
    "c ::= c{2}",
]


@settings(max_examples=budget(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(TEMPLATE_LINES), min_size=1, max_size=8),
    st.sampled_from(["\n", "\n", "\r\n"]),
    st.booleans(),
)
def test_fast_parse_templates(lines: list[str], newline: str, define_all: bool) -> None:
    if define_all:  # no name left undefined
        lines = [
            *lines,
            *(f'{name} ::= "{name}"' for name in ["root", "a", "b", "c", "d", "e", "x", "big", "ws", "json-number"]),
        ]
    event(f"fast: {assert_parses_like_reference(newline.join(lines))}")


@pytest.mark.parametrize(
    "text",
    [
        "root ::= " + '"\\' * 20000,  # no literal ever closes: each '"' would read to the end
        "root ::= " + "[\\" * 20000,
        "root ::= " + '"x" ' * 20000 + "*",
        "root ::= " + "(" * 20000,
        'a ::= "x"\n' * 20000 + 'b ::= "',
    ],
    ids=["quotes", "brackets", "long line", "parentheses", "many lines"],
)
def test_fast_parse_is_linear(text: str) -> None:
    """Texts that a tokenizer reading on after an error would take quadratic time on
    (minutes, where the linear parse takes milliseconds). The bound only tells the two
    apart: it holds on a machine 100 times slower than usual (a test asserts no speed)."""
    start = time.perf_counter()
    assert_parses_like_reference(text)
    assert time.perf_counter() - start < 30.0


def test_fast_parse_template_cache_is_bounded() -> None:
    for i in range(3 * gbnf._FAST_TEMPLATES):
        text = f'root ::= x{i} "a"?\nx{i} ::= ("b" root)*'
        assert_parses_like_reference(text)
        assert len(gbnf._fast_templates) <= gbnf._FAST_TEMPLATES


# --- the checks as they were, element by element (the reference for check_grammar); as
# before, _strongly_connected_components (unchanged) numbers the components


def reference_validate(g: ParsedGrammar) -> None:
    n = len(g.rules)
    for i, rule in enumerate(g.rules):
        if not rule or rule[-1][0] != GreType.END or any(t == GreType.END for t, _v in rule[:-1]):
            raise GrammarError(f"malformed rule {i}: it must end with END (and only there)")
        prev = GreType.END
        for t, v in rule:
            if t not in {int(x) for x in GreType}:
                raise GrammarError(f"malformed rule {i}: unknown element type {t}")
            if t == GreType.RULE_REF and not 0 <= v < n:
                raise GrammarError(f"invalid grammar: rule {i} references undefined rule {v}")
            if t in (GreType.CHAR_ALT, GreType.CHAR_RNG_UPPER) and prev not in CHAR_TYPES:
                raise GrammarError(f"malformed rule {i}: {GreType(t).name} without a preceding character")
            if t in CHAR_TYPES and not 0 <= v <= 2**32 - 1:
                raise GrammarError(f"malformed rule {i}: character value {v} out of range")
            if t in (GreType.TOKEN, GreType.TOKEN_NOT) and not -len(g.token_names) <= v <= 2**32 - 1:
                raise GrammarError(f"malformed rule {i}: token value {v} out of range")
            prev = t


CHAR_TYPES = {GreType.CHAR, GreType.CHAR_NOT, GreType.CHAR_RNG_UPPER, GreType.CHAR_ALT, GreType.CHAR_ANY}


def split_alternatives(rule: Rule) -> list[Rule]:
    out: list[Rule] = []
    start = 0
    for i, (t, _v) in enumerate(rule):
        if t in (GreType.ALT, GreType.END):
            out.append(tuple(rule[start:i]))
            start = i + 1
    return out


def reference_llama_left_recursion(rules: tuple[Rule, ...]) -> int | None:
    n = len(rules)
    visited = [False] * n
    in_progress = [False] * n
    may_be_empty = [False] * n

    def enter(r: int) -> None:
        in_progress[r] = True
        may_be_empty[r] = any(not alt for alt in split_alternatives(rules[r]))

    for start in range(n):
        if visited[start]:
            continue
        enter(start)
        stack = [[start, 0, 1]]  # rule, element index, "still at a leftmost position"
        while stack:
            frame = stack[-1]
            r, i, leftmost = frame
            rule = rules[r]
            if i == len(rule):
                in_progress[r] = False
                visited[r] = True
                stack.pop()
                if stack:  # back in the parent, just after its reference to r
                    parent = stack[-1]
                    if not may_be_empty[r]:
                        parent[2] = 0
                    parent[1] += 1
                continue
            t, v = rule[i]
            if t == GreType.RULE_REF and leftmost:
                if in_progress[v]:
                    return start
                if not visited[v]:
                    enter(v)
                    stack.append([v, 0, 1])
                    continue
                if not may_be_empty[v]:
                    frame[2] = 0
            elif t == GreType.END or t == GreType.ALT:
                frame[2] = 1
            else:
                frame[2] = 0
            frame[1] += 1
    return None


def reference_nullable_rules(rules: tuple[Rule, ...]) -> list[bool]:
    nullable = [False] * len(rules)
    pending: list[int] = []
    owner: list[int] = []
    occurrences: list[list[int]] = [[] for _ in rules]
    todo: list[int] = []
    for r, rule in enumerate(rules):
        for alt in split_alternatives(rule):
            if any(t != GreType.RULE_REF for t, _v in alt):
                continue
            k = len(pending)
            pending.append(len(alt))
            owner.append(r)
            for _t, v in alt:
                occurrences[v].append(k)
            if not alt and not nullable[r]:
                nullable[r] = True
                todo.append(r)
    while todo:
        v = todo.pop()
        for k in occurrences[v]:
            pending[k] -= 1
            if pending[k] == 0 and not nullable[owner[k]]:
                nullable[owner[k]] = True
                todo.append(owner[k])
    return nullable


def reference_leading_edges(rules: tuple[Rule, ...]) -> list[list[tuple[int, bool]]]:
    nullable = reference_nullable_rules(rules)
    edges: list[list[tuple[int, bool]]] = [[] for _ in rules]
    for r, rule in enumerate(rules):
        for alt in split_alternatives(rule):
            for i, (t, v) in enumerate(alt):
                if t != GreType.RULE_REF:
                    break
                edges[r].append((v, i + 1 < len(alt)))
                if not nullable[v]:
                    break
    return edges


def reference_hidden_left_recursion(rules: tuple[Rule, ...]) -> int | None:
    edges = reference_leading_edges(rules)
    component = gbnf._strongly_connected_components(len(rules), [[v for v, _ in es] for es in edges])
    for r, es in enumerate(edges):
        for v, continued in es:
            if continued and component[v] == component[r]:
                return r
    return None


def reference_check(g: ParsedGrammar, root: str = "root") -> None:
    if not g.rules:
        raise GrammarError("grammar has no rules")
    if root not in g.symbol_ids:
        raise GrammarError(f"grammar does not contain a '{root}' symbol")
    if not 0 <= g.symbol_ids[root] < len(g.rules):
        raise GrammarError(f"grammar's '{root}' symbol has no rule")
    reference_validate(g)
    # the one change: values that are no integers (0.5) used to pass, then fail later
    # or not at all, depending on where they were
    for i, rule in enumerate(g.rules):
        for t, v in rule:
            if not (isinstance(t, int) and isinstance(v, int)):
                raise GrammarError(f"malformed rule {i}: element {(t, v)!r} is not a pair of integers")
    r = reference_llama_left_recursion(g.rules)
    if r is not None:
        name = g.names[r] or f"#{r}"
        raise LeftRecursionError(f"unsupported grammar, left recursion detected for nonterminal '{name}'", name, False)
    r = reference_hidden_left_recursion(g.rules)
    if r is not None:
        name = g.names[r] or f"#{r}"
        raise LeftRecursionError(
            f"unsupported grammar, left recursion through rules that may be empty detected for nonterminal '{name}'",
            name,
            True,
        )


def check_outcome(check: Callable[[ParsedGrammar, str], None], g: ParsedGrammar, root: str) -> tuple[object, ...]:
    try:
        check(g, root)
    except LeftRecursionError as e:
        return (type(e), str(e), e.rule, e.hidden)
    except Exception as e:
        return (type(e), str(e))
    return ("ok",)


def assert_checks_like_reference(g: ParsedGrammar, root: str = "root") -> None:
    assert check_outcome(check_grammar, g, root) == check_outcome(reference_check, g, root), g
    try:
        reference_validate(g)
    except Exception:
        return
    if not all(isinstance(v, int) for rule in g.rules for _t, v in rule):
        return  # (values that are no int pass validation, then check_grammar fails alike)
    pairs: list[tuple[Callable[[tuple[Rule, ...]], object], Callable[[tuple[Rule, ...]], object]]] = [
        (_llama_left_recursion, reference_llama_left_recursion),
        (gbnf._nullable_rules, reference_nullable_rules),
        (gbnf._leading_edges, reference_leading_edges),
        (_hidden_left_recursion, reference_hidden_left_recursion),
    ]
    for ours, reference in pairs:
        assert ours(g.rules) == reference(g.rules), (ours, g)


@st.composite
def element_grammars(draw: st.DrawFn) -> ParsedGrammar:
    """Small grammars built element by element, rich in left recursion: each alternative
    a few rule references and characters (or nothing)."""
    n = draw(st.integers(1, 6))
    rules = []
    for _ in range(n):
        rule: list[Element] = []
        for k in range(draw(st.integers(1, 3))):
            if k:
                rule.append(ALT)
            for _ in range(draw(st.integers(0, 3))):
                rule.append(R(draw(st.integers(0, n - 1))) if draw(st.integers(0, 3)) else C("x")[0])
        rules.append((*rule, END))
    return ParsedGrammar(tuple(rules), {f"r{i}": i for i in range(draw(st.integers(0, n)))} | {"root": 0})


@st.composite
def malformed(draw: st.DrawFn, grammars: st.SearchStrategy[ParsedGrammar]) -> ParsedGrammar:
    """A grammar with one element replaced, removed or added: any type or value, lists,
    triples, END in place or not."""
    g = draw(grammars)
    rules = [list(rule) for rule in g.rules]
    i = draw(st.integers(0, len(rules) - 1))
    j = draw(st.integers(0, len(rules[i])))
    element = draw(
        st.tuples(
            st.integers(-1, 12) | st.sampled_from(list(GreType)),
            st.integers(-3, 2**32) | st.sampled_from([-(2**40), 2**32 - 1, 2**32]),
        )
        | st.sampled_from([(2, 0.5), (3, float("nan")), [3, 97], (3, 97, 0), (3,), (True, 0), (2, True)])
    )
    op = draw(st.sampled_from(["replace", "insert", "delete", "empty"]))
    if op == "replace" and j < len(rules[i]):
        rules[i][j] = element
    elif op == "delete" and j < len(rules[i]):
        del rules[i][j]
    elif op == "empty":
        rules[i] = []
    else:
        rules[i].insert(j, element)
    return ParsedGrammar(tuple(tuple(rule) for rule in rules), g.symbol_ids, g.token_names)


def parsed(text: str) -> ParsedGrammar | None:
    try:
        return parse_gbnf(text)
    except GrammarError:
        return None


@settings(max_examples=budget(500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    element_grammars()
    | maybe_empty_grammars().map(parsed).filter(bool)
    | grammar_texts().map(parsed).filter(bool)
    | malformed(element_grammars())
    | malformed(maybe_empty_grammars().map(parsed).filter(bool)),
    st.sampled_from(["root", "root", "a", "r1"]),
)
def test_checks_like_reference(g: ParsedGrammar, root: str) -> None:
    assert_checks_like_reference(g, root)


@pytest.mark.parametrize("text", [t for t in FAST_PARSE_CASES if parsed(t)])
def test_check_cases_like_reference(text: str) -> None:
    g = parse_gbnf(text)
    assert_checks_like_reference(g, "root")
