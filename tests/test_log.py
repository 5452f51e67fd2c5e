"""llama.cpp's log routed into Python logging: quiet by default, levels honoured."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import llama_cffi
from llama_cffi import Model


def test_quiet_by_default(tiny_model_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """With no configuration, loading a model logs nothing."""
    llama_cffi.set_verbosity(None)
    with caplog.at_level(logging.DEBUG, logger="llama_cffi"):
        llama_cffi.log.logger.setLevel(logging.NOTSET)
        llama_cffi.set_verbosity(None)
        Model.load(tiny_model_path).close()
    assert [r for r in caplog.records if r.name == "llama_cffi"] == []


def test_set_verbosity_info_routes_messages(tiny_model_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """set_verbosity('info') forwards llama.cpp's loader messages as whole lines."""
    try:
        llama_cffi.set_verbosity("info")
        with caplog.at_level(logging.INFO, logger="llama_cffi"):
            Model.load(tiny_model_path).close()
        msgs = [r.getMessage() for r in caplog.records if r.name == "llama_cffi"]
        assert any("llama_model_loader" in m or "print_info" in m for m in msgs)
        assert all("\n" not in m for m in msgs)
        assert all(r.levelno >= logging.INFO for r in caplog.records)
    finally:
        llama_cffi.set_verbosity(None)


def test_standard_logger_level_is_honoured(tiny_model_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Setting the 'llama_cffi' logger's level directly takes effect at the next load."""
    logger = logging.getLogger("llama_cffi")
    try:
        logger.setLevel(logging.DEBUG)
        with caplog.at_level(logging.DEBUG, logger="llama_cffi"):
            Model.load(tiny_model_path).close()
        assert any(r.levelno == logging.DEBUG for r in caplog.records if r.name == "llama_cffi")
    finally:
        llama_cffi.set_verbosity(None)
        logger.setLevel(logging.NOTSET)


def test_bad_verbosity() -> None:
    """Unknown level names and types are rejected."""
    with pytest.raises(ValueError):
        llama_cffi.set_verbosity("loud")
    with pytest.raises(TypeError):
        llama_cffi.set_verbosity(1.5)  # type: ignore[arg-type]
