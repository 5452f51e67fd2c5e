"""The documentation: its examples run, its generated tables are current, and the site
builds with every cross-reference resolved (``sphinx-build -W -n``).

What counts as an example and how it runs: :mod:`tests.doc_examples`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.doc_examples import ROOT, Block, all_blocks, check_static, run_page

BLOCKS = all_blocks()
RUNNABLE: dict[str, list[Block]] = defaultdict(list)
for _b in BLOCKS:
    if _b.not_run is None and _b.kind in ("python", "shell"):
        RUNNABLE[_b.page].append(_b)


@pytest.mark.slow
@pytest.mark.default_model
@pytest.mark.parametrize("page", sorted(RUNNABLE))
def test_page_examples_run(page: str) -> None:
    """Every runnable example of the page runs without an error, in order, in a fresh
    interpreter (the examples assert what they show)."""
    r = run_page(RUNNABLE[page])
    assert r.returncode == 0, f"{page}: an example failed\n{r.stdout[-6000:]}\n{r.stderr[-6000:]}"
    assert "== all examples ran" in r.stdout


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{b.where}-{b.kind}" for b in BLOCKS])
def test_block_is_well_formed(block: Block) -> None:
    """Every block compiles or parses, run or not; a block that is not run says why."""
    check_static(block)
    if block.not_run is not None:
        assert len(block.not_run) >= 10, f"{block.where}: 'not run:' needs a reason a reader can act on"


def test_examples_are_found() -> None:
    """The collector sees the README and the guide: most examples run, few are exempt."""
    runnable = sum(len(v) for v in RUNNABLE.values())
    exempt = [b for b in BLOCKS if b.not_run is not None and b.kind in ("python", "shell")]
    assert "README.md" in RUNNABLE
    assert runnable >= 40, runnable
    assert len(exempt) <= runnable // 4, [b.where for b in exempt]


def test_generated_docs_are_current() -> None:
    """docs/api.md, the error catalogue, the CLI reference and the benchmark summary equal
    what ``docs/generate.py`` writes from the installed packages and the committed reports."""
    r = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "generate.py"), "--check"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr + r.stdout


def docs_extra_closure() -> set[str]:
    """The distributions ``pip install 'llama-cffi[docs]'`` installs (canonical names):
    llama-cffi, its requirements and its ``docs`` extra, and theirs, recursively, read from
    the installed metadata with the markers evaluated."""
    import importlib.metadata as md

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    todo: list[tuple[str, frozenset[str]]] = [("llama-cffi", frozenset({"docs"}))]
    seen: dict[str, frozenset[str]] = {}
    while todo:
        name, extras = todo.pop()
        key = canonicalize_name(name)
        if key in seen and extras <= seen[key]:
            continue
        seen[key] = seen.get(key, frozenset()) | extras
        try:
            requires = md.distribution(name).requires or []
        except md.PackageNotFoundError:
            continue  # a marker-selected requirement not installed here: nothing of it to allow
        for text in requires:
            req = Requirement(text)
            envs = [{"extra": e} for e in (extras or {""})]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((req.name, frozenset(req.extras)))
    return set(seen)


def modules_outside_the_docs_extra() -> set[str]:
    """Top-level modules of this environment's distributions that ``llama-cffi[docs]``
    would not install (the test extra's gguf, ray, pydantic, ...): a docs build must not
    need them."""
    import importlib.metadata as md

    from packaging.utils import canonicalize_name

    allowed = docs_extra_closure()
    return {
        mod
        for mod, dists in md.packages_distributions().items()
        if not any(canonicalize_name(d) in allowed for d in dists)
    }


#: Runs sphinx with the modules of ``argv[1]`` (a JSON list) unimportable, as in a venv
#: with only the docs extra.
SPHINX_WITHOUT = """
import importlib.abc, json, sys
blocked = set(json.loads(sys.argv[1]))
class NotInTheDocsExtra(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r} (llama-cffi[docs] does not install it)", name=name)
        return None
sys.meta_path.insert(0, NotInTheDocsExtra())
from sphinx.cmd.build import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow
def test_sphinx_build_strict(tmp_path: Path) -> None:
    """The site builds with warnings as errors and nitpicky cross-references, from a copy of
    ``docs/`` (the API pages are generated from the installed packages' docstrings), with
    only what the ``docs`` extra installs importable: every other distribution of this
    environment (gguf, ray, pydantic, the default model...) is blocked, as in a fresh
    ``pip install 'llama-cffi[docs]'`` (``tests/run_installed.py`` builds it there too)."""
    import sphinx  # noqa: F401 - the docs extra is part of the test extra: missing is a failure, not a skip

    blocked = modules_outside_the_docs_extra()
    assert "gguf" in blocked and "sphinx" not in blocked and "llama_cffi" not in blocked, sorted(blocked)
    src = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", src, ignore=shutil.ignore_patterns("_build", "api"))
    argv = ["-W", "--keep-going", "-n", "-q", "-b", "html", str(src), str(tmp_path / "o")]
    r = subprocess.run(
        [sys.executable, "-c", SPHINX_WITHOUT, json.dumps(sorted(blocked)), *argv],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-8000:]
    html = (tmp_path / "o" / "index.html").read_text(encoding="utf-8")
    assert "llama_cffi" in html
    api = tmp_path / "o" / "api"
    assert (api / "llama_cffi.context.html").is_file() and (api / "samplers.branch.html").is_file()
    # the test kit's pages describe the state machines' rules and the plugin's fixtures
    testing = (api / "llama_cffi.testing.html").read_text(encoding="utf-8")
    assert 'id="llama_cffi.testing.KvCacheMachine.seq_state_round_trip"' in testing
    assert 'id="llama_cffi.pytest_plugin.tiny_model"' in (api / "llama_cffi.pytest_plugin.html").read_text()


def test_docs_import_no_private_module(tmp_path: Path) -> None:
    """``docs/conf.py`` imports the packages it walks, never a module: the build imports
    what it documents (public modules), and private ones may need what the docs extra
    does not install (the test kit's state machine imports hypothesis)."""
    code = (
        "import runpy, sys\n"
        f"sys.path.insert(0, {str(ROOT / 'docs')!r})\n"
        f"runpy.run_path({str(ROOT / 'docs' / 'conf.py')!r})\n"
        "print(sorted(m for m in sys.modules if m.endswith(('_kv_machine', '_branch_machine'))))\n"
        "print('hypothesis' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == ["[]", "False"]
