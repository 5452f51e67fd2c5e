"""Build the native reference programs of the benchmarks and tests from the same llama.cpp
commit as the installed llama_cffi, so every comparison is like for like.

Two kinds:

* our small C programs (``native/*.c``) link llama_cffi's *own* libraries (the package's
  ``_libs``) and load the CPU variant this process loaded: they differ from llama_cffi
  only by having no Python in the loop;
* llama.cpp's own tools (``llama-perplexity``, ``llama-bench``, ...) and programs over its
  ``common`` library are built by CMake from the pinned source, statically, with the
  instruction sets of the CPU variant llama_cffi loaded here (so their kernels are the
  ones llama_cffi runs) and its other options. Their build is cached under llama_cffi's
  build cache, keyed by (commit, options). The same options with ``BUILD_SHARED_LIBS=ON``
  give the shared libraries (:func:`llama_shared_lib_dir`) that the peer
  llama-cpp-python loads in the benchmarks, and C programs linked with them
  (:func:`build_shared_c_tool`).

Nothing here needs the package's build tree: an installed wheel is enough (the pinned
source comes from ``build_ffi``'s cache, downloaded once, or from ``LLAMA_CPP_DIR``).
"""

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
from llama_cffi import backends

HERE = Path(__file__).resolve().parent
SHLIB_SUFFIX = ".dylib" if sys.platform == "darwin" else ".so"

#: ggml's x86 instruction-set options (the list ggml_add_cpu_backend_variant switches).
X86_FEATURES = (
    "SSE42",
    "AVX",
    "AVX2",
    "BMI2",
    "AVX_VNNI",
    "FMA",
    "F16C",
    "AVX512",
    "AVX512_VBMI",
    "AVX512_VNNI",
    "AVX512_BF16",
    "AMX_TILE",
    "AMX_INT8",
    "AMX_BF16",
)


def _build_ffi() -> ModuleType:
    """The source tree's ``build_ffi`` module (its source, cache and build helpers)."""
    mod = sys.modules.get("build_ffi")
    if mod is None:
        spec = importlib.util.spec_from_file_location("build_ffi", HERE.parent / "build_ffi.py")
        if spec is None or spec.loader is None:  # pragma: no cover
            raise ImportError(f"cannot load {HERE.parent / 'build_ffi.py'}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["build_ffi"] = mod  # dataclasses need the module registered while it executes
        spec.loader.exec_module(mod)
    return mod


def tools_root() -> Path:
    """Where the reference programs are built and cached (llama_cffi's build cache)."""
    return Path(_build_ffi().cache_dir()) / "native"


def _libs_dir() -> Path:
    return Path(llama_cffi.__file__).resolve().parent / "_libs"


def build_c_tool(name: str) -> Path:
    """Compile ``native/<name>.c`` against the installed package's headers and libraries,
    loading the CPU variant this process loaded (cached by source, commit and paths)."""
    info = llama_cffi.build_info()
    src = HERE / "native" / f"{name}.c"
    cpu_lib = _libs_dir() / backends.choice().cpu.file
    key = hashlib.sha256(src.read_bytes() + info["commit"].encode() + str(cpu_lib).encode()).hexdigest()[:12]
    out = tools_root() / "tools-c" / f"{name}-{key}"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    libs = _libs_dir()
    linked = sorted(p.name for p in libs.glob("libllama_cffi_*"))
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    cmd = [
        os.environ.get("CC", "cc"),
        "-O2",
        str(src),
        f"-I{llama_cffi.get_include()}",
        f'-DLLAMA_CFFI_CPU_LIB="{cpu_lib}"',
        *(str(libs / f) for f in linked),
        f"-Wl,-rpath,{libs}",
        "-o",
        str(tmp),
    ]
    subprocess.run(cmd, check=True)
    tmp.replace(out)
    return out


def llama_cpp_source_dir(patched: bool = False) -> Path:
    """The pinned llama.cpp tree: ``LLAMA_CPP_DIR`` if set (a build from a user checkout
    needs it set again), else the pinned sdist's extract in the cache (downloaded and
    extracted again if the cache was cleared). ``patched``: with llama_cffi's patches
    applied (a cached copy); the reference tools use the stock tree unless they need one."""
    bf = _build_ffi()
    if llama_cffi.build_info()["origin"] == "dir" and not os.environ.get("LLAMA_CPP_DIR"):
        raise RuntimeError("llama_cffi was built from a LLAMA_CPP_DIR checkout: set LLAMA_CPP_DIR to it again")
    source = bf.llama_cpp_source()
    root: Path = (bf.patched_source(source) if patched else source).root
    return root


def tool_options(info: dict[str, Any] | None = None) -> dict[str, str]:
    """CMake options for llama.cpp's tools: llama_cffi's options, static, with the
    instruction sets of the CPU variant this process loaded, and the tools on."""
    info = info or llama_cffi.build_info()
    built: dict[str, str] = dict(info["options"])
    # libmtmd's options are left out: the tools build has every tool (llama-mtmd-cli
    # included, with mtmd's own defaults) and the shared build needs none of it; so the
    # cached tool builds did not change when llama_cffi started building libmtmd
    opts = {
        k: v
        for k, v in built.items()
        if k not in ("BUILD_SHARED_LIBS", "GGML_BACKEND_DL", "GGML_CPU_ALL_VARIANTS", "GGML_NATIVE")
        and k not in ("LLAMA_BUILD_MTMD", "MTMD_VIDEO")
        and not k.startswith(tuple(f"GGML_{f}" for f in X86_FEATURES))
    }
    opts.update(BUILD_SHARED_LIBS="OFF", GGML_BACKEND_DL="OFF", GGML_CPU_ALL_VARIANTS="OFF")
    opts.update(CMAKE_POSITION_INDEPENDENT_CODE="ON", LLAMA_BUILD_COMMON="ON", LLAMA_BUILD_TOOLS="ON")
    if built.get("GGML_CPU_ALL_VARIANTS") == "ON":
        feats = set(info["cpu_variant"]["features"])
        opts["GGML_NATIVE"] = "OFF"
        if feats <= set(X86_FEATURES):  # an x86 variant (other architectures: the baseline)
            for f in X86_FEATURES:
                opts[f"GGML_{f}"] = "ON" if f in feats else "OFF"
    else:  # a one-library build: its own instruction-set options
        opts["GGML_NATIVE"] = built.get("GGML_NATIVE", "OFF")
        opts.update({k: v for k, v in built.items() if k.startswith(tuple(f"GGML_{f}" for f in X86_FEATURES))})
    return opts


def _tools_dir(info: dict[str, Any], shared: bool = False) -> tuple[Path, dict[str, str]]:
    """The tools' build root (keyed by commit and options) and their CMake options;
    ``shared``: the shared-library build (:func:`llama_shared_lib_dir`), the same options
    with ``BUILD_SHARED_LIBS=ON``."""
    options = tool_options(info)
    if shared:
        options["BUILD_SHARED_LIBS"] = "ON"
    key = hashlib.sha256(json.dumps({"commit": info["commit"], "options": options}, sort_keys=True).encode())
    kind = "shared" if shared else "tools"
    return tools_root() / f"{kind}-{str(info['commit'])[:12]}-{key.hexdigest()[:16]}", options


def _configure(root: Path, build_dir: Path, options: dict[str, str], commit: str, logfile: Path) -> None:
    bf = _build_ffi()
    cmake = shutil.which("cmake")
    if not cmake:
        raise RuntimeError("cmake was not found on PATH")
    if (build_dir / "CMakeCache.txt").is_file():
        return
    # AMX kernels need our tile-configuration patch (see patches/): only then the patched tree
    source = llama_cpp_source_dir(patched=options.get("GGML_AMX_INT8") == "ON")
    root.mkdir(parents=True, exist_ok=True)
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    defs = [f"-D{k}={v}" for k, v in sorted(options.items())]
    defs += [f"-DLLAMA_BUILD_COMMIT={commit[:7]}", "-DLLAMA_BUILD_NUMBER=0"]
    bf._stream([cmake, "-S", str(source), "-B", str(build_dir), *gen, *defs], logfile)


def build_llama_tool(target: str) -> Path:
    """Build one of llama.cpp's own programs (``llama-perplexity``, ...) from the pinned
    source with :func:`tool_options` and return the binary's path.

    The build directory is kept, under llama_cffi's build cache, keyed by (commit,
    options): the first build takes minutes (it compiles llama.cpp again, with the
    tools), later calls return at once and other targets build incrementally. A file
    lock serialises concurrent callers; progress goes to stderr.
    """
    return _build_target(target, Path("bin") / target, shared=False)


def llama_shared_lib_dir() -> Path:
    """Build llama.cpp as shared libraries (``libllama.so``, ``libggml.so``,
    ``libggml-base.so``, ``libggml-cpu.so``, ...) from the pinned source with
    :func:`tool_options` but ``BUILD_SHARED_LIBS=ON`` (same instruction sets as the CPU
    variant llama_cffi loaded, the CPU backend linked in: ``GGML_BACKEND_DL=OFF``), and
    return the directory that holds them.

    This is what the peer ``llama-cpp-python`` loads in the benchmarks
    (``LLAMA_CPP_LIB_PATH``), so that it runs the same llama.cpp commit and kernels as
    llama_cffi and the native tools. Cached like :func:`build_llama_tool`, in its own
    build directory (keyed by commit and options)."""
    return _build_target("llama", Path("bin") / f"libllama{SHLIB_SUFFIX}", shared=True).parent


def _build_target(target: str, product: Path, shared: bool) -> Path:
    """Build CMake ``target`` in the tools build (or the shared-library build) and return
    ``build/<product>``, the file it makes (cached: see :func:`build_llama_tool`)."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", target):
        raise ValueError(f"not a CMake target name: {target!r}")
    bf = _build_ffi()
    info = llama_cffi.build_info()
    commit = str(info["commit"])
    root, options = _tools_dir(info, shared)
    build_dir = root / "build"
    binary = build_dir / product
    done = root / f"{target}.built"  # written after a successful build: the product is complete
    if done.is_file() and binary.is_file():
        return binary
    root.mkdir(parents=True, exist_ok=True)
    with bf._locked(root.parent / f"{root.name}.lock"):
        if done.is_file() and binary.is_file():
            return binary
        logfile = root / f"{target}.log"
        logfile.write_text("")
        t0 = time.monotonic()
        what = "shared libraries" if shared else target
        bf.log(f"building llama.cpp's {what} (same source and kernels as llama_cffi); log: {logfile}")
        _configure(root, build_dir, options, commit, logfile)
        jobs = os.environ.get("LLAMA_CFFI_JOBS") or str(os.cpu_count() or 2)
        bf._stream([str(shutil.which("cmake")), "--build", str(build_dir), "--target", target, "-j", jobs], logfile)
        if not binary.is_file():
            raise RuntimeError(f"the build did not produce {binary} (see {logfile})")
        seconds = time.monotonic() - t0
        done.write_text(json.dumps({"target": target, "seconds": round(seconds, 1)}) + "\n")
        bf.log(f"{what} built in {seconds:.0f} s")
    return binary


def llama_tool_build_seconds(target: str, shared: bool = False) -> float | None:
    """How long the cached build of ``target`` took (None if it was never built here);
    ``shared``: of the shared-library build (target ``llama``)."""
    done = _tools_dir(llama_cffi.build_info(), shared)[0] / f"{target}.built"
    if not done.is_file():
        return None
    return float(json.loads(done.read_text())["seconds"])


def build_shared_c_tool(name: str) -> Path:
    """Compile ``native/<name>.c`` against the shared libraries of
    :func:`llama_shared_lib_dir` (the very ``libllama.so`` the peer loads) and the pinned
    source's headers, and return the binary's path (cached by source and that build)."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"not a tool name: {name!r}")
    libdir = llama_shared_lib_dir()
    src = HERE / "native" / f"{name}.c"
    source = llama_cpp_source_dir()
    key = hashlib.sha256(src.read_bytes() + str(libdir).encode()).hexdigest()[:12]
    out = tools_root() / "tools-c" / f"{name}-shared-{key}"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    # ggml-cpu: the thread pool functions (ggml_threadpool_new) live in the CPU backend
    libs = [libdir / f"lib{lib}{SHLIB_SUFFIX}" for lib in ("llama", "ggml", "ggml-base")]
    cpu = libdir / f"libggml-cpu{SHLIB_SUFFIX}"
    libs += [cpu] if cpu.is_file() else []
    cmd = [
        os.environ.get("CC", "cc"),
        "-O3",  # vectorised loops over the logits (argmax), as numpy's
        str(src),
        f"-I{source / 'include'}",
        f"-I{source / 'ggml' / 'include'}",
        *(str(lib) for lib in libs),
        f"-Wl,-rpath,{libdir}",
        "-lm",
        "-o",
        str(tmp),
    ]
    subprocess.run(cmd, check=True)
    tmp.replace(out)
    return out


def build_common_cpp_tool(name: str) -> Path:
    """Compile ``native/<name>.cpp`` against llama.cpp's ``common`` library (and llama and
    ggml) of the tools build (:func:`build_llama_tool`'s build directory), and return the
    binary's path.

    The ``llama-common`` CMake target is brought up to date first (incremental: a no-op
    when a tool such as ``llama-perplexity`` was built; the whole of llama.cpp the first
    time), then the program is compiled with ``c++ -O1 -std=c++17`` and cached, like
    :func:`build_c_tool`, keyed by its source and the tools' build.
    """
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"not a tool name: {name!r}")
    return _build_against_common(name, [HERE / "native" / f"{name}.cpp"])


def build_llama_example(name: str) -> Path:
    """Compile one of llama.cpp's own example programs (``examples/<name>/*.cpp`` of the
    pinned source, e.g. ``embedding``, ``simple``) against the tools build's ``common``
    library, as :func:`build_common_cpp_tool` does (the tools build leaves examples out),
    and return the binary's path."""
    if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
        raise ValueError(f"not an example name: {name!r}")
    sources = sorted((llama_cpp_source_dir() / "examples" / name).glob("*.cpp"))
    if not sources:
        raise ValueError(f"llama.cpp has no example {name!r}")
    main = [p for p in sources if p.stem == name]
    if len(sources) > 1 and main:  # several programs (lookup: lookup-create, -merge, -stats): the namesake
        sources = main
    return _build_against_common(f"example-{name}", sources)


def _build_against_common(name: str, sources: list[Path]) -> Path:
    info = llama_cffi.build_info()
    root, options = _tools_dir(info)
    digest = b"".join(p.read_bytes() for p in sources)
    key = hashlib.sha256(digest + str(info["commit"]).encode() + root.name.encode()).hexdigest()[:12]
    out = tools_root() / "tools-c" / f"{name}-{key}"
    if out.is_file():
        return out
    bf = _build_ffi()
    build_dir = root / "build"
    root.mkdir(parents=True, exist_ok=True)
    with bf._locked(root.parent / f"{root.name}.lock"):
        logfile = root / "llama-common.log"
        logfile.write_text("")
        _configure(root, build_dir, options, str(info["commit"]), logfile)
        jobs = os.environ.get("LLAMA_CFFI_JOBS") or str(os.cpu_count() or 2)
        bf._stream(
            [str(shutil.which("cmake")), "--build", str(build_dir), "--target", "llama-common", "-j", jobs], logfile
        )
    source = llama_cpp_source_dir(patched=options.get("GGML_AMX_INT8") == "ON")
    libs = [
        build_dir / "common" / "libllama-common.a",
        build_dir / "common" / "libllama-common-base.a",
        build_dir / "src" / "libllama.a",
        build_dir / "ggml" / "src" / "libggml.a",
        build_dir / "ggml" / "src" / "libggml-cpu.a",
        build_dir / "ggml" / "src" / "ggml-rpc" / "libggml-rpc.a",  # with GGML_RPC (libggml registers it)
        build_dir / "ggml" / "src" / "libggml-base.a",
        build_dir / "vendor" / "cpp-httplib" / "libcpp-httplib.a",  # common's downloader (examples use it)
    ]
    incs = [source / "common", source / "include", source / "ggml" / "include", source / "vendor"]
    extra = ["-lgomp"] if options.get("GGML_OPENMP") == "ON" else []
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    cmd = [
        os.environ.get("CXX", "c++"),
        "-O1",
        "-std=c++17",
        *(str(src) for src in sources),
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
