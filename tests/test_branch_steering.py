"""Branch research extras: a writable logits snapshot (set, bias, contrastive
combination), a steering hook before each sample, swapping the sampler or the grammar
mid-generation, and the sampler's own entropy. Metrics and log-probabilities keep
measuring the model."""

from __future__ import annotations

import math

import numpy as np
import pytest

import samplers as S
from llama_cffi import Model
from llama_cffi.errors import ParamError
from samplers.branch import BranchStore
from samplers.measure import entropy, surprisal
from samplers.search import stream

PROMPT = "The capital of France is"


@pytest.fixture
def store(tiny_model: Model):  # type: ignore[no-untyped-def]
    with tiny_model.context(n_ctx=512, n_seq_max=4, kv_unified=True) as ctx:
        yield BranchStore(ctx)


def test_bias_and_set_logits_steer_the_draw_not_the_metrics(tiny_model: Model, store: BranchStore) -> None:
    b = store.create(tiny_model.tokenize(PROMPT))
    model = b.logits.copy()
    target = int(np.argsort(model)[len(model) // 2])  # a middling token
    b.add_logits({target: 1e4})
    assert b.edited and np.array_equal(b.model_logits, model)
    assert b.logits[target] == model[target] + np.float32(1e4)
    assert b.sample() == target
    b.commit(target)
    assert not b.edited  # the decode replaced the snapshot
    assert b.tracker is not None and b.tracker.total_surprisal == pytest.approx(surprisal(model, target), rel=1e-12)
    b.set_logits(np.full(tiny_model.n_vocab, -1.0, dtype=np.float32))
    b.add_logits(np.eye(tiny_model.n_vocab, dtype=np.float32)[7] * 5)
    assert b.sample() == 7
    b.reset_logits()
    assert not b.edited and b.sample() == int(np.argmax(b.model_logits))
    with pytest.raises(ParamError):
        b.set_logits(np.zeros(3))
    with pytest.raises(ParamError):
        b.add_logits({tiny_model.n_vocab: 1.0})
    with pytest.raises(ParamError):
        b.set_logits(np.full(tiny_model.n_vocab, np.nan))


def test_contrast_is_guidance(tiny_model: Model, store: BranchStore) -> None:
    """``(1 + a) * cond - a * uncond``: what a greedy chain then picks is its argmax."""
    cond = store.create(tiny_model.tokenize(PROMPT))
    uncond = store.create(tiny_model.tokenize("is"))
    a = 1.5
    want = (1 + a) * cond.model_logits.astype(np.float32) - a * uncond.model_logits
    cond.contrast(uncond, a)
    np.testing.assert_array_equal(cond.logits, want.astype(np.float32))
    assert cond.sample() == int(np.argmax(want))
    cond.contrast(uncond, 0.0)
    np.testing.assert_array_equal(cond.logits, cond.model_logits)
    with pytest.raises(ParamError):
        cond.contrast(uncond, math.inf)


def test_steering_hook(tiny_model: Model, store: BranchStore) -> None:
    """The hook runs before every sample with a writable snapshot that starts from the
    model's logits each step; banning the argmax makes greedy pick the runner-up; forks
    inherit the hook."""
    seen: list[np.ndarray] = []

    def ban_top(branch, logits) -> None:  # type: ignore[no-untyped-def]
        seen.append(branch.model_logits.copy())
        assert logits.flags.writeable
        logits[int(np.argmax(logits))] = -np.inf

    b = store.create(tiny_model.tokenize(PROMPT))
    b.steer = ban_top
    for _ in range(5):
        tok = b.sample()
        model = b.model_logits
        assert tok == int(np.argsort(-model, kind="stable")[1])
        b.commit(tok)
    assert len(seen) == 5 and not np.array_equal(seen[0], seen[1])
    child = b.fork()
    assert child.steer is ban_top
    text = "".join(stream(child, 3))
    assert isinstance(text, str) and len(seen) >= 7


def test_swap_grammar_and_sampler_mid_generation(tiny_model: Model, store: BranchStore) -> None:
    pen = S.Penalties(16, 1.3)
    b = store.create(tiny_model.tokenize(PROMPT), sampler=S.SamplerChain([pen, S.Greedy()]))
    free = "".join(stream(b, 6))
    assert free
    b.set_grammar('root ::= "yes" | "no"')
    assert b.sampler.samplers[1] is pen  # the other samplers keep their state
    constrained = "".join(stream(b, 10))
    assert constrained in ("yes", "no")
    b.set_grammar(None)
    assert all(getattr(s, "matcher", None) is None for s in b.sampler.samplers)
    b.set_sampler(S.SamplerChain([S.TopK(5), S.Dist(3)]))
    assert [s.name for s in b.sampler.samplers] == ["top-k", "dist"]
    stream(b, 3)


def test_sampling_entropy(tiny_model: Model, store: BranchStore) -> None:
    """The entropy of the distribution the chain draws from (top-5 at temperature 0.5 here),
    computed without drawing: the next sample is what it would have been."""

    def chain() -> S.SamplerChain:
        return S.SamplerChain([S.TopK(5), S.Temperature(0.5), S.Dist(11)])

    a = store.create(tiny_model.tokenize(PROMPT), sampler=chain())
    b = store.create(tiny_model.tokenize(PROMPT), sampler=chain())
    top = np.sort(a.model_logits)[-5:] / np.float32(0.5)
    assert a.sampling_entropy == pytest.approx(entropy(top.astype(np.float32)), rel=1e-6)
    assert a.sampling_entropy < a.entropy
    for _ in range(3):
        a.sampling_entropy  # noqa: B018 - must not consume the random engine
        ta, tb = a.sample(), b.sample()
        assert ta == tb
        store.step({a: ta, b: tb})
