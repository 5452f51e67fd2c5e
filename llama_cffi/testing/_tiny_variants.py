"""More tiny, deterministic, random-weight GGUF models: sliding-window and quantized.

Companions of :func:`llama_cffi._tiny_model.write_tiny_model` for tests that need a
model *kind* the plain tiny llama is not:

* :func:`write_tiny_swa` writes a tiny ``gemma3`` whose layers mix sliding-window
  attention (SWA) and global attention, so that llama.cpp gives its contexts the
  interleaved-SWA KV cache (``llama_kv_cache_iswa``: a full-size cache for the global
  layers plus a window-sized one for the SWA layers, see ``swa_full``). The window is
  small (8 tokens by default) so that short prompts cross it.

  Why ``gemma3`` and not ``llama``: at the pinned llama.cpp commit the ``llama``
  architecture reads no SWA metadata (``llama_model_llama::load_arch_hparams`` never
  looks at ``*.attention.sliding_window``), so its ``swa_type`` stays NONE and it gets
  the plain ``llama_kv_cache``. ``gemma3`` reads ``gemma3.attention.sliding_window``
  (``n_swa``) and, when it is > 0, sets ``LLAMA_SWA_TYPE_STANDARD`` and the per-layer
  pattern from ``gemma3.attention.sliding_window_pattern`` (a uint32 ``n``: layer ``il``
  is SWA when ``il % n < n - 1``, ``n == 0`` making every layer SWA; or a bool array,
  one entry per layer); its graph then uses ``build_attn_inp_kv_iswa``. It is also a
  small, plain architecture (RMS norms, Q/K norms, GELU FFN, no biases).

* :func:`write_tiny_quantized` writes the *same* tiny llama as ``write_tiny_model``
  (same shapes, same seed-derived weights) with its 2-D weight matrices quantized to
  ``Q8_0`` or ``Q4_0`` by ``gguf.quants.quantize`` (norms stay F32) and
  ``general.file_type`` set to match. It writes the F32 model with ``write_tiny_model``
  into a temporary directory and re-writes it quantized, so the tensor list lives in
  one place only. On x86 with AVX2, llama.cpp's CPU backend repacks ``Q4_0`` weight
  matrices used by matrix products and having a multiple of 8 rows into its
  ``CPU_REPACK`` buffer (``q4_0_8x8``): with the default shapes the 14 attention/FFN
  matrices, not ``token_embd`` (read by row lookup) nor ``output`` (474 rows).
  ``Q8_0`` repacks only on ARM (NEON dotprod / i8mm) and RISC-V, so on x86 it takes
  the plain CPU path.

Both keep the tiny llama's SentencePiece ("llama") vocabulary: :func:`write_tiny_swa`
takes the ``tokenizer.*`` metadata from a small layer-less model written by
``write_tiny_model`` itself, so the vocabularies cannot drift apart. As with
``write_tiny_model``, the same arguments always give a byte-identical file, and the
``gguf`` package is needed (imported when called).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np

from .._args import expect_path, expect_str
from ._tiny_model import (
    CHATML_TEMPLATE,
    N_VOCAB,
    Weights,
    _import_gguf,
    add_attention,
    add_tiny_vocab,
    expect_ints,
    expect_writer_options,
    finish,
    rope_head_dim,
    write_tiny_model,
)

__all__ = [
    "QUANT_TYPES",
    "write_tiny_quantized",
    "write_tiny_swa",
]

#: The ``qtype`` values :func:`write_tiny_quantized` accepts.
QUANT_TYPES: tuple[str, ...] = ("q8_0", "q4_0")

_QuantName = Literal["q8_0", "q4_0"]

#: Elements per quantization block of ``Q8_0`` and ``Q4_0`` (``QK8_0 == QK4_0 == 32``).
_QK = 32


class _KV(NamedTuple):
    """One metadata entry as read back from a GGUF file."""

    key: str
    value: Any
    vtype: Any  # gguf.GGUFValueType
    sub_type: Any  # gguf.GGUFValueType | None


def _read_gguf(path: Path) -> tuple[str, list[_KV], list[tuple[str, np.ndarray[Any, Any]]]]:
    """Architecture, metadata (file order, without the ``GGUF.*`` header fields and
    ``general.architecture``) and tensors (file order, numpy-shaped copies) of a GGUF file."""
    gguf = _import_gguf()
    reader = gguf.GGUFReader(path)
    arch = ""
    kvs: list[_KV] = []
    for field in reader.fields.values():
        if field.name.startswith("GGUF."):
            continue
        if field.name == "general.architecture":
            arch = str(field.contents())
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        kvs.append(_KV(field.name, field.contents(), vtype, sub_type))
    tensors = [(t.name, np.array(t.data)) for t in reader.tensors]
    del reader  # drop the memory map before the file may go away
    return arch, kvs, tensors


def write_tiny_swa(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    sliding_window: int = 8,
    swa_pattern: int | Sequence[bool] = 2,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_ctx_train: int = 256,
    chat_template: str | None = CHATML_TEMPLATE,
    add_space_prefix: bool = False,
    extra_metadata: dict[str, Any] | None = None,
) -> Path:
    """Write a tiny random-weight ``gemma3`` GGUF with sliding-window layers to ``path``.

    ``sliding_window`` is the window in tokens (``gemma3.attention.sliding_window``;
    llama.cpp's standard SWA: a query at position ``p`` sees keys at ``p - window + 1 .. p``).
    ``swa_pattern`` says which layers use it (``gemma3.attention.sliding_window_pattern``):
    an int ``n`` (written as uint32; layer ``il`` is SWA when ``il % n < n - 1``, ``0``
    makes every layer SWA; the default 2 makes even layers SWA and odd layers global, so
    with two layers: layer 0 SWA, layer 1 global) or a sequence of ``n_layer`` bools
    (written as a bool array). At least one layer must be SWA: llama.cpp asserts
    (aborts the process) on an SWA model without SWA layers.

    llama.cpp pads the SWA half of the cache to a multiple of 256 cells
    (``min(n_ctx, n_swa + n_ubatch)`` rounded up; ``n_swa * n_seq_max`` with a unified
    cache), so with ``n_ctx <= 256`` it is as large as the full half whatever
    ``swa_full`` says, and ``memory.can_shift`` stays True. A context such as
    ``n_ctx=1024, n_batch=64, n_ubatch=64, swa_full=False`` gets a smaller SWA cache
    (256 cells): ``can_shift`` is then False and cells of positions that left the window
    are reused once the 256 cells are full.

    Weights are F32 from ``numpy.random.default_rng(seed)`` (std 0.02; norms are ones);
    the output projection is tied to ``token_embd`` as in Gemma 3. The vocabulary,
    ``chat_template``, ``add_space_prefix`` and ``extra_metadata`` (added last, see
    :func:`llama_cffi._tiny_model._set_kv`) are as in ``write_tiny_model``. Returns
    ``path`` as a ``Path``; the same arguments give a byte-identical file.
    """
    path = expect_path("path", path)
    expect_ints(
        seed=seed, sliding_window=sliding_window, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
        n_head_kv=n_head_kv, n_ff=n_ff, n_ctx_train=n_ctx_train,
    )  # fmt: skip
    expect_writer_options(chat_template=chat_template, add_space_prefix=add_space_prefix, extra_metadata=extra_metadata)
    if sliding_window < 1:
        raise ValueError(f"sliding_window ({sliding_window}) must be >= 1")
    head_dim = rope_head_dim(n_embd, n_head, n_head_kv)
    if n_layer < 1:
        raise ValueError(f"n_layer ({n_layer}) must be >= 1")
    if isinstance(swa_pattern, bool) or not isinstance(swa_pattern, (int, Sequence)):
        raise TypeError(f"swa_pattern must be an int or a sequence of bools, not {swa_pattern!r}")
    if isinstance(swa_pattern, int):
        if swa_pattern < 0:
            raise ValueError(f"swa_pattern ({swa_pattern}) must be >= 0")
        is_swa = [swa_pattern == 0 or il % swa_pattern < swa_pattern - 1 for il in range(n_layer)]
    else:
        is_swa = [bool(x) for x in swa_pattern]
        if len(is_swa) != n_layer:
            raise ValueError(f"swa_pattern has {len(is_swa)} entries, n_layer is {n_layer}")
    if not any(is_swa):
        raise ValueError(f"swa_pattern {swa_pattern!r} makes no layer of {n_layer} sliding-window")

    gguf = _import_gguf()
    path = Path(path)
    w = Weights(seed)
    rand, ones = w.rand, w.ones

    writer = gguf.GGUFWriter(path, "gemma3")
    writer.add_name(f"tiny-gemma3-swa-test-seed{seed}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_freq_base_swa(10000.0)
    writer.add_sliding_window(sliding_window)
    writer.add_sliding_window_pattern(swa_pattern if isinstance(swa_pattern, int) else is_swa)
    add_tiny_vocab(writer, add_space_prefix=add_space_prefix, chat_template=chat_template)

    # Tensors, in a fixed order (the order the random numbers are drawn in).
    n_q = n_head * head_dim
    n_kv = n_head_kv * head_dim
    writer.add_tensor("token_embd.weight", rand(N_VOCAB, n_embd))
    for i in range(n_layer):
        blk = f"blk.{i}"
        add_attention(writer, blk, w, n_embd, n_q, n_kv)
        writer.add_tensor(f"{blk}.attn_q_norm.weight", ones(head_dim))
        writer.add_tensor(f"{blk}.attn_k_norm.weight", ones(head_dim))
        writer.add_tensor(f"{blk}.post_attention_norm.weight", ones(n_embd))
        writer.add_tensor(f"{blk}.ffn_norm.weight", ones(n_embd))
        writer.add_tensor(f"{blk}.ffn_gate.weight", rand(n_ff, n_embd))
        writer.add_tensor(f"{blk}.ffn_up.weight", rand(n_ff, n_embd))
        writer.add_tensor(f"{blk}.ffn_down.weight", rand(n_embd, n_ff))
        writer.add_tensor(f"{blk}.post_ffw_norm.weight", ones(n_embd))
    writer.add_tensor("output_norm.weight", ones(n_embd))
    finish(writer, extra_metadata)
    return path


def write_tiny_quantized(
    path: str | os.PathLike[str],
    *,
    qtype: _QuantName = "q8_0",
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
) -> Path:
    """Write ``write_tiny_model``'s tiny llama with ``Q8_0``/``Q4_0`` weights to ``path``.

    The model is the one ``write_tiny_model`` writes for the same ``seed`` and shapes
    (its F32 weights, quantized): every 2-D tensor (``token_embd``, ``output`` and the
    attention/FFN matrices) becomes ``qtype`` (``"q8_0"`` or ``"q4_0"``, see
    ``QUANT_TYPES``); the 1-D norms stay F32. ``general.file_type`` is
    ``MOSTLY_Q8_0`` (7) or ``MOSTLY_Q4_0`` (2) and ``general.name`` says the type (both
    replaced in place, so the metadata keeps ``write_tiny_model``'s order and types).
    Rows are quantized in blocks of 32, so ``n_embd`` and ``n_ff`` must be multiples of
    32. ``extra_metadata`` is added as in ``write_tiny_model``; a ``general.name`` there
    wins, while ``general.file_type`` always matches ``qtype``. Returns ``path`` as a
    ``Path``; the same arguments give a byte-identical file.
    """
    path = expect_path("path", path)
    expect_str("qtype", qtype, f"one of {', '.join(QUANT_TYPES)} (a str)")
    expect_ints(
        seed=seed, n_embd=n_embd, n_layer=n_layer, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
        n_ctx_train=n_ctx_train,
    )  # fmt: skip
    expect_writer_options(chat_template=chat_template, add_space_prefix=add_space_prefix, extra_metadata=extra_metadata)
    if qtype not in QUANT_TYPES:
        raise ValueError(f"qtype must be one of {', '.join(QUANT_TYPES)}, not {qtype!r}")
    for name, value in (("n_embd", n_embd), ("n_ff", n_ff)):
        if value % _QK:
            raise ValueError(f"{name} ({value}) must be a multiple of {_QK} (the {qtype} block size)")

    gguf = _import_gguf()
    path = Path(path)
    ggml_type = gguf.GGMLQuantizationType.Q8_0 if qtype == "q8_0" else gguf.GGMLQuantizationType.Q4_0
    file_type = gguf.LlamaFileType.MOSTLY_Q8_0 if qtype == "q8_0" else gguf.LlamaFileType.MOSTLY_Q4_0
    # replaced in place (same key order and value types as write_tiny_model's file)
    overrides: dict[str, Any] = {"general.file_type": int(file_type)}
    if "general.name" not in (extra_metadata or {}):
        overrides["general.name"] = f"tiny-llama-{qtype}-test-seed{seed}"

    with tempfile.TemporaryDirectory(prefix="llama_cffi_tiny_") as tmp:
        src = write_tiny_model(
            Path(tmp) / "f32.gguf",
            seed=seed,
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_head,
            n_head_kv=n_head_kv,
            n_ff=n_ff,
            n_ctx_train=n_ctx_train,
            chat_template=chat_template,
            add_space_prefix=add_space_prefix,
            extra_metadata=extra_metadata,
        )
        arch, kvs, tensors = _read_gguf(src)

    writer = gguf.GGUFWriter(path, arch)
    for kv in kvs:
        writer.add_key_value(kv.key, overrides.get(kv.key, kv.value), kv.vtype, kv.sub_type)
    for name, data in tensors:
        if data.ndim == 2:
            writer.add_tensor(name, gguf.quants.quantize(data, ggml_type), raw_dtype=ggml_type)
        else:
            writer.add_tensor(name, data)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
