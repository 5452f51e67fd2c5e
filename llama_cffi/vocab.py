"""A model's vocabulary: tokenize, detokenize, pieces, special tokens, token attributes.

A :class:`Vocab` belongs to its :class:`~llama_cffi.Model` (llama.cpp's vocab lives
inside the model) and raises :class:`~llama_cffi.errors.ClosedError` once the model is
closed. Token ids are checked against ``[0, n_vocab)`` in Python before any call
reaches C: llama.cpp aborts the process on an out-of-range id.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ._args import expect, expect_bool, expect_strs, type_error
from ._binding import ffi, lib
from .enums import TokenAttr, VocabType
from .errors import InvalidTokenError, TokenizeError, TokenTypeError

if TYPE_CHECKING:
    from ._handle import NativeHandle

TokenArray = npt.NDArray[np.int32]
Tokens = Sequence[int] | npt.NDArray[np.integer[Any]]

_INT32_MAX = 2**31 - 1


class Vocab:
    """The vocabulary of one model (see the module docstring for lifetime rules)."""

    def __init__(self, model_handle: NativeHandle) -> None:
        from ._handle import NativeHandle

        expect("model_handle", model_handle, NativeHandle, "a model's NativeHandle (use Model.vocab)")
        self._model = model_handle
        self._ptr = lib.llama_model_get_vocab(model_handle.get())
        self.n_vocab: int = int(lib.llama_vocab_n_tokens(self._ptr))
        self._tls = threading.local()
        self._eog: tuple[int, ...] | None = None  # the vocabulary never changes: found once

    def _vocab(self) -> Any:
        self._model.get()  # raises ClosedError once the model is closed
        return self._ptr

    def _piece_buf(self) -> tuple[Any, int]:
        buf = getattr(self._tls, "buf", None)
        if buf is None:
            buf = self._tls.buf = (ffi.new("char[]", 256), 256)
        return buf

    # ------------------------------------------------------------------ checking
    def check_token(self, token: int, name: str = "token") -> int:
        """Return ``token`` as an int, or raise :class:`InvalidTokenError` (a
        :class:`~llama_cffi.errors.TokenTypeError`, also a ``TypeError``, when it is no int);
        ``name``: the parameter the messages name."""
        if not isinstance(name, str):
            raise type_error("name", "a str (the parameter the messages name)", name)
        if isinstance(token, (bool, np.bool_)) or not isinstance(token, (int, np.integer)):
            raise TokenTypeError(f"{name} must be an int, not {type(token).__name__} ({token!r})")
        t = int(token)
        if not 0 <= t < self.n_vocab:
            raise InvalidTokenError(f"token id {t} is out of range [0, {self.n_vocab})")
        return t

    def check_tokens(self, tokens: Tokens | Iterable[int], name: str = "tokens") -> TokenArray:
        """``tokens`` as a contiguous int32 array, every id checked to be in range;
        ``name``: the parameter the messages name (a value that is no sequence of ints is
        a :class:`~llama_cffi.errors.TokenTypeError`)."""
        if not isinstance(name, str):
            raise type_error("name", "a str (the parameter the messages name)", name)
        if isinstance(tokens, np.ndarray):
            arr = tokens
        else:
            if isinstance(tokens, (str, bytes, bytearray)) or not isinstance(tokens, Iterable):
                raise TokenTypeError(f"{name} must be a sequence or array of token ids, not {type(tokens).__name__}")
            seq = tokens if isinstance(tokens, Sequence) else list(tokens)
            if any(isinstance(t, (bool, np.bool_)) for t in seq):
                raise TokenTypeError(f"{name}: token ids must be ints, not bools")
            try:
                arr = np.asarray(seq) if len(seq) else np.zeros(0, dtype=np.int32)
            except (ValueError, TypeError) as exc:
                raise TokenTypeError(f"{name} must be a flat sequence of ints ({exc})") from None
        if arr.ndim != 1:
            raise InvalidTokenError(f"{name} must be one-dimensional, got shape {arr.shape}")
        if arr.size and arr.dtype.kind not in "iu":
            if arr.dtype == object and all(type(t) is int for t in arr.flat):  # ints past int64: a range error
                raise InvalidTokenError(f"{name}: token ids must lie in [0, {self.n_vocab}), not {max(arr.flat)}")
            raise TokenTypeError(f"{name}: token ids must be integers, got dtype {arr.dtype}")
        if arr.size:
            lo, hi = int(arr.min()), int(arr.max())
            if lo < 0 or hi >= self.n_vocab:
                bad_index = int(np.argmax((arr < 0) | (arr >= self.n_vocab)))
                raise InvalidTokenError(
                    f"token id {int(arr[bad_index])} at index {bad_index} is out of range [0, {self.n_vocab})"
                )
        return np.ascontiguousarray(arr, dtype=np.int32)

    # ------------------------------------------------------------------ text
    def tokenize(
        self, text: str | bytes | bytearray | memoryview, add_special: bool = True, parse_special: bool = False
    ) -> TokenArray:
        """Tokenize UTF-8 text (``str`` is encoded; ``bytes`` are passed as they are).

        ``add_special`` adds BOS/EOS as the model's metadata asks; ``parse_special``
        turns special-token text such as ``<|im_start|>`` into its single id. Returns a
        new int32 array of any length (sized in two passes).
        """
        if isinstance(text, str):
            data = text.encode("utf-8")
        elif isinstance(text, (bytes, bytearray, memoryview)):
            data = bytes(text)
        else:  # bytes(5) would be five NUL bytes, bytes(10**10) ten gigabytes
            raise type_error("text", "a str or bytes", text)
        add_special = expect_bool("add_special", add_special)
        parse_special = expect_bool("parse_special", parse_special)
        if len(data) > _INT32_MAX:
            raise TokenizeError(f"text is {len(data)} bytes; llama.cpp takes at most {_INT32_MAX}")
        vocab = self._vocab()
        cap = len(data) + 16
        for _ in range(2):
            out = np.empty(cap, dtype=np.int32)
            n = lib.llama_tokenize(
                vocab, data, len(data), ffi.from_buffer("llama_token[]", out), cap, add_special, parse_special
            )
            if n >= 0:
                return out[:n].copy() if n < cap // 2 else out[:n]
            if n == -(2**31):
                raise TokenizeError("the token count overflows llama.cpp's 32-bit length")
            cap = -n
        raise TokenizeError("llama_tokenize did not converge on a buffer size")  # pragma: no cover

    def token_to_piece(self, token: int, special: bool = False, lstrip: int = 0) -> bytes:
        """The bytes of one token. Control/unknown tokens give ``b""`` unless ``special``.

        ``lstrip`` removes up to that many leading spaces. A piece can be part of a UTF-8
        character: use :class:`StreamingDetokenizer` to turn a token stream into text.
        """
        t = self.check_token(token)
        if special is not False and special is not True:
            special = expect_bool("special", special)
        if type(lstrip) is not int or lstrip < 0:
            if isinstance(lstrip, bool) or not isinstance(lstrip, int):
                raise type_error("lstrip", "an int >= 0", lstrip)
            raise ValueError(f"lstrip must be an int >= 0, not {lstrip!r}")
        vocab = self._vocab()
        buf, size = self._piece_buf()
        n = lib.llama_token_to_piece(vocab, t, buf, size, lstrip, special)
        if n < 0:
            size = -n
            buf = ffi.new("char[]", size)
            n = lib.llama_token_to_piece(vocab, t, buf, size, lstrip, special)
        return ffi.unpack(buf, n)  # type: ignore[no-any-return]

    def detokenize_bytes(self, tokens: Tokens, remove_special: bool = False, unparse_special: bool = False) -> bytes:
        """The bytes of a token sequence, exactly as llama.cpp's ``llama_detokenize``."""
        arr = self.check_tokens(tokens)
        remove_special = expect_bool("remove_special", remove_special)
        unparse_special = expect_bool("unparse_special", unparse_special)
        vocab = self._vocab()
        ptr = ffi.from_buffer("llama_token[]", arr)
        cap = max(64, 8 * len(arr))
        for _ in range(2):
            buf = ffi.new("char[]", cap)
            n = lib.llama_detokenize(vocab, ptr, len(arr), buf, cap, remove_special, unparse_special)
            if n >= 0:
                return ffi.unpack(buf, n)  # type: ignore[no-any-return]
            cap = -n
        raise TokenizeError("llama_detokenize did not converge on a buffer size")  # pragma: no cover

    def detokenize(self, tokens: Tokens, remove_special: bool = False, unparse_special: bool = False) -> str:
        """Text of a token sequence; invalid UTF-8 (a cut-off character) becomes U+FFFD."""
        return self.detokenize_bytes(tokens, remove_special, unparse_special).decode("utf-8", "replace")

    def streaming_detokenizer(
        self, remove_special: bool = False, unparse_special: bool = False
    ) -> StreamingDetokenizer:
        """A detokenizer fed one token at a time (see :class:`StreamingDetokenizer`)."""
        return StreamingDetokenizer(self, expect_bool("remove_special", remove_special), unparse_special)

    # ------------------------------------------------------------------ tokens
    @property
    def type(self) -> VocabType:
        return VocabType(lib.llama_vocab_type(self._vocab()))

    def token_text(self, token: int) -> str:
        """The token's text as stored in the model (SPM pieces keep their ``▁``)."""
        t = self.check_token(token)
        return ffi.string(lib.llama_vocab_get_text(self._vocab(), t)).decode("utf-8", "replace")  # type: ignore[no-any-return]

    def token_score(self, token: int) -> float:
        return float(lib.llama_vocab_get_score(self._vocab(), self.check_token(token)))

    def token_attr(self, token: int) -> TokenAttr:
        return TokenAttr(lib.llama_vocab_get_attr(self._vocab(), self.check_token(token)))

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, and the model's other stop tokens)."""
        return bool(lib.llama_vocab_is_eog(self._vocab(), self.check_token(token)))

    def is_control(self, token: int) -> bool:
        return bool(lib.llama_vocab_is_control(self._vocab(), self.check_token(token)))

    def _special(self, fn: Any) -> int | None:
        t = int(fn(self._vocab()))
        return None if t == lib.LLAMA_TOKEN_NULL else t

    @property
    def bos(self) -> int | None:
        """Beginning-of-sequence token, or None if the model has none."""
        return self._special(lib.llama_vocab_bos)

    @property
    def eos(self) -> int | None:
        return self._special(lib.llama_vocab_eos)

    @property
    def eot(self) -> int | None:
        return self._special(lib.llama_vocab_eot)

    @property
    def sep(self) -> int | None:
        return self._special(lib.llama_vocab_sep)

    @property
    def nl(self) -> int | None:
        return self._special(lib.llama_vocab_nl)

    @property
    def pad(self) -> int | None:
        return self._special(lib.llama_vocab_pad)

    @property
    def mask(self) -> int | None:
        return self._special(lib.llama_vocab_mask)

    @property
    def fim_pre(self) -> int | None:
        return self._special(lib.llama_vocab_fim_pre)

    @property
    def fim_suf(self) -> int | None:
        return self._special(lib.llama_vocab_fim_suf)

    @property
    def fim_mid(self) -> int | None:
        return self._special(lib.llama_vocab_fim_mid)

    @property
    def fim_pad(self) -> int | None:
        return self._special(lib.llama_vocab_fim_pad)

    @property
    def fim_rep(self) -> int | None:
        return self._special(lib.llama_vocab_fim_rep)

    @property
    def fim_sep(self) -> int | None:
        return self._special(lib.llama_vocab_fim_sep)

    @property
    def add_bos(self) -> bool:
        return bool(lib.llama_vocab_get_add_bos(self._vocab()))

    @property
    def add_eos(self) -> bool:
        return bool(lib.llama_vocab_get_add_eos(self._vocab()))

    @property
    def add_sep(self) -> bool:
        return bool(lib.llama_vocab_get_add_sep(self._vocab()))

    def special_tokens(self) -> dict[str, int]:
        """Every special token the model defines, by role (``bos``, ``eos``, ``fim_pre``...)."""
        roles = (
            "bos",
            "eos",
            "eot",
            "sep",
            "nl",
            "pad",
            "mask",
            "fim_pre",
            "fim_suf",
            "fim_mid",
            "fim_pad",
            "fim_rep",
            "fim_sep",
        )
        out = {}
        for role in roles:
            t = getattr(self, role)
            if t is not None:
                out[role] = t
        return out

    def pieces_blob(self, special: bool = True) -> tuple[bytes, npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """Every token's piece at once: ``(blob, offsets, eog)``, where token ``t``'s bytes
        are ``blob[offsets[t]:offsets[t + 1]]`` (``token_to_piece(t, special)``), ``offsets``
        has ``n_vocab + 1`` entries and ``eog[t]`` says whether ``t`` ends generation. One C
        loop (about 20 ms for 262,144 tokens, against 0.3 s token by token); the arrays are
        new and owned by the caller."""
        special = expect_bool("special", special)
        vocab = self._vocab()
        n = self.n_vocab
        offsets = np.zeros(n + 1, dtype=np.int64)
        eog = np.zeros(n, dtype=np.uint8)
        cap = 16 * n + 64
        for _ in range(2):
            buf = ffi.new("char[]", cap)
            total = lib.llama_cffi_vocab_pieces(
                vocab, special, buf, cap, ffi.from_buffer("int64_t[]", offsets), ffi.from_buffer("uint8_t[]", eog)
            )
            if total == -(2**63):
                raise TokenizeError("a token's piece could not be read")
            if total >= 0:
                return ffi.unpack(buf, total), offsets, eog.view(bool)
            cap = -total
        raise TokenizeError("the vocabulary's size changed while reading it")  # pragma: no cover

    def suppress_tokens(self) -> list[int]:
        """Token ids the model's metadata says never to generate
        (``tokenizer.ggml.suppress_tokens``); llama.cpp's tools ban them with a ``-inf``
        logit bias, as :meth:`samplers.params.SamplingParams.to_chain` does."""
        n = ffi.new("int32_t *")
        ptr = lib.llama_vocab_get_suppress_tokens(self._vocab(), n)
        return [] if ptr == ffi.NULL else [int(ptr[i]) for i in range(n[0])]

    def eog_tokens(self) -> list[int]:
        """All end-of-generation token ids (a new list). The first call makes one pass over
        the vocabulary in C calls (~35 ms at 262,144 tokens); the ids are kept for later
        calls (chat templates ask for them every turn)."""
        vocab = self._vocab()
        if self._eog is None:
            self._eog = tuple(t for t in range(self.n_vocab) if lib.llama_vocab_is_eog(vocab, t))
        return list(self._eog)

    def __repr__(self) -> str:
        return f"<Vocab {self.type.name} n_vocab={self.n_vocab}>"


class StreamingDetokenizer:
    """Turn tokens into text one at a time, never emitting half a UTF-8 character.

    ``push(token)`` returns the text that became final with that token (often ``""``
    while a multi-byte character or a word boundary is pending); ``flush()`` returns
    what is left. The concatenation of everything returned equals
    ``vocab.detokenize(all_tokens, ...)`` for the same flags.

    It keeps a small window of recent tokens and decodes it with ``llama_detokenize``
    (prefix/read offsets, as text-generation-inference does), so llama.cpp's own rules
    for leading spaces and special tokens apply unchanged.
    """

    def __init__(self, vocab: Vocab, remove_special: bool = False, unparse_special: bool = False) -> None:
        self._vocab = expect("vocab", vocab, Vocab, "a llama_cffi.Vocab")
        self._remove_special = expect_bool("remove_special", remove_special)
        self._unparse_special = expect_bool("unparse_special", unparse_special)
        self._tokens: list[int] = []
        self._prefix = 0  # window start
        self._read = 0  # tokens before this are emitted

    def _decode(self, start: int, end: int) -> str:
        return self._vocab.detokenize(self._tokens[start:end], self._remove_special, self._unparse_special)

    def push(self, token: int) -> str:
        """Add one token; return the newly completed text."""
        self._tokens.append(self._vocab.check_token(token))
        prefix_text = self._decode(self._prefix, self._read)
        new_text = self._decode(self._prefix, len(self._tokens))
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            out = new_text[len(prefix_text) :]
            self._prefix = self._read
            self._read = len(self._tokens)
            if self._prefix > 64:  # keep memory bounded on long streams
                del self._tokens[: self._prefix]
                self._read -= self._prefix
                self._prefix = 0
            return out
        return ""

    def flush(self) -> str:
        """Return all text not yet returned (a dangling partial character as U+FFFD)."""
        prefix_text = self._decode(self._prefix, self._read)
        new_text = self._decode(self._prefix, len(self._tokens))
        self._prefix = self._read = len(self._tokens)
        return new_text[len(prefix_text) :]

    def reset(self) -> None:
        self._tokens.clear()
        self._prefix = self._read = 0


class StopStringStream:
    """Text of a token stream, held back while it may be the start of a stop string.

    ``push(token)`` returns the text that became safe to show (never half a UTF-8
    character, never a possible prefix of a stop string); once a stop string appears,
    ``stopped`` is set and ``push`` returned the text before it. ``flush()``
    returns what is left at the end (nothing after a stop)."""

    def __init__(self, vocab: Vocab, stop: Iterable[str] = ()) -> None:
        self._detok = expect("vocab", vocab, Vocab, "a llama_cffi.Vocab").streaming_detokenizer()
        stops = [stop] if isinstance(stop, str) else expect_strs("stop", stop, "a str or a sequence of str")
        self._stops = [s for s in stops if s]
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._text = ""
        self._emitted = 0
        self.stopped = False

    def push(self, token: int) -> str:
        if self.stopped:
            return ""
        self._text += self._detok.push(token)
        text, emitted = self._text, self._emitted
        if self._stops:
            hits = [i for i in (text.find(s, max(0, emitted - self._hold)) for s in self._stops) if i >= 0]
            if hits:
                self.stopped = True
                end = min(hits)
                self._emitted = max(emitted, end)
                return text[emitted:end] if end > emitted else ""
            safe = max(emitted, len(text) - self._hold)
        else:
            safe = len(text)
        self._emitted = safe
        return text[emitted:safe]

    def flush(self) -> str:
        if self.stopped:
            return ""
        self._text += self._detok.flush()
        out = self._text[self._emitted :]
        self._emitted = len(self._text)
        return out
