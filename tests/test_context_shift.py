"""Context shift during generation (opt-in): llama.cpp's rule (keep ``n_keep``
positions, drop the oldest half of the rest, shift the others down) in Context.stream /
generate and samplers.search.stream / complete / generate; a typed error, before
anything is decoded, where the memory cannot shift."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from llama_cffi import KvCacheFullError, Model, ParamError
from llama_cffi.errors import UnsupportedError
from samplers.bias import LogitBias
from samplers.branch import BranchStore
from samplers.chain import SamplerChain
from samplers.search import complete, generate
from samplers.selection import Greedy


def no_eog(model: Model) -> SamplerChain:
    eog = [t for t in range(model.n_vocab) if model.vocab.is_eog(t)]
    return SamplerChain([LogitBias(model.n_vocab, {t: float("-inf") for t in eog}), Greedy()])


def test_context_generate_shifts_instead_of_failing(tiny_model: Model) -> None:
    """A generation twice as long as than the context: without the shift the decode
    that would pass n_ctx_seq raises; with it every token is generated, the sequence
    never holds more than n_ctx_seq positions, and the first n_keep cells are kept."""
    prompt = [1, 5, 6, 7, 8, 9]
    with tiny_model.context(n_ctx=256, n_threads=1) as ctx:
        n = ctx.n_ctx_seq
        with pytest.raises(KvCacheFullError):
            ctx.generate(prompt, max_tokens=2 * n, sampler=no_eog(tiny_model))
        ctx.memory.clear()
        pieces = list(ctx.stream(prompt, 2 * n, no_eog(tiny_model), context_shift=True, n_keep=4))
        assert len(tiny_model.tokenize("".join(pieces), add_special=False)) > 0
        assert ctx.memory.seq_pos_max(0) < n
        assert ctx.memory.seq_pos_min(0) == 0  # the kept positions stay
        assert ctx.perf()["n_eval"] >= 2 * n - 1  # every token decoded


def test_a_shift_drops_llama_cpps_count(tiny_model: Model) -> None:
    """The decode that would reach n_ctx_seq first drops (n_ctx_seq - n_keep) // 2
    positions after the first n_keep (llama.cpp's rule), then decodes at the position
    that frees; the tokens before it are those of a run without the shift."""
    prompt = [1, 5, 6, 7, 8, 9]
    n_keep = 3
    with tiny_model.context(n_ctx=256, n_threads=1) as ctx:
        n = ctx.n_ctx_seq
        upto = "".join(ctx.stream(prompt, n - len(prompt), no_eog(tiny_model)))
        assert ctx.memory.seq_pos_max(0) == n - 1  # full: the next decode would not fit
        ctx.memory.clear()
        one = "".join(ctx.stream(prompt, n - len(prompt) + 1, no_eog(tiny_model), context_shift=True, n_keep=n_keep))
        assert ctx.memory.seq_pos_max(0) == n - (n - n_keep) // 2
        assert ctx.memory.seq_pos_min(0) == 0
    assert one.startswith(upto)


def test_branch_generation_shifts(tiny_model: Model) -> None:
    with tiny_model.context(n_ctx=256, n_seq_max=2, kv_unified=True, n_threads=1) as ctx:
        store = BranchStore(ctx)
        n = ctx.n_ctx_seq
        plain = complete(store, [1, 5, 6, 7], max_tokens=2 * n, sampler=no_eog(tiny_model))
        assert plain.stop_reason == "context" and len(plain.tokens) == n - 4
        r = complete(store, [1, 5, 6, 7], max_tokens=2 * n, sampler=no_eog(tiny_model), context_shift=True, n_keep=2)
        assert r.stop_reason == "max_tokens" and len(r.tokens) == 2 * n
        assert r.tokens[: n - 4] == plain.tokens  # the same until the first shift
        assert r.positions[1] < n
        text = generate(store, [1, 5, 6, 7], max_tokens=2 * n, sampler=no_eog(tiny_model), context_shift=True)
        assert text == r.text or len(text) > 0
        assert len(store) == 0
        with pytest.raises(ParamError, match="n_keep"):
            complete(store, [1, 5], max_tokens=4, context_shift=True, n_keep=n)


@pytest.mark.parametrize("kind", ["mamba", "hybrid", "swa"])
def test_memories_that_cannot_shift_refuse_first(tiny_model_of: Callable[[str], Path], kind: str) -> None:
    """A recurrent state, a hybrid one, a sliding-window cache (without swa_full): a typed
    error before anything is decoded, whichever layer is asked."""
    # swa_full=False (llama.cpp's context default is True: a full-size cache, which can
    # shift): the window cache is then smaller than the context and cannot
    params = {"n_ctx": 512, "n_batch": 64, "n_ubatch": 64, "n_seq_max": 2, "kv_unified": True, "swa_full": False}
    with Model.load(tiny_model_of(kind)) as model, model.context(**params) as ctx:
        with pytest.raises(UnsupportedError, match="context_shift"):
            ctx.generate([1, 5, 6], max_tokens=4, context_shift=True)
        assert ctx.memory.seq_pos_max(0) == -1
        store = BranchStore(ctx)
        with pytest.raises(UnsupportedError, match="context_shift"):
            complete(store, [1, 5, 6], max_tokens=4, context_shift=True)
        assert len(store) == 0
