"""Mirostat 1 and 2: selecting samplers that steer the surprisal of the chosen tokens
towards a target ``tau`` (bits), adapting ``mu`` with learning rate ``eta`` after each pick.

Arithmetic is float32 where llama.cpp's is, and the draws are ``std::discrete_distribution``
over ``std::mt19937`` (see :mod:`samplers._rng`), so a seeded sampler picks the same
tokens as llama.cpp's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llama_cffi.sampling import LlamaSampler, check_float, check_int, check_seed

from ._rng import StdMT19937
from .base import Sampler
from .candidates import Candidates, check_candidates

_F32 = np.float32
_INT32_MIN = -(2**31)


def _c_int(x: np.float32) -> int:
    """C's ``int(float)`` on x86: truncation, and INT_MIN for NaN or out of range."""
    if not np.isfinite(x) or not -(2.0**31) <= float(x) < 2.0**31:
        return _INT32_MIN
    return int(x)


class _MirostatBase(Sampler):
    """What both versions share: tau/eta, the seeded engine, and mu (reset to 2*tau)."""

    def _init_common(self, seed: int | None, tau: float, eta: float) -> None:
        self.tau = check_float("tau", tau)
        self.eta = check_float("eta", eta)
        self._seed_arg = check_seed(seed)
        self.rng = StdMT19937(self._seed_arg)
        self.mu = _F32(2.0) * _F32(self.tau)

    @property
    def seed(self) -> int:
        return self.rng.seed

    def reset(self) -> None:
        self.mu = _F32(2.0) * _F32(self.tau)
        self.rng.reseed(self._seed_arg)

    def clone(self) -> _MirostatBase:
        out = type(self).__new__(type(self))
        out.__dict__.update(self.__dict__)
        out.rng = self.rng.copy()
        return out

    def _draw_and_adapt(self, cands: Candidates) -> None:
        """Renormalise the survivors, draw one, move mu by eta * (surprisal - tau)."""
        p = cands.softmax(sort=True)
        idx = self.rng.discrete(p)
        cands.selected = idx
        with np.errstate(divide="ignore"):
            observed = -np.log2(p[idx])
        self.mu = _F32(self.mu - _F32(self.eta) * (observed - _F32(self.tau)))


class Mirostat(_MirostatBase):
    """Mirostat 1.0 (``llama_sampler_init_mirostat``): estimate the Zipf exponent from the
    top ``m`` probabilities, keep the top-k that targets surprisal ``mu``, draw.
    ``n_vocab`` is the model's vocabulary size."""

    name = "mirostat"

    def __init__(self, n_vocab: int, seed: int | None = None, tau: float = 5.0, eta: float = 0.1, m: int = 100) -> None:
        self.n_vocab = check_int("n_vocab", n_vocab, 1)
        self.m = check_int("m", m, 1)
        self._init_common(seed, tau, eta)

    def native(self) -> LlamaSampler:
        return LlamaSampler.mirostat(self.n_vocab, self.rng.seed, self.tau, self.eta, self.m)

    def _params(self) -> dict[str, Any]:
        return {"n_vocab": self.n_vocab, "seed": self.rng.seed, "tau": self.tau, "eta": self.eta, "m": self.m}

    def apply(self, cands: Candidates) -> None:
        check_candidates(cands)
        if cands.size == 0:
            cands.selected = -1
            return
        p = cands.softmax(sort=True)
        n_est = min(self.m - 1, cands.size - 1)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            i = np.arange(n_est, dtype=np.float32)
            t = np.log((i + _F32(2)) / (i + _F32(1)))
            b = np.log(p[:n_est] / p[1 : n_est + 1])
            sum_tb = np.cumsum(t * b)[-1] if n_est else _F32(0.0)
            sum_tt = np.cumsum(t * t)[-1] if n_est else _F32(0.0)
            s_hat = _F32(sum_tb / sum_tt)
            eps = s_hat - _F32(1)
            num = eps * np.power(_F32(2), self.mu)
            den = _F32(1) - np.power(_F32(self.n_vocab), -eps)
            k = np.power(num / den, _F32(1) / s_hat)
        k_int = max(_c_int(_F32(k)), 1)
        if k_int < cands.size:
            cands.truncate(k_int)  # sorted already
        self._draw_and_adapt(cands)


class MirostatV2(_MirostatBase):
    """Mirostat 2.0 (``llama_sampler_init_mirostat_v2``): drop candidates whose surprisal
    exceeds ``mu`` (keeping at least one), renormalise, draw."""

    name = "mirostat-v2"

    def __init__(self, seed: int | None = None, tau: float = 5.0, eta: float = 0.1) -> None:
        self._init_common(seed, tau, eta)

    def native(self) -> LlamaSampler:
        return LlamaSampler.mirostat_v2(self.rng.seed, self.tau, self.eta)

    def _params(self) -> dict[str, Any]:
        return {"seed": self.rng.seed, "tau": self.tau, "eta": self.eta}

    def apply(self, cands: Candidates) -> None:
        check_candidates(cands)
        if cands.size == 0:
            cands.selected = -1
            return
        p = cands.softmax(sort=True)
        with np.errstate(divide="ignore"):
            over = -np.log2(p) > self.mu
        cut = int(over.argmax()) if over.any() else cands.size
        cands.truncate(max(cut, 1))
        self._draw_and_adapt(cands)
