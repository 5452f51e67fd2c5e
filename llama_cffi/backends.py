"""Which of the package's ggml backend libraries this process loads, and why.

llama.cpp is built with its backends as loadable modules, kept in the package's ``_libs``
folder beside the extension. The CPU backend comes in variants, one per instruction-set
level (``libggml-cpu-<variant>.so``: on x86-64 ``x64`` (SSE2), ``sse42``, ``sandybridge``
(AVX), ``haswell`` (AVX2, FMA, F16C), ``skylakex`` (AVX-512), ..., ``zen4`` (AVX-512 with
VBMI, VNNI, BF16), ``sapphirerapids`` (those and AMX)). At import, :func:`load` asks every
variant for ggml's own verdict on the running CPU (``ggml_backend_score``: cpuid checks
of each instruction set the variant was compiled with, 0 when one is missing) and loads
the highest-scoring variant it allows; unlike ggml's own loader it also checks that the OS
enables the register state those instructions need (XCR0). The build machine's
instruction sets play no part, so one wheel runs on any x86-64 CPU.

**AMX.** A variant that uses AMX is allowed only when all of these hold: ``LLAMA_CFFI_AMX=1``
is set (AMX kernels round differently from the AVX-512 ones: on the default model a
prompt's last logits moved by up to 0.6, and on these 2-core machines they were not
faster); the build carries ``patches/ggml-amx-tilecfg.patch`` (GCC 12 drops the stores of
llama.cpp's tile configuration, so without it the first AMX instruction kills the process
with SIGILL); the CPU reports AMX-TILE and AMX-INT8; the OS enables tile state (XCR0) and
grants this process tile data (``arch_prctl(ARCH_REQ_XCOMP_PERM)``). Otherwise the best
variant without AMX is loaded.

The other backend modules in the package (RPC, CUDA when built) are loaded too; one that
does not load (CUDA without a driver, say) is reported in :func:`choice`, not raised.

Environment, read once at import:

===============================  ==========================================================
``LLAMA_CFFI_CPU_VARIANT=name``  load this CPU variant (``ImportError`` if the package has
                                 none of that name or the CPU cannot run it)
``LLAMA_CFFI_AMX=1``             allow a variant that uses AMX (see above)
``LLAMA_CFFI_SKIP_BACKENDS``     comma list of other backends not to load (``cuda,rpc``)
===============================  ==========================================================

Nothing here runs llama.cpp code before the choice: scoring opens each library, calls
its score function (compiled for the baseline, like ggml's own loader does) and closes it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ._args import expect_int, expect_strs, type_error
from ._binding import BUILD_INFO, ffi, lib

__all__ = ["LIBS_DIR", "BackendChoice", "CpuVariant", "choice", "load", "os_refuses"]

logger = logging.getLogger("llama_cffi")

#: The package's native libraries (the extension's RUNPATH points here).
LIBS_DIR = Path(__file__).resolve().parent / "_libs"

#: The patch without which llama.cpp's AMX kernels crash (see patches/ in the source).
AMX_PATCH = "ggml-amx-tilecfg.patch"

_CPU_PREFIX = "libggml-cpu"
_REBUILD = "Reinstall llama_cffi, or rebuild it in place with `python build_ffi.py`."


@dataclass(frozen=True)
class CpuVariant:
    """One CPU backend library of the package and the verdict on it for this machine."""

    #: ggml's variant name (``haswell``); ``""`` for a one-library build (``LLAMA_CFFI_CPU=host``)
    name: str
    #: the instruction-set options it was compiled with (``["SSE42", "AVX", ...]``)
    features: tuple[str, ...]
    #: ``ggml_backend_score()``: higher is better, 0 when this CPU lacks one of ``features``,
    #: -1 when the library cannot be opened, -2 when it exports no score
    score: int
    #: whether the selection may load it
    allowed: bool
    #: why it is (not) allowed
    reason: str
    #: its file name in ``_libs``
    file: str

    @property
    def uses_amx(self) -> bool:
        return any(f.startswith("AMX") for f in self.features)


@dataclass(frozen=True)
class BackendChoice:
    """What :func:`load` did: the CPU variant loaded, every candidate, the other backends."""

    cpu: CpuVariant
    #: why ``cpu`` was chosen
    reason: str
    candidates: tuple[CpuVariant, ...]
    #: other backend modules loaded (file names)
    others: tuple[str, ...] = ()
    #: modules that were not loaded: (file name, why)
    not_loaded: tuple[tuple[str, str], ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (``llama_cffi.build_info()["cpu_variant"]``)."""
        return {
            "name": self.cpu.name,
            "file": self.cpu.file,
            "features": list(self.cpu.features),
            "score": self.cpu.score,
            "reason": self.reason,
            "candidates": [asdict(c) | {"features": list(c.features)} for c in self.candidates],
            "other_backends": list(self.others),
            "not_loaded": [list(x) for x in self.not_loaded],
        }


_choice: BackendChoice | None = None


def choice() -> BackendChoice:
    """The choice made at import."""
    if _choice is None:  # pragma: no cover - load() runs when the package is imported
        raise RuntimeError("llama_cffi.backends.load() has not run")
    return _choice


def _env_on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "on", "true", "yes")


#: XCR0 bits the OS must set before a variant's instructions may run: ggml's score
#: checks cpuid only ("FIXME: this does not check for OS support"), and a CPU can report
#: AVX-512 or AMX while the OS (or hypervisor) leaves their register state off.
_XCR0_YMM = 0x6  # SSE and AVX state
_XCR0_ZMM = 0xE0  # opmask, ZMM_Hi256, Hi16_ZMM
_XCR0_TILE = 0x60000  # XTILECFG, XTILEDATA


def os_refuses(features: tuple[str, ...], xcr0: int) -> str | None:
    """Why the OS's saved register state (``xcr0``, -1 where no such check applies)
    rules out a variant with these instruction sets, or None."""
    features = tuple(expect_strs("features", features, "a sequence of instruction-set names"))
    xcr0 = expect_int("xcr0", xcr0)
    if xcr0 < 0:
        return None
    need = 0
    if any(f.startswith(("AVX", "FMA", "F16C")) for f in features):
        need |= _XCR0_YMM
    if any(f.startswith("AVX512") for f in features):
        need |= _XCR0_ZMM
    if any(f.startswith("AMX") for f in features):
        need |= _XCR0_TILE
    if xcr0 & need != need:
        return f"the OS does not enable the register state it needs (XCR0 {xcr0:#x} lacks {need & ~xcr0:#x})"
    return None


def _amx_verdict() -> tuple[bool, str]:
    """Whether a variant that uses AMX may be loaded (the CPU already reported AMX-INT8
    through the variant's score, and the OS tile state through :func:`os_refuses`)."""
    if not _env_on("LLAMA_CFFI_AMX"):
        return False, (
            "uses AMX: off unless LLAMA_CFFI_AMX=1 (its kernels round differently from the AVX-512 ones "
            "and were not faster on the machines we measure on)"
        )
    if AMX_PATCH not in BUILD_INFO.get("patches", []):
        return False, f"uses AMX, and this build lacks {AMX_PATCH} (llama.cpp's AMX kernels die with SIGILL without it)"
    if lib.llama_cffi_amx_request() != 0:
        return False, "uses AMX, and the kernel refused tile data (arch_prctl ARCH_REQ_XCOMP_PERM)"
    return True, "AMX allowed (LLAMA_CFFI_AMX=1) and granted by the CPU and OS"


def _candidates(libs: Path) -> list[CpuVariant]:
    known: dict[str, list[str]] = BUILD_INFO.get("cpu_variants", {})
    out = []
    amx: tuple[bool, str] | None = None
    xcr0 = int(lib.llama_cffi_xcr0())
    for path in sorted(libs.glob(f"{_CPU_PREFIX}*.so")):
        name = path.name[len(_CPU_PREFIX) : -len(".so")].lstrip("-")
        features = tuple(known.get(name, []))
        score = int(lib.llama_cffi_backend_score(str(path).encode()))
        if score == -1:
            why = f"cannot be opened: {ffi.string(lib.llama_cffi_dlerror()).decode(errors='replace')}"
            allowed = False
        elif score == -2:
            allowed, why = False, "exports no ggml_backend_score"
        elif score == 0:
            allowed, why = False, "this CPU lacks an instruction set it uses: " + (" ".join(features) or "?")
        elif refused := os_refuses(features, xcr0):
            allowed, why = False, refused
        else:
            allowed, why = True, "this CPU and OS support every instruction set it uses"
            if any(f.startswith("AMX") for f in features):
                amx = amx or _amx_verdict()
                allowed, why = amx
        out.append(CpuVariant(name, features, score, allowed, why, path.name))
    return out


def _pick(cands: list[CpuVariant]) -> tuple[list[CpuVariant], str]:
    """The variants to try, best first, and why the first one."""
    forced = os.environ.get("LLAMA_CFFI_CPU_VARIANT", "").strip()
    if forced:
        match = [c for c in cands if c.name == forced]
        if not match:
            names = ", ".join(c.name for c in cands) or "none"
            raise ImportError(f"LLAMA_CFFI_CPU_VARIANT={forced}: the package has no such CPU variant (it has: {names})")
        if not match[0].allowed:
            raise ImportError(f"LLAMA_CFFI_CPU_VARIANT={forced}: cannot be loaded here: {match[0].reason}")
        return match, f"forced by LLAMA_CFFI_CPU_VARIANT={forced}"
    allowed = sorted((c for c in cands if c.allowed), key=lambda c: (-c.score, c.name))
    if not allowed:
        detail = "; ".join(f"{c.name or 'cpu'}: {c.reason}" for c in cands) or f"no {_CPU_PREFIX}*.so in {LIBS_DIR}"
        raise ImportError(f"llama_cffi found no CPU backend it can load ({detail}). " + _REBUILD)
    best = allowed[0]
    skipped = [c for c in cands if c.score > best.score and not c.allowed]
    why = f"the highest ggml score ({best.score}) of the {len(allowed)} variants this CPU can run"
    if skipped:
        why += "; not " + ", ".join(f"{c.name} ({c.reason})" for c in skipped)
    return allowed, why


def load(libs: Path = LIBS_DIR) -> BackendChoice:
    """Load the best allowed CPU variant and the other backend modules, then call
    ``llama_backend_init`` (once, when this module is imported: with no backend
    registered, llama.cpp's init would search the working directory for backend
    libraries itself)."""
    if not isinstance(libs, os.PathLike):
        raise type_error("libs", "a path (the folder of the native libraries)", libs)
    libs = Path(libs)
    global _choice
    if _choice is not None:
        return _choice
    if not libs.is_dir():
        raise ImportError(f"llama_cffi's native libraries are missing ({libs} is not a folder). " + _REBUILD)
    cands = _candidates(libs)
    order, reason = _pick(cands)
    not_loaded: list[tuple[str, str]] = []
    chosen = None
    for cand in order:
        if lib.ggml_backend_load(str(libs / cand.file).encode()) != ffi.NULL:
            chosen = cand
            break
        not_loaded.append((cand.file, "ggml_backend_load failed"))
        reason += f"; {cand.name} did not load"
    if chosen is None:
        raise ImportError(f"llama_cffi could not load any CPU backend from {libs}. " + _REBUILD)
    lib.llama_cffi_bind_cpu(str(libs / chosen.file).encode())
    skip = {s.strip().lower() for s in os.environ.get("LLAMA_CFFI_SKIP_BACKENDS", "").split(",") if s.strip()}
    others: list[str] = []
    for path in sorted(libs.glob("lib*.so")):
        if path.name.startswith(_CPU_PREFIX) or not path.name.startswith(("libggml-", "libllama_cffi_ggml-rpc")):
            continue
        kind = path.name[: -len(".so")].rsplit("-", 1)[-1]
        if kind in skip:
            not_loaded.append((path.name, "LLAMA_CFFI_SKIP_BACKENDS"))
        elif lib.ggml_backend_load(str(path).encode()) != ffi.NULL:
            others.append(path.name)
        else:
            not_loaded.append((path.name, "ggml_backend_load failed (see the log at debug level)"))
    _choice = BackendChoice(chosen, reason, tuple(cands), tuple(others), tuple(not_loaded))
    logger.debug("CPU backend %s: %s", chosen.name, reason)
    lib.llama_backend_init()
    return _choice


load()
