"""Model: loading parameters, introspection against the file, metadata, progress."""

from __future__ import annotations

import itertools
from pathlib import Path

import gguf
import numpy as np
import pytest

import llama_cffi
from llama_cffi import InvalidModelError, Model, ModelLoadCancelled, ParamError
from tests import tiny_model as tm


def test_introspection_matches_what_was_written(tiny_model: Model) -> None:
    """Hyper-parameters reported by llama.cpp equal those the generator wrote."""
    m = tiny_model
    assert (m.n_embd, m.n_layer, m.n_head, m.n_head_kv, m.n_ctx_train) == (64, 2, 4, 2, 256)
    assert m.n_vocab == tm.N_VOCAB
    assert m.desc.startswith("llama")
    assert m.ftype == llama_cffi.FType.ALL_F32 and str(m.ftype) == "all F32"
    assert m.has_decoder and not m.has_encoder
    assert not (m.is_recurrent or m.is_hybrid or m.is_diffusion)
    assert m.rope_type == llama_cffi.RopeType.NORM
    assert m.n_swa == 0 and m.decoder_start_token is None


def test_n_params_and_size_count_every_tensor(tiny_model_path: Path, tiny_model: Model) -> None:
    """n_params equals the element count of all tensors in the file; size their F32 bytes."""
    reader = gguf.GGUFReader(tiny_model_path)
    n = sum(int(np.prod(t.shape)) for t in reader.tensors)
    assert tiny_model.n_params == n
    assert tiny_model.size == 4 * n


def test_metadata_agrees_with_gguf_reader(tiny_model_path: Path, tiny_model: Model) -> None:
    """Every scalar metadata value llama.cpp reports equals what the gguf package reads."""
    reader = gguf.GGUFReader(tiny_model_path)
    md = tiny_model.metadata
    checked = 0
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or len(field.types) != 1:
            continue  # file header fields; arrays
        value = field.contents()
        expected = value if isinstance(value, str) else None
        if isinstance(value, bool):
            expected = "true" if value else "false"
        elif isinstance(value, int):
            expected = str(value)
        elif isinstance(value, float):
            assert float(md[field.name]) == pytest.approx(value, rel=1e-6)
            checked += 1
            continue
        assert md[field.name] == expected, field.name
        checked += 1
    assert checked >= 10


def test_defaults_come_from_llama_cpp() -> None:
    """model_default_params() mirrors llama_model_default_params(), field for field."""
    d = llama_cffi.model_default_params()
    c = llama_cffi.lib.llama_model_default_params()
    fields = [name for name, _ in llama_cffi.ffi.typeof("struct llama_model_params").fields]
    assert sorted(d) == sorted(fields)
    assert d["n_gpu_layers"] == c.n_gpu_layers and d["vocab_only"] is False


def test_every_model_param_field_is_accepted(tiny_model_path: Path) -> None:
    """Each llama_model_params field can be passed by name (here: its default back)."""
    d = llama_cffi.model_default_params()
    skip = {"progress_callback_user_data"}  # managed by llama_cffi
    kwargs = {k: v for k, v in d.items() if k not in skip}
    with Model.load(tiny_model_path, **kwargs) as m:
        assert m.n_vocab == tm.N_VOCAB


def test_kv_overrides_change_hyperparameters(tiny_model_path: Path) -> None:
    """kv_overrides reach llama.cpp: overriding the context length changes n_ctx_train."""
    with Model.load(tiny_model_path, kv_overrides={"llama.context_length": 128}) as m:
        assert m.n_ctx_train == 128


def test_vocab_only_loads_no_weights(tiny_model_path: Path) -> None:
    """vocab_only gives a working tokenizer without tensors."""
    with Model.load(tiny_model_path, vocab_only=True) as m:
        assert m.vocab_only and m.desc == ""
        assert m.detokenize(m.tokenize("hello world"), remove_special=True) == "hello world"
        # llama.cpp would create a context and then abort the process on decode
        with pytest.raises(llama_cffi.ContextCreateError, match="vocab_only") as info:
            m.context(n_ctx=64)
        assert "tried:" not in str(info.value)  # refused once, not once per smaller size


@pytest.mark.parametrize("mode", ["mmap", "none", llama_cffi.LoadMode.MMAP, 0])
def test_load_modes(tiny_model_path: Path, mode: object) -> None:
    """load_mode accepts enum members, names and values; each gives the same model."""
    with Model.load(tiny_model_path, load_mode=mode) as m:
        assert m.n_embd == 64


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"load_mode": "sideways"}, "load_mode='sideways' is not a valid LoadMode"),
        ({"n_gpu_layers": 1.5}, "n_gpu_layers must be an int"),
        ({"n_gpu_layers": 2**40}, "out of range"),
        ({"vocab_only": 1}, "vocab_only must be True or False"),
        ({"kv_overrides": {"x" * 200: 1}}, "1..127 bytes"),
        ({"kv_overrides": {"k": [1]}}, "values must be int, float, bool or str"),
        ({"tensor_split": [1.0, float("nan")]}, "finite number"),
        ({"devices": ["NO_SUCH_DEVICE"]}, "no such device"),
        ({"tensor_buft_overrides": [("(", "CPU")]}, "invalid pattern"),
        ({"tensor_buft_overrides": [(".*", "NO_SUCH_BUFT")]}, "no buffer type"),
        ({"progress_callback": 3}, "must be callable"),
        ({"progress_callback_user_data": None}, "managed by llama_cffi"),
    ],
)
def test_bad_params_are_rejected_before_c(tiny_model_path: Path, kwargs: dict[str, object], message: str) -> None:
    """Invalid parameter values raise ParamError naming the parameter."""
    with pytest.raises(ParamError, match=message.replace("(", r"\(").replace("[", r"\[")):
        Model.load(tiny_model_path, **kwargs)


def test_unknown_param_is_a_type_error(tiny_model_path: Path) -> None:
    """A misspelt parameter raises TypeError listing the known ones."""
    with pytest.raises(TypeError, match="n_gpu_layers"):
        Model.load(tiny_model_path, n_gpu_layer=1)


def test_devices_and_buffer_overrides_by_name(tiny_model_path: Path) -> None:
    """devices and tensor_buft_overrides accept the names ggml reports."""
    names = [d.name for d in llama_cffi.devices()]
    assert "CPU" in names
    with Model.load(tiny_model_path, devices=["CPU"], tensor_buft_overrides=[("ffn_.*", "CPU")]) as m:
        assert m.n_layer == 2


def test_progress_callback_reports_monotone_progress(tiny_model_path: Path) -> None:
    """The progress callback sees non-decreasing values in [0, 1], ending at 1."""
    seen: list[float] = []
    with Model.load(tiny_model_path, load_mode="none", progress_callback=seen.append):
        pass
    assert seen and seen[-1] == pytest.approx(1.0)
    assert all(0.0 <= a <= b <= 1.0 for a, b in itertools.pairwise(seen))


def test_progress_callback_can_cancel(tiny_model_path: Path) -> None:
    """Returning False from the progress callback cancels loading with ModelLoadCancelled."""
    with pytest.raises(ModelLoadCancelled, match="cancelled"):
        Model.load(tiny_model_path, load_mode="none", progress_callback=lambda p: False)


def test_progress_callback_exception_propagates(tiny_model_path: Path) -> None:
    """An exception raised in the progress callback stops loading and is re-raised."""

    class Boom(Exception):
        pass

    def cb(p: float) -> bool:
        raise Boom("stop")

    with pytest.raises(Boom):
        Model.load(tiny_model_path, load_mode="none", progress_callback=cb)


def test_split_model_loads(tmp_path: Path, tiny_model_path: Path) -> None:
    """load_splits reads a model given as one part (any naming scheme)."""
    with Model.load_splits([tiny_model_path]) as m:
        assert m.n_vocab == tm.N_VOCAB
    with pytest.raises(ValueError):
        Model.load_splits([])


def test_save_round_trips(tmp_path: Path, tiny_model: Model) -> None:
    """save() writes a GGUF that loads with identical hyper-parameters and vocabulary."""
    out = tmp_path / "saved.gguf"
    tiny_model.save(out)
    with Model.load(out) as m:
        assert (m.n_embd, m.n_layer, m.n_vocab, m.n_params) == (64, 2, tm.N_VOCAB, tiny_model.n_params)


def test_unsupported_architecture_is_a_clean_error(tmp_path: Path) -> None:
    """A valid GGUF with an unknown architecture raises InvalidModelError with llama.cpp's reason."""
    path = tmp_path / "alien.gguf"
    w = gguf.GGUFWriter(str(path), "no-such-arch")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(InvalidModelError, match=r"no-such-arch|architecture"):
        Model.load(path)
