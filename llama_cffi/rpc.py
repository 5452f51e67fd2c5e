"""llama.cpp's RPC backend: a model split across worker processes on other machines.

A worker (``python -m llama_cffi rpc-server --host H --port P``, which runs
:func:`serve`) lends its devices to one client at a time; the client loads a model with
``Model.load(path, rpc_servers=["H:P", ...])`` and llama.cpp puts the offloaded layers on
the workers' devices (``n_gpu_layers``, ``split_mode`` and ``tensor_split`` choose how
many and in what proportion), keeping the rest, and the input embeddings, local.

.. warning:: The RPC protocol has **no authentication and no encryption**. Anyone who
   can reach a worker's port can read and write its memory and run work on it. Bind
   workers to loopback (``127.0.0.1``) or to a private network you trust, never to a
   public interface.

llama.cpp aborts the process on a malformed endpoint, an unreachable worker or a failed
handshake. :func:`check_server` makes those a :class:`~llama_cffi.errors.RpcError` (or a
:class:`~llama_cffi.errors.ParamError` for a malformed endpoint) first: it connects and
performs the protocol's HELLO exchange in Python before llama.cpp is asked to.

A worker that dies while a model uses it would make llama.cpp's RPC client abort too; the
build applies ``patches/ggml-rpc-failures.patch`` so that the client marks the connection
failed instead (:func:`failure_recovery`), and the load, context creation or decode that
meets it raises :class:`~llama_cffi.errors.RpcError`; the model is refused afterwards.
"""

from __future__ import annotations

import ipaddress
import re
import signal
import socket
import struct
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ._args import expect_int, expect_number, expect_str, type_error
from ._binding import ffi, lib
from .errors import ParamError, RpcError

__all__ = [
    "RpcDevice",
    "add_servers",
    "check_server",
    "failure_recovery",
    "parse_endpoint",
    "serve",
    "supports_rpc",
    "wait_for_server",
]

# ggml-rpc.cpp: RPC_CMD_HELLO is fixed at 14 for every protocol version; the request is
# the client's connection capabilities (RPC_CONN_CAPS_SIZE = 24 bytes, zeros: none), the
# reply | major | minor | patch | pad | 24 capability bytes |
_CMD_HELLO = 14
_CAPS = 24
_PROTO_MAJOR = 7  # RPC_PROTO_MAJOR_VERSION of the pinned ggml-rpc.h
_PROTO_MINOR = 0


def supports_rpc() -> bool:
    """Whether this build has the RPC backend (on unless built with ``LLAMA_CFFI_RPC=0``)."""
    return bool(lib.llama_supports_rpc()) and hasattr(lib, "ggml_backend_rpc_add_server")


def _require_rpc() -> None:
    if not supports_rpc():
        raise RpcError("this build of llama_cffi has no RPC backend (it was built with LLAMA_CFFI_RPC=0)")


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``"host:port"`` as llama.cpp reads it (the host up to the first ``:``; no IPv6
    literals), validated: llama.cpp would abort on what it cannot parse."""
    if not isinstance(endpoint, str):
        raise ParamError(f"an RPC endpoint is a 'host:port' string, not {endpoint!r}")
    m = re.fullmatch(r"([^:\s]+):([0-9]{1,5})", endpoint)
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise ParamError(f"RPC endpoint {endpoint!r} is not 'host:port' (a host name or IPv4 address, a port 1-65535)")
    return m.group(1), int(m.group(2))


def check_server(endpoint: str, timeout: float = 5.0) -> tuple[int, int, int]:
    """Connect to a worker and exchange HELLO; returns its protocol version
    ``(major, minor, patch)``. Raises :class:`RpcError` when nothing listens there,
    something else answers, or the version is not one llama.cpp here can talk to."""
    host, port = parse_endpoint(endpoint)
    timeout = expect_number("timeout", timeout, "a number of seconds")
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(struct.pack("<BQ", _CMD_HELLO, _CAPS) + bytes(_CAPS))
            head = _recv(s, 8)
            (size,) = struct.unpack("<Q", head)
            if size != 4 + _CAPS:
                raise RpcError(f"{endpoint} is not an RPC worker (HELLO answered with {size} bytes)")
            reply = _recv(s, size)
    except RpcError:
        raise
    except (OSError, EOFError) as exc:
        raise RpcError(f"cannot reach the RPC worker at {endpoint}: {exc}") from exc
    major, minor, patch = reply[0], reply[1], reply[2]
    if major != _PROTO_MAJOR or minor > _PROTO_MINOR:
        raise RpcError(
            f"the RPC worker at {endpoint} speaks protocol {major}.{minor}.{patch}; this build speaks "
            f"{_PROTO_MAJOR}.{_PROTO_MINOR} (run a worker from the same llama_cffi version)"
        )
    return major, minor, patch


def wait_for_server(endpoint: str, timeout: float = 30.0, process: Any = None) -> tuple[int, int, int]:
    """:func:`check_server` until the worker answers (one just started, say); returns its
    protocol version. Raises :class:`RpcError` after ``timeout`` seconds, or as soon as
    ``process`` (a ``subprocess.Popen`` running the worker, if given) has exited."""
    parse_endpoint(endpoint)
    timeout = expect_number("timeout", timeout, "a number of seconds")
    if process is not None and not callable(getattr(process, "poll", None)):
        raise type_error("process", "a subprocess.Popen (anything with poll()), or None", process)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check_server(endpoint, timeout=1.0)
        except RpcError:
            if process is not None and process.poll() is not None:
                raise RpcError(f"the RPC worker for {endpoint} exited with status {process.returncode}") from None
            if time.monotonic() > deadline:
                raise RpcError(f"the RPC worker at {endpoint} did not answer within {timeout} s") from None
            time.sleep(0.05)


def _recv(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError("the connection was closed during the handshake")
        buf += chunk
    return bytes(buf)


_NEVER_BLOCK = {"SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT", "SIGTRAP", "SIGKILL", "SIGSTOP"}


@contextmanager
def signals_held() -> Iterator[None]:
    """Block asynchronous signals in this thread for the block, so that the threads
    llama.cpp starts inside it (one RPC dispatcher per worker connection) inherit a mask
    that keeps them off. Python installs its handlers (Ctrl-C's too) without SA_RESTART:
    one delivered to a dispatcher interrupts its ``recv``, and llama.cpp then aborts the
    process. Signals that arrive meanwhile are delivered when the block ends."""
    held = {s for s in signal.valid_signals() if getattr(s, "name", "") not in _NEVER_BLOCK}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@dataclass(frozen=True)
class RpcDevice:
    """One device of a worker. ``memory_free``/``memory_total`` are in bytes, as the
    worker reported them when it was added."""

    name: str
    endpoint: str
    memory_free: int
    memory_total: int


_lock = threading.Lock()
_registered: dict[str, list[tuple[RpcDevice, Any]]] = {}  # endpoint -> (device, ggml_backend_dev_t)


def add_servers(endpoints: Sequence[str], timeout: float = 5.0) -> list[tuple[RpcDevice, Any]]:
    """Register workers with llama.cpp (each endpoint once per process) after checking
    each with :func:`check_server`; returns their devices, with the native handles
    that ``llama_model_params.devices`` takes. The handles live as long as the process
    (llama.cpp never unregisters a server)."""
    timeout = expect_number("timeout", timeout, "a number of seconds")
    _require_rpc()
    if isinstance(endpoints, str) or not isinstance(endpoints, Sequence):
        raise type_error("endpoints (rpc_servers)", "a non-empty list of 'host:port' strings", endpoints)
    if not endpoints:
        raise ParamError("endpoints (rpc_servers) must be a non-empty list of 'host:port' strings")
    out: list[tuple[RpcDevice, Any]] = []
    with _lock:
        for ep in endpoints:
            if ep in _registered:
                out += _registered[ep]
                continue
            check_server(ep, timeout)
            with signals_held():  # starts the endpoint's dispatcher thread
                reg = lib.ggml_backend_rpc_add_server(ep.encode())
            if reg == ffi.NULL:
                raise RpcError(f"the RPC worker at {ep} reports no devices")
            free = ffi.new("size_t *")
            total = ffi.new("size_t *")
            devs = []
            for i in range(int(lib.ggml_backend_reg_dev_count(reg))):
                dev = lib.ggml_backend_reg_dev_get(reg, i)
                with signals_held():
                    lib.ggml_backend_dev_memory(dev, free, total)
                name = ffi.string(lib.ggml_backend_dev_name(dev)).decode()
                devs.append((RpcDevice(name, ep, int(free[0]), int(total[0])), dev))
            _registered[ep] = devs
            out += devs
    return out


_users: dict[str, weakref.WeakSet[Any]] = {}  # endpoint -> models loaded over it


def before_load(endpoints: Sequence[str]) -> None:
    """Check again the workers that no open model of this process uses: llama.cpp's
    connection to them was closed with their last model, and reconnecting to a worker
    that has gone away since would abort the process. (One in use is busy with us, and
    serves one client at a time, so it cannot be asked.)"""
    with _lock:
        for ep in endpoints:
            if not any(_holds_native(m) for m in _users.get(ep, ())):
                check_server(ep)


def _holds_native(model: Any) -> bool:
    """Whether llama.cpp still has the model (a closed one stays while contexts use it)."""
    h = model._handle
    return h is not None and h.ptr is not None and h.ptr != ffi.NULL


def loaded(model: Any, endpoints: Sequence[str]) -> None:
    """Record that ``model`` holds a connection to each of ``endpoints``."""
    with _lock:
        for ep in endpoints:
            _users.setdefault(ep, weakref.WeakSet()).add(model)


def failure_recovery() -> bool:
    """Whether this build's RPC client survives a worker that fails (our patch to
    llama.cpp, ``patches/ggml-rpc-failures.patch``, is applied); without it llama.cpp
    aborts the process when a worker dies while a model uses it."""
    return hasattr(lib, "ggml_backend_rpc_failures")


def failures() -> int:
    """Connection failures of llama.cpp's RPC client in this process so far (0 without
    :func:`failure_recovery`)."""
    return int(lib.ggml_backend_rpc_failures()) if failure_recovery() else 0


def failed(endpoints: Sequence[str]) -> str | None:
    """The first of ``endpoints`` whose connection failed, with llama.cpp's reason, or None."""
    if not failure_recovery():
        return None
    buf = ffi.new("char[512]")
    for ep in endpoints:
        if lib.ggml_backend_rpc_endpoint_failed(ep.encode(), buf, len(buf)):
            return f"the RPC worker at {ep} failed ({ffi.string(buf).decode(errors='replace')})"
    return None


def _is_loopback_or_private(host: str) -> bool:
    try:
        addr = ipaddress.ip_address(socket.gethostbyname(host))
    except (OSError, ValueError):
        return False
    return addr.is_loopback or addr.is_private


def serve(host: str = "127.0.0.1", port: int = 50052, n_threads: int = 0, cache_dir: str | None = None) -> None:
    """Run an RPC worker on this machine's CPU until the process is stopped (Ctrl-C
    works: the server runs on a daemon thread). ``n_threads`` 0: the CPU count.
    ``cache_dir``: where the worker caches tensors the client sends by hash (faster
    reloads of the same model). See the module's security warning."""
    host = expect_str("host", host, "a str (an address to listen on)")
    port = expect_int("port", port)
    if cache_dir is not None:
        cache_dir = expect_str("cache_dir", cache_dir, "a str (a directory) or None")
    _require_rpc()
    endpoint = f"{host}:{port}"
    parse_endpoint(endpoint)
    if isinstance(n_threads, bool) or not isinstance(n_threads, int) or n_threads < 0:
        raise ParamError(f"n_threads must be an int >= 0, not {n_threads!r}")
    try:  # llama.cpp aborts when it cannot bind: find out first
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        raise RpcError(f"cannot listen on {endpoint}: {exc}") from exc
    if not _is_loopback_or_private(host):
        print(
            f"llama-cffi: warning: {host} is not a loopback or private address; the RPC protocol has no "
            "authentication, so anyone who can reach this port can use this machine's memory and CPU",
            file=sys.stderr,
        )
    import os

    threads = n_threads or os.cpu_count() or 1
    cpu = lib.ggml_backend_dev_by_type(lib.GGML_BACKEND_DEVICE_TYPE_CPU)
    if cpu == ffi.NULL:
        raise RpcError("no CPU device to serve")
    devices = ffi.new("ggml_backend_dev_t[]", [cpu])
    ep = ffi.new("char[]", endpoint.encode())
    cache = ffi.new("char[]", cache_dir.encode()) if cache_dir else ffi.NULL
    worker = threading.Thread(
        target=lib.ggml_backend_rpc_start_server,
        args=(ep, cache, threads, 1, devices),
        name=f"rpc-server {endpoint}",
        daemon=True,
    )
    worker.start()
    print(f"llama-cffi: RPC worker on {endpoint} ({threads} threads); Ctrl-C stops it", file=sys.stderr, flush=True)
    while worker.is_alive():
        worker.join(0.5)
