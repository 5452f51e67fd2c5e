"""The lm-evaluation-harness backend (samplers.harness): its three request types against
the project's own scores and generation, and, where the ``lm-eval`` package is installed
(the ``[eval]`` extra), a local task run through lm-eval itself."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llama_cffi import ParamError
from samplers.harness import HarnessBackend, _rolling_windows
from samplers.logprobs import score, score_many
from samplers.many import Request, generate_many

ROOT = Path(__file__).resolve().parent.parent
HAVE_LM_EVAL = importlib.util.find_spec("lm_eval") is not None
#: the [eval] extra (in the test extra): without it the lm-eval test skips, which fails a
#: CI=true run
needs_lm_eval = pytest.mark.skipif(not HAVE_LM_EVAL, reason="lm-eval is not installed (pip install '.[eval]')")


@pytest.fixture(scope="module")
def backend(default_model_path: Path) -> Iterator[HarnessBackend]:
    b = HarnessBackend(str(default_model_path), n_ctx=64, n_parallel=4)
    yield b
    b.close()


def req(*args: object) -> SimpleNamespace:
    return SimpleNamespace(args=args)


def test_loglikelihood_is_score_many_of_the_split_pairs(backend: HarnessBackend) -> None:
    """lm-eval's split (the whole text's tokens after the context's; trailing spaces move
    to the continuation; an empty context is BOS) and score_many's values, greedy flags
    included; a context longer than n_ctx is cut on the left."""
    vocab = backend.model.vocab
    reqs = [
        ("The capital of France is", " Paris"),
        ("The capital of France is ", "Paris"),  # the space moves to the continuation
        ("", "Hello world"),
        ("word " * 100, " end"),  # cut to n_ctx on the left
    ]
    got = backend.loglikelihood([req(*r) for r in reqs])
    whole = [int(t) for t in vocab.tokenize("The capital of France is Paris")]
    ctx_enc = [int(t) for t in vocab.tokenize("The capital of France is")]
    assert whole[: len(ctx_enc)] == ctx_enc
    pairs = [
        (ctx_enc, whole[len(ctx_enc) :]),
        (ctx_enc, whole[len(ctx_enc) :]),
        ([backend.prefix_token_id], [int(t) for t in vocab.tokenize("Hello world", add_special=False)]),
    ]
    long_ctx, long_cont = backend._encode_pair(*reqs[3])
    cut = (long_ctx + long_cont)[-(backend.max_length + 1) :]
    pairs.append((cut[: len(cut) - len(long_cont)], long_cont))
    ref = score_many(backend.store, pairs)
    assert got == [(s.total, s.greedy) for s in ref]
    assert got[0] == got[1]
    assert all(lp < 0 for lp, _ in got)


def test_rolling_loglikelihood_covers_every_token_once(backend: HarnessBackend) -> None:
    """A text longer than n_ctx: its windows predict each token once (the first from
    BOS), and the sum is the windows' scores."""
    text = "The river rises in the hills north of the town and runs south through farmland. " * 4
    toks = [int(t) for t in backend.model.vocab.tokenize(text, add_special=False)]
    assert len(toks) > backend.max_length
    windows = _rolling_windows(toks, backend.prefix_token_id, backend.max_length)
    assert [t for _, c in windows for t in c] == toks
    assert all(len(a) + len(b) - 1 <= backend.max_length for a, b in windows)
    (got,) = backend.loglikelihood_rolling([req(text)])
    with backend.model.context(n_ctx=256) as ctx:
        ref = sum(score(ctx, a, b).total for a, b in windows)
    # score() decodes each window alone: other batch shapes than score_many's (rounding)
    assert got == pytest.approx(ref, rel=2e-3)


@given(n=st.integers(0, 60), max_len=st.integers(1, 20))
def test_rolling_windows_are_lm_evals(n: int, max_len: int) -> None:
    toks = list(range(100, 100 + n))
    windows = _rolling_windows(toks, 1, max_len)
    if HAVE_LM_EVAL:
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        assert windows == [make_disjoint_window(w) for w in get_rolling_token_windows(toks, 1, max_len, 1)]
    assert [t for _, c in windows for t in c] == toks  # every token predicted once
    for a, b in windows:
        assert a and b and len(a) + len(b) - 1 <= max_len


def test_generate_until_is_generate_many(backend: HarnessBackend) -> None:
    reqs = [
        ("Count: 1, 2, 3,", {"until": [","], "max_gen_toks": 8}),
        ("Once upon a time", {"until": "\n", "max_gen_toks": 6, "do_sample": False}),
    ]
    got = backend.generate_until([req(*r) for r in reqs])
    ref = generate_many(
        backend.store, [Request(reqs[0][0], max_tokens=8, stop=[","]), Request(reqs[1][0], max_tokens=6, stop=["\n"])]
    )
    assert got == [r.text for r in ref]
    assert "," not in got[0] and "\n" not in got[1]


def test_bad_requests_are_refused(backend: HarnessBackend) -> None:
    with pytest.raises(ParamError, match="arguments"):
        backend.loglikelihood([req("only one")])
    with pytest.raises(ParamError, match="no tokens"):
        backend.loglikelihood([req("context", "")])
    with pytest.raises(ParamError, match="n_parallel"):
        HarnessBackend(n_parallel=0)


TASK = """task: llama_cffi_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""

DOCS = [
    {"question": "The capital of France is", "choices": ["Paris", "banana", "seven"], "answer": 0},
    {"question": "Two plus two equals", "choices": ["purple", "four", "Tuesday"], "answer": 1},
    {"question": "The colour of the clear sky is", "choices": ["loud", "heavy", "blue"], "answer": 2},
    {"question": "Water freezes at zero degrees", "choices": ["Celsius", "miles", "apples"], "answer": 0},
]


def _lm_eval_script() -> list[str]:
    """lm-eval's own ``lm_eval`` command of this environment (the console script beside
    the interpreter, as a user types it; ``python -m lm_eval`` where there is none)."""
    script = Path(sys.executable).parent / "lm_eval"
    return [str(script)] if script.exists() else [sys.executable, "-m", "lm_eval"]


@needs_lm_eval
@pytest.mark.slow
@pytest.mark.default_model
@pytest.mark.parametrize("command", ["lm_eval", "llama-cffi lm-eval"])
def test_a_local_task_through_lm_eval(default_model_path: Path, tmp_path: Path, command: str) -> None:
    """``lm_eval --model llama-cffi`` (lm-eval's own command: the installed start-up hook
    registers the model) and ``llama-cffi lm-eval --model llama-cffi`` on a task written
    here (YAML and JSON, no network): the accuracy is the one the project's own scores
    give."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "local.yaml").write_text(TASK.format(data=data))
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    argv = _lm_eval_script() if command == "lm_eval" else [sys.executable, "-m", "llama_cffi", "lm-eval"]
    r = subprocess.run(
        [*argv, "--model", "llama-cffi",
         "--model_args", f"model={default_model_path},n_ctx=128,n_parallel=4",
         "--tasks", "llama_cffi_local", "--include_path", str(tasks), "--output_path", str(out)],
        capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    results = json.loads(next(out.rglob("results_*.json")).read_text())
    acc = results["results"]["llama_cffi_local"]["acc,none"]
    # the same documents scored by the project: lm-eval's " " + choice after the question
    b = HarnessBackend(str(default_model_path), n_ctx=128, n_parallel=4)
    try:
        right = 0
        for d in DOCS:
            lls = b.loglikelihood([req(d["question"], " " + c) for c in d["choices"]])
            right += max(range(len(lls)), key=lambda i: lls[i][0]) == d["answer"]
    finally:
        b.close()
    assert acc == pytest.approx(right / len(DOCS))


def _site_pth() -> list[Path]:
    import site

    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return [Path(d) / "llama_cffi-lm-eval.pth" for d in dirs if (Path(d) / "llama_cffi-lm-eval.pth").exists()]


@needs_lm_eval
def test_the_start_up_hook_registers_lazily() -> None:
    """The installed ``llama_cffi-lm-eval.pth`` (setup.py writes it, editable installs
    included) puts ``llama-cffi`` into lm-eval's registry when lm-eval loads its models,
    as a placeholder: llama_cffi itself is not imported until lm-eval asks for the model;
    lm-eval's own models stay registered. ``LLAMA_CFFI_LM_EVAL_HOOK=0`` turns it off, and
    an interpreter without lm-eval is not touched beyond one meta path finder."""
    assert _site_pth(), "llama_cffi-lm-eval.pth is not installed: reinstall the package (pip install -e .)"
    code = (
        "import sys\n"
        "from lm_eval.api.registry import get_model, model_registry\n"
        "get_model('hf') if 'hf' in model_registry else None\n"
        "import lm_eval.models\n"
        "print('llama-cffi' in model_registry, 'hf' in model_registry, 'llama_cffi' in sys.modules)\n"
        "cls = get_model('llama-cffi')\n"
        "print(cls.__name__, 'llama_cffi' in sys.modules, [c.__name__ for c in cls.__mro__[1:3]])\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:2] == ["True True False", "LlamaCffiLM True ['HarnessBackend', 'LM']"]
    off = dict(env, LLAMA_CFFI_LM_EVAL_HOOK="0")
    r = subprocess.run(
        [sys.executable, "-c", "import lm_eval.models\nfrom lm_eval.api.registry import model_registry\n"
         "print('llama-cffi' in model_registry)"],
        capture_output=True, text=True, env=off, timeout=300,
    )  # fmt: skip
    assert (r.returncode, r.stdout.strip()) == (0, "False"), r.stderr[-3000:]


def test_the_hook_file_is_the_modules_code(tmp_path: Path) -> None:
    """The .pth line imports the hook module, a copy of samplers/_lm_eval_hook.py at the top
    of site-packages (setup.py writes both; an installed wheel carries them). Importing it
    installs one finder, running it again none more; the finder answers for
    ``lm_eval.models`` only."""
    import importlib
    import importlib.util as iu

    if (ROOT / "setup.py").is_file():  # the source tree: what setup.py writes now
        spec = iu.spec_from_file_location("_llama_cffi_setup", ROOT / "setup.py")  # setup() runs only as __main__
        assert spec is not None and spec.loader is not None
        setup_py = iu.module_from_spec(spec)
        spec.loader.exec_module(setup_py)
        pth = setup_py.write_hook(tmp_path)
        module = tmp_path / "_llama_cffi_lm_eval.py"
        assert module.read_text() == (ROOT / "samplers" / "_lm_eval_hook.py").read_text()
        where = str(tmp_path)
    else:  # tests run against an installed wheel: what it installed
        installed = _site_pth()
        assert installed, "llama_cffi-lm-eval.pth is not installed"
        pth = installed[0]
        where = str(pth.parent)
    line = pth.read_text()
    assert line == "import _llama_cffi_lm_eval\n"
    saved = list(sys.meta_path)  # the installed hook's finder (this interpreter ran it) set aside
    saved_mod = sys.modules.pop("_llama_cffi_lm_eval", None)
    before = [f for f in saved if getattr(f, "__name__", "") != "LlamaCffiLmEvalFinder"]
    sys.meta_path[:] = before
    sys.path.insert(0, where)
    try:
        exec(line, {})  # what site.py does with the line
        hook = importlib.import_module("_llama_cffi_lm_eval")
        assert hook.__file__ is not None and Path(hook.__file__).parent == Path(where)
        hook._install()  # a second run adds nothing
        added = [f for f in sys.meta_path if f not in before]
        assert [getattr(f, "__name__", "") for f in added] == ["LlamaCffiLmEvalFinder"]
        assert added[0].find_spec("json") is None
    finally:
        sys.meta_path[:] = saved
        sys.path.remove(where)
        sys.modules.pop("_llama_cffi_lm_eval", None)
        if saved_mod is not None:
            sys.modules["_llama_cffi_lm_eval"] = saved_mod
