"""llama_cffi.kernels: ggml's soft_max kernel against a float64 reference, and its argument checks."""

from __future__ import annotations

import math

import numpy as np
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
