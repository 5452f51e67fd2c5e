"""Zero-copy views of a context's logits that can neither go stale silently nor dangle.

llama.cpp writes a decode's outputs into a buffer it owns, overwrites it on the next
decode, and *frees and reallocates* it when a decode needs more output rows than ever
before. :meth:`Context.logits` and friends therefore return :class:`OutputView`: an
array-like object (it works with numpy functions, ufuncs, operators and ndarray
methods) with three guarantees:

* **zero-copy**: it reads straight from llama.cpp's buffer;
* **guarded**: any use after the next decode, or after the context is closed, raises
  :class:`StaleOutputError` (or :class:`~llama_cffi.errors.ClosedError`) instead of
  returning another decode's numbers. ``view.copy()`` keeps the values;
* **never dangling**: a view only reaches the buffer through its guard. Raw arrays
  (``np.asarray(view)``, ``view[:10]``, ``view.reshape(...)``) are plain ndarrays into
  the buffer, valid until the next decode; while any exists, llama_cffi does not let
  llama.cpp move the buffer (a decode that would is split, or refused with
  :class:`LiveOutputError`), and the context's memory is freed only after the last
  of them is gone. Hot loops take ``np.asarray(view)`` once per token.

``isinstance(view, np.ndarray)`` is False: pass ``np.asarray(view)`` where an actual
ndarray is required.
"""

from __future__ import annotations

import inspect
import sys
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from ._args import expect, expect_int, expect_str
from .errors import ClosedError, InvalidBatchError, LlamaError, UnsupportedError


class StaleOutputError(LlamaError, RuntimeError):
    """An output view was used after the next decode (llama.cpp reused its buffer)."""


class LiveOutputError(InvalidBatchError):
    """A decode would make llama.cpp reallocate its output buffer while raw arrays from
    ``np.asarray(view)`` (or slices of a view) still point into it. Drop them, or keep
    ``.copy()`` instead, and decode again."""


class OutputGuard:
    """Per-context generation counter shared by all views of that context. ``unavailable``:
    why this context has no logits at all (an encoder-only model), raised on any read."""

    __slots__ = ("closed", "generation", "unavailable")

    def __init__(self) -> None:
        self.generation = 0
        self.closed = False
        self.unavailable: str | None = None


class OutputBuffer:
    """One mapping of llama.cpp's output buffer: ``flat`` is a float32 array over it whose
    numpy base is a lease on the context. Every raw array derived from ``flat`` has
    ``flat`` as its ``.base``, so its reference count tells whether raw arrays exist."""

    __slots__ = ("flat", "ptr")

    def __init__(self, ptr: Any, flat: np.ndarray) -> None:
        from ._binding import ffi

        self.ptr = expect("ptr", ptr, ffi.CData, "the output buffer's address (a cffi pointer)")
        self.flat = expect("flat", flat, np.ndarray, "a float32 numpy array over the buffer")

    def raw_arrays_alive(self) -> bool:
        # references: self.flat, and getrefcount's own argument
        return sys.getrefcount(self.flat) > 2


class OutputView(NDArrayOperatorsMixin):
    """A guarded, zero-copy float32 view of one decode's outputs (see the module docstring)."""

    __slots__ = ("__weakref__", "_buf", "_gen", "_guard", "_off", "_shape", "_why")
    __array_priority__ = 100

    def __init__(
        self, buf: OutputBuffer, offset: int, shape: tuple[int, ...], guard: OutputGuard, why: str | None = None
    ) -> None:
        self._buf = expect("buf", buf, OutputBuffer, "an OutputBuffer (views come from Context.logits and decode)")
        if (
            type(offset) is not int
            or type(shape) is not tuple
            or type(guard) is not OutputGuard
            or (why is not None and type(why) is not str)
        ):  # one cheap test on the decode path; the slow one names what is wrong
            offset = expect_int("offset", offset, "an int (the first value's index in the buffer)")
            what = "a tuple of ints (the view's shape)"
            shape = tuple(expect_int("shape", n, what) for n in expect("shape", shape, tuple, what))
            expect("guard", guard, OutputGuard, "the context's OutputGuard")
            if why is not None:
                expect_str("why", why, "a str (why the rows cannot be read) or None")
        self._off = offset
        self._shape = shape
        self._guard = guard
        self._gen = guard.generation
        #: why these rows may not be read (llama.cpp did not write them: a sequence sampled
        #: on the device), raised as UnsupportedError on any read; None: readable
        self._why = why

    # -- the guard
    def _check(self) -> None:
        g = self._guard
        if g.closed:
            raise ClosedError("this output view belongs to a closed context")
        if g.unavailable is not None:
            raise UnsupportedError(g.unavailable)
        if self._why is not None:
            raise UnsupportedError(self._why)
        if g.generation != self._gen:
            raise StaleOutputError(
                "this output view is from an earlier decode; llama.cpp has reused its buffer "
                "(call .copy() on views you want to keep)"
            )

    @property
    def stale(self) -> bool:
        """True once the view may no longer be read."""
        return self._guard.closed or self._guard.generation != self._gen

    def _raw(self) -> np.ndarray:
        self._check()
        n = 1
        for d in self._shape:
            n *= d
        return self._buf.flat[self._off : self._off + n].reshape(self._shape)

    # -- metadata (no data access)
    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        n = 1
        for d in self._shape:
            n *= d
        return n

    @property
    def dtype(self) -> np.dtype[np.float32]:
        return np.dtype(np.float32)

    @property
    def nbytes(self) -> int:
        return 4 * self.size

    def __len__(self) -> int:
        return self._shape[0]

    # -- numpy protocols
    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raw = self._raw()
        if copy:
            return np.array(raw, dtype=dtype, copy=True)
        return raw if dtype is None else raw.astype(dtype, copy=False)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        inputs = tuple(_unwrap(i) for i in inputs)
        if "out" in kwargs:
            kwargs["out"] = tuple(_unwrap(o) for o in kwargs["out"])
        return getattr(ufunc, method)(*inputs, **kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return func(*_unwrap(tuple(args)), **{k: _unwrap(v) for k, v in kwargs.items()})

    # -- data access
    def __getitem__(self, key: Any) -> Any:
        return self._raw()[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._raw()[key] = _unwrap(value)

    def __iter__(self) -> Any:
        return iter(self._raw())

    if TYPE_CHECKING:
        # for type checkers only: the ndarray forwarders are attached below at import time
        def __getattr__(self, name: str) -> Any: ...

    def copy(self, order: Any = "C") -> np.ndarray:
        """An ordinary array holding these values; stays valid after later decodes."""
        return np.array(self._raw(), order=order, copy=True)

    def tolist(self) -> Any:
        return self._raw().tolist()

    def __repr__(self) -> str:
        if self.stale:
            return f"<stale OutputView shape={self._shape}>"
        return repr(self._raw()).replace("array(", "OutputView(", 1)

    def __str__(self) -> str:
        return str(self._raw())

    def __reduce__(self) -> Any:
        return (np.array, (self.copy(),))

    def __bool__(self) -> bool:
        return bool(self._raw())


def _unwrap(x: Any) -> Any:
    if isinstance(x, OutputView):
        return x._raw()
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(i) for i in x)
    return x


def _forwarder(name: str, is_attribute: bool) -> Any:
    if is_attribute:
        return property(lambda self: getattr(self._raw(), name), doc=f"``ndarray.{name}`` of the guarded view.")

    def method(self: OutputView, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._raw(), name)(*_unwrap(args), **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"``ndarray.{name}`` on the guarded view (raises once the view is stale)."
    return method


# Every other public ndarray method and attribute (argmax, max, argsort, T, ...), each
# checking the guard first. Explicit class attributes rather than __getattr__: numpy probes
# objects for __array_struct__/__array_interface__, and a Python __getattr__ would make
# each miss raise an exception (it doubled the cost of np.asarray(view)).
for _name in dir(np.ndarray):
    if not _name.startswith("_") and _name not in OutputView.__dict__ and _name not in NDArrayOperatorsMixin.__dict__:
        setattr(OutputView, _name, _forwarder(_name, not callable(inspect.getattr_static(np.ndarray, _name))))
del _name
