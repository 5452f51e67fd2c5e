"""Vectorised numeric kernels over one row of float32 logits, in C inside ``_llama``.

numpy's float32 ``exp`` is not vectorised on most x86 builds (about 2.5 ns per value:
0.7 ms for a 262,144-token vocabulary), which made per-token measurement the largest
host cost of batched branch generation. These kernels run ggml's own ``soft_max``
loop (``ggml_vec_soft_max_f32``, built for the instruction sets the native build
chose; :data:`SOFTMAX_IMPL` says which one is linked) with the GIL released.

Arguments are checked here (1-D, C-contiguous, float32, equal lengths) so a wrong
array raises instead of reading out of bounds. Values are not checked: callers pass
``max = row.max()`` after refusing NaN/``+inf`` rows (:mod:`samplers.measure` does).

Ownership: nothing is retained; ``out`` is written, ``row`` only read.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ._binding import ffi, lib

__all__ = ["SOFTMAX_IMPL", "softmax_dot", "softmax_sum", "top_k_grouped"]

#: ``"ggml_vec_soft_max_f32"`` (ggml's SIMD kernel) or ``"scalar"`` (a plain C loop,
#: when the static libraries did not define it).
SOFTMAX_IMPL: str = ffi.string(lib.llama_cffi_softmax_impl()).decode()


def _check(name: str, a: npt.NDArray[np.float32]) -> None:
    if not isinstance(a, np.ndarray) or a.dtype != np.float32 or a.ndim != 1 or not a.flags.c_contiguous:
        raise TypeError(f"{name} must be a 1-D C-contiguous float32 ndarray")


def softmax_sum(row: npt.NDArray[np.float32], max_value: float, out: npt.NDArray[np.float32]) -> float:
    """``sum(exp(row - max_value))`` accumulated in float64; ``out[:] = exp(row - max_value)``
    in float32 (``out`` may be ``row`` itself). ``max_value + log(result)`` is the
    log-partition function of ``softmax(row)`` when ``max_value = row.max()``."""
    _check("row", row)
    _check("out", out)
    if out.shape[0] != row.shape[0]:
        raise ValueError(f"out has {out.shape[0]} values, row has {row.shape[0]}")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    n = row.shape[0]
    return float(
        lib.llama_cffi_softmax_sum(n, ffi.from_buffer("float[]", out), ffi.from_buffer("float[]", row), max_value)
    )


def softmax_dot(exps: npt.NDArray[np.float32], row: npt.NDArray[np.float32], max_value: float) -> float:
    """``sum(exps_i * (row_i - max_value))`` in float64 over the ``i`` with ``exps_i != 0``
    (so ``-inf`` logits add nothing); with ``exps`` from :func:`softmax_sum` and ``s`` its
    result, the entropy of ``softmax(row)`` is ``log(s) - softmax_dot(...) / s`` nats."""
    _check("exps", exps)
    _check("row", row)
    if exps.shape[0] != row.shape[0]:
        raise ValueError(f"exps has {exps.shape[0]} values, row has {row.shape[0]}")
    return float(
        lib.llama_cffi_softmax_dot(
            row.shape[0], ffi.from_buffer("float[]", exps), ffi.from_buffer("float[]", row), max_value
        )
    )


_GROUPS = 64


def top_k_grouped(
    row: npt.NDArray[np.float32], gmax: npt.NDArray[np.float32], k: int, out: npt.NDArray[np.intp]
) -> npt.NDArray[np.intp]:
    """The positions of the ``k`` largest values of ``row``, largest first, ties by lower
    position (a stable sort by ``-row``, cut to ``k``), written to ``out[:k]`` and returned
    as that slice.

    ``gmax`` summarises ``row``: with ``cols = len(gmax)``, ``gmax[c]`` is the max of
    ``row[g * cols + c]`` over ``g < 64`` (``row[:64 * cols].reshape(64, cols).max(0)``);
    values past ``64 * cols`` are the tail. The k-th largest group max is a threshold that
    at least ``k`` values reach, so the kernel reads only the groups that reach it: a few
    microseconds at any vocabulary. ``row`` must hold no NaN (checked by whoever made
    ``gmax``: a NaN group max is NaN). Requires ``1 <= k <= cols`` and ``64 * cols <= len(row)``.
    """
    _check("row", row)
    _check("gmax", gmax)
    n, cols = row.shape[0], gmax.shape[0]
    if not 1 <= k <= cols or cols * _GROUPS > n:
        raise ValueError(f"need 1 <= k <= len(gmax) and 64 * len(gmax) <= len(row): k={k}, {cols} groups, {n} values")
    if not isinstance(out, np.ndarray) or out.dtype != np.intp or out.ndim != 1 or len(out) < k:
        raise TypeError(f"out must be a 1-D intp ndarray of at least {k} entries")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be C-contiguous and writable")
    return _top_k_grouped(row, gmax, k, out)


def _group_max(row: npt.NDArray[np.float32], gmax: npt.NDArray[np.float32]) -> float:
    """Fill ``gmax`` with the summary :func:`top_k_grouped` reads (``cols = len(gmax)``,
    ``64 * cols <= len(row)``; no argument checks) and return ``row``'s max, tail included:
    one pass over the row, and NaN when any value is NaN (a max over a NaN is NaN)."""
    cols = gmax.shape[0]
    np.maximum.reduce(row[: cols * _GROUPS].reshape(_GROUPS, cols), axis=0, out=gmax)
    m = gmax.max()
    if cols * _GROUPS < row.shape[0]:
        m = np.maximum(m, row[cols * _GROUPS :].max())
    return float(m)


def _top_k_grouped(
    row: npt.NDArray[np.float32], gmax: npt.NDArray[np.float32], k: int, out: npt.NDArray[np.intp]
) -> npt.NDArray[np.intp]:
    """:func:`top_k_grouped` without the argument checks, for callers that own the arrays."""
    got = lib.llama_cffi_top_k_grouped(
        row.shape[0],
        ffi.from_buffer("float[]", row),
        gmax.shape[0],
        ffi.from_buffer("float[]", gmax),
        k,
        ffi.from_buffer("int64_t[]", out),
    )
    if got != k:
        raise MemoryError("top_k_grouped: out of memory")
    return out[:k]
