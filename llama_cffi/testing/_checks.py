"""Checks of :mod:`llama_cffi.testing` that need no hypothesis: logits against a fresh
decode (:func:`decode_equivalence`), and :func:`expect_raises` for the state machines."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .._args import expect, expect_array, expect_number, expect_str, type_error

if TYPE_CHECKING:
    from ..model import Model

__all__ = ["decode_equivalence", "expect_raises"]


def decode_equivalence(
    model: Model,
    tokens: Sequence[int] | npt.NDArray[np.integer[Any]],
    logits: npt.ArrayLike,
    *,
    rtol: float = 2e-3,
    atol: float = 2e-3,
    **context_params: Any,
) -> float:
    """Check that ``logits`` -- the next-token logits after ``tokens``, however they were
    obtained (a forked branch, one sequence of a batch, a restored state, a shifted
    cache) -- equal what a fresh context gives when it decodes ``tokens`` one at a time
    (``context_params`` for it: ``n_ctx``, ``type_k``...).

    Equal means within ``rtol``/``atol`` (``numpy.allclose``): another batch shape or cell
    order makes llama.cpp's kernels sum in another order. The defaults suit F32 weights
    with an f16 KV cache; quantized weights differ by up to ~1.5 logits between batch
    shapes (with CPU repacking from 3 or 4 rows, K-quants from 8 rows, without flash
    attention from 2; the docs' "Tolerances" in the branches guide lists when rows are
    bit-exact). Returns
    the largest absolute difference; raises :class:`AssertionError` naming it, the token
    where it is, and the tolerance, when they are not equal."""
    from ..model import Model

    expect("model", model, Model, "a llama_cffi.Model")
    toks = [int(t) for t in expect_array("tokens", tokens, "a sequence of token ids", "iu").reshape(-1)]
    if not toks:
        raise ValueError("decode_equivalence needs at least one token")
    got = np.asarray(expect_array("logits", logits, "an array of logits (numbers)", "biuf"), dtype=np.float32).reshape(
        -1
    )
    rtol, atol = expect_number("rtol", rtol), expect_number("atol", atol)
    params = {"n_ctx": max(256, len(toks) + 1), **context_params}
    with model.context(**params) as ctx:
        row = None
        for pos, t in enumerate(toks):
            row = ctx.decode_single(t, pos=pos)
        assert row is not None
        want = np.array(row, dtype=np.float32, copy=True)
    if got.shape != want.shape:
        raise AssertionError(f"logits have shape {got.shape}; the model's rows have {want.shape}")
    diff = np.abs(got.astype(np.float64) - want)
    worst = int(np.argmax(diff))
    if not np.allclose(got, want, rtol=rtol, atol=atol):
        raise AssertionError(
            f"the logits differ from a fresh one-token-at-a-time decode by up to {diff[worst]:.3g} "
            f"(token {worst}: {got[worst]:.6g} against {want[worst]:.6g}; rtol={rtol:g}, atol={atol:g})"
        )
    return float(diff[worst])


# ---------------------------------------------------------------------- state machines
def expect_raises(
    exc: type[BaseException] | tuple[type[BaseException], ...], match: str | None = None
) -> AbstractContextManager[None]:
    """Assert that the block raises ``exc`` (whose message matches the regular expression
    ``match``, searched as ``re.search`` does): ``pytest.raises`` without pytest, for the
    state machines, which also run under ``unittest``. Raises :class:`AssertionError`
    when nothing is raised or the message does not match; any other exception goes
    through unchanged."""
    classes = exc if isinstance(exc, tuple) else (exc,)
    if not classes or not all(isinstance(c, type) and issubclass(c, BaseException) for c in classes):
        raise type_error("exc", "an exception class or a tuple of them", exc)
    if match is not None:
        expect_str("match", match, "a regular expression (a str) or None")
    return _expect_raises(exc, match)


@contextmanager
def _expect_raises(exc: type[BaseException] | tuple[type[BaseException], ...], match: str | None) -> Iterator[None]:
    try:
        yield
    except exc as e:
        if match is not None and not re.search(match, str(e)):
            raise AssertionError(f"{type(e).__name__}({str(e)!r}) does not match {match!r}") from e
        return
    raise AssertionError(f"expected {_names(exc)}, nothing was raised")


def _names(exc: type[BaseException] | tuple[type[BaseException], ...]) -> str:
    return " or ".join(e.__name__ for e in (exc if isinstance(exc, tuple) else (exc,)))
