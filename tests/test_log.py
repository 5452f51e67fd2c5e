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


def test_captures_are_told_apart_by_identity() -> None:
    """Nested captures (or two threads' at once) that saw the same lines are equal lists:
    closing the inner one must close it, not the outer (list.remove by equality did, and
    the outer then missed every later line while another thread's close raised)."""
    import threading

    from llama_cffi import log

    with log.capture() as outer:
        with log.capture() as inner:
            log._emit(logging.WARNING, "both")
        log._emit(logging.WARNING, "outer only")
    assert outer == [(logging.WARNING, "both"), (logging.WARNING, "outer only")]
    assert inner == [(logging.WARNING, "both")]
    assert not log._captures
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def worker() -> None:
        try:
            for _ in range(200):
                with log.capture():
                    barrier.wait(timeout=30)
                    log._emit(logging.WARNING, "shared")
                    barrier.wait(timeout=30)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert not log._captures
