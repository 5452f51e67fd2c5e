"""The complete JSON-schema converter (samplers.grammar.schema): agreement with a validator
(``jsonschema``) on generated schemas and values, the numeric, string and regular-expression
grammars against exact arithmetic and Python, the generation options, warnings and strict
mode, references, pydantic input, and no crash on arbitrary input."""

from __future__ import annotations

import copy
import functools
import itertools
import json
import re
import urllib.parse
import warnings
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from samplers.grammar import Grammar, SchemaError
from samplers.grammar.json_schema import SchemaWarning, json_schema_to_gbnf, llama_cpp_json_schema_to_gbnf
from samplers.grammar.schema import UnsupportedSchemaError, schema_to_gbnf
from samplers.grammar.schema._dfa import from_regex, pattern
from samplers.grammar.schema._numbers import NumberSpec
from samplers.grammar.schema._regex import ANY, Alt, CharSet, RegexSyntaxError, Repeat, Seq, anchored, parse
from samplers.grammar.schema._rules import RuleSet
from samplers.testing import SchemaExample, json_schemas


def grammar(schema: Any, **options: Any) -> Grammar:
    return Grammar.from_gbnf(schema_to_gbnf(schema, **options))


def both(g: Grammar, value: Any) -> bool:
    """Whether the grammar accepts the value's compact and default json.dumps spellings
    (they must agree)."""
    a = g.accepts(json.dumps(value, separators=(",", ":")))
    b = g.accepts(json.dumps(value))
    assert a == b, value
    return a


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["a", "b", "c", "é", "x y"]), inner, max_size=4)
    ),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_schemas(max_depth=2), st.lists(json_values, min_size=1, max_size=6))
def test_grammar_agrees_with_a_validator(example: SchemaExample, others: list[Any]) -> None:
    """With validator semantics, wherever the converter raised no warning, the grammar
    accepts exactly the values ``jsonschema`` says are valid: the example's instances and
    arbitrary JSON values (mostly invalid)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = grammar(example.schema, validator=True)
    assume(not [w for w in caught if issubclass(w.category, SchemaWarning)])
    validator = jsonschema.Draft202012Validator(example.schema)
    for value in [*example.instances, *others]:
        assert both(g, value) == validator.is_valid(value), (example.schema, value)


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        json_values,
        lambda inner: st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "items",
                    "properties",
                    "required",
                    "anyOf",
                    "allOf",
                    "oneOf",
                    "not",
                    "enum",
                    "const",
                    "minimum",
                    "maximum",
                    "pattern",
                    "minLength",
                    "$ref",
                    "contains",
                    "prefixItems",
                    "if",
                    "then",
                    "else",
                    "additionalProperties",
                    "patternProperties",
                    "multipleOf",
                    "format",
                    "$defs",
                    "unevaluatedProperties",
                ]
            ),
            inner,
            max_size=4,
        ),
        max_leaves=12,
    )
)
def test_arbitrary_input_never_crashes(schema: Any) -> None:
    """Any JSON value as a schema gives a grammar or a SchemaError, nothing else."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            text = schema_to_gbnf(schema, validator=True)
    except SchemaError:
        return
    Grammar.from_gbnf(text)


# --- numbers ----------------------------------------------------------------------------

SPECS = [
    {"minimum": 1.1},
    {"maximum": 3.0},
    {"exclusiveMinimum": 1.1},
    {"minimum": -2, "exclusiveMaximum": 2.55},
    {"minimum": 0.05, "maximum": 0.25},
    {"exclusiveMinimum": -2.5, "maximum": -0.5},
    {"multipleOf": 0.01},
    {"multipleOf": 1.5},
    {"type": "integer", "multipleOf": 3},
    {"type": "integer", "minimum": 1.5, "maximum": 7},
    {"type": "integer", "multipleOf": 2, "minimum": 0, "maximum": 20},
    {"exclusiveMinimum": 0},
    {"type": "integer", "minimum": -(10**25), "maximum": 10**30},
    {"type": "integer", "exclusiveMinimum": 99999999999999999999},
    {"type": "integer", "multipleOf": 7, "minimum": -100, "maximum": 12345},
    {"type": "number", "multipleOf": 2, "minimum": 0},
]


@functools.cache
def _cached_grammar(schema_json: str) -> Grammar:
    return grammar(json.loads(schema_json), validator=True)  # 1.0 is an integer too


def _spellings(x: Fraction) -> list[str]:
    out = [repr(float(x))] if Fraction(repr(float(x))) == x else []
    if x.denominator == 1:
        out.append(str(int(x)))
    return out


@pytest.mark.parametrize("kw", SPECS, ids=[json.dumps(s) for s in SPECS])
@settings(max_examples=120, deadline=None)
@given(
    num=st.integers(-(10**32), 10**32),
    den=st.sampled_from([1, 2, 4, 10, 20, 100, 1000, 10**18]),
    scale=st.sampled_from([1, 10**-30, 10**20]),
)
def test_number_grammars_are_exact(kw: dict[str, Any], num: int, den: int, scale: float) -> None:
    """Bounds (inclusive, exclusive, fractional, beyond 64 bits) and multipleOf accept a
    number exactly when ``jsonschema`` does, in every spelling json.dumps gives it
    (plain digits, ``1.5e+20``, ``1e-05``)."""
    g = _cached_grammar(json.dumps(kw))
    rest = {k: v for k, v in kw.items() if k != "multipleOf"}
    validator = jsonschema.Draft202012Validator(rest)
    x = Fraction(num, den) * Fraction(scale)
    for text in _spellings(x):
        if "e" in text and (kw.get("type") == "integer" or kw.get("multipleOf") not in (None, 0.01)):
            continue  # documented: integers and multiples of anything but 10**-k are written in plain digits
        value = json.loads(text)
        if isinstance(value, float) and Fraction(value) != x:
            continue
        # multipleOf exactly: jsonschema divides floats (10026683796472108 / 1.5 rounds to an integer)
        multiple = "multipleOf" not in kw or (Fraction(text) / Fraction(str(kw["multipleOf"]))).denominator == 1
        assert g.accepts(text) == (validator.is_valid(value) and multiple), (kw, text)


def test_number_spec_intersection_and_emptiness() -> None:
    a = NumberSpec(lo=Fraction(1), hi=Fraction(5), hi_strict=True)
    b = NumberSpec(lo=Fraction(5))
    assert a.intersect(b).empty()
    assert not a.intersect(NumberSpec(lo=Fraction(4))).empty()
    assert NumberSpec(integer=True, lo=Fraction(1, 3), hi=Fraction(2, 3)).empty()
    rs = RuleSet()
    assert "dec" in NumberSpec(multiple_of=(Fraction("0.25"),)).body(rs, lambda k, m: None)


# --- strings, patterns, formats ------------------------------------------------------------

PATTERNS = [
    "^a*$",
    "a+",
    "^[a-c]{2,3}$",
    "^(ab|cd)+x?$",
    "[0-9]",
    "^\\d{3}-\\w+$",
    "^.$",
    "^[^a]*$",
    "^é+",
    "x|^y$",
    # repetitions of what can match nothing (written over its non-empty part: a rule that
    # repeats without consuming a character is left-recursive, which llama.cpp refuses)
    "^(a*)*b$",
    "^(a?b?)+c?$",
    "^((a|)(b|))*$",
    "^(x*){2,3}-$",
    "^()*$",
    "^([a-z .-]*)*\\/?$",
    # alternatives searched anywhere, with counts: subsets past a match are one state
    "^x{2}|[ab]{3}|a{4}$",
    "b[a-c]{2}",
    # alternatives alike in their anchors share the "any string" of each open end
    "ab|c|d0",
    "^a|b|c$|d|^x$|y",
    # and what the "any string" beside them would read anyway is left out (a[b-d])
    "a[b-d]+|x0*|(1(2|3*))+",
    "^q|e+f*$|d{2,}",
]


@pytest.mark.parametrize("pattern", PATTERNS)
@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet="abcdxyé0123-_\n ", max_size=7))
def test_patterns_match_like_a_search(pattern: str, text: str) -> None:
    """A pattern is searched for, as ECMA-262 (and Python's re, on this subset) does: the
    automaton, the grammar and re.search agree."""
    # Python's $ also matches before a final newline, ECMA's only at the end: \Z
    py = pattern.replace("\\d", "[0-9]").replace("\\w", "[A-Za-z0-9_]").replace("$", "\\Z")
    expect = re.search(py, text) is not None
    assert from_regex(anchored(parse(pattern))).accepts(text) == expect
    g = grammar({"type": "string", "pattern": pattern})
    assert both(g, text) == expect


def test_searched_alternatives_share_their_any_string() -> None:
    """Alternatives searched for alike (no anchor, or the same one) are one alternation
    between one ``.*`` at each open end: ``.*(a|b).*``, not ``.*a.* | .*b.*``, whose
    grammar's states tell apart which alternatives have matched so far (a real schema's
    nine screen positions, Github_medium o33033, made 28,160 states reachable inside its
    string, and every walk from them descended each token with a letter of a match). Six
    alternatives met in every order of up to three: 50 states (449 before)."""
    any_ = Repeat(ANY, 0, None)
    assert anchored(parse("(ab|c)")) == Seq(
        (any_, Alt((Seq((CharSet(((97, 97),)), CharSet(((98, 98),)))), CharSet(((99, 99),)))), any_)
    )
    mixed = anchored(parse("^a|b|c$|d|^x$"))
    assert isinstance(mixed, Alt) and len(mixed.items) == 4
    assert sum(isinstance(it, Repeat) for b in mixed.items for it in (b.items if isinstance(b, Seq) else (b,))) == 4
    alts = ["alpha", "beta", "gamma", "delta", "kappa", "omega"]
    g = grammar({"type": "string", "pattern": "(" + "|".join(alts) + ")"})
    for r in range(1, 4):
        for sub in itertools.permutations(alts, r):
            assert g.accepts('"x' + "-".join(sub) + 'y"'), sub
    assert not g.accepts('"alphx"') and not g.accepts('""')
    assert g._engine.n_states <= 64, g._engine.n_states


def test_a_searched_count_stops_counting_at_its_match() -> None:
    """Once a searched alternative has matched, every rest is accepted: the subset
    construction makes one state of every subset that holds a match (its trailing
    ``.*``), not a state per count still in flight in the other alternatives. The
    hash-digest pattern of a real schema (Github_medium o51177, six digest lengths, only
    the first and last anchored) made 803 states and overflowed the 600-state budget;
    it is 73 (41 minimal)."""
    hexes = "|".join(f"[a-f0-9]{{{n}}}" for n in (40, 56, 64, 96))
    pattern = f"^[a-f0-9]{{32}}|{hexes}|[a-f0-9]{{128}}$"
    d = from_regex(anchored(parse(pattern)))
    assert len(d.edges) == 73 and len(d.minimized().edges) == 41
    for text in ["a" * 32, "-" + "a" * 31, "-" + "a" * 40 + "-", "-" + "a" * 39 + "-" * 3 + "b" * 39, "x" + "0" * 128]:
        assert d.accepts(text) == (re.search(pattern.replace("$", "\\Z"), text) is not None), text
    # the state that accepts everything loops on every code point
    s = 0
    for c in "a" * 32:
        s = next(t for ivs, t in d.edges[s] if any(lo <= ord(c) <= hi for lo, hi in ivs))
    assert s in d.accepting and d.edges[s] == [(((0, 0x10FFFF),), s)]


@pytest.mark.parametrize("pattern", PATTERNS)
@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.text(alphabet="abcdxyé0123-_\n ", max_size=7), min_size=1, max_size=20))
def test_minimized_automata_accept_the_same(pattern: str, texts: list[str]) -> None:
    """``DFA.minimized`` (what key and not-pattern rules are written from) accepts the same
    strings with at most as many states, and minimizing again changes nothing; its
    complement too. A search for ``\\w`` is two states: before a word character and after
    one (the subset construction makes four)."""
    d = from_regex(anchored(parse(pattern)))
    for a in (d, d.complement()):
        m = a.minimized()
        assert len(m.edges) <= len(a.edges)
        assert len(m.minimized().edges) == len(m.edges)
        for text in texts:
            assert m.accepts(text) == a.accepts(text), text
    w = from_regex(anchored(parse("\\w"))).minimized()
    assert len(w.edges) == 2 and w.accepts("--a") and not w.accepts("--")


def test_a_pattern_automaton_is_built_once_per_process() -> None:
    """The emitter's pattern automata come from one cache (a schema meets a pattern again
    in each product, class and key automaton): the same object each time, equal to a
    construction of its own, and a pattern that cannot be built raises each time."""
    d = pattern("^[a-c]{2,3}x|y$")
    assert pattern("^[a-c]{2,3}x|y$") is d
    fresh = from_regex(anchored(parse("^[a-c]{2,3}x|y$")))
    assert (d.edges, d.accepting) == (fresh.edges, fresh.accepting)
    for _ in range(2):
        with pytest.raises(RegexSyntaxError):
            pattern("a(")
        with pytest.raises(OverflowError):
            pattern("^a{700}$")


@settings(max_examples=60, deadline=None)
@given(
    pats=st.lists(st.sampled_from(["^a", "b$", "^[ab]+$", "^x$", "c", "^a.b$"]), min_size=0, max_size=4, unique=True),
    with_base=st.booleans(),
)
def test_key_classes_are_the_products_of_every_choice(pats: list[str], with_base: bool) -> None:
    """The emitter's key classes (``_classes``, depth first, an empty prefix ending its
    choices) are, in order, the non-empty products of matching or not each pattern, each
    product equal to the one met pattern by pattern."""
    import itertools

    from samplers.grammar.schema._emit import _and, _classes

    base = pattern("^[a-c]{0,3}$") if with_base else None
    dfas = [pattern(p) for p in pats]
    want = []
    for matched in itertools.product((True, False), repeat=len(dfas)):
        d = base
        for pd, m in zip(dfas, matched, strict=True):
            d = _and(d, pd if m else pd.complement())
        if d is None or not d.empty():
            want.append((matched, None if d is None else (d.edges, d.accepting)))
    got = [(m, None if d is None else (d.edges, d.accepting)) for m, d in _classes(base, dfas)]
    assert got == want


def test_string_keywords_together() -> None:
    """Two patterns, a pattern with lengths, and a not-pattern are enforced together (an
    automaton product), with escapes and characters outside the BMP counted as one."""
    g = grammar(
        {
            "type": "string",
            "pattern": "^[a-z💩]+$",
            "allOf": [{"pattern": "b"}],
            "maxLength": 3,
            "not": {"pattern": "^bb"},
        }
    )
    assert both(g, "abc") and both(g, "💩b") and both(g, "b")
    assert not both(g, "abcd") and not both(g, "bbc") and not both(g, "ac") and not both(g, "aB")
    g = grammar({"maxLength": 2})
    assert both(g, "💩💩") and both(g, 'a"') and not both(g, "💩💩💩") and both(g, 12345)


def test_escaped_spellings_share_their_backslash() -> None:
    """Every JSON spelling of a string character is accepted (raw, the short escapes, a
    ``\\u`` escape in either case, a supplementary character as a surrogate pair) and
    no other (a printable ASCII character escaped, a lone surrogate); written with the
    backslash once, so that a state inside a string holds one stack waiting for it, not
    one per spelling (20 of them before, 77 at each position of a ``maxLength`` 4096)."""
    good = ["é", "\\u00e9", "\\u00E9", "\\n", "\\t", '\\"', "\\\\", "\\/", "\\b", "\\f", "\\r", "\\ud83d\\ude00", "💩"]
    bad = ["\\u0061", "\\ud800", "\\udc00", "\\x41", "\\U0001F600", "\\a", "\\u00g0"]
    for schema in ({"type": "string"}, {"type": "string", "maxLength": 4096}, {"type": "string", "pattern": "^[^a]+$"}):
        g = grammar(schema)
        for s in good:
            assert g.accepts(f'"{s}"'), (schema, s)
        for s in bad:
            assert not g.accepts(f'"{s}"'), (schema, s)
        eng = g._engine_for("c")
        state = eng.start
        sizes = []
        for ch in '"abc':
            state = eng.step(state, eng.class_of(ord(ch)))
            sizes.append(eng.n_stacks(state))
        # the raw characters, the backslash, the closing quote (and a bounded string's
        # positions: a few ways to count 4096)
        assert max(sizes[1:]) <= (3 if "maxLength" not in schema else 12), (schema, sizes)


def test_runs_of_digits_are_rules_shared_by_the_grammars_numbers() -> None:
    """A number's runs of digits (a range's open ends capped at 16 digits, a mantissa's
    fraction) are references to one rule per run (``digits-1-16 ::= [0-9]{1,16}``), not
    ``[0-9]{1,16}`` written again at each place, which llama.cpp's parser expands into
    15 rules there; the numbers accepted are the same: up to 16 digits where the schema
    sets no bound, the ranges' ends exact (as before the runs were rules)."""
    schema = {
        "type": "object",
        "properties": {
            "price": {"type": "number", "minimum": 0.5, "maximum": 1e6},
            "stock": {"type": "integer", "minimum": 0},
            "rate": {"type": "number", "exclusiveMinimum": -1, "maximum": 5},
        },
        "required": ["price", "stock", "rate"],
    }
    text = schema_to_gbnf(schema)
    runs = re.findall(r'(?:\[0-9\]|"0")\{\d+,\d+\}', text)
    assert runs and len(runs) == len(set(runs)), runs  # each run written once
    for line in text.splitlines():
        if re.search(r'(?:\[0-9\]|"0")\{\d+,\d+\}', line):
            assert re.fullmatch(r'(digits|zeros)-\d+-\d+ ::= (\[0-9\]|"0")\{\d+,\d+\}', line), line
    g = grammar(schema)

    def doc(price: str, stock: str, rate: str) -> str:
        return f'{{"price": {price}, "stock": {stock}, "rate": {rate}}}'

    # (an integer with no maximum: a first digit, then at most 16 more)
    goods = [("0.5", "0", "-0.5"), ("1000000", "1" * 17, "5"), ("0.5" + "0" * 15, "12", "4.999"), ("1e6", "7", "0")]
    for good in goods:
        assert g.accepts(doc(*good)), good
    for bad in [("0.4", "0", "0"), ("1000001", "0", "0"), ("1", "1" * 18, "0"), ("1", "0", "-1"), ("1", "0", "5.5")]:
        assert not g.accepts(doc(*bad)), bad


FORMAT_CASES = {
    "date": (
        ["2020-02-29", "1999-12-31", "2000-02-29"],
        ["2021-02-29", "1900-02-29", "2020-13-01", "2020-1-01", "20200101"],
    ),
    "time": (
        ["12:34:56Z", "23:59:60Z", "01:02:03.123456+05:30", "00:00:00z"],
        ["24:00:00Z", "12:60:00Z", "12:00:00", "22:59:60Z"],
    ),
    "date-time": (
        ["2020-01-01T00:00:00Z", "2020-01-01t10:00:00.5-01:00"],
        ["2020-01-01 00:00:00Z", "2020-01-01T25:00:00Z"],
    ),
    "duration": (["P1D", "PT1H30M", "P1Y2M3DT4H5M6S", "P4W"], ["P", "PT", "P1H", "1D", "P1DT"]),
    "email": (["joe@example.com", "a.b+c@d-e.org", "x@[127.0.0.1]"], ["joe", "@example.com", "a..b@c.com", "joe@"]),
    "hostname": (["example.com", "a-b.c", "localhost"], ["-a.com", "a-.com", "a..b", "a" * 64]),
    "ipv4": (["127.0.0.1", "255.255.255.255", "0.0.0.0"], ["256.0.0.1", "01.2.3.4", "1.2.3", "1.2.3.4.5"]),
    "ipv6": (
        ["::1", "2001:db8::ff00:42:8329", "::ffff:127.0.0.1", "1:2:3:4:5:6:7:8"],
        ["1:2:3:4:5:6:7:8:9", ":::", "12345::", "1::2::3"],
    ),
    "uuid": (
        ["2eb8aa08-aa98-11ea-b4aa-73b441d16380"],
        ["2eb8aa08aa9811eab4aa73b441d16380", "2eb8aa08-aa98-11ea-b4aa-73b441d1638"],
    ),
    "uri": (
        ["http://example.com/a?b#c", "urn:isbn:0451450523", "mailto:x@y.z"],
        ["//example.com", "http://a b", "1http://x"],
    ),
    "uri-reference": (["http://example.com/a?b#c", "//example.com/x", "../a/b?c", "#frag", ""], ["a b", "a#b#c"]),
    "iri": (["http://例え.jp/ä?ö#ü", "urn:x:y", "http://x.y/%20"], ["例え.jp", "http://a b", "http://x/\u0000"]),
    "iri-reference": (["/ä/ö", "../例", "#ü", "http://x/ä"], ["a b", "ä#b#c"]),
    "json-pointer": (["", "/a", "/a~0b/c~1d", "/ä/", "//"], ["a", "/a~2", "/~"]),
    "relative-json-pointer": (["0", "1/a", "12#", "0/a~1b"], ["", "01/a", "-1", "1a", "#"]),
    "uri-template": (["http://x/{id}", "/a{?q,r}/b", "plain", "{x}{y}"], ["{x", "x}", "{a{b}}"]),
}


@pytest.mark.parametrize("fmt", sorted(FORMAT_CASES))
def test_formats_are_enforced(fmt: str) -> None:
    """Each asserted format accepts its valid spellings and refuses invalid ones
    (RFC 3339 leap years and leap seconds, ISO 8601 durations, RFC 4291 addresses, ...)."""
    g = grammar({"type": "string", "format": fmt})
    good, bad = FORMAT_CASES[fmt]
    for s in good:
        assert both(g, s), (fmt, s)
    for s in bad:
        assert not both(g, s), (fmt, s)
    # as annotations (a validator's default since 2019-09), anything goes
    assert both(grammar({"format": fmt}, formats="annotate"), bad[0])


def test_format_suite_coverage() -> None:
    """The suite's optional/format groups of draft 2020-12, with formats asserted, for the
    formats we enforce: at least 90% of the instances right."""
    from benchmarks import schema_suite as ss

    ours = {"date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uuid", "uri"}
    root = ss.suite_dir() / "tests" / "draft2020-12" / "optional" / "format"
    right = total = 0
    for fmt in sorted(ours):
        for group in json.loads((root / f"{fmt}.json").read_text(encoding="utf-8")):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                g = grammar(group["schema"], validator=True, formats="assert")
            for t in group["tests"]:
                total += 1
                right += both(g, t["data"]) == t["valid"]
    assert right >= 0.9 * total, (right, total)


# --- objects and arrays --------------------------------------------------------------------


def test_property_order_and_undeclared_keys() -> None:
    """Generation defaults: declared keys in the order of properties (optional ones may be
    left out), none invented; ``"required-first"``: llama.cpp's order (required, then
    optional); validator semantics: any order, each key once, undeclared keys as JSON
    Schema allows them."""
    schema = {"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["b"]}
    gen = grammar(schema)
    assert both(gen, {"a": 2, "b": 1}) and both(gen, {"b": 1})
    assert not both(gen, {"b": 1, "a": 2}) and not both(gen, {"b": 1, "z": 0}) and not both(gen, {"a": 1})
    first = grammar(schema, property_order="required-first")
    assert both(first, {"b": 1, "a": 2}) and both(first, {"b": 1})
    assert not both(first, {"a": 2, "b": 1}) and not both(first, {"a": 1})
    val = grammar(schema, validator=True)
    assert both(val, {"a": 2, "b": 1}) and both(val, {"b": 1, "a": 2}) and both(val, {"b": 1, "z": [0]})
    assert not both(val, {"a": "x", "b": 1}) and not both(val, {"a": 1})
    assert not val.accepts('{"b": 1, "b": 2}')
    anyorder = grammar(schema, property_order="any")
    assert both(anyorder, {"a": 2, "b": 1}) and not both(anyorder, {"b": 1, "z": 0})
    extra = grammar(schema, additional_properties="schema")
    assert both(extra, {"b": 1, "z": 0}) and both(extra, {"a": 2, "b": 1}) and not both(extra, {"b": 1, "a": 2})
    # required keys that properties does not list come after the listed ones
    g = grammar({"properties": {"a": {}, "b": {}}, "required": ["z", "a"], "additionalProperties": True})
    assert both(g, {"a": 1, "b": 2, "z": 3}) and both(g, {"a": 1, "z": 3}) and not both(g, {"z": 3, "a": 1})
    with pytest.raises(ValueError, match="required-first"):
        schema_to_gbnf(schema, property_order="llama")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("abcdefg"), st.booleans(), st.booleans()), max_size=7),
    st.sampled_from([None, True, False, {"type": "integer"}]),
    st.sampled_from(["schema", "required-first"]),
    st.sampled_from(["declared", "schema"]),
)
def test_schema_order_rules_equal_the_automaton(
    keys: list[tuple[str, bool, bool]], additional: Any, order: str, extra: str
) -> None:
    """An object in schema order that counts no keys is written at once
    (``Emitter._schema_order_rules``): the same text, names and alternatives as the
    general automaton (``_schema_order_automaton``), nested objects included."""
    from samplers.grammar.schema._emit import Emitter

    props: dict[str, Any] = {}
    required = []
    for k, req, nested in keys:
        props[k] = {"type": "object", "properties": {"x": {}, "y": {}}, "required": ["y"]} if nested else {}
        if req:
            required.append(k)
    schema: dict[str, Any] = {"type": "object", "properties": props, "required": required}
    if additional is not None:
        schema["additionalProperties"] = additional
    options = {"property_order": order, "additional_properties": extra}
    fast = schema_to_gbnf(schema, **options)
    general = Emitter._schema_order_rules
    try:
        Emitter._schema_order_rules = lambda self, a, keys, pairs, free: self._schema_order_automaton(  # type: ignore[method-assign]
            a, keys, pairs, free, False, 0
        )
        assert schema_to_gbnf(schema, **options) == fast
    finally:
        Emitter._schema_order_rules = general  # type: ignore[method-assign]


def test_objects_with_patterns_names_and_dependencies() -> None:
    g = grammar(
        {
            "properties": {"id": {"type": "integer"}},
            "patternProperties": {"^x-": {"type": "string"}},
            "additionalProperties": {"type": "boolean"},
            "propertyNames": {"maxLength": 4},
            "dependentRequired": {"id": ["x-a"]},
            "minProperties": 1,
        },
        validator=True,
    )
    assert both(g, {"id": 1, "x-a": "s"}) and both(g, {"zz": True}) and both(g, {"x-b": "s", "q": False})
    assert not both(g, {"id": 1}) and not both(g, {"x-a": 1}) and not both(g, {"zz": 1})
    assert not both(g, {"longer": True}) and not both(g, {})


def test_arrays_with_prefix_items_and_contains() -> None:
    g = grammar(
        {
            "prefixItems": [{"type": "string"}],
            "items": {"type": "integer"},
            "contains": {"const": 7},
            "minContains": 2,
            "maxContains": 3,
        },
        validator=True,
    )
    assert both(g, ["a", 7, 7]) and both(g, ["a", 7, 1, 7, 7])
    assert (
        not both(g, ["a", 7]) and not both(g, ["a", 7, 7, 7, 7]) and not both(g, [1, 7, 7]) and not both(g, ["a", "b"])
    )


def test_enum_and_const_compare_values() -> None:
    """const/enum compare JSON values: 1 equals 1.0, object keys in any order."""
    g = grammar({"enum": [1, {"a": [1, "x"], "b": None}]}, validator=True)
    assert both(g, 1.0) and both(g, {"b": None, "a": [1, "x"]})
    assert not both(g, 2) and not both(g, {"a": [1, "x"]}) and not both(g, True)
    # a JSON number is its decimal value, not the nearest double (1.1 <= 1.1; 1.1 is excluded)
    assert both(grammar({"enum": [1.1, 2], "maximum": 1.1}, validator=True), 1.1)
    g = grammar({"type": "number", "not": {"const": 1.1}}, validator=True)
    assert not both(g, 1.1) and both(g, 1.2)


def test_references() -> None:
    """$ref through $id bases, $anchor, escaped pointers, recursion and caller-supplied
    documents; never the network."""
    schema = {
        "$id": "https://example.com/root.json",
        "$defs": {
            "a~b/c%": {"type": "integer"},
            "node": {
                "$anchor": "node",
                "type": "object",
                "properties": {"next": {"$ref": "#node"}, "v": {"$ref": "#/$defs/a~0b~1c%25"}},
            },
            "remote": {"$ref": "other.json"},
        },
        "properties": {"n": {"$ref": "#node"}, "r": {"$ref": "#/$defs/remote"}},
    }
    g = grammar(schema, validator=True, resources={"https://example.com/other.json": {"type": "string"}})
    assert both(g, {"n": {"v": 1, "next": {"v": 2}}, "r": "s"})
    assert not both(g, {"n": {"next": {"v": "x"}}}) and not both(g, {"r": 1})
    with pytest.raises(SchemaError, match="cannot resolve"):
        schema_to_gbnf(schema)
    seen = []
    g = grammar(schema, retrieve=lambda uri: seen.append(uri) or {"type": "string"})
    assert seen == ["https://example.com/other.json"]


def _pointers(doc: Any, path: str = "#") -> Iterator[str]:
    """The JSON pointer of every value in ``doc``, spelt as a ``$ref`` (keys escaped,
    some percent-encoded, array indexes with and without leading zeros), and some that
    point nowhere."""
    yield path + "/nowhere"
    if isinstance(doc, dict):
        for k, v in doc.items():
            step = k.replace("~", "~0").replace("/", "~1")
            p = f"{path}/{step}"
            yield p
            if "%" in step or " " in step:
                yield f"{path}/{urllib.parse.quote(step)}"
            yield from _pointers(v, p)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield f"{path}/{i}"
            yield f"{path}/0{i}"
            yield from _pointers(v, f"{path}/{i}")


@pytest.mark.parametrize("draft", ["4", "2020-12"])
def test_local_pointers_resolve_as_referencing_does(draft: str) -> None:
    """A ``$ref`` that is a JSON pointer into the root document is looked up without
    ``referencing`` (``Lowering._local_pointer``) only where that gives what
    ``referencing`` gives: the same value from the same scope; anything else (an
    identifier on the way, a pointer to nowhere, a leading zero) goes to ``referencing``."""
    from referencing import Registry, Resource
    from referencing.jsonschema import specification_with

    from samplers.grammar.schema import DRAFT_URIS
    from samplers.grammar.schema._lower import _MISSING, Lowering

    key = "id" if draft == "4" else "$id"
    doc = {
        "definitions": {
            "a~b/c%d": {"type": "integer"},
            "x~1y": {"type": "boolean"},
            "x/y": {"type": "number"},
            "with space": {"allOf": [{"type": "string"}, {"items": [{"const": 1}, True]}]},
            "scoped": {key: "http://example.com/other.json", "properties": {"x": {"type": "null"}}},
            "é": {"enum": [{key: "not an identifier here"}]},
            "nested": {"definitions": {"deep": {"minimum": 1}}},
        },
        "properties": {"p": {"$ref": "#/definitions/nested/definitions/deep"}},
    }
    spec = specification_with(DRAFT_URIS[draft])
    root = Resource(contents=doc, specification=spec)  # type: ignore[call-arg]
    resolver = Registry().with_resource("", root).resolver(base_uri="")
    low = Lowering(lambda *_: None, False)
    low.specification = spec
    low.root, low.root_doc, low.root_base = resolver, doc, ""
    local = 0
    for ref in _pointers(doc):
        found = low._local_pointer(ref)
        if found is _MISSING:
            continue
        local += 1
        try:
            resolved = resolver.lookup(ref)
        except AttributeError:  # referencing's own error past 2020-12's items given a list
            assert draft == "2020-12" and "/items" in ref
            continue
        assert resolved.contents is found, ref
        assert resolved.resolver._base_uri == "", ref
    assert local > 20
    assert low._local_pointer("#/definitions/scoped/properties/x") is _MISSING
    assert low._local_pointer("#/definitions/with space/allOf/01") is _MISSING
    assert low._local_pointer("#/definitions/a~0b~1c%25d") is doc["definitions"]["a~b/c%d"]  # type: ignore[index]


_KEYS = ["a", "b", "c", "d"]


@st.composite
def _objects(draw: st.DrawFn) -> Any:
    from samplers.grammar.schema._lower import FALSE, TRUE, Obj, const_node

    values = st.sampled_from([TRUE, FALSE, const_node(1), const_node("x")])
    props = tuple((k, draw(values)) for k in draw(st.lists(st.sampled_from(_KEYS), max_size=3)))
    additional = tuple(
        (
            frozenset(draw(st.lists(st.sampled_from(_KEYS), max_size=3))),
            draw(st.sampled_from([(), ("^a",)])),
            draw(values),
        )
        for _ in range(draw(st.integers(0, 2)))
    )
    patterns = (("^b", draw(values)),) if draw(st.booleans()) else ()
    return Obj(props=props, additional=additional, patterns=patterns)


@settings(max_examples=300, deadline=None)
@given(objs=st.lists(_objects(), min_size=1, max_size=6))
def test_a_hulls_values_ask_only_the_objects_that_can_answer(objs: list[Any]) -> None:
    """``_values_in_any`` (a hull's property values) skips the objects closed by an
    ``additionalProperties: false`` that neither declares nor exempts a key: each value is
    the node asking every object gives (``_value_in_any``)."""
    from samplers.grammar.schema._lower import _value_in_any, _values_in_any

    keys = [*dict.fromkeys(k for a in objs for k, _ in a.props), "e"]
    assert _values_in_any(objs, keys) == tuple((k, _value_in_any(objs, k)) for k in keys)


def test_copies_of_a_subschema_are_written_once() -> None:
    """Copies of one subschema that differ only in annotations (a definition written out
    inline at each use, as Kubernetes' schemas are) give the rules one shared subschema
    gives; whatever a validator reads still tells subschemas apart: property names (even
    ``description``), const values, and the types of equal numbers."""
    point = {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["x"],
    }
    shared = {"type": "object", "properties": {"a": point, "b": point}}
    first, second = copy.deepcopy(point), copy.deepcopy(point)
    first.update(description="first", title="A", **{"x-kind": 1, "$comment": "c"})
    second.update(default={"x": 0}, examples=[{"x": 1}], deprecated=True, readOnly=True)
    second["properties"]["tags"]["items"]["description"] = "a tag"
    copies = {"type": "object", "properties": {"a": first, "b": second}}
    assert schema_to_gbnf(copies) == schema_to_gbnf(shared)
    assert schema_to_gbnf(copies, validator=True) == schema_to_gbnf(shared, validator=True)
    for p, q, vp, vq in [
        ({"properties": {"description": {"const": 1}}}, {"properties": {"description": {"const": 2}}}, 1, 2),
        ({"properties": {"x-a": {"const": 1}}}, {"properties": {"x-a": {"const": 2}}}, 1, 2),
    ]:
        g = grammar({"type": "object", "properties": {"p": p, "q": q}, "required": ["p", "q"]}, validator=True)
        key = next(iter(p["properties"]))
        assert both(g, {"p": {key: vp}, "q": {key: vq}})
        assert not both(g, {"p": {key: vq}, "q": {key: vp}})
    for vp, vq in [({"description": 1}, {"description": 2}), (1, True), (0, False), (1, 1.5), ("x-1", "x-2")]:
        g = grammar({"properties": {"p": {"const": vp}, "q": {"const": vq}}, "required": ["p", "q"]}, validator=True)
        assert both(g, {"p": vp, "q": vq})
        assert not both(g, {"p": vq, "q": vp})


def test_warnings_and_strict_mode() -> None:
    """What a grammar cannot enforce is named with its JSON pointer; strict=True refuses it."""
    with pytest.warns(SchemaWarning, match=r"#/properties/tags: uniqueItems"):
        schema_to_gbnf({"properties": {"tags": {"type": "array", "uniqueItems": True}}})
    with pytest.raises(UnsupportedSchemaError) as info:
        schema_to_gbnf({"properties": {"tags": {"type": "array", "uniqueItems": True}}}, strict=True)
    assert info.value.keyword == "uniqueItems" and info.value.pointer == "#/properties/tags"
    with pytest.warns(SchemaWarning, match="unknown format"):
        schema_to_gbnf({"type": "string", "format": "color"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        schema_to_gbnf({"type": "string", "format": "color"}, formats="annotate")
        schema_to_gbnf({"type": "array", "items": {"type": "integer"}, "maxItems": 3})


def test_compat_mode_is_llama_cpp() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 3}}}
    assert json_schema_to_gbnf(schema, compat="llama.cpp") == llama_cpp_json_schema_to_gbnf(schema)
    assert json_schema_to_gbnf(schema) == schema_to_gbnf(schema)
    with pytest.raises(ValueError, match="compat"):
        json_schema_to_gbnf(schema, compat="xgrammar")


def test_unsatisfiable_schema_accepts_nothing() -> None:
    g = grammar({"allOf": [{"type": "string"}, {"type": "integer"}]})
    assert not both(g, "a") and not both(g, 1) and not g.accepts("")


def test_pydantic_models() -> None:
    """A pydantic model class or TypeAdapter is a schema (pydantic is imported only by the
    caller)."""
    pydantic = pytest.importorskip("pydantic")

    class Pet(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=8)
        kind: str = pydantic.Field(pattern="^(cat|dog)$")
        age: int | None = None

    g = Grammar.from_json_schema(Pet)
    doc = Pet(name="Rex", kind="dog", age=3).model_dump_json()
    assert g.accepts(doc)
    assert not g.accepts('{"name": "Rex", "kind": "cow"}')
    ta = pydantic.TypeAdapter(list[Pet])
    assert Grammar.from_json_schema(ta).accepts(f"[{doc}]")
    with pytest.raises(TypeError, match="pydantic model"):
        schema_to_gbnf(object())


def test_generate_with_a_pydantic_model(tiny_model: Any) -> None:
    """generate(..., json_schema=Model) writes text Model.model_validate_json accepts."""
    pydantic = pytest.importorskip("pydantic")
    from samplers import Dist, SamplerChain, TopK
    from samplers.branch import BranchStore
    from samplers.search import complete

    class Answer(pydantic.BaseModel):
        ok: bool
        level: int = pydantic.Field(ge=0, le=9)

    with tiny_model.context(n_ctx=512, n_threads=2) as ctx:
        store = BranchStore(ctx)
        r = complete(
            store, "answer:", max_tokens=200, sampler=SamplerChain([TopK(5), Dist(seed=3)]), json_schema=Answer
        )
    assert r.stop_reason in ("eog", "grammar"), r
    Answer.model_validate_json(r.text)
    with tiny_model.context(n_ctx=512, n_threads=2) as ctx:  # a branch's grammar= takes a model too
        store = BranchStore(ctx)
        b = store.create(tiny_model.tokenize("answer:"), sampler=SamplerChain([TopK(5), Dist(seed=4)]), grammar=Answer)
        for _ in range(200):
            t = b.sample()
            if tiny_model.vocab.is_eog(t):
                break
            store.step({b: t})
        Answer.model_validate_json(tiny_model.vocab.detokenize(b.tokens[len(tiny_model.tokenize("answer:")) :]))


def test_unique_items_over_a_few_values() -> None:
    """uniqueItems is enforced where the items are a few values (enums, booleans, null):
    an automaton over the values used; elsewhere it is a warning."""
    g = grammar({"type": "array", "items": {"enum": ["a", "b", 1]}, "uniqueItems": True, "minItems": 1}, validator=True)
    assert both(g, ["a"]) and both(g, [1.0, "b", "a"]) and both(g, ["b", "a"])
    assert not both(g, ["a", "a"]) and not both(g, [1, 1.0]) and not both(g, []) and not both(g, ["c"])
    g = grammar({"prefixItems": [{"type": "boolean"}, {"type": "boolean"}], "items": False, "uniqueItems": True})
    assert both(g, [False, True]) and both(g, [True]) and not both(g, [True, True])


_LEAVES = [
    {"type": "integer"},
    {"type": "string"},
    {"type": "number", "minimum": 0.5},
    {"const": 1},
    {"enum": ["a", 1, None]},
    {"type": "array", "items": {"type": "integer"}},
    {"type": "object", "required": ["a"]},
    {"minLength": 2},
    {"pattern": "^a"},
    {"maxItems": 1},
    {"contains": {"type": "string"}},
    {"properties": {"a": {"type": "boolean"}}},
    {"additionalProperties": False},
    {"not": {"type": "null"}},
    {"multipleOf": 2},
    {"exclusiveMaximum": 3},
    {"minProperties": 1},
    True,
    False,
    {"prefixItems": [{"type": "integer"}]},
    {"propertyNames": {"maxLength": 1}},
    {"patternProperties": {"^b": {"type": "integer"}}},
    {"dependentRequired": {"a": ["b"]}},
    {"uniqueItems": True, "items": {"type": "boolean"}},
]


def combined(leaves: list[Any]) -> st.SearchStrategy[Any]:
    """Schemas of ``leaves`` nested in allOf/anyOf/oneOf/not/if, items and properties."""
    return st.recursive(
        st.sampled_from(leaves),
        lambda inner: st.one_of(
            st.builds(lambda xs: {"allOf": xs}, st.lists(inner, min_size=1, max_size=3)),
            st.builds(lambda xs: {"anyOf": xs}, st.lists(inner, min_size=1, max_size=3)),
            st.builds(lambda xs: {"oneOf": xs}, st.lists(inner, min_size=1, max_size=3)),
            st.builds(lambda x: {"not": x}, inner),
            st.builds(lambda a, b, c: {"if": a, "then": b, "else": c}, inner, inner, inner),
            st.builds(lambda x: {"type": "array", "items": x}, inner),
            st.builds(lambda x: {"properties": {"a": x, "b": x}}, inner),
        ),
        max_leaves=6,
    )


combined_schemas = combined(_LEAVES)
small_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from([0.5, 1.5, 2.0, -3.25, "", "a", "ab", "b", "abc"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "b", "c", "bb"]), inner, max_size=3)
    ),
    max_leaves=6,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(combined_schemas, st.lists(small_values, min_size=1, max_size=8))
def test_combined_keywords_agree_with_a_validator(schema: Any, values: list[Any]) -> None:
    """Keywords nested in allOf/anyOf/oneOf/not/if and in items and properties (complements,
    intersections, dependencies, uniqueItems over booleans): wherever no warning was raised
    the grammar accepts exactly what ``jsonschema`` accepts. (A 1500-example run of this
    property during development found no difference.)"""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = grammar(schema, validator=True)
    assume(not [w for w in caught if issubclass(w.category, SchemaWarning)])
    validator = jsonschema.Draft202012Validator(schema)
    for value in values:
        assert both(g, value) == validator.is_valid(value), (schema, value)


def test_a_lowering_reads_its_draft_from_its_specification() -> None:
    """The draft a Lowering writes for: its document's specification's, 2020-12 before it
    has one (the converter gives it one first; a Lowering made alone must not fail)."""
    from referencing.jsonschema import specification_with

    from samplers.grammar.schema._lower import Lowering

    low = Lowering(lambda *_: None, False)
    assert low.draft() == "draft2020-12"
    low.specification = specification_with("http://json-schema.org/draft-04/schema#")
    assert low.draft() == "draft4"
