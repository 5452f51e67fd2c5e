"""Selecting samplers: pick one candidate. Greedy (argmax) and Dist (a seeded draw)."""

from __future__ import annotations

from typing import Any

import numpy as np

from llama_cffi.sampling import LlamaSampler, check_seed

from ._rng import StdMT19937
from .base import Sampler
from .candidates import Candidates, check_candidates


class Greedy(Sampler):
    """Select the candidate with the highest logit (the first one on ties), as
    ``llama_sampler_init_greedy``."""

    name = "greedy"

    def apply(self, cands: Candidates) -> None:
        check_candidates(cands)
        cands.selected = int(cands._lg().argmax()) if cands.size else 0

    def clone(self) -> Greedy:
        return Greedy()

    def native(self) -> LlamaSampler:
        return LlamaSampler.greedy()


class Dist(Sampler):
    """Draw a candidate from the softmax of the logits, as ``llama_sampler_init_dist(seed)``.

    Same seed, same candidates, same token as llama.cpp: the engine is ``std::mt19937``
    reproduced draw for draw (see :mod:`samplers._rng`). ``seed=None`` draws a random
    seed; :attr:`seed` is the one in use. Leaves ``p`` = the normalised probabilities.
    """

    name = "dist"

    def __init__(self, seed: int | None = None) -> None:
        self._seed_arg = check_seed(seed)
        self.rng = StdMT19937(self._seed_arg)

    @property
    def seed(self) -> int:
        return self.rng.seed

    @property
    def generator(self) -> np.random.Generator:
        """A numpy Generator over this sampler's engine (draws from it advance the sampler)."""
        return self.rng.generator

    def reseed(self, seed: int | None = None) -> None:
        """Restart the engine from ``seed`` (``None``: a random one)."""
        self._seed_arg = check_seed(seed)
        self.rng.reseed(self._seed_arg)

    def reset(self) -> None:
        self.rng.reseed(self._seed_arg)

    def clone(self) -> Dist:
        out = Dist.__new__(Dist)
        out._seed_arg = self._seed_arg
        out.rng = self.rng.copy()
        return out

    def native(self) -> LlamaSampler:
        return LlamaSampler.dist(self.rng.seed)

    def _params(self) -> dict[str, Any]:
        return {"seed": self.rng.seed}

    def apply(self, cands: Candidates) -> None:
        check_candidates(cands)
        n = cands.size
        if n == 0:
            cands.selected = -1
            return
        cands.selected = 0
        if n == 1:
            self.rng.canonical()  # llama.cpp draws once per output, whatever the size
            cands.p[0] = 1.0
            return
        lg = cands._lg()
        m = lg[0] if cands.sorted else lg.max()
        p = cands._p[:n]  # every entry is written below: no zero fill (the ``p`` property)
        cands._p_valid = True
        if m == -np.inf:  # every candidate masked: NaN like llama.cpp's, without numpy's warning
            with np.errstate(invalid="ignore"):
                np.subtract(lg, m, out=p)
        else:
            np.subtract(lg, m, out=p)
        np.exp(p, out=p)
        cum = np.cumsum(p, dtype=np.float64, out=cands.scratch64(n))  # llama.cpp: a double running sum
        total = float(cum[-1])
        u = self.rng.canonical()
        i = int(cum.searchsorted(total * u, side="left"))
        cands.selected = min(i, n - 1)
        np.divide(p, total, out=p, casting="unsafe")
