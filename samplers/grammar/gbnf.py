"""GBNF text from a parsed grammar: a printer whose output parses back to the same rules.

The parser and the checks are the project's one GBNF front end, :mod:`llama_cffi.gbnf`
(re-exported here: :func:`parse_gbnf`, :func:`check_grammar`, :class:`LeftRecursionError`).
:func:`format_gbnf` prints a grammar as GBNF that parses back to the same rules (up to a
renumbering of rule ids, see :func:`rule_renumbering`).
"""

from __future__ import annotations

from llama_cffi._args import expect
from llama_cffi.gbnf import (
    WORD_CHARS,
    GrammarError,
    GreType,
    LeftRecursionError,
    ParsedGrammar,
    Rule,
    alternatives,
    check_grammar,
    parse_gbnf,
)

__all__ = [
    "LeftRecursionError",
    "check_grammar",
    "format_gbnf",
    "parse_gbnf",
    "printed_names",
    "rule_renumbering",
]

_END = int(GreType.END)
_RULE_REF = int(GreType.RULE_REF)
_CHAR = int(GreType.CHAR)
_CHAR_NOT = int(GreType.CHAR_NOT)
_CHAR_RNG_UPPER = int(GreType.CHAR_RNG_UPPER)
_CHAR_ALT = int(GreType.CHAR_ALT)
_CHAR_ANY = int(GreType.CHAR_ANY)
_TOKEN = int(GreType.TOKEN)
_TOKEN_NOT = int(GreType.TOKEN_NOT)
_ALL_TYPES = frozenset(int(t) for t in GreType)
_UINT32_MAX = 2**32 - 1


def _is_name(name: str) -> bool:
    return bool(name) and all(c in WORD_CHARS for c in name)


def printed_names(g: ParsedGrammar) -> tuple[str, ...]:
    """The rule name :func:`format_gbnf` writes for each rule id: its own name when that
    is a valid GBNF name, else (generated names such as ``root_1``, which GBNF cannot
    spell, or no name) a fresh one derived from it."""
    expect("g", g, ParsedGrammar, "a ParsedGrammar")
    taken = {name for name in g.names if _is_name(name)}
    out: list[str] = []
    for i, name in enumerate(g.names):
        if _is_name(name):
            out.append(name)
            continue
        base = "".join(c if c in WORD_CHARS else "-" for c in name) or f"rule-{i}"
        candidate, k = base, 1
        while candidate in taken:
            candidate, k = f"{base}-{k}", k + 1
        taken.add(candidate)
        out.append(candidate)
    return tuple(out)


def _format_char(cp: int, in_class: bool, class_start: bool = False) -> str:
    """One code point as GBNF text inside a literal (``in_class=False``) or a class."""
    if not 0 <= cp <= _UINT32_MAX:
        raise GrammarError(f"character value {cp} out of range")
    if cp == 0x5C:
        return "\\\\"
    if in_class and cp in (0x5D, 0x2D, 0x5B):  # ] - [
        return "\\" + chr(cp)
    if in_class and class_start and cp == 0x5E:  # ^ right after [ would negate
        return "\\x5E"
    if not in_class and cp == 0x22:
        return '\\"'
    if cp in (9, 10, 13):
        return {9: "\\t", 10: "\\n", 13: "\\r"}[cp]
    if cp <= 0x10FFFF and not 0xD800 <= cp <= 0xDFFF and chr(cp).isprintable():
        return chr(cp)
    if cp <= 0xFF:
        return f"\\x{cp:02X}"
    if cp <= 0xFFFF:
        return f"\\u{cp:04X}"
    return f"\\U{cp:08X}"


def _format_token(g: ParsedGrammar, t: int, v: int) -> str:
    prefix = "!" if t == _TOKEN_NOT else ""
    if v >= 0:
        return f"{prefix}<[{v}]>"
    if not -len(g.token_names) <= v:
        raise GrammarError(f"named token {v} not in token_names")
    name = g.token_names[-v - 1]
    if len(name) < 2 or name[0] != "<" or name.find(">") != len(name) - 1 or name.startswith("<[") or "\0" in name:
        raise GrammarError(f"token name {name!r} cannot be written in GBNF")
    return prefix + name


def _format_alternative(g: ParsedGrammar, alt: Rule, names: tuple[str, ...]) -> str:
    parts: list[str] = []
    literal: list[str] = []
    i = 0
    while i < len(alt):
        t, v = alt[i]
        modified = i + 1 < len(alt) and alt[i + 1][0] in (_CHAR_ALT, _CHAR_RNG_UPPER)
        if t == _CHAR and not modified:  # runs of plain characters print as one literal
            literal.append(_format_char(v, in_class=False))
            i += 1
            continue
        if literal:
            parts.append('"' + "".join(literal) + '"')
            literal = []
        if t == _CHAR or t == _CHAR_NOT:
            text = ["[^" if t == _CHAR_NOT else "["]
            first = True
            while True:
                text.append(_format_char(alt[i][1], in_class=True, class_start=first and t == _CHAR))
                first = False
                i += 1
                if i < len(alt) and alt[i][0] == _CHAR_RNG_UPPER:
                    text.append("-" + _format_char(alt[i][1], in_class=True))
                    i += 1
                if not (i < len(alt) and alt[i][0] == _CHAR_ALT):
                    break
            parts.append("".join(text) + "]")
        elif t == _CHAR_ANY:
            if modified:
                raise GrammarError("CHAR_ANY followed by class modifiers cannot be written in GBNF")
            parts.append(".")
            i += 1
        elif t == _RULE_REF:
            if not 0 <= v < len(names):
                raise GrammarError(f"reference to undefined rule {v}")
            parts.append(names[v])
            i += 1
        elif t == _TOKEN or t == _TOKEN_NOT:
            parts.append(_format_token(g, t, v))
            i += 1
        else:
            raise GrammarError(f"{GreType(t).name if t in _ALL_TYPES else t} out of place")
    if literal:
        parts.append('"' + "".join(literal) + '"')
    return " ".join(parts) if parts else '""'


def format_gbnf(g: ParsedGrammar) -> str:
    """``g`` as GBNF text, one rule per line in rule-id order (like llama.cpp's
    ``print_rule``, but valid GBNF): runs of characters as ``"..."`` literals, classes as
    ``[...]``, non-printable characters as ``\\xHH``/``\\uHHHH``/``\\UHHHHHHHH``, token
    references as ``<[id]>``/``!<[id]>`` or their name, rules by :func:`printed_names`.
    ``parse_gbnf`` of the result gives the same rules up to a renumbering (see
    :func:`rule_renumbering`). :class:`GrammarError` for what GBNF cannot express."""
    expect("g", g, ParsedGrammar, "a ParsedGrammar")
    _validate_printable(g)
    names = printed_names(g)
    lines = []
    for i, rule in enumerate(g.rules):
        alts = " | ".join(_format_alternative(g, alt, names) for alt in alternatives(rule))
        lines.append(f"{names[i]} ::= {alts}\n")
    return "".join(lines)


def _validate_printable(g: ParsedGrammar) -> None:
    for i, rule in enumerate(g.rules):
        if not rule or rule[-1][0] != _END or any(t == _END for t, _v in rule[:-1]):
            raise GrammarError(f"malformed rule {i}: it must end with END (and only there)")


def rule_renumbering(original: ParsedGrammar, reparsed: ParsedGrammar) -> tuple[int, ...] | None:
    """The round-trip criterion for ``reparsed = parse_gbnf(format_gbnf(original))``.

    Returns the renumbering ``p`` (``p[i]`` is the id in ``reparsed`` of the rule printed
    for ``original``'s rule ``i``, found by its :func:`printed_names` name) when ``p`` is
    a bijection of the rule ids and, for every ``i``, ``reparsed.rules[p[i]]`` equals
    ``original.rules[i]`` with every rule reference ``r`` replaced by ``p[r]`` and named
    tokens compared by name. Then both grammars derive the same strings from every rule.
    None otherwise."""
    expect("original", original, ParsedGrammar, "a ParsedGrammar")
    expect("reparsed", reparsed, ParsedGrammar, "a ParsedGrammar")
    n = len(original.rules)
    if len(reparsed.rules) != n:
        return None
    p: list[int] = []
    for name in printed_names(original):
        if name not in reparsed.symbol_ids:
            return None
        p.append(reparsed.symbol_ids[name])
    if sorted(p) != list(range(n)):
        return None

    def canonical(g: ParsedGrammar, rule: Rule, ids: list[int] | None) -> list[tuple[int, object]]:
        out: list[tuple[int, object]] = []
        for t, v in rule:
            if t == _RULE_REF:
                out.append((t, ids[v] if ids is not None else v))
            elif t in (_TOKEN, _TOKEN_NOT) and v < 0:
                out.append((t, g.token_names[-v - 1]))
            else:
                out.append((t, v))
        return out

    for i in range(n):
        if canonical(original, original.rules[i], p) != canonical(reparsed, reparsed.rules[p[i]], None):
            return None
    return tuple(p)
