"""The exported property-testing helpers: samplers.testing.json_schemas (schemas with
instances that satisfy them) and llama_cffi.testing.decode_equivalence, and the user-side
example file of the docs run through pytester as a user would run it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings

from llama_cffi import Model
from llama_cffi.testing import decode_equivalence
from samplers.branch import BranchStore
from samplers.grammar import Grammar
from samplers.testing import SchemaExample, json_schemas

pytest_plugins = ["pytester"]
EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "test_user_properties.py"


@settings(max_examples=60, deadline=None)
@given(json_schemas())
def test_json_schema_instances_are_in_the_grammar(example: SchemaExample) -> None:
    """Every instance satisfies its schema as the grammar llama.cpp's converter makes of it
    sees it, compact and indented."""
    assert example.instances
    grammar = Grammar.from_json_schema(example.schema)
    for value in example.instances:
        assert grammar.accepts(json.dumps(value)), (example.schema, value)
        assert grammar.accepts(json.dumps(value, indent=1)), (example.schema, value)


@settings(max_examples=40, deadline=None)
@given(json_schemas(max_depth=2, property_order="required-first"))
def test_json_schema_instances_in_llama_cpp_order(example: SchemaExample) -> None:
    """With ``property_order="required-first"`` the instances list the required keys first,
    as llama.cpp's converter and the converter's ``"required-first"`` order take them."""
    for options in ({"compat": "llama.cpp"}, {"property_order": "required-first"}):
        grammar = Grammar.from_json_schema(example.schema, **options)
        for value in example.instances:
            assert grammar.accepts(json.dumps(value)), (options, example.schema, value)


def test_json_schemas_takes_known_orders() -> None:
    with pytest.raises(ValueError, match="property_order"):
        json_schemas(property_order="any")


@settings(max_examples=40, deadline=None)
@given(json_schemas(max_depth=1))
def test_json_schemas_constrain(example: SchemaExample) -> None:
    """The schemas are not vacuous: a value of another JSON type is refused unless the
    schema allows several types (anyOf)."""
    grammar = Grammar.from_json_schema(example.schema)
    if "anyOf" in example.schema or "const" in example.schema:
        return
    other = {"object": [1], "array": {"x": 1}, "string": 5, "integer": "x", "number": "x", "boolean": None, "null": 1}
    assert not grammar.accepts(json.dumps(other[example.schema["type"]]))


def test_decode_equivalence(tiny_model: Model) -> None:
    """A branch stepped in a batch of three equals a fresh sequential decode within the
    default tolerance; logits after another prefix do not, and the error says by how much."""
    prompt = [int(t) for t in tiny_model.tokenize("once upon a time")]
    with tiny_model.context(n_ctx=256, n_seq_max=4, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        root = store.create(prompt)
        kids = [root.fork() for _ in range(3)]
        store.step({k: 5 + i for i, k in enumerate(kids)})
        diff = decode_equivalence(tiny_model, [*prompt, 5], kids[0].logits)
        assert 0.0 <= diff < 2e-3
        with pytest.raises(AssertionError, match="differ from a fresh one-token-at-a-time decode"):
            decode_equivalence(tiny_model, [*prompt, 6], kids[0].logits)
        with pytest.raises(AssertionError, match="shape"):
            decode_equivalence(tiny_model, prompt, np.zeros(3))


def test_user_example_file_runs_under_pytester(pytester: pytest.Pytester) -> None:
    """docs/examples/test_user_properties.py, as a user's own test file with the plugin's
    fixtures, passes."""
    pytester.makepyfile(test_user_properties=textwrap.dedent(EXAMPLE.read_text()))
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=600)
    res.assert_outcomes(passed=4)
