"""The GBNF being written: named rules (identical bodies share one name), GBNF literals
and character classes."""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable
from typing import Any

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
        base = _NAME_RE.sub("-", hint).strip("-").lower()[:40] or "r"
        name = base
        if name in self._taken:
            k = self._next.get(base, 1)
            while f"{base}-{k}" in self._taken:
                k += 1
            self._next[base] = k + 1
            name = f"{base}-{k}"
        self._taken.add(name)
        if len(self._taken) > self.max_rules:
            raise OverflowError(f"the grammar would have over {self.max_rules} rules")
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


def automaton(rs: RuleSet, prefix: str, start: State, step: Step, accept: Any = None) -> str | None:
    """Define the rules of a finite automaton and return its start rule's name (None when
    it accepts nothing). ``step(state)`` lists the state's transitions, each a (GBNF item,
    next state) pair; ``accept`` as the next state means "accept after the item". Only the
    states reachable from ``start`` are built, and of them only those that can accept get
    rules (a rule per state, named ``<prefix>-<state>``)."""
    edges: dict[State, list[tuple[str, Any]]] = {}
    todo = [start]
    while todo:
        cur = todo.pop()
        if cur in edges:
            continue
        out = step(cur)
        edges[cur] = out
        for _, nxt in out:
            if nxt != accept and nxt not in edges:
                todo.append(nxt)
                if len(edges) + len(todo) > rs.max_rules:
                    raise OverflowError(f"an automaton of over {rs.max_rules} states")
    # the states that can accept: backwards from the accepting transitions
    back: dict[State, list[State]] = {}
    live: set[State] = set()
    todo = []
    for s, out in edges.items():
        for _, nxt in out:
            if nxt == accept:
                if s not in live:
                    live.add(s)
                    todo.append(s)
            else:
                back.setdefault(nxt, []).append(s)
    while todo:
        for prev in back.get(todo.pop(), ()):
            if prev not in live:
                live.add(prev)
                todo.append(prev)
    if start not in live:
        return None
    names = {s: rs.fresh(f"{prefix}-{_label(s)}") for s in edges if s in live}
    for s, name in names.items():
        body = []
        for item, nxt in edges[s]:
            if nxt == accept:
                body.append(item or '""')
            elif nxt in live:
                body.append(f"{item} {names[nxt]}".strip())
        rs.define(name, " | ".join(dict.fromkeys(body)))
    return names[start]


def _label(state: State) -> str:
    if isinstance(state, tuple):
        return "-".join(_label(x) for x in state)
    if isinstance(state, bool):
        return "f" if state else "n"
    return str(state)


#: a repetition count GBNF writes directly; larger ones go through named chunks of this many
CHUNK = 1000
#: the largest count :func:`repeat` writes (llama.cpp's parser caps a count at 2000, so the
#: chunks are themselves repeated at most 2000 times)
MAX_COUNT = 2000 * CHUNK


def quantifier(lo: int, hi: int | None) -> str:
    """``*``, ``+``, ``?``, ``{m}``, ``{m,}`` or ``{m,n}`` for counts up to :data:`CHUNK`."""
    if hi is None:
        return "*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}"
    if (lo, hi) == (0, 1):
        return "?"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


def repeat(rs: RuleSet, item: str, lo: int, hi: int | None) -> str:
    """GBNF for ``lo`` to ``hi`` (None: any number of) repetitions of ``item``, exact for
    counts up to :data:`MAX_COUNT` (beyond: :class:`OverflowError`). llama.cpp's parser
    reads a count above 2000 as "no maximum" and refuses a minimum above it, so large
    counts are written as named rules of :data:`CHUNK` items, repeated."""
    if hi is not None and hi < lo:
        raise ValueError(f"{hi} < {lo}")
    if hi == 0:
        return '""'
    if lo <= CHUNK and (hi is None or hi <= CHUNK):
        return f"{item}{quantifier(lo, hi)}"
    if lo > MAX_COUNT or (hi is not None and hi > MAX_COUNT):
        raise OverflowError(f"a repetition count over {MAX_COUNT}")
    unit = rs.add("item", item)
    parts = []
    q, r = divmod(lo, CHUNK)
    if q:
        chunk = rs.add("chunk", f"{unit}{{{CHUNK}}}")
        parts.append(chunk if q == 1 else f"{chunk}{{{q}}}")
    rest = None if hi is None else hi - q * CHUNK
    if rest is None or rest <= CHUNK:
        if rest != 0:
            parts.append(f"{unit}{quantifier(r, rest)}")
    else:
        if r:
            parts.append(f"{unit}{{{r}}}")
        n = rest - r  # 0..n more
        levels = -(-n // CHUNK)
        cur = f"{unit}{{0,{n - (levels - 1) * CHUNK}}}"
        for _ in range(levels - 1):
            cur = rs.add("upto", f"{unit}{{{CHUNK}}} {cur} | {unit}{{0,{CHUNK - 1}}}")
        parts.append(cur)
    return " ".join(p for p in parts if p) or '""'
