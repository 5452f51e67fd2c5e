"""Information measures of a next-token distribution: surprisal, entropy, perplexity.

Every measure is of the distribution ``softmax(logits)`` over one row of float32
logits, given either as a 1-D array-like (a numpy array, or a
:class:`llama_cffi.OutputView`) or as a :class:`llama_cffi.Context` (then row ``idx``
of the last decode, read through ``ctx.logits(idx)`` without copying).

Units
    Values are in **nats** (natural log) unless ``base="bits"`` is passed
    (``bits = nats / ln 2``). :class:`PerplexityTracker` stores nats.

Numerics
    The computation is llama.cpp's (``llama-perplexity``'s ``log_softmax``): subtract
    the row maximum, exponentiate in float32, accumulate the normaliser in float64;
    the exponentials run in ggml's vectorised soft_max kernel
    (:mod:`llama_cffi.kernels`, GIL released). The float32 temporaries live in a
    per-thread scratch buffer that is reused, so a warm call allocates nothing of
    vocabulary size. Inputs that are not float32 (or not contiguous) are converted
    first (one temporary). Logits of ``-inf`` are allowed (a token with probability
    zero: its surprisal is ``inf``, it adds nothing to the entropy); NaN logits,
    ``+inf`` logits and rows that are entirely ``-inf`` raise :class:`ValueError`.

Ownership
    Nothing here keeps a reference to the logits after returning; a Context's output
    view is only read during the call (so the next decode is never blocked).
"""

from __future__ import annotations

import math
import threading
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from llama_cffi import Context, InvalidTokenError
from llama_cffi._args import expect_int, type_error
from llama_cffi.kernels import softmax_dot, softmax_sum

__all__ = [
    "Base",
    "PerplexityTracker",
    "TokenOutOfRangeError",
    "entropy",
    "surprisal",
]

Base = Literal["nats", "bits"]

_LN2 = math.log(2.0)
#: ``math.exp`` raises OverflowError above this; perplexities beyond are reported as inf.
_EXP_MAX = math.log(np.finfo(np.float64).max)


class TokenOutOfRangeError(InvalidTokenError, IndexError):
    """The token id is not an index of the logits row (``0 <= token < len(logits)``).

    Both a :class:`ValueError` (via :class:`llama_cffi.InvalidTokenError`) and an
    :class:`IndexError`."""


# ---------------------------------------------------------------------- scratch buffers
class _Scratch(threading.local):
    """Per-thread float32 work buffers, grown on demand and never shrunk (each thread
    keeps at most two vocabulary-sized buffers alive for its lifetime)."""

    def __init__(self) -> None:
        self.a: npt.NDArray[np.float32] = np.empty(0, dtype=np.float32)
        self.b: npt.NDArray[np.float32] = np.empty(0, dtype=np.float32)


_scratch = _Scratch()


def _buffers(n: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    s = _scratch
    if s.a.shape[0] < n:
        s.a = np.empty(n, dtype=np.float32)
        s.b = np.empty(n, dtype=np.float32)
    return s.a[:n], s.b[:n]


# ---------------------------------------------------------------------- argument handling
def _check_base(base: object, name: str = "base") -> float:
    """The divisor that turns nats into ``base``."""
    if base == "nats":
        return 1.0
    if base == "bits":
        return _LN2
    if not isinstance(base, str):
        raise type_error(name, "'nats' or 'bits'", base)
    raise ValueError(f"{name} must be 'nats' or 'bits', not {base!r}")


def _row(logits_or_ctx: Any, idx: int, name: str = "logits_or_ctx") -> npt.NDArray[np.float32]:
    """The logits row as a float32 1-D ndarray (zero-copy for float32 inputs and contexts)."""
    if isinstance(logits_or_ctx, Context):
        arr = np.asarray(logits_or_ctx.logits(idx))
    else:
        arr = np.asarray(logits_or_ctx)
        if arr.dtype != np.float32:
            if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
                what = f"a float array of logits or a llama_cffi.Context (dtype {arr.dtype})"
                raise type_error(name, what, logits_or_ctx)
            arr = arr.astype(np.float32)
    if arr.ndim != 1:
        raise ValueError(f"logits must be 1-D (one row of n_vocab values), got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ValueError("logits are empty")
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)  # a strided slice: the kernels read contiguous rows
    return arr


def _check_token(token: object, n: int) -> int:
    if isinstance(token, (bool, np.bool_)) or not isinstance(token, (int, np.integer)):
        raise TypeError(f"token must be an int, not {type(token).__name__}")
    t = int(token)
    if not 0 <= t < n:
        raise TokenOutOfRangeError(f"token {t} is out of range [0, {n}) of the logits")
    return t


def _values_problem(m: float) -> ValueError | None:
    """What is wrong with a row whose maximum is ``m`` (NaN propagates through max)."""
    if math.isnan(m):
        return ValueError("logits contain NaN")
    if m == math.inf:
        return ValueError("logits contain +inf (the distribution is undefined)")
    if m == -math.inf:
        return ValueError("every logit is -inf (no token has any probability)")
    return None


def _checked_row(
    logits_or_ctx: Any, idx: int, token: object, name: str = "logits_or_ctx"
) -> tuple[npt.NDArray[np.float32], np.float32, int]:
    """``(row, max(row), token)`` after every check. Errors found once the row is fetched
    are raised after dropping it, so that no traceback frame keeps a raw array into a
    Context's output buffer alive (which would block llama.cpp from reallocating it)."""
    arr = _row(logits_or_ctx, idx, name)
    err: Exception | None = None
    t = -1
    if token is not None:
        try:
            t = _check_token(token, arr.shape[0])
        except (TypeError, TokenOutOfRangeError) as exc:
            err = exc
    m: np.float32 = arr.max()
    if err is None:
        err = _values_problem(float(m))
    if err is not None:
        del arr
        raise err
    return arr, m, t


# ---------------------------------------------------------------------- kernels
def log_normaliser(arr: npt.NDArray[np.float32], m: np.float32, scratch: npt.NDArray[np.float32]) -> float:
    """``sum(exp(arr - m))`` for ``m = max(arr)``, computed as llama.cpp's ``SOFT_MAX``
    op does (ggml's vectorised kernel, :func:`llama_cffi.kernels.softmax_sum`): the
    shift and ``exp`` in float32, written into ``scratch`` (a float32 array of
    ``arr``'s length, overwritten), the sum in float64. ``m + log(result)`` is the
    log-partition function. The caller has checked ``arr`` (no NaN, finite max)."""
    return softmax_sum(arr, float(m), scratch)


def _nats(arr: npt.NDArray[np.float32], token: int, m: np.float32) -> float:
    scratch, _ = _buffers(arr.shape[0])
    s = log_normaliser(arr, m, scratch)
    lt = float(arr[token])
    if lt == -math.inf:
        return math.inf
    # -log p = (m - l_t) + log s, both terms >= 0; the difference of two float32s is exact in float64
    return (float(m) - lt) + math.log(s)


def row_surprisal(row: npt.NDArray[np.float32], token: int) -> float:
    """``-log softmax(row)[token]`` in nats, for callers that own a checked row (the
    chain's and branches' per-token fast path): ``row`` is a 1-D float32 ndarray,
    ``token`` a valid index. ``inf`` when the token (or the whole row) is ``-inf``;
    NaN in, NaN out. Uses the per-thread scratch buffer: allocates nothing when warm."""
    if not row.flags.c_contiguous:
        row = np.ascontiguousarray(row)
    m = float(row.max())
    lt = float(row[token])
    if m == -math.inf or lt == -math.inf:
        return math.inf
    scratch, _ = _buffers(row.shape[0])
    return (m - lt) + math.log(softmax_sum(row, m, scratch))


# ---------------------------------------------------------------------- public measures
def surprisal(logits_or_ctx: Any, token: int, *, idx: int = -1, base: Base = "nats") -> float:
    """``-log p(token)`` under ``softmax(logits)``, in nats (or bits with ``base="bits"``).

    ``logits_or_ctx``: a 1-D float array-like (numpy array, :class:`llama_cffi.OutputView`)
    or a :class:`llama_cffi.Context`, whose output ``idx`` of the last decode is used
    (``ctx.logits(idx)`` semantics: ``-1`` is the last output; not copied). ``idx`` is
    ignored for arrays.

    Returns a float ``>= 0``; ``inf`` when the token's logit is ``-inf``. Raises
    :class:`TokenOutOfRangeError` for a token outside ``[0, len(logits))``,
    :class:`ValueError` for NaN/``+inf`` logits, an all ``-inf`` row, a bad ``base``.
    """
    if type(idx) is not int:
        idx = expect_int("idx", idx)
    div = _check_base(base)
    arr, m, t = _checked_row(logits_or_ctx, idx, token)
    return _nats(arr, t, m) / div


def entropy(logits_or_ctx: Any, *, idx: int = -1, base: Base = "nats") -> float:
    """Shannon entropy ``-sum p log p`` of ``softmax(logits)``, in nats (or bits).

    Same inputs and errors as :func:`surprisal`. Tokens with probability zero (logit
    ``-inf``, or ``exp`` underflowing) contribute ``0`` (``0 log 0 = 0``). The result is
    clamped to ``[0, log n]`` (its mathematical range) against rounding.
    """
    if type(idx) is not int:
        idx = expect_int("idx", idx)
    div = _check_base(base)
    arr, m, _ = _checked_row(logits_or_ctx, idx, None)
    n = arr.shape[0]
    e, _ = _buffers(n)
    s = softmax_sum(arr, float(m), e)
    # H = log s - sum(e_i (x_i - m)) / s; tokens with e_i = 0 (-inf logits) add nothing.
    h = math.log(s) - softmax_dot(e, arr, float(m)) / s
    return min(max(h, 0.0), math.log(n)) / div


# ---------------------------------------------------------------------- tracking
def _safe_exp(x: float) -> float:
    return math.exp(x) if x < _EXP_MAX else math.inf


class PerplexityTracker:
    """Running surprisal statistics of a generated (or scored) token sequence.

    Two streams, both in nats:

    * **model-level**: the surprisal of each token under the model's full distribution
      (``softmax`` of the raw logits); ``perplexity = exp(mean surprisal)``.
    * **sampling-level** (optional, per token): the surprisal under the distribution the
      sampler actually drew from (after temperature, top-k/p, grammar... filtering);
      ``sampling_perplexity`` measures how surprising the choices were to the sampler.

    Statistics are float64 sums (count, sum, sum of squares) like ``llama-perplexity``,
    so :attr:`stderr` is its ``+/-`` figure. Empty streams report ``math.nan`` for
    means, perplexities and errors (never raise). Not thread-safe: one tracker per
    sequence; :meth:`clone` makes an independent copy (e.g. when forking a branch).
    """

    __slots__ = ("_n", "_s", "_s2", "_sn", "_ss", "_ss2")

    def __init__(self) -> None:
        self._n = 0
        self._s = 0.0
        self._s2 = 0.0
        self._sn = 0
        self._ss = 0.0
        self._ss2 = 0.0

    # -- feeding
    @staticmethod
    def _check(name: str, v: object) -> float:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeError(f"{name} must be a float (nats), not {type(v).__name__}")
        f = float(v)
        if math.isnan(f) or f < 0.0:
            raise ValueError(f"{name} must be a surprisal in nats (>= 0, not NaN), got {f!r}")
        return f

    def add(self, surprisal: float, sampling_surprisal: float | None = None) -> None:
        """Record one token: its model-level surprisal and, optionally, its sampling-level
        surprisal (both nats, ``>= 0``; ``inf`` is allowed and makes the perplexity inf)."""
        x = self._check("surprisal", surprisal)
        y = None if sampling_surprisal is None else self._check("sampling_surprisal", sampling_surprisal)
        self._record(x, y)

    def _add_nats(self, x: float, y: float | None) -> None:
        """:meth:`add` for callers whose values are floats already (a branch store's step):
        the same refusals, a few microseconds fewer."""
        if not x >= 0.0 or (y is not None and not y >= 0.0):  # NaN or negative: add() says which
            self.add(x, y)
            return
        self._record(x, y)

    def _record(self, x: float, y: float | None) -> None:
        """Add checked values to the running sums."""
        self._n += 1
        self._s += x
        self._s2 += x * x
        if y is not None:
            self._sn += 1
            self._ss += y
            self._ss2 += y * y

    def add_token(self, logits: Any, token: int, sampling_logits: Any = None) -> float:
        """Compute and record the surprisal of ``token`` under ``logits`` (and under
        ``sampling_logits``, the sampler's filtered logits, when given). Returns the
        model-level surprisal in nats. Inputs as for :func:`surprisal` (arrays, views, or
        a Context's last output)."""
        arr, m, t = _checked_row(logits, -1, token, "logits")
        x = _nats(arr, t, m)
        del arr
        y = None
        if sampling_logits is not None:
            arr, m, t = _checked_row(sampling_logits, -1, token, "sampling_logits")
            y = _nats(arr, t, m)
            del arr
        self.add(x, y)
        return x

    def reset(self) -> None:
        """Forget every recorded token."""
        self._n = self._sn = 0
        self._s = self._s2 = self._ss = self._ss2 = 0.0

    def clone(self) -> PerplexityTracker:
        """An independent copy with the same statistics."""
        c = PerplexityTracker.__new__(PerplexityTracker)
        c._n, c._s, c._s2 = self._n, self._s, self._s2
        c._sn, c._ss, c._ss2 = self._sn, self._ss, self._ss2
        return c

    # -- model level
    @property
    def count(self) -> int:
        """Tokens recorded."""
        return self._n

    @property
    def total_surprisal(self) -> float:
        """Sum of surprisals (nats): the negative log-likelihood of the sequence."""
        return self._s

    @property
    def mean_surprisal(self) -> float:
        """Mean surprisal per token (nats; NaN when empty). In bits: divide by ``ln 2``."""
        return self._s / self._n if self._n else math.nan

    @property
    def perplexity(self) -> float:
        """``exp(mean surprisal)`` (NaN when empty, inf when it overflows)."""
        return _safe_exp(self._s / self._n) if self._n else math.nan

    @property
    def stderr(self) -> float:
        """Standard error of :attr:`perplexity` as ``llama-perplexity`` reports it:
        ``ppl * sqrt(var / (count - 1))`` with ``var = mean(x^2) - mean(x)^2`` (nats^2).
        NaN with fewer than two tokens; 0 when every surprisal is equal."""
        return _stderr(self._n, self._s, self._s2)

    # -- sampling level
    @property
    def sampling_count(self) -> int:
        """Tokens recorded with a sampling-level surprisal."""
        return self._sn

    @property
    def sampling_mean_surprisal(self) -> float:
        """Mean sampling-level surprisal (nats; NaN when none was recorded)."""
        return self._ss / self._sn if self._sn else math.nan

    @property
    def sampling_perplexity(self) -> float:
        """``exp`` of the mean sampling-level surprisal: the perplexity of the choices
        under the filtered distributions the sampler drew from (NaN when none)."""
        return _safe_exp(self._ss / self._sn) if self._sn else math.nan

    @property
    def sampling_stderr(self) -> float:
        """:attr:`stderr` for the sampling-level stream."""
        return _stderr(self._sn, self._ss, self._ss2)

    def __repr__(self) -> str:
        return (
            f"<PerplexityTracker count={self._n} perplexity={self.perplexity:.4f} "
            f"sampling_count={self._sn} sampling_perplexity={self.sampling_perplexity:.4f}>"
        )


def _stderr(n: int, s: float, s2: float) -> float:
    if n < 2:
        return math.nan
    mean = s / n
    if math.isinf(mean):
        return math.nan
    var = s2 / n - mean * mean
    return _safe_exp(mean) * math.sqrt(max(var, 0.0) / (n - 1))
