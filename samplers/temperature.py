"""Temperature samplers: scale the logits. Temperature and TempExt (dynamic temperature)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from llama_cffi._args import expect_number
from llama_cffi.sampling import LlamaSampler, check_float

from .base import Sampler
from .candidates import Candidates, check_candidates


def scale_logits(cands: Candidates, temp: float) -> None:
    """llama.cpp's ``llama_sampler_temp_impl``: divide by ``temp``; ``temp <= 0`` keeps only
    the highest logit (the first on ties) and sets every other to -inf."""
    check_candidates(cands)
    if type(temp) is not float:
        temp = expect_number("temp", temp)
    n = cands.size
    if n == 0:
        return
    lg = cands.logits
    if temp <= 0.0:
        i = int(lg.argmax())
        top = lg[i]
        lg[:] = -np.inf
        lg[i] = top
        return
    if temp >= 1.0 or (cands.sorted and _no_overflow(lg, temp)):
        np.divide(lg, np.float32(temp), out=lg)  # cannot overflow: no errstate (~1 us) needed
        return
    with np.errstate(over="ignore"):  # a tiny temperature overflows to inf, as in C
        np.divide(lg, np.float32(temp), out=lg)


_FLT_MAX = float(np.finfo(np.float32).max)


def _no_overflow(lg: np.ndarray, temp: float) -> bool:
    """Whether ``lg / temp`` stays finite for logits sorted descending: the largest and
    the smallest (unless -inf, which stays -inf) are within ``FLT_MAX * temp``."""
    lim = _FLT_MAX * temp
    top, bottom = float(lg[0]), float(lg[-1])
    return top <= lim and (bottom >= -lim or bottom == -math.inf)


class Temperature(Sampler):
    """Divide the logits by ``t`` (``llama_sampler_init_temp``). ``t <= 0``: keep only the
    most likely token (greedy through the chain); ``t == 1``: no-op."""

    name = "temp"

    def __init__(self, t: float) -> None:
        self.t = check_float("t", t)

    def apply(self, cands: Candidates) -> None:
        check_candidates(cands)
        if self.t == 1.0:
            return
        scale_logits(cands, self.t)

    def clone(self) -> Temperature:
        return Temperature(self.t)

    def native(self) -> LlamaSampler:
        return LlamaSampler.temp(self.t)

    def _params(self) -> dict[str, Any]:
        return {"t": self.t}


class TempExt(Sampler):
    """Dynamic temperature (``llama_sampler_init_temp_ext``): with ``delta > 0`` the
    temperature moves in ``[t - delta, t + delta]`` with the normalised entropy of the
    candidates raised to ``exponent``; otherwise a plain :class:`Temperature` ``t``.
    Leaves the candidates sorted with ``p`` recomputed."""

    name = "temp-ext"

    def __init__(self, t: float, delta: float = 0.0, exponent: float = 1.0) -> None:
        self.t = check_float("t", t)
        self.delta = check_float("delta", delta)
        self.exponent = check_float("exponent", exponent)

    def clone(self) -> TempExt:
        return TempExt(self.t, self.delta, self.exponent)

    def native(self) -> LlamaSampler:
        return LlamaSampler.temp_ext(self.t, self.delta, self.exponent)

    def _params(self) -> dict[str, Any]:
        return {"t": self.t, "delta": self.delta, "exponent": self.exponent}

    def apply(self, cands: Candidates) -> None:
        check_candidates(cands)
        if self.delta <= 0:
            if self.t != 1.0:
                scale_logits(cands, self.t)
            return
        n = cands.size
        if n <= 1:
            return
        f32 = np.float32
        min_temp = max(f32(0.0), f32(self.t) - f32(self.delta))
        max_temp = f32(self.t) + f32(self.delta)
        max_entropy = -f32(math.log(f32(1.0) / f32(n)))
        p = cands.softmax(sort=True)
        nz = p[p > 0]
        entropy = -np.cumsum(nz * np.log(nz))[-1] if len(nz) else f32(0.0)
        normalized = f32(entropy) / max_entropy
        dyn = min_temp + (max_temp - min_temp) * f32(math.pow(float(normalized), self.exponent))
        scale_logits(cands, float(dyn))
        lg = cands._lg().astype(np.float64)
        with np.errstate(invalid="ignore"):  # all -inf (or +inf) after scaling: NaN p, as llama.cpp
            q = np.exp(lg - lg[0])
            cands.p[:] = q / q.sum()
