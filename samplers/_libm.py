"""The C library's float32 ``expf`` and ``logf``, as llama.cpp's tools call them.

``tools/perplexity/perplexity.cpp`` sums ``expf`` values in float32 (``compute_logprobs``)
or float64 (KL divergence) and prints results to 6 decimals, so reproducing its lines
needs its ``expf``, which glibc does not round correctly (its worst error is 0.502 ulp).
:func:`expf` computes a whole row in numpy (float64 ``exp``, rounded) and calls the C
library only for the values where that can differ; :func:`c_expf` and :func:`c_logf` call
it for one value. The C library is loaded with ctypes (it is not part of llama.h); without
one, the correctly rounded values are used.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import sys
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from llama_cffi._args import type_error

__all__ = ["c_expf", "c_logf", "expf"]


def _load(name: str) -> Callable[[float], float] | None:
    lib_name = ctypes.util.find_library("m") or ("libm.so.6" if sys.platform.startswith("linux") else None)
    try:
        lib = ctypes.CDLL(lib_name)  # None: the process itself (macOS, Windows' CRT)
        fn = getattr(lib, name)
    except (OSError, AttributeError):  # pragma: no cover - no C library function to call
        return None
    fn.argtypes = [ctypes.c_float]
    fn.restype = ctypes.c_float
    out: Callable[[float], float] = fn
    return out


_C_EXPF = _load("expf")
_C_LOGF = _load("logf")


def c_expf(x: float) -> np.float32:
    """The C library's ``expf(x)`` (``exp`` rounded to float32 without one)."""
    r: np.float32 = np.float32(_C_EXPF(x) if _C_EXPF is not None else math.exp(x))
    return r


def c_logf(x: float) -> np.float32:
    """The C library's ``logf(x)`` (``log`` rounded to float32 without one)."""
    r: np.float32 = np.float32(_C_LOGF(x) if _C_LOGF is not None else math.log(x))
    return r


#: float64 mantissa bits below float32's: rounding to float32 looks at these 29 bits
_LOW = np.uint64((1 << 29) - 1)
_HALF = 1 << 28
_BAND = int(0.003 * (1 << 29))  # within 0.003 float32 ulp of a rounding midpoint (glibc: 0.002)
_BAND_LO = np.uint64(_HALF - _BAND)
_BAND_W = np.uint64(2 * _BAND)
_TINY = 2.0**-126  # below this a float32 is subnormal: another rounding position


def expf(x: npt.NDArray[np.float32], out: npt.NDArray[np.float32] | None = None) -> npt.NDArray[np.float32]:
    """``expf`` of every float32 in ``x``, as the C library computes it (what
    ``perplexity.cpp`` calls), into ``out`` (a new array when None).

    ``exp`` is computed in float64 (error far below a float32 ulp) and rounded to
    float32: the correctly rounded value. The C library's ``expf`` may differ from that
    only where the exact value lies very near the midpoint between two float32s
    (glibc's worst error is 0.502 ulp), so the values whose float64 result is within
    0.003 ulp of a midpoint (about 1 in 200 of them), and float32 subnormal results, are
    computed by calling the C library's ``expf``. Checked against glibc 2.36 on every
    37th float32 bit pattern in ``[-104, 0]`` (30 million values): no difference (the
    closest glibc difference lay 0.0016 ulp from a midpoint). Without a loadable C
    library the rounded float64 values are returned (1 value in ~10,000 may then differ
    by one ulp from ``llama-perplexity``'s)."""
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        raise type_error("x", "a float32 ndarray", x)
    # any shape: the indices below are into the flattened values
    if out is not None and (not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.shape != x.shape):
        raise type_error("out", "None or a float32 ndarray shaped as x", out)
    d = np.exp(x.astype(np.float64))
    fix: list[float] = []
    idx = None
    if _C_EXPF is not None:
        bits = d.view(np.uint64)
        near = ((bits - _BAND_LO) & _LOW) < _BAND_W
        near |= (d < _TINY) & (d > 0.0)
        idx = np.flatnonzero(near)
        fn = _C_EXPF
        fix = [fn(v) for v in x.reshape(-1)[idx].tolist()]  # before ``out`` (which may be ``x``) is written
    r: npt.NDArray[np.float32] = d.astype(np.float32) if out is None else out
    if out is not None:
        r[...] = d
    if fix:
        flat = r.reshape(-1)  # a view of a contiguous array (a copy otherwise: written back below)
        flat[idx] = fix
        if not np.shares_memory(flat, r):
            r[...] = flat.reshape(r.shape)
    return r
