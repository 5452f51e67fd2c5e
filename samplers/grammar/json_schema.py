"""JSON schema to GBNF, with exactly the output of llama.cpp's converter.

:func:`json_schema_to_gbnf` is the entry point: by default it runs the complete
converter (:mod:`samplers.grammar.schema`); with ``compat="llama.cpp"`` it runs this
module's :func:`llama_cpp_json_schema_to_gbnf`, which turns a JSON schema into a GBNF grammar whose text is
byte for byte what llama.cpp's ``json_schema_to_grammar()`` (``common/json-schema.cpp``
builds the schema tree, ``common/json-schema-to-grammar.cpp`` writes the rules) prints
at the pinned commit: the same rule names (collisions numbered ``name0``, ``name1``,
...), the rules sorted by name, the same whitespace rule ``space``, the same integer
range and regular expression translations, the same errors.

Supported: ``type`` (a string or a list, a list being one alternative per type),
``properties`` / ``required`` / ``additionalProperties`` (``true``, ``false`` or a
schema), ``enum`` / ``const``, ``anyOf`` / ``oneOf`` / ``allOf`` (``allOf`` merges
object properties and intersects enums), ``$ref`` into the same document (any JSON
pointer without escapes: ``#/$defs/x``, ``#/definitions/x``, ``#/properties/a/items``,
recursion included), ``items`` / ``prefixItems`` / ``minItems`` / ``maxItems``,
``minLength`` / ``maxLength`` / ``pattern`` / ``format`` (``date``, ``time``,
``date-time``, ``uuid``, ``uuid1`` .. ``uuid5``) for strings, and
``minimum`` / ``maximum`` / ``exclusiveMinimum`` / ``exclusiveMaximum`` for integers.
Any other keyword is ignored, as llama.cpp ignores it (``number`` bounds included).
As in llama.cpp, an object with ``properties`` allows no other property unless
``additionalProperties`` says so, and its grammar fixes the order of the properties:
the required ones first, then the optional ones, each in schema order.

What llama.cpp refuses raises :class:`~samplers.grammar.errors.SchemaError` with
llama.cpp's own message (``"JSON schema conversion failed:\\nJSON schema error at
#/properties/a: unrecognized type str"``, a remote ``$ref``, an invalid regular
expression, an integer range it cannot express, ...). A ``pattern`` that is a valid
regular expression without a GBNF translation (not anchored with ``^...$``, a
lookaround, ``\\d``, ...) is not an error: as in llama.cpp that string accepts any
string, and a :class:`SchemaWarning` says so.

Where this module deliberately differs from llama.cpp:

* an ``allOf`` whose ``$ref`` s only lead to each other (``a -> b -> a``) makes llama.cpp
  recurse until its stack overflows; here it is a :class:`SchemaError`;
* a schema nested deeper than Python's recursion limit allows (several hundred levels)
  is a :class:`SchemaError` (llama.cpp goes deeper);
* where llama.cpp's pattern translation splits a multi-byte UTF-8 character (a
  quantifier right after it applies to its last byte), the returned text holds those
  bytes as lone surrogates (``surrogateescape``): ``text.encode("utf-8",
  "surrogateescape")`` is llama.cpp's exact output;
* llama.cpp prints its warning to stderr; this module issues a :class:`SchemaWarning`;
* a fractional integer bound beyond the int64 range becomes "no bound", as llama.cpp's
  double to int64 conversion does on x86-64 (elsewhere that conversion is undefined);
* input that is not JSON (NaN, a non-string key, a lone surrogate) is a
  :class:`SchemaError` with our own message;
* llama.cpp's ``json_schema_to_grammar`` has no property-order option at this commit,
  so neither has :func:`json_schema_to_gbnf`.
"""

from __future__ import annotations

import json
import math
import re
import struct
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from llama_cffi._args import expect_bool, expect_str, type_error

from .errors import SchemaError, SchemaTypeError

__all__ = [
    "SPACE_RULE",
    "SchemaWarning",
    "gbnf_format_literal",
    "json_schema_to_gbnf",
    "llama_cpp_json_schema_to_gbnf",
]

# Every string inside this module is a "byte string": the UTF-8 encoding of the text,
# decoded as Latin-1 (one character per byte). llama.cpp works on the bytes of UTF-8
# std::strings (its regular expression translation splits multi-byte characters, its
# rule map sorts by bytes), and this keeps every step byte-exact. :func:`_to_bytes_str`
# and :func:`_from_bytes_str` convert at the boundary.

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_INT_MAX = 2**31 - 1  # C++ int: an unbounded repetition count
_UINT64_MAX = 2**64 - 1

#: The whitespace rule every grammar gets (``space ::= ...``): nothing, one space, or one
#: or two newlines followed by up to 20 spaces or tabs.
SPACE_RULE = '| " " | "\\n"{1,2} [ \\t]{0,20}'


class SchemaWarning(UserWarning):
    """A part of the schema was converted loosely (a ``pattern`` with no GBNF translation
    accepts any string); the message is llama.cpp's warning."""


class _ConversionFailure(Exception):
    """llama.cpp throws a std::runtime_error (it becomes "JSON schema conversion failed")."""


class _UnsupportedPattern(Exception):
    """A valid regular expression with no GBNF translation (the string accepts anything)."""


class _InvalidPattern(Exception):
    """Not a regular expression at all (an error)."""


# ----------------------------------------------------------------------------- JSON values
def _to_bytes_str(text: str) -> str:
    try:
        return text.encode("utf-8").decode("latin-1")
    except UnicodeEncodeError as e:
        raise SchemaError(f"invalid JSON: a string is not valid Unicode ({e.reason}): {text!r}") from None


def _from_bytes_str(text: str) -> str:
    # Valid UTF-8 except where llama.cpp itself splits a multi-byte character (a
    # quantifier right after one in a pattern): those bytes come back as lone surrogates.
    return text.encode("latin-1").decode("utf-8", "surrogateescape")


def _normalize(value: object) -> Any:
    """A JSON value as nlohmann::json holds it (strings as byte strings; integers beyond
    int64/uint64 become doubles, as when nlohmann parses them), or SchemaError."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        v = int(value)
        if _INT64_MIN <= v <= _UINT64_MAX:
            return v
        try:
            value = float(v)
        except OverflowError:
            raise SchemaError(f"invalid JSON: number overflow ({v})") from None
    if isinstance(value, float):
        f = float(value)
        if not math.isfinite(f):
            raise SchemaError(f"invalid JSON: {f!r} is not a JSON number")
        return f
    if isinstance(value, str):
        return _to_bytes_str(str(value))
    if isinstance(value, (list, tuple)):
        return [_normalize(v) for v in value]
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise SchemaError(f"invalid JSON: object keys must be strings, not {type(k).__name__} ({k!r})")
            out[_to_bytes_str(str(k))] = _normalize(v)
        return out
    raise SchemaError(f"invalid JSON: {type(value).__name__} is not a JSON value ({value!r})")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _parse_json(text: str) -> Any:
    if text.startswith("\ufeff"):  # nlohmann skips a byte order mark
        text = text[1:]
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=dict)
    except (ValueError, RecursionError) as e:
        raise SchemaError(f"invalid JSON: {e}") from None


def _is_int(v: object) -> bool:
    return type(v) is int


def _is_number(v: object) -> bool:
    return type(v) is int or type(v) is float


def _wrap(v: int, bits: int) -> int:
    """Two's complement wrap-around, as a C++ integer conversion or overflow does."""
    m = 1 << bits
    v &= m - 1
    return v - m if v >= m >> 1 else v


def _escape_json_string(s: str) -> str:
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif o < 0x20:
            out.append(_SHORT_ESCAPES.get(ch) or f"\\u{o:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


_SHORT_ESCAPES = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _dump(v: Any) -> str:
    """nlohmann's compact ``dump()``: no spaces, keys in insertion order."""
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if type(v) is int:
        return str(v)
    if type(v) is float:
        return _format_double(v)
    if isinstance(v, str):
        return _escape_json_string(v)
    if isinstance(v, list):
        return "[" + ",".join(_dump(x) for x in v) + "]"
    return "{" + ",".join(_escape_json_string(k) + ":" + _dump(x) for k, x in v.items()) + "}"


# ------------------------------------------------------- nlohmann's double formatting
# nlohmann prints a double with the Grisu2 algorithm (shortest digits in nearly every
# case, not always) and a %g-like layout ("1.5", "2.0", "1e+16", "1e-05"). Python's
# repr() is exactly shortest, so the algorithm is reproduced here.
_M64 = (1 << 64) - 1
_ALPHA = -60


def _cached_powers() -> list[tuple[int, int, int]]:
    """The normalized 64-bit approximations f * 2**e of 10**k, k = -300, -292, ..., 324."""
    table = []
    for k in range(-300, 325, 8):
        x = Fraction(10) ** k
        e = x.numerator.bit_length() - x.denominator.bit_length() - 64
        while x / Fraction(2) ** e >= 1 << 64:
            e += 1
        while x / Fraction(2) ** e < 1 << 63:
            e -= 1
        table.append((round(x / Fraction(2) ** e), e, k))
    return table


_POWERS = _cached_powers()


def _mul(xf: int, yf: int) -> int:
    return (xf * yf + (1 << 63)) >> 64  # the upper 64 bits, rounded half up


def _normalize_diy(f: int, e: int) -> tuple[int, int]:
    shift = 64 - f.bit_length()
    return f << shift, e - shift


def _grisu2(value: float) -> tuple[str, int]:
    """Digits and decimal exponent of a positive finite double: value ~= digits * 10**exp."""
    bits = struct.unpack("<Q", struct.pack("<d", value))[0]
    big_e = bits >> 52
    frac = bits & ((1 << 52) - 1)
    vf, ve = (frac, -1074) if big_e == 0 else (frac + (1 << 52), big_e - 1075)
    plus_f, plus_e = _normalize_diy(2 * vf + 1, ve - 1)
    if frac == 0 and big_e > 1:
        minus_f, minus_e = 4 * vf - 1, ve - 2
    else:
        minus_f, minus_e = 2 * vf - 1, ve - 1
    minus_f <<= minus_e - plus_e
    w_f, _ = _normalize_diy(vf, ve)

    f = _ALPHA - plus_e - 1
    k = abs(f * 78913) // (1 << 18)
    k = (-k if f < 0 else k) + (1 if f > 0 else 0)
    cf, ce, ck = _POWERS[(300 + k + 7) // 8]

    one_e = plus_e + ce + 64  # the common exponent after multiplying
    m_plus = _mul(plus_f, cf) - 1
    m_minus = _mul(minus_f, cf) + 1
    w = _mul(w_f, cf)
    dec_exp = -ck

    delta = m_plus - m_minus
    dist = m_plus - w
    shift = -one_e
    one_f = 1 << shift
    p1 = m_plus >> shift
    p2 = m_plus & (one_f - 1)
    digits: list[int] = []

    def round_last(dist: int, delta: int, rest: int, ten_k: int) -> None:
        while rest < dist and delta - rest >= ten_k and (rest + ten_k < dist or dist - rest > rest + ten_k - dist):
            digits[-1] -= 1
            rest += ten_k

    n = len(str(p1))
    pow10 = 10 ** (n - 1)
    while n > 0:
        d, p1 = divmod(p1, pow10)
        digits.append(d)
        n -= 1
        rest = (p1 << shift) + p2
        if rest <= delta:
            dec_exp += n
            round_last(dist, delta, rest, pow10 << shift)
            return "".join(map(str, digits)), dec_exp
        pow10 //= 10
    m = 0
    while True:
        p2 = (p2 * 10) & _M64
        digits.append(p2 >> shift)
        p2 &= one_f - 1
        m += 1
        delta = (delta * 10) & _M64
        dist = (dist * 10) & _M64
        if p2 <= delta:
            break
    dec_exp -= m
    round_last(dist, delta, p2, one_f)
    return "".join(map(str, digits)), dec_exp


def _format_double(value: float) -> str:
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    value = abs(value)
    if value == 0.0:
        return sign + "0.0"
    digits, dec_exp = _grisu2(value)
    k = len(digits)
    n = k + dec_exp
    if k <= n <= 15:
        body = digits + "0" * (n - k) + ".0"
    elif 0 < n <= 15:
        body = digits[:n] + "." + digits[n:]
    elif -4 < n <= 0:
        body = "0." + "0" * -n + digits
    else:
        e = n - 1
        mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
        body = f"{mantissa}e{'-' if e < 0 else '+'}{abs(e):02d}"
    return sign + body


# ----------------------------------------------------------------------- the schema tree
# llama.cpp first turns the JSON into a tree of the supported subset (json-schema.cpp),
# then writes the grammar from that tree. Both steps are mirrored.
class _Node:
    pass


class _AnyNode(_Node):
    pass


@dataclass(eq=False)
class _RefNode(_Node):
    ref: str
    target: _Node | None = None


@dataclass(eq=False)
class _AnyOfNode(_Node):
    children: list[_Node] = field(default_factory=list)


@dataclass(eq=False)
class _AllOfNode(_Node):
    children: list[_Node] = field(default_factory=list)


@dataclass(eq=False)
class _ConstNode(_Node):
    value: Any


@dataclass(eq=False)
class _EnumNode(_Node):
    values: list[Any]


class _NullNode(_Node):
    pass


class _BooleanNode(_Node):
    pass


class _NumberNode(_Node):
    pass


@dataclass(eq=False)
class _IntegerNode(_Node):
    minimum: int = _INT64_MIN  # inclusive; INT64_MIN: unbounded
    maximum: int = _INT64_MAX  # inclusive; INT64_MAX: unbounded


_FORMAT_NONE, _FORMAT_UUID, _FORMAT_DATE, _FORMAT_TIME, _FORMAT_DATE_TIME = range(5)


@dataclass(eq=False)
class _StringNode(_Node):
    pattern: str = ""
    format: int = _FORMAT_NONE
    min_length: int = 0
    max_length: int = -1  # -1: unbounded


@dataclass(eq=False)
class _ArrayNode(_Node):
    items: _Node
    min_items: int = 0
    max_items: int = -1  # -1: unbounded


@dataclass(eq=False)
class _TupleNode(_Node):
    items: list[_Node]


@dataclass(eq=False)
class _ObjectNode(_Node):
    properties: list[tuple[str, _Node, bool]] = field(default_factory=list)  # (name, schema, required)
    additional: _Node | None = None  # None: no other properties allowed


_C_SPACES = " \t\n\v\f\r"


def _c_integer_prefix(text: str) -> int | None:
    """The number strtol/strtoull read at the start of ``text`` (leading C whitespace, a
    sign, decimal digits, anything after them ignored), or None without digits."""
    m = re.match(r"[ \t\n\v\f\r]*([+-]?)0*([0-9]+)", text)
    if m is None:
        return None
    if len(m.group(2)) > 40:  # beyond any C integer: an overflow either way
        return _UINT64_MAX + 1
    v = int(m.group(2))
    return -v if m.group(1) == "-" else v


def _stoi(text: str) -> int:
    """``std::stoi``: ValueError where it throws (no number, or outside ``int``)."""
    v = _c_integer_prefix(text)
    if v is None or not -(2**31) <= v <= _INT_MAX:
        raise ValueError(text)
    return v


def _stoull_index(text: str) -> int | None:
    """``std::stoull`` as an array index; None where it throws (no number, overflow)."""
    v = _c_integer_prefix(text)
    if v is None or abs(v) > _UINT64_MAX:
        return None
    return v & _UINT64_MAX  # "-1" wraps around, as strtoull does


class _SchemaBuilder:
    """JSON -> schema tree (``common_chat_schema_from_json``)."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.refs: dict[str, _Node | None] = {}
        self.pending: list[_RefNode] = []

    @staticmethod
    def fail(path: str, msg: str) -> _ConversionFailure:
        return _ConversionFailure(f"JSON schema error at {path}: {msg}")

    def build(self) -> _Node:
        node = self.build_node(self.root, "#")
        for ref in self.pending:
            ref.target = self.refs[ref.ref]
        return node

    def get_count(self, schema: dict[str, Any], key: str, path: str, default: int) -> int:
        if key not in schema:
            return default
        v = schema[key]
        if not _is_int(v) or _wrap(v, 32) < 0:  # nlohmann's get<int>() truncates
            raise self.fail(path, f"{key} must be a non-negative integer")
        return _wrap(v, 32)

    def get_bound(self, schema: dict[str, Any], key: str, path: str, round_up: bool) -> int:
        v = schema[key]
        if _is_int(v):
            return _wrap(v, 64)
        if not _is_number(v):
            raise self.fail(path, f"{key} must be a number")
        r = math.ceil(v) if round_up else math.floor(v)
        # a double -> int64 conversion out of range gives INT64_MIN on x86-64
        return r if _INT64_MIN <= r <= _INT64_MAX else _INT64_MIN

    def get_format(self, schema: dict[str, Any], path: str) -> int:
        if "format" not in schema:
            return _FORMAT_NONE
        v = schema["format"]
        if not isinstance(v, str):
            raise self.fail(path, "format must be a string")
        if v == "date":
            return _FORMAT_DATE
        if v == "time":
            return _FORMAT_TIME
        if v == "date-time":
            return _FORMAT_DATE_TIME
        if v == "uuid" or (len(v) == 5 and v.startswith("uuid") and "1" <= v[4] <= "5"):
            return _FORMAT_UUID
        return _FORMAT_NONE

    def resolve_ref(self, ref: str, path: str) -> Any:
        target = self.root
        for sel in ref[1:].split("/")[1:]:
            if isinstance(target, dict) and sel in target:
                target = target[sel]
            elif isinstance(target, list):
                idx = _stoull_index(sel)
                if idx is None or idx >= len(target):
                    raise self.fail(path, f"cannot resolve $ref {ref}, {sel} is out of range")
                target = target[idx]
            else:
                raise self.fail(path, f"cannot resolve $ref {ref}, {sel} not found")
        return target

    def build_ref(self, value: Any, path: str) -> _Node:
        if not isinstance(value, str):
            raise self.fail(path, "$ref must be a string")
        if not value.startswith("#/"):
            raise self.fail(path, f"unsupported $ref {value}, only references into the same document are supported")
        if value not in self.refs:
            self.refs[value] = None  # a cycle back to this $ref stops here
            self.refs[value] = self.build_node(self.resolve_ref(value, path), value)
        node = _RefNode(value)
        self.pending.append(node)
        return node

    def build_alternatives(self, alts: Any, path: str, node: _AnyOfNode | _AllOfNode) -> _Node:
        if not isinstance(alts, list):
            raise self.fail(path, "must be an array of schemas")
        if not alts:
            raise self.fail(path, "must not be empty")
        node.children = [self.build_node(alt, f"{path}/{i}") for i, alt in enumerate(alts)]
        return node

    def build_object(self, schema: dict[str, Any], path: str) -> _Node:
        node = _ObjectNode()
        required: set[str] = set()
        if isinstance(schema.get("required"), list):
            required = {name for name in schema["required"] if isinstance(name, str)}
        if "properties" in schema:
            props = schema["properties"]
            if not isinstance(props, dict):
                raise self.fail(path, "properties must be an object")
            for name, prop in props.items():
                node.properties.append((name, self.build_node(prop, f"{path}/properties/{name}"), name in required))
        if "additionalProperties" in schema:
            additional = schema["additionalProperties"]
            if isinstance(additional, bool):
                node.additional = _AnyNode() if additional else None
            elif isinstance(additional, dict):
                node.additional = self.build_node(additional, f"{path}/additionalProperties")
            else:
                raise self.fail(path, "additionalProperties must be a boolean or a schema")
        elif "properties" not in schema:
            node.additional = _AnyNode()  # {"type": "object"} alone: any object
        return node

    def build_array(self, schema: dict[str, Any], path: str) -> _Node:
        if "items" in schema or "prefixItems" in schema:
            key = "items" if "items" in schema else "prefixItems"
            items = schema[key]
            if isinstance(items, list):  # a tuple; minItems / maxItems are then ignored
                return _TupleNode([self.build_node(item, f"{path}/{key}/{i}") for i, item in enumerate(items)])
            node = _ArrayNode(self.build_node(items, f"{path}/{key}"))
        else:
            node = _ArrayNode(_AnyNode())
        node.min_items = self.get_count(schema, "minItems", path, 0)
        node.max_items = self.get_count(schema, "maxItems", path, -1)
        return node

    def build_string(self, schema: dict[str, Any], path: str) -> _Node:
        node = _StringNode()
        if "pattern" in schema:
            if not isinstance(schema["pattern"], str):
                raise self.fail(path, "pattern must be a string")
            node.pattern = schema["pattern"]
        node.format = self.get_format(schema, path)
        node.min_length = self.get_count(schema, "minLength", path, 0)
        node.max_length = self.get_count(schema, "maxLength", path, -1)
        return node

    def build_integer(self, schema: dict[str, Any], path: str) -> _Node:
        node = _IntegerNode()
        if "minimum" in schema:
            node.minimum = self.get_bound(schema, "minimum", path, round_up=True)
        elif "exclusiveMinimum" in schema:
            node.minimum = _wrap(self.get_bound(schema, "exclusiveMinimum", path, round_up=False) + 1, 64)
        if "maximum" in schema:
            node.maximum = self.get_bound(schema, "maximum", path, round_up=False)
        elif "exclusiveMaximum" in schema:
            node.maximum = _wrap(self.get_bound(schema, "exclusiveMaximum", path, round_up=True) - 1, 64)
        return node

    def build_node(self, schema: Any, path: str) -> _Node:
        if not isinstance(schema, dict):
            raise self.fail(path, "schema must be an object")
        if "$ref" in schema:
            return self.build_ref(schema["$ref"], path)
        if "oneOf" in schema or "anyOf" in schema:
            key = "oneOf" if "oneOf" in schema else "anyOf"
            return self.build_alternatives(schema[key], f"{path}/{key}", _AnyOfNode())

        type_ = schema.get("type")
        if isinstance(type_, list):  # one alternative per type, the other keywords kept
            if not type_:
                raise self.fail(path, "type must not be empty")
            any_of = _AnyOfNode()
            for i, t in enumerate(type_):
                alt = dict(schema)
                alt["type"] = t
                any_of.children.append(self.build_node(alt, f"{path}/type/{i}"))
            return any_of
        if "const" in schema:
            return _ConstNode(schema["const"])
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise self.fail(path, "enum must be a non-empty array")
            return _EnumNode(list(values))
        if type_ is not None and not isinstance(type_, str):
            raise self.fail(path, "type must be a string or an array of strings")

        type_name = type_ if isinstance(type_, str) else ""
        has_properties = "properties" in schema or (
            "additionalProperties" in schema and schema["additionalProperties"] is not True
        )
        if type_name == "":  # no type: the structural keywords decide
            if has_properties:
                return self.build_object(schema, path)
            if "allOf" in schema:
                return self.build_alternatives(schema["allOf"], f"{path}/allOf", _AllOfNode())
            if "items" in schema or "prefixItems" in schema:
                return self.build_array(schema, path)
            if (
                "pattern" in schema
                or "minLength" in schema
                or "maxLength" in schema
                or self.get_format(schema, path) != _FORMAT_NONE
            ):
                return self.build_string(schema, path)
            return _AnyNode()
        if type_name == "object":
            if not has_properties and "allOf" in schema:
                return self.build_alternatives(schema["allOf"], f"{path}/allOf", _AllOfNode())
            return self.build_object(schema, path)
        if type_name == "string":
            if "allOf" in schema:
                return self.build_alternatives(schema["allOf"], f"{path}/allOf", _AllOfNode())
            return self.build_string(schema, path)
        if type_name == "array":
            return self.build_array(schema, path)
        if type_name == "integer":
            return self.build_integer(schema, path)
        if type_name == "number":
            return _NumberNode()
        if type_name == "boolean":
            return _BooleanNode()
        if type_name == "null":
            return _NullNode()
        raise self.fail(path, f"unrecognized type {type_name}")


# --------------------------------------------------------------------- the grammar rules
@dataclass(frozen=True)
class _Builtin:
    content: str
    deps: tuple[str, ...] = ()


_PRIMITIVE_RULES: dict[str, _Builtin] = {
    "boolean": _Builtin('("true" | "false")'),
    "decimal-part": _Builtin("[0-9]{1,16}"),
    "integral-part": _Builtin("[0] | [1-9] [0-9]{0,15}"),
    "number": _Builtin(
        '("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?', ("integral-part", "decimal-part")
    ),
    "integer": _Builtin('("-"? integral-part)', ("integral-part",)),
    "value": _Builtin(
        "object | array | string | number | boolean | null", ("object", "array", "string", "number", "boolean", "null")
    ),
    "object": _Builtin(
        '"{" space ( string ":" space value ("," space string ":" space value)* )? space "}"', ("string", "value")
    ),
    "array": _Builtin('"[" space ( value ("," space value)* )? space "]"', ("value",)),
    "uuid": _Builtin(
        '"\\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\\""'
    ),
    "char": _Builtin('[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt] | "u" [0-9a-fA-F]{4})'),
    "string": _Builtin('"\\"" char* "\\""', ("char",)),
    "null": _Builtin('"null"'),
}

_STRING_FORMAT_RULES: dict[str, _Builtin] = {
    "date": _Builtin('[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )'),
    "time": _Builtin(
        '([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )?'
        ' ( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )'
    ),
    "date-time": _Builtin('date "T" time', ("date", "time")),
    "date-string": _Builtin('"\\"" date "\\""', ("date",)),
    "time-string": _Builtin('"\\"" time "\\""', ("time",)),
    "date-time-string": _Builtin('"\\"" date-time "\\""', ("date-time",)),
}

_RESERVED_NAMES = frozenset({"root", *_PRIMITIVE_RULES, *_STRING_FORMAT_RULES})

_INVALID_RULE_CHARS_RE = re.compile(r"[^a-zA-Z0-9-]+")
_LITERAL_ESCAPES = {"\r": "\\r", "\n": "\\n", '"': '\\"', "\\": "\\\\"}
_LITERAL_ESCAPE_RE = re.compile(r'[\r\n"\\]')

_MAX_PATTERN_DEPTH = 100
_NON_LITERAL_SET = frozenset("|.()[]{}*+?^$")
_ESCAPED_IN_REGEXPS_BUT_NOT_IN_LITERALS = frozenset("^$.[]()|{}*+?")
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def _format_literal(literal: str) -> str:
    return '"' + _LITERAL_ESCAPE_RE.sub(lambda m: _LITERAL_ESCAPES[m.group()], literal) + '"'


def gbnf_format_literal(literal: str) -> str:
    """``literal`` as a GBNF string literal (``"..."``, with ``\\r``, ``\\n``, ``\\"`` and
    ``\\\\`` escaped), as llama.cpp's ``gbnf_format_literal`` writes it."""
    return _from_bytes_str(_format_literal(_to_bytes_str(expect_str("literal", literal))))


def _gbnf_escape_length(pattern: str, pos: int) -> int:
    """Length of the GBNF escape (``\\n``, ``\\x41``, ``\\u00e9``, ...) at ``pos``; 0 if none."""
    if pos + 1 >= len(pattern) or pattern[pos] != "\\":
        return 0
    c = pattern[pos + 1]
    if c in 'trn\\"[]-':
        return 2
    n_hex = {"x": 2, "u": 4, "U": 8}.get(c, 0)
    if n_hex == 0 or pos + 2 + n_hex > len(pattern):
        return 0
    if not all(h in _HEX_DIGITS for h in pattern[pos + 2 : pos + 2 + n_hex]):
        return 0
    return 2 + n_hex


def _build_repetition(item_rule: str, min_items: int, max_items: int, separator_rule: str = "") -> str:
    has_max = max_items != _INT_MAX
    if max_items == 0:
        return ""
    if min_items == 0 and max_items == 1:
        return item_rule + "?"
    if not separator_rule:
        if min_items == 1 and not has_max:
            return item_rule + "+"
        if min_items == 0 and not has_max:
            return item_rule + "*"
        return f"{item_rule}{{{min_items},{max_items if has_max else ''}}}"
    result = (
        item_rule
        + " "
        + _build_repetition(
            f"({separator_rule} {item_rule})",
            0 if min_items == 0 else min_items - 1,
            max_items - 1 if has_max else max_items,
        )
    )
    return f"({result})?" if min_items == 0 else result


def _build_min_max_int(
    min_value: int, max_value: int, out: list[str], decimals_left: int = 16, top_level: bool = True
) -> None:
    """GBNF for the decimal integers in [min_value, max_value] (INT64_MIN / INT64_MAX:
    unbounded), exactly as llama.cpp writes it."""
    has_min = min_value != _INT64_MIN
    has_max = max_value != _INT64_MAX

    def digit_range(lo: str, hi: str) -> None:
        out.append(f"[{lo}]" if lo == hi else f"[{lo}-{hi}]")

    def more_digits(min_digits: int, max_digits: int) -> None:
        out.append("[0-9]")
        if min_digits == max_digits == 1:
            return
        out.append("{" + str(min_digits))
        if max_digits != min_digits:
            out.append("," + (str(max_digits) if max_digits != _INT_MAX else ""))
        out.append("}")

    def dec(c: str) -> str:
        return chr(ord(c) - 1)

    def inc(c: str) -> str:
        return chr(ord(c) + 1)

    def uniform_range(lo: str, hi: str) -> None:
        i = 0
        while i < len(lo) and i < len(hi) and lo[i] == hi[i]:
            i += 1
        if i > 0:
            out.append(f'"{lo[:i]}"')
        if i < len(lo) and i < len(hi):
            if i > 0:
                out.append(" ")
            sub_len = len(lo) - i - 1
            if sub_len > 0:
                lo_sub, hi_sub = lo[i + 1 :], hi[i + 1 :]
                zeros, nines = "0" * sub_len, "9" * sub_len
                to_reached = False
                out.append("(")
                if lo_sub == zeros:
                    digit_range(lo[i], dec(hi[i]))
                    out.append(" ")
                    more_digits(sub_len, sub_len)
                else:
                    out.append(f"[{lo[i]}] (")
                    uniform_range(lo_sub, nines)
                    out.append(")")
                    if ord(lo[i]) < ord(hi[i]) - 1:
                        out.append(" | ")
                        if hi_sub == nines:
                            digit_range(inc(lo[i]), hi[i])
                            to_reached = True
                        else:
                            digit_range(inc(lo[i]), dec(hi[i]))
                        out.append(" ")
                        more_digits(sub_len, sub_len)
                if not to_reached:
                    out.append(" | ")
                    digit_range(hi[i], hi[i])
                    out.append(" ")
                    uniform_range(zeros, hi_sub)
                out.append(")")
            else:
                out.append(f"[{lo[i]}-{hi[i]}]")

    if has_min and has_max:
        if min_value < 0 and max_value < 0:
            out.append('"-" (')
            _build_min_max_int(_wrap(-max_value, 64), _wrap(-min_value, 64), out, decimals_left, True)
            out.append(")")
            return
        if min_value < 0:
            out.append('"-" (')
            _build_min_max_int(0, _wrap(-min_value, 64), out, decimals_left, True)
            out.append(") | ")
            min_value = 0
        min_s, max_s = str(min_value), str(max_value)
        for digits in range(len(min_s), len(max_s)):
            uniform_range(min_s, "9" * digits)
            min_s = "1" + "0" * digits
            out.append(" | ")
        uniform_range(min_s, max_s)
        return

    less_decimals = max(decimals_left - 1, 1)

    if has_min:
        if min_value < 0:
            out.append('"-" (')
            _build_min_max_int(_INT64_MIN, _wrap(-min_value, 64), out, decimals_left, False)
            out.append(") | [0] | [1-9] ")
            more_digits(0, decimals_left - 1)
        elif min_value == 0:
            if top_level:
                out.append("[0] | [1-9] ")
                more_digits(0, less_decimals)
            else:
                more_digits(1, decimals_left)
        elif min_value <= 9:
            c = str(min_value)
            range_start = "1" if top_level else "0"
            if c > range_start:
                digit_range(range_start, dec(c))
                out.append(" ")
                more_digits(1, less_decimals)
                out.append(" | ")
            digit_range(c, "9")
            out.append(" ")
            more_digits(0, less_decimals)
        else:
            min_s = str(min_value)
            length = len(min_s)
            c = min_s[0]
            if c > "1":
                digit_range("1" if top_level else "0", dec(c))
                out.append(" ")
                more_digits(length, less_decimals)
                out.append(" | ")
            digit_range(c, c)
            out.append(" (")
            _build_min_max_int(int(min_s[1:]), _INT64_MAX, out, less_decimals, False)
            out.append(")")
            if c < "9":
                out.append(" | ")
                digit_range(inc(c), "9")
                out.append(" ")
                more_digits(length - 1, less_decimals)
        return

    if has_max:
        if max_value >= 0:
            if top_level:
                out.append('"-" [1-9] ')
                more_digits(0, less_decimals)
                out.append(" | ")
            _build_min_max_int(0, max_value, out, decimals_left, True)
        else:
            out.append('"-" (')
            _build_min_max_int(_wrap(-max_value, 64), _INT64_MAX, out, decimals_left, False)
            out.append(")")
        return

    raise _ConversionFailure("At least one of min_value or max_value must be set")


class _Trie:
    """The property names, by code point (children sorted), for ``_not_strings``."""

    def __init__(self) -> None:
        self.children: dict[int, _Trie] = {}
        self.is_word = False

    def insert(self, word: str) -> None:
        node = self
        for ch in _from_bytes_str(word):
            node = node.children.setdefault(ord(ch), _Trie())
        node.is_word = True


class _Converter:
    """Schema tree -> GBNF rules (llama.cpp's ``common_chat_schema_converter``)."""

    def __init__(self, dotall: bool) -> None:
        self.dotall = dotall
        self.rules: dict[str, str] = {"space": SPACE_RULE}
        self.refs_being_resolved: set[str] = set()
        self.errors: list[str] = []
        self.warnings: list[str] = []

    # ------------------------------------------------------------------ rule table
    def add_rule(self, name: str, rule: str) -> str:
        esc_name = _INVALID_RULE_CHARS_RE.sub("-", name)
        if self.rules.get(esc_name, rule) == rule:
            self.rules[esc_name] = rule
            return esc_name
        i = 0
        while self.rules.get(f"{esc_name}{i}", rule) != rule:
            i += 1
        key = f"{esc_name}{i}"
        self.rules[key] = rule
        return key

    def add_primitive(self, name: str, rule: _Builtin) -> str:
        n = self.add_rule(name, rule.content)
        for dep in rule.deps:
            dep_rule = _PRIMITIVE_RULES.get(dep) or _STRING_FORMAT_RULES[dep]
            if dep not in self.rules:
                self.add_primitive(dep, dep_rule)
        return n

    def format_grammar(self) -> str:
        return "".join(f"{name} ::= {self.rules[name]}\n" for name in sorted(self.rules))

    # ------------------------------------------------------------------ visiting
    def visit(self, node: _Node, name: str) -> str:
        rule_name = name + "-" if name in _RESERVED_NAMES else (name or "root")
        sub_name = name + "-" if name else ""

        if isinstance(node, _RefNode):
            return self.add_rule(rule_name, self.resolve_ref(node))
        if isinstance(node, _AnyOfNode):
            alts = [
                self.visit(alt, f"{name}{'-' if name else 'alternative-'}{i}") for i, alt in enumerate(node.children)
            ]
            return self.add_rule(rule_name, " | ".join(alts))
        if isinstance(node, _AllOfNode):
            return self.visit_all_of(node, name, rule_name)
        if isinstance(node, _ConstNode):
            return self.add_rule(rule_name, _format_literal(_dump(node.value)))
        if isinstance(node, _EnumNode):
            return self.add_rule(rule_name, "(" + " | ".join(_format_literal(_dump(v)) for v in node.values) + ")")
        if isinstance(node, _ObjectNode):
            if not node.properties and isinstance(node.additional, _AnyNode):
                return self.add_rule(rule_name, self.add_primitive("object", _PRIMITIVE_RULES["object"]))
            props = [(prop_name, schema) for prop_name, schema, _ in node.properties]
            required = {prop_name for prop_name, _, req in node.properties if req}
            return self.add_rule(rule_name, self.build_object_rule(props, required, name, node.additional))
        if isinstance(node, _TupleNode):
            parts = [self.visit(item, f"{sub_name}tuple-{i}") for i, item in enumerate(node.items)]
            return self.add_rule(rule_name, '"[" space ' + ' "," space '.join(parts) + ' space "]"')
        if isinstance(node, _ArrayNode):
            if isinstance(node.items, _AnyNode) and node.min_items == 0 and node.max_items < 0:
                return self.visit_primitive(rule_name, "array")
            item_rule = self.visit(node.items, sub_name + "item")
            max_items = _INT_MAX if node.max_items < 0 else node.max_items
            rep = _build_repetition(item_rule, node.min_items, max_items, '"," space')
            return self.add_rule(rule_name, f'"[" space {rep} space "]"')
        if isinstance(node, _StringNode):
            return self.visit_string(node, rule_name)
        if isinstance(node, _IntegerNode):
            if node.minimum == _INT64_MIN and node.maximum == _INT64_MAX:
                return self.visit_primitive(rule_name, "integer")
            out = ["("]
            _build_min_max_int(node.minimum, node.maximum, out)
            out.append(")")
            return self.add_rule(rule_name, "".join(out))
        if isinstance(node, _NumberNode):
            return self.visit_primitive(rule_name, "number")
        if isinstance(node, _BooleanNode):
            return self.visit_primitive(rule_name, "boolean")
        if isinstance(node, _NullNode):
            return self.visit_primitive(rule_name, "null")
        return self.add_rule(rule_name, self.add_primitive("value", _PRIMITIVE_RULES["value"]))

    def visit_primitive(self, rule_name: str, type_name: str) -> str:
        return self.add_primitive("root" if rule_name == "root" else type_name, _PRIMITIVE_RULES[type_name])

    def visit_string(self, node: _StringNode, rule_name: str) -> str:
        if node.pattern:
            return self.visit_pattern(node.pattern, rule_name)
        if node.format == _FORMAT_UUID:
            return self.visit_primitive(rule_name, "uuid")
        if node.format != _FORMAT_NONE:
            prim = {_FORMAT_DATE: "date", _FORMAT_TIME: "time"}.get(node.format, "date-time") + "-string"
            return self.add_rule(rule_name, self.add_primitive(prim, _STRING_FORMAT_RULES[prim]))
        if node.min_length > 0 or node.max_length >= 0:
            char_rule = self.add_primitive("char", _PRIMITIVE_RULES["char"])
            max_len = _INT_MAX if node.max_length < 0 else node.max_length
            return self.add_rule(
                rule_name, '"\\"" ' + _build_repetition(char_rule, node.min_length, max_len) + ' "\\""'
            )
        return self.visit_primitive(rule_name, "string")

    def visit_all_of(self, node: _AllOfNode, name: str, rule_name: str) -> str:
        required: set[str] = set()
        properties: list[tuple[str, _Node]] = []
        enum_counts: dict[str, int] = {}

        def add_component(comp: _Node, is_required: bool, chain: tuple[str, ...] = ()) -> None:
            if isinstance(comp, _RefNode):
                if comp.ref in chain:
                    # llama.cpp follows such a chain forever (and crashes): refuse it
                    loop = " -> ".join((*chain, comp.ref))
                    raise _ConversionFailure(f"$ref cycle in allOf, the $refs only refer to each other: {loop}")
                if comp.target is not None:
                    add_component(comp.target, is_required, (*chain, comp.ref))
            elif isinstance(comp, _ObjectNode):
                for prop_name, schema, _ in comp.properties:
                    properties.append((prop_name, schema))
                    if is_required:
                        required.add(prop_name)
            elif isinstance(comp, _EnumNode):
                for v in comp.values:
                    lit = _format_literal(_dump(v))
                    enum_counts[lit] = enum_counts.get(lit, 0) + 1

        for child in node.children:
            if isinstance(child, _AnyOfNode):
                for alt in child.children:
                    add_component(alt, False)
            else:
                add_component(child, True)
        common = [lit for lit in sorted(enum_counts) if enum_counts[lit] == len(node.children)]
        if common:
            return self.add_rule(rule_name, "(" + " | ".join(common) + ")")
        return self.add_rule(rule_name, self.build_object_rule(properties, required, name, None))

    def resolve_ref(self, node: _RefNode) -> str:
        ref = node.ref
        hash_at = ref.find("#")
        fragment = ref[hash_at + 1 :] if hash_at >= 0 else ref
        ref_name = "ref" + _INVALID_RULE_CHARS_RE.sub("-", fragment)
        if ref_name not in self.rules and ref not in self.refs_being_resolved:
            if node.target is None:
                self.errors.append(f"Unresolved $ref {ref}")
                return ""
            self.refs_being_resolved.add(ref)
            ref_name = self.visit(node.target, ref_name)
            self.refs_being_resolved.discard(ref)
        return ref_name

    # ------------------------------------------------------------------ objects
    def not_strings(self, strings: Sequence[str]) -> str:
        """A JSON string rule for any string except ``strings`` (the other property names)."""
        trie = _Trie()
        for s in strings:
            trie.insert(s)
        char_rule = self.add_primitive("char", _PRIMITIVE_RULES["char"])
        out = ['["] ( ']

        def visit(node: _Trie) -> None:
            rejects = []
            for i, (cpt, child) in enumerate(sorted(node.children.items())):
                c = _to_bytes_str(chr(cpt))
                rejects.append(c)
                if i:
                    out.append(" | ")
                out.append(f"[{c}]")
                if child.children:
                    out.append(" (")
                    visit(child)
                    out.append(")")
                else:
                    out.append(f" {char_rule}+")
            if node.children:
                out.append(f' | [^"{"".join(rejects)}] {char_rule}*')

        visit(trie)
        out.append(" )")
        if not trie.is_word:
            out.append("?")
        out.append(' ["]')
        return "".join(out)

    def build_object_rule(
        self,
        properties: Sequence[tuple[str, _Node]],
        required: set[str],
        name: str,
        additional: _Node | None,
    ) -> str:
        prefix = name + "-" if name else ""
        required_props: list[str] = []
        optional_props: list[str] = []
        kv_rules: dict[str, str] = {}
        prop_names: list[str] = []
        for prop_name, schema in properties:
            value_rule = self.visit(schema, prefix + prop_name)
            kv_rules[prop_name] = self.add_rule(
                f"{prefix}{prop_name}-kv",
                _format_literal(_escape_json_string(prop_name)) + ' space ":" space ' + value_rule,
            )
            (required_props if prop_name in required else optional_props).append(prop_name)
            prop_names.append(prop_name)
        if additional is not None:
            sub_name = prefix + "additional"
            if isinstance(additional, _AnyNode):
                value_rule = self.add_primitive("value", _PRIMITIVE_RULES["value"])
            else:
                value_rule = self.visit(additional, sub_name + "-value")
            if prop_names:
                key_rule = self.add_rule(sub_name + "-k", self.not_strings(prop_names))
            else:
                key_rule = self.add_primitive("string", _PRIMITIVE_RULES["string"])
            kv_rules["*"] = self.add_rule(sub_name + "-kv", f'{key_rule} ":" space {value_rule}')
            optional_props.append("*")

        if not required_props and not optional_props:
            return '"{" space "}"'

        rule = '"{" space ' + ' "," space '.join(kv_rules[p] for p in required_props)
        if optional_props:
            rule += " ("
            if required_props:
                rule += ' "," space ( '

            def recursive_refs(keys: Sequence[str], first_is_optional: bool) -> str:
                if not keys:
                    return ""
                k = keys[0]
                kv = kv_rules[k]
                comma_ref = f'( "," space {kv} )'
                if first_is_optional:
                    res = comma_ref + ("*" if k == "*" else "?")
                else:
                    res = kv + (" " + comma_ref + "*" if k == "*" else "")
                if len(keys) > 1:
                    res += " " + self.add_rule(f"{prefix}{k}-rest", recursive_refs(keys[1:], True))
                return res

            rule += " | ".join(recursive_refs(optional_props[i:], False) for i in range(len(optional_props)))
            if required_props:
                rule += " )"
            rule += " )?"
        return rule + ' space "}"'

    # ------------------------------------------------------------------ patterns
    def visit_pattern(self, pattern: str, name: str) -> str:
        snapshot = dict(self.rules)
        try:
            return self.pattern_to_rule(pattern, name)
        except _UnsupportedPattern as e:
            self.rules = snapshot
            self.warnings.append(f"pattern {pattern} is not supported ({e}), accepting any string")
            return self.add_rule(name, self.add_primitive("string", _PRIMITIVE_RULES["string"]))
        except _InvalidPattern as e:
            self.rules = snapshot
            self.errors.append(f"Invalid pattern {pattern}: {e}")
            return ""

    def pattern_to_rule(self, pattern: str, name: str, quoted: bool = True) -> str:
        """Rule ``name`` for a ``^...$`` pattern: a JSON string of the matching text
        (``quoted``), or the bare text."""
        if len(pattern) < 2 or pattern[0] != "^" or pattern[-1] != "$":
            raise _UnsupportedPattern("not anchored with '^' and '$'")
        sp = pattern[1:-1]
        length = len(sp)
        sub_rule_ids: dict[str, str] = {}
        pos = 0
        depth = 0

        # a sequence item: (text, is_literal); a literal's text goes between quotes
        def to_rule(item: tuple[str, bool]) -> str:
            return f'"{item[0]}"' if item[1] else item[0]

        def get_dot() -> str:
            return self.add_rule("dot", "[\\U00000000-\\U0010FFFF]" if self.dotall else "[^\\x0A\\x0D]")

        def join_seq(seq: list[tuple[str, bool]]) -> tuple[str, bool]:
            parts: list[str] = []
            literal = ""
            for text, is_literal in seq:
                if is_literal:
                    literal += text
                else:
                    if literal:
                        parts.append(f'"{literal}"')
                        literal = ""
                    parts.append(text)
            if literal:
                parts.append(f'"{literal}"')
            return " ".join(parts), False

        def transform() -> tuple[str, bool]:
            nonlocal pos, depth
            seq: list[tuple[str, bool]] = []
            while pos < length:
                c = sp[pos]
                if c == ".":
                    seq.append((get_dot(), False))
                    pos += 1
                elif c == "(":
                    pos += 1
                    if pos < length and sp[pos] == "?":
                        if pos + 1 < length and sp[pos + 1] == ":":
                            pos += 2  # a non-capturing group is a plain group
                        else:
                            raise _UnsupportedPattern("unsupported group syntax")
                    depth += 1
                    if depth > _MAX_PATTERN_DEPTH:
                        raise _UnsupportedPattern("pattern nesting too deep")
                    seq.append(("(" + to_rule(transform()) + ")", False))
                elif c == ")":
                    pos += 1
                    if depth == 0:
                        raise _InvalidPattern("unbalanced parentheses")
                    depth -= 1
                    return join_seq(seq)
                elif c in "^$":
                    raise _UnsupportedPattern("anchor inside the pattern")
                elif c == "[":
                    cls = "["
                    pos += 1
                    while pos < length and sp[pos] != "]":
                        if sp[pos] == "\\":
                            n = _gbnf_escape_length(sp, pos)
                            if n == 0:
                                raise _UnsupportedPattern("unsupported escape in character class: " + sp[pos : pos + 2])
                            cls += sp[pos : pos + n]
                            pos += n
                        else:
                            cls += sp[pos]
                            pos += 1
                    if pos >= length:
                        raise _InvalidPattern("unterminated character class")
                    pos += 1
                    seq.append((cls + "]", False))
                elif c == "|":
                    seq.append(("|", False))
                    pos += 1
                elif c in "*+?":
                    if not seq:
                        raise _InvalidPattern("nothing to repeat")
                    seq[-1] = (to_rule(seq[-1]) + c, False)
                    pos += 1
                elif c == "{":
                    item, pos = self.curly_repetition(sp, name, seq, sub_rule_ids, pos)
                    seq.append(item)
                else:
                    seq.append((read_literal(c), True))
            return join_seq(seq)

        def read_literal(c: str) -> str:
            nonlocal pos
            literal = ""
            while pos < length:
                ch = sp[pos]
                if ch == "\\":
                    if pos == length - 1:
                        raise _InvalidPattern("trailing backslash")
                    if sp[pos + 1] in _ESCAPED_IN_REGEXPS_BUT_NOT_IN_LITERALS:
                        literal += sp[pos + 1]
                        pos += 2
                    else:
                        n = _gbnf_escape_length(sp, pos)
                        if n == 0:
                            raise _UnsupportedPattern("unsupported escape: " + sp[pos : pos + 2])
                        literal += sp[pos : pos + n]
                        pos += n
                elif ch == '"':
                    literal += '\\"'
                    pos += 1
                elif ch not in _NON_LITERAL_SET and (
                    pos == length - 1 or not literal or sp[pos + 1] == "." or sp[pos + 1] not in _NON_LITERAL_SET
                ):
                    literal += ch
                    pos += 1
                else:
                    break
            if not literal:  # nothing consumed: a stray ']' or '}'
                raise _UnsupportedPattern("unsupported character: " + c)
            return literal

        rule = to_rule(transform())
        if depth != 0:
            raise _InvalidPattern("unbalanced parentheses")
        return self.add_rule(name, f'"\\"" ({rule}) "\\""' if quoted else rule)

    def curly_repetition(
        self, sp: str, name: str, seq: list[tuple[str, bool]], sub_rule_ids: dict[str, str], pos: int
    ) -> tuple[tuple[str, bool], int]:
        """The ``{m,n}`` quantifier starting at ``sp[pos]``, applied to (and removing)
        the last item of ``seq``; returns the new item and the position after ``}``."""
        end = sp.find("}", pos + 1)
        if end < 0:
            raise _UnsupportedPattern("unterminated curly brackets")
        nums = sp[pos + 1 : end].split(",")
        if len(nums) not in (1, 2):
            raise _UnsupportedPattern("wrong number of values in curly brackets")
        min_times, max_times = 0, _INT_MAX
        try:
            if len(nums) == 1:
                min_times = max_times = _stoi(nums[0])
            else:
                if nums[0]:
                    min_times = _stoi(nums[0])
                if nums[1]:
                    max_times = _stoi(nums[1])
        except ValueError:
            raise _UnsupportedPattern("invalid number in curly brackets") from None
        if not seq:
            raise _InvalidPattern("nothing to repeat")
        sub, sub_is_literal = seq.pop()
        if not sub_is_literal:
            if not sub_rule_ids.get(sub):
                sub_rule_ids[sub] = ""
                sub_rule_ids[sub] = self.add_rule(f"{name}-{len(sub_rule_ids)}", sub)
            sub = sub_rule_ids[sub]
        rep = _build_repetition(f'"{sub}"' if sub_is_literal else sub, min_times, max_times)
        return (rep, False), end + 1

    def check_errors(self) -> None:
        if self.errors:
            raise SchemaError(_from_bytes_str("JSON schema conversion failed:\n" + "\n".join(self.errors)))
        if self.warnings:
            warnings.warn(
                SchemaWarning(_from_bytes_str("JSON schema conversion was incomplete: " + "; ".join(self.warnings))),
                stacklevel=3,
            )


# ---------------------------------------------------------------------------- the API
def json_schema_to_gbnf(schema: Any, *, compat: str | None = None, **options: Any) -> str:
    """The GBNF grammar (rule ``root``) for the JSON documents ``schema`` accepts.

    By default the complete converter, :func:`samplers.grammar.schema.schema_to_gbnf`
    (every keyword a grammar can enforce, any draft, ``$ref`` resolution, warnings for the
    rest; ``options`` are its keyword arguments: ``property_order``,
    ``additional_properties``, ``formats``, ``validator``, ``strict``, ``default_draft``,
    ``registry``, ``resources``, ``retrieve``). ``compat="llama.cpp"`` gives llama.cpp's
    converter instead, byte for byte (:func:`llama_cpp_json_schema_to_gbnf`; its one
    option is ``dotall``)."""
    if compat is not None and not isinstance(compat, str):
        raise type_error("compat", "None or 'llama.cpp'", compat)
    if compat is None:
        from .schema import schema_to_gbnf

        return schema_to_gbnf(schema, **options)
    if compat != "llama.cpp":
        raise ValueError(f"compat must be None or 'llama.cpp', not {compat!r}")
    return llama_cpp_json_schema_to_gbnf(schema, **options)


def llama_cpp_json_schema_to_gbnf(schema: Mapping[str, Any] | str | bool, *, dotall: bool = False) -> str:
    """The GBNF grammar (rule ``root``) for JSON documents that ``schema`` accepts,
    identical to llama.cpp's ``json_schema_to_grammar(schema)``.

    ``schema`` is a JSON schema: a mapping (of JSON-like values: dicts, lists or tuples,
    strings, ints, floats, bools, None) or its JSON text. A boolean schema is refused,
    as llama.cpp refuses it. ``dotall`` makes ``.`` in a ``pattern`` match line breaks
    too (llama.cpp's ``build_grammar(..., {dotall: true})``; its
    ``json_schema_to_grammar`` always converts with ``dotall`` off).

    Raises :class:`~samplers.grammar.errors.SchemaError` for input that is not JSON and
    wherever llama.cpp throws; the message is llama.cpp's. Warns
    (:class:`SchemaWarning`) where llama.cpp prints a warning and converts a
    ``pattern`` loosely. A ``schema`` that is no JSON value at all is a
    :class:`~samplers.grammar.errors.SchemaTypeError` (also a ``TypeError``).
    """
    if not isinstance(schema, (Mapping, str, bool, int, float, list, tuple)) and schema is not None:
        raise SchemaTypeError(f"schema must be a JSON schema (a mapping, JSON text), not {type(schema).__name__}")
    dotall = expect_bool("dotall", dotall)
    doc = _parse_json(schema) if isinstance(schema, str) else schema
    try:
        root = _normalize(doc)
        converter = _Converter(bool(dotall))
        try:
            tree = _SchemaBuilder(root).build()
            converter.visit(tree, "")
        except _ConversionFailure as e:
            raise SchemaError(_from_bytes_str(f"JSON schema conversion failed:\n{e}")) from None
    except RecursionError:
        raise SchemaError("JSON schema conversion failed: the schema is nested too deeply") from None
    converter.check_errors()
    return _from_bytes_str(converter.format_grammar())
