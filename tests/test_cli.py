"""python -m llama_cffi: demo, generate, tokenize and info, and clean user errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import llama_cffi
from tests.conftest import ROOT, run_isolated


def cli(*args: str) -> tuple[int, str, str]:
    r = run_isolated(f"import sys; from llama_cffi.__main__ import main; sys.exit(main({list(args)!r}))")
    return r.returncode, r.stdout, r.stderr


def test_demo_on_tiny_model(tiny_model_path: Path) -> None:
    """demo: greedy stream, 4 forks with perplexities, one pruned, a JSON-schema answer, tokens/s."""
    rc, out, err = cli("demo", "-m", str(tiny_model_path), "-n", "6", "hello world")
    assert rc == 0, err
    assert "hello world" in out and "tokens/s" in out
    rows = [ln for ln in out.splitlines() if ln.startswith("  [") and "perplexity" in ln]
    assert len(rows) == 4 and "pruned" in out and "3 forks and the root live" in out and "json " in out


@pytest.mark.default_model
def test_demo_on_default_model(default_model_path: Path) -> None:
    """The README's main job: demo on the default model; its JSON answer parses."""
    rc, out, err = cli("demo", "-n", "12")
    assert rc == 0, err
    assert "gemma3 270M" in out and "tokens/s" in out
    assert "valid JSON, keys ['language', 'year']" in out, out


def test_generate_greedy_streams_and_reports(tiny_model_path: Path, tiny_model: llama_cffi.Model) -> None:
    """generate --temp 0 prints the prompt and the greedy continuation; stats on stderr."""
    rc, out, err = cli("generate", "-m", str(tiny_model_path), "--temp", "0", "-n", "8", "the cat")
    assert rc == 0, err
    assert "tokens/s" in err and out.startswith("the cat")
    with tiny_model.context(n_ctx=128) as ctx:
        row = ctx.decode(tiny_model.tokenize("the cat"))
        toks = []
        for _ in range(8):
            t = int(np.asarray(row).argmax())
            if tiny_model.vocab.is_eog(t):
                break
            toks.append(t)
            row = ctx.decode_single(t)
    assert out.rstrip("\n") == "the cat" + tiny_model.vocab.detokenize(toks)


def test_generate_branches(tiny_model_path: Path) -> None:
    rc, out, err = cli("generate", "-m", str(tiny_model_path), "--branches", "3", "--seed", "1", "-n", "5", "a")
    assert rc == 0, err
    lines = [ln for ln in out.splitlines() if "perplexity" in ln]
    assert len(lines) == 3 and sum(ln.startswith("*") for ln in lines) == 1
    ppl = [float(ln.split("perplexity")[1].split()[0]) for ln in lines]
    best = next(p for p, ln in zip(ppl, lines, strict=True) if ln.startswith("*"))
    assert best == min(ppl)


@pytest.mark.default_model
def test_generate_json_schema(tmp_path: Path) -> None:
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}))
    rc, out, err = cli("generate", "--json-schema", str(schema), "--seed", "3", "-n", "40", "An object: ")
    assert rc == 0, err
    assert isinstance(json.loads(out[len("An object: ") :])["n"], int)


def test_tokenize(tiny_model_path: Path, tiny_model: llama_cffi.Model) -> None:
    rc, out, err = cli("tokenize", "-m", str(tiny_model_path), "--ids", "hello world")
    assert rc == 0, err
    assert json.loads(out) == tiny_model.tokenize("hello world").tolist()


def test_info_json(tiny_model_path: Path) -> None:
    """info prints build options, the CPU variant loaded and why, devices and model
    metadata as JSON."""
    rc, out, err = cli("info", "-m", str(tiny_model_path), "--vocab-only")
    assert rc == 0, err
    info = json.loads(out)
    assert info["build"]["options"]["GGML_AMX_TILE"] == "OFF"
    variant = info["build"]["cpu_variant"]
    assert variant["name"] == llama_cffi.backends.choice().cpu.name and variant["reason"]
    assert any(c["name"] == variant["name"] and c["allowed"] for c in variant["candidates"])
    assert info["model"]["metadata"]["general.architecture"] == "llama"
    assert any(d["name"] == "CPU" for d in info["devices"])


@pytest.mark.parametrize("path", ["/nonexistent.gguf", "/"])
def test_user_errors_are_one_line(path: str) -> None:
    """A bad model path exits 2 with one line on stderr, no traceback."""
    rc, _out, err = cli("demo", "-m", path)
    assert rc == 2
    assert err.startswith("llama-cffi: error:") and "Traceback" not in err and err.count("\n") == 1


def test_generate_user_errors_are_one_line(tiny_model_path: Path, tmp_path: Path) -> None:
    """Every user mistake of generate: one line on stderr, exit status 2, no traceback."""
    bad_gbnf = tmp_path / "bad.gbnf"
    bad_gbnf.write_text('root ::= "a" undefined-rule')
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    bad_schema = tmp_path / "schema.json"
    bad_schema.write_text(json.dumps({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}))
    m = ["-m", str(tiny_model_path)]
    cases = [
        [*m, "--grammar", str(tmp_path / "missing.gbnf"), "x"],
        [*m, "--grammar", str(bad_gbnf), "x"],
        [*m, "--json-schema", str(bad_json), "x"],
        [*m, "--json-schema", str(bad_schema), "x"],
        [*m, "--grammar", str(bad_gbnf), "--json-schema", str(bad_json), "x"],
        [*m, "--top-p", "1.5", "x"],
        [*m, "--mirostat", "3", "x"],
        [*m, "--samplers", "top_k;warp_drive", "x"],
        [*m, "--logit-bias", "15043", "x"],
        [*m, "--repeat-penalty", "0", "x"],
        [*m, "-n", "0", "x"],
        [*m, "--branches", "0", "x"],
        [*m, "--temp", "hot", "x"],
        ["-m", "/nonexistent.gguf", "x"],
        [*m],
    ]
    code = (
        "import contextlib, io, sys\n"
        "from llama_cffi.__main__ import main\n"
        f"for args in {cases!r}:\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err):\n"
        "        try:\n"
        "            rc = main(['generate', *args])\n"
        "        except SystemExit as e:\n"
        "            rc = e.code\n"
        "    print('RESULT', repr((rc, err.getvalue())))\n"
    )
    r = run_isolated(code)
    assert r.returncode == 0, r.stderr
    results = [eval(ln[7:]) for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(results) == len(cases)
    for args, (rc, err) in zip(cases, results, strict=True):
        assert rc == 2, (args, err)
        assert err.startswith("llama-cffi: error:") and err.count("\n") == 1 and "Traceback" not in err, (args, err)


def test_bench_passes_its_arguments_to_the_suite() -> None:
    """bench runs benchmarks/suite.py with the arguments as given (here only listing)."""
    rc, out, err = cli("bench", "--only", "generate", "--list")
    assert rc == 0, err
    from llama_cffi.bench import bench_root

    if (bench_root() / "setup.py").is_file():  # the source tree's suite names its scripts
        assert "bench_generate.py" in out and "bench_branches.py" not in out
    else:  # the copy an installed package carries names the command that runs each one
        assert "llama-cffi bench --only generate" in out and "--only branches" not in out, out


def test_bench_introduces_itself_as_llama_cffi_bench(tmp_path: Path) -> None:
    """``llama-cffi bench --help`` says ``usage: llama-cffi bench`` (not the suite's file
    name); the tree's ``python benchmarks/suite.py`` keeps its own name; and the copy an
    installed package carries (laid out as in ``llama_cffi/_bench``: no setup.py) names its
    benchmarks by the command that runs them, never by a path inside site-packages."""
    rc, out, err = cli("bench", "--help")
    assert rc == 0, err
    assert out.startswith("usage: llama-cffi bench "), out[:200]
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CFFI_BENCH_PROG"}
    tree = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "suite.py"), "--help"], capture_output=True, text=True, env=env
    )
    # the source tree's suite keeps its name; the tests' copy that tests/run_installed.py
    # runs against a wheel has no setup.py, so its suite is laid out as an installed one
    own = "usage: suite.py " if (ROOT / "setup.py").is_file() else "usage: llama-cffi bench "
    assert tree.returncode == 0 and tree.stdout.startswith(own), tree.stdout[:200] + tree.stderr
    copy = tmp_path / "_bench"
    shutil.copytree(ROOT / "benchmarks", copy / "benchmarks", ignore=shutil.ignore_patterns("results", "__pycache__"))
    shutil.copy2(ROOT / "build_ffi.py", copy / "build_ffi.py")
    suite = [sys.executable, str(copy / "benchmarks" / "suite.py")]
    helped = subprocess.run([*suite, "--help"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: llama-cffi bench "), helped.stdout[:200]
    for full in ([], ["--full"]):
        listed = subprocess.run([*suite, "--list", *full], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert listed.returncode == 0, listed.stderr
        assert str(copy) not in listed.stdout, listed.stdout
        line = next(x for x in listed.stdout.splitlines() if x.startswith("decode_overhead"))
        assert line.split(None, 1)[1] == " ".join(["llama-cffi bench --only decode_overhead", *full]), line
