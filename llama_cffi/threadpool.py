"""CPU thread pools for decoding (ggml's ``ggml_threadpool``), and the default thread
policy of a :class:`~llama_cffi.Context`.

Without a pool attached, llama.cpp's CPU backend starts and joins its worker threads
for every graph it computes (``ggml_graph_compute`` makes a disposable pool). A pool
made once and attached (``llama_attach_threadpool``) keeps the workers, which wait for
the next graph by polling and then sleeping; ``llama-bench`` and ``llama-server`` attach
one. :class:`Threadpool` wraps one (threads, ``poll``, priority, CPU mask), for
``Context(threadpool=...)`` or :meth:`Context.attach_threadpool`.

What a context does by default (no ``threadpool=``, ``n_threads`` not given):

* it decodes on one pool shared by the process's default contexts (made on first use,
  ``available_cores()`` threads, llama.cpp's default ``poll=50``). Decodes on one pool
  take turns (its lock): a pool computes one graph at a time, and a context that leaves
  a pool (llama.cpp's CPU backend pauses the pool it leaves) holds its lock for its next
  decode, so it never pauses a pool under another context's graph;
* it adapts its thread count to the machine (:class:`AdaptiveThreads`). ggml's workers
  meet at a spinning barrier after every operation, so when another process holds a
  core, a decode on every core waits for a descheduled thread many times a token (on a
  2-core machine beside one busy process: median 16 ms a token against 11.4 with one
  thread, and p99 88 to 160 ms, where one thread's p99 stays at 13-16 ms). The context
  measures the CPU time the decoding thread gets during its decodes against their wall
  time (it computes and waits at the barriers with the workers, so its share is each
  thread's; the process's total would hide contexts of one process competing with each
  other): when the threads miss 0.4 cores' worth or more over 0.1 s, it drops to the cores it gets
  (``round(share * threads)``, at least one, at least one fewer) and decodes without the shared
  pool (whose idle workers would poll a core it does not have); once the CPUs it may
  use show at least half a core idle again (``/proc/stat``; where that cannot be read,
  after a back-off of 1 to 32 s), it returns to all its threads.

Pass ``n_threads=`` (or ``adaptive_threads=False``) to keep a fixed count, and
``threadpool=`` to decode on your own pool. A pool made before ``os.fork()`` has no
threads in the child: contexts there decode without it (the child leaks the pool's
memory rather than join threads that do not exist).

Lifetimes: a :class:`Threadpool` stays allocated while a context uses it (or may still
point at it: until the decode after it detaches); ``close()`` on it marks it closed and
frees it when the last such context lets go. The wait for a busy pool counts in the
adaptive policy's measure as CPU time not had, so two default contexts decoding at once
drop threads and leave the shared pool rather than take turns on it.
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ._args import expect_bool, expect_callable, expect_int, expect_iterable, type_error
from ._binding import ffi, lib
from ._handle import HandleOwner, NativeHandle
from .context_params import available_cores
from .errors import ParamError

if TYPE_CHECKING:
    from .context import Context

__all__ = ["MAX_THREADS", "PRIORITIES", "AdaptiveThreads", "Threadpool", "default_threadpool"]

#: ggml's limit on a pool's threads (GGML_MAX_N_THREADS): also the CPU ids a mask may name
MAX_THREADS = 512
#: scheduling priorities by name (``enum ggml_sched_priority``); above "normal" needs privileges
PRIORITIES = {"low": -1, "normal": 0, "medium": 1, "high": 2, "realtime": 3}

_pid = os.getpid()


def _free_pool(ptr: Any) -> None:
    if os.getpid() == _pid:
        lib.ggml_threadpool_free(ptr)
    # in a forked child the workers do not exist: joining them would never return


class Threadpool(HandleOwner):
    """A ggml CPU thread pool (owned; see the module docstring for its lifetime).

    ``n_threads``: workers including the calling thread (default: the cores this
    process may use; 1..512). ``poll``: how long idle workers poll for the next graph
    before sleeping, 0 (sleep at once) to 100 (llama.cpp's default is 50, about 0.1 s
    of spinning after each graph). ``priority``: ``"low"``, ``"normal"``, ``"medium"``,
    ``"high"`` or ``"realtime"`` (raising it needs privileges; ggml warns and keeps the
    thread's own when refused). ``cpus``: CPU ids the workers may run on (None: the
    process's affinity); with ``strict_cpu`` each worker is pinned to one of them in
    turn. ``paused``: start with the workers asleep (a decode resumes them).
    """

    def __init__(
        self,
        n_threads: int | None = None,
        *,
        poll: int = 50,
        priority: str | int = "normal",
        cpus: Iterable[int] | None = None,
        strict_cpu: bool = False,
        paused: bool = False,
    ) -> None:
        n = available_cores() if n_threads is None else expect_int("n_threads", n_threads)
        if not 1 <= n <= MAX_THREADS:
            raise ParamError(f"n_threads must be in [1, {MAX_THREADS}], not {n}")
        poll = expect_int("poll", poll)
        if not 0 <= poll <= 100:
            raise ParamError(f"poll must be in [0, 100], not {poll}")
        if isinstance(priority, str):
            if priority not in PRIORITIES:
                raise ParamError(f"priority={priority!r}; use one of {', '.join(PRIORITIES)}")
            prio = PRIORITIES[priority]
        else:
            prio = expect_int("priority", priority, "a priority name or an int in [-1, 3]")
            if prio not in PRIORITIES.values():
                raise ParamError(f"priority must be in [-1, 3], not {prio}")
        strict_cpu = expect_bool("strict_cpu", strict_cpu)
        paused = expect_bool("paused", paused)
        mask: list[int] = []
        if cpus is not None:
            for c in expect_iterable("cpus", cpus, "an iterable of CPU ids (ints) or None"):
                c = expect_int("cpus[]", c, "a CPU id (an int)")
                if not 0 <= c < MAX_THREADS:
                    raise ParamError(f"CPU id {c} is outside [0, {MAX_THREADS})")
                mask.append(c)
            if not mask:
                raise ParamError("cpus is empty: give at least one CPU id, or None for the process's affinity")
        p = ffi.new("struct ggml_threadpool_params *")
        lib.ggml_threadpool_params_init(p, n)
        p.prio = prio
        p.poll = poll
        p.strict_cpu = strict_cpu
        p.paused = paused
        for c in mask:
            p.cpumask[c] = True
        ptr = lib.ggml_threadpool_new(p)
        if ptr == ffi.NULL:  # pragma: no cover - ggml asserts rather than return NULL today
            raise ParamError("ggml could not make the thread pool")
        self._handle = NativeHandle(self, ptr, _free_pool, "Threadpool")
        self.n_threads = n
        self.poll = poll
        self.priority = next(k for k, v in PRIORITIES.items() if v == prio)
        self.cpus: tuple[int, ...] | None = tuple(sorted(set(mask))) if mask else None
        self.strict_cpu = strict_cpu
        #: held while a graph computes on the pool (one at a time)
        self._lock = threading.Lock()
        self._paused = paused

    def pause(self) -> None:
        """Put the workers to sleep now (they stop polling); the next decode wakes them."""
        with self._lock:
            lib.ggml_threadpool_pause(self._ptr())
            self._paused = True

    def resume(self) -> None:
        """Wake the workers (they poll for work again)."""
        with self._lock:
            lib.ggml_threadpool_resume(self._ptr())
            self._paused = False

    def __repr__(self) -> str:
        if self.closed:
            return "<Threadpool closed>"
        return f"<Threadpool n_threads={self.n_threads} poll={self.poll} priority={self.priority!r}>"


_default: Threadpool | None = None
_default_lock = threading.Lock()


def default_threadpool() -> Threadpool:
    """The pool the process's default contexts share (made on first use: the cores this
    process may use, llama.cpp's default poll and priority; remade in a forked child)."""
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            _default = Threadpool()
        return _default


# contexts with a pool attached, to detach in a forked child (see _after_fork)
_attached: weakref.WeakSet[Context] = weakref.WeakSet()


def _after_fork() -> None:
    global _pid, _default, _default_lock
    _pid = os.getpid()
    _default = None
    _default_lock = threading.Lock()
    for ctx in list(_attached):
        ctx._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _cpu_idle(cpus: frozenset[int]) -> tuple[int, int] | None:
    """(idle, total) clock ticks so far of the CPUs ``cpus`` (``/proc/stat``), or None."""
    try:
        with open("/proc/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    idle = total = 0
    for line in data.split(b"\n"):
        if not line.startswith(b"cpu") or line.startswith(b"cpu "):
            continue
        parts = line.split()
        try:
            if int(parts[0][3:]) not in cpus:
                continue
            ticks = [int(v) for v in parts[1:9]]
        except (ValueError, IndexError):
            return None
        idle += ticks[3] + ticks[4]  # idle + iowait
        total += sum(ticks)
    return (idle, total) if total else None


class AdaptiveThreads:
    """A context's thread count, adapted to the CPU time its decodes get (the default
    thread policy: see the module docstring). ``n_threads``/``n_threads_batch``: the
    counts to use when the cores are free; ``threads``/``threads_batch``: the counts in
    use now. ``drops`` and ``raises`` count the changes so far.

    A :class:`~llama_cffi.Context` makes one and counts each decode in it (with its
    lock held); read it as ``ctx.adaptive_threads``. ``apply(threads, threads_batch,
    full)`` is called with each change (``full``: back to the configured counts).
    """

    #: a window of decodes is judged once it spans this much wall time (s) and 4 decodes,
    #: or 4 times this much (decodes that slow are no noise)
    WINDOW_S = 0.1
    #: cores' worth of CPU time the decodes' threads missed, ``(1 - share) * threads``
    #: (``share``: the decoding thread's CPU time / wall time), from which threads are dropped
    LOST_CORES = 0.4
    #: idle cores (among this process's CPUs) that make it worth trying all threads again
    IDLE_CORES = 0.5

    __slots__ = (
        "_apply",
        "_backoff",
        "_cpu_sum",
        "_cpus",
        "_idle_mark",
        "_n",
        "_probe_at",
        "_probing",
        "_wall_sum",
        "_weighted",
        "drops",
        "n_threads",
        "n_threads_batch",
        "raises",
        "threads",
        "threads_batch",
    )

    def __init__(self, n_threads: int, n_threads_batch: int, apply: Callable[[int, int, bool], object]) -> None:
        n_threads = expect_int("n_threads", n_threads)
        n_threads_batch = expect_int("n_threads_batch", n_threads_batch)
        for name, v in (("n_threads", n_threads), ("n_threads_batch", n_threads_batch)):
            if not 1 <= v <= 4096:
                raise ParamError(f"{name} must be in [1, 4096], not {v}")
        apply = expect_callable("apply", apply, "callable as apply(threads, threads_batch, full)")
        self.n_threads = n_threads
        self.n_threads_batch = n_threads_batch
        self.threads = n_threads
        self.threads_batch = n_threads_batch
        self._apply = apply  # apply(threads, threads_batch, full: bool)
        try:
            self._cpus = frozenset(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # pragma: no cover - non-Linux
            self._cpus = frozenset(range(os.cpu_count() or 1))
        self._idle_mark: tuple[int, int] | None = None
        self._probe_at = 0.0
        self._backoff = 1.0
        self._probing = False
        self.drops = 0
        self.raises = 0
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._wall_sum = 0.0
        self._weighted = 0.0
        self._cpu_sum = 0.0

    @property
    def reduced(self) -> bool:
        """Whether fewer threads than configured are in use now."""
        return self.threads < self.n_threads or self.threads_batch < self.n_threads_batch

    def _observe(self, wall: float, cpu: float, batched: bool) -> None:
        """Count one decode: ``wall`` seconds, ``cpu`` seconds of the decoding thread's
        CPU time over it (it computes beside the workers and spins at the same barriers,
        so its share of the wall time is each thread's), ``batched`` when llama.cpp ran
        it with ``n_threads_batch``."""
        self._n += 1
        self._wall_sum += wall
        self._weighted += wall * (self.threads_batch if batched else self.threads)
        self._cpu_sum += cpu
        if self._wall_sum < self.WINDOW_S or (self._n < 4 and self._wall_sum < 4 * self.WINDOW_S):
            return
        share = self._cpu_sum / self._wall_sum
        eff = self._weighted / self._wall_sum  # threads, weighted by time
        self._reset()
        now = time.monotonic()
        if (1.0 - share) * eff >= self.LOST_CORES and eff > 1.0:
            avail = max(1, min(math.ceil(eff) - 1, round(share * eff)))
            t, b = min(self.threads, avail), min(self.threads_batch, avail)
            if (t, b) != (self.threads, self.threads_batch):
                if self._probing:
                    self._backoff = min(self._backoff * 2, 32.0)
                self._probing = False
                self._set(t, b)
                self.drops += 1
                self._idle_mark = _cpu_idle(self._cpus)
                self._probe_at = now + self._backoff
            return
        if self._probing:  # all threads and the share held: the cores are back
            self._probing = False
            self._backoff = 1.0
            return
        if self.reduced and now >= self._probe_at:
            mark = _cpu_idle(self._cpus)
            last, self._idle_mark = self._idle_mark, mark
            if mark is not None and last is not None and mark[1] > last[1]:
                idle_cores = (mark[0] - last[0]) / (mark[1] - last[1]) * len(self._cpus)
                if idle_cores < self.IDLE_CORES:
                    self._probe_at = now + 1.0  # still busy: look again in a second
                    return
            self._probing = True
            self._set(self.n_threads, self.n_threads_batch)
            self.raises += 1

    def _set(self, t: int, b: int) -> None:
        self.threads, self.threads_batch = t, b
        self._apply(t, b, not self.reduced)

    def __repr__(self) -> str:
        return (
            f"<AdaptiveThreads {self.threads}/{self.n_threads} (batch {self.threads_batch}/{self.n_threads_batch}) "
            f"drops={self.drops} raises={self.raises}>"
        )


def expect_pool(name: str, value: object) -> Threadpool | None:
    """``value`` if it is a :class:`Threadpool` or None, else the TypeError naming ``name``."""
    if value is not None and not isinstance(value, Threadpool):
        raise type_error(name, "a llama_cffi.Threadpool or None", value)
    return value
