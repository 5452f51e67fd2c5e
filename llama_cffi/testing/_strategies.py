"""The hypothesis strategies of :mod:`llama_cffi.testing`: logits rows, token ids and
sequences, texts. hypothesis is imported when a strategy is made, never at import."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from .._args import expect_bool, expect_int, expect_number, expect_str, type_error

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from ..model import Model
    from ..vocab import Vocab

__all__ = ["ELEMENTWISE_MAX", "TEXT_PIECES", "floats32", "logits_rows", "texts", "token_ids", "token_sequences"]

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
    lo_v, hi_v = expect_number("min_value", min_value), expect_number("max_value", max_value)
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

    expect_int("min_size", min_size)
    expect_int("max_size", max_size)
    allow_ties = expect_bool("allow_ties", allow_ties)
    allow_neg_inf = expect_bool("allow_neg_inf", allow_neg_inf)
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
    allow_control = expect_bool("allow_control", allow_control)
    allow_eog = expect_bool("allow_eog", allow_eog)
    if isinstance(model_or_vocab, (bool, int, np.integer)):
        return np.arange(_check_size("n_vocab", model_or_vocab, 1), dtype=np.int32)
    from .._binding import lib
    from ..model import Model
    from ..vocab import Vocab

    vocab = model_or_vocab.vocab if isinstance(model_or_vocab, Model) else model_or_vocab
    if not isinstance(vocab, Vocab):
        raise type_error("model_or_vocab", "a Model, a Vocab or an int n_vocab", model_or_vocab)
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
        expect_str("alphabet", alphabet, "a str (the characters to draw) or None")
        if not alphabet or "\0" in alphabet:
            raise ValueError("alphabet must be a non-empty string without NUL")
        piece = st.sampled_from(sorted(set(alphabet)))
    else:
        piece = st.one_of(st.sampled_from(TEXT_PIECES), st.characters(codec="utf-8", exclude_characters="\0"))
    return st.lists(piece, min_size=lo, max_size=hi).map("".join)
