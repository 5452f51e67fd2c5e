"""samplers.kl_divergence against llama-perplexity's --kl-divergence-base / --kl-divergence,
built from the same llama.cpp source (``benchmarks.native_tools.build_llama_tool``).

Tolerances: none. The base file is compared byte for byte and the printed lines as
strings. The only arithmetic that may differ is float64 rounding in the last bits
(``llama-perplexity`` adds its per-row values on several threads, in an order that varies
between its runs); at the printed precision (5 to 6 decimals) that has no effect.
"""

from __future__ import annotations

import argparse
import filecmp
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import llama_cffi
from benchmarks.native_tools import build_llama_tool, llama_cpp_source_dir
from llama_cffi import ParamError
from samplers.kl_divergence import (
    MAGIC,
    TABLE_HEADER,
    KLBase,
    KLBaseFileError,
    KLBaseMismatchError,
    KLDivergenceResult,
    add_kl_arguments,
    kl_divergence,
    kl_plan,
    read_kl_base,
    run_kl_cli,
    write_kl_base,
)
from samplers.perplexity import perplexity

ROOT = Path(__file__).resolve().parent.parent
N_CTX, N_CHUNKS = 128, 4  # the default model: 4 * 63 = 252 scored positions
# a line of the chunk table, or of the final statistics
TABLE_LINE = re.compile(r"^ {0,3}\d+ {4}.* %$")
STAT_LINE = re.compile(r"^(Mean |Maximum|Minimum|Median|Cor\(|RMS|Same top|[ 0-9.]{4}%  |======)")


def corpus() -> str:
    """Real English prose with code: llama.cpp's README from the pinned source tree (as
    tests/test_perplexity.py uses)."""
    return (llama_cpp_source_dir() / "README.md").read_text(encoding="utf-8")


def kl_lines(text: str) -> list[str]:
    """The chunk table and the statistics llama-perplexity prints (log prefixes dropped)."""
    out = []
    for line in text.splitlines():
        line = re.sub(r"^\d+\.\d+\.\d+\.\d+ [IWE] ", "", line)  # llama.cpp's timestamped log lines
        if line == TABLE_HEADER or TABLE_LINE.match(line) or STAT_LINE.match(line):
            out.append(line)
    return out


def result_lines(res: KLDivergenceResult) -> list[str]:
    return kl_lines("\n".join([TABLE_HEADER, *map(str, res.chunks), "", *res.lines()]))


# ---------------------------------------------------------------------- fast: the tiny model
@pytest.fixture(scope="module")
def tiny_base(tiny_model: llama_cffi.Model, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kl") / "tiny.kld"
    write_kl_base(tiny_model, corpus(), path, n_ctx=64, n_batch=128, n_chunks=4, n_threads=2)
    return path


def test_base_file_layout(tiny_model: llama_cffi.Model, tiny_base: Path) -> None:
    """The header, the tokens and each row, read independently of the module: the rows
    dequantise to the model's log-softmax within half a quantisation step."""
    raw = tiny_base.read_bytes()
    assert raw[:8] == MAGIC
    n_ctx, n_vocab, n_chunk = np.frombuffer(raw, np.int32, 3, 8)
    assert (n_ctx, n_vocab, n_chunk) == (64, tiny_model.n_vocab, 4)
    toks = np.frombuffer(raw, np.int32, n_ctx * n_chunk, 20)
    assert toks.tolist() == tiny_model.tokenize(corpus())[: n_ctx * n_chunk].tolist()
    nv = 2 * ((n_vocab + 1) // 2) + 4
    rows_per_chunk = n_ctx - 1 - n_ctx // 2
    assert len(raw) == 20 + 4 * n_ctx * n_chunk + 2 * nv * n_chunk * rows_per_chunk
    base = read_kl_base(tiny_base)
    assert (base.n_ctx, base.n_vocab, base.n_chunk, base.rows_per_chunk) == (64, n_vocab, 4, rows_per_chunk)
    # chunk 1, position 40: decode that chunk alone and compare
    chunk = toks[64:128].copy()
    chunk[0] = tiny_model.vocab.bos
    with llama_cffi.Context(tiny_model, n_ctx=64) as ctx:
        logits = np.array(ctx.decode(chunk, logits="all"), dtype=np.float64)[40]
    want = logits - logits.max() - math.log(np.exp(logits - logits.max()).sum())
    got = base.log_probs(1, 40)
    scale = float(np.frombuffer(raw, np.float32, 1, base.rows_offset + 2 * nv * (rows_per_chunk + 40 - 32))[0])
    kept = want > want.max() - 16  # below max - 16 nats the file stores the floor
    assert np.abs(got[kept] - want[kept]).max() < scale / 2 + 1e-4
    assert (got[~kept] <= want.max() - 16 + 1e-4).all()


def test_base_run_is_a_perplexity_run(tiny_model: llama_cffi.Model, tmp_path: Path) -> None:
    """The perplexity write_kl_base returns is perplexity()'s (its -log p in float32:
    equal to about 7 digits); the file appears only when the run succeeds."""
    path = tmp_path / "b.kld"
    res = write_kl_base(tiny_model, corpus(), path, n_ctx=64, n_batch=128, n_chunks=3)
    ref = perplexity(tiny_model, corpus(), 64, 128, 3)
    assert res.ppl == pytest.approx(ref.ppl, rel=1e-6) and res.count == ref.count == 3 * 31
    assert [p.name for p in tmp_path.iterdir()] == ["b.kld"]

    def stop(done: int, total: int, ppl: float) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_kl_base(tiny_model, corpus(), tmp_path / "c.kld", n_ctx=64, n_batch=128, progress=stop)
    assert [p.name for p in tmp_path.iterdir()] == ["b.kld"]  # no partial file, no temporary


def test_same_model_same_settings(tiny_model: llama_cffi.Model, tiny_base: Path) -> None:
    """Comparing a model with its own file: only the 16-bit quantisation separates them."""
    seen: list[tuple[int, int]] = []
    res = kl_divergence(
        tiny_model, tiny_base, n_batch=128, n_threads=2, progress=lambda d, t, line: seen.append((d, t))
    )
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert res.count == 4 * 31 and len(res.chunks) == 4 and res.n_seq == 2
    assert res.same_top == 1.0 and abs(res.kld) < 1e-5 and res.max_abs_p_diff < 1e-3
    assert res.ppl == pytest.approx(res.ppl_base, rel=1e-4)
    lines = res.lines()
    assert lines[0] == "====== Perplexity statistics ======" and lines[-1].startswith("Same top p: 100.000 ± ")
    assert str(res) == "\n".join(lines)
    assert res.kld_percentile(1.0) == float(res.kld_values.max())
    # the KLBase and a Context do the same
    base = read_kl_base(tiny_base)
    with llama_cffi.Context(tiny_model, n_ctx=128, n_batch=128, n_seq_max=2, n_threads=2, n_threads_batch=2) as ctx:
        again = kl_divergence(ctx, base, n_batch=128)
    assert result_lines(again) == result_lines(res)
    assert np.array_equal(again.kld_values, res.kld_values) and again.ppl == res.ppl


def test_bad_files(tiny_model: llama_cffi.Model, tiny_base: Path, tmp_path: Path) -> None:
    raw = tiny_base.read_bytes()
    bad = tmp_path / "bad.kld"
    bad.write_bytes(b"_notlog_" + raw[8:])
    with pytest.raises(KLBaseFileError, match="does not look like a file containing log-probabilities"):
        read_kl_base(bad)
    bad.write_bytes(raw[:6])
    with pytest.raises(KLBaseFileError, match="does not look like"):
        read_kl_base(bad)
    bad.write_bytes(raw[:16])
    with pytest.raises(KLBaseFileError, match="truncated header"):
        read_kl_base(bad)
    bad.write_bytes(raw[:100])
    with pytest.raises(KLBaseFileError, match=r"truncated: 20 of 256 evaluation tokens"):
        read_kl_base(bad)
    bad.write_bytes(raw[:-1])
    with pytest.raises(KLBaseFileError, match=r"truncated: 123 of 124 log-probability rows"):
        kl_divergence(tiny_model, bad)
    bad.write_bytes(raw[:8] + np.array([0], np.uint32).tobytes() + raw[12:])
    with pytest.raises(KLBaseFileError, match="impossible header n_ctx=0"):
        read_kl_base(bad)
    other = read_kl_base(tiny_base)
    n_rows = other.n_chunk * other.rows_per_chunk
    head = raw[:12] + np.array([tiny_model.n_vocab + 2], np.int32).tobytes() + raw[16 : other.rows_offset]
    bad.write_bytes(head + bytes(2 * (other.row_values + 2) * n_rows))  # a complete file, another vocabulary
    with pytest.raises(KLBaseMismatchError, match=rf"inconsistent vocabulary \({tiny_model.n_vocab + 2} in the base"):
        kl_divergence(tiny_model, bad)
    toks = bytearray(raw)
    toks[20:24] = np.array([tiny_model.n_vocab], np.int32).tobytes()
    bad.write_bytes(bytes(toks))
    with pytest.raises(KLBaseFileError, match="outside the vocabulary"):
        kl_divergence(tiny_model, bad)
    with pytest.raises(KLBaseMismatchError, match="computed with n_ctx=64, while the current context is 32"):
        kl_divergence(tiny_model, tiny_base, ctx_size=32)
    with pytest.raises(FileNotFoundError):
        read_kl_base(tmp_path / "missing.kld")
    with pytest.raises(ParamError, match="context_params may not set n_ctx"):
        kl_divergence(tiny_model, tiny_base, context_params={"n_ctx": 10})
    assert isinstance(read_kl_base(tiny_base), KLBase)


def test_layout_follows_llama_perplexity() -> None:
    """-c sets the context (n_seq_max = n_batch / c sequences of c cells); the file's n_ctx
    sets the chunks; n_seq = n_batch / n_ctx capped by n_seq_max."""
    cp, lp = kl_plan(128, 512, 2048)
    assert (cp.n_seq, cp.ctx_size, lp.n_ctx, lp.n_seq, lp.n_batch, lp.num_batches) == (4, 2048, 128, 4, 2048, 1)
    cp, lp = kl_plan(128)
    assert (cp.n_seq, lp.n_seq) == (16, 16)
    cp, lp = kl_plan(512, 512, 200)
    assert (lp.n_seq, lp.n_batch, lp.num_batches) == (1, 200, 3)


def test_expf_is_the_c_librarys() -> None:
    """Against the C library's expf called one value at a time (the float32s near a
    rounding boundary included)."""
    import ctypes
    import ctypes.util

    from samplers._libm import expf

    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.expf.argtypes, libm.expf.restype = [ctypes.c_float], ctypes.c_float
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-104, 0, 20000), -rng.exponential(0.01, 5000)]).astype(np.float32)
    want = np.array([libm.expf(v) for v in x.tolist()], np.float32)
    assert np.array_equal(expf(x), want)


def _rows(rng: np.random.Generator, n_rows: int, n_vocab: int, spread: float) -> np.ndarray:
    x = (rng.standard_normal((n_rows, n_vocab)) * spread).astype(np.float32)
    x[0, : n_vocab // 3] = -np.inf  # masked tokens
    x[1] = 0.25  # every logit equal: scale 0
    x[2, 7 % n_vocab] = x[2].max() + 30.0  # a confident row: most values below the max - 16 floor
    x[3, ::2] = np.round(x[3, ::2])  # ties
    return x


@pytest.mark.parametrize("n_vocab", [1, 2, 9, 1000, 262_144])
def test_c_kl_rows_equal_the_numpy_reference(n_vocab: int) -> None:
    """llama_cffi.kernels.kl_base_rows / kl_divergence_rows (C, several threads) against
    this module's numpy reference row by row: the same bytes and the same values, bit for
    bit (both are perplexity.cpp's arithmetic). Rows in a strided view (a decode's rows
    are slices of the logits matrix), odd vocabularies (a padding column), masked tokens,
    a zero scale, ties and a confident row included."""
    from llama_cffi.kernels import kl_base_rows, kl_divergence_rows, kl_row_values
    from samplers.kl_divergence import _kl_row, _quantise_row

    rng = np.random.default_rng(n_vocab)
    n_rows = 6
    wide = np.zeros((n_rows, n_vocab + 3), np.float32)
    wide[:, :n_vocab] = _rows(rng, n_rows, n_vocab, 4.0)
    logits = wide[:, :n_vocab]  # rows not contiguous with each other
    tokens = rng.integers(0, n_vocab, n_rows).astype(np.int32)
    nv = kl_row_values(n_vocab)
    out = np.full((n_rows, nv), 0xABCD, np.uint16)
    ref = np.zeros((n_rows, nv), np.uint16)
    got = kl_base_rows(logits, tokens, out, n_threads=3)
    want = [_quantise_row(logits[r], int(tokens[r]), ref[r]) for r in range(n_rows)]
    assert np.array_equal(out, ref)  # the padding (odd n_vocab) zeroed too
    assert got.tolist() == want
    other = (logits + rng.standard_normal(logits.shape).astype(np.float32) * np.float32(0.5)).astype(np.float32)
    other[1] = 0.25
    v = kl_divergence_rows(other, tokens, out, n_threads=2)
    assert v.ok.all()
    for r in range(n_rows):
        w = _kl_row(other[r], out[r], int(tokens[r]))
        assert (v.nll[r], v.nll_base[r], v.kld[r], bool(v.same_top[r]), v.p_diff[r]) == (
            w.nll,
            w.nll_base,
            w.kld,
            w.same_top,
            w.p_diff,
        ), r


def test_c_vector_expf_is_the_c_librarys() -> None:
    """The C kernels' fast expf (4 values at a time in AVX2, the uncertain ones handed to
    expf) against the C library's expf called for each value: every 29th float32 bit
    pattern in [-105, 0] (39 million values, each rounding boundary case the band catches
    included), and every 1,001st positive one below 89 (out of the fast range: expf's own).
    Bit for bit. (On a CPU without AVX2 both sides are expf itself.)"""
    from llama_cffi._binding import ffi, lib

    for lo, hi, step in ((0x80000000, 0xC2D20000, 29), (0x00000000, 0x42B20000, 1001)):
        x = np.arange(lo, hi, step, dtype=np.uint64).astype(np.uint32).view(np.float32)
        fast, ref = np.empty_like(x), np.empty_like(x)
        assert lib.llama_cffi_expf(len(x), ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", fast), 1) == 0
        assert lib.llama_cffi_expf(len(x), ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", ref), 0) == 0
        bad = np.flatnonzero(fast.view(np.uint32) != ref.view(np.uint32))
        assert len(bad) == 0, (x[bad[:5]], fast[bad[:5]], ref[bad[:5]])
    special = np.array([-np.inf, np.nan, -0.0, 0.0, -103.97, -103.98, -87.33, -87.34, -1e-30], np.float32)
    out = np.empty_like(special)
    n = len(special)
    assert lib.llama_cffi_expf(n, ffi.from_buffer("float[]", special), ffi.from_buffer("float[]", out), 1) == 0
    want = np.array([np.exp(np.float64(v)) for v in special.tolist()], np.float32)
    assert np.array_equal(out, want, equal_nan=True)
    assert lib.llama_cffi_expf(-1, ffi.NULL, ffi.NULL, 1) == -1


def test_c_kl_rows_refuse_bad_rows_and_arguments() -> None:
    """NaN, +inf and all -inf rows are reported (the numpy reference: NaN / an error), never
    read as numbers; wrong shapes, dtypes and token ids raise before any C runs."""
    from llama_cffi.kernels import kl_base_rows, kl_divergence_rows, kl_row_values
    from samplers.kl_divergence import KLDivergenceError, _kl_row, _quantise_row

    n = 50
    x = np.zeros((4, n), np.float32)
    x[0, 3] = np.nan
    x[1, 4] = np.inf
    x[2] = -np.inf
    out = np.full((4, kl_row_values(n)), 7, np.uint16)
    nll = kl_base_rows(x, [1, 2, 3, 4], out)
    assert np.isnan(nll[:3]).all() and not np.isnan(nll[3])
    assert (out[:3] == 7).all()  # untouched
    assert all(math.isnan(_quantise_row(x[r], 1, out[3].copy())) for r in range(3))
    v = kl_divergence_rows(x, [1, 2, 3, 4], out)
    assert v.ok.tolist() == [False, False, False, True]
    for r in range(3):
        with pytest.raises(KLDivergenceError):
            _kl_row(x[r], out[3], 1)
    with pytest.raises(ValueError, match=r"tokens must lie in \[0, 50\)"):
        kl_base_rows(x, [1, 2, 3, 50], out)
    with pytest.raises(ValueError, match="one id per row"):
        kl_divergence_rows(x, [1, 2], out)
    with pytest.raises(TypeError, match="out"):
        kl_base_rows(x, [1, 2, 3, 4], out[:, :-1])
    with pytest.raises(TypeError, match="base"):
        kl_divergence_rows(x, [1, 2, 3, 4], out.astype(np.int16))
    with pytest.raises(TypeError, match="logits"):
        kl_base_rows(x.astype(np.float64), [1, 2, 3, 4], out)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="logits"):
        kl_base_rows(x[:, ::2], [1, 2, 3, 4], out)
    with pytest.raises(ValueError, match="n_threads"):
        kl_base_rows(x, [1, 2, 3, 4], out, n_threads=0)


def test_cli(tiny_model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The perplexity command (python -m samplers.perplexity) writes and compares; run_kl_cli
    is None without the KL flags (the command then runs as before)."""
    from samplers.perplexity import main

    text = tmp_path / "t.txt"
    text.write_text(corpus())
    base = tmp_path / "cli.kld"
    common = ["-m", str(tiny_model_path), "-c", "64", "-b", "128", "-t", "2"]
    assert main([*common, "-f", str(text), "--chunks", "4", "--kl-divergence-base", str(base)]) == 0
    out = capsys.readouterr()
    assert re.fullmatch(r"(\[\d\][0-9.]+,){4}\nFinal estimate: PPL = [0-9.]+ \+/- [0-9.]+\n", out.out)
    assert main([*common, "--kl-divergence", "--kl-divergence-base", str(base), "-fa", "off"]) == 0
    out = capsys.readouterr()
    lines = kl_lines(out.out)
    assert lines[0] == TABLE_HEADER and len([v for v in lines if TABLE_LINE.match(v)]) == 4
    assert "Same top p" in lines[-1] and "kl_divergence: computing over 4 chunks, n_ctx=64" in out.err
    assert main([*common, "--kl-divergence"]) == 2
    assert "needs --kl-divergence-base" in capsys.readouterr().err
    assert main([*common, "--kl-divergence-base", str(base)]) == 2
    assert "needs -f FILE" in capsys.readouterr().err
    parser = argparse.ArgumentParser()
    parser.add_argument("-fa", "--flash-attn")  # already there: not added twice
    add_kl_arguments(parser)
    assert run_kl_cli(parser.parse_args([])) is None


# ---------------------------------------------------------------------- the default model
@pytest.fixture(scope="module")
def llama_perplexity_bin() -> Path:
    return build_llama_tool("llama-perplexity")


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kl_default") / "corpus.txt"
    path.write_text(corpus(), encoding="utf-8")
    return path


def native(binary: Path, model: Path, *args: str) -> str:
    r = subprocess.run(
        [str(binary), "-m", str(model), "-c", str(N_CTX), "-t", "2", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, LC_ALL="C"),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout + "\n" + r.stderr


@pytest.fixture(scope="module")
def bases(
    llama_perplexity_bin: Path, default_model_path: Path, default_model: llama_cffi.Model, corpus_file: Path
) -> tuple[Path, Path, str, str]:
    """(llama-perplexity's base file, ours, its output, our result's lines)."""
    d = corpus_file.parent
    out = native(
        llama_perplexity_bin,
        default_model_path,
        *("-f", str(corpus_file), "--chunks", str(N_CHUNKS), "--kl-divergence-base", str(d / "native.kld")),
    )
    text = corpus_file.read_bytes()[:-1]  # what -f reads
    res = write_kl_base(default_model, text, d / "ours.kld", n_ctx=N_CTX, n_chunks=N_CHUNKS, n_threads=2)
    return d / "native.kld", d / "ours.kld", out, "".join(f"[{i + 1}]{v:.4f}," for i, v in enumerate(res.chunk_ppl))


@pytest.mark.default_model
@pytest.mark.slow
def test_base_file_equals_llama_perplexity(bases: tuple[Path, Path, str, str]) -> None:
    """Same model, text and settings (-c 128 --chunks 4): the same bytes (132 MB), and the
    same running perplexities."""
    theirs, ours, out, running = bases
    assert theirs.stat().st_size == ours.stat().st_size == 132_124_660
    assert filecmp.cmp(theirs, ours, shallow=False)
    assert running in out


@pytest.fixture(scope="module")
def native_q8(llama_perplexity_bin: Path, default_model_path: Path, bases: tuple[Path, Path, str, str]) -> list[str]:
    """llama-perplexity --kl-divergence reading *our* base file, with a q8_0 K cache
    (-ctk q8_0) where the base run had f16: a real divergence. Its chunk table and
    statistics lines."""
    _, ours, _, _ = bases
    args = ("--kl-divergence", "--kl-divergence-base", str(ours), "-ctk", "q8_0")
    return kl_lines(native(llama_perplexity_bin, default_model_path, *args))


@pytest.mark.default_model
@pytest.mark.slow
def test_kl_divergence_equals_llama_perplexity(
    default_model: llama_cffi.Model, bases: tuple[Path, Path, str, str], native_q8: list[str]
) -> None:
    """kl_divergence reading llama-perplexity's file prints the lines llama-perplexity
    prints reading ours (the two files hold the same bytes, so this also is each tool
    reading its own file): the chunk table and every statistic, digit for digit."""
    theirs, _, _, _ = bases
    res = kl_divergence(default_model, theirs, ctx_size=N_CTX, n_threads=2, context_params={"type_k": "q8_0"})
    assert len(native_q8) == 1 + N_CHUNKS + 37
    assert result_lines(res) == native_q8
    assert res.kld > 1e-3 and res.same_top < 1.0 and res.rms_p_diff > 1e-3  # really different
    assert res.count == N_CHUNKS * 63 and (res.n_seq, res.n_batch) == (16, 2048)


@pytest.mark.default_model
@pytest.mark.slow
def test_cli_equals_llama_perplexity(
    default_model_path: Path, bases: tuple[Path, Path, str, str], native_q8: list[str]
) -> None:
    """The command (python -m samplers.perplexity, llama-perplexity's flags) on
    llama-perplexity's file prints llama-perplexity's lines."""
    theirs, _, _, _ = bases
    r = subprocess.run(
        [sys.executable, "-m", "samplers.perplexity", "-m", str(default_model_path), "-c", str(N_CTX), "-t", "2",
         "--kl-divergence", "--kl-divergence-base", str(theirs), "-ctk", "q8_0"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert kl_lines(r.stdout) == native_q8
    assert f"kl_divergence: computing over {N_CHUNKS} chunks, n_ctx={N_CTX}, batch_size=2048, n_seq=16" in r.stderr
