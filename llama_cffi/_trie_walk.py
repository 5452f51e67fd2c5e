"""Token-trie walks for grammar masks, in C inside ``_llama`` (``_native/trie_walk.c``).

A grammar mask asks, for every token of a vocabulary, whether a parser state can take
the token's characters. :mod:`samplers.grammar.compiled` answers it by walking the
vocabulary's code-point trie under the grammar's transition table; this module is the
innermost loop of that walk, with the GIL released (the algorithm, what the arrays
mean, and the numpy walk kept as the reference, are in ``samplers.grammar``).

* :class:`Trie` holds one vocabulary's trie in the layout the C reads (``int32``
  arrays, checked once when it is made).
* A grammar writes no per-node array: a node's class is the class of its code point
  (``cls_of_cp[node_cpi[node]]``), and whether a subtree is made of a set of classes is
  read from the trie's shared summaries (:func:`below_summary`) against the set's own;
  :meth:`Trie.nodes_per_class` weighs the classes.
* :meth:`Trie.run_scan` finds the tokens of at most ``k`` characters made only of a
  set of classes (a state's *run*: the classes that all lead it to one successor, for
  as many characters as every string of them stays alive; a state's self-loops are a
  run of any length) and the nodes where such paths leave the run.
* :class:`TrieGrammar` walks: it writes allowed tokens as bits (bit ``t % 32`` of
  ``uint32`` word ``t // 32``) and returns, instead of guessing, the subtrees it
  could not decide because something was not computed yet (a transition, a state's
  run, which partial characters a state completes); the caller computes those and
  walks them again.

Arguments are checked here (dtype, shape, contiguity, lengths); indices read from the
arrays are bounds-checked in C, so bad data raises :class:`ValueError` instead of
reading out of bounds. Ownership: a :class:`Trie` or :class:`TrieGrammar` keeps the
arrays it was given alive and reads them in place (do not modify them while a walk
runs); ``mask`` arrays are written, nothing else is.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from ._binding import ffi, lib

__all__ = [
    "PEND_PCHAR",
    "PEND_RUN",
    "PEND_TRANS",
    "TRANS_UNKNOWN",
    "RunScan",
    "SharedScan",
    "Trie",
    "TrieGrammar",
    "mask_logits",
]

#: the transition table's "not computed yet" value
TRANS_UNKNOWN: int = int(lib.LLAMA_CFFI_TRANS_UNKNOWN)
#: reasons a subtree is pending: a transition (the detail is the class), a state's run,
#: a state's partial characters (the detail is the state)
PEND_TRANS: int = int(lib.LLAMA_CFFI_PEND_TRANS)
PEND_RUN: int = int(lib.LLAMA_CFFI_PEND_RUN)
PEND_PCHAR: int = int(lib.LLAMA_CFFI_PEND_PCHAR)

_PENDING_CAP = 16384  # entries per walk call; more are walked in further calls
_ENGINE_ERR = -100  # a walk's engine error rc comes back as _ENGINE_ERR + rc (LLAMA_CFFI_GENGINE_WALK_ERR)
_BATCH_PENDING_CAP = 256  # per job of a batch: a job with more is done again on its own
_NO_PENDING = np.zeros((0, 4), dtype=np.int32)
_NO_PENDING.flags.writeable = False
#: run_scan_extend's outputs at first: _EXTEND_FACTOR times the base's frontier (and its
#: partial-character tokens) plus _EXTEND_ROOM (then, if that is too little, the whole
#: trie and vocabulary)
_EXTEND_FACTOR = 2
_EXTEND_ROOM = 4096

I32 = npt.NDArray[np.int32]
U64 = npt.NDArray[np.uint64]
U32 = npt.NDArray[np.uint32]


def _i32(name: str, a: npt.ArrayLike, n: int | None = None) -> I32:
    arr = np.ascontiguousarray(a, dtype=np.int32)
    if arr.ndim != 1 or (n is not None and len(arr) != n):
        raise ValueError(f"{name} must be a 1-D array of {n} values, not shape {arr.shape}")
    return arr


_U32 = np.dtype(np.uint32)


def _words(name: str, a: Any, n: int) -> U32:
    # (once per mask: a dtype compared with a dtype, not with np.uint32, and one flags object)
    if not isinstance(a, np.ndarray) or a.dtype != _U32 or a.ndim != 1:
        raise TypeError(f"{name} must be a 1-D C-contiguous uint32 ndarray")
    flags = a.flags
    if not flags.c_contiguous:
        raise TypeError(f"{name} must be a 1-D C-contiguous uint32 ndarray")
    if len(a) < n:
        raise ValueError(f"{name} has {len(a)} words, {n} needed")
    if not flags.writeable:
        raise ValueError(f"{name} is read-only")
    return a


def _check_rc(rc: int, what: str) -> None:
    if rc == -1:
        raise ValueError(f"{what}: an index in the trie or grammar arrays is out of range")
    if rc == -2:
        raise MemoryError(f"{what}: out of memory")
    if rc != 0:
        raise RuntimeError(f"{what} failed ({rc})")


def mask_logits(logits: npt.NDArray[np.float32], ids: I32 | None, words: U32, n_vocab: int) -> int:
    """Set ``logits[i] = -inf`` where token ``ids[i]`` (``i`` when ``ids`` is None) has its bit
    clear in the mask ``words`` (bit ``t % 32`` of word ``t // 32``), in place, in one C pass.
    Returns how many were set. An id outside ``[0, n_vocab)`` raises
    :class:`~llama_cffi.errors.InvalidTokenError` (candidates before it are already masked)."""
    from .errors import InvalidTokenError

    if not isinstance(logits, np.ndarray) or logits.dtype != np.float32 or logits.ndim != 1:
        raise TypeError("logits must be a 1-D float32 ndarray")
    if not logits.flags.c_contiguous or not logits.flags.writeable:
        raise ValueError("logits must be writeable and C-contiguous")
    n = len(logits)
    if not 0 <= n_vocab < 2**31 - 32:
        raise ValueError(f"n_vocab {n_vocab} is out of range")
    if not isinstance(words, np.ndarray) or words.dtype != np.uint32 or words.ndim != 1:
        raise TypeError("words must be a 1-D uint32 ndarray")
    words = np.ascontiguousarray(words)
    if len(words) < (n_vocab + 31) // 32:
        raise ValueError(f"words has {len(words)} words, {(n_vocab + 31) // 32} needed")
    id_ptr = ffi.NULL
    if ids is None:
        if n > n_vocab:
            raise ValueError(f"{n} logits but a vocabulary of {n_vocab}")
    else:
        ids = _i32("ids", ids, n)
        id_ptr = ffi.from_buffer("int32_t[]", ids)
    got = int(
        lib.llama_cffi_mask_logits(
            n, ffi.from_buffer("float[]", logits), id_ptr, ffi.from_buffer("uint32_t[]", words), n_vocab
        )
    )
    if got < 0:
        raise InvalidTokenError(f"candidate ids must lie in [0, {n_vocab})")
    return got


class RunScan:
    """What :meth:`Trie.run_scan` found for a run ``(L, k)``: ``mask`` (the whole tokens
    of at most ``k`` characters, all of classes in ``L``, as bits), ``frontier`` (the
    nodes whose parent's path is such a path and that leave it: their class is not in
    ``L``, or their parent is ``k`` deep), grouped by the parent's depth ``d`` and the
    node's class ``c``: group ``d * n_classes + c`` is
    ``frontier[group_start[g]:group_start[g + 1]]``, except the root's children, which
    are implicit (a walk takes them from the grammar's root groups: see ``llama_cffi.h``);
    ``run``, the run's classes (``W`` words); and ``pt_tokens`` (such tokens that
    end inside a character, decided by the partial character alone), with their depth
    in characters ``pt_depth``. (A plain class: a dataclass would cost milliseconds of
    code generation at the first import.)"""

    __slots__ = ("absorbed", "frontier", "group_start", "k", "mask", "on", "pt_depth", "pt_tokens", "run")

    def __init__(
        self,
        k: int,
        mask: U32,
        frontier: I32,
        group_start: I32,
        pt_tokens: I32,
        pt_depth: I32,
        run: U64,
        on: npt.NDArray[np.uint8] | None = None,
    ) -> None:
        self.k, self.mask, self.frontier, self.group_start, self.run = k, mask, frontier, group_start, run
        self.pt_tokens, self.pt_depth = pt_tokens, pt_depth
        #: which nodes are on the run's paths (kept by scans that shorter ones derive from;
        #: with ``absorbed``, those a skipping scan visited)
        self.on = on
        #: the subtrees a skipping scan kept for derivations took whole: (node, level) pairs
        self.absorbed: I32 | None = None


class SharedScan:
    """A full-length :class:`RunScan` in terms no grammar's classes enter, so that every
    grammar whose run holds the same code points (JSON string content, ``[a-z]``) can
    take it (:meth:`TrieGrammar.shared`, :meth:`TrieGrammar.unshare`): a scan depends
    only on which of the vocabulary's code points its run holds, and on ``k``. ``nodes``
    is the frontier (the root's children apart, as in :class:`RunScan`) with each
    node's parent depth in ``depths``; ``mask``, ``pt_tokens`` and ``pt_depth`` are as in
    :class:`RunScan`; ``on`` and ``absorbed`` (both or neither) are what a derivation of a
    shorter length reads (with them, the nodes at each level on the run's paths are the
    ``on`` ones and those below an ``absorbed`` one: the same nodes whichever class
    partition made the scan). Read-only: the arrays may be views of a memory-mapped
    cache file."""

    __slots__ = ("absorbed", "depths", "k", "mask", "nodes", "on", "pt_depth", "pt_tokens")

    def __init__(
        self,
        k: int,
        mask: U32,
        nodes: I32,
        depths: I32,
        pt_tokens: I32,
        pt_depth: I32,
        on: npt.NDArray[np.uint8] | None = None,
        absorbed: I32 | None = None,
    ) -> None:
        if (on is None) != (absorbed is None):
            raise ValueError("on and absorbed come together")
        if len(nodes) != len(depths) or len(pt_tokens) != len(pt_depth):
            raise ValueError("nodes and depths, pt_tokens and pt_depth must have equal lengths")
        self.k, self.mask, self.nodes, self.depths = k, mask, nodes, depths
        self.pt_tokens, self.pt_depth, self.on, self.absorbed = pt_tokens, pt_depth, on, absorbed

    @property
    def keeps_paths(self) -> bool:
        """Whether shorter lengths can be derived from it (``on`` and ``absorbed``)."""
        return self.on is not None


class _ScanOut:
    """The outputs of a run scan (the C functions' common last arguments), and the
    :class:`RunScan` made of them."""

    def __init__(self, trie: Trie, n_classes: int, k: int, run: U64, reuse: _ScanOut | None = None) -> None:
        self.k, self.run = k, run
        self.cap = trie.n_nodes + 1
        self.mask = np.zeros(trie.n_words, dtype=np.uint32)
        self.group_start = np.empty((k + 1) * n_classes + 1, dtype=np.int32)
        self.scratch: I32
        self.frontier: I32
        self.pt: I32
        self.pt_depth: I32
        self.n_front: Any
        self.n_pt: Any
        if reuse is not None:  # the buffers whose contents are copied out: another scan's (no scan runs meanwhile)
            self.scratch, self.frontier, self.pt = reuse.scratch, reuse.frontier, reuse.pt
            self.pt_depth, self.n_front, self.n_pt = reuse.pt_depth, reuse.n_front, reuse.n_pt
            return
        self.scratch = np.empty(2 * self.cap, dtype=np.int32)
        self.frontier = np.empty(self.cap, dtype=np.int32)
        self.pt = np.empty(trie.n_vocab + 1, dtype=np.int32)
        self.pt_depth = np.empty(trie.n_vocab + 1, dtype=np.int32)
        self.n_front = ffi.new("int32_t *")
        self.n_pt = ffi.new("int32_t *")

    def args(self) -> tuple[Any, ...]:
        return (
            ffi.from_buffer("uint32_t[]", self.mask),
            ffi.from_buffer("int32_t[]", self.frontier),
            self.cap,
            self.n_front,
            ffi.from_buffer("int32_t[]", self.group_start),
            ffi.from_buffer("int32_t[]", self.pt),
            ffi.from_buffer("int32_t[]", self.pt_depth),
            len(self.pt),
            self.n_pt,
            ffi.from_buffer("int32_t[]", self.scratch),
        )

    def result(self, rc: int, on: npt.NDArray[np.uint8] | None = None) -> RunScan:
        _check_rc(rc, "trie run scan")
        n, nf = self.n_pt[0], self.n_front[0]
        return RunScan(
            self.k,
            self.mask,
            self.frontier[:nf].copy(),
            self.group_start,
            self.pt[:n].copy(),
            self.pt_depth[:n].copy(),
            self.run,
            on,
        )


def _runs(run: Any, w: int, max_depth: int) -> U64:
    """A scan's runs as ``(n, w)`` uint64 words (a copy: the scan keeps its first row):
    one run (``w`` words), or a chain's, one per character (the ``j``-th character of a
    path of the run is of a class in row ``min(j, n - 1)``: the last repeats),
    ``1 <= n <= max_depth + 2``."""
    runs = np.array(run, dtype=np.uint64)
    if runs.ndim == 1:
        runs = runs[None, :]
    if runs.ndim != 2 or runs.shape[1] != w or not 1 <= len(runs) <= max_depth + 2:
        raise ValueError(f"run must be {w} uint64 words, or 1 to {max_depth + 2} rows of them")
    return np.ascontiguousarray(runs)


def _derived(trie: Trie, base: RunScan, k: int, frontier: I32, group_start: I32) -> RunScan:
    """The scan of length ``k`` derived from ``base``: its frontier and groups as the C
    derivation made them; the mask and partial tokens the base's, limited to ``k``
    characters."""
    keep = base.pt_depth <= k
    return RunScan(
        k, base.mask & trie.len_mask(k), frontier, group_start, base.pt_tokens[keep], base.pt_depth[keep], base.run
    )


@functools.cache
def special_cps() -> npt.NDArray[np.int64]:
    """The code points >= 128 that a trie node's ``below_flags`` tell apart from the others
    below it (``llama_cffi_trie_special_cps``: Unicode's white space and line separators,
    which ``\\s``, ``\\S`` and ``.`` set apart), increasing, read-only. Read from the C
    list, the one the grammar's binding (``llama_cffi_trie_bind``) sorts classes by."""
    out = np.empty(64, dtype=np.int32)
    n = lib.llama_cffi_trie_special_cps(ffi.from_buffer("int32_t[]", out), len(out))
    _check_rc(min(n, 0), "trie special code points")
    cps = out[:n].astype(np.int64)
    cps.flags.writeable = False
    return cps


def below_summary(
    level_base: npt.ArrayLike, parent: npt.ArrayLike, node_cp: npt.ArrayLike, has_pt: npt.ArrayLike
) -> tuple[U64, npt.NDArray[np.uint8]]:
    """Per node of a trie (numbered level by level, the root last; see :class:`Trie`): the
    ASCII code points strictly below it (``below_asc``: 2 words per node, bit ``cp % 64``
    of word ``cp // 64``), and ``below_flags``: bit 0, a code point >= 128 strictly
    below that is not special (:func:`special_cps`); bit 1, a token ending inside a
    character at or below (``has_pt``); bit 2, a special code point strictly below. One
    pass up the levels, shared by every grammar on the vocabulary."""
    base = np.asarray(level_base, dtype=np.int64)
    par = np.asarray(parent, dtype=np.int64)
    cp = np.asarray(node_cp, dtype=np.int64)
    n = len(par)
    lo_bits = np.zeros(n + 1, dtype=np.uint64)
    hi_bits = np.zeros(n + 1, dtype=np.uint64)
    one = np.uint64(1)
    own_lo = np.where(cp < 64, np.left_shift(one, (cp & 63).astype(np.uint64)), np.uint64(0))
    own_hi = np.where((cp >= 64) & (cp < 128), np.left_shift(one, (cp & 63).astype(np.uint64)), np.uint64(0))
    na = np.zeros(n + 1, dtype=bool)
    sp = np.zeros(n + 1, dtype=bool)
    own_sp = np.isin(cp, special_cps())
    own_na = (cp >= 128) & ~own_sp
    pt = np.asarray(has_pt).astype(bool).copy()
    for lo, hi in zip(base[-2::-1].tolist(), base[:0:-1].tolist(), strict=True):
        if hi == lo:
            continue
        p = par[lo:hi]
        starts = np.flatnonzero(np.r_[True, p[1:] != p[:-1]])
        ups = p[starts]
        lo_bits[ups] |= np.bitwise_or.reduceat(lo_bits[lo:hi] | own_lo[lo:hi], starts)
        hi_bits[ups] |= np.bitwise_or.reduceat(hi_bits[lo:hi] | own_hi[lo:hi], starts)
        na[ups] |= np.logical_or.reduceat(na[lo:hi] | own_na[lo:hi], starts)
        sp[ups] |= np.logical_or.reduceat(sp[lo:hi] | own_sp[lo:hi], starts)
        pt[ups] |= np.logical_or.reduceat(pt[lo:hi], starts)
    asc = np.empty(2 * (n + 1), dtype=np.uint64)
    asc[0::2], asc[1::2] = lo_bits, hi_bits
    return asc, (na.astype(np.uint8) | (pt.astype(np.uint8) << 1) | (sp.astype(np.uint8) << 2)).astype(np.uint8)


#: a trie node with at least this many children is a big node (``llama_cffi_trie``'s
#: ``big_nodes``); read when a :class:`Trie` is made
BIG_CHILDREN = 64


class _BatchWork:
    """One thread's working arrays for :meth:`Trie.masks` batches of up to ``cap`` jobs:
    the jobs (grammar and plan) and their rows, their results and pending counts (``res``:
    ``cap`` results, then ``cap`` counts), pending subtrees and walk frames."""

    __slots__ = ("cap", "frames", "frames_c", "jobs", "pending", "pending_c", "res", "res_c", "rows")

    def __init__(self, cap: int, frames_n: int) -> None:
        self.cap = cap
        self.jobs = ffi.new("llama_cffi_trie_job *[]", cap)
        self.rows = ffi.new("int32_t[]", cap)
        self.res = np.zeros(2 * cap, dtype=np.int32)
        self.res_c = ffi.from_buffer("int32_t[]", self.res)
        self.pending = np.empty(cap * 4 * _BATCH_PENDING_CAP, dtype=np.int32)
        self.pending_c = ffi.from_buffer("int32_t[]", self.pending)
        self.frames = np.empty(cap * frames_n, dtype=np.int32)
        self.frames_c = ffi.from_buffer("int32_t[]", self.frames)


class Trie:
    """One vocabulary's code-point trie for the C walks (the layout of
    :class:`samplers.grammar.vocab_index.VocabIndex`; see ``llama_cffi.h``). Node
    arrays marked + below have ``n_nodes + 1`` entries (the root is node ``n_nodes``).

    ``level_base``: level ``j``'s nodes are ``level_base[j] .. level_base[j + 1]``
    (``max_depth + 1`` values); ``node_cpi``, ``parent``: per node; ``first_child``, ``n_child``, ``row_start``,
    ``row_end``, ``n_term``, ``has_pt``: +; ``order``: per row, the token;
    ``pchar_slot``: per token, its partial character's index (``-1``: none);
    ``root_pt``: the tokens that are only a partial character; ``n_pchars``: the
    number of distinct partial characters; ``max_depth``: the longest token in code
    points. ``height`` (+: the most code points below each node) is computed when not
    given. ``lengths`` (per token, its whole code points) lets :meth:`run_derive` work.
    ``below_asc`` and ``below_flags`` (see :func:`below_summary`) are computed from
    ``uniq_cps`` (the code point of each ``node_cpi`` value) when not given; ``cp_nodes``
    (the nodes of each ``node_cpi`` value) is counted on first use when not given. The
    nodes with at least :data:`BIG_CHILDREN` children (the root apart) are its big nodes,
    whose children each :class:`TrieGrammar` groups by class. ``packed``: the node arrays
    as the walks read them (:meth:`packed_arrays` of a trie made from the same arrays, as
    a cache file keeps them), packed here when not given."""

    def __init__(
        self,
        *,
        n_vocab: int,
        max_depth: int,
        n_pchars: int,
        level_base: npt.ArrayLike,
        node_cpi: npt.ArrayLike,
        parent: npt.ArrayLike,
        first_child: npt.ArrayLike,
        n_child: npt.ArrayLike,
        row_start: npt.ArrayLike,
        row_end: npt.ArrayLike,
        n_term: npt.ArrayLike,
        has_pt: npt.ArrayLike,
        order: npt.ArrayLike,
        pchar_slot: npt.ArrayLike,
        root_pt: npt.ArrayLike,
        height: npt.ArrayLike | None = None,
        lengths: npt.ArrayLike | None = None,
        below_asc: npt.ArrayLike | None = None,
        below_flags: npt.ArrayLike | None = None,
        uniq_cps: npt.ArrayLike | None = None,
        cp_nodes: npt.ArrayLike | None = None,
        packed: tuple[npt.ArrayLike, npt.ArrayLike] | None = None,
    ) -> None:
        node_cpi_a = _i32("node_cpi", node_cpi)
        n_nodes = len(node_cpi_a)
        if not 0 <= n_vocab < 2**31 - 64 or not 0 <= max_depth < 2**20 or n_nodes >= 2**31 - 2:
            raise ValueError("the trie is too large")
        self.n_vocab, self.n_nodes, self.max_depth, self.n_pchars = n_vocab, n_nodes, max_depth, n_pchars
        self._arrays = {
            "node_cpi": node_cpi_a,
            "parent": _i32("parent", parent, n_nodes),
            "first_child": _i32("first_child", first_child, n_nodes + 1),
            "n_child": _i32("n_child", n_child, n_nodes + 1),
            "row_start": _i32("row_start", row_start, n_nodes + 1),
            "row_end": _i32("row_end", row_end, n_nodes + 1),
            "n_term": _i32("n_term", n_term, n_nodes + 1),
            "order": _i32("order", order, n_vocab),
            "pchar_slot": _i32("pchar_slot", pchar_slot, n_vocab),
            "root_pt": _i32("root_pt", root_pt),
        }
        self._has_pt = np.ascontiguousarray(has_pt, dtype=np.uint8)
        if self._has_pt.shape != (n_nodes + 1,):
            raise ValueError(f"has_pt must have {n_nodes + 1} values")
        slots = self._arrays["pchar_slot"]
        if len(slots) and (int(slots.max(initial=-1)) >= n_pchars or int(slots.min(initial=-1)) < -1):
            raise ValueError(f"pchar_slot must lie in [-1, {n_pchars})")
        root_pt_a = self._arrays["root_pt"]
        if len(root_pt_a) and (int(root_pt_a.min()) < 0 or int(root_pt_a.max()) >= n_vocab):
            raise ValueError("root_pt holds a token out of range")
        # the most code points below each node, level by level from the deepest
        par = self._arrays["parent"]
        if n_nodes and (int(par.min()) < 0 or int(par.max()) > n_nodes):
            raise ValueError("parent holds a node out of range")
        base = np.asarray(level_base, dtype=np.int64)
        if base.shape != (max_depth + 1,) or (len(base) and (base[0] != 0 or base[-1] != n_nodes)):
            raise ValueError(f"level_base must hold {max_depth + 1} values from 0 to {n_nodes}")
        if (np.diff(base) < 0).any():
            raise ValueError("level_base must not decrease")
        if height is not None:
            height_a = _i32("height", height, n_nodes + 1)
            if n_nodes and (int(height_a.min()) < 0 or int(height_a.max()) > max_depth):
                raise ValueError(f"height must lie in [0, {max_depth}]")
        else:
            height_a = np.zeros(n_nodes + 1, dtype=np.int32)
            for lo, hi in zip(base[-2::-1].tolist(), base[:0:-1].tolist(), strict=True):
                if hi == lo:
                    continue
                p = par[lo:hi]
                if len(p) > 1 and (p[1:] < p[:-1]).any():
                    raise ValueError("the parents of a level must not decrease")
                starts = np.flatnonzero(np.r_[True, p[1:] != p[:-1]])
                top = np.maximum.reduceat(height_a[lo:hi] + 1, starts)
                height_a[p[starts]] = np.maximum(height_a[p[starts]], top)
        self._arrays["height"] = height_a
        self._arrays["level_base"] = base.astype(np.int32)
        if below_asc is None or below_flags is None:
            if uniq_cps is None:
                raise ValueError("give below_asc and below_flags, or uniq_cps to compute them")
            ucp = np.asarray(uniq_cps, dtype=np.int64)
            if len(node_cpi_a) and (int(node_cpi_a.min()) < 0 or int(node_cpi_a.max()) >= len(ucp)):
                raise ValueError("node_cpi holds an index out of range of uniq_cps")
            below_asc, below_flags = below_summary(base, par, ucp[node_cpi_a], self._has_pt)
        self._below_asc = np.ascontiguousarray(below_asc, dtype=np.uint64)
        self._below_flags = np.ascontiguousarray(below_flags, dtype=np.uint8)
        if self._below_asc.shape != (2 * (n_nodes + 1),) or self._below_flags.shape != (n_nodes + 1,):
            raise ValueError(f"below_asc must have {2 * (n_nodes + 1)} values and below_flags {n_nodes + 1}")
        self._lengths = None if lengths is None else np.asarray(lengths)
        if self._lengths is not None and self._lengths.shape != (n_vocab,):
            raise ValueError(f"lengths must have {n_vocab} values")
        self._len_masks: dict[int, U32] = {}
        self._token_node: I32 | None = None  # see token_node
        t = self._struct = ffi.new("llama_cffi_trie *")
        t.n_nodes, t.n_vocab, t.max_depth = n_nodes, n_vocab, max_depth
        t.n_pchars, t.n_root_pt = n_pchars, len(root_pt_a)
        self._keep = []
        for name, arr in self._arrays.items():
            buf = ffi.from_buffer("int32_t[]", arr)
            self._keep.append(buf)
            setattr(t, name, buf)
        buf = ffi.from_buffer("uint8_t[]", self._has_pt)
        self._keep.append(buf)
        t.has_pt = buf
        buf = ffi.from_buffer("uint64_t[]", self._below_asc)
        self._keep.append(buf)
        t.below_asc = buf
        buf = ffi.from_buffer("uint8_t[]", self._below_flags)
        self._keep.append(buf)
        t.below_flags = buf
        # the node arrays packed one record per node (llama_cffi_tnode, 48 bytes), and each
        # row's token with its partial-character slot: what the walks and scans read (a
        # node reached costs one or two cache lines, not one per array: a grammar's first
        # walks in a process run with cold caches). Given (a cache file's, made by
        # packed_arrays), or packed here (~5 ms and 24 MB at 262,144 tokens)
        size = (n_nodes + 1) * ffi.sizeof("llama_cffi_tnode")
        if packed is not None:
            nodes_a, row_tok_a = (np.asarray(a) for a in packed)
            if (
                nodes_a.dtype != np.uint8
                or nodes_a.shape != (size,)
                or row_tok_a.dtype != np.int32
                or row_tok_a.shape != (2 * n_vocab,)
                or not nodes_a.flags.c_contiguous
                or not row_tok_a.flags.c_contiguous
            ):
                raise ValueError(f"packed must be {size} uint8 node bytes and {2 * n_vocab} int32 row values")
            self._nodes, self._row_tok = nodes_a, row_tok_a
            nodes_c = ffi.cast("const llama_cffi_tnode *", ffi.from_buffer(nodes_a))
            row_tok_c = ffi.from_buffer("int32_t[]", row_tok_a)
        else:
            self._nodes = np.empty(size, dtype=np.uint8)
            self._row_tok = np.empty(2 * n_vocab, dtype=np.int32)
            nodes_c = ffi.cast("llama_cffi_tnode *", ffi.from_buffer(self._nodes))
            row_tok_c = ffi.from_buffer("int32_t[]", self._row_tok)
            _check_rc(lib.llama_cffi_trie_pack(t, nodes_c, row_tok_c), "trie pack")
        self._keep += [nodes_c, row_tok_c]
        t.nodes, t.row_tok = nodes_c, row_tok_c
        self._frames_n = 3 * (max_depth + 2)
        self._batch_work = threading.local()  # per thread: a _BatchWork for masks
        self._n_root_children = int(self._arrays["n_child"][n_nodes])
        # the nodes with many children (Gemma 3: 20, one of them the space before a word
        # with 2,852): a grammar groups their children by class (TrieGrammar), and a walk
        # skips the groups its state does not take, not each child
        nch = self._arrays["n_child"][:n_nodes]
        big = np.flatnonzero(nch >= BIG_CHILDREN).astype(np.int32)
        self._big_nodes = big
        self._big_base = np.zeros(len(big) + 1, dtype=np.int32)
        np.cumsum(nch[big], out=self._big_base[1:])
        t.n_big, t.big_min = len(big), BIG_CHILDREN
        for name in ("big_nodes", "big_base"):
            buf = ffi.from_buffer("int32_t[]", getattr(self, "_" + name))
            self._keep.append(buf)
            setattr(t, name, buf)
        self._per_cp: npt.NDArray[np.float64] | None = None
        if cp_nodes is not None:
            per_cp = np.asarray(cp_nodes)
            if per_cp.ndim != 1 or (len(per_cp) and int(per_cp.min()) < 0):
                raise ValueError("cp_nodes must be counts, one per code point index")
            self._per_cp = per_cp.astype(np.float64)

    def clear_below(self, out: U32, nodes: I32, tokens: I32) -> None:
        """Clear in ``out`` (mask words, at least ``ceil(n_vocab / 32)``) the bits of the
        tokens below each of ``nodes`` (their own included) and of ``tokens`` (ids), in C.
        Raises ValueError for a node or token out of range."""
        _words("out", out, self.n_words)
        nd, tk = _i32("nodes", nodes), _i32("tokens", tokens)
        rc = lib.llama_cffi_trie_clear_below(
            self._struct,
            ffi.from_buffer("uint32_t[]", out),
            ffi.from_buffer("int32_t[]", nd),
            len(nd),
            ffi.from_buffer("int32_t[]", tk),
            len(tk),
        )
        _check_rc(rc, "clear below")

    def packed_arrays(self) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int32]]:
        """The node arrays packed as the walks read them (``llama_cffi_tnode`` records, the
        root last, as bytes; per row its token and the token's partial-character slot),
        for a cache file: a trie made with ``packed=`` these skips the packing."""
        return self._nodes, self._row_tok

    @property
    def n_words(self) -> int:
        """``uint32`` words of a mask: ``ceil(n_vocab / 32)``."""
        return (self.n_vocab + 31) // 32

    def nodes_per_class(self, cls_of_cp: npt.ArrayLike, n_classes: int) -> npt.NDArray[np.int64]:
        """How many nodes each class has, for a grammar whose code point ``i`` (an index
        of ``node_cpi``) has class ``cls_of_cp[i]``: a sum over the code points (the
        trie's nodes per code point are counted once), no per-node array."""
        cc = _i32("cls_of_cp", cls_of_cp)
        if not 0 <= n_classes < 2**24:
            raise ValueError(f"n_classes {n_classes} is out of range")
        if len(cc) and (int(cc.min()) < 0 or int(cc.max()) >= n_classes):
            raise ValueError(f"cls_of_cp must lie in [0, {n_classes})")
        per_cp = self._nodes_per_cp()
        if len(cc) < len(per_cp):
            raise ValueError(f"cls_of_cp must have a class for each of the trie's {len(per_cp)} code points")
        return np.bincount(cc[: len(per_cp)], weights=per_cp, minlength=n_classes).astype(np.int64)[:n_classes]

    def _nodes_per_cp(self) -> npt.NDArray[np.float64]:
        """The trie's nodes per code point index (counted on first use)."""
        if self._per_cp is None:
            cpi = self._arrays["node_cpi"]
            if len(cpi) and int(cpi.min()) < 0:
                raise ValueError("node_cpi holds a negative index")
            self._per_cp = np.bincount(cpi).astype(np.float64)
        return self._per_cp

    def run_scan(self, cls: I32, n_classes: int, run: U64, k: int, keep_on: bool = False) -> RunScan:
        """See :class:`RunScan`. ``cls``: each node's class (the reference scan's input;
        :class:`TrieGrammar` scans without it); ``run``: ``W`` words, or a chain's runs,
        ``(n, W)`` (see :func:`_runs`); ``0 <= k <= max_depth + 1`` (``max_depth + 1``: any
        length). ``keep_on``: keep which nodes are on the run's paths, for
        :meth:`run_derive`."""
        cls = _i32("cls", cls, self.n_nodes)
        w = n_classes // 64 + 1
        runs = _runs(run, w, self.max_depth)
        if not 0 <= k <= self.max_depth + 1:
            raise ValueError(f"k must lie in [0, {self.max_depth + 1}], not {k}")
        out = _ScanOut(self, n_classes, k, runs[0])
        on = np.empty(self.n_nodes + 1, dtype=np.uint8) if keep_on else None
        rc = lib.llama_cffi_trie_run_scan(
            self._struct,
            ffi.from_buffer("int32_t[]", cls),
            n_classes,
            ffi.from_buffer("uint64_t[]", runs),
            len(runs),
            k,
            *out.args(),
            ffi.NULL if on is None else ffi.from_buffer("uint8_t[]", on),
        )
        return out.result(rc, on)

    def masks(
        self, grammars: list[TrieGrammar], plans: list[Any], out: U32, rows: list[int], n_threads: int
    ) -> tuple[list[int], list[int]]:
        """The masks of many :meth:`TrieGrammar.plan` s in one call, shared among ``n_threads``
        threads (the GIL released): row ``rows[i]`` of ``out`` (a writeable C-contiguous 2-D
        uint32 array of at least ``n_words`` columns) gets what ``grammars[i].mask(plans[i],
        ...)`` writes. Returns, per job, the C result (0: done) and how many subtrees were
        left pending: a job with either not zero is to be done again on its own
        (:meth:`TrieGrammar.mask`, then :meth:`TrieGrammar.walk`). The call's working
        arrays are the calling thread's, kept between calls (grown to the largest batch)."""
        n = len(plans)
        if len(grammars) != n or len(rows) != n:
            raise ValueError("one grammar and one row per plan")
        if (
            not isinstance(out, np.ndarray)
            or out.dtype != np.uint32
            or out.ndim != 2
            or out.shape[1] < self.n_words
            or not out.flags.c_contiguous
            or not out.flags.writeable
        ):
            raise ValueError(f"out must be a writeable C-contiguous 2-D uint32 array of >= {self.n_words} columns")
        if n == 0:
            return [], []
        n_rows = out.shape[0]
        for i, (g, p, r) in enumerate(zip(grammars, plans, rows, strict=True)):
            if g.trie is not self or p[5] is not g or not g._tables:
                raise ValueError(f"job {i}: its grammar is not on this trie, its plan not its grammar's, or no tables")
            if type(r) is not int or not 0 <= r < n_rows:
                raise ValueError(f"job {i}: row {r!r} is not a row of out")
        self._masks([g.batch_job(p) for g, p in zip(grammars, plans, strict=True)], out, rows, n_threads)
        work = self._batch_work.arrays
        return ffi.unpack(work.res_c, n), ffi.unpack(work.res_c + work.cap, n)

    def _masks(self, jobs: list[Any], out: U32, rows: list[int], n_threads: int) -> int:
        """:meth:`masks` without its checks, for :func:`samplers.grammar.fill_masks`:
        ``jobs``, from :meth:`TrieGrammar.batch_job` (grammars on this trie, their tables set;
        the grammars and plans kept alive by the caller); ``out`` as :meth:`masks` checks it.
        The rows are checked in C, before any walk. Returns how many jobs are to be done
        again; :meth:`_redo` says which."""
        n = len(jobs)
        work = getattr(self._batch_work, "arrays", None)
        if work is None or work.cap < n:
            work = self._batch_work.arrays = _BatchWork(max(n, 2 * work.cap if work is not None else 8), self._frames_n)
        work.jobs[0:n] = jobs
        work.rows[0:n] = rows
        res = work.res_c
        rc: int = lib.llama_cffi_trie_masks(
            self._struct,
            n,
            work.jobs,
            ffi.from_buffer("uint32_t[]", out),
            out.shape[1],
            out.shape[0],
            work.rows,
            work.pending_c,
            _BATCH_PENDING_CAP,
            res + work.cap,
            work.frames_c,
            self._frames_n,
            res,
            max(1, int(n_threads)),
        )
        if rc < 0:
            raise ValueError("trie masks: a row outside the array, or a job without a grammar or plan")
        return rc

    def _redo(self, n: int) -> list[bool]:
        """After :meth:`_masks` of ``n`` jobs on this thread: per job, whether it is to be
        done again on its own (a result not 0, or subtrees left pending)."""
        work = self._batch_work.arrays
        rcs, pending = ffi.unpack(work.res_c, n), ffi.unpack(work.res_c + work.cap, n)
        return [rc != 0 or k != 0 for rc, k in zip(rcs, pending, strict=True)]

    def token_node(self) -> I32:
        """Per token, the node where its row is (its path's end; the root's tokens, with no
        whole character, and any other token without a row: -1), made once."""
        got = self._token_node
        if got is None:
            a = self._arrays
            n_term = a["n_term"][: self.n_nodes].astype(np.int64)
            nodes = np.repeat(np.arange(self.n_nodes, dtype=np.int32), n_term)
            first = np.repeat(a["row_start"][: self.n_nodes].astype(np.int64), n_term)
            rows = first + (np.arange(len(nodes)) - np.repeat(np.cumsum(n_term) - n_term, n_term))
            got = np.full(self.n_vocab, -1, dtype=np.int32)
            got[a["order"][rows]] = nodes
            self._token_node = got
        return got

    def len_mask(self, k: int) -> U32:
        """The tokens of at most ``k`` whole code points, as mask words (cached)."""
        got = self._len_masks.get(k)
        if got is None:
            if self._lengths is None:
                raise ValueError("this trie was made without the tokens' lengths")
            bits = np.packbits(self._lengths <= k, bitorder="little")
            got = np.zeros(self.n_words, dtype=np.uint32)
            got.view(np.uint8)[: len(bits)] = bits
            self._len_masks[k] = got
        return got

    def run_derive(self, base: RunScan, cls: I32, n_classes: int, run: U64, k: int) -> RunScan:
        """:meth:`run_scan` of the same run for a length ``k`` below ``base.k``, from ``base``
        (made with ``keep_on``): no pass over the trie, only over the nodes ``k`` deep."""
        if base.on is None or not 0 <= k < base.k:
            raise ValueError("run_derive needs a scan made with keep_on, of a greater length")
        cls = _i32("cls", cls, self.n_nodes)
        run = np.array(run, dtype=np.uint64)  # a copy: the scan keeps it
        if run.shape != (n_classes // 64 + 1,) or len(base.group_start) != (base.k + 1) * n_classes + 1:
            raise ValueError("run or base does not fit n_classes")
        cap = len(base.frontier) + self.n_nodes + 1
        frontier = np.empty(cap, dtype=np.int32)
        group_start = np.empty((k + 1) * n_classes + 1, dtype=np.int32)
        n_front = ffi.new("int32_t *")
        rc = lib.llama_cffi_trie_run_derive(
            self._struct,
            ffi.from_buffer("int32_t[]", cls),
            n_classes,
            ffi.from_buffer("uint64_t[]", run),
            k,
            ffi.from_buffer("uint8_t[]", base.on),
            ffi.from_buffer("int32_t[]", base.frontier),
            len(base.frontier),
            ffi.from_buffer("int32_t[]", base.group_start),
            base.k,
            ffi.from_buffer("int32_t[]", frontier),
            cap,
            n_front,
            ffi.from_buffer("int32_t[]", group_start),
        )
        _check_rc(rc, "trie run derive")
        return _derived(self, base, k, frontier[: n_front[0]].copy(), group_start)


class TrieGrammar:
    """One grammar's walks over a :class:`Trie`: ``cls_of_cp``, the class of each code
    point index of the trie; ``ascii_cls``, the class of each ASCII code point;
    ``na_classes`` (``2 * W`` words), the classes holding a code point >= 128 of the
    vocabulary that is not special (:func:`special_cps`), then those holding a special
    one; the tables that grow as the grammar is explored are given with
    :meth:`set_tables` (again whenever one of them is replaced). Not thread-safe: one
    walk at a time (the caller's lock)."""

    def __init__(
        self,
        trie: Trie,
        cls_of_cp: npt.ArrayLike,
        n_classes: int,
        ascii_cls: npt.ArrayLike,
        na_classes: npt.ArrayLike,
        absorb_min_rows: int = 64,
    ) -> None:
        w = n_classes // 64 + 1
        cls_a = _i32("cls_of_cp", cls_of_cp)
        if len(cls_a) and (int(cls_a.min()) < 0 or int(cls_a.max()) >= n_classes):
            raise ValueError(f"cls_of_cp must lie in [0, {n_classes})")
        ascii_a = _i32("ascii_cls", ascii_cls, 128)
        if int(ascii_a.min()) < 0 or int(ascii_a.max()) >= max(n_classes, 1):
            raise ValueError(f"ascii_cls must lie in [0, {n_classes})")
        na_a = np.ascontiguousarray(na_classes, dtype=np.uint64)
        if na_a.shape != (2 * w,):
            raise ValueError(f"na_classes must be {2 * w} uint64 words")
        # per byte of a class set's words and its value, the ASCII code points of those
        # classes: a run's code points are 8 * W lookups (llama_cffi.h: asc_table)
        cls_asc = np.zeros((64 * w, 2), dtype=np.uint64)
        cps = np.arange(128)
        np.bitwise_or.at(cls_asc, (ascii_a, cps >> 6), np.left_shift(np.uint64(1), (cps & 63).astype(np.uint64)))
        # table[j, v] = OR of cls_asc[8j + bit] over the bits set in v: the values with
        # bit b set are those below 2**b, each with cls_asc[8j + b] added
        table = np.zeros((8 * w, 256, 2), dtype=np.uint64)
        per_bit = cls_asc.reshape(8 * w, 8, 2)
        for bit in range(8):
            n = 1 << bit
            np.bitwise_or(table[:, :n], per_bit[:, bit, None, :], out=table[:, n : 2 * n])
        root_nodes = np.empty(max(1, int(trie._n_root_children)), dtype=np.int32)
        root_start = np.empty(n_classes + 1, dtype=np.int32)
        _check_rc(
            lib.llama_cffi_trie_root_groups(
                trie._struct,
                ffi.from_buffer("int32_t[]", cls_a),
                len(cls_a),
                n_classes,
                ffi.from_buffer("int32_t[]", root_nodes),
                ffi.from_buffer("int32_t[]", root_start),
            ),
            "trie root groups",
        )
        self._setup(trie, n_classes, cls_a, ascii_a, na_a, table, root_nodes, root_start, absorb_min_rows)

    @classmethod
    def bind(
        cls,
        trie: Trie,
        uniq_cps: I32,
        n_ascii: int,
        edges: I32,
        interval_class: I32,
        n_classes: int,
        ascii_cls: I32,
        absorb_min_rows: int = 64,
    ) -> tuple[TrieGrammar, I32, npt.NDArray[np.float64]]:
        """A grammar's walks from its classes as intervals of code points, in one C call
        (``llama_cffi_trie_bind``; :class:`TrieGrammar` itself is the reference): the
        trie's code points ``uniq_cps`` (int32, increasing; the first ``n_ascii`` below
        128), the grammar's ``edges`` (``n_int + 1`` increasing int32 code points from 0)
        with the class of each interval between them, and ``ascii_cls``. Returns the
        grammar (which keeps ``na_classes``), ``cls_of_cp`` and the trie's nodes per class
        (float64).
        Bad arguments raise ValueError; nothing is left half made."""
        w = n_classes // 64 + 1
        ucp = _i32("uniq_cps", uniq_cps)
        weight = trie._nodes_per_cp()
        if len(weight) != len(ucp):
            raise ValueError(f"uniq_cps must hold the trie's {len(weight)} code points")
        ed = _i32("edges", edges)
        ic = _i32("interval_class", interval_class, len(ed) - 1)
        asc = _i32("ascii_cls", ascii_cls, 128)
        cls_of_cp = np.empty(len(ucp), dtype=np.int32)
        class_weight = np.empty(max(n_classes, 1), dtype=np.float64)
        na = np.empty(2 * w, dtype=np.uint64)
        table = np.empty((8 * w, 256, 2), dtype=np.uint64)
        root_nodes = np.empty(max(1, int(trie._n_root_children)), dtype=np.int32)
        root_start = np.empty(n_classes + 1, dtype=np.int32)
        rc = lib.llama_cffi_trie_bind(
            trie._struct,
            ffi.from_buffer("int32_t[]", ucp),
            ffi.from_buffer("double[]", weight),
            len(ucp),
            n_ascii,
            ffi.from_buffer("int32_t[]", ed),
            ffi.from_buffer("int32_t[]", ic),
            len(ic),
            n_classes,
            ffi.from_buffer("int32_t[]", asc),
            ffi.from_buffer("int32_t[]", cls_of_cp),
            ffi.from_buffer("double[]", class_weight),
            ffi.from_buffer("uint64_t[]", na),
            ffi.from_buffer("uint64_t[]", table),
            ffi.from_buffer("int32_t[]", root_nodes),
            ffi.from_buffer("int32_t[]", root_start),
        )
        if rc == -2:  # pragma: no cover - a few kilobytes
            raise MemoryError("binding a grammar to the trie: out of memory")
        if rc != 0:
            raise ValueError(
                "binding a grammar to the trie: inconsistent arguments (code points not increasing or not the"
                " trie's, edges not increasing from 0, or a class out of range)"
            )
        self = cls.__new__(cls)
        self._setup(trie, n_classes, cls_of_cp, asc, na, table, root_nodes, root_start, absorb_min_rows)
        return self, cls_of_cp, class_weight[:n_classes]

    def _setup(
        self,
        trie: Trie,
        n_classes: int,
        cls_of_cp: I32,
        ascii_cls: I32,
        na_classes: npt.NDArray[np.uint64],
        asc_table: npt.NDArray[np.uint64],
        root_nodes: I32,
        root_start: I32,
        absorb_min_rows: int,
    ) -> None:
        """The object's state from its checked tables (``__init__`` and :meth:`bind`)."""
        #: per run scan a plan was made from: :meth:`plan`'s part of it (:meth:`_scan_parts`)
        self._plan_parts: dict[RunScan, tuple[Any, ...]] = {}
        self.trie = trie
        w = n_classes // 64 + 1
        self.n_classes, self.W = n_classes, w
        self._cls_of_cp, self._ascii_cls, self._na_classes = cls_of_cp, ascii_cls, na_classes
        self._asc_table = asc_table
        g = self._g = ffi.new("llama_cffi_trie_grammar *")
        g.n_classes, g.W, g.absorb_min_rows = n_classes, w, absorb_min_rows
        self._keep: dict[str, Any] = {"cls_of_cpi": ffi.from_buffer("int32_t[]", cls_of_cp)}
        self._keep["asc_table"] = ffi.from_buffer("uint64_t[]", asc_table)
        self._keep["na_classes"] = ffi.from_buffer("uint64_t[]", na_classes)
        g.cls_of_cpi, g.n_cps = self._keep["cls_of_cpi"], len(cls_of_cp)
        g.asc_table, g.na_classes = self._keep["asc_table"], self._keep["na_classes"]
        # the root's children by class: every scan's implicit depth-0 frontier
        self._root_nodes, self._root_start = root_nodes, root_start
        self._keep["root_nodes"] = ffi.from_buffer("int32_t[]", root_nodes)
        self._keep["root_start"] = ffi.from_buffer("int32_t[]", root_start)
        g.root_nodes, g.root_start = self._keep["root_nodes"], self._keep["root_start"]
        if len(trie._big_nodes):  # the big nodes' children by class (llama_cffi_trie_big_groups)
            n_big_kids = int(trie._big_base[-1])
            kids = np.empty(n_big_kids, dtype=np.int32)
            nxt = np.empty(n_big_kids, dtype=np.int32)
            self._keep["big_kids"] = ffi.from_buffer("int32_t[]", kids)
            self._keep["big_next"] = ffi.from_buffer("int32_t[]", nxt)
            self._keep["big_arrays"] = (kids, nxt)
            rc = lib.llama_cffi_trie_big_groups(
                trie._struct, g.cls_of_cpi, len(cls_of_cp), n_classes, self._keep["big_kids"], self._keep["big_next"]
            )
            if rc == -2:  # pragma: no cover - a few kilobytes
                raise MemoryError("grouping the trie's big nodes: out of memory")
            _check_rc(rc, "trie big groups")
            g.big_kids, g.big_next = self._keep["big_kids"], self._keep["big_next"]
        else:
            g.big_kids = g.big_next = ffi.NULL
        self._scan_bufs: _ScanOut | None = None
        g.engine = g.class_weight = g.run_chain = ffi.NULL
        self._g_plain: Any = None
        self._engine: Any = None
        self._on_engine_error: Callable[[int], object] | None = None
        self._tables: tuple[Any, ...] = ()
        self._pending = np.empty(4 * _PENDING_CAP, dtype=np.int32)
        self._pending_c = ffi.from_buffer("int32_t[]", self._pending)
        self._n_pending = ffi.new("int32_t *")
        self._frames = np.empty(trie._frames_n, dtype=np.int32)
        self._frames_c = ffi.from_buffer("int32_t[]", self._frames)
        #: the C walks' last arguments (:meth:`_walk_buffers`), made once
        self._walk_args = (self._pending_c, _PENDING_CAP, self._n_pending, self._frames_c, len(self._frames))
        self._pchar_scratch: Any = None  # (position_mask: a state's partial-character answers, scratch)
        self._first_args: tuple[Any, ...] | None = None  # first_mask's converted eog and pchars

    def attach_engine(
        self,
        engine: Any,
        on_error: Callable[[int], object],
        class_weight: npt.NDArray[np.float64] | None = None,
        run_cap: int = 0,
        max_run_stacks: int = 0,
    ) -> None:
        """Let :meth:`mask` and :meth:`walk` compute the transitions they meet with
        ``engine`` (a ``llama_cffi_gengine *`` of this grammar, kept alive here) instead of
        leaving them pending; the caller holds the engine (its lock) during each walk and
        syncs its own copy of the table after. With ``class_weight`` (per class, float64)
        they also compute the runs of states below the run tables' length
        (``llama_cffi_gengine_run(..., run_cap, max_run_stacks)``), writing them into the
        tables given to :meth:`set_tables`. ``on_error(rc)`` raises for an engine error
        ``rc`` (budget, memory). Batched masks (:meth:`Trie.masks`) never use it."""
        self._engine = engine
        self._on_engine_error = on_error
        g = self._g
        self._g_plain = None
        g.engine = ffi.cast("void *", engine)
        if class_weight is not None:
            cw = np.ascontiguousarray(class_weight, dtype=np.float64)
            if cw.shape != (self.n_classes,) or not 0 <= run_cap <= self.trie.max_depth + 1 or max_run_stacks < 0:
                raise ValueError("class_weight needs n_classes values; run_cap and max_run_stacks in range")
            chain = np.empty(run_cap + 1, dtype=np.int32)
            self._keep["class_weight"] = ffi.from_buffer("double[]", cw)
            self._keep["run_chain"] = ffi.from_buffer("int32_t[]", chain)
            self._keep["run_arrays"] = (cw, chain)
            g.class_weight, g.run_chain = self._keep["class_weight"], self._keep["run_chain"]
            g.run_cap, g.max_run_stacks = int(run_cap), int(max_run_stacks)

    def run_scan(self, run: U64, k: int, keep: bool = False) -> RunScan:
        """:meth:`Trie.run_scan` for this grammar, faster (subtrees wholly of the run are set
        at once, not visited). ``run``: ``W`` words, or a chain's runs ``(n, W)`` (see
        :func:`_runs`; then not ``keep``). ``keep``: keep what :meth:`run_derive` needs
        (the visited nodes on the run's paths, the subtrees taken whole)."""
        trie = self.trie
        runs = _runs(run, self.W, trie.max_depth)
        if keep and len(runs) > 1:
            raise ValueError("keep needs a run of one class set (derivations are of one)")
        if not 0 <= k <= trie.max_depth + 1:
            raise ValueError(f"k must lie in [0, {trie.max_depth + 1}], not {k}")
        out = self._scan_bufs = _ScanOut(trie, self.n_classes, k, runs[0], self._scan_bufs)
        on = absorbed = None
        n_abs = ffi.new("int32_t *")
        if keep:
            on = np.zeros(trie.n_nodes + 1, dtype=np.uint8)
            absorbed = np.empty(2 * (trie.n_nodes + 1), dtype=np.int32)
        rc = lib.llama_cffi_trie_run_scan_skip(
            trie._struct,
            self._g,
            ffi.from_buffer("uint64_t[]", runs),
            len(runs),
            k,
            *out.args(),
            ffi.NULL if on is None else ffi.from_buffer("uint8_t[]", on),
            ffi.NULL if absorbed is None else ffi.from_buffer("int32_t[]", absorbed),
            0 if absorbed is None else trie.n_nodes + 1,
            n_abs,
        )
        got = out.result(rc, on)
        if absorbed is not None:
            got.absorbed = absorbed[: 2 * n_abs[0]].copy()
        return got

    def shared(self, scan: RunScan) -> SharedScan:
        """``scan`` (made for this grammar) as a :class:`SharedScan`: its frontier with
        each node's parent depth instead of this grammar's groups."""
        nc = self.n_classes
        if len(scan.group_start) != (scan.k + 1) * nc + 1:
            raise ValueError("the scan was made for another grammar")
        bounds = scan.group_start[np.arange(scan.k + 2, dtype=np.int64) * nc].astype(np.int64)
        depths = np.repeat(np.arange(scan.k + 1, dtype=np.int32), np.diff(bounds))
        if len(depths) != len(scan.frontier):
            raise ValueError("the scan's groups do not cover its frontier")
        return SharedScan(
            scan.k, scan.mask, scan.frontier, depths, scan.pt_tokens, scan.pt_depth, scan.on, scan.absorbed
        )

    def unshare(self, sh: SharedScan, run: U64) -> RunScan:
        """The :class:`RunScan` of ``run`` (``W`` words; its code points must be those
        ``sh`` was made for) from ``sh``: the frontier grouped by parent depth and this
        grammar's class of each node (``llama_cffi_trie_group``). Shares ``sh``'s
        read-only arrays."""
        trie = self.trie
        run = np.array(run, dtype=np.uint64)  # a copy: the scan keeps it
        if run.shape != (self.W,):
            raise ValueError(f"run must be {self.W} uint64 words")
        if not 0 <= sh.k <= trie.max_depth + 1:
            raise ValueError(f"k must lie in [0, {trie.max_depth + 1}], not {sh.k}")
        if sh.mask.shape != (trie.n_words,) or sh.mask.dtype != np.uint32:
            raise ValueError(f"the shared mask must be {trie.n_words} uint32 words")
        nodes = _i32("nodes", sh.nodes)
        depths = _i32("depths", sh.depths, len(nodes))
        frontier = np.empty(len(nodes), dtype=np.int32)
        group_start = np.empty((sh.k + 1) * self.n_classes + 1, dtype=np.int32)
        rc = lib.llama_cffi_trie_group(
            trie._struct,
            self._g,
            ffi.from_buffer("int32_t[]", nodes),
            ffi.from_buffer("int32_t[]", depths),
            len(nodes),
            sh.k,
            ffi.from_buffer("int32_t[]", frontier),
            ffi.from_buffer("int32_t[]", group_start),
        )
        _check_rc(rc, "trie group")
        got = RunScan(sh.k, sh.mask, frontier, group_start, sh.pt_tokens, sh.pt_depth, run, sh.on)
        got.absorbed = sh.absorbed
        return got

    def premask_scan(self, mask: U32, premask: U64) -> RunScan:
        """The scan of a premask plan (see :meth:`plan`): a run of length 0 whose run is
        ``premask`` (``W`` words), its mask ``mask`` (the full-length scan's of those
        classes' code points), its frontier the root's children of those classes whose
        subtrees hold another class's character or a token ending inside a character
        (``llama_cffi_trie_premask_roots``), grouped by class."""
        trie = self.trie
        pw = np.array(premask, dtype=np.uint64)
        if pw.shape != (self.W,):
            raise ValueError(f"premask must be {self.W} uint64 words")
        m = np.ascontiguousarray(mask, dtype=np.uint32)
        if m.shape != (trie.n_words,):
            raise ValueError(f"mask must be {trie.n_words} uint32 words")
        cap = trie._n_root_children + 1
        nodes = np.empty(cap, dtype=np.int32)
        gs = np.empty(self.n_classes + 1, dtype=np.int32)
        n = lib.llama_cffi_trie_premask_roots(
            trie._struct,
            self._g,
            ffi.from_buffer("uint64_t[]", pw),
            ffi.from_buffer("int32_t[]", nodes),
            cap,
            ffi.from_buffer("int32_t[]", gs),
        )
        if n < 0:
            raise ValueError("llama_cffi_trie_premask_roots refused its arguments")
        empty = np.zeros(0, dtype=np.int32)
        return RunScan(0, m, nodes[:n].copy(), gs, empty, empty, pw)

    def run_scan_extend(self, base: SharedScan, base_key: bytes, run: U64) -> SharedScan:
        """The full-length scan of ``run`` (``W`` words) as a :class:`SharedScan` without
        paths, from ``base``: the full-length shared scan of a subset of its code points
        (``base_key``: which, as ``samplers.grammar``'s ``CompiledGrammar._cp_key`` writes
        it). Only below the nodes where the base's paths stop and the run's go on is the
        trie read (``llama_cffi_trie_run_scan_extend``): ``[a-z0-9./-]`` from ``[0-9a-z.-]``
        reads the paths through ``/``, not every lowercase one again."""
        trie = self.trie
        k = trie.max_depth + 1
        run = np.ascontiguousarray(run, dtype=np.uint64)
        if run.shape != (self.W,):
            raise ValueError(f"run must be {self.W} uint64 words")
        if base.k != k or base.mask.shape != (trie.n_words,) or base.mask.dtype != np.uint32:
            raise ValueError("the base must be a full-length shared scan of this trie")
        key = np.frombuffer(base_key, dtype=np.uint8)
        nodes_in, depths_in = _i32("nodes", base.nodes), _i32("depths", base.depths, len(base.nodes))
        pt_in, ptd_in = _i32("pt_tokens", base.pt_tokens), _i32("pt_depth", base.pt_depth, len(base.pt_tokens))
        n_nodes, n_pt = ffi.new("int32_t *"), ffi.new("int32_t *")
        # outputs sized for the base's frontier and partial-character tokens plus room (the
        # extension adds the frontier below the run's new paths, most often a few hundred
        # nodes), the whole trie and vocabulary only when that is too little: 1.8 + 1 MB
        # arrays at Gemma 3's sizes cost 50 µs of allocation and first writes in a call of
        # 75 µs
        n_all = (trie.n_nodes + 1, trie.n_vocab + 1)
        first = (_EXTEND_FACTOR * len(nodes_in) + _EXTEND_ROOM, _EXTEND_FACTOR * len(pt_in) + _EXTEND_ROOM)
        caps = (min(n_all[0], max(1, first[0])), min(n_all[1], max(1, first[1])))
        while True:
            mask = base.mask.copy()
            nodes, depths = np.empty(caps[0], dtype=np.int32), np.empty(caps[0], dtype=np.int32)
            pt, ptd = np.empty(caps[1], dtype=np.int32), np.empty(caps[1], dtype=np.int32)
            rc = lib.llama_cffi_trie_run_scan_extend(
                trie._struct,
                self._g,
                ffi.from_buffer("uint64_t[]", run),
                ffi.from_buffer("uint8_t[]", key),
                len(key),
                ffi.from_buffer("int32_t[]", nodes_in),
                ffi.from_buffer("int32_t[]", depths_in),
                len(nodes_in),
                ffi.from_buffer("int32_t[]", pt_in),
                ffi.from_buffer("int32_t[]", ptd_in),
                len(pt_in),
                ffi.from_buffer("uint32_t[]", mask),
                ffi.from_buffer("int32_t[]", nodes),
                ffi.from_buffer("int32_t[]", depths),
                len(nodes),
                n_nodes,
                ffi.from_buffer("int32_t[]", pt),
                ffi.from_buffer("int32_t[]", ptd),
                len(pt),
                n_pt,
            )
            if rc == -3 and caps != n_all:  # out of room: again, with all of it
                caps = n_all
                continue
            break
        _check_rc(rc, "trie run scan extend")
        nf, np_ = n_nodes[0], n_pt[0]
        return SharedScan(k, mask, nodes[:nf].copy(), depths[:nf].copy(), pt[:np_].copy(), ptd[:np_].copy())

    def densified(self, scan: RunScan) -> RunScan:
        """``scan`` (made with ``keep``) with its paths made whole: ``on`` marks every node
        of the subtrees it took whole (``llama_cffi_trie_densify_on``; a copy), and no
        ``absorbed`` pair is left, so that each :meth:`run_derive` from it reads one level
        of ``on`` (a bounded string derives a scan at each of its positions)."""
        if scan.on is None or scan.absorbed is None:
            raise ValueError("densified needs a scan made with keep=True")
        if not len(scan.absorbed):
            return scan
        trie = self.trie
        on = np.array(scan.on, dtype=np.uint8)  # a copy: the scan's may be read-only (a cache file's)
        if on.shape != (trie.n_nodes + 1,):
            raise ValueError(f"on must have {trie.n_nodes + 1} values")
        absorbed = _i32("absorbed", scan.absorbed)
        rc = lib.llama_cffi_trie_densify_on(
            trie._struct, ffi.from_buffer("uint8_t[]", on), ffi.from_buffer("int32_t[]", absorbed), len(absorbed) // 2
        )
        _check_rc(rc, "trie densify")
        got = RunScan(scan.k, scan.mask, scan.frontier, scan.group_start, scan.pt_tokens, scan.pt_depth, scan.run, on)
        got.absorbed = np.zeros(0, dtype=np.int32)
        return got

    def run_derive(self, base: RunScan, k: int) -> RunScan:
        """:meth:`Trie.run_derive` from a base made by :meth:`run_scan` with ``keep``: the
        same mask, partial tokens and groups, reading only the nodes ``k`` deep."""
        trie = self.trie
        if base.on is None or base.absorbed is None or not 0 <= k < base.k:
            raise ValueError("run_derive needs a scan made with keep=True, of a greater length")
        if len(base.group_start) != (base.k + 1) * self.n_classes + 1 or base.run.shape != (self.W,):
            raise ValueError("the base was made for another grammar")
        cap = len(base.frontier) + trie.n_nodes + 1
        frontier = np.empty(cap, dtype=np.int32)
        group_start = np.empty((k + 1) * self.n_classes + 1, dtype=np.int32)
        n_front = ffi.new("int32_t *")
        rc = lib.llama_cffi_trie_run_derive_skip(
            trie._struct,
            self._g,
            ffi.from_buffer("uint64_t[]", base.run),
            k,
            ffi.from_buffer("uint8_t[]", base.on),
            ffi.from_buffer("int32_t[]", base.absorbed) if len(base.absorbed) else ffi.NULL,
            len(base.absorbed) // 2,
            ffi.from_buffer("int32_t[]", base.frontier),
            len(base.frontier),
            ffi.from_buffer("int32_t[]", base.group_start),
            base.k,
            ffi.from_buffer("int32_t[]", frontier),
            cap,
            n_front,
            ffi.from_buffer("int32_t[]", group_start),
        )
        _check_rc(rc, "trie run derive")
        return _derived(trie, base, k, frontier[: n_front[0]].copy(), group_start)

    def set_tables(
        self,
        trans: npt.NDArray[np.int32],
        run_known: npt.NDArray[np.bool_],
        run_words: U64,
        run_len: I32,
        pchar_known: npt.NDArray[np.bool_],
        pchar_ok: npt.NDArray[np.bool_],
        run_closed: U64 | None = None,
    ) -> None:
        """The grammar's growing tables, read in place: ``trans`` ``(n_states,
        n_classes)`` int32; per state ``run_known``, ``run_words`` ``(n, W)`` and
        ``run_len`` (see ``llama_cffi.h``); ``pchar_known`` per state and ``pchar_ok``
        ``(n, max(n_pchars, 1))``; ``run_closed`` (None, or as ``run_words``): per state
        its closed run. A no-op when the same arrays are given again."""
        old = self._tables
        if (
            old
            and trans is old[0]
            and run_known is old[1]
            and run_words is old[2]
            and run_len is old[3]
            and pchar_known is old[4]
            and pchar_ok is old[5]
            and run_closed is old[6]
        ):
            return
        tables = (trans, run_known, run_words, run_len, pchar_known, pchar_ok, run_closed)
        nc, w, npc = self.n_classes, self.W, max(self.trie.n_pchars, 1)
        for name, a, dt, cols in (
            ("trans", trans, np.int32, nc),
            ("run_words", run_words, np.uint64, w),
            ("pchar_ok", pchar_ok, np.bool_, npc),
            *((("run_closed", run_closed, np.uint64, w),) if run_closed is not None else ()),
        ):
            if not isinstance(a, np.ndarray) or a.dtype != dt or a.ndim != 2 or a.shape[1] != cols:
                raise ValueError(f"{name} must be a 2-D {np.dtype(dt).name} array of {cols} columns")
            if not a.flags.c_contiguous:
                raise ValueError(f"{name} must be C-contiguous")
        for name, a, dt in (
            ("run_known", run_known, np.bool_),
            ("run_len", run_len, np.int32),
            ("pchar_known", pchar_known, np.bool_),
        ):
            if not isinstance(a, np.ndarray) or a.dtype != dt or a.ndim != 1 or not a.flags.c_contiguous:
                raise ValueError(f"{name} must be a 1-D C-contiguous {np.dtype(dt).name} array")
        if len(run_known) > min(len(run_words), len(run_len)) or len(pchar_known) > len(pchar_ok):
            raise ValueError("a known-flags array is longer than its table")
        if run_closed is not None and len(run_closed) < len(run_known):
            raise ValueError("run_closed is shorter than run_known")
        g = self._g
        keep = [
            ffi.from_buffer("int32_t[]", trans),
            ffi.from_buffer("uint8_t[]", run_known),
            ffi.from_buffer("uint64_t[]", run_words),
            ffi.from_buffer("int32_t[]", run_len),
            ffi.from_buffer("uint8_t[]", pchar_known),
            ffi.from_buffer("uint8_t[]", pchar_ok),
        ]
        g.trans, g.run_known, g.run_words, g.run_len, g.pchar_known, g.pchar_ok = keep
        if run_closed is not None:
            keep.append(ffi.from_buffer("uint64_t[]", run_closed))
            g.run_closed = keep[-1]
        else:
            g.run_closed = ffi.NULL
        g.n_states, g.n_run_states, g.n_pchar_states = len(trans), len(run_known), len(pchar_known)
        self._g_plain = None  # (the copy without the engine is made again on its next use)
        self._tables = tables
        self._keep["tables"] = keep

    def walk(
        self,
        mask: U32,
        start: int,
        nodes: I32 | None = None,
        states: I32 | None = None,
        scan: RunScan | None = None,
        depth_states: I32 | None = None,
    ) -> tuple[I32, bool]:
        """OR into ``mask`` the tokens allowed below ``nodes``, each entered from
        ``states[i]`` (``start`` when None). Or, with ``scan`` (and no ``nodes``), below its
        frontier, the nodes of depth ``d`` entered from ``depth_states[d]`` (``k + 1``
        states).
        Returns the pending entries ``(p, 4)``: node, state before it, reason (``PEND_*``),
        detail; and whether the walk stopped early because too many were pending (the
        mask is then incomplete: compute what the entries miss, then walk the whole
        input again into a fresh mask)."""
        if not self._tables:
            raise RuntimeError("set_tables() first")
        trie = self.trie
        _words("mask", mask, trie.n_words)
        if scan is not None and nodes is None:
            nodes = scan.frontier
        elif scan is not None or nodes is None:
            raise ValueError("give nodes or a scan")
        nodes = _i32("nodes", nodes)
        n = len(nodes)
        st = gs = ds = rw = ffi.NULL
        k = 0
        if states is not None:
            states = _i32("states", states, n)
            st = ffi.from_buffer("int32_t[]", states)
        if scan is not None:
            k = scan.k
            if depth_states is None or states is not None:
                raise ValueError("a scan's walk takes depth_states, not states")
            if len(scan.group_start) != (k + 1) * self.n_classes + 1:
                raise ValueError("the scan was made for another number of classes")
            depth_states = _i32("depth_states", depth_states, k + 1)
            gs = ffi.from_buffer("int32_t[]", scan.group_start)
            ds = ffi.from_buffer("int32_t[]", depth_states)
            rw = ffi.from_buffer("uint64_t[]", np.ascontiguousarray(scan.run, dtype=np.uint64))
        rc = lib.llama_cffi_trie_walk(
            trie._struct,
            self._g,
            ffi.from_buffer("int32_t[]", nodes),
            st,
            n,
            gs,
            ds,
            rw,
            k,
            int(start),
            ffi.from_buffer("uint32_t[]", mask),
            *self._walk_buffers(),
        )
        return self._pending_after(rc, "trie walk")

    def derive_split(self, start: int, gs: int, nodes: I32, budget: int, cap: int) -> tuple[I32, I32, I32] | None:
        """Where the mask of ``start`` differs from the mask of ``gs`` below the root's
        children ``nodes`` (``llama_cffi_trie_derive_split``; the engine attached, the
        caller holding it): the nodes whose subtrees' tokens to clear, and the (node,
        state before it) pairs to walk from ``start``'s side (:meth:`walk`). A subtree
        where both states reach the same state keeps ``gs``'s bits. None when more than
        ``budget`` nodes or ``cap`` entries would be needed (walk ``nodes`` whole)."""
        if not self._tables:
            raise RuntimeError("set_tables() first")
        nodes = _i32("nodes", nodes)
        cap = max(int(cap), 0)
        clear = np.empty(max(cap, 1), dtype=np.int32)
        wn = np.empty(max(cap, 1), dtype=np.int32)
        ws = np.empty(max(cap, 1), dtype=np.int32)
        n_clear = ffi.new("int32_t *")
        rc = lib.llama_cffi_trie_derive_split(
            self.trie._struct,
            self._g,
            int(start),
            int(gs),
            ffi.from_buffer("int32_t[]", nodes),
            len(nodes),
            int(budget),
            ffi.from_buffer("int32_t[]", clear),
            n_clear,
            ffi.from_buffer("int32_t[]", wn),
            ffi.from_buffer("int32_t[]", ws),
            cap,
        )
        if rc <= _ENGINE_ERR and self._on_engine_error is not None:
            self._on_engine_error(rc - _ENGINE_ERR)  # raises
        if rc == -2:
            return None
        if rc < 0:
            _check_rc(rc, "derive split")
        return clear[: n_clear[0]].copy(), wn[:rc].copy(), ws[:rc].copy()

    def plan(self, start: int, scan: RunScan, depth_states: I32, extra: I32, premask: U64 | None = None) -> Any:
        """What :meth:`mask` needs to compute the mask from ``start`` in one call: the run
        scan of its run, the states down its chain (``depth_states``, ``k + 1``) and the
        tokens to set besides the walk's (``extra``). An opaque object; keeps its arrays
        alive. What depends on the scan alone (its buffers, the groups that hold nodes) is
        made once per scan and shared by the plans of every state with that run (the
        positions of a bounded string). With ``premask`` (``W`` words: classes whose every
        string leaves ``start`` alive), ``scan`` is a walk from the root (``k = 0``, no
        frontier) whose mask holds every token of those classes' code points (their
        full-length scan's): the walk skips the subtrees reached and made of those classes
        only (``premask`` in ``llama_cffi.h``)."""
        parts = self._plan_parts.get(scan)
        if parts is None:
            parts = self._plan_parts[scan] = self._scan_parts(scan)
        ds = _i32("depth_states", depth_states, scan.k + 1)
        ex = _i32("extra", extra)
        p = ffi.new("llama_cffi_trie_plan *")
        keep = [ffi.from_buffer("int32_t[]", ds), ffi.from_buffer("int32_t[]", ex), parts]
        p.depth_states, p.extra = keep[0], keep[1]
        p.frontier, p.group_start, p.base, p.run, p.live_groups = parts[:5]
        p.start, p.k, p.n_frontier, p.n_extra = int(start), scan.k, len(scan.frontier), len(ex)
        p.n_live_groups = parts[5]
        if premask is not None:
            if scan.k != 0 or not np.array_equal(scan.run, premask):
                raise ValueError("a premask plan's scan is premask_scan's (k = 0, its run the premask)")
            pw = np.array(premask, dtype=np.uint64)  # (a copy: the caller's row may change)
            if pw.shape != (self.W,):
                raise ValueError(f"premask must be {self.W} uint64 words")
            keep.append(pw)
            p.premask = ffi.from_buffer("uint64_t[]", pw)
            keep.append(p.premask)
        return (p, keep, ds, ex, scan, self)

    def _scan_parts(self, scan: RunScan) -> tuple[Any, ...]:
        """:meth:`plan`'s part of ``scan`` (checked): buffers over its frontier, groups,
        tokens and run, and the groups that hold nodes (``llama_cffi_trie_plan_groups``:
        a walk then skips the empty ones at once) with their count."""
        if (
            len(scan.group_start) != (scan.k + 1) * self.n_classes + 1
            or scan.mask.shape != (self.trie.n_words,)
            or scan.run.shape != (self.W,)
        ):
            raise ValueError("the scan was made for another grammar or vocabulary")
        p = ffi.new("llama_cffi_trie_plan *")
        frontier = ffi.from_buffer("int32_t[]", _i32("frontier", scan.frontier))
        group_start = ffi.from_buffer("int32_t[]", _i32("group_start", scan.group_start))
        base = ffi.from_buffer("uint32_t[]", np.ascontiguousarray(scan.mask, dtype=np.uint32))
        run = ffi.from_buffer("uint64_t[]", np.ascontiguousarray(scan.run, dtype=np.uint64))
        p.frontier, p.group_start, p.base, p.run = frontier, group_start, base, run
        p.k, p.n_frontier = scan.k, len(scan.frontier)
        live = np.empty(len(scan.group_start) - 1, dtype=np.int32)
        live_c = ffi.from_buffer("int32_t[]", live)
        _check_rc(lib.llama_cffi_trie_plan_groups(self.trie._struct, self._g, p, live_c, len(live)), "plan groups")
        pt, ptd = _i32("pt_tokens", scan.pt_tokens), _i32("pt_depth", scan.pt_depth, len(scan.pt_tokens))
        pt_c, ptd_c = ffi.from_buffer("int32_t[]", pt), ffi.from_buffer("int32_t[]", ptd)
        return (frontier, group_start, base, run, live_c, int(p.n_live_groups), live, scan, pt_c, ptd_c, len(pt))

    def position_mask(self, tmpl: Any, start: int, chain_max: int, out_c: Any) -> tuple[int, Any]:
        """The plan of ``start`` made from ``tmpl`` (a :meth:`plan` of another state of the
        same run: a bounded string's earlier position) and its mask into ``out_c`` (a cffi
        buffer of at least ``ceil(n_vocab / 32)`` words), in one C call
        (``llama_cffi_trie_position_mask``; the engine attached, :meth:`set_first_args`
        given, the tables set with room for ``start``): ``start``'s run is computed into the
        run tables; when it is not ``tmpl``'s, returns ``(1, chain)``, its chain, and
        nothing else is done. Else ``(rc, plan)``: the plan as :meth:`plan` makes it (the
        extra tokens: end-of-generation when ``start`` is complete, the scan's
        partial-character tokens whose state can complete them), and the C result of its
        mask (0, or -3: pending full; :attr:`n_pending` entries pending). An engine error
        raises as in :meth:`first_mask`."""
        fixed = self._first_args
        if fixed is None or self._engine is None:
            raise RuntimeError("first_mask() with an engine first")
        parts = tmpl[1][2]
        k = tmpl[4].k
        buf = np.empty(k + 1 + parts[10] + fixed[5], dtype=np.int32)  # the chain, then the extra tokens
        chain, extra = buf[: k + 1], buf[k + 1 :]
        buf_c = ffi.from_buffer("int32_t[]", buf)
        chain_c, extra_c = buf_c, buf_c + (k + 1)
        p = ffi.new("llama_cffi_trie_plan *")
        pbuf = self._pchar_scratch
        if pbuf is None:
            pbuf = self._pchar_scratch = ffi.new("uint8_t[]", max(self.trie.n_pchars, 1))
        rc: int = lib.llama_cffi_trie_position_mask(
            self.trie._struct,
            self._g,
            tmpl[0],
            start,
            chain_max,
            parts[8],
            parts[9],
            parts[10],
            fixed[4],
            fixed[5],
            fixed[6],
            pbuf,
            chain_c,
            extra_c,
            len(extra),
            p,
            out_c,
            *self._walk_args,
        )
        if rc == 1:
            return 1, chain
        if rc <= _ENGINE_ERR and self._on_engine_error is not None:
            self._on_engine_error(rc - _ENGINE_ERR)  # raises
        if rc not in (0, -3):
            _check_rc(rc, "position mask")
        return rc, (p, [buf_c, extra_c, parts], chain, extra[: p.n_extra], tmpl[4], self)

    def mask(self, plan: Any, out: U32) -> tuple[I32, bool]:
        """The mask of :meth:`plan` into ``out`` (overwritten). Returns what :meth:`walk`
        returns: pending entries (walk them with :meth:`walk` once computed) and whether
        the walk stopped early (then call again once they are computed)."""
        if not self._tables:
            raise RuntimeError("set_tables() first")
        _words("out", out, self.trie.n_words)
        rc = lib.llama_cffi_trie_mask(
            self.trie._struct,
            self._g,
            plan[0],
            ffi.from_buffer("uint32_t[]", out),
            *self._walk_buffers(),
        )
        return self._pending_after(rc, "trie mask")

    def detach_engine(self) -> None:
        """Undo :meth:`attach_engine`: walks leave transitions and runs pending again."""
        g = self._g
        self._g_plain = None
        g.engine = g.class_weight = g.run_chain = ffi.NULL
        self._engine = self._on_engine_error = None

    @property
    def has_engine(self) -> bool:
        """Whether :meth:`attach_engine` was called (and not undone)."""
        return self._engine is not None

    def set_first_args(self, eog: I32, pchars: npt.NDArray[np.int64]) -> None:
        """The ``eog`` and ``pchars`` of :meth:`first_mask` (see there), converted for the C
        call once per pair of arrays (a grammar passes the same two every time; a grammar
        gives them when it is bound, so that its first mask finds them)."""
        fixed = self._first_args
        if fixed is None or eog is not fixed[0] or pchars is not fixed[1]:
            e32 = _i32("eog", eog)
            pc = np.ascontiguousarray(pchars, dtype=np.int64)
            if len(pc) != self.trie.n_pchars:
                raise ValueError(f"pchars must have {self.trie.n_pchars} values")
            self._first_args = (
                eog,
                pchars,
                e32,
                pc,
                ffi.from_buffer("int32_t[]", e32),
                len(e32),
                ffi.from_buffer("int64_t[]", pc) if len(pc) else ffi.NULL,
            )

    def first_mask(
        self,
        start: int,
        out: U32,
        root_plan_max: int,
        eog: I32,
        pchars: npt.NDArray[np.int64],
        heavy_min: int = -1,
        root_plan_tokens: int = -1,
        derive_share: int = 0,
    ) -> tuple[str, I32, bool]:
        """The first mask from ``start`` without a plan (``llama_cffi_trie_first_mask``;
        needs :meth:`attach_engine` with the runs' arguments): returns ``"made"``, or
        ``"plan"`` (``start``'s run starts more than ``root_plan_max`` of the root's
        children, or ``root_plan_tokens >= 0``, the run holds for 4 characters or more and
        more than that many tokens start with two of its characters: a plan pays) or
        ``"heavy"`` (``heavy_min >= 0``, the classes ``start`` takes hold at least that
        many of the root's children and the heaviest class leads elsewhere than ``start``;
        unless ``derive_share > 0``, that class holds over ``1/derive_share`` of them and
        its successor moves on again on it: no derivation could serve ``start``) with
        ``out`` untouched; then what :meth:`walk` returns. ``eog``: the end-of-generation tokens;
        ``pchars``: the trie's partial characters (``value << 2 | bytes still needed``)."""
        if not self._tables:
            raise RuntimeError("set_tables() first")
        if self._engine is None or self._g.class_weight == ffi.NULL:
            raise RuntimeError("attach_engine() with class_weight first")
        _words("out", out, self.trie.n_words)
        self.set_first_args(eog, pchars)
        rc = self.first_mask_rc(
            int(start),
            ffi.from_buffer("uint32_t[]", out),
            int(root_plan_max),
            int(heavy_min),
            int(root_plan_tokens),
            int(derive_share),
        )
        if rc in (1, 2):
            return ("plan" if rc == 1 else "heavy"), _NO_PENDING, False
        pend, full = self._pending_after(rc, "first mask")
        return "made", pend, full

    def mask_plain(self, plan: Any, out: U32) -> tuple[I32, bool]:
        """:meth:`mask` reading only the tables given to :meth:`set_tables`, never the
        engine (which it neither needs nor holds): for a start state whose walks have
        nothing left to compute; a transition or run missing from the tables is pending as
        without an engine."""
        if not self._tables:
            raise RuntimeError("set_tables() first")
        _words("out", out, self.trie.n_words)
        if self._g_plain is None:
            gp = self._g_plain = ffi.new("llama_cffi_trie_grammar *", self._g[0])
            gp.engine = gp.class_weight = gp.run_chain = ffi.NULL
        rc = self.mask_plain_rc(plan, ffi.from_buffer("uint32_t[]", out))
        return self._pending_after(rc, "trie mask")

    # ------------------------------------------------------------------ the hot path
    # (for samplers.grammar.compiled's uncached masks: one C call, the caller's checks
    # trusted: ``out_c`` a cdata over at least n_words uint32 words it keeps alive; what C
    # reads of the tables and plan is bounds-checked there as always)
    def first_mask_rc(
        self, start: int, out_c: Any, root_plan_max: int, heavy_min: int, root_plan_tokens: int, derive_share: int
    ) -> int:
        """:meth:`first_mask`'s C call alone, with the ``eog`` and ``pchars`` last given
        to :meth:`first_mask` (call that once first): the C result (0 done, 1 plan,
        2 heavy, <0 as :meth:`first_mask` raises for); :attr:`n_pending` entries pending.
        An engine error raises as in :meth:`first_mask`."""
        fixed = self._first_args
        if fixed is None or self._engine is None:
            raise RuntimeError("first_mask() with an engine first")
        rc: int = lib.llama_cffi_trie_first_mask(
            self.trie._struct,
            self._g,
            start,
            root_plan_max,
            root_plan_tokens,
            heavy_min,
            derive_share,
            fixed[4],
            fixed[5],
            fixed[6],
            out_c,
            *self._walk_args,
        )
        if rc <= _ENGINE_ERR and self._on_engine_error is not None:
            self._on_engine_error(rc - _ENGINE_ERR)  # raises
        return rc

    def tokens_allowed(self, states: I32, tokens: I32) -> npt.NDArray[np.int8]:
        """Per pair, whether ``tokens[i]`` is allowed from ``states[i]`` by the transition
        table last given (:meth:`set_tables`): 1, 0, or -1 when the table cannot tell alone
        (a transition not computed yet, a token that is not whole characters: see
        ``llama_cffi_trie_tokens_allowed``). No engine is run."""
        states, tokens = _i32("states", states), _i32("tokens", tokens)
        if len(states) != len(tokens):
            raise ValueError("one state per token")
        if not self._tables:
            raise RuntimeError("set_tables() first")
        out = np.empty(len(tokens), dtype=np.int8)
        _check_rc(
            lib.llama_cffi_trie_tokens_allowed(
                self.trie._struct,
                self._g,
                ffi.from_buffer("int32_t[]", self.trie.token_node()),
                len(tokens),
                ffi.from_buffer("int32_t[]", states),
                ffi.from_buffer("int32_t[]", tokens),
                ffi.from_buffer("int8_t[]", out),
            ),
            "trie tokens allowed",
        )
        return out

    def batch_job(self, plan: Any) -> Any:
        """A job of :meth:`Trie._masks`: this grammar's walk of ``plan`` (one of its
        :meth:`plan` s). It points into both: they must outlive it."""
        return ffi.new("llama_cffi_trie_job *", (self._g, plan[0]))

    def mask_plain_rc(self, plan: Any, out_c: Any) -> int:
        """:meth:`mask_plain`'s C call alone (after :meth:`mask_plain` made the engine-free
        view of the grammar; -9 before): the C result; :attr:`n_pending` entries pending."""
        gp = self._g_plain
        if gp is None or not self._tables:
            return -9
        rc: int = lib.llama_cffi_trie_mask(self.trie._struct, gp, plan[0], out_c, *self._walk_args)
        return rc

    @property
    def n_pending(self) -> int:
        """How many subtrees the last walk left pending."""
        n: int = self._n_pending[0]
        return n

    def _walk_buffers(self) -> tuple[Any, ...]:
        """The pending list and the walk's frames: the C walks' last arguments."""
        return self._walk_args

    def _pending_after(self, rc: int, what: str) -> tuple[I32, bool]:
        """A walk's pending entries (a copy) and whether it stopped early (``rc`` -3)."""
        if rc == 0 and self._n_pending[0] == 0:  # done, nothing pending: most walks
            return _NO_PENDING, False
        if rc <= _ENGINE_ERR and self._on_engine_error is not None:
            self._on_engine_error(rc - _ENGINE_ERR)  # raises
        full = rc == -3
        if not full:
            _check_rc(rc, what)
        p = self._n_pending[0]
        if p == 0:
            return _NO_PENDING, full
        return self._pending[: 4 * p].reshape(p, 4).copy(), full
