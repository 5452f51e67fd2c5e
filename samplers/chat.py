"""Chat sessions: a conversation kept in one sequence's KV cache across turns.

A :class:`ChatSession` renders the conversation with the model's chat template
(:meth:`llama_cffi.Model.format_chat`), tokenizes it, and decodes only what its KV cache
does not hold yet: the tokens after the longest common prefix with what it decoded before
(normally the end of the last reply's turn and the new message). Replies stream as text
pieces; each turn can take its own grammar or JSON schema, sampler, stop strings and
tools. The reply ends at the template's end of turn (``<|im_end|>``, ``<end_of_turn>``...)
or an end-of-generation token.

When a turn does not fit in the context (``n_ctx_seq``, the prompt plus ``max_tokens``):

* ``overflow="trim"`` (default): the oldest messages after the system message leave the
  window the model sees (the conversation stays in :attr:`ChatSession.messages`; the
  window is :meth:`ChatSession.window`), whole turns at a time, and the KV cache keeps
  the prefix that still matches;
* ``overflow="shift"``: StreamingLLM. The system prompt's tokens stay as attention sinks,
  the oldest tokens after them are dropped from the KV cache and the rest shifted down
  (no recomputation), and later turns append only their new text;
* ``overflow="error"``: :class:`~llama_cffi.KvCacheFullError`.

A reply that fills the context mid-way ends with stop reason ``"context"``.

Sessions keep a sequence of a :class:`~samplers.branch.BranchStore` (one is made for the
context when none is given). With ``cache=`` (a :class:`~samplers.prompt_cache.PromptCache`
of that store) a session's first turn starts from the entry sharing the longest prefix
with its rendering (the system prompt and tools of an earlier session, or a header
``cache.warm``-ed), and :meth:`ChatSession.close`/:meth:`ChatSession.reset` leave the
conversation's KV in the cache rather than freeing it. One thread at a time, like the
context.

With ``projector=`` (a :class:`llama_cffi.mtmd.Projector`) messages may hold images and
sounds as OpenAI-style content parts (see
:meth:`~llama_cffi.mtmd.Projector.tokenize_chat`; ``media_path`` for ``file://`` URLs):
each turn's rendering is tokenized with its media, and the cache keeps a medium's cells
for the later turns (a medium is decoded whole, or not at all). Without one, such
messages are refused rather than rendered as bare markers.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from llama_cffi._args import (
    expect,
    expect_bool,
    expect_int,
    expect_iterable,
    expect_mapping,
    expect_path,
    expect_str,
    type_error,
)
from llama_cffi.chat import ChatPrompt, ReasoningFormat, TemplateLimits, _has_media
from llama_cffi.errors import KvCacheFullError, ParamError, UnsupportedError

from .base import Sampler, check_context
from .branch import Branch, BranchStore, _as_chain
from .chain import SamplerChain
from .measure import PerplexityTracker
from .params import SamplingParams
from .prompt_cache import PromptCache
from .reasoning import reasoning_budget_for, split_reasoning
from .search import AsyncStream, Result, Stream
from .tools import ToolCall, ToolCallFormat, parse_tool_calls, tool_call_format, tool_call_grammar

if TYPE_CHECKING:
    from llama_cffi import Context
    from llama_cffi.mtmd import Chunks, Projector

__all__ = ["ChatReply", "ChatSession", "ChatStream"]

_Overflow = Literal["trim", "shift", "error"]


@dataclass(frozen=True)
class ChatReply:
    """One assistant turn: its ``text``, the generation's :class:`~samplers.search.Result`
    (tokens, stop reason, timings, log-probabilities), and the prompt's cost:
    ``reused_tokens`` the KV cache already held, ``decoded_tokens`` decoded for this turn's
    prompt."""

    text: str
    result: Result
    reused_tokens: int
    decoded_tokens: int
    #: the tool calls parsed from the reply (empty unless the turn was given tools); ``text``
    #: is then the content before them, and ``result.text`` the whole reply
    tool_calls: tuple[ToolCall, ...] = field(default=())
    #: the reply's reasoning (``reasoning_content``: what the template's reasoning markers,
    #: ``<think>...</think>`` and the like, enclose), trimmed; ``text`` is then the rest
    reasoning: str = ""


class ChatStream(Iterator[str]):
    """The text pieces of a reply; :attr:`reply` once it has ended (the assistant message
    is added to the session then)."""

    def __init__(
        self,
        session: ChatSession,
        stream: Stream,
        reused: int,
        decoded: int,
        fmt: ToolCallFormat | None = None,
        reasoning: ReasoningFormat | None = None,
        opened: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self._session = expect("session", session, ChatSession, "a ChatSession (use ChatSession.stream)")
        self._stream = expect("stream", stream, Stream, "a samplers.search.Stream")
        self._reused = expect_int("reused", reused)
        self._decoded = expect_int("decoded", decoded)
        if fmt is not None:
            expect("fmt", fmt, ToolCallFormat, "a samplers.tools.ToolCallFormat or None")
        if reasoning is not None:
            expect("reasoning", reasoning, ReasoningFormat, "a llama_cffi.chat.ReasoningFormat or None")
        self._fmt = fmt
        self._tools = None if tools is None else list(expect_iterable("tools", tools, "a sequence of tool specs"))
        self._reasoning = (reasoning, expect_bool("opened", opened))
        self._reply: ChatReply | None = None

    def __iter__(self) -> ChatStream:
        return self

    def __next__(self) -> str:
        try:
            return next(self._stream)
        except StopIteration:
            self._finish()
            raise

    def _finish(self) -> None:
        if self._reply is None:
            r = self._stream.result
            thoughts, text = split_reasoning(r.text, *self._reasoning)
            content, calls = parse_tool_calls(text, self._fmt, self._tools)
            turn = self._session._turns
            calls = [c if c.id else ToolCall(c.name, c.arguments, f"call_{turn}_{i}") for i, c in enumerate(calls)]
            self._reply = ChatReply(content, r, self._reused, self._decoded, tuple(calls), thoughts)
            self._session._replied(self._reply)

    @property
    def reply(self) -> ChatReply:
        """The finished reply (iterate to the end first)."""
        if self._reply is None:
            if not self._stream.done:
                raise ParamError("the reply has not ended: iterate the stream to its end first")
            self._finish()
        assert self._reply is not None
        return self._reply


class ChatSession:
    """A conversation over ``ctx`` (see the module docstring).

    ``system``: a system message to start with. ``template``: None for the model's own
    (or its family's default, :meth:`llama_cffi.Model.chat_template_or_default`), a builtin
    name or template text. ``sampler``: a sampler, a chain, or
    :class:`~samplers.params.SamplingParams` (greedy when None); it is cloned for each turn
    and, with ``seed``, reseeded ``seed + turn``. ``max_tokens``: the default reply
    budget. ``template_kwargs``: more template variables. ``cache``: a
    :class:`~samplers.prompt_cache.PromptCache` to start from and to leave the
    conversation in (its store is the session's; see the module docstring).
    ``projector``: reads the images and sounds of messages (not with ``overflow="shift"``
    or a ``cache`` yet); ``media_path``: the directory their ``file://`` URLs are read
    under. ``reasoning``: the template's ``enable_thinking`` (None: the template's
    default); ``reasoning_budget``: the most tokens a reply's reasoning block may take
    (llama.cpp's reasoning budget: the end marker is then forced, after
    ``reasoning_budget_message``). A reply's reasoning is :attr:`ChatReply.reasoning`,
    kept in history as the message's ``reasoning_content`` (shown again or dropped as the
    template decides)."""

    def __init__(
        self,
        ctx: Context,
        *,
        system: str | None = None,
        template: str | None = None,
        sampler: Sampler | SamplingParams | None = None,
        seed: int | None = None,
        max_tokens: int = 512,
        overflow: Literal["trim", "shift", "error"] = "trim",
        store: BranchStore | None = None,
        engine: str = "auto",
        limits: TemplateLimits | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        cache: PromptCache | None = None,
        projector: Projector | None = None,
        media_path: str | os.PathLike[str] | None = None,
        reasoning: bool | None = None,
        reasoning_budget: int | None = None,
        reasoning_budget_message: str = "",
    ) -> None:
        check_context(ctx)
        for name, text in (("system", system), ("template", template)):
            if text is not None:
                expect_str(name, text, "a str or None")
        _check_sampler(sampler)
        if seed is not None:
            seed = expect_int("seed", seed, "an int or None")
        if store is not None:
            expect("store", store, BranchStore, "a samplers.branch.BranchStore or None")
        expect_str("engine", engine, "'auto', 'native' or 'jinja'")
        if limits is not None:
            expect("limits", limits, TemplateLimits, "a llama_cffi.chat.TemplateLimits or None")
        if template_kwargs is not None:
            expect_mapping("template_kwargs", template_kwargs, "a mapping of template variables or None")
        if media_path is not None:
            expect_path("media_path", media_path)
        if projector is not None:
            from llama_cffi.mtmd import Projector

            expect("projector", projector, Projector, "a llama_cffi.mtmd.Projector or None")
            if projector.model is not ctx.model:
                raise ParamError("the projector is of another model than the context's")
            if projector.uses_mrope:
                raise UnsupportedError(
                    "a chat session keeps its conversation in a branch, whose positions are its cells; with M-RoPE "
                    "(Qwen-VL) an image takes fewer positions than cells"
                )
            if overflow == "shift":
                raise ParamError(
                    "overflow='shift' appends new text to what the cache holds and cannot place images or sounds: "
                    "use 'trim' or 'error' with a projector"
                )
            if cache is not None:
                raise ParamError("a prompt cache does not hold images or sounds yet: use cache=None with a projector")
        if overflow not in ("trim", "shift", "error"):
            raise ParamError(f"overflow must be 'trim', 'shift' or 'error', not {overflow!r}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ParamError(f"max_tokens must be an int >= 1, not {max_tokens!r}")
        self.ctx = ctx
        self.model = ctx.model
        if cache is not None:
            expect("cache", cache, PromptCache, "a samplers.prompt_cache.PromptCache or None")
            if cache.store.ctx is not ctx:
                raise ParamError("cache belongs to a store of another context")
            if store is None:
                store = cache.store
            cache._check_store(store)
        self.store = store if store is not None else BranchStore(ctx)
        #: the prompt cache the session starts from and leaves its conversation in, or None
        self.cache = cache
        self.template = template
        self.sampler = sampler
        self.seed = seed
        self.max_tokens = max_tokens
        self.overflow: _Overflow = overflow
        self.engine = engine
        self.limits = limits
        self.template_kwargs = dict(template_kwargs or {})
        if reasoning is not None:
            self.template_kwargs["enable_thinking"] = expect_bool("reasoning", reasoning)
        if reasoning_budget is not None:
            reasoning_budget = expect_int("reasoning_budget", reasoning_budget)
            if reasoning_budget < 0:
                raise ParamError(f"reasoning_budget must be >= 0 tokens (or None: no budget), not {reasoning_budget}")
        if not isinstance(reasoning_budget_message, str):
            raise type_error("reasoning_budget_message", "a str", reasoning_budget_message)
        #: the most tokens a reply's reasoning block may take (None: no bound); at the budget
        #: the end marker is forced (after ``reasoning_budget_message``)
        self.reasoning_budget = reasoning_budget
        self.reasoning_budget_message = reasoning_budget_message
        #: the whole conversation (OpenAI-style message dicts)
        self.messages: list[dict[str, Any]] = []
        if system is not None:
            self.messages.append({"role": "system", "content": system})
        self._first = 0  # the first non-system message in the window
        self._branch: Branch | None = None
        self._shifted = False  # positions no longer match a rendering: append new text only
        # what the KV cache holds, as text (for shifted sessions): the rendering the last
        # turn's prompt came from, then the reply generated after it
        self._kv_prompt = ""
        self._kv_reply = ""
        self._turns = 0
        #: the multimodal projector that reads the messages' images and sounds, or None
        self.projector = projector
        #: the directory file:// URLs of image and sound parts are read under (None: none are read)
        self.media_path = media_path
        self._chunks: Chunks | None = None  # the last rendering's chunks, with a projector

    # ------------------------------------------------------------------ conversation
    def window(self) -> list[dict[str, Any]]:
        """The messages the model sees: the system message, then the messages not trimmed."""
        head = [m for m in self.messages[:1] if m["role"] == "system"]
        return head + self.messages[len(head) + self._first :]

    def add_message(self, role: str, content: Any, **extra: Any) -> None:
        """Append a message without generating (a user message to answer later, a tool's
        result: ``add_message("tool", "...", tool_call_id=...)``)."""
        if not isinstance(role, str) or not role:
            raise ParamError(f"role must be a non-empty str, not {role!r}")
        _content(content)
        self.messages.append({"role": role, "content": content, **extra})

    def reset(self, keep_system: bool = True) -> None:
        """Forget the conversation (the system message stays unless ``keep_system=False``)
        and free the sequence (with a cache, its KV becomes a cache entry instead)."""
        keep_system = expect_bool("keep_system", keep_system)
        system = [m for m in self.messages[:1] if m["role"] == "system" and keep_system]
        self.messages = system
        self._first = 0
        self._drop_branch()

    def close(self) -> None:
        """Free the session's sequence (the context stays open; with a cache, the
        conversation's KV becomes a cache entry instead) and its media."""
        self._drop_branch()
        if self._chunks is not None:
            self._chunks.close()
            self._chunks = None

    def __enter__(self) -> ChatSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def tokens(self) -> list[int]:
        """The tokens the session's KV cache holds, in order (a copy)."""
        return self._branch.tokens if self._branch is not None else []

    @property
    def position(self) -> int:
        """The next position of the session's sequence (0 before the first turn)."""
        return self._branch.position if self._branch is not None else 0

    def _drop_branch(self) -> None:
        b = self._branch
        if b is not None and b.alive:
            if self.cache is not None and not b.children:
                self.cache.add(b)  # the conversation so far, for a later session or turn
            else:
                b.prune_subtree()
        self._branch = None
        self._shifted = False
        self._kv_prompt = self._kv_reply = ""

    # ------------------------------------------------------------------ a turn
    def send(self, content: Any = None, **options: Any) -> ChatReply:
        """Add a user message (``content``: text or text parts; None to answer the messages
        added so far) and generate the reply. ``options``: see :meth:`stream`."""
        s = self.stream(_content(content), **options)
        for _ in s:
            pass
        return s.reply

    def stream(
        self,
        content: Any = None,
        *,
        max_tokens: int | None = None,
        grammar: Any = None,
        json_schema: Any = None,
        sampler: Sampler | SamplingParams | None = None,
        stop: Sequence[str] = (),
        tools: Sequence[Mapping[str, Any]] | None = None,
        constrain_tools: bool = True,
        parallel_tool_calls: bool = False,
        logprobs: bool = False,
        top_logprobs: int = 0,
        tool_choice: str | Mapping[str, Any] = "auto",
    ) -> ChatStream:
        """Add a user message and stream the reply's text. ``grammar`` (GBNF text, a Grammar)
        or ``json_schema`` constrain this reply only; ``sampler`` overrides the session's for
        this reply; ``stop`` adds stop strings to the template's end of turn.

        ``tools`` (OpenAI-style function specs) are rendered when the template declares
        them; a reply's calls are then parsed (:mod:`samplers.tools`) into
        :attr:`ChatReply.tool_calls`, and with ``constrain_tools`` a lazy grammar keeps a
        call well-formed (a known tool, arguments that satisfy its schema) from its start
        marker on; ``parallel_tool_calls`` allows several calls in one reply.

        ``tool_choice`` (OpenAI's): ``"auto"`` (the model decides; the lazy grammar
        above), ``"none"`` (tools rendered, no call parsed or constrained: the reply is
        content), ``"required"`` (the reply is a call, from its first token: the call
        grammar applied at once), or ``{"type": "function", "function": {"name": N}}``
        (a call to ``N``). Forcing a call needs a template whose call format is known
        (:func:`~samplers.tools.tool_call_format`) and no ``grammar``/``json_schema``."""
        content = _content(content)
        if json_schema is not None:
            from .grammar.grammar import _check_json_schema

            _check_json_schema(json_schema)
        _check_sampler(sampler)
        if isinstance(stop, str):
            raise type_error("stop", "a sequence of strings (a list, not one str)", stop)
        expect_iterable("stop", stop, "a sequence of strings")
        constrain_tools = expect_bool("constrain_tools", constrain_tools)
        parallel_tool_calls = expect_bool("parallel_tool_calls", parallel_tool_calls)
        choice = _tool_choice(tool_choice, tools)
        if choice not in ("auto", "none") and (grammar is not None or json_schema is not None):
            raise ParamError(f"tool_choice={tool_choice!r} forces a call: give no grammar or json_schema with it")
        logprobs = expect_bool("logprobs", logprobs)
        if grammar is not None and json_schema is not None:
            raise ParamError("give grammar or json_schema, not both")
        n = self.max_tokens if max_tokens is None else max_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ParamError(f"max_tokens must be an int >= 1, not {n!r}")
        added = False
        if content is not None:
            self.add_message("user", content)
            added = True
        try:
            prompt, reused, decoded = self._prepare(n, tools)
        except BaseException:
            if added:
                self.messages.pop()
            raise
        branch = self._branch
        assert branch is not None
        constraint = grammar if json_schema is None else _schema_grammar(json_schema)
        chain = self._chain(sampler, constraint)
        fmt = tool_call_format(prompt.template, self._jinja_engine()) if prompt.tools_rendered else None
        if choice == "none":
            fmt = None  # nothing parsed: the reply is content
        elif choice != "auto":
            if fmt is None or not tools:
                if added:
                    self.messages.pop()
                raise ParamError(
                    f"tool_choice={tool_choice!r} forces a call, but this template renders no tools or its call format "
                    "is unknown (samplers.tools.tool_call_format)"
                )
            from .grammar import Grammar, GrammarSampler

            named = [t for t in tools if f"function:{_tool_name(t)}" == choice]
            chosen = list(tools) if choice == "required" else named
            gbnf, _ = tool_call_grammar(fmt, chosen, parallel_tool_calls)
            forced = GrammarSampler(Grammar.from_gbnf(gbnf), self.model)
            chain = SamplerChain([forced, *chain.samplers], tracker=chain.tracker)
        elif fmt is not None and tools and constraint is None and constrain_tools:
            from .grammar import Grammar, GrammarSampler

            gbnf, triggers = tool_call_grammar(fmt, tools, parallel_tool_calls)
            if triggers:  # calls with no marker (Llama 3.x): no lazy grammar, as in llama.cpp
                lazy = GrammarSampler(Grammar.from_gbnf(gbnf), self.model, lazy=True, trigger_words=triggers)
                chain = SamplerChain([lazy, *chain.samplers], tracker=chain.tracker)
        if prompt.reasoning is not None and self.reasoning_budget is not None:
            budget = reasoning_budget_for(
                self.model,
                prompt.reasoning,
                self.reasoning_budget,
                message=self.reasoning_budget_message,
                opened=prompt.reasoning_open,
            )
            chain = SamplerChain([budget, *chain.samplers], tracker=chain.tracker)
        branch.sampler = chain
        branch.tracker = PerplexityTracker()
        from .logprobs import LogprobReader

        reader = LogprobReader(self.model.vocab, top_logprobs) if logprobs or top_logprobs else None
        stops = (*prompt.stop, *stop)
        s = Stream(branch, n, stops, prompt.stop_tokens, None, "auto", reader, 0.0, branch.position)
        self._turns += 1
        return ChatStream(
            self, s, reused, decoded, fmt, prompt.reasoning, prompt.reasoning_open, list(tools) if tools else None
        )

    async def asend(self, content: Any = None, **options: Any) -> ChatReply:
        """:meth:`send` for asyncio: the prompt's decode and each step run in a worker thread;
        cancelling the task aborts the decode in flight (the reply is then not added)."""
        _content(content)
        chat = await self.ctx.arun(lambda: self.stream(content, **options), cleanup=self._abandon)
        async for _ in AsyncStream(chat._stream):
            pass
        return chat.reply

    async def astream(self, content: Any = None, **options: Any) -> AsyncIterator[str]:
        """:meth:`stream` for asyncio: ``async for piece in session.astream("Hi"): ...``."""
        _content(content)
        chat = await self.ctx.arun(lambda: self.stream(content, **options), cleanup=self._abandon)
        async for piece in AsyncStream(chat._stream):
            yield piece
        chat._finish()

    def _abandon(self, chat: ChatStream) -> None:
        """A prepared turn whose task was cancelled: forget its user message."""
        if self.messages and self.messages[-1]["role"] == "user":
            self.messages.pop()

    def _replied(self, reply: ChatReply) -> None:
        # llama.cpp renders templates from C strings: a NUL the model generated is kept as U+FFFD
        message: dict[str, Any] = {"role": "assistant", "content": reply.text.replace("\0", "\ufffd")}
        if reply.reasoning:  # the template decides whether later turns show it (Qwen3's drop it)
            message["reasoning_content"] = reply.reasoning.replace("\0", "\ufffd")
        if reply.tool_calls:
            message["tool_calls"] = [c.message() for c in reply.tool_calls]
        self.messages.append(message)
        self._kv_reply = reply.result.text

    def add_tool_result(self, call: ToolCall, content: str) -> None:
        """Answer a tool call of the last reply: a ``tool`` message with its id and name."""
        expect("call", call, ToolCall, "a samplers.tools.ToolCall (from a reply's tool_calls)")
        self.add_message("tool", content, tool_call_id=call.id, name=call.name)

    def _jinja_engine(self) -> str:
        return "native" if self.engine == "native" else "jinja"

    def _chain(self, sampler: Sampler | SamplingParams | None, constraint: Any) -> SamplerChain:
        s = sampler if sampler is not None else self.sampler
        base: Sampler | None
        if isinstance(s, SamplingParams):
            if self.seed is not None:
                s = s.replace(seed=self.seed + self._turns)
            base = s.to_chain(self.model)
        else:
            base = s.clone() if s is not None else None
        chain = _as_chain(base, constraint, self.model)
        if self.seed is not None and not isinstance(s, SamplingParams):
            for smp in chain.samplers:
                if hasattr(smp, "reseed"):
                    smp.reseed(self.seed + self._turns)
                elif hasattr(smp, "rng") and hasattr(smp.rng, "reseed"):
                    smp.rng.reseed(self.seed + self._turns)
        return chain

    # ------------------------------------------------------------------ the KV cache
    def _render(self, tools: Sequence[Mapping[str, Any]] | None) -> tuple[ChatPrompt, list[int]]:
        window = self.window()
        if self.projector is not None:
            if self._chunks is not None:
                self._chunks.close()
                self._chunks = None
            p, chunks = self.projector.tokenize_chat(
                window,
                True,
                template=self.template,
                tools=tools,
                engine=self.engine,
                media_path=self.media_path,
                limits=self.limits,
                **self.template_kwargs,
            )
            self._chunks = chunks
            return p, self.store.cells(chunks)
        if any(_has_media(m.get("content")) for m in window):
            raise ParamError(
                "the messages hold images or sounds: make the session with projector= (a llama_cffi.mtmd.Projector)"
            )
        p = self.model.format_chat(
            self.window(),
            True,
            template=self.template,
            tools=tools,
            engine=self.engine,
            limits=self.limits,
            **self.template_kwargs,
        )
        toks = self.model.vocab.tokenize(p.prompt, add_special=p.add_special, parse_special=True)
        return p, [int(t) for t in toks]

    def _prepare(self, budget: int, tools: Sequence[Mapping[str, Any]] | None) -> tuple[ChatPrompt, int, int]:
        """Render, fit, and bring the KV cache up to the prompt: ``(prompt, reused, decoded)``."""
        room = self.ctx.n_ctx_seq
        if self._shifted:
            done = self._append_delta(budget, tools)
            if done is not None:
                return done
            self._drop_branch()  # the rendering no longer extends what the cache holds
        prompt, toks = self._render(tools)
        while len(toks) + budget > room:
            if self.overflow == "shift" and self._branch is not None:
                break  # shift below, once the cache holds the prompt
            if self.overflow == "error" or not self._trim():
                raise KvCacheFullError(
                    f"the conversation ({len(toks)} tokens) and max_tokens={budget} do not fit in "
                    f"n_ctx_seq={room}" + ("" if self.overflow == "error" else " even with every old message trimmed")
                )
            prompt, toks = self._render(tools)
        if self.overflow == "shift" and len(toks) + budget > room and self._branch is not None:
            done = self._append_delta(budget, tools)  # shifts old tokens out to make room
            if done is not None:
                return done
            self._drop_branch()
            while len(toks) + budget > room:  # starting over: trim to fit
                if not self._trim():
                    raise KvCacheFullError(
                        f"the conversation ({len(toks)} tokens) and max_tokens={budget} do not fit in n_ctx_seq={room}"
                    )
                prompt, toks = self._render(tools)
        return (prompt, *self._sync(toks, prompt))

    def _trim(self) -> bool:
        """Drop the oldest turn from the window (a message, and the replies and tool results
        that follow it up to the next user message). False when nothing is left to drop."""
        head = 1 if self.messages and self.messages[0]["role"] == "system" else 0
        rest = self.messages[head + self._first :]
        if len(rest) <= 1:
            return False
        n = 1
        while n < len(rest) - 1 and rest[n]["role"] != "user":
            n += 1
        self._first += n
        return True

    def _sync(self, toks: list[int], prompt: ChatPrompt) -> tuple[int, int]:
        """Make the branch hold ``toks``; returns (reused, decoded)."""
        b = self._branch
        if b is not None:
            held = b.tokens
            common = 0
            limit = min(len(held), len(toks))
            while common < limit and held[common] == toks[common]:
                common += 1
            while 0 < common < len(toks) and toks[common] < 0 and toks[common - 1] == toks[common]:
                common -= 1  # never inside an image or sound: decoded whole, or not at all
            recurrent = self.model.is_recurrent or self.model.is_hybrid
            if common == 0 or (common < len(held) and recurrent):
                self._drop_branch()
                b = None
            elif self._chunks is not None:
                if common == len(toks):
                    common -= 1  # the last prompt token (text) is decoded again for its logits
                b._cut(common)
                self.store._extend_media(b, self._chunks, common)
                self._kv_prompt, self._kv_reply = prompt.prompt, ""
                return common, len(toks) - common
            else:
                if common == len(toks):
                    common -= 1  # the last prompt token is decoded again for its logits
                if common < b.position:
                    b.truncate(common)
                if len(toks) > common:
                    self.store.prefill({b: toks[common:]})
                self._kv_prompt, self._kv_reply = prompt.prompt, ""
                return common, len(toks) - common
        reused = 0
        if self._chunks is not None:
            self._branch = self.store.create(self._chunks)
        elif self.cache is not None:
            self._branch, reused = self.cache._create(toks, None, None, None, True)
        else:
            self._branch = self.store.create(toks)
        self._kv_prompt, self._kv_reply = prompt.prompt, ""
        return reused, len(toks) - reused

    def _sink_tokens(self) -> int:
        """Tokens kept at the start when shifting: the system prompt's rendering (at least 4)."""
        if self.messages and self.messages[0]["role"] == "system":
            p = self.model.format_chat(
                self.messages[:1], False, template=self.template, engine=self.engine, limits=self.limits,
                **self.template_kwargs,
            )  # fmt: skip
            n = len(self.model.vocab.tokenize(p.prompt, add_special=p.add_special, parse_special=True))
            return max(4, n)
        return 4

    def _append_delta(
        self, budget: int, tools: Sequence[Mapping[str, Any]] | None
    ) -> tuple[ChatPrompt, int, int] | None:
        """Append the text the new rendering adds after what the cache holds, shifting old
        tokens out first when it would not fit. None when the rendering does not extend the
        cached text (the session then starts over)."""
        b = self._branch
        if b is None:
            return None
        prompt = self.model.format_chat(
            self.window(), True, template=self.template, tools=tools, engine=self.engine, limits=self.limits,
            **self.template_kwargs,
        )  # fmt: skip
        if not prompt.prompt.startswith(self._kv_prompt):
            return None
        rest = prompt.prompt[len(self._kv_prompt) :]
        reply = self._kv_reply
        # the template may trim the reply it renders: skip it as rendered
        for shown in (reply, reply.strip(), reply.rstrip(), reply.lstrip()):
            if rest.startswith(shown):
                delta = rest[len(shown) :]
                break
        else:
            return None
        new = [int(t) for t in self.model.vocab.tokenize(delta, add_special=False, parse_special=True)]
        room = self.ctx.n_ctx_seq
        need = b.position + len(new) + budget - room
        if need > 0:
            if self.model.is_recurrent or self.model.is_hybrid or not self.ctx.memory.can_shift:
                return None
            sinks = self._sink_tokens()
            movable = b.position - sinks - 1
            if movable < need:
                raise KvCacheFullError(
                    f"the new message ({len(new)} tokens) and max_tokens={budget} do not fit in n_ctx_seq={room} "
                    "even after shifting out everything but the system prompt"
                )
            b.shift_context(max(need, movable // 2), sinks=sinks)
            self._shifted = True
        reused = b.position
        if new:
            self.store.prefill({b: new})
        self._kv_prompt, self._kv_reply = prompt.prompt, ""
        return prompt, reused, len(new)


def _check_sampler(sampler: object) -> None:
    if sampler is not None and not isinstance(sampler, (Sampler, SamplingParams)):
        raise type_error("sampler", "a samplers Sampler (a chain), samplers.SamplingParams, or None", sampler)


def _tool_name(tool: Any) -> Any:
    fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
    return fn.get("name") if isinstance(fn, Mapping) else None


def _tool_choice(value: object, tools: Sequence[Mapping[str, Any]] | None) -> str:
    """``"auto"``, ``"none"``, ``"required"``, or ``"function:NAME"`` for a
    ``{"type": "function", "function": {"name": NAME}}`` choice (NAME one of ``tools``)."""
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise ParamError(f"tool_choice must be 'auto', 'none', 'required' or a function choice, not {value!r}")
        if value == "required" and not tools:
            raise ParamError("tool_choice='required' needs tools")
        return value
    fn = value.get("function") if isinstance(value, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str):
        raise type_error(
            "tool_choice", "'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}", value
        )
    names = [_tool_name(t) for t in tools or ()]
    if name not in names:
        raise ParamError(f"tool_choice names {name!r}, which is not among the tools ({', '.join(map(str, names))})")
    return "function:" + name  # apart from the three modes, whatever the function is called


def _schema_grammar(schema: Any) -> Any:
    """The grammar of a JSON schema (a dict, a bool, JSON text or a pydantic model)."""
    from .grammar import Grammar

    return Grammar.from_json_schema(schema)


def _content(content: Any) -> Any:
    """A message's content as the session takes it: text, a list of content parts, or None."""
    if content is not None and not isinstance(content, (str, list, tuple)):
        raise type_error("content", "a str, a list of content parts, or None", content)
    return content
