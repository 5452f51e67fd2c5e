"""Ownership of one native pointer: free exactly once, never while something depends on it.

Every native object in the package (model, LoRA adapter, context, ...) keeps its
pointer in a :class:`NativeHandle`. The rules it enforces:

* ``close()`` is idempotent; after it, ``get()`` raises :class:`ClosedError`.
* A handle created with a ``parent`` keeps the parent alive (a strong reference) and
  counts as its dependent; a parent's pointer is freed only once every dependent has
  been freed. Closing a model while a context still uses it therefore marks the model
  closed at once and frees it when the last context goes.
* A garbage-collected owner is freed by ``weakref.finalize`` (the safety net, also
  run at interpreter exit). The finalizer holds the handle, the handle holds the
  parent: so a model can never be freed before its contexts, whatever order the
  collector picks.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from ._binding import ffi
from .errors import ClosedError

_lock = threading.RLock()


class NativeHandle:
    """One owned native pointer (see the module docstring)."""

    #: The lock, as a class attribute: at interpreter exit module globals become None while
    #: finalizers (an output view's ``ffi.gc`` callback calling :meth:`unpin`) still run.
    _guard = _lock
    _NULL = ffi.NULL

    __slots__ = (
        "__weakref__",
        "_children",
        "_close_requested",
        "_finalizer",
        "_free",
        "_parent",
        "ptr",
        "what",
    )

    def __init__(
        self,
        owner: object,
        ptr: Any,
        free: Callable[[Any], object],
        what: str,
        parent: NativeHandle | None = None,
    ) -> None:
        self.ptr = ptr
        self.what = what
        self._free = free
        self._children = 0
        self._close_requested = False
        self._parent = parent
        if parent is not None:
            with self._guard:
                if parent._close_requested:
                    raise ClosedError(f"{parent.what} is closed")
                parent._children += 1
        self._finalizer = weakref.finalize(owner, self.close)

    @property
    def closed(self) -> bool:
        return self._close_requested

    def get(self) -> Any:
        """The pointer, or :class:`ClosedError` if ``close()`` was called."""
        if self._close_requested:
            raise ClosedError(f"{self.what} is closed")
        return self.ptr

    def pin(self) -> None:
        """Count one more dependent that is not a NativeHandle (an output view, an applied
        adapter): the pointer is not freed until the matching :meth:`unpin`."""
        with self._guard:
            if self.ptr is None or self.ptr == self._NULL:
                raise ClosedError(f"{self.what} is closed")
            self._children += 1

    def unpin(self) -> None:
        with self._guard:
            self._children -= 1
            self._maybe_free()

    def close(self) -> None:
        with self._guard:
            self._close_requested = True
            self._maybe_free()

    def _maybe_free(self) -> None:
        if self._children or self.ptr is None or self.ptr == self._NULL or not self._close_requested:
            if self._close_requested and (self.ptr is None or self.ptr == self._NULL):
                self._release_parent()
            return
        ptr, self.ptr = self.ptr, self._NULL
        self._finalizer.detach()
        self._free(ptr)
        self._release_parent()

    def _release_parent(self) -> None:
        parent, self._parent = self._parent, None
        if parent is not None:
            parent._children -= 1
            parent._maybe_free()


_O = TypeVar("_O", bound="HandleOwner")


class HandleOwner:
    """What an object owning one :class:`NativeHandle` (its ``_handle``) offers: ``_ptr()``
    (the pointer, :class:`ClosedError` once closed), ``close()`` (idempotent), ``closed``,
    and ``with`` (closes at the end of the block)."""

    _handle: NativeHandle | None = None

    def _ptr(self) -> Any:
        assert self._handle is not None
        return self._handle.get()

    def close(self) -> None:
        """Free the native object (idempotent; deferred while a dependent still uses it)."""
        if self._handle is not None:
            self._handle.close()

    @property
    def closed(self) -> bool:
        return self._handle is None or self._handle.closed

    def __enter__(self: _O) -> _O:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
