"""Candidates: the tokens a sampler chooses among (llama.cpp's ``llama_token_data_array``).

Three parallel arrays of the current candidates, ``ids`` (int32), ``logits`` and ``p``
(float32), plus ``sorted`` (descending by logit) and ``selected`` (index of the chosen
candidate, -1 until a sampler picks one).

Zero copy where it can be: :meth:`Candidates.reset` *borrows* a logits row (a context's
output view is not copied) and treats the ids as ``0..n-1`` without writing them. The
first sampler that changes logits in place (``cands.logits`` is writable) copies the row
into the candidates' own buffer; samplers that only shrink the set (top-k, min-p, ...)
gather the survivors straight from the row. The buffers are allocated once per
capacity and reused, so the per-token path allocates nothing vocabulary-sized.

A borrowed row must not change while it is borrowed, i.e. until the next :meth:`Candidates.reset`
or any write access; samplers run between a decode and the next one, so a context's
logits view qualifies.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import numpy.typing as npt

from llama_cffi._args import expect_array, expect_bool, expect_int, type_error
from llama_cffi.kernels import _group_max, _top_k_grouped
from llama_cffi.sampling import InvalidLogitsError

IntArray = npt.NDArray[np.int32]
IndexArray = npt.NDArray[np.intp]
FloatArray = npt.NDArray[np.float32]


_GROUPS = 64  # a borrowed row of n >= _GROUPED_MIN is summarised by n/64 group maxima
_GROUPED_MIN = 8192


def _stable_top(vals: FloatArray, pos: IndexArray, k: int) -> IndexArray:
    """The ``pos`` of the ``k`` largest ``vals`` (``1 <= k``, no NaN), in the order of a
    stable sort by ``-vals``: largest first, equal values by ascending ``pos`` (``pos``
    ascending), whichever equal values argpartition happened to pick at the cut."""
    m = len(pos)
    if m > k:
        part = np.argpartition(vals, m - k)[m - k :]
        kth = vals[part].min()
        if np.count_nonzero(vals >= kth) > k:
            # equal values at the cut: prefer lower positions, like a stable sort would
            above = np.flatnonzero(vals > kth)
            ties = np.flatnonzero(vals == kth)[: k - len(above)]
            part = np.concatenate([above, ties])
        pos, vals = pos[part], vals[part]
    order = np.lexsort((pos, -vals))
    out: IndexArray = pos[order]
    return out


class Candidates:
    """The candidate set of one sampling step (see the module docstring)."""

    __slots__ = (
        "_arange",
        "_cap",
        "_gmax",
        "_gn",
        "_identity",
        "_ids",
        "_logits",
        "_mask",
        "_n",
        "_p",
        "_p_valid",
        "_scratch",
        "_scratch64",
        "_src",
        "selected",
        "sorted",
    )

    def __init__(self, capacity: int = 0) -> None:
        capacity = expect_int("capacity", capacity)
        self._cap = 0
        self._ids: IntArray = np.empty(0, np.int32)
        self._logits: FloatArray = np.empty(0, np.float32)
        self._p: FloatArray = np.empty(0, np.float32)
        self._arange: IntArray = np.empty(0, np.int32)
        self._mask: npt.NDArray[np.bool_] = np.empty(0, bool)
        self._scratch: FloatArray = np.empty(0, np.float32)
        self._scratch64: npt.NDArray[np.float64] = np.empty(0, np.float64)
        self._gmax: FloatArray = np.empty(0, np.float32)
        self._gn = -1  # size of the borrowed row _gmax summarises (-1: none)
        self._src: FloatArray | None = None
        self._n = 0
        self._identity = False
        self._p_valid = False
        self.sorted = False
        self.selected = -1
        if capacity:
            self._grow(capacity)

    # ------------------------------------------------------------------ construction
    def _grow(self, n: int) -> None:
        if n <= self._cap:
            return
        cap = max(n, 16)
        ids, logits, p = self._ids, self._logits, self._p
        self._ids = np.empty(cap, np.int32)
        self._logits = np.empty(cap, np.float32)
        self._p = np.empty(cap, np.float32)
        m = self._n if self._src is None else 0
        self._ids[:m] = ids[:m]
        self._logits[:m] = logits[:m]
        self._p[:m] = p[:m]
        self._arange = np.arange(cap, dtype=np.int32)
        self._arange.flags.writeable = False
        self._mask = np.empty(cap, bool)
        self._scratch = np.empty(cap, np.float32)
        self._gmax = np.empty(cap // _GROUPS + 1, np.float32)
        self._cap = cap

    def scratch64(self, n: int) -> npt.NDArray[np.float64]:
        """A float64 work array of ``n`` entries owned by these candidates (contents
        undefined; valid until the next call). Grown on demand: samplers use it on the
        few candidates left after truncation, so it stays small."""
        n = expect_int("n", n)
        if len(self._scratch64) < n:
            self._scratch64 = np.empty(max(n, 64), np.float64)
        return self._scratch64[:n]

    @classmethod
    def from_logits(cls, row: npt.ArrayLike) -> Candidates:
        """Every token of a logits row (ids ``0..n-1``), borrowing ``row`` when it is float32."""
        return cls().reset(row)

    @classmethod
    def from_arrays(
        cls, ids: npt.ArrayLike, logits: npt.ArrayLike, p: npt.ArrayLike | None = None, sorted: bool = False
    ) -> Candidates:
        """Candidates copied from explicit arrays (any order, any ids)."""
        ids_a = expect_array("ids", ids, "an array of token ids", "iu").astype(np.int32, copy=False)
        lg = expect_array("logits", logits, "an array of logits", "iuf").astype(np.float32, copy=False)
        p_a = None if p is None else expect_array("p", p, "an array of probabilities or None", "iuf")
        sorted = expect_bool("sorted", sorted)
        if ids_a.ndim != 1 or lg.shape != ids_a.shape:
            raise InvalidLogitsError(f"ids and logits must be 1-D and of one length, not {ids_a.shape}, {lg.shape}")
        c = cls(len(lg))
        n = len(lg)
        c._ids[:n] = ids_a
        c._logits[:n] = lg
        c._n = n
        if p_a is not None:
            c._p[:n] = p_a
            c._p_valid = True
        c.sorted = sorted
        if n:
            _check_nan(c._logits[:n])
        return c

    def assign(
        self, ids: npt.ArrayLike, logits: npt.ArrayLike, p: npt.ArrayLike | None = None, sorted: bool = False
    ) -> Candidates:
        """Replace the contents with copies of explicit arrays (``selected`` becomes -1)."""
        ids_a = expect_array("ids", ids, "an array of token ids", "iu")
        lg = expect_array("logits", logits, "an array of logits", "iuf")
        if p is not None and not isinstance(p, np.ndarray):
            p = expect_array("p", p, "an array of probabilities or None", "iuf")
        if sorted is not True and sorted is not False:
            sorted = expect_bool("sorted", sorted)
        n = len(lg)
        if ids_a.shape != (n,) or lg.ndim != 1:
            raise InvalidLogitsError(f"ids and logits must be 1-D and of one length, not {ids_a.shape}, {lg.shape}")
        self._grow(n)
        self._ids[:n] = ids_a
        self._logits[:n] = lg
        self._src = None
        self._identity = False
        self._n = n
        self._p_valid = p is not None
        if p is not None:
            self._p[:n] = p
        self.sorted = sorted
        self.selected = -1
        return self

    def reset(self, row: npt.ArrayLike) -> Candidates:
        """Start a new step over every token of ``row`` (borrowed; see the module docstring).
        NaN logits raise :class:`~llama_cffi.sampling.InvalidLogitsError`."""
        r = np.asarray(row)
        if r.dtype.kind not in "fiu":
            raise type_error("row", "a row of logits (a 1-D array of numbers)", row)
        if r.ndim != 1:
            raise InvalidLogitsError(f"a 1-D logits row is needed, not shape {r.shape}")
        n = len(r)
        if n > self._cap:
            self._grow(n)
        if r.dtype != np.float32 or not r.flags.c_contiguous:  # the kernels read contiguous rows
            np.copyto(self._logits[:n], r, casting="same_kind")
            r = self._logits[:n]
            self._src = None
        else:
            self._src = r
        self._n = n
        self._identity = True
        self._p_valid = False
        self.sorted = False
        self.selected = -1
        self._gn = -1
        if n >= _GROUPED_MIN:
            # one pass: the max of each of n/64 interleaved groups; serves as the NaN check
            # (a max is NaN when any member is) and lets top(k) skip most of the row
            cols = n // _GROUPS
            top = _group_max(r, self._gmax[:cols])
            if top != top:  # NaN
                raise InvalidLogitsError("the logits contain NaN")
            self._gn = n
        elif n:
            _check_nan(r)
        return self

    def release(self) -> None:
        """Drop the borrowed row (size 0). Samplers' ``sample(ctx)`` calls this before
        returning, so no reference into the context's output buffer outlives the step
        (one would stop llama.cpp from reallocating that buffer)."""
        self._src = None
        self._n = 0
        self._gn = -1
        self._identity = False
        self.selected = -1

    def copy(self) -> Candidates:
        """An independent copy that owns its arrays."""
        return Candidates.from_arrays(
            self.read_ids(), self.read_logits(), self.p if self._p_valid else None, self.sorted
        )

    # ------------------------------------------------------------------ reading
    @property
    def size(self) -> int:
        """Number of candidates."""
        return self._n

    def __len__(self) -> int:
        return self._n

    def read_ids(self) -> IntArray:
        """The candidates' token ids, read-only (no copy)."""
        n = self._n
        if self._identity:
            return self._arange[:n]
        v = self._ids[:n]
        v.flags.writeable = False
        return v

    def _lg(self) -> FloatArray:
        """The logits for package-internal readers (no read-only flag: they do not write)."""
        src = self._src
        return src[: self._n] if src is not None else self._logits[: self._n]

    def read_logits(self) -> FloatArray:
        """The candidates' logits, read-only (no copy; may be the borrowed row)."""
        n = self._n
        v = self._src[:n] if self._src is not None else self._logits[:n]
        v.flags.writeable = False
        return v

    @property
    def ids(self) -> IntArray:
        """The ids, writable (materialised from ``0..n-1`` on first write access)."""
        n = self._n
        if self._identity:
            self._ids[:n] = self._arange[:n]
            self._identity = False
        return self._ids[:n]

    @property
    def logits(self) -> FloatArray:
        """The logits, writable (a borrowed row is copied into the own buffer first)."""
        n = self._n
        if self._src is not None:
            np.copyto(self._logits[:n], self._src[:n])
            self._src = None
        return self._logits[:n]

    @property
    def p(self) -> FloatArray:
        """Probabilities as the last softmax left them (0 before any, as in llama.cpp); writable."""
        n = self._n
        if not self._p_valid:
            self._p[:n] = 0.0
            self._p_valid = True
        return self._p[:n]

    @property
    def is_identity(self) -> bool:
        """Whether the ids are ``0..size-1`` in order (the untouched full vocabulary), so a
        token's position is its id."""
        return self._identity

    @property
    def has_p(self) -> bool:
        """Whether some sampler computed probabilities (otherwise :attr:`p` reads as zeros)."""
        return self._p_valid

    @property
    def token(self) -> int:
        """The selected token id (:class:`IndexError` when nothing is selected)."""
        s = self.selected
        if not 0 <= s < self._n:
            raise IndexError(f"no candidate is selected (selected={s}, size={self._n})")
        return int(self._arange[s] if self._identity else self._ids[s])

    def __repr__(self) -> str:
        return f"<Candidates size={self._n} sorted={self.sorted} selected={self.selected}>"

    # ------------------------------------------------------------------ reshaping
    def keep(self, idx: npt.ArrayLike, sorted: bool | None = None) -> None:
        """Keep the candidates at positions ``idx``, in that order (``sorted``: the new flag;
        ``None`` keeps the current one). Gathers straight from a borrowed row."""
        ix = np.asarray(idx)
        if ix.dtype.kind not in "biu":
            raise type_error("idx", "positions (an array of ints or a boolean mask)", idx)
        if sorted is not None and sorted is not True and sorted is not False:
            sorted = expect_bool("sorted", sorted)
        if ix.dtype == np.bool_:
            ix = np.flatnonzero(ix)
        m = len(ix)
        ids = self._arange[ix] if self._identity else self._ids[ix]
        logits = (self._src if self._src is not None else self._logits)[ix]
        if self._p_valid:
            self._p[:m] = self._p[ix]
        self._ids[:m] = ids
        self._logits[:m] = logits
        self._src = None
        self._identity = False
        self._n = m
        self.selected = -1
        if sorted is not None:
            self.sorted = sorted

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` candidates (as llama.cpp's ``cur_p->size = n``)."""
        n = expect_int("n", n)
        if not 0 <= n <= self._n:
            raise ValueError(f"cannot truncate {self._n} candidates to {n}")
        self._n = n

    def drop_front(self, n: int) -> None:
        """Drop the first ``n`` candidates (llama.cpp's ``cur_p->data += n``)."""
        n = expect_int("n", n)
        if not 0 <= n <= self._n:
            raise ValueError(f"cannot drop {n} of {self._n} candidates")
        if n:
            self.keep(np.arange(n, self._n), None)

    def sort(self) -> None:
        """Sort by descending logit (stable: equal logits keep their order)."""
        if self.sorted:
            return
        order = np.argsort(-self.read_logits(), kind="stable")
        self.keep(order, True)

    def top(self, k: int) -> IndexArray:
        """Positions of the ``k`` largest logits, in descending order of logit (ties: lower
        position first), without sorting everything: on large sets a strided sample gives a
        threshold that at least ``k`` candidates pass, and only those are partitioned."""
        n = self._n
        k = min(expect_int("k", k), n)
        lg = self._lg()
        if k <= 0:
            return np.empty(0, np.intp)
        if k == n:
            return np.argsort(-lg, kind="stable")
        cols = n // _GROUPS
        if self._gn == n and self._src is not None and self._identity and k * 8 <= cols:
            # The k largest values lie in the groups whose max is at least the k-th largest
            # group max (k groups reach it, so the k-th largest value does too): a C kernel
            # reads only those groups (numpy took ~10 calls here, most of a 32k chain step).
            return _top_k_grouped(lg, self._gmax[:cols], k, np.empty(k, np.intp))
        elif n >= 8192 and k * 256 <= n:
            stride = 16
            m = (n + stride - 1) // stride
            sub = self._scratch[:m]
            np.copyto(sub, lg[::stride])
            sub.partition(m - k)
            th = sub[m - k]  # k sampled values are >= th, so at least k candidates are
            mask = self._mask[:n]
            if th == -np.inf:
                # most logits are -inf (a grammar's mask): the finite ones, then as many -inf
                # ones as are missing, lowest positions first (the order of equal logits)
                np.greater(lg, th, out=mask)
                fin = np.flatnonzero(mask)
                if len(fin) < k:
                    np.equal(lg, th, out=mask)
                    rest = np.flatnonzero(mask)[: k - len(fin)]
                    head = _stable_top(lg[fin], fin, len(fin)) if len(fin) else np.empty(0, np.intp)
                    return np.concatenate([head, rest]).astype(np.intp)
                pos = fin
            else:
                np.greater_equal(lg, th, out=mask)
                pos = np.flatnonzero(mask)
        else:
            pos = np.arange(n)
        return _stable_top(lg[pos], pos, k)

    # ------------------------------------------------------------------ probabilities
    def softmax(self, sort: bool = False) -> FloatArray:
        """llama.cpp's ``llama_sampler_softmax_impl``: optionally sort, then ``p`` = softmax of
        the logits (max taken as the first logit when sorted). Returns ``p``.

        The sum is float32 and sequential, bit for bit llama.cpp's arithmetic (at a
        262,144-token vocabulary that sum carries a relative error of ~1e-4; it is
        llama.cpp's, reproduced so results match it)."""
        if sort is not False and sort is not True:
            sort = expect_bool("sort", sort)
        n = self._n
        if n == 0:
            raise InvalidLogitsError("softmax of zero candidates")
        if sort and not self.sorted:
            self.sort()
        lg = self._lg()
        m = lg[0] if self.sorted else lg.max()
        p = self._p[:n]
        np.subtract(lg, m, out=p)
        np.exp(p, out=p)
        total = seq_sum(p, self._scratch)
        np.divide(p, total, out=p)
        self._p_valid = True
        return p


def check_candidates(cands: object, name: str = "cands") -> Candidates:
    """``cands`` when it is a :class:`Candidates`, else the
    :class:`~llama_cffi.errors.ParamTypeError` naming ``name`` (every sampler's ``apply``
    checks its argument with it)."""
    if type(name) is not str:
        raise type_error("name", "a str (the parameter's name)", name)
    if not isinstance(cands, Candidates):
        raise type_error(name, "a samplers.Candidates (Candidates.from_logits(row))", cands)
    return cands


def seq_sum(a: FloatArray, scratch: FloatArray | None = None) -> np.float32:
    """``a[0] + a[1] + ...`` in float32, left to right, as a C loop over floats sums
    (``np.cumsum`` is sequential; ``np.sum`` is pairwise and would round differently)."""
    if not isinstance(a, np.ndarray):
        a = expect_array("a", a, "an array of numbers", "iuf").astype(np.float32)
    if scratch is not None and not isinstance(scratch, np.ndarray):
        raise type_error("scratch", "a float32 array or None", scratch)
    n = len(a)
    if n == 0:
        return cast(np.float32, np.float32(0.0))
    if scratch is not None and len(scratch) >= n:
        out = scratch[:n]
        np.cumsum(a, out=out)
        return cast(np.float32, out[-1])
    return cast(np.float32, np.cumsum(a, dtype=np.float32)[-1])


_rows_cache: dict[int, npt.NDArray[np.intp]] = {}


def _group_rows(cols: int) -> npt.NDArray[np.intp]:
    """Offsets of the 64 rows of a row reshaped to ``(64, cols)``, as a column (cached)."""
    r = _rows_cache.get(cols)
    if r is None:
        r = _rows_cache[cols] = (np.arange(_GROUPS, dtype=np.intp) * cols)[:, None]
    return r


def _check_nan(a: FloatArray) -> None:
    if np.isnan(a.max()):
        raise InvalidLogitsError("the logits contain NaN")
