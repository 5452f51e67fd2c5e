"""``struct llama_context_params`` from keyword arguments, validated before C.

Every field of the pinned header's struct is accepted by its own name; defaults are
``llama_context_default_params()`` (see :func:`context_default_params`), except that
``n_threads``/``n_threads_batch`` are capped at the CPU cores this process may use
(llama.cpp's default of 4 oversubscribes small machines). Enum fields take the enums
of :mod:`llama_cffi.enums`, their names (``flash_attn_type="enabled"``) or values.

Fields that hold pointers take Python objects:

==================  =================================================================
``cb_eval``         ``f(tensor, ask: bool) -> bool`` (``tensor`` is a ``ggml_tensor *``)
``abort_callback``  ``f() -> bool``: polled during decode (see ``Context.set_abort_callback``)
``ctx_other``       another :class:`~llama_cffi.Context` (kept alive by this one)
==================  =================================================================

``samplers``/``n_samplers`` (llama.cpp's experimental on-device sampling) are refused
for now with a clear error; the ``*_user_data``/``*_data`` fields are managed here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from . import enums
from ._binding import ffi, lib
from ._cdata import struct_to_dict
from .errors import ParamError

if TYPE_CHECKING:
    from .context import Context

_ENUM_FIELDS: dict[str, type[IntEnum]] = {
    "ctx_type": enums.ContextType,
    "rope_scaling_type": enums.RopeScalingType,
    "pooling_type": enums.PoolingType,
    "attention_type": enums.AttentionType,
    "flash_attn_type": enums.FlashAttention,
    "type_k": enums.KvCacheType,
    "type_v": enums.KvCacheType,
}
_MANAGED = {"cb_eval_user_data", "abort_callback_data"}
_UNSUPPORTED = {"samplers": "on-device (backend) samplers are not supported yet", "n_samplers": "see samplers"}


def context_default_params() -> dict[str, Any]:
    """The defaults of ``llama_context_default_params()`` (pointers as None, enums as ints)."""
    return struct_to_dict(lib.llama_context_default_params(), "struct llama_context_params")


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


class _EvalState:
    __slots__ = ("callback", "error")

    def __init__(self, callback: Callable[[Any, bool], bool]) -> None:
        self.callback = callback
        self.error: BaseException | None = None


@ffi.def_extern()  # type: ignore[untyped-decorator]
def llama_cffi_eval_py(tensor: Any, ask: bool, user_data: Any) -> bool:
    state: _EvalState = ffi.from_handle(user_data)
    if state.error is not None:
        return False
    try:
        return bool(state.callback(tensor, bool(ask)))
    except BaseException as exc:  # stop asking; re-raised by the context after decode
        state.error = exc
        return False


class ContextParams:
    """A filled ``struct llama_context_params`` plus the Python objects it refers to.

    ``values`` is the requested configuration as a dict (field -> value).
    """

    def __init__(self, **kwargs: Any) -> None:
        c = lib.llama_context_default_params()
        self.c = c
        self._keep: list[Any] = []
        self.abort_callback: Callable[[], bool] | None = None
        self.eval_state: _EvalState | None = None
        self.ctx_other: Context | None = None
        fields = dict(ffi.typeof("struct llama_context_params").fields)
        cores = available_cores()
        #: n_threads or n_threads_batch given (a Context then keeps them fixed by default)
        self.threads_explicit = "n_threads" in kwargs or "n_threads_batch" in kwargs
        if "n_threads" not in kwargs:
            c.n_threads = min(int(c.n_threads), cores)
        if "n_threads_batch" not in kwargs:
            c.n_threads_batch = min(int(c.n_threads_batch), cores)
        if "no_perf" not in kwargs:  # llama.cpp's default is off: Context.perf() would read zero times
            c.no_perf = False
        for name, value in kwargs.items():
            if name in _MANAGED:
                raise ParamError(f"{name} is managed by llama_cffi; pass the callback itself")
            if name in _UNSUPPORTED:
                raise ParamError(f"{name}: {_UNSUPPORTED[name]}")
            special = getattr(self, f"_set_{name}", None)
            if special is not None:
                special(value)
                continue
            fld = fields.get(name)
            if fld is None:
                known = sorted(k for k in fields if k not in _MANAGED and k not in _UNSUPPORTED)
                raise TypeError(f"unknown context parameter {name!r}; known: {', '.join(known)}")
            self._set_plain(name, fld.type, value)
        self._validate()

    def _set_plain(self, name: str, t: Any, value: object) -> None:
        c = self.c
        if name in _ENUM_FIELDS:
            setattr(c, name, int(enums.coerce(_ENUM_FIELDS[name], value, name)))
        elif t.cname == "_Bool":
            if not isinstance(value, bool):
                raise ParamError(f"{name} must be True or False, not {value!r}")
            setattr(c, name, value)
        elif t.kind == "primitive" and t.cname in ("float", "double"):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ParamError(f"{name} must be a finite number, not {value!r}")
            setattr(c, name, float(value))
        elif t.kind in ("primitive", "enum"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ParamError(f"{name} must be an int, not {value!r}")
            if value < 0 and (t.cname.startswith("uint") or name.startswith("n_")):
                raise ParamError(f"{name}={value} must not be negative")
            try:
                setattr(c, name, value)
            except OverflowError:
                raise ParamError(f"{name}={value} is out of range for {t.cname}") from None
        else:  # pragma: no cover - every pointer field has a _set_ method or is refused
            raise ParamError(f"context parameter {name} cannot be set from Python")

    def _set_cb_eval(self, value: Callable[[Any, bool], bool] | None) -> None:
        if value is None:
            self.c.cb_eval = ffi.NULL
            self.c.cb_eval_user_data = ffi.NULL
            return
        if not callable(value):
            raise ParamError(f"cb_eval must be callable, not {type(value).__name__}")
        self.eval_state = _EvalState(value)
        handle = ffi.new_handle(self.eval_state)
        self._keep.append(handle)
        self.c.cb_eval = lib.llama_cffi_eval_py
        self.c.cb_eval_user_data = handle

    def _set_abort_callback(self, value: Callable[[], bool] | None) -> None:
        if value is not None and not callable(value):
            raise ParamError(f"abort_callback must be callable, not {type(value).__name__}")
        self.abort_callback = value  # installed by the Context (combined with its abort flag)

    def _set_ctx_other(self, value: Context | None) -> None:
        if value is None:
            self.c.ctx_other = ffi.NULL
            return
        from .context import Context

        if not isinstance(value, Context):
            raise ParamError(f"ctx_other must be a Context, not {type(value).__name__}")
        self.ctx_other = value
        self.c.ctx_other = value._ptr()

    def _validate(self) -> None:
        c = self.c
        if c.n_batch == 0:
            raise ParamError("n_batch must be >= 1 (llama.cpp aborts on a context with no batch rows)")
        max_seq = int(lib.llama_max_parallel_sequences())
        if not 1 <= c.n_seq_max <= max_seq:
            raise ParamError(f"n_seq_max={c.n_seq_max} must be in [1, llama_max_parallel_sequences()={max_seq}]")
        # llama.cpp reserves an output row per sequence and asserts (aborts) when that is more
        # than n_outputs_max, which defaults to the batch size
        cap = c.n_outputs_max if c.n_outputs_max else c.n_batch
        if cap and c.n_seq_max > cap:
            what = "n_outputs_max" if c.n_outputs_max else "n_batch"
            raise ParamError(f"n_seq_max={c.n_seq_max} exceeds {what}={cap}: each sequence needs an output row")
        for name in ("n_threads", "n_threads_batch"):
            if getattr(c, name) < 1:
                raise ParamError(f"{name}={getattr(c, name)} must be >= 1")
        if lib.ggml_is_quantized(c.type_v) and c.flash_attn_type == lib.LLAMA_FLASH_ATTN_TYPE_DISABLED:
            v = enums.KvCacheType(c.type_v).name
            raise ParamError(
                f"type_v={v} (a quantized V cache) needs flash attention: flash_attn_type must not be 'disabled'"
            )

    @property
    def values(self) -> dict[str, Any]:
        d = struct_to_dict(self.c, "struct llama_context_params")
        for k in ("cb_eval_user_data", "abort_callback_data", "samplers", "n_samplers"):
            d.pop(k, None)
        d["cb_eval"] = None if self.eval_state is None else self.eval_state.callback
        d["abort_callback"] = self.abort_callback
        d["ctx_other"] = self.ctx_other
        return d
