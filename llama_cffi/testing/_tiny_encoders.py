"""Tiny, deterministic, random-weight *encoder* GGUF models for fast tests.

The companion of :mod:`llama_cffi._tiny_model` (a decoder-only ``llama`` model) for the
two other shapes of model llama.cpp runs:

* :func:`write_tiny_bert` writes an encoder-only ``bert`` model (an embedding model, or
  with ``rank=True`` a reranker). It has no KV memory: llama.cpp runs every batch as one
  non-causal pass (``llama_decode`` forwards to ``llama_encode``) and pools the token
  embeddings per sequence (``llama_get_embeddings_seq``) the way the file's
  ``bert.pooling_type`` says: mean, first token (CLS), last token, or a classifier score
  (RANK).
* :func:`write_tiny_t5` writes an encoder-decoder ``t5`` model: ``llama_encode`` the
  prompt, then ``llama_decode`` from the decoder start token, which attends to the
  encoder's output through cross-attention.

Both reuse the tiny SentencePiece-style vocabulary of :mod:`llama_cffi._tiny_model`
(``tokenizer.ggml.model = "llama"``: :data:`~llama_cffi._tiny_model.TOKENS`, with
``<s>``/``</s>`` as BOS/EOS); llama.cpp's vocabulary does not depend on the architecture,
so no WordPiece or Unigram tokenizer is needed. The weights are F32, drawn from
``numpy.random.default_rng(seed)`` and scaled by 0.02 (norm weights are ones, norm biases
zeros), so the outputs are meaningless but finite. The same arguments always give a
byte-identical file of a few hundred kilobytes.

Writing needs the ``gguf`` package (a test dependency), imported only when writing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import numpy as np

from .._args import expect_bool, expect_int, expect_path, expect_str
from ._tiny_model import (
    N_VOCAB,
    PAD_ID,
    Weights,
    _import_gguf,
    add_tiny_vocab,
    expect_ints,
    expect_writer_options,
    finish,
)

__all__ = ["write_tiny_bert", "write_tiny_t5"]

#: Scale (standard deviation) of the random weights.
_STD = 0.02

Pooling = Literal["mean", "cls", "last"]

_F32Array = np.ndarray[Any, np.dtype[np.float32]]


def _check_dims(n_embd: int, n_head: int, **counts: int) -> None:
    """ValueError unless every size is positive and ``n_embd`` splits into ``n_head`` heads."""
    for name, value in {"n_embd": n_embd, "n_head": n_head, **counts}.items():
        if expect_int(name, value, "an int >= 1") < 1:  # a wrong type: TypeError naming the parameter
            raise ValueError(f"{name} must be an int >= 1, not {value!r}")
    if n_embd % n_head:
        raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")


def write_tiny_bert(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    pooling: Pooling = "mean",
    rank: bool = False,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_ff: int = 128,
    n_ctx_train: int = 256,
    extra_metadata: dict[str, Any] | None = None,
) -> Path:
    """Write a tiny random-weight BERT (arch ``bert``) GGUF to ``path`` and return it as a ``Path``.

    An encoder-only embedding model: learned absolute position embeddings, post-norm
    LayerNorm blocks with biases, GELU feed-forward, non-causal attention
    (``bert.attention.causal = false``) and no KV memory. The tokenizer adds ``<s>``
    before and ``</s>`` after the text (BERT's ``[CLS] ... [SEP]``).

    Args:
        path: the file to write (replaced if it exists).
        seed: seed of ``numpy.random.default_rng`` for the weights.
        pooling: how a sequence's token embeddings are pooled into one vector
            (``bert.pooling_type``): ``"mean"`` (average over the sequence's tokens),
            ``"cls"`` (the first token, ``<s>``) or ``"last"`` (the last token, ``</s>``).
            With ``rank=True`` it picks the classifier's input instead: ``"cls"`` (the
            first token, as BERT/RoBERTa rerankers do) or ``"mean"`` (written as
            ``bert.classifier.pooling_type = MEAN``); ``"last"`` is refused there, since
            llama.cpp's RANK pooling reads the first token of a non-causal model.
        rank: write a reranker instead: ``pooling_type`` RANK plus the classifier head
            llama.cpp applies to the pooled vector, ``cls.weight``/``cls.bias`` (a dense
            ``n_embd -> n_embd`` layer, then tanh) and ``cls.output.weight``/``.bias``
            (``n_embd -> 1``), so each sequence gets one score from
            ``llama_get_embeddings_seq``.
        n_embd: embedding (hidden) size, in values per token.
        n_layer: number of transformer blocks.
        n_head: attention heads (``n_embd`` must divide by it).
        n_ff: feed-forward (intermediate) size, in values per token.
        n_ctx_train: the training context length, in tokens; also the number of rows of
            the position-embedding table, so no sequence can be longer.
        extra_metadata: GGUF keys added last, replacing same-named ones (see
            :func:`llama_cffi._tiny_model._set_kv` for how their types are chosen).

    Raises:
        ValueError: for a bad size or ``pooling``, or ``pooling="last"`` with ``rank=True``.
    """
    path = expect_path("path", path)
    expect_ints(seed=seed)
    expect_str("pooling", pooling, "'mean', 'cls' or 'last'")
    expect_bool("rank", rank)
    expect_writer_options(extra_metadata=extra_metadata)
    _check_dims(n_embd, n_head, n_layer=n_layer, n_ff=n_ff, n_ctx_train=n_ctx_train)
    if pooling not in ("mean", "cls", "last"):
        raise ValueError(f"pooling must be 'mean', 'cls' or 'last', not {pooling!r}")
    if rank and pooling == "last":
        raise ValueError("rank=True pools the classifier input over 'cls' or 'mean', not 'last'")

    gguf = _import_gguf()
    path = Path(path)
    w = Weights(seed)
    arch = "bert"
    writer = gguf.GGUFWriter(path, arch)
    kind = "rerank" if rank else "embed"
    writer.add_name(f"tiny-bert-{kind}-{pooling}-test-seed{seed}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_layer_norm_eps(1e-12)
    writer.add_causal_attention(False)
    if rank:
        writer.add_pooling_type(gguf.PoolingType.RANK)
        if pooling == "mean":
            writer.add_uint32(f"{arch}.classifier.pooling_type", gguf.PoolingType.MEAN.value)
    else:
        writer.add_pooling_type(gguf.PoolingType[pooling.upper()])
    writer.add_vocab_size(N_VOCAB)

    add_tiny_vocab(writer, add_bos=True, add_eos=True)
    n_token_types = 2  # BERT's sentence A / sentence B; llama.cpp always uses type 0
    writer.add_token_type_count(n_token_types)

    # Tensors, in a fixed order (the order the random numbers are drawn in).
    writer.add_tensor("token_embd.weight", w.rand(N_VOCAB, n_embd))
    writer.add_tensor("token_types.weight", w.rand(n_token_types, n_embd))
    writer.add_tensor("position_embd.weight", w.rand(n_ctx_train, n_embd))
    writer.add_tensor("token_embd_norm.weight", w.ones(n_embd))
    writer.add_tensor("token_embd_norm.bias", w.zeros(n_embd))
    for i in range(n_layer):
        blk = f"blk.{i}"
        for name in ("attn_q", "attn_k", "attn_v"):
            writer.add_tensor(f"{blk}.{name}.weight", w.rand(n_embd, n_embd))
            writer.add_tensor(f"{blk}.{name}.bias", w.rand(n_embd))
        writer.add_tensor(f"{blk}.attn_output.weight", w.rand(n_embd, n_embd))
        writer.add_tensor(f"{blk}.attn_output.bias", w.rand(n_embd))
        writer.add_tensor(f"{blk}.attn_output_norm.weight", w.ones(n_embd))
        writer.add_tensor(f"{blk}.attn_output_norm.bias", w.zeros(n_embd))
        writer.add_tensor(f"{blk}.ffn_up.weight", w.rand(n_ff, n_embd))
        writer.add_tensor(f"{blk}.ffn_up.bias", w.rand(n_ff))
        writer.add_tensor(f"{blk}.ffn_down.weight", w.rand(n_embd, n_ff))
        writer.add_tensor(f"{blk}.ffn_down.bias", w.rand(n_embd))
        writer.add_tensor(f"{blk}.layer_output_norm.weight", w.ones(n_embd))
        writer.add_tensor(f"{blk}.layer_output_norm.bias", w.zeros(n_embd))
    if rank:
        n_cls_out = 1  # no classifier.output_labels: llama.cpp's default of one score
        writer.add_tensor("cls.weight", w.rand(n_embd, n_embd))
        writer.add_tensor("cls.bias", w.rand(n_embd))
        writer.add_tensor("cls.output.weight", w.rand(n_cls_out, n_embd))
        writer.add_tensor("cls.output.bias", w.rand(n_cls_out))
    finish(writer, extra_metadata)
    return path


def write_tiny_t5(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    n_embd: int = 32,
    n_layer: int = 2,
    n_dec_layer: int | None = None,
    n_head: int = 4,
    n_ff: int = 64,
    n_ctx_train: int = 256,
    n_rel_attn_buckets: int = 32,
    decoder_start_token_id: int = PAD_ID,
    extra_metadata: dict[str, Any] | None = None,
) -> Path:
    """Write a tiny random-weight T5 (arch ``t5``) GGUF to ``path`` and return it as a ``Path``.

    An encoder-decoder model in the flan-T5 shape: RMS-norm pre-norm blocks without
    biases, relative-position attention biases (one table per stack, in its first block,
    shared by the others, as in T5), gated-GELU feed-forward, an untied output
    projection. The defaults keep the file near 330 KB (two stacks, with
    cross-attention, weigh about twice a decoder-only model of the same size).

    Run it as llama.cpp does: ``llama_encode`` the prompt, then ``llama_decode``
    starting from :attr:`Model.decoder_start_token`. The tokenizer adds ``</s>`` after
    the text and no ``<s>`` (as T5's does).

    Args:
        path: the file to write (replaced if it exists).
        seed: seed of ``numpy.random.default_rng`` for the weights.
        n_embd: embedding (hidden) size, in values per token.
        n_layer: encoder blocks.
        n_dec_layer: decoder blocks (``t5.decoder_block_count``); None: ``n_layer``. At
            most ``n_layer``: llama.cpp sizes its per-layer tables by the encoder's
            ``block_count`` and fails to load a deeper decoder.
        n_head: attention heads of every attention (``n_embd`` must divide by it).
        n_ff: feed-forward (intermediate) size, in values per token.
        n_ctx_train: the training context length, in tokens (T5 itself has no limit; it
            sizes llama.cpp's default context).
        n_rel_attn_buckets: buckets of the relative-position bias
            (``t5.attention.relative_buckets_count``; T5 uses 32).
        decoder_start_token_id: the token id the decoder starts from
            (``t5.decoder_start_token_id``); by default the pad token, as in T5 (here id
            0, which is also ``<unk>``), so it differs from BOS.
        extra_metadata: GGUF keys added last, replacing same-named ones (see
            :func:`llama_cffi._tiny_model._set_kv` for how their types are chosen).

    Raises:
        ValueError: for a bad size, ``n_dec_layer > n_layer``, or a decoder start token
            outside the vocabulary.
    """
    path = expect_path("path", path)
    expect_ints(seed=seed)
    if n_dec_layer is not None:
        expect_int("n_dec_layer", n_dec_layer, "an int >= 1 or None")
    expect_writer_options(extra_metadata=extra_metadata)
    n_dec = n_layer if n_dec_layer is None else n_dec_layer
    _check_dims(
        n_embd,
        n_head,
        n_layer=n_layer,
        n_dec_layer=n_dec,
        n_ff=n_ff,
        n_ctx_train=n_ctx_train,
        n_rel_attn_buckets=n_rel_attn_buckets,
    )
    if n_dec > n_layer:
        raise ValueError(f"n_dec_layer ({n_dec}) must not exceed n_layer ({n_layer}): llama.cpp cannot load that")
    expect_int("decoder_start_token_id", decoder_start_token_id, f"a token id (an int in [0, {N_VOCAB}))")
    if not 0 <= decoder_start_token_id < N_VOCAB:
        raise ValueError(f"decoder_start_token_id must be a token id in [0, {N_VOCAB}), not {decoder_start_token_id!r}")

    gguf = _import_gguf()
    path = Path(path)
    w = Weights(seed)
    head_dim = n_embd // n_head
    writer = gguf.GGUFWriter(path, "t5")
    writer.add_name(f"tiny-t5-test-seed{seed}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_decoder_block_count(n_dec)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_relative_attn_buckets_count(n_rel_attn_buckets)
    writer.add_decoder_start_token_id(decoder_start_token_id)
    writer.add_vocab_size(N_VOCAB)

    add_tiny_vocab(writer, add_bos=False, add_eos=True)

    def attention(prefix: str, first: bool) -> None:
        for name in ("q", "k", "v", "o"):
            writer.add_tensor(f"{prefix}_{name}.weight", w.rand(n_embd, n_embd))
        if first:  # ggml {n_head, n_buckets}
            writer.add_tensor(f"{prefix}_rel_b.weight", w.rand(n_rel_attn_buckets, n_head))

    def feed_forward(blk: str) -> None:
        writer.add_tensor(f"{blk}.ffn_norm.weight", w.ones(n_embd))
        writer.add_tensor(f"{blk}.ffn_gate.weight", w.rand(n_ff, n_embd))
        writer.add_tensor(f"{blk}.ffn_up.weight", w.rand(n_ff, n_embd))
        writer.add_tensor(f"{blk}.ffn_down.weight", w.rand(n_embd, n_ff))

    # Tensors, in a fixed order (the order the random numbers are drawn in).
    writer.add_tensor("token_embd.weight", w.rand(N_VOCAB, n_embd))
    for i in range(n_layer):
        blk = f"enc.blk.{i}"
        writer.add_tensor(f"{blk}.attn_norm.weight", w.ones(n_embd))
        attention(f"{blk}.attn", first=i == 0)
        feed_forward(blk)
    writer.add_tensor("enc.output_norm.weight", w.ones(n_embd))
    for i in range(n_dec):
        blk = f"dec.blk.{i}"
        writer.add_tensor(f"{blk}.attn_norm.weight", w.ones(n_embd))
        attention(f"{blk}.attn", first=i == 0)
        writer.add_tensor(f"{blk}.cross_attn_norm.weight", w.ones(n_embd))
        attention(f"{blk}.cross_attn", first=False)  # T5 has no cross-attention bias
        feed_forward(blk)
    writer.add_tensor("dec.output_norm.weight", w.ones(n_embd))
    writer.add_tensor("output.weight", w.rand(N_VOCAB, n_embd))
    finish(writer, extra_metadata)
    return path
