"""llama_cffi against llama.cpp's own tools, all layers offloaded, same build, same run.

Every side runs in its own process per round; rounds alternate which side goes first;
tables show medians over rounds and ``paired`` (the median of per-round ratios).

a. generation, as llama-bench's tg test: ``llama-bench -p PP -n TG -ngl 99 -r REPS``
   (its pp and tg tests in one process) against one child of ours per round that loads
   the model once and runs, in rotated order, ``greedy`` (``decode_single`` + argmax of
   the logits), ``chain`` (``decode_single`` + ``SamplerChain([TopK(40), TopP(0.95),
   Temperature(0.8), Dist])``) and ``decode`` (``decode_single`` of BOS then random ids,
   no sampling: llama-bench's exact workload), each with n_ctx = TG, after a one-token
   warm-up, memory cleared before each repetition;
b. prefill: llama-bench's pp (n_ctx = PP, BOS + random ids, one decode, synchronised)
   against ``ctx.decode(prompt)`` + ``synchronize`` of the same length in one call;
c. batched: ``llama-batched-bench -npp NPP -ntg NTG -npl ... -pps -kvu`` (shared prompt,
   unified KV, every N in one process, one run each after a 16-token warm-up) against
   ``samplers.branch.BranchStore``: the prompt in a root branch, N-1 forks (each its own
   chain, reseeded), then NTG steps of ``store.step({b: b.sample() for b in branches})``
   (S_TG = N*NTG / generation time, prompt and forks excluded, as native's). Modes:
   ``chain`` (the store's default, with per-branch perplexity metrics), ``json`` (the same
   chain behind a JSON schema, :data:`JSON_SCHEMA`: issue 41 asks for its S_TG at >= 0.95x
   ``chain``'s, reported as ``json / chain``), ``notrack``
   (``track=False``) and ``raw`` (``decode_batch`` of N random tokens per step: no
   sampling, native's workload through llama_cffi);
d. where ours loses time: per-step split of the batched loop (sampling, step = decode +
   bookkeeping, of which llama.cpp's own time from ``llama_perf_context``), and the
   per-token split of generation (decode + wait vs. sampling).

Writes ``--json`` and ``--md`` after every run, so a cut-off run keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

T0 = time.monotonic()

OURS_CHECK = r"""
import json, sys, time
import numpy as np
cfg = json.loads(sys.argv[1])
import llama_cffi as lc
info = lc.build_info()
out = {"commit": info["commit"], "origin": info.get("origin"),
       "options": {k: info["options"].get(k) for k in ("GGML_CUDA", "CMAKE_CUDA_ARCHITECTURES", "GGML_CPU_ALL_VARIANTS",
                                                     "GGML_NATIVE", "GGML_AVX2", "GGML_AVX512", "GGML_RPC")},
       "cpu_variant": info.get("cpu_variant"), "memory_reader": info.get("memory_reader"),
       "system_info": lc.system_info(), "supports_gpu_offload": lc.supports_gpu_offload(),
       "devices": [dict(name=d.name, description=d.description, type=d.type.name, backend=d.backend,
                        memory_total=d.memory_total) for d in lc.devices()]}
t = time.perf_counter()
m = lc.Model.load(cfg["model"], n_gpu_layers=cfg["ngl"])
out["load_s"] = round(time.perf_counter() - t, 2)
out["model"] = {"desc": m.desc, "n_params": m.n_params, "size": m.size, "n_vocab": m.n_vocab}
toks = m.tokenize("hello world, the cat")
out["tokenize"] = [int(x) for x in toks]
out["example_prompt_tokens"] = len(m.tokenize(cfg["prompt"]))
with m.context(n_ctx=256, n_batch=256, n_ubatch=256) as ctx:
    row = np.asarray(ctx.decode(toks))
    out["logits_finite"] = bool(np.isfinite(row).all())
    out["argmax"] = int(row.argmax())
    try:
        out["memory_by_device"] = ctx.memory_usage().by_device()
    except Exception as exc:
        out["memory_by_device"] = repr(exc)
print("RESULT " + json.dumps(out, default=str))
"""

OURS_GEN = r"""
import json, sys, time
import numpy as np
cfg = json.loads(sys.argv[1])
import llama_cffi as lc
import samplers as S
pc = time.perf_counter
T, TG, PP, reps = cfg["threads"], cfg["tg"], cfg["pp"], cfg["reps"]
t = pc()
m = lc.Model.load(cfg["model"], n_gpu_layers=cfg["ngl"])
out = {"load_s": pc() - t}
n_vocab = m.n_vocab
bos = m.vocab.bos if m.vocab.add_bos and m.vocab.bos is not None else 0
rng = np.random.default_rng(cfg["seed"])
# b. prefill: llama-bench's pp test (n_ctx = PP, BOS + random ids, synchronised)
prompt = rng.integers(0, n_vocab, size=PP, dtype=np.int32)
prompt[0] = bos
with m.context(n_ctx=PP, n_batch=2048, n_ubatch=512, n_threads=T, n_threads_batch=T, swa_full=False) as ctx:
    ctx.decode(prompt, pos=0)
    ctx.synchronize()  # warm-up, as llama-bench's prompt warm-up
    pp = []
    for r in range(reps):
        ctx.memory.clear(data=False)
        t0 = pc()
        ctx.decode(prompt, pos=0)
        ctx.synchronize()
        pp.append(PP / (pc() - t0))
    out["prefill"] = pp
# a. generation: llama-bench's tg test (n_ctx = TG, one-token warm-up, memory cleared per rep)
rand = [int(x) for x in rng.integers(0, n_vocab, size=TG)]
modes = ["greedy", "chain", "decode"]
for k in modes:
    out[k] = []
    out[k + "_decode_ms"] = []
    out[k + "_sample_ms"] = []
    out[k + "_in_llama_ms"] = []

def in_llama_ms(ctx):
    p = ctx.perf()
    return float(p["t_p_eval_ms"]) + float(p["t_eval_ms"])

# no_perf=False: llama_perf_context's timers (decode start -> synchronize end), to split
# each token's time into llama.cpp's own and the binding's
with m.context(n_ctx=TG, n_batch=2048, n_ubatch=512, n_threads=T, n_threads_batch=T, swa_full=False,
               no_perf=False) as ctx:
    ctx.decode_single(bos, pos=0)
    ctx.synchronize()
    for r in range(reps):
        for mode in modes[r % 3:] + modes[:r % 3]:
            ctx.memory.clear(data=False)
            tok = bos
            t_dec = t_smp = 0.0
            c0 = in_llama_ms(ctx)
            if mode == "greedy":
                t0 = pc()
                for _ in range(TG):
                    a = pc()
                    row = ctx.decode_single(tok)
                    ctx.synchronize()
                    b = pc()
                    tok = int(np.asarray(row).argmax())
                    t_smp += pc() - b
                    t_dec += b - a
                dt = pc() - t0
            elif mode == "chain":
                chain = S.SamplerChain([S.TopK(40), S.TopP(0.95), S.Temperature(0.8), S.Dist(1234)])
                t0 = pc()
                for _ in range(TG):
                    a = pc()
                    ctx.decode_single(tok)
                    ctx.synchronize()
                    b = pc()
                    tok = chain.sample(ctx)
                    t_smp += pc() - b
                    t_dec += b - a
                dt = pc() - t0
            else:
                t0 = pc()
                for i in range(TG):
                    ctx.decode_single(tok)
                    ctx.synchronize()
                    tok = rand[i]
                dt = pc() - t0
                t_dec = dt
            out[mode + "_in_llama_ms"].append((in_llama_ms(ctx) - c0) / TG)
            out[mode].append(TG / dt)
            out[mode + "_decode_ms"].append(t_dec * 1e3 / TG)
            out[mode + "_sample_ms"].append(t_smp * 1e3 / TG)
print("RESULT " + json.dumps(out))
"""

#: the ``json`` mode's schema (``benchmarks/bench_step_host.py`` imports it): at least 64 objects,
#: so that no branch can end within a run
JSON_SCHEMA = {
    "type": "array",
    "minItems": 64,
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "count": {"type": "integer"},
            "ok": {"type": "boolean"},
        },
        "required": ["name", "count", "ok"],
    },
}

OURS_BATCHED = r"""
import json, sys, time
import numpy as np
cfg = json.loads(sys.argv[1])
import llama_cffi as lc
import samplers as S
from samplers.branch import BranchStore
pc = time.perf_counter
T, NPP, NTG, ns, modes = cfg["threads"], cfg["npp"], cfg["ntg"], cfg["npl"], cfg["modes"]
t = pc()
m = lc.Model.load(cfg["model"], n_gpu_layers=cfg["ngl"])
load_s = pc() - t
ctx = m.context(n_ctx=cfg["n_ctx"], n_batch=2048, n_ubatch=512, n_seq_max=max(ns), kv_unified=True, no_perf=False,
                n_threads=T, n_threads_batch=T)
n_vocab = m.n_vocab
rng = np.random.default_rng(1234)
prompt = rng.integers(0, n_vocab, size=NPP, dtype=np.int32)
ctx.decode(rng.integers(0, n_vocab, size=16, dtype=np.int32), pos=0, logits="none")  # as batched-bench's warm-up
ctx.synchronize()
ctx.memory.clear(data=False)

def chain():
    return S.SamplerChain([S.TopK(40), S.TopP(0.95), S.Temperature(0.8), S.Dist(1234)])

grammar = None
if "json" in modes:  # compiled once (the vocabulary index included), before any timing
    from samplers.grammar import Grammar
    grammar = Grammar.from_json_schema(cfg["schema"]).compile(m)

def in_llama_ms():
    ctx.synchronize()
    p = ctx.perf()
    return float(p["t_p_eval_ms"]) + float(p["t_eval_ms"])

rows = []
for i, n in enumerate(ns):
    for mode in modes[i % len(modes):] + modes[:i % len(modes)]:
        ctx.memory.clear(data=False)
        row = {"n": n, "mode": mode}
        if mode == "raw":
            batch = lc.Batch(n)
            ctx.decode(prompt, pos=0, seq_id=0, logits="last")
            for j in range(1, n):
                ctx.memory.seq_cp(0, j)
            toks = rng.integers(0, n_vocab, size=(NTG, n), dtype=np.int32)
            c0 = in_llama_ms()
            t0 = pc()
            for s in range(NTG):
                batch.clear()
                for j in range(n):
                    batch.add(int(toks[s, j]), NPP + s, (j,), True)
                ctx.decode_batch(batch)
                ctx.synchronize()
            wall = pc() - t0
            c1 = in_llama_ms()
            row.update(tps=n * NTG / wall, step_ms=wall * 1e3 / NTG, in_llama_ms=(c1 - c0) / NTG)
        else:
            store = BranchStore(ctx, device=mode == "device")
            tp = pc()
            root = store.create(prompt, sampler=chain(), track=(mode != "notrack"),
                                grammar=grammar if mode == "json" else None)
            branches = [root] + [root.fork(seed=j) for j in range(1, n)]
            row["prompt_and_forks_ms"] = (pc() - tp) * 1e3
            store.step(store.sample(branches))  # untimed: the first step of every branch (graphs reserved)
            t_s = t_st = 0.0
            c0 = in_llama_ms()
            t0 = pc()
            for s in range(NTG):
                a = pc()
                moves = store.sample(branches)
                b_ = pc()
                store.step(moves)
                t_s += b_ - a
                t_st += pc() - b_
            wall = pc() - t0
            c1 = in_llama_ms()
            store.drain()
            row.update(tps=n * NTG / wall, step_ms=wall * 1e3 / NTG, sample_ms=t_s * 1e3 / NTG,
                       store_step_ms=t_st * 1e3 / NTG, in_llama_ms=(c1 - c0) / NTG,
                       masks_during_decode=bool(getattr(store, "_prefetch", False)))
        rows.append(row)
        print("ROW " + json.dumps(row), flush=True)
ctx.memory.clear(data=False)
print("RESULT " + json.dumps({"load_s": load_s, "rows": rows}))
"""

#: llama-batched's loop (examples/batched) with a BranchStore: the same prompt text, context
#: sizes, one seed for every sequence (as its samplers), sequences that end at an
#: end-of-generation token; tok/s = tokens decoded / time of the loop, as it prints.
OURS_EXAMPLE = r"""
import json, sys
cfg = json.loads(sys.argv[1])
import llama_cffi as lc
from benchmarks.common import llama_batched_loop
m = lc.Model.load(cfg["model"], n_gpu_layers=cfg["ngl"])
out = {}
for device in (False, True):
    for n in cfg["npl"]:
        key = f"{'device' if device else 'host'}-{n}"
        out[key] = llama_batched_loop(m, cfg["prompt"], n, cfg["ntg"], cfg["seed"], cfg["threads"], device)
        print("ROW " + json.dumps({key: out[key]}), flush=True)
print("RESULT " + json.dumps(out))
"""
EXAMPLE_PROMPT = "The history of the printing press begins in"


def now() -> str:
    return f"[bench +{time.monotonic() - T0:6.1f}s]"


def med(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


class Runner:
    def __init__(self, args: argparse.Namespace) -> None:
        self.a = args
        self.durations: dict[str, list[float]] = {}
        self.guess = {
            "gen": 20.0,
            "llama-bench": 15.0,
            "batched": 30.0,
            "batched-bench": 15.0,
            "check": 20.0,
            "example": 30.0,
            "example-native": 10.0,
        }
        self.res: dict[str, Any] = {
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "skipped": [],
            "errors": [],
            "gen": {"native": [], "ours": []},
            "batched": {"native": [], "ours": []},
            "example": {"native": [], "ours": []},
        }

    # ------------------------------------------------------------------ plumbing
    def time_left(self) -> float:
        return self.a.deadline - time.time()

    def fits(self, kind: str) -> bool:
        est = max(self.durations.get(kind, [self.guess[kind]]))
        if self.time_left() < est + 5:
            msg = f"{kind}: skipped, {self.time_left():.0f} s left of the budget, a run takes ~{est:.0f} s"
            print(now(), msg, flush=True)
            self.res["skipped"].append(msg)
            return False
        return True

    def run(self, kind: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess | None:
        timeout = max(10.0, min(self.a.child_timeout, self.time_left() - 2))
        t = time.monotonic()
        self.partial: tuple[str, str] | None = None
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout, env=env)
        except subprocess.TimeoutExpired as exc:

            def text(x: Any) -> str:
                return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")

            self.partial = (text(exc.stdout), text(exc.stderr))
            err = self.partial[1][-2000:]
            msg = f"{kind}: timed out after {timeout:.0f} s (what it printed is kept): {' '.join(cmd[:3])}...\n{err}"
            print(now(), msg, flush=True)
            self.res["errors"].append(msg)
            return None
        except OSError as exc:
            msg = f"{kind}: could not run {cmd[0]}: {exc}"
            print(now(), msg, flush=True)
            self.res["errors"].append(msg)
            return None
        self.durations.setdefault(kind, []).append(time.monotonic() - t)
        if p.returncode != 0:
            msg = (
                f"{kind}: exit {p.returncode}: {' '.join(cmd[:3])}...\n--- stderr tail ---\n{p.stderr[-3000:]}\n"
                f"--- stdout tail ---\n{p.stdout[-1500:]}"
            )
            print(now(), msg, flush=True)
            self.res["errors"].append(msg[:6000])
            return None
        return p

    def ours(self, kind: str, code: str, cfg: dict[str, Any]) -> dict[str, Any] | None:
        p = self.run(kind, [sys.executable, "-c", code, json.dumps(cfg)])
        if p is None:
            if self.partial is not None:  # cut off: keep the rows it finished
                rows = [json.loads(x[4:]) for x in self.partial[0].splitlines() if x.startswith("ROW ")]
                if rows:
                    return {"rows": rows, "partial": True}
            return None
        for line in reversed(p.stdout.splitlines()):
            if line.startswith("RESULT "):
                return json.loads(line[7:])
        self.res["errors"].append(
            f"{kind}: no RESULT line; stdout tail {p.stdout[-1500:]}; stderr tail {p.stderr[-1500:]}"
        )
        return None

    def native_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(self.a.native_bin), env.get("LD_LIBRARY_PATH")]))
        return env

    def tool(self, name: str) -> Path | None:
        p = self.a.native_bin / name
        return p if p.is_file() and os.access(p, os.X_OK) else None

    # ------------------------------------------------------------------ phases
    def check(self) -> None:
        if not self.a.ours:
            return
        if not self.fits("check"):
            return
        r = self.ours("check", OURS_CHECK, {"model": str(self.a.model), "ngl": self.a.ngl, "prompt": EXAMPLE_PROMPT})
        self.res["ours_check"] = r
        if r:
            self.res["example_prompt_tokens"] = r["example_prompt_tokens"]
            devs = ", ".join(f"{d['name']} ({d['type']}, {d['description']})" for d in r["devices"])
            print(
                now(),
                f"ours: model loads in {r['load_s']} s; devices: {devs}; logits finite: {r['logits_finite']}",
                flush=True,
            )
            print(now(), f"ours: memory by device: {r.get('memory_by_device')}", flush=True)
            nl = (r.get("cpu_variant") or {}).get("not_loaded")
            if nl:
                print(now(), f"ours: backend modules NOT loaded: {nl}", flush=True)
            if self.a.gpu and not any(d["type"] == "GPU" for d in r["devices"]):
                msg = f"ours has NO GPU device (CUDA module not loaded: {nl}): its numbers would be CPU numbers"
                print(now(), "WARNING:", msg, flush=True)
                self.res["errors"].append(msg)

    def gen_native(self) -> None:
        exe = self.tool("llama-bench")
        if exe is None or not self.fits("llama-bench"):
            return
        a = self.a
        cmd = [
            str(exe),
            "-m",
            str(a.model),
            "-p",
            str(a.pp),
            "-n",
            str(a.tg),
            "-ngl",
            str(a.ngl),
            "-t",
            str(a.threads),
            "-r",
            str(a.reps),
            "-o",
            "json",
        ]
        self.res["gen"]["native_command"] = cmd
        p = self.run("llama-bench", cmd, self.native_env())
        if p is None:
            return
        try:
            data = json.loads(p.stdout)
        except json.JSONDecodeError:
            self.res["errors"].append(f"llama-bench: unparsable output {p.stdout[-1500:]}")
            return
        r: dict[str, Any] = {}
        for d in data:
            key = "pp" if int(d.get("n_prompt", 0)) > 0 else "tg"
            r[key] = float(d["avg_ts"])
            r[key + "_samples"] = [float(x) for x in d.get("samples_ts", [])]
            r.setdefault("gpu_info", d.get("gpu_info"))
            r.setdefault("backends", d.get("backends"))
            r.setdefault("flash_attn", d.get("flash_attn"))
        self.res["gen"]["native"].append(r)
        if self.a.gpu and "CUDA" not in str(r.get("backends")) and len(self.res["gen"]["native"]) == 1:
            msg = f"llama-bench reports backends {r.get('backends')!r}: not CUDA"
            print(now(), "WARNING:", msg, flush=True)
            self.res["errors"].append(msg)
        print(
            now(),
            f"native llama-bench: pp{a.pp} {r.get('pp', float('nan')):.1f} tok/s, "
            f"tg{a.tg} {r.get('tg', float('nan')):.1f} tok/s ({r.get('backends')}, {r.get('gpu_info')})",
            flush=True,
        )

    def gen_ours(self) -> None:
        if not self.a.ours or not self.fits("gen"):
            return
        a = self.a
        cfg = {
            "model": str(a.model),
            "ngl": a.ngl,
            "threads": a.threads,
            "tg": a.tg,
            "pp": a.pp,
            "reps": a.reps,
            "seed": len(self.res["gen"]["ours"]),
        }
        r = self.ours("gen", OURS_GEN, cfg)
        if r is None:
            return
        self.res["gen"]["ours"].append(r)
        print(
            now(),
            "ours: "
            + ", ".join(f"{k} {med(r[k]):.1f}" for k in ("prefill", "greedy", "chain", "decode"))
            + f" tok/s (load {r['load_s']:.1f} s)",
            flush=True,
        )

    def batched_native(self) -> None:
        exe = self.tool("llama-batched-bench")
        if exe is None or not self.fits("batched-bench"):
            return
        a = self.a
        cmd = [
            str(exe),
            "-m",
            str(a.model),
            "-c",
            str(a.n_ctx_batched),
            "-b",
            "2048",
            "-ub",
            "512",
            "-npp",
            str(a.npp),
            "-ntg",
            str(a.ntg),
            "-npl",
            ",".join(map(str, a.npl)),
            "-ngl",
            str(a.ngl),
            "-t",
            str(a.threads),
            "-tb",
            str(a.threads),
            "-pps",
            "-kvu",
            "--output-format",
            "jsonl",
        ]
        self.res["batched"]["native_command"] = cmd
        p = self.run("batched-bench", cmd, self.native_env())
        if p is None and self.partial is None:
            return
        out, err = (p.stdout, p.stderr) if p is not None else self.partial
        r: dict[str, Any] = {}
        for line in (out + "\n" + err).splitlines():
            line = line.strip()
            if line.startswith("{") and '"speed_tg"' in line:
                d = json.loads(line)
                r[str(d["pl"])] = {"tps": float(d["speed_tg"]), "t_tg": float(d["t_tg"]), "t_pp": float(d["t_pp"])}
        if not r:
            self.res["errors"].append(f"batched-bench: no jsonl results: {p.stdout[-1500:]} {p.stderr[-1500:]}")
            return
        self.res["batched"]["native"].append(r)
        print(
            now(), "native batched-bench S_TG: " + ", ".join(f"N={k} {v['tps']:.1f}" for k, v in r.items()), flush=True
        )

    def batched_ours(self) -> None:
        if not self.a.ours or not self.fits("batched"):
            return
        a = self.a
        cfg = {
            "model": str(a.model),
            "ngl": a.ngl,
            "threads": a.threads,
            "npp": a.npp,
            "ntg": a.ntg,
            "npl": a.npl,
            "n_ctx": a.n_ctx_batched,
            "modes": a.modes,
            "schema": JSON_SCHEMA,
        }
        r = self.ours("batched", OURS_BATCHED, cfg)
        if r is None:
            return
        self.res["batched"]["ours"].append(r)
        print(
            now(), "ours batched: " + ", ".join(f"{x['mode']} N={x['n']} {x['tps']:.1f}" for x in r["rows"]), flush=True
        )

    def example_native(self) -> None:
        """llama-batched -np N, host sampling and --backend-sampling, for each N of --npl-example."""
        exe = self.tool("llama-batched")
        if exe is None or not self.a.npl_example or not self.fits("example-native"):
            return
        a = self.a
        r: dict[str, Any] = {}
        n_prompt = self.res.get("example_prompt_tokens")
        for bs in (False, True):
            for n in a.npl_example:
                n_predict = (n_prompt or 12) + a.ntg
                cmd = [str(exe), "-m", str(a.model), "-p", EXAMPLE_PROMPT, "-n", str(n_predict), "-np", str(n)]
                cmd += ["--top-k", "40", "--top-p", "0.95", "--temp", "0.8", "-s", "1234", "-kvu"]
                cmd += ["-ngl", str(a.ngl), "-t", str(a.threads), "-tb", str(a.threads)]
                if bs:
                    cmd.append("--backend-sampling")
                self.res.setdefault("example_commands", {})[f"{'device' if bs else 'host'}-{n}"] = cmd
                p = self.run("example-native", cmd, self.native_env())
                if p is None:
                    continue
                m = re.search(r"decoded (\d+) tokens in ([0-9.]+) s, speed: ([0-9.]+) t/s", p.stdout + p.stderr)
                if m is None:
                    self.res["errors"].append(f"llama-batched: no speed line: {p.stderr[-1500:]}")
                    continue
                r[f"{'device' if bs else 'host'}-{n}"] = {
                    "tokens": int(m.group(1)),
                    "loop_s": float(m.group(2)),
                    "tps": float(m.group(3)),
                }
        if r:
            self.res["example"]["native"].append(r)
            print(now(), "native llama-batched: " + ", ".join(f"{k} {v['tps']:.1f}" for k, v in r.items()), flush=True)

    def example_ours(self) -> None:
        if not self.a.ours or not self.a.npl_example or not self.fits("example"):
            return
        a = self.a
        cfg = {
            "model": str(a.model),
            "ngl": a.ngl,
            "threads": a.threads,
            "ntg": a.ntg,
            "npl": a.npl_example,
            "prompt": EXAMPLE_PROMPT,
            "seed": 1234,
        }
        r = self.ours("example", OURS_EXAMPLE, cfg)
        if r is None:
            return
        r.pop("partial", None)
        self.res["example"]["ours"].append(r)
        print(
            now(),
            "ours llama-batched loop: " + ", ".join(f"{k} {v['tps']:.1f}" for k, v in r.items() if isinstance(v, dict)),
            flush=True,
        )

    # ------------------------------------------------------------------ report
    def summarize(self) -> dict[str, Any]:
        g, b = self.res["gen"], self.res["batched"]
        rows: list[dict[str, Any]] = []

        def ratio(o: float | None, n: float | None) -> float | None:
            return o / n if o is not None and n else None

        def paired(ours_vals: list[float | None], nat_vals: list[float | None]) -> float | None:
            return med([o / n for o, n in zip(ours_vals, nat_vals, strict=False) if o is not None and n])

        nat_tg = [r.get("tg") for r in g["native"]]
        nat_pp = [r.get("pp") for r in g["native"]]
        ours_runs = g["ours"]
        for mode, label in (
            ("greedy", "decode + argmax (greedy)"),
            ("chain", "decode + sampler chain"),
            ("decode", "decode only (llama-bench's workload)"),
        ):
            ov = [med(r[mode]) for r in ours_runs]
            rows.append(
                {
                    "metric": f"generation tg{self.a.tg} tok/s: ours {label}",
                    "native": med(nat_tg),
                    "ours": med(ov),
                    "ratio": ratio(med(ov), med(nat_tg)),
                    "paired": paired(ov, nat_tg),
                }
            )
        ov = [med(r["prefill"]) for r in ours_runs]
        rows.append(
            {
                "metric": f"prefill pp{self.a.pp} tok/s (one decode call)",
                "native": med(nat_pp),
                "ours": med(ov),
                "ratio": ratio(med(ov), med(nat_pp)),
                "paired": paired(ov, nat_pp),
            }
        )
        nat_ms = 1e3 / med(nat_tg) if med(nat_tg) else None
        for mode in ("decode", "greedy", "chain"):
            dec = med([med(r[mode + "_decode_ms"]) for r in ours_runs])
            smp = med([med(r[mode + "_sample_ms"]) for r in ours_runs])
            inl = med([med(r.get(mode + "_in_llama_ms", [])) for r in ours_runs])
            rows.append(
                {
                    "metric": f"generation ms/token, {mode}: native total; ours decode+wait (in llama.cpp) + sampling",
                    "native": nat_ms,
                    "ours": dec,
                    "ours_in_llama": inl,
                    "ours_sampling": smp,
                    "ratio": ratio(dec, nat_ms),
                }
            )
        labels = {
            "chain": "BranchStore, per-branch chain (+ metrics), row kernel on the host",
            "device": "BranchStore(device=True), chain (+ metrics), top-k and measures in the graph",
            "notrack": "BranchStore, chain, track=False",
            "json": "BranchStore, chain behind a JSON schema (grammar fast path; masks only where rejected)",
            "raw": "decode_batch only (native's workload)",
        }
        for n in self.a.npl:
            nv = [r.get(str(n), {}).get("tps") for r in b["native"]]
            for mode in self.a.modes:
                ov = [med([x["tps"] for x in r["rows"] if x["n"] == n and x["mode"] == mode]) for r in b["ours"]]
                rows.append(
                    {
                        "metric": f"batched N={n} S_TG tok/s: ours {labels.get(mode, mode)}",
                        "native": med(nv),
                        "ours": med(ov),
                        "ratio": ratio(med(ov), med(nv)),
                        "paired": paired(ov, nv),
                    }
                )
        if "json" in self.a.modes and "chain" in self.a.modes:
            for n in self.a.npl:
                jv, cv = (
                    [med([x["tps"] for x in r["rows"] if x["n"] == n and x["mode"] == mode]) for r in b["ours"]]
                    for mode in ("json", "chain")
                )
                rows.append(
                    {
                        "metric": f"batched N={n} S_TG: json / chain (ours JSON-constrained against unconstrained)",
                        "native": med(cv),
                        "ours": med(jv),
                        "ratio": ratio(med(jv), med(cv)),
                        "paired": paired(jv, cv),
                    }
                )
        nmax = max(self.a.npl)
        nv = med([r.get(str(nmax), {}).get("tps") for r in b["native"]])
        split: dict[str, Any] = {"n": nmax, "native_step_ms": (nmax / nv * 1e3) if nv else None}
        for mode in self.a.modes:
            sel = [x for r in b["ours"] for x in r["rows"] if x["n"] == nmax and x["mode"] == mode]
            if sel:
                split[mode] = {
                    k: med([x.get(k) for x in sel]) for k in ("step_ms", "sample_ms", "store_step_ms", "in_llama_ms")
                }
                s = split[mode]
                if s.get("store_step_ms") is not None and s.get("in_llama_ms") is not None:
                    s["store_step_host_ms"] = s["store_step_ms"] - s["in_llama_ms"]
                if s.get("step_ms") is not None and s.get("in_llama_ms") is not None:
                    s["host_ms"] = s["step_ms"] - s["in_llama_ms"]
        ex = self.res["example"]
        for n in self.a.npl_example:
            for key, nat_key, label in (
                (f"host-{n}", f"host-{n}", "ours (host row kernel) vs llama-batched (host sampling)"),
                (f"host-{n}", f"device-{n}", "ours (host row kernel) vs llama-batched --backend-sampling"),
                (f"device-{n}", f"device-{n}", "ours (device=True) vs llama-batched --backend-sampling"),
            ):
                nv = [r.get(nat_key, {}).get("tps") for r in ex["native"]]
                ov = [r.get(key, {}).get("tps") for r in ex["ours"]]
                rows.append(
                    {
                        "metric": f"llama-batched -np {n} loop tok/s: {label}",
                        "native": med(nv),
                        "ours": med(ov),
                        "ratio": ratio(med(ov), med(nv)),
                        "paired": paired(ov, nv),
                    }
                )
        return {"rows": rows, "split_nmax": split}

    def write(self) -> None:
        s = self.summarize()
        self.res["summary"] = s
        self.res["elapsed_s"] = round(time.monotonic() - T0, 1)
        for extra in ("build_json", "model_json", "env_json"):
            p = getattr(self.a, extra)
            if p and Path(p).is_file():
                try:
                    self.res[extra[:-5]] = json.loads(Path(p).read_text())
                except json.JSONDecodeError:
                    pass
        self.a.json.write_text(json.dumps(self.res, indent=1, default=str))
        self.a.md.write_text(render_md(self.res, s, self.a))


def fmt(v: Any, nd: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def render_md(res: dict[str, Any], s: dict[str, Any], a: argparse.Namespace) -> str:
    out = []
    env = res.get("env") or {}
    build = res.get("build") or {}
    model = res.get("model") or {}
    out.append("# llama_cffi vs llama.cpp on the GPU (all layers offloaded)\n")
    commit = str((res.get("ours_check") or {}).get("commit") or "0c1e570")[:12]
    out.append(
        f"- llama_cffi {str(env.get('project_commit') or '-')[:12]}, llama.cpp {commit} "
        "(patched, one build tree for both sides)"
    )
    out.append(
        f"- device: {env.get('gpu', '-')}; CUDA: {env.get('nvcc', '-')}; "
        f"CPU: {env.get('cpu', '-')} x{env.get('nproc', '-')}"
    )
    out.append(
        f"- model: {model.get('shape', '-')}: vocab {model.get('n_vocab', '-')}, n_embd {model.get('n_embd', '-')}, "
        f"{model.get('n_layer', '-')} layers, {model.get('n_head', '-')}/{model.get('n_head_kv', '-')} heads, "
        f"n_ff {model.get('n_ff', '-')}, F16, {fmt((model.get('n_params') or 0) / 1e6, 0)} M params"
    )
    ninja = build.get("ninja") or {}
    out.append(
        f"- build: ok={build.get('ok')}, tools={build.get('tools_built')}, steps {build.get('steps')}, "
        f"ninja wall {ninja.get('wall_s', '-')} s, CPU s by part {ninja.get('cpu_s_by_part', '-')}, "
        f"finished at {ninja.get('finished_at_s', '-')}"
    )
    out.append(
        f"- rounds {a.rounds} (median; 'paired' = median of per-round ratios), reps {a.reps}, threads {a.threads}, "
        f"-ngl {a.ngl}; elapsed {res.get('elapsed_s')} s"
    )
    out.append("")
    out.append("| metric | native | ours | ours/native | paired |")
    out.append("| --- | ---: | ---: | ---: | ---: |")
    for r in s["rows"]:
        ours = fmt(r["ours"], 3 if "ms/" in r["metric"] else 1)
        if "ours_in_llama" in r:
            ours += f" ({fmt(r['ours_in_llama'], 3)})"
        if "ours_sampling" in r:
            ours += f" + {fmt(r['ours_sampling'], 3)}"
        out.append(
            f"| {r['metric']} | {fmt(r['native'], 3 if 'ms/' in r['metric'] else 1)} | {ours} | "
            f"{fmt(r['ratio'], 3)} | {fmt(r.get('paired'), 3)} |"
        )
    sp = s["split_nmax"]
    out.append("")
    out.append(f"Per step at N={sp['n']} (ms): native step {fmt(sp.get('native_step_ms'), 2)}")
    for mode in a.modes:
        d = sp.get(mode)
        if d:
            out.append(f"- ours {mode}: " + ", ".join(f"{k} {fmt(v, 2)}" for k, v in d.items()))
    if res.get("skipped"):
        out.append("\nSkipped: " + "; ".join(res["skipped"]))
    if res.get("errors"):
        out.append(f"\nErrors: {len(res['errors'])} (see gpu_bench.json / log.txt)")
        for e in res["errors"]:
            out.append(f"- {e.splitlines()[0][:300]}")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--native-bin", type=Path, required=True)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--md", type=Path, required=True)
    ap.add_argument("--build-json", type=Path)
    ap.add_argument("--model-json", type=Path)
    ap.add_argument("--env-json", type=Path)
    ap.add_argument("--ours", type=int, default=1, help="0: the project did not build; native only")
    ap.add_argument("--gpu", type=int, default=1, help="1: expect a GPU device on both sides (warn if missing)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--npp", type=int, default=128)
    ap.add_argument("--ntg", type=int, default=64)
    ap.add_argument("--npl", default="1,8,32,64")
    ap.add_argument("--modes", default="chain,json,device,notrack,raw")
    ap.add_argument(
        "--npl-example",
        default="64",
        help="N for llama-batched -np N (host and --backend-sampling) against ours doing its loop ('' to skip)",
    )
    ap.add_argument(
        "--phases",
        default="gen,batched,example",
        help="each round's phases that run: gen (llama-bench), batched (llama-batched-bench), example (llama-batched)",
    )
    ap.add_argument("--n-ctx-batched", type=int, default=4608)
    ap.add_argument("--ngl", type=int, default=99)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--child-timeout", type=float, default=180.0)
    ap.add_argument("--deadline", type=float, default=time.time() + 400, help="epoch seconds: no run starts past it")
    a = ap.parse_args()
    a.npl = [int(x) for x in a.npl.split(",")]
    a.modes = [x for x in a.modes.split(",") if x]
    a.phases = {x for x in a.phases.split(",") if x}
    if not a.phases <= {"gen", "batched", "example"}:
        ap.error(f"--phases takes gen, batched, example; not {sorted(a.phases)}")
    a.npl_example = [int(x) for x in a.npl_example.split(",") if x]
    need = a.npp + max(a.npl) * a.ntg
    if need > a.n_ctx_batched:
        ap.error(f"--n-ctx-batched {a.n_ctx_batched} < npp + max(npl) * ntg = {need}")
    R = Runner(a)
    print(
        now(),
        f"budget: {R.time_left():.0f} s; model {a.model}; native tools in {a.native_bin}: "
        f"llama-bench {'yes' if R.tool('llama-bench') else 'MISSING'}, "
        f"llama-batched-bench {'yes' if R.tool('llama-batched-bench') else 'MISSING'}, "
        f"llama-batched {'yes' if R.tool('llama-batched') else 'MISSING'}; ours {'yes' if a.ours else 'NO'}",
        flush=True,
    )
    R.check()
    R.write()
    # rounds interleave everything, so a run cut short by the budget still has every kind
    for r in range(a.rounds):
        sides = ("native", "ours") if r % 2 == 0 else ("ours", "native")
        if "gen" in a.phases:
            print(now(), f"--- round {r + 1}/{a.rounds}: generation + prefill ({' then '.join(sides)})", flush=True)
            for side in sides:
                R.gen_native() if side == "native" else R.gen_ours()
                R.write()
        if "batched" in a.phases:
            print(now(), f"--- round {r + 1}/{a.rounds}: batched ({' then '.join(sides)})", flush=True)
            for side in sides:
                R.batched_native() if side == "native" else R.batched_ours()
                R.write()
        if "example" in a.phases:
            print(now(), f"--- round {r + 1}/{a.rounds}: llama-batched's loop ({' then '.join(sides)})", flush=True)
            for side in sides:
                R.example_native() if side == "native" else R.example_ours()
                R.write()
    R.write()
    print()
    print(a.md.read_text(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
