"""The KV-cache state machine (:class:`llama_cffi.testing.KvCacheMachine`) on the tiny
model, its model of the cells, and what the machine found.

The machine and its cell model (:class:`llama_cffi.testing.KvCells`) mirror llama.cpp's
``llama_kv_cache`` (src/llama-kv-cache.cpp and llama-kv-cells.h); see their docstrings.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings
from hypothesis.stateful import rule, run_state_machine_as_test

from llama_cffi import Model, StateError, UnsupportedError
from llama_cffi.testing import KvCacheMachine, KvCells, expect_raises


def test_kv_memory_state_machine(tiny_model: Model) -> None:
    """Random sequences of decodes, seq_rm/cp/keep/add/div and state round trips keep every
    sequence's positions exactly where a cell-level model of llama.cpp's KV cache puts them."""

    class Machine(KvCacheMachine):
        model = tiny_model

    run_state_machine_as_test(Machine, settings=settings(stateful_step_count=30, deadline=None))


# ---------------------------------------------------------------------- pending shifts and state
def _shifted_state_logits(tiny_model: Model, apply_shift_first: bool) -> tuple[np.ndarray, np.ndarray]:
    with tiny_model.context(
        n_ctx=128, n_seq_max=2, kv_unified=True, type_k="f32", type_v="f32", flash_attn_type="disabled"
    ) as ctx:
        ctx.decode(list(range(3, 40)))
        ctx.memory.seq_add(0, -1, -1, 100)  # positions 0..36 -> 100..136, cells stay where they are
        if apply_shift_first:
            ctx.decode_single(7, seq_id=1)  # any decode applies the pending K shift
            ctx.memory.seq_rm(1)
        data = ctx.save_state()
        before = ctx.decode_single(50).copy()
        ctx.load_state(data)
        assert (ctx.memory.seq_pos_min(0), ctx.memory.seq_pos_max(0)) == (100, 136)
        after = ctx.decode_single(50).copy()
        return before, after


def test_state_round_trip_after_applied_shift_reproduces_logits(tiny_model: Model) -> None:
    """A state saved after a shift was applied by a decode restores to exactly the same logits."""
    before, after = _shifted_state_logits(tiny_model, apply_shift_first=True)
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-6)


# llama.cpp saves the cells' shifted positions with K data that the pending RoPE shift has not
# rotated yet, and a restored cache has no pending shift, so the shift would be lost (max logit
# error ~5e-3 here). llama_cffi refuses such a save instead of writing a wrong state.
def test_saving_with_a_pending_shift_is_refused(tiny_model: Model) -> None:
    """save_state/save_seq_state right after seq_add raise StateError until a decode applies the shift."""
    with tiny_model.context(n_ctx=128, n_seq_max=2, kv_unified=True) as ctx:
        ctx.decode(list(range(3, 40)))
        ctx.memory.seq_add(0, -1, -1, 100)
        for save in (ctx.save_state, lambda: ctx.save_seq_state(0)):
            with pytest.raises(StateError, match="pending"):
                save()
        ctx.decode_single(7, seq_id=1)  # applies the shift
        assert len(ctx.save_state()) > 0 and len(ctx.save_seq_state(0)) > 0


# ---------------------------------------------------------------------- the exported machine
@pytest.mark.parametrize("machine", ["kv", "branch"])
@pytest.mark.parametrize("kind", ["swa", "mamba", "hybrid", "t5", "bert"])
def test_machines_refuse_models_without_a_plain_kv_cache(tiny_model_of, kind: str, machine: str) -> None:
    """The cell model is llama.cpp's plain KV cache: both exported machines (this one and
    samplers.testing.BranchMachine) refuse other memories, by name."""
    from samplers.testing import BranchMachine

    base = KvCacheMachine if machine == "kv" else BranchMachine
    with Model.load(str(tiny_model_of(kind))) as model:
        Machine = type("Machine", (base,), {"model": model})
        with pytest.raises(UnsupportedError, match="plain KV cache"):
            Machine()


def test_kv_machine_runs_with_other_settings_and_quantized_weights(tiny_model_of) -> None:
    """Nothing in the machine is tied to the tiny model's sizes: two sequences, n_batch 8,
    Q4_0 weights (CPU repacking). The state round trip's logits tolerance stays 1e-4: the
    same one-token batch is decoded before and after, only the cell order differs."""

    with Model.load(str(tiny_model_of("llama-q4_0"))) as model:

        class Machine(KvCacheMachine):
            n_seq = 2
            n_batch = 8

        Machine.model = model
        run_state_machine_as_test(Machine, settings=settings(max_examples=15, stateful_step_count=20, deadline=None))


def test_kv_machine_catches_a_rule_that_forgets_the_model(tiny_model: Model) -> None:
    """A user's rule that changes the memory without telling ``kv`` is caught by the
    invariant: the machine's checks can fail."""

    class Forgetful(KvCacheMachine):
        model = tiny_model

        @rule()
        def forget(self) -> None:
            if self.kv.pos_max(0) >= 0:
                self.mem.seq_rm(0)  # the model still thinks sequence 0 holds its cells

    with pytest.raises(AssertionError, match="the model predicts"):
        run_state_machine_as_test(
            # derandomized: the same (finding) search every run, not a chance of missing it
            Forgetful,
            settings=settings(max_examples=100, stateful_step_count=20, deadline=None, database=None, derandomize=True),
        )


def test_kv_cells_follow_llama_cpp_semantics() -> None:
    """The cell model: shared cells move together; a shift below 0 frees the cell for
    every sequence in it; seq_rm(-1) frees whatever a cell holds; keep drops the others."""
    kv = KvCells(8)
    kv.add_tokens(0, [0, 1, 2, 3])
    kv.cp(0, 1, 1, 3)  # seq 1 shares positions 1 and 2
    assert kv.positions(1) == [1, 2] and kv.free == 4
    kv.add(1, -1, -1, -2)  # cells at 1 and 2 move to -1 (freed) and 0, for seq 0 too
    assert kv.positions(0) == [0, 0, 3] and kv.positions(1) == [0] and kv.free == 5
    assert kv.shift_pending
    kv.rm(-1, 0, 1)
    assert kv.positions(0) == [3] and kv.pos_min(1) == -1 and kv.free == 7
    kv.add_tokens(2, [5])
    kv.keep(2)
    assert (kv.pos_max(0), kv.positions(2), kv.free) == (-1, [5], 7)


def test_expect_raises() -> None:
    with expect_raises(ValueError, match="b+"):
        raise ValueError("abbb")
    with pytest.raises(AssertionError, match="nothing was raised"):
        with expect_raises(ValueError):
            pass
    with pytest.raises(AssertionError, match="does not match"):
        with expect_raises(ValueError, match="x"):
            raise ValueError("y")
    with pytest.raises(KeyError):  # anything else goes through
        with expect_raises(ValueError):
            raise KeyError("k")
