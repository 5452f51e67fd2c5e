"""The public callables of llama_cffi and samplers, and a child process that calls each
with a wrong-typed first argument (for ``tests/test_wrong_types.py``).

What is public: every function and class a public module (no part of its dotted name
starts with ``_``) names in ``__all__``, or, without ``__all__``, defines under a name
without a leading underscore; for a class, its constructor and every method, classmethod
and staticmethod its body defines under such a name. Each callable is counted once, where
it is defined. Left out, each for a reason the table :data:`NOT_CALLED` gives: exceptions
and enums (Python's own constructors), records whose constructor is the one dataclasses or
NamedTuple generate (no code of ours runs), the cffi callbacks C calls (``extern
"Python"``: their names and arguments are fixed by the C declarations), and the rules and
invariants of the hypothesis state machines (hypothesis calls them, with what its
strategies drew).

The child (``python -m tests.wrong_types_child CASES_JSON``) builds what the methods need
(a tiny model, a context, a branch store, a grammar...), calls each case with
:class:`WrongType` as its first parameter (positional, or by keyword when the parameter is
keyword-only; the other required parameters get valid values from :data:`REST`) and prints
one ``RESULT`` line per case: the exception's type names (its MRO) and message, or that
nothing was raised. ``CASE`` lines before each call let the parent tell which call a crash
ended.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import json
import os
import pkgutil
import sys
from collections.abc import Callable, Iterator
from typing import Any

PACKAGES = ("llama_cffi", "samplers")


class WrongType:
    """The wrong-typed argument: an instance of a class no parameter accepts."""

    def __repr__(self) -> str:
        return "<WrongType>"


WRONG = WrongType()


@dataclasses.dataclass(frozen=True)
class Case:
    id: str  # module.Qual.name of the callable
    module: str
    owner: str | None  # the class's qualname, for a method or a constructor
    attr: str | None  # the method's name (None: the function itself, or the constructor)
    kind: str  # "function", "constructor", "method", "classmethod", "staticmethod"
    param: str  # the first parameter's name
    keyword_only: bool


def public_modules() -> list[str]:
    out = []
    for top in PACKAGES:
        pkg = importlib.import_module(top)
        out.append(top)
        for info in pkgutil.walk_packages(pkg.__path__, top + "."):
            if not any(part.startswith("_") for part in info.name.split(".")):
                out.append(info.name)
    return sorted(out)


def _public_objects() -> Iterator[tuple[str, Any]]:
    seen: set[int] = set()
    for modname in public_modules():
        mod = importlib.import_module(modname)
        if hasattr(mod, "__all__"):
            names = list(mod.__all__)
        else:
            names = [
                n for n, v in vars(mod).items() if not n.startswith("_") and getattr(v, "__module__", None) == modname
            ]
        for name in names:
            obj = getattr(mod, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if getattr(obj, "__module__", "").split(".")[0] not in PACKAGES or id(obj) in seen:
                continue
            seen.add(id(obj))
            yield f"{obj.__module__}.{obj.__qualname__}", obj


def _first_param(fn: Callable[..., Any], bound: bool) -> inspect.Parameter | None:
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if bound:
        params = params[1:]
    return params[0] if params else None


def _generated_init(cls: type) -> bool:
    """A record whose constructor is the one dataclasses or NamedTuple generate."""
    if dataclasses.is_dataclass(cls):
        post_init = any("__post_init__" in vars(c) for c in cls.__mro__)
        return not post_init and cls.__init__.__code__.co_filename.startswith("<")  # made by exec, not written
    return issubclass(cls, tuple) and hasattr(cls, "_fields")


def _state_machine_rule(fn: Any) -> bool:
    return any(a.startswith("hypothesis_stateful_") for a in dir(fn))


def all_callables() -> tuple[list[Case], dict[str, str]]:
    """(the cases, {callable: why it is not called}): every public callable with a
    first parameter is a case, or is left out with its reason."""
    cases: list[Case] = []
    left: dict[str, str] = {}

    def add(case_id: str, module: str, owner: str | None, attr: str | None, kind: str, fn: Any, bound: bool) -> None:
        p = _first_param(fn, bound)
        if p is None:
            left[case_id] = "takes no argument"
            return
        cases.append(Case(case_id, module, owner, attr, kind, p.name, p.kind == inspect.Parameter.KEYWORD_ONLY))

    for qual, obj in _public_objects():
        module = obj.__module__
        if inspect.isfunction(obj):
            if obj.__name__.startswith("llama_cffi_") and obj.__name__.endswith("_py"):
                left[qual] = 'a cffi callback (extern "Python"): C calls it, with the arguments its declaration fixes'
                continue
            add(qual, module, None, None, "function", obj, False)
            continue
        if issubclass(obj, BaseException):
            left[qual] = "an exception class"
            continue
        if issubclass(obj, enum.Enum):
            left[qual] = "an enum (Python's constructor: looked up by value)"
            continue
        if getattr(obj, "_is_protocol", False):
            left[qual] = "a typing.Protocol: it describes what other objects provide (its methods are stubs)"
            continue
        if _generated_init(obj):
            left[qual] = "a record: its constructor is generated by dataclasses or NamedTuple"
        elif inspect.isfunction(obj.__init__):
            add(qual, module, obj.__qualname__, None, "constructor", obj.__init__, True)
        else:
            left[qual] = "takes no argument"
        for name, raw in vars(obj).items():
            if name.startswith("_"):
                continue
            kind = (
                "staticmethod"
                if isinstance(raw, staticmethod)
                else "classmethod"
                if isinstance(raw, classmethod)
                else "method"
            )
            fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
            if not inspect.isfunction(fn):
                continue
            case_id = f"{qual}.{name}"
            if _state_machine_rule(fn):
                left[case_id] = "a rule or invariant of a hypothesis state machine: hypothesis calls it"
                continue
            add(case_id, module, obj.__qualname__, name, kind, fn, kind != "staticmethod")
    return cases, left


# ---------------------------------------------------------------------- the child
def _m(name: str) -> Any:
    return importlib.import_module(name)


class Env:
    """What the cases need, made on first use: the tiny model (and its file), contexts,
    stores, a grammar... Every instance a case calls a method on is fresh."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._memo: dict[str, Any] = {}

    def once(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    @property
    def path(self) -> str:
        from llama_cffi.testing import write_tiny_model

        return str(self.once("path", lambda: write_tiny_model(f"{self.folder}/tiny.gguf")))

    @property
    def model(self) -> Any:
        import llama_cffi

        return self.once("model", lambda: llama_cffi.Model.load(self.path))

    @property
    def vocab(self) -> Any:
        return self.model.vocab

    @property
    def n_vocab(self) -> int:
        return int(self.model.n_vocab)

    def context(self, **kw: Any) -> Any:
        ctx = self.model.context(**{"n_ctx": 256, "n_seq_max": 4, "kv_unified": True, **kw})
        self._memo.setdefault("kept", []).append(ctx)  # alive while what was made from it is used
        return ctx

    def prompt(self) -> list[int]:
        return [int(t) for t in self.model.tokenize("Hello world")]

    def store(self) -> Any:
        from samplers.branch import BranchStore

        return BranchStore(self.context())

    def branch(self) -> Any:
        return self.store().create(self.prompt())

    def grammar(self) -> Any:
        from samplers.grammar import Grammar

        return self.once("grammar", lambda: Grammar.from_gbnf('root ::= "Hello" " world"*'))

    def candidates(self) -> Any:
        import numpy as np

        from samplers.candidates import Candidates

        return Candidates.from_logits(np.linspace(-1, 1, self.n_vocab, dtype=np.float32))

    def view(self) -> Any:
        ctx = self.context()
        return ctx.decode(self.prompt())

    def lora_path(self) -> str:
        from llama_cffi.testing import write_tiny_lora

        return str(self.once("lora", lambda: write_tiny_lora(f"{self.folder}/lora.gguf")))

    def plan(self) -> Any:
        from samplers.perplexity import plan

        return plan(16, 32)


def _machine(env: Env, base: str) -> Any:
    if base == "kv":
        from llama_cffi.testing import KvCacheMachine as Base
    else:
        from samplers.testing import BranchMachine as Base
    machine = type("Machine", (Base,), {"model": env.model})
    return machine()


def _workers(env: Env) -> Any:
    from samplers.distributed import Workers

    return env.once("workers", lambda: Workers(env.path, n_workers=1, cpus_per_worker=0.5))


#: How to make an instance of each class whose methods are cases ("module.Qual" -> maker).
FACTORIES: dict[str, Callable[[Env], Any]] = {
    "llama_cffi.batch.Batch": lambda e: _m("llama_cffi").Batch(8),
    "llama_cffi.context.Context": lambda e: e.context(),
    "llama_cffi.gbnf.ParsedGrammar": lambda e: _m("llama_cffi.gbnf").parse_gbnf('root ::= "a"'),
    "llama_cffi.kernels.RowMeasures": lambda e: _m("llama_cffi.kernels").RowMeasures(e.n_vocab, 2),
    "llama_cffi.lora.LoraAdapter": lambda e: e.model.load_lora(e.lora_path()),
    "llama_cffi.mtmd.Projector": lambda e: e.once(
        "projector",
        lambda: _m("llama_cffi.mtmd").Projector(
            e.model,
            _m("llama_cffi.testing").write_tiny_gemma3_mmproj(f"{e.folder}/g3.gguf", e.model.n_embd_inp),
            warmup=False,
        ),
    ),
    "llama_cffi.memory.Memory": lambda e: e.context().memory,
    "llama_cffi.memory_usage.MemoryUsage": lambda e: e.context().memory_usage(),
    "llama_cffi.model.Model": lambda e: e.model,
    "llama_cffi.outputs.OutputView": lambda e: e.view(),
    "llama_cffi.outputs.OutputBuffer": lambda e: e.view()._buf,
    "llama_cffi.progress.ProgressBar": lambda e: _m("llama_cffi.progress").ProgressBar("x", force=False),
    "llama_cffi.sampling.LlamaSampler": lambda e: _m("llama_cffi.sampling").LlamaSampler.greedy(),
    "llama_cffi.context.Greedy": lambda e: _m("llama_cffi.context").Greedy(),
    "samplers.testing._branch_machine.Node": lambda e: _m("samplers.testing._branch_machine").Node.root(
        0, [1, 2], False
    ),
    "llama_cffi.sampling.TokenDataArray": lambda e: _m("llama_cffi.sampling").TokenDataArray(8),
    "llama_cffi.template_sandbox.TemplateLimits": lambda e: _m("llama_cffi").chat.TemplateLimits(),
    "llama_cffi.threadpool.Threadpool": lambda e: _m("llama_cffi").Threadpool(1),
    "llama_cffi.threadpool.AdaptiveThreads": lambda e: _m("llama_cffi.threadpool").AdaptiveThreads(2, 2, print),
    "llama_cffi.testing._kv_cells.KvCells": lambda e: _m("llama_cffi.testing").KvCells(16),
    "llama_cffi.testing._kv_machine.KvCacheMachine": lambda e: _machine(e, "kv"),
    "llama_cffi.vocab.StopStringStream": lambda e: _m("llama_cffi.vocab").StopStringStream(e.vocab, ["x"]),
    "llama_cffi.vocab.StreamingDetokenizer": lambda e: e.vocab.streaming_detokenizer(),
    "llama_cffi.vocab.Vocab": lambda e: e.vocab,
    "samplers.adaptive.AdaptiveP": lambda e: _m("samplers").AdaptiveP(0.5, seed=1),
    "samplers.base.Sampler": lambda e: _m("samplers").TopK(5),  # the base's own methods, on a sampler
    "samplers.bias.LogitBias": lambda e: _m("samplers").LogitBias(e.n_vocab, {1: 1.0}),
    "samplers.branch.Branch": lambda e: e.branch(),
    "samplers.branch.BranchStore": lambda e: e.store(),
    "samplers.harness.HarnessBackend": lambda e: e.once(
        "harness", lambda: _m("samplers.harness").HarnessBackend(e.path, n_ctx=64, n_parallel=2)
    ),
    "samplers.candidates.Candidates": lambda e: e.candidates(),
    "samplers.prompt_cache.PromptCache": lambda e: _m("samplers.prompt_cache").PromptCache(e.store()),
    "samplers.kl_divergence.KLBase": lambda e: _m("samplers.kl_divergence").KLBase(
        _m("pathlib").Path("x.kld"), 64, e.n_vocab, 1, _np().zeros(64, _np().int32)
    ),
    "samplers.kl_divergence.KLDivergenceResult": lambda e: _m("samplers.kl_divergence").KLDivergenceResult(
        *([0] * 25), (), _np().zeros(1, _np().float32), _np().zeros(1, _np().float32)
    ),
    "samplers.chain.SamplerChain": lambda e: _m("samplers").SamplerChain([_m("samplers").Greedy()]),
    "samplers.chat.ChatSession": lambda e: _m("samplers.chat").ChatSession(e.context(n_seq_max=1)),
    "samplers.distributed.Workers": _workers,
    "samplers.dry.DRY": lambda e: _m("samplers").DRY(0.8, model=e.model),
    "samplers.grammar.compiled.CompiledGrammar": lambda e: e.grammar().compile(e.vocab),
    "samplers.grammar.engine.Engine": lambda e: e.grammar().compile(e.vocab).engine,
    "samplers.grammar.grammar.Grammar": lambda e: e.grammar(),
    "samplers.grammar.matcher.GrammarMatcher": lambda e: e.grammar().matcher(e.vocab),
    "samplers.grammar.sampler.GrammarSampler": lambda e: _m("samplers.grammar").GrammarSampler(e.grammar(), e.model),
    "samplers.grammar.vocab_index.VocabIndex": lambda e: __import__(
        "samplers.grammar.vocab_index"
    ).grammar.vocab_index.VocabIndex.of(e.vocab),
    "samplers.infill.Infill": lambda e: _m("samplers").Infill(e.model),
    "samplers.logprobs.LogprobReader": lambda e: _m("samplers.logprobs").LogprobReader(e.vocab),
    "samplers.measure.PerplexityTracker": lambda e: _m("samplers.measure").PerplexityTracker(),
    "samplers.mirostat.Mirostat": lambda e: _m("samplers").Mirostat(e.n_vocab, seed=1),
    "samplers.mirostat.MirostatV2": lambda e: _m("samplers").MirostatV2(seed=1),
    "samplers.native.NativeSampler": lambda e: _m("samplers.native").NativeSampler(
        _m("llama_cffi.sampling").LlamaSampler.greedy()
    ),
    "samplers.params.SamplingParams": lambda e: _m("samplers.params").SamplingParams(),
    "samplers.penalties.Penalties": lambda e: _m("samplers").Penalties(64, 1.1, 0.0, 0.0),
    "samplers.perplexity.Accumulator": lambda e: _m("samplers.perplexity").Accumulator(e.plan(), 2, 64),
    "samplers.perplexity.Scorer": lambda e: _m("samplers.perplexity").Scorer(
        e.context(n_ctx=64, n_batch=32, n_seq_max=2, kv_unified=False), e.plan()
    ),
    "samplers.search.AsyncStream": lambda e: _m("samplers.search").astream(e.branch(), 4),
    "samplers.search.Stream": lambda e: _m("samplers.search").stream(e.branch(), 4),
    "samplers.chat.ChatStream": lambda e: _m("samplers.chat").ChatSession(e.context(n_seq_max=1)).stream("Hi"),
    "samplers.reasoning.ReasoningBudget": lambda e: _m("samplers.reasoning").ReasoningBudget([[1]], [[2]], [2], 3),
    "samplers.selection.Dist": lambda e: _m("samplers").Dist(1),
    "samplers.selection.Greedy": lambda e: _m("samplers").Greedy(),
    "samplers.speculative.DraftModel": lambda e: _m("samplers.speculative").DraftModel(e.model, n_ctx=256),
    "samplers.speculative.Drafter": lambda e: _m("samplers.speculative").PromptLookup(),
    "samplers.speculative.PromptLookup": lambda e: _m("samplers.speculative").PromptLookup(),
    "samplers.temperature.TempExt": lambda e: _m("samplers").TempExt(0.8, 0.1),
    "samplers.temperature.Temperature": lambda e: _m("samplers").Temperature(0.8),
    "samplers.testing._branch_machine.BranchMachine": lambda e: _machine(e, "branch"),
    "samplers.truncation.MinP": lambda e: _m("samplers").MinP(0.05),
    "samplers.truncation.TopK": lambda e: _m("samplers").TopK(5),
    "samplers.truncation.TopNSigma": lambda e: _m("samplers").TopNSigma(1.0),
    "samplers.truncation.TopP": lambda e: _m("samplers").TopP(0.9),
    "samplers.truncation.Typical": lambda e: _m("samplers").Typical(0.9),
    "samplers.truncation.XTC": lambda e: _m("samplers").XTC(0.5, 0.1, seed=1),
}


def _np() -> Any:
    import numpy as np

    return np


def _f32(n: int) -> Any:
    return _np().zeros(n, dtype=_np().float32)


#: Valid values for the required parameters after the first, per case: ``(args, kwargs)``.
REST: dict[str, Callable[[Env], tuple[tuple[Any, ...], dict[str, Any]]]] = {
    "llama_cffi.backends.os_refuses": lambda e: ((0,), {}),
    "llama_cffi.batch.Batch.set_sequence": lambda e: ((0,), {}),
    "llama_cffi.batch.Batch.add": lambda e: ((0,), {}),
    "llama_cffi.chat.apply_template": lambda e: (([{"role": "user", "content": "hi"}],), {}),
    "llama_cffi.context.Context.eval": lambda e: ((0,), {}),
    "llama_cffi.context.Context.set_backend_sampler": lambda e: (
        (_m("llama_cffi.sampling").LlamaSampler.greedy(),),
        {},
    ),
    "llama_cffi.gbnf.ParsedGrammar": lambda e: (({},), {}),
    "samplers.testing._branch_machine.Node.root": lambda e: (([1], False), {}),
    "llama_cffi.context.Context.rerank": lambda e: ((["a document"],), {}),
    "llama_cffi.enums.coerce": lambda e: ((0, "x"), {}),
    "llama_cffi.gbnf.resolve_tokens": lambda e: ((lambda s: 0,), {}),
    "llama_cffi.kernels.RowMeasures": lambda e: ((2,), {}),
    "llama_cffi.threadpool.AdaptiveThreads": lambda e: ((2, print), {}),
    "llama_cffi.kernels.RowMeasures.compute": lambda e: (([0],), {}),
    "llama_cffi.kernels.RowMeasures.read_device": lambda e: (([0], [0], 0), {}),
    "llama_cffi.kernels.RowMeasures.surprisal": lambda e: ((0.0,), {}),
    "llama_cffi.kernels.RowMeasures.copy_slot": lambda e: ((1,), {}),
    "llama_cffi.kernels.kl_base_rows": lambda e: (([0], _np().zeros((1, 6), _np().uint16)), {}),
    "llama_cffi.kernels.kl_divergence_rows": lambda e: (([0], _np().zeros((1, 6), _np().uint16)), {}),
    "llama_cffi.kernels.rows_log_sum": lambda e: ((_np().array([4], dtype=_np().int32), _f32(1)), {}),
    "llama_cffi.kernels.top_p_rows": lambda e: (
        (_np().ones((1, 4), _np().float32), _np().ones(1, dtype=_np().int32), 0.5, 1),
        {},
    ),
    "llama_cffi.kernels.dist_rows": lambda e: ((_np().ones(1, dtype=_np().int32), _np().zeros(1)), {}),
    "llama_cffi.kernels.softmax_dot": lambda e: ((_f32(4), 0.0), {}),
    "llama_cffi.kernels.softmax_sum": lambda e: ((0.0, _f32(4)), {}),
    "llama_cffi.kernels.top_k_grouped": lambda e: ((_f32(1), 1, _np().zeros(1, dtype=_np().intp)), {}),
    "llama_cffi.kernels.masked_top_k_rows": lambda e: (
        (
            [_np().ones(1, dtype=_np().uint32)],
            1,
            _np().zeros((1, 1), dtype=_np().int32),
            _np().zeros((1, 1), _np().float32),
        ),
        {},
    ),
    "llama_cffi.kernels.masked_top_k": lambda e: (
        (_np().zeros(1, dtype=_np().uint32), 1, _np().zeros(1, dtype=_np().int32), _f32(1)),
        {},
    ),
    "llama_cffi.lora.LoraAdapter": lambda e: ((_m("llama_cffi")._binding.ffi.NULL, e.lora_path()), {}),
    "llama_cffi.lora.normalise_adapters": lambda e: ((e.model,), {}),
    "llama_cffi.memory.Memory.seq_cp": lambda e: ((1,), {}),
    "llama_cffi.memory.Memory.seq_add": lambda e: ((0, -1, 1), {}),
    "llama_cffi.memory.Memory.seq_div": lambda e: ((0, -1, 2), {}),
    "llama_cffi.model.Model": lambda e: ((e.path,), {}),
    "llama_cffi.outputs.OutputBuffer": lambda e: ((_f32(4),), {}),
    "llama_cffi.outputs.OutputView": lambda e: ((0, (4,), e.view()._guard), {}),
    "llama_cffi.sampling.LlamaSampler": lambda e: (("greedy",), {}),
    "llama_cffi.sampling.LlamaSampler.temp_ext": lambda e: ((0.0, 1.0), {}),
    "llama_cffi.sampling.LlamaSampler.xtc": lambda e: ((0.1,), {}),
    "llama_cffi.sampling.LlamaSampler.dry": lambda e: ((0.8,), {}),
    "llama_cffi.sampling.LlamaSampler.logit_bias": lambda e: (({},), {}),
    "llama_cffi.sampling.LlamaSampler.grammar": lambda e: (('root ::= "a"',), {}),
    "llama_cffi.sampling.TokenDataArray.fill": lambda e: ((_f32(1),), {}),
    "llama_cffi.sampling.check_float": lambda e: ((1.0,), {}),
    "llama_cffi.sampling.check_int": lambda e: ((1,), {}),
    "llama_cffi.template_sandbox.render_template": lambda e: (({},), {}),
    "llama_cffi.testing._checks.decode_equivalence": lambda e: (([1, 2], _f32(e.n_vocab)), {}),
    "llama_cffi.testing._kv_cells.KvCells.add_tokens": lambda e: (([0],), {}),
    "llama_cffi.testing._kv_cells.KvCells.cp": lambda e: ((1,), {}),
    "llama_cffi.testing._kv_cells.KvCells.add": lambda e: ((0, -1, 1), {}),
    "llama_cffi.testing._kv_cells.KvCells.div": lambda e: ((0, -1, 2), {}),
    "llama_cffi.testing._kv_machine.KvCacheMachine.tokens": lambda e: ((1,), {}),
    "llama_cffi.testing._kv_machine.KvCacheMachine.decode_and_check": lambda e: (([1], "decode"), {}),
    "llama_cffi.testing._strategies.floats32": lambda e: ((1.0,), {}),
    "llama_cffi.media.Audio": lambda e: ((16000,), {}),
    "samplers.params.as_sampler": lambda e: ((e.model,), {}),
    "samplers.reasoning.ReasoningBudget": lambda e: (([[3]], [3], 2), {}),
    "samplers.reasoning.split_reasoning": lambda e: ((None,), {}),
    "samplers.reasoning.reasoning_budget_for": lambda e: (
        (_m("llama_cffi.chat").ReasoningFormat("<think>", "</think>"), 2),
        {},
    ),
    "llama_cffi.chat.reasoning_opens": lambda e: ((None,), {}),
    "llama_cffi.chat.with_media_markers": lambda e: (("<m>",), {}),
    "llama_cffi.media_file.check_media": lambda e: ((), {"max_pixels": 1 << 20, "max_seconds": 60.0}),
    "llama_cffi.mtmd.Chunks": lambda e: ((None,), {}),
    "llama_cffi.mtmd.Chunk": lambda e: ((0,), {}),
    "llama_cffi.mtmd.Projector.eval": lambda e: ((None,), {}),
    "llama_cffi.mtmd.Projector": lambda e: ((f"{e.folder}/none.gguf",), {}),
    "llama_cffi.testing._tiny_mmproj.write_tiny_gemma3_mmproj": lambda e: ((64,), {}),
    "llama_cffi.testing._tiny_mmproj.write_tiny_ultravox_mmproj": lambda e: ((64,), {}),
    "llama_cffi.testing._tiny_qwen2vl.write_tiny_qwen2vl_mmproj": lambda e: ((64,), {}),
    "llama_cffi.testing.write_tiny": lambda e: ((f"{e.folder}/w.gguf",), {}),
    "samplers.bias.LogitBias": lambda e: (({},), {}),
    "samplers.branch.Branch": lambda e: ((0, None, [1], _m("samplers").SamplerChain([]), None, None), {}),
    "samplers.branch.Branch.speculate": lambda e: (
        (_m("samplers.speculative").PromptLookup(),),
        {},
    ),
    "samplers.branch.BranchStore.share_refusal": lambda e: (([1, 2], 1), {}),
    "samplers.candidates.Candidates.from_arrays": lambda e: ((_f32(1),), {}),
    "samplers.candidates.Candidates.assign": lambda e: ((_f32(1),), {}),
    "samplers.chain.SamplerChain.choose": lambda e: ((_f32(e.n_vocab),), {}),
    "samplers.chain.surprisal_of": lambda e: ((0,), {}),
    "samplers.chain_batch.choose": lambda e: (
        ([], _np().zeros((0, 1), dtype=_np().int32), _np().zeros((0, 1), dtype=_np().float32), False),
        {},
    ),
    "samplers.grammar.sampler.GrammarSampler.allows_many": lambda e: (([0],), {}),
    "samplers.chain_batch.choose_constrained": lambda e: (
        ([], _np().zeros((0, 1), dtype=_np().int32), _np().zeros((0, 1), dtype=_np().float32), len, False),
        {},
    ),
    "samplers.chat.ChatSession.add_message": lambda e: (("hello",), {}),
    "samplers.chat.ChatSession.add_tool_result": lambda e: (("result",), {}),
    "samplers.chat.ChatStream": lambda e: ((_m("samplers.search").stream(e.branch(), 2), 0, 0), {}),
    "samplers.distributed.map_generate": lambda e: ((["a"],), {}),
    "samplers.distributed.perplexity": lambda e: (("some text",), {}),
    "samplers.dry.breaker_sequences": lambda e: ((["\n"],), {}),
    "samplers.evals.hellaswag": lambda e: (("context\n0\na\nb\nc\nd\n",), {}),
    "samplers.evals.wilson_interval": lambda e: ((4,), {}),
    "samplers.evals.winogrande": lambda e: (("h\n0,A _ b.,x,y,1\n\n",), {}),
    "samplers.evals.multiple_choice": lambda e: ((b"",), {}),
    "samplers.kl_divergence.kl_divergence": lambda e: (("base.kld",), {}),
    "samplers.kl_divergence.KLBase.log_probs": lambda e: ((64,), {}),
    "samplers.kl_divergence.write_kl_base": lambda e: (("some text", "out.kld"), {}),
    "samplers.grammar.compiled.CompiledGrammar": lambda e: (
        (_m("samplers.grammar.vocab_index").VocabIndex.of(e.vocab),),
        {},
    ),
    "samplers.grammar.compiled.CompiledGrammar.token_allowed": lambda e: ((None, 0), {}),
    "samplers.grammar.compiled.CompiledGrammar.fill_words": lambda e: (
        ((0, 0), _np().zeros(64, dtype=_np().uint32)),
        {},
    ),
    "samplers.grammar.engine.Engine.group_step": lambda e: ((_np().zeros(1, dtype=_np().int64),), {}),
    "samplers.grammar.engine.Engine.step": lambda e: ((0,), {}),
    "samplers.grammar.engine.Engine.fill": lambda e: ((_np().zeros(1, dtype=_np().int32),), {}),
    "samplers.grammar.engine.Engine.walk": lambda e: (([104],), {}),
    "samplers.grammar.engine.Engine.step_token": lambda e: ((0,), {}),
    "samplers.grammar.engine.Engine.union": lambda e: ((0,), {}),
    "samplers.grammar.engine.Engine.partial_ok_at": lambda e: (
        (_np().zeros(1, dtype=_np().int64), _np().zeros(1, dtype=_np().int64)),
        {},
    ),
    "samplers.grammar.engine.Engine.partial_ok": lambda e: ((None,), {}),
    "samplers.grammar.gbnf.rule_renumbering": lambda e: (
        (_m("llama_cffi.gbnf").parse_gbnf('root ::= "a"'),),
        {},
    ),
    "samplers.logprobs.LogprobReader.read": lambda e: ((0,), {}),
    "samplers.logprobs.LogprobReader.read_many": lambda e: (([0],), {}),
    "samplers.logprobs.LogprobReader.from_surprisal": lambda e: ((1.0,), {}),
    "samplers.logprobs.score": lambda e: (("Hello", " world"), {}),
    "samplers.logprobs.score_many": lambda e: (([("Hello", " world")],), {}),
    "samplers.many.ManyRun": lambda e: (
        (["Hello"], 4, None, None, None, (), None, (), None, True, 2, False, "nats"),
        {},
    ),
    "samplers.many.agenerate_many": lambda e: ((["Hello"],), {}),
    "samplers.many.aiter_many": lambda e: ((["Hello"],), {}),
    "samplers.many.generate_many": lambda e: ((["Hello"],), {}),
    "samplers.many.iter_many": lambda e: ((["Hello"],), {}),
    "samplers.measure.PerplexityTracker.add_token": lambda e: ((0,), {}),
    "samplers.measure.surprisal": lambda e: ((0,), {}),
    "samplers.perplexity.Accumulator": lambda e: ((2, 64), {}),
    "samplers.perplexity.Scorer": lambda e: ((e.plan(),), {}),
    "samplers.perplexity.Scorer.group": lambda e: ((0, 1, None), {}),
    "samplers.perplexity.groups": lambda e: ((1,), {}),
    "samplers.perplexity.perplexity": lambda e: (("some text",), {}),
    "samplers.perplexity.prepare": lambda e: (("some text", 16, 32, -1), {}),
    "samplers.search.Stream": lambda e: ((4, (), (), None, "auto", None), {}),
    "samplers.search.acomplete": lambda e: (("Hello",), {}),
    "samplers.search.agenerate": lambda e: (("Hello",), {}),
    "samplers.search.complete": lambda e: (("Hello",), {}),
    "samplers.search.generate": lambda e: (("Hello",), {}),
    "samplers.search.beam_search": lambda e: (("Hello", 2), {}),
    "samplers.search.best_of_n": lambda e: (("Hello", 2), {}),
    "samplers.search.expand_top_k": lambda e: ((2,), {}),
    "samplers.search.run_together": lambda e: (([], 4), {}),
    "samplers.speculative.DraftModel.draft": lambda e: ((2,), {}),
    "samplers.speculative.DraftModel.feedback": lambda e: ((0,), {}),
    "samplers.speculative.Drafter.draft": lambda e: ((2,), {}),
    "samplers.speculative.Drafter.feedback": lambda e: ((0,), {}),
    "samplers.speculative.PromptLookup.draft": lambda e: ((2,), {}),
    "samplers.speculative.PromptLookup.feedback": lambda e: ((0,), {}),
    "samplers.speculative.speculative_step": lambda e: (
        ({}, _m("samplers.speculative").PromptLookup()),
        {},
    ),
    "samplers.speculative.vocab_compatibility": lambda e: ((e.model,), {}),
    "samplers.temperature.scale_logits": lambda e: ((0.8,), {}),
    "samplers.truncation.XTC": lambda e: ((0.1,), {}),
    "samplers.testing._branch_machine.BranchMachine.tokens": lambda e: ((1,), {}),
    "samplers.testing._branch_machine.Node.shifted": lambda e: ((1,), {}),
    "samplers.tools.parse_tool_calls": lambda e: ((None,), {}),
    "samplers.tools.tool_call_grammar": lambda e: (([],), {}),
}


# ---------------------------------------------------------------------- every parameter
@dataclasses.dataclass(frozen=True)
class ParamCase:
    """One parameter after the first of a callable of :func:`all_callables` (the first is
    the callable's own case): the call gets valid values for the others (the first from
    :data:`FIRST` or its annotation, the rest from :data:`REST`) and WRONG for it."""

    id: str  # "module.Qual.name:param"
    case: Case
    param: str
    index: int  # among the parameters (self/cls and *args/**kwargs left out)
    keyword_only: bool


def _signature_params(fn: Callable[..., Any], bound: bool) -> list[inspect.Parameter]:
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    return params[1:] if bound else params


def _unbound(case: Case) -> tuple[Callable[..., Any], bool]:
    mod = importlib.import_module(case.module)
    if case.owner is None:
        return getattr(mod, case.id.rsplit(".", 1)[1]), False
    cls: Any = mod
    for part in case.owner.split("."):
        cls = getattr(cls, part)
    if case.attr is None:
        return cls.__init__, True
    raw = vars(cls)[case.attr]
    fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    return fn, case.kind != "staticmethod"


def all_param_cases() -> list[ParamCase]:
    _load_value_tables()
    out = []
    for case in all_callables()[0]:
        fn, bound = _unbound(case)
        params = _signature_params(fn, bound)
        for i, p in enumerate(params[1:], start=1):
            if f"{case.id}:{p.name}" in ANY_VALUE:
                continue
            out.append(ParamCase(f"{case.id}:{p.name}", case, p.name, i, p.kind == inspect.Parameter.KEYWORD_ONLY))
    return out


#: A valid value for a callable's first parameter, where its annotation does not give one
#: (:func:`_first_value`); kept per package in ``tests/wrong_types_values_*.py``.
FIRST: dict[str, Callable[[Env], Any]] = {}
#: (positional args after the first, kwargs) for the every-parameter cases, where
#: :data:`REST` (made for the first parameter's case) does not fit.
REST_PARAMS: dict[str, Callable[[Env], tuple[tuple[Any, ...], dict[str, Any]]]] = {}
#: "callable:param" -> why any value is right for that parameter (the audit checks the rest).
ANY_VALUE: dict[str, str] = {}


def _load_value_tables() -> None:
    for name in ("tests.wrong_types_values_llama_cffi", "tests.wrong_types_values_samplers"):
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        FIRST.update(getattr(mod, "FIRST", {}))
        REST_PARAMS.update(getattr(mod, "REST_PARAMS", {}))
        ANY_VALUE.update(getattr(mod, "ANY_VALUE", {}))


def _first_value(env: Env, case: Case, p: inspect.Parameter) -> Any:
    """A valid value for ``case``'s first parameter ``p``: from :data:`FIRST`, else from
    its annotation (a context, a store, a branch, a model, text, token ids, a number...)."""
    if case.id in FIRST:
        return FIRST[case.id](env)
    ann = str(p.annotation)
    head = ann.split("|")[0].strip()
    if "BranchStore" in head:
        return env.store()
    if head.startswith("Branch"):
        return env.branch()
    if "Context" in head:
        return env.context()
    if head in ("Model", "llama_cffi.Model"):
        return env.model
    if "Vocab" in head:
        return env.vocab
    if "Candidates" in head:
        return env.candidates()
    if head in ("str", "str | os.PathLike[str]") or head.startswith("str"):
        return "Hello"
    if head.startswith(("Sequence[int]", "list[int]", "Iterable[int]", "npt.NDArray[np.int", "Sequence[int] |")):
        return env.prompt()
    if head.startswith(("npt.NDArray[np.float32]", "npt.ArrayLike", "np.ndarray")):
        return _np().zeros(env.n_vocab, dtype=_np().float32)
    if head == "int":
        return 1
    if head == "float":
        return 0.5
    if head == "bool":
        return False
    if p.default is not inspect.Parameter.empty:
        return p.default
    raise LookupError(f"no valid value for {case.id}'s first parameter {p.name} ({ann}): add one to FIRST")


def run_params(cases: list[ParamCase], folder: str) -> None:
    _load_value_tables()
    os.chdir(folder)  # what a call writes with a relative path lands there, not in the tree
    env = Env(folder)
    for pc in cases:
        print(f"CASE {pc.id}", flush=True)
        out: dict[str, Any] = {"id": pc.id}
        case = pc.case
        try:
            fn, _instance = _target(env, case)
            raw, bound = _unbound(case)
            params = _signature_params(raw, bound)
            first = _first_value(env, case, params[0])
            rest, kwargs = REST_PARAMS.get(case.id, REST.get(case.id, lambda e: ((), {})))(env)
            args = [first, *rest]
        except BaseException as e:
            out.update(setup=f"{type(e).__name__}: {e}")
            print("RESULT " + json.dumps(out), flush=True)
            continue
        kwargs = dict(kwargs)
        if pc.index < len(args) and not pc.keyword_only:
            args[pc.index] = WRONG
        else:
            kwargs[pc.param] = WRONG
        if params[0].kind == inspect.Parameter.KEYWORD_ONLY:
            kwargs[params[0].name] = args.pop(0)
        try:
            _drive(fn(*args, **kwargs))
        except BaseException as e:
            out.update(raised=[c.__name__ for c in type(e).__mro__], message=str(e))
        else:
            out.update(raised=None)
        print("RESULT " + json.dumps(out), flush=True)


def _target(env: Env, case: Case) -> tuple[Callable[..., Any], Any]:
    """The callable of ``case`` (bound to a fresh instance for a method) and that instance."""
    mod = importlib.import_module(case.module)
    if case.owner is None:
        return getattr(mod, case.id.rsplit(".", 1)[1]), None
    cls: Any = mod
    for part in case.owner.split("."):
        cls = getattr(cls, part)
    if case.attr is None:
        return cls, None
    raw = vars(cls)[case.attr]
    if case.kind in ("staticmethod", "classmethod"):
        return getattr(cls, case.attr), None
    owner_id = f"{case.module}.{case.owner}"
    if owner_id not in FACTORIES:
        raise LookupError(f"no factory for {owner_id}: add one to FACTORIES")
    instance = FACTORIES[owner_id](env)
    return raw.__get__(instance, type(instance)), instance


def _drive(result: Any) -> None:
    """A coroutine, an async iterator or a generator checks its arguments when it runs."""
    import asyncio
    import types

    if inspect.iscoroutine(result):
        asyncio.run(result)
    elif inspect.isasyncgen(result) or hasattr(result, "__anext__"):
        asyncio.run(result.__anext__())
    elif isinstance(result, types.GeneratorType):
        next(result)


def run(cases: list[Case], folder: str) -> None:
    env = Env(folder)
    for case in cases:
        print(f"CASE {case.id}", flush=True)
        out: dict[str, Any] = {"id": case.id}
        try:
            fn, _instance = _target(env, case)
        except BaseException as e:  # the setup failed: the test says so
            out.update(setup=f"{type(e).__name__}: {e}")
            print("RESULT " + json.dumps(out), flush=True)
            continue
        args, kwargs = REST.get(case.id, lambda e: ((), {}))(env)
        try:
            if case.keyword_only:
                result = fn(*args, **{case.param: WRONG}, **kwargs)
            else:
                result = fn(WRONG, *args, **kwargs)
            _drive(result)
        except BaseException as e:
            out.update(raised=[c.__name__ for c in type(e).__mro__], message=str(e))
        else:
            out.update(raised=None)
        print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    wanted = set(json.loads(sys.argv[1]))
    if len(sys.argv) > 3 and sys.argv[3] == "params":
        run_params([c for c in all_param_cases() if c.id in wanted], sys.argv[2])
    else:
        run([c for c in all_callables()[0] if c.id in wanted], sys.argv[2])
