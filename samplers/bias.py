"""Logit bias (``llama_sampler_init_logit_bias``): add a fixed amount to chosen tokens' logits."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from llama_cffi import InvalidTokenError
from llama_cffi._args import expect_iterable
from llama_cffi.sampling import LlamaSampler, check_float, check_int

from .base import Sampler
from .candidates import Candidates, check_candidates


class LogitBias(Sampler):
    """Add ``bias`` to the logit of each ``token`` (``-inf`` bans it).

    ``biases``: a mapping token -> bias, or (token, bias) pairs; a token listed twice gets
    both biases. Tokens must be in ``[0, n_vocab)``. Unlike llama.cpp, which leaves the
    ``sorted`` flag as it was, the candidates are marked unsorted when a bias applied
    (a bias can reorder them, and later samplers must not trust the old order).
    """

    name = "logit-bias"

    def __init__(self, n_vocab: int, biases: Mapping[int, float] | Iterable[tuple[int, float]]) -> None:
        self.n_vocab = check_int("n_vocab", n_vocab, 1)
        what = "a mapping token -> bias or (token, bias) pairs"
        if isinstance(biases, Mapping):
            items = list(biases.items())
        else:
            items = [tuple(expect_iterable("biases", b, what)) for b in expect_iterable("biases", biases, what)]
        toks: list[int] = []
        vals: list[float] = []
        for tok, bias in items:
            t = check_int("token", int(tok) if isinstance(tok, (int, np.integer)) else tok)
            if not 0 <= t < self.n_vocab:
                raise InvalidTokenError(f"logit bias token {t} is out of range [0, {self.n_vocab})")
            b = float(bias)
            if b != -np.inf:
                b = check_float("bias", b)
            toks.append(t)
            vals.append(b)
        self.tokens = np.asarray(toks, dtype=np.int64)
        self.biases = np.asarray(vals, dtype=np.float32)
        order = np.argsort(self.tokens, kind="stable")
        self._sorted_tokens = self.tokens[order]
        self._sorted_biases = self.biases[order]
        # summed per token, for candidates found by search
        uniq, inverse = np.unique(self.tokens, return_inverse=True)
        self._uniq = uniq
        self._uniq_bias = np.zeros(len(uniq), np.float32)
        np.add.at(self._uniq_bias, inverse, self.biases)

    def clone(self) -> LogitBias:
        return LogitBias(self.n_vocab, zip(self.tokens.tolist(), self.biases.tolist(), strict=True))

    def native(self) -> LlamaSampler:
        return LlamaSampler.logit_bias(self.n_vocab, zip(self.tokens.tolist(), self.biases.tolist(), strict=True))

    def _params(self) -> dict[str, Any]:
        return {"n_vocab": self.n_vocab, "biases": dict(zip(self.tokens.tolist(), self.biases.tolist(), strict=False))}

    def apply(self, cands: Candidates) -> None:
        check_candidates(cands)
        if len(self.tokens) == 0 or cands.size == 0:
            return
        n = cands.size
        if cands.is_identity:
            inside = self._uniq < n
            pos, amount = self._uniq[inside], self._uniq_bias[inside]
        else:
            ids = cands.read_ids()
            j = np.searchsorted(self._uniq, ids)
            j[j >= len(self._uniq)] = 0
            hit = self._uniq[j] == ids
            pos, amount = np.flatnonzero(hit), self._uniq_bias[j[hit]]
        if len(pos):
            lg = cands.logits
            lg[pos] += amount
            cands.sorted = False
