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
