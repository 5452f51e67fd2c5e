"""One wheel for every x86-64 CPU: this interpreter's llama_cffi (the installed wheel, when
``tests/run_installed.py`` runs the suite) under ``qemu-x86_64`` user-mode emulation of
older CPUs loads the variant those CPUs can run and greedy-generates the host's tokens.

qemu-user comes from Debian's ``qemu-user`` package (``.ci/run`` installs it). The tiny
model has f32 weights: the variants' kernels differ only in SIMD width, so the tokens are
equal and the logits agree to float32 rounding of differently ordered sums."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import DEFAULT_SIGINT, ROOT, greedy_child

#: qemu CPU model -> the variant it must get (AVX2, AVX, SSE4.2: no AVX-512 anywhere)
CPUS = {"Haswell": "haswell", "SandyBridge": "sandybridge", "Nehalem": "sse42"}

#: qemu CPU model -> the OpenBLAS core numpy's bundled OpenBLAS must use there. Under
#: ``qemu-x86_64 -cpu Nehalem`` its DYNAMIC_ARCH detection says "Core: Haswell" (it does
#: not reach the AVX check qemu's cpuid would fail) and ``import numpy`` dies of SIGILL
#: (vxorps) before llama_cffi is imported: numpy's fault under emulation, not ours, so the
#: child names its core, as ``OPENBLAS_CORETYPE`` lets any user on such a machine do.
OPENBLAS_CORE = {"Haswell": "Haswell", "SandyBridge": "Sandybridge", "Nehalem": "Nehalem"}


def run(tiny_model_path: Path, qemu_cpu: str | None = None) -> dict[str, object]:
    code = DEFAULT_SIGINT + greedy_child(tiny_model_path)
    prefix = [str(shutil.which("qemu-x86_64")), "-cpu", qemu_cpu] if qemu_cpu else []
    env = dict(os.environ, GGML_NO_BACKTRACE="1", PYTHONPATH=str(ROOT))
    env.pop("LLAMA_CFFI_CPU_VARIANT", None)
    if qemu_cpu:
        env["OPENBLAS_CORETYPE"] = OPENBLAS_CORE[qemu_cpu]
    r = subprocess.run(
        [*prefix, sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env
    )
    assert r.returncode == 0, (qemu_cpu, r.returncode, r.stderr[-3000:])
    out: dict[str, object] = json.loads(r.stdout.split("RESULT", 1)[1])
    return out


@pytest.fixture(scope="module")
def host_run(tiny_model_path: Path) -> dict[str, object]:
    return run(tiny_model_path)


@pytest.mark.slow
@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 CPU models under qemu-x86_64")
@pytest.mark.parametrize(("qemu_cpu", "variant"), list(CPUS.items()))
def test_older_cpu_runs_the_same_wheel(
    tiny_model_path: Path, host_run: dict[str, object], qemu_cpu: str, variant: str
) -> None:
    """Under ``qemu-x86_64 -cpu <model>``: import, load, decode and greedy-generate 8
    tokens with the variant that CPU can run; the tokens equal the host's and the first
    logits agree within 1e-4."""
    assert shutil.which("qemu-x86_64"), "qemu-user is needed: apt-get install qemu-user (.ci/run installs it)"
    got = run(tiny_model_path, qemu_cpu)
    assert got["variant"] == variant, got["reason"]
    assert got["tokens"] == host_run["tokens"]
    np.testing.assert_allclose(got["logits"], host_run["logits"], atol=1e-4, rtol=0)


def test_host_loads_its_best_safe_variant(host_run: dict[str, object]) -> None:
    """Natively, the child loads what this process loaded: the best allowed variant."""
    from llama_cffi import backends

    assert host_run["variant"] == backends.choice().cpu.name
