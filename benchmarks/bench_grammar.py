"""Grammar-constrained sampling: samplers.grammar against llama.cpp's native grammar sampler.

On the default model (vocabulary 262,144) with llama.cpp's ``grammars/json.gbnf``:

1. **Full-mask time per token**: along one token sequence (a JSON document the model
   writes under the grammar), the time to compute the mask over the whole vocabulary,
   native (``llama_sampler_apply`` of ``llama_sampler_init_grammar`` on all tokens) and
   ours (``GrammarMatcher.allowed_tokens``), interleaved step by step. Ours is reported
   cold (a fresh compiled grammar: empty mask cache, so each new parser state is
   computed once), warm (a second pass: every state cached) and with no mask cache at
   all (every mask computed by the trie walk; transitions already known). Median and p99 of each, and the ratios.
2. **Generation tokens/s**: the same sampling chain unconstrained, with our
   ``GrammarSampler`` (llama.cpp's fast path), and with the native grammar sampler in
   a native chain, interleaved rounds in one process.

    python benchmarks/bench_grammar.py [--tokens 96] [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import llama_cffi
import samplers as S
from benchmarks.common import command_line, self_peak_rss_kib, write_json
from benchmarks.native_tools import llama_cpp_source_dir
from llama_cffi.sampling import LlamaSampler, TokenDataArray
from samplers.grammar import Grammar, GrammarSampler

PROMPT = "Write a JSON object describing a person with a name, an age, a list of hobbies and an address:\n"


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def json_sequence(m: llama_cffi.Model, gbnf: str, n_tok: int) -> list[int]:
    """Tokens the model writes greedily under the grammar (our sampler; checked native below)."""
    with m.context(n_ctx=n_tok + 64, n_threads=2, n_threads_batch=2) as ctx:
        chain = S.SamplerChain([GrammarSampler(Grammar.from_gbnf(gbnf), m), S.Greedy()])
        ctx.decode(m.tokenize(PROMPT))
        out: list[int] = []
        for _ in range(n_tok):
            tok = chain.sample(ctx)
            if m.vocab.is_eog(tok):
                break
            out.append(tok)
            ctx.decode_single(tok)
        return out


def bench_masks(m: llama_cffi.Model, gbnf: str, seq: list[int]) -> dict[str, float]:
    n = m.vocab.n_vocab
    tda = TokenDataArray(n)
    zeros = np.zeros(n, np.float32)
    nat = LlamaSampler.grammar(m, gbnf)
    g = Grammar.from_gbnf(gbnf)
    compiled = g.compile(m)  # compile cost reported separately below
    cold = compiled.matcher()
    t_nat: list[float] = []
    t_cold: list[float] = []
    for i, tok in enumerate(seq):
        for who in ("nat", "ours") if i % 2 == 0 else ("ours", "nat"):
            if who == "nat":
                tda.fill_logits(zeros)
                t0 = time.perf_counter()
                nat.apply(tda)
                t_nat.append(time.perf_counter() - t0)
                want = tda.logits > -np.inf
            else:
                t0 = time.perf_counter()
                got = cold.allowed_tokens()
                t_cold.append(time.perf_counter() - t0)
        if not np.array_equal(want, got):
            raise AssertionError(f"masks differ at step {i}")
        nat.accept(tok)
        assert cold.accept_token(tok)
    warm = compiled.matcher()
    t_warm: list[float] = []
    t_walk: list[float] = []
    for tok in seq:
        t0 = time.perf_counter()
        warm.allowed_tokens()
        t_warm.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        compiled._walk_packed(warm.state, warm.partial)  # no mask cache: the trie walk itself
        t_walk.append(time.perf_counter() - t0)
        warm.accept_token(tok)
    res = {
        "native_median_ms": statistics.median(t_nat) * 1e3,
        "native_p99_ms": pct(t_nat, 99) * 1e3,
        "cold_median_ms": statistics.median(t_cold) * 1e3,
        "cold_p99_ms": pct(t_cold, 99) * 1e3,
        "warm_median_ms": statistics.median(t_warm) * 1e3,
        "warm_p99_ms": pct(t_warm, 99) * 1e3,
        "walk_median_ms": statistics.median(t_walk) * 1e3,
        "walk_p99_ms": pct(t_walk, 99) * 1e3,
    }
    print(f"full mask over {n} tokens, {len(seq)} steps of a JSON document (json.gbnf):")
    print(f"  native        median {res['native_median_ms']:8.2f} ms   p99 {res['native_p99_ms']:8.2f} ms")
    print(
        f"  ours (cold)   median {res['cold_median_ms']:8.2f} ms   p99 {res['cold_p99_ms']:8.2f} ms   "
        f"ratio median {res['cold_median_ms'] / res['native_median_ms']:.3f}"
    )
    print(
        f"  ours (warm)   median {res['warm_median_ms']:8.2f} ms   p99 {res['warm_p99_ms']:8.2f} ms   "
        f"ratio median {res['warm_median_ms'] / res['native_median_ms']:.3f}"
    )
    print(
        f"  ours (no mask cache: every mask walked)  median {res['walk_median_ms']:8.2f} ms   "
        f"p99 {res['walk_p99_ms']:8.2f} ms   ratio median {res['walk_median_ms'] / res['native_median_ms']:.3f}"
    )
    return res


def bench_generation(m: llama_cffi.Model, gbnf: str, n_tok: int, rounds: int) -> dict[str, float]:
    g = Grammar.from_gbnf(gbnf)
    g.compile(m)
    prompt = m.tokenize(PROMPT)
    res: dict[str, list[float]] = {"free": [], "grammar": [], "native": []}
    with m.context(n_ctx=n_tok + 64, n_threads=2, n_threads_batch=2) as ctx:
        for r in range(rounds):
            modes = ["free", "grammar", "native"]
            for mode in modes[r % 3 :] + modes[: r % 3]:
                if mode == "native":
                    chain: object = LlamaSampler.chain(
                        [
                            LlamaSampler.grammar(m, gbnf),
                            LlamaSampler.top_k(40),
                            LlamaSampler.temp(0.8),
                            LlamaSampler.dist(7),
                        ]
                    )
                else:
                    extra = [GrammarSampler(g, m)] if mode == "grammar" else []
                    chain = S.SamplerChain([*extra, S.TopK(40), S.Temperature(0.8), S.Dist(7)])
                ctx.memory.clear()
                ctx.decode(prompt)
                done = 0
                t0 = time.perf_counter()
                for _ in range(n_tok):
                    tok = chain.sample(ctx)  # type: ignore[attr-defined]
                    done += 1
                    if mode != "free" and m.vocab.is_eog(tok):
                        break
                    ctx.decode_single(tok)
                res[mode].append(done / (time.perf_counter() - t0))
    out = {k: statistics.median(v) for k, v in res.items()}
    print(f"generation ({n_tok} tokens max, {rounds} interleaved rounds, top-k 40 / temp 0.8 / dist):")
    print(
        f"  unconstrained {out['free']:6.1f} tok/s   our grammar {out['grammar']:6.1f} tok/s "
        f"(ratio {out['grammar'] / out['free']:.3f})   native grammar {out['native']:6.1f} tok/s "
        f"(ratio {out['native'] / out['free']:.3f})"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, help="also write the results here, as JSON")
    args = ap.parse_args(argv)
    gbnf = (llama_cpp_source_dir() / "grammars" / "json.gbnf").read_text()
    m = llama_cffi.Model.load(llama_cffi.default_model_path())
    t0 = time.perf_counter()
    Grammar.from_gbnf(gbnf).compile(m)
    compile_s = time.perf_counter() - t0
    print(f"vocabulary index + compile of json.gbnf: {compile_s:.2f} s (once per grammar and vocabulary)")
    seq = json_sequence(m, gbnf, args.tokens)
    print("sequence:", m.vocab.detokenize(seq)[:200].replace("\n", "\\n"))
    masks = bench_masks(m, gbnf, seq)
    gen = bench_generation(m, gbnf, args.tokens, args.rounds)
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "bench_grammar",
                "command": command_line(sys.argv[1:] if argv is None else argv),
                "config": {"tokens": args.tokens, "rounds": args.rounds, "grammar": "grammars/json.gbnf"},
                "n_vocab": m.vocab.n_vocab,
                "compile_s": compile_s,
                "sequence_tokens": len(seq),
                "masks": masks,
                "generation_tps": gen,
                "peak_rss_kib": self_peak_rss_kib(),
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
