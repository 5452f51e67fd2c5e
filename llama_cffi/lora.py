"""LoRA adapters: load for a model, read metadata, apply to contexts with scales.

An adapter belongs to the model it was loaded for (``model.load_lora(path)``); apply
it with ``context.set_lora_adapters({adapter: scale})``. Closing an adapter that a
live context still applies is deferred until that context lets go of it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from . import log
from ._args import expect, expect_mapping, expect_str, type_error
from ._binding import ffi, lib
from ._cdata import Metadata, read_metadata
from ._handle import HandleOwner, NativeHandle
from .errors import AdapterError

if TYPE_CHECKING:
    from .model import Model


class LoraAdapter(HandleOwner):
    """A LoRA (or aLoRA) adapter loaded for one model."""

    def __init__(self, model: Model, ptr: Any, path: str) -> None:
        from .model import Model

        expect("model", model, Model, "a llama_cffi.Model (load adapters with Model.load_lora)")
        if not isinstance(ptr, ffi.CData) or ffi.typeof(ptr) is not ffi.typeof("struct llama_adapter_lora *"):
            raise type_error("ptr", "a llama_adapter_lora * (load adapters with Model.load_lora)", ptr)
        path = expect_str("path", path)
        assert model._handle is not None
        self._handle = NativeHandle(
            self,
            ptr,
            lib.llama_adapter_lora_free,
            f"LoraAdapter({os.path.basename(path)!r})",
            parent=model._handle,
        )
        self.model = model
        self.path = path

    @classmethod
    def _load(cls, model: Model, path: str) -> LoraAdapter:
        if not os.path.isfile(path):
            raise AdapterError(f"LoRA adapter {path!r}: no such file")
        log.sync()
        with log.capture() as lines:
            ptr = lib.llama_adapter_lora_init(model._ptr(), path.encode())
        if ptr == ffi.NULL:
            reason = "; ".join(line for _, line in lines[-3:]) or "llama.cpp could not load it"
            raise AdapterError(f"cannot load LoRA adapter {path!r}: {reason}")
        return cls(model, ptr, path)

    #: :meth:`close` (freeing is deferred while a context applies the adapter)
    free = HandleOwner.close

    @property
    def metadata(self) -> Metadata:
        """The adapter's GGUF metadata, as strings, read with bounds (see
        :meth:`llama_cffi.Model.read_metadata`: at most 1,024 keys, 1 MiB per value;
        ``truncated`` and ``complete`` say what was cut)."""
        return read_metadata(
            lib.llama_adapter_meta_count,
            lib.llama_adapter_meta_key_by_index,
            lib.llama_adapter_meta_val_str_by_index,
            self._ptr(),
        )

    @property
    def alora_invocation_tokens(self) -> npt.NDArray[np.int32]:
        """For an activated LoRA (aLoRA): the tokens that switch it on; else empty."""
        ptr = self._ptr()
        n = int(lib.llama_adapter_get_alora_n_invocation_tokens(ptr))
        if n == 0:
            return np.zeros(0, dtype=np.int32)
        toks = lib.llama_adapter_get_alora_invocation_tokens(ptr)
        out: npt.NDArray[np.int32] = np.frombuffer(ffi.buffer(toks, 4 * n), dtype=np.int32).copy()
        return out

    def __repr__(self) -> str:
        return f"<LoraAdapter {self.path!r}{' closed' if self.closed else ''}>"


def normalise_adapters(adapters: Mapping[LoraAdapter, float] | None, model: Model) -> list[tuple[LoraAdapter, float]]:
    """Validate ``{adapter: scale}`` for ``model``: same model, open, finite scales."""
    from .model import Model

    expect("model", model, Model, "a llama_cffi.Model")
    if adapters is not None:
        expect_mapping("adapters", adapters, "a mapping {LoraAdapter: scale}, or None")
    out: list[tuple[LoraAdapter, float]] = []
    for adapter, scale in (adapters or {}).items():
        if not isinstance(adapter, LoraAdapter):
            raise AdapterError(f"expected LoraAdapter keys, got {type(adapter).__name__}")
        if adapter.model is not model:
            raise AdapterError(f"{adapter!r} was loaded for another model")
        adapter._ptr()  # ClosedError if closed
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not np.isfinite(scale):
            raise AdapterError(f"scale for {adapter!r} must be a finite number, not {scale!r}")
        out.append((adapter, float(scale)))
    return out
