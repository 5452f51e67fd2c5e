"""Truncation samplers: keep the likely candidates. TopK, TopP, MinP, Typical, TopNSigma, XTC.

Each follows its ``llama_sampler_init_*`` counterpart in llama.cpp's
``src/llama-sampler.cpp``, including which parameter values make it a no-op and which
flags (``sorted``) it leaves behind.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from llama_cffi.sampling import LlamaSampler, check_float, check_int, check_seed

from ._rng import StdMT19937
from .base import Sampler
from .candidates import Candidates, check_candidates, seq_sum

_F32 = np.float32
_FLT_MAX = float(np.finfo(np.float32).max)


class TopK(Sampler):
    """Keep the ``k`` highest logits, sorted descending (``k <= 0``: no-op)."""

    name = "top-k"

    def __init__(self, k: int) -> None:
        self.k = check_int("k", k)

    def apply(self, cands: Candidates) -> None:
        check_candidates(cands)
        k = self.k
        if k <= 0:
            return
        k = min(k, cands.size)
        if not cands.sorted:
            cands.keep(cands.top(k), True)
        cands.truncate(k)

    def clone(self) -> TopK:
        return TopK(self.k)

    def native(self) -> LlamaSampler:
        return LlamaSampler.top_k(self.k)

    def _params(self) -> dict[str, Any]:
        return {"k": self.k}


class TopP(Sampler):
    """Nucleus sampling: keep the smallest prefix (by descending logit) whose probability
    reaches ``p``, at least ``min_keep`` candidates (``p >= 1``: no-op). Leaves them sorted,
    with ``p`` of the softmax before truncation."""

    name = "top-p"

    def __init__(self, p: float, min_keep: int = 1) -> None:
        self.p = check_float("p", p)
        self.min_keep = check_int("min_keep", min_keep, 0)

    def clone(self) -> TopP:
        return TopP(self.p, self.min_keep)

    def native(self) -> LlamaSampler:
        return LlamaSampler.top_p(self.p, self.min_keep)

    def _params(self) -> dict[str, Any]:
        return {"p": self.p, "min_keep": self.min_keep}

    def apply(self, cands: Candidates) -> None:
        check_candidates(cands)
        if self.p >= 1.0:
            return
        n = cands.size
        if n == 0:
            return
        probs = cands.softmax(sort=False)
        target = _F32(self.p)
        if cands.sorted:
            order = None
            ps = probs
        else:
            # the prefix is usually short: look at the top 256 first, everything if needed
            order = cands.top(min(256, n)) if n > 1024 else cands.top(n)
            ps = probs[order]
        last = self._cut(ps, target)
        if last is None and order is not None and len(order) < n:
            order = cands.top(n)
            ps = probs[order]
            last = self._cut(ps, target)
        if last is None:
            last = n
        if order is None:
            cands.truncate(last)
        else:
            cands.keep(order[:last], True)

    def _cut(self, ps: np.ndarray, target: np.float32) -> int | None:
        cum = np.cumsum(ps, dtype=np.float32)  # llama.cpp: float running sum
        ok = cum >= target
        if self.min_keep > 1:
            ok[: self.min_keep - 1] = False
        hit = int(ok.argmax())
        return hit + 1 if ok[hit] else None


class MinP(Sampler):
    """Keep candidates whose probability is at least ``p`` times the top one's, at least
    ``min_keep`` (``p <= 0``: no-op). Unsorted input keeps its order."""

    name = "min-p"

    def __init__(self, p: float, min_keep: int = 1) -> None:
        self.p = check_float("p", p)
        self.min_keep = check_int("min_keep", min_keep, 0)

    def clone(self) -> MinP:
        return MinP(self.p, self.min_keep)

    def native(self) -> LlamaSampler:
        return LlamaSampler.min_p(self.p, self.min_keep)

    def _params(self) -> dict[str, Any]:
        return {"p": self.p, "min_keep": self.min_keep}

    def apply(self, cands: Candidates) -> None:
        check_candidates(cands)
        n = cands.size
        if self.p <= 0.0 or n == 0:
            return
        log_p = _F32(math.log(self.p))
        if not cands.sorted:
            lg = cands._lg()
            min_logit = max(_F32(lg.max()), _F32(-_FLT_MAX)) + log_p  # llama.cpp starts from -FLT_MAX
            keep = np.flatnonzero(lg >= min_logit)
            if len(keep) and len(keep) >= self.min_keep:
                if len(keep) < n:
                    cands.keep(keep, False)
                return
            cands.sort()
        lg = cands._lg()
        min_logit = lg[0] + log_p
        # sorted descending (no NaN: reset refuses them), so the logits >= min_logit are a
        # prefix; the first max(min_keep, 1) always stay
        cut = min(max(int(np.count_nonzero(lg >= min_logit)), self.min_keep, 1), n)
        cands.truncate(cut)


class Typical(Sampler):
    """Locally typical sampling (``p >= 1``: no-op): keep the candidates whose surprisal is
    closest to the entropy until their probability passes ``p``, at least ``min_keep``.

    Zero probabilities (underflow) add nothing to the entropy here (0·log 0 = 0); llama.cpp
    gets NaN from them and then keeps an arbitrary order."""

    name = "typical"

    def __init__(self, p: float, min_keep: int = 1) -> None:
        self.p = check_float("p", p)
        self.min_keep = check_int("min_keep", min_keep, 0)

    def clone(self) -> Typical:
        return Typical(self.p, self.min_keep)

    def native(self) -> LlamaSampler:
        return LlamaSampler.typical(self.p, self.min_keep)

    def _params(self) -> dict[str, Any]:
        return {"p": self.p, "min_keep": self.min_keep}

    def apply(self, cands: Candidates) -> None:
        check_candidates(cands)
        if self.p >= 1.0 or cands.size == 0:
            return
        p = cands.softmax(sort=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            neg_log = -np.log(p)
            terms = np.where(p > 0, p * neg_log, _F32(0.0)).astype(np.float32)
            entropy = seq_sum(terms)
            shifted = np.abs(neg_log - entropy)
        order = np.argsort(shifted, kind="stable")
        cum = np.cumsum(p[order], dtype=np.float32)
        ok = cum > _F32(self.p)
        if self.min_keep > 1:
            ok[: self.min_keep - 1] = False
        hit = int(ok.argmax())
        last = hit + 1 if ok[hit] else len(order)
        cands.keep(order[:last], False)


class TopNSigma(Sampler):
    """Keep logits within ``n`` standard deviations of the top one (others become -inf;
    the set keeps its size). ``n <= 0``: no-op. -inf logits are ignored in the statistics."""

    name = "top-n-sigma"

    def __init__(self, n: float) -> None:
        self.n = check_float("n", n)

    def clone(self) -> TopNSigma:
        return TopNSigma(self.n)

    def native(self) -> LlamaSampler:
        return LlamaSampler.top_n_sigma(self.n)

    def _params(self) -> dict[str, Any]:
        return {"n": self.n}

    def apply(self, cands: Candidates) -> None:
        check_candidates(cands)
        if self.n <= 0.0 or cands.size <= 1:
            return
        lg = cands._lg()
        valid = lg[lg != -np.inf]
        mx = max(lg[0], valid.max()) if len(valid) else lg[0]
        if len(valid):
            # llama.cpp: float running sums; each squared difference is a double added to a float
            mean = seq_sum(valid) / _F32(len(valid))
            d = (valid - mean).astype(np.float64)
            acc = seq_sum((d * d).astype(np.float32))
            std = np.sqrt(acc / _F32(len(valid)))
        else:
            std = _F32(0.0)
        cut = _F32(mx) - _F32(self.n) * std
        drop = lg < cut
        if drop.any():
            cands.logits[drop] = -np.inf


class XTC(Sampler):
    """Exclude Top Choices: with probability ``p`` (a seeded draw per step), drop every
    candidate whose probability is at least ``t`` except the least likely of them, keeping
    at least ``min_keep``. ``p <= 0`` or ``t > 0.5``: no-op (and no draw)."""

    name = "xtc"

    def __init__(self, p: float, t: float, min_keep: int = 1, seed: int | None = None) -> None:
        self.p = check_float("p", p)
        self.t = check_float("t", t)
        self.min_keep = check_int("min_keep", min_keep, 0)
        self._seed_arg = check_seed(seed)
        self.rng = StdMT19937(self._seed_arg)

    @property
    def seed(self) -> int:
        return self.rng.seed

    def reset(self) -> None:
        self.rng.reseed(self._seed_arg)

    def clone(self) -> XTC:
        out = XTC.__new__(XTC)
        out.p, out.t, out.min_keep, out._seed_arg = self.p, self.t, self.min_keep, self._seed_arg
        out.rng = self.rng.copy()
        return out

    def native(self) -> LlamaSampler:
        return LlamaSampler.xtc(self.p, self.t, self.min_keep, self.rng.seed)

    def _params(self) -> dict[str, Any]:
        return {"p": self.p, "t": self.t, "min_keep": self.min_keep, "seed": self.rng.seed}

    def apply(self, cands: Candidates) -> None:
        check_candidates(cands)
        n = cands.size
        if self.p <= 0.0 or self.t > 0.5 or n < 2:
            return
        if self.rng.canonical_float() > _F32(self.p):
            return
        p = cands.softmax(sort=True)
        below = p < _F32(self.t)
        first_below = int(below.argmax()) if below.any() else n
        pos_last = max(first_below - 1, 0)
        if n - pos_last >= self.min_keep and pos_last > 0:
            cands.drop_front(pos_last)
