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
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from .engine import DEAD, NO_PARTIAL, Engine, Partial, decode_utf8
from .vocab_index import VocabIndex

if TYPE_CHECKING:
    from .matcher import GrammarMatcher

_TOKEN_NOT = 9


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
        mask[v.eog] = eng.is_complete(state)
        return mask

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
