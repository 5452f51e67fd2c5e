"""``python -m llama_cffi`` (also the ``llama-cffi`` script): ``demo``, ``info``, and plugin commands.

User mistakes end with one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from importlib.metadata import entry_points

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


#: Entry-point group of plugin subcommands (see :func:`load_plugins`).
PLUGIN_GROUP = "llama_cffi.commands"


def load_plugins(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> list[str]:
    """Let every ``llama_cffi.commands`` entry point register its subcommand; returns the
    names that loaded.

    Other packages add subcommands through that entry-point group (e.g. ``perplexity =
    "samplers.perplexity:register_cli"``): each entry point names a callable
    ``register(subparsers) -> None`` that adds its subparser with ``set_defaults(func=f)``,
    where ``f(args) -> int`` returns the exit status and raises
    :class:`~llama_cffi.LlamaError`, ``OSError`` or ``ValueError`` for user errors (one
    line on stderr, exit status 2). A failing plugin (import error, exception in
    ``register``, a name already taken) is reported on stderr and skipped. :func:`main`
    loads plugins only for a command that is not built in (and for ``--help``), so the
    built-in commands neither import nor depend on any plugin."""
    loaded: list[str] = []
    try:
        eps = list(entry_points(group=PLUGIN_GROUP))
    except Exception as exc:  # broken metadata of some installed distribution
        print(f"llama-cffi: warning: cannot list {PLUGIN_GROUP} plugins: {exc}", file=sys.stderr)
        return loaded
    for ep in eps:
        if ep.name in sub.choices:
            if ep.name not in loaded:
                print(
                    f"llama-cffi: warning: plugin command {ep.name!r} ({ep.value}) is already defined; skipped",
                    file=sys.stderr,
                )
            continue
        try:
            register = ep.load()
            register(sub)
        except Exception as exc:
            sub.choices.pop(ep.name, None)  # in case it registered before failing
            print(
                f"llama-cffi: warning: plugin command {ep.name!r} ({ep.value}) failed to load: "
                f"{type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
            continue
        loaded.append(ep.name)
    return loaded


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
    # plugins load only when the command is not a built-in one (or for --help): the
    # built-in commands never import a plugin package, and a broken plugin cannot affect them
    words = sys.argv[1:] if argv is None else argv
    command = next((w for w in words if not w.startswith("-")), None)
    if command not in sub.choices:
        load_plugins(sub)
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
