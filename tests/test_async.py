"""Async generation: Context.astream/agenerate/arun, samplers.search.astream/acomplete/
agenerate and BranchStore.astep equal their synchronous twins; cancelling aborts the
decode in flight through the abort callback, leaves the context and the store usable and
as they were, and leaks no thread."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

import samplers as S
from llama_cffi import Model
from samplers.branch import BranchStore
from samplers.search import acomplete, agenerate, astream, complete, generate, stream
from tests.conftest import AbortGate

PROMPT = "The capital of France is"


def long_prompt(model: Model) -> list[int]:
    return [int(t) for t in model.tokenize("The quick brown fox jumps over the lazy dog. " * 50)]  # ~550 tokens


def seeded() -> S.SamplerChain:
    return S.SamplerChain([S.TopK(20), S.Temperature(0.9), S.Dist(7)])


def test_context_astream_equals_stream(tiny_model: Model) -> None:
    with tiny_model.context(n_ctx=256) as ctx:
        sync = list(ctx.stream(PROMPT, 20, sampler=seeded()))
    with tiny_model.context(n_ctx=256) as ctx:

        async def main() -> list[str]:
            return [p async for p in ctx.astream(PROMPT, 20, sampler=seeded())]

        assert asyncio.run(main()) == sync
    with tiny_model.context(n_ctx=256) as ctx:
        assert asyncio.run(ctx.agenerate(PROMPT, 20, sampler=seeded())) == "".join(sync)


def test_search_async_equals_sync(tiny_model: Model) -> None:
    """acomplete/agenerate/astream/astep give what complete/generate/stream/step give."""
    with tiny_model.context(n_ctx=256, n_seq_max=4, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        r = complete(store, PROMPT, 16, sampler=seeded(), top_logprobs=2)
        text = generate(store, PROMPT, 16, sampler=seeded())
        b = store.create(tiny_model.tokenize(PROMPT), sampler=seeded())
        pieces = list(stream(b, 12))
        b.prune()
        kids_sync = []
        root = store.create(tiny_model.tokenize(PROMPT))
        kids = [root.fork() for _ in range(2)]
        for _ in range(4):
            store.step({k: k.sample() for k in kids})
        kids_sync = [k.tokens for k in kids]
        root.prune_subtree()

        async def main() -> None:
            ra = await acomplete(store, PROMPT, 16, sampler=seeded(), top_logprobs=2)
            assert ra.tokens == r.tokens and ra.text == r.text and ra.stop_reason == r.stop_reason
            assert ra.logprobs == r.logprobs
            assert await agenerate(store, PROMPT, 16, sampler=seeded()) == text
            b = store.create(tiny_model.tokenize(PROMPT), sampler=seeded())
            s = astream(b, 12)
            assert [p async for p in s] == pieces
            assert s.done and s.result.text == "".join(pieces)
            b.prune()
            root = store.create(tiny_model.tokenize(PROMPT))
            kids = [root.fork() for _ in range(2)]
            for _ in range(4):
                await store.astep({k: k.sample() for k in kids})
            assert [k.tokens for k in kids] == kids_sync
            root.prune_subtree()

        asyncio.run(main())
        assert len(store) == 0


def test_two_contexts_run_concurrently(tiny_model: Model) -> None:
    """Two streams on two contexts interleave on one event loop and give what each gives alone."""
    with tiny_model.context(n_ctx=256) as a, tiny_model.context(n_ctx=256) as b:
        alone = complete(BranchStore(a), PROMPT, 24, sampler=seeded()).tokens
        other = complete(BranchStore(b), "Once upon a time", 24, sampler=seeded()).tokens

        async def main() -> tuple[list[int], list[int]]:
            x, y = await asyncio.gather(
                acomplete(BranchStore(a), PROMPT, 24, sampler=seeded()),
                acomplete(BranchStore(b), "Once upon a time", 24, sampler=seeded()),
            )
            return x.tokens, y.tokens

        assert asyncio.run(main()) == (alone, other)


@pytest.mark.default_model
def test_cancelling_acomplete_aborts_the_prompt_decode(default_model: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelled during its ~550-token prompt decode (held at its first abort poll until the
    cancellation has requested the abort), acomplete's decode stops at its next check, the
    store holds no branch, and the context then generates exactly what a fresh one does."""
    toks = long_prompt(default_model)
    with default_model.context(n_ctx=1024, n_batch=1024, n_ubatch=1024, n_seq_max=2, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        gate = AbortGate()
        gate.release_on_abort_request(ctx, monkeypatch)

        async def main() -> None:
            task = asyncio.ensure_future(acomplete(store, toks, 4))
            assert await asyncio.to_thread(gate.inside.wait, 30)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        with gate.installed(ctx):
            asyncio.run(main())
        assert gate.polls == 1  # aborted at the check after the request, not run to the end
        assert len(store) == 0 and store.available == 2
        assert ctx.memory.seq_pos_max(0) == -1
        after = generate(store, PROMPT, 8)
    with default_model.context(n_ctx=1024, n_seq_max=2, kv_unified=True) as fresh:
        assert after == generate(BranchStore(fresh), PROMPT, 8)


def test_cancelling_astream_keeps_the_branch_consistent(tiny_model: Model) -> None:
    """A stream cancelled mid-way leaves its branch with the tokens committed so far (KV,
    history and position agree); streaming it again continues exactly as an uninterrupted
    greedy stream would."""
    with tiny_model.context(n_ctx=256, n_seq_max=2, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        ref = store.create(tiny_model.tokenize(PROMPT))
        whole = list(stream(ref, 60))
        ref_tokens = ref.tokens
        ref.prune()
        b = store.create(tiny_model.tokenize(PROMPT))
        got: list[str] = []

        async def consume() -> None:
            async for piece in astream(b, 60):
                got.append(piece)
                await asyncio.sleep(0)

        async def main() -> None:
            task = asyncio.ensure_future(consume())
            while len(got) < 5:
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(main())
        n = b.position
        assert len(b.tokens) == n and ctx.memory.seq_pos_max(b.seq_id) == n - 1
        assert b.tokens == ref_tokens[:n]
        list(stream(b, 60 - (n - len(tiny_model.tokenize(PROMPT)))))
        assert b.tokens == ref_tokens
        assert "".join(got) == "".join(whole)[: len("".join(got))]  # what was delivered is a prefix


@pytest.mark.default_model
def test_cancelling_astep_changes_no_branch(default_model: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step over 63 branches, cancelled while it decodes, is aborted: every branch keeps
    its position, history and snapshot; the next step works. The decode is held at its first
    abort poll until the cancellation has requested the abort, so no timing is involved."""
    with default_model.context(n_ctx=512, n_seq_max=64, kv_unified=True, n_batch=512) as ctx:
        store = BranchStore(ctx)
        root = store.create(long_prompt(default_model)[:200])
        kids = [root.fork() for _ in range(63)]
        before = [(k.position, k.tokens, k.logits.copy()) for k in kids]
        moves = {k: int(np.argmax(k.logits)) for k in kids}
        gate = AbortGate()
        gate.release_on_abort_request(ctx, monkeypatch)

        async def main() -> bool:
            task = asyncio.ensure_future(store.astep(moves))
            assert await asyncio.to_thread(gate.inside.wait, 30)  # the decode is in flight
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                return True
            return False

        with gate.installed(ctx):
            cancelled = asyncio.run(main())
        assert cancelled and gate.polls == 1
        after = [(k.position, k.tokens, k.logits.copy()) for k in kids]
        for (p0, t0_, l0), (p1, t1, l1) in zip(before, after, strict=True):
            assert p0 == p1 and t0_ == t1 and np.array_equal(l0, l1)
        store.step({k: int(np.argmax(k.logits)) for k in kids})
        assert all(k.position == p0 + 1 for k, (p0, _, _) in zip(kids, before, strict=True))
        assert all(k.position == k.store.ctx.memory.seq_pos_max(k.seq_id) + 1 for k in kids)
        store.drain()


def test_no_thread_leaks(tiny_model: Model) -> None:
    """Many async runs and cancellations: the process's thread count does not grow."""
    with tiny_model.context(n_ctx=256, n_seq_max=2, kv_unified=True) as ctx:
        store = BranchStore(ctx)

        async def round_trip() -> None:
            await acomplete(store, PROMPT, 4)
            task = asyncio.ensure_future(acomplete(store, PROMPT, 200))
            await asyncio.sleep(0.005)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

        async def main(n: int) -> None:
            for _ in range(n):
                await round_trip()

        asyncio.run(main(2))  # warm-up: the default executor's threads
        threads = threading.active_count()
        for _ in range(5):
            asyncio.run(main(4))
        assert threading.active_count() <= threads
        assert len(store) == 0 and store.available == 2
