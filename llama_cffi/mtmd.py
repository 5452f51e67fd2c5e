"""Images and audio for a text model: libmtmd, llama.cpp's multimodal library
(``tools/mtmd`` of the pinned source, built into the extension unless ``LLAMA_CFFI_MTMD=0``).

A :class:`Projector` is libmtmd's context (``mtmd_context``): a multimodal projector, the
"mmproj" GGUF that ships beside a vision or audio model's text GGUF, loaded for one
:class:`~llama_cffi.Model`. It turns images and sounds into embeddings the text model
reads in place of tokens. The file is checked before libmtmd reads it
(:func:`llama_cffi.mmproj_file.check_mmproj`): a projector type, key or tensor libmtmd
would abort on, or a projector made for another model (its output width is not the
model's embedding width), is an :class:`~llama_cffi.errors.InvalidModelError` that says
what is wrong.

Lifetime: a projector holds its model (the model's memory is freed only after every
projector and context of it is closed); ``close()`` (or the ``with`` block, or garbage
collection) frees libmtmd's context and its encoder weights.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from . import log
from ._args import expect, expect_int, expect_path, type_error
from ._binding import ffi, lib
from ._handle import HandleOwner, NativeHandle
from .context_params import available_cores
from .errors import (
    InvalidBatchError,
    InvalidMediaError,
    InvalidModelError,
    KvCacheFullError,
    LlamaError,
    ParamError,
    UnsupportedError,
)
from .media import MAX_PIXELS, MAX_SECONDS, Audio, Image, _check_media, _decode, _read_source
from .media_file import check_media
from .mmproj_file import check_mmproj
from .model import Model

if TYPE_CHECKING:
    from .chat import ChatPrompt
    from .context import Context

__all__ = ["GGML_MAX_N_THREADS", "Chunk", "Chunks", "MtmdError", "Projector", "available"]

#: ggml.h at the pinned commit: the most threads a graph may use.
GGML_MAX_N_THREADS = 512


class MtmdError(LlamaError, RuntimeError):
    """libmtmd reported a failure (preprocessing or encoding media) that no check before
    the call could foresee; the message has its log lines."""


def available() -> bool:
    """Whether this build has libmtmd (built unless ``LLAMA_CFFI_MTMD=0``)."""
    return hasattr(lib, "mtmd_init_from_file")


def _optional_count(name: str, value: object) -> int:
    if value is None:
        return -1  # libmtmd: from the file's metadata
    if isinstance(value, bool) or not isinstance(value, int):
        raise type_error(name, "an int or None", value)
    if value < 1:
        raise ParamError(f"{name} must be at least 1 (or None: the projector's own), not {value}")
    return value


class Projector(HandleOwner):
    """A multimodal projector (an mmproj GGUF) loaded for ``model`` by libmtmd.

    ``use_gpu``: run the encoder on the first GPU (when the build has one; else the CPU).
    ``n_threads``: CPU threads of the encoder (default: the cores this process may use;
    at most :data:`GGML_MAX_N_THREADS`). ``image_min_tokens`` / ``image_max_tokens``:
    bounds on the tokens an image becomes, for projectors with dynamic resolution
    (``None``: the file's). ``warmup``: run one encode of a blank input at load time, as
    libmtmd does by default (it allocates the encoder's compute buffers up front).
    ``media_marker``: the text that stands for an image or a sound in a prompt (default:
    libmtmd's, ``<__media__>``).

    Raises :class:`~llama_cffi.errors.ModelNotFoundError` /
    :class:`~llama_cffi.errors.InvalidModelError` for a missing or unusable file (see
    :mod:`llama_cffi.mmproj_file`), :class:`~llama_cffi.errors.UnsupportedError` when this
    build has no libmtmd, :class:`~llama_cffi.errors.ParamError` for bad arguments.
    """

    def __init__(
        self,
        model: Model,
        path: str | os.PathLike[str],
        *,
        use_gpu: bool = True,
        n_threads: int | None = None,
        image_min_tokens: int | None = None,
        image_max_tokens: int | None = None,
        warmup: bool = True,
        media_marker: str | None = None,
    ) -> None:
        expect("model", model, Model, "a llama_cffi.Model")
        path = expect_path("path", path)
        for name, flag in (("use_gpu", use_gpu), ("warmup", warmup)):
            if not isinstance(flag, bool):
                raise type_error(name, "a bool", flag)
        if n_threads is None:
            n_threads = min(available_cores(), GGML_MAX_N_THREADS)
        elif isinstance(n_threads, bool) or not isinstance(n_threads, int):
            raise type_error("n_threads", "an int or None", n_threads)
        elif not 1 <= n_threads <= GGML_MAX_N_THREADS:
            raise ParamError(f"n_threads must be in [1, {GGML_MAX_N_THREADS}], not {n_threads}")
        lo = _optional_count("image_min_tokens", image_min_tokens)
        hi = _optional_count("image_max_tokens", image_max_tokens)
        if lo > 0 and hi > 0 and lo > hi:
            raise ParamError(f"image_min_tokens ({lo}) is more than image_max_tokens ({hi})")
        if media_marker is not None:
            if not isinstance(media_marker, str):
                raise type_error("media_marker", "a str or None", media_marker)
            if not media_marker or "\0" in media_marker:
                raise ParamError("media_marker must be a non-empty string without NUL characters")
        if not available():
            raise UnsupportedError("this build of llama_cffi has no libmtmd (it was built with LLAMA_CFFI_MTMD=0)")
        model_ptr = model._ptr()  # ClosedError for a closed model
        header = check_mmproj(path, int(lib.llama_model_n_embd_inp(model_ptr)))
        params = lib.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.print_timings = False
        params.n_threads = n_threads
        params.warmup = warmup
        params.image_min_tokens = lo
        params.image_max_tokens = hi
        marker = ffi.new("char[]", media_marker.encode()) if media_marker is not None else None
        if marker is not None:
            params.media_marker = marker
        params.image_marker = ffi.NULL
        log.sync()
        with log.capture() as lines:
            ptr = lib.mtmd_init_from_file(path.encode(), model_ptr, params)
        if ptr == ffi.NULL:
            errors = [line for level, line in lines if level >= logging.ERROR] or [line for _, line in lines]
            reason = "; ".join(line.strip() for line in errors[-3:]) or "libmtmd could not load it"
            raise InvalidModelError(path, reason)
        assert model._handle is not None
        self._handle = NativeHandle(
            self, ptr, lib.mtmd_free, f"Projector({os.path.basename(path)!r})", parent=model._handle
        )
        self.model = model
        self.path = path
        self._lock = threading.Lock()  # encoding uses the context's one output buffer
        #: the projector type of its image encoder (``"gemma3"``...), None without one
        self.vision_projector: str | None = header.vision_projector
        #: the projector type of its audio encoder (``"ultravox"``...), None without one
        self.audio_projector: str | None = header.audio_projector

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"vision={self.vision_projector!r}, audio={self.audio_projector!r}"
        return f"<Projector {os.path.basename(self.path)!r} {state}>"

    @property
    def supports_vision(self) -> bool:
        """Whether it takes images."""
        return bool(lib.mtmd_support_vision(self._ptr()))

    @property
    def supports_audio(self) -> bool:
        """Whether it takes audio."""
        return bool(lib.mtmd_support_audio(self._ptr()))

    @property
    def audio_sample_rate(self) -> int | None:
        """The sample rate (Hz) audio must have (16,000 for Whisper encoders); None
        without audio."""
        rate = int(lib.mtmd_get_audio_sample_rate(self._ptr()))
        return rate if rate > 0 else None

    @property
    def uses_mrope(self) -> bool:
        """Whether the text model places media with M-RoPE (2-D positions: an image
        advances the position by its ``n_pos``, not by its token count)."""
        return bool(lib.mtmd_decode_use_mrope(self._ptr()))

    @property
    def uses_non_causal(self) -> bool:
        """Whether an image's embeddings are decoded with non-causal attention (all of
        an image in one micro-batch)."""
        return bool(lib.mtmd_decode_use_non_causal(self._ptr(), ffi.NULL))

    @property
    def media_marker(self) -> str:
        """The text that stands for one image or sound in a prompt."""
        return str(ffi.string(lib.mtmd_get_marker(self._ptr())).decode("utf-8", "replace"))

    def open_media(
        self,
        source: str | os.PathLike[str] | bytes,
        *,
        max_pixels: int = MAX_PIXELS,
        max_seconds: float = MAX_SECONDS,
    ) -> Image | Audio:
        """An image or a sound read from a file (a path) or a file's bytes, as
        ``llama-mtmd-cli`` reads its ``--image`` / ``--audio`` files: PNG, JPEG, GIF and
        BMP images; WAV, MP3 and FLAC sounds, mixed down to mono and resampled to
        :attr:`audio_sample_rate` by libmtmd's decoder (miniaudio). The kind is told from
        the file's bytes. The result's ``id`` is the SHA-256 of the file (hex).

        Raises :class:`~llama_cffi.errors.MediaNotFoundError` for a missing path,
        :class:`~llama_cffi.errors.InvalidMediaError` for a file that is of none of those
        formats, is truncated or undecodable, has more than ``max_pixels`` pixels or
        lasts more than ``max_seconds`` (both checked from its headers before decoding),
        or is a sound for a projector without audio (a
        :class:`~llama_cffi.errors.ParamError` is for a bad argument)."""
        limit = expect_int("max_pixels", max_pixels, "an int")
        if isinstance(max_seconds, bool) or not isinstance(max_seconds, (int, float)):
            raise type_error("max_seconds", "a number", max_seconds)
        data = _read_source(source)
        header = check_media(data, max_pixels=limit, max_seconds=float(max_seconds))
        ctx = self._ptr()
        rate = 0
        if header.kind == "audio":
            rate = self.audio_sample_rate or 0
            if not rate:
                raise InvalidMediaError(f"the file is a {header.format.upper()} sound; this projector takes no audio")
        elif not self.supports_vision:
            raise InvalidMediaError(f"the file is a {header.format.upper()} image; this projector takes no images")
        return _decode(ctx, data, header, max_pixels=limit, max_seconds=float(max_seconds), sample_rate=rate)

    # ------------------------------------------------------------------ prompts

    def tokenize(
        self,
        text: str,
        media: Sequence[Image | Audio] = (),
        *,
        add_special: bool = True,
        parse_special: bool = True,
    ) -> Chunks:
        """Split a prompt into text chunks (token ids) and media chunks, in order: each
        :attr:`media_marker` in ``text`` stands for the next of ``media`` (as many
        markers as media). libmtmd adds the model's own text around each medium (Gemma
        3's ``<start_of_image>`` ... ``<end_of_image>``) and preprocesses it (resized,
        normalised; audio as a mel spectrogram). ``add_special``: the vocabulary's BOS
        first, as tokenizing a prompt does; ``parse_special``: special-token text in
        ``text`` becomes those tokens.

        Raises :class:`~llama_cffi.errors.ParamError` when the markers and media differ
        in number, a medium is of a kind this projector does not take, or a sound's
        sample rate is not :attr:`audio_sample_rate`; :class:`MtmdError` when libmtmd's
        preprocessing fails."""
        if not isinstance(text, str):
            raise type_error("text", "a str", text)
        if "\0" in text:
            raise ParamError("text must not contain NUL characters")
        if isinstance(media, (Image, Audio)) or not isinstance(media, Sequence):
            raise type_error("media", "a sequence of llama_cffi.media.Image or Audio objects", media)
        items = [_check_media(m) for m in media]
        for name, flag in (("add_special", add_special), ("parse_special", parse_special)):
            if not isinstance(flag, bool):
                raise type_error(name, "a bool", flag)
        marker = self.media_marker
        n_markers = text.count(marker)
        if n_markers != len(items):
            raise ParamError(f"the text has {n_markers} media markers ({marker!r}) for {len(items)} media")
        rate = self.audio_sample_rate
        for i, m in enumerate(items):
            if isinstance(m, Image) and not self.supports_vision:
                raise ParamError(f"media[{i}] is an image, but this projector takes no images")
            if isinstance(m, Audio):
                if rate is None:
                    raise ParamError(f"media[{i}] is audio, but this projector takes no audio")
                if m.sample_rate != rate:
                    raise ParamError(f"media[{i}] is sampled at {m.sample_rate} Hz; this projector takes {rate} Hz")
                if m.samples.shape[0] < rate // 10:
                    raise ParamError(f"media[{i}] is {m.seconds * 1000:.0f} ms long; it needs at least 100 ms")
        ctx = self._ptr()
        bitmaps = []
        try:
            for m in items:
                if isinstance(m, Image):
                    bm = lib.mtmd_bitmap_init(m.width, m.height, ffi.from_buffer("unsigned char[]", m.pixels))
                else:
                    bm = lib.mtmd_bitmap_init_from_audio(m.samples.shape[0], ffi.from_buffer("float[]", m.samples))
                if bm == ffi.NULL:
                    raise MemoryError("libmtmd could not allocate a bitmap")
                bitmaps.append(bm)
                lib.mtmd_bitmap_set_id(bm, (m.id if m.id is not None else _digest(m)).encode())
            raw = text.encode()
            buf = ffi.new("char[]", raw)
            inp = ffi.new("struct mtmd_input_text *")
            inp.text = buf
            inp.text_len = len(raw)
            inp.add_special = add_special
            inp.parse_special = parse_special
            out = lib.mtmd_input_chunks_init()
            if out == ffi.NULL:
                raise MemoryError("libmtmd could not allocate chunks")
            arr = ffi.new("const mtmd_bitmap *[]", bitmaps) if bitmaps else ffi.NULL
            log.sync()
            with log.capture() as lines:
                rc = int(lib.mtmd_tokenize(ctx, out, inp, arr, len(bitmaps)))
            if rc != 0:
                lib.mtmd_input_chunks_free(out)
                said = "; ".join(line.strip() for _, line in lines[-3:])
                if rc == 1:
                    raise ParamError(f"libmtmd: the media markers and media differ in number ({said})")
                raise MtmdError(f"libmtmd could not preprocess the media (mtmd_tokenize returned {rc}): {said}")
            return Chunks(self, out)
        finally:
            for bm in bitmaps:
                lib.mtmd_bitmap_free(bm)

    def tokenize_chat(
        self,
        messages: Iterable[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        *,
        template: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        engine: str = "auto",
        media_path: str | os.PathLike[str] | None = None,
        max_pixels: int = MAX_PIXELS,
        max_seconds: float = MAX_SECONDS,
        **context: Any,
    ) -> tuple[ChatPrompt, Chunks]:
        """Render a conversation whose messages may hold images and sounds (OpenAI-style
        content parts: ``{"type": "image_url", "image_url": {"url": ...}}``, ``{"type":
        "input_audio", "input_audio": {"data": ..., "format": "wav"}}``; see
        :func:`llama_cffi.chat.media_sources` for the URLs taken and ``media_path``) with
        the model's chat template (:meth:`Model.format_chat
        <llama_cffi.Model.format_chat>`: ``template``, ``tools``, ``engine``, ``context``),
        read the media (:meth:`open_media`, with ``max_pixels`` and ``max_seconds``) and
        tokenize the prompt: ``(prompt, chunks)``, the :class:`~llama_cffi.chat.ChatPrompt`
        (its stop texts and tokens end the reply) and the :class:`Chunks` to
        :meth:`eval`. Each media part renders as this projector's :attr:`media_marker`,
        joined to the text around it without a newline, as llama-server does.

        A text part that holds the marker itself is refused
        (:class:`~llama_cffi.errors.ParamError`): it would stand for a medium that is not
        there (make the projector with another ``media_marker=``)."""
        from . import chat as _chat

        msgs = list(_chat.expect_messages(messages))
        expect_int("max_pixels", max_pixels, "an int")
        if isinstance(max_seconds, bool) or not isinstance(max_seconds, (int, float)):
            raise type_error("max_seconds", "a number", max_seconds)
        marker = self.media_marker
        for i, m in enumerate(msgs):
            content = m.get("content") if isinstance(m, Mapping) else None
            texts: list[object] = [content] if isinstance(content, str) else []
            if isinstance(content, (list, tuple)):
                texts = [p.get("text") for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
            if any(isinstance(t, str) and marker in t for t in texts):
                raise ParamError(
                    f"messages[{i}] holds the media marker {marker!r} as text: make the projector with another "
                    "media_marker= to use that text"
                )
        sources = _chat.media_sources(msgs, media_path)
        media = [self.open_media(src, max_pixels=max_pixels, max_seconds=max_seconds) for src in sources]
        prompt = self.model.format_chat(
            _chat.with_media_markers(msgs, marker),
            add_generation_prompt,
            template=template,
            tools=tools,
            engine=engine,
            **context,
        )
        return prompt, self.tokenize(prompt.prompt, media, add_special=prompt.add_special, parse_special=True)

    def encode(self, chunk: Chunk) -> npt.NDArray[np.float32]:
        """The embeddings of a media chunk, ``(chunk.n_tokens, model.n_embd_inp)``
        float32 (a new array): what the text model reads in place of token embeddings.
        The chunk must come from this projector's :meth:`tokenize` and be an image or a
        sound. Not for several threads at once on one projector (libmtmd keeps one output
        buffer per projector): calls are serialised."""
        if not isinstance(chunk, Chunk):
            raise type_error("chunk", "a llama_cffi.mtmd.Chunk", chunk)
        if chunk.chunks.projector is not self:
            raise ParamError("the chunk was tokenized by another projector")
        if chunk.kind == "text":
            raise ParamError("a text chunk has no embeddings to encode (decode its tokens)")
        ptr = chunk._ptr()
        n_tokens = int(lib.mtmd_input_chunk_get_n_tokens(ptr))
        n_embd = int(lib.llama_model_n_embd_inp(self.model._ptr()))
        with self._lock:
            ctx = self._ptr()
            log.sync()
            with log.capture() as lines:
                rc = int(lib.mtmd_encode_chunk(ctx, ptr))
            if rc != 0:
                said = "; ".join(line.strip() for _, line in lines[-3:])
                raise MtmdError(f"libmtmd could not encode the {chunk.kind} (mtmd_encode_chunk returned {rc}): {said}")
            data = lib.mtmd_get_output_embd(ctx)
            if data == ffi.NULL:  # pragma: no cover - libmtmd sets it on success
                raise MtmdError("libmtmd returned no embeddings")
            view = np.frombuffer(ffi.buffer(data, 4 * n_tokens * n_embd), dtype=np.float32)
            out: npt.NDArray[np.float32] = view.reshape(n_tokens, n_embd).copy()
            return out

    def eval(
        self,
        ctx: Context,
        chunks: Chunks,
        *,
        seq_id: int = 0,
        n_batch: int | None = None,
        logits_last: bool = True,
    ) -> int:
        """Decode a tokenized prompt into sequence ``seq_id`` of ``ctx`` (a context of this
        projector's model), after what the sequence holds: text chunks as tokens, media
        chunks as their embeddings (:meth:`encode`), in pieces of at most ``n_batch``
        (default: the context's), as ``mtmd_helper_eval_chunks`` does. A medium libmtmd
        decodes with non-causal attention (Gemma 3's images) is decoded with causal
        attention off, and its pieces must then fit one micro-batch (``n_ubatch``).
        ``logits_last``: the last token of the prompt (when it is text) gets logits,
        read with ``ctx.logits()``. Returns the sequence's next position.

        The media are encoded once per ``chunks``: evaluating the same chunks again (into
        another sequence or context) decodes the kept embeddings without running the
        encoder (they live as long as ``chunks``).

        Everything is checked before the first decode: the model, the sequence id, the
        room in the context (:class:`~llama_cffi.errors.KvCacheFullError`), non-causal
        pieces against ``n_ubatch`` (:class:`~llama_cffi.errors.InvalidBatchError`)."""
        return self._eval(ctx, chunks, seq_id=seq_id, n_batch=n_batch, logits_last=logits_last)[0]

    def _eval(
        self,
        ctx: Context,
        chunks: Chunks,
        *,
        seq_id: int = 0,
        n_batch: int | None = None,
        logits_last: bool = True,
        start_cell: int = 0,
    ) -> tuple[int, Any]:
        """:meth:`eval` of the cells of ``chunks`` from ``start_cell`` on (the sequence
        holds the ones before: a branch or chat session extending what it decoded; a
        medium is never split), returning ``(next position, the last decode's logits row
        or None)``."""
        from .context import Context

        expect("ctx", ctx, Context, "a llama_cffi.Context")
        expect("chunks", chunks, Chunks, "a llama_cffi.mtmd.Chunks (from Projector.tokenize)")
        if chunks.projector is not self:
            raise ParamError("the chunks were tokenized by another projector")
        if ctx.model is not self.model:
            raise ParamError("the context is of another model than this projector's")
        if not isinstance(logits_last, bool):
            raise type_error("logits_last", "a bool", logits_last)
        mrope = self.uses_mrope
        if mrope and start_cell:
            raise UnsupportedError("with M-RoPE positions a prompt is decoded whole: its positions are not its cells")
        seq_id = ctx._check_seq(seq_id)
        if n_batch is None:
            n_batch = ctx.n_batch
        elif isinstance(n_batch, bool) or not isinstance(n_batch, int):
            raise type_error("n_batch", "an int or None", n_batch)
        elif not 1 <= n_batch <= ctx.n_batch:
            raise ParamError(f"n_batch must be in [1, {ctx.n_batch}] (the context's n_batch), not {n_batch}")
        mctx = self._ptr()
        n_ubatch = int(lib.llama_n_ubatch(ctx._ptr()))
        start = int(ctx.memory.seq_pos_max(seq_id)) + 1
        if start + chunks.n_pos - start_cell > ctx.n_ctx_seq:
            raise KvCacheFullError(
                f"the prompt's {chunks.n_pos - start_cell} positions after position {start} pass "
                f"n_ctx_seq={ctx.n_ctx_seq}"
            )
        plan = []
        cell = 0
        for c in chunks:
            ptr = c._ptr()
            n = c.n_tokens
            skip = min(n, max(0, start_cell - cell))
            cell += n
            if skip == n:
                continue
            if skip and c.kind != "text":
                raise ParamError(f"start_cell={start_cell} is inside the {c.kind} of chunk {c.index}")
            non_causal = c.kind != "text" and bool(lib.mtmd_decode_use_non_causal(mctx, ptr))
            if non_causal and min(n, n_batch) > n_ubatch:
                raise InvalidBatchError(
                    f"the {c.kind} of {n} tokens is decoded with non-causal attention, in pieces of "
                    f"{min(n, n_batch)}: they must fit one micro-batch (n_ubatch={n_ubatch})"
                )
            plan.append((c, non_causal, skip))
        if start_cell > cell:
            raise ParamError(f"start_cell={start_cell} is past the prompt's {cell} cells")
        pos = start
        row = None
        for i, (c, non_causal, skip) in enumerate(plan):
            last = logits_last and i == len(plan) - 1
            if c.kind == "text":
                tokens = c.tokens[skip:]
                for off in range(0, len(tokens), n_batch):
                    end = min(len(tokens), off + n_batch)
                    want = "last" if last and end == len(tokens) else "none"
                    row = ctx.decode(tokens[off:end], pos=pos + off, seq_id=seq_id, logits=want)
                pos += len(tokens)
                continue
            emb = chunks._encoded.get(c.index)
            if emb is None:  # encoded once per Chunks: another sequence reuses it
                emb = self.encode(c)
                emb.setflags(write=False)
                chunks._encoded[c.index] = emb
            sections = _mrope_sections(c._ptr(), c.n_tokens, pos) if mrope and c.kind == "image" else None
            causal = ctx.causal_attn
            if non_causal:
                ctx.set_causal_attn(False)
            try:
                for off in range(0, c.n_tokens, n_batch):
                    end = min(c.n_tokens, off + n_batch)
                    if sections is not None:  # an image's 2-D grid of M-RoPE positions
                        row = ctx.decode_embeddings(emb[off:end], seq_id=seq_id, mrope_pos=sections[off:end])
                    else:  # a sound (with M-RoPE: each row's four positions are its position)
                        row = ctx.decode_embeddings(emb[off:end], pos=pos + off, seq_id=seq_id)
            finally:
                if non_causal:
                    ctx.set_causal_attn(causal)
            pos += c.n_pos
        return pos, row


_KINDS = {0: "text", 1: "image", 2: "audio"}


def _mrope_sections(chunk_ptr: Any, n_tokens: int, pos_0: int) -> npt.NDArray[np.int64]:
    """An image chunk's M-RoPE positions from ``pos_0``: an ``(n_tokens, 4)`` array of
    (t, y, x, z) as libmtmd's helper places them (``mtmd_helper_image_get_decoder_pos``,
    columns in the order llama.cpp reads the sections)."""
    image = lib.mtmd_input_chunk_get_tokens_image(chunk_ptr)
    if image == ffi.NULL:  # pragma: no cover - an image chunk has its tokens
        raise MtmdError("libmtmd returned no image tokens for an image chunk")
    out = ffi.new("struct mtmd_decoder_pos[]", n_tokens)
    lib.mtmd_helper_image_get_decoder_pos(image, pos_0, out)
    raw = np.frombuffer(ffi.buffer(out), dtype=np.uint32).reshape(n_tokens, 4).astype(np.int64)
    return raw[:, [0, 2, 1, 3]]  # the struct is (t, x, y, z); llama.cpp's sections are (t, y, x, z)


def _digest(m: Image | Audio) -> str:
    """A medium's id when it was given none: the SHA-256 of its shape and data, so that
    the same pixels or samples are the same medium (a branch or chat session reuses its
    KV cells)."""
    import hashlib

    h = hashlib.sha256()
    if isinstance(m, Image):
        h.update(b"image %d %d:" % (m.height, m.width))
        h.update(m.pixels.data)
    else:
        h.update(b"audio %d %d:" % (m.sample_rate, m.samples.shape[0]))
        h.update(m.samples.data)
    return "sha256:" + h.hexdigest()


class Chunks(HandleOwner):
    """A tokenized prompt (:meth:`Projector.tokenize`): text and media chunks in order,
    ``len()``, indexing and iteration give :class:`Chunk` views. Owns libmtmd's chunk
    list (with the media's preprocessed data) until :meth:`close` or garbage collection;
    its projector stays alive while it does."""

    def __init__(self, projector: Projector, ptr: Any) -> None:
        expect("projector", projector, Projector, "a llama_cffi.mtmd.Projector (chunks come from Projector.tokenize)")
        if not isinstance(ptr, ffi.CData) or ffi.typeof(ptr) is not ffi.typeof("mtmd_input_chunks *"):
            raise type_error("ptr", "an mtmd_input_chunks * (chunks come from Projector.tokenize)", ptr)
        projector._ptr()  # ClosedError for a closed projector
        assert projector._handle is not None
        self._handle = NativeHandle(self, ptr, lib.mtmd_input_chunks_free, "Chunks", parent=projector._handle)
        self.projector = projector
        #: media embeddings :meth:`Projector.eval` computed, by chunk index (read-only)
        self._encoded: dict[int, npt.NDArray[np.float32]] = {}

    def __len__(self) -> int:
        return int(lib.mtmd_input_chunks_size(self._ptr()))

    def __getitem__(self, index: int) -> Chunk:
        if isinstance(index, bool) or not isinstance(index, int):
            raise type_error("index", "an int", index)
        n = len(self)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(f"chunk index {index} out of range for {n} chunks")
        return Chunk(self, i)

    def __iter__(self) -> Iterator[Chunk]:
        for i in range(len(self)):
            yield Chunk(self, i)

    @property
    def n_tokens(self) -> int:
        """Tokens (text ids and media embeddings) in all chunks: the KV cells they take."""
        return int(lib.mtmd_helper_get_n_tokens(self._ptr()))

    @property
    def n_pos(self) -> int:
        """Positions they advance (equal to :attr:`n_tokens` but with M-RoPE)."""
        return int(lib.mtmd_helper_get_n_pos(self._ptr()))

    def __repr__(self) -> str:
        if self.closed:
            return "<Chunks closed>"
        return f"<Chunks {[c.kind for c in self]} n_tokens={self.n_tokens}>"


class Chunk:
    """One chunk of a :class:`Chunks` (a view: valid while the chunks are open)."""

    __slots__ = ("chunks", "index")

    def __init__(self, chunks: Chunks, index: int) -> None:
        expect("chunks", chunks, Chunks, "a llama_cffi.mtmd.Chunks (index it to get a chunk)")
        self.chunks = chunks
        self.index = expect_int("index", index)

    def _ptr(self) -> Any:
        return lib.mtmd_input_chunks_get(self.chunks._ptr(), self.index)

    @property
    def kind(self) -> str:
        """``"text"``, ``"image"`` or ``"audio"``."""
        return _KINDS[int(lib.mtmd_input_chunk_get_type(self._ptr()))]

    @property
    def n_tokens(self) -> int:
        return int(lib.mtmd_input_chunk_get_n_tokens(self._ptr()))

    @property
    def n_pos(self) -> int:
        """Positions the chunk advances: its tokens, but an image's ``max(t, h, w)`` with
        M-RoPE."""
        return int(lib.mtmd_input_chunk_get_n_pos(self._ptr()))

    @property
    def tokens(self) -> npt.NDArray[np.int32]:
        """A text chunk's token ids (a new array); empty for media."""
        n = ffi.new("size_t *")
        data = lib.mtmd_input_chunk_get_tokens_text(self._ptr(), n)
        if data == ffi.NULL or n[0] == 0:
            return np.zeros(0, np.int32)
        out: npt.NDArray[np.int32] = np.frombuffer(ffi.buffer(data, 4 * n[0]), dtype=np.int32).copy()
        return out

    @property
    def id(self) -> str | None:
        """A media chunk's id (the medium's ``id``), None for text or none given."""
        raw = lib.mtmd_input_chunk_get_id(self._ptr())
        return None if raw == ffi.NULL else str(ffi.string(raw).decode("utf-8", "replace"))

    def __repr__(self) -> str:
        return f"<Chunk {self.index} {self.kind} n_tokens={self.n_tokens}>"
