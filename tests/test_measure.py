"""samplers.measure: surprisal and entropy against float64 references, their mathematical
properties (hypothesis), the Context overloads, and PerplexityTracker's arithmetic."""

from __future__ import annotations

import math
import threading
import tracemalloc

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st

import llama_cffi
from llama_cffi.testing import logits_rows
from samplers.measure import PerplexityTracker, TokenOutOfRangeError, entropy, surprisal

LN2 = math.log(2.0)


# ---------------------------------------------------------------------- float64 references
def ref_log_probs(logits: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """log softmax in float64, written directly (max-shifted log-sum-exp)."""
    x = np.asarray(logits, dtype=np.float64)
    finite = x[np.isfinite(x)]
    m = finite.max()
    lse = float(m) + math.log(float(np.sum(np.exp(finite - m))))
    out: npt.NDArray[np.float64] = x - lse
    return out


def ref_entropy(logits: npt.ArrayLike) -> float:
    lp = ref_log_probs(logits)
    lp = lp[np.isfinite(lp)]
    p = np.exp(lp)
    return float(-np.sum(p * lp))


@pytest.mark.parametrize("n", [1, 2, 7, 1000, 262144])
@pytest.mark.parametrize("scale", [0.1, 3.0, 30.0])
def test_against_float64_reference(n: int, scale: float) -> None:
    """Surprisal of several tokens and the entropy agree with a float64 computation."""
    rng = np.random.default_rng(n + int(scale * 10))
    x = (rng.standard_normal(n) * scale).astype(np.float32)
    lp = ref_log_probs(x)
    for t in {0, n // 2, n - 1, int(np.argmax(x)), int(np.argmin(x))}:
        assert surprisal(x, t) == pytest.approx(-lp[t], rel=1e-6, abs=1e-6)
    assert entropy(x) == pytest.approx(ref_entropy(x), rel=1e-6, abs=1e-6)


def test_uniform_and_bits() -> None:
    n = 50_000
    x = np.full(n, 3.25, dtype=np.float32)
    assert surprisal(x, 123) == pytest.approx(math.log(n), rel=1e-9)
    assert entropy(x) == pytest.approx(math.log(n), rel=1e-7)
    assert surprisal(x, 123, base="bits") == pytest.approx(math.log2(n), rel=1e-9)
    assert entropy(x, base="bits") == pytest.approx(math.log2(n), rel=1e-7)


def test_single_logit() -> None:
    x = np.array([7.0], dtype=np.float32)
    assert surprisal(x, 0) == 0.0
    assert entropy(x) == 0.0


def test_inputs_other_than_float32() -> None:
    """Lists, float64 and integer arrays are accepted (evaluated in float32)."""
    x = [0.5, -1.25, 2.0, 0.0]
    ref = surprisal(np.array(x, dtype=np.float32), 2)
    assert surprisal(x, 2) == ref
    assert surprisal(np.array(x, dtype=np.float64), 2) == ref
    assert surprisal(np.array([1, 2, 3]), 0) == pytest.approx(-ref_log_probs([1, 2, 3])[0], rel=1e-6)


# ---------------------------------------------------------------------- errors
def test_errors() -> None:
    x = np.zeros(10, dtype=np.float32)
    for bad in (10, -1, 1 << 40):
        with pytest.raises(TokenOutOfRangeError, match=r"out of range \[0, 10\)") as ei:
            surprisal(x, bad)
        assert isinstance(ei.value, IndexError) and isinstance(ei.value, ValueError)
    with pytest.raises(TypeError):
        surprisal(x, True)
    with pytest.raises(TypeError):
        surprisal(x, 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="base"):
        surprisal(x, 0, base="nat")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="base"):
        entropy(x, base="nat")  # type: ignore[arg-type]
    for bad_row, msg in (
        (np.array([0.0, np.nan], dtype=np.float32), "NaN"),
        (np.array([0.0, np.inf], dtype=np.float32), r"\+inf"),
        (np.full(3, -np.inf, dtype=np.float32), "-inf"),
        (np.zeros((2, 3), dtype=np.float32), "1-D"),
        (np.zeros(0, dtype=np.float32), "empty"),
        (np.array(["a", "b"]), "dtype"),
    ):
        with pytest.raises(ValueError, match=msg):
            surprisal(bad_row, 0)
        with pytest.raises(ValueError, match=msg):
            entropy(bad_row)


def test_extremes() -> None:
    """±1e4 logits: probabilities that underflow to exactly 0 in float32 stay exact."""
    x = np.array([1e4, -1e4, 0.0], dtype=np.float32)
    assert surprisal(x, 0) == 0.0
    assert surprisal(x, 1) == pytest.approx(2e4, rel=1e-9)
    assert surprisal(x, 2) == pytest.approx(1e4, rel=1e-9)
    assert entropy(x) == 0.0


def test_minus_inf() -> None:
    """A -inf logit is a token of probability 0: infinite surprisal, no entropy (0 log 0 = 0),
    and the other tokens see the distribution without it."""
    x = np.array([1.0, -np.inf, 2.0, 0.5], dtype=np.float32)
    kept = np.array([1.0, 2.0, 0.5], dtype=np.float32)
    assert surprisal(x, 1) == math.inf
    assert surprisal(x, 1, base="bits") == math.inf
    assert surprisal(x, 2) == surprisal(kept, 1)
    assert entropy(x) == pytest.approx(entropy(kept), rel=1e-12)
    assert math.isfinite(entropy(x))


def test_no_vocab_sized_allocation_once_warm() -> None:
    """The float32 temporaries live in a reused per-thread buffer."""
    n = 262_144  # Gemma 3's vocabulary: 1 MiB of float32
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    surprisal(x, 5)
    entropy(x)
    tracemalloc.start()
    try:
        for t in range(5):
            surprisal(x, t)
            entropy(x)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < n  # well under one float32 row (4 * n bytes)


# ---------------------------------------------------------------------- properties
finite_logits = st.lists(
    st.integers(-640_000, 640_000).map(lambda k: k / 64.0),  # multiples of 1/64 in [-1e4, 1e4]: exact in float32
    min_size=1,
    max_size=300,
)


# logits_rows: the kit we ship to users (ties and -inf come often), proven here
@given(logits_rows(max_size=300, min_value=-1e4, max_value=1e4, allow_neg_inf=False), st.data())
def test_properties(x: npt.NDArray[np.float32], data: st.DataObject) -> None:
    """entropy in [0, log n]; surprisal >= 0 and >= -log(max p); bits = nats / ln 2."""
    n = len(x)
    t = data.draw(st.integers(0, n - 1))
    h = entropy(x)
    assert 0.0 <= h <= math.log(n)
    s = surprisal(x, t)
    assert s >= 0.0
    assert s >= surprisal(x, int(np.argmax(x)))
    assert surprisal(x, t, base="bits") == pytest.approx(s / LN2, rel=1e-12, abs=0)
    assert entropy(x, base="bits") == pytest.approx(h / LN2, rel=1e-12, abs=0)
    # the entropy is the expected surprisal (float64 check over the whole row)
    lp = ref_log_probs(x)
    assert h == pytest.approx(ref_entropy(x), rel=1e-5, abs=1e-5)
    assert s == pytest.approx(-lp[t], rel=1e-5, abs=1e-5)


@given(finite_logits, st.integers(-1000, 1000), st.data())
def test_shift_invariance(values: list[float], c: int, data: st.DataObject) -> None:
    """Adding a constant to every logit changes nothing (here exactly: x + c is exact in float32)."""
    x = np.array(values, dtype=np.float32)
    y = x + np.float32(c)
    assert np.array_equal(y.astype(np.float64), x.astype(np.float64) + c)  # the premise
    t = data.draw(st.integers(0, len(x) - 1))
    assert surprisal(y, t) == surprisal(x, t)
    assert entropy(y) == entropy(x)


@given(logits_rows(max_size=300, min_value=-1e4, max_value=1e4))
def test_minus_inf_property(x: npt.NDArray[np.float32]) -> None:
    """Masking tokens with -inf is the same as removing them. Up to float32 rounding of
    the normaliser: ggml's soft_max kernel adds exponentials in float32 blocks of 8
    (SIMD lanes) before accumulating in float64, so two rows of different lengths
    group their terms differently (a relative 1e-6 is a few float32 ulps of the sum)."""
    mask = np.isfinite(x)  # logits_rows: at least one finite entry, often some -inf
    kept = x[mask]
    assert entropy(x) == pytest.approx(entropy(kept), rel=1e-6, abs=1e-7)
    i = int(np.flatnonzero(mask)[0])
    assert surprisal(x, i) == pytest.approx(surprisal(kept, 0), rel=1e-6, abs=1e-7)
    if not mask.all():
        assert surprisal(x, int(np.flatnonzero(~mask)[0])) == math.inf


# ---------------------------------------------------------------------- Context overloads
def test_context_overloads(tiny_model: llama_cffi.Model) -> None:
    """surprisal(ctx, tok, idx=i) reads ctx.logits(i) without keeping it; views work too."""
    toks = tiny_model.tokenize("the cat sat on the mat")
    with tiny_model.context(n_ctx=64) as ctx:
        rows = ctx.decode(toks, logits="all")
        copies = np.array(rows, copy=True)
        for i in range(len(toks)):
            assert surprisal(ctx, 7, idx=i) == surprisal(copies[i], 7)
            assert entropy(ctx, idx=i) == entropy(copies[i])
        assert surprisal(ctx, 7) == surprisal(copies[-1], 7)  # idx=-1: the last output
        assert surprisal(ctx, 7, idx=-2, base="bits") == surprisal(copies[-2], 7) / LN2
        view = ctx.logits(-1)
        assert surprisal(view, 3) == surprisal(copies[-1], 3)
        assert entropy(view) == entropy(copies[-1])
        with pytest.raises(TokenOutOfRangeError) as ei:
            surprisal(ctx, tiny_model.n_vocab)
        # nothing points into the output buffer any more, not even from the frames of the
        # kept traceback: a batch that makes llama.cpp reallocate the buffer still runs
        del rows, view
        assert ei.value.__traceback__ is not None
        ctx.memory.clear()
        more = np.concatenate([toks] * 4)
        batch = llama_cffi.Batch(len(more))
        batch.set_sequence(more, 0)
        batch.logits[:] = 1
        ctx.decode_batch(batch)  # raises LiveOutputError while a raw array is alive
        assert surprisal(ctx, 7, idx=len(more) - 1) == surprisal(ctx.logits(-1).copy(), 7)


def test_context_without_outputs(tiny_model: llama_cffi.Model) -> None:
    with tiny_model.context(n_ctx=64) as ctx:
        ctx.decode(tiny_model.tokenize("hello"), logits="none")
        with pytest.raises(IndexError):
            surprisal(ctx, 0)


# ---------------------------------------------------------------------- PerplexityTracker
def llama_perplexity_stderr(v: npt.NDArray[np.float64]) -> float:
    """perplexity.cpp's final estimate error, written out."""
    n = len(v)
    nll, nll2 = v.sum() / n, (v * v).sum() / n
    return math.exp(nll) * math.sqrt((nll2 - nll * nll) / (n - 1))


def test_tracker_arithmetic() -> None:
    rng = np.random.default_rng(3)
    model = rng.gamma(2.0, 1.5, size=200)
    sampling = model * 0.5
    tr = PerplexityTracker()
    for i, (a, b) in enumerate(zip(model, sampling, strict=True)):
        tr.add(float(a), float(b) if i % 2 == 0 else None)
    assert tr.count == 200 and tr.sampling_count == 100
    assert tr.total_surprisal == pytest.approx(model.sum(), rel=1e-12)
    assert tr.mean_surprisal == pytest.approx(model.mean(), rel=1e-12)
    assert tr.perplexity == pytest.approx(math.exp(model.mean()), rel=1e-12)
    assert tr.stderr == pytest.approx(llama_perplexity_stderr(model), rel=1e-9)
    assert tr.sampling_mean_surprisal == pytest.approx(sampling[::2].mean(), rel=1e-12)
    assert tr.sampling_perplexity == pytest.approx(math.exp(sampling[::2].mean()), rel=1e-12)
    assert tr.sampling_stderr == pytest.approx(llama_perplexity_stderr(sampling[::2]), rel=1e-9)
    assert "count=200" in repr(tr)


def test_tracker_edges() -> None:
    tr = PerplexityTracker()
    for v in (tr.mean_surprisal, tr.perplexity, tr.stderr, tr.sampling_perplexity, tr.sampling_stderr):
        assert math.isnan(v)
    tr.add(2.0)
    assert tr.perplexity == pytest.approx(math.exp(2.0)) and math.isnan(tr.stderr)
    tr.add(2.0)
    assert tr.stderr == 0.0  # no spread
    tr.add(math.inf)
    assert tr.perplexity == math.inf
    big = PerplexityTracker()
    big.add(1000.0)  # exp overflows a float: reported as inf, not an OverflowError
    assert big.perplexity == math.inf
    for bad in (math.nan, -0.5):
        with pytest.raises(ValueError, match="surprisal"):
            tr.add(bad)
        with pytest.raises(ValueError, match="sampling_surprisal"):
            tr.add(1.0, bad)
    with pytest.raises(TypeError):
        tr.add("1.0")  # type: ignore[arg-type]
    assert tr.count == 3  # failed adds record nothing


def test_tracker_add_token_reset_clone() -> None:
    x = np.array([0.1, 2.0, -1.0, 0.7], dtype=np.float32)
    filtered = np.array([0.1, 2.0, -np.inf, -np.inf], dtype=np.float32)
    tr = PerplexityTracker()
    s = tr.add_token(x, 0, sampling_logits=filtered)
    assert s == surprisal(x, 0)
    assert tr.mean_surprisal == s and tr.sampling_mean_surprisal == surprisal(filtered, 0)
    assert tr.sampling_perplexity < tr.perplexity  # the sampler's distribution was narrower
    tr.add_token(x, 1)
    snap = tr.clone()
    tr.add(5.0, 5.0)
    assert snap.count == 2 and snap.sampling_count == 1 and tr.count == 3 and tr.sampling_count == 2
    assert snap.mean_surprisal == pytest.approx((surprisal(x, 0) + surprisal(x, 1)) / 2, rel=1e-12)
    snap.add(0.0)
    assert tr.count == 3
    tr.reset()
    assert tr.count == 0 and tr.sampling_count == 0 and math.isnan(tr.perplexity)
    assert snap.count == 3
    tr.add(1.0)
    assert tr.perplexity == pytest.approx(math.e)


def test_threads_have_their_own_scratch() -> None:
    """Scratch buffers are per thread: concurrent threads get correct results."""
    rng = np.random.default_rng(9)
    rows = [rng.standard_normal(20_000 + 1000 * i).astype(np.float32) for i in range(4)]
    expected = [(surprisal(r, 17), entropy(r)) for r in rows]
    errors: list[str] = []

    def work(i: int) -> None:
        for _ in range(50):
            got = (surprisal(rows[i], 17), entropy(rows[i]))
            if got != expected[i]:
                errors.append(f"thread {i}: {got} != {expected[i]}")
                return

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
