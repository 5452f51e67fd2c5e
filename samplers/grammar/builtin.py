"""Ready-made GBNF grammars and small grammar builders.

* :data:`JSON`: a JSON object (llama.cpp's ``grammars/json.gbnf`` language),
  :data:`JSON_ARRAY`: a JSON array, :data:`JSON_VALUE`: any JSON value; all three share
  ``json.gbnf``'s rules, whitespace and number syntax (see :data:`JSON`).
* :func:`choice`: exactly one of some literal strings.
* :func:`regex`: text matching a regular expression, through the regular expression
  translation of the JSON schema converter (:mod:`samplers.grammar.json_schema`).
* :func:`json_schema`: JSON documents a JSON schema accepts (llama.cpp's converter).

Every grammar's start rule is ``root``; the values are plain GBNF text, for
``Grammar.from_gbnf`` or llama.cpp's own grammar sampler alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llama_cffi._args import expect_bool, type_error
from llama_cffi.gbnf import GrammarError

from .errors import SchemaError
from .json_schema import _Converter as _SchemaConverter
from .json_schema import (
    _from_bytes_str,
    _InvalidPattern,
    _to_bytes_str,
    _UnsupportedPattern,
    llama_cpp_json_schema_to_gbnf,
)

__all__ = ["JSON", "JSON_ARRAY", "JSON_VALUE", "choice", "json_schema", "regex"]

# The rules of llama.cpp's grammars/json.gbnf (same language, rule for rule): "ws" is
# optional whitespace after a token, numbers have at most 16 integer digits, and the
# exponent is one digit followed by up to 15 non-zero digits (json.gbnf's own rule, so
# "1e5" and "1e25" are accepted but "1e10" is not).
_JSON_RULES = r"""value ::= object | array | string | number | ( "true" | "false" | "null" ) ws
object ::= "{" ws ( member ( "," ws member )* )? "}" ws
member ::= string ":" ws value
array ::= "[" ws ( value ( "," ws value )* )? "]" ws
string ::= "\"" ( char | escape )* "\"" ws
char ::= [^"\\\x7F\x00-\x1F]
escape ::= "\\" ( ["\\bfnrt] | "u" [0-9a-fA-F]{4} )
number ::= "-"? ( [0-9] | [1-9] [0-9]{0,15} ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9] [1-9]{0,15} )? ws
ws ::= | " " | "\n" [ \t]{0,20}
"""

#: A JSON object, optionally followed by whitespace: the language of llama.cpp's
#: ``grammars/json.gbnf`` (``ws`` is nothing, a space, or a newline and up to 20 spaces
#: or tabs, allowed after every token; no whitespace before the opening ``{``).
JSON: str = "root ::= object\n" + _JSON_RULES

#: A JSON array (``[ ... ]``, optionally followed by whitespace), with :data:`JSON`'s
#: rules.
JSON_ARRAY: str = "root ::= array\n" + _JSON_RULES

#: Any JSON value (object, array, string, number, ``true``, ``false`` or ``null``,
#: optionally followed by whitespace), with :data:`JSON`'s rules.
JSON_VALUE: str = "root ::= value\n" + _JSON_RULES


def _literal(text: str) -> str:
    """``text`` as a GBNF string literal; every control character is escaped (``\\xHH``),
    so the grammar text stays on one line."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch) or f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def choice(*strings: str) -> str:
    """A grammar accepting exactly one of ``strings`` (each literally, nothing around it).

    ``choice("yes", "no")`` is ``root ::= "yes" | "no"``. Duplicates are kept once; an
    empty string makes the empty text acceptable. Raises :class:`GrammarError` without
    strings, or for a NUL character (llama.cpp's grammar text cannot hold one).
    """
    if not strings:
        raise GrammarError("choice() needs at least one string")
    for s in strings:
        if not isinstance(s, str):
            raise GrammarError(f"choice() takes strings, not {type(s).__name__} ({s!r})")
        if "\0" in s:
            raise GrammarError(f"a grammar literal cannot contain a NUL character: {s!r}")
    unique = list(dict.fromkeys(strings))
    return "root ::= " + " | ".join(_literal(s) for s in unique) + "\n"


def _strip_anchors(pattern: str) -> str:
    if pattern.startswith("^"):
        pattern = pattern[1:]
    if pattern.endswith("$"):
        backslashes = len(pattern[:-1]) - len(pattern[:-1].rstrip("\\"))
        if backslashes % 2 == 0:  # not an escaped "\$"
            pattern = pattern[:-1]
    return pattern


def regex(pattern: str, *, dotall: bool = False) -> str:
    """A grammar accepting exactly the texts that match ``pattern`` as a whole.

    The regular expression subset is the JSON schema converter's (llama.cpp's): literal
    characters, ``.``, character classes ``[...]`` / ``[^...]`` (with GBNF escapes such
    as ``\\n``, ``\\x41``, ``\\u00e9``), groups ``(...)`` / ``(?:...)``, alternation
    ``|`` and the quantifiers ``* + ? {m} {m,} {m,n}``; ``^`` / ``$`` at the ends are
    optional (the match is always whole). ``.`` matches any character but ``\\n`` and
    ``\\r``, or any character at all with ``dotall``. Shorthands such as ``\\d`` / ``\\w``,
    lookarounds, backreferences and inner anchors are refused.

    The rules are the converter's for a ``pattern`` (``root``, ``dot``, ``root-1``, ...),
    without the JSON string quotes around it. Raises :class:`SchemaError` naming the
    unsupported or invalid part.
    """
    if not isinstance(pattern, str):
        raise type_error("pattern", "a str (a regular expression)", pattern)
    dotall = expect_bool("dotall", dotall)
    body = _to_bytes_str(f"^(?:{_strip_anchors(pattern)})$")
    converter = _SchemaConverter(bool(dotall))
    del converter.rules["space"]  # no JSON around the text: the whitespace rule is unused
    try:
        converter.pattern_to_rule(body, "root", quoted=False)
    except (_UnsupportedPattern, _InvalidPattern) as e:
        raise SchemaError(f"unsupported regular expression {pattern!r}: {e}") from None
    return _from_bytes_str(converter.format_grammar())


def json_schema(schema: Mapping[str, Any] | str | bool, *, dotall: bool = False) -> str:
    """The grammar of JSON documents accepted by ``schema``: an alias of
    :func:`~samplers.grammar.json_schema.llama_cpp_json_schema_to_gbnf` (llama.cpp's converter;
    the complete one is :func:`samplers.grammar.schema.schema_to_gbnf`)."""
    return llama_cpp_json_schema_to_gbnf(schema, dotall=dotall)
