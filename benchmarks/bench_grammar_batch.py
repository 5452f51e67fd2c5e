"""Batched grammar masks: the masks of N branches in one ``fill_masks`` call against N single masks.

On the default model's vocabulary (262,144 tokens), N matchers (N = 8, 64, 256 by default)
under the grammars of ``bench_grammar_peers.py`` (its JSON schemas and json.gbnf, compiled
with ``mask_cache_size=0``: every mask computed by the walk), matcher ``i`` under grammar
``i % K`` advanced by ``i // K`` tokens of that grammar's document plus an offset, so the
matchers sit in different grammars and parser states. Every parser state is visited
once before timing (what a state needs besides its mask, its run and plan, is made on a
first visit, as it would be by the step that reached it).

Measured, interleaved over rounds (medians): the single-mask time of each matcher
(``matcher.fill_mask(row)``), its median and sum over the N, and the time of one
``samplers.grammar.fill_masks(matchers, out)`` call. Reported: ``batch / (N x single
median)`` (issue 41's target: at most 1.0) and ``batch / sum of singles``. Matchers in
the same (grammar, state) are computed once by ``fill_masks`` and copied; their number
is reported (``distinct``).

    python benchmarks/bench_grammar_batch.py [--ns 8,64,256] [--rounds 21] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_grammar_peers import CASES, json_gbnf_path  # noqa: E402
from benchmarks.common import command_line, write_json  # noqa: E402


def build(model: Any, n: int) -> tuple[list[Any], int]:
    """N matchers in different grammars and states, and how many (grammar, state) pairs
    are distinct."""
    from samplers.grammar import Grammar

    grammars = []
    for case in CASES.values():
        g = (
            Grammar.from_gbnf(json_gbnf_path().read_text())
            if case.schema is None
            else Grammar.from_json_schema(case.schema)
        )
        grammars.append((g.compile(model, mask_cache_size=0), model.tokenize(case.doc, add_special=False).tolist()))
    k = len(grammars)
    out = []
    for i in range(n):
        compiled, toks = grammars[i % k]
        m = compiled.matcher()
        steps = min(len(toks), (i // k) * 3 + (i % 5))
        for t in toks[:steps]:
            assert m.accept_token(t)
        out.append(m)
    distinct = len({(id(m.compiled), m.state, m.partial) for m in out})
    return out, distinct


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ns", default="8,64,256")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    import llama_cffi
    from samplers.grammar import fill_masks

    path = args.model or llama_cffi.default_model_path()
    model = llama_cffi.Model.load(path, vocab_only=True)
    ns = [int(x) for x in args.ns.split(",")]
    rows = []
    for n in ns:
        matchers, distinct = build(model, n)
        n_words = matchers[0].compiled.n_words
        out = np.empty((n, n_words), dtype=np.uint32)
        fill_masks(matchers, out)  # first visits: runs and plans of every state
        for i, m in enumerate(matchers):
            m.fill_mask(out[i])
        singles: list[list[float]] = [[] for _ in matchers]
        batch: list[float] = []
        check = np.empty_like(out)
        for _ in range(args.rounds):
            for i, m in enumerate(matchers):
                t0 = time.perf_counter()
                m.fill_mask(check[i])
                singles[i].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            fill_masks(matchers, out)
            batch.append(time.perf_counter() - t0)
            if not np.array_equal(out, check):
                raise AssertionError("fill_masks differs from the matchers' own masks")
        per = [statistics.median(s) for s in singles]
        single_median = statistics.median(per)
        total = statistics.median(batch)
        rows.append(
            {
                "n": n,
                "distinct": distinct,
                "single_median_ms": single_median * 1e3,
                "single_sum_ms": sum(per) * 1e3,
                "batch_ms": total * 1e3,
                "batch_over_n_median": total / (n * single_median),
                "batch_over_sum": total / sum(per),
            }
        )
    print(f"Batched grammar masks ({model.vocab.n_vocab:,} tokens; {args.rounds} rounds, medians)\n")
    print(f"`{command_line(sys.argv[1:])}`\n")
    print("| N | distinct states | single median ms | sum of singles ms | fill_masks ms | / (N x median) | / sum |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['n']} | {r['distinct']} | {r['single_median_ms']:.4f} | {r['single_sum_ms']:.3f} | "
            f"{r['batch_ms']:.3f} | {r['batch_over_n_median']:.2f} | {r['batch_over_sum']:.2f} |"
        )
    if args.json:
        write_json(args.json, {"rows": rows, "command": command_line(sys.argv[1:])})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
