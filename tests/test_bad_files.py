"""Loading garbage never crashes: each case runs in a fresh subprocess and must end in
the expected typed exception, with the interpreter alive to report it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import run_isolated


def _make_cases(tmp: Path, tiny: Path) -> dict[str, tuple[Path, str]]:
    data = tiny.read_bytes()
    cases: dict[str, tuple[Path, str]] = {}

    def add(name: str, payload: bytes | None, expected: str) -> None:
        p = tmp / name
        if payload is not None:
            p.write_bytes(payload)
        cases[name] = (p, expected)

    add("missing.gguf", None, "ModelNotFoundError")
    (tmp / "adir.gguf").mkdir()
    cases["adir.gguf"] = (tmp / "adir.gguf", "InvalidModelError")
    add("empty.gguf", b"", "InvalidModelError")
    add("three_bytes.gguf", b"GGU", "InvalidModelError")
    add("wrong_magic.gguf", b"GGML" + data[4:], "InvalidModelError")
    add("random.gguf", os.urandom(4096), "InvalidModelError")
    add("magic_then_random.gguf", b"GGUF" + os.urandom(4096), "InvalidModelError")
    add("header_only.gguf", data[:24], "InvalidModelError")
    for frac in (0.01, 0.3, 0.9, 0.999):
        add(f"truncated_{frac}.gguf", data[: int(len(data) * frac)], "InvalidModelError")
    bad_version = bytearray(data)
    bad_version[4:8] = (99).to_bytes(4, "little")
    add("bad_version.gguf", bytes(bad_version), "InvalidModelError")
    huge_count = bytearray(data)
    huge_count[8:16] = (2**62).to_bytes(8, "little")  # tensor count
    add("huge_tensor_count.gguf", bytes(huge_count), "InvalidModelError")
    huge_kv = bytearray(data)
    huge_kv[16:24] = (2**62).to_bytes(8, "little")  # metadata kv count
    add("huge_kv_count.gguf", bytes(huge_kv), "InvalidModelError")
    return cases


def test_garbage_files_raise_typed_errors(tmp_path: Path, tiny_model_path: Path) -> None:
    """Every malformed model file gives its typed exception in a child that exits normally."""
    cases = _make_cases(tmp_path, tiny_model_path)
    code = f"""
        import llama_cffi, json
        results = {{}}
        for name, path in {[(n, str(p)) for n, (p, _) in cases.items()]!r}:
            try:
                llama_cffi.Model.load(path).close()
                results[name] = ["LOADED", ""]
            except llama_cffi.LlamaError as e:
                results[name] = [type(e).__name__, str(e)]
        print(json.dumps(results))
    """
    r = run_isolated(code)
    assert r.returncode == 0, f"child died ({r.returncode}): {r.stderr[-2000:]}"
    import json

    results = json.loads(r.stdout.strip().splitlines()[-1])
    for name, (path, expected) in cases.items():
        kind, message = results[name]
        assert kind == expected, (name, kind, message)
        assert str(path) in message, (name, message)


@pytest.mark.parametrize("vocab_only", [False, True])
def test_exceptions_are_builtin_compatible(tmp_path: Path, vocab_only: bool) -> None:
    """ModelNotFoundError is a FileNotFoundError; InvalidModelError is a ValueError and OSError."""
    import llama_cffi

    with pytest.raises(FileNotFoundError):
        llama_cffi.Model.load(tmp_path / "nope.gguf", vocab_only=vocab_only)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"nope" * 10)
    with pytest.raises(ValueError):
        llama_cffi.Model.load(bad, vocab_only=vocab_only)
    with pytest.raises(OSError):
        llama_cffi.Model.load(bad, vocab_only=vocab_only)


def test_unreadable_file(tmp_path: Path, tiny_model_path: Path) -> None:
    """A file without read permission gives ModelLoadError naming the path (skipped as root)."""
    import llama_cffi

    p = tmp_path / "locked.gguf"
    p.write_bytes(tiny_model_path.read_bytes())
    p.chmod(0)
    try:
        if os.access(p, os.R_OK):  # root reads anything: check the path argument type instead
            with pytest.raises(TypeError):
                llama_cffi.Model.load(12345)  # type: ignore[arg-type]
            return
        with pytest.raises(llama_cffi.ModelLoadError, match="cannot be read"):
            llama_cffi.Model.load(p)
    finally:
        p.chmod(0o644)


def test_hparams_llama_cpp_would_abort_on(tmp_path: Path) -> None:
    """Hyper-parameters that llama.cpp checks with GGML_ASSERT (abort) in load_hparams: a
    layer count outside [1, 512], inconsistent expert counts, more MTP layers than layers;
    in the file or through kv_overrides. Each is an InvalidModelError naming the key."""
    from llama_cffi.testing import write_tiny_model

    files = {
        "layers_1000": {"llama.block_count": 1000},
        "layers_0": {"llama.block_count": 0},
        "experts_2000": {"llama.expert_count": 2000, "llama.expert_used_count": 2},
        "used_without_experts": {"llama.expert_used_count": 2},
        "experts_none_used": {"llama.expert_count": 4, "llama.expert_used_count": 0},
        "nextn_over_layers": {"llama.nextn_predict_layers": 5},
    }
    paths = {name: str(write_tiny_model(tmp_path / f"{name}.gguf", extra_metadata=md)) for name, md in files.items()}
    # the vocabulary loader asserts every token string maps to one id (found by fuzzing)
    from llama_cffi.testing import TOKENS

    dup = list(TOKENS)
    dup[300] = dup[299]
    empty = list(TOKENS)
    empty[300], empty[301] = "", "[EMPTY_300]"  # llama.cpp renames an empty token "[EMPTY_<i>]"
    for name, toks in (("duplicate_token", dup), ("empty_token_name_taken", empty)):
        md = {"tokenizer.ggml.tokens": toks}
        paths[name] = str(write_tiny_model(tmp_path / f"{name}.gguf", extra_metadata=md))
    good = str(write_tiny_model(tmp_path / "good.gguf"))
    code = f"""
        import llama_cffi, json
        out = {{}}
        def attempt(name, path, **kw):
            try:
                llama_cffi.Model.load(path, **kw).close()
                out[name] = ["LOADED", ""]
            except llama_cffi.LlamaError as e:
                out[name] = [type(e).__name__, str(e)]
        for name, path in {sorted(paths.items())!r}:
            attempt(name, path)
        attempt("override_layers_1000", {good!r}, kv_overrides={{"llama.block_count": 1000}})
        attempt("override_experts", {good!r}, kv_overrides={{"llama.expert_used_count": 3}})
        attempt("override_layers_2", {good!r}, kv_overrides={{"llama.block_count": 2}})
        attempt("vocab_only_layers_1000", {paths["layers_1000"]!r}, vocab_only=True)
        attempt("vocab_only_duplicate_token", {paths["duplicate_token"]!r}, vocab_only=True)
        print(json.dumps(out))
    """
    r = run_isolated(code)
    assert r.returncode == 0, f"child died ({r.returncode}): {r.stderr[-2000:]}"
    import json

    out = json.loads(r.stdout.strip().splitlines()[-1])
    keys = {
        "layers_1000": "block_count=1000",
        "layers_0": "block_count=0",
        "experts_2000": "expert_count=2000",
        "used_without_experts": "expert_used_count=2",
        "experts_none_used": "expert_used_count must be > 0",
        "nextn_over_layers": "nextn_predict_layers=5",
        "override_layers_1000": "block_count=1000",
        "override_experts": "expert_used_count=3",
        "duplicate_token": "tokenizer.ggml.tokens[300]",
        "empty_token_name_taken": "tokenizer.ggml.tokens[301]",
        "vocab_only_duplicate_token": "repeats an earlier token",
    }
    for name, key in keys.items():
        kind, message = out[name]
        assert kind == "InvalidModelError" and key in message and "would abort" in message, (name, out[name])
    assert out["override_layers_2"] == ["LOADED", ""]
    assert out["vocab_only_layers_1000"] == ["LOADED", ""]  # llama.cpp stops before the layer count
