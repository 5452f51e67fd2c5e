"""A user's property tests with llama_cffi's exported helpers (the suite runs this file
through pytester: tests/test_property_helpers.py). The fixtures come from llama_cffi's
pytest plugin; nothing here is specific to llama_cffi's own tests."""

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule, run_state_machine_as_test

from llama_cffi.testing import KvCacheMachine, decode_equivalence
from samplers.branch import BranchStore
from samplers.grammar import Grammar
from samplers.testing import BranchMachine, json_schemas


def rewind(ctx, seq, n):
    """The user's own helper under test: forget the last ``n`` tokens of a sequence."""
    end = ctx.memory.seq_pos_max(seq) + 1
    ctx.memory.seq_rm(seq, max(end - n, 0), -1)


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


def test_rewind_keeps_the_kv_cache_consistent(tiny_model):
    """The exported KV-cache machine, extended with a rule for the user's helper: its
    invariant checks every sequence's positions after each step."""

    class Machine(KvCacheMachine):
        model = tiny_model

        @rule(data=st.data(), n=st.integers(0, 8))
        def rewind(self, data, n):
            seq = self.held(data)
            rewind(self.ctx, seq, n)
            self.kv.rm(seq, max(self.kv.pos_max(seq) + 1 - n, 0), -1)  # what it should do

    run_state_machine_as_test(Machine, settings=settings(max_examples=10, stateful_step_count=20, deadline=None))


def test_branch_store_on_my_settings(tiny_model):
    """The exported branch machine as it is, on the user's choice of sizes."""

    class Machine(BranchMachine):
        model = tiny_model
        n_seq = 2

    run_state_machine_as_test(Machine, settings=settings(max_examples=5, stateful_step_count=20, deadline=None))
