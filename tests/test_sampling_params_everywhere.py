"""SamplingParams wherever a sampler goes (issue 44, item 1), and the model's own sampling
settings (SamplingParams.from_model, GGUF general.sampling.*, as llama.cpp's common
applies them: what the caller passes wins over the model's, the model's over the
defaults)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import llama_cffi
from llama_cffi.testing import write_tiny_model
from samplers import SamplingParams
from samplers.branch import BranchStore, NewBranch
from samplers.many import generate_many
from samplers.search import best_of_n, complete

PARAMS = SamplingParams(temp=0.7, top_k=30, seed=11)


def _tokens_with_chain(model: llama_cffi.Model, prompt: list[int], n: int) -> list[int]:
    with model.context(n_ctx=128, n_seq_max=2, kv_unified=True) as ctx:
        return complete(BranchStore(ctx), prompt, n, sampler=PARAMS.to_chain(model)).tokens


def test_every_sampler_argument_takes_sampling_params(tiny_model: llama_cffi.Model) -> None:
    """The same tokens as the params' own chain, through every entry point that takes a
    sampler (the draws are seeded by the params' seed)."""
    prompt = [int(t) for t in tiny_model.tokenize("Once upon a time")]
    want = _tokens_with_chain(tiny_model, prompt, 12)
    with tiny_model.context(n_ctx=128, n_seq_max=4, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        assert complete(store, prompt, 12, sampler=PARAMS).tokens == want
        b = store.create(prompt, sampler=PARAMS)
        got = []
        for _ in range(12):
            t = b.sample()
            got.append(t)
            store.step({b: t})
        assert got == want[: len(got)]
        b.set_sampler(PARAMS)  # a fresh chain of the params
        b.prune()
        [nb] = store.create_many([NewBranch(prompt, sampler=PARAMS)])
        assert nb.sampler.samplers and nb.position == len(prompt)
        nb.prune()
        r = best_of_n(store, prompt, 1, 12, sampler=PARAMS, seed=11)
        assert len(r.tokens) == 12
        [m] = generate_many(store, [prompt], max_tokens=12, sampler=PARAMS, seed=11)
        assert len(m.tokens) == 12
    with tiny_model.context(n_ctx=128) as ctx:
        text = ctx.generate(prompt, 12, sampler=PARAMS)
        assert text == tiny_model.detokenize(want)


def test_a_wrong_sampler_is_a_type_error_naming_it(tiny_model: llama_cffi.Model) -> None:
    prompt = [int(t) for t in tiny_model.tokenize("Hi")]
    with tiny_model.context(n_ctx=64, n_seq_max=2, kv_unified=True) as ctx:
        with pytest.raises(TypeError, match="sampler"):
            ctx.generate(prompt, 2, sampler="greedy")
        store = BranchStore(ctx)
        for call in (
            lambda: complete(store, prompt, 2, sampler="greedy"),
            lambda: store.create(prompt, sampler={"temp": 0.5}),
            lambda: generate_many(store, [prompt], max_tokens=2, sampler=0.5),
        ):
            with pytest.raises(TypeError, match="sampler"):
                call()


def _model(tmp_path: Path, **sampling: object) -> Path:
    meta = {f"general.sampling.{k}": v for k, v in sampling.items()}
    return write_tiny_model(tmp_path / "m.gguf", extra_metadata=meta)


def test_from_model_reads_the_models_settings(tmp_path: Path) -> None:
    path = _model(
        tmp_path,
        top_k=20,
        temp=0.6,
        top_p="0.9xyz",  # strtof reads its leading number
        min_p="none",  # no number: ignored, as llama.cpp ignores it
        penalty_last_n=32,
        mirostat=2,
        sequence="Top-K;TEMP;bogus;min_p",  # names lower-cased, unknown ones skipped
    )
    with llama_cffi.Model.load(path, vocab_only=True) as m:
        assert m.meta_value("general.sampling.top_k") == "20"
        assert m.meta_value("general.sampling.nothing") is None
        p = SamplingParams.from_model(m)
        d = SamplingParams()
        assert (p.top_k, p.top_p, p.min_p, p.penalty_last_n, p.mirostat) == (20, pytest.approx(0.9), d.min_p, 32, 2)
        assert p.temp == pytest.approx(0.6)
        assert p.samplers == ("top_k", "temperature", "min_p")
        assert p.xtc_probability == d.xtc_probability and p.mirostat_tau == d.mirostat_tau
        # what the caller passes wins over the model's
        q = SamplingParams.from_model(m, top_k=5, samplers="top_p;temperature")
        assert (q.top_k, q.samplers, q.temp) == (5, ("top_p", "temperature"), p.temp)
        with pytest.raises(llama_cffi.ParamError):
            SamplingParams.from_model(m, top_p=3.0)


def test_from_model_ignores_values_out_of_range(tmp_path: Path) -> None:
    """A model file is untrusted: a value the checks refuse falls back to the default,
    with a warning naming it; the others still apply."""
    with llama_cffi.Model.load(_model(tmp_path, top_p=2.0, top_k=7), vocab_only=True) as m:
        with pytest.warns(RuntimeWarning, match=r"general\.sampling\.top_p"):
            p = SamplingParams.from_model(m)
        assert (p.top_p, p.top_k) == (SamplingParams().top_p, 7)


def test_from_model_without_settings_is_the_defaults(tiny_model: llama_cffi.Model) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert SamplingParams.from_model(tiny_model) == SamplingParams()
