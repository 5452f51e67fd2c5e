"""Grammar errors: all are :class:`GrammarError` (a ``ValueError``). ``GrammarError`` and
``GrammarSyntaxError`` belong to the GBNF front end (:mod:`llama_cffi.gbnf`) and are
re-exported here; :class:`SchemaError` is the JSON-schema converter's."""

from __future__ import annotations

from llama_cffi.errors import GrammarError, GrammarSyntaxError

__all__ = ["GrammarBudgetError", "GrammarError", "GrammarSyntaxError", "SchemaError", "SchemaTypeError"]


class GrammarBudgetError(GrammarError):
    """A parser state past the engine's budget: more than ``max_stacks`` stacks in one
    state (an ambiguous grammar can multiply its stacks with every character), or more
    than ``max_cells`` stacks in all. Raised by the step, walk or mask that met it; the
    matcher and the engine are left as they were before it (the state that was too large
    is not kept). Make the grammar less ambiguous, or raise the budget
    (``Grammar(..., max_stacks=...)``)."""


class SchemaError(GrammarError):
    """A JSON schema that cannot be converted (unsupported or invalid feature, named)."""


class SchemaTypeError(SchemaError, TypeError):
    """A schema argument of a type that holds no JSON schema (no JSON value, no text): a
    :class:`SchemaError` and a ``TypeError``; the message names the parameter."""
