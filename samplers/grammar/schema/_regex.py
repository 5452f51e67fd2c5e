"""ECMA-262 regular expressions (JSON Schema's ``pattern`` dialect) parsed into a small
tree of code-point sets, sequences, alternatives and repetitions.

A JSON Schema ``pattern`` is searched for, not matched whole: ``"a+"`` accepts ``"xax"``.
:func:`parse` keeps the anchors ``^`` and ``$`` as nodes; :func:`anchored` turns a tree
into the language of whole strings it accepts (unanchored ends get "any string").
Without the ``u`` flag ECMA's ``.`` and classes work on UTF-16 code units; JSON Schema
validators (and Python's ``re``, which ``jsonschema`` uses) work on code points, and so
does this module.

What has no regular-language meaning (backreferences, lookaround) raises
:class:`RegexUnsupported`; malformed syntax raises :class:`RegexSyntaxError`.
"""

from __future__ import annotations

import functools
import unicodedata
from dataclasses import dataclass

__all__ = [
    "ANY",
    "Alt",
    "Anchor",
    "CharSet",
    "Node",
    "RegexSyntaxError",
    "RegexUnsupported",
    "Repeat",
    "Seq",
    "anchored",
    "nonempty",
    "nullable",
    "parse",
]

MAX_CP = 0x10FFFF
Intervals = tuple[tuple[int, int], ...]


class RegexSyntaxError(ValueError):
    """Not a valid regular expression."""


class RegexUnsupported(ValueError):
    """A valid regular expression with no regular-language meaning here (named)."""


def norm(ivs: list[tuple[int, int]] | Intervals) -> Intervals:
    """Sorted, merged, inclusive intervals."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ivs):
        if lo > hi:
            continue
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)


def complement(ivs: Intervals) -> Intervals:
    out, prev = [], 0
    for lo, hi in ivs:
        if lo > prev:
            out.append((prev, lo - 1))
        prev = hi + 1
    if prev <= MAX_CP:
        out.append((prev, MAX_CP))
    return tuple(out)


def intersect(a: Intervals, b: Intervals) -> Intervals:
    if b == ANY.ivs:  # (a length's automaton: every edge is of every character)
        return a
    if a == ANY.ivs:
        return b
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


@dataclass(frozen=True)
class CharSet:
    """One character from a set of code points."""

    ivs: Intervals

    def __contains__(self, cp: int) -> bool:
        return any(lo <= cp <= hi for lo, hi in self.ivs)


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat:
    item: Node
    min: int
    max: int | None  # None: unbounded


@dataclass(frozen=True)
class Anchor:
    start: bool  # True: ``^``, False: ``$``


Node = CharSet | Seq | Alt | Repeat | Anchor

ANY = CharSet(((0, MAX_CP),))
#: ECMA ``.``: anything but a line terminator
DOT = CharSet(complement(norm([(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)])))
DIGIT = norm([(0x30, 0x39)])
WORD = norm([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
SPACE = norm(
    [
        (0x09, 0x0D),
        (0x20, 0x20),
        (0xA0, 0xA0),
        (0x1680, 0x1680),
        (0x2000, 0x200A),
        (0x2028, 0x2029),
        (0x202F, 0x202F),
        (0x205F, 0x205F),
        (0x3000, 0x3000),
        (0xFEFF, 0xFEFF),
    ]
)
_CLASS_ESCAPES = {"d": DIGIT, "w": WORD, "s": SPACE}
_CHAR_ESCAPES = {"t": 9, "n": 10, "v": 11, "f": 12, "r": 13, "0": 0}
_CATEGORY_NAMES = {
    "Letter": "L",
    "Cased_Letter": "LC",
    "Uppercase_Letter": "Lu",
    "Lowercase_Letter": "Ll",
    "Titlecase_Letter": "Lt",
    "Modifier_Letter": "Lm",
    "Other_Letter": "Lo",
    "Mark": "M",
    "Number": "N",
    "Decimal_Number": "Nd",
    "digit": "Nd",
    "Letter_Number": "Nl",
    "Other_Number": "No",
    "Punctuation": "P",
    "punct": "P",
    "Symbol": "S",
    "Separator": "Z",
    "Space_Separator": "Zs",
    "Other": "C",
    "Control": "Cc",
    "cntrl": "Cc",
}


@functools.cache
def category(name: str) -> Intervals:
    """The code points of a Unicode general category (``L``, ``Lu``, ``Nd``, ... or a long name)."""
    cat = _CATEGORY_NAMES.get(name.replace("General_Category=", "").replace("gc=", ""), name)
    if cat == "LC":
        return norm([*category("Lu"), *category("Ll"), *category("Lt")])
    if not (1 <= len(cat) <= 2 and cat[0] in "LMNPSZC"):
        raise RegexUnsupported(f"unknown Unicode property \\p{{{name}}}")
    out: list[tuple[int, int]] = []
    for cp in range(MAX_CP + 1):
        c = unicodedata.category(chr(cp))
        if c == cat or (len(cat) == 1 and c[0] == cat):
            if out and out[-1][1] == cp - 1:
                out[-1] = (out[-1][0], cp)
            else:
                out.append((cp, cp))
    return tuple(out)


class _Parser:
    def __init__(self, src: str) -> None:
        self.s = src
        self.i = 0

    def error(self, msg: str) -> RegexSyntaxError:
        return RegexSyntaxError(f"{msg} at position {self.i} of /{self.s}/")

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def take(self) -> str:
        if self.i >= len(self.s):
            raise self.error("unexpected end")
        c = self.s[self.i]
        self.i += 1
        return c

    def parse(self) -> Node:
        node = self.alternation()
        if self.i != len(self.s):
            raise self.error(f"unbalanced {self.peek()!r}")
        return node

    def alternation(self) -> Node:
        items = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            items.append(self.sequence())
        return items[0] if len(items) == 1 else Alt(tuple(items))

    def sequence(self) -> Node:
        items: list[Node] = []
        while self.peek() not in ("", "|", ")"):
            atom = self.atom()
            items.append(self.quantified(atom))
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def quantified(self, atom: Node) -> Node:
        while True:
            c = self.peek()
            if c in ("*", "+", "?"):
                self.i += 1
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            elif c == "{" and self._brace_quantifier() is not None:
                lo, hi = self._brace_quantifier()  # type: ignore[misc]
                self.i = self.s.index("}", self.i) + 1
            else:
                return atom
            if isinstance(atom, Anchor):
                raise self.error("nothing to repeat")
            if self.peek() == "?":  # lazy: the same language
                self.i += 1
            atom = Repeat(atom, lo, hi)

    def _brace_quantifier(self) -> tuple[int, int | None] | None:
        j = self.s.find("}", self.i)
        if j < 0:
            return None
        body = self.s[self.i + 1 : j]
        lo_s, comma, hi_s = body.partition(",")
        if not lo_s.isdigit() or (hi_s and not hi_s.isdigit()):
            return None
        lo = int(lo_s)
        hi = (int(hi_s) if hi_s else None) if comma else lo
        if hi is not None and hi < lo:
            raise self.error("numbers out of order in {} quantifier")
        return lo, hi

    def atom(self) -> Node:
        c = self.take()
        if c == "^":
            return Anchor(True)
        if c == "$":
            return Anchor(False)
        if c == ".":
            return DOT
        if c == "(":
            if self.s.startswith("?:", self.i):
                self.i += 2
            elif self.s.startswith(("?=", "?!", "?<=", "?<!"), self.i):
                raise RegexUnsupported(f"lookaround in /{self.s}/")
            elif self.s.startswith("?<", self.i):
                end = self.s.find(">", self.i)
                if end < 0:
                    raise self.error("unterminated group name")
                self.i = end + 1
            elif self.peek() == "?":
                raise self.error("invalid group")
            node = self.alternation()
            if self.take() != ")":
                raise self.error("missing )")
            return node
        if c == "[":
            return CharSet(self.char_class())
        if c == "\\":
            return self.escape(in_class=False)
        if c in ")":
            raise self.error("unbalanced )")
        if c in "*+?":
            raise self.error("nothing to repeat")
        if c == "{" and self._brace_quantifier_at(self.i - 1):
            raise self.error("nothing to repeat")
        return CharSet(((ord(c), ord(c)),))

    def _brace_quantifier_at(self, pos: int) -> bool:
        save = self.i
        self.i = pos
        try:
            return self._brace_quantifier() is not None
        finally:
            self.i = save

    def escape(self, in_class: bool) -> CharSet:
        c = self.take()
        if c in _CLASS_ESCAPES:
            return CharSet(_CLASS_ESCAPES[c])
        if c.lower() in _CLASS_ESCAPES:
            return CharSet(complement(_CLASS_ESCAPES[c.lower()]))
        if c in ("p", "P"):
            if self.take() != "{":
                raise self.error("invalid \\p")
            end = self.s.find("}", self.i)
            if end < 0:
                raise self.error("unterminated \\p{")
            name = self.s[self.i : end]
            self.i = end + 1
            ivs = category(name)
            return CharSet(ivs if c == "p" else complement(ivs))
        if c in _CHAR_ESCAPES:
            if c == "0" and self.peek().isdigit():
                raise RegexUnsupported(f"octal escape in /{self.s}/")
            cp = _CHAR_ESCAPES[c]
            return CharSet(((cp, cp),))
        if c == "b":
            if in_class:
                return CharSet(((8, 8),))
            raise RegexUnsupported(f"word boundary \\b in /{self.s}/")
        if c == "B":
            raise RegexUnsupported(f"\\B in /{self.s}/")
        if c.isdigit():
            raise RegexUnsupported(f"backreference \\{c} in /{self.s}/")
        if c == "k" and not in_class:
            raise RegexUnsupported(f"named backreference in /{self.s}/")
        if c == "c":
            letter = self.take()
            if not letter.isascii() or not letter.isalpha():
                raise self.error("invalid \\c")
            cp = ord(letter) % 32
            return CharSet(((cp, cp),))
        if c in ("x", "u"):
            cp = self.hex_escape(c)
            return CharSet(((cp, cp),))
        if c.isascii() and c.isalnum():
            raise self.error(f"invalid escape \\{c}")  # ECMA's u-mode identity escapes: syntax only
        return CharSet(((ord(c), ord(c)),))

    def hex_escape(self, kind: str) -> int:
        if kind == "u" and self.peek() == "{":
            end = self.s.find("}", self.i)
            digits = self.s[self.i + 1 : end] if end > 0 else ""
            if not digits or any(d not in "0123456789abcdefABCDEF" for d in digits) or int(digits, 16) > MAX_CP:
                raise self.error("invalid \\u{...}")
            self.i = end + 1
            return int(digits, 16)
        n = 2 if kind == "x" else 4
        digits = self.s[self.i : self.i + n]
        if len(digits) != n or any(d not in "0123456789abcdefABCDEF" for d in digits):
            raise self.error(f"invalid \\{kind} escape")
        self.i += n
        cp = int(digits, 16)
        if kind == "u" and 0xD800 <= cp <= 0xDBFF and self.s.startswith("\\u", self.i):
            low = self.s[self.i + 2 : self.i + 6]
            if len(low) == 4 and all(d in "0123456789abcdefABCDEF" for d in low) and 0xDC00 <= int(low, 16) <= 0xDFFF:
                self.i += 6
                return 0x10000 + ((cp - 0xD800) << 10) + (int(low, 16) - 0xDC00)
        return cp

    def char_class(self) -> Intervals:
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        ivs: list[tuple[int, int]] = []
        first = True
        while True:
            c = self.peek()
            if c == "":
                raise self.error("unterminated character class")
            if c == "]" and not (first and False):
                self.i += 1
                break
            first = False
            lo_set = self.class_atom()
            if self.peek() == "-" and self.s[self.i + 1 : self.i + 2] not in ("]", ""):
                self.i += 1
                hi_set = self.class_atom()
                if len(lo_set) != 1 or len(hi_set) != 1 or lo_set[0][0] != lo_set[0][1] or hi_set[0][0] != hi_set[0][1]:
                    raise self.error("invalid range in character class")
                lo, hi = lo_set[0][0], hi_set[0][0]
                if lo > hi:
                    raise self.error("range out of order in character class")
                ivs.append((lo, hi))
            else:
                ivs.extend(lo_set)
        out = norm(ivs)
        return complement(out) if negate else out

    def class_atom(self) -> Intervals:
        c = self.take()
        if c == "\\":
            return self.escape(in_class=True).ivs
        return ((ord(c), ord(c)),)


@functools.lru_cache(maxsize=1024)
def parse(pattern: str) -> Node:
    """The tree of an ECMA-262 pattern (code points; anchors kept as :class:`Anchor`)."""
    return _Parser(pattern).parse()


_ANY_STRING = Repeat(ANY, 0, None)


def anchored(node: Node) -> Node:
    """The whole-string language of a searched pattern: ``.*`` added at each end the
    pattern does not anchor. Anchors are allowed at the ends of the pattern and of its
    top-level alternatives (``^a|b$``); elsewhere they raise :class:`RegexUnsupported`."""
    branches = node.items if isinstance(node, Alt) else (node,)
    # branches by their anchors: those alike share one ``.*`` at each open end (``.*(a|b).*``,
    # not ``.*a.* | .*b.*``, whose states would tell apart which branch matched: 2^n of them)
    groups: dict[tuple[bool, bool], list[Node]] = {}
    for b in branches:
        items = list(b.items) if isinstance(b, Seq) else [b]
        start = bool(items) and items[0] == Anchor(True)
        if start:
            items = items[1:]
        end = bool(items) and items[-1] == Anchor(False)
        if end:
            items = items[:-1]
        while items and isinstance(items[0], Anchor) and items[0].start:  # ^^a
            items = items[1:]
        while items and isinstance(items[-1], Anchor) and not items[-1].start:
            items = items[:-1]
        for it in items:
            _no_anchor(it)
        groups.setdefault((start, end), []).append(Seq(tuple(items)) if len(items) != 1 else items[0])
    out: list[Node] = []
    for (start, end), alike in groups.items():
        mid = alike[0] if len(alike) == 1 else Alt(tuple(alike))
        if not start:
            mid = _trim(mid, 0)
        if not end:
            mid = _trim(mid, -1)
        core = [*([] if start else [_ANY_STRING]), mid, *([] if end else [_ANY_STRING])]
        out.append(Seq(tuple(core)) if len(core) != 1 else core[0])
    return out[0] if len(out) == 1 else Alt(tuple(out))


def _trim(node: Node, side: int) -> Node:
    """``node`` with what the ``.*`` beside it (before it when ``side`` is 0, after it when
    -1) would read anyway left out: a repetition at that end read its least number of
    times (``.*a[a-z]+`` is ``.*a[a-z]``), through sequences and each alternative. The same
    strings; a searched grammar's states no longer follow each alternative's loop past a
    match (Github_easy o47657's ``UTC|(Africa/[A-Za-z]+)|...``: 812 states inside its
    string, a few tens once trimmed)."""
    if isinstance(node, Repeat):
        return Seq(()) if node.min == 0 else (node.item if node.min == 1 else Repeat(node.item, node.min, node.min))
    if isinstance(node, Alt):
        return Alt(tuple(_trim(b, side) for b in node.items))
    if isinstance(node, Seq) and node.items:
        items = list(node.items)
        while items:
            end = _trim(items[side], side)
            if end != Seq(()):
                items[side] = end
                break
            del items[side]  # (it can read nothing: the next one in is at that end now)
        return Seq(tuple(items)) if len(items) != 1 else items[0]
    return node


def _no_anchor(node: Node) -> None:
    if isinstance(node, Anchor):
        raise RegexUnsupported("an anchor inside the pattern")
    if isinstance(node, Seq | Alt):
        for it in node.items:
            _no_anchor(it)
    elif isinstance(node, Repeat):
        _no_anchor(node.item)


def nullable(node: Node) -> bool:
    """Whether ``node`` (anchors removed) matches the empty string."""
    if isinstance(node, CharSet):
        return False
    if isinstance(node, Seq):
        return all(nullable(it) for it in node.items)
    if isinstance(node, Alt):
        return any(nullable(it) for it in node.items)
    if isinstance(node, Repeat):
        return node.min == 0 or nullable(node.item)
    return True  # an anchor matches no character


def nonempty(node: Node) -> Node | None:
    """A node for the non-empty strings ``node`` matches (None: it matches only the empty
    string). A repetition of a node that can match nothing (``(a*)*``) is written over its
    non-empty part, so that no grammar rule can repeat without consuming a character."""
    if not nullable(node):
        return node
    if isinstance(node, Seq):
        # the first item that matches something: those before it match the empty string
        alts = []
        for i, it in enumerate(node.items):
            head = nonempty(it)
            if head is not None:
                rest = node.items[i + 1 :]
                alts.append(Seq((head, *rest)) if rest else head)
        return None if not alts else alts[0] if len(alts) == 1 else Alt(tuple(alts))
    if isinstance(node, Alt):
        alts = [a for a in (nonempty(it) for it in node.items) if a is not None]
        return None if not alts else alts[0] if len(alts) == 1 else Alt(tuple(alts))
    if isinstance(node, Repeat):
        inner = nonempty(node.item)
        if inner is None or node.max == 0:
            return None
        # x{m,n} with x nullable matches what x'{0,n} matches; its non-empty strings: x'{1,n}
        return Repeat(inner, 1, node.max)
    return None
