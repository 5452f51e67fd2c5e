"""JSON Schema to GBNF: the complete converter.

:func:`schema_to_gbnf` writes a grammar that accepts the JSON texts whose values the
schema accepts, for drafts 2020-12, 2019-09, 7, 6 and 4. The draft is the one ``$schema``
names; else ``default_draft`` if given; else 2020-12, unless the schema uses a keyword of
an older draft that 2020-12 reads otherwise or not at all (``items`` as an array,
``dependencies``, a boolean ``exclusiveMinimum``, draft 4's ``id``; ``_drafts.detect``
has the rule) or 2020-12's metaschema refuses it: then the newest older draft (7, 6, 4)
that reads it, with a :class:`SchemaWarning` naming the draft. Every keyword a
context-free grammar can enforce is enforced (the private modules ``_lower`` and
``_emit`` say how); what it cannot enforce raises a :class:`SchemaWarning` naming the
keyword and its JSON pointer, or, with ``strict=True``, an :class:`UnsupportedSchemaError`.

Patterns (``pattern``, ``patternProperties``) are ECMA-262 regular expressions, judged by
the project's own parser, never by Python's ``re``: an invalid one is a
:class:`SchemaError` (at its JSON pointer); a valid one a grammar cannot enforce
(lookaround, backreferences) a :class:`SchemaWarning`.

Choices for generation, each a keyword argument:

* ``property_order``: ``"schema"`` (default: the declared keys in the order of
  ``properties``, optional ones may be left out, required keys that ``properties`` does not
  list after them, undeclared keys last: the order real documents, OpenAI's structured
  outputs, llguidance and xgrammar use), ``"required-first"`` (llama.cpp's order: the
  required keys, then the optional ones, each in the order of ``properties``) or
  ``"any"`` (keys in any order: what a validator accepts; each key at most once where an
  object declares at most 6, else the required keys at most once and the others free);
* ``additional_properties``: ``"declared"`` (default: undeclared keys only where the
  schema names them: ``additionalProperties``, ``patternProperties``,
  ``unevaluatedProperties``, or an object schema without ``properties``) or ``"schema"``
  (JSON Schema's default: undeclared keys allowed unless the schema says otherwise);
* ``formats``: ``"assert"`` (default: ``date``, ``time``, ``date-time``, ``duration``,
  ``email``, ``hostname``, ``ipv4``, ``ipv6``, ``uuid``, ``uri`` enforced, other formats
  warned about) or ``"annotate"`` (formats ignored, as validators do by default since
  2019-09).

``validator=True`` makes a validator's semantics the defaults of all three (``"any"``,
``"schema"``, ``"annotate"``); an option given explicitly still wins. It also accepts an
integer written with a zero fraction (``1.0``, an integer to JSON Schema), which
generation leaves out (a model could append zeros without end).

References: ``$ref`` and ``$dynamicRef`` are resolved with ``referencing`` (``$id``
bases, ``$anchor``, ``$dynamicAnchor``, JSON-pointer escapes, recursion); documents
outside the schema come only from ``registry`` (a ``referencing.Registry``),
``resources`` (URI -> schema) or ``retrieve`` (a function from URI to schema), never
from the network.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from llama_cffi._args import expect_bool, expect_callable, expect_mapping, type_error

from ..errors import SchemaError
from ..json_schema import SchemaWarning
from . import _budget, _drafts
from ._budget import LEVELS, Budget
from ._emit import Emitter
from ._lower import Lowering
from ._rules import RuleSet

__all__ = ["SchemaWarning", "UnsupportedSchemaError", "schema_of", "schema_to_gbnf"]

DRAFT_URIS = {
    "2020-12": "https://json-schema.org/draft/2020-12/schema",
    "2019-09": "https://json-schema.org/draft/2019-09/schema",
    "7": "http://json-schema.org/draft-07/schema#",
    "6": "http://json-schema.org/draft-06/schema#",
    "4": "http://json-schema.org/draft-04/schema#",
}


class UnsupportedSchemaError(SchemaError):
    """A keyword the grammar cannot enforce, under ``strict=True``: ``keyword`` and
    ``pointer`` (a JSON pointer into the schema) name it."""

    def __init__(self, keyword: str, pointer: str, message: str) -> None:
        super().__init__(f"{pointer}: {message}")
        self.keyword = keyword
        self.pointer = pointer


def schema_of(schema: Any) -> Any:
    """A schema as JSON data: a dict or bool as is, a JSON string parsed, a pydantic model
    class or ``TypeAdapter`` through its ``model_json_schema()`` / ``json_schema()``
    (pydantic is never imported here)."""
    if isinstance(schema, str):
        try:
            return json.loads(schema)
        except json.JSONDecodeError as e:
            raise SchemaError(f"the schema is not JSON: {e}") from None
    if schema is None or isinstance(schema, dict | bool | list | int | float):
        return schema  # JSON data: anything but an object or a boolean is refused as a schema
    maker = getattr(schema, "model_json_schema", None) or getattr(schema, "json_schema", None)
    if callable(maker):
        return maker()
    raise TypeError(f"schema: expected a dict, a bool, a JSON string or a pydantic model, not {type(schema).__name__}")


def schema_to_gbnf(
    schema: Any,
    *,
    property_order: str | None = None,
    additional_properties: str | None = None,
    formats: str | None = None,
    validator: bool = False,
    strict: bool = False,
    default_draft: str | None = None,
    registry: Any = None,
    resources: Mapping[str, Any] | None = None,
    retrieve: Callable[[str], Any] | None = None,
) -> str:
    """GBNF text (start rule ``root``) for the JSON values ``schema`` accepts (see the
    module's docstring for the options). ``default_draft`` (``"2020-12"``, ``"2019-09"``,
    ``"7"``, ``"6"``, ``"4"``) is the draft of a schema without a recognised ``$schema``;
    None (the default) detects it (2020-12 unless an older draft's keyword says otherwise,
    with a :class:`SchemaWarning`). Raises :class:`SchemaError` for an invalid schema
    (patterns judged as ECMA-262) or an unresolvable reference,
    :class:`UnsupportedSchemaError` under ``strict``."""
    from referencing import Registry, Resource
    from referencing.exceptions import NoSuchResource
    from referencing.jsonschema import specification_with

    validator = expect_bool("validator", validator)
    strict = expect_bool("strict", strict)
    for name, value in (
        ("property_order", property_order),
        ("additional_properties", additional_properties),
        ("formats", formats),
        ("default_draft", default_draft),
    ):
        if value is not None and not isinstance(value, str):
            raise type_error(name, "a str or None", value)
    if registry is not None and not isinstance(registry, Registry):
        raise type_error("registry", "a referencing.Registry or None", registry)
    if resources is not None:
        expect_mapping("resources", resources, "a mapping URI -> schema, or None")
    if retrieve is not None:
        expect_callable("retrieve", retrieve, "callable (URI -> schema) or None")
    defaults = ("any", "schema", "annotate") if validator else ("schema", "declared", "assert")
    property_order = property_order or defaults[0]
    additional_properties = additional_properties or defaults[1]
    formats = formats or defaults[2]
    if property_order not in ("schema", "required-first", "any"):
        raise ValueError(f"property_order must be 'schema', 'required-first' or 'any', not {property_order!r}")
    if additional_properties not in ("declared", "schema"):
        raise ValueError(f"additional_properties must be 'declared' or 'schema', not {additional_properties!r}")
    if formats not in ("assert", "annotate"):
        raise ValueError(f"formats must be 'assert' or 'annotate', not {formats!r}")
    if default_draft is not None and default_draft not in DRAFT_URIS:
        raise ValueError(f"default_draft must be one of {sorted(DRAFT_URIS)}, not {default_draft!r}")
    data = schema_of(schema)
    try:
        text = json.dumps(data, allow_nan=False)  # (allow_nan only refuses: the text json.dumps gives)
    except (TypeError, ValueError) as e:
        raise SchemaError(f"the schema is not JSON data: {e}") from None
    if not isinstance(data, dict | bool):
        raise SchemaError(
            f"JSON schema error at #: a schema must be an object or a boolean, not {json.dumps(data)[:60]}"
        )
    dialect = data.get("$schema") if isinstance(data, dict) else None
    spec = None
    checked = False  # whether the metaschema check below is known to pass
    if isinstance(dialect, str):
        try:
            spec = specification_with(dialect)
        except Exception:
            spec = None  # not a dialect referencing knows: as if absent
    if spec is None and default_draft is None:
        draft, note = _drafts.detect(data)
        if note is not None:
            warnings.warn(SchemaWarning(note), stacklevel=2)
        checked = note is None  # 2020-12, whose metaschema detect found no error in it
        spec = specification_with(DRAFT_URIS[draft])
    elif spec is None:
        spec = specification_with(DRAFT_URIS[default_draft or "2020-12"])

    def fetch(uri: str) -> Any:
        if uri.startswith(_METASCHEMA_HOSTS):  # the drafts' metaschemas, as jsonschema has them
            found = _metaschema(uri)
            if found is not None:
                return found
        if retrieve is None:
            raise NoSuchResource(ref=uri)  # type: ignore[call-arg]
        doc = retrieve(uri)
        if isinstance(doc, Resource):
            return doc
        return Resource.from_contents(doc, default_specification=spec)

    if registry is None:
        reg = Registry(retrieve=fetch)  # type: ignore[call-arg]
    else:
        from jsonschema_specifications import REGISTRY as METASCHEMAS

        reg = METASCHEMAS.combine(registry)
    if resources:
        reg = reg.with_resources(
            (u, Resource.from_contents(d, default_specification=spec)) for u, d in resources.items()
        )
    if not checked:
        for note in _drafts.check(data, _drafts.SPEC_DRAFTS.get(spec.name), lenient=not strict):
            warnings.warn(SchemaWarning(note), stacklevel=2)
    root = Resource(contents=data, specification=spec)  # type: ignore[call-arg]
    try:
        base = root.id() or ""
    except (TypeError, AttributeError, ValueError) as e:
        raise SchemaError(f"JSON schema error at #: invalid $id: {e}") from None
    if not isinstance(base, str):
        raise SchemaError(f"JSON schema error at #: $id must be a string, not {base!r:.60}")
    reg = reg.with_resource(base, root)
    resolver = reg.resolver(base_uri=base)

    annotations = "unevaluated" in text
    dynamic = "$dynamicAnchor" in text or "$dynamicAnchor" in json.dumps(resources or {}) or registry is not None
    reason = ""
    for level, budget in enumerate(LEVELS):
        found: list[tuple[str, str, str]] = []

        def warn(keyword: str, pointer: str, message: str, found: list[tuple[str, str, str]] = found) -> None:
            if strict:
                raise UnsupportedSchemaError(keyword, pointer, message)
            if (keyword, pointer, message) not in found:
                found.append((keyword, pointer, message))

        if level:
            warn(
                "$schema",
                "#",
                f"relaxed: at full precision the grammar would be too large ({reason}); converted again with"
                f" tighter limits ({_limits(budget)})",
            )
        low = Lowering(warn, formats == "assert", budget)
        low.specification = spec
        low.root = resolver
        low.root_doc = data
        low.root_base = base
        low.annotations = annotations
        low.dynamic = dynamic
        rs = RuleSet(max_rules=budget.max_rules)
        em = Emitter(low, rs, warn, property_order, additional_properties, budget)
        em.free_digits = validator
        em.integer_fraction = validator and low.draft() != "draft4"
        try:
            node = low.node(data, resolver, "#")
            rule = em.node(node)
        except RecursionError:
            raise SchemaError("the schema is nested too deeply") from None
        except _budget.TooLarge as e:
            reason = str(e)
            continue  # too large: again under the next budget
        _emit_warnings(_coalesced(found))
        if rule is None:
            # no JSON value meets the schema: a grammar that accepts nothing
            return "root ::= [^\\x00-\\U0010FFFF]\n"
        return rs.text(rule)
    # past every budget: any JSON value
    message = f"relaxed: even with the tightest limits the grammar would be too large ({reason}); any JSON value"
    if strict:
        raise UnsupportedSchemaError("$schema", "#", message)
    _emit_warnings([("$schema", "#", message)])
    rs = RuleSet()
    em = Emitter(Lowering(lambda *_: None, False), rs, lambda *_: None, property_order, additional_properties)
    return rs.text(em.any_value())


def _limits(b: Budget) -> str:
    return (
        f"at most {b.max_atoms} alternatives of a type, oneOf as anyOf past {b.one_of_work} products,"
        f" {b.tracked_required} required keys tracked in any order"
    )


_MERGED = re.compile(r"relaxed: \d+ alternatives of type (\S+) \(")


def _coalesced(found: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """``found`` with one "alternatives merged" warning per pointer and JSON type, the
    first: the products under one subschema are capped again at each keyword that meets
    them (an if chain of 125 branches said so a dozen times at one pointer)."""
    seen: set[tuple[str, str, str]] = set()
    out = []
    for w in found:
        m = _MERGED.match(w[2])
        if m is not None:
            key = (w[0], w[1], m.group(1))
            if key in seen:
                continue
            seen.add(key)
        out.append(w)
    return out


def _emit_warnings(found: list[tuple[str, str, str]]) -> None:
    for keyword, pointer, message in found:
        warnings.warn(SchemaWarning(f"{pointer}: {keyword}: {message}"), stacklevel=3)


_METASCHEMA_HOSTS = ("https://json-schema.org/", "http://json-schema.org/")


def _metaschema(uri: str) -> Any:
    """A draft's metaschema (or vocabulary) by URI, from ``jsonschema_specifications``
    (imported only when a schema refers to one); None if it has no such document."""
    from jsonschema_specifications import REGISTRY

    try:
        return REGISTRY[uri.rstrip("#")]
    except LookupError:
        return None
