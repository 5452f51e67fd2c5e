"""KL divergence between two models' token distributions, as llama.cpp's
``llama-perplexity --kl-divergence-base FILE`` / ``--kl-divergence`` computes it.

Two steps (``tools/perplexity/perplexity.cpp`` of the pinned commit):

1. :func:`write_kl_base` (``llama-perplexity -f TEXT --kl-divergence-base FILE``): a
   perplexity run (:mod:`samplers.perplexity`'s chunking and decoding) over the *base*
   model that also stores, for every scored position, the base model's log-probabilities
   over the whole vocabulary, quantised to 16 bits;
2. :func:`kl_divergence` (``llama-perplexity --kl-divergence --kl-divergence-base FILE``):
   the same tokens through another model (or the same model with other settings), compared
   position by position with the stored distributions: :class:`KLDivergenceResult`.

File layout (native byte order, little-endian on every platform llama.cpp supports;
interchangeable with ``llama-perplexity``'s, byte for byte)::

    char     magic[8]      "_logits_"
    uint32   n_ctx         tokens per chunk
    int32    n_vocab
    int32    n_chunk
    int32    tokens[n_chunk * n_ctx]      the text's tokens (BOS first as tokenized; the
                                          BOS that replaces each chunk's first token is
                                          not stored)
    then for each chunk, for each scored position p = n_ctx/2 .. n_ctx-2 (n_ctx-1-n_ctx/2 rows):
    float32  scale                        (max - min) / 65535, min = max(min logit, max - 16)
    float32  min_log_prob                 min - max - log(sum(exp(logit - max)))
    uint16   q[n_vocab]                   round((logit - min) / scale), 0 where logit <= min
    uint16   pad[n_vocab % 2]             0 (each row is 2*ceil(n_vocab/2) + 4 uint16)

so ``log p_base(token) = scale * q[token] + min_log_prob`` (a log-probability floored at
``max - 16`` nats below the top logit). The row at position ``p`` predicts the token at
``p + 1``. A run of 20 chunks at ``n_ctx = 512`` over a 262,144-token vocabulary writes
``20 * 255 * 524,296`` bytes, about 2.7 GB.

Arithmetic follows ``perplexity.cpp``'s float/double choices operation by operation
(float32 where it uses ``float``, float64 where it uses ``double``, the C library's
``expf`` and ``log``, additions in index order, no fused multiply-adds: its compiler has
none without ``-march``). The per-row work runs in C (:func:`llama_cffi.kernels.kl_base_rows`
and :func:`~llama_cffi.kernels.kl_divergence_rows`, on ``hardware_concurrency`` threads as
the tool's); the numpy functions of this module (:func:`_quantise_row`, :func:`_kl_row`)
are their tested reference: glibc's ``expf`` is not correctly rounded (about one float in
10,000 differs from the correctly rounded value), ``samplers._libm.expf`` reproduces it
(float64 ``exp``, rounded, with the C library's ``expf`` called for the values near a
rounding boundary), and the one costly quantity, ``log_sum_exp = (float) log(sum of
262,144 expf values added in index order)``, is taken from a cheaper float64 estimate
when rigorous error bounds prove it rounds to the same float32, and computed the C way
otherwise (:func:`_lse`). With the same logits the base file is therefore byte-identical, and the
statistics equal a single-threaded ``llama-perplexity``'s. Two differences remain, both
in float64's last bits and invisible at the printed precision: ``llama-perplexity`` adds
its rows up on ``hardware_concurrency`` threads, each with its own partial sums (the
order varies from run to run), where this module adds them in position order; and its perplexity sums are added
once per chunk, this module's once per decode. Logits equal to ``llama-perplexity``'s
need the same context layout (:func:`kl_plan`) and settings (``context_params``).

Lifetimes: :func:`write_kl_base` writes a temporary file beside ``path`` and renames it
over ``path`` when the run succeeds (a failed run leaves no file); :func:`read_kl_base`
reads the header and the tokens and closes the file; :func:`kl_divergence` reads the rows
read-only for the run only.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from llama_cffi import Context, Model, ParamError, default_model_path
from llama_cffi._args import (
    expect_callable,
    expect_int,
    expect_mapping,
    expect_namespace,
    expect_number,
    expect_parser,
    expect_path,
    type_error,
)
from llama_cffi.kernels import kl_base_rows, kl_divergence_rows

from ._libm import c_expf, expf
from .perplexity import (
    Accumulator,
    PerplexityError,
    PerplexityResult,
    Plan,
    ProgressCallback,
    Scorer,
    _check_context,
    _int_param,
    _read_text,
    groups,
    plan,
    prepare,
)

__all__ = [
    "MAGIC",
    "TABLE_HEADER",
    "KLBase",
    "KLBaseFileError",
    "KLBaseMismatchError",
    "KLChunk",
    "KLDivergenceError",
    "KLDivergenceResult",
    "KLProgressCallback",
    "add_kl_arguments",
    "kl_divergence",
    "kl_plan",
    "read_kl_base",
    "run_kl_cli",
    "write_kl_base",
]

#: The first 8 bytes of a base file.
MAGIC = b"_logits_"
_HEADER = len(MAGIC) + 12  # magic, n_ctx, n_vocab, n_chunk

_F = np.float32
_F16 = _F(16.0)
_F65535 = _F(65535.0)
_ROUND = _F(12582912.0)  # 1.5 * 2**23: nearest_int()'s rounding constant


class KLDivergenceError(PerplexityError):
    """KL divergence cannot be computed with these inputs (a :class:`llama_cffi.ParamError`,
    hence a :class:`ValueError`); the message says why."""


class KLBaseFileError(KLDivergenceError):
    """The file is not a base file ``llama-perplexity --kl-divergence`` could read: bad
    magic, impossible header, or shorter than its header says."""


class KLBaseMismatchError(KLDivergenceError):
    """The base file does not fit the model or the run: another vocabulary size, or a
    chunk longer than the context's per-sequence size."""


# per-thread work rows, reused (a 262,144-float64 row is 2 MiB)
_local = threading.local()


def _work(n: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float64]]:
    w = getattr(_local, "w", None)
    if w is None or w[0].shape[0] != n:
        w = (np.empty(n, np.float32), np.empty(n, np.float64))
        _local.w = w
    return w


def _sum_exp(row: npt.NDArray[np.float32], m: np.float32) -> float:
    """``sum(expf(row - m))`` in float64, added in index order (``double sum_exp``)."""
    e, acc = _work(row.shape[0])
    np.subtract(row, m, out=e)
    expf(e, out=e)
    np.cumsum(e, dtype=np.float64, out=acc)
    return float(acc[-1])


_CUT = _F(-16.0)  # terms below exp(-16) are summed from numpy's float32 exp (see _lse)
_U = 2.0**-53  # float64 unit roundoff
_EXP32_REL = 4.0 * 2.0**-23  # numpy's float32 exp (2.52 ulp, documented) vs the C library's (< 1 ulp): < 4 ulp


def _weights(n: int) -> npt.NDArray[np.float32]:
    """``n - i`` for ``i < n``, float32 (exact below 2**24), cached per thread."""
    w = getattr(_local, "weights", None)
    if w is None or w.shape[0] != n:
        w = np.arange(n, 0, -1, dtype=np.float32)
        _local.weights = w
    out: npt.NDArray[np.float32] = w
    return out


def _lse(row: npt.NDArray[np.float32], m: np.float32) -> np.float32:
    """``(float) log(sum_exp)`` of ``perplexity.cpp``'s ``log_softmax``: ``m`` is the row's
    (finite) maximum.

    Only this float32 value is used, so a float64 estimate of the sum is enough when it
    provably rounds the same: the terms ``>= exp(-16)`` (a few thousand of 262,144) are the
    C library's values (:func:`expf`), the rest numpy's float32 ``exp`` (less than 4 ulp
    from them); with ``S`` the estimate, the C sum lies within ``4 ulp * (small terms) +
    u * (sum of the C loop's partial sums) + 64 u S`` (rigorous bounds of each rounding,
    ``u = 2**-53``). When ``log`` of both ends of that interval rounds to the same
    float32, that is the C value (``log`` is monotonic; its own error, under one float64
    ulp, is allowed for); otherwise the sum is computed exactly as the C loop does
    (:func:`_sum_exp`): rows whose log-sum is near 0 (a confident prediction: the float32
    grid is fine there) and rows that fall near a rounding boundary."""
    n = row.shape[0]
    x, _ = _work(n)
    np.subtract(row, m, out=x)
    big = np.flatnonzero(x > _CUT)
    eb = expf(x[big])
    np.exp(x, out=x)  # numpy's float32 exp: within 4 ulp of expf
    small = float(np.sum(x, dtype=np.float64)) - float(np.sum(x[big], dtype=np.float64))
    total = small + float(np.sum(eb, dtype=np.float64))
    # The C loop's rounding is at most u * (the sum of its partial sums) = u * sum_i e_i (n - i)
    # (float32 dot: within n * 2**-24 < 2% of it); ours (pairwise sums, the subtraction)
    # within 64 u S; numpy's small terms within 4 ulp each.
    partials = float(np.dot(x, _weights(n)))
    err = _EXP32_REL * small * 1.001 + _U * (partials * 1.05 + 64.0 * total) + n * 2.0**-140  # 2**-140: subnormals
    lo, hi = total - err, total + err
    if lo > 0.0:
        llo, lhi = math.log(lo), math.log(hi)
        flo: np.float32 = _F(llo - 4.0 * _U * abs(llo))
        fhi: np.float32 = _F(lhi + 4.0 * _U * abs(lhi))
        if flo == fhi:
            return flo
    r: np.float32 = _F(math.log(_sum_exp(row, m)))
    return r


def _quantise_row(row: npt.NDArray[np.float32], tok: int, out: npt.NDArray[np.uint16]) -> float:
    """``log_softmax(n_vocab, logits, log_prob, tok)`` of ``perplexity.cpp``: writes one
    row of the base file into ``out`` (``nv`` uint16: header, ``q``, padding untouched)
    and returns ``-log p(tok)`` in nats (computed in float32 there)."""
    n = row.shape[0]
    mx = row.max()
    mn = row.min()
    if not math.isfinite(mx):  # NaN anywhere, or +inf: the caller reports it
        return math.nan
    mn = max(mn, _F(mx - _F16))
    lse = _lse(row, mx)
    min_lp = _F(_F(mn - mx) - lse)
    scale = _F(_F(mx - mn) / _F65535)
    out[:4].view(np.float32)[:2] = (scale, min_lp)
    q = out[4 : 4 + n]
    if scale:
        inv = _F(_F(1.0) / scale)
        t, _ = _work(n)
        with np.errstate(invalid="ignore", over="ignore"):
            np.subtract(row, mn, out=t)
            np.multiply(t, inv, out=t)
            np.add(t, _ROUND, out=t)
        qi = (t.view(np.int32) & 0x007FFFFF) - 0x00400000
        qi[~(row > mn)] = 0
        q[:] = qi.astype(np.uint16)  # modulo 2**16, as the C assignment
    else:
        q[:] = 0
    return float(_F(_F(mx + lse) - row[tok]))


@dataclass
class _Row:
    """One scored position of a :func:`kl_divergence` run (the values ``log_softmax(...,
    kld)`` of ``perplexity.cpp`` adds up)."""

    nll: np.float32
    nll_base: np.float32
    kld: float
    same_top: bool
    p_diff: np.float32


def _kl_row(row: npt.NDArray[np.float32], base: npt.NDArray[np.uint16], tok: int) -> _Row:
    n = row.shape[0]
    imax = int(np.argmax(row))
    mx = row[imax]
    if not math.isfinite(mx):
        raise KLDivergenceError("the model produced NaN or infinite logits")
    lse = _lse(row, mx)
    scale, min_lp = base[:4].view(np.float32)[:2]
    q = base[4 : 4 + n]
    nll = _F(_F(mx + lse) - row[tok])
    nll_base = -_F(_F(scale * _F(q[tok])) + min_lp)
    mx2 = _F(mx + lse)
    t, _ = _work(n)
    np.multiply(q, scale, out=t, dtype=np.float32)
    np.add(t, min_lp, out=t)
    imax_base = int(np.argmax(t))
    idx = np.flatnonzero(t > -_F16)
    plb = t[idx]
    with np.errstate(invalid="ignore", over="ignore"):
        terms = expf(plb) * ((plb - row[idx]) + mx2)
    kld = float(np.cumsum(terms, dtype=np.float64)[-1]) if len(terms) else 0.0
    p_base = _expf1(-nll_base)
    p = _expf1(-nll)
    return _Row(nll, nll_base, kld, imax == imax_base, _F(p - p_base))


def _expf1(x: np.float32) -> np.float32:
    return c_expf(float(x))


def _drop_cached(fh: IO[bytes], offset: int = 0, length: int = 0, flush: bool = False) -> None:
    """Ask the kernel to drop ``length`` bytes of the file at ``offset`` (0, 0: all of it)
    from the page cache, once written or read: a base file is gigabytes streamed once
    (2.7 GB for 20 chunks of a 262,144-token vocabulary, 75 GB for wikitext-2), and leaving
    it cached evicts what the machine had cached, and on small VMs costs more kernel time
    than the writing itself (measured: 6.4 s against 0.8 s of system CPU for 1.6 GB).
    ``flush`` first hands Python's buffer to the kernel (pages still being written back stay
    cached until a later call). Where ``posix_fadvise`` is missing (macOS, Windows), or
    the file system refuses it, nothing happens: the advice is only advice."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:  # pragma: no cover - not Linux
        return
    if flush:
        fh.flush()  # a write error is the caller's (raised)
    try:
        advise(fh.fileno(), offset, length, os.POSIX_FADV_DONTNEED)
    except (OSError, io.UnsupportedOperation, ValueError):
        pass


def _workers() -> int:
    """Threads for the per-row work: ``std::thread::hardware_concurrency()`` as
    ``llama-perplexity`` uses."""
    return max(1, os.cpu_count() or 1)


# ---------------------------------------------------------------------- base file
@dataclass(frozen=True)
class KLBase:
    """A base file's header, as :func:`read_kl_base` read it.

    ``path``: the file. ``n_ctx``: tokens per chunk. ``n_vocab``: the base model's
    vocabulary size (values per row). ``n_chunk``: chunks stored. ``tokens``: the
    ``n_chunk * n_ctx`` evaluated tokens (int32, read-only). The rows stay in the file;
    :func:`kl_divergence` maps them while it runs."""

    path: Path
    n_ctx: int
    n_vocab: int
    n_chunk: int
    tokens: npt.NDArray[np.int32] = field(repr=False, compare=False)

    @property
    def row_values(self) -> int:
        """uint16 values per row: ``2 * ceil(n_vocab / 2) + 4`` (8 bytes of header)."""
        return 2 * ((self.n_vocab + 1) // 2) + 4

    @property
    def rows_per_chunk(self) -> int:
        """Scored positions per chunk: ``n_ctx - 1 - n_ctx // 2``."""
        return self.n_ctx - 1 - self.n_ctx // 2

    @property
    def rows_offset(self) -> int:
        """Byte offset of the first row."""
        return _HEADER + 4 * self.n_chunk * self.n_ctx

    @property
    def size(self) -> int:
        """The file's size in bytes, as its header implies."""
        return self.rows_offset + 2 * self.n_chunk * self.rows_per_chunk * self.row_values

    def rows(self) -> npt.NDArray[np.uint16]:
        """The rows, ``(n_chunk, rows_per_chunk, row_values)`` uint16, mapped read-only
        (valid while the returned array lives). Column 0-3 hold the float32 ``scale``
        and ``min_log_prob`` (``rows[..., :4].view(np.float32)``)."""
        return np.memmap(
            self.path,
            dtype=np.uint16,
            mode="r",
            offset=self.rows_offset,
            shape=(self.n_chunk, self.rows_per_chunk, self.row_values),
        )

    def log_probs(self, chunk: int, position: int) -> npt.NDArray[np.float32]:
        """The stored log-probabilities (nats, float32, ``n_vocab``) of chunk ``chunk``
        at position ``position`` (``n_ctx // 2 <= position <= n_ctx - 2``), as
        ``perplexity.cpp`` decodes them: ``scale * q + min_log_prob``."""
        first = self.n_ctx // 2
        chunk, position = expect_int("chunk", chunk), expect_int("position", position)
        if not (0 <= chunk < self.n_chunk and first <= position <= self.n_ctx - 2):
            raise ParamError(f"no row for chunk {chunk}, position {position}")
        row = np.array(self.rows()[chunk, position - first])
        scale, min_lp = row[:4].view(np.float32)[:2]
        lp: npt.NDArray[np.float32] = np.add(np.multiply(row[4 : 4 + self.n_vocab], scale, dtype=np.float32), min_lp)
        return lp


def read_kl_base(path: str | os.PathLike[str]) -> KLBase:
    """Read a base file's header and tokens (:class:`KLBase`); the rows are checked to be
    all there (the file is at least as long as the header implies; bytes after them are
    ignored, as ``llama-perplexity`` ignores them).

    Raises :class:`KLBaseFileError` (bad magic, impossible sizes, truncated file) and
    ``OSError`` for a file that cannot be read."""
    p = Path(expect_path("path", path))
    with open(p, "rb") as fh:
        head = fh.read(_HEADER)
        if len(head) < len(MAGIC) or head[: len(MAGIC)] != MAGIC:
            raise KLBaseFileError(f"{p} does not look like a file containing log-probabilities (no {MAGIC!r} magic)")
        if len(head) < _HEADER:
            raise KLBaseFileError(f"{p}: truncated header ({len(head)} of {_HEADER} bytes)")
        (n_ctx,) = np.frombuffer(head, np.uint32, 1, 8)
        n_vocab, n_chunk = np.frombuffer(head, np.int32, 2, 12)
        if n_ctx < 3 or n_vocab < 1 or n_chunk < 1:
            raise KLBaseFileError(f"{p}: impossible header n_ctx={n_ctx}, n_vocab={n_vocab}, n_chunk={n_chunk}")
        n_tok = int(n_ctx) * int(n_chunk)
        raw = fh.read(4 * n_tok)
        if len(raw) < 4 * n_tok:
            raise KLBaseFileError(f"{p}: truncated: {len(raw) // 4} of {n_tok} evaluation tokens")
        tokens = np.frombuffer(raw, np.int32).copy()
        tokens.flags.writeable = False
        size = os.fstat(fh.fileno()).st_size
    base = KLBase(p, int(n_ctx), int(n_vocab), int(n_chunk), tokens)
    if size < base.size:
        have = (size - base.rows_offset) // (2 * base.row_values)
        raise KLBaseFileError(
            f"{p}: truncated: {have} of {n_chunk * base.rows_per_chunk} log-probability rows "
            f"({size} of {base.size} bytes)"
        )
    return base


class _BaseWriter(Scorer):
    """A :class:`Scorer` that also writes each scored row, quantised, to the base file."""

    def __init__(self, ctx: Context, p: Plan, fh: IO[bytes]) -> None:
        super().__init__(ctx, p)
        self.fh = fh
        nv = 2 * ((ctx.n_vocab + 1) // 2) + 4
        self.out = np.zeros((p.n_ctx - 1 - p.n_ctx // 2, nv), np.uint16)  # padding column stays 0

    def _score_rows(
        self, rows: npt.NDArray[np.float32], tokens: npt.NDArray[np.int32], chunk: int, p0: int
    ) -> tuple[float, float]:
        n = min(len(rows), self.p.n_ctx - 1 - p0)
        if n <= 0:
            return 0.0, 0.0
        out = self.out[:n]
        vs = kl_base_rows(rows[:n], tokens[chunk + p0 + 1 : chunk + p0 + 1 + n], out, _workers()).tolist()
        out.tofile(self.fh)
        _drop_cached(self.fh, flush=True)
        nll = nll2 = 0.0
        for v in vs:
            nll += v
            nll2 += v * v
        return nll, nll2


def _open(model: Model, ctx_plan: Plan, n_threads: int | None, context_params: Mapping[str, Any] | None) -> Context:
    """A context sized as ``llama-perplexity`` sizes its own (see :mod:`samplers.perplexity`),
    with ``context_params`` (any :class:`llama_cffi.Context` keyword: ``flash_attn_type``,
    ``type_k``, ...) on top."""
    kwargs: dict[str, Any] = {
        "n_ctx": ctx_plan.ctx_size,
        "n_batch": ctx_plan.n_batch,
        "n_seq_max": ctx_plan.n_seq,
        "swa_full": False,
        "kv_unified": False,
    }
    if n_threads is not None:
        kwargs["n_threads"] = kwargs["n_threads_batch"] = n_threads
    if context_params:
        clash = sorted(set(context_params) & {"n_ctx", "n_batch", "n_seq_max", "kv_unified"})
        if clash:
            raise ParamError(f"context_params may not set {', '.join(clash)}: the run sizes the context")
        kwargs.update(context_params)
    return Context(model, **kwargs)


class _Using:
    """The context of a run: created from a Model (closed at the end) or a given Context
    (checked; its thread counts set for the run and restored)."""

    def __init__(
        self,
        model_or_ctx: Model | Context,
        ctx_plan: Plan,
        n_threads: int | None,
        context_params: Mapping[str, Any] | None,
    ) -> None:
        self.owned = isinstance(model_or_ctx, Model)
        if isinstance(model_or_ctx, Context):
            if context_params:
                raise ParamError("context_params applies when a Model is passed (the context is created here)")
            _check_context(model_or_ctx, ctx_plan)
            self.ctx = model_or_ctx
        else:
            self.ctx = _open(model_or_ctx, ctx_plan, n_threads, context_params)
        self.saved: tuple[int, int] | None = None
        if not self.owned and n_threads is not None:
            self.saved = (self.ctx.n_threads, self.ctx.n_threads_batch)
            self.ctx.set_n_threads(n_threads, n_threads)

    def close(self) -> None:
        if self.owned:
            self.ctx.close()
        elif self.saved is not None:
            self.ctx.set_n_threads(*self.saved)


def _model_of(model_or_ctx: object) -> Model:
    if isinstance(model_or_ctx, Context):
        return model_or_ctx.model
    if isinstance(model_or_ctx, Model):
        return model_or_ctx
    raise type_error("model_or_ctx", "a llama_cffi.Model or Context", model_or_ctx)


def _check_run_options(progress: object, context_params: object) -> None:
    if progress is not None:
        expect_callable("progress", progress, "callable or None")
    if context_params is not None:
        expect_mapping("context_params", context_params, "a mapping of Context keywords or None")


def write_kl_base(
    model_or_ctx: Model | Context,
    text_or_tokens: str | bytes | npt.ArrayLike,
    path: str | os.PathLike[str],
    *,
    n_ctx: int = 512,
    n_batch: int = 2048,
    n_chunks: int = -1,
    n_threads: int | None = None,
    progress: ProgressCallback | None = None,
    context_params: Mapping[str, Any] | None = None,
) -> PerplexityResult:
    """Perplexity of the text under the base model, as ``llama-perplexity -c n_ctx -b
    n_batch --chunks n_chunks --kl-divergence-base path`` computes it, writing the base
    file (layout: the module docstring) to ``path``; returns the perplexity.

    The chunks, the layout and the context are :func:`samplers.perplexity.perplexity`'s
    (a ``Context`` argument must be sized as it requires); ``context_params`` (with a
    ``Model``) adds :class:`llama_cffi.Context` keywords such as ``flash_attn_type``. The
    scores differ from :func:`~samplers.perplexity.perplexity`'s in float32's last digit,
    as ``llama-perplexity``'s do when it writes the file (its ``-log p`` is then computed
    in float32). The file is written beside ``path`` and renamed over it at the end;
    ``progress(chunks_done, n_chunks, running_ppl)`` is called after each chunk.

    Raises what :func:`~samplers.perplexity.perplexity` raises, and ``OSError``.
    """
    model = _model_of(model_or_ctx)
    dest = Path(expect_path("path", path))
    _check_run_options(progress, context_params)
    if n_threads is not None:
        n_threads = _int_param("n_threads", n_threads, 1)
    p, tokens, n_chunk, bos = prepare(model, text_or_tokens, n_ctx, n_batch, n_chunks)
    using = _Using(model_or_ctx, p, n_threads, context_params)
    try:
        # a new file beside dest (created with the umask's mode, as the tool's), renamed at the end
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        fh = open(tmp, "xb")  # closed by the with below
        try:
            with fh:
                fh.write(MAGIC)
                np.array([p.n_ctx], np.uint32).tofile(fh)
                np.array([model.n_vocab, n_chunk], np.int32).tofile(fh)
                np.ascontiguousarray(tokens[: n_chunk * p.n_ctx], np.int32).tofile(fh)
                scorer = _BaseWriter(using.ctx, p, fh)
                acc = Accumulator(p, n_chunk, len(tokens), progress)
                for i, n in groups(n_chunk, p.n_seq):
                    acc.add(scorer.group(tokens, i, n, bos))
            os.replace(tmp, dest)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    finally:
        using.close()
    return acc.result()


# ---------------------------------------------------------------------- statistics
def _sqrt(x: float) -> float:
    """C's ``sqrt``: NaN with the sign bit set (``-nan``) for a negative argument."""
    if x < 0.0:
        return -math.nan
    return math.sqrt(x)


def _div(a: float, b: float) -> float:
    """C's double division: ``±inf`` for ``x / 0``, ``-nan`` for ``0 / 0``."""
    if b == 0.0:
        if a == 0.0 or math.isnan(a):
            return -math.nan if not math.isnan(a) else a
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _mean_unc(s: float, s2: float, count: int) -> tuple[float, float]:
    """``mean_and_uncertainty`` of ``kl_divergence()``."""
    if count < 1:
        return 0.0, 0.0
    f = s / count
    df = s2 / count - f * f
    df = _sqrt(df / (count - 1)) if df > 0 and count > 10 else 0.0
    return f, df


def _cov(sa: float, sb: float, sab: float, count: int) -> float:
    if count < 10:
        return 0.0
    return (sab / count - (sa / count) * (sb / count)) / (count - 1)


def _c(x: float, spec: str) -> str:
    """``printf`` of one double: ``-nan``/``nan``/``inf`` as glibc writes them."""
    if math.isnan(x) or math.isinf(x):
        width = int(spec.split(".")[0] or 0)
        if math.isnan(x):
            s = "-nan" if math.copysign(1.0, x) < 0 else "nan"
        else:
            s = "-inf" if x < 0 else "inf"
        return s.rjust(width)
    return format(x, spec)


def _percentile(values: npt.NDArray[np.float32], fraction: float) -> np.float32:
    """``percentile`` of ``kl_divergence()``, in float32 as there (``values`` sorted)."""
    fr = _F(fraction)
    if fr <= 0:
        return values[0]  # type: ignore[no-any-return]
    if fr >= 1:
        return values[-1]  # type: ignore[no-any-return]
    p = _F(fr * _F(len(values) - 1))
    ip = int(p)
    p = _F(p - _F(ip))
    r: np.float32 = _F(_F(_F(_F(1) - p) * values[ip]) + _F(p * values[min(ip + 1, len(values) - 1)]))
    return r


def _median(values: npt.NDArray[np.float32]) -> np.float32:
    n = len(values)
    if n % 2 == 0:
        r: np.float32 = _F(_F(0.5) * _F(values[n // 2] + values[n // 2 - 1]))
        return r
    return values[n // 2]  # type: ignore[no-any-return]


@dataclass
class _Sums:
    """``kl_divergence_result`` of ``perplexity.cpp``: float64 sums over the scored positions."""

    sum_nll: float = 0.0
    sum_nll2: float = 0.0
    sum_nll_base: float = 0.0
    sum_nll_base2: float = 0.0
    sum_nll_nll_base: float = 0.0
    sum_kld: float = 0.0
    sum_kld2: float = 0.0
    sum_p_diff: float = 0.0
    sum_p_diff2: float = 0.0
    sum_p_diff4: float = 0.0
    max_p_diff: float = 0.0
    n_same_top: int = 0
    count: int = 0

    def add(self, r: _Row) -> None:
        nll, nb = r.nll, r.nll_base
        self.sum_nll += float(nll)
        self.sum_nll2 += float(_F(nll * nll))
        self.sum_nll_base += float(nb)
        self.sum_nll_base2 += float(_F(nb * nb))
        self.sum_nll_nll_base += float(_F(nll * nb))
        self.sum_kld += r.kld
        self.sum_kld2 += r.kld * r.kld
        self.count += 1
        self.n_same_top += r.same_top
        pd = r.p_diff
        self.sum_p_diff += float(pd)
        pd2 = float(_F(pd * pd))
        self.sum_p_diff2 += pd2
        self.sum_p_diff4 += pd2 * pd2
        self.max_p_diff = max(self.max_p_diff, abs(float(pd)))


@dataclass(frozen=True)
class KLChunk:
    """The running values printed after chunk ``chunk`` (1-based), over every position
    scored so far: ``ppl`` ± ``ppl_unc`` (the compared model's perplexity),
    ``ln_ratio`` ± ``ln_ratio_unc`` (``ln(PPL(Q)/PPL(base))``), ``kld`` ± ``kld_unc``
    (mean KL divergence, nats), ``rms_p_diff`` ± ``rms_p_diff_unc`` and ``same_top`` ±
    ``same_top_unc`` (fractions, printed as percentages). ``str()`` is the line."""

    chunk: int
    ppl: float
    ppl_unc: float
    ln_ratio: float
    ln_ratio_unc: float
    kld: float
    kld_unc: float
    rms_p_diff: float
    rms_p_diff_unc: float
    same_top: float
    same_top_unc: float

    def __str__(self) -> str:
        return (
            f"{self.chunk:4d}"
            f"    {_c(self.ppl, '9.4f')} ± {_c(self.ppl_unc, '9.4f')}"
            f"    {_c(self.ln_ratio, '10.5f')} ± {_c(self.ln_ratio_unc, '10.5f')}"
            f"    {_c(self.kld, '10.5f')} ± {_c(self.kld_unc, '10.5f')}"
            f"    {_c(100.0 * self.rms_p_diff, '6.3f')} ± {_c(100.0 * self.rms_p_diff_unc, '6.3f')} %"
            f"    {_c(100.0 * self.same_top, '6.3f')} ± {_c(100.0 * self.same_top_unc, '6.3f')} %"
        )

    @staticmethod
    def _of(chunk: int, s: _Sums) -> KLChunk:
        lp, lpu = _mean_unc(s.sum_nll, s.sum_nll2, s.count)
        lb, lbu = _mean_unc(s.sum_nll_base, s.sum_nll_base2, s.count)
        cov = _cov(s.sum_nll, s.sum_nll_base, s.sum_nll_nll_base, s.count)
        kl, klu = _mean_unc(s.sum_kld, s.sum_kld2, s.count)
        mse, mseu = _mean_unc(s.sum_p_diff2, s.sum_p_diff4, s.count)
        rms = _sqrt(mse)
        top = s.n_same_top / s.count
        return KLChunk(
            chunk,
            math.exp(lp),
            math.exp(lp) * lpu,
            lp - lb,
            _sqrt(lpu * lpu + lbu * lbu - 2.0 * cov),
            kl,
            klu,
            rms,
            _div(0.5, rms) * mseu,
            top,
            _sqrt(_div(top * (1 - top), s.count - 1)),
        )


#: The header line ``llama-perplexity`` prints above the :class:`KLChunk` lines.
TABLE_HEADER = (
    "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence"
    "              Δp RMS            Same top p"
)

#: ``(label, fraction)`` of the KLD percentile lines, in print order (Median between).
_KLD_PCT = (("99.9%", 0.999), ("99.0%", 0.990), ("95.0%", 0.950), ("90.0%", 0.900))
_KLD_PCT_LOW = (("10.0%", 0.100), (" 5.0%", 0.050), (" 1.0%", 0.010), (" 0.1%", 0.001))
_DP_PCT = (("99.9%", 0.999), ("99.0%", 0.990), ("95.0%", 0.950), ("90.0%", 0.900), ("75.0%", 0.750))
_DP_PCT_LOW = (("25.0%", 0.250), ("10.0%", 0.100), (" 5.0%", 0.050), (" 1.0%", 0.010), (" 0.1%", 0.001))


@dataclass(frozen=True)
class KLDivergenceResult:
    """The outcome of :func:`kl_divergence`: ``Q`` is the model run now, ``base`` the
    model whose file was read. Log values are in nats; probabilities and their
    differences are fractions (``llama-perplexity`` prints them ×100, as %).

    ``n_ctx``, ``n_chunks``, ``n_batch``, ``n_seq``: the layout; ``count``: positions
    scored (``n_chunks * (n_ctx - 1 - n_ctx // 2)``).
    ``ppl``, ``ppl_unc``; ``ppl_base``, ``ppl_base_unc``: the two perplexities ± their
    uncertainties; ``cor``: the correlation of the per-token ``ln`` perplexities;
    ``ln_ratio``, ``ln_ratio_unc``: ``ln(PPL(Q)/PPL(base))``; ``ratio``, ``ratio_unc``:
    ``PPL(Q)/PPL(base)``; ``diff``, ``diff_unc``: ``PPL(Q)-PPL(base)``.
    ``kld``, ``kld_unc``: the mean KL divergence ``KL(base || Q)`` per token;
    ``kld_values``: each position's divergence (float32, in token order).
    ``p_diff``, ``p_diff_unc``: the mean of ``Δp = p_Q(token) - p_base(token)`` for the
    actual next token; ``p_diff_values``: each position's Δp (float32, in token order);
    ``rms_p_diff``, ``rms_p_diff_unc``; ``max_abs_p_diff``.
    ``same_top``, ``same_top_unc``: the fraction of positions where both models' most
    likely token is the same.
    ``chunks``: the running line after each chunk (:class:`KLChunk`).

    :meth:`lines` are the statistics ``llama-perplexity`` prints at the end (none for
    fewer than 100 positions, as it prints none); ``str()`` joins them.
    """

    n_ctx: int
    n_chunks: int
    n_batch: int
    n_seq: int
    count: int
    ppl: float
    ppl_unc: float
    ppl_base: float
    ppl_base_unc: float
    cor: float
    ln_ratio: float
    ln_ratio_unc: float
    ratio: float
    ratio_unc: float
    diff: float
    diff_unc: float
    kld: float
    kld_unc: float
    p_diff: float
    p_diff_unc: float
    rms_p_diff: float
    rms_p_diff_unc: float
    max_abs_p_diff: float
    same_top: float
    same_top_unc: float
    chunks: tuple[KLChunk, ...] = field(repr=False)
    kld_values: npt.NDArray[np.float32] = field(repr=False, compare=False)
    p_diff_values: npt.NDArray[np.float32] = field(repr=False, compare=False)

    def kld_percentile(self, fraction: float) -> float:
        """The KLD ``fraction`` percentile (0..1) as ``llama-perplexity`` interpolates it."""
        fraction = expect_number("fraction", fraction)
        return float(_percentile(np.sort(self.kld_values), fraction))

    def p_diff_percentile(self, fraction: float) -> float:
        """The Δp ``fraction`` percentile (0..1), likewise."""
        fraction = expect_number("fraction", fraction)
        return float(_percentile(np.sort(self.p_diff_values), fraction))

    def lines(self) -> list[str]:
        """The final statistics, line by line, as ``llama-perplexity`` prints them."""
        if self.count < 100:
            return []
        kv = np.sort(self.kld_values)
        pv = np.sort(self.p_diff_values)
        out = [
            "====== Perplexity statistics ======",
            f"Mean PPL(Q)                   : {_c(self.ppl, '10.6f')} ± {_c(self.ppl_unc, '10.6f')}",
            f"Mean PPL(base)                : {_c(self.ppl_base, '10.6f')} ± {_c(self.ppl_base_unc, '10.6f')}",
            f"Cor(ln(PPL(Q)), ln(PPL(base))): {_c(100.0 * self.cor, '6.2f')}%",
            f"Mean ln(PPL(Q)/PPL(base))     : {_c(self.ln_ratio, '10.6f')} ± {_c(self.ln_ratio_unc, '10.6f')}",
            f"Mean PPL(Q)/PPL(base)         : {_c(self.ratio, '10.6f')} ± {_c(self.ratio_unc, '10.6f')}",
            f"Mean PPL(Q)-PPL(base)         : {_c(self.diff, '10.6f')} ± {_c(self.diff_unc, '10.6f')}",
            "",
            "====== KL divergence statistics ======",
            f"Mean    KLD: {_c(self.kld, '10.6f')} ± {_c(self.kld_unc, '10.6f')}",
            f"Maximum KLD: {_c(float(kv[-1]), '10.6f')}",
        ]
        out += [f"{label}   KLD: {_c(float(_percentile(kv, fr)), '10.6f')}" for label, fr in _KLD_PCT]
        out.append(f"Median  KLD: {_c(float(_median(kv)), '10.6f')}")
        out += [f"{label}   KLD: {_c(float(_percentile(kv, fr)), '10.6f')}" for label, fr in _KLD_PCT_LOW]
        out += [
            f"Minimum KLD: {_c(float(kv[0]), '10.6f')}",
            "",
            "====== Token probability statistics ======",
            f"Mean    Δp: {_c(100.0 * self.p_diff, '6.3f')} ± {_c(100.0 * self.p_diff_unc, '5.3f')} %",
            f"Maximum Δp: {_c(100.0 * float(pv[-1]), '6.3f')}%",
        ]
        out += [f"{label}   Δp: {_c(100.0 * float(_percentile(pv, fr)), '6.3f')}%" for label, fr in _DP_PCT]
        out.append(f"Median  Δp: {_c(100.0 * float(_median(pv)), '6.3f')}%")
        out += [f"{label}   Δp: {_c(100.0 * float(_percentile(pv, fr)), '6.3f')}%" for label, fr in _DP_PCT_LOW]
        out += [
            f"Minimum Δp: {_c(100.0 * float(pv[0]), '6.3f')}%",
            f"RMS Δp    : {_c(100.0 * self.rms_p_diff, '6.3f')} ± {_c(100.0 * self.rms_p_diff_unc, '5.3f')} %",
            f"Same top p: {_c(100.0 * self.same_top, '6.3f')} ± {_c(100.0 * self.same_top_unc, '5.3f')} %",
        ]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _result(
    s: _Sums,
    lp: Plan,
    n_chunks: int,
    chunks: Sequence[KLChunk],
    kld_values: npt.NDArray[np.float32],
    p_diff_values: npt.NDArray[np.float32],
) -> KLDivergenceResult:
    lq, lqu = _mean_unc(s.sum_nll, s.sum_nll2, s.count)
    lb, lbu = _mean_unc(s.sum_nll_base, s.sum_nll_base2, s.count)
    ppl, ppl_b = math.exp(lq), math.exp(lb)
    ppl_u, ppl_bu = ppl * lqu, ppl_b * lbu
    cov = _cov(s.sum_nll, s.sum_nll_base, s.sum_nll_nll_base, s.count)
    ln_ratio = lq - lb
    ln_ratio_u = _sqrt(lqu * lqu + lbu * lbu - 2.0 * cov)
    ratio = math.exp(ln_ratio)
    kl, klu = _mean_unc(s.sum_kld, s.sum_kld2, s.count)
    pd, pdu = _mean_unc(s.sum_p_diff, s.sum_p_diff2, s.count)
    mse, mseu = _mean_unc(s.sum_p_diff2, s.sum_p_diff4, s.count)
    rms = _sqrt(mse)
    top = s.n_same_top / s.count
    return KLDivergenceResult(
        n_ctx=lp.n_ctx,
        n_chunks=n_chunks,
        n_batch=lp.n_batch,
        n_seq=lp.n_seq,
        count=s.count,
        ppl=ppl,
        ppl_unc=ppl_u,
        ppl_base=ppl_b,
        ppl_base_unc=ppl_bu,
        cor=_div(cov, lqu * lbu),
        ln_ratio=ln_ratio,
        ln_ratio_unc=ln_ratio_u,
        ratio=ratio,
        ratio_unc=ratio * ln_ratio_u,
        diff=ppl - ppl_b,
        diff_unc=_sqrt(ppl_u * ppl_u + ppl_bu * ppl_bu - 2.0 * (ppl * ppl_b * cov)),
        kld=kl,
        kld_unc=klu,
        p_diff=pd,
        p_diff_unc=pdu,
        rms_p_diff=rms,
        rms_p_diff_unc=_div(0.5, rms) * mseu,
        max_abs_p_diff=s.max_p_diff,
        same_top=top,
        same_top_unc=_sqrt(_div(top * (1.0 - top), s.count - 1)),
        chunks=tuple(chunks),
        kld_values=kld_values,
        p_diff_values=p_diff_values,
    )


# ---------------------------------------------------------------------- the comparison run
#: ``progress(chunks_done, n_chunks, line)``: called after each chunk with its running line.
KLProgressCallback = Callable[[int, int, KLChunk], None]


def kl_plan(n_ctx: int, ctx_size: int | None = None, n_batch: int = 2048) -> tuple[Plan, Plan]:
    """The layouts of ``llama-perplexity --kl-divergence -c ctx_size -b n_batch`` over a
    base file of ``n_ctx``-token chunks: ``(context plan, run plan)``.

    The context is the one the tool creates for ``-c ctx_size`` (``plan(ctx_size,
    n_batch)``: ``n_seq_max = max(1, n_batch // ctx_size)`` sequences of ``ctx_size``);
    the run decodes ``min(max(1, n_batch' // n_ctx), n_seq_max)`` chunks of the file's
    ``n_ctx`` at once, ``n_batch' = min(n_batch, n_seq_max * ctx_size)``. ``ctx_size``
    defaults to ``n_ctx`` (the base run's ``-c``). Raises :class:`KLBaseMismatchError`
    when ``n_ctx > ctx_size`` (``llama-perplexity`` prints an error then and fails to
    decode)."""
    n_ctx = _int_param("n_ctx", n_ctx, 3)
    c = n_ctx if ctx_size is None else _int_param("ctx_size", ctx_size, 3)
    cp = plan(c, n_batch)
    if n_ctx > c:
        raise KLBaseMismatchError(
            f"the base file has been computed with n_ctx={n_ctx}, while the current context is {c}; "
            f"increase ctx_size (-c) to at least {n_ctx}"
        )
    nb = cp.n_batch
    n_seq = min(max(1, nb // n_ctx), cp.n_seq)
    return cp, Plan(n_ctx, n_seq, cp.ctx_size, nb, (n_ctx + nb - 1) // nb)


class _KLScorer(Scorer):
    """A :class:`Scorer` that compares each scored row with the base file's."""

    def __init__(
        self,
        ctx: Context,
        p: Plan,
        base: KLBase,
        fh: io.BufferedReader,
        progress: KLProgressCallback | None,
    ) -> None:
        super().__init__(ctx, p)
        self.base = base
        self.fh = fh  # the base file, read a decode's rows at a time (as the tool reads a chunk's)
        self.buf = np.empty((base.rows_per_chunk, base.row_values), np.uint16)
        n_chunk = self.n_chunk = base.n_chunk
        self.progress = progress
        self.sums = _Sums()
        per = p.n_ctx - 1 - p.n_ctx // 2
        self.kld_values = np.zeros(n_chunk * per, np.float32)
        self.p_diff_values = np.zeros(n_chunk * per, np.float32)
        self.chunks: list[KLChunk] = []

    def _score_rows(
        self, rows: npt.NDArray[np.float32], tokens: npt.NDArray[np.int32], chunk: int, p0: int
    ) -> tuple[float, float]:
        n_ctx = self.p.n_ctx
        first = n_ctx // 2
        per = n_ctx - 1 - first
        c = chunk // n_ctx
        n = min(len(rows), n_ctx - 1 - p0)
        if n > 0:
            b = self.base
            at = c * per + p0 - first  # the file's row for position p0
            self.fh.seek(b.rows_offset + 2 * b.row_values * at)
            base = self.buf[:n]
            if self.fh.readinto(base.data.cast("B")) != base.nbytes:
                raise KLBaseFileError(f"{b.path}: failed reading log-probs for chunk {c + 1}")
            _drop_cached(self.fh, b.rows_offset + 2 * b.row_values * at, base.nbytes)
            v = kl_divergence_rows(rows[:n], tokens[chunk + p0 + 1 : chunk + p0 + 1 + n], base, _workers())
            if not v.ok.all():
                raise KLDivergenceError("the model produced NaN or infinite logits")
            s = self.sums
            for row in zip(v.nll, v.nll_base, v.kld.tolist(), v.same_top.tolist(), v.p_diff, strict=True):
                s.add(_Row(*row))
            self.kld_values[at : at + n] = v.kld
            self.p_diff_values[at : at + n] = v.p_diff
        if p0 + len(rows) >= n_ctx:  # the chunk's last position: it is done
            line = KLChunk._of(c + 1, self.sums)
            self.chunks.append(line)
            if self.progress is not None:
                self.progress(len(self.chunks), self.n_chunk, line)
        return 0.0, 0.0


def kl_divergence(
    model_or_ctx: Model | Context,
    base: KLBase | str | os.PathLike[str],
    *,
    ctx_size: int | None = None,
    n_batch: int = 2048,
    n_threads: int | None = None,
    progress: KLProgressCallback | None = None,
    context_params: Mapping[str, Any] | None = None,
) -> KLDivergenceResult:
    """Compare ``model_or_ctx`` (``Q``) with the base model whose file ``base`` is (a path,
    or :func:`read_kl_base`'s :class:`KLBase`), as ``llama-perplexity --kl-divergence
    --kl-divergence-base FILE -c ctx_size -b n_batch -t n_threads`` does: every chunk of
    the file's tokens is decoded (from an empty memory, BOS first when the vocabulary
    adds one) and each scored position's distribution is compared with the stored one.

    ``ctx_size`` is the tool's ``-c`` (default: the file's ``n_ctx``; see :func:`kl_plan`
    for the layout it implies); a ``Context`` argument must be at least that large.
    ``context_params`` (with a ``Model``) adds :class:`llama_cffi.Context` keywords such as
    ``flash_attn_type`` or ``type_k``. ``progress(chunks_done, n_chunks, line)`` is called
    after each chunk; an exception it raises stops the run.

    Per position, in ``perplexity.cpp``'s float32/float64 arithmetic: ``nll`` and
    ``nll_base`` (``-log p`` of the actual next token under each model), ``KLD = sum over
    the tokens with log p_base > -16 of p_base * (log p_base - log p_Q)``, whether both
    models' top tokens agree, ``Δp = p_Q - p_base``; see :class:`KLDivergenceResult`.

    Raises :class:`KLBaseFileError` for an unreadable file, :class:`KLBaseMismatchError`
    when the model's vocabulary size differs from the file's or the chunks do not fit the
    context, :class:`KLDivergenceError` for NaN logits, and llama_cffi's decode errors.
    """
    model = _model_of(model_or_ctx)
    if not isinstance(base, (KLBase, str, os.PathLike)):
        raise type_error("base", "a KLBase (read_kl_base) or a base file's path (a str or an os.PathLike)", base)
    _check_run_options(progress, context_params)
    if n_threads is not None:
        n_threads = _int_param("n_threads", n_threads, 1)
    b = base if isinstance(base, KLBase) else read_kl_base(base)
    if b.n_vocab != model.n_vocab:
        raise KLBaseMismatchError(f"inconsistent vocabulary ({b.n_vocab} in the base file vs {model.n_vocab})")
    vocab = model.vocab
    if vocab.add_eos:
        raise KLDivergenceError(
            "the model's vocabulary appends EOS to every text; llama-perplexity refuses such models"
        )
    bos = vocab.bos if vocab.add_bos else None
    bad = (b.tokens < 0) | (b.tokens >= model.n_vocab)
    if bad.any():
        raise KLBaseFileError(f"{b.path}: token id {int(b.tokens[np.argmax(bad)])} is outside the vocabulary")
    cp, lp = kl_plan(b.n_ctx, ctx_size, n_batch)
    using = _Using(model_or_ctx, cp, n_threads, context_params)
    try:
        with open(b.path, "rb") as fh:
            scorer = _KLScorer(using.ctx, lp, b, fh, progress)
            tokens = np.array(b.tokens)
            for i, n in groups(b.n_chunk, lp.n_seq):
                scorer.group(tokens, i, n, bos)
    finally:
        using.close()
    return _result(scorer.sums, lp, b.n_chunk, scorer.chunks, scorer.kld_values, scorer.p_diff_values)


# ---------------------------------------------------------------------- command line
def add_kl_arguments(parser: argparse.ArgumentParser) -> None:
    """``--kl-divergence-base FILE`` and ``--kl-divergence`` (``llama-perplexity``'s names),
    and ``-fa``/``--flash-attn`` and ``-ctk``/``--cache-type-k`` where ``parser`` has no
    such option yet, on ``parser``. :func:`run_kl_cli` also reads ``model``, ``file``,
    ``ctx_size``, ``batch_size``, ``chunks`` and ``threads`` (the perplexity command's)."""
    expect_parser("parser", parser)
    parser.add_argument(
        "--kl-divergence-base",
        metavar="FILE",
        default=None,
        help="with -f: write the base model's log-probabilities to FILE; "
        "with --kl-divergence: the file to compare with",
    )
    parser.add_argument(
        "--kl-divergence",
        action="store_true",
        help="compare the model with the base file's (needs --kl-divergence-base; -f not needed)",
    )
    have = set(parser._option_string_actions)
    if not have & {"-fa", "--flash-attn"}:
        parser.add_argument(
            "-fa",
            "--flash-attn",
            choices=("on", "off", "auto"),
            default=None,
            help="flash attention, in the KL-divergence modes (default auto)",
        )
    if not have & {"-ctk", "--cache-type-k"}:
        parser.add_argument(
            "-ctk", "--cache-type-k", default=None, help="KV cache type for K, in the KL-divergence modes (default f16)"
        )


def _context_params(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    fa = getattr(args, "flash_attn", None)
    if fa is not None:
        out["flash_attn_type"] = {"on": "enabled", "off": "disabled", "auto": "auto"}[fa]
    ctk = getattr(args, "cache_type_k", None)
    if ctk is not None:
        out["type_k"] = ctk
    return out


def run_kl_cli(args: argparse.Namespace) -> int | None:
    """The KL-divergence modes of the ``perplexity`` command; ``None`` when neither KL flag
    is given (the caller runs plain perplexity). Prints like ``llama-perplexity``:
    progress on stderr; the running estimates and ``Final estimate`` (writing the base),
    or the chunk table and the statistics (comparing), on stdout. Returns the exit status;
    user errors propagate as exceptions (the caller prints one line and exits 2)."""
    expect_namespace("args", args)
    base_path = getattr(args, "kl_divergence_base", None)
    compare = bool(getattr(args, "kl_divergence", False))
    if base_path is None and not compare:
        return None
    if base_path is None:
        raise ParamError("--kl-divergence needs --kl-divergence-base FILE (the base model's log-probabilities)")
    path = args.model if getattr(args, "model", None) else str(default_model_path())
    threads = getattr(args, "threads", None)
    n_batch = getattr(args, "batch_size", 2048)
    cparams = _context_params(args)
    if compare:
        return _run_compare(path, base_path, getattr(args, "ctx_size", None), n_batch, threads, cparams)
    if not getattr(args, "file", None):
        raise ParamError("--kl-divergence-base without --kl-divergence needs -f FILE (the text)")
    return _run_write(path, args, base_path, n_batch, threads, cparams)


def _eta(name: str, first_pass: float, total: int, n_seq: int) -> None:
    secs = int(first_pass * total / n_seq)
    hours = f"{secs // 3600} hours " if secs >= 3600 else ""
    print(
        f"{name}: {first_pass:.2f} seconds per pass - ETA {hours}{(secs % 3600 if hours else secs) / 60.0:.2f} minutes",
        file=sys.stderr,
        flush=True,
    )


def _run_write(
    path: str, args: argparse.Namespace, base_path: str, n_batch: int, threads: int | None, cparams: dict[str, Any]
) -> int:
    p = plan(args.ctx_size, n_batch)
    text = _read_text(args.file)
    chunks = getattr(args, "chunks", -1)
    with Model.load(path) as model:
        tokens = model.tokenize(text, add_special=True, parse_special=False)
        print(f"perplexity: saving all logits to {base_path}", file=sys.stderr, flush=True)
        if len(tokens) >= 2 * p.n_ctx:
            n_max = len(tokens) // p.n_ctx
            n_total = n_max if chunks < 0 else min(chunks, n_max)
            print(
                f"perplexity: calculating perplexity over {n_total} chunks, n_ctx={p.n_ctx}, "
                f"batch_size={p.n_batch}, n_seq={p.n_seq}",
                file=sys.stderr,
                flush=True,
            )
        t0 = time.perf_counter()
        shown: list[bool] = []

        def show(done: int, total: int, ppl: float) -> None:
            if not shown:
                shown.append(True)
                _eta("perplexity", time.perf_counter() - t0, total, p.n_seq)
            print(f"[{done}]{ppl:.4f},", end="", flush=True)

        res = write_kl_base(
            model,
            tokens,
            base_path,
            n_ctx=p.n_ctx,
            n_batch=n_batch,
            n_chunks=chunks,
            n_threads=threads,
            progress=show,
            context_params=cparams or None,
        )
    print(flush=True)
    if math.isnan(res.stderr):
        print("Unexpected negative standard deviation of log(prob)", file=sys.stderr)
        return 0
    print(res, flush=True)
    return 0


def _run_compare(
    path: str,
    base_path: str,
    ctx_size: int | None,
    n_batch: int,
    threads: int | None,
    cparams: dict[str, Any],
) -> int:
    base = read_kl_base(base_path)
    with Model.load(path) as model:
        cp, lp = kl_plan(base.n_ctx, ctx_size if ctx_size is not None else 512, n_batch)
        print(
            f"kl_divergence: computing over {base.n_chunk} chunks, n_ctx={base.n_ctx}, "
            f"batch_size={lp.n_batch}, n_seq={lp.n_seq}",
            file=sys.stderr,
            flush=True,
        )
        t0 = time.perf_counter()

        def show(done: int, total: int, line: KLChunk) -> None:
            if done == 1:
                _eta("kl_divergence", time.perf_counter() - t0, total, lp.n_seq)
                print(f"\n{TABLE_HEADER}", flush=True)
            print(line, flush=True)

        res = kl_divergence(
            model,
            base,
            ctx_size=cp.n_ctx,
            n_batch=n_batch,
            n_threads=threads,
            progress=show,
            context_params=cparams or None,
        )
    print(flush=True)
    for line in res.lines():
        print(line)
    sys.stdout.flush()
    return 0
