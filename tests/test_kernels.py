"""llama_cffi.kernels: ggml's soft_max kernel against a float64 reference, and its argument checks."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llama_cffi import kernels

rows = st.lists(st.one_of(st.floats(-80, 80, width=32), st.just(-math.inf)), min_size=1, max_size=70).filter(
    lambda v: any(math.isfinite(x) for x in v)
)


def test_linked_impl_is_ggml() -> None:
    # the native build always links ggml-cpu; the scalar fallback is for builds without it
    assert kernels.SOFTMAX_IMPL == "ggml_vec_soft_max_f32"


@given(rows, st.integers(0, 7))
def test_sum_and_dot_match_float64(values: list[float], offset: int) -> None:
    # an offset into a larger buffer exercises unaligned starts and every tail length
    buf = np.zeros(len(values) + offset, dtype=np.float32)
    x = buf[offset:]
    x[:] = values
    m = float(x.max())
    out = np.full_like(x, np.nan)
    s = kernels.softmax_sum(x, m, out)
    # the shift is float32 (as in llama.cpp), only exp and the sum are compared in float64
    e64 = np.exp((x - np.float32(m)).astype(np.float64))
    assert s == pytest.approx(e64.sum(), rel=1e-6)
    np.testing.assert_allclose(out, e64, rtol=3e-7, atol=1e-38)
    fin = np.isfinite(x)
    d = kernels.softmax_dot(out, x, m)
    ref = float((e64[fin] * (x[fin] - np.float32(m)).astype(np.float64)).sum())
    assert math.isfinite(d)
    assert d == pytest.approx(ref, rel=1e-5, abs=1e-30)


def test_in_place() -> None:
    x = np.array([0.0, 1.0, -np.inf, 2.0] * 5, dtype=np.float32)
    ref = np.exp(x.astype(np.float64) - 2.0)
    s = kernels.softmax_sum(x, 2.0, x)
    assert s == pytest.approx(ref.sum(), rel=1e-6)
    np.testing.assert_allclose(x, ref, rtol=3e-7)


@pytest.mark.parametrize(
    "row, out, err",
    [
        (np.zeros(4, np.float64), np.zeros(4, np.float32), TypeError),
        (np.zeros(4, np.float32), np.zeros(3, np.float32), ValueError),
        (np.zeros((2, 2), np.float32), np.zeros(4, np.float32), TypeError),
        (np.zeros(8, np.float32)[::2], np.zeros(4, np.float32), TypeError),
        ([0.0, 1.0], np.zeros(2, np.float32), TypeError),
    ],
)
def test_bad_arguments_raise(row: object, out: object, err: type[Exception]) -> None:
    with pytest.raises(err):
        kernels.softmax_sum(row, 0.0, out)  # type: ignore[arg-type]
    with pytest.raises(err):
        kernels.softmax_dot(out, row, 0.0)  # type: ignore[arg-type]


def test_read_only_out_refused() -> None:
    out = np.zeros(4, np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        kernels.softmax_sum(np.zeros(4, np.float32), 0.0, out)


@given(
    st.integers(1, 40),  # groups (cols)
    st.integers(0, 63),  # tail length
    st.integers(1, 40),
    st.sampled_from([3, 50, 4000]),  # few distinct values: many ties at the threshold
    st.integers(0, 2**32 - 1),
    st.booleans(),
)
def test_top_k_grouped_equals_a_stable_sort(
    cols: int, tail: int, k: int, distinct: int, seed: int, with_inf: bool
) -> None:
    k = min(k, cols)
    rng = np.random.default_rng(seed)
    row = rng.integers(0, distinct, size=64 * cols + tail).astype(np.float32) / 7
    if with_inf:
        row[rng.integers(0, len(row), size=len(row) // 3)] = -math.inf
    gmax = np.ascontiguousarray(row[: 64 * cols].reshape(64, cols).max(axis=0))
    out = np.full(k + 3, -1, dtype=np.intp)
    got = kernels.top_k_grouped(row, gmax, k, out)
    want = np.argsort(-row, kind="stable")[:k]  # ties: lower position first
    np.testing.assert_array_equal(got, want)
    assert got.base is out or got.base is out.base
    assert (out[k:] == -1).all()  # nothing written past k


def test_top_k_grouped_checks_its_arguments() -> None:
    row = np.zeros(64 * 4, dtype=np.float32)
    gmax = np.zeros(4, dtype=np.float32)
    out = np.zeros(4, dtype=np.intp)
    with pytest.raises(ValueError, match="k <= len"):
        kernels.top_k_grouped(row, gmax, 5, out)
    with pytest.raises(ValueError, match="k <= len"):
        kernels.top_k_grouped(row, gmax, 0, out)
    with pytest.raises(ValueError, match="64 \\* len"):
        kernels.top_k_grouped(row[:100], gmax, 2, out)
    with pytest.raises(TypeError, match="intp"):
        kernels.top_k_grouped(row, gmax, 2, np.zeros(4, dtype=np.int32))
    with pytest.raises(TypeError, match="at least 3"):
        kernels.top_k_grouped(row, gmax, 3, np.zeros(2, dtype=np.intp))
    with pytest.raises(TypeError, match="float32"):
        kernels.top_k_grouped(row.astype(np.float64), gmax, 2, out)
    with pytest.raises(TypeError, match="contiguous"):
        kernels.top_k_grouped(np.zeros(64 * 8, dtype=np.float32)[::2], gmax, 2, out)


def _masked_reference(row: np.ndarray, allowed: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """What ``Candidates.top(k)`` keeps after a grammar mask: a stable sort of the masked row."""
    masked = np.where(allowed, row, np.float32(-math.inf)).astype(np.float32)
    order = np.argsort(-masked, kind="stable")[:k]
    return order, masked[order]


@given(
    # (over 8 words: the zero words skipped eight at a time; from 8,192 values: block maxima first)
    st.one_of(st.integers(1, 1200), st.sampled_from([8192, 8192 + 37, 20000])),
    st.integers(1, 50),
    st.sampled_from([0.0, 0.002, 0.02, 0.3, 0.9, 1.0]),  # share allowed: none, very few, few, many, all
    st.sampled_from([3, 50, 4000]),  # few distinct values: many ties
    st.integers(0, 2**32 - 1),
    st.booleans(),
    st.booleans(),
)
def test_masked_top_k_equals_a_stable_sort_of_the_masked_row(
    n: int, k: int, share: float, distinct: int, seed: int, with_inf: bool, dirty_padding: bool
) -> None:
    """The k best allowed values, ties by lower position, then (fewer than k allowed above
    -inf) the lowest positions left at -inf: what the chain's top-k keeps after the mask;
    the count returned is of those above -inf; padding bits past the row are ignored."""
    k = min(k, n)
    rng = np.random.default_rng(seed)
    row = (rng.integers(0, distinct, size=n) / 7).astype(np.float32)
    if with_inf:
        row[rng.integers(0, n, size=n // 3 + 1)] = -math.inf
        row[rng.integers(0, n)] = math.inf
    allowed = rng.random(n) < share
    words = np.zeros((n + 31) // 32, dtype=np.uint32)
    words.view(np.uint8)[: (n + 7) // 8] = np.packbits(allowed, bitorder="little")
    if dirty_padding and n % 32:
        words[-1] |= np.uint32(~((1 << (n % 32)) - 1) & 0xFFFFFFFF)  # bits past the row: not tokens
    ids = np.full(k + 2, -7, dtype=np.int32)
    lg = np.full(k + 2, 7.0, dtype=np.float32)
    got = kernels.masked_top_k(row, words, k, ids, lg)
    want_ids, want_lg = _masked_reference(row, allowed, k)
    assert ids[:k].tolist() == want_ids.tolist()
    np.testing.assert_array_equal(lg[:k], want_lg)
    assert got == int(np.count_nonzero(want_lg > -math.inf))
    assert ids[k:].tolist() == [-7, -7] and lg[k:].tolist() == [7.0, 7.0]  # nothing past k


def test_masked_top_k_finds_a_lone_allowed_token_anywhere() -> None:
    """A mask that allows one token (or two), at every position of a row of three and a
    bit blocks of eight words (the zero words are skipped eight at a time): that token
    first, then the lowest positions at -inf."""
    n = 32 * 8 * 3 + 5
    row = np.linspace(-1.0, 1.0, n, dtype=np.float32)
    ids, lg = np.empty(3, np.int32), np.empty(3, np.float32)
    for p in range(n):
        for q in sorted({p, (p * 7 + 300) % n}):
            words = np.zeros((n + 31) // 32, dtype=np.uint32)
            words[p >> 5] |= np.uint32(1 << (p & 31))
            words[q >> 5] |= np.uint32(1 << (q & 31))
            got = kernels.masked_top_k(row, words, 3, ids, lg)
            allowed = sorted({p, q}, reverse=True)
            assert got == len(allowed)
            assert ids[: len(allowed)].tolist() == allowed
            rest = [i for i in range(n) if i not in allowed][: 3 - len(allowed)]
            assert ids[len(allowed) :].tolist() == rest


def test_masked_top_k_checks_its_arguments() -> None:
    row = np.zeros(40, dtype=np.float32)
    words = np.full(2, 0xFFFFFFFF, dtype=np.uint32)
    ids, lg = np.zeros(4, dtype=np.int32), np.zeros(4, dtype=np.float32)
    for bad_k in (0, 41):
        with pytest.raises(ValueError, match="k <= len"):
            kernels.masked_top_k(row, words, bad_k, ids, lg)
    with pytest.raises(ValueError, match="at least 2 words"):
        kernels.masked_top_k(row, words[:1], 2, ids, lg)
    with pytest.raises(TypeError, match="uint32"):
        kernels.masked_top_k(row, words.astype(np.int64), 2, ids, lg)
    with pytest.raises(TypeError, match="ids must be"):
        kernels.masked_top_k(row, words, 5, ids, lg)
    with pytest.raises(TypeError, match="logits must be"):
        kernels.masked_top_k(row, words, 2, ids, lg.astype(np.float64))
    with pytest.raises(TypeError, match="contiguous"):
        kernels.masked_top_k(np.zeros(80, dtype=np.float32)[::2], words, 2, ids, lg)
    nan = row.copy()
    nan[33] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        kernels.masked_top_k(nan, words, 2, ids, lg)
    words[1] = 0  # the NaN masked out: not read
    assert kernels.masked_top_k(nan, words, 2, ids, lg) == 2


@given(
    st.integers(0, 40), st.integers(1, 100), st.integers(1, 12), st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 4])
)
def test_masked_top_k_rows_is_masked_top_k_row_by_row(m: int, n: int, k: int, seed: int, threads: int) -> None:
    """Many rows in one call, on 1, 2 or 4 threads: each row of the result is that row's own
    masked_top_k (each row its own share allowed; some rows share one mask array, as the
    branches in one grammar state do, next to each other or not: the kernel scans each
    distinct mask once)."""
    k = min(k, n)
    rng = np.random.default_rng(seed)
    rows = [(rng.integers(0, 9, size=n) / 3).astype(np.float32) for _ in range(m)]
    masks: list[npt.NDArray[np.uint32]] = []
    for _ in range(m):
        if masks and rng.random() < 0.4:  # the mask of an earlier row (often the last)
            masks.append(masks[-1] if rng.random() < 0.5 else masks[int(rng.integers(len(masks)))])
            continue
        allowed = rng.random(n) < rng.choice([0.0, 0.1, 0.6, 1.0])
        words = np.zeros((n + 31) // 32 + 1, dtype=np.uint32)
        words.view(np.uint8)[: (n + 7) // 8] = np.packbits(allowed, bitorder="little")
        masks.append(words)
    ids = np.full((m, k), -1, dtype=np.int32)
    lg = np.zeros((m, k), dtype=np.float32)
    counts = kernels.masked_top_k_rows(rows, masks, k, ids, lg, threads)
    assert counts.shape == (m,)
    for r in range(m):
        want_ids, want_lg = np.empty(k, np.int32), np.empty(k, np.float32)
        assert counts[r] == kernels.masked_top_k(rows[r], masks[r], k, want_ids, want_lg)
        assert ids[r].tolist() == want_ids.tolist()
        np.testing.assert_array_equal(lg[r], want_lg)
    # the same rows as one matrix, stored in another order (and one row twice, one unread),
    # read through row_index: the same result
    order = rng.permutation(m)
    matrix = np.zeros((m + 1, n), dtype=np.float32)
    matrix[order] = np.asarray(rows, dtype=np.float32).reshape(m, n)
    matrix[m] = np.float32(99.0)  # (never indexed)
    ids2 = np.full((m, k), -1, dtype=np.int32)
    lg2 = np.zeros((m, k), dtype=np.float32)
    counts2 = kernels.masked_top_k_rows(matrix, masks, k, ids2, lg2, threads, row_index=order)
    assert counts2.tolist() == counts.tolist()
    assert ids2.tolist() == ids.tolist()
    np.testing.assert_array_equal(lg2, lg)


def test_masked_top_k_rows_matrix_arguments_checked() -> None:
    """A matrix of rows with ``row_index``: every argument checked before the C call, with
    typed errors (an index outside the matrix would read outside its memory)."""
    matrix = np.arange(2 * 64, dtype=np.float32).reshape(2, 64)
    words = np.full(2, 0xFFFFFFFF, dtype=np.uint32)
    ids, lg = np.empty((2, 3), np.int32), np.empty((2, 3), np.float32)
    got = kernels.masked_top_k_rows(matrix, [words, words], 3, ids, lg, row_index=[1, 0])
    assert got.tolist() == [3, 3] and ids.tolist() == [[63, 62, 61], [63, 62, 61]] and lg[1].tolist() == [63, 62, 61]
    kernels.masked_top_k_rows(matrix, [words, words], 3, ids, lg)  # (default: rows 0 and 1)
    assert lg[0].tolist() == [63, 62, 61] and lg[1].tolist() == [127, 126, 125]
    for bad, err, match in (
        ([2, 0], ValueError, "out of range"),
        ([-1, 0], ValueError, "out of range"),
        ([0], TypeError, "one per mask"),
        ([0.0, 1.0], TypeError, "integers"),
        ([[0, 1]], TypeError, "1-D"),
    ):
        with pytest.raises(err, match=match):
            kernels.masked_top_k_rows(matrix, [words, words], 3, ids, lg, row_index=bad)
    with pytest.raises(ValueError, match="2 masks and 1 rows"):
        kernels.masked_top_k_rows(matrix[:1], [words, words], 3, ids, lg)
    with pytest.raises(TypeError, match="C-contiguous float32"):
        kernels.masked_top_k_rows(matrix[:, ::2], [words, words], 3, ids, lg)
    with pytest.raises(TypeError, match="C-contiguous float32"):
        kernels.masked_top_k_rows(matrix.astype(np.float64), [words, words], 3, ids, lg)
    with pytest.raises(TypeError, match="goes with a 2-D matrix"):
        kernels.masked_top_k_rows([matrix[0], matrix[1]], [words, words], 3, ids, lg, row_index=[0, 1])
    with pytest.raises(ValueError, match="need 1 <= k"):
        wide = np.empty((2, 65), np.int32), np.empty((2, 65), np.float32)
        kernels.masked_top_k_rows(matrix, [words, words], 65, *wide)


@pytest.mark.parametrize("threads", [1, 4])
def test_masked_top_k_rows_of_long_rows(threads: int) -> None:
    """Rows long enough for the kernel's thresholds: 40 distinct masks (their nonzero words
    kept one after another, the buffer grown past its first size) and wide masks (the rows'
    pass shared among threads), narrow masks shared by many rows (one scan each), a lone
    allowed token at the end of a row and in a padding word: each row equals its own
    masked_top_k."""
    n, k = 40_003, 40
    rng = np.random.default_rng(7)
    rows = [rng.standard_normal(n).astype(np.float32) for _ in range(90)]
    n_words = (n + 31) // 32

    def mask(share: float) -> npt.NDArray[np.uint32]:
        allowed = rng.random(n) < share
        words = np.zeros(n_words, dtype=np.uint32)
        words.view(np.uint8)[: (n + 7) // 8] = np.packbits(allowed, bitorder="little")
        return words

    lone = np.zeros(n_words, dtype=np.uint32)
    lone[-1] = 1 << ((n - 1) % 32)
    narrow = [mask(0.0002) for _ in range(3)]
    distinct = [mask(float(rng.choice([0.001, 0.3, 1.0]))) for _ in range(40)]
    masks = distinct + [narrow[r % 3] for r in range(45)] + [lone] * 5
    ids = np.full((90, k), -1, dtype=np.int32)
    lg = np.zeros((90, k), dtype=np.float32)
    counts = kernels.masked_top_k_rows(rows, masks, k, ids, lg, threads)
    for r in range(90):
        want_ids, want_lg = np.empty(k, np.int32), np.empty(k, np.float32)
        assert counts[r] == kernels.masked_top_k(rows[r], masks[r], k, want_ids, want_lg)
        assert ids[r].tolist() == want_ids.tolist()
        np.testing.assert_array_equal(lg[r], want_lg)
    assert counts[-5:].tolist() == [1] * 5 and ids[-1, 0] == n - 1


def test_masked_top_k_rows_checks_its_arguments() -> None:
    rows = [np.zeros(40, dtype=np.float32), np.ones(40, dtype=np.float32)]
    masks = [np.full(2, 0xFFFFFFFF, dtype=np.uint32)] * 2
    ids, lg = np.zeros((2, 3), dtype=np.int32), np.zeros((2, 3), dtype=np.float32)
    assert kernels.masked_top_k_rows(rows, masks, 3, ids, lg).tolist() == [3, 3]
    with pytest.raises(ValueError, match="2 rows and 1 masks"):
        kernels.masked_top_k_rows(rows, masks[:1], 3, ids, lg)
    with pytest.raises(ValueError, match="rows\\[1\\] has 39"):
        kernels.masked_top_k_rows([rows[0], rows[1][:39]], masks, 3, ids, lg)
    with pytest.raises(TypeError, match="rows\\[1\\]"):
        kernels.masked_top_k_rows([rows[0], rows[1].astype(np.float64)], masks, 3, ids, lg)
    with pytest.raises(ValueError, match="masks\\[0\\]"):
        kernels.masked_top_k_rows(rows, [masks[0][:1], masks[1]], 3, ids, lg)
    with pytest.raises(TypeError, match="ids must be"):
        kernels.masked_top_k_rows(rows, masks, 3, ids[:1], lg)
    with pytest.raises(TypeError, match="logits must be"):
        kernels.masked_top_k_rows(rows, masks, 3, ids, lg[:, :2])
    with pytest.raises(ValueError, match="k <= len"):
        kernels.masked_top_k_rows(rows, masks, 41, np.zeros((2, 41), np.int32), np.zeros((2, 41), np.float32))
    nan = [rows[0], rows[1].copy()]
    nan[1][5] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        kernels.masked_top_k_rows(nan, masks, 3, ids, lg)
    empty = kernels.masked_top_k_rows([], [], 3, np.zeros((0, 3), np.int32), np.zeros((0, 3), np.float32))
    assert empty.shape == (0,)


# ---------------------------------------------------------------------- RowMeasures
def _row_cases() -> st.SearchStrategy[tuple[np.ndarray, int]]:
    """A batch of rows (with ties, -inf, NaN, +inf, all -inf) and a k."""

    @st.composite
    def build(draw: st.DrawFn) -> tuple[np.ndarray, int]:
        n = draw(st.sampled_from([1, 7, 64, 200, 8191, 8192, 8192 + 37, 20000]))
        m = draw(st.integers(1, 5))
        seed = draw(st.integers(0, 2**32 - 1))
        distinct = draw(st.sampled_from([3, 50, 100000]))
        rng = np.random.default_rng(seed)
        rows = (rng.integers(0, distinct, size=(m, n)) / 7 - 5).astype(np.float32)
        for r in range(m):
            kind = draw(st.sampled_from(["plain", "plain", "ninf", "nan", "pinf", "allninf"]))
            if kind == "ninf":
                rows[r, rng.integers(0, n, size=max(n // 3, 1))] = -math.inf
            elif kind == "nan":
                rows[r, rng.integers(0, n)] = math.nan
            elif kind == "pinf":
                rows[r, rng.integers(0, n)] = math.inf
            elif kind == "allninf":
                rows[r, :] = -math.inf
        k = draw(st.integers(0, min(n, 70)))
        return rows, k

    return build()


@given(_row_cases(), st.integers(1, 4))
def test_row_measures_equal_the_reference(case: tuple[np.ndarray, int], threads: int) -> None:
    """Every row's max, status and top-k equal a float64 numpy reference exactly (top-k: a
    stable sort's first k); log-normaliser and entropy equal it to float32 exponentials'
    precision, and samplers.measure's one-row functions to float64 rounding."""
    from samplers.measure import entropy, surprisal

    rows, k = case
    m, n = rows.shape
    meas = kernels.RowMeasures(n, m + 3, k=max(k, 1), n_threads=threads)
    slots = np.arange(m)[::-1] + 2  # out of order, not from 0
    meas.compute(rows, slots, k=k)
    for i in range(m):
        s = int(slots[i])
        mx, ln, h, status, ids, lg = kernels.rows_reference(rows[i], k)
        assert meas.status[s] == status
        if status == kernels.RowStatus.NAN:
            assert math.isnan(meas.max[s]) and meas.n_top[s] == 0
            continue
        assert meas.max[s] == np.float32(mx)
        assert meas.n_top[s] == k
        np.testing.assert_array_equal(meas.top_ids[s, :k], ids)
        np.testing.assert_array_equal(meas.top_logits[s, :k], lg)
        if status != kernels.RowStatus.OK:
            assert math.isnan(meas.log_norm[s]) and math.isnan(meas.entropy[s])
            continue
        assert meas.log_norm[s] == pytest.approx(ln, rel=1e-6, abs=1e-6)
        assert meas.entropy[s] == pytest.approx(h, rel=1e-5, abs=1e-6)
        assert meas.entropy[s] == pytest.approx(entropy(rows[i]), rel=1e-12, abs=1e-12)
        t = int(np.argmax(rows[i] > -math.inf))
        assert meas.surprisal(s, float(rows[i][t])) == pytest.approx(surprisal(rows[i], t), rel=1e-12, abs=1e-12)


def test_row_measures_threads_agree_bit_for_bit() -> None:
    """Rows shared among threads give what one thread gives, bit for bit (each row is one
    thread's work, in one order)."""
    rng = np.random.default_rng(7)
    rows = (rng.standard_normal((37, 40000)) * 4).astype(np.float32)
    out = []
    for threads in (1, 2, 5):
        meas = kernels.RowMeasures(40000, 37, k=40, n_threads=threads)
        meas.compute(rows, np.arange(37), k=np.arange(37) % 41, measure=np.arange(37) % 3 != 0)
        out.append((meas.max.copy(), meas.log_norm.copy(), meas.entropy.copy(), meas.top_ids.copy()))
    for other in out[1:]:
        for a, b in zip(out[0], other, strict=True):
            np.testing.assert_array_equal(a, b)
    assert np.isnan(out[0][1][::3]).all() and not np.isnan(out[0][1][1::3]).any()


def test_row_measures_from_a_list_and_slot_helpers() -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal(9000).astype(np.float32)
    b = rng.standard_normal(9000).astype(np.float32)
    meas = kernels.RowMeasures(9000, 4, k=5)
    meas.compute([a, b], [3, 0], k=[5, 2], measure=[False, True])
    ids, lg = meas.candidates(3)
    np.testing.assert_array_equal(ids, np.argsort(-a, kind="stable")[:5])
    np.testing.assert_array_equal(lg, a[ids])
    assert len(meas.candidates(0)[0]) == 2 and len(meas.candidates(3, 2)[0]) == 2
    assert math.isnan(meas.log_norm[3]) and not math.isnan(meas.log_norm[0])
    meas.copy_slot(0, 1)
    assert meas.log_norm[1] == meas.log_norm[0] and (meas.top_ids[1] == meas.top_ids[0]).all()
    assert meas.surprisal(0, -math.inf) == math.inf
    meas.reserve(8)  # grows, keeping what is there
    assert meas.k_stride == 8 and (meas.candidates(3)[0] == ids).all()


@pytest.mark.parametrize(
    "rows, slots, k, err",
    [
        (np.zeros((2, 100), np.float64), [0, 1], 0, TypeError),
        (np.zeros((2, 99), np.float32), [0, 1], 0, TypeError),
        (np.zeros((2, 200), np.float32)[:, ::2], [0, 1], 0, TypeError),
        ([np.zeros(100, np.float32), np.zeros(101, np.float32)], [0, 1], 0, TypeError),
        (np.zeros((2, 100), np.float32), [0, 4], 0, ValueError),
        (np.zeros((2, 100), np.float32), [1, 1], 0, ValueError),
        (np.zeros((2, 100), np.float32), [0], 0, ValueError),
        (np.zeros((2, 100), np.float32), [0, 1], 9, ValueError),
        (np.zeros((2, 100), np.float32), [0, 1], [1, -1], ValueError),
    ],
)
def test_row_measures_check_arguments(rows: object, slots: object, k: object, err: type[Exception]) -> None:
    meas = kernels.RowMeasures(100, 4, k=8)
    before = meas.max.copy()
    with pytest.raises(err):
        meas.compute(rows, slots, k)  # type: ignore[arg-type]
    np.testing.assert_array_equal(meas.max, before)  # nothing was written


def test_row_pool_survives_fork() -> None:
    """The kernel's worker threads do not exist in a child made by fork(): it starts its own
    pool there instead of waiting on threads that are gone."""
    from tests.conftest import run_isolated

    res = run_isolated(
        """
        import os, numpy as np
        from llama_cffi import kernels
        rows = np.random.default_rng(0).standard_normal((8, 9000)).astype(np.float32)
        meas = kernels.RowMeasures(9000, 8, k=4, n_threads=3)
        meas.compute(rows, np.arange(8), k=4)
        want = meas.log_norm.copy()
        pid = os.fork()
        if pid == 0:
            meas.compute(rows, np.arange(8), k=4)
            os._exit(0 if (meas.log_norm == want).all() else 3)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
        """,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert "child 0" in res.stdout


def test_top_p_and_dist_rows_check_their_arguments() -> None:
    """The C steps of ``samplers.chain_batch.choose``: every array checked before the call
    (shapes, dtypes, contiguity), and a count outside ``[1, k]`` (an index C would read
    past a row with) refused by the kernel itself, with a typed error."""
    x = np.array([[0.0, -1.0, -2.0]], dtype=np.float32)
    pr = np.exp(x - x[:, :1])
    n = np.array([3], dtype=np.int32)
    kernels.top_p_rows(x, pr, n, 0.5, 1)
    assert n.tolist() == [1] and x[0, 1:].tolist() == [-math.inf, -math.inf]
    assert kernels.dist_rows(pr, np.array([3], np.int32), np.array([0.99])).tolist() == [2]
    for bad in (0, 4, -7):
        with pytest.raises(ValueError, match=r"in \[1, 3\]"):
            kernels.top_p_rows(x, pr, np.array([bad], np.int32), 0.5, 1)
        with pytest.raises(ValueError, match=r"in \[1, 3\]"):
            kernels.dist_rows(pr, np.array([bad], np.int32), np.array([0.5]))
    with pytest.raises(TypeError, match="x must be a C-contiguous 2-D float32"):
        kernels.top_p_rows(x.astype(np.float64), pr, n, 0.5, 1)
    with pytest.raises(TypeError, match="pr must be a C-contiguous"):
        kernels.top_p_rows(x, np.asfortranarray(np.repeat(pr, 2, axis=0))[:1], n, 0.5, 1)
    with pytest.raises(ValueError, match="one shape"):
        kernels.top_p_rows(x, pr[:, :2].copy(), n, 0.5, 1)
    with pytest.raises(TypeError, match="n must be a writable int32"):
        kernels.top_p_rows(x, pr, n.astype(np.int64), 0.5, 1)
    with pytest.raises(TypeError, match="u must be a float64 array of 1"):
        kernels.dist_rows(pr, n, np.array([0.5, 0.5]))
