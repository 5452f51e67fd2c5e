"""How large a schema's grammar may grow, and the tighter limits a conversion retries with.

A conversion runs under a :class:`Budget`. Where a construct would exceed it, the
converter writes a looser grammar for that construct and says so in a ``SchemaWarning``
whose message starts with ``relaxed:`` (see ``docs/guide/grammars.md`` for the list).
When the grammar as a whole still grows past ``max_rules`` rules, the conversion starts
again under the next, tighter budget of :data:`LEVELS`; past the last one the schema's
grammar is any JSON value. Every limit counts work (atoms, pairs, states, rules), never
time, so a schema converts to the same grammar on every machine.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LEVELS", "Budget", "TooLarge"]


class TooLarge(Exception):
    """The grammar, or the work of writing it, grew past the budget: the conversion starts
    again under the next one (never caught below :func:`schema_to_gbnf`, where an
    ``OverflowError`` means a construct too large for an automaton)."""


@dataclass(frozen=True)
class Budget:
    #: the most alternatives of one JSON type a union keeps (anyOf, and the products of
    #: allOf, oneOf, not, if); past it they are merged into ones that accept what each
    #: of them accepts
    max_atoms: int
    #: the products of alternatives a oneOf's exclusions (each alternative against the
    #: complements of the others) may take; past it the oneOf is read as anyOf
    one_of_work: int
    #: with keys in any order, every key of an object that declares at most this many is
    #: seen at most once; beyond, only the required ones are tracked
    tracked: int
    #: the most required keys tracked in any order (the others may be missing)
    tracked_required: int
    #: the most rules a grammar may have (its names; GBNF groups and repetitions add more
    #: when parsed)
    max_rules: int
    #: the most states of an array's automaton with ``contains`` counts, or of an
    #: object's with ``minProperties``/``maxProperties`` counts (past it: not enforced)
    max_states: int = 4096
    #: the patterns of ``patternProperties`` undeclared keys are told apart by (their
    #: classes are the subsets of them); past it a key may take either value
    pattern_classes: int = 4
    #: the pairs of alternatives a conversion may meet (intersect) in all: the work of
    #: allOf, if/then/else and not over unions (None: no limit)
    max_pairs: int | None = 100_000
    #: the most alternatives of one JSON type a union keeps (anyOf, a oneOf's
    #: alternatives; unions of unions multiply them); past it they are merged like a
    #: product's
    max_union: int = 256
    #: the most states of the automaton of "any key but the declared ones" (a key
    #: automaton is a rule per state); past it undeclared keys may be declared ones
    max_key_states: int = 2000


LEVELS = (
    Budget(max_atoms=32, one_of_work=4096, tracked=3, tracked_required=8, max_rules=20000),
    Budget(
        max_atoms=8,
        one_of_work=512,
        tracked=0,
        tracked_required=4,
        max_rules=20000,
        max_states=512,
        max_pairs=50_000,
        max_union=64,
        max_key_states=500,
    ),
    Budget(
        max_atoms=2,
        one_of_work=0,
        tracked=0,
        tracked_required=0,
        max_rules=20000,
        max_states=64,
        pattern_classes=1,
        max_pairs=None,
        max_union=16,
        max_key_states=100,
    ),
)
