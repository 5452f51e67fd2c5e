"""Checks of a model file before llama.cpp sees it: what would make llama.cpp abort.

llama.cpp reports most broken files as a failed load (NULL), but it checks a few things
with ``GGML_ASSERT``, which aborts the process: every token string of the vocabulary
must be distinct (``llama-vocab.cpp``; found by mutating tiny models), and some
hyper-parameters must be in range (``llama-model.cpp``, ``load_hparams``: the layer
count in ``[1, LLAMA_MAX_LAYERS]``, consistent expert counts). :func:`check_header`
reads the GGUF header (metadata only, no tensor data: ``gguf_init_from_file`` with
``no_alloc``) and applies the same rules, ``kv_overrides`` included, so such a file is
an :class:`InvalidModelError` instead. The token check runs in C inside the extension
(a sort of the strings). The whole check reads the header a second time: 0.13-0.16 s
for the default model (262,144 tokens), against 0.73 s for its full load.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ._args import expect_bool, expect_mapping, expect_path
from ._binding import ffi, lib
from .errors import InvalidModelError, ModelLoadError, ModelNotFoundError

__all__ = ["LLAMA_MAX_EXPERTS", "LLAMA_MAX_LAYERS", "check_header", "check_model_file"]

#: llama-hparams.h at the pinned commit.
LLAMA_MAX_LAYERS = 512
LLAMA_MAX_EXPERTS = 1024

_GGUF_MAGIC = b"GGUF"

_INT_GETTERS = {
    "GGUF_TYPE_UINT8": "gguf_get_val_u8",
    "GGUF_TYPE_INT8": "gguf_get_val_i8",
    "GGUF_TYPE_UINT16": "gguf_get_val_u16",
    "GGUF_TYPE_INT16": "gguf_get_val_i16",
    "GGUF_TYPE_UINT32": "gguf_get_val_u32",
    "GGUF_TYPE_INT32": "gguf_get_val_i32",
    "GGUF_TYPE_UINT64": "gguf_get_val_u64",
    "GGUF_TYPE_INT64": "gguf_get_val_i64",
    "GGUF_TYPE_BOOL": "gguf_get_val_bool",
}
_ARR_CTYPES = {
    "GGUF_TYPE_UINT8": "uint8_t *",
    "GGUF_TYPE_INT8": "int8_t *",
    "GGUF_TYPE_UINT16": "uint16_t *",
    "GGUF_TYPE_INT16": "int16_t *",
    "GGUF_TYPE_UINT32": "uint32_t *",
    "GGUF_TYPE_INT32": "int32_t *",
    "GGUF_TYPE_UINT64": "uint64_t *",
    "GGUF_TYPE_INT64": "int64_t *",
    "GGUF_TYPE_BOOL": "uint8_t *",
}


def check_model_file(path: str) -> None:
    """Reject what llama.cpp should never see: missing, directory, unreadable, not GGUF."""
    path = expect_path("path", path)
    if not os.path.exists(path):
        raise ModelNotFoundError(path, "no such file")
    if os.path.isdir(path):
        raise InvalidModelError(path, "is a directory, not a GGUF file")
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelLoadError(path, f"cannot be read: {exc.strerror or exc}") from exc
    if len(magic) < 4:
        raise InvalidModelError(path, f"file is {len(magic)} bytes long, too short for a GGUF header")
    if magic != _GGUF_MAGIC:
        raise InvalidModelError(path, f"not a GGUF file (starts with {magic!r}, expected {_GGUF_MAGIC!r})")


def _type_name(t: int) -> str:
    for name in (*_INT_GETTERS, "GGUF_TYPE_ARRAY", "GGUF_TYPE_STRING"):
        if int(getattr(lib, name)) == t:
            return name
    return "other"


def _read_int(g: object, key: str) -> int | list[int] | None:
    """An integer (or integer array) value of ``key``; None when absent or not integral."""
    i = lib.gguf_find_key(g, key.encode())
    if i < 0:
        return None
    t = _type_name(int(lib.gguf_get_kv_type(g, i)))
    if t in _INT_GETTERS:
        return int(getattr(lib, _INT_GETTERS[t])(g, i))
    if t == "GGUF_TYPE_ARRAY":
        at = _type_name(int(lib.gguf_get_arr_type(g, i)))
        if at not in _ARR_CTYPES:
            return None
        n = int(lib.gguf_get_arr_n(g, i))
        data = ffi.cast(_ARR_CTYPES[at], lib.gguf_get_arr_data(g, i))
        return [int(data[k]) for k in range(min(n, 4 * LLAMA_MAX_LAYERS))]
    return None


def _read_str(g: object, key: str) -> str | None:
    i = lib.gguf_find_key(g, key.encode())
    if i < 0 or _type_name(int(lib.gguf_get_kv_type(g, i))) != "GGUF_TYPE_STRING":
        return None
    return str(ffi.string(lib.gguf_get_val_str(g, i)).decode("utf-8", "replace"))


def check_header(path: str, kv_overrides: Mapping[str, object] | None = None, vocab_only: bool = False) -> None:
    """Raise :class:`InvalidModelError` for a header llama.cpp would abort on: a token
    string that repeats (its vocabulary loader asserts every string maps to one id) or
    hyper-parameters out of its asserted ranges (not read with ``vocab_only``). A header
    that ggml cannot parse is left to llama.cpp (it fails cleanly on it)."""
    path = expect_path("path", path)
    if kv_overrides is not None:
        expect_mapping("kv_overrides", kv_overrides, "a mapping of metadata keys to values, or None")
    vocab_only = expect_bool("vocab_only", vocab_only)
    params = ffi.new("struct gguf_init_params *")
    params.no_alloc = True
    params.ctx = ffi.NULL
    g = lib.gguf_init_from_file(path.encode(), params[0])
    if g == ffi.NULL:
        return
    try:
        _check_tokens(path, g)
        if not vocab_only:
            _check_hparams(path, g, kv_overrides)
    finally:
        lib.gguf_free(g)


def _check_tokens(path: str, g: object) -> None:
    k = lib.gguf_find_key(g, b"tokenizer.ggml.tokens")
    if k < 0 or _type_name(int(lib.gguf_get_kv_type(g, k))) != "GGUF_TYPE_ARRAY":
        return
    if _type_name(int(lib.gguf_get_arr_type(g, k))) != "GGUF_TYPE_STRING":
        return  # llama.cpp refuses the type cleanly
    dup = int(lib.llama_cffi_gguf_duplicate_string(g, k))
    if dup == -2:
        raise MemoryError("out of memory checking the vocabulary")
    if dup >= 0:
        raw = ffi.string(lib.gguf_get_arr_str(g, k, dup)).decode("utf-8", "replace") or f"[EMPTY_{dup}]"
        raise InvalidModelError(
            path, f"tokenizer.ggml.tokens[{dup}] = {raw!r} repeats an earlier token (llama.cpp would abort the process)"
        )


def _check_hparams(path: str, g: object, kv_overrides: Mapping[str, object] | None) -> None:
    arch = _read_str(g, "general.architecture")
    if arch is None or arch == "clip":
        return
    over = dict(kv_overrides or {})

    def get(name: str) -> int | list[int] | None:
        key = f"{arch}.{name}"
        if key in over:
            v = over[key]
            return int(v) if isinstance(v, (int, bool)) else None
        return _read_int(g, key)

    def scalar(name: str, default: int = 0) -> int:
        v = get(name)
        if isinstance(v, list):
            return max(v, default=default)
        return default if v is None else v

    problems: list[str] = []
    n_layer = get("block_count")
    if isinstance(n_layer, int) and not 0 < n_layer <= LLAMA_MAX_LAYERS:
        problems.append(f"{arch}.block_count={n_layer} is outside [1, {LLAMA_MAX_LAYERS}]")
    if isinstance(n_layer, int):
        nextn = scalar("nextn_predict_layers")
        if nextn > n_layer:
            problems.append(f"{arch}.nextn_predict_layers={nextn} exceeds block_count={n_layer}")
    used_max = scalar("expert_used_count")
    n_expert = scalar("expert_count")
    groups = scalar("expert_group_count")
    group_used = scalar("expert_group_used_count")
    if arch in ("hunyuan-vl", "hunyuan-dense") and n_expert <= 1:
        n_expert, used_max = 0, 0
    if not 0 <= n_expert <= LLAMA_MAX_EXPERTS:
        problems.append(f"{arch}.expert_count={n_expert} is outside [0, {LLAMA_MAX_EXPERTS}]")
    elif used_max > n_expert or used_max < 0:
        problems.append(f"{arch}.expert_used_count={used_max} exceeds expert_count={n_expert}")
    elif n_expert > 0:
        if used_max == 0:
            problems.append(f"{arch}.expert_used_count must be > 0 with {n_expert} experts")
        if not 0 <= groups < n_expert:
            problems.append(f"{arch}.expert_group_count={groups} must be below expert_count={n_expert}")
        elif groups > 1 and (n_expert % groups or not 0 < group_used < groups):
            problems.append(
                f"{arch}: expert_group_count={groups}, expert_group_used_count={group_used} and "
                f"expert_count={n_expert} are inconsistent"
            )
    elif groups != 0:
        problems.append(f"{arch}.expert_group_count={groups} without experts")
    swa = _swa_problem(arch, get("attention.sliding_window"), get("attention.sliding_window_pattern"), n_layer)
    if swa:
        problems.append(swa)
    if problems:
        raise InvalidModelError(path, "; ".join(problems) + " (llama.cpp would abort the process)")


def _swa_problem(arch: str, window: object, pattern: object, n_layer: object) -> str | None:
    """A sliding-window pattern that makes no layer sliding-window on a model with a
    window: llama.cpp then GGML_ASSERTs ``is_swa_any()`` when a context is created. The
    pattern is an int ``p`` (layer ``il`` slides when ``p == 0`` or ``il % p < p - 1``;
    some architectures count dense layers first, which matters only for one-layer models) or a bool
    per layer. Only a pattern present in the file decides; a window explicitly 0 turns
    sliding-window attention off altogether."""
    if pattern is None or window == 0 or not isinstance(n_layer, int) or n_layer <= 0:
        return None
    if isinstance(pattern, list):
        sliding = any(pattern[:n_layer])
    elif isinstance(pattern, int):
        sliding = pattern == 0 or any(il % pattern < pattern - 1 for il in range(n_layer))
    else:
        return None
    if sliding:
        return None
    return (
        f"{arch}.attention.sliding_window_pattern={pattern!r} makes none of the {n_layer} layers "
        "sliding-window, but the model has a sliding window"
    )
