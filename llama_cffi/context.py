"""``Context``: inference state over a model (parameters, decode, logits, KV memory).

A context holds its :class:`~llama_cffi.Model` alive. Logits are returned as numpy
*views* of llama.cpp's output buffer: zero-copy, valid until the next ``decode`` on
this context (copy them to keep them).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from . import log
from ._binding import ffi, lib
from ._cdata import struct_to_dict
from ._handle import NativeHandle
from .batch import Batch
from .errors import (
    AdapterError,
    ContextCreateError,
    DecodeAbortedError,
    DecodeError,
    InvalidBatchError,
    NoKvSlotError,
    ParamError,
)

if TYPE_CHECKING:
    from .lora import LoraAdapter
    from .model import Model

Logits = npt.NDArray[np.float32]


def context_default_params() -> dict[str, Any]:
    """The defaults of ``llama_context_default_params()`` (pointers as None)."""
    return struct_to_dict(lib.llama_context_default_params(), "struct llama_context_params")


def _available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


_SETTABLE_POINTERS = {
    "cb_eval",
    "cb_eval_user_data",
    "abort_callback",
    "abort_callback_data",
    "samplers",
    "n_samplers",
    "ctx_other",
}


def build_context_params(**kwargs: Any) -> Any:
    """A ``struct llama_context_params`` from keyword arguments (field names as in llama.h)."""
    c = lib.llama_context_default_params()
    fields = dict(ffi.typeof("struct llama_context_params").fields)
    if "n_threads" not in kwargs:  # llama.cpp's default (4) oversubscribes small machines
        c.n_threads = min(int(c.n_threads), _available_cores())
    if "n_threads_batch" not in kwargs:
        c.n_threads_batch = min(int(c.n_threads_batch), _available_cores())
    for name, value in kwargs.items():
        fld = fields.get(name)
        if fld is None or name in _SETTABLE_POINTERS:
            known = sorted(k for k in fields if k not in _SETTABLE_POINTERS)
            raise TypeError(f"unknown or unsupported context parameter {name!r}; known: {', '.join(known)}")
        t = fld.type
        if t.cname == "_Bool":
            if not isinstance(value, bool):
                raise ParamError(f"{name} must be True or False, not {value!r}")
            setattr(c, name, value)
        elif t.kind == "primitive" and t.cname in ("float", "double"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ParamError(f"{name} must be a number, not {value!r}")
            setattr(c, name, float(value))
        elif t.kind in ("primitive", "enum"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ParamError(f"{name} must be an int, not {value!r}")
            if t.cname.startswith("uint") and value < 0:
                raise ParamError(f"{name}={value} must be >= 0")
            try:
                setattr(c, name, int(value))
            except OverflowError:
                raise ParamError(f"{name}={value} is out of range for {t.cname}") from None
        else:  # pragma: no cover - all remaining fields are in _SETTABLE_POINTERS
            raise ParamError(f"context parameter {name} cannot be set from Python")
    if c.n_batch == 0 and c.n_ubatch == 0:
        raise ParamError("n_batch and n_ubatch cannot both be 0")
    if c.n_seq_max > lib.llama_max_parallel_sequences():
        raise ParamError(
            f"n_seq_max={c.n_seq_max} exceeds llama_max_parallel_sequences()={lib.llama_max_parallel_sequences()}"
        )
    if c.n_seq_max == 0:
        raise ParamError("n_seq_max must be >= 1")
    return c


class Context:
    """An inference context. ``Context(model, n_ctx=2048, ...)`` or ``model.context(...)``."""

    _handle: NativeHandle | None = None

    def __init__(self, model: Model, **params: Any) -> None:
        assert model._handle is not None
        mptr = model._ptr()
        if model.vocab_only:
            # llama.cpp creates the context but aborts the process on the first decode
            raise ContextCreateError(f"{model.path!r} was loaded with vocab_only=True; a context needs the weights")
        cparams = build_context_params(**params)
        log.sync()
        with log.capture() as lines:
            ptr = lib.llama_init_from_model(mptr, cparams)
        if ptr == ffi.NULL:
            reason = "; ".join(line for _, line in lines[-3:]) or "llama.cpp returned no context"
            raise ContextCreateError(f"cannot create a context: {reason}")
        self._handle = NativeHandle(self, ptr, lib.llama_free, "Context", parent=model._handle)
        self.model = model
        self.n_vocab = model.n_vocab
        self._memory = lib.llama_get_memory(ptr)
        self.n_batch = int(lib.llama_n_batch(ptr))
        self._batch = Batch(self.n_batch)
        self._adapters: list[LoraAdapter] = []
        self._adapter_handles: list[NativeHandle] = []

    # ------------------------------------------------------------------ lifetime
    def _ptr(self) -> Any:
        assert self._handle is not None
        return self._handle.get()

    def close(self) -> None:
        """Free the context (idempotent). The model stays usable."""
        if self._handle is not None:
            self._release_adapters()
            self._handle.close()

    free = close

    @property
    def closed(self) -> bool:
        return self._handle is None or self._handle.closed

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def underlying(self) -> Any:
        """The raw ``llama_context *`` (for use with ``llama_cffi.lib``); valid while open."""
        return self._ptr()

    # ------------------------------------------------------------------ sizes
    @property
    def n_ctx(self) -> int:
        return int(lib.llama_n_ctx(self._ptr()))

    @property
    def n_ubatch(self) -> int:
        return int(lib.llama_n_ubatch(self._ptr()))

    @property
    def n_seq_max(self) -> int:
        return int(lib.llama_n_seq_max(self._ptr()))

    @property
    def n_threads(self) -> int:
        return int(lib.llama_n_threads(self._ptr()))

    # ------------------------------------------------------------------ decoding
    def _check_rc(self, rc: int) -> None:
        if rc == 0:
            return
        if rc == 1:
            raise NoKvSlotError("no KV cache slot for the batch (the context is full: n_ctx too small)")
        if rc == 2:
            raise DecodeAbortedError("decode was aborted")
        if rc == -1:
            raise InvalidBatchError("llama_decode rejected the batch as invalid")
        raise DecodeError(f"llama_decode failed with code {rc}")

    def decode_batch(self, batch: Batch) -> None:
        """``llama_decode`` one prepared batch; return codes become typed exceptions."""
        if batch.n_tokens == 0:
            raise InvalidBatchError("the batch is empty")
        if batch.n_tokens > self.n_batch:
            raise InvalidBatchError(f"batch of {batch.n_tokens} tokens exceeds n_batch={self.n_batch}")
        bad = (batch.token[: batch.n_tokens] < 0) | (batch.token[: batch.n_tokens] >= self.n_vocab)
        if bad.any():
            i = int(np.argmax(bad))
            raise InvalidBatchError(
                f"token id {int(batch.token[i])} at batch index {i} is out of range [0, {self.n_vocab})"
            )
        self._check_rc(lib.llama_decode(self._ptr(), batch.c))

    def decode(self, tokens: Any, seq_id: int = 0, pos: int | None = None) -> Logits:
        """Append ``tokens`` to sequence ``seq_id`` and return the last token's logits.

        Long inputs are split into ``n_batch`` chunks. ``pos`` defaults to the end of the
        sequence in the KV memory. Returns a view valid until the next decode.
        """
        arr = self.model.vocab.check_tokens(tokens)
        if len(arr) == 0:
            raise InvalidBatchError("decode needs at least one token")
        ptr = self._ptr()
        if not 0 <= seq_id < int(lib.llama_n_seq_max(ptr)):
            raise ParamError(f"seq_id={seq_id} is out of range [0, {int(lib.llama_n_seq_max(ptr))})")
        start = self.seq_pos_max(seq_id) + 1 if pos is None else pos
        if start + len(arr) > self.n_ctx:
            raise NoKvSlotError(f"{len(arr)} tokens at position {start} do not fit n_ctx={self.n_ctx}")
        b = self._batch
        for off in range(0, len(arr), self.n_batch):
            chunk = arr[off : off + self.n_batch]
            b.set_sequence(chunk, start + off, seq_id, output_last=off + len(chunk) == len(arr))
            self._check_rc(lib.llama_decode(ptr, b.c))
        return self.logits(-1)

    def logits(self, i: int = -1) -> Logits:
        """Logits of output ``i`` of the last decode (negative counts from the end).

        A float32 view of ``n_vocab`` values into llama.cpp's buffer: valid until the
        next decode on this context.
        """
        p = lib.llama_get_logits_ith(self._ptr(), i)
        if p == ffi.NULL:
            raise IndexError(f"no logits for output {i} (was that token marked for output?)")
        return np.frombuffer(ffi.buffer(p, 4 * self.n_vocab), dtype=np.float32)

    # ------------------------------------------------------------------ memory
    def seq_pos_max(self, seq_id: int = 0) -> int:
        """Largest position of ``seq_id`` in the KV memory, -1 if empty."""
        self._ptr()
        return int(lib.llama_memory_seq_pos_max(self._memory, seq_id))

    def clear(self, data: bool = True) -> None:
        """Empty the KV memory (all sequences)."""
        self._ptr()
        lib.llama_memory_clear(self._memory, data)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove positions ``[p0, p1)`` of ``seq_id`` (negative bounds: open)."""
        self._ptr()
        return bool(lib.llama_memory_seq_rm(self._memory, seq_id, p0, p1))

    # ------------------------------------------------------------------ adapters
    def set_lora_adapters(self, adapters: Mapping[LoraAdapter, float] | None) -> None:
        """Apply exactly these LoRA adapters with these scales (``None``/``{}``: none)."""
        from .lora import normalise_adapters

        pairs = normalise_adapters(adapters, self.model)
        ptrs = ffi.new("struct llama_adapter_lora *[]", [a._ptr() for a, _ in pairs] or [ffi.NULL])
        scales = ffi.new("float[]", [s for _, s in pairs] or [0.0])
        rc = lib.llama_set_adapters_lora(self._ptr(), ptrs, len(pairs), scales)
        if rc != 0:
            raise AdapterError(f"llama_set_adapters_lora failed ({rc})")
        self._release_adapters()
        for a, _ in pairs:
            # the context now depends on the adapter: closing it is deferred until we let go
            assert a._handle is not None
            dep = NativeHandle(self, object(), lambda _p: None, "adapter use", parent=a._handle)
            self._adapter_handles.append(dep)
        self._adapters = [a for a, _ in pairs]

    def _release_adapters(self) -> None:
        for h in self._adapter_handles:
            h.close()
        self._adapter_handles = []
        self._adapters = []

    def set_control_vector(self, data: npt.ArrayLike | None, il_start: int = 1, il_end: int | None = None) -> None:
        """Apply a control vector: ``data`` of shape ``(n_layer, n_embd)`` (row ``k`` is layer
        ``k + 1``), to layers ``il_start..il_end`` inclusive; ``None`` clears it."""
        ptr = self._ptr()
        n_embd, n_layer = self.model.n_embd, self.model.n_layer
        if data is None:
            rc = lib.llama_set_adapter_cvec(ptr, ffi.NULL, 0, n_embd, 0, 0)
        else:
            arr = np.ascontiguousarray(data, dtype=np.float32)
            if arr.ndim != 2 or arr.shape[1] != n_embd or not 1 <= arr.shape[0] <= n_layer:
                raise AdapterError(f"control vector must have shape (<= {n_layer}, {n_embd}), got {arr.shape}")
            end = arr.shape[0] if il_end is None else il_end
            if not 1 <= il_start <= end <= n_layer:
                raise AdapterError(f"layer range {il_start}..{end} must lie within 1..{n_layer}")
            rc = lib.llama_set_adapter_cvec(ptr, ffi.from_buffer("float[]", arr), arr.size, n_embd, il_start, end)
        if rc != 0:
            raise AdapterError(f"llama_set_adapter_cvec failed ({rc})")
