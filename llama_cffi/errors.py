"""Exceptions raised by llama_cffi.

Every exception derives from :class:`LlamaError` *and* from the builtin that fits, so
``except ValueError`` or ``except OSError`` keep working in code that does not know
about this library.
"""

from __future__ import annotations

import os


class LlamaError(Exception):
    """Base class of every error raised by llama_cffi."""


class ClosedError(LlamaError, ValueError):
    """An object was used after ``close()``/``free()`` (its native handle is gone)."""


class ModelLoadError(LlamaError, OSError):
    """A model could not be loaded. ``path`` is the file, ``reason`` what went wrong."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"cannot load model {self.path!r}: {reason}")

    def __str__(self) -> str:
        return f"cannot load model {self.path!r}: {self.reason}"


class ModelNotFoundError(ModelLoadError, FileNotFoundError):
    """The model path does not exist."""


class InvalidModelError(ModelLoadError, ValueError):
    """The file exists but is not a model llama.cpp can load (wrong magic, truncated,
    corrupt, unsupported architecture, a directory, ...)."""


class ModelLoadCancelled(ModelLoadError):
    """The progress callback returned ``False``, so llama.cpp stopped loading."""


class DefaultModelNotInstalled(LlamaError, ImportError):
    """The default model package is not installed; the message gives the command."""


class InvalidMediaError(LlamaError, ValueError):
    """An image or sound file that cannot be used: not a format read here, truncated,
    undecodable, or bigger than its bounds (pixels, seconds); the message says which
    (:mod:`llama_cffi.media_file`)."""


class MediaNotFoundError(InvalidMediaError, FileNotFoundError):
    """The image or sound file does not exist."""


class InvalidTokenError(LlamaError, ValueError):
    """A token id outside ``[0, n_vocab)`` (checked before it can reach C)."""


class TokenTypeError(InvalidTokenError, TypeError):
    """A token id that is not an int, or token ids that are not a sequence of ints: an
    :class:`InvalidTokenError` that is also a ``TypeError``."""


class TokenizeError(LlamaError, ValueError):
    """Text could not be tokenized (too long for llama.cpp's 32-bit lengths, ...)."""


class ChatTemplateError(LlamaError, ValueError):
    """A chat template could not be applied (unknown to llama.cpp, bad messages, ...)."""


class AdapterError(LlamaError, ValueError):
    """A LoRA adapter or control vector could not be loaded or applied."""


class ParamError(LlamaError, ValueError):
    """A parameter value is invalid; the message names the parameter and the value."""


class ParamTypeError(ParamError, TypeError):
    """A parameter of the wrong type (a ``Context`` where a ``BranchStore`` is needed, a
    str where an int is): a :class:`ParamError` that is also a ``TypeError``; the message
    names the parameter and what it takes."""


class ContextCreateError(LlamaError, MemoryError):
    """``llama_init_from_model`` failed (out of memory, unsupported parameters, ...)."""


class DecodeError(LlamaError, RuntimeError):
    """``llama_decode`` failed (code < -1: a fatal error inside llama.cpp)."""


class KvCacheFullError(DecodeError):
    """No room in the KV cache for the batch (``llama_decode`` returned 1, or the positions
    would pass ``n_ctx``): free space with ``memory.seq_rm`` or use a larger context."""


class DecodeAbortedError(DecodeError):
    """``llama_decode`` returned 2: the abort callback stopped it."""


class InvalidBatchError(DecodeError, ValueError):
    """The batch is invalid (checked in Python first; ``llama_decode`` returned -1 otherwise)."""


class StateError(LlamaError, ValueError):
    """A saved state could not be loaded (truncated, foreign, wrong model); the context is
    left usable (its memory is cleared if llama.cpp had already started reading)."""


class ConcurrentUseError(LlamaError, RuntimeError):
    """Two threads used one Context at the same time. Use one Context per thread."""


class RpcError(LlamaError, ConnectionError):
    """An RPC worker could not be used: nothing listens at its endpoint, something other
    than a worker answered, its protocol version differs, or it went away."""


class UnsupportedError(LlamaError, ValueError):
    """The operation does not apply to this model's kind: ``encode`` on a decoder-only
    model, a partial edit of a recurrent state, ... The message names the model's kind and
    what to use instead."""


class GrammarError(LlamaError, ValueError):
    """A grammar that cannot be used (undefined rule, missing root, left recursion, ...)."""


class GrammarSyntaxError(GrammarError):
    """GBNF text that does not parse. ``line`` and ``column`` are 1-based; ``expected``
    says what the parser wanted there."""

    def __init__(self, message: str, line: int, column: int, expected: str = "") -> None:
        super().__init__(f"{message} at line {line}, column {column}")
        self.line = line
        self.column = column
        self.expected = expected
