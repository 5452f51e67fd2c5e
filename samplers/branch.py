"""Branches: many continuations of one prompt sharing one context's KV cache.

A :class:`BranchStore` owns a context's sequence ids. Each :class:`Branch` is one
sequence with its own token history, sampler chain (grammar included), perplexity
tracker and a **logits snapshot** (an owned copy of the logits that follow its last
token, so a branch can be sampled any time, whatever was decoded since). Branches
advance together through :meth:`BranchStore.step`: one ``llama_decode`` for all::

    store = BranchStore(ctx)            # ctx made with n_seq_max=N, kv_unified=True
    root = store.create(prompt, sampler=SamplerChain([TopK(40), Dist(1)]))
    kids = [root.fork(seed=i) for i in range(4)]
    for _ in range(32):
        store.step({b: b.sample() for b in kids})
    best = min(kids, key=lambda b: b.perplexity)
    store.retain_only(best)

Forking copies no KV data when the context's KV cache is unified
(``kv_unified=True``): llama.cpp's ``seq_cp`` then only tags the parent's cells with
the child's id. Token accounting: :attr:`Branch.position` is the next position,
:attr:`Branch.tokens` the whole history. A branch's sampler state is its own
(cloned at fork, RNG included); metrics are measured on the snapshot that produced
each token, before the token is decoded.

Errors never leave the store inconsistent: a failed decode changes no branch (its
sampler, grammar, metrics, positions and snapshot stay as they were, and KV written
for it is removed).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from llama_cffi import Batch
from llama_cffi.errors import ClosedError, LlamaError, ParamError

from .base import Sampler
from .candidates import Candidates
from .chain import SamplerChain, surprisal_of
from .measure import PerplexityTracker, entropy
from .selection import Greedy

if TYPE_CHECKING:
    from llama_cffi import Context


class BranchError(LlamaError, RuntimeError):
    """A branch operation that cannot be done (pruned branch, live children, ...)."""


class CapacityError(BranchError):
    """Every sequence id of the context is in use (``n_seq_max`` branches live)."""


def _as_chain(sampler: Sampler | None, grammar: Any, vocab: Any) -> SamplerChain:
    chain = sampler if isinstance(sampler, SamplerChain) else SamplerChain([sampler or Greedy()])
    if grammar is not None:
        from .grammar import Grammar, GrammarMatcher, GrammarSampler
        from .grammar.compiled import CompiledGrammar

        if isinstance(grammar, (dict, bool)):
            grammar = Grammar.from_json_schema(grammar)
        elif isinstance(grammar, str):
            grammar = Grammar.from_gbnf(grammar)
        if not isinstance(grammar, (Grammar, CompiledGrammar, GrammarMatcher)):
            raise ParamError(f"grammar must be GBNF text, a JSON schema, a Grammar or a matcher, not {grammar!r}")
        chain = SamplerChain([GrammarSampler(grammar, vocab), *chain.samplers], tracker=chain.tracker)
    return chain


@contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT's KeyboardInterrupt) until the block is done, then raise it.

    A branch's bookkeeping after a successful decode (sampler, grammar, metrics, history,
    snapshot) must not stop half-way. Only in the main thread and only while Python's
    default handler is installed (a user's own handler is left alone); elsewhere a no-op.
    """
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    hit: list[bool] = []
    signal.signal(signal.SIGINT, lambda signum, frame: hit.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if hit:
        raise KeyboardInterrupt


class BranchStore:
    """The branches of one context (see the module docstring). ``ctx`` should have
    ``n_seq_max`` at least the number of live branches you want, and ``kv_unified=True``
    for forks that copy no KV data."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.n_vocab = ctx.n_vocab
        self._free: list[int] = list(range(ctx.n_seq_max - 1, -1, -1))  # pop() gives the lowest
        self._live: dict[int, Branch] = {}
        self._batch = Batch(ctx.n_batch)
        self._cands = Candidates(ctx.n_vocab)

    # ------------------------------------------------------------------ ids and KV
    def _take_id(self) -> int:
        if not self._free:
            raise CapacityError(
                f"all {self.ctx.n_seq_max} sequence ids are in use: prune a branch or make the context "
                "with a larger n_seq_max"
            )
        sid = self._free.pop()
        self.ctx.memory.seq_rm(sid)  # a detached branch may have left cells behind
        return sid

    def _give_id(self, sid: int) -> None:
        self._free.append(sid)
        self._free.sort(reverse=True)

    @contextmanager
    def _fresh_id(self) -> Iterator[int]:
        """A sequence id for a branch being made. If the block raises (Ctrl-C included)
        before the branch is registered (:meth:`_register`), the id's cells are removed
        and the id is given back, with Ctrl-C held meanwhile."""
        sid: int | None = None
        try:
            with _sigint_deferred():
                sid = self._take_id()
            yield sid
        except BaseException:
            if sid is not None and sid not in self._live:
                with _sigint_deferred():
                    self.ctx.memory.seq_rm(sid)
                    self._give_id(sid)
            raise

    def _register(self, b: Branch) -> None:
        """Make ``b`` live: in the store and among its parent's children (the last step
        of making a branch, after everything that can fail)."""
        self._live[b.seq_id] = b
        if b._parent is not None:
            b._parent._children.append(b)

    @property
    def branches(self) -> list[Branch]:
        """Live branches, by sequence id."""
        return [self._live[k] for k in sorted(self._live)]

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[Branch]:
        return iter(self.branches)

    @property
    def available(self) -> int:
        """How many more branches fit (free sequence ids)."""
        return len(self._free)

    def kv(self) -> dict[str, int]:
        """KV pressure: ``n_ctx``, ``positions`` (sum over live branches of the positions
        each holds; shared prefix cells count once per branch, so this is an upper bound
        on cells used with a unified cache) and ``remaining`` (``n_ctx - positions``, a
        lower bound on free cells)."""
        mem = self.ctx.memory
        used = 0
        for sid in self._live:
            hi = mem.seq_pos_max(sid)
            if hi >= 0:
                used += hi - mem.seq_pos_min(sid) + 1
        return {"n_ctx": self.ctx.n_ctx, "positions": used, "remaining": max(self.ctx.n_ctx - used, 0)}

    # ------------------------------------------------------------------ creation
    def create(
        self,
        prompt: Sequence[int] | npt.NDArray[np.integer[Any]],
        sampler: Sampler | None = None,
        grammar: Any = None,
        seed: int | None = None,
        tracker: PerplexityTracker | None = None,
        track: bool = True,
    ) -> Branch:
        """A new root branch: ``prompt`` (at least one token) decoded into a fresh sequence
        (in ``n_batch`` chunks) and the logits after it captured. ``sampler`` defaults to
        greedy; ``grammar`` (GBNF text, a JSON schema dict, a Grammar or a matcher) puts a
        :class:`~samplers.grammar.GrammarSampler` first in the chain; ``seed`` reseeds the
        chain's random samplers. ``track=False`` turns the metrics off (each costs a
        softmax over the vocabulary per token: ~0.5-1 ms at 262,144 tokens on 2 cores)."""
        tokens = self.ctx.model.vocab.check_tokens(prompt)
        if len(tokens) == 0:
            raise ParamError("a branch needs a prompt of at least one token")
        chain = _as_chain(sampler, grammar, self.ctx.model)
        model = self.ctx.model
        if model.has_encoder and model.has_decoder:
            return self._create_decoder(tokens, chain, seed, tracker, track)
        with self._fresh_id() as sid:
            row = self.ctx.decode(tokens, pos=0, seq_id=sid)  # Ctrl-C here aborts the prefill
            with _sigint_deferred():  # after it, the branch is made in full first
                snapshot = np.array(row, dtype=np.float32, copy=True)
                metrics = (tracker or PerplexityTracker()) if track else None
                b = Branch(self, sid, None, [int(t) for t in tokens], chain, metrics, snapshot)
                if seed is not None:
                    b.reseed(seed)
                self._register(b)
        return b

    def _create_decoder(
        self, tokens: Any, chain: SamplerChain, seed: int | None, tracker: PerplexityTracker | None, track: bool
    ) -> Branch:
        """:meth:`create` for an encoder-decoder model: the prompt is the encoder's input,
        one per context (llama.cpp keeps one encoder output), so only while no branch is
        live; the branch starts at the decoder start token (its history)."""
        if len(self):
            raise BranchError(
                "an encoder-decoder model holds one encoder input per context: prune the live branches "
                "before creating one for a new input (fork the existing ones to share it)"
            )
        ctx = self.ctx
        with self._fresh_id() as sid:
            row = ctx.start_decoder(tokens, seq_id=sid)
            with _sigint_deferred():
                snapshot = np.array(row, dtype=np.float32, copy=True)
                metrics = (tracker or PerplexityTracker()) if track else None
                first = ctx.model.decoder_start_token
                start = first if first is not None else ctx.model.vocab.bos
                b = Branch(self, sid, None, [int(start if start is not None else 0)], chain, metrics, snapshot)
                if seed is not None:
                    b.reseed(seed)
                self._register(b)
        return b

    # ------------------------------------------------------------------ batched steps
    def step(self, moves: Mapping[Branch, int] | Iterable[tuple[Branch, int]]) -> None:
        """Append one token to each branch with one ``llama_decode`` for all of them, then
        accept each token (sampler, grammar, metrics on the snapshot that produced it) and
        capture each branch's new logits. On failure no branch changes."""
        items = list(moves.items()) if isinstance(moves, Mapping) else [(b, int(t)) for b, t in moves]
        if not items:
            return
        seen: set[int] = set()
        for b, tok in items:
            b._check_live()
            if b.store is not self:
                raise BranchError(f"{b!r} belongs to another store")
            if b.seq_id in seen:
                raise BranchError(f"{b!r} appears twice in one step")
            seen.add(b.seq_id)
            b._check_token(int(tok))
        n = len(items)
        cap = self._batch.capacity
        for start in range(0, n, cap):
            part = items[start : start + cap]
            batch = self._batch
            m = len(part)
            batch.token[:m] = [int(t) for _, t in part]
            batch.pos[:m] = [b.position for b, _ in part]
            batch.n_seq_id[:m] = 1
            batch.seq_id[:m, 0] = [b.seq_id for b, _ in part]
            batch.logits[:m] = 1
            batch.n_tokens = m
            ctx = self.ctx
            done = 0
            try:
                self._decode(batch, [b for b, _ in part])
                with _sigint_deferred():  # Ctrl-C lands after every branch took its token
                    for i, (b, tok) in enumerate(part):
                        b._advance(int(tok), ctx.logits(i))
                        done = i + 1
            except BaseException:
                with _sigint_deferred():
                    for b, _ in part[done:]:  # decoded but not advanced (or not decoded): no cell stays
                        ctx.memory.seq_rm(b.seq_id, b._kv_end())
                raise

    commit = step

    async def astep(self, moves: Mapping[Branch, int] | Iterable[tuple[Branch, int]]) -> None:
        """:meth:`step` in a worker thread, for asyncio code (the event loop stays free).
        Cancelling the awaiting task aborts the decode (:meth:`llama_cffi.Context.arun`):
        no branch changes and :class:`asyncio.CancelledError` is raised. A cancellation
        that arrives after the decode finished lets the step complete (the branches'
        positions tell) and is raised all the same."""
        items = list(moves.items()) if isinstance(moves, Mapping) else [(b, int(t)) for b, t in moves]
        await self.ctx.arun(lambda: self.step(items))

    def prefill(self, inputs: Mapping[Branch, Sequence[int]]) -> None:
        """Append several tokens to several branches, packed into as few decodes as
        ``n_batch`` allows; each branch's logits after its last token are captured. The
        tokens are context (not sampled): they join the history without touching
        samplers or metrics. On failure every branch is restored."""
        work: list[tuple[Branch, list[int]]] = []
        for b, toks in inputs.items():
            b._check_live()
            if b.store is not self:
                raise BranchError(f"{b!r} belongs to another store")
            arr = [int(t) for t in self.ctx.model.vocab.check_tokens(toks)]
            if arr:
                work.append((b, arr))
        saved = {b.seq_id: (b._kv_len, len(b._tokens), b._logits.copy(), b._pending, b._orig) for b, _ in work}
        cap = self._batch.capacity
        offsets = [0] * len(work)
        try:
            while any(off < len(t) for off, (_, t) in zip(offsets, work, strict=True)):
                batch = self._batch
                m = 0
                rows: list[tuple[int, int, int]] = []  # work index, first batch index, count
                for i, (b, toks) in enumerate(work):
                    take = min(len(toks) - offsets[i], cap - m)
                    if take <= 0:
                        continue
                    pos0 = b._kv_len
                    batch.token[m : m + take] = toks[offsets[i] : offsets[i] + take]
                    batch.pos[m : m + take] = np.arange(pos0, pos0 + take, dtype=np.int32)
                    batch.n_seq_id[m : m + take] = 1
                    batch.seq_id[m : m + take, 0] = b.seq_id
                    batch.logits[m : m + take] = 0
                    if offsets[i] + take == len(toks):
                        batch.logits[m + take - 1] = 1
                    rows.append((i, m, take))
                    m += take
                batch.n_tokens = m
                self.ctx.decode_batch(batch)
                for i, first, take in rows:
                    b, toks = work[i]
                    b._tokens.extend(toks[offsets[i] : offsets[i] + take])
                    b._kv_len += take
                    offsets[i] += take
                    if offsets[i] == len(toks):
                        b._set_row(self.ctx.logits(first + take - 1))
                        b._pending = None
        except BaseException:
            with _sigint_deferred():
                for b, _ in work:
                    kv, nt, snap, pending, orig = saved[b.seq_id]
                    self.ctx.memory.seq_rm(b.seq_id, kv)
                    b._kv_len = kv
                    del b._tokens[nt:]
                    np.copyto(b._logits, snap)
                    b._orig = orig
                    b._pending = pending
            raise

    def _decode(self, batch: Batch, branches: Sequence[Branch]) -> None:
        try:
            self.ctx.decode_batch(batch)
        except BaseException:
            with _sigint_deferred():
                for b in branches:  # remove whatever this decode wrote
                    self.ctx.memory.seq_rm(b.seq_id, b._kv_end())
            raise

    # ------------------------------------------------------------------ pruning
    def retain_only(self, keep: Branch) -> None:
        """Keep one branch, drop every other (one ``seq_keep``); ``keep`` becomes a root."""
        keep._check_live()
        with _sigint_deferred():
            self.ctx.memory.seq_keep(keep.seq_id)
            for sid, b in list(self._live.items()):
                if b is not keep:
                    b._dead = True
                    b._children.clear()
                    del self._live[sid]
                    self._give_id(sid)
            keep._parent = None
            keep._children.clear()

    def drain(self) -> None:
        """Remove every branch and its KV (before the context is freed or reused)."""
        with _sigint_deferred():
            for sid, b in list(self._live.items()):
                self.ctx.memory.seq_rm(sid)
                b._dead = True
                b._children.clear()
                del self._live[sid]
                self._give_id(sid)


class Branch:
    """One sequence of a :class:`BranchStore` (see the module docstring). Made by
    :meth:`BranchStore.create` and :meth:`fork`."""

    def __init__(
        self,
        store: BranchStore,
        seq_id: int,
        parent: Branch | None,
        tokens: list[int],
        sampler: SamplerChain,
        tracker: PerplexityTracker | None,
        logits: npt.NDArray[np.float32],
    ) -> None:
        self.store = store
        self.seq_id = seq_id
        self._parent = parent
        self._children: list[Branch] = []
        self._tokens = tokens
        self._kv_len = len(tokens)  # tokens whose KV this sequence holds
        self.sampler = sampler
        self.tracker = tracker
        self._logits = logits
        #: the model's logits when the snapshot was edited (set_logits, add_logits, contrast,
        #: a steering hook); None when the snapshot is the model's own
        self._orig: npt.NDArray[np.float32] | None = None
        #: the buffer ``_orig`` uses, allocated at the first edit and reused by later ones
        #: (a steering hook edits every step)
        self._orig_buf: npt.NDArray[np.float32] | None = None
        #: called by :meth:`sample` before the sampler runs: ``steer(branch, logits)`` with
        #: the snapshot writable (see :meth:`set_logits`)
        self.steer: Callable[[Branch, npt.NDArray[np.float32]], None] | None = None
        self._pending: tuple[int, float | None] | None = None  # (token, sampling surprisal) of sample()
        # (history index, token, model surprisal or None untracked, sampling surprisal argument)
        # of every accepted token, replayed by fork(at=...)
        self._accepted: list[tuple[int, int, float | None, float | None]] = []
        self._dead = False  # live once its store registers it (BranchStore._register)

    def __repr__(self) -> str:
        state = "pruned" if self._dead else f"position={self.position}"
        return f"<Branch seq={self.seq_id} {state}>"

    # ------------------------------------------------------------------ properties
    @property
    def position(self) -> int:
        """The next position of this sequence (tokens held in the KV cache)."""
        return self._kv_len

    def _kv_end(self) -> int:
        return self._kv_len

    @property
    def tokens(self) -> list[int]:
        """Every token of this branch: prompt, then generated (a copy)."""
        return list(self._tokens)

    @property
    def parent(self) -> Branch | None:
        return self._parent

    @property
    def children(self) -> list[Branch]:
        return list(self._children)

    @property
    def is_leaf(self) -> bool:
        return not self._children

    @property
    def alive(self) -> bool:
        return not self._dead

    @property
    def logits(self) -> npt.NDArray[np.float32]:
        """The logits snapshot (read-only view of the branch's own copy)."""
        v: npt.NDArray[np.float32] = self._logits.view()
        v.flags.writeable = False
        return v

    def _metrics(self) -> PerplexityTracker:
        if self.tracker is None:
            raise BranchError("this branch was created with track=False: no metrics")
        return self.tracker

    @property
    def perplexity(self) -> float:
        """Model-level perplexity of the tokens accepted so far (prompt excluded)."""
        return self._metrics().perplexity

    @property
    def sampling_perplexity(self) -> float:
        """Perplexity under the distributions the sampler actually drew from."""
        return self._metrics().sampling_perplexity

    @property
    def entropy(self) -> float:
        """Entropy (nats) of the model's distribution for the next token (edits to the
        snapshot aside; :attr:`sampling_entropy` is the sampler's)."""
        return float(entropy(self._model_row()))

    # ------------------------------------------------------------------ sampling
    def _check_live(self) -> None:
        if self._dead:
            raise BranchError(f"branch {self.seq_id} was pruned")
        if self.store.ctx.closed:
            raise ClosedError(f"the context of branch {self.seq_id} is closed")

    def _check_token(self, token: int) -> None:
        if not 0 <= token < self.store.n_vocab:
            raise ParamError(f"token {token} is out of range [0, {self.store.n_vocab})")
        for s in self.sampler.samplers:
            allows = getattr(s, "allows", None)
            if allows is not None and not allows(token):
                raise BranchError(f"the grammar of branch {self.seq_id} does not allow token {token}")

    def sample(self) -> int:
        """Choose a token from the snapshot with this branch's sampler (not accepted yet).
        A :attr:`steer` hook is called first, with the snapshot writable."""
        self._check_live()
        if self.steer is not None:
            self.steer(self, self._editable())
        cands = self.store._cands
        try:
            cands.reset(self._logits)
            token, sampling = self.sampler.choose(cands, self._logits, self.tracker is not None)
        finally:
            cands.release()
        self._pending = (token, sampling)
        return token

    def accept(self, token: int) -> None:
        """Advance sampler, grammar and metrics by ``token`` (measured on the snapshot)
        without decoding it. :meth:`commit` / :meth:`BranchStore.step` do this for you."""
        self._check_live()
        self._check_token(int(token))
        self._accept(int(token))

    def _accept(self, token: int) -> None:
        model: float | None = None
        samp: float | None = None
        if self.tracker is not None:
            model = surprisal_of(self._model_row(), token)
            pending = self._pending
            if pending is not None and pending[0] == token:
                samp = model if pending[1] is None else pending[1]
            self.tracker.add(model, samp)
        self.sampler.accept(token)
        self._accepted.append((len(self._tokens), token, model, samp))
        self._pending = None

    def _advance(self, token: int, row: Any) -> None:
        self._accept(token)
        self._tokens.append(token)
        self._kv_len += 1
        self._set_row(row)

    def commit(self, token: int) -> None:
        """Accept ``token``, decode it, capture the new logits (one ``llama_decode`` of one
        token). On failure nothing changes."""
        self._check_live()
        token = int(token)
        self._check_token(token)
        ctx = self.store.ctx
        advanced = False
        try:
            row = ctx.decode_single(token, pos=self._kv_len, seq_id=self.seq_id)
            with _sigint_deferred():
                self._advance(token, row)
                advanced = True
        except BaseException:
            if not advanced:
                with _sigint_deferred():
                    ctx.memory.seq_rm(self.seq_id, self._kv_len)
            raise

    decode = commit

    def speculate(self, token: int, drafter: Any, **options: Any) -> Any:
        """Commit ``token`` (the pending one: from :meth:`sample` or the last step's
        ``next``) and the drafted tokens this branch's sampler agrees with, in one
        ``llama_decode``: :func:`samplers.speculative.speculative_step` for this branch
        alone (``options``: its ``budget``, ``is_end``, ``verify``, and ``on_commit``, a
        callable). Returns its :class:`~samplers.speculative.StepResult`."""
        from .speculative import speculative_step

        hook = options.pop("on_commit", None)
        if hook is not None:
            options["on_commit"] = {self: hook}
        return speculative_step(self.store, {self: int(token)}, {self: drafter}, **options)[self]

    # ------------------------------------------------------------------ steering
    def _set_row(self, row: Any) -> None:
        """The model's new logits (after a decode): the snapshot is the model's own again."""
        np.copyto(self._logits, row)
        self._orig = None

    def _model_row(self) -> npt.NDArray[np.float32]:
        """The model's logits for the next token (the snapshot before any edit)."""
        return self._orig if self._orig is not None else self._logits

    def _editable(self) -> npt.NDArray[np.float32]:
        """The snapshot, to be edited: the model's logits are kept in ``_orig`` first."""
        if self._orig is None:
            if self._orig_buf is None:
                self._orig_buf = np.empty_like(self._logits)
            np.copyto(self._orig_buf, self._logits)
            self._orig = self._orig_buf
        self._pending = None
        return self._logits

    @property
    def model_logits(self) -> npt.NDArray[np.float32]:
        """The model's logits for the next token, whatever edits the snapshot has
        (read-only view)."""
        v: npt.NDArray[np.float32] = self._model_row().view()
        v.flags.writeable = False
        return v

    @property
    def edited(self) -> bool:
        """Whether the snapshot differs from the model's logits by an edit."""
        return self._orig is not None

    def set_logits(self, logits: npt.ArrayLike) -> None:
        """Replace the logits the next :meth:`sample` draws from (``n_vocab`` floats, no
        NaN). The model's own stay in :attr:`model_logits`: metrics and log-probabilities
        keep measuring the model, while the sampler draws from the edited snapshot. The
        next decode of this branch replaces both."""
        self._check_live()
        arr = np.asarray(logits, dtype=np.float32)
        if arr.shape != self._logits.shape:
            raise ParamError(f"logits must have shape {self._logits.shape}, not {arr.shape}")
        if np.isnan(arr).any():
            raise ParamError("logits contain NaN")
        np.copyto(self._editable(), arr)

    def add_logits(self, bias: npt.ArrayLike | Mapping[int, float]) -> None:
        """Add ``bias`` to the snapshot: an array of ``n_vocab`` floats, or ``{token: bias}``
        (``-inf`` bans a token). See :meth:`set_logits`."""
        self._check_live()
        if isinstance(bias, Mapping):
            row = self._editable()
            for tok, b in bias.items():
                t = int(tok)
                if not 0 <= t < row.shape[0]:
                    raise ParamError(f"token {t} is out of range [0, {row.shape[0]})")
                if np.isnan(b):
                    raise ParamError(f"the bias of token {t} is NaN")
                row[t] += np.float32(b)
            return
        arr = np.asarray(bias, dtype=np.float32)
        if arr.shape != self._logits.shape or np.isnan(arr).any():
            raise ParamError(f"a bias must be {self._logits.shape[0]} floats without NaN")
        self._editable()[...] += arr

    def contrast(self, other: Branch, alpha: float = 1.0) -> None:
        """Contrastive decoding / classifier-free guidance: the snapshot becomes
        ``(1 + alpha) * mine - alpha * other's`` (both the model's logits, whatever edits
        either has), e.g. with ``other`` the same text without its instruction."""
        self._check_live()
        other._check_live()
        if other.store.n_vocab != self.store.n_vocab:
            raise ParamError("the two branches' models have different vocabularies")
        a = float(alpha)
        if not np.isfinite(a):
            raise ParamError(f"alpha must be finite, not {alpha!r}")
        row = self._editable()  # the model's logits are in self._orig now
        mine, theirs = self._model_row(), other._model_row()  # (other may be self)
        with np.errstate(invalid="ignore"):
            np.multiply(mine, 1.0 + a, out=row)
            row -= a * theirs
        np.copyto(row, -np.inf, where=np.isnan(row))  # -inf in both: the token stays banned

    def reset_logits(self) -> None:
        """Undo every edit: the snapshot is the model's logits again."""
        if self._orig is not None:
            np.copyto(self._logits, self._orig)
            self._orig = None

    def set_sampler(self, sampler: Sampler | None, grammar: Any = None) -> None:
        """Sample with ``sampler`` (greedy when None) from now on, with ``grammar`` (GBNF
        text, a JSON schema, a Grammar or a matcher) first when given; the grammar starts
        from here (what the branch generated before is not fed to it). The metrics tracker
        stays."""
        self._check_live()
        tracker = self.sampler.tracker
        self.sampler = _as_chain(sampler, grammar, self.store.ctx.model)
        if tracker is not None and self.sampler.tracker is None:
            self.sampler.tracker = tracker
        self._pending = None

    def set_grammar(self, grammar: Any) -> None:
        """Swap the chain's grammar for ``grammar`` (None removes it), keeping the other
        samplers and their state (penalty history, random engine). The new grammar starts
        from here."""
        self._check_live()
        rest = [s for s in self.sampler.samplers if getattr(s, "matcher", None) is None]
        chain = SamplerChain(rest, tracker=self.sampler.tracker) if rest else None
        self.sampler = _as_chain(chain, grammar, self.store.ctx.model)
        self._pending = None

    @property
    def sampling_entropy(self) -> float:
        """Entropy (nats) of the distribution this branch's sampler would draw the next
        token from: the snapshot after every sampler of the chain (truncation, temperature,
        grammar, penalties). Computed on a clone of the chain, so no random number is
        drawn and no state changes."""
        self._check_live()
        cands = self.store._cands
        try:
            cands.reset(self._logits)
            for s in self.sampler.clone().samplers:
                s.apply(cands)
            return float(entropy(np.ascontiguousarray(cands.read_logits(), dtype=np.float32)))
        finally:
            cands.release()

    def reseed(self, seed: int | None) -> None:
        """Reseed every random sampler of the chain (None: draw a random seed)."""
        for s in self.sampler.samplers:
            if hasattr(s, "reseed"):
                s.reseed(seed)
            elif hasattr(s, "rng") and hasattr(s.rng, "reseed"):
                s.rng.reseed(seed)

    # ------------------------------------------------------------------ the context's edge
    def clear_and_reseed(self, sinks: int = 4, tail: int | None = None) -> None:
        """StreamingLLM: rebuild this sequence from its first ``sinks`` tokens and its last
        ``tail`` (default: half of what the context holds per sequence), so generation
        can go on past ``n_ctx``. The history (:attr:`tokens`) is kept; :attr:`position`
        becomes ``sinks + tail``; the logits snapshot is recomputed. Sampler and metrics
        are untouched."""
        self._check_live()
        ctx = self.store.ctx
        if tail is None:
            tail = ctx.n_ctx_seq // 2
        if sinks < 0 or tail < 1:
            raise ParamError(f"sinks must be >= 0 and tail >= 1, not {sinks} and {tail}")
        hist = self._tokens
        keep = hist if len(hist) <= sinks + tail else hist[:sinks] + hist[-tail:]
        ctx.memory.seq_rm(self.seq_id)
        try:
            row = ctx.decode(keep, pos=0, seq_id=self.seq_id)
        except BaseException:
            ctx.memory.seq_rm(self.seq_id)  # chunks that fitted: the sequence is empty now
            self._kv_len = 0
            raise
        self._set_row(row)
        self._kv_len = len(keep)
        self._pending = None

    def shift_context(self, n_discard: int, sinks: int = 4) -> None:
        """Drop ``n_discard`` positions after the first ``sinks`` and shift the rest down
        (``seq_rm`` + ``seq_add``: no recomputation), where the memory can shift
        (``ctx.memory.can_shift``). Refused while other branches are live: with a unified
        cache they may share these cells, whose positions would move for them too."""
        self._check_live()
        ctx = self.store.ctx
        if ctx.model.is_recurrent or ctx.model.is_hybrid:
            raise BranchError(
                "a recurrent state cannot drop tokens (they stay mixed into it): use clear_and_reseed, which "
                "decodes the kept tokens again"
            )
        if not ctx.memory.can_shift:
            raise BranchError("this context's memory cannot shift positions: use clear_and_reseed")
        if len(self.store) > 1:
            raise BranchError("shift_context needs this branch to be the only live one (cells may be shared)")
        if not (0 <= sinks and 0 < n_discard <= self._kv_len - sinks - 1):
            raise ParamError(f"n_discard={n_discard} and sinks={sinks} must leave at least one position")
        mem = ctx.memory
        mem.seq_rm(self.seq_id, sinks, sinks + n_discard)
        mem.seq_add(self.seq_id, sinks + n_discard, -1, -n_discard)
        self._kv_len -= n_discard

    def truncate(self, position: int) -> None:
        """Drop this branch's tokens from ``position`` on (``1 <= position <= self.position``):
        their KV cells are removed, the history is cut, and the logits after the token at
        ``position - 1`` are recomputed (one decode of one token), so the branch is as if
        it had only ever held its first ``position`` tokens. Sampler and metrics are left
        as they are. Needs positions that match the history (not after
        :meth:`clear_and_reseed` or :meth:`shift_context`) and a memory that can remove
        positions (not a recurrent state). If the decode fails, the branch holds its first
        ``position - 1`` tokens and the error is raised."""
        self._check_live()
        if isinstance(position, bool) or not isinstance(position, (int, np.integer)):
            raise ParamError(f"position must be an int, not {position!r}")
        position = int(position)
        if not 1 <= position <= self._kv_len:
            raise ParamError(f"position={position} is outside [1, {self._kv_len}]")
        if position == self._kv_len:
            return
        if self._kv_len != len(self._tokens):
            raise BranchError(
                f"branch {self.seq_id} was rebuilt by clear_and_reseed/shift_context: its positions no longer "
                "match its history"
            )
        ctx = self.store.ctx
        if ctx.model.is_recurrent or ctx.model.is_hybrid:
            raise BranchError("a recurrent state cannot drop tokens: create a branch from the prefix instead")
        last = self._tokens[position - 1]
        with _sigint_deferred():
            ctx.memory.seq_rm(self.seq_id, position - 1, -1)
            self._kv_len = position - 1
            del self._tokens[position - 1 :]
            self._accepted = [a for a in self._accepted if a[0] < position]
            self._pending = None
        row = ctx.decode_single(last, pos=position - 1, seq_id=self.seq_id)
        with _sigint_deferred():
            self._set_row(row)
            self._tokens.append(last)
            self._kv_len = position

    # ------------------------------------------------------------------ tree
    def fork(self, seed: int | None = None, clone_logits: bool = True, at: int | None = None) -> Branch:
        """A child with this branch's KV (``seq_cp``), history, sampler state (cloned; RNG
        reseeded when ``seed`` is given), grammar state, metrics and logits snapshot.
        ``clone_logits=False`` leaves the child's snapshot zeroed (cheaper, for a child that
        is fed tokens with :meth:`BranchStore.prefill` or :meth:`commit` right away).

        ``at=p`` forks from a prefix: the child holds the first ``p`` tokens
        (``1 <= p <= position``) and shares their KV, except the last one, which is
        decoded again into the child to recompute the logits after it (one
        ``llama_decode`` of one token). Its sampler is a reset clone that re-accepts the
        accepted tokens before ``p`` (grammar state exact; the random engine restarts
        from its seed, as ``llama_sampler_reset`` does, unless ``seed`` is given) and its
        metrics are replayed from the per-token record. Needs the positions to match the
        history (not after :meth:`clear_and_reseed` or :meth:`shift_context`) and, for a
        proper prefix, a unified KV cache (``kv_unified=True``)."""
        self._check_live()
        if at is not None:
            if isinstance(at, bool) or not isinstance(at, (int, np.integer)):
                raise ParamError(f"at must be an int position, not {at!r}")
            at = int(at)
            if not 1 <= at <= self._kv_len:
                raise ParamError(f"at={at} is outside [1, {self._kv_len}] (the positions branch {self.seq_id} holds)")
            if self._kv_len != len(self._tokens):
                raise BranchError(
                    f"branch {self.seq_id} was rebuilt by clear_and_reseed/shift_context: its positions no "
                    "longer match its history, so it cannot be forked at a position"
                )
            if at < self._kv_len and (self.store.ctx.model.is_recurrent or self.store.ctx.model.is_hybrid):
                raise BranchError(
                    "a recurrent state holds no earlier positions to fork from: fork at the current position, "
                    "or create a branch from the prefix's tokens"
                )
            if at < self._kv_len:
                return self._fork_prefix(at, seed)
        store = self.store
        with store._fresh_id() as sid, _sigint_deferred():  # no decode: Ctrl-C waits for it all
            store.ctx.memory.seq_cp(self.seq_id, sid)
            logits = self._logits.copy() if clone_logits else np.zeros_like(self._logits)
            metrics = self.tracker.clone() if self.tracker is not None else None
            child = Branch(store, sid, self, list(self._tokens), self.sampler.clone(), metrics, logits)
            child._kv_len = self._kv_len
            child._accepted = list(self._accepted)
            child._orig = self._orig.copy() if self._orig is not None and clone_logits else None
            child.steer = self.steer
            if seed is not None:
                child.reseed(seed)
            store._register(child)
        return child

    def _fork_prefix(self, at: int, seed: int | None) -> Branch:
        store = self.store
        ctx = store.ctx
        with store._fresh_id() as sid:
            if at > 1:
                ctx.memory.seq_cp(self.seq_id, sid, 0, at - 1)
            row = ctx.decode_single(self._tokens[at - 1], pos=at - 1, seq_id=sid)
            with _sigint_deferred():
                logits = np.array(row, dtype=np.float32, copy=True)
                del row
                k = 0
                while k < len(self._accepted) and self._accepted[k][0] < at:
                    k += 1
                accepted = self._accepted[:k]
                sampler = self.sampler.clone()
                sampler.reset()
                for _, tok, _, _ in accepted:
                    sampler.accept(tok)
                metrics: PerplexityTracker | None = None
                if self.tracker is not None:
                    metrics = self.tracker.clone()
                    metrics.reset()
                    for _, _, model, samp in accepted:
                        if model is not None:
                            metrics.add(model, samp)
                child = Branch(store, sid, self, self._tokens[:at], sampler, metrics, logits)
                child._accepted = accepted
                if seed is not None:
                    child.reseed(seed)
                store._register(child)
        return child

    def prune(self, reparent: bool = False) -> None:
        """Remove this branch's KV and free its id. Refused while it has live children,
        unless ``reparent``: they then become children of this branch's parent (their
        KV is their own; removing this sequence's cells leaves theirs)."""
        self._check_live()
        if self._children and not reparent:
            raise BranchError(f"branch {self.seq_id} has {len(self._children)} live children: prune them first")
        with _sigint_deferred():
            for c in self._children:
                c._parent = self._parent
                if self._parent is not None:
                    self._parent._children.append(c)
            self._children.clear()
            self.store.ctx.memory.seq_rm(self.seq_id)
            self._release()

    def prune_subtree(self) -> None:
        """Prune every descendant, then this branch."""
        self._check_live()
        for c in list(self._children):
            c.prune_subtree()
        self.prune()

    def detach(self) -> None:
        """Forget this branch without touching the KV cache (its id is cleaned on reuse);
        its children become roots."""
        self._check_live()
        with _sigint_deferred():
            for c in self._children:
                c._parent = None
            self._children.clear()
            self._release()

    def _release(self) -> None:
        if self._parent is not None and self in self._parent._children:
            self._parent._children.remove(self)
        self._parent = None
        self._dead = True
        del self.store._live[self.seq_id]
        self.store._give_id(self.seq_id)
