"""Python enums over llama.h's enums; every value comes from the compiled library."""

from __future__ import annotations

import enum
from typing import TypeVar

from ._binding import lib

E = TypeVar("E", bound=enum.IntEnum)


def coerce(kind: type[E], value: object, param: str) -> E:
    """Accept a member, its int value or its (case-insensitive) name; else ParamError."""
    from ._args import type_error
    from .errors import ParamError

    if not (isinstance(kind, type) and issubclass(kind, enum.Enum)):
        raise type_error("kind", "an Enum class", kind)
    if not isinstance(param, str):
        raise type_error("param", "a str (the parameter the messages name)", param)

    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        key = value.strip().upper().replace("-", "_")
        if key in kind.__members__:
            return kind.__members__[key]
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            return kind(value)
        except ValueError:
            pass
    elif not isinstance(value, int):
        raise type_error(param, f"a {kind.__name__}, its name or its int value", value)
    names = ", ".join(m.lower() for m in kind.__members__)
    raise ParamError(f"{param}={value!r} is not a valid {kind.__name__}; use one of: {names}")


class VocabType(enum.IntEnum):
    NONE = lib.LLAMA_VOCAB_TYPE_NONE
    SPM = lib.LLAMA_VOCAB_TYPE_SPM
    BPE = lib.LLAMA_VOCAB_TYPE_BPE
    WPM = lib.LLAMA_VOCAB_TYPE_WPM
    UGM = lib.LLAMA_VOCAB_TYPE_UGM
    RWKV = lib.LLAMA_VOCAB_TYPE_RWKV
    PLAMO2 = lib.LLAMA_VOCAB_TYPE_PLAMO2
    TEST = lib.LLAMA_VOCAB_TYPE_TEST


class RopeType(enum.IntEnum):
    NONE = lib.LLAMA_ROPE_TYPE_NONE
    NORM = lib.LLAMA_ROPE_TYPE_NORM
    NEOX = lib.LLAMA_ROPE_TYPE_NEOX
    MROPE = lib.LLAMA_ROPE_TYPE_MROPE
    IMROPE = lib.LLAMA_ROPE_TYPE_IMROPE
    VISION = lib.LLAMA_ROPE_TYPE_VISION


class TokenAttr(enum.IntFlag):
    UNDEFINED = lib.LLAMA_TOKEN_ATTR_UNDEFINED
    UNKNOWN = lib.LLAMA_TOKEN_ATTR_UNKNOWN
    UNUSED = lib.LLAMA_TOKEN_ATTR_UNUSED
    NORMAL = lib.LLAMA_TOKEN_ATTR_NORMAL
    CONTROL = lib.LLAMA_TOKEN_ATTR_CONTROL
    USER_DEFINED = lib.LLAMA_TOKEN_ATTR_USER_DEFINED
    BYTE = lib.LLAMA_TOKEN_ATTR_BYTE
    NORMALIZED = lib.LLAMA_TOKEN_ATTR_NORMALIZED
    LSTRIP = lib.LLAMA_TOKEN_ATTR_LSTRIP
    RSTRIP = lib.LLAMA_TOKEN_ATTR_RSTRIP
    SINGLE_WORD = lib.LLAMA_TOKEN_ATTR_SINGLE_WORD


class SplitMode(enum.IntEnum):
    """How a model is split across several GPUs (``split_mode``)."""

    NONE = lib.LLAMA_SPLIT_MODE_NONE
    LAYER = lib.LLAMA_SPLIT_MODE_LAYER
    ROW = lib.LLAMA_SPLIT_MODE_ROW
    TENSOR = lib.LLAMA_SPLIT_MODE_TENSOR


class LoadMode(enum.IntEnum):
    """How the weights are read (``load_mode``): mmap, mlock, direct I/O, ..."""

    AUTO = lib.LLAMA_LOAD_MODE_AUTO
    NONE = lib.LLAMA_LOAD_MODE_NONE
    MMAP = lib.LLAMA_LOAD_MODE_MMAP
    MLOCK = lib.LLAMA_LOAD_MODE_MLOCK
    MMAP_MLOCK = lib.LLAMA_LOAD_MODE_MMAP_MLOCK
    DIRECT_IO = lib.LLAMA_LOAD_MODE_DIRECT_IO


class LazyMode(enum.IntEnum):
    """On-demand reading of tensors the architecture marks (``lazy_mode``)."""

    OFF = lib.LLAMA_LAZY_MODE_OFF
    AUTO = lib.LLAMA_LAZY_MODE_AUTO
    ON = lib.LLAMA_LAZY_MODE_ON


class FType(enum.IntEnum):
    """Model file type (quantization). ``str(FType.MOSTLY_Q4_K_M)`` is llama.cpp's name."""

    ALL_F32 = lib.LLAMA_FTYPE_ALL_F32
    MOSTLY_F16 = lib.LLAMA_FTYPE_MOSTLY_F16
    MOSTLY_Q4_0 = lib.LLAMA_FTYPE_MOSTLY_Q4_0
    MOSTLY_Q4_1 = lib.LLAMA_FTYPE_MOSTLY_Q4_1
    MOSTLY_Q8_0 = lib.LLAMA_FTYPE_MOSTLY_Q8_0
    MOSTLY_Q5_0 = lib.LLAMA_FTYPE_MOSTLY_Q5_0
    MOSTLY_Q5_1 = lib.LLAMA_FTYPE_MOSTLY_Q5_1
    MOSTLY_Q2_K = lib.LLAMA_FTYPE_MOSTLY_Q2_K
    MOSTLY_Q3_K_S = lib.LLAMA_FTYPE_MOSTLY_Q3_K_S
    MOSTLY_Q3_K_M = lib.LLAMA_FTYPE_MOSTLY_Q3_K_M
    MOSTLY_Q3_K_L = lib.LLAMA_FTYPE_MOSTLY_Q3_K_L
    MOSTLY_Q4_K_S = lib.LLAMA_FTYPE_MOSTLY_Q4_K_S
    MOSTLY_Q4_K_M = lib.LLAMA_FTYPE_MOSTLY_Q4_K_M
    MOSTLY_Q5_K_S = lib.LLAMA_FTYPE_MOSTLY_Q5_K_S
    MOSTLY_Q5_K_M = lib.LLAMA_FTYPE_MOSTLY_Q5_K_M
    MOSTLY_Q6_K = lib.LLAMA_FTYPE_MOSTLY_Q6_K
    MOSTLY_IQ2_XXS = lib.LLAMA_FTYPE_MOSTLY_IQ2_XXS
    MOSTLY_IQ2_XS = lib.LLAMA_FTYPE_MOSTLY_IQ2_XS
    MOSTLY_Q2_K_S = lib.LLAMA_FTYPE_MOSTLY_Q2_K_S
    MOSTLY_IQ3_XS = lib.LLAMA_FTYPE_MOSTLY_IQ3_XS
    MOSTLY_IQ3_XXS = lib.LLAMA_FTYPE_MOSTLY_IQ3_XXS
    MOSTLY_IQ1_S = lib.LLAMA_FTYPE_MOSTLY_IQ1_S
    MOSTLY_IQ4_NL = lib.LLAMA_FTYPE_MOSTLY_IQ4_NL
    MOSTLY_IQ3_S = lib.LLAMA_FTYPE_MOSTLY_IQ3_S
    MOSTLY_IQ3_M = lib.LLAMA_FTYPE_MOSTLY_IQ3_M
    MOSTLY_IQ2_S = lib.LLAMA_FTYPE_MOSTLY_IQ2_S
    MOSTLY_IQ2_M = lib.LLAMA_FTYPE_MOSTLY_IQ2_M
    MOSTLY_IQ4_XS = lib.LLAMA_FTYPE_MOSTLY_IQ4_XS
    MOSTLY_IQ1_M = lib.LLAMA_FTYPE_MOSTLY_IQ1_M
    MOSTLY_BF16 = lib.LLAMA_FTYPE_MOSTLY_BF16
    MOSTLY_TQ1_0 = lib.LLAMA_FTYPE_MOSTLY_TQ1_0
    MOSTLY_TQ2_0 = lib.LLAMA_FTYPE_MOSTLY_TQ2_0
    MOSTLY_MXFP4_MOE = lib.LLAMA_FTYPE_MOSTLY_MXFP4_MOE
    MOSTLY_NVFP4 = lib.LLAMA_FTYPE_MOSTLY_NVFP4
    MOSTLY_Q1_0 = lib.LLAMA_FTYPE_MOSTLY_Q1_0
    MOSTLY_Q2_0 = lib.LLAMA_FTYPE_MOSTLY_Q2_0
    GUESSED = lib.LLAMA_FTYPE_GUESSED

    def __str__(self) -> str:
        from ._binding import ffi

        return str(ffi.string(lib.llama_ftype_name(int(self))).decode())


class KvCacheType(enum.IntEnum):
    """ggml types the KV cache accepts (``type_k``/``type_v``). Quantized V needs flash attention."""

    F32 = lib.GGML_TYPE_F32
    F16 = lib.GGML_TYPE_F16
    BF16 = lib.GGML_TYPE_BF16
    Q8_0 = lib.GGML_TYPE_Q8_0
    Q4_0 = lib.GGML_TYPE_Q4_0
    Q4_1 = lib.GGML_TYPE_Q4_1
    IQ4_NL = lib.GGML_TYPE_IQ4_NL
    Q5_0 = lib.GGML_TYPE_Q5_0
    Q5_1 = lib.GGML_TYPE_Q5_1

    @property
    def is_quantized(self) -> bool:
        return bool(lib.ggml_is_quantized(int(self)))


class FlashAttention(enum.IntEnum):
    AUTO = lib.LLAMA_FLASH_ATTN_TYPE_AUTO
    DISABLED = lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ENABLED = lib.LLAMA_FLASH_ATTN_TYPE_ENABLED


class PoolingType(enum.IntEnum):
    """How embeddings are pooled per sequence (``pooling_type``)."""

    UNSPECIFIED = lib.LLAMA_POOLING_TYPE_UNSPECIFIED
    NONE = lib.LLAMA_POOLING_TYPE_NONE
    MEAN = lib.LLAMA_POOLING_TYPE_MEAN
    CLS = lib.LLAMA_POOLING_TYPE_CLS
    LAST = lib.LLAMA_POOLING_TYPE_LAST
    RANK = lib.LLAMA_POOLING_TYPE_RANK


class AttentionType(enum.IntEnum):
    UNSPECIFIED = lib.LLAMA_ATTENTION_TYPE_UNSPECIFIED
    CAUSAL = lib.LLAMA_ATTENTION_TYPE_CAUSAL
    NON_CAUSAL = lib.LLAMA_ATTENTION_TYPE_NON_CAUSAL


class RopeScalingType(enum.IntEnum):
    UNSPECIFIED = lib.LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED
    NONE = lib.LLAMA_ROPE_SCALING_TYPE_NONE
    LINEAR = lib.LLAMA_ROPE_SCALING_TYPE_LINEAR
    YARN = lib.LLAMA_ROPE_SCALING_TYPE_YARN
    LONGROPE = lib.LLAMA_ROPE_SCALING_TYPE_LONGROPE


class ContextType(enum.IntEnum):
    DEFAULT = lib.LLAMA_CONTEXT_TYPE_DEFAULT
    MTP = lib.LLAMA_CONTEXT_TYPE_MTP
