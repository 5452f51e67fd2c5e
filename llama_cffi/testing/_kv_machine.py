"""The KV-cache state machine of :mod:`llama_cffi.testing` (imports hypothesis), against
the cell model :class:`~llama_cffi.testing.KvCells` (``_kv_cells``).

:class:`KvCacheMachine` drives one context with random decodes, memory operations and
state round trips, and checks after every step that the context's memory holds exactly
the positions the model predicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from .._args import expect, expect_array, expect_int, expect_iterable, expect_str
from ..batch import Batch
from ..context import Context
from ..errors import KvCacheFullError, StateError
from ..model import Model
from ..outputs import OutputView, StaleOutputError
from ._checks import expect_raises
from ._kv_cells import KvCells

__all__ = ["KvCacheMachine"]


def _machine(f: Any) -> Any:
    """A strategy whose bounds come from the running machine (its model and settings)."""
    return st.runner().flatmap(f)


_SEQS = _machine(lambda m: st.integers(0, m.n_seq - 1))
_ANY_SEQ = _machine(lambda m: st.integers(-1, m.n_seq - 1))
_TOKEN = _machine(lambda m: st.integers(0, m.n_vocab - 1))
_BOUND = _machine(lambda m: st.integers(-1, m.n_ctx_seq + m.n_ctx_seq // 6))  # -1: open, as in llama.h
_SEED = st.integers(0, 2**16)


class KvCacheMachine(RuleBasedStateMachine):
    """A hypothesis state machine of one context's KV memory against :class:`KvCells`.

    Rules decode (chunked, batched, single tokens, prompts past the cache's capacity),
    call every ``llama_memory_seq_*`` operation (``rm``, ``cp``, ``keep``, ``add``,
    ``div``, the classic context shift) and round-trip whole and per-sequence state;
    after each rule the invariant compares every sequence's ``seq_pos_min``/``seq_pos_max``
    with the model. Expected errors (``KvCacheFullError``, ``StateError`` for a save with
    a shift pending) are asserted, and views of an earlier decode must be stale.

    Subclass it, set :attr:`model`, and run it like any hypothesis machine::

        from hypothesis.stateful import run_state_machine_as_test
        from llama_cffi.testing import KvCacheMachine

        def test_my_model_kv(my_model):
            class Machine(KvCacheMachine):
                model = my_model
            run_state_machine_as_test(Machine)

    Add your own ``@rule`` methods to the subclass: they may use :attr:`ctx`,
    :attr:`mem` and :attr:`kv`; one that changes the memory must change :attr:`kv` the
    same way (the invariant checks that it did). The model must use llama.cpp's plain KV
    cache (decoder-only, no sliding window, not recurrent or hybrid):
    :class:`~llama_cffi.UnsupportedError` otherwise.
    """

    #: The model under test: set it in the subclass. The machine makes (and closes) one
    #: context per example.
    model: ClassVar[Model]
    #: Sequences of the context (``n_seq_max``).
    n_seq: ClassVar[int] = 4
    #: Tokens per ``llama_decode`` (``n_batch`` and ``n_ubatch``): small, so that long
    #: decodes are split into several calls.
    n_batch: ClassVar[int] = 16
    #: Asked-for context size; llama.cpp may pad it (see :attr:`n_ctx_seq`).
    n_ctx: ClassVar[int] = 128
    #: Further :meth:`~llama_cffi.Model.context` parameters. f32 caches and no flash
    #: attention keep logits after a state round trip close (flash attention on CPU is
    #: sensitive to the cell order).
    context_params: ClassVar[Mapping[str, object]] = {
        "type_k": "f32",
        "type_v": "f32",
        "flash_attn_type": "disabled",
    }
    #: Tolerances of the logits of the same token decoded before and after a whole-state
    #: round trip: the restored cells are laid out anew, which changes the summation order.
    logits_rtol: ClassVar[float] = 1e-4
    logits_atol: ClassVar[float] = 1e-5

    def __init__(self) -> None:
        super().__init__()
        m = self.model
        #: The model's vocabulary size: tokens are drawn from ``[0, n_vocab)``.
        self.n_vocab = m.n_vocab
        #: The context under test (``kv_unified=True``), closed at teardown.
        self.ctx: Context = m.context(
            n_ctx=self.n_ctx,
            n_batch=self.n_batch,
            n_ubatch=self.n_batch,
            n_seq_max=self.n_seq,
            kv_unified=True,
            **self.context_params,
        )
        try:
            #: What the memory should hold.
            self.kv = KvCells.for_context(self.ctx)
        except BaseException:
            self.ctx.close()
            raise
        #: ``self.ctx.memory``.
        self.mem = self.ctx.memory
        #: Cells per sequence: with one unified stream, all of ``n_ctx``.
        self.n_ctx_seq = self.ctx.n_ctx_seq
        assert self.ctx.n_seq_max == self.n_seq and self.ctx.n_batch == self.n_batch
        assert self.n_ctx_seq == self.ctx.n_ctx  # kv_unified: one stream of n_ctx cells
        assert self.mem.can_shift
        #: Views of the last decode: stale after the next one.
        self.views: list[OutputView] = []

    def teardown(self) -> None:
        self.ctx.close()

    # ------------------------------------------------------------------ helpers
    def tokens(self, n: int, seed: int) -> list[int]:
        """``n`` token ids of the model, from ``seed``."""
        n, seed = expect_int("n", n), expect_int("seed", seed)
        return [int(t) for t in np.random.default_rng(seed).integers(0, self.n_vocab, n)]

    def next_pos(self, seq: int) -> int:
        """The position a decode of ``seq`` continues at."""
        return self.kv.pos_max(expect_int("seq", seq)) + 1

    def expect_stale_views(self) -> None:
        """Every view kept from an earlier decode raises StaleOutputError now."""
        for v in self.views:
            with expect_raises(StaleOutputError):
                v.sum()
        self.views = []

    def check_row(self, row: Any) -> None:
        """A row of logits: ``n_vocab`` finite float32 values."""
        arr = expect_array("row", row, "a row of logits")
        assert arr.shape == (self.n_vocab,) and arr.dtype == np.float32
        assert np.isfinite(arr).all()

    # ------------------------------------------------------------------ decoding
    def decode_and_check(self, seq: int, tokens: list[int], mode: str) -> None:
        """Decode ``tokens`` into ``seq`` (``mode``: ``"last"``, ``"all"``, ``"none"`` or
        ``"single"``), predicting success or ``KvCacheFullError`` and the cells taken."""
        seq = expect_int("seq", seq)
        what = "a list of token ids"
        tokens = [expect_int("tokens", t, what) for t in expect_iterable("tokens", tokens, what)]
        expect_str("mode", mode, "'last', 'all', 'none' or 'single'")
        start, n, nb = self.next_pos(seq), len(tokens), self.n_batch
        if start + n > self.n_ctx_seq:
            with expect_raises(KvCacheFullError):  # refused in Python: nothing reaches llama_decode
                self.ctx.decode(tokens, seq_id=seq)
            return
        # llama_decode, once per chunk of n_batch tokens; each chunk needs that many free cells
        n_ok = 0
        while n_ok < n and self.kv.free >= min(nb, n - n_ok):
            m = min(nb, n - n_ok)
            self.kv.add_tokens(seq, list(range(start + n_ok, start + n_ok + m)))
            n_ok += m
        self.kv.shift_pending = False  # every llama_decode call first applies pending shifts
        if n_ok < n:
            with expect_raises(KvCacheFullError):  # the chunks before the failing one stay
                self.ctx.decode(tokens, seq_id=seq, logits="none" if mode == "none" else "last")
            self.expect_stale_views()
            return
        out: Any
        if mode == "single":
            assert n == 1
            out = self.ctx.decode_single(tokens[0], seq_id=seq)
        elif mode == "none":
            out = self.ctx.decode(tokens, seq_id=seq, logits="none")
        else:
            out = self.ctx.decode(tokens, seq_id=seq, logits=mode)
        self.expect_stale_views()
        if mode == "none":
            assert out is None
            with expect_raises(IndexError):
                self.ctx.logits()
        elif mode == "all":
            arr = np.asarray(out)
            assert arr.shape == (n, self.n_vocab) and np.isfinite(arr).all()
            if isinstance(out, OutputView):  # one chunk: a guarded view; several: a copy
                self.views = [out]
        else:
            self.check_row(out)
            self.views = [out]

    @rule(
        seq=_SEQS,
        n=_machine(lambda m: st.integers(1, 3 * m.n_batch)),
        mode=st.sampled_from(["last", "all"]),
        seed=_SEED,
    )
    def decode(self, seq: int, n: int, mode: str, seed: int) -> None:
        """Continue a sequence by up to three n_batch chunks of tokens."""
        self.decode_and_check(seq, self.tokens(n, seed), mode)

    @rule(
        seq=_SEQS,
        n=_machine(lambda m: st.integers(m.n_ctx_seq // 4, m.n_ctx_seq + 4)),
        mode=st.sampled_from(["last", "none"]),
        seed=_SEED,
    )
    def decode_long(self, seq: int, n: int, mode: str, seed: int) -> None:
        """A long prompt: reaches n_ctx_seq and the cell capacity (KvCacheFullError) quickly."""
        self.decode_and_check(seq, self.tokens(n, seed), mode)

    @rule(seq=_SEQS, tokens=st.lists(_TOKEN, min_size=1, max_size=4), mode=st.sampled_from(["last", "none"]))
    def decode_short(self, seq: int, tokens: list[int], mode: str) -> None:
        self.decode_and_check(seq, tokens, mode)

    @rule(seq=_SEQS, token=_TOKEN)
    def decode_single(self, seq: int, token: int) -> None:
        self.decode_and_check(seq, [token], "single")

    @rule(counts=_machine(lambda m: st.lists(st.integers(0, 4), min_size=m.n_seq, max_size=m.n_seq)), token=_TOKEN)
    def decode_batch(self, counts: list[int], token: int) -> None:
        """One Batch continuing several sequences at once; the last token of each is an output."""
        total = sum(counts)
        if total == 0 or total > self.n_batch:
            return
        b = Batch(self.n_batch, 1)
        outputs: list[int] = []
        plan: dict[int, list[int]] = {}
        for seq, k in enumerate(counts):
            start = self.next_pos(seq)
            plan[seq] = list(range(start, start + k))
            for j, p in enumerate(plan[seq]):
                b.add(token, p, (seq,), output=j == k - 1)
                if j == k - 1:
                    outputs.append(b.n_tokens - 1)
        if any(ps and ps[-1] >= self.n_ctx_seq for ps in plan.values()):
            with expect_raises(KvCacheFullError):  # refused in Python
                self.ctx.decode_batch(b)
            return
        self.kv.shift_pending = False
        if self.kv.free < total:
            with expect_raises(KvCacheFullError):  # llama_decode found no slot: nothing changed
                self.ctx.decode_batch(b)
            self.expect_stale_views()
            return
        self.ctx.decode_batch(b)
        self.expect_stale_views()
        for seq, ps in plan.items():
            self.kv.add_tokens(seq, ps)
        assert self.ctx.n_outputs == len(outputs)
        self.views = [self.ctx.logits(i) for i in outputs]
        for v in self.views:
            self.check_row(v)

    # ------------------------------------------------------------------ memory operations
    def held(self, data: st.DataObject, label: str = "seq") -> int:
        """Draw a sequence that holds positions (any sequence when none does)."""
        expect("data", data, st.DataObject, "hypothesis's st.data() object")
        expect_str("label", label)
        held = [s for s in range(self.n_seq) if self.kv.pos_max(s) >= 0]
        return data.draw(st.sampled_from(held) if held else st.integers(0, self.n_seq - 1), label=label)

    @rule(data=st.data(), cut=st.integers(0, 40))
    def rm_suffix(self, data: st.DataObject, cut: int) -> None:
        """Drop the last ``cut`` positions of a sequence (rewind)."""
        seq = self.held(data)
        p0 = max(self.kv.pos_max(seq) + 1 - cut, 0)
        assert self.mem.seq_rm(seq, p0, -1) is True
        self.kv.rm(seq, p0, -1)

    @rule(data=st.data())
    def rm_sequence(self, data: st.DataObject) -> None:
        seq = self.held(data)
        assert self.mem.seq_rm(seq) is True
        self.kv.rm(seq, -1, -1)

    @rule(seq=_ANY_SEQ, p0=_BOUND, p1=_BOUND)
    def rm_range(self, seq: int, p0: int, p1: int) -> None:
        """Any range of any sequence, or of all of them (-1): prefixes, middles, empty ranges."""
        assert self.mem.seq_rm(seq, p0, p1) is True
        self.kv.rm(seq, p0, p1)

    @rule(data=st.data(), dst=_SEQS, whole=st.booleans(), p0=_BOUND, p1=_BOUND)
    def cp(self, data: st.DataObject, dst: int, whole: bool, p0: int, p1: int) -> None:
        """Empty ``dst``, then make it share ``src``'s cells (all of them, or a range)."""
        src = self.held(data, "src")
        if whole:
            p0 = p1 = -1
        self.mem.seq_rm(dst)
        self.kv.rm(dst, -1, -1)
        self.mem.seq_cp(src, dst, p0, p1)
        self.kv.cp(src, dst, p0, p1)

    @precondition(lambda self: sum(self.kv.pos_max(s) >= 0 for s in range(self.n_seq)) >= 2)
    @rule(data=st.data())
    def keep(self, data: st.DataObject) -> None:
        seq = self.held(data)
        self.mem.seq_keep(seq)
        self.kv.keep(seq)

    @rule(data=st.data())
    def shift(self, data: st.DataObject) -> None:
        """Shift a whole sequence (and whatever shares its cells), keeping positions in range."""
        seq = self.held(data)
        lo, hi = self.kv.pos_min(seq), self.kv.pos_max(seq)
        bounds = st.integers(-5, 5) if lo < 0 else st.integers(-lo, self.n_ctx_seq - 1 - hi)
        delta = data.draw(bounds, label="delta")
        self.mem.seq_add(seq, -1, -1, delta)
        self.kv.add(seq, -1, -1, delta)

    @rule(data=st.data(), extra=st.integers(1, 20))
    def shift_below_zero(self, data: st.DataObject, extra: int) -> None:
        """Shift left past 0: llama.cpp frees the cells whose position goes negative."""
        seq = self.held(data)
        delta = -(max(self.kv.pos_min(seq), 0) + extra)
        self.mem.seq_add(seq, -1, -1, delta)
        self.kv.add(seq, -1, -1, delta)

    @rule(data=st.data(), keep=st.integers(0, 8), discard=st.integers(1, 64))
    def context_shift(self, data: st.DataObject, keep: int, discard: int) -> None:
        """The classic context shift: drop ``[keep, keep + discard)``, move the rest left."""
        seq = self.held(data)
        self.mem.seq_rm(seq, keep, keep + discard)
        self.kv.rm(seq, keep, keep + discard)
        self.mem.seq_add(seq, keep + discard, -1, -discard)
        self.kv.add(seq, keep + discard, -1, -discard)

    @rule(data=st.data(), d=st.integers(2, 4))
    def divide(self, data: st.DataObject, d: int) -> None:
        seq = self.held(data)
        self.mem.seq_div(seq, -1, -1, d)
        self.kv.div(seq, -1, -1, d)

    # ------------------------------------------------------------------ state
    @rule(perturb=st.sampled_from(["clear", "keep", "decode", "none"]), seq=_SEQS, token=_TOKEN)
    def state_round_trip(self, perturb: str, seq: int, token: int) -> None:
        """save_state, change the memory, load_state: the saved positions come back (and,
        with no shift pending at save time, the same logits for the same next token)."""
        if self.kv.shift_pending:  # llama.cpp would save un-rotated keys: refused
            with expect_raises(StateError, match="pending"):
                self.ctx.save_state()
            return
        data = self.ctx.save_state()
        assert len(data) > 0
        can_decode = self.next_pos(seq) < self.n_ctx_seq and self.kv.free >= 1
        before = None
        if can_decode:
            before = self.ctx.decode_single(token, seq_id=seq).copy()
            self.expect_stale_views()
            assert self.ctx.load_state(data) == len(data)
        if perturb == "clear":
            self.mem.clear()
        elif perturb == "keep":
            self.mem.seq_keep(seq)
        elif perturb == "decode" and can_decode:
            self.views.append(self.ctx.decode_single(token, seq_id=seq))
        assert self.ctx.load_state(data) == len(data)
        self.expect_stale_views()  # a load replaces the outputs too
        self.kv.shift_pending = False  # a whole-state restore starts with no pending shift
        with expect_raises(IndexError):  # outputs are not part of the state
            self.ctx.logits()
        self.check_positions()
        if before is not None:
            after = self.ctx.decode_single(token, seq_id=seq).copy()
            np.testing.assert_allclose(after, before, rtol=self.logits_rtol, atol=self.logits_atol)
            assert self.ctx.load_state(data) == len(data)

    @rule(data=st.data(), dst=_SEQS)
    def seq_state_round_trip(self, data: st.DataObject, dst: int) -> None:
        """save_seq_state(src) into dst: dst is emptied, then gets private cells at src's
        positions (StateError, and an empty dst, when too few cells are free)."""
        src = self.held(data, "src")
        if self.kv.shift_pending:
            with expect_raises(StateError, match="pending"):
                self.ctx.save_seq_state(src)
            return
        state = self.ctx.save_seq_state(src)
        saved = self.kv.positions(src)
        self.kv.rm(dst, -1, -1)
        if self.kv.free >= len(saved):
            assert self.ctx.load_seq_state(state, dst) == len(state)
            self.kv.add_tokens(dst, saved)
        else:
            with expect_raises(StateError):
                self.ctx.load_seq_state(state, dst)
        self.expect_stale_views()

    # ------------------------------------------------------------------ invariants
    def check_positions(self) -> None:
        """Every sequence's (pos_min, pos_max) in the memory equals the model's."""
        got = [(self.mem.seq_pos_min(s), self.mem.seq_pos_max(s)) for s in range(self.n_seq)]
        want = [(self.kv.pos_min(s), self.kv.pos_max(s)) for s in range(self.n_seq)]
        assert got == want, f"memory holds {got}, the model predicts {want} (cells: {sorted(self.kv.cells)})"

    @invariant()
    def positions_match(self) -> None:
        self.check_positions()
        assert self.ctx.n_past == self.kv.pos_max(0) + 1
