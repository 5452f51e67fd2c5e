"""Tiny, deterministic, random-weight *recurrent* and *hybrid* GGUF models for fast tests.

Companions of :func:`llama_cffi._tiny_model.write_tiny_model` (a plain attention model)
for the two other kinds of memory llama.cpp has:

* :func:`write_tiny_mamba` writes a ``mamba`` (Mamba-1) model: every layer is a selective
  state-space block, ``llama_model_is_recurrent`` is true and the context's memory is
  llama.cpp's *recurrent* memory (``llama_memory_recurrent``: one conv state and one SSM
  state per sequence, no per-position cells).
* :func:`write_tiny_hybrid` writes an ``lfm2`` model: LFM2's gated short-convolution
  layers (recurrent: a conv state per sequence) interleaved with grouped-query attention
  layers (a KV cache), so ``llama_model_is_hybrid`` is true and the memory is llama.cpp's
  *hybrid* memory (``llama_memory_hybrid``: a KV cache for the attention layers plus a
  recurrent memory for the conv layers).

Why these architectures. ``mamba`` is the recurrent architecture with the fewest and
plainest tensors (nine per layer, no LoRA-style mixers as in RWKV, no grouped norm or
group count as in ``mamba2``); its only delicate parameters are the SSM ones, set as
Mamba itself initialises them (see :func:`write_tiny_mamba`). ``lfm2`` is the hybrid with
the fewest and plainest tensors: a recurrent layer is three matrices (``in_proj``, the
depthwise ``conv`` and ``out_proj``) with no parameter that needs special care, and an
attention layer is a Llama one plus Q/K RMS norms; which layers are which is read from the
per-layer ``head_count_kv`` array (0 = recurrent). The others are heavier: ``jamba`` needs
full Mamba blocks plus three extra norms, ``granitehybrid``/``nemotron_h``/``falcon-h1``
need Mamba-2 blocks (and more multipliers or MLP layers), ``plamo2`` has yet more. LFM2 is
also one of the architectures with recurrent partial rollback (a context made with
``n_rs_seq > 0`` keeps that many earlier conv states per sequence).

As with the llama model, the weights are random F32 values drawn from
``numpy.random.default_rng(seed)`` (scaled by 0.02; norm weights are ones), the output is
gibberish but finite, the tokenizer is the same SentencePiece-style ``llama`` vocabulary
(:data:`~llama_cffi._tiny_model.TOKENS` and friends, with the same special ids and ChatML
template), and the same arguments always give a byte-identical file of a few hundred KB.

Writing needs the ``gguf`` package (a test dependency).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from .._args import expect_int, expect_iterable, expect_path
from ._tiny_model import (
    CHATML_TEMPLATE,
    N_VOCAB,
    F32Array,
    Weights,
    _import_gguf,
    add_tiny_vocab,
    expect_ints,
    expect_writer_options,
    finish,
    rope_head_dim,
)

__all__ = ["write_tiny_hybrid", "write_tiny_mamba"]


#: Standard deviation of the random weights (the usual transformer init).
_STD = 0.02


class _Weights(Weights):
    """:class:`~llama_cffi._tiny_model.Weights` with Mamba's initialisations."""

    def dt_bias(self, n: int, dt_min: float = 1e-3, dt_max: float = 0.1) -> F32Array:
        """Mamba's ``dt_proj.bias`` init: ``softplus^-1(dt)`` for ``dt`` log-uniform in
        ``[dt_min, dt_max]``, so the step ``softplus(dt_proj(x) + bias)`` starts small and
        positive (the state decays slowly and stays finite)."""
        u = self.rng.random(n)
        dt = np.exp(u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = np.maximum(dt, 1e-4)
        inv_softplus = dt + np.log(-np.expm1(-dt))
        return inv_softplus.astype(np.float32)


def _begin(gguf: Any, path: Path, arch: str, name: str, n_ctx_train: int, n_embd: int, n_layer: int) -> Any:
    """A ``GGUFWriter`` for ``arch`` with the general keys every model carries."""
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_vocab_size(N_VOCAB)
    return writer


def write_tiny_mamba(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    n_embd: int = 64,
    n_layer: int = 2,
    d_state: int = 16,
    d_conv: int = 4,
    dt_rank: int | None = None,
    n_ctx_train: int = 256,
    chat_template: str | None = CHATML_TEMPLATE,
    add_space_prefix: bool = False,
    extra_metadata: dict[str, Any] | None = None,
) -> Path:
    """Write a tiny random-weight ``mamba`` (Mamba-1) GGUF to ``path``; return it as a ``Path``.

    A purely recurrent model: ``n_layer`` selective-SSM blocks (RMS norm, ``ssm_in``
    projection to ``x`` and the gate ``z``, a causal depthwise conv of width ``d_conv``,
    the selective scan with ``d_state`` states per channel, ``ssm_out``), a final RMS norm
    and an untied output matrix. ``d_inner`` is ``2 * n_embd`` (llama.cpp supports no
    other expansion factor); ``dt_rank`` defaults to ``ceil(n_embd / 16)`` as in Mamba.

    The parameters the scan needs to stay finite are initialised as Mamba does rather
    than at random: ``A = -[1, 2, ..., d_state]`` for every channel (stored already
    negated, as ``convert_hf_to_gguf.py`` writes ``-exp(A_log)``; the state then decays by
    ``exp(softplus(dt) * A) < 1`` each step), ``D = 1``, and the ``dt`` bias
    ``softplus^-1`` of a step log-uniform in ``[0.001, 0.1]``. Everything else is
    Normal(0, 0.02) (norm weights are ones).

    ``chat_template``, ``add_space_prefix`` and ``extra_metadata`` are as in
    :func:`~llama_cffi._tiny_model.write_tiny_model`. Same arguments, same bytes.
    """
    path = expect_path("path", path)
    expect_ints(seed=seed, n_embd=n_embd, n_layer=n_layer, d_state=d_state, d_conv=d_conv, n_ctx_train=n_ctx_train)
    if dt_rank is not None:
        expect_int("dt_rank", dt_rank, "an int >= 1 or None")
    expect_writer_options(chat_template=chat_template, add_space_prefix=add_space_prefix, extra_metadata=extra_metadata)
    if n_embd <= 0 or n_layer <= 0 or d_state <= 0:
        raise ValueError("n_embd, n_layer and d_state must be positive")
    if d_conv < 2:
        raise ValueError(f"d_conv ({d_conv}) must be at least 2")
    d_inner = 2 * n_embd
    if dt_rank is None:
        dt_rank = math.ceil(n_embd / 16)
    if dt_rank <= 0:
        raise ValueError(f"dt_rank ({dt_rank}) must be positive")

    gguf = _import_gguf()
    path = Path(path)
    w = _Weights(seed)

    writer = _begin(gguf, path, "mamba", f"tiny-mamba-test-seed{seed}", n_ctx_train, n_embd, n_layer)
    # no attention, no feed-forward (as convert_hf_to_gguf.py writes Mamba models)
    writer.add_feed_forward_length(0)
    writer.add_head_count(0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_ssm_conv_kernel(d_conv)
    writer.add_ssm_inner_size(d_inner)
    writer.add_ssm_state_size(d_state)
    writer.add_ssm_time_step_rank(dt_rank)
    writer.add_ssm_dt_b_c_rms(False)
    add_tiny_vocab(writer, add_space_prefix=add_space_prefix, chat_template=chat_template)

    # S4D-real init, the same for every channel: A[c, s] = -(s + 1)
    a = np.tile(-np.arange(1, d_state + 1, dtype=np.float32), (d_inner, 1))

    # Tensors, in a fixed order (the order the random numbers are drawn in).
    writer.add_tensor("token_embd.weight", w.rand(N_VOCAB, n_embd))
    for i in range(n_layer):
        blk = f"blk.{i}"
        writer.add_tensor(f"{blk}.attn_norm.weight", w.ones(n_embd))
        writer.add_tensor(f"{blk}.ssm_in.weight", w.rand(2 * d_inner, n_embd))
        writer.add_tensor(f"{blk}.ssm_conv1d.weight", w.rand(d_inner, d_conv))
        writer.add_tensor(f"{blk}.ssm_conv1d.bias", w.rand(d_inner))
        writer.add_tensor(f"{blk}.ssm_x.weight", w.rand(dt_rank + 2 * d_state, d_inner))
        writer.add_tensor(f"{blk}.ssm_dt.weight", w.rand(d_inner, dt_rank))
        writer.add_tensor(f"{blk}.ssm_dt.bias", w.dt_bias(d_inner))
        writer.add_tensor(f"{blk}.ssm_a", a.copy())
        writer.add_tensor(f"{blk}.ssm_d", np.ones(d_inner, dtype=np.float32))
        writer.add_tensor(f"{blk}.ssm_out.weight", w.rand(n_embd, d_inner))
    writer.add_tensor("output_norm.weight", w.ones(n_embd))
    writer.add_tensor("output.weight", w.rand(N_VOCAB, n_embd))

    finish(writer, extra_metadata)
    return path


def write_tiny_hybrid(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    n_embd: int = 64,
    n_layer: int = 2,
    attn_layers: Iterable[int] = (1,),
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    conv_l_cache: int = 3,
    n_ctx_train: int = 256,
    chat_template: str | None = CHATML_TEMPLATE,
    add_space_prefix: bool = False,
    extra_metadata: dict[str, Any] | None = None,
) -> Path:
    """Write a tiny random-weight ``lfm2`` hybrid GGUF to ``path``; return it as a ``Path``.

    ``n_layer`` layers, each an operator block followed by a SwiGLU feed-forward block
    (``n_ff``), both pre-RMS-normed and residual. The layers listed in ``attn_layers``
    (default: layer 1 of 2) are attention layers: ``n_head`` query heads,
    ``n_head_kv`` key/value heads, Q/K RMS norms and NeoX RoPE; they use the KV cache.
    The others are LFM2 gated short-convolution layers (``in_proj`` to ``B, C, x``, a
    causal depthwise conv of width ``conv_l_cache`` over ``B * x``, times ``C``,
    ``out_proj``); they use the recurrent memory (a conv state of ``conv_l_cache - 1``
    columns per sequence). Both kinds must be present, so ``attn_layers`` must name at
    least one layer and not all of them.

    The weights are Normal(0, 0.02), the norm weights ones; nothing here needs a special
    init (the short conv has no decay or step parameters). The output matrix is untied.
    ``chat_template``, ``add_space_prefix`` and ``extra_metadata`` are as in
    :func:`~llama_cffi._tiny_model.write_tiny_model`. Same arguments, same bytes.
    """
    path = expect_path("path", path)
    expect_ints(
        seed=seed, n_embd=n_embd, n_layer=n_layer, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
        conv_l_cache=conv_l_cache, n_ctx_train=n_ctx_train,
    )  # fmt: skip
    layers = list(expect_iterable("attn_layers", attn_layers, "an iterable of layer indices (ints)"))
    for il in layers:
        expect_int("attn_layers", il, "an iterable of layer indices (ints)")
    expect_writer_options(chat_template=chat_template, add_space_prefix=add_space_prefix, extra_metadata=extra_metadata)
    if n_embd <= 0 or n_layer <= 0 or n_ff <= 0:
        raise ValueError("n_embd, n_layer and n_ff must be positive")
    attn = sorted(set(layers))
    if not attn or any(not 0 <= il < n_layer for il in attn):
        raise ValueError(f"attn_layers ({attn}) must name at least one layer in [0, {n_layer})")
    if len(attn) == n_layer:
        raise ValueError(f"attn_layers ({attn}) names every layer; a hybrid needs a recurrent one")
    head_dim = rope_head_dim(n_embd, n_head, n_head_kv)
    if conv_l_cache < 2:
        raise ValueError(f"conv_l_cache ({conv_l_cache}) must be at least 2")

    gguf = _import_gguf()
    path = Path(path)
    w = _Weights(seed)
    is_attn = [il in attn for il in range(n_layer)]

    writer = _begin(gguf, path, "lfm2", f"tiny-lfm2-test-seed{seed}", n_ctx_train, n_embd, n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    # per layer: 0 marks a recurrent (short-conv) layer
    writer.add_head_count_kv([n_head_kv if a else 0 for a in is_attn])
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_shortconv_l_cache(conv_l_cache)
    add_tiny_vocab(writer, add_space_prefix=add_space_prefix, chat_template=chat_template)

    # Tensors, in a fixed order (the order the random numbers are drawn in).
    n_kv = n_head_kv * head_dim
    writer.add_tensor("token_embd.weight", w.rand(N_VOCAB, n_embd))
    for i in range(n_layer):
        blk = f"blk.{i}"
        writer.add_tensor(f"{blk}.attn_norm.weight", w.ones(n_embd))
        if is_attn[i]:
            writer.add_tensor(f"{blk}.attn_q.weight", w.rand(n_embd, n_embd))
            writer.add_tensor(f"{blk}.attn_k.weight", w.rand(n_kv, n_embd))
            writer.add_tensor(f"{blk}.attn_v.weight", w.rand(n_kv, n_embd))
            writer.add_tensor(f"{blk}.attn_q_norm.weight", w.ones(head_dim))
            writer.add_tensor(f"{blk}.attn_k_norm.weight", w.ones(head_dim))
            writer.add_tensor(f"{blk}.attn_output.weight", w.rand(n_embd, n_embd))
        else:
            writer.add_tensor(f"{blk}.shortconv.in_proj.weight", w.rand(3 * n_embd, n_embd))
            writer.add_tensor(f"{blk}.shortconv.conv.weight", w.rand(n_embd, conv_l_cache))
            writer.add_tensor(f"{blk}.shortconv.out_proj.weight", w.rand(n_embd, n_embd))
        writer.add_tensor(f"{blk}.ffn_norm.weight", w.ones(n_embd))
        writer.add_tensor(f"{blk}.ffn_gate.weight", w.rand(n_ff, n_embd))
        writer.add_tensor(f"{blk}.ffn_down.weight", w.rand(n_embd, n_ff))
        writer.add_tensor(f"{blk}.ffn_up.weight", w.rand(n_ff, n_embd))
    # LFM2's final norm is stored as "token_embd_norm" (llama.cpp's LLM_TENSOR_OUTPUT_NORM_LFM2)
    writer.add_tensor("token_embd_norm.weight", w.ones(n_embd))
    writer.add_tensor("output.weight", w.rand(N_VOCAB, n_embd))

    finish(writer, extra_metadata)
    return path
