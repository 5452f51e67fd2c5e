"""Every Python sampler against llama.cpp's own, on the same candidates.

Each case applies the Python sampler to :class:`Candidates` and its ``native()`` twin
(``llama_sampler_init_*`` + ``llama_sampler_apply`` on a ``llama_token_data_array``) to the
same ids/logits, then compares survivors, logits, probabilities, flags and the selected
token. Inputs come from hypothesis (ties, -inf, extremes) and from full-size random
vocabularies (32k and 262,144 tokens).

Where two candidates have equal logits, llama.cpp's ``std::sort``/``std::partial_sort``
order is unspecified; the comparison then accepts any exchange between equal logits
(the multiset of survivors' logits must still match, and a selected token must have the
same logit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from llama_cffi import Model
from llama_cffi.sampling import TokenDataArray
from samplers import (
    DRY,
    XTC,
    AdaptiveP,
    Candidates,
    Dist,
    Greedy,
    Infill,
    LogitBias,
    MinP,
    Mirostat,
    MirostatV2,
    Penalties,
    Sampler,
    Temperature,
    TempExt,
    TopK,
    TopNSigma,
    TopP,
    Typical,
)

# ------------------------------------------------------------------------ harness


class Result:
    def __init__(self, ids: np.ndarray, logits: np.ndarray, p: np.ndarray, sorted: bool, selected: int) -> None:
        self.ids, self.logits, self.p, self.sorted, self.selected = ids, logits, p, sorted, selected

    @property
    def token(self) -> int:
        return int(self.ids[self.selected]) if 0 <= self.selected < len(self.ids) else -1


def run_python(s: Sampler, ids: np.ndarray, logits: np.ndarray, identity: bool) -> Result:
    c = Candidates.from_logits(logits.copy()) if identity else Candidates.from_arrays(ids, logits)
    s.apply(c)
    p = c.p.copy() if c.has_p else np.zeros(c.size, np.float32)
    return Result(c.read_ids().copy(), c.read_logits().copy(), p, c.sorted, c.selected)


def run_native(s: Any, ids: np.ndarray, logits: np.ndarray) -> Result:
    t = TokenDataArray(len(logits))
    t.fill(ids, logits)
    s.apply(t)
    return Result(t.ids.copy(), t.logits.copy(), t.p.copy(), t.sorted, t.selected)


def assert_same(a: Result, b: Result, src: np.ndarray, what: str, logit_atol: float = 1e-6) -> None:
    """Python result ``a`` equals native ``b`` up to exchanges between equal logits.
    ``src[id]`` is the input logit of token ``id``; ``logit_atol`` is the absolute tolerance
    on output logits (wider for samplers whose output logits amplify rounding of ``p``)."""
    assert len(a.ids) == len(b.ids), f"{what}: {len(a.ids)} survivors vs llama.cpp's {len(b.ids)}"
    assert a.sorted == b.sorted, f"{what}: sorted={a.sorted} vs llama.cpp's {b.sorted}"
    np.testing.assert_allclose(np.sort(a.logits), np.sort(b.logits), rtol=2e-6, atol=logit_atol, err_msg=what)
    np.testing.assert_allclose(np.sort(a.p), np.sort(b.p), rtol=2e-5, atol=2e-7, err_msg=what)
    only_a = np.setdiff1d(a.ids, b.ids)
    only_b = np.setdiff1d(b.ids, a.ids)
    for tok in only_a:  # only a token tied (within float32 resolution) with one kept by the other side may differ
        assert np.isclose(src[only_b], src[tok], rtol=1e-6, atol=1e-6).any(), (
            f"{what}: token {tok} (logit {src[tok]}) kept by Python only"
        )
    common, ia, ib = np.intersect1d(a.ids, b.ids, return_indices=True)
    la, lb = a.logits[ia], b.logits[ib]
    same = (la == lb) | np.isclose(la, lb, rtol=2e-6, atol=logit_atol)
    assert same.all(), f"{what}: logits differ for tokens {common[~same][:5]}: {la[~same][:5]} vs {lb[~same][:5]}"
    pa, pb = a.p[ia], b.p[ib]
    close = np.isclose(pa, pb, rtol=2e-5, atol=2e-7) | (np.isnan(pa) & np.isnan(pb))
    assert close.all(), f"{what}: p differs for tokens {common[~close][:5]}: {pa[~close][:5]} vs {pb[~close][:5]}"
    assert (a.selected >= 0) == (b.selected >= 0), f"{what}: selected {a.selected} vs {b.selected}"
    if a.selected >= 0:
        ta, tb = a.token, b.token
        assert ta == tb or np.isclose(src[ta], src[tb], rtol=1e-6, atol=1e-6), (
            f"{what}: selected token {ta} vs llama.cpp's {tb}"
        )


def source(ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
    src = np.full(int(ids.max()) + 1 if len(ids) else 1, np.nan, np.float32)
    src[ids] = logits
    return src


def compare(
    make: Callable[[], Sampler],
    ids: np.ndarray,
    logits: np.ndarray,
    identity: bool = False,
    steps: int = 1,
    logit_atol: float = 1e-6,
) -> None:
    """Apply fresh twins ``steps`` times to the same candidates, accepting the native choice."""
    py = make()
    nat = py.native()
    src = source(ids, logits)
    for step in range(steps):
        a = run_python(py, ids, logits, identity)
        b = run_native(nat, ids, logits)
        assert_same(a, b, src, f"{py!r} step {step}", logit_atol)
        tok = b.token if b.selected >= 0 else int(ids[step % len(ids)])
        py.accept(tok)
        nat.accept(tok)


# ------------------------------------------------------------------------ inputs

FINITE = st.floats(-40, 40, width=32, allow_nan=False, allow_infinity=False)


@st.composite
def candidates(
    draw: st.DrawFn, min_size: int = 1, max_size: int = 120, inf: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    n = draw(st.integers(min_size, max_size))
    pool = draw(st.lists(FINITE, min_size=1, max_size=6))  # few values: many ties
    kind = draw(st.sampled_from(["free", "ties", "mixed"]))
    if kind == "free":
        vals = draw(st.lists(FINITE, min_size=n, max_size=n))
    elif kind == "ties":
        vals = draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n))
    else:
        vals = draw(st.lists(st.one_of(FINITE, st.sampled_from(pool)), min_size=n, max_size=n))
    logits = np.array(vals, dtype=np.float32)
    if inf and n > 1 and draw(st.booleans()):
        mask = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
        mask[draw(st.integers(0, n - 1))] = False  # at least one finite logit
        logits[mask] = -np.inf
    shuffle = draw(st.booleans())
    ids = np.arange(n, dtype=np.int32)
    if shuffle:
        ids = np.array(draw(st.permutations(list(range(n * 3)))))[:n].astype(np.int32)
    return ids, logits


HYP = settings(
    max_examples=max(150, settings().max_examples), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
PROB = st.floats(0.0, 1.0, width=32)
MIN_KEEP = st.integers(0, 5)
SEED = st.integers(0, 2**32 - 2)


@HYP
@given(candidates(), st.integers(-3, 130))
def test_top_k(c: tuple[np.ndarray, np.ndarray], k: int) -> None:
    compare(lambda: TopK(k), *c)


@HYP
@given(candidates(), PROB, MIN_KEEP)
def test_top_p(c: tuple[np.ndarray, np.ndarray], p: float, min_keep: int) -> None:
    compare(lambda: TopP(p, min_keep), *c)


@HYP
@given(candidates(), PROB, MIN_KEEP)
def test_min_p(c: tuple[np.ndarray, np.ndarray], p: float, min_keep: int) -> None:
    compare(lambda: MinP(p, min_keep), *c)


@HYP
@given(candidates(inf=False), PROB, MIN_KEEP)
def test_typical(c: tuple[np.ndarray, np.ndarray], p: float, min_keep: int) -> None:
    ids, logits = c
    # llama.cpp's entropy is NaN once a probability underflows to 0 (then its order is
    # arbitrary); see Typical's docstring
    assume(float(logits.max() - logits.min()) < 80)
    compare(lambda: Typical(p, min_keep), ids, logits)


@HYP
@given(candidates(), st.floats(-2, 4, width=32))
def test_temperature(c: tuple[np.ndarray, np.ndarray], t: float) -> None:
    compare(lambda: Temperature(t), *c)


@HYP
@given(candidates(), st.floats(0, 3, width=32), st.floats(-1, 2, width=32), st.floats(0.125, 3, width=32))
def test_temp_ext(c: tuple[np.ndarray, np.ndarray], t: float, delta: float, exponent: float) -> None:
    compare(lambda: TempExt(t, delta, exponent), *c)


@HYP
@given(candidates(), st.floats(-1, 4, width=32))
def test_top_n_sigma(c: tuple[np.ndarray, np.ndarray], n: float) -> None:
    compare(lambda: TopNSigma(n), *c)


@HYP
@given(candidates(), st.floats(0, 1, width=32), st.floats(0, 0.625, width=32), MIN_KEEP, SEED)
def test_xtc(c: tuple[np.ndarray, np.ndarray], p: float, t: float, min_keep: int, seed: int) -> None:
    compare(lambda: XTC(p, t, min_keep, seed), *c, steps=4)


@HYP
@given(candidates())
def test_greedy(c: tuple[np.ndarray, np.ndarray]) -> None:
    compare(Greedy, *c)


@HYP
@given(candidates(), SEED)
def test_dist_same_draws(c: tuple[np.ndarray, np.ndarray], seed: int) -> None:
    """Same seed, same candidates: the same token as llama.cpp, step after step."""
    compare(lambda: Dist(seed), *c, steps=5)


@HYP
@given(candidates(min_size=2, inf=False), SEED, st.floats(1, 8, width=32), st.floats(0.015625, 1, width=32))
def test_mirostat(c: tuple[np.ndarray, np.ndarray], seed: int, tau: float, eta: float) -> None:
    ids, logits = c
    compare(lambda: Mirostat(int(ids.max()) + 1, seed, tau, eta, 100), ids, logits, steps=4)


@HYP
@given(candidates(inf=False), SEED, st.floats(1, 8, width=32), st.floats(0.015625, 1, width=32))
def test_mirostat_v2(c: tuple[np.ndarray, np.ndarray], seed: int, tau: float, eta: float) -> None:
    compare(lambda: MirostatV2(seed, tau, eta), *c, steps=4)


@HYP
@given(candidates(), st.floats(-0.5, 1, width=32), st.floats(0, 1, width=32), SEED)
def test_adaptive_p(c: tuple[np.ndarray, np.ndarray], target: float, decay: float, seed: int) -> None:
    # Output logits are 5 - 10 d^2 / (1 + d) with d = |p - target| / 0.3: a slope of up to
    # 10 / 0.3 = 33 per unit of p, so the 1-ulp differences between numpy's float32 exp and
    # glibc's expf (~2e-7 in p) become up to ~7e-6 in the logits.
    compare(lambda: AdaptiveP(target, decay, seed), *c, steps=4, logit_atol=1e-5)


@HYP
@given(
    candidates(),
    st.integers(-1, 8),
    st.floats(0.5, 2, width=32),
    st.floats(-1, 1, width=32),
    st.floats(-1, 1, width=32),
    st.lists(st.integers(0, 400), max_size=20),
)
def test_penalties(
    c: tuple[np.ndarray, np.ndarray], last_n: int, repeat: float, freq: float, present: float, history: list[int]
) -> None:
    """Penalties after a history of accepted tokens (the window slides past last_n)."""
    ids, logits = c
    py = Penalties(last_n, repeat, freq, present, n_vocab=1000)
    nat = py.native()
    for t in history:
        py.accept(t)
        nat.accept(t)
    src = source(ids, logits)
    assert_same(run_python(py, ids, logits, False), run_native(nat, ids, logits), src, repr(py))


@HYP
@given(
    candidates(),
    st.lists(st.tuples(st.integers(0, 399), st.one_of(FINITE, st.just(float("-inf")))), max_size=12),
)
def test_logit_bias(c: tuple[np.ndarray, np.ndarray], biases: list[tuple[int, float]]) -> None:
    ids, logits = c
    # one bias per token: llama.cpp applies a repeated token's biases inconsistently
    # (all of them at an identity position, only the first elsewhere); we add them all
    uniq = dict(biases)
    compare(lambda: LogitBias(400, uniq), ids, logits)
    compare(lambda: LogitBias(400, uniq), np.arange(len(logits), dtype=np.int32), logits, identity=True)


# ------------------------------------------------------------------------ full vocabularies


def _big(n: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * 3).astype(np.float32)


BIG_CASES: list[tuple[str, Callable[[int], Sampler]]] = [
    ("greedy", lambda n: Greedy()),
    ("dist", lambda n: Dist(42)),
    ("top_k", lambda n: TopK(40)),
    ("top_p", lambda n: TopP(0.9)),
    ("min_p", lambda n: MinP(0.05)),
    ("typical", lambda n: Typical(0.9)),
    ("temp", lambda n: Temperature(0.7)),
    ("temp_ext", lambda n: TempExt(0.8, 0.5, 1.0)),
    ("top_n_sigma", lambda n: TopNSigma(1.5)),
    ("xtc", lambda n: XTC(1.0, 0.001, 1, 3)),
    ("mirostat", lambda n: Mirostat(n, 5, 5.0, 0.1, 100)),
    ("mirostat_v2", lambda n: MirostatV2(5, 5.0, 0.1)),
    ("adaptive_p", lambda n: AdaptiveP(0.3, 0.9, 4)),
    ("logit_bias", lambda n: LogitBias(n, {3: 5.0, 7: float("-inf"), n - 1: 2.5})),
    ("penalties", lambda n: Penalties(64, 1.3, 0.1, 0.2, n_vocab=n)),
]


@pytest.mark.parametrize("n", [32_000, 262_144])
@pytest.mark.parametrize(("name", "make"), BIG_CASES, ids=[c[0] for c in BIG_CASES])
def test_full_vocabulary(name: str, make: Callable[[int], Sampler], n: int) -> None:
    """Each sampler on a whole random vocabulary, ids in order (the zero-copy path)."""
    logits = _big(n, 1)
    ids = np.arange(n, dtype=np.int32)

    def mk() -> Sampler:
        s = make(n)
        if isinstance(s, Penalties):
            for t in (5, 9, 5, n - 1, 300, 5):
                s.accept(t)
        return s

    py = mk()
    nat = mk().native()
    if isinstance(py, Penalties):
        for t in (5, 9, 5, n - 1, 300, 5):
            nat.accept(t)
    src = logits
    for step in range(2):
        a = run_python(py, ids, logits, identity=True)
        b = run_native(nat, ids, logits)
        assert_same(a, b, src, f"{name} n={n} step {step}")
        if b.selected >= 0:
            py.accept(b.token)
            nat.accept(b.token)


# ------------------------------------------------------------------------ samplers that need a vocab


def test_dry_against_native(default_model: Model) -> None:
    """DRY with llama.cpp's default string breakers on gemma's vocabulary: a history with
    repeats (and breakers inside) penalises the same tokens by the same amounts."""
    model = default_model
    text = 'the cat sat on the mat. the cat sat on the "mat". the cat sat on the'
    hist = model.tokenize(text, add_special=False).tolist()
    rng = np.random.default_rng(3)
    for mult, base, allowed, last_n in [(0.8, 1.75, 2, 64), (1.5, 2.0, 1, 16), (0.5, 1.1, 3, 1024)]:
        py = DRY(mult, base, allowed, last_n, model=model)
        nat = py.native()
        for t in hist:
            py.accept(t)
            nat.accept(t)
        assert py.penalties(), "the history repeats: some token must be penalised"
        top = np.array(sorted(set(hist) | set(range(0, 4000, 7))), dtype=np.int32)
        logits = rng.standard_normal(len(top)).astype(np.float32)
        src = source(top, logits)
        assert_same(run_python(py, top, logits, False), run_native(nat, top, logits), src, repr(py))


def test_dry_token_breakers_match_string_breakers(default_model: Model) -> None:
    """A breaker given as the token sequence the string tokenises to behaves the same."""
    model = default_model
    hist = model.tokenize("a b c a b c\na b c a b", add_special=False).tolist()
    nl = model.tokenize("\n", add_special=False).tolist()
    by_str = DRY(1.0, 1.75, 2, 64, seq_breakers=["\n"], model=model)
    by_tok = DRY(1.0, 1.75, 2, 64, seq_breakers=[nl])
    for t in hist:
        by_str.accept(t)
        by_tok.accept(t)
    assert by_str.penalties() == by_tok.penalties()


def test_infill_against_native(default_model: Model) -> None:
    """Infill on gemma's vocabulary: prefix merging and EOG preference as llama.cpp's."""
    model = default_model
    rng = np.random.default_rng(5)
    eog = [t for t in range(model.n_vocab) if model.vocab.is_eog(t)][:2]
    prefixes = model.tokenize(" the then there theme", add_special=False).tolist()
    for trial in range(6):
        ids = np.array(sorted(set(prefixes) | set(rng.integers(0, 5000, 30).tolist()) | set(eog)), dtype=np.int32)
        logits = (rng.standard_normal(len(ids)) * (1 + trial)).astype(np.float32)
        if trial % 2:
            logits[np.isin(ids, eog)] += 4  # make ending attractive
        src = source(ids, logits)
        py = Infill(model)
        assert_same(run_python(py, ids, logits, False), run_native(py.native(), ids, logits), src, f"infill {trial}")
