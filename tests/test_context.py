"""Context: parameters, accessors, decoding equivalences, guarded outputs, state, embeddings."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

import llama_cffi
from llama_cffi import (
    ClosedError,
    Context,
    ContextCreateError,
    ContextParams,
    KvCacheType,
    Model,
    ParamError,
    StateError,
    UnsupportedError,
)
from llama_cffi.outputs import OutputView, StaleOutputError
from tests import tiny_model as tm

PROMPT = [tm.BOS_ID, 40, 41, 42, 300, 301, 77, 78, 79, 80, 81, 82]
TOL = {"rtol": 1e-4, "atol": 1e-5}


# ---------------------------------------------------------------- parameters
def test_defaults_come_from_llama_cpp() -> None:
    """context_default_params() mirrors llama_context_default_params() field for field."""
    d = llama_cffi.context_default_params()
    c = llama_cffi.lib.llama_context_default_params()
    assert d["n_batch"] == c.n_batch and d["n_ctx"] == c.n_ctx and d["flash_attn_type"] == c.flash_attn_type
    assert sorted(d) == sorted(n for n, _ in llama_cffi.ffi.typeof("struct llama_context_params").fields)


def test_every_settable_field_is_accepted(tiny_model: Model) -> None:
    """Every llama_context_params field (except managed pointers) can be passed by name."""
    d = llama_cffi.context_default_params()
    for k in ("cb_eval_user_data", "abort_callback_data", "samplers", "n_samplers"):
        d.pop(k)
    d.update(n_ctx=256, n_threads=1, n_threads_batch=1)
    with tiny_model.context(**d) as ctx:
        assert ctx.n_ctx == 256 and ctx.n_threads == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_batch": 0, "n_ubatch": 0}, "n_batch must be >= 1"),
        ({"n_batch": 0, "n_ubatch": 8}, "n_batch must be >= 1"),
        ({"type_v": "q8_0", "flash_attn_type": "disabled"}, "needs flash attention"),
        ({"n_ctx": -1}, "must not be negative"),
        ({"n_seq_max": 0}, "n_seq_max=0"),
        ({"n_seq_max": 100000}, "llama_max_parallel_sequences"),
        ({"n_threads": 0}, "n_threads=0 must be >= 1"),
        ({"type_k": "q9_9"}, "not a valid KvCacheType"),
        ({"flash_attn_type": "sometimes"}, "not a valid FlashAttention"),
        ({"embeddings": 1}, "must be True or False"),
        ({"rope_freq_base": float("inf")}, "finite number"),
        ({"cb_eval": 5}, "must be callable"),
        ({"abort_callback_data": None}, "managed by llama_cffi"),
        ({"samplers": None}, "not supported yet"),
        ({"n_ctx": 2**40}, "out of range"),
    ],
)
def test_bad_params_name_the_field(tiny_model: Model, kwargs: dict[str, object], message: str) -> None:
    """Invalid parameters raise ParamError naming the field, before llama.cpp sees them."""
    with pytest.raises(ParamError, match=message):
        tiny_model.context(**kwargs)


def test_unknown_param(tiny_model: Model) -> None:
    """A misspelt parameter is a TypeError that lists the known fields."""
    with pytest.raises(TypeError, match="n_ctx"):
        tiny_model.context(n_ctxx=5)


def test_n_ctx_zero_needs_a_training_length(tiny_model_path: Path) -> None:
    """n_ctx=0 with a model that declares no training context is refused."""
    with Model.load(tiny_model_path, kv_overrides={"llama.context_length": 0}) as m:
        assert m.n_ctx_train == 0
        with pytest.raises(ParamError, match="n_ctx=0"):
            m.context(n_ctx=0)


def test_enums_by_name_and_member(tiny_model: Model) -> None:
    """Enum fields accept members and names; the KV type is applied (F32 doubles the state)."""
    with tiny_model.context(n_ctx=64, type_k=KvCacheType.F32, type_v="f32") as a, tiny_model.context(n_ctx=64) as b:
        a.decode(PROMPT)
        b.decode(PROMPT)
        assert a.state_size() > b.state_size()


def test_llama_cpp_rejection_is_a_context_create_error(tiny_model: Model) -> None:
    """A configuration llama.cpp itself refuses (Q4_0 K with head dim 16) raises with its reason."""
    with pytest.raises(ContextCreateError, match="block size"):
        Context(tiny_model, n_ctx=64, type_k="q4_0", flash_attn_type="enabled")


def test_context_cascade_retries_smaller(monkeypatch: pytest.MonkeyPatch, tiny_model: Model) -> None:
    """model.context() halves n_ctx, then n_batch, until creation succeeds; it reports what it tried."""
    import llama_cffi.context as context_mod

    real_init = context_mod.Context.__init__
    seen: list[tuple[int, int]] = []

    def flaky(self: Context, model: Model, params: ContextParams | None = None, **kw: object) -> None:
        assert params is not None
        seen.append((int(params.c.n_ctx), int(params.c.n_batch)))
        if params.c.n_ctx > 256 or params.c.n_batch > 64:
            raise ContextCreateError("simulated out of memory")
        real_init(self, model, params=params)

    monkeypatch.setattr(context_mod.Context, "__init__", flaky)
    ctx = tiny_model.context(n_ctx=1024, n_batch=256, n_ubatch=256)
    try:
        assert seen == [(1024, 256), (512, 256), (256, 256), (256, 128), (256, 64)]
        assert (ctx.n_ctx, ctx.n_batch) == (256, 64)
        assert len(ctx.creation_attempts) == 4
    finally:
        ctx.close()


def test_cascade_gives_up_with_a_list(tiny_model: Model) -> None:
    """When every attempt fails, ContextCreateError lists the attempts."""
    with pytest.raises(ContextCreateError, match=r"tried:(.|\n)*n_ctx=512 n_batch=64(.|\n)*n_ctx=256 n_batch=32"):
        tiny_model.context(n_ctx=512, n_batch=64, n_ubatch=64, type_k="q4_0", flash_attn_type="enabled")


# ---------------------------------------------------------------- accessors
def test_accessors_and_controls(tiny_model: Model) -> None:
    """Sizes, threads, pooling name, causal flag, warmup and synchronize behave as llama.h says."""
    with tiny_model.context(n_ctx=128, n_batch=32, n_ubatch=16, n_seq_max=2, n_threads=1) as ctx:
        # llama.cpp pads per-sequence capacity to 256 cells (KV not unified by default)
        assert (ctx.n_ctx_seq, ctx.n_ctx, ctx.n_batch, ctx.n_ubatch, ctx.n_seq_max) == (256, 512, 32, 16, 2)
        ctx.set_n_threads(2, 1)
        assert (ctx.n_threads, ctx.n_threads_batch) == (2, 1)
        with pytest.raises(ParamError):
            ctx.set_n_threads(0)
        assert ctx.pooling_type in ("none", "mean", "cls", "last", "rank", "unspecified")
        assert ctx.causal_attn
        ctx.set_causal_attn(False)
        assert not ctx.causal_attn
        ctx.set_causal_attn(True)
        ctx.warmup()
        assert ctx.n_past == 0 and ctx.memory.seq_pos_max(0) == -1
        ctx.synchronize()
        assert "n_ctx=512" in repr(ctx)


# ---------------------------------------------------------------- decoding equivalences
def test_one_shot_chunked_and_single_agree(tiny_model: Model) -> None:
    """One decode, n_batch-chunked decode and token-by-token decode_single give the same logits."""
    with tiny_model.context(n_ctx=64) as a:
        whole = a.decode(PROMPT).copy()
    with tiny_model.context(n_ctx=64, n_batch=5, n_ubatch=5) as b:
        chunked = b.decode(PROMPT).copy()
    with tiny_model.context(n_ctx=64) as c:
        for t in PROMPT:
            single = c.decode_single(t)
        single = single.copy()
    np.testing.assert_allclose(chunked, whole, **TOL)
    np.testing.assert_allclose(single, whole, **TOL)


def test_all_logits_rows_equal_per_token_logits(tiny_model: Model) -> None:
    """logits='all' rows equal the logits of each prefix, chunked (copied) or not (view)."""
    with tiny_model.context(n_ctx=64) as ctx:
        rows = ctx.decode(PROMPT, logits="all")
        assert isinstance(rows, OutputView) and rows.shape == (len(PROMPT), tm.N_VOCAB)
        rows = rows.copy()
    with tiny_model.context(n_ctx=64, n_batch=4, n_ubatch=4) as ctx:
        chunked = ctx.decode(PROMPT, logits="all")
        assert not isinstance(chunked, OutputView)  # concatenated across chunks: a copy
    np.testing.assert_allclose(chunked, rows, **TOL)
    with tiny_model.context(n_ctx=64) as ctx:
        for k, t in enumerate(PROMPT):
            np.testing.assert_allclose(ctx.decode_single(t), rows[k], **TOL)


def test_logits_mask_and_index(tiny_model: Model) -> None:
    """A boolean mask selects output rows; logits(i) addresses them by batch index."""
    mask = np.zeros(len(PROMPT), dtype=bool)
    mask[[2, 5]] = True
    with tiny_model.context(n_ctx=64) as ctx:
        rows = ctx.decode(PROMPT, logits=mask).copy()
        assert rows.shape == (2, tm.N_VOCAB) and ctx.n_outputs == 2
        np.testing.assert_array_equal(ctx.logits(2), rows[0])
        np.testing.assert_array_equal(ctx.logits(5), rows[1])
        np.testing.assert_array_equal(ctx.logits(-1), rows[1])
        with pytest.raises(IndexError, match="not marked"):
            ctx.logits(3)
        ctx.memory.clear()
        assert ctx.decode(PROMPT[:1], logits="none") is None
        assert ctx.decode(PROMPT[1:4], logits=np.zeros(3, dtype=bool)).shape == (0, tm.N_VOCAB)


def test_seq_cp_then_continue_equals_fresh(tiny_model: Model) -> None:
    """Continuing seq 1 after seq_cp from seq 0 equals decoding the whole text in a fresh context."""
    head, tail = PROMPT[:7], PROMPT[7:]
    with tiny_model.context(n_ctx=64, n_seq_max=2) as ctx:
        ctx.decode(head, seq_id=0)
        ctx.memory.seq_cp(0, 1)
        forked = ctx.decode(tail, seq_id=1).copy()
        assert ctx.memory.seq_pos_max(0) == len(head) - 1
        assert ctx.memory.seq_pos_max(1) == len(PROMPT) - 1
    with tiny_model.context(n_ctx=64) as fresh:
        ref = fresh.decode(PROMPT).copy()
    np.testing.assert_allclose(forked, ref, **TOL)


def test_batch_of_two_sequences(tiny_model: Model) -> None:
    """A Batch decoding two sequences at once gives each the logits of its own text."""
    a, b = PROMPT[:6], PROMPT[6:]
    with tiny_model.context(n_ctx=64, n_seq_max=2) as ctx:
        batch = llama_cffi.Batch(32, 1)
        for i, t in enumerate(a):
            batch.add(t, i, [0], output=i == len(a) - 1)
        for i, t in enumerate(b):
            batch.add(t, i, [1], output=i == len(b) - 1)
        ctx.decode_batch(batch)
        la, lb = ctx.logits(len(a) - 1).copy(), ctx.logits(-1).copy()
    for toks, got in ((a, la), (b, lb)):
        with tiny_model.context(n_ctx=64) as ref:
            np.testing.assert_allclose(got, ref.decode(toks), **TOL)


def test_eval_rewinds_and_n_past(tiny_model: Model) -> None:
    """eval(tokens, n_past) rewrites from n_past; set_n_past truncates sequence 0."""
    with tiny_model.context(n_ctx=64) as ctx:
        ctx.decode(PROMPT)
        assert ctx.n_past == len(PROMPT)
        redo = ctx.eval(PROMPT[5:], 5).copy()
        assert ctx.n_past == len(PROMPT)
        with tiny_model.context(n_ctx=64) as ref:
            np.testing.assert_allclose(redo, ref.decode(PROMPT), **TOL)
        ctx.set_n_past(3)
        assert ctx.n_past == 3


# ---------------------------------------------------------------- guarded outputs
def test_views_are_zero_copy_and_guarded(tiny_model: Model) -> None:
    """A logits view points into llama.cpp's buffer; after the next decode it raises; copies live on."""
    with tiny_model.context(n_ctx=64) as ctx:
        v = ctx.decode(PROMPT)
        raw = np.asarray(v)
        p = llama_cffi.lib.llama_get_logits_ith(ctx.underlying, -1)
        assert raw.__array_interface__["data"][0] == int(llama_cffi.ffi.cast("uintptr_t", p))
        kept = v.copy()
        head = v[:5]  # slices are raw ndarrays into the buffer: valid until the next decode
        doubled = v * 2  # computations give ordinary arrays
        assert type(doubled) is np.ndarray and type(kept) is np.ndarray and type(head) is np.ndarray
        assert int(v.argmax()) == int(kept.argmax()) and v.shape == (tm.N_VOCAB,) and len(v) == tm.N_VOCAB
        assert float(np.max(v)) == float(kept.max()) and v.tolist() == kept.tolist()
        del raw, head
        ctx.decode_single(5)
        for use in (
            lambda: v.argmax(),
            lambda: v[0],
            lambda: np.exp(v),
            lambda: np.asarray(v),
            lambda: np.array(v),
            lambda: v + 1,
            lambda: v.copy(),
            lambda: str(v),
            lambda: list(v),
        ):
            with pytest.raises(StaleOutputError):
                use()
        assert "stale" in repr(v) and v.stale
        np.testing.assert_array_equal(doubled / 2, kept)  # unaffected


def test_raw_arrays_prevent_output_buffer_reallocation(tiny_model: Model) -> None:
    """While a raw array points into the output buffer, a decode that would grow it is split
    (decode) or refused (decode_batch), so the raw array never dangles."""
    with tiny_model.context(n_ctx=512, n_batch=256, n_ubatch=256) as ctx:
        raw = np.asarray(ctx.decode(PROMPT))  # the buffer holds 1 row (n_seq_max)
        before = raw.copy()
        rows = ctx.decode(list(range(3, 43)), logits="all")  # 40 outputs: split, copied
        assert type(rows) is np.ndarray and rows.shape == (40, tm.N_VOCAB)
        float(raw.sum())  # still mapped memory (no crash); contents are the newest decode's
        batch = llama_cffi.Batch(16)
        for i in range(8):
            batch.add(50 + i, ctx.n_past + i, [0], output=True)
        with pytest.raises(llama_cffi.outputs.LiveOutputError):
            ctx.decode_batch(batch)
        del raw
        ctx.decode_batch(batch)  # no raw array left: the buffer may grow now
        assert ctx.logits_all().shape == (8, tm.N_VOCAB)
        assert before.shape == (tm.N_VOCAB,)
    with tiny_model.context(n_ctx=512) as a, tiny_model.context(n_ctx=512) as b:
        toks = list(range(3, 43))
        np.testing.assert_allclose(a.decode(toks, logits="all"), _split_all(b, toks), **TOL)


def _split_all(ctx: Context, toks: list[int]) -> np.ndarray:
    raw = np.asarray(ctx.decode([toks[0]], logits="all"))  # a live raw array forces splitting
    first = raw.copy()  # raw arrays show the newest decode: copy what you keep
    rest = ctx.decode(toks[1:], logits="all")
    assert raw.shape == (1, tm.N_VOCAB) and type(rest) is np.ndarray
    return np.concatenate([first, rest])


def test_views_keep_native_memory_alive_after_close(tiny_model: Model) -> None:
    """Closing a context while a raw view exists defers the free; the view stays readable memory."""
    ctx = tiny_model.context(n_ctx=64)
    v = ctx.decode(PROMPT)
    raw = np.asarray(v)
    total = float(raw.sum())
    ctx.close()
    with pytest.raises(ClosedError):
        v.argmax()
    assert ctx._handle is not None and ctx._handle.ptr != llama_cffi.ffi.NULL  # not freed yet
    assert float(raw.sum()) == total
    del raw, v
    gc.collect()
    assert ctx._handle.ptr == llama_cffi.ffi.NULL  # freed once the last view went


# ---------------------------------------------------------------- state
def test_state_round_trip_bytes_and_files(tmp_path: Path, tiny_model: Model) -> None:
    """Whole and per-sequence states restore identical next-token logits (bytes and files)."""
    with tiny_model.context(n_ctx=64, n_seq_max=2) as src:
        src.decode(PROMPT)
        expect = src.decode_single(7).copy()
        src.memory.seq_rm(0, len(PROMPT), -1)
        blob = src.save_state()
        seq_blob = src.save_seq_state(0)
        src.save_state_file(tmp_path / "s.bin", PROMPT)
        src.save_seq_state_file(tmp_path / "q.bin", 0, PROMPT)
        assert len(blob) > 0 and src.seq_state_size(0) == len(seq_blob)
    with tiny_model.context(n_ctx=64, n_seq_max=2) as dst:
        assert dst.load_state(blob) == len(blob)
        np.testing.assert_allclose(dst.decode_single(7), expect, **TOL)
    with tiny_model.context(n_ctx=64, n_seq_max=2) as dst:
        dst.load_seq_state(seq_blob, dest_seq_id=1)
        assert dst.memory.seq_pos_max(1) == len(PROMPT) - 1 and dst.memory.seq_pos_max(0) == -1
        np.testing.assert_allclose(dst.decode_single(7, seq_id=1), expect, **TOL)
    with tiny_model.context(n_ctx=64, n_seq_max=2) as dst:
        assert dst.load_state_file(tmp_path / "s.bin").tolist() == PROMPT
        np.testing.assert_allclose(dst.decode_single(7), expect, **TOL)
    with tiny_model.context(n_ctx=64, n_seq_max=2) as dst:
        assert dst.load_seq_state_file(tmp_path / "q.bin", 1).tolist() == PROMPT
        np.testing.assert_allclose(dst.decode_single(7, seq_id=1), expect, **TOL)


def test_bad_state_raises_and_context_survives(tiny_model: Model, tmp_path: Path) -> None:
    """Truncated or garbage states raise StateError; the context decodes normally afterwards."""
    with tiny_model.context(n_ctx=64) as ctx:
        ctx.decode(PROMPT)
        blob = ctx.save_state()
        for bad in (blob[: len(blob) // 2], b"\x00" * 64, b"junk"):
            with pytest.raises(StateError):
                ctx.load_state(bad)
            assert np.isfinite(ctx.decode(PROMPT[:3])).all()
            ctx.memory.clear()
        with pytest.raises(StateError):
            ctx.load_state(b"")
        with pytest.raises(StateError):
            ctx.load_state_file(tmp_path / "missing.bin")


# ---------------------------------------------------------------- embeddings
def test_embeddings_mean_pooling_equals_mean_of_tokens(tiny_model: Model) -> None:
    """Mean-pooled sequence embedding equals the mean of the per-token embeddings."""
    with tiny_model.context(n_ctx=64, embeddings=True, pooling_type="none") as ctx:
        ctx.decode(PROMPT, logits="all")
        per_token = np.stack([ctx.embeddings(i).copy() for i in range(len(PROMPT))])
        unit = ctx.embeddings(-1, normalize=True)
        assert per_token.shape == (len(PROMPT), tiny_model.n_embd)
        assert np.linalg.norm(unit) == pytest.approx(1.0, abs=1e-5)
    with tiny_model.context(n_ctx=64, embeddings=True, pooling_type="mean") as ctx:
        assert ctx.pooling_type == "mean"
        ctx.decode(PROMPT, logits="all")
        pooled = ctx.embeddings_seq(0).copy()
    np.testing.assert_allclose(pooled, per_token.mean(axis=0), rtol=1e-4, atol=1e-5)


def test_embeddings_need_the_flag(tiny_model: Model) -> None:
    """Asking for embeddings on a context without them is a ParamError."""
    with tiny_model.context(n_ctx=64) as ctx:
        ctx.decode(PROMPT)
        with pytest.raises(ParamError, match="embeddings are off"):
            ctx.embeddings()


# ---------------------------------------------------------------- perf, generation
def test_perf_counters(tiny_model: Model) -> None:
    """perf() counts prompt and generated tokens; perf_reset() zeroes them."""
    with tiny_model.context(n_ctx=64) as ctx:
        ctx.decode(PROMPT)
        for t in (5, 6, 7):
            ctx.decode_single(t)
        p = ctx.perf()
        assert p["n_p_eval"] == len(PROMPT) and p["n_eval"] == 3
        assert p["t_p_eval_ms"] > 0 and p["t_eval_ms"] > 0  # recorded by default (llama.cpp's is no_perf=True)
        ctx.perf_reset()
        ctx.decode_single(8)
        ctx.decode_single(9)
        assert ctx.perf()["n_eval"] == 2
    with tiny_model.context(n_ctx=64, no_perf=True) as ctx:
        ctx.decode(PROMPT)
        with pytest.raises(UnsupportedError, match="no_perf=True"):
            ctx.perf()
        usage = ctx.memory_usage()  # checked against llama.cpp's numbers in test_memory_usage
        assert usage.model_bytes >= tiny_model.size and usage.k_bytes > 0 and ctx.state_size() > 0


def test_generate_matches_manual_greedy_loop(tiny_model: Model) -> None:
    """generate() with the default greedy sampler equals an explicit argmax loop; stream() pieces join to it."""
    with tiny_model.context(n_ctx=128) as ctx:
        text = ctx.generate(PROMPT, max_tokens=20)
    with tiny_model.context(n_ctx=128) as ctx:
        pieces = list(ctx.stream(PROMPT, max_tokens=20))
    with tiny_model.context(n_ctx=128) as ctx:
        lg = ctx.decode(PROMPT)
        toks = []
        for _ in range(20):
            t = int(np.asarray(lg).argmax())
            if tiny_model.vocab.is_eog(t):
                break
            toks.append(t)
            lg = ctx.decode_single(t)
    assert text == "".join(pieces) == tiny_model.detokenize(toks)


def test_stop_strings(tiny_model: Model) -> None:
    """Generation stops before a stop string; the stop string is not returned."""
    with tiny_model.context(n_ctx=128) as ctx:
        full = ctx.generate(PROMPT, max_tokens=30)
    assert len(full) > 4
    stop = full[3:5]
    with tiny_model.context(n_ctx=128) as ctx:
        cut = ctx.generate(PROMPT, max_tokens=30, stop=[stop])
    assert cut == full[: full.find(stop)]
