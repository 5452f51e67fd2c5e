"""Build llama_cffi: llama.cpp from pinned source, then the cffi extension (see build_ffi.py)."""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

_EXT_FIELDS = (
    "include_dirs",
    "define_macros",
    "undef_macros",
    "library_dirs",
    "libraries",
    "runtime_library_dirs",
    "extra_objects",
    "extra_compile_args",
    "extra_link_args",
    "depends",
    "language",
)


class BuildLlama(build_ext):
    """Build the native libraries (cached), generate the API-mode extension, import it."""

    def finalize_options(self) -> None:
        # Runs before build_ext's own finalize_options, which annotates the extensions.
        import build_ffi

        try:
            ffi, _native, _source = build_ffi.prepare()
        except build_ffi.BuildError as exc:
            raise SystemExit(f"llama_cffi: {exc}") from None
        # cffi writes the C source and returns a *distutils* Extension; setuptools wants
        # its own class, with the same fields.
        dext = ffi.distutils_extension(tmpdir=os.path.join(HERE, "build", "cffi"))
        ext = Extension(dext.name, list(dext.sources), **{f: getattr(dext, f) for f in _EXT_FIELDS})
        self.distribution.ext_modules = [ext]
        super().finalize_options()
        self.extensions = [ext]

    def run(self) -> None:
        import build_ffi

        super().run()
        built = self.get_ext_fullpath("llama_cffi._llama")
        if self.inplace:
            built = os.path.join(HERE, "llama_cffi", os.path.basename(built))
        info = build_ffi.check_import(built)
        build_ffi.log(f"extension ok: {os.path.basename(built)}; {info['system']}")


setup(
    ext_modules=[Extension("llama_cffi._llama", sources=[])],  # replaced in BuildLlama
    cmdclass={"build_ext": BuildLlama},
)
