"""Shared fixtures: tiny generated models, the default model, subprocess isolation."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

import llama_cffi
from tests.tiny_model import write_tiny_model

ROOT = Path(__file__).resolve().parent.parent

# Hypothesis budget: LLAMA_CFFI_HYPOTHESIS=ci (default) or =long for a deeper run. Under
# CI=true the examples are derandomized (the same 60 every run, so main's CI result is
# reproducible); everywhere else each run explores new ones, and =long explores 2000.
settings.register_profile(
    "ci", max_examples=60, deadline=None, derandomize=os.environ.get("CI", "").lower() in ("1", "true")
)
settings.register_profile("long", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("LLAMA_CFFI_HYPOTHESIS", "ci"))


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


@pytest.fixture(scope="session")
def tiny_model(tiny_model_path: Path) -> Iterator[llama_cffi.Model]:
    with llama_cffi.Model.load(tiny_model_path) as m:
        yield m


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    return llama_cffi.default_model_path()


@pytest.fixture(scope="session")
def default_model(default_model_path: Path) -> Iterator[llama_cffi.Model]:
    with llama_cffi.Model.load(default_model_path) as m:
        yield m


#: For scripts run with :func:`run_isolated`: ``expect(exc, f)`` calls ``f`` and records the
#: name of the exception it raised (``"NO ERROR"`` if none) in ``out``.
EXPECT = """
out = []
def expect(exc, f):
    try:
        f()
    except exc as e:
        out.append(type(e).__name__)
    else:
        out.append("NO ERROR")
"""


def run_isolated(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (a spawned process, never a fork: with OpenMP a
    forked child hangs in llama_decode). The caller asserts on returncode and output."""
    # GGML_NO_BACKTRACE: a failing child must not spend seconds attaching gdb
    env = dict(
        os.environ,
        GGML_NO_BACKTRACE="1",
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )
