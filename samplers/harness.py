"""An lm-evaluation-harness backend (the ``lm-eval`` package, the ``[eval]`` extra).

:class:`HarnessBackend` answers lm-eval's three request types over one loaded model:

* ``loglikelihood`` (``(context, continuation)``): :func:`samplers.logprobs.score_many`,
  each distinct context decoded once for all its continuations; returns
  ``(log-probability, is_greedy)``;
* ``loglikelihood_rolling`` (``(text,)``): the text's log-probability from BOS, in
  windows of the context's ``n_ctx`` (lm-eval's ``get_rolling_token_windows`` with a
  context of one token, made disjoint), every window a pair of ``score_many``;
* ``generate_until`` (``(context, gen_kwargs)``): :func:`samplers.many.generate_many`,
  every request a :class:`~samplers.many.Request` with its ``until`` strings,
  ``max_gen_toks`` (default 256) and sampling (greedy unless ``do_sample`` with a
  ``temperature`` above 0).

Tokenization follows lm-eval's Hugging Face backend: a context with BOS, the
continuation as the tokens the whole ``context + continuation`` adds after the context's
(a context's trailing spaces moved to the continuation), an empty context as BOS alone;
inputs longer than the context are cut on the left.

:func:`register` makes the lm-eval model class (``LlamaCffiLM``, under the name
``llama-cffi``). lm-eval 0.4 has no plugin mechanism for models, so the installed package
adds one: a start-up hook (``llama_cffi-lm-eval.pth`` importing a copy of
:mod:`samplers._lm_eval_hook`)
puts ``llama-cffi`` into lm-eval's registry, as a lazy ``samplers.harness:LlamaCffiLM``,
whenever lm-eval loads its models; lm-eval's own command then finds it::

    lm_eval --model llama-cffi --model_args model=PATH.gguf,n_ctx=2048 --tasks TASK

``llama-cffi lm-eval ARGS`` (or ``python -m samplers.harness ARGS``) is the same command
with the model registered here, for a Python where the hook is off
(``LLAMA_CFFI_LM_EVAL_HOOK=0``) or not installed (the tree on ``PYTHONPATH``).

This module imports ``lm_eval`` only in :func:`register`, :func:`main` and when its
``LlamaCffiLM`` attribute is read (which registers the class).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from llama_cffi import Model, ParamError, default_model_path
from llama_cffi._args import expect_int, expect_strs, expect_subparsers, type_error
from llama_cffi.errors import UnsupportedError

from .branch import BranchStore
from .chain import SamplerChain
from .logprobs import score_many
from .many import Request, generate_many
from .selection import Dist
from .temperature import Temperature

__all__ = ["HarnessBackend", "main", "register", "register_command"]

_REGISTERED: type | None = None


def _rolling_windows(tokens: list[int], prefix: int, max_len: int) -> list[tuple[list[int], list[int]]]:
    """lm-eval's ``get_rolling_token_windows(tokens, prefix, max_len, context_len=1)`` made
    disjoint (``make_disjoint_window``): (context, continuation) pairs that predict every
    token once, each with as much context as fits."""
    out: list[tuple[list[int], list[int]]] = []
    if not tokens:
        return out
    pred_len = max_len - 1 + 1
    predicted = 0
    first = min(max_len, len(tokens))
    out.append(([prefix, *tokens[: first - 1]], tokens[:first]))
    predicted += first
    while predicted < len(tokens):
        window_pred_len = min(len(tokens) - predicted, pred_len)
        window_end = predicted + window_pred_len
        out.append(
            (tokens[window_end - max_len - 1 : window_end - 1], tokens[window_end - window_pred_len : window_end])
        )
        predicted += window_pred_len
    return [(a[: len(a) - (len(b) - 1)], b) for a, b in out]


class HarnessBackend:
    """lm-eval's three request types over one model (see the module docstring).

    ``model``: a GGUF path (default: the default model); ``n_ctx``: tokens a sequence
    holds (the longest input; longer ones are cut on the left); ``n_parallel``: sequences
    scored or generated at once; ``n_batch``, ``n_threads``: the context's; ``seed``: the
    sampled requests' seed. lm-eval's ``batch_size``, ``max_batch_size`` and ``device``
    are accepted and not used (the batching is ``n_parallel`` and ``n_batch``)."""

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        n_ctx: int = 2048,
        n_parallel: int = 8,
        n_batch: int = 512,
        n_threads: int | None = None,
        seed: int = 1234,
        batch_size: Any = None,
        max_batch_size: Any = None,
        device: Any = None,
    ) -> None:
        del batch_size, max_batch_size, device
        if model is not None and not isinstance(model, (str, os.PathLike)):
            raise type_error("model", "a GGUF path (str or os.PathLike) or None", model)
        n_ctx, n_parallel, n_batch = (
            expect_int(k, v) for k, v in (("n_ctx", n_ctx), ("n_parallel", n_parallel), ("n_batch", n_batch))
        )
        if n_parallel < 1 or n_ctx < 8:
            raise ParamError(f"need n_parallel >= 1 and n_ctx >= 8, not {n_parallel} and {n_ctx}")
        self.seed = expect_int("seed", seed)
        self.model = Model.load(str(model) if model else str(default_model_path()))
        params: dict[str, Any] = {
            "n_ctx": n_ctx * n_parallel,
            "n_seq_max": n_parallel,
            "n_batch": max(n_batch, n_parallel),
            "kv_unified": True,
        }
        if n_threads is not None:
            params["n_threads"] = params["n_threads_batch"] = expect_int("n_threads", n_threads)
        self.ctx = self.model.context(**params)
        self.store = BranchStore(self.ctx)
        self.max_length = min(n_ctx, self.ctx.n_ctx_seq)
        vocab = self.model.vocab
        prefix = vocab.bos if vocab.bos is not None else vocab.eos
        if prefix is None:
            raise ParamError("the model has neither BOS nor EOS: no token to start a text from")
        self.prefix_token_id = int(prefix)

    # ------------------------------------------------------------------ tokens
    def _encode(self, text: str, bos: bool) -> list[int]:
        return [int(t) for t in self.model.vocab.tokenize(text, add_special=bos)]

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        if not context:
            return [self.prefix_token_id], self._encode(continuation, False)
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            continuation = context[-n_spaces:] + continuation
            context = context[:-n_spaces]
        whole = self._encode(context + continuation, True)
        ctx_enc = self._encode(context, True)
        return ctx_enc, whole[len(ctx_enc) :]

    def _fit(self, ctx_enc: list[int], cont: list[int]) -> tuple[list[int], list[int]]:
        """Cut on the left to ``max_length`` positions (lm-eval's ``[-(max_length + 1):]``)."""
        if not cont:
            raise ParamError("a continuation with no tokens")
        if len(cont) > self.max_length:
            raise ParamError(f"a continuation of {len(cont)} tokens is longer than n_ctx={self.max_length}")
        whole = (ctx_enc + cont)[-(self.max_length + 1) :]
        return whole[: len(whole) - len(cont)], cont

    # ------------------------------------------------------------------ requests
    def loglikelihood(self, requests: Sequence[Any]) -> list[tuple[float, bool]]:
        """``(log-probability in nats, is_greedy)`` per ``(context, continuation)``."""
        requests = _requests(requests)
        pairs = [self._fit(*self._encode_pair(*_args(r, 2))) for r in requests]
        scores = score_many(self.store, pairs)
        return [(s.total, s.greedy) for s in scores]

    def loglikelihood_rolling(self, requests: Sequence[Any]) -> list[float]:
        """Each text's log-probability in nats, from the BOS token on."""
        spans: list[tuple[int, int]] = []
        pairs: list[tuple[list[int], list[int]]] = []
        for r in _requests(requests):
            (text,) = _args(r, 1)
            windows = _rolling_windows(self._encode(text, False), self.prefix_token_id, self.max_length)
            spans.append((len(pairs), len(pairs) + len(windows)))
            pairs += windows
        scores = score_many(self.store, pairs) if pairs else []
        return [sum(s.total for s in scores[a:b]) for a, b in spans]

    def generate_until(self, requests: Sequence[Any]) -> list[str]:
        """Each request's generated text, cut at the first of its ``until`` strings."""
        reqs = []
        for r in _requests(requests):
            context, kwargs = _args(r, 2)
            kwargs = dict(kwargs or {})
            until = kwargs.pop("until", None) or []
            if isinstance(until, str):
                until = [until]
            max_gen = int(kwargs.pop("max_gen_toks", 256))
            temperature = float(kwargs.pop("temperature", 0.0) or 0.0)
            sample = bool(kwargs.pop("do_sample", False)) and temperature > 0
            sampler = SamplerChain([Temperature(temperature), Dist(self.seed)]) if sample else None
            toks = self._encode(context, True)
            keep = max(self.max_length - max_gen, 1)
            reqs.append(Request(toks[-keep:], max_tokens=max_gen, stop=list(until), sampler=sampler, seed=self.seed))
        return [r.text for r in generate_many(self.store, reqs)] if reqs else []

    @property
    def tokenizer_name(self) -> str:
        return str(self.model.path)

    def close(self) -> None:
        self.store.drain()
        self.ctx.close()
        self.model.close()


def _requests(requests: object) -> list[Any]:
    if isinstance(requests, (str, bytes)) or not isinstance(requests, Iterable):
        raise type_error("requests", "a list of lm-eval Instances (or objects with .args)", requests)
    return list(requests)


def _args(request: Any, n: int) -> tuple[Any, ...]:
    args = getattr(request, "args", request)
    if not isinstance(args, tuple) or len(args) != n:
        raise ParamError(f"an lm-eval request with {n} arguments was expected, not {args!r}")
    return args


def register() -> type:
    """The lm-eval model class (``HarnessBackend`` and lm-eval's ``LM``), registered as
    ``llama-cffi`` (once per process). Needs the ``lm-eval`` package (the ``[eval]``
    extra)."""
    global _REGISTERED
    if _REGISTERED is not None:
        return _REGISTERED
    try:
        from lm_eval.api.model import LM
        from lm_eval.api.registry import register_model
    except ImportError as e:
        raise ImportError("the lm-eval backend needs the lm-eval package: pip install 'llama-cffi[eval]'") from e

    class LlamaCffiLM(HarnessBackend, LM):  # type: ignore[misc]
        """lm-evaluation-harness's model ``llama-cffi`` (see :mod:`samplers.harness`)."""

        def __init__(self, **kwargs: Any) -> None:
            LM.__init__(self)
            HarnessBackend.__init__(self, **kwargs)

    register_model("llama-cffi")(LlamaCffiLM)
    _REGISTERED = LlamaCffiLM
    return LlamaCffiLM


def __getattr__(name: str) -> Any:
    """``LlamaCffiLM``: the registered class (:func:`register`), made on first use; the
    target of the placeholder the start-up hook gives lm-eval."""
    if name == "LlamaCffiLM":
        return register()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None) -> int:
    """lm-eval's command (``lm_eval ...``, the same arguments) with ``llama-cffi``
    registered."""
    if argv is not None:
        expect_strs("argv", argv, "a list of str or None")
    register()
    from lm_eval.__main__ import cli_evaluate

    saved = sys.argv
    sys.argv = ["lm_eval", *(sys.argv[1:] if argv is None else argv)]
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
    return 0


def register_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``llama-cffi lm-eval ARGS``: lm-eval's command with ``llama-cffi`` registered."""
    expect_subparsers("subparsers", subparsers)
    p = subparsers.add_parser(
        "lm-eval",
        help="lm-evaluation-harness with --model llama-cffi (needs the [eval] extra)",
        add_help=False,
        prefix_chars="\x00",  # every argument, options included, goes to lm-eval as it is
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help="lm_eval's arguments")
    p.set_defaults(func=_command)


def _command(args: argparse.Namespace) -> int:
    try:
        register()
    except ImportError as e:  # a user error on the command line: one line, exit status 2
        raise UnsupportedError(str(e)) from None
    return main(list(args.args))


if __name__ == "__main__":
    sys.exit(main())
