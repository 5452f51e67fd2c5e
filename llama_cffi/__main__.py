"""``python -m llama_cffi`` (also the ``llama-cffi`` script): ``info``, ``tokenize``, and plugin commands
(``demo``, ``generate``, ``perplexity`` come from :mod:`samplers` through entry points).

User mistakes end with one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import entry_points
from typing import NoReturn, cast

from . import LlamaError, Model, build_info, default_model_path, devices, system_info


def _model_path(arg: str | None) -> str:
    return arg if arg else str(default_model_path())


def cmd_tokenize(args: argparse.Namespace) -> int:
    """Print the tokens of a text: one ``id<TAB>piece`` line each (``--ids``: ids only)."""
    text = args.text if args.text is not None else sys.stdin.read()
    with Model.load(_model_path(args.model), vocab_only=True) as model:
        vocab = model.vocab
        toks = vocab.tokenize(text, add_special=not args.no_bos, parse_special=args.parse_special)
        if args.ids:
            print(json.dumps([int(t) for t in toks]))
        else:
            for t in toks:
                print(f"{int(t)}\t{vocab.token_to_piece(int(t), special=True)!r}")
        print(f"{len(toks)} tokens", file=sys.stderr)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmark suite (:mod:`llama_cffi.bench`) with the remaining arguments."""
    from .bench import main as bench_main

    return bench_main(args.suite_args)


def cmd_rpc_server(args: argparse.Namespace) -> int:
    from .rpc import serve

    serve(args.host, args.port, n_threads=args.threads, cache_dir=args.cache)
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
    "samplers.cli:register_perplexity"``): each entry point names a callable
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


class _Parser(argparse.ArgumentParser):
    """Usage mistakes end as one line too (argparse prints the usage block first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"llama-cffi: error: {message} (see {self.prog} --help)\n")


def _parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]]:
    """The parser with the built-in commands, and its subcommand action (plugins not loaded)."""
    parser = _Parser(prog="llama-cffi", description=__doc__)
    # subcommand parsers are _Parser too (one-line usage errors)
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]", parser.add_subparsers(dest="command", required=True)
    )
    p = sub.add_parser(
        "bench",
        help="run the benchmark suite against native llama.cpp: a JSON and Markdown report (and plots)",
        description="Runs the benchmark suite, the source tree's or the copy the installed package carries "
        "(arguments are passed on: --full, --only NAME, --list, --out-dir DIR ...; --help lists them).",
        add_help=False,
    )
    p.add_argument("suite_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("tokenize", help="the tokens of a text (from the argument or stdin)")
    p.add_argument("text", nargs="?", default=None, help="the text (default: read stdin)")
    p.add_argument("-m", "--model", help="GGUF file (default: the embedded default model)")
    p.add_argument("--ids", action="store_true", help="print a JSON list of ids only")
    p.add_argument("--no-bos", action="store_true", help="do not add BOS/EOS as the model would")
    p.add_argument("--parse-special", action="store_true", help="parse special tokens like <start_of_turn>")
    p.set_defaults(func=cmd_tokenize)
    p = sub.add_parser(
        "rpc-server",
        help="serve this CPU to clients as an RPC worker (no authentication: loopback or private networks only)",
        description=(
            "Runs llama.cpp's RPC server from this build. Clients load models with "
            "Model.load(path, rpc_servers=['HOST:PORT']). The protocol has no authentication or "
            "encryption: bind to 127.0.0.1 or a private network you trust."
        ),
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=50052, help="port (default 50052)")
    p.add_argument("-t", "--threads", type=int, default=0, help="CPU threads (default: all)")
    p.add_argument("--cache", default=None, help="directory for the tensor cache (faster model reloads)")
    p.set_defaults(func=cmd_rpc_server)
    p = sub.add_parser("info", help="build flags, devices, and model metadata")
    p.add_argument("-m", "--model", nargs="?", const="", default=None, help="also describe a model")
    p.add_argument("--vocab-only", action="store_true", help="load only the vocabulary")
    p.set_defaults(func=cmd_info)
    return parser, sub


def build_parser() -> argparse.ArgumentParser:
    """The whole ``llama-cffi`` parser: built-in commands and every installed plugin command
    (what ``llama-cffi --help`` shows; ``docs/generate.py`` writes the CLI reference from it)."""
    parser, sub = _parser()
    load_plugins(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser, sub = _parser()
    # plugins load only when the command is not a built-in one (or for --help): the
    # built-in commands never import a plugin package, and a broken plugin cannot affect them
    words = sys.argv[1:] if argv is None else argv
    command = next((w for w in words if not w.startswith("-")), None)
    if command not in sub.choices:
        load_plugins(sub)
    if words and words[0] == "bench":
        # everything after it goes to the suite as is (argparse would reorder options)
        args = argparse.Namespace(command="bench", func=cmd_bench, suite_args=list(words[1:]))
    else:
        args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (LlamaError, OSError, ValueError) as exc:
        # one line, even for multi-line messages (a schema's list of problems, say)
        msg = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
        print(f"llama-cffi: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nllama-cffi: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
