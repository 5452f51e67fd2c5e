"""Winogrande and multiple choice: ``llama-perplexity --winogrande`` / ``--multiple-choice``
against ``python -m samplers.perplexity`` with the same flags (samplers.evals).

Both read files this script writes in llama.cpp's formats: a Winogrande CSV
(``index,sentence,option1,option2,answer``, sentences with a comma in double quotes, as
``winogrande-debiased-eval.csv``) and a binary multiple-choice file (2 to 5 answers a
task, written by :func:`samplers.evals.write_multiple_choice`). Each run is a whole
process (model load included on both sides), ours and llama-perplexity alternating
round by round; the table has the medians of wall-clock and CPU (user + system) seconds
and their ratios ours / llama-perplexity (below 1.0 ours is faster), and the CPU other
processes used meanwhile (``common.run_child``'s reading: on a shared 2-core machine the
wall-clock times follow that load). The score lines each prints (one per task, then the final ones)
must agree.

Usage: ``python benchmarks/bench_evals.py [--winogrande-tasks 100]
[--multiple-choice-tasks 50] [--rounds 3] [--threads 2] [-c 512] [-np 8] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import random
import re
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks import common  # noqa: E402

NAMES = ["Sarah", "Maria", "John", "Kevin", "Emily", "Rachel", "Derrick", "Jason", "Monica", "Lindsey", "Tom", "Ann"]
#: (sentence with {a}, {b} and the _, which of a/b is right)
PEOPLE = [
    ("{a} was a much better surgeon than {b} so _ always got the easier cases.", 2),
    ("{a} asked {b} for help with the homework, because _ was good at math.", 2),
    ("{a} gave {b} a present, since it was _'s birthday that day.", 2),
    ("{a} could not lift the heavy box but {b} could, because _ was stronger.", 2),
    ("{a} apologized to {b} after _ broke the vase in the hall.", 1),
    ("{a} was jealous of {b}, so the one who won the prize was _.", 2),
    ("{a} lent money to {b} because _ was rich and generous.", 1),
    ("{a} thanked {b} for the ride home, as _ had driven all night.", 2),
    ('{a} told {b} "good luck" before the race, but _ still lost it.', 2),
]
#: (sentence, option 1, option 2, answer)
THINGS = [
    ("The trophy doesn't fit into the brown suitcase because the _ is too large.", "trophy", "suitcase", 1),
    ("I poured water from the bottle into the cup until the _ was full.", "bottle", "cup", 2),
    ("The ball broke the window, so the _ had to be replaced.", "ball", "window", 2),
    ("The sculpture rolled off the shelf because the _ wasn't anchored.", "sculpture", "shelf", 1),
    ("The man couldn't lift his son because the _ was so heavy.", "man", "son", 2),
    ("The cat chased the mouse so the one that ran away was the _.", "cat", "mouse", 2),
    ("The lawyer asked the witness a question, but the _ was reluctant to answer it.", "lawyer", "witness", 2),
    ("The new phone was cheaper than the old laptop, so we bought the _ for the kids.", "new phone", "old laptop", 1),
]


def _csv_field(s: str) -> str:
    return '"' + s.replace('"', '""') + '"' if ("," in s or '"' in s) else s


def write_winogrande(path: Path, n: int, seed: int = 0) -> Path:
    """``n`` Winogrande-like tasks in the CSV layout llama.cpp reads (a header; a sentence
    with a comma or a quote in double quotes). The file ends with an empty line, so that
    llama-perplexity reads all ``n`` rows (it never reads the last line of its ``-f``
    text)."""
    rng = random.Random(seed)
    lines = ["index,sentence,option1,option2,answer"]
    for i in range(n):
        if rng.random() < 0.5:
            sentence, answer = PEOPLE[rng.randrange(len(PEOPLE))]
            a, b = rng.sample(NAMES, 2)
            sentence, options = sentence.format(a=a, b=b), (a, b)
        else:
            sentence, o1, o2, answer = THINGS[rng.randrange(len(THINGS))]
            options = (o1, o2)
        if rng.random() < 0.5:  # the options in the other order
            options, answer = (options[1], options[0]), 3 - answer
        lines.append(f"{i},{_csv_field(sentence)},{options[0]},{options[1]},{answer}")
    path.write_text("\n".join(lines) + "\n\n")
    return path


#: (question, right answer, wrong answers)
QUESTIONS = [
    ("What do people use to cut paper?", "scissors", ["a spoon", "a pillow", "the moon", "a glass of milk"]),
    ("Which animal has a very long neck?", "the giraffe", ["the penguin", "the snail", "the goldfish", "the ant"]),
    ("What is the boiling point of water at sea level?", "100 degrees Celsius", ["5 degrees", "a Tuesday", "blue"]),
    ("Where does the sun rise?", "in the east", ["in the west", "under the sea", "inside a box", "in the fridge"]),
    ("What do bees make?", "honey", ["steel", "plastic bags", "thunder", "newspapers"]),
    ("Which season comes after winter?", "spring", ["autumn", "the weekend", "breakfast", "a holiday"]),
    ("What is the capital of France?", "Paris", ["Berlin", "Tokyo", "a small village", "the ocean"]),
    ("How many legs does a spider have?", "eight", ["two", "three", "one hundred", "none"]),
    ("What do plants need to grow?", "sunlight and water", ["loud music", "plastic", "darkness and salt"]),
    ("Which instrument has black and white keys?", "the piano", ["the drum", "the trumpet", "the flute", "a violin"]),
]


def multiple_choice_tasks(n: int, seed: int = 0) -> list[Any]:
    """``n`` ARC-like tasks (``Question: ...\\nAnswer:``), 2 to 5 answers each, one right."""
    from samplers.evals import MultipleChoiceTask

    rng = random.Random(seed)
    tasks = []
    for _ in range(n):
        q, right, wrong = QUESTIONS[rng.randrange(len(QUESTIONS))]
        k = rng.randint(1, min(4, len(wrong)))
        answers = [right, *rng.sample(wrong, k)]
        rng.shuffle(answers)
        labels = tuple(int(a == right) for a in answers)
        tasks.append(MultipleChoiceTask(f"Question: {q}\nAnswer:", tuple(answers), labels))
    return tasks


def write_multiple_choice_file(path: Path, n: int, seed: int = 0) -> Path:
    """:func:`multiple_choice_tasks` written in llama.cpp's binary layout."""
    from samplers.evals import write_multiple_choice

    path.write_bytes(write_multiple_choice(multiple_choice_tasks(n, seed)))
    return path


#: the lines both print: a task's line (Winogrande: N, acc, two scores, chosen, answer;
#: multiple choice: N, acc) and the final ones
SCORE_LINE = re.compile(
    r"^(?:\d+\t[\d.]+\t +-?[\d.]+ +-?[\d.]+  \d  \d|\d+\t[\d.]+)$"
    r"|(?:Final Winogrande score\(\d+ tasks\)|Final result|Random chance): .*$",
    re.M,
)


def score_lines(text: str) -> list[str]:
    """The task and final lines in a run's output (llama.cpp's log prefix left out)."""
    return [m.group(0) for m in SCORE_LINE.finditer(text)]


def run_mode(
    model: Path, mode: str, n_tasks: int, threads: int, rounds: int, ctx_size: int, n_parallel: int
) -> dict[str, Any]:
    """One mode (``winogrande`` or ``multiple-choice``), ``rounds`` runs of each command,
    alternating; wall-clock of each whole process; whether their score lines agree."""
    from benchmarks import native_tools

    binary = native_tools.build_llama_tool("llama-perplexity")
    out: dict[str, Any] = {"mode": mode, "tasks": n_tasks, "native": [], "ours": [], "cpu": {}, "foreign": {}}
    with tempfile.TemporaryDirectory() as tmp:
        if mode == "winogrande":
            f = write_winogrande(Path(tmp) / "wg.csv", n_tasks)
        else:
            f = write_multiple_choice_file(Path(tmp) / "mc.bin", n_tasks)
        args = ["-m", str(model), "-f", str(f), f"--{mode}", "-c", str(ctx_size), "-np", str(n_parallel)]
        args += ["-t", str(threads)]
        cmds = {"native": [str(binary), *args], "ours": [sys.executable, "-m", "samplers.perplexity", *args]}
        lines: dict[str, list[str]] = {}
        for r in range(rounds):
            for who in ("ours", "native") if r % 2 == 0 else ("native", "ours"):
                run = common.run_child(cmds[who], cwd=HERE.parent, timeout=3600).check()
                out[who].append(run.wall_s)
                out["cpu"].setdefault(who, []).append(run.user_s + run.sys_s)
                out["foreign"].setdefault(who, []).append(run.foreign_cores)
                lines[who] = score_lines(run.stdout + run.stderr)
                print(
                    f"# {mode} round {r} {who}: {run.wall_s:.2f} s wall, {run.user_s + run.sys_s:.2f} s CPU, "
                    f"other processes {run.foreign_cores:.2f} cores",
                    file=sys.stderr,
                    flush=True,
                )
        out["same_lines"] = lines["ours"] == lines["native"] and len(lines["ours"]) >= n_tasks
        out["final"] = [x for x in lines["native"] if not x[:1].isdigit()]
        out["commands"] = {k: shlex.join(v) for k, v in cmds.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--winogrande-tasks", type=int, default=100, help="0: leave Winogrande out")
    ap.add_argument("--multiple-choice-tasks", type=int, default=50, help="0: leave multiple choice out")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-c", "--ctx-size", type=int, default=512)
    ap.add_argument("-np", "--parallel", type=int, default=8, help="-np of both (multiple choice needs >= 5)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    import llama_cffi

    model = Path(llama_cffi.default_model_path())
    rows = []
    for mode, n in (("winogrande", args.winogrande_tasks), ("multiple-choice", args.multiple_choice_tasks)):
        if n > 0:
            rows.append(run_mode(model, mode, n, args.threads, args.rounds, args.ctx_size, args.parallel))
    print(
        f"model {model.name}, -c {args.ctx_size} -np {args.parallel} -t {args.threads}, whole processes "
        f"(model load included), medians of {args.rounds} alternating rounds"
    )
    print(
        "| mode | tasks | ours wall s | llama-perplexity wall s | ratio | ours CPU s | llama-perplexity CPU s "
        "| ratio | other load (cores) | same score lines | final |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for row in rows:
        o, n = common.median(row["ours"]), common.median(row["native"])
        oc, nc = common.median(row["cpu"]["ours"]), common.median(row["cpu"]["native"])
        load = common.median(row["foreign"]["ours"] + row["foreign"]["native"])
        row["ratio"], row["cpu_ratio"] = o / n, oc / nc
        print(
            f"| {row['mode']} | {row['tasks']} | {o:.2f} | {n:.2f} | {o / n:.2f} | {oc:.2f} | {nc:.2f} | {oc / nc:.2f} "
            f"| {load:.2f} | {row['same_lines']} | {'; '.join(row['final'])} |"
        )
    for row in rows:
        for who, cmd in row["commands"].items():
            print(f"{row['mode']} {who}: {cmd}")
    if args.json:
        common.write_json(args.json, {"rows": rows, "args": vars(args) | {"json": str(args.json)}})
    return 0 if all(r["same_lines"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
