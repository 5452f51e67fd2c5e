"""llama-perplexity's evaluation modes, computed as ``tools/perplexity/perplexity.cpp``
computes them (pinned commit): HellaSwag (``--hellaswag``), Winogrande (``--winogrande``)
and multiple choice (``--multiple-choice``).

HellaSwag (``hellaswag_score()`` there): the file holds 6 lines per task (the context,
the index of the gold ending, four endings, as llama.cpp's ``hellaswag_val_full.txt``);
``n_tasks`` tasks are drawn at random with ``std::mt19937(1)`` (each drawn task removed
from the pool), each ending is tokenized as ``context + " " + ending`` with BOS, the
tokens the four share are decoded once for the four sequences (one KV cell each, shared)
and each ending's own tokens in its sequence; an ending's score is the mean
log-probability of its tokens after the shared part (the first from ``softmax`` of the
shared part's last row, the others as ``compute_logprobs`` does: float32 arithmetic, the
exps summed in float32 in vocabulary order, as Winogrande's below),
and a task counts when the gold ending has the highest score (``acc_norm``, with a
Wilson 95% interval). Tasks are packed into one batch while they fit in the context and
its ``n_seq_max`` (4 sequences a task), and the batch is decoded in ``n_batch`` chunks
from an empty memory, as ``decode_helper`` does, so the rows are llama-perplexity's own.

Winogrande (``winogrande_score()``; :func:`winogrande`, :func:`read_winogrande`): a CSV
(``index,sentence,option1,option2,answer``, the sentence with a ``_`` where an option
goes); all tasks in the file's order, or ``n_tasks`` drawn with ``std::mt19937(1)`` scaled
to the pool in float32 (each drawn task swapped with the last and removed: not
HellaSwag's draw); the two sentences share their first tokens; an option's score is the
mean log-probability of the tokens after the option (llama.cpp's rule for short tails and
its FIXME included), and each running line has the two scores (6 decimals), so the
log-probabilities follow ``compute_logprobs``'s float32 arithmetic, its float32 sum in
vocabulary order included. Final line (from 100 tasks): ``Final Winogrande score(N
tasks): P +/- S``.

Multiple choice (``multiple_choice_score()``; :func:`multiple_choice`,
:func:`read_multiple_choice`, :func:`write_multiple_choice`): llama.cpp's binary task file
(ARC, MMLU, TruthfulQA, HellaSwag); 2 to 100 answers a task, scored like HellaSwag's
endings (question + " " + answer, the shared tokens decoded once, one sequence an
answer) in float32; all tasks in order or ``n_tasks`` drawn as Winogrande draws them.
Running lines ``N\tacc``, then ``Final result`` and ``Random chance`` lines.

The context is made as llama-perplexity makes it for these modes: ``n_seq_max =
max(4, n_parallel)``, ``n_ctx = n_seq_max * ctx_size``, ``n_batch = min(n_batch,
n_ctx)``, a unified KV cache.

Where llama.cpp logs and skips a malformed line or task, or reads out of bounds, these
raise :class:`llama_cffi.ParamError` (each function says which).
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from llama_cffi import Batch, Context, Model, ParamError, Vocab
from llama_cffi._args import expect, expect_callable, expect_int, expect_iterable

from ._libm import c_expf, c_logf
from ._libm import expf as _row_expf

__all__ = [
    "EvalTask",
    "HellaswagResult",
    "MultipleChoiceResult",
    "MultipleChoiceScore",
    "MultipleChoiceTask",
    "TaskScore",
    "WinograndeResult",
    "WinograndeTask",
    "hellaswag",
    "multiple_choice",
    "read_hellaswag",
    "read_multiple_choice",
    "read_winogrande",
    "wilson_interval",
    "winogrande",
    "write_multiple_choice",
]

#: ``z`` of a 95% interval, as perplexity.cpp writes it
_ZA = 1.95996398454


@dataclass(frozen=True)
class EvalTask:
    """One multiple-ending task: a ``context``, its ``endings`` and the ``gold`` one's index."""

    context: str
    gold: int
    endings: tuple[str, ...]


@dataclass(frozen=True)
class TaskScore:
    """A scored task: its index in the file, the gold ending, the one with the highest
    ``scores`` (mean log-probability of each ending's tokens, nats) and whether they agree."""

    index: int
    gold: int
    chosen: int
    scores: tuple[float, ...]

    @property
    def correct(self) -> bool:
        return self.chosen == self.gold


def wilson_interval(correct: int, n: int) -> tuple[float, float]:
    """The 95% Wilson score interval of ``correct / n`` (fractions), as perplexity.cpp
    prints it."""
    correct, n = expect_int("correct", correct), expect_int("n", n)
    if not 0 <= correct <= n or n < 1:
        raise ParamError(f"need 0 <= correct <= n and n >= 1, not correct={correct}, n={n}")
    freq = correct / n
    z = _ZA * _ZA / n
    cnf = z * math.sqrt(n * (4.0 * freq * (1 - freq) + z)) / (_ZA + _ZA)
    return (freq + z * 0.5 - cnf) / (1.0 + z), (freq + z * 0.5 + cnf) / (1.0 + z)


@dataclass(frozen=True)
class HellaswagResult:
    """The tasks scored, in the order they were drawn; ``accuracy`` (``acc_norm``, a
    fraction) and its 95% Wilson ``interval``. ``str()`` is llama-perplexity's last line
    (``N\\tacc%\\t[lo%, hi%]``)."""

    tasks: tuple[TaskScore, ...]

    @property
    def correct(self) -> int:
        return sum(t.correct for t in self.tasks)

    @property
    def accuracy(self) -> float:
        return self.correct / len(self.tasks)

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.correct, len(self.tasks))

    def running(self) -> list[str]:
        """The lines llama-perplexity prints as it goes, one per task."""
        out, acc = [], 0
        for i, t in enumerate(self.tasks, start=1):
            acc += t.correct
            lo, hi = wilson_interval(acc, i)
            out.append(f"{i}\t{acc / i * 100.0:3.8f}%\t[{lo * 100.0:3.4f}%, {hi * 100.0:3.4f}%]")
        return out

    def __str__(self) -> str:
        return self.running()[-1]


def read_hellaswag(text: str) -> list[EvalTask]:
    """The tasks of a HellaSwag file in llama.cpp's layout (6 lines a task)."""
    expect("text", text, str, "the file's text (str)")
    lines = text.split("\n")
    if lines and lines[-1] == "":  # std::getline yields no empty last line
        lines.pop()
    if len(lines) % 6:
        raise ParamError(f"a HellaSwag file has 6 lines per task; this one has {len(lines)} lines")
    tasks = []
    for i in range(0, len(lines), 6):
        try:
            gold = int(lines[i + 1])
        except ValueError:
            raise ParamError(
                f"line {i + 2}: the gold ending's index must be an integer, not {lines[i + 1]!r}"
            ) from None
        if not 0 <= gold < 4:
            raise ParamError(f"line {i + 2}: the gold ending's index must be 0..3, not {gold}")
        tasks.append(EvalTask(lines[i], gold, tuple(lines[i + 2 : i + 6])))
    return tasks


class _MT19937:
    """``std::mt19937`` (numpy's generator seeded as ``init_genrand``) with libstdc++'s
    ``uniform_int_distribution`` for a 32-bit engine (Lemire's nearly divisionless method)."""

    def __init__(self, seed: int) -> None:
        self._bg = np.random.MT19937()
        self._bg._legacy_seeding(seed)

    def __call__(self) -> int:
        return int(self._bg.random_raw())

    def uniform(self, lo: int, hi: int) -> int:
        """``std::uniform_int_distribution<size_t>(lo, hi)(rng)``."""
        urange = hi - lo
        if urange == 0xFFFFFFFF:
            return lo + self()
        if urange > 0xFFFFFFFF:  # pragma: no cover - a pool of over 4e9 tasks
            raise ParamError("too many tasks")
        uerange = urange + 1
        product = self() * uerange
        low = product & 0xFFFFFFFF
        if low < uerange:
            threshold = (-uerange & 0xFFFFFFFF) % uerange
            while low < threshold:
                product = self() * uerange
                low = product & 0xFFFFFFFF
        return lo + (product >> 32)


def _draw(n_pool: int, n_tasks: int) -> list[int]:
    """The file indices of the tasks llama-perplexity draws, in order."""
    rng = _MT19937(1)
    pool = list(range(n_pool))
    out = []
    for _ in range(min(n_tasks, n_pool)):
        out.append(pool.pop(rng.uniform(0, len(pool) - 1)))
    return out


def _check_callbacks(**callbacks: object) -> None:
    """Each callback (by its parameter's name) is None or callable."""
    for name, fn in callbacks.items():
        if fn is not None:
            expect_callable(name, fn, "callable or None")


def hellaswag(
    model: Model,
    text: str | Sequence[EvalTask],
    n_tasks: int = 400,
    *,
    ctx_size: int = 512,
    n_batch: int = 2048,
    n_parallel: int = 1,
    n_threads: int | None = None,
    progress: Callable[[int, int, float], None] | None = None,
) -> HellaswagResult:
    """HellaSwag's ``acc_norm`` over ``n_tasks`` tasks drawn from ``text`` (a file's text
    or :func:`read_hellaswag`'s tasks), as ``llama-perplexity --hellaswag
    --hellaswag-tasks N -c CTX_SIZE -b N_BATCH -np N_PARALLEL`` computes it (see the
    module docstring). ``progress(done, total, accuracy)`` after each task."""
    expect("model", model, Model, "a llama_cffi.Model")
    _check_callbacks(progress=progress)
    if isinstance(text, str):
        tasks = read_hellaswag(text)
    else:
        tasks = list(expect_iterable("text", text, "the file's text (a str) or a sequence of EvalTask"))
    for i, t in enumerate(tasks):
        expect(f"tasks[{i}]", t, EvalTask, "an EvalTask")
        if len(t.endings) != 4:
            raise ParamError(f"tasks[{i}] has {len(t.endings)} endings; HellaSwag has 4")
    if not tasks:
        raise ParamError("no tasks")
    n_tasks = expect_int("n_tasks", n_tasks)
    if n_tasks < 1:
        raise ParamError(f"n_tasks must be >= 1, not {n_tasks}")
    for name, v in (("ctx_size", ctx_size), ("n_batch", n_batch), ("n_parallel", n_parallel)):
        if expect_int(name, v) < 1:
            raise ParamError(f"{name} must be >= 1, not {v}")
    n_seq = max(4, n_parallel)
    n_ctx = n_seq * ctx_size
    params: dict[str, object] = {
        "n_ctx": n_ctx,
        "n_batch": min(n_batch, n_ctx),
        "n_seq_max": n_seq,
        "kv_unified": True,
    }
    if n_threads is not None:
        params["n_threads"] = params["n_threads_batch"] = n_threads
    with model.context(**params) as ctx, _pool() as pool:
        return _hellaswag(ctx, tasks, _draw(len(tasks), n_tasks), pool, progress)


def _hellaswag(
    ctx: Context,
    tasks: list[EvalTask],
    order: list[int],
    pool: ThreadPoolExecutor | None,
    progress: Callable[[int, int, float], None] | None,
) -> HellaswagResult:
    vocab = ctx.model.vocab
    seqs: list[list[list[int]]] = []
    prefix: list[int] = []
    for idx in order:
        t = tasks[idx]
        toks = [[int(x) for x in vocab.tokenize(t.context + " " + e, add_special=True)] for e in t.endings]
        n = 0
        while n < len(toks[0]) and all(n < len(s) and s[n] == toks[0][n] for s in toks[1:]):
            n += 1
        if n == 0 or any(len(s) == n for s in toks):
            raise ParamError(f"task {idx}: the endings must share a first token (BOS) and each add a token of its own")
        seqs.append(toks)
        prefix.append(n)
    n_ctx = ctx.n_ctx
    n_batch = ctx.n_batch
    max_seq = min(4 * 32, ctx.n_seq_max)
    required = [p + sum(len(s) - p for s in toks) for toks, p in zip(seqs, prefix, strict=True)]
    batch = Batch(n_ctx, n_seq_max=4)
    scored: list[TaskScore] = []
    i0 = 0
    while i0 < len(order):
        n_cur, i1, n = 0, i0, 0
        firsts: list[int] = []  # batch index of each task's shared last token
        while n_cur + required[i1] <= n_ctx and 4 * (i1 - i0) + 4 <= max_seq:
            toks, p, s0 = seqs[i1], prefix[i1], 4 * (i1 - i0)
            for j in range(p):
                batch.token[n], batch.pos[n], batch.n_seq_id[n] = toks[0][j], j, 4
                batch.seq_id[n, :4] = [s0, s0 + 1, s0 + 2, s0 + 3]
                batch.logits[n] = 1 if j == p - 1 else 0
                n += 1
            firsts.append(n - 1)
            for s in range(4):
                for j in range(p, len(toks[s])):
                    batch.token[n], batch.pos[n], batch.n_seq_id[n] = toks[s][j], j, 1
                    batch.seq_id[n, 0] = s0 + s
                    batch.logits[n] = 1 if j < len(toks[s]) - 1 else 0
                    n += 1
            n_cur += required[i1]
            i1 += 1
            if i1 == len(order):
                break
        if i1 == i0:
            raise ParamError(f"task {order[i0]} does not fit in the context (it needs {required[i0]} cells of {n_ctx})")
        ctx.memory.clear(True)
        rows = _decode_chunks(ctx, batch, n, n_batch)
        # the output rows in batch order: map batch index -> row
        out_of = np.cumsum(batch.logits[:n]) - 1
        # compute_logprobs over every ending token of the batch's tasks, in llama.cpp's order
        pairs: list[tuple[int, int]] = []
        for k, i in enumerate(range(i0, i1)):
            toks, p = seqs[i], prefix[i]
            r = int(out_of[firsts[k]]) + 1  # the rows after the shared part's last
            for s in range(4):
                for j in range(p, len(toks[s]) - 1):
                    pairs.append((r, toks[s][j + 1]))
                    r += 1
        lps = _compute_logprobs(rows, pairs, pool)
        ir = 0
        for k, i in enumerate(range(i0, i1)):
            toks, p = seqs[i], prefix[i]
            firsts_lp = _softmax_logprob(rows[out_of[firsts[k]]], [toks[s][p] for s in range(4)])
            scores = []
            for s in range(4):
                total, count = float(firsts_lp[s]), 1  # double ending_logprob, as there
                for _ in range(p, len(toks[s]) - 1):
                    total += float(lps[ir])
                    ir += 1
                    count += 1
                scores.append(total / count)
            chosen = 0
            for s in range(1, 4):
                if scores[s] > scores[chosen]:
                    chosen = s
            task = tasks[order[i]]
            scored.append(TaskScore(order[i], task.gold, chosen, tuple(scores)))
            if progress is not None:
                progress(len(scored), len(order), sum(t.correct for t in scored) / len(scored))
        i0 = i1
    return HellaswagResult(tuple(scored))


def _decode_chunks(ctx: Context, batch: Batch, n: int, n_batch: int) -> npt.NDArray[np.float32]:
    """``decode_helper``: the batch's first ``n`` tokens decoded in ``n_batch`` chunks, the
    output rows of every chunk copied out in order."""
    from llama_cffi import Batch as _Batch

    parts = []
    sub = _Batch(n_batch, n_seq_max=batch.n_seq_max)
    for i in range(0, n, n_batch):
        m = min(n_batch, n - i)
        sub.token[:m] = batch.token[i : i + m]
        sub.pos[:m] = batch.pos[i : i + m]
        sub.n_seq_id[:m] = batch.n_seq_id[i : i + m]
        sub.seq_id[:m] = batch.seq_id[i : i + m]
        sub.logits[:m] = batch.logits[i : i + m]
        sub.n_tokens = m
        ctx.decode_batch(sub)
        if sub.logits[:m].any():
            parts.append(np.array(ctx.logits_all(), dtype=np.float32, copy=True))
    if not parts:
        return np.zeros((0, ctx.n_vocab), dtype=np.float32)
    return np.concatenate(parts)


# ---------------------------------------------------------------------- shared by Winogrande and multiple choice
def _eval_context_params(ctx_size: int, n_batch: int, n_parallel: int, n_threads: int | None) -> dict[str, object]:
    """llama-perplexity's context for its eval modes: ``n_seq_max = max(4, n_parallel)``,
    ``n_ctx = n_seq_max * ctx_size``, ``n_batch = min(n_batch, n_ctx)``, a unified KV cache."""
    for name, v in (("ctx_size", ctx_size), ("n_batch", n_batch), ("n_parallel", n_parallel)):
        if expect_int(name, v) < 1:
            raise ParamError(f"{name} must be >= 1, not {v}")
    n_seq = max(4, n_parallel)
    n_ctx = n_seq * ctx_size
    params: dict[str, object] = {"n_ctx": n_ctx, "n_batch": min(n_batch, n_ctx), "n_seq_max": n_seq, "kv_unified": True}
    if n_threads is not None:
        params["n_threads"] = params["n_threads_batch"] = expect_int("n_threads", n_threads)
    return params


def _draw_swap(n_pool: int, n_tasks: int) -> list[int]:
    """The pool indices Winogrande and multiple choice draw, in order: ``std::mt19937(1)``,
    ``j = int(scale * rng() * aux.size())`` in float32 with ``scale = 1/(1 + 2^32 - 1)``
    (also float32: 2^-32), then ``aux[j] = aux.back(); aux.pop_back()`` (not HellaSwag's
    ``uniform_int_distribution`` and erase). Where the float32 product rounds up to
    ``aux.size()`` (a draw within 2^-24 of 2^32: llama.cpp reads past the end then) the
    last index is taken."""
    rng = _MT19937(1)
    scale = np.float32(1.0) / (np.float32(1.0) + np.float32(0xFFFFFFFF))
    aux = list(range(n_pool))
    out = []
    for _ in range(n_tasks):
        j = min(int(np.float32(np.float32(scale * np.float32(rng())) * np.float32(len(aux)))), len(aux) - 1)
        out.append(aux[j])
        aux[j] = aux[-1]
        aux.pop()
    return out


def _common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    n = min(len(s) for s in seqs)
    k = 0
    while k < n and all(s[k] == seqs[0][k] for s in seqs[1:]):
        k += 1
    return k


def _tokenize(vocab: Vocab, text: str) -> list[int]:
    """``common_tokenize(ctx, text, true)``: special tokens added, none parsed; the text's
    bytes as they were read (``surrogateescape`` keeps bytes that are not UTF-8)."""
    return [int(t) for t in vocab.tokenize(text.encode("utf-8", "surrogateescape"), add_special=True)]


def _exps_f32(d: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """``expf`` of each value, as the C library computes it (``samplers._libm.expf``:
    numpy's own float32 ``exp`` is a different approximation, 39% of values differ)."""
    return _row_expf(np.ascontiguousarray(d, dtype=np.float32))  # any shape


def _compute_logprobs(
    rows: npt.NDArray[np.float32], pairs: Sequence[tuple[int, int]], pool: ThreadPoolExecutor | None
) -> npt.NDArray[np.float32]:
    """``compute_logprobs()``: for each ``(row, token)``, ``logit - max - logf(sum)`` in
    float32, the sum of the ``expf(logit - max)`` accumulated in float32 in vocabulary
    order (as its loop does: a float32 sum of 262,144 values is far from the exact one, so
    the order matters). Rows are taken 4 at a time (its ``K_TOKEN_CHUNK``), on ``pool``."""
    out = np.empty(len(pairs), dtype=np.float32)

    def work(lo: int) -> None:
        part = pairs[lo : lo + 4]
        block = rows[[r for r, _ in part]]
        m = block.max(axis=1)
        d = block - m[:, None]
        e = _exps_f32(d)
        s = np.add.accumulate(e, axis=1, out=e)[:, -1]
        for k, (_, tok) in enumerate(part):
            out[lo + k] = d[k, tok] - c_logf(float(s[k]))

    starts = range(0, len(pairs), 4)
    if pool is None or len(pairs) <= 4:
        for lo in starts:
            work(lo)
    else:
        for _ in pool.map(work, starts):
            pass
    return out


def _softmax_logprob(row: npt.NDArray[np.float32], tokens: Sequence[int]) -> list[np.float32]:
    """``std::log(softmax(row)[t])`` for each of ``tokens``, as perplexity.cpp's
    ``softmax()``: ``expf`` of ``logit - max`` (float32), summed in float64 in vocabulary
    order, each probability rounded to float32, its ``logf``."""
    m = row.max()
    d = row - m
    s = float(np.add.accumulate(_exps_f32(d), dtype=np.float64)[-1])
    return [c_logf(float(np.float32(float(c_expf(float(d[t]))) / s))) for t in tokens]


def _pool() -> ThreadPoolExecutor:
    """Threads for :func:`_compute_logprobs` (llama.cpp's: one per hardware thread)."""
    return ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1))


# ---------------------------------------------------------------------- Winogrande
@dataclass(frozen=True)
class WinograndeTask:
    """A Winogrande sentence cut at its ``_``: the sentence is ``first + option + second``
    for each of the two ``options``; ``answer`` is the right one's number (1 or 2)."""

    first: str
    second: str
    options: tuple[str, str]
    answer: int


_WG_SPACE = " \t\n\v\f\r"


def _wg_answer(field: str) -> int | None:
    """``std::istringstream(field.c_str()) >> int``: leading white space, a sign, digits;
    None where that fails (no digits, out of int's range)."""
    s = field.split("\0", 1)[0].lstrip(_WG_SPACE)
    k = 1 if s[:1] in ("+", "-") else 0
    n = k
    while n < len(s) and "0" <= s[n] <= "9":
        n += 1
    if n == k:
        return None
    v = int(s[:n])
    return v if -(2**31) <= v < 2**31 else None


def _wg_line(line: str) -> WinograndeTask | str:
    """One CSV line as ``load_winogrande_from_csv`` reads it, or why it skips it."""
    commas: list[int] = []
    quote = False
    for i, c in enumerate(line):
        if quote:
            quote = c != '"'
        elif c == ",":
            commas.append(i)
            if len(commas) == 4:
                break
        elif c == '"':
            quote = True
    if len(commas) != 4:
        return "it does not have 5 comma-separated fields (index,sentence,option1,option2,answer)"
    c0, c1, c2, c3 = commas
    sentence = line[c0 + 2 : c1 - 1] if line[c0 + 1] == '"' else line[c0 + 1 : c1]
    where = sentence.find("_")
    if where < 0:
        return f"the sentence has no _: {sentence!r}"
    answer = _wg_answer(line[c3 + 1 :])
    if answer is None or not 1 <= answer <= 2:
        return f"the answer must be 1 or 2, not {line[c3 + 1 :]!r}"
    return WinograndeTask(sentence[:where], sentence[where + 1 :], (line[c1 + 1 : c2], line[c2 + 1 : c3]), answer)


def read_winogrande(text: str) -> list[WinograndeTask]:
    """The tasks of a Winogrande CSV (``index,sentence,option1,option2,answer``, a sentence
    with a ``,`` in double quotes, as llama.cpp's ``winogrande-debiased-eval.csv``), read as
    llama-perplexity reads its ``-f`` file: one trailing newline dropped, then lines up to
    the last newline (``std::getline`` hits the end on the last line and the loop stops:
    the file's last line is never read). Fields are cut at the first 4 commas outside
    double quotes; a sentence in quotes loses its first and last character, the options
    are kept as written; the sentence is cut at its first ``_``.

    llama-perplexity logs and skips a line it cannot read; here the first line is skipped
    that way (the header) and any later one raises :class:`llama_cffi.ParamError`, naming the line
    (a skipped line changes which tasks are drawn)."""
    expect("text", text, str, "the file's text (str)")
    if text.endswith("\n"):
        text = text[:-1]
    tasks = []
    for n, line in enumerate(text.split("\n")[:-1], start=1):
        got = _wg_line(line)
        if isinstance(got, str):
            if n == 1:
                continue
            raise ParamError(f"line {n}: {got}")
        tasks.append(got)
    if not tasks:
        raise ParamError("no tasks (llama-perplexity reads none of the file's lines but the last one)")
    return tasks


@dataclass(frozen=True)
class WinograndeResult:
    """The tasks scored, in the order they were drawn: each a :class:`TaskScore` whose
    ``gold`` and ``chosen`` are 0-based (the file's answer minus one) and whose ``scores``
    are the two options' mean log-probabilities of the scored tokens (nats, float32 values).
    ``str()`` is llama-perplexity's final line (which it prints from 100 tasks on)."""

    tasks: tuple[TaskScore, ...]

    @property
    def correct(self) -> int:
        return sum(t.correct for t in self.tasks)

    @property
    def accuracy(self) -> float:
        return self.correct / len(self.tasks)

    def score(self) -> tuple[float, float]:
        """``(100 p, sigma)``: the accuracy in percent and its standard error
        ``100 sqrt(p (1 - p) / (n - 1))`` (percentage points), as llama-perplexity rounds
        them (float32)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            n = np.float32(len(self.tasks))
            p = np.float32(self.correct) / n
            var = float(p * (np.float32(1) - p) / (n - np.float32(1)))
        sigma = np.float32(100.0 * math.sqrt(var) if var >= 0 else math.nan)
        return float(np.float32(100) * p), float(sigma)

    def running(self) -> list[str]:
        """The lines llama-perplexity prints as it goes, one per task: its number, the
        running accuracy (%), the two scores, the option chosen and the answer."""
        out, acc = [], 0
        for i, t in enumerate(self.tasks, start=1):
            acc += t.correct
            out.append(_wg_running_line(i, acc, t))
        return out

    def final_lines(self) -> list[str]:
        """The score line llama-perplexity prints at the end, or none below 100 tasks."""
        return [str(self)] if len(self.tasks) >= 100 else []

    def __str__(self) -> str:
        p, sigma = self.score()
        return f"Final Winogrande score({len(self.tasks)} tasks): {p:.4f} +/- {sigma:.4f}"


def _wg_running_line(i: int, n_correct: int, t: TaskScore) -> str:
    s1, s2 = t.scores
    return f"{i}\t{100.0 * n_correct / i:.4f}\t{s1:10.6f}  {s2:10.6f}  {t.chosen + 1}  {t.gold + 1}"


def winogrande(
    model: Model,
    text_or_tasks: str | Sequence[WinograndeTask],
    n_tasks: int = 0,
    *,
    ctx_size: int = 512,
    n_batch: int = 2048,
    n_parallel: int = 1,
    n_threads: int | None = None,
    progress: Callable[[int, int, float], None] | None = None,
    on_task: Callable[[TaskScore], None] | None = None,
) -> WinograndeResult:
    """The Winogrande score, as ``llama-perplexity --winogrande --winogrande-tasks N -c
    CTX_SIZE -b N_BATCH -np N_PARALLEL`` computes it (``winogrande_score()``).

    ``text_or_tasks``: a CSV file's text (:func:`read_winogrande`) or its tasks.
    ``n_tasks``: 0 (llama.cpp's default) or at least the number of tasks: all of them, in
    the file's order; fewer: that many drawn at random (see the module docstring).
    Each option's sentence is tokenized with BOS; the tokens both share are decoded once
    for the two sequences. When each sentence has more than 3 tokens after the shared
    ones, an option's score is the mean log-probability of the tokens after the option
    (``first + option`` tokenized on its own gives where they start), the last one left
    out when there are two or more; otherwise from the first token after the shared part
    (and then, as llama.cpp does, the second option's first token is read from the first
    sentence's last row: its FIXME). The option with the higher score (the second on a
    tie) is chosen. Tasks are packed two sequences each into the context while they fit,
    decoded in ``n_batch`` chunks from an empty memory.

    Log-probabilities are llama.cpp's float32 arithmetic, its float32 sum of the
    ``expf(logit - max)`` in vocabulary order included (so the scores printed to 6
    decimals are its own); the ``expf`` values in that sum are a float64 ``exp`` rounded to
    float32, which differs from glibc's ``expf`` by one ulp in about 1 value in 11,500: a
    row's sum then moves by an ulp in rare rows (about 1e-7 nats), and a printed score in
    its 6th decimal more rarely still (not seen in the tests). ``progress(done, total,
    accuracy)`` and ``on_task(score)`` after each task."""
    expect("model", model, Model, "a llama_cffi.Model")
    _check_callbacks(progress=progress, on_task=on_task)
    if isinstance(text_or_tasks, str):
        tasks = read_winogrande(text_or_tasks)
    else:
        what = "the file's text (a str) or a sequence of WinograndeTask"
        tasks = list(expect_iterable("text_or_tasks", text_or_tasks, what))
        for i, t in enumerate(tasks):
            expect(f"tasks[{i}]", t, WinograndeTask, "a WinograndeTask")
            if len(t.options) != 2 or t.answer not in (1, 2):
                raise ParamError(f"tasks[{i}] needs 2 options and an answer of 1 or 2")
        if not tasks:
            raise ParamError("no tasks")
    n_tasks = expect_int("n_tasks", n_tasks)
    if n_tasks < 0:
        raise ParamError(f"n_tasks must be >= 0 (0: all), not {n_tasks}")
    params = _eval_context_params(ctx_size, n_batch, n_parallel, n_threads)
    order = _draw_swap(len(tasks), n_tasks) if 0 < n_tasks < len(tasks) else list(range(len(tasks)))
    with model.context(**params) as ctx, _pool() as pool:
        return _winogrande(ctx, tasks, order, pool, progress, on_task)


@dataclass
class _WgPrepared:
    seqs: tuple[list[int], list[int]]
    prefix: int
    required: int
    pairs: list[tuple[int, int]]  # (row offset in the task's rows, token), the first option's then the second's
    counts: tuple[int, int]


def _wg_prepare(vocab: Vocab, t: WinograndeTask, idx: int) -> _WgPrepared:
    s = (_tokenize(vocab, t.first + t.options[0] + t.second), _tokenize(vocab, t.first + t.options[1] + t.second))
    cp = _common_prefix(s)
    if cp == 0 or cp == len(s[0]) or cp == len(s[1]):
        raise ParamError(
            f"task {idx}: the two sentences must share a first token (BOS) and each add a token of its own"
        )
    skip = len(s[0]) - cp > 3 and len(s[1]) - cp > 3
    pairs: list[tuple[int, int]] = []
    counts = []
    for k in range(2):
        base = len(_tokenize(vocab, t.first + t.options[k])) if skip else cp
        if not cp <= base < len(s[k]):
            raise ParamError(
                f"task {idx}: option {k + 1} leaves no token to score after it "
                f"({base} tokens up to the option, {len(s[k])} in the sentence, {cp} shared)"
            )
        last = 1 if len(s[k]) - base > 1 else 0
        li = base - cp if k == 0 else len(s[0]) - cp + base - cp
        for j in range(base - 1, len(s[k]) - 1 - last):
            pairs.append((li, s[k][j + 1]))
            li += 1
        counts.append(len(s[k]) - base - last)
    return _WgPrepared(s, cp, cp + len(s[0]) - cp + len(s[1]) - cp, pairs, (counts[0], counts[1]))


def _winogrande(
    ctx: Context,
    tasks: list[WinograndeTask],
    order: list[int],
    pool: ThreadPoolExecutor | None,
    progress: Callable[[int, int, float], None] | None,
    on_task: Callable[[TaskScore], None] | None,
) -> WinograndeResult:
    vocab = ctx.model.vocab
    prep = [_wg_prepare(vocab, tasks[idx], idx) for idx in order]
    n_ctx = ctx.n_ctx
    max_seq = min(2 * 128, ctx.n_seq_max)
    batch = Batch(n_ctx, n_seq_max=2)
    scored: list[TaskScore] = []
    n_correct = 0
    i0 = 0
    while i0 < len(order):
        n_cur, i1, n = 0, i0, 0
        starts: list[int] = []  # each task's first output row
        n_rows = 0
        while n_cur + prep[i1].required <= n_ctx:
            s0 = 2 * (i1 - i0)
            if s0 + 2 > max_seq:
                break
            pr = prep[i1]
            for j in range(pr.prefix):
                batch.token[n], batch.pos[n], batch.n_seq_id[n] = pr.seqs[0][j], j, 2
                batch.seq_id[n, :2] = [s0, s0 + 1]
                batch.logits[n] = 1 if j == pr.prefix - 1 else 0
                n += 1
            starts.append(n_rows)
            n_rows += 1
            for s in range(2):
                for j in range(pr.prefix, len(pr.seqs[s])):
                    batch.token[n], batch.pos[n], batch.n_seq_id[n] = pr.seqs[s][j], j, 1
                    batch.seq_id[n, 0] = s0 + s
                    batch.logits[n] = 1
                    n += 1
                    n_rows += 1
            n_cur += pr.required
            i1 += 1
            if i1 == len(order):
                break
        if i1 == i0:
            raise ParamError(
                f"task {order[i0]} does not fit in the context (it needs {prep[i0].required} cells of {n_ctx})"
            )
        ctx.memory.clear(True)
        rows = _decode_chunks(ctx, batch, n, ctx.n_batch)
        pairs = [(starts[k] + li, tok) for k in range(i1 - i0) for li, tok in prep[i0 + k].pairs]
        lps = _compute_logprobs(rows, pairs, pool)
        ir = 0
        for k in range(i1 - i0):
            pr = prep[i0 + k]
            scores = []
            for s in range(2):
                total = np.float32(0)
                for _ in range(pr.counts[s]):
                    total = np.float32(total + lps[ir])
                    ir += 1
                scores.append(np.float32(total / np.float32(pr.counts[s])))
            chosen = 0 if scores[0] > scores[1] else 1
            task = tasks[order[i0 + k]]
            score = TaskScore(order[i0 + k], task.answer - 1, chosen, (float(scores[0]), float(scores[1])))
            scored.append(score)
            n_correct += score.correct
            if on_task is not None:
                on_task(score)
            if progress is not None:
                progress(len(scored), len(order), n_correct / len(scored))
        i0 = i1
    return WinograndeResult(tuple(scored))


# ---------------------------------------------------------------------- multiple choice
@dataclass(frozen=True)
class MultipleChoiceTask:
    """A question (or a context to continue) and its ``answers`` (continuations), with
    ``labels`` (1 marks a right answer; llama.cpp's ``mc1``). ``mc2_answers`` and
    ``mc2_labels`` (answers with several right ones) are read and written but not scored,
    as in llama.cpp."""

    question: str
    answers: tuple[str, ...]
    labels: tuple[int, ...]
    mc2_answers: tuple[str, ...] = ()
    mc2_labels: tuple[int, ...] = ()


@dataclass(frozen=True)
class MultipleChoiceScore:
    """A scored task: its ``index`` in the file, the answers' ``labels``, the answer with
    the highest score (the first on a tie) and the ``scores`` (mean log-probability of
    each answer's tokens after the part all answers share, nats, float32 values)."""

    index: int
    chosen: int
    labels: tuple[int, ...]
    scores: tuple[float, ...]

    @property
    def correct(self) -> bool:
        return self.labels[self.chosen] == 1


def _f32_sigma(p: np.float32, n: int) -> np.float32:
    """``sqrt(p*(1-p)/(n-1))``: the argument in float32, C's (double) ``sqrt``, rounded to
    float32 (perplexity.cpp calls ``sqrt`` on a float and gets the double one)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        var = float(p * (np.float32(1) - p) / np.float32(n - 1))
    r: np.float32 = np.float32(math.sqrt(var) if var >= 0 else math.nan)
    return r


@dataclass(frozen=True)
class MultipleChoiceResult:
    """The tasks scored, in order. ``str()`` is llama-perplexity's ``Final result`` line.
    (It means to leave the final lines out below 100 drawn tasks, but tests the task count
    after setting it to the number drawn: it always prints them.)"""

    tasks: tuple[MultipleChoiceScore, ...]

    @property
    def correct(self) -> int:
        return sum(t.correct for t in self.tasks)

    @property
    def accuracy(self) -> float:
        return self.correct / len(self.tasks)

    def score(self) -> tuple[float, float]:
        """``(100 p, 100 sigma)``: the accuracy (%) and its standard error, float32 as
        llama-perplexity computes them."""
        p = np.float32(self.correct) / np.float32(len(self.tasks))
        return float(np.float32(100) * p), float(np.float32(100) * _f32_sigma(p, len(self.tasks)))

    def chance(self) -> tuple[float, float]:
        """``(100 p, 100 sigma)`` of a random choice: ``p`` is tasks over answers."""
        p = np.float32(len(self.tasks)) / np.float32(sum(len(t.scores) for t in self.tasks))
        return float(np.float32(100) * p), float(np.float32(100) * _f32_sigma(p, len(self.tasks)))

    def running(self) -> list[str]:
        """The lines llama-perplexity prints as it goes: the task's number and the running
        accuracy (%)."""
        out, acc = [], 0
        for i, t in enumerate(self.tasks, start=1):
            acc += t.correct
            out.append(f"{i}\t{100.0 * acc / i:.8f}")
        return out

    def final_lines(self) -> list[str]:
        """The lines it prints at the end: the result and random chance."""
        p, sigma = self.chance()
        return [str(self), f"Random chance: {p:.4f} +/- {sigma:.4f}"]

    def __str__(self) -> str:
        p, sigma = self.score()
        return f"Final result: {p:.4f} +/- {sigma:.4f}"


_MC_MAX_ANSWERS = 100  # multiple_choice_answers::deserialize reads no more


class _Reader:
    """``std::istream`` reads over the file's bytes, raising :class:`llama_cffi.ParamError` where it
    would fail."""

    def __init__(self, data: bytes, pos: int, what: str) -> None:
        self.data, self.pos, self.what = data, pos, what

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ParamError(f"{self.what}: the file ends at byte {len(self.data)}, inside it")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def string(self) -> str:
        return self.take(self.u32()).decode("utf-8", "surrogateescape")

    def answers(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        n = self.u32()
        if n > _MC_MAX_ANSWERS:
            raise ParamError(f"{self.what}: {n} answers (llama.cpp reads at most {_MC_MAX_ANSWERS})")
        answers = tuple(self.string() for _ in range(n))
        labels = tuple(int(x) for x in struct.unpack(f"<{n}i", self.take(4 * n)))
        return answers, labels


def read_multiple_choice(data: bytes) -> list[MultipleChoiceTask]:
    """The tasks of a multiple-choice file in llama.cpp's binary layout (little-endian:
    ``uint32`` task count, a ``uint32`` byte position per task, then each task: its
    question, then ``mc1`` and ``mc2``, each a ``uint32`` count of at most 100, that many
    answers and that many ``int32`` labels; a string is a ``uint32`` length and its bytes),
    as ``multiple_choice_score()`` reads them. Bytes after the last task are ignored.

    llama-perplexity reads the tasks one after the other when it takes them all and at
    their positions when it draws some; here each position must be where its task starts
    (so both read the same), else :class:`llama_cffi.ParamError`, as for a short file or over 100
    answers. Strings that are not UTF-8 keep their bytes (``surrogateescape``)."""
    expect("data", data, (bytes, bytearray, memoryview), "the file's bytes")
    data = bytes(data)
    if len(data) < 4:
        raise ParamError(
            f"no tasks: a multiple-choice file starts with its task count (4 bytes), not {len(data)} bytes"
        )
    n_task = int(struct.unpack_from("<I", data)[0])
    if n_task == 0:
        raise ParamError("no tasks (the file's task count is 0)")
    if len(data) < 4 + 4 * n_task:
        raise ParamError(f"the file has {n_task} tasks but ends before their {n_task} positions")
    positions = struct.unpack_from(f"<{n_task}I", data, 4)
    tasks = []
    r = _Reader(data, 4 + 4 * n_task, "")
    for i in range(n_task):
        if positions[i] != r.pos:
            raise ParamError(f"task {i}: its position is byte {positions[i]}, but it starts at byte {r.pos}")
        r.what = f"task {i} (at byte {r.pos})"
        question = r.string()
        answers, labels = r.answers()
        mc2, mc2_labels = r.answers()
        tasks.append(MultipleChoiceTask(question, answers, labels, mc2, mc2_labels))
    return tasks


def _check_mc_task(i: int, t: object) -> MultipleChoiceTask:
    t = expect(f"tasks[{i}]", t, MultipleChoiceTask, "a MultipleChoiceTask")
    assert isinstance(t, MultipleChoiceTask)
    expect(f"tasks[{i}].question", t.question, str, "a str")
    for name, answers, labels in (("answers", t.answers, t.labels), ("mc2_answers", t.mc2_answers, t.mc2_labels)):
        if len(answers) != len(labels):
            raise ParamError(f"tasks[{i}] has {len(answers)} {name} and {len(labels)} labels")
        if len(answers) > _MC_MAX_ANSWERS:
            raise ParamError(f"tasks[{i}] has {len(answers)} {name} (llama.cpp reads at most {_MC_MAX_ANSWERS})")
        for j, a in enumerate(answers):
            expect(f"tasks[{i}].{name}[{j}]", a, str, "a str")
        for j, lab in enumerate(labels):
            if not -(2**31) <= expect_int(f"tasks[{i}] label {j}", lab) < 2**31:
                raise ParamError(f"tasks[{i}] label {j} is out of int32's range: {lab}")
    return t


def write_multiple_choice(tasks: Sequence[MultipleChoiceTask]) -> bytes:
    """``tasks`` in llama.cpp's binary multiple-choice layout (see
    :func:`read_multiple_choice`, which reads them back)."""
    expect("tasks", tasks, Sequence, "a sequence of MultipleChoiceTask")
    tasks = [_check_mc_task(i, t) for i, t in enumerate(tasks)]

    def string(s: str) -> bytes:
        b = s.encode("utf-8", "surrogateescape")
        return struct.pack("<I", len(b)) + b

    def answers(a: tuple[str, ...], labels: tuple[int, ...]) -> bytes:
        return struct.pack("<I", len(a)) + b"".join(string(x) for x in a) + struct.pack(f"<{len(a)}i", *labels)

    bodies = [string(t.question) + answers(t.answers, t.labels) + answers(t.mc2_answers, t.mc2_labels) for t in tasks]
    pos, positions = 4 + 4 * len(tasks), []
    for b in bodies:
        positions.append(pos)
        pos += len(b)
    if pos > 0xFFFFFFFF:
        raise ParamError(f"the file would be {pos} bytes; its positions are uint32")
    return struct.pack(f"<I{len(tasks)}I", len(tasks), *positions) + b"".join(bodies)


def multiple_choice(
    model: Model,
    data: bytes | Sequence[MultipleChoiceTask],
    n_tasks: int = 0,
    *,
    ctx_size: int = 512,
    n_batch: int = 2048,
    n_parallel: int = 1,
    n_threads: int | None = None,
    progress: Callable[[int, int, float], None] | None = None,
    on_task: Callable[[MultipleChoiceScore], None] | None = None,
) -> MultipleChoiceResult:
    """The multiple-choice score (``acc_norm`` of ``mc1``: ARC, MMLU, TruthfulQA,
    HellaSwag files in llama.cpp's binary layout), as ``llama-perplexity
    --multiple-choice --multiple-choice-tasks N -c CTX_SIZE -b N_BATCH -np N_PARALLEL``
    computes it (``multiple_choice_score()``).

    ``data``: the file's bytes (:func:`read_multiple_choice`) or its tasks. ``n_tasks``: 0
    (llama.cpp's default) or at least the number of tasks: all of them, in order; fewer:
    that many drawn at random, as :func:`winogrande` draws them. Each
    answer is tokenized as ``question + " " + answer`` with BOS; the tokens all answers
    share are decoded once (one sequence an answer, so a task needs ``max(4, n_parallel)``
    at least as large as its answer count, else :class:`llama_cffi.ParamError` as llama.cpp stops);
    an answer's score is the mean log-probability of its tokens after the shared part, in
    float32 (the first from ``softmax()`` of the shared part's last row, the others as
    ``compute_logprobs`` computes them: see :func:`winogrande` on ``expf``), and the task
    counts when the answer with the highest score (the first on a tie) has label 1. Tasks
    are packed into the context while they fit and the sequences last (at most 128),
    decoded in ``n_batch`` chunks from an empty memory. ``progress(done, total,
    accuracy)`` and ``on_task(score)`` after each task."""
    expect("model", model, Model, "a llama_cffi.Model")
    _check_callbacks(progress=progress, on_task=on_task)
    if isinstance(data, (bytes, bytearray, memoryview)):
        tasks = read_multiple_choice(bytes(data))
    else:
        expect("data", data, Sequence, "the file's bytes or a sequence of MultipleChoiceTask")
        tasks = [_check_mc_task(i, t) for i, t in enumerate(data)]
        if not tasks:
            raise ParamError("no tasks")
    n_tasks = expect_int("n_tasks", n_tasks)
    if n_tasks < 0:
        raise ParamError(f"n_tasks must be >= 0 (0: all), not {n_tasks}")
    params = _eval_context_params(ctx_size, n_batch, n_parallel, n_threads)
    order = _draw_swap(len(tasks), n_tasks) if 0 < n_tasks < len(tasks) else list(range(len(tasks)))
    with model.context(**params) as ctx, _pool() as pool:
        return _multiple_choice(ctx, tasks, order, pool, progress, on_task)


def _mc_prepare(vocab: Vocab, t: MultipleChoiceTask, idx: int) -> tuple[list[list[int]], int]:
    """``multiple_choice_prepare_one_task``: each answer's tokens and the shared prefix."""
    if not t.question or not t.answers:
        raise ParamError(f"task {idx}: the question or the answers are empty")
    seqs = []
    for j, a in enumerate(t.answers):
        if not a:
            raise ParamError(f"task {idx}: answer {j} is empty")
        seqs.append(_tokenize(vocab, t.question + " " + a))
    cp = _common_prefix(seqs)
    if cp == 0 or any(len(s) == cp for s in seqs):
        raise ParamError(f"task {idx}: the answers must share a first token (BOS) and each add a token of its own")
    return seqs, cp


def _multiple_choice(
    ctx: Context,
    tasks: list[MultipleChoiceTask],
    order: list[int],
    pool: ThreadPoolExecutor | None,
    progress: Callable[[int, int, float], None] | None,
    on_task: Callable[[MultipleChoiceScore], None] | None,
) -> MultipleChoiceResult:
    vocab = ctx.model.vocab
    prep = [_mc_prepare(vocab, tasks[idx], idx) for idx in order]
    required = [cp + sum(len(s) - cp for s in seqs) for seqs, cp in prep]
    n_ctx = ctx.n_ctx
    max_seq = min(4 * 32, ctx.n_seq_max)
    batch = Batch(n_ctx, n_seq_max=max(len(seqs) for seqs, _ in prep))
    scored: list[MultipleChoiceScore] = []
    n_correct = 0
    i0 = 0
    while i0 < len(order):
        n_cur, i1, n, s0, n_rows = 0, i0, 0, 0, 0
        starts: list[int] = []  # each task's first output row (the shared part's last)
        while n_cur + required[i1] <= n_ctx:
            seqs, cp = prep[i1]
            na = len(seqs)
            if s0 + na > max_seq:
                if s0 == 0:
                    raise ParamError(
                        f"task {order[i0]} has {na} answers, one sequence each: it needs n_parallel >= {na} "
                        f"(this context has {max_seq})"
                    )
                break
            for j in range(cp):
                batch.token[n], batch.pos[n], batch.n_seq_id[n] = seqs[0][j], j, na
                batch.seq_id[n, :na] = range(s0, s0 + na)
                batch.logits[n] = 1 if j == cp - 1 else 0
                n += 1
            starts.append(n_rows)
            n_rows += 1
            for s, toks in enumerate(seqs):
                for j in range(cp, len(toks)):
                    out = j < len(toks) - 1
                    batch.token[n], batch.pos[n], batch.n_seq_id[n] = toks[j], j, 1
                    batch.seq_id[n, 0] = s0 + s
                    batch.logits[n] = out
                    n += 1
                    n_rows += out
            s0 += na
            n_cur += required[i1]
            i1 += 1
            if i1 == len(order):
                break
        if i1 == i0:
            raise ParamError(f"task {order[i0]} does not fit in the context (it needs {required[i0]} cells of {n_ctx})")
        ctx.memory.clear(True)
        rows = _decode_chunks(ctx, batch, n, ctx.n_batch)
        pairs = []
        for k in range(i1 - i0):
            seqs, cp = prep[i0 + k]
            li = starts[k] + 1
            for toks in seqs:
                for j in range(cp, len(toks) - 1):
                    pairs.append((li, toks[j + 1]))
                    li += 1
        lps = _compute_logprobs(rows, pairs, pool)
        ir = 0
        for k in range(i1 - i0):
            seqs, cp = prep[i0 + k]
            firsts = _softmax_logprob(rows[starts[k]], [toks[cp] for toks in seqs])
            scores = []
            for s, toks in enumerate(seqs):
                total = firsts[s]
                for _ in range(cp, len(toks) - 1):
                    total = np.float32(total + lps[ir])
                    ir += 1
                scores.append(np.float32(total / np.float32(len(toks) - cp)))
            chosen = 0
            for s in range(1, len(scores)):
                if scores[s] > scores[chosen]:
                    chosen = s
            task = tasks[order[i0 + k]]
            score = MultipleChoiceScore(order[i0 + k], chosen, task.labels, tuple(float(x) for x in scores))
            scored.append(score)
            n_correct += score.correct
            if on_task is not None:
                on_task(score)
            if progress is not None:
                progress(len(scored), len(order), n_correct / len(scored))
        i0 = i1
    return MultipleChoiceResult(tuple(scored))
