"""llama-perplexity's evaluation modes (samplers.evals) against llama-perplexity itself,
built from the same llama.cpp source, on files the tests write in its formats."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.bench_evals import multiple_choice_tasks, score_lines, write_winogrande
from benchmarks.bench_many import write_hellaswag
from benchmarks.native_tools import build_llama_tool
from llama_cffi import Model, ParamError
from samplers.evals import (
    MultipleChoiceTask,
    WinograndeTask,
    _draw,
    _draw_swap,
    hellaswag,
    multiple_choice,
    read_hellaswag,
    read_multiple_choice,
    read_winogrande,
    winogrande,
    write_multiple_choice,
)

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


def _run_native(binary: Path, model: Path, *args: str) -> str:
    r = subprocess.run([str(binary), "-m", str(model), *args, "-t", "2"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout + r.stderr


def _run_cli(model: Path, *args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "llama_cffi", "perplexity", "-m", str(model), *args, "-t", "2"],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_winogrande_and_multiple_choice_draws() -> None:
    """Both draw with std::mt19937(1), j = int(float32(rng() * 2^-32) * size), the drawn
    index swapped with the last: the first draw of 16 is int(1791095845 / 2^32 * 16) = 6,
    and the second of the 15 left is int(4282876139 / 2^32 * 15) = 14 (index 14)."""
    assert _draw_swap(16, 2) == [6, 14]
    order = _draw_swap(30, 30)
    assert sorted(order) == list(range(30))


@pytest.mark.default_model
@pytest.mark.slow
def test_winogrande_equals_llama_perplexity(
    llama_perplexity_bin: Path, default_model_path: Path, tmp_path: Path
) -> None:
    """Same model, CSV and settings: every task line llama-perplexity prints (running
    accuracy, the two options' scores to 6 decimals, the choice, the answer), ours prints
    too (function and CLI): the file read as it reads it (header skipped, sentences in
    quotes, its last line left out: write_winogrande ends the file with an empty line),
    fewer tasks than the file's drawn as it draws them (the lines name them: each has
    its tasks' scores), and a sentence whose tail after the option is "." (3 tokens or
    fewer after the shared part: llama.cpp's other rule, its FIXME included) among them."""
    f = write_winogrande(tmp_path / "wg.csv", 10)
    tasks = read_winogrande(f.read_text())
    drawn = _draw_swap(10, 5)
    assert len(tasks) == 10 and drawn == [4, 8, 5, 6, 0]
    assert any(tasks[i].second == "." for i in drawn) and any('""' in tasks[i].first for i in drawn)
    native = _run_native(
        llama_perplexity_bin, default_model_path, "-f", str(f), "--winogrande", "--winogrande-tasks", "5", "-c", "128"
    )  # fmt: skip
    assert "loaded 10 tasks from prompt" in native
    lines = score_lines(native)
    assert len(lines) == 5
    with Model.load(default_model_path) as model:
        ours = winogrande(model, f.read_text(), 5, ctx_size=128, n_threads=2)
    assert ours.running() == lines
    assert [t.index for t in ours.tasks] == drawn
    assert ours.final_lines() == []  # below 100 tasks llama-perplexity prints no final line
    cli = _run_cli(default_model_path, "-f", str(f), "--winogrande", "--winogrande-tasks", "5", "-c", "128")
    assert score_lines(cli) == lines


@pytest.mark.default_model
@pytest.mark.slow
def test_multiple_choice_equals_llama_perplexity(
    llama_perplexity_bin: Path, default_model_path: Path, tmp_path: Path
) -> None:
    """Same model, binary task file (written by write_multiple_choice: 2 to 5 answers a
    task, so -np 5) and settings: the running accuracy lines and the final result and
    random-chance lines agree (function and CLI), over all tasks and over fewer, drawn as
    llama-perplexity draws them (it prints the final lines either way)."""
    tasks = multiple_choice_tasks(6)
    assert sorted({len(t.answers) for t in tasks}) == [2, 3, 4, 5]
    f = tmp_path / "mc.bin"
    f.write_bytes(write_multiple_choice(tasks))
    assert read_multiple_choice(f.read_bytes()) == tasks
    mc = ["-f", str(f), "--multiple-choice", "-c", "128", "-np", "5"]
    with Model.load(default_model_path) as model:
        for n_tasks in (0, 3):
            native = _run_native(llama_perplexity_bin, default_model_path, *mc, "--multiple-choice-tasks", str(n_tasks))
            lines = score_lines(native)
            ours = multiple_choice(model, f.read_bytes(), n_tasks, ctx_size=128, n_parallel=5, n_threads=2)
            assert ours.running() + ours.final_lines() == lines
            assert len(lines) == (n_tasks or 6) + 2 and lines[-2].startswith("Final result: ")
            assert [t.index for t in ours.tasks] == (_draw_swap(6, n_tasks) if n_tasks else list(range(6)))
            assert all(len(t.scores) == len(tasks[t.index].answers) for t in ours.tasks)
            if n_tasks == 0:
                assert score_lines(_run_cli(default_model_path, *mc)) == lines


def test_winogrande_files_are_read_as_llama_perplexity_reads_them() -> None:
    head = "index,sentence,option1,option2,answer\n"
    # the last line is never read (std::getline reaches the end of -f's text there)
    assert len(read_winogrande(head + "0,A _ b.,x,y,1\n1,C _ d.,x,y,2\n")) == 1
    assert len(read_winogrande(head + "0,A _ b.,x,y,1\n1,C _ d.,x,y,2\n\n")) == 2
    (t,) = read_winogrande(head + '7,"Hi, said _ to ""you"".", Ann ,Bob,+2\r\n\n')
    assert t == WinograndeTask("Hi, said ", ' to ""you"".', (" Ann ", "Bob"), 2)
    # 4 commas outside quotes; a sentence starting with a quote loses its first and last character
    (t,) = read_winogrande('0,"a,b" _ c,"x,y",z,1,extra,fields\n\n')
    assert t == WinograndeTask('a,b" ', " ", ('"x,y"', "z"), 1)


def test_winogrande_inputs_are_checked(tiny_model: Model) -> None:
    head = "index,sentence,option1,option2,answer\n"
    with pytest.raises(ParamError, match="line 2: it does not have 5 comma-separated fields"):
        read_winogrande(head + "0,A _ b.,x,y\n\n")
    with pytest.raises(ParamError, match="line 3: the sentence has no _"):
        read_winogrande(head + "0,A _ b.,x,y,1\n1,no blank,x,y,2\n\n")
    with pytest.raises(ParamError, match="line 2: the answer must be 1 or 2, not '3'"):
        read_winogrande(head + "0,A _ b.,x,y,3\n\n")
    with pytest.raises(ParamError, match="the answer must be 1 or 2, not 'one'"):
        read_winogrande(head + "0,A _ b.,x,y,one\n\n")
    with pytest.raises(ParamError, match="no tasks"):
        read_winogrande(head + "0,A _ b.,x,y,1\n")  # its only task is on the last line
    text = head + "0,The cat sat on the _ today.,mat,hat,1\n\n"
    with pytest.raises(ParamError, match="n_tasks must be >= 0"):
        winogrande(tiny_model, text, -1)
    with pytest.raises(ParamError, match=r"task 0 does not fit in the context \(it needs \d+ cells of 256\)"):
        winogrande(tiny_model, [WinograndeTask("word " * 300, " here.", ("x", "y"), 1)], ctx_size=2)
    with pytest.raises(ParamError, match="ctx_size must be >= 1"):
        winogrande(tiny_model, text, ctx_size=0)
    with pytest.raises(ParamError, match="each add a token of its own"):
        winogrande(tiny_model, [WinograndeTask("Same ", ".", ("x", "x"), 1)])
    with pytest.raises(ParamError, match="needs 2 options"):
        winogrande(tiny_model, [WinograndeTask("a ", ".", ("x", "y"), 3)])
    res = winogrande(tiny_model, text, ctx_size=64)
    assert len(res.tasks) == 1 and len(res.running()) == 1 and str(res).startswith("Final Winogrande score(1 tasks)")


def test_multiple_choice_files_are_checked(tiny_model: Model) -> None:
    tasks = [
        MultipleChoiceTask("Q: one", ("yes", "no"), (1, 0), ("a", "b", "c"), (1, 1, 0)),
        MultipleChoiceTask("Q: two \udcff", ("a", "b", "c", "d", "e"), (0, 0, 1, 0, 0)),
    ]
    data = write_multiple_choice(tasks)
    assert read_multiple_choice(data) == tasks  # bytes that are not UTF-8 kept as they are
    assert read_multiple_choice(data + b"\n") == tasks  # trailing bytes ignored
    with pytest.raises(ParamError, match="no tasks: a multiple-choice file starts with its task count"):
        read_multiple_choice(b"\x01\x00")
    with pytest.raises(ParamError, match=r"no tasks \(the file's task count is 0\)"):
        read_multiple_choice(b"\x00\x00\x00\x00")
    with pytest.raises(ParamError, match="the file has 2 tasks but ends before their 2 positions"):
        read_multiple_choice(data[:8])
    with pytest.raises(ParamError, match=r"task 1 \(at byte \d+\): the file ends at byte \d+, inside it"):
        read_multiple_choice(data[:-1])
    bad = bytearray(data)
    bad[8] += 1  # the second task's position
    with pytest.raises(ParamError, match="task 1: its position is byte"):
        read_multiple_choice(bytes(bad))
    many = MultipleChoiceTask("Q", tuple("a" * (i + 1) for i in range(101)), (0,) * 101)
    with pytest.raises(ParamError, match="101 answers"):
        write_multiple_choice([many])
    raw = bytearray(write_multiple_choice([MultipleChoiceTask("Q", ("a",), (1,))]))
    raw[8 + 1 + 4 : 8 + 1 + 8] = (101).to_bytes(4, "little")  # mc1's count
    with pytest.raises(ParamError, match=r"task 0 \(at byte 8\): 101 answers \(llama.cpp reads at most 100\)"):
        read_multiple_choice(bytes(raw))
    with pytest.raises(ParamError, match="has 2 answers and 1 labels"):
        write_multiple_choice([MultipleChoiceTask("Q", ("a", "b"), (1,))])
    with pytest.raises(ParamError, match="n_tasks must be >= 0"):
        multiple_choice(tiny_model, data, -1)
    with pytest.raises(ParamError, match=r"task 1 has 5 answers, one sequence each: it needs n_parallel >= 5"):
        multiple_choice(tiny_model, data)
    with pytest.raises(ParamError, match=r"task 0 does not fit in the context \(it needs \d+ cells of 256\)"):
        multiple_choice(tiny_model, [MultipleChoiceTask("word " * 300, ("a", "b"), (1, 0))], ctx_size=4)
    with pytest.raises(ParamError, match="task 0: answer 1 is empty"):
        multiple_choice(tiny_model, [MultipleChoiceTask("Q", ("a", ""), (1, 0))])
    with pytest.raises(ParamError, match="task 0: the question or the answers are empty"):
        multiple_choice(tiny_model, [MultipleChoiceTask("", ("a", "b"), (1, 0))])
    res = multiple_choice(tiny_model, data, n_parallel=5)
    assert [len(t.scores) for t in res.tasks] == [2, 5]
    assert len(res.final_lines()) == 2 and res.final_lines()[1].startswith("Random chance: 28.5714 +/- ")
    drawn = multiple_choice(tiny_model, data, 1, n_parallel=5)
    assert [t.index for t in drawn.tasks] == _draw_swap(2, 1)
