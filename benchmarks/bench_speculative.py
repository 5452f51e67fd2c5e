"""Speculative decoding: ours (``samplers.speculative``) against plain greedy decoding and
llama.cpp's own tools, same build, same model, prompt, draft settings and length.

Task (prompt lookup): "rewrite this code with one change" over a ~300-token Python
snippet, greedy, on the default model (Gemma 3 270M): an input-copying task, where most
of the answer is in the prompt. Four sides, each a fresh process per round, rotated:

(llama.cpp's examples are compiled from the pinned source against the same static
libraries as its tools: :func:`benchmarks.native_tools.build_llama_example`.)

* ``native plain``: ``llama-lookup --spec-draft-n-max 0`` (llama.cpp's lookup loop
  drafting nothing: one decode per token);
* ``native lookup``: ``llama-lookup --spec-draft-n-max K`` (its n-gram cache drafts);
* ``ours plain``: ``stream(branch, N)``, greedy, metrics off (``track=False``);
* ``ours lookup``: ``stream(branch, N, drafter=PromptLookup(max_draft=K))``.

Tokens/s is llama.cpp's own "decoded N tokens in T seconds" for the native sides (the
prompt's decode excluded) and the same span for ours (from the first sample to the
last token). Both sides load the model with llama.cpp's defaults (weights repacked for
the CPU, flash attention auto), ``n_ctx`` 2048, ``n_batch`` 512, THREADS threads. With
repacked weights a multi-token batch rounds differently from a one-token one, so a
greedy output may leave plain greedy's at a near tie (both tools alike); ``--no-repack``
runs both sides without repacking, where the outputs are equal (the table says in how
many rounds they were).

Draft model: no smaller model with Gemma's vocabulary is available here, so the
draft-model path is measured on a tiny pair (the test suite's random-weight llama and
the same vocabulary with other weights) for correctness and acceptance only:
``llama-speculative-simple -m tiny -md tiny-other`` against ours with
``DraftModel(tiny-other)``, both greedy.

    python benchmarks/bench_speculative.py [--rounds 5] [--tokens 256] [--draft-max 8] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import llama_cffi  # noqa: E402
from benchmarks.bench_generate import child_env, measured  # noqa: E402
from benchmarks.common import command_line, median, write_json  # noqa: E402
from benchmarks.native_tools import build_llama_example  # noqa: E402

CODE = '''\
import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Record:
    name: str
    score: float
    tags: list[str] = field(default_factory=list)


def load_records(path: Path) -> list[Record]:
    """Read records from a JSON lines file, skipping blank lines."""
    records = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            data = json.loads(line)
            records.append(Record(data["name"], float(data["score"]), list(data.get("tags", []))))
    return records


def process(records: list[Record], threshold: float) -> dict[str, float]:
    """Average score per tag, over the records scoring at least threshold."""
    totals: dict[str, float] = {}
    counts: dict[str, int] = {}
    for record in records:
        if record.score < threshold:
            continue
        for tag in record.tags:
            totals[tag] = totals.get(tag, 0.0) + record.score
            counts[tag] = counts.get(tag, 0) + 1
    return {tag: totals[tag] / counts[tag] for tag in totals}


def main() -> None:
    records = load_records(Path("records.jsonl"))
    for tag, mean in sorted(process(records, 0.5).items()):
        print(f"{tag}: {mean:.3f}")


if __name__ == "__main__":
    main()
'''

PROMPT = (
    "Rewrite the following Python code with one change: rename the function `process` to "
    "`average_by_tag`. Output the complete code.\n\n```python\n" + CODE + "```\n\nRewritten code:\n\n```python\n"
)

OURS = r"""
import json, sys, time
import llama_cffi
from samplers.branch import BranchStore
from samplers.search import stream
from samplers.speculative import DraftModel, PromptLookup
path, prompt, draft_path = sys.argv[1], sys.argv[2], sys.argv[6]
n, threads, k = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
m = llama_cffi.Model.load(path, **({"use_extra_bufts": False} if sys.argv[7] == "1" else {}))
ctx = m.context(n_ctx=2048, n_batch=512, n_threads=threads, n_threads_batch=threads)
toks = [int(t) for t in m.tokenize(prompt)]
ctx.decode(toks[:8], logits="none")  # warm-up, as llama.cpp's tools do
ctx.memory.clear()
store = BranchStore(ctx)
b = store.create(toks, track=False)
d = None
if draft_path:
    d = DraftModel(llama_cffi.Model.load(draft_path), max_draft=k, n_ctx=2048, n_threads=threads)
elif k:
    d = PromptLookup(max_draft=k)
t0 = time.perf_counter()
for _ in stream(b, n, drafter=d):
    pass
dt = time.perf_counter() - t0
n_gen = b.position - len(toks)
out = {"tokens": n_gen, "seconds": dt, "tps": n_gen / dt, "generated": b.tokens[len(toks):]}
if d is not None:
    out.update(d.stats.as_dict())
print(json.dumps(out))
"""


def native_command(
    tool: Path, model: Path, prompt: str, n: int, k: int, threads: int, draft: Path | None, no_repack: bool = False
) -> list[str]:
    cmd = [str(tool), "-m", str(model), "-p", prompt, "-n", str(n), "--temp", "0", "-c", "2048", "-b", "512"]
    cmd += ["-t", str(threads), "-tb", str(threads), "--spec-draft-n-max", str(k), "--seed", "1"]
    if no_repack:
        cmd.append("--no-repack")
    if draft is not None:
        cmd += ["-md", str(draft), "-td", str(threads), "-tbd", str(threads), "--spec-type", "draft-simple"]
    return cmd


def parse_native(text: str) -> dict[str, float]:
    """llama.cpp's summary lines: decoded tokens and speed, drafted and accepted."""
    out: dict[str, float] = {}
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", text)
    if m is None:
        raise RuntimeError(f"no 'decoded ... t/s' line in the tool's output:\n{text[-2000:]}")
    out["tokens"], out["seconds"], out["tps"] = float(m[1]), float(m[2]), float(m[3])
    for key in ("n_drafted", "n_accept", "n_predict"):
        km = re.search(rf"\b{key}\s*=\s*(\d+)", text)
        if km:
            out[key] = float(km[1])
    if out.get("n_drafted"):
        out["acceptance_rate"] = out["n_accept"] / out["n_drafted"]
    if "n_predict" in out and "n_accept" in out:
        out["tokens_per_decode"] = out["n_predict"] / max(out["n_predict"] - out["n_accept"], 1)
    return out


def run_ours(model: Path, prompt: str, args: argparse.Namespace, k: int, draft: Path | None = None) -> dict[str, Any]:
    cmd = [sys.executable, "-c", OURS, str(model), prompt, str(args.tokens), str(args.threads), str(k)]
    cmd.append(str(draft) if draft else "")
    cmd.append("1" if args.no_repack else "0")
    r = measured(cmd, args, "ours", cwd=ROOT, env=child_env())
    res: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return res


def run_native(cmd: list[str], args: argparse.Namespace) -> dict[str, float]:
    r = measured(cmd, args, "native")
    return parse_native(r.stdout + "\n" + r.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=256, help="tokens to generate (-n)")
    ap.add_argument("--draft-max", type=int, default=8, help="most tokens drafted per decode (both sides)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-foreign", type=float, default=0.15)
    ap.add_argument("--quiet-wait", type=float, default=10.0)
    ap.add_argument("--retries", type=int, default=2)
    ap.add_argument("--run-timeout", type=float, default=300.0)
    ap.add_argument(
        "--no-repack",
        action="store_true",
        help="both sides without CPU weight repacking (llama.cpp --no-repack; ours use_extra_bufts=False): "
        "then every batch shape rounds alike and speculative output equals plain output exactly",
    )
    ap.add_argument("--skip-draft-model", action="store_true", help="only the prompt-lookup table")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    try:
        model = Path(llama_cffi.default_model_path())
    except llama_cffi.LlamaError as exc:
        print(f"skipped: {exc}")
        return 0
    lookup = build_llama_example("lookup")
    k = args.draft_max
    cmds = {
        "native plain": native_command(lookup, model, PROMPT, args.tokens, 0, args.threads, None, args.no_repack),
        "native lookup": native_command(lookup, model, PROMPT, args.tokens, k, args.threads, None, args.no_repack),
    }
    shown = [*cmds["native lookup"][:1], "-m", "MODEL", "-p", "PROMPT", *cmds["native lookup"][5:]]
    print(f"native: {' '.join(shown)}")
    print(f"ours: stream(branch, {args.tokens}, drafter=PromptLookup(max_draft={k})) in a fresh process per round")
    sides = ["native plain", "native lookup", "ours plain", "ours lookup"]
    res: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    for r in range(args.rounds):
        for side in sides[r % len(sides) :] + sides[: r % len(sides)]:
            if side.startswith("native"):
                res[side].append(run_native(cmds[side], args))
            else:
                res[side].append(run_ours(model, PROMPT, args, k if side == "ours lookup" else 0))
        print(f"round {r + 1}: " + "  ".join(f"{s} {res[s][-1]['tps']:.1f}" for s in sides) + " tok/s", flush=True)
    same = [o["generated"] == p["generated"] for o, p in zip(res["ours lookup"], res["ours plain"], strict=True)]
    table: dict[str, Any] = {}
    base = median([x["tps"] for x in res["ours plain"]])
    nat_lookup = median([x["tps"] for x in res["native lookup"]])
    print()
    print(
        f"prompt lookup, {args.tokens} tokens, draft max {k}, {args.threads} threads: medians of {args.rounds} "
        f"interleaved rounds; ours lookup output == ours plain output in {sum(same)}/{len(same)} rounds"
    )
    print(f"{'':16} {'tok/s':>7} {'/ours plain':>11} {'/native lookup':>14} {'accept':>7} {'tok/decode':>10}")
    for s in sides:
        tps = median([x["tps"] for x in res[s]])
        acc = median([float(x.get("acceptance_rate", 0.0)) for x in res[s]])
        tpd = median([float(x.get("tokens_per_decode", 1.0)) for x in res[s]])
        paired = median([x["tps"] / y["tps"] for x, y in zip(res[s], res["native lookup"], strict=True)])
        table[s] = {
            "tps": tps,
            "over_ours_plain": tps / base,
            "over_native_lookup": tps / nat_lookup,
            "over_native_lookup_paired": paired,
            "acceptance_rate": acc,
            "tokens_per_decode": tpd,
            "tokens": median([x["tokens"] for x in res[s]]),
        }
        print(f"{s:16} {tps:>7.1f} {tps / base:>11.2f} {paired:>14.2f} {acc:>7.1%} {tpd:>10.2f}")
    draft_rows: dict[str, Any] = {}
    if not args.skip_draft_model:
        draft_rows = draft_pair(args)
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "bench_speculative",
                "command": command_line(sys.argv[1:] if argv is None else argv),
                "config": vars(args) | {"json": str(args.json)},
                "native_commands": cmds,
                "lookup": table,
                "lookup_equals_plain": same,
                "draft_model_tiny_pair": draft_rows,
            },
        )
    return 0


def draft_pair(args: argparse.Namespace) -> dict[str, Any]:
    """The draft-model path on the tiny pair: acceptance, tokens per decode, equality."""
    from llama_cffi.testing import write_tiny_model

    spec = build_llama_example("speculative-simple")
    k = min(args.draft_max, 4)
    with tempfile.TemporaryDirectory() as tmp:
        target = write_tiny_model(Path(tmp) / "tiny.gguf")
        draft = write_tiny_model(Path(tmp) / "tiny-other.gguf", seed=7)
        prompt = "the cat sat on the mat and the dog sat on the log and the cat"
        rows: dict[str, Any] = {}
        for name, d in (("same weights", target), ("other weights", draft)):
            nat = run_native(native_command(spec, target, prompt, 128, k, args.threads, d), args)
            ours = run_ours(target, prompt, args, k, d)
            plain = run_ours(target, prompt, args, 0)
            rows[name] = {"native": nat, "ours": {x: v for x, v in ours.items() if x != "generated"}}
            rows[name]["ours_equals_plain"] = ours["generated"] == plain["generated"]
            print(
                f"draft model ({name}), tiny pair, draft max {k}: native accept {nat.get('acceptance_rate', 0):.1%}, "
                f"{nat.get('tokens_per_decode', 1):.2f} tok/decode; ours accept {ours['acceptance_rate']:.1%}, "
                f"{ours['tokens_per_decode']:.2f} tok/decode; ours == plain greedy: {rows[name]['ours_equals_plain']}"
            )
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
