"""llama.cpp's log, routed into Python :mod:`logging` (logger ``"llama_cffi"``).

Quiet by default: nothing from llama.cpp reaches Python until you ask for it, and the
level filter runs in C, so a quiet logger costs nothing per message. Turn it up with
:func:`set_verbosity` or the standard way::

    import logging, llama_cffi
    llama_cffi.set_verbosity("info")          # or logging.INFO
    logging.getLogger("llama_cffi").setLevel(logging.DEBUG)   # also honoured

(the second form takes effect at the next model load or context creation, where the
package re-reads the logger's level).

Internally, :func:`capture` collects llama.cpp's messages around a call that can fail
(model loading) so the exception can carry llama.cpp's own reason.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ._binding import ffi, lib

logger = logging.getLogger("llama_cffi")

# ggml_log_level values (enum in ggml.h) -> logging levels
_GGML_TO_PY = {
    lib.GGML_LOG_LEVEL_DEBUG: logging.DEBUG,
    lib.GGML_LOG_LEVEL_INFO: logging.INFO,
    lib.GGML_LOG_LEVEL_WARN: logging.WARNING,
    lib.GGML_LOG_LEVEL_ERROR: logging.ERROR,
}
_QUIET = lib.GGML_LOG_LEVEL_CONT + 1  # above every real level: nothing passes

_lock = threading.Lock()
_user_level: int = logging.CRITICAL + 1  # python level the user asked for; quiet by default
_applied_logger_level: int = logging.NOTSET
_pending: list[str] = []  # a line llama.cpp has not finished yet
_captures: list[list[tuple[int, str]]] = []


def _ggml_threshold(py_level: int) -> int:
    for g, p in sorted(_GGML_TO_PY.items()):
        if p >= py_level:
            return int(g)
    return int(_QUIET)


def _apply_c_threshold() -> None:
    level = _user_level
    if _captures:
        level = min(level, logging.WARNING)
    lib.llama_cffi_log_min_level = _ggml_threshold(level)


def set_verbosity(level: int | str | None) -> None:
    """Forward llama.cpp messages at ``level`` and above to the ``llama_cffi`` logger.

    ``level`` is a :mod:`logging` level or one of ``"debug"``, ``"info"``,
    ``"warning"``, ``"error"``; ``None`` or ``"quiet"`` silences llama.cpp (the default).
    """
    global _user_level, _applied_logger_level
    if level is None or (isinstance(level, str) and level.lower() in ("quiet", "none", "off")):
        py = logging.CRITICAL + 1
    elif isinstance(level, str):
        named = logging.getLevelName(level.upper())
        if not isinstance(named, int):
            raise ValueError(f"set_verbosity: unknown level {level!r}; use debug, info, warning, error or quiet")
        py = named
    elif isinstance(level, int) and not isinstance(level, bool):
        py = level
    else:
        raise TypeError(f"set_verbosity: level must be an int, a level name or None, not {type(level).__name__}")
    with _lock:
        _user_level = py
        if py <= logging.CRITICAL:
            logger.setLevel(py)
        _applied_logger_level = logger.level
        _apply_c_threshold()


def sync() -> None:
    """Adopt a level set directly on the ``llama_cffi`` logger since the last call."""
    if logger.level != _applied_logger_level:
        set_verbosity(logger.level if logger.level != logging.NOTSET else None)


@contextmanager
def capture() -> Iterator[list[tuple[int, str]]]:
    """Collect llama.cpp messages of level WARNING and above while the block runs.

    Yields a list that fills with ``(logging_level, line)`` pairs. Messages are still
    forwarded to the logger only if they pass the user's level.
    """
    lines: list[tuple[int, str]] = []
    with _lock:
        _captures.append(lines)
        _apply_c_threshold()
    try:
        yield lines
    finally:
        with _lock:
            # by identity: two captures that saw the same lines are equal lists, and
            # list.remove would take the first of them (another thread's, or the outer
            # block's), leaving this one to collect and the other's remove to fail
            for i, cap in enumerate(_captures):
                if cap is lines:
                    del _captures[i]
                    break
            _apply_c_threshold()


def _emit(level: int, line: str) -> None:
    for cap in tuple(_captures):  # (a snapshot: another thread may open or close a capture)
        if level >= logging.WARNING:
            cap.append((level, line))
    if level >= _user_level:
        logger.log(level, "%s", line)


def _onerror(exc_type: object, exc_value: object, tb: object) -> None:
    # Never let a logging failure propagate into C (it would be printed and ignored).
    return None


@ffi.def_extern(onerror=_onerror)  # type: ignore[untyped-decorator]
def llama_cffi_log_py(level: int, text: object) -> None:
    msg = ffi.string(text).decode("utf-8", "replace")
    py_level = _GGML_TO_PY.get(level, logging.INFO)
    # llama.cpp sends lines in pieces (progress dots, CONT); emit whole lines.
    _pending.append(msg)
    if not msg.endswith("\n"):
        return
    whole = "".join(_pending)
    _pending.clear()
    for line in whole.splitlines():
        if line.strip():
            _emit(py_level, line)


def install() -> None:
    """Route llama.cpp's log through this module (called once, by ``_binding``)."""
    _apply_c_threshold()
    lib.llama_cffi_log_install()
