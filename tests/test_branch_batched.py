"""A step's rows measured at once (the batched host path) against the row-by-row path:
same tokens, metrics equal to float64 rounding; zero-copy snapshots that survive other
decodes and failed steps."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import samplers as S
from llama_cffi import Model
from llama_cffi.errors import DecodeAbortedError
from samplers.branch import Branch, BranchStore
from samplers.measure import entropy, surprisal

GRAMMAR = 'root ::= [a-z ]+ "."'
#: grammars that allow few tokens at a time (most first choices rejected) or many, none of
#: them ending within a test's steps
GRAMMARS = ['root ::= [a-z ]{40,} "."', 'root ::= ("the" | " " | "a" | "cat"){40,} "."', 'root ::= [^.]{40,} "."']


def chains(vocab_size: int) -> list[Callable[[int], S.SamplerChain]]:
    """One chain of each kind a store meets: top-k first (sampled from the row's best
    candidates), and chains that need the whole row."""
    return [
        lambda seed: S.SamplerChain([S.TopK(20), S.TopP(0.9), S.Temperature(0.7), S.Dist(seed)]),
        lambda seed: S.SamplerChain([S.TopK(5), S.MinP(0.05), S.Dist(seed)]),
        lambda seed: S.SamplerChain([S.TopK(3), S.Greedy()]),
        lambda seed: S.SamplerChain([S.Penalties(16, 1.3), S.TopK(30), S.Dist(seed)]),  # whole row
        lambda seed: S.SamplerChain([S.Temperature(0.9), S.Dist(seed)]),  # whole row
        lambda seed: S.SamplerChain([S.TopK(vocab_size + 5), S.Dist(seed)]),  # k > vocabulary
    ]


def run(model: Model, batched: bool, n_steps: int, prompt: list[int], with_grammar: bool) -> list[tuple]:
    kinds = chains(model.n_vocab)
    n = len(kinds) * (2 if with_grammar else 1) + (1 if with_grammar else 0)
    with model.context(n_ctx=512, n_batch=64, n_seq_max=n, kv_unified=True, n_threads=2) as ctx:
        store = BranchStore(ctx, batched=batched, n_threads=2)
        root = store.create(prompt, sampler=kinds[0](0))
        branches = [root]
        for i, make in enumerate(kinds[1:], start=1):
            b = root.fork()
            b.set_sampler(make(100 + i))
            branches.append(b)
        if with_grammar:
            g = root.fork(seed=7)
            g.set_grammar(GRAMMAR)
            branches.append(g)
            for i, make in enumerate(kinds):  # every chain kind behind a grammar (the top-k ones batched)
                g = root.fork()
                g.set_sampler(make(200 + i))
                g.set_grammar(GRAMMARS[i % len(GRAMMARS)])
                branches.append(g)
        entropies = []
        for _ in range(n_steps):
            entropies.append([b.entropy for b in branches])
            store.step(store.sample(branches))
        out = [
            (b.tokens, b.perplexity, b.sampling_perplexity, b.tracker.stderr if b.tracker else None) for b in branches
        ]
        out.append(tuple(map(tuple, entropies)))
        return out


def assert_same_runs(a: list[tuple], b: list[tuple]) -> None:
    """Tokens equal; perplexities, stderr and entropies equal to float64 rounding (the
    normaliser's sums are grouped differently)."""
    for x, y in zip(a[:-1], b[:-1], strict=True):
        assert x[0] == y[0]
        for u, v in zip(x[1:], y[1:], strict=True):
            assert u == pytest.approx(v, rel=1e-12, abs=1e-12)
    np.testing.assert_allclose(np.array(a[-1]), np.array(b[-1]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("with_grammar", [False, True])
def test_batched_equals_row_by_row_on_the_tiny_model(tiny_model: Model, with_grammar: bool) -> None:
    """Every chain kind, mixed in one store: the batched path draws the same tokens as the
    row-by-row one; perplexities and entropies agree to float64 rounding (the normaliser's
    sums are taken in other groupings)."""
    prompt = [int(t) for t in tiny_model.tokenize("once upon a time")]
    a = run(tiny_model, True, 10, prompt, with_grammar)
    assert_same_runs(a, run(tiny_model, False, 10, prompt, with_grammar))
    if with_grammar:  # (a chain that begins with a grammar went the batched way, rejections included)
        import samplers.chain_batch as cb

        seen: list[int] = []
        real = cb.choose_constrained

        def spy(*args: Any) -> Any:
            seen.append(len(args[1]))
            return real(*args)

        try:
            cb.choose_constrained = spy  # type: ignore[assignment]
            run(tiny_model, True, 2, prompt, with_grammar)
        finally:
            cb.choose_constrained = real  # type: ignore[assignment]
        assert sum(seen) >= 2 * 4
    assert len({tuple(x[0]) for x in a[:-1]}) > 2  # the branches went different ways


@pytest.mark.default_model
@pytest.mark.parametrize("with_grammar", [False, True])
def test_batched_equals_row_by_row_on_the_default_vocabulary(default_model: Model, with_grammar: bool) -> None:
    """At 262,144 tokens the candidates come from the block-maximum summary (the large-row
    path of the kernel), and a grammar's rejected rows from the masked top-k over the
    whole row: the same tokens and metrics as reading every row whole."""
    prompt = [int(t) for t in default_model.tokenize("The three primary colours are")]
    assert_same_runs(
        run(default_model, True, 6, prompt, with_grammar), run(default_model, False, 6, prompt, with_grammar)
    )


def test_metrics_are_the_reference_measures(tiny_model: Model) -> None:
    """Tracked surprisals and the branch entropy are samplers.measure's, on the row that
    produced each token (kept as a copy here to check against)."""
    with tiny_model.context(n_ctx=256, n_seq_max=4, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        root = store.create(tiny_model.tokenize("the cat"), sampler=S.SamplerChain([S.TopK(10), S.Dist(3)]))
        kids = [root, root.fork(seed=1), root.fork(seed=2)]
        totals = dict.fromkeys(kids, 0.0)
        for _ in range(5):
            moves = store.sample()
            for b, t in moves.items():
                row = b.logits.copy()
                assert b.entropy == pytest.approx(entropy(row), rel=1e-12)
                totals[b] += surprisal(row, t)
            store.step(moves)
        for b in kids:
            assert b.tracker is not None
            assert b.tracker.total_surprisal == pytest.approx(totals[b], rel=1e-12)


def test_snapshots_are_zero_copy_until_something_else_decodes(tiny_model: Model) -> None:
    """After a step every stepped branch reads its row where llama.cpp wrote it; a decode
    of anything else on the context copies those rows out first, so they keep their values."""
    with tiny_model.context(n_ctx=256, n_seq_max=5, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        root = store.create(tiny_model.tokenize("a b c"))
        kids = [root] + [root.fork() for _ in range(2)]
        store.step(store.sample(kids))
        assert all(b._row_i is not None for b in kids)  # nothing copied
        kids.append(kids[1].fork())
        assert kids[-1]._logits is None  # a fork of a zero-copy row shares it
        before = [np.array(store._rows[b._row_i], copy=True) for b in kids]  # type: ignore[index]
        ctx.decode(tiny_model.tokenize("x y z"), pos=0, seq_id=4)  # someone else's decode
        assert store._rows is None and not store._lazy
        for b, want in zip(kids, before, strict=True):
            np.testing.assert_array_equal(b.logits, want)
        other = store.create(tiny_model.tokenize("q"))  # a create decodes too
        np.testing.assert_array_equal(kids[0].logits, before[0])
        other.prune()


def test_a_failed_step_keeps_every_row(tiny_model: Model) -> None:
    """A decode aborted inside llama.cpp changes no branch: tokens, metrics and the rows
    (still read zero-copy from the output buffer, which llama.cpp left as it was)."""
    with tiny_model.context(n_ctx=256, n_seq_max=4, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        root = store.create(tiny_model.tokenize("a b c"), sampler=S.SamplerChain([S.TopK(8), S.Dist(1)]))
        kids = [root, root.fork(seed=5), root.fork(seed=6)]
        store.step(store.sample(kids))
        lazy = [b._row_i is not None for b in kids]
        rows = [np.array(store._rows[b._row_i], copy=True) for b in kids]  # type: ignore[index]
        state = [(b.tokens, b.position, b.perplexity, b.entropy) for b in kids]
        moves = store.sample(kids)
        ctx.set_abort_callback(lambda: True)
        with pytest.raises(DecodeAbortedError):
            store.step(moves)
        ctx.set_abort_callback(None)
        assert lazy == [True] * 3 and all(b._row_i is not None for b in kids)  # still zero-copy
        for b, row, st in zip(kids, rows, state, strict=True):
            assert (b.tokens, b.position, b.perplexity, b.entropy) == st
            np.testing.assert_array_equal(b.logits, row)
            assert ctx.memory.seq_pos_max(b.seq_id) == b.position - 1
        store.step(moves)  # the same moves go through now
        assert all(b.position == st[1] + 1 for b, st in zip(kids, state, strict=True))


def test_forks_share_their_parents_row_and_measures(tiny_model: Model) -> None:
    with tiny_model.context(n_ctx=256, n_seq_max=4, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        root = store.create(tiny_model.tokenize("a b"), sampler=S.SamplerChain([S.TopK(4), S.Dist(2)]))
        store.step(store.sample([root]))
        child = root.fork(seed=9)
        assert child._row_i == root._row_i and child._logits is None
        assert child.entropy == root.entropy
        np.testing.assert_array_equal(child.logits, root.logits)
        empty = root.fork(clone_logits=False)
        assert not store._has_cands[empty.seq_id] and not empty.logits.any()


def test_nan_rows_raise_on_both_paths(tiny_model: Model) -> None:
    from llama_cffi.sampling import InvalidLogitsError

    with tiny_model.context(n_ctx=128, n_seq_max=2, kv_unified=True) as ctx:
        for batched in (True, False):
            store = BranchStore(ctx, batched=batched)
            b = store.create([1, 2], sampler=S.SamplerChain([S.TopK(3), S.Greedy()]))
            b._set_row(np.full(tiny_model.n_vocab, math.nan, dtype=np.float32))
            with pytest.raises(InvalidLogitsError, match="NaN"):
                b.sample()
            store.drain()


def test_rows_without_a_finite_logit_under_a_grammar_raise_on_both_paths(tiny_model: Model) -> None:
    """A grammar before a top-k on a row of -inf logits: the batched path (one branch, or
    the store's group) falls back to the whole row, which finds no allowed candidate, as
    the row-by-row path does (it once went back to the batched path without end)."""
    from llama_cffi.sampling import SamplingError

    with tiny_model.context(n_ctx=128, n_seq_max=2, kv_unified=True) as ctx:
        for batched in (True, False):
            store = BranchStore(ctx, batched=batched)
            a = store.create([1, 2], sampler=S.SamplerChain([S.TopK(3), S.Greedy()]), grammar=GRAMMAR)
            b = a.fork()
            for x in (a, b):
                x._set_row(np.full(tiny_model.n_vocab, -math.inf, dtype=np.float32))
            with pytest.raises(SamplingError, match="no token is allowed"):
                a.sample()
            with pytest.raises(SamplingError, match="no token is allowed"):
                store.sample([a, b])
            store.drain()


def test_store_sample_defaults_to_every_live_branch(tiny_model: Model) -> None:
    with tiny_model.context(n_ctx=128, n_seq_max=3, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        root = store.create([1, 2, 3])
        kids = [root, root.fork()]
        moves = store.sample()
        assert set(moves) == set(kids) and all(isinstance(t, int) for t in moves.values())
        assert isinstance(next(iter(moves)), Branch)


def test_an_error_after_a_completed_decode_keeps_the_step(tiny_model: Model) -> None:
    """When a decode has written its rows and an error comes after (an abort callback's
    exception from a poll llama.cpp did not act on), the step is kept whole and the error
    raised: the rows the branches read and their measures stay one row's."""
    with tiny_model.context(n_ctx=256, n_seq_max=3, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        root = store.create(tiny_model.tokenize("a b c"), sampler=S.SamplerChain([S.TopK(8), S.Dist(1)]))
        kids = [root, root.fork(seed=3)]
        store.step(store.sample(kids))
        before = [b.position for b in kids]
        orig = ctx._after_decode

        def late(rc: int, *a: object) -> None:
            orig(rc, *a)
            if rc == 0:
                raise RuntimeError("late")

        ctx._after_decode = late  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="late"):
            store.step(store.sample(kids))
        ctx._after_decode = orig  # type: ignore[method-assign]
        for b, p in zip(kids, before, strict=True):
            assert b.position == p + 1 == ctx.memory.seq_pos_max(b.seq_id) + 1
            assert b.entropy == pytest.approx(entropy(b.logits), rel=1e-12)
        store.step(store.sample(kids))
        assert all(b.tracker is not None and b.tracker.count == 3 for b in kids)


def check_masks_made_during_the_decode(model: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    import samplers.branch as branch_mod
    import samplers.grammar.masks as masks_mod

    prompt = [int(t) for t in model.tokenize("once upon a time")]
    reference = run(model, False, 8, prompt, True)
    made: list[int] = []
    inside = [False]
    outside: list[int] = []
    real = branch_mod.BranchStore._prefetch_masks
    real_fill = masks_mod.fill_masks

    def counted(self: BranchStore, branches: list[Branch]) -> None:
        inside[0] = True
        try:
            real(self, branches)
        finally:
            inside[0] = False
        firsts = [b.sampler.samplers[0] for b in branches]
        made.append(sum(f._words() is not None for f in firsts if hasattr(f, "_words")))

    def counted_fill(matchers: Any, *args: Any, **kwargs: Any) -> Any:
        if made and not inside[0]:  # (a walk outside a decode, once the store makes its masks there)
            outside.append(len(matchers))
        return real_fill(matchers, *args, **kwargs)

    monkeypatch.setattr(branch_mod, "PREFETCH_WAIT_S", -1.0)
    monkeypatch.setattr(branch_mod, "PREFETCH_KEEP_S", -1.0)
    monkeypatch.setattr(branch_mod.BranchStore, "_prefetch_masks", counted)
    monkeypatch.setattr(masks_mod, "fill_masks", counted_fill)
    assert_same_runs(run(model, True, 8, prompt, True), reference)
    assert len(made) >= 7 and min(made) == 7  # the 7 branches under a grammar got their masks
    # the samples read them: once a step made them (its store saw a wait: forced here),
    # no mask is walked outside a decode
    assert outside == []


def test_masks_made_during_the_decode_change_nothing(monkeypatch: pytest.MonkeyPatch, tiny_model: Model) -> None:
    """A store whose decodes leave the host waiting (a GPU) makes its grammars' masks for
    the new states while the decode runs; here that is forced on the CPU: every chain kind
    behind a grammar draws the same tokens, with the same metrics, as the row-by-row path,
    and the masks were made during the decodes."""
    check_masks_made_during_the_decode(tiny_model, monkeypatch)


@pytest.mark.default_model
def test_masks_made_during_the_decode_change_nothing_on_the_default_vocabulary(
    monkeypatch: pytest.MonkeyPatch, default_model: Model
) -> None:
    """The same at 262,144 tokens (the masked top-k over whole rows)."""
    check_masks_made_during_the_decode(default_model, monkeypatch)


def test_the_mask_policy_follows_the_decodes_wait() -> None:
    """Masks are made during a decode only after a step whose rows arrived late (the
    device still computing once the host's work was done), and stop once a step that
    made them found no time left."""
    import samplers.branch as branch_mod

    store = BranchStore.__new__(BranchStore)
    store._prefetch = False
    store._note_wait(0.0)  # llama.cpp's CPU backend: the rows are there when the call returns
    assert store._prefetch is False
    store._note_wait(branch_mod.PREFETCH_WAIT_S / 2)
    assert store._prefetch is False
    store._note_wait(branch_mod.PREFETCH_WAIT_S * 4)  # a GPU: the host waited
    assert store._prefetch is True
    store._note_wait(branch_mod.PREFETCH_KEEP_S * 4)  # the masks fitted in the decode's time
    assert store._prefetch is True
    store._note_wait(0.0)  # they took all of it: the host set the pace
    assert store._prefetch is False


def test_a_mask_that_fails_during_the_decode_leaves_the_step(
    monkeypatch: pytest.MonkeyPatch, tiny_model: Model
) -> None:
    """Masks made during a decode are a saving, not a requirement: when making them fails,
    the step completes (every branch advanced, its new row attached) and the sample makes
    what it needs itself."""
    import samplers.branch as branch_mod

    def broken(self: BranchStore, todo: list[Branch]) -> None:
        raise RuntimeError("no masks")

    monkeypatch.setattr(branch_mod, "PREFETCH_WAIT_S", -1.0)
    monkeypatch.setattr(branch_mod, "PREFETCH_KEEP_S", -1.0)
    with tiny_model.context(n_ctx=256, n_seq_max=3, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        root = store.create(tiny_model.tokenize("a b c"), sampler=S.SamplerChain([S.TopK(8), S.Dist(1)]))
        root.set_grammar(GRAMMARS[0])
        kids = [root, root.fork(seed=3)]
        store.step(store.sample(kids))
        moves = store.sample(kids)
        monkeypatch.setattr(branch_mod.BranchStore, "_give_masks", broken)
        before = [b.position for b in kids]
        store.step(moves)
        assert store._prefetch  # (it was tried)
        assert [b.position for b in kids] == [p + 1 for p in before]
        for b in kids:
            assert b._row_i is not None
            assert b.entropy == pytest.approx(entropy(b.logits), rel=1e-12)
        monkeypatch.undo()
        store.step(store.sample(kids))  # (a token the grammar refused would raise in its accept)
        assert [b.position for b in kids] == [p + 2 for p in before]
