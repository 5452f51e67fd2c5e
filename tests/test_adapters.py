"""LoRA adapters and control vectors: load, metadata, apply with scales, remove, lifetimes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llama_cffi import AdapterError, ClosedError, Model
from llama_cffi.testing import write_tiny_lora

PROMPT = [1, 40, 50, 60, 70]


@pytest.fixture()
def lora_path(tmp_path: Path) -> Path:
    return write_tiny_lora(tmp_path / "lora.gguf")


def logits_with(model: Model, setup: object = None) -> np.ndarray:
    with model.context(n_ctx=64) as ctx:
        if setup is not None:
            setup(ctx)  # type: ignore[operator]
        return ctx.decode(PROMPT).copy()


def test_lora_metadata_and_alora(tmp_path: Path, tiny_model: Model) -> None:
    """Adapter metadata is readable; aLoRA invocation tokens round-trip."""
    p = write_tiny_lora(tmp_path / "alora.gguf", alora_invocation_tokens=[5, 6, 7])
    with tiny_model.load_lora(p) as a:
        md = a.metadata
        assert md["adapter.type"] == "lora" and float(md["adapter.lora.alpha"]) == 8.0
        assert a.alora_invocation_tokens.tolist() == [5, 6, 7]


def test_lora_changes_logits_and_scale_zero_is_identity(tiny_model: Model, lora_path: Path) -> None:
    """Scale 1 changes the logits, scale 0 and removal restore the base model's."""
    base = logits_with(tiny_model)
    with tiny_model.load_lora(lora_path) as a:
        assert a.alora_invocation_tokens.size == 0
        on = logits_with(tiny_model, lambda c: c.set_lora_adapters({a: 1.0}))
        zero = logits_with(tiny_model, lambda c: c.set_lora_adapters({a: 0.0}))
        off = logits_with(tiny_model, lambda c: (c.set_lora_adapters({a: 1.0}), c.set_lora_adapters({})))
        half = logits_with(tiny_model, lambda c: c.set_lora_adapters({a: 0.5}))
    assert np.abs(on - base).max() > 1e-3
    np.testing.assert_allclose(zero, base, atol=1e-5)
    np.testing.assert_allclose(off, base, atol=1e-5)
    # the network is non-linear, so half the scale is only "different from both ends"
    assert np.abs(half - base).max() > 1e-3 and np.abs(half - on).max() > 1e-3


def test_lora_errors(tmp_path: Path, tiny_model: Model, lora_path: Path) -> None:
    """Missing files, wrong architectures, bad scales and foreign adapters are typed errors."""
    with pytest.raises(AdapterError, match="no such file"):
        tiny_model.load_lora(tmp_path / "missing.gguf")
    wrong = write_tiny_lora(tmp_path / "wrong.gguf", n_embd=32)
    with pytest.raises(AdapterError, match="shape"):
        tiny_model.load_lora(wrong)
    with tiny_model.load_lora(lora_path) as a, tiny_model.context(n_ctx=32) as ctx:
        with pytest.raises(AdapterError, match="finite"):
            ctx.set_lora_adapters({a: float("nan")})
        with pytest.raises(AdapterError, match="LoraAdapter"):
            ctx.set_lora_adapters({"a": 1.0})  # type: ignore[dict-item]


def test_closing_an_applied_adapter_is_deferred(tiny_model: Model, lora_path: Path) -> None:
    """An adapter closed while a context applies it stays valid until the context lets go."""
    a = tiny_model.load_lora(lora_path)
    with tiny_model.context(n_ctx=64) as ctx:
        ctx.set_lora_adapters({a: 1.0})
        a.close()
        assert a.closed
        with pytest.raises(ClosedError):
            _ = a.metadata
        assert a._handle is not None and a._handle.ptr is not None
        assert np.isfinite(ctx.decode(PROMPT)).all()  # the adapter's tensors are still there
    assert a._handle._children == 0


def test_control_vector(tiny_model: Model) -> None:
    """A control vector shifts the logits; clearing it restores them; bad shapes are refused."""
    base = logits_with(tiny_model)
    vec = np.full((tiny_model.n_layer, tiny_model.n_embd), 0.5, dtype=np.float32)
    steered = logits_with(tiny_model, lambda c: c.set_control_vector(vec))
    cleared = logits_with(tiny_model, lambda c: (c.set_control_vector(vec), c.set_control_vector(None)))
    assert np.abs(steered - base).max() > 1e-3
    np.testing.assert_allclose(cleared, base, atol=1e-5)
    with tiny_model.context(n_ctx=32) as ctx:
        with pytest.raises(AdapterError, match="shape"):
            ctx.set_control_vector(np.zeros((1, 3)))
        with pytest.raises(AdapterError, match="layer range"):
            ctx.set_control_vector(vec, il_start=0)
