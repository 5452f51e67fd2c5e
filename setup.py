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
        # cffi writes the C source and returns a *distutils* Extension; setuptools'
        # build_ext wants its own class, with the same fields.
        dext = ffi.distutils_extension(tmpdir=os.path.join(self.build_temp, "cffi"))
        fields = (
            "include_dirs", "define_macros", "undef_macros", "library_dirs", "libraries",
            "runtime_library_dirs", "extra_objects", "extra_compile_args", "extra_link_args",
            "depends", "language",
        )
        ext = Extension(dext.name, list(dext.sources), **{f: getattr(dext, f) for f in fields})
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
