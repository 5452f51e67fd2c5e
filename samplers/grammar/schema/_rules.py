"""The GBNF being written: named rules (identical bodies share one name), GBNF literals
and character classes."""

from __future__ import annotations

import re

__all__ = ["RuleSet", "char_class", "literal"]

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


class RuleSet:
    """Rules by name. :meth:`add` returns the name of a rule with the given body,
    reusing an existing rule with the same body; :meth:`reserve` / :meth:`define` name a
    rule before its body exists (recursion)."""

    def __init__(self, max_rules: int = 20000) -> None:
        self.bodies: dict[str, str] = {}
        self.by_body: dict[str, str] = {}
        self.max_rules = max_rules
        self._taken: set[str] = {"root"}

    def fresh(self, hint: str) -> str:
        base = _NAME_RE.sub("-", hint).strip("-").lower()[:40] or "r"
        name, k = base, 1
        while name in self._taken:
            name = f"{base}-{k}"
            k += 1
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
        """Define a helper rule under its own fixed ``name`` (once)."""
        if name not in self.bodies:
            self._taken.add(name)
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
