"""JSON schemas with instances they accept, for :mod:`samplers.testing` (:func:`json_schemas`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, NamedTuple

from llama_cffi._args import expect_int, type_error

from ._hypothesis import _require_hypothesis

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = ["SchemaExample", "json_schemas"]


class SchemaExample(NamedTuple):
    """A JSON schema and JSON values that satisfy it (unpacks as ``schema, instances``)."""

    #: a JSON schema in the subset llama.cpp's converter turns into a grammar
    schema: dict[str, Any]
    #: distinct values that satisfy ``schema`` (at least one)
    instances: tuple[Any, ...]


def json_schemas(
    *, max_depth: int = 3, max_instances: int = 4, property_order: str = "schema"
) -> SearchStrategy[SchemaExample]:
    """JSON schemas with values that satisfy them, for testing structured output.

    Schemas are drawn from what llama.cpp's JSON-schema converter supports and
    :func:`samplers.grammar.Grammar.from_json_schema` reproduces: ``null``, ``boolean``,
    ``integer`` (with ``minimum``/``maximum``, exclusive or not), ``number``, ``string``
    (with ``minLength``/``maxLength``, or an ``enum``/``const``), ``array`` (``items``,
    ``minItems``/``maxItems``), ``object`` (``properties``, some ``required``,
    ``additionalProperties: false``) and ``anyOf``, nested at most ``max_depth`` deep.
    Each example comes with ``max_instances`` or fewer distinct instances drawn from the
    schema itself (every required property present, optional ones sometimes, array
    lengths and numbers within their bounds), so ``json.dumps(instance)`` (any spacing
    the grammar allows) is in the schema's language. Object keys come in the order the
    grammar fixes: with ``property_order="schema"`` (the converter's default) the order of
    ``properties``; with ``"required-first"`` llama.cpp's (``compat="llama.cpp"``, or
    ``property_order="required-first"``): the required properties, then the optional
    ones, each in ``properties`` order::

        @given(samplers.testing.json_schemas())
        def test_my_parser(example):
            grammar = Grammar.from_json_schema(example.schema)
            for value in example.instances:
                assert grammar.accepts(json.dumps(value))
    """
    _require_hypothesis()
    from hypothesis import strategies as st

    max_depth, max_instances = expect_int("max_depth", max_depth), expect_int("max_instances", max_instances)
    if not isinstance(property_order, str):
        raise type_error("property_order", "'schema' or 'required-first'", property_order)
    if property_order not in ("schema", "required-first"):
        raise ValueError(f"property_order must be 'schema' or 'required-first', not {property_order!r}")
    required_first = property_order == "required-first"
    words = st.text(alphabet=st.sampled_from("abcxyz _-"), min_size=1, max_size=6)

    def leaf() -> SearchStrategy[tuple[dict[str, Any], SearchStrategy[Any]]]:
        @st.composite
        def integer(draw: Any) -> tuple[dict[str, Any], SearchStrategy[Any]]:
            lo = draw(st.none() | st.integers(-1000, 1000))
            hi = draw(st.none() | st.integers(lo if lo is not None else -1000, 1000 if lo is None else lo + 2000))
            schema: dict[str, Any] = {"type": "integer"}
            if lo is not None:
                schema["minimum"] = lo
            if hi is not None:
                schema["maximum"] = hi
            return schema, st.integers(lo if lo is not None else -(10**6), hi if hi is not None else 10**6)

        @st.composite
        def string(draw: Any) -> tuple[dict[str, Any], SearchStrategy[Any]]:
            kind = draw(st.sampled_from(["plain", "bounded", "enum", "const"]))
            if kind == "enum":
                values = draw(st.lists(words, min_size=1, max_size=4, unique=True))
                return {"type": "string", "enum": values}, st.sampled_from(values)
            if kind == "const":
                value = draw(words)
                return {"const": value}, st.just(value)
            text = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
            if kind == "plain":
                return {"type": "string"}, text
            lo = draw(st.integers(0, 4))
            hi = draw(st.integers(lo, lo + 6))
            bounded = st.text(alphabet=st.sampled_from('ab"\\é\n'), min_size=lo, max_size=hi)
            return {"type": "string", "minLength": lo, "maxLength": hi}, bounded

        return st.one_of(
            st.just(({"type": "null"}, st.none())),
            st.just(({"type": "boolean"}, st.booleans())),
            integer(),
            # thousandths: json.dumps writes them without an exponent (llama.cpp's number
            # grammar takes no leading zero in one, and Python writes 1e-06)
            st.just(({"type": "number"}, st.integers(-(10**9), 10**9).map(lambda i: i / 1000))),
            string(),
        )

    def compound(
        children: SearchStrategy[tuple[dict[str, Any], SearchStrategy[Any]]],
    ) -> SearchStrategy[tuple[dict[str, Any], SearchStrategy[Any]]]:
        @st.composite
        def array(draw: Any) -> tuple[dict[str, Any], SearchStrategy[Any]]:
            item, values = draw(children)
            lo = draw(st.integers(0, 2))
            hi = draw(st.integers(lo, lo + 3))
            return {"type": "array", "items": item, "minItems": lo, "maxItems": hi}, st.lists(
                values, min_size=lo, max_size=hi
            )

        @st.composite
        def obj(draw: Any) -> tuple[dict[str, Any], SearchStrategy[Any]]:
            names = draw(
                st.lists(st.text(alphabet="abcdefgh", min_size=1, max_size=5), min_size=1, max_size=4, unique=True)
            )
            props = [draw(children) for _ in names]
            required = [n for n in names if draw(st.booleans())]
            schema = {
                "type": "object",
                "properties": {n: p[0] for n, p in zip(names, props, strict=True)},
                "required": required,
                "additionalProperties": False,
            }

            @st.composite
            def instance(d2: Any) -> dict[str, Any]:
                # keys in the order of properties, or required then optional (llama.cpp's)
                order = [n for n in names if n in required] + [n for n in names if n not in required]
                out: dict[str, Any] = {}
                for n, (_, values) in zip(names, props, strict=True):
                    if n in required or d2(st.booleans()):
                        out[n] = d2(values)
                if required_first:
                    out = {n: out[n] for n in order if n in out}
                return out

            return schema, instance()

        @st.composite
        def any_of(draw: Any) -> tuple[dict[str, Any], SearchStrategy[Any]]:
            options = draw(st.lists(children, min_size=2, max_size=3))
            return {"anyOf": [o[0] for o in options]}, st.one_of([o[1] for o in options])

        return st.one_of(array(), obj(), any_of())

    tree = st.recursive(leaf(), compound, max_leaves=max(1, 2**max_depth))

    @st.composite
    def example(draw: Any) -> SchemaExample:
        schema, values = draw(tree)
        instances = draw(st.lists(values, min_size=1, max_size=max_instances, unique_by=lambda v: json.dumps(v)))
        return SchemaExample(schema, tuple(instances))

    return example()
