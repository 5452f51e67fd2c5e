"""Many prompts at once on one context: continuous batching with prefix sharing.

:func:`generate_many` runs a list of prompts (or :class:`Request`\\ s, each with its own
sampler, grammar or JSON schema, token budget, stop strings and seed) over a
:class:`~samplers.branch.BranchStore`, as llama.cpp's ``llama-parallel`` does:

* up to ``n_parallel`` sequences live at once; every live one is stepped by the same
  ``llama_decode``, and the prompts being admitted ride in that decode too (packed after
  the moves, ``n_batch`` tokens a decode: :meth:`BranchStore.step` with ``new=``);
* a sequence that ends gives its slot to the next prompt at once (continuous batching);
* a prompt that starts like a live sequence's prompt (a system prompt, a few-shot header)
  copies those KV cells (``seq_cp``; no data copied in a unified cache, which the
  context should have: ``kv_unified=True``) instead of decoding them again. Prompts
  admitted together wait one step for the first of them when they share at least
  :data:`SHARE_WAIT_MIN` tokens, and a finished sequence's prompt is kept (its KV, up to
  ``keep_prefixes`` of them) while a waiting prompt shares that much with it.

Token for token each result is :func:`samplers.search.complete` of its request alone
(same sampling, stop rules, :class:`~samplers.search.Result`), up to the rounding of the
batch shapes (``docs/guide/branches.md``, "Tolerances": under the conditions listed
there the logits are bit-exact, and so are the tokens).

:func:`iter_many` yields ``(index, result)`` in completion order; :func:`agenerate_many`
and :func:`aiter_many` are the asyncio forms (each step in a worker thread; cancelling
aborts the decode in flight). :class:`ManyStats` counts what was decoded and shared.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from llama_cffi._args import expect, expect_bool, expect_int, expect_iterable, type_error
from llama_cffi.errors import LlamaError, ParamError
from llama_cffi.vocab import StopStringStream

from .base import Sampler
from .branch import Branch, BranchStore, NewBranch
from .logprobs import LogprobReader, _check_unit
from .params import SamplingParams, as_sampler
from .prompt_cache import PromptCache, _common
from .search import Result, StopReason, Timings, _accepted_records, _cache, _grammar_forced_end, _result, _store

__all__ = [
    "SHARE_WAIT_MIN",
    "ManyRun",
    "ManyStats",
    "Request",
    "agenerate_many",
    "aiter_many",
    "generate_many",
    "iter_many",
]

#: A prompt that shares at least this many leading tokens with one admitted in the same
#: step waits one step and copies them from it, rather than decoding them itself; a
#: finished sequence's prompt is kept for a waiting prompt that shares this many.
SHARE_WAIT_MIN = 16

#: How many waiting prompts a finished sequence's prompt is compared with (the next ones
#: to be admitted) when deciding whether to keep it.
_LOOKAHEAD = 64


@dataclass(frozen=True)
class Request:
    """One prompt of :func:`generate_many` with its own settings; a field left None takes
    the call's. ``prompt``: text (tokenized with the model's special tokens, as
    :func:`~samplers.search.complete` does) or token ids. ``grammar`` (GBNF text, a
    Grammar, a JSON schema dict) and ``json_schema`` are exclusive; a request that gives
    either replaces the call's constraint."""

    prompt: str | Sequence[int]
    max_tokens: int | None = None
    sampler: Sampler | SamplingParams | None = None
    grammar: Any = None
    json_schema: Any = None
    stop: Sequence[str] | None = None
    stop_tokens: Sequence[int] | None = None
    seed: int | None = None


@dataclass
class ManyStats:
    """What a :func:`generate_many` run did: ``prompt_tokens`` (all prompts' tokens),
    ``prefill_tokens`` (prompt tokens decoded), ``shared_tokens`` (prompt tokens whose KV
    was copied from another sequence: ``prompt_tokens == prefill_tokens +
    shared_tokens``), ``generated_tokens`` (decoded while generating), ``decodes``
    (``llama_decode`` calls, counting a step's parts), ``steps`` and ``max_live`` (most
    sequences generating at once)."""

    prompt_tokens: int = 0
    prefill_tokens: int = 0
    shared_tokens: int = 0
    generated_tokens: int = 0
    decodes: int = 0
    steps: int = 0
    max_live: int = 0


@dataclass(eq=False)
class _Job:
    index: int
    tokens: npt.NDArray[np.int32]
    max_tokens: int
    sampler: Sampler | None
    grammar: Any
    stop: tuple[str, ...]
    enders: frozenset[int]
    seed: int | None
    text: StopStringStream | None = None
    branch: Branch | None = None
    pieces: list[str] = field(default_factory=list)
    generated: int = 0
    waited: bool = False
    cached: int = 0  # prompt tokens copied from another sequence or a cache entry
    t_admit: float = 0.0
    t_prompt: float = 0.0
    t_first: float | None = None


def _check_constraint(grammar: Any, json_schema: Any, prefix: str = "") -> None:
    """``grammar`` is None or what :meth:`BranchStore.create` takes (GBNF text, a JSON
    schema, a Grammar or a matcher) and ``json_schema`` None or a schema, else the
    TypeError naming ``prefix + "grammar"`` or ``prefix + "json_schema"``."""
    if json_schema is None and (grammar is None or isinstance(grammar, (str, dict))):
        return
    from .grammar import Grammar, GrammarMatcher
    from .grammar.compiled import CompiledGrammar
    from .grammar.grammar import _check_json_schema

    if json_schema is not None:
        _check_json_schema(json_schema, f"{prefix}json_schema")
    if not (
        grammar is None
        or isinstance(grammar, (str, dict, bool, Grammar, CompiledGrammar, GrammarMatcher))
        or any(callable(getattr(grammar, a, None)) for a in ("model_json_schema", "json_schema"))
    ):
        raise type_error(f"{prefix}grammar", "GBNF text, a JSON schema, a Grammar or a matcher, or None", grammar)


def _resolve_grammar(grammar: Any, json_schema: Any, where: str, prefix: str = "") -> Any:
    """The constraint of the call (``prefix`` empty) or of a request (``prefix``
    ``"prompts[i]."``, naming its fields): parsed, or checked to be one."""
    from .grammar import Grammar

    _check_constraint(grammar, json_schema, prefix)
    if grammar is not None and json_schema is not None:
        raise ParamError(f"{where}: give grammar or json_schema, not both")
    if json_schema is not None:
        return Grammar.from_json_schema(json_schema)
    if isinstance(grammar, str):
        return Grammar.from_gbnf(grammar)
    return grammar


def _max_tokens(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ParamError(f"{where} must be an int >= 0, not {value!r}")
    return value


class ManyRun(Iterator[tuple[int, Result]]):
    """The iterator of :func:`iter_many`: ``(index, result)`` pairs in completion order
    (``index`` is the request's position in the input). :attr:`stats` counts what the
    run decoded so far. Leaving it early (:meth:`close`, or dropping it) prunes every
    sequence it made; an error does the same, then propagates."""

    #: what the run has decoded so far
    stats: ManyStats
    #: how many requests the run holds
    total: int

    def __init__(
        self,
        store: BranchStore,
        prompts: Iterable[str | Sequence[int] | Request],
        max_tokens: int,
        sampler: Sampler | SamplingParams | None,
        grammar: Any,
        json_schema: Any,
        stop: Iterable[str],
        seed: int | None,
        stop_tokens: Iterable[int],
        n_parallel: int | None,
        share_prefixes: bool,
        keep_prefixes: int,
        logprobs: bool,
        unit: Literal["nats", "bits"],
        cache: PromptCache | None = None,
        on_error: Callable[[int, Exception], object] | None = None,
    ) -> None:
        self.store = store = _store(store)
        if on_error is not None and not callable(on_error):
            raise type_error("on_error", "a callable (index, exception), or None", on_error)
        self._on_error = on_error
        if isinstance(prompts, (str, bytes, Request)):
            raise type_error("prompts", "an iterable of prompts (str, token ids or Request)", prompts)
        expect_iterable("prompts", prompts, "an iterable of prompts (str, token ids or Request)")
        if isinstance(stop, str):
            raise type_error("stop", "an iterable of strings (a list, not one str)", stop)
        expect_iterable("stop", stop, "an iterable of strings (a list, not one str)")
        expect_iterable("stop_tokens", stop_tokens, "an iterable of token ids")
        share_prefixes = expect_bool("share_prefixes", share_prefixes)
        logprobs = expect_bool("logprobs", logprobs)
        _check_unit(unit)
        self._cache = _cache(cache, store)
        ctx = store.ctx
        vocab = ctx.model.vocab
        self._vocab = vocab
        self._n_ctx_seq = ctx.n_ctx_seq
        max_tokens = _max_tokens(max_tokens, "max_tokens")
        if seed is not None:
            seed = expect_int("seed", seed, "an int or None")
        sampler = as_sampler(sampler, ctx.model)
        default_stop = tuple(stop)
        default_enders = frozenset(int(t) for t in vocab.check_tokens(list(stop_tokens), "stop_tokens"))
        default_grammar = _resolve_grammar(grammar, json_schema, "the call")
        keep_prefixes = expect_int("keep_prefixes", keep_prefixes)
        if keep_prefixes < 0:
            raise ParamError(f"keep_prefixes must be >= 0, not {keep_prefixes}")
        self._share = bool(share_prefixes)
        if self._cache is not None and not self._share:
            raise ParamError("a cache shares prefixes: leave share_prefixes=True with cache=")
        # a cache keeps finished prompts itself (its own bounds, across calls)
        self._keep = keep_prefixes if self._share and self._cache is None else 0
        self._reader = LogprobReader(vocab, 0, unit) if logprobs else None
        jobs: list[_Job] = []
        for i, p in enumerate(prompts):
            req = p if isinstance(p, Request) else Request(p)
            where = f"prompts[{i}]"
            if isinstance(req.prompt, str):
                toks = vocab.tokenize(req.prompt)
            else:
                toks = vocab.check_tokens(req.prompt, f"{where}.prompt")
            arr = np.asarray(toks, dtype=np.int32)
            if len(arr) == 0:
                raise ParamError(f"{where}: a prompt needs at least one token")
            if len(arr) >= self._n_ctx_seq:
                raise ParamError(
                    f"{where}: the prompt has {len(arr)} tokens; each sequence of this context holds "
                    f"{self._n_ctx_seq} (n_ctx_seq), and one is needed to generate"
                )
            mt = max_tokens if req.max_tokens is None else _max_tokens(req.max_tokens, f"{where}.max_tokens")
            if req.grammar is not None or req.json_schema is not None:
                g = _resolve_grammar(req.grammar, req.json_schema, where, f"{where}.")
            else:
                g = default_grammar
            smp = as_sampler(req.sampler, ctx.model, f"{where}.sampler") if req.sampler is not None else sampler
            if isinstance(req.stop, str):
                raise type_error(f"{where}.stop", "a sequence of strings (a list, not one str)", req.stop)
            st = default_stop if req.stop is None else tuple(req.stop)
            enders = (
                default_enders
                if req.stop_tokens is None
                else frozenset(int(t) for t in vocab.check_tokens(list(req.stop_tokens), f"{where}.stop_tokens"))
            )
            sd = seed if req.seed is None else expect_int(f"{where}.seed", req.seed, "an int or None")
            jobs.append(_Job(i, arr, mt, smp, g, st, enders, sd))
        ids = store.available + (len(self._cache) if self._cache is not None else 0)  # a cache yields its ids
        if n_parallel is None:
            n_parallel = ids
        n_parallel = expect_int("n_parallel", n_parallel, "an int or None")
        if not 1 <= n_parallel <= ids:
            raise ParamError(
                f"n_parallel={n_parallel} must be in [1, {ids}] (the store's free sequence ids"
                + (" and those its cache holds" if self._cache is not None else "")
                + "; make the context with a larger n_seq_max for more)"
            )
        self._n_parallel = n_parallel
        self._enc_dec = ctx.model.has_encoder and ctx.model.has_decoder
        self._trimmable = not (ctx.model.is_recurrent or ctx.model.is_hybrid)  # generated tokens can be dropped
        self._pending: deque[_Job] = deque(jobs)
        self._live: dict[Branch, _Job] = {}
        self._holders: list[tuple[Branch, npt.NDArray[np.int32]]] = []  # kept prompts, oldest first
        self._ready: deque[tuple[int, Result]] = deque()
        self.stats = ManyStats(prompt_tokens=int(sum(len(j.tokens) for j in jobs)))
        self.total = len(jobs)
        self._closed = False

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> ManyRun:
        return self

    def __next__(self) -> tuple[int, Result]:
        while not self._ready:
            if self._closed or not (self._pending or self._live):
                self.close()
                raise StopIteration
            self._step_or_close()
        return self._ready.popleft()

    def _step_or_close(self) -> None:
        try:
            self._round()
        except BaseException:
            self.close()
            raise

    @property
    def done(self) -> bool:
        """Whether every request has finished and been handed out (or the run was closed)."""
        return self._closed or not (self._pending or self._live or self._ready)

    def close(self) -> None:
        """Stop: prune every sequence the run made (results not handed out are dropped)."""
        if self._closed:
            return
        self._closed = True
        for b in [*self._live, *(h for h, _ in self._holders)]:
            if b.alive:
                b.prune_subtree()
        self._live.clear()
        self._holders.clear()
        self._pending.clear()

    def __del__(self) -> None:  # pragma: no cover - best effort, the store may be gone
        try:
            self.close()
        except Exception:
            pass

    # ------------------------------------------------------------------ one step
    def _round(self) -> None:
        """Sample every live sequence, end those that ended, admit waiting prompts into the
        free slots, and decode the moves and the new prompts together."""
        store, vocab = self.store, self._vocab
        now = time.perf_counter()
        todo: list[Branch] = []
        for b, job in list(self._live.items()):
            if job.generated >= job.max_tokens:
                self._finish(b, job, "max_tokens")
            elif b.position >= self._n_ctx_seq:
                self._finish(b, job, "context")
            else:
                todo.append(b)
        picks = self._sample(todo) if todo else {}
        moves: dict[Branch, int] = {}
        for b, tok in picks.items():
            job = self._live[b]
            if job.t_first is None:
                job.t_first = now
            if vocab.is_eog(tok):
                self._finish(b, job, "grammar" if _grammar_forced_end(b) else "eog")
            elif tok in job.enders:
                self._finish(b, job, "stop_token")
            else:
                moves[b] = tok
        admitted = self._admit()
        if not moves and not admitted:
            return
        st = self.stats
        specs = [spec for _, spec in admitted]
        cap = store._batch.capacity
        tokens = len(moves) + sum(len(s.prompt) - s.prefix_len for s in specs)
        if self._enc_dec and admitted:
            job, spec = admitted[0]
            made = [store.create(spec.prompt, sampler=spec.sampler, grammar=spec.grammar, seed=spec.seed)]
            if moves:  # pragma: no cover - an encoder-decoder run admits only when nothing is live
                store.step(moves)
        elif self._cache is not None:
            sources = {s.prefix_from for s in specs if s.prefix_from is not None}
            made = self._cache.retry(lambda: store.step(moves, new=specs), keep=sources)
        else:
            made = store.step(moves, new=specs)
        st.decodes += -(-tokens // cap) if tokens else 0
        st.steps += 1
        st.generated_tokens += len(moves)
        t = time.perf_counter()
        for (job, spec), b in zip(admitted, made, strict=True):
            job.branch = b
            job.t_prompt = t
            job.text = StopStringStream(vocab, job.stop)
            self._live[b] = job
            st.prefill_tokens += len(spec.prompt) - spec.prefix_len
            st.shared_tokens += spec.prefix_len
            job.cached = spec.prefix_len
        for b, tok in moves.items():
            job = self._live[b]
            job.generated += 1
            assert job.text is not None
            piece = job.text.push(tok)
            if piece:
                job.pieces.append(piece)
            if job.text.stopped:
                self._finish(b, job, "stop")
        st.max_live = max(st.max_live, len(self._live))

    def _sample(self, todo: list[Branch]) -> dict[Branch, int]:
        """A token for each of ``todo`` (batched); with ``on_error``, a branch whose sampler
        fails (a grammar that allows no token, NaN logits) is dropped and reported, and the
        others keep the tokens they drew (each branch's sampler runs once a step)."""
        try:
            return self.store.sample(todo)
        except (LlamaError, ValueError):
            if self._on_error is None:
                raise
        picks: dict[Branch, int] = {}
        for b in todo:
            pending = b._pending  # drawn before the failure: kept (its RNG moved once)
            if pending is not None:
                picks[b] = pending[0]
                continue
            try:
                picks[b] = b.sample()
            except (LlamaError, ValueError) as exc:
                job = self._live.pop(b)
                b.prune()
                self._on_error(job.index, exc)
        return picks

    def _admit(self) -> list[tuple[_Job, NewBranch]]:
        """Waiting prompts for the free slots, each with the longest prefix it can copy."""
        store = self.store
        out: list[tuple[_Job, NewBranch]] = []
        if self._enc_dec:  # one encoder input per context: one sequence at a time
            if self._live or not self._pending:
                return out
            job = self._pending.popleft()
            job.t_admit = time.perf_counter()
            return [(job, self._spec(job, None, 0))]
        waiting: list[_Job] = []
        free = self._n_parallel - len(self._live)
        while self._pending and len(out) < free:
            job = self._pending[0]
            src, n = self._best_source(job) if self._share else (None, 0)
            if self._share and not job.waited:
                mate = max((_common(job.tokens, j.tokens) for j, _ in out), default=0)
                mate = min(mate, len(job.tokens) - 1)
                if mate >= SHARE_WAIT_MIN and mate > n:
                    job.waited = True  # the same prefix is decoded now for another prompt: copy it next step
                    waiting.append(self._pending.popleft())
                    continue
            used = {s.prefix_from for _, s in out if s.prefix_from is not None}  # copied from in this step
            if store.available <= len(out) and not self._evict(used | ({src} if src is not None else set())):
                if src is None or src in used or not self._evict(used):
                    break
                src, n = None, 0  # the only id to free held this prompt's prefix: decode it in full
            self._pending.popleft()
            job.t_admit = time.perf_counter()
            if self._cache is not None:
                self._cache._count(n if src is not None and src in self._cache else 0)
            out.append((job, self._spec(job, src, n)))
        self._pending.extendleft(reversed(waiting))
        return out

    def _spec(self, job: _Job, src: Branch | None, n: int) -> NewBranch:
        sampler = job.sampler.clone() if job.sampler is not None else None
        return NewBranch(job.tokens, sampler=sampler, grammar=job.grammar, seed=job.seed, prefix_from=src, prefix_len=n)

    def _best_source(self, job: _Job) -> tuple[Branch | None, int]:
        """The live sequence or kept prompt with the longest prefix ``job`` can copy."""
        best: tuple[Branch | None, int] = (None, 0)
        limit = len(job.tokens) - 1
        prompt = job.tokens.tolist()
        cands = [(b, j.tokens) for b, j in self._live.items()] + self._holders
        for b, toks in cands:
            n = min(_common(job.tokens, toks), limit)
            if n > best[1] and self.store.share_refusal(b, prompt, n) is None:
                best = (b, n)
        if best[0] is not None:
            for i, (h, _) in enumerate(self._holders):  # used: most recently
                if h is best[0]:
                    self._holders.append(self._holders.pop(i))
                    break
        if self._cache is not None:
            hit, n = self._cache._match(job.tokens)
            if n > best[1]:
                best = (hit, n)
        return best

    def _evict(self, keep: set[Branch]) -> bool:
        """Free a sequence id by dropping the oldest kept prompt (not one of ``keep``: the
        sources of the prompts being admitted), else the cache's least recently used entry."""
        for i, (h, _) in enumerate(self._holders):
            if h not in keep:
                del self._holders[i]
                h.prune()
                return True
        return self._cache is not None and self._cache.evict(keep)

    def _finish(self, b: Branch, job: _Job, reason: StopReason) -> None:
        """Hand out ``job``'s result and release its sequence (kept as a prompt to copy
        when a waiting prompt shares enough of it)."""
        text = job.text
        assert text is not None
        if reason != "stop":
            rest = text.flush()
            if rest:
                job.pieces.append(rest)
        end = time.perf_counter()
        start = len(job.tokens)
        gen_s = end - job.t_first if job.t_first is not None else 0.0
        timings = Timings(start, job.t_prompt - job.t_admit, job.generated, gen_s, job.generated)
        records = _accepted_records(b, 0, self._reader) if self._reader is not None else None
        r = _result(b, start, reason, timings, records, start)
        self._ready.append((job.index, dataclasses.replace(r, text="".join(job.pieces), cached_tokens=job.cached)))
        del self._live[b]
        if self._cache is not None:
            self._cache.add(b)
        elif self._keep and self._trimmable and self._worth_keeping(job.tokens):
            b._keep_prefix(start)
            self._holders.append((b, job.tokens))
            while len(self._holders) > self._keep:
                self._holders.pop(0)[0].prune()
        else:
            b.prune()

    def _worth_keeping(self, tokens: npt.NDArray[np.int32]) -> bool:
        for i, job in enumerate(self._pending):
            if i >= _LOOKAHEAD:
                break
            n = min(_common(job.tokens, tokens), len(job.tokens) - 1)
            if n >= SHARE_WAIT_MIN:
                have = max((_common(job.tokens, t) for _, t in self._holders), default=0)
                have = max(have, max((_common(job.tokens, j.tokens) for j in self._live.values()), default=0))
                if n > have:
                    return True
        return False


def iter_many(
    store: BranchStore,
    prompts: Iterable[str | Sequence[int] | Request],
    max_tokens: int = 128,
    sampler: Sampler | SamplingParams | None = None,
    grammar: Any = None,
    json_schema: Any = None,
    stop: Iterable[str] = (),
    seed: int | None = None,
    *,
    stop_tokens: Iterable[int] = (),
    n_parallel: int | None = None,
    share_prefixes: bool = True,
    keep_prefixes: int = 2,
    logprobs: bool = False,
    unit: Literal["nats", "bits"] = "nats",
    cache: PromptCache | None = None,
    on_error: Callable[[int, Exception], object] | None = None,
) -> ManyRun:
    """Generate for every prompt, up to ``n_parallel`` at once (default: every free
    sequence id of ``store``), yielding ``(index, result)`` as each finishes (see the
    module docstring). The settings apply to every prompt that is not a :class:`Request`
    overriding them; each prompt gets its own clone of ``sampler`` (reseeded with
    ``seed`` when given). Every prompt is checked (tokens, length, grammar) before
    anything is decoded. ``on_error(index, exception)``: called for a request whose
    sampling fails (a grammar that allows no token, NaN logits), which is then dropped
    while the others go on; without it the error ends the run. ``cache``: a
    :class:`~samplers.prompt_cache.PromptCache` of ``store``: prompts copy its entries'
    prefixes too, finished sequences become entries (in place of ``keep_prefixes``), and
    its sequence ids count as free (it gives them up as the run needs them)."""
    return ManyRun(
        store,
        prompts,
        max_tokens,
        sampler,
        grammar,
        json_schema,
        stop,
        seed,
        stop_tokens,
        n_parallel,
        share_prefixes,
        keep_prefixes,
        logprobs,
        unit,
        cache,
        on_error,
    )


def generate_many(
    store: BranchStore,
    prompts: Iterable[str | Sequence[int] | Request],
    max_tokens: int = 128,
    sampler: Sampler | SamplingParams | None = None,
    grammar: Any = None,
    json_schema: Any = None,
    stop: Iterable[str] = (),
    seed: int | None = None,
    *,
    stop_tokens: Iterable[int] = (),
    n_parallel: int | None = None,
    share_prefixes: bool = True,
    keep_prefixes: int = 2,
    logprobs: bool = False,
    unit: Literal["nats", "bits"] = "nats",
    stats: ManyStats | None = None,
    cache: PromptCache | None = None,
) -> list[Result]:
    """:func:`iter_many`, collected: one :class:`~samplers.search.Result` per prompt, in
    input order. ``stats``: a :class:`ManyStats` to fill with the run's counts."""
    run = iter_many(
        store,
        prompts,
        max_tokens,
        sampler,
        grammar,
        json_schema,
        stop,
        seed,
        stop_tokens=stop_tokens,
        n_parallel=n_parallel,
        share_prefixes=share_prefixes,
        keep_prefixes=keep_prefixes,
        logprobs=logprobs,
        unit=unit,
        cache=cache,
    )
    if stats is not None:
        expect("stats", stats, ManyStats, "a ManyStats or None")
    out: list[Result | None] = [None] * run.total
    try:
        for i, r in run:
            out[i] = r
    finally:
        if stats is not None:
            for f in dataclasses.fields(ManyStats):
                setattr(stats, f.name, getattr(run.stats, f.name))
    return [r for r in out if r is not None]


async def aiter_many(
    store: BranchStore,
    prompts: Iterable[str | Sequence[int] | Request],
    max_tokens: int = 128,
    sampler: Sampler | SamplingParams | None = None,
    grammar: Any = None,
    json_schema: Any = None,
    stop: Iterable[str] = (),
    seed: int | None = None,
    *,
    stop_tokens: Iterable[int] = (),
    n_parallel: int | None = None,
    share_prefixes: bool = True,
    keep_prefixes: int = 2,
    logprobs: bool = False,
    unit: Literal["nats", "bits"] = "nats",
    cache: PromptCache | None = None,
) -> AsyncIterator[tuple[int, Result]]:
    """:func:`iter_many` for asyncio: each step runs in a worker thread
    (:meth:`llama_cffi.Context.arun`), so the event loop stays free; cancelling the task
    aborts the decode in flight and prunes every sequence the run made."""
    run = iter_many(
        store,
        prompts,
        max_tokens,
        sampler,
        grammar,
        json_schema,
        stop,
        seed,
        stop_tokens=stop_tokens,
        n_parallel=n_parallel,
        share_prefixes=share_prefixes,
        keep_prefixes=keep_prefixes,
        logprobs=logprobs,
        unit=unit,
        cache=cache,
    )
    try:
        while True:
            while run._ready:
                yield run._ready.popleft()
            if run._closed or not (run._pending or run._live):
                return
            await run.store.ctx.arun(run._round)
    finally:
        run.close()


async def agenerate_many(
    store: BranchStore,
    prompts: Iterable[str | Sequence[int] | Request],
    max_tokens: int = 128,
    sampler: Sampler | SamplingParams | None = None,
    grammar: Any = None,
    json_schema: Any = None,
    stop: Iterable[str] = (),
    seed: int | None = None,
    *,
    stop_tokens: Iterable[int] = (),
    n_parallel: int | None = None,
    share_prefixes: bool = True,
    keep_prefixes: int = 2,
    logprobs: bool = False,
    unit: Literal["nats", "bits"] = "nats",
    cache: PromptCache | None = None,
) -> list[Result]:
    """:func:`generate_many` for asyncio (see :func:`aiter_many`)."""
    what = "an iterable of prompts (str, token ids or Request)"
    if isinstance(prompts, (str, bytes, Request)):
        raise type_error("prompts", what, prompts)
    prompts = list(expect_iterable("prompts", prompts, what))
    out: list[Result | None] = [None] * len(prompts)
    async for i, r in aiter_many(
        store,
        prompts,
        max_tokens,
        sampler,
        grammar,
        json_schema,
        stop,
        seed,
        stop_tokens=stop_tokens,
        n_parallel=n_parallel,
        share_prefixes=share_prefixes,
        keep_prefixes=keep_prefixes,
        logprobs=logprobs,
        unit=unit,
        cache=cache,
    ):
        out[i] = r
    return [r for r in out if r is not None]
