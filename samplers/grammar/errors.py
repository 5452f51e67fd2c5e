"""Grammar errors: all are :class:`GrammarError` (a ``ValueError``)."""

from __future__ import annotations

from llama_cffi.errors import LlamaError


class GrammarError(LlamaError, ValueError):
    """A grammar that cannot be used (undefined rule, missing root, left recursion, ...)."""


class GrammarSyntaxError(GrammarError):
    """GBNF text that does not parse. ``line`` and ``column`` are 1-based; ``expected``
    says what the parser wanted there."""

    def __init__(self, message: str, line: int, column: int, expected: str = "") -> None:
        super().__init__(f"{message} at line {line}, column {column}")
        self.line = line
        self.column = column
        self.expected = expected


class SchemaError(GrammarError):
    """A JSON schema that cannot be converted (unsupported or invalid feature, named)."""
