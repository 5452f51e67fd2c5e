"""llama-perplexity's evaluation modes, computed as ``tools/perplexity/perplexity.cpp``
computes them (pinned commit): HellaSwag (``--hellaswag``).

HellaSwag (``hellaswag_score()`` there): the file holds 6 lines per task (the context,
the index of the gold ending, four endings, as llama.cpp's ``hellaswag_val_full.txt``);
``n_tasks`` tasks are drawn at random with ``std::mt19937(1)`` (each drawn task removed
from the pool), each ending is tokenized as ``context + " " + ending`` with BOS, the
tokens the four share are decoded once for the four sequences (one KV cell each, shared)
and each ending's own tokens in its sequence; an ending's score is the mean
log-probability of its tokens after the shared part (the first from ``softmax`` of the
shared part's last row, the others as ``compute_logprobs`` does, in float32 but for the
sum of the exps, in float64 here: scores agree to about 1e-6),
and a task counts when the gold ending has the highest score (``acc_norm``, with a
Wilson 95% interval). Tasks are packed into one batch while they fit in the context and
its ``n_seq_max`` (4 sequences a task), and the batch is decoded in ``n_batch`` chunks
from an empty memory, as ``decode_helper`` does, so the rows are llama-perplexity's own.

The context is made as llama-perplexity makes it for these modes: ``n_seq_max =
max(4, n_parallel)``, ``n_ctx = n_seq_max * ctx_size``, ``n_batch = min(n_batch,
n_ctx)``, a unified KV cache.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from llama_cffi import Batch, Context, Model, ParamError
from llama_cffi._args import expect, expect_int
from llama_cffi.kernels import softmax_sum

__all__ = ["EvalTask", "HellaswagResult", "TaskScore", "hellaswag", "read_hellaswag", "wilson_interval"]

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


def _first_logprobs(row: npt.NDArray[np.float32], tokens: list[int], scratch: npt.NDArray[np.float32]) -> list[float]:
    """``log(softmax(row)[t])`` for each of ``tokens``, as perplexity.cpp's ``softmax()``:
    float32 exps, summed in float64 (once for the row), each probability rounded to float32
    and its ``log`` in float32."""
    m = float(row.max())
    s = softmax_sum(row, m, scratch)
    return [float(np.log(np.float32(float(scratch[t]) / s))) for t in tokens]


def _logprob(row: npt.NDArray[np.float32], token: int, scratch: npt.NDArray[np.float32]) -> float:
    """``compute_logprobs()``: ``logit - max - log(sum)`` in float32 (the sum of the exps
    in float64 here, in float32 there: they agree to about 1e-6 at 262,144 tokens)."""
    m = np.float32(row.max())
    s = softmax_sum(row, float(m), scratch)
    return float(np.float32(row[token] - m) - np.log(np.float32(s)))


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
    tasks = read_hellaswag(text) if isinstance(text, str) else list(text)
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
    with model.context(**params) as ctx:
        return _hellaswag(ctx, tasks, _draw(len(tasks), n_tasks), progress)


def _hellaswag(
    ctx: Context, tasks: list[EvalTask], order: list[int], progress: Callable[[int, int, float], None] | None
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
        scratch = np.empty(rows.shape[1], dtype=np.float32)
        # the output rows in batch order: map batch index -> row
        out_of = np.cumsum(batch.logits[:n]) - 1
        for k, i in enumerate(range(i0, i1)):
            toks, p = seqs[i], prefix[i]
            firsts_lp = _first_logprobs(rows[out_of[firsts[k]]], [toks[s][p] for s in range(4)], scratch)
            base = firsts[k] + 1
            scores = []
            for s in range(4):
                total, count = firsts_lp[s], 1
                for j in range(p, len(toks[s]) - 1):
                    total += _logprob(rows[out_of[base + (j - p)]], toks[s][j + 1], scratch)
                    count += 1
                base += len(toks[s]) - p
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
