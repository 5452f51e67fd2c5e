"""The masks of many matchers in one call: one step of many branches, each under its own
grammar and state.

:func:`fill_masks` writes one row of ``uint32`` words per matcher (bit ``t % 32`` of word
``t // 32``, the layout of :meth:`GrammarMatcher.fill_mask`, xgrammar and llguidance).
Matchers at the same parser state of the same compiled grammar share one computation
(branches forked from one another often are); cached masks are copied; the others are
computed by their grammars' C walks in **one** call (``llama_cffi_trie_masks``), shared
among threads with the GIL released. A state met before, whose walk needs nothing more, has
its C job (grammar and plan) kept by its grammar, so that most matchers cost the call a
few list appends. A walk that needs something not computed yet (a parser state met for the
first time) is walked on its own, so the result is always each matcher's own mask.
:class:`samplers.branch.BranchStore` uses it to give the grammar of every branch its mask
for a step at once (see :meth:`GrammarSampler.use_mask`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from llama_cffi._args import expect_int, expect_iterable, type_error

from .compiled import CompiledGrammar
from .engine import DEAD
from .matcher import GrammarMatcher

__all__ = ["THREADS_FROM", "fill_masks", "shared_rows"]

#: by default, fewer matchers than this are walked on the calling thread alone
THREADS_FROM = 16


def _default_threads() -> int:
    return max(1, min(16, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def fill_masks(
    matchers: Sequence[GrammarMatcher], out: npt.NDArray[np.uint32] | None = None, n_threads: int | None = None
) -> npt.NDArray[np.uint32]:
    """Row ``i`` of the result is ``matchers[i].fill_mask()`` (all zeros for a matcher
    whose grammar has ended). Every matcher must be for the same vocabulary size.
    ``out``: a C-contiguous ``uint32`` array of shape ``(len(matchers), n_words)`` or more
    columns (written and returned); made when None. ``n_threads``: threads for the C walks
    (default: the CPUs this process may use, at most 16; one below :data:`THREADS_FROM`
    walks, where waking threads costs more than it saves)."""
    ms = list(expect_iterable("matchers", matchers, "a sequence of GrammarMatcher"))
    if out is not None and not isinstance(out, np.ndarray):
        raise type_error("out", "a C-contiguous uint32 array (one row per matcher) or None", out)
    if n_threads is not None:
        n_threads = expect_int("n_threads", n_threads, "an int or None")
    return _fill(ms, out, n_threads, True)[0]


def shared_rows(matchers: Sequence[GrammarMatcher]) -> list[npt.NDArray[np.uint32]]:
    """:func:`fill_masks` of ``matchers`` as one row per matcher, where matchers at the same
    parser state of the same grammar get the same array (the first one's row, written once:
    no copies), as :meth:`GrammarSampler.use_mask` takes them; a consumer of many masks
    (:func:`llama_cffi.kernels.masked_top_k_rows`) then reads each distinct one once. The
    rows are views of one matrix; like :func:`fill_masks`' result, they are the caller's."""
    ms = list(expect_iterable("matchers", matchers, "a sequence of GrammarMatcher"))
    out, copies = _fill(ms, None, None, False)
    rows = list(out)
    for i, j in copies:
        rows[i] = rows[j]
    return rows


def _fill(
    ms: list[GrammarMatcher], out: npt.NDArray[np.uint32] | None, n_threads: int | None, write_copies: bool
) -> tuple[npt.NDArray[np.uint32], list[tuple[int, int]]]:
    """:func:`fill_masks` (its arguments checked), and the rows that repeat an earlier one
    (row, the row it repeats: same grammar, state and partial character), written unless
    ``write_copies`` is false."""
    # one pass over the matchers, all checked before anything is written: those ended,
    # those in a (grammar, state) met before in the list, the C walks ready to be batched
    # (a settled state with a plan, no mask cache, on the first such trie), the rest
    n_words = -1
    ended: list[int] = []
    first: dict[tuple[CompiledGrammar, int, tuple[int, int]], int] = {}  # (grammar, state, partial) -> row
    copies: list[tuple[int, int]] = []  # (row, row it repeats)
    trie: Any = None  # the trie of the ready walks
    jobs: list[Any] = []  # per ready walk: its C job (grammar and plan), its row
    rows: list[int] = []
    ready: dict[CompiledGrammar, int] = {}  # the ready walks' grammars: how many walks each
    rest: dict[Any, list[tuple[int, CompiledGrammar, int, tuple[int, int]]]] = {}  # other C walks, per trie
    others: list[tuple[int, CompiledGrammar, int, tuple[int, int]]] = []
    for i, m in enumerate(ms):
        if not isinstance(m, GrammarMatcher):
            raise TypeError(f"matchers[{i}] must be a GrammarMatcher, not {type(m).__name__}")
        c = m._compiled
        if c.n_words != n_words:
            if n_words >= 0:
                raise ValueError(f"matchers[{i}] is for a vocabulary of another size")
            n_words = c.n_words
        if m.ended:
            ended.append(i)
            continue
        state, partial = m.state, m.partial
        j = first.setdefault((c, state, partial), i)
        if j != i:
            copies.append((i, j))
        elif c._uncached_c and partial[1] == 0 and state != DEAD:  # (c._c_walks, no mask cache)
            p = c._ready.get(state)
            if p is not None and (c._trie is trie or trie is None):
                trie = c._trie
                jobs.append(p)
                rows.append(i)
                ready[c] = ready.get(c, 0) + 1
            else:
                rest.setdefault(c._trie, []).append((i, c, state, partial))
        elif c._walks_c and partial[1] == 0 and state != DEAD:
            rest.setdefault(c._trie, []).append((i, c, state, partial))
        else:
            others.append((i, c, state, partial))
    if not ms:
        return (np.zeros((0, 0), dtype=np.uint32) if out is None else out), copies
    if out is None:
        out = np.empty((len(ms), n_words), dtype=np.uint32)
    elif (
        out.dtype != np.uint32
        or out.ndim != 2
        or out.shape[0] < len(ms)
        or out.shape[1] < n_words
        or not out.flags.c_contiguous
        or not out.flags.writeable
    ):
        raise ValueError(f"out must be a writeable C-contiguous uint32 array of shape ({len(ms)}, >= {n_words})")
    threads = (_default_threads() if len(ms) >= THREADS_FROM else 1) if n_threads is None else int(n_threads)
    for i in ended:
        out[i, :n_words] = 0
    for i, c, state, partial in others:
        c.fill_words(state, partial, out[i])
    if rows:
        _walk_ready(ms, trie, ready, jobs, rows, out, threads)
    for t, tjobs in rest.items():
        _walk_jobs(t, tjobs, out, threads)
    if write_copies:
        for i, j in copies:
            out[i, :n_words] = out[j, :n_words]
    return out, copies


def _release(held: list[Any]) -> None:
    """Release the locks taken, the last first."""
    for lock in reversed(held):
        lock.release()


def _walk_ready(
    ms: list[GrammarMatcher],
    trie: Any,
    ready: dict[CompiledGrammar, int],
    jobs: list[Any],
    rows: list[int],
    out: Any,
    threads: int,
) -> None:
    """The ready walks (of ``ms[rows[k]]``: grammars without a mask cache, settled states
    with plans, see ``CompiledGrammar._ready``) in one C call, under their grammars' locks,
    with their tables set; a walk left unfinished done again on its own."""
    held = []
    try:
        for c in sorted(ready, key=id):  # (the locks in a fixed order)
            c._lock.acquire()
            held.append(c._lock)
            c._set_tables()
            c.stats["mask_misses"] += ready[c]
        if trie._masks(jobs, out, rows, threads):
            for i, redo in zip(rows, trie._redo(len(rows)), strict=True):
                if redo:  # finished on its own: what it waits for is computed there
                    c = ms[i]._compiled
                    c._mask_words_c(ms[i].state, out[i, : c.n_words])
    finally:
        _release(held)


def _walk_jobs(
    trie: Any, jobs: list[tuple[int, CompiledGrammar, int, tuple[int, int]]], out: Any, threads: int
) -> None:
    """The C walks of ``jobs`` (row, compiled grammar, state, partial) in one call, under
    every grammar's lock; cached masks copied instead; a state not settled yet walked on
    its own (its walk computes what it waits for), a walk left unfinished done again on
    its own; the plans of settled states kept in ``_ready`` for the next call."""
    held = []
    try:
        for c in sorted({c for _, c, _, _ in jobs}, key=id):  # (the locks in a fixed order)
            c._lock.acquire()
            held.append(c._lock)
        todo: list[tuple[int, CompiledGrammar, int, tuple[int, int]]] = []
        cjobs: list[Any] = []
        rows: list[int] = []
        for job in jobs:
            i, c, state, partial = job
            if c._mask_cache_size > 0:
                packed = c._cached_packed((state, partial))
                if packed is not None:
                    words = out[i].view(np.uint8)
                    words[len(packed) : 4 * c.n_words] = 0
                    words[: len(packed)] = packed
                    continue
            p = c._ready.get(state)
            if p is None:
                if state not in c._settled:
                    # a state whose walk would wait for something (a transition, a run): on
                    # its own, where the walk computes it in the engine, rather than twice
                    row = out[i, : c.n_words]
                    c._mask_words_c(state, row)
                    c._store((state, partial), row)
                    continue
                p = c._ready[state] = c._tg.batch_job(c._batch_plan(state))
            todo.append(job)
            cjobs.append(p)
            rows.append(i)
        if not todo:
            return
        for c in {c for _, c, _, _ in todo}:
            c._set_tables()
        redo = trie._redo(len(todo)) if trie._masks(cjobs, out, rows, threads) else None
        for k, (i, c, state, partial) in enumerate(todo):
            if redo is not None and redo[k]:  # finished on its own: what it waits for is computed there
                c._mask_words_c(state, out[i, : c.n_words])
            c._store((state, partial), out[i])
    finally:
        _release(held)
