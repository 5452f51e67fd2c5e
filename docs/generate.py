"""Write the generated parts of the docs, or check that they are current.

``python docs/generate.py`` rewrites them; ``python docs/generate.py --check`` exits 1 and
names each file that is out of date (``tests/test_docs.py`` runs the check, so CI fails when
a module, an exception, a command-line option or a benchmark report changes and the docs
were not regenerated). What it writes:

* ``docs/api.md``: the API reference's index, one entry per public module of ``llama_cffi``
  and ``samplers`` (found by walking the installed packages, never listed by hand);
* ``docs/reference/errors.md``: every exception class, its bases, and the public functions
  and methods that raise it (found in their source);
* ``docs/reference/cli.md``: every ``llama-cffi`` command and option, from argparse;
* ``docs/reference/benchmarks.md``: the summary table of the reference benchmark reports
  under ``benchmarks/results/``.

The model-kind x operation matrix (``docs/model-kinds.md``) is kept by
``tests/test_model_kinds.py``, which runs every operation to fill it.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import pkgutil
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
PACKAGES = ("llama_cffi", "samplers")


def public_modules() -> list[str]:
    """Every importable public module of the two packages, in dotted-name order."""
    out: list[str] = []
    for pkg_name in PACKAGES:
        pkg = importlib.import_module(pkg_name)
        out.append(pkg_name)
        for info in pkgutil.walk_packages(pkg.__path__, prefix=pkg_name + "."):
            if any(part.startswith("_") for part in info.name.split(".")):
                continue
            out.append(info.name)
    return sorted(out)


def api_index() -> str:
    lines = [
        "# API reference",
        "",
        "Generated from the docstrings of every public module (a module whose dotted name has no",
        "part with a leading underscore); `docs/generate.py` lists them. The packages' pages list",
        "what `import llama_cffi`, `import samplers` and `import samplers.grammar` give, each name",
        "linked to where it is defined. The raw layer, `llama_cffi.lib` and `llama_cffi.ffi`, is",
        "the pinned `llama.h` itself: read the header for it.",
        "",
        "```{eval-rst}",
        ".. autosummary::",
        "   :toctree: api",
        "",
    ]
    lines += [f"   {name}" for name in public_modules()]
    lines += ["```", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- errors


def _exception_classes() -> list[tuple[str, type[BaseException]]]:
    """Every exception class, with the public module it is documented in: where it is
    defined, or (defined in a private module, such as the parts of ``samplers.testing``)
    the public module that exports it."""
    seen: dict[type[BaseException], str] = {}
    for modname in public_modules():
        mod = importlib.import_module(modname)
        for name, obj in vars(mod).items():
            if name.startswith("_") or not inspect.isclass(obj) or not issubclass(obj, BaseException):
                continue
            home = obj.__module__
            if home.split(".")[0] not in PACKAGES:
                continue
            if not _private(home):
                seen[obj] = home
            else:
                seen.setdefault(obj, modname)
    return sorted(((home, cls) for cls, home in seen.items()), key=lambda hc: (hc[0], hc[1].__qualname__))


def _private(dotted: str) -> bool:
    return any(part.startswith("_") and part != "__init__" for part in dotted.split("."))


def _raisers() -> dict[str, set[str]]:
    """Exception class name -> functions and methods whose own body raises it."""
    found: dict[str, set[str]] = {}
    for pkg_name in PACKAGES:
        pkg = importlib.import_module(pkg_name)
        for path in sorted(Path(pkg.__path__[0]).rglob("*.py")):
            rel = path.relative_to(Path(pkg.__path__[0]).parent).with_suffix("")
            modname = ".".join(rel.parts).removesuffix(".__init__")
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for qual, fn in _functions(tree):
                where = f"{modname}.{qual}".replace(".__init__", "")
                for node in ast.walk(fn):
                    if isinstance(node, ast.Raise) and node.exc is not None:
                        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                        name = exc.attr if isinstance(exc, ast.Attribute) else getattr(exc, "id", None)
                        if name:
                            found.setdefault(name, set()).add(where)
    return found


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item


def errors_catalogue() -> str:
    classes = _exception_classes()
    raisers = _raisers()
    lines = [
        "# Error catalogue",
        "",
        "Generated by `docs/generate.py` from the packages themselves: every exception class of",
        "`llama_cffi` and `samplers`, its bases (catch it as the builtin you already handle:",
        "`except ValueError` catches every bad-input error), and the functions and methods whose",
        "own body raises it (public ones first, then internal helpers). A function that calls one",
        "of these may raise it too: the [Errors](../guide/errors.md) guide says which families to",
        "expect where.",
        "",
        "| exception | bases | raised directly by |",
        "|---|---|---|",
    ]
    for home, cls in classes:
        bases = ", ".join(_base_ref(b) for b in cls.__bases__)
        where = sorted(raisers.get(cls.__name__, ()), key=lambda w: (_private(w), w))
        shown = ", ".join(f"`{w}`" for w in where[:12])
        if len(where) > 12:
            shown += f" and {len(where) - 12} more"
        lines.append(f"| {{py:exc}}`~{home}.{cls.__qualname__}` | {bases} | {shown or _not_raised(cls)} |")
    lines += ["", f"{len(classes)} exception classes.", ""]
    return "\n".join(lines)


def _not_raised(cls: type[BaseException]) -> str:
    if issubclass(cls, Warning):
        return "(a warning: issued with `warnings.warn`, not raised)"
    if cls.__subclasses__():
        return "(a base class: catch it to catch its subclasses)"
    return "(not raised by the packages themselves)"


def _base_ref(base: type) -> str:
    if base.__module__ == "builtins":
        return f"`{base.__name__}`"
    if base.__module__.split(".")[0] in PACKAGES:
        return f"{{py:exc}}`~{base.__module__}.{base.__qualname__}`"
    return f"`{base.__module__}.{base.__qualname__}`"


# ----------------------------------------------------------------------------- CLI


def cli_reference() -> str:
    from llama_cffi.__main__ import build_parser

    parser = build_parser()
    lines = [
        "# Command line reference",
        "",
        "Generated by `docs/generate.py` from the `llama-cffi` command's argparse parsers (the",
        "subcommands come from the `llama_cffi.commands` entry points of the installed packages).",
        "`python -m llama_cffi` is the same command.",
        "",
        "```text",
        _help(parser),
        "```",
        "",
    ]
    for name, sub in _subparsers(parser):
        lines += [f"## `llama-cffi {name}`", "", "```text", _help(sub), "```", ""]
    return "\n".join(lines)


def _help(parser: argparse.ArgumentParser) -> str:
    import os

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        return parser.format_help().rstrip()
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    out: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            out += sorted(action.choices.items())
    return out


# ----------------------------------------------------------------------------- benchmarks

_REPORT = re.compile(r"^\d{4}-\d{2}-\d{2}-.+\.md$")


def benchmark_summary() -> str:
    results = ROOT / "benchmarks" / "results"
    lines = [
        "# Benchmark results",
        "",
        "Generated by `docs/generate.py` from the reference reports committed under",
        "`benchmarks/results/` (each written by one run of the benchmark suite or of one",
        "script; how they measure: [Benchmarks](../guide/benchmarks.md)). Ratio = ours / the",
        "other side, both measured in the same run, interleaved; ↑ higher is better, ↓ lower",
        "is better. One table per report, newest first.",
        "",
    ]
    reports = sorted((p for p in _committed(results) if _REPORT.match(p.name)), reverse=True)
    if not reports:
        lines += ["No reports are committed.", ""]
    for path in reports:
        text = path.read_text(encoding="utf-8")
        title = text.splitlines()[0].lstrip("# ").strip() if text else path.name
        rows = _table_rows(text)
        lines += [f"## {title}", "", f"From `benchmarks/results/{path.name}`.", ""]
        if not rows:
            lines += ["(no comparison table in this report)", ""]
            continue
        header, body = rows[0], rows[1:]
        keep = [i for i, h in enumerate(header) if h.strip().lower() not in ("command",)]
        lines.append("| " + " | ".join(header[i] for i in keep) + " |")
        lines.append("|" + "|".join("---" for _ in keep) + "|")
        for row in body:
            lines.append("| " + " | ".join(row[i] if i < len(row) else "" for i in keep) + " |")
        lines.append("")
    return "\n".join(lines)


def _committed(results: Path) -> list[Path]:
    """The reports under ``results``: in a git checkout only the committed ones (a local run's
    report is not part of the docs until it is added), elsewhere (a test tree) all of them."""
    if not results.is_dir():
        return []
    files = list(results.glob("*.md"))
    if (ROOT / ".git").exists():
        import subprocess

        r = subprocess.run(["git", "ls-files", "benchmarks/results"], cwd=ROOT, capture_output=True, text=True)
        if r.returncode == 0:
            tracked = {Path(line).name for line in r.stdout.splitlines()}
            files = [p for p in files if p.name in tracked]
    return files


def _table_rows(text: str) -> list[list[str]]:
    """The first Markdown table of a report: header then body rows (separator dropped)."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in _split_row(line)]
            if all(re.fullmatch(r":?-{3,}:?", c) for c in cells if c):
                continue
            rows.append(cells)
        elif rows:
            break
    return rows


def _split_row(line: str) -> list[str]:
    """Cells of a Markdown table row; a ``|`` inside backticks is not a separator."""
    cells, cur, code = [], "", False
    for ch in line.strip().strip("|"):
        if ch == "`":
            code = not code
        if ch == "|" and not code:
            cells.append(cur)
            cur = ""
        else:
            cur += ch
    cells.append(cur)
    return cells


# ----------------------------------------------------------------------------- main

GENERATED: dict[str, Callable[[], str]] = {
    "api.md": api_index,
    "reference/errors.md": errors_catalogue,
    "reference/cli.md": cli_reference,
    "reference/benchmarks.md": benchmark_summary,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a generated file is out of date")
    args = ap.parse_args(argv)
    stale = []
    for rel, make in GENERATED.items():
        path = DOCS / rel
        text = make()
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        if args.check:
            stale.append(rel)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote docs/{rel}")
    if stale:
        print("out of date (run python docs/generate.py): " + ", ".join(f"docs/{s}" for s in stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
