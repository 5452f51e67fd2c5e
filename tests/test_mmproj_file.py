"""llama_cffi.mmproj_file: the checks of a multimodal projector file before libmtmd reads
it. Its tables against the pinned clip.cpp/mtmd.cpp they were taken from; the tiny
projectors of llama_cffi.testing pass; each broken variant is a typed error, and (in a
spawned child) libmtmd itself would have aborted on the key-type case: the check is what
stands between the file and a dead interpreter."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.native_tools import llama_cpp_source_dir
from llama_cffi.errors import InvalidModelError, ModelNotFoundError
from llama_cffi.mmproj_file import AUDIO_PROJECTORS, KEY_TYPES, VISION_PROJECTORS, MmprojHeader, check_mmproj
from llama_cffi.testing import write_tiny_gemma3_mmproj, write_tiny_ultravox_mmproj
from tests.conftest import run_isolated

N_EMBD = 64  # the tiny text model's


def mtmd_dir() -> Path:
    return llama_cpp_source_dir() / "tools" / "mtmd"


def test_key_types_are_clip_cpps() -> None:
    """Every scalar get_u32/get_i32/get_f32/get_bool/get_string of the pinned clip.cpp, with
    the ``%s`` keys for vision, audio and gen.audio: the table, no more, no less."""
    src = (mtmd_dir() / "clip.cpp").read_text()
    keys = dict(re.findall(r'#define (KEY_\w+)\s+"([^"]+)"', (mtmd_dir() / "clip-impl.h").read_text()))
    types = {"u32": "UINT32", "i32": "INT32", "f32": "FLOAT32", "bool": "BOOL", "string": "STRING"}
    want: dict[str, str] = {}
    for getter, key in re.findall(r"\bget_(u32|i32|f32|bool|string)\(\s*(?:string_format\()?\s*(KEY_\w+)", src):
        name = keys[key]
        for n in [name % m for m in ("vision", "audio", "gen.audio")] if "%s" in name else [name]:
            assert want.setdefault(n, types[getter]) == types[getter], n
    assert len(want) > 60
    assert want == KEY_TYPES


def test_projector_sets_are_mtmd_cpps() -> None:
    """The case labels of mtmd.cpp's init_vision and init_audio, by clip-impl.h's names
    (and the legacy "qwen2.5o", which clip.cpp's load_hparams maps per modality)."""
    src = (mtmd_dir() / "mtmd.cpp").read_text()
    names = dict(re.findall(r'\{\s*(PROJECTOR_TYPE_\w+),\s*"([^"]+)"\s*\}', (mtmd_dir() / "clip-impl.h").read_text()))

    def cases(fn: str) -> set[str]:
        body = src.split(f"void {fn}() {{", 1)[1].split("\n    }\n", 1)[0]
        return {names.get(c, c) for c in re.findall(r"case (PROJECTOR_TYPE_\w+)", body)}

    vision = cases("init_vision")
    vision.discard("PROJECTOR_TYPE_MLP_NORM")  # no name: no file can carry it
    assert "PROJECTOR_TYPE_QWEN25O" in src.split("void init_audio() {", 1)[1]
    vision.add("qwen2.5o")  # clip.cpp turns a vision "qwen2.5o" into qwen2.5vl_merger before mtmd sees it
    assert vision == VISION_PROJECTORS
    assert cases("init_audio") == AUDIO_PROJECTORS


def test_tiny_projectors_pass(tmp_path: Path) -> None:
    g = write_tiny_gemma3_mmproj(tmp_path / "g.gguf", N_EMBD)
    u = write_tiny_ultravox_mmproj(tmp_path / "u.gguf", N_EMBD)
    assert check_mmproj(g, N_EMBD) == MmprojHeader("gemma3", None)
    assert check_mmproj(u, N_EMBD) == MmprojHeader(None, "ultravox")
    assert check_mmproj(g) == MmprojHeader("gemma3", None)  # no width to compare
    # the same arguments write the same bytes
    assert write_tiny_gemma3_mmproj(tmp_path / "g2.gguf", N_EMBD).read_bytes() == g.read_bytes()


def _rewrite(src: Path, dest: Path, edit: Callable[[dict[str, Any], dict[str, np.ndarray]], None]) -> Path:
    """Copy a GGUF with its metadata (name -> (gguf type, value)) and tensors edited."""
    import gguf

    r = gguf.GGUFReader(src)
    kv: dict[str, Any] = {}
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            kv[f.name] = (vt, f.types[1], [f.parts[i].tolist()[0] for i in f.data])
        elif vt == gguf.GGUFValueType.STRING:
            kv[f.name] = (vt, None, bytes(f.parts[f.data[0]]).decode())
        else:
            kv[f.name] = (vt, None, f.parts[f.data[0]].tolist()[0])
    tensors = {t.name: np.array(t.data).reshape(list(reversed([int(x) for x in t.shape]))) for t in r.tensors}
    edit(kv, tensors)
    w = gguf.GGUFWriter(dest, arch="clip")
    for name, (vt, sub, value) in kv.items():
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, value, vt, sub_type=sub)
        else:
            w.add_key_value(name, value, vt)
    for name, arr in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(arr))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dest


def _set(key: str, vt: str, value: object) -> Callable[[dict[str, Any], dict[str, np.ndarray]], None]:
    import gguf

    def edit(kv: dict[str, Any], _: dict[str, np.ndarray]) -> None:
        kv[key] = (getattr(gguf.GGUFValueType, vt), None, value)

    return edit


def _drop_tensor(name: str) -> Callable[[dict[str, Any], dict[str, np.ndarray]], None]:
    def edit(_: dict[str, Any], t: dict[str, np.ndarray]) -> None:
        del t[name]

    return edit


def _add_tensor(name: str, shape: tuple[int, ...]) -> Callable[[dict[str, Any], dict[str, np.ndarray]], None]:
    def edit(_: dict[str, Any], t: dict[str, np.ndarray]) -> None:
        t[name] = np.zeros(shape, np.float32)

    return edit


def _drop_key(key: str) -> Callable[[dict[str, Any], dict[str, np.ndarray]], None]:
    def edit(kv: dict[str, Any], _: dict[str, np.ndarray]) -> None:
        del kv[key]

    return edit


GEMMA3_CASES = {
    "u32 key as float": (_set("clip.vision.image_size", "FLOAT32", 64.0), r"'clip.vision.image_size' is float32"),
    "bool key as u32": (_set("clip.use_gelu", "UINT32", 1), r"'clip.use_gelu' is uint32; clip.cpp reads it as bool"),
    "eps as u32": (_set("clip.vision.attention.layer_norm_epsilon", "UINT32", 1), r"layer_norm_epsilon' is uint32"),
    "no encoder": (_drop_key("clip.has_vision_encoder"), r"neither clip.has_vision_encoder"),
    "audio projector for images": (_set("clip.projector_type", "STRING", "ultravox"), r"'ultravox' .* is an audio"),
    "unknown projector": (_set("clip.projector_type", "STRING", "nonesuch"), r"'nonesuch' .* is no projector"),
    "missing layer tensor": (_drop_tensor("v.blk.0.ffn_up.weight"), r"'v.blk.0.ffn_up.weight' is missing"),
    "missing projection": (_drop_tensor("mm.input_projection.weight"), r"'mm.input_projection.weight' is missing"),
    "patch not dividing": (_set("clip.vision.patch_size", "UINT32", 7), r"not a multiple of the patch size 7"),
    "pool not dividing": (_set("clip.vision.projector.scale_factor", "UINT32", 3), r"pool size 3"),
    "wrong block count": (_set("clip.vision.block_count", "UINT32", 2), r"'v.blk.1.attn_q.weight' is missing"),
    "wrong width": (_set("clip.vision.embedding_length", "UINT32", 48), r"has shape \[32, 32\], expected \[48, 48\]"),
    "heads not dividing": (_set("clip.vision.attention.head_count", "UINT32", 3), r"not a multiple of the head"),
    "bad position table": (_add_tensor("v.position_embd.weight", (60, 32)), r"'v.position_embd.weight' has shape"),
}
ULTRAVOX_CASES = {
    "stack factor 8": (_set("clip.audio.projector.stack_factor", "UINT32", 8), r"stack_factor is 8"),
    "k bias": (_add_tensor("a.blk.0.attn_k.bias", (32,)), r"'a.blk.0.attn_k.bias' must not be present"),
    "no q bias": (_drop_tensor("a.blk.0.attn_q.bias"), r"'a.blk.0.attn_q.bias' is missing"),
    "short positions": (_add_tensor("a.position_embd.weight", (1000, 32)), r"position_embd.weight' must be"),
    "mel bins": (_set("clip.audio.num_mel_bins", "UINT32", 300), r"at most 256"),
    "u32 as i32": (_set("clip.audio.block_count", "INT32", 1), r"'clip.audio.block_count' is int32"),
}


@pytest.mark.parametrize("case", sorted(GEMMA3_CASES))
def test_broken_gemma3_projectors_are_refused(tmp_path: Path, case: str) -> None:
    edit, message = GEMMA3_CASES[case]
    bad = _rewrite(write_tiny_gemma3_mmproj(tmp_path / "g.gguf", N_EMBD), tmp_path / "bad.gguf", edit)
    with pytest.raises(InvalidModelError, match=message):
        check_mmproj(bad, N_EMBD)


@pytest.mark.parametrize("case", sorted(ULTRAVOX_CASES))
def test_broken_ultravox_projectors_are_refused(tmp_path: Path, case: str) -> None:
    edit, message = ULTRAVOX_CASES[case]
    bad = _rewrite(write_tiny_ultravox_mmproj(tmp_path / "u.gguf", N_EMBD), tmp_path / "bad.gguf", edit)
    with pytest.raises(InvalidModelError, match=message):
        check_mmproj(bad, N_EMBD)


def test_another_models_projector_is_refused(tmp_path: Path) -> None:
    g = write_tiny_gemma3_mmproj(tmp_path / "g.gguf", 640)
    u = write_tiny_ultravox_mmproj(tmp_path / "u.gguf", 640)
    for path in (g, u):
        with pytest.raises(InvalidModelError, match=r"output width 640 is not the text model's embedding width 64"):
            check_mmproj(path, N_EMBD)


def test_not_a_projector_file(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError):
        check_mmproj(tmp_path / "missing.gguf")
    (tmp_path / "text.gguf").write_bytes(b"hello world")
    with pytest.raises(InvalidModelError, match="not a GGUF file"):
        check_mmproj(tmp_path / "text.gguf")
    g = write_tiny_gemma3_mmproj(tmp_path / "g.gguf", N_EMBD).read_bytes()
    (tmp_path / "cut.gguf").write_bytes(g[:200])
    with pytest.raises(InvalidModelError, match="cannot parse its GGUF header"):
        check_mmproj(tmp_path / "cut.gguf")


def test_libmtmd_itself_aborts_where_the_check_refuses(tmp_path: Path, tiny_model_path: Path) -> None:
    """The key-type rule is load-bearing: given the float ``image_size`` file, libmtmd's
    own loader kills the process (SIGABRT in a spawned child); llama_cffi raises first."""
    bad = _rewrite(
        write_tiny_gemma3_mmproj(tmp_path / "g.gguf", N_EMBD),
        tmp_path / "bad.gguf",
        _set("clip.vision.image_size", "FLOAT32", 64.0),
    )
    raw = f"""
import llama_cffi
from llama_cffi._binding import ffi, lib
m = llama_cffi.Model.load({str(tiny_model_path)!r})
p = lib.mtmd_context_params_default()
p.warmup = False
lib.mtmd_init_from_file({str(bad)!r}.encode(), m._ptr(), p)
print("survived")
"""
    r = run_isolated(raw, timeout=120)
    assert r.returncode != 0 and "survived" not in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])
    ours = f"""
import llama_cffi
from llama_cffi.mtmd import Projector
m = llama_cffi.Model.load({str(tiny_model_path)!r})
try:
    Projector(m, {str(bad)!r})
except llama_cffi.InvalidModelError as e:
    print("refused:", e)
"""
    r = run_isolated(ours, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused:" in r.stdout and "image_size" in r.stdout
