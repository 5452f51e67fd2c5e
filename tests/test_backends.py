"""The CPU backend library chosen at import (llama_cffi.backends): ggml's score against the
running CPU plus the OS's register state, never the build machine's flags; AMX only when
asked for and granted; forced choices checked; every variant gives the same tokens."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import numpy as np
import pytest

import llama_cffi
from llama_cffi import backends, kernels, lib
from tests.conftest import greedy_child, run_isolated

X86 = platform.machine() in ("x86_64", "AMD64")

#: /proc/cpuinfo flags for each ggml instruction-set option (what ggml's score checks)
CPUINFO = {
    "SSE42": ["sse4_2"],
    "AVX": ["avx"],
    "AVX2": ["avx2"],
    "BMI2": ["bmi2"],
    "FMA": ["fma"],
    "F16C": ["f16c"],
    "AVX_VNNI": ["avx_vnni"],
    "AVX512": ["avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"],
    "AVX512_VBMI": ["avx512vbmi"],
    "AVX512_VNNI": ["avx512_vnni"],
    "AVX512_BF16": ["avx512_bf16"],
    "AMX_TILE": ["amx_tile"],
    "AMX_INT8": ["amx_int8"],
}


def greedy(path: Path, n: int = 8, **env: str) -> dict[str, object]:
    r = run_isolated(greedy_child(path, n), env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out: dict[str, object] = json.loads(r.stdout.split("RESULT", 1)[1])
    return out


def test_the_choice_is_the_best_allowed_variant() -> None:
    """The loaded variant has the highest score among those allowed; every better-scoring
    one is refused with a reason; build_info() reports the same choice."""
    c = backends.choice()
    allowed = [v for v in c.candidates if v.allowed]
    assert c.cpu.allowed and c.cpu.score == max(v.score for v in allowed)
    for v in c.candidates:
        assert v.score >= 0, f"{v.file} could not be scored: {v.reason}"
        if v.score > c.cpu.score:
            assert not v.allowed and v.reason
    info = llama_cffi.build_info()["cpu_variant"]
    assert info["name"] == c.cpu.name and info["reason"] == c.reason
    assert set(info["features"]) == set(llama_cffi.build_info()["cpu_variants"][c.cpu.name])


@pytest.mark.skipif(not X86, reason="the x86 variant list")
def test_the_package_has_every_x86_variant_ggml_lists() -> None:
    """On x86-64 every variant from baseline x64 to sapphirerapids is shipped; x64 and
    sse42 score above zero on any CPU that runs this suite."""
    names = {v.name for v in backends.choice().candidates}
    assert {"x64", "sse42", "sandybridge", "haswell", "skylakex", "icelake", "zen4", "sapphirerapids"} <= names
    scores = {v.name: v.score for v in backends.choice().candidates}
    assert scores["x64"] > 0 and scores["sse42"] > 0


@pytest.mark.skipif(not Path("/proc/cpuinfo").is_file() or not X86, reason="Linux x86-64: /proc/cpuinfo")
def test_scores_agree_with_the_kernel_view_of_the_cpu() -> None:
    """ggml's cpuid score says a variant runs exactly when /proc/cpuinfo (the kernel's view,
    which also drops what the OS does not enable) has every flag the variant needs."""
    flags = set(Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0].split())
    for v in backends.choice().candidates:
        has_all = all(f in flags for feat in v.features for f in CPUINFO.get(feat, [feat.lower()]))
        assert (v.score > 0) == has_all, (v.name, v.features, v.score)
        if has_all and not any(f.startswith("AMX") for f in v.features):
            assert v.allowed, (v.name, v.reason)


@pytest.mark.parametrize(
    ("features", "xcr0", "refused"),
    [
        (("SSE42",), 0, False),  # no AVX: nothing to ask of the OS
        (("SSE42", "AVX", "AVX2"), 0, True),  # OSXSAVE clear: no AVX state
        (("SSE42", "AVX", "AVX2"), 0x7, False),
        (("AVX2", "AVX512"), 0x7, True),  # AVX-512 reported by cpuid, ZMM state off
        (("AVX2", "AVX512"), 0xE7, False),
        (("AVX512", "AMX_TILE", "AMX_INT8"), 0xE7, True),  # tile state off
        (("AVX512", "AMX_TILE", "AMX_INT8"), 0x600E7, False),
        (("AVX512",), -1, False),  # not x86: no such check
    ],
)
def test_os_register_state_rules_out_variants(features: tuple[str, ...], xcr0: int, refused: bool) -> None:
    """A variant needs the OS to save the registers its instructions use (XCR0), which
    ggml's own score does not check."""
    why = backends.os_refuses(features, xcr0)
    assert (why is not None) == refused
    if refused:
        assert "XCR0" in str(why)


def test_this_os_state_is_read() -> None:
    """XCR0 is read on x86-64 (SSE and AVX state on wherever AVX runs), -1 elsewhere."""
    xcr0 = int(lib.llama_cffi_xcr0())
    if X86:
        assert xcr0 & 0x3 == 0x3
        if "AVX" in backends.choice().cpu.features:
            assert xcr0 & 0x6 == 0x6
    else:
        assert xcr0 == -1


def test_cpu_library_functions_are_bound_to_the_loaded_variant() -> None:
    """ggml-cpu.h's functions (ggml_cpu_has_*, threadpools) come from the variant loaded:
    its compiled instruction sets, and a threadpool llama.cpp can use."""
    feats = set(backends.choice().cpu.features)
    assert bool(lib.ggml_cpu_has_avx2()) == ("AVX2" in feats)
    assert bool(lib.ggml_cpu_has_avx512()) == ("AVX512" in feats)
    assert kernels.SOFTMAX_IMPL == "ggml_vec_soft_max_f32"
    params = lib.ggml_threadpool_params_default(2)
    tp = lib.ggml_threadpool_new(llama_cffi.ffi.new("struct ggml_threadpool_params *", params))
    assert tp != llama_cffi.ffi.NULL
    lib.ggml_threadpool_free(tp)


def test_every_variant_this_cpu_runs_gives_the_same_tokens(tiny_model_path: Path) -> None:
    """The tiny f32 model, decoded with the chosen variant and forced onto the baseline
    (x64), SSE4.2 and AVX2 ones: the same greedy tokens, logits within 1e-4 (SIMD widths
    change the order of float32 sums, nothing else)."""
    base = greedy(tiny_model_path)
    assert base["variant"] == backends.choice().cpu.name
    runnable = {v.name for v in backends.choice().candidates if v.allowed}
    others = [n for n in ("x64", "sse42", "haswell") if n in runnable and n != base["variant"]]
    assert others or not X86
    for name in others:
        got = greedy(tiny_model_path, LLAMA_CFFI_CPU_VARIANT=name)
        assert got["variant"] == name and "forced" in str(got["reason"])
        assert got["tokens"] == base["tokens"], name
        np.testing.assert_allclose(got["logits"], base["logits"], atol=1e-4, rtol=0)


def test_forcing_a_variant_that_cannot_load_is_an_import_error() -> None:
    """An unknown variant name, and (without LLAMA_CFFI_AMX=1) the AMX one, raise
    ImportError saying why, in a child that then does not crash."""
    code = """
    try:
        import llama_cffi
        print("LOADED", llama_cffi.backends.choice().cpu.name)
    except ImportError as e:
        print("IMPORTERROR", e)
    """
    r = run_isolated(code, env={"LLAMA_CFFI_CPU_VARIANT": "pentium"})
    assert r.returncode == 0, r.stderr
    assert "IMPORTERROR" in r.stdout and "no such CPU variant" in r.stdout and "x64" in r.stdout
    if any(v.uses_amx for v in backends.choice().candidates):
        r = run_isolated(code, env={"LLAMA_CFFI_CPU_VARIANT": "sapphirerapids", "LLAMA_CFFI_AMX": ""})
        assert r.returncode == 0, r.stderr
        assert "IMPORTERROR" in r.stdout, r.stdout
        assert "LLAMA_CFFI_AMX" in r.stdout or "lacks" in r.stdout


def test_amx_policy_needs_the_opt_in_and_the_patch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without LLAMA_CFFI_AMX=1 an AMX variant is refused; with it, a build that lacks
    the tile-configuration patch is refused too."""
    monkeypatch.delenv("LLAMA_CFFI_AMX", raising=False)
    ok, why = backends._amx_verdict()
    assert not ok and "LLAMA_CFFI_AMX=1" in why
    monkeypatch.setenv("LLAMA_CFFI_AMX", "1")
    monkeypatch.setitem(backends.BUILD_INFO, "patches", [])
    ok, why = backends._amx_verdict()
    assert not ok and backends.AMX_PATCH in why


def test_no_allowed_variant_is_an_import_error() -> None:
    """With no CPU library to load, the import fails with a message, not a crash."""
    with pytest.raises(ImportError, match="no CPU backend"):
        backends._pick([])


@pytest.mark.default_model
def test_amx_when_asked_for(default_model_path: Path) -> None:
    """LLAMA_CFFI_AMX=1 on a machine that grants AMX loads the sapphirerapids variant,
    which decodes the default model (Q4_K: the AMX kernels) without the SIGILL the
    unpatched code dies with, and agrees with the default variant's greedy tokens; logits
    within 1.0 (AMX quantises activations in its own blocks and sums in another order:
    up to 0.6 was measured). Where the CPU or OS has no AMX, a non-AMX variant loads and
    the refusal says why."""
    amx = [v for v in backends.choice().candidates if v.uses_amx]
    base = greedy(default_model_path, n=4)
    got = greedy(default_model_path, n=4, LLAMA_CFFI_AMX="1")
    if amx and amx[0].score > 0 and backends.os_refuses(amx[0].features, int(lib.llama_cffi_xcr0())) is None:
        assert got["variant"] == amx[0].name, got["reason"]
        assert "AMX_INT8 = 1" in str(got["system"])
        assert got["tokens"][:1] == base["tokens"][:1]
        np.testing.assert_allclose(got["logits"], base["logits"], atol=1.0, rtol=0)
    else:
        assert got["variant"] == base["variant"]
        assert not amx or "AMX" in str(got["reason"]) or amx[0].score == 0


def test_skipping_the_rpc_backend() -> None:
    """LLAMA_CFFI_SKIP_BACKENDS=rpc leaves RPC unregistered (and says so)."""
    if llama_cffi.build_info()["options"]["GGML_RPC"] != "ON":
        pytest.fail("this suite expects the default build, with RPC")
    r = run_isolated(
        """
        import llama_cffi
        c = llama_cffi.backends.choice()
        print("RPC", llama_cffi.supports_rpc(), [f for f, why in c.not_loaded if "rpc" in f])
        """,
        env={"LLAMA_CFFI_SKIP_BACKENDS": "rpc"},
    )
    assert r.returncode == 0, r.stderr
    assert "RPC False ['libllama_cffi_ggml-rpc.so']" in r.stdout, r.stdout
    assert llama_cffi.supports_rpc()
