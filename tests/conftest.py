"""Hypothesis profiles and subprocess isolation. The model fixtures (``tiny_model_path``,
``tiny_model``, ``tiny_context``, ``default_model_path``, ``default_model``) come from the
llama_cffi pytest plugin (:mod:`llama_cffi.pytest_plugin`), as they do for users."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent

# tests/run_installed.py runs the suite from a copy of the tests outside the source tree,
# against a fresh venv: make sure that is what gets imported (not a tree on sys.path).
_INSTALLED = os.environ.get("LLAMA_CFFI_EXPECT_INSTALLED")
if _INSTALLED:
    import llama_cffi
    import samplers

    for _mod in (llama_cffi, samplers):
        _where = Path(str(_mod.__file__)).resolve()
        if Path(_INSTALLED).resolve() not in _where.parents:
            raise pytest.UsageError(f"{_mod.__name__} was imported from {_where}, not from the venv {_INSTALLED}")

# Hypothesis budget: LLAMA_CFFI_HYPOTHESIS=ci (default) or =long for a deeper run. Under
# CI=true the examples are derandomized (the same 60 every run, so main's CI result is
# reproducible); everywhere else each run explores new ones, and =long explores 2000.
settings.register_profile(
    "ci", max_examples=60, deadline=None, derandomize=os.environ.get("CI", "").lower() in ("1", "true")
)
settings.register_profile("long", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("LLAMA_CFFI_HYPOTHESIS", "ci"))


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


#: For isolated children: greedy-generate ``N`` tokens from a fixed prompt on the model at
#: ``PATH`` (both placeholders replaced by the caller) and print, after ``RESULT``, JSON with
#: the CPU variant loaded and why, the tokens, the prompt's last logits and system info.
GREEDY_CHILD = """
import json, numpy as np, llama_cffi
from llama_cffi import backends
c = backends.choice()
m = llama_cffi.Model.load(PATH)
ctx = m.context(n_ctx=256, n_batch=256)
logits = np.array(ctx.decode(m.tokenize("The quick brown fox jumps over the lazy dog")))
first = logits.copy()
toks = []
for _ in range(N):
    t = int(logits.argmax())
    toks.append(t)
    logits = np.array(ctx.decode([t]))
print("RESULT", json.dumps({"variant": c.cpu.name, "reason": c.reason, "tokens": toks, "logits": first.tolist(),
                            "system": llama_cffi.system_info()}))
"""


def greedy_child(path: Path, n: int = 8) -> str:
    """:data:`GREEDY_CHILD` for the model at ``path`` and ``n`` tokens."""
    return GREEDY_CHILD.replace("PATH", repr(str(path))).replace("range(N)", f"range({n})")


def rss_kib() -> int:
    """This process's resident set size (``VmRSS`` of ``/proc/self/status``), in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


#: Prepended to every isolated child: Python's own SIGINT handler, whatever the suite was
#: started with. A suite started under ``nohup`` or with ``&`` ignores SIGINT, a child
#: inherits SIG_IGN, and Python keeps an inherited SIG_IGN: Ctrl-C tests would then never
#: see their interrupt.
DEFAULT_SIGINT = "import signal as _signal; _signal.signal(_signal.SIGINT, _signal.default_int_handler)\n"


def load_build_ffi() -> ModuleType:
    """The repository's ``build_ffi.py`` as a module (it is no package: loaded by path, once)."""
    mod = sys.modules.get("build_ffi")
    if mod is None:
        spec = importlib.util.spec_from_file_location("build_ffi", ROOT / "build_ffi.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["build_ffi"] = mod  # dataclasses look their module up while it executes
        spec.loader.exec_module(mod)
    return mod


def chat_oracle(model_path: Path, request: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's own chat machinery for ``request`` (common_chat_templates_apply and
    common_chat_parse, through benchmarks/native/chat_oracle.cpp: see its usage)."""
    import json

    from benchmarks.native_tools import build_common_cpp_tool

    tool = build_common_cpp_tool("chat_oracle")
    r = subprocess.run([str(tool), str(model_path)], input=json.dumps(request), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def run_isolated(
    code: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (a spawned process, never a fork: with OpenMP a
    forked child hangs in llama_decode), with Python's default SIGINT handler. The caller
    asserts on returncode and output. ``env``: variables to set (or, with value "", unset)
    for the child."""
    # GGML_NO_BACKTRACE: a failing child must not spend seconds attaching gdb
    child_env = dict(
        os.environ,
        GGML_NO_BACKTRACE="1",
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    for k, v in (env or {}).items():
        if v:
            child_env[k] = v
        else:
            child_env.pop(k, None)
    return subprocess.run(
        [sys.executable, "-c", DEFAULT_SIGINT + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=child_env,
    )


class AbortGate:
    """An abort callback that holds a decode at its first poll until :attr:`release` is set,
    then lets it go on (returns False): a test can act while a decode is certainly in flight,
    with no timing involved. :attr:`polls` counts the polls that reached Python; the C
    callback answers a set abort flag without polling Python, so ``polls == 1`` after an
    abort requested while held proves the decode stopped at its next check."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.release = threading.Event()
        self.polls = 0

    def __call__(self) -> bool:
        self.polls += 1
        if self.polls == 1:
            self.inside.set()
            self.release.wait(30)
        return False

    @contextmanager
    def installed(self, ctx: Any) -> Iterator[AbortGate]:
        """Poll this gate at every check of ``ctx``'s decodes (interval 0) while inside."""
        ctx.set_abort_callback(self, interval=0)
        try:
            yield self
        finally:
            self.release.set()
            ctx.set_abort_callback(None)

    def release_on_abort_request(self, ctx: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        """Release the held decode once ``ctx.request_abort()`` has set the abort flag."""
        real = ctx.request_abort

        def request_abort() -> None:
            real()
            self.release.set()

        monkeypatch.setattr(ctx, "request_abort", request_abort)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI=true a skipped test fails the run: every test of the suite must run there
    (the default model comes with the ``test`` extra; the plugin's fixtures skip without it)."""
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped and exitstatus == 0:
        for rep in skipped[:10]:
            print(f"\nci: skipped under CI=true: {rep.nodeid}: {rep.longrepr}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
