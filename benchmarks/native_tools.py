"""Build the native reference programs of the benchmarks against llama_cffi's own cached
llama.cpp build (same commit, same flags), so every comparison is like for like."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import llama_cffi

HERE = Path(__file__).resolve().parent


def native_prefix() -> Path:
    return Path(llama_cffi.build_info()["native_prefix"])


def build_c_tool(name: str) -> Path:
    """Compile ``native/<name>.c`` against the cached static libraries (cached by source hash)."""
    info = llama_cffi.build_info()
    prefix = native_prefix()
    src = HERE / "native" / f"{name}.c"
    key = hashlib.sha256(src.read_bytes() + info["commit"].encode()).hexdigest()[:12]
    out = prefix / "tools" / f"{name}-{key}"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    libs = [str(prefix / "lib" / f) for f in ("libllama.a", "libggml.a", "libggml-cpu.a", "libggml-base.a")]
    extra = ["-lgomp"] if info["options"].get("GGML_OPENMP") == "ON" else []
    cmd = [
        os.environ.get("CC", "cc"),
        "-O2",
        str(src),
        f"-I{prefix / 'include'}",
        *libs,
        "-lstdc++",
        "-lm",
        "-lpthread",
        "-ldl",
        *extra,
        "-o",
        str(out),
    ]
    subprocess.run(cmd, check=True)
    return out
