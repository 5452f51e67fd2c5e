"""Vectorised numeric kernels over rows of float32 logits, in C inside ``_llama``.

numpy's float32 ``exp`` is not vectorised on most x86 builds (about 2.5 ns per value:
0.7 ms for a 262,144-token vocabulary), which made per-token measurement the largest
host cost of batched branch generation. These kernels run ggml's own ``soft_max``
loop (``ggml_vec_soft_max_f32``, built for the instruction sets the native build
chose; :data:`SOFTMAX_IMPL` says which one is linked) with the GIL released.

:class:`RowMeasures` handles many rows in one call (a batch of branches after one
decode): each row's maximum, log-normaliser and entropy, and its best candidates,
shared among threads.

Arguments are checked here (1-D, C-contiguous, float32, equal lengths) so a wrong
array raises instead of reading out of bounds. Values are not checked: callers pass
``max = row.max()`` after refusing NaN/``+inf`` rows (:mod:`samplers.measure` does).

Ownership: nothing is retained; ``out`` is written, ``row`` only read.
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ._args import expect_array, expect_int, expect_iterable, expect_number, type_error
from ._binding import ffi, lib

__all__ = [
    "SOFTMAX_IMPL",
    "KLRows",
    "RowMeasures",
    "RowStatus",
    "dist_rows",
    "kl_base_rows",
    "kl_divergence_rows",
    "kl_row_values",
    "masked_top_k",
    "masked_top_k_rows",
    "rows_log_sum",
    "rows_reference",
    "softmax_dot",
    "softmax_sum",
    "top_k_grouped",
    "top_p_rows",
]

#: ``"ggml_vec_soft_max_f32"`` (ggml's SIMD kernel) or ``"scalar"`` (a plain C loop,
#: when the static libraries did not define it).
SOFTMAX_IMPL: str = ffi.string(lib.llama_cffi_softmax_impl()).decode()


def _check(name: str, a: npt.NDArray[np.float32]) -> None:
    if not isinstance(a, np.ndarray) or a.dtype != np.float32 or a.ndim != 1 or not a.flags.c_contiguous:
        raise TypeError(f"{name} must be a 1-D C-contiguous float32 ndarray")


def softmax_sum(row: npt.NDArray[np.float32], max_value: float, out: npt.NDArray[np.float32]) -> float:
    """``sum(exp(row - max_value))`` accumulated in float64; ``out[:] = exp(row - max_value)``
    in float32 (``out`` may be ``row`` itself). ``max_value + log(result)`` is the
    log-partition function of ``softmax(row)`` when ``max_value = row.max()``."""
    _check("row", row)
    _check("out", out)
    if type(max_value) is not float:
        max_value = expect_number("max_value", max_value)
    if out.shape[0] != row.shape[0]:
        raise ValueError(f"out has {out.shape[0]} values, row has {row.shape[0]}")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    n = row.shape[0]
    return float(
        lib.llama_cffi_softmax_sum(n, ffi.from_buffer("float[]", out), ffi.from_buffer("float[]", row), max_value)
    )


def softmax_dot(exps: npt.NDArray[np.float32], row: npt.NDArray[np.float32], max_value: float) -> float:
    """``sum(exps_i * (row_i - max_value))`` in float64 over the ``i`` with ``exps_i != 0``
    (so ``-inf`` logits add nothing); with ``exps`` from :func:`softmax_sum` and ``s`` its
    result, the entropy of ``softmax(row)`` is ``log(s) - softmax_dot(...) / s`` nats."""
    _check("exps", exps)
    _check("row", row)
    if type(max_value) is not float:
        max_value = expect_number("max_value", max_value)
    if exps.shape[0] != row.shape[0]:
        raise ValueError(f"exps has {exps.shape[0]} values, row has {row.shape[0]}")
    return float(
        lib.llama_cffi_softmax_dot(
            row.shape[0], ffi.from_buffer("float[]", exps), ffi.from_buffer("float[]", row), max_value
        )
    )


_GROUPS = 64


def top_k_grouped(
    row: npt.NDArray[np.float32], gmax: npt.NDArray[np.float32], k: int, out: npt.NDArray[np.intp]
) -> npt.NDArray[np.intp]:
    """The positions of the ``k`` largest values of ``row``, largest first, ties by lower
    position (a stable sort by ``-row``, cut to ``k``), written to ``out[:k]`` and returned
    as that slice.

    ``gmax`` summarises ``row``: with ``cols = len(gmax)``, ``gmax[c]`` is the max of
    ``row[g * cols + c]`` over ``g < 64`` (``row[:64 * cols].reshape(64, cols).max(0)``);
    values past ``64 * cols`` are the tail. The k-th largest group max is a threshold that
    at least ``k`` values reach, so the kernel reads only the groups that reach it: a few
    microseconds at any vocabulary. ``row`` must hold no NaN (checked by whoever made
    ``gmax``: a NaN group max is NaN). Requires ``1 <= k <= cols`` and ``64 * cols <= len(row)``.
    """
    _check("row", row)
    _check("gmax", gmax)
    if type(k) is not int:
        k = expect_int("k", k)
    n, cols = row.shape[0], gmax.shape[0]
    if not 1 <= k <= cols or cols * _GROUPS > n:
        raise ValueError(f"need 1 <= k <= len(gmax) and 64 * len(gmax) <= len(row): k={k}, {cols} groups, {n} values")
    if not isinstance(out, np.ndarray) or out.dtype != np.intp or out.ndim != 1 or len(out) < k:
        raise TypeError(f"out must be a 1-D intp ndarray of at least {k} entries")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be C-contiguous and writable")
    return _top_k_grouped(row, gmax, k, out)


def masked_top_k(
    row: npt.NDArray[np.float32],
    words: npt.NDArray[np.uint32],
    k: int,
    ids: npt.NDArray[np.int32],
    logits: npt.NDArray[np.float32],
) -> int:
    """The ``k`` best values of ``row`` among the positions a packed mask allows (bit ``p %
    32`` of ``words[p // 32]``: a grammar's mask, as ``GrammarMatcher.fill_mask`` writes
    it), largest first, ties by lower position, written to ``ids[:k]`` (positions) and
    ``logits[:k]``; when fewer than ``k`` allowed values are above ``-inf``, the rest are the
    lowest positions the mask leaves at ``-inf`` (bit clear, or ``-inf`` in the row), with
    ``-inf``. That is a stable sort of the masked row (``-inf`` where the bit is clear) by
    ``-value``, cut to ``k``: what ``Candidates.top`` keeps after the mask is applied, in
    one pass over the mask's set bits, without a copy of the row. Returns how many of the
    ``k`` are above ``-inf``. Requires ``1 <= k <= len(row)``; a NaN at an allowed position
    raises ``ValueError``."""
    _check("row", row)
    n = row.shape[0]
    if type(k) is not int:
        k = expect_int("k", k)
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= len(row): k={k}, {n} values")
    if not isinstance(words, np.ndarray) or words.dtype != np.uint32 or words.ndim != 1:
        raise TypeError("words must be a 1-D uint32 ndarray")
    if len(words) < (n + 31) // 32 or not words.flags.c_contiguous:
        raise ValueError(f"words must be C-contiguous with at least {(n + 31) // 32} words")
    for name, a, dt in (("ids", ids, np.int32), ("logits", logits, np.float32)):
        if not isinstance(a, np.ndarray) or a.dtype != dt or a.ndim != 1 or len(a) < k:
            raise TypeError(f"{name} must be a 1-D {np.dtype(dt).name} ndarray of at least {k} entries")
        if not a.flags.c_contiguous or not a.flags.writeable:
            raise ValueError(f"{name} must be C-contiguous and writable")
    got: int = lib.llama_cffi_masked_top_k(
        n,
        ffi.from_buffer("float[]", row),
        ffi.from_buffer("uint32_t[]", words),
        k,
        ffi.from_buffer("int32_t[]", ids),
        ffi.from_buffer("float[]", logits),
    )
    if got == -2:
        raise ValueError("the row holds NaN at a position the mask allows")
    if got < 0:
        raise MemoryError("masked_top_k: out of memory")
    return got


def masked_top_k_rows(
    rows: Sequence[npt.NDArray[np.float32]] | npt.NDArray[np.float32],
    masks: Sequence[npt.NDArray[np.uint32]],
    k: int,
    ids: npt.NDArray[np.int32],
    logits: npt.NDArray[np.float32],
    n_threads: int = 1,
    row_index: npt.ArrayLike | None = None,
) -> npt.NDArray[np.int32]:
    """:func:`masked_top_k` of many rows in one call (the GIL released), on ``n_threads``
    threads (the caller's and the process's pool): row ``r`` of ``ids``/``logits`` (2-D,
    ``len(masks)`` rows of ``k`` columns, C-contiguous) gets row ``r``'s ``k`` best values
    among those ``masks[r]`` allows. Every row must have the same length. Returns, per row,
    how many are above ``-inf``. Each distinct mask array is scanned once for its nonzero
    words, which each of its rows then reads alone (pass one array for the rows of one
    grammar state: ``samplers.grammar.masks.shared_rows``); threads are woken only for
    enough nonzero words to share.

    ``rows``: a sequence of 1-D float32 rows, row ``r`` being ``rows[r]``; or one 2-D
    C-contiguous float32 matrix with ``row_index`` (one index per mask; default
    ``0..len(masks)-1``), row ``r`` being ``rows[row_index[r]]``: the rows of a decode's
    outputs, checked once instead of row by row."""
    expect_iterable("masks", masks, "a sequence of 1-D uint32 masks")
    if type(k) is not int:
        k = expect_int("k", k)
    if type(n_threads) is not int:
        n_threads = expect_int("n_threads", n_threads)
    masks = list(masks)
    m = len(masks)
    matrix: npt.NDArray[np.float32] | None = None
    index: npt.NDArray[np.uintp] | None = None
    if isinstance(rows, np.ndarray) and rows.ndim == 2:
        if rows.dtype != np.float32 or not rows.flags.c_contiguous:
            raise TypeError("rows must be a 2-D C-contiguous float32 ndarray (or a sequence of 1-D rows)")
        if row_index is None:
            if rows.shape[0] < m:
                raise ValueError(f"{m} masks and {rows.shape[0]} rows")
            idx = np.arange(m, dtype=np.int64)
        else:
            idx = np.asarray(row_index)
            if idx.ndim != 1 or len(idx) != m or (m and idx.dtype.kind not in "iu"):
                raise TypeError(f"row_index must be a 1-D array of {m} integers (one per mask)")
            if m and (int(idx.min()) < 0 or int(idx.max()) >= rows.shape[0]):
                raise ValueError(f"row_index out of range [0, {rows.shape[0]})")
        matrix, n = rows, rows.shape[1]
        index = idx.astype(np.uintp)
    else:
        if row_index is not None:
            raise TypeError("row_index goes with a 2-D matrix of rows")
        expect_iterable("rows", rows, "a sequence of 1-D float32 rows")
        rows = list(rows)
        if len(rows) != m:
            raise ValueError(f"{len(rows)} rows and {m} masks")
        n = -1
    for name, a, dt in (("ids", ids, np.int32), ("logits", logits, np.float32)):
        if not isinstance(a, np.ndarray) or a.dtype != dt or a.ndim != 2 or a.shape != (m, k):
            raise TypeError(f"{name} must be a 2-D {np.dtype(dt).name} ndarray of shape ({m}, {k})")
        if not a.flags.c_contiguous or not a.flags.writeable:
            raise ValueError(f"{name} must be C-contiguous and writable")
    n_finite = np.zeros(m, dtype=np.int32)
    if m == 0:
        return n_finite
    row_ptrs: list[Any] = []
    if matrix is None:
        for r, row in enumerate(rows):
            ok = isinstance(row, np.ndarray) and row.dtype == np.float32 and row.ndim == 1
            if not ok or not row.flags.c_contiguous:
                raise TypeError(f"rows[{r}] must be a 1-D C-contiguous float32 ndarray")
            if n < 0:
                n = row.shape[0]
            elif row.shape[0] != n:
                raise ValueError(f"rows[{r}] has {row.shape[0]} values, rows[0] {n}")
            row_ptrs.append(ffi.from_buffer("float[]", row))
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= len(row): k={k}, {n} values")
    mask_ptrs: list[Any] = []
    last: Any = None  # the last mask checked, and its buffer (rows in one state share one)
    for r, words in enumerate(masks):
        if words is not last:
            if not isinstance(words, np.ndarray) or words.dtype != np.uint32 or words.ndim != 1:
                raise TypeError(f"masks[{r}] must be a 1-D uint32 ndarray")
            if len(words) < (n + 31) // 32 or not words.flags.c_contiguous:
                raise ValueError(f"masks[{r}] must be C-contiguous with at least {(n + 31) // 32} words")
            last, last_ptr = words, ffi.from_buffer("uint32_t[]", words)
        mask_ptrs.append(last_ptr)
    if matrix is not None:
        assert index is not None
        base = ffi.from_buffer("float[]", matrix)  # (kept alive over the call: the rows' memory)
        addr = index * np.uintp(n * 4) + np.uintp(int(ffi.cast("uintptr_t", base)))
        rows_c = ffi.cast("float **", ffi.from_buffer("uintptr_t[]", addr))
    else:
        rows_c = ffi.new("float *[]", row_ptrs)
    rc = lib.llama_cffi_masked_top_k_rows(
        m,
        n,
        rows_c,
        ffi.new("uint32_t *[]", mask_ptrs),
        k,
        ffi.from_buffer("int32_t[]", ids),
        ffi.from_buffer("float[]", logits),
        ffi.from_buffer("int32_t[]", n_finite),
        max(1, min(n_threads, 64)),
    )
    if rc == -2:
        raise ValueError("a row holds NaN at a position its mask allows")
    if rc < 0:
        raise MemoryError("masked_top_k_rows: out of memory")
    return n_finite


def _group_max(row: npt.NDArray[np.float32], gmax: npt.NDArray[np.float32]) -> float:
    """Fill ``gmax`` with the summary :func:`top_k_grouped` reads (``cols = len(gmax)``,
    ``64 * cols <= len(row)``; no argument checks) and return ``row``'s max, tail included:
    one pass over the row, and NaN when any value is NaN (a max over a NaN is NaN)."""
    cols = gmax.shape[0]
    np.maximum.reduce(row[: cols * _GROUPS].reshape(_GROUPS, cols), axis=0, out=gmax)
    m = gmax.max()
    if cols * _GROUPS < row.shape[0]:
        m = np.maximum(m, row[cols * _GROUPS :].max())
    return float(m)


def _top_k_grouped(
    row: npt.NDArray[np.float32], gmax: npt.NDArray[np.float32], k: int, out: npt.NDArray[np.intp]
) -> npt.NDArray[np.intp]:
    """:func:`top_k_grouped` without the argument checks, for callers that own the arrays."""
    got = lib.llama_cffi_top_k_grouped(
        row.shape[0],
        ffi.from_buffer("float[]", row),
        gmax.shape[0],
        ffi.from_buffer("float[]", gmax),
        k,
        ffi.from_buffer("int64_t[]", out),
    )
    if got != k:
        raise MemoryError("top_k_grouped: out of memory")
    return out[:k]


# ---------------------------------------------------------------------- many rows at once
class RowStatus(enum.IntEnum):
    """What :class:`RowMeasures` found in a row."""

    OK = 0
    NAN = 1  #: a value is NaN: no measure and no candidates
    POS_INF = 2  #: a value is +inf: no measure (the distribution is undefined)
    ALL_NEG_INF = 3  #: every value is -inf: no measure
    #: read from the device (:meth:`RowMeasures.read_device`): measures as OK, but the logit
    #: at the cut is shared up to the last candidate that came back, so tokens beyond may
    #: tie with it and which of them a stable sort keeps is unknown
    TIE_AT_CUT = 4


def default_threads() -> int:
    """Threads :class:`RowMeasures` uses unless told: the cores this process may run on."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(os.cpu_count() or 1, 1)


class RowMeasures:
    """Measures and best candidates of many logits rows, computed in one call, kept per
    *slot* (a caller's index: a branch's sequence id, say) until that slot is computed again.

    For each row of ``n_vocab`` float32 logits :meth:`compute` finds, in C on up to
    ``n_threads`` threads with the GIL released:

    * ``max``: the largest logit;
    * ``log_norm``: ``log(sum(exp(row - max)))``, so the log-partition function is
      ``max + log_norm`` and the surprisal of token ``t`` is
      ``(max - row[t]) + log_norm`` nats (:meth:`surprisal`);
    * ``entropy``: ``-sum(p log p)`` of ``softmax(row)`` in nats, clamped to ``[0, log n]``;
    * the ``k`` largest logits and their ids, descending, ties by lower id (the order of a
      stable sort by ``-row``: :class:`samplers.TopK` keeps the same ones), when asked.

    Arithmetic: the exponentials are ggml's soft_max kernel with the row's maximum, as
    :func:`softmax_sum` computes them (bit for bit); the sums are float64, taken in blocks
    of 4,096 values, and the entropy's products are summed in vector lanes, so
    ``log_norm`` and ``entropy`` differ from :mod:`samplers.measure`'s one-row functions by
    rounding in float64's last digits (a relative difference near 1e-15). The row is read
    once from memory (a group-maximum pass), then block by block from cache.

    Rows are only read, during the call; nothing refers to them afterwards. The result
    arrays are owned here and overwritten slot by slot; read them, or :meth:`copy_slot`,
    before the next :meth:`compute` of the same slot.

    ``status[slot]`` is a :class:`RowStatus`: rows with NaN get no measure and no
    candidates; rows with ``+inf`` or only ``-inf`` get candidates but NaN measures.
    """

    __slots__ = (
        "_addrs",
        "_cap",
        "_dest",
        "_k",
        "_measure",
        "entropy",
        "k_stride",
        "log_norm",
        "max",
        "n_threads",
        "n_top",
        "n_vocab",
        "slots",
        "status",
        "top_ids",
        "top_logits",
    )

    def __init__(self, n_vocab: int, slots: int, k: int = 0, n_threads: int | None = None) -> None:
        n_vocab = expect_int("n_vocab", n_vocab)
        slots = expect_int("slots", slots)
        if n_vocab < 1:
            raise ValueError(f"n_vocab must be an int >= 1, not {n_vocab!r}")
        if slots < 1:
            raise ValueError(f"slots must be an int >= 1, not {slots!r}")
        self.n_vocab = n_vocab
        self.slots = slots
        self.n_threads = default_threads() if n_threads is None else _positive("n_threads", n_threads)
        self.max = np.full(slots, np.nan, dtype=np.float32)
        self.log_norm = np.full(slots, np.nan, dtype=np.float64)
        self.entropy = np.full(slots, np.nan, dtype=np.float64)
        self.status = np.zeros(slots, dtype=np.int32)
        self.n_top = np.zeros(slots, dtype=np.int32)
        self.k_stride = 0
        self.top_ids = np.zeros((slots, 0), dtype=np.int32)
        self.top_logits = np.zeros((slots, 0), dtype=np.float32)
        self._cap = 0
        self._addrs = np.zeros(0, dtype=np.uintp)
        self._k = np.zeros(0, dtype=np.int32)
        self._dest = np.zeros(0, dtype=np.int32)
        self._measure = np.zeros(0, dtype=np.int32)
        self.reserve(k)

    def reserve(self, k: int) -> None:
        """Make room for ``k`` candidates per slot (kept candidates stay)."""
        k = expect_int("k", k)
        if k < 0:
            raise ValueError(f"k must be an int >= 0, not {k!r}")
        k = min(k, self.n_vocab)
        if k <= self.k_stride:
            return
        ids = np.zeros((self.slots, k), dtype=np.int32)
        lg = np.zeros((self.slots, k), dtype=np.float32)
        ids[:, : self.k_stride] = self.top_ids
        lg[:, : self.k_stride] = self.top_logits
        self.top_ids, self.top_logits, self.k_stride = ids, lg, k

    def _grow(self, n: int) -> None:
        if n > self._cap:
            cap = max(n, 2 * self._cap, 16)
            self._addrs = np.zeros(cap, dtype=np.uintp)
            self._k = np.zeros(cap, dtype=np.int32)
            self._dest = np.zeros(cap, dtype=np.int32)
            self._measure = np.zeros(cap, dtype=np.int32)
            self._cap = cap

    def compute(
        self,
        rows: npt.NDArray[np.float32] | Sequence[npt.NDArray[np.float32]],
        slots: Sequence[int] | npt.NDArray[np.integer[Any]],
        k: int | Sequence[int] | npt.NDArray[np.integer[Any]] = 0,
        measure: bool | Sequence[bool] | npt.NDArray[np.bool_] = True,
    ) -> None:
        """Compute row ``i`` of ``rows`` (a C-contiguous ``(m, n_vocab)`` float32 array, or a
        sequence of 1-D ones) into slot ``slots[i]``, with ``k`` (one for all, or one per row)
        candidates; ``measure`` (one for all, or one per row) False skips ``log_norm`` and
        ``entropy`` (most of the work; the slot keeps the ones it had: whoever reads
        them knows which row they belong to). Raises :class:`ValueError`/:class:`TypeError` on arguments
        that do not fit, before any row is read; :class:`MemoryError` when C runs out."""
        if not isinstance(rows, np.ndarray):
            expect_iterable("rows", rows, "a 2-D float32 array or a sequence of 1-D ones")
        sl = expect_array("slots", slots, "a sequence of slot numbers (ints)", "iu")
        ks = expect_array("k", k, "an int or a sequence of ints", "iu")
        ms = expect_array("measure", measure, "a bool or a sequence of bools", "biu")
        addrs, m = self._addresses(rows)
        if sl.shape != (m,) or (m and not np.issubdtype(sl.dtype, np.integer)):
            raise ValueError(f"slots must be {m} ints, not {slots!r}")
        if m and (int(sl.min()) < 0 or int(sl.max()) >= self.slots):
            raise ValueError(f"a slot is outside [0, {self.slots})")
        if m > 1 and len(np.unique(sl)) != m:
            raise ValueError("two rows cannot share a slot")
        if ks.ndim == 0:
            ks = np.full(m, int(ks), dtype=np.int64)
        if ks.shape != (m,) or (m and not np.issubdtype(ks.dtype, np.integer)):
            raise ValueError(f"k must be an int or {m} ints, not {k!r}")
        if m and (int(ks.min()) < 0 or int(ks.max()) > self.k_stride):
            raise ValueError(f"k must be in [0, {self.k_stride}] (reserve() more first)")
        if ms.ndim == 0:
            ms = np.full(m, bool(ms))
        if ms.shape != (m,):
            raise ValueError(f"measure must be a bool or {m} bools, not {measure!r}")
        if m == 0:
            return
        self._grow(m)
        self._addrs[:m] = addrs
        self._dest[:m] = sl
        self._k[:m] = ks
        self._measure[:m] = ms
        self._run(m)
        del rows  # the rows were read during the call only

    def _compute(self, rows: npt.NDArray[np.float32], slots: list[int], ks: list[int], measure: list[bool]) -> None:
        """:meth:`compute` without the argument checks, for a caller that made the arguments
        (a C-contiguous ``(m, n_vocab)`` float32 ``rows``; distinct slots in range; ``0 <=
        k <= k_stride``): the per-step path of a branch store, a few microseconds shorter."""
        m = len(slots)
        self._grow(m)
        base = int(ffi.cast("uintptr_t", ffi.from_buffer("float[]", rows)))
        np.multiply(np.arange(m, dtype=np.uintp), np.uintp(4 * self.n_vocab), out=self._addrs[:m])
        self._addrs[:m] += np.uintp(base)
        self._dest[:m] = slots
        self._k[:m] = ks
        self._measure[:m] = measure
        self._run(m)

    def _run(self, m: int) -> None:
        rc = lib.llama_cffi_rows_measure(
            m,
            ffi.from_buffer("float *[]", self._addrs),
            self.n_vocab,
            ffi.from_buffer("int32_t[]", self._k),
            ffi.from_buffer("int32_t[]", self._dest),
            self.k_stride,
            ffi.from_buffer("int32_t[]", self._measure),
            self.n_threads,
            *self._outputs(),
        )
        if rc == -2:
            raise MemoryError("RowMeasures.compute: out of memory")
        if rc != 0:  # pragma: no cover - the arguments were checked above
            raise ValueError("RowMeasures.compute: arguments refused by the kernel")

    def _outputs(self) -> tuple[Any, ...]:
        """The per-slot result arrays, as the C functions take them (in their order)."""
        return (
            ffi.from_buffer("float[]", self.max),
            ffi.from_buffer("double[]", self.log_norm),
            ffi.from_buffer("double[]", self.entropy),
            ffi.from_buffer("int32_t[]", self.status),
            ffi.from_buffer("int32_t[]", self.n_top),
            ffi.from_buffer("int32_t[]", self.top_ids) if self.k_stride else ffi.NULL,
            ffi.from_buffer("float[]", self.top_logits) if self.k_stride else ffi.NULL,
        )

    def _addresses(self, rows: Any) -> tuple[npt.NDArray[np.uintp], int]:
        n = self.n_vocab
        if isinstance(rows, np.ndarray):
            if rows.dtype != np.float32 or rows.ndim != 2 or not rows.flags.c_contiguous or rows.shape[1] != n:
                raise TypeError(f"rows must be a C-contiguous (m, {n}) float32 array, not {rows.dtype} {rows.shape}")
            m = rows.shape[0]
            base = int(ffi.cast("uintptr_t", ffi.from_buffer("float[]", rows)))
            return np.uintp(base) + np.arange(m, dtype=np.uintp) * np.uintp(4 * n), m
        seq = list(rows)
        out = np.zeros(len(seq), dtype=np.uintp)
        for i, r in enumerate(seq):
            if not isinstance(r, np.ndarray) or r.dtype != np.float32 or r.shape != (n,) or not r.flags.c_contiguous:
                raise TypeError(f"row {i} must be a C-contiguous 1-D float32 array of {n} values")
            out[i] = int(ffi.cast("uintptr_t", ffi.from_buffer("float[]", r)))
        return out, len(seq)

    def read_device(
        self,
        ctx_ptr: Any,
        idx: Sequence[int] | npt.NDArray[np.integer[Any]],
        slots: Sequence[int] | npt.NDArray[np.integer[Any]],
        k: int | Sequence[int] | npt.NDArray[np.integer[Any]],
    ) -> None:
        """Fill ``slots[i]`` from what a backend sampling chain (``[LlamaSampler.measure(),
        top_k(K)]``, see :meth:`llama_cffi.Context.set_backend_sampler`) left for output
        ``idx[i]`` (a batch index) of the last decode of the context ``ctx_ptr`` (a
        ``llama_context *``): the measures the device computed, and the candidates that came
        back (up to ``k_stride``; none where ``k`` is 0) sorted by descending logit, then
        ascending id; ``k`` is where the branch's sampler cuts (status
        :attr:`RowStatus.TIE_AT_CUT` when the logit there is tied up to the last candidate
        that came back). The device's arithmetic is ggml's (float32 sums on a GPU), so the
        measures equal :meth:`compute`'s to float32 precision, not bit for bit."""
        if not isinstance(ctx_ptr, ffi.CData):
            raise type_error("ctx_ptr", "a llama_context * (cdata)", ctx_ptr)
        ix = expect_array("idx", idx, "a sequence of batch indices (ints)", "iu").astype(np.int64, copy=False)
        sl = expect_array("slots", slots, "a sequence of slot numbers (ints)", "iu")
        ks = expect_array("k", k, "an int >= 0 or a sequence of them", "iu")
        m = len(ix)
        if ix.shape != (m,) or sl.shape != (m,) or (m and not np.issubdtype(sl.dtype, np.integer)):
            raise ValueError("idx and slots must be 1-D and of one length")
        if m and (int(sl.min()) < 0 or int(sl.max()) >= self.slots or int(ix.min()) < 0):
            raise ValueError(f"a slot is outside [0, {self.slots}) or an index is negative")
        if ks.ndim == 0:
            ks = np.full(m, int(ks), dtype=np.int64)
        if ks.shape != (m,) or (m and int(ks.min()) < 0):
            raise ValueError(f"k must be an int >= 0 or {m} of them, not {k!r}")
        if m == 0:
            return
        self._grow(m)
        idx32 = self._measure[:m]  # the measure flags' buffer holds the indices here
        idx32[:] = ix
        self._dest[:m] = sl
        self._k[:m] = ks
        rc = lib.llama_cffi_rows_from_device(
            ctx_ptr,
            m,
            ffi.from_buffer("int32_t[]", idx32),
            ffi.from_buffer("int32_t[]", self._dest),
            ffi.from_buffer("int32_t[]", self._k),
            self.k_stride,
            self.n_vocab,
            *self._outputs(),
        )
        if rc == -2:
            raise MemoryError("RowMeasures.read_device: out of memory")
        if rc != 0:  # pragma: no cover - checked above
            raise ValueError("RowMeasures.read_device: arguments refused")

    # -- reading one slot
    def surprisal(self, slot: int, logit: float) -> float:
        """``-log softmax(row)[t]`` in nats for the token whose logit in the row of
        ``slot`` is ``logit`` (``(max - logit) + log_norm``, as
        :func:`samplers.measure.surprisal` computes it); ``inf`` for a ``-inf`` logit or
        an all ``-inf`` row; NaN when the row had NaN or ``+inf``, or was not measured."""
        slot = expect_int("slot", slot)
        if type(logit) is not float:
            logit = expect_number("logit", logit)
        m = float(self.max[slot])
        if m == -math.inf or logit == -math.inf:
            return math.inf
        return (m - float(logit)) + float(self.log_norm[slot])

    def candidates(self, slot: int, k: int | None = None) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]:
        """Views of the first ``k`` (default: all) candidates of ``slot``: ids and logits."""
        slot = expect_int("slot", slot)
        n = int(self.n_top[slot]) if k is None else min(expect_int("k", k, "an int or None"), int(self.n_top[slot]))
        return self.top_ids[slot, :n], self.top_logits[slot, :n]

    def copy_slot(self, src: int, dst: int) -> None:
        """Slot ``dst`` becomes a copy of slot ``src`` (a forked branch shares its parent's row)."""
        src, dst = expect_int("src", src), expect_int("dst", dst)
        for a in (self.max, self.log_norm, self.entropy, self.status, self.n_top):
            a[dst] = a[src]
        if self.k_stride:
            self.top_ids[dst] = self.top_ids[src]
            self.top_logits[dst] = self.top_logits[src]


def rows_log_sum(
    x: npt.NDArray[np.float32], n: npt.NDArray[np.int32], max_values: npt.NDArray[np.float32]
) -> npt.NDArray[np.float64]:
    """``log(softmax_sum(x[r, :n[r]], max_values[r]))`` for every row ``r`` of the C-contiguous
    float32 matrix ``x``: what :func:`samplers.measure` computes for one row, for many
    (the same kernel, so the same bits). NaN where ``n[r]`` is 0."""
    if not isinstance(x, np.ndarray) or not (x.dtype == np.float32 and x.ndim == 2 and x.flags.c_contiguous):
        raise type_error("x", "a C-contiguous 2-D float32 array", x)
    g, stride = x.shape
    nn = np.ascontiguousarray(expect_array("n", n, "an array of row lengths (ints)", "iu"), dtype=np.int32)
    mx = np.ascontiguousarray(expect_array("max_values", max_values, "an array of row maxima"), dtype=np.float32)
    if nn.shape != (g,) or mx.shape != (g,) or (g and (int(nn.min()) < 0 or int(nn.max()) > stride)):
        raise ValueError(f"n and max_values must hold {g} values, n within [0, {stride}]")
    out = np.empty(g, dtype=np.float64)
    if g == 0 or stride == 0:
        out[:] = math.nan
        return out
    rc = lib.llama_cffi_rows_log_sum(
        g,
        ffi.from_buffer("float[]", x),
        stride,
        ffi.from_buffer("int32_t[]", nn),
        ffi.from_buffer("float[]", mx),
        ffi.from_buffer("double[]", out),
    )
    if rc == -2:
        raise MemoryError("rows_log_sum: out of memory")
    return out


def top_p_rows(
    x: npt.NDArray[np.float32], pr: npt.NDArray[np.float32], n: npt.NDArray[np.int32], p: float, min_keep: int
) -> None:
    """A top-p step on rows of sorted candidates, in place, in numpy's float32 arithmetic
    (``samplers.chain_batch.choose``'s, whose numpy code is the reference): ``x`` and ``pr``
    (C-contiguous float32, ``(rows, k)``) hold each row's logits and ``exp(x - x[:, :1])``,
    ``n`` (int32, one per row, each in ``[1, k]``) how many candidates are still in. Each
    ``n[r]`` becomes the length of the shortest prefix whose normalised running sum reaches
    ``p`` (float32), taken at position ``min_keep - 1`` or later (unchanged when none
    does), and ``x[r, n[r]:]`` becomes ``-inf``."""
    _rows_args(x, pr, n)
    if not isinstance(p, float | int | np.floating):
        raise type_error("p", "a float", p)
    if type(min_keep) is not int:
        min_keep = expect_int("min_keep", min_keep)
    if lib.llama_cffi_top_p_rows(
        x.shape[0],
        x.shape[1],
        ffi.from_buffer("float[]", x),
        ffi.from_buffer("float[]", pr),
        ffi.from_buffer("int32_t[]", n),
        float(p),
        max(min(min_keep, 1 << 30), -(1 << 30)),
    ):
        raise ValueError(f"n must hold values in [1, {x.shape[1]}]")


def dist_rows(
    pr: npt.NDArray[np.float32], n: npt.NDArray[np.int32], u: npt.NDArray[np.float64]
) -> npt.NDArray[np.intp]:
    """The dist step on rows of sorted candidates, in numpy's arithmetic (see
    :func:`top_p_rows`): for row ``r`` of ``pr`` (C-contiguous float32, ``(rows, k)``,
    ``exp(x - x[:, :1])``; zero past ``n[r]``), the first position whose float64 running
    sum reaches that sum at ``n[r] - 1`` times ``u[r]``, at most ``n[r] - 1``."""
    _rows_args(pr, pr, n, "pr")
    if not isinstance(u, np.ndarray) or u.dtype != np.float64 or u.shape != (pr.shape[0],):
        raise type_error("u", f"a float64 array of {pr.shape[0]} draws", u)
    sel = np.empty(pr.shape[0], dtype=np.int32)
    if lib.llama_cffi_dist_rows(
        pr.shape[0],
        pr.shape[1],
        ffi.from_buffer("float[]", pr),
        ffi.from_buffer("int32_t[]", n),
        ffi.from_buffer("double[]", np.ascontiguousarray(u)),
        ffi.from_buffer("int32_t[]", sel),
    ):
        raise ValueError(f"n must hold values in [1, {pr.shape[1]}]")
    return sel.astype(np.intp)


def _rows_args(x: Any, pr: Any, n: Any, x_name: str = "x") -> None:
    """The checks :func:`top_p_rows` and :func:`dist_rows` share (C reads every index)."""
    for name, a in ((x_name, x), ("pr", pr)):
        if not isinstance(a, np.ndarray) or a.dtype != np.float32 or a.ndim != 2 or not a.flags.c_contiguous:
            raise type_error(name, "a C-contiguous 2-D float32 array", a)
    if pr.shape != x.shape or x.shape[1] == 0:
        raise ValueError(f"{x_name} and pr must have one shape with k >= 1, not {x.shape} and {pr.shape}")
    if not x.flags.writeable:
        raise ValueError(f"{x_name} must be writable")
    if not isinstance(n, np.ndarray) or n.dtype != np.int32 or n.shape != (x.shape[0],) or not n.flags.writeable:
        raise type_error("n", f"a writable int32 array of {x.shape[0]} counts", n)
    if not n.flags.c_contiguous:
        raise ValueError("n must be C-contiguous")


def _kl_args(
    logits: npt.NDArray[np.float32], tokens: npt.ArrayLike, n_threads: int | None
) -> tuple[int, int, npt.NDArray[np.int32], int]:
    if not (
        isinstance(logits, np.ndarray)
        and logits.dtype == np.float32
        and logits.ndim == 2
        and logits.flags.aligned
        and logits.shape[1] > 0
        and logits.strides[1] == 4
        and logits.strides[0] % 4 == 0
        and logits.strides[0] >= 4 * logits.shape[1]
    ):
        raise type_error("logits", "a 2-D float32 array of rows, each contiguous, at least one column", logits)
    n_rows, n_vocab = logits.shape
    tok = np.ascontiguousarray(expect_array("tokens", tokens, "one token id per row (ints)", "iu"), dtype=np.int32)
    if tok.shape != (n_rows,):
        raise ValueError(f"tokens must hold one id per row ({n_rows}), not shape {tok.shape}")
    if n_rows and (int(tok.min()) < 0 or int(tok.max()) >= n_vocab):
        raise ValueError(f"tokens must lie in [0, {n_vocab})")
    threads = default_threads() if n_threads is None else _positive("n_threads", n_threads)
    return n_rows, n_vocab, tok, threads


def kl_row_values(n_vocab: int) -> int:
    """uint16 values per row of a ``llama-perplexity --kl-divergence-base`` file: the
    header (two float32), the ``n_vocab`` quantised log-probabilities, and padding to an
    even count."""
    n = expect_int("n_vocab", n_vocab, "an int >= 1")
    if n < 1:
        raise ValueError(f"n_vocab must be an int >= 1, not {n_vocab!r}")
    return 2 * ((n + 1) // 2) + 4


def _kl_base_out(name: str, a: object, n_rows: int, n_vocab: int) -> npt.NDArray[np.uint16]:
    nv = kl_row_values(n_vocab)
    if not (
        isinstance(a, np.ndarray)
        and a.dtype == np.uint16
        and a.ndim == 2
        and a.shape[0] >= n_rows
        and a.shape[1] == nv
        and a.flags.c_contiguous
    ):
        raise type_error(name, f"a C-contiguous (>= {n_rows}, {nv}) uint16 array", a)
    return a


def kl_base_rows(
    logits: npt.NDArray[np.float32],
    tokens: npt.ArrayLike,
    out: npt.NDArray[np.uint16],
    n_threads: int | None = None,
) -> npt.NDArray[np.float64]:
    """``llama-perplexity --kl-divergence-base``'s work for many rows (``log_softmax(n_vocab,
    logits, log_prob, tok)`` of ``tools/perplexity/perplexity.cpp``, in C, operation by
    operation): row ``r`` of ``logits`` (float32, each row contiguous) becomes the base-file
    row ``out[r]`` (:func:`kl_row_values` uint16: ``scale`` and ``min_log_prob`` as float32,
    the quantised log-probabilities, zeroed padding), and the result's ``[r]`` is
    ``-log p(tokens[r])`` in nats (computed in float32, as there). A row holding NaN, or
    whose maximum is not finite, gets NaN and its ``out`` row is left as it was.

    On ``n_threads`` threads (default: the usable cores) with the GIL released; the bytes
    and values equal the tool's (same C library, no fused multiply-adds).
    :func:`samplers.kl_divergence._quantise_row` is the numpy reference. Nothing is
    retained; ``out`` is written, ``logits`` only read."""
    n_rows, n_vocab, tok, threads = _kl_args(logits, tokens, n_threads)
    dst = _kl_base_out("out", out, n_rows, n_vocab)
    res = np.empty(n_rows, np.float64)
    if n_rows == 0:
        return res
    rc = lib.llama_cffi_kl_base_rows(
        n_rows,
        n_vocab,
        ffi.cast("const float *", logits.ctypes.data),
        logits.strides[0] // 4,
        ffi.from_buffer("int32_t[]", tok),
        ffi.from_buffer("uint16_t[]", dst),
        dst.shape[1],
        threads,
        ffi.from_buffer("double[]", res),
    )
    if rc != 0:  # pragma: no cover - every argument was checked above
        raise ValueError("kl_base_rows: bad arguments")
    return res


class KLRows(NamedTuple):
    """:func:`kl_divergence_rows`' values, one per row: ``nll`` and ``nll_base`` (``-log
    p`` of the row's token under the compared and the base model, float32 as the tool
    computes them), ``kld`` (the KL divergence, nats, float64), ``same_top`` (whether both
    top tokens agree), ``p_diff`` (``p - p_base``, float32), ``ok`` (False for a row that
    holds NaN or whose maximum is not finite: its other values are undefined)."""

    nll: npt.NDArray[np.float32]
    nll_base: npt.NDArray[np.float32]
    kld: npt.NDArray[np.float64]
    same_top: npt.NDArray[np.bool_]
    p_diff: npt.NDArray[np.float32]
    ok: npt.NDArray[np.bool_]


def kl_divergence_rows(
    logits: npt.NDArray[np.float32],
    tokens: npt.ArrayLike,
    base: npt.NDArray[np.uint16],
    n_threads: int | None = None,
) -> KLRows:
    """``llama-perplexity --kl-divergence``'s work for many rows (``log_softmax(n_vocab,
    logits, base_log_prob, tok, kld)`` of ``tools/perplexity/perplexity.cpp``, in C,
    operation by operation): row ``r`` of ``logits`` compared with the base-file row
    ``base[r]`` (as :func:`kl_base_rows` writes them) for the token ``tokens[r]``; the
    values the tool adds up (:class:`KLRows`; the sums are the caller's).

    On ``n_threads`` threads (default: the usable cores) with the GIL released; the values
    equal the tool's. :func:`samplers.kl_divergence._kl_row` is the numpy reference.
    Nothing is retained; the arrays are only read."""
    n_rows, n_vocab, tok, threads = _kl_args(logits, tokens, n_threads)
    b = _kl_base_out("base", base, n_rows, n_vocab)
    nll = np.empty(n_rows, np.float32)
    nll_base = np.empty(n_rows, np.float32)
    kld = np.empty(n_rows, np.float64)
    same = np.empty(n_rows, np.int32)
    p_diff = np.empty(n_rows, np.float32)
    status = np.empty(n_rows, np.int32)
    if n_rows:
        rc = lib.llama_cffi_kl_rows(
            n_rows,
            n_vocab,
            ffi.cast("const float *", logits.ctypes.data),
            logits.strides[0] // 4,
            ffi.from_buffer("int32_t[]", tok),
            ffi.from_buffer("uint16_t[]", b),
            b.shape[1],
            threads,
            ffi.from_buffer("float[]", nll),
            ffi.from_buffer("float[]", nll_base),
            ffi.from_buffer("double[]", kld),
            ffi.from_buffer("int32_t[]", same),
            ffi.from_buffer("float[]", p_diff),
            ffi.from_buffer("int32_t[]", status),
        )
        if rc != 0:  # pragma: no cover - every argument was checked above
            raise ValueError("kl_divergence_rows: bad arguments")
    return KLRows(nll, nll_base, kld, same != 0, p_diff, status == 0)


def _positive(name: str, v: object) -> int:
    n = expect_int(name, v, "an int >= 1")  # a wrong type: TypeError naming the parameter
    if n < 1:
        raise ValueError(f"{name} must be an int >= 1, not {v!r}")
    return n


def rows_reference(
    row: npt.NDArray[np.float32], k: int = 0
) -> tuple[float, float, float, RowStatus, npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """What :class:`RowMeasures` computes for one row, in plain numpy (float64
    exponentials): ``(max, log_norm, entropy, status, top ids, top logits)``. The tested
    reference of the C kernel."""
    x = expect_array("row", row, "a 1-D array of logits").astype(np.float32, copy=False)
    k = expect_int("k", k)
    if np.isnan(x).any():
        return math.nan, math.nan, math.nan, RowStatus.NAN, np.zeros(0, np.int64), np.zeros(0, np.float32)
    m = float(x.max())
    order = np.argsort(-x, kind="stable")[: min(k, len(x))]
    top = (order.astype(np.int64), x[order])
    if m == math.inf:
        return m, math.nan, math.nan, RowStatus.POS_INF, *top
    if m == -math.inf:
        return m, math.nan, math.nan, RowStatus.ALL_NEG_INF, *top
    d = (x - np.float32(m)).astype(np.float64)  # the shift in float32, as llama.cpp
    e = np.exp(d)
    s = float(e.sum())
    fin = np.isfinite(d)
    h = math.log(s) - float((e[fin] * d[fin]).sum()) / s
    return m, math.log(s), min(max(h, 0.0), math.log(len(x))), RowStatus.OK, *top
