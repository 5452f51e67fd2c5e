"""Samplers: the pure-numpy ones against llama.cpp's own, on the same logits, same run.

For each vocabulary size (32k, 128k, 152k, 262k: Llama 2, Llama 3, Qwen 2, Gemma 3) and each sampler (and the chain
top-k 40 -> top-p 0.95 -> min-p 0.05 -> temp 0.8 -> dist), one sampling step is timed:

* native: ``benchmarks/native/sampler_loop.c`` does what ``llama_sampler_sample`` does on
  the CPU (fill a ``llama_token_data`` array from the logits, apply the chain, accept);
* python: ``Candidates.reset(row)`` (borrows the row), the chain's ``apply``, accept.

Rounds alternate native and python; each reports a median per step; the table shows the
median over rounds and the ratio python/native (< 1: numpy is faster). The logits are a
real row of the default model (gemma3 270M, vocab 262,144), cut to the smaller sizes, or
random when the model is not installed. Finally, generation speed on the default model:
tokens/s with the sampled chain against plain greedy argmax (ratio, target >= 0.98).

    python benchmarks/bench_samplers.py [--rounds 5] [--iters 200] [--quick] [--sizes 32000,262144] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import llama_cffi  # noqa: E402
import samplers as S  # noqa: E402
from benchmarks.common import command_line, write_json  # noqa: E402
from benchmarks.native_tools import build_c_tool  # noqa: E402

CHAIN = "top_k40>top_p.95>min_p.05>temp.8>dist"

# label, python chain factory (n_vocab -> samplers), native specs
CASES: list[tuple[str, Callable[[int], list[S.Sampler]], list[str]]] = [
    (
        CHAIN,
        lambda n: [S.TopK(40), S.TopP(0.95), S.MinP(0.05), S.Temperature(0.8), S.Dist(1234)],
        ["top_k:40", "top_p:0.95:1", "min_p:0.05:1", "temp:0.8", "dist:1234"],
    ),
    ("greedy", lambda n: [S.Greedy()], ["greedy"]),
    ("dist", lambda n: [S.Dist(1)], ["dist:1"]),
    ("top_k 40", lambda n: [S.TopK(40)], ["top_k:40"]),
    ("top_p 0.95", lambda n: [S.TopP(0.95)], ["top_p:0.95:1"]),
    ("min_p 0.05", lambda n: [S.MinP(0.05)], ["min_p:0.05:1"]),
    ("typical 0.9", lambda n: [S.Typical(0.9)], ["typical:0.9:1"]),
    ("temp 0.8", lambda n: [S.Temperature(0.8)], ["temp:0.8"]),
    ("temp_ext 0.8±0.5", lambda n: [S.TempExt(0.8, 0.5, 1.0)], ["temp_ext:0.8:0.5:1"]),
    ("top_n_sigma 1.5", lambda n: [S.TopNSigma(1.5)], ["top_n_sigma:1.5"]),
    ("xtc 0.5/0.1", lambda n: [S.XTC(0.5, 0.1, 1, 7)], ["xtc:0.5:0.1:1:7"]),
    ("mirostat", lambda n: [S.Mirostat(n, 7, 5.0, 0.1, 100)], ["mirostat:7:5:0.1:100"]),
    ("mirostat_v2", lambda n: [S.MirostatV2(7, 5.0, 0.1)], ["mirostat_v2:7:5:0.1"]),
    ("penalties 64", lambda n: [S.Penalties(64, 1.1, 0.05, 0.05, n)], ["penalties:64:1.1:0.05:0.05"]),
    ("adaptive_p 0.3", lambda n: [S.AdaptiveP(0.3, 0.9, 7)], ["adaptive_p:0.3:0.9:7"]),
    ("logit_bias 1", lambda n: [S.LogitBias(n, {11: 2.0})], ["logit_bias:11:2"]),
]


def real_logits() -> np.ndarray:
    try:
        path = llama_cffi.default_model_path()
    except llama_cffi.LlamaError:
        return (np.random.default_rng(0).standard_normal(262_144) * 3).astype(np.float32)
    with llama_cffi.Model.load(path) as m, m.context(n_ctx=256) as ctx:
        return np.array(ctx.decode(m.tokenize("The quick brown fox jumps over the lazy dog. Then it")))


def python_step_us(make: Callable[[int], list[S.Sampler]], row: np.ndarray, iters: int) -> float:
    chain = S.SamplerChain(make(len(row)))
    cands = S.Candidates(len(row))
    for t in (5, 17, 5, 99):
        chain.accept(t)
    dt = []
    for _ in range(iters):
        t0 = time.perf_counter()
        cands.reset(row)
        chain.apply(cands)
        if cands.selected >= 0:
            chain.accept(cands.token)
        dt.append(time.perf_counter() - t0)
    return statistics.median(dt) * 1e6


def native_step_us(tool: Path, logits_file: Path, specs: list[str], iters: int) -> float:
    out = subprocess.run([str(tool), str(logits_file), str(iters), *specs], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[0])


def bench_table(sizes: list[int], rounds: int, iters: int, cases: list[int]) -> list[dict[str, object]]:
    tool = build_c_tool("sampler_loop")
    base = real_logits()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            row = np.ascontiguousarray(base[:n]) if n <= len(base) else np.resize(base, n)
            f = Path(tmp) / f"logits{n}.f32"
            row.tofile(f)
            for ci in cases:
                label, make, specs = CASES[ci]
                it = iters if n <= 65536 or ci == 0 or "top_k" in label else max(10, iters // 10)
                nat, py = [], []
                for _ in range(rounds):
                    nat.append(native_step_us(tool, f, specs, it))
                    py.append(python_step_us(make, row, it))
                n_us, p_us = statistics.median(nat), statistics.median(py)
                rows.append({"vocab": n, "sampler": label, "native_us": n_us, "python_us": p_us, "ratio": p_us / n_us})
                print(
                    f"{n:>7} {label:<38} native {n_us:9.1f} us  numpy {p_us:9.1f} us  ratio {p_us / n_us:6.3f}",
                    flush=True,
                )
    return rows


GEN = r"""
import sys, time, statistics, numpy as np, llama_cffi, samplers as S
rounds, n_tok = int(sys.argv[1]), int(sys.argv[2])
m = llama_cffi.Model.load(llama_cffi.default_model_path())
ctx = m.context(n_ctx=n_tok + 64, n_threads=2, n_threads_batch=2)
prompt = m.tokenize("Once upon a time")
res = {"greedy": [], "chain": []}
for r in range(rounds):
    for mode in (("greedy", "chain") if r % 2 == 0 else ("chain", "greedy")):
        chain = S.SamplerChain([S.TopK(40), S.TopP(0.95), S.MinP(0.05), S.Temperature(0.8), S.Dist(1234)])
        ctx.memory.clear()
        ctx.decode(prompt)
        t0 = time.perf_counter()
        for i in range(n_tok):
            tok = chain.sample(ctx) if mode == "chain" else int(np.asarray(ctx.logits()).argmax())
            ctx.decode_single(tok)
        res[mode].append(n_tok / (time.perf_counter() - t0))
print(statistics.median(res["greedy"]), statistics.median(res["chain"]))
"""


def bench_generation(rounds: int, n_tok: int) -> dict[str, float]:
    """One process, one context; greedy and sampled runs alternate (order flipped each round)."""
    out = subprocess.run(
        [sys.executable, "-c", GEN, str(rounds), str(n_tok)], capture_output=True, text=True, check=True
    )
    g, c = (float(x) for x in out.stdout.split()[-2:])
    print(
        f"generation on gemma3-270m ({n_tok} tokens x {rounds} rounds, 2 threads): "
        f"greedy {g:.1f} tok/s, sampled chain {c:.1f} tok/s, ratio {c / g:.3f}"
    )
    return {"greedy_tps": g, "chain_tps": c, "ratio": c / g}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--gen-tokens", type=int, default=96)
    ap.add_argument("--quick", action="store_true", help="only the chain, at 32k and 262k, and generation")
    ap.add_argument(
        "--sizes", help="vocabulary sizes, comma separated (default: 32000,128256,152064,262144; --quick: 32000,262144)"
    )
    ap.add_argument("--json", type=Path, help="also write the results here, as JSON")
    args = ap.parse_args(argv)
    sizes = [32_000, 262_144] if args.quick else [32_000, 128_256, 152_064, 262_144]
    if args.sizes:
        sizes = [int(x) for x in args.sizes.split(",") if x]
    cases = [0] if args.quick else list(range(len(CASES)))
    print(f"{'vocab':>7} {'sampler':<38} (median per step over {args.rounds} interleaved rounds)")
    rows = bench_table(sizes, args.rounds, args.iters, cases)
    gen: dict[str, float] | None = None
    skipped: str | None = None
    try:
        llama_cffi.default_model_path()
    except llama_cffi.LlamaError as exc:
        print(f"generation benchmark skipped: {exc}")
        skipped = str(exc)
    else:
        gen = bench_generation(max(args.rounds, 6), args.gen_tokens)
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "bench_samplers",
                "command": command_line(sys.argv[1:] if argv is None else argv),
                "config": {
                    "rounds": args.rounds,
                    "iters": args.iters,
                    "gen_tokens": args.gen_tokens,
                    "gen_rounds": max(args.rounds, 6),
                    "sizes": sizes,
                    "chain": CHAIN,
                },
                "native_program": "benchmarks/native/sampler_loop.c",
                "rows": rows,
                "generation": gen,
                "generation_skipped": skipped,
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
