"""A grammar compiled for one vocabulary: token masks by a vectorised walk of a class trie.

llama.cpp decides, for every candidate token, whether the grammar's stacks can consume
the token's code points (``llama_grammar_reject_candidates``): a per-token, per-code-point
walk in C++, ~25-300 ms per full 262,144-token mask. Here:

* every token's code points are mapped to the grammar's character classes (see
  :mod:`samplers.grammar.engine`), and the class sequences of the whole vocabulary
  are arranged as a **trie** (built once per grammar and vocabulary; tokens sharing a
  class prefix share nodes: a token trie over class ids is far smaller than one
  over bytes);
* a mask is one breadth-first sweep of that trie, level by level, in numpy: the
  state of each node is ``table[state of parent, class of node]`` (transitions missing
  from the table are computed once and kept), dead subtrees drop out;
* masks are cached by ``(state, partial UTF-8)``: in JSON and most structured output
  the same parser states recur, and a cached mask is a dictionary lookup.

The result is, token for token, llama.cpp's mask (tested against the native sampler),
quirks included: EOG tokens only when some stack is complete, empty / NUL-first /
invalid-UTF-8 pieces never, a token ending inside a UTF-8 character only when a
character class could still accept its completion, and a token element on top of a
stack matched by id even mid-token (as ``llama_grammar_reject_candidates_for_stack``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import numpy.typing as npt

from .engine import DEAD, NO_PARTIAL, Engine, Partial, decode_utf8
from .vocab_index import VocabIndex

if TYPE_CHECKING:
    from .matcher import GrammarMatcher

_TOKEN_NOT = 9
_ABSORB_MIN_ROWS = 64  # subtrees smaller than this are walked rather than absorbed
_SPINE_MAX = 32768  # at most this many undecided tokens are walked one by one


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


class CompiledGrammar:
    """An :class:`~samplers.grammar.engine.Engine` plus a :class:`VocabIndex` (see the
    module docstring). Shared by all matchers of the grammar on this vocabulary, from
    any threads (a lock guards the walk buffer and the mask cache); make matchers with
    :meth:`matcher`. ``mask_cache_size`` bounds the cached masks (each
    ``n_vocab / 8`` bytes)."""

    def __init__(self, engine: Engine, vocab: VocabIndex, mask_cache_size: int = 4096) -> None:
        self.engine = engine
        self.vocab = vocab
        self.n_vocab = vocab.n_vocab
        self._masks: OrderedDict[tuple[int, Partial], npt.NDArray[np.uint8]] = OrderedDict()
        self._mask_cache_size = mask_cache_size
        self._last: tuple[tuple[int, Partial], npt.NDArray[np.bool_]] | None = None
        self._partial_ok: dict[tuple[int, Partial], bool] = {}
        self.stats = {"mask_hits": 0, "mask_misses": 0}
        self._lock = threading.RLock()  # the walk buffer, the cache and the engine are shared
        #: use the absorbing walk (False: the plain level-by-level walk, for comparison)
        self._absorb = True
        self._build_trie()

    # ------------------------------------------------------------------ trie
    def _build_trie(self) -> None:
        v, eng = self.vocab, self.engine
        n = v.n_vocab
        cls = eng.classes_of(v.cps) + 1  # 1-based so that 0 pads (a prefix sorts first)
        wide = eng.n_classes >= 255
        lengths = v.lengths
        usable = ~v.never & ~v.invalid & ~v.eog
        lmax = int(lengths[usable].max()) if usable.any() else 0
        width = 2 if wide else 1
        mat = np.zeros((n, max(lmax, 1) * width), dtype=np.uint8)
        tok_of_cp = np.repeat(np.arange(n), lengths)
        col = np.arange(len(v.cps)) - v.offsets[tok_of_cp]
        keep = usable[tok_of_cp]
        if wide:
            mat[tok_of_cp[keep], 2 * col[keep]] = cls[keep] >> 8
            mat[tok_of_cp[keep], 2 * col[keep] + 1] = cls[keep] & 0xFF
        else:
            mat[tok_of_cp[keep], col[keep]] = cls[keep]
        lens = np.where(usable, lengths, 0)
        self._tok_mat, self._mat_width = mat, width  # token order: class + 1 per code point, 0 pads
        rows = np.ascontiguousarray(mat).view(f"V{mat.shape[1]}").ravel()
        order = np.argsort(rows, kind="stable")  # lexicographic by class sequence
        smat = mat[order]
        slen = lens[order]
        # longest common prefix (in classes) with the previous row
        lcp = np.zeros(n, dtype=np.int64)
        if n > 1:
            diff = smat[1:] != smat[:-1]
            first = np.where(diff.any(axis=1), diff.argmax(axis=1) // width, lmax)
            lcp[1:] = np.minimum(first, np.minimum(slen[1:], slen[:-1]))
        # nodes, level by level: row i opens a node at level j for lcp[i] <= j < len[i]
        level_rows: list[npt.NDArray[np.int64]] = []
        base = [0]
        parents: list[npt.NDArray[np.int64]] = []
        classes: list[npt.NDArray[np.int32]] = []
        root = -1  # placeholder, fixed below
        for j in range(lmax):
            r = np.flatnonzero((lcp <= j) & (slen > j))
            level_rows.append(r)
            if j == 0:
                par = np.full(len(r), root, dtype=np.int64)
            else:
                prev = level_rows[j - 1]
                par = base[j - 1] + np.searchsorted(prev, r, side="right") - 1
            parents.append(par)
            if wide:
                classes.append((smat[r, 2 * j].astype(np.int32) << 8 | smat[r, 2 * j + 1]) - 1)
            else:
                classes.append(smat[r, j].astype(np.int32) - 1)
            base.append(base[-1] + len(r))
        n_nodes = base[-1]
        self._root = n_nodes
        self._level_base = base
        self._parent = np.concatenate(parents) if parents else np.zeros(0, np.int64)
        self._parent[self._parent == root] = n_nodes
        self._cls = np.concatenate(classes) if classes else np.zeros(0, np.int32)
        self.n_nodes = n_nodes
        # terminal node of each token (in token-id order); tokens with no code point: root
        term_sorted = np.full(n, n_nodes, dtype=np.int64)
        for j in range(lmax):
            ends = np.flatnonzero(slen == j + 1)
            if len(ends):
                term_sorted[ends] = base[j] + np.searchsorted(level_rows[j], ends, side="right") - 1
        self._term = np.empty(n, dtype=np.int64)
        self._term[order] = term_sorted
        self._order = order
        self._level_rows = level_rows
        self._lcp = lcp
        self._slen = slen
        self._usable = usable
        self._partial_tokens = np.flatnonzero(usable & v.has_partial)
        self._states = np.empty(n_nodes + 1, dtype=np.int32)
        self._prepare_absorb(term_sorted)

    # ------------------------------------------------------------------ absorbing walk
    def _prepare_absorb(self, term_sorted: npt.NDArray[np.int64]) -> None:
        """Per-node sets of character classes, for a walk that skips whole subtrees.

        Classes are bits of ``W`` uint64 words; bit ``n_classes`` (``PARTIAL``) stands for
        "a token ending inside a UTF-8 character", which no state's self-loops contain.
        ``_E[n]``: the classes of every character below node ``n``, plus ``PARTIAL`` when a
        token ending mid-character ends at or below ``n``. A node reached in a state whose
        self-loops include ``_E[n]`` accepts its whole subtree without walking it. ``_tokset[t]``:
        the classes of token ``t`` (plus ``PARTIAL``): with the self-loops ``L`` of the
        start state, the tokens with ``tokset <= L`` are accepted at once (one cached mask
        per ``L``). Also: children ranges, each node's rows in sorted order (its subtree is
        rows ``[_row_start, _row_end)``, the tokens ending at it the first ``_n_term``).
        """
        v = self.vocab
        n_nodes, base, parent, cls = self.n_nodes, self._level_base, self._parent, self._cls
        n_levels = len(base) - 1
        self._partial_bit = pb = self.engine.n_classes
        self._W = w = pb // 64 + 1
        # one-hot class bits per node (the root: none)
        bits = np.zeros((n_nodes + 1, w), dtype=np.uint64)
        bits[np.arange(n_nodes), cls // 64] = np.left_shift(np.uint64(1), (cls % 64).astype(np.uint64))
        # nodes where a token ending mid-character ends (its complete code points' node)
        pt_tokens = self._partial_tokens
        pt_nodes = self._term[pt_tokens]
        ptflag = np.zeros((n_nodes + 1, w), dtype=np.uint64)
        ptflag[pt_nodes, pb // 64] = np.uint64(1) << np.uint64(pb % 64)
        below = np.zeros((n_nodes + 1, w), dtype=np.uint64)
        first_child = np.zeros(n_nodes + 1, dtype=np.int64)
        n_child = np.zeros(n_nodes + 1, dtype=np.int64)
        for j in range(n_levels - 1, -1, -1):
            lo, hi = base[j], base[j + 1]
            if hi == lo:
                continue
            par = parent[lo:hi]
            contrib = bits[lo:hi] | below[lo:hi] | ptflag[lo:hi]
            starts = np.flatnonzero(np.r_[True, par[1:] != par[:-1]])
            ups = par[starts]
            below[ups] = np.bitwise_or.reduceat(contrib, starts, axis=0)
            first_child[ups] = lo + starts
            n_child[ups] = np.diff(np.r_[starts, hi - lo])
        self._E = below | ptflag
        self._first_child, self._n_child = first_child, n_child
        prefix = np.zeros((n_nodes + 1, w), dtype=np.uint64)
        for j in range(n_levels):
            lo, hi = base[j], base[j + 1]
            prefix[lo:hi] = prefix[parent[lo:hi]] | bits[lo:hi]
        tokset = prefix[self._term]
        tokset[pt_tokens, pb // 64] |= np.uint64(1) << np.uint64(pb % 64)
        self._tokset = tokset
        # rows: a node's first row, the end of its subtree, how many rows end at it
        n_rows = len(self._order)
        row_start = np.empty(n_nodes + 1, dtype=np.int64)
        row_end = np.empty(n_nodes + 1, dtype=np.int64)
        row_start[n_nodes], row_end[n_nodes] = 0, n_rows
        for j in range(n_levels):
            lo, hi = base[j], base[j + 1]
            rows = self._level_rows[j]
            row_start[lo:hi] = rows
            cut = np.flatnonzero(self._lcp <= j)  # rows that leave a level-j subtree
            nxt = np.searchsorted(cut, rows, side="right")
            row_end[lo:hi] = np.where(nxt < len(cut), cut[np.minimum(nxt, len(cut) - 1)], n_rows)
        self._row_start, self._row_end = row_start, row_end
        self._n_term = np.bincount(term_sorted, minlength=n_nodes + 1)
        self._n_term[n_nodes] = 0  # root-ending tokens (no complete code point) are handled apart
        # partial tokens by node
        self._has_pt = np.zeros(n_nodes + 1, dtype=bool)
        self._has_pt[pt_nodes] = True
        by_node: dict[int, list[int]] = {}
        for t, node in zip(pt_tokens.tolist(), pt_nodes.tolist(), strict=True):
            by_node.setdefault(node, []).append(t)
        self._pt_at: dict[int, npt.NDArray[np.int64]] = {k: np.array(x, dtype=np.int64) for k, x in by_node.items()}
        # partial tokens by their partial character: one check per (state, character)
        keys = v.partial_value[pt_tokens] * 4 + v.partial_remain[pt_tokens]
        self._pchars, self._pchar_of = np.unique(keys, return_inverse=True)  # per partial token
        self._pchar_slot = np.full(v.n_vocab, -1, dtype=np.int64)
        self._pchar_slot[pt_tokens] = self._pchar_of
        self._pchar_ok: dict[int, npt.NDArray[np.bool_]] = {}
        self._loops: dict[int, npt.NDArray[np.uint64]] = {}
        self._spines: dict[bytes, _Spine | None] = {}
        self._lmasks: dict[bytes, npt.NDArray[np.bool_]] = {}
        self._nonpartial = ~v.has_partial
        self._eog_ids = np.flatnonzero(v.eog)

    def _self_loops(self, state: int) -> npt.NDArray[np.uint64]:
        """The classes ``c`` with ``step(state, c) == state``, as ``W`` words (cached)."""
        got = self._loops.get(state)
        if got is None:
            eng = self.engine
            n = eng.n_classes
            eng.fill(np.full(n, state, dtype=np.int32), np.arange(n, dtype=np.int32))
            same = np.zeros(self._W * 64, dtype=bool)
            same[:n] = eng.table()[state, :n] == state
            got = self._loops[state] = np.packbits(same, bitorder="little").view(np.uint64).copy()
        return got

    def _lmask(self, loops: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
        """Usable tokens whose every character is in ``loops`` (and that end on a whole
        character): from a state with those self-loops they are accepted (cached)."""
        key = loops.tobytes()
        got = self._lmasks.get(key)
        if got is None:
            outside = self._tokset & ~loops
            got = ~outside.any(axis=1) & self._usable
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
            mat = self._tok_mat[toks]
            if self._mat_width == 2:
                cls1 = (mat[:, 0::2].astype(np.int32) << 8) | mat[:, 1::2]
            else:
                cls1 = mat.astype(np.int32)
            cls = cls1 - 1  # -1 pads
            lengths = self.vocab.lengths[toks]
            n_cls = self.engine.n_classes
            in_loop = np.zeros(n_cls + 1, dtype=bool)  # index -1 (padding) counts as in the loop
            in_loop[:n_cls] = np.unpackbits(loops.view(np.uint8), bitorder="little")[:n_cls].astype(bool)
            in_loop[n_cls] = True
            inl = in_loop[cls]
            first = np.where(inl.all(axis=1), lengths, (~inl).argmax(axis=1))  # first class off the loops
            rem = lengths - first
            order = np.argsort(-rem, kind="stable")
            toks, first, rem = toks[order], first[order], rem[order]
            width = max(int(rem.max()) if len(rem) else 0, 1)
            cols = first[:, None] + np.arange(width)[None, :]
            valid = np.arange(width)[None, :] < rem[:, None]
            rcls = np.where(valid, np.take_along_axis(cls[order], np.minimum(cols, cls.shape[1] - 1), axis=1), 0)
            # last remainder position off the loops: past it, a token back in the start
            # state is accepted (the rest loops)
            off = valid & ~in_loop[np.where(valid, rcls, n_cls)]
            last_off = np.where(off.any(axis=1), width - 1 - off[:, ::-1].argmax(axis=1), -1)
            partial = self.vocab.has_partial[toks]
            n_empty = int(np.count_nonzero(rem == 0))  # last in the order: partial tokens
            spine = _Spine(
                tokens=toks,
                columns=np.ascontiguousarray(rcls.T, dtype=np.int32),
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
        cls_all, E, first_child, n_child = self._cls, self._E, self._first_child, self._n_child
        root = self.n_nodes
        lo, cnt = int(first_child[root]), int(n_child[root])
        nodes = np.arange(lo, lo + cnt, dtype=np.int64)
        ps = np.full(cnt, start, dtype=np.int32)
        all_l = np.ones(cnt, dtype=bool)
        spans: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = []  # row ranges accepted
        partial_at: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]] = []
        not_l0 = ~loops0
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
            # still on a path of the start state's self-loops?
            in_l = ((loops0[c // 64] >> (c % 64).astype(np.uint64)) & np.uint64(1)).astype(bool)
            all_l &= in_l
            covered = ~(e & not_l0).any(axis=1)
            go = ~(all_l & covered)  # an all-self-loop subtree is in the start mask already
            off = ~all_l
            if off.any():
                # off the start state's loops: absorb subtrees whose state loops over them
                idx = np.flatnonzero(off)
                st_off = nxt[idx]
                absorbed = np.zeros(len(idx), dtype=bool)
                for s_ in np.unique(st_off).tolist():
                    sel = st_off == s_
                    lp = self._loops.get(s_)
                    if lp is None:
                        # a state's self-loops cost a full row of transitions: only worth it
                        # for a large subtree (a small one is walked as cheaply)
                        sn = nodes[idx[sel]]
                        if int((self._row_end[sn] - self._row_start[sn]).sum()) < _ABSORB_MIN_ROWS:
                            continue
                        lp = self._self_loops(int(s_))
                    if lp.any():
                        absorbed[sel] = ~(e[idx[sel]] & ~lp).any(axis=1)
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
            nodes, nxt, all_l = nodes[go], nxt[go], all_l[go]
            counts = n_child[nodes]
            has = counts > 0
            if not has.all():
                nodes, nxt, all_l, counts = nodes[has], nxt[has], all_l[has], counts[has]
            if not len(nodes):
                break
            total = int(counts.sum())
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
        key = (state, partial)
        last = self._last
        if last is not None and last[0] == key:
            self.stats["mask_hits"] += 1
            return last[1]
        with self._lock:
            return self._allowed_locked(key)

    def _allowed_locked(self, key: tuple[int, Partial]) -> npt.NDArray[np.bool_]:
        state, partial = key
        packed = self._masks.get(key)
        if packed is not None:
            self._masks.move_to_end(key)
            self.stats["mask_hits"] += 1
            mask = np.unpackbits(packed, count=self.n_vocab, bitorder="little").view(np.bool_)
        else:
            self.stats["mask_misses"] += 1
            mask = self._compute_mask(state, partial)
            self._masks[key] = np.packbits(mask, bitorder="little")
            if len(self._masks) > self._mask_cache_size:
                self._masks.popitem(last=False)
        mask.flags.writeable = False
        self._last = (key, mask)
        return mask

    def packed(self, state: int, partial: Partial = NO_PARTIAL) -> npt.NDArray[np.uint8]:
        """The mask packed 8 tokens per byte, little bit order (bit ``t % 8`` of byte
        ``t // 8``); viewed as ``uint32`` on a little-endian machine, bit ``t % 32`` of
        word ``t // 32`` (the layout of xgrammar and llguidance bitmasks)."""
        with self._lock:
            self.allowed(state, partial)
            return self._masks[(state, partial)]

    def _walk_trie(self, start: int) -> npt.NDArray[np.int32]:
        """The state reached at every trie node from ``start`` (``DEAD`` where none)."""
        eng = self.engine
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
            return self._compute_mask_absorbing(state)
        if partial[1] != 0:
            mask = np.zeros(self.n_vocab, dtype=bool)
            for t in v.continuation_tokens.tolist():
                mask[t] = self._token_allowed(state, partial, t)
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

    def _partials_into(
        self, mask: npt.NDArray[np.bool_], tokens: npt.NDArray[np.int64], states: npt.NDArray[np.int32]
    ) -> None:
        """Set ``mask[tokens]`` for tokens ending inside a character, each in its state:
        allowed when the state can take some completion of that character."""
        slots = self._pchar_slot[tokens]
        for s_ in np.unique(states).tolist():
            ok = self._pchar_ok.get(s_)
            if ok is None:
                ok = np.array(
                    [self._partial_fits(s_, (int(k) >> 2, int(k) & 3)) for k in self._pchars.tolist()], dtype=bool
                )
                self._pchar_ok[s_] = ok
            sel = states == s_
            mask[tokens[sel]] = ok[slots[sel]]

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
        with self._lock:
            return self._token_allowed(state, partial, token)

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
            cps, end = decode_utf8(v.pieces[token], partial)
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
