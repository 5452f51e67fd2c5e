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


def imports(path: Path) -> list[str]:
    """Every module ``path`` imports, anywhere in it (functions included), as absolute
    dotted names (relative imports resolved against the file's package)."""
    package = ".".join(path.relative_to(SOURCE).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            found.append(mod)
            found += [f"{mod}.{a.name}" for a in node.names]  # from . import distributed
    return found


def modules(top: str) -> list[Path]:
    return sorted((SOURCE / top).rglob("*.py"))


def test_llama_cffi_never_imports_samplers() -> None:
    """The layering rule: no module of llama_cffi imports samplers (read from the source)."""
    offenders = [f"{p.name}: {m}" for p in modules("llama_cffi") for m in imports(p) if m.split(".")[0] == "samplers"]
    assert offenders == []


def test_test_support_code_lives_in_the_testing_subpackages() -> None:
    """``llama_cffi.testing`` and ``samplers.testing`` are packages holding the test-support
    code: every module that imports hypothesis or gguf (the state machines, the tiny-model
    writers) is inside one of them, so a listing of ``llama_cffi/`` or ``samplers/`` shows
    the library."""
    for top in ("llama_cffi", "samplers"):
        assert (SOURCE / top / "testing" / "__init__.py").is_file(), f"{top}.testing is not a package"
    outside = [
        f"{p.relative_to(SOURCE)}: {m}"
        for top in ("llama_cffi", "samplers")
        for p in modules(top)
        if "testing" not in p.relative_to(SOURCE / top).parts[:-1]
        for m in imports(p)
        if m.split(".")[0] in ("hypothesis", "gguf")
    ]
    assert outside == []
    writers = {p.name for p in (SOURCE / "llama_cffi" / "testing").glob("_tiny*.py")}
    assert {"_tiny_model.py", "_tiny_variants.py", "_tiny_encoders.py", "_tiny_recurrent.py"} <= writers


#: Optional layers (an extra's dependency) and the front ends allowed to compose them with the core.
OPTIONAL = {"samplers.distributed": {"samplers.cli"}}


def test_optional_layers_depend_on_the_core_not_the_other_way_round() -> None:
    """``samplers.distributed`` (the ``ray`` extra) imports the core (``perplexity``,
    ``branch``...); no core module imports it, lazily or not. Only the command-line front
    end (``samplers.cli``) puts the two together."""
    offenders = []
    for p in modules("samplers"):
        name = ".".join(p.relative_to(SOURCE).with_suffix("").parts)
        for optional, front_ends in OPTIONAL.items():
            if name in (optional, *front_ends):
                continue
            offenders += [f"{name}: {m}" for m in imports(p) if m == optional or m.startswith(optional + ".")]
    assert offenders == []
