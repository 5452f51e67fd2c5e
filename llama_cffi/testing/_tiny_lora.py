"""A tiny LoRA / aLoRA adapter for the tiny models of this kit, written with ``gguf``.

The layout follows llama.cpp's loader (``src/llama-adapter.cpp`` at the pinned commit):
``general.type = "adapter"``, ``adapter.type = "lora"``, ``adapter.lora.alpha``, an
optional ``adapter.alora.invocation_tokens`` (an array of uint32: llama.cpp reads no other
element type), and for each adapted weight ``W`` (ggml shape ``[n_in, n_out]``) a pair
``W.lora_a`` (ggml ``[n_in, rank]``) and ``W.lora_b`` (ggml ``[rank, n_out]``); numpy
shapes are the reverse of ggml's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .._args import expect_int, expect_iterable, expect_path, expect_str, type_error
from ._tiny_model import _import_gguf

__all__ = ["write_tiny_lora"]


def write_tiny_lora(
    path: str | os.PathLike[str],
    *,
    n_embd: int = 64,
    n_ff: int = 128,
    n_layer: int = 2,
    rank: int = 4,
    alpha: float = 8.0,
    seed: int = 1,
    arch: str = "llama",
    alora_invocation_tokens: Sequence[int] | None = None,
) -> Path:
    """Write a LoRA adapter for ``attn_q`` and ``ffn_up`` of every layer of a model of
    architecture ``arch`` whose widths are ``n_embd`` and ``n_ff`` (the defaults fit
    :func:`~llama_cffi.testing.write_tiny_model`'s model) and return its path. Weights are
    drawn from ``numpy.random.default_rng(seed)`` (normal, sd 0.5: an adapter that visibly
    changes the logits); ``alora_invocation_tokens`` makes it an activated LoRA (aLoRA)
    that applies after those tokens."""
    path = Path(expect_path("path", path))
    sizes = {k: expect_int(k, v) for k, v in (("n_embd", n_embd), ("n_ff", n_ff), ("n_layer", n_layer), ("rank", rank))}
    for k, v in sizes.items():
        if v < 1:
            raise ValueError(f"{k} must be >= 1, not {v}")
    seed = expect_int("seed", seed)
    expect_str("arch", arch)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise type_error("alpha", "a number", alpha)
    invocation = None
    if alora_invocation_tokens is not None:
        what = "a sequence of token ids (ints) or None"
        invocation = [
            expect_int("alora_invocation_tokens", t, what)
            for t in expect_iterable("alora_invocation_tokens", alora_invocation_tokens, what)
        ]
    gguf = _import_gguf()
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(os.fspath(path), arch)
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(alpha))
    if invocation is not None:
        w.add_key_value(
            "adapter.alora.invocation_tokens",
            invocation,
            gguf.GGUFValueType.ARRAY,
            sub_type=gguf.GGUFValueType.UINT32,  # llama.cpp insists on uint32
        )
    for il in range(sizes["n_layer"]):
        for name, n_in, n_out in (("attn_q", n_embd, n_embd), ("ffn_up", n_embd, n_ff)):
            base = f"blk.{il}.{name}.weight"
            a = rng.normal(0.0, 0.5, size=(rank, n_in)).astype(np.float32)
            b = rng.normal(0.0, 0.5, size=(n_out, rank)).astype(np.float32)
            w.add_tensor(base + ".lora_a", a)
            w.add_tensor(base + ".lora_b", b)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
