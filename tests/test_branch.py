"""Branches over one context: fork equivalence, batched steps, the tree and its errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import llama_cffi
import samplers as S
from llama_cffi.errors import KvCacheFullError
from samplers.branch import BranchError, BranchStore, CapacityError

TOL = {"rtol": 2e-3, "atol": 2e-3}  # batch shape changes the kernels' summation order


@pytest.fixture(scope="module")
def tiny(tiny_model_path: Path) -> Iterator[llama_cffi.Model]:
    m = llama_cffi.Model.load(tiny_model_path)
    yield m
    m.close()


def make_ctx(model: llama_cffi.Model, n_seq_max: int = 4, n_ctx: int = 256) -> llama_cffi.Context:
    return model.context(n_ctx=n_ctx, n_batch=64, n_seq_max=n_seq_max, kv_unified=True, n_threads=2)


def fresh_logits(model: llama_cffi.Model, tokens: list[int]) -> np.ndarray:
    with make_ctx(model, 1) as ctx:
        return np.array(ctx.decode(tokens), copy=True)


def test_fork_equals_fresh_decode(tiny: llama_cffi.Model) -> None:
    """A branch forked after some generated tokens, then fed more tokens, has the logits of
    a fresh context decoding the whole history."""
    prompt = [int(t) for t in tiny.tokenize("the cat sat on the mat")]
    with make_ctx(tiny) as ctx:
        store = BranchStore(ctx)
        root = store.create(prompt)
        for _ in range(5):
            root.commit(root.sample())
        child = root.fork()
        assert child.tokens == root.tokens and child.position == root.position
        np.testing.assert_array_equal(child.logits, root.logits)
        extra = [int(t) for t in tiny.tokenize(" and then", add_special=False)]
        for t in extra:
            child.commit(t)
        np.testing.assert_allclose(child.logits, fresh_logits(tiny, child.tokens), **TOL)
        np.testing.assert_allclose(root.logits, fresh_logits(tiny, root.tokens), **TOL)
        assert ctx.memory.seq_pos_max(child.seq_id) == len(child.tokens) - 1


def test_batched_step_equals_sequential(tiny: llama_cffi.Model) -> None:
    """store.step over 4 branches gives each the logits one-by-one decoding gives."""
    prompt = [int(t) for t in tiny.tokenize("once upon a time")]
    runs = []
    for batched in (True, False):
        with make_ctx(tiny) as ctx:
            store = BranchStore(ctx)
            root = store.create(prompt, sampler=S.SamplerChain([S.TopK(20), S.Dist(5)]))
            kids = [root] + [root.fork(seed=i) for i in range(3)]
            for _ in range(6):
                moves = {b: b.sample() for b in kids}
                if batched:
                    store.step(moves)
                else:
                    for b, t in moves.items():
                        b.commit(t)
            runs.append([(b.tokens, b.logits.copy(), b.perplexity) for b in kids])
    for (ta, la, pa), (tb, lb, pb) in zip(*runs, strict=True):
        assert ta == tb
        np.testing.assert_allclose(la, lb, **TOL)
        assert pa == pytest.approx(pb, rel=1e-3)
    assert len({tuple(t) for t, _, _ in runs[0]}) > 1  # reseeded forks diverged


def test_prefill_packs_many_branches(tiny: llama_cffi.Model) -> None:
    """prefill of unequal inputs (longer than n_batch in total) equals per-branch decodes."""
    with make_ctx(tiny) as ctx:
        store = BranchStore(ctx)
        a = store.create([1, 5, 6])
        b = a.fork()
        c = store.create([1, 7])
        ins = {a: list(range(10, 50)), b: [11, 12], c: list(range(20, 110))}
        store.prefill(ins)
        for br, extra in ((a, ins[a]), (b, ins[b]), (c, ins[c])):
            assert br.tokens[-len(extra) :] == extra and br.position == len(br.tokens)
            np.testing.assert_allclose(br.logits, fresh_logits(tiny, br.tokens), **TOL)
        assert b.tokens == [1, 5, 6, 11, 12]


def test_tree_capacity_and_pruning(tiny: llama_cffi.Model) -> None:
    with make_ctx(tiny, n_seq_max=3) as ctx:
        store = BranchStore(ctx)
        root = store.create([1, 5, 6])
        a = root.fork()
        b = a.fork()
        assert store.available == 0
        with pytest.raises(CapacityError):
            root.fork()
        with pytest.raises(BranchError, match="children"):
            a.prune()
        assert a.children == [b] and b.parent is a and b.is_leaf
        a.prune_subtree()
        assert not a.alive and not b.alive and root.is_leaf
        assert ctx.memory.seq_pos_max(a.seq_id) == -1
        with pytest.raises(BranchError, match="pruned"):
            b.sample()
        c = root.fork()  # ids are reused
        assert c.seq_id in (a.seq_id, b.seq_id)
        c.detach()  # KV left in place, cleaned when the id is reused
        assert ctx.memory.seq_pos_max(c.seq_id) >= 0
        d = root.fork()
        assert ctx.memory.seq_pos_max(d.seq_id) == root.position - 1
        store.retain_only(d)
        assert store.branches == [d] and d.parent is None and not root.alive
        assert ctx.memory.seq_pos_max(root.seq_id) == -1
        store.drain()
        assert len(store) == 0 and store.available == 3


def test_failed_step_changes_nothing(tiny: llama_cffi.Model) -> None:
    """Two branches sharing a unified cache that is one cell short: llama_decode finds no
    slot for the step; it raises and no branch changes (tokens, positions, snapshots,
    metrics, KV)."""
    with make_ctx(tiny, n_seq_max=2, n_ctx=256) as ctx:
        n_ctx = ctx.n_ctx
        store = BranchStore(ctx)
        root = store.create([1] + [5 + i % 40 for i in range(n_ctx - 4)])  # n_ctx - 3 cells
        kid = root.fork()  # shares them
        store.step({root: 5, kid: 6})  # 2 more cells: n_ctx - 1 used
        before = [(b.tokens, b.position, b.logits.copy(), b.tracker.count) for b in (root, kid)]
        with pytest.raises(KvCacheFullError):
            store.step({root: 7, kid: 8})  # needs 2 cells, 1 is free
        for b, (toks, pos, logits, n) in zip((root, kid), before, strict=True):
            assert (b.tokens, b.position, b.tracker.count) == (toks, pos, n)
            np.testing.assert_array_equal(b.logits, logits)
            assert ctx.memory.seq_pos_max(b.seq_id) == pos - 1
        kid.prune()
        store.step({root: 7})  # one cell: fits again
        assert root.position == before[0][1] + 1
        with pytest.raises(llama_cffi.errors.ParamError):
            store.step({root: 10**7})


def test_grammar_branches_fork_their_matcher(default_model: llama_cffi.Model) -> None:
    """Branches under a JSON schema each end with valid JSON of their own."""
    import json

    m = default_model
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    with m.context(n_ctx=512, n_batch=64, n_seq_max=3, kv_unified=True, n_threads=2) as ctx:
        store = BranchStore(ctx)
        root = store.create(
            m.tokenize("A JSON object:\n"), sampler=S.SamplerChain([S.TopK(20), S.Dist(1)]), grammar=schema
        )
        kids = [root.fork(seed=10 + i) for i in range(2)]
        live = set(kids)
        for _ in range(40):
            if not live:
                break
            moves = {}
            for b in list(live):
                t = b.sample()
                if m.vocab.is_eog(t):
                    live.discard(b)
                else:
                    moves[b] = t
            store.step(moves)
        assert not live
        for b in kids:
            text = m.vocab.detokenize(b.tokens[root.position :])
            assert isinstance(json.loads(text)["n"], int), text


# ----------------------------------------------------------------------------- search helpers


def greedy_tokens(model: llama_cffi.Model, prompt: list[int], n: int) -> list[int]:
    with make_ctx(model, 1) as ctx:
        row = np.asarray(ctx.decode(prompt))
        out: list[int] = []
        for _ in range(n):
            t = int(row.argmax())
            if model.vocab.is_eog(t):
                break
            out.append(t)
            row = np.asarray(ctx.decode_single(t))
        return out


def logprob_of(model: llama_cffi.Model, prompt: list[int], toks: list[int]) -> float:
    """Summed log-probability of ``toks`` after ``prompt`` from one fresh decode."""
    with make_ctx(model, 1) as ctx:
        rows = np.asarray(ctx.decode(prompt + toks, logits="all"), dtype=np.float64)
    total = 0.0
    for i, t in enumerate(toks):
        r = rows[len(prompt) - 1 + i]
        total += r[t] - r.max() - np.log(np.exp(r - r.max()).sum())
    return float(total)


def test_beam_search(tiny: llama_cffi.Model) -> None:
    """Width 1 is greedy; width 3 returns a sequence whose reported log-probability is its
    true one, at least greedy's; every branch is pruned afterwards."""
    from samplers.search import beam_search

    prompt = [int(t) for t in tiny.tokenize("the dog")]
    with make_ctx(tiny, n_seq_max=4) as ctx:
        store = BranchStore(ctx)
        r1 = beam_search(store, prompt, width=1, max_tokens=8)
        assert [t for t in r1.tokens if not tiny.vocab.is_eog(t)] == greedy_tokens(tiny, prompt, 8)
        r3 = beam_search(store, prompt, width=3, max_tokens=8)
        assert len(store) == 0 and store.available == 4
    assert r3.logprob == pytest.approx(logprob_of(tiny, prompt, r3.tokens), abs=1e-2)
    if len(r3.tokens) == len(r1.tokens) == 8:
        assert r3.logprob >= r1.logprob - 1e-3


def test_best_of_n_and_expand(tiny: llama_cffi.Model) -> None:
    from samplers.search import best_of_n, expand_top_k

    prompt = [int(t) for t in tiny.tokenize("a b c")]
    with make_ctx(tiny, n_seq_max=5) as ctx:
        store = BranchStore(ctx)
        r = best_of_n(store, prompt, n=3, max_tokens=6, sampler=S.SamplerChain([S.TopK(30), S.Dist(3)]), seed=7)
        assert len(store) == 0
        n_scored = len(r.tokens)
        assert r.logprob == pytest.approx(logprob_of(tiny, prompt, r.tokens), abs=1e-2)
        assert r.perplexity == pytest.approx(np.exp(-r.logprob / n_scored), rel=1e-6)
        root = store.create(prompt)
        kids = expand_top_k(root, 3)
        top = np.argsort(-root.logits, kind="stable")[:3].tolist()
        assert [k.tokens[-1] for k in kids] == top
        for k in kids:
            np.testing.assert_allclose(k.logits, fresh_logits(tiny, k.tokens), **TOL)


def test_stream_stop_strings_and_generate(tiny: llama_cffi.Model) -> None:
    from samplers.search import generate, stream

    prompt = [int(t) for t in tiny.tokenize("the")]
    with make_ctx(tiny, n_seq_max=2) as ctx:
        store = BranchStore(ctx)
        full = "".join(stream(store.create(prompt), 12))
        store.drain()
        assert full == tiny.vocab.detokenize(greedy_tokens(tiny, prompt, 12))
        if len(full) > 4:
            stop = full[2:4]
            cut = "".join(stream(store.create(prompt), 12, stop=[stop]))
            assert cut == full[: full.find(stop)]
            store.drain()
        out = generate(store, "the", max_tokens=10, json_schema={"enum": ["yes", "no"]})
        assert out in ('"yes"', '"no"')
        assert len(store) == 0


def test_generation_past_n_ctx(tiny: llama_cffi.Model) -> None:
    """clear_and_reseed and shift_context keep a branch generating past n_ctx; after a
    reseed the snapshot equals a fresh decode of sinks + tail."""
    with make_ctx(tiny, n_seq_max=2, n_ctx=256) as ctx:
        n_ctx = ctx.n_ctx
        store = BranchStore(ctx)
        b = store.create([1] + [5 + i % 40 for i in range(n_ctx - 2)])
        b.commit(b.sample())
        assert b.position == n_ctx
        with pytest.raises(KvCacheFullError):
            b.commit(b.sample())
        hist = b.tokens
        b.clear_and_reseed(sinks=4, tail=60)
        assert b.position == 64 and b.tokens == hist
        np.testing.assert_allclose(b.logits, fresh_logits(tiny, hist[:4] + hist[-60:]), **TOL)
        for _ in range(3):
            b.commit(b.sample())
        assert b.position == 67 and len(b.tokens) == len(hist) + 3
        other = b.fork()
        with pytest.raises(BranchError, match="only live"):
            b.shift_context(10)
        other.prune()
        if ctx.memory.can_shift:
            b.shift_context(30, sinks=4)
            assert b.position == 37 and ctx.memory.seq_pos_max(b.seq_id) == 36
            b.commit(b.sample())
            assert b.position == 38


def test_metrics(tiny: llama_cffi.Model) -> None:
    """Greedy: the sampled-from distribution is the model's, so both perplexities agree;
    top-k + temperature: they differ; track=False: no metrics (and no softmax per token)."""
    prompt = [int(t) for t in tiny.tokenize("the")]
    with make_ctx(tiny, n_seq_max=4) as ctx:
        store = BranchStore(ctx)
        g = store.create(prompt)
        k = store.create(prompt, sampler=S.SamplerChain([S.TopK(5), S.Temperature(0.5), S.Dist(1)]))
        off = store.create(prompt, track=False)
        for _ in range(4):
            store.step({b: b.sample() for b in (g, k, off)})
        assert g.sampling_perplexity == pytest.approx(g.perplexity)
        assert k.sampling_perplexity < k.perplexity  # sharper than the model
        with pytest.raises(BranchError, match="track=False"):
            _ = off.perplexity
        assert off.fork().tracker is None


def test_fork_at_prefix(tiny: llama_cffi.Model) -> None:
    """fork(at=p): the child holds tokens[:p] and the logits after them (a fresh decode's),
    continues like a fresh context fed prefix + T, replays sampler and metrics to p, and
    leaves the parent untouched."""
    prompt = [int(t) for t in tiny.tokenize("the cat sat on the mat")]
    n_prompt = len(prompt)
    with make_ctx(tiny) as ctx:
        store = BranchStore(ctx)
        root = store.create(prompt, sampler=S.SamplerChain([S.Penalties(64, 1.3), S.Greedy()]))
        for _ in range(8):
            root.commit(root.sample())
        parent_tokens, parent_logits = root.tokens, root.logits.copy()
        # reference: a second root fed the same tokens, read after each step
        ref = store.create(prompt, sampler=S.SamplerChain([S.Penalties(64, 1.3), S.Greedy()]))
        perps = {n_prompt: None}
        for i, t in enumerate(parent_tokens[n_prompt : n_prompt + 5]):
            ref.commit(t)
            perps[n_prompt + i + 1] = ref.perplexity
        for at in (n_prompt + 5, n_prompt, 3, 1):
            child = root.fork(at=at)
            assert child.tokens == parent_tokens[:at] and child.position == at
            assert ctx.memory.seq_pos_max(child.seq_id) == at - 1
            np.testing.assert_allclose(child.logits, fresh_logits(tiny, parent_tokens[:at]), **TOL)
            if at == n_prompt + 5:
                assert child.perplexity == perps[at]  # replayed in the same order: exact
                # the penalties sampler saw exactly the 5 generated tokens: same choice as ref
                assert child.sample() == ref.sample()
            elif at <= n_prompt:
                assert child.tracker is not None and child.tracker.count == 0
            extra = [int(t) for t in tiny.tokenize(" and then", add_special=False)]
            for t in extra:
                child.commit(t)
            np.testing.assert_allclose(child.logits, fresh_logits(tiny, parent_tokens[:at] + extra), **TOL)
            child.prune()
        assert root.tokens == parent_tokens
        np.testing.assert_array_equal(root.logits, parent_logits)
        np.testing.assert_allclose(root.logits, fresh_logits(tiny, parent_tokens), **TOL)
        full = root.fork(at=root.position)  # at == position: an ordinary fork
        np.testing.assert_array_equal(full.logits, parent_logits)
        for bad in (0, root.position + 1, -1):
            with pytest.raises(llama_cffi.errors.ParamError, match="outside"):
                root.fork(at=bad)
        with pytest.raises(llama_cffi.errors.ParamError):
            root.fork(at=2.0)  # type: ignore[arg-type]
        assert store.available == ctx.n_seq_max - 3  # failed forks leaked no id
        full.prune()
        root.clear_and_reseed(sinks=2, tail=4)
        with pytest.raises(BranchError, match="rebuilt"):
            root.fork(at=3)


def test_fork_at_replays_grammar(default_model: llama_cffi.Model) -> None:
    """A grammar branch forked at a prefix has the matcher state of that prefix."""
    from samplers.grammar import Grammar

    g = Grammar.from_gbnf('root ::= "[" [0-9]+ ("," [0-9]+)* "]"')
    vocab = default_model.vocab
    prompt = [int(t) for t in default_model.tokenize("Numbers:")]
    with default_model.context(n_ctx=256, n_batch=64, n_seq_max=2, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        b = store.create(prompt, grammar=g, sampler=S.SamplerChain([S.TopK(8), S.Dist(3)]))
        for _ in range(6):
            t = b.sample()
            assert not vocab.is_eog(t)  # "[" digit: no end yet
            b.commit(t)
        gen = b.tokens[len(prompt) :]
        for at_gen in (2, 4):
            child = b.fork(at=len(prompt) + at_gen)
            m = g.compile(vocab).matcher()
            for t in gen[:at_gen]:
                m.accept_token(t)
            gs = child.sampler.samplers[0]
            np.testing.assert_array_equal(gs.matcher.allowed_tokens(), m.allowed_tokens())
            assert m.allows(child.sample())
            child.prune()
        # a grammar that has ended (after an end-of-generation token) allows nothing
        end = store.create(prompt, grammar='root ::= "x"')
        x = int(np.flatnonzero(end.sampler.samplers[0].matcher.allowed_tokens())[0])
        end.commit(x)
        eog = end.sample()
        assert vocab.is_eog(eog)
        end.commit(eog)
        with pytest.raises(S.SamplingError, match="no token is allowed"):
            end.sample()


def test_branches_of_a_closed_context_raise(tiny: llama_cffi.Model) -> None:
    """Every branch operation after the context is closed is a ClosedError (sample() used
    to answer from the saved snapshot)."""
    ctx = make_ctx(tiny)
    store = BranchStore(ctx)
    b = store.create([1, 5, 6])
    kid = b.fork()
    ctx.close()
    for call in (
        b.sample,
        lambda: b.commit(5),
        lambda: b.accept(5),
        b.fork,
        b.prune_subtree,
        kid.prune,
        lambda: store.step({b: 5}),
        lambda: store.prefill({b: [5]}),
        lambda: b.fork(at=1),
        lambda: b.clear_and_reseed(),
    ):
        with pytest.raises(llama_cffi.errors.ClosedError):
            call()


def test_dead_end_during_generation_is_a_clear_error(tiny: llama_cffi.Model) -> None:
    """A grammar and a sampler that together allow nothing (the grammar needs a "b" next,
    a logit bias forbids every token starting with "b"): generate raises SamplingError
    once it gets there, after "a", leaves no branch or KV behind, and the store and
    context go on working."""
    from samplers.search import generate

    vocab = tiny.vocab
    pieces = [vocab.token_to_piece(t, special=True) for t in range(tiny.n_vocab)]
    starts_b = {t: float("-inf") for t, p in enumerate(pieces) if p.startswith(b"b")}
    assert starts_b
    chain = S.SamplerChain([S.LogitBias(tiny.n_vocab, starts_b), S.TopK(5), S.Dist(1)])
    with make_ctx(tiny, n_seq_max=2) as ctx:
        store = BranchStore(ctx)
        with pytest.raises(S.SamplingError, match="no token is allowed"):
            generate(store, [1, 40], max_tokens=10, sampler=chain, grammar='root ::= "ab"')
        assert len(store) == 0 and store.available == 2
        assert all(ctx.memory.seq_pos_max(s) == -1 for s in range(2))
        assert generate(store, [1, 40], max_tokens=5, grammar='root ::= "ok"') == "ok"
