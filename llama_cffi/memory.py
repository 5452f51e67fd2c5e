"""``Memory``: a context's KV cache (or recurrent state), per sequence.

Positions are token positions; ranges are half-open ``[p0, p1)`` with negative bounds
meaning "from the start" / "to the end", as in llama.h. Sequence ids are checked
against ``[0, n_seq_max)`` in Python: llama.cpp aborts the process on an
out-of-range id. Reached as ``context.memory``; it never outlives its context's
usefulness (every call raises :class:`~llama_cffi.errors.ClosedError` once the
context is closed).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from ._args import expect, expect_bool, type_error
from ._binding import lib
from .errors import ClosedError, ParamError, UnsupportedError

if TYPE_CHECKING:
    from .context import Context

_POS_MIN, _POS_MAX = -(2**31), 2**31 - 1


def _pos(name: str, value: object) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ParamError(f"{name} must be an int, not {value!r}")
    if not _POS_MIN <= value <= _POS_MAX:
        raise ParamError(f"{name}={value} is out of the int32 range of positions")
    return int(value)


class Memory:
    """The KV memory of one context (see the module docstring)."""

    def __init__(self, ctx: Context) -> None:
        from .context import Context

        expect("ctx", ctx, Context, "a llama_cffi.Context (use Context.memory)")
        self._ctx = weakref.ref(ctx)
        self.n_seq_max = ctx.n_seq_max

    def _mem(self) -> tuple[Context, Any]:
        ctx = self._ctx()
        if ctx is None:
            raise ClosedError("the context of this memory is gone")
        ctx._ptr()
        return ctx, ctx._memory

    def _seq(self, seq_id: object, allow_any: bool = False, name: str = "seq_id") -> int:
        if isinstance(seq_id, (bool, np.bool_)) or not isinstance(seq_id, (int, np.integer)):
            raise type_error(name, "an int (a sequence id)", seq_id)
        seq_id = int(seq_id)
        if allow_any and seq_id == -1:
            return -1
        if not 0 <= seq_id < self.n_seq_max:
            extra = " (or -1 for every sequence)" if allow_any else ""
            raise ParamError(f"{name}={seq_id} is out of range [0, {self.n_seq_max}){extra}")
        return seq_id

    def clear(self, data: bool = True) -> None:
        """Empty every sequence; ``data=True`` also zeroes the buffers."""
        data = expect_bool("data", data)
        ctx, mem = self._mem()
        if ctx._memoryless:
            return
        with ctx._using():
            lib.llama_memory_clear(mem, bool(data))

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove ``[p0, p1)`` of ``seq_id`` (-1: every sequence); removing whole sequences
        never fails.

        What the model's memory cannot do is refused, never half done:

        * a recurrent or hybrid state holds no positions to cut out: removing a middle
          range raises :class:`~llama_cffi.errors.UnsupportedError` (llama.cpp would report
          success and keep them); removing a tail rolls back only as far as the context's
          ``n_rs_seq`` allows, and returns False otherwise;
        * a sliding-window cache without ``swa_full`` keeps only the last window: removing
          a tail that starts before the window while keeping earlier positions raises
          :class:`~llama_cffi.errors.UnsupportedError` (llama.cpp would leave the sequence
          reporting no positions at all, so the next token would reuse position 0).
        """
        s = self._seq(seq_id, allow_any=True)
        ctx, mem = self._mem()
        a, b = _pos("p0", p0), _pos("p1", p1)
        whole = a <= 0 and b < 0
        if ctx._memoryless:
            if not whole:
                self._memoryless(ctx, "remove positions from")
            return True  # nothing is kept between decodes: every sequence is empty already
        seqs = range(self.n_seq_max) if s == -1 else (s,)
        if not whole and ctx._recurrent:
            for q in seqs:
                hi = int(lib.llama_memory_seq_pos_max(mem, q))
                if max(a, 0) < b <= hi:  # positions after the range would stay: not a tail
                    raise UnsupportedError(
                        f"this {ctx._arch} model's recurrent state cannot drop positions [{p0}, {p1}) of sequence "
                        f"{q} and keep later ones: remove whole sequences, or a tail within n_rs_seq steps"
                    )
        if a > 0 and ctx._swa_window:
            for q in seqs:
                lo, hi = int(lib.llama_memory_seq_pos_min(mem, q)), int(lib.llama_memory_seq_pos_max(mem, q))
                if a < lo <= hi and (b < 0 or b > hi):
                    raise UnsupportedError(
                        f"sequence {q} keeps only positions {lo}..{hi} in its sliding-window cache (window "
                        f"{ctx._swa_window}); removing from {a} would empty it while earlier positions stay: create "
                        "the context with swa_full=True to rewind past the window"
                    )
        with ctx._using():
            if s == -1 and whole and ctx._recurrent:
                # llama.cpp's recurrent memory refuses seq_id -1 here: remove each sequence
                return all([bool(lib.llama_memory_seq_rm(mem, q, -1, -1)) for q in seqs])
            return bool(lib.llama_memory_seq_rm(mem, s, a, b))

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Make ``dst`` share ``src``'s cells in ``[p0, p1)``. With a unified KV cache
        (``kv_unified=True``, or ``n_seq_max == 1``) no KV data is copied: the cells are
        tagged with ``dst``. Otherwise each sequence has its own stream and llama.cpp
        copies whole buffers: only the whole sequence can be copied (``p0``/``p1`` left at
        ``-1``/``0``); a part raises :class:`ParamError` (llama.cpp would abort)."""
        a, b = self._seq(src, name="src"), self._seq(dst, name="dst")
        ctx, mem = self._mem()
        q0, q1 = _pos("p0", p0), _pos("p1", p1)
        if ctx._memoryless:
            self._memoryless(ctx, "copy")
        if ctx._recurrent and a != b:
            if q0 > 0 or q1 > 0:
                raise UnsupportedError(
                    f"this {ctx._arch} model's recurrent state cannot be copied in part ([{p0}, {p1})); "
                    "llama.cpp would copy all of it: copy whole sequences only"
                )
            if ctx.n_rs_seq > 0:
                raise UnsupportedError(
                    f"copying sequences of this {ctx._arch} model's recurrent state with rollback on "
                    f"(n_rs_seq={ctx.n_rs_seq}) is refused: llama.cpp aborts once the copies roll back differently"
                )
        if (q0 > 0 or q1 > 0) and a != b and self.n_seq_max > 1 and not bool(ctx.params.c.kv_unified):
            raise ParamError(
                f"seq_cp of positions [{p0}, {p1}) needs kv_unified=True: with one KV stream per "
                "sequence llama.cpp can only copy whole sequences (p0=-1, p1=-1)"
            )
        with ctx._using():
            lib.llama_memory_seq_cp(mem, a, b, q0, q1)

    def seq_keep(self, seq_id: int) -> None:
        """Remove every sequence except ``seq_id``. (With one KV stream per sequence,
        ``kv_unified=False``, llama.cpp's ``seq_keep`` only clears the stream ``seq_id``
        lives in; the others are removed one by one here.)"""
        s = self._seq(seq_id)
        ctx, mem = self._mem()
        if ctx._memoryless:
            return  # nothing is kept between decodes
        with ctx._using():
            if self.n_seq_max > 1 and not bool(ctx.params.c.kv_unified):
                for q in range(self.n_seq_max):
                    if q != s:
                        lib.llama_memory_seq_rm(mem, q, -1, -1)
            else:
                lib.llama_memory_seq_keep(mem, s)

    @staticmethod
    def _memoryless(ctx: Context, what: str) -> None:
        raise UnsupportedError(
            f"this encoder-only {ctx._arch} model keeps no memory between decodes: there is nothing to {what}"
        )

    def _need_shift(self, what: str) -> None:
        ctx, _ = self._mem()
        if ctx._memoryless:
            self._memoryless(ctx, "shift")
        if not self.can_shift:
            raise ParamError(f"{what}: this model's memory cannot shift positions (can_shift is False)")

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Add ``delta`` to the positions in ``[p0, p1)`` of ``seq_id`` (a RoPE shift)."""
        s = self._seq(seq_id)
        self._need_shift("seq_add")
        ctx, mem = self._mem()
        a, b, dlt = _pos("p0", p0), _pos("p1", p1), _pos("delta", delta)
        with ctx._using():
            moves = dlt != 0 and self._overlaps(mem, s, a, b)
            lib.llama_memory_seq_add(mem, s, a, b, dlt)
            ctx._shift_pending = ctx._shift_pending or moves

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        """Integer-divide the positions in ``[p0, p1)`` of ``seq_id`` by ``d > 1``."""
        s = self._seq(seq_id)
        if isinstance(d, bool) or not isinstance(d, int) or d <= 1:
            raise ParamError(f"d must be an int > 1, not {d!r}")
        self._need_shift("seq_div")
        ctx, mem = self._mem()
        a, b = _pos("p0", p0), _pos("p1", p1)
        with ctx._using():
            moves = self._overlaps(mem, s, a, b)
            lib.llama_memory_seq_div(mem, s, a, b, min(d, _POS_MAX))
            ctx._shift_pending = ctx._shift_pending or moves

    @staticmethod
    def _overlaps(mem: Any, seq_id: int, p0: int, p1: int) -> bool:
        """Whether ``[p0, p1)`` meets the span ``[pos_min, pos_max]`` of ``seq_id`` (a shift
        there may move cells; llama_cffi then treats the shift as pending until a decode)."""
        lo, hi = int(lib.llama_memory_seq_pos_min(mem, seq_id)), int(lib.llama_memory_seq_pos_max(mem, seq_id))
        if hi < 0:
            return False
        a = 0 if p0 < 0 else p0
        b = 2**31 if p1 < 0 else p1
        return a < b and a <= hi and b > lo

    def seq_pos_min(self, seq_id: int) -> int:
        """Smallest position held for ``seq_id``, -1 if empty."""
        s = self._seq(seq_id)
        _, mem = self._mem()
        return int(lib.llama_memory_seq_pos_min(mem, s))

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest position held for ``seq_id``, -1 if empty."""
        s = self._seq(seq_id)
        _, mem = self._mem()
        return int(lib.llama_memory_seq_pos_max(mem, s))

    @property
    def can_shift(self) -> bool:
        _, mem = self._mem()
        return bool(lib.llama_memory_can_shift(mem))
