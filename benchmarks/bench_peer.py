"""Ours vs native vs the peer llama-cpp-python: greedy, sampled, JSON-grammar and parallel generation.

Three sides run the same workloads on the default model, the same llama.cpp commit and
the same CPU instruction sets:

* **native**: ``native/gen_workloads.c``, the workloads written against llama.h, linked
  with the shared-library build of the pinned source (``native_tools.llama_shared_lib_dir``:
  the llama.cpp tools' options with ``BUILD_SHARED_LIBS=ON``);
* **ours**: llama_cffi and samplers, as a user writes them;
* **peer**: llama-cpp-python (the release that vendors the pinned commit), loading that very
  ``libllama.so`` through ``LLAMA_CPP_LIB_PATH``, so peer / native is its Python overhead alone.

Install the peer without compiling llama.cpp (the Python package only)::

    CMAKE_ARGS="-DLLAMA_BUILD=OFF" pip install "llama-cpp-python==0.3.36"

When it is not installed (or another version is), the script prints and records
``peer llama-cpp-python not installed: skipped`` and measures nothing.

The workloads (every side: a generation context of ``--n-ctx`` with n_batch = n_ubatch =
512, flash attention on, ``--threads`` threads; a one-token warm-up; the prompt, a request for
a JSON object, decoded before the clock starts):

* ``greedy``: ``--tokens`` times, argmax of the last logits, decode it. Ours:
  ``argmax(ctx.decode_single(tok))``; peer: ``Llama.eval([tok])`` + argmax of
  ``llama_get_logits_ith(ctx, -1)``; native: the same in C;
* ``sampled``: the chain top-k 40 -> temp 0.8 -> dist(``--seed``), made inside the timed
  part. Ours: ``SamplerChain([TopK(40), Temperature(0.8), Dist(seed)]).sample(ctx)``;
  peer: ``Llama.generate(prompt, top_k=40, top_p=1, min_p=0, temp=0.8)`` on the cached
  prompt (its extra samplers are no-ops at these values) and ``Llama.eval`` of the last
  token; native: ``llama_sampler_sample`` of the same chain;
* ``grammar``: the same chain behind llama.cpp's ``grammars/json.gbnf``, stopping at an
  end-of-generation token. Ours: ``GrammarSampler`` first (the grammar compiled before the
  clock starts, its mask cache cold in the first repetition; compile time reported); it
  takes llama.cpp's ``common_sampler`` fast path (sample without the grammar, check that
  one token, the full mask only when it is refused), so its tokens may differ from the
  others'. Peer: ``Llama.generate(..., grammar=LlamaGrammar.from_string(gbnf))``; native:
  ``llama_sampler_init_grammar`` first in the chain (the peer's chain: the grammar is
  applied to the whole vocabulary each token);
* ``parallelN`` (``--ns``): a context with ``n_seq_max`` = max N and a unified KV cache;
  the prompt decoded into sequence 0 and copied to the other N-1, then ``--tg`` steps of:
  each sequence's greedy token, one ``llama_decode`` of the N tokens. Ours:
  ``BranchStore.step({b: b.sample() ...})`` over N branches (``track=False``, a greedy
  chain each); peer: its low-level API (``llama_batch_init``, ``llama_decode``,
  ``llama_get_logits_ith`` + argmax per sequence) on a context it makes with
  ``llama_init_from_model``; native: the same in C. tok/s = N * TG / time.

Each side runs in a fresh process per round (every workload ``--reps`` times, the order
rotated); rounds rotate which side goes first, and each run waits for (and is repeated
unless it had) a quiet machine. The table shows medians over rounds (each the median of
the repetitions) and ratios ours/native, ours/peer, peer/native, with the medians of the
per-round ratios (``paired``), and whether each side wrote the same tokens as native in
its first repetition (the peer must: same library, same chains, same seed).

    python benchmarks/bench_peer.py [--rounds 3] [--reps 2] [--tokens 64] [--tg 32] [--ns 4,8] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import llama_cffi  # noqa: E402
from benchmarks.common import (  # noqa: E402
    PEER,
    ChildRun,
    command_line,
    median,
    peer_install_command,
    peer_pinned_version,
    peer_skip_reason,
    quiet_run,
    run_child,
    write_json,
)

SIDES = ("native", "ours", "peer")
PROMPT = "Write a JSON object describing a person with a name, an age, a list of hobbies and an address:\n"
NATIVE_TOOL = "gen_workloads"

# The children read the config (a JSON file, their argument) and print one JSON line:
# {"tps": {workload: [tok/s per repetition]}, "tokens": {workload: [tokens per repetition]},
#  "ids": {workload: [the tokens generated in the first repetition]} (not for parallel workloads), ...}
OURS = r"""
import json, sys, time
import numpy as np
import llama_cffi
import samplers as S
from samplers.branch import BranchStore
from samplers.grammar import Grammar, GrammarSampler

with open(sys.argv[1]) as f:
    cfg = json.load(f)
works, reps, n_tok, tg, seed, t = cfg["workloads"], cfg["reps"], cfg["tokens"], cfg["tg"], cfg["seed"], cfg["threads"]
m = llama_cffi.Model.load(cfg["model"])
prompt = m.tokenize(cfg["prompt"], add_special=True, parse_special=False)
common = dict(n_batch=512, n_ubatch=512, n_threads=t, n_threads_batch=t, flash_attn_type="enabled")
gen = m.context(n_ctx=cfg["n_ctx"], **common)
max_seq = max([int(w[8:]) for w in works if w.startswith("parallel")], default=1)
par = m.context(n_ctx=cfg["n_ctx_par"], n_seq_max=max_seq, kv_unified=True, **common) if max_seq > 1 else None
t0 = time.perf_counter()
grammar = Grammar.from_gbnf(cfg["gbnf"])
grammar.compile(m)
compile_s = time.perf_counter() - t0
for c in filter(None, (gen, par)):  # warm-up, as llama-bench's
    c.decode_single(int(prompt[0]), pos=0)

def generate(mode, out):
    gen.memory.clear()
    row = gen.decode(prompt)
    n = 0
    t0 = time.perf_counter()
    if mode == "greedy":
        for _ in range(n_tok):
            tok = int(np.asarray(row).argmax())
            out.append(tok)
            n += 1
            row = gen.decode_single(tok)
    else:
        first = [GrammarSampler(grammar, m)] if mode == "grammar" else []
        chain = S.SamplerChain([*first, S.TopK(40), S.Temperature(0.8), S.Dist(seed)])
        for _ in range(n_tok):
            tok = chain.sample(gen)
            out.append(tok)
            n += 1
            if mode == "grammar" and m.vocab.is_eog(tok):
                break
            gen.decode_single(tok)
    return n / (time.perf_counter() - t0), n

def parallel(n):
    par.memory.clear()
    store = BranchStore(par)
    root = store.create(prompt, sampler=S.SamplerChain([S.Greedy()]), track=False)
    branches = [root] + [root.fork() for _ in range(n - 1)]
    t0 = time.perf_counter()
    for _ in range(tg):
        store.step({b: b.sample() for b in branches})
    par.synchronize()
    dt = time.perf_counter() - t0
    for b in reversed(branches):
        b.prune()
    store.drain()
    return n * tg / dt, n * tg

tps = {w: [0.0] * reps for w in works}
toks = {w: [0] * reps for w in works}
ids = {w: [] for w in works if not w.startswith("parallel")}
for r in range(reps):
    for w in works[r % len(works):] + works[:r % len(works)]:
        par_n = int(w[8:]) if w.startswith("parallel") else 0
        tps[w][r], toks[w][r] = parallel(par_n) if par_n else generate(w, ids[w] if r == 0 else [])
print(json.dumps({"tps": tps, "tokens": toks, "ids": ids, "grammar_compile_s": compile_s}))
"""

PEER_CHILD = r"""
import ctypes, json, sys, time
import numpy as np
import llama_cpp

with open(sys.argv[1]) as f:
    cfg = json.load(f)
works, reps, n_tok, tg, seed, t = cfg["workloads"], cfg["reps"], cfg["tokens"], cfg["tg"], cfg["seed"], cfg["threads"]
llm = llama_cpp.Llama(model_path=cfg["model"], n_ctx=cfg["n_ctx"], n_batch=512, n_ubatch=512, n_threads=t,
                      n_threads_batch=t, flash_attn=True, seed=seed, verbose=False)
n_vocab = llm.n_vocab()
vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
prompt = llm.tokenize(cfg["prompt"].encode(), add_bos=True, special=False)
grammar = llama_cpp.LlamaGrammar.from_string(cfg["gbnf"], verbose=False)
max_seq = max([int(w[8:]) for w in works if w.startswith("parallel")], default=1)

def logits(ctx, i):
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,))

pctx = None
if max_seq > 1:  # the parallel workloads: the low-level API on a context of their own
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max, cp.kv_unified = cfg["n_ctx_par"], 512, 512, max_seq, True
    cp.n_threads, cp.n_threads_batch = t, t
    cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    pctx = llama_cpp.llama_init_from_model(llm._model.model, cp)
    assert pctx, "llama_init_from_model failed"
    batch = llama_cpp.llama_batch_init(max(len(prompt), max_seq), 0, 1)
    prompt_arr = (llama_cpp.llama_token * len(prompt))(*prompt)
    first = (llama_cpp.llama_token * 1)(prompt[0])
    assert llama_cpp.llama_decode(pctx, llama_cpp.llama_batch_get_one(first, 1)) == 0  # warm-up
llm.eval([prompt[0]])  # warm-up, as llama-bench's
is_eog = llama_cpp.llama_vocab_is_eog

def generate(mode, out):
    llm.reset()
    llm.eval(prompt)
    n = 0
    t0 = time.perf_counter()
    if mode == "greedy":
        for _ in range(n_tok):
            tok = int(logits(llm.ctx, -1).argmax())
            out.append(tok)
            n += 1
            llm.eval([tok])
    else:
        llm.set_seed(seed)
        g = grammar if mode == "grammar" else None
        it = llm.generate(prompt, top_k=40, top_p=1.0, min_p=0.0, typical_p=1.0, temp=0.8, repeat_penalty=1.0,
                          grammar=g)
        stop = False
        for tok in it:  # generate decodes a token when asked for the next one
            out.append(tok)
            n += 1
            if g is not None and is_eog(vocab, tok):
                stop = True
                break
            if n == n_tok:
                break
        if not stop:
            llm.eval([tok])  # the last token's decode
        dt = time.perf_counter() - t0
        it.close()
        return n / dt, n
    return n / (time.perf_counter() - t0), n

def parallel(n):
    mem = llama_cpp.llama_get_memory(pctx)
    llama_cpp.llama_memory_clear(mem, True)
    assert llama_cpp.llama_decode(pctx, llama_cpp.llama_batch_get_one(prompt_arr, len(prompt))) == 0
    for j in range(1, n):
        llama_cpp.llama_memory_seq_cp(mem, 0, j, -1, -1)
    pp = len(prompt)
    t0 = time.perf_counter()
    for s in range(tg):
        toks = [int(logits(pctx, -1 if s == 0 else j).argmax()) for j in range(n)]
        batch.n_tokens = n
        for j, tok in enumerate(toks):
            batch.token[j] = tok
            batch.pos[j] = pp + s
            batch.n_seq_id[j] = 1
            batch.seq_id[j][0] = j
            batch.logits[j] = True
        assert llama_cpp.llama_decode(pctx, batch) == 0
    llama_cpp.llama_synchronize(pctx)
    return n * tg / (time.perf_counter() - t0), n * tg

tps = {w: [0.0] * reps for w in works}
toks = {w: [0] * reps for w in works}
ids = {w: [] for w in works if not w.startswith("parallel")}
for r in range(reps):
    for w in works[r % len(works):] + works[:r % len(works)]:
        par_n = int(w[8:]) if w.startswith("parallel") else 0
        tps[w][r], toks[w][r] = parallel(par_n) if par_n else generate(w, ids[w] if r == 0 else [])
print(json.dumps({"tps": tps, "tokens": toks, "ids": ids, "version": llama_cpp.__version__}))
"""


def child_env(lib_dir: Path | None = None) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if lib_dir is not None:
        env["LLAMA_CPP_LIB_PATH"] = str(lib_dir)
    return env


def workloads(ns: list[int]) -> list[str]:
    return ["greedy", "sampled", "grammar", *(f"parallel{n}" for n in ns)]


def side_command(side: str, tool: Path | None, cfg: dict[str, Any], files: dict[str, Path]) -> list[str]:
    """The command of one side's run. ``files``: the grammar, the prompt, the config and the
    children's scripts, written by :func:`write_files`."""
    if side == "native":
        assert tool is not None
        return [
            str(tool),
            cfg["model"],
            str(cfg["threads"]),
            str(cfg["reps"]),
            str(cfg["tokens"]),
            str(cfg["tg"]),
            str(cfg["seed"]),
            str(files["gbnf"]),
            str(files["prompt"]),
            str(cfg["n_ctx"]),
            str(cfg["n_ctx_par"]),
            ",".join(cfg["workloads"]),
        ]
    return [sys.executable, str(files[side]), str(files["config"])]


def write_files(tmp: Path, cfg: dict[str, Any]) -> dict[str, Path]:
    files = {
        "gbnf": tmp / "json.gbnf",
        "prompt": tmp / "prompt.txt",
        "config": tmp / "config.json",
        "ours": tmp / "bench_peer_ours.py",
        "peer": tmp / "bench_peer_peer.py",
    }
    files["gbnf"].write_text(cfg["gbnf"])
    files["prompt"].write_text(cfg["prompt"])
    files["config"].write_text(json.dumps(cfg))
    files["ours"].write_text(OURS)
    files["peer"].write_text(PEER_CHILD)
    return files


def run_side(
    side: str, cmd: list[str], args: argparse.Namespace, lib_dir: Path | None
) -> tuple[dict[str, Any], ChildRun]:
    r = quiet_run(
        lambda: run_child(cmd, cwd=ROOT, env=child_env(lib_dir if side == "peer" else None), timeout=args.run_timeout),
        max_cores=args.max_foreign,
        quiet_wait=args.quiet_wait,
        retries=args.retries,
        label=side,
    ).check()
    return json.loads(r.stdout.strip().splitlines()[-1]), r


def label(w: str) -> str:
    if w.startswith("parallel"):
        return f"{w[8:]} parallel sequences"
    return {"greedy": "greedy", "sampled": "sampled (top-k/temp/dist)", "grammar": "json.gbnf grammar"}[w]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (one process per side each)")
    ap.add_argument("--reps", type=int, default=2, help="repetitions of every workload per process")
    ap.add_argument("--tokens", type=int, default=64, help="tokens generated by greedy, sampled, grammar")
    ap.add_argument("--tg", type=int, default=32, help="steps (tokens per sequence) of the parallel workloads")
    ap.add_argument("--ns", default="4,8", help="numbers of parallel sequences")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234, help="the dist sampler's seed (every side)")
    ap.add_argument("--n-ctx", type=int, default=512, help="the generation context")
    ap.add_argument("--n-ctx-par", type=int, default=1024, help="the parallel context")
    ap.add_argument("--max-foreign", type=float, default=0.15, help="cores other processes may use before a run")
    ap.add_argument("--quiet-wait", type=float, default=10.0, help="seconds to wait for a quiet machine per run")
    ap.add_argument("--retries", type=int, default=1, help="runs again when other processes used more")
    ap.add_argument("--run-timeout", type=float, default=120.0, help="seconds before a run is killed and retried")
    ap.add_argument("--json", type=Path, help="also write the results here, as JSON")
    args = ap.parse_args(argv)
    ns = [int(x) for x in args.ns.split(",") if x]
    if any(n < 2 for n in ns):
        ap.error("--ns: parallel workloads need at least 2 sequences")
    works = workloads(ns)
    base: dict[str, Any] = {
        "benchmark": "bench_peer",
        "command": command_line(sys.argv[1:] if argv is None else argv),
        "config": {
            "rounds": args.rounds,
            "reps": args.reps,
            "tokens": args.tokens,
            "tg": args.tg,
            "ns": ns,
            "threads": args.threads,
            "seed": args.seed,
            "n_ctx": args.n_ctx,
            "n_ctx_par": args.n_ctx_par,
            "workloads": works,
        },
        "peer_name": PEER,
        "peer_pinned_version": peer_pinned_version(),
        "peer_install": peer_install_command(),
    }
    skipped = peer_skip_reason()
    if skipped is not None:
        print(f"peer {PEER} {skipped}: skipped (install it with: {peer_install_command()})", flush=True)
        if args.json:
            write_json(args.json, {**base, "peer_skipped": skipped, "workloads": {}})
        return 0
    try:
        model = Path(llama_cffi.default_model_path())
    except llama_cffi.LlamaError as exc:
        print(f"skipped: {exc}")
        return 0
    from benchmarks.native_tools import build_shared_c_tool, llama_cpp_source_dir, llama_shared_lib_dir

    lib_dir = llama_shared_lib_dir()
    tool = build_shared_c_tool(NATIVE_TOOL)
    gbnf = (llama_cpp_source_dir() / "grammars" / "json.gbnf").read_text()
    cfg: dict[str, Any] = {
        "model": str(model),
        "workloads": works,
        "reps": args.reps,
        "tokens": args.tokens,
        "tg": args.tg,
        "seed": args.seed,
        "threads": args.threads,
        "n_ctx": args.n_ctx,
        "n_ctx_par": args.n_ctx_par,
        "prompt": PROMPT,
        "gbnf": gbnf,
    }
    print(
        f"native: {tool.name} on {lib_dir}; peer: {PEER} with LLAMA_CPP_LIB_PATH={lib_dir}; "
        f"workloads {', '.join(works)}; {args.rounds} rounds x {args.reps} reps, {args.tokens} tokens, "
        f"parallel {args.tg} steps; {args.threads} threads; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    samples: dict[str, dict[str, list[float]]] = {s: {w: [] for w in works} for s in SIDES}
    reps_tps: dict[str, dict[str, list[list[float]]]] = {s: {w: [] for w in works} for s in SIDES}
    tokens: dict[str, dict[str, list[list[int]]]] = {s: {w: [] for w in works} for s in SIDES}
    rss: dict[str, list[int]] = {s: [] for s in SIDES}
    foreign: list[float] = []
    compile_s: list[float] = []
    ids: dict[str, dict[str, list[int]]] = {}  # side -> workload -> tokens of its first repetition
    peer_version: str | None = None
    native_cmd: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-peer-") as tmp:
        files = write_files(Path(tmp), cfg)
        native_cmd = side_command("native", tool, cfg, files)
        for r in range(args.rounds):
            for side in SIDES[r % len(SIDES) :] + SIDES[: r % len(SIDES)]:
                d, run = run_side(side, side_command(side, tool, cfg, files), args, lib_dir)
                for w in works:
                    samples[side][w].append(median(d["tps"][w]))
                    reps_tps[side][w].append([float(x) for x in d["tps"][w]])
                    tokens[side][w].append([int(x) for x in d["tokens"][w]])
                ids.setdefault(side, d["ids"])
                if side == "ours":
                    compile_s.append(float(d["grammar_compile_s"]))
                if side == "peer":
                    peer_version = str(d["version"])
                rss[side].append(run.peak_rss_kib)
                foreign.append(run.foreign_cores)
            other = max(foreign[-len(SIDES) :])
            print(
                f"round {r + 1}: "
                + "  ".join(f"{w} " + "/".join(f"{samples[s][w][-1]:.1f}" for s in SIDES) for w in works)
                + f" tok/s (native/ours/peer; other load {other:.2f} cores)",
                flush=True,
            )

    def paired(a: str, b: str, w: str) -> float:
        return median([x / y for x, y in zip(samples[a][w], samples[b][w], strict=True)])

    rows: dict[str, Any] = {}
    print()
    print(
        f"tokens/s, medians of {args.rounds} interleaved rounds (each the median of {args.reps} reps); "
        f"paired: the median of the per-round ratios; load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'workload':28} {'native':>8} {'ours':>8} {'peer':>8} {'ours/nat':>8} {'ours/peer':>9} {'peer/nat':>8}"
        f"  {'paired o/n':>10} {'o/p':>6} {'p/n':>6}"
    )
    for w in works:
        v = {s: median(samples[s][w]) for s in SIDES}
        row: dict[str, Any] = {
            "native_tps": v["native"],
            "ours_tps": v["ours"],
            "peer_tps": v["peer"],
            "ours_over_native": v["ours"] / v["native"],
            "ours_over_peer": v["ours"] / v["peer"],
            "peer_over_native": v["peer"] / v["native"],
            "paired": {
                "ours_over_native": paired("ours", "native", w),
                "ours_over_peer": paired("ours", "peer", w),
                "peer_over_native": paired("peer", "native", w),
            },
            "samples_tps": {s: samples[s][w] for s in SIDES},
            "reps_tps": {s: reps_tps[s][w] for s in SIDES},
            "tokens": {s: tokens[s][w] for s in SIDES},
        }
        if w in ids["native"]:  # the same tokens as native: the same work (ours: other libraries, same kernels)
            row["same_tokens_as_native"] = {s: ids[s][w] == ids["native"][w] for s in ("ours", "peer")}
        rows[w] = row
        p = row["paired"]
        print(
            f"{label(w):28} {v['native']:>8.1f} {v['ours']:>8.1f} {v['peer']:>8.1f} {row['ours_over_native']:>8.3f} "
            f"{row['ours_over_peer']:>9.3f} {row['peer_over_native']:>8.3f}  {p['ours_over_native']:>10.3f} "
            f"{p['ours_over_peer']:>6.3f} {p['peer_over_native']:>6.3f}"
        )
    same = {w: r["same_tokens_as_native"] for w, r in rows.items() if "same_tokens_as_native" in r}
    print(
        "the same tokens as native (first repetition): "
        + "; ".join(
            f"{w}: ours {'yes' if v['ours'] else 'no'}, peer {'yes' if v['peer'] else 'no'}" for w, v in same.items()
        )
    )
    if "grammar" in works:
        n_gram = {s: median([median(t) for t in tokens[s]["grammar"]]) for s in SIDES}
        print(
            "grammar: tokens generated (median) "
            + ", ".join(f"{s} {n_gram[s]:.0f}" for s in SIDES)
            + f"; ours' grammar compile {median(compile_s):.2f} s (not timed)"
        )
    if args.json:
        write_json(
            args.json,
            {
                **base,
                "peer_skipped": None,
                "peer_version": peer_version,
                "peer_lib_dir": str(lib_dir),
                "native_command": native_cmd,
                "workloads": rows,
                "grammar_compile_s": median(compile_s),
                "peak_rss_kib": {s: max(v) for s, v in rss.items() if v},
                "foreign_cores": foreign,
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
