"""JSON Schema on real-world schemas: JSONSchemaBench's maskbench data through our converter
and the peers', in one run.

The data is not in the project (its schemas come from many projects under their own
terms): ``--data`` takes the archive ``jsb-maskbench-<commit>.tar.xz`` (guidance-ai/
jsonschemabench's ``maskbench/data``; extracted once into the user cache) or a folder of
its ``<Subset>---<id>.json`` files. Each file holds a schema and test documents, valid and
invalid. A schema **passes** (maskbench's definition) when it compiles within the limit
(``--timeout``, default 10 s) and every test document, given as
``json.dumps(data, ensure_ascii=False)``, is answered right: a valid one accepted, an
invalid one rejected.

Engines (``--engines``), each a regime of ours or a peer:

* ``validator``: :meth:`Grammar.from_json_schema` with ``validator=True, formats="assert"``
  (a validator's semantics, formats asserted: the benchmark's own regime);
* ``defaults``: the converter's generation defaults;
* ``llama.cpp``: ``compat="llama.cpp"``, llama.cpp's own converter;
* ``llguidance``, ``xgrammar``: the peers' JSON-schema compilers as
  :mod:`benchmarks.schema_peers` drives them (skipped when not installed).

"Compile" is what a request pays: schema to a checked, ready grammar
(``Grammar.from_json_schema``, or the peer's compile). Every schema runs in a worker
process (``--workers``, default the machine's cores) that is killed past the limit plus
the time its tests may take, so no schema can stall the run.

Printed, per subset and overall, for each engine: compiled, passing, valid documents
rejected, invalid documents accepted, schemas that needed a relaxation (a
``SchemaWarning`` saying what was relaxed, ours only), compile median / p90 / p99 / max;
with llguidance's own verdicts on the same data beside them (``--llguidance-expected``,
the ``expected_maskbench.json`` of guidance-ai/llguidance); then the 20 slowest schemas of
the first engine with where their time went (metaschema check, references, lowering,
products of alternatives, complements, automata, emission, GBNF text, GBNF parse, grammar check), measured again
with a phase profiler; then every failure class with examples. ``--memory`` reports the
peak memory of each conversion (``tracemalloc``; times are then not comparable and not
reported).

Run::

    python benchmarks/bench_schema_realworld.py --data ../shared/jsonschemabench/jsb-maskbench-ba103c7.tar.xz
    python benchmarks/bench_schema_realworld.py --data DIR --sample 30 --seed 0 --engines validator,defaults
    python benchmarks/bench_schema_realworld.py --data DIR --only Github_hard---o10166.json --engines validator -v
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import multiprocessing as mp
import os
import random
import signal
import statistics
import sys
import tarfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: the paper's ten subsets (Geng et al. 2025), in its order
PAPER_SUBSETS = (
    "Glaiveai2K",
    "Github_trivial",
    "Github_easy",
    "Snowplow",
    "Github_medium",
    "Kubernetes",
    "WashingtonPost",
    "Github_hard",
    "JsonSchemaStore",
    "Github_ultra",
)
OURS: dict[str, dict[str, Any]] = {
    "validator": {"validator": True, "formats": "assert"},
    "defaults": {},
    "llama.cpp": {"compat": "llama.cpp"},
}
PEERS = ("llguidance", "xgrammar")
#: the words that mark a SchemaWarning as a relaxation (the grammar is looser than the
#: schema because the exact grammar would be too large)
RELAXED_MARK = "relaxed"


# ---------------------------------------------------------------------------- the data
def data_dir(path: Path) -> Path:
    """The folder of ``<Subset>---<id>.json`` files: ``path`` itself, the data folder
    inside it, or the archive extracted once into the user cache."""
    if path.is_dir():
        for cand in (path, *path.glob("*/maskbench/data"), *path.glob("maskbench/data")):
            if cand.is_dir() and any(cand.glob("*---*.json")):
                return cand
        raise SystemExit(f"no <Subset>---<id>.json files under {path}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "llama_cffi" / "jsonschemabench" / digest
    done = cache / ".done"
    if not done.exists():
        cache.mkdir(parents=True, exist_ok=True)
        with tarfile.open(path) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(".json") and "---" in m.name]
            for m in members:
                m.name = Path(m.name).name  # flat, and nothing outside the cache folder
                tar.extract(m, cache)
        done.write_text("ok\n")
    return cache


@dataclass
class Case:
    name: str
    subset: str
    schema: Any
    tests: list[tuple[bool, str]]


def cases(folder: Path, subsets: tuple[str, ...], sample: int | None, seed: int, only: list[str]) -> list[Case]:
    files = sorted(folder.glob("*---*.json"))
    by_subset: dict[str, list[Path]] = collections.defaultdict(list)
    for f in files:
        by_subset[f.name.split("---")[0]].append(f)
    chosen: list[Path] = []
    if only:
        chosen = [folder / n for n in only]
    else:
        rng = random.Random(seed)
        for s in subsets:
            fs = by_subset.get(s, [])
            chosen += rng.sample(fs, min(sample, len(fs))) if sample else fs
    out = []
    for f in chosen:
        d = json.loads(f.read_text(encoding="utf-8"))
        tests = [(bool(t["valid"]), json.dumps(t["data"], ensure_ascii=False)) for t in d.get("tests", [])]
        out.append(Case(f.name, f.name.split("---")[0], d["schema"], tests))
    return out


# --------------------------------------------------------------------- the phase profiler
PHASES: dict[str, list[tuple[str, str]]] = {
    # phase -> (module, qualified name) of the functions whose exclusive time is the phase's
    "metaschema": [
        ("samplers.grammar.schema._drafts", "check"),
        ("samplers.grammar.schema._drafts", "detect"),
    ],
    "references": [("samplers.grammar.schema._lower", "Lowering._ref")],
    "lowering": [("samplers.grammar.schema._lower", "Lowering.lower")],
    "products": [
        ("samplers.grammar.schema._lower", "Lowering.intersect"),
        ("samplers.grammar.schema._lower", "Lowering.union"),
    ],
    "complements": [("samplers.grammar.schema._lower", "Lowering.complement")],
    "automata": [
        ("samplers.grammar.schema._dfa", "from_regex"),
        ("samplers.grammar.schema._dfa", "DFA.intersect"),
        ("samplers.grammar.schema._dfa", "DFA.complement"),
    ],
    "emission": [("samplers.grammar.schema._emit", "Emitter.node")],
    "gbnf text": [("samplers.grammar.schema._rules", "RuleSet.text")],
    "gbnf parse": [("samplers.grammar.grammar", "parse_gbnf")],
    "grammar check": [("samplers.grammar.grammar", "check_grammar")],
    "engine": [("samplers.grammar.engine", "Engine.__init__")],
}


class PhaseProfiler:
    """Exclusive time per phase: each wrapped function's time, less that of the wrapped
    functions it calls; the rest of a conversion is "other"."""

    def __init__(self) -> None:
        self.times: dict[str, float] = collections.defaultdict(float)
        self._stack: list[list[Any]] = []  # [phase, start, child time]
        self._installed = False

    def install(self) -> None:
        import functools
        import importlib

        if self._installed:
            return
        self._installed = True
        for phase, targets in PHASES.items():
            for mod_name, qual in targets:
                mod = importlib.import_module(mod_name)
                owner: Any = mod
                *path, attr = qual.split(".")
                for p in path:
                    owner = getattr(owner, p)
                fn = getattr(owner, attr)

                def wrap(fn: Callable[..., Any], phase: str = phase) -> Callable[..., Any]:
                    @functools.wraps(fn)
                    def timed(*a: Any, **k: Any) -> Any:
                        frame: list[Any] = [phase, time.perf_counter(), 0.0]
                        self._stack.append(frame)
                        try:
                            return fn(*a, **k)
                        finally:
                            self._stack.pop()
                            total = time.perf_counter() - frame[1]
                            self.times[phase] += total - frame[2]
                            if self._stack:
                                self._stack[-1][2] += total

                    return timed

                setattr(owner, attr, wrap(fn))

    def reset(self) -> None:
        self.times.clear()
        self._stack.clear()


# ------------------------------------------------------------------------- one schema
class _Alarm(BaseException):
    """The compile limit (a BaseException: no converter's ``except Exception`` takes it)."""


@dataclass
class Result:
    name: str
    subset: str
    engine: str
    compiled: bool = False
    error: str = ""
    compile_s: float = 0.0
    valid_rejected: int = 0
    invalid_accepted: int = 0
    tests: int = 0
    warnings: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    peak_bytes: int = 0
    timed_out: bool = False

    @property
    def passing(self) -> bool:
        return self.compiled and not self.valid_rejected and not self.invalid_accepted

    @property
    def relaxed(self) -> bool:
        return any(RELAXED_MARK in w for w in self.warnings)


def _compile(engine: str, schema: Any) -> Callable[[str], bool]:
    if engine in OURS:
        from samplers.grammar.grammar import Grammar

        return Grammar.from_json_schema(schema, **OURS[engine]).accepts
    from benchmarks import schema_peers

    class _Group:
        pass

    g = _Group()
    g.schema = schema  # type: ignore[attr-defined]
    g.name = "schema"  # type: ignore[attr-defined]
    return schema_peers.compile_fn(engine, timeout_s=1e9, accept_timeout_s=1e9)(g)


def run_one(case: Case, engine: str, timeout_s: float, mode: str, prof: PhaseProfiler | None) -> Result:
    r = Result(case.name, case.subset, engine, tests=len(case.tests))

    def on_alarm(signum: int, frame: Any) -> None:
        raise _Alarm()

    old = signal.signal(signal.SIGALRM, on_alarm)
    if prof is not None:
        prof.reset()
    if mode == "memory":
        import tracemalloc

        tracemalloc.start()
    t0 = time.perf_counter()
    accepts = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
            try:
                accepts = _compile(engine, case.schema)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _Alarm:
            r.timed_out = True
            r.error = f"TimeoutError: compile took more than {timeout_s:g} s"
        except Exception as e:  # a refusal: recorded with its message
            r.error = f"{type(e).__name__}: {e}"[:400]
        except RecursionError as e:
            r.error = f"RecursionError: {e}"[:400]
    r.compile_s = time.perf_counter() - t0
    if mode == "memory":
        import tracemalloc

        r.peak_bytes = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    signal.signal(signal.SIGALRM, old)
    if r.timed_out and r.compile_s > timeout_s:
        r.compile_s = timeout_s
    r.warnings = sorted({str(w.message) for w in caught})
    if prof is not None:
        r.phases = dict(prof.times)
    if accepts is None:
        return r
    r.compiled = True
    for valid, text in case.tests:
        try:
            got = bool(accepts(text))
        except Exception:
            got = False
        if valid and not got:
            r.valid_rejected += 1
        elif not valid and got:
            r.invalid_accepted += 1
    return r


def _worker(conn: Connection, timeout_s: float, mode: str, root: str) -> None:
    sys.path.insert(0, root)
    warnings.simplefilter("ignore")
    # the peers' native code prints a warning per construct it approximates (xgrammar):
    # the worker's stderr goes nowhere (its results and errors come back through the pipe)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
    prof = None
    if mode == "phases":
        prof = PhaseProfiler()
        prof.install()
    from samplers.grammar.grammar import Grammar  # noqa: F401  (imported before the clock)

    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        case, engine = job
        try:
            res = run_one(case, engine, timeout_s, mode, prof)
        except BaseException as e:  # reported, the worker goes on
            res = Result(case.name, case.subset, engine, error=f"worker: {type(e).__name__}: {e}"[:400])
            res.error += "\n" + traceback.format_exc()[-800:]
        conn.send(res)


class Pool:
    """Worker processes, one job each at a time; a job past its hard limit kills its
    worker (recorded as timed out) and a fresh worker takes its place."""

    def __init__(self, n: int, timeout_s: float, hard_s: float, mode: str) -> None:
        self.ctx = mp.get_context("spawn")
        self.n, self.timeout_s, self.hard_s, self.mode = n, timeout_s, hard_s, mode
        self.workers: list[tuple[Any, Connection]] = []

    def _start(self) -> tuple[Any, Connection]:
        parent, child = self.ctx.Pipe()
        root = str(Path(__file__).resolve().parent.parent)
        p = self.ctx.Process(target=_worker, args=(child, self.timeout_s, self.mode, root), daemon=True)
        p.start()
        child.close()
        return p, parent

    def run(self, jobs: list[tuple[Case, str]], progress: Callable[[Result], None]) -> list[Result]:
        todo = list(reversed(jobs))
        busy: dict[Connection, tuple[Any, tuple[Case, str], float]] = {}
        idle = [self._start() for _ in range(min(self.n, len(jobs)))]
        out: list[Result] = []
        while todo or busy:
            while idle and todo:
                p, conn = idle.pop()
                job = todo.pop()
                conn.send(job)
                busy[conn] = (p, job, time.perf_counter())
            ready = wait(list(busy), timeout=0.5)
            now = time.perf_counter()
            for conn in list(busy):
                p, (case, engine), t0 = busy[conn]
                if conn in ready:
                    try:
                        res = conn.recv()
                    except EOFError:
                        res = Result(case.name, case.subset, engine, error=f"worker died (exit code {p.exitcode})")
                        del busy[conn]
                        idle.append(self._start())
                        out.append(res)
                        progress(res)
                        continue
                    del busy[conn]
                    idle.append((p, conn))
                    out.append(res)
                    progress(res)
                elif now - t0 > self.hard_s:
                    p.kill()
                    p.join()
                    del busy[conn]
                    idle.append(self._start())
                    res = Result(
                        case.name,
                        case.subset,
                        engine,
                        error=f"TimeoutError: killed after {self.hard_s:g} s (compile and tests)",
                        compile_s=self.timeout_s,
                        timed_out=True,
                        tests=len(case.tests),
                    )
                    out.append(res)
                    progress(res)
        for p, conn in idle:
            conn.send(None)
            p.join(5)
        return out


# ------------------------------------------------------------------------------ report
def pct(a: int, b: int) -> str:
    return f"{100 * a / b:.1f}%" if b else "-"


def quantiles_ms(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"median": float("nan"), "p90": float("nan"), "p99": float("nan"), "max": float("nan")}
    xs = sorted(xs)

    def q(f: float) -> float:
        return 1000 * xs[min(len(xs) - 1, round(f * (len(xs) - 1)))]

    return {"median": 1000 * statistics.median(xs), "p90": q(0.9), "p99": q(0.99), "max": 1000 * xs[-1]}


def llguidance_expected(path: Path | None) -> dict[str, str]:
    """name -> "pass" / "json_error" / "validation_error" from llguidance's own verdicts."""
    if path is None or not path.exists():
        return {}
    import lzma

    raw = lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes()
    out = {}
    for k, v in json.loads(raw).items():
        out[Path(k).name] = "pass" if not v else next(iter(v))
    return out


def summarize(results: list[Result], engine: str, subsets: list[str]) -> list[dict[str, Any]]:
    rows = []
    for s in [*subsets, "all"]:
        rs = [r for r in results if r.engine == engine and (s == "all" or r.subset == s)]
        if not rs:
            continue
        times = [r.compile_s for r in rs]
        rows.append(
            {
                "subset": s,
                "schemas": len(rs),
                "compiled": sum(r.compiled for r in rs),
                "passing": sum(r.passing for r in rs),
                "valid_rejected": sum(r.valid_rejected for r in rs),
                "invalid_accepted": sum(r.invalid_accepted for r in rs),
                "relaxed": sum(r.relaxed for r in rs),
                "warned": sum(bool(r.warnings) for r in rs),
                "timeouts": sum(r.timed_out for r in rs),
                "compile_ms": quantiles_ms(times),
                "peak_mib": max((r.peak_bytes for r in rs), default=0) / 2**20,
            }
        )
    return rows


def table(rows: list[dict[str, Any]], expected: dict[str, str], results: list[Result], engine: str) -> str:
    head = (
        "| subset | schemas | compiled | passing | llguidance's verdicts | valid rejected | invalid accepted"
        " | relaxed | timeouts | compile median / p90 / p99 / max (ms) |"
    )
    lines = [head, "|---|" + "---:|" * 9]
    for row in rows:
        sub = row["subset"]
        names = [r.name for r in results if r.engine == engine and sub in ("all", r.subset)]
        ex = [expected[n] for n in names if n in expected]
        llg = f"{pct(sum(e == 'pass' for e in ex), len(ex))}" if ex else "-"
        c = row["compile_ms"]
        lines.append(
            f"| {row['subset']} | {row['schemas']} | {pct(row['compiled'], row['schemas'])} "
            f"| {pct(row['passing'], row['schemas'])} | {llg} | {row['valid_rejected']} | {row['invalid_accepted']} "
            f"| {row['relaxed']} | {row['timeouts']} "
            f"| {c['median']:.1f} / {c['p90']:.0f} / {c['p99']:.0f} / {c['max']:.0f} |"
        )
    return "\n".join(lines)


def failure_classes(results: list[Result], engine: str) -> dict[str, list[str]]:
    """Failures grouped by the first words of their error (or "valid rejected"...)."""
    out: dict[str, list[str]] = collections.defaultdict(list)
    for r in results:
        if r.engine != engine or r.passing:
            continue
        if not r.compiled:
            msg = r.error.split("\n")[0]
            # the class: the exception and its message without pointers and values
            parts = msg.split(": ")
            key = parts[0] + ": " + (parts[-1][:70] if len(parts) > 1 else "")
        elif r.valid_rejected and r.invalid_accepted:
            key = "valid rejected and invalid accepted"
        elif r.valid_rejected:
            key = "valid rejected"
        else:
            key = "invalid accepted"
        out[key].append(r.name)
    return dict(sorted(out.items(), key=lambda kv: -len(kv[1])))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, type=Path, help="the maskbench archive (.tar.xz) or its data folder")
    ap.add_argument("--subsets", default=",".join(PAPER_SUBSETS))
    ap.add_argument("--sample", type=int, default=0, help="schemas per subset, drawn at random (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="", help="comma-separated file names (overrides --subsets/--sample)")
    ap.add_argument("--engines", default="validator,defaults,llama.cpp,llguidance,xgrammar")
    ap.add_argument("--timeout", type=float, default=10.0, help="compile limit per schema, seconds")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--slowest", type=int, default=20, help="profile this many of the slowest schemas")
    ap.add_argument("--memory", action="store_true", help="peak memory per conversion (tracemalloc)")
    ap.add_argument(
        "--llguidance-expected",
        type=Path,
        default=Path(__file__).resolve().parent.parent.parent
        / "shared"
        / "jsonschemabench"
        / "llguidance-expected_maskbench-c75b0d9.json.xz",
    )
    ap.add_argument("--json", type=Path, help="write every result here")
    ap.add_argument("--markdown", type=Path, help="write the report here")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every failure with its error")
    args = ap.parse_args(argv)

    folder = data_dir(args.data)
    subsets = tuple(s for s in args.subsets.split(",") if s)
    todo = cases(folder, subsets, args.sample or None, args.seed, [x for x in args.only.split(",") if x])
    engines = [e for e in args.engines.split(",") if e]
    report: list[str] = []

    def say(line: str = "") -> None:
        print(line, flush=True)
        report.append(line)

    skipped = {}
    for e in engines:
        if e in PEERS:
            from benchmarks import schema_peers

            why = schema_peers.peer_skip_reason(e)
            if why:
                skipped[e] = why
        elif e not in OURS:
            raise SystemExit(f"unknown engine {e!r} (known: {', '.join([*OURS, *PEERS])})")
    engines = [e for e in engines if e not in skipped]
    expected = llguidance_expected(args.llguidance_expected)
    say(f"# JSONSchemaBench (maskbench) through our converter and the peers: {len(todo)} schemas")
    say()
    say(f"data: {folder}; subsets: {', '.join(subsets)}; sample: {args.sample or 'all'} (seed {args.seed})")
    say(f"limit: {args.timeout:g} s per compile; workers: {args.workers}; python {sys.version.split()[0]}")
    for e, why in skipped.items():
        say(f"{e}: skipped ({why})")
    mode = "memory" if args.memory else "time"
    jobs = [(c, e) for c in todo for e in engines]
    done = [0]
    t_start = time.perf_counter()

    def progress(r: Result) -> None:
        done[0] += 1
        if args.verbose and not r.passing:
            print(
                f"  {r.engine:10s} {r.name}: {'compiled' if r.compiled else 'refused'} {r.compile_s * 1000:.0f} ms "
                f"vr={r.valid_rejected} ia={r.invalid_accepted} {r.error[:300]}",
                file=sys.stderr,
                flush=True,
            )
        if done[0] % 200 == 0:
            print(f"  ... {done[0]}/{len(jobs)} ({time.perf_counter() - t_start:.0f} s)", file=sys.stderr, flush=True)

    hard = args.timeout + 60.0
    results = Pool(args.workers, args.timeout, hard, mode).run(jobs, progress)
    wall = time.perf_counter() - t_start
    payload: dict[str, Any] = {"engines": {}, "wall_s": wall, "skipped": skipped}
    subset_list = list(subsets) if not args.only else sorted({c.subset for c in todo})
    for e in engines:
        rows = summarize(results, e, subset_list)
        payload["engines"][e] = rows
        say()
        say(f"## {e}")
        say()
        say(table(rows, expected, results, e))
        if args.memory:
            say()
            peaks = sorted((r.peak_bytes / 2**20, r.name) for r in results if r.engine == e)
            say(
                f"peak memory per conversion: median {statistics.median(p for p, _ in peaks):.1f} MiB, "
                f"max {peaks[-1][0]:.1f} MiB ({peaks[-1][1]})"
            )
        classes = failure_classes(results, e)
        if classes:
            say()
            say(f"failures of {e}, by class (count: examples):")
            for k, names in classes.items():
                say(f"- {len(names)}: {k} — {', '.join(names[:4])}")
    # the slowest schemas of the first engine of ours, profiled by phase
    ours = [e for e in engines if e in OURS]
    if ours and args.slowest and not args.memory:
        e = ours[0]
        slow = sorted((r for r in results if r.engine == e), key=lambda r: -r.compile_s)[: args.slowest]
        by_name = {c.name: c for c in todo}
        prof_results = Pool(1, args.timeout, hard, "phases").run([(by_name[r.name], e) for r in slow], lambda r: None)
        prof_by = {r.name: r for r in prof_results}
        say()
        say(f"## the {len(slow)} slowest schemas ({e}), where the time goes (ms, measured again with the profiler)")
        say()
        cols = [*PHASES, "other"]
        say("| schema | compile ms | " + " | ".join(cols) + " | result |")
        say("|---|---:|" + "---:|" * len(cols) + "---|")
        for r in slow:
            p = prof_by.get(r.name)
            ph = p.phases if p else {}
            total = p.compile_s if p else 0.0
            other = max(0.0, total - sum(ph.values()))
            cells = [f"{1000 * ph.get(c, 0.0):.0f}" for c in PHASES] + [f"{1000 * other:.0f}"]
            state = "timeout" if r.timed_out else ("pass" if r.passing else ("compiled" if r.compiled else "refused"))
            say(f"| {r.name} | {1000 * r.compile_s:.0f} | " + " | ".join(cells) + f" | {state} |")
    say()
    say(f"wall: {wall:.0f} s")
    if args.json:
        payload["results"] = [vars(r) for r in results]
        args.json.write_text(json.dumps(payload, indent=1, default=str))
    if args.markdown:
        args.markdown.write_text("\n".join(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
