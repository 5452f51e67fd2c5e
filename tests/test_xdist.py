"""The pytest plugin under pytest-xdist, as a user runs it: a user's suite (plain tests,
hypothesis properties, every fixture of the plugin, the default model) run serially, on
``-n 2`` workers, and on two ``--tx popen`` gateways (the mechanism of ``--tx ssh=HOST``,
without the network) gives the same outcomes and the same computed values; each worker
writes its tiny models into its own temporary directory.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from llama_cffi.default_model import cache_dir

pytest.importorskip("xdist")  # the test extra installs it: a skip fails the run under CI=true
pytest_plugins = ["pytester"]

CACHE = cache_dir()  # at import, before pytester points HOME elsewhere

USER_SUITE = '''
import hashlib, json, os
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from llama_cffi.testing import token_sequences


def record(request, value, where=""):
    """Append (test id, worker, value, where) to the file the driver names: one line per test."""
    line = json.dumps({"id": request.node.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                       "value": value, "where": where})
    with open(os.environ["RESULTS_FILE"], "a") as fh:
        fh.write(line + "\\n")


def greedy(model, prompt, n=6):
    with model.context(n_ctx=256, n_seq_max=1) as ctx:
        toks = list(model.tokenize(prompt))
        out = []
        row = ctx.decode(toks)
        for i in range(n):
            t = int(np.argmax(row))
            out.append(t)
            row = ctx.decode([t], pos=len(toks) + i)
        return out


@pytest.mark.parametrize("i", range(6))
def test_greedy(request, tiny_model, tiny_model_path, i):
    record(request, greedy(tiny_model, f"prompt {i}"), str(tiny_model_path.parent.parent))


@pytest.mark.parametrize("kind", ["mamba", "swa", "llama-q4_0"])
def test_kinds(request, tiny_model_of, kind):
    from llama_cffi import Model
    with Model.load(tiny_model_of(kind)) as m:
        record(request, greedy(m, "hello", 4))


@settings(max_examples=15, deadline=None, derandomize=True)
@given(data=st.data())
def test_property(request, tiny_model, data):
    tokens = data.draw(token_sequences(tiny_model, min_size=1, max_size=8))
    with tiny_model.context(n_ctx=64) as ctx:
        row = np.asarray(ctx.decode(tokens))
        assert np.isfinite(row).all()
    with open(os.environ["RESULTS_FILE"] + ".property", "a") as fh:
        fh.write(json.dumps([list(map(int, tokens)), int(row.argmax())]) + "\\n")


def test_context(request, tiny_context, tiny_model):
    row = np.asarray(tiny_context.decode(tiny_model.tokenize("hello world")))
    record(request, hashlib.sha256(row.tobytes()).hexdigest())


def test_default_model(request, default_model):
    record(request, greedy(default_model, "The capital of France is", 4))
'''


def run_suite(
    pytester: pytest.Pytester, tmp_path: Path, name: str, *args: str
) -> tuple[Any, dict[str, Any], set[str], set[str]]:
    results = tmp_path / f"{name}.jsonl"
    pytester.makepyfile(test_user=textwrap.dedent(USER_SUITE))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RESULTS_FILE", str(results))
        mp.setenv("LLAMA_CFFI_CACHE_DIR", str(CACHE))  # pytester moves HOME: keep the assembled model
        for var in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
            mp.delenv(var, raising=False)  # this suite may itself run under xdist
        res = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "xdist", *args, timeout=600)
    lines = [json.loads(x) for x in results.read_text().splitlines()]
    prop = sorted((tmp_path / f"{name}.jsonl.property").read_text().splitlines())
    values = {x["id"]: x["value"] for x in lines}
    values["property examples"] = prop
    return res, values, {x["worker"] for x in lines}, {x["where"] for x in lines if x["where"]}


@pytest.mark.slow
def test_user_suite_under_xdist(pytester: pytest.Pytester, tmp_path: Path) -> None:
    serial, v_serial, w_serial, _ = run_suite(pytester, tmp_path, "serial")
    serial.assert_outcomes(passed=12)
    assert w_serial == {"main"}
    assert len(v_serial["property examples"]) >= 15  # every example ran, in one process

    par, v_par, w_par, dirs = run_suite(pytester, tmp_path, "n2", "-n", "2")
    par.assert_outcomes(passed=12)
    assert w_par == {"gw0", "gw1"}  # both workers ran tests
    assert v_par == v_serial  # the same values, whichever worker computed them
    # each worker wrote its own tiny model, in its own temporary directory
    assert len(dirs) == 2 and all(Path(d).name in ("popen-gw0", "popen-gw1") for d in dirs), dirs

    # two gateways as remote hosts are addressed (--tx ssh=HOST//python=...), here local
    py = sys.executable
    tx, v_tx, w_tx, _ = run_suite(pytester, tmp_path, "tx", "--dist", "load", "--tx", f"2*popen//python={py}")
    tx.assert_outcomes(passed=12)
    assert w_tx == {"gw0", "gw1"}
    assert v_tx == v_serial
