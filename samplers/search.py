"""Generation and search built on branches: streaming, best-of-n, beam search, top-k expansion.

Every helper advances its branches together (one ``llama_decode`` per step through
:meth:`~samplers.branch.BranchStore.step`). They take a :class:`BranchStore` whose
context has room for the branches they make (``n_seq_max``; beam search needs
``width`` ids, best-of-n ``n + 1``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np

from llama_cffi._args import (
    expect,
    expect_bool,
    expect_callable,
    expect_int,
    expect_iterable,
    expect_number,
    type_error,
)
from llama_cffi.context import Context
from llama_cffi.errors import KvCacheFullError, ParamError, ParamTypeError
from llama_cffi.kernels import softmax_sum
from llama_cffi.vocab import StopStringStream, Vocab

from .base import Sampler
from .branch import Branch, BranchError, BranchStore
from .chain import SamplerChain
from .logprobs import LogprobReader, TokenLogprob, _check_unit
from .params import SamplingParams, as_sampler
from .prompt_cache import PromptCache
from .selection import Greedy
from .speculative import Drafter, Verify, _check_verify, speculative_step

#: Why a generation ended: an end-of-generation token the model chose (``"eog"``) or the
#: grammar forced (``"grammar"``: its sentence was complete and nothing could follow), a
#: ``stop`` string (``"stop"``), a ``stop_tokens`` token (``"stop_token"``), the token
#: budget (``"max_tokens"``), or the sequence's room in the context (``"context"``).
StopReason = Literal["eog", "grammar", "stop", "stop_token", "max_tokens", "context"]


@dataclass(frozen=True)
class Timings:
    """Wall-clock times of one generation call (``time.perf_counter``), as data.

    ``prompt_seconds`` is the prompt's decode (0.0 when the branch was prefilled before
    the call, as for :func:`stream` on a branch you made); ``generation_seconds`` runs
    from the first sample to the end (sampling, decoding and bookkeeping: what a user
    waits for, not llama.cpp's decode time alone). ``decoded_tokens``: tokens decoded
    while generating, every branch counted (best-of-n decodes ``n`` continuations)."""

    prompt_tokens: int
    prompt_seconds: float
    generated_tokens: int
    generation_seconds: float
    decoded_tokens: int

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else math.nan

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens of the result per second."""
        return self.generated_tokens / self.generation_seconds if self.generation_seconds > 0 else math.nan

    @property
    def decoded_tokens_per_second(self) -> float:
        """Decoded tokens per second, every branch counted (the throughput)."""
        return self.decoded_tokens / self.generation_seconds if self.generation_seconds > 0 else math.nan


@dataclass(frozen=True)
class Result:
    """A finished continuation: the generated ``tokens`` (prompt excluded; an end token
    excluded except where :func:`beam_search` keeps it; a stop string's tokens included),
    the ``text`` (what :func:`stream` yielded: a stop string and what follows it
    excluded), the model-level
    ``perplexity`` and summed log-probability ``logprob`` (nats, always) of the scored
    tokens.

    ``stop_reason`` (:data:`StopReason`; None for a :class:`Stream` that was left before
    it ended), ``prompt_tokens``, ``positions`` (the ``[start, end)`` KV positions the
    generated tokens occupy in their sequence), ``timings`` and, when asked for,
    ``logprobs``: one :class:`~samplers.logprobs.TokenLogprob` per scored token (in the
    unit asked for), which sum to ``logprob``. The scored tokens are ``tokens``, plus the
    end token where :func:`best_of_n` ended on one (it is scored, not decoded)."""

    tokens: list[int]
    text: str
    perplexity: float
    logprob: float
    stop_reason: StopReason | None = "max_tokens"
    prompt_tokens: int = 0
    positions: tuple[int, int] = (0, 0)
    timings: Timings | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None
    #: prompt tokens whose KV was copied from a :class:`~samplers.prompt_cache.PromptCache`
    #: entry or another sequence rather than decoded (OpenAI's ``cached_tokens``)
    cached_tokens: int = 0


def _prompt_tokens(store: BranchStore, prompt: str | Sequence[int]) -> list[int]:
    vocab = store.ctx.model.vocab
    toks = vocab.tokenize(prompt) if isinstance(prompt, str) else vocab.check_tokens(prompt, "prompt")
    return [int(t) for t in toks]


def _store(store: object) -> BranchStore:
    """``store`` when it is a :class:`BranchStore`; a :class:`llama_cffi.Context` (a natural
    first try) or anything else is a :class:`~llama_cffi.errors.ParamTypeError` that says
    what to pass. A store is not made for the call: it would take over the context's
    sequences, whatever they hold."""
    if isinstance(store, BranchStore):
        return store
    if isinstance(store, Context):
        raise ParamTypeError(
            "store must be a samplers.branch.BranchStore, not a Context: make one for the context with "
            "BranchStore(ctx) and pass it (it takes over the context's sequences; keep it for every call)"
        )
    raise type_error("store", "a samplers.branch.BranchStore", store)


def _check_logprobs(logprobs: object, unit: object) -> bool:
    """``logprobs`` as a bool, ``unit`` checked (``"nats"`` or ``"bits"``) even when unused."""
    _check_unit(unit)
    return expect_bool("logprobs", logprobs)


def _check_run(stop_tokens: object = (), drafter: object = None, verify: object = "auto") -> Verify:
    """The generation options every helper passes on to :class:`Stream` (or the
    speculative steps), checked before any work: ``verify`` as the literal it is."""
    expect_iterable("stop_tokens", stop_tokens, "an iterable of token ids")
    if drafter is not None:
        expect("drafter", drafter, Drafter, "a samplers.speculative.Drafter or None")
    return _check_verify(verify)


def _optional_callable(name: str, value: object) -> None:
    if value is not None:
        expect_callable(name, value, "callable or None")


def _branch(branch: object) -> Branch:
    if not isinstance(branch, Branch):
        raise type_error("branch", "a samplers.branch.Branch (from BranchStore.create)", branch)
    return branch


def _accepted_records(branch: Branch, since: int, reader: LogprobReader | None) -> tuple[TokenLogprob, ...] | None:
    """Records of the tokens ``branch`` accepted after its ``since``-th (their model
    surprisals, measured when they were accepted)."""
    if reader is None:
        return None
    if branch.tracker is None:
        raise BranchError("logprobs need the branch's metrics: it was created with track=False")
    return tuple(reader.from_surprisal(tok, s) for _, tok, s, _ in branch._accepted[since:] if s is not None)


def _result(
    branch: Branch,
    start: int,
    stop_reason: StopReason | None = "max_tokens",
    timings: Timings | None = None,
    logprobs: tuple[TokenLogprob, ...] | None = None,
    prompt_tokens: int | None = None,
) -> Result:
    toks = branch.tokens[start:]
    vocab = branch.store.ctx.model.vocab
    return Result(
        toks,
        vocab.detokenize([t for t in toks if not vocab.is_eog(t)]),
        branch.perplexity,
        -branch._metrics().total_surprisal,
        stop_reason,
        start if prompt_tokens is None else prompt_tokens,
        (start, branch.position),
        timings,
        logprobs,
    )


def _grammar_forced_end(branch: Branch) -> bool:
    """Whether a grammar of the branch's chain is complete with nothing that could follow."""
    for s in branch.sampler.samplers:
        m = getattr(s, "matcher", None)
        if m is not None and not getattr(s, "awaiting", False) and m.is_complete():
            return True
    return False


class Stream(Iterator[str]):
    """The text pieces of a generation (an iterator of ``str``, never half a UTF-8
    character), and its :attr:`result` once it ends: tokens, stop reason, timings and the
    per-token log-probabilities asked for. Made by :func:`stream`."""

    def __init__(
        self,
        branch: Branch,
        max_tokens: int,
        stop: Iterable[str],
        stop_tokens: Iterable[int],
        drafter: Drafter | None,
        verify: Verify,
        reader: LogprobReader | None,
        prompt_seconds: float = 0.0,
        prompt_tokens: int | None = None,
        n_keep: int | None = None,
        on_shift: Callable[[], object] | None = None,
        make_room: Callable[[], bool] | None = None,
    ) -> None:
        branch = _branch(branch)
        verify = _check_run(stop_tokens, drafter, verify)
        if reader is not None:
            expect("reader", reader, LogprobReader, "a samplers.logprobs.LogprobReader or None")
        prompt_seconds = expect_number("prompt_seconds", prompt_seconds)
        if prompt_tokens is not None:
            prompt_tokens = expect_int("prompt_tokens", prompt_tokens, "an int or None")
        _optional_callable("on_shift", on_shift)
        _optional_callable("make_room", make_room)
        if n_keep is not None:
            _check_shift(branch, n_keep)
            if drafter is not None:
                raise ParamError(
                    "context_shift with a drafter: speculative steps need positions that match the history"
                )
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise ParamError(f"max_tokens must be an int >= 0, not {max_tokens!r}")
        if drafter is not None and reader is not None and reader.top:
            raise ParamError("top_logprobs needs each token's logits row: not available with a drafter")
        if reader is not None and branch.tracker is None and not reader.top:
            raise BranchError("logprobs need the branch's metrics: it was created with track=False")
        self.branch = branch
        self._start = branch.position
        self._accepted0 = len(branch._accepted)
        self._vocab = branch.store.ctx.model.vocab
        self._n_ctx_seq = branch.store.ctx.n_ctx_seq
        self._enders = {int(t) for t in stop_tokens}
        self._text = StopStringStream(self._vocab, stop)
        self._reader = reader
        self._records: list[TokenLogprob] = []
        self._pieces: list[str] = []
        self._prompt = (self._start if prompt_tokens is None else prompt_tokens, prompt_seconds)
        self._t0: float | None = None
        self._seconds = 0.0
        self.stop_reason: StopReason | None = None
        #: context shifts so far (``context_shift=True``): each dropped half of the positions after ``n_keep``
        self.shifts = 0
        self._n_keep = n_keep
        self._on_shift = on_shift
        # called when a token finds no KV cell (a prompt cache evicting an entry): True to try again
        self._make_room = make_room
        self._gen = self._run(max_tokens) if drafter is None else self._run_speculative(max_tokens, drafter, verify)

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> str:
        if self._t0 is None:
            self._t0 = time.perf_counter()
        try:
            piece = next(self._gen)
            self._pieces.append(piece)
            return piece
        except StopIteration:
            if self._seconds == 0.0:
                self._seconds = time.perf_counter() - self._t0
            raise

    @property
    def done(self) -> bool:
        """Whether the generation has ended (``stop_reason`` is set)."""
        return self.stop_reason is not None

    @property
    def result(self) -> Result:
        """The generation so far (all of it once :attr:`done`)."""
        b = self.branch
        n = b.position - self._start
        seconds = self._seconds
        if seconds == 0.0 and self._t0 is not None:
            seconds = time.perf_counter() - self._t0
        timings = Timings(self._prompt[0], self._prompt[1], n, seconds, n)
        if self._reader is not None and not self._reader.top:
            logprobs = _accepted_records(b, self._accepted0, self._reader)
        else:
            logprobs = tuple(self._records) if self._reader is not None else None
        r = _result(b, self._start, self.stop_reason, timings, logprobs, self._prompt[0])
        return dataclasses.replace(r, text="".join(self._pieces))

    def _end(self, tok: int) -> StopReason | None:
        if self._vocab.is_eog(tok):
            return "grammar" if _grammar_forced_end(self.branch) else "eog"
        if tok in self._enders:
            return "stop_token"
        return None

    def _run(self, max_tokens: int) -> Iterator[str]:
        branch, text, reader = self.branch, self._text, self._reader
        top = reader is not None and reader.top > 0
        for _ in range(max_tokens):
            if branch.position >= self._n_ctx_seq:
                if self._n_keep is None:
                    self.stop_reason = "context"
                    break
                self._shift()
            tok = branch.sample()
            reason = self._end(tok)
            if reason is not None:
                self.stop_reason = reason
                break
            if top:
                assert reader is not None
                self._records.append(reader.read(branch._model_row(), tok))
            self._commit(tok)
            piece = text.push(tok)
            if piece:
                yield piece
            if text.stopped:
                self.stop_reason = "stop"
                return
        else:
            self.stop_reason = "max_tokens"
        rest = text.flush()
        if rest:
            yield rest

    def _commit(self, tok: int) -> None:
        """``branch.commit(tok)``; when no KV cell is free, room made and tried again (a
        failed commit changes nothing)."""
        while True:
            try:
                self.branch.commit(tok)
                return
            except KvCacheFullError:
                if self._make_room is None or not self._make_room():
                    raise

    def _shift(self) -> None:
        """llama.cpp's context shift: keep the first ``n_keep`` positions, drop half of the
        rest (the oldest), shift the others down."""
        n_keep = self._n_keep
        assert n_keep is not None
        pos = self.branch.position
        self.branch.shift_context((pos - n_keep) // 2, sinks=n_keep)
        self.shifts += 1
        if self._on_shift is not None:
            self._on_shift()

    def _run_speculative(self, max_tokens: int, drafter: Drafter, verify: Verify) -> Iterator[str]:
        branch, text = self.branch, self._text
        pieces: list[str] = []

        def is_end(t: int) -> bool:
            return self._vocab.is_eog(t) or t in self._enders

        def on_commit(t: int) -> bool:
            piece = text.push(t)
            if piece:
                pieces.append(piece)
            return text.stopped

        n = 0
        tok = branch.sample() if max_tokens else None
        while tok is not None and n < max_tokens and not is_end(tok):
            if branch.position >= self._n_ctx_seq:
                self.stop_reason = "context"
                break
            budget = min(max_tokens - n, self._n_ctx_seq - branch.position)
            res = branch.speculate(tok, drafter, budget=budget, is_end=is_end, on_commit=on_commit, verify=verify)
            n += len(res.committed)
            yield from pieces
            pieces.clear()
            if res.stopped:
                self.stop_reason = "stop"
                return
            tok = res.next
        if self.stop_reason is None:
            end = self._end(tok) if tok is not None else None
            if end is None and n < max_tokens and branch.position >= self._n_ctx_seq:
                end = "context"  # the last step's budget was the room left: no next token drawn
            self.stop_reason = end or "max_tokens"
        rest = text.flush()
        if rest:
            yield rest


def _check_shift(branch: Branch, n_keep: object) -> None:
    """``n_keep`` checked for a context shift on ``branch``'s context (the context's own
    check: an int that leaves something to drop, on a memory that can shift)."""
    branch.store.ctx._check_shift(n_keep)


def stream(
    branch: Branch,
    max_tokens: int = 128,
    stop: Iterable[str] = (),
    stop_tokens: Iterable[int] = (),
    drafter: Drafter | None = None,
    verify: Verify = "auto",
    *,
    logprobs: bool = False,
    top_logprobs: int = 0,
    unit: Literal["nats", "bits"] = "nats",
    context_shift: bool = False,
    n_keep: int = 0,
) -> Stream:
    """Sample and commit up to ``max_tokens`` on ``branch``, yielding text pieces (never
    half a UTF-8 character). Ends at an end-of-generation token, a ``stop_tokens`` token
    (neither is committed), a ``stop`` string (its text is not yielded; its tokens are in
    the branch), or when the sequence fills the context. The returned :class:`Stream`
    is the iterator; its :attr:`~Stream.result` says why it ended, with timings and,
    with ``logprobs=True`` (or ``top_logprobs=N``), each generated token's
    log-probability under the model (and its N most likely alternatives) in ``unit``.

    With a ``drafter`` (:class:`~samplers.speculative.PromptLookup`,
    :class:`~samplers.speculative.DraftModel`) generation is speculative: each decode
    checks the drafted tokens and commits those the sampler agrees with. The tokens,
    the branch's sampler state and metrics are those of plain generation (``verify``,
    and the conditions for bit-exact rows: see :mod:`samplers.speculative`; outside them,
    up to rounding); ``drafter.stats`` counts what it bought.

    ``context_shift=True``: when the sequence fills the context (``n_ctx_seq``), llama.cpp's
    context shift instead of stopping: the first ``n_keep`` positions stay, the oldest
    half of the rest is dropped and the others shifted down (no recomputation;
    :meth:`Branch.shift_context`, so the branch must be the store's only live one).
    Refused with :class:`~llama_cffi.errors.UnsupportedError` where the memory cannot
    shift (a recurrent state, a sliding-window cache without ``swa_full=True``)."""
    branch = _branch(branch)
    context_shift = expect_bool("context_shift", context_shift)
    n_keep = expect_int("n_keep", n_keep)
    verify = _check_run(stop_tokens, drafter, verify)
    logprobs = _check_logprobs(logprobs, unit)
    reader = LogprobReader(branch.store.ctx.model.vocab, top_logprobs, unit) if logprobs or top_logprobs else None
    keep = n_keep if context_shift else None
    return Stream(branch, max_tokens, stop, stop_tokens, drafter, verify, reader, n_keep=keep)


def _setup(
    store: BranchStore,
    prompt: str | Sequence[int],
    grammar: Any,
    json_schema: Any,
    logprobs: bool,
    top_logprobs: int,
    unit: Literal["nats", "bits"],
) -> tuple[list[int], Any, LogprobReader | None]:
    logprobs = _check_logprobs(logprobs, unit)
    if json_schema is not None:
        from .grammar.grammar import _check_json_schema

        _check_json_schema(json_schema)
    if grammar is not None and json_schema is not None:
        raise ParamError("give grammar or json_schema, not both")
    reader = LogprobReader(store.ctx.model.vocab, top_logprobs, unit) if logprobs or top_logprobs else None
    if json_schema is not None:
        from .grammar import Grammar

        grammar = Grammar.from_json_schema(json_schema)
    return _prompt_tokens(store, prompt), grammar, reader


def complete(
    store: BranchStore,
    prompt: str | Sequence[int],
    max_tokens: int = 128,
    sampler: Sampler | SamplingParams | None = None,
    grammar: Any = None,
    json_schema: Any = None,
    stop: Iterable[str] = (),
    seed: int | None = None,
    drafter: Drafter | None = None,
    verify: Verify = "auto",
    *,
    stop_tokens: Iterable[int] = (),
    logprobs: bool = False,
    top_logprobs: int = 0,
    unit: Literal["nats", "bits"] = "nats",
    context_shift: bool = False,
    n_keep: int = 0,
    cache: PromptCache | None = None,
) -> Result:
    """Generate for ``prompt`` on a new branch (pruned afterwards) and return the whole
    :class:`Result`: text, tokens, stop reason, timings (the prompt's decode included),
    KV positions and, when asked for, per-token log-probabilities with ``top_logprobs``
    alternatives. ``grammar``: GBNF text, a Grammar or a matcher; ``json_schema``: a
    schema the output must satisfy; ``drafter``: speculative decoding; ``context_shift``,
    ``n_keep``: shift instead of stopping when the context fills (see :func:`stream`).

    ``cache``: a :class:`~samplers.prompt_cache.PromptCache` of ``store``: the prompt
    starts from its entry sharing the longest prefix (``Result.cached_tokens`` says how
    many tokens were copied), and the branch (prompt and generation) becomes an entry
    afterwards instead of being pruned."""
    store = _store(store)
    context_shift = expect_bool("context_shift", context_shift)
    n_keep = expect_int("n_keep", n_keep)
    verify = _check_run(stop_tokens, drafter, verify)
    cache = _cache(cache, store)
    toks, constraint, reader = _setup(store, prompt, grammar, json_schema, logprobs, top_logprobs, unit)
    t0 = time.perf_counter()
    if cache is None:
        branch, cached = store.create(toks, sampler=sampler, grammar=constraint, seed=seed), 0
    else:
        branch, cached = cache._create(toks, sampler, constraint, seed, True)
    prompt_seconds = time.perf_counter() - t0
    try:
        keep = n_keep if context_shift else None
        room = cache.evict if cache is not None else None
        s = Stream(
            branch, max_tokens, stop, stop_tokens, drafter, verify, reader, prompt_seconds, len(toks), keep, None, room
        )
        for _ in s:
            pass
        return dataclasses.replace(s.result, cached_tokens=cached)
    finally:
        if cache is not None and branch.alive and not branch.children:
            cache.add(branch)
        elif branch.alive:
            branch.prune_subtree()


def _cache(cache: object, store: BranchStore) -> PromptCache | None:
    """``cache`` checked: None, or a :class:`PromptCache` of ``store``."""
    if cache is None:
        return None
    if not isinstance(cache, PromptCache):
        raise type_error("cache", "a samplers.prompt_cache.PromptCache or None", cache)
    cache._check_store(store)
    return cache


def generate(
    store: BranchStore,
    prompt: str | Sequence[int],
    max_tokens: int = 128,
    sampler: Sampler | SamplingParams | None = None,
    grammar: Any = None,
    json_schema: Any = None,
    stop: Iterable[str] = (),
    seed: int | None = None,
    drafter: Drafter | None = None,
    verify: Verify = "auto",
    *,
    context_shift: bool = False,
    n_keep: int = 0,
    cache: PromptCache | None = None,
) -> str:
    """Generate text for ``prompt`` on a new branch (pruned afterwards, or kept in
    ``cache``): the text of :func:`complete`'s result."""
    store = _store(store)
    return complete(
        store,
        prompt,
        max_tokens,
        sampler,
        grammar,
        json_schema,
        stop,
        seed,
        drafter,
        verify,
        context_shift=context_shift,
        n_keep=n_keep,
        cache=cache,
    ).text


# ---------------------------------------------------------------------- async
_DONE = object()


class AsyncStream(AsyncIterator[str]):
    """A :class:`Stream` as an async iterator: each step (sampling and its decode) runs in a
    worker thread, so the event loop stays free. Cancelling the consuming task aborts the
    decode in flight (:meth:`llama_cffi.Context.arun`) and ends the stream; the branch
    keeps the tokens committed before (a failed decode changes no branch), so it can be
    streamed again. :attr:`result` is the wrapped stream's."""

    def __init__(self, stream: Stream) -> None:
        self.stream = expect("stream", stream, Stream, "a samplers.search.Stream (use astream)")

    def __aiter__(self) -> AsyncStream:
        return self

    async def __anext__(self) -> str:
        s = self.stream
        piece = await s.branch.store.ctx.arun(lambda: next(s, _DONE))
        if piece is _DONE:
            raise StopAsyncIteration
        return cast(str, piece)

    @property
    def done(self) -> bool:
        return self.stream.done

    @property
    def result(self) -> Result:
        return self.stream.result


def astream(
    branch: Branch,
    max_tokens: int = 128,
    stop: Iterable[str] = (),
    stop_tokens: Iterable[int] = (),
    drafter: Drafter | None = None,
    verify: Verify = "auto",
    *,
    logprobs: bool = False,
    top_logprobs: int = 0,
    unit: Literal["nats", "bits"] = "nats",
) -> AsyncStream:
    """:func:`stream` for asyncio: ``async for piece in astream(branch): ...``."""
    branch = _branch(branch)
    return AsyncStream(
        stream(
            branch,
            max_tokens,
            stop,
            stop_tokens,
            drafter,
            verify,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            unit=unit,
        )
    )


async def acomplete(
    store: BranchStore,
    prompt: str | Sequence[int],
    max_tokens: int = 128,
    sampler: Sampler | SamplingParams | None = None,
    grammar: Any = None,
    json_schema: Any = None,
    stop: Iterable[str] = (),
    seed: int | None = None,
    drafter: Drafter | None = None,
    verify: Verify = "auto",
    *,
    stop_tokens: Iterable[int] = (),
    logprobs: bool = False,
    top_logprobs: int = 0,
    unit: Literal["nats", "bits"] = "nats",
    cache: PromptCache | None = None,
) -> Result:
    """:func:`complete` for asyncio: the prompt's decode and each step run in a worker
    thread. Cancelling the awaiting task aborts the decode in flight and prunes the
    branch (the store is as it was before the call; with a ``cache``, a branch whose
    prompt was decoded becomes an entry, as after a finished call)."""
    store = _store(store)
    verify = _check_run(stop_tokens, drafter, verify)
    cache = _cache(cache, store)
    toks, constraint, reader = _setup(store, prompt, grammar, json_schema, logprobs, top_logprobs, unit)
    t0 = time.perf_counter()

    def make() -> tuple[Branch, int]:
        if cache is None:
            return store.create(toks, sampler=sampler, grammar=constraint, seed=seed), 0
        return cache._create(toks, sampler, constraint, seed, True)

    branch, cached = await store.ctx.arun(make, cleanup=lambda made: made[0].prune_subtree())
    prompt_seconds = time.perf_counter() - t0
    try:
        room = cache.evict if cache is not None else None
        s = AsyncStream(
            Stream(
                branch, max_tokens, stop, stop_tokens, drafter, verify, reader, prompt_seconds, len(toks), None, None,
                room,
            )
        )  # fmt: skip
        async for _ in s:
            pass
        return dataclasses.replace(s.result, cached_tokens=cached)
    finally:
        if cache is not None and branch.alive and not branch.children:
            cache.add(branch)
        elif branch.alive:
            branch.prune_subtree()


async def agenerate(
    store: BranchStore,
    prompt: str | Sequence[int],
    max_tokens: int = 128,
    sampler: Sampler | SamplingParams | None = None,
    grammar: Any = None,
    json_schema: Any = None,
    stop: Iterable[str] = (),
    seed: int | None = None,
    drafter: Drafter | None = None,
    verify: Verify = "auto",
    *,
    cache: PromptCache | None = None,
) -> str:
    """:func:`generate` for asyncio (the text of :func:`acomplete`'s result)."""
    store = _store(store)
    r = await acomplete(
        store, prompt, max_tokens, sampler, grammar, json_schema, stop, seed, drafter, verify, cache=cache
    )
    return r.text


def run_together(
    store: BranchStore,
    branches: list[Branch],
    max_tokens: int,
    drafters: Mapping[Branch, Drafter] | None = None,
    verify: Verify = "auto",
) -> int:
    """Step live branches together (one ``llama_decode`` per step) until each sampled an
    end-of-generation token (accepted, so it is scored, but not decoded) or
    ``max_tokens`` steps were taken. Returns the number of tokens decoded.

    ``drafters`` (one per branch): speculative steps, every branch's pending token and
    drafts in one decode; each branch ends with the tokens, sampler state and metrics
    it would have had without them."""
    store = _store(store)
    expect_iterable("branches", branches, "a list of branches of the store")
    max_tokens = expect_int("max_tokens", max_tokens)
    if drafters is not None and not isinstance(drafters, Mapping):
        raise type_error("drafters", "a mapping branch -> Drafter, or None", drafters)
    verify = _check_run(verify=verify)
    vocab = store.ctx.model.vocab
    if drafters is not None:
        return _run_speculative(store, branches, max_tokens, drafters, verify)
    live = list(branches)
    n = 0
    for _ in range(max_tokens):
        moves = _split_ends(((b, b.sample()) for b in live), vocab)
        if not moves:
            break
        store.step(moves)
        n += len(moves)
        live = list(moves)
    return n


def _split_ends(picks: Iterable[tuple[Branch, int]], vocab: Vocab) -> dict[Branch, int]:
    """The moves to decode: an end-of-generation token is accepted (scored) by its branch,
    not decoded, and that branch stops; the others move."""
    moves: dict[Branch, int] = {}
    for b, t in picks:
        if vocab.is_eog(t):
            b.accept(t)
        else:
            moves[b] = t
    return moves


def _run_speculative(
    store: BranchStore, branches: list[Branch], max_tokens: int, drafters: Mapping[Branch, Drafter], verify: Verify
) -> int:
    vocab = store.ctx.model.vocab
    done: dict[Branch, int] = {b: 0 for b in branches}
    pending: dict[Branch, int] = {b: b.sample() for b in branches} if max_tokens > 0 else {}
    n = 0
    while pending:
        moves = _split_ends(pending.items(), vocab)
        if not moves:
            break
        budget = {b: max_tokens - done[b] for b in moves}
        res = speculative_step(store, moves, drafters, budget=budget, verify=verify)
        pending = {}
        for b, r in res.items():
            done[b] += len(r.committed)
            n += len(r.committed)
            if r.next is not None and done[b] < max_tokens:
                pending[b] = r.next
    return n


def best_of_n(
    store: BranchStore,
    prompt: str | Sequence[int],
    n: int,
    max_tokens: int = 64,
    sampler: Sampler | SamplingParams | None = None,
    score: str | Callable[[Branch], float] = "perplexity",
    seed: int = 0,
    drafter: Drafter | None = None,
    verify: Verify = "auto",
    *,
    logprobs: bool = False,
    unit: Literal["nats", "bits"] = "nats",
) -> Result:
    """Sample ``n`` continuations of one prefilled prompt (forks reseeded ``seed + i``),
    advance them together and keep the best: lowest ``"perplexity"``, highest
    ``"logprob"``, or lowest ``score(branch)``. Every branch it made is pruned.
    ``drafter``: speculative steps, one clone of it per continuation. ``logprobs``: the
    best continuation's per-token log-probabilities in ``unit`` (its end token
    included when it ended on one); the timings count every continuation's decodes."""
    store = _store(store)
    n = expect_int("n", n)
    max_tokens = expect_int("max_tokens", max_tokens)
    seed = expect_int("seed", seed)
    verify = _check_run(drafter=drafter, verify=verify)
    logprobs = _check_logprobs(logprobs, unit)
    if n < 1:
        raise ParamError(f"n must be >= 1, not {n}")
    reader = LogprobReader(store.ctx.model.vocab, 0, unit) if logprobs else None
    chain = as_sampler(sampler, store.ctx.model) or SamplerChain([Greedy()])
    toks = _prompt_tokens(store, prompt)
    t0 = time.perf_counter()
    root = store.create(toks, sampler=chain)
    t1 = time.perf_counter()
    start = root.position
    accepted0 = len(root._accepted)
    try:
        kids = [root.fork(seed=seed + i) for i in range(n)]
        drafters: dict[Branch, Drafter] = {}
        try:
            if drafter is not None:
                for k in kids:  # one by one: those made before a failure are released below
                    drafters[k] = drafter.clone()
            decoded = run_together(store, kids, max_tokens, drafters or None, verify)
        finally:
            for d in drafters.values():
                release = getattr(d, "release", None)
                if release is not None:
                    release()
        t2 = time.perf_counter()
        if score == "perplexity":
            key: Callable[[Branch], float] = lambda b: b.perplexity  # noqa: E731
        elif score == "logprob":
            key = lambda b: b._metrics().total_surprisal  # noqa: E731
        elif callable(score):
            key = score
        else:
            raise ParamError(f"score must be 'perplexity', 'logprob' or a callable, not {score!r}")
        best = min(kids, key=key)
        ended = (
            bool(best._accepted)
            and len(best._accepted) > accepted0
            and store.ctx.model.vocab.is_eog(best._accepted[-1][1])
        )
        timings = Timings(start, t1 - t0, best.position - start, t2 - t1, decoded)
        reason: StopReason = "eog" if ended else "max_tokens"
        return _result(best, start, reason, timings, _accepted_records(best, accepted0, reader))
    finally:
        root.prune_subtree()


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    """log softmax(logits) in float64 (the normaliser from ggml's soft_max kernel)."""
    row = np.ascontiguousarray(logits, dtype=np.float32)
    m = float(row.max())
    scratch = np.empty_like(row)
    lse = m + math.log(softmax_sum(row, m, scratch))
    return row.astype(np.float64) - lse


def beam_search(
    store: BranchStore,
    prompt: str | Sequence[int],
    width: int,
    max_tokens: int = 32,
    length_penalty: float = 0.0,
    *,
    logprobs: bool = False,
    unit: Literal["nats", "bits"] = "nats",
) -> Result:
    """Beam search by summed log-probability (divided by ``length ** length_penalty``):
    at each step every beam proposes its ``width`` best tokens, the best ``width``
    (beam, token) pairs survive (beams chosen twice are forked, unchosen ones pruned) and
    advance in one decode. A beam ends at an end-of-generation token (kept in the result's
    tokens). Returns the best finished (or, at ``max_tokens``, live) beam; every branch it
    made is pruned. ``logprobs``: its per-token log-probabilities in ``unit``."""
    store = _store(store)
    width = expect_int("width", width)
    max_tokens = expect_int("max_tokens", max_tokens)
    length_penalty = expect_number("length_penalty", length_penalty)
    logprobs = _check_logprobs(logprobs, unit)
    if width < 1:
        raise ParamError(f"width must be >= 1, not {width}")
    reader = LogprobReader(store.ctx.model.vocab, 0, unit) if logprobs else None
    vocab = store.ctx.model.vocab
    toks = _prompt_tokens(store, prompt)
    t0 = time.perf_counter()
    root = store.create(toks)
    t1 = time.perf_counter()
    start = root.position
    made = [root]
    # (branch, summed logprob, each token's logprob)
    beams: list[tuple[Branch, float, list[float]]] = [(root, 0.0, [])]
    finished: list[tuple[float, list[int], float, list[float]]] = []  # (normalised score, tokens, logprob, per token)
    decoded = 0

    def norm(lp: float, n: int) -> float:
        return float(lp / (max(n, 1) ** length_penalty))

    try:
        for step in range(max_tokens):
            props: list[tuple[float, int, int, float]] = []  # (logprob, beam index, token, token's logprob)
            for i, (b, lp, _) in enumerate(beams):
                ls = _log_softmax(b.logits)
                top = np.argpartition(-ls, min(width, len(ls) - 1))[:width]
                props += [(lp + float(ls[t]), i, int(t), float(ls[t])) for t in top]
            props.sort(key=lambda x: -x[0])
            chosen: list[tuple[float, int, int, float]] = []
            for lp, i, t, tlp in props:
                if vocab.is_eog(t):
                    b, _, per = beams[i]
                    finished.append((norm(lp, step + 1), [*b.tokens[start:], t], lp, [*per, tlp]))
                else:
                    chosen.append((lp, i, t, tlp))
                if len(chosen) == width:
                    break
            best_done = max((f[0] for f in finished), default=-math.inf)
            if not chosen or (len(finished) >= width and best_done >= norm(chosen[0][0], step + 1)):
                break
            used = {i for _, i, _, _ in chosen}
            for i, (b, _, _) in enumerate(beams):  # free ids before forking
                if i not in used:
                    b.prune(reparent=True)
            moves: list[tuple[Branch, int]] = []
            nxt: list[tuple[Branch, float, list[float]]] = []
            taken: set[int] = set()
            for lp, i, t, tlp in chosen:
                b = beams[i][0]
                if i in taken:
                    b = b.fork()
                    made.append(b)
                taken.add(i)
                moves.append((b, t))
                nxt.append((b, lp, [*beams[i][2], tlp]))
            # the forks above copied their parent before any of them moved
            store.step(moves)
            decoded += len(moves)
            beams = nxt
        for b, lp, per in beams:
            finished.append((norm(lp, b.position - start), b.tokens[start:], lp, per))
        t2 = time.perf_counter()
        best = max(finished, key=lambda f: f[0])
        toks = best[1]
        ended = bool(toks) and vocab.is_eog(toks[-1])
        records = None
        if reader is not None:
            records = tuple(reader.from_surprisal(tok, -lp) for tok, lp in zip(toks, best[3], strict=True))
        n_decoded = len(toks) - (1 if ended else 0)
        return Result(
            toks,
            vocab.detokenize([t for t in toks if not vocab.is_eog(t)]),
            math.exp(-best[2] / max(len(toks), 1)),
            best[2],
            "eog" if ended else "max_tokens",
            start,
            (start, start + n_decoded),
            Timings(start, t1 - t0, len(toks), t2 - t1, decoded),
            records,
        )
    finally:
        for b in reversed(made):
            if b.alive:
                b.prune(reparent=True)


def expand_top_k(branch: Branch, k: int) -> list[Branch]:
    """Fork ``branch`` into ``k`` children, one per its ``k`` most likely next tokens
    (distinct), and advance them in one decode: the basic move of a tree search."""
    branch = _branch(branch)
    k = expect_int("k", k)
    if k < 1:
        raise ParamError(f"k must be >= 1, not {k}")
    ls = branch.logits
    top = np.argsort(-ls, kind="stable")[:k]
    kids = [branch.fork() for _ in top]
    branch.store.step({c: int(t) for c, t in zip(kids, top, strict=True)})
    return kids


# Many prompts at once live in samplers.many (continuous batching); they are reachable
# from here too, as samplers.search.generate_many and friends (imported on first use:
# samplers.many imports this module).
_MANY = frozenset({"Request", "ManyRun", "ManyStats", "generate_many", "iter_many", "agenerate_many", "aiter_many"})

if TYPE_CHECKING:
    from .many import ManyRun, ManyStats, Request, agenerate_many, aiter_many, generate_many, iter_many  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in _MANY:
        from . import many

        return getattr(many, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
