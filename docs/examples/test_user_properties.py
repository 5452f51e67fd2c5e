"""A user's property tests with llama_cffi's exported helpers (the suite runs this file
through pytester: tests/test_property_helpers.py). The fixtures come from llama_cffi's
pytest plugin; nothing here is specific to llama_cffi's own tests."""

import json

import numpy as np
from hypothesis import given, settings

from llama_cffi.testing import decode_equivalence
from samplers.branch import BranchStore
from samplers.grammar import Grammar
from samplers.testing import json_schemas


@settings(max_examples=25, deadline=None)
@given(json_schemas(max_depth=2))
def test_structured_output_accepts_every_valid_instance(example):
    grammar = Grammar.from_json_schema(example.schema)
    for value in example.instances:
        assert grammar.accepts(json.dumps(value)), (example.schema, value)


def test_a_forked_branch_equals_a_fresh_decode(tiny_model):
    prompt = [int(t) for t in tiny_model.tokenize("once upon a time")]
    with tiny_model.context(n_ctx=256, n_seq_max=2, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        root = store.create(prompt)
        child = root.fork()
        tok = int(np.argmax(child.logits))
        store.step({child: tok})
        decode_equivalence(tiny_model, [*prompt, tok], child.logits)
