"""Build llama_cffi: llama.cpp from pinned source, then the cffi extension (see build_ffi.py)."""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


class BuildLlama(build_ext):
    """Build the native libraries (cached) and the API-mode extension, then import it."""

    def run(self) -> None:
        from pathlib import Path

        import build_ffi

        try:
            ffi, native, source = build_ffi.prepare()
        except build_ffi.BuildError as exc:
            raise SystemExit(f"llama_cffi: {exc}") from None
        ext = ffi.distutils_extension(tmpdir=os.path.join(self.build_temp, "cffi"))
        self.extensions = [ext]
        self.distribution.ext_modules = [ext]
        super().run()
        built = Path(self.get_ext_fullpath(ext.name))
        info = build_ffi.check_import(built)
        build_ffi.log(f"extension ok: {built.name}; {info['system']}")


setup(
    ext_modules=[Extension("llama_cffi._llama", sources=[])],  # replaced in BuildLlama.run
    cmdclass={"build_ext": BuildLlama},
)
