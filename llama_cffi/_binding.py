"""The raw layer: the compiled ``_llama`` module (``ffi``, ``lib``), checked and initialised.

This module owns four process-wide facts:

* the extension is the one this source tree expects (a build stamp compiled into it
  is compared with :mod:`llama_cffi._version`; a stale build raises ``ImportError``);
* llama.cpp's log goes to :mod:`llama_cffi.log` (installed here, first, so loading the
  backends logs nothing to stderr; silenced at exit so no C thread calls into a
  finalising interpreter);
* the package's backend libraries are loaded, the CPU variant chosen for this machine
  (:mod:`llama_cffi.backends`), before anything else can ask llama.cpp for a device;
* ``llama_backend_init`` has been called exactly once, right after (at import, under
  the import lock, so it is thread-safe).

Everything else in the package imports ``ffi`` and ``lib`` from here, never from
``_llama`` directly. The raw layer is private: its API is llama.h itself.
"""

from __future__ import annotations

import atexit
import json
from typing import Any

from ._version import BINDING_ABI, LLAMA_CPP_COMMIT

_REBUILD = (
    "Rebuild it from the source tree with `pip install .` (or `python build_ffi.py` for an in-place development build)."
)

try:
    from ._llama import ffi as _ffi
    from ._llama import lib as _lib
except ImportError as exc:  # pragma: no cover - exercised only on broken installs
    raise ImportError(
        f"llama_cffi's compiled extension llama_cffi._llama could not be imported ({exc}). " + _REBUILD
    ) from exc

#: The cffi ``FFI`` instance of the extension (types, ``new``, ``buffer``, ``string``...).
ffi: Any = _ffi
#: Every llama.h function, struct, enum and macro (and the listed ggml/gguf functions).
lib: Any = _lib

__all__ = ["BUILD_INFO", "ffi", "lib"]


def _read_build_info() -> dict[str, Any]:
    try:
        raw = ffi.string(lib.llama_cffi_build_info).decode()
        info: dict[str, Any] = json.loads(raw)
    except (AttributeError, ValueError) as exc:
        raise ImportError(f"llama_cffi._llama carries no readable build stamp ({exc}). " + _REBUILD) from exc
    if info.get("abi") != BINDING_ABI:
        raise ImportError(
            f"llama_cffi._llama is stale: it was built for binding ABI {info.get('abi')}, "
            f"this source needs ABI {BINDING_ABI}. " + _REBUILD
        )
    return info


BUILD_INFO: dict[str, Any] = _read_build_info()
if BUILD_INFO.get("commit") != LLAMA_CPP_COMMIT:
    # A user checkout (LLAMA_CPP_DIR) at another commit: allowed, but say so once.
    import logging

    logging.getLogger("llama_cffi").warning(
        "llama_cffi was built against llama.cpp %s, not the pinned %s",
        BUILD_INFO.get("commit"),
        LLAMA_CPP_COMMIT,
    )

from . import log as _log  # noqa: E402  (needs ffi/lib above)

_log.install()

# Loads the backend libraries and calls llama_backend_init (at the end of its own body,
# whichever of the two modules is imported first).
from . import backends as _backends  # noqa: E402, F401  (needs ffi/lib/BUILD_INFO above)


@atexit.register
def _silence_at_exit() -> None:
    # Worker threads may still log while the interpreter finalises; drop those in C.
    lib.llama_cffi_log_enabled = 0
