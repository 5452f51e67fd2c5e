"""Host overhead of ``Context.decode_single`` + ``logits()`` against the same loop in C.

Both loops decode one token at a time (fixed token ids, so the work is identical) on the
same model with the same threads, using llama.cpp built once (llama_cffi's cached build).
Runs are interleaved (native, python, native, ...) and each reports the median time per
step; the script prints medians over rounds, the overhead in microseconds and the ratio.

    python benchmarks/decode_overhead.py [--rounds 5] [--steps 200] [--threads 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import command_line, run_child, write_json  # noqa: E402
from benchmarks.native_tools import build_c_tool  # noqa: E402

PY_LOOP = r"""
import sys, time, numpy as np, llama_cffi
path, n_steps, n_threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
m = llama_cffi.Model.load(path)
ctx = m.context(n_ctx=n_steps + 64, n_threads=n_threads, n_threads_batch=n_threads)
n_vocab = m.n_vocab
dt = []
sink = 0.0
for i in range(n_steps):
    tok = (i * 7919 + 11) % n_vocab
    t0 = time.perf_counter()
    ctx.decode_single(tok, pos=i)
    lg = ctx.logits()
    sink += float(np.asarray(lg)[0])
    dt.append((time.perf_counter() - t0) * 1e6)
print("%.3f %.3f" % (sorted(dt)[n_steps // 2], sum(dt) / n_steps))
"""


def run(cmd: list[str], rss: list[int]) -> float:
    """The loop's median us/step; its peak RSS (KiB) is appended to ``rss``."""
    r = run_child(cmd, cwd=ROOT).check()
    rss.append(r.peak_rss_kib)
    return float(r.stdout.split()[0])


def measure(model: Path, rounds: int, steps: int, threads: int) -> dict[str, Any]:
    native = build_c_tool("decode_loop")
    nat: list[float] = []
    py: list[float] = []
    nat_rss: list[int] = []
    py_rss: list[int] = []
    for _ in range(rounds):
        nat.append(run([str(native), str(model), str(steps), str(threads)], nat_rss))
        py.append(run([sys.executable, "-c", PY_LOOP, str(model), str(steps), str(threads)], py_rss))
    n, p = statistics.median(nat), statistics.median(py)
    return {
        "native_us": n,
        "python_us": p,
        "overhead_us": p - n,
        "ratio": p / n,
        "native_peak_rss_kib": max(nat_rss),
        "python_peak_rss_kib": max(py_rss),
        "samples": {"native_us": nat, "python_us": py},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", nargs="*", default=["tiny", "default"])
    ap.add_argument("--json", type=Path, help="also write the results here, as JSON")
    a = ap.parse_args(argv)
    import llama_cffi
    from llama_cffi.testing import write_tiny_model

    paths: dict[str, Path] = {}
    tmp = tempfile.TemporaryDirectory()
    if "tiny" in a.models:
        paths["tiny (random 0.1M params, vocab 474)"] = write_tiny_model(Path(tmp.name) / "tiny.gguf")
    if "default" in a.models:
        paths["gemma3-270m Q4_K_M (vocab 262144)"] = llama_cffi.default_model_path()
    print(
        f"decode_single + logits(): median us/token over {a.rounds} interleaved rounds of {a.steps} steps, "
        f"{a.threads} threads"
    )
    print(f"{'model':40} {'native':>10} {'llama_cffi':>11} {'overhead':>10} {'ratio':>7}")
    rows: list[dict[str, Any]] = []
    for name, path in paths.items():
        r = measure(path, a.rounds, a.steps, a.threads)
        rows.append({"model": name, **r})
        print(
            f"{name:40} {r['native_us']:>9.1f}u {r['python_us']:>10.1f}u {r['overhead_us']:>9.1f}u {r['ratio']:>7.3f}"
        )
    if a.json:
        write_json(
            a.json,
            {
                "benchmark": "decode_overhead",
                "command": command_line(sys.argv[1:] if argv is None else argv),
                "config": {"rounds": a.rounds, "steps": a.steps, "threads": a.threads, "models": a.models},
                "native_program": "benchmarks/native/decode_loop.c",
                "rows": rows,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
