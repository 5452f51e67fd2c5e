"""samplers.perplexity: corpus perplexity as llama.cpp's llama-perplexity computes it.

* On the tiny model, against an independent computation: every chunk decoded on its own
  in a fresh context through ``Context.decode``, log-softmax in float64 numpy.
* On the default model, against llama.cpp's own ``llama-perplexity`` built from the same
  source with the same options (``benchmarks.native_tools.build_llama_tool``; the first
  build takes minutes, then it is cached).
* The command line (``python -m llama_cffi perplexity``, a plugin command, and
  ``python -m samplers.perplexity``), its user errors, and the plugin hook itself.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

import llama_cffi
from benchmarks.native_tools import build_llama_tool, llama_cpp_source_dir
from samplers.perplexity import NotEnoughTokensError, PerplexityError, PerplexityResult, perplexity, plan
from tests.conftest import ROOT, run_isolated

FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
RUNNING = re.compile(r"\[(\d+)\]([0-9.]+),")


def corpus() -> str:
    """Real English prose with code: llama.cpp's README from the pinned source tree."""
    return (llama_cpp_source_dir() / "README.md").read_text(encoding="utf-8")


# ---------------------------------------------------------------------- independent reference
def reference(
    model: llama_cffi.Model, tokens: npt.NDArray[np.int32], n_ctx: int, n_batch: int, n_chunks: int
) -> tuple[float, float, list[float]]:
    """The definition, written plainly: chunk c is tokens[c*n_ctx:(c+1)*n_ctx] with BOS first,
    decoded alone from an empty context; the second half of each chunk is scored with a
    float64 log-softmax; returns (ppl, stderr, running estimates)."""
    first = n_ctx // 2
    scores: list[float] = []
    running: list[float] = []
    for c in range(n_chunks):
        chunk = tokens[c * n_ctx : (c + 1) * n_ctx].copy()
        chunk[0] = model.vocab.bos
        with llama_cffi.Context(model, n_ctx=n_ctx, n_batch=min(n_batch, n_ctx)) as ctx:
            logits = np.array(ctx.decode(chunk, logits="all"), dtype=np.float64)
        for p in range(first, n_ctx - 1):
            row = logits[p]
            m = row.max()
            log_z = m + math.log(float(np.exp(row - m).sum()))
            scores.append(log_z - row[chunk[p + 1]])
        running.append(math.exp(sum(scores) / len(scores)))
    v = np.array(scores)
    mean, var = v.mean(), (v * v).mean() - v.mean() ** 2
    return math.exp(mean), math.exp(mean) * math.sqrt(var / (len(v) - 1)), running


@pytest.fixture(scope="module")
def tiny_tokens(tiny_model: llama_cffi.Model) -> npt.NDArray[np.int32]:
    return tiny_model.tokenize(corpus())


# (n_ctx, n_batch, n_chunks): several chunks per decode (with a last, partial group),
# several decodes per chunk (even and ragged), one chunk per decode. n_batch stays within
# one ubatch (512) so the reference's decodes see the same arithmetic.
LAYOUTS = [(64, 256, 7), (64, 32, 3), (65, 20, 3), (64, 64, 4), (40, 120, 5)]


@pytest.mark.parametrize(("n_ctx", "n_batch", "n_chunks"), LAYOUTS)
def test_matches_independent_computation(
    tiny_model: llama_cffi.Model, tiny_tokens: npt.NDArray[np.int32], n_ctx: int, n_batch: int, n_chunks: int
) -> None:
    res = perplexity(tiny_model, corpus(), n_ctx=n_ctx, n_batch=n_batch, n_chunks=n_chunks, n_threads=2)
    ppl, err, running = reference(tiny_model, tiny_tokens, n_ctx, n_batch, n_chunks)
    p = plan(n_ctx, n_batch)
    assert (res.n_ctx, res.n_batch, res.n_seq) == (n_ctx, p.n_batch, p.n_seq)
    assert res.n_chunks == n_chunks and res.count == n_chunks * (n_ctx - n_ctx // 2 - 1)
    assert res.n_tokens == len(tiny_tokens)
    assert res.ppl == pytest.approx(ppl, rel=1e-6)
    assert res.stderr == pytest.approx(err, rel=1e-6)
    assert res.chunk_ppl == pytest.approx(running, rel=1e-6)
    assert res.chunk_ppl[-1] == res.ppl and res.nll == pytest.approx(math.log(res.ppl), rel=1e-12)
    assert str(res) == f"Final estimate: PPL = {res.ppl:.4f} +/- {res.stderr:.5f}"


def test_plan_is_llama_perplexity_layout() -> None:
    """n_seq = max(1, n_batch / n_ctx); context n_seq * n_ctx; n_batch capped by it."""
    assert plan(512, 2048) == plan(512, 2048)
    p = plan(512, 2048)
    assert (p.n_seq, p.ctx_size, p.n_batch, p.num_batches) == (4, 2048, 2048, 1)
    p = plan(128, 300)
    assert (p.n_seq, p.ctx_size, p.n_batch, p.num_batches) == (2, 256, 256, 1)
    p = plan(128, 50)
    assert (p.n_seq, p.ctx_size, p.n_batch, p.num_batches) == (1, 128, 50, 3)


def test_inputs_and_context(tiny_model: llama_cffi.Model, tiny_tokens: npt.NDArray[np.int32]) -> None:
    """Text, bytes and tokens give the same result; so does a prepared Context (whose
    thread counts are restored); a context too small for the layout is refused."""
    a = perplexity(tiny_model, corpus(), n_ctx=64, n_batch=128, n_chunks=4)
    b = perplexity(tiny_model, corpus().encode(), n_ctx=64, n_batch=128, n_chunks=4)
    c = perplexity(tiny_model, tiny_tokens.tolist(), n_ctx=64, n_batch=128, n_chunks=4)
    assert a == b == c
    with llama_cffi.Context(tiny_model, n_ctx=128, n_batch=128, n_seq_max=2, n_threads=1, n_threads_batch=1) as ctx:
        d = perplexity(ctx, tiny_tokens, n_ctx=64, n_batch=128, n_chunks=4, n_threads=2)
        assert ctx.n_threads == 1 and ctx.n_threads_batch == 1
        assert d.ppl == pytest.approx(a.ppl, rel=1e-9) and d.chunk_ppl == pytest.approx(a.chunk_ppl, rel=1e-9)
        with pytest.raises(PerplexityError, match="n_seq_max=2 < 4"):
            perplexity(ctx, tiny_tokens, n_ctx=64, n_batch=256)
        with pytest.raises(PerplexityError, match="n_ctx_seq"):
            perplexity(ctx, tiny_tokens, n_ctx=300, n_batch=300)
    with llama_cffi.Context(tiny_model, n_ctx=64, n_batch=32) as ctx:
        with pytest.raises(PerplexityError, match="n_batch=32 < 64"):
            perplexity(ctx, tiny_tokens, n_ctx=64, n_batch=64)


def test_chunks_and_progress(tiny_model: llama_cffi.Model, tiny_tokens: npt.NDArray[np.int32]) -> None:
    """n_chunks caps the chunks (negative: all of them); progress sees every running value."""
    seen: list[tuple[int, int, float]] = []
    every = perplexity(tiny_model, tiny_tokens, n_ctx=256, n_batch=512, n_chunks=-1)
    assert every.n_chunks == len(tiny_tokens) // 256
    some = perplexity(tiny_model, tiny_tokens, n_ctx=256, n_batch=512, n_chunks=4, progress=lambda *a: seen.append(a))
    assert some.n_chunks == 4 and seen == [(i + 1, 4, v) for i, v in enumerate(some.chunk_ppl)]
    # the running estimate does not depend on what follows (same two-chunk groups: same decodes)
    assert some.chunk_ppl == every.chunk_ppl[:4]

    def stop(done: int, total: int, ppl: float) -> None:
        raise KeyboardInterrupt

    with llama_cffi.Context(tiny_model, n_ctx=64, n_batch=64) as ctx:
        with pytest.raises(KeyboardInterrupt) as ei:
            perplexity(ctx, tiny_tokens, n_ctx=64, n_batch=64, n_chunks=3, progress=stop)
        # the traceback keeps the frames alive, yet nothing in them points into llama.cpp's
        # output buffer any more: a decode that makes llama.cpp reallocate it still runs
        assert ei.value is not None
        ctx.memory.clear()
        batch = llama_cffi.Batch(64)
        batch.set_sequence(tiny_tokens[:64], 0)
        batch.logits[:] = 1
        ctx.decode_batch(batch)  # raises LiveOutputError while a raw array is alive
        assert ctx.n_outputs == 64


def test_nan_logits_are_an_error(tiny_model: llama_cffi.Model, tiny_tokens: npt.NDArray[np.int32]) -> None:
    """Non-finite logits (a broken model) raise instead of printing PPL = nan."""
    with llama_cffi.Context(tiny_model, n_ctx=64, n_batch=64) as ctx:
        poisoned = np.zeros((32, tiny_model.n_vocab), dtype=np.float32)
        poisoned[5, 7] = np.nan
        ctx.logits_all = lambda: poisoned  # type: ignore[method-assign]
        with pytest.raises(PerplexityError, match="NaN or infinite logits in chunk 1"):
            perplexity(ctx, tiny_tokens, n_ctx=64, n_batch=64, n_chunks=2)


def test_too_few_tokens(tiny_model: llama_cffi.Model, tiny_tokens: npt.NDArray[np.int32]) -> None:
    """At least 2 * n_ctx tokens, as llama-perplexity requires."""
    ok = perplexity(tiny_model, tiny_tokens[:64], n_ctx=32, n_batch=32)
    assert ok.n_chunks == 2
    with pytest.raises(NotEnoughTokensError, match=r"at least 64 tokens .* only 63 tokens"):
        perplexity(tiny_model, tiny_tokens[:63], n_ctx=32, n_batch=32)
    with pytest.raises(NotEnoughTokensError):
        perplexity(tiny_model, "a few words", n_ctx=512)
    assert issubclass(NotEnoughTokensError, ValueError) and issubclass(NotEnoughTokensError, llama_cffi.LlamaError)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_ctx": 2}, "n_ctx"),
        ({"n_ctx": True}, "n_ctx"),
        ({"n_batch": 0}, "n_batch"),
        ({"n_chunks": 0}, "n_chunks"),
        ({"n_threads": 0}, "n_threads"),
    ],
)
def test_bad_parameters(tiny_model: llama_cffi.Model, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(llama_cffi.ParamError, match=match):
        perplexity(tiny_model, corpus(), **kwargs)  # type: ignore[arg-type]


def test_bad_tokens_and_objects(tiny_model: llama_cffi.Model) -> None:
    with pytest.raises(llama_cffi.InvalidTokenError):
        perplexity(tiny_model, [1] * 200 + [tiny_model.n_vocab], n_ctx=64)
    with pytest.raises(TypeError):
        perplexity("model.gguf", "text")  # type: ignore[arg-type]


# ---------------------------------------------------------------------- command line
def run_cli(*args: str, module: str = "llama_cffi") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, GGML_NO_BACKTRACE="1", PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env
    )


def parse_output(text: str) -> tuple[float, float, list[float]]:
    m = FINAL.search(text)
    assert m, f"no 'Final estimate' line in:\n{text[-3000:]}"
    running = [float(v) for _, v in RUNNING.findall(text)]
    return float(m.group(1)), float(m.group(2)), running


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ppl") / "corpus.txt"
    path.write_text(corpus(), encoding="utf-8")
    return path


def test_cli_prints_like_llama_perplexity(
    tiny_model_path: Path, tiny_model: llama_cffi.Model, corpus_file: Path
) -> None:
    """Running estimates on stdout, then the final estimate; one trailing newline of the file
    is dropped (as -f does); both entry points print the same."""
    args = ("perplexity", "-m", str(tiny_model_path), "-f", str(corpus_file), "-c", "64", "-b", "128")
    r = run_cli(*args, "--chunks", "5", "-t", "2")
    assert r.returncode == 0, r.stderr
    assert "invalid choice" not in r.stderr, "the plugin is not registered: run `pip install -e .` again"
    text = corpus_file.read_bytes()
    expected = perplexity(tiny_model, text[:-1] if text.endswith(b"\n") else text, 64, 128, n_chunks=5)
    assert r.stdout.startswith("".join(f"[{i + 1}]{v:.4f}," for i, v in enumerate(expected.chunk_ppl)))
    assert r.stdout.rstrip().endswith(str(expected))
    assert "calculating perplexity over 5 chunks, n_ctx=64, batch_size=128, n_seq=2" in r.stderr
    r2 = run_cli(*args[1:], "--chunks", "5", "-t", "2", module="samplers.perplexity")
    assert r2.returncode == 0, r2.stderr
    assert r2.stdout == r.stdout


@pytest.mark.parametrize("module", ["llama_cffi", "samplers.perplexity"])
def test_cli_user_errors(tiny_model_path: Path, tmp_path: Path, module: str) -> None:
    """Bad model path, missing file, too short a file, bad sizes: exit 2, one line on stderr."""
    short = tmp_path / "short.txt"
    short.write_text("only a handful of tokens here\n")
    pre = ["perplexity"] if module == "llama_cffi" else []
    cases = [
        (["-m", "/nonexistent.gguf", "-f", str(short)], "nonexistent.gguf"),
        (["-m", str(tiny_model_path), "-f", str(tmp_path / "missing.txt")], "missing.txt"),
        (["-m", str(tiny_model_path), "-f", str(short), "-c", "64"], "at least 128 tokens"),
        (["-m", str(tiny_model_path), "-f", str(short), "-c", "1"], "n_ctx"),
    ]
    for args, needle in cases:
        r = run_cli(*pre, *args, module=module)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and "error:" in r.stderr and needle in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


def test_broken_plugin_does_not_break_builtin_commands(tiny_model_path: Path, tmp_path: Path) -> None:
    """A plugin whose module cannot be imported: built-in commands never load plugins; a
    listing (--help) reports it on stderr and still offers the working plugins."""
    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[llama_cffi.commands]\nbroken = no_such_module_xyz:register\n")

    def main_with_plugin(*args: str) -> subprocess.CompletedProcess[str]:
        return run_isolated(
            f"""
            import sys
            sys.path.insert(0, {str(tmp_path)!r})
            from llama_cffi.__main__ import main
            rc = main({list(args)!r})
            print(sorted(m for m in sys.modules if m.split(".")[0] == "samplers"))
            sys.exit(rc)
            """
        )

    r = main_with_plugin("tokenize", "-m", str(tiny_model_path), "--ids", "hi")
    assert r.returncode == 0, r.stderr
    assert "tokens" in r.stderr and r.stdout.rstrip().endswith("[]")  # no plugin imported
    assert "warning" not in r.stderr
    r = main_with_plugin("--help")
    assert r.returncode == 0, r.stderr
    assert "warning: plugin command 'broken'" in r.stderr and "no_such_module_xyz" in r.stderr
    assert "perplexity" in r.stdout and "demo" in r.stdout
    r = main_with_plugin("broken")
    assert r.returncode == 2 and "invalid choice" in r.stderr and "warning: plugin command 'broken'" in r.stderr


def test_llama_cffi_does_not_import_samplers() -> None:
    r = run_isolated(
        """
        import sys
        import llama_cffi, llama_cffi.__main__
        print(sorted(m for m in sys.modules if m.split(".")[0] == "samplers"))
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# ---------------------------------------------------------------------- against llama-perplexity
@pytest.fixture(scope="module")
def llama_perplexity_bin() -> Path:
    return build_llama_tool("llama-perplexity")


def native_run(binary: Path, *args: str) -> tuple[float, float, list[float]]:
    r = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return parse_output(r.stdout + "\n" + r.stderr)


@pytest.mark.default_model
@pytest.mark.slow
@pytest.mark.parametrize(
    "sizes",
    [
        ("-c", "128", "-b", "512", "--chunks", "4"),  # four chunks per decode
        ("-c", "128", "-b", "48", "--chunks", "2"),  # three decodes per chunk (48 + 48 + 32)
    ],
    ids=["n_seq=4", "n_batch<n_ctx"],
)
def test_matches_llama_perplexity(
    llama_perplexity_bin: Path, default_model_path: Path, corpus_file: Path, sizes: tuple[str, ...]
) -> None:
    """Same model, text and settings: llama-perplexity and ours print the same estimates."""
    args = ("-m", str(default_model_path), "-f", str(corpus_file), *sizes, "-t", "2")
    ppl_c, err_c, running_c = native_run(llama_perplexity_bin, *args)
    r = run_cli("perplexity", *args)
    assert r.returncode == 0, r.stderr
    ppl, err, running = parse_output(r.stdout)
    n_chunks = int(sizes[-1])
    assert len(running) == len(running_c) == n_chunks
    assert ppl == pytest.approx(ppl_c, rel=1e-4)  # equal to 4 significant digits
    assert running == pytest.approx(running_c, rel=1e-4)
    assert err == pytest.approx(err_c, rel=1e-3)
    print(f"\nllama-perplexity {' '.join(sizes)}: PPL = {ppl_c} +/- {err_c}; ours: {ppl} +/- {err}")


@pytest.mark.default_model
def test_default_model_api_and_cli_agree(default_model: llama_cffi.Model, corpus_file: Path) -> None:
    """The API on the real model: sane values, same as the CLI's (a PerplexityResult)."""
    text = corpus_file.read_bytes()[:-1]  # what -f reads
    res = perplexity(default_model, text, n_ctx=128, n_batch=256, n_chunks=2, n_threads=2)
    assert isinstance(res, PerplexityResult)
    assert 1.0 < res.ppl < 1000.0 and 0.0 < res.stderr < res.ppl
    r = run_cli("perplexity", "-f", str(corpus_file), "-c", "128", "-b", "256", "--chunks", "2", "-t", "2")
    assert r.returncode == 0, r.stderr
    assert str(res) in r.stdout  # -m defaults to the default model
