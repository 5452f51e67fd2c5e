"""llama.cpp's unified KV cells as a pure-Python model (:class:`KvCells`), for the KV-cache
state machine (:class:`llama_cffi.testing.KvCacheMachine`) and the branch-store one
(:class:`samplers.testing.BranchMachine`). No hypothesis needed.

With ``kv_unified=True`` every sequence lives in one stream of ``n_ctx`` cells, and a cell
holds one position and the set of sequences that share it (src/llama-kv-cache.cpp and
llama-kv-cells.h). That level is needed because the memory operations act on cells:

* ``seq_cp`` adds ``dst`` to the cells of ``src`` (no copy: the cells are shared);
* ``seq_rm`` takes a sequence out of its cells in ``[p0, p1)`` (a cell is freed once no
  sequence is left in it); ``seq_rm(-1, ...)`` frees the cells whatever they hold;
* ``seq_keep`` frees every cell without the sequence and takes the others from the rest;
* ``seq_add``/``seq_div`` move the position of the *cell*, so sequences sharing a cell
  move with it; a cell whose position goes below 0 is freed, for every sequence;
* a decode takes free cells (``KvCacheFullError`` when too few are free), chunk by chunk
  of ``n_batch`` tokens: the chunks before a failing one stay.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .._args import expect, expect_int, expect_iterable
from ..errors import UnsupportedError

if TYPE_CHECKING:
    from ..context import Context

__all__ = ["KvCells"]

_INF = 2**31 - 1


def _norm(p0: int, p1: int) -> tuple[int, int]:
    p0, p1 = expect_int("p0", p0), expect_int("p1", p1)
    return max(p0, 0), (_INF if p1 < 0 else p1)


class KvCells:
    """llama.cpp's unified KV cells: the occupied ones, each ``[pos, {seq, ...}]``.

    Positions are token positions; ``p0``/``p1`` bounds follow llama.h (``-1`` is open).
    Every method changes the model as the llama.h call of the same name changes the
    cache, so a rule that calls ``ctx.memory.seq_rm(...)`` calls ``kv.rm(...)`` too.
    """

    @classmethod
    def for_context(cls, ctx: Context) -> KvCells:
        """An empty model of ``ctx``'s cells, after checking that its memory is one plain
        unified KV cache (``kv_unified=True``; decoder-only, no sliding window, not
        recurrent or hybrid): :class:`~llama_cffi.UnsupportedError` otherwise."""
        from ..context import Context

        expect("ctx", ctx, Context, "a llama_cffi.Context")
        model = ctx.model
        kinds = sorted({c.kind for c in ctx.memory_usage().caches})
        if kinds != ["kv"] or model.has_encoder:
            has = "an encoder" if model.has_encoder else f"memory of kinds {kinds}" if kinds else "no memory"
            raise UnsupportedError(
                f"the KV cell model is llama.cpp's plain KV cache (decoder-only, no sliding window, "
                f"not recurrent or hybrid); {model!r} has {has}"
            )
        if ctx.n_ctx_seq != ctx.n_ctx:
            raise UnsupportedError("the KV cell model needs one unified stream of cells: kv_unified=True")
        return cls(ctx.n_ctx)

    def __init__(self, n_cells: int) -> None:
        #: Cells in the stream (the context's ``n_ctx`` with ``kv_unified=True``).
        self.n_cells = expect_int("n_cells", n_cells)
        #: The occupied cells, in no particular order: ``[pos, {seq, ...}]``.
        self.cells: list[list[Any]] = []
        #: A ``seq_add``/``seq_div`` that no decode has applied to the K data yet.
        self.shift_pending = False

    @property
    def free(self) -> int:
        """Cells no sequence holds."""
        return self.n_cells - len(self.cells)

    def positions(self, seq: int) -> list[int]:
        """The positions ``seq`` holds, ascending."""
        seq = expect_int("seq", seq)
        return sorted(c[0] for c in self.cells if seq in c[1])

    def pos_min(self, seq: int) -> int:
        """As ``llama_memory_seq_pos_min``: the lowest position, -1 when empty."""
        ps = self.positions(expect_int("seq", seq))
        return ps[0] if ps else -1

    def pos_max(self, seq: int) -> int:
        """As ``llama_memory_seq_pos_max``: the highest position, -1 when empty."""
        ps = self.positions(expect_int("seq", seq))
        return ps[-1] if ps else -1

    def span(self, seq: int) -> tuple[int, int]:
        """``(pos_min, pos_max)``; ``(-1, -1)`` when empty."""
        ps = self.positions(expect_int("seq", seq))
        return (ps[0], ps[-1]) if ps else (-1, -1)

    @property
    def holders(self) -> set[int]:
        """The sequences that hold at least one cell."""
        return {s for c in self.cells for s in c[1]}

    def add_tokens(self, seq: int, positions: Iterable[int]) -> None:
        """A decode of ``seq`` at ``positions``: one new cell each."""
        seq = expect_int("seq", seq)
        what = "an iterable of ints"
        new = [[expect_int("positions", p, what), {seq}] for p in expect_iterable("positions", positions, what)]
        self.cells.extend(new)

    def rm(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        """``seq_rm``; ``seq == -1`` frees the cells in range whatever they hold."""
        seq = expect_int("seq", seq)
        lo, hi = _norm(p0, p1)
        kept = []
        for c in self.cells:
            if lo <= c[0] < hi:
                if seq == -1:
                    continue
                c[1].discard(seq)
                if not c[1]:
                    continue
            kept.append(c)
        self.cells = kept

    def cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """``seq_cp``: ``dst`` joins ``src``'s cells in range (they are shared, not copied)."""
        src, dst = expect_int("src", src), expect_int("dst", dst)
        lo, hi = _norm(p0, p1)
        if src == dst:
            return
        for c in self.cells:
            if src in c[1] and lo <= c[0] < hi:
                c[1].add(dst)

    def keep(self, seq: int) -> None:
        """``seq_keep``."""
        seq = expect_int("seq", seq)
        self.cells = [[c[0], {seq}] for c in self.cells if seq in c[1]]

    def _mark_pending(self, seq: int, lo: int, hi: int) -> None:
        # llama_cffi's (conservative) rule: a shift whose range meets the sequence's span
        # [pos_min, pos_max] is pending until the next decode, even if it lands in a gap
        ps = self.positions(seq)
        if ps and lo < hi and lo <= ps[-1] and hi > ps[0]:
            self.shift_pending = True

    def add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """``seq_add``: moves the cells (for every sequence in them); below 0 frees them."""
        seq, delta = expect_int("seq", seq), expect_int("delta", delta)
        lo, hi = _norm(p0, p1)
        if delta == 0 or lo == hi:
            return
        self._mark_pending(seq, lo, hi)
        kept = []
        for c in self.cells:
            if seq in c[1] and lo <= c[0] < hi:
                c[0] += delta
                if c[0] < 0:
                    continue  # llama_kv_cells::pos_add frees the cell, for every sequence in it
            kept.append(c)
        self.cells = kept

    def div(self, seq: int, p0: int, p1: int, d: int) -> None:
        """``seq_div``: integer-divides the cells' positions."""
        seq, d = expect_int("seq", seq), expect_int("d", d)
        lo, hi = _norm(p0, p1)
        if d == 1 or lo == hi:
            return
        self._mark_pending(seq, lo, hi)
        for c in self.cells:
            if seq in c[1] and lo <= c[0] < hi:
                c[0] //= d
