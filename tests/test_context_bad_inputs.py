"""Bad inputs to a Context never reach C unchecked: each one raises its typed exception.

Every test runs one group of cases in a fresh interpreter (``run_isolated``): several
of these inputs would abort the process inside llama.cpp if they got through, so the
child must exit normally. The child (``_child`` below, imported by the subprocess)
runs each case, records the name of the exception it raised, notes whether a case that
should leave the KV memory alone changed it, then proves that the context (or, after
``close``, the model) is still usable with one real decode, and prints everything as
one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import llama_cffi
from llama_cffi import Batch, Context, Memory, Threadpool
from llama_cffi.sampling import LlamaSampler
from tests.conftest import run_isolated
from tests.tiny_model import write_tiny_model

PROMPT = [1, 40, 41, 42]  # sequence 0 holds positions 0..3 before the cases run
N_SEQ = 2
N_BATCH = 32
OK = "no error"


# ---------------------------------------------------------------------- the child side
@dataclass
class Case:
    name: str
    expected: str  # an exception class name, or OK
    fn: Callable[[], object]
    keeps_memory: bool = True  # a failing call must not change any sequence's positions


class Env:
    """What the cases of one child share: the model, a context, saved states, paths."""

    def __init__(self, model_path: str, other_path: str, tmp: str) -> None:
        self.model = llama_cffi.Model.load(model_path)
        self.other_path = other_path
        self.tmp = Path(tmp)
        self.ctx = self.model.context(n_ctx=64, n_batch=N_BATCH, n_seq_max=N_SEQ)
        self.mem = self.ctx.memory
        self.n_vocab = self.model.n_vocab
        self.n_ctx_seq = self.ctx.n_ctx_seq
        self.ctx.decode(PROMPT)
        self.good_state = self.ctx.save_state()
        self.good_seq_state = self.ctx.save_seq_state(0)
        self.setup: Callable[[], None] | None = None  # run before each case

    def positions(self) -> list[tuple[int, int]]:
        if self.ctx.closed:
            return []
        return [(self.mem.seq_pos_min(s), self.mem.seq_pos_max(s)) for s in range(N_SEQ)]

    def batch(self, *tokens: tuple[int, int, tuple[int, ...]], capacity: int = 8, n_seq_max: int = N_SEQ) -> Any:
        """A Batch of ``(token, pos, seq_ids)``, the last one marked for output."""
        b = Batch(capacity, n_seq_max)
        for i, (tok, pos, seqs) in enumerate(tokens):
            b.add(tok, pos, seqs, output=i == len(tokens) - 1)
        return b


async def _first_piece(ctx: Any) -> str:
    async for piece in ctx.astream([5], max_tokens=2):
        return str(piece)
    return ""


def _token_cases(e: Env) -> list[Case]:
    ctx, v = e.ctx, e.n_vocab
    cases = [
        Case("decode [-1]", "InvalidTokenError", lambda: ctx.decode([5, -1])),
        Case("decode [n_vocab]", "InvalidTokenError", lambda: ctx.decode([v])),
        Case("decode [2**31-1]", "InvalidTokenError", lambda: ctx.decode([2**31 - 1])),
        Case("decode [2**31]", "InvalidTokenError", lambda: ctx.decode([2**31])),
        Case("decode [2**64]", "InvalidTokenError", lambda: ctx.decode([2**64])),
        Case("decode [-2**31]", "InvalidTokenError", lambda: ctx.decode([-(2**31)])),
        Case("decode [1.0]", "TokenTypeError", lambda: ctx.decode([1.0])),
        Case("decode [nan]", "TokenTypeError", lambda: ctx.decode([float("nan")])),
        Case("decode [True]", "TokenTypeError", lambda: ctx.decode([True])),
        Case("decode [5, False]", "TokenTypeError", lambda: ctx.decode([5, False])),
        Case("decode [np.True_]", "TokenTypeError", lambda: ctx.decode([np.True_])),
        Case("decode bool array", "TokenTypeError", lambda: ctx.decode(np.array([True, False]))),
        Case("decode float64 array", "TokenTypeError", lambda: ctx.decode(np.array([1.0, 2.0]))),
        Case("decode float32 array", "TokenTypeError", lambda: ctx.decode(np.array([1, 2], dtype=np.float32))),
        Case("decode object array", "TokenTypeError", lambda: ctx.decode(np.array([1, None], dtype=object))),
        Case("decode uint64 array n_vocab", "InvalidTokenError", lambda: ctx.decode(np.array([v], dtype=np.uint64))),
        Case("decode int64 array -1", "InvalidTokenError", lambda: ctx.decode(np.array([3, -1], dtype=np.int64))),
        Case("decode 2-D array", "InvalidTokenError", lambda: ctx.decode(np.array([[1, 2], [3, 4]]))),
        Case("decode 2-D list", "InvalidTokenError", lambda: ctx.decode([[1, 2]])),
        Case("decode 0-D array", "InvalidTokenError", lambda: ctx.decode(np.array(5))),
        Case("decode str", "TokenTypeError", lambda: ctx.decode("hello")),
        Case("decode []", "InvalidBatchError", lambda: ctx.decode([])),
        Case("decode empty int32 array", "InvalidBatchError", lambda: ctx.decode(np.zeros(0, dtype=np.int32))),
        Case("decode empty float array", "InvalidBatchError", lambda: ctx.decode(np.zeros(0))),
        Case("decode_single -1", "InvalidTokenError", lambda: ctx.decode_single(-1)),
        Case("decode_single n_vocab", "InvalidTokenError", lambda: ctx.decode_single(v)),
        Case("decode_single 2**31-1", "InvalidTokenError", lambda: ctx.decode_single(2**31 - 1)),
        Case("decode_single 2**63", "InvalidTokenError", lambda: ctx.decode_single(2**63)),
        Case("decode_single np.int64(n_vocab)", "InvalidTokenError", lambda: ctx.decode_single(np.int64(v))),
        Case("decode_single 1.0", "TokenTypeError", lambda: ctx.decode_single(1.0)),
        Case("decode_single np.float32", "TokenTypeError", lambda: ctx.decode_single(np.float32(3))),
        Case("decode_single True", "TokenTypeError", lambda: ctx.decode_single(True)),
        Case("decode_single np.True_", "TokenTypeError", lambda: ctx.decode_single(np.True_)),
        Case("decode_single '5'", "TokenTypeError", lambda: ctx.decode_single("5")),
        Case("decode_single None", "TokenTypeError", lambda: ctx.decode_single(None)),
        Case("encode [-1]", "InvalidTokenError", lambda: ctx.encode([-1])),
        Case("encode []", "InvalidBatchError", lambda: ctx.encode([])),
        Case("encode > n_batch", "InvalidBatchError", lambda: ctx.encode([5] * (N_BATCH + 1))),
        Case("encode on a decoder-only model", "UnsupportedError", lambda: ctx.encode([5, 6])),
        Case("eval [n_vocab] at the end", "InvalidTokenError", lambda: ctx.eval([v], 4)),
        Case("generate [-1]", "InvalidTokenError", lambda: ctx.generate([-1], max_tokens=1)),
        Case("generate max_tokens=-1", "ParamError", lambda: ctx.generate([5], max_tokens=-1)),
    ]
    return cases


def bad_seq(bad: object) -> str:
    """The error of a bad sequence id: out of range, a ParamError; no int (a bool), a
    ParamTypeError (a ParamError and a TypeError)."""
    return "ParamTypeError" if isinstance(bad, bool) else "ParamError"


def _seq_id_cases(e: Env) -> list[Case]:
    ctx, mem, st = e.ctx, e.mem, e.good_seq_state
    path = str(e.tmp / "seq.bin")
    cases: list[Case] = []
    for bad in (-1, N_SEQ, 2**31, True):
        cases += [
            Case(f"decode seq_id={bad}", bad_seq(bad), lambda b=bad: ctx.decode([5], seq_id=b)),
            Case(f"save_seq_state({bad})", bad_seq(bad), lambda b=bad: ctx.save_seq_state(b)),
            Case(f"seq_state_size({bad})", bad_seq(bad), lambda b=bad: ctx.seq_state_size(b)),
            Case(f"load_seq_state(.., {bad})", bad_seq(bad), lambda b=bad: ctx.load_seq_state(st, b)),
            Case(f"save_seq_state_file(.., {bad})", bad_seq(bad), lambda b=bad: ctx.save_seq_state_file(path, b)),
            Case(f"load_seq_state_file(.., {bad})", bad_seq(bad), lambda b=bad: ctx.load_seq_state_file(path, b)),
            Case(f"embeddings_seq({bad})", bad_seq(bad), lambda b=bad: ctx.embeddings_seq(b)),
            Case(f"memory.seq_cp({bad}, 1)", bad_seq(bad), lambda b=bad: mem.seq_cp(b, 1)),
            Case(f"memory.seq_cp(0, {bad})", bad_seq(bad), lambda b=bad: mem.seq_cp(0, b)),
            Case(f"memory.seq_keep({bad})", bad_seq(bad), lambda b=bad: mem.seq_keep(b)),
            Case(f"memory.seq_add({bad}, ..)", bad_seq(bad), lambda b=bad: mem.seq_add(b, 0, -1, 1)),
            Case(f"memory.seq_div({bad}, ..)", bad_seq(bad), lambda b=bad: mem.seq_div(b, 0, -1, 2)),
            Case(f"memory.seq_pos_min({bad})", bad_seq(bad), lambda b=bad: mem.seq_pos_min(b)),
            Case(f"memory.seq_pos_max({bad})", bad_seq(bad), lambda b=bad: mem.seq_pos_max(b)),
            Case(f"decode_single seq_id={bad}", bad_seq(bad), lambda b=bad: ctx.decode_single(5, seq_id=b)),
            Case(f"set_backend_sampler({bad}, None)", bad_seq(bad), lambda b=bad: ctx.set_backend_sampler(b, None)),
            Case(f"backend_sampler({bad})", bad_seq(bad), lambda b=bad: ctx.backend_sampler(b)),
        ]
    for bad in (-2, N_SEQ, True):  # -1 means "every sequence" for seq_rm
        cases.append(Case(f"memory.seq_rm({bad})", bad_seq(bad), lambda b=bad: mem.seq_rm(b)))
    cases += [
        Case("memory.seq_rm p0=2**31", "ParamError", lambda: mem.seq_rm(0, 2**31)),
        Case("memory.seq_rm p1=-2**31-1", "ParamError", lambda: mem.seq_rm(0, 0, -(2**31) - 1)),
        Case("memory.seq_rm p0=1.5", "ParamError", lambda: mem.seq_rm(0, 1.5)),
        Case("memory.seq_cp p1=None", "ParamError", lambda: mem.seq_cp(0, 1, 0, None)),
        # one KV stream per sequence (kv_unified=False): llama.cpp aborts on a partial copy
        Case("memory.seq_cp part, split streams", "ParamError", lambda: mem.seq_cp(0, 1, 0, 2)),
        Case("memory.seq_cp from p0, split streams", "ParamError", lambda: mem.seq_cp(0, 1, 1, -1)),
        Case("memory.seq_add delta=2**31", "ParamError", lambda: mem.seq_add(0, 0, -1, 2**31)),
        Case("memory.seq_add delta=1.0", "ParamError", lambda: mem.seq_add(0, 0, -1, 1.0)),
        Case("memory.seq_div d=1", "ParamError", lambda: mem.seq_div(0, 0, -1, 1)),
        Case("memory.seq_div d=0", "ParamError", lambda: mem.seq_div(0, 0, -1, 0)),
        Case("memory.seq_div d=-2", "ParamError", lambda: mem.seq_div(0, 0, -1, -2)),
        Case("memory.seq_div d=2.0", "ParamError", lambda: mem.seq_div(0, 0, -1, 2.0)),
    ]
    return cases


def _position_cases(e: Env) -> list[Case]:
    ctx, n = e.ctx, e.n_ctx_seq
    return [
        Case("decode pos beyond pos_max+1", "InvalidBatchError", lambda: ctx.decode([5], pos=5)),
        Case("decode pos rewriting the last", "InvalidBatchError", lambda: ctx.decode([5], pos=3)),
        Case("decode pos rewriting the first", "InvalidBatchError", lambda: ctx.decode([5, 6], pos=0)),
        Case("decode pos=-1", "InvalidBatchError", lambda: ctx.decode([5], pos=-1)),
        Case("decode pos=True", "ParamTypeError", lambda: ctx.decode([5], pos=True)),
        Case("decode pos=4.0", "ParamTypeError", lambda: ctx.decode([5], pos=4.0)),
        Case("decode_single pos beyond", "InvalidBatchError", lambda: ctx.decode_single(5, pos=6)),
        Case("decode_single pos rewriting", "InvalidBatchError", lambda: ctx.decode_single(5, pos=2)),
        Case("decode_single pos=-3", "InvalidBatchError", lambda: ctx.decode_single(5, pos=-3)),
        Case("eval leaving a gap", "InvalidBatchError", lambda: ctx.eval([5], 10)),
        Case("decode n_ctx_seq+1 tokens", "KvCacheFullError", lambda: ctx.decode([5] * (n + 1), seq_id=1)),
        Case("decode past n_ctx_seq", "KvCacheFullError", lambda: ctx.decode([5] * (n - 3))),
        Case("decode at pos n_ctx_seq", "KvCacheFullError", lambda: ctx.decode([5], pos=n, seq_id=1)),
        Case("decode at pos 2**31-1", "KvCacheFullError", lambda: ctx.decode([5, 6], pos=2**31 - 1, seq_id=1)),
        Case("decode at pos 2**40", "KvCacheFullError", lambda: ctx.decode([5], pos=2**40, seq_id=1)),
        Case("decode_single at pos n_ctx_seq", "KvCacheFullError", lambda: ctx.decode_single(5, pos=n, seq_id=1)),
        Case("set_n_past(-1)", "ParamError", lambda: ctx.set_n_past(-1)),
        Case("set_n_past(1.5)", "ParamError", lambda: ctx.set_n_past(1.5)),
        Case("set_n_past(True)", "ParamError", lambda: ctx.set_n_past(True)),
    ]


def _batch_cases(e: Env) -> list[Case]:
    ctx, b, v, n = e.ctx, e.batch, e.n_vocab, e.n_ctx_seq

    def decode(batch: Any) -> None:
        ctx.decode_batch(batch)

    def too_big() -> None:
        decode(b(*[(5, p, (1,)) for p in range(N_BATCH + 1)], capacity=N_BATCH + 1))

    def no_seq() -> None:
        batch = b((5, 0, (1,)), (6, 1, (1,)))
        batch.n_seq_id[1] = 0
        decode(batch)

    def overfill() -> None:
        batch = Batch(1)
        batch.add(5, 0, (1,))
        batch.add(6, 1, (1,))

    return [
        Case("batch > n_batch", "InvalidBatchError", too_big),
        Case("empty batch", "InvalidBatchError", lambda: decode(Batch(4))),
        Case("batch token -1", "InvalidBatchError", lambda: decode(b((5, 0, (1,)), (-1, 1, (1,))))),
        Case("batch token n_vocab", "InvalidBatchError", lambda: decode(b((v, 0, (1,))))),
        Case("batch token 2**31-1", "InvalidBatchError", lambda: decode(b((2**31 - 1, 0, (1,))))),
        Case("batch seq id -1", "InvalidBatchError", lambda: decode(b((5, 0, (-1,))))),
        Case("batch seq id n_seq_max", "InvalidBatchError", lambda: decode(b((5, 0, (N_SEQ,)), n_seq_max=4))),
        Case(
            "batch seq ids past the context's",
            "InvalidBatchError",
            lambda: decode(b((5, 0, (0, 1, 2, 3)), n_seq_max=4)),
        ),
        Case("batch token in no sequence", "InvalidBatchError", no_seq),
        Case("batch positions with a gap", "InvalidBatchError", lambda: decode(b((5, 0, (1,)), (6, 2, (1,))))),
        Case("batch positions decreasing", "InvalidBatchError", lambda: decode(b((5, 1, (1,)), (6, 0, (1,))))),
        Case("batch positions repeated", "InvalidBatchError", lambda: decode(b((5, 0, (1,)), (6, 0, (1,))))),
        Case("batch seq listed twice", "InvalidBatchError", lambda: decode(b((5, 0, (1, 1))))),
        Case("batch not continuing seq 0", "InvalidBatchError", lambda: decode(b((5, 5, (0,))))),
        Case("batch rewriting seq 0", "InvalidBatchError", lambda: decode(b((5, 3, (0,))))),
        Case("batch negative position", "InvalidBatchError", lambda: decode(b((5, -1, (1,))))),
        Case("batch at pos n_ctx_seq", "KvCacheFullError", lambda: decode(b((5, n, (1,))))),
        Case("batch coupling diverged seqs", "InvalidBatchError", lambda: decode(b((5, 4, (0, 1))))),
        Case("Batch.add past capacity", "ParamError", overfill),
        Case("Batch.add no seq ids", "ParamError", lambda: Batch(2).add(5, 0, ())),
        Case("Batch.add too many seq ids", "ParamError", lambda: Batch(2, 1).add(5, 0, (0, 1))),
        Case("Batch(0)", "ParamError", lambda: Batch(0)),
        Case("Batch(True)", "ParamError", lambda: Batch(True)),
        Case("Batch(4, 0)", "ParamError", lambda: Batch(4, 0)),
    ]


def _output_cases(e: Env) -> list[Case]:
    ctx = e.ctx

    def ready() -> None:  # the last decode: PROMPT continued by 4 tokens, only the last one an output
        e.mem.seq_rm(0, 4)
        ctx.decode([5, 6, 7, 8])

    e.setup = ready

    def mask(m: Any) -> Callable[[], object]:
        return lambda: ctx.decode([5, 6], seq_id=1, logits=m)

    def no_outputs() -> None:
        ctx.decode([5, 6], seq_id=1, logits="none")
        try:
            ctx.logits()
        finally:
            e.mem.seq_rm(1)

    def stale(use: Callable[[Any], object], *, sub: bool = False) -> Callable[[], object]:
        def run() -> None:
            view = ctx.decode([5], seq_id=1)
            if sub:
                view = view[:10]
            ctx.decode_single(6, seq_id=1)
            e.mem.seq_rm(1)
            use(view)

        return run

    return [
        Case("logits(0): not an output", "IndexError", lambda: ctx.logits(0)),
        Case("logits(2): not an output", "IndexError", lambda: ctx.logits(2)),
        Case("logits(4): past the batch", "IndexError", lambda: ctx.logits(4)),
        Case("logits(1000)", "IndexError", lambda: ctx.logits(1000)),
        Case("logits(-2): one output only", "IndexError", lambda: ctx.logits(-2)),
        Case("logits(-1000)", "IndexError", lambda: ctx.logits(-1000)),
        Case("logits() after logits='none'", "IndexError", no_outputs, keeps_memory=False),
        Case("embeddings(0) with embeddings off", "ParamError", lambda: ctx.embeddings(0)),
        Case("embeddings_seq(0) without pooling", "ParamError", lambda: ctx.embeddings_seq(0)),
        Case("mask too long", "ParamError", mask(np.ones(3, dtype=bool))),
        Case("mask too short", "ParamError", mask(np.ones(1, dtype=bool))),
        Case("mask empty", "ParamError", mask(np.zeros(0, dtype=bool))),
        Case("mask 2-D", "ParamError", mask(np.ones((2, 1), dtype=bool))),
        Case("mask of ints", "ParamError", mask(np.ones(2, dtype=np.int8))),
        Case("mask list of ints", "ParamError", mask([1, 0])),
        Case("mask of floats", "ParamError", mask(np.ones(2))),
        Case("mask scalar True", "ParamError", mask(True)),
        Case("mask None", "ParamError", mask(None)),
        Case("logits='first'", "ParamError", mask("first")),
        Case("logits=''", "ParamError", mask("")),
        Case("sampled() without a backend sampler", "UnsupportedError", lambda: ctx.sampled()),
        Case("sampled(0): not an output", "IndexError", lambda: ctx.sampled(0)),
        Case("sampled(-2): one output only", "IndexError", lambda: ctx.sampled(-2)),
        Case(
            "set_backend_sampler: not a chain", "ParamError", lambda: ctx.set_backend_sampler(1, LlamaSampler.top_k(3))
        ),
        Case(
            "set_backend_sampler: an empty chain",
            "ParamError",
            lambda: ctx.set_backend_sampler(1, LlamaSampler.chain()),
        ),
        Case("set_backend_sampler: not a sampler", "ParamError", lambda: ctx.set_backend_sampler(1, "top-k")),  # type: ignore[arg-type]
        Case("stale view .sum()", "StaleOutputError", stale(lambda v: v.sum()), keeps_memory=False),
        Case("stale view [0]", "StaleOutputError", stale(lambda v: v[0]), keeps_memory=False),
        Case("stale view np.argmax", "StaleOutputError", stale(np.argmax), keeps_memory=False),
        Case("stale view + 1", "StaleOutputError", stale(lambda v: v + 1), keeps_memory=False),
        Case("stale view .copy()", "StaleOutputError", stale(lambda v: v.copy()), keeps_memory=False),
        Case("stale view iteration", "StaleOutputError", stale(list), keeps_memory=False),
        Case("stale view np.array (a copy)", "StaleOutputError", stale(np.array), keeps_memory=False),
        Case("stale view np.asarray", "StaleOutputError", stale(np.asarray), keeps_memory=False),
        Case("stale view after load_state", "StaleOutputError", lambda: _stale_after_load(e), keeps_memory=False),
    ]


def _stale_after_load(e: Env) -> None:
    view = e.ctx.logits()
    e.ctx.load_state(e.good_state)
    view.sum()


def _state_cases(e: Env) -> list[Case]:
    ctx, good, good_seq = e.ctx, e.good_state, e.good_seq_state

    def reset() -> None:  # every case starts from the good state
        ctx.load_state(good)

    e.setup = reset
    rng = np.random.default_rng(0)
    with llama_cffi.Model.load(e.other_path) as other, other.context(n_ctx=64, n_seq_max=N_SEQ) as octx:
        assert other.n_embd != e.model.n_embd
        octx.decode(PROMPT)
        other_state, other_seq = octx.save_state(), octx.save_seq_state(0)
    with e.model.context(n_ctx=64, n_seq_max=N_SEQ + 1) as c3:  # one more KV stream
        c3.decode(PROMPT)
        streams_state = c3.save_state()
    corrupt_count = bytearray(good)
    corrupt_count[13:17] = (10**6).to_bytes(4, "little")  # stream 0's cell count
    session = e.tmp / "session.bin"
    ctx.save_state_file(session, PROMPT)
    data = session.read_bytes()
    truncated_session = e.tmp / "truncated.bin"
    truncated_session.write_bytes(data[: len(data) // 2])
    garbage = e.tmp / "garbage.bin"
    garbage.write_bytes(rng.bytes(4096))

    def load(blob: bytes) -> Callable[[], object]:
        return lambda: ctx.load_state(blob)

    def load_seq(blob: bytes) -> Callable[[], object]:
        return lambda: ctx.load_seq_state(blob, 1)

    def no_logits_after_load() -> None:
        ctx.decode([5], seq_id=1)
        ctx.load_state(good)
        ctx.logits()

    cases = [
        Case("load_state empty", "StateError", load(b"")),
        Case("load_state 1 byte", "StateError", load(good[:1])),
        Case("load_state half", "StateError", load(good[: len(good) // 2])),
        Case("load_state all but 1 byte", "StateError", load(good[:-1])),
        Case("load_state random", "StateError", load(rng.bytes(4096))),
        Case("load_state random, same size", "StateError", load(rng.bytes(len(good)))),
        Case("load_state zeros", "StateError", load(bytes(len(good)))),
        Case("load_state huge cell count", "StateError", load(bytes(corrupt_count))),
        Case("load_state other model", "StateError", load(other_state)),
        Case("load_state other n_seq_max", "StateError", load(streams_state)),
        Case("load_state of a seq state", "StateError", load(good_seq)),
        Case("load_seq_state empty", "StateError", load_seq(b"")),
        Case("load_seq_state half", "StateError", load_seq(good_seq[: len(good_seq) // 2])),
        Case("load_seq_state all but 1 byte", "StateError", load_seq(good_seq[:-1])),
        Case("load_seq_state random", "StateError", load_seq(rng.bytes(4096))),
        Case("load_seq_state of a whole state", "StateError", load_seq(good)),
        Case("load_seq_state other model", "StateError", load_seq(other_seq)),
        Case("load_state_file missing", "StateError", lambda: ctx.load_state_file(e.tmp / "missing.bin")),
        Case("load_state_file truncated", "StateError", lambda: ctx.load_state_file(truncated_session)),
        Case("load_state_file garbage", "StateError", lambda: ctx.load_state_file(garbage)),
        Case("load_seq_state_file garbage", "StateError", lambda: ctx.load_seq_state_file(garbage, 1)),
        Case("logits() right after load_state", "IndexError", no_logits_after_load, keeps_memory=False),
        Case("load_state good (control)", OK, load(good)),
        Case("load_seq_state good (control)", OK, load_seq(good_seq), keeps_memory=False),
    ]
    for c in cases:
        if c.name.startswith("load_state") and c.expected != OK:
            c.keeps_memory = False  # a failed whole-state load clears the memory, as documented
    return cases


def _callback_cases(e: Env) -> list[Case]:
    ctx = e.ctx

    def inside_decode(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> None:
            ctx.set_abort_callback(lambda: bool(fn()), interval=0)
            try:
                ctx.decode([5, 6, 7], seq_id=1)
            finally:
                ctx.set_abort_callback(None)
                e.mem.seq_rm(1)

        return run

    return [
        Case("decode from the abort callback", "ConcurrentUseError", inside_decode(lambda: ctx.decode_single(5))),
        Case("seq_rm from the abort callback", "ConcurrentUseError", inside_decode(lambda: e.mem.seq_rm(0))),
        Case("save_state from the abort callback", "ConcurrentUseError", inside_decode(ctx.save_state)),
        Case("close from the abort callback", "ConcurrentUseError", inside_decode(ctx.close)),
        Case("logits() from the abort callback", "ConcurrentUseError", inside_decode(ctx.logits)),
        Case("logits_all() from the abort callback", "ConcurrentUseError", inside_decode(ctx.logits_all)),
        Case("abort callback not callable", "ParamTypeError", lambda: ctx.set_abort_callback(5)),
        Case("abort interval -1", "ParamError", lambda: ctx.set_abort_callback(None, interval=-1)),
        Case("abort interval nan", "ParamError", lambda: ctx.set_abort_callback(None, interval=float("nan"))),
        Case("set_n_threads(0)", "ParamError", lambda: ctx.set_n_threads(0)),
        Case("set_n_threads(True)", "ParamError", lambda: ctx.set_n_threads(True)),
        Case("set_n_threads(1, 0)", "ParamError", lambda: ctx.set_n_threads(1, 0)),
        Case("set_n_threads(2.0)", "ParamError", lambda: ctx.set_n_threads(2.0)),
    ]


#: Public names of a closed Context that need not raise: closing, the closed flag, the
#: signal-safe abort flag, and the outputs count of the last decode (plain Python state).
CLOSED_EXEMPT = frozenset({"close", "free", "closed", "request_abort", "n_outputs"})


def _closed_cases(e: Env) -> list[Case]:
    ctx, mem = e.ctx, e.mem
    old_view = ctx.decode([5], seq_id=1)
    view = ctx.decode_single(6, seq_id=1)
    batch = e.batch((7, 6, (1,)))
    session, seq_session = e.tmp / "s.bin", e.tmp / "q.bin"
    ctx.save_state_file(session)
    ctx.save_seq_state_file(seq_session, 0)
    ctx.close()
    api: dict[str, Callable[[], object]] = {
        "adecode": lambda: asyncio.run(ctx.adecode([5])),
        "agenerate": lambda: asyncio.run(ctx.agenerate([5], max_tokens=2)),
        "arun": lambda: asyncio.run(ctx.arun(lambda: ctx.decode([5]))),
        "astream": lambda: asyncio.run(_first_piece(ctx)),
        "backend_sampler": lambda: ctx.backend_sampler(0),
        "causal_attn": lambda: ctx.causal_attn,
        "decode": lambda: ctx.decode([5]),
        "decode_batch": lambda: ctx.decode_batch(batch),
        "decode_embeddings": lambda: ctx.decode_embeddings(np.zeros((1, e.model.n_embd_inp), np.float32)),
        "decode_single": lambda: ctx.decode_single(5),
        "embeddings": lambda: ctx.embeddings(),
        "embeddings_seq": lambda: ctx.embeddings_seq(0),
        "embed": lambda: ctx.embed(["a"]),
        "encode": lambda: ctx.encode([5]),
        "eval": lambda: ctx.eval([5], 0),
        "generate": lambda: ctx.generate([5], max_tokens=1),
        "load_seq_state": lambda: ctx.load_seq_state(e.good_seq_state, 1),
        "load_seq_state_file": lambda: ctx.load_seq_state_file(seq_session, 1),
        "load_state": lambda: ctx.load_state(e.good_state),
        "load_state_file": lambda: ctx.load_state_file(session),
        "logits": lambda: ctx.logits(),
        "logits_all": lambda: ctx.logits_all(),
        "rerank": lambda: ctx.rerank("q", ["d"]),
        "sampled": lambda: ctx.sampled(),
        "start_decoder": lambda: ctx.start_decoder([5]),
        "memory_usage": lambda: ctx.memory_usage(),
        "n_ctx": lambda: ctx.n_ctx,
        "n_ctx_seq": lambda: ctx.n_ctx_seq,
        "n_past": lambda: ctx.n_past,
        "n_rs_seq": lambda: ctx.n_rs_seq,
        "n_seq_max": lambda: ctx.n_seq_max,
        "n_threads": lambda: ctx.n_threads,
        "n_threads_batch": lambda: ctx.n_threads_batch,
        "n_ubatch": lambda: ctx.n_ubatch,
        "perf": lambda: ctx.perf(),
        "perf_reset": lambda: ctx.perf_reset(),
        "pooling_type": lambda: ctx.pooling_type,
        "save_seq_state": lambda: ctx.save_seq_state(0),
        "save_seq_state_file": lambda: ctx.save_seq_state_file(e.tmp / "q2.bin", 0),
        "save_state": lambda: ctx.save_state(),
        "save_state_file": lambda: ctx.save_state_file(e.tmp / "s2.bin"),
        "seq_state_size": lambda: ctx.seq_state_size(0),
        "set_abort_callback": lambda: ctx.set_abort_callback(None),
        "set_backend_sampler": lambda: ctx.set_backend_sampler(0, None),
        "set_causal_attn": lambda: ctx.set_causal_attn(True),
        "set_control_vector": lambda: ctx.set_control_vector(None),
        "set_embeddings": lambda: ctx.set_embeddings(False),
        "set_lora_adapters": lambda: ctx.set_lora_adapters(None),
        "set_n_past": lambda: ctx.set_n_past(0),
        "set_n_threads": lambda: ctx.set_n_threads(1),
        "set_warmup": lambda: ctx.set_warmup(False),
        "state_size": lambda: ctx.state_size(),
        "threadpool": lambda: ctx.threadpool,
        "adaptive_threads": lambda: ctx.adaptive_threads,
        "attach_threadpool": lambda: ctx.attach_threadpool(Threadpool(1)),
        "detach_threadpool": lambda: ctx.detach_threadpool(),
        "stream": lambda: next(ctx.stream([5], max_tokens=1)),
        "synchronize": lambda: ctx.synchronize(),
        "underlying": lambda: ctx.underlying,
        "warmup": lambda: ctx.warmup(),
    }
    memory_api: dict[str, Callable[[], object]] = {
        "can_shift": lambda: mem.can_shift,
        "clear": lambda: mem.clear(),
        "seq_add": lambda: mem.seq_add(0, 0, -1, 1),
        "seq_cp": lambda: mem.seq_cp(0, 1),
        "seq_div": lambda: mem.seq_div(0, 0, -1, 2),
        "seq_keep": lambda: mem.seq_keep(0),
        "seq_pos_max": lambda: mem.seq_pos_max(0),
        "seq_pos_min": lambda: mem.seq_pos_min(0),
        "seq_rm": lambda: mem.seq_rm(0),
    }
    missing = sorted({n for n in dir(Context) if not n.startswith("_")} - set(api) - CLOSED_EXEMPT)
    missing += sorted(f"memory.{n}" for n in dir(Memory) if not n.startswith("_") and n not in memory_api)
    cases = [Case(f"closed: {name}", "ClosedError", fn) for name, fn in api.items()]
    cases += [Case(f"closed: memory.{name}", "ClosedError", fn) for name, fn in memory_api.items()]
    cases += [
        Case("closed: view .sum()", "ClosedError", lambda: view.sum()),
        Case("closed: view [0]", "ClosedError", lambda: view[0]),
        Case("closed: view .copy()", "ClosedError", lambda: view.copy()),
        Case("closed: stale view .sum()", "ClosedError", lambda: old_view.sum()),
        Case("closed: close() again", OK, ctx.close),
        Case("closed: request_abort()", OK, ctx.request_abort),
        Case("closed: repr", OK, lambda: repr(ctx)),
    ]
    cases += [Case(f"no case for {name}", "a case", lambda: None) for name in missing]
    return cases


def _validation_gap_cases(e: Env) -> list[Case]:
    ctx = e.ctx

    def n_tokens_past_capacity() -> None:
        b = Batch(2)
        b.add(5, 0, (1,))
        b.add(6, 1, (1,), output=True)
        b.n_tokens = 5  # a public attribute; C would read past the arrays
        ctx.decode_batch(b)

    return [
        # eval() drops positions >= n_past (memory.seq_rm) before it validates the tokens
        Case("eval bad token keeps the memory", "InvalidTokenError", lambda: ctx.eval([-1], 2)),
        # decode_single validates seq_id only when it is != 0: False and 0.0 slip through
        Case("decode_single seq_id=False", "ParamTypeError", lambda: ctx.decode_single(5, seq_id=False)),
        Case("decode_single seq_id=0.0", "ParamTypeError", lambda: ctx.decode_single(5, seq_id=0.0)),
        # a Batch whose n_tokens exceeds its capacity: numpy's IndexError, not a typed error
        Case("batch n_tokens > capacity", "InvalidBatchError", n_tokens_past_capacity),
        # a ragged token list: numpy's ValueError escapes instead of InvalidTokenError
        Case("decode ragged list", "TokenTypeError", lambda: ctx.decode([[1], [2, 3]])),
    ]


def _guard_gap_cases(e: Env) -> list[Case]:
    ctx = e.ctx

    def stale(use: Callable[[Any], object]) -> Callable[[], object]:
        def run() -> None:
            view = ctx.decode([5], seq_id=1)
            ctx.decode_single(6, seq_id=1)
            e.mem.seq_rm(1)
            use(view)

        return run

    def closed_view_asarray() -> None:
        with e.model.context(n_ctx=64) as c:
            view = c.decode([5])
        np.asarray(view)

    def callback_set_right_after_a_decode() -> None:
        ctx.decode_single(5, seq_id=1)
        ctx.set_abort_callback(lambda: True, interval=0)  # abort at the first poll
        try:
            ctx.decode([6, 7], seq_id=1)
        finally:
            ctx.set_abort_callback(None)
            e.mem.seq_rm(1)

    return [
        # numpy never calls __array__ for an ndarray subclass: np.asarray/np.array skip the guard
        Case("np.asarray(stale view)", "StaleOutputError", stale(np.asarray), keeps_memory=False),
        Case("np.array(stale view)", "StaleOutputError", stale(np.array), keeps_memory=False),
        Case("np.asarray(view of a closed context)", "ClosedError", closed_view_asarray),
        # set_abort_callback keeps the next poll time of the old interval (up to 10 ms away)
        Case(
            "abort callback set right after a decode",
            "DecodeAbortedError",
            callback_set_right_after_a_decode,
            keeps_memory=False,
        ),
    ]


def _param_cases(e: Env) -> list[Case]:
    """Context creation with every kind of invalid ContextParams: refused in Python
    (ParamError, TypeError) or by llama.cpp (ContextCreateError with its reason), never an
    abort; valid but unusual combinations next to them create, decode and close."""
    model = e.model

    def create(**kw: Any) -> Callable[[], None]:
        def run() -> None:
            with Context(model, **kw) as c:
                c.decode([1, 2, 3])

        return run

    def closed_ctx_other() -> None:
        other = model.context(n_ctx=64)
        other.close()
        Context(model, n_ctx=64, ctx_other=other)

    def no_training_length() -> None:
        with llama_cffi.Model.load(model.path, kv_overrides={"llama.context_length": 0}) as m:
            Context(m, n_ctx=0)

    refused = {
        # in Python, before llama.cpp sees them (each would abort, misbehave or be ambiguous)
        "n_batch=0 n_ubatch=0": ("ParamError", {"n_batch": 0, "n_ubatch": 0}),
        "n_batch=0 n_ubatch=8": ("ParamError", {"n_batch": 0, "n_ubatch": 8}),
        "n_ctx=-1": ("ParamError", {"n_ctx": -1}),
        "n_ctx=2**40": ("ParamError", {"n_ctx": 2**40}),
        "n_ctx=1.5": ("ParamError", {"n_ctx": 1.5}),
        "n_seq_max=0": ("ParamError", {"n_seq_max": 0}),
        "n_seq_max=100000": ("ParamError", {"n_seq_max": 100000}),
        "n_seq_max=8 > n_batch=2": ("ParamError", {"n_batch": 2, "n_seq_max": 8}),
        "n_seq_max=4 > n_ctx=2": ("ParamError", {"n_ctx": 2, "n_seq_max": 4}),
        "n_seq_max=4 > n_outputs_max=1": ("ParamError", {"n_batch": 8, "n_seq_max": 4, "n_outputs_max": 1}),
        "n_threads=0": ("ParamError", {"n_threads": 0}),
        "n_threads=-1": ("ParamError", {"n_threads": -1}),
        "n_threads_batch=0": ("ParamError", {"n_threads_batch": 0}),
        "type_k=q9_9": ("ParamError", {"type_k": "q9_9"}),
        "type_k=12345": ("ParamError", {"type_k": 12345}),
        "type_v=q8_0 without flash attention": ("ParamError", {"type_v": "q8_0", "flash_attn_type": "disabled"}),
        "flash_attn_type=sometimes": ("ParamError", {"flash_attn_type": "sometimes"}),
        "flash_attn_type=99": ("ParamError", {"flash_attn_type": 99}),
        "pooling_type=99": ("ParamError", {"pooling_type": 99}),
        "attention_type=99": ("ParamError", {"attention_type": 99}),
        "rope_scaling_type=99": ("ParamError", {"rope_scaling_type": 99}),
        "ctx_type=99": ("ParamError", {"ctx_type": 99}),
        "embeddings=1": ("ParamError", {"embeddings": 1}),
        "rope_freq_base=inf": ("ParamError", {"rope_freq_base": float("inf")}),
        "yarn_ext_factor=nan": ("ParamError", {"yarn_ext_factor": float("nan")}),
        "cb_eval=5": ("ParamError", {"cb_eval": 5}),
        "abort_callback=5": ("ParamError", {"abort_callback": 5}),
        "abort_callback_data=None": ("ParamError", {"abort_callback_data": None}),
        "samplers=None": ("ParamError", {"samplers": None}),
        "ctx_other=5": ("ParamError", {"ctx_other": 5}),
        "n_ctxx=5 (misspelt)": ("TypeError", {"n_ctxx": 5}),
        # by llama.cpp, which returns NULL with a reason (a ContextCreateError carrying it)
        "ctx_type=mtp without MTP layers": ("ContextCreateError", {"ctx_type": "mtp"}),
        "type_k=q4_0 with flash attention": ("ContextCreateError", {"type_k": "q4_0", "flash_attn_type": "enabled"}),
        "type_v=q4_0 with flash attention": ("ContextCreateError", {"type_v": "q4_0", "flash_attn_type": "enabled"}),
        "type_v=q8_0, flash attention auto": ("ContextCreateError", {"type_v": "q8_0", "flash_attn_type": "auto"}),
        "type_k=q8_0 type_v=f16 with FA": (
            "ContextCreateError",
            {"type_k": "q8_0", "type_v": "f16", "flash_attn_type": "enabled"},
        ),
    }
    cases = [Case(name, expected, create(**kw)) for name, (expected, kw) in refused.items()]

    def too_big_for_memory() -> None:
        # llama.cpp's bad_alloc is caught and reported; capped address space so that it
        # fails in a moment rather than after touching gigabytes
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, hard))
        try:
            create(n_ctx=2**31 - 1)()
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))

    cases += [
        Case("n_ctx=2**31-1 (no memory for it)", "ContextCreateError", too_big_for_memory),
        Case("ctx_other closed", "ClosedError", closed_ctx_other),
        Case("n_ctx=0, model without a training length", "ParamError", no_training_length),
    ]
    unusual_but_valid = {
        "type_k=f32 type_v=f16": {"type_k": "f32", "type_v": "f16"},
        "n_ctx=1": {"n_ctx": 1},
        "n_ubatch > n_batch": {"n_batch": 8, "n_ubatch": 64},
        "n_ubatch=0": {"n_batch": 8, "n_ubatch": 0},
        "4 split streams in n_ctx=4": {"n_ctx": 4, "n_batch": 4, "n_seq_max": 4, "kv_unified": False},
        "swa_full": {"swa_full": True},
        "rank pooling on a non-ranking model": {"embeddings": True, "pooling_type": "rank"},
        "n_ctx=2**20": {"n_ctx": 2**20},
    }
    cases += [Case(f"valid: {name}", OK, create(**kw)) for name, kw in unusual_but_valid.items()]
    return cases


GROUPS: dict[str, Callable[[Env], list[Case]]] = {
    "tokens": _token_cases,
    "seq_ids": _seq_id_cases,
    "positions": _position_cases,
    "batches": _batch_cases,
    "outputs": _output_cases,
    "states": _state_cases,
    "callbacks": _callback_cases,
    "closed": _closed_cases,
    "params": _param_cases,
    "validation_gaps": _validation_gap_cases,
    "guard_gaps": _guard_gap_cases,
}


def _child(group: str, model_path: str, other_path: str, tmp: str) -> None:
    """Run one group of cases (in the subprocess) and print the outcome as a JSON line."""
    e = Env(model_path, other_path, tmp)
    results: dict[str, list[str]] = {}
    for case in GROUPS[group](e):
        if e.setup is not None:
            e.setup()
        before = e.positions()
        try:
            case.fn()
            got = OK
        except BaseException as exc:
            got = type(exc).__name__
        if case.keeps_memory and e.positions() != before:
            got += f" (and the memory changed: {before} -> {e.positions()})"
        results[case.name] = [case.expected, got]
    # the context (or, once closed, the model) still works: one real decode
    ctx = e.ctx if not e.ctx.closed else e.model.context(n_ctx=64, n_seq_max=N_SEQ)
    start = ctx.memory.seq_pos_max(0) + 1
    logits = np.asarray(ctx.decode([7, 8, 9])).copy()
    final = {
        "shape": list(logits.shape),
        "finite": bool(np.isfinite(logits).all()),
        "continued": ctx.memory.seq_pos_max(0) == start + 2,
    }
    print("RESULT " + json.dumps({"results": results, "final": final}), flush=True)


# ---------------------------------------------------------------------- the tests
@pytest.fixture(scope="module")
def other_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second tiny model: another seed and another n_embd (its KV rows are another size)."""
    return write_tiny_model(tmp_path_factory.mktemp("other") / "other.gguf", seed=1, n_embd=32)


def _run_group(group: str, model: Path, other: Path, tmp: Path) -> dict[str, list[str]]:
    code = (
        "from tests.test_context_bad_inputs import _child\n"
        f"_child({group!r}, {os.fspath(model)!r}, {os.fspath(other)!r}, {os.fspath(tmp)!r})\n"
    )
    r = run_isolated(code)
    assert r.returncode == 0, f"the child died (rc={r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the child printed no result:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    out = json.loads(lines[-1][len("RESULT ") :])
    assert out["final"] == {"shape": [474], "finite": True, "continued": True}, out["final"]
    results: dict[str, list[str]] = out["results"]
    assert results, "no case ran"
    return results


def _assert_all_expected(results: dict[str, list[str]], what: str) -> None:
    wrong = {name: {"expected": exp, "got": got} for name, (exp, got) in results.items() if exp != got}
    assert not wrong, f"{what}\n{len(wrong)} of {len(results)} cases went wrong:\n" + json.dumps(wrong, indent=1)


GROUP_DOCS = {
    "tokens": "Bad token ids and token containers raise InvalidTokenError (empty ones InvalidBatchError; "
    "values that are no ints TokenTypeError, an InvalidTokenError and a TypeError).",
    "seq_ids": "Sequence ids -1 and n_seq_max (and bad ranges) raise ParamError in decode, memory ops and state "
    "(a bool, no sequence id: ParamTypeError, a ParamError and a TypeError).",
    "positions": "Positions that break continuity raise InvalidBatchError; past n_ctx_seq, KvCacheFullError "
    "(a pos that is no int: ParamTypeError, a ParamError and a TypeError).",
    "batches": "Batches too big, with bad tokens, seq ids or positions raise before llama_decode.",
    "outputs": "logits(i) without an output, bad logits masks and stale views raise typed errors.",
    "states": "Truncated, random and foreign states raise StateError and leave the context usable.",
    "callbacks": "Re-entrant use from the abort callback raises ConcurrentUseError; bad controls ParamError.",
    "closed": "Every public method of a closed context, its memory and its views raises ClosedError.",
    "params": "Invalid ContextParams raise ParamError/TypeError, or ContextCreateError with llama.cpp's reason.",
}


@pytest.mark.parametrize("group", list(GROUP_DOCS))
def test_bad_inputs_raise_typed_errors(
    group: str, tiny_model_path: Path, other_model_path: Path, tmp_path: Path
) -> None:
    """Each case of the group raises its expected typed exception in a child that then decodes."""
    _assert_all_expected(_run_group(group, tiny_model_path, other_model_path, tmp_path), GROUP_DOCS[group])


STALE_AFTER_GROWTH = """
import numpy as np, llama_cffi
from llama_cffi.outputs import StaleOutputError
model = llama_cffi.Model.load(%r)
ctx = model.context(n_ctx=2048, n_batch=2048, n_ubatch=512)
view = ctx.decode([5] * 300, logits="all")  # 300 output rows: a ~570 KB output buffer
ctx.decode([6] * 1000, logits="all")  # more rows: llama.cpp frees that buffer, allocates a bigger one
try:
    np.array(view)
    print("RESULT no error")
except StaleOutputError:
    print("RESULT StaleOutputError")
"""


# Once a SIGSEGV: numpy copies an ndarray subclass without calling __array__, so the guard never
# ran and the copy read the output buffer llama.cpp freed when the second decode needed a bigger
# one (a view's lease keeps the context alive, not that buffer). Views now check on every access.
def test_stale_view_after_the_output_buffer_grows(tiny_model_path: Path) -> None:
    """Copying a stale view with np.array raises StaleOutputError, even after llama.cpp freed its buffer."""
    r = run_isolated(STALE_AFTER_GROWTH % os.fspath(tiny_model_path))
    assert r.returncode == 0, f"the child died (rc={r.returncode}):\n{r.stderr[-2000:]}"
    assert "RESULT StaleOutputError" in r.stdout, r.stdout[-2000:]


#: Former gaps, one comment per case in ``_validation_gap_cases`` and ``_guard_gap_cases``:
#: bad inputs that once changed memory first, slipped through or escaped untyped; all are
#: closed now and these groups keep them closed.
KNOWN_GAPS = {
    "validation_gaps": "Bad inputs that change the memory first, slip through, or escape as untyped errors.",
    "guard_gaps": "Stale/closed views read through numpy, and an abort callback that is not polled.",
}


@pytest.mark.parametrize("group", list(KNOWN_GAPS))
def test_known_gaps(group: str, tiny_model_path: Path, other_model_path: Path, tmp_path: Path) -> None:
    """Each of these former gaps raises its typed exception without side effects."""
    _assert_all_expected(_run_group(group, tiny_model_path, other_model_path, tmp_path), KNOWN_GAPS[group])


def test_more_sequences_than_output_rows_is_refused(tiny_model_path: Path) -> None:
    """n_seq_max above the output rows (n_outputs_max, default n_batch) would trip a
    GGML_ASSERT in llama.cpp's graph reservation (abort); it is a ParamError instead."""
    r = run_isolated(
        f"""
import llama_cffi
m = llama_cffi.Model.load({str(tiny_model_path)!r})
try:
    m.context(n_batch=2, n_seq_max=8)
except llama_cffi.ParamError as e:
    print("ParamError", "n_batch=2" in str(e))
ctx = m.context(n_batch=8, n_seq_max=8)
print(ctx.n_seq_max)
# llama.cpp caps n_batch at n_ctx: 4 sequences in a 2-token context abort the same way
try:
    m.context(n_ctx=2, n_seq_max=4)
except llama_cffi.ParamError as e:
    print("ParamError", "min(n_ctx, n_batch)" in str(e))
try:
    m.context(n_batch=0)  # no rows at all
except llama_cffi.ParamError as e:
    print("ParamError", "n_batch must be >= 1" in str(e))
print(m.context(n_ctx=4, n_seq_max=4).n_seq_max)
"""
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["ParamError", "True", "8", "ParamError", "True", "ParamError", "True", "4"]


def test_mean_pooling_with_indivisible_sequences_is_refused(tmp_path: Path) -> None:
    """Mean pooling over n_seq_max sequences that do not divide min(n_ctx, n_batch,
    n_ubatch) aborts llama.cpp while it creates the context: refused with ParamError,
    for an explicit pooling type and for a model whose own pooling is mean (BERT). The
    divisible shapes next to them create, embed and stay usable (checked in the same child:
    an abort would end it)."""
    code = f"""
import llama_cffi as lc
from llama_cffi.testing import write_tiny, write_tiny_model
llama = lc.Model.load(str(write_tiny_model({str(tmp_path / "l.gguf")!r})))
bert = lc.Model.load(str(write_tiny("bert", {str(tmp_path / "b.gguf")!r})))
for model, kw in [(llama, dict(pooling_type="mean", n_seq_max=3)),
                  (llama, dict(pooling_type="mean", n_seq_max=5, n_ubatch=512)),
                  (llama, dict(pooling_type="mean", n_seq_max=3, n_ubatch=100)),
                  (bert, dict(n_seq_max=3))]:
    try:
        model.context(embeddings=True, **kw)
    except lc.ParamError as exc:
        assert "multiple of n_seq_max" in str(exc), exc
        print("refused")
for model, kw in [(llama, dict(pooling_type="mean", n_seq_max=3, n_ubatch=510, n_batch=510)),
                  (llama, dict(pooling_type="mean", n_seq_max=4)),
                  (llama, dict(pooling_type="last", n_seq_max=3)),
                  (bert, dict(n_seq_max=4))]:
    with model.context(embeddings=True, **kw) as ctx:
        vecs = ctx.embed(["a b", "c d e"])
        assert vecs.shape[0] == 2
        print("created")
"""
    r = run_isolated(code, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["refused"] * 4 + ["created"] * 4, r.stdout


NON_CAUSAL_TOO_BIG = """
import llama_cffi
from llama_cffi import Batch
model = llama_cffi.Model.load(%r)
ctx = model.context(n_ctx=64, n_batch=16, n_ubatch=4)
ctx.set_causal_attn(False)
out = []
for what, call in [("decode", lambda: ctx.decode(list(range(5, 13)))), ("decode_batch", None)]:
    if call is None:
        b = Batch(16)
        b.set_sequence(list(range(5, 13)), 0)
        call = lambda: ctx.decode_batch(b)
    try:
        call()
        out.append(what + " no error")
    except llama_cffi.InvalidBatchError as e:
        out.append(what + " InvalidBatchError " + ("n_ubatch=4" in str(e)) * "named")
assert ctx.memory.seq_pos_max(0) == -1  # nothing was decoded
ctx.decode(list(range(5, 9)))  # four fit one micro-batch
ctx.set_causal_attn(True)
ctx.decode(list(range(9, 17)))  # causal again: any size up to n_batch
print("RESULT", "; ".join(out))
"""


# Found with libmtmd's non-causal image batches: a context with causal attention switched off
# aborted in llama_decode ("non-causal attention requires n_ubatch >= n_tokens") when a decode
# held more tokens than one micro-batch.
def test_non_causal_decode_larger_than_a_micro_batch_is_refused(tiny_model_path: Path) -> None:
    r = run_isolated(NON_CAUSAL_TOO_BIG % os.fspath(tiny_model_path))
    assert r.returncode == 0, f"the child died (rc={r.returncode}):\n{r.stderr[-2000:]}"
    assert "RESULT decode InvalidBatchError named; decode_batch InvalidBatchError named" in r.stdout, r.stdout[-2000:]
