"""A vocabulary as the grammar sees it: each token's code points, and a trie over them.

llama.cpp's grammar sampler matches ``llama_vocab::token_to_piece(id)`` (the piece with
special tokens rendered as text) decoded with its own UTF-8 decoder. This index holds
those pieces (one bytes blob), the code points each decodes to from a clean start (flat
array plus offsets), the partial UTF-8 sequence it ends with, the token flags that decide
masking before any matching (end-of-generation; empty or NUL-first pieces and invalid
UTF-8, always masked), and a **trie of the usable tokens' code-point sequences**: tokens
sorted by their code points, each trie node a distinct prefix, arranged level by level.
None of it depends on a grammar: a grammar maps each distinct code point to its
character class and walks this trie (:mod:`samplers.grammar.compiled`).

Building it takes about half a second for 262,144 tokens; it is cached for the
vocabulary's lifetime and **on disk** (``<cache_dir>/grammar-vocab/<hash>.vocab``, the
hash of the pieces and end-of-generation flags): one file of raw arrays behind a small
JSON header, memory-mapped, so a new process takes the arrays without reading or
copying them (milliseconds; the pages are read as the walks touch them), with the trie
also packed one record per node, as the C walks read it. A corrupt or
foreign cache file is rebuilt, never trusted blindly: the header is checked against the
file's size, and the arrays against the pieces, before use.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import mmap
import os
import tempfile
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from llama_cffi._args import expect_bool, expect_int, expect_iterable, type_error

from .engine import NO_PARTIAL, decode_utf8

I64 = npt.NDArray[np.int64]

#: Bump when the arrays or how they are built change: old cache files are then ignored.
_FORMAT = 8
_MAGIC = b"LLAMA_CFFI_VOCAB\n"
_ALIGN = 64

#: The arrays saved to (and loaded from) the disk cache, besides the pieces: name -> dtype,
#: the same on disk and in memory (a loaded index uses the file's pages as they are).
_SAVED: dict[str, str] = {
    "eog": "bool",
    "never": "bool",
    "invalid": "bool",
    "offsets": "<i4",
    "lengths": "<i4",
    "cps": "<i4",
    "partial_value": "<i4",
    "partial_remain": "<i1",
    "uniq_cps": "<i4",
    "cp_idx": "<i4",
    "order": "<i4",
    "lcp": "<i2",
    "slen": "<i2",
    "level_base": "<i8",
    "parent": "<i4",
    "node_cpi": "<i4",
    "term": "<i4",
    "row_start": "<i4",
    "row_end": "<i4",
    "n_term": "<i4",
    "first_child": "<i4",
    "n_child": "<i4",
    "height": "<i4",
    "below_asc": "<u8",
    "below_flags": "u1",
    "cp_nodes": "<i4",
}

#: The trie's node arrays as the C walks read them (``llama_cffi._trie_walk.Trie.packed_arrays``:
#: one record per node, and per row its token and slot), kept in the cache file when the
#: trie was made before it was written: name -> dtype.
_PACKED: dict[str, str] = {"trie_nodes": "u1", "trie_row_tok": "<i4"}

#: Code-point sets whose full-length run scans (see ``llama_cffi._trie_walk.SharedScan``)
#: are made when an index is built and kept in its cache file, so that a grammar's first
#: string in a new process does not scan the vocabulary (0.4-0.9 ms at 262,144 tokens):
#: JSON string content as our converter writes it, and as llama.cpp's grammars write it
#: (``json.gbnf``, ``json-schema-to-grammar``); then the classes most common in the
#: patterns and formats of JSONSchemaBench's 10,162 schemas as converted (letters, digits,
#: identifiers, slugs, hexadecimal; a URI's scheme and characters, an e-mail's local part),
#: whose first scan in a process cost a mask 0.4-1.3 ms (a bounded key pattern's first
#: positions in the peers benchmark's ``config``: 1.5 and 1.3 ms, 0.7 and 0.2 with them);
#: and a JSON integer's digits.
#: Each costs ~1 ms when the index is built and ~0.5 MB of the file. Part of the cache
#: file's key.
_PRESCANNED: tuple[str, ...] = (
    "[ !#-\\[\\]-\\uD7FF\\uE000-\\U0010FFFF]",
    '[^"\\\\\\x7F\\x00-\\x1F]',
    "[a-z]",
    "[A-Z]",
    "[A-Za-z]",
    "[0-9a-z]",
    "[0-9A-Za-z]",
    "[0-9A-Z_a-z]",
    "[A-Z_a-z]",
    "[0-9a-z-]",
    "[0-9a-z.-]",
    "[0-9A-Za-z-]",
    "[0-9A-Za-z_-]",
    "[0-9A-Za-z._-]",
    "[0-9a-f]",
    "[0-9A-Fa-f]",
    "[a-zA-Z0-9+.-]",
    "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]",
    "[a-zA-Z0-9._~!$&'()*+,;=:@/?\\[\\]-]",
    # a JSON integer's digits as the converter writes them ([1-9] [0-9]{0,15}): small
    # scans, but each kept its paths, a byte per trie node to clear (0.2-0.25 ms each)
    "[1-9]",
    "[0-9]",
    # the raw characters of a pattern's "\\S" or "[^\\s]" (108 of JSONSchemaBench's
    # patterns): its scan was extended from a smaller prescan's in 1.7-2.2 ms at its first
    # string (Github_medium o79423's "^[^\\s]+$": a 2.6 ms mask). (A pattern's "." is the
    # first class here less U+2028 and U+2029, which Gemma 3's vocabulary does not hold:
    # the same code points of the trie, the same scan.)
    "[!#-\\[\\]-\\x9F\\xA1-\\u167F\\u1681-\\u1FFF\\u200B-\\u2027\\u202A-\\u202E\\u2030-\\u205E\\u2060-\\u2FFF"
    "\\u3001-\\uD7FF\\uE000-\\uFEFE\\uFF00-\\U0010FFFF]",
    # words of letters and spaces, and a URL's path in the URL pattern copied across the web
    # ("^(https?:\\/\\/)?([\\da-z\\.-]+)\\.([a-z\\.]{2,6})([\\/\\w \\.-]*)*\\/?$"): the only two
    # classes of the 200-schema draw whose first scan in a process, extended from a smaller
    # prescan's across the space before a word, still cost 0.8-1.2 ms (WashingtonPost wp_76,
    # Github_medium o82337, Github_hard o82974)
    "[ a-z]",
    "[ ./0-9A-Z_a-z-]",
)
#: A prescanned scan's arrays in the cache file (``prescan<i>_<field>``): field -> dtype.
_PRESCAN_FIELDS: dict[str, str] = {
    "key": "u1",
    "mask": "<u4",
    "nodes": "<i4",
    "depths": "<i4",
    "pt_tokens": "<i4",
    "pt_depth": "<i4",
    "on": "u1",
    "absorbed": "<i4",
}
#: Run scans a vocabulary keeps for its grammars to share (least recently used dropped;
#: the prescanned ones besides): each a mask (n_vocab / 8 bytes) and, with its paths, a
#: byte per trie node.
_SHARED_SCANS = 32


_TokenBits = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]


class ContinuationKinds(NamedTuple):
    """Continuation tokens for a character that still needs a given number of bytes
    (:meth:`VocabIndex.continuation_kinds`): each kind as (tokens, the low six bits of the
    bytes they give the character, how many bytes that is)."""

    exact: _TokenBits  #: complete the character and end there
    longer: _TokenBits  #: complete it and go on
    short: _TokenBits  #: end inside it
    ref: npt.NDArray[np.int64]  #: checked alone by the reference (EOG pieces, a NUL byte)


class VocabIndex:
    """See the module docstring. Make one with :meth:`of` (cached) or from a sequence of
    byte pieces (``VocabIndex(pieces, eog)``). Immutable once built; shared by every
    grammar compiled for the vocabulary.

    Trie layout: ``n_nodes`` nodes numbered level by level (level ``j`` holds the nodes
    at depth ``j + 1``: nodes ``level_base[j] .. level_base[j + 1]``), the root is node
    ``n_nodes``. ``parent[node]``; ``node_cpi[node]`` indexes ``uniq_cps`` (the node's
    code point); ``term[t]`` the node where token ``t``'s code points end (the root when
    it has none, or is not usable). In the sorted order ``order`` (row ``r`` is token
    ``order[r]``), a node's subtree is rows ``row_start .. row_end``, of which the first
    ``n_term`` end at the node; its children are nodes ``first_child .. first_child +
    n_child``. ``lcp[r]``/``slen[r]``: common prefix with row ``r - 1`` and length, in
    code points.
    """

    def __init__(
        self,
        pieces: Sequence[bytes] | tuple[bytes, npt.ArrayLike],
        eog: Iterable[int] | npt.NDArray[np.bool_] = (),
        *,
        arrays: dict[str, npt.NDArray[Any]] | None = None,
    ) -> None:
        if not isinstance(eog, np.ndarray):
            expect_iterable("eog", eog, "an iterable of token ids or a boolean array")
        if arrays is not None and not isinstance(arrays, dict):
            raise type_error("arrays", "a dict of arrays (a cache file's) or None", arrays)
        if isinstance(pieces, tuple) and len(pieces) == 2 and isinstance(pieces[0], bytes):
            self.blob: bytes = pieces[0]
            self.piece_offsets: I64 = np.asarray(pieces[1], dtype=np.int64)
        else:
            expect_iterable("pieces", pieces, "a sequence of bytes (one per token)")
            try:
                plist = [bytes(p) for p in pieces]
            except TypeError:
                raise type_error("pieces", "a sequence of bytes (one per token)", pieces) from None
            self.blob = b"".join(plist)
            self.piece_offsets = np.zeros(len(plist) + 1, dtype=np.int64)
            np.cumsum([len(p) for p in plist], out=self.piece_offsets[1:])
        n = len(self.piece_offsets) - 1
        self.n_vocab = n
        eog_flags = np.zeros(n, dtype=bool)
        if isinstance(eog, np.ndarray) and eog.dtype == np.bool_:
            eog_flags[: len(eog)] = eog[:n]
        else:
            for t in eog:
                if 0 <= t < n:
                    eog_flags[t] = True
        self._pieces: list[bytes] | None = None
        self._first_cp_tokens: npt.NDArray[np.float64] | None = None  # see first_cp_tokens
        #: the trie's packed arrays (a cache file's, or the trie's once made), or None
        self._packed: tuple[npt.NDArray[Any], npt.NDArray[Any]] | None = None
        #: whether the arrays came from a cache file (checked) rather than a build
        self.from_cache = arrays is not None and self._adopt(arrays, eog_flags)
        if not self.from_cache:
            self._build(eog_flags)
        self._derive()
        self._scan_lock = threading.Lock()
        self._scans: OrderedDict[bytes, Any] = OrderedDict()  # shared run scans, by code points
        self._prescans: dict[bytes, Any] = {}  # the prescanned ones (never dropped)
        self._prescan_arrays: dict[str, npt.NDArray[Any]] = {}  # and their arrays, as saved
        if self.from_cache and arrays is not None:
            self._adopt_prescans(arrays)
            nodes, rows = (arrays.get(k) for k in _PACKED)
            if nodes is not None and rows is not None:  # (their sizes are checked by the trie: else packed again)
                self._packed = (nodes, rows)

    # ------------------------------------------------------------------ pieces
    def piece(self, token: int) -> bytes:
        """Token ``token``'s bytes (as ``token_to_piece(token, special=True)``)."""
        token = expect_int("token", token)
        off = self.piece_offsets
        return self.blob[off[token] : off[token + 1]]

    @property
    def pieces(self) -> list[bytes]:
        """Every token's bytes (a list, made on first use)."""
        if self._pieces is None:
            blob, off = self.blob, self.piece_offsets.tolist()
            self._pieces = [blob[a:b] for a, b in itertools.pairwise(off)]
        return self._pieces

    def token_cps(self, token: int) -> I64:
        """Token ``token``'s code points (from a clean start; those of a partial character
        at its end left out)."""
        token = expect_int("token", token)
        return self.cps[self.offsets[token] : self.offsets[token + 1]]

    def continuation_kinds(self, remain: int) -> ContinuationKinds:
        """The vocabulary's continuation tokens sorted for a character that still needs
        ``remain`` bytes (1-3; made with the index): those that complete it exactly, those
        that complete it and go on, those that end inside it, and those left to the
        grammar's token-by-token check (EOG pieces, a NUL byte in the piece: decoding stops
        there); the others (a byte that is not a continuation byte where the character
        needs one, or a token that is never allowed) are refused. Per token, the low six
        bits of the bytes it gives the character, in order, and how many bytes that is."""
        if type(remain) is not int:
            remain = expect_int("remain", remain)
        if not 1 <= remain <= 3:
            raise ValueError(f"remain must be 1, 2 or 3 (bytes a UTF-8 character still needs), not {remain}")
        return self._cont_kinds[remain - 1]

    def _continuation_bits(self, remain: int) -> tuple[Any, ...]:
        """For :meth:`continuation_kinds` ``(remain)`` (made on first use): the low bits of
        the exact completions then of the longer ones (``exact[1]``, ``longer[1]``); the
        mask word (``int32``) and bit (``uint32``) of each exact token, then of each token
        that ends inside the character (``short[0]``); and those four arrays as cffi
        buffers (NULL when empty), for ``llama_cffi_gengine_partial_mask``."""
        got = self._cont_bits[remain - 1]
        if got is None:
            from llama_cffi._binding import ffi

            kinds = self.continuation_kinds(remain)
            ex, sh = kinds.exact[0], kinds.short[0]
            arrays = (
                (ex >> 5).astype(np.int32),
                np.left_shift(np.uint32(1), (ex & 31).astype(np.uint32)),
                (sh >> 5).astype(np.int32),
                np.left_shift(np.uint32(1), (sh & 31).astype(np.uint32)),
            )
            kinds_c = ("int32_t[]", "uint32_t[]", "int32_t[]", "uint32_t[]")
            got = self._cont_bits[remain - 1] = (
                np.concatenate((kinds.exact[1], kinds.longer[1])),
                *arrays,
                *(ffi.from_buffer(k, a) if len(a) else ffi.NULL for k, a in zip(kinds_c, arrays, strict=True)),
            )
        return got

    @property
    def first_cp_tokens(self) -> npt.NDArray[np.float64]:
        """Per code point of ``uniq_cps``: how many usable tokens start with it (made on
        first use; a grammar sums them per class)."""
        got: npt.NDArray[np.float64] | None = self._first_cp_tokens
        if got is None:  # the root's children (level 0 of the trie): the rows below each
            lo, hi = int(self.level_base[0]), int(self.level_base[1])
            rows = self.row_end[lo:hi].astype(np.int64) - self.row_start[lo:hi]
            got = np.bincount(self.node_cpi[lo:hi], weights=rows, minlength=len(self.uniq_cps)).astype(np.float64)
            self._first_cp_tokens = got
        return got

    def _sort_continuations(self) -> list[ContinuationKinds]:
        """:meth:`continuation_kinds` for 1, 2 and 3 bytes still needed (vectorised)."""
        ct = self.continuation_tokens.astype(np.int64)
        po = self.piece_offsets
        start, length = po[ct], po[ct + 1] - po[ct]
        blob = np.frombuffer(self.blob, dtype=np.uint8)
        # (a NUL byte in the piece: a search of these pieces alone, not a pass over the blob)
        raw = self.blob
        nul = np.fromiter(
            (raw.find(b"\0", a, b) >= 0 for a, b in zip(start.tolist(), (start + length).tolist(), strict=True)),
            dtype=bool,
            count=len(ct),
        )
        ref = self.eog[ct] | nul
        out = []
        for remain in (1, 2, 3):
            taken = np.minimum(length, remain)
            low = np.zeros(len(ct), dtype=np.int64)
            cont = ~ref & ~self.never[ct]
            for j in range(remain):
                inside = j < taken
                b = blob[np.where(inside, start + j, 0)].astype(np.int64) if len(blob) else low
                cont &= ~inside | (b >> 6 == 2)
                low = np.where(inside, (low << 6) | (b & 0x3F), low)

            def kind(sel: npt.NDArray[np.bool_], low: I64 = low, taken: I64 = taken) -> _TokenBits:
                return ct[sel], low[sel], taken[sel]

            out.append(
                ContinuationKinds(
                    kind(cont & (length == remain)),
                    kind(cont & (length > remain)),
                    kind(cont & (length < remain)),
                    ct[ref],
                )
            )
        return out

    # ------------------------------------------------------------------ building
    def _build(self, eog: npt.NDArray[np.bool_]) -> None:
        n = self.n_vocab
        self.eog = eog
        lengths = np.zeros(n, dtype=np.int64)
        flat: list[int] = []
        partial_value = np.zeros(n, dtype=np.int64)
        partial_remain = np.zeros(n, dtype=np.int64)
        #: masked whatever the grammar: empty piece, first byte NUL
        never = np.zeros(n, dtype=bool)
        #: invalid UTF-8 when decoded from a clean start (masked unless a partial character
        #: is pending that its leading continuation bytes complete)
        invalid = np.zeros(n, dtype=bool)
        blob, off = self.blob, self.piece_offsets.tolist()
        for t in range(n):
            piece = blob[off[t] : off[t + 1]]
            if not piece or piece[0] == 0:
                never[t] = True
                continue
            cps, (value, remain) = decode_utf8(piece, NO_PARTIAL)
            if remain < 0:
                invalid[t] = True
                continue
            flat.extend(cps)
            lengths[t] = len(cps)
            partial_value[t] = value
            partial_remain[t] = remain
        never &= ~eog  # EOG tokens are decided by the grammar's completeness alone
        self.never, self.invalid = never, invalid
        self.offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])
        self.lengths = lengths
        self.cps = np.asarray(flat, dtype=np.int64)
        self.partial_value, self.partial_remain = partial_value, partial_remain
        self._build_trie()

    def _build_trie(self) -> None:
        """The code-point trie of the usable tokens (see the class docstring)."""
        n = self.n_vocab
        usable = ~self.never & ~self.invalid & ~self.eog
        uniq, cp_idx = np.unique(self.cps, return_inverse=True)
        self.uniq_cps = uniq.astype(np.int64)
        self.cp_idx = cp_idx.astype(np.int32).ravel()
        lengths = self.lengths
        lmax = int(lengths[usable].max()) if usable.any() else 0
        sym = self.cp_idx.astype(np.uint32) + 1  # 0 pads: a prefix sorts first
        width = 2 if len(uniq) < 0xFFFF else 4
        dt = np.dtype(">u2") if width == 2 else np.dtype(">u4")  # big-endian: bytes sort as numbers
        mat = np.zeros((n, max(lmax, 1)), dtype=dt)
        tok_of_cp = np.repeat(np.arange(n), lengths)
        col = np.arange(len(self.cps)) - self.offsets[tok_of_cp]
        keep = usable[tok_of_cp]
        mat[tok_of_cp[keep], col[keep]] = sym[keep]
        slen_tok = np.where(usable, lengths, 0)
        rows = np.ascontiguousarray(mat).view(f"V{mat.shape[1] * width}").ravel()
        order = np.argsort(rows, kind="stable")  # lexicographic by code points
        smat = mat[order]
        slen = slen_tok[order]
        lcp = np.zeros(n, dtype=np.int64)
        if n > 1:
            diff = smat[1:] != smat[:-1]
            first = np.where(diff.any(axis=1), diff.argmax(axis=1), lmax)
            lcp[1:] = np.minimum(first, np.minimum(slen[1:], slen[:-1]))
        # nodes, level by level: row r opens a node at level j for lcp[r] <= j < slen[r]
        level_rows: list[I64] = []
        base = [0]
        parents: list[I64] = []
        cpis: list[npt.NDArray[np.int32]] = []
        for j in range(lmax):
            r = np.flatnonzero((lcp <= j) & (slen > j))
            level_rows.append(r)
            if j == 0:
                par = np.full(len(r), -1, dtype=np.int64)
            else:
                par = base[j - 1] + np.searchsorted(level_rows[j - 1], r, side="right") - 1
            parents.append(par)
            cpis.append(smat[r, j].astype(np.int32) - 1)
            base.append(base[-1] + len(r))
        n_nodes = base[-1]
        parent = np.concatenate(parents) if parents else np.zeros(0, np.int64)
        parent[parent < 0] = n_nodes
        term_sorted = np.full(n, n_nodes, dtype=np.int64)
        for j in range(lmax):
            ends = np.flatnonzero(slen == j + 1)
            if len(ends):
                term_sorted[ends] = base[j] + np.searchsorted(level_rows[j], ends, side="right") - 1
        term = np.empty(n, dtype=np.int64)
        term[order] = term_sorted
        row_start = np.zeros(n_nodes + 1, dtype=np.int64)
        row_end = np.full(n_nodes + 1, n, dtype=np.int64)
        for j in range(lmax):
            lo, hi = base[j], base[j + 1]
            r = level_rows[j]
            row_start[lo:hi] = r
            cut = np.flatnonzero(lcp <= j)  # rows that leave a level-j subtree
            nxt = np.searchsorted(cut, r, side="right")
            row_end[lo:hi] = np.where(nxt < len(cut), cut[np.minimum(nxt, len(cut) - 1)], n)
        n_term = np.bincount(term_sorted, minlength=n_nodes + 1).astype(np.int64)
        n_term[n_nodes] = 0
        first_child = np.zeros(n_nodes + 1, dtype=np.int64)
        n_child = np.zeros(n_nodes + 1, dtype=np.int64)
        for j in range(lmax):
            lo, hi = base[j], base[j + 1]
            par = parent[lo:hi]
            starts = np.flatnonzero(np.r_[True, par[1:] != par[:-1]])
            ups = par[starts]
            first_child[ups] = lo + starts
            n_child[ups] = np.diff(np.r_[starts, hi - lo])
        self.order, self.lcp, self.slen = order.astype(np.int64), lcp, slen.astype(np.int64)
        self.level_base = np.asarray(base, dtype=np.int64)
        self.parent = parent
        self.node_cpi = np.concatenate(cpis) if cpis else np.zeros(0, np.int32)
        self.term = term
        self.row_start, self.row_end, self.n_term = row_start, row_end, n_term
        self.first_child, self.n_child = first_child, n_child
        # the most code points below each node, level by level from the deepest
        height = np.zeros(n_nodes + 1, dtype=np.int64)
        for j in range(lmax - 1, -1, -1):
            lo, hi = base[j], base[j + 1]
            if hi == lo:
                continue
            par = parent[lo:hi]
            starts = np.flatnonzero(np.r_[True, par[1:] != par[:-1]])
            height[par[starts]] = np.maximum(height[par[starts]], np.maximum.reduceat(height[lo:hi] + 1, starts))
        self.height = height
        # per node, the ASCII code points below it and flags (see llama_cffi._trie_walk.below_summary)
        from llama_cffi._trie_walk import below_summary

        has_pt = _has_pt(term, np.flatnonzero(usable & (self.partial_remain > 0)), n_nodes)
        node_cpi = self.node_cpi.astype(np.int64)
        self.below_asc, self.below_flags = below_summary(base, parent, self.uniq_cps[node_cpi], has_pt)
        self.cp_nodes = np.bincount(node_cpi, minlength=len(self.uniq_cps))  # the nodes of each code point
        for name, saved in _SAVED.items():  # the cache file's dtypes: a loaded index has the same
            setattr(self, name, np.ascontiguousarray(getattr(self, name), dtype=saved))

    def _adopt(self, arrays: dict[str, npt.NDArray[Any]], eog: npt.NDArray[np.bool_]) -> bool:
        """Take the arrays of a cache file if they fit these pieces; False otherwise."""
        try:
            got = {k: np.asarray(arrays[k]) for k in _SAVED}
        except KeyError:
            return False
        n = self.n_vocab
        ok = (
            got["eog"].shape == (n,)
            and bool((got["eog"] == eog).all())
            and got["offsets"].shape == (n + 1,)
            and got["order"].shape == (n,)
            and got["term"].shape == (n,)
            and got["lengths"].shape == (n,)
            and len(got["cps"]) == int(got["offsets"][-1])
            and len(got["cp_idx"]) == len(got["cps"])
            and len(got["node_cpi"]) == len(got["parent"])
            and len(got["row_start"]) == len(got["parent"]) + 1
            and len(got["height"]) == len(got["parent"]) + 1
            and len(got["below_asc"]) == 2 * (len(got["parent"]) + 1)
            and len(got["below_flags"]) == len(got["parent"]) + 1
            and len(got["cp_nodes"]) == len(got["uniq_cps"])
        )
        if not ok:
            return False
        for k, a in got.items():
            if a.dtype != np.dtype(_SAVED[k]) or a.ndim != 1:
                return False
            setattr(self, k, a)
        n_nodes = len(self.parent)
        # spot checks against the pieces: a foreign file fails them
        for t in np.linspace(0, n - 1, num=min(n, 64), dtype=np.int64).tolist():
            cps, end = decode_utf8(self.piece(t), NO_PARTIAL)
            if self.never[t] or self.invalid[t]:
                continue
            if self.token_cps(t).tolist() != cps or int(self.partial_remain[t]) != max(end[1], 0):
                return False
            if not 0 <= int(self.term[t]) <= n_nodes:
                return False
        return True

    def _derive(self) -> None:
        """Small arrays derived from the saved ones (not saved)."""
        po = self.piece_offsets
        nonempty = np.flatnonzero(po[:-1] < po[1:])
        fb = np.frombuffer(self.blob, dtype=np.uint8)[po[:-1][nonempty]] if len(self.blob) else np.zeros(0, np.uint8)
        #: tokens whose piece starts with a UTF-8 continuation byte: the only ones that can
        #: follow a token that ended inside a character
        self.continuation_tokens = nonempty[(fb >= 0x80) & (fb < 0xC0)].astype(np.int32)
        self._cont_kinds = self._sort_continuations()
        self._cont_bits: list[tuple[Any, ...] | None] = [None, None, None]  # see _continuation_bits
        self._first_cp_tokens = None
        self.has_partial = self.partial_remain > 0
        self.nonpartial = ~self.has_partial
        self.eog_ids = np.flatnonzero(self.eog)
        self.usable = ~self.never & ~self.invalid & ~self.eog
        self.n_nodes = len(self.parent)
        #: how many of ``uniq_cps`` (increasing) are ASCII
        self.n_ascii_cps = int(np.searchsorted(self.uniq_cps, 128))
        #: ``uniq_cps`` as int32 (what the C binding of a grammar reads; code points fit)
        self.uniq_cps_i32 = np.ascontiguousarray(self.uniq_cps, dtype=np.int32)
        #: the usable tokens that end inside a character, and per token the index of its
        #: partial character among the vocabulary's distinct ones, ``pchars`` (each
        #: ``value * 4 + bytes still needed``; -1: the token ends on a whole character)
        self.partial_tokens = np.flatnonzero(self.usable & self.has_partial)
        keys = self.partial_value[self.partial_tokens] * 4 + self.partial_remain[self.partial_tokens]
        srt = np.sort(keys)  # np.unique would import numpy.ma (~13 ms) on a first use
        self.pchars = srt[np.r_[True, srt[1:] != srt[:-1]]] if len(srt) else srt
        self.pchar_slot = np.full(self.n_vocab, -1, dtype=np.int32)
        self.pchar_slot[self.partial_tokens] = np.searchsorted(self.pchars, keys)
        self._trie: Any = None

    def trie(self) -> Any:
        """The trie in the layout of the C walks (``llama_cffi._trie_walk.Trie``; made
        on first use, then shared by every grammar compiled for the vocabulary)."""
        if self._trie is None:
            from llama_cffi._trie_walk import Trie

            n = self.n_nodes
            pt_nodes = self.term[self.partial_tokens]
            has_pt = _has_pt(self.term, self.partial_tokens, n)
            make = functools.partial(
                Trie,
                n_vocab=self.n_vocab,
                max_depth=len(self.level_base) - 1,
                n_pchars=len(self.pchars),
                level_base=self.level_base,
                node_cpi=self.node_cpi,
                parent=self.parent,
                first_child=self.first_child,
                n_child=self.n_child,
                row_start=self.row_start,
                row_end=self.row_end,
                n_term=self.n_term,
                has_pt=has_pt,
                order=self.order,
                pchar_slot=self.pchar_slot,
                root_pt=self.partial_tokens[pt_nodes == n],
                height=self.height,
                lengths=self.lengths,
                below_asc=self.below_asc,
                below_flags=self.below_flags,
                cp_nodes=self.cp_nodes,
            )
            try:
                self._trie = make(packed=self._packed)
            except ValueError:
                if self._packed is None:
                    raise
                self._trie = make()  # a cache file's packed arrays of the wrong size: packed here
            self._packed = self._trie.packed_arrays()
        return self._trie

    def arrays(self) -> dict[str, npt.NDArray[Any]]:
        """The arrays a cache file holds."""
        out = {k: np.asarray(getattr(self, k), dtype=dt) for k, dt in _SAVED.items()}
        out.update(self._prescan_arrays)
        if self._packed is not None:
            out.update({k: np.asarray(a, dtype=dt) for (k, dt), a in zip(_PACKED.items(), self._packed, strict=True)})
        return out

    # ------------------------------------------------------------------ shared run scans
    def _shared_scan(self, key: bytes, paths: bool = False) -> Any:
        """The full-length run scan (``llama_cffi._trie_walk.SharedScan``) a grammar made,
        or the index was built with, for the code points ``key`` names (see
        ``CompiledGrammar._cp_key``); with ``paths``, only one that keeps its paths. None
        when there is none."""
        with self._scan_lock:
            sh = self._prescans.get(key)
            if sh is None:
                sh = self._scans.get(key)
                if sh is not None:
                    self._scans.move_to_end(key)
        if sh is None or (paths and not sh.keeps_paths):
            return None
        return sh

    def _subset_scan(self, key: bytes) -> tuple[bytes, Any] | None:
        """Of the full-length shared scans (prescanned or made by a grammar), the one of
        the most code points among those whose code points ``key`` holds (and with its
        partial-character bit), with its key: the base of ``TrieGrammar.run_scan_extend``.
        None when there is none."""
        want = np.frombuffer(key, dtype=np.uint8)
        best: tuple[int, bytes, Any] | None = None
        with self._scan_lock:
            for ck, sh in itertools.chain(self._prescans.items(), self._scans.items()):
                if len(ck) != len(key) or ck[-1] != key[-1] or ck == key:
                    continue
                have = np.frombuffer(ck, dtype=np.uint8)
                if (have & ~want).any():
                    continue
                size = int(np.unpackbits(have[:-1]).sum())  # (its code points: the one of most is the best base)
                if best is None or size > best[0]:
                    best = (size, ck, sh)
        return None if best is None else (best[1], best[2])

    def _share_scan(self, key: bytes, sh: Any) -> None:
        """Keep ``sh`` (a ``SharedScan`` made for the code points ``key`` names) for the
        vocabulary's other grammars; one that keeps its paths is not replaced by one that
        does not. At most :data:`_SHARED_SCANS` are kept, the least recently used dropped."""
        with self._scan_lock:
            if key in self._prescans:
                return
            old = self._scans.get(key)
            if old is not None and old.keeps_paths and not sh.keeps_paths:
                return
            self._scans[key] = sh
            self._scans.move_to_end(key)
            while len(self._scans) > _SHARED_SCANS:
                self._scans.popitem(last=False)

    def _prescan(self) -> None:
        """Make the scans of :data:`_PRESCANNED` (with their paths) and keep them, and their
        arrays for the cache file."""
        from .grammar import Grammar

        for i, char_class in enumerate(_PRESCANNED):
            c = Grammar.from_gbnf(f"root ::= {char_class}*").compile(self, mask_cache_size=0, kernel="c")
            key, sh = c._start_run_scan()
            self._prescans[key] = sh
            fields = {
                "key": np.frombuffer(key, dtype=np.uint8),
                "mask": sh.mask,
                "nodes": sh.nodes,
                "depths": sh.depths,
                "pt_tokens": sh.pt_tokens,
                "pt_depth": sh.pt_depth,
                "on": sh.on,
                "absorbed": sh.absorbed,
            }
            for f, dt in _PRESCAN_FIELDS.items():
                self._prescan_arrays[f"prescan{i}_{f}"] = np.ascontiguousarray(fields[f], dtype=dt)

    def _adopt_prescans(self, arrays: dict[str, npt.NDArray[Any]]) -> None:
        """Take the prescanned scans of a cache file (read-only views of its pages) when
        every one is there and fits the trie; otherwise make them. (What C reads of them
        is bounds-checked there too.)"""
        from llama_cffi._trie_walk import SharedScan

        n_nodes, n_words = len(self.parent), (self.n_vocab + 31) // 32
        key_len = (len(self.uniq_cps) + 7) // 8 + 1
        k = len(self.level_base)  # max_depth + 1: a full-length scan
        got: dict[bytes, Any] = {}
        saved: dict[str, npt.NDArray[Any]] = {}
        for i in range(len(_PRESCANNED)):
            a = {f: x for f in _PRESCAN_FIELDS if (x := arrays.get(f"prescan{i}_{f}")) is not None}
            if len(a) != len(_PRESCAN_FIELDS) or any(
                x.dtype != np.dtype(_PRESCAN_FIELDS[f]) or x.ndim != 1 for f, x in a.items()
            ):
                break
            ok = (
                len(a["key"]) == key_len
                and len(a["mask"]) == n_words
                and len(a["nodes"]) == len(a["depths"])
                and len(a["pt_tokens"]) == len(a["pt_depth"])
                and len(a["on"]) == n_nodes + 1
                and len(a["absorbed"]) % 2 == 0
                and _within(a["nodes"], 0, n_nodes - 1)
                and _within(a["depths"], 0, k)
                and _within(a["pt_tokens"], 0, self.n_vocab - 1)
                and _within(a["pt_depth"], 0, k)
            )
            if not ok:
                break
            got[a["key"].tobytes()] = SharedScan(
                k,
                a["mask"],
                a["nodes"],
                a["depths"],
                a["pt_tokens"],
                a["pt_depth"],
                a["on"],
                a["absorbed"],
            )
            saved.update({f"prescan{i}_{f}": x for f, x in a.items()})
        else:
            self._prescans, self._prescan_arrays = got, saved
            return
        self._prescan()

    # ------------------------------------------------------------------ cache
    @classmethod
    def of(cls, vocab: Any, *, disk_cache: bool = True) -> VocabIndex:
        """The (cached) index of a :class:`llama_cffi.Vocab` or :class:`llama_cffi.Model`,
        or a new one for a sequence of byte pieces. For a llama_cffi vocabulary the index
        is kept for the vocabulary's lifetime and, with ``disk_cache`` (and unless
        ``LLAMA_CFFI_GRAMMAR_CACHE=0``), on disk: see the module docstring."""
        disk_cache = expect_bool("disk_cache", disk_cache)
        if isinstance(vocab, VocabIndex):
            return vocab
        from llama_cffi.model import Model
        from llama_cffi.vocab import Vocab

        if isinstance(vocab, Model):
            vocab = vocab.vocab
        if isinstance(vocab, Vocab):
            hit = _cache.get(vocab)
            if hit is None:
                blob, offsets, eog = vocab.pieces_blob(special=True)
                hit = _cache[vocab] = cls._load_or_build(blob, offsets, eog, disk_cache)
            return hit
        if isinstance(vocab, Sequence):
            return cls([bytes(p) for p in vocab])
        raise type_error("vocab", "a llama_cffi Vocab or Model or a sequence of byte pieces", vocab)

    @classmethod
    def _load_or_build(cls, blob: bytes, offsets: I64, eog: npt.NDArray[np.bool_], disk_cache: bool) -> VocabIndex:
        path = _cache_path(blob, offsets, eog) if disk_cache and _disk_cache_enabled() else None
        arrays = _load(path) if path is not None and path.is_file() else None
        index = cls((blob, offsets), eog, arrays=arrays)  # built when the arrays do not fit
        if not index._prescans:
            index._prescan()
        if path is not None and not index.from_cache:
            _save(path, index.arrays())
        index.trie()  # the C walks' view of it, made now rather than inside a first compile
        _ = index.first_cp_tokens  # (and the root's counts a grammar's plans weigh classes by: 0.2 ms cold)
        return index


def _within(a: npt.NDArray[Any], lo: int, hi: int) -> bool:
    """Whether every value of ``a`` lies in ``[lo, hi]``."""
    return not len(a) or (int(a.min()) >= lo and int(a.max()) <= hi)


def _has_pt(term: npt.NDArray[Any], partial_tokens: npt.NDArray[Any], n_nodes: int) -> npt.NDArray[np.uint8]:
    """Per node (the root last): whether a usable token ending inside a character ends
    there (``partial_tokens``: those tokens; ``term``: each token's node)."""
    has_pt = np.zeros(n_nodes + 1, dtype=np.uint8)
    has_pt[term[partial_tokens]] = 1
    return has_pt


def _disk_cache_enabled() -> bool:
    return os.environ.get("LLAMA_CFFI_GRAMMAR_CACHE", "1") not in ("0", "false", "no", "off")


def _cache_path(blob: bytes, offsets: I64, eog: npt.NDArray[np.bool_]) -> Path:
    from llama_cffi.default_model import cache_dir

    h = hashlib.blake2b(digest_size=20)
    h.update(f"llama_cffi grammar vocab v{_FORMAT}\n".encode())
    h.update(json.dumps(_PRESCANNED).encode())
    h.update(blob)
    h.update(np.ascontiguousarray(offsets, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(eog, dtype=np.uint8).tobytes())
    return cache_dir() / "grammar-vocab" / f"{h.hexdigest()}.vocab"


def _save(path: Path, arrays: dict[str, npt.NDArray[Any]]) -> None:
    """Write the arrays as one file (:data:`_MAGIC`, the header's length as 8 bytes, a JSON
    header ``{name: [dtype, length, offset]}``, then each array's bytes at its offset,
    aligned), atomically (a temporary file in the same directory, then rename); a cache
    that cannot be written is only a slower next start."""
    try:
        entries: dict[str, list[Any]] = {}
        offset = 0
        for name, a in arrays.items():
            entries[name] = [a.dtype.str, len(a), offset]
            offset += -(-a.nbytes // _ALIGN) * _ALIGN
        header = json.dumps(entries, separators=(",", ":")).encode()
        start = -(-(len(_MAGIC) + 8 + len(header)) // _ALIGN) * _ALIGN
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".vocab")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + len(header).to_bytes(8, "little") + header)
                for name, a in arrays.items():
                    f.seek(start + entries[name][2])
                    f.write(np.ascontiguousarray(a).tobytes())
                f.truncate(start + offset)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        pass


def _load(path: Path) -> dict[str, npt.NDArray[Any]] | None:
    """The arrays of a file :func:`_save` wrote, as read-only views of its memory map (the
    map stays open while a view does); None when the file is not one (a truncated file, a
    header that does not fit the file, a dtype not saved by :func:`_save`)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < len(_MAGIC) + 8:
                return None
            populate = getattr(mmap, "MAP_POPULATE", 0)  # Linux: the pages mapped now, not at first touch
            if populate:
                mm = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED | populate, prot=mmap.PROT_READ)
            else:  # pragma: no cover - other systems
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    if mm[: len(_MAGIC)] != _MAGIC:
        return None
    n = int.from_bytes(mm[len(_MAGIC) : len(_MAGIC) + 8], "little")
    if n > size:
        return None
    try:
        entries = json.loads(mm[len(_MAGIC) + 8 : len(_MAGIC) + 8 + n])
    except ValueError:
        return None
    start = -(-(len(_MAGIC) + 8 + n) // _ALIGN) * _ALIGN
    allowed = {np.dtype(dt).str for dt in (*_SAVED.values(), *_PRESCAN_FIELDS.values(), *_PACKED.values())}
    out: dict[str, npt.NDArray[Any]] = {}
    if not isinstance(entries, dict):
        return None
    for name, entry in entries.items():
        if not (isinstance(entry, list) and len(entry) == 3 and entry[0] in allowed):
            return None
        dt, count, offset = np.dtype(entry[0]), entry[1], entry[2]
        if not (isinstance(count, int) and isinstance(offset, int) and count >= 0 and offset >= 0):
            return None
        if start + offset + count * dt.itemsize > size:
            return None
        out[name] = np.frombuffer(mm, dtype=dt, count=count, offset=start + offset)
    return out


_cache: weakref.WeakKeyDictionary[Any, VocabIndex] = weakref.WeakKeyDictionary()
