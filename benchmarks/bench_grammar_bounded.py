"""Every grammar bounded: each mask of ours against llama.cpp's own grammar sampler on the
same grammar, vocabulary and parser state, measured in one run (issue 41).

A grammar is user input, and one random grammar once kept a mask walk of ours running for
over 20 minutes where llama.cpp answered in about a millisecond. This walks random grammars
(drawn with :func:`samplers.testing.grammars_with_examples`, seeded, plus the two
pathological grammars the tests keep: stack sets that grow 4x per character, and one that
doubles them per token) along random allowed tokens, and at every step times

* ours: ``matcher.fill_mask`` of a grammar compiled with ``mask_cache_size=0`` (every mask
  computed; a state met before still reuses its plan, as it does for a user), and
* llama.cpp's: ``apply`` of ``llama_sampler_init_grammar`` over every token of the
  vocabulary (its logits filled beforehand, untimed),

the two interleaved, alternating which goes first. A mask of ours that ends in
:class:`~samplers.grammar.GrammarBudgetError` (the budget on stacks and cells) counts with
the time it took to raise, and ends that grammar's walk. Grammars llama.cpp refuses (or
that it would abort on: see ``llama_cffi.gbnf``) are counted and skipped.

Printed per vocabulary: masks measured, how many of ours took at most llama.cpp's time,
the ratio ours / llama.cpp (median, p99, max), and the worst masks.

    python benchmarks/bench_grammar_bounded.py [--grammars 60] [--steps 12] [--seed 0] [--model PATH]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

#: stacks that grow about 4x per character along a run of "a" (tests/test_grammar_engine_core.py)
AMBIGUOUS = 'root ::= x\nx ::= "a" x "b" | "a" x "c" | "a" x "d" | "a" x "e" | ""\n'
#: found by hypothesis in a long run of the kernel tests: stacks double with most tokens
FOUND = 'root ::= "0" | [^a] [^a] (root* root "0")\n'


def draw_grammars(n: int, seed: int) -> list[str]:
    """``n`` distinct GBNF texts drawn (deterministically for a seed) from
    :func:`samplers.testing.grammars_with_examples`, after the two pathological ones."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    from samplers.testing import grammars_with_examples

    out: list[str] = []

    @hseed(seed)
    @settings(
        max_examples=4 * n,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(grammars_with_examples(confirm=False))
    def collect(ex: Any) -> None:
        out.append(ex.gbnf)

    collect()
    return [AMBIGUOUS, FOUND, *list(dict.fromkeys(out))[: max(0, n - 2)]]


def walk(model: Any, gbnf: str, steps: int, rng: random.Random) -> dict[str, Any]:
    """One grammar's walk; per step ``(ours_s, native_s)``, and how it ended."""
    from llama_cffi.errors import ParamError
    from llama_cffi.sampling import LlamaSampler, TokenDataArray
    from samplers.grammar import Grammar, GrammarBudgetError, GrammarError

    n_vocab = model.vocab.n_vocab
    try:
        ours = Grammar.from_gbnf(gbnf).compile(model, mask_cache_size=0)
        guard = Grammar.from_gbnf(gbnf).matcher(model)
        native = LlamaSampler.grammar(model, gbnf, guard=guard)
    except (ParamError, GrammarError) as e:
        return {"gbnf": gbnf, "refused": f"{type(e).__name__}: {str(e)[:120]}", "masks": []}
    m = ours.matcher()
    eog = ours.vocab.eog
    words = np.zeros(ours.n_words, dtype=np.uint32)
    zeros = np.zeros(n_vocab, dtype=np.float32)
    tda = TokenDataArray(n_vocab)
    masks: list[tuple[float, float]] = []
    ended = "steps"
    for step in range(steps + 1):
        tda.fill_logits(zeros)
        budget = False

        def time_ours() -> float:
            nonlocal budget
            t = time.perf_counter()
            try:
                m.fill_mask(words)
            except GrammarBudgetError:
                budget = True
            return time.perf_counter() - t

        def time_native() -> float:
            t = time.perf_counter()
            native.apply(tda)
            return time.perf_counter() - t

        if step % 2:
            tn, to = time_native(), time_ours()
        else:
            to, tn = time_ours(), time_native()
        masks.append((to, tn))
        if budget:
            ended = "budget"
            break
        allowed = np.unpackbits(words.view(np.uint8), bitorder="little")[:n_vocab].astype(bool)
        if not np.array_equal(allowed, tda.logits > -np.inf):  # (the ids stay in order: apply only masks)
            raise AssertionError(f"masks differ from llama.cpp's at step {step} of {gbnf!r}")
        choices = np.flatnonzero(allowed & ~eog)
        if step == steps or not len(choices):
            ended = "steps" if step == steps else "no token"
            break
        tok = int(choices[rng.randrange(len(choices))])
        assert m.accept_token(tok)
        native.accept(tok)
    return {"gbnf": gbnf, "refused": None, "masks": masks, "ended": ended}


def run(model_path: Path, n_grammars: int, steps: int, seed: int) -> dict[str, Any]:
    import llama_cffi

    model = llama_cffi.Model.load(model_path, vocab_only=True)
    rng = random.Random(seed)
    grammars = draw_grammars(n_grammars, seed)
    results = [walk(model, g, steps, rng) for g in grammars]
    rows = [(r["gbnf"], i, o, n) for r in results for i, (o, n) in enumerate(r["masks"])]
    ratios = np.array([o / n for _, _, o, n in rows]) if rows else np.zeros(0)
    return {
        "model": str(model_path),
        "n_vocab": model.vocab.n_vocab,
        "grammars": len(grammars),
        "refused_by_llama_cpp": sum(r["refused"] is not None for r in results),
        "budget_errors": sum(r.get("ended") == "budget" for r in results),
        "masks": len(rows),
        "ours_at_most_native": int((ratios <= 1.0).sum()),
        "ratio_median": float(np.median(ratios)) if len(ratios) else float("nan"),
        "ratio_p99": float(np.percentile(ratios, 99)) if len(ratios) else float("nan"),
        "ratio_max": float(ratios.max()) if len(ratios) else float("nan"),
        "ours_ms_max": max((o for _, _, o, _ in rows), default=0.0) * 1e3,
        "worst": [
            {"gbnf": g[:160], "step": i, "ours_ms": o * 1e3, "native_ms": n * 1e3}
            for g, i, o, n in sorted(rows, key=lambda r: -r[2] / r[3])[:5]
        ],
    }


def report(res: dict[str, Any]) -> str:
    lines = [
        f"### {Path(res['model']).name}: {res['n_vocab']:,} tokens",
        "",
        f"{res['grammars']} grammars ({res['refused_by_llama_cpp']} refused by llama.cpp, "
        f"{res['budget_errors']} ended in our budget error); {res['masks']} masks.",
        "",
        "| masks | ours <= llama.cpp's | ratio ours / llama.cpp: median | p99 | max | our slowest mask ms |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| {res['masks']} | {res['ours_at_most_native']} | {res['ratio_median']:.3f} | {res['ratio_p99']:.3f} "
        f"| {res['ratio_max']:.3f} | {res['ours_ms_max']:.3f} |",
        "",
        "Worst masks (ours / llama.cpp's):",
        "",
        "| grammar | step | ours ms | llama.cpp ms |",
        "| --- | ---: | ---: | ---: |",
    ]
    for w in res["worst"]:
        g = w["gbnf"].replace("|", "\\|").replace("\n", " ⏎ ")
        lines.append(f"| `{g}` | {w['step']} | {w['ours_ms']:.3f} | {w['native_ms']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grammars", type=int, default=60, help="grammars walked (default 60, 2 of them pathological)")
    ap.add_argument("--steps", type=int, default=12, help="tokens per walk (default 12)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", type=Path, action="append", help="GGUF whose vocabulary to use (repeatable)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if not args.model:
        import llama_cffi

        args.model = [llama_cffi.default_model_path()]
    out = [run(p, args.grammars, args.steps, args.seed) for p in args.model]
    print("## Every grammar bounded: ours against llama.cpp's grammar sampler, mask for mask\n")
    print("\n\n".join(report(r) for r in out))
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
