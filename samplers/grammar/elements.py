"""The grammar's in-memory form (llama.cpp's ``llama_grammar_element`` rules as Python
data): defined by the GBNF front end, :mod:`llama_cffi.gbnf`, and re-exported here."""

from __future__ import annotations

from llama_cffi.gbnf import MAX_REPETITION_THRESHOLD, Element, GreType, ParsedGrammar, Rule, resolve_tokens

__all__ = ["MAX_REPETITION_THRESHOLD", "Element", "GreType", "ParsedGrammar", "Rule", "resolve_tokens"]
