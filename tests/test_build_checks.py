"""build_ffi's checks of what the native build produced (no llama.cpp build here: small
libraries compiled by the test with the system's C++ compiler)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import load_build_ffi


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF libraries")
def test_a_library_with_its_own_cxx_runtime_is_refused(tmp_path: Path) -> None:
    """A library linked with -static-libstdc++ (each library its own C++ runtime: the
    first model load crashed on the lent GPU machine) fails the build with a message
    that says what to do; the same source linked normally passes."""
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")  # the build's compiler (CMake's rule)
    assert cxx, "the test extra's machines have a C++ compiler (the native build needs one)"
    src = tmp_path / "probe.cpp"
    src.write_text(
        "#include <sstream>\n"
        'extern "C" int probe(long v) { std::ostringstream s; s << v; return (int) s.str().size(); }\n'
    )
    shared = tmp_path / "libshared.so"
    static = tmp_path / "libstatic.so"
    subprocess.run([cxx, "-shared", "-fPIC", str(src), "-o", str(shared)], check=True)
    subprocess.run([cxx, "-shared", "-fPIC", "-static-libstdc++", str(src), "-o", str(static)], check=True)
    bf = load_build_ffi()
    bf.check_shared_libstdcxx([shared])
    with pytest.raises(
        bf.BuildError, match=r"libstatic\.so do not link the shared libstdc\+\+\.so\.6.*CXX=/usr/bin/g\+\+"
    ):
        bf.check_shared_libstdcxx([shared, static])


def test_the_installed_libraries_link_the_shared_cxx_runtime() -> None:
    """What this build staged passes the check (it runs at every build; here on the files
    the tests use)."""
    import llama_cffi

    libdir = Path(llama_cffi.__file__).parent / "_libs"
    libs = sorted(libdir.glob("*.so"))
    assert libs, libdir
    load_build_ffi().check_shared_libstdcxx(libs)


def _reader_include_dirs(bf: object) -> list[Path]:
    """What the extension's build passes for memory.cpp: our header, the installed llama.h
    and ggml headers, and the pinned source's src/ (llama.cpp's internal headers)."""
    import llama_cffi
    from benchmarks.native_tools import llama_cpp_source_dir

    return [bf.NATIVE_DIR, Path(llama_cffi.get_include()), llama_cpp_source_dir(patched=True) / "src"]  # type: ignore[attr-defined]


def test_memory_reader_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe build_ffi runs before compiling the extension: memory.cpp compiles against
    the pinned source (and this build has its reader); against a source whose
    llama_kv_cache names its buffers otherwise (as another LLAMA_CPP_DIR commit may) the
    probe returns the compiler's error, which names the member, so the build takes the
    stub instead of failing; LLAMA_CFFI_MEMORY_READER=0 asks for the stub."""
    import llama_cffi

    bf = load_build_ffi()
    dirs = _reader_include_dirs(bf)
    assert bf.memory_reader_error(dirs) is None
    assert llama_cffi.build_info()["memory_reader"] is True
    header = dirs[-1] / "llama-kv-cache.h"
    text = header.read_text()
    assert text.count("ctxs_bufs;") == 1
    (tmp_path / header.name).write_text(text.replace("ctxs_bufs;", "buffers_by_context;"))
    # memory.cpp's own folder is searched first for "..." includes, then -I in order
    why = bf.memory_reader_error([dirs[0], tmp_path, *dirs[1:]])
    assert why is not None and "ctxs_bufs" in why, why
    monkeypatch.setenv("LLAMA_CFFI_MEMORY_READER", "0")
    assert bf.memory_reader_error(dirs) == "LLAMA_CFFI_MEMORY_READER=0"


def test_memory_reader_stub(tmp_path: Path) -> None:
    """memory.cpp built as the stub: both readers return LLAMA_CFFI_MEMORY_UNAVAILABLE and
    the error says why; the extension maps that code to UnsupportedError (the code is the
    header's, through the cdef)."""
    import ctypes

    from llama_cffi._binding import lib

    bf = load_build_ffi()
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    assert cc, "the test extra's machines have a C compiler"
    so = tmp_path / "libstub.so"
    flags = ["-shared", "-fPIC", "-DLLAMA_CFFI_NO_MEMORY_READER", f"-I{bf.NATIVE_DIR}"]
    subprocess.run([*cc.split(), *flags, str(bf.MEMORY_READER), "-o", str(so)], check=True)
    stub = ctypes.CDLL(str(so))
    stub.llama_cffi_memory_error.restype = ctypes.c_char_p
    assert stub.llama_cffi_memory_buffers(None, None, 0) == lib.LLAMA_CFFI_MEMORY_UNAVAILABLE == -3
    assert stub.llama_cffi_memory_tensors(None, None, 0) == -3
    assert b"did not compile against" in stub.llama_cffi_memory_error()


BUILD_WITHOUT_READER = """
import importlib.util, shutil, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("build_ffi", sys.argv[1])
bf = importlib.util.module_from_spec(spec)
sys.modules["build_ffi"] = bf
spec.loader.exec_module(bf)
ffi, native, source = bf.prepare()
so = ffi.compile(tmpdir=sys.argv[2])
shutil.copy2(so, Path(sys.argv[3]) / Path(so).name)
"""

USE_WITHOUT_READER = """
import sys
import llama_cffi
from llama_cffi.errors import UnsupportedError
assert llama_cffi.__file__.startswith(sys.argv[1]), llama_cffi.__file__
assert llama_cffi.build_info()["memory_reader"] is False
with llama_cffi.Model.load(sys.argv[2]) as m, m.context(n_ctx=64) as ctx:
    row = ctx.decode([1, 2, 3])
    try:
        ctx.memory_usage()
    except UnsupportedError as e:
        print(e)
    ctx.decode_single(int(row.argmax()))  # the context goes on
"""


def test_a_build_without_the_memory_reader(tmp_path: Path, tiny_model_path: Path) -> None:
    """End to end, what a LLAMA_CPP_DIR whose internal classes differ gets: the extension
    built with the stub (here asked for by LLAMA_CFFI_MEMORY_READER=0, from the same
    cached native build) warns at build time, imports, decodes, says it has no reader in
    build_info(), and memory_usage() raises UnsupportedError saying why."""
    import llama_cffi

    bf = load_build_ffi()
    pkg = Path(llama_cffi.__file__).parent
    dest = tmp_path / "site" / "llama_cffi"
    shutil.copytree(pkg, dest, ignore=shutil.ignore_patterns("_llama.*", "_libs", "_bench", "__pycache__"))
    (dest / "_libs").symlink_to(pkg / "_libs")  # the extension's RUNPATH is $ORIGIN/_libs
    env = {**os.environ, "LLAMA_CFFI_MEMORY_READER": "0"}
    r = subprocess.run(
        [sys.executable, "-c", BUILD_WITHOUT_READER, bf.__file__, str(tmp_path / "cffi"), str(dest)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "warning: Context.memory_usage() will raise UnsupportedError" in r.stderr
    assert "LLAMA_CFFI_MEMORY_READER=0" in r.stderr
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CFFI_MEMORY_READER"}
    r = subprocess.run(
        [sys.executable, "-c", USE_WITHOUT_READER, str(dest), str(tiny_model_path)],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(dest.parent)},
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("memory_usage() is not available: this build has no memory reader"), r.stdout
