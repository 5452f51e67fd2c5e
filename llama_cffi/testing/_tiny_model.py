"""Tiny, deterministic, random-weight GGUF models for fast tests.

:func:`write_tiny_model` writes a complete ``llama``-architecture GGUF file of a few
hundred kilobytes in a few milliseconds. The weights are random (F32, drawn from
``numpy.random.default_rng(seed)``), so the model's *output* is gibberish, but it is a
complete model as far as llama.cpp is concerned: it loads, tokenizes, decodes (finite
logits) and carries a chat template, like a real one. It is meant for unit tests that
need a real model but not a good one, so that they never need a download.

The tokenizer is real: a SentencePiece-style (``tokenizer.ggml.model = "llama"``)
vocabulary with

* ``<unk>`` (id 0, UNKNOWN), ``<s>`` (id 1, CONTROL, BOS), ``</s>`` (id 2, CONTROL, EOS),
* the 256 byte-fallback tokens ``<0x00>`` .. ``<0xFF>`` (ids 3..258, BYTE), so any
  UTF-8 text round-trips through tokenize -> detokenize,
* ``▁`` and the printable ASCII characters as single-character pieces,
* a few dozen common English words with the ``▁`` word-start prefix (plus every
  prefix of them, which SentencePiece's pairwise merging needs in order to reach the
  whole word), scored so that longer pieces win,
* the ChatML markers ``<|im_start|>`` and ``<|im_end|>`` (CONTROL; ``<|im_end|>`` is
  the end-of-turn token), last in the vocabulary.

``tokenizer.ggml.add_space_prefix`` is false by default, so that
``detokenize(tokenize(text, add_special=True), remove_special=True) == text`` exactly.
(With the Llama-2 style prefix space on, llama.cpp drops the prefix space on
detokenize only when the tokens do *not* start with BOS, so a round trip through
``add_special=True`` gains a leading space; pass ``add_space_prefix=True`` to test that.)

The same arguments always give a byte-identical file. ``TOKENS``,
``SCORES`` and ``TOKEN_TYPES`` expose the vocabulary so tests can compare
against it; :data:`BOS_ID` and the other ``*_ID`` constants give the special ids.

Writing needs the ``gguf`` package (a test dependency: ``pip install gguf``), imported
only by :func:`write_tiny_model`; the vocabulary constants need nothing but numpy.
Public through :mod:`llama_cffi.testing`.
"""

from __future__ import annotations

import os
import string
from pathlib import Path
from typing import Any

import numpy as np

from .._args import expect_bool, expect_int, expect_mapping, expect_path, expect_str

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
    "TOKENS",
    "TOKEN_TYPES",
    "UNK_ID",
    "write_tiny_model",
]

#: The usual ChatML template (llama.cpp's ``llama_chat_apply_template`` detects it as
#: ``"chatml"``).
CHATML_TEMPLATE: str = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

#: Word pieces (each is added with the ``▁`` word-start prefix, as are all its prefixes).
_WORDS: tuple[str, ...] = (
    "the", "and", "of", "to", "a", "in", "is", "it", "that", "for", "on", "with",
    "as", "was", "he", "she", "be", "at", "by", "this", "have", "from", "or", "not",
    "are", "but", "you", "we", "they", "his", "her", "all", "one", "there", "an",
    "will", "can", "what", "when", "which", "hello", "world", "end", "Hello", "The",
    "test", "model", "token", "time", "day", "cat", "dog", "yes", "no", "I",
)  # fmt: skip

_SPACE = "\u2581"  # "▁", SentencePiece's word-start marker

#: Ids of the first byte token; ``<0xNN>`` has id ``BYTE_TOKEN_OFFSET + 0xNN``.
BYTE_TOKEN_OFFSET: int = 3

# GGUF token types (``tokenizer.ggml.token_type``; ``gguf.TokenType``, llama.cpp's
# ``llama_token_type``), spelled out so the vocabulary is built without importing gguf.
_NORMAL = 1
_UNKNOWN = 2
_CONTROL = 3
_BYTE = 6


def _import_gguf() -> Any:
    """The ``gguf`` module, or an ImportError that says how to get it."""
    try:
        import gguf
    except ImportError as e:
        raise ImportError(
            "writing the tiny test model needs the gguf package (a test dependency of llama_cffi): "
            "pip install gguf  (or: pip install 'llama-cffi[test]')"
        ) from e
    return gguf


def _build_vocab() -> tuple[list[str], list[float], list[int]]:
    tokens: list[str] = ["<unk>", "<s>", "</s>"]
    scores: list[float] = [0.0, 0.0, 0.0]
    types: list[int] = [_UNKNOWN, _CONTROL, _CONTROL]

    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(_BYTE)

    # Single characters: "▁" and printable ASCII except whitespace (a space is "▁";
    # tabs/newlines go through byte fallback, as in the real Llama vocabulary).
    singles = [_SPACE] + [c for c in string.printable if not c.isspace()]
    # Multi-character pieces: every prefix of every "▁word" (SentencePiece merges
    # adjacent pairs only when the merged text is itself a piece).
    pieces: list[str] = []
    seen: set[str] = set(singles)
    for word in _WORDS:
        full = _SPACE + word
        for end in range(2, len(full) + 1):
            piece = full[:end]
            if piece not in seen:
                seen.add(piece)
                pieces.append(piece)

    for i, piece in enumerate(singles):
        tokens.append(piece)
        scores.append(-1000.0 - i)
        types.append(_NORMAL)
    for i, piece in enumerate(pieces):
        tokens.append(piece)
        # longer pieces win; ties broken by list order
        scores.append(float(len(piece)) * 10.0 - i * 1e-3)
        types.append(_NORMAL)

    for marker in ("<|im_start|>", "<|im_end|>"):
        tokens.append(marker)
        scores.append(0.0)
        types.append(_CONTROL)

    assert len(set(tokens)) == len(tokens)
    return tokens, scores, types


TOKENS: list[str]
SCORES: list[float]
TOKEN_TYPES: list[int]
TOKENS, SCORES, TOKEN_TYPES = _build_vocab()

N_VOCAB: int = len(TOKENS)
UNK_ID: int = 0
BOS_ID: int = 1
EOS_ID: int = 2
PAD_ID: int = 0
IM_START_ID: int = TOKENS.index("<|im_start|>")
IM_END_ID: int = TOKENS.index("<|im_end|>")
EOT_ID: int = IM_END_ID


F32Array = np.ndarray[Any, np.dtype[np.float32]]


class Weights:
    """Deterministic F32 tensors for the tiny writers: every call draws the next numbers
    of one ``numpy.random.default_rng(seed)`` stream, so a file depends only on the seed
    and the order of the calls."""

    def __init__(self, seed: int, std: float = 0.02) -> None:
        self.rng = np.random.default_rng(seed)
        self.std = std

    def rand(self, *shape: int, std: float | None = None) -> F32Array:
        """Normal(0, ``std``) weights (default 0.02) of numpy shape ``shape``; a numpy
        ``(rows, cols)`` matrix is ggml ``ne = {cols, rows}``."""
        arr = self.rng.standard_normal(shape, dtype=np.float32)
        arr *= np.float32(self.std if std is None else std)
        return arr

    @staticmethod
    def ones(n: int) -> F32Array:
        """A norm weight: ``n`` ones (draws nothing)."""
        return np.ones(n, dtype=np.float32)

    @staticmethod
    def zeros(n: int) -> F32Array:
        """A bias: ``n`` zeros (draws nothing)."""
        return np.zeros(n, dtype=np.float32)


def _set_kv(writer: Any, key: str, value: Any) -> None:
    """Set (or replace) one metadata key.

    ``value`` is either a plain Python value, or a ``(value, gguf.GGUFValueType)`` pair
    to force the type. A plain value replacing a key the writer already holds keeps
    that key's type (llama.cpp checks integer widths strictly); a new key gets
    ``GGUFValueType.get_type(value)`` (``int`` -> INT32, ``float`` -> FLOAT32).
    """
    gguf = _import_gguf()
    t = gguf.GGUFValueType
    ints = {t.UINT8, t.INT8, t.UINT16, t.INT16, t.UINT32, t.INT32, t.UINT64, t.INT64}
    sub_type: Any = None
    old = writer.kv_data[0].pop(key, None)
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], t):
        value, vtype = value
    else:
        vtype = t.get_type(value)
        if old is not None and (
            (vtype == t.INT32 and old.type in ints)
            or (vtype == t.FLOAT32 and old.type in {t.FLOAT32, t.FLOAT64})
            or (vtype == t.ARRAY and old.type == t.ARRAY)
        ):
            vtype, sub_type = old.type, old.sub_type
    writer.add_key_value(key, value, vtype, sub_type)


def expect_ints(**values: object) -> None:
    """The TypeError naming the first of ``values`` (parameter name -> value) that is not
    an int: the size and seed checks of the tiny writers, made before any is used."""
    for name, value in values.items():
        expect_int(name, value)


def expect_writer_options(
    *, chat_template: object = None, add_space_prefix: object = False, extra_metadata: object = None
) -> None:
    """The TypeError naming a wrong-typed ``chat_template`` (a str or None),
    ``add_space_prefix`` (a bool) or ``extra_metadata`` (a mapping or None): the options
    the tiny writers share."""
    if chat_template is not None:
        expect_str("chat_template", chat_template, "a str (a Jinja template) or None")
    expect_bool("add_space_prefix", add_space_prefix)
    if extra_metadata is not None:
        expect_mapping("extra_metadata", extra_metadata, "a mapping (GGUF key -> value) or None")


def rope_head_dim(n_embd: int, n_head: int, n_head_kv: int) -> int:
    """The head dimension of a RoPE attention block; ValueError unless the shapes fit.

    ``n_embd`` must split into ``n_head`` heads, ``n_head`` into ``n_head_kv`` groups,
    and the head dimension must be even (RoPE rotates pairs).
    """
    if n_head <= 0 or n_head_kv <= 0:
        raise ValueError("n_head and n_head_kv must be positive")
    if n_embd % n_head:
        raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
    if n_head % n_head_kv:
        raise ValueError(f"n_head ({n_head}) must be divisible by n_head_kv ({n_head_kv})")
    head_dim = n_embd // n_head
    if head_dim % 2:
        raise ValueError(f"head dimension ({head_dim}) must be even for RoPE")
    return head_dim


def add_attention(writer: Any, blk: str, w: Weights, n_embd: int, n_q: int, n_kv: int) -> None:
    """A block's pre-attention norm (ones) and its Q, K, V and output projections, drawn
    from ``w`` in that order (``n_q``/``n_kv``: query and key/value widths)."""
    writer.add_tensor(f"{blk}.attn_norm.weight", w.ones(n_embd))
    writer.add_tensor(f"{blk}.attn_q.weight", w.rand(n_q, n_embd))
    writer.add_tensor(f"{blk}.attn_k.weight", w.rand(n_kv, n_embd))
    writer.add_tensor(f"{blk}.attn_v.weight", w.rand(n_kv, n_embd))
    writer.add_tensor(f"{blk}.attn_output.weight", w.rand(n_embd, n_q))


def write_tiny_model(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_ctx_train: int = 256,
    chat_template: str | None = CHATML_TEMPLATE,
    add_space_prefix: bool = False,
    extra_metadata: dict[str, Any] | None = None,
    tied_output: int = 1,
) -> Path:
    """Write a tiny random-weight llama GGUF to ``path`` and return it as a ``Path``.

    ``chat_template=None`` leaves ``tokenizer.chat_template`` out. ``tied_output=g``
    gives every run of ``g`` consecutive token ids one output row (the first one's), so
    their logits tie exactly (for tests of ties in top-k). ``extra_metadata``
    maps GGUF keys to values that are added last, replacing same-named keys (see
    :func:`_set_kv` for how their types are chosen); for example
    ``{"tokenizer.ggml.add_bos_token": False}``.
    """
    path = expect_path("path", path)
    expect_ints(
        seed=seed, n_embd=n_embd, n_layer=n_layer, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
        n_ctx_train=n_ctx_train, tied_output=tied_output,
    )  # fmt: skip
    expect_writer_options(chat_template=chat_template, add_space_prefix=add_space_prefix, extra_metadata=extra_metadata)
    head_dim = rope_head_dim(n_embd, n_head, n_head_kv)

    gguf = _import_gguf()
    path = Path(path)
    w = Weights(seed)
    rand, ones = w.rand, w.ones

    arch = "llama"
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(f"tiny-llama-test-seed{seed}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(N_VOCAB)

    add_tiny_vocab(writer, add_space_prefix=add_space_prefix, chat_template=chat_template)
    for key, value in (extra_metadata or {}).items():
        _set_kv(writer, key, value)

    # Tensors, in a fixed order (the order the random numbers are drawn in).
    n_q = n_head * head_dim
    n_kv = n_head_kv * head_dim
    writer.add_tensor("token_embd.weight", rand(N_VOCAB, n_embd))
    for i in range(n_layer):
        blk = f"blk.{i}"
        add_attention(writer, blk, w, n_embd, n_q, n_kv)
        writer.add_tensor(f"{blk}.ffn_norm.weight", ones(n_embd))
        writer.add_tensor(f"{blk}.ffn_gate.weight", rand(n_ff, n_embd))
        writer.add_tensor(f"{blk}.ffn_down.weight", rand(n_embd, n_ff))
        writer.add_tensor(f"{blk}.ffn_up.weight", rand(n_ff, n_embd))
    writer.add_tensor("output_norm.weight", ones(n_embd))
    out = rand(N_VOCAB, n_embd)
    if tied_output > 1:
        out = np.ascontiguousarray(out[np.arange(N_VOCAB) // tied_output * tied_output])
    writer.add_tensor("output.weight", out)

    finish(writer)
    return path


def add_tiny_vocab(
    writer: Any,
    *,
    add_bos: bool = True,
    add_eos: bool = False,
    add_space_prefix: bool = False,
    chat_template: str | None = None,
) -> None:
    """Add the tiny SentencePiece vocabulary (``TOKENS``, its special ids, the BOS/EOS
    and space-prefix flags, and a chat template unless ``None``) to a ``GGUFWriter``: the
    tokenizer every tiny model of :mod:`llama_cffi.testing` shares."""
    writer.add_tokenizer_model("llama")
    writer.add_token_list(TOKENS)
    writer.add_token_scores(SCORES)
    writer.add_token_types(TOKEN_TYPES)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_eot_token_id(EOT_ID)
    writer.add_unk_token_id(UNK_ID)
    writer.add_pad_token_id(PAD_ID)
    writer.add_add_bos_token(add_bos)
    writer.add_add_eos_token(add_eos)
    writer.add_add_space_prefix(add_space_prefix)
    if chat_template is not None:
        writer.add_chat_template(chat_template)


def finish(writer: Any, extra_metadata: dict[str, Any] | None = None) -> None:
    """Apply ``extra_metadata`` (see :func:`_set_kv`), then write the header, the metadata
    and the tensors (in the order added) and close the writer."""
    for key, value in (extra_metadata or {}).items():
        _set_kv(writer, key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
