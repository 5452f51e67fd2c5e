"""SamplingParams: llama.cpp's fields, defaults and order (read from the pinned common.h),
the Python chain and llama.cpp's own common_sampler picking the same tokens for seeded
runs (a C++ program that parses the same command-line options with llama.cpp's own
parser), and the dict / command-line round trips."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.native_tools import build_common_cpp_tool, llama_cpp_source_dir
from llama_cffi import Model
from llama_cffi.errors import ParamError
from samplers.branch import BranchStore
from samplers.native import NativeSamplerChain
from samplers.params import SAMPLER_NAMES, SamplingParams
from samplers.search import complete

PROMPT = "Once upon a time"


def common_h_defaults() -> dict[str, str]:
    """``field -> default`` of ``struct common_params_sampling`` in the pinned source."""
    text = (llama_cpp_source_dir() / "common" / "common.h").read_text()
    body = text[text.index("struct common_params_sampling {") :]
    body = body[: body.index("\n};")]
    return dict(re.findall(r"^\s*(?:u?int\d+_t|float|bool)\s+(\w+)\s*=\s*([^;]+);", body, re.M))


def test_defaults_are_llama_cpps() -> None:
    """Every numeric field llama.cpp's struct has and we mirror has llama.cpp's default
    (compared as float32, as llama.cpp stores them); the sampler order is its vector."""
    d = common_h_defaults()
    ours = SamplingParams()
    mirrored = {f.name for f in dataclasses.fields(SamplingParams)} - {"seed", "samplers", "logit_bias"}
    for name in sorted(mirrored - {"dry_sequence_breakers"}):
        assert name in d, f"{name} is not a field of common_params_sampling"
        want = d[name].strip().rstrip("f")
        if want in ("true", "false"):
            assert getattr(ours, name) is (want == "true"), name
        else:
            assert np.float32(float(want)) == np.float32(getattr(ours, name)), (name, want, getattr(ours, name))
    not_sampling = {"n_prev", "n_probs", "no_perf", "timing_per_token", "user_sampling_config", "grammar_lazy"}
    not_sampling |= {"reasoning_budget_tokens", "reasoning_control", "backend_sampling", "seed"}
    assert set(d) - mirrored <= not_sampling
    text = (llama_cpp_source_dir() / "common" / "common.h").read_text()
    order = re.search(r"std::vector<enum common_sampler_type> samplers = \{(.*?)\};", text, re.S)
    assert order is not None
    names = [n.lower() for n in re.findall(r"COMMON_SAMPLER_TYPE_(\w+)", order.group(1))]
    assert [n.replace("typical_p", "typ_p") for n in names] == list(ours.samplers)
    breakers = re.search(r"dry_sequence_breakers = \{(.*?)\};", text)
    assert breakers is not None
    assert tuple(json.loads(f"[{breakers.group(1)}]")) == ours.dry_sequence_breakers


CASES = [
    SamplingParams(seed=3),
    SamplingParams(seed=3, temp=0.0),
    SamplingParams(seed=5, temp=1.5, top_k=0, top_p=0.9, min_p=0.0),
    SamplingParams(seed=7, penalty_repeat=1.3, penalty_freq=0.2, penalty_present=0.1, penalty_last_n=16),
    SamplingParams(seed=8, dry_multiplier=0.8, dry_allowed_length=2, temp=1.2),
    SamplingParams(seed=9, xtc_probability=0.5, xtc_threshold=0.05, temp=1.3, top_k=0),
    SamplingParams(seed=10, top_n_sigma=1.0, temp=1.5),
    SamplingParams(seed=11, typ_p=0.8, dynatemp_range=0.5, dynatemp_exponent=1.3),
    SamplingParams(seed=12, mirostat=1, temp=1.0),
    SamplingParams(seed=13, mirostat=2, mirostat_tau=3.0),
    SamplingParams(seed=14, samplers=("top_k", "temperature", "min_p", "adaptive_p"), adaptive_target=0.3),
    SamplingParams(seed=15, ignore_eos=True, logit_bias={5: 3.0, 17: -2.5}),
    SamplingParams(seed=16, samplers=("min_p", "temperature", "top_k"), top_p=0.5),
]


def common_sampler_tokens(model_path: Path, params: SamplingParams, n: int) -> list[int]:
    tool = build_common_cpp_tool("common_sampler_run")
    args = [str(tool), "-m", str(model_path), "-p", PROMPT, "-n", str(n), "-c", "256", "-t", "2", *params.to_args()]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return [int(x) for x in r.stdout.split()]


def ours(model: Model, sampler: object, n: int) -> list[int]:
    with model.context(n_ctx=256, n_batch=256, n_threads=2) as ctx:
        r = complete(BranchStore(ctx), PROMPT, max_tokens=n, sampler=sampler)  # type: ignore[arg-type]
    return r.tokens + ([-1] if r.stop_reason == "eog" else [])


def same(ours_: list[int], native: list[int], model: Model) -> bool:
    """Equal token streams (an end token ends both: ours marks it -1)."""
    if ours_ and ours_[-1] == -1:
        return ours_[:-1] == native[:-1] and model.vocab.is_eog(native[-1])
    return ours_ == native


@pytest.mark.parametrize("i", range(len(CASES)), ids=[" ".join(c.to_args()) for c in CASES])
def test_python_chain_equals_common_sampler_tiny(tiny_model_path: Path, tiny_model: Model, i: int) -> None:
    """Seeded runs: this package's chain, llama.cpp's samplers in common_sampler_init's
    chain, and llama.cpp's own common_sampler fed the same command-line options pick the
    same 24 tokens (identical logits: both decode the prompt in one batch, then one token
    per decode)."""
    p = CASES[i]
    native = common_sampler_tokens(tiny_model_path, p, 24)
    assert same(ours(tiny_model, p.to_chain(tiny_model), 24), native, tiny_model)
    assert same(ours(tiny_model, p.to_native(tiny_model), 24), native, tiny_model)


@pytest.mark.parametrize("i", [0, 3, 4, 8, 10])
def test_python_chain_equals_common_sampler_default_model(
    default_model_path: Path, default_model: Model, i: int
) -> None:
    """The same on the default model (Gemma 3, 262,144 tokens): default chain, penalties,
    DRY (string breakers tokenized by Gemma's vocabulary), Mirostat, adaptive-p."""
    p = CASES[i]
    native = common_sampler_tokens(default_model_path, p, 16)
    assert same(ours(default_model, p.to_chain(default_model), 16), native, default_model)


def test_min_keep_native_and_python_agree(tiny_model: Model) -> None:
    """min_keep (no command-line option in llama.cpp): the two chains agree token for token."""
    p = SamplingParams(seed=4, min_keep=5, top_p=0.3, min_p=0.4, typ_p=0.5, temp=1.4)
    assert ours(tiny_model, p.to_chain(tiny_model), 24) == ours(tiny_model, p.to_native(tiny_model), 24)
    with pytest.raises(ParamError, match="min_keep"):
        p.to_args()


def test_chains_are_llama_cpps_order(tiny_model: Model) -> None:
    """to_native adds every listed sampler (as common_sampler_init does); to_chain leaves
    out the ones switched off, in the same order."""
    native = SamplingParams(seed=1).to_native(tiny_model)
    assert isinstance(native, NativeSamplerChain)
    assert len(native) == 10  # 9 listed + dist
    chain = SamplingParams(seed=1).to_chain(tiny_model)
    assert [s.name for s in chain.samplers] == ["top-k", "top-p", "min-p", "temp-ext", "dist"]
    m = SamplingParams(seed=1, mirostat=2).to_chain()
    assert [s.name for s in m.samplers] == ["temp", "mirostat-v2"]
    biased = SamplingParams(seed=1, logit_bias={3: 1.0}, samplers="top-k;nucleus;temp").to_chain(tiny_model)
    assert [s.name for s in biased.samplers] == ["logit-bias", "top-k", "top-p", "temp-ext", "dist"]


valid_params = st.builds(
    SamplingParams,
    seed=st.none() | st.integers(0, 2**32 - 1),
    top_k=st.integers(-1, 100),
    top_p=st.floats(0, 1),
    min_p=st.floats(0, 1),
    xtc_probability=st.floats(0, 1),
    xtc_threshold=st.floats(0, 1),
    typ_p=st.floats(0, 1),
    temp=st.floats(-1, 3),
    dynatemp_range=st.floats(0, 2),
    penalty_last_n=st.integers(-1, 128),
    penalty_repeat=st.floats(0.1, 3),
    penalty_freq=st.floats(-2, 2),
    dry_multiplier=st.floats(0, 2),
    # (a breaker that starts with "-" reads as an option to argparse, though not to llama.cpp)
    dry_sequence_breakers=st.lists(st.text(min_size=1, max_size=3).filter(lambda s: s[0] != "-"), max_size=3).map(
        tuple
    ),
    mirostat=st.sampled_from([0, 1, 2]),
    top_n_sigma=st.floats(-1, 3),
    ignore_eos=st.booleans(),
    samplers=st.lists(st.sampled_from(SAMPLER_NAMES), max_size=6).map(tuple),
    logit_bias=st.dictionaries(st.integers(0, 1000), st.floats(-10, 10) | st.just(float("-inf")), max_size=3),
)


@given(valid_params)
def test_dict_and_command_line_round_trip(p: SamplingParams) -> None:
    assert SamplingParams.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    parser = argparse.ArgumentParser()
    SamplingParams.add_arguments(parser)
    args = p.to_args()
    if p.dry_sequence_breakers == ():
        return  # the command line cannot say "no breakers" (llama.cpp's --dry-sequence-breaker neither)
    assert SamplingParams.from_args(parser.parse_args(args)) == p


def test_errors() -> None:
    for bad in (
        {"top_p": 1.5},
        {"penalty_repeat": 0.0},
        {"mirostat": 3},
        {"top_k": 2.5},
        {"seed": -1},
        {"samplers": ("top_k", "warp")},
        {"logit_bias": {"x": 1}},
        {"temp": float("nan")},
        {"dry_sequence_breakers": "abc"},
    ):
        with pytest.raises(ParamError):
            SamplingParams(**bad)
    with pytest.raises(ParamError, match="unknown sampling parameter"):
        SamplingParams.from_dict({"temperature": 0.5})
    with pytest.raises(ParamError, match="needs the model"):
        SamplingParams(logit_bias={1: 1.0}).to_chain()
    assert SamplingParams(samplers="Top-K;TEMP;typ").samplers == ("top_k", "temperature", "typ_p")
    assert SamplingParams().replace(temp=0.0).temp == 0.0
    with pytest.raises(ParamError):
        SamplingParams().replace(top_p=2.0)
