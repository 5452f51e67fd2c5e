"""The installed package is complete and relocatable: every module of the source tree
imports from it, its native libraries, headers and licence are inside it, its commands and
plugins are registered, and nothing in it points at the machine that built it.

``tests/run_installed.py`` runs these (with the whole suite) from outside the source tree
against a fresh venv with the wheel, and against one with the sdist; ``LLAMA_CFFI_SOURCE_TREE``
names the tree whose modules must all be there. In a development checkout they check the
in-place build the same way."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import llama_cffi
import samplers
from tests.conftest import ROOT

SOURCE = Path(os.environ.get("LLAMA_CFFI_SOURCE_TREE", str(ROOT))).resolve()
PACKAGE = Path(llama_cffi.__file__).resolve().parent
LIBS = PACKAGE / "_libs"


def source_modules() -> list[str]:
    """Every module and package under llama_cffi/ and samplers/ of the source tree."""
    names = []
    for top in ("llama_cffi", "samplers"):
        for path in sorted((SOURCE / top).rglob("*.py")):
            parts = list(path.relative_to(SOURCE).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names.append(".".join(parts))
    return names


def test_source_tree_has_the_packages() -> None:
    """The source tree the check compares against is a real one (not an empty folder)."""
    mods = source_modules()
    assert "llama_cffi.model" in mods and "samplers.grammar.json_schema" in mods, SOURCE


def test_every_source_module_imports_from_the_installed_package() -> None:
    """Each module of the source tree (subpackages such as samplers.grammar included)
    imports, and from the package under test, not from some other copy."""
    site = PACKAGE.parent
    missing, elsewhere = [], []
    for name in source_modules():
        try:
            mod = importlib.import_module(name)
        except ImportError as exc:
            missing.append(f"{name}: {exc}")
            continue
        where = Path(str(mod.__file__)).resolve()
        if site not in where.parents:
            elsewhere.append(f"{name}: {where}")
    assert missing == [] and elsewhere == []


def test_packages_are_typed() -> None:
    """Both packages ship their py.typed marker."""
    assert (PACKAGE / "py.typed").is_file()
    assert (Path(samplers.__file__).parent / "py.typed").is_file()


def test_native_libraries_headers_and_licence_are_inside() -> None:
    """_libs holds the renamed core libraries, one CPU library per variant the build stamp
    lists, and llama.cpp's licence; include/ holds the pinned llama.h."""
    info = llama_cffi.build_info()
    files = {p.name for p in LIBS.iterdir()}
    assert {"libllama_cffi_llama.so", "libllama_cffi_ggml.so", "libllama_cffi_ggml-base.so"} <= files
    if info["options"]["GGML_RPC"] == "ON":
        assert "libllama_cffi_ggml-rpc.so" in files
    if info["options"].get("LLAMA_BUILD_MTMD") == "ON":  # libmtmd and its two public headers
        assert "libllama_cffi_mtmd.so" in files
        assert {"mtmd.h", "mtmd-helper.h"} <= {p.name for p in Path(llama_cffi.get_include()).iterdir()}
    cpu = {f for f in files if f.startswith("libggml-cpu")}
    assert cpu == {f"libggml-cpu-{v}.so" if v else "libggml-cpu.so" for v in info["cpu_variants"]}
    assert "LICENSE.llama.cpp" in files
    assert "LLAMA_API" in (Path(llama_cffi.get_include()) / "llama.h").read_text()


def test_build_stamp_names_no_path_of_the_build_machine() -> None:
    """build_info() is the same wherever the wheel is installed: no absolute paths."""
    info = llama_cffi.build_info()
    text = json.dumps(info)
    assert not re.search(r'"/|[A-Za-z]:\\\\', text), text
    assert info["origin"].startswith("sdist:") or info["origin"] == "dir"


def _dynamic_section(path: Path) -> str:
    return subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF dynamic sections are Linux's")
def test_search_paths_stay_inside_the_package() -> None:
    """Every RUNPATH/RPATH of the extension and of its libraries is relative to the file
    itself ($ORIGIN), and every library they need is a system one or one of the package's."""
    assert shutil.which("readelf"), "readelf (binutils) is needed"
    ext = next(PACKAGE.glob("_llama*.so"))
    ours = {p.name for p in LIBS.glob("*.so")}
    for path in [ext, *sorted(LIBS.glob("*.so"))]:
        dyn = _dynamic_section(path)
        for rp in re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]", dyn):
            assert all(p.startswith("$ORIGIN") for p in rp.split(":")), f"{path.name}: {rp}"
        for needed in re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", dyn):
            if "llama" in needed or "ggml" in needed:
                assert needed in ours, f"{path.name} needs {needed}, which the package lacks"


def test_binaries_hold_no_build_paths() -> None:
    """No library of the package embeds the build cache or the source tree's path (source
    file names are mapped to ``llama.cpp/...``, so assertion messages stay readable)."""
    cache = os.environ.get("LLAMA_CFFI_CACHE_DIR") or str(Path.home() / ".cache" / "llama_cffi")
    needles = [cache.encode(), str(SOURCE).encode()]
    hits = [
        f"{p.name}: {n.decode()}"
        for p in [*PACKAGE.glob("_llama*.so"), *LIBS.glob("*.so")]
        for n in needles
        if n in p.read_bytes()
    ]
    assert hits == []


def test_cli_has_every_command() -> None:
    """The installed console script lists the built-in commands and the samplers plugins."""
    script = Path(sys.executable).parent / "llama-cffi"
    assert script.is_file(), script
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120, cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stderr
    for cmd in ("info", "tokenize", "rpc-server", "generate", "demo", "perplexity"):
        assert cmd in out.stdout, (cmd, out.stdout)


def test_entry_points_are_registered() -> None:
    """The pytest plugin and the samplers commands are registered by the distribution."""
    eps = importlib.metadata.entry_points()
    assert "llama_cffi" in {e.name for e in eps.select(group="pytest11")}
    assert {"generate", "demo", "perplexity"} <= {e.name for e in eps.select(group="llama_cffi.commands")}


def test_the_lm_eval_hook_is_installed() -> None:
    """The distribution installs ``llama_cffi-lm-eval.pth`` and the module it imports at the
    top of site-packages (lm-eval's own ``lm_eval --model llama-cffi`` finds the model
    through them: samplers.harness), and it runs at start-up: its meta path finder is in
    this interpreter."""
    # the installed distribution (a source tree's llama_cffi.egg-info may be found too)
    dists = [d for d in importlib.metadata.distributions(name="llama-cffi") if d.files]
    carrying = [d for d in dists if "llama_cffi-lm-eval.pth" in {str(f) for f in d.files or []}]
    assert carrying, [sorted(str(f) for f in d.files or [] if "/" not in str(f)) for d in dists]
    pth = Path(str(carrying[0].locate_file("llama_cffi-lm-eval.pth")))
    assert pth.read_text() == "import _llama_cffi_lm_eval\n"
    assert "_llama_cffi_lm_eval.py" in {str(f) for f in carrying[0].files or []}
    assert "LlamaCffiLmEvalFinder" in [getattr(f, "__name__", "") for f in sys.meta_path]


def test_grammar_features_work_from_the_installed_package(tiny_model: llama_cffi.Model) -> None:
    """samplers.grammar (the subpackage a hand-kept package list once dropped) compiles a
    JSON schema and constrains a real vocabulary."""
    from samplers.grammar import Grammar

    g = Grammar.from_json_schema({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    assert g.accepts('{"a": 12}') and not g.accepts('{"a": "x"}')
    m = g.matcher(tiny_model)
    allowed = m.allowed_tokens().nonzero()[0]
    assert 0 < len(allowed) < tiny_model.n_vocab
    assert all(tiny_model.detokenize([int(t)]).lstrip().startswith("{") for t in allowed[:20])


# ---------------------------------------------------------------------- the benchmark suite
IN_PLACE = (PACKAGE.parent / "setup.py").is_file()  # a development checkout's in-place build


def test_benchmark_suite_ships_with_the_package() -> None:
    """An installed llama_cffi carries the benchmark suite (llama_cffi/_bench: every
    script of the tree byte for byte, the native programs' sources, build_ffi.py and the
    patches the reference tools are built with); an in-place build uses the tree."""
    from llama_cffi.bench import bench_root

    root = bench_root()
    assert root == (PACKAGE.parent if IN_PLACE else PACKAGE / "_bench")
    tree = SOURCE / "benchmarks"
    wanted = [*tree.glob("*.py"), *(tree / "native").glob("*.c*"), SOURCE / "build_ffi.py", *SOURCE.glob("patches/*")]
    assert len(wanted) > 20
    for src in wanted:
        rel = src.relative_to(SOURCE)
        assert (root / rel).is_file(), f"{rel} is missing from {root}"
        assert (root / rel).read_bytes() == src.read_bytes(), f"{rel} differs from the source tree's"
    assert not (root / "benchmarks" / "results").exists() or IN_PLACE


def test_bench_runs_from_the_installed_package(tmp_path: Path) -> None:
    """``llama-cffi bench`` from a folder outside any tree lists the suite, then runs a
    benchmark against its native reference (a C loop, compiled on demand against the
    installed libraries) and writes the report to ./llama-cffi-bench/ (an in-place build:
    to the folder given, not into the tree)."""
    from llama_cffi.bench import bench_root

    script = Path(sys.executable).parent / "llama-cffi"
    listed = subprocess.run([str(script), "bench", "--list"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    line = next(x for x in listed.stdout.splitlines() if x.startswith("decode_overhead"))
    # the installed copy names a benchmark by the command that runs it, not by its path in site-packages
    shown = "benchmarks/decode_overhead.py" if IN_PLACE else "llama-cffi bench --only decode_overhead"
    assert shown in line and (IN_PLACE or str(bench_root()) not in listed.stdout), line
    helped = subprocess.run([str(script), "bench", "--help"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: llama-cffi bench "), helped.stdout[:300]

    args = ["--only", "decode_overhead", "--no-plots", "--quiet-wait", "0"]
    out_dir = tmp_path / "llama-cffi-bench"
    if IN_PLACE:
        args += ["--out-dir", str(out_dir)]

    def bench() -> tuple[dict[str, Any], list[float]]:
        shutil.rmtree(out_dir, ignore_errors=True)
        run = subprocess.run([str(script), "bench", *args], capture_output=True, text=True, timeout=900, cwd=tmp_path)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        (report_path,) = out_dir.glob("*.json")
        assert report_path.with_suffix(".md").is_file()
        report = json.loads(report_path.read_text())
        assert report["ok"] and [r["name"] for r in report["runs"]] == ["decode_overhead"]
        return report, [c["ratio"] for c in report["comparisons"]]

    report, ratios = bench()
    # the command measured both sides and wrote finite ratios (ours / the C loop); their
    # size is the benchmark's to report, not a test's to bound (a loaded machine once made
    # the C loop 200x slower than usual for one run)
    assert len(ratios) == 2 and all(math.isfinite(r) and r > 0 for r in ratios), report["comparisons"]
    if not IN_PLACE:
        assert report["command"].startswith("llama-cffi bench --only decode_overhead")
        assert report["environment"]["suite"].startswith("installed copy")
        assert report["environment"]["git_commit"] == ""
