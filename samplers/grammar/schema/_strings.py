"""JSON strings as GBNF: one character from a code-point set in every JSON spelling the
grammar accepts, string literals, regular-expression trees, lengths and formats.

A character is accepted raw (UTF-8) or escaped: ``\\"``, ``\\\\`` and ``\\/``; the short
escapes of controls (``\\b \\f \\n \\r \\t``); ``\\u`` escapes (either hex case) of
controls and of every non-ASCII character, a supplementary character as a surrogate
pair (what ``json.dumps`` writes by default). ASCII printable characters are accepted
raw only (``\\u0061`` for ``a`` is valid JSON no encoder writes). Where a character set
holds more than :data:`MAX_ESCAPE_RANGES` ranges of non-ASCII characters, its ``\\u``
escapes stand for any non-ASCII character (a documented looseness, escaped form only).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

from ._regex import DOT, MAX_CP, Alt, Anchor, CharSet, Intervals, Node, Repeat, Seq, intersect, nonempty, norm, nullable
from ._rules import RuleSet, char_class, literal, repeat

__all__ = ["FORMATS", "KNOWN_FORMATS", "format_rule", "json_char", "regex_body", "string_literal"]

MAX_ESCAPE_RANGES = 16
_RAW_OK = norm([(0x20, 0x21), (0x23, 0x5B), (0x5D, 0xD7FF), (0xE000, MAX_CP)])
#: the short escapes: the code point -> the character after the backslash
_SHORT = {8: "b", 12: "f", 10: "n", 13: "r", 9: "t", 0x22: '"', 0x5C: "\\", 0x2F: "/"}
_ESCAPABLE = norm([(0, 0x1F), (0x7F, 0xD7FF), (0xE000, MAX_CP)])
_HEXV = "0123456789abcdef"


@functools.cache  # (at most 136 pairs)
def _hex_digit_class(lo: int, hi: int) -> str:
    ivs = []
    if lo <= 9:
        ivs.append((0x30 + lo, 0x30 + min(hi, 9)))
    if hi >= 10:
        a, b = max(lo, 10) - 10, hi - 10
        ivs += [(0x61 + a, 0x61 + b), (0x41 + a, 0x41 + b)]
    return char_class(norm(ivs))


def _fixed_range(lo: int, hi: int, width: int, base: int, digit: Callable[[int, int], str]) -> list[str]:
    """Alternatives (each a GBNF sequence) for the ``width``-digit numerals in [lo, hi]."""
    if width == 0:
        return [""]
    unit = base ** (width - 1)
    lo_d, lo_r = divmod(lo, unit)
    hi_d, hi_r = divmod(hi, unit)
    if lo_d == hi_d:
        return [f"{digit(lo_d, lo_d)} {s}".strip() for s in _fixed_range(lo_r, hi_r, width - 1, base, digit)]
    out = []
    full = unit - 1
    start, end = lo_d, hi_d
    if lo_r != 0:
        out += [f"{digit(lo_d, lo_d)} {s}".strip() for s in _fixed_range(lo_r, full, width - 1, base, digit)]
        start += 1
    if hi_r != full:
        end -= 1
    if start <= end:
        rest = f" {digit(0, base - 1)}" + (f"{{{width - 1}}}" if width > 2 else "") if width > 1 else ""
        out.append(f"{digit(start, end)}{rest}")
    if hi_r != full:
        out += [f"{digit(hi_d, hi_d)} {s}".strip() for s in _fixed_range(0, hi_r, width - 1, base, digit)]
    return out


@functools.lru_cache(maxsize=4096)
def _u_tails(ivs: Intervals) -> tuple[str, ...]:
    """What follows ``\\u`` in the ``\\uXXXX`` spellings of the code points in ``ivs``
    (controls and non-ASCII; a supplementary character's second ``\\u`` included)."""
    ivs = intersect(ivs, _ESCAPABLE)
    if not ivs:
        return ()
    non_ascii = [iv for iv in ivs if iv[0] >= 0x80]
    if len(non_ascii) > MAX_ESCAPE_RANGES:
        ivs = norm([*(iv for iv in ivs if iv[0] < 0x80), (0x7F, 0xD7FF), (0xE000, MAX_CP)])
    alts: list[str] = []
    bmp = [(lo, min(hi, 0xFFFF)) for lo, hi in ivs if lo <= 0xFFFF]
    for lo, hi in bmp:
        alts += _fixed_range(lo, hi, 4, 16, _hex_digit_class)
    for lo, hi in ivs:
        lo = max(lo, 0x10000)
        if lo > hi:
            continue
        # group by high surrogate
        h_lo, h_hi = 0xD800 + ((lo - 0x10000) >> 10), 0xD800 + ((hi - 0x10000) >> 10)
        for h in sorted({h_lo, h_hi}) if h_hi - h_lo <= 1 else [h_lo, h_hi]:
            a = 0xDC00 + ((lo - 0x10000) & 0x3FF) if h == h_lo else 0xDC00
            b = 0xDC00 + ((hi - 0x10000) & 0x3FF) if h == h_hi else 0xDFFF
            hs = " ".join(_fixed_range(h, h, 4, 16, _hex_digit_class))
            for s in _fixed_range(a, b, 4, 16, _hex_digit_class):
                alts.append(f'{hs} "\\\\u" {s}')
        if h_hi - h_lo > 1:
            mid = " | ".join(_fixed_range(h_lo + 1, h_hi - 1, 4, 16, _hex_digit_class))
            low = " | ".join(_fixed_range(0xDC00, 0xDFFF, 4, 16, _hex_digit_class))
            alts.append(f'({mid}) "\\\\u" ({low})')
    return tuple(alts)


def _escapes(short: list[str], u_tails: list[str]) -> str | None:
    """One alternative for escaped spellings: the backslash once, then the characters
    of the short escapes (one class) or ``u`` and the ``\\u`` tails (None: no
    escape). Written so, every spelling shares the backslash: a string's state holds
    one stack waiting for it, not one per spelling (20 of them inside any string)."""
    tails = []
    if short:
        tails.append(char_class(norm([(ord(c), ord(c)) for c in short])))
    if u_tails:
        one = len(u_tails) == 1 and "|" not in u_tails[0]
        tails.append(f'"u" {u_tails[0]}' if one else f'"u" ({" | ".join(u_tails)})')
    if not tails:
        return None
    return f'"\\\\" {tails[0]}' if len(tails) == 1 else f'"\\\\" ({" | ".join(tails)})'


#: every non-ASCII code point a ``\\u`` escape may spell (surrogates only in pairs)
_NON_ASCII = norm([(0x80, 0xD7FF), (0xE000, MAX_CP)])
#: every code point with an escaped spelling
_HAS_ESCAPE = norm([*_ESCAPABLE, *((cp, cp) for cp in _SHORT)])
#: shared rules (defined once per grammar, where used): what follows ``\\u`` in the
#: escapes of every non-ASCII character, and every escaped spelling of every character.
#: Most character sets hold them all ("any character but these"); naming the shared rule
#: keeps their rules one class and a name long
U_NON_ASCII = "json-u-non-ascii"
ANY_ESCAPE = "json-escape"


@functools.lru_cache(maxsize=4096)
def _json_char_body(ivs: Intervals) -> tuple[str, str | None]:
    """The body of :func:`json_char`'s rule, and the shared rule it names (if any)."""
    alts = []
    raw = intersect(ivs, _RAW_OK)
    if raw:
        alts.append(char_class(raw))
    if intersect(ivs, _HAS_ESCAPE) == _HAS_ESCAPE:
        return " | ".join([*alts, ANY_ESCAPE]), ANY_ESCAPE
    short = [esc for cp, esc in _SHORT.items() if any(lo <= cp <= hi for lo, hi in ivs)]
    escapable = intersect(ivs, _ESCAPABLE)
    shared = None
    if intersect(escapable, _NON_ASCII) == _NON_ASCII:
        u_tails = [*_u_tails(intersect(escapable, ((0, 0x7F),))), U_NON_ASCII]
        shared = U_NON_ASCII
    else:
        u_tails = list(_u_tails(escapable))
    esc = _escapes(short, u_tails)
    if esc is not None:
        alts.append(esc)
    if not alts:
        raise ValueError("no character")
    return " | ".join(alts), shared


@functools.cache
def _shared_body(name: str) -> str:
    """The body of the shared rule ``name`` (:data:`ANY_ESCAPE` or :data:`U_NON_ASCII`)."""
    if name == ANY_ESCAPE:
        esc = _escapes(list(_SHORT.values()), [*_u_tails(((0, 0x7F),)), U_NON_ASCII])
        assert esc is not None
        return esc
    return " | ".join(_u_tails(_NON_ASCII))


def _shared(rs: RuleSet, name: str) -> None:
    if name == ANY_ESCAPE and ANY_ESCAPE not in rs.bodies:
        _shared(rs, U_NON_ASCII)
        rs.fixed(ANY_ESCAPE, _shared_body(ANY_ESCAPE))
    elif name == U_NON_ASCII:
        rs.fixed(U_NON_ASCII, _shared_body(U_NON_ASCII))


def json_char(rs: RuleSet, ivs: Intervals) -> str:
    """One JSON string character with a code point in ``ivs`` (its raw and escaped
    spellings; see the module's docstring): a GBNF item, the name of a rule or, for
    characters written raw only, a character class."""
    body, shared = _json_char_body(ivs)
    if shared is not None:
        _shared(rs, shared)
    if "|" not in body and body.startswith("["):
        return body  # one class: no rule needed
    if ivs == ((0, MAX_CP),):
        hint = "char"
    elif len(ivs) == 1 and ivs[0][0] == ivs[0][1]:
        hint = f"c-{ivs[0][0]:x}"
    else:
        hint = "chars"
    return rs.add(hint, body)


ANY_CHAR: Intervals = ((0, MAX_CP),)
#: text :func:`string_literal` writes as it is: printable ASCII but ``"``, ``\\`` and ``/``
_PLAIN_TEXT = re.compile(r"[ !#-.0-\[\]-~]+")


def string_literal(rs: RuleSet, value: str) -> str:
    """A GBNF sequence for the JSON string whose value is ``value`` (quotes included)."""
    if _PLAIN_TEXT.fullmatch(value):  # printable ASCII, nothing to escape: one literal
        return f'"\\"" "{value}" "\\""'
    parts: list[str] = []
    plain = ""
    for c in value:
        cp = ord(c)
        if 0x20 <= cp < 0x7F and c not in '"\\/':
            plain += c
            continue
        if plain:
            parts.append(literal(plain))
            plain = ""
        parts.append(json_char(rs, ((cp, cp),)))
    if plain:
        parts.append(literal(plain))
    return " ".join(['"\\""', *parts, '"\\""'])


def regex_body(rs: RuleSet, node: Node) -> str:
    """A GBNF expression for the string contents ``node`` (an anchored tree) accepts."""
    if isinstance(node, CharSet):
        return json_char(rs, node.ivs)
    if isinstance(node, Seq):
        if not node.items:
            return '""'
        return " ".join(_group(rs, it) for it in node.items)
    if isinstance(node, Alt):
        return "(" + " | ".join(regex_body(rs, it) for it in node.items) + ")"
    if isinstance(node, Repeat):
        item: Node | None = node.item
        lo = node.min
        if nullable(node.item):
            # x{m,n} with x nullable: x'{0,n} for x' its non-empty part (a rule repeating
            # something that can be empty would be left-recursive)
            item, lo = nonempty(node.item), 0
            if item is None:
                return '""'
        assert item is not None
        return repeat(rs, _group(rs, item), lo, node.max)
    if isinstance(node, Anchor):
        raise ValueError("anchors are removed by regex.anchored")
    raise TypeError(node)


def _group(rs: RuleSet, node: Node) -> str:
    body = regex_body(rs, node)
    if isinstance(node, Seq) and len(node.items) > 1:
        return f"({body})"
    return body


# --- formats (RFC 3339 dates and times, ISO 8601 durations, hosts, addresses, URIs) ---------


def _two(lo: int, hi: int) -> str:
    return "(" + " | ".join(_fixed_range(lo, hi, 2, 10, lambda a, b: f"[{a}-{b}]")) + ")"


def _leap_years() -> str:
    # a year YYYY is leap iff YY%4==0 and YY!=00 (last two), or last two == 00 and first two % 4 == 0
    last = " | ".join(f'"{n:02d}"' for n in range(4, 100, 4))
    first = " | ".join(f'"{n:02d}"' for n in range(0, 100, 4))
    return f'([0-9] [0-9] ({last}) | ({first}) "00")'


def _date_body() -> str:
    d31 = '("01" | "03" | "05" | "07" | "08" | "10" | "12") "-" ' + _two(1, 31)
    d30 = '("04" | "06" | "09" | "11") "-" ' + _two(1, 30)
    feb = '"02" "-" ' + _two(1, 28)
    return f'([0-9]{{4}} "-" ({d31} | {d30} | {feb}) | {_leap_years()} "-02-29")'


def _time_body() -> str:
    frac = '("." [0-9]+)?'
    offset = f'([zZ] | [+-] {_two(0, 23)} ":" {_two(0, 59)})'
    normal = f'{_two(0, 23)} ":" {_two(0, 59)} ":" {_two(0, 59)} {frac} {offset}'
    # a leap second is 23:59:60 UTC: exact with Z or a zero offset; with another offset
    # any hh:mm:60 is accepted (the UTC conversion is not expressed)
    hh, mm = _two(0, 23), _two(0, 59)
    leap_utc = f'"23:59:60" {frac} ([zZ] | [+-] "00:00")'
    leap_other = f'{hh} ":" {mm} ":60" {frac} [+-] {hh} ":" {mm}'
    leap = f"({leap_utc} | {leap_other})"
    return f"({normal} | {leap})"


def _duration_body() -> str:
    n = "[0-9]+"
    date = f'({n} "Y" ({n} "M")? ({n} "D")? | {n} "M" ({n} "D")? | {n} "D")'
    time = f'"T" ({n} "H" ({n} "M")? ({n} "S")? | {n} "M" ({n} "S")? | {n} "S")'
    return f'"P" ({date} ({time})? | {time} | {n} "W")'


_IPV4 = '(dec-octet "." dec-octet "." dec-octet "." dec-octet)'
_DEC_OCTET = '"25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9]'
_H16 = "[0-9a-fA-F]{1,4}"


def _ipv6_body() -> str:
    h = "h16"
    ls32 = f'({h} ":" {h} | ipv4)'

    def rep(k: int) -> str:
        return f'({h} ":"){{{k}}}' if k else ""

    def upto(k: int) -> str:  # [ *k( h16 ":" ) h16 ]
        return f'(({h} ":"){{0,{k}}} {h})?' if k >= 0 else ""

    alts = [
        f"{rep(6)} {ls32}",
        f'"::" {rep(5)} {ls32}',
        f'({h})? "::" {rep(4)} {ls32}',
        f'{upto(1)} "::" {rep(3)} {ls32}',
        f'{upto(2)} "::" {rep(2)} {ls32}',
        f'{upto(3)} "::" {h} ":" {ls32}',
        f'{upto(4)} "::" {ls32}',
        f'{upto(5)} "::" {h}',
        f'{upto(6)} "::"',
    ]
    return "(" + " | ".join(" ".join(a.split()) for a in alts) + ")"


_LABEL = "[a-zA-Z0-9] ([a-zA-Z0-9-]{0,61} [a-zA-Z0-9])?"
_ATEXT = "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]"  # "-" last: a literal in the class
_URI_CHAR = '[a-zA-Z0-9._~!$&\'()*+,;=:@/?\\[\\]-] | "%" [0-9a-fA-F] [0-9a-fA-F]'

#: format name -> the GBNF body of its string contents (quotes not included)
FORMATS: dict[str, str] = {
    "date": _date_body(),
    "time": _time_body(),
    "date-time": f"{_date_body()} [tT] {_time_body()}",
    "duration": _duration_body(),
    "uuid": '[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12}',
    "ipv4": _IPV4,
    "ipv6": _ipv6_body(),
    "hostname": 'hostname-label ("." hostname-label)*',
    "email": f'{_ATEXT}+ ("." {_ATEXT}+)* "@" (hostname-label ("." hostname-label)* | "[" ipv4 "]")',
    "uri": '[a-zA-Z] [a-zA-Z0-9+.-]* ":" uri-char* ("#" uri-char*)?',
}
_HELPERS = {
    "dec-octet": _DEC_OCTET,
    "ipv4": _IPV4,
    "h16": _H16,
    "hostname-label": _LABEL,
    "uri-char": _URI_CHAR,
}


#: each helper's name as a whole word of a rule body (compiled once, not per format use)
_HELPER_REFS = {helper: re.compile(rf"(?<![\w-]){helper}(?![\w-])") for helper in _HELPERS}


def _helpers(rs: RuleSet, body: str) -> None:
    for helper, hbody in _HELPERS.items():
        if helper not in rs.bodies and _HELPER_REFS[helper].search(body):
            rs.fixed(helper, hbody)
            _helpers(rs, hbody)


#: what an IRI adds to a URI's characters (RFC 3987's ucschar and iprivate, as one range:
#: every non-ASCII character from U+00A0, surrogates apart)
_IRI_EXTRA: Intervals = ((0xA0, 0xD7FF), (0xE000, MAX_CP))


def _iri_part(rs: RuleSet) -> str:
    return rs.add("iri-part", f"uri-char | {json_char(rs, _IRI_EXTRA)}")


def _json_pointer(rs: RuleSet) -> str:
    # RFC 6901: "/" then any characters, "~" and "/" written ~0 and ~1
    other = norm([(0, ord("/") - 1), (ord("/") + 1, ord("~") - 1), (ord("~") + 1, MAX_CP)])
    return f'("/" ({json_char(rs, other)} | "~" [01])*)*'


def _dynamic_formats() -> dict[str, Callable[[RuleSet], str]]:
    """Formats whose characters include non-ASCII ones, in every JSON spelling
    (:func:`json_char`), so built per rule set: RFC 3986 references, RFC 3987 IRIs (like
    ``uri``: a scheme, then characters a URI may hold, looser than the RFC's structure),
    RFC 6901 JSON pointers, relative JSON pointers and RFC 6570 URI templates (literals
    and ``{...}`` expressions, unchecked inside)."""

    def template(rs: RuleSet) -> str:
        no_braces = norm([(0, ord("{") - 1), (ord("{") + 1, ord("}") - 1), (ord("}") + 1, MAX_CP)])
        ch = json_char(rs, no_braces)
        return f'({ch} | "{{" {ch}* "}}")*'

    return {
        "uri-reference": lambda rs: 'uri-char* ("#" uri-char*)?',
        "iri": lambda rs: f'[a-zA-Z] [a-zA-Z0-9+.-]* ":" {_iri_part(rs)}* ("#" {_iri_part(rs)}*)?',
        "iri-reference": lambda rs: f'{_iri_part(rs)}* ("#" {_iri_part(rs)}*)?',
        "json-pointer": _json_pointer,
        "relative-json-pointer": lambda rs: f'("0" | [1-9] [0-9]*) ("#" | {_json_pointer(rs)})',
        "uri-template": template,
    }


_DYNAMIC = _dynamic_formats()
#: every format :func:`format_rule` enforces
KNOWN_FORMATS = frozenset({*FORMATS, *_DYNAMIC})


def format_rule(rs: RuleSet, name: str) -> str | None:
    """The rule name of a JSON string in ``format`` ``name`` (quotes included), or None
    for a format this module does not know."""
    body = FORMATS.get(name)
    if body is None and name in _DYNAMIC:
        body = _DYNAMIC[name](rs)
        _helpers(rs, "uri-char")
    if body is None:
        return None
    _helpers(rs, body)
    return rs.add(f"fmt-{name}", f'"\\"" {body} "\\""')


# the characters nearly every schema meets, made once when the module is imported (not by
# the first conversion in a process, ~0.5 ms): any character (every string without a
# pattern) and ECMA-262's ``.`` (most patterns), with the shared escape rules they name
for _ivs in (ANY_CHAR, DOT.ivs):
    _json_char_body(_ivs)
for _name in (U_NON_ASCII, ANY_ESCAPE):
    _shared_body(_name)
del _ivs, _name
