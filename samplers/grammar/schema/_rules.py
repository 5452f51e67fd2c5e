"""The GBNF being written: named rules (identical bodies share one name), GBNF literals
and character classes."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Hashable
from typing import Any

from ._budget import TooLarge

__all__ = ["FIXED_NAMES", "RuleSet", "automaton", "char_class", "literal"]

_NAME_RE = re.compile(r"[^a-zA-Z0-9-]+")


def _esc(cp: int) -> str:
    c = chr(cp)
    if c in '\\]["':
        return "\\" + c
    if c in "-^":
        return f"\\x{cp:02X}"
    if 0x20 <= cp < 0x7F:
        return c
    if cp <= 0xFF:
        return f"\\x{cp:02X}"
    if cp <= 0xFFFF:
        return f"\\u{cp:04X}"
    return f"\\U{cp:08X}"


def char_class(ivs: tuple[tuple[int, int], ...]) -> str:
    """A GBNF class (``[a-z\\u00E9]``) of non-empty inclusive code-point intervals."""
    if not ivs:
        raise ValueError("an empty character class")
    parts = []
    for lo, hi in ivs:
        if lo == hi:
            parts.append(_esc(lo))
        elif hi == lo + 1:
            parts.append(_esc(lo) + _esc(hi))
        else:
            parts.append(f"{_esc(lo)}-{_esc(hi)}")
    return "[" + "".join(parts) + "]"


def literal(text: str) -> str:
    """``text`` as a GBNF literal."""
    out = []
    for c in text:
        cp = ord(c)
        if c in '"\\':
            out.append("\\" + c)
        elif 0x20 <= cp < 0x7F:
            out.append(c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        else:
            out.append(_esc(cp))
    return '"' + "".join(out) + '"'


#: rule names defined under their own fixed names (shared helpers): never handed out by
#: :meth:`RuleSet.fresh`, so a schema's names (``_hint`` of a property called ``ws``)
#: cannot take them
FIXED_NAMES = frozenset(
    {
        "root",
        "ws",
        "json-value",
        "json-string",
        "json-number",
        "json-object",
        "json-array",
        "json-u-non-ascii",
        "json-escape",
        "dec-octet",
        "ipv4",
        "h16",
        "hostname-label",
        "uri-char",
    }
)


@functools.lru_cache(maxsize=4096)
def _base_name(hint: str) -> str:
    """The rule name a hint gives (before any number that makes it unique): runs of
    characters other than letters, digits and ``-`` as one ``-``, lower case, at most 40
    characters (``r`` when nothing is left)."""
    return _NAME_RE.sub("-", hint).strip("-").lower()[:40] or "r"


class RuleSet:
    """Rules by name. :meth:`add` returns the name of a rule with the given body,
    reusing an existing rule with the same body; :meth:`reserve` / :meth:`define` name a
    rule before its body exists (recursion). ``memo`` keeps what a grammar builds once
    (shared automata) by the caller's key."""

    def __init__(self, max_rules: int = 20000) -> None:
        self.bodies: dict[str, str] = {}
        self.by_body: dict[str, str] = {}
        self.max_rules = max_rules
        self.memo: dict[Any, Any] = {}
        self._taken: set[str] = set(FIXED_NAMES)
        self._next: dict[str, int] = {}

    def fresh(self, hint: str) -> str:
        base = _base_name(hint)
        taken = self._taken
        name = base
        if name in taken:
            k = self._next.get(base, 1)
            name = f"{base}-{k}"
            while name in taken:
                k += 1
                name = f"{base}-{k}"
            self._next[base] = k + 1
        taken.add(name)
        if len(taken) > self.max_rules:
            raise TooLarge(f"the grammar would have over {self.max_rules} rules")
        return name

    def add(self, hint: str, body: str) -> str:
        hit = self.by_body.get(body)
        if hit is not None:
            return hit
        name = self.fresh(hint)
        self.bodies[name] = body
        self.by_body[body] = name
        return name

    def fixed(self, name: str, body: str) -> str:
        """Define a shared helper rule under its own fixed ``name`` (one of
        :data:`FIXED_NAMES`), once."""
        if name not in FIXED_NAMES:
            raise ValueError(f"{name!r} is not a fixed rule name")
        if name not in self.bodies:
            self.bodies[name] = body
        return name

    def reserve(self, hint: str) -> str:
        return self.fresh(hint)

    def define(self, name: str, body: str) -> None:
        self.bodies[name] = body
        self.by_body.setdefault(body, name)

    def text(self, root_body: str) -> str:
        lines = [f"root ::= {root_body}"]
        lines += [f"{name} ::= {body}" for name, body in sorted(self.bodies.items())]
        return "\n".join(lines) + "\n"


State = Hashable
Step = Callable[[Any], list[tuple[str, Any]]]


def automaton(
    rs: RuleSet, prefix: str, start: State, step: Step, label: Callable[[Any], str] | None = None
) -> str | None:
    """Define the rules of a finite automaton and return its start rule's name (None when
    it accepts nothing). ``step(state)`` lists the state's transitions, each a (GBNF item,
    next state) pair; None as the next state means "accept after the item". Only the
    states reachable from ``start`` are built, and of them only those that can accept get
    rules (a rule per state, named ``<prefix>-<label>``: ``label(state)``, by default the
    state's parts joined by ``-``, booleans as ``f``/``n``)."""
    # the states by number (in the order met), each with its transitions
    number: dict[State, int] = {}
    states: list[State] = []
    outs: list[list[tuple[str, Any]]] = []
    todo = [start]
    max_rules = rs.max_rules
    while todo:
        cur = todo.pop()
        if cur in number:
            continue
        number[cur] = len(states)
        states.append(cur)
        out = step(cur)
        outs.append(out)
        for _, nxt in out:
            if nxt is not None and nxt not in number:
                todo.append(nxt)
                if len(states) + len(todo) > max_rules:
                    raise TooLarge(f"an automaton of over {max_rules} states")
    # each transition's target a number (-1: accept): the passes below index lists
    # instead of hashing states again
    targets = [[(item, -1 if nxt is None else number[nxt]) for item, nxt in out] for out in outs]
    # the states that can accept: backwards from the accepting transitions
    back: list[list[int]] = [[] for _ in targets]
    live = [False] * len(targets)
    todo_live: list[int] = []
    for i, out in enumerate(targets):
        for _, t in out:
            if t < 0:
                if not live[i]:
                    live[i] = True
                    todo_live.append(i)
            else:
                back[t].append(i)
    while todo_live:
        for prev in back[todo_live.pop()]:
            if not live[prev]:
                live[prev] = True
                todo_live.append(prev)
    if not live[0]:  # the start state
        return None
    name_of = label or _label
    fresh = rs.fresh
    names = [fresh(f"{prefix}-{name_of(s)}") if alive else "" for s, alive in zip(states, live, strict=True)]
    define = rs.define
    for i, out in enumerate(targets):
        if not live[i]:
            continue
        body = []
        for item, t in out:
            if t < 0:
                body.append(item or '""')
            elif live[t]:
                body.append(f"{item} {names[t]}" if item else names[t])
        define(names[i], " | ".join(dict.fromkeys(body)))
    return names[0]


def _label(state: State) -> str:
    """A state's part of its rule name (see :func:`automaton`)."""
    if isinstance(state, tuple):
        return "-".join([_label(x) for x in state])
    if state is True:
        return "f"
    if state is False:
        return "n"
    return str(state)


def triple_label(state: tuple[int, int, bool]) -> str:
    """:func:`automaton`'s default label of a state (int, int, bool), written at once."""
    return f"{state[0]}-{state[1]}-{'f' if state[2] else 'n'}"


#: counts up to this are written as GBNF repetitions (``x{m,n}``, a named rule shared by
#: every identical repetition); llama.cpp's parser expands one into about ``n`` rules
SMALL = 15
#: larger counts go through shared rules in this base: blocks of ``BASE**j`` items and
#: "up to k" rules whose number grows with the digits of ``k``, not with ``k``
BASE = 16
#: the largest count :func:`repeat` writes exactly (beyond: :class:`OverflowError`)
MAX_COUNT = 10**9
_NAME_ONLY = re.compile(r"[a-zA-Z0-9-]+")


def quantifier(lo: int, hi: int | None) -> str:
    """``*``, ``+``, ``?``, ``{m}``, ``{m,}`` or ``{m,n}``."""
    if hi is None:
        return "*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}"
    if (lo, hi) == (0, 1):
        return "?"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


def repeat(rs: RuleSet, item: str, lo: int, hi: int | None) -> str:
    """GBNF for ``lo`` to ``hi`` (None: any number of) repetitions of ``item``, exact for
    counts up to :data:`MAX_COUNT` (beyond: :class:`OverflowError`).

    llama.cpp's parser expands ``x{m,n}`` into about ``n`` rules (and reads a count above
    2000 as "no maximum"), so only counts up to :data:`SMALL` are written that way. A
    larger count is ``x{lo}`` (blocks of ``BASE**j`` items, each a rule) followed by "up
    to k more": ``U(k) ::= X(BASE**j) U(k - BASE**j) | U(BASE**j - 1)`` with ``BASE**j``
    the largest block within ``k`` (unambiguous: the first alternative is for lengths of
    at least a block). The rules are shared by every repetition of the same item in the
    grammar, so a schema's many ``maxLength`` bounds cost a few dozen rules each."""
    if hi is not None and hi < lo:
        raise ValueError(f"{hi} < {lo}")
    if hi == 0:
        return '""'
    if lo <= SMALL and (hi is None or hi <= SMALL):
        if hi is None or hi <= 1 or lo == hi:
            return f"{item}{quantifier(lo, hi)}"  # at most one generated rule
        return rs.add("rep", f"{item}{quantifier(lo, hi)}")
    if lo > MAX_COUNT or (hi is not None and hi > MAX_COUNT):
        raise OverflowError(f"a repetition count over {MAX_COUNT}")
    unit = item if _NAME_ONLY.fullmatch(item) else rs.add("item", item)
    parts = [_times(rs, unit, lo)] if lo else []
    if hi is None:
        parts.append(f"{unit}*")
    elif hi > lo:
        parts.append(_upto(rs, unit, hi - lo))
    return " ".join(parts)


def _block(rs: RuleSet, unit: str, j: int) -> str:
    """A rule for exactly ``BASE**j`` repetitions of ``unit``."""
    if j == 0:
        return unit
    key = ("block", unit, j)
    hit = rs.memo.get(key)
    if hit is None:
        hit = rs.memo[key] = rs.add(f"{unit}-x{BASE**j}", f"{_block(rs, unit, j - 1)}{{{BASE}}}")
    return str(hit)


def _times(rs: RuleSet, unit: str, m: int) -> str:
    """Exactly ``m`` repetitions of ``unit``: each base-``BASE`` digit of ``m`` as that
    many blocks, inline."""
    if m <= SMALL:
        return f"{unit}{{{m}}}" if m > 1 else unit
    parts = []
    j = 0
    while m:
        m, d = divmod(m, BASE)
        if d:
            b = _block(rs, unit, j)
            parts.append(b if d == 1 else f"{b}{{{d}}}")
        j += 1
    return " ".join(reversed(parts))


def _upto(rs: RuleSet, unit: str, k: int) -> str:
    """A rule for 0 to ``k`` (>= 1) repetitions of ``unit``."""
    key = ("upto", unit, k)
    hit = rs.memo.get(key)
    if hit is not None:
        return str(hit)
    name = rs.fresh(f"{unit}-upto-{k}")
    rs.memo[key] = name
    if k < BASE:
        body = f'{unit} {_upto(rs, unit, k - 1)} | ""' if k > 1 else f'{unit} | ""'
    else:
        j = 0
        while BASE ** (j + 1) <= k:
            j += 1
        size = BASE**j
        rest = f" {_upto(rs, unit, k - size)}" if k > size else ""
        body = f"{_block(rs, unit, j)}{rest} | {_upto(rs, unit, size - 1)}"
    rs.define(name, body)
    return name
