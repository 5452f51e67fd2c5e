"""Test helpers for parsed GBNF grammars: a reference recognizer and a random generator.

Both read :class:`~samplers.grammar.elements.ParsedGrammar` element lists directly, with
llama.cpp's meaning of a character class (``llama_grammar_match_char``), and are written
to be obviously right rather than fast; they know nothing of the fast matcher.

Texts are sequences of code points. Token elements (``<[id]>``, ``!<[id]>``, named
tokens) match tokens, not characters, so here they match nothing and are never
generated.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from samplers.grammar.elements import Element, GreType, ParsedGrammar, Rule

MAX_CODE_POINT = 0x10FFFF


@dataclass(frozen=True)
class CharClass:
    """One character item of a rule: ``CHAR``/``CHAR_NOT``/``CHAR_ANY`` with its
    ``CHAR_RNG_UPPER``/``CHAR_ALT`` modifiers, as inclusive ranges (``.`` is the range
    of all code points)."""

    negated: bool
    ranges: tuple[tuple[int, int], ...]

    def matches(self, cp: int) -> bool:
        """``llama_grammar_match_char``: in some range, unless negated."""
        return any(lo <= cp <= hi for lo, hi in self.ranges) != self.negated

    def allowed(self) -> list[tuple[int, int]]:
        """The code points this class matches, as sorted disjoint inclusive ranges."""
        merged: list[tuple[int, int]] = []
        for lo, hi in sorted((lo, min(hi, MAX_CODE_POINT)) for lo, hi in self.ranges if lo <= hi):
            if lo > MAX_CODE_POINT:
                continue
            if merged and lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
            else:
                merged.append((lo, hi))
        if not self.negated:
            return merged
        out: list[tuple[int, int]] = []
        nxt = 0
        for lo, hi in merged:
            if lo > nxt:
                out.append((nxt, lo - 1))
            nxt = hi + 1
        if nxt <= MAX_CODE_POINT:
            out.append((nxt, MAX_CODE_POINT))
        return out


@dataclass(frozen=True)
class Ref:
    """A rule reference."""

    rule: int


@dataclass(frozen=True)
class Token:
    """A token reference (matches no character)."""

    element: Element


Item = CharClass | Ref | Token


def alternatives(rule: Rule) -> list[list[Item]]:
    """A rule as a list of alternatives, each a list of items."""
    alts: list[list[Item]] = []
    items: list[Item] = []
    i = 0
    while i < len(rule):
        t, v = rule[i]
        if t in (GreType.END, GreType.ALT):
            alts.append(items)
            items = []
            i += 1
        elif t == GreType.RULE_REF:
            items.append(Ref(v))
            i += 1
        elif t in (GreType.TOKEN, GreType.TOKEN_NOT):
            items.append(Token((t, v)))
            i += 1
        elif t in (GreType.CHAR, GreType.CHAR_NOT, GreType.CHAR_ANY):
            ranges: list[tuple[int, int]] = []
            while True:
                t2, v2 = rule[i]
                if i + 1 < len(rule) and rule[i + 1][0] == GreType.CHAR_RNG_UPPER:
                    ranges.append((v2, rule[i + 1][1]))
                    i += 2
                elif t2 == GreType.CHAR_ANY:
                    ranges.append((0, 0xFFFFFFFF))
                    i += 1
                else:
                    ranges.append((v2, v2))
                    i += 1
                if not (i < len(rule) and rule[i][0] == GreType.CHAR_ALT):
                    break
            items.append(CharClass(t == GreType.CHAR_NOT, tuple(ranges)))
        else:
            raise ValueError(f"malformed rule: {GreType(t).name} out of place")
    return alts


def reference_accepts(g: ParsedGrammar, text: str, root: str = "root") -> bool:
    """Whether rule ``root`` of ``g`` derives exactly ``text``.

    ``ends[i][r]`` is the set of positions ``j`` such that rule ``r`` derives
    ``text[i:j]``. It is computed for ``i`` from the end of the text down to 0; for a
    fixed ``i`` it depends only on the finished sets at later positions and on other
    rules' sets at the same ``i`` (references after an empty prefix), so it is the least
    fixpoint of the rule equations at ``i``, reached by recomputing rules whose
    references changed. This is the inductive definition of derivation itself, so it
    needs no assumption about the grammar (empty rules, nested optionals, even left
    recursion are fine)."""
    n = len(text)
    cps = [ord(c) for c in text]
    start = g.symbol_ids[root]
    reachable = _reachable(g, start)
    alts = {r: alternatives(g.rules[r]) for r in reachable}
    users: dict[int, set[int]] = {r: set() for r in reachable}
    for r in reachable:
        for alt in alts[r]:
            for item in alt:
                if isinstance(item, Ref):
                    users[item.rule].add(r)

    ends: list[dict[int, frozenset[int]]] = [{} for _ in range(n + 1)]

    def derive(r: int, i: int) -> frozenset[int]:
        result: set[int] = set()
        for alt in alts[r]:
            positions = {i}
            for item in alt:
                nxt: set[int] = set()
                for p in positions:
                    if isinstance(item, CharClass):
                        if p < n and item.matches(cps[p]):
                            nxt.add(p + 1)
                    elif isinstance(item, Ref):
                        nxt |= ends[p].get(item.rule, frozenset())
                positions = nxt
                if not positions:
                    break
            result |= positions
        return frozenset(result)

    for i in range(n, -1, -1):
        todo = deque(sorted(reachable))
        queued = set(reachable)
        while todo:
            r = todo.popleft()
            queued.discard(r)
            new = derive(r, i)
            if new != ends[i].get(r, frozenset()):
                ends[i][r] = new
                for u in users[r]:
                    if u not in queued:
                        queued.add(u)
                        todo.append(u)
    return n in ends[0].get(start, frozenset())


def _reachable(g: ParsedGrammar, start: int) -> set[int]:
    seen = {start}
    todo = [start]
    while todo:
        r = todo.pop()
        for t, v in g.rules[r]:
            if t == GreType.RULE_REF and v not in seen:
                seen.add(v)
                todo.append(v)
    return seen


class GenerationError(Exception):
    """The start rule derives no string of characters (only token elements, empty
    classes or endless recursion)."""


def _heights(alts: list[list[list[Item]]]) -> list[float]:
    """For each rule, the least depth of a finished derivation (``inf``: none)."""
    inf = float("inf")
    height = [inf] * len(alts)
    changed = True
    while changed:
        changed = False
        for r, rule_alts in enumerate(alts):
            for alt in rule_alts:
                h = _alt_height(alt, height)
                if h < height[r]:
                    height[r] = h
                    changed = True
    return height


def _alt_height(alt: list[Item], height: list[float]) -> float:
    h = 1.0
    for item in alt:
        if isinstance(item, Token):
            return float("inf")
        if isinstance(item, CharClass):
            if not item.allowed():
                return float("inf")
        else:
            h = max(h, 1 + height[item.rule])
    return h


def _pick_char(cls: CharClass, rng: random.Random) -> str:
    ranges = cls.allowed()
    printable = [(max(lo, 0x20), min(hi, 0x7E)) for lo, hi in ranges if lo <= 0x7E and hi >= 0x20]
    if printable and rng.random() < 0.7:
        ranges = printable
    lo, hi = rng.choice(ranges)
    return chr(rng.randint(lo, hi))


def generate(
    g: ParsedGrammar, rng: random.Random, root: str = "root", max_depth: int = 12, max_steps: int = 400
) -> str:
    """A random string derived from rule ``root`` of ``g``.

    Alternatives are chosen uniformly among those that can finish; past ``max_depth``
    nested rules, or after ``max_steps`` rule expansions in all, only alternatives of
    least derivation depth are taken, which always finishes. Raises
    :class:`GenerationError` when ``root`` derives no string of characters."""
    alts = [alternatives(rule) for rule in g.rules]
    height = _heights(alts)
    start = g.symbol_ids[root]
    if height[start] == float("inf"):
        raise GenerationError(f"rule {root!r} derives no string of characters")
    out: list[str] = []
    steps = 0

    def expand(r: int, depth: int) -> None:
        nonlocal steps
        steps += 1
        finite = [(a, _alt_height(a, height)) for a in alts[r]]
        finite = [(a, h) for a, h in finite if h != float("inf")]
        if depth >= max_depth or steps >= max_steps:
            least = min(h for _, h in finite)
            finite = [(a, h) for a, h in finite if h == least]
        alt, _h = rng.choice(finite)
        for item in alt:
            if isinstance(item, CharClass):
                out.append(_pick_char(item, rng))
            elif isinstance(item, Ref):
                expand(item.rule, depth + 1)

    expand(start, 0)
    return "".join(out)
