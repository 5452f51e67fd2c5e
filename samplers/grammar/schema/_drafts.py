"""The draft a schema is read under, and its metaschema check.

The metaschema check is ``jsonschema``'s, with one change: the ``regex`` format (of
``pattern``, and of ``patternProperties`` names from draft 6 on) is judged by
:func:`._regex.parse`, as ECMA-262 reads a pattern, never by Python's ``re``. A valid
pattern with no regular-language meaning (lookaround, backreferences) passes here; the
converter warns where it cannot enforce it. One validator per draft is built on first use
and kept.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from ..errors import SchemaError
from ._regex import RegexSyntaxError, RegexUnsupported, parse

#: jsonschema's validator class of each draft
_CLASSES = {
    "2020-12": "Draft202012Validator",
    "2019-09": "Draft201909Validator",
    "7": "Draft7Validator",
    "6": "Draft6Validator",
    "4": "Draft4Validator",
}
#: ``referencing``'s specification names
SPEC_DRAFTS = {
    "draft2020-12": "2020-12",
    "draft2019-09": "2019-09",
    "draft-07": "7",
    "draft-06": "6",
    "draft-04": "4",
}


def _is_regex(instance: object) -> bool:
    """The metaschema's ``regex`` format: an ECMA-262 pattern (RegexSyntaxError if not)."""
    if isinstance(instance, str):
        try:
            parse(instance)
        except RegexUnsupported:
            pass  # valid; the converter warns where it cannot enforce it
    return True


@functools.cache
def meta_validator(draft: str) -> Any:
    """The validator of ``draft``'s metaschema, with the draft's format checks and the
    ECMA-262 ``regex`` check (built once per draft)."""
    import jsonschema
    from jsonschema.validators import validator_for

    cls = getattr(jsonschema, _CLASSES[draft])
    meta = validator_for(cls.META_SCHEMA, default=cls)
    checker = jsonschema.FormatChecker(())
    checker.checkers = dict(meta.FORMAT_CHECKER.checkers)
    checker.checks("regex", raises=RegexSyntaxError)(_is_regex)
    return meta(meta.META_SCHEMA, format_checker=checker)


def meta_error(data: Any, draft: str) -> Any:
    """The first error ``draft``'s metaschema finds in ``data`` (None: valid)."""
    try:
        return next(iter(meta_validator(draft).iter_errors(data)), None)
    except RecursionError:
        raise SchemaError("the schema is nested too deeply") from None


def pointer(parts: Iterable[Any]) -> str:
    return "#" + "".join(f"/{_esc(p)}" for p in parts)


def _bad_regex(e: Any) -> bool:
    return e is not None and e.validator == "format" and e.validator_value == "regex"


def describe(e: Any) -> str:
    """A metaschema error as the converter's SchemaError message."""
    where = pointer(e.absolute_path)
    if _bad_regex(e):
        what = f"the name {e.instance!r} is not" if "propertyNames" in e.absolute_schema_path else "not"
        return f"JSON schema error at {where}: {what} a valid ECMA-262 regular expression: {e.cause}"
    return f"JSON schema error at {where}: {e.message}"


def check(data: Any, draft: str | None) -> None:
    """Refuse a schema its draft's metaschema refuses (no check for a draft without one)."""
    if draft not in _CLASSES:
        return
    e = meta_error(data, draft)
    if e is not None:
        raise SchemaError(describe(e))


def _esc(name: Any) -> str:
    return str(name).replace("~", "~0").replace("/", "~1")
