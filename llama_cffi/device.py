"""The compute devices ggml registered in this build (CPU always; CUDA, RPC when built)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ._binding import ffi, lib


class DeviceType(enum.IntEnum):
    CPU = lib.GGML_BACKEND_DEVICE_TYPE_CPU
    GPU = lib.GGML_BACKEND_DEVICE_TYPE_GPU
    IGPU = lib.GGML_BACKEND_DEVICE_TYPE_IGPU
    ACCEL = lib.GGML_BACKEND_DEVICE_TYPE_ACCEL
    META = lib.GGML_BACKEND_DEVICE_TYPE_META


@dataclass(frozen=True)
class Device:
    """A snapshot of one device. ``memory_free``/``memory_total`` are in bytes."""

    name: str
    description: str
    type: DeviceType
    backend: str
    memory_free: int
    memory_total: int


def devices() -> list[Device]:
    """Every device of every registered backend, in ggml's order."""
    out = []
    free = ffi.new("size_t *")
    total = ffi.new("size_t *")
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        lib.ggml_backend_dev_memory(dev, free, total)
        reg = lib.ggml_backend_dev_backend_reg(dev)
        out.append(
            Device(
                name=ffi.string(lib.ggml_backend_dev_name(dev)).decode(),
                description=ffi.string(lib.ggml_backend_dev_description(dev)).decode(),
                type=DeviceType(lib.ggml_backend_dev_type(dev)),
                backend=ffi.string(lib.ggml_backend_reg_name(reg)).decode() if reg != ffi.NULL else "",
                memory_free=int(free[0]),
                memory_total=int(total[0]),
            )
        )
    return out
