"""Abort, Ctrl-C, concurrent use, threads and asyncio around Context.decode."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from llama_cffi import ConcurrentUseError, DecodeAbortedError, Model
from tests import tiny_model as tm
from tests.conftest import AbortGate, run_isolated

PROMPT = [tm.BOS_ID, 40, 41, 42, 300, 301, 77, 78, 79, 80, 81, 82]


def long_prompt(model: Model) -> np.ndarray:
    return model.tokenize("The quick brown fox jumps over the lazy dog. " * 50)  # ~550 tokens


def test_abort_callback_returning_true(tiny_model: Model) -> None:
    """An abort callback that returns True stops the decode with DecodeAbortedError; the context lives on."""
    with tiny_model.context(n_ctx=256) as ctx:
        ctx.set_abort_callback(lambda: True, interval=0)
        with pytest.raises(DecodeAbortedError):
            ctx.decode(PROMPT)
        ctx.set_abort_callback(None)
        ctx.memory.clear()
        assert np.isfinite(ctx.decode(PROMPT)).all()


def test_abort_callback_exception_is_reraised(tiny_model: Model) -> None:
    """An exception raised inside the abort callback aborts the decode and propagates from decode()."""

    class Stop(Exception):
        pass

    def cb() -> bool:
        raise Stop("from the callback")

    with tiny_model.context(n_ctx=256) as ctx:
        ctx.set_abort_callback(cb, interval=0)
        with pytest.raises(Stop, match="from the callback"):
            ctx.decode(PROMPT)
        ctx.set_abort_callback(None)
        ctx.memory.clear()
        assert np.isfinite(ctx.decode(PROMPT)).all()


def test_callback_exception_at_every_poll_is_raised_by_that_decode(tiny_model: Model) -> None:
    """Whichever poll of the abort callback raises (the first, the last, any between), the
    exception comes out of that decode, never later from another one: llama.cpp does not
    act on every poll (a request to stop at the last node is too late), so a decode that
    completes must still raise it."""

    class Stop(Exception):
        pass

    with tiny_model.context(n_ctx=256, n_batch=64, n_threads=1) as ctx:
        polls = 0

        def count() -> bool:
            nonlocal polls
            polls += 1
            return False

        ctx.set_abort_callback(count, interval=0)
        ctx.decode(PROMPT)
        n_polls = polls
        assert n_polls > 1
        for k in sorted({1, 2, n_polls // 2, n_polls - 1, n_polls}):
            calls = 0

            def cb(k: int = k) -> bool:
                nonlocal calls
                calls += 1
                if calls == k:
                    raise Stop(k)
                return False

            ctx.memory.clear()
            ctx.set_abort_callback(cb, interval=0)
            with pytest.raises(Stop):
                ctx.decode(PROMPT)
            ctx.set_abort_callback(None)
            ctx.memory.clear()
            assert np.isfinite(ctx.decode(PROMPT)).all()  # nothing left over to raise here


@pytest.mark.default_model
def test_request_abort_from_another_thread(default_model: Model) -> None:
    """request_abort() from another thread, while a long prefill is held at its first abort
    poll, stops the prefill at its next check (DecodeAbortedError; no timing involved)."""
    toks = long_prompt(default_model)
    with default_model.context(n_ctx=1024, n_batch=1024, n_ubatch=1024) as ctx:
        gate = AbortGate()

        def other() -> None:
            gate.inside.wait(30)
            ctx.request_abort()
            gate.release.set()

        t = threading.Thread(target=other)
        t.start()
        with gate.installed(ctx), pytest.raises(DecodeAbortedError):
            ctx.decode(toks)
        t.join()
        assert gate.polls == 1 and ctx.n_past == 0
        ctx.memory.clear()
        assert np.isfinite(ctx.decode(toks[:8])).all()  # still usable


def test_isolated_children_get_the_default_sigint_handler() -> None:
    """A suite started with SIGINT ignored (nohup, ``&``) still gives its Ctrl-C children
    Python's own handler: SIG_IGN is inherited across exec, and Python keeps it."""
    import signal

    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        r = run_isolated("import signal as s; print('DEFAULT', s.getsignal(s.SIGINT) is s.default_int_handler)")
    finally:
        signal.signal(signal.SIGINT, old)
    assert r.returncode == 0, r.stderr
    assert "DEFAULT True" in r.stdout


@pytest.mark.default_model
def test_ctrl_c_during_decode_is_a_clean_keyboard_interrupt(default_model_path: object) -> None:
    """SIGINT during a long decode raises KeyboardInterrupt from decode; the context stays usable."""
    r = run_isolated(
        f"""
        import os, signal, threading, time, numpy as np
        import llama_cffi
        m = llama_cffi.Model.load({str(default_model_path)!r})
        ctx = m.context(n_ctx=1024, n_batch=1024, n_ubatch=1024)
        toks = m.tokenize("The quick brown fox jumps over the lazy dog. " * 50)
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        t0 = time.perf_counter()
        try:
            ctx.decode(toks)
            print("NOT INTERRUPTED")
        except KeyboardInterrupt:
            print("INTERRUPTED after %.2f s" % (time.perf_counter() - t0))
        ctx.memory.clear()
        print("USABLE", bool(np.isfinite(ctx.decode(toks[:8])).all()))
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "INTERRUPTED" in r.stdout and "NOT INTERRUPTED" not in r.stdout, r.stdout
    assert "USABLE True" in r.stdout


@pytest.mark.default_model
def test_concurrent_use_is_refused(default_model: Model) -> None:
    """A second thread using a busy context gets ConcurrentUseError instead of corrupting it
    (the decode is held at its first abort poll until the other thread has tried, so no
    timing is involved)."""
    toks = long_prompt(default_model)
    with default_model.context(n_ctx=1024, n_batch=1024, n_ubatch=1024) as ctx:
        errors: list[BaseException] = []
        inside, tried = threading.Event(), threading.Event()

        def hold() -> bool:
            inside.set()
            tried.wait(30)
            return False

        def other() -> None:
            inside.wait(30)
            try:
                ctx.decode_single(5, seq_id=0)
            except BaseException as exc:
                errors.append(exc)
            tried.set()

        t = threading.Thread(target=other)
        t.start()
        ctx.set_abort_callback(hold, interval=0)
        try:
            ctx.decode(toks)
        finally:
            tried.set()
            t.join()
            ctx.set_abort_callback(None)
        assert len(errors) == 1 and isinstance(errors[0], ConcurrentUseError)
        assert ctx.n_past == len(toks)  # the first decode completed intact


def test_every_operation_from_a_second_thread_is_refused(tiny_model: Model, tmp_path: Path) -> None:
    """While one thread is inside a decode (held there by its abort callback, so no timing
    is involved), every operation that reads or changes the context from another thread
    raises ConcurrentUseError and changes nothing; the decode then completes intact."""
    with tiny_model.context(n_ctx=256, n_batch=64, n_seq_max=2, n_threads=1) as ctx:
        old_view = ctx.decode(PROMPT[:4], seq_id=1)
        blob = ctx.save_state()
        inside, finished = threading.Event(), threading.Event()

        def hold() -> bool:
            inside.set()
            finished.wait(30)
            return False

        attempts: dict[str, Callable[[], object]] = {
            "decode": lambda: ctx.decode([5, 6]),
            "decode_single": lambda: ctx.decode_single(5, seq_id=1),
            "eval": lambda: ctx.eval([5], 0),
            "logits": lambda: ctx.logits(),
            "logits_all": lambda: ctx.logits_all(),
            "embeddings": lambda: ctx.embeddings(),
            "a view of the previous decode": lambda: float(old_view.sum()),
            "memory.clear": lambda: ctx.memory.clear(),
            "memory.seq_rm": lambda: ctx.memory.seq_rm(1),
            "memory.seq_cp": lambda: ctx.memory.seq_cp(1, 0),
            "memory.seq_keep": lambda: ctx.memory.seq_keep(0),
            "memory.seq_add": lambda: ctx.memory.seq_add(1, 0, -1, 2),
            "save_state": ctx.save_state,
            "load_state": lambda: ctx.load_state(blob),
            "save_seq_state": lambda: ctx.save_seq_state(1),
            "save_state_file": lambda: ctx.save_state_file(tmp_path / "s.bin"),
            "set_n_threads": lambda: ctx.set_n_threads(2),
            "set_embeddings": lambda: ctx.set_embeddings(True),
            "close": ctx.close,
        }
        outcome: dict[str, str] = {}

        def other() -> None:
            inside.wait(30)
            for name, fn in attempts.items():
                try:
                    fn()
                    outcome[name] = "no error"
                except BaseException as exc:
                    outcome[name] = type(exc).__name__
            finished.set()

        t = threading.Thread(target=other)
        t.start()
        ctx.set_abort_callback(hold, interval=0)
        try:
            row = np.asarray(ctx.decode(PROMPT)).copy()
        finally:
            finished.set()
            t.join()
            ctx.set_abort_callback(None)
        expected = dict.fromkeys(attempts, "ConcurrentUseError")
        expected["a view of the previous decode"] = "StaleOutputError"  # stale once a decode starts
        assert outcome == expected
        assert not ctx.closed and ctx.memory.seq_pos_max(0) == len(PROMPT) - 1 and ctx.memory.seq_pos_max(1) == 3
        with tiny_model.context(n_ctx=256, n_batch=64, n_threads=1) as ref:
            np.testing.assert_allclose(row, np.asarray(ref.decode(PROMPT)), rtol=1e-5, atol=1e-5)


def test_one_context_per_thread_matches_sequential(tiny_model: Model) -> None:
    """Contexts on a shared model in parallel threads generate exactly the sequential tokens."""

    def run(prompt: list[int]) -> list[int]:
        with tiny_model.context(n_ctx=256, n_threads=1) as ctx:
            lg = ctx.decode(prompt)
            out = []
            for _ in range(24):
                t = int(np.asarray(lg).argmax())
                out.append(t)
                lg = ctx.decode_single(t)
            return out

    prompts = [PROMPT[: 4 + i] for i in range(4)]
    expected = [run(p) for p in prompts]
    results: list[list[int] | None] = [None] * len(prompts)

    def worker(i: int) -> None:
        for _ in range(3):
            results[i] = run(prompts[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == expected


@pytest.mark.default_model
def test_adecode_cancellation_aborts(default_model: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelling an awaiting adecode aborts the native decode (held at its first abort poll
    until the cancellation has requested the abort, so no timing is involved): it stops at
    its next check, the prompt's one ubatch leaves nothing in memory, and the context is
    usable after."""
    toks = long_prompt(default_model)
    with default_model.context(n_ctx=1024, n_batch=1024, n_ubatch=1024) as ctx:
        gate = AbortGate()
        gate.release_on_abort_request(ctx, monkeypatch)

        async def main() -> None:
            task = asyncio.ensure_future(ctx.adecode(toks))
            assert await asyncio.to_thread(gate.inside.wait, 30)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        with gate.installed(ctx):
            asyncio.run(main())
        assert gate.polls == 1 and ctx.n_past == 0
        out = asyncio.run(ctx.adecode(toks[:8]))
        assert np.isfinite(out).all() and ctx.n_past == 8


def test_threads_sampling_with_grammars_match_sequential(tiny_model: Model) -> None:
    """N threads, each with its own context and BranchStore over one model, sampling with
    seeded chains under one shared grammar (its compiled masks and caches are shared and
    locked), started together at a barrier: each produces exactly its sequential tokens."""
    import samplers as S
    from samplers.branch import BranchStore
    from samplers.grammar import Grammar

    grammar = Grammar.from_gbnf('root ::= [a-z]+ (" " [a-z]+)*')
    n = 4

    def run(i: int, barrier: threading.Barrier | None = None) -> list[int]:
        with tiny_model.context(n_ctx=256, n_seq_max=2, kv_unified=True, n_threads=1, n_threads_batch=1) as ctx:
            store = BranchStore(ctx)
            chain = S.SamplerChain([S.TopK(30), S.Temperature(0.9), S.Dist(100 + i)])
            root = store.create(PROMPT[: 4 + i], sampler=chain, grammar=grammar)
            kid = root.fork(seed=200 + i)
            if barrier is not None:
                barrier.wait()
            live = [root, kid]
            for _ in range(16):
                moves = {b: b.sample() for b in live}
                live = [b for b, t in moves.items() if not tiny_model.vocab.is_eog(t)]
                if not live:
                    break
                store.step({b: moves[b] for b in live})  # an end-of-generation token ends a branch
            return [*root.tokens, -1, *kid.tokens]

    expected = [run(i) for i in range(n)]
    barrier = threading.Barrier(n)
    results: list[list[int] | BaseException | None] = [None] * n

    def worker(i: int) -> None:
        try:
            results[i] = run(i, barrier)
        except BaseException as exc:  # reported below
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == expected
    assert len({tuple(r) for r in expected}) == n  # the seeds made them differ


@pytest.mark.default_model
def test_ctrl_c_during_branch_steps_loses_no_state(default_model_path: object) -> None:
    """SIGINT at varied moments of batched steps and single commits: KeyboardInterrupt
    reaches the caller, every branch's history, position and KV cells agree (a step
    either happened for a branch or left no cell), and stepping goes on."""
    r = run_isolated(
        f"""
        import os, signal, threading
        import numpy as np
        import llama_cffi
        import samplers as S
        from samplers.branch import BranchStore
        m = llama_cffi.Model.load({str(default_model_path)!r})
        ctx = m.context(n_ctx=2048, n_batch=64, n_seq_max=4, kv_unified=True)
        store = BranchStore(ctx)
        root = store.create(m.tokenize("Once upon a time"), sampler=S.SamplerChain([S.TopK(40), S.Dist(1)]))
        kids = [root] + [root.fork(seed=i) for i in range(3)]
        for k, delay in enumerate([0.3 + 0.053 * i for i in range(16)]):
            threading.Timer(delay, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
            try:
                for _ in range(400):
                    if k % 2:
                        kids[0].commit(kids[0].sample())
                    else:
                        store.step({{b: b.sample() for b in kids}})
                print("NOT INTERRUPTED")
            except KeyboardInterrupt:
                pass
            ok = all(
                ctx.memory.seq_pos_max(b.seq_id) == b.position - 1 and len(b.tokens) == b.position
                for b in kids
            )
            print("CONSISTENT" if ok else "LOST", [(b.position, ctx.memory.seq_pos_max(b.seq_id)) for b in kids])
        store.step({{b: b.sample() for b in kids}})
        print("USABLE", all(np.isfinite(b.logits).all() for b in kids))
        """,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("CONSISTENT") == 16 and "LOST" not in r.stdout, r.stdout
    assert "NOT INTERRUPTED" not in r.stdout and "USABLE True" in r.stdout, r.stdout


CTRL_C_BRANCH_OPS = """
import os, random, signal, threading
import llama_cffi
import samplers as S
from llama_cffi.errors import LlamaError
from samplers.branch import BranchStore
m = llama_cffi.Model.load(PATH)
ctx = m.context(n_ctx=4096, n_batch=64, n_seq_max=8, kv_unified=True)
store = BranchStore(ctx)
rng = random.Random(0)
prompt = [1] + [rng.randrange(3, 400) for _ in range(300)]
landed = {}

def consistent():
    live = {b.seq_id: b for b in store.branches}
    free = set(store._free)
    return (
        not (live.keys() & free)
        and (live.keys() | free) == set(range(ctx.n_seq_max))
        and all(ctx.memory.seq_pos_max(s) == -1 for s in free)
        and all(ctx.memory.seq_pos_max(s) == b.position - 1 == len(b.tokens) - 1 for s, b in live.items())
        and all(b.parent is None or (b.parent.seq_id in live and b in b.parent.children) for b in live.values())
        and all(c.seq_id in live and c.parent is b for b in live.values() for c in b.children)
    )

def ops():
    while True:
        live = store.branches
        op = rng.choice(["create", "fork", "fork_at", "prefill", "step", "prune"]) if live else "create"
        landed["op"] = op
        try:
            if store.kv()["remaining"] < 700:
                store.drain()
            elif op == "create" and len(live) < 8:
                chain = S.SamplerChain([S.TopK(20), S.Dist(rng.randrange(99))])
                store.create(prompt[: rng.randrange(1, 300)], sampler=chain)
            elif op == "fork" and len(live) < 8:
                rng.choice(live).fork(seed=rng.randrange(99))
            elif op == "fork_at" and len(live) < 8:
                b = rng.choice(live)
                b.fork(at=rng.randrange(1, b.position + 1))
            elif op == "prefill":
                store.prefill({b: prompt[: rng.randrange(1, 40)] for b in live[:3]})
            elif op == "step":
                store.step({b: b.sample() for b in live})
            elif op == "prune":
                leaves = [b for b in live if b.is_leaf]
                if leaves:
                    rng.choice(leaves).prune()
        except LlamaError:
            pass  # e.g. the KV cache is full: that too must leave the store consistent

results = []
spurious = 0
for k in range(N):
    fired = threading.Event()

    def fire():
        fired.set()
        os.kill(os.getpid(), signal.SIGINT)

    if not store.branches:  # with none live only 'create' can run: under load every interrupt would land there
        store.create(prompt[: rng.randrange(1, 50)], sampler=S.SamplerChain([S.TopK(20), S.Dist(k)]))
    timer = threading.Timer(rng.uniform(0.001, 0.05), fire)
    landed["op"] = "timer start"  # on a loaded machine the timer can fire before start() returns
    try:
        timer.start()
        ops()
    except KeyboardInterrupt:
        if not fired.is_set():  # one Ctrl-C must give exactly one KeyboardInterrupt
            spurious += 1
            print("SPURIOUS during", landed["op"])
            break
    results.append((landed["op"], consistent()))
    if not results[-1][1]:
        break
print("SPURIOUS", spurious)
print("LANDED", sorted({op for op, _ in results}))
print("CONSISTENT", sum(ok for _, ok in results), "OF", len(results))
for b in store.branches:
    b.commit(b.sample())
print("USABLE", len(store.branches))
"""


def test_ctrl_c_during_branch_making_and_pruning(tiny_model_path: Path) -> None:
    """SIGINT at random moments of create (a chunked prefill), fork, fork(at=), prefill,
    step and prune: each time the store's ids, KV cells, positions, histories and tree
    agree (an operation either happened whole or left nothing), and branches go on."""
    n = int(os.environ.get("LLAMA_CFFI_CTRL_C_CASES", "120"))
    r = run_isolated(CTRL_C_BRANCH_OPS.replace("PATH", repr(str(tiny_model_path))).replace("N)", f"{n})"), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"CONSISTENT {n} OF {n}" in r.stdout and "SPURIOUS 0" in r.stdout, r.stdout
    assert "USABLE" in r.stdout, r.stdout
    # where the interrupts landed is up to timing; the long ops are always hit, and with
    # LLAMA_CFFI_CTRL_C_CASES=1000 every one of the six is
    landed = r.stdout.split("LANDED", 1)[1].splitlines()[0]
    ops = ("'create'", "'fork'", "'fork_at'", "'prefill'", "'step'", "'prune'")
    assert sum(op in landed for op in ops) >= 4, landed


def test_abort_requested_between_decodes_does_not_abort_the_next(tiny_model: Model) -> None:
    """request_abort() stops the decode in progress; made while none runs, it is cleared
    when the next decode starts (as its docstring says), so that decode completes."""
    with tiny_model.context(n_ctx=64) as ctx:
        ctx.request_abort()
        logits = ctx.decode(tiny_model.tokenize("hello world"))
        assert np.isfinite(np.asarray(logits)).all()
