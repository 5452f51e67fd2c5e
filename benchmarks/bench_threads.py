"""Token decode time under each thread policy, alone and beside a busy process: median
and p99 ms a token (issue 44 item 7).

Policies (each in a fresh process, on the default model, one token per ``llama_decode``
after a short prompt, ``--tokens`` tokens):

* ``default``: ``Context(model)`` as it comes: the process's shared thread pool and the
  adaptive thread count (:mod:`llama_cffi.threadpool`);
* ``no-pool``: ``n_threads`` = the cores, no pool: llama.cpp's own default (each decode
  starts and joins its worker threads), what a context did before pools;
* ``pool``: ``n_threads`` = the cores on a persistent pool, fixed (as ``llama-bench`` runs);
* ``one``: ``n_threads=1`` (fixed).

Conditions: ``alone``; ``busy``: one other process spinning on a core for the whole run
(``python -c "while True: pass"``), started before the child; ``pair``: two contexts of
the policy in one process, decoding at once from two threads (every token of both
counted). Policies rotate over
``--rounds`` rounds; the report gives, per policy and condition, the median and p99 over
all tokens of all rounds, and the per-round median.

    python benchmarks/bench_threads.py [--tokens 300] [--rounds 3] [--policies default,no-pool,pool,one]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import command_line, cpu_cores, cpu_model, write_json  # noqa: E402

POLICIES = ("default", "no-pool", "pool", "one")

CHILD = r"""
import json, sys, threading, time
from llama_cffi import Context, Model
from llama_cffi.context_params import available_cores
from llama_cffi.default_model import default_model_path

policy, n, pair = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "pair"
model = Model.load(default_model_path())
cores = available_cores()


def make():
    if policy == "default":
        return Context(model, n_ctx=1024)
    if policy == "one":
        return Context(model, n_ctx=1024, n_threads=1, n_threads_batch=1)
    ctx = Context(model, n_ctx=1024, n_threads=cores, n_threads_batch=cores)
    if policy == "no-pool":
        ctx.detach_threadpool()
    return ctx


out = {"ms": [], "drops": 0, "raises": 0}


def work():
    ctx = make()
    ctx.decode(model.tokenize("The quick brown fox jumps over the lazy dog. Once upon a time"))
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        ctx.decode_single(100 + (i * 7) % 1000)
        times.append((time.perf_counter() - t0) * 1e3)
    gov = ctx.adaptive_threads
    out["ms"] += times
    out["drops"] += gov.drops if gov else 0
    out["raises"] += gov.raises if gov else 0


threads = [threading.Thread(target=work) for _ in range(2 if pair else 1)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(out))
"""

CONDITIONS = ("alone", "busy", "pair")


def run(policy: str, cond: str, tokens: int) -> dict[str, object]:
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if cond == "busy" else None
    try:
        if spinner is not None:
            time.sleep(0.2)
        r = subprocess.run(
            [sys.executable, "-c", CHILD, policy, str(tokens), cond], capture_output=True, text=True, timeout=900
        )
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    if r.returncode != 0:
        raise RuntimeError(f"{policy} {cond} failed:\n{r.stderr[-3000:]}")
    out: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def p99(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(0.99 * len(s)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--json", type=Path, default=None, help="write every number here")
    args = ap.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    for p in policies:
        if p not in POLICIES:
            ap.error(f"unknown policy {p!r}; known: {', '.join(POLICIES)}")
    res: dict[str, dict[str, list[dict[str, object]]]] = {p: {c: [] for c in CONDITIONS} for p in policies}
    for r in range(args.rounds):
        order = policies[r % len(policies) :] + policies[: r % len(policies)]
        for cond in CONDITIONS:
            for p in order:
                out = run(p, cond, args.tokens)
                res[p][cond].append(out)
                ms = out["ms"]
                assert isinstance(ms, list)
                print(
                    f"round {r + 1} {cond:5s} {p:8s} median {statistics.median(ms):6.2f} p99 {p99(ms):7.2f} ms "
                    f"(drops {out['drops']}, raises {out['raises']})",
                    flush=True,
                )
    print(f"\n{cpu_model()}, {cpu_cores()} cores; {args.tokens} tokens x {args.rounds} rounds per cell")
    print(f"{'policy':9s}" + "".join(f" {c + ' median':>13s} {'p99':>7s} {'max':>7s}" for c in CONDITIONS))
    summary: dict[str, dict[str, float]] = {}
    for p in policies:
        row = {}
        for cond in CONDITIONS:
            allms = [x for o in res[p][cond] for x in o["ms"]]  # type: ignore[union-attr]
            row[f"{cond}_median"] = statistics.median(allms)
            row[f"{cond}_p99"] = p99(allms)
            row[f"{cond}_max"] = max(allms)
        summary[p] = row
        print(
            f"{p:9s}"
            + "".join(f" {row[c + '_median']:13.2f} {row[c + '_p99']:7.2f} {row[c + '_max']:7.2f}" for c in CONDITIONS)
        )
    if args.json is not None:
        write_json(
            args.json,
            {"command": command_line(sys.argv), "cpu": cpu_model(), "summary": summary, "runs": res},
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
