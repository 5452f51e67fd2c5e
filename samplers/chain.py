"""SamplerChain: samplers applied in order, itself a sampler (``llama_sampler_chain_*``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Protocol, cast

import numpy as np

from llama_cffi._args import expect_array, expect_bool, expect_int, expect_iterable, type_error
from llama_cffi.sampling import LlamaSampler, SamplingError

from .base import Sampler, candidates_for, check_context, selected_token
from .candidates import Candidates, check_candidates
from .measure import PerplexityTracker, row_surprisal

if TYPE_CHECKING:
    from llama_cffi import Context


class Tracker(Protocol):
    """What a chain feeds per sampled token: model-level and sampling-level surprisal (nats)."""

    def add(self, surprisal: float, sampling_surprisal: float | None = None) -> None: ...

    def clone(self) -> Tracker: ...

    def reset(self) -> None: ...


def surprisal_of(logits: np.ndarray, i: int) -> float:
    """-log softmax(logits)[i] in nats (max-shifted, float64 sum; ggml's soft_max kernel)."""
    if not isinstance(logits, np.ndarray):
        logits = expect_array("logits", logits, "a row of logits", "iuf")
    return row_surprisal(logits, expect_int("i", i))


def _check_tracker(tracker: object, name: str = "tracker") -> Tracker | None:
    """``tracker`` when it is None or has a :class:`Tracker`'s methods, else the
    :class:`~llama_cffi.errors.ParamTypeError` naming ``name``."""
    if tracker is None or type(tracker) is PerplexityTracker:
        return tracker
    if not all(callable(getattr(tracker, m, None)) for m in ("add", "clone", "reset")):
        raise type_error(name, "a tracker (add, clone, reset: a samplers.measure.PerplexityTracker) or None", tracker)
    return cast("Tracker | None", tracker)


class SamplerChain(Sampler):
    """Apply ``samplers`` in order; :meth:`~samplers.base.Sampler.accept` and
    :meth:`~samplers.base.Sampler.reset` go to each of them.

    ``chain.sample(ctx, idx)`` does apply, select, accept (like ``llama_sampler_sample``).
    Samplers that can check one token (those with an ``allows(token)`` method: a
    :class:`samplers.grammar.GrammarSampler`) get llama.cpp's fast path
    (``common_sampler_sample``): the other samplers choose first; if every such
    constraint allows the choice it stands, otherwise the candidates are rebuilt from
    the logits and the whole chain, constraints included, runs again.
    With a ``tracker`` (e.g. :class:`samplers.measure.PerplexityTracker`) each sampled token
    also adds its surprisal under the model's full distribution and under the distribution
    the chain actually drew from (softmax of the final candidates' logits).
    """

    name = "chain"

    def __init__(self, samplers: Iterable[Sampler] = (), *, tracker: Tracker | None = None) -> None:
        self.samplers: list[Sampler] = []
        for s in expect_iterable("samplers", samplers, "an iterable of samplers"):
            self.add(s)
        self.tracker = _check_tracker(tracker)

    def add(self, sampler: Sampler) -> SamplerChain:
        """Append ``sampler`` (returns the chain, for chaining calls)."""
        if not isinstance(sampler, Sampler):
            raise type_error("sampler", "a samplers.Sampler", sampler)
        if sampler is self:
            raise ValueError("a chain cannot contain itself")
        self.samplers.append(sampler)
        return self

    def __len__(self) -> int:
        return len(self.samplers)

    def __getitem__(self, i: int) -> Sampler:
        return self.samplers[i]

    def __iter__(self) -> Iterator[Sampler]:
        return iter(self.samplers)

    def __repr__(self) -> str:
        return f"SamplerChain([{', '.join(map(repr, self.samplers))}])"

    def apply(self, cands: Candidates) -> None:
        check_candidates(cands)
        for s in self.samplers:
            s.apply(cands)

    def accept(self, token: int) -> None:
        token = expect_int("token", token)
        for s in self.samplers:
            s.accept(token)

    def reset(self) -> None:
        for s in self.samplers:
            s.reset()
        if self.tracker is not None:
            self.tracker.reset()

    def clone(self) -> SamplerChain:
        return SamplerChain(
            [s.clone() for s in self.samplers], tracker=self.tracker.clone() if self.tracker is not None else None
        )

    def native(self) -> LlamaSampler:
        """llama.cpp's chain of each sampler's :meth:`~samplers.base.Sampler.native` (fresh state)."""
        return LlamaSampler.chain([s.native() for s in self.samplers])

    def choose(self, cands: Candidates, row: np.ndarray | None, surprisal: bool = True) -> tuple[int, float | None]:
        """Select a token from candidates freshly reset to ``row`` (apply, select, with the
        fast path for constraints) without accepting it. Returns the token and its
        sampling-level surprisal (nats, under the final candidates), or None when not
        asked for, or when the final candidates are still the untouched row (then it
        equals the model-level surprisal, which the caller computes anyway). ``row`` may
        be None when the candidates were set otherwise (a row's top-k, found beforehand)
        and no sampler of the chain checks tokens (a grammar)."""
        check_candidates(cands)
        if row is not None and not isinstance(row, np.ndarray):
            raise type_error("row", "a row of logits (a numpy array) or None", row)
        if surprisal is not True and surprisal is not False:
            surprisal = expect_bool("surprisal", surprisal)
        checks = [c for c in (getattr(s, "allows", None) for s in self.samplers) if c is not None]
        if checks:
            if row is None:
                raise ValueError("a chain with a grammar needs the whole row to choose from")
            for s in self.samplers:
                if getattr(s, "allows", None) is None:
                    s.apply(cands)
            token = selected_token(cands, self)
            if not all(check(token) for check in checks):
                cands.reset(row)
                for s in self.samplers:
                    s.apply(cands)
                token = selected_token(cands, self)
                if not all(check(token) for check in checks):
                    # every candidate is masked: the selector fell back to an arbitrary one
                    raise SamplingError(
                        f"no token is allowed: a constraint of {self!r} rejects every candidate "
                        "(a grammar that has ended, e.g. after an end-of-generation token)"
                    )
        else:
            for s in self.samplers:
                s.apply(cands)
            token = selected_token(cands, self)
        if not surprisal or (cands._src is row and cands._identity):
            return token, None
        return token, surprisal_of(cands.read_logits(), cands.selected)

    def sample(self, ctx: Context, idx: int = -1) -> int:
        check_context(ctx)
        if type(idx) is not int:
            idx = expect_int("idx", idx)
        cands = candidates_for(ctx)
        row: np.ndarray | None = None
        try:
            row = np.asarray(ctx.logits(idx))
            cands.reset(row)
            token, sampling = self.choose(cands, row, self.tracker is not None)
            if self.tracker is not None:
                model = surprisal_of(row, token)
                self.tracker.add(model, model if sampling is None else sampling)
        finally:
            row = None
            cands.release()
        for s in self.samplers:
            s.accept(token)
        return token
