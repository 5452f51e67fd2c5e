"""llama.cpp's own samplers (``llama_sampler_*``), wrapped so that no input can crash.

:class:`LlamaSampler` owns one ``struct llama_sampler *`` made by a ``llama_sampler_init_*``
function (one classmethod per function: :meth:`LlamaSampler.top_k`, ...); a chain is a
sampler too (:meth:`LlamaSampler.chain`). :class:`TokenDataArray` is an owned
``llama_token_data_array`` with numpy views of its ids, logits and probabilities.

What is checked in Python because llama.cpp would abort or misbehave:

* parameters: every float must be finite (a NaN temperature makes later sorts undefined
  behaviour), counts must fit their C types, token ids must be in the vocabulary;
* inputs: applying a sampler to zero candidates (``GGML_ASSERT`` in llama.cpp's softmax)
  or to NaN logits (undefined behaviour in ``std::sort``) raises instead;
* outputs: :meth:`LlamaSampler.sample` never calls ``llama_sampler_sample`` (which aborts
  when no sampler of the chain selects a token); it fills its own candidate array from
  the guarded logits view and raises :class:`SamplingError` when nothing was selected.

Ownership: :meth:`LlamaSampler.add` moves a sampler into a chain (llama.cpp's rule); the
Python object then refers to the chain's member and keeps the chain alive. Samplers made
with a vocabulary (DRY, infill) keep their model alive.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from ._args import expect, expect_array, expect_bool, expect_int, expect_iterable, expect_str, type_error
from ._binding import ffi, lib
from ._handle import NativeHandle
from .errors import InvalidTokenError, LlamaError, ParamError, ParamTypeError
from .gbnf import has_token_refs, native_grammar_hazard

if TYPE_CHECKING:
    from .context import Context
    from .model import Model
    from .vocab import Vocab

#: numpy layout of ``llama_token_data`` (``{int32 id; float logit; float p;}``).
TOKEN_DATA_DTYPE = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])

#: ``LLAMA_DEFAULT_SEED``: a sampler given this seed draws a random one.
DEFAULT_SEED = int(lib.LLAMA_DEFAULT_SEED)

_UINT32_MAX = 2**32 - 1
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


class SamplingError(LlamaError, RuntimeError):
    """Sampling could not produce a token (no sampler of the chain selected one, ...)."""


class InvalidLogitsError(LlamaError, ValueError):
    """Candidates that no sampler can work on: none at all, or NaN logits."""


# --------------------------------------------------------------------- parameter checks
def check_float(name: str, value: float) -> float:
    """``value`` as a finite float, or :class:`ParamError` naming ``name`` (a
    :class:`~llama_cffi.errors.ParamTypeError` when it is no number)."""
    expect_str("name", name, "a str (the parameter's name)")
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ParamTypeError(f"{name} must be a number, not {type(value).__name__} ({value!r})")
    v = float(value)
    if not math.isfinite(v):
        raise ParamError(f"{name} must be finite, not {v!r}")
    return v


def check_int(name: str, value: int, lo: int = _INT32_MIN, hi: int = _INT32_MAX) -> int:
    """``value`` as an int in ``[lo, hi]``, or :class:`ParamError` naming ``name`` (a
    :class:`~llama_cffi.errors.ParamTypeError` when it is no int)."""
    expect_str("name", name, "a str (the parameter's name)")
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ParamTypeError(f"{name} must be an int, not {type(value).__name__} ({value!r})")
    lo, hi = expect_int("lo", lo), expect_int("hi", hi)
    v = int(value)
    if not lo <= v <= hi:
        raise ParamError(f"{name} must be in [{lo}, {hi}], not {v}")
    return v


def check_seed(seed: int | None) -> int:
    """A ``uint32`` seed; ``None`` means :data:`DEFAULT_SEED` (a random seed)."""
    return DEFAULT_SEED if seed is None else check_int("seed", seed, 0, _UINT32_MAX)


# ----------------------------------------------------------------------- candidate array
class TokenDataArray:
    """An owned ``llama_token_data_array`` of up to ``capacity`` candidates.

    ``ids``/``logits``/``p`` are numpy views of the current candidates (they follow the
    ``data`` pointer, which some samplers advance, and ``size``); they stay valid while
    this object lives. ``c`` is the ``llama_token_data_array *`` to pass to C.
    """

    __slots__ = ("_base", "_records", "c", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = check_int("capacity", capacity, 1)
        self._base = ffi.new("llama_token_data[]", self.capacity)
        self._records = np.frombuffer(ffi.buffer(self._base), dtype=TOKEN_DATA_DTYPE)
        self.c = ffi.new("llama_token_data_array *")
        self.c.data = self._base
        self.c.size = 0
        self.c.selected = -1
        self.c.sorted = False

    # -------------------------------------------------------------- filling
    def fill(
        self,
        ids: npt.ArrayLike,
        logits: npt.ArrayLike,
        p: npt.ArrayLike | None = None,
        sorted: bool = False,
    ) -> TokenDataArray:
        """Copy candidates in (``p`` defaults to 0, as ``llama_sampler_sample`` does)."""
        ids_a = expect_array("ids", ids, "an array of token ids", "iu")
        logits_a = expect_array("logits", logits, "an array of logits", "iuf")
        p_a = None if p is None else expect_array("p", p, "an array of probabilities, or None", "iuf")
        sorted = expect_bool("sorted", sorted)
        n = len(logits_a)
        if ids_a.shape != (n,) or logits_a.ndim != 1:
            raise ParamError(f"ids and logits must be 1-D arrays of one length, not {ids_a.shape} and {logits_a.shape}")
        if n > self.capacity:
            raise ParamError(f"{n} candidates exceed this array's capacity of {self.capacity}")
        rec = self._records[:n]
        rec["id"] = ids_a
        rec["logit"] = logits_a
        rec["p"] = 0.0 if p_a is None else p_a
        self._reset(n, sorted)
        return self

    def fill_logits(self, row: npt.ArrayLike) -> TokenDataArray:
        """Every token of a logits row as a candidate (ids ``0..n-1``), p = 0."""
        r = expect_array("row", row, "a row of logits", "iuf")
        n = len(r)
        if r.ndim != 1 or n > self.capacity:
            raise ParamError(f"a logits row of at most {self.capacity} values is needed, not shape {r.shape}")
        rec = self._records[:n]
        rec["id"] = np.arange(n, dtype=np.int32)
        rec["logit"] = r
        rec["p"] = 0.0
        self._reset(n, False)
        return self

    def _reset(self, n: int, sorted: bool) -> None:
        c = self.c
        c.data = self._base
        c.size = n
        c.selected = -1
        c.sorted = bool(sorted)

    # -------------------------------------------------------------- reading
    @property
    def offset(self) -> int:
        """Index of ``data`` in the owned buffer (XTC advances the pointer)."""
        return int((int(ffi.cast("uintptr_t", self.c.data)) - int(ffi.cast("uintptr_t", self._base))) // 12)

    def _view(self) -> np.ndarray:
        off = self.offset
        return self._records[off : off + int(self.c.size)]

    @property
    def size(self) -> int:
        return int(self.c.size)

    @property
    def selected(self) -> int:
        """Index of the selected candidate, -1 when none."""
        return int(self.c.selected)

    @property
    def sorted(self) -> bool:
        """Whether llama.cpp considers the candidates sorted by descending logit."""
        return bool(self.c.sorted)

    @property
    def ids(self) -> npt.NDArray[np.int32]:
        return self._view()["id"]

    @property
    def logits(self) -> npt.NDArray[np.float32]:
        return self._view()["logit"]

    @property
    def p(self) -> npt.NDArray[np.float32]:
        return self._view()["p"]

    def _check_after(self, size_before: int) -> None:
        off, size = self.offset, self.size
        if not (0 <= off and off + size <= self.capacity and size <= size_before):
            raise SamplingError(f"llama.cpp left an invalid candidate array (offset {off}, size {size})")
        if not -1 <= self.selected < max(size, 1):
            raise SamplingError(f"llama.cpp selected candidate {self.selected} of {size}")

    def check_input(self) -> None:
        """Refuse what llama.cpp cannot handle: no candidates, NaN logits."""
        size = self.size
        if size == 0:
            raise InvalidLogitsError("cannot sample from zero candidates")
        if math.isnan(float(self.logits.max())):
            raise InvalidLogitsError("the logits contain NaN")


# ------------------------------------------------------------------------------ samplers
def _free_sampler(ptr: Any) -> None:
    lib.llama_sampler_free(ptr)


def _no_free(_ptr: Any) -> None:
    pass


class LlamaSampler:
    """One llama.cpp sampler (see the module docstring). Make it with a classmethod."""

    _handle: NativeHandle | None = None

    def __init__(self, ptr: Any, what: str, parent: NativeHandle | None = None, owned: bool = True) -> None:
        if not isinstance(ptr, ffi.CData):
            raise type_error("ptr", "a llama_sampler * (use the LlamaSampler class methods)", ptr)
        expect_str("what", what, "a str (what the sampler is, for messages)")
        if parent is not None:
            expect("parent", parent, NativeHandle, "the NativeHandle of the sampler's owner, or None")
        owned = expect_bool("owned", owned)
        if ptr == ffi.NULL:
            raise SamplingError(f"llama.cpp could not create the {what} sampler")
        self._handle = NativeHandle(self, ptr, _free_sampler if owned else _no_free, what, parent=parent)
        self._tda: TokenDataArray | None = None
        self._keep: list[Any] = []  # Python objects C may still point to
        #: set for samplers that look tokens up in a vocabulary (llama.cpp would throw
        #: ``std::out_of_range`` through C, i.e. abort, on an id outside it)
        self._n_vocab: int | None = None
        #: set for grammar samplers: accept() first checks the token is allowed
        self._guard_accept = False
        self._probe: TokenDataArray | None = None  # one-candidate array for that check
        #: grammar samplers whose grammar has token references: what decides whether
        #: llama.cpp's accept would throw (see :meth:`grammar`); "refuse" when none given
        self._grammar_guard: GrammarGuard | str | None = None

    def _ptr(self) -> Any:
        assert self._handle is not None
        return self._handle.get()

    @property
    def underlying(self) -> Any:
        """The raw ``struct llama_sampler *`` (owned by this object or its chain)."""
        return self._ptr()

    def close(self) -> None:
        """Free the sampler (idempotent). A sampler inside a chain is freed with the chain."""
        if self._handle is not None:
            self._handle.close()

    free = close

    def __enter__(self) -> LlamaSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._handle is None or self._handle.closed:
            return "<LlamaSampler (closed)>"
        return f"<LlamaSampler {self.name!r}>"

    # -------------------------------------------------------------- the llama_sampler API
    @property
    def name(self) -> str:
        """llama.cpp's name for it (``"top-k"``; ``"?top-k"`` when its parameters make it a no-op)."""
        return str(ffi.string(lib.llama_sampler_name(self._ptr())).decode())

    def accept(self, token: int) -> None:
        """Tell the sampler ``token`` was chosen (penalties, DRY, mirostat, ... keep state).

        A grammar sampler refuses (:class:`SamplingError`) a token its grammar does not
        allow, where llama.cpp would abort."""
        ptr = self._ptr()
        token = check_int("token", token, 0)
        if self._n_vocab is not None and token >= self._n_vocab:
            raise InvalidTokenError(f"token {token} is out of range [0, {self._n_vocab})")
        if self._guard_accept:
            probe = self._probe
            if probe is None:
                probe = self._probe = TokenDataArray(1)
            probe.fill([token], [0.0])
            lib.llama_sampler_apply(ptr, probe.c)
            if probe.logits[0] == -math.inf:
                raise SamplingError(f"the grammar does not allow token {token} here")
            guard = self._grammar_guard
            if guard == "refuse":
                raise SamplingError(
                    "this grammar has token references, with which llama.cpp's accept can throw "
                    "through C (abort) on tokens its apply allows: pass guard= to LlamaSampler.grammar"
                )
            if guard is not None and not isinstance(guard, str) and not guard.accept(token):
                raise SamplingError(f"the grammar cannot accept token {token} here (llama.cpp would throw)")
        lib.llama_sampler_accept(ptr, token)

    def apply(self, cands: TokenDataArray) -> None:
        """``llama_sampler_apply`` on ``cands`` (refusing empty or NaN candidates, and ids
        outside the vocabulary for samplers that look tokens up)."""
        expect("cands", cands, TokenDataArray, "a TokenDataArray")
        ptr = self._ptr()
        cands.check_input()
        if self._n_vocab is not None:
            ids = cands.ids
            if int(ids.min()) < 0 or int(ids.max()) >= self._n_vocab:
                raise InvalidTokenError(f"candidate ids must lie in [0, {self._n_vocab})")
        size = cands.size
        lib.llama_sampler_apply(ptr, cands.c)
        cands._check_after(size)

    def reset(self) -> None:
        """Forget accepted tokens and reseed (back to the state after creation)."""
        lib.llama_sampler_reset(self._ptr())
        if self._grammar_guard is not None and not isinstance(self._grammar_guard, str):
            self._grammar_guard.reset()

    def clone(self) -> LlamaSampler:
        """An independent copy with the same state (RNG included)."""
        ptr = lib.llama_sampler_clone(self._ptr())
        parent = self._handle._parent if self._handle else None
        out = LlamaSampler(ptr, self._handle.what if self._handle else "sampler", parent=parent)
        out._is_chain = self._is_chain
        out._keep = list(self._keep)
        out._n_vocab = self._n_vocab
        out._guard_accept = self._guard_accept
        g = self._grammar_guard
        out._grammar_guard = g.clone() if g is not None and not isinstance(g, str) else g
        return out

    @property
    def seed(self) -> int:
        """The seed in use (the drawn one when created with :data:`DEFAULT_SEED`)."""
        return int(lib.llama_sampler_get_seed(self._ptr()))

    def sample(self, ctx: Context, idx: int = -1) -> int:
        """Apply to output ``idx`` of ``ctx``'s last decode, take the selected token, accept it.

        Like ``llama_sampler_sample`` but with a :class:`SamplingError` where llama.cpp
        would abort (no sampler selected a token)."""
        from .context import Context

        expect("ctx", ctx, Context, "a llama_cffi.Context")
        row = np.asarray(ctx.logits(expect_int("idx", idx)))
        tda = self._tda
        if tda is None or tda.capacity < len(row):
            tda = self._tda = TokenDataArray(len(row))
        tda.fill_logits(row)
        self.apply(tda)
        sel = tda.selected
        if sel < 0:
            raise SamplingError("no sampler selected a token: end the chain with greedy, dist or mirostat")
        token = int(tda.ids[sel])
        self.accept(token)
        return token

    # -------------------------------------------------------------- chains
    @classmethod
    def chain(cls, samplers: Iterable[LlamaSampler] = (), no_perf: bool = True) -> LlamaSampler:
        """An empty chain (``llama_sampler_chain_init``), then :meth:`add` each of ``samplers``."""
        members = list(expect_iterable("samplers", samplers, "an iterable of LlamaSampler"))
        params = lib.llama_sampler_chain_default_params()
        params.no_perf = expect_bool("no_perf", no_perf)
        ch = cls(lib.llama_sampler_chain_init(params), "chain")
        ch._is_chain = True
        for s in members:
            ch.add(s)
        return ch

    _is_chain = False
    #: attached to a context as its backend sampler once (llama.cpp prepares a chain for
    #: one graph: it must not be attached again)
    _backend_used = False

    def on_backend(self) -> bool:
        """After :meth:`Context.set_backend_sampler`: whether llama.cpp runs every sampler
        of this chain in its graph (on the device), not some of them on the host."""
        if not self._is_chain:
            return bool(lib.llama_cffi_sampler_on_backend(self._ptr()) == 1)
        return all(self[i].on_backend() for i in range(len(self)))

    @classmethod
    def measure(cls) -> LlamaSampler:
        """llama_cffi's measuring sampler, for the first place of a backend sampling chain
        (:meth:`Context.set_backend_sampler`): in llama.cpp's graph it sets the output's
        probabilities to ``[max, log(sum(exp(x - max))), entropy]`` of the row (nats) and
        leaves the logits to the samplers after it; on the host it does nothing. A sampler
        after it must not set probabilities (``top_k`` and ``temp`` do not; ``dist`` and
        ``top_p`` do)."""
        return cls(lib.llama_cffi_measure_sampler(), "measure")

    def _check_chain(self) -> Any:
        if not self._is_chain:
            raise ParamError(f"{self.name!r} is not a chain")
        return self._ptr()

    def add(self, smpl: LlamaSampler) -> None:
        """Move ``smpl`` into this chain (llama.cpp takes ownership); ``smpl`` then refers to
        the chain's member and keeps the chain alive."""
        expect("smpl", smpl, LlamaSampler, "a LlamaSampler")
        ptr = self._check_chain()
        if smpl is self:
            raise ParamError("a chain cannot contain itself")
        sp = smpl._ptr()
        h = smpl._handle
        assert h is not None and self._handle is not None
        if h._free is not _free_sampler or h._children:
            raise ParamError("this sampler already belongs to a chain (or is in use); add a clone()")
        lib.llama_sampler_chain_add(ptr, sp)
        h._free = _no_free
        h.close()
        smpl._handle = NativeHandle(smpl, sp, _no_free, h.what, parent=self._handle)
        self._keep.extend(smpl._keep)

    def __len__(self) -> int:
        return int(lib.llama_sampler_chain_n(self._check_chain()))

    def __getitem__(self, i: int) -> LlamaSampler:
        """The chain's ``i``-th sampler, borrowed (it keeps the chain alive)."""
        ptr = self._check_chain()
        n = len(self)
        j = check_int("i", i)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError(f"sampler {i} is out of range: the chain has {n}")
        return LlamaSampler(lib.llama_sampler_chain_get(ptr, j), "chain member", parent=self._handle, owned=False)

    def perf(self) -> dict[str, float]:
        """``llama_perf_sampler``: total sampling time (ms) and number of samples of a chain."""
        d = lib.llama_perf_sampler(self._check_chain())
        return {"t_sample_ms": float(d.t_sample_ms), "n_sample": int(d.n_sample)}

    def perf_reset(self) -> None:
        lib.llama_perf_sampler_reset(self._check_chain())

    # -------------------------------------------------------------- llama_sampler_init_*
    @classmethod
    def greedy(cls) -> LlamaSampler:
        return cls(lib.llama_sampler_init_greedy(), "greedy")

    @classmethod
    def dist(cls, seed: int | None = None) -> LlamaSampler:
        return cls(lib.llama_sampler_init_dist(check_seed(seed)), "dist")

    @classmethod
    def top_k(cls, k: int) -> LlamaSampler:
        return cls(lib.llama_sampler_init_top_k(check_int("k", k)), "top-k")

    @classmethod
    def top_p(cls, p: float, min_keep: int = 1) -> LlamaSampler:
        return cls(lib.llama_sampler_init_top_p(check_float("p", p), check_int("min_keep", min_keep, 0)), "top-p")

    @classmethod
    def min_p(cls, p: float, min_keep: int = 1) -> LlamaSampler:
        return cls(lib.llama_sampler_init_min_p(check_float("p", p), check_int("min_keep", min_keep, 0)), "min-p")

    @classmethod
    def typical(cls, p: float, min_keep: int = 1) -> LlamaSampler:
        return cls(lib.llama_sampler_init_typical(check_float("p", p), check_int("min_keep", min_keep, 0)), "typical")

    @classmethod
    def temp(cls, t: float) -> LlamaSampler:
        return cls(lib.llama_sampler_init_temp(check_float("t", t)), "temp")

    @classmethod
    def temp_ext(cls, t: float, delta: float, exponent: float) -> LlamaSampler:
        ptr = lib.llama_sampler_init_temp_ext(
            check_float("t", t), check_float("delta", delta), check_float("exponent", exponent)
        )
        return cls(ptr, "temp-ext")

    @classmethod
    def xtc(cls, p: float, t: float, min_keep: int = 1, seed: int | None = None) -> LlamaSampler:
        ptr = lib.llama_sampler_init_xtc(
            check_float("p", p), check_float("t", t), check_int("min_keep", min_keep, 0), check_seed(seed)
        )
        return cls(ptr, "xtc")

    @classmethod
    def top_n_sigma(cls, n: float) -> LlamaSampler:
        return cls(lib.llama_sampler_init_top_n_sigma(check_float("n", n)), "top-n-sigma")

    @classmethod
    def mirostat(
        cls, n_vocab: int, seed: int | None = None, tau: float = 5.0, eta: float = 0.1, m: int = 100
    ) -> LlamaSampler:
        ptr = lib.llama_sampler_init_mirostat(
            check_int("n_vocab", n_vocab, 1),
            check_seed(seed),
            check_float("tau", tau),
            check_float("eta", eta),
            check_int("m", m, 1),
        )
        return cls(ptr, "mirostat")

    @classmethod
    def mirostat_v2(cls, seed: int | None = None, tau: float = 5.0, eta: float = 0.1) -> LlamaSampler:
        ptr = lib.llama_sampler_init_mirostat_v2(check_seed(seed), check_float("tau", tau), check_float("eta", eta))
        return cls(ptr, "mirostat-v2")

    @classmethod
    def penalties(
        cls, n_vocab: int, last_n: int = 64, repeat: float = 1.0, freq: float = 0.0, present: float = 0.0
    ) -> LlamaSampler:
        ptr = lib.llama_sampler_init_penalties(
            check_int("n_vocab", n_vocab, 1),
            check_int("last_n", last_n, 0),
            check_float("repeat", repeat),
            check_float("freq", freq),
            check_float("present", present),
        )
        return cls(ptr, "penalties")

    @classmethod
    def dry(
        cls,
        vocab: Vocab | Model,
        multiplier: float,
        base: float = 1.75,
        allowed_length: int = 2,
        last_n: int = -1,
        seq_breakers: Sequence[str | bytes] = ("\n", ":", '"', "*"),
    ) -> LlamaSampler:
        v = _vocab_of(vocab)
        what = "a sequence of str or bytes"
        enc = [
            b if isinstance(b, bytes) else expect_str("seq_breakers", b, what).encode()
            for b in expect_iterable("seq_breakers", seq_breakers, what)
        ]
        if any(b"\0" in b for b in enc):
            raise ParamError("seq_breakers cannot contain NUL characters")
        cstrs = [ffi.new("char[]", b) for b in enc]
        arr = ffi.new("const char *[]", cstrs) if cstrs else ffi.NULL
        ptr = lib.llama_sampler_init_dry(
            v._vocab(),
            check_float("multiplier", multiplier),
            check_float("base", base),
            check_int("allowed_length", allowed_length),
            check_int("last_n", last_n),
            arr,
            len(cstrs),
        )
        return cls(ptr, "dry")

    @classmethod
    def adaptive_p(cls, target: float, decay: float = 0.9, seed: int | None = None) -> LlamaSampler:
        ptr = lib.llama_sampler_init_adaptive_p(
            check_float("target", target), check_float("decay", decay), check_seed(seed)
        )
        return cls(ptr, "adaptive-p")

    @classmethod
    def logit_bias(cls, n_vocab: int, biases: Mapping[int, float] | Iterable[tuple[int, float]]) -> LlamaSampler:
        n_vocab = check_int("n_vocab", n_vocab, 1)
        what = "a mapping {token: bias} or an iterable of (token, bias) pairs"
        items = list(biases.items()) if isinstance(biases, Mapping) else list(expect_iterable("biases", biases, what))
        arr = ffi.new("llama_logit_bias[]", max(len(items), 1))
        for i, (tok, bias) in enumerate(items):
            t = check_int("token", tok)
            if not 0 <= t < n_vocab:
                raise InvalidTokenError(f"logit bias token {t} is out of range [0, {n_vocab})")
            arr[i].token = t
            b = float(bias)
            arr[i].bias = b if b == -math.inf else check_float("bias", b)  # -inf bans a token
        smpl = cls(lib.llama_sampler_init_logit_bias(n_vocab, len(items), arr), "logit-bias")
        return smpl

    @classmethod
    def infill(cls, vocab: Vocab | Model) -> LlamaSampler:
        """The infill sampler; it uses the vocabulary on every apply, so keeps its model alive."""
        v = _vocab_of(vocab)
        out = cls(lib.llama_sampler_init_infill(v._vocab()), "infill", parent=v._model)
        out._n_vocab = v.n_vocab
        return out

    @classmethod
    def grammar(
        cls, vocab: Vocab | Model, gbnf: str, root: str = "root", guard: GrammarGuard | None = None
    ) -> LlamaSampler:
        """llama.cpp's grammar sampler (``llama_sampler_init_grammar``) for GBNF text.

        Raises :class:`~llama_cffi.errors.ParamError` when llama.cpp refuses the grammar
        (it prints its reason to stderr), and, before llama.cpp sees it, for the texts it
        would accept and then crash on (see :mod:`llama_cffi.gbnf`: ``{m,n}`` with
        n < m, left recursion through maybe-empty rules, nesting beyond
        :data:`~llama_cffi.gbnf.MAX_DEPTH`). :meth:`accept` refuses tokens the grammar does
        not allow (llama.cpp aborts on them). An empty ``gbnf`` makes a no-op sampler.
        Keeps its model alive (the vocabulary is used on every apply).

        Token references (``<[id]>``, ``!<[id]>``, ``<|name|>``) need ``guard``: with
        them llama.cpp's apply can allow a token (matched by id after some of its
        characters) that its accept then throws on, through C, which aborts the process.
        ``guard`` is an object with ``accept(token) -> bool`` (False: the grammar cannot
        take the token; called before each native accept, so it tracks the state),
        ``reset()`` and ``clone()``; a :class:`samplers.grammar.GrammarMatcher` is one.
        Without it, :meth:`accept` on such a grammar raises :class:`SamplingError`."""
        v = _vocab_of(vocab)
        if not isinstance(gbnf, (str, bytes, bytearray, memoryview)):
            raise type_error("gbnf", "GBNF text (a str or bytes)", gbnf)
        expect_str("root", root, "a str (the start rule's name)")
        if guard is not None and not all(callable(getattr(guard, m, None)) for m in ("accept", "reset", "clone")):
            raise type_error(
                "guard", "an object with accept(token), reset() and clone() (a GrammarMatcher), or None", guard
            )
        text = gbnf.encode() if isinstance(gbnf, str) else bytes(gbnf)
        if b"\0" in text or "\0" in root:
            raise ParamError("grammar text and root name cannot contain NUL characters")
        hazard = native_grammar_hazard(text.decode(errors="replace"))
        if hazard is not None:
            raise ParamError(f"grammar refused before it reaches llama.cpp: {hazard}")
        ptr = lib.llama_sampler_init_grammar(v._vocab(), text, root.encode())
        if ptr == ffi.NULL:
            raise ParamError(f"llama.cpp refused the grammar (root {root!r}); its parser printed why to stderr")
        out = cls(ptr, "grammar", parent=v._model)
        out._n_vocab = v.n_vocab
        out._guard_accept = True
        if guard is not None:
            out._grammar_guard = guard
        elif has_token_refs(text.decode(errors="replace")):
            out._grammar_guard = "refuse"
        return out


class GrammarGuard(Protocol):
    """Tracks a grammar's state beside a native grammar sampler (see :meth:`LlamaSampler.grammar`)."""

    def accept(self, token: int) -> bool: ...

    def reset(self) -> None: ...

    def clone(self) -> GrammarGuard: ...


def _vocab_of(obj: Vocab | Model, name: str = "vocab") -> Vocab:
    from .model import Model
    from .vocab import Vocab

    if isinstance(obj, Model):
        return obj.vocab
    return expect(name, obj, Vocab, "a llama_cffi.Vocab or Model")
