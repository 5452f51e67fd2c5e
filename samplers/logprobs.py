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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from llama_cffi._args import expect, type_error
from llama_cffi.errors import ParamError
from llama_cffi.kernels import _GROUPS, _group_max, _top_k_grouped, softmax_sum

from .base import check_context
from .candidates import _stable_top
from .measure import _buffers, _check_base, _values_problem

if TYPE_CHECKING:
    from llama_cffi import Context, Vocab

__all__ = ["LogprobReader", "Score", "TokenLogprob", "TopToken", "score"]


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


class LogprobReader:
    """Turns logits rows into :class:`TokenLogprob` records, for your own generation loop
    (the helpers keep one per call). ``top``: how many alternatives per token; ``unit``:
    ``"nats"`` or ``"bits"``. Caches each token's piece it reads."""

    def __init__(self, vocab: Vocab, top: int = 0, unit: Literal["nats", "bits"] = "nats") -> None:
        from llama_cffi import Vocab

        expect("vocab", vocab, Vocab, "a llama_cffi.Vocab")
        if isinstance(top, bool) or not isinstance(top, int) or top < 0:
            raise ParamError(f"top_logprobs must be an int >= 0, not {top!r}")
        try:
            self.div = _check_base(unit)
        except ValueError as e:
            raise ParamError(f"unit must be 'nats' or 'bits', not {unit!r}") from e
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
        if not isinstance(row, np.ndarray):
            raise type_error("row", "a float32 numpy array (a row of logits)", row)
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
        raw, text = self.piece(token)
        return TokenLogprob(token, text, lp(token), top, raw)

    def from_surprisal(self, token: int, nats: float) -> TokenLogprob:
        """A record from a surprisal already measured (no alternatives)."""
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
        toks = vocab.check_tokens(text)
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
    finally:
        del rows, out  # no raw array into the context's buffer outlives the call
    return Score(tuple(int(t) for t in c), records, len(p), unit)
