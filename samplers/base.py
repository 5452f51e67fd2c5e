"""The sampler interface, mirroring llama.cpp's ``llama_sampler_i``.

A sampler transforms :class:`~samplers.candidates.Candidates` in :meth:`Sampler.apply`:
it filters them, changes their logits, computes probabilities, or selects one (sets
``cands.selected``). :meth:`Sampler.accept` tells it which token was finally chosen
(penalties, DRY and mirostat keep such state), :meth:`Sampler.reset` forgets that state
and reseeds, :meth:`Sampler.clone` gives an independent copy with the same state
(RNG state included). :meth:`Sampler.sample` runs one whole step on a context's output.

Write your own by subclassing :class:`Sampler` and implementing ``apply``; override
``accept``/``reset``/``clone`` when it keeps state (the default ``clone`` deep-copies).
"""

from __future__ import annotations

import copy
import weakref
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import numpy as np

from llama_cffi.sampling import SamplingError

from .candidates import Candidates

if TYPE_CHECKING:
    from llama_cffi import Context
    from llama_cffi.sampling import LlamaSampler

__all__ = ["Sampler", "SamplingError", "candidates_for"]

_per_context: weakref.WeakKeyDictionary[Any, Candidates] = weakref.WeakKeyDictionary()


def candidates_for(ctx: Context) -> Candidates:
    """The :class:`Candidates` reused for every sampling step on ``ctx`` (one per context,
    so many chains sampling one context share one set of buffers)."""
    c = _per_context.get(ctx)
    if c is None:
        c = _per_context[ctx] = Candidates(ctx.n_vocab)
    return c


class Sampler(ABC):
    """Base class of every sampler (see the module docstring)."""

    #: llama.cpp's name for this kind of sampler ("top-k", "dist", ...).
    name: str = "custom"

    @abstractmethod
    def apply(self, cands: Candidates) -> None:
        """Transform ``cands`` in place (filter, rescale, compute ``p``, or select)."""

    def accept(self, token: int) -> None:  # noqa: B027 - optional hook, a no-op by default
        """``token`` was chosen: update state (no-op for stateless samplers)."""

    def reset(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Back to the state after construction (accepted tokens forgotten, RNG reseeded)."""

    def clone(self) -> Sampler:
        """An independent copy with the same parameters and state (RNG state included)."""
        return copy.deepcopy(self)

    def native(self) -> LlamaSampler:
        """The equivalent llama.cpp sampler (fresh state), for speed or for comparison."""
        raise NotImplementedError(f"{type(self).__name__} has no llama.cpp equivalent")

    def sample(self, ctx: Context, idx: int = -1) -> int:
        """One sampling step on output ``idx`` of ``ctx``'s last decode: candidates from its
        logits (no copy), :meth:`apply`, take the selected token, :meth:`accept` it.

        Raises :class:`SamplingError` when nothing was selected (end a chain with a
        selecting sampler: greedy, dist, mirostat, adaptive-p)."""
        cands = candidates_for(ctx)
        try:
            cands.reset(np.asarray(ctx.logits(idx)))
            self.apply(cands)
            token = selected_token(cands, self)
        finally:
            cands.release()
        self.accept(token)
        return token

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self._params().items())
        return f"{type(self).__name__}({params})"

    def _params(self) -> dict[str, Any]:
        return {}


def selected_token(cands: Candidates, who: Sampler) -> int:
    s = cands.selected
    if not 0 <= s < cands.size:
        raise SamplingError(
            f"{who!r} selected no token (selected={s} of {cands.size} candidates): "
            "end the chain with a selecting sampler (Greedy, Dist, Mirostat, MirostatV2, AdaptiveP)"
        )
    return cands.token
