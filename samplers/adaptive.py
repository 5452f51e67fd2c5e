"""Adaptive-p (``llama_sampler_init_adaptive_p``): a selecting sampler that favours tokens
whose probability is near a target, steering an exponential moving average of the chosen
tokens' original probabilities towards ``target``."""

from __future__ import annotations

from typing import Any

import numpy as np

from llama_cffi._args import expect_int
from llama_cffi.sampling import LlamaSampler, check_float, check_seed

from ._rng import StdMT19937
from .base import Sampler
from .candidates import Candidates, check_candidates

_F32 = np.float32
_WIDTH = _F32(0.3)
_PEAK = _F32(5.0)
_SHARPNESS = _F32(10.0)
_INV_WIDTH = _F32(1.0) / _WIDTH


class AdaptiveP(Sampler):
    """See the module docstring. ``target`` in [0, 1] (negative: plain sampling from the
    current distribution); ``decay`` in [0, 0.99] (clamped, as llama.cpp does): the EMA
    remembers about ``1 / (1 - decay)`` tokens. Must be last in a chain."""

    name = "adaptive-p"

    def __init__(self, target: float, decay: float = 0.9, seed: int | None = None) -> None:
        self.target = check_float("target", target)
        self.decay = float(np.clip(_F32(check_float("decay", decay)), _F32(0.0), _F32(0.99)))
        self._seed_arg = check_seed(seed)
        self.rng = StdMT19937(self._seed_arg)
        self._init_state()

    def _init_state(self) -> None:
        d = _F32(self.decay)
        self.weighted_sum = _F32(self.target) / (_F32(1.0) - d)
        self.total_weight = _F32(1.0) / (_F32(1.0) - d)
        self._original: np.ndarray = np.empty(0, np.float32)
        self._pending_token = -1
        self._pending_idx = -1

    @property
    def seed(self) -> int:
        return self.rng.seed

    def reset(self) -> None:
        self._init_state()
        self.rng.reseed(self._seed_arg)

    def clone(self) -> AdaptiveP:
        """A copy with the same EMA, pending token and RNG state (llama.cpp's clone restarts
        the RNG from the seed instead)."""
        out = AdaptiveP.__new__(AdaptiveP)
        out.__dict__.update(self.__dict__)
        out._original = self._original.copy()
        out.rng = self.rng.copy()
        return out

    def native(self) -> LlamaSampler:
        return LlamaSampler.adaptive_p(self.target, self.decay, self.rng.seed)

    def _params(self) -> dict[str, Any]:
        return {"target": self.target, "decay": self.decay, "seed": self.rng.seed}

    def apply(self, cands: Candidates) -> None:
        check_candidates(cands)
        if cands.size == 0:
            cands.selected = -1
            return
        p = cands.softmax(sort=False)
        if self.target < 0.0:
            cands.selected = self.rng.discrete(p)
            return
        self._original = p.copy()
        target = _F32(min(max(self.target, 0.0), 1.0))
        if self.total_weight == 0.0:
            adapted = target
        else:
            adapted = _F32(2.0) * target - self.weighted_sum / self.total_weight
        adapted = _F32(min(max(adapted, _F32(0.0)), _F32(1.0)))
        lg = cands.logits
        finite = lg != -np.inf
        dist = np.abs((p - adapted) * _INV_WIDTH)
        new = _PEAK - _SHARPNESS * dist * dist / (_F32(1.0) + dist)
        lg[finite] = new[finite]
        p = cands.softmax(sort=False)
        idx = self.rng.discrete(p)
        cands.selected = idx
        self._pending_token = int(cands.read_ids()[idx])
        self._pending_idx = idx

    def accept(self, token: int) -> None:
        token = expect_int("token", token)
        if self._pending_token == token and self._pending_idx >= 0:
            d = _F32(self.decay)
            self.weighted_sum = self._original[self._pending_idx] + d * self.weighted_sum
            self.total_weight = _F32(1.0) + d * self.total_weight
        self._pending_token = -1
        self._pending_idx = -1
