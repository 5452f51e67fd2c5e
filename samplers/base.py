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

from llama_cffi._args import expect, expect_int
from llama_cffi.sampling import SamplingError

from .candidates import Candidates, check_candidates

if TYPE_CHECKING:
    from llama_cffi import Context, Model
    from llama_cffi.sampling import LlamaSampler

__all__ = ["Sampler", "SamplingError", "candidates_for"]

_per_context: weakref.WeakKeyDictionary[Any, Candidates] = weakref.WeakKeyDictionary()


def candidates_for(ctx: Context) -> Candidates:
    """The :class:`Candidates` reused for every sampling step on ``ctx`` (one per context,
    so many chains sampling one context share one set of buffers)."""
    check_context(ctx)
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
        check_candidates(cands)

    def accept(self, token: int) -> None:
        """``token`` was chosen: update state (no-op for stateless samplers)."""
        expect_int("token", token)

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
        check_context(ctx)
        if type(idx) is not int:
            idx = expect_int("idx", idx)
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


def check_context(ctx: object, name: str = "ctx") -> Context:
    """``ctx`` when it is a :class:`llama_cffi.Context`, else the
    :class:`~llama_cffi.errors.ParamTypeError` naming ``name``."""
    from llama_cffi import Context

    return expect(name, ctx, Context, "a llama_cffi.Context")


def check_model(model: object, name: str = "model") -> Model:
    """``model`` when it is a :class:`llama_cffi.Model`, else the
    :class:`~llama_cffi.errors.ParamTypeError` naming ``name``."""
    from llama_cffi import Model

    return expect(name, model, Model, "a llama_cffi.Model")


def check_model_or_none(model: object, name: str = "model") -> Model | None:
    return None if model is None else check_model(model, name)


def selected_token(cands: Candidates, who: Sampler) -> int:
    s = cands.selected
    if not 0 <= s < cands.size:
        raise SamplingError(
            f"{who!r} selected no token (selected={s} of {cands.size} candidates): "
            "end the chain with a selecting sampler (Greedy, Dist, Mirostat, MirostatV2, AdaptiveP)"
        )
    return cands.token
