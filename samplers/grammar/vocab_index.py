"""A vocabulary as the grammar sees it: each token's bytes decoded to code points.

llama.cpp's grammar sampler matches ``llama_vocab::token_to_piece(id)`` (the piece with
special tokens rendered as text) decoded with its own UTF-8 decoder. This index holds
those pieces, the code points each decodes to from a clean start (flat array plus
offsets), the partial UTF-8 sequence it ends with, and the token flags that decide
masking before any matching: end-of-generation, empty or NUL-first pieces (always
masked), invalid UTF-8 (always masked). Built once per vocabulary (about a second for
262,144 tokens) and cached for the vocabulary's lifetime.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .engine import NO_PARTIAL, decode_utf8


class VocabIndex:
    """See the module docstring. ``pieces[t]`` is token ``t``'s bytes; ``eog`` the
    end-of-generation flags."""

    def __init__(self, pieces: Sequence[bytes], eog: Iterable[int] = ()) -> None:
        n = len(pieces)
        self.n_vocab = n
        self.pieces: list[bytes] = list(pieces)
        self.eog = np.zeros(n, dtype=bool)
        for t in eog:
            if 0 <= t < n:
                self.eog[t] = True
        lengths = np.zeros(n, dtype=np.int64)
        flat: list[int] = []
        partial_value = np.zeros(n, dtype=np.int64)
        partial_remain = np.zeros(n, dtype=np.int8)
        #: masked whatever the grammar: empty piece, first byte NUL
        self.never = np.zeros(n, dtype=bool)
        #: invalid UTF-8 when decoded from a clean start (masked unless a partial character
        #: is pending that its leading continuation bytes complete)
        self.invalid = np.zeros(n, dtype=bool)
        cont: list[int] = []
        for t, piece in enumerate(self.pieces):
            if not piece or piece[0] == 0:
                self.never[t] = True
                continue
            if 0x80 <= piece[0] < 0xC0:
                cont.append(t)
            cps, (value, remain) = decode_utf8(piece, NO_PARTIAL)
            if remain < 0:
                self.invalid[t] = True
                continue
            flat.extend(cps)
            lengths[t] = len(cps)
            partial_value[t] = value
            partial_remain[t] = remain
        self.never &= ~self.eog  # EOG tokens are decided by the grammar's completeness alone
        self.offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])
        self.lengths = lengths
        self.cps: npt.NDArray[np.int64] = np.asarray(flat, dtype=np.int64)
        self.partial_value = partial_value
        self.partial_remain = partial_remain
        #: tokens whose piece starts with a UTF-8 continuation byte: the only ones that can
        #: follow a token that ended inside a character
        self.continuation_tokens = np.asarray(cont, dtype=np.int32)
        self.has_partial = partial_remain > 0

    def token_cps(self, token: int) -> npt.NDArray[np.int64]:
        return self.cps[self.offsets[token] : self.offsets[token + 1]]

    @classmethod
    def of(cls, vocab: Any) -> VocabIndex:
        """The (cached) index of a :class:`llama_cffi.Vocab` or :class:`llama_cffi.Model`,
        or a new one for a sequence of byte pieces."""
        if isinstance(vocab, VocabIndex):
            return vocab
        from llama_cffi.model import Model
        from llama_cffi.vocab import Vocab

        if isinstance(vocab, Model):
            vocab = vocab.vocab
        if isinstance(vocab, Vocab):
            hit = _cache.get(vocab)
            if hit is None:
                pieces = [vocab.token_to_piece(t, special=True) for t in range(vocab.n_vocab)]
                hit = _cache[vocab] = cls(pieces, vocab.eog_tokens())
            return hit
        if isinstance(vocab, Sequence):
            return cls([bytes(p) for p in vocab])
        raise TypeError(
            f"expected a llama_cffi Vocab or Model or a sequence of byte pieces, not {type(vocab).__name__}"
        )


_cache: weakref.WeakKeyDictionary[Any, VocabIndex] = weakref.WeakKeyDictionary()
