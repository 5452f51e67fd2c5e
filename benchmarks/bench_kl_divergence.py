"""KL-divergence mode time: samplers.kl_divergence against llama-perplexity.

``python -m samplers.perplexity`` (its KL-divergence modes) against llama.cpp's ``llama-perplexity`` built from
the same source and options (``native_tools``), whole processes (start-up, model load,
tokenization, evaluation, the file, exit), each in its own process, interleaved over
``--rounds`` rounds (which side goes first alternates); medians and the ratio ours/native.

Two modes, both timed:

* ``base``: ``-f TEXT --chunks N --kl-divergence-base FILE`` (a perplexity run that writes
  the base model's quantised log-probabilities: ``N * (c/2 - 1)`` rows of 512 KiB for the
  default model's 262,144-token vocabulary, 2.7 GB for 20 chunks at ``-c 512``). The two
  files must be the same bytes (checked after every round) or the script fails;
* ``kl``: ``--kl-divergence --kl-divergence-base FILE -ctk q8_0`` (the same model with a
  q8_0 K cache, a real divergence, against the f16 base): ours reads llama-perplexity's
  file, llama-perplexity reads ours; the chunk table and statistics lines must be equal
  or the script fails.

Files: before each ``base`` run the side's old file is deleted (neither truncates or
replaces a cached 2.7 GB file); before each ``kl`` run the file it reads is written back
and dropped from the page cache (both read the disk, as with a base file larger than the
page cache). ``samplers.kl_divergence`` itself drops the pages it has written or read
(``posix_fadvise``); llama-perplexity leaves them cached.

The text: the standard-library docstrings of ``bench_perplexity.make_text`` until it holds
``--chunks * -c`` tokens (or ``--text FILE``). Before each run the script waits up to
``--quiet-wait`` s for other processes to use at most ``--max-foreign`` cores, and runs
again (up to ``--retries``) after a noisy run; the other load of each run is reported.

    python benchmarks/bench_kl_divergence.py [--rounds 3] [--chunks 20] [-c 512] [-b 2048] [--json PATH]
"""

from __future__ import annotations

import argparse
import filecmp
import hashlib
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import llama_cffi  # noqa: E402
from benchmarks.bench_perplexity import MODULES, make_text  # noqa: E402
from benchmarks.common import ChildRun, command_line, median, quiet_run, run_child, write_json  # noqa: E402
from benchmarks.native_tools import build_llama_tool  # noqa: E402

TOOL = "llama-perplexity"
FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
MEAN_KLD = re.compile(r"Mean    KLD: +([-0-9.]+)")
TABLE_HEADER = "chunk             PPL               ln(PPL(Q)/PPL(base))"
TABLE_LINE = re.compile(r"^ {0,3}\d+ {4}.* %$")
STAT_LINE = re.compile(r"^(Mean |Maximum|Minimum|Median|Cor\(|RMS|Same top|[ 0-9.]{4}%  |======)")


def kl_lines(text: str) -> list[str]:
    """The chunk table and the statistics lines (llama.cpp's log prefixes dropped)."""
    out = []
    for line in text.splitlines():
        line = re.sub(r"^\d+\.\d+\.\d+\.\d+ [IWE] ", "", line)
        if line.startswith(TABLE_HEADER) or TABLE_LINE.match(line) or STAT_LINE.match(line):
            out.append(line)
    return out


def sample(run: ChildRun) -> dict[str, float]:
    return {
        "wall_s": run.wall_s,
        "cpu_s": run.user_s + run.sys_s,
        "peak_rss_kib": float(run.peak_rss_kib),
        "foreign_cores": run.foreign_cores,
    }


def evict(path: Path) -> None:
    """Drop ``path`` from the page cache (written back first), so that the run reading it
    reads the disk: both sides alike, whatever ran before (a base file is usually far
    larger than the page cache: 75 GB for wikitext-2)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--text", type=Path, help="a text file to use instead of the generated one")
    ap.add_argument("-c", "--ctx-size", type=int, default=512)
    ap.add_argument("-b", "--batch-size", type=int, default=2048)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--dir", type=Path, help="where the base files go (default: a temporary directory)")
    ap.add_argument("--max-foreign", type=float, default=0.3, help="cores other processes may use before a run")
    ap.add_argument("--quiet-wait", type=float, default=10.0, help="seconds to wait for a quiet machine per run")
    ap.add_argument("--retries", type=int, default=1, help="runs again when other processes used more")
    ap.add_argument("--run-timeout", type=float, default=900.0, help="seconds before a run is killed and retried")
    ap.add_argument("--json", type=Path, help="also write the results here, as JSON")
    args = ap.parse_args(argv)
    try:
        model_path = Path(llama_cffi.default_model_path())
    except llama_cffi.LlamaError as exc:
        print(f"skipped: {exc}")
        return 0
    tool = build_llama_tool(TOOL)
    tmp = tempfile.TemporaryDirectory(dir=args.dir)
    work = Path(tmp.name)
    with llama_cffi.Model.load(model_path) as model:
        if args.text:
            data = args.text.read_bytes()
            source = str(args.text)
        else:
            data = make_text(model, args.chunks * args.ctx_size + 1).encode()
            source = f"docstrings of Python {sys.version.split()[0]}'s {', '.join(MODULES)}"
        n_tokens = len(model.tokenize(data[:-1] if data.endswith(b"\n") else data))
    text = work / "text.txt"
    text.write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    files = {"native": work / "native.kld", "ours": work / "ours.kld"}
    common = ["-m", str(model_path), "-c", str(args.ctx_size), "-b", str(args.batch_size), "-t", str(args.threads)]
    exe = {"native": [str(tool)], "ours": [sys.executable, "-m", "samplers.perplexity"]}
    other = {"native": "ours", "ours": "native"}
    cmds = {
        ("base", side): [*exe[side], *common, "-f", str(text), "--chunks", str(args.chunks),
                         "--kl-divergence-base", str(files[side])]
        for side in exe
    }  # fmt: skip
    for side in exe:  # each reads the other's file
        cmds[("kl", side)] = [*exe[side], *common, "--kl-divergence", "--kl-divergence-base", str(files[other[side]])]
        cmds[("kl", side)] += ["-ctk", "q8_0"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    print(f"text: {source}; {len(data)} bytes, {n_tokens} tokens, sha256 {sha[:16]}")
    for key, cmd in cmds.items():
        print(f"{key[0]:4} {key[1]:6}: {' '.join(cmd)}")
    print(flush=True)

    res: dict[tuple[str, str], list[dict[str, float]]] = {k: [] for k in cmds}
    outputs: dict[tuple[str, str], str] = {}
    for r in range(args.rounds):
        order = ("native", "ours") if r % 2 == 0 else ("ours", "native")
        for mode in ("base", "kl"):
            for side in order:
                cmd = cmds[(mode, side)]
                if mode == "base":  # each writes a new file (no old one to truncate or replace)
                    files[side].unlink(missing_ok=True)
                else:  # each reads the other's file from the disk (not from the page cache)
                    evict(files[other[side]])
                run = quiet_run(
                    lambda: run_child(cmd, cwd=ROOT, env=env, timeout=args.run_timeout),  # noqa: B023
                    max_cores=args.max_foreign,
                    quiet_wait=args.quiet_wait,
                    retries=args.retries,
                    label=f"{mode} {side}",
                ).check()
                res[(mode, side)].append(sample(run))
                outputs[(mode, side)] = run.stdout + "\n" + run.stderr
            if mode == "base":
                same = filecmp.cmp(files["native"], files["ours"], shallow=False)
                ppl = {s: FINAL.search(outputs[("base", s)]) for s in order}
                if not same or not all(ppl.values()):
                    raise SystemExit(f"round {r + 1}: the base files differ or a run printed no final estimate")
            else:
                if kl_lines(outputs[("kl", "native")]) != kl_lines(outputs[("kl", "ours")]):
                    raise SystemExit(f"round {r + 1}: the KL lines differ")
        line = "  ".join(
            f"{mode} {side} {res[(mode, side)][-1]['wall_s']:.2f} s" for mode in ("base", "kl") for side in order
        )
        load = max(d[-1]["foreign_cores"] for d in res.values())
        print(f"round {r + 1}: {line}  (other load up to {load:.2f} cores)", flush=True)

    size = files["ours"].stat().st_size
    base_ppl = FINAL.search(outputs[("base", "ours")])
    kld = MEAN_KLD.search(outputs[("kl", "ours")])
    print()
    print(
        f"KL divergence over {args.chunks} chunks of {args.ctx_size} ({n_tokens} tokens), -b {args.batch_size} "
        f"-t {args.threads}, medians of {args.rounds} interleaved rounds; load average {os.getloadavg()[0]:.2f}"
    )
    print(f"base files: {size:,} bytes each, identical; {base_ppl.group(0) if base_ppl else ''}")
    print(f"kl (-ctk q8_0 against the f16 base): Mean KLD {kld.group(1) if kld else '?'}; lines identical")
    print(f"{'mode':6} {'llama-perplexity s':>19} {'ours s':>8} {'ratio':>6} {'RSS native':>11} {'RSS ours':>9}")
    summary: dict[str, Any] = {}
    for mode in ("base", "kl"):
        n = median([d["wall_s"] for d in res[(mode, "native")]])
        o = median([d["wall_s"] for d in res[(mode, "ours")]])
        rn = max(d["peak_rss_kib"] for d in res[(mode, "native")]) / 1024
        ro = max(d["peak_rss_kib"] for d in res[(mode, "ours")]) / 1024
        summary[mode] = {"native_wall_s": n, "ours_wall_s": o, "ratio": o / n, "native_rss_mib": rn, "ours_rss_mib": ro}
        print(f"{mode:6} {n:>19.2f} {o:>8.2f} {o / n:>6.3f} {rn:>7.0f} MiB {ro:>5.0f} MiB")
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "bench_kl_divergence",
                "command": command_line(sys.argv[1:] if argv is None else argv),
                "config": vars(args) | {"text": source, "n_tokens": n_tokens, "sha256": sha},
                "summary": summary,
                "samples": {f"{m}/{s}": v for (m, s), v in res.items()},
            },
        )
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
