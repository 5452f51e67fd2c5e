"""samplers.distributed on a local Ray instance started by this module (``ray.init(num_cpus=2)``).

* perplexity: bit-identical to the single process (every field of the result) on the
  tiny model for several layouts, and on the default model through the command line
  (``--ray local``), whose output is the single-process output line for line, itself
  equal to llama-perplexity's (``tests/test_perplexity.py``) and checked against it here
  too;
* map_generate: equal to one-at-a-time generation (``samplers.search.generate`` in a
  single-sequence context) for fixed seeds, with sampler, stop strings, grammar and JSON
  schema, on the tiny model (F32 weights: llama.cpp's kernels give each row the same
  result whatever the decode's row count) for batches of 1, 4 and 9 prompts; on the
  default model with batch_size=1, and for batch_size=8 the same on 1 and 2 workers;
* failures: one bad prompt fails alone; a worker killed mid-run (SIGKILL to its
  process) is restarted by Ray and the run ends with the same results; a worker that
  cannot load its model is a DistributedError; Ray is imported only when used.

A second Ray cluster started with ``ray start`` (a head and a worker node on loopback)
is in ``tests/test_distributed_cluster.py``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import llama_cffi
import samplers
from samplers import distributed as D
from samplers.branch import BranchStore
from samplers.perplexity import perplexity
from samplers.search import generate
from tests.conftest import ROOT, run_isolated

ray = pytest.importorskip("ray")  # the test extra installs it: a skip fails the run under CI=true

FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")


def corpus() -> str:
    from benchmarks.native_tools import llama_cpp_source_dir

    return (llama_cpp_source_dir() / "README.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    if ray.is_initialized():
        ray.shutdown()
    # address="local": a new instance even where `ray start` left one to connect to
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=256 * 2**20, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def pool(tiny_model_path: Path) -> Iterator[D.Workers]:
    with D.Workers(tiny_model_path, n_workers=2, model_params={"use_extra_bufts": False}, cpus_per_worker=0.5) as w:
        yield w


def chain(seed: int = 0) -> samplers.SamplerChain:
    return samplers.SamplerChain(
        [samplers.TopK(40), samplers.TopP(0.9), samplers.Temperature(0.9), samplers.Dist(seed)]
    )


# ---------------------------------------------------------------------- perplexity
@pytest.mark.parametrize(("n_ctx", "n_batch", "n_chunks"), [(64, 256, 11), (64, 32, 3), (40, 120, -1), (64, 64, 5)])
def test_perplexity_is_the_single_process_result(
    pool: D.Workers, tiny_model_path: Path, n_ctx: int, n_batch: int, n_chunks: int
) -> None:
    """Every field equal: the final estimate, its +/- and every running value, bit for bit."""
    with llama_cffi.Model.load(tiny_model_path, use_extra_bufts=False) as m:
        ref = perplexity(m, corpus(), n_ctx, n_batch, n_chunks, n_threads=1)
    seen: list[tuple[int, int, float]] = []
    res = pool.perplexity(corpus(), n_ctx, n_batch, n_chunks, progress=lambda *a: seen.append(a))
    assert res == ref
    assert str(res) == str(ref)
    # progress in chunk order, with the values llama-perplexity prints
    assert seen == [(k + 1, ref.n_chunks, v) for k, v in enumerate(ref.chunk_ppl)]


def test_perplexity_errors_are_the_single_process_errors(pool: D.Workers) -> None:
    with pytest.raises(samplers.perplexity.NotEnoughTokensError):
        pool.perplexity("too short", n_ctx=64)
    with pytest.raises(llama_cffi.ParamError, match="n_chunks"):
        pool.perplexity(corpus(), 64, 64, 0)
    with pytest.raises(llama_cffi.InvalidTokenError):
        pool.perplexity([10**9] * 200, n_ctx=64)


def test_worker_killed_mid_perplexity_is_replaced(tiny_model_path: Path) -> None:
    """SIGKILL to a worker's process while it holds jobs: Ray restarts it, its jobs are
    retried, and the result is the undisturbed one."""
    with llama_cffi.Model.load(tiny_model_path) as m:
        ref = perplexity(m, corpus(), 64, 64, 40)
    with D.Workers(tiny_model_path, n_workers=2, cpus_per_worker=0.5) as w:
        victim = w.info()[1]["pid"]
        killed: list[int] = []

        def kill_once(done: int, total: int, ppl: float) -> None:
            if not killed:
                os.kill(victim, signal.SIGKILL)
                killed.append(done)

        res = w.perplexity(corpus(), 64, 64, 40, progress=kill_once)
        assert killed == [1] and res.n_chunks == 40 < ref.n_tokens // 64  # there was work left to redo
        pids = [i["pid"] for i in w.refresh_info()]
        assert victim not in pids  # the worker is a new process
    assert res == ref


def test_cli_with_ray_prints_the_single_process_output(tiny_model_path: Path, tmp_path: Path) -> None:
    text = tmp_path / "corpus.txt"
    text.write_text(corpus(), encoding="utf-8")
    args = ["-m", str(tiny_model_path), "-f", str(text), "-c", "64", "-b", "128", "--chunks", "9"]
    plain = run_cli("perplexity", *args)
    dist = run_cli("perplexity", *args, "--ray", "local", "--workers", "2")
    assert plain.returncode == 0 and dist.returncode == 0, dist.stderr[-2000:]
    assert FINAL.search(plain.stdout) and dist.stdout == plain.stdout
    assert "2 Ray workers" in dist.stderr
    bad = run_cli("perplexity", *args, "--ray", "127.0.0.1:1", "--workers", "2")
    assert bad.returncode == 2 and "error: no Ray cluster answers at 127.0.0.1:1" in bad.stderr
    assert "Traceback" not in bad.stderr


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, GGML_NO_BACKTRACE="1", PYTHONPATH=str(ROOT))
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [sys.executable, "-m", "llama_cffi", *args], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env
    )


@pytest.mark.default_model
@pytest.mark.slow
def test_default_model_cli_with_ray_equals_llama_perplexity(default_model_path: Path, tmp_path: Path) -> None:
    """The real model: the --ray output equals the single-process output line for line,
    and llama-perplexity's estimates to its printed digits (as tests/test_perplexity.py)."""
    from benchmarks.native_tools import build_llama_tool

    text = tmp_path / "corpus.txt"
    text.write_text(corpus(), encoding="utf-8")
    args = ["-m", str(default_model_path), "-f", str(text), "-c", "128", "-b", "256", "--chunks", "6"]
    plain = run_cli("perplexity", *args, "-t", "1")
    dist = run_cli("perplexity", *args, "-t", "1", "--ray", "local", "--workers", "2")
    assert dist.returncode == 0, dist.stderr[-2000:]
    assert dist.stdout == plain.stdout
    native = subprocess.run(
        [str(build_llama_tool("llama-perplexity")), *args, "-t", "2"], capture_output=True, text=True, timeout=600
    )
    assert native.returncode == 0, native.stderr[-2000:]
    m_c = FINAL.search(native.stdout + native.stderr)
    m = FINAL.search(dist.stdout)
    assert m_c and m
    assert float(m.group(1)) == pytest.approx(float(m_c.group(1)), rel=1e-4)
    assert float(m.group(2)) == pytest.approx(float(m_c.group(2)), rel=1e-3)
    print(f"\nllama-perplexity: {m_c.group(0)}; --ray: {m.group(0)}")


# ---------------------------------------------------------------------- map_generate
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def requests() -> list[Any]:
    return [
        "Hello there",
        "The cat",
        [1, 5, 9, 200],
        D.Request("Once upon a time", seed=1234, max_tokens=7),
        # its own stop list: the grammar allows newlines between tokens; room for 17 digits
        D.Request("Say a number", json_schema=SCHEMA, max_tokens=160, stop=[]),
        D.Request("Yes or no?", grammar='root ::= "yes" | "no"'),
        "a",
        D.Request("Greedy", sampler=samplers.SamplerChain([samplers.Greedy()]), stop=["e"]),
        "Paris is",
    ]


def sequential(path: Path, reqs: Sequence[Any], max_tokens: int, stop: Sequence[str]) -> list[str]:
    """The reference: samplers.search.generate, one prompt at a time, each in a fresh
    single-sequence context, with the sampler and seed map_generate documents."""
    out = []
    with llama_cffi.Model.load(path, use_extra_bufts=False) as m:
        for i, r in enumerate(reqs):
            r = r if isinstance(r, D.Request) else D.Request(r)
            with m.context(n_ctx=256, n_seq_max=1, n_batch=512) as ctx:
                out.append(
                    generate(
                        BranchStore(ctx),
                        r.prompt,
                        max_tokens=r.max_tokens if r.max_tokens is not None else max_tokens,
                        sampler=(r.sampler or chain()).clone(),
                        grammar=r.grammar,
                        json_schema=r.json_schema,
                        stop=r.stop if r.stop is not None else stop,
                        seed=r.seed if r.seed is not None else 100 + i,
                    )
                )
    return out


@pytest.mark.parametrize(("batch_size", "max_in_flight"), [(4, 2), (1, 1), (9, 1)])
def test_map_generate_equals_sequential(
    pool: D.Workers, tiny_model_path: Path, batch_size: int, max_in_flight: int
) -> None:
    """Fixed seeds: the text of every prompt is that of one-at-a-time generation, however
    the prompts were batched and spread."""
    ref = sequential(tiny_model_path, requests(), 12, ["\n"])
    pool.max_in_flight = max_in_flight
    done: list[int] = []
    gens = pool.map_generate(
        requests(),
        sampler=chain(),
        max_tokens=12,
        stop=["\n"],
        seed=100,
        batch_size=batch_size,
        n_ctx=256,
        progress=lambda d, t: done.append(d),
    )
    pool.max_in_flight = 2
    assert [g.index for g in gens] == list(range(len(ref)))
    assert [g.text for g in gens] == ref
    assert all(g.ok for g in gens), [g.error for g in gens]
    assert done[-1] == len(ref) and done == sorted(done)
    by = {g.index: g for g in gens}
    assert by[3].seed == 1234 and by[3].stop_reason in ("max_tokens", "eog") and len(by[3].tokens) <= 7
    assert by[5].text in ("yes", "no") and by[5].stop_reason == "eog"
    assert "n" in json.loads(by[4].text)
    assert "e" not in by[7].text
    if batch_size == 4:
        assert len({g.worker for g in gens}) == 2  # both workers took batches


def test_map_generate_results_are_complete_data(pool: D.Workers, tiny_model_path: Path) -> None:
    """Tokens, logprob and perplexity are those of the same generation on a branch."""
    (g,) = pool.map_generate(["The cat"], sampler=chain(), max_tokens=10, seed=5, n_ctx=256)
    with llama_cffi.Model.load(tiny_model_path, use_extra_bufts=False) as m, m.context(n_ctx=256, n_seq_max=1) as ctx:
        store = BranchStore(ctx)
        b = store.create(m.vocab.tokenize("The cat"), sampler=chain(), seed=5)
        text = "".join(samplers.search.stream(b, 10))
        assert g.text == text
        assert list(g.tokens) == b.tokens[g.n_prompt_tokens :]
        assert g.n_prompt_tokens == len(m.vocab.tokenize("The cat"))
        assert g.logprob == -b.tracker.total_surprisal  # type: ignore[union-attr]
        assert g.perplexity == pytest.approx(b.perplexity, rel=1e-12)
        assert g.stop_reason == ("max_tokens" if len(g.tokens) == 10 else "eog")


def test_one_bad_prompt_fails_alone(pool: D.Workers) -> None:
    reqs: list[Any] = [
        "fine",
        [10**9, 3],  # not a token of the vocabulary
        "x" * 2000,  # longer than its sequence
        D.Request("bad grammar", grammar="root ::= ("),
        "also fine",
    ]
    gens = pool.map_generate(reqs, max_tokens=4, batch_size=5, n_ctx=256)
    assert [g.ok for g in gens] == [True, False, False, False, True]
    assert gens[1].error is not None and gens[1].error.startswith("InvalidTokenError")
    assert gens[2].error is not None and "each sequence holds 256" in gens[2].error
    assert gens[3].error is not None and gens[3].error.startswith("GrammarSyntaxError")
    assert all(g.stop_reason == "error" for g in gens[1:4])
    assert gens[0].tokens and gens[4].tokens
    # argument errors are the caller's, before any work
    with pytest.raises(llama_cffi.ParamError, match="grammar or json_schema"):
        pool.map_generate(["a"], grammar="root ::= x", json_schema=SCHEMA)
    with pytest.raises(llama_cffi.ParamError, match="prompt 0"):
        pool.map_generate([b"bytes"])  # bytes: a Sequence[int] to mypy, but not a prompt
    with pytest.raises(llama_cffi.ParamError, match="batch_size"):
        pool.map_generate(["a"], batch_size=0)


def test_worker_killed_mid_map_generate_is_replaced(tiny_model_path: Path) -> None:
    prompts = [f"prompt number {i}" for i in range(24)]
    kw: dict[str, Any] = {"sampler": chain(), "max_tokens": 16, "batch_size": 2, "n_ctx": 256}
    with D.Workers(tiny_model_path, n_workers=2, model_params={"use_extra_bufts": False}, cpus_per_worker=0.5) as w:
        ref = w.map_generate(prompts, **kw)
        victim = w.info()[0]["pid"]
        killed: list[int] = []

        def kill_once(done: int, total: int) -> None:
            if not killed:
                os.kill(victim, signal.SIGKILL)
                killed.append(done)

        gens = w.map_generate(prompts, progress=kill_once, **kw)
        assert killed == [2]
        assert victim not in [i["pid"] for i in w.refresh_info()]
    assert [(g.text, g.tokens, g.logprob) for g in gens] == [(g.text, g.tokens, g.logprob) for g in ref]
    assert all(g.ok for g in gens)


@pytest.mark.default_model
@pytest.mark.slow
def test_default_model_map_generate(default_model_path: Path) -> None:
    """The real (quantized) model. batch_size=1: every prompt equals its one-at-a-time
    generation, on 2 workers. batch_size=8: 1 worker and 2 workers give the same results
    (bit for bit, logprobs included); the batch's prompts are packed into shared decodes
    and its tokens come from 8-row decodes, where llama.cpp's kernels round differently
    (see samplers.distributed), so texts may part from one-at-a-time generation."""
    prompts = [
        f"{p} ({i})" for i, p in enumerate(["The capital of France is", "Once upon a time", "def add(a, b):"] * 3)
    ]
    ref = sequential(default_model_path, prompts, 16, [])
    kw: dict[str, Any] = {"sampler": chain(), "max_tokens": 16, "seed": 100, "n_ctx": 256, "cpus_per_worker": 0.5}
    single = D.map_generate(default_model_path, prompts, batch_size=1, workers=2, **kw)
    assert all(g.ok for g in single), [g.error for g in single]
    assert [g.text for g in single] == ref
    assert len({g.worker for g in single}) == 2
    one = D.map_generate(default_model_path, prompts, batch_size=8, workers=1, **kw)
    two = D.map_generate(default_model_path, prompts, batch_size=8, workers=2, **kw)
    assert [(g.tokens, g.logprob, g.stop_reason) for g in one] == [(g.tokens, g.logprob, g.stop_reason) for g in two]
    same = sum(a.text == b for a, b in zip(two, ref, strict=True))
    print(f"\nbatch_size=8: {same}/{len(ref)} texts equal to one-at-a-time generation")


# ---------------------------------------------------------------------- set-up errors
def test_worker_that_cannot_load_is_a_distributed_error(tiny_model_path: Path, tmp_path: Path) -> None:
    with pytest.raises(D.DistributedError, match="could not load"):
        D.Workers(tiny_model_path, n_workers=1, model_params={"n_gpu_layers": "many"}, cpus_per_worker=0.5)
    with pytest.raises(D.DistributedError, match=r"3 workers of 1 CPUs each did not start within 3 s; the cluster has"):
        D.Workers(tiny_model_path, n_workers=3, start_timeout=3)  # the instance has 2 CPUs
    with pytest.raises(llama_cffi.ParamError, match="not a file"):
        D.Workers(tmp_path / "missing.gguf")
    with pytest.raises(llama_cffi.ParamError, match="n_workers"):
        D.Workers(tiny_model_path, n_workers=0)
    with pytest.raises(llama_cffi.ParamError, match="already initialised"):
        D.Workers(tiny_model_path, cluster="auto")
    w = D.Workers(tiny_model_path, n_workers=1, cpus_per_worker=0.5)
    w.close()
    w.close()
    with pytest.raises(D.DistributedError, match="closed"):
        w.map_generate(["a"])


def test_ray_is_imported_only_when_used(tiny_model_path: Path) -> None:
    r = run_isolated(
        f"""
        import sys
        import samplers.distributed as D
        import samplers.perplexity
        assert "ray" not in sys.modules
        sys.modules["ray"] = None  # as if it were not installed
        try:
            D.Workers({str(tiny_model_path)!r})
        except D.RayNotInstalled as e:
            assert isinstance(e, ImportError) and "llama-cffi[ray]" in str(e), e
            print("ok")
        """
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
