"""Distributed perplexity and batch generation (samplers.distributed on Ray) against one process.

On this machine (2 cores) workers cannot add cores, so this measures the **overhead** of
the distributed path, and the gain of batching prompts within a worker:

* perplexity of a deterministic text (``bench_perplexity.make_text``: standard-library
  docstrings, ``--tokens`` tokens of the default model) with ``-c``/``-b``:
  ``single`` (:func:`samplers.perplexity.perplexity`, one process, 2 threads) against a
  pool of **1 worker x 2 threads** and of **2 workers x 1 thread**, every run checked
  bit-identical to ``single``;
* generation of ``--prompts`` prompts x ``--gen`` tokens (top-k/top-p/temperature, seeded):
  ``sequential`` (:func:`samplers.search.generate`, one prompt at a time, 2 threads)
  against ``map_generate`` with 1 worker x 2 threads and 2 workers x 1 thread, batches of
  ``--gen-batch`` prompts (one decode per step for the batch), models loaded with
  ``use_extra_bufts=False`` (map_generate's default; the sequential run too), and
  ``1x2 repack`` (1 worker, llama.cpp's default repacked weights). The two pools without
  repacking must produce the same texts (the script fails otherwise); how many texts
  equal the sequential run's is reported (batched decodes may round differently: see
  samplers.distributed).

Each round runs every configuration once (the order rotates each round) inside one
local Ray instance (``ray.init(num_cpus=2)``); the pools are made before the rounds (their
start-up, model loads included, is reported apart). Reported: medians of tokens/s (scored
tokens for perplexity, generated tokens for generation) and the ratios to the one-process
run (> 1: faster).

    python benchmarks/bench_distributed.py [--rounds 5] [--tokens 8192] [-c 256] [-b 512] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import llama_cffi  # noqa: E402
import samplers  # noqa: E402
from benchmarks.bench_perplexity import make_text  # noqa: E402
from benchmarks.common import command_line, cpu_model, median, write_json  # noqa: E402
from samplers import distributed as D  # noqa: E402
from samplers.branch import BranchStore  # noqa: E402
from samplers.perplexity import perplexity  # noqa: E402
from samplers.search import generate  # noqa: E402

PROMPTS = [
    "Write a short poem about the sea.",
    "Explain what a hash table is.",
    "The history of the printing press begins",
    "List three uses of copper:",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The main causes of inflation are",
    "Translate to French: good morning, friends.",
]


def chain() -> samplers.SamplerChain:
    return samplers.SamplerChain([samplers.TopK(40), samplers.TopP(0.95), samplers.Temperature(0.8), samplers.Dist(0)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=8192, help="perplexity text size, in tokens")
    ap.add_argument("-c", "--ctx-size", type=int, default=256)
    ap.add_argument("-b", "--batch-size", type=int, default=512)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--gen", type=int, default=32, help="tokens generated per prompt")
    ap.add_argument("--gen-batch", type=int, default=8, help="prompts per worker batch")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    import ray

    path = str(llama_cffi.default_model_path())
    model = llama_cffi.Model.load(path)
    plain = llama_cffi.Model.load(path, use_extra_bufts=False)
    text = make_text(model, args.tokens)
    prompts = [PROMPTS[i % len(PROMPTS)] + f" ({i})" for i in range(args.prompts)]
    print(f"# {command_line(sys.argv[1:])}")
    print(f"# {cpu_model()}; default model {Path(path).name}; ray {ray.__version__}")

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    t_ray = time.perf_counter() - t0
    pools: dict[str, D.Workers] = {}
    starts: dict[str, float] = {}
    for name, n, thr, params in (
        ("ppl 1x2", 1, 2, {}),
        ("ppl 2x1", 2, 1, {}),
        ("gen 1x2", 1, 2, {"use_extra_bufts": False}),
        ("gen 2x1", 2, 1, {"use_extra_bufts": False}),
        ("gen 1x2 repack", 1, 2, {}),
    ):
        t0 = time.perf_counter()
        # the pools coexist: reserve no Ray CPUs (they take turns, never run together)
        pools[name] = D.Workers(path, n, thr, params, cpus_per_worker=0.01)
        starts[name] = time.perf_counter() - t0
    print(
        f"ray.init {t_ray:.2f} s; pool start-up (model loads included): "
        + ", ".join(f"{k} {v:.2f} s" for k, v in starts.items())
    )

    ref = perplexity(model, text, args.ctx_size, args.batch_size, n_threads=2)
    n_eval = ref.n_chunks * ref.n_ctx
    ref_texts: list[str] = []
    with plain.context(n_ctx=1024, n_seq_max=1, n_threads=2, n_threads_batch=2) as ctx:
        store = BranchStore(ctx)
        for i, p in enumerate(prompts):
            ref_texts.append(generate(store, p, max_tokens=args.gen, sampler=chain(), seed=i))
    print(f"perplexity: {ref.n_chunks} chunks of {ref.n_ctx} ({n_eval} tokens evaluated, {ref.count} scored), {ref}")

    def run_ppl(name: str) -> float:
        t0 = time.perf_counter()
        if name == "single":
            res = perplexity(model, text, args.ctx_size, args.batch_size, n_threads=2)
        else:
            res = pools["ppl " + name].perplexity(text, args.ctx_size, args.batch_size)
        dt = time.perf_counter() - t0
        if res != ref:
            raise SystemExit(f"{name}: the result differs from the single process: {res} vs {ref}")
        return n_eval / dt

    gen_texts: dict[str, list[str]] = {}

    def run_gen(name: str) -> tuple[float, int]:
        t0 = time.perf_counter()
        if name == "single":
            texts = []
            with plain.context(n_ctx=1024, n_seq_max=1, n_threads=2, n_threads_batch=2) as ctx:
                store = BranchStore(ctx)
                for i, p in enumerate(prompts):
                    texts.append(generate(store, p, max_tokens=args.gen, sampler=chain(), seed=i))
            n_tok = sum(len(plain.tokenize(t, add_special=False)) for t in texts)
        else:
            gens = pools["gen " + name].map_generate(
                prompts, sampler=chain(), max_tokens=args.gen, seed=0, batch_size=args.gen_batch, n_ctx=1024
            )
            texts = [g.text for g in gens]
            n_tok = sum(len(g.tokens) for g in gens)
        dt = time.perf_counter() - t0
        if name == "single" and texts != ref_texts:
            raise SystemExit("the sequential run is not deterministic")
        if gen_texts.setdefault(name, texts) != texts:
            raise SystemExit(f"{name}: generated texts differ from its previous round")
        return n_tok / dt, n_tok

    names = ["single", "1x2", "2x1"]
    gnames = [*names, "1x2 repack"]
    ppl: dict[str, list[float]] = {k: [] for k in names}
    gen: dict[str, list[float]] = {k: [] for k in gnames}
    for r in range(args.rounds):
        for name in names[r % 3 :] + names[: r % 3]:
            ppl[name].append(run_ppl(name))
        for name in gnames[r % 4 :] + gnames[: r % 4]:
            gen[name].append(run_gen(name)[0])
        print(
            f"round {r + 1}: perplexity "
            + "  ".join(f"{k} {ppl[k][-1]:.0f}" for k in names)
            + " tok/s | generation "
            + "  ".join(f"{k} {gen[k][-1]:.1f}" for k in gnames)
            + " tok/s"
        )
    if gen_texts["1x2"] != gen_texts["2x1"]:
        raise SystemExit("1 worker and 2 workers generated different texts")
    agree = {k: sum(a == b for a, b in zip(gen_texts[k], ref_texts, strict=True)) for k in gnames}
    for p in pools.values():
        p.close()
    ray.shutdown()

    print()
    print(
        f"medians of {args.rounds} interleaved rounds; distributed perplexity == single process in every round; "
        f"generation: 1 worker == 2 workers; texts equal to sequential: "
        + ", ".join(f"{k} {agree[k]}/{len(prompts)}" for k in gnames[1:])
    )
    print(f"{'':46}{'tok/s':>9}{'/single':>9}")
    rows: dict[str, Any] = {}
    for what, data, label in (
        ("perplexity", ppl, "single process, 2 threads"),
        ("generation", gen, "sequential, 2 threads"),
    ):
        base = median(data["single"])
        for k, desc in (
            ("single", label),
            ("1x2", "1 worker x 2 threads"),
            ("2x1", "2 workers x 1 thread"),
            ("1x2 repack", "1 worker x 2 threads, repacked"),
        ):
            if k not in data:
                continue
            m = median(data[k])
            print(f"{what + ' ' + desc:46}{m:9.1f}{m / base:9.2f}")
            rows[f"{what}/{k}"] = {"median_tok_s": m, "ratio": m / base, "rounds": data[k]}
    if args.json:
        write_json(
            args.json,
            {
                "argv": sys.argv,
                "startup_s": starts,
                "ray_init_s": t_ray,
                "results": rows,
                "ppl": str(ref),
                "texts_equal_to_sequential": agree,
            },
        )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
