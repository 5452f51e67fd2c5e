"""Embeddings and reranking (``Context.embed``, ``Context.rerank``) against llama.cpp's own
``llama-embedding`` (built from the same source), on the tiny encoder-only models."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import llama_cffi
from llama_cffi import Model

TEXTS = ["hello world", "the cat is here", "a dog", "hello", "the end of the world is near"]

#: llama-embedding prints 7 decimals: its numbers are ours to that precision
PRINTED = 1e-6


def llama_embedding(path: Path, prompts: list[str], *args: str) -> list[list[float]]:
    """llama.cpp's llama-embedding on ``prompts`` (one per line), its JSON output parsed."""
    from benchmarks.native_tools import build_llama_example

    cmd = [str(build_llama_example("embedding")), "-m", str(path), "-p", "\n".join(prompts), "-t", "2"]
    for _attempt in range(5):
        r = subprocess.run([*cmd, "--embd-output-format", "json", *args], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        # With RANK pooling llama-embedding prints n_embd values per prompt but only the first
        # (the score) is written: it copies n_embd floats from a sequence's n_cls_out outputs,
        # so the rest is whatever memory follows, at times NaN, which printf writes as "nan"
        # or "-nan" (not JSON). Those read as None; the tests compare only written values.
        text = re.sub(r"(?<![\w.])-?(?:nan|inf)\b", "null", r.stdout)
        try:
            data: list[dict[str, Any]] = json.loads(text)["data"]
            break
        except json.JSONDecodeError:
            # llama.cpp's asynchronous logger, which prints the JSON, now and then garbles
            # it (seen: "0.00000000.0000000,,"); the values are deterministic: run again
            continue
    else:
        raise AssertionError(f"llama-embedding printed no valid JSON in 5 runs; last: {r.stdout[:2000]!r}")
    return [d["embedding"] for d in data]


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_embed_equals_llama_embedding(tiny_model_of: Any, pooling: str) -> None:
    """Pooled, L2-normalised embeddings of several texts (packed into one decode) equal
    llama-embedding's with the same pooling, to its printed precision."""
    path = tiny_model_of("bert" if pooling == "mean" else f"bert-{pooling}")
    with Model.load(path) as m, m.context(embeddings=True, n_seq_max=8, n_ctx=256) as ctx:
        assert ctx.pooling_type == pooling
        ours = ctx.embed(TEXTS)
    theirs = np.array(llama_embedding(path, TEXTS, "--pooling", pooling))
    assert ours.shape == theirs.shape == (len(TEXTS), 64)
    assert float(np.abs(ours - theirs).max()) <= PRINTED


def test_rerank_equals_llama_embedding(tiny_model_of: Any) -> None:
    """Rerank scores of query/document pairs (formed as llama-embedding forms them: query,
    EOS, document) equal llama-embedding's RANK output."""
    path = tiny_model_of("bert-rank")
    query, docs = "what is a cat", ["the cat is an animal", "hello world", "a dog is not a cat"]
    with Model.load(path) as m, m.context(embeddings=True, n_seq_max=8, n_ctx=256) as ctx:
        assert ctx.pooling_type == "rank"
        ours = ctx.rerank(query, docs)
    rows = llama_embedding(path, [f"{query}\t{d}" for d in docs], "--pooling", "rank", "--embd-normalize", "-1")
    theirs = np.array([row[0] for row in rows])  # one score each (it prints n_embd values; the rest are not scores)
    assert ours.shape == (3,) and np.isfinite(ours).all()
    assert float(np.abs(ours - theirs).max()) <= PRINTED


def test_embed_packs_texts_into_few_decodes(tiny_model_of: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Five texts with n_seq_max=8 take one decode; with n_seq_max=2, three; the vectors are
    the same either way, and the same as one text per decode."""
    with Model.load(tiny_model_of("bert")) as m:
        results = []
        for n_seq in (8, 2, 1):
            with m.context(embeddings=True, n_seq_max=n_seq, n_ctx=256) as ctx:
                calls: list[int] = []
                real = ctx.decode_batch

                def counted(b: llama_cffi.Batch, real: Any = real, calls: list[int] = calls) -> None:
                    calls.append(b.n_tokens)
                    real(b)

                monkeypatch.setattr(ctx, "decode_batch", counted)
                results.append(ctx.embed(TEXTS))
                assert len(calls) == {8: 1, 2: 3, 1: 5}[n_seq]
        # packing changes llama.cpp's batch shape, not the non-causal per-sequence math
        assert float(np.abs(results[0] - results[2]).max()) < 1e-5
        assert float(np.abs(results[1] - results[2]).max()) < 1e-5


def test_embed_on_a_decoder_with_pooling(tiny_model_path: Path) -> None:
    """A decoder model embeds too, with a pooling context (memory cleared per pack): the
    mean-pooled vector of a text equals the mean of its per-token embeddings."""
    with Model.load(tiny_model_path) as m:
        with m.context(embeddings=True, pooling_type="mean", n_seq_max=4, n_ctx=256) as ctx:
            v = ctx.embed(["hello world"], normalize=False)[0]
        with m.context(embeddings=True, pooling_type="none", n_ctx=256) as ctx:
            toks = m.tokenize("hello world", parse_special=True)
            ctx.decode(toks, logits="all")
            per = np.stack([ctx.embeddings(i) for i in range(len(toks))])
        assert float(np.abs(v - per.mean(axis=0)).max()) < 1e-5


def test_embed_and_rerank_say_what_they_need(tiny_model_of: Any, tiny_model: Model) -> None:
    """Typed errors for an embeddings-off context, a non-pooling context, a non-reranking
    context, too long a text, and an encoder-decoder model."""
    with tiny_model.context(n_ctx=256) as ctx, pytest.raises(llama_cffi.ParamError, match="embeddings=True"):
        ctx.embed(["x"])
    with tiny_model.context(n_ctx=256, embeddings=True) as ctx:
        with pytest.raises(llama_cffi.ParamError, match="pooling"):
            ctx.embed(["x"])
        with pytest.raises(llama_cffi.ParamError, match="rank"):
            ctx.rerank("q", ["d"])
    with Model.load(tiny_model_of("bert")) as m, m.context(embeddings=True, n_ctx=256, n_ubatch=16, n_batch=16) as ctx:
        with pytest.raises(llama_cffi.InvalidBatchError, match=r"takes 1\.\.16"):
            ctx.embed(["hello " * 20])
    with Model.load(tiny_model_of("t5")) as m, m.context(embeddings=True, pooling_type="mean", n_ctx=256) as ctx:
        with pytest.raises(llama_cffi.UnsupportedError, match="encoder-decoder"):
            ctx.embed(["x"])
