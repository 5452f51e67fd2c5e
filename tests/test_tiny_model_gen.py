"""Self-checks of the tiny test-model generator (``tiny_model.py``); no llama.cpp needed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import gguf
import numpy as np

from tests import tiny_model


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_deterministic(tmp_path: Path) -> None:
    a = tiny_model.write_tiny_model(tmp_path / "a.gguf")
    b = tiny_model.write_tiny_model(tmp_path / "b.gguf")
    c = tiny_model.write_tiny_model(tmp_path / "c.gguf", seed=1)
    assert _sha(a) == _sha(b)
    assert _sha(a) != _sha(c)


def test_vocab_layout() -> None:
    toks = tiny_model.TOKENS
    assert toks[:3] == ["<unk>", "<s>", "</s>"]
    off = tiny_model.BYTE_TOKEN_OFFSET
    assert [toks[off + b] for b in (0, 0x0A, 0xFF)] == ["<0x00>", "<0x0A>", "<0xFF>"]
    assert toks[tiny_model.IM_START_ID] == "<|im_start|>"
    assert toks[tiny_model.EOT_ID] == "<|im_end|>"
    assert len(set(toks)) == len(toks) == tiny_model.N_VOCAB
    assert len(tiny_model.SCORES) == len(tiny_model.TOKEN_TYPES) == tiny_model.N_VOCAB


def test_contents(tmp_path: Path) -> None:
    path = tiny_model.write_tiny_model(
        tmp_path / "m.gguf", n_layer=3, extra_metadata={"tokenizer.ggml.add_bos_token": False}
    )
    reader = gguf.GGUFReader(path)
    fields = reader.fields
    assert fields["general.architecture"].contents() == "llama"
    assert fields["llama.block_count"].contents() == 3
    assert fields["llama.rope.dimension_count"].contents() == 16
    assert fields["tokenizer.ggml.model"].contents() == "llama"
    assert fields["tokenizer.ggml.tokens"].contents() == tiny_model.TOKENS
    assert fields["tokenizer.ggml.add_bos_token"].contents() is False
    assert "<|im_start|>" in fields["tokenizer.chat_template"].contents()
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == 3 + 9 * 3
    emb = tensors["token_embd.weight"]
    assert list(emb.shape) == [64, tiny_model.N_VOCAB]  # ggml order: ne0 = n_embd
    assert list(tensors["blk.2.attn_k.weight"].shape) == [64, 32]  # n_head_kv * head_dim = 32
    assert np.all(np.asarray(tensors["output_norm.weight"].data) == 1.0)
