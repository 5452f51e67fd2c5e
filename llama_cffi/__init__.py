"""llama_cffi: all of llama.h from Python through API-mode cffi.

The Pythonic layer: :class:`Model`, :class:`Context`, :class:`Batch`, errors. The raw
layer (every llama.h function, checked by the compiler against the pinned header) is
``llama_cffi.lib`` with ``llama_cffi.ffi``; objects expose their raw pointer as
``.underlying``.

.. py:data:: lib

   The compiled extension's functions: every function of the pinned ``llama.h`` (and the
   ggml, gguf and threadpool functions it needs), called with cffi's conventions. Nothing
   is checked: prefer the objects of this package, and read the header for each function.

.. py:data:: ffi

   The extension's ``cffi.FFI``: ``ffi.new``, ``ffi.string``, ``ffi.cast`` and every struct,
   enum and constant of ``llama.h``.

.. py:data:: LLAMA_CPP_COMMIT

   The llama.cpp commit this package is built from and binds (40 hex digits).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import backends
from ._binding import BUILD_INFO, ffi, lib
from ._version import LLAMA_CPP_COMMIT, __version__
from .batch import Batch
from .chat import TemplateLimitError, TemplateLimits, builtin_templates, set_template_limits
from .context import Context, Greedy
from .context_params import ContextParams, context_default_params
from .default_model import default_model_path
from .device import Device, DeviceType, devices
from .enums import (
    AttentionType,
    ContextType,
    FlashAttention,
    FType,
    KvCacheType,
    LazyMode,
    LoadMode,
    PoolingType,
    RopeScalingType,
    RopeType,
    SplitMode,
    TokenAttr,
    VocabType,
)
from .errors import (
    AdapterError,
    ChatTemplateError,
    ClosedError,
    ConcurrentUseError,
    ContextCreateError,
    DecodeAbortedError,
    DecodeError,
    DefaultModelNotInstalled,
    InvalidBatchError,
    InvalidMediaError,
    InvalidModelError,
    InvalidTokenError,
    KvCacheFullError,
    LlamaError,
    MediaNotFoundError,
    ModelLoadCancelled,
    ModelLoadError,
    ModelNotFoundError,
    ParamError,
    ParamTypeError,
    RpcError,
    StateError,
    TokenizeError,
    TokenTypeError,
    UnsupportedError,
)
from .log import set_verbosity
from .lora import LoraAdapter
from .memory import Memory
from .memory_usage import MemoryUsage
from .model import Model
from .model_params import ModelParams, model_default_params
from .outputs import OutputView, StaleOutputError
from .threadpool import Threadpool
from .vocab import StreamingDetokenizer, Vocab

__all__ = [
    "LLAMA_CPP_COMMIT",
    "AdapterError",
    "AttentionType",
    "Batch",
    "ChatTemplateError",
    "ClosedError",
    "ConcurrentUseError",
    "Context",
    "ContextCreateError",
    "ContextParams",
    "ContextType",
    "DecodeAbortedError",
    "DecodeError",
    "DefaultModelNotInstalled",
    "Device",
    "DeviceType",
    "FType",
    "FlashAttention",
    "Greedy",
    "InvalidBatchError",
    "InvalidMediaError",
    "InvalidModelError",
    "InvalidTokenError",
    "KvCacheFullError",
    "KvCacheType",
    "LazyMode",
    "LlamaError",
    "LoadMode",
    "LoraAdapter",
    "MediaNotFoundError",
    "Memory",
    "MemoryUsage",
    "Model",
    "ModelLoadCancelled",
    "ModelLoadError",
    "ModelNotFoundError",
    "ModelParams",
    "OutputView",
    "ParamError",
    "ParamTypeError",
    "PoolingType",
    "RopeScalingType",
    "RopeType",
    "RpcError",
    "SplitMode",
    "StaleOutputError",
    "StateError",
    "StreamingDetokenizer",
    "TemplateLimitError",
    "TemplateLimits",
    "Threadpool",
    "TokenAttr",
    "TokenTypeError",
    "TokenizeError",
    "UnsupportedError",
    "Vocab",
    "VocabType",
    "__version__",
    "backends",
    "build_info",
    "builtin_templates",
    "context_default_params",
    "default_model_path",
    "devices",
    "ffi",
    "get_include",
    "lib",
    "model_default_params",
    "set_template_limits",
    "set_verbosity",
    "supports_gpu_offload",
    "supports_mlock",
    "supports_mmap",
    "supports_rpc",
    "system_info",
]


def build_info() -> dict[str, Any]:
    """How the extension was built (llama.cpp commit, CMake options, source, patches,
    compiler, binding ABI, the CPU variants shipped, whether ``Context.memory_usage()``
    has its reader: ``"memory_reader"``) and, under ``"cpu_variant"``, which
    CPU backend library this process loaded and why (see :mod:`llama_cffi.backends`)."""
    return dict(BUILD_INFO, cpu_variant=backends.choice().as_dict())


def get_include() -> str:
    """The folder of the pinned ``llama.h`` and ggml headers this build was compiled
    against (shipped in the package), for C code that uses the same API."""
    return str(Path(__file__).resolve().parent / "include")


def system_info() -> str:
    """llama.cpp's ``llama_print_system_info()`` (instruction sets and backends in use)."""
    return str(ffi.string(lib.llama_print_system_info()).decode())


def supports_mmap() -> bool:
    """Whether this build can memory-map model files (``use_mmap``)."""
    return bool(lib.llama_supports_mmap())


def supports_mlock() -> bool:
    """Whether this platform can lock a model in RAM (``use_mlock``)."""
    return bool(lib.llama_supports_mlock())


def supports_gpu_offload() -> bool:
    """llama.cpp's ``llama_supports_gpu_offload``: whether a GPU **or RPC** backend is
    loaded, so ``n_gpu_layers`` can offload layers. The RPC backend, built in by default,
    makes this true on a CPU-only build; for a local GPU look at :func:`devices` (a
    device of type ``GPU``)."""
    return bool(lib.llama_supports_gpu_offload())


def supports_rpc() -> bool:
    """Whether this build has the RPC backend (see :mod:`llama_cffi.rpc`)."""
    from .rpc import supports_rpc as _supports

    return _supports()
