"""Build the native reference programs of the benchmarks against llama_cffi's own cached
llama.cpp build (same commit, same flags), so every comparison is like for like."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

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
    # the static libraries in link order and the system libraries, as the extension links
    # them (with the RPC or CUDA backends when the build has them)
    built = json.loads((prefix / "build.json").read_text())
    libs = [str(prefix / "lib" / f) for f in built["libs"]]
    cmd = [
        os.environ.get("CC", "cc"),
        "-O2",
        str(src),
        f"-I{prefix / 'include'}",
        *libs,
        *(f"-L{d}" for d in built.get("library_dirs", [])),
        *(f"-l{lib}" for lib in built["link"]),
        "-o",
        str(out),
    ]
    subprocess.run(cmd, check=True)
    return out


def _build_ffi() -> ModuleType:
    """The repository's ``build_ffi`` module (its source, cache and build helpers)."""
    mod = sys.modules.get("build_ffi")
    if mod is None:
        spec = importlib.util.spec_from_file_location("build_ffi", HERE.parent / "build_ffi.py")
        if spec is None or spec.loader is None:  # pragma: no cover
            raise ImportError(f"cannot load {HERE.parent / 'build_ffi.py'}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["build_ffi"] = mod  # dataclasses need the module registered while it executes
        spec.loader.exec_module(mod)
    return mod


def llama_cpp_source_dir() -> Path:
    """The llama.cpp tree llama_cffi was built from: the cached extract of the pinned sdist
    (extracted again if the cache was cleared), or the user's ``LLAMA_CPP_DIR`` checkout."""
    origin = str(llama_cffi.build_info()["origin"])
    kind, _, where = origin.partition(":")
    if kind == "dir":
        return Path(where)
    root: Path = _build_ffi()._extract_sdist(Path(where)).root  # a no-op once extracted
    return root


def _tools_dir(info: dict[str, Any]) -> tuple[Path, dict[str, str]]:
    """The tools' build root (keyed by commit and options) and their CMake options."""
    options = dict(info["options"], LLAMA_BUILD_COMMON="ON", LLAMA_BUILD_TOOLS="ON")
    key = hashlib.sha256(json.dumps({"commit": info["commit"], "options": options}, sort_keys=True).encode())
    return native_prefix().parent / f"tools-{str(info['commit'])[:12]}-{key.hexdigest()[:16]}", options


def build_llama_tool(target: str) -> Path:
    """Build one of llama.cpp's own programs (``llama-perplexity``, ...) from the source and
    with the CMake options llama_cffi was built with (``llama_cffi.build_info()``), plus
    ``LLAMA_BUILD_COMMON=ON`` and ``LLAMA_BUILD_TOOLS=ON``, and return the binary's path.

    The build directory is kept, under the native cache next to llama_cffi's own build,
    keyed by (commit, options): the first build takes minutes (it compiles llama.cpp
    again, with the tools), later calls return at once and other targets build
    incrementally. A file lock serialises concurrent callers; progress goes to stderr.
    """
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", target):
        raise ValueError(f"not a CMake target name: {target!r}")
    bf = _build_ffi()
    info = llama_cffi.build_info()
    commit = str(info["commit"])
    root, options = _tools_dir(info)
    build_dir = root / "build"
    binary = build_dir / "bin" / target
    done = root / f"{target}.built"  # written after a successful build: the binary is complete
    if done.is_file() and binary.is_file():
        return binary
    with bf._locked(root.parent / f"{root.name}.lock"):
        if done.is_file() and binary.is_file():
            return binary
        cmake = shutil.which("cmake")
        if not cmake:
            raise RuntimeError("cmake was not found on PATH")
        source = llama_cpp_source_dir()
        root.mkdir(parents=True, exist_ok=True)
        logfile = root / f"{target}.log"
        logfile.write_text("")
        t0 = time.monotonic()
        bf.log(f"building llama.cpp's {target} (same source and options as llama_cffi); log: {logfile}")
        if not (build_dir / "CMakeCache.txt").is_file():
            gen = ["-G", "Ninja"] if shutil.which("ninja") else []
            defs = [f"-D{k}={v}" for k, v in sorted(options.items())]
            defs += [f"-DLLAMA_BUILD_COMMIT={commit[:7]}", "-DLLAMA_BUILD_NUMBER=0"]
            bf._stream([cmake, "-S", str(source), "-B", str(build_dir), *gen, *defs], logfile)
        jobs = os.environ.get("LLAMA_CFFI_JOBS") or str(os.cpu_count() or 2)
        bf._stream([cmake, "--build", str(build_dir), "--target", target, "-j", jobs], logfile)
        if not binary.is_file():
            raise RuntimeError(f"the build did not produce {binary} (see {logfile})")
        seconds = time.monotonic() - t0
        done.write_text(json.dumps({"target": target, "seconds": round(seconds, 1)}) + "\n")
        bf.log(f"{target} built in {seconds:.0f} s")
    return binary


def llama_tool_build_seconds(target: str) -> float | None:
    """How long the cached build of ``target`` took (None if it was never built here)."""
    done = _tools_dir(llama_cffi.build_info())[0] / f"{target}.built"
    if not done.is_file():
        return None
    return float(json.loads(done.read_text())["seconds"])


def build_common_cpp_tool(name: str) -> Path:
    """Compile ``native/<name>.cpp`` against llama.cpp's ``common`` library (and llama and
    ggml) of the tools build (:func:`build_llama_tool`'s build directory), and return the
    binary's path.

    The ``llama-common`` CMake target is brought up to date first (incremental: a no-op
    when a tool such as ``llama-perplexity`` was built; the whole of llama.cpp the first
    time), then the program is compiled with ``c++ -O1 -std=c++17`` and cached, like
    :func:`build_c_tool`, under the native prefix keyed by its source and the commit.
    """
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"not a tool name: {name!r}")
    info = llama_cffi.build_info()
    src = HERE / "native" / f"{name}.cpp"
    key = hashlib.sha256(src.read_bytes() + str(info["commit"]).encode()).hexdigest()[:12]
    out = native_prefix() / "tools" / f"{name}-{key}"
    if out.is_file():
        return out
    bf = _build_ffi()
    root, options = _tools_dir(info)
    build_dir = root / "build"
    with bf._locked(root.parent / f"{root.name}.lock"):
        cmake = shutil.which("cmake")
        if not cmake:
            raise RuntimeError("cmake was not found on PATH")
        source = llama_cpp_source_dir()
        root.mkdir(parents=True, exist_ok=True)
        logfile = root / "llama-common.log"
        logfile.write_text("")
        if not (build_dir / "CMakeCache.txt").is_file():
            gen = ["-G", "Ninja"] if shutil.which("ninja") else []
            defs = [f"-D{k}={v}" for k, v in sorted(options.items())]
            defs += [f"-DLLAMA_BUILD_COMMIT={str(info['commit'])[:7]}", "-DLLAMA_BUILD_NUMBER=0"]
            bf._stream([cmake, "-S", str(source), "-B", str(build_dir), *gen, *defs], logfile)
        jobs = os.environ.get("LLAMA_CFFI_JOBS") or str(os.cpu_count() or 2)
        bf._stream([cmake, "--build", str(build_dir), "--target", "llama-common", "-j", jobs], logfile)
    libs = [
        build_dir / "common" / "libllama-common.a",
        build_dir / "common" / "libllama-common-base.a",
        build_dir / "src" / "libllama.a",
        build_dir / "ggml" / "src" / "libggml.a",
        build_dir / "ggml" / "src" / "libggml-cpu.a",
        build_dir / "ggml" / "src" / "ggml-rpc" / "libggml-rpc.a",  # with GGML_RPC (libggml registers it)
        build_dir / "ggml" / "src" / "libggml-base.a",
    ]
    incs = [source / "common", source / "include", source / "ggml" / "include", source / "vendor"]
    extra = ["-lgomp"] if options.get("GGML_OPENMP") == "ON" else []
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    cmd = [
        os.environ.get("CXX", "c++"),
        "-O1",
        "-std=c++17",
        str(src),
        *(f"-I{d}" for d in incs),
        *(str(lib) for lib in libs if lib.is_file()),
        "-lpthread",
        "-ldl",
        *extra,
        "-o",
        str(tmp),
    ]
    subprocess.run(cmd, check=True)
    tmp.replace(out)
    return out
