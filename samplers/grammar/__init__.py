"""Grammar-constrained sampling: llama.cpp's GBNF in pure Python (numpy), and JSON Schema.

    g = Grammar.from_gbnf(open("json.gbnf").read())     # vocabulary-free
    g.accepts('{"a": 1}')                               # whole strings
    m = g.matcher(model)                                # per sequence (compiles once per vocab)
    m.allowed_tokens(); m.accept_token(t); m.rollback(1); m.fork()
    chain = SamplerChain([GrammarSampler(g, model), TopK(40), Dist(seed=1)])

Semantics are llama.cpp's grammar sampler's (tested mask for mask against it); masks
come from a walk of the vocabulary's token trie in C (the numpy walk kept as the
reference) and are cached by parser state (see :mod:`samplers.grammar.compiled`);
:func:`fill_masks` computes many matchers' masks in one call. GBNF text is
parsed and checked by the project's one GBNF front end, :mod:`llama_cffi.gbnf` (its
names are re-exported here).
"""

from llama_cffi.gbnf import GrammarError, GrammarSyntaxError, GreType, ParsedGrammar, check_grammar, parse_gbnf

from .compiled import CompiledGrammar
from .errors import GrammarBudgetError, SchemaError, SchemaTypeError
from .gbnf import format_gbnf
from .grammar import Grammar
from .json_schema import json_schema_to_gbnf
from .masks import fill_masks
from .matcher import GrammarMatcher
from .sampler import GrammarSampler
from .vocab_index import VocabIndex

__all__ = [
    "CompiledGrammar",
    "Grammar",
    "GrammarBudgetError",
    "GrammarError",
    "GrammarMatcher",
    "GrammarSampler",
    "GrammarSyntaxError",
    "GreType",
    "ParsedGrammar",
    "SchemaError",
    "SchemaTypeError",
    "VocabIndex",
    "check_grammar",
    "fill_masks",
    "format_gbnf",
    "json_schema_to_gbnf",
    "parse_gbnf",
]
