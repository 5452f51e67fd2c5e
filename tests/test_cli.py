"""python -m llama_cffi: the demo and info commands, and clean user errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_isolated


def cli(*args: str) -> tuple[int, str, str]:
    r = run_isolated(f"import sys; from llama_cffi.__main__ import main; sys.exit(main({list(args)!r}))")
    return r.returncode, r.stdout, r.stderr


def test_demo_on_tiny_model(tiny_model_path: Path) -> None:
    """demo generates and reports tokens/s."""
    rc, out, err = cli("demo", "-m", str(tiny_model_path), "-n", "8", "hello world")
    assert rc == 0, err
    assert "tokens/s" in out and "hello world" in out


@pytest.mark.default_model
def test_demo_on_default_model(default_model_path: Path) -> None:
    """The README's main job: demo on the default model."""
    rc, out, err = cli("demo", "-n", "12")
    assert rc == 0, err
    assert "gemma3 270M" in out and "generation" in out


def test_info_json(tiny_model_path: Path) -> None:
    """info prints build options, devices and model metadata as JSON."""
    rc, out, err = cli("info", "-m", str(tiny_model_path), "--vocab-only")
    assert rc == 0, err
    info = json.loads(out)
    assert info["build"]["options"]["GGML_AMX_TILE"] == "OFF"
    assert info["model"]["metadata"]["general.architecture"] == "llama"
    assert any(d["name"] == "CPU" for d in info["devices"])


@pytest.mark.parametrize("path", ["/nonexistent.gguf", "/"])
def test_user_errors_are_one_line(path: str) -> None:
    """A bad model path exits 2 with one line on stderr, no traceback."""
    rc, _out, err = cli("demo", "-m", path)
    assert rc == 2
    assert err.startswith("llama-cffi: error:") and "Traceback" not in err and err.count("\n") == 1
