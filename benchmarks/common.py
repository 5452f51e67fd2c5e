"""Helpers shared by the benchmark scripts and ``benchmarks/suite.py``: running a child
process while keeping its peak RSS (``os.wait4``'s ``ru_maxrss``: the child and the
children it waited for), writing results as JSON, and describing the machine."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: Whether these scripts run in a source tree (``python benchmarks/<name>.py`` from its
#: root) or as the copy an installed llama_cffi carries (``llama_cffi/_bench``, no setup.py).
IN_SOURCE_TREE = (ROOT / "setup.py").is_file()


def script_path(name: str) -> str:
    """How a command line names the script ``name``: ``benchmarks/<name>`` in a source
    tree (run from its root), else its absolute path in the installed package."""
    return f"benchmarks/{name}" if IN_SOURCE_TREE else str(ROOT / "benchmarks" / name)


def maxrss_kib(ru_maxrss: int) -> int:
    """``ru_maxrss`` in KiB (Linux reports KiB, macOS bytes)."""
    return ru_maxrss // 1024 if sys.platform == "darwin" else ru_maxrss


@dataclass
class ChildRun:
    """One finished child process: exit status, output, wall time and resource usage."""

    cmd: list[str]
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    peak_rss_kib: int
    user_s: float
    sys_s: float
    timed_out: bool = False
    foreign_cores: float = math.nan  # CPU other processes used meanwhile, in cores (NaN: unknown)
    lines: list[tuple[float, str]] = field(default_factory=list)  # (seconds since start, line), both streams

    def line_time(self, needle: str) -> float | None:
        """When the first output line containing ``needle`` arrived (seconds since the start)."""
        return next((t for t, line in self.lines if needle in line), None)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def check(self) -> ChildRun:
        if not self.ok:
            what = "timed out" if self.timed_out else f"exited with {self.returncode}"
            raise RuntimeError(f"{' '.join(self.cmd)} {what}:\n{self.stderr[-3000:]}\n{self.stdout[-2000:]}")
        return self


def run_child(
    cmd: Sequence[str],
    *,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    echo: Callable[[str], None] | None = None,
) -> ChildRun:
    """Run ``cmd`` to completion, capturing stdout and stderr (each line also passed to
    ``echo`` as it comes, when given), and reap it with ``os.wait4`` to get its own peak
    RSS and CPU time. On ``timeout`` the child's whole process group is killed.
    ``foreign_cores``: the CPU the rest of the machine used meanwhile (this process's
    own reading threads are negligible), in cores; a busy machine explains noisy numbers."""
    cmd = [str(c) for c in cmd]
    busy0 = machine_busy_s()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        cwd=cwd,
        env=env,
        start_new_session=True,  # its own process group: a timeout kills its children too
    )
    out: list[str] = []
    err: list[str] = []
    lines: list[tuple[float, str]] = []

    def pump(stream: Any, sink: list[str]) -> None:
        for line in stream:
            lines.append((time.perf_counter() - t0, line))
            sink.append(line)
            if echo is not None:
                echo(line.rstrip("\n"))

    threads = [
        threading.Thread(target=pump, args=(proc.stdout, out), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, err), daemon=True),
    ]
    for t in threads:
        t.start()
    lock = threading.Lock()
    reaped = False
    timed_out = False

    def kill() -> None:
        nonlocal timed_out
        with lock:
            if reaped:
                return
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    timer = threading.Timer(timeout, kill) if timeout else None
    if timer is not None:
        timer.start()
    while True:
        try:
            _, status, ru = os.wait4(proc.pid, 0)
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries already
            continue
    with lock:
        reaped = True
    if timer is not None:
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    busy = machine_busy_s() - busy0
    foreign = max(busy - ru.ru_utime - ru.ru_stime, 0.0) / wall if busy0 > 0 and wall > 0 else math.nan
    for t in threads:
        t.join()
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    proc.stderr.close()
    return ChildRun(
        cmd=cmd,
        returncode=proc.returncode,
        stdout="".join(out),
        stderr="".join(err),
        wall_s=wall,
        peak_rss_kib=maxrss_kib(ru.ru_maxrss),
        user_s=ru.ru_utime,
        sys_s=ru.ru_stime,
        timed_out=timed_out,
        foreign_cores=foreign,
        lines=sorted(lines, key=lambda x: x[0]),
    )


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy since boot (0 where /proc/stat is missing)."""
    try:
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError):
        return 0.0
    return (sum(vals) - vals[3] - vals[4]) / os.sysconf("SC_CLK_TCK")


def wait_quiet(max_cores: float, timeout: float, sample_s: float = 0.3) -> float:
    """Wait (at most ``timeout`` seconds) until other processes use at most ``max_cores``
    cores over ``sample_s`` (this process sleeps meanwhile); returns the last load seen.
    With as many threads as cores, any other load stalls llama.cpp's thread pool."""
    deadline = time.monotonic() + timeout
    while True:
        b0, t0 = machine_busy_s(), time.perf_counter()
        time.sleep(sample_s)
        load = max(machine_busy_s() - b0, 0.0) / (time.perf_counter() - t0)
        if load <= max_cores or time.monotonic() >= deadline:
            return load
        time.sleep(1.0)


def quiet_run(
    run: Callable[[], ChildRun], *, max_cores: float, quiet_wait: float, retries: int, label: str
) -> ChildRun:
    """``run()`` on a quiet machine: wait (``wait_quiet``) first, and run again, up to
    ``retries`` times, when other processes used more than ``max_cores`` meanwhile or
    the run timed out (on 2 cores with 2 threads, other load can stall llama.cpp's
    thread pool by up to 100x). A run that failed otherwise is returned at once.
    Returns the successful attempt with the least foreign load (else the last one)."""
    best: ChildRun | None = None
    for attempt in range(retries + 1):
        wait_quiet(max_cores, quiet_wait)
        r = run()
        if not r.ok and not r.timed_out:
            return r
        if r.ok and (best is None or not best.ok or r.foreign_cores < best.foreign_cores):
            best = r
        elif best is None or not best.ok:
            best = r
        if r.ok and not r.foreign_cores > max_cores:  # NaN (unknown load) counts as quiet
            break
        if attempt < retries:
            why = "it timed out" if r.timed_out else f"other processes used {r.foreign_cores:.2f} cores meanwhile"
            print(f"  ({label}: {why}: measuring again)", flush=True)
    assert best is not None
    return best


def self_peak_rss_kib() -> int:
    """Peak RSS of this process so far."""
    import resource

    return maxrss_kib(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def json_safe(obj: Any) -> Any:
    """JSON-safe: NaN and infinities become null, paths and other objects strings."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if hasattr(obj, "item"):  # numpy scalars
        return json_safe(obj.item())
    return str(obj)


def write_json(path: Path | str, payload: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_safe(payload), indent=1, allow_nan=False) + "\n")
    print(f"wrote {path}", flush=True)


def command_line(argv: Sequence[str]) -> str:
    """How to run this script again: ``python benchmarks/<name>.py ARGS`` (no --json)."""
    args: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--json":
            skip = True
            continue
        if a.startswith("--json="):
            continue
        args.append(a)
    script = Path(sys.argv[0]).resolve()
    try:
        rel = str(script.relative_to(ROOT)) if IN_SOURCE_TREE else str(script)
    except ValueError:
        rel = str(script)
    return " ".join(["python", rel, *args])


# ---------------------------------------------------------------------- the machine
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            return subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            pass
    return platform.processor() or platform.machine() or "unknown-cpu"


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS
        return os.cpu_count() or 1


def slug(text: str, max_len: int = 24) -> str:
    s = re.sub(r"\((r|tm|c)\)", "", text.lower())
    s = re.sub(r"\b(cpu|processor|with|radeon graphics|\d+-core)\b", " ", s)
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    return s[:max_len].strip("-") or "x"


def machine_slug() -> str:
    """``<hostname>-<cpu model>-<cores>c``, short and file-name safe (e.g. ``vm-amd-epyc-2c``)."""
    host = slug(socket.gethostname().split(".")[0], 16)
    return f"{host}-{slug(cpu_model())}-{cpu_cores()}c"


# ---------------------------------------------------------------------- the peer
PEER = "llama-cpp-python"


def peer_pinned_version() -> str:
    """The llama-cpp-python release whose sdist vendors the llama.cpp commit llama_cffi
    pins (its ctypes declarations match that commit's llama.h)."""
    from llama_cffi._version import LLAMA_CPP_SDIST

    return str(LLAMA_CPP_SDIST["prefix"]).removeprefix("llama_cpp_python-")


def peer_install_command() -> str:
    """How to install the peer without compiling llama.cpp (the benchmarks give it the
    pinned llama.cpp built by native_tools.llama_shared_lib_dir through LLAMA_CPP_LIB_PATH)."""
    return f'CMAKE_ARGS="-DLLAMA_BUILD=OFF" pip install "{PEER}=={peer_pinned_version()}"'


def peer_skip_reason() -> str | None:
    """Why the peer cannot run here (None: it can): ``"not installed"``, or a version
    other than the pinned one (whose ctypes declarations would not match the library)."""
    try:
        version = importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
    want = peer_pinned_version()
    if version != want:
        return f"version {version} installed; the benchmarks need {want} (the pinned llama.cpp's llama.h)"
    return None


def llama_batched_loop(
    model: Any, prompt: str, n: int, tg: int, seed: int, threads: int, device: bool
) -> dict[str, float]:
    """llama.cpp's ``llama-batched -np n`` loop (examples/batched) with a BranchStore: the
    prompt decoded once for ``n`` sequences (forks of one branch, so one seed for every
    sequence, as its samplers have), ``TopK(40) -> TopP(0.95) -> Temperature(0.8) ->
    Dist(seed)`` per sequence, its context sizes (``n_ctx`` = prompt + ``tg`` * n, unified
    KV), and its rule: a sequence ends at an end-of-generation token or at ``tg`` tokens.
    Returns the tokens decoded, the loop's seconds and tokens/s, as it prints them.
    ``device``: ``BranchStore(device=True)`` (llama-batched's ``--backend-sampling``)."""
    import samplers as S
    from samplers.branch import BranchStore

    toks = model.tokenize(prompt)
    n_predict = len(toks) + tg
    ctx = model.context(
        n_ctx=len(toks) + tg * n,
        n_batch=max(n_predict, n),
        n_seq_max=n,
        kv_unified=True,
        n_threads=threads,
        n_threads_batch=threads,
    )
    try:
        store = BranchStore(ctx, device=device)
        chain = S.SamplerChain([S.TopK(40), S.TopP(0.95), S.Temperature(0.8), S.Dist(seed)])
        root = store.create(toks, sampler=chain)
        active = [root] + [root.fork() for _ in range(n - 1)]
        is_eog = model.vocab.is_eog
        n_cur, n_decode = len(toks), 0
        t0 = time.perf_counter()
        while n_cur <= n_predict:
            moves = {b: t for b, t in store.sample(active).items() if not (is_eog(t) or n_cur == n_predict)}
            if not moves:
                break
            n_decode += len(moves)
            active = list(moves)
            n_cur += 1
            store.step(moves)
        wall = time.perf_counter() - t0
    finally:
        ctx.close()
    return {"tokens": float(n_decode), "loop_s": wall, "tps": n_decode / wall}
