"""Type checks for the public API's arguments, shared by ``llama_cffi`` and ``samplers``.

A value of the wrong type is a :class:`TypeError` whose message names the parameter and
says what it takes (``"store must be a samplers.branch.BranchStore, not Context"``), raised
before the value is used: never an ``AttributeError`` or ``KeyError`` from deep inside
(``tests/test_wrong_types.py`` calls every public callable with a wrong-typed argument).
Values of the right type but outside their range stay the callers' ``ParamError``s.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar, cast

import numpy as np

from .errors import ParamTypeError

T = TypeVar("T")

__all__ = [
    "expect",
    "expect_array",
    "expect_bool",
    "expect_callable",
    "expect_int",
    "expect_iterable",
    "expect_mapping",
    "expect_namespace",
    "expect_number",
    "expect_pairs",
    "expect_parser",
    "expect_path",
    "expect_str",
    "expect_strs",
    "expect_subparsers",
    "type_error",
]


def type_error(name: str, what: str, value: object) -> ParamTypeError:
    """``ParamTypeError("{name} must be {what}, not {type}")``: a ``TypeError`` and a
    :class:`~llama_cffi.errors.ParamError`."""
    return ParamTypeError(f"{name} must be {what}, not {type(value).__name__}")


def expect(name: str, value: Any, types: type[T] | tuple[type, ...], what: str) -> T:
    """``value`` when it is an instance of ``types``, else the TypeError naming ``name``."""
    if not isinstance(value, types):
        raise type_error(name, what, value)
    return cast(T, value)


def expect_int(name: str, value: object, what: str = "an int") -> int:
    """``value`` as an int (Python or numpy integers; not a bool)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise type_error(name, what, value)
    return int(value)


def expect_number(name: str, value: object, what: str = "a number") -> float:
    """``value`` as a float (ints and floats, Python or numpy; not a bool)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise type_error(name, what, value)
    return float(value)


def expect_bool(name: str, value: object) -> bool:
    """``value`` as a bool (``True``/``False``, numpy's, or the ints 0 and 1)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and int(value) in (0, 1):
        return bool(value)
    raise type_error(name, "a bool", value)


def expect_str(name: str, value: object, what: str = "a str") -> str:
    if not isinstance(value, str):
        raise type_error(name, what, value)
    return value


def expect_path(name: str, value: object) -> str:
    """``value`` (a str or an ``os.PathLike``) as a str path."""
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        path = os.fspath(value)
        if isinstance(path, str):
            return path
    raise type_error(name, "a path (a str or an os.PathLike)", value)


def expect_callable(name: str, value: T, what: str = "callable") -> T:
    if not callable(value):
        raise type_error(name, what, value)
    return value


def expect_mapping(name: str, value: object, what: str = "a mapping (a dict)") -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise type_error(name, what, value)
    return value


def expect_iterable(name: str, value: object, what: str) -> Iterable[Any]:
    """``value`` when it can be iterated (a list, a tuple, an array, a generator...)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise type_error(name, what, value)
    return value


def expect_array(name: str, value: object, what: str = "an array of numbers", kinds: str = "biuf") -> np.ndarray:
    """``value`` as a numpy array (a copy only when ``np.asarray`` makes one) whose dtype
    kind is one of ``kinds`` (``b``ool, ``i``nt, ``u``int, ``f``loat): anything numpy
    cannot read as numbers is the TypeError naming ``name``."""
    if isinstance(value, (str, bytes)) or value is None:
        raise type_error(name, what, value)
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):
        raise type_error(name, what, value) from None
    if arr.dtype.kind not in kinds and arr.size:  # an empty list is float64 to numpy: fine
        raise type_error(name, what, value)
    return arr


def expect_pairs(name: str, value: object, what: str) -> list[tuple[Any, Any]]:
    """``value`` (a mapping, or an iterable of 2-tuples) as a list of pairs."""
    if isinstance(value, Mapping):
        return list(value.items())
    pairs = list(expect_iterable(name, value, what))
    if not all(isinstance(p, tuple) and len(p) == 2 for p in pairs):
        raise type_error(name, what, value)
    return pairs


def expect_strs(name: str, value: object, what: str = "a sequence of str") -> list[str]:
    """``value`` (an iterable of str, not a str itself) as a list."""
    return [expect_str(name, v, what) for v in expect_iterable(name, value, what)]


def expect_namespace(name: str, value: object) -> Any:
    """Parsed command-line options (an ``argparse.Namespace``)."""
    import argparse

    return expect(name, value, argparse.Namespace, "an argparse.Namespace (parsed options)")


def expect_parser(name: str, value: object) -> Any:
    import argparse

    return expect(name, value, argparse.ArgumentParser, "an argparse.ArgumentParser")


def expect_subparsers(name: str, value: object) -> Any:
    """What ``ArgumentParser.add_subparsers()`` returns (a plugin's ``register`` takes it)."""
    import argparse

    return expect(name, value, argparse._SubParsersAction, "the subparsers of an ArgumentParser (add_subparsers())")
