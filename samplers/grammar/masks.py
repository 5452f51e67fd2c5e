"""The masks of many matchers in one call: one step of many branches, each under its own
grammar and state.

:func:`fill_masks` writes one row of ``uint32`` words per matcher (bit ``t % 32`` of word
``t // 32``, the layout of :meth:`GrammarMatcher.fill_mask`, xgrammar and llguidance).
Matchers at the same parser state of the same compiled grammar share one computation
(branches forked from one another often are); cached masks are copied; the others are
computed by their grammars' C walks in **one** call (``llama_cffi._trie_walk.Trie.masks``),
shared among threads with the GIL released. A walk that needs something not computed yet
(a parser state met for the first time) is finished on its own afterwards, so the result
is always each matcher's own mask. :class:`samplers.branch.BranchStore` uses it to give the
grammar of every branch its mask for a step at once (see :meth:`GrammarSampler.use_mask`).
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

__all__ = ["THREADS_FROM", "fill_masks"]

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
    # one pass over the matchers, all checked before anything is written: those ended,
    # those in a (grammar, state) met before in the list, the C walks (per trie), the rest
    n_words = -1
    ended: list[int] = []
    first: dict[tuple[CompiledGrammar, int, tuple[int, int]], int] = {}  # (grammar, state, partial) -> row
    copies: list[tuple[int, int]] = []  # (row, row it repeats)
    walks: dict[Any, list[tuple[int, CompiledGrammar, int, tuple[int, int]]]] = {}  # per trie
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
        elif c._walks_c and partial[1] == 0 and state != DEAD:  # (c._c_walks)
            jobs = walks.get(c._trie)
            if jobs is None:
                jobs = walks[c._trie] = []
            jobs.append((i, c, state, partial))
        else:
            others.append((i, c, state, partial))
    if not ms:
        return np.zeros((0, 0), dtype=np.uint32) if out is None else out
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
    for trie, jobs in walks.items():
        _walk_jobs(trie, jobs, out, threads)
    for i, j in copies:
        out[i, :n_words] = out[j, :n_words]
    return out


def _walk_jobs(
    trie: Any, jobs: list[tuple[int, CompiledGrammar, int, tuple[int, int]]], out: Any, threads: int
) -> None:
    """The C walks of ``jobs`` (row, compiled grammar, state, partial) in one call, under
    every grammar's lock (taken in a fixed order); cached masks copied instead; a walk
    left unfinished done again on its own."""
    grammars = sorted({c for _, c, _, _ in jobs}, key=id)
    held = []
    try:
        for c in grammars:
            c._lock.acquire()
            held.append(c._lock)
        todo: list[tuple[int, CompiledGrammar, int, tuple[int, int]]] = []
        tgs: list[Any] = []
        plans: list[Any] = []
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
            if state not in c._settled:
                # a state whose walk would wait for something (a transition, a run): on its
                # own, where the walk computes it in the engine, rather than twice
                row = out[i, : c.n_words]
                c._mask_words_c(state, row)
                c._store((state, partial), row)
                continue
            todo.append(job)
            tgs.append(c._tg)
            plans.append(c._batch_plan(state))
            rows.append(i)
            if c._mask_cache_size == 0:  # (_store without a cache: the count alone)
                c.stats["mask_misses"] += 1
        if not todo:
            return
        for c in grammars:
            c._set_tables()
        rcs, pending = trie.masks(tgs, plans, out, rows, threads)
        if not (any(rcs) or any(pending) or any(c._mask_cache_size > 0 for c in grammars)):
            return
        for (i, c, state, partial), rc, n_pending in zip(todo, rcs, pending, strict=True):
            if rc != 0 or n_pending:  # finished on its own: what it waits for is computed there
                c._mask_words_c(state, out[i, : c.n_words])
            if c._mask_cache_size > 0:
                c._store((state, partial), out[i])
    finally:
        for lock in reversed(held):
            lock.release()
