"""Hypothesis strategies for property tests of code built on :mod:`samplers`.

* :func:`sampler_chains`: :class:`~samplers.SamplerChain` objects with valid, varied
  parameters (degenerate no-op values included), ending in a selecting sampler.
* :func:`grammars_with_examples`: GBNF grammars with strings they accept and near misses
  they reject (:class:`GrammarExample`), from a small generative grammar model.
* :func:`json_schemas`: JSON schemas with instances they accept (:class:`SchemaExample`).
* :func:`chat_messages`, :func:`tool_specs`, :func:`tool_calls`: OpenAI-style
  conversations (system, user and assistant messages; text parts; tool calls and their
  results), function specs, and calls whose arguments fit their spec.
* :class:`BranchMachine`: a hypothesis state machine of a
  :class:`~samplers.branch.BranchStore` (tree, ids, KV cells, logits against fresh
  decodes) to run against your model or extend with your own rules.

This is a subpackage; its parts are private modules, and everything is imported from
``samplers.testing`` itself. Rows of logits, token sequences and the tiny test model are
in :mod:`llama_cffi.testing` (``llama_cffi`` never imports ``samplers``). hypothesis is
imported when a strategy is asked for, so this package imports without it. A property
test::

    from hypothesis import given
    from llama_cffi.testing import logits_rows
    from samplers import Candidates
    from samplers.testing import sampler_chains

    @given(logits_rows(), sampler_chains())
    def test_a_chain_selects_a_token(row, chain):
        cands = Candidates.from_logits(row)
        chain.apply(cands)
        assert 0 <= cands.token < len(row)
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any

from llama_cffi._args import expect_int, expect_iterable, type_error
from llama_cffi.testing import floats32

from ..adaptive import AdaptiveP
from ..base import Sampler
from ..bias import LogitBias
from ..chain import SamplerChain
from ..mirostat import Mirostat, MirostatV2
from ..penalties import Penalties
from ..selection import Dist, Greedy
from ..temperature import Temperature, TempExt
from ..truncation import XTC, MinP, TopK, TopNSigma, TopP, Typical
from ._chat import chat_messages, tool_calls, tool_specs
from ._grammars import GrammarExample, GrammarExampleMismatch, grammars_with_examples
from ._hypothesis import _require_hypothesis
from ._schemas import SchemaExample, json_schemas

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from ._branch_machine import BranchMachine as BranchMachine
    from ._branch_machine import Node as Node

__all__ = [
    "FILTERS",
    "SELECTORS",
    "BranchMachine",
    "GrammarExample",
    "GrammarExampleMismatch",
    "Node",
    "SchemaExample",
    "chat_messages",
    "grammars_with_examples",
    "json_schemas",
    "sampler_chains",
    "tool_calls",
    "tool_specs",
]


# --------------------------------------------------------------------------- sampler chains
#: Samplers :func:`sampler_chains` may put before the selector, by llama.cpp name.
#: ``logit-bias`` needs ``n_vocab``. DRY and infill need a model and are not drawn.
FILTERS: tuple[str, ...] = (
    "top-k", "top-p", "min-p", "typical", "top-n-sigma", "xtc", "temp", "temp-ext", "penalties", "logit-bias",
)  # fmt: skip
#: Selecting samplers :func:`sampler_chains` may end a chain with. ``mirostat`` needs ``n_vocab``.
SELECTORS: tuple[str, ...] = ("greedy", "dist", "mirostat", "mirostat-v2", "adaptive-p")
_NEED_N_VOCAB = frozenset({"logit-bias", "mirostat"})
_MAX_SEED = 2**32 - 2  # 2**32 - 1 is LLAMA_DEFAULT_SEED: a random seed, not reproducible


def _names(given: Collection[str] | None, known: tuple[str, ...], what: str, n_vocab: int | None) -> list[str]:
    if given is None:
        return [n for n in known if n_vocab is not None or n not in _NEED_N_VOCAB]
    names = list(expect_iterable(f"{what}s", given, f"a collection of {what} names or None"))
    for n in names:
        if n not in known:
            raise ValueError(f"unknown {what} {n!r}: choose from {', '.join(known)}")
        if n in _NEED_N_VOCAB and n_vocab is None:
            raise ValueError(f"{what} {n!r} needs n_vocab")
    return names


def sampler_chains(
    n_vocab: int | None = None,
    *,
    min_filters: int = 0,
    max_filters: int = 4,
    filters: Collection[str] | None = None,
    selectors: Collection[str] | None = None,
) -> SearchStrategy[SamplerChain]:
    """Fresh :class:`~samplers.SamplerChain` objects (owned by the test): ``min_filters``
    to ``max_filters`` samplers named in ``filters`` (default: all of :data:`FILTERS`
    that can be built), in any order, repeats allowed, then one selecting sampler named
    in ``selectors`` (default: all usable :data:`SELECTORS`).

    ``n_vocab`` is the vocabulary size the chain will sample from (rows of that length);
    without it, samplers that need it (``logit-bias``, ``mirostat``) are left out. Every
    parameter is valid and reproducible: seeds in ``[0, 2**32 - 2]``, probabilities in
    ``[0, 1]``, temperatures ``0`` (greedy), ``1`` (no-op) or in ``[0.125, 4]``, the
    documented no-op values (``k <= 0``, ``p >= 1``, ``last_n`` 0) included; logit biases
    are finite (in ``[-10, 10]``); a ``penalties`` sampler comes with up to 8 accepted
    history tokens. On a row of :func:`llama_cffi.testing.logits_rows` a drawn chain
    selects a token without raising (``chain.apply(Candidates.from_logits(row))``).
    That token can be a masked (``-inf``) one exactly where llama.cpp's would be too:
    ``XTC(t=0)`` keeps only the least likely candidate, and selectors then see only
    ``-inf`` logits (numpy may warn about them: ``np.errstate(invalid="ignore")``).
    """
    _require_hypothesis()
    from hypothesis import strategies as st

    if n_vocab is not None and (isinstance(n_vocab, bool) or not isinstance(n_vocab, int)):
        raise type_error("n_vocab", "None or an int >= 1", n_vocab)
    if n_vocab is not None and n_vocab < 1:
        raise ValueError(f"n_vocab must be None or an int >= 1, not {n_vocab!r}")
    min_filters, max_filters = expect_int("min_filters", min_filters), expect_int("max_filters", max_filters)
    if not 0 <= min_filters <= max_filters:
        raise ValueError(f"need 0 <= min_filters <= max_filters, not {min_filters}, {max_filters}")
    filter_names = _names(filters, FILTERS, "filter", n_vocab)
    selector_names = _names(selectors, SELECTORS, "selector", n_vocab)
    if not selector_names:
        raise ValueError("selectors must name at least one selecting sampler")
    if not filter_names and min_filters > 0:
        raise ValueError("filters is empty but min_filters > 0")

    prob = floats32(0.0, 1.0)
    min_keep = st.integers(0, 4)
    seed = st.integers(0, _MAX_SEED)
    vocab_hi = (n_vocab or 64) - 1

    def one(name: str) -> SearchStrategy[Sampler]:
        if name == "top-k":
            return st.builds(TopK, st.integers(-1, 64))
        if name == "top-p":
            return st.builds(TopP, prob, min_keep)
        if name == "min-p":
            return st.builds(MinP, prob, min_keep)
        if name == "typical":
            return st.builds(Typical, prob, min_keep)
        if name == "top-n-sigma":
            return st.builds(TopNSigma, floats32(-1.0, 4.0))
        if name == "xtc":
            return st.builds(XTC, prob, floats32(0.0, 0.625), min_keep, seed)
        if name == "temp":
            return st.builds(Temperature, st.sampled_from((1.0, 0.0)) | floats32(0.125, 4.0))
        if name == "temp-ext":
            return st.builds(TempExt, floats32(0.0, 3.0), floats32(-1.0, 2.0), floats32(0.125, 3.0))
        if name == "penalties":
            return st.builds(
                _penalties,
                st.integers(-1, 16),
                floats32(0.5, 2.0),
                floats32(-1.0, 1.0),
                floats32(-1.0, 1.0),
                st.just(n_vocab or 1),
                st.lists(st.integers(0, vocab_hi), max_size=8),
            )
        if name == "logit-bias":
            assert n_vocab is not None
            return st.builds(
                LogitBias,
                st.just(n_vocab),
                st.dictionaries(st.integers(0, n_vocab - 1), floats32(-10.0, 10.0), max_size=8),
            )
        if name == "greedy":
            return st.just(None).map(lambda _: Greedy())
        if name == "dist":
            return st.builds(Dist, seed)
        tau, eta = floats32(1.0, 8.0), floats32(0.015625, 1.0)
        if name == "mirostat":
            assert n_vocab is not None
            return st.builds(Mirostat, st.just(n_vocab), seed, tau, eta, st.integers(1, 100))
        if name == "mirostat-v2":
            return st.builds(MirostatV2, seed, tau, eta)
        assert name == "adaptive-p"
        return st.builds(AdaptiveP, floats32(-0.5, 1.0), floats32(0.0, 0.99), seed)

    selector = st.one_of([one(n) for n in selector_names])
    if filter_names:
        body = st.lists(st.one_of([one(n) for n in filter_names]), min_size=min_filters, max_size=max_filters)
    else:
        body = st.just([])
    return st.builds(lambda fs, s: SamplerChain([*fs, s]), body, selector)


def _penalties(
    last_n: int, repeat: float, freq: float, present: float, n_vocab: int, history: Iterable[int]
) -> Penalties:
    p = Penalties(last_n, repeat, freq, present, n_vocab)
    for t in history:
        p.accept(t)
    return p


def __getattr__(name: str) -> Any:
    # The state machine subclasses hypothesis's RuleBasedStateMachine: imported when asked
    # for, so that this package imports without hypothesis.
    if name in ("BranchMachine", "Node"):
        _require_hypothesis()
        from . import _branch_machine

        return getattr(_branch_machine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *("BranchMachine", "Node")})
