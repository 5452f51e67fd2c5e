"""Many prompts at once: samplers.many.generate_many against llama.cpp's llama-parallel.

``llama-parallel`` (examples/parallel, built from the same llama.cpp source) simulates
``-np`` clients serving ``-ns`` requests with continuous batching; with ``-pps`` its
system prompt is decoded once and copied to every client (``seq_cp``). Each request is
the system prompt, ``User:\\n<question>\\nAssistant:\\n`` for a question it draws with
``std::mt19937(1234)``, and ends at an end-of-generation token, ``-n`` tokens, or when
the answer contains ``User:``.

Ours runs the same requests: the questions are read from the example's source and drawn
with the same generator (numpy's MT19937, seeded as ``std::mt19937``), the prompt is
tokenized as llama-parallel does (system prompt with BOS, the rest without), the stop
string is ``User:``, sampling is greedy in both (``--temp 0``), ``share_prefixes=True``
plays the part of ``-pps`` (the system prompt copied rather than decoded), with a
unified KV cache in both (``-kvu``). The measure is llama-parallel's own: prompt plus
generated tokens per second of the serving loop (model load excluded; the prompt tokens
counted without the shared system prompt, whose decode is timed), and the generated
tokens per second. Runs alternate, each in a fresh process; the table has
medians and ratios (ours / llama-parallel: above 1.0 ours is faster).

llama-parallel draws its questions from a short list (9 distinct among the first 64), so
ours, which shares any common prefix, copies most of a repeated question's prompt too:
the table gives the prompt tokens each decoded. ``--no-share`` makes ours decode every
prompt in full (the system prompt included, which llama-parallel decodes once): a bound
from below.

Then HellaSwag: ``llama-perplexity --hellaswag`` against ``python -m samplers.perplexity
--hellaswag`` on a file of ``--hellaswag-tasks`` tasks written in its layout, whole
processes timed (model load on both sides), alternating; the accuracy lines they print
must agree.

Then, with ``--cache-requests N``: prefix reuse across calls through a
:class:`~samplers.prompt_cache.PromptCache` (ours alone: llama-parallel has no calls):
``N`` requests sharing a ``--cache-header``-token header, the prompt tokens decoded and
the time, through ``generate_many`` in calls of ``--cache-per-call`` and through one
``complete`` per request, against a few ``complete`` calls without the cache.

Usage: ``python benchmarks/bench_many.py [--clients 8,16,32] [--sequences 64] [-n 32]
[--rounds 3] [--threads 2] [--no-share] [--hellaswag-tasks 100] [--cache-requests 1000]
[--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks import common  # noqa: E402


def parallel_source() -> Path:
    from benchmarks import native_tools

    return native_tools.llama_cpp_source_dir() / "examples" / "parallel" / "parallel.cpp"


def _cpp_strings(block: str) -> list[str]:
    out = []
    for m in re.finditer(r'"((?:[^"\\]|\\.)*)"', block):
        out.append(bytes(m.group(1), "utf-8").decode("unicode_escape").encode("latin-1").decode("utf-8"))
    return out


def workload(n_seq: int) -> tuple[str, list[str]]:
    """llama-parallel's system prompt and the questions of its first ``n_seq`` requests,
    read from its source and drawn as it draws them (two ``rng()`` calls a request: the
    question, then the junk count, which is 0 at the default ``--junk 1``)."""
    import numpy as np

    src = parallel_source().read_text()
    system = re.search(r'k_system\s*=\s*\nR"\((.*?)\)";', src, re.S)
    prompts = re.search(r"k_prompts\s*=\s*\{(.*?)\};", src, re.S)
    if system is None or prompts is None:
        raise RuntimeError(f"{parallel_source()}: k_system or k_prompts not found")
    questions = _cpp_strings(prompts.group(1))
    bg = np.random.MT19937()
    bg._legacy_seeding(1234)  # std::mt19937(1234): init_genrand
    draws = bg.random_raw(2 * n_seq)
    return system.group(1), [questions[int(draws[2 * i]) % len(questions)] for i in range(n_seq)]


def run_native(binary: Path, model: Path, clients: int, n_seq: int, n_predict: int, n_ctx: int, threads: int) -> dict:
    cmd = [str(binary), "-m", str(model), "-np", str(clients), "-ns", str(n_seq), "-n", str(n_predict)]
    cmd += ["-c", str(n_ctx), "-t", str(threads), "-tb", str(threads), "--temp", "0", "-pps", "-kvu"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    text = p.stdout + p.stderr
    if p.returncode != 0:
        raise RuntimeError(f"llama-parallel failed ({p.returncode}): {text[-2000:]}")
    got = {}
    for key, label in (("prompt", "Total prompt tokens"), ("gen", "Total gen tokens")):
        m = re.search(rf"{label}:\s+(\d+), speed:\s+([\d.]+) t/s", text)
        if m is None:
            raise RuntimeError(f"llama-parallel's output has no '{label}' line: {text[-2000:]}")
        got[key] = (int(m.group(1)), float(m.group(2)))
    m = re.search(r"Total speed \(AVG\):\s+speed:\s+([\d.]+) t/s", text)
    assert m is not None, text[-2000:]
    total_tps = float(m.group(1))
    seconds = (got["prompt"][0] + got["gen"][0]) / total_tps
    return {
        "prompt_tokens": got["prompt"][0],
        "gen_tokens": got["gen"][0],
        "seconds": seconds,
        "total_tps": total_tps,
        "gen_tps": got["gen"][0] / seconds,
        "command": shlex.join(cmd),
    }


CHILD = r"""
import json, sys, time
sys.path.insert(0, {root!r})
from benchmarks.bench_many import workload
import llama_cffi as lc
from samplers.branch import BranchStore
from samplers.many import ManyStats, generate_many
clients, n_seq, n_predict, n_ctx, threads, share = {args!r}
system, questions = workload(n_seq)
m = lc.Model.load({model!r})
ctx = m.context(n_ctx=n_ctx, n_seq_max=clients + 1, kv_unified=True, n_threads=threads, n_threads_batch=threads)
store = BranchStore(ctx)
sys_toks = [int(t) for t in m.vocab.tokenize(system, add_special=True)]
def user_part(q):
    return [int(t) for t in m.vocab.tokenize("User:\n" + q + "\nAssistant:\n", add_special=False)]
prompts = [sys_toks + user_part(q) for q in questions]
st = ManyStats()
t0 = time.perf_counter()
rs = generate_many(store, prompts, max_tokens=n_predict, stop=["User:"], n_parallel=clients, keep_prefixes=1,
                   share_prefixes=share, stats=st)
dt = time.perf_counter() - t0
gen = sum(len(r.tokens) for r in rs)
user = st.prompt_tokens - len(sys_toks) * len(prompts)  # llama-parallel counts no system prompt
print(json.dumps({{"prompt_tokens": user, "all_prompt_tokens": st.prompt_tokens,
                  "prefill_tokens": st.prefill_tokens, "shared_tokens": st.shared_tokens,
                  "gen_tokens": gen, "seconds": dt, "total_tps": (user + gen) / dt, "gen_tps": gen / dt,
                  "decodes": st.decodes, "steps": st.steps}}))
"""


def run_ours(
    model: Path, clients: int, n_seq: int, n_predict: int, n_ctx: int, threads: int, share: bool = True
) -> dict:
    args = (clients, n_seq, n_predict, n_ctx, threads, share)
    code = CHILD.format(root=str(HERE.parent), args=args, model=str(model))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"ours failed ({p.returncode}): {p.stderr[-2000:]}")
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


SUBJECTS = ["A man", "A woman", "The chef", "A child", "The dog", "Two friends", "The teacher", "A cyclist"]
ACTIONS = ["is cooking dinner in a kitchen", "walks along a beach", "paints a fence", "plays the guitar on stage"]
ENDINGS = [
    "then adds salt to the pot and stirs it slowly with a wooden spoon.",
    "and the sea washes over the sand while the gulls circle overhead.",
    "picks up a brush, dips it in white paint and starts at the top.",
    "strums a chord, nods to the drummer and the crowd cheers loudly.",
    "suddenly flies to the moon on a silver spoon and never comes back.",
    "eats the kitchen table with a purple umbrella and a cup of tea.",
    "turns into a cloud of numbers that rains on the neighbours' roof.",
    "sings to the refrigerator about taxes until the milk goes sour.",
]


def write_hellaswag(path: Path, n: int, seed: int = 0) -> Path:
    """``n`` HellaSwag-like tasks in llama.cpp's layout (context, gold index, 4 endings)."""
    import random

    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        a = rng.randrange(len(ACTIONS))
        gold = rng.randrange(4)
        wrong = rng.sample([e for i, e in enumerate(ENDINGS) if i != a], 3)
        lines += [f"Activity: {rng.choice(SUBJECTS)} {ACTIONS[a]}", str(gold), *wrong[:gold], ENDINGS[a], *wrong[gold:]]
    path.write_text("\n".join(lines) + "\n")
    return path


def run_hellaswag(model: Path, tasks: int, threads: int, rounds: int) -> dict[str, Any]:
    """``llama-perplexity --hellaswag`` against ``python -m samplers.perplexity --hellaswag``
    on the same file and settings, wall-clock of each whole process (model load included on
    both sides), alternating; the printed accuracy lines must agree."""
    import tempfile

    from benchmarks import native_tools

    binary = native_tools.build_llama_tool("llama-perplexity")
    out: dict[str, Any] = {"native": [], "ours": [], "same_lines": True}
    with tempfile.TemporaryDirectory() as tmp:
        f = write_hellaswag(Path(tmp) / "hs.txt", tasks)
        args = ["-m", str(model), "-f", str(f), "--hellaswag", "--hellaswag-tasks", str(tasks), "-t", str(threads)]
        cmds = {"native": [str(binary), *args], "ours": [sys.executable, "-m", "samplers.perplexity", *args]}
        lines: dict[str, list[str]] = {}
        for r in range(rounds):
            for who in ("ours", "native") if r % 2 == 0 else ("native", "ours"):
                t = time.perf_counter()
                p = subprocess.run(cmds[who], capture_output=True, text=True, timeout=1800, cwd=str(HERE.parent))
                out[who].append(time.perf_counter() - t)
                if p.returncode != 0:
                    raise RuntimeError(f"{who} failed: {p.stderr[-2000:]}")
                lines[who] = re.findall(r"^\d+\t[\d.]+%\t\[.*\]$", p.stdout + p.stderr, re.M)
        out["same_lines"] = lines["ours"] == lines["native"] and len(lines["ours"]) == tasks
        out["final"] = lines["ours"][-1] if lines["ours"] else ""
        out["commands"] = {k: shlex.join(v) for k, v in cmds.items()}
    return out


def run_prompt_cache(model: Path, requests: int, header_tokens: int, per_call: int, threads: int) -> dict[str, Any]:
    """Prefix reuse across calls (in this process): ``requests`` prompts, each a
    ``header_tokens``-token header and a short question, one greedy token each, through a
    :class:`~samplers.prompt_cache.PromptCache`: with ``generate_many`` in calls of
    ``per_call`` prompts, then with ``complete`` one call per prompt. Counts the prompt
    tokens decoded (ideally the header once plus every question) and times both, and a
    few ``complete`` calls without the cache for the per-request cost it saves."""
    from llama_cffi import Model
    from samplers.branch import BranchStore
    from samplers.many import ManyStats, generate_many
    from samplers.prompt_cache import PromptCache
    from samplers.search import complete

    out: dict[str, Any] = {"requests": requests, "header_tokens": header_tokens, "per_call": per_call}
    with Model.load(model) as m:
        vocab = m.vocab
        words = " ".join(
            f"Rule {i}: answer briefly, cite rule {i * 7 % 101}, and never repeat rule {i}." for i in range(200)
        )
        header = [int(t) for t in vocab.tokenize(words)][:header_tokens]
        asks = [f"\nQuestion {i}: what is {i} plus {i + 1}?\nAnswer:" for i in range(requests)]
        questions = [[int(t) for t in vocab.tokenize(q, add_special=False)] for q in asks]
        suffixes = sum(len(q) for q in questions)
        out["ideal_prefill"] = header_tokens + suffixes
        out["no_cache_prefill"] = requests * header_tokens + suffixes
        params = {"n_ctx": 8192, "n_seq_max": 17, "kv_unified": True, "n_threads": threads, "n_threads_batch": threads}
        with m.context(**params) as ctx:
            store = BranchStore(ctx)
            cache = PromptCache(store, max_entries=2)
            prefill, t0 = 0, time.perf_counter()
            for i in range(0, requests, per_call):
                st = ManyStats()
                generate_many(store, [header + q for q in questions[i : i + per_call]], max_tokens=1, cache=cache,
                              n_parallel=16, stats=st)  # fmt: skip
                prefill += st.prefill_tokens
            out["many"] = {"prefill": prefill, "seconds": time.perf_counter() - t0}
        with m.context(**params) as ctx:
            store = BranchStore(ctx)
            cache = PromptCache(store, max_entries=2)
            t0 = time.perf_counter()
            cached = sum(complete(store, header + q, max_tokens=1, cache=cache).cached_tokens for q in questions)
            seconds = time.perf_counter() - t0
            out["complete"] = {"prefill": requests * header_tokens + suffixes - cached, "seconds": seconds}
            few = min(10, requests)
            t0 = time.perf_counter()
            for q in questions[:few]:
                complete(store, header + q, max_tokens=1)
            out["complete_no_cache"] = {"requests": few, "seconds": time.perf_counter() - t0}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="8,16,32")
    ap.add_argument("--sequences", type=int, default=64)
    ap.add_argument("-n", "--n-predict", type=int, default=32)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--no-share",
        action="store_true",
        help="ours decodes every prompt in full (llama-parallel still shares its system prompt)",
    )
    ap.add_argument("--hellaswag-tasks", type=int, default=100, help="0: leave the HellaSwag comparison out")
    ap.add_argument(
        "--cache-requests", type=int, default=0, help="prefix reuse across calls: this many requests (0: left out)"
    )
    ap.add_argument("--cache-header", type=int, default=500, help="the shared header's tokens")
    ap.add_argument("--cache-per-call", type=int, default=100, help="prompts per generate_many call")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    import llama_cffi
    from benchmarks import native_tools

    model = Path(llama_cffi.default_model_path())
    binary = native_tools.build_llama_example("parallel")
    rows: list[dict[str, Any]] = []
    for clients in (int(x) for x in args.clients.split(",") if x):
        res: dict[str, list[dict]] = {"ours": [], "native": []}
        for r in range(args.rounds):
            order = ("ours", "native") if r % 2 == 0 else ("native", "ours")
            for who in order:
                common_args = (clients, args.sequences, args.n_predict, args.n_ctx, args.threads)
                t = time.perf_counter()
                if who == "ours":
                    res[who].append(run_ours(model, *common_args, share=not args.no_share))
                else:
                    res[who].append(run_native(binary, model, *common_args))
                print(
                    f"# clients={clients} round {r} {who}: {json.dumps(res[who][-1])} "
                    f"({time.perf_counter() - t:.0f} s)",
                    file=sys.stderr,
                )
        med = {
            w: {k: common.median([x[k] for x in v]) for k in ("total_tps", "gen_tps", "prompt_tokens", "gen_tokens")}
            for w, v in res.items()
        }
        rows.append(
            {
                "clients": clients,
                "ours": med["ours"],
                "native": med["native"],
                "runs": res,
                "ratio_total": med["ours"]["total_tps"] / med["native"]["total_tps"],
                "ratio_gen": med["ours"]["gen_tps"] / med["native"]["gen_tps"],
            }
        )
    print(
        f"model {model.name}, {args.sequences} requests, -n {args.n_predict}, {args.threads} threads, "
        f"{args.rounds} rounds (medians)"
    )
    print(
        "| clients | ours prompt+gen t/s | llama-parallel | ratio | ours gen t/s | llama-parallel | ratio "
        "| ours prompt / prefilled / gen tokens | llama-parallel prompt / gen tokens |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        o, n = row["ours"], row["native"]
        ours_runs = row["runs"]["ours"]
        pre = common.median([x["prefill_tokens"] for x in ours_runs])
        print(
            f"| {row['clients']} | {o['total_tps']:.1f} | {n['total_tps']:.1f} | {row['ratio_total']:.2f} "
            f"| {o['gen_tps']:.1f} | {n['gen_tps']:.1f} | {row['ratio_gen']:.2f} "
            f"| {o['prompt_tokens']:.0f} / {pre:.0f} / {o['gen_tokens']:.0f} | "
            f"{n['prompt_tokens']:.0f} / {n['gen_tokens']:.0f} |"
        )
    if rows:
        print(f"llama-parallel: {rows[0]['runs']['native'][0]['command']}")
    hs: dict[str, Any] | None = None
    if args.hellaswag_tasks > 0:
        hs = run_hellaswag(model, args.hellaswag_tasks, args.threads, args.rounds)
        o, n = common.median(hs["ours"]), common.median(hs["native"])
        print(
            f"\nHellaSwag, {args.hellaswag_tasks} tasks (whole processes, model load included; medians of "
            f"{args.rounds}): ours {o:.2f} s, llama-perplexity {n:.2f} s, speed ratio {n / o:.2f}; "
            f"the same accuracy lines: {hs['same_lines']} ({hs['final']!r})"
        )
        for who, cmd in hs["commands"].items():
            print(f"{who}: {cmd}")
    pc: dict[str, Any] | None = None
    if args.cache_requests > 0:
        pc = run_prompt_cache(model, args.cache_requests, args.cache_header, args.cache_per_call, args.threads)
        nc = pc["complete_no_cache"]
        per_plain = nc["seconds"] / nc["requests"]
        print(
            f"\nPrefix reuse across calls: {pc['requests']} requests, a {pc['header_tokens']}-token header, one "
            f"token each; prompt tokens decoded (ideal: header once + questions = {pc['ideal_prefill']}; "
            f"without a cache: {pc['no_cache_prefill']})"
        )
        print("| path | prompt tokens decoded | seconds | ms / request |")
        print("|---|---:|---:|---:|")
        for key, label in (("many", f"generate_many, {pc['per_call']} per call"), ("complete", "complete, one each")):
            r = pc[key]
            print(
                f"| {label}, cache | {r['prefill']} | {r['seconds']:.1f} | {1000 * r['seconds'] / pc['requests']:.1f} |"
            )
        print(f"| complete, no cache ({nc['requests']} requests) | - | {nc['seconds']:.1f} | {1000 * per_plain:.1f} |")
    if args.json:
        common.write_json(
            args.json,
            {"rows": rows, "hellaswag": hs, "prompt_cache": pc, "args": vars(args) | {"json": str(args.json)}},
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
