"""Branches: many continuations of one prompt sharing one context's KV cache.

A :class:`BranchStore` owns a context's sequence ids. Each :class:`Branch` is one
sequence with its own token history, sampler chain (grammar included), perplexity
tracker and a **logits snapshot** (the logits that follow its last token, so a branch
can be sampled any time, whatever was decoded since). Branches advance together
through :meth:`BranchStore.step`: one ``llama_decode`` for all::

    store = BranchStore(ctx)            # ctx made with n_seq_max=N, kv_unified=True
    root = store.create(prompt, sampler=SamplerChain([TopK(40), Dist(1)]))
    kids = [root.fork(seed=i) for i in range(4)]
    for _ in range(32):
        store.step(store.sample(kids))  # {b: b.sample() for b in kids} too, one chain at a time
    best = min(kids, key=lambda b: b.perplexity)
    store.retain_only(best)

The host work of a step is done once for all its rows. Right after the decode one C
call (:class:`llama_cffi.kernels.RowMeasures`, on ``n_threads`` threads, GIL released)
reads each branch's new row once: its maximum, log-normaliser and entropy (what the
metrics need), and the ``k`` best candidates when the branch's chain begins with
``TopK(k)``. Such a chain then runs on those ``k`` candidates only: the same tokens as
on the whole row (top-k keeps exactly these, in this order), for microseconds instead
of a pass over the vocabulary. A chain that begins with a grammar and then ``TopK(k)``
runs so too, with llama.cpp's fast path (``common_sampler_sample``, as
:meth:`SamplerChain.choose`): its samplers after the grammar choose from the row's ``k``
best candidates, a token the grammar allows stands (one token checked, no mask), and
only a row whose token it rejects is read again, for the ``k`` best candidates its mask
allows (one C pass over the mask's set bits, :func:`llama_cffi.kernels.masked_top_k_rows`);
those rows' masks come from one :func:`~samplers.grammar.fill_masks` call. Chains that
need the whole row (penalties over the vocabulary, logit bias, DRY, a grammar before
anything but top-k, a steering hook or edited logits) get it, as before: they cost a pass
over ``n_vocab`` logits per token (a grammar's masks more).

Snapshots are **zero-copy** while they can be: a branch's row stays in the context's
output buffer, where the decode wrote it, until llama.cpp is about to overwrite it (any
other decode on the context, a state load, close); the store then copies the rows its
branches still need (the context tells it: ``Context._add_output_hook``). Stepping
every live branch each time copies nothing.

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
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from llama_cffi import Batch
from llama_cffi._args import (
    expect,
    expect_array,
    expect_bool,
    expect_callable,
    expect_int,
    expect_iterable,
    expect_mapping,
    expect_number,
    expect_pairs,
    type_error,
)
from llama_cffi.errors import ClosedError, LlamaError, ParamError, ParamTypeError, UnsupportedError
from llama_cffi.kernels import RowMeasures, RowStatus
from llama_cffi.sampling import InvalidLogitsError, LlamaSampler

from . import chain_batch
from .base import Sampler
from .candidates import Candidates
from .chain import SamplerChain, _check_tracker, surprisal_of
from .measure import PerplexityTracker, entropy
from .selection import Greedy
from .truncation import TopK

if TYPE_CHECKING:
    from llama_cffi import Context
    from llama_cffi.mtmd import Chunks

    from .params import SamplingParams

# the C module: signal.signal/getsignal wrap every call in enum conversions (~10 us)
_signal: Any = getattr(signal, "_signal", None) or signal


class BranchError(LlamaError, RuntimeError):
    """A branch operation that cannot be done (pruned branch, live children, ...)."""


class CapacityError(BranchError):
    """Every sequence id of the context is in use (``n_seq_max`` branches live)."""


@dataclass(frozen=True)
class NewBranch:
    """A root branch for :meth:`BranchStore.step` (``new=``) or
    :meth:`BranchStore.create_many` to make: ``prompt`` (token ids, at least one) decoded
    into a fresh sequence, with ``sampler``, ``grammar``, ``seed``, ``track`` and
    ``tracker`` as in :meth:`BranchStore.create`.

    ``prefix_from``/``prefix_len``: start from the KV of the first ``prefix_len`` tokens of
    a live branch (they must equal the prompt's first tokens), copied with ``seq_cp`` (no
    KV data copied in a unified cache) rather than decoded; the rest of the prompt (at
    least one token) is decoded. :meth:`BranchStore.share_refusal` says when a memory
    cannot do it. The new branch is a root: pruning ``prefix_from`` later leaves it its
    cells."""

    prompt: Sequence[int] | npt.NDArray[np.integer[Any]]
    sampler: Sampler | SamplingParams | None = None
    grammar: Any = None
    seed: int | None = None
    track: bool = True
    tracker: PerplexityTracker | None = None
    prefix_from: Branch | None = None
    prefix_len: int = 0


@dataclass(eq=False)
class _Spec:
    """A :class:`NewBranch` checked, while it is made: its sequence id and how many of its
    tokens the sequence holds (``offset``)."""

    index: int
    tokens: list[int]
    chain: SamplerChain
    seed: int | None
    track: bool
    tracker: PerplexityTracker | None
    source: Branch | None
    prefix_len: int
    sid: int = -1
    offset: int = 0


#: A chain that begins with ``TopK(k)`` for ``k`` up to this many samples from the ``k``
#: candidates found when its row was measured; a larger ``k`` reads the whole row.
FAST_K_MAX = 1024

#: With ``device=True`` the device returns ``k + DEVICE_MARGIN`` candidates per row: the
#: host then finds the ``k`` a stable sort keeps (ties at the cut go to the lower id) unless
#: more than this many tokens tie with the ``k``-th logit, and knows the logit (so the
#: surprisal) of a token taken from a little past the cut.
DEVICE_MARGIN = 16

_SIGINT = int(signal.SIGINT)

# plain ints: an Enum attribute read can swallow a KeyboardInterrupt in CPython 3.11 (a
# signal handled inside EnumType.__getattr__, which the lookup then discards)
_ST_OK = int(RowStatus.OK)
_ST_NAN = int(RowStatus.NAN)
_ST_TIE = int(RowStatus.TIE_AT_CUT)
_clock = time.perf_counter

#: a step whose rows took longer than this (seconds) to arrive after the host's work (a
#: decode that runs on after llama_decode returns: a GPU) makes the next step's grammar masks
#: while its decode runs; PREFETCH_KEEP_S: the wait under which a step that did so stops
#: (the masks took the whole decode's time: the host, not the device, set the pace)
PREFETCH_WAIT_S = 3e-4
PREFETCH_KEEP_S = 5e-5


def _lead_k(chain: SamplerChain, n_vocab: int) -> int:
    """``min(k, n_vocab)`` when ``chain`` can run on its row's ``k`` best candidates (it
    begins with a plain ``TopK(k)``, ``0 < k <= FAST_K_MAX``, and checks no token against a
    grammar), 1 for a chain that is only ``Greedy`` (the row's best candidate, ties by the
    lower id, is its argmax), else 0."""
    samplers = chain.samplers
    if not samplers:
        return 0
    first = samplers[0]
    if type(first) is Greedy and len(samplers) == 1:
        return 1
    if type(first) is not TopK or not 0 < first.k <= FAST_K_MAX:
        return 0
    for s in samplers:
        if getattr(s, "allows", None) is not None:
            return 0
    return min(first.k, n_vocab)


def _grammar_sig(chain: SamplerChain, store: BranchStore) -> chain_batch.Signature | None:
    """The signature of the samplers after the grammar when :meth:`BranchStore.sample` runs
    ``chain`` with llama.cpp's grammar fast path on its row's best candidates (see
    :func:`samplers.chain_batch.grammar_signature`; a batched store on the host, ``k <=
    FAST_K_MAX``), else None."""
    if not store.batched or store.device:
        return None
    sig = chain_batch.grammar_signature(chain)
    return sig if sig is not None and _fast_k(sig) else None


def _fast_k(sig: chain_batch.Signature) -> bool:
    """Whether a grammar chain's first ``TopK`` (``sig[0]``) is small enough for the fast
    path on the row's best candidates."""
    k: Any = sig[0][1]
    return int(k) <= FAST_K_MAX


def _grammar_lead_k(chain: SamplerChain, store: BranchStore) -> int:
    """``min(k, n_vocab)`` for the candidates :func:`_grammar_sig`'s chains start from, else 0."""
    sig = _grammar_sig(chain, store)
    return 0 if sig is None else min(int(sig[0][1]), store.n_vocab)  # type: ignore[call-overload]


def _greedy_only(chain: SamplerChain) -> bool:
    s = chain.samplers
    return len(s) == 1 and type(s[0]) is Greedy


def _as_chain(sampler: Sampler | SamplingParams | None, grammar: Any, vocab: Any) -> SamplerChain:
    """The chain a branch runs: ``sampler`` (a sampler, a chain, or SamplingParams: its
    chain for the model ``vocab``; greedy when None), with ``grammar`` first."""
    from .params import as_sampler

    sampler = as_sampler(sampler, vocab)
    chain = sampler if isinstance(sampler, SamplerChain) else SamplerChain([sampler or Greedy()])
    if grammar is not None:
        from .grammar import Grammar, GrammarMatcher, GrammarSampler
        from .grammar.compiled import CompiledGrammar

        pydantic = any(callable(getattr(grammar, a, None)) for a in ("model_json_schema", "json_schema"))
        if isinstance(grammar, (dict, bool)) or pydantic:
            grammar = Grammar.from_json_schema(grammar)  # a schema, or a pydantic model or TypeAdapter
        elif isinstance(grammar, str):
            grammar = Grammar.from_gbnf(grammar)
        if not isinstance(grammar, (Grammar, CompiledGrammar, GrammarMatcher)):
            raise ParamError(f"grammar must be GBNF text, a JSON schema, a Grammar or a matcher, not {grammar!r}")
        chain = SamplerChain([GrammarSampler(grammar, vocab), *chain.samplers], tracker=chain.tracker)
    return chain


def _detach_all(ctx_ref: weakref.ref[Context], attached: dict[int, tuple[int, bool, int]]) -> None:
    """A device store's finalizer: take its backend samplers off the context (best effort:
    a context closed or busy meanwhile keeps them until it closes)."""
    ctx = ctx_ref()
    if ctx is None or ctx.closed:
        return
    for sid in list(attached):
        try:
            ctx.set_backend_sampler(sid, None)
        except LlamaError:
            return
        del attached[sid]


@contextmanager
def _sigint_deferred(on_hit: Callable[[], object] | None = None) -> Iterator[None]:
    """Hold Ctrl-C (SIGINT's KeyboardInterrupt) until the block is done, then raise it
    (also when the block raised: its error becomes the interrupt's context).

    A branch's bookkeeping after a successful decode (sampler, grammar, metrics, history,
    snapshot) must not stop half-way. ``on_hit`` is called when the interrupt arrives
    (``Context.request_abort``: a decode in the block stops at its next graph node). Only
    in the main thread and only while Python's default handler is installed (a user's own
    handler is left alone); elsewhere a no-op.
    """
    if threading.current_thread() is not threading.main_thread() or (
        _signal.getsignal(_SIGINT) is not _signal.default_int_handler
    ):
        yield
        return
    hit: list[bool] = []

    def held(signum: int, frame: object) -> None:
        hit.append(True)
        if on_hit is not None:
            on_hit()

    _signal.signal(_SIGINT, held)
    try:
        yield
    finally:
        _signal.signal(_SIGINT, _signal.default_int_handler)
        if hit:  # also when the block raised: the interrupt is not lost (the error is its context)
            raise KeyboardInterrupt


class BranchStore:
    """The branches of one context (see the module docstring). ``ctx`` should have
    ``n_seq_max`` at least the number of live branches you want, and ``kv_unified=True``
    for forks that copy no KV data.

    ``n_threads``: threads that measure a step's rows (default: the cores this process may
    use). ``batched=False`` turns the step's row kernel off: every branch then samples
    from its whole row and is measured row by row (the reference path, with the same
    tokens; metrics differ by float64 rounding, relatively ~1e-15).

    ``device=True`` moves the truncation and the measures into llama.cpp's graph (its
    backend sampling, on the device that computes the logits; ggml's CPU backend too):
    each branch's sequence gets a chain of llama_cffi's measuring sampler (for a branch
    that tracks metrics; without one, its :attr:`Branch.entropy` is not known) and
    ``top_k(k + DEVICE_MARGIN)``, so only those candidates and three measures per row
    come back to the host, and the branch's own chain runs on them. Every chain must then
    begin with ``TopK(k)`` (``k <= FAST_K_MAX``) and hold no grammar, or be ``Greedy``
    alone; what needs a whole
    row (the ``logits`` snapshot, edits, steering, speculative steps, metrics of a forced
    token past the candidates) raises :class:`BranchError`. Tokens are the host path's
    (the candidates are the same logits, sorted the same way; see :data:`DEVICE_MARGIN`
    for ties); measures are ggml's float32 arithmetic, equal to the host's to about 1e-6
    (relative, perplexities)."""

    def __init__(
        self, ctx: Context, *, n_threads: int | None = None, batched: bool = True, device: bool = False
    ) -> None:
        from llama_cffi import Context

        expect("ctx", ctx, Context, "a llama_cffi.Context")
        batched = expect_bool("batched", batched)
        device = expect_bool("device", device)
        if device and not batched:
            raise ParamError("device=True measures rows on the device: it needs batched=True")
        self.ctx = ctx
        self.n_vocab = ctx.n_vocab
        self.batched = bool(batched)
        self.device = bool(device)
        #: device mode: seq id -> (candidates its backend chain returns, whether it measures,
        #: the top-k of the branch's chain)
        self._attached: dict[int, tuple[int, bool, int]] = {}
        self._free: list[int] = list(range(ctx.n_seq_max - 1, -1, -1))  # pop() gives the lowest
        self._live: dict[int, Branch] = {}
        self._batch = Batch(ctx.n_batch)
        self._cands = Candidates(ctx.n_vocab)
        #: each branch's row, measured (slot = sequence id): max, log-normaliser, entropy and
        #: best candidates; n_threads: the threads that share a step's rows (default: the
        #: cores this process may use)
        self.measures = RowMeasures(ctx.n_vocab, ctx.n_seq_max, 0, n_threads)
        self._has_cands = np.zeros(ctx.n_seq_max, dtype=bool)  # slot holds the row's candidates
        self._has_stats = np.zeros(ctx.n_seq_max, dtype=bool)  # slot holds the row's measures
        #: the last decode's rows (a raw array into the context's output buffer) while
        #: branches read their snapshot from it; _lazy: those branches
        self._rows: npt.NDArray[np.float32] | None = None
        self._lazy: set[Branch] = set()
        self._consuming: frozenset[int] | None = None  # during step(): the branches decoded now
        #: whether a step makes its grammars' masks while its decode runs (see _note_wait)
        self._prefetch = False
        #: media chunk key -> its placeholder in branch histories (-1, -2, ...)
        self._media_keys: dict[str, int] = {}
        ctx._add_output_hook(self._outputs_changing)
        if self.device:  # a store dropped without drain(): its sequences sample on the host again
            weakref.finalize(self, _detach_all, weakref.ref(ctx), self._attached)

    def _outputs_changing(self) -> None:
        """The context's outputs are about to be overwritten (a decode, a state load,
        close): copy the rows branches still read from them. During :meth:`step` the
        stepped branches are left: they get new rows, and on failure their old ones are
        still there (see :meth:`step`)."""
        keep = self._consuming
        for b in list(self._lazy):
            if keep is None or b.seq_id not in keep:
                b._materialize()
        if keep is None:
            self._rows = None

    def _measure(self, branches: Sequence[Branch], rows: Any, stats: bool = True) -> None:
        """Measure ``rows`` (row i: branch i's snapshot, the model's logits) into the
        branches' slots: measures where they track metrics, candidates where their chain
        begins with top-k. ``stats=False``: candidates only, for rows measured before (their
        measures stay). A failure leaves the slots marked unmeasured (computed again when
        needed)."""
        if not self.batched:
            return
        slots = [b.seq_id for b in branches]
        ks = [b._want_k() for b in branches]
        track = [stats and b.tracker is not None for b in branches]
        has_cands, has_stats = self._has_cands, self._has_stats
        has_cands[slots] = False
        if stats:  # new rows (a stats=False call re-reads rows whose measures are kept)
            has_stats[slots] = False
        kmax = max(ks, default=0)
        if kmax > self.measures.k_stride:
            self.measures.reserve(kmax)
        if isinstance(rows, np.ndarray) and rows.ndim == 2:
            self.measures._compute(rows, slots, ks, track)  # the step's rows: made here, checked
        else:
            self.measures.compute(rows, slots, ks, track)
        has_cands[slots] = [k > 0 for k in ks]
        if stats:
            has_stats[slots] = track

    def _attach(self, sid: int, chain: SamplerChain, track: bool) -> None:
        """Device mode: give sequence ``sid`` the backend chain that ``chain`` needs
        (``top_k(k + DEVICE_MARGIN)``, after the measures when ``track``: the branch tracks its
        metrics), unless it has it."""
        if not self.device:
            return
        k = _lead_k(chain, self.n_vocab)
        if not k:
            raise BranchError(
                f"a store made with device=True samples from each row's top-k on the device: {chain!r} must begin "
                f"with TopK(k), 1 <= k <= {FAST_K_MAX}, and hold no grammar (or be Greedy alone)"
            )
        want = min(k + DEVICE_MARGIN, self.n_vocab)
        have = self._attached.get(sid)
        if have is not None and have[0] >= want and have[1] == track:
            self._attached[sid] = (have[0], track, k)
            return
        top = LlamaSampler.top_k(want)
        dev = LlamaSampler.chain([LlamaSampler.measure(), top] if track else [top])
        if not self.ctx.set_backend_sampler(sid, dev):
            self.ctx.set_backend_sampler(sid, None)
            self._attached.pop(sid, None)
            raise UnsupportedError(
                "this context's device cannot run top-k and llama_cffi's measures in llama.cpp's sampling graph: "
                "use BranchStore(ctx) (device=False)"
            )
        self._attached[sid] = (want, track, k)
        self.measures.reserve(want)

    def _detach(self, sid: int) -> None:
        if self._attached.pop(sid, None) is not None:
            self.ctx.set_backend_sampler(sid, None)

    def _read_device(self, branches: Sequence[Branch], idx: Sequence[int]) -> None:
        """Device mode: the branches' new rows are outputs ``idx`` (batch indices) of the
        last decode: read what their backend chains left into their slots."""
        slots = np.fromiter((b.seq_id for b in branches), dtype=np.int32, count=len(branches))
        attached = self._attached
        ks = np.fromiter((attached[b.seq_id][2] for b in branches), dtype=np.int32, count=len(branches))
        self._has_cands[slots] = False
        self._has_stats[slots] = False
        meas = self.measures
        meas.read_device(self.ctx.underlying, idx, slots, ks)
        self._has_cands[slots] = (meas.n_top[slots] >= ks) & (ks > 0)
        self._has_stats[slots] = np.isfinite(meas.log_norm[slots])

    def sample(self, branches: Iterable[Branch] | None = None) -> dict[Branch, int]:
        """A token for each of ``branches`` (default: every live branch), chosen by its own
        sampler as :meth:`Branch.sample` does; ready for :meth:`step`.

        Branches whose chains share one configuration that :mod:`samplers.chain_batch` can
        run row-wise (``TopK`` first, then top-p, min-p, temperature, and dist or greedy;
        or a grammar, then such a chain) are sampled together, in a few numpy calls over
        their candidates: the same tokens and sampling surprisals as one by one. The
        others go one by one."""
        if branches is not None:
            expect_iterable("branches", branches, "an iterable of Branch, or None")
        todo = [b for b in self.branches if not b._held] if branches is None else list(branches)
        if not self.batched or len(todo) < 2:
            self._give_masks(todo)
            return {b: b.sample() for b in todo}
        groups: dict[chain_batch.Signature, list[Branch]] = {}
        constrained: dict[chain_batch.Signature, list[Branch]] = {}  # chains that begin with a grammar
        single: list[Branch] = []
        host = not self.device  # (_grammar_sig's condition: a batched store on the host)
        group_signature = chain_batch.group_signature
        for b in todo:
            b._check_live()
            if b.store is not self:
                raise BranchError(f"{b!r} belongs to another store")
            if b._held:  # (one by one, Branch.sample refuses it)
                raise BranchError(f"{b!r} is a kept prompt (a prefix source, as a prompt cache entry): not sampled")
            if b.steer is None and b._orig is None:
                sig, grammar = group_signature(b.sampler)
                if sig is not None:
                    if not grammar:
                        groups.setdefault(sig, []).append(b)
                        continue
                    if host and _fast_k(sig):
                        constrained.setdefault(sig, []).append(b)
                        continue
            single.append(b)
        out: dict[Branch, int] = {}
        for sig, group in groups.items():
            if len(group) == 1:
                single.extend(group)
                continue
            self._sample_group(sig, group, out)
        for sig, group in constrained.items():
            self._sample_group(sig, group, out, constrained=True)
        self._give_masks(single)  # (the constrained groups' grammars check their tokens first)
        for b in single:
            out[b] = b.sample()
        return {b: out[b] for b in todo}

    def _note_wait(self, wait: float) -> None:
        """After a step's decode: ``wait`` (seconds) is how long reading its rows waited
        for llama.cpp once the host's own work was done. Whether the next step makes its
        grammars' masks while the decode runs (:attr:`_prefetch`) follows it: a decode
        that computes in the call (llama.cpp's CPU backend) leaves no wait, and the masks
        are made only for rows whose token a grammar rejects; a decode that runs on
        after the call (a GPU) leaves the host waiting, and masks made in that time cost
        the step nothing and spare the next sample its walks (see :data:`PREFETCH_WAIT_S`)."""
        if self._prefetch:
            self._prefetch = wait > PREFETCH_KEEP_S  # the masks fitted, with time left
        else:
            self._prefetch = wait > PREFETCH_WAIT_S

    def _prefetch_masks(self, branches: list[Branch]) -> None:
        """:meth:`_give_masks` for ``branches`` during the decode; a grammar whose mask fails
        (its budget, say) gets none here and raises when its sample needs it."""
        try:
            self._give_masks(branches)
        except Exception:  # (the sample computes it again, and raises there)
            pass

    def _give_masks(self, todo: list[Branch]) -> None:
        """Branches whose chain begins with an active grammar get this step's masks from one
        :func:`~samplers.grammar.fill_masks` call (:func:`~samplers.grammar.masks.shared_rows`:
        branches at one grammar state share one row, written once; their grammars then
        check the sampled token and mask candidates by reading it)."""
        gs = []
        for b in todo:
            chain = b.sampler
            first = chain.samplers[0] if isinstance(chain, SamplerChain) and chain.samplers else None
            if getattr(first, "use_mask", None) is not None and not first.awaiting and not first.matcher.ended:  # type: ignore[union-attr]
                if first._words() is None:  # type: ignore[union-attr]  # (not given one for its state already)
                    gs.append(first)
        if len(gs) < 2:
            return
        from .grammar.masks import shared_rows

        n_words = {g.matcher.compiled.n_words for g in gs}  # type: ignore[union-attr]
        if len(n_words) != 1:
            return
        rows = shared_rows([g.matcher for g in gs])  # type: ignore[union-attr]  # (one array per state)
        for g, row in zip(gs, rows, strict=True):
            g.use_mask(row)  # type: ignore[union-attr]

    def _sample_group(
        self, sig: chain_batch.Signature, group: list[Branch], out: dict[Branch, int], constrained: bool = False
    ) -> None:
        """Sample branches whose chains have signature ``sig`` together (see :meth:`sample`);
        ``constrained``: chains that begin with a grammar, ``sig`` the samplers' after it
        (a grammar's mask computed only when its token is rejected)."""
        k = min(int(sig[0][1]), self.n_vocab)  # type: ignore[call-overload]
        meas = self.measures
        slots = np.fromiter((b.seq_id for b in group), dtype=np.intp, count=len(group))
        need = [b for b, ok in zip(group, self._has_cands[slots] & (meas.n_top[slots] >= k), strict=True) if not ok]
        if need:
            if self.device:
                need[0]._fill(self._cands, need[0].sampler, False)  # raises the device's error
            self._measure(need, [b._row() for b in need])
        status = meas.status[slots]
        if (status == _ST_NAN).any():
            raise InvalidLogitsError("the logits contain NaN")
        lg = meas.top_logits[slots, :k]  # a copy (fancy indexing), sorted
        ids = meas.top_ids[slots, :k]
        if not np.isfinite(lg[:, 0]).all():  # a row without a finite candidate: one by one
            for b in group:
                out[b] = b._choose()
            return
        track = np.fromiter((b.tracker is not None for b in group), dtype=bool, count=len(group))
        if constrained:
            at = [b._row_i for b in group]  # (rows of this decode's outputs: read by index)
            outs = self._rows
            rows_at = None
            if outs is not None and None not in at and outs.ndim == 2 and outs.flags.c_contiguous:
                rows_at = (outs, np.array(at, dtype=np.intp))
            tokens, samp, raw = chain_batch.choose_constrained(
                sig,
                [b.sampler for b in group],
                ids,
                lg,
                lambda r: group[r]._row(),
                bool(track.any()),
                meas.n_threads,
                rows_at,
            )
        else:
            tokens, samp, pos = chain_batch.choose(sig, [b.sampler for b in group], ids, lg, bool(track.any()))
            raw = meas.top_logits[slots, pos]  # the model's logits of the chosen tokens
        # (as Python numbers once: a numpy scalar read per branch costs more than the rest)
        toks, logits_ = tokens.tolist(), raw.tolist()
        samps = samp.tolist() if samp is not None else [None] * len(group)
        for i, (b, tracked) in enumerate(zip(group, track.tolist(), strict=True)):
            t = toks[i]
            pending = b._pending = (t, samps[i] if tracked else None)
            b._pending_logit = (pending, logits_[i])
            out[b] = t

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
        self._detach(sid)
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
        prompt: Sequence[int] | npt.NDArray[np.integer[Any]] | Chunks,
        sampler: Sampler | SamplingParams | None = None,
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
        softmax over the vocabulary per token: ~0.5-1 ms at 262,144 tokens on 2 cores).

        ``prompt`` may also be a :class:`llama_cffi.mtmd.Chunks`: a prompt with images or
        sounds (:meth:`Projector.tokenize <llama_cffi.mtmd.Projector.tokenize>`,
        :meth:`~llama_cffi.mtmd.Projector.tokenize_chat`), decoded by its projector
        (:meth:`~llama_cffi.mtmd.Projector.eval`: the media's embeddings in place of
        tokens). It must end with text (the logits after its last token start the
        branch). The branch's history (:attr:`Branch.tokens`) then holds, for each cell of
        a medium, a negative placeholder (:meth:`cells`): the same for every cell of the
        same medium (same id), so forks and prefix comparisons share a medium's KV cells
        as they share tokens'. A medium cannot be decoded again from the history: a
        truncation or fork just after a medium's cell, and :meth:`Branch.clear_and_reseed`
        of a history with media, raise :class:`BranchError`."""
        from llama_cffi.mtmd import Chunks

        _check_tracker(tracker)
        track = expect_bool("track", track)
        if isinstance(prompt, Chunks):
            return self._create_media(prompt, _as_chain(sampler, grammar, self.ctx.model), seed, tracker, track)
        tokens = self.ctx.model.vocab.check_tokens(prompt, "prompt")
        if len(tokens) == 0:
            raise ParamError("a branch needs a prompt of at least one token")
        chain = _as_chain(sampler, grammar, self.ctx.model)
        model = self.ctx.model
        if model.has_encoder and model.has_decoder:
            return self._create_decoder(tokens, chain, seed, tracker, track)
        history = [int(t) for t in tokens]
        return self._create_root(
            history, lambda sid: self.ctx.decode(tokens, pos=0, seq_id=sid), chain, seed, tracker, track
        )

    def _create_root(
        self,
        history: list[int],
        prefill: Callable[[int], Any],
        chain: SamplerChain,
        seed: int | None,
        tracker: PerplexityTracker | None,
        track: bool,
    ) -> Branch:
        """A root branch holding ``history``: ``prefill(sid)`` decodes it into the fresh
        sequence and returns the logits row after its last cell."""
        with self._fresh_id() as sid:
            self._attach(sid, chain, track)
            row = prefill(sid)  # Ctrl-C here aborts the prefill
            with _sigint_deferred():  # after it, the branch is made in full first
                metrics = (tracker or PerplexityTracker()) if track else None
                b = Branch(self, sid, None, history, chain, metrics, None)
                b._set_output(row, int(self.ctx._out_index[-1]))
                del row
                if seed is not None:
                    b.reseed(seed)
                self._register(b)
        return b

    def cells(self, chunks: Any) -> list[int]:
        """The history a prompt with media (a :class:`llama_cffi.mtmd.Chunks`) gives a
        branch: its text tokens, and for each cell of a medium a negative placeholder
        (``-1``, ``-2``, ... in the order this store first meets each medium; a medium is
        its kind, id and size). Refused (:class:`~llama_cffi.errors.ParamError`) unless the
        prompt ends with text."""
        from llama_cffi.mtmd import Chunks

        expect("chunks", chunks, Chunks, "a llama_cffi.mtmd.Chunks (from Projector.tokenize)")
        out: list[int] = []
        last = "text"
        for c in chunks:
            last = c.kind
            if c.kind == "text":
                out.extend(int(t) for t in c.tokens)
            else:
                key = f"{c.kind}:{c.id}:{c.n_tokens}"
                ph = self._media_keys.setdefault(key, -1 - len(self._media_keys))
                out.extend([ph] * c.n_tokens)
        if last != "text" or not out or out[-1] < 0:
            raise ParamError("a branch's prompt must end with text: the logits after its last token start the branch")
        return out

    def _create_media(
        self, chunks: Any, chain: SamplerChain, seed: int | None, tracker: PerplexityTracker | None, track: bool
    ) -> Branch:
        """:meth:`create` from a prompt with media (see there)."""
        projector = chunks.projector
        if projector.uses_mrope:
            raise UnsupportedError(
                "a branch's positions are its cells; with M-RoPE (Qwen-VL) an image takes fewer positions than cells: "
                "decode such prompts with Projector.eval"
            )
        if projector.model is not self.ctx.model:
            raise ParamError("the prompt was tokenized by a projector of another model than this store's context")
        cells = self.cells(chunks)
        return self._create_root(
            cells,
            lambda sid: projector._eval(self.ctx, chunks, seq_id=sid, logits_last=True)[1],
            chain,
            seed,
            tracker,
            track,
        )

    def _extend_media(self, b: Branch, chunks: Any, start: int) -> None:
        """Decode the cells of ``chunks`` from ``start`` on into ``b``, which holds the
        ones before (a chat session's next turn); its logits after the last are captured.
        On failure the branch holds its first ``start`` cells, with its old snapshot."""
        b._check_live()
        cells = self.cells(chunks)
        if b._kv_len != start or b._tokens != cells[:start]:
            raise BranchError(f"{b!r} does not hold the prompt's first {start} cells")
        saved = b._save_row()
        try:
            _, row = chunks.projector._eval(self.ctx, chunks, seq_id=b.seq_id, logits_last=True, start_cell=start)
        except BaseException:
            with _sigint_deferred():
                self.ctx.memory.seq_rm(b.seq_id, start)
                b._restore_row(saved)
            raise
        with _sigint_deferred():
            b._tokens.extend(cells[start:])
            b._kv_len = len(cells)
            b._set_output(row, int(self.ctx._out_index[-1]))
            b._pending = None

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
            self._attach(sid, chain, track)
            row = ctx.start_decoder(tokens, seq_id=sid)
            with _sigint_deferred():
                metrics = (tracker or PerplexityTracker()) if track else None
                first = ctx.model.decoder_start_token
                start = first if first is not None else ctx.model.vocab.bos
                b = Branch(self, sid, None, [int(start if start is not None else 0)], chain, metrics, None)
                b._set_output(row, 0)
                del row
                if seed is not None:
                    b.reseed(seed)
                self._register(b)
        return b

    # ------------------------------------------------------------------ batched steps
    def step(
        self, moves: Mapping[Branch, int] | Iterable[tuple[Branch, int]], *, new: Sequence[NewBranch] = ()
    ) -> list[Branch]:
        """Append one token to each branch with one ``llama_decode`` for all of them, then
        accept each token (sampler, grammar, metrics on the snapshot that produced it) and
        take each branch's new logits (measured in one call for all). On failure no branch
        changes.

        ``new``: branches to make in the same decodes (continuous batching): each
        :class:`NewBranch`'s prompt is packed after the moves, up to ``n_batch`` tokens a
        decode (a long prompt spans several), and a prompt may start from the KV of
        another branch's prefix (``prefix_from``/``prefix_len``: copied with ``seq_cp``,
        not decoded). Returns the new branches, in the order of ``new`` (registered only
        once all are made: on failure none is, and their sequence ids are free again)."""
        moves = expect_pairs("moves", moves, "a mapping {Branch: token} or (branch, token) pairs")
        items = list(moves.items()) if isinstance(moves, Mapping) else [(b, int(t)) for b, t in moves]
        specs = self._check_new(new)
        if not items and not specs:
            return []
        seen: set[int] = set()
        for b, tok in items:
            b._check_live()
            if b.store is not self:
                raise BranchError(f"{b!r} belongs to another store")
            if b._held:
                raise BranchError(f"{b!r} is a kept prompt (a prefix source, as a prompt cache entry): not stepped")
            if b.seq_id in seen:
                raise BranchError(f"{b!r} appears twice in one step")
            seen.add(b.seq_id)
            b._check_token(int(tok))
        # measured now, on the rows that produced the tokens (the decode replaces them)
        accepted = [b._measure_accept(int(t)) for b, t in items]
        if not specs:
            cap = self._batch.capacity
            for start in range(0, len(items), cap):
                late = self._decode_step(items[start : start + cap], accepted[start : start + cap], [], [])
                if late is not None:
                    raise late
            return []
        return self._step_new(items, accepted, specs)

    def _check_new(self, new: Sequence[NewBranch]) -> list[_Spec]:
        """``new`` checked and resolved (tokens, chains) before anything changes."""
        if isinstance(new, NewBranch) or not isinstance(new, (list, tuple)):
            raise ParamTypeError(f"new must be a list of NewBranch, not {type(new).__name__}")
        if not new:
            return []
        model = self.ctx.model
        if model.has_encoder and model.has_decoder:
            raise UnsupportedError(
                "an encoder-decoder model holds one encoder input per context: make its branches one at a time "
                "with BranchStore.create"
            )
        if len(new) > len(self._free):
            raise CapacityError(
                f"{len(new)} new branches need as many free sequence ids; {len(self._free)} of "
                f"{self.ctx.n_seq_max} are free"
            )
        specs: list[_Spec] = []
        for i, nb in enumerate(new):
            expect(f"new[{i}]", nb, NewBranch, "a samplers.branch.NewBranch")
            tokens = [int(t) for t in model.vocab.check_tokens(nb.prompt, f"new[{i}].prompt")]
            if not tokens:
                raise ParamError(f"new[{i}]: a branch needs a prompt of at least one token")
            n = expect_int(f"new[{i}].prefix_len", nb.prefix_len)
            src = nb.prefix_from
            if src is None:
                if n != 0:
                    raise ParamError(f"new[{i}].prefix_len={n} needs prefix_from, the branch that holds the prefix")
            else:
                expect(f"new[{i}].prefix_from", src, Branch, "a Branch of this store, or None")
                src._check_live()
                if src.store is not self:
                    raise BranchError(f"new[{i}].prefix_from {src!r} belongs to another store")
                why = self.share_refusal(src, tokens, n)
                if why is not None:
                    raise BranchError(f"new[{i}]: {why}")
            if nb.seed is not None:
                expect_int(f"new[{i}].seed", nb.seed, "an int or None")
            chain = _as_chain(nb.sampler, nb.grammar, model)
            specs.append(_Spec(i, tokens, chain, nb.seed, bool(nb.track), nb.tracker, src, n))
        return specs

    def share_refusal(self, source: Branch, prompt: Sequence[int], n: int) -> str | None:
        """Why a new branch for ``prompt`` cannot start from the KV of ``source``'s first
        ``n`` tokens (None when it can): the tokens must be the same, at least one token of
        the prompt must be left to decode (its logits), and the memory must hold what the
        copy needs: every position for a proper prefix in a unified KV cache, the whole
        sequence otherwise (one stream per sequence, or a recurrent state), and in a
        sliding-window cache the window before ``n`` (llama-server's rule: the source's
        smallest position at most ``n - n_swa``)."""
        expect("source", source, Branch, "a Branch of this store")
        prompt = list(expect_iterable("prompt", prompt, "a sequence of token ids"))
        n = expect_int("n", n)
        if not 0 <= n < len(prompt):
            return f"prefix_len={n} must be in [0, {len(prompt) - 1}] (one token of the prompt left to decode)"
        if n == 0:
            return None
        if n > source._kv_len or source._kv_len != len(source._tokens):
            return f"{source!r} does not hold positions 0..{n - 1} of its history"
        if list(source._tokens[:n]) != list(prompt[:n]):
            return f"the first {n} tokens of the prompt are not those of {source!r}"
        ctx = self.ctx
        whole = n == source._kv_len
        if not whole:
            if ctx.model.is_recurrent or ctx.model.is_hybrid:
                return "a recurrent state holds no earlier positions: only a whole sequence can be shared"
            if ctx.n_seq_max > 1 and not bool(ctx.params.c.kv_unified):
                return "sharing part of a sequence needs kv_unified=True (one KV stream per sequence copies whole ones)"
        elif (ctx.model.is_recurrent or ctx.model.is_hybrid) and ctx.n_rs_seq > 0:
            return f"copying a recurrent state with rollback on (n_rs_seq={ctx.n_rs_seq}) is refused by the memory"
        if ctx._swa_window:
            lo = ctx.memory.seq_pos_min(source.seq_id)
            if lo > max(0, n - ctx._swa_window):
                return (
                    f"{source!r} keeps positions from {lo} in its sliding-window cache (window {ctx._swa_window}): "
                    f"a prefix of {n} needs them from {max(0, n - ctx._swa_window)}"
                )
        return None

    def create_many(self, new: Sequence[NewBranch]) -> list[Branch]:
        """Make several root branches with their prompts packed into as few decodes as
        ``n_batch`` allows (:meth:`step` with no moves): one per :class:`NewBranch`, in
        that order."""
        return self.step((), new=new)

    def _step_new(
        self, items: list[tuple[Branch, int]], accepted: list[tuple[float | None, float | None]], specs: list[_Spec]
    ) -> list[Branch]:
        """:meth:`step` with new branches: the moves first, then the prompts, packed into
        decodes of up to ``n_batch`` tokens."""
        ctx = self.ctx
        cap = self._batch.capacity
        made: list[Branch | None] = [None] * len(specs)
        sids: list[int] = []
        try:
            with _sigint_deferred():
                for sp in specs:
                    sid = self._take_id()
                    sids.append(sid)
                    sp.sid = sid
                    self._attach(sid, sp.chain, sp.track)
                for sp in specs:
                    if sp.prefix_len:
                        assert sp.source is not None
                        if sp.prefix_len == sp.source._kv_len:
                            ctx.memory.seq_cp(sp.source.seq_id, sp.sid)
                        else:
                            ctx.memory.seq_cp(sp.source.seq_id, sp.sid, 0, sp.prefix_len)
                    sp.offset = sp.prefix_len
            pos = 0  # moves done
            k = 0  # the first spec not fully decoded
            while pos < len(items) or k < len(specs):
                part = items[pos : pos + cap]
                room = cap - len(part)
                chunks: list[tuple[_Spec, int]] = []  # (spec, tokens taken)
                j = k
                while room > 0 and j < len(specs):
                    sp = specs[j]
                    take = min(len(sp.tokens) - sp.offset, room)
                    chunks.append((sp, take))
                    room -= take
                    j += 1
                done = self._decode_step(part, accepted[pos : pos + len(part)], chunks, made)
                pos += len(part)
                while k < len(specs) and specs[k].offset == len(specs[k].tokens):
                    k += 1
                if done is not None:
                    raise done
            with _sigint_deferred():
                for b in made:
                    assert b is not None
                    self._register(b)
        except BaseException:
            with _sigint_deferred():
                for i, sid in enumerate(sids):
                    b = made[i]
                    if b is not None:
                        self._lazy.discard(b)
                        b._dead = True
                    ctx.memory.seq_rm(sid)
                    self._give_id(sid)
            raise
        return [b for b in made if b is not None]

    def _decode_step(
        self,
        part: list[tuple[Branch, int]],
        accepted: list[tuple[float | None, float | None]],
        chunks: list[tuple[_Spec, int]],
        made: list[Branch | None],
    ) -> BaseException | None:
        """One decode: ``part``'s moves (one token each, an output row each) then
        ``chunks`` of new branches' prompts (an output row after a prompt's last token).
        Returns an interrupt that arrived after llama.cpp wrote the rows (the caller
        raises it once the step's bookkeeping is done)."""
        ctx = self.ctx
        batch = self._batch
        m = len(part)
        batch.token[:m] = [int(t) for _, t in part]
        batch.pos[:m] = [b.position for b, _ in part]
        batch.n_seq_id[:m] = 1
        batch.seq_id[:m, 0] = [b.seq_id for b, _ in part]
        batch.logits[:m] = 1
        n_tok = m
        ends: list[tuple[_Spec, int]] = []  # (spec, batch index of its last token) of prompts completed here
        for sp, take in chunks:
            lo = sp.offset
            batch.token[n_tok : n_tok + take] = sp.tokens[lo : lo + take]
            batch.pos[n_tok : n_tok + take] = np.arange(lo, lo + take, dtype=np.int32)
            batch.n_seq_id[n_tok : n_tok + take] = 1
            batch.seq_id[n_tok : n_tok + take, 0] = sp.sid
            batch.logits[n_tok : n_tok + take] = 0
            if lo + take == len(sp.tokens):
                batch.logits[n_tok + take - 1] = 1
                ends.append((sp, n_tok + take - 1))
            n_tok += take
        batch.n_tokens = n_tok
        branches = [b for b, _ in part]
        n_out = m + len(ends)
        # a failed decode of one micro-batch that does not grow the output buffer leaves
        # the rows there as they were (llama.cpp writes outputs after a ubatch completes):
        # the stepped branches keep reading theirs; otherwise every row is copied first
        safe = self.device or (n_tok <= ctx.n_ubatch and n_out <= ctx._out_rows_cap)
        if not safe:
            self._outputs_changing()
        done = 0
        # Ctrl-C aborts the decode in flight (a decode that fails changes no branch and
        # leaves the old rows in place); once the decode has written the new rows, the
        # interrupt lands after every branch took its token
        with _sigint_deferred(ctx.request_abort):
            late: BaseException | None = None
            try:
                self._consuming = frozenset(b.seq_id for b in branches) if safe else None
                ctx._last_rc = None
                try:
                    ctx.decode_batch(batch)
                except BaseException as exc:
                    if ctx._last_rc != 0:
                        raise
                    late = exc  # llama.cpp wrote the new rows: the step completes, then this is raised
                finally:
                    self._consuming = None
                for sp, take in chunks:
                    sp.offset += take
                if n_out == 0:  # only parts of prompts: no row to read
                    return late
                if self.device:
                    for i, (b, tok) in enumerate(part):
                        b._advance(int(tok), accepted[i], None)
                        done = i + 1
                    if branches:
                        self._read_device(branches, range(m))
                    fresh = [self._new_branch(sp, made) for sp, _ in ends]
                    if fresh:
                        self._read_device(fresh, [i for _, i in ends])
                    return late
                # llama_decode returns once its graph is queued (on a GPU it computes on):
                # the tokens are accepted (samplers, grammars, metrics as measured before)
                # and, when that time would be spent waiting anyway, the grammars' masks
                # for the new states made, before the rows are read (reading waits for
                # the decode); the rows are attached after
                try:
                    for i, (b, tok) in enumerate(part):
                        b._advance(int(tok), accepted[i], None)
                        done = i + 1
                    if self._prefetch:
                        self._prefetch_masks(branches)
                finally:
                    t0 = _clock()
                    rows = np.asarray(ctx._all_rows())
                    self._note_wait(_clock() - t0)
                    self._rows = rows
                    lazy = self._lazy
                    for i, b in enumerate(branches):  # their old rows are gone: the new ones replace them
                        if i < done:  # (advanced: its row is i)
                            b._row_i = i
                            lazy.add(b)
                        else:
                            b._row_i = None
                            lazy.discard(b)
                fresh = []
                for r, (sp, _) in enumerate(ends):
                    nb = self._new_branch(sp, made)
                    nb._row_i = m + r
                    self._lazy.add(nb)
                    fresh.append(nb)
                del rows
                try:
                    self._measure(branches + fresh if fresh else branches, self._rows)
                except MemoryError:  # pragma: no cover - measured again when needed
                    pass
                return late
            except BaseException as exc:
                if exc is not late:
                    for b, _ in part[done:]:  # decoded but not advanced (or not decoded): no cell stays
                        ctx.memory.seq_rm(b.seq_id, b._kv_end())
                raise

    def _new_branch(self, sp: _Spec, made: list[Branch | None]) -> Branch:
        """The branch of a spec whose prompt is decoded (registered by the caller)."""
        metrics = (sp.tracker or PerplexityTracker()) if sp.track else None
        b = Branch(self, sp.sid, None, list(sp.tokens), sp.chain, metrics, None)
        if sp.seed is not None:
            b.reseed(sp.seed)
        made[sp.index] = b
        return b

    commit = step

    async def astep(self, moves: Mapping[Branch, int] | Iterable[tuple[Branch, int]]) -> None:
        """:meth:`step` in a worker thread, for asyncio code (the event loop stays free).
        Cancelling the awaiting task aborts the decode (:meth:`llama_cffi.Context.arun`):
        no branch changes and :class:`asyncio.CancelledError` is raised. A cancellation
        that arrives after the decode finished lets the step complete (the branches'
        positions tell) and is raised all the same."""
        moves = expect_pairs("moves", moves, "a mapping {Branch: token} or (branch, token) pairs")
        items = list(moves.items()) if isinstance(moves, Mapping) else [(b, int(t)) for b, t in moves]
        await self.ctx.arun(lambda: self.step(items))

    def prefill(self, inputs: Mapping[Branch, Sequence[int]]) -> None:
        """Append several tokens to several branches, packed into as few decodes as
        ``n_batch`` allows; each branch's logits after its last token are captured. The
        tokens are context (not sampled): they join the history without touching
        samplers or metrics. On failure every branch is restored."""
        expect_mapping("inputs", inputs, "a mapping {Branch: tokens}")
        work: list[tuple[Branch, list[int]]] = []
        for b, toks in inputs.items():
            b._check_live()
            if b.store is not self:
                raise BranchError(f"{b!r} belongs to another store")
            arr = [int(t) for t in self.ctx.model.vocab.check_tokens(toks)]
            if arr:
                work.append((b, arr))
        saved = {b.seq_id: (b._kv_len, len(b._tokens), b._save_row(), b._pending, b._orig) for b, _ in work}
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
                        b._set_output(self.ctx.logits(first + take - 1), first + take - 1)
                        b._pending = None
        except BaseException:
            with _sigint_deferred():
                for b, _ in work:
                    kv, nt, snap, pending, orig = saved[b.seq_id]
                    self.ctx.memory.seq_rm(b.seq_id, kv)
                    b._kv_len = kv
                    del b._tokens[nt:]
                    b._restore_row(snap)
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
        expect("keep", keep, Branch, "a Branch of this store")
        keep._check_live()
        with _sigint_deferred():
            self.ctx.memory.seq_keep(keep.seq_id)
            for sid, b in list(self._live.items()):
                if b is not keep:
                    self._lazy.discard(b)
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
                self._lazy.discard(b)
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
        logits: npt.NDArray[np.float32] | None,
    ) -> None:
        expect("store", store, BranchStore, "a BranchStore (branches come from BranchStore.create)")
        if type(seq_id) is not int:
            seq_id = expect_int("seq_id", seq_id)
        if parent is not None and not isinstance(parent, Branch):
            raise type_error("parent", "a Branch or None", parent)
        if not isinstance(tokens, list):
            raise type_error("tokens", "a list of token ids", tokens)
        expect("sampler", sampler, SamplerChain, "a samplers.SamplerChain")
        _check_tracker(tracker)
        if logits is not None and not isinstance(logits, np.ndarray):
            raise type_error("logits", "a float32 array (a logits row) or None", logits)
        self.store = store
        self.seq_id = seq_id
        self._parent = parent
        self._children: list[Branch] = []
        self._tokens = tokens
        self._kv_len = len(tokens)  # tokens whose KV this sequence holds
        self.sampler = sampler
        self.tracker = tracker
        #: the snapshot, owned; None while the row is read from the store's rows (_row_i)
        self._logits: npt.NDArray[np.float32] | None = logits
        self._row_i: int | None = None  # index of the snapshot in store._rows, while zero-copy
        store._has_cands[seq_id] = False  # a new row: its slot is measured when needed
        store._has_stats[seq_id] = False
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
        self._held = False  # a kept prompt (_keep_prefix): a prefix source, never sampled, stepped or forked
        #: (that very ``_pending`` tuple, the model's logit of its token) when the sampling
        #: knew it: the accept measures the token without looking it up
        self._pending_logit: tuple[object, float] | None = None
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
        """Every token of this branch: prompt, then generated (a copy). A prompt with
        images or sounds holds a negative placeholder for each of their cells
        (:meth:`BranchStore.cells`)."""
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
        """The logits snapshot (read-only view of the branch's own copy, made now if the
        row was still read from the context's outputs)."""
        self._materialize()
        v: npt.NDArray[np.float32] = self._row().view()
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
        st = self.store
        if st._has_stats[self.seq_id] and st.measures.status[self.seq_id] in (_ST_OK, _ST_TIE):
            return float(st.measures.entropy[self.seq_id])
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
        A :attr:`steer` hook is called first, with the snapshot writable. A chain that
        begins with ``TopK(k)`` runs on the row's ``k`` best candidates (measured once per
        row), one that begins with a grammar and then ``TopK(k)`` on them too, with
        llama.cpp's fast path (see :meth:`BranchStore.sample`), otherwise on the whole row."""
        self._check_live()
        if self._held:
            raise BranchError(f"{self!r} is a kept prompt (a prefix source, as a prompt cache entry): not sampled")
        if self.steer is not None:
            self.steer(self, self._editable())
        if self.steer is None and self._orig is None:
            sig = _grammar_sig(self.sampler, self.store)
            if sig is not None:  # a grammar, then a top-k: as BranchStore.sample does it
                out: dict[Branch, int] = {}
                self.store._sample_group(sig, [self], out, constrained=True)
                return out[self]
        return self._choose()

    def _choose(self) -> int:
        """:meth:`sample` after its checks and the steering hook, without the batched
        paths: the chain on the row's best candidates (a chain that begins with ``TopK``)
        or on the whole row."""
        cands = self.store._cands
        track = self.tracker is not None
        try:
            row = self._fill(cands, self.sampler, track)
            token, sampling = self.sampler.choose(cands, row, track)
        finally:
            cands.release()
        if row is None and sampling is not None and _greedy_only(self.sampler):
            sampling = None  # greedy samples from the model's distribution (its row's best candidate)
        self._pending = (token, sampling)
        return token

    def _fill(self, cands: Candidates, chain: SamplerChain, track: bool) -> npt.NDArray[np.float32] | None:
        """Set ``cands`` to what ``chain`` starts from: the row's ``k`` best candidates
        (sorted) when the chain begins with ``TopK(k)`` and the snapshot is the model's,
        else the whole row (returned: the chain's grammar check may reset to it)."""
        store = self.store
        seq = self.seq_id
        k = _lead_k(chain, store.n_vocab) if self._orig is None and store.batched else 0
        if not k:
            row = self._row()
            cands.reset(row)
            return row
        meas = store.measures
        if not store._has_cands[seq] or meas.n_top[seq] < k:
            if store.device:
                raise BranchError(
                    f"branch {seq} samples on the device and its row brought {int(meas.n_top[seq])} candidates "
                    f"to the host, fewer than its chain's top-{k} (a chain changed since): step it first"
                )
            if track and not store._has_stats[seq]:
                store._measure([self], [self._row()])
            else:
                store._measure([self], [self._row()], stats=False)
        if meas.status[seq] == _ST_NAN:
            raise InvalidLogitsError("the logits contain NaN")
        ids, lg = meas.candidates(seq, k)
        cands.assign(ids, lg, sorted=True)
        return None

    def _want_k(self) -> int:
        """Candidates to find when this branch's next row is measured (a chain that begins
        with a grammar: those its samplers after the grammar choose from first, see
        :meth:`BranchStore.sample`)."""
        if self._orig is not None or self.steer is not None:
            return 0
        return _lead_k(self.sampler, self.store.n_vocab) or _grammar_lead_k(self.sampler, self.store)

    def accept(self, token: int) -> None:
        """Advance sampler, grammar and metrics by ``token`` (measured on the snapshot)
        without decoding it. :meth:`commit` / :meth:`BranchStore.step` do this for you."""
        token = expect_int("token", token)
        self._check_live()
        self._check_token(int(token))
        self._accept(int(token))

    def _model_surprisal(self, token: int) -> float:
        """The model-level surprisal of ``token`` under the snapshot (its row's measures when
        the row was measured, else a pass over it)."""
        st = self.store
        seq = self.seq_id
        known = self._pending_logit
        if known is not None and known[0] is self._pending and self._pending is not None:
            if self._pending[0] == token and st._has_stats[seq] and self._orig is None:
                return st.measures.surprisal(seq, known[1])
        if st.device and self._orig is None:
            meas = st.measures
            ids, lg = meas.candidates(seq)
            hit = np.flatnonzero(ids == token)
            if not st._has_stats[seq] or not len(hit):
                raise BranchError(
                    f"branch {seq} samples on the device: token {token} is not among the {len(ids)} candidates that "
                    "reached the host, so its surprisal is unknown (create the branch with track=False to force it)"
                )
            return meas.surprisal(seq, float(lg[hit[0]]))
        row = self._model_row()
        if st._has_stats[seq]:
            return st.measures.surprisal(seq, float(row[token]))
        return surprisal_of(row, token)

    def _measure_accept(self, token: int) -> tuple[float | None, float | None]:
        """(model surprisal, sampling surprisal argument) that accepting ``token`` records,
        measured on the snapshot now; changes nothing."""
        model: float | None = None
        samp: float | None = None
        if self.tracker is not None:
            model = self._model_surprisal(token)
            pending = self._pending
            if pending is not None and pending[0] == token:
                samp = model if pending[1] is None else pending[1]
        return model, samp

    def _accept(self, token: int, measured: tuple[float | None, float | None] | None = None) -> None:
        model, samp = measured if measured is not None else self._measure_accept(token)
        tracker = self.tracker
        if tracker is not None:
            assert model is not None
            if type(tracker) is PerplexityTracker:
                tracker._add_nats(model, samp)
            else:
                tracker.add(model, samp)
        self.sampler.accept(token)
        self._accepted.append((len(self._tokens), token, model, samp))
        self._pending = None

    def _advance(self, token: int, measured: tuple[float | None, float | None], row_i: int | None) -> None:
        """``token`` was decoded (a :meth:`BranchStore.step`): accept it as measured before
        the decode, and read the new snapshot from row ``row_i`` of the store's rows (None:
        on the device)."""
        self._accept(token, measured)
        self._tokens.append(token)
        self._kv_len += 1
        self._orig = None
        if row_i is not None:
            self._row_i = row_i
            self.store._lazy.add(self)

    def commit(self, token: int) -> None:
        """Accept ``token``, decode it, capture the new logits (one ``llama_decode`` of one
        token: :meth:`BranchStore.step` of this branch alone). On failure nothing changes."""
        token = expect_int("token", token)
        self._check_live()
        self.store.step([(self, int(token))])

    decode = commit

    def speculate(self, token: int, drafter: Any, **options: Any) -> Any:
        """Commit ``token`` (the pending one: from :meth:`sample` or the last step's
        ``next``) and the drafted tokens this branch's sampler agrees with, in one
        ``llama_decode``: :func:`samplers.speculative.speculative_step` for this branch
        alone (``options``: its ``budget``, ``is_end``, ``verify``, and ``on_commit``, a
        callable). Returns its :class:`~samplers.speculative.StepResult`."""
        token = expect_int("token", token)
        from .speculative import Drafter, speculative_step

        expect("drafter", drafter, Drafter, "a samplers.speculative.Drafter")
        hook = options.pop("on_commit", None)
        if hook is not None:
            options["on_commit"] = {self: expect_callable("on_commit", hook, "callable or None")}
        return speculative_step(self.store, {self: int(token)}, {self: drafter}, **options)[self]

    # ------------------------------------------------------------------ steering
    def _set_row(self, row: Any) -> None:
        """The model's new logits (after a decode), copied: the snapshot is the model's own
        again, its slot not measured yet."""
        if self._row_i is not None:
            self._row_i = None
            self.store._lazy.discard(self)
        if self._logits is None:
            self._logits = np.empty(self.store.n_vocab, dtype=np.float32)
        np.copyto(self._logits, row)
        self._orig = None
        self.store._has_cands[self.seq_id] = False
        self.store._has_stats[self.seq_id] = False

    def _row(self) -> npt.NDArray[np.float32]:
        """The snapshot: the owned copy, or the row in the context's outputs (valid until
        the next decode; do not keep it)."""
        i = self._row_i
        if i is not None:
            rows = self.store._rows
            assert rows is not None
            row: npt.NDArray[np.float32] = rows[i]
            return row
        if self._logits is None:
            raise BranchError(
                f"branch {self.seq_id} samples on the device (BranchStore(device=True)): only its row's "
                "candidates and measures reach the host, not the whole row"
            )
        return self._logits

    def _set_output(self, row: Any, batch_idx: int) -> None:
        """The new snapshot is output ``batch_idx`` of the last decode (``row``, its view)."""
        if self.store.device:
            self._orig = None
            self.store._read_device([self], [batch_idx])
        else:
            self._set_row(row)

    def _save_row(self) -> Any:
        """What :meth:`_restore_row` needs to bring the snapshot back (a copy of the row, or
        in device mode its slot)."""
        if self.store.device:
            st, seq = self.store, self.seq_id
            meas = st.measures
            return (
                st._has_cands[seq],
                st._has_stats[seq],
                *(a[seq].copy() for a in (meas.max, meas.log_norm, meas.entropy, meas.status, meas.n_top)),
                meas.top_ids[seq].copy(),
                meas.top_logits[seq].copy(),
            )
        return self._row().copy()

    def _restore_row(self, saved: Any) -> None:
        if not self.store.device:
            self._set_row(saved)
            return
        st, seq = self.store, self.seq_id
        meas = st.measures
        st._has_cands[seq], st._has_stats[seq] = saved[0], saved[1]
        arrays: tuple[npt.NDArray[Any], ...] = (meas.max, meas.log_norm, meas.entropy, meas.status, meas.n_top)
        for a, v in zip(arrays, saved[2:7], strict=True):
            a[seq] = v
        meas.top_ids[seq, : len(saved[7])] = saved[7]
        meas.top_logits[seq, : len(saved[8])] = saved[8]

    def _materialize(self) -> None:
        """Copy the snapshot out of the context's outputs (before they are overwritten)."""
        i = self._row_i
        if i is None:
            return
        rows = self.store._rows
        assert rows is not None
        if self._logits is None:
            self._logits = np.empty(self.store.n_vocab, dtype=np.float32)
        np.copyto(self._logits, rows[i])
        self._row_i = None
        self.store._lazy.discard(self)

    def _model_row(self) -> npt.NDArray[np.float32]:
        """The model's logits for the next token (the snapshot before any edit)."""
        return self._orig if self._orig is not None else self._row()

    def _editable(self) -> npt.NDArray[np.float32]:
        """The snapshot, to be edited: the model's logits are kept in ``_orig`` first."""
        self._materialize()
        self._row()  # raises on the device
        assert self._logits is not None
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
        self._materialize()
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
        expect_array("logits", logits, "a row of logits")
        self._check_live()
        arr = np.asarray(logits, dtype=np.float32)
        if arr.shape != (self.store.n_vocab,):
            raise ParamError(f"logits must have shape {(self.store.n_vocab,)}, not {arr.shape}")
        if np.isnan(arr).any():
            raise ParamError("logits contain NaN")
        np.copyto(self._editable(), arr)

    def add_logits(self, bias: npt.ArrayLike | Mapping[int, float]) -> None:
        """Add ``bias`` to the snapshot: an array of ``n_vocab`` floats, or ``{token: bias}``
        (``-inf`` bans a token). See :meth:`set_logits`."""
        if not isinstance(bias, Mapping):
            expect_array("bias", bias, "an array of biases or a mapping {token: bias}")
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
        if arr.shape != (self.store.n_vocab,) or np.isnan(arr).any():
            raise ParamError(f"a bias must be {self.store.n_vocab} floats without NaN")
        self._editable()[...] += arr

    def contrast(self, other: Branch, alpha: float = 1.0) -> None:
        """Contrastive decoding / classifier-free guidance: the snapshot becomes
        ``(1 + alpha) * mine - alpha * other's`` (both the model's logits, whatever edits
        either has), e.g. with ``other`` the same text without its instruction."""
        expect("other", other, Branch, "a Branch")
        self._check_live()
        other._check_live()
        if other.store.n_vocab != self.store.n_vocab:
            raise ParamError("the two branches' models have different vocabularies")
        a = expect_number("alpha", alpha)
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
            assert self._logits is not None
            np.copyto(self._logits, self._orig)
            self._orig = None

    def set_sampler(self, sampler: Sampler | SamplingParams | None, grammar: Any = None) -> None:
        """Sample with ``sampler`` (a sampler, a chain, or SamplingParams; greedy when
        None) from now on, with ``grammar`` (GBNF text, a JSON schema, a Grammar or a
        matcher) first when given; the grammar starts from here (what the branch
        generated before is not fed to it). The metrics tracker stays."""
        self._check_live()
        tracker = self.sampler.tracker
        chain = _as_chain(sampler, grammar, self.store.ctx.model)
        self.store._attach(self.seq_id, chain, self.tracker is not None)
        self.sampler = chain
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
        new = _as_chain(chain, grammar, self.store.ctx.model)
        self.store._attach(self.seq_id, new, self.tracker is not None)
        self.sampler = new
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
            chain = self.sampler.clone()
            if _greedy_only(chain):  # greedy draws from the model's distribution: the whole row
                cands.reset(self._row())
            else:
                self._fill(cands, chain, False)
            for s in chain.samplers:
                s.apply(cands)
            return float(entropy(np.ascontiguousarray(cands.read_logits(), dtype=np.float32)))
        finally:
            cands.release()

    def reseed(self, seed: int | None) -> None:
        """Reseed every random sampler of the chain (None: draw a random seed)."""
        if seed is not None:
            expect_int("seed", seed, "an int or None")
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
        sinks = expect_int("sinks", sinks)
        if tail is not None:
            tail = expect_int("tail", tail, "an int or None")
        self._check_live()
        ctx = self.store.ctx
        if tail is None:
            tail = ctx.n_ctx_seq // 2
        if sinks < 0 or tail < 1:
            raise ParamError(f"sinks must be >= 0 and tail >= 1, not {sinks} and {tail}")
        hist = self._tokens
        keep = hist if len(hist) <= sinks + tail else hist[:sinks] + hist[-tail:]
        if any(t < 0 for t in keep):
            raise BranchError(
                f"branch {self.seq_id} holds images or sounds, which cannot be decoded again from the history: "
                "use shift_context, or create a branch from a new prompt"
            )
        ctx.memory.seq_rm(self.seq_id)
        try:
            row = ctx.decode(keep, pos=0, seq_id=self.seq_id)
        except BaseException:
            ctx.memory.seq_rm(self.seq_id)  # chunks that fitted: the sequence is empty now
            self._kv_len = 0
            raise
        self._set_output(row, int(ctx._out_index[-1]))
        self._kv_len = len(keep)
        self._pending = None

    def shift_context(self, n_discard: int, sinks: int = 4) -> None:
        """Drop ``n_discard`` positions after the first ``sinks`` and shift the rest down
        (``seq_rm`` + ``seq_add``: no recomputation), where the memory can shift
        (``ctx.memory.can_shift``). Refused while other branches are live: with a unified
        cache they may share these cells, whose positions would move for them too."""
        n_discard = expect_int("n_discard", n_discard)
        sinks = expect_int("sinks", sinks)
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
        if last < 0:
            raise BranchError(
                f"position {position - 1} of branch {self.seq_id} is a cell of an image or sound, which cannot be "
                "decoded again from the history: truncate at a position after text"
            )
        with _sigint_deferred():
            ctx.memory.seq_rm(self.seq_id, position - 1, -1)
            self._kv_len = position - 1
            del self._tokens[position - 1 :]
            self._accepted = [a for a in self._accepted if a[0] < position]
            self._pending = None
        row = ctx.decode_single(last, pos=position - 1, seq_id=self.seq_id)
        with _sigint_deferred():
            self._set_output(row, 0)
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
        if seed is not None:
            expect_int("seed", seed, "an int or None")
        clone_logits = expect_bool("clone_logits", clone_logits)
        self._check_live()
        if self._held and at is None:
            raise BranchError(
                f"{self!r} is a kept prompt (a prefix source, as a prompt cache entry): its snapshot is stale; "
                "fork it at a position (at=) to decode the logits there"
            )
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
                if self._tokens[at - 1] < 0:
                    raise BranchError(
                        f"position {at - 1} of branch {self.seq_id} is a cell of an image or sound, which cannot be "
                        "decoded again from the history: fork at a position after text"
                    )
                return self._fork_prefix(at, seed)
        store = self.store
        with store._fresh_id() as sid, _sigint_deferred():  # no decode: Ctrl-C waits for it all
            store._attach(sid, self.sampler, self.tracker is not None)
            store.ctx.memory.seq_cp(self.seq_id, sid)
            shared = clone_logits and self._row_i is not None  # the child reads the same row
            if shared or not clone_logits or store.device:
                logits = None if shared or store.device else np.zeros(store.n_vocab, dtype=np.float32)
            else:
                logits = self._row().copy()
            metrics = self.tracker.clone() if self.tracker is not None else None
            child = Branch(store, sid, self, list(self._tokens), self.sampler.clone(), metrics, logits)
            if shared:
                child._row_i = self._row_i
                store._lazy.add(child)
            if clone_logits:  # same row, same measures
                store.measures.copy_slot(self.seq_id, sid)
                store._has_cands[sid] = store._has_cands[self.seq_id]
                store._has_stats[sid] = store._has_stats[self.seq_id]
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
            store._attach(sid, self.sampler, self.tracker is not None)
            if at > 1:
                ctx.memory.seq_cp(self.seq_id, sid, 0, at - 1)
            row = ctx.decode_single(self._tokens[at - 1], pos=at - 1, seq_id=sid)
            with _sigint_deferred():
                logits = None if store.device else np.array(row, dtype=np.float32, copy=True)
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
                if store.device:
                    store._read_device([child], [0])
                child._accepted = accepted
                if seed is not None:
                    child.reseed(seed)
                store._register(child)
        return child

    def _cut(self, n: int) -> None:
        """Drop the cells from ``n`` on without recomputing the snapshot, which is stale
        until the caller decodes more right away (a chat session's next turn,
        :meth:`BranchStore._extend_media`)."""
        with _sigint_deferred():
            if n < self._kv_len:
                self.store.ctx.memory.seq_rm(self.seq_id, n, -1)
            del self._tokens[n:]
            self._kv_len = n
            self._accepted = [a for a in self._accepted if a[0] < n]
            self._pending = None

    def _keep_prefix(self, n: int) -> None:
        """Keep only the KV of the first ``n`` tokens (a prompt kept for other branches to
        copy, :class:`NewBranch` ``prefix_from``). The snapshot is left as it was, stale:
        such a branch is a source of prefixes, never sampled again. Not for a recurrent
        state (it cannot drop tokens)."""
        if not 1 <= n <= self._kv_len or self._kv_len != len(self._tokens):
            raise BranchError(f"cannot keep the first {n} tokens of {self!r}")
        with _sigint_deferred():
            self._cut(n)
            self._held = True

    def prune(self, reparent: bool = False) -> None:
        """Remove this branch's KV and free its id. Refused while it has live children,
        unless ``reparent``: they then become children of this branch's parent (their
        KV is their own; removing this sequence's cells leaves theirs)."""
        reparent = expect_bool("reparent", reparent)
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
        self.store._lazy.discard(self)
        if self._parent is not None and self in self._parent._children:
            self._parent._children.remove(self)
        self._parent = None
        self._dead = True
        del self.store._live[self.seq_id]
        self.store._give_id(self.seq_id)
