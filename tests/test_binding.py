"""The raw layer: generated binding completeness, build stamp, build options."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

import llama_cffi
from llama_cffi import ffi, lib
from tests.conftest import ROOT, load_build_ffi, run_isolated

# Functions llama.h declares that are deliberately not exposed. Deprecated aliases are
# still defined by the library at the pinned commit, so none needs excluding: the list
# is empty, and the test below proves it.
EXCLUDED: set[str] = set()


def pinned_llama_h() -> Path:
    """The llama.h the extension was compiled against (shipped in the package)."""
    return Path(llama_cffi.get_include()) / "llama.h"


def declared_functions(header: str) -> set[str]:
    """Every function declared with LLAMA_API, found independently of build_ffi's parser."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", "", header, flags=re.S)
    text = re.sub(r"^\s*#.*$", "", text, flags=re.M)  # macros (#define LLAMA_API ...)
    names = set()
    for m in re.finditer(r"LLAMA_API\b(.*?);", text, flags=re.S):
        decl = m.group(1)
        call = re.search(r"(\w+)\s*\(", decl)
        if call and call.group(1) not in ("DEPRECATED",):
            names.add(call.group(1))
    return names


def test_every_llama_api_function_is_reachable() -> None:
    """Every LLAMA_API function of the pinned llama.h is an attribute of lib."""
    names = declared_functions(pinned_llama_h().read_text())
    assert len(names) > 200  # the parse found the header's API, not a fragment
    missing = sorted(n for n in names - EXCLUDED if not hasattr(lib, n))
    assert missing == []


def _c_part(header: str) -> str:
    """The header without its C++-only blocks (``#ifdef __cplusplus`` ... ``#endif`` whose
    body is not the ``extern "C" {`` line or its closing brace)."""
    out, skip = [], 0
    lines = header.splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if skip:
            skip += stripped.startswith("#if")
            skip -= stripped.startswith("#endif")
            continue
        body = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if stripped == "#ifdef __cplusplus" and not body.startswith(("extern", "}")):
            skip = 1
            continue
        out.append(line)
    return "\n".join(out)


def test_every_mtmd_function_is_reachable() -> None:
    """CI builds libmtmd (on unless LLAMA_CFFI_MTMD=0), and every C function of the pinned
    mtmd.h and mtmd-helper.h is an attribute of lib but the video helpers that abort in a
    build without video (build_ffi.EXCLUDED_FUNCTIONS); the C++-only declarations are not
    C functions."""
    build_ffi = load_build_ffi()
    assert llama_cffi.build_info()["options"]["LLAMA_BUILD_MTMD"] == "ON"
    include = Path(llama_cffi.get_include())
    counts = {}
    for header in ("mtmd.h", "mtmd-helper.h"):
        names = declared_functions(_c_part((include / header).read_text()).replace("MTMD_API", "LLAMA_API"))
        counts[header] = len(names)
        missing = sorted(n for n in names - build_ffi.EXCLUDED_FUNCTIONS if not hasattr(lib, n))
        assert missing == [], header
    assert counts == {"mtmd.h": 59, "mtmd-helper.h": 25}  # the pinned headers' C API, all of it
    for name in build_ffi.EXCLUDED_FUNCTIONS:
        assert not hasattr(lib, name), name


def test_exclusions_are_real_functions() -> None:
    """The exclusion list names only functions the header declares."""
    assert EXCLUDED <= declared_functions(pinned_llama_h().read_text())


def test_header_constants_are_compiled_in() -> None:
    """llama.h's integer macros carry the compiler's values."""
    assert lib.LLAMA_TOKEN_NULL == -1
    assert lib.LLAMA_DEFAULT_SEED == 0xFFFFFFFF
    assert lib.LLAMA_SESSION_MAGIC == 0x6767736E
    assert lib.LLAMA_STATE_SEQ_FLAGS_ON_DEVICE == 2


def test_structs_match_header_layout() -> None:
    """Struct sizes come from the compiler (API mode), e.g. llama_token_data is 12 bytes."""
    assert ffi.sizeof("llama_token_data") == 12
    fields = dict(ffi.typeof("struct llama_context_params").fields)
    assert {"n_ctx", "n_batch", "flash_attn_type", "type_k", "kv_unified", "ctx_other"} <= set(fields)


def test_no_generated_code_is_committed() -> None:
    """The cdef is generated at build time; no copy of llama.h's or ggml's declarations
    is in the tree (our own headers, llama_cffi/_native/*.h, declare only our helpers;
    the headers an in-place build copies into llama_cffi/include are ignored)."""
    skip = {".venv", "build", "dist", "wheelhouse"}
    headers = [
        p
        for p in ROOT.rglob("*")
        if p.suffix in (".h", ".cdef")
        and not skip & set(p.relative_to(ROOT).parts)
        and p.parent != ROOT / "llama_cffi" / "include"
    ]
    copied = [
        p for p in headers if re.search(r"\b(LLAMA_API|GGML_API|GGML_BACKEND_API)\b|\bllama_decode\s*\(", p.read_text())
    ]
    assert copied == []
    assert all(p.parent.name == "_native" for p in headers), headers


def test_build_is_portable_and_never_native() -> None:
    """The libraries are shared with loadable backends; on x86-64 and arm64 the CPU
    backend comes in every variant, never GGML_NATIVE, and without LLAMA_CFFI_AMX=1 no
    AMX kernel is in use."""
    import platform

    opts = llama_cffi.build_info()["options"]
    assert opts["BUILD_SHARED_LIBS"] == opts["GGML_BACKEND_DL"] == "ON"
    if platform.machine() in ("x86_64", "aarch64", "arm64"):
        assert opts["GGML_NATIVE"] == "OFF" and opts["GGML_CPU_ALL_VARIANTS"] == "ON"
    if os.environ.get("LLAMA_CFFI_AMX", "") != "1":
        assert "AMX" not in llama_cffi.system_info()


def test_build_commit_is_pinned() -> None:
    """The extension was built from the pinned llama.cpp commit."""
    info = llama_cffi.build_info()
    assert info["commit"] == llama_cffi.LLAMA_CPP_COMMIT == info["pinned_commit"]


def test_stale_build_raises_import_error() -> None:
    """An extension whose ABI stamp differs from the source's raises ImportError with instructions."""
    r = run_isolated(
        """
        import importlib
        import llama_cffi._binding as b
        import llama_cffi._version as v
        v.BINDING_ABI += 1  # the source now expects a newer extension than the one built
        try:
            importlib.reload(b)
        except ImportError as e:
            print("IMPORTERROR", e)
        """
    )
    assert r.returncode == 0, r.stderr
    assert "IMPORTERROR" in r.stdout and "stale" in r.stdout and "pip install" in r.stdout


def _native_dir() -> Path:
    """llama_cffi/_native: the extension's own C (shipped with the package and the sdist)."""
    return Path(llama_cffi.__file__).resolve().parent / "_native"


def test_every_declaration_of_our_header_is_reachable() -> None:
    """Each function and variable llama_cffi/_native/llama_cffi.h declares (the header the
    cdef reads) is an attribute of lib, and each has a definition in the .c files."""
    header = (_native_dir() / "llama_cffi.h").read_text()
    text = re.sub(r"/\*.*?\*/", "", header, flags=re.S)
    functions = re.findall(r"^[A-Za-z_][\w \*]*?\b(llama_cffi_\w+)\(", text, flags=re.M)
    variables = re.findall(r"^extern [\w ]+\b(llama_cffi_\w+);", text, flags=re.M)
    assert len(functions) >= 12 and len(variables) == 2
    sources = "".join(p.read_text() for p in sorted(_native_dir().glob("*.c*")))
    for name in functions + variables:
        assert hasattr(lib, name), name
        # a definition: the name, then its parameters (over any number of lines) and a body,
        # or an initialised variable
        defined = rf"^[^;\n]*\b{name}\b(\([^;]*?\)\s*\{{|[^;\n]*=)"
        assert re.search(defined, sources, flags=re.M), f"{name} is not defined"


def test_native_helpers_compile_without_warnings() -> None:
    """The extension's C files compile cleanly under -Wall -Wextra -Werror (C11)."""
    import shutil
    import subprocess

    cc = os.environ.get("CC", "cc").split()
    assert shutil.which(cc[0]), "a C compiler is needed"
    for src in sorted(_native_dir().glob("*.c")):
        cmd = [*cc, "-std=c11", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE"]
        cmd += [f"-I{_native_dir()}", f"-I{llama_cffi.get_include()}", str(src)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, f"{src.name}:\n{r.stderr}"


def test_native_cpp_helpers_compile_without_warnings() -> None:
    """The C++ helper (memory.cpp: llama.cpp's memory modules read through their classes)
    compiles cleanly under -Wall -Wextra -Werror (C++17) against the pinned source's
    internal headers (taken as system headers: their own warnings are llama.cpp's)."""
    import shutil
    import subprocess

    from benchmarks.native_tools import llama_cpp_source_dir

    cxx = os.environ.get("CXX", "c++").split()
    assert shutil.which(cxx[0]), "a C++ compiler is needed"
    src_dir = llama_cpp_source_dir() / "src"
    sources = sorted(_native_dir().glob("*.cpp"))
    assert [p.name for p in sources] == ["memory.cpp"]
    for src in sources:
        cmd = [*cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror"]
        cmd += [f"-I{_native_dir()}", f"-I{llama_cffi.get_include()}", f"-isystem{src_dir}", str(src)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, f"{src.name}:\n{r.stderr}"


def test_callbacks_are_api_mode_extern_python() -> None:
    """Log, progress and abort callbacks are extern "Python" functions compiled into the module."""
    for name in ("llama_cffi_log_py", "llama_cffi_progress_py", "llama_cffi_abort_py"):
        assert ffi.typeof(getattr(lib, name)).kind == "function"


def test_build_info_is_json_serialisable() -> None:
    """build_info() round-trips through JSON (the CLI prints it)."""
    assert json.loads(json.dumps(llama_cffi.build_info()))["abi"] >= 1


@pytest.mark.parametrize("name", ["supports_mmap", "supports_mlock", "supports_gpu_offload", "supports_rpc"])
def test_supports_functions_return_bools(name: str) -> None:
    """Capability probes are plain bools; mmap is always available on Linux."""
    assert isinstance(getattr(llama_cffi, name)(), bool)
    assert llama_cffi.supports_mmap() is True
