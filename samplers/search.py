"""Generation and search built on branches: streaming, best-of-n, beam search, top-k expansion.

Every helper advances its branches together (one ``llama_decode`` per step through
:meth:`~samplers.branch.BranchStore.step`). They take a :class:`BranchStore` whose
context has room for the branches they make (``n_seq_max``; beam search needs
``width`` ids, best-of-n ``n + 1``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from llama_cffi.errors import ParamError
from llama_cffi.kernels import softmax_sum
from llama_cffi.vocab import StopStringStream, Vocab

from .base import Sampler
from .branch import Branch, BranchStore
from .chain import SamplerChain
from .selection import Greedy
from .speculative import Drafter, Verify, speculative_step


@dataclass(frozen=True)
class Result:
    """A finished continuation: the generated ``tokens`` (prompt excluded), their ``text``,
    the model-level ``perplexity`` and summed log-probability ``logprob`` (nats)."""

    tokens: list[int]
    text: str
    perplexity: float
    logprob: float


def _prompt_tokens(store: BranchStore, prompt: str | Sequence[int]) -> list[int]:
    vocab = store.ctx.model.vocab
    return [int(t) for t in (vocab.tokenize(prompt) if isinstance(prompt, str) else vocab.check_tokens(prompt))]


def _result(branch: Branch, start: int) -> Result:
    toks = branch.tokens[start:]
    vocab = branch.store.ctx.model.vocab
    return Result(
        toks,
        vocab.detokenize([t for t in toks if not vocab.is_eog(t)]),
        branch.perplexity,
        -branch._metrics().total_surprisal,
    )


def stream(
    branch: Branch,
    max_tokens: int = 128,
    stop: Iterable[str] = (),
    stop_tokens: Iterable[int] = (),
    drafter: Drafter | None = None,
    verify: Verify = "auto",
) -> Iterator[str]:
    """Sample and commit up to ``max_tokens`` on ``branch``, yielding text pieces (never
    half a UTF-8 character). Ends at an end-of-generation token, a ``stop_tokens`` token
    (neither is committed) or a ``stop`` string (its text is not yielded; its tokens are
    in the branch).

    With a ``drafter`` (:class:`~samplers.speculative.PromptLookup`,
    :class:`~samplers.speculative.DraftModel`) generation is speculative: each decode
    checks the drafted tokens and commits those the sampler agrees with. The tokens,
    the branch's sampler state and metrics are those of plain generation (``verify``:
    see :mod:`samplers.speculative`); ``drafter.stats`` counts what it bought."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise ParamError(f"max_tokens must be an int >= 0, not {max_tokens!r}")
    vocab = branch.store.ctx.model.vocab
    enders = {int(t) for t in stop_tokens}
    text = StopStringStream(vocab, stop)
    if drafter is not None:
        yield from _stream_speculative(branch, max_tokens, text, enders, drafter, verify)
        return
    for _ in range(max_tokens):
        tok = branch.sample()
        if vocab.is_eog(tok) or tok in enders:
            break
        branch.commit(tok)
        piece = text.push(tok)
        if piece:
            yield piece
        if text.stopped:
            return
    rest = text.flush()
    if rest:
        yield rest


def _stream_speculative(
    branch: Branch, max_tokens: int, text: StopStringStream, enders: set[int], drafter: Drafter, verify: Verify
) -> Iterator[str]:
    vocab = branch.store.ctx.model.vocab

    def is_end(t: int) -> bool:
        return vocab.is_eog(t) or t in enders

    pieces: list[str] = []

    def on_commit(t: int) -> bool:
        piece = text.push(t)
        if piece:
            pieces.append(piece)
        return text.stopped

    n = 0
    tok = branch.sample() if max_tokens else None
    while tok is not None and n < max_tokens and not is_end(tok):
        res = branch.speculate(tok, drafter, budget=max_tokens - n, is_end=is_end, on_commit=on_commit, verify=verify)
        n += len(res.committed)
        yield from pieces
        pieces.clear()
        if res.stopped:
            return
        tok = res.next
    rest = text.flush()
    if rest:
        yield rest


def generate(
    store: BranchStore,
    prompt: str | Sequence[int],
    max_tokens: int = 128,
    sampler: Sampler | None = None,
    grammar: Any = None,
    json_schema: dict[str, Any] | None = None,
    stop: Iterable[str] = (),
    seed: int | None = None,
    drafter: Drafter | None = None,
    verify: Verify = "auto",
) -> str:
    """Generate text for ``prompt`` on a new branch (pruned afterwards). ``grammar``: GBNF
    text, a Grammar or a matcher; ``json_schema``: a schema the output must satisfy;
    ``drafter``: speculative decoding (see :func:`stream`)."""
    if grammar is not None and json_schema is not None:
        raise ParamError("give grammar or json_schema, not both")
    branch = store.create(
        _prompt_tokens(store, prompt),
        sampler=sampler,
        grammar=grammar if json_schema is None else json_schema,
        seed=seed,
    )
    try:
        return "".join(stream(branch, max_tokens, stop, drafter=drafter, verify=verify))
    finally:
        branch.prune_subtree()


def run_together(
    store: BranchStore,
    branches: list[Branch],
    max_tokens: int,
    drafters: Mapping[Branch, Drafter] | None = None,
    verify: Verify = "auto",
) -> int:
    """Step live branches together (one ``llama_decode`` per step) until each sampled an
    end-of-generation token (accepted, so it is scored, but not decoded) or
    ``max_tokens`` steps were taken. Returns the number of tokens decoded.

    ``drafters`` (one per branch): speculative steps, every branch's pending token and
    drafts in one decode; each branch ends with the tokens, sampler state and metrics
    it would have had without them."""
    vocab = store.ctx.model.vocab
    if drafters is not None:
        return _run_speculative(store, branches, max_tokens, drafters, verify)
    live = list(branches)
    n = 0
    for _ in range(max_tokens):
        moves = _split_ends(((b, b.sample()) for b in live), vocab)
        if not moves:
            break
        store.step(moves)
        n += len(moves)
        live = list(moves)
    return n


def _split_ends(picks: Iterable[tuple[Branch, int]], vocab: Vocab) -> dict[Branch, int]:
    """The moves to decode: an end-of-generation token is accepted (scored) by its branch,
    not decoded, and that branch stops; the others move."""
    moves: dict[Branch, int] = {}
    for b, t in picks:
        if vocab.is_eog(t):
            b.accept(t)
        else:
            moves[b] = t
    return moves


def _run_speculative(
    store: BranchStore, branches: list[Branch], max_tokens: int, drafters: Mapping[Branch, Drafter], verify: Verify
) -> int:
    vocab = store.ctx.model.vocab
    done: dict[Branch, int] = {b: 0 for b in branches}
    pending: dict[Branch, int] = {b: b.sample() for b in branches} if max_tokens > 0 else {}
    n = 0
    while pending:
        moves = _split_ends(pending.items(), vocab)
        if not moves:
            break
        budget = {b: max_tokens - done[b] for b in moves}
        res = speculative_step(store, moves, drafters, budget=budget, verify=verify)
        pending = {}
        for b, r in res.items():
            done[b] += len(r.committed)
            n += len(r.committed)
            if r.next is not None and done[b] < max_tokens:
                pending[b] = r.next
    return n


def best_of_n(
    store: BranchStore,
    prompt: str | Sequence[int],
    n: int,
    max_tokens: int = 64,
    sampler: Sampler | None = None,
    score: str | Callable[[Branch], float] = "perplexity",
    seed: int = 0,
    drafter: Drafter | None = None,
    verify: Verify = "auto",
) -> Result:
    """Sample ``n`` continuations of one prefilled prompt (forks reseeded ``seed + i``),
    advance them together and keep the best: lowest ``"perplexity"``, highest
    ``"logprob"``, or lowest ``score(branch)``. Every branch it made is pruned.
    ``drafter``: speculative steps, one clone of it per continuation."""
    if n < 1:
        raise ParamError(f"n must be >= 1, not {n}")
    chain = sampler if sampler is not None else SamplerChain([Greedy()])
    root = store.create(_prompt_tokens(store, prompt), sampler=chain)
    start = root.position
    try:
        kids = [root.fork(seed=seed + i) for i in range(n)]
        drafters: dict[Branch, Drafter] = {}
        try:
            if drafter is not None:
                for k in kids:  # one by one: those made before a failure are released below
                    drafters[k] = drafter.clone()
            run_together(store, kids, max_tokens, drafters or None, verify)
        finally:
            for d in drafters.values():
                release = getattr(d, "release", None)
                if release is not None:
                    release()
        if score == "perplexity":
            key: Callable[[Branch], float] = lambda b: b.perplexity  # noqa: E731
        elif score == "logprob":
            key = lambda b: b._metrics().total_surprisal  # noqa: E731
        elif callable(score):
            key = score
        else:
            raise ParamError(f"score must be 'perplexity', 'logprob' or a callable, not {score!r}")
        return _result(min(kids, key=key), start)
    finally:
        root.prune_subtree()


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    """log softmax(logits) in float64 (the normaliser from ggml's soft_max kernel)."""
    row = np.ascontiguousarray(logits, dtype=np.float32)
    m = float(row.max())
    scratch = np.empty_like(row)
    lse = m + math.log(softmax_sum(row, m, scratch))
    return row.astype(np.float64) - lse


def beam_search(
    store: BranchStore, prompt: str | Sequence[int], width: int, max_tokens: int = 32, length_penalty: float = 0.0
) -> Result:
    """Beam search by summed log-probability (divided by ``length ** length_penalty``):
    at each step every beam proposes its ``width`` best tokens, the best ``width``
    (beam, token) pairs survive (beams chosen twice are forked, unchosen ones pruned) and
    advance in one decode. A beam ends at an end-of-generation token. Returns the best
    finished (or, at ``max_tokens``, live) beam; every branch it made is pruned."""
    if width < 1:
        raise ParamError(f"width must be >= 1, not {width}")
    vocab = store.ctx.model.vocab
    root = store.create(_prompt_tokens(store, prompt))
    start = root.position
    made = [root]
    beams: list[tuple[Branch, float]] = [(root, 0.0)]
    finished: list[tuple[float, list[int], float]] = []  # (normalised score, tokens, logprob)

    def norm(lp: float, n: int) -> float:
        return float(lp / (max(n, 1) ** length_penalty))

    try:
        for step in range(max_tokens):
            props: list[tuple[float, int, int]] = []  # (logprob, beam index, token)
            for i, (b, lp) in enumerate(beams):
                ls = _log_softmax(b.logits)
                top = np.argpartition(-ls, min(width, len(ls) - 1))[:width]
                props += [(lp + float(ls[t]), i, int(t)) for t in top]
            props.sort(key=lambda x: -x[0])
            chosen: list[tuple[float, int, int]] = []
            for lp, i, t in props:
                if vocab.is_eog(t):
                    finished.append((norm(lp, step + 1), [*beams[i][0].tokens[start:], t], lp))
                else:
                    chosen.append((lp, i, t))
                if len(chosen) == width:
                    break
            best_done = max((f[0] for f in finished), default=-math.inf)
            if not chosen or (len(finished) >= width and best_done >= norm(chosen[0][0], step + 1)):
                break
            used = {i for _, i, _ in chosen}
            for i, (b, _) in enumerate(beams):  # free ids before forking
                if i not in used:
                    b.prune(reparent=True)
            moves: list[tuple[Branch, int]] = []
            nxt: list[tuple[Branch, float]] = []
            taken: set[int] = set()
            for lp, i, t in chosen:
                b = beams[i][0]
                if i in taken:
                    b = b.fork()
                    made.append(b)
                taken.add(i)
                moves.append((b, t))
                nxt.append((b, lp))
            # the forks above copied their parent before any of them moved
            store.step(moves)
            beams = nxt
        for b, lp in beams:
            finished.append((norm(lp, b.position - start), b.tokens[start:], lp))
        best = max(finished, key=lambda f: f[0])
        toks = best[1]
        return Result(
            toks,
            vocab.detokenize([t for t in toks if not vocab.is_eog(t)]),
            math.exp(-best[2] / max(len(toks), 1)),
            best[2],
        )
    finally:
        for b in reversed(made):
            if b.alive:
                b.prune(reparent=True)


def expand_top_k(branch: Branch, k: int) -> list[Branch]:
    """Fork ``branch`` into ``k`` children, one per its ``k`` most likely next tokens
    (distinct), and advance them in one decode: the basic move of a tree search."""
    if k < 1:
        raise ParamError(f"k must be >= 1, not {k}")
    ls = branch.logits
    top = np.argsort(-ls, kind="stable")[:k]
    kids = [branch.fork() for _ in top]
    branch.store.step({c: int(t) for c, t in zip(kids, top, strict=True)})
    return kids
