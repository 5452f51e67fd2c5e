"""Deterministic automata over code points, for what a grammar cannot say by itself
about strings: the complement of a pattern (``not``, keys outside ``patternProperties``),
the intersection of several (two patterns, ``propertyNames`` and a pattern, a pattern and
a length), and "any key but these names".

A :class:`DFA` has its states numbered from 0 (the start); ``edges[s]`` lists
(code-point intervals, next state), the intervals of a state disjoint; a missing
transition rejects. Built from :mod:`.regex` trees (an anchored tree: whole strings) by
the subset construction, with at most ``max_states`` states (:class:`OverflowError`
beyond).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from ._regex import (
    ANY,
    Alt,
    Anchor,
    CharSet,
    Intervals,
    Node,
    Repeat,
    Seq,
    anchored,
    complement,
    intersect,
    norm,
    parse,
)
from ._rules import RuleSet

__all__ = ["DFA", "MAX_STATES", "from_regex", "length", "literals", "pattern"]

MAX_STATES = 600
#: automata with more states are written as built (see :func:`to_gbnf`)
MINIMIZE_MAX = 16


@dataclass
class DFA:
    edges: list[list[tuple[Intervals, int]]]
    accepting: set[int]

    def accepts(self, text: str) -> bool:
        s = 0
        for c in text:
            cp = ord(c)
            for ivs, nxt in self.edges[s]:
                if any(lo <= cp <= hi for lo, hi in ivs):
                    s = nxt
                    break
            else:
                return False
        return s in self.accepting

    def complement(self) -> DFA:
        """Every string this DFA rejects (a dead state completes the transitions)."""
        dead = len(self.edges)
        edges = []
        for row in [*self.edges, []]:
            covered = norm([iv for ivs, _ in row for iv in ivs])
            rest = complement(covered)
            edges.append([*row, (rest, dead)] if rest else list(row))
        accepting = {s for s in range(len(edges)) if s not in self.accepting}
        return DFA(edges, accepting).trimmed()

    def intersect(self, other: DFA, max_states: int = MAX_STATES) -> DFA:
        index = {(0, 0): 0}
        order = [(0, 0)]
        edges: list[list[tuple[Intervals, int]]] = []
        i = 0
        while i < len(order):
            a, b = order[i]
            row = []
            for ia, na in self.edges[a]:
                for ib, nb in other.edges[b]:
                    both = intersect(ia, ib)
                    if both:
                        key = (na, nb)
                        if key not in index:
                            if len(order) >= max_states:
                                raise OverflowError(f"an automaton of over {max_states} states")
                            index[key] = len(order)
                            order.append(key)
                        row.append((both, index[key]))
            edges.append(row)
            i += 1
        acc = {index[k] for k in order if k[0] in self.accepting and k[1] in other.accepting}
        return DFA(edges, acc).trimmed()

    def empty(self) -> bool:
        return not self.accepting

    def trimmed(self) -> DFA:
        """Only the states that are reachable and can reach an accepting state."""
        len(self.edges)
        reach = {0}
        stack = [0]
        while stack:
            s = stack.pop()
            for _, t in self.edges[s]:
                if t not in reach:
                    reach.add(t)
                    stack.append(t)
        live = set(self.accepting & reach)
        changed = True
        while changed:
            changed = False
            for s in reach - live:
                if any(t in live for _, t in self.edges[s]):
                    live.add(s)
                    changed = True
        if 0 not in live:
            return DFA([[]], set())
        keep = [0, *sorted(live - {0})]
        new = {s: i for i, s in enumerate(keep)}
        edges = [[(ivs, new[t]) for ivs, t in self.edges[s] if t in live] for s in keep]
        return DFA(edges, {new[s] for s in self.accepting if s in live})

    def minimized(self) -> DFA:
        """The equivalent DFA with the fewest states (Moore's partition refinement; the
        start stays state 0, edges to one state merged into one interval set). A pattern
        searched anywhere in a key (``\\w``: ``.*\\w.*``) comes out of the subset
        construction with states that accept the same rest: as grammar rules, a parser
        state per copy, and the mask walk cannot follow the key's characters as one loop."""
        n = len(self.edges)
        block = [1 if s in self.accepting else 0 for s in range(n)]
        n_blocks = len(set(block))
        while True:
            sigs: dict[tuple[object, ...], int] = {}
            new = []
            for s in range(n):
                by: dict[int, list[tuple[int, int]]] = {}
                for ivs, t in self.edges[s]:
                    by.setdefault(block[t], []).extend(ivs)
                sig = (block[s], *sorted((b, norm(ivs)) for b, ivs in by.items()))
                new.append(sigs.setdefault(sig, len(sigs)))
            block = new
            if len(sigs) == n_blocks:
                break
            n_blocks = len(sigs)
        if n_blocks == n:
            return self
        order = {block[0]: 0}  # renumbered in the order met from the start: 0 first
        for b in block:
            order.setdefault(b, len(order))
        edges: list[list[tuple[Intervals, int]]] = [[] for _ in range(n_blocks)]
        done = [False] * n_blocks
        for s in range(n):
            b = order[block[s]]
            if done[b]:
                continue
            done[b] = True
            by2: dict[int, list[tuple[int, int]]] = {}
            for ivs, t in self.edges[s]:
                by2.setdefault(order[block[t]], []).extend(ivs)
            edges[b] = [(norm(ivs), t) for t, ivs in by2.items()]
        return DFA(edges, {order[block[s]] for s in self.accepting})


# --- NFA (Thompson) and the subset construction -------------------------------------


class _NFA:
    def __init__(self) -> None:
        self.eps: list[list[int]] = []
        self.moves: list[list[tuple[Intervals, int]]] = []

    def state(self) -> int:
        self.eps.append([])
        self.moves.append([])
        return len(self.eps) - 1

    def build(self, node: Node, start: int, end: int, budget: list[int]) -> None:
        budget[0] -= 1
        if budget[0] < 0:
            raise OverflowError("a pattern too large for an automaton")
        if isinstance(node, CharSet):
            self.moves[start].append((node.ivs, end))
        elif isinstance(node, Seq):
            cur = start
            for i, it in enumerate(node.items):
                nxt = end if i == len(node.items) - 1 else self.state()
                self.build(it, cur, nxt, budget)
                cur = nxt
            if not node.items:
                self.eps[start].append(end)
        elif isinstance(node, Alt):
            for it in node.items:
                self.build(it, start, end, budget)
        elif isinstance(node, Repeat):
            cur = start
            for _ in range(node.min):
                nxt = self.state()
                self.build(node.item, cur, nxt, budget)
                cur = nxt
            if node.max is None:
                loop = self.state()
                self.eps[cur].append(loop)
                self.build(node.item, loop, loop, budget)
                self.eps[loop].append(end)
            else:
                self.eps[cur].append(end)
                for _ in range(node.max - node.min):
                    nxt = self.state()
                    self.build(node.item, cur, nxt, budget)
                    self.eps[nxt].append(end)
                    cur = nxt
        elif isinstance(node, Anchor):
            raise ValueError("anchors are removed by regex.anchored")
        else:
            raise TypeError(node)

    def closure(self, states: frozenset[int]) -> frozenset[int]:
        out = set(states)
        stack = list(states)
        while stack:
            s = stack.pop()
            for t in self.eps[s]:
                if t not in out:
                    out.add(t)
                    stack.append(t)
        return frozenset(out)


def _universal(nfa: _NFA, end: int) -> set[int]:
    """The NFA states from which every string is accepted: a state whose moves to itself
    cover every code point and whose closure reaches ``end`` (a searched pattern's
    trailing ``.*``). A subset holding one accepts everything, whatever else it holds."""
    out = set()
    for s, moves in enumerate(nfa.moves):
        own = [iv for ivs, t in moves if t == s for iv in ivs]
        if own and norm(own) == ANY.ivs and end in nfa.closure(frozenset({s})):
            out.add(s)
    return out


def _step(moves: list[tuple[Intervals, int]]) -> list[tuple[tuple[int, int], frozenset[int]]]:
    """The moves of a subset of states split into disjoint pieces, each with the set of
    states it leads to. Moves on one interval set go together, and the pieces of a
    combination of sets are swept once per process (:func:`_sweep`): a counted word
    (``(\\S+\\s+){0,49}``) makes ~100 subsets of many moves, all on the same two sets of
    20 intervals."""
    by_set: dict[Intervals, list[int]] = {}
    for ivs, t in moves:
        by_set.setdefault(ivs, []).append(t)
    keys = tuple(sorted(by_set))
    targets: dict[tuple[int, ...], frozenset[int]] = {}  # per combination of sets
    out: list[tuple[tuple[int, int], frozenset[int]]] = []
    for piece, groups in _sweep(keys):
        ts = targets.get(groups)
        if ts is None:
            ts = targets[groups] = frozenset(t for g in groups for t in by_set[keys[g]])
        out.append((piece, ts))
    return out


@functools.lru_cache(maxsize=4096)
def _sweep(sets: tuple[Intervals, ...]) -> tuple[tuple[tuple[int, int], tuple[int, ...]], ...]:
    """The disjoint pieces that interval sets split the code points into, each with the
    sets (their indexes, increasing) that hold it: a sweep over the intervals' ends, not a
    scan of every set per piece (a subset of a searched pattern holds many)."""
    events: list[tuple[int, int, int]] = []
    for g, ivs in enumerate(sets):
        for lo, hi in ivs:
            events.append((lo, 1, g))
            events.append((hi + 1, -1, g))
    events.sort()
    active: dict[int, int] = {}
    out: list[tuple[tuple[int, int], tuple[int, ...]]] = []
    i, n = 0, len(events)
    while i < n:
        at = events[i][0]
        while i < n and events[i][0] == at:
            _, d, g = events[i]
            c = active.get(g, 0) + d
            if c:
                active[g] = c
            else:
                del active[g]
            i += 1
        if active and i < n:
            out.append(((at, events[i][0] - 1), tuple(sorted(active))))
    return tuple(out)


def from_regex(node: Node, max_states: int = MAX_STATES) -> DFA:
    """The DFA of an anchored regex tree (whole strings). Subsets that hold a state of
    :func:`_universal` are one state (they all accept every rest): a pattern searched
    anywhere (``a{40}`` unanchored) would otherwise count on past its match in every
    alternative still in flight, hundreds of states where tens say the same."""
    nfa = _NFA()
    start, end = nfa.state(), nfa.state()
    nfa.build(node, start, end, [max_states * 20])
    universal = _universal(nfa, end)
    every: frozenset[int] | None = None

    def canon(states: frozenset[int]) -> frozenset[int]:
        nonlocal every
        closed = nfa.closure(states)
        if universal and not universal.isdisjoint(closed):
            if every is None:
                every = nfa.closure(frozenset({min(universal & closed)}))
            return every
        return closed

    first = canon(frozenset({start}))
    index = {first: 0}
    order = [first]
    edges: list[list[tuple[Intervals, int]]] = []
    i = 0
    while i < len(order):
        cur = order[i]
        by_target: dict[frozenset[int], list[tuple[int, int]]] = {}
        seen: dict[frozenset[int], frozenset[int]] = {}
        for piece, targets in _step([m for s in cur for m in nfa.moves[s]]):
            closed = seen.get(targets)
            if closed is None:
                closed = seen[targets] = canon(targets)
            by_target.setdefault(closed, []).append(piece)
        row = []
        for target, pieces in by_target.items():
            if target not in index:
                if len(order) >= max_states:
                    raise OverflowError(f"an automaton of over {max_states} states")
                index[target] = len(order)
                order.append(target)
            row.append((norm(pieces), index[target]))
        edges.append(row)
        i += 1
    return DFA(edges, {index[s] for s in order if end in s}).trimmed()


def pattern(p: str) -> DFA:
    """The DFA of the strings the ECMA-262 pattern ``p`` is found in (``from_regex`` of
    the anchored parse, :data:`MAX_STATES`), kept per process (the 1,024 last used; the
    lowering's key matches read it too): a schema meets its patterns
    again in each product, class and key automaton they enter (Github_hard o3895: 11
    patterns, 93 constructions, one an alternation of 600 literals). Raises what the
    parse or the construction raises, each time. The DFA is shared: not to be changed."""
    d, error, args = _pattern(p)
    if d is None:
        assert error is not None
        raise error(*args)
    return d


@functools.lru_cache(maxsize=1024)
def _pattern(p: str) -> tuple[DFA | None, type[Exception] | None, tuple[object, ...]]:
    try:
        return from_regex(anchored(parse(p))), None, ()
    except (ValueError, OverflowError) as e:  # (RegexSyntaxError, RegexUnsupported are ValueErrors)
        return None, type(e), e.args


def literals(words: list[str]) -> DFA:
    """Exactly the given strings (a trie)."""
    edges: list[list[tuple[Intervals, int]]] = [[]]
    children: list[dict[int, int]] = [{}]
    acc = set()
    for w in words:
        s = 0
        for c in w:
            cp = ord(c)
            if cp not in children[s]:
                children.append({})
                edges.append([])
                children[s][cp] = len(edges) - 1
                edges[s].append((((cp, cp),), len(edges) - 1))
            s = children[s][cp]
        acc.add(s)
    return DFA(edges, acc)


def length(lo: int, hi: int | None, max_states: int = MAX_STATES) -> DFA:
    """Strings of ``lo`` to ``hi`` (None: any number of) characters."""
    n = (hi if hi is not None else lo) + 1
    if n > max_states:
        raise OverflowError(f"an automaton of over {max_states} states")
    anyc = ANY.ivs
    edges: list[list[tuple[Intervals, int]]] = [[(anyc, i + 1)] if (hi is None or i < hi) else [] for i in range(n)]
    if hi is None:
        edges[n - 1] = [(anyc, n - 1)]
    return DFA(edges, {i for i in range(n) if i >= lo})


def to_gbnf(dfa: DFA, rs: RuleSet, prefix: str, char_rule: Callable[[RuleSet, Intervals], str]) -> str:
    """Define one rule per state (``char_rule(rs, intervals)`` names a character rule)
    and return the start rule's name; each rule ends at the closing quote. An automaton
    of at most :data:`MINIMIZE_MAX` states is minimized first (:meth:`DFA.minimized`:
    a pattern searched in a key). Moore's refinement takes a round per state down a
    chain, about 1 ms for a pattern's count ``{0,30}``, and such long ones (lengths,
    counts) are chains already minimal."""
    if len(dfa.edges) <= MINIMIZE_MAX:
        dfa = dfa.minimized()
    names = [rs.reserve(f"{prefix}-s{i}") for i in range(len(dfa.edges))]
    for s, row in enumerate(dfa.edges):
        alts = [f"{char_rule(rs, ivs)} {names[t]}" for ivs, t in row]
        if s in dfa.accepting:
            alts.append('"\\""')
        rs.define(names[s], " | ".join(alts))
    return names[0]
