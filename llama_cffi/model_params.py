"""``struct llama_model_params`` from Python keyword arguments.

Every field of the pinned header's struct can be set by its own name; defaults are
whatever ``llama_model_default_params()`` returns (never repeated here). Fields that
take pointers accept Python values and the arrays are kept alive for the load call:

=========================  ==========================================================
``devices``                list of device names (see :func:`llama_cffi.devices`)
``tensor_buft_overrides``  list of ``(regex, buffer type or device name)`` pairs
``tensor_split``           list of floats, at most ``llama_max_devices()`` long
``kv_overrides``           dict of metadata key -> int | float | bool | str
``progress_callback``      ``f(progress: float) -> bool | None``; ``False`` cancels
``rpc_servers``            list of ``"host:port"`` RPC workers whose devices are added
                           to ``devices`` (see :mod:`llama_cffi.rpc`)
=========================  ==========================================================

Plus two conveniences that set ``load_mode``: ``use_mmap`` and ``use_mlock``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import enums
from ._binding import ffi, lib
from ._cdata import struct_to_dict
from .errors import ParamError

ProgressCallback = Callable[[float], "bool | None"]

_INT32 = (-(2**31), 2**31 - 1)


def model_default_params() -> dict[str, Any]:
    """The defaults of ``llama_model_default_params()`` as a dict (pointers as None)."""
    return struct_to_dict(lib.llama_model_default_params(), "struct llama_model_params")


class _Progress:
    """What the progress trampoline needs: the callable and what it raised."""

    __slots__ = ("callback", "cancelled", "error")

    def __init__(self, callback: ProgressCallback) -> None:
        self.callback = callback
        self.error: BaseException | None = None
        self.cancelled = False


@ffi.def_extern()  # type: ignore[untyped-decorator]
def llama_cffi_progress_py(progress: float, user_data: Any) -> bool:
    state: _Progress = ffi.from_handle(user_data)
    try:
        keep_going = state.callback(float(progress))
    except BaseException as exc:  # KeyboardInterrupt too: stop loading, re-raise after
        state.error = exc
        return False
    if keep_going is False:
        state.cancelled = True
        return False
    return True


def _check_int(name: str, value: object, lo: int = _INT32[0], hi: int = _INT32[1]) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ParamError(f"{name} must be an int, not {type(value).__name__} ({value!r})")
    if not lo <= value <= hi:
        raise ParamError(f"{name}={value} is out of range [{lo}, {hi}]")
    return value


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ParamError(f"{name} must be True or False, not {value!r}")
    return value


class ModelParams:
    """A filled ``struct llama_model_params`` plus the buffers its pointers refer to.

    Lifetime: the struct points into buffers owned by this object; keep it alive for
    as long as llama.cpp reads the params (the duration of the load call).
    """

    def __init__(self, **kwargs: Any) -> None:
        self.c = lib.llama_model_default_params()
        self.kv_overrides: dict[str, int | float | bool | str] = {}
        self._keep: list[Any] = []
        self.progress: _Progress | None = None
        self._rpc_devices: list[Any] = []
        self.rpc_endpoints: list[str] = []
        fields = dict(ffi.typeof("struct llama_model_params").fields)
        use_mmap = kwargs.pop("use_mmap", None)
        use_mlock = kwargs.pop("use_mlock", None)
        for name, value in kwargs.items():
            setter = getattr(self, f"_set_{name}", None)
            if setter is not None:
                setter(value)
            elif name in fields:
                self._set_plain(name, fields[name].type, value)
            else:
                known = sorted([*fields, "use_mmap", "use_mlock", "rpc_servers"])
                raise TypeError(f"unknown model parameter {name!r}; known: {', '.join(known)}")
        if self._rpc_devices:
            self._add_devices(self._rpc_devices)
        if use_mmap is not None or use_mlock is not None:
            if "load_mode" in kwargs:
                raise ParamError("give either load_mode or use_mmap/use_mlock, not both")
            mmap = _check_bool("use_mmap", use_mmap) if use_mmap is not None else True
            mlock = _check_bool("use_mlock", use_mlock) if use_mlock is not None else False
            mode = {
                (True, False): enums.LoadMode.MMAP,
                (True, True): enums.LoadMode.MMAP_MLOCK,
                (False, True): enums.LoadMode.MLOCK,
                (False, False): enums.LoadMode.NONE,
            }[(mmap, mlock)]
            self.c.load_mode = int(mode)

    # generic fields: bool / int / float / enum
    def _set_plain(self, name: str, ctype: Any, value: object) -> None:
        if ctype.kind == "enum":
            kind = {
                "enum llama_split_mode": enums.SplitMode,
                "enum llama_load_mode": enums.LoadMode,
                "enum llama_lazy_mode": enums.LazyMode,
            }.get(ctype.cname)
            if kind is not None:
                setattr(self.c, name, int(enums.coerce(kind, value, name)))
            else:
                setattr(self.c, name, _check_int(name, value))
        elif ctype.cname == "_Bool":
            setattr(self.c, name, _check_bool(name, value))
        elif ctype.kind == "primitive" and ctype.cname in ("float", "double"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ParamError(f"{name} must be a number, not {value!r}")
            setattr(self.c, name, float(value))
        elif ctype.kind == "primitive":
            setattr(self.c, name, _check_int(name, value))
        else:
            raise ParamError(f"model parameter {name} ({ctype.cname}) cannot be set from Python")

    def _set_progress_callback_user_data(self, value: object) -> None:
        raise ParamError("progress_callback_user_data is managed by llama_cffi; pass progress_callback only")

    def _set_progress_callback(self, value: ProgressCallback | None) -> None:
        if value is None:
            self.c.progress_callback = ffi.NULL
            self.c.progress_callback_user_data = ffi.NULL
            return
        if not callable(value):
            raise ParamError(f"progress_callback must be callable, not {type(value).__name__}")
        self.progress = _Progress(value)
        handle = ffi.new_handle(self.progress)
        self._keep.append(handle)
        self.c.progress_callback = lib.llama_cffi_progress_py
        self.c.progress_callback_user_data = handle

    def _set_devices(self, value: Sequence[str] | None) -> None:
        if value is None:
            self.c.devices = ffi.NULL
            return
        if isinstance(value, (str, bytes)):
            raise ParamError("devices must be a list of device names, not a single string")
        arr = ffi.new("ggml_backend_dev_t[]", len(value) + 1)
        for i, name in enumerate(value):
            dev = lib.ggml_backend_dev_by_name(str(name).encode())
            if dev == ffi.NULL:
                from .device import devices

                avail = ", ".join(d.name for d in devices())
                raise ParamError(f"devices[{i}]={name!r}: no such device; available: {avail}")
            arr[i] = dev
        arr[len(value)] = ffi.NULL
        self._keep.append(arr)
        self.c.devices = arr

    def _set_rpc_servers(self, value: Sequence[str] | None) -> None:
        if value is None:
            return
        from .rpc import add_servers

        found = add_servers(value)
        self._rpc_devices = [dev for _, dev in found]
        self.rpc_endpoints = sorted({d.endpoint for d, _ in found})

    def _add_devices(self, extra: list[Any]) -> None:
        """Append ``extra`` (``ggml_backend_dev_t``) to the NULL-terminated devices list."""
        current = []
        if self.c.devices != ffi.NULL:
            i = 0
            while self.c.devices[i] != ffi.NULL:
                current.append(self.c.devices[i])
                i += 1
        arr = ffi.new("ggml_backend_dev_t[]", [*current, *extra, ffi.NULL])
        self._keep.append(arr)
        self.c.devices = arr

    def _set_tensor_split(self, value: Sequence[float] | None) -> None:
        if value is None:
            self.c.tensor_split = ffi.NULL
            return
        n = int(lib.llama_max_devices())
        if len(value) > n:
            raise ParamError(f"tensor_split has {len(value)} entries; llama_max_devices() is {n}")
        arr = ffi.new("float[]", n)
        for i, v in enumerate(value):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ParamError(f"tensor_split[{i}]={v!r} must be a finite number >= 0")
            arr[i] = float(v)
        self._keep.append(arr)
        self.c.tensor_split = arr

    def _set_kv_overrides(self, value: Mapping[str, int | float | bool | str] | None) -> None:
        if value is None:
            self.c.kv_overrides = ffi.NULL
            return
        self.kv_overrides = dict(value)
        arr = ffi.new("struct llama_model_kv_override[]", len(value) + 1)
        for i, (key, v) in enumerate(value.items()):
            kb = str(key).encode()
            if not kb or len(kb) >= 128 or b"\0" in kb:
                raise ParamError(f"kv_overrides key {key!r} must be 1..127 bytes without NUL")
            item = arr[i]
            ffi.memmove(item.key, kb, len(kb))
            if isinstance(v, bool):
                item.tag = lib.LLAMA_KV_OVERRIDE_TYPE_BOOL
                item.val_bool = v
            elif isinstance(v, int):
                item.tag = lib.LLAMA_KV_OVERRIDE_TYPE_INT
                _check_int(f"kv_overrides[{key!r}]", v, -(2**63), 2**63 - 1)
                item.val_i64 = v
            elif isinstance(v, float):
                item.tag = lib.LLAMA_KV_OVERRIDE_TYPE_FLOAT
                item.val_f64 = v
            elif isinstance(v, str):
                vb = v.encode()
                if len(vb) >= 128 or b"\0" in vb:
                    raise ParamError(f"kv_overrides[{key!r}]: string values must be < 128 bytes without NUL")
                item.tag = lib.LLAMA_KV_OVERRIDE_TYPE_STR
                ffi.memmove(item.val_str, vb, len(vb))
            else:
                raise ParamError(f"kv_overrides[{key!r}]={v!r}: values must be int, float, bool or str")
        self._keep.append(arr)
        self.c.kv_overrides = arr

    def _set_tensor_buft_overrides(self, value: Sequence[tuple[str, str]] | None) -> None:
        if value is None:
            self.c.tensor_buft_overrides = ffi.NULL
            return
        arr = ffi.new("struct llama_model_tensor_buft_override[]", len(value) + 1)
        for i, pair in enumerate(value):
            try:
                pattern, target = pair
            except (TypeError, ValueError):
                raise ParamError(f"tensor_buft_overrides[{i}] must be a (pattern, buffer type) pair") from None
            try:
                re.compile(pattern)
            except (re.error, TypeError) as exc:
                raise ParamError(f"tensor_buft_overrides[{i}]: invalid pattern {pattern!r}: {exc}") from None
            buft = _buffer_type(str(target))
            if buft == ffi.NULL:
                raise ParamError(f"tensor_buft_overrides[{i}]: no buffer type or device named {target!r}")
            s = ffi.new("char[]", pattern.encode())
            self._keep.append(s)
            arr[i].pattern = s
            arr[i].buft = buft
        arr[len(value)].pattern = ffi.NULL
        self._keep.append(arr)
        self.c.tensor_buft_overrides = arr


def _buffer_type(name: str) -> Any:
    """A buffer type by its own name (``"CPU"``) or by the device that owns it."""
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        for buft in (lib.ggml_backend_dev_buffer_type(dev), lib.ggml_backend_dev_host_buffer_type(dev)):
            if buft != ffi.NULL and ffi.string(lib.ggml_backend_buft_name(buft)).decode() == name:
                return buft
        if ffi.string(lib.ggml_backend_dev_name(dev)).decode() == name:
            return lib.ggml_backend_dev_buffer_type(dev)
    return ffi.NULL
