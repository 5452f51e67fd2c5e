"""What llama.cpp allocated for a context, in bytes: :meth:`Context.memory_usage`.

Every number is read from llama.cpp's own objects after the context is made, never
estimated from hyperparameters:

* :attr:`MemoryUsage.buffers`: llama.cpp's per-buffer-type breakdown (the table
  ``llama-cli`` and ``llama-perplexity`` print at exit): model weights, the context's
  memory (KV cache, recurrent state) and the compute buffers, per buffer type (``CPU``,
  ``CPU_Mapped`` for memory-mapped weights, ``CPU_REPACK``, ``CUDA0``, ``CUDA_Host``...).
* :attr:`MemoryUsage.caches`: each memory module's buffers, one row per module and
  buffer type: its cells and layers, and its tensors' bytes by role -- ``k`` and ``v``
  for an attention cache, ``r`` and ``s`` (and ``ple_r``) for a recurrent state -- with
  their ggml types. A Gemma 3 model has two attention caches (``kv`` for the full-attention
  layers, ``kv_swa`` for the sliding-window ones); a hybrid model has ``kv`` and
  ``recurrent``.
* :attr:`MemoryUsage.tensors`: the per-layer detail behind ``caches``.

``k_bytes``/``v_bytes`` of a cache equal the ``K (type): X MiB, V (type): Y MiB`` that
llama.cpp logs when it makes the cache, and ``allocated`` its ``KV buffer size`` line;
``tests/test_memory_usage.py`` checks both, for f16, q8_0 and q4_0 caches and every model
kind. The values are a snapshot: they do not change while the context lives (llama.cpp
allocates its memory when the context is made), except the compute buffers, which grow
when a decode needs a larger graph.

The reader (``llama_cffi/_native/memory.cpp``) reads llama.cpp's internal classes, which
change between commits. Built against a ``LLAMA_CPP_DIR`` it does not compile with, the
extension gets a stub instead (the build prints the compiler's error), and
:meth:`Context.memory_usage` raises :class:`~llama_cffi.errors.UnsupportedError`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._args import expect_str, type_error
from ._binding import ffi, lib
from .errors import LlamaError, UnsupportedError

__all__ = ["BufferUsage", "CacheBuffer", "CacheTensor", "MemoryUsage", "read_memory_usage"]

_MIB = 1024 * 1024


@dataclass(frozen=True)
class BufferUsage:
    """llama.cpp's bytes on one buffer type (one row of ``llama_get_memory_breakdown``)."""

    #: ggml's name for the buffer type: ``"CPU"``, ``"CPU_Mapped"``, ``"CUDA0"``...
    buffer_type: str
    #: the device the buffer type belongs to (``"CPU"``, ``"CUDA0"``), ``""`` if none
    device: str
    #: host memory (``ggml_backend_buft_is_host``): the CPU's buffers, mapped weights,
    #: a GPU backend's pinned host buffers
    host: bool
    #: bytes of model weights
    model: int
    #: bytes of the context's memory modules (KV cache, recurrent state)
    context: int
    #: bytes of the compute buffers (graph intermediates; they grow with the graph)
    compute: int

    @property
    def total(self) -> int:
        return self.model + self.context + self.compute


@dataclass(frozen=True)
class CacheTensor:
    """One tensor of a memory module: ``cache_k_l5`` is layer 5's K cache."""

    #: index of the memory module (``caches`` rows with the same index are one module)
    module: int
    #: ``"kv"``, ``"kv_swa"`` (sliding-window layers) or ``"recurrent"``
    kind: str
    buffer_type: str
    device: str
    host: bool
    #: llama.cpp's tensor name
    name: str
    #: ``"k"``, ``"v"``, ``"r"``, ``"s"``, ``"ple_r"``...: the name without ``cache_`` and ``_l<layer>``
    role: str
    #: the model layer, -1 if the name has none
    layer: int
    #: ggml type name (``"f16"``, ``"q8_0"``...)
    type: str
    bytes: int


@dataclass(frozen=True)
class CacheBuffer:
    """One memory module's allocation on one buffer type."""

    module: int
    #: ``"kv"``, ``"kv_swa"``, ``"recurrent"``, or ``"other"`` (a module whose tensors
    #: llama_cffi does not list: only ``allocated`` is known)
    kind: str
    buffer_type: str
    device: str
    host: bool
    #: the module's size in cells (KV cells, or recurrent state slots)
    cells: int
    #: bytes of the module's buffers of this type (its tensors plus alignment padding)
    allocated: int
    #: bytes of this module's tensors here, by role (``{"k": ..., "v": ...}``)
    bytes_by_role: Mapping[str, int] = field(default_factory=dict)
    #: ggml type of each role
    type_by_role: Mapping[str, str] = field(default_factory=dict)
    #: layers with tensors here, by role
    layers_by_role: Mapping[str, int] = field(default_factory=dict)

    @property
    def k_bytes(self) -> int:
        return self.bytes_by_role.get("k", 0)

    @property
    def v_bytes(self) -> int:
        return self.bytes_by_role.get("v", 0)

    @property
    def layers(self) -> int:
        """Layers with tensors in this buffer (the most of any role)."""
        return max(self.layers_by_role.values(), default=0)


@dataclass(frozen=True)
class MemoryUsage:
    """Bytes llama.cpp allocated for a context and its model; see the module docstring."""

    buffers: tuple[BufferUsage, ...]
    caches: tuple[CacheBuffer, ...]
    tensors: tuple[CacheTensor, ...]

    @property
    def model_bytes(self) -> int:
        return sum(b.model for b in self.buffers)

    @property
    def context_bytes(self) -> int:
        """The memory modules' buffers (KV cache and recurrent state), all devices."""
        return sum(b.context for b in self.buffers)

    @property
    def compute_bytes(self) -> int:
        return sum(b.compute for b in self.buffers)

    @property
    def total_bytes(self) -> int:
        return self.model_bytes + self.context_bytes + self.compute_bytes

    def role_bytes(self, role: str, device: str | None = None) -> int:
        """Bytes of every cache tensor of ``role`` (``"k"``, ``"v"``, ``"r"``, ``"s"``), on
        ``device`` only if given."""
        expect_str("role", role, 'a str ("k", "v", "r" or "s")')
        if device is not None:
            expect_str("device", device, "a str or None")
        return sum(c.bytes_by_role.get(role, 0) for c in self.caches if device is None or c.device == device)

    @property
    def k_bytes(self) -> int:
        """K cache bytes, every attention module and device."""
        return self.role_bytes("k")

    @property
    def v_bytes(self) -> int:
        """V cache bytes, every attention module and device."""
        return self.role_bytes("v")

    def by_device(self) -> dict[str, dict[str, int]]:
        """``{device: {"model", "context", "compute", "k", "v", ...}}``: bytes per device,
        grouped as llama.cpp's exit table groups them: every host buffer type under
        ``"Host"``, the others under their device (``"CUDA0"``), or their buffer type's
        name when they have none."""
        out: dict[str, dict[str, int]] = {}
        for b in self.buffers:
            d = out.setdefault(_group(b), {"model": 0, "context": 0, "compute": 0})
            d["model"] += b.model
            d["context"] += b.context
            d["compute"] += b.compute
        for c in self.caches:
            d = out.setdefault(_group(c), {"model": 0, "context": 0, "compute": 0})
            for role, n in c.bytes_by_role.items():
                d[role] = d.get(role, 0) + n
        return out

    def as_dict(self) -> dict[str, Any]:
        """Plain data (for JSON): totals, buffers and caches."""
        return {
            "model_bytes": self.model_bytes,
            "context_bytes": self.context_bytes,
            "compute_bytes": self.compute_bytes,
            "k_bytes": self.k_bytes,
            "v_bytes": self.v_bytes,
            "buffers": [vars(b) for b in self.buffers],
            "caches": [
                {
                    **{k: v for k, v in vars(c).items() if not k.endswith("_by_role")},
                    "bytes_by_role": dict(c.bytes_by_role),
                    "type_by_role": dict(c.type_by_role),
                    "layers_by_role": dict(c.layers_by_role),
                }
                for c in self.caches
            ],
        }

    def __str__(self) -> str:
        lines = [f"{'buffer type':<14} {'model':>10} {'context':>10} {'compute':>10}  (MiB)"]
        for b in self.buffers:
            mib = (f"{n / _MIB:10.2f}" for n in (b.model, b.context, b.compute))
            lines.append(f"{b.buffer_type:<14} " + " ".join(mib))
        for c in self.caches:
            roles = ", ".join(
                f"{r.upper()} ({c.type_by_role.get(r, '?')}): {n / _MIB:.2f} MiB" for r, n in c.bytes_by_role.items()
            )
            lines.append(
                f"{c.kind} on {c.buffer_type}: {c.allocated / _MIB:.2f} MiB ({c.cells} cells, {c.layers} layers)"
                + (f", {roles}" if roles else "")
            )
        return "\n".join(lines)


def _group(b: BufferUsage | CacheBuffer) -> str:
    return "Host" if b.host else (b.device or b.buffer_type)


_NAME = re.compile(r"^cache_(?P<role>.+?)(?:_l(?P<layer>\d+))?$")


def _rows(fn: Any, ctype: str, ptr: Any) -> Iterator[Any]:
    """The rows ``fn`` writes. A generator: its frame keeps the array alive while the
    caller reads the rows (an item of a cffi array does not keep the array alive)."""
    n = fn(ptr, ffi.NULL, 0)
    while True:
        if n < 0:
            why = ffi.string(lib.llama_cffi_memory_error()).decode(errors="replace")
            if n == lib.LLAMA_CFFI_MEMORY_UNAVAILABLE:
                raise UnsupportedError(f"memory_usage() is not available: {why}")
            raise LlamaError(f"llama.cpp could not report its memory: {why}")
        out = ffi.new(f"{ctype}[]", max(n, 1))
        m = fn(ptr, out, n)
        if m <= n:
            for i in range(m):
                yield out[i]
            return
        n = m


def _s(b: Any) -> str:
    return str(ffi.string(b).decode("utf-8", errors="replace"))


def _type_name(t: int) -> str:
    return str(ffi.string(lib.ggml_type_name(t)).decode())


def read_memory_usage(ctx_ptr: Any) -> MemoryUsage:
    """Internal: read a live ``llama_context *``'s usage (:meth:`Context.memory_usage`)."""
    if not isinstance(ctx_ptr, ffi.CData) or ffi.typeof(ctx_ptr) is not ffi.typeof("struct llama_context *"):
        raise type_error("ctx_ptr", "a llama_context * (use Context.memory_usage)", ctx_ptr)
    buffers = tuple(
        BufferUsage(_s(r.buffer_type), _s(r.device), bool(r.host), int(r.model), int(r.context), int(r.compute))
        for r in _rows(lib.llama_cffi_memory_buffers, "llama_cffi_buffer_row", ctx_ptr)
    )
    tensors: list[CacheTensor] = []
    caches: dict[tuple[int, str], dict[str, Any]] = {}
    for r in _rows(lib.llama_cffi_memory_tensors, "llama_cffi_tensor_row", ctx_ptr):
        key = (int(r.module), _s(r.buffer_type))
        c = caches.setdefault(
            key,
            {
                "module": key[0],
                "kind": _s(r.kind),
                "buffer_type": key[1],
                "device": _s(r.device),
                "host": bool(r.host),
                "cells": int(r.cells),
                "allocated": 0,
                "bytes": {},
                "types": {},
                "layers": {},
            },
        )
        name = _s(r.name)
        if not name:  # a buffer row
            c["allocated"] += int(r.bytes)
            continue
        m = _NAME.match(name)
        role = m.group("role") if m else name
        layer = int(m.group("layer")) if m and m.group("layer") is not None else -1
        t = CacheTensor(
            key[0], c["kind"], key[1], c["device"], c["host"], name, role, layer, _type_name(r.type), int(r.bytes)
        )
        tensors.append(t)
        c["bytes"][role] = c["bytes"].get(role, 0) + t.bytes
        c["types"].setdefault(role, t.type)
        c["layers"][role] = c["layers"].get(role, 0) + 1
    return MemoryUsage(
        buffers=buffers,
        caches=tuple(
            CacheBuffer(
                c["module"],
                c["kind"],
                c["buffer_type"],
                c["device"],
                c["host"],
                c["cells"],
                c["allocated"],
                c["bytes"],
                c["types"],
                c["layers"],
            )
            for c in caches.values()
        ),
        tensors=tuple(tensors),
    )
