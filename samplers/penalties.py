"""Repetition penalties over the last ``last_n`` accepted tokens (``llama_sampler_init_penalties``).

For a candidate seen ``c > 0`` times in that window: its logit is divided by ``repeat``
when positive (multiplied when not), then ``c * freq + present`` is subtracted.
``last_n == 0``, or ``repeat == 1`` with ``freq == present == 0``, is a no-op that keeps no
history (as in llama.cpp).
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any

import numpy as np

from llama_cffi._args import expect_int
from llama_cffi.sampling import LlamaSampler, check_float, check_int

from .base import Sampler
from .candidates import Candidates, check_candidates

_F32 = np.float32


class Penalties(Sampler):
    """Repeat / frequency / presence penalties (see the module docstring). ``n_vocab`` is
    only needed for :meth:`native` (llama.cpp's constructor takes it)."""

    name = "penalties"

    def __init__(
        self, last_n: int = 64, repeat: float = 1.0, freq: float = 0.0, present: float = 0.0, n_vocab: int = 1
    ) -> None:
        self.last_n = max(check_int("last_n", last_n), 0)
        self.repeat = check_float("repeat", repeat)
        self.freq = check_float("freq", freq)
        self.present = check_float("present", present)
        self.n_vocab = check_int("n_vocab", n_vocab, 1)
        self.disabled = self.last_n == 0 or (self.repeat == 1.0 and self.freq == 0.0 and self.present == 0.0)
        self.history: deque[int] = deque(maxlen=max(self.last_n, 1))
        self.counts: Counter[int] = Counter()

    def accept(self, token: int) -> None:
        token = expect_int("token", token)
        if self.disabled:
            return
        if len(self.history) == self.last_n:
            old = self.history[0]
            self.counts[old] -= 1
            if not self.counts[old]:
                del self.counts[old]
        self.history.append(int(token))
        self.counts[int(token)] += 1

    def reset(self) -> None:
        self.history.clear()
        self.counts.clear()

    def clone(self) -> Penalties:
        out = Penalties(self.last_n, self.repeat, self.freq, self.present, self.n_vocab)
        out.history.extend(self.history)
        out.counts.update(self.counts)
        return out

    def native(self) -> LlamaSampler:
        return LlamaSampler.penalties(self.n_vocab, self.last_n, self.repeat, self.freq, self.present)

    def _params(self) -> dict[str, Any]:
        return {"last_n": self.last_n, "repeat": self.repeat, "freq": self.freq, "present": self.present}

    def apply(self, cands: Candidates) -> None:
        check_candidates(cands)
        if self.disabled:
            return
        cands.sorted = False
        if not self.counts or cands.size == 0:
            return
        toks = np.fromiter(self.counts.keys(), dtype=np.int64, count=len(self.counts))
        cnt = np.fromiter(self.counts.values(), dtype=np.int64, count=len(self.counts))
        ids = cands.read_ids()
        order = np.argsort(toks)
        toks, cnt = toks[order], cnt[order]
        if cands.is_identity:
            # the full vocabulary in id order (the usual first sampler): index directly
            inside = toks < len(ids)
            pos, c = toks[inside], cnt[inside]
        else:
            j = np.searchsorted(toks, ids)
            j[j >= len(toks)] = 0
            hit = toks[j] == ids
            pos = np.flatnonzero(hit)
            c = cnt[j[hit]]
        if len(pos) == 0:
            return
        lg = cands.logits
        v = lg[pos]
        v = np.where(v <= 0, v * _F32(self.repeat), v / _F32(self.repeat)).astype(np.float32)
        cf = c.astype(np.float32)
        v -= cf * _F32(self.freq) + (cf > 0).astype(np.float32) * _F32(self.present)
        lg[pos] = v
