"""GBNF, llama.cpp's grammar language: the one front end of the project.

Everything that reads GBNF text goes through this module: :mod:`samplers.grammar` builds
its matcher on :func:`parse_gbnf` and :func:`check_grammar`, and
:meth:`llama_cffi.sampling.LlamaSampler.grammar` asks :func:`native_grammar_hazard`
before llama.cpp sees a text. It lives in ``llama_cffi`` (the lower layer) because both
need it and ``llama_cffi`` never imports ``samplers``.

**The data model.** A parsed grammar is exactly what llama.cpp's ``llama_grammar_parser``
produces (``src/llama-grammar.h``): ``rules[rule_id]`` is a flat tuple of ``(type,
value)`` elements, alternatives separated by ``ALT`` and the rule closed by ``END``; a
character class is a ``CHAR``/``CHAR_NOT``/``CHAR_ANY`` element followed by
``CHAR_RNG_UPPER`` and ``CHAR_ALT`` modifiers. Keeping llama.cpp's layout (and its rule
ids, generated names included) makes the Python matcher's semantics comparable element
for element. Token references: ``<[123]>`` is ``(TOKEN, 123)``; a named reference
``<|im_end|>`` needs a vocabulary, which a parsed grammar does not have: its value is
``-(k + 1)`` where ``token_names[k]`` is the text between (and including) the angle
brackets, resolved to an id by :func:`resolve_tokens` when the grammar is compiled for a
vocabulary.

**The parser.** :func:`parse_gbnf` is a Python port of ``llama_grammar_parser::parse``
(``src/llama-grammar.cpp``): the same rules element for element, the same rule ids and
the same generated symbol names (``root_1``, ... numbered in llama.cpp's order), and
exactly the texts llama.cpp accepts. :func:`check_grammar` adds what
``llama_grammar_init_impl`` checks (a root symbol, defined rules, no left recursion).
Every JSON schema request goes through both, so they are built for speed: the port
(``_Parser``, a step per character) is the reference, and :func:`parse_gbnf` first tries
``_FastParser``: the C parser of the extension (``llama_cffi_gbnf_parse``, a step per
byte, its arrays checked at every write), then where that is unsure its Python path,
which reads the schema converter's kind of lines in bulk with regular expressions, other
lines token by token, and replays lines it has met before; whatever neither is sure of
(any error, token references, ...) goes to the port, so results and errors are the
port's. The checks work on the whole grammar at once where they can.
Where it deliberately differs from llama.cpp:

* The input is a ``str``: each code point is one character. llama.cpp decodes the UTF-8
  bytes of its C string (``decode_utf8``, which assumes valid UTF-8 and may read past a
  truncated sequence); for well-formed UTF-8 both see the same code points. Lone
  surrogates, which UTF-8 cannot carry, are taken as code points.
* A NUL character is refused (llama.cpp's C string would silently end there).
* ``{m,n}`` with ``n < m`` is refused; llama.cpp computes ``n - m`` unsigned and tries to
  generate about 2**64 rules, failing only once memory runs out.
* Nesting is parsed without recursion, so deep parentheses do not hit Python's limit.
* :func:`check_grammar` also refuses "hidden" left recursion that llama.cpp's check
  misses (a cycle through rules that derive the empty string only indirectly, with
  something left to match after the recursive reference): llama.cpp accepts such a
  grammar and then grows its parse stacks without bound.
* Named tokens (``<|im_end|>``) are not looked up (there is no vocabulary); they are
  kept by name.

**What would crash llama.cpp.** Some texts llama.cpp's parser accepts take the process
down later; :func:`native_grammar_hazard` finds them from the same parse:

* ``{m,n}`` with ``n < m`` (found by its spelling anywhere outside literals: llama.cpp
  builds its rules while parsing, before it reaches a later error);
* left recursion through rules that derive the empty string only indirectly (above);
* depth: llama.cpp's parser recurses once per nested group, and its left-recursion check
  and stack advance recurse once per rule reference before the first character. On this
  build an 8 MiB stack overflows (SIGSEGV) at about 17,000 nested groups and about
  70,000 chained leading references (measured, not derived). Both are limited to
  :data:`MAX_DEPTH`, which keeps the parser's use of the stack near 1 MiB.

Token references are a different hazard, met at accept time: :func:`has_token_refs`
tells :class:`~llama_cffi.sampling.LlamaSampler` to guard them.

The printer (GBNF text from a parsed grammar) is :func:`samplers.grammar.format_gbnf`.
"""

from __future__ import annotations

import operator
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from functools import lru_cache
from itertools import accumulate, chain
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NoReturn

from ._args import expect, expect_callable, expect_mapping, expect_str
from .errors import GrammarError, GrammarSyntaxError

__all__ = [
    "MAX_DEPTH",
    "MAX_REPETITION_THRESHOLD",
    "WORD_CHARS",
    "Element",
    "GrammarError",
    "GrammarSyntaxError",
    "GreType",
    "LeftRecursionError",
    "ParsedGrammar",
    "Rule",
    "alternatives",
    "check_grammar",
    "has_token_refs",
    "inverted_repetition",
    "native_grammar_hazard",
    "parse_gbnf",
    "resolve_tokens",
]

# ---------------------------------------------------------------------------- data model

#: llama.cpp's repetition limit (``MAX_REPETITION_THRESHOLD``): ``{m,n}`` counts above it
#: are refused (``m``) or treated as unbounded (``n``).
MAX_REPETITION_THRESHOLD = 2000


class GreType(IntEnum):
    """``enum llama_gretype`` (same values)."""

    END = 0
    ALT = 1
    RULE_REF = 2
    CHAR = 3
    CHAR_NOT = 4
    CHAR_RNG_UPPER = 5
    CHAR_ALT = 6
    CHAR_ANY = 7
    TOKEN = 8
    TOKEN_NOT = 9


#: One ``llama_grammar_element``: ``(GreType, value)``; value is a code point, a rule id
#: or a token id (negative: an unresolved named token, see the module docstring).
Element = tuple[int, int]
Rule = tuple[Element, ...]


@dataclass(frozen=True)
class ParsedGrammar:
    """A grammar as llama.cpp's parser leaves it.

    ``rules[i]`` is rule ``i`` (ending with ``(END, 0)``); ``symbol_ids`` maps every rule
    name to its id, generated names (``"value_7"``) included, exactly as llama.cpp
    numbers them; ``token_names`` lists named token references (see the module
    docstring). Immutable; shared freely between compiled grammars and matchers.
    """

    rules: tuple[Rule, ...]
    symbol_ids: Mapping[str, int]
    token_names: tuple[str, ...] = ()
    #: ``rule id -> name`` (derived).
    names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    #: set by the fast parsers only (not by the constructor, nor by ``dataclasses.replace``):
    #: the grammar is as they make it (no token elements), so :func:`check_grammar` need
    #: not check it element by element; the C parser adds its elements and rules as
    #: :class:`_CRules` (made into tuples on first use: ``rules`` is then read from it),
    #: their types as bytes, their types and values as int64 arrays (rule by rule),
    #: whether its C check found no rule that reaches itself before a character, each
    #: rule's first position among the elements, and each rule's length (an int array)
    _parsed: bool | tuple[_CRules, bytes, Any, Any, bool, list[int], Any] = field(
        default=False, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        expect("rules", self.rules, tuple, "a tuple of rules (use parse_gbnf)")
        expect_mapping("symbol_ids", self.symbol_ids, "a mapping of rule names to ids")
        expect("token_names", self.token_names, tuple, "a tuple of token names (str)")
        names = [""] * len(self.rules)
        for name, i in self.symbol_ids.items():
            if 0 <= i < len(names):
                names[i] = name
        object.__setattr__(self, "names", tuple(names))

    def rule_id(self, name: str) -> int:
        """The id of rule ``name`` (KeyError if the grammar has none)."""
        return self.symbol_ids[expect_str("name", name)]

    if not TYPE_CHECKING:  # (hidden from type checkers: every other attribute stays checked)

        def __getattr__(self, name: str) -> Any:
            # the C parser's grammar makes its rules on first use (_CRules); read once, kept
            if name == "rules":
                parsed = self.__dict__.get("_parsed")
                if isinstance(parsed, tuple):
                    rules = parsed[0].rules()
                    object.__setattr__(self, "rules", rules)
                    return rules
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class _CRules:
    """The C parser's elements and rules (:func:`_c_parse`), made into Python tuples when
    first asked for: from the distinct elements (type, value pairs), each element's index
    among them, and each rule's first and past-last positions. The engine reads the
    parser's arrays instead, so a grammar that is only compiled never makes them (a
    schema's grammar has ~10,000 elements)."""

    __slots__ = ("_dist", "_ends", "_flat", "_idx", "_rules", "_starts")

    def __init__(self, dist: Any, idx: Any, starts: list[int], ends: list[int]) -> None:
        self._dist, self._idx, self._starts, self._ends = dist, idx, starts, ends
        self._flat: list[Element] | None = None
        self._rules: tuple[Rule, ...] | None = None

    def flat(self) -> list[Element]:
        """Every element, rule after rule."""
        if self._flat is None:
            distinct = self._dist.view(_PAIR).tolist()  # (type, value) tuples, made by numpy, one each
            self._flat = list(map(distinct.__getitem__, self._idx.tolist()))
        return self._flat

    def rules(self) -> tuple[Rule, ...]:
        """The rules, each a tuple of its elements."""
        if self._rules is None:
            flat = self.flat()
            self._rules = tuple([tuple(flat[o:e]) for o, e in zip(self._starts, self._ends, strict=True)])
        return self._rules


def _n_rules(g: ParsedGrammar) -> int:
    """How many rules ``g`` has (from the C parser's arrays, where it made ``g``)."""
    parsed = g._parsed
    return len(parsed[5]) if isinstance(parsed, tuple) else len(g.rules)


def _parsed(g: ParsedGrammar, how: bool | tuple[_CRules, bytes, Any, Any, bool, list[int], Any]) -> ParsedGrammar:
    """``g`` marked as a parser made it (:attr:`ParsedGrammar._parsed`)."""
    object.__setattr__(g, "_parsed", how)
    return g


def _element_arrays(g: ParsedGrammar) -> tuple[Any, Any]:
    """The types and values of the elements of ``g``, rule by rule, as int64 arrays (the
    C parser's when it made ``g``)."""
    import numpy as np

    parsed = g._parsed
    if isinstance(parsed, tuple):
        return parsed[2], parsed[3]
    flat = list(chain.from_iterable(g.rules))
    n = len(flat)
    return np.fromiter(map(_TYPE, flat), dtype=np.int64, count=n), np.fromiter(
        map(_VALUE, flat), dtype=np.int64, count=n
    )


def resolve_tokens(grammar: ParsedGrammar, token_id: Callable[[str], int]) -> ParsedGrammar:
    """``grammar`` with each named token reference replaced by ``token_id(name)`` (which
    raises if ``name`` is not exactly one token of the vocabulary)."""
    expect("grammar", grammar, ParsedGrammar, "a ParsedGrammar")
    expect_callable("token_id", token_id)
    if not grammar.token_names:
        return grammar
    ids = [token_id(name) for name in grammar.token_names]
    rules = tuple(
        tuple((t, ids[-v - 1]) if t in (GreType.TOKEN, GreType.TOKEN_NOT) and v < 0 else (t, v) for t, v in rule)
        for rule in grammar.rules
    )
    return ParsedGrammar(rules, grammar.symbol_ids, ())


_END = int(GreType.END)
_ALT = int(GreType.ALT)
_RULE_REF = int(GreType.RULE_REF)
_CHAR = int(GreType.CHAR)
_CHAR_NOT = int(GreType.CHAR_NOT)
_CHAR_RNG_UPPER = int(GreType.CHAR_RNG_UPPER)
_CHAR_ALT = int(GreType.CHAR_ALT)
_CHAR_ANY = int(GreType.CHAR_ANY)
_TOKEN = int(GreType.TOKEN)
_TOKEN_NOT = int(GreType.TOKEN_NOT)

_CHAR_ELEMENTS = frozenset((_CHAR, _CHAR_NOT, _CHAR_RNG_UPPER, _CHAR_ALT, _CHAR_ANY))
_ALL_TYPES = frozenset(int(t) for t in GreType)
_UINT32_MAX = 2**32 - 1
_UINT64_MAX = 2**64 - 1

#: llama.cpp's is_word_char (ASCII only; "_" is not a word char, which is why generated
#: names such as "root_1" can never clash with a user's rule name).
WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-0123456789")
_DIGITS = frozenset("0123456789")
_HEX_VALUES = {c: int(c, 16) for c in "0123456789abcdefABCDEF"}
_HEX_ESCAPE_SIZES = {"x": 2, "u": 4, "U": 8}
_SIMPLE_ESCAPES = {"t": 9, "r": 13, "n": 10, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45}
# "*", "+" and "?" as (min, max); max None is unbounded
_OPERATORS: dict[str, tuple[int, int | None]] = {"*": (0, None), "+": (1, None), "?": (0, 1)}
_ESCAPE_HINT = 'an escape character (x, u, U, t, r, n, \\, ", [, ] or -)'


MAX_DEPTH = 2048
"""The most nested groups, and the longest chain of rule references before a character,
that :func:`native_grammar_hazard` lets through to llama.cpp (whose parser uses about
480 bytes of stack per nested group on x86-64)."""


class LeftRecursionError(GrammarError):
    """A left-recursive rule (``rule`` names it). ``hidden`` is true for left recursion
    that llama.cpp's own check misses (see the module docstring)."""

    def __init__(self, message: str, rule: str, hidden: bool) -> None:
        super().__init__(message)
        self.rule = rule
        self.hidden = hidden


# ---------------------------------------------------------------------------- parsing


@dataclass
class _Frame:
    """One ``parse_alternates`` call in progress: the rule being built and the locals of
    the current ``parse_sequence`` (``last_sym_start``, ``n_prev_rules``)."""

    rule_id: int
    nested: bool
    rule: list[Element] = field(default_factory=list)
    last_sym_start: int = 0
    n_prev_rules: int = 1
    n_symbols_before: int = 0  # nested only: symbol count before the group's own id


class _Parser:
    """State of one parse (``llama_grammar_parser``): symbol table, rules, token names."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.n = len(text)
        self.symbol_ids: dict[str, int] = {}
        self.rules: list[Rule | None] = []
        self.token_names: list[str] = []
        self.token_index: dict[str, int] = {}
        self.first_ref: dict[int, int] = {}  # rule id -> position of its first reference
        self.max_nesting = 0  # the deepest group nesting met so far (llama.cpp recurses per level)

    # -- helpers

    def ch(self, pos: int) -> str:
        """The character at ``pos``, or ``""`` at the end (C's terminating NUL)."""
        return self.text[pos] if pos < self.n else ""

    def fail(self, pos: int, message: str, expected: str) -> NoReturn:
        line, column = _line_column(self.text, pos)
        raise GrammarSyntaxError(message, line, column, expected)

    def get_symbol_id(self, name: str) -> int:
        return self.symbol_ids.setdefault(name, len(self.symbol_ids))

    def generate_symbol_id(self, base_name: str) -> int:
        next_id = len(self.symbol_ids)
        self.symbol_ids[f"{base_name}_{next_id}"] = next_id
        return next_id

    def add_rule(self, rule_id: int, rule: list[Element]) -> None:
        if len(self.rules) <= rule_id:
            self.rules.extend([None] * (rule_id + 1 - len(self.rules)))
        self.rules[rule_id] = tuple(rule)

    # -- lexical pieces

    def parse_space(self, pos: int, newline_ok: bool) -> int:
        text, n = self.text, self.n
        while pos < n:
            c = text[pos]
            if c == " " or c == "\t" or (newline_ok and (c == "\r" or c == "\n")):
                pos += 1
            elif c == "#":
                while pos < n and text[pos] != "\r" and text[pos] != "\n":
                    pos += 1
            else:
                break
        return pos

    def parse_name(self, pos: int) -> int:
        end = pos
        while end < self.n and self.text[end] in WORD_CHARS:
            end += 1
        if end == pos:
            self.fail(pos, "expecting a name", "a name")
        return end

    def parse_int(self, pos: int, expected: str) -> tuple[int, int]:
        """A decimal integer as ``std::stoull`` reads it (out of range above 2**64 - 1)."""
        end = pos
        while end < self.n and self.text[end] in _DIGITS:
            end += 1
        if end == pos:
            self.fail(pos, f"expecting {expected}", expected)
        digits = self.text[pos:end].lstrip("0")
        if len(digits) > 20 or (digits and int(digits) > _UINT64_MAX):
            self.fail(pos, "integer out of range", "an integer below 2**64")
        return int(digits or "0"), end

    def parse_hex(self, pos: int, size: int) -> tuple[int, int]:
        value = 0
        for i in range(size):
            digit = _HEX_VALUES.get(self.ch(pos + i))
            if digit is None:
                self.fail(pos + i, f"expecting {size} hex digits", f"{size} hex digits")
            value = value * 16 + digit
        return value, pos + size

    def parse_char(self, pos: int, closing: str) -> tuple[int, int]:
        """One (possibly escaped) character of a literal or class; ``closing`` names the
        delimiter for the end-of-input message."""
        c = self.ch(pos)
        if c == "\\":
            e = self.ch(pos + 1)
            if e in _HEX_ESCAPE_SIZES:
                return self.parse_hex(pos + 2, _HEX_ESCAPE_SIZES[e])
            if e in _SIMPLE_ESCAPES:
                return _SIMPLE_ESCAPES[e], pos + 2
            if not e:
                self.fail(pos + 1, "unexpected end of input", _ESCAPE_HINT)
            self.fail(pos, f"unknown escape '\\{e}'", _ESCAPE_HINT)
        if not c:
            self.fail(pos, "unexpected end of input", closing)
        return ord(c), pos + 1

    def parse_token(self, pos: int) -> tuple[int, int]:
        """``<[id]>`` (value ``id``) or a named ``<...>`` (value ``-(k + 1)``)."""
        if self.ch(pos) != "<":
            self.fail(pos, "expecting '<'", "'<'")
        p = pos + 1
        if self.ch(p) == "[":
            token_id, end = self.parse_int(p + 1, "a token id")
            if token_id > _UINT32_MAX:
                self.fail(p + 1, "token id too big", "a token id below 2**32")
            if self.ch(end) != "]":
                self.fail(end, "expecting ']'", "']'")
            if self.ch(end + 1) != ">":
                self.fail(end + 1, "expecting '>'", "'>'")
            return token_id, end + 2
        close = self.text.find(">", p)
        if close < 0:
            self.fail(self.n, "expecting '>'", "'>'")
        name = self.text[pos : close + 1]
        k = self.token_index.get(name)
        if k is None:
            k = self.token_index[name] = len(self.token_names)
            self.token_names.append(name)
        return -(k + 1), close + 1

    # -- repetitions

    def handle_repetitions(self, f: _Frame, rule_name: str, min_times: int, max_times: int | None, op_pos: int) -> None:
        """Rewrite the last symbol of ``f`` for ``{min,max}`` (``max=None``: unbounded)::

        S{m,n} -> S ... S (m times) S'(n-m);  S'(x) ::= S S'(x-1) |  ...  S'(1) ::= S |
        S{m,}  -> S ... S (m times) S';       S' ::= S S' |
        """
        if f.last_sym_start == len(f.rule):
            self.fail(op_pos, "expecting an item before the repetition", "an item before */+/?/{")
        prev = f.rule[f.last_sym_start :]
        total_rules = 1
        if max_times is not None and max_times > 0:
            total_rules = max_times
        elif min_times > 0:
            total_rules = min_times
        if f.n_prev_rules * total_rules > MAX_REPETITION_THRESHOLD:
            self.fail(
                op_pos,
                "number of rules that are going to be repeated multiplied by the new repetition "
                f"exceeds {MAX_REPETITION_THRESHOLD}",
                f"at most {MAX_REPETITION_THRESHOLD} repeated rules",
            )
        if max_times is not None and max_times < min_times:
            self.fail(
                op_pos,
                f"repetition maximum {max_times} is less than the minimum {min_times}",
                "a maximum >= the minimum",
            )
        if min_times == 0:
            del f.rule[f.last_sym_start :]
        else:
            f.rule.extend(prev * (min_times - 1))
        last_rec_rule_id = 0
        n_opt = 1 if max_times is None else max_times - min_times
        for i in range(n_opt):
            rec_rule_id = self.generate_symbol_id(rule_name)
            rec_rule = list(prev)
            if i > 0 or max_times is None:
                rec_rule.append((_RULE_REF, rec_rule_id if max_times is None else last_rec_rule_id))
            rec_rule += [(_ALT, 0), (_END, 0)]
            self.add_rule(rec_rule_id, rec_rule)
            last_rec_rule_id = rec_rule_id
        if n_opt > 0:
            f.rule.append((_RULE_REF, last_rec_rule_id))
        f.n_prev_rules *= total_rules

    # -- sequences, alternates, rules

    def parse_alternates(self, pos: int, rule_name: str, rule_id: int) -> int:
        """``parse_alternates`` + ``parse_sequence`` for a top-level rule, with nested
        groups on an explicit stack of frames instead of recursion."""
        frames = [_Frame(rule_id, nested=False)]
        while True:
            f = frames[-1]
            c = self.ch(pos)
            if c == '"':  # literal string
                pos += 1
                f.last_sym_start = len(f.rule)
                f.n_prev_rules = 1
                while self.ch(pos) != '"':
                    value, pos = self.parse_char(pos, "'\"'")
                    f.rule.append((_CHAR, value))
                pos = self.parse_space(pos + 1, f.nested)
            elif c == "[":  # character class
                pos += 1
                start_type = _CHAR
                if self.ch(pos) == "^":
                    pos += 1
                    start_type = _CHAR_NOT
                f.last_sym_start = len(f.rule)
                f.n_prev_rules = 1
                while self.ch(pos) != "]":
                    value, pos = self.parse_char(pos, "']'")
                    f.rule.append((_CHAR_ALT if f.last_sym_start < len(f.rule) else start_type, value))
                    if self.ch(pos) == "-" and self.ch(pos + 1) != "]":
                        value, pos = self.parse_char(pos + 1, "']'")
                        f.rule.append((_CHAR_RNG_UPPER, value))
                pos = self.parse_space(pos + 1, f.nested)
            elif c == "<" or c == "!":  # token reference
                token_type = _TOKEN
                if c == "!":
                    token_type = _TOKEN_NOT
                    pos += 1
                value, pos = self.parse_token(pos)
                f.last_sym_start = len(f.rule)
                f.n_prev_rules = 1
                f.rule.append((token_type, value))
                pos = self.parse_space(pos, f.nested)
            elif c in WORD_CHARS:  # rule reference
                name_end = self.parse_name(pos)
                ref_rule_id = self.get_symbol_id(self.text[pos:name_end])
                self.first_ref.setdefault(ref_rule_id, pos)
                pos = self.parse_space(name_end, f.nested)
                f.last_sym_start = len(f.rule)
                f.n_prev_rules = 1
                f.rule.append((_RULE_REF, ref_rule_id))
            elif c == "(":  # group: a synthesized rule, parsed in a new frame
                pos = self.parse_space(pos + 1, True)
                n_before = len(self.symbol_ids)
                sub_rule_id = self.generate_symbol_id(rule_name)
                frames.append(_Frame(sub_rule_id, nested=True, n_symbols_before=n_before))
                self.max_nesting = max(self.max_nesting, len(frames) - 1)
            elif c == ".":  # any character
                f.last_sym_start = len(f.rule)
                f.n_prev_rules = 1
                f.rule.append((_CHAR_ANY, 0))
                pos = self.parse_space(pos + 1, f.nested)
            elif c == "*" or c == "+" or c == "?":
                op_pos = pos
                pos = self.parse_space(pos + 1, f.nested)
                self.handle_repetitions(f, rule_name, *_OPERATORS[c], op_pos)
            elif c == "{":
                op_pos = pos
                pos = self.parse_space(pos + 1, f.nested)
                min_times, pos = self.parse_int(pos, "an integer")
                pos = self.parse_space(pos, f.nested)
                max_times: int | None = None
                if self.ch(pos) == "}":
                    max_times = min_times
                    pos = self.parse_space(pos + 1, f.nested)
                elif self.ch(pos) == ",":
                    pos = self.parse_space(pos + 1, f.nested)
                    if self.ch(pos) in _DIGITS:
                        max_times, pos = self.parse_int(pos, "an integer")
                        pos = self.parse_space(pos, f.nested)
                    if self.ch(pos) != "}":
                        self.fail(pos, "expecting '}'", "'}'")
                    pos = self.parse_space(pos + 1, f.nested)
                else:
                    self.fail(pos, "expecting ',' or '}'", "',' or '}'")
                if min_times > MAX_REPETITION_THRESHOLD:
                    self.fail(
                        op_pos,
                        f"number of repetitions exceeds {MAX_REPETITION_THRESHOLD}",
                        f"a minimum of at most {MAX_REPETITION_THRESHOLD}",
                    )
                if max_times is not None and max_times > MAX_REPETITION_THRESHOLD:
                    max_times = None  # llama.cpp: a maximum above the threshold is no maximum
                self.handle_repetitions(f, rule_name, min_times, max_times, op_pos)
            elif c == "|":  # next alternative: a fresh parse_sequence
                f.rule.append((_ALT, 0))
                pos = self.parse_space(pos + 1, True)
                f.last_sym_start = len(f.rule)
                f.n_prev_rules = 1
            else:  # end of the alternates of this frame
                f.rule.append((_END, 0))
                self.add_rule(f.rule_id, f.rule)
                frames.pop()
                if not f.nested:
                    return pos
                parent = frames[-1]
                parent.n_prev_rules = max(1, len(self.symbol_ids) - f.n_symbols_before)
                parent.last_sym_start = len(parent.rule)
                parent.rule.append((_RULE_REF, f.rule_id))
                if self.ch(pos) != ")":
                    self.fail(pos, "expecting ')'", "')'")
                pos = self.parse_space(pos + 1, parent.nested)

    def parse_rule(self, pos: int) -> int:
        name_end = self.parse_name(pos)
        p = self.parse_space(name_end, False)
        name = self.text[pos:name_end]
        rule_id = self.get_symbol_id(name)
        if not self.text.startswith("::=", p):
            self.fail(p, "expecting '::='", "'::='")
        p = self.parse_space(p + 3, True)
        p = self.parse_alternates(p, name, rule_id)
        c = self.ch(p)
        if c == "\r":
            p += 2 if self.ch(p + 1) == "\n" else 1
        elif c == "\n":
            p += 1
        elif c:
            self.fail(p, f"expecting newline or end of input, found {c!r}", "newline or end of input")
        return self.parse_space(p, True)

    def parse(self) -> ParsedGrammar:
        nul = self.text.find("\0")
        if nul >= 0:
            self.fail(nul, "NUL character in grammar text", "no NUL character")
        pos = self.parse_space(0, True)
        while pos < self.n:
            pos = self.parse_rule(pos)
        # llama.cpp's final validation: every rule defined, every reference to a rule
        for i, maybe_rule in enumerate(self.rules):
            if maybe_rule is None:
                self.undefined(i)
            for t, v in maybe_rule:
                if t == _RULE_REF and (v >= len(self.rules) or self.rules[v] is None):
                    self.undefined(v)
        rules = tuple(r for r in self.rules if r is not None)
        return ParsedGrammar(rules, dict(self.symbol_ids), tuple(self.token_names))

    def undefined(self, rule_id: int) -> NoReturn:
        name = next((k for k, v in self.symbol_ids.items() if v == rule_id), f"#{rule_id}")
        where = ""
        if rule_id in self.first_ref:
            line, column = _line_column(self.text, self.first_ref[rule_id])
            where = f" (first used at line {line}, column {column})"
        raise GrammarError(f"Undefined rule identifier '{name}'{where}")


def _line_column(text: str, pos: int) -> tuple[int, int]:
    """1-based line and column (in code points) of ``pos``; ``\\r\\n``, ``\\r`` and ``\\n``
    each end a line."""
    inside_crlf = 0 < pos < len(text) and text[pos - 1 : pos + 1] == "\r\n"
    head = text[: pos - inside_crlf].replace("\r\n", "\n").replace("\r", "\n")
    line = head.count("\n") + 1
    column = len(head) - (head.rfind("\n") + 1) + 1 + inside_crlf
    return line, column


# ---------------------------------------------------------------------------- the fast parser

# Text as the schema converter writes it: one rule a line, "name ::= item item ...",
# one blank between items (names, literals, classes, "." and "|", which does not end the
# line), and no repetition, group or comment. re.findall with _FAST_LINES gives, in
# order, (lines, "", "") for a run of such lines where no literal or class has a blank
# inside (str.split can cut them into items), ("", lines, "") for a run of such lines
# (which _FAST_ITEMS cuts), and ("", "", line) for any other line.
_PLAIN_ITEM = (
    r'[A-Za-z0-9-]+|"[^"\\ \r\n]*(?:\\[^ \r\n][^"\\ \r\n]*)*"'
    r"|\[[^\]\\ \r\n]*(?:\\[^ \r\n][^\]\\ \r\n]*)*\]|\."
)
_SPACED_ITEM = (
    r'[A-Za-z0-9-]+|"[^"\\\r\n]*(?:\\[^\r\n][^"\\\r\n]*)*"'
    r"|\[[^\]\\\r\n]*(?:\\[^\r\n][^\]\\\r\n]*)*\]|\."
)
_FAST_LINES = re.compile(
    rf"((?:[A-Za-z0-9-]+ ::= (?:(?:{_PLAIN_ITEM}|\|) )*(?:{_PLAIN_ITEM})(?:\n|\Z))+)"
    rf"|((?:[A-Za-z0-9-]+ ::= (?:(?:{_SPACED_ITEM}|\|) )*(?:{_SPACED_ITEM})(?:\n|\Z))+)"
    r"|(?!\Z)([^\n]*)(?:\n|\Z)"
)
# the items and newlines of lines that _FAST_LINES has checked (it skips " ::= ")
_FAST_ITEMS = re.compile(rf"{_SPACED_ITEM}|\||\n")
_END_KEY = "\n"  # in _Items: the end of a rule

# Any other lines: the tokens of GBNF text for re.finditer, each after the blanks before
# it: a name (with "::=" after it: a rule's head, and the spaces, newlines and comments
# after that), a literal, a character class, a repetition in braces, "(" or "|" (with
# the spaces, newlines and comments after them: llama.cpp skips newlines there), a
# comment, or any other one character (")", ".", "*", "+", "?", "\r", "\n", and what is
# out of place). Every pattern is linear (no nested repetition that could match the same
# text twice).
_WS_NL = r"[ \t\r\n]*(?:\#[^\r\n]*[ \t\r\n]*)*"
_FAST_TOKENS = re.compile(
    rf"""[ \t]*(
        [A-Za-z0-9-]+(?:[ \t]*::={_WS_NL})?
        |"[^"\\]*(?:\\[\s\S][^"\\]*)*"
        |\[[^\]\\]*(?:\\[\s\S][^\]\\]*)*\]
        |[(|]{_WS_NL}
        |\{{[ \t]*[0-9]+[ \t]*(?:,[ \t]*[0-9]*[ \t]*)?\}}
        |\#[^\r\n]*
        |[\s\S]
    )""",
    re.VERBOSE,
)
_GROUP_1 = itemgetter(1)
_FAST_REPETITION = re.compile(r"\{[ \t]*([0-9]+)[ \t]*(?:(,)[ \t]*([0-9]*)[ \t]*)?\}")
_FAST_CACHE_SIZE = 4096
_FAST_CACHE_TOKEN = 256  # the longest token kept
#: literal and class tokens -> their elements, shared by parses (JSON grammars repeat a
#: few dozen of them)
_fast_cache: dict[str, tuple[Element, ...]] = {}
_END_ELEMENT: Element = (_END, 0)


class _Unsure(Exception):
    """The fast parser met something it leaves to the reference parser."""


# one character of a literal or class body: an escape (\\x.., \\u...., \\U........ or a
# backslash and one character, which may be no escape) or any other character
_FAST_UNIT = re.compile(r"\\(?:x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[\s\S])|[\s\S]")


def _fast_value(unit: str) -> int:
    """The code point of a unit of :data:`_FAST_UNIT`."""
    if len(unit) == 1:
        return ord(unit)
    if len(unit) > 2:
        return int(unit[2:], 16)
    value = _SIMPLE_ESCAPES.get(unit[1])
    if value is None:
        raise _Unsure  # an unknown escape, or \\x, \\u, \\U without their digits
    return value


def _fast_elements(token: str) -> tuple[Element, ...]:
    """The elements of a literal (with its quotes) or character class (with its brackets)
    token, as parse_sequence builds them; in a class, a range needs a character after
    its "-" ("[a-]" is "a" and "-")."""
    if token[0] == '"':
        body = token[1:-1]
        if "\\" not in body:
            out = tuple([(_CHAR, ord(c)) for c in body])
        else:
            out = tuple([(_CHAR, _fast_value(unit)) for unit in _FAST_UNIT.findall(body)])
    else:
        negated = token.startswith("[^")
        units = _FAST_UNIT.findall(token, 2 if negated else 1, len(token) - 1)
        elements: list[Element] = []
        first = _CHAR_NOT if negated else _CHAR
        i, n = 0, len(units)
        while i < n:
            elements.append((_CHAR_ALT if elements else first, _fast_value(units[i])))
            if i + 2 < n and units[i + 1] == "-":
                elements.append((_CHAR_RNG_UPPER, _fast_value(units[i + 2])))
                i += 3
            else:
                i += 1
        out = tuple(elements)
    if len(token) <= _FAST_CACHE_TOKEN:
        if len(_fast_cache) >= _FAST_CACHE_SIZE:
            _fast_cache.clear()
        _fast_cache[token] = out
    return out


class _Items(dict[str, tuple[Element, ...]]):
    """Item token -> the elements it stands for in one parse: a rule reference (its name
    gets the next id when first met), a literal, a class, "." or "|"."""

    def __init__(self, symbol_ids: dict[str, int]) -> None:
        super().__init__({".": ((_CHAR_ANY, 0),), "|": ((_ALT, 0),), _END_KEY: (_END_ELEMENT,)})
        self.symbol_ids = symbol_ids

    def __missing__(self, token: str) -> tuple[Element, ...]:
        if token[0] == '"' or token[0] == "[":
            elements = _fast_cache.get(token) or _fast_elements(token)
        else:
            elements = ((_RULE_REF, self.symbol_ids.setdefault(token, len(self.symbol_ids))),)
        self[token] = elements
        return elements


#: What parsing one line does, for :meth:`_FastParser.replay`: the symbols it creates in
#: order, as (name, False) or, for a generated one, (base name, True); the rules it
#: defines, as (symbol index, elements with symbol indexes for rule ids, positions of
#: the rule references); the deepest group nesting.
_FastTemplate = tuple[tuple[tuple[str, bool], ...], tuple[tuple[int, tuple[Element, ...], tuple[int, ...]], ...], int]
_UNSEEN = "unseen"
_SEEN = "seen"
_FAST_TEMPLATES = 1024  # at most this many lines known
_FAST_TEMPLATE_LINE = 4096  # and none longer
_FAST_TEMPLATE_ELEMENTS = 4096  # nor any that makes more elements
#: (line, last line of the text) -> _SEEN (met once), its template, or None (no template)
_fast_templates: dict[tuple[str, bool], _FastTemplate | str | None] = {}


def _fast_template(line: str, at_end: bool) -> _FastTemplate | None:
    """The template of ``line``: parsed alone (no symbol known before), or None where
    that is unsure.

    Parsed after other lines, the line creates the same symbols in the same order, less
    the names known before, and its rules are the same with rule ids mapped. Only
    llama.cpp's limit on repeated rules depends on what is known: a group counts the
    symbols created inside it, which are fewer when some of its names are known, so a
    line that passes alone passes there too."""
    sub = _FastParser(c_parser=False)
    try:
        if not sub.lines(line, at_end):
            return None
    except _Unsure:
        return None
    if sum(map(len, sub.rules.values())) > _FAST_TEMPLATE_ELEMENTS:
        return None  # (a large repetition) not kept
    names = tuple((name.rsplit("_", 1)[0], True) if "_" in name else (name, False) for name in sub.symbol_ids)
    rules = tuple(
        (rule_id, elements, tuple(i for i, (t, _v) in enumerate(elements) if t == _RULE_REF))
        for rule_id, elements in sub.rules.items()
    )
    return names, rules, sub.max_nesting


def _next_head(tokens: Iterator[str]) -> str | None:
    """The next rule's head among the fast parser's tokens (``name ::=``; blank lines and
    comments skipped): "" at the end of the text, None where unsure."""
    for token in tokens:
        c = token[0]
        if c == "\n" or c == "\r" or c == "#":
            continue
        if c not in WORD_CHARS or ":" not in token:
            return None
        return token
    return ""


def _head_name(head: str) -> str:
    return head[: head.index(":")].rstrip(" \t")


#: texts longer than this (bytes) are left to the Python parsers (the C parser's offsets
#: are 32-bit)
_C_PARSE_MAX = 1 << 26
#: the C parser's (type, value) pairs as records, whose tolist() gives tuples
_PAIR: Any = None
#: numpy's type characters -> the C arrays the parser's calls take
_C_ARRAY_TYPES = {"I": "uint32_t[]", "i": "int32_t[]", "l": "int64_t[]", "q": "int64_t[]", "B": "char[]"}


def _c_parse(text: str) -> tuple[ParsedGrammar, int] | None:
    """``text`` parsed by the C parser (``llama_cffi_gbnf_parse``, in the extension): the
    grammar and its deepest nesting of groups, or None where it is unsure (an error, a
    token, a lone surrogate, groups nested over 64 deep, ...): the Python parsers read
    those. Its rules, ids and generated names are what :class:`_Parser` gives."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: the Python parsers take them as code points
        return None
    n = len(data)
    if n > _C_PARSE_MAX:
        return None
    import numpy as np

    from ._binding import ffi, lib

    global _PAIR
    if _PAIR is None:
        _PAIR = np.dtype([("type", "<u4"), ("value", "<u4")])

    def c(a: Any) -> Any:  # an array's buffer for the C calls, typed by its dtype
        return ffi.from_buffer(_C_ARRAY_TYPES[a.dtype.char], a)

    text_c = ffi.from_buffer(data)
    cap = 2 * n + 1024
    cap_syms = n // 4 + 1024  # (names of a character or more, with spaces or "::=" between)
    for _attempt in range(2):
        elems = np.empty(2 * cap, dtype=np.uint32)
        scratch = np.empty(2 * cap, dtype=np.uint32)
        rule_off = np.empty(cap_syms, dtype=np.int32)
        rule_len = np.empty(cap_syms, dtype=np.int32)
        sym = np.empty(3 * cap_syms, dtype=np.int32)
        hash_size = 1 << (2 * cap_syms - 1).bit_length()
        hash_ = np.empty(hash_size, dtype=np.int32)
        counts = np.zeros(3, dtype=np.int32)
        rc = lib.llama_cffi_gbnf_parse(
            text_c,
            n,
            c(elems),
            cap,
            c(scratch),
            cap,
            c(rule_off),
            c(rule_len),
            c(sym),
            cap_syms,
            c(hash_),
            hash_size,
            c(counts),
        )
        if rc != -1:
            break
        cap, cap_syms = 16 * cap, 16 * cap_syms  # (repetitions make many rules of few characters)
    if rc != 0:
        return None
    n_elems, n_syms, nesting = counts.tolist()
    # the elements in rule order (the parser writes a rule once it ends: a group's before
    # the rule it is in) as indexes into the distinct ones, and the names, by the C unpacker
    lens = rule_len[:n_syms]
    total = int(lens.sum())
    idx = np.empty(total, dtype=np.int32)
    dist = np.empty(2 * max(total, 1), dtype=np.uint32)
    hash_size = 1 << (2 * max(total, 1) - 1).bit_length()
    hash_ = np.empty(hash_size, dtype=np.int32)
    cap_names = int(sym[1 : 3 * n_syms : 3].sum()) + 12 * n_syms
    names_buf = np.empty(max(cap_names, 1), dtype=np.uint8)
    got = np.zeros(3, dtype=np.int64)
    rc = lib.llama_cffi_gbnf_unpack(
        text_c,
        n,
        c(elems),
        n_elems,
        c(rule_off),
        c(rule_len),
        c(sym),
        n_syms,
        c(idx),
        total,
        c(dist),
        max(total, 1),
        c(hash_),
        hash_size,
        c(names_buf),
        len(names_buf),
        c(got),
    )
    if rc != 0:
        return None
    n_idx, n_dist, n_names = got.tolist()
    idx = idx[:n_idx]  # (all of it: every rule's elements)
    ends = np.cumsum(lens, dtype=np.int64)
    starts = (ends - lens).tolist()
    crules = _CRules(dist[: 2 * n_dist], idx, starts, ends.tolist())
    names = names_buf[:n_names].tobytes().decode("ascii").split("\n") if n_syms else []
    values = dist[1 : 2 * n_dist : 2][idx]
    type_a, value_a = dist[0 : 2 * n_dist : 2][idx].astype(np.int64), values.astype(np.int64)
    types = type_a.astype(np.uint8).tobytes()
    work = np.empty(6 * n_idx + 5 * n_syms + 2, dtype=np.int32)
    no_cycle = lib.llama_cffi_gbnf_no_left_cycle(
        ffi.from_buffer(types), c(values), n_idx, c(rule_len), n_syms, c(work), len(work)
    )
    how = (crules, types, type_a, value_a, no_cycle == 1, starts, lens.astype(np.int64))
    # (made without the constructor's checks and name table: the parser's names are its
    # ids' order; the rules on first use, see ParsedGrammar.__getattr__)
    g = object.__new__(ParsedGrammar)
    for attr, v in (
        ("symbol_ids", dict(zip(names, range(n_syms), strict=True))),
        ("token_names", ()),
        ("names", tuple(names)),
    ):
        object.__setattr__(g, attr, v)
    return _parsed(g, how), nesting


class _FastParser:
    """:func:`parse_gbnf` for the texts it is sure of: :meth:`parse` gives the grammar,
    or None for anything else (any error, an unknown escape, token references, anything
    but blanks and tabs inside braces, counts with many digits, ...), which the reference
    parser then reads from the start. Lines as the schema converter writes them are cut
    by a regular expression and str.split, other lines into tokens by one ``re.findall``,
    instead of a step per character; the rules, ids and generated names are built as
    :class:`_Parser` builds them. ``c_parser``: try :func:`_c_parse` first (a text's
    first parse in ~0.3 ms where this path takes ~1 ms for a 6 KB grammar)."""

    def __init__(self, c_parser: bool = True) -> None:
        self.symbol_ids: dict[str, int] = {}
        self.rules: dict[int, Rule] = {}
        self.items = _Items(self.symbol_ids)
        self.max_nesting = 0  # the deepest group nesting met
        #: :meth:`parse` tries the C parser first (:func:`_c_parse`); False: this Python
        #: path alone (for the tests that compare it with the reference)
        self.c_parser = c_parser

    def parse(self, text: str) -> ParsedGrammar | None:
        if "\0" in text:
            return None
        if self.c_parser:
            got = _c_parse(text)
            if got is not None:
                self.max_nesting = got[1]
                return got[0]
        symbol_ids, rules = self.symbol_ids, self.rules
        element_lists = self.items.__getitem__
        other: list[str] = []  # lines waiting for self.lines
        try:
            for plain, spaced, line in _FAST_LINES.findall(text):
                if not plain and not spaced:
                    other.append(line)
                    continue
                if other:
                    if not self.other_lines(other, False):
                        return None
                    other = []
                # each rule as its name's reference, its elements and END
                if plain:
                    if plain[-1] != "\n":
                        plain += "\n"
                    items = plain.replace(" ::= ", " ").replace("\n", " \n ").split(" ")
                    items.pop()  # "" after the last newline
                    n_rules = plain.count("\n")
                else:
                    items = _FAST_ITEMS.findall(spaced)
                    if items[-1] != "\n":
                        items.append("\n")
                    n_rules = spaced.count("\n") + (spaced[-1] != "\n")
                elements = tuple(chain.from_iterable(map(element_lists, items)))
                start = 0
                for _ in range(n_rules):
                    end = elements.index(_END_ELEMENT, start) + 1
                    rules[elements[start][1]] = elements[start + 1 : end]
                    start = end
            if other and not self.other_lines(other, True):
                return None
        except _Unsure:
            return None
        if len(rules) != len(symbol_ids):
            return None  # a rule used but not defined: the reference says where
        return _parsed(ParsedGrammar(tuple([rules[i] for i in range(len(rules))]), symbol_ids, ()), True)

    def other_lines(self, lines: list[str], at_end: bool) -> bool:
        """Parse ``lines`` (``at_end``: the last lines of the text); False where unsure.

        A line met before (the schema converter writes its helper rules, such as
        json-number, the same way in every grammar) is replayed from a
        :data:`_FastTemplate` of it; the other lines are parsed as one text."""
        templates = _fast_templates
        for k, line in enumerate(lines):
            key = (line, at_end and k == len(lines) - 1)
            template = templates.get(key, _UNSEEN)
            if template is _UNSEEN or template is None:
                if len(templates) + len(lines) > _FAST_TEMPLATES:
                    templates.clear()
                for j in range(k, len(lines)):
                    if len(lines[j]) <= _FAST_TEMPLATE_LINE:
                        templates.setdefault((lines[j], at_end and j == len(lines) - 1), _SEEN)
                return self.lines("\n".join(lines[k:]), at_end)
            if template is _SEEN:
                template = templates[key] = _fast_template(*key)
                if template is None:
                    return self.lines("\n".join(lines[k:]), at_end)
            assert isinstance(template, tuple)
            self.replay(template)
        return True

    def replay(self, template: _FastTemplate) -> None:
        """What parsing the line of ``template`` does (see :func:`_fast_template`)."""
        symbol_ids, rules = self.symbol_ids, self.rules
        names, template_rules, max_nesting = template
        ids = []
        for name, generated in names:
            if generated:
                rule_id = len(symbol_ids)
                symbol_ids[f"{name}_{rule_id}"] = rule_id
            else:
                rule_id = symbol_ids.setdefault(name, len(symbol_ids))
            ids.append(rule_id)
        for rule_id, elements, refs in template_rules:
            if refs:
                new = list(elements)
                for i in refs:
                    new[i] = (_RULE_REF, ids[elements[i][1]])
                elements = tuple(new)
            rules[ids[rule_id]] = elements
        if max_nesting > self.max_nesting:
            self.max_nesting = max_nesting

    def lines(self, text: str, at_end: bool) -> bool:
        """Parse ``text``, whole lines (a line of the kind above after it unless
        ``at_end``); False where unsure."""
        # lazily: a literal or class that is never closed is read to the end of the text,
        # once, and ends the parse (findall would read on, again from each '"' or '[')
        tokens = map(_GROUP_1, _FAST_TOKENS.finditer(text))
        symbol_ids, rules, items = self.symbol_ids, self.rules, self.items
        groups: list[tuple[list[Element], int, int]] = []  # enclosing rule, its id, symbol count at "("
        head = _next_head(tokens)  # the first rule's
        if not head:
            return head == ""  # blank lines and comments, or unsure
        token = head
        rule_name = _head_name(head)
        rule_id = symbol_ids.setdefault(rule_name, len(symbol_ids))
        rule: list[Element] = []
        last = 0  # last_sym_start
        n_prev = 1  # n_prev_rules
        for token in tokens:
            c = token[0]
            if c == "|":
                rule.append((_ALT, 0))
                last = len(rule)
                n_prev = 1
            elif ((c == '"' or c == "[") and len(token) > 1) or c == ".":  # not a lone '"' or '['
                last = len(rule)
                n_prev = 1
                rule += items[token]
            elif c in WORD_CHARS:
                if ":" in token:  # a rule's head in a rule
                    return False
                last = len(rule)
                n_prev = 1
                rule += items[token]
            elif c == "\n" or c == "\r":
                if groups:
                    continue
                rule.append(_END_ELEMENT)
                rules[rule_id] = tuple(rule)
                head = _next_head(tokens)
                if not head:
                    return head == ""  # the end of the text, or unsure
                token = head
                rule_name = _head_name(head)
                rule_id = symbol_ids.setdefault(rule_name, len(symbol_ids))
                rule = []
                last = 0
                n_prev = 1
            elif c == "(":  # a group is a rule of its own
                groups.append((rule, rule_id, len(symbol_ids)))
                rule_id = len(symbol_ids)
                symbol_ids[f"{rule_name}_{rule_id}"] = rule_id
                rule = []
                last = 0
                n_prev = 1
                if len(groups) > self.max_nesting:
                    self.max_nesting = len(groups)
            elif c == ")":
                if not groups:
                    return False
                rule.append(_END_ELEMENT)
                rules[rule_id] = tuple(rule)
                sub_rule_id = rule_id
                rule, rule_id, n_before = groups.pop()
                n_prev = max(1, len(symbol_ids) - n_before)
                last = len(rule)
                rule.append((_RULE_REF, sub_rule_id))
            elif c == "*" or c == "+" or c == "?" or c == "{":
                if c == "{":
                    m = _FAST_REPETITION.fullmatch(token)
                    if m is None:
                        return False
                    min_s, comma, max_s = m.groups()
                    if len(min_s) > 4 or len(max_s or "") > 19:
                        return False  # above the limit or out of range: the reference says which
                    min_times = int(min_s)
                    if min_times > MAX_REPETITION_THRESHOLD:
                        return False
                    max_times = int(max_s) if max_s else None if comma else min_times
                    if max_times is not None and max_times > MAX_REPETITION_THRESHOLD:
                        max_times = None
                else:
                    min_times, max_times = _OPERATORS[c]
                # handle_repetitions
                if last == len(rule):
                    return False
                total_rules = max_times if max_times else min_times if min_times > 0 else 1
                if n_prev * total_rules > MAX_REPETITION_THRESHOLD:
                    return False
                if max_times is not None and max_times < min_times:
                    return False
                prev = tuple(rule[last:])
                if min_times == 0:
                    del rule[last:]
                elif min_times > 1:
                    rule += prev * (min_times - 1)
                n_opt = 1 if max_times is None else max_times - min_times
                last_rec_rule_id = 0
                for i in range(n_opt):
                    rec_rule_id = len(symbol_ids)
                    symbol_ids[f"{rule_name}_{rec_rule_id}"] = rec_rule_id
                    if i > 0 or max_times is None:
                        ref = rec_rule_id if max_times is None else last_rec_rule_id
                        rules[rec_rule_id] = (*prev, (_RULE_REF, ref), (_ALT, 0), _END_ELEMENT)
                    else:
                        rules[rec_rule_id] = (*prev, (_ALT, 0), _END_ELEMENT)
                    last_rec_rule_id = rec_rule_id
                if n_opt > 0:
                    rule.append((_RULE_REF, last_rec_rule_id))
                n_prev *= total_rules
            elif c != "#":  # "::=" or another character out of place, "<", "!", ...
                return False
        if groups:
            return False
        if not at_end and (token[0] == "|" or (":" in token and token[0] in WORD_CHARS)):
            return False  # the rule goes on in the next line (whose "::=" llama.cpp refuses)
        rule.append(_END_ELEMENT)
        rules[rule_id] = tuple(rule)
        return True


def parse_gbnf(text: str) -> ParsedGrammar:
    """Parse GBNF ``text`` as llama.cpp's ``llama_grammar_parser::parse`` does.

    Same rules, rule ids and generated names as llama.cpp. Raises
    :class:`GrammarSyntaxError` for text that does not parse, at the position where
    llama.cpp's parser gives up (a bad repetition: at its operator; an unknown escape:
    at its backslash), with 1-based line and column (in code points; ``\\r\\n``,
    ``\\r`` and ``\\n`` end lines) and what was expected there; :class:`GrammarError` for a
    reference to a rule that is never defined (naming it and where it is first used).
    Text without rules gives a grammar without rules (which :func:`check_grammar`
    refuses, as llama.cpp does)."""
    text = expect_str("text", text, "a str (GBNF text)")
    fast = _FastParser().parse(text)
    return fast if fast is not None else _Parser(text).parse()


# ---------------------------------------------------------------------------- checks


def alternatives(rule: Rule) -> list[Rule]:
    """The alternatives of a rule (its elements split at ALT, without the END)."""
    expect("rule", rule, (tuple, list), "a rule (a tuple of (type, value) elements)")
    out: list[Rule] = []
    start = 0
    for i, (t, _v) in enumerate(rule):
        if t == _ALT or t == _END:
            out.append(rule[start:i])
            start = i + 1
    return out


def _validate(g: ParsedGrammar) -> _Leading:
    """Refuse a malformed (hand-built) grammar: what the parser can never produce. Gives
    the :class:`_Leading` of its rules.

    The checks run over the whole grammar at once (the element types as one bytes
    string, the distinct elements as a set); anything they do not clear is checked again
    element by element (:func:`_validate_elements`), which raises the exact error."""
    parsed = g._parsed
    if isinstance(parsed, tuple):  # as the C parser made it: well-formed, its elements at hand
        return _Leading(g.rules, parsed[0].flat(), parsed[1])
    flat = list(chain.from_iterable(g.rules))
    try:
        types = bytes(map(_TYPE, flat))  # ValueError for a type past 255
        valid = bool(parsed) or _valid(g, flat, types)  # (the Python fast path's: well-formed)
    except Exception:  # a malformed element: the exact check says which
        valid = False
    if not valid:
        _validate_elements(g)
        for i, rule in enumerate(g.rules):
            for t, v in rule:
                try:
                    operator.index(t), operator.index(v)
                except TypeError:
                    raise GrammarError(f"malformed rule {i}: element {(t, v)!r} is not a pair of integers") from None
        types = bytes(map(_TYPE, flat))
    return _Leading(g.rules, flat, types)


_TYPE = itemgetter(0)
_VALUE = itemgetter(1)
_LAST = itemgetter(-1)
# the types of a valid grammar's elements, one byte each, hold none of these: a type
# past TOKEN_NOT, a modifier (CHAR_RNG_UPPER, CHAR_ALT) first or after an element that
# is no character (END, ALT, RULE_REF, TOKEN, TOKEN_NOT)
_BAD_TYPES = re.compile(rb"[^\x00-\x09]|^[\x05\x06]|[\x00-\x02\x08\x09][\x05\x06]")


def _valid(g: ParsedGrammar, flat: list[Element], types: bytes) -> bool:
    """Whether :func:`_validate_elements` passes ``g`` (False: not sure), given its
    elements and their types."""
    rules = g.rules
    n = len(rules)
    if not all(rules) or _BAD_TYPES.search(types):
        return False
    # each rule ends with END and has no other END
    if types.count(0) != n or any(last[0] != _END for last in set(map(_LAST, rules))):
        return False
    n_tokens = len(g.token_names)
    for t, v in set(flat):
        if type(v) is not int and not isinstance(v, int):
            return False
        if t == _RULE_REF:
            if not 0 <= v < n:
                return False
        elif t >= _TOKEN:
            if not -n_tokens <= v <= _UINT32_MAX:
                return False
        elif t >= _CHAR and not 0 <= v <= _UINT32_MAX:
            return False
    return True


def _validate_elements(g: ParsedGrammar) -> None:
    """:func:`_validate`, element by element."""
    n = len(g.rules)
    for i, rule in enumerate(g.rules):
        if not rule or rule[-1][0] != _END or any(t == _END for t, _v in rule[:-1]):
            raise GrammarError(f"malformed rule {i}: it must end with END (and only there)")
        prev = _END
        for t, v in rule:
            if t not in _ALL_TYPES:
                raise GrammarError(f"malformed rule {i}: unknown element type {t}")
            if t == _RULE_REF and not 0 <= v < n:
                raise GrammarError(f"invalid grammar: rule {i} references undefined rule {v}")
            if t in (_CHAR_ALT, _CHAR_RNG_UPPER) and prev not in _CHAR_ELEMENTS:
                raise GrammarError(f"malformed rule {i}: {GreType(t).name} without a preceding character")
            if t in _CHAR_ELEMENTS and not 0 <= v <= _UINT32_MAX:
                raise GrammarError(f"malformed rule {i}: character value {v} out of range")
            if t in (_TOKEN, _TOKEN_NOT) and not -len(g.token_names) <= v <= _UINT32_MAX:
                raise GrammarError(f"malformed rule {i}: token value {v} out of range")
            prev = t


# Where an alternative starts (at the start of a rule or after ALT/END) with rule
# references (the run of them), or is empty (ends at once): in the element types of a
# grammar as one bytes string.
_LEADING_REFS = re.compile(rb"(?<![^\x00\x01])(?:\x02+|(?=[\x00\x01]))")


class _Leading:
    """What the left-recursion checks need of a valid grammar's rules, found in one pass
    over the element types: which rules have an empty alternative (llama.cpp's
    ``may_be_empty``), which derive the empty string (:attr:`nullable`), and the
    alternatives that start with a rule reference or are empty, as ``(rule, its leading
    references, whether they are the whole alternative)``."""

    def __init__(self, rules: tuple[Rule, ...], flat: list[Element] | None = None, types: bytes = b"") -> None:
        self.n = n = len(rules)
        if flat is None:
            flat = list(chain.from_iterable(rules))
            types = bytes(map(_TYPE, flat))
        ends = list(accumulate(map(len, rules)))
        self.has_empty = has_empty = [False] * n
        self.alts: list[tuple[int, tuple[int, ...], bool]] = []
        append = self.alts.append
        r = 0
        for m in _LEADING_REFS.finditer(types):
            s, e = m.span()
            while ends[r] <= s:
                r += 1
            if s == e:
                has_empty[r] = True
                append((r, (), True))
            elif e == s + 1:
                append((r, (flat[s][1],), types[e] <= _ALT))
            else:
                append((r, tuple([v for _t, v in flat[s:e]]), types[e] <= _ALT))
        self.nullable = self._nullable()

    def _nullable(self) -> list[bool]:
        """Rules that derive the empty string: those with an alternative made only of
        references to such rules (a worklist, linear in the grammar's size)."""
        nullable = [False] * self.n
        pending: list[int] = []  # per alternative: references not yet known to be nullable
        owner: list[int] = []  # per alternative: its rule
        occurrences: dict[int, list[int]] = {}  # per rule: alternatives referring to it
        todo: list[int] = []
        for r, refs, whole in self.alts:
            if not whole:
                continue
            if not refs:
                if not nullable[r]:
                    nullable[r] = True
                    todo.append(r)
                continue
            k = len(pending)
            pending.append(len(refs))
            owner.append(r)
            for v in refs:
                occurrences.setdefault(v, []).append(k)
        while todo:
            for k in occurrences.get(todo.pop(), ()):
                pending[k] -= 1
                if pending[k] == 0 and not nullable[owner[k]]:
                    nullable[owner[k]] = True
                    todo.append(owner[k])
        return nullable

    def edges(self, empty: list[bool]) -> list[list[tuple[int, bool]]]:
        """Per rule, the rules it can refer to before matching any character when the
        rules that may match nothing are ``empty``, each with whether something follows
        that reference in its alternative."""
        edges: list[list[tuple[int, bool]]] = [[] for _ in range(self.n)]
        for r, refs, whole in self.alts:
            last = len(refs) - 1
            for i, v in enumerate(refs):
                edges[r].append((v, i < last or not whole))
                if not empty[v]:
                    break
        return edges

    def successors(self, empty: list[bool]) -> dict[int, list[int]]:
        """The targets of :meth:`edges`, for the rules that have some."""
        succ: dict[int, list[int]] = {}
        for r, refs, _whole in self.alts:
            for v in refs:
                if r in succ:
                    succ[r].append(v)
                else:
                    succ[r] = [v]
                if not empty[v]:
                    break
        return succ


def _acyclic(succ: dict[int, list[int]]) -> bool:
    """Whether a graph has no cycle (Kahn's algorithm over the nodes with successors)."""
    indegree = Counter(chain.from_iterable(succ.values()))
    todo = [r for r in succ if r not in indegree]
    done = 0
    while todo:
        done += 1
        for v in succ[todo.pop()]:
            indegree[v] -= 1
            if indegree[v] == 0 and v in succ:
                todo.append(v)
    return done == len(succ)


def _llama_left_recursion(rules: tuple[Rule, ...]) -> int | None:
    """``llama_grammar_detect_left_recursion`` over every rule, as llama_grammar_init_impl
    runs it: the first rule index from which a left-recursive cycle is found, or None.
    For rules of a valid grammar."""
    return _llama_cycle(_Leading(rules))


def _llama_cycle(leading: _Leading) -> int | None:
    """:func:`_llama_left_recursion`.

    llama.cpp only counts a rule as possibly empty when one of its alternatives is
    literally empty, so the references it follows from a rule before any character are
    fixed: :meth:`_Leading.edges` with ``has_empty``. llama.cpp explores them depth first
    from each rule in turn and reports the rule it started from when it meets a rule on
    its current path. This does the same without recursion and does not re-explore a
    rule already fully explored (llama.cpp does, from inside the recursion): such a rule
    has no reachable cycle and cannot reach a rule on the current path (that rule
    reaches it, so they would share a cycle), so exploring it again would find nothing;
    the answer, and the rule index reported, are the same."""
    if _acyclic(leading.successors(leading.has_empty)):
        return None
    edges = leading.edges(leading.has_empty)
    n = leading.n
    visited = [False] * n
    in_progress = [False] * n
    for start in range(n):
        if visited[start]:
            continue
        in_progress[start] = True
        stack = [(start, iter(edges[start]))]
        while stack:
            r, successors = stack[-1]
            for v, _continued in successors:
                if in_progress[v]:
                    return start
                if not visited[v]:
                    in_progress[v] = True
                    stack.append((v, iter(edges[v])))
                    break
            else:
                in_progress[r] = False
                visited[r] = True
                stack.pop()
    return None


def _nullable_rules(rules: tuple[Rule, ...]) -> list[bool]:
    """Which rules derive the empty string (rules of a valid grammar)."""
    return _Leading(rules).nullable


def _leading_edges(rules: tuple[Rule, ...]) -> list[list[tuple[int, bool]]]:
    """Per rule, the rules it can refer to before matching any character, each with
    whether something follows that reference in its alternative (rules of a valid
    grammar)."""
    leading = _Leading(rules)
    return leading.edges(leading.nullable)


def _hidden_left_recursion(rules: tuple[Rule, ...]) -> int | None:
    """A rule on a left-recursive cycle (true nullability) that goes through a reference
    followed by more elements, or None. On such a cycle llama.cpp's parse stacks grow
    without bound; a cycle of references in last position only is harmless there (its
    stacks repeat) and is accepted. For rules of a valid grammar."""
    return _hidden_cycle(_leading_edges(rules))


def _hidden_cycle(edges: list[list[tuple[int, bool]]]) -> int | None:
    """:func:`_hidden_left_recursion` from the rules' :func:`_leading_edges`."""
    if _acyclic({r: [v for v, _ in es] for r, es in enumerate(edges) if es}):
        return None
    component = _strongly_connected_components(len(edges), [[v for v, _ in es] for es in edges])
    for r, es in enumerate(edges):
        for v, continued in es:
            if continued and component[v] == component[r]:
                return r
    return None


def _strongly_connected_components(n: int, succ: list[list[int]]) -> list[int]:
    """Tarjan's algorithm without recursion: the component number of each node."""
    index = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    component = [-1] * n
    stack: list[int] = []
    counter = 0
    n_components = 0
    for root in range(n):
        if index[root] >= 0:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack[node] = True
            recursed = False
            for j in range(i, len(succ[node])):
                w = succ[node][j]
                if index[w] < 0:
                    work.append((node, j + 1))
                    work.append((w, 0))
                    recursed = True
                    break
                if on_stack[w]:
                    low[node] = min(low[node], index[w])
            if recursed:
                continue
            if low[node] == index[node]:
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    component[w] = n_components
                    if w == node:
                        break
                n_components += 1
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return component


def check_grammar(g: ParsedGrammar, root: str = "root") -> None:
    """What ``llama_grammar_init_impl`` checks after parsing, as :class:`GrammarError`:
    the grammar has rules and a ``root`` symbol, every rule reference is defined, and no
    rule is left-recursive (:class:`LeftRecursionError`, by llama.cpp's algorithm; and,
    beyond llama.cpp, the "hidden" left recursion it misses, see the module docstring)."""
    expect("g", g, ParsedGrammar, "a ParsedGrammar (from parse_gbnf)")
    expect_str("root", root, "a str (the start rule's name)")
    n_rules = _n_rules(g)
    if not n_rules:
        raise GrammarError("grammar has no rules")
    if root not in g.symbol_ids:
        raise GrammarError(f"grammar does not contain a '{root}' symbol")
    if not 0 <= g.symbol_ids[root] < n_rules:
        raise GrammarError(f"grammar's '{root}' symbol has no rule")
    parsed = g._parsed
    if isinstance(parsed, tuple) and parsed[4]:  # the C parser's check: no rule reaches itself first
        return
    leading = _validate(g)
    if _acyclic(leading.successors(leading.nullable)):  # llama.cpp follows some of these: no left recursion
        return
    r = _llama_cycle(leading)
    if r is not None:
        name = g.names[r] or f"#{r}"
        raise LeftRecursionError(f"unsupported grammar, left recursion detected for nonterminal '{name}'", name, False)
    r = _hidden_cycle(leading.edges(leading.nullable))
    if r is not None:
        name = g.names[r] or f"#{r}"
        raise LeftRecursionError(
            f"unsupported grammar, left recursion through rules that may be empty detected for nonterminal '{name}'",
            name,
            True,
        )


# ---------------------------------------------------------------------------- what crashes llama.cpp

_REPETITION = re.compile(r"\{[ \t]*([0-9]+)[ \t]*,[ \t]*([0-9]+)[ \t]*\}")


def _outside_literals(text: str) -> Iterator[int]:
    """Indices of the characters of GBNF ``text`` outside literals, character classes and
    comments (where llama.cpp's parser reads grammar syntax)."""
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "#":
            while i < n and text[i] not in "\r\n":
                i += 1
        elif c in '"[':
            close = '"' if c == '"' else "]"
            i += 1
            while i < n and text[i] != close:
                i += 2 if text[i] == "\\" else 1
        else:
            yield i
        i += 1


def has_token_refs(text: str) -> bool:
    """Whether GBNF ``text`` has token references: a ``<`` or ``!`` outside literals,
    character classes and comments (where llama.cpp's parser starts a token element)."""
    text = expect_str("text", text, "a str (GBNF text)")
    return any(text[i] in "<!" for i in _outside_literals(text))


def inverted_repetition(text: str) -> str | None:
    """The first ``{m,n}`` with ``n < m`` outside literals, classes and comments, or None
    (found by its spelling, even where llama.cpp would refuse the text before it)."""
    text = expect_str("text", text, "a str (GBNF text)")
    for i in _outside_literals(text):
        if text[i] == "{":
            m = _REPETITION.match(text, i)
            if m and int(m.group(2)) < int(m.group(1)):
                return m.group(0)
    return None


@lru_cache(maxsize=64)
def native_grammar_hazard(text: str) -> str | None:
    """Why llama.cpp's grammar sampler would crash the process on GBNF ``text`` (a
    sentence for an error message), or None when it would not: either the grammar is
    safe for llama.cpp or llama.cpp's parser refuses it cleanly (see the module
    docstring). Results for the last 64 texts are cached."""
    bad = inverted_repetition(text)
    if bad is not None:
        return f"repetition {bad} has its maximum below its minimum (llama.cpp would exhaust memory)"
    fast = _FastParser()
    grammar = fast.parse(text)
    max_nesting = fast.max_nesting
    if grammar is None:
        parser = _Parser(text)
        try:
            grammar = parser.parse()
        except GrammarError:  # llama.cpp refuses the text too, after what it parsed before
            grammar = None
        max_nesting = parser.max_nesting
    if max_nesting > MAX_DEPTH:
        return (
            f"groups are nested more than {MAX_DEPTH} deep; llama.cpp's parser "
            "recurses once per level and would overflow the stack"
        )
    if grammar is None:
        return None
    edges = _leading_edges(grammar.rules)
    r = _hidden_cycle(edges)
    if r is not None:
        return (
            f"rule {grammar.names[r] or '#' + str(r)!r} is left-recursive: it can reach itself before "
            "any character, with more to match after (llama.cpp's own check misses "
            "this where the cycle passes rules that match nothing only indirectly, "
            "and its parse stacks then grow until memory runs out)"
        )
    depth = _leading_reference_depth(grammar.rules, edges)
    if depth > MAX_DEPTH:
        return (
            f"a chain of {depth} rule references can come before the first character "
            f"(more than {MAX_DEPTH}); llama.cpp recurses once per reference and would "
            "overflow the stack"
        )
    return None


def _leading_reference_depth(rules: tuple[Rule, ...], edges: list[list[tuple[int, bool]]] | None = None) -> int:
    """An upper bound on the longest chain of rule references llama.cpp can follow before
    a character (in rules): the heaviest path through the components of the leading
    references, each component weighing its number of rules."""
    n = len(rules)
    if n == 0:
        return 0
    succ = [[v for v, _ in es] for es in (_leading_edges(rules) if edges is None else edges)]
    component = _strongly_connected_components(n, succ)
    count = max(component) + 1
    size = [0] * count
    members: list[list[int]] = [[] for _ in range(count)]
    for v, c in enumerate(component):
        size[c] += 1
        members[c].append(v)
    # Tarjan numbers a component after every component it reaches: successors first
    best = [0] * count
    for c in range(count):
        after = 0
        for v in members[c]:
            for w in succ[v]:
                if component[w] != c:
                    after = max(after, best[component[w]])
        best[c] = size[c] + after
    return max(best)
