"""``llama-cffi bench``: find the benchmark suite and run it.

The suite (``benchmarks/suite.py`` and the scripts beside it, with the C and C++
sources of the native reference programs) compares llama_cffi with llama.cpp built from
the same source, in the same run. It lives in the source tree; a wheel or sdist install
carries a copy under this package's ``_bench/`` folder (put there at build time,
laid out as in the tree: ``benchmarks/``, ``build_ffi.py``, ``patches/``), so an
installed llama_cffi benchmarks its own machine without a clone. The native programs
are built on first use from the pinned llama.cpp source in llama_cffi's build cache
(downloaded once if the cache is empty; a C and C++ compiler and CMake are needed) with
the options and CPU variant of the installed build, and cached.

This module only starts the suite, as a subprocess: the scripts import
:mod:`samplers`, which ``llama_cffi`` never does. ``python -m llama_cffi.bench ARGS``
is the same as ``llama-cffi bench ARGS``; ``--help`` lists the suite's options.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ._args import expect_strs

__all__ = ["bench_root", "main", "suite_command"]

_PACKAGE = Path(__file__).resolve().parent


def _is_root(folder: Path) -> bool:
    return (folder / "benchmarks" / "suite.py").is_file() and (folder / "build_ffi.py").is_file()


def bench_root() -> Path:
    """The folder whose ``benchmarks/suite.py`` runs: the source tree this package was
    built in place in, else the copy inside the installed package (``_bench``).
    :class:`OSError` when neither exists (an install from an incomplete build)."""
    for root in (_PACKAGE.parent, _PACKAGE / "_bench"):
        if _is_root(root):
            return root
    raise OSError(
        f"no benchmark suite: neither {_PACKAGE.parent / 'benchmarks'} (a source tree) nor "
        f"{_PACKAGE / '_bench' / 'benchmarks'} (the copy a wheel carries) has suite.py"
    )


def suite_command(args: Sequence[str] = ()) -> list[str]:
    """The command that runs the suite with ``args``: this interpreter and the suite's
    path. The report goes to ``--out-dir``; by default ``benchmarks/results/`` of a source
    tree, or ``llama-cffi-bench/`` in the current directory for the installed copy."""
    return [sys.executable, str(bench_root() / "benchmarks" / "suite.py"), *expect_strs("args", args)]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite with ``argv`` (default: ``sys.argv[1:]``) in the current directory;
    returns its exit status (0: every benchmark ran)."""
    args = sys.argv[1:] if argv is None else expect_strs("argv", argv, "a sequence of str or None")
    # the suite's usage lines then name this command, not its file (suite.py's PROG_ENV)
    env = {**os.environ, "LLAMA_CFFI_BENCH_PROG": "llama-cffi bench"}
    return subprocess.call(suite_command(args), env=env)


if __name__ == "__main__":
    sys.exit(main())
