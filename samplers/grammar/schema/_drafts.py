"""The draft a schema is read under, and its metaschema check.

The metaschema check is ``jsonschema``'s (after a fast walk that decides most valid schemas
without it: :mod:`._metacheck`), with one change: the ``regex`` format (of
``pattern``, and of ``patternProperties`` names from draft 6 on) is judged by
:func:`._regex.parse`, as ECMA-262 reads a pattern, never by Python's ``re``. A valid
pattern with no regular-language meaning (lookaround, backreferences) passes here; the
converter warns where it cannot enforce it. One validator per draft is built on first use
and kept.

Without a recognised ``$schema`` and with ``default_draft=None``, :func:`detect` picks the
draft: see its docstring.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from ..errors import SchemaError
from . import _metacheck
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

#: the older drafts detection may choose, newest first
OLDER = ("7", "6", "4")

#: keywords of older drafts that 2020-12 reads otherwise or not at all: what each is, and
#: the drafts that read it
OLD_KEYWORDS: dict[str, tuple[str, frozenset[str]]] = {
    "items": ("`items` as an array (a tuple, with `additionalItems`)", frozenset({"7", "6", "4"})),
    "dependencies": ("`dependencies`", frozenset({"7", "6", "4"})),
    "exclusiveMinimum": ("a boolean `exclusiveMinimum`", frozenset({"4"})),
    "exclusiveMaximum": ("a boolean `exclusiveMaximum`", frozenset({"4"})),
    "id": ("`id` (without `$id`, in a schema with `$ref`)", frozenset({"4"})),
    "$id": ("`$id` with a plain-name fragment", frozenset({"7", "6"})),
}

#: keywords whose value is a subschema, an array of them, or an object of them (any draft;
#: also what a subschema's shape reads as subschemas, ``_lower.Lowering.shape``)
SUBSCHEMA_ONE = (
    "additionalItems",
    "additionalProperties",
    "contains",
    "contentSchema",
    "else",
    "if",
    "items",
    "not",
    "propertyNames",
    "then",
    "unevaluatedItems",
    "unevaluatedProperties",
)
SUBSCHEMA_MANY = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
SUBSCHEMA_NAMED = ("$defs", "definitions", "dependencies", "dependentSchemas", "patternProperties", "properties")
#: the scan does not look deeper than this
MAX_DEPTH = 128


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
    """The first error ``draft``'s metaschema finds in ``data`` (None: valid): ``jsonschema``'s
    check, the reference (see :func:`first_error`)."""
    try:
        return next(iter(meta_validator(draft).iter_errors(data)), None)
    except RecursionError:
        raise SchemaError("the schema is nested too deeply") from None


def first_error(data: Any, draft: str) -> Any:
    """:func:`meta_error`, skipped where the fast check (:func:`._metacheck.valid`) finds the
    schema valid: ``jsonschema`` decides and words the error only where it is not sure."""
    if _metacheck.valid(data, draft, meta_validator(draft).format_checker):
        return None
    return meta_error(data, draft)


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


def check(data: Any, draft: str | None, lenient: bool = True) -> list[str]:
    """Refuse a schema its draft's metaschema refuses (no check for a draft without one),
    unless every error is harmless (:func:`harmless`, with ``lenient``): then the
    warnings to give (``"<pointer>: <keyword>: <message>"``)."""
    if draft not in _CLASSES:
        return []
    e = first_error(data, draft)
    if e is None:
        return []
    notes = harmless(data, draft) if lenient else None
    if notes is None:
        raise SchemaError(describe(e))
    return notes


def harmless(data: Any, draft: str) -> list[str] | None:
    """The warnings for ``draft``'s metaschema errors in ``data`` when each is one whose
    meaning is plain, else None: values repeated in ``enum``, ``required`` or ``type``
    (read once: validators do), and an empty ``required`` or ``enum`` (draft 4 asks for
    one item: no key required, no value allowed). Real schemas written for validators
    that never checked them have these."""
    notes: list[str] = []
    for e in meta_validator(draft).iter_errors(data):
        found = _harmless(e)
        if found is None:
            return None
        notes += found
    return list(dict.fromkeys(notes))


def _harmless(e: Any) -> list[str] | None:
    """:func:`harmless`'s notes for one error (None: not harmless). Under ``anyOf`` or
    ``oneOf``, those of the first alternative (in the metaschema's order) whose errors
    are all harmless, every one of them, sorted: the order in which ``jsonschema`` lists
    an alternative's errors is not the document's, and can change from process to
    process."""
    path = list(e.absolute_path)
    key = path[-1] if path else None
    where = pointer(path[:-1])
    if e.validator == "uniqueItems" and key in ("enum", "required", "type"):
        return [f"{where}: {key}: repeated values are read once"]
    if e.validator == "minItems" and e.validator_value == 1 and key in ("enum", "required") and e.instance == []:
        meaning = "no key is required" if key == "required" else "no value is allowed"
        return [f"{where}: {key}: an empty array ({meaning})"]
    if e.validator in ("anyOf", "oneOf") and e.context:
        branches: dict[Any, list[Any]] = {}
        for sub in e.context:
            branches.setdefault(sub.relative_schema_path[0], []).append(sub)
        for _, subs in sorted(branches.items(), key=lambda kv: kv[0] if isinstance(kv[0], int) else -1):
            notes = [_harmless(x) for x in subs]
            if all(n is not None for n in notes):
                return sorted({x for n in notes if n is not None for x in n})
    return None


def scan(schema: Any) -> dict[str, str]:
    """The older drafts' keywords (:data:`OLD_KEYWORDS`) in ``schema``'s subschemas, each
    with the pointer of its first use. Only schema positions are looked at: not the
    values of ``enum``, ``const``, ``default`` or ``examples``, nor property names; not
    deeper than :data:`MAX_DEPTH`."""
    found: dict[str, str] = {}
    ids: list[str] = []
    refs = False
    # a subschema's pointer is written out only where it is reported: kept as its
    # parent's and the step to it (see :func:`_pointer`)
    todo: list[tuple[Any, Any, int]] = [(schema, "#", 0)]
    while todo:
        s, where, depth = todo.pop()
        if not isinstance(s, dict):
            continue
        refs = refs or "$ref" in s
        if not _OLD_OR_ID.isdisjoint(s):
            ptr = _pointer(where)
            items = s.get("items")
            if isinstance(items, list):
                found.setdefault("items", f"{ptr}/items")
            if isinstance(s.get("dependencies"), dict):
                found.setdefault("dependencies", f"{ptr}/dependencies")
            for k in ("exclusiveMinimum", "exclusiveMaximum"):
                if isinstance(s.get(k), bool):
                    found.setdefault(k, f"{ptr}/{k}")
            if isinstance(s.get("id"), str) and "$id" not in s:
                ids.append(f"{ptr}/id")
            sid = s.get("$id")
            if isinstance(sid, str) and "#" in sid and not sid.endswith("#"):
                found.setdefault("$id", f"{ptr}/$id")
        if depth >= MAX_DEPTH or _SUBSCHEMA_KEYS.isdisjoint(s):
            continue
        for k in SUBSCHEMA_ONE:
            if isinstance(s.get(k), dict):
                todo.append((s[k], (where, k, None), depth + 1))
        for k in SUBSCHEMA_MANY:
            v = s.get(k)
            if isinstance(v, list):
                todo.extend((x, (where, k, i), depth + 1) for i, x in enumerate(v))
        for k in SUBSCHEMA_NAMED:
            v = s.get(k)
            if isinstance(v, dict):
                todo.extend((x, (where, k, n), depth + 1) for n, x in v.items())
    if ids and refs:  # an identifier only where some $ref may resolve against it
        found["id"] = min(ids, key=len)
    return found


#: the keywords :func:`scan` reports (or reads to decide whether to report them)
_OLD_OR_ID = frozenset({"items", "dependencies", "exclusiveMinimum", "exclusiveMaximum", "id", "$id"})
#: the keywords :func:`scan` finds subschemas under
_SUBSCHEMA_KEYS = frozenset(SUBSCHEMA_ONE + SUBSCHEMA_MANY + SUBSCHEMA_NAMED)


def _pointer(where: Any) -> str:
    """The JSON pointer of a place :func:`scan` keeps: ``"#"``, or (its parent's place,
    the keyword, and None, an index in an array or a name in an object)."""
    steps = []
    while not isinstance(where, str):
        where, k, sub = where
        steps.append(f"/{k}" if sub is None else f"/{k}/{sub}" if isinstance(sub, int) else f"/{k}/{_esc(sub)}")
    return where + "".join(reversed(steps))


def _esc(name: Any) -> str:
    return str(name).replace("~", "~0").replace("/", "~1")


def _uses(found: dict[str, str], keys: Iterable[str]) -> str:
    return ", ".join(f"{OLD_KEYWORDS[k][0]} at {found[k]}" for k in keys)


def _drafts(names: Iterable[str]) -> str:
    names = sorted(names, key=OLDER.index)
    return "draft " + ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + names[-1]


_HOW = 'name another with "$schema" or default_draft='


def detect(data: Any) -> tuple[str, str | None]:
    """The draft a schema without a recognised ``$schema`` is read under, and the warning
    to give (None: none, only where 2020-12's metaschema finds no error in it, so that
    its :func:`check` may be skipped); the metaschema check is done. Raises
    :class:`SchemaError` if the schema is valid under no draft.

    The older drafts' keywords looked for (:func:`scan`) are those whose meaning 2020-12
    changed or dropped: ``items`` as an array (a tuple; ``additionalItems`` means nothing
    without it, in any draft), ``dependencies`` (an object), a boolean
    ``exclusiveMinimum``/``exclusiveMaximum`` (draft 4), ``id`` (a string, beside no
    ``$id``) where the schema has a ``$ref`` that may resolve against it (draft 4), and
    ``$id`` with a plain-name fragment such as ``"#foo"`` (drafts 7 and 6). The draft is,
    among those whose metaschema accepts the schema (2020-12, 7, 6, 4), the one that reads
    the most of the keywords found, the newest on a tie: 2020-12 without a warning when
    none is found; otherwise a warning names the draft read and the keywords behind the
    choice (and those it ignores). 2019-09 is never guessed. An invalid pattern is an
    error in every draft, never a reason to try another.
    """
    found = scan(data)
    first = first_error(data, "2020-12")
    if first is None and not found:
        return "2020-12", None
    if _bad_regex(first):
        raise SchemaError(describe(first))  # invalid in every draft (draft 4 just does not check names)

    def score(d: str) -> int:
        return sum(d in OLD_KEYWORDS[k][1] for k in found)

    for d in sorted(("2020-12", *OLDER), key=score, reverse=True):  # stable: newest first on a tie
        e = first if d == "2020-12" else first_error(data, d)
        if _bad_regex(e):
            raise SchemaError(describe(e))
        if e is not None and harmless(data, d) is None:
            continue
        read = [k for k in found if d in OLD_KEYWORDS[k][1]]
        unread = [k for k in found if k not in read]
        name = "2020-12" if d == "2020-12" else f"draft {d}"
        if read:
            why = f"it uses {_uses(found, read)}"
        elif d != "2020-12":
            why = f"2020-12's metaschema refuses it: {describe(first)}"
        else:
            why = "no older draft that reads its keywords accepts it"
        note = f"#: $schema: none recognised, so the schema is read as {name} ({why})"
        if unread:
            note += f"; {name} ignores {_uses(found, unread)}"
        return d, f"{note}; {_HOW}"
    message = describe(first)
    if found:
        message += (
            " (no recognised $schema, and the schema uses "
            + "; ".join(f"{_uses(found, [k])}, read by {_drafts(OLD_KEYWORDS[k][1])}" for k in found)
            + ': name the draft with "$schema" or default_draft= to see its own errors)'
        )
    raise SchemaError(message)
