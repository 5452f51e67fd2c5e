"""Every public function and method of llama_cffi and samplers, called with an argument of
the wrong type for its first parameter, raises ``TypeError`` or ``ParamError`` with a
message that names the parameter: never ``AttributeError``, ``KeyError``, something else
or a crash (issue 36: ``samplers.search.generate(ctx, "prompt")`` with a Context ended in
``AttributeError: 'Context' object has no attribute 'ctx'``).

What counts as public, and what is left out and why, is in ``tests/wrong_types_child.py``;
the calls run there, in spawned children (a call that crashes the process fails its case
and the next child goes on with the rest). A new public callable is a new case: a class
whose methods have no factory there fails its cases, and so does a callable with more
required parameters than the table of valid values gives.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.wrong_types_child import ANY_VALUE, Case, ParamCase, all_callables, all_param_cases

CASES, LEFT_OUT = all_callables()
PARAM_CASES = all_param_cases()

#: The audit's size when it was written (issue 36): a test that finds far fewer is broken.
MIN_CASES = 400


def _run_children(cases: list[Case] | list[ParamCase], folder: Path, mode: str = "first") -> dict[str, dict[str, Any]]:
    """Run the cases in spawned children; a child that dies is replaced, after the case it
    was running is marked as a crash."""
    results: dict[str, dict[str, Any]] = {}
    todo = [c.id for c in cases]
    env = dict(os.environ, GGML_NO_BACKTRACE="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["LLAMA_CFFI_LOG"] = "none"
    while todo:
        r = subprocess.run(
            [sys.executable, "-m", "tests.wrong_types_child", json.dumps(todo), str(folder), mode],
            capture_output=True,
            text=True,
            timeout=900,
            cwd=ROOT,
            env=env,
        )
        running = None
        for line in r.stdout.splitlines():
            if line.startswith("CASE "):
                running = line[5:]
            elif line.startswith("RESULT "):
                out = json.loads(line[7:])
                results[out["id"]] = out
                running = None
        if running is not None:
            results[running] = {"id": running, "crash": f"exit status {r.returncode}: {r.stderr[-1500:]}"}
        done = set(results)
        left = [i for i in todo if i not in done]
        if len(left) == len(todo):  # the child did nothing: report, do not loop
            for i in left:
                results[i] = {"id": i, "crash": f"the child did not start: {r.stderr[-3000:]}"}
            break
        todo = left
    return results


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return _run_children(CASES, tmp_path_factory.mktemp("wrong_types"))


@pytest.fixture(scope="module")
def param_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return _run_children(PARAM_CASES, tmp_path_factory.mktemp("wrong_types_params"), "params")


def _check(case: Case | ParamCase, r: dict[str, Any]) -> None:
    assert "crash" not in r, f"{case.id}({case.param}=<WrongType>) crashed the process: {r['crash']}"
    assert "setup" not in r, f"{case.id}: the test could not make what it needs: {r['setup']}"
    raised = r["raised"]
    assert raised is not None, f"{case.id}({case.param}=<WrongType>) raised nothing"
    kind = raised[0]
    assert "TypeError" in raised or "ParamError" in raised, (
        f"{case.id}({case.param}=<WrongType>) raised {kind}: {r['message']!r}; want TypeError or ParamError"
    )
    assert re.search(rf"\b{re.escape(case.param)}\b", r["message"]), (
        f"{case.id}({case.param}=<WrongType>) raised {kind}({r['message']!r}), which does not name {case.param!r}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_wrong_type_is_a_typed_error_naming_the_parameter(case: Case, results: dict[str, dict[str, Any]]) -> None:
    _check(case, results[case.id])


@pytest.mark.slow
@pytest.mark.parametrize("case", PARAM_CASES, ids=[c.id for c in PARAM_CASES])
def test_every_parameter_of_every_callable(case: ParamCase, param_results: dict[str, dict[str, Any]]) -> None:
    """Each parameter after the first, with valid values for the others (issue 44): the
    same rule as the first parameter's."""
    _check(case, param_results[case.id])


def test_the_audit_covers_every_public_callable() -> None:
    """The audit finds the public API (issue 36 counted 423 callables with a parameter),
    and every callable it leaves out has a reason."""
    assert len(CASES) >= MIN_CASES, len(CASES)
    ids = {c.id for c in CASES}
    for must in ("samplers.search.generate", "llama_cffi.context.Context.decode", "samplers.branch.BranchStore.create"):
        assert must in ids
    assert all(reason for reason in LEFT_OUT.values())
    assert not ids & set(LEFT_OUT)
    print(f"\n{len(CASES)} public callables with a first parameter audited; {len(LEFT_OUT)} left out:")
    by_reason: dict[str, int] = {}
    for reason in LEFT_OUT.values():
        by_reason[reason] = by_reason.get(reason, 0) + 1
    for reason, n in sorted(by_reason.items(), key=lambda kv: -kv[1]):
        print(f"  {n:4d}  {reason}")
    assert len(PARAM_CASES) >= 900, len(PARAM_CASES)
    assert all(reason for reason in ANY_VALUE.values())
    print(
        f"{len(CASES) + len(PARAM_CASES)} (callable, parameter) pairs audited: {len(CASES)} first parameters and "
        f"{len(PARAM_CASES)} others; {len(ANY_VALUE)} parameters take any value:"
    )
    for pair, reason in sorted(ANY_VALUE.items()):
        print(f"  {pair}: {reason}")


def test_generate_with_a_context_says_to_make_a_store(tiny_model: Any) -> None:
    """Issue 36's first try: ``generate(ctx, "prompt")`` with a Context (the first argument
    is a BranchStore) is a TypeError naming ``store`` and saying how to make one, not an
    AttributeError from deep inside; with the store made as it says, it generates."""
    from llama_cffi import ParamError
    from samplers.branch import BranchStore
    from samplers.search import complete, generate

    with tiny_model.context(n_ctx=128) as ctx:
        for call in (generate, complete):
            with pytest.raises(
                TypeError, match=r"store must be a samplers\.branch\.BranchStore.*BranchStore\(ctx\)"
            ) as e:
                call(ctx, "Hello", 4)
            assert isinstance(e.value, ParamError)
        assert isinstance(generate(BranchStore(ctx), "Hello", 4), str)
