"""llama.cpp's own samplers behind the :class:`~samplers.base.Sampler` interface.

:class:`NativeSampler` adapts one :class:`llama_cffi.sampling.LlamaSampler` (its
:meth:`~NativeSampler.apply` copies :class:`~samplers.candidates.Candidates` into a
``llama_token_data_array`` and back); :class:`NativeSamplerChain` builds llama.cpp's chain
from Python samplers (through their ``native()``) or native ones. ``sample(ctx)`` runs
entirely in llama.cpp on the context's logits: choose it for speed, the Python samplers
for hackability. Both refuse what would crash llama.cpp (see :mod:`llama_cffi.sampling`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from llama_cffi._args import expect, expect_bool, expect_int, expect_iterable, type_error
from llama_cffi.sampling import LlamaSampler, TokenDataArray

from .base import Sampler, check_context
from .candidates import Candidates, check_candidates

if TYPE_CHECKING:
    from llama_cffi import Context


class NativeSampler(Sampler):
    """One llama.cpp sampler as a :class:`~samplers.base.Sampler` (owns ``sampler``)."""

    def __init__(self, sampler: LlamaSampler) -> None:
        self.sampler = expect("sampler", sampler, LlamaSampler, "a llama_cffi LlamaSampler")
        self.name = sampler.name
        self._tda: TokenDataArray | None = None

    def __repr__(self) -> str:
        return f"NativeSampler({self.sampler.name!r})"

    def apply(self, cands: Candidates) -> None:
        check_candidates(cands)
        n = cands.size
        tda = self._tda
        if tda is None or tda.capacity < n:
            tda = self._tda = TokenDataArray(max(n, 1))
        tda.fill(cands.read_ids(), cands.read_logits(), cands.p if cands.has_p else None, cands.sorted)
        self.sampler.apply(tda)
        cands.assign(tda.ids, tda.logits, tda.p, tda.sorted)
        cands.selected = tda.selected

    def accept(self, token: int) -> None:
        token = expect_int("token", token)
        self.sampler.accept(token)

    def reset(self) -> None:
        self.sampler.reset()

    def clone(self) -> NativeSampler:
        return NativeSampler(self.sampler.clone())

    def native(self) -> LlamaSampler:
        return self.sampler.clone()

    @property
    def seed(self) -> int:
        return self.sampler.seed

    def sample(self, ctx: Context, idx: int = -1) -> int:
        check_context(ctx)
        if type(idx) is not int:
            idx = expect_int("idx", idx)
        return self.sampler.sample(ctx, idx)

    def close(self) -> None:
        """Free the native sampler now (otherwise it is freed with this object)."""
        self.sampler.close()


class NativeSamplerChain(NativeSampler):
    """llama.cpp's sampler chain over ``samplers`` (Python samplers are converted with
    their ``native()``; :class:`LlamaSampler` objects are moved into the chain)."""

    def __init__(self, samplers: Iterable[Sampler | LlamaSampler] = (), no_perf: bool = True) -> None:
        items = list(expect_iterable("samplers", samplers, "an iterable of samplers (Sampler or LlamaSampler)"))
        no_perf = expect_bool("no_perf", no_perf)
        for s in items:
            if not isinstance(s, (Sampler, LlamaSampler)):
                raise type_error("samplers", "an iterable of samplers (Sampler or LlamaSampler)", s)
        members = [s if isinstance(s, LlamaSampler) else s.native() for s in items]
        super().__init__(LlamaSampler.chain(members, no_perf=no_perf))

    def __len__(self) -> int:
        return len(self.sampler)

    def __repr__(self) -> str:
        return f"NativeSamplerChain([{', '.join(repr(self.sampler[i].name) for i in range(len(self)))}])"
