"""The branch-store state machine (:class:`samplers.testing.BranchMachine`) on the tiny
model, and what the machine found. The machine's model (tree and KV cells) is described
in samplers/testing/_branch_machine.py."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.stateful import rule, run_state_machine_as_test

import samplers as S
from llama_cffi import Context, Model
from llama_cffi.errors import KvCacheFullError
from samplers.branch import BranchStore
from samplers.testing import BranchMachine

N_CTX = 256
N_BATCH = 64
THREADS = {"n_threads": 1, "n_threads_batch": 1}


def budget() -> int:
    """Examples: twice the profile's (conftest): 120 of 50 steps, ~15 s, under the default
    one; more under a bigger one. (A failure then shrinks for up to 5 minutes.)"""
    return 2 * settings().max_examples


@pytest.mark.parametrize("options", [{}, {"batched": False}], ids=["batched", "row-by-row"])
def test_branch_store_state_machine(tiny_model: Model, options: dict[str, object]) -> None:
    """Random create/fork/step/commit/prefill/prune/detach/retain_only/drain (and the
    context-edge operations) keep the store's tree, ids and KV exactly where the model
    puts them; every refused or failed operation changes nothing. On the batched path
    (rows measured at once, zero-copy snapshots) and the row-by-row one."""
    with tiny_model.context(n_ctx=BranchMachine.reference_n_ctx, n_batch=N_BATCH, n_seq_max=1, **THREADS) as reference:

        class Machine(BranchMachine):
            model = tiny_model
            store_options = options

        Machine.reference = reference
        run_state_machine_as_test(
            Machine, settings=settings(max_examples=budget(), stateful_step_count=50, deadline=None)
        )


# ---------------------------------------------------------------------- found by the machine
def _store(model: Model, n_seq_max: int = 2) -> tuple[Context, BranchStore]:
    ctx = model.context(n_ctx=N_CTX, n_batch=N_BATCH, n_seq_max=n_seq_max, kv_unified=True, **THREADS)
    return ctx, BranchStore(ctx)


def test_failed_clear_and_reseed_leaves_no_cells(tiny_model: Model) -> None:
    """A reseed that runs out of cells after its first n_batch chunk: the branch says
    position 0 ("the sequence is empty now"), so the KV must hold nothing for it, and the
    next commit must go on at position 0."""
    ctx, store = _store(tiny_model)
    with ctx:
        a = store.create([1] + [5 + i % 40 for i in range(179)])  # 180 cells
        b = a.fork()  # shares them: 76 cells free
        with pytest.raises(KvCacheFullError):
            a.clear_and_reseed(sinks=4, tail=100)  # a's cells stay (b holds them); 104 needed: 64 fit
        assert a.position == 0
        assert ctx.memory.seq_pos_max(a.seq_id) == -1, "the first chunk of the failed reseed stayed in the KV"
        a.commit(5)
        assert a.position == 1 and ctx.memory.seq_pos_max(a.seq_id) == 0
        assert ctx.memory.seq_pos_max(b.seq_id) == 179


def test_failed_prefill_keeps_a_pending_sample(tiny_model: Model) -> None:
    """A prefill whose second decode finds no cells changes no branch, including one whose
    tokens all went in with the first decode: its pending sample() survives, so committing
    that token records its sampling surprisal."""
    ctx, store = _store(tiny_model)
    with ctx:
        a = store.create([1, 5, 6], sampler=S.SamplerChain([S.TopK(20), S.Dist(3)]))
        b = store.create([1] + [7] * 149)  # 153 cells used, 103 free
        t = a.sample()
        with pytest.raises(KvCacheFullError):
            store.prefill({a: [8] * 10, b: [9] * 100})  # decode 1: a's 10 and 54 of b; decode 2: 46 > 39 free
        assert (a.tokens, a.position, b.position) == ([1, 5, 6], 3, 150)
        a.commit(t)
        assert a.tracker is not None
        assert (a.tracker.count, a.tracker.sampling_count) == (1, 1), "the failed prefill dropped the pending sample"


# ---------------------------------------------------------------------- the exported machine
def test_branch_machine_runs_with_other_settings(tiny_model: Model) -> None:
    """Three branches, n_batch 32, and a reference context the machine makes itself."""

    class Machine(BranchMachine):
        model = tiny_model
        n_seq = 3
        n_batch = 32

    run_state_machine_as_test(Machine, settings=settings(max_examples=10, stateful_step_count=30, deadline=None))


def test_branch_machine_catches_a_rule_that_forgets_the_model(tiny_model: Model) -> None:
    """A user's rule that commits a token without telling the model is caught by the
    invariants: the machine's checks can fail."""

    class Forgetful(BranchMachine):
        model = tiny_model

        @rule()
        def commit_behind_the_models_back(self) -> None:
            live = self.store.branches
            if live and self.cells.free > 0 and live[0].position < self.n_cells:
                live[0].commit(5)

    with pytest.raises(AssertionError, match="the model predicts"):
        run_state_machine_as_test(
            # derandomized: the same (finding) search every run, not a chance of missing it
            Forgetful,
            settings=settings(max_examples=60, stateful_step_count=20, deadline=None, database=None, derandomize=True),
        )
