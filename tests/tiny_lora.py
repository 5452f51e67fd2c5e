"""Tiny LoRA / aLoRA adapters for the tiny model (tests/tiny_model.py), written with ``gguf``.

Layout follows llama.cpp's loader (``src/llama-adapter.cpp``): ``general.type =
"adapter"``, ``adapter.type = "lora"``, ``adapter.lora.alpha``, and for each adapted
weight ``W`` (ggml shape ``[n_in, n_out]``) a pair ``W.lora_a`` (ggml ``[n_in, rank]``)
and ``W.lora_b`` (ggml ``[rank, n_out]``). numpy shapes are the reverse of ggml's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import gguf
import numpy as np


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
    """Write an adapter for ``attn_q`` and ``ffn_up`` of every layer; returns the path."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    if alora_invocation_tokens is not None:
        w.add_key_value(
            "adapter.alora.invocation_tokens",
            [int(t) for t in alora_invocation_tokens],
            gguf.GGUFValueType.ARRAY,
            sub_type=gguf.GGUFValueType.UINT32,  # llama.cpp insists on uint32
        )
    for il in range(n_layer):
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
    return Path(path)
