"""Build llama_cffi: llama.cpp from pinned source, then the cffi extension (see build_ffi.py)."""

import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

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

#: The oldest CPython the limited-API extension is built for: one wheel serves 3.10 and later.
LIMITED_API = "cp310"


class BuildLlama(build_ext):
    """Build the native libraries (cached), generate the API-mode extension, put the
    libraries beside it (``llama_cffi/_libs``) and import it once to check the result."""

    def finalize_options(self) -> None:
        # Runs before build_ext's own finalize_options, which annotates the extensions.
        import build_ffi

        try:
            ffi, self._native, _source = build_ffi.prepare()
        except build_ffi.BuildError as exc:
            raise SystemExit(f"llama_cffi: {exc}") from None
        # cffi writes the C source and returns a *distutils* Extension; setuptools wants
        # its own class, with the same fields.
        dext = ffi.distutils_extension(tmpdir=os.path.join(HERE, "build", "cffi"))
        fields = {f: getattr(dext, f) for f in _EXT_FIELDS}
        # setuptools wants the sources relative to setup.py's folder (the cwd of a build)
        sources = [os.path.relpath(s, HERE) if os.path.isabs(s) else s for s in dext.sources]
        ext = Extension(dext.name, sources, py_limited_api=True, **fields)
        self.distribution.ext_modules = [ext]
        super().finalize_options()
        self.extensions = [ext]

    def run(self) -> None:
        import build_ffi

        super().run()
        built = self.get_ext_fullpath("llama_cffi._llama")
        if self.inplace:
            built = os.path.join(HERE, "llama_cffi", os.path.basename(built))
        build_ffi.remove_other_extensions(Path(built))
        build_ffi.fix_extension_rpath(Path(built))
        written = build_ffi.install_native(self._native, Path(built).parent)
        info = build_ffi.check_import(Path(built))
        build_ffi.log(f"extension ok: {os.path.basename(built)} with {len(written)} native files; {info['system']}")


def bench_files(root: Path) -> list[Path]:
    """What ``llama-cffi bench`` needs from the source tree, relative to ``root``: the
    benchmark scripts and their README, the native programs' sources, and the build recipe
    the reference tools are built with (``build_ffi.py``, ``patches/``). Never results."""
    found = [Path("build_ffi.py"), *(p.relative_to(root) for p in sorted((root / "patches").glob("*.patch")))]
    bench = root / "benchmarks"
    found += [p.relative_to(root) for p in sorted(bench.glob("*.py"))]
    found += [Path("benchmarks/README.md")]
    found += [p.relative_to(root) for p in sorted((bench / "native").iterdir()) if p.suffix in (".c", ".cpp", ".h")]
    return found


#: The start-up hook that lets lm-eval's own command find ``--model llama-cffi``
#: (``samplers/_lm_eval_hook.py``, whose docstring says what it does): a copy of that
#: module at the top of site-packages (:data:`HOOK_MODULE`, byte-compiled at install like
#: every module, so start-up loads its cached bytecode: compiling source at start-up
#: would cost ~3 ms, the compiler's first use) and a ``.pth`` file whose one line imports it.
PTH_NAME = "llama_cffi-lm-eval.pth"
HOOK_MODULE = "_llama_cffi_lm_eval"


def write_hook(dest_dir: Path) -> Path:
    """Write :data:`PTH_NAME` and :data:`HOOK_MODULE` into ``dest_dir`` (the top of what
    becomes site-packages); returns the ``.pth`` file's path."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    src = (Path(HERE) / "samplers" / "_lm_eval_hook.py").read_text(encoding="utf-8")
    (dest_dir / f"{HOOK_MODULE}.py").write_text(src, encoding="utf-8")
    pth = dest_dir / PTH_NAME
    pth.write_text(f"import {HOOK_MODULE}\n", encoding="utf-8")
    return pth


class BuildPy(build_py):
    """Also put a copy of the benchmark suite in the package (``llama_cffi/_bench``, laid
    out as in the tree), so that an installed llama_cffi runs ``llama-cffi bench`` without
    a clone (:mod:`llama_cffi.bench`), and the lm-eval hook (:func:`write_hook`) beside the
    packages. An editable install uses the tree itself (its hook: :class:`EditableWheel`)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        write_hook(Path(self.build_lib))
        root = Path(HERE)
        dest = Path(self.build_lib) / "llama_cffi" / "_bench"
        for rel in bench_files(root):
            self.mkpath(str((dest / rel).parent))
            self.copy_file(str(root / rel), str(dest / rel))


class EditableWheel(editable_wheel):
    """An editable install's wheel also carries the lm-eval hook (:func:`write_hook`)."""

    def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):  # type: ignore[no-untyped-def]
        out = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
        write_hook(Path(unpacked_wheel))
        return out


if __name__ == "__main__":  # pip's build backend runs this file as __main__; tests import its helpers
    setup(
        ext_modules=[Extension("llama_cffi._llama", sources=[], py_limited_api=True)],  # replaced in BuildLlama
        cmdclass={"build_ext": BuildLlama, "build_py": BuildPy, "editable_wheel": EditableWheel},
        options={"bdist_wheel": {"py_limited_api": LIMITED_API}},
    )
