"""Truncation and measures in llama.cpp's sampling graph (backend sampling, on ggml's CPU
backend here): Context.set_backend_sampler's guards and outputs, and BranchStore(device=True)
against the host path on every kind of decoder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import samplers as S
from llama_cffi import Model
from llama_cffi.errors import ParamError, UnsupportedError
from llama_cffi.kernels import RowMeasures, RowStatus, rows_reference
from llama_cffi.sampling import LlamaSampler
from llama_cffi.testing import write_tiny_model
from samplers.branch import DEVICE_MARGIN, BranchError, BranchStore

DECODERS = ["llama", "llama-q8_0", "llama-q4_0", "swa", "mamba", "hybrid", "t5"]


def chain(seed: int, k: int = 20) -> S.SamplerChain:
    return S.SamplerChain([S.TopK(k), S.TopP(0.9), S.Temperature(0.7), S.Dist(seed)])


def generate(model: Model, device: bool, n: int = 4, steps: int = 8) -> list[tuple[list[int], float, float]]:
    kv_unified = True
    with model.context(n_ctx=512, n_batch=64, n_seq_max=n, kv_unified=kv_unified, n_threads=2) as ctx:
        store = BranchStore(ctx, device=device)
        root = store.create(model.tokenize("once upon a time"), sampler=chain(3))
        kids = [root] + [root.fork(seed=i) for i in range(n - 1)]
        for _ in range(steps):
            store.step(store.sample(kids))
        return [(b.tokens, b.perplexity, b.entropy) for b in kids]


@pytest.mark.parametrize("kind", DECODERS)
def test_device_equals_host_on_every_decoder(tiny_model_of: Callable[[str], Path], kind: str) -> None:
    """Same tokens as sampling on the host (the candidates are the same logits, sorted the
    same way); perplexities and entropies equal to ggml's float32 arithmetic."""
    with Model.load(tiny_model_of(kind)) as model:
        host = generate(model, False)
        dev = generate(model, True)
    for (th, ph, eh), (td, pd, ed) in zip(host, dev, strict=True):
        assert th == td
        assert pd == pytest.approx(ph, rel=2e-5)
        assert ed == pytest.approx(eh, rel=2e-5, abs=2e-5)
    assert len({tuple(t) for t, _, _ in host}) > 1


@pytest.mark.default_model
def test_device_equals_host_on_the_default_model(default_model: Model) -> None:
    host = generate(default_model, False, n=3, steps=4)
    dev = generate(default_model, True, n=3, steps=4)
    for (th, ph, eh), (td, pd, ed) in zip(host, dev, strict=True):
        assert th == td
        assert pd == pytest.approx(ph, rel=2e-5)
        assert ed == pytest.approx(eh, rel=2e-5, abs=2e-5)


@pytest.mark.parametrize(("group", "exact"), [(6, True), (200, False)])
def test_ties_at_the_cut(tmp_path: Path, group: int, exact: bool) -> None:
    """Tokens in runs of ``group`` share one output row, so whole runs tie. When the tie at
    top-k's cut ends among the candidates that came back, the host keeps the lower ids as a
    stable sort does; when it reaches past them, the row says so (TIE_AT_CUT)."""
    k = 3
    path = write_tiny_model(tmp_path / "tied.gguf", tied_output=group)
    with Model.load(path) as model, model.context(n_ctx=128, n_seq_max=2, kv_unified=True) as ctx:
        store = BranchStore(ctx, device=True)
        b = store.create(model.tokenize("a b c"), sampler=S.SamplerChain([S.TopK(k), S.Greedy()]))
        meas = store.measures
        ids = meas.candidates(b.seq_id)[0]
        with model.context(n_ctx=128) as ref_ctx:
            row = np.array(ref_ctx.decode(model.tokenize("a b c")), copy=True)
        desc = np.sort(row)[::-1]
        through = desc[k] == desc[k - 1] == desc[k + DEVICE_MARGIN - 1]  # the tie reaches past what came back
        assert through is not exact
        want = rows_reference(row, k)[4]
        if exact:
            assert meas.status[b.seq_id] == RowStatus.OK
            np.testing.assert_array_equal(ids[:k], want)
            assert b.sample() == int(want[0])
        else:
            assert meas.status[b.seq_id] == RowStatus.TIE_AT_CUT
            assert (row[ids[:k]] == row[want]).all()  # the same logits, maybe other ids


def test_set_backend_sampler_guards(tiny_model: Model) -> None:
    with tiny_model.context(n_ctx=128, n_seq_max=3, kv_unified=True) as ctx:
        with pytest.raises(ParamError, match="chain"):
            ctx.set_backend_sampler(0, LlamaSampler.top_k(5))
        with pytest.raises(ParamError, match="at least one"):
            ctx.set_backend_sampler(0, LlamaSampler.chain())
        with pytest.raises(ParamError):
            ctx.set_backend_sampler(7, LlamaSampler.chain([LlamaSampler.top_k(5)]))
        ch = LlamaSampler.chain([LlamaSampler.measure(), LlamaSampler.top_k(5)])
        assert ctx.set_backend_sampler(1, ch) is True
        assert ctx.backend_sampler(1) is ch
        with pytest.raises(ParamError, match="clone"):
            ctx.set_backend_sampler(2, ch)  # llama.cpp prepares a chain once
        ch.close()  # only marked: the context keeps it until it is detached
        logits = ctx.decode(tiny_model.tokenize("x y"), seq_id=1)
        with pytest.raises(UnsupportedError, match="device"):
            np.asarray(logits)
        out = ctx.sampled()
        assert out.token is None and len(out.candidates) == 5 and len(out.logits) == 5 and len(out.probs) == 3
        assert (np.diff(out.logits[np.argsort(-out.logits)]) <= 0).all()
        row = np.array(ctx.decode([5], seq_id=0), copy=True)  # another sequence: on the host
        with pytest.raises(UnsupportedError, match="without a backend sampler"):
            ctx.sampled()
        assert np.isfinite(row).all()
        ctx.set_backend_sampler(1, None)
        assert ctx.backend_sampler(1) is None
        assert np.isfinite(np.asarray(ctx.decode([6], seq_id=1))).all()  # readable again


def test_sampled_measures_equal_the_host(tiny_model: Model) -> None:
    """The measuring sampler's three numbers, read through RowMeasures.read_device, are
    the host kernel's to float32 precision; the candidates are the host's top-k."""
    prompt = tiny_model.tokenize("the cat sat")
    with tiny_model.context(n_ctx=128) as ctx:
        row = np.array(ctx.decode(prompt), copy=True)
    with tiny_model.context(n_ctx=128, n_seq_max=2) as ctx:
        ctx.set_backend_sampler(0, LlamaSampler.chain([LlamaSampler.measure(), LlamaSampler.top_k(12)]))
        ctx.decode(prompt)
        dev = RowMeasures(tiny_model.n_vocab, 2, k=12)
        dev.read_device(ctx.underlying, [len(prompt) - 1], [1], [8])
    host = RowMeasures(tiny_model.n_vocab, 2, k=12)
    host.compute(row[None, :], [1], k=12)
    assert dev.max[1] == host.max[1]
    assert dev.log_norm[1] == pytest.approx(host.log_norm[1], rel=1e-6)
    assert dev.entropy[1] == pytest.approx(host.entropy[1], rel=1e-5)
    np.testing.assert_array_equal(dev.candidates(1)[0], host.candidates(1)[0])


def test_device_store_refuses_what_needs_a_whole_row(tiny_model: Model) -> None:
    with tiny_model.context(n_ctx=256, n_seq_max=3, kv_unified=True) as ctx:
        store = BranchStore(ctx, device=True)
        with pytest.raises(BranchError, match="TopK"):
            store.create([1, 5, 6], sampler=S.SamplerChain([S.Temperature(0.8), S.Dist(1)]))
        with pytest.raises(BranchError, match="TopK"):
            store.create([1, 5, 6], sampler=chain(1), grammar='root ::= "a"')
        assert store.available == 3 and not ctx._backend  # nothing left attached
        b = store.create([1, 5, 6], sampler=chain(1))
        with pytest.raises(BranchError, match="device"):
            b.logits  # noqa: B018
        with pytest.raises(BranchError, match="device"):
            b.set_logits(np.zeros(tiny_model.n_vocab, np.float32))
        with pytest.raises(BranchError, match="TopK"):
            b.set_sampler(S.SamplerChain([S.Temperature(0.8), S.Dist(1)]))
        assert b.sampler.samplers[0].k == 20  # the chain stayed
        ids, _ = store.measures.candidates(b.seq_id)
        outside = next(t for t in range(tiny_model.n_vocab) if t not in set(ids.tolist()))
        before = (b.tokens, b.position)
        with pytest.raises(BranchError, match="surprisal is unknown"):
            store.step({b: outside})
        assert (b.tokens, b.position) == before and ctx.memory.seq_pos_max(b.seq_id) == b.position - 1
        store.step({b: int(ids[DEVICE_MARGIN])})  # past the chain's top-20, among what came back
        assert b.position == before[1] + 1
        with pytest.raises(ParamError):
            BranchStore(ctx, device=True, batched=False)
        b.prune()
        assert not ctx._backend


def test_device_store_tree_operations(tiny_model: Model) -> None:
    """fork(at=), prefill, truncate and clear_and_reseed read their new rows from the device."""
    with tiny_model.context(n_ctx=512, n_seq_max=4, kv_unified=True) as ctx:
        host_ctx = tiny_model.context(n_ctx=512, n_seq_max=4, kv_unified=True)
        out = []
        for c, device in ((ctx, True), (host_ctx, False)):
            store = BranchStore(c, device=device)
            root = store.create(tiny_model.tokenize("a b c d"), sampler=chain(5))
            for _ in range(4):
                store.step(store.sample([root]))
            kid = root.fork(at=6, seed=2)
            store.prefill({root: [7, 8, 9], kid: [10]})
            kid.truncate(6)
            root.clear_and_reseed(sinks=2, tail=4)
            moves = store.sample()
            store.step(moves)
            out.append([(b.tokens, b.perplexity, b.entropy, t) for b, t in moves.items()])
            store.drain()
        host_ctx.close()
    for d, h in zip(*out, strict=True):
        assert d[0] == h[0] and d[3] == h[3]
        assert d[1] == pytest.approx(h[1], rel=2e-5) and d[2] == pytest.approx(h[2], rel=2e-5)


def test_a_dropped_device_store_gives_its_sequences_back(tiny_model: Model) -> None:
    """A device store that goes without drain() takes its backend samplers off the
    context: the sequences' logits reach the host again."""
    import gc

    with tiny_model.context(n_ctx=128, n_seq_max=2, kv_unified=True) as ctx:
        store = BranchStore(ctx, device=True)
        store.create([1, 5, 6], sampler=chain(1))
        assert ctx.backend_sampler(0) is not None
        del store
        gc.collect()
        assert ctx.backend_sampler(0) is None
        ctx.memory.clear()
        assert np.isfinite(np.asarray(ctx.decode([1, 5, 6], seq_id=0))).all()


def test_speculative_steps_need_the_host_rows(tiny_model: Model) -> None:
    from samplers.speculative import PromptLookup

    with tiny_model.context(n_ctx=128, n_seq_max=2, kv_unified=True) as ctx:
        store = BranchStore(ctx, device=True)
        b = store.create([1, 5, 6, 5, 6], sampler=chain(1))
        with pytest.raises(BranchError, match="device=True"):
            b.speculate(b.sample(), PromptLookup())
        assert b.position == 5


def test_untracked_branches_skip_the_measures_on_the_device(tiny_model: Model) -> None:
    """A branch made with track=False gets top-k alone on the device (no measuring
    sampler): the same tokens as on the host, and no measures for its rows."""
    out = []
    for device in (False, True):
        with tiny_model.context(n_ctx=256, n_seq_max=3, kv_unified=True) as ctx:
            store = BranchStore(ctx, device=device)
            root = store.create(tiny_model.tokenize("a b c"), sampler=chain(2), track=False)
            kids = [root, root.fork(seed=4)]
            if device:
                assert len(ctx.backend_sampler(root.seq_id)) == 1  # top-k only
            for _ in range(5):
                store.step(store.sample(kids))
            if device:
                assert not store._has_stats[root.seq_id]
                with pytest.raises(BranchError, match="device"):
                    root.entropy  # noqa: B018
            out.append([b.tokens for b in kids])
    assert out[0] == out[1]
