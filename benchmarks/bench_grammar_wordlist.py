"""A word list as a grammar: ours against llama.cpp's own grammar sampler, in one run.

A grammar of thousands of literal words has a character class per distinct character (a
CJK word list: thousands of classes), the grammar kind that exposed a quadratic class
build (4-5 s and a gigabyte for 6,000 words, before 2026-11-28). The grammar:
``root ::= ("w1" | ... | "wN") ("，" root)?``, N words of 2-4 characters drawn (seed 0)
from ``--alphabet`` CJK code points from U+4E00, on the default model's vocabulary
(Gemma 3, 262,144 tokens).

Each engine runs in a fresh process, alternating over rounds: ours (``Grammar.from_gbnf``:
parse, classes, engine; ``compile(model, mask_cache_size=0)`` and a matcher; the first
mask; the masks along five words and their separators) and llama.cpp's
(``LlamaSampler.grammar``: its init; the first mask, ``apply`` over the whole
vocabulary). Reported: medians over rounds, the peak RSS each process added, and the
ratio of first masks (llama.cpp's / ours).

    python benchmarks/bench_grammar_wordlist.py [--words 6000] [--alphabet 8000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def words_of(n: int, alphabet: int) -> list[str]:
    rng = random.Random(0)
    return sorted(
        {"".join(chr(0x4E00 + rng.randrange(alphabet)) for _ in range(rng.randrange(2, 5))) for _ in range(n)}
    )


def grammar_of(words: list[str]) -> str:
    return "root ::= (" + " | ".join(f'"{w}"' for w in words) + ') ("，" root)?\n'


def child(engine: str, n: int, alphabet: int) -> dict[str, Any]:
    """One measurement (in a fresh process)."""
    import resource
    import time

    import numpy as np

    import llama_cffi

    words = words_of(n, alphabet)
    text = grammar_of(words)
    model = llama_cffi.Model.load(llama_cffi.default_model_path(), vocab_only=True)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out: dict[str, Any] = {"words": len(words)}
    if engine == "ours":
        from samplers.grammar import Grammar

        t0 = time.perf_counter()
        g = Grammar.from_gbnf(text)
        t1 = time.perf_counter()
        m = g.compile(model, mask_cache_size=0).matcher()
        t2 = time.perf_counter()
        buf = np.zeros((model.vocab.n_vocab + 31) // 32, dtype=np.uint32)
        masks = []
        for w in words[:5]:
            for ch in w + "，":
                t = time.perf_counter()
                m.fill_mask(buf)
                masks.append(time.perf_counter() - t)
                m.accept_bytes(ch)
        out.update(
            classes=g._engine.n_classes,
            grammar_ms=(t1 - t0) * 1e3,
            compile_ms=(t2 - t1) * 1e3,
            first_ms=masks[0] * 1e3,
            later_median_ms=statistics.median(masks[1:]) * 1e3,
            later_max_ms=max(masks[1:]) * 1e3,
        )
    else:
        from llama_cffi.sampling import LlamaSampler, TokenDataArray

        t0 = time.perf_counter()
        nat = LlamaSampler.grammar(model, text)
        t1 = time.perf_counter()
        tda = TokenDataArray(model.vocab.n_vocab)
        tda.fill_logits(np.zeros(model.vocab.n_vocab, np.float32))
        t2 = time.perf_counter()
        nat.apply(tda)
        t3 = time.perf_counter()
        out.update(grammar_ms=(t1 - t0) * 1e3, first_ms=(t3 - t2) * 1e3)
    out["rss_added_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - rss0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--words", type=int, default=6000)
    ap.add_argument("--alphabet", type=int, default=8000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", choices=["ours", "llama.cpp"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.words, args.alphabet)))
        return
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "llama.cpp": []}
    for r in range(args.rounds):
        for engine in ("ours", "llama.cpp") if r % 2 == 0 else ("llama.cpp", "ours"):
            cmd = [sys.executable, __file__, "--child", engine, "--words", str(args.words)]
            done = subprocess.run(
                [*cmd, "--alphabet", str(args.alphabet)], capture_output=True, text=True, cwd=ROOT, check=True
            )
            runs[engine].append(json.loads(done.stdout.strip().splitlines()[-1]))

    def med(engine: str, key: str) -> float:
        return statistics.median(x[key] for x in runs[engine])

    ours, nat = runs["ours"][0], runs["llama.cpp"][0]
    print(f"word list: {ours['words']} words over {args.alphabet} CJK code points, {ours['classes']} classes;")
    print(f"medians of {args.rounds} fresh processes per engine\n")
    print("| engine | grammar ms | compile ms | first mask ms | later masks: median, max ms | RSS added MB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    print(
        f"| ours | {med('ours', 'grammar_ms'):.0f} | {med('ours', 'compile_ms'):.0f} | {med('ours', 'first_ms'):.0f}"
        f" | {med('ours', 'later_median_ms'):.2f}, {med('ours', 'later_max_ms'):.1f}"
        f" | {med('ours', 'rss_added_mb'):.0f} |"
    )
    print(
        f"| llama.cpp | {med('llama.cpp', 'grammar_ms'):.0f} | — | {med('llama.cpp', 'first_ms'):.0f} | — "
        f"| {med('llama.cpp', 'rss_added_mb'):.0f} |"
    )
    print(f"\nfirst mask, llama.cpp / ours: {med('llama.cpp', 'first_ms') / med('ours', 'first_ms'):.1f}x")
    del nat


if __name__ == "__main__":
    main()
