"""The benchmark suite: runs every benchmark script and writes one report (JSON, Markdown, plots).

Each script measures ours side by side with its native (llama.cpp, same build) or peer
counterpart.

Runs, one after another, each as a subprocess with ``--json``:

* ``bench_generate.py``: greedy / sampled generation tok/s against ``llama-bench`` tg;
* ``bench_peer.py``: ours vs native (a C loop) vs the peer ``llama-cpp-python`` on the same
  llama.cpp build: greedy, sampled, JSON-grammar and 4 / 8 parallel sequences (when the
  peer is installed; otherwise "peer llama-cpp-python not installed: skipped" is printed and
  recorded);
* ``decode_overhead.py``: per-token host overhead of ``decode_single`` against a C loop;
* ``bench_samplers.py``: sampler chain step (numpy against llama.cpp's samplers) by
  vocabulary size, and sampled against greedy generation;
* ``bench_grammar.py``: grammar masks and constrained generation against llama.cpp's
  grammar sampler;
* ``bench_branches.py``: N branches (each its own chain, tracked; batched / one by one)
  against ``llama-batched-bench``, and llama.cpp's own parallel generation
  (``llama-batched``, host and backend sampling) against ours doing its loop;
* ``bench_step_host.py``: the host work of a branch step (all but ``llama_decode``) at the
  default model's 262,144 tokens: row by row, the batched row kernel, device truncation;
* ``bench_perplexity.py``: ``samplers.perplexity`` against ``llama-perplexity`` (time,
  value, memory).

Each script interleaves its sides over rounds and reports medians; the suite adds the
peak RSS of each script (``os.wait4``) and writes, under ``benchmarks/results/``:

* ``<date>-<machine>.json``: the machine (CPU, cores, load average), the build
  (``llama_cffi.build_info()``, llama.cpp commit, Python and numpy versions), every
  measured number with its unit, the comparisons, and each script's raw results;
* ``<date>-<machine>.md``: one table row per comparison (ours, native/peer, ratio,
  unit, the command that reproduces it), and a table of ours vs native vs peer;
* ``<date>-<machine>-*.png``: plots, when matplotlib is installed.

The default settings are small (a few minutes on 2 cores); ``--full`` uses each
script's long settings. A benchmark that fails is recorded as failed in both files,
the others still run, and the suite exits with status 1.

    python benchmarks/suite.py [--full] [--only generate,perplexity] [--out-dir DIR] [--no-plots]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    IN_SOURCE_TREE,
    PEER,
    ChildRun,
    cpu_cores,
    cpu_model,
    json_safe,
    machine_slug,
    peer_install_command,
    peer_skip_reason,
    run_child,
    script_path,
    wait_quiet,
)

HERE = Path(__file__).resolve().parent
#: The report's default folder: ``benchmarks/results`` in a source tree; for the copy an
#: installed package carries, ``llama-cffi-bench`` in the current directory.
RESULTS = HERE / "results" if IN_SOURCE_TREE else Path.cwd() / "llama-cffi-bench"
Payload = dict[str, Any]
Comparison = dict[str, Any]


# ---------------------------------------------------------------------- the benchmarks
@dataclass(frozen=True)
class Step:
    name: str
    script: str
    quick: tuple[str, ...]
    full: tuple[str, ...]
    about: str
    #: The native programs it runs (prepared before any timing, only for the chosen steps):
    #: llama.cpp tools by target name, llama.cpp's examples as ``example:<name>``, or our C
    #: loops (``native/<name>.c``).
    tools: tuple[str, ...] = ()

    def argv(self, full: bool) -> list[str]:
        return list(self.full if full else self.quick)

    def command(self, full: bool) -> str:
        """How a reader runs this benchmark alone with these settings: in a source tree, its
        script (from the tree's root); from the copy an installed llama_cffi carries, the
        ``llama-cffi bench`` command that runs it (a path inside site-packages is nothing to
        type)."""
        if not IN_SOURCE_TREE:
            return " ".join(["llama-cffi", "bench", "--only", self.name, *(["--full"] if full else [])])
        return " ".join(["python", script_path(self.script), *self.argv(full)])


STEPS: tuple[Step, ...] = (
    Step(
        "generate",
        "bench_generate.py",
        ("--rounds", "3", "--reps", "3", "--tokens", "64", "--quiet-wait", "5"),
        ("--rounds", "7", "--reps", "5", "--tokens", "64"),
        "generation tok/s: ours (greedy, sampled chain, decode only) vs llama-bench tg",
        tools=("llama-bench",),
    ),
    Step(
        "peer",
        "bench_peer.py",
        ("--rounds", "3", "--reps", "2", "--tokens", "32", "--tg", "16", "--quiet-wait", "5"),
        ("--rounds", "5", "--reps", "3", "--tokens", "64", "--tg", "32"),
        f"ours vs native (C) vs peer {PEER}, same llama.cpp build: greedy, sampled, json.gbnf, 4/8 parallel sequences",
    ),
    Step(
        "decode_overhead",
        "decode_overhead.py",
        ("--rounds", "3", "--steps", "100"),
        ("--rounds", "7", "--steps", "200"),
        "per-token host overhead of decode_single + logits() vs the same loop in C",
        tools=("decode_loop",),
    ),
    Step(
        "samplers",
        "bench_samplers.py",
        ("--quick", "--sizes", "32000,128256,152064,262144", "--rounds", "3", "--iters", "100", "--gen-tokens", "64"),
        ("--rounds", "5", "--iters", "200"),
        "sampler chain step by vocabulary size, numpy vs llama.cpp's samplers; sampled vs greedy generation",
        tools=("sampler_loop",),
    ),
    Step(
        "grammar",
        "bench_grammar.py",
        ("--tokens", "48", "--rounds", "3"),
        ("--tokens", "96", "--rounds", "5"),
        "grammar mask (json.gbnf) and constrained generation, ours vs llama.cpp's grammar sampler",
    ),
    Step(
        "grammar_peers",
        "bench_grammar_peers.py",
        ("--quick", "--rounds", "3", "--quiet-wait", "10"),
        ("--rounds", "3"),
        "grammar engines on the same 262k vocabulary: ours (with and without a mask cache) vs llguidance, "
        "xgrammar, outlines-core; compile, first mask, mask median/p99 (peers not installed: skipped)",
    ),
    Step(
        "schema_coverage",
        "bench_schema_coverage.py",
        ("--drafts", "draft2020-12"),
        ("--drafts", "draft2020-12,draft7,draft6,draft4"),
        "JSON-Schema-Test-Suite coverage: ours (validator semantics, generation defaults, llama.cpp-compatible) "
        "vs xgrammar, llguidance, outlines-core; instances right, valid accepted, invalid rejected, compile time",
    ),
    Step(
        "branches",
        "bench_branches.py",
        ("--ns", "1,4,8", "--rounds", "2", "--tg", "32", "--fork-iters", "50", "--quiet-wait", "10", "--retries", "1"),
        ("--rounds", "3"),
        "N branches, each its own chain and tracking: BranchStore (host row kernel, device truncation) vs "
        "llama-batched-bench; llama-batched -np N (host / backend sampling) vs ours doing its loop",
        tools=("llama-batched-bench", "example:batched"),
    ),
    Step(
        "step_host",
        "bench_step_host.py",
        ("--ns", "1,8,64", "--rounds", "2", "--steps", "4"),
        ("--ns", "1,8,64,256", "--rounds", "3", "--steps", "6"),
        "host work of a branch step (all but llama_decode) at 262,144 tokens: the batched row kernel and device "
        "truncation vs the row-by-row path",
    ),
    Step(
        "rpc",
        "bench_rpc.py",
        ("--rounds", "3"),
        ("--rounds", "7"),
        "the default model split across two loopback RPC workers vs the same model local (protocol overhead)",
    ),
    Step(
        "perplexity",
        "bench_perplexity.py",
        ("--rounds", "3", "--tokens", "2048", "-c", "128", "--quiet-wait", "5"),
        ("--rounds", "5", "--tokens", "4000", "-c", "128"),
        "perplexity time, value and memory: samplers.perplexity vs llama-perplexity",
        tools=("llama-perplexity",),
    ),
)


# ---------------------------------------------------------------------- comparisons
def comparison(
    step: Step,
    full: bool,
    what: str,
    ours: float | None,
    native: float | None,
    unit: str,
    better: str,
    *,
    native_label: str,
    ratio_fmt: str | None = None,
    value_fmt: str | None = None,
) -> Comparison:
    ratio = ours / native if ours is not None and native else None
    return {
        "benchmark": step.name,
        "what": what,
        "ours": ours,
        "native": native,
        "native_label": native_label,
        "ratio": ratio,
        "ratio_fmt": ratio_fmt,
        "value_fmt": value_fmt,
        "unit": unit,
        "better": better,
        "command": step.command(full),
    }


def _f(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


TG = "llama-bench"


def comparisons_generate(step: Step, full: bool, d: Payload) -> list[Comparison]:
    n = d["config"]["tokens"]
    labels = {
        "greedy": f"greedy generation, {n} tokens: `decode_single` + argmax vs `llama-bench -p 0 -n {n}` tg",
        "chain": f"sampled generation, {n} tokens: samplers chain (top-k/p, min-p, temp, dist) vs llama-bench tg",
        "decode": f"decode-only loop, {n} tokens: `decode_single` of random ids (llama-bench's workload) vs tg",
    }
    out = [
        comparison(step, full, labels[m], _f(r["tps"]), _f(d["native_tps"]), "tok/s", "higher", native_label=TG)
        for m, r in d["ours"].items()
    ]
    rss = d.get("peak_rss_kib", {})
    if "ours" in rss and "native" in rss:
        out.append(
            comparison(
                step,
                full,
                "peak RSS of a generation process: ours (Python, all modes) vs llama-bench",
                rss["ours"] / 1024,
                rss["native"] / 1024,
                "MiB",
                "lower",
                native_label=TG,
            )
        )
    return out


PEER_WHAT = {
    "greedy": "greedy generation, {tokens} tokens: argmax of the last logits, decode",
    "sampled": "sampled generation, {tokens} tokens: top-k 40 -> temp 0.8 -> dist",
    "grammar": "JSON-grammar generation (json.gbnf), up to {tokens} tokens: grammar -> top-k 40 -> temp 0.8 -> dist",
    "parallel": "{n} parallel sequences x {tg} steps: one decode of {n} tokens per step, greedy",
}


def comparisons_peer(step: Step, full: bool, d: Payload) -> list[Comparison]:
    """One row per workload: ours and native (ratio ours/native), with the peer's value and
    the ratios ours/peer and peer/native (and their per-round medians, ``paired``)."""
    c = d["config"]
    out = []
    for w, r in d["workloads"].items():
        key = "parallel" if w.startswith("parallel") else w
        what = PEER_WHAT[key].format(tokens=c["tokens"], tg=c["tg"], n=w.removeprefix("parallel"))
        row = comparison(
            step,
            full,
            what,
            _f(r["ours_tps"]),
            _f(r["native_tps"]),
            "tok/s",
            "higher",
            native_label="C loop, native/gen_workloads.c",
        )
        row.update(
            workload=w,
            peer=_f(r["peer_tps"]),
            peer_label=f"{d.get('peer_name', PEER)} {d.get('peer_version') or ''}".strip(),
            ours_over_peer=_f(r["ours_over_peer"]),
            peer_over_native=_f(r["peer_over_native"]),
            paired={k: _f(v) for k, v in r["paired"].items()},
        )
        out.append(row)
    return out


def comparisons_decode_overhead(step: Step, full: bool, d: Payload) -> list[Comparison]:
    return [
        comparison(
            step,
            full,
            f"`decode_single` + `logits()` per token, {r['model']}",
            _f(r["python_us"]),
            _f(r["native_us"]),
            "µs/token",
            "lower",
            native_label="C loop, native/decode_loop.c",
        )
        for r in d["rows"]
    ]


def comparisons_samplers(step: Step, full: bool, d: Payload) -> list[Comparison]:
    out = [
        comparison(
            step,
            full,
            f"sampler step `{r['sampler']}`, vocab {r['vocab']:,}: numpy vs llama.cpp samplers",
            _f(r["python_us"]),
            _f(r["native_us"]),
            "µs/step",
            "lower",
            native_label="C, native/sampler_loop.c",
        )
        for r in d["rows"]
    ]
    g = d.get("generation")
    if g:
        out.append(
            comparison(
                step,
                full,
                "generation with the samplers chain vs plain greedy argmax (both ours, same process)",
                _f(g["chain_tps"]),
                _f(g["greedy_tps"]),
                "tok/s",
                "higher",
                native_label="ours, greedy argmax",
            )
        )
    return out


def comparisons_grammar(step: Step, full: bool, d: Payload) -> list[Comparison]:
    m = d["masks"]
    nv = _f(m["native_median_ms"])
    label = "llama.cpp grammar sampler"
    out = [
        comparison(
            step,
            full,
            f"grammar mask over {d['n_vocab']:,} tokens (json.gbnf), median: ours {what}",
            _f(m[f"{key}_median_ms"]),
            nv,
            "ms/token",
            "lower",
            native_label=label,
        )
        for key, what in (
            ("cold", "cold (fresh mask cache)"),
            ("warm", "warm (cached states)"),
            ("walk", "without a mask cache"),
        )
    ]
    g = d["generation_tps"]
    out.append(
        comparison(
            step,
            full,
            "grammar-constrained generation (json.gbnf, top-k/temp/dist): our GrammarSampler vs native grammar",
            _f(g["grammar"]),
            _f(g["native"]),
            "tok/s",
            "higher",
            native_label=label,
        )
    )
    return out


def comparisons_grammar_peers(step: Step, full: bool, d: Payload) -> list[Comparison]:
    """Per grammar and peer: ours (normal mode) against the peer, for compile time and the
    mask median and p99; ours without a mask cache against ours (what the cache buys)."""
    by = {(r["engine"], r["grammar"]): r for r in d["results"] if r.get("status") == "ok"}
    out: list[Comparison] = []
    for (engine, grammar), r in sorted(by.items()):
        mine = by.get(("ours", grammar))
        if engine in ("ours", "ours-nocache") or mine is None:
            continue
        label = f"{engine} {d.get('peer_versions', {}).get(engine, '')}".strip()
        for key, what, unit in (
            ("compile_ms", "compile", "ms"),
            ("median_ms", "mask median", "ms"),
            ("p99_ms", "mask p99", "ms"),
        ):
            out.append(
                comparison(
                    step,
                    full,
                    f"grammar {grammar}, {what}: ours vs {engine}",
                    _f(mine["median"][key]),
                    _f(r["median"][key]),
                    unit,
                    "lower",
                    native_label=label,
                )
            )
    for grammar in sorted({g for _e, g in by}):
        nc, mine = by.get(("ours-nocache", grammar)), by.get(("ours", grammar))
        if nc is not None and mine is not None:
            out.append(
                comparison(
                    step,
                    full,
                    f"grammar {grammar}, mask median: ours without a mask cache vs ours",
                    _f(nc["median"]["median_ms"]),
                    _f(mine["median"]["median_ms"]),
                    "ms",
                    "lower",
                    native_label="ours (mask cache)",
                )
            )
    return out


def comparisons_schema_coverage(step: Step, full: bool, d: Payload) -> list[Comparison]:
    """Per draft and peer: the share of instances right and of valid instances accepted,
    ours (validator semantics) against the peer (higher is better)."""
    by = {(r["engine"], r["draft"]): r for r in d["results"] if r.get("status") == "ok"}
    out: list[Comparison] = []
    for (engine, draft), r in sorted(by.items()):
        mine = by.get(("ours", draft))
        if engine == "ours" or mine is None:
            continue
        for key, what in (("right_pct", "instances right"), ("valid_accepted_pct", "valid instances accepted")):
            out.append(
                comparison(
                    step,
                    full,
                    f"{draft} {what}: ours vs {engine}",
                    _f(mine[key]),
                    _f(r[key]),
                    "%",
                    "higher",
                    native_label=engine,
                )
            )
    return out


def comparisons_branches(step: Step, full: bool, d: Payload) -> list[Comparison]:
    tg = d["config"]["tg"]
    out: list[Comparison] = []
    for r in d["rows"]:
        n = r["n"]
        for mode, what in (
            ("chain", "`store.step(store.sample())`, each branch its own chain + tracking"),
            ("device", "the same with `BranchStore(device=True)`"),
            ("batched", "batched `BranchStore.step`, greedy"),
            ("onebyone", "one-by-one `Branch.commit`"),
        ):
            if f"{mode}_tps" in r:
                out.append(
                    comparison(
                        step,
                        full,
                        f"{n} branch{'es' if n > 1 else ''} x {tg} tokens: {what} vs llama-batched-bench S_TG",
                        _f(r[f"{mode}_tps"]),
                        _f(r["native_tps"]),
                        "tok/s",
                        "higher",
                        native_label="llama-batched-bench",
                    )
                )
        ex = r.get("example")
        if ex:
            for ours, nat, what, label in (
                ("ours_tps", "llama_batched_tps", "ours (host row kernel)", "llama-batched -np N"),
                (
                    "ours_tps",
                    "llama_batched_bs_tps",
                    "ours (host row kernel)",
                    "llama-batched -np N --backend-sampling",
                ),
                (
                    "ours_device_tps",
                    "llama_batched_bs_tps",
                    "ours (device=True)",
                    "llama-batched -np N --backend-sampling",
                ),
            ):
                out.append(
                    comparison(
                        step,
                        full,
                        f"llama-batched's loop, {n} sequence{'s' if n > 1 else ''} x {tg} tokens: {what} vs {label}",
                        _f(ex[ours]),
                        _f(ex[nat]),
                        "tok/s",
                        "higher",
                        native_label=label,
                    )
                )
    return out


def comparisons_step_host(step: Step, full: bool, d: Payload) -> list[Comparison]:
    out: list[Comparison] = []
    base = {r["n"]: r for r in d["rows"] if r["mode"] == "row"}
    for r in d["rows"]:
        n, mode = r["n"], r["mode"]
        if mode == "row" or n not in base:
            continue
        what = (
            "batched row kernel + chains on the top-k" if mode == "batched" else "device truncation (backend sampling)"
        )
        out.append(
            comparison(
                step,
                full,
                f"host work per step, {n} branch{'es' if n > 1 else ''} at {d['n_vocab']:,} tokens: {what} "
                "vs row by row",
                _f(r["host_ms"]),
                _f(base[n]["host_ms"]),
                "ms",
                "lower",
                native_label="row by row (BranchStore(batched=False))",
            )
        )
    return out


def comparisons_rpc(step: Step, full: bool, d: Payload) -> list[Comparison]:
    label = "local (same model, same process)"
    return [
        comparison(
            step,
            full,
            f"{what} tok/s over 2 loopback RPC workers",
            _f(d[what]["rpc_tok_s"]),
            _f(d[what]["local_tok_s"]),
            "tok/s",
            "higher",
            native_label=label,
        )
        for what in ("prefill", "generation")
    ] + [
        comparison(
            step,
            full,
            "model load over 2 loopback RPC workers (weights sent)",
            _f(d["load_s"]["rpc"]),
            _f(d["load_s"]["local"]),
            "s",
            "lower",
            native_label=label,
        )
    ]


def comparisons_perplexity(step: Step, full: bool, d: Payload) -> list[Comparison]:
    o, n = d["ours"], d["native"]
    c = d["config"]
    txt = f"{d['text']['tokens']:,} tokens, -c {c['ctx_size']} -b {c['batch_size']}"
    label = "llama-perplexity"
    return [
        comparison(
            step,
            full,
            f"perplexity value ({txt}; must match)",
            _f(o["ppl"]),
            _f(n["ppl"]),
            "PPL",
            "equal",
            native_label=label,
            ratio_fmt=".6f",
            value_fmt=".4f",
        ),
        comparison(
            step,
            full,
            f"perplexity, whole command ({txt}): `python -m samplers.perplexity`",
            _f(o["wall_s"]),
            _f(n["wall_s"]),
            "s",
            "lower",
            native_label=label,
        ),
        comparison(
            step,
            full,
            "perplexity, evaluation only (from 'calculating perplexity' to 'Final estimate')",
            _f(o["eval_s"]),
            _f(n["eval_s"]),
            "s",
            "lower",
            native_label=label,
        ),
        comparison(
            step,
            full,
            "peak RSS of the perplexity command",
            o["peak_rss_kib"] / 1024,
            n["peak_rss_kib"] / 1024,
            "MiB",
            "lower",
            native_label=label,
        ),
    ]


EXTRACT: dict[str, Callable[[Step, bool, Payload], list[Comparison]]] = {
    "generate": comparisons_generate,
    "peer": comparisons_peer,
    "decode_overhead": comparisons_decode_overhead,
    "samplers": comparisons_samplers,
    "grammar": comparisons_grammar,
    "grammar_peers": comparisons_grammar_peers,
    "schema_coverage": comparisons_schema_coverage,
    "branches": comparisons_branches,
    "step_host": comparisons_step_host,
    "rpc": comparisons_rpc,
    "perplexity": comparisons_perplexity,
}


# ---------------------------------------------------------------------- units
UNIT_RULES: tuple[tuple[str, str], ...] = (
    (r"(^|_)us_step$", "µs/step"),
    (r"(^|_)us$", "µs"),
    (r"(^|_)ms$", "ms"),
    (r"(^|_)s$", "s"),
    (r"(^|_)tps$", "tokens/s"),
    (r"(^|_)pct$", "%"),
    (r"(^|_)count$", "count"),
    (r"(^|_)kib$", "KiB"),
    (r"(^|_)(ratio|paired)$|_over_|^over_|(^|_)ratios?$", "ratio"),
    (r"^(ppl|stderr)$", "perplexity"),
    (r"^foreign", "cores"),
    (r"^(n_vocab|vocab|tokens|sequence_tokens|n|steps|iters|rounds|reps)$", "count"),
    (r"^bytes$", "bytes"),
    (r"rel_diff$", "relative difference"),
)
# keys whose numbers carry no unit suffix: (benchmark, key path with list indices as []) -> unit
UNIT_EXCEPTIONS: dict[tuple[str, str], str] = {("branches", "rows[].samples.native[]"): "tokens/s"}


def unit_of(path: list[str]) -> str | None:
    """The unit of a number from its key path (the nearest key with a known suffix)."""
    for key in reversed(path):
        if key.startswith("["):
            continue
        for pat, unit in UNIT_RULES:
            if re.search(pat, key):
                return unit
    return None


def numbers(obj: Any, path: list[str]) -> Iterator[tuple[list[str], float]]:
    if isinstance(obj, bool) or obj is None:
        return
    if isinstance(obj, (int, float)):
        yield path, float(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if k not in ("config", "command", "native_command", "commands"):
                yield from numbers(v, [*path, str(k)])
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from numbers(v, [*path, f"[{i}]"])


def measurements(name: str, payload: Payload) -> list[dict[str, Any]]:
    """Every number in a script's results, with its key path and unit."""
    out = []
    for path, v in numbers(payload, []):
        key = ".".join(path).replace(".[", "[")
        unit = UNIT_EXCEPTIONS.get((name, re.sub(r"\[\d+\]", "[]", key))) or unit_of(path)
        out.append({"benchmark": name, "key": key, "value": v, "unit": unit})
    return out


# ---------------------------------------------------------------------- the machine
def git(*args: str) -> str:
    """A git command's output in the source tree ("" for an installed copy, which is in no
    repository of its own: a virtual environment inside a clone would report the clone)."""
    if not IN_SOURCE_TREE:
        return ""
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def mem_total_kib() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def environment() -> dict[str, Any]:
    import numpy

    import llama_cffi

    info = llama_cffi.build_info()
    try:
        model: str | None = str(llama_cffi.default_model_path())
    except llama_cffi.LlamaError as exc:
        model = f"not installed: {exc}"
    return {
        "hostname": platform.node(),
        "machine_slug": machine_slug(),
        "cpu_model": cpu_model(),
        "cores": cpu_cores(),
        "cpu_count": os.cpu_count(),
        "mem_total_kib": mem_total_kib(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "numpy": numpy.__version__,
        "llama_cffi": llama_cffi.__version__,
        "llama_cpp_commit": str(info.get("commit")),
        "llama_cpp_pinned_commit": str(info.get("pinned_commit", llama_cffi.LLAMA_CPP_COMMIT)),
        "build_info": info,
        "llama_system_info": llama_cffi.system_info(),
        "suite": str(ROOT) if IN_SOURCE_TREE else f"installed copy: {ROOT}",
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty_files": len([x for x in git("status", "--porcelain").splitlines() if x.strip()]),
        "model": model,
        "threads": 2,
    }


def prepare_tools(steps: Sequence[Step], peer: bool = False) -> dict[str, Any]:
    """Build (or find cached) the native programs ``steps`` use, before timing anything;
    ``peer``: also the shared-library build the peer loads and the C loop beside it. (Only
    those: on a machine whose cache is empty, each llama.cpp tool is a CMake build.)"""
    from benchmarks import native_tools as nt

    out: dict[str, Any] = {}
    if peer:
        t0 = time.perf_counter()
        out["libllama (shared, for the peer)"] = {
            "path": str(nt.llama_shared_lib_dir()),
            "prepare_s": time.perf_counter() - t0,
            "build_s": nt.llama_tool_build_seconds("llama", shared=True),
        }
        t0 = time.perf_counter()
        path = nt.build_shared_c_tool("gen_workloads")
        out["gen_workloads"] = {"path": str(path), "prepare_s": time.perf_counter() - t0}
    wanted = [t for s in steps for t in s.tools]
    for tool in dict.fromkeys(t for t in wanted if t.startswith("llama-")):
        t0 = time.perf_counter()
        out[tool] = {"path": str(nt.build_llama_tool(tool)), "prepare_s": time.perf_counter() - t0}
        out[tool]["build_s"] = nt.llama_tool_build_seconds(tool)
    for name in dict.fromkeys(t for t in wanted if t.startswith("example:")):
        t0 = time.perf_counter()
        out[name] = {"path": str(nt.build_llama_example(name.split(":", 1)[1])), "prepare_s": time.perf_counter() - t0}
    for name in dict.fromkeys(t for t in wanted if not t.startswith(("llama-", "example:"))):
        t0 = time.perf_counter()
        out[name] = {"path": str(nt.build_c_tool(name)), "prepare_s": time.perf_counter() - t0}
    return out


# ---------------------------------------------------------------------- the report
def fmt(v: float | None, spec: str | None = None) -> str:
    if v is None:
        return "—"
    if spec:
        return format(v, spec)
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


ARROW = {"higher": " ↑", "lower": " ↓", "equal": " ="}
NOISY_CORES = 0.15  # other processes' load (cores) above which a benchmark's numbers are flagged


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    info = env["build_info"]
    opts = info.get("options", {})
    variant = info.get("cpu_variant")
    if variant:  # a build with CPU variants: the one loaded, with its instruction sets
        isa = f"CPU variant {variant['name']} ({' '.join(variant['features']) or 'baseline'})"
    else:
        isa = ", ".join(k.removeprefix("GGML_") for k in sorted(opts) if k.startswith("GGML_AVX") and opts[k] == "ON")
    lines = [
        f"# Benchmarks {report['date']} on {report['machine']}",
        "",
        f"- **Machine**: {env['cpu_model']}, {env['cores']} cores, "
        f"{(env['mem_total_kib'] or 0) / 1048576:.0f} GiB; {env['platform']}; hostname `{env['hostname']}`",
        f"- **Load average** (1 min) at start {report['load_average']['start'][0]:.2f}, "
        f"at end {report['load_average']['end'][0]:.2f}",
        f"- **Build**: llama_cffi {env['llama_cffi']} (git {env['git_commit'][:10]}"
        f"{', ' + str(env['git_dirty_files']) + ' files changed' if env['git_dirty_files'] else ''}); "
        f"llama.cpp {env['llama_cpp_commit'][:10]}, {opts.get('CMAKE_BUILD_TYPE', '?')}, {isa or 'no AVX'}, "
        f"OpenMP {opts.get('GGML_OPENMP', '?')}; native tools built from the same source, options and instruction sets",
        f"- **Python** {env['python']}, numpy {env['numpy']}; model `{Path(str(env['model'])).name}`, 2 threads",
        f"- **Mode**: {report['mode']} (`{report['command']}`), total wall time {report['wall_s'] / 60:.1f} min",
        "",
        "Ratio = ours / native (or peer). ↑ higher is better (ratio > 1: ours faster), ↓ lower is better "
        "(ratio < 1: ours faster or smaller), = must be equal. Each script measures its sides in the same run, "
        "interleaved over rounds; values are medians over rounds.",
        "",
        "| What | Ours | Native / peer | Ratio | Unit | Command |",
        "|---|---:|---:|---:|---|---|",
    ]
    noisy = {
        r["name"]: r["foreign_cores"]
        for r in report["runs"]
        if r.get("foreign_cores") is not None and r["foreign_cores"] > NOISY_CORES
    }
    for c in report["comparisons"]:
        if "peer" in c:  # in the peer table below
            continue
        flag = " ⚠" if c["benchmark"] in noisy else ""
        r = c["ratio"]
        ratio = "—" if r is None else fmt(r, c["ratio_fmt"] or (".3f" if r >= 0.1 else ".2g"))
        lines.append(
            f"| {c['what']}{flag} | {fmt(c['ours'], c['value_fmt'])} | {fmt(c['native'], c['value_fmt'])} "
            f"({c['native_label']}) | {ratio} | {c['unit']}{ARROW.get(c['better'], '')} | `{c['command']}` |"
        )
    failed = [r for r in report["runs"] if not r["ok"]]
    for r in failed:
        lines.append(f"| **{r['name']}: FAILED** ({r['status']}) | — | — | — | — | `{r['command']}` |")
    if noisy:
        lines += [
            "",
            "⚠ Other processes used CPU while these ran ("
            + ", ".join(f"{k} {v:.2f} cores" for k, v in noisy.items())
            + "): with 2 threads on 2 cores llama.cpp's thread pool stalls, so their numbers are unreliable; "
            "run them again on a quiet machine.",
        ]
    lines += peer_table(report, noisy)
    lines += [
        "",
        "## Runs",
        "",
        "Peak RSS: of the script's process and the children it waited for (ru_maxrss from os.wait4). "
        "Other load: CPU time other processes used while it ran, in cores (on 2 cores, anything above ~0.1 "
        "makes the numbers noisy).",
        "",
        "| Benchmark | Status | Wall time | Peak RSS | Other load | Command |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in report["runs"]:
        rss = f"{r['peak_rss_kib'] / 1024:.0f} MiB" if r.get("peak_rss_kib") else "—"
        other = f"{r['foreign_cores']:.2f}" if r.get("foreign_cores") is not None else "—"
        lines.append(f"| {r['name']} | {r['status']} | {r['wall_s']:.0f} s | {rss} | {other} | `{r['command']}` |")
    notes = report.get("notes") or []
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    if failed:
        lines += ["", "## Failures", ""]
        for r in failed:
            lines += [f"### {r['name']}", "", "```", (r.get("error") or "").strip()[-3000:], "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def peer_note(payload: Payload | None) -> str | None:
    """The line the report records when ``bench_peer.py`` skipped the peer (None: it ran)."""
    if payload is None or not payload.get("peer_skipped"):
        return None
    return f"peer {PEER} {payload['peer_skipped']}: skipped (install: `{payload['peer_install']}`)"


def peer_table(report: dict[str, Any], noisy: dict[str, float]) -> list[str]:
    """The Markdown section of ours vs native vs peer (bench_peer.py), or the line saying
    why the peer was skipped; [] when that benchmark did not run."""
    rows = [c for c in report["comparisons"] if "peer" in c]
    d = report["results"].get("peer")
    if not rows and not (d and d.get("peer_skipped")):
        return []
    label = rows[0]["peer_label"] if rows else PEER
    lines = ["", f"## Ours vs native vs peer {label}", ""]
    if not rows:
        assert d is not None
        return [*lines, f"Peer {PEER} {d['peer_skipped']}: skipped. Install it with `{d['peer_install']}`."]
    flag = " ⚠" if "peer" in noisy else ""

    def ratio(v: float | None, paired: float | None) -> str:
        return f"{fmt(v, '.3f')} ({fmt(paired, '.3f')})"

    lines += [
        "The same llama.cpp commit and CPU instruction sets on every side: native is `native/gen_workloads.c` "
        "linked with the shared-library build of the pinned source, which the peer loads too "
        "(`LLAMA_CPP_LIB_PATH`), so peer / native is the peer's own overhead. tok/s ↑, medians over interleaved "
        "rounds; each ratio of the medians, then (paired) the median of the per-round ratios.",
        "",
        "| Workload | Ours | Native | Peer | Ours / native | Ours / peer | Peer / native | Command |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c in rows:
        pr = c.get("paired") or {}
        ratios = " | ".join(
            ratio(v, pr.get(k))
            for v, k in (
                (c["ratio"], "ours_over_native"),
                (c["ours_over_peer"], "ours_over_peer"),
                (c["peer_over_native"], "peer_over_native"),
            )
        )
        lines.append(
            f"| {c['what']}{flag} | {fmt(c['ours'])} | {fmt(c['native'])} | {fmt(c['peer'])} | {ratios} "
            f"| `{c['command']}` |"
        )
    return lines


# ---------------------------------------------------------------------- plots
def plots(report: dict[str, Any], stem: Path) -> list[str]:
    """PNG plots beside the report; [] (and one line printed) when matplotlib is missing."""
    try:
        import matplotlib  # type: ignore[import-not-found, unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        print("suite: plots skipped: matplotlib is not installed", flush=True)
        return []
    raw = report["results"]
    written: list[str] = []

    def save(fig: Any, suffix: str) -> None:
        path = stem.with_name(f"{stem.name}-{suffix}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
        print(f"suite: wrote {path}", flush=True)

    title = f"{report['machine']}, {report['date']}"
    if d := raw.get("branches"):
        rows = d["rows"]
        ns = [r["n"] for r in rows]
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        ax.plot(ns, [r["native_tps"] for r in rows], "o-", label="llama-batched-bench (native)")
        for mode, label in (("batched", "batched BranchStore.step"), ("onebyone", "one-by-one Branch.commit")):
            if f"{mode}_tps" in rows[0]:
                ax.plot(ns, [r[f"{mode}_tps"] for r in rows], "s-" if mode == "batched" else "^-", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("branches N")
        ax.set_ylabel("generated tokens/s (all branches)")
        ax.set_title(f"Branches: generation throughput\n{title}")
        ax.grid(alpha=0.3)
        ax.legend()
        save(fig, "branches")
    if d := raw.get("samplers"):
        chain = [r for r in d["rows"] if r["sampler"] == d["config"]["chain"]]
        if chain:
            xs = [r["vocab"] for r in chain]
            fig, ax = plt.subplots(figsize=(6.4, 4.2))
            ax.plot(xs, [r["native_us"] for r in chain], "o-", label="llama.cpp samplers (C)")
            ax.plot(xs, [r["python_us"] for r in chain], "s-", label="samplers (numpy)")
            ax.set_xlabel("vocabulary size")
            ax.set_ylabel("µs per sampling step")
            ax.set_ylim(bottom=0)
            ax.set_title(f"Sampler chain {d['config']['chain']}\n{title}")
            ax.grid(alpha=0.3)
            ax.legend()
            save(fig, "samplers")
    if d := raw.get("grammar"):
        m = d["masks"]
        keys = [("native", "native"), ("cold", "ours cold"), ("warm", "ours warm"), ("walk", "ours, no cache")]
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        pos = list(range(len(keys)))
        ax.bar(pos, [m[f"{k}_median_ms"] for k, _ in keys], color=["C0", "C1", "C1", "C1"], label="median")
        ax.scatter(pos, [m[f"{k}_p99_ms"] for k, _ in keys], color="k", marker="_", s=400, label="p99", zorder=3)
        ax.set_xticks(pos, [label for _, label in keys])
        ax.set_yscale("log")
        ax.set_ylabel("ms per full mask")
        ax.set_title(f"Grammar mask, json.gbnf, {d['n_vocab']:,} tokens\n{title}")
        ax.legend()
        save(fig, "grammar")
    if d := raw.get("generate"):
        labels = ["llama-bench tg"] + [f"ours {m}" for m in d["ours"]]
        vals = [d["native_tps"]] + [r["tps"] for r in d["ours"].values()]
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        ax.bar(range(len(vals)), vals, color=["C0"] + ["C1"] * len(d["ours"]))
        ax.set_xticks(range(len(vals)), labels)
        ax.set_ylabel("tokens/s")
        ax.set_title(f"Generation, {d['config']['tokens']} tokens, {d['config']['threads']} threads\n{title}")
        save(fig, "generate")
    if (d := raw.get("peer")) and d.get("workloads"):
        works = list(d["workloads"])
        fig, ax = plt.subplots(figsize=(7.2, 4.2))
        w = 0.27
        for i, (side, name) in enumerate((("native", "native (C)"), ("ours", "ours"), ("peer", PEER))):
            xs = [j + (i - 1) * w for j in range(len(works))]
            ax.bar(xs, [d["workloads"][k][f"{side}_tps"] for k in works], w, label=name)
        ax.set_xticks(range(len(works)), works)
        ax.set_ylabel("tokens/s")
        ax.set_title(f"Ours vs native vs {PEER} {d.get('peer_version') or ''}\n{title}")
        ax.legend()
        save(fig, "peer")
    if d := raw.get("perplexity"):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        keys = [("wall_s", "whole command"), ("eval_s", "evaluation")]
        w = 0.38
        for i, (side, label) in enumerate((("native", "llama-perplexity"), ("ours", "samplers.perplexity"))):
            ax.bar([j + (i - 0.5) * w for j in range(len(keys))], [d[side][k] for k, _ in keys], w, label=label)
        ax.set_xticks(range(len(keys)), [label for _, label in keys])
        ax.set_ylabel("seconds")
        ax.set_title(f"Perplexity, {d['text']['tokens']:,} tokens, -c {d['config']['ctx_size']}\n{title}")
        ax.legend()
        save(fig, "perplexity")
    return written


# ---------------------------------------------------------------------- main
def run_step(
    step: Step, full: bool, raw_dir: Path, timeout: float, quiet_wait: float
) -> tuple[dict[str, Any], Payload | None]:
    out = raw_dir / f"{step.name}.json"
    load = wait_quiet(NOISY_CORES, quiet_wait)
    if load > NOISY_CORES:
        print(f"suite: other processes use {load:.2f} cores; starting {step.name} anyway", flush=True)
    cmd = [sys.executable, str(HERE / step.script), *step.argv(full), "--json", str(out)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    prefix = f"  {step.name} | "
    run: ChildRun = run_child(cmd, cwd=ROOT, env=env, timeout=timeout, echo=lambda s: print(prefix + s, flush=True))
    payload: Payload | None = None
    error = None
    if out.is_file():
        try:
            payload = json.loads(out.read_text())
        except ValueError as exc:
            error = f"unreadable --json output: {exc}"
    if run.timed_out:
        status = f"timed out after {timeout:.0f} s"
    elif run.returncode != 0:
        status = f"exit {run.returncode}"
    elif payload is None:
        status = "no results"
    else:
        status = "ok"
    if status != "ok":
        error = "\n".join(filter(None, [error, run.stderr[-4000:], run.stdout[-1500:]]))
    return {
        "name": step.name,
        "script": f"benchmarks/{step.script}",
        "about": step.about,
        "command": step.command(full),
        "ok": status == "ok",
        "status": status,
        "returncode": run.returncode,
        "wall_s": run.wall_s,
        "peak_rss_kib": run.peak_rss_kib,
        "foreign_cores": run.foreign_cores,
        "cpu_user_s": run.user_s,
        "cpu_sys_s": run.sys_s,
        "error": error,
    }, payload


#: Set by ``llama-cffi bench`` (:mod:`llama_cffi.bench`) for the suite it starts: the name
#: its usage lines give the command.
PROG_ENV = "LLAMA_CFFI_BENCH_PROG"


def prog() -> str | None:
    """The suite's name in its usage lines: ``llama-cffi bench`` when that command started
    it or when this is the copy an installed package carries; otherwise (``python
    benchmarks/suite.py`` in a tree) argparse's own, the file name."""
    return os.environ.get(PROG_ENV) or (None if IN_SOURCE_TREE else "llama-cffi bench")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog(), description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="each script's long settings (default: quick ones)")
    names = [s.name for s in STEPS]
    ap.add_argument("--only", help=f"comma-separated subset of: {','.join(names)}")
    ap.add_argument("--skip", help="comma-separated benchmarks not to run")
    ap.add_argument("--out-dir", type=Path, default=RESULTS, help="where the report goes (default: %(default)s)")
    ap.add_argument("--machine", help="the machine's name in the file names (default: from hostname, CPU, cores)")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per benchmark before it is killed")
    ap.add_argument("--quiet-wait", type=float, default=30.0, help="seconds to wait for a quiet machine per benchmark")
    ap.add_argument("--list", action="store_true", help="print the benchmarks and their commands, run nothing")
    args = ap.parse_args(argv)
    only = [x for x in (args.only or "").split(",") if x]
    skip = [x for x in (args.skip or "").split(",") if x]
    if bad := [x for x in only + skip if x not in names]:
        ap.error(f"unknown benchmarks {bad}; choose among {','.join(names)}")
    steps = [s for s in STEPS if (not only or s.name in only) and s.name not in skip]
    if args.list:
        for s in steps:
            print(f"{s.name:16} {s.command(args.full)}\n{'':16} {s.about}")
        return 0

    t_start = time.perf_counter()
    started = datetime.datetime.now().astimezone()
    load_start = os.getloadavg()
    mode = "full" if args.full else "quick"
    machine = args.machine or machine_slug()
    stem = args.out_dir / f"{started:%Y-%m-%d}-{machine}"
    print(
        f"suite: {len(steps)} benchmarks ({mode}) on {cpu_model()}, {cpu_cores()} cores; load average "
        f"{load_start[0]:.2f}; report: {stem}.json/.md",
        flush=True,
    )
    env = environment()
    notes: list[str] = []
    runs: list[dict[str, Any]] = []
    results: dict[str, Payload] = {}
    comps: list[Comparison] = []
    peer = any(s.name == "peer" for s in steps)
    if peer and (why := peer_skip_reason()) is not None:
        peer = False
        print(f"suite: peer {PEER} {why}: skipped (install it with: {peer_install_command()})", flush=True)
    needed = [
        *dict.fromkeys(t for s in steps for t in s.tools),
        *(["the shared libllama the peer loads"] if peer else []),
    ]
    print(f"suite: building / finding the native tools ({', '.join(needed) or 'none'})", flush=True)
    try:
        tools: dict[str, Any] = prepare_tools(steps, peer)
    except Exception as exc:  # each benchmark will fail on its own and say why
        tools = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"suite: native tools: {tools['error']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="llama-cffi-suite-") as tmp:
        for i, step in enumerate(steps, 1):
            print(f"suite: [{i}/{len(steps)}] {step.name}: {step.command(args.full)}", flush=True)
            run, payload = run_step(step, args.full, Path(tmp), args.timeout, args.quiet_wait)
            if payload is not None:
                results[step.name] = payload
                try:
                    comps += EXTRACT[step.name](step, args.full, payload)
                except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
                    run["ok"] = False
                    run["status"] = "bad results"
                    run["error"] = f"could not read its results: {type(exc).__name__}: {exc}"
            if step.name == "peer" and (note := peer_note(payload)):
                notes.append(note)
            if step.name == "grammar_peers" and payload is not None:
                for r in payload.get("results", []):
                    if r.get("status") != "ok":
                        notes.append(f"grammar peer {r.get('engine')} on {r.get('grammar')}: {r.get('status')}")
            runs.append(run)
            print(
                f"suite: [{i}/{len(steps)}] {step.name}: {run['status']} in {run['wall_s']:.0f} s, "
                f"peak RSS {run['peak_rss_kib'] / 1024:.0f} MiB, other load {run['foreign_cores']:.2f} cores "
                f"(elapsed {time.perf_counter() - t_start:.0f} s)",
                flush=True,
            )
    report: dict[str, Any] = {
        "date": f"{started:%Y-%m-%d}",
        "started": started.isoformat(timespec="seconds"),
        "machine": machine,
        "mode": mode,
        "command": " ".join(
            [
                *(["python", "benchmarks/suite.py"] if IN_SOURCE_TREE else ["llama-cffi", "bench"]),
                *(sys.argv[1:] if argv is None else argv),
            ]
        ),
        "wall_s": time.perf_counter() - t_start,
        "load_average": {"start": list(load_start), "end": list(os.getloadavg())},
        "environment": env,
        "native_tools": tools,
        "ok": all(r["ok"] for r in runs),
        "runs": runs,
        "comparisons": comps,
        "notes": notes,
        "units": {
            "key_patterns": {p: u for p, u in UNIT_RULES},
            "exceptions": {f"{b}: {k}": u for (b, k), u in UNIT_EXCEPTIONS.items()},
            "comparisons": "each row's 'unit'; ratio = ours / native",
        },
        "measurements": [m for name, p in results.items() for m in measurements(name, p)],
        "results": results,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    try:
        png = [] if args.no_plots else plots(report, stem)
    except Exception as exc:  # a plot is never worth losing the report
        png = []
        notes.append(f"plots failed: {type(exc).__name__}: {exc}")
        print(f"suite: plots failed: {type(exc).__name__}: {exc}", flush=True)
    report["plots"] = [Path(p).name for p in png]
    report["wall_s"] = time.perf_counter() - t_start
    json_path = stem.with_name(stem.name + ".json")
    md_path = stem.with_name(stem.name + ".md")
    json_path.write_text(json.dumps(json_safe(report), indent=1, ensure_ascii=False, allow_nan=False) + "\n")
    md_path.write_text(markdown(json_safe(report)))
    print(f"suite: wrote {json_path}\nsuite: wrote {md_path}")
    print()
    table = md_path.read_text().split("\n## Runs")[0]
    print("\n".join(line for line in table.splitlines() if line.startswith("|")))
    failed = [r["name"] for r in runs if not r["ok"]]
    print(
        f"suite: {len(runs) - len(failed)}/{len(runs)} benchmarks ok"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
        + f"; total {report['wall_s'] / 60:.1f} min",
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
