"""Build llama_cffi in place (``python build_ffi.py``'s path) from the carried, trimmed,
patched llama.cpp tree, and llama.cpp's own ``llama-bench`` / ``llama-batched-bench`` /
``llama-batched`` (examples/batched)
in the SAME CMake build tree (one configure, one ninja call: ggml-cuda is compiled once).

How it hooks into the project's recipe without changing it:

* the trimmed tree is unpacked where ``build_ffi.patched_source`` keeps its patched copy
  of the pinned sdist (``<cache>/src/llama.cpp-<commit>-pinned-patched-<digest>`` with its
  marker), and the pristine-extract marker is written, so ``llama_cpp_source()`` finds
  the pinned tree without downloading (``fetch_sdist`` is replaced by a stub that names
  the sdist) and no ``patch`` run is needed: the build is the normal pinned build;
* ``build_ffi._stream`` is wrapped: the configure command gets
  ``-DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON`` (the
  recorded options stay the project's), and the ``--target llama`` build also builds the tools; build/bin is
  copied to ``--native-bin`` before build_ffi stages the libraries and deletes the tree.
  If the tools fail to configure or build, the library alone is built (the project side
  still runs). If CMake cannot find cuBLAS or the driver library (a toolkit assembled
  from pip wheels), the configure is retried pointing at them.

Writes a JSON summary (timings, ninja log breakdown, what was built) to ``--json``.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import time
from pathlib import Path

TOOL_TARGETS = ["llama-bench", "llama-batched-bench", "llama-batched"]
#: the tools and llama.cpp's examples (llama-batched is examples/batched)
TOOLS_DEFS = ["-DLLAMA_BUILD_COMMON=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_EXAMPLES=ON"]

T0 = time.monotonic()
summary: dict = {"ok": False, "tools_built": False, "steps": {}}


def say(msg: str) -> None:
    print(f"[build +{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def ninja_breakdown(build_dir: Path, jobs: int) -> dict:
    """What the ninja log says: wall span, CPU seconds per part, when key outputs finished."""
    log = build_dir / ".ninja_log"
    if not log.is_file():
        return {}
    rows = []
    for line in log.read_text().splitlines():
        if line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) >= 4:
            rows.append((int(parts[0]), int(parts[1]), parts[3]))
    if not rows:
        return {}
    t0 = min(r[0] for r in rows)
    cats: dict[str, float] = {}
    for s, e, out in rows:
        if "ggml-cuda" in out:
            c = "ggml-cuda"
        elif "/common/" in out or out.startswith("common/") or "llama-common" in out or "vendor/" in out:
            c = "common+vendor"
        elif "tools/" in out:
            c = "tools"
        elif "ggml-cpu" in out:
            c = "ggml-cpu"
        elif out.startswith("src/") or ("/src/" in out and "ggml" not in out):
            c = "libllama"
        else:
            c = "other"
        cats[c] = cats.get(c, 0.0) + (e - s) / 1000
    ends = {}
    for _, e, out in rows:
        name = os.path.basename(out)
        if name.startswith(("libggml-cuda.so", "libllama.so", "libggml.so", "libllama-common")) or name in TOOL_TARGETS:
            ends[name] = round((e - t0) / 1000, 1)
    return {
        "wall_s": round((max(r[1] for r in rows) - t0) / 1000, 1),
        "cpu_s_by_part": {k: round(v, 1) for k, v in sorted(cats.items())},
        "finished_at_s": ends,
        "jobs": jobs,
        "n_edges": len(rows),
    }


def find_lib(patterns: list[str]) -> str | None:
    for pat in patterns:
        hits = sorted(glob.glob(pat))
        if hits:
            return hits[0]
    return None


def site_dirs() -> list[str]:
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    dirs += glob.glob("/opt/*/.venv/lib/python3*/site-packages") + glob.glob("/usr/local/lib/python3*/dist-packages")
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def cuda_fallback_defs(cache_text: str) -> list[str]:
    """-D arguments for what FindCUDAToolkit could not find (cuBLAS in pip wheels, the
    driver library only as libcuda.so.1)."""
    defs: list[str] = []
    if "CUDA_cublas_LIBRARY:FILEPATH=CUDA_cublas_LIBRARY-NOTFOUND" in cache_text:
        pats = []
        for d in site_dirs():
            pats += [f"{d}/nvidia/cu*/lib/libcublas.so*", f"{d}/nvidia/cublas/lib/libcublas.so*"]
        lib = find_lib(pats)
        if lib:
            libdir = os.path.dirname(lib)
            lt = find_lib([f"{libdir}/libcublasLt.so*"])
            inc = os.path.join(os.path.dirname(libdir), "include")
            defs += [f"-DCUDA_cublas_LIBRARY={lib}"]
            if lt:
                defs += [f"-DCUDA_cublasLt_LIBRARY={lt}"]
            if os.path.isfile(os.path.join(inc, "cublas_v2.h")):
                defs += [f"-DCMAKE_CUDA_FLAGS=-I{inc}"]
            say(f"cuBLAS not in the CUDA toolkit; using {lib} (headers {inc})")
        else:
            say("cuBLAS was found neither in the toolkit nor in any site-packages")
    if "CUDA_cuda_driver_LIBRARY:FILEPATH=CUDA_cuda_driver_LIBRARY-NOTFOUND" in cache_text:
        lib = None
        try:
            out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
            for line in out.splitlines():
                if "libcuda.so" in line and "=>" in line:
                    lib = line.split("=>")[1].strip()
                    break
        except OSError:
            pass
        lib = lib or find_lib(
            [
                "/usr/local/nvidia/lib64/libcuda.so*",
                "/usr/lib/x86_64-linux-gnu/libcuda.so*",
                "/usr/lib64/libcuda.so*",
                "/usr/local/cuda/lib64/stubs/libcuda.so",
                "/usr/local/cuda*/targets/x86_64-linux/lib/stubs/libcuda.so",
            ]
        )
        if lib:
            defs += [f"-DCUDA_cuda_driver_LIBRARY={lib}"]
            say(f"CUDA driver library not found by CMake; using {lib}")
        else:
            defs += ["-DGGML_CUDA_NO_VMM=ON"]
            say("no CUDA driver library found: building with GGML_CUDA_NO_VMM=ON (no direct libcuda link)")
    return defs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--proj", type=Path, required=True, help="the unpacked llama_cffi source tree")
    ap.add_argument("--src-tar", type=Path, required=True, help="the trimmed patched llama.cpp tree (.tar.gz)")
    ap.add_argument("--native-bin", type=Path, required=True, help="where build/bin (tools + libs) is copied")
    ap.add_argument("--tools", type=int, default=1)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()

    def dump() -> None:
        summary["total_s"] = round(time.monotonic() - T0, 1)
        args.json.write_text(json.dumps(summary, indent=1, default=str))

    sys.path.insert(0, str(args.proj))
    import build_ffi as B

    cache = B.cache_dir()
    patches = sorted(B.PATCHES_DIR.glob("*.patch"))
    digest = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in patches)).hexdigest()[:12]
    c12 = B.PINNED_COMMIT[:12]
    pristine = cache / "src" / f"llama.cpp-{c12}"
    patched = cache / "src" / f"llama.cpp-{c12}-pinned-patched-{digest}"
    t = time.monotonic()
    if not (patched / ".llama_cffi_patched").is_file():
        if patched.exists():
            shutil.rmtree(patched)
        tmp = cache / "src" / ".unpack"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        with tarfile.open(args.src_tar) as tf:
            tf.extractall(tmp, filter="data")
        (tmp / "llama.cpp").rename(patched)
        shutil.rmtree(tmp)
        (patched / ".llama_cffi_patched").write_text(digest + "\n")
    pristine.mkdir(parents=True, exist_ok=True)
    (pristine / ".llama_cffi_extracted").write_text(B.PINNED_COMMIT + "\n")
    summary["steps"]["unpack_source_s"] = round(time.monotonic() - t, 1)
    summary["source"] = {"commit": B.PINNED_COMMIT, "patches": [p.name for p in patches], "digest": digest}
    say(f"llama.cpp {c12} (patched, trimmed) at {patched}")
    sdist_name = Path(B.SDIST["name"])
    B.fetch_sdist = lambda: sdist_name  # the tree is in place: never download

    orig_stream = B._stream
    state: dict = {"tools_configured": False}
    jobs = int(os.environ.get("LLAMA_CFFI_JOBS") or os.cpu_count() or 2)

    def configure(cmd: list[str], logfile: Path, cwd, extra: list[str]) -> None:
        build_dir = Path(cmd[cmd.index("-B") + 1])
        try:
            orig_stream(cmd + extra, logfile, cwd)
            return
        except B.BuildError:
            cache_file = build_dir / "CMakeCache.txt"
            text = cache_file.read_text() if cache_file.is_file() else ""
            fix = cuda_fallback_defs(text) if "GGML_CUDA:BOOL=ON" in text or "-DGGML_CUDA=ON" in cmd else []
            if not fix:
                raise
            state["cuda_fallback_defs"] = fix
            say(f"configure failed; again with {fix}")
        orig_stream(cmd + extra + state["cuda_fallback_defs"], logfile, cwd)

    def stream(cmd: list[str], logfile: Path, cwd=None) -> None:
        cmd = list(cmd)
        if "-S" in cmd:  # configure
            t = time.monotonic()
            state["build_dir"] = Path(cmd[cmd.index("-B") + 1])
            if args.tools:
                try:
                    configure(cmd, logfile, cwd, TOOLS_DEFS)
                    state["tools_configured"] = True
                except B.BuildError as exc:
                    summary["tools_error"] = f"configure with tools failed: {str(exc)[-1500:]}"
                    say("configure with the tools FAILED; configuring the library alone (see tools_error)")
                    configure(cmd, logfile, cwd, [])
            else:
                configure(cmd, logfile, cwd, [])
            summary["steps"]["configure_s"] = round(time.monotonic() - t, 1)
            summary["cmake_configure"] = (
                cmd[:3]
                + ["..."]
                + [a for a in cmd if a.startswith("-D")]
                + (TOOLS_DEFS if state["tools_configured"] else [])
                + state.get("cuda_fallback_defs", [])
            )
            return
        if "--build" in cmd and "--target" in cmd:
            t = time.monotonic()
            build_dir = state.get("build_dir") or Path(cmd[cmd.index("--build") + 1])
            i = cmd.index("--target")
            if state["tools_configured"]:
                full = cmd[: i + 2] + TOOL_TARGETS + cmd[i + 2 :]
                try:
                    orig_stream(full, logfile, cwd)
                    summary["tools_built"] = True
                except B.BuildError as exc:
                    summary["tools_error"] = f"tools build failed: {str(exc)[-3000:]}"
                    say("building the tools FAILED; building the library alone (see tools_error)")
                    orig_stream(cmd, logfile, cwd)
            else:
                orig_stream(cmd, logfile, cwd)
            summary["steps"]["native_build_s"] = round(time.monotonic() - t, 1)
            summary["ninja"] = ninja_breakdown(build_dir, jobs)
            bin_dir = build_dir / "bin"
            if args.native_bin.exists():
                shutil.rmtree(args.native_bin)
            shutil.copytree(bin_dir, args.native_bin, symlinks=True)
            summary["native_bin"] = sorted(p.name for p in args.native_bin.iterdir())
            say(f"copied {bin_dir} -> {args.native_bin}: {', '.join(summary['native_bin'])}")
            dump()
            return
        orig_stream(cmd, logfile, cwd)

    B._stream = stream
    summary["options_env"] = {
        k: os.environ.get(k)
        for k in (
            "LLAMA_CFFI_CUDA",
            "LLAMA_CFFI_CUDA_ARCHS",
            "LLAMA_CFFI_CPU",
            "LLAMA_CFFI_JOBS",
            "CC",
            "CXX",
            "CUDAHOSTCXX",
        )
    }
    t = time.monotonic()
    try:
        rc = B.main([])  # python build_ffi.py: native build, cdef, extension in place, import check
    except Exception as exc:  # record and report
        summary["error"] = repr(exc)[-3000:]
        rc = 1
    summary["steps"]["build_ffi_main_s"] = round(time.monotonic() - t, 1)
    summary["ok"] = rc == 0
    if rc != 0 and "error" not in summary:
        summary["error"] = "build_ffi.main returned non-zero (see the log above)"
    if rc == 0:
        ext = sorted(glob.glob(str(args.proj / "llama_cffi" / "_llama*.so")))
        summary["extension"] = [os.path.basename(p) for p in ext]
    nb = cache / "native"
    logs = sorted(nb.glob("*/build.log"), key=lambda p: p.stat().st_mtime)
    if logs and rc != 0:
        print("--- last 60 lines of the native build log ---")
        print("".join(logs[-1].read_text().splitlines(keepends=True)[-60:]))
    dump()
    say(f"done: ok={summary['ok']} tools_built={summary['tools_built']} total {summary['total_s']} s")
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
