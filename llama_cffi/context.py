"""``Context``: inference state over a model -- decode, outputs, KV memory, state, threads.

Lifetime and ownership
    A context holds its :class:`~llama_cffi.Model` alive; ``close()`` is idempotent and
    a ``with`` block closes it; a finalizer frees a forgotten context. Output views
    (logits, embeddings) hold a lease, so native memory outlives ``close()`` until the
    last view is gone.

Outputs
    :meth:`Context.logits` and friends return :class:`~llama_cffi.outputs.OutputView`
    arrays: zero-copy float32 views into llama.cpp's output buffer, valid until the
    next decode (afterwards they raise :class:`~llama_cffi.outputs.StaleOutputError`;
    ``.copy()`` keeps the values).

Threads
    One thread at a time: a second thread calling into a busy context gets
    :class:`~llama_cffi.errors.ConcurrentUseError` (never a corrupted state). Use one
    context per thread over a shared model. :meth:`request_abort` is the one method
    that may be called from any thread (or a signal handler); ``adecode`` runs a decode
    in a worker thread and turns cancellation into an abort.

Validation
    Token ids, sequence ids, positions (continuity with the KV memory), batch sizes and
    context capacity are checked in Python before anything reaches ``llama_decode``:
    several of these abort the process in C.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, TypeVar, cast, overload

import numpy as np
import numpy.typing as npt

from . import log
from ._args import (
    expect,
    expect_bool,
    expect_callable,
    expect_int,
    expect_iterable,
    expect_number,
    expect_path,
    expect_str,
    expect_strs,
    type_error,
)
from ._binding import ffi, lib
from ._handle import NativeHandle
from .batch import Batch
from .context_params import ContextParams, available_cores
from .enums import PoolingType, RopeType
from .errors import (
    AdapterError,
    ConcurrentUseError,
    ContextCreateError,
    DecodeAbortedError,
    DecodeError,
    InvalidBatchError,
    KvCacheFullError,
    ParamError,
    RpcError,
    StateError,
    UnsupportedError,
)
from .memory import Memory
from .memory_usage import MemoryUsage, read_memory_usage
from .outputs import LiveOutputError, OutputBuffer, OutputGuard, OutputView
from .sampling import LlamaSampler
from .threadpool import AdaptiveThreads, Threadpool, default_threadpool, expect_pool
from .threadpool import _attached as _pool_users
from .vocab import StopStringStream

if TYPE_CHECKING:
    from .lora import LoraAdapter
    from .model import Model

logger = logging.getLogger("llama_cffi")

_T = TypeVar("_T")

#: Python is polled by the abort callback at most this often during a decode (seconds).
ABORT_POLL_INTERVAL = 0.01


class Sampler(Protocol):
    """What :meth:`Context.generate` needs from a sampler (``samplers`` provides them):
    ``sample`` picks a token from output ``idx`` and records it (``accept``), as
    ``llama_sampler_sample`` does."""

    def sample(self, ctx: Context, idx: int = -1) -> int: ...


class Greedy:
    """The default sampler of :meth:`Context.generate`: the most likely token."""

    def sample(self, ctx: Context, idx: int = -1) -> int:
        expect("ctx", ctx, Context, "a llama_cffi.Context")
        return int(np.asarray(ctx.logits(expect_int("idx", idx))).argmax())


def _as_sampler(sampler: object, model: Model) -> Sampler:
    """The sampler :meth:`Context.stream` runs: :class:`Greedy` for None, an object with
    ``sample(ctx, idx)`` as it is, and ``samplers.SamplingParams`` (anything with
    ``to_chain(model)``: llama_cffi does not import ``samplers``) as its chain for
    ``model``; anything else is a :class:`~llama_cffi.errors.ParamTypeError` naming
    ``sampler``."""
    if sampler is None:
        return Greedy()
    if callable(getattr(sampler, "sample", None)):
        return sampler  # type: ignore[return-value]
    to_chain = getattr(sampler, "to_chain", None)
    if callable(to_chain):
        chain = to_chain(model)
        if callable(getattr(chain, "sample", None)):
            return chain  # type: ignore[no-any-return]
    raise type_error(
        "sampler", "a sampler (an object with sample(ctx, idx)), samplers.SamplingParams, or None", sampler
    )


# ---------------------------------------------------------------------- abort plumbing
class _AbortPy:
    __slots__ = ("callback", "error")

    def __init__(self) -> None:
        self.callback: Callable[[], bool] | None = None
        self.error: BaseException | None = None


_pending = threading.local()  # an exception raised while polling, per decoding thread
_wall = time.perf_counter
_cpu = time.thread_time  # the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID)
_gpu_seen: list[bool] = []


def _check_pools_fit(t: int, b: int, pool: Threadpool, pool_batch: Threadpool | None) -> None:
    """ParamError unless ``t`` threads fit ``pool`` and ``b`` fit ``pool_batch`` (or ``pool``)."""
    for name, pl, count, n in (
        ("threadpool", pool, "n_threads", t),
        ("threadpool_batch", pool_batch or pool, "n_threads_batch", b),
    ):
        if n > pl.n_threads:
            raise ParamError(
                f"{count}={n} exceeds the {name}'s {pl.n_threads} threads: lower it (set_n_threads) or make a "
                "bigger Threadpool"
            )


def _has_gpu() -> bool:
    """Whether this build registered a GPU (its decodes' CPU time says nothing of load)."""
    if not _gpu_seen:
        from .device import DeviceType, devices

        _gpu_seen.append(any(d.type in (DeviceType.GPU, DeviceType.IGPU) for d in devices()))
    return _gpu_seen[0]


def _abort_onerror(exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
    # e.g. KeyboardInterrupt delivered as the callback starts: keep it, abort the decode
    _pending.exc = exc
    return True


@ffi.def_extern(onerror=_abort_onerror)  # type: ignore[untyped-decorator]
def llama_cffi_abort_py(user_data: Any) -> bool:
    state: _AbortPy = ffi.from_handle(user_data)
    cb = state.callback
    if cb is None:
        return False  # still useful: running bytecode here lets Ctrl-C be delivered
    try:
        return bool(cb())
    except BaseException as exc:
        state.error = exc
        return True


def _bytes_view(name: str, data: object) -> memoryview:
    """``data`` (bytes, a bytearray, a memoryview, a contiguous buffer) as unsigned bytes."""
    try:
        return memoryview(data).cast("B")  # type: ignore[arg-type]
    except TypeError:
        raise type_error(name, "bytes (a state from save_state)", data) from None


class _Busy:
    """Non-blocking per-context lock: concurrent use raises instead of waiting or corrupting."""

    __slots__ = ("lock", "owner")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owner = 0

    def __enter__(self) -> None:
        if not self.lock.acquire(blocking=False):
            if self.owner == threading.get_ident():
                raise ConcurrentUseError("re-entrant use of a Context from one of its own callbacks")
            raise ConcurrentUseError("this Context is in use by another thread; use one Context per thread")
        self.owner = threading.get_ident()

    def __exit__(self, *exc: object) -> None:
        self.owner = 0
        self.lock.release()


# ---------------------------------------------------------------------- the context
class Context:
    """An inference context: ``Context(model, n_ctx=2048, ...)`` or ``model.context(...)``.

    Keyword arguments are ``llama_context_params`` fields (see
    :mod:`llama_cffi.context_params`); or pass a prepared ``params=ContextParams(...)``.

    >>> ctx = model.context(n_ctx=512)                    # doctest: +SKIP
    >>> logits = ctx.decode(model.tokenize("Hello"))       # zero-copy view
    >>> int(logits.argmax())                               # doctest: +SKIP
    """

    _handle: NativeHandle | None = None
    _pool: Threadpool | None = None  # the pool decodes run on (see _setup_threads)
    _pool_batch: Threadpool | None = None  # a second pool for batches, when given
    _gov: AdaptiveThreads | None = None  # the adaptive thread policy, when on

    def __init__(
        self,
        model: Model,
        params: ContextParams | None = None,
        *,
        threadpool: Threadpool | None = None,
        threadpool_batch: Threadpool | None = None,
        adaptive_threads: bool | None = None,
        **kwargs: Any,
    ) -> None:
        if params is not None and kwargs:
            raise TypeError("pass either params= or keyword parameters, not both")
        from .model import Model

        expect("model", model, Model, "a llama_cffi.Model")
        if params is not None:
            expect("params", params, ContextParams, "a ContextParams")
        expect_pool("threadpool", threadpool)
        expect_pool("threadpool_batch", threadpool_batch)
        if threadpool_batch is not None and threadpool is None:
            raise ParamError("threadpool_batch needs threadpool too (llama.cpp uses it for single-token decodes)")
        if adaptive_threads is not None:
            adaptive_threads = expect_bool("adaptive_threads", adaptive_threads)
        for pool in (threadpool, threadpool_batch):
            if pool is not None:
                pool._ptr()  # ClosedError for a closed pool
        mptr = model._ptr()
        if model.vocab_only:
            # llama.cpp creates the context but aborts the process on the first decode
            raise ContextCreateError(f"{model.path!r} was loaded with vocab_only=True; a context needs the weights")
        p = params if params is not None else ContextParams(**kwargs)
        if p.c.n_ctx == 0 and model.n_ctx_train == 0:
            raise ParamError("n_ctx=0 means 'from the model', but the model declares no training context length")
        # llama.cpp caps n_batch at n_ctx (causal attention; before padding n_ctx) and reserves an
        # output row per sequence, asserting (aborting) when n_seq_max exceeds the rows
        n_ctx = int(p.c.n_ctx) or int(model.n_ctx_train)
        rows = int(p.c.n_outputs_max) or min(n_ctx, int(p.c.n_batch))
        if int(p.c.n_seq_max) > rows:
            raise ParamError(
                f"n_seq_max={p.c.n_seq_max} exceeds the {rows} output rows (n_outputs_max, or min(n_ctx, n_batch)): "
                "each sequence needs one; raise n_ctx/n_batch or lower n_seq_max"
            )
        pooling = int(p.c.pooling_type)
        if pooling == int(PoolingType.UNSPECIFIED):  # the model's own, from its metadata
            arch = model.metadata.get("general.architecture", "")
            try:
                pooling = int(model.metadata.get(f"{arch}.pooling_type", "0") or 0)
            except ValueError:
                pooling = 0
        reserve = min(n_ctx, int(p.c.n_ubatch), int(p.c.n_batch))
        if bool(p.c.embeddings) and pooling == int(PoolingType.MEAN) and reserve % max(int(p.c.n_seq_max), 1):
            # llama.cpp reserves its worst-case graph with min(n_ctx, n_ubatch) tokens spread over
            # n_seq_max sequences; mean pooling's matrix then does not fit and it aborts
            # (GGML_ASSERT(ggml_can_mul_mat) in ggml.c) while creating the context
            raise ParamError(
                f"mean pooling with n_seq_max={p.c.n_seq_max} needs min(n_ctx, n_batch, n_ubatch)={reserve} to be a "
                "multiple of n_seq_max (llama.cpp aborts otherwise): pick n_seq_max from its divisors or set n_ubatch"
            )
        if model.has_encoder and model.has_decoder and int(p.c.n_seq_max) > 1 and not bool(p.c.kv_unified):
            # llama.cpp's cross-attention graph does not fit one KV stream per sequence: every
            # decode then aborts (GGML_ASSERT(ggml_can_repeat) in ggml.c)
            raise ParamError(
                f"an encoder-decoder model with n_seq_max={p.c.n_seq_max} needs kv_unified=True "
                "(llama.cpp aborts on its first decode otherwise)"
            )
        log.sync()
        if model._uses_rpc:
            from .rpc import signals_held

            held: contextlib.AbstractContextManager[None] = signals_held()  # RPC backends connect here
        else:
            held = contextlib.nullcontext()
        if model._rpc_lost is not None:
            raise RpcError(f"this model lost a worker: {model._rpc_lost}; close it and load it again")
        seen = 0
        if model._uses_rpc:
            from .rpc import failed, failures

            seen = failures()
        with held, log.capture() as lines:
            ptr = lib.llama_init_from_model(mptr, p.c)
        if model._uses_rpc and failures() != seen:
            lost = failed(model._rpc_endpoints)
            if lost is not None:
                model._rpc_lost = lost
                if ptr != ffi.NULL:
                    lib.llama_free(ptr)
                raise RpcError(f"cannot create a context: {lost}")
        if ptr == ffi.NULL:
            reason = "; ".join(line for _, line in lines[-3:]) or "llama.cpp returned no context"
            raise ContextCreateError(f"cannot create a context: {reason}")
        assert model._handle is not None
        # pools this context pinned: released once llama.cpp has freed the context
        pins: list[NativeHandle] = []
        self._pool_pins = pins

        def free(p: Any) -> None:
            lib.llama_free(p)
            while pins:
                pins.pop().unpin()

        self._handle = NativeHandle(self, ptr, free, "Context", parent=model._handle)
        self.model = model
        self.params = p
        self.n_vocab = model.n_vocab
        self._vocab = model.vocab
        self._memory = lib.llama_get_memory(ptr)
        self.n_batch = int(lib.llama_n_batch(ptr))
        self._n_ctx = int(lib.llama_n_ctx(ptr))
        self._n_ctx_seq = int(lib.llama_n_ctx_seq(ptr))
        self._n_seq_max = int(lib.llama_n_seq_max(ptr))
        self._mrope = model.rope_type in (RopeType.MROPE, RopeType.IMROPE, RopeType.VISION)
        #: positions per embedding row llama.cpp reads (hparams.n_pos_per_embd): 4 with M-RoPE
        self._n_pos_per_embd = model.n_pos_per_embd
        self._embeddings = bool(p.c.embeddings)
        self._busy = _Busy()
        # RPC models: llama.cpp's failure count when last looked at (see _after_decode)
        self._rpc_seen = seen if model._uses_rpc else -1
        self._guard = OutputGuard()
        # what this model's kind allows (see _check_kind): an encoder-only model keeps no
        # memory and reads each input in one non-causal pass; an encoder-decoder decodes
        # only after encode; a recurrent or hybrid memory cannot drop or copy parts
        self._arch = str(model.metadata.get("general.architecture", "?"))
        self._memoryless = self._memory == ffi.NULL
        self._enc_dec = model.has_encoder and model.has_decoder
        self._encoded = False
        self._recurrent = model.is_recurrent or model.is_hybrid
        self._swa_window = int(model.n_swa) if model.n_swa > 0 and not bool(p.c.swa_full) else 0
        self._kind_checks = self._memoryless or self._enc_dec
        if self._memoryless and not model.is_diffusion:
            self._guard.unavailable = (
                f"this encoder-only {self._arch} model computes embeddings, not logits: create the context with "
                "embeddings=True and read embeddings() or embeddings_seq()"
            )
        self._outbuf: OutputBuffer | None = None  # llama.cpp's output buffer, leased
        # called (weakly) right before llama.cpp may replace or move the outputs: a BranchStore
        # copies the rows it still reads out of the buffer then (see _outputs_will_change)
        self._output_hooks: list[weakref.WeakMethod[Callable[[], None]]] = []
        # backend sampling: the chain attached to each sequence (set_backend_sampler), and
        # which output rows of the last decode belong to such a sequence (None: none did)
        self._backend: dict[int, LlamaSampler] = {}
        self._backend_mask = np.zeros(self._n_seq_max, dtype=bool)  # the same, as a mask by seq id
        self._out_dev: np.ndarray | None = None
        #: llama_decode's return code in the last decode (None: none ran); 0 means the
        #: outputs were written even when the decode then raised (an abort callback's error
        #: that came after its last node): callers that keep rows there need to know
        self._last_rc: int | None = None
        # rows of logits llama.cpp's output buffer holds now (it reserves n_seq_max at
        # creation and grows, i.e. reallocates, when a decode needs more)
        self._out_rows_cap = self._n_seq_max
        self._out_embd_reserved = self._embeddings
        self._shift_pending = False  # seq_add/seq_div not yet applied by a decode
        self._last_view: OutputView | None = None  # logits of the last output, this decode
        self._n_outputs = 0  # outputs of the last decode/encode
        self._out_index: np.ndarray = np.zeros(0, dtype=np.int32)  # batch index of each output row
        self._last_batch_size = 0
        self._batch: Batch | None = None  # created on first multi-token decode
        self._embd_batch: Batch | None = None  # created on first decode_embeddings
        self._n_embd_inp = int(lib.llama_model_n_embd_inp(model._ptr()))
        self._adapters: list[LoraAdapter] = []
        self._adapter_handles: list[NativeHandle] = []
        self._ctx_other = p.ctx_other
        #: What ``model.context()``'s retry cascade tried before this one succeeded.
        self.creation_attempts: list[str] = []
        self.memory = Memory(self)
        # one-token batch for decode_single: C arrays owned here, reused every call
        self._one_token = ffi.new("llama_token[1]")
        self._one_pos = ffi.new("llama_pos[1]")
        self._one_nseq = ffi.new("int32_t[1]", [1])
        self._one_seq = ffi.new("llama_seq_id[1]")
        self._one_seqp = ffi.new("llama_seq_id *[1]", [self._one_seq])
        self._one_logits = ffi.new("int8_t[1]", [1])
        one = ffi.new("struct llama_batch *")
        one.n_tokens = 1
        one.token = self._one_token
        one.embd = ffi.NULL
        one.pos = self._one_pos
        one.n_seq_id = self._one_nseq
        one.seq_id = self._one_seqp
        one.logits = self._one_logits
        self._one = one
        # abort: a C flag any thread may set, plus a rate-limited Python poll
        self._abort_py = _AbortPy()
        self._abort_py.callback = p.abort_callback
        self._abort_handle = ffi.new_handle(self._abort_py)
        self._abort = ffi.new("llama_cffi_abort_state *")
        self._abort.py = self._abort_handle
        self._abort.interval_us = int(ABORT_POLL_INTERVAL * 1e6)
        lib.llama_set_abort_callback(ptr, lib.llama_cffi_abort_combined, self._abort)
        self._setup_threads(p, threadpool, threadpool_batch, adaptive_threads)

    # ------------------------------------------------------------------ lifetime
    def _ptr(self) -> Any:
        assert self._handle is not None
        return self._handle.get()

    def _using(self) -> _Busy:
        return self._busy

    def close(self) -> None:
        """Free the context (idempotent). Native memory is released once no output view
        of it remains; the model stays usable."""
        if self._handle is None or self._handle.closed:
            return
        with self._busy:
            self._outputs_will_change()
            for seq in list(self._backend):  # llama.cpp keeps only pointers to them
                lib.llama_set_sampler(self._handle.ptr, seq, ffi.NULL)
                self._backend.pop(seq)._handle.unpin()  # type: ignore[union-attr]
                self._backend_mask[seq] = False
            self._guard.closed = True
            self._release_adapters()
            self._outbuf = self._last_view = None
            self._handle.close()

    free = close

    @property
    def closed(self) -> bool:
        return self._handle is None or self._handle.closed

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def underlying(self) -> Any:
        """The raw ``llama_context *`` (for ``llama_cffi.lib``); valid while open."""
        return self._ptr()

    def __repr__(self) -> str:
        if self.closed:
            return "<Context closed>"
        return (
            f"<Context n_ctx={self._n_ctx} n_batch={self.n_batch} n_seq_max={self._n_seq_max} "
            f"model={self.model.desc!r}>"
        )

    # ------------------------------------------------------------------ sizes and controls
    @property
    def n_ctx(self) -> int:
        """Context size in tokens (KV cells), as llama.cpp chose it."""
        return int(lib.llama_n_ctx(self._ptr()))

    @property
    def n_ctx_seq(self) -> int:
        """Tokens one sequence can hold."""
        return int(lib.llama_n_ctx_seq(self._ptr()))

    @property
    def n_ubatch(self) -> int:
        return int(lib.llama_n_ubatch(self._ptr()))

    @property
    def n_seq_max(self) -> int:
        return int(lib.llama_n_seq_max(self._ptr()))

    @property
    def n_rs_seq(self) -> int:
        return int(lib.llama_n_rs_seq(self._ptr()))

    @property
    def n_threads(self) -> int:
        return int(lib.llama_n_threads(self._ptr()))

    @property
    def n_threads_batch(self) -> int:
        return int(lib.llama_n_threads_batch(self._ptr()))

    def set_n_threads(self, n_threads: int, n_threads_batch: int | None = None) -> None:
        """Threads for generation and for batch (prompt) processing, on a live context.

        Fixes the count: the adaptive policy (``adaptive_threads``) stops. A count above
        the attached pool's threads detaches the shared default pool; with a pool of your
        own it is refused."""
        nb = n_threads if n_threads_batch is None else n_threads_batch
        for name, v in (("n_threads", n_threads), ("n_threads_batch", nb)):
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 4096:
                raise ParamError(f"{name} must be an int in [1, 4096], not {v!r}")
        with self._busy:
            ptr = self._ptr()
            pool = self._pool
            if pool is not None and max(n_threads, nb) > pool.n_threads:
                if not self._pool_is_default:
                    raise ParamError(
                        f"the attached thread pool has {pool.n_threads} threads; {max(n_threads, nb)} do not fit: "
                        "attach a bigger Threadpool first"
                    )
                self._detach_pool(ptr)
                self._use_default = False
            self._gov = None
            lib.llama_set_n_threads(ptr, n_threads, nb)

    # ------------------------------------------------------------------ thread pools
    def _setup_threads(
        self, p: ContextParams, pool: Threadpool | None, pool_batch: Threadpool | None, adaptive: bool | None
    ) -> None:
        """Attach a pool (the caller's, or the process's default one) and choose the
        thread policy (see :mod:`llama_cffi.threadpool`)."""
        self._pool = self._pool_batch = None
        self._pool_is_default = False
        self._gov = None
        # pools llama.cpp's CPU backend ran this context's last graph on, and pins to drop
        # after the next decode (see _compute)
        self._last_pools: tuple[Threadpool, ...] = ()
        self._pools: tuple[Threadpool, ...] = ()  # the attached pools, as _last_pools holds them
        self._unpin_later: list[NativeHandle] = []
        t, b = int(p.c.n_threads), int(p.c.n_threads_batch)
        ptr = self._handle.ptr  # type: ignore[union-attr]
        if pool is not None:
            self._use_default = False
            _check_pools_fit(t, b, pool, pool_batch)
            self._attach_pool(ptr, pool, pool_batch)
        else:
            self._use_default = max(t, b) > 1 and max(t, b) <= available_cores()
            if self._use_default:
                self._attach_pool(ptr, default_threadpool(), None, default=True)
        if adaptive is None:
            adaptive = pool is None and not p.threads_explicit and not _has_gpu() and not self.model._uses_rpc
        if adaptive and max(t, b) > 1:
            self._gov = AdaptiveThreads(t, b, self._apply_threads)

    def _attach_pool(self, ptr: Any, pool: Threadpool, pool_batch: Threadpool | None, default: bool = False) -> None:
        pool._handle.pin()  # type: ignore[union-attr]
        self._pool_pins.append(pool._handle)  # type: ignore[arg-type]
        if pool_batch is not None and pool_batch is not pool:
            pool_batch._handle.pin()  # type: ignore[union-attr]
            self._pool_pins.append(pool_batch._handle)  # type: ignore[arg-type]
        else:
            pool_batch = None
        lib.llama_attach_threadpool(ptr, pool._handle.ptr, (pool_batch or pool)._handle.ptr)  # type: ignore[union-attr]
        self._pool, self._pool_batch = pool, pool_batch
        # in one order for every context (by id): locks taken in it cannot deadlock
        self._pools = (pool,) if pool_batch is None else tuple(sorted((pool, pool_batch), key=id))
        self._pool_is_default = default
        _pool_users.add(self)

    def _detach_pool(self, ptr: Any) -> None:
        if self._pool is None:
            return
        lib.llama_detach_threadpool(ptr)
        for pl in (self._pool, self._pool_batch):
            if pl is not None and pl._handle is not None:
                if any(pl is q for q in self._last_pools):
                    self._unpin_later.append(pl._handle)  # after the next decode (see _compute)
                else:
                    self._pool_pins.remove(pl._handle)
                    pl._handle.unpin()
        self._pool = self._pool_batch = None
        self._pools = ()
        self._pool_is_default = False
        _pool_users.discard(self)

    def _apply_threads(self, t: int, b: int, full: bool) -> None:
        """The adaptive policy's change (called with ``_busy`` held): the counts, and the
        default pool on at full strength only (its idle workers poll a core)."""
        ptr = self._handle.ptr  # type: ignore[union-attr]
        lib.llama_set_n_threads(ptr, t, b)
        if self._use_default:
            if full and self._pool is None:
                self._attach_pool(ptr, default_threadpool(), None, default=True)
            elif not full and self._pool_is_default:
                self._detach_pool(ptr)

    def _forked(self) -> None:
        """In a forked child: the pools' workers stayed in the parent, so decode without."""
        handle = self._handle
        if handle is not None and not handle.closed and self._pool is not None:
            lib.llama_detach_threadpool(handle.ptr)
        self._pool = self._pool_batch = None
        self._pool_is_default = self._use_default = False
        self._last_pools = self._pools = ()
        self._unpin_later.clear()
        self._pool_pins.clear()  # the child never frees a parent's pool

    def _compute(self, fn: Any, ptr: Any, batch: Any, batched: bool) -> int:
        """``fn(ptr, batch)`` (llama_decode or llama_encode) holding the locks of the pools
        it may touch, timed for the adaptive policy (called with ``_busy`` held).

        Those pools are the attached ones and the ones this context's last decode ran on:
        when llama.cpp's CPU backend moves to another pool (or to none) it pauses the one
        it leaves (``ggml_backend_cpu_set_threadpool``), which must not happen while another
        context computes a graph on it (that graph's workers would sleep at its barrier
        for ever). The time includes the wait for a pool: a pool busy with another
        context's graph is CPU this decode does not get."""
        pools, last = self._pools, self._last_pools
        gov = self._gov
        if not pools and not last:
            if gov is None:
                return int(fn(ptr, batch))
            w0, c0 = _wall(), _cpu()
            rc = int(fn(ptr, batch))
            gov._observe(_wall() - w0, _cpu() - c0, batched)
            return rc
        if last is pools:  # the steady case: the pools the last decode ran on
            need = pools
        else:
            need = tuple(sorted({id(pl): pl for pl in (*pools, *last)}.values(), key=id))  # one lock order
        w0, c0 = _wall(), _cpu()
        for pl in need:
            pl._lock.acquire()
        try:
            rc = int(fn(ptr, batch))
        finally:
            for pl in reversed(need):
                pl._lock.release()
        if last is not pools:
            self._last_pools = pools
            for h in self._unpin_later:  # pools let go of: llama.cpp's backend no longer points at them
                self._pool_pins.remove(h)
                h.unpin()
            self._unpin_later.clear()
        if gov is not None:
            gov._observe(_wall() - w0, _cpu() - c0, batched)
        return rc

    def attach_threadpool(self, threadpool: Threadpool, threadpool_batch: Threadpool | None = None) -> None:
        """Decode on ``threadpool`` (and ``threadpool_batch`` for multi-token batches;
        default: the same pool) from now on: ``llama_attach_threadpool``. Fixes the
        thread counts (the adaptive policy stops); they must fit the pools. The context
        keeps the pools allocated until it detaches them or is freed."""
        expect("threadpool", threadpool, Threadpool, "a llama_cffi.Threadpool")
        expect_pool("threadpool_batch", threadpool_batch)
        with self._busy:
            ptr = self._ptr()
            threadpool._ptr()
            if threadpool_batch is not None:
                threadpool_batch._ptr()
            t, b = int(lib.llama_n_threads(ptr)), int(lib.llama_n_threads_batch(ptr))
            if self._gov is not None:
                t, b = self._gov.n_threads, self._gov.n_threads_batch
            _check_pools_fit(t, b, threadpool, threadpool_batch)
            self._detach_pool(ptr)
            self._gov = None
            self._use_default = False
            lib.llama_set_n_threads(ptr, t, b)
            self._attach_pool(ptr, threadpool, threadpool_batch)

    def detach_threadpool(self) -> None:
        """Stop using the attached pool (yours or the default one): from now on each
        decode starts its own threads, as llama.cpp does without a pool
        (``llama_detach_threadpool``). The adaptive policy, if on, goes on."""
        with self._busy:
            ptr = self._ptr()
            self._use_default = False
            self._detach_pool(ptr)

    @property
    def threadpool(self) -> Threadpool | None:
        """The pool decodes run on now (None: each decode starts its own threads)."""
        self._ptr()
        return self._pool

    @property
    def adaptive_threads(self) -> AdaptiveThreads | None:
        """The adaptive thread policy (its counts now, drops and raises so far), or None
        when the thread counts are fixed. See :mod:`llama_cffi.threadpool`."""
        self._ptr()
        return self._gov

    @property
    def pooling_type(self) -> str:
        """Embedding pooling as a name: ``"none"``, ``"mean"``, ``"cls"``, ``"last"``, ``"rank"``."""
        return PoolingType(lib.llama_pooling_type(self._ptr())).name.lower()

    def set_embeddings(self, on: bool) -> None:
        """Also extract embeddings on the next decodes."""
        on = expect_bool("on", on)
        with self._busy:
            lib.llama_set_embeddings(self._ptr(), on)
            self._embeddings = on

    def set_causal_attn(self, on: bool) -> None:
        on = expect_bool("on", on)
        with self._busy:
            lib.llama_set_causal_attn(self._ptr(), on)

    @property
    def causal_attn(self) -> bool:
        return bool(lib.llama_get_causal_attn(self._ptr()))

    def set_warmup(self, on: bool) -> None:
        """llama.cpp's warm-up mode (deprecated upstream; prefer :meth:`warmup`)."""
        on = expect_bool("on", on)
        with self._busy:
            lib.llama_set_warmup(self._ptr(), on)

    def warmup(self) -> None:
        """Run one real decode (BOS, or token 0) to load weights and build graphs, then
        clear the memory. The first real decode afterwards runs at full speed."""
        tok = self._vocab.bos
        if self._enc_dec:
            self.start_decoder([0 if tok is None else tok])
        elif self._memoryless:
            self.decode([0 if tok is None else tok], logits="none")
        else:
            self.decode_single(0 if tok is None else tok, seq_id=0)
        self.memory.clear()

    def synchronize(self) -> None:
        """Wait for queued backend work (GPU) to finish."""
        lib.llama_synchronize(self._ptr())

    # ------------------------------------------------------------------ abort
    def set_abort_callback(self, fn: Callable[[], bool] | None, interval: float = ABORT_POLL_INTERVAL) -> None:
        """Poll ``fn()`` during decodes, at most every ``interval`` seconds; returning True
        aborts the decode (:class:`DecodeAbortedError`); an exception raised by ``fn``
        aborts it too and is re-raised from the ``decode`` call. ``None`` removes it."""
        if fn is not None and not callable(fn):
            raise type_error("fn", "callable (the abort callback) or None", fn)
        if not expect_number("interval", interval, "a number of seconds") >= 0:
            raise ParamError(f"interval must be >= 0 seconds, not {interval!r}")
        self._ptr()
        self._abort_py.callback = fn
        self._abort.interval_us = int(interval * 1e6)
        self._abort.next_us = 0  # poll at the first opportunity

    def request_abort(self) -> None:
        """Abort the decode in progress (it raises :class:`~llama_cffi.DecodeAbortedError`).
        Safe from any thread and from signal handlers: it only sets a flag that the C
        callback reads. Every decode clears the flag when it starts, so a request made
        while no decode runs has no effect on the next one."""
        self._abort.flag = 1

    def _take_abort_error(self) -> BaseException | None:
        err = self._abort_py.error or getattr(_pending, "exc", None)
        self._abort_py.error = None
        _pending.exc = None
        return err

    # ------------------------------------------------------------------ positions
    @property
    def n_past(self) -> int:
        """Tokens held by sequence 0 (its largest position + 1)."""
        self._ptr()
        return int(lib.llama_memory_seq_pos_max(self._memory, 0)) + 1

    def set_n_past(self, n: int) -> None:
        """Realign sequence 0 to ``n`` tokens: drop every position ``>= n`` (e.g. to rewind, or
        after restoring a state saved with more tokens)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ParamError(f"n (the new n_past) must be an int >= 0, not {n!r}")
        if not self.memory.seq_rm(0, n, -1):
            raise UnsupportedError(
                f"this {self._arch} model's recurrent state cannot be rewound to {n} tokens (create the context "
                "with n_rs_seq=k to keep k steps of rollback, or clear and decode again)"
            )

    def _check_seq(self, seq_id: object, name: str = "seq_id") -> int:
        if isinstance(seq_id, (bool, np.bool_)) or not isinstance(seq_id, (int, np.integer)):
            raise type_error(name, "an int (a sequence id)", seq_id)
        if not 0 <= seq_id < self._n_seq_max:
            raise ParamError(f"{name}={seq_id!r} is out of range [0, {self._n_seq_max})")
        return int(seq_id)

    def _start_pos(self, seq_id: int, pos: int | None, n: int) -> int:
        last = int(lib.llama_memory_seq_pos_max(self._memory, seq_id))
        if pos is None:
            start = last + 1
        else:
            if isinstance(pos, (bool, np.bool_)) or not isinstance(pos, (int, np.integer)):
                raise type_error("pos", "an int >= 0 or None", pos)
            if pos < 0:
                raise InvalidBatchError(f"pos must be an int >= 0, not {pos!r}")
            start = int(pos)
            if last >= 0 and (start <= last if self._mrope else start != last + 1):
                raise InvalidBatchError(
                    f"sequence {seq_id} ends at position {last}; new tokens must start at {last + 1}, not {start} "
                    "(remove positions first with memory.seq_rm to rewrite them)"
                )
        if start + n > self._n_ctx_seq:
            raise KvCacheFullError(
                f"{n} tokens at position {start} of sequence {seq_id} pass n_ctx_seq={self._n_ctx_seq} "
                "(free space with memory.seq_rm, or create a larger context)"
            )
        return start

    # ------------------------------------------------------------------ decoding
    def _after_decode(self, rc: int, n_outputs: int, out_index: np.ndarray | None, batch_size: int) -> None:
        """Bookkeeping shared by every decode path; maps return codes to exceptions."""
        self._last_rc = rc  # 0: llama.cpp wrote this decode's outputs (even if an error follows)
        self._guard.generation += 1
        self._last_view = None
        self._out_dev = None
        if self._rpc_seen >= 0:  # a model split over RPC workers: did one of them fail?
            self._check_rpc()
        if rc in (0, 1, 2):  # llama_decode applies pending shifts before it can return these
            self._shift_pending = False
        if rc == 0:
            self._n_outputs = n_outputs
            self._out_index = out_index if out_index is not None else np.zeros(0, dtype=np.int32)
            self._last_batch_size = batch_size
            if self._abort_py.error is not None or getattr(_pending, "exc", None) is not None:
                # the callback raised (or Ctrl-C landed in it) at a poll llama.cpp did not act
                # on: the decode completed, and the exception is raised now, not at a later decode
                err = self._take_abort_error()
                assert err is not None
                raise err
            return
        self._n_outputs = 0
        self._last_batch_size = 0
        self._abort.flag = 0
        if rc == 2:
            err = self._take_abort_error()
            if err is not None:
                raise err
            raise DecodeAbortedError("the decode was aborted; the KV memory keeps what was processed before")
        self._take_abort_error()
        if rc == 1:
            raise KvCacheFullError(
                "no KV-cache slot for the batch: the context is full (free space or use a larger n_ctx)"
            )
        if rc == -1:
            raise InvalidBatchError("llama_decode rejected the batch (see the llama_cffi log at warning level)")
        raise DecodeError(f"llama_decode failed with code {rc}")

    def _check_rpc(self) -> None:
        """Raise RpcError when a worker of this context's model has failed (now or before):
        llama.cpp then returned zeros for what it could not compute, so the outputs and
        the memory of this decode are not to be used, and the model is refused from now on."""
        from .rpc import failed, failures

        model = self.model
        now = failures()
        if model._rpc_lost is None and now != self._rpc_seen:
            model._rpc_lost = failed(model._rpc_endpoints)
        self._rpc_seen = now
        if model._rpc_lost is not None:
            self._n_outputs = 0
            self._last_batch_size = 0
            raise RpcError(f"{model._rpc_lost}; close this context and its model, and load the model again")

    def _add_output_hook(self, fn: Callable[[], None]) -> None:
        """Call the bound method ``fn`` (held weakly: it goes when its object does) right
        before llama.cpp may replace, move or free this context's outputs (every decode,
        encode, state load, and close), while the context is busy with that operation.
        For objects that keep raw arrays into the outputs between decodes and copy what
        they still need when told (:class:`samplers.branch.BranchStore`). ``fn`` must not
        use this context; an exception from it stops the operation before it starts."""
        self._output_hooks.append(weakref.WeakMethod(fn))

    def _outputs_will_change(self) -> None:
        hooks = self._output_hooks
        for ref in list(hooks):
            fn = ref()
            if fn is None:
                hooks.remove(ref)
            else:
                fn()

    def _may_grow(self, rows: int) -> bool:
        """Whether a decode with ``rows`` outputs can run as one call: False when it would make
        llama.cpp reallocate its output buffer while raw arrays still point into it."""
        grow = rows > self._out_rows_cap or (self._embeddings and not self._out_embd_reserved)
        return not (grow and self._outbuf is not None and self._outbuf.raw_arrays_alive())

    def _grew(self, rows: int) -> None:
        if rows > self._out_rows_cap or (self._embeddings and not self._out_embd_reserved):
            self._out_rows_cap = max(self._out_rows_cap, rows)
            self._out_embd_reserved = self._out_embd_reserved or self._embeddings
            self._outbuf = None  # the buffer may have moved: map it again on next use

    def _refuse_growth(self, rows: int, what: str) -> None:
        raise LiveOutputError(
            f"{what} needs {rows} output rows; llama.cpp's output buffer holds {self._out_rows_cap} and would be "
            "reallocated while arrays from np.asarray(view) (or slices of a view) still point into it: "
            "delete them or keep .copy() instead, then retry"
        )

    def decode_single(self, token: int, pos: int | None = None, seq_id: int = 0) -> OutputView:
        """Decode one token (the generation hot path: nothing is allocated but the view).

        Continues ``seq_id`` when ``pos`` is None. Returns the token's logits.
        """
        if type(token) is not int or not 0 <= token < self.n_vocab:
            token = self._vocab.check_token(token)
        if type(seq_id) is not int or seq_id != 0:
            seq_id = self._check_seq(seq_id)
        busy = self._busy
        if not busy.lock.acquire(False):
            busy.__enter__()  # raises ConcurrentUseError with the right message
        busy.owner = threading.get_ident()
        try:
            handle = self._handle
            assert handle is not None
            if handle._close_requested:
                handle.get()
            if pos is None:
                start = int(lib.llama_memory_seq_pos_max(self._memory, seq_id)) + 1
                if start >= self._n_ctx_seq:
                    self._start_pos(seq_id, None, 1)  # raises KvCacheFullError
            else:
                start = self._start_pos(seq_id, pos, 1)
            if self._kind_checks:
                self._check_kind(1, start)
            if self._output_hooks:
                self._outputs_will_change()
            if self._embeddings and not self._out_embd_reserved:
                if not self._may_grow(1):
                    self._refuse_growth(1, "this decode (embeddings were switched on)")
                self._grew(1)
            self._one_token[0] = token
            self._one_pos[0] = start
            self._one_seq[0] = seq_id
            self._abort.flag = 0
            self._guard.generation += 1  # earlier views go stale before llama.cpp writes
            rc = self._compute(lib.llama_decode, handle.ptr, self._one[0], False)
            self._after_decode(rc, 1, _ZERO_INDEX, 1)
            if self._backend:
                self._out_dev = np.array([seq_id in self._backend])
            return self._logits_row(0)
        finally:
            busy.owner = 0
            busy.lock.release()

    @overload
    def decode(
        self, tokens: Any, pos: int | None = None, seq_id: int = 0, logits: Literal["last"] = "last"
    ) -> OutputView: ...

    @overload
    def decode(self, tokens: Any, pos: int | None, seq_id: int, logits: Literal["none"]) -> None: ...

    @overload
    def decode(self, tokens: Any, pos: int | None = None, seq_id: int = 0, *, logits: Literal["none"]) -> None: ...

    @overload
    def decode(
        self, tokens: Any, pos: int | None = None, seq_id: int = 0, *, logits: str | npt.ArrayLike
    ) -> OutputView | npt.NDArray[np.float32] | None: ...

    def decode(
        self,
        tokens: Any,
        pos: int | None = None,
        seq_id: int = 0,
        logits: str | npt.ArrayLike = "last",
    ) -> OutputView | npt.NDArray[np.float32] | None:
        """Append ``tokens`` (list or numpy) to sequence ``seq_id``, in ``n_batch`` chunks.

        ``logits``: ``"last"`` (returns that row), ``"all"`` or a boolean mask (returns a
        ``(n_outputs, n_vocab)`` array: a guarded view when one chunk held every output,
        else a copy), or ``"none"`` (returns None).
        """
        arr = self._vocab.check_tokens(tokens)
        n = len(arr)
        if n == 0:
            raise InvalidBatchError("decode needs at least one token")
        seq_id = self._check_seq(seq_id)
        mode = logits if isinstance(logits, str) else "mask"
        if isinstance(logits, str):
            if logits not in ("last", "all", "none"):
                raise ParamError(f"logits={logits!r}; use 'last', 'all', 'none' or a boolean mask")
            mask = np.zeros(n, dtype=bool)
            if logits == "last":
                mask[-1] = True
            elif logits == "all":
                mask[:] = True
        else:
            mask = np.asarray(logits)
            if mask.dtype != bool or mask.shape != (n,):
                raise ParamError(f"a logits mask must be a bool array of shape ({n},), got {mask.dtype} {mask.shape}")
        if self._batch is None:
            self._batch = Batch(self.n_batch)
        b = self._batch
        chunks: list[np.ndarray] = []
        with self._busy:
            ptr = self._ptr()
            start = self._start_pos(seq_id, pos, n)
            if self._kind_checks:
                self._check_kind(n, start + n - 1)
            self._check_non_causal(ptr, n)
            self._outputs_will_change()
            # chunk ends: at most n_batch tokens, and (while raw arrays point into the output
            # buffer) at most as many outputs as the buffer holds, so it is never reallocated
            out_limit = self.n_batch if self._may_grow(min(int(mask.sum()), self.n_batch)) else self._out_rows_cap
            if self._embeddings and not self._out_embd_reserved and out_limit < self.n_batch:
                self._refuse_growth(int(mask.sum()), "this decode (embeddings were switched on)")
            ends = _chunk_ends(mask, self.n_batch, max(out_limit, 1))
            off = 0
            for end in ends:
                m = end - off
                b.token[:m] = arr[off:end]
                b.pos[:m] = np.arange(start + off, start + end, dtype=np.int32)
                b.n_seq_id[:m] = 1
                b.seq_id[:m, 0] = seq_id
                b.logits[:m] = mask[off:end]
                b.n_tokens = m
                out_index = np.flatnonzero(b.logits[:m]).astype(np.int32)
                self._grew(len(out_index))
                self._abort.flag = 0
                self._guard.generation += 1
                rc = self._compute(lib.llama_decode, ptr, b.c, m > 1)
                self._after_decode(rc, len(out_index), out_index, m)
                if self._backend:
                    self._out_dev = np.full(len(out_index), seq_id in self._backend)
                if mode in ("all", "mask") and len(out_index) and end < n:
                    chunks.append(np.array(self._all_rows(), copy=True))
                off = end
        if mode == "none":
            return None
        if mode == "last":
            return self._logits_row(self._n_outputs - 1)
        if not chunks:
            if self._n_outputs == 0:
                return np.zeros((0, self.n_vocab), dtype=np.float32)
            return self._all_rows()
        if self._n_outputs:
            chunks.append(np.array(self._all_rows(), copy=True))
        return np.concatenate(chunks) if chunks else np.zeros((0, self.n_vocab), dtype=np.float32)

    def decode_batch(self, batch: Batch) -> None:
        """``llama_decode`` a prepared :class:`Batch` (many sequences at once), validated."""
        expect("batch", batch, Batch, "a llama_cffi.Batch")
        n = batch.n_tokens
        if n == 0:
            raise InvalidBatchError("the batch is empty")
        if not isinstance(n, int) or not 0 < n <= batch.capacity:
            raise InvalidBatchError(f"batch.n_tokens={n!r} is outside 1..capacity={batch.capacity}")
        if n > self.n_batch:
            raise InvalidBatchError(f"a batch of {n} tokens exceeds n_batch={self.n_batch}")
        if batch.n_embd:
            if batch.n_embd != self._n_embd_inp:
                raise InvalidBatchError(
                    f"the batch's embeddings are {batch.n_embd} wide; this model takes {self._n_embd_inp}"
                )
            if batch.n_pos != self._n_pos_per_embd:  # llama.cpp would read past the positions
                raise InvalidBatchError(
                    f"this model reads {self._n_pos_per_embd} positions per embedding (M-RoPE: 4); the batch "
                    f"holds {batch.n_pos}: make it with Batch(..., n_pos={self._n_pos_per_embd})"
                )
        else:
            tok = batch.token[:n]
            bad = (tok < 0) | (tok >= self.n_vocab)
            if bad.any():
                i = int(np.argmax(bad))
                raise InvalidBatchError(
                    f"token id {int(tok[i])} at batch index {i} is out of range [0, {self.n_vocab})"
                )
        nseq = batch.n_seq_id[:n]
        if (nseq < 1).any() or (nseq > batch.n_seq_max).any():
            i = int(np.argmax((nseq < 1) | (nseq > batch.n_seq_max)))
            raise InvalidBatchError(f"token {i} belongs to {int(nseq[i])} sequences; must be 1..{batch.n_seq_max}")
        with self._busy:
            self._decode_batch_held(batch, n)

    def _decode_batch_held(self, batch: Batch, n: int) -> None:
        """:meth:`decode_batch` after its argument checks, with ``_busy`` held."""
        ptr = self._ptr()
        self._validate_batch_positions(batch, n)
        if self._kind_checks:
            self._check_kind(n, int(batch.pos[:n].max()))
        self._check_non_causal(ptr, n)
        if self._output_hooks:
            self._outputs_will_change()
        out_index = np.flatnonzero(batch.logits[:n]).astype(np.int32)
        if not self._may_grow(len(out_index)):
            self._refuse_growth(len(out_index), "this batch")
        self._grew(len(out_index))
        self._abort.flag = 0
        self._guard.generation += 1
        rc = self._compute(lib.llama_decode, ptr, batch.c, n > 1)
        self._after_decode(rc, len(out_index), out_index, n)
        if self._backend:
            self._out_dev = self._backend_mask[batch.seq_id[out_index, 0]]

    def decode_embeddings(
        self,
        embd: npt.ArrayLike,
        pos: int | None = None,
        seq_id: int = 0,
        logits: str = "none",
        mrope_pos: npt.ArrayLike | None = None,
    ) -> OutputView | None:
        """Append input embeddings (instead of token ids) to sequence ``seq_id``: ``embd`` is
        a float32 ``(n, model.n_embd_inp)`` array, one row per position (what a multimodal
        projector produces: :meth:`llama_cffi.mtmd.Projector.encode`), decoded in
        ``n_batch`` chunks at positions ``pos...`` (default: after the sequence's last).
        ``logits``: ``"none"`` or ``"last"`` (returns the last row's logits). The same
        checks as :meth:`decode`; with causal attention off every chunk must fit one
        micro-batch.

        A model with M-RoPE positions (Qwen2-VL and others) reads four positions per row
        (t, y, x, z): ``mrope_pos``, an ``(n, 4)`` integer array of them (an image's 2-D
        grid, from :meth:`Projector.eval <llama_cffi.mtmd.Projector.eval>`), instead of
        ``pos``; without it each row's four are ``pos + i``. The KV cache keeps the t
        positions: they may repeat, and must start at or after the sequence's last
        (llama.cpp's rule for M-RoPE embeddings)."""
        if not isinstance(embd, np.ndarray) or embd.dtype != np.float32 or embd.ndim != 2:
            raise type_error("embd", "a 2-D float32 numpy array (positions x n_embd_inp)", embd)
        n, width = embd.shape
        if n == 0:
            raise InvalidBatchError("decode_embeddings needs at least one row")
        if width != self._n_embd_inp:
            raise InvalidBatchError(f"embeddings of width {width}; this model takes {self._n_embd_inp}")
        if logits not in ("none", "last"):
            raise ParamError(f"logits={logits!r}; use 'none' or 'last'")
        seq_id = self._check_seq(seq_id)
        if pos is not None and (isinstance(pos, (bool, np.bool_)) or not isinstance(pos, (int, np.integer))):
            raise type_error("pos", "an int >= 0 or None", pos)
        mrope = self._n_pos_per_embd == 4
        sections: npt.NDArray[np.int32] | None = None
        if mrope_pos is not None:
            arr = np.asarray(mrope_pos)
            if arr.shape != (n, 4) or arr.dtype.kind not in "iu":
                raise type_error("mrope_pos", f"an integer array of shape ({n}, 4)", mrope_pos)
            if not mrope:
                raise ParamError("mrope_pos is for models with M-RoPE positions; this one has one position per row")
            if pos is not None:
                raise ParamError("give pos or mrope_pos, not both")
            if (arr < 0).any() or (arr > 2**31 - 1).any():
                raise InvalidBatchError("mrope_pos holds a position outside [0, 2**31)")
            sections = arr.astype(np.int32)
        b = self._embd_batch
        if b is None:
            b = self._embd_batch = Batch(self.n_batch, n_embd=self._n_embd_inp, n_pos=self._n_pos_per_embd)
        with self._busy:
            self._ptr()  # ClosedError before the memory is read
            if sections is not None:
                last = int(lib.llama_memory_seq_pos_max(self._memory, seq_id))
                t = sections[:, 0]
                if int(t.min()) < last or (n > 1 and (np.diff(t) < 0).any()):
                    raise InvalidBatchError(
                        f"sequence {seq_id} ends at position {last}; the rows' t positions must not go below it "
                        "nor decrease"
                    )
                if int(t.max()) >= self._n_ctx_seq:
                    raise KvCacheFullError(f"t position {int(t.max())} passes n_ctx_seq={self._n_ctx_seq}")
                start = int(t[0])
            else:
                start = self._start_pos(seq_id, pos, n)
            for off in range(0, n, self.n_batch):
                end = min(n, off + self.n_batch)
                m = end - off
                b.embd[:m] = embd[off:end]
                b.n_tokens = m
                if sections is not None:
                    b.set_mrope_positions(sections[off:end])
                elif mrope:
                    b.set_mrope_positions(np.repeat(np.arange(start + off, start + end, dtype=np.int32)[:, None], 4, 1))
                else:
                    b.pos[:m] = np.arange(start + off, start + end, dtype=np.int32)
                b.n_seq_id[:m] = 1
                b.seq_id[:m, 0] = seq_id
                b.logits[:m] = 0
                if logits == "last" and end == n:
                    b.logits[m - 1] = 1
                b.n_tokens = m
                self._decode_batch_held(b, m)
        return self._logits_row(self._n_outputs - 1) if logits == "last" else None

    def _check_non_causal(self, ptr: Any, n: int) -> None:
        """With causal attention off (:meth:`set_causal_attn`, or a model whose attention
        is not causal), llama.cpp needs a decode's tokens in one micro-batch: more aborts
        the process (``llama-context.cpp``: "non-causal attention requires n_ubatch >=
        n_tokens")."""
        if n > 1 and not lib.llama_get_causal_attn(ptr):
            n_ubatch = int(lib.llama_n_ubatch(ptr))
            if n > n_ubatch:
                raise InvalidBatchError(
                    f"with causal attention off, a decode's {n} tokens must fit one micro-batch (n_ubatch={n_ubatch}): "
                    "decode fewer at once, or create the context with a larger n_ubatch"
                )

    def _validate_batch_positions(self, batch: Batch, n: int) -> None:
        if not self._mrope and self._positions_fine(batch, n):
            return
        pos = batch.pos[:n]
        if (pos < 0).any():
            raise InvalidBatchError(f"negative position {int(pos.min())} in the batch")
        per_seq: dict[int, list[int]] = {}
        seq_ids, nseq = batch.seq_id, batch.n_seq_id
        for i in range(n):
            for s in seq_ids[i, : nseq[i]]:
                s = int(s)
                if not 0 <= s < self._n_seq_max:
                    raise InvalidBatchError(f"seq id {s} of token {i} is out of range [0, {self._n_seq_max})")
                per_seq.setdefault(s, []).append(int(pos[i]))
        for s, ps in per_seq.items():
            last = int(lib.llama_memory_seq_pos_max(self._memory, s))
            first = ps[0]
            # M-RoPE: tokens after the last position, embeddings at or after it (llama-batch.cpp)
            embd = batch.n_embd > 0
            if last >= 0 and ((first < last if embd else first <= last) if self._mrope else first != last + 1):
                raise InvalidBatchError(
                    f"sequence {s} ends at position {last}; its tokens must start at {last + 1}, not {first}"
                )
            if not self._mrope and ps != list(range(first, first + len(ps))):
                raise InvalidBatchError(f"positions of sequence {s} in the batch are not consecutive: {ps[:8]}...")
            if max(ps) >= self._n_ctx_seq:
                raise KvCacheFullError(f"sequence {s} would reach position {max(ps)}, past n_ctx_seq={self._n_ctx_seq}")

    def _positions_fine(self, batch: Batch, n: int) -> bool:
        """The usual batch checked with numpy: each token of one sequence, and either one
        token per sequence (a step of many branches) or one sequence (a prompt chunk). True
        when every position is fine; False sends the batch through the token-by-token
        check, which names the first problem."""
        if not (batch.n_seq_id[:n] == 1).all():
            return False
        pos = batch.pos[:n]
        seqs = batch.seq_id[:n, 0]
        lo, hi = int(seqs.min()), int(seqs.max())
        if lo < 0 or hi >= self._n_seq_max or int(pos.min()) < 0:
            return False
        mem = self._memory
        if lo == hi:  # one sequence: consecutive positions from its end on
            last = int(lib.llama_memory_seq_pos_max(mem, lo))
            p0 = int(pos[0])
            return (
                (last < 0 or p0 == last + 1)
                and p0 + n - 1 < self._n_ctx_seq
                and (n == 1 or bool((np.diff(pos) == 1).all()))
            )
        if n > self._n_seq_max or len(set(seqs.tolist())) != n:
            return False  # a sequence with several tokens among others: token by token
        ends = np.fromiter((lib.llama_memory_seq_pos_max(mem, s) for s in seqs.tolist()), dtype=np.int64, count=n)
        return bool((((ends < 0) | (pos == ends + 1)) & (pos < self._n_ctx_seq)).all())

    def eval(self, tokens: Any, n_past: int) -> OutputView:
        """Evaluate ``tokens`` at positions ``n_past...`` of sequence 0, dropping whatever
        sequence 0 held from ``n_past`` on. Returns the last token's logits."""
        arr = self._vocab.check_tokens(tokens)  # validate before touching the memory
        if len(arr) == 0:
            raise InvalidBatchError("eval needs at least one token")
        if isinstance(n_past, bool) or not isinstance(n_past, int) or n_past < 0:
            raise ParamError(f"n_past must be an int >= 0, not {n_past!r}")
        if n_past + len(arr) > self._n_ctx_seq:
            raise KvCacheFullError(f"{len(arr)} tokens at position {n_past} pass n_ctx_seq={self._n_ctx_seq}")
        if n_past > self.n_past:
            raise InvalidBatchError(f"n_past={n_past} is beyond the {self.n_past} tokens sequence 0 holds")
        self.set_n_past(n_past)
        return self.decode(arr)

    def encode(self, tokens: Any, seq_id: int = 0) -> None:
        """Run the encoder: of an encoder-decoder model (T5: then decode from the decoder
        start token), or the non-causal pass of an encoder-only model (BERT-like: no KV
        memory; read :meth:`embeddings`). ``seq_id=-1``: the input belongs to every
        sequence (an encoder-decoder's decoder sequences attend only to encoder input of
        their own sequence: this lets all of them, e.g. branches, see it).
        :class:`~llama_cffi.errors.UnsupportedError` on a decoder-only model (llama.cpp
        would crash), :class:`InvalidBatchError` for more tokens than ``n_ubatch`` (the
        encoder takes one micro-batch)."""
        arr = self._vocab.check_tokens(tokens)
        if isinstance(seq_id, (bool, np.bool_)) or not isinstance(seq_id, (int, np.integer)):
            raise type_error("seq_id", "an int (a sequence id, or -1 for every sequence)", seq_id)
        n = len(arr)
        if n == 0:
            raise InvalidBatchError("encode needs at least one token")
        n_ubatch = int(lib.llama_n_ubatch(self._ptr()))
        if n > min(self.n_batch, n_ubatch):
            raise InvalidBatchError(
                f"encode takes at most n_ubatch={n_ubatch} tokens at once (the encoder runs one micro-batch), got {n}"
            )
        self._require_encoder()
        seqs = list(range(self._n_seq_max)) if seq_id == -1 else [self._check_seq(seq_id)]
        if self._memoryless and n > self.model.n_ctx_train > 0:
            raise InvalidBatchError(
                f"this encoder-only {self._arch} model reads at most n_ctx_train={self.model.n_ctx_train} "
                f"positions, got {n} tokens"
            )
        if len(seqs) > 1:
            b = Batch(n, len(seqs))
            b.token[:n] = arr
            b.pos[:n] = np.arange(n, dtype=np.int32)
            b.n_seq_id[:n] = len(seqs)
            b.seq_id[:n, : len(seqs)] = seqs
            b.n_tokens = n
        else:
            if self._batch is None:
                self._batch = Batch(self.n_batch)
            b = self._batch
            b.set_sequence(arr, 0, seqs[0], output_last=False)
        with self._busy:
            ptr = self._ptr()
            if self._enc_dec and any(
                int(lib.llama_memory_seq_pos_max(self._memory, s)) >= 0 for s in range(self._n_seq_max)
            ):
                raise InvalidBatchError(
                    "encode needs the decoder memory empty (llama.cpp refuses a new input while it holds "
                    "decoded tokens): clear it first with memory.clear()"
                )
            self._outputs_will_change()
            if not self._may_grow(n):
                self._refuse_growth(n, "encode")
            self._grew(n)
            b.logits[:n] = 1
            self._abort.flag = 0
            self._guard.generation += 1
            rc = self._compute(lib.llama_encode, ptr, b.c, n > 1)
            self._after_decode(rc, n, np.arange(n, dtype=np.int32), n)
            self._encoded = self._encoded or self._enc_dec

    def _check_kind(self, n: int, last_pos: int) -> None:
        """Refuse a decode this model's kind cannot take (llama.cpp would abort)."""
        if self._memoryless:
            limit = min(self.n_batch, int(lib.llama_n_ubatch(self._ptr())))
            if n > limit:
                raise InvalidBatchError(
                    f"this encoder-only {self._arch} model reads each input in one pass: at most "
                    f"n_ubatch={limit} tokens per decode, got {n}"
                )
            if last_pos >= self.model.n_ctx_train > 0:
                raise InvalidBatchError(
                    f"this encoder-only {self._arch} model reads at most n_ctx_train={self.model.n_ctx_train} "
                    f"positions; the input reaches position {last_pos}"
                )
        if self._enc_dec and not self._encoded:
            raise UnsupportedError(
                f"this encoder-decoder {self._arch} model decodes after encode: call encode(input) first, then "
                f"decode from its decoder start token ({self.model.decoder_start_token})"
            )

    def start_decoder(self, tokens: Any, seq_id: int = 0) -> OutputView:
        """For an encoder-decoder model: clear the memory, encode ``tokens``, decode the
        model's decoder start token into ``seq_id`` and return its logits (the first
        generated token comes from them)."""
        self._vocab.check_tokens(tokens)
        if isinstance(seq_id, (bool, np.bool_)) or not isinstance(seq_id, (int, np.integer)):
            raise type_error("seq_id", "an int (a sequence id)", seq_id)
        self._ptr()
        if not self._enc_dec:
            raise UnsupportedError(f"start_decoder is for encoder-decoder models; this is a {self._arch} model")
        start = self.model.decoder_start_token
        if start is None:
            start = self._vocab.bos
        if start is None:
            raise UnsupportedError(f"this {self._arch} model names no decoder start token (and no BOS)")
        self.memory.clear()
        self.encode(tokens, seq_id=-1)  # every sequence may attend to it (branches forked later)
        return self.decode_single(start, seq_id=seq_id)

    def _require_encoder(self) -> None:
        if self.model.has_encoder or self._memory == ffi.NULL:
            return  # an encoder-decoder, or an encoder-only model (no KV memory: non-causal)
        arch = self.model.metadata.get("general.architecture", "?")
        raise UnsupportedError(
            "encode needs a model with an encoder (an encoder-decoder such as T5, or an encoder-only "
            f"embedding model such as BERT); this is a decoder-only {arch} model: use decode"
        )

    # ------------------------------------------------------------------ outputs
    def _lease(self, p: Any, nbytes: int) -> Any:
        """A buffer over ``nbytes`` at ``p`` whose owner pins this context: arrays made from
        it keep the native memory alive (numpy keeps the buffer as the arrays' base)."""
        assert self._handle is not None
        handle = self._handle
        handle.pin()
        owner = ffi.gc(ffi.cast("char *", p), lambda _p: handle.unpin())
        return ffi.buffer(owner, nbytes)

    def _output_buffer(self) -> OutputBuffer:
        """llama.cpp's logits, mapped over the rows its output buffer holds (remapped when
        llama.cpp moved it, which happens only when no raw array points into it)."""
        p = lib.llama_get_logits(self._ptr())
        if p == ffi.NULL:
            raise IndexError("llama.cpp has no logits for the last decode")
        ob = self._outbuf
        if ob is None or p != ob.ptr:
            n = self.n_vocab * max(self._out_rows_cap, self._n_outputs)
            ob = self._outbuf = OutputBuffer(p, np.frombuffer(self._lease(p, 4 * n), dtype=np.float32))
        return ob

    def _logits_row(self, row: int) -> OutputView:
        view = self._last_view
        last = row == self._n_outputs - 1
        if view is not None and last:
            return view
        if self._n_outputs == 0:
            raise IndexError("the last decode produced no logits (no token was marked for output)")
        why = None
        if self._out_dev is not None and self._out_dev[row]:
            why = self._device_row_why(row)
        view = OutputView(self._output_buffer(), row * self.n_vocab, (self.n_vocab,), self._guard, why)
        if last:
            self._last_view = view
        return view

    def _device_row_why(self, row: int) -> str:
        return (
            f"output row {row} of the last decode belongs to a sequence sampled on the device "
            "(set_backend_sampler): llama.cpp did not copy its logits to the host; read sampled() instead"
        )

    def _check_idle(self) -> None:
        """Outputs are read only between decodes: not from another thread while one runs,
        nor from inside its callbacks (llama.cpp may be rewriting or reallocating them)."""
        if self._busy.lock.locked():
            raise ConcurrentUseError(
                "this Context is decoding (in another thread, or this is one of its callbacks): "
                "read its outputs after the decode returns"
            )

    def logits(self, i: int = -1) -> OutputView:
        """Logits of one output of the last decode: ``i`` is the token's index in that batch
        (negative: counting outputs from the end, ``-1`` = the last output). A guarded
        zero-copy view of ``n_vocab`` float32 values."""
        i = expect_int("i", i)
        self._ptr()
        self._check_idle()
        if self._guard.unavailable is not None:
            raise UnsupportedError(self._guard.unavailable)
        n_out = self._n_outputs
        if n_out == 0:
            raise IndexError("the last decode produced no logits (no token was marked for output)")
        if i < 0:
            if i < -n_out:
                raise IndexError(f"output {i} is out of range: the last decode has {n_out} outputs")
            return self._logits_row(n_out + i)
        if i >= self._last_batch_size:
            raise IndexError(f"token {i} is out of range: the last batch had {self._last_batch_size} tokens")
        rows = np.flatnonzero(self._out_index == i)
        if len(rows) == 0:
            raise IndexError(f"token {i} of the last batch was not marked for output")
        return self._logits_row(int(rows[0]))

    def logits_all(self) -> OutputView:
        """Every output row of the last decode: a guarded ``(n_outputs, n_vocab)`` view."""
        self._ptr()
        self._check_idle()
        if self._guard.unavailable is not None:
            raise UnsupportedError(self._guard.unavailable)
        return self._all_rows()

    def _all_rows(self) -> OutputView:
        if self._n_outputs == 0:
            raise IndexError("the last decode produced no logits (no token was marked for output)")
        why = None
        if self._out_dev is not None and self._out_dev.any():
            why = self._device_row_why(int(np.argmax(self._out_dev)))
        return OutputView(self._output_buffer(), 0, (self._n_outputs, self.n_vocab), self._guard, why)

    @property
    def n_outputs(self) -> int:
        """Rows of output (logits/embeddings) the last decode produced."""
        return self._n_outputs

    # ------------------------------------------------------------------ backend sampling
    def set_backend_sampler(self, seq_id: int, sampler: LlamaSampler | None) -> bool:
        """Sample sequence ``seq_id`` on the device that computes the logits
        (``llama_set_sampler``, llama.cpp's experimental backend sampling), or stop (None).

        ``sampler`` is a :meth:`LlamaSampler.chain` used by no context before (llama.cpp
        prepares a chain for one graph, once): this context keeps it alive until it is
        replaced, removed or the context closes (closing the chain meanwhile only marks it
        closed). llama.cpp runs the longest prefix of the chain whose samplers it can put
        in the graph there and the rest on the host; from the next decode on, the outputs
        of this sequence are what the chain left (:meth:`sampled`), and their logits are
        not copied to the host: reading them raises
        :class:`~llama_cffi.errors.UnsupportedError`. Setting a sampler makes llama.cpp
        reserve its graphs again at the next decode.

        Returns whether every sampler of the chain runs on the device (llama.cpp's
        ``+name``/``-name`` markers, and the measuring sampler's own answer)."""
        self._ptr()
        seq_id = self._check_seq(seq_id)
        if self._guard.unavailable is not None:
            raise UnsupportedError(self._guard.unavailable)
        if sampler is not None:
            if not isinstance(sampler, LlamaSampler) or not sampler._is_chain:
                raise ParamError("a backend sampler must be a LlamaSampler.chain(...)")
            if len(sampler) == 0:
                raise ParamError("a backend sampler chain needs at least one sampler")
            if sampler._backend_used:
                raise ParamError(
                    "this chain was attached to a context before (llama.cpp prepares a chain once): attach a clone()"
                )
        with self._busy:
            ptr = self._ptr()
            old = self._backend.pop(seq_id, None)
            self._backend_mask[seq_id] = False
            if sampler is None:
                if old is not None:
                    lib.llama_set_sampler(ptr, seq_id, ffi.NULL)
                    assert old._handle is not None
                    old._handle.unpin()
                return True
            sp = sampler._ptr()
            assert sampler._handle is not None
            sampler._handle.pin()
            sampler._backend_used = True
            with log.capture():
                lib.llama_set_sampler(ptr, seq_id, sp)
            self._backend[seq_id] = sampler
            self._backend_mask[seq_id] = True
            if old is not None:
                assert old._handle is not None
                old._handle.unpin()
            return sampler.on_backend()

    def backend_sampler(self, seq_id: int) -> LlamaSampler | None:
        """The chain attached to ``seq_id`` by :meth:`set_backend_sampler`, or None."""
        self._ptr()
        return self._backend.get(self._check_seq(seq_id))

    def sampled(self, i: int = -1) -> SampledOutput:
        """What the backend sampler left for output ``i`` of the last decode (``i`` as in
        :meth:`logits`): copies of the sampled token (None if the chain selected none), the
        probabilities, the logits and the candidate ids (empty arrays when the chain left
        none; without candidates, logits and probabilities are over the whole
        vocabulary in id order)."""
        i = expect_int("i", i)
        self._ptr()
        self._check_idle()
        n_out = self._n_outputs
        if n_out == 0:
            raise IndexError("the last decode produced no outputs")
        if i < 0:
            if i < -n_out:
                raise IndexError(f"output {i} is out of range: the last decode has {n_out} outputs")
            idx = int(self._out_index[n_out + i])
            row = n_out + i
        else:
            if i >= self._last_batch_size or not (self._out_index == i).any():
                raise IndexError(f"token {i} of the last batch was not an output")
            idx = int(i)
            row = int(np.flatnonzero(self._out_index == i)[0])
        if self._out_dev is None or not self._out_dev[row]:
            raise UnsupportedError(f"output {i} of the last decode belongs to a sequence without a backend sampler")
        ptr = self._ptr()

        def floats(p: Any, n: int) -> npt.NDArray[np.float32]:
            if p == ffi.NULL or n == 0:
                return np.zeros(0, dtype=np.float32)
            out: npt.NDArray[np.float32] = np.frombuffer(ffi.buffer(p, 4 * n), dtype=np.float32).copy()
            return out

        tok = int(lib.llama_get_sampled_token_ith(ptr, idx))
        probs = floats(lib.llama_get_sampled_probs_ith(ptr, idx), int(lib.llama_get_sampled_probs_count_ith(ptr, idx)))
        logits = floats(
            lib.llama_get_sampled_logits_ith(ptr, idx), int(lib.llama_get_sampled_logits_count_ith(ptr, idx))
        )
        nc = int(lib.llama_get_sampled_candidates_count_ith(ptr, idx))
        cp = lib.llama_get_sampled_candidates_ith(ptr, idx) if nc else ffi.NULL
        cands = np.zeros(0, np.int32)
        if cp != ffi.NULL and nc:
            cands = np.frombuffer(ffi.buffer(cp, 4 * nc), dtype=np.int32).copy()
        return SampledOutput(None if tok < 0 else tok, probs, logits, cands)

    def embeddings(self, i: int = -1, normalize: bool = False) -> np.ndarray:
        """Embedding of output ``i`` of the last decode (needs ``embeddings=True``): a new
        float32 array of ``n_embd_out`` values, L2-normalised if ``normalize``."""
        i = expect_int("i", i)
        normalize = expect_bool("normalize", normalize)
        ptr = self._ptr()
        self._check_idle()
        if not self._embeddings:
            raise ParamError("embeddings are off: create the context with embeddings=True or call set_embeddings(True)")
        n_out = self._n_outputs
        if n_out == 0 or not -n_out <= i < self._last_batch_size:
            raise IndexError(f"no embedding for output {i} (last decode: {n_out} outputs)")
        if i >= 0 and not (self._out_index == i).any():
            raise IndexError(f"token {i} of the last batch was not marked for output")
        p = lib.llama_get_embeddings_ith(ptr, i)
        if p == ffi.NULL:
            raise IndexError(f"llama.cpp has no embedding for output {i} (pooled context? use embeddings_seq)")
        return self._embd_view(p, self.model.n_embd_out, normalize)

    def embeddings_seq(self, seq_id: int = 0, normalize: bool = False) -> np.ndarray:
        """Pooled embedding of a sequence (contexts with a pooling type other than none);
        for ``rank`` pooling, the classifier scores (``n_cls_out`` values)."""
        normalize = expect_bool("normalize", normalize)
        ptr = self._ptr()
        self._check_idle()
        seq_id = self._check_seq(seq_id)
        if self.pooling_type == "none":
            raise ParamError("this context does not pool (pooling_type is 'none'); use embeddings(i)")
        p = lib.llama_get_embeddings_seq(ptr, seq_id)
        if p == ffi.NULL:
            raise IndexError(f"no pooled embedding for sequence {seq_id} in the last decode")
        n = max(self.model.n_cls_out, 1) if self.pooling_type == "rank" else self.model.n_embd_out
        return self._embd_view(p, n, normalize)

    def embed(self, texts: str | Sequence[str], normalize: bool = True) -> npt.NDArray[np.float32]:
        """Pooled embeddings of many texts: a new ``(len(texts), n_embd_out)`` float32
        array, L2-normalised if ``normalize`` (as ``llama-embedding`` does by default).

        Texts are tokenized as llama.cpp's ``llama-embedding`` tokenizes them (special
        tokens added and parsed) and packed several to a decode, one sequence each (up to
        ``n_seq_max`` sequences and ``n_batch`` tokens per decode; ``n_ubatch`` for
        encoder-only models, which read each input in one pass). Needs a context with
        ``embeddings=True`` and a pooling type (``mean``, ``cls``, ``last``; the model's by
        default); the context's memory is cleared before each decode, so use a context
        of its own for embedding."""
        if not isinstance(texts, str):
            texts = expect_strs("texts", texts, "a str or a sequence of str")
        normalize = expect_bool("normalize", normalize)
        rows = self._pooled([texts] if isinstance(texts, str) else texts, "embed")
        out = np.stack(rows) if rows else np.zeros((0, self.model.n_embd_out), dtype=np.float32)
        if normalize and len(out):
            norms = np.linalg.norm(out, axis=1, keepdims=True)
            np.divide(out, norms, out=out, where=norms > 0)
        return out

    def rerank(self, query: str, documents: Sequence[str]) -> npt.NDArray[np.float32]:
        """Relevance scores of ``documents`` for ``query`` from a reranking model (a
        context whose pooling type is ``rank``): a new float32 array, one score per
        document (the first class's, when the head has several), higher is more relevant.
        Each pair is formed as ``llama-embedding`` forms it: the model's ``rerank`` chat
        template with ``{query}`` and ``{document}``, else query, EOS and SEP texts (as
        the vocabulary adds them), document. Packed like :meth:`embed`."""
        expect_str("query", query)
        documents = expect_strs("documents", documents)
        if self.pooling_type != "rank":
            raise ParamError("rerank needs a reranking model and a context with pooling_type='rank'")
        vocab = self._vocab
        template = self.model.chat_template("rerank")
        pairs = []
        for doc in documents:
            if template is not None:
                pairs.append(template.replace("{query}", query).replace("{document}", doc))
            else:
                eos = vocab.token_text(vocab.eos) if vocab.add_eos and vocab.eos is not None else ""
                sep = vocab.token_text(vocab.sep) if vocab.add_sep and vocab.sep is not None else ""
                pairs.append(query + eos + sep + doc)
        rows = self._pooled(pairs, "rerank")
        return np.array([r[0] for r in rows], dtype=np.float32)

    def _pooled(self, texts: list[str], what: str) -> list[npt.NDArray[np.float32]]:
        """One pooled output per text (see :meth:`embed`), in order."""
        self._ptr()
        if self._enc_dec:
            raise UnsupportedError(
                f"{what} needs an encoder-only or a decoder-only model; this is an encoder-decoder {self._arch} "
                "model (llama.cpp's llama-embedding refuses it too)"
            )
        if not self._embeddings:
            raise ParamError(f"{what} needs a context with embeddings=True")
        if self.pooling_type == "none":
            raise ParamError(f"{what} needs a pooling context (pooling_type 'mean', 'cls', 'last' or 'rank')")
        limit = min(self.n_batch, self.n_ubatch) if self._memoryless else self.n_batch
        if self._memoryless and self.model.n_ctx_train > 0:
            limit = min(limit, self.model.n_ctx_train)
        limit = min(limit, self._n_ctx_seq)
        toks = [self._vocab.tokenize(t, add_special=True, parse_special=True) for t in texts]
        for i, t in enumerate(toks):
            if not 0 < len(t) <= limit:
                raise InvalidBatchError(f"text {i} is {len(t)} tokens; {what} takes 1..{limit} per text here")
        out: list[npt.NDArray[np.float32]] = []
        i = 0
        while i < len(toks):
            pack: list[npt.NDArray[np.int32]] = []
            n = 0
            while i < len(toks) and len(pack) < self._n_seq_max and n + len(toks[i]) <= limit:
                pack.append(toks[i])
                n += len(toks[i])
                i += 1
            batch = Batch(n, self._n_seq_max)
            for s, t in enumerate(pack):
                for k, tok in enumerate(t):
                    batch.add(int(tok), k, (s,), output=k == len(t) - 1)
            if not self._memoryless:
                self.memory.clear()
            self.decode_batch(batch)
            out += [self.embeddings_seq(s) for s in range(len(pack))]
        return out

    def _embd_view(self, p: Any, n: int, normalize: bool) -> np.ndarray:
        # embeddings are small (n_embd floats): a copy, valid for as long as you keep it
        v: npt.NDArray[np.float32] = np.frombuffer(ffi.buffer(p, 4 * n), dtype=np.float32).copy()
        if normalize:
            norm = float(np.linalg.norm(v))
            if norm > 0:
                v /= norm
        return v

    # ------------------------------------------------------------------ adapters
    def set_lora_adapters(self, adapters: Mapping[LoraAdapter, float] | None) -> None:
        """Apply exactly these LoRA adapters with these scales (``None``/``{}``: none)."""
        from .lora import normalise_adapters

        pairs = normalise_adapters(adapters, self.model)
        ptrs = ffi.new("struct llama_adapter_lora *[]", [a._ptr() for a, _ in pairs] or [ffi.NULL])
        scales = ffi.new("float[]", [s for _, s in pairs] or [0.0])
        with self._busy:
            rc = lib.llama_set_adapters_lora(self._ptr(), ptrs, len(pairs), scales)
            if rc != 0:
                raise AdapterError(f"llama_set_adapters_lora failed ({rc})")
            self._release_adapters()
            for a, _ in pairs:
                assert a._handle is not None
                a._handle.pin()  # closing the adapter now waits for this context to let go
                self._adapter_handles.append(a._handle)
            self._adapters = [a for a, _ in pairs]

    def _release_adapters(self) -> None:
        handles, self._adapter_handles, self._adapters = self._adapter_handles, [], []
        for h in handles:
            h.unpin()

    def set_control_vector(self, data: npt.ArrayLike | None, il_start: int = 1, il_end: int | None = None) -> None:
        """Apply a control vector: ``data`` of shape ``(k, n_embd)`` (row ``j`` is layer ``j + 1``),
        on layers ``il_start..il_end`` inclusive; ``None`` clears it."""
        if data is not None and not isinstance(data, (np.ndarray, Sequence)):
            raise type_error("data", "an array of shape (k, n_embd), or None", data)
        expect_int("il_start", il_start, "an int (a layer, from 1)")
        if il_end is not None:
            expect_int("il_end", il_end, "an int (a layer) or None")
        n_embd, n_layer = self.model.n_embd, self.model.n_layer
        with self._busy:
            ptr = self._ptr()
            if data is None:
                rc = lib.llama_set_adapter_cvec(ptr, ffi.NULL, 0, n_embd, 0, 0)
            else:
                arr = np.ascontiguousarray(data, dtype=np.float32)
                if arr.ndim != 2 or arr.shape[1] != n_embd or not 1 <= arr.shape[0] <= n_layer:
                    raise AdapterError(f"control vector must have shape (<= {n_layer}, {n_embd}), got {arr.shape}")
                end = arr.shape[0] if il_end is None else il_end
                if not 1 <= il_start <= end <= arr.shape[0]:
                    raise AdapterError(f"layer range {il_start}..{end} must lie within 1..{arr.shape[0]}")
                rc = lib.llama_set_adapter_cvec(ptr, ffi.from_buffer("float[]", arr), arr.size, n_embd, il_start, end)
            if rc != 0:
                raise AdapterError(f"llama_set_adapter_cvec failed ({rc})")

    # ------------------------------------------------------------------ state
    def state_size(self) -> int:
        """Bytes of the whole state (logits, embeddings, memory) right now."""
        with self._busy:
            return int(lib.llama_state_get_size(self._ptr()))

    def _no_pending_shift(self) -> None:
        if self._shift_pending:
            raise StateError(
                "a position shift (memory.seq_add/seq_div) is pending until the next decode; llama.cpp would "
                "save keys that are not yet re-rotated. Decode at least one token before saving the state."
            )

    def save_state(self) -> bytes:
        """The whole context state as bytes (the KV memory; outputs are not included)."""
        self._no_pending_shift()
        with self._busy:
            ptr = self._ptr()
            size = int(lib.llama_state_get_size(ptr))
            buf = bytearray(size)
            n = int(lib.llama_state_get_data(ptr, ffi.from_buffer("uint8_t[]", buf), size))
            if n == 0 and size:
                raise StateError("llama_state_get_data wrote nothing")
            return bytes(buf[:n])

    def load_state(self, data: bytes | bytearray | memoryview) -> int:
        """Restore a state from :meth:`save_state`; returns bytes read. Raises
        :class:`StateError` for truncated or foreign data (the context stays usable)."""
        mv = _bytes_view("data", data)
        if len(mv) == 0:
            raise StateError("empty state")
        # llama.cpp trusts the leading length field and allocates it before checking the size
        arch = self.model.metadata.get("general.architecture", "").encode()
        n = int.from_bytes(bytes(mv[:4]), "little") if len(mv) >= 4 else -1
        if not 0 < n <= 256 or 4 + n > len(mv):
            raise StateError("not a llama.cpp context state (bad header)")
        if bytes(mv[4 : 4 + n]) != arch:
            raise StateError(f"the state is for architecture {bytes(mv[4 : 4 + n])!r}, this model is {arch!r}")
        with self._busy, log.capture() as lines:
            ptr = self._ptr()
            self._outputs_will_change()
            self._guard.generation += 1  # views go stale before llama.cpp replaces outputs
            n = int(lib.llama_state_set_data(ptr, ffi.from_buffer("uint8_t[]", mv), len(mv)))
            self._after_state_load()
        if n == 0:
            self.memory.clear()
            raise StateError(
                "cannot load state: " + ("; ".join(line for _, line in lines[-2:]) or "rejected by llama.cpp")
            )
        return n

    def seq_state_size(self, seq_id: int = 0, flags: int = 0) -> int:
        """Bytes of one sequence's state (``flags``: ``LLAMA_STATE_SEQ_FLAGS_*``)."""
        seq_id = self._check_seq(seq_id)
        flags = expect_int("flags", flags, "an int (LLAMA_STATE_SEQ_FLAGS_*)")
        with self._busy:
            return int(lib.llama_state_seq_get_size_ext(self._ptr(), seq_id, flags))

    def save_seq_state(self, seq_id: int = 0, flags: int = 0) -> bytes:
        """One sequence's state as bytes (for :meth:`load_seq_state`)."""
        seq_id = self._check_seq(seq_id)
        flags = expect_int("flags", flags, "an int (LLAMA_STATE_SEQ_FLAGS_*)")
        self._no_pending_shift()
        with self._busy:
            ptr = self._ptr()
            size = int(lib.llama_state_seq_get_size_ext(ptr, seq_id, flags))
            buf = bytearray(size)
            n = int(lib.llama_state_seq_get_data_ext(ptr, ffi.from_buffer("uint8_t[]", buf), size, seq_id, flags))
            return bytes(buf[:n])

    def load_seq_state(self, data: bytes | bytearray | memoryview, dest_seq_id: int = 0, flags: int = 0) -> int:
        """Restore a sequence state into ``dest_seq_id`` (which is emptied first)."""
        mv = _bytes_view("data", data)
        dest_seq_id = self._check_seq(dest_seq_id, "dest_seq_id")
        flags = expect_int("flags", flags, "an int (LLAMA_STATE_SEQ_FLAGS_*)")
        if len(mv) < 4 or int.from_bytes(bytes(mv[:4]), "little") != _SEQ_STATE_MAGIC:
            raise StateError("not a llama.cpp sequence state (bad magic)")
        self.memory.seq_rm(dest_seq_id)
        with self._busy, log.capture() as lines:
            ptr = self._ptr()
            self._outputs_will_change()
            self._guard.generation += 1  # views go stale before llama.cpp replaces outputs
            n = int(
                lib.llama_state_seq_set_data_ext(ptr, ffi.from_buffer("uint8_t[]", mv), len(mv), dest_seq_id, flags)
            )
            self._after_state_load()
        if n == 0:
            self.memory.seq_rm(dest_seq_id)
            raise StateError(
                "cannot load sequence state: " + ("; ".join(line for _, line in lines[-2:]) or "rejected by llama.cpp")
            )
        return n

    def save_state_file(self, path: str | os.PathLike[str], tokens: Iterable[int] = ()) -> None:
        """Save the whole state and the token list to a session file."""
        path = expect_path("path", path)
        self._no_pending_shift()
        arr = self._vocab.check_tokens(list(expect_iterable("tokens", tokens, "an iterable of token ids")))
        with self._busy:
            ok = lib.llama_state_save_file(
                self._ptr(), os.fsencode(path), ffi.from_buffer("llama_token[]", arr), len(arr)
            )
        if not ok:
            raise StateError(f"cannot save state to {os.fspath(path)!r}")

    def load_state_file(self, path: str | os.PathLike[str], max_tokens: int | None = None) -> np.ndarray:
        """Load a session file (:meth:`save_state_file`); returns its token list (at most
        ``max_tokens``, default ``n_ctx``). :class:`StateError` if it is missing, foreign,
        truncated or for another model; the context stays usable.

        The file is read here and its state restored from memory (:meth:`load_state`):
        llama.cpp's own file reader treats a read at the end of the file as done, and on
        a truncated file it looped on stale counts (seen with a CUDA context) where its
        memory reader raises."""
        p = expect_path("path", path)
        cap = self._n_ctx if max_tokens is None else max_tokens
        tokens, rest = _read_session_file(p, lib.LLAMA_SESSION_MAGIC, lib.LLAMA_SESSION_VERSION, cap, "state file")
        try:
            n = self.load_state(rest)
        except StateError as e:
            raise StateError(f"cannot load state file {p!r}: {e}") from None
        if n != len(rest):
            self.memory.clear()
            raise StateError(f"cannot load state file {p!r}: its state has {len(rest)} bytes, {n} were read")
        return tokens

    def save_seq_state_file(self, path: str | os.PathLike[str], seq_id: int = 0, tokens: Iterable[int] = ()) -> int:
        """Save one sequence's state and tokens to a file; returns bytes written."""
        path = expect_path("path", path)
        seq_id = self._check_seq(seq_id)
        self._no_pending_shift()
        arr = self._vocab.check_tokens(list(expect_iterable("tokens", tokens, "an iterable of token ids")))
        with self._busy:
            n = int(
                lib.llama_state_seq_save_file(
                    self._ptr(), os.fsencode(path), seq_id, ffi.from_buffer("llama_token[]", arr), len(arr)
                )
            )
        if n == 0:
            raise StateError(f"cannot save sequence {seq_id} to {os.fspath(path)!r}")
        return n

    def load_seq_state_file(
        self, path: str | os.PathLike[str], dest_seq_id: int = 0, max_tokens: int | None = None
    ) -> np.ndarray:
        """Load a sequence file (:meth:`save_seq_state_file`) into ``dest_seq_id``; returns
        its token list. Read here and restored from memory (:meth:`load_seq_state`), for
        the reason :meth:`load_state_file` gives (llama.cpp's file path also asserts, and
        aborts, on what a truncated file leads it to read)."""
        p = expect_path("path", path)
        dest_seq_id = self._check_seq(dest_seq_id, "dest_seq_id")
        cap = self._n_ctx if max_tokens is None else max_tokens
        # the file holds the sequence's data alone; in memory it follows a magic and a seq id
        tokens, buf = _read_session_file(
            p, lib.LLAMA_STATE_SEQ_MAGIC, lib.LLAMA_STATE_SEQ_VERSION, cap, "sequence file", reserve=8
        )
        buf[:4] = _SEQ_STATE_MAGIC.to_bytes(4, "little")
        buf[4:8] = dest_seq_id.to_bytes(4, "little", signed=True)
        try:
            self.load_seq_state(buf, dest_seq_id)
        except StateError as e:
            raise StateError(f"cannot load sequence file {p!r}: {e}") from None
        return tokens

    def _after_state_load(self) -> None:
        # outputs may have been replaced: invalidate views; outputs count is unknown now
        self._guard.generation += 1
        self._last_view = None
        self._shift_pending = False
        self._n_outputs = 0
        self._last_batch_size = 0

    # ------------------------------------------------------------------ perf
    def perf(self) -> dict[str, float | int]:
        """llama.cpp's timings of this context (``llama_perf_context``): ``t_load_ms``,
        ``t_p_eval_ms`` (prompt decodes: batches of more than one token) and ``t_eval_ms``
        (one-token decodes) in milliseconds, with the token counts ``n_p_eval`` and
        ``n_eval``, since the context was made or :meth:`perf_reset`. A context records
        them unless it was made with ``no_perf=True`` (llama.cpp's own default); then this
        raises :class:`~llama_cffi.errors.UnsupportedError` rather than return zero
        times."""
        if bool(self.params.c.no_perf):
            self._ptr()
            raise UnsupportedError(
                "this context was made with no_perf=True: llama.cpp records no timings (they would read 0 ms); "
                "make the context with no_perf=False (llama_cffi's default) to read them"
            )
        d = lib.llama_perf_context(self._ptr())
        return {
            "t_start_ms": d.t_start_ms,
            "t_load_ms": d.t_load_ms,
            "t_p_eval_ms": d.t_p_eval_ms,
            "t_eval_ms": d.t_eval_ms,
            "n_p_eval": d.n_p_eval,
            "n_eval": d.n_eval,
            "n_reused": d.n_reused,
        }

    def perf_reset(self) -> None:
        lib.llama_perf_context_reset(self._ptr())

    def memory_usage(self) -> MemoryUsage:
        """What llama.cpp allocated for this context and its model, in bytes, per buffer
        type and device: weights, KV cache / recurrent state (K and V apart, per memory
        module and layer) and compute buffers. Read from llama.cpp's own objects, never
        estimated; see :mod:`llama_cffi.memory_usage`. ``state_size()`` is the size of a
        saved state instead (only the cells in use).

        Raises :class:`~llama_cffi.errors.UnsupportedError` in a build whose llama.cpp
        source (``LLAMA_CPP_DIR`` at another commit) the reader does not compile against
        (``build_info()["memory_reader"]`` is False; the build said why)."""
        with self._busy:
            return read_memory_usage(self._ptr())

    # ------------------------------------------------------------------ generation helpers
    def stream(
        self,
        prompt: str | Iterable[int],
        max_tokens: int = 128,
        sampler: Sampler | Any | None = None,
        stop: Iterable[str] = (),
        seq_id: int = 0,
        *,
        context_shift: bool = False,
        n_keep: int = 0,
    ) -> Iterator[str]:
        """Decode ``prompt`` then sample up to ``max_tokens``, yielding text pieces (never
        half a UTF-8 character). ``sampler``: any object with ``sample(ctx, idx)`` (a
        ``samplers`` chain or sampler, :class:`~llama_cffi.sampling.LlamaSampler`), a
        ``samplers.SamplingParams`` (its chain for this model), or None (greedy). Stops at
        an end-of-generation token or a ``stop`` string (the stop string itself is not
        yielded). When the sequence fills the context
        (``n_ctx_seq``) the next decode raises :class:`~llama_cffi.KvCacheFullError`,
        unless ``context_shift=True``: llama.cpp's context shift then keeps the first
        ``n_keep`` positions, drops the oldest half of the rest and shifts the others down
        (no recomputation), where the memory can shift (else
        :class:`~llama_cffi.errors.UnsupportedError` before anything is decoded: a
        recurrent state, a sliding-window cache without ``swa_full=True``).

        On an encoder-decoder model (T5) the prompt is the encoder's input: the context's
        memory is cleared, the prompt encoded, and decoding starts from the model's decoder
        start token in ``seq_id``."""
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise ParamError(f"max_tokens must be an int >= 0, not {max_tokens!r}")
        if not isinstance(context_shift, bool):
            raise type_error("context_shift", "True or False", context_shift)
        if isinstance(n_keep, bool) or not isinstance(n_keep, int):
            raise type_error("n_keep", "an int (positions kept at the start on a context shift)", n_keep)
        if context_shift:
            self._check_shift(n_keep)
        smp = _as_sampler(sampler, self.model)
        toks = self._vocab.tokenize(prompt) if isinstance(prompt, str) else self._vocab.check_tokens(prompt, "prompt")
        text = StopStringStream(self._vocab, stop)
        if self._enc_dec:
            self.start_decoder(toks, seq_id)
        elif len(toks):
            self.decode(toks, seq_id=seq_id)
        for _ in range(max_tokens):
            tok = int(smp.sample(self, -1))
            if self._vocab.is_eog(tok):
                break
            piece = text.push(tok)
            if piece:
                yield piece
            if text.stopped:
                return
            if context_shift:
                pos = self.memory.seq_pos_max(seq_id) + 1
                if pos >= self.n_ctx_seq:
                    n_discard = (pos - n_keep) // 2
                    self.memory.seq_rm(seq_id, n_keep, n_keep + n_discard)
                    self.memory.seq_add(seq_id, n_keep + n_discard, -1, -n_discard)
            self.decode_single(tok, seq_id=seq_id)
        rest = text.flush()
        if rest:
            yield rest

    def generate(
        self,
        prompt: str | Iterable[int],
        max_tokens: int = 128,
        sampler: Sampler | Any | None = None,
        stop: Iterable[str] = (),
        seq_id: int = 0,
        *,
        context_shift: bool = False,
        n_keep: int = 0,
    ) -> str:
        """The text :meth:`stream` would yield, joined."""
        return "".join(
            self.stream(prompt, max_tokens, sampler, stop, seq_id, context_shift=context_shift, n_keep=n_keep)
        )

    def _check_shift(self, n_keep: object) -> None:
        """A context shift keeping ``n_keep`` positions can run on this context."""
        if isinstance(n_keep, bool) or not isinstance(n_keep, int):
            raise type_error("n_keep", "an int (positions kept at the start on a context shift)", n_keep)
        if not 0 <= n_keep <= self.n_ctx_seq - 2:
            raise ParamError(f"n_keep={n_keep} must be in [0, {self.n_ctx_seq - 2}]: a shift drops half of the rest")
        if self._recurrent or self.model.is_hybrid:
            raise UnsupportedError("context_shift: a recurrent state cannot drop tokens (they stay mixed into it)")
        if not self.memory.can_shift:
            why = " (a sliding-window cache shifts only with swa_full=True)" if self.model.n_swa > 0 else ""
            raise UnsupportedError(f"context_shift: this context's memory cannot shift positions{why}")

    # ------------------------------------------------------------------ async
    async def arun(self, fn: Callable[[], _T], cleanup: Callable[[_T], object] | None = None) -> _T:
        """Run ``fn`` (a call that decodes on this context) in a worker thread of the event
        loop's default executor and return its result. Cancelling the awaiting task aborts
        the decode in flight (:meth:`request_abort`; ``fn`` then raises
        :class:`~llama_cffi.DecodeAbortedError`, which is swallowed) and raises
        :class:`asyncio.CancelledError` once ``fn`` has returned, so the context is never
        left in use by a thread nobody waits for. A cancellation that lands between two
        decodes of ``fn`` cannot abort one (llama.cpp clears the flag when a decode starts):
        ``fn`` then finishes, ``cleanup(result)`` is called (to release what it made) and
        the cancellation is raised."""
        expect_callable("fn", fn)
        if cleanup is not None:
            expect_callable("cleanup", cleanup, "callable (it takes fn's result) or None")
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(None, fn)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            self.request_abort()
            try:
                result = await fut
            except DecodeAbortedError:
                pass
            else:
                if cleanup is not None:
                    cleanup(result)
            raise

    async def adecode(self, tokens: Any, **kwargs: Any) -> Any:
        """:meth:`decode` in a worker thread; cancelling the awaiting task aborts the decode
        (see :meth:`arun`)."""
        return await self.arun(lambda: self.decode(tokens, **kwargs))

    async def astream(
        self,
        prompt: str | Iterable[int],
        max_tokens: int = 128,
        sampler: Sampler | Any | None = None,
        stop: Iterable[str] = (),
        seq_id: int = 0,
    ) -> AsyncIterator[str]:
        """:meth:`stream` as an async iterator: each step runs in a worker thread (the
        event loop stays free); cancelling the consuming task aborts the decode in flight
        and ends the stream, with the context's memory holding the tokens decoded before
        (see :meth:`arun`)."""
        gen = self.stream(prompt, max_tokens, sampler, stop, seq_id)
        done = object()
        try:
            while True:
                piece = await self.arun(lambda: next(gen, done))
                if piece is done:
                    return
                yield cast(str, piece)
        finally:
            close = getattr(gen, "close", None)
            if close is not None:
                close()

    async def agenerate(
        self,
        prompt: str | Iterable[int],
        max_tokens: int = 128,
        sampler: Sampler | Any | None = None,
        stop: Iterable[str] = (),
        seq_id: int = 0,
    ) -> str:
        """The text :meth:`astream` would yield, joined."""
        return "".join([p async for p in self.astream(prompt, max_tokens, sampler, stop, seq_id)])


_ZERO_INDEX = np.zeros(1, dtype=np.int32)
_SEQ_STATE_MAGIC = 0xAF143CD8  # llama-context.cpp io_magic: first 4 bytes of a sequence state


class SampledOutput(NamedTuple):
    """What a backend sampler left for one output (:meth:`Context.sampled`), copied."""

    token: int | None
    probs: npt.NDArray[np.float32]
    logits: npt.NDArray[np.float32]
    candidates: npt.NDArray[np.int32]


def _read_session_file(
    path: str, magic: int, version: int, cap: int, what: str, reserve: int = 0
) -> tuple[np.ndarray, bytearray]:
    """``(tokens, state)`` of a llama.cpp session or sequence file: the header (magic,
    version, token count; little-endian u32) checked as llama.cpp checks it. The state
    is read once into a buffer that starts with ``reserve`` zero bytes (room for a
    header the caller writes in place, so the state is never copied)."""
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
        raise ParamError(f"max_tokens must be an int >= 0, not {cap!r}")
    if not os.path.isfile(path):
        raise StateError(f"no {what} {path!r}")
    with open(path, "rb") as fh:
        head = fh.read(12)
        if len(head) < 12:
            raise StateError(f"cannot load {what} {path!r}: truncated header ({len(head)} bytes)")
        m, v, n = (
            int.from_bytes(head[0:4], "little"),
            int.from_bytes(head[4:8], "little"),
            int.from_bytes(head[8:12], "little"),
        )
        if (m, v) != (magic, version):
            raise StateError(f"cannot load {what} {path!r}: unknown (magic, version) {m:08x}, {v:08x}")
        if n > cap:
            raise StateError(f"cannot load {what} {path!r}: {n} tokens, more than the capacity {cap}")
        raw = fh.read(4 * n)
        if len(raw) != 4 * n:
            raise StateError(f"cannot load {what} {path!r}: truncated token list")
        size = os.fstat(fh.fileno()).st_size - fh.tell()
        buf = bytearray(reserve + max(size, 0))
        got = fh.readinto(memoryview(buf)[reserve:])
        del buf[reserve + got :]  # a file that shrank meanwhile: what was read
    return np.frombuffer(raw, dtype="<i4").astype(np.int32), buf


def _chunk_ends(mask: np.ndarray, n_batch: int, out_limit: int) -> list[int]:
    """End offsets of chunks with at most ``n_batch`` tokens and ``out_limit`` outputs each."""
    n = len(mask)
    if out_limit >= n_batch:
        return [*range(n_batch, n, n_batch), n]
    ends: list[int] = []
    start, outs = 0, 0
    for i in range(n):
        if i - start == n_batch or (mask[i] and outs == out_limit):
            ends.append(i)
            start, outs = i, 0
        outs += int(mask[i])
    ends.append(n)
    return ends
