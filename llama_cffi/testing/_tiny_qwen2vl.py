"""A tiny random-weight M-RoPE vision-language pair: a Qwen2-VL text model and its image
projector, for tests of multimodal rotary positions ("M-RoPE") that must not download a
model. Line numbers are those of the pinned llama.cpp source.

* :func:`write_tiny_qwen2vl_model` writes a text model of llama.cpp architecture
  ``qwen2vl`` (Qwen2-VL's language model): Qwen2's tensors (RMS norms, q/k/v biases, a
  SwiGLU FFN) and the ``qwen2vl.rope.dimension_sections`` key, which the architecture
  requires (``src/models/qwen2vl.cpp:4``: ``get_key_or_arr(..., 4, true)``, an array of
  exactly 4 int32/uint32, ``src/llama-model-loader.cpp:365-379``). llama.cpp gives
  ``qwen2vl`` the rope type ``LLAMA_ROPE_TYPE_MROPE`` (``src/llama-model.cpp:3187-3189``),
  so every token carries 4 position components (time, height, width, extra); the graph
  asserts that the rotary width ``n_rot`` is the head dimension (``qwen2vl.cpp:45-46``)
  and hands the sections to ``ggml_rope_multi``, which cycles over pairs of dimensions
  (``sector = (i0 / 2) % sum(sections)``, ``ggml-cpu/ops.cpp:6229-6237``): the converter
  writes Qwen2-VL's ``mrope_section`` (``[16, 24, 24]`` for a head of 128), padded to 4
  with 0 (``conversion/base.py:1497-1502``), so the sections sum to ``n_rot / 2``. The
  default here keeps those proportions: a quarter of the pairs for time, the rest split
  between height and width (``[2, 3, 3, 0]`` for the default head of 16).
  The q/k/v biases are optional for llama.cpp (``llama-model.cpp:3428-3430``) but real
  Qwen2 files have them, so they are written (random, so that they matter).
  At the pinned commit the ``qwen2vl`` loader reads no ``attention.layer_norm_rms_eps``
  (``qwen2vl.cpp:3-5`` reads the sections only; ``qwen2.cpp:4`` reads the epsilon), so
  ``f_norm_rms_eps`` stays 0 (``llama_hparams hparams = {}``, ``src/llama-model.h:637``);
  the key is written anyway, as real files have it.

  The vocabulary is the tiny SentencePiece one of :mod:`._tiny_model` (same ids) plus
  Qwen2-VL's ``<|vision_start|>`` and ``<|vision_end|>`` (CONTROL, ids
  :data:`VISION_START_ID` and :data:`VISION_END_ID`, last): libmtmd wraps every image of a
  Qwen-VL projector in those two strings and tokenizes them with ``parse_special``
  (``tools/mtmd/mtmd.cpp:694-702``, ``1360-1361``), so they become one token each, as
  with the real vocabulary. (Without them in the vocabulary they would be tokenized as
  plain text, which works too, but takes a dozen tokens each.)

* :func:`write_tiny_qwen2vl_mmproj` writes an image projector of type ``qwen2vl_merger``
  (``PROJECTOR_TYPE_QWEN2VL``, ``tools/mtmd/clip-impl.h:452,519``): Qwen2-VL's vision
  transformer (two conv2d patch embeddings, the halves of its temporal-patch-2 conv3d,
  ``conversion/qwenvl.py:117-119``; pre-norm blocks with LayerNorm, biased q/k/v/out and
  a quick-GELU MLP; 2D M-RoPE inside attention) and its patch merger (a LayerNorm, every
  2x2 patches concatenated, then Linear-GELU-Linear to ``n_embd_text``).

What clip.cpp requires (``tools/mtmd``), and why: integer keys as uint32 and the epsilon
as float32 (its readers assert the exact GGUF type); ``image_size`` and ``patch_size``
(read for every vision projector, ``clip.cpp:1319-1320``; ``image_size`` is otherwise
unused by Qwen2-VL, whose images keep their own size); no ``v.patch_embd.bias`` and no
class embedding (``models/qwen2vl.cpp:33-34`` asserts both absent); the second patch
embedding ``v.patch_embd.weight.1`` (``clip.cpp:2263``; ``qwen2vl.cpp:15-16`` adds both
convolutions for a still image); per layer ``attn_q/k/v`` weights and biases (the graph
adds the biases unconditionally, ``qwen2vl.cpp:114-119``), ``attn_out``, ``ln1``, ``ln2``,
``ffn_up`` and ``ffn_down`` (``clip.cpp:2280-2316``); ``v.post_ln`` (the merger's
``ln_q``, ``clip.cpp:2258-2259``) and ``mm.0`` / ``mm.2`` weights and biases
(``clip.cpp:2496-2503``). Shapes: a head dimension divisible by 4 (the vision M-RoPE gives
each of its 4 sections ``d_head / 4``, ``qwen2vl.cpp:46``), ``n_ff != n_embd`` (clip.cpp
swaps the FFN weights of legacy files whose ``ffn_down`` is ``n_embd`` wide,
``clip.cpp:2335-2349``), ``mm.0`` of ``4 * n_embd`` squared: the merge is fixed at 2x2 in
the graph (``qwen2vl.cpp:6-7, 52-62, 181``), so no ``spatial_merge_size`` key is written
(clip.cpp's default is 2, ``clip.cpp:1673``). The output width libmtmd compares with the
text model's ``n_embd`` is ``mm.2.bias``'s length (``clip.cpp:5992-5997``).

Image sizes: for Qwen2-VL, clip.cpp fixes the token budget at 8 to 4,096 merged tokens
(``set_limit_image_tokens(8, 4096)``, ``clip.cpp:1677``; ``clip-model.h:192-197``): it does
*not* read the ``clip.vision.image_min_pixels`` / ``image_max_pixels`` keys for this
projector type (only other types read them, e.g. ``clip.cpp:1530-1531``), so
the only ways to bound the tokens of a large image are ``patch_size`` here and the
context's ``image_min_tokens`` / ``image_max_tokens`` (``--image-max-tokens`` in the CLI).
An image is resized, keeping its aspect ratio, to multiples of ``2 * patch_size``
(rounded, then scaled up to at least 8 tokens' worth of pixels or down to at most 4,096,
``mtmd-image.cpp:122-153,772-793``), and becomes ``(w / 2p) * (h / 2p)`` tokens of
``n_pos = max(w / 2p, h / 2p)`` positions (M-RoPE: the image advances the position by its
larger side in merged patches, not by its token count, ``mtmd.cpp:2536``). With the default
``patch_size=14``: a 56x56 or 64x64 image becomes 84x84, 3x3 = 9 tokens, ``n_pos`` 3;
``tools/mtmd/test-1.jpeg`` (640x488) becomes 644x476, 23x17 = 391 tokens, ``n_pos`` 23.
The warm-up reserves the graph for 46x46 merged tokens (``clip.cpp:1679``): 8,464
patches; it allocates buffers but computes nothing.

Weights are float32, drawn from ``numpy.random.default_rng(seed)``: the same arguments give
the same bytes. The ``gguf`` package is imported when a writer is called.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._args import expect_int, expect_iterable, expect_number, expect_path
from ._tiny_mmproj import _add, _expect_rgb, _finish, _layer, _positive, _Rand, _vision_header, _writer
from ._tiny_model import (
    CHATML_TEMPLATE,
    N_VOCAB,
    SCORES,
    TOKEN_TYPES,
    TOKENS,
    Weights,
    _import_gguf,
    _set_kv,
    add_attention,
    add_tiny_vocab,
    expect_ints,
    expect_writer_options,
    finish,
    rope_head_dim,
)

__all__ = [
    "QWEN2VL_N_VOCAB",
    "QWEN2VL_TOKENS",
    "VISION_END_ID",
    "VISION_START_ID",
    "write_tiny_qwen2vl_mmproj",
    "write_tiny_qwen2vl_model",
]

_CONTROL = 3  # gguf.TokenType.CONTROL

#: The tiny vocabulary (:data:`~._tiny_model.TOKENS`) plus Qwen2-VL's image markers.
QWEN2VL_TOKENS: list[str] = [*TOKENS, "<|vision_start|>", "<|vision_end|>"]
_QWEN2VL_SCORES: list[float] = [*SCORES, 0.0, 0.0]
_QWEN2VL_TYPES: list[int] = [*TOKEN_TYPES, _CONTROL, _CONTROL]
QWEN2VL_N_VOCAB: int = len(QWEN2VL_TOKENS)
VISION_START_ID: int = N_VOCAB
VISION_END_ID: int = N_VOCAB + 1

#: OpenAI CLIP's normalization, which Qwen2-VL's image processor uses.
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def _default_sections(n_pairs: int) -> list[int]:
    """Qwen2-VL's proportions (``[16, 24, 24]`` of 64 pairs): a quarter for time, the rest
    split between height and width; the fourth section 0."""
    t = n_pairs // 4
    h = (n_pairs - t) // 2
    return [t, h, n_pairs - t - h, 0]


def write_tiny_qwen2vl_model(
    path: str | os.PathLike[str],
    *,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    seed: int = 0,
    n_ctx_train: int = 4096,
    rope_sections: Sequence[int] | None = None,
    chat_template: str | None = CHATML_TEMPLATE,
    extra_metadata: dict[str, Any] | None = None,
) -> Path:
    """Write a tiny random-weight ``qwen2vl`` text model to ``path`` and return it as a
    ``Path``.

    ``rope_sections``: the 4 M-RoPE sections (time, height, width, extra), which must sum
    to half the head dimension ``n_embd / n_head`` (default: Qwen2-VL's proportions, see
    the module docstring). The vocabulary is ``QWEN2VL_TOKENS`` (of this module).
    ``n_ctx_train`` is 4,096 by default so that an image of a few hundred tokens fits the CLI's default
    context. ``extra_metadata`` maps GGUF keys to values added last (see
    :func:`~._tiny_model._set_kv`)."""
    path = Path(expect_path("path", path))
    for k, v in (("n_layer", n_layer), ("n_ff", n_ff), ("n_ctx_train", n_ctx_train)):
        _positive(k, v)
    expect_ints(n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, seed=seed)
    if rope_sections is not None:
        what = "a sequence of 4 ints (time, height, width, extra) or None"
        for x in expect_iterable("rope_sections", rope_sections, what):
            expect_int("rope_sections", x, what)
    expect_writer_options(chat_template=chat_template, extra_metadata=extra_metadata)
    head_dim = rope_head_dim(n_embd, n_head, n_head_kv)
    if rope_sections is None:
        sections = _default_sections(head_dim // 2)
    else:
        sections = [int(s) for s in rope_sections]
        if len(sections) != 4 or any(s < 0 for s in sections):
            raise ValueError("rope_sections takes 4 non-negative ints (time, height, width, extra)")
    if sum(sections) != head_dim // 2 or not any(sections[:3]):
        raise ValueError(
            f"rope_sections {sections} must sum to half the head dimension ({head_dim // 2}), "
            "with one of the first three non-zero"
        )

    gguf = _import_gguf()
    w = Weights(seed)
    rand = w.rand

    writer = gguf.GGUFWriter(path, "qwen2vl")
    writer.add_name(f"tiny-qwen2vl-test-seed{seed}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(1000000.0)
    writer.add_rope_dimension_sections(sections)  # an INT32 array of 4
    writer.add_vocab_size(QWEN2VL_N_VOCAB)

    add_tiny_vocab(writer, chat_template=chat_template)
    # the shared vocabulary, plus <|vision_start|> / <|vision_end|> (same array types)
    _set_kv(writer, "tokenizer.ggml.tokens", QWEN2VL_TOKENS)
    _set_kv(writer, "tokenizer.ggml.scores", _QWEN2VL_SCORES)
    _set_kv(writer, "tokenizer.ggml.token_type", _QWEN2VL_TYPES)

    n_q = n_head * head_dim
    n_kv = n_head_kv * head_dim
    writer.add_tensor("token_embd.weight", rand(QWEN2VL_N_VOCAB, n_embd))
    for i in range(n_layer):
        blk = f"blk.{i}"
        add_attention(writer, blk, w, n_embd, n_q, n_kv)
        writer.add_tensor(f"{blk}.attn_q.bias", rand(n_q))
        writer.add_tensor(f"{blk}.attn_k.bias", rand(n_kv))
        writer.add_tensor(f"{blk}.attn_v.bias", rand(n_kv))
        writer.add_tensor(f"{blk}.ffn_norm.weight", w.ones(n_embd))
        writer.add_tensor(f"{blk}.ffn_gate.weight", rand(n_ff, n_embd))
        writer.add_tensor(f"{blk}.ffn_down.weight", rand(n_embd, n_ff))
        writer.add_tensor(f"{blk}.ffn_up.weight", rand(n_ff, n_embd))
    writer.add_tensor("output_norm.weight", w.ones(n_embd))
    writer.add_tensor("output.weight", rand(QWEN2VL_N_VOCAB, n_embd))

    finish(writer, extra_metadata)
    return path


def write_tiny_qwen2vl_mmproj(
    path: str | os.PathLike[str],
    n_embd_text: int,
    *,
    seed: int = 0,
    patch_size: int = 14,
    n_embd: int = 32,
    n_head: int = 2,
    n_ff: int = 64,
    n_layer: int = 1,
    image_size: int = 560,
    eps: float = 1e-6,
    image_mean: Sequence[float] = _CLIP_MEAN,
    image_std: Sequence[float] = _CLIP_STD,
) -> Path:
    """Write a tiny ``qwen2vl_merger`` image projector to ``path`` and return it as a
    ``Path``.

    An image is resized to multiples of ``2 * patch_size`` within Qwen2-VL's budget of 8 to
    4,096 tokens, cut into patches of ``patch_size`` pixels, encoded by ``n_layer`` blocks
    of width ``n_embd`` (``n_head`` heads, 2D M-RoPE), and every 2x2 patches are merged into
    one token of width ``n_embd_text`` (the text model's embedding width): a 56x56 image
    gives 9 tokens with the defaults. ``image_size`` is only the file's nominal size (the
    converter's default, 560); clip.cpp keeps each image's own size. Raises ``ValueError``
    for shapes clip.cpp cannot use (see the module docstring)."""
    path = Path(expect_path("path", path))
    for k, v in (("n_embd_text", n_embd_text), ("patch_size", patch_size), ("n_embd", n_embd)):
        _positive(k, v)
    for k, v in (("n_head", n_head), ("n_ff", n_ff), ("n_layer", n_layer), ("image_size", image_size)):
        _positive(k, v)
    expect_ints(seed=seed)
    expect_number("eps", eps)
    _expect_rgb("image_mean", image_mean)
    _expect_rgb("image_std", image_std)
    if n_embd % n_head or (n_embd // n_head) % 4:
        raise ValueError("the head dimension n_embd / n_head must be a multiple of 4 (the vision M-RoPE's 4 sections)")
    if n_ff == n_embd:
        raise ValueError("n_ff must differ from n_embd (clip.cpp swaps the FFN weights of such qwen2vl files)")
    if image_size > 8192:
        raise ValueError("image_size must be at most 8192 (clip.cpp's bound)")
    if len(image_mean) != 3 or len(image_std) != 3:
        raise ValueError("image_mean and image_std take 3 values (R, G, B)")
    gguf = _import_gguf()
    r = _Rand(seed)
    w = _writer(path, "tiny-qwen2vl-mmproj")
    # no use_gelu / use_silu: clip.cpp's default FFN is quick-GELU, Qwen2-VL's activation
    _vision_header(
        w, gguf.VisionProjectorType.QWEN2VL, False, n_embd_text, image_size, patch_size,
        (n_embd, n_ff, n_layer, n_head), eps, image_mean, image_std,
    )  # fmt: skip
    e, f, p = n_embd, n_ff, patch_size
    # the two temporal halves of the conv3d patch embedding; no bias (the graph asserts it)
    _add(w, "v.patch_embd.weight", r.w(e, 3, p, p))
    _add(w, "v.patch_embd.weight.1", r.w(e, 3, p, p))
    for i in range(n_layer):  # pre-norm blocks with biased q/k/v/out, as gemma3's
        _layer(w, r, "v", i, e, f, False)
    # the merger: ln_q, then Linear(4e, 4e), GELU, Linear(4e, n_embd_text)
    _add(w, "v.post_ln.weight", r.norm(e))
    _add(w, "v.post_ln.bias", r.b(e))
    m = 4 * e
    _add(w, "mm.0.weight", r.w(m, m, std=1.0 / math.sqrt(m)))
    _add(w, "mm.0.bias", r.b(m))
    _add(w, "mm.2.weight", r.w(n_embd_text, m, std=1.0 / math.sqrt(m)))
    _add(w, "mm.2.bias", r.b(n_embd_text))
    _finish(w)
    return path
