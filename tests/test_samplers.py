"""Samplers from first principles (tables in the style of llama.cpp's test-sampling.cpp, our
own numbers), candidate handling, chains, state (accept/reset/clone/reseed), the context
integration, and llama.cpp's samplers refusing what would crash them."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import samplers as S
from llama_cffi import Batch, ClosedError, Model, ParamError
from llama_cffi.sampling import LlamaSampler, TokenDataArray
from samplers.measure import PerplexityTracker, surprisal

from .conftest import EXPECT, run_isolated


def cands(probs: list[float], ids: list[int] | None = None) -> S.Candidates:
    lg = np.log(np.asarray(probs, dtype=np.float64)).astype(np.float32)
    return S.Candidates.from_arrays(ids if ids is not None else list(range(len(probs))), lg)


def kept(c: S.Candidates) -> list[int]:
    return c.read_ids().tolist()


# ------------------------------------------------------------------------ tables

P4 = [0.1, 0.2, 0.3, 0.4]


@pytest.mark.parametrize(
    ("k", "expect"),
    [(1, [3]), (2, [3, 2]), (4, [3, 2, 1, 0]), (9, [3, 2, 1, 0]), (0, [0, 1, 2, 3]), (-1, [0, 1, 2, 3])],
)
def test_top_k_table(k: int, expect: list[int]) -> None:
    c = cands(P4)
    S.TopK(k).apply(c)
    assert kept(c) == expect
    assert c.sorted == (k > 0)


@pytest.mark.parametrize(
    ("p", "min_keep", "expect"),
    [
        (0.35, 1, [3]),
        (0.5, 1, [3, 2]),
        (0.75, 1, [3, 2, 1]),
        (0.99, 1, [3, 2, 1, 0]),
        (0.35, 3, [3, 2, 1]),
        (1.0, 1, [0, 1, 2, 3]),
    ],
)
def test_top_p_table(p: float, min_keep: int, expect: list[int]) -> None:
    c = cands(P4)
    S.TopP(p, min_keep).apply(c)
    assert kept(c) == expect
    if p < 1:
        np.testing.assert_allclose(c.p, np.array(P4)[expect], rtol=1e-6)  # p before truncation


@pytest.mark.parametrize(
    ("p", "min_keep", "expect"),
    [(0.5, 1, [1, 2, 3]), (0.76, 1, [3]), (0.74, 1, [2, 3]), (0.0, 1, [0, 1, 2, 3]), (0.99, 3, [3, 2, 1])],
)
def test_min_p_table(p: float, min_keep: int, expect: list[int]) -> None:
    """Keeps p_i >= p * p_max; order kept when unsorted; min_keep falls back to the sorted path."""
    c = cands(P4)
    S.MinP(p, min_keep).apply(c)
    assert kept(c) == expect


def test_typical_table() -> None:
    """One dominant token is the typical one: its surprisal is closest to the entropy."""
    c = cands([0.97, 0.01, 0.01, 0.01])
    S.Typical(0.5).apply(c)
    assert kept(c) == [0]
    c = cands([0.25, 0.25, 0.25, 0.25])
    S.Typical(0.6).apply(c)
    assert len(c) == 3  # all equally typical: the first three reach 0.75 > 0.6


def test_temperature_table() -> None:
    c = S.Candidates.from_arrays([0, 1, 2], [1.0, -2.0, 4.0])
    S.Temperature(0.5).apply(c)
    assert c.read_logits().tolist() == [2.0, -4.0, 8.0]
    c = S.Candidates.from_arrays([0, 1, 2, 3], [1.0, 4.0, 4.0, 2.0])
    S.Temperature(0.0).apply(c)
    assert c.read_logits().tolist() == [-math.inf, 4.0, -math.inf, -math.inf]  # first max survives


def test_greedy_first_max() -> None:
    c = S.Candidates.from_arrays([5, 6, 7], [1.0, 3.0, 3.0])
    S.Greedy().apply(c)
    assert c.token == 6


def test_penalties_table() -> None:
    """repeat divides positive / multiplies non-positive logits, then count*freq + present."""
    pen = S.Penalties(last_n=3, repeat=2.0, freq=0.5, present=0.25)
    for t in (1, 1, 2):
        pen.accept(t)
    c = S.Candidates.from_arrays([0, 1, 2, 3], [1.0, -1.0, 2.0, 0.0])
    pen.apply(c)
    assert c.read_logits().tolist() == [1.0, -3.25, 0.25, 0.0]
    pen.accept(3)  # window of 3: the first 1 leaves
    c = S.Candidates.from_arrays([0, 1, 2, 3], [1.0, -1.0, 2.0, 0.0])
    pen.apply(c)
    assert c.read_logits().tolist() == [1.0, -2.75, 0.25, -0.75]
    pen.reset()
    c = S.Candidates.from_arrays([0, 1, 2, 3], [1.0, -1.0, 2.0, 0.0])
    pen.apply(c)
    assert c.read_logits().tolist() == [1.0, -1.0, 2.0, 0.0]


def test_dry_table() -> None:
    """llama.cpp's own example: context a b c c b c y a b c. Emitting c would extend the
    repeat "a b c" (3), y would extend "b c" (2), b only "c" (1, under allowed_length)."""
    a, b, c_, y = 0, 1, 2, 3
    dry = S.DRY(multiplier=0.8, base=1.75, allowed_length=2, last_n=64, seq_breakers=[])
    for t in (a, b, c_, c_, b, c_, y, a, b, c_):
        dry.accept(t)
    pen = dry.penalties()
    assert set(pen) == {c_, y}
    assert pen[c_] == pytest.approx(0.8 * 1.75)
    assert pen[y] == pytest.approx(0.8)
    # a single-token breaker is never penalised; 3 tokens back it limits repeats to 3
    dry2 = S.DRY(0.8, 1.75, 2, 64, seq_breakers=[[y]])
    for t in (a, b, c_, c_, b, c_, y, a, b, c_):
        dry2.accept(t)
    assert dry2.penalties() == {c_: pytest.approx(0.8 * 1.75)}
    # one token back (b), it limits repeats below allowed_length: no penalty at all
    dry3 = S.DRY(0.8, 1.75, 2, 64, seq_breakers=[[b]])
    for t in (a, b, c_, c_, b, c_, y, a, b, c_):
        dry3.accept(t)
    assert dry3.penalties() == {}
    cand = S.Candidates.from_arrays([0, 1, 2, 3], [0.0, 0.0, 0.0, 0.0])
    dry.apply(cand)
    np.testing.assert_allclose(cand.read_logits(), [0, 0, -0.8 * 1.75, -0.8], rtol=1e-6)
    twin = dry.clone()
    dry.reset()
    assert dry.penalties() == {} and len(twin.penalties()) == 2  # reset forgets; the clone keeps


def test_logit_bias_table() -> None:
    c = S.Candidates.from_logits(np.zeros(5, np.float32))
    S.LogitBias(5, [(1, 2.0), (1, 0.5), (3, -math.inf)]).apply(c)
    assert c.read_logits().tolist() == [0.0, 2.5, 0.0, -math.inf, 0.0]
    with pytest.raises(ValueError, match="out of range"):
        S.LogitBias(5, {5: 1.0})


def test_xtc_table() -> None:
    c = cands([0.4, 0.3, 0.2, 0.1])
    S.XTC(1.0, 0.15, 1, seed=1).apply(c)
    assert kept(c) == [2, 3]  # 0.4, 0.3 and 0.2 pass 0.15: all but the least likely of them go
    c = cands([0.4, 0.3, 0.2, 0.1])
    S.XTC(0.0, 0.15).apply(c)
    assert len(c) == 4


def test_mirostat_v2_truncates_by_surprisal() -> None:
    """tau = 1 bit: mu starts at 2, so tokens of surprisal > 2 bits are dropped."""
    c = cands([0.5, 0.25, 0.125, 0.125])
    m = S.MirostatV2(seed=3, tau=1.0, eta=0.1)
    m.apply(c)
    assert sorted(kept(c)) == [0, 1]
    assert c.token in (0, 1)
    observed = -math.log2([2 / 3, 1 / 3][c.token])  # renormalised over the survivors
    assert m.mu == pytest.approx(2.0 - 0.1 * (observed - 1.0), rel=1e-6)


# ------------------------------------------------------------------------ dist and RNG


def test_dist_frequencies() -> None:
    d = S.Dist(seed=11)
    counts = np.zeros(4)
    base = cands(P4)
    for _ in range(20000):
        c = base.copy()
        d.apply(c)
        counts[c.token] += 1
    np.testing.assert_allclose(counts / counts.sum(), P4, atol=0.015)


def test_reseed_clone_reset_determinism() -> None:
    base = cands([0.05, 0.15, 0.3, 0.5])

    def draws(s: S.Sampler, n: int = 30) -> list[int]:
        out = []
        for _ in range(n):
            c = base.copy()
            s.apply(c)
            out.append(c.token)
        return out

    a = S.Dist(seed=5)
    first = draws(a)
    a.reset()
    assert draws(a) == first
    b = S.Dist(seed=6)
    assert draws(b) != first
    b.reseed(5)
    assert draws(b) == first
    a.reset()
    draws(a, 7)
    twin = a.clone()
    assert draws(a) == draws(twin)  # a clone continues from the same RNG state
    assert S.Dist().seed != S.Dist().seed or S.Dist().seed != S.Dist().seed  # None: random seeds


def test_same_seed_same_tokens_as_llama_sampler_sample(tiny_model: Model) -> None:
    """A seeded Python chain, our NativeSamplerChain, and llama.cpp's own
    llama_sampler_sample (called raw) pick the same tokens step after step."""
    from llama_cffi import lib

    def make() -> list[S.Sampler]:
        return [S.TopK(20), S.TopP(0.9), S.Temperature(1.3), S.Dist(77)]

    runs = []
    for kind in ("python", "native", "raw"):
        with tiny_model.context(n_ctx=128) as ctx:
            chain: S.Sampler = S.SamplerChain(make()) if kind == "python" else S.NativeSamplerChain(make())
            ctx.decode(tiny_model.tokenize("hello world"))
            toks = []
            for _ in range(12):
                if kind == "raw":
                    assert isinstance(chain, S.NativeSamplerChain)
                    tok = int(lib.llama_sampler_sample(chain.sampler.underlying, ctx.underlying, -1))
                else:
                    tok = chain.sample(ctx)
                toks.append(tok)
                ctx.decode_single(tok)
            runs.append(toks)
    assert runs[0] == runs[1] == runs[2]


# ------------------------------------------------------------------------ candidates


def test_candidates_borrow_then_copy_on_write() -> None:
    row = np.arange(10, dtype=np.float32)
    c = S.Candidates.from_logits(row)
    assert np.shares_memory(c.read_logits(), row)
    assert c.is_identity
    c.logits[0] = 99.0
    assert row[0] == 0.0 and c.read_logits()[0] == 99.0
    with pytest.raises(ValueError):
        c.read_logits()[1] = 5.0  # read-only view
    with pytest.raises(S.InvalidLogitsError, match="NaN"):
        S.Candidates.from_logits(np.array([0.0, np.nan], np.float32))
    with pytest.raises(S.InvalidLogitsError, match="NaN"):
        S.Candidates.from_logits(np.r_[np.zeros(20000, np.float32), np.nan])  # the grouped path


@settings(max_examples=60, deadline=None)
@given(st.integers(8192, 40000), st.integers(1, 300), st.integers(0, 2**31), st.booleans())
def test_grouped_top_k_equals_full_sort(n: int, k: int, seed: int, ties: bool) -> None:
    """top(k) on a borrowed large row (group maxima) equals a stable full sort."""
    rng = np.random.default_rng(seed)
    row = (rng.integers(-5, 5, n) if ties else rng.standard_normal(n) * 3).astype(np.float32)
    c = S.Candidates.from_logits(row)
    got = c.top(k)
    want = np.argsort(-row, kind="stable")[:k]
    assert got.tolist() == want.tolist()


def test_strided_rows_are_copied_not_borrowed() -> None:
    """A non-contiguous row (a column of a matrix, a ``[::2]`` slice) is copied by reset,
    since the C kernels read contiguous memory; top-k still equals a stable sort."""
    rng = np.random.default_rng(3)
    base = rng.standard_normal((20000, 2)).astype(np.float32)
    row = base[:, 1]
    want = row.copy()
    c = S.Candidates.from_logits(row)
    assert c.top(40).tolist() == np.argsort(-want, kind="stable")[:40].tolist()
    base[:, 1] = 0.0  # not borrowed: the candidates kept their own copy
    np.testing.assert_array_equal(c.read_logits(), want)


def test_sampling_leaves_no_reference_into_the_output_buffer(tiny_model: Model) -> None:
    """After chain.sample(ctx) a decode that needs a larger output buffer still works: no
    borrowed row survives the step (it would pin llama.cpp's buffer: LiveOutputError)."""
    for smp in (S.Greedy(), S.SamplerChain([S.Temperature(0.5), S.Dist(1)]), S.NativeSamplerChain([S.Greedy()])):
        with tiny_model.context(n_ctx=256, n_batch=256, n_ubatch=256) as ctx:
            ctx.decode(tiny_model.tokenize("hi"))  # the output buffer holds one row
            smp.sample(ctx)
            ctx.memory.clear()
            batch = Batch(256)
            for i in range(1, 200):
                batch.add(i, i - 1, (0,), output=True)
            ctx.decode_batch(batch)  # grows the output buffer: refused while anything pins it
            assert ctx.logits_all().shape[0] == 199


def test_per_context_candidates_are_reused(tiny_model: Model) -> None:
    with tiny_model.context(n_ctx=64) as ctx:
        ctx.decode(tiny_model.tokenize("hi"))
        assert S.candidates_for(ctx) is S.candidates_for(ctx)
        chain = S.SamplerChain([S.TopK(5), S.Greedy()])
        chain.sample(ctx)
        before = S.candidates_for(ctx)._logits
        chain.sample(ctx)
        assert S.candidates_for(ctx)._logits is before  # no new vocabulary-sized buffers


# ------------------------------------------------------------------------ chains


def test_chain_needs_a_selector(tiny_model: Model) -> None:
    with tiny_model.context(n_ctx=64) as ctx:
        ctx.decode(tiny_model.tokenize("hi"))
        with pytest.raises(S.SamplingError, match="selecting sampler"):
            S.SamplerChain([S.TopK(5)]).sample(ctx)
        with pytest.raises(S.SamplingError):
            S.NativeSamplerChain([S.TopK(5)]).sample(ctx)


def test_chain_accept_broadcast_clone_independence(tiny_model: Model) -> None:
    chain = S.SamplerChain([S.Penalties(8, 1.5), S.TopK(30), S.Dist(3)])
    prompt = tiny_model.tokenize("one two").tolist()
    history: list[int] = []

    def continue_with(smp: S.Sampler, n: int) -> list[int]:
        with tiny_model.context(n_ctx=128) as ctx:
            ctx.decode(prompt + history)
            out = []
            for _ in range(n):
                t = smp.sample(ctx)
                out.append(t)
                ctx.decode_single(t)
            return out

    history += continue_with(chain, 4)
    pen = chain[0]
    assert isinstance(pen, S.Penalties) and list(pen.history) == history  # accept reached it
    twin = chain.clone()
    a = continue_with(chain, 5)
    b = continue_with(twin, 5)  # same state, same logits: same tokens
    assert a == b
    twin_pen = twin[0]
    assert isinstance(twin_pen, S.Penalties)
    assert len(pen.history) == 8 and len(twin_pen.history) == 8
    chain.reset()
    assert len(pen.history) == 0 and len(twin_pen.history) == 8


def test_generate_with_a_chain_and_dual_metrics(tiny_model: Model) -> None:
    """generate() accepts a chain; the tracker gets model-level and sampling-level surprisal
    for each token, and the model-level value is the token's surprisal under the full row."""
    tracker = PerplexityTracker()
    chain = S.SamplerChain([S.TopK(1), S.Greedy()], tracker=tracker)
    with tiny_model.context(n_ctx=128) as ctx:
        ctx.decode(tiny_model.tokenize("a b"))
        row = np.array(ctx.logits())
        tok = chain.sample(ctx)
        assert tracker.count == 1 and tracker.sampling_count == 1
        assert tracker.mean_surprisal == pytest.approx(surprisal(row, tok), rel=1e-6)
        assert tracker.sampling_mean_surprisal == 0.0  # one candidate left: certain
    with tiny_model.context(n_ctx=128) as ctx:
        out1 = ctx.generate("a b", max_tokens=8, sampler=S.SamplerChain([S.TopK(10), S.Dist(9)]))
    with tiny_model.context(n_ctx=128) as ctx:
        out2 = ctx.generate("a b", max_tokens=8, sampler=S.SamplerChain([S.TopK(10), S.Dist(9)]))
    assert out1 == out2


# ------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("make", "param"),
    [
        (lambda: S.Temperature(math.nan), "t"),
        (lambda: S.TopP(math.inf), "p"),
        (lambda: S.MinP(0.1, -1), "min_keep"),
        (lambda: S.TopK(1.5), "k"),  # type: ignore[arg-type]
        (lambda: S.Dist(-1), "seed"),
        (lambda: S.Dist(2**32), "seed"),
        (lambda: S.XTC(0.5, math.nan), "t"),
        (lambda: S.Mirostat(0), "n_vocab"),
        (lambda: S.MirostatV2(tau=math.nan), "tau"),
        (lambda: S.Penalties(64, math.nan), "repeat"),
        (lambda: S.DRY(math.inf), "multiplier"),
        (lambda: S.AdaptiveP(math.nan), "target"),
        (lambda: S.TempExt(1.0, math.nan), "delta"),
        (lambda: S.TopNSigma(math.inf), "n"),
        (lambda: LlamaSampler.temp(math.nan), "t"),
        (lambda: LlamaSampler.top_k(2**40), "k"),
    ],
)
def test_parameters_are_validated(make: object, param: str) -> None:
    with pytest.raises(ParamError, match=rf"^{param} must"):
        make()  # type: ignore[operator]


def test_native_sampler_lifecycle() -> None:
    s = LlamaSampler.top_k(5)
    chain = LlamaSampler.chain([s, LlamaSampler.greedy()])
    assert len(chain) == 2 and chain[0].name == "top-k" and s.name == "top-k"
    with pytest.raises(ParamError, match="already belongs"):
        chain.add(s)
    chain.close()
    s.name  # noqa: B018 - the member keeps the chain alive
    s.close()
    with pytest.raises(ClosedError):
        chain.reset()
    t = TokenDataArray(4)
    with pytest.raises(S.InvalidLogitsError, match="zero candidates"):
        LlamaSampler.top_p(0.5).apply(t.fill([], []))


CRASHERS = (
    r"""
import math, numpy as np
from llama_cffi.sampling import LlamaSampler, TokenDataArray, InvalidLogitsError, SamplingError
import samplers as S
"""
    + EXPECT
    + r"""
t = TokenDataArray(8)
# llama.cpp asserts (softmax of nothing) or sorts NaN (undefined behaviour) on these
for make in (lambda: LlamaSampler.top_p(0.5), lambda: LlamaSampler.typical(0.5), lambda: LlamaSampler.mirostat_v2(1),
             lambda: LlamaSampler.xtc(1, 0.1, 1, 1), lambda: LlamaSampler.dist(1), lambda: LlamaSampler.mirostat(8)):
    expect(InvalidLogitsError, lambda: make().apply(t.fill([], [])))
    expect(InvalidLogitsError, lambda: make().apply(t.fill([0, 1, 2], [1.0, math.nan, 0.5])))
expect(InvalidLogitsError, lambda: S.NativeSamplerChain([S.TopK(2), S.Dist(1)]).apply(S.Candidates.from_arrays([], [])))
print(" ".join(out))
"""
)


def test_native_samplers_never_crash_on_bad_candidates() -> None:
    """In a fresh process: what would abort llama.cpp raises a typed error instead."""
    r = run_isolated(CRASHERS)
    assert r.returncode == 0, r.stderr[-2000:]
    words = r.stdout.split()
    assert words and set(words) == {"InvalidLogitsError"}, r.stdout
