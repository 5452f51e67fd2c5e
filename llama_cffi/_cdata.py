"""Reading C data into Python: strings from llama.h's buffer-filling functions, structs as dicts."""

from __future__ import annotations

from typing import Any

from ._binding import ffi


def read_str(fn: Any, *args: Any) -> str | None:
    """Call a llama.h ``f(..., char *buf, size_t size) -> length`` function (length < 0:
    failure -> None), sizing the buffer in two passes; decode UTF-8 with replacement."""
    got = read_str_bounded(fn, *args, limit=None)
    return None if got is None else got[0]


def read_str_bounded(fn: Any, *args: Any, limit: int | None) -> tuple[str, bool] | None:
    """:func:`read_str` reading at most ``limit`` bytes (None: all): ``(text, truncated)``.
    A value cut inside a UTF-8 character ends in U+FFFD."""
    buf = ffi.new("char[]", 256)
    n = fn(*args, buf, 256)
    if n < 0:
        return None
    truncated = False
    if limit is not None and n > limit:
        n, truncated = limit, True
    if n >= 256:
        buf = ffi.new("char[]", n + 1)
        fn(*args, buf, n + 1)
    return ffi.unpack(buf, n).decode("utf-8", "replace"), truncated


class Metadata(dict[str, str]):
    """GGUF metadata as strings, read with bounds (a model file is untrusted input).

    ``truncated``: the keys whose values were cut to the byte limit they were read with.
    ``complete``: False when the file has more keys than were read (see ``n_keys``)."""

    truncated: frozenset[str]
    complete: bool
    n_keys: int

    def __init__(self, items: dict[str, str], truncated: frozenset[str], n_keys: int) -> None:
        super().__init__(items)
        self.truncated = truncated
        self.n_keys = n_keys
        self.complete = len(items) >= n_keys

    def copy(self) -> Metadata:
        return Metadata(dict(self), self.truncated, self.n_keys)


#: Bounds for reading metadata (keys read; bytes per key and per value): a real model has
#: tens of keys and values of a few KiB (chat templates up to ~100 KiB). llama.cpp finds
#: the key of index ``i`` by walking its map from the start, so reading ``n`` keys costs
#: ``n**2 / 2`` steps (~40 ns each): 1,024 keys ~20 ms, 65,536 keys ~85 s.
METADATA_MAX_KEYS = 1 << 10
METADATA_MAX_KEY_BYTES = 1 << 10
METADATA_MAX_VALUE_BYTES = 1 << 20


def read_metadata(
    count: Any,
    key_by_index: Any,
    val_by_index: Any,
    ptr: Any,
    max_keys: int | None = None,
    max_value_bytes: int | None = None,
) -> Metadata:
    """Metadata through llama.h's ``*_meta_count`` / ``*_meta_key_by_index`` /
    ``*_meta_val_str_by_index`` functions, at most ``max_keys`` keys (default
    :data:`METADATA_MAX_KEYS`) and ``max_value_bytes`` bytes per value (default
    :data:`METADATA_MAX_VALUE_BYTES`; keys: :data:`METADATA_MAX_KEY_BYTES`)."""
    max_keys = METADATA_MAX_KEYS if max_keys is None else max_keys
    max_value_bytes = METADATA_MAX_VALUE_BYTES if max_value_bytes is None else max_value_bytes
    if max_keys < 0 or max_value_bytes < 0:
        raise ValueError("max_keys and max_value_bytes must be >= 0")
    n = int(count(ptr))
    out: dict[str, str] = {}
    cut: set[str] = set()
    for i in range(min(n, max_keys)):
        k = read_str_bounded(key_by_index, ptr, i, limit=METADATA_MAX_KEY_BYTES)
        v = read_str_bounded(val_by_index, ptr, i, limit=max_value_bytes)
        if k is None or v is None:
            continue
        out[k[0]] = v[0]
        if k[1] or v[1]:
            cut.add(k[0])
    return Metadata(out, frozenset(cut), n)


def struct_to_dict(value: Any, ctype: str) -> dict[str, Any]:
    """A struct's fields as a dict: NULL pointers as None, enums as ints."""
    out: dict[str, Any] = {}
    for name, fld in ffi.typeof(ctype).fields:
        v = getattr(value, name)
        if fld.type.kind in ("pointer", "function"):
            out[name] = None if v == ffi.NULL else v
        elif fld.type.kind == "enum":
            out[name] = int(v)
        else:
            out[name] = v
    return out
