"""DRY ("Don't Repeat Yourself", ``llama_sampler_init_dry``): penalise the token that would
extend a repetition of the recent context.

When the last ``last_n`` accepted tokens end with a sequence that also occurred earlier,
the token that followed it then gets ``multiplier * base ** (length - allowed_length)``
subtracted (for repeats of at least ``allowed_length``). Sequence breakers (strings such
as ``"\\n"``) stop the look-back: they are turned into token sequences from the
vocabulary exactly as llama.cpp does (every token containing the string, or ending in a
prefix of it followed by the tokenised rest), or given directly as token sequences.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from llama_cffi._args import expect_int, type_error
from llama_cffi.sampling import LlamaSampler, check_float, check_int

from .base import Sampler, check_model
from .candidates import Candidates, check_candidates

if TYPE_CHECKING:
    from llama_cffi import Model

_MAX_CHAR_LEN = 40
_MAX_SEQ_LEN = 20
_FLOAT_MAX_LOG = 88.7228391

Breakers = dict[int, list[tuple[int, ...]]]


def breaker_sequences(model: Model, breakers: Iterable[str | bytes]) -> Breakers:
    """llama.cpp's ``get_overlapping_token_sequences`` for each breaker string: head token ->
    tails (token sequences that must precede it, nearest first is *not* implied: the tail
    is in text order)."""
    check_model(model)
    if not isinstance(breakers, Iterable):
        raise type_error("breakers", "an iterable of breaker strings (str or bytes)", breakers)
    vocab = model.vocab
    pieces = _pieces(model)
    out: Breakers = {}
    for raw in breakers:
        s = raw if isinstance(raw, bytes) else str(raw).encode()
        if not s:
            continue
        s = s[:_MAX_CHAR_LEN]
        first = s[:1]
        for tok, word in enumerate(pieces):
            if first not in word:
                continue
            if s in word:
                _add(out, tok, ())
                continue
            pos = word.find(first)
            while pos >= 0:
                tail_len = min(len(s), len(word) - pos)
                if word[pos : pos + tail_len] == s[:tail_len]:
                    rest = s[tail_len:]
                    seq = tuple(int(t) for t in vocab.tokenize(rest, add_special=False, parse_special=False))
                    _add(out, tok, seq[:_MAX_SEQ_LEN])
                pos = word.find(first, pos + 1)
    return out


def _add(out: Breakers, head: int, tail: tuple[int, ...]) -> None:
    tails = out.setdefault(head, [])
    if tail not in tails:
        tails.append(tail)


_piece_cache: dict[int, list[bytes]] = {}


def _pieces(model: Model) -> list[bytes]:
    key = id(model)
    got = _piece_cache.get(key)
    if got is None:
        vocab = model.vocab
        got = [vocab.detokenize_bytes([t], remove_special=False, unparse_special=True) for t in range(model.n_vocab)]
        _piece_cache.clear()
        _piece_cache[key] = got
    return got


class DRY(Sampler):
    """The DRY repetition penalty (see the module docstring).

    ``seq_breakers`` are strings (they need ``model``) or token sequences (first token the
    head). ``last_n <= 0`` or ``multiplier == 0`` or ``base < 1``: no-op.
    """

    name = "dry"

    def __init__(
        self,
        multiplier: float,
        base: float = 1.75,
        allowed_length: int = 2,
        last_n: int = 1024,
        seq_breakers: Sequence[str | bytes | Sequence[int]] = ("\n", ":", '"', "*"),
        model: Model | None = None,
    ) -> None:
        self.multiplier = check_float("multiplier", multiplier)
        self.base = check_float("base", base)
        self.allowed_length = check_int("allowed_length", allowed_length)
        self.last_n = max(check_int("last_n", last_n), 0)
        self.enabled = self.multiplier != 0.0 and self.base >= 1.0 and self.last_n != 0
        self.model = model
        if not isinstance(seq_breakers, Iterable):
            raise type_error("seq_breakers", "a sequence of breakers (str, bytes or token sequences)", seq_breakers)
        strings = [b for b in seq_breakers if isinstance(b, (str, bytes))]
        self._strings = list(strings)
        self.breakers: Breakers = {}
        if self.enabled and strings:
            if model is None:
                raise ValueError("string seq_breakers need the model (pass model=...) or give token sequences")
            self.breakers = breaker_sequences(model, strings)
        for b in seq_breakers:
            if not isinstance(b, (str, bytes)):
                seq = tuple(check_int("seq_breakers token", t) for t in b)
                if seq:
                    _add(self.breakers, seq[0], seq[1:])
        self.history: deque[int] = deque(maxlen=max(self.last_n, 1))

    def accept(self, token: int) -> None:
        token = expect_int("token", token)
        if self.enabled:
            self.history.append(int(token))

    def reset(self) -> None:
        self.history.clear()

    def clone(self) -> DRY:
        out = DRY.__new__(DRY)
        out.__dict__.update(self.__dict__)
        out.breakers = {k: list(v) for k, v in self.breakers.items()}
        out.history = deque(self.history, maxlen=self.history.maxlen)
        return out

    def native(self) -> LlamaSampler:
        if self.model is None:
            raise NotImplementedError("llama.cpp's DRY needs the model and string breakers")
        return LlamaSampler.dry(self.model, self.multiplier, self.base, self.allowed_length, self.last_n, self._strings)

    def _params(self) -> dict[str, Any]:
        return {
            "multiplier": self.multiplier,
            "base": self.base,
            "allowed_length": self.allowed_length,
            "last_n": self.last_n,
        }

    def penalties(self) -> dict[int, float]:
        """The penalty each token would get now (token -> amount subtracted from its logit)."""
        if not self.enabled:
            return {}
        hist = self.history
        n = min(len(hist), self.last_n)
        if n <= self.allowed_length:
            return {}
        last = list(hist)[-n:]

        def rat(i: int) -> int:  # i-th token from the end
            return last[n - 1 - i]

        # step 1: restart sequences limit how far back a repeat may reach
        rep_limit = n
        for i in range(n):
            tails = self.breakers.get(rat(i))
            if tails is None:
                continue
            longest = -1
            for tail in tails:
                sl = len(tail)
                if longest < sl <= i and all(tail[o] == rat(i - o - 1) for o in range(sl)):
                    longest = sl
            if longest >= 0:
                rep_limit = i - longest
                break
        if rep_limit < self.allowed_length:
            return {}
        # step 2: Z-algorithm over the reversed context
        repeat = [0] * n
        lt = rt = 0
        for k in range(1, n):
            if k > rt:
                m = 0
                while m + k < n and rat(m) == rat(m + k):
                    m += 1
                repeat[n - 1 - k] = min(m, rep_limit)
                if m > 0:
                    lt, rt = k, k + m - 1
            else:
                p = k - lt
                right = rt - k + 1
                if repeat[n - 1 - p] < right:
                    repeat[n - 1 - k] = min(repeat[n - 1 - p], rep_limit)
                else:
                    i = rt + 1
                    while i < n and rat(i) == rat(i - k):
                        i += 1
                    repeat[n - 1 - k] = min(i - k, rep_limit)
                    lt, rt = k, i - 1
        # step 3: the longest repeat each next token would extend
        max_repeat: dict[int, int] = {}
        for i in range(n - 1):
            length = repeat[i]
            if length >= self.allowed_length:
                tok = rat(n - 2 - i)
                if max_repeat.get(tok, -1) < length:
                    max_repeat[tok] = length
        # step 4: penalties, the exponent clamped against float overflow
        f32 = np.float32
        base = f32(self.base)
        max_exp = int(f32(_FLOAT_MAX_LOG) / np.log(base)) if base > f32(1.000001) else 0
        out: dict[int, float] = {}
        for tok, length in max_repeat.items():
            if () in self.breakers.get(tok, ()):
                continue  # a single-token breaker is never penalised
            e = length - self.allowed_length
            if max_exp > 0 and e > max_exp:
                e = max_exp
            out[tok] = float(
                f32(float(f32(self.multiplier)) * math.pow(float(base), e))
            )  # C++: pow(float, int) is double
        return out

    def apply(self, cands: Candidates) -> None:
        check_candidates(cands)
        if not self.enabled:
            return
        pen = self.penalties()
        cands.sorted = False
        if not pen or cands.size == 0:
            return
        toks = np.fromiter(pen.keys(), dtype=np.int64, count=len(pen))
        amount = np.fromiter(pen.values(), dtype=np.float32, count=len(pen))
        ids = cands.read_ids()
        if cands.is_identity:
            inside = toks < len(ids)
            pos, amt = toks[inside], amount[inside]
        else:
            order = np.argsort(toks)
            toks, amount = toks[order], amount[order]
            j = np.searchsorted(toks, ids)
            j[j >= len(toks)] = 0
            hit = toks[j] == ids
            pos, amt = np.flatnonzero(hit), amount[j[hit]]
        if len(pos):
            lg = cands.logits
            lg[pos] -= amt
