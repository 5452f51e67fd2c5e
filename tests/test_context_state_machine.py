"""A stateful (hypothesis) test of one context's KV memory against a pure-Python model.

The model mirrors llama.cpp's ``llama_kv_cache`` (src/llama-kv-cache.cpp and
llama-kv-cells.h) at the level of *cells*: with ``kv_unified=True`` every sequence
lives in one stream of ``n_ctx`` cells, and a cell holds one position and the set of
sequences that share it. That level is needed because the operations act on cells:

* ``seq_cp`` adds ``dst`` to the cells of ``src`` (no copy: the cells are shared);
* ``seq_rm`` takes a sequence out of its cells in ``[p0, p1)`` (a cell is freed once no
  sequence is left in it); ``seq_rm(-1, ...)`` frees the cells whatever they hold;
* ``seq_keep`` frees every cell without the sequence and takes the others from the
  rest;
* ``seq_add``/``seq_div`` move the position of the *cell*, so sequences sharing a cell
  move with it; a cell whose position goes below 0 is freed, for every sequence;
* a decode takes free cells (``KvCacheFullError`` when too few are free), chunk by
  chunk of ``n_batch`` tokens: the chunks before a failing one stay.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from llama_cffi import Batch, KvCacheFullError, Model, StateError
from llama_cffi.outputs import OutputView, StaleOutputError
from tests import tiny_model as tm

N_SEQ = 4
N_BATCH = 16  # small, so that long decodes are split into several llama_decode calls
INF = 2**31 - 1

SEQS = st.integers(0, N_SEQ - 1)
TOKEN = st.integers(0, tm.N_VOCAB - 1)
BOUND = st.integers(-1, 300)  # a position bound: -1 means "open", as in llama.h
SEED = st.integers(0, 2**16)


def _tokens(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, tm.N_VOCAB, n)]


def _norm(p0: int, p1: int) -> tuple[int, int]:
    return max(p0, 0), (INF if p1 < 0 else p1)


class KvModel:
    """llama.cpp's unified KV cells, as a list of ``[pos, {seq, ...}]`` (occupied cells only)."""

    def __init__(self, n_cells: int) -> None:
        self.n_cells = n_cells
        self.cells: list[list[Any]] = []
        self.shift_pending = False  # a seq_add/seq_div not yet applied to the K data by a decode

    @property
    def free(self) -> int:
        return self.n_cells - len(self.cells)

    def positions(self, seq: int) -> list[int]:
        return sorted(c[0] for c in self.cells if seq in c[1])

    def pos_min(self, seq: int) -> int:
        ps = self.positions(seq)
        return ps[0] if ps else -1

    def pos_max(self, seq: int) -> int:
        ps = self.positions(seq)
        return ps[-1] if ps else -1

    def add_tokens(self, seq: int, positions: list[int]) -> None:
        self.cells.extend([p, {seq}] for p in positions)

    def rm(self, seq: int, p0: int, p1: int) -> None:
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

    def cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        if src == dst:
            return
        lo, hi = _norm(p0, p1)
        for c in self.cells:
            if src in c[1] and lo <= c[0] < hi:
                c[1].add(dst)

    def keep(self, seq: int) -> None:
        self.cells = [[c[0], {seq}] for c in self.cells if seq in c[1]]

    def _mark_pending(self, seq: int, lo: int, hi: int) -> None:
        # llama_cffi's (conservative) rule: a shift whose range meets the sequence's span
        # [pos_min, pos_max] is pending until the next decode, even if it lands in a gap
        ps = self.positions(seq)
        if ps and lo < hi and lo <= ps[-1] and hi > ps[0]:
            self.shift_pending = True

    def add(self, seq: int, p0: int, p1: int, delta: int) -> None:
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
        lo, hi = _norm(p0, p1)
        if d == 1 or lo == hi:
            return
        self._mark_pending(seq, lo, hi)
        for c in self.cells:
            if seq in c[1] and lo <= c[0] < hi:
                c[0] //= d


class KvMachine(RuleBasedStateMachine):
    """Rules drive one context; ``self.kv`` predicts what its memory holds."""

    model: Model

    def __init__(self) -> None:
        super().__init__()
        self.ctx = self.model.context(
            n_ctx=128,
            n_batch=N_BATCH,
            n_ubatch=N_BATCH,
            n_seq_max=N_SEQ,
            kv_unified=True,
            type_k="f32",
            type_v="f32",
            flash_attn_type="disabled",  # flash attention on CPU is sensitive to the cell order
        )
        self.mem = self.ctx.memory
        self.n_ctx_seq = self.ctx.n_ctx_seq
        assert self.ctx.n_seq_max == N_SEQ and self.ctx.n_batch == N_BATCH
        assert self.n_ctx_seq == self.ctx.n_ctx  # kv_unified: one stream of n_ctx cells
        assert self.mem.can_shift
        self.kv = KvModel(self.ctx.n_ctx)
        self.views: list[OutputView] = []  # views of the last decode; stale after the next one

    def teardown(self) -> None:
        self.ctx.close()

    # ------------------------------------------------------------------ helpers
    def _next_pos(self, seq: int) -> int:
        return self.kv.pos_max(seq) + 1

    def _expect_stale_views(self) -> None:
        for v in self.views:
            with pytest.raises(StaleOutputError):
                v.sum()
        self.views = []

    def _check_row(self, row: Any) -> None:
        arr = np.asarray(row)
        assert arr.shape == (tm.N_VOCAB,) and arr.dtype == np.float32
        assert np.isfinite(arr).all()

    # ------------------------------------------------------------------ decoding
    def _decode(self, seq: int, tokens: list[int], mode: str) -> None:
        start, n = self._next_pos(seq), len(tokens)
        if start + n > self.n_ctx_seq:
            with pytest.raises(KvCacheFullError):  # refused in Python: nothing reaches llama_decode
                self.ctx.decode(tokens, seq_id=seq)
            return
        # llama_decode, once per chunk of n_batch tokens; each chunk needs that many free cells
        n_ok = 0
        while n_ok < n and self.kv.free >= min(N_BATCH, n - n_ok):
            m = min(N_BATCH, n - n_ok)
            self.kv.add_tokens(seq, list(range(start + n_ok, start + n_ok + m)))
            n_ok += m
        self.kv.shift_pending = False  # every llama_decode call first applies pending shifts
        if n_ok < n:
            with pytest.raises(KvCacheFullError):  # the chunks before the failing one stay
                self.ctx.decode(tokens, seq_id=seq, logits="none" if mode == "none" else "last")
            self._expect_stale_views()
            return
        if mode == "single":
            assert n == 1
            out = self.ctx.decode_single(tokens[0], seq_id=seq)
        elif mode == "none":
            out = self.ctx.decode(tokens, seq_id=seq, logits="none")
        else:
            out = self.ctx.decode(tokens, seq_id=seq, logits=mode)
        self._expect_stale_views()
        if mode == "none":
            assert out is None
            with pytest.raises(IndexError):
                self.ctx.logits()
        elif mode == "all":
            arr = np.asarray(out)
            assert arr.shape == (n, tm.N_VOCAB) and np.isfinite(arr).all()
            if isinstance(out, OutputView):  # one chunk: a guarded view; several: a copy
                self.views = [out]
        else:
            self._check_row(out)
            self.views = [out]

    @rule(seq=SEQS, n=st.integers(1, 3 * N_BATCH), mode=st.sampled_from(["last", "all"]), seed=SEED)
    def decode(self, seq: int, n: int, mode: str, seed: int) -> None:
        """Continue a sequence by up to three n_batch chunks of tokens."""
        self._decode(seq, _tokens(n, seed), mode)

    @rule(seq=SEQS, n=st.integers(64, 260), mode=st.sampled_from(["last", "none"]), seed=SEED)
    def decode_long(self, seq: int, n: int, mode: str, seed: int) -> None:
        """A long prompt: reaches n_ctx_seq and the cell capacity (KvCacheFullError) quickly."""
        self._decode(seq, _tokens(n, seed), mode)

    @rule(seq=SEQS, tokens=st.lists(TOKEN, min_size=1, max_size=4), mode=st.sampled_from(["last", "none"]))
    def decode_short(self, seq: int, tokens: list[int], mode: str) -> None:
        self._decode(seq, tokens, mode)

    @rule(seq=SEQS, token=TOKEN)
    def decode_single(self, seq: int, token: int) -> None:
        self._decode(seq, [token], "single")

    @rule(counts=st.lists(st.integers(0, 4), min_size=N_SEQ, max_size=N_SEQ), token=TOKEN)
    def decode_batch(self, counts: list[int], token: int) -> None:
        """One Batch continuing several sequences at once; the last token of each is an output."""
        total = sum(counts)
        if total == 0:
            return
        b = Batch(N_BATCH, 1)
        outputs: list[int] = []
        plan: dict[int, list[int]] = {}
        for seq, k in enumerate(counts):
            start = self._next_pos(seq)
            plan[seq] = list(range(start, start + k))
            for j, p in enumerate(plan[seq]):
                b.add(token, p, (seq,), output=j == k - 1)
                if j == k - 1:
                    outputs.append(b.n_tokens - 1)
        if any(ps and ps[-1] >= self.n_ctx_seq for ps in plan.values()):
            with pytest.raises(KvCacheFullError):  # refused in Python
                self.ctx.decode_batch(b)
            return
        self.kv.shift_pending = False
        if self.kv.free < total:
            with pytest.raises(KvCacheFullError):  # llama_decode found no slot: nothing changed
                self.ctx.decode_batch(b)
            self._expect_stale_views()
            return
        self.ctx.decode_batch(b)
        self._expect_stale_views()
        for seq, ps in plan.items():
            self.kv.add_tokens(seq, ps)
        assert self.ctx.n_outputs == len(outputs)
        self.views = [self.ctx.logits(i) for i in outputs]
        for v in self.views:
            self._check_row(v)

    # ------------------------------------------------------------------ memory operations
    def _held(self, data: st.DataObject, label: str = "seq") -> int:
        """A sequence that holds positions (any sequence when none does)."""
        held = [s for s in range(N_SEQ) if self.kv.pos_max(s) >= 0]
        return data.draw(st.sampled_from(held) if held else SEQS, label=label)

    @rule(data=st.data(), cut=st.integers(0, 40))
    def rm_suffix(self, data: st.DataObject, cut: int) -> None:
        """Drop the last ``cut`` positions of a sequence (rewind)."""
        seq = self._held(data)
        p0 = max(self.kv.pos_max(seq) + 1 - cut, 0)
        assert self.mem.seq_rm(seq, p0, -1) is True
        self.kv.rm(seq, p0, -1)

    @rule(data=st.data())
    def rm_sequence(self, data: st.DataObject) -> None:
        seq = self._held(data)
        assert self.mem.seq_rm(seq) is True
        self.kv.rm(seq, -1, -1)

    @rule(seq=st.integers(-1, N_SEQ - 1), p0=BOUND, p1=BOUND)
    def rm_range(self, seq: int, p0: int, p1: int) -> None:
        """Any range of any sequence, or of all of them (-1): prefixes, middles, empty ranges."""
        assert self.mem.seq_rm(seq, p0, p1) is True
        self.kv.rm(seq, p0, p1)

    @rule(data=st.data(), dst=SEQS, whole=st.booleans(), p0=BOUND, p1=BOUND)
    def cp(self, data: st.DataObject, dst: int, whole: bool, p0: int, p1: int) -> None:
        """Empty ``dst``, then make it share ``src``'s cells (all of them, or a range)."""
        src = self._held(data, "src")
        if whole:
            p0 = p1 = -1
        self.mem.seq_rm(dst)
        self.kv.rm(dst, -1, -1)
        self.mem.seq_cp(src, dst, p0, p1)
        self.kv.cp(src, dst, p0, p1)

    @precondition(lambda self: sum(self.kv.pos_max(s) >= 0 for s in range(N_SEQ)) >= 2)
    @rule(data=st.data())
    def keep(self, data: st.DataObject) -> None:
        seq = self._held(data)
        self.mem.seq_keep(seq)
        self.kv.keep(seq)

    @rule(data=st.data())
    def shift(self, data: st.DataObject) -> None:
        """Shift a whole sequence (and whatever shares its cells), keeping positions in range."""
        seq = self._held(data)
        lo, hi = self.kv.pos_min(seq), self.kv.pos_max(seq)
        bounds = st.integers(-5, 5) if lo < 0 else st.integers(-lo, self.n_ctx_seq - 1 - hi)
        delta = data.draw(bounds, label="delta")
        self.mem.seq_add(seq, -1, -1, delta)
        self.kv.add(seq, -1, -1, delta)

    @rule(data=st.data(), extra=st.integers(1, 20))
    def shift_below_zero(self, data: st.DataObject, extra: int) -> None:
        """Shift left past 0: llama.cpp frees the cells whose position goes negative."""
        seq = self._held(data)
        delta = -(max(self.kv.pos_min(seq), 0) + extra)
        self.mem.seq_add(seq, -1, -1, delta)
        self.kv.add(seq, -1, -1, delta)

    @rule(data=st.data(), keep=st.integers(0, 8), discard=st.integers(1, 64))
    def context_shift(self, data: st.DataObject, keep: int, discard: int) -> None:
        """The classic context shift: drop ``[keep, keep + discard)``, move the rest left."""
        seq = self._held(data)
        self.mem.seq_rm(seq, keep, keep + discard)
        self.kv.rm(seq, keep, keep + discard)
        self.mem.seq_add(seq, keep + discard, -1, -discard)
        self.kv.add(seq, keep + discard, -1, -discard)

    @rule(data=st.data(), d=st.integers(2, 4))
    def divide(self, data: st.DataObject, d: int) -> None:
        seq = self._held(data)
        self.mem.seq_div(seq, -1, -1, d)
        self.kv.div(seq, -1, -1, d)

    # ------------------------------------------------------------------ state
    @rule(perturb=st.sampled_from(["clear", "keep", "decode", "none"]), seq=SEQS, token=TOKEN)
    def state_round_trip(self, perturb: str, seq: int, token: int) -> None:
        """save_state, change the memory, load_state: the saved positions come back (and,
        with no shift pending at save time, the same logits for the same next token)."""
        if self.kv.shift_pending:  # llama.cpp would save un-rotated keys: refused
            with pytest.raises(StateError, match="pending"):
                self.ctx.save_state()
            return
        data = self.ctx.save_state()
        assert len(data) > 0
        can_decode = self._next_pos(seq) < self.n_ctx_seq and self.kv.free >= 1
        before = None
        if can_decode and not self.kv.shift_pending:
            before = self.ctx.decode_single(token, seq_id=seq).copy()
            self._expect_stale_views()
            assert self.ctx.load_state(data) == len(data)
        if perturb == "clear":
            self.mem.clear()
        elif perturb == "keep":
            self.mem.seq_keep(seq)
        elif perturb == "decode" and can_decode:
            self.views.append(self.ctx.decode_single(token, seq_id=seq))
        assert self.ctx.load_state(data) == len(data)
        self._expect_stale_views()  # a load replaces the outputs too
        self.kv.shift_pending = False  # a whole-state restore starts with no pending shift
        with pytest.raises(IndexError):  # outputs are not part of the state
            self.ctx.logits()
        self._check_positions()
        if before is not None:
            after = self.ctx.decode_single(token, seq_id=seq).copy()
            np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-5)
            assert self.ctx.load_state(data) == len(data)

    @rule(data=st.data(), dst=SEQS)
    def seq_state_round_trip(self, data: st.DataObject, dst: int) -> None:
        """save_seq_state(src) into dst: dst is emptied, then gets private cells at src's
        positions (StateError, and an empty dst, when too few cells are free)."""
        src = self._held(data, "src")
        if self.kv.shift_pending:
            with pytest.raises(StateError, match="pending"):
                self.ctx.save_seq_state(src)
            return
        state = self.ctx.save_seq_state(src)
        saved = self.kv.positions(src)
        self.kv.rm(dst, -1, -1)
        if self.kv.free >= len(saved):
            assert self.ctx.load_seq_state(state, dst) == len(state)
            self.kv.add_tokens(dst, saved)
        else:
            with pytest.raises(StateError):
                self.ctx.load_seq_state(state, dst)
        self._expect_stale_views()

    # ------------------------------------------------------------------ invariants
    def _check_positions(self) -> None:
        got = [(self.mem.seq_pos_min(s), self.mem.seq_pos_max(s)) for s in range(N_SEQ)]
        want = [(self.kv.pos_min(s), self.kv.pos_max(s)) for s in range(N_SEQ)]
        assert got == want, f"memory holds {got}, the model predicts {want} (cells: {sorted(self.kv.cells)})"

    @invariant()
    def positions_match(self) -> None:
        self._check_positions()
        assert self.ctx.n_past == self.kv.pos_max(0) + 1


def test_kv_memory_state_machine(tiny_model: Model) -> None:
    """Random sequences of decodes, seq_rm/cp/keep/add/div and state round trips keep every
    sequence's positions exactly where a cell-level model of llama.cpp's KV cache puts them."""

    class Machine(KvMachine):
        model = tiny_model

    run_state_machine_as_test(Machine, settings=settings(stateful_step_count=30, deadline=None))


# ---------------------------------------------------------------------- pending shifts and state
def _shifted_state_logits(tiny_model: Model, apply_shift_first: bool) -> tuple[np.ndarray, np.ndarray]:
    with tiny_model.context(
        n_ctx=128, n_seq_max=2, kv_unified=True, type_k="f32", type_v="f32", flash_attn_type="disabled"
    ) as ctx:
        ctx.decode(list(range(3, 40)))
        ctx.memory.seq_add(0, -1, -1, 100)  # positions 0..36 -> 100..136, cells stay where they are
        if apply_shift_first:
            ctx.decode_single(7, seq_id=1)  # any decode applies the pending K shift
            ctx.memory.seq_rm(1)
        data = ctx.save_state()
        before = ctx.decode_single(50).copy()
        ctx.load_state(data)
        assert (ctx.memory.seq_pos_min(0), ctx.memory.seq_pos_max(0)) == (100, 136)
        after = ctx.decode_single(50).copy()
        return before, after


def test_state_round_trip_after_applied_shift_reproduces_logits(tiny_model: Model) -> None:
    """A state saved after a shift was applied by a decode restores to exactly the same logits."""
    before, after = _shifted_state_logits(tiny_model, apply_shift_first=True)
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-6)


# llama.cpp saves the cells' shifted positions with K data that the pending RoPE shift has not
# rotated yet, and a restored cache has no pending shift, so the shift would be lost (max logit
# error ~5e-3 here). llama_cffi refuses such a save instead of writing a wrong state.
def test_saving_with_a_pending_shift_is_refused(tiny_model: Model) -> None:
    """save_state/save_seq_state right after seq_add raise StateError until a decode applies the shift."""
    with tiny_model.context(n_ctx=128, n_seq_max=2, kv_unified=True) as ctx:
        ctx.decode(list(range(3, 40)))
        ctx.memory.seq_add(0, -1, -1, 100)
        for save in (ctx.save_state, lambda: ctx.save_seq_state(0)):
            with pytest.raises(StateError, match="pending"):
                save()
        ctx.decode_single(7, seq_id=1)  # applies the shift
        assert len(ctx.save_state()) > 0 and len(ctx.save_seq_state(0)) > 0
