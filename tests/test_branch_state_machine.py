"""A stateful (hypothesis) test of :mod:`samplers.branch` against a pure-Python model.

The model has two parts:

* the **tree**: for every branch ever made, its sequence id, parent, children (in
  order), history (``tokens``), the tokens its sequence holds in the KV cache (``kv``;
  the same as the history until ``clear_and_reseed``/``shift_context`` rebuild it),
  tracker counts, the token a ``sample()`` left pending, and which tokens a fresh
  context must decode to reproduce its logits snapshot;
* the **cells** of llama.cpp's unified KV cache (``kv_unified=True``: one stream of
  ``n_ctx`` cells, a cell holding one position and the set of sequences sharing it),
  as in tests/test_context_state_machine.py. ``seq_cp`` (a fork) tags the parent's
  cells with the child's id and takes no cell; a decode takes one free cell per token.
  That makes ``KvCacheFullError`` predictable exactly: a decode of ``n`` tokens fails
  iff fewer than ``n`` cells are free or a position would pass ``n_ctx``.

Rules: create, fork, step (a random subset of the live branches; tokens sampled, random,
or a pending sample), commit, sample, prefill (unequal lengths), fill (leaves 0-4 cells
free, so steps find the cache full), prune (with or without reparent), prune_subtree,
detach, retain_only, drain, clear_and_reseed, shift_context, misuse (pruned branches,
duplicates, bad tokens) and check_logits. After every rule the invariants compare the
store, the context's memory (per-sequence ``seq_pos_min``/``seq_pos_max``) and the model;
every expected error is checked to leave every branch (tokens, position, snapshot,
tracker, pending sample, tree) and the KV exactly as they were.

Branches are drawn from the model's live (or dead) ones rather than from a ``Bundle``: a
bundle keeps handing out pruned branches, and most steps were then spent on refusals.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import samplers as S
from llama_cffi import Context, Model
from llama_cffi.errors import KvCacheFullError, ParamError
from samplers.branch import Branch, BranchError, BranchStore, CapacityError
from tests import tiny_model as tm

N_SEQ = 4
N_CTX = 256  # llama.cpp pads n_ctx up to 256 for this model: a few long prompts fill it
N_BATCH = 64
INF = 2**31 - 1
# One thread (for batches too): the tiny model gains nothing from two, and on a busy
# machine (two cores, another process on one) OpenMP's barrier makes every two-thread
# decode wait for a time slice: 100 one-token decodes took 17 s with two threads, 0.02 s
# with one.
THREADS = {"n_threads": 1, "n_threads_batch": 1}
REF_CTX = 1024  # the reference context: positions there grow past N_CTX after shift_context
TOL = 2e-3  # rtol and atol: batch shape and cell order change the summation order
# shift_context rotates the f16 keys in place, one more f16 rounding each (~5e-4 relative):
# logits then differ from the reference by up to ~4e-3 (60 random shifts; 2e-3 with f32
# keys). A fresh decode of what is left, the wrong reference, is ~4e-2 off.
TOL_SHIFTED = 1e-2

TOKEN = st.integers(0, tm.N_VOCAB - 1)
SEED = st.integers(0, 2**16)
# short prompts, or long ones that fill the 256 cells after a few rules
PROMPT_LEN = st.one_of(st.integers(1, 12), st.integers(50, 200))
PREFILL_LEN = st.one_of(st.integers(0, 8), st.integers(30, 130))
HOW = st.sampled_from(["sample", "random", "pending"])  # where a step's token comes from


# what misuse does with a pruned branch: each must raise BranchError("... pruned")
USES: dict[str, Callable[[BranchStore, Branch], object]] = {
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


def budget() -> int:
    """Examples: twice the profile's (conftest): 120 of 50 steps, ~15 s, under the default
    one; more under a bigger one. (A failure then shrinks for up to 5 minutes.)"""
    return 2 * settings().max_examples


def _tokens(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, tm.N_VOCAB, n)]


class Cells:
    """llama.cpp's unified KV cells: the occupied ones, each ``[pos, {seq, ...}]``."""

    def __init__(self, n_cells: int) -> None:
        self.n_cells = n_cells
        self.cells: list[list[Any]] = []

    @property
    def free(self) -> int:
        return self.n_cells - len(self.cells)

    def positions(self, seq: int) -> list[int]:
        return sorted(c[0] for c in self.cells if seq in c[1])

    def span(self, seq: int) -> tuple[int, int]:
        ps = self.positions(seq)
        return (ps[0], ps[-1]) if ps else (-1, -1)

    def append(self, seq: int, p0: int, n: int) -> None:
        self.cells.extend([p, {seq}] for p in range(p0, p0 + n))

    def rm(self, seq: int, p0: int = 0, p1: int = INF) -> None:
        """Take ``seq`` out of its cells in ``[p0, p1)``; a cell nobody holds is freed."""
        for c in self.cells:
            if p0 <= c[0] < p1:
                c[1].discard(seq)
        self.cells = [c for c in self.cells if c[1]]

    def cp(self, src: int, dst: int, p1: int = INF) -> None:
        for c in self.cells:
            if src in c[1] and c[0] < p1:
                c[1].add(dst)

    def keep(self, seq: int) -> None:
        self.cells = [[c[0], {seq}] for c in self.cells if seq in c[1]]

    def shift(self, seq: int, p0: int, delta: int) -> None:
        """``seq_add(seq, p0, -1, delta)``: moves the *cells*, for every sequence in them."""
        for c in self.cells:
            if seq in c[1] and c[0] >= p0:
                c[0] += delta

    @property
    def holders(self) -> set[int]:
        return {s for c in self.cells for s in c[1]}


# A recipe rebuilds a sequence's KV in a fresh one-sequence context: ("decode", tokens)
# appends tokens (positions go on from the last one), ("rm", positions) removes cells.
# shift_context is not a fresh decode of what is left: the cells after the dropped ones
# were computed attending to them (only RoPE makes positions relative), so the reference
# for a shifted sequence decodes everything, removes the dropped cells and goes on at the
# old positions (the same relative positions as the shifted cache).
Op = tuple[str, list[int]]


@dataclass
class Node:
    """What the model knows of one branch."""

    seq: int
    parent: Branch | None
    tokens: list[int]  # the history
    kv: list[int]  # the tokens at positions 0.. of the sequence (position == len(kv))
    recipe: list[Op]  # rebuilds the KV in the reference context
    refpos: list[int]  # the reference position of each position of the sequence
    snap: list[Op] | None  # the logits snapshot is the last decode of this recipe (None: zeros)
    tracked: bool = True  # metrics on (a tracker), or off (create(track=False))
    count: int = 0  # tracker.count
    scount: int = 0  # tracker.sampling_count
    pending: int | None = None  # the token the last sample() chose, not yet accepted
    acc: list[tuple[int, bool]] = field(default_factory=list)  # accepted: (history index, was the pending sample)
    children: list[Branch] = field(default_factory=list)
    alive: bool = True

    @classmethod
    def root(cls, seq: int, prompt: list[int], tracked: bool) -> Node:
        n = cls(seq, None, list(prompt), [], [], [], None, tracked=tracked)
        n.decoded(prompt)
        return n

    def decoded(self, toks: list[int]) -> None:
        """``toks`` were decoded into the sequence; the snapshot follows the last one."""
        start = self.refpos[-1] + 1 if self.refpos else 0
        self.kv += toks
        self.recipe.append(("decode", list(toks)))
        self.refpos += range(start, start + len(toks))
        self.snap = list(self.recipe)
        self.pending = None

    def shifted(self, sinks: int, n_discard: int) -> None:
        """``shift_context``: the snapshot stays the one computed before."""
        self.recipe.append(("rm", self.refpos[sinks : sinks + n_discard]))
        del self.kv[sinks : sinks + n_discard], self.refpos[sinks : sinks + n_discard]

    def emptied(self) -> None:
        self.kv, self.recipe, self.refpos = [], [], []


Snapshot = tuple[list[tuple[Any, ...]], list[tuple[int, int]], int]


class BranchMachine(RuleBasedStateMachine):
    """Rules drive a BranchStore over a 4-sequence, 256-cell unified context."""

    model: Model
    reference: Context  # one sequence, for fresh decodes of a branch's tokens

    def __init__(self) -> None:
        super().__init__()
        self.ctx = self.model.context(n_ctx=N_CTX, n_batch=N_BATCH, n_seq_max=N_SEQ, kv_unified=True, **THREADS)
        assert (self.ctx.n_ctx, self.ctx.n_ctx_seq, self.ctx.n_seq_max) == (N_CTX, N_CTX, N_SEQ)
        self.mem = self.ctx.memory
        self.store = BranchStore(self.ctx)
        self.cells = Cells(N_CTX)
        self.nodes: dict[Branch, Node] = {}
        self.stale: set[int] = set()  # ids of detached branches, not reused since (cells may remain)

    def teardown(self) -> None:
        self.ctx.close()

    # ------------------------------------------------------------------ model helpers
    def _live(self) -> list[Branch]:
        return sorted((b for b, n in self.nodes.items() if n.alive), key=lambda b: b.seq_id)

    def _dead(self) -> list[Branch]:
        return [b for b, n in self.nodes.items() if not n.alive]

    def _free_ids(self) -> list[int]:
        used = {n.seq for n in self.nodes.values() if n.alive}
        return [s for s in range(N_SEQ) if s not in used]

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
            return data.draw(TOKEN, label=f"token for seq {n.seq}")  # no sampling surprisal
        t = b.sample()
        assert 0 <= t < tm.N_VOCAB
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
    def _snapshot(self) -> Snapshot:
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
        kv = [(self.mem.seq_pos_min(s), self.mem.seq_pos_max(s)) for s in range(N_SEQ)]
        return branches, kv, self.store.available

    def _assert_unchanged(self, before: Snapshot, emptied: int | None = None) -> None:
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
        with pytest.raises(exc, match=match):
            yield
        self._assert_unchanged(before, emptied)

    def _pruned(self) -> AbstractContextManager[None]:
        return self._fails(BranchError, "pruned")

    # ------------------------------------------------------------------ creation
    @rule(n=PROMPT_LEN, seed=SEED, dist=st.booleans(), track=st.booleans())
    def create(self, n: int, seed: int, dist: bool, track: bool) -> None:
        prompt = _tokens(n, seed)
        sampler = S.SamplerChain([S.TopK(20), S.Dist(seed)]) if dist else None
        if not self._free_ids():
            with self._fails(CapacityError):
                self.store.create(prompt, sampler=sampler, track=track)
            return
        sid = self._take_id()
        if n > N_CTX or self.cells.free < n:
            with self._fails(KvCacheFullError, emptied=sid):
                self.store.create(prompt, sampler=sampler, track=track)
            return
        b = self.store.create(prompt, sampler=sampler, track=track)
        assert b.seq_id == sid and b.parent is None and b.is_leaf
        self.cells.append(sid, 0, n)
        self.nodes[b] = Node.root(sid, prompt, track)

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data(), seed=st.none() | SEED, clone=st.booleans())
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
    @rule(data=st.data(), seed=st.none() | SEED)
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
        self.cells.cp(n.seq, sid, at - 1)
        self.cells.append(sid, at - 1, 1)
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
    def _step(self, moves: dict[Branch, int], call: Callable[[], None]) -> None:
        """One token for each branch of ``moves``: one cell each, all or nothing."""
        nodes = [self.nodes[b] for b in moves]
        if any(len(n.kv) >= N_CTX for n in nodes) or self.cells.free < len(moves):
            with self._fails(KvCacheFullError):
                call()
            return
        call()
        for b, t in moves.items():
            n = self.nodes[b]
            self.cells.append(n.seq, len(n.kv), 1)
            n.acc.append((len(n.tokens), n.pending == t))
            n.tokens.append(t)
            n.count += 1
            n.scount += n.pending == t
            n.decoded([t])

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """A batched step of a random subset of the live branches."""
        moves = {b: self._token(b, data.draw(HOW, label="how"), data) for b in self._pick_live(data, "step")}
        self._step(moves, lambda: self.store.step(moves))

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data(), how=HOW)
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
        assert 0 <= t < tm.N_VOCAB

    def _prefill(self, inputs: dict[Branch, list[int]]) -> None:
        """Packed into n_batch decodes: all or nothing (a failure in a later decode removes
        what the earlier ones wrote)."""
        total = sum(len(t) for t in inputs.values())
        too_far = any(len(self.nodes[b].kv) + len(t) > N_CTX for b, t in inputs.items())
        if too_far or self.cells.free < total:
            with self._fails(KvCacheFullError):
                self.store.prefill(inputs)
            return
        self.store.prefill(inputs)
        for b, toks in inputs.items():
            if toks:
                n = self.nodes[b]
                self.cells.append(n.seq, len(n.kv), len(toks))
                n.tokens += toks
                n.decoded(toks)  # the snapshot changed: a pending sample is dropped

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data(), seed=SEED)
    def prefill(self, data: st.DataObject, seed: int) -> None:
        """Several branches, unequal lengths (some 0)."""
        chosen = self._pick_live(data, "prefill")
        self._prefill({b: _tokens(data.draw(PREFILL_LEN, label=f"length {b.seq_id}"), seed + b.seq_id) for b in chosen})

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data(), left=st.integers(0, 4), seed=SEED)
    def fill(self, data: st.DataObject, left: int, seed: int) -> None:
        """Prefill one branch until ``left`` cells are free: the next steps find the cache full."""
        b = self._pick(data)
        n = self.cells.free - left
        if n > 0 and b.position + n <= N_CTX:
            self._prefill({b: _tokens(n, seed)})

    @precondition(lambda self: bool(self.nodes))
    @rule(data=st.data(), kind=st.sampled_from(["twice", "bad_token", "mixed_step", "mixed_prefill", *sorted(USES)]))
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
            moves[-1] = (moves[-1][0], data.draw(st.sampled_from([-1, tm.N_VOCAB, 10**7])))
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
                    USES[kind](self.store, b)

    # ------------------------------------------------------------------ the context's edge
    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data(), sinks=st.integers(0, 6), tail=st.none() | st.integers(1, 100))
    def clear_and_reseed(self, data: st.DataObject, sinks: int, tail: int | None) -> None:
        b = self._pick(data)
        n = self.nodes[b]
        t = N_CTX // 2 if tail is None else tail
        keep = n.tokens if len(n.tokens) <= sinks + t else n.tokens[:sinks] + n.tokens[-t:]
        self.cells.rm(n.seq)  # its own cells go first, whatever follows
        n.emptied()
        if self.cells.free < len(keep):
            # documented: the sequence is then empty and position 0; the snapshot stays
            event(f"clear_and_reseed: KvCacheFullError ({'after' if self.cells.free >= N_BATCH else 'in'} chunk 1)")
            with pytest.raises(KvCacheFullError):
                b.clear_and_reseed(sinks, tail)
            return
        b.clear_and_reseed(sinks, tail)
        self.cells.append(n.seq, 0, len(keep))
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
        self.cells.shift(n.seq, sinks + n_discard, -n_discard)  # stale ids in those cells move too
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

    @precondition(lambda self: len(self._live()) == N_SEQ)
    @rule()
    def drain(self) -> None:
        self.store.drain()
        for b in self._live():
            self.cells.rm(self.nodes[b].seq)
            n = self.nodes[b]
            n.alive, n.parent, n.children = False, None, []

    # ------------------------------------------------------------------ logits
    def _reference_logits(self, recipe: list[Op]) -> npt.NDArray[np.float32] | None:
        """The last decode's logits of ``recipe`` in the fresh reference context (None when
        its positions pass REF_CTX)."""
        if sum(len(x) for op, x in recipe if op == "decode") > REF_CTX:
            return None
        ref = self.reference
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
            tol = TOL_SHIFTED if shifted else TOL
            np.testing.assert_allclose(b.logits, fresh, rtol=tol, atol=tol)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def ids_do_not_leak(self) -> None:
        live = self._live()
        assert self.store.available + len(self.store) == N_SEQ
        assert len(self.store) == len(live)
        seqs = [b.seq_id for b in self.store.branches]
        assert len(set(seqs)) == len(seqs)
        assert self.store.branches == live  # the same objects, by seq id

    @invariant()
    def kv_holds_exactly_the_positions(self) -> None:
        got = [(self.mem.seq_pos_min(s), self.mem.seq_pos_max(s)) for s in range(N_SEQ)]
        want = [self.cells.span(s) for s in range(N_SEQ)]
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
        assert kv["n_ctx"] == N_CTX and kv["remaining"] == max(N_CTX - kv["positions"], 0)

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
                with pytest.raises(BranchError, match="track=False"):
                    b.perplexity  # noqa: B018


def test_branch_store_state_machine(tiny_model: Model) -> None:
    """Random create/fork/step/commit/prefill/prune/detach/retain_only/drain (and the
    context-edge operations) keep the store's tree, ids and KV exactly where the model
    puts them; every refused or failed operation changes nothing."""
    with tiny_model.context(n_ctx=REF_CTX, n_batch=N_BATCH, n_seq_max=1, **THREADS) as reference:

        class Machine(BranchMachine):
            model = tiny_model

        Machine.reference = reference
        run_state_machine_as_test(
            Machine, settings=settings(max_examples=budget(), stateful_step_count=50, deadline=None)
        )


# ---------------------------------------------------------------------- found by the machine
def _store(model: Model, n_seq_max: int = 2) -> tuple[Context, BranchStore]:
    ctx = model.context(n_ctx=N_CTX, n_batch=N_BATCH, n_seq_max=n_seq_max, kv_unified=True, **THREADS)
    return ctx, BranchStore(ctx)


def test_failed_clear_and_reseed_leaves_no_cells(tiny_model: Model) -> None:
    """A reseed that runs out of cells after its first n_batch chunk: the branch says
    position 0 ("the sequence is empty now"), so the KV must hold nothing for it, and the
    next commit must go on at position 0."""
    ctx, store = _store(tiny_model)
    with ctx:
        a = store.create([1] + [5 + i % 40 for i in range(179)])  # 180 cells
        b = a.fork()  # shares them: 76 cells free
        with pytest.raises(KvCacheFullError):
            a.clear_and_reseed(sinks=4, tail=100)  # a's cells stay (b holds them); 104 needed: 64 fit
        assert a.position == 0
        assert ctx.memory.seq_pos_max(a.seq_id) == -1, "the first chunk of the failed reseed stayed in the KV"
        a.commit(5)
        assert a.position == 1 and ctx.memory.seq_pos_max(a.seq_id) == 0
        assert ctx.memory.seq_pos_max(b.seq_id) == 179


def test_failed_prefill_keeps_a_pending_sample(tiny_model: Model) -> None:
    """A prefill whose second decode finds no cells changes no branch, including one whose
    tokens all went in with the first decode: its pending sample() survives, so committing
    that token records its sampling surprisal."""
    ctx, store = _store(tiny_model)
    with ctx:
        a = store.create([1, 5, 6], sampler=S.SamplerChain([S.TopK(20), S.Dist(3)]))
        b = store.create([1] + [7] * 149)  # 153 cells used, 103 free
        t = a.sample()
        with pytest.raises(KvCacheFullError):
            store.prefill({a: [8] * 10, b: [9] * 100})  # decode 1: a's 10 and 54 of b; decode 2: 46 > 39 free
        assert (a.tokens, a.position, b.position) == ([1, 5, 6], 3, 150)
        a.commit(t)
        assert a.tracker is not None
        assert (a.tracker.count, a.tracker.sampling_count) == (1, 1), "the failed prefill dropped the pending sample"
