"""samplers.distributed on a Ray cluster made with the ``ray`` command, as users make one:
``ray start --head`` on loopback and a second node process (``ray start --address``),
one CPU each, so the two workers land on different nodes. A driver in a fresh
interpreter connects with ``cluster="HOST:PORT"`` (Ray reads its authentication mode
when it is imported, so the driver must not be this process, which may have imported
Ray with other settings). Perplexity equals the single process bit for bit,
map_generate equals the one-at-a-time reference, and a worker killed on the second node
is restarted without changing the results.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import llama_cffi
from samplers.perplexity import perplexity
from tests.conftest import ROOT
from tests.test_distributed import corpus, requests, sequential

pytest.importorskip("ray")  # the test extra installs it: a skip fails the run under CI=true


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ray_cli() -> str:
    exe = Path(sys.executable).parent / "ray"
    return str(exe) if exe.exists() else shutil.which("ray") or "ray"


def _stop(temp: str) -> None:
    """End this cluster's processes only (``ray stop`` would end every Ray instance of the
    machine, another test process's included): those whose command line names its
    temporary directory (GCS, both raylets, monitors) and their descendants (agents and
    workers, whose titles Ray rewrites)."""
    parent: dict[int, int] = {}
    ours: set[int] = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                parent[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if temp.encode() in (proc / "cmdline").read_bytes():
                    ours.add(int(proc.name))
            except (OSError, ValueError, IndexError):
                pass
    grew = True
    while grew:
        kids = {pid for pid, pp in parent.items() if pp in ours} - ours
        ours |= kids
        grew = bool(kids)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in ours:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in ours):
            time.sleep(0.2)


def _env() -> dict[str, str]:
    # token authentication (Ray's default for `ray start --head`) for every process of the
    # cluster and the driver, whatever this process inherited
    env = dict(os.environ, RAY_AUTH_MODE="token", GGML_NO_BACKTRACE="1")
    env.pop("RAY_ADDRESS", None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A head node and a worker node on 127.0.0.1 (one CPU each), stopped afterwards."""
    port = _free_port()
    address = f"127.0.0.1:{port}"
    temp = tempfile.mkdtemp(prefix="ray_")
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats"]
    head = [_ray_cli(), "start", "--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp}"]
    worker = [_ray_cli(), "start", f"--address={address}"]
    try:
        for cmd in (head + common, worker + common):
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=_env())
            assert r.returncode == 0, (cmd, r.stdout[-2000:], r.stderr[-2000:])
        yield address
    finally:
        _stop(temp)
        shutil.rmtree(temp, ignore_errors=True)


DRIVER = r"""
import json, os, signal, sys
import ray
import samplers
from samplers import distributed as D
from tests.test_distributed import chain, corpus, requests

address, model = sys.argv[1], sys.argv[2]
out = {}
with D.Workers(model, 2, cluster=address, model_params={"use_extra_bufts": False}) as pool:
    out["info"] = pool.info()
    out["nodes"] = len(ray.nodes())
    out["driver_node"] = ray.get_runtime_context().get_node_id()[:12]
    res = pool.perplexity(corpus(), 64, 128, 24)
    out["ppl"] = [res.ppl, res.stderr, res.nll, list(res.chunk_ppl)]
    gens = pool.map_generate(requests(), sampler=chain(), max_tokens=12, stop=["\n"], seed=100, batch_size=2, n_ctx=256)
    out["texts"] = [g.text for g in gens]
    out["gen_nodes"] = sorted({g.worker.split(":")[0] for g in gens})
    prompts = [f"prompt number {i}" for i in range(16)]
    kw = {"sampler": chain(), "max_tokens": 12, "batch_size": 2, "n_ctx": 256}
    ref = pool.map_generate(prompts, **kw)
    remote = [i for i in pool.info() if i["node_id"] != out["driver_node"]]
    out["remote"] = remote
    killed = []

    def kill_once(done, total):
        if not killed and remote:
            os.kill(remote[0]["pid"], signal.SIGKILL)
            killed.append(done)

    gens = pool.map_generate(prompts, progress=kill_once, **kw)
    out["killed"] = killed
    out["pids_after"] = [i["pid"] for i in pool.refresh_info()]
    out["same_after_kill"] = [(g.text, g.tokens) for g in gens] == [(g.text, g.tokens) for g in ref]
    out["all_ok"] = all(g.ok for g in gens)
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def run(cluster: str, tiny_model_path: Path) -> dict[str, Any]:
    r = subprocess.run(
        [sys.executable, "-c", DRIVER, cluster, str(tiny_model_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=_env(),
    )
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert r.returncode == 0 and line, r.stderr[-3000:]
    out: dict[str, Any] = json.loads(line[len("RESULT ") :])
    return out


def test_two_nodes(run: dict[str, Any]) -> None:
    assert run["nodes"] == 2
    assert len({i["node_id"] for i in run["info"]}) == 2, run["info"]  # one CPU per node: one worker each


def test_perplexity_on_the_cluster(run: dict[str, Any], tiny_model_path: Path) -> None:
    with llama_cffi.Model.load(tiny_model_path, use_extra_bufts=False) as m:
        ref = perplexity(m, corpus(), 64, 128, 24)
    assert run["ppl"] == [ref.ppl, ref.stderr, ref.nll, list(ref.chunk_ppl)]  # floats survive JSON exactly


def test_map_generate_on_the_cluster(run: dict[str, Any], tiny_model_path: Path) -> None:
    assert run["texts"] == sequential(tiny_model_path, requests(), 12, ["\n"])
    assert len(run["gen_nodes"]) == 2  # both nodes generated


def test_worker_killed_on_the_second_node(run: dict[str, Any]) -> None:
    assert len(run["remote"]) == 1 and run["killed"]
    assert run["remote"][0]["pid"] not in run["pids_after"]  # restarted: a new process
    assert run["same_after_kill"] and run["all_ok"]
