"""``python -m llama_cffi`` (also the ``llama-cffi`` script): ``demo`` and ``info``.

User mistakes end with one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from . import LlamaError, Model, build_info, default_model_path, devices, system_info


def _model_path(arg: str | None) -> str:
    return arg if arg else str(default_model_path())


def cmd_demo(args: argparse.Namespace) -> int:
    """Load the default model, tokenize, greedy-generate, stream text, report tokens/s."""
    path = _model_path(args.model)
    t0 = time.perf_counter()
    with Model.load(path) as model:
        t_load = time.perf_counter() - t0
        print(
            f"model   {model.desc} ({model.n_params / 1e6:.0f}M params, vocab {model.n_vocab}) loaded in {t_load:.2f} s"
        )
        prompt = args.prompt
        tokens = model.tokenize(prompt)
        print(f"prompt  {prompt!r} -> {len(tokens)} tokens {tokens.tolist()}")
        with model.context(n_ctx=max(256, len(tokens) + args.n + 8)) as ctx:
            t1 = time.perf_counter()
            logits = ctx.decode(tokens)
            t_prompt = time.perf_counter() - t1
            stream = model.vocab.streaming_detokenizer()
            print("output  " + prompt, end="", flush=True)
            n_gen = 0
            t2 = time.perf_counter()
            for _ in range(args.n):
                tok = int(np.argmax(logits))
                if model.vocab.is_eog(tok):
                    break
                print(stream.push(tok), end="", flush=True)
                n_gen += 1
                logits = ctx.decode([tok])
            t_gen = time.perf_counter() - t2
            print(stream.flush())
    print(
        f"speed   prompt {len(tokens) / t_prompt:.0f} tokens/s, "
        f"generation {n_gen / t_gen if t_gen > 0 else 0.0:.1f} tokens/s (greedy, {n_gen} tokens)"
    )
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    """Build flags, devices, system info, and (with -m) a model's metadata."""
    out = {
        "build": build_info(),
        "system": system_info(),
        "devices": [d.__dict__ | {"type": d.type.name} for d in devices()],
    }
    if args.model is not None:
        with Model.load(_model_path(args.model or None), vocab_only=args.vocab_only) as m:
            out["model"] = {
                "path": m.path,
                "desc": m.desc,
                "n_params": m.n_params,
                "n_vocab": m.n_vocab,
                "n_ctx_train": m.n_ctx_train,
                "special_tokens": m.vocab.special_tokens(),
                "metadata": dict(m.metadata),
            }
    print(json.dumps(out, indent=2, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llama-cffi", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="generate with the default model and report tokens/s")
    p.add_argument("-m", "--model", help="GGUF file (default: the embedded default model)")
    p.add_argument("-n", type=int, default=48, help="tokens to generate (default 48)")
    p.add_argument("prompt", nargs="?", default="The three most useful things to know about Python are")
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("info", help="build flags, devices, and model metadata")
    p.add_argument("-m", "--model", nargs="?", const="", default=None, help="also describe a model")
    p.add_argument("--vocab-only", action="store_true", help="load only the vocabulary")
    p.set_defaults(func=cmd_info)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (LlamaError, OSError, ValueError) as exc:
        print(f"llama-cffi: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nllama-cffi: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
