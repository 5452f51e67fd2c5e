"""ARCHITECTURE.md stays current: it names every module of both packages and every C
file of the extension, and the layering it describes holds."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

from tests.conftest import ROOT

SOURCE = Path(os.environ.get("LLAMA_CFFI_SOURCE_TREE", str(ROOT))).resolve()


def test_every_module_is_on_the_map() -> None:
    """Each module of llama_cffi/ and samplers/ (and each llama_cffi/_native C file) is
    named in ARCHITECTURE.md, so a new or moved module shows up in review."""
    text = (SOURCE / "ARCHITECTURE.md").read_text()
    names = {p.stem for top in ("llama_cffi", "samplers") for p in (SOURCE / top).rglob("*.py")} - {"__init__"}
    names |= {p.name for p in (SOURCE / "llama_cffi" / "_native").glob("*.[ch]*")} - {"internal.h", "llama_cffi.h"}
    missing = sorted(n for n in names if not re.search(rf"\b{re.escape(n)}\b", text))
    assert missing == []


def test_llama_cffi_never_imports_samplers() -> None:
    """The layering rule: no module of llama_cffi imports samplers (read from the source)."""
    offenders = []
    for path in sorted((SOURCE / "llama_cffi").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mods = [node.module]
            offenders += [f"{path.name}: {m}" for m in mods if m.split(".")[0] == "samplers"]
    assert offenders == []
