"""Branches: batched ``BranchStore.step`` vs one-by-one ``Branch.commit`` vs llama.cpp's
``llama-batched-bench`` and ``llama-batched``, generation throughput on the same model,
same run.

One shared prompt of ``--pp`` random tokens is decoded into a root branch, forked into
N branches (``seq_cp`` on a unified KV cache), then each branch generates ``--tg``
tokens:

* chain: ``store.step(store.sample())`` with every branch's own chain
  ``TopK(40) -> TopP(0.95) -> Temperature(0.8) -> Dist`` (reseeded per fork) and its
  perplexity tracked: the headline, against batched-bench's S_TG;
* device: the same with ``BranchStore(ctx, device=True)`` (top-k and the measures in
  llama.cpp's sampling graph);
* the modes below, with greedy sampling:

* native: ``llama-batched-bench -pps -kvu`` (shared prompt copied to N sequences with
  ``llama_memory_seq_cp``, unified KV, one ``llama_decode`` of N random tokens per step,
  every token an output); its ``S_TG`` is N*TG / generation time, prompt excluded;
* batched: ``store.step({b: b.sample() for b in branches})`` per step (one decode for
  all N branches, greedy sampling of each branch's logits snapshot, metrics, snapshot
  copies), timed over the generation loop only, as S_TG;
* no-track: the same with ``store.create(..., track=False)`` (no perplexity metrics,
  which cost one softmax over the vocabulary per branch and token);
* one-by-one: ``b.commit(b.sample())`` for each branch in turn (N decodes per step);
* stand-in: the batched loop over a minimal store written here on ``llama_cffi.Batch`` /
  ``decode_batch`` / ``memory.seq_cp`` (greedy sampling of an owned logits snapshot per
  branch, no metrics): what the batched path costs without BranchStore's extras;
* raw: ``ctx.decode_batch`` of N random tokens per step, no sampling (native's exact
  workload through llama_cffi: the ceiling for batched).

And, with ``--examples`` (on by default), llama.cpp's own parallel generation:
``llama-batched -np N`` (examples/batched: every sequence sampled on the host by
llama.cpp's sampler chain, top-k 40, top-p 0.95, temperature 0.8, dist, one seed) and
``llama-batched -np N --backend-sampling`` (the same chain in its sampling graph),
against ours doing exactly that loop (same prompt text, seed, length, unified KV,
sequences that end at an end-of-generation token): ``example`` (host) and
``example-device``. Their speed is what llama-batched prints: tokens decoded / time of
the generation loop.

``samplers.branch.BranchStore`` is used when it imports (``--impl auto``); otherwise
(or with ``--impl standin``) the stand-in plays its part. For each round and each N,
native (a subprocess) and ours (in-process, every mode, mode order rotated) run in
alternating order; the table shows medians over rounds (``paired``: the median of the
per-round ratios, steadier on a noisy machine). ``host us/step`` is wall time minus
the time llama.cpp spent computing (``llama_perf_context``), per step; from it, a
noise-free estimate of ours/native: native step / (native step + host time). Each run
waits for, and is repeated unless it had, a quiet machine (``--max-foreign``: other
processes stall llama.cpp's spinning thread pool when the threads fill the cores).
Finally fork latency: ``root.fork()`` and ``child.prune()`` on a branch of
``--fork-history`` tokens.

    python benchmarks/bench_branches.py [--rounds 3] [--pp 64] [--tg 32] [--ns 1,2,4,8,16]
    python benchmarks/bench_branches.py --quick          # N in 1,4,8; one round
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import llama_cffi  # noqa: E402
import samplers as S  # noqa: E402
from benchmarks.common import command_line, llama_batched_loop, run_child, self_peak_rss_kib  # noqa: E402
from benchmarks.native_tools import build_llama_example, build_llama_tool  # noqa: E402
from samplers.branch import Branch, BranchStore  # noqa: E402

TOOL = "llama-batched-bench"
MODES = ("chain", "device", "batched", "notrack", "onebyone", "standin", "raw")
LABELS = {
    "chain": "chain",
    "device": "device",
    "batched": "batched",
    "notrack": "no-track",
    "onebyone": "1-by-1",
    "standin": "stand-in",
    "raw": "raw",
}
EXAMPLE_PROMPT = "The history of the printing press begins in"
EXAMPLE_SEED = 1234
IntArray = npt.NDArray[np.int32]
T = TypeVar("T")


# ---------------------------------------------------------------------- the store API
class BranchLike(Protocol):
    def fork(self) -> BranchLike: ...

    def sample(self) -> int: ...

    def commit(self, token: int) -> None: ...

    def prune(self) -> None: ...


class StoreLike(Protocol):
    def create(self, prompt: IntArray, sampler: S.SamplerChain, track: bool = ...) -> BranchLike: ...

    def step(self, moves: dict[Any, int]) -> None: ...

    def drain(self) -> None: ...


def branch_store_class() -> type[Any] | None:
    """``samplers.branch.BranchStore``, or None while that module does not exist (yet)."""
    try:
        mod = importlib.import_module("samplers.branch")
    except ImportError:
        return None
    cls = getattr(mod, "BranchStore", None)
    return cls if isinstance(cls, type) else None


class StandInBranch:
    """A branch of :class:`StandInStore`: one sequence id, its next position, its chain
    and an owned logits snapshot (the work BranchStore does per branch, less metrics)."""

    def __init__(self, store: StandInStore, seq: int, pos: int, chain: S.SamplerChain, logits: np.ndarray) -> None:
        self.store = store
        self.seq = seq
        self.pos = pos
        self.chain = chain
        self.logits = logits

    def sample(self) -> int:
        cands = self.store.cands
        try:
            cands.reset(self.logits)
            self.chain.apply(cands)
            token = cands.token
        finally:
            cands.release()
        self.chain.accept(token)
        return token

    def fork(self) -> StandInBranch:
        store = self.store
        seq = store.free.pop()
        store.ctx.memory.seq_cp(self.seq, seq)
        return StandInBranch(store, seq, self.pos, self.chain.clone(), self.logits.copy())

    def commit(self, token: int) -> None:
        row = self.store.ctx.decode_single(token, seq_id=self.seq)
        np.copyto(self.logits, row)
        self.pos += 1

    def prune(self) -> None:
        self.store.ctx.memory.seq_rm(self.seq)
        self.store.free.append(self.seq)


class StandInStore:
    """Branches over raw ``Batch`` + ``decode_batch`` + ``memory.seq_cp`` (the fallback)."""

    def __init__(self, ctx: llama_cffi.Context) -> None:
        self.ctx = ctx
        self.free = list(range(ctx.n_seq_max - 1, -1, -1))
        self.batch = llama_cffi.Batch(ctx.n_seq_max)
        self.cands = S.Candidates(ctx.n_vocab)

    def create(self, prompt: IntArray, sampler: S.SamplerChain, track: bool = False) -> StandInBranch:
        seq = self.free.pop()
        row = self.ctx.decode(prompt, pos=0, seq_id=seq)
        return StandInBranch(self, seq, len(prompt), sampler, np.array(row, dtype=np.float32, copy=True))

    def step(self, moves: dict[Any, int]) -> None:
        batch = self.batch
        batch.clear()
        branches: list[StandInBranch] = list(moves)
        for b, tok in moves.items():
            batch.add(tok, b.pos, (b.seq,), True)
        self.ctx.decode_batch(batch)
        out = np.asarray(self.ctx.logits_all())
        for i, b in enumerate(branches):
            np.copyto(b.logits, out[i])
            b.pos += 1
        del out  # no raw array may point into the output buffer at the next decode

    def drain(self) -> None:
        self.ctx.memory.clear(data=False)
        self.free = list(range(self.ctx.n_seq_max - 1, -1, -1))


def make_store_factory(impl: str) -> tuple[str, Callable[[llama_cffi.Context], StoreLike], bool]:
    """The store to measure, its name, and whether its ``create`` takes ``track=False``."""
    cls = branch_store_class() if impl in ("auto", "store") else None
    if impl == "store" and cls is None:
        raise SystemExit("--impl store: samplers.branch.BranchStore does not import")
    if cls is not None:
        return "BranchStore", cls, "track" in inspect.signature(cls.create).parameters
    return "stand-in", StandInStore, False


def sampled_chain(seed: int) -> S.SamplerChain:
    """The chain of the ``chain``/``device``/``example`` modes (llama-batched's)."""
    return S.SamplerChain([S.TopK(40), S.TopP(0.95), S.Temperature(0.8), S.Dist(seed)])


# ---------------------------------------------------------------------- llama-batched
def example_command(
    tool: Path, model: Path, n: int, n_predict: int, args: argparse.Namespace, device: bool
) -> list[str]:
    cmd = [
        str(tool),
        "-m",
        str(model),
        "-p",
        EXAMPLE_PROMPT,
        "-n",
        str(n_predict),
        "-np",
        str(n),
        "--top-k",
        "40",
        "--top-p",
        "0.95",
        "--temp",
        "0.8",
        "-s",
        str(EXAMPLE_SEED),
        "-kvu",
        "-t",
        str(args.threads),
        "-tb",
        str(args.threads),
    ]
    return [*cmd, "--backend-sampling"] if device else cmd


_SPEED = re.compile(r"decoded (\d+) tokens in ([0-9.]+) s, speed: ([0-9.]+) t/s")


def run_example_native(cmd: list[str]) -> dict[str, float]:
    """llama-batched's own figures: tokens decoded in its generation loop, and tok/s."""
    out = run_child(cmd)
    if out.returncode != 0:
        raise RuntimeError(f"llama-batched failed ({out.returncode}):\n{out.stderr[-3000:]}")
    m = _SPEED.search(out.stdout + "\n" + out.stderr)
    if m is None:
        raise RuntimeError(f"no speed line in llama-batched's output:\n{out.stderr[-2000:]}")
    return {"tokens": float(m.group(1)), "loop_s": float(m.group(2)), "tps": float(m.group(3))}


def run_example_ours(
    model: llama_cffi.Model, n: int, tg: int, args: argparse.Namespace, device: bool
) -> dict[str, float]:
    """llama-batched's loop with a BranchStore (:func:`benchmarks.common.llama_batched_loop`)."""
    return llama_batched_loop(model, EXAMPLE_PROMPT, n, tg, EXAMPLE_SEED, args.threads, device)


# ---------------------------------------------------------------------- native
def native_command(tool: Path, model: Path, ns: Sequence[int | str], args: argparse.Namespace, tgs: bool) -> list[str]:
    cmd = [
        str(tool),
        "-m",
        str(model),
        "-c",
        str(args.n_ctx),
        "-b",
        str(args.n_batch),
        "-ub",
        str(args.n_ubatch),
        "-npp",
        str(args.pp),
        "-ntg",
        str(args.tg),
        "-npl",
        ",".join(map(str, ns)),
        "-t",
        str(args.threads),
        "-tb",
        str(args.threads),
        "-pps",
        "-kvu",
        "--swa-full",
        "-fa",
        "auto",
        "--output-format",
        "jsonl",
    ]
    return [*cmd, "-tgs"] if tgs else cmd


NATIVE_RSS_KIB: list[int] = []  # peak RSS of each native run


def run_native(cmd: list[str]) -> dict[int, float]:
    """S_TG (tokens/s) per N from llama-batched-bench's jsonl lines."""
    out = run_child(cmd)
    if out.returncode != 0:
        raise RuntimeError(f"{TOOL} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    NATIVE_RSS_KIB.append(out.peak_rss_kib)
    res: dict[int, float] = {}
    for line in (out.stdout + "\n" + out.stderr).splitlines():
        line = line.strip()
        if line.startswith("{") and '"speed_tg"' in line:
            d = json.loads(line)
            res[int(d["pl"])] = float(d["speed_tg"])
    if not res:
        raise RuntimeError(f"no results in {TOOL}'s output:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return res


# ---------------------------------------------------------------------- ours
def in_llama_ms(ctx: llama_cffi.Context) -> float:
    """Milliseconds llama.cpp has spent decoding (prompt + eval), up to a synchronize."""
    ctx.synchronize()
    p = ctx.perf()
    return float(p["t_p_eval_ms"]) + float(p["t_eval_ms"])


def run_ours(
    ctx: llama_cffi.Context,
    make_store: Callable[[llama_cffi.Context], StoreLike],
    mode: str,
    n: int,
    prompt: IntArray,
    tg: int,
    rng: np.random.Generator,
) -> dict[str, float]:
    """One run of ``mode`` with ``n`` branches: generation tok/s and where the time went."""
    ctx.memory.clear(data=False)
    if mode == "raw":
        batch = llama_cffi.Batch(n)
        ctx.decode(prompt, pos=0, seq_id=0, logits="last")
        for j in range(1, n):
            ctx.memory.seq_cp(0, j)
        pp = len(prompt)
        toks = rng.integers(0, ctx.n_vocab, size=(tg, n), dtype=np.int32)
        c0 = in_llama_ms(ctx)
        t0 = time.perf_counter()
        for i in range(tg):
            batch.clear()
            for j in range(n):
                batch.add(int(toks[i, j]), pp + i, (j,), True)
            ctx.decode_batch(batch)
            ctx.synchronize()
        wall = time.perf_counter() - t0
        c1 = in_llama_ms(ctx)
        ctx.memory.clear(data=False)
        return {"tps": n * tg / wall, "host_us_step": (wall * 1e3 - (c1 - c0)) * 1e3 / tg}
    if mode in ("chain", "device"):
        store = BranchStore(ctx, device=mode == "device")
        root = store.create(prompt, sampler=sampled_chain(0))
        branches = [root] + [root.fork(seed=j) for j in range(1, n)]
    else:
        store = StandInStore(ctx) if mode == "standin" else make_store(ctx)
        chain = S.SamplerChain([S.Greedy()])
        root = store.create(prompt, sampler=chain, track=False) if mode == "notrack" else store.create(prompt, chain)
        branches = [root] + [root.fork() for _ in range(n - 1)]
    t_sample = t_decode = 0.0
    c0 = in_llama_ms(ctx)
    t0 = time.perf_counter()
    if mode in ("chain", "device"):
        for _ in range(tg):
            a = time.perf_counter()
            moves = store.sample(branches)
            b_ = time.perf_counter()
            store.step(moves)
            t_sample += b_ - a
            t_decode += time.perf_counter() - b_
    elif mode in ("batched", "notrack", "standin"):
        for _ in range(tg):
            a = time.perf_counter()
            moves = {b: b.sample() for b in branches}
            b_ = time.perf_counter()
            store.step(moves)
            t_sample += b_ - a
            t_decode += time.perf_counter() - b_
    else:
        for _ in range(tg):
            for b in branches:
                a = time.perf_counter()
                tok = b.sample()
                b_ = time.perf_counter()
                b.commit(tok)
                t_sample += b_ - a
                t_decode += time.perf_counter() - b_
    wall = time.perf_counter() - t0
    c1 = in_llama_ms(ctx)
    for b in reversed(branches):
        b.prune()
    store.drain()
    ctx.memory.clear(data=False)
    host_ms = wall * 1e3 - (c1 - c0)
    return {
        "tps": n * tg / wall,
        "host_us_step": host_ms * 1e3 / tg,
        "sample_us_step": t_sample * 1e6 / tg,
        "step_host_us_step": (t_decode * 1e3 - (c1 - c0)) * 1e3 / tg,
    }


def fork_latency(
    ctx: llama_cffi.Context,
    make_store: Callable[[llama_cffi.Context], StoreLike],
    history: IntArray,
    iters: int,
) -> dict[str, float]:
    """Median microseconds of ``root.fork()`` and of the child's ``prune()``."""
    ctx.memory.clear(data=False)
    store = make_store(ctx)
    root = store.create(history, sampler=S.SamplerChain([S.Greedy()]))
    fk, pr = [], []
    for _ in range(iters):
        t0 = time.perf_counter()
        child = root.fork()
        t1 = time.perf_counter()
        child.prune()
        t2 = time.perf_counter()
        fk.append(t1 - t0)
        pr.append(t2 - t1)
    out = {"fork_us": statistics.median(fk) * 1e6, "prune_us": statistics.median(pr) * 1e6}
    if isinstance(root, Branch):  # fork(at=) of the middle: includes a one-token decode
        fa = []
        for _ in range(max(iters // 10, 5)):
            t0 = time.perf_counter()
            child = root.fork(at=len(history) // 2)
            fa.append(time.perf_counter() - t0)
            child.prune()
        out["fork_at_us"] = statistics.median(fa) * 1e6
    root.prune()
    store.drain()
    ctx.memory.clear(data=False)
    return out


# ---------------------------------------------------------------------- a busy machine
def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy since boot (0 where /proc/stat is missing)."""
    try:
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    except OSError:
        return 0.0
    return (sum(vals) - vals[3] - vals[4]) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds of this process (every thread) and of its waited-for children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def foreign_load(seconds: float) -> float:
    """Cores' worth of CPU other processes used over the next ``seconds`` (we stay idle)."""
    b0, t0 = machine_busy_s(), time.perf_counter()
    time.sleep(seconds)
    return max(machine_busy_s() - b0, 0.0) / (time.perf_counter() - t0)


def measured(fn: Callable[[], T], args: argparse.Namespace) -> tuple[T, float]:
    """``fn()`` on a quiet machine: wait (up to ``--quiet-wait`` s) until other processes
    use less than ``--max-foreign`` cores, run, and run again (up to ``--retries`` times)
    when they used more meanwhile (2 threads on 2 cores: any other load stalls llama.cpp's
    spinning thread pool, by up to 100x). Returns the result of the attempt with the least
    foreign load, and that load (cores)."""
    best: tuple[T, float] | None = None
    for attempt in range(args.retries + 1):
        deadline = time.monotonic() + args.quiet_wait
        while foreign_load(0.3) > args.max_foreign and time.monotonic() < deadline:
            time.sleep(2.0)
        b0, c0, t0 = machine_busy_s(), own_cpu_s(), time.perf_counter()
        res = fn()
        wall = time.perf_counter() - t0
        foreign = max(machine_busy_s() - b0 - (own_cpu_s() - c0), 0.0) / wall
        if best is None or foreign < best[1]:
            best = (res, foreign)
        if foreign <= args.max_foreign:
            break
        if attempt < args.retries:
            print(f"  (other processes used {foreign:.2f} cores meanwhile: measuring again)", flush=True)
    assert best is not None
    return best


# ---------------------------------------------------------------------- main
def _median(vals: Sequence[float]) -> float:
    return statistics.median(vals) if vals else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ns", default="1,2,4,8,16", help="numbers of branches (comma separated)")
    ap.add_argument("--pp", type=int, default=64, help="prompt tokens (shared by every branch)")
    ap.add_argument("--tg", type=int, default=32, help="generated tokens per branch")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--n-batch", type=int, default=2048)
    ap.add_argument("--n-ubatch", type=int, default=512)
    ap.add_argument("--impl", choices=("auto", "store", "standin"), default="auto")
    ap.add_argument("--modes", default=",".join(MODES), help=f"ours, among {','.join(MODES)}")
    ap.add_argument("--native-tgs", action="store_true", help="also run native with -tgs (one sequence at a time)")
    ap.add_argument("--fork-history", type=int, default=256)
    ap.add_argument("--fork-iters", type=int, default=200)
    ap.add_argument("--max-foreign", type=float, default=0.15, help="cores other processes may use during a run")
    ap.add_argument("--retries", type=int, default=3, help="runs again when other processes used more")
    ap.add_argument("--quiet-wait", type=float, default=60.0, help="seconds to wait for a quiet machine per run")
    ap.add_argument("--quick", action="store_true", help="N in 1,4,8 and one round")
    ap.add_argument(
        "--examples",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also llama-batched -np N, with and without --backend-sampling, against ours doing its loop",
    )
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    if args.quick:
        args.ns, args.rounds = "1,4,8", 1
    ns = [int(x) for x in args.ns.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    if bad := [m for m in modes if m not in MODES]:
        ap.error(f"unknown modes {bad}")
    need = args.pp + max(ns) * args.tg  # native skips an N silently when it does not fit
    if need > args.n_ctx or args.fork_history + 1 > args.n_ctx:
        ap.error(f"--n-ctx {args.n_ctx} is too small: pp + max(N)*tg = {need}, fork history {args.fork_history}")
    try:
        model_path = Path(llama_cffi.default_model_path())
    except llama_cffi.LlamaError as exc:
        print(f"skipped: {exc}")
        return 0
    tool = build_llama_tool(TOOL)
    example_tool = build_llama_example("batched") if args.examples else None
    impl, make_store, can_untrack = make_store_factory(args.impl)
    if impl == "stand-in":  # no BranchStore: the chain modes need it
        modes = [m for m in modes if m not in ("chain", "device")]
    if impl == "stand-in":  # "batched" is the stand-in already, and it has no metrics
        modes = [m for m in modes if m not in ("standin", "notrack")]
    elif "notrack" in modes and not can_untrack:  # an older BranchStore: metrics always on
        modes.remove("notrack")
    cmd = native_command(tool, model_path, ["N"], args, tgs=False)  # run once per N: -npl N
    print(
        f"native, once per N in {args.ns}: {' '.join(cmd)}{' (and with -tgs)' if args.native_tgs else ''}", flush=True
    )

    model = llama_cffi.Model.load(str(model_path))
    ctx = model.context(
        n_ctx=args.n_ctx,
        n_batch=args.n_batch,
        n_ubatch=args.n_ubatch,
        n_seq_max=max(max(ns), 2),
        kv_unified=True,
        swa_full=True,  # llama.cpp's default for a context; batched-bench gets --swa-full
        no_perf=False,  # llama_perf_context timings, as batched-bench has them
        n_threads=args.threads,
        n_threads_batch=args.threads,
    )
    rng = np.random.default_rng(1234)
    prompt = rng.integers(0, model.n_vocab, size=args.pp, dtype=np.int32)
    history = rng.integers(0, model.n_vocab, size=args.fork_history, dtype=np.int32)
    ctx.decode(rng.integers(0, model.n_vocab, size=16, dtype=np.int32), pos=0, logits="none")  # as batched-bench
    print(
        f"ours: {impl}, n_ctx={ctx.n_ctx} n_batch={ctx.n_batch} n_ubatch={ctx.n_ubatch} n_seq_max={ctx.n_seq_max} "
        f"kv_unified swa_full threads={args.threads}; PP={args.pp} TG={args.tg}, greedy; {args.rounds} rounds; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )

    nat: dict[int, list[float]] = {n: [] for n in ns}
    nat_tgs: dict[int, list[float]] = {n: [] for n in ns}
    ours: dict[tuple[str, int], list[dict[str, float]]] = {(m, n): [] for m in modes for n in ns}
    forks: list[dict[str, float]] = []
    foreign: list[float] = []  # other processes' load (cores) during each kept run
    ex: dict[tuple[str, int], list[dict[str, float]]] = {
        (side, n): [] for side in ("native", "native-bs", "ours", "ours-device") for n in ns
    }
    for r in range(args.rounds):
        order = modes[r % len(modes) :] + modes[: r % len(modes)]
        for i, n in enumerate(ns):
            sides = ("native", "ours") if (r + i) % 2 == 0 else ("ours", "native")
            for side in sides:
                if side == "native":
                    c = native_command(tool, model_path, [n], args, tgs=False)
                    res, fl = measured(functools.partial(run_native, c), args)
                    nat[n].append(res[n])
                    foreign.append(fl)
                    if args.native_tgs:
                        c = native_command(tool, model_path, [n], args, tgs=True)
                        res, fl = measured(functools.partial(run_native, c), args)
                        nat_tgs[n].append(res[n])
                        foreign.append(fl)
                else:
                    for mode in order:
                        d, fl = measured(
                            functools.partial(run_ours, ctx, make_store, mode, n, prompt, args.tg, rng), args
                        )
                        ours[(mode, n)].append({**d, "foreign": fl})
                        foreign.append(fl)
            line = "  ".join(f"{m} {ours[(m, n)][-1]['tps']:.1f}" for m in modes)
            print(f"round {r + 1} N={n}: native {nat[n][-1]:.1f}  {line}", flush=True)
            if example_tool is not None:
                n_predict = len(model.tokenize(EXAMPLE_PROMPT)) + args.tg
                runs: list[tuple[str, Any]] = [
                    (
                        "native",
                        functools.partial(
                            run_example_native, example_command(example_tool, model_path, n, n_predict, args, False)
                        ),
                    ),
                    (
                        "native-bs",
                        functools.partial(
                            run_example_native, example_command(example_tool, model_path, n, n_predict, args, True)
                        ),
                    ),
                    ("ours", functools.partial(run_example_ours, model, n, args.tg, args, False)),
                    ("ours-device", functools.partial(run_example_ours, model, n, args.tg, args, True)),
                ]
                k = (r + i) % len(runs)
                for side, fn in runs[k:] + runs[:k]:
                    d, fl = measured(fn, args)
                    ex[(side, n)].append({**d, "foreign": fl})
                    foreign.append(fl)
                print(
                    f"round {r + 1} N={n} llama-batched loop tok/s: "
                    + "  ".join(f"{side} {ex[(side, n)][-1]['tps']:.1f}" for side, _ in runs),
                    flush=True,
                )
        forks.append(measured(lambda: fork_latency(ctx, make_store, history, args.fork_iters), args)[0])

    def med(mode: str, n: int, key: str = "tps") -> float:
        return _median([d[key] for d in ours.get((mode, n), []) if key in d])

    def paired(mode: str, n: int) -> float:
        return _median([d["tps"] / v for d, v in zip(ours.get((mode, n), []), nat[n], strict=False)])

    rows: list[dict[str, Any]] = []
    print()
    print(
        f"{impl}: generation tok/s (N*TG / generation time, PP={args.pp} TG={args.tg}), "
        f"medians of {args.rounds} interleaved rounds; load average {os.getloadavg()[0]:.2f}"
    )
    head = f"{'N':>3} {'native S_TG':>11}"
    for m in modes:
        head += f" {LABELS[m]:>8} {'/nat':>6}" + (f" {'paired':>6}" if m == "batched" else "")
        head += f" {'b/1by1':>6}" if m == "onebyone" else ""
    head += " | host us/step:" + "".join(f" {LABELS[m]:>8}" for m in modes)
    if args.native_tgs:
        head += f" | {'native -tgs':>11} {'1by1/tgs':>8}"
    print(head)
    for n in ns:
        nv = _median(nat[n])
        row: dict[str, Any] = {
            "n": n,
            "native_tps": nv,
            **{f"{m}_tps": med(m, n) for m in modes},
            **{f"{m}_over_native": med(m, n) / nv for m in modes},
            "batched_over_native_paired": paired("batched", n),
            "batched_over_onebyone": med("batched", n) / med("onebyone", n),
            "host_us_step": {m: med(m, n, "host_us_step") for m in modes},
            "sample_us_step": {m: med(m, n, "sample_us_step") for m in modes if m != "raw"},
            "step_host_us_step": {m: med(m, n, "step_host_us_step") for m in modes if m != "raw"},
            "samples": {"native": nat[n], **{m: ours[(m, n)] for m in modes}},
        }
        line = f"{n:>3} {nv:>11.1f}"
        for m in modes:
            line += f" {med(m, n):>8.1f} {med(m, n) / nv:>6.3f}"
            line += f" {paired(m, n):>6.3f}" if m == "batched" else ""
            line += f" {med('batched', n) / med(m, n):>6.2f}" if m == "onebyone" else ""
        line += " | " + " " * 13 + "".join(f" {med(m, n, 'host_us_step'):>8.0f}" for m in modes)
        if args.native_tgs:
            t = _median(nat_tgs[n])
            row["native_tgs_tps"] = t
            row["samples"]["native_tgs"] = nat_tgs[n]
            line += f" | {t:>11.1f} {med('onebyone', n) / t:>8.3f}"
        rows.append(row)
        print(line)
    # less noisy than the ratios: how far the host time alone puts each mode below native, taking
    # native's step (N / S_TG) as the compute time; one-by-one also pays N-1 more decodes, so not it
    print("host-overhead estimate of ours/native, native step / (native step + host us/step):")
    for m in (m for m in modes if m != "onebyone"):
        ests = [1 / (1 + med(m, n, "host_us_step") * 1e-6 * _median(nat[n]) / n) for n in ns]
        for row, e in zip(rows, ests, strict=True):
            row[f"{m}_est_over_native"] = e
        print(f"{LABELS[m]:>9}: " + ", ".join(f"N={n} {e:.3f}" for n, e in zip(ns, ests, strict=True)))
    if example_tool is not None:
        print()
        print(
            f"llama-batched's loop (prompt {EXAMPLE_PROMPT!r}, {args.tg} tokens, one seed, unified KV; tok/s = "
            "tokens decoded / loop time, medians)"
        )
        print(f"{'N':>3} {'llama-batched':>13} {'-bs':>9} {'ours':>9} {'ours dev':>9} {'ours/lb':>8} {'dev/-bs':>8}")
        for n, row in zip(ns, rows, strict=True):
            v = {
                side: _median([d["tps"] for d in ex[(side, n)]])
                for side in ("native", "native-bs", "ours", "ours-device")
            }
            row["example"] = {
                "llama_batched_tps": v["native"],
                "llama_batched_bs_tps": v["native-bs"],
                "ours_tps": v["ours"],
                "ours_device_tps": v["ours-device"],
                "ours_over_llama_batched": v["ours"] / v["native"],
                "ours_device_over_bs": v["ours-device"] / v["native-bs"],
                "ours_over_bs": v["ours"] / v["native-bs"],
                "tokens": {side: [d["tokens"] for d in ex[(side, n)]] for side in ("native", "ours")},
                "samples": {side: ex[(side, n)] for side in ("native", "native-bs", "ours", "ours-device")},
            }
            print(
                f"{n:>3} {v['native']:>13.1f} {v['native-bs']:>9.1f} {v['ours']:>9.1f} {v['ours-device']:>9.1f} "
                f"{v['ours'] / v['native']:>8.3f} {v['ours-device'] / v['native-bs']:>8.3f}"
            )
    n8 = 8 if 8 in ns else max(ns)
    scale8 = med("batched", n8) / med("batched", 1) if 1 in ns else float("nan")
    nat8 = _median(nat[n8]) / _median(nat[1]) if 1 in ns else float("nan")
    print(f"batched N={n8} / N=1: {scale8:.2f}x (native {nat8:.2f}x)")
    for m in ("batched", "notrack", "onebyone", "standin"):
        if m in modes:
            smp = ", ".join(f"{med(m, n, 'sample_us_step') / n:.0f}" for n in ns)
            stp = ", ".join(f"{med(m, n, 'step_host_us_step') / n:.0f}" for n in ns)
            print(f"{m:>8}: per branch and step, us: sample() {smp}; host part of step/commit {stp} (N = {args.ns})")
    fork = {k: _median([f[k] for f in forks if k in f]) for k in forks[0]}
    print(
        f"fork of a {args.fork_history}-token branch: {fork['fork_us']:.0f} us, prune {fork['prune_us']:.0f} us "
        f"(median of {args.fork_iters} x {len(forks)} rounds)"
        + (
            f"; fork(at={args.fork_history // 2}) {fork['fork_at_us']:.0f} us (a one-token decode included)"
            if "fork_at_us" in fork
            else ""
        )
    )
    dirty = [f for f in foreign if f > args.max_foreign]
    print(
        f"other processes' load during the kept runs: median {_median(foreign):.2f} cores, max {max(foreign):.2f}; "
        f"{len(dirty)} of {len(foreign)} runs over --max-foreign {args.max_foreign} after {args.retries} retries"
    )
    if args.json:
        result = {
            "foreign_load": foreign,
            "impl": impl,
            "native_command": cmd,
            "native_tgs": args.native_tgs,
            "config": {k: v for k, v in vars(args).items() if k != "json"},
            "build": llama_cffi.build_info()["commit"],
            "rows": rows,
            "batched_n8_over_n1": scale8,
            "native_n8_over_n1": nat8,
            "fork": fork,
            "fork_samples": forks,
            "command": command_line(sys.argv[1:] if argv is None else argv),
            "native_peak_rss_kib": max(NATIVE_RSS_KIB, default=None),
            "ours_peak_rss_kib": self_peak_rss_kib(),
        }
        args.json.write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(f"wrote {args.json}")
    ctx.close()
    model.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
