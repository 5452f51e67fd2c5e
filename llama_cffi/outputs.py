"""Zero-copy views of a context's outputs (logits, embeddings) that cannot go stale silently.

llama.cpp writes a decode's outputs into a buffer it owns and reuses on the next
decode (and reallocates when a decode asks for more outputs than ever before). The
views returned by :meth:`Context.logits` and friends are :class:`OutputView` arrays:

* zero-copy: the numpy array points straight into llama.cpp's buffer;
* guarded: any use after the next ``decode`` (or after ``close``) raises
  :class:`StaleOutputError` instead of returning another decode's numbers;
* ``.copy()`` (or ``np.array(view)``) gives an ordinary array that stays valid;
  ``np.asarray(view)`` gives the raw, unguarded view (valid until the next decode;
  this is what hot loops such as samplers use once per token);
* memory-safe across ``close()``: each decode's views hold a lease on the context,
  so its native memory is freed only after the last view is gone.

Computations on a view (``view * 2``, ``np.exp(view)``, ``view.argsort()``) return
ordinary arrays; views of a view (``view[:10]``) stay guarded.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import ClosedError, LlamaError


class StaleOutputError(LlamaError, RuntimeError):
    """An output view was used after the next decode (or after the context closed)."""


class OutputGuard:
    """Per-context generation counter shared by all views of that context."""

    __slots__ = ("closed", "generation")

    def __init__(self) -> None:
        self.generation = 0
        self.closed = False


# Attribute names that never read the data (numpy's protocol hooks and metadata).
_UNCHECKED = frozenset(
    {
        "shape",
        "dtype",
        "ndim",
        "size",
        "itemsize",
        "nbytes",
        "base",
        "flags",
        "strides",
        "_guard",
        "_gen",
        "_check",
        "__class__",
        "__dict__",
        "__len__",
        "__repr__",
        "__reduce__",
        "__reduce_ex__",
        "__setstate__",
        "__deepcopy__",
        "__copy__",
    }
)


def _plain(x: Any) -> Any:
    if isinstance(x, OutputView):
        x._check()
        return x.view(np.ndarray)
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(i) for i in x)
    return x


class OutputView(np.ndarray):
    """A guarded float32 view into llama.cpp's output buffer (see the module docstring)."""

    _guard: OutputGuard | None
    _gen: int

    def __array_finalize__(self, obj: Any) -> None:
        # views of a guarded view stay guarded; copies (which own their data) do not
        guard = getattr(obj, "_guard", None)
        self._guard = guard if guard is not None and self.base is not None else None
        self._gen = getattr(obj, "_gen", 0)

    def _check(self) -> None:
        g = object.__getattribute__(self, "_guard")
        if g is not None:
            if g.closed:
                raise ClosedError("this output view belongs to a closed context")
            if g.generation != object.__getattribute__(self, "_gen"):
                raise StaleOutputError(
                    "this output view is from an earlier decode; llama.cpp has reused its buffer "
                    "(call .copy() on views you want to keep)"
                )

    def __getattribute__(self, name: str) -> Any:
        if name not in _UNCHECKED and not name.startswith("__array"):
            object.__getattribute__(self, "_check")()
        return super().__getattribute__(name)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        inputs = tuple(_plain(i) for i in inputs)
        if "out" in kwargs:
            kwargs["out"] = tuple(_plain(o) for o in kwargs["out"])
        return getattr(ufunc, method)(*inputs, **kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return func(*_plain(tuple(args)), **{k: _plain(v) for k, v in kwargs.items()})

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:  # type: ignore[override]
        self._check()
        raw = self.view(np.ndarray)
        if copy:
            return np.array(raw, dtype=dtype, copy=True)
        return raw if dtype is None else raw.astype(dtype, copy=False)

    def __getitem__(self, key: Any) -> Any:
        self._check()
        out = super().__getitem__(key)
        if isinstance(out, OutputView) and out.base is None:
            return out.view(np.ndarray)  # fancy indexing made a copy: unguard it
        return out

    def __setitem__(self, key: Any, value: Any) -> None:
        self._check()
        super().__setitem__(key, value)

    def __iter__(self) -> Any:
        self._check()
        return iter(self.view(np.ndarray))

    def __repr__(self) -> str:
        g = object.__getattribute__(self, "_guard")
        if g is not None and (g.closed or g.generation != object.__getattribute__(self, "_gen")):
            return f"<stale OutputView shape={self.shape}>"
        return repr(self.view(np.ndarray)).replace("array(", "OutputView(", 1)

    def __str__(self) -> str:
        self._check()
        return str(self.view(np.ndarray))

    def copy(self, order: Any = "C") -> np.ndarray:
        """An ordinary array holding these values; stays valid after later decodes."""
        self._check()
        return np.array(self.view(np.ndarray), order=order, copy=True)

    def __reduce__(self) -> Any:
        return self.copy().__reduce__()


def make_view(raw: np.ndarray, guard: OutputGuard) -> OutputView:
    """Wrap a raw view of the current decode's outputs."""
    v = raw.view(OutputView)
    v._guard = guard
    v._gen = guard.generation
    return v
