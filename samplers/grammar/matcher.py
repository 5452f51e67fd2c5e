"""The parse state of one sequence under a compiled grammar.

A :class:`GrammarMatcher` is small: a parser state (an int naming a set of pushdown
stacks, see :mod:`samplers.grammar.engine`), the partial UTF-8 character carried
between tokens, and a history for :meth:`~GrammarMatcher.rollback`. Forking one is
copying those, so tree search over many branches costs nothing per branch; the
compiled tables and mask cache are shared.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from llama_cffi._args import expect, expect_array, expect_int, type_error
from llama_cffi.errors import InvalidTokenError

from ..candidates import Candidates
from .compiled import CompiledGrammar
from .engine import DEAD, NO_PARTIAL, Partial, decode_utf8

_U32 = np.dtype(np.uint32)  # (a dtype compared with a dtype: faster than with np.uint32)


def _apply_words(cands: Candidates, words: npt.NDArray[np.uint32], n_vocab: int) -> None:
    """Set the logits of the candidates whose bit is clear in ``words`` to -inf, in place,
    in one C pass (``llama_cffi._trie_walk.mask_logits``); ids outside the vocabulary
    raise :class:`~llama_cffi.errors.InvalidTokenError` and change nothing."""
    from llama_cffi._trie_walk import mask_logits

    ids = None if cands.is_identity else cands.read_ids()
    if ids is not None and (int(ids.max()) >= n_vocab or int(ids.min()) < 0):
        raise InvalidTokenError(f"candidate ids must lie in [0, {n_vocab})")
    if cands.is_identity and cands.size > n_vocab:
        raise InvalidTokenError(f"candidate ids must lie in [0, {n_vocab})")
    mask_logits(cands.logits, ids, words, n_vocab)


class GrammarMatcher:
    """Accepts tokens (or bytes) one at a time and tells which tokens may come next.

    Semantics are llama.cpp's grammar sampler's: a token is allowed iff the native
    sampler would leave it unmasked (:meth:`allowed_tokens`), and accepting it moves
    the stacks as ``llama_grammar_accept_impl`` does. Where llama.cpp would abort
    (a token it would mask, an end-of-generation token before the grammar can end),
    :meth:`accept_token` returns False and changes nothing.
    """

    __slots__ = ("_compiled", "_history", "ended", "partial", "state")

    def __init__(self, compiled: CompiledGrammar) -> None:
        expect("compiled", compiled, CompiledGrammar, "a samplers.grammar.CompiledGrammar")
        self._compiled = compiled
        self.state = compiled.engine.start
        self.partial: Partial = NO_PARTIAL
        #: whether an end-of-generation token was accepted
        self.ended = False
        self._history: list[tuple[int, Partial, bool]] = []

    @property
    def compiled(self) -> CompiledGrammar:
        return self._compiled

    # ------------------------------------------------------------------ queries
    def can_end(self) -> bool:
        """Whether the input so far is a complete sentence (an EOG token is allowed)."""
        return self._compiled.engine.is_complete(self.state)

    def is_complete(self) -> bool:
        """Whether the input is complete and nothing more can follow (every stack is
        empty), or an end-of-generation token was accepted."""
        return self.ended or (self.state != DEAD and self._compiled.engine.stacks(self.state) == ((),))

    def allows(self, token: int) -> bool:
        """Whether ``token`` may come next (one token: no full mask is computed)."""
        c = self._compiled
        t = self._check(token)
        if self.ended:
            return False
        return c.token_allowed(self.state, self.partial, t)

    def allowed_tokens(self) -> npt.NDArray[np.bool_]:
        """Boolean mask over the vocabulary of the tokens that may come next. Read-only
        (shared with the mask cache)."""
        if self.ended:
            return np.zeros(self._compiled.n_vocab, dtype=bool)
        return self._compiled.allowed(self.state, self.partial)

    def fill_mask(self, bitmask: npt.NDArray[np.uint32] | None = None) -> npt.NDArray[np.uint32]:
        """The allowed tokens as a packed bitmask: bit ``t % 32`` of word ``t // 32``
        (``uint32`` words, xgrammar's layout). Writes into ``bitmask`` when given (at
        least ``ceil(n_vocab / 32)`` words) and returns it."""
        n_words = self._compiled.n_words
        out = np.empty(n_words, dtype=np.uint32) if bitmask is None else bitmask
        if not isinstance(out, np.ndarray):
            raise type_error("bitmask", "a 1-D uint32 ndarray", out)
        if out.dtype != _U32 or out.ndim != 1 or len(out) < n_words:
            raise ValueError(f"bitmask must be a 1-D uint32 array of at least {n_words} words")
        flags = out.flags
        if not flags.writeable or not flags.c_contiguous:
            raise ValueError("bitmask must be writeable and C-contiguous")
        if self.ended:
            out[:n_words] = 0
            return out
        return self._compiled._fill_words(self.state, self.partial, out)

    def apply(self, cands: Candidates) -> None:
        """Set the logits of disallowed candidates to -inf, in place (like applying
        llama.cpp's grammar sampler)."""
        expect("cands", cands, Candidates, "samplers.Candidates")
        if cands.size == 0:
            return
        c = self._compiled
        words = np.empty(c.n_words, dtype=np.uint32)
        if self.ended:
            words[:] = 0
        else:  # written once: by the walk itself, or from the mask cache
            c.fill_words(self.state, self.partial, words)
        _apply_words(cands, words, c.n_vocab)

    # ------------------------------------------------------------------ moves
    def accept_token(self, token: int) -> bool:
        """Advance by ``token`` if it is allowed (True); otherwise change nothing (False)."""
        c = self._compiled
        t = self._check(token)
        if self.ended:
            return False
        v, eng = c.vocab, c.engine
        if self.partial[1] == 0 and not eng.has_token_elements and not v.eog[t]:
            # whole characters from a clean start: one walk decides and advances (the one
            # token_allowed would make, then the one below: an empty stack, which char_only
            # drops, consumes no character)
            if v.never[t] or v.invalid[t]:
                return False
            if v.partial_remain[t] == 0 and v.offsets[t + 1] > v.offsets[t]:
                nxt = eng.walk(self.state, v.cps[v.offsets[t] : v.offsets[t + 1]].tolist())
                if nxt == DEAD:
                    return False
                self._history.append((self.state, self.partial, self.ended))
                self.state = nxt
                return True
        if not c.token_allowed(self.state, self.partial, t):
            return False
        if v.eog[t]:
            self._history.append((self.state, self.partial, self.ended))
            self.ended = True
            return True
        cps, end = decode_utf8(v.piece(t), self.partial)
        # llama_grammar_accept_token: token-topped stacks consume the token by id,
        # the others its code points
        by_id = eng.step_token(self.state, t) if eng.has_token_elements else DEAD
        chars = eng.walk(eng.char_only(self.state), cps)
        nxt = eng.union(by_id, chars)
        if nxt == DEAD:
            return False  # llama.cpp would throw ("Unexpected empty grammar stack")
        self._history.append((self.state, self.partial, self.ended))
        self.state = nxt
        self.partial = end if end[1] > 0 else NO_PARTIAL
        return True

    #: the :class:`llama_cffi.sampling.GrammarGuard` protocol (guarding a native grammar sampler)
    accept = accept_token

    def accept_tokens(self, tokens: npt.ArrayLike) -> int:
        """Accept tokens in order until one is refused; returns how many were accepted."""
        n = 0
        for t in expect_array("tokens", tokens, "token ids (ints)", "iu").astype(np.int64).ravel().tolist():
            if not self.accept_token(t):
                break
            n += 1
        return n

    def accept_bytes(self, data: bytes | str) -> bool:
        """Advance by raw text (UTF-8; may end inside a character). False (and no change)
        when the grammar cannot take it, including a partial character no class allows."""
        if not isinstance(data, (str, bytes, bytearray, memoryview)):
            raise type_error("data", "bytes or a str", data)
        raw = data.encode() if isinstance(data, str) else bytes(data)
        if self.ended:
            return False
        eng = self._compiled.engine
        cps, end = decode_utf8(raw, self.partial)
        if end[1] < 0:
            return False
        nxt = eng.walk(self.state, cps)  # llama_grammar_accept_str: no character, no change
        if nxt == DEAD or (end[1] > 0 and not eng.partial_ok(nxt, end)):
            return False
        self._history.append((self.state, self.partial, self.ended))
        self.state = nxt
        self.partial = end
        return True

    def rollback(self, n: int = 1) -> None:
        """Undo the last ``n`` accepted tokens (or :meth:`accept_bytes` calls)."""
        n = expect_int("n", n)
        if not 0 <= n <= len(self._history):
            raise ValueError(f"cannot roll back {n} steps: {len(self._history)} recorded")
        if n:
            self.state, self.partial, self.ended = self._history[-n]
            del self._history[-n:]

    @property
    def n_accepted(self) -> int:
        """How many steps :meth:`rollback` can undo."""
        return len(self._history)

    def reset(self) -> None:
        """Back to the grammar's start."""
        self.state = self._compiled.engine.start
        self.partial = NO_PARTIAL
        self.ended = False
        self._history.clear()

    def clone(self) -> GrammarMatcher:
        """An independent matcher in the same state (history included), sharing the
        compiled grammar."""
        out = GrammarMatcher.__new__(GrammarMatcher)
        out._compiled = self._compiled
        out.state = self.state
        out.partial = self.partial
        out.ended = self.ended
        out._history = list(self._history)
        return out

    fork = clone

    def _check(self, token: int) -> int:
        t = token if type(token) is int else expect_int("token", token)
        if not 0 <= t < self._compiled.n_vocab:
            raise InvalidTokenError(f"token {t} is out of range [0, {self._compiled.n_vocab})")
        return t

    def __repr__(self) -> str:
        return f"<GrammarMatcher state={self.state} partial={self.partial} can_end={self.can_end()}>"
