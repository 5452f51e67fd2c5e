"""Grammar errors: all are :class:`GrammarError` (a ``ValueError``). ``GrammarError`` and
``GrammarSyntaxError`` belong to the GBNF front end (:mod:`llama_cffi.gbnf`) and are
re-exported here; :class:`SchemaError` is the JSON-schema converter's."""

from __future__ import annotations

from llama_cffi.errors import GrammarError, GrammarSyntaxError

__all__ = ["GrammarError", "GrammarSyntaxError", "SchemaError", "SchemaTypeError"]


class SchemaError(GrammarError):
    """A JSON schema that cannot be converted (unsupported or invalid feature, named)."""


class SchemaTypeError(SchemaError, TypeError):
    """A schema argument of a type that holds no JSON schema (no JSON value, no text): a
    :class:`SchemaError` and a ``TypeError``; the message names the parameter."""
