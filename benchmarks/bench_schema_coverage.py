"""JSON Schema coverage: the official JSON-Schema-Test-Suite through our converter and the
peers' JSON-schema compilers, in one run.

For each draft (``--drafts``, default 2020-12 and 7) every group of the suite's main folder
(``json/tests/<draft>/*.json`` from the ``jsonschema`` 4.26.0 sdist; remote references
served from the suite's ``remotes/`` through a ``referencing`` registry) is compiled by
each engine and every instance judged (:mod:`benchmarks.schema_suite`: both
``json.dumps`` spellings, compact and default, must agree with the expected verdict; a
schema that does not compile counts all its instances wrong).

Engines: ``ours`` is :func:`samplers.grammar.schema.schema_to_gbnf` with validator
semantics (``validator=True``: keys in any order, undeclared keys as the schema allows
them, formats as annotations) then ``Grammar.accepts``; ``ours-generation`` is the same
converter with its generation defaults (keys in llama.cpp's order, no undeclared keys
unless the schema names them, formats asserted); ``llama.cpp`` is the llama.cpp-compatible
converter (``compat="llama.cpp"``). The peers (xgrammar, llguidance, outlines-core;
:mod:`benchmarks.schema_peers`) run when installed (``pip install -e ".[grammar-bench]"``
or the lighter commands in ``bench_grammar_peers.py``), else are reported skipped.

Printed: the coverage table per draft (groups compiled, valid instances accepted of all,
invalid rejected of compiled, instances right of all: percentages with counts), our
compile time (schema to checked grammar: median, p90, max over the groups), and the
warnings our converter raised (what stays unenforced), by keyword.

Run::

    python benchmarks/bench_schema_coverage.py                  # ours, llama.cpp, peers
    python benchmarks/bench_schema_coverage.py --engines ours --drafts draft2020-12,draft7,draft6,draft4
    python benchmarks/bench_schema_coverage.py --write-baseline tests/data/schema_suite_baseline.json
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import schema_suite as ss

DRAFT_ARG = {"draft2020-12": "2020-12", "draft2019-09": "2019-09", "draft7": "7", "draft6": "6", "draft4": "4"}


def ours_compile(draft: str, *, validator: bool = True) -> Callable[[ss.Group], Callable[[str], bool]]:
    """Our converter (validator semantics or the generation defaults) for ``draft``'s groups."""
    from samplers.grammar.grammar import Grammar
    from samplers.grammar.schema import schema_to_gbnf

    registry = ss.remote_registry(draft)

    def compile_group(g: ss.Group) -> Callable[[str], bool]:
        text = schema_to_gbnf(g.schema, validator=validator, registry=registry, default_draft=DRAFT_ARG[draft])
        return Grammar.from_gbnf(text).accepts

    return compile_group


def llama_cpp_compile(g: ss.Group) -> Callable[[str], bool]:
    from samplers.grammar.grammar import Grammar
    from samplers.grammar.json_schema import llama_cpp_json_schema_to_gbnf

    return Grammar.from_gbnf(llama_cpp_json_schema_to_gbnf(g.schema)).accepts


def engine_compile(engine: str, draft: str) -> Callable[[ss.Group], Callable[[str], bool]]:
    if engine == "ours":
        return ours_compile(draft)
    if engine == "ours-generation":
        return ours_compile(draft, validator=False)
    if engine == "llama.cpp":
        return llama_cpp_compile
    from benchmarks import schema_peers

    return schema_peers.compile_fn(engine)


def skip_reason(engine: str) -> str | None:
    if engine in ("ours", "ours-generation", "llama.cpp"):
        return None
    try:
        from benchmarks import schema_peers
    except ImportError as e:
        return f"benchmarks.schema_peers cannot be imported: {e}"
    return schema_peers.peer_skip_reason(engine)


def run(engine: str, draft: str) -> dict[str, Any]:
    """Score ``engine`` on ``draft``: totals, per-group right counts, compile times, warnings."""
    totals = ss.Totals()
    per_group: dict[str, int] = {}
    times: list[float] = []
    warned: collections.Counter[str] = collections.Counter()
    t0 = time.perf_counter()
    for s in ss.iter_scores(draft, engine_compile(engine, draft)):
        totals.add(s)
        per_group[s.group.name] = sum(s.right())
        if s.compiled:
            times.append(s.compile_s)
        for w in s.warnings:
            # "<pointer>: <keyword>: <message>" -> keyword
            parts = w.split(": ")
            warned[parts[1] if len(parts) > 2 else w] += 1
    times.sort()
    return {
        "engine": engine,
        "draft": draft,
        "row": totals.row(),
        "totals": vars(totals),
        "per_group": per_group,
        "compile_ms": {
            "median": 1000 * statistics.median(times) if times else float("nan"),
            "p90": 1000 * times[int(0.9 * (len(times) - 1))] if times else float("nan"),
            "max": 1000 * times[-1] if times else float("nan"),
        },
        "warnings": dict(warned.most_common()),
        "seconds": time.perf_counter() - t0,
    }


def payload_row(r: dict[str, Any]) -> dict[str, Any]:
    """One engine and draft as the suite's JSON: percentages, counts, compile times."""
    if "skipped" in r:
        return {"engine": r["engine"], "draft": r["draft"], "status": "skipped", "reason": r["skipped"]}
    t = r["totals"]

    def pct(a: int, b: int) -> float | None:
        return 100 * a / b if b else None

    return {
        "engine": r["engine"],
        "draft": r["draft"],
        "status": "ok",
        "compiled_pct": pct(t["compiled"], t["groups"]),
        "valid_accepted_pct": pct(t["valid_accepted"], t["valid"]),
        "invalid_rejected_pct": pct(t["invalid_rejected"], t["invalid_compiled"]),
        "right_pct": pct(t["right"], t["instances"]),
        "counts": {f"{k}_count": v for k, v in t.items()},
        "compile_ms": r["compile_ms"],
        "wall_s": r["seconds"],
        "warnings": {f"{k}_count": n for k, n in r["warnings"].items()},
    }


@contextlib.contextmanager
def quiet_stderr(on: bool) -> Iterator[None]:
    """Silence the native stderr (xgrammar prints a warning per unsupported keyword)."""
    if not on:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def table(results: list[dict[str, Any]]) -> str:
    cols = ["groups compiled", "valid accepted (of all)", "invalid rejected (of compiled)", "instances right (of all)"]
    lines = ["| engine | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for r in results:
        if "skipped" in r:
            lines.append(f"| {r['engine']} | skipped: {r['skipped']} |" + " |" * (len(cols) - 1))
        else:
            lines.append(f"| {r['engine']} | " + " | ".join(r["row"][c] for c in cols) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafts", default="draft2020-12,draft7")
    ap.add_argument("--engines", default="ours,ours-generation,llama.cpp,xgrammar,llguidance,outlines-core")
    ap.add_argument("--json", help="write every result as JSON here")
    ap.add_argument("--write-baseline", help="write our per-group right counts (the test's floor) here")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    everything = []
    for draft in args.drafts.split(","):
        results = []
        for engine in args.engines.split(","):
            reason = skip_reason(engine)
            if reason is not None:
                results.append({"engine": engine, "draft": draft, "skipped": reason})
                continue
            with quiet_stderr(engine not in ("ours", "ours-generation", "llama.cpp")):
                results.append(run(engine, draft))
        print(f"\n## {draft} ({len(ss.groups(draft))} groups, remote references served)\n")
        print(table(results))
        for r in results:
            if r.get("engine") == "ours" and "compile_ms" in r:
                c = r["compile_ms"]
                print(
                    f"\nours: compile (schema to checked grammar) median {c['median']:.1f} ms, "
                    f"p90 {c['p90']:.1f} ms, max {c['max']:.0f} ms; {r['seconds']:.1f} s in all"
                )
                print(
                    "ours: warnings (unenforced), by keyword: "
                    + (", ".join(f"{k} {n}" for k, n in r["warnings"].items()) or "none")
                )
        everything += results
    if args.json:
        Path(args.json).write_text(json.dumps({"results": [payload_row(r) for r in everything]}, indent=1))
    if args.write_baseline:
        base = {r["draft"]: r["per_group"] for r in everything if r.get("engine") == "ours" and "per_group" in r}
        Path(args.write_baseline).write_text(json.dumps(base, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
