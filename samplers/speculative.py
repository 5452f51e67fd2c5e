"""Speculative decoding over branches: cheap drafts, checked by the target in one decode.

A :class:`Drafter` guesses up to ``k`` tokens that may follow a branch's history;
the target model decodes the pending token and the guesses in *one* batch (logits for
every row) and keeps the longest prefix its own sampler agrees with, plus one token of
its own. Every decode therefore commits at least one token and, when the guesses are
good, several.

    store = BranchStore(ctx)
    b = store.create(prompt)                      # greedy by default
    text = "".join(stream(b, 200, drafter=PromptLookup(max_draft=8)))

Two drafters: :class:`PromptLookup` (n-grams of the prompt and the text so far, the
statistics of llama.cpp's ``llama-lookup``) and :class:`DraftModel` (a second, smaller
model with a compatible vocabulary, its own KV cache kept in step with the branch).

**The output is the target's.** Verification (:func:`speculative_step`) is exact:

* ``"match"`` (the default): at each drafted position the target's sampler chooses a
  token exactly as plain generation would (same chain, same state, same random draws);
  a draft token is kept only when it is that choice, and the first disagreement
  becomes the next token. Greedy output is plain greedy output, token for token; a
  seeded sampled run draws the same random numbers as a plain run, so it reproduces
  the plain run's tokens (both when the rows are exact: see below).
* ``"rejection"``: speculative sampling (Leviathan et al. 2023, Chen et al. 2023) for a
  chain that ends in :class:`~samplers.Dist`: a draft token ``d`` drafted with
  probability ``q(d)`` is kept with probability ``min(1, p(d) / q(d))``, where ``p`` is
  the target chain's distribution (every sampler but the final draw, then softmax);
  on rejection the token is drawn from ``max(0, p - q)`` renormalised. The generated
  tokens are distributed as the target chain's, draws come from the chain's own
  seeded engine (runs are reproducible), and a drafter that *samples* its drafts
  (``DraftModel(sampler=...)``) gets a higher acceptance than with ``"match"``.
  ``"auto"`` uses it when the drafter gives its distributions and the chain ends in a
  draw, else ``"match"``.

Only committed tokens reach the branch: its sampler chain (penalties, DRY, grammar),
its perplexity tracker and its history see exactly the tokens plain generation would
have given them, measured on the logits row that produced each, and the KV cells of
rejected drafts are removed (``seq_rm``) before the step returns. With a grammar, drafts
are first checked against the branch's grammar matcher (accepted, then rolled back
with :meth:`~samplers.grammar.GrammarMatcher.rollback`) and cut at the first token it
refuses, so no decode is spent on rows that cannot be kept.

Model kinds: every generative kind. A recurrent or hybrid state cannot drop positions:
where llama.cpp supports rollback for the architecture and the context was made with
``n_rs_seq = k`` it keeps ``k`` earlier states (drafts are capped at ``k``); otherwise
the sequence's state is saved before each step and, when a draft is rejected, restored
and the committed tokens decoded again (llama.cpp's ``speculative-simple`` does the
same with checkpoints), which costs a second decode on rejection. A sliding-window
target rolls back within its window.

**Exactly equal, or up to rounding.** "The tokens of plain generation" assumes each row of
a verify decode is computed as a one-token decode computes it. llama.cpp's CPU kernels
round by the shape of a decode, so that holds, bit for bit, only when (1) the weights are
not repacked (``use_extra_bufts=False``), (2) a verify decode has at most 7 rows (``k <=
6`` drafts) for K-quant weights, which ggml multiplies with a tiled kernel from 8 rows,
(3) flash attention is on (llama.cpp's default, ``flash_attn_type="auto"``) and (4) a
one-token decode does not share a long cache out among threads (``n_threads=1``, or at
most 256 cells in use); ``docs/guide/branches.md`` ("Tolerances") has the details and
``tests/test_speculative.py`` checks each condition. Otherwise the output equals plain
output up to rounding, and can leave it near a tie (on the default model, 8 drafts leave
plain greedy output on a prompt where 6 do not).
"""

from __future__ import annotations

import copy
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from llama_cffi._args import (
    expect,
    expect_bool,
    expect_callable,
    expect_int,
    expect_iterable,
    expect_number,
    type_error,
)
from llama_cffi.errors import KvCacheFullError, ParamError, UnsupportedError
from llama_cffi.sampling import SamplingError

from .base import check_model
from .branch import Branch, BranchError, BranchStore, CapacityError, _sigint_deferred
from .candidates import Candidates
from .chain import SamplerChain, surprisal_of
from .selection import Dist, Greedy
from .truncation import TopK

if TYPE_CHECKING:
    from llama_cffi import Context, Model

__all__ = [
    "Draft",
    "DraftModel",
    "Drafter",
    "IncompatibleDraftError",
    "PromptLookup",
    "SpeculativeStats",
    "StepResult",
    "speculative_step",
    "vocab_compatibility",
]

Verify = Literal["auto", "match", "rejection"]

#: llama.cpp's limits for a draft vocabulary (``common/speculative.cpp``)
SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5


class IncompatibleDraftError(ParamError):
    """The draft model's vocabulary does not match the target's (see :func:`vocab_compatibility`)."""


# ---------------------------------------------------------------------- statistics
@dataclass
class SpeculativeStats:
    """What speculation did: ``decodes`` of the target (one per step and branch),
    ``drafted`` tokens proposed (and decoded), ``accepted`` of them, ``committed``
    tokens (accepted drafts plus the target's own), ``draft_seconds`` spent drafting."""

    decodes: int = 0
    drafted: int = 0
    accepted: int = 0
    committed: int = 0
    draft_seconds: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_decode(self) -> float:
        """committed / decodes: what each target decode bought (1.0 is plain decoding)."""
        return self.committed / self.decodes if self.decodes else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "decodes": self.decodes,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "committed": self.committed,
            "acceptance_rate": self.acceptance_rate,
            "tokens_per_decode": self.tokens_per_decode,
            "draft_seconds": self.draft_seconds,
        }

    def __str__(self) -> str:
        return (
            f"drafted {self.drafted}, accepted {self.accepted} ({100 * self.acceptance_rate:.1f}%), "
            f"{self.committed} tokens in {self.decodes} decodes ({self.tokens_per_decode:.2f} per decode)"
        )


# ---------------------------------------------------------------------- drafters
@dataclass(frozen=True)
class Draft:
    """Proposed tokens, and (for a drafter that samples) the distribution each was
    drawn from: ``dists[i] = (ids, p)`` with ``p`` summing to 1 over ``ids``. ``None``:
    the tokens were chosen deterministically (a point mass, ``q(d) = 1``)."""

    tokens: list[int]
    dists: list[tuple[npt.NDArray[np.int32], npt.NDArray[np.float64]]] | None = None


class Drafter(ABC):
    """Proposes tokens that may follow a history (the interface of
    :func:`speculative_step`). Subclass it with :meth:`draft`; override
    :meth:`feedback` to learn from what the target kept, :meth:`bind` to check the
    target model, :meth:`clone` for one drafter per branch (best-of-n)."""

    #: the most tokens one :meth:`draft` proposes
    max_draft: int = 8

    def __init__(self) -> None:
        self.stats = SpeculativeStats()

    def bind(self, model: Model) -> None:
        """Called with the target model before the first draft: raise if it cannot serve it."""
        check_model(model)

    @abstractmethod
    def draft(self, history: Sequence[int], n: int) -> Draft:
        """Up to ``n`` tokens that may follow ``history`` (every token of the branch: the
        prompt, the generated text and the token about to be decoded)."""
        _history(history)
        _count(n)
        raise NotImplementedError  # a drafter implements it

    def feedback(self, drafted: Sequence[int], n_accepted: int) -> None:
        """The target kept the first ``n_accepted`` of ``drafted``."""
        expect_iterable("drafted", drafted, "a sequence of token ids")
        if type(n_accepted) is not int:
            expect_int("n_accepted", n_accepted)

    def reset(self) -> None:  # noqa: B027 - optional hook
        """Forget per-history state (statistics stay)."""

    def clone(self) -> Drafter:
        """An independent drafter in the same state (fresh statistics), for another branch."""
        out = copy.deepcopy(self)
        out.stats = SpeculativeStats()
        return out


# llama.cpp's thresholds (common/ngram-cache.cpp), indexed by the n-gram's place in the
# list ngram_min..ngram_max (not by its size, as llama.cpp indexes them)
_LAX_SAMPLES = (2, 2, 1, 1)
_LAX_PERCENT = (66, 50, 50, 50)
_STRICT_SAMPLES = (4, 3, 2, 2)
_STRICT_PERCENT = (75, 66, 66, 66)
NGRAM_MAX = 4  # LLAMA_NGRAM_MAX
NGRAM_STATIC = 2  # LLAMA_NGRAM_STATIC: no draft from fewer tokens

_NgramCache = dict[tuple[int, ...], dict[int, int]]


class PromptLookup(Drafter):
    """Prompt-lookup drafting, as llama.cpp's ``llama-lookup``: counts of which token
    followed each n-gram (``ngram_min``..``ngram_max`` tokens, at most 4) of the history
    (prompt and generated text, updated as tokens are committed); a draft extends the
    history one token at a time with the most frequent follower of its longest n-gram
    that has been seen often and decisively enough (llama.cpp's "lax" thresholds: a
    1- or 2-gram needs 2 sightings, 66 or 50% of them; longer ones 1 and 50%).

    ``dynamic=True`` keeps the statistics of earlier histories (llama.cpp's dynamic
    n-gram cache, consulted with its "strict" thresholds when the current history has
    no answer): useful when one drafter serves many similar generations.
    """

    def __init__(self, ngram_min: int = 1, ngram_max: int = 4, max_draft: int = 8, dynamic: bool = False) -> None:
        super().__init__()
        for name, v in (("ngram_min", ngram_min), ("ngram_max", ngram_max), ("max_draft", max_draft)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ParamError(f"{name} must be an int, not {v!r}")
        if not 1 <= ngram_min <= ngram_max <= NGRAM_MAX:
            raise ParamError(f"need 1 <= ngram_min <= ngram_max <= {NGRAM_MAX}, not {ngram_min} and {ngram_max}")
        if max_draft < 1:
            raise ParamError(f"max_draft must be >= 1, not {max_draft}")
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.max_draft = max_draft
        self._seen: list[int] = []
        self._cache: _NgramCache = {}
        self._dynamic: _NgramCache | None = {} if expect_bool("dynamic", dynamic) else None

    def __repr__(self) -> str:
        return (
            f"PromptLookup(ngram_min={self.ngram_min}, ngram_max={self.ngram_max}, max_draft={self.max_draft}, "
            f"dynamic={self._dynamic is not None})"
        )

    def reset(self) -> None:
        self._forget()

    def _forget(self) -> None:
        if self._dynamic is not None:
            _merge(self._dynamic, self._cache)
        self._cache = {}
        self._seen = []

    def _sync(self, history: Sequence[int]) -> list[int]:
        """Bring the counts up to ``history`` (incrementally when it extends what was
        seen, from scratch otherwise); returns the history as a list."""
        hist = history if isinstance(history, list) else [int(t) for t in history]
        seen = self._seen
        n = len(seen)
        if len(hist) < n or hist[:n] != seen:
            self._forget()
            seen = self._seen
            n = 0
        cache = self._cache
        for size in range(self.ngram_min, self.ngram_max + 1):
            for i in range(max(n, size), len(hist)):
                key = tuple(hist[i - size : i])
                part = cache.get(key)
                if part is None:
                    cache[key] = {hist[i]: 1}
                else:
                    part[hist[i]] = part.get(hist[i], 0) + 1
        seen.extend(hist[n:])
        return hist

    def draft(self, history: Sequence[int], n: int) -> Draft:
        hist = self._sync(_history(history))
        out: list[int] = []
        n = min(_count(n), self.max_draft)
        if len(hist) < NGRAM_STATIC:
            return Draft(out)
        sizes = range(self.ngram_min, self.ngram_max + 1)
        while len(out) < n:
            seq = hist[-NGRAM_MAX:] + out if out else hist[-NGRAM_MAX:]
            keys = [tuple(seq[-s:]) for s in sizes if s <= len(seq)]
            tok = _try_draft(self._cache, keys, _LAX_SAMPLES, _LAX_PERCENT)
            if tok is None and self._dynamic:
                tok = _try_draft(self._dynamic, keys, _STRICT_SAMPLES, _STRICT_PERCENT)
            if tok is None:
                break
            out.append(tok)
        return Draft(out)

    def clone(self) -> PromptLookup:
        out = PromptLookup.__new__(PromptLookup)
        out.__dict__.update(self.__dict__)
        out.stats = SpeculativeStats()
        out._seen = list(self._seen)
        out._cache = {k: dict(v) for k, v in self._cache.items()}
        out._dynamic = None if self._dynamic is None else {k: dict(v) for k, v in self._dynamic.items()}
        return out


def _try_draft(
    cache: _NgramCache, keys: list[tuple[int, ...]], samples: Sequence[int], percent: Sequence[int]
) -> int | None:
    """llama.cpp's ``try_draft`` without a static cache: the longest n-gram first."""
    for i in range(len(keys) - 1, -1, -1):
        part = cache.get(keys[i])
        if part is None:
            continue
        best, best_count, total = -1, 0, 0
        for tok, count in part.items():
            if count > best_count:
                best, best_count = tok, count
            total += count
        if total < samples[i] or 100 * best_count < percent[i] * total:
            continue
        return best
    return None


def _merge(into: _NgramCache, other: _NgramCache) -> None:
    for key, part in other.items():
        dst = into.setdefault(key, {})
        for tok, count in part.items():
            dst[tok] = dst.get(tok, 0) + count


def vocab_compatibility(target: Model, draft: Model) -> str | None:
    """Why ``draft`` cannot draft for ``target`` (None: it can), by llama.cpp's rules
    (``common_speculative_are_compatible``): the same vocabulary type, the same BOS and
    EOS tokens and whether they are added, vocabulary sizes within 128 of each other,
    and the same text for every token from id 5 up."""
    check_model(target, "target")
    check_model(draft, "draft")
    tv, dv = target.vocab, draft.vocab
    if tv.type != dv.type:
        return f"vocabulary types differ (target {tv.type.name}, draft {dv.type.name})"
    if tv.add_bos != dv.add_bos or (tv.add_bos and tv.bos != dv.bos):
        return f"BOS tokens differ (target add={tv.add_bos} id={tv.bos}, draft add={dv.add_bos} id={dv.bos})"
    if tv.add_eos != dv.add_eos or (tv.add_eos and tv.eos != dv.eos):
        return f"EOS tokens differ (target add={tv.add_eos} id={tv.eos}, draft add={dv.add_eos} id={dv.eos})"
    nt, nd = target.n_vocab, draft.n_vocab
    if abs(nt - nd) > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
        return f"vocabulary sizes differ by {abs(nt - nd)} (target {nt}, draft {nd}; at most 128)"
    for i in range(SPEC_VOCAB_CHECK_START_TOKEN_ID, min(nt, nd)):
        a, b = tv.token_text(i), dv.token_text(i)
        if a != b:
            return f"token {i} differs (target {a!r}, draft {b!r})"
    return None


class DraftModel(Drafter):
    """Drafts with a second, smaller model of a compatible vocabulary (checked against
    the target as llama.cpp does: :func:`vocab_compatibility`; an
    :class:`IncompatibleDraftError` otherwise).

    ``model_or_context``: a :class:`~llama_cffi.Model` (a context of ``n_ctx`` positions
    is made for it, owned and closed by this drafter) or a
    :class:`~llama_cffi.Context` (used as is, sequence ``seq_id``; yours to close).
    The draft context keeps the branch's history in its KV cache: each draft first
    removes what the target rejected (``seq_rm``) and decodes what it committed since,
    then drafts up to ``max_draft`` tokens, one decode each.

    ``sampler=None`` drafts greedily, as llama.cpp's draft model does: the best of the
    top 10 candidates, stopping when its probability among them is below ``p_min``. A
    :class:`~samplers.SamplerChain` ending in a draw samples the drafts instead and
    reports their distributions, for ``verify="rejection"`` (then ``p_min`` is unused).
    """

    def __init__(
        self,
        model_or_context: Model | Context,
        max_draft: int = 8,
        p_min: float = 0.0,
        sampler: SamplerChain | None = None,
        n_ctx: int = 4096,
        seq_id: int = 0,
        **context_params: Any,
    ) -> None:
        super().__init__()
        from llama_cffi import Context, Model

        if isinstance(max_draft, bool) or not isinstance(max_draft, int) or max_draft < 1:
            raise ParamError(f"max_draft must be an int >= 1, not {max_draft!r}")
        p_min = expect_number("p_min", p_min)
        n_ctx = expect_int("n_ctx", n_ctx)
        if not 0.0 <= p_min <= 1.0:
            raise ParamError(f"p_min must be in [0, 1], not {p_min}")
        if sampler is not None and not isinstance(sampler, SamplerChain):
            raise ParamError(f"sampler must be a SamplerChain, not {type(sampler).__name__}")
        if isinstance(model_or_context, Context):
            self.ctx = model_or_context
            self._owned = False
        elif isinstance(model_or_context, Model):
            m = model_or_context
            if m.has_encoder:
                raise UnsupportedError(f"a draft model must be decoder-only; {m.desc} has an encoder")
            self.ctx = m.context(n_ctx=n_ctx, n_batch=min(n_ctx, 512), **context_params)
            self._owned = True
        else:
            raise ParamError(f"model_or_context must be a Model or a Context, not {type(model_or_context).__name__}")
        self.model = self.ctx.model
        if self.model.has_encoder:
            raise UnsupportedError(f"a draft model must be decoder-only; {self.model.desc} has an encoder")
        self.seq_id = self.ctx._check_seq(seq_id)
        self.max_draft = max_draft
        self.p_min = float(p_min)
        self.sampler = sampler
        self._greedy = SamplerChain([TopK(10), Greedy()])
        self._cands = Candidates(self.ctx.n_vocab)
        self._seen: list[int] = []  # tokens whose KV the draft sequence holds
        self._bound: Any = None
        self._pool: set[int] = {self.seq_id}  # sequences in use by this drafter and its clones

    def __repr__(self) -> str:
        return f"DraftModel({self.model.desc!r}, max_draft={self.max_draft}, p_min={self.p_min})"

    def close(self) -> None:
        """Close the draft context if this drafter made it."""
        if self._owned and not self.ctx.closed:
            self.ctx.close()

    def __enter__(self) -> DraftModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def bind(self, model: Model) -> None:
        check_model(model)
        if self._bound is model:
            return
        why = vocab_compatibility(model, self.model)
        if why is not None:
            raise IncompatibleDraftError(f"the draft model cannot draft for the target: {why}")
        self._bound = model

    def reset(self) -> None:
        self.ctx.memory.seq_rm(self.seq_id)
        self._seen = []
        if self.sampler is not None:
            self.sampler.reset()

    def clone(self) -> DraftModel:
        """A drafter for another branch: the next free sequence of the same draft context
        (its KV copied from this one's with ``seq_cp``). Needs a draft context with
        ``n_seq_max`` above the number of drafters (pass ``n_seq_max=``, and
        ``kv_unified=True`` for copies that share cells, when giving a Model)."""
        free = [i for i in range(self.ctx.n_seq_max) if i not in self._pool]
        if not free:
            raise BranchError(
                f"the draft context's {self.ctx.n_seq_max} sequences are in use: make the DraftModel with a larger "
                "n_seq_max (one sequence per branch that drafts)"
            )
        out = copy.copy(self)
        out.seq_id = free[0]
        self._pool.add(out.seq_id)
        out.stats = SpeculativeStats()
        out._owned = False  # the first drafter closes the context
        out.sampler = None if self.sampler is None else self.sampler.clone()
        mem = self.ctx.memory
        mem.seq_rm(out.seq_id)
        if self._seen:
            mem.seq_cp(self.seq_id, out.seq_id)
        out._seen = list(self._seen)
        return out

    def release(self) -> None:
        """Give this drafter's sequence back (its cells removed); it cannot draft after."""
        if not self.ctx.closed:
            self.ctx.memory.seq_rm(self.seq_id)
        self._pool.discard(self.seq_id)
        self._seen = []

    def _catch_up(self, hist: list[int]) -> Any:
        """Make the draft sequence hold ``hist`` and return the logits after its last token."""
        ctx, sid, seen = self.ctx, self.seq_id, self._seen
        n = min(len(seen), len(hist) - 1)  # the last token is decoded again for its logits
        if n and seen[:n] != hist[:n]:
            a = np.asarray(seen[:n])
            b = np.asarray(hist[:n])
            n = int(np.argmax(a != b))
        if n < len(seen):
            try:
                ok = ctx.memory.seq_rm(sid, n)
            except UnsupportedError:
                ok = False
            if not ok:  # a memory that cannot drop this tail: start the sequence over
                ctx.memory.seq_rm(sid)
                n = 0
            del seen[n:]
        row = ctx.decode(hist[n:], pos=n, seq_id=sid)
        seen.extend(hist[n:])
        return row

    def draft(self, history: Sequence[int], n: int) -> Draft:
        hist = history if isinstance(history, list) else [int(t) for t in _history(history)]
        n = min(_count(n), self.max_draft, self.ctx.n_ctx_seq - len(hist) - 1)
        if n <= 0 or not hist:
            return Draft([])
        if len(hist) > self.ctx.n_ctx_seq:
            return Draft([])
        row = self._catch_up(hist)
        out: list[int] = []
        dists: list[tuple[npt.NDArray[np.int32], npt.NDArray[np.float64]]] | None = (
            [] if self.sampler is not None else None
        )
        cands = self._cands
        ctx, sid, seen = self.ctx, self.seq_id, self._seen
        while True:
            try:
                cands.reset(row)
                if self.sampler is None:
                    self._greedy.apply(cands)
                    tok = cands.token
                    p = _softmax64(cands.read_logits())
                    if float(p[cands.selected]) < self.p_min:
                        break
                else:
                    ids, p, tok = _draw(self.sampler, cands)
                    assert dists is not None
                    dists.append((ids, p))
                    self.sampler.accept(tok)
            finally:
                cands.release()
            out.append(tok)
            if len(out) >= n:
                break
            row = ctx.decode_single(tok, pos=len(seen), seq_id=sid)
            seen.append(tok)
        return Draft(out, dists)


def _softmax64(logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    lg = logits.astype(np.float64)
    m = lg.max()
    if m == -np.inf:
        return np.zeros_like(lg)
    e: npt.NDArray[np.float64] = np.exp(lg - m)
    e /= e.sum()
    return e


def _final_dist(chain: SamplerChain, cands: Candidates) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float64]]:
    """Apply every sampler of ``chain`` but its final draw; the candidates' ids and the
    distribution that draw would sample from (float64 softmax). Both are views into the
    candidates' buffers (no vocabulary-sized allocation), valid until they change."""
    for s in chain.samplers[:-1]:
        s.apply(cands)
    n = cands.size
    if n == 0:
        raise SamplingError(f"{chain!r} left no candidate")
    lg = cands.read_logits()
    m = lg.max()
    if m == -np.inf:
        raise SamplingError(f"no token is allowed: {chain!r} masks every candidate")
    p = cands.scratch64(n)
    np.subtract(lg, m, out=p)
    np.exp(p, out=p)
    p /= p.sum()
    return cands.read_ids(), p


def _draw(chain: SamplerChain, cands: Candidates) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float64], int]:
    """Draw from ``chain`` (ending in a :class:`Dist`) with its engine: the ids, the
    distribution (copies: a draft keeps them) and the token."""
    last = chain.samplers[-1] if chain.samplers else None
    if not isinstance(last, Dist):
        raise ParamError(f"a sampling draft chain must end in Dist, not {last!r}")
    ids, p = _final_dist(chain, cands)
    return np.array(ids, dtype=np.int32), p.copy(), int(ids[_pick(p, last.rng.canonical())])


def _pick(p: npt.NDArray[np.float64], u: float) -> int:
    """The index ``u`` in [0, 1) falls on in the cumulative weights ``p`` (unnormalised)."""
    cum = np.cumsum(p)
    return min(int(cum.searchsorted(u * cum[-1], side="right")), len(p) - 1)


# ---------------------------------------------------------------------- verification
@dataclass
class StepResult:
    """One branch's outcome of :func:`speculative_step`: the tokens ``committed`` (the
    pending token first, then the accepted drafts; all decoded, in the history, the
    sampler and the metrics), how many were ``drafted`` and ``accepted``, and ``next``:
    the target's next token, chosen from the branch's new logits snapshot but not
    committed (the branch's pending token, like :meth:`Branch.sample`'s), or None when
    the step stopped on the budget or ``on_commit``."""

    committed: list[int] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    next: int | None = None
    stopped: bool = False


@dataclass
class _Plan:
    branch: Branch
    token: int
    drafter: Drafter
    drafts: list[int]
    dists: list[tuple[npt.NDArray[np.int32], npt.NDArray[np.float64]]] | None
    budget: int
    mode: str
    first_row: int = 0
    checkpoint: bytes | None = None  # the sequence's state before the step (recurrent memories)
    redo: list[int] = field(default_factory=list)  # committed tokens to decode again after restoring it


def _grammar_matcher(chain: SamplerChain) -> Any:
    from .grammar.sampler import GrammarSampler

    for s in chain.samplers:
        if isinstance(s, GrammarSampler) and not s.awaiting:
            return s.matcher
    return None


def _check_verify(verify: object) -> Verify:
    """``verify`` when it is one of ``"auto"``, ``"match"``, ``"rejection"``."""
    if verify == "auto" or verify == "match" or verify == "rejection":
        return verify
    if not isinstance(verify, str):
        raise type_error("verify", "'auto', 'match' or 'rejection'", verify)
    raise ParamError(f"verify must be 'auto', 'match' or 'rejection', not {verify!r}")


def _mode(chain: SamplerChain, verify: Verify, sampled_drafts: bool) -> str:
    if verify == "match":
        return "match"
    last = chain.samplers[-1] if chain.samplers else None
    if verify == "rejection":
        if not isinstance(last, Dist):
            raise ParamError(f"verify='rejection' needs a sampler chain ending in Dist, not {chain!r}")
        return "rejection"
    return "rejection" if sampled_drafts and isinstance(last, Dist) else "match"


def speculative_step(
    store: BranchStore,
    moves: Mapping[Branch, int],
    drafters: Mapping[Branch, Drafter] | Drafter,
    *,
    budget: Mapping[Branch, int] | int | None = None,
    is_end: Callable[[int], bool] | None = None,
    on_commit: Mapping[Branch, Callable[[int], bool]] | None = None,
    verify: Verify = "auto",
) -> dict[Branch, StepResult]:
    """Commit each branch's pending token and as many drafted tokens as its sampler
    agrees with, for every branch in one ``llama_decode``.

    ``moves``: branch -> the token it commits now (its pending token: from
    :meth:`Branch.sample` or the previous step's ``StepResult.next``).
    ``drafters``: one per branch (or one for all: only with one branch). ``budget``:
    the most tokens a branch may commit in this step (default: unbounded; at least 1).
    ``is_end(token)``: tokens that end generation (default: the vocabulary's
    end-of-generation tokens); they are never committed, so a draft is cut before one,
    and a target choice of one becomes ``next``. ``on_commit[branch](token)`` is
    called after each committed token; returning True stops that branch's step there
    (a stop string seen). ``verify``: see the module docstring.

    On a failed decode no branch changes. Ctrl-C is held while the branches take
    their tokens, so a step is done whole or not at all.
    """
    expect("store", store, BranchStore, "a samplers.branch.BranchStore")
    if not isinstance(moves, Mapping):
        raise type_error("moves", "a mapping branch -> token", moves)
    if not isinstance(drafters, (Drafter, Mapping)):
        raise type_error("drafters", "a Drafter or a mapping branch -> Drafter", drafters)
    if budget is not None and not isinstance(budget, (int, Mapping)):
        raise type_error("budget", "an int, a mapping branch -> int, or None", budget)
    if is_end is not None:
        expect_callable("is_end", is_end, "callable or None")
    if on_commit is not None and not isinstance(on_commit, Mapping):
        raise type_error("on_commit", "a mapping branch -> callable, or None", on_commit)
    verify = _check_verify(verify)
    if not moves:
        return {}
    if store.device:
        raise BranchError(
            "speculative steps verify drafts against whole rows, which a store made with device=True keeps on "
            "the device: use a BranchStore(ctx) (device=False) for speculative decoding"
        )
    ctx = store.ctx
    vocab = ctx.model.vocab
    end = is_end if is_end is not None else vocab.is_eog
    model = ctx.model
    recurrent = model.is_recurrent or model.is_hybrid
    rollback = ctx.n_rs_seq if recurrent else 1 << 30  # 0: checkpoints (llama.cpp clamps n_rs_seq there)
    if isinstance(drafters, Drafter):
        if len(moves) > 1:
            raise ParamError("one drafter serves one branch: give a mapping of drafters for several branches")
        drafters = {b: drafters for b in moves}
    cap_rows = store._batch.capacity
    plans: list[_Plan] = []
    rows = 0
    for b, tok in moves.items():
        tok = int(tok)
        b._check_live()
        if b.store is not store:
            raise BranchError(f"{b!r} belongs to another store")
        b._check_token(tok)
        if b._kv_len != len(b._tokens):
            raise BranchError(
                f"branch {b.seq_id} was rebuilt by clear_and_reseed/shift_context: its positions no longer match "
                "its history, which the drafter reads"
            )
        d = drafters.get(b)
        if d is None:
            raise ParamError(f"no drafter for {b!r}")
        lim = budget if isinstance(budget, int) or budget is None else budget.get(b)
        lim = 1 << 30 if lim is None else int(lim)
        if lim < 1:
            raise ParamError(f"the budget of {b!r} is {lim}: at least the pending token must fit")
        d.bind(model)
        room = min(
            lim - 1,
            ctx.n_ctx_seq - b._kv_len - 1,
            cap_rows - rows - 1,
            rollback or 1 << 30,
        )
        if b._kv_len >= ctx.n_ctx_seq:
            raise KvCacheFullError(
                f"sequence {b.seq_id} is at position {b._kv_len}, the end of n_ctx_seq={ctx.n_ctx_seq}"
            )
        if room < 0:
            raise CapacityError(f"no room for {b!r} in this step: n_batch={ctx.n_batch} rows are taken")
        drafts: list[int] = []
        dists = None
        if room > 0:
            t0 = time.perf_counter()
            dr = d.draft([*b._tokens, tok], room)
            d.stats.draft_seconds += time.perf_counter() - t0
            drafts = [int(x) for x in dr.tokens[:room]]
            dists = None if dr.dists is None else dr.dists[: len(drafts)]
        drafts = _fit(b, tok, drafts, end)
        if dists is not None:
            dists = dists[: len(drafts)]
        mode = _mode(b.sampler, verify, dists is not None)
        plan = _Plan(b, tok, d, drafts, dists, lim, mode, rows)
        if recurrent and not rollback and drafts:
            # the state cannot step back: keep this sequence's state, to restore it and decode
            # what was committed again if a draft is rejected (llama.cpp's speculative-simple)
            plan.checkpoint = ctx.save_seq_state(b.seq_id)
        plans.append(plan)
        rows += 1 + len(drafts)
    # one decode: [token, drafts...] per branch, logits for every row
    batch = store._batch
    for p in plans:
        b, m = p.branch, 1 + len(p.drafts)
        r = p.first_row
        batch.token[r : r + m] = [p.token, *p.drafts]
        batch.pos[r : r + m] = np.arange(b._kv_len, b._kv_len + m, dtype=np.int32)
        batch.n_seq_id[r : r + m] = 1
        batch.seq_id[r : r + m, 0] = b.seq_id
        batch.logits[r : r + m] = 1
    batch.n_tokens = rows
    store._decode(batch, [p.branch for p in plans])
    out: dict[Branch, StepResult] = {}
    with _sigint_deferred():
        error: BaseException | None = None
        for p in plans:
            try:
                out[p.branch] = _verify(store, p, end, on_commit.get(p.branch) if on_commit else None)
            except Exception as exc:  # the branch is consistent (see _verify); the others still take theirs
                error = error or exc
        for p in plans:  # after every branch read its rows: decodes replace the outputs
            if p.redo:
                _restore(store, p)
        if error is not None:
            raise error
    return out


def _restore(store: BranchStore, p: _Plan) -> None:
    """A recurrent state that cannot step back: load the state from before the step and
    decode what was committed again (one decode), for the KV and the snapshot."""
    b, ctx = p.branch, store.ctx
    assert p.checkpoint is not None
    base = b._kv_len - len(p.redo)
    try:
        ctx.load_seq_state(p.checkpoint, b.seq_id)
        row = ctx.decode(p.redo, pos=base, seq_id=b.seq_id)
        b._set_row(row)
    except BaseException:
        # the sequence is unusable for this branch now: it holds none of its state
        ctx.memory.seq_rm(b.seq_id)
        b._kv_len = 0
        raise


def _fit(b: Branch, tok: int, drafts: list[int], end: Callable[[int], bool]) -> list[int]:
    """Cut ``drafts`` before an end token and at the first token the branch's grammar
    refuses (checked by accepting them after ``tok``, then rolled back)."""
    for i, t in enumerate(drafts):
        if not 0 <= t < b.store.n_vocab or end(t):
            drafts = drafts[:i]
            break
    matcher = _grammar_matcher(b.sampler)
    if matcher is None or not drafts:
        return drafts
    if not matcher.accept_token(tok):  # _check_token allowed it; a lazy trigger may differ
        return []
    n = 0
    for t in drafts:
        if not matcher.accept_token(t):
            break
        n += 1
    matcher.rollback(n + 1)
    return drafts[:n]


def _verify(store: BranchStore, p: _Plan, end: Callable[[int], bool], hook: Callable[[int], bool] | None) -> StepResult:
    """Take the decoded rows of one branch: commit its token, accept drafts while the
    target agrees, choose the next token; remove the rejected rows' KV. The branch is
    consistent whatever raises (the KV and snapshot follow what was committed)."""
    b, ctx = p.branch, store.ctx
    chain = b.sampler
    cands = store._cands
    res = StepResult(drafted=len(p.drafts))
    stats = p.drafter.stats
    stats.decodes += 1
    stats.drafted += len(p.drafts)
    base = b._kv_len
    row_i = p.first_row  # the row after the last committed token
    chosen: tuple[int, float | None] | None = None
    row: Any = None
    try:
        b._accept(p.token)  # measured on the snapshot, which produced it
        b._tokens.append(p.token)
        b._kv_len += 1
        res.committed.append(p.token)
        if hook is not None and hook(p.token):
            res.stopped = True
        track = b.tracker is not None
        for i, d in enumerate(p.drafts):
            if res.stopped or len(res.committed) >= p.budget:
                break
            row = np.asarray(ctx.logits(row_i))
            cands.reset(row)
            try:
                if p.mode == "rejection":
                    q = None if p.dists is None else p.dists[i]
                    tok, samp, ok = _reject_or_keep(chain, cands, d, q)
                else:
                    tok, samp = chain.choose(cands, row, track)
                    ok = tok == d
            finally:
                cands.release()
            if not ok or end(tok):
                chosen = (tok, samp)
                break
            _accept_row(b, tok, row, samp)
            b._tokens.append(tok)
            b._kv_len += 1
            row_i += 1
            res.committed.append(tok)
            res.accepted += 1
            if hook is not None and hook(tok):
                res.stopped = True
        if chosen is None and not res.stopped and len(res.committed) < p.budget:
            row = np.asarray(ctx.logits(row_i))
            cands.reset(row)
            try:
                chosen = chain.choose(cands, row, b.tracker is not None)
            finally:
                cands.release()
    finally:
        if b._kv_len < base + 1 + len(p.drafts):
            if p.checkpoint is not None:
                p.redo = list(res.committed)
            elif not ctx.memory.seq_rm(b.seq_id, b._kv_len):
                raise UnsupportedError(  # pragma: no cover - n_rs_seq caps the drafts
                    f"the memory of sequence {b.seq_id} could not drop its rejected drafts"
                )
        if b._kv_len > base:
            b._set_row(ctx.logits(row_i))
        b._pending = chosen
        row = None  # no view into the context's outputs outlives the step
    res.next = None if chosen is None else chosen[0]
    stats.accepted += res.accepted
    stats.committed += len(res.committed)
    p.drafter.feedback(p.drafts, res.accepted)
    return res


def _accept_row(b: Branch, token: int, row: Any, samp: float | None) -> None:
    """:meth:`Branch._accept` for a token produced by ``row`` (a row of this step's
    batch, not the snapshot)."""
    model: float | None = None
    if b.tracker is not None:
        model = surprisal_of(np.asarray(row), token)
        b.tracker.add(model, model if samp is None else samp)
    b.sampler.accept(token)
    b._accepted.append((len(b._tokens), token, model, model if samp is None else samp))
    b._pending = None


def _reject_or_keep(
    chain: SamplerChain,
    cands: Candidates,
    d: int,
    q: tuple[npt.NDArray[np.int32], npt.NDArray[np.float64]] | None,
) -> tuple[int, float | None, bool]:
    """Speculative sampling at one position: keep draft ``d`` with probability
    ``min(1, p(d)/q(d))``, else draw from ``max(0, p - q)``. Returns (token, its
    surprisal under p in nats, kept)."""
    last = chain.samplers[-1]
    assert isinstance(last, Dist)
    ids, p = _final_dist(chain, cands)
    rng = last.rng
    if cands.is_identity:  # the whole vocabulary: a token's index is its id
        i_d = d if 0 <= d < len(p) else -1
    else:
        where = np.flatnonzero(ids == d)
        i_d = int(where[0]) if len(where) else -1
    pd = float(p[i_d]) if i_d >= 0 else 0.0
    if q is None:  # a point mass on d: keep it with probability p(d); the residual is p without d
        qd = 1.0
        r = p
    else:
        qids, qp = q
        k = np.flatnonzero(qids == d)
        qd = float(qp[k[0]]) if len(k) else 0.0
        # q on the target's candidates (mass outside them cannot be drawn by the target)
        qv = np.zeros_like(p)
        order = np.argsort(qids, kind="stable")
        pos = np.searchsorted(qids[order], ids)
        pos = np.minimum(pos, len(order) - 1)
        hit = qids[order][pos] == ids
        qv[hit] = qp[order][pos[hit]]
        r = np.maximum(p - qv, 0.0)
    u = rng.canonical()
    if pd > 0.0 and (qd <= 0.0 or u * qd < pd):
        return d, -math.log(pd), True
    if q is None and i_d >= 0:
        p[i_d] = 0.0  # p is the candidates' scratch (p(d) < 1 was read): d is never drawn now
    if not r.any():  # only rounding left nothing: the target's own distribution
        r = p
    i = _pick(r, rng.canonical())
    return int(ids[i]), -math.log(float(p[i])) if p[i] > 0 else math.inf, False


def _count(n: object) -> int:
    """A drafter's ``n`` (the most tokens to propose): an int."""
    return n if type(n) is int else expect_int("n", n)


def _history(history: Any) -> Any:
    """A drafter's ``history``: a sequence (or array) of token ids."""
    if isinstance(history, (list, tuple, np.ndarray)):
        return history
    return expect_iterable("history", history, "a sequence of token ids")
