"""Helpers for property-based tests of code built on llama_cffi.

Two things, both usable without a real model installed:

* A tiny, deterministic, random-weight GGUF model (:func:`write_tiny_model`, a few
  hundred kilobytes, written in milliseconds) with a real SentencePiece-style vocabulary
  of ``N_VOCAB`` tokens: byte fallback (any UTF-8 text round-trips), a few dozen
  English words, BOS/EOS and the ChatML markers. ``TOKENS``, ``SCORES``,
  ``TOKEN_TYPES`` and the ``*_ID`` constants describe that vocabulary. The same in
  every kind of model llama.cpp has (:data:`TINY_KINDS`, :func:`write_tiny`): quantized,
  sliding-window, encoder-only with pooling or a reranking head, encoder-decoder,
  recurrent and hybrid. Writing a file needs the ``gguf`` package (``pip install gguf``),
  imported only when called.
* `hypothesis <https://hypothesis.readthedocs.io>`_ strategies for the inputs such code
  takes: :func:`logits_rows` (float32 logits rows with ties and ``-inf``),
  :func:`token_sequences` (valid token ids of a model) and :func:`texts` (text that
  stresses tokenizers). hypothesis is imported when a strategy is first asked for, so
  this module imports without it; the strategy functions raise an ImportError saying
  ``pip install hypothesis`` when it is missing.

The pytest plugin :mod:`llama_cffi.pytest_plugin` (registered automatically) provides
``tiny_model_path``, ``tiny_model``, ``tiny_context``, ``tiny_model_of`` (a tiny model of
any kind), ``default_model_path`` and ``default_model`` fixtures. Strategies for sampler chains and GBNF grammars are in
:mod:`samplers.testing` (``llama_cffi`` never imports ``samplers``). A property test over
the tiny model::

    from hypothesis import given, strategies as st
    from llama_cffi.testing import token_sequences

    @given(data=st.data())
    def test_decode_is_finite(tiny_model, data):
        tokens = data.draw(token_sequences(tiny_model, min_size=1, max_size=16))
        with tiny_model.context(n_ctx=64) as ctx:
            assert np.isfinite(ctx.decode(tokens)).all()
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ._tiny_encoders import write_tiny_bert, write_tiny_t5
from ._tiny_model import (
    BOS_ID,
    BYTE_TOKEN_OFFSET,
    CHATML_TEMPLATE,
    EOS_ID,
    EOT_ID,
    IM_END_ID,
    IM_START_ID,
    N_VOCAB,
    PAD_ID,
    SCORES,
    TOKEN_TYPES,
    TOKENS,
    UNK_ID,
    write_tiny_model,
)
from ._tiny_recurrent import write_tiny_hybrid, write_tiny_mamba
from ._tiny_variants import write_tiny_quantized, write_tiny_swa

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from ._kv_machine import KvCacheMachine as KvCacheMachine
    from ._kv_machine import KvCells as KvCells
    from .model import Model
    from .vocab import Vocab

__all__ = [
    "BOS_ID",
    "BYTE_TOKEN_OFFSET",
    "CHATML_TEMPLATE",
    "EOS_ID",
    "EOT_ID",
    "IM_END_ID",
    "IM_START_ID",
    "N_VOCAB",
    "PAD_ID",
    "SCORES",
    "TINY_KINDS",
    "TOKENS",
    "TOKEN_TYPES",
    "UNK_ID",
    "KvCacheMachine",
    "KvCells",
    "decode_equivalence",
    "expect_raises",
    "floats32",
    "logits_rows",
    "texts",
    "token_ids",
    "token_sequences",
    "write_tiny",
    "write_tiny_bert",
    "write_tiny_hybrid",
    "write_tiny_mamba",
    "write_tiny_model",
    "write_tiny_quantized",
    "write_tiny_swa",
    "write_tiny_t5",
]

#: Every kind of tiny model, by name: the writer and its arguments. One of each memory and
#: graph kind llama.cpp has: a decoder (``llama``), its Q8_0 and Q4_0 copies (quantized
#: kernels; Q4_0 goes through the CPU weight repacking), sliding-window attention
#: (``swa``: gemma3 with an 8-token window), encoder-only models with MEAN/CLS/LAST pooling
#: and a reranker (``bert*``), an encoder-decoder (``t5``), a recurrent model (``mamba``)
#: and a hybrid of attention and recurrent layers (``hybrid``: lfm2). All share the tiny
#: SentencePiece vocabulary (``TOKENS``), are a few hundred KB, and are byte-identical
#: for the same name.
TINY_KINDS: dict[str, tuple[Callable[..., Path], dict[str, object]]] = {
    "llama": (write_tiny_model, {}),
    "llama-q8_0": (write_tiny_quantized, {"qtype": "q8_0"}),
    "llama-q4_0": (write_tiny_quantized, {"qtype": "q4_0"}),
    "swa": (write_tiny_swa, {}),
    "bert": (write_tiny_bert, {"pooling": "mean"}),
    "bert-cls": (write_tiny_bert, {"pooling": "cls"}),
    "bert-last": (write_tiny_bert, {"pooling": "last"}),
    "bert-rank": (write_tiny_bert, {"pooling": "cls", "rank": True}),
    "t5": (write_tiny_t5, {}),
    "mamba": (write_tiny_mamba, {}),
    "hybrid": (write_tiny_hybrid, {}),
}


def write_tiny(kind: str, path: str | os.PathLike[str], **kwargs: object) -> Path:
    """Write the tiny model of ``kind`` (a key of :data:`TINY_KINDS`) to ``path``;
    ``kwargs`` override the kind's arguments (``seed=``, sizes, ``extra_metadata=``)."""
    try:
        writer, defaults = TINY_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown tiny model kind {kind!r}; choose from {sorted(TINY_KINDS)}") from None
    return writer(path, **{**defaults, **kwargs})


#: Rows up to this length are drawn element by element (hypothesis shrinks each value);
#: longer ones come from numpy generators seeded by drawn integers (hypothesis then
#: shrinks the seeds and the row's structure, not single values).
ELEMENTWISE_MAX = 256


def _require_hypothesis() -> None:
    """Import hypothesis, or raise an ImportError that says how to get it."""
    try:
        import hypothesis  # noqa: F401
    except ImportError as e:
        raise ImportError(
            "llama_cffi.testing's strategies need hypothesis: pip install hypothesis  "
            "(or: pip install 'llama-cffi[test]')"
        ) from e


def _check_size(name: str, value: int, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, not {type(value).__name__} ({value!r})")
    if value < lo:
        raise ValueError(f"{name} must be >= {lo}, not {value}")
    return int(value)


# --------------------------------------------------------------------------- logits rows
def _f32_bounds(min_value: float, max_value: float) -> tuple[np.float32, np.float32]:
    """The float32 values nearest ``[min_value, max_value]`` from inside it."""
    lo_v, hi_v = float(min_value), float(max_value)
    if not (math.isfinite(lo_v) and math.isfinite(hi_v)) or lo_v > hi_v:
        raise ValueError(f"need finite min_value <= max_value, not [{min_value}, {max_value}]")
    lo32, hi32 = np.float32(lo_v), np.float32(hi_v)
    if float(lo32) < lo_v:
        lo32 = np.nextafter(lo32, np.float32(np.inf))
    if float(hi32) > hi_v:
        hi32 = np.nextafter(hi32, np.float32(-np.inf))
    if not (np.isfinite(lo32) and np.isfinite(hi32)) or lo32 > hi32:
        raise ValueError(f"no finite float32 value lies in [{min_value}, {max_value}]")
    return lo32, hi32


def floats32(min_value: float, max_value: float) -> SearchStrategy[float]:
    """Finite Python floats that are exactly float32 values, in ``[min_value, max_value]``
    (bounds that float32 cannot hold are rounded inwards, so ``floats32(0, 0.1)`` works)."""
    _require_hypothesis()
    from hypothesis import strategies as st

    lo32, hi32 = _f32_bounds(min_value, max_value)
    if lo32 == hi32:  # one value (or 0.0 and -0.0, which hypothesis would refuse)
        return st.just(float(lo32))
    return st.floats(float(lo32), float(hi32), width=32, allow_nan=False, allow_infinity=False)


def logits_rows(
    n_vocab: int | SearchStrategy[int] | None = None,
    *,
    min_size: int = 1,
    max_size: int = 64,
    min_value: float = -40.0,
    max_value: float = 40.0,
    allow_ties: bool = True,
    allow_neg_inf: bool = True,
) -> SearchStrategy[npt.NDArray[np.float32]]:
    """Rows of logits: fresh, writable, C-contiguous 1-D ``float32`` numpy arrays (owned by
    the test; nothing else holds them).

    Length: ``n_vocab`` when it is an int, a value drawn from it when it is a strategy,
    otherwise in ``[min_size, max_size]``. Values are unnormalised log-probabilities
    (natural log units, as a model's output), finite ones in ``[min_value, max_value]``
    (see :func:`floats32`). Guarantees: never NaN, never ``+inf``, and at least one entry
    is finite (so a softmax is defined).

    What makes rows hard for samplers comes often: with ``allow_ties``, about two rows in
    three draw their values (all, or a share) from a pool of at most four, so equal
    logits, equal maxima and constant rows are common; with ``allow_neg_inf``, about
    three rows in four (of length > 1) have ``-inf`` entries (masked tokens): a few,
    most, or all but one. Rows longer than ``ELEMENTWISE_MAX`` are built with numpy
    from drawn seeds, so vocabulary-sized rows (262,144) stay cheap.
    """
    _require_hypothesis()
    from hypothesis import strategies as st

    sizes: SearchStrategy[int]
    if n_vocab is None:
        lo = _check_size("min_size", min_size, 1)
        hi = _check_size("max_size", max_size, lo)
        sizes = st.integers(lo, hi)
    elif isinstance(n_vocab, (int, np.integer)) and not isinstance(n_vocab, bool):
        sizes = st.just(_check_size("n_vocab", n_vocab, 1))
    elif isinstance(n_vocab, st.SearchStrategy):
        sizes = n_vocab
    else:
        raise TypeError(f"n_vocab must be None, an int or a strategy of ints, not {type(n_vocab).__name__}")
    finite = floats32(min_value, max_value)
    lo32, hi32 = _f32_bounds(min_value, max_value)
    kinds = ("free", "ties", "mixed") if allow_ties else ("free",)
    mask_modes = ("none", "some", "most", "all_but_one") if allow_neg_inf else ("none",)
    seeds = st.integers(0, 2**32 - 1)

    @st.composite
    def rows(draw: st.DrawFn) -> npt.NDArray[np.float32]:
        n = draw(sizes)
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"the n_vocab strategy must give ints >= 1, not {n!r}")
        n = int(n)
        kind = draw(st.sampled_from(kinds))
        pool: list[float] = draw(st.lists(finite, min_size=1, max_size=4)) if kind != "free" else []
        if n <= ELEMENTWISE_MAX:
            if kind == "free":
                elements = finite
            elif kind == "ties":
                elements = st.sampled_from(pool)
            else:
                elements = st.one_of(st.sampled_from(pool), finite)
            row = np.array(draw(st.lists(elements, min_size=n, max_size=n)), dtype=np.float32)
        else:
            rng = np.random.default_rng(draw(seeds))
            span = float(hi32) - float(lo32)
            row = np.clip((rng.random(n) * span + float(lo32)).astype(np.float32), lo32, hi32)
            if kind != "free":
                share = 1.0 if kind == "ties" else draw(st.sampled_from((0.5, 0.05, 0.95)))
                take = rng.random(n) < share
                row[take] = np.asarray(pool, dtype=np.float32)[rng.integers(0, len(pool), int(take.sum()))]
        mode = draw(st.sampled_from(mask_modes)) if n > 1 else "none"
        if mode != "none":
            if mode == "all_but_one":
                mask = np.ones(n, dtype=bool)
            elif mode == "some" and n <= ELEMENTWISE_MAX:
                mask = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
            else:
                frac = 0.3 if mode == "some" else 0.95
                mask = np.random.default_rng(draw(seeds)).random(n) < frac
            mask[draw(st.integers(0, n - 1))] = False  # at least one finite logit
            row[mask] = -np.inf
        return row

    return rows()


# --------------------------------------------------------------------------- token ids
def token_ids(
    model_or_vocab: Model | Vocab | int, *, allow_control: bool = False, allow_eog: bool = False
) -> npt.NDArray[np.int32]:
    """The ids :func:`token_sequences` draws from, ascending, as a fresh int32 array.

    ``model_or_vocab`` is a :class:`~llama_cffi.Model`, its :class:`~llama_cffi.Vocab`, or
    an int ``n_vocab`` (then every id in ``[0, n_vocab)``; the flags do not apply).
    Control tokens (``llama_vocab_is_control``: BOS, EOS, chat markers, ...) and
    end-of-generation tokens (``llama_vocab_is_eog``) are left out unless allowed. One
    pass over the vocabulary (about 0.1 s at 262,144 tokens)."""
    if isinstance(model_or_vocab, (bool, int, np.integer)):
        return np.arange(_check_size("n_vocab", model_or_vocab, 1), dtype=np.int32)
    from ._binding import lib
    from .model import Model
    from .vocab import Vocab

    vocab = model_or_vocab.vocab if isinstance(model_or_vocab, Model) else model_or_vocab
    if not isinstance(vocab, Vocab):
        raise TypeError(f"a Model, a Vocab or an int n_vocab is needed, not {type(model_or_vocab).__name__}")
    v = vocab._vocab()
    n = vocab.n_vocab
    is_control, is_eog = lib.llama_vocab_is_control, lib.llama_vocab_is_eog
    keep = [t for t in range(n) if (allow_control or not is_control(v, t)) and (allow_eog or not is_eog(v, t))]
    return np.asarray(keep, dtype=np.int32)


def token_sequences(
    model_or_vocab: Model | Vocab | int,
    *,
    min_size: int = 0,
    max_size: int = 32,
    allow_control: bool = False,
    allow_eog: bool = False,
) -> SearchStrategy[list[int]]:
    """Lists of ``min_size`` to ``max_size`` token ids (Python ints), each valid for
    ``model_or_vocab`` (see :func:`token_ids` for which ids and the flags).

    The ids are computed once, when the strategy is made, so the model may be closed
    afterwards; the strategy keeps no reference to it. Make it inside the test (``data =
    st.data()``, ``data.draw(token_sequences(model))``) when the model is a fixture.
    Shrinks towards shorter lists of the lowest allowed ids."""
    _require_hypothesis()
    from hypothesis import strategies as st

    lo = _check_size("min_size", min_size, 0)
    hi = _check_size("max_size", max_size, lo)
    ids = token_ids(model_or_vocab, allow_control=allow_control, allow_eog=allow_eog).tolist()
    if not ids:
        if lo > 0:
            raise ValueError("the vocabulary has no token that the flags allow")
        return st.just([])
    return st.lists(st.sampled_from(ids), min_size=lo, max_size=hi)


# --------------------------------------------------------------------------- texts
#: Pieces :func:`texts` mixes with arbitrary characters: words with and without a leading
#: space, runs of whitespace, multi-byte UTF-8 (2, 3 and 4 bytes), a combining accent,
#: SentencePiece's own space marker, and special-token spellings.
TEXT_PIECES: tuple[str, ...] = (
    "the", " the", "Hello", " world", " ", "  ", "\n", "\n\n", "\t", "\r\n",
    "é", "e\u0301", "Ж", "日本", "🦙", "\u00a0", "\u2581", "0", "123", ".", "!", '"',
    "<s>", "</s>", "<|im_end|>",
)  # fmt: skip


def texts(*, min_pieces: int = 0, max_pieces: int = 16, alphabet: str | None = None) -> SearchStrategy[str]:
    """Strings that stress tokenizers: ``min_pieces`` to ``max_pieces`` pieces joined,
    each one of ``TEXT_PIECES`` or a single character (any Unicode scalar value but
    NUL). With ``alphabet``, every piece is one of its characters instead. Lengths are in
    pieces, not characters.

    Always valid UTF-8 (no surrogates) and NUL-free, since llama.cpp's C strings stop at
    NUL. Note that with a SentencePiece vocabulary ``"\\u2581"`` detokenizes to a space,
    so exact round trips need texts without it."""
    _require_hypothesis()
    from hypothesis import strategies as st

    lo = _check_size("min_pieces", min_pieces, 0)
    hi = _check_size("max_pieces", max_pieces, lo)
    piece: SearchStrategy[str]
    if alphabet is not None:
        if not alphabet or "\0" in alphabet:
            raise ValueError("alphabet must be a non-empty string without NUL")
        piece = st.sampled_from(sorted(set(alphabet)))
    else:
        piece = st.one_of(st.sampled_from(TEXT_PIECES), st.characters(codec="utf-8", exclude_characters="\0"))
    return st.lists(piece, min_size=lo, max_size=hi).map("".join)


# ---------------------------------------------------------------------- decode equivalence
def decode_equivalence(
    model: Model,
    tokens: Sequence[int] | npt.NDArray[np.integer[Any]],
    logits: npt.ArrayLike,
    *,
    rtol: float = 2e-3,
    atol: float = 2e-3,
    **context_params: Any,
) -> float:
    """Check that ``logits`` -- the next-token logits after ``tokens``, however they were
    obtained (a forked branch, one sequence of a batch, a restored state, a shifted
    cache) -- equal what a fresh context gives when it decodes ``tokens`` one at a time
    (``context_params`` for it: ``n_ctx``, ``type_k``...).

    Equal means within ``rtol``/``atol`` (``numpy.allclose``): another batch shape or cell
    order makes llama.cpp's kernels sum in another order. The defaults suit F32 weights
    with an f16 KV cache; quantized weights with CPU repacking differ by up to ~1 logit
    between batch shapes (load with ``use_extra_bufts=False`` to compare those). Returns
    the largest absolute difference; raises :class:`AssertionError` naming it, the token
    where it is, and the tolerance, when they are not equal."""
    toks = [int(t) for t in np.asarray(tokens).reshape(-1)]
    if not toks:
        raise ValueError("decode_equivalence needs at least one token")
    got = np.asarray(logits, dtype=np.float32).reshape(-1)
    params = {"n_ctx": max(256, len(toks) + 1), **context_params}
    with model.context(**params) as ctx:
        row = None
        for pos, t in enumerate(toks):
            row = ctx.decode_single(t, pos=pos)
        assert row is not None
        want = np.array(row, dtype=np.float32, copy=True)
    if got.shape != want.shape:
        raise AssertionError(f"logits have shape {got.shape}; the model's rows have {want.shape}")
    diff = np.abs(got.astype(np.float64) - want)
    worst = int(np.argmax(diff))
    if not np.allclose(got, want, rtol=rtol, atol=atol):
        raise AssertionError(
            f"the logits differ from a fresh one-token-at-a-time decode by up to {diff[worst]:.3g} "
            f"(token {worst}: {got[worst]:.6g} against {want[worst]:.6g}; rtol={rtol:g}, atol={atol:g})"
        )
    return float(diff[worst])


# ---------------------------------------------------------------------- state machines
@contextmanager
def expect_raises(
    exc: type[BaseException] | tuple[type[BaseException], ...], match: str | None = None
) -> Iterator[None]:
    """Assert that the block raises ``exc`` (whose message matches the regular expression
    ``match``, searched as ``re.search`` does): ``pytest.raises`` without pytest, for the
    state machines, which also run under ``unittest``. Raises :class:`AssertionError`
    when nothing is raised or the message does not match; any other exception goes
    through unchanged."""
    try:
        yield
    except exc as e:
        if match is not None and not re.search(match, str(e)):
            raise AssertionError(f"{type(e).__name__}({str(e)!r}) does not match {match!r}") from e
        return
    raise AssertionError(f"expected {_names(exc)}, nothing was raised")


def _names(exc: type[BaseException] | tuple[type[BaseException], ...]) -> str:
    return " or ".join(e.__name__ for e in (exc if isinstance(exc, tuple) else (exc,)))


def __getattr__(name: str) -> Any:
    # The state machines subclass hypothesis's RuleBasedStateMachine: imported when asked
    # for, so that this module imports without hypothesis.
    if name in ("KvCacheMachine", "KvCells"):
        _require_hypothesis()
        from . import _kv_machine

        return getattr(_kv_machine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *("KvCacheMachine", "KvCells")})
