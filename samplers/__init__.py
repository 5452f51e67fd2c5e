"""Pure-Python (numpy) sampling and measurement over :class:`llama_cffi.Context`.

Samplers mirror llama.cpp's (``src/llama-sampler.cpp``) one for one and are tested
against them; compose them with :class:`SamplerChain`, or run llama.cpp's own through
:class:`NativeSamplerChain`. ``llama_cffi`` never imports this package.

    chain = SamplerChain([TopK(40), TopP(0.95), MinP(0.05), Temperature(0.8), Dist(seed=1)])
    token = chain.sample(ctx)          # apply, select, accept

:class:`SamplingParams` holds llama.cpp's sampling options (its names, defaults and
order) and is taken wherever a sampler is (``sampler=``); :meth:`SamplingParams.from_model`
starts from the model's own settings.

Measurement: :func:`surprisal`, :func:`entropy`, :class:`PerplexityTracker`, and the
corpus perplexity of ``llama-perplexity`` in :mod:`samplers.perplexity` (also
``python -m llama_cffi perplexity``).

Speculative decoding: :class:`PromptLookup` and :class:`DraftModel` drafters for
``stream``/``generate``/``best_of_n`` (:mod:`samplers.search`) and
:meth:`Branch.speculate <samplers.branch.Branch.speculate>`; exact (:mod:`samplers.speculative`).
"""

from llama_cffi.sampling import InvalidLogitsError, SamplingError

from .adaptive import AdaptiveP
from .base import Sampler, candidates_for
from .bias import LogitBias
from .candidates import Candidates
from .chain import SamplerChain
from .dry import DRY
from .infill import Infill
from .measure import PerplexityTracker, entropy, surprisal
from .mirostat import Mirostat, MirostatV2
from .native import NativeSampler, NativeSamplerChain
from .params import SamplingParams
from .penalties import Penalties
from .selection import Dist, Greedy
from .speculative import Draft, Drafter, DraftModel, PromptLookup, SpeculativeStats, speculative_step
from .temperature import Temperature, TempExt
from .truncation import XTC, MinP, TopK, TopNSigma, TopP, Typical

__all__ = [
    "DRY",
    "XTC",
    "AdaptiveP",
    "Candidates",
    "Dist",
    "Draft",
    "DraftModel",
    "Drafter",
    "Greedy",
    "Infill",
    "InvalidLogitsError",
    "LogitBias",
    "MinP",
    "Mirostat",
    "MirostatV2",
    "NativeSampler",
    "NativeSamplerChain",
    "Penalties",
    "PerplexityTracker",
    "PromptLookup",
    "Sampler",
    "SamplerChain",
    "SamplingError",
    "SamplingParams",
    "SpeculativeStats",
    "TempExt",
    "Temperature",
    "TopK",
    "TopNSigma",
    "TopP",
    "Typical",
    "candidates_for",
    "entropy",
    "speculative_step",
    "surprisal",
]
