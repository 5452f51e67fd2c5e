"""Grammar errors: all are :class:`GrammarError` (a ``ValueError``). ``GrammarError`` and
``GrammarSyntaxError`` belong to the GBNF front end (:mod:`llama_cffi.gbnf`) and are
re-exported here; :class:`SchemaError` is the JSON-schema converter's."""

from __future__ import annotations

from llama_cffi.errors import GrammarError, GrammarSyntaxError

__all__ = ["GrammarError", "GrammarSyntaxError", "SchemaError"]


class SchemaError(GrammarError):
    """A JSON schema that cannot be converted (unsupported or invalid feature, named)."""
