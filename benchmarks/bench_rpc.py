"""RPC overhead: the default model run locally against the same model split across two
RPC workers on loopback ports, in one process, rounds interleaved.

Both sides use the same thread count (``--threads``: the local context's threads and
each worker's). A single sequence runs the layers one worker after the other, so the
workers never compute at the same time and the ratio measures what the protocol adds:
sending activations and graphs over TCP, and the client's scheduling. Per round and
side: a prefill of ``--prompt`` tokens (tokens/s), then ``--tokens`` greedy steps with
``decode_single`` (tokens/s). Medians over rounds; ratio = rpc / local (< 1: slower).
The model load times (the RPC side sends every offloaded weight to the workers) are
printed too.

    python benchmarks/bench_rpc.py [--rounds 3] [--prompt 64] [--tokens 32] [--threads 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import llama_cffi
from benchmarks.common import command_line, median, write_json
from llama_cffi import rpc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(model: llama_cffi.Model, prompt: list[int], n_tokens: int, threads: int) -> tuple[float, float]:
    """(prefill tokens/s, generation tokens/s) on a fresh context."""
    with model.context(n_ctx=len(prompt) + n_tokens + 8, n_batch=512, n_threads=threads) as ctx:
        ctx.decode_single(prompt[0])  # warm-up
        ctx.memory.clear()
        t0 = time.perf_counter()
        row = ctx.decode(prompt)
        t1 = time.perf_counter()
        tok = int(np.asarray(row).argmax())
        t2 = time.perf_counter()
        for _ in range(n_tokens):
            tok = int(np.asarray(ctx.decode_single(tok)).argmax())
        t3 = time.perf_counter()
    return len(prompt) / (t1 - t0), n_tokens / (t3 - t2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    path = llama_cffi.default_model_path()
    ports = [free_port(), free_port()]
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "llama_cffi", "rpc-server", "--port", str(p), "-t", str(args.threads)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for p in ports
    ]
    try:
        endpoints = [f"127.0.0.1:{p}" for p in ports]
        for ep, w in zip(endpoints, workers, strict=True):
            rpc.wait_for_server(ep, 60, w)
        t0 = time.perf_counter()
        local = llama_cffi.Model.load(path)
        t1 = time.perf_counter()
        remote = llama_cffi.Model.load(path, rpc_servers=endpoints, n_gpu_layers=99)
        t2 = time.perf_counter()
        rng = np.random.default_rng(0)
        prompt = [int(local.vocab.bos)] + [int(t) for t in rng.integers(100, 20000, args.prompt - 1)]
        rows: dict[str, list[tuple[float, float]]] = {"local": [], "rpc": []}
        for r in range(args.rounds):
            order = [("local", local), ("rpc", remote)]
            for name, model in order if r % 2 == 0 else order[::-1]:
                rows[name].append(run(model, prompt, args.tokens, args.threads))
        result: dict[str, Any] = {"command": command_line(sys.argv[1:]), "endpoints": endpoints}
        for i, what in enumerate(("prefill", "generation")):
            loc = median([x[i] for x in rows["local"]])
            rem = median([x[i] for x in rows["rpc"]])
            paired = median([b[i] / a[i] for a, b in zip(rows["local"], rows["rpc"], strict=True)])
            result[what] = {"local_tok_s": loc, "rpc_tok_s": rem, "ratio": rem / loc, "paired_ratio": paired}
            print(
                f"{what:10s} local {loc:8.1f} tok/s   2 loopback workers {rem:8.1f} tok/s   "
                f"ratio {rem / loc:.3f} (paired {paired:.3f})"
            )
        result["load_s"] = {"local": t1 - t0, "rpc": t2 - t1}
        print(f"load       local {t1 - t0:.2f} s   rpc {t2 - t1:.2f} s (weights sent to the workers)")
        remote.close()
        local.close()
        if args.json:
            write_json(args.json, result)
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
