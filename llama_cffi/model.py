"""``Model``: a loaded GGUF model (weights, vocabulary, metadata, chat templates).

Lifetime: ``close()`` (or leaving a ``with`` block) releases the model. If contexts or
LoRA adapters made from it are still alive, the model is marked closed at once (its
methods raise :class:`~llama_cffi.errors.ClosedError`) and freed when the last of
them is freed, so nothing ever points at freed weights.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import chat as _chat
from . import log
from ._args import expect, expect_bool, expect_int, expect_iterable, expect_str, type_error
from ._binding import ffi, lib
from ._cdata import Metadata, read_metadata, read_str
from ._handle import NativeHandle
from .enums import FType, RopeType
from .errors import (
    InvalidModelError,
    ModelLoadCancelled,
    ParamError,
    RpcError,
)
from .model_file import check_header, check_model_file
from .model_params import ModelParams
from .vocab import TokenArray, Tokens, Vocab

if TYPE_CHECKING:
    from .context import Context
    from .lora import LoraAdapter

PathLike = str | os.PathLike[str]


def _fspath(path: object, what: str = "path") -> str:
    if isinstance(path, bytes):
        return os.fsdecode(path)
    if isinstance(path, (str, os.PathLike)):
        p = os.fspath(path)
        return p if isinstance(p, str) else os.fsdecode(p)
    raise type_error(what, "a str or os.PathLike", path)


def _reason(lines: list[tuple[int, str]], fallback: str) -> str:
    errors = [line for level, line in lines if level >= 40]  # logging.ERROR
    picked = errors or [line for _, line in lines]
    return "; ".join(dict.fromkeys(picked[-4:])) if picked else fallback


class Model:
    """A loaded model. Create with :meth:`load` (or :meth:`load_splits`).

    >>> with Model.load(path) as model:                      # doctest: +SKIP
    ...     model.tokenize("Hello")
    array([   2, 9259], dtype=int32)
    """

    _handle: NativeHandle | None = None  # class default: a half-built Model can still close()
    _uses_rpc = False  # loaded with rpc_servers: contexts are created with signals held
    _rpc_endpoints: tuple[str, ...] = ()
    _rpc_lost: str | None = None  # why a worker of this model failed (then it is refused)

    def __init__(self, ptr: Any, path: str, vocab_only: bool = False) -> None:
        """Internal: use :meth:`load`. Takes ownership of ``ptr`` (a ``llama_model *``)."""
        if not isinstance(ptr, ffi.CData) or ffi.typeof(ptr) is not ffi.typeof("struct llama_model *"):
            raise type_error("ptr", "a llama_model * (use Model.load)", ptr)
        path = expect_str("path", path)
        vocab_only = expect_bool("vocab_only", vocab_only)
        self._handle = NativeHandle(self, ptr, lib.llama_model_free, f"Model({os.path.basename(path)!r})")
        self.path = path
        #: Loaded with ``vocab_only=True``: a tokenizer without weights (no contexts).
        self.vocab_only = vocab_only
        self.vocab = Vocab(self._handle)
        self._metadata: Metadata | None = None
        self._adapters: weakref.WeakSet[LoraAdapter] = weakref.WeakSet()

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: PathLike, **params: Any) -> Model:
        """Load a GGUF model file (a split model's first part loads all parts).

        ``params`` are the fields of ``llama_model_params`` (see
        :mod:`llama_cffi.model_params`), e.g. ``n_gpu_layers=-1``, ``vocab_only=True``,
        ``kv_overrides={...}``, ``progress_callback=f``. Raises a
        :class:`~llama_cffi.errors.ModelLoadError` subclass naming the path and reason.
        """
        p = _fspath(path)
        check_model_file(p)
        mp = ModelParams(**params)
        check_header(p, mp.kv_overrides, bool(mp.c.vocab_only))
        return cls._load(p, mp, lambda c: lib.llama_model_load_from_file(p.encode(), c))

    @classmethod
    def load_splits(cls, paths: Sequence[PathLike], **params: Any) -> Model:
        """Load a model stored in several files, given in order (any naming scheme)."""
        ps = [_fspath(p, "paths[]") for p in expect_iterable("paths", paths, "a sequence of paths")]
        if not ps:
            raise ValueError("load_splits needs at least one path")
        for p in ps:
            check_model_file(p)
        mp = ModelParams(**params)
        check_header(ps[0], mp.kv_overrides, bool(mp.c.vocab_only))
        cstrs = [ffi.new("char[]", p.encode()) for p in ps]
        arr = ffi.new("const char *[]", cstrs)
        return cls._load(ps[0], mp, lambda c: lib.llama_model_load_from_splits(arr, len(ps), c))

    @classmethod
    def _load(cls, path: str, mp: ModelParams, call: Any) -> Model:
        log.sync()
        uses_rpc = bool(mp._rpc_devices)
        if uses_rpc:
            from .rpc import before_load, signals_held

            before_load(mp.rpc_endpoints)
            held: contextlib.AbstractContextManager[None] = signals_held()  # RPC threads start here
        else:
            held = contextlib.nullcontext()
        if uses_rpc:
            from .rpc import failed, failures

            seen = failures()
        with held, log.capture() as lines:
            ptr = call(mp.c)
        if uses_rpc and failures() != seen:
            lost = failed(mp.rpc_endpoints)
            if lost is not None:  # the weights did not all arrive: the model is unusable
                if ptr != ffi.NULL:
                    lib.llama_model_free(ptr)
                raise RpcError(f"cannot load {path}: {lost}")
        if ptr == ffi.NULL:
            if mp.progress is not None and mp.progress.error is not None:
                raise mp.progress.error
            if mp.progress is not None and mp.progress.cancelled:
                raise ModelLoadCancelled(path, "cancelled by the progress callback")
            raise InvalidModelError(path, _reason(lines, "llama.cpp could not load it"))
        model = cls(ptr, path, vocab_only=bool(mp.c.vocab_only))
        model._uses_rpc = uses_rpc
        model._rpc_endpoints = tuple(mp.rpc_endpoints)
        if uses_rpc:
            from .rpc import loaded

            loaded(model, mp.rpc_endpoints)
        return model

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Release the model (idempotent; deferred while contexts/adapters use it)."""
        if self._handle is None:
            return
        for adapter in list(self._adapters):
            adapter.close()
        self._handle.close()

    free = close

    @property
    def closed(self) -> bool:
        return self._handle is None or self._handle.closed

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ptr(self) -> Any:
        assert self._handle is not None
        return self._handle.get()

    @property
    def underlying(self) -> Any:
        """The raw ``llama_model *`` (for use with ``llama_cffi.lib``); valid while open."""
        return self._ptr()

    def __repr__(self) -> str:
        if self.closed:
            return f"<Model {self.path!r} closed>"
        return f"<Model {self.desc!r} n_params={self.n_params} n_vocab={self.n_vocab} path={self.path!r}>"

    # ------------------------------------------------------------------ introspection
    @property
    def desc(self) -> str:
        """llama.cpp's one-line description, e.g. ``"gemma3 270M Q4_K - Medium"``."""
        return read_str(lib.llama_model_desc, self._ptr()) or ""

    @property
    def size(self) -> int:
        """Total size of all tensors, in bytes."""
        return int(lib.llama_model_size(self._ptr()))

    @property
    def n_params(self) -> int:
        return int(lib.llama_model_n_params(self._ptr()))

    @property
    def n_embd(self) -> int:
        return int(lib.llama_model_n_embd(self._ptr()))

    @property
    def n_embd_inp(self) -> int:
        return int(lib.llama_model_n_embd_inp(self._ptr()))

    @property
    def n_embd_out(self) -> int:
        return int(lib.llama_model_n_embd_out(self._ptr()))

    @property
    def n_layer(self) -> int:
        return int(lib.llama_model_n_layer(self._ptr()))

    @property
    def n_head(self) -> int:
        return int(lib.llama_model_n_head(self._ptr()))

    @property
    def n_head_kv(self) -> int:
        return int(lib.llama_model_n_head_kv(self._ptr()))

    @property
    def n_ctx_train(self) -> int:
        """Context length the model was trained with, in tokens."""
        return int(lib.llama_model_n_ctx_train(self._ptr()))

    @property
    def n_swa(self) -> int:
        """Sliding-window attention size in tokens (0: no SWA)."""
        return int(lib.llama_model_n_swa(self._ptr()))

    @property
    def n_cls_out(self) -> int:
        """Number of classifier outputs (classifier models only; else 0)."""
        return int(lib.llama_model_n_cls_out(self._ptr()))

    @property
    def rope_type(self) -> RopeType:
        return RopeType(lib.llama_model_rope_type(self._ptr()))

    @property
    def n_pos_per_embd(self) -> int:
        """Positions llama.cpp reads per input-embedding row (``hparams.n_pos_per_embd``):
        4 for models with M-RoPE positions (Qwen2-VL and others: t, y, x, z), else 1."""
        return 4 if self.rope_type in (RopeType.MROPE, RopeType.IMROPE) else 1

    @property
    def rope_freq_scale_train(self) -> float:
        return float(lib.llama_model_rope_freq_scale_train(self._ptr()))

    @property
    def ftype(self) -> FType:
        """File type (quantization); ``str(model.ftype)`` gives llama.cpp's name."""
        return FType(lib.llama_model_ftype(self._ptr()))

    @property
    def has_encoder(self) -> bool:
        return bool(lib.llama_model_has_encoder(self._ptr()))

    @property
    def has_decoder(self) -> bool:
        return bool(lib.llama_model_has_decoder(self._ptr()))

    @property
    def decoder_start_token(self) -> int | None:
        t = int(lib.llama_model_decoder_start_token(self._ptr()))
        return None if t == lib.LLAMA_TOKEN_NULL else t

    @property
    def is_recurrent(self) -> bool:
        return bool(lib.llama_model_is_recurrent(self._ptr()))

    @property
    def is_hybrid(self) -> bool:
        return bool(lib.llama_model_is_hybrid(self._ptr()))

    @property
    def is_diffusion(self) -> bool:
        return bool(lib.llama_model_is_diffusion(self._ptr()))

    @property
    def metadata(self) -> Metadata:
        """The GGUF metadata llama.cpp keeps (scalars and strings; llama.cpp skips
        arrays), as strings, read once with the default bounds of :meth:`read_metadata`
        and cached; a copy each time."""
        if self._metadata is None:
            self._metadata = self.read_metadata()
        return self._metadata.copy()

    def meta_value(self, key: str, max_bytes: int = 4096) -> str | None:
        """One metadata value as llama.cpp gives it (``llama_model_meta_val_str``: scalars
        as text, strings as they are), at most ``max_bytes - 1`` bytes of it (as the C
        buffer of that size holds it; invalid UTF-8 replaced), or None when the file has
        no such key."""
        key = expect_str("key", key)
        if "\0" in key:
            raise ParamError("key must not contain NUL characters")
        max_bytes = expect_int("max_bytes", max_bytes)
        if not 1 <= max_bytes <= 1 << 24:
            raise ParamError(f"max_bytes must be in [1, 2**24], not {max_bytes}")
        buf = ffi.new("char[]", max_bytes)
        n = int(lib.llama_model_meta_val_str(self._ptr(), key.encode(), buf, max_bytes))
        if n < 0:
            return None
        return ffi.string(buf).decode("utf-8", "replace")  # type: ignore[no-any-return]

    def read_metadata(self, max_keys: int | None = None, max_value_bytes: int | None = None) -> Metadata:
        """The metadata, read with bounds: a model file is untrusted input and may carry
        millions of keys or values of gigabytes. At most ``max_keys`` keys (default
        ``llama_cffi._cdata.METADATA_MAX_KEYS``, 1,024: llama.cpp's
        key-by-index walks its map, so reading n keys costs n**2/2 steps) and ``max_value_bytes`` per value
        (default 1 MiB; keys at most 1 KiB). The result is a dict with ``truncated`` (the
        keys whose key or value was cut) and ``complete`` (False when keys were left out).
        Invalid UTF-8 is decoded with U+FFFD."""
        for name, v in (("max_keys", max_keys), ("max_value_bytes", max_value_bytes)):
            if v is not None:
                expect_int(name, v, "an int or None")
        return read_metadata(
            lib.llama_model_meta_count,
            lib.llama_model_meta_key_by_index,
            lib.llama_model_meta_val_str_by_index,
            self._ptr(),
            max_keys,
            max_value_bytes,
        )

    def cls_label(self, i: int) -> str | None:
        """Label of classifier output ``i`` (``0 <= i < n_cls_out``), or None."""
        i = expect_int("i", i)
        n = self.n_cls_out
        if not 0 <= i < n:
            raise IndexError(f"classifier output {i} is out of range [0, {n})")
        s = lib.llama_model_cls_label(self._ptr(), i)
        return None if s == ffi.NULL else ffi.string(s).decode("utf-8", "replace")

    def save(self, path: PathLike) -> None:
        """Write the model (with any applied modifications) to a GGUF file."""
        lib.llama_model_save_to_file(self._ptr(), _fspath(path).encode())

    # ------------------------------------------------------------------ vocabulary shortcuts
    @property
    def n_vocab(self) -> int:
        return self.vocab.n_vocab

    def tokenize(
        self, text: str | bytes | bytearray | memoryview, add_special: bool = True, parse_special: bool = False
    ) -> TokenArray:
        """See :meth:`Vocab.tokenize`."""
        return self.vocab.tokenize(text, add_special, parse_special)

    def detokenize(self, tokens: Tokens, remove_special: bool = False, unparse_special: bool = False) -> str:
        """See :meth:`Vocab.detokenize`."""
        return self.vocab.detokenize(tokens, remove_special, unparse_special)

    def token_to_piece(self, token: int, special: bool = False, lstrip: int = 0) -> bytes:
        """See :meth:`Vocab.token_to_piece`."""
        return self.vocab.token_to_piece(token, special, lstrip)

    # ------------------------------------------------------------------ chat
    def chat_template(self, name: str | None = None) -> str | None:
        """The model's chat template (or the named one it ships), or None. A template
        longer than the template limit (:class:`llama_cffi.chat.TemplateLimits`
        ``max_template``, 1 MiB by default) raises :class:`TemplateLimitError`: a model
        file is untrusted input. Invalid UTF-8 is decoded with U+FFFD."""
        if name is not None:
            expect_str("name", name, "a str (a template name) or None")
        s = lib.llama_model_chat_template(self._ptr(), ffi.NULL if name is None else name.encode())
        if s == ffi.NULL:
            return None
        cap = _chat.get_template_limits().max_template
        raw = ffi.string(s, 4 * cap + 1)  # at most 4 bytes per character
        text = raw.decode("utf-8", "replace")
        if len(raw) > 4 * cap or len(text) > cap:
            raise _chat.TemplateLimitError("template", f"the model's chat template is longer than {cap:,} characters")
        return str(text)

    def apply_chat_template(
        self,
        messages: Iterable[Mapping[str, str]],
        add_generation_prompt: bool = True,
        template: str | None = None,
        engine: str = "auto",
        limits: _chat.TemplateLimits | None = None,
    ) -> str:
        """Render ``messages`` (dicts with ``role`` and ``content``) with a chat template.

        ``template``: None for the model's own, a builtin name (see
        :func:`llama_cffi.chat.builtin_templates`), the name of a template the model's file
        ships (``tokenizer.chat_template.NAME``), or template text; another name is refused
        with the known ones (a typo is never rendered as text). ``engine``:
        ``"native"`` (llama.cpp's ``llama_chat_apply_template``), ``"jinja"`` (needs the
        ``jinja`` extra), or ``"auto"``: native, then jinja for templates llama.cpp
        cannot apply natively. The Jinja path renders in a sandbox with resource
        ``limits`` (None: the process-wide defaults, see
        :func:`llama_cffi.chat.set_template_limits`); every failure is a
        :class:`ChatTemplateError`.
        """
        if template is None:
            template = self.chat_template()
            if template is None:
                raise _chat.ChatTemplateError(
                    "the model has no chat template; pass template= (a builtin name: "
                    + ", ".join(_chat.builtin_templates())
                    + ")"
                )
        return _chat.apply_template(
            self._template_text(template),
            messages,
            add_generation_prompt,
            engine=engine,
            limits=limits,
            bos_token=self._token_text_or_empty(self.vocab.bos),
            eos_token=self._token_text_or_empty(self.vocab.eos),
        )

    def chat_template_or_default(self) -> str:
        """The model's chat template; when its file has none, the builtin template of its
        family: ``"gemma"`` for Gemma architectures, else ``"chatml"`` (llama.cpp's tools
        fall back to ChatML for every model, which is the wrong format for Gemma)."""
        template = self.chat_template()
        if template is not None:
            return template
        arch = self.metadata.get("general.architecture", "")
        return "gemma" if arch.startswith("gemma") else "chatml"

    def format_chat(
        self,
        messages: Iterable[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        template: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        engine: str = "auto",
        limits: _chat.TemplateLimits | None = None,
        **context: Any,
    ) -> _chat.ChatPrompt:
        """Render ``messages`` and say how the reply ends: a :class:`~llama_cffi.chat.ChatPrompt`
        with the prompt, the template's end-of-turn text and the tokens that end a turn.

        ``template``: None for :meth:`chat_template_or_default`, a builtin name, the name of a
        template the model ships, or template text. ``engine="auto"`` renders builtin names
        natively and template text with Jinja (natively when Jinja2 is not installed), as
        llama.cpp's current tools do; the
        model's BOS text at the start of the rendering is removed, since tokenizing with
        ``add_special=True`` adds the token. Message content may be a str or a list of
        ``{"type": "text", "text": ...}`` parts; image and sound parts render as
        :data:`llama_cffi.chat.MEDIA_MARKER` (read them with
        :meth:`Projector.tokenize_chat <llama_cffi.mtmd.Projector.tokenize_chat>`).
        ``tools`` (OpenAI-style function specs) are rendered when the template declares
        them (Jinja templates that use ``tools``), as llama.cpp does; ``context``: more
        template variables. Every failure is a :class:`ChatTemplateError`."""
        tmpl = self.chat_template_or_default() if template is None else self._template_text(template)
        msgs = list(_chat.expect_messages(messages))
        if tools is not None:
            what = "a sequence of tool specs (dicts), or None"
            tools = [expect("tools", t, Mapping, what) for t in expect_iterable("tools", tools, what)]
        extra = {
            "bos_token": self._token_text_or_empty(self.vocab.bos),
            "eos_token": self._token_text_or_empty(self.vocab.eos),
            **context,
        }
        render_tools = tools is not None and _chat.declares_tools(tmpl)
        if render_tools:
            extra["tools"] = [dict(t) for t in tools or ()]
        eng = engine
        if engine == "auto" and tmpl not in _chat.builtin_templates() and _chat.jinja_available():
            eng = "jinja"  # template text as its authors wrote it (llama.cpp's tools render with Jinja too)
        prompt = _chat.apply_template(tmpl, msgs, add_generation_prompt, eng, limits, **extra)
        end = _chat.turn_end(tmpl, eng, limits, **extra)
        stops: list[int] = []
        if end:
            ids = self.vocab.tokenize(end, add_special=False, parse_special=True)
            if len(ids) == 1:
                stops.append(int(ids[0]))
        for t in self.vocab.eog_tokens():
            if t not in stops:
                stops.append(t)
        bos = self.vocab.bos
        bos_text = self.vocab.token_text(bos) if bos is not None else ""
        if bos_text and self.vocab.add_bos and prompt.startswith(bos_text):
            prompt = prompt[len(bos_text) :]  # the tokenizer adds it (llama.cpp strips it the same way)
        fmt = _chat._reasoning_format_cached(tmpl, eng)
        opens = _chat.reasoning_opens(prompt, fmt)
        return _chat.ChatPrompt(prompt, (end,) if end else (), tuple(stops), True, tmpl, render_tools, fmt, opens)

    def validate_chat_template(
        self, template: str | None = None, engine: str = "auto", limits: _chat.TemplateLimits | None = None
    ) -> _chat.TemplateReport:
        """:func:`llama_cffi.chat.validate_template` of ``template`` (None: the model's own
        or its family's default), with the model's BOS/EOS texts."""
        tmpl = self.chat_template_or_default() if template is None else self._template_text(template)
        return _chat.validate_template(
            tmpl,
            engine,
            limits,
            bos_token=self._token_text_or_empty(self.vocab.bos),
            eos_token=self._token_text_or_empty(self.vocab.eos),
        )

    def _template_text(self, template: str) -> str:
        """``template`` as the chat functions take it: a name of a template this model's file
        ships becomes its text; a builtin name or template text stays; any other name is
        refused, listing the names there are."""
        if not _chat.is_template_name(template) or template in _chat.builtin_templates():
            return template
        shipped = self.chat_template(template)
        if shipped is not None:
            return shipped
        prefix = "tokenizer.chat_template."
        names = [k[len(prefix) :] for k in self.metadata if k.startswith(prefix)]
        raise _chat.unknown_template_name(template, names)

    def _token_text_or_empty(self, token: int | None) -> str:
        return "" if token is None else self.vocab.token_text(token)

    # ------------------------------------------------------------------ adapters, contexts
    def load_lora(self, path: PathLike) -> LoraAdapter:
        """Load a LoRA adapter for this model (see :class:`llama_cffi.lora.LoraAdapter`)."""
        from .lora import LoraAdapter

        adapter = LoraAdapter._load(self, _fspath(path))
        self._adapters.add(adapter)
        return adapter

    def context(self, **params: Any) -> Context:
        """A new :class:`~llama_cffi.Context` over this model, retrying smaller sizes when
        llama.cpp cannot allocate the requested one.

        The cascade: the requested sizes; then ``n_ctx`` halved down to 256 (or the
        request, if smaller); then ``n_batch``/``n_ubatch`` halved down to 32. What was
        tried is logged and kept in ``ctx.creation_attempts``; when everything fails,
        :class:`~llama_cffi.ContextCreateError` lists the attempts. Invalid parameters
        raise :class:`~llama_cffi.ParamError` at once (no retry). ``Context(model, ...)``
        tries exactly once.
        """
        from .context import Context
        from .context_params import ContextParams
        from .errors import ContextCreateError

        if self.vocab_only:  # no size will do: fail once, not once per retry
            return Context(self, **params)
        # Context's own options (thread pools), not llama_context_params fields
        opts = {k: params.pop(k) for k in ("threadpool", "threadpool_batch", "adaptive_threads") if k in params}
        p = ContextParams(**params)
        c = p.c
        n_ctx = int(c.n_ctx) or self.n_ctx_train
        n_batch, n_ubatch = int(c.n_batch), int(c.n_ubatch)
        plan = [(n_ctx, n_batch, n_ubatch)]
        floor = min(256, n_ctx)
        while plan[-1][0] // 2 >= floor and plan[-1][0] > floor:
            plan.append((plan[-1][0] // 2, n_batch, n_ubatch))
        while plan[-1][1] // 2 >= 32 or plan[-1][2] // 2 >= 32:
            k, b, u = plan[-1]
            plan.append((k, max(32, b // 2), max(32, u // 2)))
        tried: list[str] = []
        for k, b, u in plan:
            c.n_ctx, c.n_batch, c.n_ubatch = k, b, u
            try:
                ctx = Context(self, params=p, **opts)
            except ContextCreateError as exc:
                tried.append(f"n_ctx={k} n_batch={b} n_ubatch={u}: {exc}")
                log.logger.warning("context creation failed (%s); retrying smaller", tried[-1])
                continue
            ctx.creation_attempts = tried
            if tried:
                log.logger.warning(
                    "context created with n_ctx=%d n_batch=%d n_ubatch=%d after %d failures", k, b, u, len(tried)
                )
            return ctx
        raise ContextCreateError("cannot create a context; tried:\n  " + "\n  ".join(tried))
