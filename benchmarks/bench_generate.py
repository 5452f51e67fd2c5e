"""Generation tokens/s: llama_cffi loops against llama.cpp's ``llama-bench`` (tg), same build.

The native side is ``llama-bench -p 0 -n TOKENS -t THREADS -r REPS -o json`` built from
the source and with the options llama_cffi was built with (``native_tools``): a
one-token warm-up, then per repetition the KV memory is cleared and TOKENS tokens are
decoded one at a time from position 0 (BOS first, then random ids; no sampling; every
step synchronised). Its value for a round is the median of its repetitions' tokens/s.

Ours runs in a fresh Python process per round (same context sizes: ``n_ctx`` = TOKENS,
``n_batch`` 2048, ``n_ubatch`` 512, ``swa_full=False``; a one-token warm-up; memory
cleared before each repetition; modes rotated within the round), in three modes:

* ``greedy``: ``tok = argmax(ctx.decode_single(tok))`` (a real greedy generation: the
  argmax over the 262k vocabulary is part of the loop, llama-bench has no sampling);
* ``chain``: ``ctx.decode_single(tok); tok = chain.sample(ctx)`` with the samplers chain
  top-k 40 -> top-p 0.95 -> min-p 0.05 -> temp 0.8 -> dist;
* ``decode``: ``ctx.decode_single(tok)`` of the same kind of token sequence as
  llama-bench (BOS, then random ids), no sampling: llama-bench's exact workload.

The peer ``llama-cpp-python`` is measured by ``bench_peer.py`` (greedy, sampled, grammar
and parallel generation, against the same llama.cpp build). Before each run the script
waits (up to ``--quiet-wait`` s) for other processes to use at most ``--max-foreign``
cores, records what they used during the run, and runs again (up to ``--retries`` times)
when that was more or the run took over ``--run-timeout`` s. Rounds rotate which side
goes first; the table shows medians over rounds, ratios ours/native (> 1: ours faster)
and the median of the per-round ratios (``paired``). Peak RSS of every run comes from
``os.wait4``.

    python benchmarks/bench_generate.py [--rounds 5] [--tokens 64] [--reps 3] [--threads 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import llama_cffi  # noqa: E402
from benchmarks.common import ChildRun, command_line, median, quiet_run, run_child, write_json  # noqa: E402
from benchmarks.native_tools import build_llama_tool  # noqa: E402

TOOL = "llama-bench"
MODES = ("greedy", "chain", "decode")

OURS = r"""
import json, sys, time
import numpy as np
import llama_cffi
import samplers as S
path, n_tok, n_threads, reps, modes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
modes = modes.split(",")
m = llama_cffi.Model.load(path)
ctx = m.context(n_ctx=n_tok, n_batch=2048, n_ubatch=512, n_threads=n_threads, n_threads_batch=n_threads,
                swa_full=False)
n_vocab = m.n_vocab
bos = m.vocab.bos if m.vocab.add_bos and m.vocab.bos is not None else 0
rand = [int(t) for t in np.random.default_rng(0).integers(0, n_vocab, size=n_tok)]
ctx.decode_single(bos, pos=0)  # warm-up, as llama-bench's
res = {mode: [] for mode in modes}
for r in range(reps):
    for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
        ctx.memory.clear(data=False)
        tok = bos
        if mode == "greedy":
            t0 = time.perf_counter()
            for _ in range(n_tok):
                tok = int(np.asarray(ctx.decode_single(tok)).argmax())
        elif mode == "chain":
            chain = S.SamplerChain([S.TopK(40), S.TopP(0.95), S.MinP(0.05), S.Temperature(0.8), S.Dist(1234)])
            t0 = time.perf_counter()
            for _ in range(n_tok):
                ctx.decode_single(tok)
                tok = chain.sample(ctx)
        else:
            t0 = time.perf_counter()
            for i in range(n_tok):
                ctx.decode_single(tok)
                tok = rand[i]
        res[mode].append(n_tok / (time.perf_counter() - t0))
print(json.dumps(res))
"""


def child_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def measured(cmd: list[str], args: argparse.Namespace, label: str, **kw: Any) -> ChildRun:
    """One run of ``cmd``, on a quiet machine, within ``--run-timeout`` (see quiet_run)."""
    return quiet_run(
        lambda: run_child(cmd, timeout=args.run_timeout, **kw),
        max_cores=args.max_foreign,
        quiet_wait=args.quiet_wait,
        retries=args.retries,
        label=label,
    ).check()


def run_native(tool: Path, model: Path, args: argparse.Namespace) -> tuple[float, list[float], ChildRun]:
    cmd = native_command(tool, model, args)
    r = measured(cmd, args, "native")
    data = json.loads(r.stdout)
    samples = [float(x) for x in data[0]["samples_ts"]]
    return median(samples), samples, r


def native_command(tool: Path, model: Path, args: argparse.Namespace) -> list[str]:
    return [
        str(tool),
        "-m",
        str(model),
        "-p",
        "0",
        "-n",
        str(args.tokens),
        "-t",
        str(args.threads),
        "-r",
        str(args.reps),
        "-o",
        "json",
    ]


def run_ours(model: Path, args: argparse.Namespace, modes: list[str]) -> tuple[dict[str, list[float]], ChildRun]:
    cmd = [sys.executable, "-c", OURS, str(model), str(args.tokens), str(args.threads), str(args.reps), ",".join(modes)]
    r = measured(cmd, args, "ours", cwd=ROOT, env=child_env())
    res: dict[str, list[float]] = json.loads(r.stdout.strip().splitlines()[-1])
    return res, r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (one process per side each)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens generated per repetition (llama-bench -n)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per process (llama-bench -r)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modes", default=",".join(MODES), help=f"ours, among {','.join(MODES)}")
    ap.add_argument("--max-foreign", type=float, default=0.15, help="cores other processes may use before a run")
    ap.add_argument("--quiet-wait", type=float, default=10.0, help="seconds to wait for a quiet machine per run")
    ap.add_argument("--retries", type=int, default=2, help="runs again when other processes used more")
    ap.add_argument("--run-timeout", type=float, default=120.0, help="seconds before a run is killed and retried")
    ap.add_argument("--json", type=Path, help="also write the results here, as JSON")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if bad := [m for m in modes if m not in MODES]:
        ap.error(f"unknown modes {bad}")
    try:
        model = Path(llama_cffi.default_model_path())
    except llama_cffi.LlamaError as exc:
        print(f"skipped: {exc}")
        return 0
    tool = build_llama_tool(TOOL)
    sides = ["native", "ours"]
    print(f"native: {' '.join(native_command(tool, model, args))}")
    print(
        f"ours: {', '.join(modes)} in a fresh process per round, n_ctx={args.tokens}, {args.threads} threads; "
        f"{args.rounds} rounds x {args.reps} reps x {args.tokens} tokens; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )

    nat: list[float] = []
    nat_samples: list[list[float]] = []
    ours: dict[str, list[float]] = {m: [] for m in modes}
    ours_samples: dict[str, list[list[float]]] = {m: [] for m in modes}
    rss: dict[str, list[int]] = {s: [] for s in sides}
    foreign: list[float] = []  # CPU other processes used during each run, in cores
    for r in range(args.rounds):
        for side in sides[r % len(sides) :] + sides[: r % len(sides)]:
            if side == "native":
                v, samples, run = run_native(tool, model, args)
                nat.append(v)
                nat_samples.append(samples)
            else:
                res, run = run_ours(model, args, modes)
                for m in modes:
                    ours[m].append(median(res[m]))
                    ours_samples[m].append(res[m])
            rss[side].append(run.peak_rss_kib)
            foreign.append(run.foreign_cores)
        line = "  ".join(f"{m} {ours[m][-1]:.1f}" for m in modes)
        other = max(foreign[-len(sides) :])
        print(f"round {r + 1}: native tg {nat[-1]:.1f}  ours {line} tok/s  (other load {other:.2f} cores)")

    nv = median(nat)
    print()
    print(
        f"tokens/s generating {args.tokens} tokens, {args.threads} threads, medians of {args.rounds} interleaved "
        f"rounds (each the median of {args.reps} reps); load average {os.getloadavg()[0]:.2f}"
    )
    print(f"{'':29} {'tok/s':>8} {'/native':>8} {'paired':>7} {'peak RSS':>10}")
    print(f"{'llama-bench tg (native)':29} {nv:>8.1f} {1:>8.3f} {1:>7.3f} {max(rss['native']) / 1024:>7.0f} MiB")
    rows: dict[str, Any] = {}
    for m in modes:
        v = median(ours[m])
        paired = median([o / n for o, n in zip(ours[m], nat, strict=True)])
        rows[m] = {"tps": v, "over_native": v / nv, "over_native_paired": paired, "samples_tps": ours_samples[m]}
        print(f"{'ours ' + m:29} {v:>8.1f} {v / nv:>8.3f} {paired:>7.3f} {max(rss['ours']) / 1024:>7.0f} MiB")
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "bench_generate",
                "command": command_line(sys.argv[1:] if argv is None else argv),
                "config": {
                    "rounds": args.rounds,
                    "tokens": args.tokens,
                    "reps": args.reps,
                    "threads": args.threads,
                    "modes": modes,
                    "max_foreign": args.max_foreign,
                    "quiet_wait": args.quiet_wait,
                    "retries": args.retries,
                    "run_timeout": args.run_timeout,
                },
                "native_command": native_command(tool, model, args),
                "native_tps": nv,
                "native_samples_tps": nat_samples,
                "ours": rows,
                "peak_rss_kib": {s: max(v) for s, v in rss.items() if v},
                "foreign_cores": foreign,
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
