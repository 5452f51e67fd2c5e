"""llama.cpp's RPC backend through llama_cffi: workers started by the CLI on loopback
ports, a model split across them, and the endpoint mistakes llama.cpp would abort on."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import llama_cffi
from llama_cffi import rpc
from llama_cffi.errors import ParamError
from tests.conftest import DEFAULT_SIGINT, ROOT, run_isolated

PROMPT = [1, 40, 41, 42, 43, 44]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def workers(n: int, timeout: float = 30.0) -> Iterator[list[str]]:
    """``n`` workers (``python -m llama_cffi rpc-server``) on free loopback ports, ready
    (they answer HELLO) within ``timeout`` seconds, stopped afterwards."""
    ports = [free_port() for _ in range(n)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "llama_cffi", "rpc-server", "--port", str(p), "-t", "1"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for p in ports
    ]
    endpoints = [f"127.0.0.1:{p}" for p in ports]
    try:
        for ep, proc in zip(endpoints, procs, strict=True):
            rpc.wait_for_server(ep, timeout, proc)
        yield endpoints
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def greedy(ctx: llama_cffi.Context, n: int) -> list[int]:
    """``n`` greedy tokens after the last decode."""
    out = []
    for _ in range(n):
        out.append(int(np.asarray(ctx.logits()).argmax()))
        ctx.decode_single(out[-1])
    return out


def test_build_has_rpc() -> None:
    """CI builds with the RPC backend (it is on unless LLAMA_CFFI_RPC=0)."""
    assert llama_cffi.supports_rpc()
    assert llama_cffi.build_info()["options"]["GGML_RPC"] == "ON"


@pytest.mark.parametrize(
    "endpoint",
    ["", "localhost", "127.0.0.1:", ":50052", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:50x", "[::1]:50052", 50052],
)
def test_malformed_endpoints_are_param_errors(endpoint: object) -> None:
    """What llama.cpp's endpoint parser would abort on (std::stoi) is refused first."""
    with pytest.raises(ParamError):
        rpc.parse_endpoint(endpoint)  # type: ignore[arg-type]


def test_split_across_two_workers_matches_local(tiny_model_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The tiny model split across two loopback workers gives the local logits, and the
    same greedy continuation; both workers hold part of the weights."""
    # the reference on this CPU, as the workers serve theirs: on a CUDA build the default
    # n_gpu_layers=-1 would compute it on the GPU, which rounds differently (seen: 4.5e-4)
    with llama_cffi.Model.load(tiny_model_path, n_gpu_layers=0) as m, m.context(n_ctx=64, n_threads=1) as ctx:
        ref = np.asarray(ctx.decode(PROMPT)).copy()
        ref_tokens = greedy(ctx, 8)
    with workers(2) as endpoints:
        llama_cffi.set_verbosity("info")
        try:
            with caplog.at_level(logging.INFO, logger="llama_cffi"):
                model = llama_cffi.Model.load(tiny_model_path, rpc_servers=endpoints, n_gpu_layers=99)
        finally:
            llama_cffi.set_verbosity("warning")
        with model, model.context(n_ctx=64, n_threads=1) as ctx:
            got = np.asarray(ctx.decode(PROMPT)).copy()
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
            assert greedy(ctx, 8) == ref_tokens
        buffers = [r.getMessage() for r in caplog.records if "model buffer size" in r.getMessage()]
        for ep in endpoints:
            assert any(ep in line for line in buffers), buffers
        assert [d.endpoint for d, _ in rpc.add_servers(endpoints)] == endpoints


def test_tensor_split_chooses_the_workers(tiny_model_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """tensor_split puts the offloaded layers on the workers in that proportion: [1, 0]
    on the first only, [0, 1] on the second only; the logits stay the local ones."""
    with llama_cffi.Model.load(tiny_model_path, n_gpu_layers=0) as m, m.context(n_ctx=64, n_threads=1) as ctx:
        ref = np.asarray(ctx.decode(PROMPT)).copy()
    with workers(2) as endpoints:
        for split, holder in (([1.0, 0.0], endpoints[0]), ([0.0, 1.0], endpoints[1])):
            caplog.clear()
            llama_cffi.set_verbosity("info")
            try:
                with caplog.at_level(logging.INFO, logger="llama_cffi"):
                    model = llama_cffi.Model.load(
                        tiny_model_path, rpc_servers=endpoints, n_gpu_layers=99, tensor_split=split
                    )
            finally:
                llama_cffi.set_verbosity("warning")
            buffers = [r.getMessage() for r in caplog.records if "model buffer size" in r.getMessage()]
            with model, model.context(n_ctx=64, n_threads=1) as ctx:
                np.testing.assert_allclose(np.asarray(ctx.decode(PROMPT)), ref, rtol=1e-4, atol=1e-4)
            on = [ep for ep in endpoints if any(ep in line for line in buffers)]
            assert on == [holder], buffers


UNREACHABLE = (
    r"""
import socket, threading
import llama_cffi
from llama_cffi import rpc
"""
    + "{EXPECT}"
    + r"""
def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

# a TCP server that is not an RPC worker: it answers every connection with junk and closes
junk = socket.socket(); junk.bind(("127.0.0.1", 0)); junk.listen()
def answer():
    while True:
        c, _ = junk.accept()
        c.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
        c.close()
threading.Thread(target=answer, daemon=True).start()
# one that accepts and closes at once
closer = socket.socket(); closer.bind(("127.0.0.1", 0)); closer.listen()
def close_at_once():
    while True:
        c, _ = closer.accept()
        c.close()
threading.Thread(target=close_at_once, daemon=True).start()

dead = f"127.0.0.1:{port()}"
expect(llama_cffi.RpcError, lambda: llama_cffi.Model.load(PATH, rpc_servers=[dead]))
expect(llama_cffi.RpcError, lambda: llama_cffi.Model.load(PATH, rpc_servers=[f"127.0.0.1:{junk.getsockname()[1]}"]))
expect(llama_cffi.RpcError, lambda: llama_cffi.Model.load(PATH, rpc_servers=[f"127.0.0.1:{closer.getsockname()[1]}"]))
expect(llama_cffi.ParamError, lambda: llama_cffi.Model.load(PATH, rpc_servers=["127.0.0.1:99999"]))
expect(llama_cffi.ParamError, lambda: llama_cffi.Model.load(PATH, rpc_servers="127.0.0.1:5"))
expect(llama_cffi.ParamError, lambda: llama_cffi.Model.load(PATH, rpc_servers=[]))
expect(llama_cffi.RpcError, lambda: rpc.check_server(dead, timeout=0.5))
# the model still loads locally afterwards
with llama_cffi.Model.load(PATH) as m, m.context(n_ctx=32) as c:
    c.decode([1, 2, 3])
out.append("LOCAL-OK")
print(" ".join(out))
"""
)


def test_bad_workers_raise_instead_of_aborting(tiny_model_path: Path) -> None:
    """Nothing listening, a non-RPC server, a server that hangs up, malformed endpoints:
    typed errors in a child that then loads the model locally (llama.cpp would abort)."""
    from tests.conftest import EXPECT

    code = UNREACHABLE.replace("{EXPECT}", EXPECT).replace("PATH", repr(str(tiny_model_path)))
    r = run_isolated(code, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    # a str where a list of endpoints is needed: a ParamTypeError (a ParamError and a TypeError)
    want = ["RpcError"] * 3 + ["ParamError", "ParamTypeError", "ParamError", "RpcError", "LOCAL-OK"]
    assert r.stdout.split() == want, r.stdout


def test_rpc_server_cli_refuses_a_busy_port() -> None:
    """A port already in use is a one-line error with exit status 2 (llama.cpp would abort)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run(
            [sys.executable, "-m", "llama_cffi", "rpc-server", "--port", str(port)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "cannot listen on" in r.stderr, r.stderr


def test_rpc_server_stops_on_ctrl_c() -> None:
    """The worker runs llama.cpp's blocking server on a thread, so SIGINT stops it."""
    import signal

    port = free_port()
    # the CLI keeps the SIGINT disposition it inherits (ignored under nohup or &, as a
    # background job should): give it Python's default, as a terminal would
    cli = DEFAULT_SIGINT + "import runpy; runpy.run_module('llama_cffi', run_name='__main__')"
    proc = subprocess.Popen(
        [sys.executable, "-c", cli, "rpc-server", "--port", str(port), "-t", "1"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        rpc.wait_for_server(f"127.0.0.1:{port}", 30, proc)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


SIGINT_STORM = r"""
import signal
import numpy as np
import llama_cffi
interrupts = 0
def count(signum, frame):
    global interrupts
    interrupts += 1
# a Python handler, like Ctrl-C's default one, is installed without SA_RESTART
signal.signal(signal.SIGINT, count)
m = llama_cffi.Model.load(PATH, rpc_servers=ENDPOINTS, n_gpu_layers=99)
ctx = m.context(n_ctx=512, n_threads=1)
print("READY", flush=True)
for step in range(STEPS):
    if ctx.memory.seq_pos_max(0) > 400:
        ctx.memory.clear()
    ctx.decode([1, 40, 41, 42, 43, 44, 45, 46])
ctx.memory.clear()
print("ALIVE", interrupts, bool(np.isfinite(np.asarray(ctx.decode([1, 2, 3]))).all()), flush=True)
"""


def test_ctrl_c_storm_during_rpc_decodes(tiny_model_path: Path) -> None:
    """SIGINT sent again and again to every thread of a process whose model is split over
    a worker, while it decodes: llama.cpp's RPC threads keep it blocked (there, a Python
    handler's signal would interrupt a recv and llama.cpp would abort the process)."""
    import ctypes
    import os
    import signal

    with workers(1) as endpoints:
        code = (
            SIGINT_STORM.replace("PATH", repr(str(tiny_model_path)))
            .replace("ENDPOINTS", repr(endpoints))
            .replace("STEPS", "2000")
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "READY"
            # to every thread of the child, as the kernel may pick any thread that does not
            # block a process-directed signal (it skips a main thread with one pending)
            tgkill = ctypes.CDLL(None, use_errno=True).tgkill  # glibc >= 2.30
            rounds = 0
            while proc.poll() is None and rounds < 200:
                for tid in os.listdir(f"/proc/{proc.pid}/task") if proc.poll() is None else []:
                    tgkill(proc.pid, int(tid), signal.SIGINT)
                rounds += 1
                time.sleep(0.005)
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert proc.returncode == 0, err[-2000:]
    words = out.split()
    assert words[0] == "ALIVE" and words[-1] == "True", out
    assert int(words[1]) > 0, out  # the interrupts did arrive


RESTARTED = (
    r"""
import subprocess, sys, time
import llama_cffi
from llama_cffi import rpc
"""
    + "{EXPECT}"
    + r"""
def start():
    p = subprocess.Popen([sys.executable, "-m", "llama_cffi", "rpc-server", "--port", PORT, "-t", "1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rpc.wait_for_server(EP, 30, p)
    return p
w = start()
m = llama_cffi.Model.load(PATH, rpc_servers=[EP], n_gpu_layers=99)
with m.context(n_ctx=32) as c:
    c.decode([1, 2, 3])
m2 = llama_cffi.Model.load(PATH, rpc_servers=[EP], n_gpu_layers=99)  # in use: not asked again
m2.close()
m.close()
w.terminate(); w.wait(10)
# the last model over EP is gone, and so is the worker: the next load asks first
expect(llama_cffi.RpcError, lambda: llama_cffi.Model.load(PATH, rpc_servers=[EP], n_gpu_layers=99))
w = start()  # back again: loads work
with llama_cffi.Model.load(PATH, rpc_servers=[EP], n_gpu_layers=99) as m, m.context(n_ctx=32) as c:
    c.decode([1, 2, 3])
out.append("RELOADED")
w.terminate(); w.wait(10)
print(" ".join(out))
"""
)


def test_a_worker_gone_between_models_is_an_error(tiny_model_path: Path) -> None:
    """Once its last model is closed, a worker that went away is an RpcError at the next
    load (llama.cpp would abort reconnecting), and a restarted one is used again."""
    from tests.conftest import EXPECT

    port = free_port()
    code = (
        RESTARTED.replace("{EXPECT}", EXPECT)
        .replace("PATH", repr(str(tiny_model_path)))
        .replace("PORT", repr(str(port)))
        .replace("EP", repr(f"127.0.0.1:{port}"))
    )
    r = run_isolated(code, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["RpcError", "RELOADED"], r.stdout


WORKER_DIES = r"""
import os, signal, subprocess, sys, threading, time
import numpy as np
import llama_cffi
from llama_cffi import rpc
assert rpc.failure_recovery()
def start(port):
    p = subprocess.Popen([sys.executable, "-m", "llama_cffi", "rpc-server", "--port", str(port), "-t", "1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rpc.wait_for_server(f"127.0.0.1:{port}", 30, p)
    return p
prompt = [1] + [int(t) for t in np.random.default_rng(0).integers(3, 400, 500)]
with llama_cffi.Model.load(PATH) as m, m.context(n_ctx=1024, n_batch=64, n_threads=1) as c:
    ref = np.asarray(c.decode(prompt[:8])).copy()
outcomes = []
for k, when in enumerate(WHENS):
    port = PORT0 + k
    w = start(port)
    ep = f"127.0.0.1:{port}"
    m = llama_cffi.Model.load(PATH, rpc_servers=[ep], n_gpu_layers=99)
    c = m.context(n_ctx=1024, n_batch=64, n_threads=1)
    c.decode(prompt[:8])
    if when == "between":
        w.kill(); w.wait(10)
    else:
        threading.Timer(when, w.kill).start()
    got = "no error"
    try:
        for _ in range(200):
            c.memory.clear()
            c.decode(prompt)  # 500 tokens in 64-token batches
    except llama_cffi.RpcError:
        got = "RpcError"
    try:
        c.decode(prompt[:8])
        again = "no error"
    except llama_cffi.RpcError:
        again = "RpcError"
    t = time.monotonic()
    c.close(); m.close()
    closed = time.monotonic() - t < 30  # a hang guard (a TCP timeout would be minutes), not a speed
    w.wait(10)
    # a local model is untouched
    with llama_cffi.Model.load(PATH) as lm, lm.context(n_ctx=64, n_threads=1) as lc:
        same = bool(np.array_equal(np.asarray(lc.decode(prompt[:8])), ref))
    outcomes.append(f"{got}/{again}/{closed}/{same}")
print(" ".join(outcomes))
"""


def test_a_worker_killed_mid_generation_is_an_rpc_error(tiny_model_path: Path) -> None:
    """A worker killed between decodes, or at several moments during a run of decodes:
    the decode raises RpcError (the process lives), the model is refused afterwards,
    closing it is prompt, and a local model is untouched."""
    whens = ["between", 0.02, 0.1, 0.3]
    code = (
        WORKER_DIES.replace("PATH", repr(str(tiny_model_path)))
        .replace("WHENS", repr(whens))
        .replace("PORT0", str(_free_port_block(len(whens))))
    )
    r = run_isolated(code, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["RpcError/RpcError/True/True"] * len(whens), r.stdout


def _free_port_block(n: int) -> int:
    """A port p with p .. p+n-1 free now (a worker per case)."""
    for _ in range(100):
        p = free_port()
        if p + n < 65536 and all(_port_free(p + i) for i in range(n)):
            return p
    raise AssertionError("no block of free ports")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
