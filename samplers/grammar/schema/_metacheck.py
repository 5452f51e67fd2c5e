"""A fast, conservative metaschema check: a direct walk of a schema that says whether the
metaschema of draft 2020-12, 2019-09, 7, 6 or 4 accepts it, without ``jsonschema``.

:func:`valid` answers True only where ``jsonschema``'s check against the draft's metaschema
(as :func:`._drafts.meta_validator` builds it) finds no error; False means "not sure": the
caller then asks ``jsonschema``, which decides and words the error. Each keyword the
metaschema (all its vocabularies, for 2019-09 and 2020-12) constrains is checked as the
metaschema says; other keywords take any value, as in the metaschemas. Formats: ``regex``
is judged by :func:`._regex.parse` (ECMA-262; a pattern it cannot enforce is still valid),
cached per pattern; ``uri`` and ``uri-reference`` by the validator's own format checker,
only where it has them (``jsonschema`` asserts a format only where its library is
installed). The ``pattern`` of ``$id`` and of anchors is Python's ``re``, as
``jsonschema`` searches it.

The walk is iterative and stops at :data:`MAX_DEPTH` nested subschemas (False: a schema
that deep is left to ``jsonschema``, which may run out of stack on it); a ``$ref`` is a
string, never followed. Anything this module does not model (a number that is not an int
or a float, a key that is not a string, a pattern the parser fails on unexpectedly) is
"not sure".
"""

from __future__ import annotations

import functools
import re
from typing import Any

from ._regex import RegexSyntaxError, RegexUnsupported, parse

__all__ = ["MAX_DEPTH", "valid"]

#: subschemas nested deeper than this (the root is at 0) are left to ``jsonschema``, which
#: recurses some 12 frames per level
MAX_DEPTH = 32

# what a keyword's value must be
(
    _STR,  # a string
    _BOOL,  # a boolean
    _NUM,  # a number
    _COUNT,  # a non-negative integer
    _MULTIPLE,  # a number > 0
    _ARRAY,  # an array of anything
    _ENUM4,  # a non-empty array of unique values
    _TYPE,  # a simple type name, or a non-empty array of unique ones
    _STRINGS,  # an array of unique strings
    _STRINGS1,  # a non-empty array of unique strings
    _PATTERN,  # a string, an ECMA-262 regex
    _SCHEMA,  # a subschema
    _BOOL_OR_SCHEMA,  # a boolean or a subschema (draft 4, where schemas are objects)
    _SCHEMAS,  # a non-empty array of subschemas
    _ITEMS,  # a subschema or a non-empty array of them
    _SCHEMA_MAP,  # an object of subschemas
    _PATTERN_MAP,  # an object of subschemas named by ECMA-262 regexes
    _PATTERN_MAP4,  # an object of subschemas (draft 4 does not check the names)
    _DEPENDENCIES,  # an object of subschemas or arrays of unique strings
    _DEPENDENCIES4,  # an object of subschemas or non-empty arrays of unique strings
    _DEPENDENT_REQUIRED,  # an object of arrays of unique strings
    _URI,  # a string, format uri
    _URI_REF,  # a string, format uri-reference
    _ID,  # a string, format uri-reference, no non-empty fragment
    _ANCHOR_2019,  # a 2019-09 anchor name
    _ANCHOR_2020,  # a 2020-12 anchor name
    _VOCABULARY,  # an object of booleans named by URIs
) = range(27)

_COMMON = {
    "title": _STR,
    "description": _STR,
    "multipleOf": _MULTIPLE,
    "maximum": _NUM,
    "minimum": _NUM,
    "maxLength": _COUNT,
    "minLength": _COUNT,
    "pattern": _PATTERN,
    "maxItems": _COUNT,
    "minItems": _COUNT,
    "uniqueItems": _BOOL,
    "maxProperties": _COUNT,
    "minProperties": _COUNT,
    "properties": _SCHEMA_MAP,
    "definitions": _SCHEMA_MAP,
    "type": _TYPE,
    "format": _STR,
    "allOf": _SCHEMAS,
    "anyOf": _SCHEMAS,
    "oneOf": _SCHEMAS,
    "not": _SCHEMA,
}
_DRAFT4 = {
    **_COMMON,
    "id": _STR,
    "$schema": _STR,
    "exclusiveMaximum": _BOOL,
    "exclusiveMinimum": _BOOL,
    "additionalItems": _BOOL_OR_SCHEMA,
    "items": _ITEMS,
    "required": _STRINGS1,
    "additionalProperties": _BOOL_OR_SCHEMA,
    "patternProperties": _PATTERN_MAP4,
    "dependencies": _DEPENDENCIES4,
    "enum": _ENUM4,
}
_DRAFT6 = {
    **_COMMON,
    "$id": _URI_REF,
    "$schema": _URI,
    "$ref": _URI_REF,
    "examples": _ARRAY,
    "exclusiveMaximum": _NUM,
    "exclusiveMinimum": _NUM,
    "additionalItems": _SCHEMA,
    "items": _ITEMS,
    "contains": _SCHEMA,
    "required": _STRINGS,
    "additionalProperties": _SCHEMA,
    "patternProperties": _PATTERN_MAP,
    "dependencies": _DEPENDENCIES,
    "propertyNames": _SCHEMA,
    "enum": _ARRAY,
}
_DRAFT7 = {
    **_DRAFT6,
    "$comment": _STR,
    "readOnly": _BOOL,
    "contentMediaType": _STR,
    "contentEncoding": _STR,
    "if": _SCHEMA,
    "then": _SCHEMA,
    "else": _SCHEMA,
}
#: 2019-09 and 2020-12: the vocabularies' keywords they share
_VOCABULARIES = {
    # core
    "$id": _ID,
    "$schema": _URI,
    "$ref": _URI_REF,
    "$vocabulary": _VOCABULARY,
    "$comment": _STR,
    "$defs": _SCHEMA_MAP,
    # applicator
    "contains": _SCHEMA,
    "additionalProperties": _SCHEMA,
    "unevaluatedItems": _SCHEMA,
    "unevaluatedProperties": _SCHEMA,
    "properties": _SCHEMA_MAP,
    "patternProperties": _PATTERN_MAP,
    "dependentSchemas": _SCHEMA_MAP,
    "propertyNames": _SCHEMA,
    "if": _SCHEMA,
    "then": _SCHEMA,
    "else": _SCHEMA,
    "allOf": _SCHEMAS,
    "anyOf": _SCHEMAS,
    "oneOf": _SCHEMAS,
    "not": _SCHEMA,
    # content
    "contentMediaType": _STR,
    "contentEncoding": _STR,
    "contentSchema": _SCHEMA,
    # format
    "format": _STR,
    # meta-data
    "title": _STR,
    "description": _STR,
    "deprecated": _BOOL,
    "readOnly": _BOOL,
    "writeOnly": _BOOL,
    "examples": _ARRAY,
    # validation
    "multipleOf": _MULTIPLE,
    "maximum": _NUM,
    "exclusiveMaximum": _NUM,
    "minimum": _NUM,
    "exclusiveMinimum": _NUM,
    "maxLength": _COUNT,
    "minLength": _COUNT,
    "pattern": _PATTERN,
    "maxItems": _COUNT,
    "minItems": _COUNT,
    "uniqueItems": _BOOL,
    "maxContains": _COUNT,
    "minContains": _COUNT,
    "maxProperties": _COUNT,
    "minProperties": _COUNT,
    "required": _STRINGS,
    "dependentRequired": _DEPENDENT_REQUIRED,
    "enum": _ARRAY,
    "type": _TYPE,
    # the metaschema's own (older keywords kept)
    "definitions": _SCHEMA_MAP,
    "dependencies": _DEPENDENCIES,
}
_DRAFT2019 = {
    **_VOCABULARIES,
    "$anchor": _ANCHOR_2019,
    "$recursiveRef": _URI_REF,
    "$recursiveAnchor": _BOOL,
    "additionalItems": _SCHEMA,
    "items": _ITEMS,
}
_DRAFT2020 = {
    **_VOCABULARIES,
    "$anchor": _ANCHOR_2020,
    "$dynamicRef": _URI_REF,
    "$dynamicAnchor": _ANCHOR_2020,
    "$recursiveRef": _URI_REF,
    "$recursiveAnchor": _ANCHOR_2020,
    "prefixItems": _SCHEMAS,
    "items": _SCHEMA,
}
#: draft -> (keyword -> what its value must be)
_KEYWORDS: dict[str, dict[str, int]] = {
    "2020-12": _DRAFT2020,
    "2019-09": _DRAFT2019,
    "7": _DRAFT7,
    "6": _DRAFT6,
    "4": _DRAFT4,
}

_SIMPLE_TYPES = frozenset({"array", "boolean", "integer", "null", "number", "object", "string"})
#: the metaschemas' patterns, searched with Python's ``re`` as ``jsonschema`` does
_ID_PATTERN = re.compile(r"^[^#]*#?$")
_ANCHOR_PATTERNS = {
    _ANCHOR_2019: re.compile(r"^[A-Za-z][-A-Za-z0-9.:_]*$"),
    _ANCHOR_2020: re.compile(r"^[A-Za-z_][-A-Za-z0-9._]*$"),
}
#: nesting of a draft 4 ``enum`` value deeper than this is left to ``jsonschema``
_MAX_VALUE_DEPTH = 32


class _Unsure(Exception):
    """Something :func:`valid` does not model."""


@functools.lru_cache(maxsize=4096)
def _regex(pattern: str) -> bool | None:
    """The ``regex`` format's verdict on ``pattern`` (None: the parser failed otherwise)."""
    try:
        parse(pattern)
    except RegexUnsupported:
        return True  # valid; the converter warns where it cannot enforce it
    except RegexSyntaxError:
        return False
    except Exception:
        return None
    return True


def _is_regex(v: Any) -> bool:
    return _regex(v) is True if isinstance(v, str) else True  # the format judges strings only


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_strings(v: Any, non_empty: bool) -> bool:
    """An array of unique strings (non-empty where asked)."""
    if not isinstance(v, list) or (non_empty and not v):
        return False
    for x in v:
        if not isinstance(x, str):
            return False
    return len(set(v)) == len(v)


def _key(v: Any, depth: int) -> Any:
    """A hashable key of a JSON value, equal where ``jsonschema``'s ``equal`` says equal
    (numbers by value, booleans apart from numbers); _Unsure for anything else."""
    if isinstance(v, str):
        return (3, v)
    if isinstance(v, bool):
        return (1, v)
    if _is_number(v):
        return (2, v)
    if v is None:
        return (0,)
    if depth >= _MAX_VALUE_DEPTH:
        raise _Unsure
    if isinstance(v, list):
        return (4, tuple(_key(x, depth + 1) for x in v))
    if isinstance(v, dict):
        if not all(isinstance(k, str) for k in v):
            raise _Unsure
        return (5, frozenset((k, _key(x, depth + 1)) for k, x in v.items()))
    raise _Unsure


def _unique(v: list[Any]) -> bool:
    try:
        return len({_key(x, 0) for x in v}) == len(v)
    except _Unsure:
        return False


def valid(data: Any, draft: str, formats: Any = None) -> bool:
    """Whether ``draft``'s metaschema surely accepts ``data`` (False: not sure).

    ``formats`` is the metaschema validator's format checker (its ``checkers`` and
    ``conforms``): ``uri`` and ``uri-reference`` are asserted only where it has them; the
    ``regex`` format is always asserted (ECMA-262)."""
    keywords = _KEYWORDS[draft]
    checkers = getattr(formats, "checkers", {})
    uri = formats.conforms if "uri" in checkers else None
    uri_ref = formats.conforms if "uri-reference" in checkers else None
    booleans = draft != "4"  # draft 4's schemas are objects
    names = draft != "4"  # draft 4 does not check patternProperties' names
    todo: list[tuple[Any, int]] = [(data, 0)]
    push = todo.append
    try:
        while todo:
            s, depth = todo.pop()
            if not isinstance(s, dict):
                if isinstance(s, bool) and booleans:
                    continue
                return False
            if depth > MAX_DEPTH:
                return False
            depth += 1
            for k, v in s.items():
                kind = keywords.get(k) if isinstance(k, str) else None
                if kind is None:
                    continue  # not a keyword of this draft: any value
                if kind == _STR:
                    if not isinstance(v, str):
                        return False
                elif kind == _SCHEMA_MAP:
                    if not isinstance(v, dict):
                        return False
                    for x in v.values():
                        push((x, depth))
                elif kind == _SCHEMA:
                    push((v, depth))
                elif kind == _TYPE:
                    if isinstance(v, str):
                        if v not in _SIMPLE_TYPES:
                            return False
                    elif not isinstance(v, list) or not v:
                        return False
                    else:
                        for t in v:
                            if not isinstance(t, str) or t not in _SIMPLE_TYPES:
                                return False
                        if len(set(v)) != len(v):
                            return False
                elif kind == _COUNT:
                    if not _is_number(v) or v < 0:
                        return False
                    if not isinstance(v, int) and (draft == "4" or not v.is_integer()):
                        return False
                elif kind == _STRINGS or kind == _STRINGS1:
                    if not _is_strings(v, kind == _STRINGS1):
                        return False
                elif kind == _SCHEMAS or kind == _ITEMS:
                    if isinstance(v, list):
                        if not v:
                            return False
                        todo.extend((x, depth) for x in v)
                    elif kind == _SCHEMAS:
                        return False
                    else:
                        push((v, depth))
                elif kind == _PATTERN:
                    if not isinstance(v, str) or _regex(v) is not True:
                        return False
                elif kind == _ARRAY:
                    if not isinstance(v, list):
                        return False
                elif kind == _BOOL:
                    if not isinstance(v, bool):
                        return False
                elif kind == _NUM:
                    if not _is_number(v):
                        return False
                elif kind == _MULTIPLE:
                    if not _is_number(v) or not v > 0:
                        return False
                elif kind == _PATTERN_MAP or kind == _PATTERN_MAP4:
                    if not isinstance(v, dict):
                        return False
                    for n, x in v.items():
                        if names and not _is_regex(n):
                            return False
                        push((x, depth))
                elif kind == _BOOL_OR_SCHEMA:
                    if not isinstance(v, bool):
                        push((v, depth))
                elif kind == _DEPENDENCIES or kind == _DEPENDENCIES4:
                    if not isinstance(v, dict):
                        return False
                    for x in v.values():
                        if isinstance(x, list):
                            if not _is_strings(x, kind == _DEPENDENCIES4):
                                return False
                        else:
                            push((x, depth))
                elif kind == _DEPENDENT_REQUIRED:
                    if not isinstance(v, dict):
                        return False
                    for x in v.values():
                        if not _is_strings(x, False):
                            return False
                elif kind == _ENUM4:
                    if not isinstance(v, list) or not v or not _unique(v):
                        return False
                elif kind == _URI or kind == _URI_REF or kind == _ID:
                    if not isinstance(v, str):
                        return False
                    conforms = uri if kind == _URI else uri_ref
                    if conforms is not None and not conforms(v, "uri" if kind == _URI else "uri-reference"):
                        return False
                    if kind == _ID and _ID_PATTERN.search(v) is None:
                        return False
                elif kind == _ANCHOR_2019 or kind == _ANCHOR_2020:
                    if not isinstance(v, str) or _ANCHOR_PATTERNS[kind].search(v) is None:
                        return False
                elif kind == _VOCABULARY:
                    if not isinstance(v, dict):
                        return False
                    for n, x in v.items():
                        if not isinstance(n, str) or not isinstance(x, bool):
                            return False
                        if uri is not None and not uri(n, "uri"):
                            return False
                else:  # pragma: no cover - every kind is handled above
                    return False
            if not booleans and (
                ("exclusiveMaximum" in s and "maximum" not in s) or ("exclusiveMinimum" in s and "minimum" not in s)
            ):
                return False  # draft 4's metaschema: each needs its bound
    except Exception:
        return False  # something not modelled (a comparison, a format checker's failure)
    return True
