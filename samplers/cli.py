"""``llama-cffi generate``, ``demo`` and ``perplexity``: the command-line face of the toolkit.

Registered as ``llama_cffi.commands`` plugins (see :func:`llama_cffi.__main__.load_plugins`):
``llama_cffi`` itself never imports ``samplers``. Generated text goes to stdout as it
is produced; statistics and progress go to stderr. User mistakes (a missing file, a
bad grammar or schema, a bad option value) raise :class:`~llama_cffi.LlamaError`,
``OSError`` or ``ValueError``, which the CLI prints as one line (exit status 2).

Sampling options, defaults and order are llama.cpp's (``common_params_sampling``, through
:class:`~samplers.params.SamplingParams`): top-k 40, top-p 0.95, min-p 0.05, temperature
0.8, in llama.cpp's order (penalties, DRY, top-n-sigma, top-k, typical, top-p, min-p, XTC,
temperature, then a seeded draw); ``--temp 0`` is greedy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from llama_cffi import Context, Model, default_model_path
from llama_cffi._args import expect_namespace, expect_subparsers
from llama_cffi.errors import ParamError
from llama_cffi.progress import ProgressBar

from .branch import Branch, BranchStore
from .chain import SamplerChain
from .grammar import Grammar
from .params import SamplingParams
from .search import run_together, stream
from .selection import Dist
from .speculative import Drafter, DraftModel, PromptLookup, SpeculativeStats
from .temperature import Temperature
from .truncation import TopK, TopP

__all__ = ["build_chain", "register_demo", "register_generate", "register_perplexity"]


def load_model(path: str | None, quiet: bool = False) -> Model:
    """The model at ``path`` (default: the embedded default model), with a progress bar
    on a terminal's stderr."""
    p = path if path else str(default_model_path())
    with ProgressBar("loading", force=False) as bar:
        if quiet:
            bar.enabled = False
        return Model.load(p, progress_callback=bar.callback)


# ---------------------------------------------------------------------- sampler options
def build_chain(args: argparse.Namespace, model: Model | None = None) -> SamplerChain:
    """The sampler chain the options describe: :class:`~samplers.params.SamplingParams`
    read from them (llama.cpp's options, defaults and order), as a chain of this package's
    samplers."""
    expect_namespace("args", args)
    return SamplingParams.from_args(args).to_chain(model)


def read_grammar(args: argparse.Namespace) -> Grammar | None:
    """The ``--grammar`` (GBNF file) or ``--json-schema`` (JSON file) constraint, parsed."""
    if args.grammar and args.json_schema:
        raise ParamError("give --grammar or --json-schema, not both")
    if args.grammar:
        return Grammar.from_gbnf(Path(args.grammar).read_text(encoding="utf-8"))
    if args.json_schema:
        try:
            schema = json.loads(Path(args.json_schema).read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ParamError(f"{args.json_schema} is not JSON: {exc}") from None
        return Grammar.from_json_schema(schema)
    return None


# ---------------------------------------------------------------------- generate
def _context(model: Model, n_ctx: int, n_seq: int, threads: int | None) -> Context:
    kw: dict[str, Any] = {"n_ctx": n_ctx, "n_batch": min(n_ctx, 2048), "n_seq_max": n_seq, "kv_unified": True}
    if threads:
        kw["n_threads"] = kw["n_threads_batch"] = threads
    return model.context(**kw)


def make_drafter(args: argparse.Namespace, target: Model, stack: ExitStack) -> Drafter | None:
    """The ``--lookup`` / ``--draft-model`` drafter (None: plain decoding)."""
    if args.draft_max < 1:
        raise ParamError(f"--draft-max must be >= 1, not {args.draft_max}")
    if args.lookup and args.draft_model:
        raise ParamError("give --lookup or --draft-model, not both")
    if args.lookup:
        return PromptLookup(max_draft=args.draft_max)
    if args.draft_model:
        draft = stack.enter_context(load_model(args.draft_model, quiet=True))
        n_seq = args.branches if args.branches > 1 else 1
        kw: dict[str, Any] = {"n_seq_max": n_seq, "kv_unified": True}
        if args.threads:
            kw["n_threads"] = kw["n_threads_batch"] = args.threads
        d = DraftModel(draft, max_draft=args.draft_max, p_min=args.draft_p_min, n_ctx=args.ctx_size or 4096, **kw)
        stack.callback(d.close)
        d.bind(target)
        return d
    return None


def cmd_generate(args: argparse.Namespace) -> int:
    if args.n < 1:
        raise ParamError(f"-n must be >= 1, not {args.n}")
    if args.branches < 1:
        raise ParamError(f"--branches must be >= 1, not {args.branches}")
    grammar = read_grammar(args)
    params = SamplingParams.from_args(args)  # checked before the model loads
    model = load_model(args.model)
    with model, ExitStack() as stack:
        chain = params.to_chain(model)
        drafter = make_drafter(args, model, stack)
        vocab = model.vocab
        prompt = [int(t) for t in vocab.tokenize(args.prompt)]
        n_ctx = args.ctx_size or max(512, len(prompt) + args.n + 8)
        n_seq = args.branches + 1 if args.branches > 1 else 1
        with _context(model, n_ctx, n_seq, args.threads) as ctx:
            store = BranchStore(ctx)
            t0 = time.perf_counter()
            root = store.create(prompt, sampler=chain, grammar=grammar, seed=args.seed)
            t_prompt = time.perf_counter() - t0
            t1 = time.perf_counter()
            drafters: dict[Branch, Drafter] = {}
            if args.branches == 1:
                sys.stdout.write(args.prompt)
                if drafter is not None:
                    drafters[root] = drafter
                for piece in stream(root, args.n, stop=args.stop, drafter=drafter):
                    sys.stdout.write(piece)
                    sys.stdout.flush()
                sys.stdout.write("\n")
                n_gen = root.position - len(prompt)
            else:
                base = args.seed if args.seed is not None else int(time.time_ns() % 2**31)
                kids = [root.fork(seed=base + i) for i in range(args.branches)]
                if drafter is not None:
                    drafters = {k: drafter.clone() for k in kids}
                n_gen = run_together(store, kids, args.n, drafters or None)
                best = min(kids, key=lambda b: b.perplexity)
                for i, b in enumerate(kids):
                    text = vocab.detokenize([t for t in b.tokens[len(prompt) :] if not vocab.is_eog(t)])
                    mark = "*" if b is best else " "
                    print(f"{mark} branch {i}  perplexity {b.perplexity:8.3f}  {args.prompt}{text!s}")
                print(f"* best of {args.branches} by perplexity: branch {kids.index(best)}", file=sys.stderr)
            t_gen = time.perf_counter() - t1
            store.drain()
            spec = SpeculativeStats()
            for d in drafters.values():
                for k in ("decodes", "drafted", "accepted", "committed", "draft_seconds"):
                    setattr(spec, k, getattr(spec, k) + getattr(d.stats, k))
    print(
        f"{n_gen} tokens in {t_gen:.2f} s: {n_gen / t_gen if t_gen > 0 else 0.0:.1f} tokens/s "
        f"(prompt {len(prompt)} tokens, {len(prompt) / t_prompt:.0f} tokens/s)",
        file=sys.stderr,
    )
    if drafters:
        print(f"speculative: {spec}", file=sys.stderr)
    return 0


def register_generate(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Entry point of the ``llama_cffi.commands`` plugin group: adds ``generate``."""
    expect_subparsers("subparsers", subparsers)
    p = subparsers.add_parser(
        "generate",
        help="generate text: sampling options, --grammar, --json-schema, --branches N",
        description="Stream a continuation of PROMPT; with --branches N, sample N forks of the prompt "
        "together and show each with its perplexity (best of N).",
    )
    p.add_argument("prompt", help="the text to continue")
    p.add_argument("-m", "--model", help="GGUF file (default: the embedded default model)")
    p.add_argument("-n", type=int, default=128, help="maximum tokens to generate (default 128)")
    p.add_argument("-c", "--ctx-size", type=int, default=0, help="context size (default: what the run needs)")
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("--grammar", metavar="FILE", help="GBNF grammar file the output must match")
    p.add_argument("--json-schema", metavar="FILE", help="JSON schema file the output must satisfy")
    p.add_argument("--branches", type=int, default=1, help="sample N branches together, best of N")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g = p.add_argument_group("speculative decoding (the output is the same as without it)")
    g.add_argument("--lookup", action="store_true", help="draft by n-gram lookup in the prompt and the text so far")
    g.add_argument("--draft-model", metavar="FILE", help="draft with this smaller GGUF model (same vocabulary)")
    g.add_argument("--draft-max", type=int, default=8, help="most tokens drafted per decode (default 8)")
    g.add_argument("--draft-p-min", type=float, default=0.0, help="draft model: stop below this probability (0)")
    SamplingParams.add_arguments(p)
    p.set_defaults(func=cmd_generate)


# ---------------------------------------------------------------------- demo
DEMO_PROMPT = "The three most useful things to know about Python are"
DEMO_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"language": {"type": "string", "maxLength": 20}, "year": {"type": "integer"}},
    "required": ["language", "year"],
}


def cmd_demo(args: argparse.Namespace) -> int:
    """The mission in one screen: forked branches with perplexities, a pruned one, a
    JSON-schema-constrained answer, tokens/s."""
    t0 = time.perf_counter()
    model = load_model(args.model)
    with model:
        vocab = model.vocab
        print(
            f"model    {model.desc} ({model.n_params / 1e6:.0f}M params, vocab {model.n_vocab}) "
            f"loaded in {time.perf_counter() - t0:.2f} s"
        )
        prompt = [int(t) for t in vocab.tokenize(args.prompt)]
        with _context(model, max(512, len(prompt) + 2 * args.n + 64), 6, args.threads) as ctx:
            store = BranchStore(ctx)
            # 1. greedy streaming on one branch
            root = store.create(prompt)
            print(f"prompt   {args.prompt!r} ({len(prompt)} tokens)")
            print("greedy   " + args.prompt, end="", flush=True)
            greedy = root.fork()
            t1 = time.perf_counter()
            for piece in stream(greedy, args.n):
                print(piece, end="", flush=True)
            t_greedy = time.perf_counter() - t1
            n_greedy = greedy.position - len(prompt)
            print()
            greedy.prune()
            # 2. four forks of the prompt, sampled together (one llama_decode per step)
            root.sampler = SamplerChain([TopK(40), TopP(0.95), Temperature(0.8), Dist(0)])
            kids = [root.fork(seed=args.seed + i) for i in range(4)]
            t2 = time.perf_counter()
            n_batched = run_together(store, kids, args.n)
            t_batched = time.perf_counter() - t2
            print(f"branches 4 forks of the prompt, advanced together ({n_batched} tokens, one decode per step):")
            for i, b in enumerate(kids):
                text = vocab.detokenize([t for t in b.tokens[len(prompt) :] if not vocab.is_eog(t)])
                text = " ".join(text.split())
                print(f"  [{i}] perplexity {b.perplexity:7.2f}  entropy {b.entropy:5.2f}  ...{text[:60]!s}")
            worst = max(kids, key=lambda b: b.perplexity)
            i_worst = kids.index(worst)
            worst.prune()
            kv = store.kv()
            print(
                f"pruned   [{i_worst}] (highest perplexity): {len(store) - 1} forks and the root live, "
                f"{kv['positions']} KV positions, {store.available} sequence ids free"
            )
            store.drain()
            # 3. an answer constrained by a JSON schema
            q = "Q: Which programming language did Guido van Rossum create, and in which year?\nA (JSON): "
            qb = store.create(vocab.tokenize(q), grammar=Grammar.from_json_schema(DEMO_SCHEMA))
            t3 = time.perf_counter()
            answer = "".join(stream(qb, 64))
            t_json = time.perf_counter() - t3
            n_json = qb.position - len(vocab.tokenize(q))
            store.drain()
            try:
                keys = f"valid JSON, keys {sorted(json.loads(answer))}"
            except ValueError:
                keys = "not finished in 64 tokens"
            print(f"json     {answer}  ({keys})")
    print(
        f"speed    greedy {n_greedy / t_greedy:.1f} tokens/s; 4 branches {n_batched / t_batched:.1f} tokens/s "
        f"in total ({n_batched / t_batched / max(n_greedy / t_greedy, 1e-9):.2f}x one branch); "
        f"constrained {n_json / t_json:.1f} tokens/s"
    )
    return 0


def register_demo(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Entry point of the ``llama_cffi.commands`` plugin group: adds ``demo``."""
    expect_subparsers("subparsers", subparsers)
    p = subparsers.add_parser("demo", help="the README's demo: branches, perplexity, a JSON-schema answer, tokens/s")
    p.add_argument("-m", "--model", help="GGUF file (default: the embedded default model)")
    p.add_argument("-n", type=int, default=32, help="tokens per branch (default 32)")
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("prompt", nargs="?", default=DEMO_PROMPT)
    p.set_defaults(func=cmd_demo)


# ---------------------------------------------------------------------- perplexity
def register_perplexity(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Entry point of the ``llama_cffi.commands`` plugin group: adds ``perplexity``, the
    command of :mod:`samplers.perplexity` with ``--ray`` and ``--workers`` from the
    optional :mod:`samplers.distributed` (which imports ``ray`` only when a pool is made).
    The front end composes the two: the core never imports the optional layer."""
    expect_subparsers("subparsers", subparsers)
    from . import distributed, perplexity

    parser = subparsers.add_parser(
        "perplexity",
        help="corpus perplexity, computed as llama.cpp's llama-perplexity does",
        description="Corpus perplexity, computed as llama.cpp's llama-perplexity does.",
    )
    perplexity.add_arguments(parser)
    distributed.add_cli_arguments(parser)
    parser.set_defaults(func=lambda args: perplexity.run_cli(args, distributed.cli_scoring(args)))
