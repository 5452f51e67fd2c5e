"""Valid values for the every-parameter wrong-type audit of ``samplers`` (issue 44).

:mod:`tests.wrong_types_child` loads these tables (``_load_value_tables``): ``FIRST``
gives a valid first argument where its annotation does not, ``REST_PARAMS`` valid values
for the required parameters after it where ``REST`` (made for the first parameter's
audit) does not suit, and ``ANY_VALUE`` the parameters for which any value is right, with
the reason. Importing this module makes nothing: every value is made by its lambda, in the
child, from its :class:`~tests.wrong_types_child.Env`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["ANY_VALUE", "FIRST", "REST_PARAMS"]

Env = Any  # tests.wrong_types_child.Env (not imported: the child imports this module)

#: A text long enough for the perplexity and KL-divergence functions with ``n_ctx=16``.
LONG_TEXT = "Hello world, hello world. " * 40


def _m(name: str) -> Any:
    return importlib.import_module(name)


def _np() -> Any:
    return _m("numpy")


def _f32(n: int) -> Any:
    return _np().zeros(n, dtype=_np().float32)


def _parsed(text: str = 'root ::= "a"') -> Any:
    return _m("llama_cffi.gbnf").parse_gbnf(text)


def _sampling_args(e: Env) -> Any:
    """The options ``SamplingParams.add_arguments`` defines, parsed from no arguments."""
    import argparse

    parser = argparse.ArgumentParser()
    _m("samplers.params").SamplingParams.add_arguments(parser)
    return parser.parse_args([])


def _perplexity_args(e: Env) -> Any:
    """``llama-cffi perplexity``'s options, scoring a text file with the tiny model."""
    import argparse

    parser = argparse.ArgumentParser()
    _m("samplers.perplexity").add_arguments(parser)
    path = f"{e.folder}/long.txt"
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(LONG_TEXT)
    return parser.parse_args(["-m", e.path, "-f", path, "-c", "16", "-b", "32"])


def _kl_base(e: Env) -> Any:
    """A KL-divergence base file written by the tiny model (once), read back."""

    def make() -> Any:
        kl = _m("samplers.kl_divergence")
        path = f"{e.folder}/base.kld"
        kl.write_kl_base(e.model, LONG_TEXT, path, n_ctx=16, n_batch=32)
        return kl.read_kl_base(path)

    return e.once("kl_base", make)


def _tool() -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


def _tool_format() -> Any:
    return _m("samplers.tools").ToolCallFormat("<tool_call>", "</tool_call>", "name", "arguments")


def _chat_session(e: Env) -> Any:
    return _m("samplers.chat").ChatSession(e.context(n_seq_max=1), max_tokens=16)


_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}

#: A valid first argument, where :func:`tests.wrong_types_child._first_value`'s reading of
#: the annotation gives none or a wrong one.
FIRST: dict[str, Callable[[Env], Any]] = {
    "samplers.branch.Branch.set_sampler": lambda e: None,
    "samplers.branch.BranchStore.commit": lambda e: {},
    "samplers.branch.BranchStore.step": lambda e: {},
    "samplers.candidates.Candidates.assign": lambda e: _np().zeros(1, dtype=_np().int32),
    "samplers.candidates.Candidates.from_arrays": lambda e: _np().zeros(1, dtype=_np().int32),
    "samplers.candidates.Candidates.keep": lambda e: _np().zeros(1, dtype=_np().intp),
    "samplers.candidates.check_candidates": lambda e: e.candidates(),
    "samplers.candidates.seq_sum": lambda e: _f32(8),
    "samplers.chain_batch.choose": lambda e: (("top_k", 1), ("greedy",)),
    "samplers.chain_batch.choose_constrained": lambda e: (("top_k", 1), ("greedy",)),
    "samplers.chat.ChatSession.add_tool_result": lambda e: _m("samplers.tools").ToolCall("f", "{}"),
    "samplers.chat.ChatStream": _chat_session,
    "samplers.cli.build_chain": _sampling_args,
    "samplers.distributed.Workers": lambda e: e.path,
    "samplers.distributed.Workers.map_generate": lambda e: ["Hello"],
    "samplers.distributed.Workers.perplexity": lambda e: LONG_TEXT,
    "samplers.distributed.map_generate": lambda e: e.path,
    "samplers.distributed.perplexity": lambda e: e.path,
    "samplers.grammar.builtin.json_schema": lambda e: _SCHEMA,
    "samplers.grammar.compiled.CompiledGrammar": lambda e: e.grammar().compile(e.vocab).engine,
    "samplers.grammar.engine.Engine": lambda e: _parsed(),
    "samplers.grammar.engine.decode_utf8": lambda e: b"abc",
    "samplers.grammar.gbnf.rule_renumbering": lambda e: _parsed(),
    "samplers.grammar.grammar.Grammar": lambda e: _parsed(),
    "samplers.grammar.grammar.Grammar.compile": lambda e: e.vocab,
    "samplers.grammar.grammar.Grammar.from_gbnf": lambda e: 'root ::= "a"',
    "samplers.grammar.json_schema.json_schema_to_gbnf": lambda e: _SCHEMA,
    "samplers.grammar.json_schema.llama_cpp_json_schema_to_gbnf": lambda e: _SCHEMA,
    "samplers.grammar.masks.fill_masks": lambda e: [e.grammar().matcher(e.vocab)],
    "samplers.grammar.sampler.GrammarSampler": lambda e: e.grammar(),
    "samplers.grammar.sampler.GrammarSampler.allows_many": lambda e: [
        _m("samplers.grammar").GrammarSampler(e.grammar(), e.model)
    ],
    "samplers.grammar.schema.schema_to_gbnf": lambda e: _SCHEMA,
    "samplers.grammar.vocab_index.VocabIndex": lambda e: [b"a", b"b", b"ab"],
    "samplers.grammar.vocab_index.VocabIndex.of": lambda e: e.vocab,
    "samplers.harness.HarnessBackend": lambda e: e.path,
    "samplers.kl_divergence.kl_plan": lambda e: 64,
    "samplers.measure.PerplexityTracker.add_token": lambda e: _f32(e.n_vocab),
    "samplers.measure.entropy": lambda e: _f32(e.n_vocab),
    "samplers.measure.surprisal": lambda e: _f32(e.n_vocab),
    "samplers.params.SamplingParams.from_args": _sampling_args,
    "samplers.params.as_sampler": lambda e: _m("samplers.params").SamplingParams(),
    "samplers.perplexity.Accumulator": lambda e: e.plan(),
    "samplers.perplexity.plan": lambda e: 64,
    "samplers.perplexity.Scorer.group": lambda e: _np().ones(64, dtype=_np().int32),
    "samplers.perplexity.run_cli": _perplexity_args,
    "samplers.prompt_cache.PromptCache.retry": lambda e: lambda: 1,
    "samplers.reasoning.ReasoningBudget": lambda e: [[1, 2]],
    "samplers.tools.tool_call_grammar": lambda e: _tool_format(),
}

#: (positional arguments after the first, keywords) where ``REST``'s do not suit.
REST_PARAMS: dict[str, Callable[[Env], tuple[tuple[Any, ...], dict[str, Any]]]] = {
    "samplers.chain_batch.choose": lambda e: (
        (
            [_m("samplers").SamplerChain([_m("samplers").TopK(1), _m("samplers").Greedy()])],
            _np().zeros((1, 1), dtype=_np().int32),
            _np().zeros((1, 1), dtype=_np().float32),
            False,
        ),
        {},
    ),
    "samplers.chain_batch.choose_constrained": lambda e: (
        (
            [_m("samplers").SamplerChain([_m("samplers").TopK(1), _m("samplers").Greedy()])],
            _np().zeros((1, 1), dtype=_np().int32),
            _np().zeros((1, 1), dtype=_np().float32),
            lambda r: _f32(1),
            False,
        ),
        {},
    ),
    "samplers.chat.ChatSession.stream": lambda e: ((), {"max_tokens": 4}),
    "samplers.chat.ChatStream": lambda e: ((_m("samplers.search").stream(e.branch(), 2), 0, 0), {}),
    "samplers.distributed.Workers.perplexity": lambda e: ((), {"n_ctx": 16, "n_batch": 32}),
    "samplers.distributed.perplexity": lambda e: ((LONG_TEXT, 16, 32), {"workers": 1, "cpus_per_worker": 0.5}),
    "samplers.distributed.map_generate": lambda e: ((["Hello"],), {"workers": 1, "cpus_per_worker": 0.5}),
    "samplers.evals.multiple_choice": lambda e: (
        ([_m("samplers.evals").MultipleChoiceTask("Is it?", ("yes", "no"), (1, 0))],),
        {},
    ),
    "samplers.grammar.grammar.Grammar.from_gbnf": lambda e: ((), {}),
    "samplers.grammar.sampler.GrammarSampler": lambda e: ((e.model,), {}),
    "samplers.kl_divergence.kl_divergence": lambda e: ((_kl_base(e),), {}),
    "samplers.kl_divergence.write_kl_base": lambda e: ((LONG_TEXT, "out.kld"), {"n_ctx": 16, "n_batch": 32}),
    "samplers.perplexity.perplexity": lambda e: ((LONG_TEXT, 16, 32), {}),
    "samplers.tools.tool_call_grammar": lambda e: (([_tool()],), {}),
}

#: "callable:param" -> why any value is right for it (the audit leaves these out).
ANY_VALUE: dict[str, str] = {
    **{
        f"samplers.harness.HarnessBackend:{name}": (
            "one of lm-eval's model arguments (batch_size, max_batch_size, device), which lm-eval passes to every "
            "backend whatever their type (an int, 'auto', 'cuda', None...); documented as accepted and not used"
        )
        for name in ("batch_size", "max_batch_size", "device")
    },
}
