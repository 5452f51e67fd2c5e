"""The grammar's in-memory form: llama.cpp's ``llama_grammar_element`` rules, as Python data.

A parsed grammar is exactly what llama.cpp's ``llama_grammar_parser`` produces
(``src/llama-grammar.h``): ``rules[rule_id]`` is a flat tuple of ``(type, value)``
elements, alternatives separated by ``ALT`` and the rule closed by ``END``; a character
class is a ``CHAR``/``CHAR_NOT``/``CHAR_ANY`` element followed by ``CHAR_RNG_UPPER`` and
``CHAR_ALT`` modifiers. Keeping llama.cpp's layout (and its rule ids, generated names
included) makes our matcher's semantics comparable element for element and lets the
printer reproduce llama.cpp's own print-out.

Token references: ``<[123]>`` is ``(TOKEN, 123)``. A named reference ``<|im_end|>``
needs a vocabulary, which a parsed grammar does not have; its value is then
``-(k + 1)`` where ``token_names[k]`` is the text between (and including) the angle
brackets, resolved to an id by :func:`resolve_tokens` when the grammar is compiled for
a vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum

#: llama.cpp's repetition limit (``MAX_REPETITION_THRESHOLD``): ``{m,n}`` counts above it
#: are refused (``m``) or treated as unbounded (``n``).
MAX_REPETITION_THRESHOLD = 2000


class GreType(IntEnum):
    """``enum llama_gretype`` (same values)."""

    END = 0
    ALT = 1
    RULE_REF = 2
    CHAR = 3
    CHAR_NOT = 4
    CHAR_RNG_UPPER = 5
    CHAR_ALT = 6
    CHAR_ANY = 7
    TOKEN = 8
    TOKEN_NOT = 9


#: One ``llama_grammar_element``: ``(GreType, value)``; value is a code point, a rule id
#: or a token id (negative: an unresolved named token, see the module docstring).
Element = tuple[int, int]
Rule = tuple[Element, ...]


@dataclass(frozen=True)
class ParsedGrammar:
    """A grammar as llama.cpp's parser leaves it.

    ``rules[i]`` is rule ``i`` (ending with ``(END, 0)``); ``symbol_ids`` maps every rule
    name to its id, generated names (``"value_7"``) included, exactly as llama.cpp
    numbers them; ``token_names`` lists named token references (see the module
    docstring). Immutable; shared freely between compiled grammars and matchers.
    """

    rules: tuple[Rule, ...]
    symbol_ids: Mapping[str, int]
    token_names: tuple[str, ...] = ()
    #: ``rule id -> name`` (derived).
    names: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [""] * len(self.rules)
        for name, i in self.symbol_ids.items():
            if 0 <= i < len(names):
                names[i] = name
        object.__setattr__(self, "names", tuple(names))

    def rule_id(self, name: str) -> int:
        """The id of rule ``name`` (KeyError if the grammar has none)."""
        return self.symbol_ids[name]


def resolve_tokens(grammar: ParsedGrammar, token_id: Callable[[str], int]) -> ParsedGrammar:
    """``grammar`` with each named token reference replaced by ``token_id(name)`` (which
    raises if ``name`` is not exactly one token of the vocabulary)."""
    if not grammar.token_names:
        return grammar
    ids = [token_id(name) for name in grammar.token_names]
    rules = tuple(
        tuple((t, ids[-v - 1]) if t in (GreType.TOKEN, GreType.TOKEN_NOT) and v < 0 else (t, v) for t, v in rule)
        for rule in grammar.rules
    )
    return ParsedGrammar(rules, grammar.symbol_ids, ())
