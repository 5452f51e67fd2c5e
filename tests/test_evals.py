"""llama-perplexity's evaluation modes (samplers.evals) against llama-perplexity itself,
built from the same llama.cpp source, on files the tests write in its formats."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.bench_many import write_hellaswag
from benchmarks.native_tools import build_llama_tool
from llama_cffi import Model, ParamError
from samplers.evals import _draw, hellaswag, read_hellaswag

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def llama_perplexity_bin() -> Path:
    return build_llama_tool("llama-perplexity")


def test_task_draws_follow_std_mt19937() -> None:
    """llama-perplexity draws with std::mt19937(1) and uniform_int_distribution; the
    first values of that generator are known (C++ reference: 1791095845, 4282876139)."""
    from samplers.evals import _MT19937

    g = _MT19937(1)
    assert [g(), g()] == [1791095845, 4282876139]
    order = _draw(50, 50)
    assert sorted(order) == list(range(50))  # each task once


@pytest.mark.default_model
@pytest.mark.slow
def test_hellaswag_equals_llama_perplexity(
    llama_perplexity_bin: Path, default_model_path: Path, tmp_path: Path
) -> None:
    """Same model, file and settings: every running accuracy line llama-perplexity
    prints, ours prints too (tasks drawn in the same order, the same endings chosen)."""
    f = write_hellaswag(tmp_path / "hs.txt", 14)
    n_tasks = 10
    r = subprocess.run(
        [str(llama_perplexity_bin), "-m", str(default_model_path), "-f", str(f), "--hellaswag",
         "--hellaswag-tasks", str(n_tasks), "-c", "128", "-t", "2"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    native = re.findall(r"^(\d+\t[\d.]+%\t\[[\d.]+%, [\d.]+%\])$", r.stdout + r.stderr, re.M)
    assert len(native) == n_tasks
    with Model.load(default_model_path) as model:
        ours = hellaswag(model, f.read_text(), n_tasks, ctx_size=128, n_threads=2)
    assert ours.running() == native
    cli = subprocess.run(
        [sys.executable, "-m", "llama_cffi", "perplexity", "-m", str(default_model_path), "-f", str(f), "--hellaswag",
         "--hellaswag-tasks", str(n_tasks), "-c", "128", "-t", "2"],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert re.findall(r"^(\d+\t[\d.]+%\t\[[\d.]+%, [\d.]+%\])$", cli.stdout, re.M) == native
    assert len({t.index for t in ours.tasks}) == n_tasks
    assert all(len(t.scores) == 4 and all(s < 0 for s in t.scores) for t in ours.tasks)


def test_hellaswag_files_are_checked(tiny_model: Model) -> None:
    with pytest.raises(ParamError, match="6 lines per task"):
        read_hellaswag("context\n0\na\nb\nc\n")
    with pytest.raises(ParamError, match="must be an integer"):
        read_hellaswag("context\nx\na\nb\nc\nd\n")
    with pytest.raises(ParamError, match=r"0\.\.3"):
        read_hellaswag("context\n4\na\nb\nc\nd\n")
    with pytest.raises(ParamError, match="n_tasks"):
        hellaswag(tiny_model, "context\n1\na\nb\nc\nd\n", 0)
