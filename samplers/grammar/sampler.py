"""The grammar as a sampler in a :class:`~samplers.SamplerChain`.

In a chain, a :class:`GrammarSampler` gets llama.cpp's fast path
(``common_sampler_sample``): the chain first samples *without* the grammar; if the
grammar allows the chosen token (one token checked, no mask), that is the result;
only otherwise is the full mask applied and the chain run again on the fresh logits
(grammar first). :meth:`GrammarSampler.apply` on its own always applies the full mask.

Lazy grammars (llama.cpp's ``llama_sampler_init_grammar_lazy_patterns``) stay inactive
until a trigger token is accepted or the text generated so far matches a trigger
pattern; the tokens from the trigger on are then replayed into the grammar.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from llama_cffi._args import expect, expect_bool, expect_int, expect_iterable, type_error
from llama_cffi.sampling import LlamaSampler, SamplingError

from ..base import Sampler
from ..candidates import Candidates
from .compiled import CompiledGrammar
from .grammar import Grammar
from .matcher import GrammarMatcher, _apply_words


class GrammarSampler(Sampler):
    """Constrain sampling to a grammar (see the module docstring).

    ``grammar``: a :class:`Grammar` (then ``vocab`` is required: a model or vocabulary),
    a :class:`CompiledGrammar` or a :class:`GrammarMatcher` (used as is). ``lazy`` with
    ``trigger_patterns`` (Python regular expressions searched in the text generated so
    far; a pattern written ``^...$`` must match all of it; the grammar starts at the
    first non-empty capture group, else at the match), ``trigger_words`` (literal
    texts) and/or ``trigger_tokens``.
    """

    name = "grammar"

    def __init__(
        self,
        grammar: Grammar | CompiledGrammar | GrammarMatcher,
        vocab: Any = None,
        *,
        lazy: bool = False,
        trigger_patterns: Iterable[str] = (),
        trigger_tokens: Iterable[int] = (),
        trigger_words: Iterable[str] = (),
    ) -> None:
        lazy = expect_bool("lazy", lazy)
        expect_iterable("trigger_patterns", trigger_patterns, "an iterable of regular expressions (str)")
        expect_iterable("trigger_tokens", trigger_tokens, "an iterable of token ids")
        expect_iterable("trigger_words", trigger_words, "an iterable of str")
        self._grammar: Grammar | None = None
        self._vocab = vocab
        if isinstance(grammar, GrammarMatcher):
            self.matcher = grammar
        elif isinstance(grammar, CompiledGrammar):
            self.matcher = grammar.matcher()
        elif isinstance(grammar, Grammar):
            if vocab is None:
                raise ValueError("a Grammar needs the vocabulary (model) to sample with")
            self.matcher = grammar.matcher(vocab)
            self._grammar = grammar
        else:
            raise type_error("grammar", "a Grammar, CompiledGrammar or GrammarMatcher", grammar)
        self.lazy = bool(lazy)
        patterns = list(trigger_patterns)
        words = list(trigger_words)
        if words:  # llama.cpp's (deprecated) trigger words: the grammar starts at the first one
            patterns.append("[\\s\\S]*?(" + "|".join(re.escape(w) for w in words) + ")[\\s\\S]*")
        self.trigger_patterns = [re.compile(p) for p in patterns]
        self._pattern_texts = [p.pattern for p in self.trigger_patterns]
        self.trigger_tokens = frozenset(int(t) for t in trigger_tokens)
        self.awaiting = self.lazy
        self._buffer = b""
        self._buffer_tokens: list[tuple[int, int, int]] = []  # (token, start, end) in _buffer
        self._given: tuple[tuple[int, tuple[int, int], bool], npt.NDArray[np.uint32]] | None = None
        #: the last token :meth:`allows` found allowed without a mask, and where (the check
        #: before a step asks again about the token just chosen)
        self._allowed: tuple[tuple[int, tuple[int, int], bool], int] | None = None

    @property
    def compiled(self) -> CompiledGrammar:
        return self.matcher.compiled

    def use_mask(self, words: npt.NDArray[np.uint32]) -> None:
        """Take ``words`` (the matcher's :meth:`~GrammarMatcher.fill_mask` for its current
        state, e.g. a row of :func:`~samplers.grammar.fill_masks`) as this step's mask:
        :meth:`allows` and :meth:`apply` read it instead of walking, until the matcher
        moves. Borrowed, not copied: leave it unchanged until the step is done."""
        m = self.matcher
        if not isinstance(words, np.ndarray) or words.dtype != np.uint32 or words.ndim != 1:
            raise TypeError("words must be a 1-D uint32 array")
        if len(words) < m.compiled.n_words:
            raise ValueError(f"words has {len(words)} words, {m.compiled.n_words} needed")
        self._given = ((m.state, m.partial, m.ended), words)

    def _words(self) -> npt.NDArray[np.uint32] | None:
        """The mask given by :meth:`use_mask` if the matcher is still where it was."""
        given = self._given
        if given is None:
            return None
        m = self.matcher
        if given[0] != (m.state, m.partial, m.ended):
            self._given = None
            return None
        return given[1]

    def allows(self, token: int) -> bool:
        """Whether the grammar allows ``token`` next (always, while a lazy grammar waits)."""
        if type(token) is not int:
            token = expect_int("token", token)
        if self.awaiting:
            return True
        words = self._words()
        if words is not None and 0 <= token < self.matcher.compiled.n_vocab:
            return bool((int(words[token >> 5]) >> (token & 31)) & 1)
        m = self.matcher
        where = (m.state, m.partial, m.ended)
        last = self._allowed
        if last is not None and last[1] == token and last[0] == where:
            return True
        ok = m.allows(token)
        if ok:
            self._allowed = (where, token)
        return ok

    @staticmethod
    def allows_many(samplers: list[GrammarSampler], tokens: list[int]) -> list[bool]:
        """``[s.allows(t) for s, t in zip(samplers, tokens)]`` (each token in its sampler's
        vocabulary), with the checks of samplers without a given mask asked of their
        grammars together (:meth:`CompiledGrammar._tokens_allowed`: one C call per grammar
        for what its transition table tells), and each positive answer kept for the step's
        own check, as :meth:`allows` keeps it."""
        samplers = list(expect_iterable("samplers", samplers, "a list of GrammarSampler"))
        tokens = list(expect_iterable("tokens", tokens, "a list of token ids"))
        if len(samplers) != len(tokens):
            raise ValueError(f"{len(samplers)} samplers and {len(tokens)} tokens")
        for i, s in enumerate(samplers):
            if not isinstance(s, GrammarSampler):
                raise type_error(f"samplers[{i}]", "a GrammarSampler", s)
            t = tokens[i]
            if type(t) is not int:
                tokens[i] = expect_int("token", t)
        return GrammarSampler._allows_given(samplers, tokens)[0]

    @staticmethod
    def _allows_given(
        samplers: list[GrammarSampler], tokens: list[int]
    ) -> tuple[list[bool], list[npt.NDArray[np.uint32] | None]]:
        """:meth:`allows_many` of GrammarSamplers and ints (each checked against its
        vocabulary here: :class:`~samplers.grammar.errors.InvalidTokenError`), and each
        sampler's given mask (:meth:`_words`, looked up once; None where there is none)."""
        n = len(samplers)
        out: list[bool] = [False] * n
        given: list[npt.NDArray[np.uint32] | None] = [None] * n
        asks: dict[CompiledGrammar, list[int]] = {}
        for i in range(n):
            s, t = samplers[i], tokens[i]
            m = s.matcher
            if not 0 <= t < m._compiled.n_vocab:
                m._check(t)  # raises
            if s.awaiting or m.ended:
                out[i] = s.allows(t)
                continue
            words = given[i] = s._words()
            if words is not None:  # a given mask: its bit
                out[i] = bool((int(words[t >> 5]) >> (t & 31)) & 1)
                continue
            asks.setdefault(m.compiled, []).append(i)
        for c, idx in asks.items():
            ms = [samplers[i].matcher for i in idx]
            got = c._tokens_allowed([m.state for m in ms], [m.partial for m in ms], [tokens[i] for i in idx])
            for i, m, ok in zip(idx, ms, got, strict=True):
                out[i] = bool(ok)
                if ok:
                    samplers[i]._allowed = ((m.state, m.partial, m.ended), tokens[i])
        return out, given

    def apply(self, cands: Candidates) -> None:
        """Mask every candidate the grammar does not allow (no-op while waiting)."""
        expect("cands", cands, Candidates, "samplers.Candidates")
        if self.awaiting or cands.size == 0:
            return
        words = self._words()
        if words is None:
            self.matcher.apply(cands)
            return
        _apply_words(cands, words, self.matcher.compiled.n_vocab)

    def accept(self, token: int) -> None:
        """Advance the grammar (or, while waiting, the trigger search). Raises
        :class:`SamplingError` for a token the grammar does not allow."""
        token = expect_int("token", token)
        if self.awaiting:
            self._accept_waiting(token)
            return
        if not self.matcher.accept_token(token):
            raise SamplingError(f"the grammar does not allow token {int(token)} here")

    def _accept_waiting(self, token: int) -> None:
        m = self.matcher
        if token in self.trigger_tokens:
            self.awaiting = False
            self._buffer = b""
            self._buffer_tokens.clear()
            if not m.accept_token(token):
                raise SamplingError(f"the grammar does not allow its trigger token {token}")
            return
        piece = m.compiled.vocab.piece(token)
        start = len(self._buffer)
        self._buffer += piece
        self._buffer_tokens.append((token, start, len(self._buffer)))
        text = self._buffer.decode("utf-8", errors="surrogateescape")
        for pat, src in zip(self.trigger_patterns, self._pattern_texts, strict=True):
            if src.startswith("^") and src.endswith("$"):
                hit = pat.fullmatch(text)
            else:
                hit = pat.search(text)
            if hit is None:
                continue
            begin = next((hit.start(i) for i in range(1, (hit.lastindex or 0) + 1) if hit.group(i)), hit.start())
            at = len(text[:begin].encode("utf-8", errors="surrogateescape"))
            self.awaiting = False
            tokens = list(self._buffer_tokens)
            buf = self._buffer
            self._buffer = b""
            self._buffer_tokens.clear()
            for _tok, s, e in tokens:
                if e <= at:
                    continue
                if not m.accept_bytes(buf[max(s, at) : e]):
                    raise SamplingError("the grammar does not allow the text that triggered it")
            return

    def reset(self) -> None:
        self.matcher.reset()
        self.awaiting = self.lazy
        self._buffer = b""
        self._buffer_tokens.clear()

    def clone(self) -> GrammarSampler:
        out = GrammarSampler.__new__(GrammarSampler)
        out.__dict__.update(self.__dict__)
        out.matcher = self.matcher.clone()
        out._buffer_tokens = list(self._buffer_tokens)
        out._given = None
        return out

    def native(self) -> LlamaSampler:
        """llama.cpp's grammar sampler for the same grammar (fresh state; not lazy). Needs
        the :class:`Grammar` and the model it was made with."""
        if self._grammar is None or self._vocab is None:
            raise NotImplementedError("native() needs a GrammarSampler made from a Grammar and a model")
        if self.lazy:
            raise NotImplementedError("native lazy grammars are not wrapped (llama.cpp aborts on bad patterns)")
        g = self._grammar
        return LlamaSampler.grammar(self._vocab, g.gbnf, g.root, guard=g.matcher(self._vocab))

    def _params(self) -> dict[str, Any]:
        return {"root": self.compiled.engine.root, "lazy": self.lazy}
