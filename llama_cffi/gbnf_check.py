"""What llama.cpp's grammar sampler would crash on, found in the GBNF text beforehand.

llama.cpp's parser refuses malformed GBNF (``llama_sampler_init_grammar`` then returns
NULL), but some texts it accepts take the process down later. :func:`native_grammar_hazard`
finds them, so that :meth:`llama_cffi.sampling.LlamaSampler.grammar` can raise instead:

* ``{m,n}`` with ``n < m``: llama.cpp computes ``n - m`` unsigned and generates rules
  until memory runs out.
* Left recursion through rules that derive the empty string only indirectly
  (``root ::= e root "x"``, ``e ::= f``, ``f ::= "" | "z"``): llama.cpp's own check,
  which knows only directly empty alternatives, misses the cycle, and its parse stacks
  then grow until memory runs out.
* Depth: llama.cpp's parser recurses once per nested group, and its left-recursion check
  and stack advance recurse once per rule reference before the first character. On this
  build an 8 MiB stack overflows (SIGSEGV) at about 17,000 nested groups and about
  70,000 chained leading references (measured, not derived). Both are limited to
  :data:`MAX_DEPTH`, which keeps the parser's use of the stack near 1 MiB.

Token references (``<[id]>``, ``<|name|>``) are a different hazard, met at accept time;
:func:`has_token_refs` tells :class:`~llama_cffi.sampling.LlamaSampler` to guard them.

The check mirrors ``llama_grammar_parser::parse`` (``src/llama-grammar.cpp``) closely
enough to rebuild the rule structure llama.cpp would build, keeping only what matters
here: which elements are rule references and which match characters or tokens. Where
llama.cpp would refuse the text, the check gives up (returns None) and leaves the error
to llama.cpp's parser, which prints its reason. It never parses the texts of literals,
classes or tokens beyond finding where they end, and it never imports ``samplers``
(whose full GBNF port serves as the oracle in the tests).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache

__all__ = ["MAX_DEPTH", "has_token_refs", "inverted_repetition", "native_grammar_hazard"]

MAX_DEPTH = 2048
"""The most nested groups, and the longest chain of rule references before a character,
that :func:`native_grammar_hazard` lets through to llama.cpp (whose parser uses about
480 bytes of stack per nested group on x86-64)."""

_MAX_REPETITION = 2000  # llama.cpp's MAX_REPETITION_THRESHOLD
_OPERATORS: dict[str, tuple[int, int | None]] = {"*": (0, None), "+": (1, None), "?": (0, 1)}
_TERMINAL = -1  # an element that matches a character or a token (never empty)

_SPACE = re.compile(r"(?:[ \t]|#[^\r\n]*)*")
_SPACE_NL = re.compile(r"(?:[ \t\r\n]|#[^\r\n]*)*")
_NAME = re.compile(r"[a-zA-Z0-9-]+")
_DIGITS = re.compile(r"[0-9]+")
# Literals and classes end at the first unescaped quote or bracket. llama.cpp also checks
# each escape; where one is bad it refuses the grammar, so being lenient here is safe.
_LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"', re.DOTALL)
_CLASS = re.compile(r"\[\^?((?:[^\]\\]|\\.)*)\]", re.DOTALL)
_TOKEN = re.compile(r"!?<(?:\[[0-9]+\]>|[^>]*>)")
_REPETITION = re.compile(r"\{[ \t]*([0-9]+)[ \t]*,[ \t]*([0-9]+)[ \t]*\}")


class _Refused(Exception):
    """llama.cpp's parser would refuse the text (so it is safe to pass on)."""


class _Hazard(Exception):
    """llama.cpp would accept the text and then crash; the message says why."""


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
    return any(text[i] in "<!" for i in _outside_literals(text))


def inverted_repetition(text: str) -> str | None:
    """The first ``{m,n}`` with ``n < m`` outside literals, classes and comments, or None
    (found by its spelling, even where llama.cpp would refuse the text before it)."""
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
    safe for llama.cpp or llama.cpp's parser refuses it cleanly. Pure Python, linear in
    the length of the text; results for the last 64 texts are cached."""
    bad = inverted_repetition(text)
    if bad is not None:
        return f"repetition {bad} has its maximum below its minimum (llama.cpp would exhaust memory)"
    try:
        shape = _Shape(text)
        shape.parse()
        shape.check()
    except _Refused:
        return None
    except _Hazard as e:
        return str(e)
    return None


@dataclass
class _Frame:
    """A rule being parsed: the alternatives so far, the current one, and where its last
    symbol starts (``None`` before the first)."""

    rule: int
    nested: bool
    alternatives: list[list[int]] = field(default_factory=list)
    current: list[int] = field(default_factory=list)
    last: int | None = None


class _Shape:
    """The rule structure llama.cpp's parser builds from a text: per rule id, its
    alternatives as lists of elements (a rule id, or ``_TERMINAL``). Repetitions keep at
    most two copies and two optional rules where llama.cpp makes up to 2,000; more copies
    of the same symbol add no new kind of path (the checks ask only which references
    can come first and whether anything follows them)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.ids: dict[str, int] = {}
        self.owner: list[str] = []  # per id: the named rule it was written in
        self.rules: dict[int, list[list[int]]] = {}

    # ------------------------------------------------------------------ parsing

    def _id(self, name: str) -> int:
        if name not in self.ids:
            self.ids[name] = len(self.owner)
            self.owner.append(name)
        return self.ids[name]

    def _generated(self, owner: str) -> int:
        self.owner.append(owner)
        return len(self.owner) - 1

    def _space(self, i: int, newline_ok: bool) -> int:
        m = (_SPACE_NL if newline_ok else _SPACE).match(self.text, i)
        assert m is not None
        return m.end()

    def parse(self) -> None:
        t, n = self.text, len(self.text)
        i = self._space(0, True)
        while i < n:
            m = _NAME.match(t, i)
            if m is None:
                raise _Refused
            rule = self._id(m.group())
            i = self._space(m.end(), False)
            if not t.startswith("::=", i):
                raise _Refused
            i = self._alternates(self._space(i + 3, True), rule)
            if i < n:
                if t[i] == "\r":
                    i += 2 if t.startswith("\r\n", i) else 1
                elif t[i] == "\n":
                    i += 1
                else:
                    raise _Refused
            i = self._space(i, True)
        if any(rule not in self.rules for rule in self.ids.values()):
            raise _Refused  # a rule referred to but never defined

    def _alternates(self, i: int, rule: int) -> int:
        """``parse_alternates`` and ``parse_sequence`` without recursion: nested groups
        push frames. Returns the index after the rule's last alternative."""
        t, n = self.text, len(self.text)
        frames = [_Frame(rule, nested=False)]
        while True:
            f = frames[-1]
            c = t[i] if i < n else ""
            if c == '"' or c == "[":
                m = (_LITERAL if c == '"' else _CLASS).match(t, i)
                if m is None:
                    raise _Refused
                f.last = len(f.current)
                if m.group(1):  # "" and [] add no element in llama.cpp
                    f.current.append(_TERMINAL)
                i = self._space(m.end(), f.nested)
            elif c == "<" or c == "!":
                m = _TOKEN.match(t, i)
                if m is None:
                    raise _Refused
                f.last = len(f.current)
                f.current.append(_TERMINAL)
                i = self._space(m.end(), f.nested)
            elif c == ".":
                f.last = len(f.current)
                f.current.append(_TERMINAL)
                i = self._space(i + 1, f.nested)
            elif c and _NAME.match(c):
                m = _NAME.match(t, i)
                assert m is not None
                f.last = len(f.current)
                f.current.append(self._id(m.group()))
                i = self._space(m.end(), f.nested)
            elif c == "(":
                if len(frames) > MAX_DEPTH:
                    raise _Hazard(
                        f"groups are nested more than {MAX_DEPTH} deep; llama.cpp's parser "
                        "recurses once per level and would overflow the stack"
                    )
                i = self._space(i + 1, True)
                frames.append(_Frame(self._generated(self.owner[f.rule]), nested=True))
            elif c in ("*", "+", "?"):
                i = self._space(i + 1, f.nested)
                self._repeat(f, *_OPERATORS[c])
            elif c == "{":
                i = self._space(i + 1, f.nested)
                m = _DIGITS.match(t, i)
                if m is None:
                    raise _Refused
                low = int(m.group())
                high: int | None = low
                i = self._space(m.end(), f.nested)
                if i < n and t[i] == ",":
                    i = self._space(i + 1, f.nested)
                    m = _DIGITS.match(t, i)
                    high = None
                    if m is not None:
                        high = int(m.group())
                        i = self._space(m.end(), f.nested)
                if not (i < n and t[i] == "}"):
                    raise _Refused
                i = self._space(i + 1, f.nested)
                if low > _MAX_REPETITION:
                    raise _Refused
                if high is not None and high > _MAX_REPETITION:
                    high = None
                if high is not None and high < low:
                    raise _Hazard(
                        f"repetition {{{low},{high}}} has its maximum below its minimum "
                        "(llama.cpp would exhaust memory)"
                    )
                self._repeat(f, low, high)
            elif c == "|":
                f.alternatives.append(f.current)
                f.current, f.last = [], None
                i = self._space(i + 1, True)
            else:  # the end of this rule's alternatives
                f.alternatives.append(f.current)
                self.rules[f.rule] = f.alternatives
                frames.pop()
                if not frames:
                    return i
                if c != ")":
                    raise _Refused
                parent = frames[-1]
                parent.last = len(parent.current)
                parent.current.append(f.rule)
                i = self._space(i + 1, parent.nested)

    def _repeat(self, f: _Frame, low: int, high: int | None) -> None:
        """llama.cpp's ``handle_repetitions`` on the frame's last symbol, compressed (see
        the class docstring): ``S{m,n}`` is ``S`` m times, then a chain of ``n - m``
        optional rules ``S'(k) ::= S S'(k-1) |``; ``S{m,}`` ends in ``S' ::= S S' |``."""
        if f.last is None or f.last == len(f.current):
            raise _Refused  # nothing before the operator
        symbol = f.current[f.last :]
        if low == 0:
            del f.current[f.last :]
        else:
            f.current.extend(symbol * min(low - 1, 1))
        n_optional = 1 if high is None else high - low
        previous: int | None = None
        for k in range(min(n_optional, 2)):
            rule = self._generated(self.owner[f.rule])
            body = list(symbol)
            if high is None:
                body.append(rule)
            elif k > 0:
                assert previous is not None
                body.append(previous)
            self.rules[rule] = [body, []]
            previous = rule
        if previous is not None:
            f.current.append(previous)

    # ------------------------------------------------------------------ checks

    def check(self) -> None:
        """Raise :class:`_Hazard` for left recursion through maybe-empty rules, or a chain
        of leading references longer than :data:`MAX_DEPTH`."""
        n = len(self.owner)
        nullable = self._nullable()
        edges: list[list[tuple[int, bool]]] = [[] for _ in range(n)]  # (rule, more follows)
        for rule, alternatives in self.rules.items():
            for alt in alternatives:
                for k, e in enumerate(alt):
                    if e == _TERMINAL:
                        break
                    edges[rule].append((e, k + 1 < len(alt)))
                    if not nullable[e]:
                        break
        component = _components(n, [[e for e, _ in es] for es in edges])
        for rule, es in enumerate(edges):
            for e, more in es:
                if more and component[e] == component[rule]:
                    raise _Hazard(
                        f"rule {self.owner[rule]!r} is left-recursive: it can reach itself before "
                        "any character, with more to match after (llama.cpp's own check misses "
                        "this where the cycle passes rules that match nothing only indirectly, "
                        "and its parse stacks then grow until memory runs out)"
                    )
        depth = _longest_path(n, [[e for e, _ in es] for es in edges], component)
        if depth > MAX_DEPTH:
            raise _Hazard(
                f"a chain of {depth} rule references can come before the first character "
                f"(more than {MAX_DEPTH}); llama.cpp recurses once per reference and would "
                "overflow the stack"
            )

    def _nullable(self) -> list[bool]:
        """Which rules can match the empty string (an alternative of references to such
        rules only), to a fixed point; newer (nested) rules first, which settles nested
        groups in one pass."""
        nullable = [False] * len(self.owner)
        order = sorted(self.rules, reverse=True)
        changed = True
        while changed:
            changed = False
            for rule in order:
                if not nullable[rule] and any(
                    all(e != _TERMINAL and nullable[e] for e in alt) for alt in self.rules[rule]
                ):
                    nullable[rule] = changed = True
        return nullable


def _components(n: int, succ: list[list[int]]) -> list[int]:
    """Kosaraju's strongly connected components, without recursion. Components are
    numbered in a topological order of the condensation (edges go from lower to higher
    numbers, or stay within a component)."""
    seen = [False] * n
    finished: list[int] = []
    for start in range(n):
        if seen[start]:
            continue
        seen[start] = True
        stack = [(start, iter(succ[start]))]
        while stack:
            node, it = stack[-1]
            for w in it:
                if not seen[w]:
                    seen[w] = True
                    stack.append((w, iter(succ[w])))
                    break
            else:
                stack.pop()
                finished.append(node)
    pred: list[list[int]] = [[] for _ in range(n)]
    for v, ws in enumerate(succ):
        for w in ws:
            pred[w].append(v)
    component = [-1] * n
    count = 0
    for start in reversed(finished):
        if component[start] >= 0:
            continue
        component[start] = count
        todo = [start]
        while todo:
            v = todo.pop()
            for w in pred[v]:
                if component[w] < 0:
                    component[w] = count
                    todo.append(w)
        count += 1
    return component


def _longest_path(n: int, succ: list[list[int]], component: list[int]) -> int:
    """An upper bound on the longest simple path (in nodes): the heaviest path through
    the condensation, each component weighing its number of nodes."""
    if n == 0:
        return 0
    count = max(component) + 1
    size = [0] * count
    members: list[list[int]] = [[] for _ in range(count)]
    for v, c in enumerate(component):
        size[c] += 1
        members[c].append(v)
    best = [0] * count
    for c in range(count - 1, -1, -1):
        after = 0
        for v in members[c]:
            for w in succ[v]:
                if component[w] != c:
                    after = max(after, best[component[w]])
        best[c] = size[c] + after
    return max(best)
