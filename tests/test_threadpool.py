"""Thread pools and the default thread policy (issue 44 item 7): ``llama_cffi.Threadpool``
wraps ``ggml_threadpool`` (threads, poll, priority, CPU mask); a context decodes on the
process's shared pool or on one it is given; the adaptive thread count drops threads
while another process holds a core and takes them back once the cores are idle.

The thread count never changes llama.cpp's CPU results here: every comparison below is
bit-exact (each output value is computed by one thread, whatever the count). Timings
belong in ``benchmarks/bench_threads.py``; these tests check behaviour only.
"""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import llama_cffi.threadpool as tp_mod
from llama_cffi import ClosedError, Context, Model, ParamError, ParamTypeError, Threadpool
from llama_cffi.context_params import available_cores
from llama_cffi.threadpool import AdaptiveThreads, default_threadpool
from tests.conftest import run_isolated

PROMPT = [1, 5, 9, 33, 70, 12, 4]


def greedy_rows(ctx: Context, n: int = 12) -> np.ndarray:
    """The logits of a prompt and ``n`` greedy steps (copies)."""
    rows = [np.array(ctx.decode(PROMPT), copy=True)]
    for _ in range(n):
        rows.append(np.array(ctx.decode_single(int(rows[-1].argmax())), copy=True))
    return np.stack(rows)


def test_pool_parameters() -> None:
    with Threadpool(2, poll=0, priority="low", cpus=[0], strict_cpu=True, paused=True) as pool:
        assert (pool.n_threads, pool.poll, pool.priority, pool.cpus, pool.strict_cpu) == (2, 0, "low", (0,), True)
        assert "n_threads=2" in repr(pool)
        pool.resume()
        pool.pause()
    assert pool.closed and repr(pool) == "<Threadpool closed>"
    with pytest.raises(ClosedError):
        pool.pause()
    assert Threadpool().n_threads == available_cores()
    for kwargs, match in [
        ({"n_threads": 0}, "n_threads"),
        ({"n_threads": 513}, "n_threads"),
        ({"poll": 101}, "poll"),
        ({"priority": "urgent"}, "priority"),
        ({"priority": 7}, "priority"),
        ({"cpus": []}, "cpus"),
        ({"cpus": [512]}, "CPU id 512"),
    ]:
        with pytest.raises(ParamError, match=match):
            Threadpool(**kwargs)
    for kwargs, name in [({"n_threads": 1.5}, "n_threads"), ({"poll": "50"}, "poll"), ({"cpus": [0.0]}, "cpus")]:
        with pytest.raises(ParamTypeError, match=name):
            Threadpool(**kwargs)


def test_results_do_not_depend_on_the_pool_or_the_thread_count(tiny_model: Model) -> None:
    """The default context (shared pool, adaptive), a pool of its own, no pool, and one
    thread: the same logits, bit for bit."""
    with Context(tiny_model, n_ctx=128) as ctx:
        assert ctx.threadpool is (default_threadpool() if available_cores() > 1 else None)
        ref = greedy_rows(ctx)
    with Threadpool(2, poll=0) as pool, Context(tiny_model, n_ctx=128, threadpool=pool) as ctx:
        assert ctx.threadpool is pool and ctx.adaptive_threads is None
        assert np.array_equal(greedy_rows(ctx), ref)
    with Context(tiny_model, n_ctx=128, n_threads=2, n_threads_batch=2) as ctx:
        ctx.detach_threadpool()
        assert ctx.threadpool is None and ctx.adaptive_threads is None  # n_threads given: fixed
        assert np.array_equal(greedy_rows(ctx), ref)
    with Context(tiny_model, n_ctx=128, n_threads=1, n_threads_batch=1) as ctx:
        assert np.array_equal(greedy_rows(ctx), ref)


def test_a_pool_outlives_close_while_a_context_uses_it(tiny_model: Model) -> None:
    pool = Threadpool(2)
    ctx = Context(tiny_model, n_ctx=128, threadpool=pool)
    pool.close()
    assert pool.closed
    assert pool._handle is not None and pool._handle.ptr != tp_mod.ffi.NULL  # still allocated
    greedy_rows(ctx, 3)  # decodes on it
    with pytest.raises(ClosedError):
        Context(tiny_model, n_ctx=128, threadpool=pool)
    ctx.close()
    assert pool._handle.ptr == tp_mod.ffi.NULL  # freed with its last user


def test_attach_detach_and_thread_counts(tiny_model: Model) -> None:
    with Context(tiny_model, n_ctx=128, n_threads=2, n_threads_batch=2) as ctx:
        with Threadpool(1) as small:
            with pytest.raises(ParamError, match="n_threads=2 exceeds the threadpool's 1 threads"):
                ctx.attach_threadpool(small)
            ctx.set_n_threads(1)
            ctx.attach_threadpool(small)
            assert ctx.threadpool is small
            with pytest.raises(ParamError, match="do not fit"):
                ctx.set_n_threads(2)
            greedy_rows(ctx, 2)
            ctx.detach_threadpool()
            assert ctx.threadpool is None
            ctx.set_n_threads(2)
            greedy_rows(ctx, 2)
        with pytest.raises(ParamTypeError, match="threadpool"):
            ctx.attach_threadpool("pool")  # type: ignore[arg-type]
    with pytest.raises(ParamError, match="n_threads=2 exceeds the threadpool's 1"), Threadpool(1) as one:
        Context(tiny_model, n_ctx=128, n_threads=2, threadpool=one)
    with pytest.raises(ParamError, match="threadpool_batch needs threadpool"), Threadpool(1) as one:
        Context(tiny_model, n_ctx=128, threadpool_batch=one)
    with pytest.raises(ParamTypeError, match="adaptive_threads"):
        Context(tiny_model, n_ctx=128, adaptive_threads="yes")  # type: ignore[arg-type]
    # a count above the shared default pool's threads leaves it (rather than be clamped)
    with Context(tiny_model, n_ctx=128) as ctx:
        ctx.set_n_threads(available_cores() + 1)
        assert ctx.threadpool is None and ctx.adaptive_threads is None
        assert ctx.n_threads == available_cores() + 1
        greedy_rows(ctx, 2)


@pytest.mark.parametrize("shared", ["own", "default"])
def test_contexts_sharing_a_pool_from_two_threads(tiny_model: Model, shared: str) -> None:
    """Two contexts on one pool, decoding at once from two threads: the pool computes one
    graph at a time (its lock), and each gets the logits it gets alone."""
    ref = greedy_rows(Context(tiny_model, n_ctx=256), 40)
    pool = Threadpool(2) if shared == "own" else None
    results: list[Any] = [None, None]

    def work(i: int) -> None:
        with Context(tiny_model, n_ctx=256, threadpool=pool) as ctx:
            # the default: the shared pool (on one core, none: one thread needs no workers)
            assert ctx.threadpool is (pool or (default_threadpool() if available_cores() > 1 else None))
            results[i] = greedy_rows(ctx, 40)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(np.array_equal(r, ref) for r in results)
    if pool is not None:
        pool.close()


FORK_CHILD = """
import os, sys, signal
import numpy as np
from llama_cffi import Context, Model, Threadpool
from llama_cffi.threadpool import default_threadpool
model = Model.load(sys.argv[1])
own = Threadpool(2)
parents_default = default_threadpool()  # the default contexts' pool (on any core count)
ctxs = [Context(model, n_ctx=128, threadpool=parents_default), Context(model, n_ctx=128, threadpool=own)]
for ctx in ctxs:
    assert ctx.threadpool is not None
    ctx.decode([1, 5, 9])
pid = os.fork()
if pid == 0:
    signal.alarm(60)  # a hang in the child ends it rather than the test
    for ctx in ctxs:
        assert ctx.threadpool is None  # the pool's workers stayed in the parent
        for t in (3, 4, 5):
            ctx.decode_single(t)
    fresh = Context(model, n_ctx=128, threadpool=default_threadpool())  # the child's own default pool
    assert fresh.threadpool is not None and fresh.threadpool is not parents_default
    fresh.decode([1, 5, 9])
    fresh.close()
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
for ctx in ctxs:  # the parent's pools still work
    ctx.decode_single(7)
    ctx.close()
own.close()
print("parent ok")
"""


def test_a_forked_child_decodes_without_the_parents_pools(tiny_model_path: Path) -> None:
    """After ``os.fork()`` the pools' worker threads exist only in the parent: a child that
    decoded on them would wait for them for ever. The child's contexts detach them."""
    r = run_isolated(FORK_CHILD.replace("sys.argv[1]", repr(str(tiny_model_path))), timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "child 0" in r.stdout and "parent ok" in r.stdout, r.stdout + r.stderr[-2000:]


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int, bool]] = []

    def __call__(self, t: int, b: int, full: bool) -> None:
        self.calls.append((t, b, full))


def feed(gov: AdaptiveThreads, share: float, n: int = 4, wall: float = 0.03) -> None:
    """``n`` decodes of ``wall`` seconds that got ``share`` of their threads' CPU."""
    for _ in range(n):
        gov._observe(wall, wall * share, False)


def test_adaptive_threads_drop_and_return(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    idle: list[tuple[int, int] | None] = [(0, 0)]
    monkeypatch.setattr(tp_mod.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(tp_mod, "_cpu_idle", lambda cpus: idle[0])
    rec = Recorder()
    gov = AdaptiveThreads(2, 2, rec)
    gov._cpus = frozenset({0, 1})
    feed(gov, 1.0)
    assert rec.calls == [] and not gov.reduced  # all threads got their cores
    feed(gov, 0.75)  # one core taken by another process: 3 threads on 2 cores
    assert rec.calls == [(1, 1, False)] and gov.threads == 1 and gov.drops == 1
    # a second later: the CPUs were busy all along (no idle ticks): stay at one thread
    clock[0] += 1.5
    idle[0] = (0, 200)
    feed(gov, 1.0)
    assert rec.calls == [(1, 1, False)]
    # the other process ended: a core idle half of the time since the last look
    clock[0] += 1.5
    idle[0] = (100, 400)
    feed(gov, 1.0)
    assert rec.calls[-1] == (2, 2, True) and gov.raises == 1 and not gov.reduced
    # the probe finds the core taken again: back to one, and the next probe waits twice as long
    feed(gov, 0.7)
    assert rec.calls[-1] == (1, 1, False) and gov.drops == 2
    idle[0] = None  # /proc/stat unreadable: probe on the back-off alone
    clock[0] += 1.5
    feed(gov, 1.0)
    assert gov.threads == 1  # 2 s back-off not over
    clock[0] += 1.0
    feed(gov, 1.0)
    assert gov.threads == 2 and gov.raises == 2
    feed(gov, 1.0)  # the probe holds: the back-off resets
    assert gov._backoff == 1.0


def test_adaptive_threads_keep_the_cores_they_get() -> None:
    rec = Recorder()
    gov = AdaptiveThreads(16, 8, rec)
    feed(gov, 15 / 16 - 0.01)  # 17 threads on 16 cores
    assert rec.calls == [(15, 8, False)]
    rec2 = Recorder()
    one = AdaptiveThreads(2, 2, rec2)
    feed(one, 0.6, n=3)  # fewer than 4 decodes: no judgement yet
    assert rec2.calls == []
    feed(one, 0.5, n=1, wall=0.35)  # but 0.4 s of decodes is judged however few they are
    assert rec2.calls == [(1, 1, False)]
    with pytest.raises(ParamError, match="n_threads_batch"):
        AdaptiveThreads(2, 0, rec)
    with pytest.raises(ParamTypeError, match="apply"):
        AdaptiveThreads(2, 2, None)  # type: ignore[arg-type]


BUSY_CHILD = """
import subprocess, sys, time
from llama_cffi import Context, Model
from llama_cffi.context_params import available_cores
model = Model.load(sys.argv[1])
n = max(2, available_cores())  # the default count on 2 cores or more; 2 (given) on one core
ctx = Context(model, n_ctx=512, n_threads=n, n_threads_batch=n, adaptive_threads=True)
gov = ctx.adaptive_threads
assert gov is not None and gov.threads == n, gov
spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
try:
    time.sleep(0.3)
    ctx.decode(model.tokenize("Once upon a time"))
    t0 = time.monotonic()
    while gov.drops == 0 and time.monotonic() - t0 < 60:
        ctx.decode_single(100)
finally:
    for p in spin:
        p.kill()
print("drops", gov.drops, "threads", ctx.n_threads, "pool", ctx.threadpool, "of", n)
"""


@pytest.mark.default_model
@pytest.mark.slow
def test_a_busy_machine_takes_threads_away(default_model_path: Path) -> None:
    """With as many spinning processes as threads (at least as many as cores), an adaptive
    context's decodes get at most about half their threads' CPU: it drops threads (and
    decodes without the shared pool)."""
    r = run_isolated(textwrap.dedent(BUSY_CHILD).replace("sys.argv[1]", repr(str(default_model_path))), timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    words = r.stdout.split()
    assert int(words[1]) >= 1 and int(words[3]) < int(words[7]) and words[5] == "None", r.stdout


def test_model_context_passes_the_thread_options_on(tiny_model: Model) -> None:
    """``model.context(...)`` (the retrying constructor) takes the Context-level options."""
    with Threadpool(2) as pool:
        with tiny_model.context(n_ctx=128, threadpool=pool) as ctx:
            assert ctx.threadpool is pool and ctx.adaptive_threads is None
        with tiny_model.context(n_ctx=128, adaptive_threads=False) as ctx:
            assert ctx.adaptive_threads is None
        with tiny_model.context(n_ctx=128, n_threads=2, adaptive_threads=True) as ctx:
            gov = ctx.adaptive_threads
            assert gov is not None and (gov.n_threads, gov.threads) == (2, 2)


SWITCH_CHILD = """
import threading
import numpy as np
from llama_cffi import Context, Model, Threadpool
model = Model.load(PATH)
pool = Threadpool(2, poll=0)  # workers asleep between graphs: the widest window for the race
stop = threading.Event()
errors = []

def steady():  # decodes on the shared pool all along
    try:
        with Context(model, n_ctx=2048, threadpool=pool) as ctx:
            while not stop.is_set():
                ctx.memory.clear()
                ctx.decode([1, 5, 9, 33, 70, 12, 4] * 8)
    except BaseException as exc:
        errors.append(exc)

def switching():  # leaves the pool and comes back, decoding in between
    try:
        with Context(model, n_ctx=256, threadpool=pool) as ctx:
            for i in range(2000):
                if i % 2:
                    ctx.detach_threadpool()
                else:
                    ctx.attach_threadpool(pool)
                ctx.memory.clear()
                ctx.decode([1, 5, 9])
    except BaseException as exc:
        errors.append(exc)
    finally:
        stop.set()

threads = [threading.Thread(target=steady), threading.Thread(target=switching)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not errors, errors
print("ok")
"""


def test_leaving_a_pool_while_another_context_computes_on_it(tiny_model_path: Path) -> None:
    """llama.cpp pauses the pool a context's CPU backend leaves (at that context's next
    graph). Paused while another context's graph runs on it, that graph's workers sleep
    and its barrier waits for ever: a context's first decode after leaving a pool holds
    the pool's lock. Run in a child: the old behaviour hung within a few switches."""
    r = run_isolated(SWITCH_CHILD.replace("PATH", repr(str(tiny_model_path))), timeout=150)
    assert r.returncode == 0 and "ok" in r.stdout, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
