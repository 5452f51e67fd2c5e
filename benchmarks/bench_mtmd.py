"""Image encode plus prefill: llama_cffi.mtmd against llama-mtmd-cli, the same projector,
image and prompt, in the same run.

The projector: a random-weight ``gemma3`` one of a realistic size (``--vision-layers``
SigLIP blocks of ``--vision-width``, a ``--image-size`` image in 14-pixel patches, pooled
4x4: 64 image tokens at the defaults), written with ``llama_cffi.testing``'s writer for
the default model's width (gemma-3-270m, 640). The image: llama.cpp's own
``tools/mtmd/test-1.jpeg``. The prompt: the model's chat-template turn around
``<__media__>describe`` (what llama-mtmd-cli builds from ``-p describe --image``), one
token generated greedily.

Each side is a whole process (start-up, both loads, the image decoded, encoded, the
prompt decoded, one token), interleaved over ``--rounds`` (which side goes first
alternates); medians and the ratios ours/native of the wall and CPU times. Ours goes through the
public path (``Projector.tokenize_chat`` of an OpenAI-style message with the image as a
``file://`` URL, then ``Projector.eval``) and also reports its wall time (image read and
preprocessed, encode, prefill). llama-mtmd-cli's own log figures (``mtmd batch encoding done in N ms``, ``prompt
eval time``) are kept in the JSON samples but not compared: on this machine their sum
exceeds the process's whole wall time (they overlap), so they do not measure the same
thing. Both sides must print the same token or the script fails.

    python benchmarks/bench_mtmd.py [--rounds 5] [--threads 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import llama_cffi  # noqa: E402
from benchmarks.common import command_line, median, quiet_run, run_child, write_json  # noqa: E402
from benchmarks.native_tools import build_llama_tool, llama_cpp_source_dir  # noqa: E402

ENCODE = re.compile(r"mtmd batch encoding done in (\d+) ms")
PROMPT = re.compile(r"prompt eval time = +([0-9.]+) ms")


def child(model_path: str, mmproj: str, image: str, threads: int) -> None:
    """Our side, in its own process: what llama-mtmd-cli does for one image and one token."""
    import numpy as np

    from llama_cffi.mtmd import Projector

    model = llama_cffi.Model.load(model_path)
    with Projector(model, mmproj, n_threads=threads) as p:
        # the public path: an OpenAI-style conversation, the image read from its file by
        # libmtmd's own decoder (stb_image, as llama-mtmd-cli reads it), the model's
        # template (Gemma's: the 270M file has none, and the family default is gemma)
        folder, name = os.path.split(os.path.abspath(image))
        parts = [{"type": "image_url", "image_url": {"url": "file:///" + name}}, {"type": "text", "text": "describe"}]
        with model.context(n_ctx=4096, n_batch=2048, n_ubatch=512, n_threads=threads, n_threads_batch=threads) as ctx:
            t0 = time.perf_counter()
            prompt, chunks = p.tokenize_chat([{"role": "user", "content": parts}], media_path=folder)
            with chunks:
                p.eval(ctx, chunks)
            ms = (time.perf_counter() - t0) * 1e3
            token = int(np.argmax(ctx.logits()))
        assert prompt.prompt.endswith("<start_of_turn>model\n"), prompt.prompt
    print(f"PIECE {model.vocab.token_to_piece(token).decode('utf-8', 'replace')!r}")
    print(f"ENCODE_PREFILL_MS {ms:.1f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vision-width", type=int, default=768)
    ap.add_argument("--vision-layers", type=int, default=12)
    ap.add_argument("--image-size", type=int, default=448)
    ap.add_argument("--quiet-wait", type=float, default=10.0)
    ap.add_argument("--max-foreign", type=float, default=0.3)
    ap.add_argument("--retries", type=int, default=1)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "MMPROJ", "IMAGE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(*args.child, args.threads)
        return 0

    from llama_cffi.testing import write_tiny_gemma3_mmproj

    model_path = llama_cffi.default_model_path()
    cli = build_llama_tool("llama-mtmd-cli")
    image = llama_cpp_source_dir() / "tools" / "mtmd" / "test-1.jpeg"
    tmp = tempfile.TemporaryDirectory()
    mmproj = Path(tmp.name) / "gemma3-medium.gguf"
    with llama_cffi.Model.load(model_path) as m:
        width = m.n_embd_inp
    side = args.image_size // 14
    write_tiny_gemma3_mmproj(
        mmproj,
        width,
        image_size=args.image_size,
        patch_size=14,
        tokens_per_side=side // 4,
        n_embd=args.vision_width,
        n_head=args.vision_width // 64,
        n_ff=4 * args.vision_width,
        n_layer=args.vision_layers,
    )
    t = str(args.threads)
    cmds = {
        "native": [str(cli), "-m", str(model_path), "--mmproj", str(mmproj), "--image", str(image),
                   "-p", "describe", "-n", "1", "--temp", "0", "-t", t, "-lv", "4",
                   "--chat-template", "gemma"],
        "ours": [sys.executable, str(Path(__file__).resolve()), "--threads", t, "--child",
                 str(model_path), str(mmproj), str(image)],
    }  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    mib = mmproj.stat().st_size / 2**20
    print(f"projector: gemma3, {args.vision_layers} layers of {args.vision_width}, {args.image_size}px in 14px patches")
    print(f"({side * side} patches, {(side // 4) ** 2} image tokens), {mib:.0f} MiB")
    for k, c in cmds.items():
        print(f"{k:6}: {' '.join(c)}")
    res: dict[str, list[dict[str, float]]] = {"native": [], "ours": []}
    tokens: dict[str, str] = {}
    for r in range(args.rounds):
        order = ("native", "ours") if r % 2 == 0 else ("ours", "native")
        for side_name in order:
            cmd = cmds[side_name]
            run = quiet_run(
                lambda: run_child(cmd, cwd=ROOT, env=env, timeout=900),  # noqa: B023
                max_cores=args.max_foreign,
                quiet_wait=args.quiet_wait,
                retries=args.retries,
                label=side_name,
            ).check()
            if side_name == "native":
                enc, pre = ENCODE.search(run.stderr), PROMPT.search(run.stderr)
                inner = float(enc.group(1)) + float(pre.group(1)) if enc and pre else float("nan")
                tokens[side_name] = repr(run.stdout.strip("\n"))
            else:
                m1 = re.search(r"ENCODE_PREFILL_MS ([0-9.]+)", run.stdout)
                inner = float(m1.group(1)) if m1 else float("nan")
                m2 = re.search(r"^PIECE (.*)$", run.stdout, re.M)
                tokens[side_name] = m2.group(1) if m2 else "?"
            res[side_name].append(
                {"wall_s": run.wall_s, "cpu_s": run.user_s + run.sys_s, "inner_ms": inner, "foreign": run.foreign_cores}
            )
        line = "  ".join(f"{s} {res[s][-1]['wall_s']:.2f} s ({res[s][-1]['inner_ms']:.0f} ms)" for s in order)
        print(f"round {r + 1}: {line}", flush=True)
    if tokens.get("native", "").strip() != tokens.get("ours", "").strip():
        raise SystemExit(f"the first tokens differ: native {tokens.get('native')!r}, ours {tokens.get('ours')!r}")
    summary: dict[str, Any] = {}
    print(f"first token (both): {tokens['ours']!r}")
    print(f"{'measure':28} {'llama-mtmd-cli':>14} {'ours':>10} {'ours/native':>12}")
    for key, label in (("wall_s", "whole process, s"), ("cpu_s", "CPU time, s")):
        n = median([d[key] for d in res["native"]])
        o = median([d[key] for d in res["ours"]])
        summary[key] = {"native": n, "ours": o, "ratio": o / n}
        print(f"{label:28} {n:>14.2f} {o:>10.2f} {o / n:>12.3f}")
    inner = median([d["inner_ms"] for d in res["ours"]])
    print(f"ours, Projector.tokenize_chat + eval (image read, encode, prompt prefill): {inner:.0f} ms (median)")
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "bench_mtmd",
                "command": command_line(sys.argv[1:] if argv is None else argv),
                "config": {k: v for k, v in vars(args).items() if k != "json"},
                "summary": summary,
                "samples": res,
            },
        )
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
