"""The branch-store state machine of :mod:`samplers.testing` (imports hypothesis).

The model has two parts:

* the **tree**: for every branch ever made, its sequence id, parent, children (in
  order), history (``tokens``), the tokens its sequence holds in the KV cache (``kv``;
  the same as the history until ``clear_and_reseed``/``shift_context`` rebuild it),
  tracker counts, the token a ``sample()`` left pending, and which tokens a fresh
  context must decode to reproduce its logits snapshot (:class:`Node`);
* the **cells** of llama.cpp's unified KV cache (:class:`llama_cffi.testing.KvCells`).
  ``seq_cp`` (a fork) tags the parent's cells with the child's id and takes no cell; a
  decode takes one free cell per token. That makes ``KvCacheFullError`` predictable
  exactly: a decode of ``n`` tokens fails iff fewer than ``n`` cells are free or a
  position would pass ``n_ctx``.

Branches are drawn from the model's live (or dead) ones rather than from a ``Bundle``: a
bundle keeps handing out pruned branches, and most steps were then spent on refusals.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from llama_cffi import Context, Model
from llama_cffi._args import expect_bool, expect_int, expect_iterable
from llama_cffi.errors import KvCacheFullError, ParamError
from llama_cffi.testing import KvCells, expect_raises

from ..branch import Branch, BranchError, BranchStore, CapacityError
from ..chain import SamplerChain
from ..selection import Dist
from ..truncation import TopK

__all__ = ["BranchMachine", "Node"]


def _machine(f: Any) -> Any:
    """A strategy whose bounds come from the running machine (its model and settings)."""
    return st.runner().flatmap(f)


_SEED = st.integers(0, 2**16)
# short prompts, or long ones that fill the cells after a few rules (50-200 of 256)
_PROMPT_LEN = _machine(lambda m: st.one_of(st.integers(1, 12), st.integers(m.n_cells // 5, m.n_cells * 25 // 32)))
_HOW = st.sampled_from(["sample", "random", "pending"])  # where a step's token comes from


# what misuse does with a pruned branch: each must raise BranchError("... pruned")
_USES: dict[str, Callable[[BranchStore, Branch], object]] = {
    "sample": lambda s, b: b.sample(),
    "accept": lambda s, b: b.accept(5),
    "commit": lambda s, b: b.commit(5),
    "step": lambda s, b: s.step({b: 5}),
    "prefill": lambda s, b: s.prefill({b: [5, 6]}),
    "fork": lambda s, b: b.fork(),
    "prune": lambda s, b: b.prune(),
    "prune(reparent)": lambda s, b: b.prune(reparent=True),
    "prune_subtree": lambda s, b: b.prune_subtree(),
    "detach": lambda s, b: b.detach(),
    "retain_only": lambda s, b: s.retain_only(b),
    "clear_and_reseed": lambda s, b: b.clear_and_reseed(),
    "shift_context": lambda s, b: b.shift_context(1),
}


# A recipe rebuilds a sequence's KV in a fresh one-sequence context: ("decode", tokens)
# appends tokens (positions go on from the last one), ("rm", positions) removes cells.
# shift_context is not a fresh decode of what is left: the cells after the dropped ones
# were computed attending to them (only RoPE makes positions relative), so the reference
# for a shifted sequence decodes everything, removes the dropped cells and goes on at the
# old positions (the same relative positions as the shifted cache).
_Op = tuple[str, list[int]]


@dataclass
class Node:
    """What the model knows of one branch (fields in the order of the constructor):
    its sequence id, parent, history (``tokens``), the tokens at positions 0.. of its
    sequence (``kv``: ``position == len(kv)``), the ``recipe`` that rebuilds that KV in
    the reference context, the reference position of each position (``refpos``), the
    recipe whose last decode gave the logits snapshot (``snap``; ``None``: zeros),
    whether it has a tracker, the tracker's ``count`` and ``sampling_count``
    (``scount``), the token a ``sample()`` left ``pending``, the accepted tokens
    (``acc``: history index, and whether it was the pending sample), its ``children``
    and whether it is ``alive``."""

    seq: int
    parent: Branch | None
    tokens: list[int]  # the history
    kv: list[int]  # the tokens at positions 0.. of the sequence (position == len(kv))
    recipe: list[_Op]  # rebuilds the KV in the reference context
    refpos: list[int]  # the reference position of each position of the sequence
    snap: list[_Op] | None  # the logits snapshot is the last decode of this recipe (None: zeros)
    tracked: bool = True  # metrics on (a tracker), or off (create(track=False))
    count: int = 0  # tracker.count
    scount: int = 0  # tracker.sampling_count
    pending: int | None = None  # the token the last sample() chose, not yet accepted
    acc: list[tuple[int, bool]] = field(default_factory=list)  # accepted: (history index, was the pending sample)
    children: list[Branch] = field(default_factory=list)
    alive: bool = True

    @classmethod
    def root(cls, seq: int, prompt: list[int], tracked: bool) -> Node:
        """A root branch's node: ``prompt`` decoded into sequence ``seq``."""
        seq = expect_int("seq", seq)
        prompt = list(expect_iterable("prompt", prompt, "a list of token ids"))
        n = cls(seq, None, prompt, [], [], [], None, tracked=expect_bool("tracked", tracked))
        n.decoded(prompt)
        return n

    def decoded(self, toks: list[int]) -> None:
        """``toks`` were decoded into the sequence; the snapshot follows the last one."""
        toks = [
            expect_int("toks", t, "a list of token ids") for t in expect_iterable("toks", toks, "a list of token ids")
        ]
        start = self.refpos[-1] + 1 if self.refpos else 0
        self.kv += toks
        self.recipe.append(("decode", list(toks)))
        self.refpos += range(start, start + len(toks))
        self.snap = list(self.recipe)
        self.pending = None

    def shifted(self, sinks: int, n_discard: int) -> None:
        """``shift_context``: the snapshot stays the one computed before."""
        sinks, n_discard = expect_int("sinks", sinks), expect_int("n_discard", n_discard)
        self.recipe.append(("rm", self.refpos[sinks : sinks + n_discard]))
        del self.kv[sinks : sinks + n_discard], self.refpos[sinks : sinks + n_discard]

    def emptied(self) -> None:
        self.kv, self.recipe, self.refpos = [], [], []


_Snapshot = tuple[list[tuple[Any, ...]], list[tuple[int, int]], int]


class BranchMachine(RuleBasedStateMachine):
    """A hypothesis state machine of a :class:`~samplers.branch.BranchStore` against a
    pure-Python model of its tree and of llama.cpp's KV cells.

    Rules: create, fork (whole or ``at=``), step (a random subset of the live branches;
    tokens sampled, random, or a pending sample), commit, sample, prefill (unequal
    lengths), fill (leaves 0-4 cells free, so steps find the cache full), prune (with or
    without reparent), prune_subtree, detach, retain_only, drain, clear_and_reseed,
    shift_context, misuse (pruned branches, duplicates, bad tokens) and check_logits (a
    branch's logits snapshot equals a fresh one-sequence decode of its tokens). After
    every rule the invariants compare the store's tree, ids and KV positions with the
    model; every expected error is checked to leave every branch (tokens, position,
    snapshot, tracker, pending sample, tree) and the KV exactly as they were.

    Subclass it, set :attr:`model`, and run it like any hypothesis machine::

        from hypothesis.stateful import run_state_machine_as_test
        from samplers.testing import BranchMachine

        def test_my_model_branches(my_model):
            class Machine(BranchMachine):
                model = my_model
            run_state_machine_as_test(Machine)

    Your own ``@rule`` methods may use :attr:`store`, :attr:`ctx`, :attr:`nodes` (a
    :class:`Node` per branch ever made) and :attr:`cells` (a
    :class:`~llama_cffi.testing.KvCells`), and must keep the last two in step with what
    they do. The model must use llama.cpp's plain KV cache (decoder-only, no sliding
    window, not recurrent or hybrid): :class:`~llama_cffi.UnsupportedError` otherwise.
    """

    #: The model under test: set it in the subclass. One context per example.
    model: ClassVar[Model]
    #: A one-sequence context of :attr:`model` (``n_ctx`` >= :attr:`reference_n_ctx`)
    #: for the fresh decodes ``check_logits`` compares with, shared by the examples (it is
    #: cleared before each use). ``None``: the machine makes one per example.
    reference: ClassVar[Context | None] = None
    #: Branches (``n_seq_max``).
    n_seq: ClassVar[int] = 4
    #: Asked-for context size, all of it one unified stream (llama.cpp may pad it: the
    #: machine works with the context's own ``n_ctx``, :attr:`n_cells`).
    n_ctx: ClassVar[int] = 256
    #: Tokens per ``llama_decode``.
    n_batch: ClassVar[int] = 64
    #: Further context parameters. One thread: small models gain nothing from two, and on
    #: a busy two-core machine OpenMP's barrier makes every two-thread decode wait for a
    #: time slice (100 one-token decodes of the tiny model: 17 s with two, 0.02 s with one).
    context_params: ClassVar[Mapping[str, object]] = {"n_threads": 1, "n_threads_batch": 1}
    #: Keyword arguments of the store under test (``{"batched": False}``: the row-by-row
    #: path; ``device=True`` refuses this machine's greedy chains and snapshots).
    store_options: ClassVar[Mapping[str, object]] = {}
    #: The reference context's size: positions there grow past :attr:`n_cells` after
    #: ``shift_context``; longer recipes are not checked.
    reference_n_ctx: ClassVar[int] = 1024
    #: rtol and atol of ``check_logits``: batch shape and cell order change the kernels'
    #: summation order (2e-3 suits F32 weights; quantized weights with CPU repacking need
    #: far more, or ``use_extra_bufts=False``).
    tol: ClassVar[float] = 2e-3
    #: The same after ``shift_context``, which rotates f16 keys in place, one more f16
    #: rounding each (~5e-4 relative): up to ~4e-3 on the tiny model after 60 random
    #: shifts. A fresh decode of what is left, the wrong reference, is ~4e-2 off.
    shifted_tol: ClassVar[float] = 1e-2

    def __init__(self) -> None:
        super().__init__()
        m = self.model
        #: The model's vocabulary size.
        self.n_vocab = m.n_vocab
        #: The context under test, closed at teardown.
        self.ctx: Context = m.context(
            n_ctx=self.n_ctx, n_batch=self.n_batch, n_seq_max=self.n_seq, kv_unified=True, **self.context_params
        )
        self._own_reference: Context | None = None
        try:
            #: What the KV cache should hold.
            self.cells = KvCells.for_context(self.ctx)
            assert self.ctx.n_seq_max == self.n_seq
            #: Cells of the stream: the context's ``n_ctx``.
            self.n_cells = self.ctx.n_ctx
            if self.reference is None:
                self._own_reference = m.context(
                    n_ctx=self.reference_n_ctx, n_batch=self.n_batch, n_seq_max=1, **self.context_params
                )
        except BaseException:
            self.ctx.close()
            raise
        #: ``self.ctx.memory``.
        self.mem = self.ctx.memory
        #: The store under test.
        self.store = BranchStore(self.ctx, **self.store_options)  # type: ignore[arg-type]
        #: What the model knows of every branch ever made (pruned ones too).
        self.nodes: dict[Branch, Node] = {}
        #: Ids of detached branches, not reused since (their cells may remain).
        self.stale: set[int] = set()

    def teardown(self) -> None:
        self.ctx.close()
        if self._own_reference is not None:
            self._own_reference.close()

    def tokens(self, n: int, seed: int) -> list[int]:
        """``n`` token ids of the model, from ``seed``."""
        n, seed = expect_int("n", n), expect_int("seed", seed)
        return [int(t) for t in np.random.default_rng(seed).integers(0, self.n_vocab, n)]

    # ------------------------------------------------------------------ model helpers
    def _live(self) -> list[Branch]:
        return sorted((b for b, n in self.nodes.items() if n.alive), key=lambda b: b.seq_id)

    def _dead(self) -> list[Branch]:
        return [b for b, n in self.nodes.items() if not n.alive]

    def _free_ids(self) -> list[int]:
        used = {n.seq for n in self.nodes.values() if n.alive}
        return [s for s in range(self.n_seq) if s not in used]

    def _take_id(self) -> int:
        """The id the store hands out next (the lowest free one), emptied first."""
        sid = min(self._free_ids())
        self.cells.rm(sid)
        self.stale.discard(sid)
        return sid

    def _kill(self, b: Branch) -> None:
        """Model of ``Branch._release``: out of its parent's children, id freed."""
        n = self.nodes[b]
        if n.parent is not None:
            self.nodes[n.parent].children.remove(b)
        n.parent = None
        n.alive = False

    def _token(self, b: Branch, how: str, data: st.DataObject) -> int:
        n = self.nodes[b]
        if how == "pending" and n.pending is not None:
            return n.pending  # its sampling surprisal is recorded
        if how == "random":
            return data.draw(st.integers(0, self.n_vocab - 1), label=f"token for seq {n.seq}")  # no sampling surprisal
        t = b.sample()
        assert 0 <= t < self.n_vocab
        n.pending = t
        return t

    def _pick(self, data: st.DataObject) -> Branch:
        return data.draw(st.sampled_from(self._live()), label="branch")

    def _pick_live(self, data: st.DataObject, label: str) -> list[Branch]:
        live = self._live()
        return data.draw(
            st.lists(st.sampled_from(live), min_size=1, max_size=len(live), unique_by=lambda b: b.seq_id),
            label=label,
        )

    # ------------------------------------------------------------------ nothing-changed checks
    def _snapshot(self) -> _Snapshot:
        branches = []
        for b in self.store.branches:
            t = b.tracker
            metrics = (t.count, t.sampling_count, t.total_surprisal) if t is not None else None
            branches.append(
                (
                    b,
                    b.seq_id,
                    b.tokens,
                    b.position,
                    b.logits.copy(),
                    metrics,
                    b.parent,
                    b.children,
                    b._pending,  # a sample() not yet accepted: part of the sampler's state
                )
            )
        kv = [(self.mem.seq_pos_min(s), self.mem.seq_pos_max(s)) for s in range(self.n_seq)]
        return branches, kv, self.store.available

    def _assert_unchanged(self, before: _Snapshot, emptied: int | None = None) -> None:
        """Every branch and the KV are as in ``before`` (``emptied``: an id the failed call
        took and emptied, as the store does with a reused id)."""
        branches, kv, available = self._snapshot()
        assert available == before[2]
        assert len(branches) == len(before[0])
        for now, then in zip(branches, before[0], strict=True):
            assert now[0] is then[0]
            assert now[1:4] == then[1:4], f"{now[0]!r}: (seq, tokens, position) changed"
            np.testing.assert_array_equal(now[4], then[4], err_msg=f"{now[0]!r}: the logits snapshot changed")
            assert now[5] == then[5], f"{now[0]!r}: tracker (count, sampling_count, total) changed"
            assert now[6:8] == then[6:8], f"{now[0]!r}: parent or children changed"
            assert now[8] == then[8], f"{now[0]!r}: the pending sample {then[8]} became {now[8]}"
        want = list(before[1])
        if emptied is not None:
            want[emptied] = (-1, -1)
        assert kv == want, f"a failed call changed the KV: {want} -> {kv}"

    @contextmanager
    def _fails(self, exc: type[BaseException], match: str | None = None, emptied: int | None = None) -> Iterator[None]:
        event(f"{sys._getframe(2).f_code.co_name}: {exc.__name__}")
        before = self._snapshot()
        with expect_raises(exc, match=match):
            yield
        self._assert_unchanged(before, emptied)

    def _pruned(self) -> AbstractContextManager[None]:
        return self._fails(BranchError, "pruned")

    # ------------------------------------------------------------------ creation
    @rule(n=_PROMPT_LEN, seed=_SEED, dist=st.booleans(), track=st.booleans())
    def create(self, n: int, seed: int, dist: bool, track: bool) -> None:
        prompt = self.tokens(n, seed)
        sampler = SamplerChain([TopK(20), Dist(seed)]) if dist else None
        if not self._free_ids():
            with self._fails(CapacityError):
                self.store.create(prompt, sampler=sampler, track=track)
            return
        sid = self._take_id()
        if n > self.n_cells or self.cells.free < n:
            with self._fails(KvCacheFullError, emptied=sid):
                self.store.create(prompt, sampler=sampler, track=track)
            return
        b = self.store.create(prompt, sampler=sampler, track=track)
        assert b.seq_id == sid and b.parent is None and b.is_leaf
        self.cells.add_tokens(sid, range(n))
        self.nodes[b] = Node.root(sid, prompt, track)

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data(), seed=st.none() | _SEED, clone=st.booleans())
    def fork(self, data: st.DataObject, seed: int | None, clone: bool) -> None:
        b = self._pick(data)
        n = self.nodes[b]
        if not self._free_ids():
            with self._fails(CapacityError):
                b.fork(seed=seed)
            return
        sid = self._take_id()
        child = b.fork(seed=seed, clone_logits=clone)
        assert child.seq_id == sid and child.parent is b and child.is_leaf
        if clone:
            np.testing.assert_array_equal(child.logits, b.logits)
        else:
            assert not child.logits.any()
        self.cells.cp(n.seq, sid)  # shares the parent's cells: takes none
        self.nodes[child] = Node(
            sid,
            b,
            list(n.tokens),
            list(n.kv),
            list(n.recipe),
            list(n.refpos),
            n.snap if clone else None,
            tracked=n.tracked,
            count=n.count,
            scount=n.scount,
            acc=list(n.acc),
        )
        n.children.append(child)

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data(), seed=st.none() | _SEED)
    def fork_at(self, data: st.DataObject, seed: int | None) -> None:
        """fork(at=p) of a proper prefix: shares cells [0, p-1), decodes token p-1 into one
        new cell; sampler and metrics replayed to p."""
        b = self._pick(data)
        n = self.nodes[b]
        at = data.draw(st.integers(-1, len(n.kv) + 1), label="at")
        if not 1 <= at <= len(n.kv):
            with self._fails(ParamError, "outside"):
                b.fork(at=at)
            return
        if len(n.kv) != len(n.tokens):
            with self._fails(BranchError, "rebuilt"):
                b.fork(at=at)
            return
        if at == len(n.kv):
            event("fork_at: the whole sequence")
            return
        if not self._free_ids():
            with self._fails(CapacityError):
                b.fork(at=at)
            return
        sid = min(self._free_ids())
        if self.cells.free + len([c for c in self.cells.cells if c[1] == {sid}]) < 1:
            with self._fails(KvCacheFullError, emptied=sid if sid in self.cells.holders else None):
                b.fork(at=at, seed=seed)
            self.cells.rm(sid)
            self.stale.discard(sid)
            return
        sid = self._take_id()
        child = b.fork(at=at, seed=seed)
        assert child.seq_id == sid and child.parent is b and child.is_leaf and child.position == at
        self.cells.cp(n.seq, sid, 0, at - 1)
        self.cells.add_tokens(sid, [at - 1])
        acc = [a for a in n.acc if a[0] < at]
        kv = n.kv[:at]
        self.nodes[child] = Node(
            sid,
            b,
            n.tokens[:at],
            list(kv),
            [("decode", list(kv))],
            list(range(at)),
            [("decode", list(kv))],
            tracked=n.tracked,
            count=len(acc),
            scount=sum(1 for a in acc if a[1]),
            acc=acc,
        )
        n.children.append(child)

    # ------------------------------------------------------------------ decoding
    def _step(self, moves: dict[Branch, int], call: Callable[[], object]) -> None:
        """One token for each branch of ``moves``: one cell each, all or nothing."""
        nodes = [self.nodes[b] for b in moves]
        if any(len(n.kv) >= self.n_cells for n in nodes) or self.cells.free < len(moves):
            with self._fails(KvCacheFullError):
                call()
            return
        call()
        for b, t in moves.items():
            n = self.nodes[b]
            self.cells.add_tokens(n.seq, [len(n.kv)])
            n.acc.append((len(n.tokens), n.pending == t))
            n.tokens.append(t)
            n.count += 1
            n.scount += n.pending == t
            n.decoded([t])

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """A batched step of a random subset of the live branches."""
        moves = {b: self._token(b, data.draw(_HOW, label="how"), data) for b in self._pick_live(data, "step")}
        self._step(moves, lambda: self.store.step(moves))

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data(), how=_HOW)
    def commit(self, data: st.DataObject, how: str) -> None:
        b = self._pick(data)
        t = self._token(b, how, data)
        self._step({b: t}, lambda: b.commit(t))

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data())
    def sample(self, data: st.DataObject) -> None:
        """Choose a token without accepting it: it stays pending (a later commit of that
        token records its sampling surprisal; anything that changes the snapshot drops it)."""
        b = self._pick(data)
        self.nodes[b].pending = t = b.sample()
        assert 0 <= t < self.n_vocab

    def _prefill(self, inputs: dict[Branch, list[int]]) -> None:
        """Packed into n_batch decodes: all or nothing (a failure in a later decode removes
        what the earlier ones wrote)."""
        total = sum(len(t) for t in inputs.values())
        too_far = any(len(self.nodes[b].kv) + len(t) > self.n_cells for b, t in inputs.items())
        if too_far or self.cells.free < total:
            with self._fails(KvCacheFullError):
                self.store.prefill(inputs)
            return
        self.store.prefill(inputs)
        for b, toks in inputs.items():
            if toks:
                n = self.nodes[b]
                self.cells.add_tokens(n.seq, range(len(n.kv), len(n.kv) + len(toks)))
                n.tokens += toks
                n.decoded(toks)  # the snapshot changed: a pending sample is dropped

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data(), seed=_SEED)
    def prefill(self, data: st.DataObject, seed: int) -> None:
        """Several branches, unequal lengths (some 0)."""
        chosen = self._pick_live(data, "prefill")
        lengths = st.one_of(st.integers(0, 8), st.integers(self.n_cells // 8, self.n_cells // 2))
        self._prefill({b: self.tokens(data.draw(lengths, label=f"length {b.seq_id}"), seed + b.seq_id) for b in chosen})

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data(), left=st.integers(0, 4), seed=_SEED)
    def fill(self, data: st.DataObject, left: int, seed: int) -> None:
        """Prefill one branch until ``left`` cells are free: the next steps find the cache full."""
        b = self._pick(data)
        n = self.cells.free - left
        if n > 0 and b.position + n <= self.n_cells:
            self._prefill({b: self.tokens(n, seed)})

    @precondition(lambda self: bool(self.nodes))
    @rule(data=st.data(), kind=st.sampled_from(["twice", "bad_token", "mixed_step", "mixed_prefill", *sorted(_USES)]))
    def misuse(self, data: st.DataObject, kind: str) -> None:
        """Refused before anything changes: any use of a pruned (or detached, or drained)
        branch, alone or in a batch with live ones; a branch twice in one step; a token out
        of range."""
        live, dead = self._live(), self._dead()
        if not live if kind in ("twice", "bad_token") else not dead:
            return
        moves = [(b, 5) for b in self._pick_live(data, "live")] if live else []
        if kind == "twice":
            moves.append((moves[0][0], 6))
            with self._fails(BranchError, "twice"):
                self.store.step(moves)
        elif kind == "bad_token":
            moves[-1] = (moves[-1][0], data.draw(st.sampled_from([-1, self.n_vocab, 10**7])))
            with self._fails(ParamError):
                self.store.step(moves)
        else:
            b = data.draw(st.sampled_from(dead), label="pruned branch")
            moves.insert(data.draw(st.integers(0, len(moves))), (b, 5))
            with self._pruned():
                if kind == "mixed_step":
                    self.store.step(moves)
                elif kind == "mixed_prefill":
                    self.store.prefill({x: [5, 6] for x, _ in moves})
                else:
                    _USES[kind](self.store, b)

    # ------------------------------------------------------------------ the context's edge
    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data(), sinks=st.integers(0, 6), tail=st.none() | st.integers(1, 100))
    def clear_and_reseed(self, data: st.DataObject, sinks: int, tail: int | None) -> None:
        b = self._pick(data)
        n = self.nodes[b]
        t = self.n_cells // 2 if tail is None else tail
        keep = n.tokens if len(n.tokens) <= sinks + t else n.tokens[:sinks] + n.tokens[-t:]
        self.cells.rm(n.seq)  # its own cells go first, whatever follows
        n.emptied()
        if self.cells.free < len(keep):
            # documented: the sequence is then empty and position 0; the snapshot stays
            where = "after" if self.cells.free >= self.n_batch else "in"
            event(f"clear_and_reseed: KvCacheFullError ({where} chunk 1)")
            with expect_raises(KvCacheFullError):
                b.clear_and_reseed(sinks, tail)
            return
        b.clear_and_reseed(sinks, tail)
        self.cells.add_tokens(n.seq, range(len(keep)))
        n.decoded(keep)

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data(), sinks=st.integers(0, 6), n_discard=st.integers(1, 60))
    def shift_context(self, data: st.DataObject, sinks: int, n_discard: int) -> None:
        b = self._pick(data)
        n = self.nodes[b]
        if len(self._live()) > 1:
            with self._fails(BranchError, "only live"):
                b.shift_context(n_discard, sinks)
            return
        if n_discard > len(n.kv) - sinks - 1:
            with self._fails(ParamError):
                b.shift_context(n_discard, sinks)
            return
        b.shift_context(n_discard, sinks)
        self.cells.rm(n.seq, sinks, sinks + n_discard)
        self.cells.add(n.seq, sinks + n_discard, -1, -n_discard)  # stale ids in those cells move too
        n.shifted(sinks, n_discard)

    # ------------------------------------------------------------------ pruning
    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data(), reparent=st.booleans())
    def prune(self, data: st.DataObject, reparent: bool) -> None:
        b = self._pick(data)
        n = self.nodes[b]
        if n.children and not reparent:
            with self._fails(BranchError, "children"):
                b.prune()
            return
        b.prune(reparent=reparent)
        for c in n.children:  # reparent: they move to the end of the grandparent's children
            self.nodes[c].parent = n.parent
            if n.parent is not None:
                self.nodes[n.parent].children.append(c)
        n.children = []
        self.cells.rm(n.seq)
        self._kill(b)

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data())
    def prune_subtree(self, data: st.DataObject) -> None:
        b = self._pick(data)
        b.prune_subtree()

        def drop(x: Branch) -> None:
            for c in list(self.nodes[x].children):
                drop(c)
            self.cells.rm(self.nodes[x].seq)
            self._kill(x)

        drop(b)

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data())
    def detach(self, data: st.DataObject) -> None:
        """Forget the branch, leave its cells: they are stale until its id is reused."""
        b = self._pick(data)
        n = self.nodes[b]
        b.detach()
        for c in n.children:
            self.nodes[c].parent = None
        n.children = []
        self._kill(b)
        self.stale.add(n.seq)

    @precondition(lambda self: len(self._live()) >= 2)
    @rule(data=st.data())
    def retain_only(self, data: st.DataObject) -> None:
        b = self._pick(data)
        n = self.nodes[b]
        self.store.retain_only(b)
        self.cells.keep(n.seq)  # seq_keep: stale cells go too
        self.stale.clear()
        for x, m in self.nodes.items():
            if x is not b and m.alive:
                m.alive = False
                m.parent = None
                m.children = []
        n.parent = None
        n.children = []

    @precondition(lambda self: len(self._live()) == self.n_seq)
    @rule()
    def drain(self) -> None:
        self.store.drain()
        for b in self._live():
            self.cells.rm(self.nodes[b].seq)
            n = self.nodes[b]
            n.alive, n.parent, n.children = False, None, []

    # ------------------------------------------------------------------ logits
    def _reference_logits(self, recipe: list[_Op]) -> npt.NDArray[np.float32] | None:
        """The last decode's logits of ``recipe`` in the fresh reference context (None when
        its positions pass self.reference_n_ctx)."""
        if sum(len(x) for op, x in recipe if op == "decode") > self.reference_n_ctx:
            return None
        ref = self.reference if self.reference is not None else self._own_reference
        assert ref is not None
        ref.memory.clear()
        row = None
        toks: list[int] = []
        for op, x in [*recipe, ("rm", [])]:
            if op == "decode":
                toks += x  # consecutive decodes in one call
                continue
            if toks:
                row = np.array(ref.decode(toks), copy=True)
                toks = []
            for p in x:
                ref.memory.seq_rm(0, p, p + 1)
        assert row is not None
        return row

    @precondition(lambda self: any(self.nodes[b].snap for b in self._live()))
    @rule(data=st.data())
    def check_logits(self, data: st.DataObject) -> None:
        """A branch's snapshot equals a fresh one-sequence context's logits after its tokens
        (after its recipe when shift_context moved its cells)."""
        b = data.draw(st.sampled_from([b for b in self._live() if self.nodes[b].snap]), label="branch")
        snap = self.nodes[b].snap
        assert snap is not None
        fresh = self._reference_logits(snap)
        if fresh is not None:
            shifted = any(op == "rm" for op, _ in snap)
            tol = self.shifted_tol if shifted else self.tol
            np.testing.assert_allclose(b.logits, fresh, rtol=tol, atol=tol)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def ids_do_not_leak(self) -> None:
        live = self._live()
        assert self.store.available + len(self.store) == self.n_seq
        assert len(self.store) == len(live)
        seqs = [b.seq_id for b in self.store.branches]
        assert len(set(seqs)) == len(seqs)
        assert self.store.branches == live  # the same objects, by seq id

    @invariant()
    def kv_holds_exactly_the_positions(self) -> None:
        got = [(self.mem.seq_pos_min(s), self.mem.seq_pos_max(s)) for s in range(self.n_seq)]
        want = [self.cells.span(s) for s in range(self.n_seq)]
        assert got == want, f"memory holds {got}, the model predicts {want}"
        live = self._live()
        for b in live:
            # the model's own consistency: a live sequence holds positions 0..position-1 once each
            assert self.cells.positions(b.seq_id) == list(range(b.position))
            assert got[b.seq_id] == ((0, b.position - 1) if b.position else (-1, -1))
        # only live ids and stale (detached, not reused) ids hold cells
        assert self.cells.holders <= {b.seq_id for b in live} | self.stale
        kv = self.store.kv()
        assert kv["positions"] == sum(b.position for b in live)
        assert kv["n_ctx"] == self.n_cells and kv["remaining"] == max(self.n_cells - kv["positions"], 0)

    @invariant()
    def tree_matches(self) -> None:
        for b, n in self.nodes.items():
            assert b.alive == n.alive, b
            if not n.alive:
                continue
            assert b.seq_id == n.seq
            assert b.parent is n.parent
            assert b.children == n.children and b.is_leaf == (not n.children)
            assert b.tokens == n.tokens
            assert b.position == len(n.kv)
            if n.tracked:
                assert b.tracker is not None
                assert (b.tracker.count, b.tracker.sampling_count) == (n.count, n.scount), b
            else:
                assert b.tracker is None
                with expect_raises(BranchError, match="track=False"):
                    b.perplexity  # noqa: B018
