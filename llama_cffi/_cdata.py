"""Reading C data into Python: strings from llama.h's buffer-filling functions, structs as dicts."""

from __future__ import annotations

from typing import Any

from ._binding import ffi


def read_str(fn: Any, *args: Any) -> str | None:
    """Call a llama.h ``f(..., char *buf, size_t size) -> length`` function (length < 0:
    failure -> None), sizing the buffer in two passes; decode UTF-8 with replacement."""
    buf = ffi.new("char[]", 256)
    n = fn(*args, buf, 256)
    if n < 0:
        return None
    if n >= 256:
        buf = ffi.new("char[]", n + 1)
        n = fn(*args, buf, n + 1)
    return ffi.unpack(buf, n).decode("utf-8", "replace")  # type: ignore[no-any-return]


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
