"""Soaks: context create/free, state save/load and model load/close cycles leave memory
flat and free every callback handle.

Sized by ``LLAMA_CFFI_SOAK_CYCLES`` (default 1,000 per soak: about 10 s in CI; set it to
10000 for the long run). Each soak runs a warm-up of a tenth of its cycles, then checks:

* **handles**: every callback handed to llama.cpp (abort, progress) is tracked with a
  weak reference; after the object that registered it is closed and collected, none
  may survive (the ``ffi.new_handle`` that pointed at it was released);
* **RSS**: ``VmRSS`` after the warm-up against the end, within :data:`RSS_SLACK_KIB`
  (see ``tests/test_branch_soak.py`` for why a slack exists at all). A context leaked
  per cycle is far above it: the tiny model's smallest context holds a KV cache, a
  logits buffer and ggml compute buffers (hundreds of KiB).
"""

from __future__ import annotations

import gc
import os
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from llama_cffi import Context, Model
from tests.conftest import rss_kib

CYCLES = int(os.environ.get("LLAMA_CFFI_SOAK_CYCLES", "1000"))
RSS_SLACK_KIB = 8 * 1024
THREADS = {"n_threads": 1, "n_threads_batch": 1}

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")


class _Callback:
    """A callable whose lifetime a WeakSet can watch (functions and lambdas work too,
    but a class makes the count of live ones obvious)."""

    def __init__(self, result: bool) -> None:
        self.result = result
        self.calls = 0

    def __call__(self, *args: object) -> bool:
        self.calls += 1
        return self.result


def _soak(cycle: Callable[[int, weakref.WeakSet[_Callback]], None]) -> tuple[int, int]:
    """Run ``cycle`` CYCLES times; returns (RSS growth after warm-up in KiB, live callbacks)."""
    live: weakref.WeakSet[_Callback] = weakref.WeakSet()
    warm = max(CYCLES // 10, 20)
    start = 0
    for i in range(CYCLES):
        if i == warm:
            gc.collect()
            start = rss_kib()
        cycle(i, live)
    gc.collect()
    growth = rss_kib() - start
    # reported with `pytest -rP` (the closing notes quote these lines)
    print(f"soak: {CYCLES} cycles, RSS {growth:+d} KiB after {warm} warm-up cycles, {len(live)} callbacks alive")
    return growth, len(live)


def test_context_create_free(tiny_model: Model) -> None:
    """Contexts with an abort callback, decoded, their logits read as views, closed."""
    prompt = [1, 20, 30, 40]

    def cycle(i: int, live: weakref.WeakSet[_Callback]) -> None:
        cb = _Callback(False)
        live.add(cb)
        with tiny_model.context(n_ctx=64, n_batch=8, abort_callback=cb, **THREADS) as ctx:
            row = ctx.decode(prompt)
            assert np.isfinite(np.asarray(row)).all()
            if i % 2:
                ctx.set_abort_callback(None)  # unregistering releases the handle too
        del row

    growth, live = _soak(cycle)
    assert live == 0, f"{live} abort callbacks outlived their contexts"
    assert growth < RSS_SLACK_KIB, f"RSS grew {growth} KiB over {CYCLES} context create/free cycles"


def test_state_save_load(tiny_model: Model, tmp_path: Path) -> None:
    """Whole-context and per-sequence state, as bytes and as files, saved and loaded back;
    the logits after a reload equal those of the saved state."""
    path = str(tmp_path / "state.bin")
    with tiny_model.context(n_ctx=64, n_batch=8, n_seq_max=2, **THREADS) as ctx:
        ref = np.array(ctx.decode([1, 20, 30, 40]), copy=True)
        ctx.decode([50], pos=4)
        ctx.memory.seq_rm(0, 4)  # back to the 4-token prefix (the last logits are stale)

        def cycle(i: int, live: weakref.WeakSet[_Callback]) -> None:
            kind = i % 3
            if kind == 0:
                blob = ctx.save_state()
                ctx.memory.clear()
                ctx.load_state(blob)
            elif kind == 1:
                blob = ctx.save_seq_state(0)
                ctx.memory.seq_rm(0)
                ctx.load_seq_state(blob, 0)
            else:
                ctx.save_seq_state_file(path, 0, tokens=[1, 20, 30, 40])
                ctx.memory.seq_rm(0)
                ctx.load_seq_state_file(path, 0)
            assert ctx.memory.seq_pos_max(0) == 3
            if i % 100 == 0:  # the loaded prefix is intact: recomputing its last token gives ref
                ctx.memory.seq_rm(0, 3)
                row = np.asarray(ctx.decode([40], pos=3))
                np.testing.assert_allclose(row, ref, rtol=1e-5, atol=1e-5)
                del row

        growth, _ = _soak(cycle)
        ctx.memory.seq_rm(0, 3)
        np.testing.assert_allclose(np.asarray(ctx.decode([40], pos=3)), ref, rtol=1e-5, atol=1e-5)
    assert growth < RSS_SLACK_KIB, f"RSS grew {growth} KiB over {CYCLES} state save/load cycles"


def test_model_load_close(tiny_model_path: Path) -> None:
    """Models loaded with a progress callback and closed (every fifth with a context)."""

    def cycle(i: int, live: weakref.WeakSet[_Callback]) -> None:
        cb = _Callback(True)
        live.add(cb)
        m = Model.load(tiny_model_path, progress_callback=cb)
        assert cb.calls > 0
        if i % 5 == 0:
            with Context(m, n_ctx=32, n_batch=8, **THREADS) as ctx:
                ctx.decode([1, 2])
        m.close()

    growth, live = _soak(cycle)
    assert live == 0, f"{live} progress callbacks outlived their models"
    assert growth < RSS_SLACK_KIB, f"RSS grew {growth} KiB over {CYCLES} model load/close cycles"
