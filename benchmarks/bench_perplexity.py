"""Perplexity time, value and memory: samplers.perplexity against llama-perplexity.

``python -m samplers.perplexity`` against llama.cpp's ``llama-perplexity`` built from
the same source and options (``native_tools``).

The text is deterministic for a given Python version: the docstrings of a fixed list of
standard-library modules (module, then its public classes and functions in name order,
``inspect.getdoc``), joined until it holds ``--tokens`` tokens of the default model
(its SHA-256 and token count are reported; ``--text FILE`` uses a file instead). Both
commands run on it with the same ``-c``, ``-b`` and ``-t``, each in its own process,
interleaved over ``--rounds`` rounds (which goes first alternates). Reported: the
final estimate of each (they must agree to ``--rtol``, relative, or the script fails,
as tests/test_perplexity.py requires), the medians of

* ``wall``: the whole command (start-up, model load, tokenization, evaluation, exit);
* ``eval``: evaluation only, from the line both print once the text is tokenized
  (``perplexity: calculating perplexity over N chunks``) to the ``Final estimate``
  line, timed as they arrive (ours creates its context in that span, native before it;
  the "seconds per pass" both print differ the same way and more, so they are kept in
  the JSON only);

the ratios ours/native (< 1: ours faster), the peak RSS of each (``os.wait4``) and the
CPU other processes used meanwhile (``other``, in cores: a busy machine, noisy numbers;
before each run the script waits up to ``--quiet-wait`` s for at most ``--max-foreign``,
and runs again, up to ``--retries`` times, after a noisy run or one over ``--run-timeout``).

    python benchmarks/bench_perplexity.py [--rounds 3] [--tokens 3000] [-c 128] [-b 512] [--json PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import llama_cffi  # noqa: E402
from benchmarks.common import ChildRun, command_line, median, quiet_run, run_child, write_json  # noqa: E402
from benchmarks.native_tools import build_llama_tool  # noqa: E402

TOOL = "llama-perplexity"
# pure-Python modules with plenty of prose in their docstrings, in this order
MODULES = (
    "textwrap",
    "string",
    "json",
    "fractions",
    "statistics",
    "heapq",
    "bisect",
    "shlex",
    "difflib",
    "argparse",
    "pathlib",
    "functools",
    "collections",
    "random",
    "calendar",
    "inspect",
    "typing",
)
FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
PER_PASS = re.compile(r"([0-9.]+) seconds per pass")
START = "calculating perplexity over"  # printed by both once the text is tokenized


def docstrings(module_name: str) -> list[str]:
    mod = importlib.import_module(module_name)
    docs = [inspect.getdoc(mod) or ""]
    for name in sorted(getattr(mod, "__all__", None) or dir(mod)):
        if name.startswith("_"):
            continue
        obj = getattr(mod, name, None)
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", None) == module_name:
            doc = inspect.getdoc(obj)
            if doc:
                docs.append(f"{name}: {doc}")
    return [d for d in docs if d.strip()]


def make_text(model: llama_cffi.Model, n_tokens: int) -> str:
    """Standard-library docstrings, whole ones, until the text holds ``n_tokens`` tokens."""
    parts: list[str] = []
    for name in MODULES:
        for doc in docstrings(name):
            parts.append(doc)
            if len(model.tokenize("\n\n".join(parts))) >= n_tokens:
                return "\n\n".join(parts) + "\n"
    text = "\n\n".join(parts) + "\n"
    if len(model.tokenize(text)) < n_tokens:
        raise SystemExit(f"the docstrings of {', '.join(MODULES)} hold fewer than {n_tokens} tokens")
    return text


def parse(run: ChildRun) -> dict[str, float]:
    text = run.stdout + "\n" + run.stderr
    m = FINAL.search(text)
    if not m:
        raise RuntimeError(f"no 'Final estimate' in the output of {' '.join(run.cmd)}:\n{text[-3000:]}")
    p = PER_PASS.search(text)
    t0, t1 = run.line_time(START), run.line_time("Final estimate")
    return {
        "eval_s": t1 - t0 if t0 is not None and t1 is not None else float("nan"),
        "ppl": float(m.group(1)),
        "stderr": float(m.group(2)),
        "seconds_per_pass_s": float(p.group(1)) if p else float("nan"),
        "wall_s": run.wall_s,
        "cpu_s": run.user_s + run.sys_s,
        "peak_rss_kib": float(run.peak_rss_kib),
        "foreign_cores": run.foreign_cores,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=3000, help="size of the generated text, in tokens")
    ap.add_argument("--text", type=Path, help="a text file to use instead of the generated one")
    ap.add_argument("--save-text", type=Path, help="keep the generated text here")
    ap.add_argument("-c", "--ctx-size", type=int, default=128)
    ap.add_argument("-b", "--batch-size", type=int, default=512, help="512: 4 chunks per decode")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--max-foreign", type=float, default=0.15, help="cores other processes may use before a run")
    ap.add_argument("--quiet-wait", type=float, default=10.0, help="seconds to wait for a quiet machine per run")
    ap.add_argument("--retries", type=int, default=2, help="runs again when other processes used more")
    ap.add_argument("--run-timeout", type=float, default=300.0, help="seconds before a run is killed and retried")
    ap.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance of the PPL values")
    ap.add_argument("--json", type=Path, help="also write the results here, as JSON")
    args = ap.parse_args(argv)
    try:
        model_path = Path(llama_cffi.default_model_path())
    except llama_cffi.LlamaError as exc:
        print(f"skipped: {exc}")
        return 0
    tool = build_llama_tool(TOOL)
    tmp = tempfile.TemporaryDirectory()
    with llama_cffi.Model.load(model_path) as model:
        if args.text:
            path = args.text
            data = path.read_bytes()
            source = str(path)
        else:
            data = make_text(model, args.tokens).encode()
            path = args.save_text or Path(tmp.name) / "stdlib-docstrings.txt"
            path.write_bytes(data)
            source = f"docstrings of Python {sys.version.split()[0]}'s {', '.join(MODULES)}"
        n_tokens = len(model.tokenize(data[:-1] if data.endswith(b"\n") else data))
    sha = hashlib.sha256(data).hexdigest()
    common = ["-m", str(model_path), "-f", str(path), "-c", str(args.ctx_size), "-b", str(args.batch_size)]
    common += ["-t", str(args.threads)]
    cmds = {"native": [str(tool), *common], "ours": [sys.executable, "-m", "samplers.perplexity", *common]}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    print(f"text: {source}; {len(data)} bytes, {n_tokens} tokens, sha256 {sha[:16]}")
    print(f"native: {' '.join(cmds['native'])}")
    print(f"ours:   {' '.join(cmds['ours'])}", flush=True)

    res: dict[str, list[dict[str, float]]] = {"native": [], "ours": []}
    for r in range(args.rounds):
        for side in ("native", "ours") if r % 2 == 0 else ("ours", "native"):
            run = quiet_run(
                lambda: run_child(cmds[side], cwd=ROOT, env=env, timeout=args.run_timeout),  # noqa: B023
                max_cores=args.max_foreign,
                quiet_wait=args.quiet_wait,
                retries=args.retries,
                label=side,
            ).check()
            res[side].append(parse(run))
        n, o = res["native"][-1], res["ours"][-1]
        print(
            f"round {r + 1}: native PPL {n['ppl']:.4f} in {n['wall_s']:.2f} s (eval {n['eval_s']:.2f} s)  "
            f"ours PPL {o['ppl']:.4f} in {o['wall_s']:.2f} s (eval {o['eval_s']:.2f} s)  "
            f"other load {max(n['foreign_cores'], o['foreign_cores']):.2f} cores",
            flush=True,
        )

    def med(side: str, key: str) -> float:
        return median([d[key] for d in res[side]])

    out: dict[str, Any] = {}
    for side in ("native", "ours"):
        out[side] = {
            "ppl": res[side][-1]["ppl"],
            "stderr": res[side][-1]["stderr"],
            "wall_s": med(side, "wall_s"),
            "eval_s": med(side, "eval_s"),
            "seconds_per_pass_s": med(side, "seconds_per_pass_s"),
            "peak_rss_kib": max(d["peak_rss_kib"] for d in res[side]),
            "samples": res[side],
        }
    n, o = out["native"], out["ours"]
    # the largest relative difference between any run of ours and any native run
    rel = max(abs(a["ppl"] - b["ppl"]) / b["ppl"] for a in res["ours"] for b in res["native"])
    match = rel <= args.rtol
    print()
    print(
        f"perplexity of {n_tokens} tokens, -c {args.ctx_size} -b {args.batch_size} -t {args.threads}, "
        f"medians of {args.rounds} interleaved rounds; load average {os.getloadavg()[0]:.2f}"
    )
    print(f"{'':19} {'PPL':>10} {'+/-':>9} {'wall s':>8} {'eval s':>8} {'peak RSS':>10} {'other':>6}")
    for side, label in (("native", TOOL), ("ours", "samplers.perplexity")):
        d = out[side]
        other = median([x["foreign_cores"] for x in res[side]])
        print(
            f"{label:19} {d['ppl']:>10.4f} {d['stderr']:>9.5f} {d['wall_s']:>8.2f} {d['eval_s']:>8.2f} "
            f"{d['peak_rss_kib'] / 1024:>6.0f} MiB {other:>6.2f}"
        )
    ratios = {
        "wall": o["wall_s"] / n["wall_s"],
        "eval": o["eval_s"] / n["eval_s"],
        "peak_rss": o["peak_rss_kib"] / n["peak_rss_kib"],
        "ppl": o["ppl"] / n["ppl"],
    }
    print(
        f"ours/native: wall {ratios['wall']:.3f}, eval {ratios['eval']:.3f}, "
        f"peak RSS {ratios['peak_rss']:.3f}; PPL relative difference {rel:.2e} "
        f"({'match' if match else 'MISMATCH'}, rtol {args.rtol:g})"
    )
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "bench_perplexity",
                "command": command_line(sys.argv[1:] if argv is None else argv),
                "config": {
                    "rounds": args.rounds,
                    "ctx_size": args.ctx_size,
                    "batch_size": args.batch_size,
                    "threads": args.threads,
                    "rtol": args.rtol,
                    "max_foreign": args.max_foreign,
                    "quiet_wait": args.quiet_wait,
                    "retries": args.retries,
                    "run_timeout": args.run_timeout,
                },
                "text": {"source": source, "bytes": len(data), "tokens": n_tokens, "sha256": sha},
                "commands": {k: " ".join(v) for k, v in cmds.items()},
                "native": n,
                "ours": o,
                "ratios": ratios,
                "ppl_rel_diff": rel,
                "ppl_match": match,
            },
        )
    tmp.cleanup()
    return 0 if match else 1


if __name__ == "__main__":
    raise SystemExit(main())
