"""Log-probabilities of tokens under the model: one record type for every place that
reports them, and :func:`~samplers.logprobs.score` for a continuation of a prompt.

:class:`TokenLogprob` is what :func:`score`, :func:`samplers.search.complete`,
:func:`samplers.search.stream` (its :attr:`~samplers.search.Stream.result`),
:func:`~samplers.search.best_of_n` and :func:`~samplers.search.beam_search` return per
token: the token, its text, its log-probability and, when asked for, the ``top`` most
likely tokens of the same distribution (OpenAI's ``top_logprobs``).

Units and numerics
    Log-probabilities are of the **model's** distribution, ``softmax(logits)`` (not of
    the sampler's truncated or tempered one), computed as :func:`samplers.measure.surprisal`
    computes them (``logprob == -surprisal`` to the last bit): natural logs (``"nats"``)
    unless ``unit="bits"``. A token whose logit is ``-inf`` has ``logprob == -inf``.

Ownership
    Records hold Python values only: no reference to a context's logits survives a call.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from llama_cffi._args import expect, expect_iterable, expect_number, type_error
from llama_cffi.errors import ParamError
from llama_cffi.kernels import _GROUPS, _group_max, _top_k_grouped, softmax_sum

from .base import check_context
from .candidates import _stable_top
from .measure import _buffers, _check_base, _values_problem

if TYPE_CHECKING:
    from llama_cffi import Context, Vocab

    from .branch import BranchStore

__all__ = ["LogprobReader", "Score", "TokenLogprob", "TopToken", "score", "score_many"]


@dataclass(frozen=True)
class TopToken:
    """One of the most likely tokens of a distribution."""

    token: int
    #: the token's text (bytes that are not whole UTF-8 characters are shown as U+FFFD)
    piece: str
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """A token and its log-probability under the model (in the unit it was asked in)."""

    token: int
    #: the token's text (``piece_bytes`` holds it exactly, for a token that is part of a character)
    piece: str
    logprob: float
    #: the most likely tokens of the distribution this token was drawn from, most likely
    #: first (ties: lower id first); empty unless asked for. It includes ``token`` when
    #: ``token`` is among them.
    top: tuple[TopToken, ...] = ()
    #: the token's bytes, exactly
    piece_bytes: bytes = field(default=b"", repr=False)

    @property
    def surprisal(self) -> float:
        """``-logprob``."""
        return -self.logprob


def _check_unit(unit: object) -> float:
    """The divisor of ``unit`` (``"nats"`` or ``"bits"``); anything else names ``unit``."""
    if unit == "nats" or unit == "bits":
        return _check_base(unit)
    if not isinstance(unit, str):
        raise type_error("unit", "'nats' or 'bits'", unit)
    raise ParamError(f"unit must be 'nats' or 'bits', not {unit!r}")


class LogprobReader:
    """Turns logits rows into :class:`TokenLogprob` records, for your own generation loop
    (the helpers keep one per call). ``top``: how many alternatives per token; ``unit``:
    ``"nats"`` or ``"bits"``. Caches each token's piece it reads."""

    def __init__(self, vocab: Vocab, top: int = 0, unit: Literal["nats", "bits"] = "nats") -> None:
        from llama_cffi import Vocab

        expect("vocab", vocab, Vocab, "a llama_cffi.Vocab")
        if isinstance(top, bool) or not isinstance(top, int):
            raise type_error("top (top_logprobs)", "an int >= 0", top)
        if top < 0:
            raise ParamError(f"top_logprobs must be an int >= 0, not {top!r}")
        self.div = _check_unit(unit)
        self.vocab = vocab
        self.top = top
        self.unit = unit
        self._pieces: dict[int, tuple[bytes, str]] = {}
        self._idx = np.empty(top, np.intp)  # the top tokens' ids, reused per row

    def piece(self, token: int) -> tuple[bytes, str]:
        p = self._pieces.get(token)
        if p is None:
            raw = self.vocab.token_to_piece(token, special=True)
            p = self._pieces[token] = (raw, raw.decode("utf-8", errors="replace"))
        return p

    def read(self, row: npt.NDArray[np.float32], token: int) -> TokenLogprob:
        """The record of ``token`` drawn from ``softmax(row)`` (``row``: float32, 1-D,
        contiguous; read during the call only)."""
        return self.read_many(row, (token,))[0]

    def read_many(self, row: npt.NDArray[np.float32], tokens: Sequence[int]) -> list[TokenLogprob]:
        """:meth:`read` of each of ``tokens`` from the same row: its maximum, normaliser
        and top list computed once."""
        if not isinstance(row, np.ndarray):
            raise type_error("row", "a float32 numpy array (a row of logits)", row)
        if type(tokens) is not tuple and not isinstance(tokens, Iterable):
            raise type_error("tokens", "a sequence of token ids", tokens)
        n = row.shape[0]
        k = min(self.top, n)
        cols = n // _GROUPS
        scratch, spare = _buffers(n)
        # top lists at a large vocabulary: the C kernel reads only the groups of 64 whose
        # max reaches the k-th largest group max (36 us where argpartition took 356 at
        # 262,144 tokens and top 5); the pass that makes the group maxima gives the max
        grouped = 0 < k and k * 8 <= cols
        m = _group_max(row, spare[:cols]) if grouped else float(row.max())
        problem = _values_problem(m)
        if problem is not None:
            raise problem
        log_s = math.log(softmax_sum(row, m, scratch))
        div = self.div

        def lp(t: int) -> float:
            lt = float(row[t])
            # the same arithmetic as measure.surprisal: -((m - l_t) + log s)
            return -math.inf if lt == -math.inf else -((m - lt) + log_s) / div

        top: tuple[TopToken, ...] = ()
        if k:
            if grouped:
                order = _top_k_grouped(row, spare[:cols], k, self._idx).tolist()
            else:
                order = _stable_top(row, np.arange(n), k).tolist()
            top = tuple(TopToken(i, self.piece(i)[1], lp(i)) for i in order)
        out = []
        for token in tokens:
            raw, text = self.piece(token)
            out.append(TokenLogprob(token, text, lp(token), top, raw))
        return out

    def from_surprisal(self, token: int, nats: float) -> TokenLogprob:
        """A record from a surprisal already measured (no alternatives)."""
        if type(nats) is not float:
            nats = expect_number("nats", nats)
        raw, text = self.piece(token)
        return TokenLogprob(token, text, -nats / self.div, (), raw)


@dataclass(frozen=True)
class Score:
    """The log-probability of a continuation given a prompt (:func:`score`)."""

    #: the continuation's tokens
    tokens: tuple[int, ...]
    #: one record per continuation token
    logprobs: tuple[TokenLogprob, ...]
    #: the prompt's length in tokens
    prompt_tokens: int
    #: ``"nats"`` or ``"bits"``
    unit: str = "nats"
    #: whether every continuation token is the most likely token of its row (the lowest
    #: id among equal maxima, as ``argmax`` picks): lm-evaluation-harness's ``is_greedy``
    greedy: bool = False

    @property
    def total(self) -> float:
        """The continuation's log-probability: the sum of its tokens' (in ``unit``)."""
        return math.fsum(t.logprob for t in self.logprobs)

    @property
    def mean_surprisal(self) -> float:
        """``-total / len(tokens)`` (in ``unit``)."""
        return -self.total / len(self.tokens)

    @property
    def perplexity(self) -> float:
        """``exp`` of the mean surprisal in nats (the same in either unit)."""
        nats = self.mean_surprisal * (_check_base(self.unit))
        return math.exp(nats) if nats < 709.0 else math.inf


_Tokens = str | Sequence[int] | npt.NDArray[np.integer[Any]]


def _tokens(vocab: Vocab, text: _Tokens, add_special: bool, what: str) -> npt.NDArray[np.int32]:
    if isinstance(text, str):
        toks = vocab.tokenize(text, add_special=add_special)
    else:
        toks = vocab.check_tokens(text, what)
    if len(toks) == 0:
        raise ParamError(f"the {what} has no tokens")
    return np.asarray(toks, dtype=np.int32)


def score(
    ctx: Context,
    prompt: _Tokens,
    continuation: _Tokens,
    *,
    top_logprobs: int = 0,
    unit: Literal["nats", "bits"] = "nats",
    seq_id: int = 0,
) -> Score:
    """How likely the model finds ``continuation`` after ``prompt``: each continuation
    token's log-probability (and its ``top_logprobs`` most likely alternatives), their
    total, the mean surprisal and the perplexity.

    One batched decode (``ctx.decode`` splits it into ``n_batch`` chunks) of the prompt and
    the continuation but its last token, with logits for the rows that predict the
    continuation only. Sequence ``seq_id`` is cleared first and holds those tokens
    afterwards. Text is tokenized apart: the prompt with the model's special tokens
    (BOS), the continuation without; pass token ids to control the split yourself.

    Batch shape matters: llama.cpp's kernels round differently for different row counts,
    so these values can differ from decoding one token at a time (the tests bound the
    difference; the branches guide's "Tolerances" says when rows are bit-exact); they are
    bit-identical to any other decode of the same batch.

    Raises :class:`~llama_cffi.ParamError` for an empty prompt or continuation, an
    :class:`~llama_cffi.InvalidTokenError` for ids outside the vocabulary, and the
    decode's typed errors (a sequence longer than the context, a model that cannot
    decode)."""
    check_context(ctx)
    vocab = ctx.model.vocab
    reader = LogprobReader(vocab, top_logprobs, unit)
    p = _tokens(vocab, prompt, True, "prompt")
    c = _tokens(vocab, continuation, False, "continuation")
    toks = np.concatenate([p, c[:-1]])
    mask = np.zeros(len(toks), dtype=bool)
    mask[len(p) - 1 :] = True
    ctx.memory.seq_rm(seq_id, -1, -1)
    out: Any = ctx.decode(toks, pos=0, seq_id=seq_id, logits=mask)
    rows = np.asarray(out)
    try:
        records = tuple(reader.read(rows[i], int(t)) for i, t in enumerate(c))
        greedy = all(int(np.argmax(rows[i])) == int(t) for i, t in enumerate(c))
    finally:
        del rows, out  # no raw array into the context's buffer outlives the call
    return Score(tuple(int(t) for t in c), records, len(p), unit, greedy)


def score_many(
    store: BranchStore,
    pairs: Iterable[tuple[_Tokens, _Tokens]],
    *,
    top_logprobs: int = 0,
    unit: Literal["nats", "bits"] = "nats",
) -> list[Score]:
    """:func:`score` of many ``(prompt, continuation)`` pairs, in input order, each
    distinct prompt decoded once: its tokens belong to the sequences of all its
    continuations at once (one KV cell each, shared, as ``llama-perplexity --hellaswag``
    does), every continuation (but its last token) in a sequence of its own, packed into
    decodes of up to ``n_batch`` tokens. Each :class:`Score` says whether the
    continuation is the greedy one (``greedy``, lm-evaluation-harness's ``is_greedy``).

    ``store``: a :class:`~samplers.branch.BranchStore` whose free sequence ids are used
    (and emptied again); its live branches are left as they are. Its context should have
    ``kv_unified=True`` (a cell shared by several sequences; with one KV stream per
    sequence, or a recurrent model's state, each pair is decoded alone). A prompt with more continuations than free ids
    is decoded once per group of them.

    Tokenization as :func:`score`. The values equal :func:`score`'s of each pair alone
    bit for bit when a decode's rows are computed the same way in both (the conditions
    of the branches guide, "Tolerances": no weight repacking, at most 7 rows per
    micro-batch, one thread); otherwise up to that rounding."""
    from .branch import BranchStore

    expect("store", store, BranchStore, "a samplers.branch.BranchStore (BranchStore(ctx))")
    ctx = store.ctx
    vocab = ctx.model.vocab
    reader = LogprobReader(vocab, top_logprobs, unit)
    expect_iterable("pairs", pairs, "an iterable of (prompt, continuation) pairs")
    items: list[tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]] = []
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise type_error(f"pairs[{i}]", "a (prompt, continuation) pair", pair)
        p = _tokens(vocab, pair[0], True, f"prompt of pairs[{i}]")
        c = _tokens(vocab, pair[1], False, f"continuation of pairs[{i}]")
        if len(p) + len(c) - 1 > ctx.n_ctx_seq:
            raise ParamError(
                f"pairs[{i}]: prompt and continuation take {len(p) + len(c) - 1} positions; a sequence of this "
                f"context holds {ctx.n_ctx_seq} (n_ctx_seq)"
            )
        items.append((p, c))
    if not items:
        return []
    n_ids = store.available
    if n_ids == 0:
        from .branch import CapacityError

        raise CapacityError("score_many needs a free sequence id of the store: prune a branch")
    # a cell of several sequences: a unified KV cache; a recurrent state keeps one state
    # per sequence and cannot take a token for several
    shared = (ctx.n_seq_max == 1 or bool(ctx.params.c.kv_unified)) and not ctx.model.is_recurrent
    group_max = n_ids if shared else 1
    # units: a prompt and up to group_max of its continuations (pair indices), prompts in
    # the order they first appear
    by_prompt: dict[bytes, list[int]] = {}
    for i, (p, _) in enumerate(items):
        by_prompt.setdefault(p.tobytes(), []).append(i)
    units: list[list[int]] = []
    for idx in by_prompt.values():
        units += [idx[k : k + group_max] for k in range(0, len(idx), group_max)]
    records: list[list[TokenLogprob | None]] = [[None] * len(c) for _, c in items]
    greedy = [True] * len(items)
    ids: list[int] = []
    try:
        for _ in range(n_ids):
            ids.append(store._take_id())
        _score_units(store, items, units, ids, reader, records, greedy)
    finally:
        for sid in ids:
            ctx.memory.seq_rm(sid)
            store._give_id(sid)
    out = []
    for i, (p, c) in enumerate(items):
        recs = tuple(r for r in records[i] if r is not None)
        assert len(recs) == len(c)
        out.append(Score(tuple(int(t) for t in c), recs, len(p), unit, greedy[i]))
    return out


def _score_units(
    store: BranchStore,
    items: list[tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]],
    units: list[list[int]],
    ids: list[int],
    reader: LogprobReader,
    records: list[list[TokenLogprob | None]],
    greedy: list[bool],
) -> None:
    """Decode the units in order, packed: a unit's prompt tokens tagged with all its
    continuations' sequences, then each continuation's tokens in its own; a unit takes
    its ids when its first token is packed and gives them back after the decode of its
    last one."""
    from llama_cffi import Batch

    ctx = store.ctx
    cap = ctx.n_batch
    batch = Batch(cap, n_seq_max=max(len(u) for u in units))
    free = list(reversed(ids))
    # what each output row scores: (pair index, continuation offset) pairs
    targets: list[list[tuple[int, int]]] = []
    done_units: list[list[int]] = []  # ids to free after this decode
    n = 0

    def flush() -> None:
        nonlocal n
        if n == 0:
            return
        batch.n_tokens = n
        ctx.decode_batch(batch)
        rows = np.asarray(ctx.logits_all()) if targets else np.zeros((0, 0), dtype=np.float32)
        try:
            for r, tg in enumerate(targets):
                row = rows[r]
                best = int(np.argmax(row))
                toks = [int(items[i][1][k]) for i, k in tg]  # a prompt's last row serves all its continuations
                for (i, k), tok, rec in zip(tg, toks, reader.read_many(row, toks), strict=True):
                    records[i][k] = rec
                    if best != tok:
                        greedy[i] = False
        finally:
            del rows
        targets.clear()
        for sids in done_units:
            for sid in sids:
                ctx.memory.seq_rm(sid)
            free.extend(sids)
        done_units.clear()
        n = 0

    def put(tok: int, pos: int, seqs: list[int], tg: list[tuple[int, int]] | None) -> None:
        nonlocal n
        if n == cap:
            flush()
        batch.token[n] = tok
        batch.pos[n] = pos
        batch.n_seq_id[n] = len(seqs)
        batch.seq_id[n, : len(seqs)] = seqs
        batch.logits[n] = 1 if tg else 0
        if tg:
            targets.append(tg)
        n += 1

    for unit in units:
        if len(free) < len(unit):
            flush()
        sids = [free.pop() for _ in unit]
        p = items[unit[0]][0]
        last = len(p) - 1
        for j, t in enumerate(p.tolist()):
            put(t, j, sids, [(i, 0) for i in unit] if j == last else None)
        for i, sid in zip(unit, sids, strict=True):
            c = items[i][1].tolist()
            for k in range(len(c) - 1):
                put(c[k], len(p) + k, [sid], [(i, k + 1)])
        done_units.append(sids)
    flush()
