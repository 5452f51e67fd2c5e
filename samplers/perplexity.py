"""Corpus perplexity, computed exactly as llama.cpp's ``llama-perplexity`` computes it.

The method (``tools/perplexity/perplexity.cpp``, ``perplexity()``, pinned commit):

* the text is tokenized with ``add_special=True, parse_special=False`` (the CLI reads
  the file as bytes and strips one trailing ``\\n``, like ``-f``); it must hold at
  least ``2 * n_ctx`` tokens;
* it is cut into ``len(tokens) // n_ctx`` chunks of ``n_ctx`` tokens (``n_chunks``
  caps that); each chunk is evaluated from an empty KV memory, with its first token
  replaced by BOS when the vocabulary adds BOS;
* ``n_seq = max(1, n_batch // n_ctx)`` chunks are decoded at once, as separate
  sequences of one batch; when ``n_batch < n_ctx`` each chunk takes several decodes;
* only positions ``>= n_ctx // 2`` produce logits; the tokens at positions
  ``n_ctx // 2 + 1 .. n_ctx - 1`` of each chunk are scored (the first half is context);
* each score is ``-log_softmax`` computed like ``log_softmax()`` there (max subtracted,
  ``exp`` in float32, the sum in float64), accumulated as ``nll`` and ``nll2`` (sum of
  squares) in float64;
* after each chunk the running estimate ``exp(nll / count)``; at the end
  ``PPL = exp(nll / count)`` and ``stderr = PPL * sqrt((mean(nll2) - mean(nll)^2) / (count - 1))``.

A context created here is sized as ``llama-perplexity`` sizes its own:
``n_ctx = n_seq * n_ctx`` cells, ``n_batch = min(n_batch, n_seq * n_ctx)``,
``n_seq_max = n_seq``, ``n_ubatch = 512`` (llama.cpp's default), ``swa_full=False``
(common's default), one KV stream per sequence.

Command line (``python -m samplers.perplexity``, and the ``llama_cffi`` plugin command
``llama-cffi perplexity``, registered by :func:`samplers.cli.register_perplexity`)::

    python -m llama_cffi perplexity [-m MODEL] -f FILE [-c 512] [-b 2048] [--chunks N] [-t THREADS]
                                    [--ray auto|HOST:PORT|local --workers N]

prints the running estimates as ``llama-perplexity`` does (``[1]12.3456,[2]...``, on
stdout as each chunk finishes), progress information on stderr, and finally
``Final estimate: PPL = X +/- Y`` on stdout. The plugin command adds ``--ray``: the chunks
are then scored by Ray workers (:mod:`samplers.distributed`, the optional layer built on
this module: :func:`run_cli` takes its :class:`RemoteScoring`); the output is the same,
digit for digit. ``python -m samplers.perplexity`` is the single-process command.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from llama_cffi import Batch, Context, LlamaError, Model, ParamError, default_model_path
from llama_cffi._args import (
    expect,
    expect_array,
    expect_callable,
    expect_int,
    expect_iterable,
    expect_namespace,
    expect_parser,
    expect_strs,
    type_error,
)

from .base import check_context, check_model
from .measure import log_normaliser

__all__ = [
    "Accumulator",
    "GroupTerms",
    "NotEnoughTokensError",
    "PerplexityError",
    "PerplexityResult",
    "Plan",
    "ProgressCallback",
    "RemoteScoring",
    "Scorer",
    "add_arguments",
    "groups",
    "main",
    "perplexity",
    "plan",
    "prepare",
    "run_cli",
]

#: ``progress(chunks_done, n_chunks, running_ppl)``: called after each scored chunk.
ProgressCallback = Callable[[int, int, float], None]


class PerplexityError(ParamError):
    """Perplexity cannot be computed with these inputs (a :class:`llama_cffi.ParamError`,
    hence a :class:`ValueError`); the message says why."""


class NotEnoughTokensError(PerplexityError):
    """The text holds fewer than ``2 * n_ctx`` tokens (``llama-perplexity`` refuses it too)."""


@dataclass(frozen=True)
class PerplexityResult:
    """The outcome of :func:`perplexity`.

    ``ppl``
        ``exp(nll)``: the perplexity (``Final estimate: PPL``).
    ``stderr``
        Its standard error as ``llama-perplexity`` prints it after ``+/-`` (same units as
        ``ppl``); NaN when it is undefined (fewer than two scored tokens, or a
        non-positive variance, where ``llama-perplexity`` prints an error instead).
    ``nll``
        Mean negative log-likelihood of the scored tokens, in nats per token.
    ``count``
        Tokens scored: ``n_chunks * (n_ctx - n_ctx // 2 - 1)``.
    ``n_chunks``
        Chunks evaluated.
    ``chunk_ppl``
        The running estimate ``exp(nll / count)`` after each chunk, in order (the
        ``[1]..., [2]...`` line); its last value equals ``ppl``.
    ``n_ctx``, ``n_batch``, ``n_seq``
        The chunk length, the effective batch size and the chunks decoded per batch.
    ``n_tokens``
        Tokens in the whole text (including the BOS the tokenizer adds).
    """

    ppl: float
    stderr: float
    nll: float
    count: int
    n_chunks: int
    chunk_ppl: tuple[float, ...]
    n_ctx: int
    n_batch: int
    n_seq: int
    n_tokens: int

    def __str__(self) -> str:
        return f"Final estimate: PPL = {self.ppl:.4f} +/- {self.stderr:.5f}"


@dataclass(frozen=True)
class Plan:
    """How ``llama-perplexity`` lays out the work for ``n_ctx`` and ``n_batch``."""

    n_ctx: int  #: tokens per chunk
    n_seq: int  #: chunks decoded together, one sequence each
    ctx_size: int  #: KV cells of the context: ``n_seq * n_ctx``
    n_batch: int  #: effective batch size: ``min(n_batch, ctx_size)``
    num_batches: int  #: decodes per chunk: ``ceil(n_ctx / n_batch)``


def _int_param(name: str, value: object, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise type_error(name, f"an int >= {minimum}", value)
    if value < minimum:
        raise ParamError(f"{name} must be an int >= {minimum}, not {value!r}")
    return int(value)


def plan(n_ctx: int = 512, n_batch: int = 2048) -> Plan:
    """The layout ``llama-perplexity -c n_ctx -b n_batch`` uses (see the module docstring)."""
    n_ctx = _int_param("n_ctx", n_ctx, 3)
    n_batch = _int_param("n_batch", n_batch, 1)
    n_seq = max(1, n_batch // n_ctx)
    ctx_size = n_seq * n_ctx
    nb = min(n_batch, ctx_size)
    return Plan(n_ctx, n_seq, ctx_size, nb, (n_ctx + nb - 1) // nb)


def _tokens(model: Model, text_or_tokens: Any) -> npt.NDArray[np.int32]:
    if isinstance(text_or_tokens, (str, bytes, bytearray)):
        data = bytes(text_or_tokens) if isinstance(text_or_tokens, bytearray) else text_or_tokens
        return model.tokenize(data, add_special=True, parse_special=False)
    return model.vocab.check_tokens(text_or_tokens, "text_or_tokens")


def _open_context(model: Model, p: Plan, n_threads: int | None) -> Context:
    kwargs: dict[str, Any] = {
        "n_ctx": p.ctx_size,
        "n_batch": p.n_batch,
        "n_seq_max": p.n_seq,
        "swa_full": False,
        "kv_unified": False,
    }
    if n_threads is not None:
        kwargs["n_threads"] = kwargs["n_threads_batch"] = n_threads
    return Context(model, **kwargs)  # exactly these sizes: no retry cascade


def _check_context(ctx: Context, p: Plan) -> None:
    problems = []
    if ctx.n_seq_max < p.n_seq:
        problems.append(f"n_seq_max={ctx.n_seq_max} < {p.n_seq} sequences")
    if ctx.n_ctx_seq < p.n_ctx:
        problems.append(f"n_ctx_seq={ctx.n_ctx_seq} < n_ctx={p.n_ctx}")
    if ctx.n_batch < p.n_batch:
        problems.append(f"n_batch={ctx.n_batch} < {p.n_batch}")
    if problems:
        raise PerplexityError(
            f"the context is too small for n_ctx={p.n_ctx}, n_batch={p.n_batch} ({', '.join(problems)}); "
            f"create it with n_ctx={p.ctx_size}, n_batch={p.n_batch}, n_seq_max={p.n_seq}, or pass the Model"
        )


def prepare(
    model: Model, text_or_tokens: str | bytes | npt.ArrayLike, n_ctx: int, n_batch: int, n_chunks: int
) -> tuple[Plan, npt.NDArray[np.int32], int, int | None]:
    """Check the arguments of :func:`perplexity` and lay out the run: ``(plan, tokens,
    chunks to score, BOS token or None)``. ``model`` may be loaded ``vocab_only``."""
    check_model(model)
    p = plan(n_ctx, n_batch)
    if isinstance(n_chunks, bool) or not isinstance(n_chunks, (int, np.integer)) or n_chunks == 0:
        raise ParamError(f"n_chunks must be a negative int (all chunks) or an int >= 1, not {n_chunks!r}")
    vocab = model.vocab
    if vocab.add_eos:
        raise PerplexityError("the model's vocabulary appends EOS to every text; llama-perplexity refuses such models")
    bos = vocab.bos if vocab.add_bos else None
    if vocab.add_bos and bos is None:
        raise PerplexityError("the vocabulary asks for BOS but defines no BOS token")
    tokens = _tokens(model, text_or_tokens)
    if len(tokens) < 2 * p.n_ctx:
        raise NotEnoughTokensError(
            f"you need at least {2 * p.n_ctx} tokens to evaluate perplexity with a context of {p.n_ctx}; "
            f"the text tokenizes to only {len(tokens)} tokens"
        )
    n_chunk_max = len(tokens) // p.n_ctx
    return p, tokens, (n_chunk_max if n_chunks < 0 else min(int(n_chunks), n_chunk_max)), bos


def perplexity(
    model_or_ctx: Model | Context,
    text_or_tokens: str | bytes | npt.ArrayLike,
    n_ctx: int = 512,
    n_batch: int = 2048,
    n_chunks: int = -1,
    n_threads: int | None = None,
    progress: ProgressCallback | None = None,
) -> PerplexityResult:
    """Perplexity of a text under a model, as ``llama-perplexity -c n_ctx -b n_batch
    --chunks n_chunks -t n_threads`` computes it (see the module docstring).

    ``model_or_ctx``: a :class:`llama_cffi.Model` (a context sized as the tool does is
    created and closed here) or a :class:`llama_cffi.Context` with at least
    ``n_seq_max = n_seq``, ``n_ctx_seq >= n_ctx`` and ``n_batch >= min(n_batch, n_seq *
    n_ctx)`` (see :func:`plan`). A given context's KV memory is **cleared** (every
    sequence) before each group of chunks and left holding the last group; with
    ``n_threads`` its thread counts are changed for the run and restored afterwards.

    ``text_or_tokens``: ``str``/``bytes`` (tokenized with BOS as the model asks, special
    tokens not parsed) or token ids. ``n_chunks``: at most this many chunks (negative:
    all). ``progress(chunks_done, n_chunks, running_ppl)`` is called after each chunk;
    an exception it raises stops the run.

    Raises :class:`NotEnoughTokensError` for fewer than ``2 * n_ctx`` tokens,
    :class:`PerplexityError` for an unsuitable context or model,
    :class:`llama_cffi.ParamError` for bad arguments, and llama_cffi's decode errors.
    """
    if isinstance(model_or_ctx, Context):
        ctx: Context | None = model_or_ctx
        model = model_or_ctx.model
    elif isinstance(model_or_ctx, Model):
        ctx = None
        model = model_or_ctx
    else:
        raise type_error("model_or_ctx", "a llama_cffi.Model or Context", model_or_ctx)
    if progress is not None:
        expect_callable("progress", progress, "callable or None")
    if n_threads is not None:
        n_threads = _int_param("n_threads", n_threads, 1)
    p, tokens, n_chunk, bos = prepare(model, text_or_tokens, n_ctx, n_batch, n_chunks)

    if ctx is None:
        ctx = _open_context(model, p, n_threads)
        try:
            return _run(ctx, tokens, p, n_chunk, bos, progress)
        finally:
            ctx.close()
    _check_context(ctx, p)
    if n_threads is None:
        return _run(ctx, tokens, p, n_chunk, bos, progress)
    saved = (ctx.n_threads, ctx.n_threads_batch)
    ctx.set_n_threads(n_threads, n_threads)
    try:
        return _run(ctx, tokens, p, n_chunk, bos, progress)
    finally:
        ctx.set_n_threads(*saved)


#: One group's contribution, in the order ``llama-perplexity`` adds it: ``(sum v, sum v^2,
#: chunk finished)`` per sequence of each decode (decode-major). Adding the terms of every
#: group in chunk order reproduces its float64 sums bit for bit, wherever they were computed.
GroupTerms = list[tuple[float, float, bool]]


def groups(n_chunk: int, n_seq: int) -> list[tuple[int, int]]:
    """``(first chunk, chunks)`` of each group ``llama-perplexity`` decodes together, in order."""
    n_chunk, n_seq = expect_int("n_chunk", n_chunk), expect_int("n_seq", n_seq)
    return [(i, min(n_seq, n_chunk - i)) for i in range(0, n_chunk, n_seq)]


class Scorer:
    """Scores groups of chunks on one context (the batch and the work row are reused)."""

    def __init__(self, ctx: Context, p: Plan) -> None:
        self.ctx = check_context(ctx)
        self.p = expect("p", p, Plan, "a Plan (from plan())")
        self.batch = Batch(p.n_batch, 1)
        self.scratch = np.empty(ctx.n_vocab, dtype=np.float32)  # exp() work row, reused for every row

    def _score_rows(
        self, rows: npt.NDArray[np.float32], tokens: npt.NDArray[np.int32], chunk: int, p0: int
    ) -> tuple[float, float]:
        """``(sum v, sum v^2)`` over one sequence's output rows of one decode (see
        :func:`_score`); :meth:`group` calls it for every sequence of every decode, in chunk
        and position order. A subclass may override it to see each row (``rows`` points
        into llama.cpp's buffer: valid during the call only; samplers.kl_divergence does)."""
        return _score(rows, tokens, chunk, p0, self.p.n_ctx, self.scratch)

    def group(self, tokens: npt.NDArray[np.int32], i: int, n_seq_batch: int, bos: int | None) -> GroupTerms:
        """The terms of chunks ``i .. i + n_seq_batch - 1``, decoded together from an
        empty KV memory as ``llama-perplexity`` decodes them."""
        expect_array("tokens", tokens, "an array of token ids", "iu")
        i = expect_int("i", i)
        n_seq_batch = expect_int("n_seq_batch", n_seq_batch)
        if bos is not None:
            bos = expect_int("bos", bos, "a token id or None")
        ctx, p, batch = self.ctx, self.p, self.batch
        n_ctx, nb = p.n_ctx, p.n_batch
        first = n_ctx // 2
        start = i * n_ctx
        terms: GroupTerms = []
        ctx.memory.clear(True)
        for j in range(p.num_batches):
            pos0 = j * nb  # position of the batch's first token within each chunk
            size = min(n_ctx - pos0, nb)  # tokens of each sequence in this batch
            out_pos = np.arange(pos0, pos0 + size, dtype=np.int32)
            for seq in range(n_seq_batch):
                o = seq * size
                seq_start = start + seq * n_ctx + pos0
                batch.token[o : o + size] = tokens[seq_start : seq_start + size]
                if bos is not None and j == 0:
                    batch.token[o] = bos
                batch.pos[o : o + size] = out_pos
                batch.n_seq_id[o : o + size] = 1
                batch.seq_id[o : o + size, 0] = seq
                batch.logits[o : o + size] = out_pos >= first
            batch.n_tokens = n_seq_batch * size
            ctx.decode_batch(batch)
            last = j == p.num_batches - 1
            p0 = max(first, pos0)  # first position with logits in this batch
            n_out = max(0, pos0 + size - p0)  # output rows per sequence
            if n_out == 0:
                continue
            # rows of this decode, in batch order: n_out per sequence (read here, dropped
            # before the next decode: nothing may point into llama.cpp's buffer then)
            rows = np.asarray(ctx.logits_all())
            try:
                for seq in range(n_seq_batch):
                    chunk = start + seq * n_ctx
                    a, b = self._score_rows(rows[seq * n_out : (seq + 1) * n_out], tokens, chunk, p0)
                    if math.isnan(a):
                        raise PerplexityError(f"the model produced NaN or infinite logits in chunk {i + seq + 1}")
                    terms.append((a, b, last))
            finally:
                del rows  # even when an exception (a traceback) would keep this frame alive
        return terms


class Accumulator:
    """``llama-perplexity``'s running sums: :meth:`add` each group's terms in chunk order,
    then :meth:`result`."""

    def __init__(self, p: Plan, n_chunk: int, n_tokens: int, progress: ProgressCallback | None = None) -> None:
        self.p = expect("p", p, Plan, "a Plan (from plan())")
        self.n_chunk = expect_int("n_chunk", n_chunk)
        self.n_tokens = expect_int("n_tokens", n_tokens)
        if progress is not None:
            expect_callable("progress", progress, "callable or None")
        self.progress = progress
        self.nll = 0.0
        self.nll2 = 0.0
        self.count = 0
        self.running: list[float] = []

    def add(self, terms: GroupTerms) -> None:
        terms = list(expect_iterable("terms", terms, "the terms of a group (Scorer.group)"))
        per_chunk = self.p.n_ctx - self.p.n_ctx // 2 - 1
        for a, b, finished in terms:
            self.nll += a
            self.nll2 += b
            if finished:
                self.count += per_chunk
                ppl = math.exp(self.nll / self.count)
                self.running.append(ppl)
                if self.progress is not None:
                    self.progress(len(self.running), self.n_chunk, ppl)

    def result(self) -> PerplexityResult:
        p, count = self.p, self.count
        mean = self.nll / count
        var = self.nll2 / count - mean * mean
        ppl = math.exp(mean)
        err = ppl * math.sqrt(var / (count - 1)) if var > 0 and count > 1 else math.nan
        return PerplexityResult(
            ppl, err, mean, count, len(self.running), tuple(self.running), p.n_ctx, p.n_batch, p.n_seq, self.n_tokens
        )


def _run(
    ctx: Context,
    tokens: npt.NDArray[np.int32],
    p: Plan,
    n_chunk: int,
    bos: int | None,
    progress: ProgressCallback | None,
) -> PerplexityResult:
    scorer = Scorer(ctx, p)
    acc = Accumulator(p, n_chunk, len(tokens), progress)
    for i, n in groups(n_chunk, p.n_seq):
        acc.add(scorer.group(tokens, i, n, bos))
    return acc.result()


def _score(
    rows: npt.NDArray[np.float32],
    tokens: npt.NDArray[np.int32],
    chunk: int,
    p0: int,
    n_ctx: int,
    scratch: npt.NDArray[np.float32],
) -> tuple[float, float]:
    """``(sum v, sum v^2)`` of ``v = -log_softmax(row)[next token]`` over the output rows of
    one sequence: ``rows[r]`` is position ``p0 + r`` of the chunk starting at token
    ``chunk`` and predicts the token at ``p0 + r + 1``; the chunk's last position
    predicts nothing. ``scratch`` (float32, ``n_vocab``) is overwritten."""
    nll = 0.0
    nll2 = 0.0
    for r in range(min(len(rows), n_ctx - 1 - p0)):
        row = rows[r]
        m = row.max()  # NaN (or +inf) logits make the sums NaN: the caller checks
        s = log_normaliser(row, m, scratch)
        # the difference in float32, then double, as log_softmax() in perplexity.cpp
        v = math.log(s) - float(row[tokens[chunk + p0 + r + 1]] - m)
        nll += v
        nll2 += v * v
    return nll, nll2


# ---------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's options (``llama-perplexity``'s names), on ``parser``."""
    expect_parser("parser", parser)
    parser.add_argument("-m", "--model", help="GGUF file (default: the default model)")
    parser.add_argument(
        "-f", "--file", help="text file (one trailing newline is dropped); every mode but --kl-divergence needs it"
    )
    parser.add_argument("-c", "--ctx-size", type=int, default=512, help="tokens per chunk (default 512)")
    parser.add_argument("-b", "--batch-size", type=int, default=2048, help="logical batch size (default 2048)")
    parser.add_argument("--chunks", type=int, default=-1, help="at most this many chunks (default: all)")
    parser.add_argument("-t", "--threads", type=int, default=None, help="threads (default: llama_cffi's)")
    parser.add_argument(
        "--hellaswag", action="store_true", help="HellaSwag's acc_norm over the file's tasks (llama.cpp's layout)"
    )
    parser.add_argument("--hellaswag-tasks", type=int, default=400, help="tasks to draw (default 400)")
    parser.add_argument("--winogrande", action="store_true", help="the Winogrande score over the CSV file's tasks")
    parser.add_argument("--winogrande-tasks", type=int, default=0, help="tasks to draw (default 0: all)")
    parser.add_argument(
        "--multiple-choice", action="store_true", help="the multiple-choice score over the binary task file's tasks"
    )
    parser.add_argument("--multiple-choice-tasks", type=int, default=0, help="tasks to draw (default 0: all)")
    parser.add_argument("-np", "--parallel", type=int, default=1, help="sequences (the eval modes use at least 4)")
    from .kl_divergence import add_kl_arguments  # it builds on this module: imported when used

    add_kl_arguments(parser)


class RemoteScoring(Protocol):
    """Scores the command's chunks somewhere else (``llama-cffi perplexity --ray`` passes
    :func:`samplers.distributed.cli_scoring`'s): called with the model's path, the tokens
    and the command's ``n_ctx``, ``n_batch`` and ``n_chunks``; it calls ``started()`` once
    its workers are ready (the first pass's time, and so the ETA, counts from there) and
    ``progress`` after each chunk, as :func:`perplexity` does, and returns the same
    :class:`PerplexityResult`."""

    def __call__(
        self,
        model_path: str,
        tokens: npt.NDArray[np.int32],
        n_ctx: int,
        n_batch: int,
        n_chunks: int,
        progress: ProgressCallback,
        started: Callable[[], None],
    ) -> PerplexityResult: ...


def _read_text(path: str) -> bytes:
    with open(path, "rb") as fh:
        data = fh.read()
    return data[:-1] if data.endswith(b"\n") else data


def run_cli(args: argparse.Namespace, remote: RemoteScoring | None = None) -> int:
    """The ``perplexity`` command: prints like ``llama-perplexity``; returns the exit status.
    ``remote``: score the chunks there (only the vocabulary is loaded here). User errors
    propagate as exceptions (the caller prints one line and exits 2)."""
    expect_namespace("args", args)
    if remote is not None:
        expect_callable("remote", remote, "a RemoteScoring callable or None")
    kl = getattr(args, "kl_divergence_base", None) is not None or bool(getattr(args, "kl_divergence", False))
    if kl:
        if remote is not None:
            raise ParamError("--kl-divergence-base/--kl-divergence run in this process: leave out --ray")
        from .kl_divergence import run_kl_cli

        rc = run_kl_cli(args)
        assert rc is not None
        return rc
    if not getattr(args, "file", None):
        raise ParamError("-f FILE is required (the text, or the eval mode's task file)")
    if getattr(args, "hellaswag", False):
        return _run_hellaswag(args, remote)
    if getattr(args, "winogrande", False):
        return _run_winogrande(args, remote)
    if getattr(args, "multiple_choice", False):
        return _run_multiple_choice(args, remote)
    p = plan(args.ctx_size, args.batch_size)
    text = _read_text(args.file)
    path = args.model if args.model else str(default_model_path())
    with Model.load(path, vocab_only=remote is not None) as model:  # remote: the tokenizer only
        tokens = model.tokenize(text, add_special=True, parse_special=False)
        if len(tokens) >= 2 * p.n_ctx:
            n_max = len(tokens) // p.n_ctx
            n_total = n_max if args.chunks < 0 else min(args.chunks, n_max)
            print(
                f"perplexity: calculating perplexity over {n_total} chunks, n_ctx={p.n_ctx}, "
                f"batch_size={p.n_batch}, n_seq={p.n_seq}",
                file=sys.stderr,
                flush=True,
            )
        clock = [time.perf_counter()]
        first_pass: list[float] = []

        def started() -> None:
            clock[0] = time.perf_counter()

        def show(done: int, total: int, ppl: float) -> None:
            if not first_pass:
                first_pass.append(time.perf_counter() - clock[0])
                eta = first_pass[0] * total / p.n_seq
                print(
                    f"perplexity: {first_pass[0]:.2f} seconds per pass - ETA {eta / 60:.2f} minutes",
                    file=sys.stderr,
                    flush=True,
                )
            print(f"[{done}]{ppl:.4f},", end="", flush=True)

        if remote is None:
            res = perplexity(model, tokens, p.n_ctx, args.batch_size, args.chunks, args.threads, show)
        else:
            res = remote(path, tokens, p.n_ctx, args.batch_size, args.chunks, show, started)
    print(flush=True)
    if math.isnan(res.stderr):
        print("Unexpected negative standard deviation of log(prob)", file=sys.stderr)
        return 0
    print(res, flush=True)
    return 0


def _run_hellaswag(args: argparse.Namespace, remote: RemoteScoring | None) -> int:
    """``--hellaswag``: llama-perplexity's lines (a header, then the running accuracy
    after each task) on stdout."""
    from .evals import hellaswag, read_hellaswag, wilson_interval

    if remote is not None:
        raise ParamError("--hellaswag runs in this process: leave out --ray")
    with open(args.file, encoding="utf-8") as fh:
        tasks = read_hellaswag(fh.read())
    path = args.model if args.model else str(default_model_path())
    print(f"hellaswag_score : loaded {len(tasks)} tasks from prompt.", file=sys.stderr, flush=True)
    print("\ntask\tacc_norm\t95% confidence interval", flush=True)

    def show(done: int, total: int, acc: float) -> None:
        del total
        lo, hi = wilson_interval(round(acc * done), done)
        print(f"{done}\t{acc * 100.0:3.8f}%\t[{lo * 100.0:3.4f}%, {hi * 100.0:3.4f}%]", flush=True)

    with Model.load(path) as model:
        hellaswag(
            model,
            tasks,
            args.hellaswag_tasks,
            ctx_size=args.ctx_size,
            n_batch=args.batch_size,
            n_parallel=args.parallel,
            n_threads=args.threads,
            progress=show,
        )
    print(flush=True)
    return 0


def _eval_file(args: argparse.Namespace, remote: RemoteScoring | None, flag: str) -> tuple[bytes, str, dict[str, Any]]:
    """The ``-f`` file's bytes, the model's path and the context options of an eval mode."""
    if remote is not None:
        raise ParamError(f"{flag} runs in this process: leave out --ray")
    with open(args.file, "rb") as fh:
        data = fh.read()
    path = args.model if args.model else str(default_model_path())
    opts = {
        "ctx_size": args.ctx_size,
        "n_batch": args.batch_size,
        "n_parallel": args.parallel,
        "n_threads": args.threads,
    }
    return data, path, opts


def _run_winogrande(args: argparse.Namespace, remote: RemoteScoring | None) -> int:
    """``--winogrande``: llama-perplexity's lines (one per task as it is scored: number,
    running accuracy, the two scores, the option chosen, the answer; then the final score
    from 100 tasks on) on stdout."""
    from .evals import TaskScore, read_winogrande, winogrande

    data, path, opts = _eval_file(args, remote, "--winogrande")
    tasks = read_winogrande(data.decode("utf-8", "surrogateescape"))
    print(f"winogrande_score : loaded {len(tasks)} tasks from prompt.", file=sys.stderr, flush=True)
    done = [0, 0]  # correct, scored

    def show(t: TaskScore) -> None:
        done[0] += t.correct
        done[1] += 1
        s1, s2 = t.scores
        acc = 100.0 * done[0] / done[1]
        print(f"{done[1]}\t{acc:.4f}\t{s1:10.6f}  {s2:10.6f}  {t.chosen + 1}  {t.gold + 1}", flush=True)

    with Model.load(path) as model:
        res = winogrande(model, tasks, args.winogrande_tasks, **opts, on_task=show)
    print(flush=True)
    for line in res.final_lines():
        print(line, flush=True)
    return 0


def _run_multiple_choice(args: argparse.Namespace, remote: RemoteScoring | None) -> int:
    """``--multiple-choice`` (``-f``: llama.cpp's binary task file): llama-perplexity's
    lines (a header, the running accuracy after each task, the final result and random
    chance) on stdout."""
    from .evals import multiple_choice, read_multiple_choice

    data, path, opts = _eval_file(args, remote, "--multiple-choice")
    tasks = read_multiple_choice(data)
    print(f"multiple_choice_score: there are {len(tasks)} tasks in prompt", file=sys.stderr, flush=True)
    print("\ntask\tacc_norm", flush=True)

    def show(done: int, total: int, acc: float) -> None:
        del total
        print(f"{done}\t{100.0 * round(acc * done) / done:.8f}", flush=True)

    with Model.load(path) as model:
        res = multiple_choice(model, tasks, args.multiple_choice_tasks, **opts, progress=show)
    print(flush=True)
    for line in res.final_lines():
        print(line, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m samplers.perplexity``: the command on its own, in this process (the
    plugin command ``llama-cffi perplexity`` also takes ``--ray``)."""
    if argv is not None:
        expect_strs("argv", argv, "a list of str or None")
    parser = argparse.ArgumentParser(
        prog="python -m samplers.perplexity", description="Corpus perplexity, as llama-perplexity computes it."
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_cli(args)
    except (LlamaError, OSError, ValueError) as exc:
        print(f"perplexity: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nperplexity: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
