"""Context.memory_usage() reports what llama.cpp allocated, checked against llama.cpp's
own numbers: the lines it logs when it makes a cache ("KV buffer size = X MiB", "K (f16):
X MiB, V (f16): Y MiB", and the recurrent "RS" lines), its per-buffer-type breakdown, and
the tensor shapes the model's metadata implies (Gemma 3's head size is 256, not
n_embd / n_head = 160)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import llama_cffi
from llama_cffi import Context, Model
from llama_cffi._binding import lib
from llama_cffi.memory_usage import MemoryUsage
from llama_cffi.testing import TINY_KINDS

BUFFER = re.compile(r"^(llama_kv_cache|llama_memory_recurrent): +(\S+) (KV|RS) buffer size = +([\d.]+) MiB")
KV_SIZE = re.compile(
    r"^llama_kv_cache: size = +[\d.]+ MiB \( *(\d+) cells, +(\d+) layers,.*K \((\w+)\): +([\d.]+) MiB, "
    r"V \((\w+)\): +([\d.]+) MiB"
)
RS_SIZE = re.compile(
    r"^llama_memory_recurrent: size = +[\d.]+ MiB \( *(\d+) cells, +(\d+) layers,.*R \((\w+)\): +([\d.]+) MiB, "
    r"S \((\w+)\): +([\d.]+) MiB"
)
MIB = 1024 * 1024


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def llama_log() -> Iterator[list[str]]:
    """llama.cpp's INFO lines while the block runs."""
    handler = _Lines()
    logger = logging.getLogger("llama_cffi")
    logger.addHandler(handler)
    try:
        llama_cffi.set_verbosity("info")
        yield handler.lines
    finally:
        llama_cffi.set_verbosity(None)
        logger.removeHandler(handler)


def mib(n: int, width: int) -> str:
    """llama.cpp's rendering of a byte count (``%<width>.2f`` of MiB), stripped."""
    return f"{n / MIB:{width}.2f}".strip()


def check_against_log(usage: MemoryUsage, lines: list[str]) -> None:
    """Every cache llama.cpp logged is in ``usage`` with the same numbers, in the same
    order, and nothing else is."""
    buffers = [m for m in map(BUFFER.match, lines) if m]
    sizes = [(m, "kv") for m in map(KV_SIZE.match, lines) if m] + [(m, "rs") for m in map(RS_SIZE.match, lines) if m]
    caches = [c for c in usage.caches if c.kind != "other"]
    assert len(buffers) == len(caches), "\n".join(lines)
    for m, c in zip(buffers, caches, strict=True):  # one buffer per cache on a CPU-only context
        assert m.group(2) == c.buffer_type
        assert (m.group(3) == "RS") == (c.kind == "recurrent")
        assert m.group(4) == mib(c.allocated, 8)
    kv_caches = [c for c in caches if c.kind != "recurrent"]
    rs_caches = [c for c in caches if c.kind == "recurrent"]
    assert len([s for s in sizes if s[1] == "kv"]) == len(kv_caches)
    assert len([s for s in sizes if s[1] == "rs"]) == len(rs_caches)
    for (m, _), c in zip([s for s in sizes if s[1] == "kv"], kv_caches, strict=True):
        cells, layers, tk, k, tv, v = m.groups()
        assert (int(cells), int(layers)) == (c.cells, c.layers)
        assert (tk, tv) == (c.type_by_role["k"], c.type_by_role["v"])
        assert (k, v) == (mib(c.k_bytes, 7), mib(c.v_bytes, 7))
        assert c.layers_by_role["k"] == c.layers_by_role["v"] == int(layers)
    for (m, _), c in zip([s for s in sizes if s[1] == "rs"], rs_caches, strict=True):
        cells, _, tr, r, ts, s = m.groups()  # llama.cpp logs the model's layer count here
        assert int(cells) == c.cells
        assert (tr, ts) == (c.type_by_role["r"], c.type_by_role["s"])
        assert (r, s) == (mib(c.bytes_by_role["r"], 7), mib(c.bytes_by_role["s"], 7))


def check_consistent(usage: MemoryUsage) -> None:
    """The two accountings agree: each buffer type's context bytes (llama.cpp's breakdown)
    are its caches' buffers, and each cache's buffers hold its tensors."""
    per_buft: dict[str, int] = {}
    for c in usage.caches:
        per_buft[c.buffer_type] = per_buft.get(c.buffer_type, 0) + c.allocated
        tensors = sum(t.bytes for t in usage.tensors if (t.module, t.buffer_type) == (c.module, c.buffer_type))
        assert tensors == sum(c.bytes_by_role.values())
        assert 0 <= c.allocated - tensors < 4096, "more padding than ggml's alignment explains"
    assert per_buft == {b.buffer_type: b.context for b in usage.buffers if b.context}
    assert usage.context_bytes == sum(c.allocated for c in usage.caches)


@pytest.mark.parametrize("cache_type", ["f16", "q8_0", "q4_0"])
def test_default_model_kv_cache_equals_llama_cpp(default_model: Model, cache_type: str) -> None:
    """Gemma 3 (a full-attention cache and a sliding-window one): K and V bytes, buffers,
    cells and layers equal llama.cpp's log for f16, q8_0 and q4_0 caches; each layer's K
    and V are ``ggml_row_size(type, head_size * n_head_kv) * cells`` with the head size
    from the metadata (256)."""
    with llama_log() as lines:
        ctx = Context(default_model, n_ctx=1024, type_k=cache_type, type_v=cache_type, flash_attn_type="enabled")
    with ctx:
        usage = ctx.memory_usage()
    check_against_log(usage, lines)
    check_consistent(usage)
    meta = default_model.metadata
    head_k = int(meta["gemma3.attention.key_length"])
    head_v = int(meta["gemma3.attention.value_length"])
    n_head_kv = int(meta["gemma3.attention.head_count_kv"])
    assert head_k == 256 != default_model.n_embd // default_model.n_head
    assert [c.kind for c in usage.caches] == ["kv", "kv_swa"]
    assert sum(c.layers for c in usage.caches) == default_model.n_layer
    qtype = getattr(lib, f"GGML_TYPE_{cache_type.upper()}")

    def row_size(n: int) -> int:  # ggml_row_size: whole blocks of type_size bytes
        assert n % lib.ggml_blck_size(qtype) == 0
        return int(lib.ggml_type_size(qtype)) * n // int(lib.ggml_blck_size(qtype))

    for c in usage.caches:
        assert c.type_by_role == {"k": cache_type, "v": cache_type}
        assert c.k_bytes == c.layers * row_size(head_k * n_head_kv) * c.cells
        assert c.v_bytes == c.layers * row_size(head_v * n_head_kv) * c.cells
    assert usage.k_bytes == sum(t.bytes for t in usage.tensors if t.role == "k")
    assert sorted({t.layer for t in usage.tensors}) == list(range(default_model.n_layer))


def test_k_and_v_types_apart(default_model: Model) -> None:
    """A q8_0 K cache with a q4_0 V cache: each reported with its own type and size."""
    with llama_log() as lines:
        ctx = Context(default_model, n_ctx=512, type_k="q8_0", type_v="q4_0", flash_attn_type="enabled")
    with ctx:
        usage = ctx.memory_usage()
    check_against_log(usage, lines)
    for c in usage.caches:
        assert c.type_by_role == {"k": "q8_0", "v": "q4_0"}
        assert c.k_bytes * 18 == c.v_bytes * 34  # bytes per 32-element block: q8_0 34, q4_0 18


@pytest.mark.parametrize("kind", sorted(TINY_KINDS))
def test_every_model_kind_equals_llama_cpp(tiny_model_of: Callable[[str], Path], kind: str) -> None:
    """Every kind of memory llama.cpp has (attention, sliding-window, encoder-decoder,
    recurrent, hybrid, none for encoders) is reported as llama.cpp logs it, for two
    sequences (the recurrent state has a cell per sequence)."""
    with Model.load(tiny_model_of(kind)) as model:
        with llama_log() as lines:
            ctx = Context(model, n_ctx=256, n_seq_max=2, kv_unified=kind == "t5")
        with ctx:
            usage = ctx.memory_usage()
        check_against_log(usage, lines)
        check_consistent(usage)
        kinds = [c.kind for c in usage.caches]
        if kind.startswith("bert"):
            assert kinds == [] and usage.context_bytes == 0
        elif kind == "mamba":
            assert kinds == ["recurrent"] and usage.caches[0].cells == 2
        elif kind == "hybrid":
            assert kinds == ["kv", "recurrent"]
        elif kind == "swa":
            assert kinds == ["kv", "kv_swa"]
        else:
            assert kinds == ["kv"] and usage.caches[0].cells == 256
        assert usage.model_bytes >= model.size
        assert usage.by_device()["Host"]["context"] == usage.context_bytes


def test_cells_follow_n_ctx(default_model: Model) -> None:
    """A cache twice as long is twice the bytes (the old estimate got q8_0 caches 32x
    wrong; this pins the scaling as well as the values above)."""
    sizes = []
    for n_ctx in (256, 512):
        with default_model.context(n_ctx=n_ctx, type_k="q8_0", type_v="q8_0", flash_attn_type="enabled") as ctx:
            u = ctx.memory_usage()
            sizes.append((u.k_bytes, u.v_bytes, u.caches[0].cells))
    assert sizes[1] == (2 * sizes[0][0], 2 * sizes[0][1], 2 * sizes[0][2])


def test_as_dict_and_text(tiny_model: Model) -> None:
    """The plain-data and printed forms carry the same numbers."""
    with tiny_model.context(n_ctx=256) as ctx:
        u = ctx.memory_usage()
    d = u.as_dict()
    assert d["k_bytes"] == u.k_bytes and d["context_bytes"] == u.context_bytes
    assert d["caches"][0]["bytes_by_role"] == dict(u.caches[0].bytes_by_role)
    assert f"K (f16): {u.caches[0].k_bytes / MIB:.2f} MiB" in str(u)


def test_closed_context_raises(tiny_model: Model) -> None:
    ctx = tiny_model.context(n_ctx=64)
    ctx.close()
    with pytest.raises(llama_cffi.ClosedError):
        ctx.memory_usage()
