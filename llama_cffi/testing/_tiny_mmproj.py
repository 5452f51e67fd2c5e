"""Tiny random-weight multimodal projectors ("mmproj" GGUF files) that llama.cpp's libmtmd
(``tools/mtmd/clip.cpp`` at the pinned commit) loads, encodes with and pairs with a text
model whose embedding width is ``n_embd_text``:

* :func:`write_tiny_gemma3_mmproj`: an image projector of type ``gemma3`` (a SigLIP vision
  transformer, an average pool and Gemma 3's RMS-normed linear projection): a 64x64 image
  becomes 8x8 patches and, pooled 2x2, 16 image tokens;
* :func:`write_tiny_ultravox_mmproj`: an audio projector of type ``ultravox`` (a Whisper
  encoder and Ultravox's frame stacking, RMS norms and SwiGLU): every 30 s of 16 kHz audio
  (3,000 mel frames, 1,500 after the encoder's stride-2 convolution) becomes
  ``1500 / stack_factor`` audio tokens (150 by default).

What clip.cpp requires, and why each constraint holds (line numbers of the pinned
``tools/mtmd``): integer keys stored as uint32 and the epsilon as float32 (its readers
assert the exact GGUF type, ``gguf.cpp:196``); the modality flag
(``clip.has_vision_encoder`` / ``clip.has_audio_encoder``); every layer's ``attn_out``,
``ffn_up`` and ``ffn_down`` weights (``clip.cpp:2283-2316``) and the q/k/v weights the
graph multiplies by. gemma3: ``image_size`` divisible by ``patch_size`` and the patch grid
by the pool size (``clip_n_output_tokens`` and the pool must agree), image mean and std
of 3 values, ``n_ff != n_embd`` (clip.cpp swaps the FFN weights of legacy files when
``ffn_down``'s width is ``n_embd``). ultravox: a position table of at least 1,500 rows
(``whisper-enc.cpp:6``), q/v biases and both layer norms present and no k bias
(``whisper-enc.cpp:28-32``), and a stack factor dividing 1,500: otherwise clip.cpp's
token count (``CLIP_ALIGN(3000, s) / s / 2``) and its graph's (``ceil(1500 / s)``)
disagree and ``clip_encode`` aborts (real Ultravox files use 8, which hits that abort at
this commit; :class:`llama_cffi.mtmd.Projector` refuses them). The projector's output width,
which libmtmd compares with the text model's ``n_embd``, is the width of the last
projection (``mm.input_projection`` / ``mm.a.mlp.2``), not the ``projection_dim`` key.

Weights are float32 (the Whisper convolution kernels float16, as the reference converter
writes them), drawn from ``numpy.random.default_rng(seed)``: the same arguments give the
same bytes. The ``gguf`` package is imported when a writer is called.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._args import expect_int, expect_iterable, expect_number, expect_path
from ._tiny_model import _import_gguf, expect_ints

__all__ = ["WHISPER_N_POS", "write_tiny_gemma3_mmproj", "write_tiny_ultravox_mmproj"]

#: Positions of Whisper's encoder after its stride-2 convolution: libmtmd feeds chunks of
#: 3,000 mel frames (30 s at a hop of 160 samples, 16 kHz).
WHISPER_N_POS = 1500


class _Rand:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def w(self, *shape: int, std: float = 0.02) -> np.ndarray[Any, np.dtype[np.float32]]:
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    def norm(self, n: int) -> np.ndarray[Any, np.dtype[np.float32]]:
        return (1.0 + self.rng.standard_normal(n) * 0.02).astype(np.float32)

    def b(self, *shape: int) -> np.ndarray[Any, np.dtype[np.float32]]:
        return (self.rng.standard_normal(shape) * 0.01).astype(np.float32)


def _add(w: Any, name: str, arr: np.ndarray[Any, Any], f16: bool = False) -> None:
    # numpy shapes are ggml's ne reversed: (out, in) is ne [in, out]
    w.add_tensor(name, np.ascontiguousarray(arr.astype(np.float16 if f16 else np.float32)))


def _layer(w: Any, r: _Rand, p: str, i: int, n_embd: int, n_ff: int, whisper: bool) -> None:
    """One pre-norm transformer block (clip.cpp's TN_ATTN_*, TN_LN_*, TN_FFN_* names)."""
    e, f, b = n_embd, n_ff, f"{p}.blk.{i}"
    _add(w, f"{b}.attn_q.weight", r.w(e, e))
    _add(w, f"{b}.attn_q.bias", r.b(e))
    _add(w, f"{b}.attn_k.weight", r.w(e, e))
    if not whisper:  # Whisper has no k bias, and its graph asserts there is none
        _add(w, f"{b}.attn_k.bias", r.b(e))
    _add(w, f"{b}.attn_v.weight", r.w(e, e))
    _add(w, f"{b}.attn_v.bias", r.b(e))
    _add(w, f"{b}.attn_out.weight", r.w(e, e))
    _add(w, f"{b}.attn_out.bias", r.b(e))
    _add(w, f"{b}.ln1.weight", r.norm(e))
    _add(w, f"{b}.ln1.bias", r.b(e))
    _add(w, f"{b}.ffn_up.weight", r.w(f, e))
    _add(w, f"{b}.ffn_up.bias", r.b(f))
    _add(w, f"{b}.ffn_down.weight", r.w(e, f))
    _add(w, f"{b}.ffn_down.bias", r.b(e))
    _add(w, f"{b}.ln2.weight", r.norm(e))
    _add(w, f"{b}.ln2.bias", r.b(e))


def _writer(path: Path, name: str) -> Any:
    gguf = _import_gguf()
    w = gguf.GGUFWriter(os.fspath(path), arch="clip")  # clip.cpp does not read the architecture
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    return w


def _vision_header(
    w: Any,
    projector_type: Any,
    use_gelu: bool,
    n_embd_text: int,
    image_size: int,
    patch_size: int,
    shape: tuple[int, int, int, int],
    eps: float,
    image_mean: Sequence[float],
    image_std: Sequence[float],
) -> None:
    """The keys every vision projector here writes (``shape``: the encoder's width, FFN
    width, blocks and heads), in the order the converter writes them; ``use_gelu=False``
    leaves clip.cpp's default activation (quick-GELU)."""
    n_embd, n_ff, n_layer, n_head = shape
    w.add_clip_projector_type(projector_type)
    w.add_clip_has_vision_encoder(True)
    if use_gelu:
        w.add_vision_use_gelu(True)
    w.add_vision_projection_dim(n_embd_text)
    w.add_vision_image_size(image_size)
    w.add_vision_patch_size(patch_size)
    w.add_vision_embedding_length(n_embd)
    w.add_vision_feed_forward_length(n_ff)
    w.add_vision_block_count(n_layer)
    w.add_vision_head_count(n_head)
    w.add_vision_attention_layernorm_eps(eps)
    w.add_vision_image_mean([float(x) for x in image_mean])
    w.add_vision_image_std([float(x) for x in image_std])


def _finish(w: Any) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _positive(name: str, v: object) -> int:
    n = expect_int(name, v, "an int >= 1")  # a wrong type: TypeError naming the parameter
    if n < 1:
        raise ValueError(f"{name} must be an int >= 1, not {v!r}")
    return n


def _expect_rgb(name: str, v: object) -> None:
    """The TypeError naming ``name`` unless ``v`` is a sequence of numbers (R, G, B)."""
    what = "a sequence of 3 numbers (R, G, B)"
    for x in expect_iterable(name, v, what):
        expect_number(name, x, what)


def write_tiny_gemma3_mmproj(
    path: str | os.PathLike[str],
    n_embd_text: int,
    *,
    seed: int = 0,
    image_size: int = 64,
    patch_size: int = 8,
    tokens_per_side: int = 4,
    n_embd: int = 32,
    n_head: int = 2,
    n_ff: int = 64,
    n_layer: int = 1,
    eps: float = 1e-6,
    image_mean: Sequence[float] = (0.5, 0.5, 0.5),
    image_std: Sequence[float] = (0.5, 0.5, 0.5),
) -> Path:
    """Write a tiny ``gemma3`` image projector to ``path`` and return it as a ``Path``.

    An image is resized to ``image_size`` squared, cut into patches of ``patch_size``
    pixels, encoded by ``n_layer`` SigLIP blocks of width ``n_embd``, average-pooled to
    ``tokens_per_side`` squared tokens and projected to ``n_embd_text`` (the text model's
    embedding width: Gemma 3 270M's is 640). Raises ``ValueError`` for sizes clip.cpp
    cannot use (see the module docstring)."""
    path = Path(expect_path("path", path))
    for k, v in (("n_embd_text", n_embd_text), ("image_size", image_size), ("patch_size", patch_size)):
        _positive(k, v)
    for k, v in (("tokens_per_side", tokens_per_side), ("n_embd", n_embd), ("n_head", n_head), ("n_layer", n_layer)):
        _positive(k, v)
    expect_ints(seed=seed, n_ff=n_ff)
    expect_number("eps", eps)
    _expect_rgb("image_mean", image_mean)
    _expect_rgb("image_std", image_std)
    if image_size % patch_size:
        raise ValueError("image_size must be a multiple of patch_size")
    side = image_size // patch_size
    if side % tokens_per_side:
        raise ValueError("image_size / patch_size must be a multiple of tokens_per_side")
    if n_embd % n_head:
        raise ValueError("n_embd must be a multiple of n_head")
    if n_ff == n_embd:
        raise ValueError("n_ff must differ from n_embd (clip.cpp swaps the FFN weights of such gemma3 files)")
    if len(image_mean) != 3 or len(image_std) != 3:
        raise ValueError("image_mean and image_std take 3 values (R, G, B)")
    gguf = _import_gguf()
    r = _Rand(seed)
    w = _writer(path, "tiny-gemma3-mmproj")
    _vision_header(
        w, gguf.VisionProjectorType.GEMMA3, True, n_embd_text, image_size, patch_size,
        (n_embd, n_ff, n_layer, n_head), eps, image_mean, image_std,
    )  # fmt: skip
    merge = side // tokens_per_side
    if merge != 4:  # clip.cpp's default pool for gemma3; the converter writes the key only otherwise
        w.add_vision_projector_scale_factor(merge)
    e = n_embd
    _add(w, "v.patch_embd.weight", r.w(e, 3, patch_size, patch_size))
    _add(w, "v.patch_embd.bias", r.b(e))
    _add(w, "v.position_embd.weight", r.w(side * side, e))
    for i in range(n_layer):
        _layer(w, r, "v", i, e, n_ff, whisper=False)
    _add(w, "v.post_ln.weight", r.norm(e))
    _add(w, "v.post_ln.bias", r.b(e))
    _add(w, "mm.input_projection.weight", r.w(e, n_embd_text, std=1.0 / math.sqrt(e)))
    _add(w, "mm.soft_emb_norm.weight", r.norm(e))
    _finish(w)
    return path


def write_tiny_ultravox_mmproj(
    path: str | os.PathLike[str],
    n_embd_text: int,
    *,
    seed: int = 0,
    n_mel_bins: int = 128,
    n_embd: int = 32,
    n_head: int = 2,
    n_ff: int = 64,
    n_layer: int = 1,
    stack_factor: int = 10,
    proj_hidden: int = 64,
    eps: float = 1e-5,
) -> Path:
    """Write a tiny ``ultravox`` audio projector to ``path`` and return it as a ``Path``.

    Audio at 16 kHz, in chunks of 30 s (3,000 mel frames of ``n_mel_bins``), goes through
    Whisper's two convolutions and ``n_layer`` blocks of width ``n_embd``; every
    ``stack_factor`` frames are stacked into one token, RMS-normed, passed through a
    SwiGLU of ``proj_hidden`` and projected to ``n_embd_text``: ``1500 / stack_factor``
    tokens per chunk. ``stack_factor`` must divide 1,500 (see the module docstring)."""
    path = Path(expect_path("path", path))
    for k, v in (("n_embd_text", n_embd_text), ("n_mel_bins", n_mel_bins), ("n_embd", n_embd), ("n_head", n_head)):
        _positive(k, v)
    for k, v in (("n_ff", n_ff), ("n_layer", n_layer), ("stack_factor", stack_factor), ("proj_hidden", proj_hidden)):
        _positive(k, v)
    expect_ints(seed=seed)
    expect_number("eps", eps)
    if n_mel_bins > 256:
        raise ValueError("n_mel_bins must be at most 256 (clip.cpp's bound)")
    if n_embd % n_head:
        raise ValueError("n_embd must be a multiple of n_head")
    if WHISPER_N_POS % stack_factor:
        raise ValueError("stack_factor must divide 1500 (clip.cpp aborts on the others at the pinned commit)")
    gguf = _import_gguf()
    r = _Rand(seed)
    w = _writer(path, "tiny-ultravox-mmproj")
    w.add_clip_projector_type(gguf.VisionProjectorType.ULTRAVOX)
    w.add_clip_has_audio_encoder(True)
    w.add_audio_projection_dim(n_embd_text)
    w.add_audio_embedding_length(n_embd)
    w.add_audio_feed_forward_length(n_ff)
    w.add_audio_block_count(n_layer)
    w.add_audio_head_count(n_head)
    w.add_audio_num_mel_bins(n_mel_bins)
    w.add_audio_attention_layernorm_eps(eps)
    w.add_audio_stack_factor(stack_factor)
    e = n_embd
    _add(w, "a.conv1d.1.weight", r.w(e, n_mel_bins, 3, std=0.05), f16=True)
    _add(w, "a.conv1d.1.bias", r.b(e, 1))
    _add(w, "a.conv1d.2.weight", r.w(e, e, 3, std=0.05), f16=True)
    _add(w, "a.conv1d.2.bias", r.b(e, 1))
    _add(w, "a.position_embd.weight", r.w(WHISPER_N_POS, e))
    for i in range(n_layer):
        _layer(w, r, "a", i, e, n_ff, whisper=True)
    _add(w, "a.post_ln.weight", r.norm(e))
    _add(w, "a.post_ln.bias", r.b(e))
    s = e * stack_factor
    _add(w, "mm.a.norm_pre.weight", r.norm(s))
    _add(w, "mm.a.mlp.1.weight", r.w(2 * proj_hidden, s))
    _add(w, "mm.a.norm_mid.weight", r.norm(proj_hidden))
    _add(w, "mm.a.mlp.2.weight", r.w(n_embd_text, proj_hidden, std=1.0 / math.sqrt(proj_hidden)))
    _finish(w)
    return path
