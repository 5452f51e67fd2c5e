"""A grammar compiled for one vocabulary: token masks by walks of the vocabulary's trie.

llama.cpp decides, for every candidate token, whether the grammar's stacks can consume
the token's code points (``llama_grammar_reject_candidates``): a per-token, per-code-point
walk in C++, ~25-300 ms per full 262,144-token mask. Here:

* the vocabulary's tokens, as code points, form a **trie** (:class:`VocabIndex`, built
  once per vocabulary and memory-mapped from a disk cache); compiling a grammar gives
  each node its character class (see :mod:`samplers.grammar.engine`) and the set of
  classes below it;
* a mask is a walk of that trie from the parser state: the state at a node is
  ``table[state at its parent, class of the node]`` (transitions missing from the table
  are computed once and kept), dead subtrees drop out;
* a state's **run** (the classes that lead it to one successor, and for how many
  characters that holds: a state with self-loops, forever; inside ``maxLength: 40``, the
  characters left) makes whole subtrees decidable at once: a node reached in a state
  whose run covers every class below it, no deeper than the run, accepts its subtree.
  The tokens made only of the start state's run, and the nodes where such paths leave
  it, are scanned once per run and shared by every state with that run;
* the walk runs in C (``llama_cffi._trie_walk``, ``kernel="c"``, the default): what it
  cannot decide yet (a transition, a run, partial characters) it returns as pending
  subtrees, computed here and walked again. The numpy walk it replaced stays as the
  reference (``kernel="numpy"`` or ``LLAMA_CFFI_GRAMMAR_KERNEL=numpy``), tested equal
  mask for mask;
* masks are cached by ``(state, partial UTF-8)``: in JSON and most structured output
  the same parser states recur, and a cached mask is a dictionary lookup.

The result is, token for token, llama.cpp's mask (tested against the native sampler),
quirks included: EOG tokens only when some stack is complete, empty / NUL-first /
invalid-UTF-8 pieces never, a token ending inside a UTF-8 character only when a
character class could still accept its completion, and a token element on top of a
stack matched by id even mid-token (as ``llama_grammar_reject_candidates_for_stack``).
Masks that start inside a character, and grammars with token elements, take the numpy
walk (both rare).
"""

from __future__ import annotations

import gc
import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import numpy.typing as npt

from llama_cffi._args import expect, expect_int, type_error
from llama_cffi._binding import ffi as _ffi
from llama_cffi._binding import lib as _lib
from llama_cffi._trie_walk import RunScan, TrieGrammar

from .engine import DEAD, NO_PARTIAL, Engine, Partial, _bad_partial, decode_utf8
from .vocab_index import VocabIndex

if TYPE_CHECKING:
    from .matcher import GrammarMatcher

_TOKEN_NOT = 9
_ABSORB_MIN_ROWS = 64  # subtrees smaller than this are walked rather than absorbed
_SPINE_MAX = 32768  # at most this many undecided tokens are walked one by one
_SCAN_SHORT = 4  # a run this short is scanned on its own, not derived from its full-length scan
#: a run's full-length scan with its paths is made dense (every node of the subtrees it
#: took whole marked: each derivation then reads one level) at its this-many-th derivation
#: only: densifying costs 0.2-0.5 ms at 262,144 tokens, a derivation without it at most
#: that more, and most runs (a pattern's class, a short bounded key) derive a few lengths
_DENSIFY_AT = 3
_ROOT_PLAN_MAX = 64  # a first mask skips the plan when its run starts at most this many root children
#: ... and, for a run of 4 characters or more, when at most this many tokens start with two
#: of its characters (a letters loop starts few root children, but a walk from the root
#: would descend the tokens they start one by one: ~1.2-1.5 ms for [a-z]+ at 262,144
#: tokens, where the plan's scan takes whole subtrees at once)
_ROOT_PLAN_TOKENS = 16384
_RUN_STACKS_MAX = 256  # a run's chain stops at a state with more stacks than this
#: a plan whose state's run leaves at least this many of the trie's nodes to the walk
#: (nodes of a class the state takes off its run; a searched pattern's: ".*(top|bottom).*"
#: leaves each "t" and "b") has its state's closure searched, over at most
#: _CLOSED_STATES states (see _closed_for)
_CLOSED_FRONTIER = 4096
_CLOSED_STATES = 256
_CLOSED_CHAIN = 8  # ... nor for a state whose run's chain passes more states (a bounded string's)
_CHAIN_MAX = 4  # states before a wider chain's last run must repeat (_wider_chain)
#: a wider chain only for a short run that at least this many tokens start with (_wider_chain)
_CHAIN_MIN_TOKENS = 2048
#: a state whose transitions lead at least this many of the root's children on, all but at
#: most 1/_DERIVE_SHARE of them as another state's do, takes its mask from that state's
_DERIVE_MIN_ROOT = 2048
_DERIVE_SHARE = 8
#: a derivation walks only where the state's and the other state's transitions part below
#: the differing classes' root children (``TrieGrammar.derive_split``) when that takes at
#: most this many nodes, and entries (else it walks those root children whole)
_SPLIT_BUDGET = 4096
_SPLIT_CAP = 1024
#: the masks of derivation bases kept, whatever ``mask_cache_size`` says (see
#: CompiledGrammar._base_words): most grammars have one to three bases (an object's "any
#: other key" string, a free string's content), and 8 cost 8 masks' memory (256 KiB with
#: Gemma 3's vocabulary)
_BASES_KEPT = 8
#: a state whose first masks, walked from the root, leave nothing pending takes its plan
#: at this mask (a plan's scans cost 0.1-0.25 ms in a fresh process, and repay it only
#: over many masks of the state)
_PLAN_AT = 4
#: a vocabulary of at most this many tokens has every mask walked from the root, in C (no
#: plan, scan or derivation: on a small trie their Python costs more than the walk, and
#: more than llama.cpp's whole mask: 0.4 ms against 0.03 ms at 474 tokens)
_SMALL_VOCAB = 8192
_INT32_MAX = 2**31 - 1
_TABLE_ROWS = 256  # the run and partial-character tables' first size, in states

#: the mask walks: ``"c"`` (the trie walk in C, ``llama_cffi._trie_walk``) or ``"numpy"``
#: (the vectorised walk in this module, the reference the C walk is tested against)
KERNELS = ("c", "numpy")


def default_kernel() -> str:
    """``"numpy"`` when the environment variable ``LLAMA_CFFI_GRAMMAR_KERNEL`` says so,
    else ``"c"`` (on a big-endian machine always ``"numpy"``: the C walk writes
    little-endian bit masks)."""
    want = os.environ.get("LLAMA_CFFI_GRAMMAR_KERNEL", "c").strip().lower() or "c"
    if want not in KERNELS:
        raise ValueError(f"LLAMA_CFFI_GRAMMAR_KERNEL must be one of {KERNELS}, not {want!r}")
    return want if np.little_endian else "numpy"


def _unique_inverse(a: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``np.unique(a, return_inverse=True)`` for a 1-D integer array, by one sort (the
    first ``np.unique`` of a process imports ``numpy.ma``: ~13 ms inside a first mask)."""
    order = np.argsort(a, kind="stable")
    sa = a[order]
    first = np.empty(len(sa), dtype=bool)
    first[:1] = True
    np.not_equal(sa[1:], sa[:-1], out=first[1:])
    inv = np.empty(len(a), dtype=np.int64)
    inv[order] = np.cumsum(first) - 1
    return sa[first], inv


class _Spine(NamedTuple):
    """Per loop set: the undecided tokens; ``columns[j, i]`` the class of the ``j``-th
    code point of token ``i``'s remainder (0 past its end: never read), ``rem_len`` its
    length, ``stop`` one past the last remainder position whose class is off the loops
    (from there on, being back in the start state decides the token); ``partial`` marks
    tokens ending inside a character (``n_partial`` of them); the last ``n_empty`` tokens
    have an empty remainder (loop classes, then a partial character); ``walk``: the
    tokens with a non-empty remainder."""

    tokens: npt.NDArray[np.int64]
    columns: npt.NDArray[np.int32]
    rem_len: npt.NDArray[np.int64]
    stop: npt.NDArray[np.int64]
    partial: npt.NDArray[np.bool_]
    n_partial: int
    n_empty: int
    walk: npt.NDArray[np.int64]


class _Derived(NamedTuple):
    """A state's mask from another's (:meth:`CompiledGrammar._derivation`)."""

    of: int  #: the state whose mask it starts from
    nodes: npt.NDArray[np.int32]  #: the root's children walked again from the state (their tokens cleared first)
    states: npt.NDArray[np.int32]  #: the state, once per node (the walk's input)
    add: npt.NDArray[np.int32]  #: tokens set besides: the state's end-of-generation and partial-character ones
    clear: npt.NDArray[np.int32]  #: the nodes whose subtrees' tokens are cleared first


def _set_token_ids(words: npt.NDArray[np.uint32], tokens: npt.NDArray[np.int32]) -> None:
    """Set the bits of ``tokens`` (int32 ids, repeats allowed) in mask ``words`` in C
    (``np.bitwise_or.at`` costs 0.1 ms the first time a process calls it). Raises
    ValueError for a token past the mask."""
    t = np.ascontiguousarray(tokens, dtype=np.int32)
    if _lib.llama_cffi_mask_set(
        _ffi.from_buffer("uint32_t[]", words), len(words), _ffi.from_buffer("int32_t[]", t), len(t)
    ):
        raise ValueError("a token past the vocabulary")


def _set_tokens(words: npt.NDArray[np.uint32], tokens: npt.ArrayLike) -> None:
    """Set the bits of ``tokens`` (ids) in mask ``words``."""
    t = np.asarray(tokens, dtype=np.int64)
    if len(t):
        np.bitwise_or.at(words, t >> 5, np.left_shift(np.uint32(1), (t & 31).astype(np.uint32)))


class CompiledGrammar:
    """An :class:`~samplers.grammar.engine.Engine` plus a :class:`VocabIndex` (see the
    module docstring). Shared by all matchers of the grammar on this vocabulary, from
    any threads (a lock guards the walk buffer and the mask cache); make matchers with
    :meth:`matcher`. ``mask_cache_size`` bounds the cached masks (each
    ``n_vocab / 8`` bytes; besides them the C walk keeps up to 8 masks that derived masks
    start from: :meth:`_base_words`). ``kernel``: ``"c"`` or ``"numpy"`` (see :data:`KERNELS`;
    default :func:`default_kernel`)."""

    def __init__(
        self, engine: Engine, vocab: VocabIndex, mask_cache_size: int = 4096, kernel: str | None = None
    ) -> None:
        expect("engine", engine, Engine, "a samplers.grammar.engine.Engine")
        expect("vocab", vocab, VocabIndex, "a samplers.grammar.VocabIndex")
        mask_cache_size = expect_int("mask_cache_size", mask_cache_size)
        if kernel is not None and not isinstance(kernel, str):
            raise type_error("kernel", f"one of {KERNELS} or None", kernel)
        kernel = default_kernel() if kernel is None else kernel
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, not {kernel!r}")
        if not np.little_endian:  # pragma: no cover - the C walk's masks are little-endian words
            kernel = "numpy"
        self.kernel = kernel
        self.engine = engine
        self.vocab = vocab
        self.n_vocab = vocab.n_vocab
        self.n_words = (vocab.n_vocab + 31) // 32
        self._masks: OrderedDict[tuple[int, Partial], npt.NDArray[np.uint8]] = OrderedDict()
        self._mask_cache_size = mask_cache_size
        #: every mask computed by the C walk (no mask cache, no token elements): fill_words'
        #: short path (with a live state and no partial character: :meth:`_c_walks`)
        self._uncached_c = mask_cache_size == 0 and kernel == "c" and not engine.has_token_elements
        #: the C walk computes the masks of live states with no partial character pending
        #: (:meth:`_c_walks`), on this trie (None: the numpy kernel)
        self._walks_c = kernel == "c" and not engine.has_token_elements
        self._trie: Any = vocab.trie() if kernel == "c" else None
        self._last: tuple[tuple[int, Partial], npt.NDArray[np.bool_]] | None = None
        self._out_c: tuple[Any, Any] | None = None  # the last out buffer and its cdata (_out_cdata)
        self._partial_ok: dict[tuple[int, Partial], bool] = {}
        #: per partial character (_partial_kinds_into): the classes of its completions by
        #: continuation tokens, the longer partial characters of the tokens that end inside
        #: it, the C call's arguments (C core) and its flags for the tokens that go on
        self._pm_args: dict[Partial, tuple[Any, ...]] = {}
        self.stats = {"mask_hits": 0, "mask_misses": 0}
        self._lock = threading.RLock()  # the walk buffer, the cache and the engine are shared
        #: use the absorbing walk (False: the plain level-by-level walk, for comparison)
        self._absorb = True
        self._bind_trie()

    # ------------------------------------------------------------------ trie
    def _bind_trie(self) -> None:
        """The vocabulary's code-point trie (:class:`VocabIndex`) under this grammar: the
        class of each of the vocabulary's code points (a node's class is its code point's;
        the C walk writes no per-node array), the class weights and the root's children
        grouped by class."""
        v, eng = self.vocab, self.engine
        self._cls_arr: npt.NDArray[np.int32] | None = None
        self.n_nodes = n_nodes = v.n_nodes
        self._root = n_nodes
        self._level_base = v.level_base.tolist()
        self._parent, self._term, self._order = v.parent, v.term, v.order
        self._lcp, self._slen = v.lcp, v.slen
        self._usable = v.usable
        self._partial_tokens = v.partial_tokens
        self._states: npt.NDArray[np.int32] | None = None  # the plain walk's buffer, made on first use
        base, rs = self._level_base, v.row_start
        #: per level, the first sorted row of each node (views; for the token-element walk)
        self._level_rows = [rs[base[j] : base[j + 1]] for j in range(len(base) - 1)]
        self._partial_bit = pb = eng.n_classes
        self._W = w = pb // 64 + 1
        # partial tokens by their partial character: one check per (state, character)
        self._pchars, self._pchar_slot = v.pchars, v.pchar_slot
        self._pchar_ok: dict[int, npt.NDArray[np.bool_]] = {}  # per state
        self._pos_pchar: dict[int, npt.NDArray[np.bool_]] = {}  # per grammar position
        self._loops: dict[int, npt.NDArray[np.uint64]] = {}
        self._loop_known = np.zeros(64, dtype=bool)  # per state id (grown as states appear)
        self._loop_words = np.zeros((64, w), dtype=np.uint64)
        self._nonpartial = v.nonpartial
        self._eog_ids = v.eog_ids
        self._eog_i32 = self._eog_ids.astype(np.int32)
        self._absorb_ready = False
        if self.kernel == "c":
            trie = v.trie()
            # one C call (TrieGrammar(...) and Engine._classes_of_sorted are its reference):
            # each code point's class, the trie's nodes per class, the classes holding a code
            # point >= 128 and the ASCII ones (what a walk reads the trie's shared "below"
            # summaries with), the root groups
            self._tg, self._cls_of_cp, self._class_weight_f = TrieGrammar.bind(
                trie,
                v.uniq_cps_i32,
                v.n_ascii_cps,
                eng._edges.astype(np.int32),
                eng._interval_class,
                eng.n_classes,
                np.array(eng._ascii_class, dtype=np.int32),
                _ABSORB_MIN_ROWS,
            )
            self._class_weight = self._class_weight_f.astype(np.int64)
            self._run_cap = trie.max_depth + 1  # a run this long covers every token
            if eng.core == "c":  # one mask's walk computes the transitions and runs it needs (the engine's lock held)
                self._tg.attach_engine(
                    eng._c,
                    lambda rc: eng._c_call("a walk", rc),
                    self._class_weight_f[: eng.n_classes],
                    self._run_cap,
                    _RUN_STACKS_MAX,
                )
            # (rows for 256 states: a first walk, which wants room for 64 new states past those
            # that exist, then finds its tables the right size instead of growing them)
            self._run_known = np.zeros(_TABLE_ROWS, dtype=bool)
            self._run_words = np.zeros((_TABLE_ROWS, w), dtype=np.uint64)
            self._run_closed = np.zeros((_TABLE_ROWS, w), dtype=np.uint64)  # closed runs (zero: none known)
            self._closed_tried: set[int] = set()  # states whose closure was searched (_closed_for)
            self._premask_scans: dict[bytes, RunScan | None] = {}  # see _premask_scan
            self._class_first_tokens: npt.NDArray[np.float64] | None = None  # see _first_tokens
            self._run_len = np.zeros(_TABLE_ROWS, dtype=np.int32)
            self._run_chain: dict[int, npt.NDArray[np.int32]] = {}
            self._run_scans: dict[tuple[bytes, int], Any] = {}
            self._plans: dict[int, Any] = {}
            self._run_bases: dict[bytes, Any] = {}  # per run: its full-length scan with its paths
            self._run_derived: dict[bytes, int] = {}  # per run: derivations from its base so far
            self._pt_of: dict[RunScan, tuple[int, npt.NDArray[np.int32]]] = {}  # see _pt_split
            #: states whose first mask takes a plan at once (a bounded string's positions after
            #: the first, which the first mask's C call would only answer "plan" for), each with
            #: the plan of an earlier position that its own is made from (_position_mask)
            self._plan_next: dict[int, Any] = {}
            self._pchar_known = np.zeros(_TABLE_ROWS, dtype=bool)
            self._pchar_tab = np.zeros((_TABLE_ROWS, max(len(self._pchars), 1)), dtype=bool)
            #: the arrays last given to the C walk (see _set_tables)
            self._tables_given: tuple[Any, ...] | None = None
            #: start states whose walk has nothing left to wait for (a walk of theirs computed
            #: every transition, run and partial-character answer it reads: the tables only grow)
            self._settled: set[int] = set()
            #: per settled state with a plan: its C walk's job (TrieGrammar.batch_job), for
            #: fill_masks (filled by it; like _plans and _settled, it only grows)
            self._ready: dict[int, Any] = {}
            self._visited: set[int] = set()  # start states whose next mask makes a plan
            self._first_masks: dict[int, int] = {}  # start states: first masks taken whole, from the root
            #: per start state: the state its mask is derived from and how (None: not derived)
            self._derived: dict[int, _Derived | None] = {}
            #: the masks of the states derived masks start from (their ``of``), most recent last
            self._bases: OrderedDict[int, npt.NDArray[np.uint32]] = OrderedDict()
            self._root_pt_eog: npt.NDArray[np.int32] | None = None
            self._cls_of_cp_c: Any = None  # (_cp_key: a buffer over _cls_of_cp, made once)
            self._root_pt = trie._arrays["root_pt"]
            self._root_count = np.diff(self._tg._root_start)  # per class, the root's children of it
            self._root_scan = RunScan(  # a run of length 0: every first character from the root groups
                0,
                np.zeros(trie.n_words, dtype=np.uint32),
                np.zeros(0, dtype=np.int32),
                np.zeros(eng.n_classes + 1, dtype=np.int32),
                np.zeros(0, dtype=np.int32),
                np.zeros(0, dtype=np.int32),
                np.zeros(w, dtype=np.uint64),
            )
            if self._tg._engine is not None:  # what a first mask's C call takes, ready for it
                self._tg.set_first_args(self._eog_i32, self._pchars)
                self._walk_tables()
        else:
            self._cls_of_cp = eng._classes_of_sorted(v.uniq_cps)
            self._cls_arr = self._cls_of_cp[v.node_cpi]
            self._prepare_absorb()

    @property
    def _cls(self) -> npt.NDArray[np.int32]:
        """Each trie node's class (the numpy walks'; the C walk reads the class of a node's
        code point instead, so the ``"c"`` kernel makes this only when a numpy walk needs it)."""
        if self._cls_arr is None:
            self._cls_arr = self._cls_of_cp[self.vocab.node_cpi]
        return self._cls_arr

    # ------------------------------------------------------------------ absorbing walk
    def _prepare_absorb(self) -> None:
        """Per-node sets of character classes, for walks that skip whole subtrees (the
        numpy walk's; made at compile time for the ``"numpy"`` kernel, on first use for
        the ``"c"`` one, which reads the trie's shared summaries instead: see
        ``llama_cffi._trie_walk.below_summary``).

        Classes are bits of ``W`` uint64 words; bit ``n_classes`` (``PARTIAL``) stands for
        "a token ending inside a UTF-8 character", which no state's self-loops contain.
        ``_E[n]``: the classes of every character below node ``n``, plus ``PARTIAL`` when a
        token ending mid-character ends at or below ``n``. A node reached in a state whose
        self-loops include ``_E[n]`` accepts its whole subtree without walking it.
        ``_tokset[t]``: the classes of token ``t`` (plus ``PARTIAL``): with the self-loops
        ``L`` of the start state, the tokens with ``tokset <= L`` are accepted at once (one
        cached mask per ``L``). ``_root_by_cls``: the root's children grouped by class, so
        a walk starts only at the first classes its start state takes.
        """
        if self._absorb_ready:
            return
        v = self.vocab
        n_nodes, base, parent, cls = self.n_nodes, self._level_base, self._parent, self._cls
        n_levels = len(base) - 1
        pb, w = self._partial_bit, self._W
        one = np.uint64(1)
        # one-hot class bits per node (the root: none)
        bits = np.zeros((n_nodes + 1, w), dtype=np.uint64)
        bits[np.arange(n_nodes), cls // 64] = np.left_shift(one, (cls % 64).astype(np.uint64))
        # nodes where a token ending mid-character ends (its complete code points' node)
        pt_tokens = self._partial_tokens
        pt_nodes = self._term[pt_tokens]
        ptflag = np.zeros((n_nodes + 1, w), dtype=np.uint64)
        ptflag[pt_nodes, pb // 64] = one << np.uint64(pb % 64)
        below = np.zeros((n_nodes + 1, w), dtype=np.uint64)
        first_child, n_child = v.first_child, v.n_child
        for j in range(n_levels - 1, -1, -1):
            lo, hi = base[j], base[j + 1]
            if hi == lo:
                continue
            par = parent[lo:hi]
            contrib = bits[lo:hi] | below[lo:hi] | ptflag[lo:hi]
            starts = np.flatnonzero(np.r_[True, par[1:] != par[:-1]])
            below[par[starts]] = np.bitwise_or.reduceat(contrib, starts, axis=0)
        self._E_np = below | ptflag
        self._first_child, self._n_child = first_child, n_child
        self._tokset_cache: npt.NDArray[np.uint64] | None = None
        self._tokset  # noqa: B018 -- made now (~4 ms): inside a first mask it would be its tail
        self._row_start, self._row_end, self._n_term = v.row_start, v.row_end, v.n_term
        # the root's children by class
        lo0, hi0 = (base[0], base[1]) if n_levels else (0, 0)
        by = np.argsort(cls[lo0:hi0], kind="stable")
        self._root_nodes = (lo0 + by).astype(np.int64)
        counts = np.bincount(cls[lo0:hi0], minlength=pb)
        self._root_start = np.zeros(pb + 1, dtype=np.int64)
        np.cumsum(counts, out=self._root_start[1:])
        # partial tokens by node
        self._has_pt = np.zeros(n_nodes + 1, dtype=bool)
        self._has_pt[pt_nodes] = True
        by_node: dict[int, list[int]] = {}
        for t, node in zip(pt_tokens.tolist(), pt_nodes.tolist(), strict=True):
            by_node.setdefault(node, []).append(t)
        self._pt_at: dict[int, npt.NDArray[np.int64]] = {k: np.array(x, dtype=np.int64) for k, x in by_node.items()}
        self._spines: dict[bytes, _Spine | None] = {}
        self._lmasks: dict[bytes, npt.NDArray[np.bool_]] = {}
        self._absorb_ready = True

    @property
    def _tokset(self) -> npt.NDArray[np.uint64]:
        """Each token's classes (``W`` words; plus ``PARTIAL`` when it ends inside a
        character): the union of the classes on its trie path."""
        if self._tokset_cache is None:
            base, parent, cls, w, pb = self._level_base, self._parent, self._cls, self._W, self._partial_bit
            bit = np.left_shift(np.uint64(1), (cls % 64).astype(np.uint64))
            word = cls // 64
            prefix = np.zeros((self.n_nodes + 1, w), dtype=np.uint64)
            for k in range(w):  # one word at a time: 1-D gathers, no 2-D fancy indexing
                own = np.where(word == k, bit, np.uint64(0))
                col = np.zeros(self.n_nodes + 1, dtype=np.uint64)
                for j in range(len(base) - 1):
                    lo, hi = base[j], base[j + 1]
                    np.bitwise_or(col[parent[lo:hi]], own[lo:hi], out=col[lo:hi])
                prefix[:, k] = col
            tokset = prefix[self._term]
            tokset[self._partial_tokens, pb // 64] |= np.uint64(1) << np.uint64(pb % 64)
            self._tokset_cache = tokset
        return self._tokset_cache

    def _self_loops(self, state: int) -> npt.NDArray[np.uint64]:
        """The classes ``c`` with ``step(state, c) == state``, as ``W`` words (cached; also
        in the state-indexed arrays that :meth:`_loops_known` reads)."""
        got = self._loops.get(state)
        if got is None:
            eng = self.engine
            n = eng.n_classes
            eng.fill_row(state)
            same = np.zeros(self._W * 64, dtype=bool)
            same[:n] = eng.table()[state, :n] == state
            got = self._loops[state] = np.packbits(same, bitorder="little").view(np.uint64).copy()
            if state >= len(self._loop_known):
                cap = max(2 * len(self._loop_known), state + 1, 64)
                known = np.zeros(cap, dtype=bool)
                known[: len(self._loop_known)] = self._loop_known
                words = np.zeros((cap, self._W), dtype=np.uint64)
                words[: len(self._loop_words)] = self._loop_words
                self._loop_known, self._loop_words = known, words
            self._loop_words[state] = got
            self._loop_known[state] = True
        return got

    def _loops_known(self, states: npt.NDArray[np.int32]) -> npt.NDArray[np.bool_]:
        """Per state: are its self-loops computed (then in ``_loop_words[state]``)?"""
        known = self._loop_known
        inside = states < len(known)
        if inside.all():
            return known[states]
        return inside & known[np.where(inside, states, 0)]

    def _loop_classes(self, loops: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
        """The loop set as a boolean per class."""
        bits = np.unpackbits(loops.view(np.uint8), bitorder="little")
        return bits[: self.engine.n_classes].astype(bool)

    def _lmask(self, loops: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
        """Usable tokens whose every character is in ``loops`` (and that end on a whole
        character): from a state with those self-loops they are accepted (cached)."""
        key = loops.tobytes()
        got = self._lmasks.get(key)
        if got is None:
            ts = self._tokset
            if ts.shape[1] == 1:
                got = ((ts[:, 0] & ~loops[0]) == 0) & self._usable
            else:
                got = ~(ts & ~loops).any(axis=1) & self._usable
            got.flags.writeable = False
            self._lmasks[key] = got
        return got

    def _spine(self, loops: npt.NDArray[np.uint64]) -> _Spine | None:
        """The tokens outside :meth:`_lmask` for these self-loops, each cut to what follows
        its longest prefix of loop classes (from a state with these loops that prefix leads
        back to the state itself), longest remainder first; None when there are too many
        for a walk per token to beat the trie (cached per loop set)."""
        key = loops.tobytes()
        if key in self._spines:
            return self._spines[key]
        spine: _Spine | None = None
        toks = np.flatnonzero(self._usable & ~self._lmask(loops))
        if len(toks) <= _SPINE_MAX:
            # over the tokens' code points laid end to end (no padding to the longest)
            v = self.vocab
            in_loop = self._loop_classes(loops)
            lengths = v.lengths[toks]
            total = int(lengths.sum())
            seg = np.zeros(len(toks) + 1, dtype=np.int64)  # token i's code points: [seg[i], seg[i+1])
            np.cumsum(lengths, out=seg[1:])
            flat_tok = np.repeat(np.arange(len(toks)), lengths)
            local = np.arange(total, dtype=np.int64) - seg[flat_tok]
            cls = self._cls_of_cp[v.cp_idx[v.offsets[toks][flat_tok] + local]]
            off = ~in_loop[cls]
            # the first code point off the loops (the token's length when none is)
            first = lengths.copy()
            np.minimum.at(first, flat_tok[off], local[off])
            rem = lengths - first
            order = np.argsort(-rem, kind="stable")
            toks, first, rem = toks[order], first[order], rem[order]
            seg_o = seg[order]
            width = max(int(rem.max()) if len(rem) else 0, 1)
            rcls = np.zeros((width, len(toks)), dtype=np.int32)
            n_rem = int(rem.sum())
            r_tok = np.repeat(np.arange(len(toks)), rem)
            r_start = np.zeros(len(toks) + 1, dtype=np.int64)
            np.cumsum(rem, out=r_start[1:])
            r_k = np.arange(n_rem, dtype=np.int64) - r_start[r_tok]
            r_cls = cls[seg_o[r_tok] + first[r_tok] + r_k]
            rcls[r_k, r_tok] = r_cls
            # last remainder position off the loops: past it, a token back in the start
            # state is accepted (the rest loops)
            last_off = np.full(len(toks), -1, dtype=np.int64)
            r_off = ~in_loop[r_cls]
            np.maximum.at(last_off, r_tok[r_off], r_k[r_off])
            partial = self.vocab.has_partial[toks]
            n_empty = int(np.count_nonzero(rem == 0))  # last in the order: partial tokens
            spine = _Spine(
                tokens=toks,
                columns=rcls,
                rem_len=rem,
                stop=last_off + 1,
                partial=partial,
                n_partial=int(np.count_nonzero(partial)),
                n_empty=n_empty,
                walk=np.flatnonzero(rem > 0),
            )
        self._spines[key] = spine
        return spine

    def _compute_mask_spine(self, start: int, loops: npt.NDArray[np.uint64], spine: _Spine) -> npt.NDArray[np.bool_]:
        """The mask from ``start`` when its self-loops leave few tokens undecided: the
        loop-only tokens from the cached mask, the others walked one class column at a
        time from ``start`` (their loop prefix returns to it), vectorised over tokens."""
        eng = self.engine
        mask: npt.NDArray[np.bool_] = self._lmask(loops).copy()
        nc = eng.n_classes
        flat = eng.table().ravel()  # [state * nc + class]; replaced when the table grows
        toks, cols, stop, rem_len = spine.tokens, spine.columns, spine.stop, spine.rem_len
        idx = spine.walk  # tokens still being walked (all with a non-empty remainder at first)
        st = np.full(len(idx), start, dtype=np.int32)
        ends: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]] = []
        j = 0
        while len(idx):
            key = st * nc + cols[j, idx]
            nxt = flat[key]
            if nxt.min() < -1:  # transitions not computed yet
                eng.fill(st, cols[j, idx])
                flat = eng.table().ravel()
                nxt = flat[key]
            j += 1
            live = nxt >= 0
            # finished: the remainder is used up, or the walk is back in the start state
            # past the last class off its loops
            fin = live & (stop[idx] <= j) & ((nxt == start) | (rem_len[idx] == j))
            if fin.any():
                fi = idx[fin]
                mask[toks[fi]] = True  # those ending inside a character are redone below
                if spine.n_partial:
                    ends.append((fi, nxt[fin]))
                live &= ~fin
            idx, st = idx[live], nxt[live]
        if spine.n_partial:
            partial = spine.partial
            for fi, fs in ends:
                p = partial[fi]
                if p.any():
                    self._partials_into(mask, toks[fi[p]], fs[p])
            if spine.n_empty:  # loop classes, then a partial character: still in start
                self._partials_into(mask, toks[len(toks) - spine.n_empty :], np.full(spine.n_empty, start, np.int32))
        mask[self._eog_ids] = eng.is_complete(start)
        return mask

    def _compute_mask_absorbing(self, start: int) -> npt.NDArray[np.bool_]:
        """The mask from ``start`` (no partial character pending, no token elements) by a
        walk that stops where a subtree is decided: the tokens made only of the start
        state's self-loop classes come from one cached mask; a node reached in a state
        whose self-loops cover everything below it accepts its subtree whole. Only the
        trie's "spine" (nodes above a character that leaves a self-loop) is walked."""
        eng = self.engine
        n_vocab = self.n_vocab
        loops0 = self._self_loops(start)
        if loops0.any():
            spine = self._spine(loops0)
            if spine is not None:
                return self._compute_mask_spine(start, loops0, spine)
        mask = self._lmask(loops0).copy() if loops0.any() else np.zeros(n_vocab, dtype=bool)
        cls_all, E, first_child, n_child = self._cls, self._E_np, self._first_child, self._n_child
        root = self.n_nodes
        # start at the root's children whose class the start state takes (its row of
        # transitions is complete: _self_loops computed it)
        takes = np.flatnonzero(eng.table()[start, : eng.n_classes] >= 0)
        a, b = self._root_start[takes], self._root_start[takes + 1]
        lens = b - a
        cnt = int(lens.sum())
        nodes = self._root_nodes[np.repeat(a - np.cumsum(lens) + lens, lens) + np.arange(cnt, dtype=np.int64)]
        ps = np.full(cnt, start, dtype=np.int32)
        all_l = np.ones(cnt, dtype=bool)
        spans: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = []  # row ranges accepted
        partial_at: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]] = []
        not_l0 = ~loops0
        in_loop0 = self._loop_classes(loops0)
        has_loops0 = bool(in_loop0.any())
        while len(nodes):
            c = cls_all[nodes]
            t = eng.table()
            nxt = t[ps, c]
            unknown = nxt == -2
            if unknown.any():
                eng.fill(ps[unknown], c[unknown])
                nxt = eng.table()[ps, c]
            alive = nxt >= 0
            if not alive.all():
                nodes, nxt, c, all_l = nodes[alive], nxt[alive], c[alive], all_l[alive]
            if not len(nodes):
                break
            e = E[nodes]
            if has_loops0:
                # still on a path of the start state's self-loops?
                all_l &= in_loop0[c]
                covered = ~(e & not_l0).any(axis=1)
                go = ~(all_l & covered)  # an all-self-loop subtree is in the start mask already
                off = ~all_l
            else:
                go = np.ones(len(nodes), dtype=bool)
                off = go
            if not has_loops0 or off.any():
                # off the start state's loops: absorb subtrees whose state loops over them
                idx = np.flatnonzero(off)
                st_off = nxt[idx]
                known = self._loops_known(st_off)
                if not known.all():
                    # a state's self-loops cost a full row of transitions: only worth it for
                    # a large subtree (a small one is walked as cheaply)
                    sn = nodes[idx[~known]]
                    big = (self._row_end[sn] - self._row_start[sn]) >= _ABSORB_MIN_ROWS
                    if big.any():
                        for s_ in set(st_off[~known][big].tolist()):
                            self._self_loops(s_)
                        known = self._loops_known(st_off)
                lp = self._loop_words[np.minimum(st_off, len(self._loop_words) - 1)]  # used where known
                absorbed = known & ~((e[idx] & ~lp).any(axis=1))
                if absorbed.any():
                    a_nodes = nodes[idx[absorbed]]
                    spans.append((self._row_start[a_nodes], self._row_end[a_nodes]))
                    go[idx[absorbed]] = False
                # tokens ending at the off-loop nodes still walked
                walked = idx[~absorbed]
                w_nodes = nodes[walked]
                rs = self._row_start[w_nodes]
                spans.append((rs, rs + self._n_term[w_nodes]))
            pt = self._has_pt[nodes]
            if pt.any():
                partial_at.append((nodes[pt], nxt[pt]))
            if not go.any():
                break
            if not go.all():
                nodes, nxt, all_l = nodes[go], nxt[go], all_l[go]
            counts = n_child[nodes]  # np.repeat skips the leaves (count 0)
            total = int(counts.sum())
            if total == 0:
                break
            offs = np.repeat(first_child[nodes] - np.cumsum(counts) + counts, counts)
            nodes = offs + np.arange(total, dtype=np.int64)
            ps = np.repeat(nxt, counts)
            all_l = np.repeat(all_l, counts)
        if spans:
            starts = np.concatenate([a for a, _ in spans])
            ends = np.concatenate([b for _, b in spans])
            lens = ends - starts
            keep = lens > 0
            if keep.any():
                starts, lens = starts[keep], lens[keep]
                total = int(lens.sum())
                rows = np.repeat(starts - np.cumsum(lens) + lens, lens) + np.arange(total, dtype=np.int64)
                toks = self._order[rows]
                mask[toks[self._nonpartial[toks]]] = True
        # tokens ending inside a character: their state must take a completion of it
        for pn, pst in partial_at:
            for node, s_ in zip(pn.tolist(), pst.tolist(), strict=True):
                at = self._pt_at[node]
                self._partials_into(mask, at, np.full(len(at), s_, dtype=np.int32))
        at_root = self._pt_at.get(root)
        if at_root is not None:
            self._partials_into(mask, at_root, np.full(len(at_root), start, dtype=np.int32))
        mask[self._eog_ids] = eng.is_complete(start)
        return mask

    # ------------------------------------------------------------------ masks
    def allowed(self, state: int, partial: Partial = NO_PARTIAL) -> npt.NDArray[np.bool_]:
        """Boolean mask over the vocabulary: the tokens llama.cpp's grammar sampler
        would leave unmasked in this parser state. The array is shared with the cache:
        do not modify it (copy first)."""
        if type(state) is not int:
            state = expect_int("state", state)
        if type(partial) is not tuple or len(partial) != 2:
            raise _bad_partial(partial)
        key = (state, partial)
        last = self._last
        if last is not None and last[0] == key and self._mask_cache_size > 0:
            self.stats["mask_hits"] += 1
            return last[1]
        with self._lock:
            packed, mask = self._packed_locked(key)
            if mask is None:
                mask = np.unpackbits(packed, count=self.n_vocab, bitorder="little").view(np.bool_)
            mask.flags.writeable = False
            self._last = (key, mask)
            return mask

    def packed(self, state: int, partial: Partial = NO_PARTIAL) -> npt.NDArray[np.uint8]:
        """The mask packed 8 tokens per byte, little bit order (bit ``t % 8`` of byte
        ``t // 8``); viewed as ``uint32`` on a little-endian machine, bit ``t % 32`` of
        word ``t // 32`` (the layout of xgrammar and llguidance bitmasks). Shared with
        the cache: do not modify it."""
        state = expect_int("state", state)
        if type(partial) is not tuple or len(partial) != 2:
            raise _bad_partial(partial)
        with self._lock:
            return self._packed_locked((state, partial))[0]

    def fill_words(self, state: int, partial: Partial, out: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
        """The mask written into ``out`` as ``uint32`` words (bit ``t % 32`` of word ``t // 32``;
        the first ``ceil(n_vocab / 32)`` words are overwritten, padding bits cleared) and
        returned. A cached mask is copied; with no cache and the C walk, the walk writes
        into ``out`` directly."""
        state = expect_int("state", state)
        if type(partial) is not tuple or len(partial) != 2:
            raise _bad_partial(partial)
        n = self.n_words
        if not isinstance(out, np.ndarray):
            raise type_error("out", f"a 1-D uint32 array of at least {n} words", out)
        if out.dtype != np.uint32 or out.ndim != 1 or len(out) < n:
            raise ValueError(f"out must be a 1-D uint32 array of at least {n} words")
        if not out.flags.writeable or not out.flags.c_contiguous:
            raise ValueError("out must be writeable and C-contiguous")
        return self._fill_words(state, partial, out)

    def _fill_words(self, state: int, partial: Partial, out: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
        """:meth:`fill_words` with ``state`` an int and ``out`` checked (1-D, uint32,
        writeable, C-contiguous, at least ``n_words``): the matcher's path."""
        n = self.n_words
        with self._lock:
            if self._uncached_c and partial[1] == 0 and state != DEAD:  # (_c_walks, no mask cache)
                self.stats["mask_misses"] += 1
                plan = self._plans.get(state)
                if plan is not None and state in self._settled:
                    # a settled state: one C call that reads only the tables and allocates
                    # nothing (no collection can fall due: the garbage collector stays on)
                    self._set_tables()
                    tg = self._tg
                    if tg.mask_plain_rc(plan, self._out_cdata(out)) == 0 and tg.n_pending == 0:
                        return out
                paused = gc.isenabled()
                if paused:
                    gc.disable()
                try:
                    if not self._mask_fast(state, out):
                        self._mask_words_c(state, out if len(out) == n else out[:n])
                finally:
                    if paused:
                        gc.enable()
                return out
            if self._uncached_c and state != DEAD:  # a partial character pending: no walk
                self.stats["mask_misses"] += 1
                paused = gc.isenabled()  # (no collection inside a mask, as above)
                if paused:
                    gc.disable()
                try:
                    self._partial_words(state, partial, out if len(out) == n else out[:n])
                finally:
                    if paused:
                        gc.enable()
                return out
            packed = self._packed_locked((state, partial))[0]
        words = out[:n].view(np.uint8)
        words[len(packed) :] = 0
        words[: len(packed)] = packed
        if not np.little_endian:  # pragma: no cover - bytes were packed little-endian
            out[:n].byteswap(inplace=True)
        return out

    def _out_cdata(self, out: npt.NDArray[np.uint32]) -> Any:
        """A cffi buffer over ``out`` (the last one made, when ``out`` is the same array)."""
        oc = self._out_c
        if oc is None or oc[0] is not out:
            oc = self._out_c = (out, _ffi.from_buffer("uint32_t[]", out))
        return oc[1]

    def _mask_fast(self, state: int, out: npt.NDArray[np.uint32]) -> bool:
        """A state's first mask from the root in one C call, when it leaves nothing pending
        (under the lock; ``out`` checked by the caller; a settled state's plan is walked
        by :meth:`_fill_words` before it). False (nothing decided, ``out`` to be
        overwritten) for everything else, which :meth:`_mask_words_c` does, as it does
        these: a first mask answering "plan" has its plan made here and walked there; one
        answering "heavy" (returned before any walk) or leaving subtrees pending is made
        again there."""
        tg = self._tg
        if state in self._plans:
            return False
        small = self.n_vocab <= _SMALL_VOCAB
        if tg._engine is None or tg._first_args is None or (state in self._visited and not small):
            return False
        if state in self._derived:
            return False
        tmpl = self._plan_next.get(state)
        if tmpl is not None and not small:  # (what the C call answers "plan" for, without it)
            self._visited.add(state)
            if self._position_mask(state, tmpl, out):
                return True
            if state not in self._plans:  # (another run: a position near the bound)
                self._plans[state] = self._plan(state)
            return False
        self._walk_tables()
        eng = self.engine
        with eng._lock:
            try:
                rc = tg.first_mask_rc(
                    state,
                    self._out_cdata(out),
                    _INT32_MAX if small else _ROOT_PLAN_MAX,
                    -1 if small else _DERIVE_MIN_ROOT,
                    -1 if small else _ROOT_PLAN_TOKENS,
                    _DERIVE_SHARE,
                )
            finally:
                eng._c_sync()
        if rc == 1 and not small:  # a plan pays (the general path's answer to "plan"), made here
            self._visited.add(state)
            self._plans[state] = self._plan(state)
            return False
        if rc == 2:  # "heavy" (never when small): the derivation decided here, not asked again
            self._derived[state] = self._derivation(state)
            return False
        if rc != 0 or tg.n_pending:
            return False
        if not small:
            self._first_mask_taken(state)
        self._settled.add(state)
        return True

    def _first_mask_taken(self, state: int) -> None:
        """Count a first mask of ``state`` walked whole from the root: after
        :data:`_PLAN_AT` - 1 of them, its next mask makes its plan (``_visited``)."""
        n = self._first_masks[state] = self._first_masks.get(state, 0) + 1
        if n >= _PLAN_AT - 1:
            self._visited.add(state)

    def _packed_locked(self, key: tuple[int, Partial]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_] | None]:
        """The packed mask of ``key`` (cached or computed) and, when the walk made one,
        the boolean mask too."""
        packed = self._masks.get(key)
        if packed is not None:
            self._masks.move_to_end(key)
            self.stats["mask_hits"] += 1
            return packed, None
        self.stats["mask_misses"] += 1
        packed, mask = self._walk_packed(*key)
        packed.flags.writeable = False
        if self._mask_cache_size > 0:
            self._masks[key] = packed
            if len(self._masks) > self._mask_cache_size:
                self._masks.popitem(last=False)
        return packed, mask

    def _walk_packed(self, state: int, partial: Partial) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_] | None]:
        """The packed mask computed (no cache), and the boolean one when the walk made it."""
        mask: npt.NDArray[np.bool_] | None = None
        # no garbage collection inside a mask (a full collection of a large program is
        # milliseconds): a collection that falls due runs after it, at the next allocation
        paused = gc.isenabled()
        if paused:
            gc.disable()
        try:
            if self._c_walks(state, partial):
                packed = self._mask_words_c(state).view(np.uint8)[: (self.n_vocab + 7) // 8]
            else:
                mask = self._compute_mask(state, partial)
                packed = np.packbits(mask, bitorder="little")
        finally:
            if paused:
                gc.enable()
        return packed, mask

    # ------------------------------------------------------------------ the C walk
    def _c_walks(self, state: int, partial: Partial) -> bool:
        """Whether the C walk computes this mask: the ``"c"`` kernel, a live state, no
        partial character pending and no token elements in the grammar (those masks,
        rare, take the numpy walk)."""
        return self._walks_c and state != DEAD and partial[1] == 0

    def _mask_words_c(
        self, start: int, out: npt.NDArray[np.uint32] | None = None, derive: bool = True
    ) -> npt.NDArray[np.uint32]:
        """The mask from ``start`` as ``uint32`` words (into ``out`` when given), by the C
        walk: the tokens made of the start state's run (its self-loop classes, or the
        classes that lead it down a chain of states, as inside a bounded string) from one
        cached scan; the walk below the nodes where those paths leave the run (grouped by
        depth and class: a class the state at that depth does not take drops its nodes at
        once); subtrees the walk could not decide (a transition, a run or partial
        characters not computed yet) computed here and walked again. What a start state
        needs besides the walk (its run's scan, its chain, the tokens ending inside a
        character on its run, end-of-generation) is prepared once per state."""
        eng, tg = self.engine, self._tg
        on_engine = tg._engine is not None  # (tg.has_engine)
        plan = self._plans.get(start)
        if on_engine and derive and plan is None:
            d = self._derived.get(start)
            if d is not None:  # (decided at its first mask, when that reported many root children)
                words = np.empty(self.n_words, dtype=np.uint32) if out is None else out
                return self._mask_words_derived(start, d, words)
        if on_engine and plan is not None and start in self._settled:
            # everything its walk reads is in the tables: no engine, no lock, one C call
            words = np.empty(self.n_words, dtype=np.uint32) if out is None else out
            self._set_tables()
            pend, full = tg.mask_plain(plan, words)
            if not full and not len(pend):
                return words
        first = False  # the C engine's first mask of start, without a plan
        small = on_engine and self.n_vocab <= _SMALL_VOCAB  # every mask a first mask, from the root
        if plan is None:
            if small:
                first = True
            elif start not in self._visited:  # most states are masked once (inside literals and bounded strings)
                self._first_mask_taken(start)
                if on_engine:
                    first = True
                elif self._root_plan_pays(start):
                    plan = self._root_plan(start)
            if plan is None and not first:
                plan = self._plans[start] = self._plan(start)
        words = np.empty(self.n_words, dtype=np.uint32) if out is None else out
        nodes: npt.NDArray[np.int32] | None = None
        states: npt.NDArray[np.int32] | None = None
        while True:
            if on_engine:  # with room for the runs and partial-character answers the walk computes
                self._walk_tables()
            else:
                self._set_tables()
            if on_engine:  # the walk computes transitions and runs in the engine: hold it, then copy its news
                status = "made"
                with eng._lock:
                    try:
                        if first:
                            # a state whose transitions reach many root children reports it
                            # first (once): its mask may derive from another state's
                            heavy = _DERIVE_MIN_ROOT if derive and start not in self._derived and not small else -1
                            status, pend, full = tg.first_mask(
                                start,
                                words,
                                _INT32_MAX if small else _ROOT_PLAN_MAX,
                                self._eog_i32,
                                self._pchars,
                                heavy,
                                -1 if small else _ROOT_PLAN_TOKENS,
                                _DERIVE_SHARE,
                            )
                        elif nodes is None:
                            pend, full = tg.mask(plan, words)
                        else:
                            pend, full = tg.walk(words, start, nodes, states)
                    finally:
                        eng._c_sync()
                if status == "heavy":
                    d = self._derived[start] = self._derivation(start)
                    if d is not None:
                        return self._mask_words_derived(start, d, words)
                    continue  # the first mask again, walked from the root
                if first and (status == "plan" or full):  # a plan pays (a run that starts many tokens), or is needed
                    first = False
                    plan = self._plans[start] = self._plan(start)
                    nodes = states = None
                    continue
                first = False
            elif nodes is None:
                pend, full = tg.mask(plan, words)
            else:
                pend, full = tg.walk(words, start, nodes, states)
            if len(pend):
                self._resolve_pending(pend)
            if full:  # the walk stopped early: everything again, with what it missed now known
                nodes = states = None
                if plan is None:
                    plan = self._plans[start] = self._plan(start)
                continue
            if not len(pend):
                self._settled.add(start)
                return words
            nodes, states = pend[:, 0].copy(), pend[:, 1].copy()

    # ------------------------------------------------------------------ derived masks
    def _derivation(self, start: int) -> _Derived | None:
        """How the mask of ``start`` follows from another state's, or None. Let ``G`` be the
        successor of ``start`` that the most root children lead to (weighing classes by their
        root children). A token whose first character has class ``c`` is allowed from
        ``start`` exactly when it is from ``G`` if both states go to the same state on ``c``;
        so where the classes on which they differ (``X``) hold few root children, the mask
        of ``start`` is the mask of ``G`` with the subtrees of ``X``'s root children walked
        again from ``start``, and with its own end-of-generation and partial-character
        tokens. The content of a key next to the keys an object names (every class but one
        leads to the same "any other key" state) is the case that needs it: there the walk
        from ``start`` itself enters most of the trie's 19,000 root subtrees one by one."""
        eng = self.engine
        if eng.core == "c":  # one call (the numpy below is its reference)
            got = eng._c_derive_pick(start, self._root_count, _DERIVE_MIN_ROOT, _DERIVE_SHARE)
            if got is None:
                return None
            g, differ = got
        else:
            pick = self._derive_pick(start)
            if pick is None:
                return None
            g, differ = pick
        rs = self._tg._root_start
        groups = [self._tg._root_nodes[rs[c] : rs[c + 1]] for c in differ.tolist()]
        nodes = np.concatenate(groups) if groups else np.zeros(0, dtype=np.int32)
        extra = [self._eog_ids] if eng.is_complete(start) else []
        rp = self._root_pt
        if len(rp):
            extra.append(rp[self._state_pchar_ok(start)[self._pchar_slot[rp]]])
        add = np.concatenate(extra).astype(np.int32) if extra else np.zeros(0, dtype=np.int32)
        nodes = np.ascontiguousarray(nodes, dtype=np.int32)
        split = None
        if len(nodes) and _SPLIT_BUDGET > 0:  # only where the two states' paths part
            self._walk_tables()
            with eng._lock:
                try:
                    split = self._tg.derive_split(start, g, nodes, _SPLIT_BUDGET, _SPLIT_CAP)
                finally:
                    eng._c_sync()
        if split is None:  # those root children walked whole
            return _Derived(g, nodes, np.full(len(nodes), start, dtype=np.int32), add, nodes)
        clear, walk_nodes, walk_states = split
        return _Derived(g, walk_nodes, walk_states, add, clear)

    def _root_pt_eog_ids(self) -> npt.NDArray[np.int32]:
        """The tokens that are only a partial character, and end-of-generation (cached)."""
        if self._root_pt_eog is None:
            self._root_pt_eog = np.concatenate((self._root_pt, self._eog_ids)).astype(np.int32)
        return self._root_pt_eog

    def _derive_pick(self, start: int) -> tuple[int, npt.NDArray[np.int32]] | None:
        """:meth:`_derivation`'s choice in numpy (the reference of the C core's
        ``Engine._c_derive_pick``): ``G``, the successor of ``start`` that the most root
        children lead to (of the heaviest, the one the first class leads to), and the
        classes on which the rows of ``start`` and ``G`` differ; None when no derivation
        serves (see there)."""
        eng = self.engine
        weight = self._root_count
        eng.fill_row(start)  # (the first mask that asked computed most of it)
        row = eng.table()[start]
        live = row >= 0
        total = int(weight[live].sum())
        if not live.any() or total < _DERIVE_MIN_ROOT:
            return None
        # successor -> root children (bincount: np.unique imports numpy.ma, ~12 ms)
        succ = row[live]
        per = np.bincount(succ, weights=weight[live])
        g = int(succ[np.argmax(per[succ] == per.max())])
        if g == start:  # a run: the plan's scan serves it
            return None
        eng.fill_row(g)
        table = eng.table()
        differ = np.flatnonzero(table[start] != table[g])
        if int(weight[differ].sum()) * _DERIVE_SHARE > total:
            return None
        return g, differ.astype(np.int32)

    def _mask_words_derived(self, start: int, d: _Derived, words: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
        """The mask of ``start`` from the mask of ``d.of`` (see :meth:`_derivation`): that
        mask, less the subtrees of ``d.nodes`` and the root-level tokens, plus the state's
        own root-level tokens and its walk below ``d.nodes``."""
        eng, tg = self.engine, self._tg
        todo: tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]] | None = None
        while True:
            if todo is None:  # from the other state's mask
                self._base_words(d.of, words)
                # less the tokens below d.clear and the root-level ones, plus the state's own
                self._tg.trie.clear_below(words, d.clear, self._root_pt_eog_ids())
                _set_token_ids(words, d.add)
                todo = d.nodes, d.states
            if not len(todo[0]):
                return words
            self._walk_tables()
            with eng._lock:  # the walk computes transitions and runs in the engine
                try:
                    pend, full = tg.walk(words, start, *todo)
                finally:
                    eng._c_sync()
            if len(pend):
                self._resolve_pending(pend)
            if full:  # the walk stopped early: all again, with what it missed now known
                todo = None
            else:  # the subtrees it could not decide, walked again
                todo = pend[:, 0].copy(), pend[:, 1].copy()

    def _base_words(self, of: int, words: npt.NDArray[np.uint32]) -> None:
        """The mask of ``of``, a derivation's base, into ``words`` (``n_words`` long): a copy
        of the one kept (:data:`_BASES_KEPT` of them, the most recently used; a mask is a
        function of its state alone, so a kept one never goes stale), or walked and kept.
        Every named key's character after ``{"`` in an object that allows other keys is a
        new state derived from one base, the "any other key" string's content: a copy (2 µs
        for Gemma 3's 32 KiB) instead of that mask's walk (20-40 µs) each time."""
        kept = self._bases.get(of)
        if kept is not None:
            self._bases.move_to_end(of)
            np.copyto(words, kept)
            return
        self._mask_words_c(of, words, derive=False)
        kept = self._bases[of] = words.copy()
        kept.flags.writeable = False
        if len(self._bases) > _BASES_KEPT:
            self._bases.popitem(last=False)

    def _walk_tables(self) -> None:
        """Room in the run and partial-character tables for what an engine walk computes
        (64 states ahead), and the C walk's view of the tables, current."""
        need = len(self.engine._complete) + 64  # (n_states + 64)
        if len(self._run_known) < need:
            self._grow_runs(2 * need)
        if len(self._pchar_known) < need:
            self._grow_pchars(2 * need)
        self._set_tables()

    def _set_tables(self) -> None:
        """The C walk's view of the tables (transitions, runs, partial characters), current
        (also for :func:`~samplers.grammar.fill_masks`, under the lock, after its plans).
        The tables are replaced, never resized in place, and the run and partial-character
        ones in pairs: the same three arrays as last time mean nothing to do."""
        t = self.engine._trans  # (engine.table())
        given = self._tables_given
        if given is not None and t is given[0] and self._run_known is given[1] and self._pchar_known is given[2]:
            return
        self._tg.set_tables(
            t,
            self._run_known,
            self._run_words,
            self._run_len,
            self._pchar_known,
            self._pchar_tab,
            run_closed=self._run_closed,
        )
        self._tables_given = (t, self._run_known, self._pchar_known)

    def _resolve_pending(self, pend: npt.NDArray[np.int32]) -> None:
        """Compute what a walk left pending: transitions, runs, partial-character answers."""
        from llama_cffi._trie_walk import PEND_PCHAR, PEND_RUN, PEND_TRANS

        why = pend[:, 2]
        sel = why == PEND_TRANS
        if sel.any():
            self.engine.fill(pend[sel, 1], pend[sel, 3])
        for s_ in sorted(set(pend[why == PEND_RUN, 3].tolist()), reverse=True):
            self._run(s_)  # newest first: down a chain, the later states' runs serve the earlier
        for s_ in set(pend[why == PEND_PCHAR, 3].tolist()):
            self._pchar_row(s_)

    def _batch_plan(self, state: int) -> Any:
        """For :func:`~samplers.grammar.fill_masks` (under the lock): the plan of ``state``,
        made if needed."""
        plan = self._plans.get(state)
        if plan is None:
            plan = self._plans[state] = self._plan(state)
        return plan

    def _cached_packed(self, key: tuple[int, Partial]) -> npt.NDArray[np.uint8] | None:
        """A cached mask (counted as a hit), or None (under the lock)."""
        packed = self._masks.get(key)
        if packed is not None:
            self._masks.move_to_end(key)
            self.stats["mask_hits"] += 1
        return packed

    def _store(self, key: tuple[int, Partial], words: npt.NDArray[np.uint32]) -> None:
        """Count a computed mask and, with a cache, keep a copy (under the lock)."""
        self.stats["mask_misses"] += 1
        if self._mask_cache_size > 0:
            packed = words[: self.n_words].view(np.uint8)[: (self.n_vocab + 7) // 8].copy()
            packed.flags.writeable = False
            self._masks[key] = packed
            if len(self._masks) > self._mask_cache_size:
                self._masks.popitem(last=False)

    def _plan(self, start: int) -> Any:
        """``llama_cffi._trie_walk.TrieGrammar.plan`` for ``start``: its run's chain and
        scan (see :meth:`_run_scan`), and the tokens to set besides the walk's: those
        ending inside a character on the run's paths whose state down the chain can
        complete that character, and the end-of-generation tokens when ``start`` is
        complete."""
        eng = self.engine
        chain = self._run(start)  # also completes the rows of the chain's states
        if eng.core == "c" and self._closure_pays(start) and len(set(chain.tolist())) <= _CLOSED_CHAIN:
            if start not in self._closed_tried:
                self._closed_for(start)
            closed = self._run_closed[start]
            if closed.any() and not (self._run_words[start] & ~closed).any() and not self._scan_ready(start, chain):
                # its closed run holds its run: a walk from the root takes whole what the
                # run's scan would, and more; the scan would cost milliseconds (~5 for
                # ".*(top-left|...).*", whose run leaves each "t", "m" and "b"), where the
                # walk sets each token's bit (0.5-1 ms at 262,144 tokens). A run whose scan
                # is made already takes its plan: its mask is one OR, and its closed run
                # still serves below its frontier
                return self._root_plan(start, closed)
        wider = self._wider_chain(start, chain)
        if wider is None:
            scan = self._run_scan(start, len(chain) - 1)
        else:
            chain, runs = wider
            scan = self._chain_scan(runs)
        extra = [self._eog_ids] if eng.is_complete(start) else []
        pt = scan.pt_tokens
        if len(pt):  # their whole characters lead down the chain
            one, slots = self._pt_split(scan)
            if one >= 0:  # all at one depth (most scans: the run's partial characters start a token)
                extra.append(pt[self._state_pchar_ok(int(chain[one]))[slots]])
            else:
                at = chain[scan.pt_depth]
                for s_ in set(at.tolist()):
                    sel = at == s_
                    extra.append(pt[sel][self._state_pchar_ok(s_)[slots[sel]]])
        toks = np.concatenate(extra).astype(np.int32) if extra else np.zeros(0, dtype=np.int32)
        plan = self._tg.plan(start, scan, chain, toks)
        if wider is None and self._bounded_position(chain):
            # the next token's state is one of the positions down its chain (the same run),
            # and takes a plan at once, made from this one (not the first mask's C call,
            # which would answer "plan")
            self._plan_next.update(dict.fromkeys(chain[1:].tolist(), plan))
        return plan

    def _position_mask(self, state: int, tmpl: Any, out: npt.NDArray[np.uint32]) -> bool:
        """The first mask of a bounded string's position ``state`` into ``out`` in one C
        call (under the lock; ``out`` checked by the caller), its plan made from ``tmpl``,
        an earlier position's (``_plan_next``): what :meth:`_plan` would make (its run is
        ``tmpl``'s: the same scan, its own chain, end-of-generation and partial-character
        tokens), without a call per part. True when the mask is done (the state settled);
        False when it left subtrees pending (its plan kept, for :meth:`_mask_words_c` to
        walk again) or when ``state``'s run is another (a position near the bound: nothing
        kept, :meth:`_plan` makes its plan)."""
        self._walk_tables()
        eng, tg = self.engine, self._tg
        with eng._lock:
            try:
                rc, got = tg.position_mask(tmpl, state, _CHAIN_MAX, self._out_cdata(out))
            finally:
                eng._c_sync()
        if rc == 1:
            return False
        chain = got[2]
        self._run_chain[state] = chain  # (its run's classes, closed run and length: in the tables)
        self._plans[state] = got
        nxt = self._plan_next
        for s_ in chain[:0:-1].tolist():  # new down the chain: the positions past the last one's
            if s_ in nxt:
                break
            nxt[s_] = got
        if rc == 0 and tg.n_pending == 0:
            self._settled.add(state)
            return True
        return False

    def _closed_for(self, start: int) -> None:
        """The closed run of ``start`` searched over more states than a run's own search
        (:data:`_CLOSED_STATES`, against 8), whatever the classes' weights, and given to
        every state of its closure that has none: their walks then take whole each subtree
        of its classes. For a plan whose scan leaves much to the walk: in a searched
        pattern (``.*(top-left|top-right).*``), the states that tell how much of a match is
        read are ~100, each letter of a match leads to another, so no run is long, and each
        walk from them descended every token with such a letter (6-7 ms at 262,144 tokens);
        but every string character keeps them all alive (the closing quote aside). Searched
        once per state (under the lock)."""
        self._closed_tried.add(start)
        if self._run_closed[start].any():
            return
        words, states = self.engine._c_closed(start, self._class_weight_f, _RUN_STACKS_MAX, _CLOSED_STATES)
        if not words.any() or not len(states):
            return
        top = int(states.max())
        if top >= len(self._run_known):
            self._grow_runs(max(2 * len(self._run_known), top + 1))
        bare = states[~self._run_closed[states].any(axis=1)]
        self._run_closed[bare] = words
        self._closed_tried.update(states.tolist())

    def _closure_pays(self, state: int) -> bool:
        """Whether a plan for ``state`` (its row and run known) should search its closure
        (:meth:`_closed_for`): when the classes it takes off its run hold at least
        :data:`_CLOSED_FRONTIER` of the trie's nodes (a walk would descend them all), and its
        run's classes at least 4 times as many (a string's content, whose searched pattern
        tells a few letters apart; not a value's first character, where ``[``, ``{`` and
        ``"`` lead to the whole grammar: a search there fills hundreds of rows, ms, and
        finds nothing). One C call (numpy's would cost tens of microseconds in a fresh
        process, at each string's first mask). (:meth:`_plan` skips the search, too, for a
        state whose run's chain passes more than :data:`_CLOSED_CHAIN` states: a bounded
        string's positions, whose closure runs into the bound whatever the pattern.)"""
        return self.engine._c_closure_pays(state, self._run_words[state], self._class_weight_f, _CLOSED_FRONTIER)

    def _scan_ready(self, state: int, chain: npt.NDArray[np.int32]) -> bool:
        """Whether the scan :meth:`_run_scan` would give the run of ``state`` (its chain
        ``chain``) is made already: by this grammar, or (full-length) shared by the
        vocabulary, or derived from a base this grammar made."""
        run = self._run_words[state]
        key = run.tobytes()
        k = len(chain) - 1
        if (key, k) in self._run_scans or (k < self._run_cap and key in self._run_bases):
            return True
        return k == self._run_cap and self.vocab._shared_scan(self._cp_key(run)) is not None

    def _bounded_position(self, chain: npt.NDArray[np.int32]) -> bool:
        """Whether the state whose run's chain is ``chain`` (see :meth:`_run`) is a bounded
        string's position: its run holds for any token and does not loop within
        :data:`_CHAIN_MAX` states."""
        return len(chain) - 1 == self._run_cap and len(set(chain[: _CHAIN_MAX + 1].tolist())) == min(
            _CHAIN_MAX + 1, len(chain)
        )

    def _pt_split(self, scan: RunScan) -> tuple[int, npt.NDArray[np.int32]]:
        """For :meth:`_plan`, per scan (made once): the depth of all its partial-character
        tokens when they share one (else -1), and each one's partial-character slot."""
        got = self._pt_of.get(scan)
        if got is None:
            d = scan.pt_depth
            one = int(d[0]) if len(d) and not (d != d[0]).any() else -1
            got = self._pt_of[scan] = (one, self._pchar_slot[scan.pt_tokens])
        return got

    def _wider_chain(
        self, start: int, chain: npt.NDArray[np.int32]
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.uint64]] | None:
        """A chain down which each state follows its own run, not ``start``'s: the state
        after ``d`` characters, and per character the classes of the run of the state
        before it, until a state's run loops on itself (its classes then repeat: any
        length) within :data:`_CHAIN_MAX` states (else None: a chain through a bounded
        string's positions would be scanned with no subtree taken whole before its
        end, milliseconds, where their common run is derived). A scan over it takes
        at once the tokens that ``start``'s run would leave to the walk, as in a key that
        must match ``\\w`` (a word character, then any string character: after the word
        character, the run of any character) or a name ``[A-Z][a-z]+`` (a capital, then a
        loop of lowercase letters). Returned when it is longer than ``chain`` (``start``'s
        run, any state's classes the same), or as long and its classes hold ``start``'s
        run's at every character; else None (``start``'s run is as good). Not for a short
        run that fewer than :data:`_CHAIN_MIN_TOKENS` tokens start with (the quote before
        a string): the walk below it is short, and a scan of the chain would be one more
        to make in a fresh process."""
        cap = self._run_cap
        if len(chain) > 1 and chain[1] == start:
            return None  # a self-loop: every character's classes are start's run
        if len(chain) - 1 < cap and self._first_tokens(self._run_words[start]) < _CHAIN_MIN_TOKENS:
            return None  # few tokens start with the run (a quote before a string): its walk is short
        if self._bounded_position(chain):
            # its successors' runs (one engine call each, ~15 us at 77 stacks) would be
            # computed only to find the same classes, position after position: start's run
            return None
        states = [start]
        runs = [self._run_words[start]]  # (start's run is known: chain is its)
        cur, own = start, chain
        while True:
            if len(own) < 2:
                return None  # none follows: start's run
            nxt = int(own[1])
            if nxt == cur:  # a self-loop: its classes repeat, the chain is as long as any token
                if not runs[-1].any():
                    return None  # (an empty run, padded as a loop: nothing follows; start's run)
                states.extend([cur] * (cap + 1 - len(states)))
                break
            if len(states) >= min(_CHAIN_MAX, cap):
                return None  # a long prefix (a literal, a bounded string): start's run
            own = self._run(nxt)  # (its run computed before its classes are read)
            states.append(nxt)
            runs.append(self._run_words[nxt])
            cur = nxt
        k, k0 = len(states) - 1, len(chain) - 1
        first = runs[0]
        if all(np.array_equal(r, first) for r in runs):
            return None  # the same classes throughout: start's run (with its derivations)
        if k == k0 and not all(not (first & ~r).any() for r in runs):
            return None
        return np.asarray(states, dtype=np.int32), np.stack(runs)

    def _first_tokens(self, run: npt.NDArray[np.uint64]) -> int:
        """How many usable tokens start with a character of ``run``'s classes."""
        per = self._class_first_tokens
        if per is None:
            counts = np.bincount(self._cls_of_cp, weights=self.vocab.first_cp_tokens, minlength=self.engine.n_classes)
            per = self._class_first_tokens = counts.astype(np.float64)
        bits = np.unpackbits(run.view(np.uint8), bitorder="little")[: self.engine.n_classes].astype(bool)
        return int(per[bits].sum())

    def _chain_scan(self, runs: npt.NDArray[np.uint64]) -> Any:
        """The full-length scan of a chain's runs (``_wider_chain``, which ends in a loop:
        one class set per character, the last repeating): cached per runs, and shared
        through the vocabulary's index by the code points of each run (as
        :meth:`_full_scan`)."""
        cap = self._run_cap
        key = (runs.tobytes(), cap)
        got = self._run_scans.get(key)
        if got is not None:
            return got
        ck = b"".join(self._cp_key(r) for r in runs)
        sh = self.vocab._shared_scan(ck)
        if sh is not None:
            got = self._tg.unshare(sh, runs[0])
        else:
            got = self._tg.run_scan(runs, cap)
            self.vocab._share_scan(ck, self._tg.shared(got))
        self._run_scans[key] = got
        return got

    def _root_plan_pays(self, start: int) -> bool:
        """Whether the first mask from ``start`` should skip the plan: when its run's scan is
        not made yet and the run starts few tokens (its classes hold at most
        ``_ROOT_PLAN_MAX`` of the root's children). A run that starts many (a string's
        content) is worth its scan, which every state with that run shares."""
        chain = self._run(start)
        run = self._run_words[start]
        if (run.tobytes(), len(chain) - 1) in self._run_scans:
            return False
        bits = np.unpackbits(run.view(np.uint8), bitorder="little")[: self.engine.n_classes]
        return int(self._root_count[bits.astype(bool)].sum()) <= _ROOT_PLAN_MAX

    def _root_plan(self, start: int, closed: npt.NDArray[np.uint64] | None = None) -> Any:
        """A plan for the first mask from ``start``: no run, no scan (what a plan costs is
        repaid only by a state masked again), the walk from the root through the root
        groups; besides it, the tokens that are only a partial character that ``start``
        can complete, and end-of-generation when ``start`` is complete. With ``closed``, a
        closed run of ``start``'s whose code points have a full-length scan in the
        vocabulary (JSON string content, prescanned: a searched pattern's closure), the
        plan's mask starts from that scan's, and the walk skips what it holds (``premask``
        in ``llama_cffi._trie_walk.TrieGrammar.plan``): it sets no bit of the ~260,000
        tokens of a string's content one by one."""
        extra = [self._eog_ids] if self.engine.is_complete(start) else []
        rp = self._root_pt
        if len(rp):
            extra.append(rp[self._state_pchar_ok(start)[self._pchar_slot[rp]]])
        toks = np.concatenate(extra).astype(np.int32) if extra else np.zeros(0, dtype=np.int32)
        chain = np.array([start], dtype=np.int32)
        if closed is not None:
            scan = self._premask_scan(closed)
            if scan is not None:
                return self._tg.plan(start, scan, chain, toks, premask=closed)
        return self._tg.plan(start, self._root_scan, chain, toks)

    def _premask_scan(self, closed: npt.NDArray[np.uint64]) -> RunScan | None:
        """A run of length 0 (a walk from the root) whose mask is the full-length scan's of
        the code points of ``closed``'s classes, when the vocabulary has that scan (None
        when not); made once per classes."""
        key = closed.tobytes()
        if key in self._premask_scans:
            return self._premask_scans[key]
        sh = self.vocab._shared_scan(self._cp_key(closed))
        got = None if sh is None else self._tg.premask_scan(self._tg.unshare(sh, closed).mask, closed)
        self._premask_scans[key] = got
        return got

    def _run_key(self, state: int, row: npt.NDArray[np.int32]) -> bytes:
        """The classes of the run of ``state`` (see :meth:`_run`) as a key, from its row."""
        live = np.flatnonzero(row >= 0)
        if not len(live):
            return b""
        succ, inv = _unique_inverse(row[live].astype(np.int64))
        weight = np.bincount(inv, weights=self._class_weight[live], minlength=len(succ))
        weight[succ == state] += 0.5  # itself on a tie
        key: bytes = live[inv == int(np.argmax(weight))].astype(np.int32).tobytes()
        return key

    def _run(self, state: int) -> npt.NDArray[np.int32]:
        """The run of ``state`` (see ``llama_cffi._trie_walk``), put into the tables the C
        walk reads: ``L``, the classes that lead ``state`` to the same successor (of the
        successors, the one whose classes cover the most trie nodes; itself on a tie),
        followed while every class of ``L`` leads the state reached to one successor, at
        most to the longest token. Returns the chain: the state after ``d`` characters of
        ``L``, ``d = 0 .. k`` (cached)."""
        chain = self._run_chain.get(state)
        if chain is not None:
            return chain
        eng, nc, cap = self.engine, self.engine.n_classes, self._run_cap
        if eng.core == "c":  # the same run, computed by the engine's C core in one call
            chain, run, closed = eng._c_run(state, self._class_weight_f, cap, _RUN_STACKS_MAX)
            self._store_run(state, chain, run, closed)
            return chain
        eng.fill_row(state)
        row = eng.table()[state, :nc]
        live = np.flatnonzero(row >= 0)
        states = [state]
        run = np.zeros(self._W, dtype=np.uint64)
        if len(live):
            classes = np.frombuffer(self._run_key(state, row), dtype=np.int32).astype(np.int64)
            np.bitwise_or.at(run, classes >> 6, np.left_shift(np.uint64(1), (classes & 63).astype(np.uint64)))
            key = run.tobytes()
            cur = state
            while len(states) <= cap:
                if cur != state:
                    known = self._run_chain.get(cur)
                    if known is not None and self._run_words[cur].tobytes() == key:
                        # the same run from here on (as down a bounded string): its chain
                        states.pop()
                        states.extend(known[: cap + 1 - len(states)].tolist())
                        break
                if eng.n_stacks(cur) > _RUN_STACKS_MAX:
                    break  # an ambiguous grammar: each step multiplies the stacks (a shorter run is as correct)
                step = eng.group_step(cur, classes)  # not the whole row: the run's group
                if step is None or step < 0:
                    break
                nx = step
                if nx == cur:  # a self-loop: the chain stays here
                    states.extend([nx] * (cap + 1 - len(states)))
                    break
                states.append(nx)
                cur = nx
        else:  # nothing follows: the empty run covers the leaves of any length
            states.extend([state] * cap)
        chain = np.asarray(states, dtype=np.int32)
        self._store_run(state, chain, run)
        return chain

    def _store_run(
        self,
        state: int,
        chain: npt.NDArray[np.int32],
        run: npt.NDArray[np.uint64],
        closed: npt.NDArray[np.uint64] | None = None,
    ) -> None:
        """Put the run of ``state`` (and its closed run, when known: see
        ``llama_cffi_gengine_run``) into the tables the C walk reads, and its chain into
        ``_run_chain``."""
        if state >= len(self._run_known):
            self._grow_runs(max(2 * len(self._run_known), state + 1))
        self._run_words[state] = run
        if closed is not None and closed.any():  # (else the one it may have, its closure's: _closed_for)
            self._run_closed[state] = closed
        self._run_len[state] = len(chain) - 1
        self._run_known[state] = True
        self._run_chain[state] = chain

    def _grow_runs(self, n: int) -> None:
        """The run tables the C walk reads (and, with the engine, writes) made ``n`` rows long."""
        known = np.zeros(n, dtype=bool)
        known[: len(self._run_known)] = self._run_known
        words = np.zeros((n, self._W), dtype=np.uint64)
        words[: len(self._run_words)] = self._run_words
        closed = np.zeros((n, self._W), dtype=np.uint64)
        closed[: len(self._run_closed)] = self._run_closed
        lens = np.zeros(n, dtype=np.int32)
        lens[: len(self._run_len)] = self._run_len
        self._run_known, self._run_words, self._run_closed, self._run_len = known, words, closed, lens

    def _run_scan(self, state: int, k: int) -> Any:
        """``llama_cffi._trie_walk.Trie.run_scan`` for the run of ``state`` (cached per
        run: states with the same classes and length share it). Full-length runs, and short
        ones of a run with no full-length base yet, are scanned (subtrees wholly of the run
        taken at once); the other lengths (the positions of a bounded string) are derived
        from a full-length scan that kept the nodes it visited and the subtrees it took
        whole (made once per run; a derivation reads only the trie's nodes ``k`` deep)."""
        run = self._run_words[state]
        key = (run.tobytes(), k)
        got = self._run_scans.get(key)
        if got is None:
            cap = self._run_cap
            if k == cap:
                got = self._full_scan(run, keep=False)
            elif (
                k <= _SCAN_SHORT
                and key[0] not in self._run_bases
                and self.vocab._shared_scan(self._cp_key(run), True) is None
            ):
                # subtrees wholly of the run set at once (a run with a base to derive from,
                # a grammar's or the vocabulary's, is derived: a string of 2 or 3 of any
                # characters, a country's code, lists every trie node 3 or 4 deep where
                # its paths go on, 0.6-1.2 ms, and its derivation from the index's
                # JSON-content scan costs 0.1-0.3)
                got = self._tg.run_scan(run, k)
            else:  # derived from the full-length scan that kept its paths (made once per run)
                base = self._run_bases.get(key[0])
                if base is None:
                    base = self._run_bases[key[0]] = self._full_scan(run, keep=True)
                    self._run_scans.setdefault((key[0], cap), base)
                n = self._run_derived[key[0]] = self._run_derived.get(key[0], 0) + 1
                if n == _DENSIFY_AT and base.absorbed is not None and len(base.absorbed):
                    # a run derived at many lengths (a bounded string's last positions):
                    # densified once, for this grammar and the vocabulary's others
                    base = self._run_bases[key[0]] = self._tg.densified(base)
                    self.vocab._share_scan(self._cp_key(run), self._tg.shared(base))
                got = self._tg.run_derive(base, k)
            self._run_scans[key] = got
        return got

    def _full_scan(self, run: npt.NDArray[np.uint64], keep: bool) -> Any:
        """The full-length scan of ``run`` (with its paths when ``keep``): the vocabulary's
        shared one for the same code points when it has one (made by another grammar,
        or when the index was built: JSON string content), else scanned here and shared."""
        v = self.vocab
        ck = self._cp_key(run)
        sh = v._shared_scan(ck, keep)
        if sh is not None:
            return self._tg.unshare(sh, run)
        if not keep:
            # the scan of a subset of its code points (a prescan: [0-9a-z.-] for [a-z0-9./-]),
            # scanned on only below where its paths stop and this run's go on
            base = v._subset_scan(ck)
            if base is not None:
                sh = self._tg.run_scan_extend(base[1], base[0], run)
                v._share_scan(ck, sh)
                return self._tg.unshare(sh, run)
        got = self._tg.run_scan(run, self._run_cap, keep=keep)  # (densified by _run_scan when it pays)
        v._share_scan(ck, self._tg.shared(got))
        return got

    def _start_run_scan(self) -> tuple[bytes, Any]:
        """The full-length scan, with its paths, of the start state's run, shared
        (``SharedScan``) with its code-point key: what ``VocabIndex`` prescans (for a
        grammar ``root ::= [...]*``, the run is that character class)."""
        start = self.engine.start
        self._run(start)
        run = self._run_words[start]
        scan = self._tg.densified(self._tg.run_scan(run, self._run_cap, keep=True))
        return self._cp_key(run), self._tg.shared(scan)

    def _cp_key(self, run: npt.NDArray[np.uint64]) -> bytes:
        """Which of the vocabulary's code points the classes of ``run`` hold (one bit per
        distinct code point, and the partial-character bit): a scan depends on nothing
        else, so grammars with different classes share it by this key."""
        cpc = self._cls_of_cp_c
        if cpc is None:
            cpc = self._cls_of_cp_c = _ffi.from_buffer("int32_t[]", np.ascontiguousarray(self._cls_of_cp, np.int32))
        n = len(self._cls_of_cp)
        out = bytearray((n + 7) // 8 + 1)
        r = np.ascontiguousarray(run, dtype=np.uint64)
        if len(r) != self._W or _lib.llama_cffi_cp_key(
            cpc, n, self.engine.n_classes, _ffi.from_buffer("uint64_t[]", r), _ffi.from_buffer("uint8_t[]", out)
        ):
            raise ValueError("a run of another grammar, or a class past the grammar's")
        return bytes(out)

    def _grow_pchars(self, n: int) -> None:
        """The partial-character tables the C walk reads (and, with the engine, writes) made
        ``n`` rows long."""
        known = np.zeros(n, dtype=bool)
        known[: len(self._pchar_known)] = self._pchar_known
        tab = np.zeros((n, self._pchar_tab.shape[1]), dtype=bool)
        tab[: len(self._pchar_tab)] = self._pchar_tab
        self._pchar_known, self._pchar_tab = known, tab

    def _pchar_row(self, state: int) -> None:
        """Put :meth:`_state_pchar_ok` of ``state`` into the table the C walk reads."""
        if state >= len(self._pchar_known):
            self._grow_pchars(max(2 * len(self._pchar_known), state + 1))
        self._pchar_tab[state, : len(self._pchars)] = self._state_pchar_ok(state)
        self._pchar_known[state] = True

    def _walk_trie(self, start: int) -> npt.NDArray[np.int32]:
        """The state reached at every trie node from ``start`` (``DEAD`` where none)."""
        eng = self.engine
        if self._states is None:
            self._states = np.empty(self.n_nodes + 1, dtype=np.int32)
        st = self._states
        st[self._root] = start
        base, parent, cls = self._level_base, self._parent, self._cls
        st[: self.n_nodes] = DEAD
        if start == DEAD:
            return st
        for j in range(len(base) - 1):
            lo, hi = base[j], base[j + 1]
            ps = st[parent[lo:hi]]
            live = np.flatnonzero(ps >= 0)
            if len(live) == 0:
                break  # every deeper node hangs below a dead one
            lps = ps[live]
            lcl = cls[lo:hi][live]
            t = eng.table()
            nxt = t[lps, lcl]
            unknown = nxt == -2
            if unknown.any():
                eng.fill(lps[unknown], lcl[unknown])
                nxt = eng.table()[lps, lcl]
            st[lo + live] = nxt
        return st

    def _compute_mask(self, state: int, partial: Partial) -> npt.NDArray[np.bool_]:
        eng, v = self.engine, self.vocab
        if partial[1] == 0 and not eng.has_token_elements and state != DEAD and self._absorb:
            self._prepare_absorb()
            return self._compute_mask_absorbing(state)
        if partial[1] != 0:  # (the numpy kernel keeps the reference: every continuation token checked)
            mask = (
                self._partial_mask(state, partial)
                if self.kernel == "c"
                else self._partial_mask_by_token(state, partial)
            )
        else:
            st = self._walk_trie(state)
            fin = st[self._term]
            mask = (fin >= 0) & self._usable
            pt = self._partial_tokens
            if len(pt):
                mask[pt] = False
                for t in pt[fin[pt] >= 0].tolist():
                    mask[t] = self._partial_fits(int(fin[t]), (int(v.partial_value[t]), int(v.partial_remain[t])))
            if eng.has_token_elements:
                self._token_tops_into(mask, st, state)
        mask[self._eog_ids] = eng.is_complete(state)
        return mask

    def _partial_mask_by_token(self, state: int, partial: Partial) -> npt.NDArray[np.bool_]:
        """:meth:`_partial_mask`'s reference: every continuation token checked alone."""
        mask = np.zeros(self.n_vocab, dtype=bool)
        for t in self.vocab.continuation_tokens.tolist():
            mask[t] = self._token_allowed(state, partial, t)
        return mask

    def _partial_mask(self, state: int, partial: Partial) -> npt.NDArray[np.bool_]:
        """:meth:`_partial_words` as a boolean mask."""
        words = np.zeros(self.n_words, dtype=np.uint32)
        self._partial_words(state, partial, words)
        return np.unpackbits(words.view(np.uint8), bitorder="little")[: self.n_vocab].astype(bool)

    def _partial_words(self, state: int, partial: Partial, out: npt.NDArray[np.uint32]) -> None:
        """The mask from ``state`` with ``partial`` pending, as words into ``out``
        (``n_words`` of them, overwritten), end-of-generation included. Only continuation
        tokens can be allowed (the vocabulary's :meth:`~VocabIndex.continuation_kinds`
        sorts them once per number of bytes still needed). A token that completes the
        character exactly is allowed iff ``state`` takes the code point; one that ends
        inside it, iff ``state`` can take some completion of the longer partial character;
        one that completes it and goes on, and the few the sorting leaves to the reference,
        are checked token by token (:meth:`_token_allowed`; :meth:`_partial_mask_by_token`
        checks every token so, the reference of the whole mask). The tokens are set word by
        word from lists made once per vocabulary and partial character: no array as long
        as the vocabulary is made."""
        eng = self.engine
        remain = partial[1]
        out[:] = 0
        if state != DEAD and len(self.vocab.continuation_tokens):
            if eng.has_token_elements or remain <= 0:
                _set_tokens(out, np.flatnonzero(self._partial_mask_by_token(state, partial)))
            else:
                self._partial_kinds_into(state, partial, out)
        if eng.is_complete(state):  # (an EOG piece among the continuations is the reference's: the same answer)
            _set_tokens(out, self._eog_ids)

    def _partial_kinds_into(self, state: int, partial: Partial, out: npt.NDArray[np.uint32]) -> None:
        """:meth:`_partial_words` for a live state and a character still needing 1-3 bytes:
        with the C core, one call (``llama_cffi_gengine_partial_mask``) for the exact and
        shorter tokens and the longer ones' first step (a partial character's mask is
        often cold: each numpy call there costs ~3 us); else the same in numpy."""
        eng = self.engine
        remain = partial[1]
        kinds = self.vocab.continuation_kinds(remain)
        args = self._pm_args.get(partial)
        if args is None:  # per partial character: the completions' classes, the longer partials
            low_all, ex_w, _ex_b, _sh_w, _sh_b, ex_wc, ex_bc, sh_wc, sh_bc = self.vocab._continuation_bits(remain)
            value = int(partial[0])
            _, low, taken = kinds.short
            classes = eng._classes_of_cps((value << (6 * remain)) | low_all)
            pchars = (((value << (6 * taken)) | low) << 2) | (remain - taken) if len(low) else low.astype(np.int64)
            c_args: tuple[Any, ...] | None = None
            longer_live = np.zeros(max(len(kinds.longer[0]), 1), dtype=np.uint8)
            if eng.core == "c":

                def buf(kind: str, a: npt.NDArray[Any]) -> Any:
                    return _ffi.from_buffer(kind, a) if len(a) else _ffi.NULL

                c_args = (
                    buf("int32_t[]", classes),
                    len(ex_w),
                    len(classes) - len(ex_w),
                    ex_wc,
                    ex_bc,
                    buf("int64_t[]", pchars),
                    len(pchars),
                    sh_wc,
                    sh_bc,
                    _ffi.from_buffer("uint8_t[]", longer_live),
                )
            if len(self._pm_args) >= 4096:
                self._pm_args.clear()
            args = self._pm_args[partial] = (classes, pchars, c_args, longer_live)
        classes, pchars, c_args, longer_live = args
        n_longer = len(kinds.longer[0])
        if c_args is not None:
            eng._c_partial_mask(state, c_args, _ffi.from_buffer("uint32_t[]", out), len(out))
            if n_longer:
                longer = kinds.longer[0][longer_live[:n_longer] != 0].tolist()
                _set_tokens(out, [t for t in longer if self._token_allowed(state, partial, t)])
        else:
            _low_all, ex_w, ex_b, sh_w, sh_b = self.vocab._continuation_bits(remain)[:5]
            if len(classes):
                to = eng.table()[state, classes]
                if to.min() == -2:  # (-2: not computed yet)
                    eng.fill(np.full(len(classes), state, dtype=np.int32), classes)
                    to = eng.table()[state, classes]
                n_ex = len(ex_w)
                np.bitwise_or.at(out, ex_w, np.where(to[:n_ex] != DEAD, ex_b, np.uint32(0)))
                if n_longer:
                    longer = kinds.longer[0][to[n_ex:] != DEAD].tolist()
                    _set_tokens(out, [t for t in longer if self._token_allowed(state, partial, t)])
            if len(pchars):
                ok = np.array([self._partial_fits(state, (pc >> 2, pc & 3)) for pc in pchars.tolist()], dtype=bool)
                np.bitwise_or.at(out, sh_w[ok], sh_b[ok])
        _set_tokens(out, [t for t in kinds.ref.tolist() if self._token_allowed(state, partial, t)])

    def _partials_into(
        self, mask: npt.NDArray[np.bool_], tokens: npt.NDArray[np.int64], states: npt.NDArray[np.int32]
    ) -> None:
        """Set ``mask[tokens]`` for tokens ending inside a character, each in its state:
        allowed when the state can take some completion of that character."""
        slots = self._pchar_slot[tokens]
        first = int(states[0])
        if len(states) == 1 or not (states != first).any():
            mask[tokens] = self._state_pchar_ok(first)[slots]
            return
        for s_ in set(states.tolist()):
            sel = states == s_
            mask[tokens[sel]] = self._state_pchar_ok(s_)[slots[sel]]

    def _state_pchar_ok(self, state: int) -> npt.NDArray[np.bool_]:
        """Per partial character of the vocabulary: can ``state`` take a completion of it?
        The union of the answers of its stack tops, each computed once per grammar
        position for every partial character at once (cached per state)."""
        ok = self._pchar_ok.get(state)
        if ok is None and self.engine.core == "c":
            ok = self._pchar_ok[state] = self.engine._c_pchar_ok(state, self._pchars)
        if ok is None:
            ok = np.zeros(len(self._pchars), dtype=bool)
            for pos in self.engine.char_tops(state):
                row = self._pos_pchar.get(pos)
                if row is None:
                    row = self._pos_pchar[pos] = self.engine.partial_ok_at(pos, self._pchars >> 2, self._pchars & 3)
                ok |= row
            self._pchar_ok[state] = ok
        return ok

    def _partial_fits(self, state: int, partial: Partial) -> bool:
        key = (state, partial)
        ok = self._partial_ok.get(key)
        if ok is None:
            ok = self._partial_ok[key] = self.engine.partial_ok(state, partial)
        return ok

    def _token_tops_into(self, mask: npt.NDArray[np.bool_], st: npt.NDArray[np.int32], start: int) -> None:
        """Allow tokens matched by a token element on top of a stack reached after any
        prefix of the token with code points still left (llama.cpp's rule)."""
        eng = self.engine
        usable = self._usable
        # at the start of the token: every usable token with at least one code point
        nodes: list[tuple[int, int]] = [(-1, start)]
        for j in range(len(self._level_base) - 1):
            lo, hi = self._level_base[j], self._level_base[j + 1]
            seg = st[lo:hi]
            for k in np.flatnonzero(seg >= 0).tolist():
                if eng.token_tops(int(seg[k])):
                    nodes.append((j, int(self._level_rows[j][k])))
        for level, row_or_state in nodes:
            if level < 0:
                tops = eng.token_tops(row_or_state)
                cand = np.flatnonzero(usable & (self.vocab.lengths > 0))
            else:
                row = row_or_state
                tops = eng.token_tops(
                    int(st[self._level_base[level] + int(np.searchsorted(self._level_rows[level], row))])
                )
                # rows of this node's subtree with code points beyond the node
                end = row + 1
                while end < len(self._lcp) and self._lcp[end] > level:
                    end += 1
                sub = np.arange(row, end)
                sub = sub[self._slen[sub] > level + 1]
                cand = self._order[sub]
            if not tops or len(cand) == 0:
                continue
            hit = np.zeros(len(cand), dtype=bool)
            for typ, tok in tops:
                hit |= (cand == tok) if typ != _TOKEN_NOT else (cand != tok)
            mask[cand[hit]] = True

    # ------------------------------------------------------------------ one token
    def token_allowed(self, state: int, partial: Partial, token: int) -> bool:
        """Whether llama.cpp's grammar sampler would leave ``token`` unmasked."""
        state, token = expect_int("state", state), expect_int("token", token)
        if type(partial) is not tuple or len(partial) != 2:
            raise _bad_partial(partial)
        with self._lock:
            return self._token_allowed(state, partial, token)

    def _tokens_allowed(self, states: list[int], partials: list[Partial], tokens: list[int]) -> list[bool]:
        """:meth:`token_allowed` of many (state, partial, token): where no partial character
        is pending, the transition table's answers in one C call (``TrieGrammar.tokens_allowed``,
        no engine run); what it cannot tell (a transition not computed yet, end-of-generation,
        a token ending inside a character), and every answer of a grammar with token
        elements or the numpy kernel, as :meth:`token_allowed` gives it."""
        n = len(tokens)
        out: list[bool | None] = [None] * n
        with self._lock:
            if self._walks_c:
                idx = [i for i in range(n) if partials[i][1] == 0 and states[i] != DEAD]
                if idx:
                    self._set_tables()
                    got = self._tg.tokens_allowed(
                        np.array([states[i] for i in idx], dtype=np.int32),
                        np.array([tokens[i] for i in idx], dtype=np.int32),
                    )
                    for i, a in zip(idx, got.tolist(), strict=True):
                        if a >= 0:
                            out[i] = a == 1
            return [
                self._token_allowed(states[i], partials[i], tokens[i]) if o is None else o for i, o in enumerate(out)
            ]

    def _token_allowed(self, state: int, partial: Partial, token: int) -> bool:
        v, eng = self.vocab, self.engine
        if v.eog[token]:
            return eng.is_complete(state)
        if v.never[token] or state == DEAD:
            return False
        if partial[1] == 0:
            if v.invalid[token]:
                return False
            cps = v.token_cps(token).tolist()
            end: Partial = (int(v.partial_value[token]), int(v.partial_remain[token]))
        else:
            cps, end = decode_utf8(v.piece(token), partial)
            if end[1] < 0:
                return False
        s = state
        for cp in cps:
            if eng.has_token_elements and self._token_top_hit(s, token):
                return True  # a token element matches by id, whatever code points remain
            s = eng.step(s, eng.class_of(cp))
            if s == DEAD:
                return False
        return self._partial_fits(s, end) if end[1] > 0 else True

    def _token_top_hit(self, state: int, token: int) -> bool:
        for typ, tok in self.engine.token_tops(state):
            if (typ != _TOKEN_NOT) == (tok == token):
                return True
        return False

    def matcher(self) -> GrammarMatcher:
        """A fresh matcher at the grammar's start."""
        from .matcher import GrammarMatcher

        return GrammarMatcher(self)
