"""GBNF grammars with sentences they accept and near misses they reject, for
:mod:`samplers.testing` (:func:`grammars_with_examples`)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, TypeAlias

from llama_cffi._args import expect_bool, expect_int

from ._hypothesis import _require_hypothesis

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = ["GrammarExample", "GrammarExampleMismatch", "grammars_with_examples"]


# A grammar is a tree of the nodes below (no rule refers back to itself except a
# _Nest, whose recursion always follows a non-empty literal: never left-recursive).
# From one tree come the GBNF text, random sentences, and an independent recognizer
# that labels the near misses. Identity equality: nodes are keys of memo tables.


@dataclass(frozen=True, eq=False)
class _Lit:
    text: str  # non-empty


@dataclass(frozen=True, eq=False)
class _Class:
    negated: bool
    ranges: tuple[tuple[str, str], ...]  # inclusive character ranges, lo <= hi

    def matches(self, c: str) -> bool:
        return any(lo <= c <= hi for lo, hi in self.ranges) != self.negated


@dataclass(frozen=True, eq=False)
class _Seq:
    items: tuple[_Node, ...]


@dataclass(frozen=True, eq=False)
class _Alt:
    options: tuple[_Node, ...]


@dataclass(frozen=True, eq=False)
class _Repeat:
    node: _Node  # never derives the empty string
    lo: int
    hi: int | None  # None: unbounded


@dataclass(frozen=True, eq=False)
class _Rule:
    name: str
    node: _Node


@dataclass(frozen=True, eq=False)
class _Nest:
    """``name ::= open (inner | name)* close``: balanced brackets."""

    name: str
    open: str
    inner: _Node  # never derives the empty string
    close: str


_Node: TypeAlias = _Lit | _Class | _Seq | _Alt | _Repeat | _Rule | _Nest

#: Characters of literals (quote, backslash and newline need escapes in GBNF).
_LIT_CHARS = 'abxyz01 -."\\\né日'
#: Class ranges (sub-ranges are drawn) and single class members (``]``, ``-``, ``^``,
#: ``[`` and backslash need escapes inside a class).
_CLASS_RANGES = (("a", "f"), ("0", "9"), ("A", "Z"), ("\u03b1", "\u03c9"))
_CLASS_SINGLES = 'xyz -_"\\[]^.é日\n'
#: Characters no literal or class names: what negated classes and near misses can use.
_OUTSIDERS = "~!€"
_NESTS = (("(", ")"), ("[", "]"), ("{", "}"), ("<", ">"), ("begin ", " end"))


def _ascii(chars: str) -> str:
    return "".join(c for c in chars if ord(c) < 0x80)


def _nullable(node: _Node) -> bool:
    """Whether ``node`` derives the empty string."""
    if isinstance(node, (_Lit, _Class, _Nest)):
        return False
    if isinstance(node, _Seq):
        return all(_nullable(i) for i in node.items)
    if isinstance(node, _Alt):
        return any(_nullable(o) for o in node.options)
    if isinstance(node, _Repeat):
        return node.lo == 0 or _nullable(node.node)
    return _nullable(node.node)


def _esc(c: str, in_class: bool) -> str:
    """One character in GBNF (llama.cpp's ``parse_char`` escapes)."""
    special = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    if c in special:
        return special[c]
    if (in_class and c in "[]-^") or ord(c) < 0x20 or ord(c) == 0x7F:
        return f"\\x{ord(c):02X}"
    if not in_class and c == '"':
        return '\\"'
    return c


def _render(node: _Node) -> str:
    """``node`` as a GBNF item that can stand anywhere in a sequence."""
    if isinstance(node, _Lit):
        return '"' + "".join(_esc(c, False) for c in node.text) + '"'
    if isinstance(node, _Class):
        items = "".join(_esc(lo, True) + ("" if lo == hi else "-" + _esc(hi, True)) for lo, hi in node.ranges)
        return "[" + ("^" if node.negated else "") + items + "]"
    if isinstance(node, _Seq):
        return "(" + " ".join(_render(i) for i in node.items) + ")"
    if isinstance(node, _Alt):
        return "(" + " | ".join(_render(o) for o in node.options) + ")"
    if isinstance(node, _Repeat):
        inner = _render(node.node)
        if isinstance(node.node, _Repeat):
            inner = f"({inner})"
        lo, hi = node.lo, node.hi
        op = {(0, None): "*", (1, None): "+", (0, 1): "?"}.get((lo, hi))
        if op is None:
            op = f"{{{lo},}}" if hi is None else f"{{{lo}}}" if hi == lo else f"{{{lo},{hi}}}"
        return inner + op
    return node.name


def _definitions(root: _Node) -> list[tuple[str, str]]:
    """``(name, body)`` for ``root`` and every named rule under it, in first-seen order."""
    out = [("root", _render(root))]
    seen: set[str] = set()
    todo: list[_Node] = [root]
    while todo:
        node = todo.pop(0)
        if isinstance(node, (_Rule, _Nest)) and node.name not in seen:
            seen.add(node.name)
            if isinstance(node, _Rule):
                out.append((node.name, _render(node.node)))
            else:
                body = f"{_render(_Lit(node.open))} ({_render(node.inner)} | {node.name})* {_render(_Lit(node.close))}"
                out.append((node.name, body))
        if isinstance(node, _Seq):
            todo.extend(node.items)
        elif isinstance(node, _Alt):
            todo.extend(node.options)
        elif isinstance(node, (_Repeat, _Rule)):
            todo.append(node.node)
        elif isinstance(node, _Nest):
            todo.append(node.inner)
    return out


def _gbnf(root: _Node) -> str:
    return "".join(f"{name} ::= {body}\n" for name, body in _definitions(root))


class _Recognizer:
    """Whether a tree derives a string: for each node and start position, the set of end
    positions (memoised; a _Nest recurses only after its non-empty opening literal, so
    every recursive call starts further right)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.memo: dict[tuple[int, int], frozenset[int]] = {}
        self.bodies: dict[int, _Repeat] = {}

    def accepts(self, root: _Node) -> bool:
        return len(self.text) in self.ends(root, 0)

    def ends(self, node: _Node, i: int) -> frozenset[int]:
        key = (id(node), i)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = frozenset(self._ends(node, i))
        return hit

    def _ends(self, node: _Node, i: int) -> set[int]:
        text = self.text
        if isinstance(node, _Lit):
            return {i + len(node.text)} if text.startswith(node.text, i) else set()
        if isinstance(node, _Class):
            return {i + 1} if i < len(text) and node.matches(text[i]) else set()
        if isinstance(node, _Seq):
            pos = {i}
            for item in node.items:
                pos = {e for p in pos for e in self.ends(item, p)}
            return pos
        if isinstance(node, _Alt):
            return {e for o in node.options for e in self.ends(o, i)}
        if isinstance(node, _Repeat):
            out = {i} if node.lo == 0 else set()
            cur, k, seen = {i}, 0, set[int]()
            while cur and (node.hi is None or k < node.hi):
                cur = {e for p in cur for e in self.ends(node.node, p)}
                k += 1
                if k >= node.lo:
                    if node.hi is None:  # past the minimum, a position seen before adds nothing
                        cur -= seen
                        seen |= cur
                    out |= cur
            return out
        if isinstance(node, _Rule):
            return set(self.ends(node.node, i))
        if not text.startswith(node.open, i):
            return set()
        body = self.bodies.get(id(node))
        if body is None:
            body = self.bodies[id(node)] = _Repeat(_Alt((node.inner, node)), 0, None)
        close = _Lit(node.close)
        return {e for p in self.ends(body, i + len(node.open)) for e in self._ends(close, p)}


def _sentence(node: _Node, rng: random.Random, universe: str, depth: int = 0) -> str:
    """A random string ``node`` derives (repetitions and nesting kept short)."""
    if isinstance(node, _Lit):
        return node.text
    if isinstance(node, _Class):
        if node.negated:
            return rng.choice([c for c in universe if node.matches(c)])
        lo, hi = rng.choice(node.ranges)
        return chr(rng.randint(ord(lo), ord(hi)))
    if isinstance(node, _Seq):
        return "".join(_sentence(i, rng, universe, depth) for i in node.items)
    if isinstance(node, _Alt):
        return _sentence(rng.choice(node.options), rng, universe, depth)
    if isinstance(node, _Repeat):
        n = rng.randint(node.lo, node.hi if node.hi is not None else node.lo + 2)
        return "".join(_sentence(node.node, rng, universe, depth) for _ in range(n))
    if isinstance(node, _Rule):
        return _sentence(node.node, rng, universe, depth)
    parts = [node.open]
    for _ in range(rng.randint(0, 2)):
        nest = depth < 3 and rng.random() < 0.3
        parts.append(_sentence(node if nest else node.inner, rng, universe, depth + 1))
    parts.append(node.close)
    return "".join(parts)


def _near_misses(root: _Node, accepted: list[str], rng: random.Random, chars: str, limit: int) -> list[str]:
    """Up to ``limit`` one-edit mutations of accepted strings that ``root`` does not derive."""
    out: list[str] = []
    seen = set(accepted)
    for _ in range(limit * 12):
        if len(out) >= limit or not accepted:
            break
        s = rng.choice(accepted)
        c = rng.choice(chars)
        i = rng.randint(0, len(s))
        op = rng.choice(("insert", "delete", "replace", "duplicate", "swap", "truncate", "append"))
        if op == "insert" or not s:
            m = s[:i] + c + s[i:]
        elif op == "append":
            m = s + c
        elif op == "truncate":
            m = s[: rng.randint(0, len(s) - 1)]
        else:
            j = min(i, len(s) - 1)
            if op == "delete":
                m = s[:j] + s[j + 1 :]
            elif op == "replace":
                m = s[:j] + c + s[j + 1 :]
            elif op == "duplicate":
                m = s[: j + 1] + s[j:]
            else:
                m = s[:j] + s[j + 1 : j + 2] + s[j] + s[j + 2 :]
        if m in seen:
            continue
        seen.add(m)
        if not _Recognizer(m).accepts(root):
            out.append(m)
    return out


class GrammarExample(NamedTuple):
    """A grammar and labelled strings (unpacks as ``gbnf, accepted, rejected``)."""

    #: GBNF text (llama.cpp's dialect) with a ``root`` rule; parses with both
    #: :meth:`samplers.grammar.Grammar.from_gbnf` and ``llama_sampler_init_grammar``.
    gbnf: str
    #: Distinct sentences of the grammar (at least one; may include ``""``).
    accepted: tuple[str, ...]
    #: Distinct near misses: one-edit mutations of accepted strings (insert, delete,
    #: replace, duplicate or swap a character, truncate, append) that the grammar
    #: rejects. Can be empty when no mutation leaves the language (``[^a]*``).
    rejected: tuple[str, ...]


class GrammarExampleMismatch(AssertionError):
    """:class:`samplers.grammar.Grammar` disagrees with the grammar model about a string
    (a bug in one of them)."""


def grammars_with_examples(
    *,
    max_depth: int = 3,
    max_accepted: int = 4,
    max_rejected: int = 4,
    recursive: bool = True,
    ascii_only: bool = False,
    confirm: bool = True,
) -> SearchStrategy[GrammarExample]:
    """GBNF grammars with strings they accept and near misses they reject.

    Each grammar comes from a random tree of literals, character classes (ranges,
    negation), sequences, alternations, repetitions (``* + ? {m} {m,} {m,n}``), named
    rules (some referred to twice) and, with ``recursive``, balanced-bracket rules
    (``n1 ::= "(" (x | n1)* ")"``: context-free, never left-recursive), nested at most
    ``max_depth`` deep. Literals and classes use quotes, backslashes, newlines, ``]``,
    ``-``, ``^`` and, unless ``ascii_only``, 2- and 3-byte UTF-8 characters, so the
    GBNF exercises every escape.

    Up to ``max_accepted`` sentences are generated from the tree itself and up to
    ``max_rejected`` near misses are kept only when the tree's own recognizer (which
    shares no code with :mod:`samplers.grammar`) rejects them. With ``confirm`` (the
    default) every label is then checked with ``Grammar.from_gbnf(gbnf).accepts``, and a
    disagreement raises :class:`GrammarExampleMismatch` instead of a mislabelled example.
    Strings are ``str`` (code points; llama.cpp sees their UTF-8 bytes), at most a few
    dozen characters.
    """
    _require_hypothesis()
    from hypothesis import strategies as st

    for name, value in (("max_depth", max_depth), ("max_accepted", max_accepted), ("max_rejected", max_rejected)):
        expect_int(name, value)
    if max_depth < 0 or max_accepted < 1 or max_rejected < 0:
        raise ValueError("need max_depth >= 0, max_accepted >= 1 and max_rejected >= 0")
    recursive = expect_bool("recursive", recursive)
    ascii_only = expect_bool("ascii_only", ascii_only)
    confirm = expect_bool("confirm", confirm)
    lit_chars = _ascii(_LIT_CHARS) if ascii_only else _LIT_CHARS
    singles = _ascii(_CLASS_SINGLES) if ascii_only else _CLASS_SINGLES
    ranges = tuple(r for r in _CLASS_RANGES if not ascii_only or ord(r[1]) < 0x80)
    outsiders = _ascii(_OUTSIDERS) if ascii_only else _OUTSIDERS
    universe = "".join(sorted(set(lit_chars + singles + "".join(lo + hi for lo, hi in ranges) + outsiders)))

    @st.composite
    def examples(draw: st.DrawFn) -> GrammarExample:
        names: list[_Rule | _Nest] = []

        def char_range() -> tuple[str, str]:
            if draw(st.booleans()):
                c = draw(st.sampled_from(singles))
                return c, c
            lo, hi = draw(st.sampled_from(ranges))
            a = draw(st.integers(ord(lo), ord(hi)))
            return chr(a), chr(draw(st.integers(a, ord(hi))))

        def node(depth: int) -> _Node:
            kinds = ["lit", "class"]
            if depth > 0:
                kinds += ["seq", "alt", "repeat", "repeat", "rule"] + (["nest"] if recursive else [])
                if names:
                    kinds.append("again")
            kind = draw(st.sampled_from(kinds))
            if kind == "lit":
                return _Lit(draw(st.text(st.sampled_from(lit_chars), min_size=1, max_size=3)))
            if kind == "class":
                negated = draw(st.booleans())
                return _Class(negated, tuple(char_range() for _ in range(draw(st.integers(1, 3)))))
            if kind == "seq":
                return _Seq(tuple(node(depth - 1) for _ in range(draw(st.integers(2, 3)))))
            if kind == "alt":
                return _Alt(tuple(node(depth - 1) for _ in range(draw(st.integers(2, 3)))))
            if kind == "repeat":
                inner = solid(depth - 1)
                lo, hi = draw(
                    st.sampled_from([(0, None), (1, None), (0, 1)])
                    | st.tuples(st.integers(0, 2), st.sampled_from([None, 0, 1, 2])).map(
                        lambda t: (t[0], None if t[1] is None else t[0] + t[1])
                    )
                )
                if hi == 0:
                    hi = 1
                return _Repeat(inner, lo, hi)
            if kind == "again":
                return draw(st.sampled_from(names))
            if kind == "rule":
                body = node(depth - 1)  # first: it may name rules of its own
                rule = _Rule(f"r{len(names) + 1}", body)
                names.append(rule)
                return rule
            o, c = draw(st.sampled_from(_NESTS))
            inner = solid(depth - 1)
            nest = _Nest(f"n{len(names) + 1}", o, inner, c)
            names.append(nest)
            return nest

        def solid(depth: int) -> _Node:
            """A node that never derives the empty string (what a repetition may repeat)."""
            n = node(depth)
            return n if not _nullable(n) else _Lit(draw(st.sampled_from(lit_chars)))

        root = node(max_depth)
        gbnf = _gbnf(root)
        rng = draw(st.randoms(use_true_random=False))
        accepted = list(dict.fromkeys(_sentence(root, rng, universe) for _ in range(max_accepted)))
        rejected = _near_misses(root, accepted, rng, lit_chars + singles + outsiders, max_rejected)
        if confirm:
            _confirm(gbnf, accepted, rejected)
        return GrammarExample(gbnf, tuple(accepted), tuple(rejected))

    return examples()


def _confirm(gbnf: str, accepted: list[str], rejected: list[str]) -> None:
    from ..grammar import Grammar

    g = Grammar.from_gbnf(gbnf)
    for s in accepted:
        if not g.accepts(s):
            raise GrammarExampleMismatch(f"Grammar.accepts rejects {s!r}, a sentence of the grammar model:\n{gbnf}")
    for s in rejected:
        if g.accepts(s):
            raise GrammarExampleMismatch(f"Grammar.accepts accepts {s!r}, which the grammar model rejects:\n{gbnf}")
