"""benchmarks/bench_peer.py (ours vs native vs the peer llama-cpp-python) and its place in the
suite: the child scripts parse, a missing peer is skipped and recorded (never silently), the
report gets a table of the three sides; and, where the peer is installed, one tiny run of
every workload."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import bench_peer, suite
from benchmarks.common import peer_install_command, peer_pinned_version, peer_skip_reason

ROOT = Path(__file__).resolve().parent.parent


def test_the_children_are_python() -> None:
    compile(bench_peer.OURS, "<ours>", "exec")
    compile(bench_peer.PEER_CHILD, "<peer>", "exec")


def test_the_peer_is_the_release_that_vendors_the_pinned_commit() -> None:
    from llama_cffi._version import LLAMA_CPP_SDIST

    assert LLAMA_CPP_SDIST["name"] == f"llama_cpp_python-{peer_pinned_version()}.tar.gz"
    assert peer_install_command() == (
        f'CMAKE_ARGS="-DLLAMA_BUILD=OFF" pip install "llama-cpp-python=={peer_pinned_version()}"'
    )


def test_peer_skip_reason_follows_the_installed_distribution() -> None:
    try:
        version: str | None = importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        version = None
    reason = peer_skip_reason()
    if version is None:
        assert reason == "not installed"
    elif version == peer_pinned_version():
        assert reason is None
    else:
        assert reason is not None and version in reason


def _without_peer(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if llama-cpp-python were not installed (its distribution not found)."""
    real = importlib.metadata.version

    def version(name: str) -> str:
        if name.lower().replace("-", "_") == "llama_cpp_python":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)


def _report(payload: dict[str, Any], comparisons: list[dict[str, Any]], notes: list[str]) -> dict[str, Any]:
    """The smallest report suite.markdown renders."""
    env = {
        "build_info": {"options": {}},
        "cpu_model": "cpu",
        "cores": 2,
        "mem_total_kib": 1,
        "platform": "linux",
        "hostname": "h",
        "llama_cffi": "0",
        "git_commit": "0" * 40,
        "git_dirty_files": 0,
        "llama_cpp_commit": "0" * 40,
        "python": "3",
        "numpy": "2",
        "model": "m.gguf",
    }
    run = {"name": "peer", "ok": True, "status": "ok", "wall_s": 1.0, "foreign_cores": 0.0, "command": "c"}
    return {
        "date": "d",
        "machine": "m",
        "environment": env,
        "load_average": {"start": [0.0], "end": [0.0]},
        "mode": "quick",
        "command": "python benchmarks/suite.py",
        "wall_s": 1.0,
        "runs": [run],
        "comparisons": comparisons,
        "notes": notes,
        "results": {"peer": payload},
    }


def test_a_missing_peer_is_skipped_printed_and_recorded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _without_peer(monkeypatch)
    out = tmp_path / "peer.json"
    assert bench_peer.main(["--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "peer llama-cpp-python not installed: skipped" in printed
    assert peer_install_command() in printed
    payload = json.loads(out.read_text())
    assert payload["peer_skipped"] == "not installed" and payload["workloads"] == {}
    step = next(s for s in suite.STEPS if s.name == "peer")
    assert suite.comparisons_peer(step, False, payload) == []
    note = suite.peer_note(payload)
    assert note is not None and note.startswith("peer llama-cpp-python not installed: skipped")
    md = suite.markdown(_report(payload, [], [note]))
    assert "Peer llama-cpp-python not installed: skipped" in md and f"- {note}" in md


def _payload() -> dict[str, Any]:
    """What bench_peer.py writes when the peer ran (made-up numbers)."""
    rows = {}
    for i, w in enumerate(["greedy", "sampled", "grammar", "parallel4", "parallel8"]):
        nat, ours, peer = 50.0 + i, 45.0 + i, 40.0 + i
        rows[w] = {
            "native_tps": nat,
            "ours_tps": ours,
            "peer_tps": peer,
            "ours_over_native": ours / nat,
            "ours_over_peer": ours / peer,
            "peer_over_native": peer / nat,
            "paired": {"ours_over_native": 0.9, "ours_over_peer": 1.1, "peer_over_native": 0.8},
            "samples_tps": {"native": [nat], "ours": [ours], "peer": [peer]},
            "tokens": {"native": [[32]], "ours": [[32]], "peer": [[32]]},
        }
    return {
        "config": {"tokens": 32, "tg": 16},
        "peer_name": "llama-cpp-python",
        "peer_version": "0.3.36",
        "peer_install": peer_install_command(),
        "peer_skipped": None,
        "workloads": rows,
    }


def test_the_report_has_a_row_per_workload_with_the_three_sides() -> None:
    payload = _payload()
    step = next(s for s in suite.STEPS if s.name == "peer")
    comps = suite.comparisons_peer(step, False, payload)
    assert [c["workload"] for c in comps] == list(payload["workloads"])
    greedy = comps[0]
    assert (greedy["ours"], greedy["native"], greedy["peer"]) == (45.0, 50.0, 40.0)
    assert greedy["ratio"] == pytest.approx(0.9) and greedy["ours_over_peer"] == pytest.approx(45 / 40)
    assert greedy["peer_over_native"] == pytest.approx(0.8) and greedy["peer_label"] == "llama-cpp-python 0.3.36"
    assert suite.peer_note(payload) is None
    md = suite.markdown(_report(payload, comps, []))
    section = md.split("## Ours vs native vs peer llama-cpp-python 0.3.36")[1].split("## Runs")[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and "Workload" not in ln]
    assert len(rows) == 5
    assert "| 45.00 | 50.00 | 40.00 | 0.900 (0.900) | 1.125 (1.100) | 0.800 (0.800) |" in rows[0]
    assert "4 parallel sequences x 16 steps" in rows[3] and "8 parallel sequences" in rows[4]
    main_table = md.split("## Ours vs native vs peer")[0]
    assert "parallel sequences" not in main_table  # once, in the peer table
    units = {m["key"]: m["unit"] for m in suite.measurements("peer", payload)}
    assert units["workloads.greedy.peer_tps"] == "tokens/s"
    assert units["workloads.greedy.ours_over_peer"] == "ratio"
    assert units["workloads.greedy.samples_tps.peer[0]"] == "tokens/s"


@pytest.mark.slow
@pytest.mark.default_model
@pytest.mark.skipif(peer_skip_reason() is not None, reason=f"peer llama-cpp-python: {peer_skip_reason()}")
def test_every_workload_runs_on_the_three_sides(default_model_path: Path, tmp_path: Path) -> None:
    """A tiny run (builds the shared libllama the first time): every side measures every
    workload; the peer runs on native's library and chains, so it writes the same tokens."""
    out = tmp_path / "peer.json"
    args = ["--rounds", "1", "--reps", "1", "--tokens", "6", "--tg", "2", "--ns", "2", "--quiet-wait", "0"]
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_peer.py"), *args, "--retries", "0", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-2000:]
    d = json.loads(out.read_text())
    assert d["peer_skipped"] is None and d["peer_version"] == peer_pinned_version()
    assert list(d["workloads"]) == ["greedy", "sampled", "grammar", "parallel2"]
    for w, row in d["workloads"].items():
        assert all(row[f"{s}_tps"] > 0 for s in ("native", "ours", "peer")), w
        if w != "grammar":
            assert row["tokens"] == {s: [[6 if w != "parallel2" else 4]] for s in ("native", "ours", "peer")}, w
        if "same_tokens_as_native" in row:
            assert row["same_tokens_as_native"]["peer"], w
