"""Throughput beyond one process: corpus perplexity and batch generation on a Ray cluster.

`Ray <https://docs.ray.io>`_ runs the workers (``pip install 'llama-cffi[ray]'``; this
module imports ``ray`` only when a :class:`Workers` pool is made). Each worker is a Ray
actor holding one loaded model (loaded once, ``threads_per_worker`` threads and Ray CPUs
each), so a pool of N workers on a cluster scores or generates N jobs at once.

* :func:`perplexity` cuts the text exactly as ``llama-perplexity`` does
  (:mod:`samplers.perplexity`), sends each *group* of chunks that ``llama-perplexity``
  decodes together to a worker, and adds the groups' sums in chunk order on the driver.
  Every chunk is decoded with the batch shapes of the single-process run and the float64
  sums are added in the same order, so the result (``Final estimate``, its ``+/-`` and
  every running value) is **bit-identical** to :func:`samplers.perplexity.perplexity` and
  therefore equal to ``llama-perplexity``'s on the same model, text and settings.
* :func:`map_generate` spreads prompts over the workers in fixed batches of
  ``batch_size`` consecutive prompts (fixed by input order, not by the number of workers);
  a worker generates one batch as sequences of one context with a
  :class:`~samplers.branch.BranchStore`, one ``llama_decode`` per step for the whole
  batch. Results come back in input order, one :class:`Generation` per prompt.

**Determinism.** Prompt *i* is sampled with its own seed (``Request.seed``, or ``seed +
i``) on its own clone of the sampler, in a batch fixed by input order and ``batch_size``,
and a retried batch is the same batch: its result depends only on the prompts and
settings, never on the number of workers, which worker ran it, the order batches finished
or a worker's death. A batch runs through :func:`samplers.many.iter_many` (the code a
single process uses: prompts packed into shared decodes, every live sequence stepped in
one decode), so with ``batch_size=1`` every token is that of
:func:`samplers.search.generate` in a single-sequence context. In a batch, rows come from
decodes of several sequences, and llama.cpp's CPU kernels depend on a decode's row count:
with repacked weights (``use_extra_bufts``, the default for quantized models on x86) 4
rows or more take another kernel than 1..3, and without repacking K-quant weights (the
default model's Q4_K) take ggml's tiled kernel from 8 rows. These are different roundings,
not last-bit noise: on the default model a sequence's logits in an 8-row decode differ
from its lone decode's by up to 1.2 (in a 4-row decode with repacking, 1.0), so sampled
continuations part after a few tokens (in ``benchmarks/bench_distributed.py``, 2 of 16
texts of 32 tokens stay equal in batches of 8). :func:`map_generate` loads models with
``use_extra_bufts=False`` unless ``model_params`` says otherwise: a K-quant model such as
the default one then matches one-at-a-time generation bit for bit where every decode holds
at most 7 rows (a batch's prompts are packed into its first decodes, up to ``n_batch``
tokens), and F32 models token for token in any batch (their rows differ in the last bits
from 2 rows on, which changes a token only at an exact tie). Both also need flash
attention on (llama.cpp's default) and, for the one-at-a-time run past 256 cells, one
thread as each worker has by default (``threads_per_worker=1``): a one-token decode with
several threads over a long cache adds its parts in another order. The full conditions:
``docs/guide/branches.md`` ("Tolerances"). :func:`perplexity` keeps llama.cpp's defaults,
as ``llama-perplexity`` does.

**Failures.** A prompt that cannot be generated (a prompt longer than the context, a bad
grammar, a token outside the vocabulary) gets a :class:`Generation` with ``error`` set;
the other prompts are unaffected. A worker that dies (its process killed, its node lost)
is restarted by Ray (``max_restarts=-1``) and its unfinished batches or chunk groups are
retried on it (``max_task_retries``); results are the same as without the failure. A job
that still fails after its retries fails its prompts (``error`` set) or, for perplexity,
raises :class:`DistributedError`.

**Clusters.** ``cluster=None`` uses the Ray instance this process is connected to, or
starts a local one (``ray.init()``); ``"auto"``, ``"HOST:PORT"`` or ``"ray://HOST:PORT"``
connect to a running cluster (``ray start --head`` on one machine, ``ray start
--address=HEAD:PORT`` on the others). Every node needs llama_cffi installed and the model
file at the same path (or pass a path that exists on each).

Command line: ``llama-cffi perplexity -f FILE --ray auto --workers 8``: the command of
:mod:`samplers.perplexity` with this module's options (:func:`add_cli_arguments`) and
scorer (:func:`cli_scoring`); :mod:`samplers.cli` registers it. This module is an optional
layer over the core: it imports :mod:`samplers.perplexity`, never the other way round.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
import numpy.typing as npt

from llama_cffi import LlamaError, Model, ParamError, default_model_path
from llama_cffi._args import (
    expect_callable,
    expect_iterable,
    expect_mapping,
    expect_namespace,
    expect_number,
    expect_parser,
    expect_path,
    expect_str,
    type_error,
)

from . import perplexity as _ppl
from .base import Sampler

if TYPE_CHECKING:
    from llama_cffi import Context

    from .params import SamplingParams


__all__ = [
    "DistributedError",
    "Generation",
    "RayNotInstalled",
    "Request",
    "StopReason",
    "Workers",
    "add_cli_arguments",
    "cli_scoring",
    "map_generate",
    "perplexity",
]

#: Why a generation ended: an end-of-generation token (a grammar's end included), a stop
#: string, ``max_tokens``, the sequence's context filled, or an error (see ``error``).
StopReason = Literal["eog", "stop", "max_tokens", "context", "error"]


class DistributedError(LlamaError, RuntimeError):
    """A distributed job could not finish: a worker could not start, or a job failed
    after its retries. The message names the job and the cause."""


class RayNotInstalled(LlamaError, ImportError):
    """``ray`` is not installed: ``pip install 'llama-cffi[ray]'``."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayNotInstalled(
            "samplers.distributed needs Ray: pip install 'llama-cffi[ray]' (or: pip install ray)"
        ) from None
    return ray


# ---------------------------------------------------------------------- requests and results
@dataclass(frozen=True)
class Request:
    """One prompt of :func:`map_generate`, with optional per-prompt settings (``None``:
    the call's). ``prompt``: text (tokenized with the model's BOS, special tokens parsed
    as :meth:`llama_cffi.Vocab.tokenize` does) or token ids. ``grammar`` (GBNF text or a
    :class:`~samplers.grammar.Grammar`) and ``json_schema`` (a dict) are exclusive."""

    prompt: str | Sequence[int]
    seed: int | None = None
    max_tokens: int | None = None
    sampler: Sampler | SamplingParams | None = None
    grammar: Any = None
    json_schema: dict[str, Any] | None = None
    stop: Sequence[str] | None = None


@dataclass(frozen=True)
class Generation:
    """The outcome of one prompt of :func:`map_generate`.

    ``index``: the prompt's position in the input. ``text``: the generated text (an end
    token or stop string excluded). ``tokens``: the generated token ids (a stop string's
    tokens included, an end token excluded, as :func:`samplers.search.stream` leaves the
    branch). ``stop_reason``: see :data:`StopReason`. ``n_prompt_tokens``: the prompt's
    length in tokens. ``logprob``: the summed natural-log probability of ``tokens`` under
    the model (not the sampler), in nats; ``perplexity`` is ``exp(-logprob / len(tokens))``
    (NaN with no tokens). ``seed``: the seed the prompt was sampled with. ``error``:
    ``"ExceptionType: message"`` when the prompt failed (then ``stop_reason`` is
    ``"error"``). ``worker``: ``"node-id:pid"`` of the worker that produced it;
    ``seconds``: its batch's wall time on that worker.
    """

    index: int
    text: str
    tokens: tuple[int, ...]
    stop_reason: StopReason
    n_prompt_tokens: int
    logprob: float
    perplexity: float
    seed: int | None
    error: str | None = None
    worker: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """No error."""
        return self.error is None


def _failed(index: int, seed: int | None, error: str, worker: str = "") -> Generation:
    return Generation(index, "", (), "error", 0, 0.0, float("nan"), seed, error, worker)


@dataclass(frozen=True)
class _Job:
    """One prompt as a worker receives it: the request with the call's settings filled in."""

    index: int
    prompt: str | Sequence[int]
    seed: int | None
    max_tokens: int
    sampler: Sampler | SamplingParams | None
    grammar: Any
    stop: tuple[str, ...]


# ---------------------------------------------------------------------- the worker (a Ray actor)
class _Worker:
    """One model per process; perplexity groups and generation batches on cached contexts.
    Wrapped by ``ray.remote`` when a pool is made (this class imports nothing from Ray)."""

    def __init__(self, model_path: str, model_params: dict[str, Any], n_threads: int) -> None:
        self.model = Model.load(model_path, **model_params)
        self.n_threads = n_threads
        self._contexts: dict[tuple[Any, ...], Context] = {}
        self._scorer: _ppl.Scorer | None = None
        self.ident = f"{_node_id()}:{os.getpid()}"

    def info(self) -> dict[str, Any]:
        return {"worker": self.ident, "pid": os.getpid(), "node_id": _node_id(), "host": os.uname().nodename}

    def _context(self, **params: Any) -> Context:
        key = tuple(sorted(params.items()))
        ctx = self._contexts.get(key)
        if ctx is None:
            for old in self._contexts.values():  # one context at a time: memory
                old.close()
            self._contexts.clear()
            ctx = self.model.context(n_threads=self.n_threads, n_threads_batch=self.n_threads, **params)
            self._contexts[key] = ctx
        return ctx

    def perplexity_group(
        self, tokens: npt.NDArray[np.int32], n_ctx: int, n_batch: int, first: int, n_seq: int, bos: int | None
    ) -> _ppl.GroupTerms:
        p = _ppl.plan(n_ctx, n_batch)
        ctx = self._context(n_ctx=p.ctx_size, n_batch=p.n_batch, n_seq_max=p.n_seq, swa_full=False, kv_unified=False)
        if self._scorer is None or self._scorer.ctx is not ctx:  # the context's sizes fix the plan
            self._scorer = _ppl.Scorer(ctx, p)
        return self._scorer.group(tokens, first, n_seq, bos)

    def generate(self, jobs: list[_Job], n_ctx: int, n_batch: int) -> list[Generation]:
        ctx = self._context(n_ctx=n_ctx * len(jobs), n_batch=n_batch, n_seq_max=len(jobs), kv_unified=False)
        t0 = time.perf_counter()
        out = _generate_batch(ctx, jobs)
        dt = time.perf_counter() - t0
        return [replace(g, worker=self.ident, seconds=dt) for g in out]


def _node_id() -> str:
    try:
        import ray

        return str(ray.get_runtime_context().get_node_id())[:12]
    except Exception:  # not in a Ray worker
        return "local"


def _generate_batch(ctx: Context, jobs: Sequence[_Job]) -> list[Generation]:
    """Generate every job on ``ctx`` (which needs ``n_seq_max >= len(jobs)``; its KV memory
    is cleared first) with :func:`samplers.many.iter_many`: every live sequence stepped in
    one decode, prompts packed, shared prefixes copied where the memory can. A job that
    fails (its prompt, its grammar, or its sampling) gets an error :class:`Generation`;
    the others go on. Token for token this is :func:`samplers.search.stream` per job."""
    from .branch import BranchStore
    from .many import Request, _resolve_grammar, iter_many

    ctx.memory.clear(True)
    store = BranchStore(ctx)
    vocab = ctx.model.vocab
    n_ctx_seq = ctx.n_ctx_seq
    results: dict[int, Generation] = {}
    ok: list[_Job] = []
    reqs: list[Request] = []
    for job in jobs:
        try:
            toks = vocab.tokenize(job.prompt) if isinstance(job.prompt, str) else vocab.check_tokens(job.prompt)
            if len(toks) == 0:
                raise ParamError("a prompt needs at least one token")
            if len(toks) >= n_ctx_seq:
                raise ParamError(f"the prompt has {len(toks)} tokens; each sequence holds {n_ctx_seq}")
            grammar = _resolve_grammar(job.grammar, None, f"prompt {job.index}")
        except (LlamaError, ValueError, TypeError) as e:
            results[job.index] = _failed(job.index, job.seed, f"{type(e).__name__}: {e}")
            continue
        ok.append(job)
        prompt = [int(t) for t in toks]
        reqs.append(Request(prompt, job.max_tokens, job.sampler, grammar, None, job.stop, None, job.seed))

    def failed(i: int, e: Exception) -> None:
        results[ok[i].index] = _failed(ok[i].index, ok[i].seed, f"{type(e).__name__}: {e}")

    try:
        for i, r in iter_many(store, reqs, on_error=failed):
            job = ok[i]
            reason: StopReason = "eog" if r.stop_reason == "grammar" else cast(StopReason, r.stop_reason)
            ppl = float(np.exp(-r.logprob / len(r.tokens))) if r.tokens else float("nan")
            results[job.index] = Generation(
                job.index, r.text, tuple(r.tokens), reason, r.prompt_tokens, r.logprob, ppl, job.seed
            )
    finally:
        store.drain()
    return [results[j.index] for j in jobs]


# ---------------------------------------------------------------------- the pool
_int = _ppl._int_param  # "NAME must be an int >= MIN" (a ParamError), as perplexity checks


class Workers:
    """A pool of Ray actors, each holding one loaded model (see the module docstring).

    ``model_path``: a GGUF path that exists on every node (default: the default model,
    resolved on the driver). ``n_workers`` actors of ``threads_per_worker`` threads, each
    reserving that many Ray CPUs. ``model_params``: :meth:`llama_cffi.Model.load` keywords
    for every worker. ``cluster``: ``None`` (the connected Ray instance, else a new local
    one), ``"local"`` (a new local one), ``"auto"``, ``"HOST:PORT"`` or
    ``"ray://HOST:PORT"``; ``ray_init``: more ``ray.init`` keywords when this call
    connects or starts one (workers' output reaches the driver only with
    ``{"log_to_driver": True}``). ``max_task_retries``:
    how often a job is retried after its worker died (Ray restarts dead workers without
    limit). ``max_in_flight``: jobs queued per worker (2 hides the round trip).

    The actors live until :meth:`close` (or the end of a ``with`` block); each loads
    its model once, so several :meth:`perplexity` / :meth:`map_generate` calls share
    them. The pool is used from the thread that made it.

    ``cpus_per_worker``: the Ray CPUs each actor reserves (default ``threads_per_worker``;
    less oversubscribes). ``start_timeout``: seconds to wait for every worker to load its
    model; a pool that does not fit in the cluster's free CPUs raises
    :class:`DistributedError` then, instead of waiting forever.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        n_workers: int = 2,
        threads_per_worker: int = 1,
        model_params: Mapping[str, Any] | None = None,
        cluster: str | None = None,
        ray_init: Mapping[str, Any] | None = None,
        max_task_retries: int = 3,
        max_in_flight: int = 2,
        cpus_per_worker: float | None = None,
        start_timeout: float = 300.0,
    ) -> None:
        if model_path is not None:
            expect_path("model_path", model_path)
        _check_pool_options(model_params, cluster, cpus_per_worker)
        if ray_init is not None:
            expect_mapping("ray_init", ray_init, "a mapping of ray.init keywords or None")
        self.n_workers = _int("n_workers", n_workers, 1)
        self.threads_per_worker = _int("threads_per_worker", threads_per_worker, 1)
        cpus = float(self.threads_per_worker if cpus_per_worker is None else cpus_per_worker)
        if isinstance(cpus_per_worker, bool) or not cpus > 0:
            raise ParamError(f"cpus_per_worker must be a number > 0, not {cpus_per_worker!r}")
        if not (isinstance(start_timeout, (int, float)) and start_timeout > 0):
            raise ParamError(f"start_timeout must be a number of seconds > 0, not {start_timeout!r}")
        self.max_task_retries = _int("max_task_retries", max_task_retries, 0)
        self.max_in_flight = _int("max_in_flight", max_in_flight, 1)
        ray = _ray()
        path = Path(model_path) if model_path is not None else default_model_path()
        if not path.is_file():
            raise ParamError(f"model_path {str(path)!r} is not a file")
        self.model_path = str(path.resolve())
        self.model_params = dict(model_params or {})
        # the driver's tokenizer: vocabulary only, no weights
        self._vocab_model: Model | None = Model.load(self.model_path, vocab_only=True)
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            kwargs.update(ray_init or {})
            try:
                if cluster is not None:
                    _probe(cluster)
                    kwargs["address"] = cluster
                ray.init(**kwargs)
            except BaseException:
                self._vocab_model.close()
                raise
        elif cluster is not None or ray_init:
            self._vocab_model.close()
            raise ParamError(
                "Ray is already initialised in this process: leave cluster and ray_init unset to use it "
                "(or call ray.shutdown() first)"
            )
        self._ray = ray
        actor = ray.remote(num_cpus=cpus, max_restarts=-1, max_task_retries=self.max_task_retries)(_Worker)
        self._actors = [
            actor.remote(self.model_path, self.model_params, self.threads_per_worker) for _ in range(self.n_workers)
        ]
        try:  # every worker loads its model now: an error here is the user's to see
            self._info = ray.get([a.info.remote() for a in self._actors], timeout=start_timeout)
        except ray.exceptions.GetTimeoutError as e:
            free = ray.available_resources().get("CPU", 0.0)
            self.close()
            raise DistributedError(
                f"{self.n_workers} workers of {cpus:g} CPUs each did not start within {start_timeout:g} s; "
                f"the cluster has {free:g} CPUs free (other pools or tasks hold the rest?)"
            ) from e
        except Exception as e:
            self.close()
            raise DistributedError(f"a worker could not load {self.model_path!r}: {_cause(e)}") from e

    # ------------------------------------------------------------------ lifecycle
    def info(self) -> list[dict[str, Any]]:
        """Per worker, as it was last seen: ``worker`` (``"node:pid"``), ``pid``,
        ``node_id``, ``host``. A restarted worker has a new pid: :meth:`refresh_info`."""
        return list(self._info)

    def refresh_info(self) -> list[dict[str, Any]]:
        """Ask every worker again (waits for a restarting one)."""
        self._info = self._ray.get([a.info.remote() for a in self._actors])
        return self.info()

    def close(self) -> None:
        """End the actors (idempotent); the Ray instance stays up."""
        for a in getattr(self, "_actors", []):
            try:
                self._ray.kill(a)
            except Exception:  # already gone
                pass
        self._actors = []
        vm = getattr(self, "_vocab_model", None)
        if vm is not None:
            vm.close()
            self._vocab_model = None

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if not self._actors:
            raise DistributedError("this Workers pool is closed")

    # ------------------------------------------------------------------ scheduling
    def _run(
        self,
        calls: Sequence[tuple[str, tuple[Any, ...]]],
        on_done: Callable[[int, Any], None],
        on_error: Callable[[int, BaseException], None],
    ) -> None:
        """Run ``calls`` (method name, arguments) on the actors, at most
        ``max_in_flight`` per actor, taking the next call as one finishes; report each
        result (``on_done(i, value)``) or failure (``on_error(i, exc)``) as it arrives."""
        ray = self._ray
        pending = list(range(len(calls)))[::-1]
        load = [0] * len(self._actors)
        flight: dict[Any, tuple[int, int]] = {}  # ref -> (call index, actor index)

        def submit() -> None:
            while pending:
                a = min(range(len(load)), key=load.__getitem__)
                if load[a] >= self.max_in_flight:
                    return
                i = pending.pop()
                name, args = calls[i]
                flight[getattr(self._actors[a], name).remote(*args)] = (i, a)
                load[a] += 1

        submit()
        while flight:
            ready, _ = ray.wait(list(flight), num_returns=1)
            for ref in ready:
                i, a = flight.pop(ref)
                load[a] -= 1
                try:
                    value = ray.get(ref)
                except Exception as e:
                    on_error(i, e)
                else:
                    on_done(i, value)
            submit()

    # ------------------------------------------------------------------ perplexity
    def perplexity(
        self,
        text_or_tokens: str | bytes | npt.ArrayLike,
        n_ctx: int = 512,
        n_batch: int = 2048,
        n_chunks: int = -1,
        progress: _ppl.ProgressCallback | None = None,
    ) -> _ppl.PerplexityResult:
        """:func:`samplers.perplexity.perplexity` with its chunk groups scored by the
        workers: the same arguments, the same (bit-identical) result.
        ``progress(chunks_done, n_chunks, running_ppl)`` is called in chunk order as the
        completed prefix grows, with the running values ``llama-perplexity`` prints."""
        if progress is not None:
            expect_callable("progress", progress, "callable or None")
        self._check_open()
        assert self._vocab_model is not None
        p, tokens, n_chunk, bos = _ppl.prepare(self._vocab_model, text_or_tokens, n_ctx, n_batch, n_chunks)
        ref = self._ray.put(np.ascontiguousarray(tokens, dtype=np.int32))
        layout = _ppl.groups(n_chunk, p.n_seq)
        calls = [("perplexity_group", (ref, p.n_ctx, n_batch, first, n, bos)) for first, n in layout]
        acc = _ppl.Accumulator(p, n_chunk, len(tokens), progress)
        done: dict[int, _ppl.GroupTerms] = {}
        next_group = 0
        errors: list[tuple[int, BaseException]] = []

        def on_done(i: int, terms: _ppl.GroupTerms) -> None:
            nonlocal next_group
            done[i] = terms
            while next_group in done:  # add in chunk order: the sums of the single process
                acc.add(done.pop(next_group))
                next_group += 1

        def on_error(i: int, e: BaseException) -> None:
            errors.append((i, e))

        self._run(calls, on_done, on_error)
        if errors:
            i, e = min(errors, key=lambda x: x[0])
            first, n = layout[i]
            cause = _cause(e)
            if isinstance(cause, LlamaError) and not isinstance(e, self._ray.exceptions.RayActorError):
                raise cause
            raise DistributedError(f"chunks {first + 1}..{first + n} failed: {cause}") from e
        return acc.result()

    # ------------------------------------------------------------------ generation
    def map_generate(
        self,
        prompts: Iterable[str | Sequence[int] | Request],
        sampler: Sampler | SamplingParams | None = None,
        grammar: Any = None,
        json_schema: dict[str, Any] | None = None,
        max_tokens: int = 128,
        stop: Iterable[str] = (),
        seed: int = 0,
        batch_size: int = 8,
        n_ctx: int = 1024,
        n_batch: int = 512,
        progress: Callable[[int, int], None] | None = None,
    ) -> list[Generation]:
        """Generate for every prompt; one :class:`Generation` per prompt, in input order.

        ``sampler`` (default greedy) is cloned for each prompt and seeded with the
        prompt's ``Request.seed`` or ``seed + index``. ``grammar`` (GBNF text or a
        :class:`~samplers.grammar.Grammar`) or ``json_schema`` constrains every prompt
        (a :class:`Request` can set its own). ``max_tokens`` and ``stop`` strings as in
        :func:`samplers.search.stream`. ``batch_size`` prompts share one context and one
        decode per step; ``n_ctx`` is each prompt's sequence size (prompt plus output)
        and ``n_batch`` the prompt decode's chunk size. ``progress(done, total)`` is
        called as prompts finish. Prompts that fail get ``error`` set (see the module
        docstring); this raises only for invalid arguments or a closed pool."""
        prompts = list(expect_iterable("prompts", prompts, "an iterable of prompts (text, token ids or Requests)"))
        _check_generation_options(sampler, grammar, json_schema, stop, progress)
        self._check_open()
        batch_size = _int("batch_size", batch_size, 1)
        n_ctx = _int("n_ctx", n_ctx, 1)
        n_batch = _int("n_batch", n_batch, 1)
        _int("max_tokens", max_tokens, 0)
        _int("seed", seed, 0)
        if grammar is not None and json_schema is not None:
            raise ParamError("give grammar or json_schema, not both")
        jobs = [
            _job(i, r, sampler, grammar if json_schema is None else json_schema, max_tokens, tuple(stop), seed)
            for i, r in enumerate(prompts)
        ]
        batches = [jobs[k : k + batch_size] for k in range(0, len(jobs), batch_size)]
        calls = [("generate", (b, n_ctx, n_batch)) for b in batches]
        results: list[Generation | None] = [None] * len(jobs)
        total = len(jobs)
        n_done = 0

        def on_done(i: int, gens: list[Generation]) -> None:
            nonlocal n_done
            for g in gens:
                results[g.index] = g
            n_done += len(gens)
            if progress is not None:
                progress(n_done, total)

        def on_error(i: int, e: BaseException) -> None:
            nonlocal n_done
            msg = f"{type(_cause(e)).__name__}: {_cause(e)}"
            for j in batches[i]:
                results[j.index] = _failed(j.index, j.seed, msg)
            n_done += len(batches[i])
            if progress is not None:
                progress(n_done, total)

        self._run(calls, on_done, on_error)
        return [r if r is not None else _failed(i, None, "lost") for i, r in enumerate(results)]


def _check_pool_options(model_params: object, cluster: object, cpus_per_worker: object) -> None:
    """The :class:`Workers` options that the one-call helpers pass on, checked before a pool starts."""
    if model_params is not None:
        expect_mapping("model_params", model_params, "a mapping of Model.load keywords or None")
    if cluster is not None:
        expect_str("cluster", cluster, "a Ray address (a str) or None")
    if cpus_per_worker is not None:
        expect_number("cpus_per_worker", cpus_per_worker, "a number > 0 or None")


def _check_generation_options(
    sampler: object, grammar: object, json_schema: object, stop: object, progress: object
) -> None:
    """:meth:`Workers.map_generate`'s options, checked before any work (the workers get them pickled)."""
    from .many import _check_constraint
    from .params import SamplingParams

    if sampler is not None and not isinstance(sampler, (Sampler, SamplingParams)):
        raise type_error("sampler", "a samplers Sampler (a chain), samplers.SamplingParams, or None", sampler)
    _check_constraint(grammar, json_schema)
    if isinstance(stop, str):
        raise type_error("stop", "an iterable of strings (a list, not one str)", stop)
    expect_iterable("stop", stop, "an iterable of strings")
    if progress is not None:
        expect_callable("progress", progress, "callable (done, total) or None")


def _job(
    i: int,
    r: str | Sequence[int] | Request,
    sampler: Sampler | SamplingParams | None,
    grammar: Any,
    max_tokens: int,
    stop: tuple[str, ...],
    seed: int,
) -> _Job:
    if not isinstance(r, Request):
        r = Request(r)
    if isinstance(r.prompt, (bytes, bytearray)) or not isinstance(r.prompt, (str, Sequence, np.ndarray)):
        raise ParamError(f"prompt {i} must be text, token ids or a Request, not {type(r.prompt).__name__}")
    if r.grammar is not None and r.json_schema is not None:
        raise ParamError(f"prompt {i}: give grammar or json_schema, not both")
    g = r.grammar if r.grammar is not None else r.json_schema if r.json_schema is not None else grammar
    mt = max_tokens if r.max_tokens is None else _int(f"prompt {i} max_tokens", r.max_tokens, 0)
    prompt = r.prompt if isinstance(r.prompt, str) else [int(t) for t in r.prompt]
    return _Job(
        i,
        prompt,
        seed + i if r.seed is None else int(r.seed),
        mt,
        r.sampler if r.sampler is not None else sampler,
        g,
        stop if r.stop is None else tuple(r.stop),
    )


def _probe(address: str) -> None:
    """Fail fast on a ``HOST:PORT`` with nothing listening (``ray.init`` would retry for
    minutes); other forms (``auto``, ``local``, ``ray://``) are Ray's to resolve."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=5):
            pass
    except OSError as e:
        raise DistributedError(f"no Ray cluster answers at {address}: {e}") from None


def _cause(e: BaseException) -> BaseException:
    """The application exception inside a Ray error, else the error itself."""
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, BaseException) else e


# ---------------------------------------------------------------------- one-call helpers
def perplexity(
    model_path: str | os.PathLike[str] | None,
    text_or_tokens: str | bytes | npt.ArrayLike,
    n_ctx: int = 512,
    n_batch: int = 2048,
    n_chunks: int = -1,
    *,
    workers: int = 2,
    threads_per_worker: int = 1,
    cluster: str | None = None,
    model_params: Mapping[str, Any] | None = None,
    progress: _ppl.ProgressCallback | None = None,
    cpus_per_worker: float | None = None,
) -> _ppl.PerplexityResult:
    """:meth:`Workers.perplexity` on a pool made for this call (and closed after it); the
    pool's arguments as :class:`Workers` takes them."""
    if model_path is not None:
        expect_path("model_path", model_path)
    _int("workers", workers, 1)
    _check_pool_options(model_params, cluster, cpus_per_worker)
    if progress is not None:
        expect_callable("progress", progress, "callable or None")
    with Workers(
        model_path, workers, threads_per_worker, model_params, cluster, cpus_per_worker=cpus_per_worker
    ) as pool:
        return pool.perplexity(text_or_tokens, n_ctx, n_batch, n_chunks, progress)


def map_generate(
    model_path: str | os.PathLike[str] | None,
    prompts: Iterable[str | Sequence[int] | Request],
    sampler: Sampler | SamplingParams | None = None,
    grammar: Any = None,
    json_schema: dict[str, Any] | None = None,
    max_tokens: int = 128,
    stop: Iterable[str] = (),
    seed: int = 0,
    *,
    batch_size: int = 8,
    n_ctx: int = 1024,
    workers: int = 2,
    threads_per_worker: int = 1,
    cluster: str | None = None,
    model_params: Mapping[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
    cpus_per_worker: float | None = None,
) -> list[Generation]:
    """:meth:`Workers.map_generate` on a pool made for this call (and closed after it); the
    pool's arguments as :class:`Workers` takes them. ``model_params`` defaults to
    ``{"use_extra_bufts": False}`` (see Determinism in the module docstring)."""
    if model_path is not None:
        expect_path("model_path", model_path)
    _int("workers", workers, 1)
    _check_pool_options(model_params, cluster, cpus_per_worker)
    prompts = list(expect_iterable("prompts", prompts, "an iterable of prompts (text, token ids or Requests)"))
    _check_generation_options(sampler, grammar, json_schema, stop, progress)
    params = {"use_extra_bufts": False} if model_params is None else model_params
    with Workers(model_path, workers, threads_per_worker, params, cluster, cpus_per_worker=cpus_per_worker) as pool:
        return pool.map_generate(
            prompts,
            sampler,
            grammar,
            json_schema,
            max_tokens,
            stop,
            seed,
            batch_size=batch_size,
            n_ctx=n_ctx,
            progress=progress,
        )


# ---------------------------------------------------------------------- command line
def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """``--ray`` and ``--workers``, for the ``perplexity`` command (on ``parser``)."""
    expect_parser("parser", parser)
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="score the chunks on a Ray cluster (samplers.distributed): 'auto' or HOST:PORT connects to a "
        "running one, 'local' starts one on this machine (needs: pip install 'llama-cffi[ray]'); "
        "-t is then the threads of each worker (default 1)",
    )
    parser.add_argument("--workers", type=int, default=2, help="with --ray: workers, one model each (default 2)")


def cli_scoring(args: argparse.Namespace) -> _ppl.RemoteScoring | None:
    """The ``perplexity`` command's scorer for its options (:func:`add_cli_arguments`):
    None without ``--ray`` (the command scores in its own process), else a pool of
    ``--workers`` Ray workers made for the run (``-t`` threads each, default 1)."""
    expect_namespace("args", args)
    if args.ray is None:
        return None

    def score(
        model_path: str,
        tokens: npt.NDArray[np.int32],
        n_ctx: int,
        n_batch: int,
        n_chunks: int,
        progress: _ppl.ProgressCallback,
        started: Callable[[], None],
    ) -> _ppl.PerplexityResult:
        with Workers(model_path, args.workers, args.threads or 1, cluster=args.ray) as pool:
            print(f"perplexity: {args.workers} Ray workers: {pool.info()}", file=sys.stderr, flush=True)
            started()
            return pool.perplexity(tokens, n_ctx, n_batch, n_chunks, progress)

    return score
