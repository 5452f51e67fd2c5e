"""The prompt cache (samplers.prompt_cache): prompts' KV kept in a BranchStore across calls
of complete, generate_many and ChatSession, copied by later prompts that start the same
way; bounded by entries and tokens (least recently used first), yielding its sequence ids
and KV cells when a caller needs them, and leaving results as they would be without it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from llama_cffi import Model
from llama_cffi.errors import ParamError, ParamTypeError
from samplers.branch import BranchError, BranchStore
from samplers.chat import ChatSession
from samplers.many import ManyStats, generate_many
from samplers.prompt_cache import PromptCache
from samplers.search import acomplete, complete


@pytest.fixture(scope="module")
def exact_model(default_model_path: Path) -> Iterator[Model]:
    """The default model without weight repacking (docs/guide/branches.md, "Tolerances")."""
    m = Model.load(default_model_path, use_extra_bufts=False)
    yield m
    m.close()


def header_and_suffixes(model: Model, n: int) -> tuple[list[int], list[list[int]]]:
    vocab = model.vocab
    header = [int(t) for t in vocab.tokenize("You are a terse assistant. Answer in one word. " * 3)]
    words = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu")
    suffixes = [[int(t) for t in vocab.tokenize(f" {w.capitalize()} is the answer:", add_special=False)] for w in words]
    assert len({s[0] for s in suffixes}) == len(suffixes)  # they part right after the header
    return header, suffixes[:n]


def test_complete_reuses_an_earlier_prompt(exact_model: Model) -> None:
    """The second prompt copies the first one's header (``cached_tokens``) and decodes only
    its own tokens; its result is the one without a cache: the same tokens, and the same
    log-probability under the exactness conditions (no repacking, one thread, micro-batches
    of at most 7 rows, and every sequence's cells in position order: a context whose cells
    are never reused, n_ctx well above what the calls write) up to 1e-12 relative: the
    first token's log-normaliser is summed (float64) by BranchStore.create's path without a
    cache and by the step's row kernel with one, in another order (~1e-15 apart)."""
    header, (a, b) = header_and_suffixes(exact_model, 2)
    params = {"n_ctx": 2048, "n_batch": 8, "n_ubatch": 4, "n_seq_max": 4, "kv_unified": True, "n_threads": 1}
    with exact_model.context(**params) as ctx:
        store = BranchStore(ctx)
        cache = PromptCache(store)
        first = complete(store, header + a, max_tokens=4, cache=cache)
        assert first.cached_tokens == 0
        assert len(cache) == 1 and cache.entries[0] == header + a + first.tokens
        second = complete(store, header + b, max_tokens=4, cache=cache)
        assert second.cached_tokens == len(header)
        assert cache.stats.lookups == 2 and cache.stats.hits == 1 and cache.stats.reused_tokens == len(header)
        assert len(cache) == 2
    with exact_model.context(**params) as ctx:
        plain = complete(BranchStore(ctx), header + b, max_tokens=4)
    assert second.tokens == plain.tokens
    assert second.logprob == pytest.approx(plain.logprob, rel=1e-12, abs=0)


def test_a_header_is_decoded_once_across_generate_many_calls(exact_model: Model) -> None:
    """Several generate_many calls with the same header: the first decodes it, every later
    prompt of every call copies it (the prefill is the header once plus the suffixes), and
    the results are those of the calls without a cache: the same greedy tokens and
    log-probabilities to 1e-5 under the exactness conditions but one (no repacking, one
    thread, micro-batches of at most 7 rows; but the cells freed by one call are reused by
    the next out of position order, so attention sums in another order: float32 rounding)."""
    header, suffixes = header_and_suffixes(exact_model, 12)
    calls = [suffixes[i : i + 4] for i in range(0, 12, 4)]
    params = {"n_ctx": 4096, "n_batch": 8, "n_ubatch": 4, "n_seq_max": 6, "kv_unified": True, "n_threads": 1}
    with exact_model.context(**params) as ctx:
        store = BranchStore(ctx)
        cache = PromptCache(store, max_entries=2)
        total = ManyStats()
        results = []
        for part in calls:
            st = ManyStats()
            results += generate_many(store, [header + s for s in part], max_tokens=3, cache=cache, stats=st)
            total.prefill_tokens += st.prefill_tokens
            total.shared_tokens += st.shared_tokens
        assert total.prefill_tokens == len(header) + sum(len(s) for s in suffixes)
        assert total.shared_tokens == len(header) * (len(suffixes) - 1)
        assert [r.cached_tokens for r in results] == [0] + [len(header)] * (len(suffixes) - 1)
        assert len(cache) <= 2 and len(store) == len(cache)  # only the entries are left
    with exact_model.context(**params) as ctx:
        plain = generate_many(BranchStore(ctx), [header + s for s in suffixes], max_tokens=3, share_prefixes=False)
    assert [r.tokens for r in results] == [r.tokens for r in plain]
    assert [r.logprob for r in results] == pytest.approx([r.logprob for r in plain], rel=1e-5)


def test_bounds_and_least_recently_used_order(default_model: Model) -> None:
    """At most ``max_entries`` entries and ``max_tokens`` tokens; the least recently used
    goes first (a lookup that hits counts as a use); an entry the new one extends is
    dropped, and a prompt an entry already holds is not added again."""
    vocab = default_model.vocab
    p = [[int(t) for t in vocab.tokenize(f"Prompt number {w} goes here.")] for w in ("one", "two", "three")]
    with default_model.context(n_ctx=1024, n_seq_max=8, kv_unified=True, n_threads=1) as ctx:
        store = BranchStore(ctx)
        cache = PromptCache(store, max_entries=2, max_tokens=1000)
        assert cache.warm(p[0]) == len(p[0])
        common = next(i for i, (x, y) in enumerate(zip(p[0], p[1], strict=False)) if x != y)
        assert common >= 2  # BOS, "Prompt", ...
        assert cache.warm(p[1]) == len(p[1]) - common  # copied from the first
        assert cache.warm(p[0]) == 0 and cache.entries == [p[1], p[0]]  # used: most recent
        cache.warm(p[2])  # evicts p[1], the least recently used
        assert cache.entries == [p[0], p[2]] and cache.stats.evicted == 1
        assert store.available == 8 - 2
        longer = p[2] + [int(t) for t in vocab.tokenize(" And more.", add_special=False)]
        cache.warm(longer)  # extends p[2]: replaces it
        assert cache.entries == [p[0], longer]
        cache.max_tokens = len(longer)
        cache.warm(p[1])
        assert cache.tokens <= len(longer) and cache.entries[-1] == p[1]
        cache.clear()
        assert len(cache) == 0 and len(store) == 0 and store.available == 8


def test_the_cache_yields_ids_and_cells(default_model: Model) -> None:
    """A caller that needs a sequence id or KV cells the cache holds gets them: entries are
    evicted (least recently used first) rather than the call failing."""
    vocab = default_model.vocab
    prompts = [[int(t) for t in vocab.tokenize(f"Story {i}: once upon a time there was a {w}.")] for i, w in
               enumerate(("cat", "dog", "fox", "owl"))]  # fmt: skip
    with default_model.context(n_ctx=1024, n_seq_max=2, kv_unified=True, n_threads=1) as ctx:
        store = BranchStore(ctx)
        cache = PromptCache(store, max_entries=2)
        for p in prompts[:2]:
            cache.warm(p)
        assert store.available == 0
        r = complete(store, prompts[2], max_tokens=2, cache=cache)  # needs an id: one entry goes
        assert r.stop_reason == "max_tokens" and cache.stats.evicted >= 1
        out = generate_many(store, prompts, max_tokens=2, cache=cache)  # n_parallel counts the cache's ids
        assert len(out) == 4 and len(store) == len(cache) <= 2
    with default_model.context(n_ctx=64, n_seq_max=4, kv_unified=True, n_threads=1) as ctx:
        store = BranchStore(ctx)
        cache = PromptCache(store, max_entries=3, max_tokens=10_000)
        for p in prompts[:3]:
            cache.warm(p)
        assert len(cache) == 3 and cache.stats.evicted == 0
        # fits the context alone, not beside the entries' cells: they make room
        long = [int(t) for t in vocab.tokenize("one two three four five six seven eight nine ten " * 40)]
        long = long[: ctx.n_ctx - 4]
        assert len(long) + 2 + cache.tokens - 3 > ctx.n_ctx  # 3 entries share at most BOS and "Story"
        r = complete(store, long, max_tokens=2, cache=cache)
        assert r.stop_reason == "max_tokens" and cache.stats.evicted >= 1


def test_chat_sessions_share_a_system_prompt(default_model: Model) -> None:
    """A session closed with a cache leaves its conversation there; the next session with
    the same system prompt starts from it (``reused_tokens``) and replies as one without."""
    system = "You are a helpful assistant who answers in one short sentence."
    with default_model.context(n_ctx=2048, n_seq_max=4, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        cache = PromptCache(store)
        with ChatSession(ctx, system=system, cache=cache, max_tokens=8) as first:
            r1 = first.send("Name a colour.")
            assert r1.reused_tokens == 0
        assert len(cache) == 1
        second = ChatSession(ctx, system=system, cache=cache, max_tokens=8)
        r2 = second.send("Name a fruit.")
        assert r2.reused_tokens > 0
        assert r2.reused_tokens + r2.decoded_tokens == len(second.tokens) - len(r2.result.tokens)
        second.close()
    with default_model.context(n_ctx=2048, n_seq_max=4, kv_unified=True) as ctx:
        plain = ChatSession(ctx, system=system, max_tokens=8).send("Name a fruit.")
    assert plain.result.tokens == r2.result.tokens


def test_async_complete_uses_the_cache(default_model: Model) -> None:
    header, (a, b) = header_and_suffixes(default_model, 2)
    with default_model.context(n_ctx=1024, n_seq_max=4, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        cache = PromptCache(store)

        async def both() -> tuple[int, int]:
            x = await acomplete(store, header + a, max_tokens=2, cache=cache)
            y = await acomplete(store, header + b, max_tokens=2, cache=cache)
            return x.cached_tokens, y.cached_tokens

        assert asyncio.run(both()) == (0, len(header))
        assert len(cache) == 2


def test_entries_are_not_sampled_or_stepped(default_model: Model) -> None:
    """An entry is a prefix source: the store's default sampling skips it, and sampling,
    stepping or forking it (without ``at=``) is refused; a fork at a position works."""
    with default_model.context(n_ctx=512, n_seq_max=4, kv_unified=True, n_threads=1) as ctx:
        store = BranchStore(ctx)
        cache = PromptCache(store)
        cache.warm("Hello there, how are you?")
        (entry,) = store.branches
        live = store.create([int(t) for t in default_model.vocab.tokenize("Hi")])
        assert list(store.sample()) == [live]
        with pytest.raises(BranchError, match="kept prompt"):
            entry.sample()
        with pytest.raises(BranchError, match="kept prompt"):
            store.step({entry: 1})
        with pytest.raises(BranchError, match="kept prompt"):
            entry.fork()
        child = entry.fork(at=3)
        assert child.position == 3 and child.tokens == entry.tokens[:3]
        child.commit(child.sample())


def test_entries_pruned_elsewhere_are_forgotten(default_model: Model) -> None:
    with default_model.context(n_ctx=512, n_seq_max=4, kv_unified=True, n_threads=1) as ctx:
        store = BranchStore(ctx)
        cache = PromptCache(store)
        cache.warm("Hello there, how are you?")
        for b in list(store.branches):
            b.prune()
        assert len(cache) == 0 and cache.tokens == 0
        assert complete(store, "Hello there, how are you?", max_tokens=1, cache=cache).cached_tokens == 0


def test_bad_arguments(default_model: Model) -> None:
    with default_model.context(n_ctx=512, n_seq_max=4, kv_unified=True, n_threads=1) as ctx:
        store, other = BranchStore(ctx), BranchStore(ctx)
        with pytest.raises(ParamTypeError, match="BranchStore"):
            PromptCache(ctx)  # type: ignore[arg-type]
        with pytest.raises(ParamError, match="max_tokens must be >= 1"):
            PromptCache(store, max_tokens=0)
        with pytest.raises(ParamError, match="max_entries must be >= 1"):
            PromptCache(store, max_entries=0)
        cache = PromptCache(store)
        with pytest.raises(ParamTypeError, match="PromptCache"):
            complete(store, "hi", max_tokens=1, cache="yes")  # type: ignore[arg-type]
        with pytest.raises(ParamError, match="another BranchStore"):
            complete(other, "hi", max_tokens=1, cache=cache)
        with pytest.raises(ParamError, match="share_prefixes=True"):
            generate_many(store, ["hi"], max_tokens=1, cache=cache, share_prefixes=False)
        b = store.create([int(t) for t in default_model.vocab.tokenize("hi there")])
        with pytest.raises(ParamError, match=r"n=9 must be in \[1, "):
            cache.add(b, 9)
        assert cache.add(b) and b in cache
        with pytest.raises(ParamError, match="already an entry"):
            cache.add(b)
        with pytest.raises(ParamError, match="at least one token"):
            cache.warm([])
