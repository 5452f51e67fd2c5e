"""Two installs of llama_cffi against each other: greedy tokens/s, the sampler-chain step
and import time, rounds interleaved in one run.

Made for "the installed wheel must not be slower than the build it replaces": pass the
interpreter of a venv with the wheel (``--candidate``) and one with the other build
(``--baseline``, e.g. an editable install of an older commit). Each side runs in a fresh
process per round, from a folder outside every source tree (so each imports its own
install; no ``PYTHONPATH``), on a quiet machine (``benchmarks.common.quiet_run``); the
side that goes first alternates. Per round and side:

* ``greedy``: tokens/s of ``tok = argmax(ctx.decode_single(tok))`` over ``--tokens``
  tokens on the default model (median of ``--reps`` repetitions, memory cleared between);
* ``chain``: the samplers chain top-k 40 -> top-p 0.95 -> min-p 0.05 -> temp 0.8 -> dist
  sampling from the last logits, median microseconds of ``--steps`` calls;
* ``import``: seconds to ``import llama_cffi`` (which loads the native libraries).

The table has medians over rounds and ratios candidate/baseline oriented so that > 1 means
the candidate is faster, and the median of the per-round ratios (``paired``).

    python benchmarks/bench_builds.py --baseline OLD/bin/python --candidate NEW/bin/python [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import command_line, median, quiet_run, run_child, write_json  # noqa: E402

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import llama_cffi
t_import = time.perf_counter() - t0
import numpy as np
import samplers as S
n_tok, reps, steps, n_threads = (int(x) for x in sys.argv[1:5])
m = llama_cffi.Model.load(llama_cffi.default_model_path())
ctx = m.context(n_ctx=n_tok + 8, n_batch=512, n_threads=n_threads, n_threads_batch=n_threads)
bos = m.vocab.bos if m.vocab.add_bos and m.vocab.bos is not None else 0
ctx.decode_single(bos, pos=0)  # warm-up
tps = []
for _ in range(reps):
    ctx.memory.clear(data=False)
    tok = bos
    t = time.perf_counter()
    for _ in range(n_tok):
        tok = int(np.asarray(ctx.decode_single(tok)).argmax())
    tps.append(n_tok / (time.perf_counter() - t))
chain = S.SamplerChain([S.TopK(40), S.TopP(0.95), S.MinP(0.05), S.Temperature(0.8), S.Dist(1234)])
us = []
for _ in range(steps):
    t = time.perf_counter()
    chain.sample(ctx)
    us.append((time.perf_counter() - t) * 1e6)
info = llama_cffi.build_info()
print(json.dumps({"greedy": sorted(tps)[len(tps) // 2], "chain_us": sorted(us)[len(us) // 2], "import_s": t_import,
                  "variant": info.get("cpu_variant", {}).get("name", "static build"), "file": llama_cffi.__file__}))
"""

METRICS = (("greedy", "greedy tok/s", True), ("chain_us", "chain step (us)", False), ("import_s", "import (s)", False))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, help="python of the install to compare against")
    ap.add_argument("--candidate", required=True, help="python of the install under test")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-foreign", type=float, default=0.3)
    ap.add_argument("--quiet-wait", type=float, default=60.0)
    ap.add_argument("--retries", type=int, default=2)
    ap.add_argument("--run-timeout", type=float, default=600.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    sides = {"baseline": args.baseline, "candidate": args.candidate}
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
    outside = Path(tempfile.mkdtemp(prefix="bench-builds-"))
    for rnd in range(args.rounds):
        order = list(sides) if rnd % 2 == 0 else list(reversed(sides))
        for side in order:
            cmd = [sides[side], "-c", CHILD, str(args.tokens), str(args.reps), str(args.steps), str(args.threads)]
            r = quiet_run(
                lambda cmd=cmd: run_child(cmd, cwd=outside, timeout=args.run_timeout),
                max_cores=args.max_foreign,
                quiet_wait=args.quiet_wait,
                retries=args.retries,
                label=side,
            ).check()
            data = json.loads(r.stdout.strip().splitlines()[-1])
            data["peak_rss_mib"] = r.peak_rss_kib / 1024
            results[side].append(data)
            print(
                f"round {rnd + 1} {side:9s} greedy {data['greedy']:7.2f} tok/s  chain {data['chain_us']:7.1f} us  "
                f"import {data['import_s']:.3f} s  ({data['variant']})",
                flush=True,
            )
    rows = []
    for key, label, higher_better in METRICS:
        base = [x[key] for x in results["baseline"]]
        cand = [x[key] for x in results["candidate"]]
        ratio = median(cand) / median(base) if higher_better else median(base) / median(cand)
        paired = median([c / b if higher_better else b / c for b, c in zip(base, cand, strict=True)])
        rows.append(
            {"metric": label, "baseline": median(base), "candidate": median(cand), "ratio": ratio, "paired": paired}
        )
    head = ("metric", "baseline", "candidate", "ratio", "paired")
    print(f"\n{head[0]:18s} {head[1]:>10s} {head[2]:>10s} {head[3]:>7s} {head[4]:>7s}  (ratio > 1: candidate faster)")
    for row in rows:
        vals = f"{row['baseline']:10.3f} {row['candidate']:10.3f} {row['ratio']:7.3f} {row['paired']:7.3f}"
        print(f"{row['metric']:18s} {vals}")
    print(f"baseline: {results['baseline'][0]['file']} ({results['baseline'][0]['variant']})")
    print(f"candidate: {results['candidate'][0]['file']} ({results['candidate'][0]['variant']})")
    if args.json:
        write_json(args.json, {"command": command_line(sys.argv), "rows": rows, "runs": results})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
