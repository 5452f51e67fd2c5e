"""The documentation: its examples run, its generated tables are current, and the site
builds with every cross-reference resolved (``sphinx-build -W -n``).

What counts as an example and how it runs: :mod:`tests.doc_examples`.
"""

from __future__ import annotations

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


@pytest.mark.slow
def test_sphinx_build_strict(tmp_path: Path) -> None:
    """The site builds with warnings as errors and nitpicky cross-references, from a copy of
    ``docs/`` (the API pages are generated from the installed packages' docstrings)."""
    import sphinx  # noqa: F401 - the docs extra is part of the test extra: missing is a failure, not a skip

    src = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", src, ignore=shutil.ignore_patterns("_build", "api"))
    r = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html", str(src), str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-8000:]
    html = (tmp_path / "o" / "index.html").read_text(encoding="utf-8")
    assert "llama_cffi" in html
    api = tmp_path / "o" / "api"
    assert (api / "llama_cffi.context.html").is_file() and (api / "samplers.branch.html").is_file()
