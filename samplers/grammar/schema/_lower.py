"""A JSON schema lowered to a union of per-type constraints ("atoms"), the form a
grammar is written from.

Every schema denotes a set of JSON values; this module writes that set as a list of
atoms, each one JSON type with its constraints (:class:`Null`, :class:`Bool`,
:class:`Num`, :class:`Str`, :class:`Arr`, :class:`Obj`, and :class:`Const` for finite
sets of values). ``allOf`` intersects atoms of the same type, ``anyOf`` unites lists,
``oneOf``, ``not`` and ``if``/``then``/``else`` use complements, which exist for most
constraints (a number's bounds, ``required``, ``minItems``, ``items`` against
``contains``, a pattern through :mod:`.dfa`, ...). Subschemas of arrays and objects stay
:class:`Node` s (a schema in its resolution scope, or an operation on nodes) until the
grammar writer asks for them, so recursive schemas terminate.

``$ref``, ``$dynamicRef``, ``$id``, ``$anchor`` and remote documents are resolved by
``referencing`` (the library ``jsonschema`` uses), with jsonschema's scoping rules.
What a grammar cannot enforce is reported through ``warn(keyword, pointer, message)``.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any
from urllib.parse import unquote

from ..errors import SchemaError
from ._budget import LEVELS, Budget, TooLarge
from ._drafts import SUBSCHEMA_MANY, SUBSCHEMA_NAMED, SUBSCHEMA_ONE
from ._numbers import NumberSpec

__all__ = ["Lowering", "Node"]

Warn = Callable[[str, str, str], None]

# --- nodes: subschemas, lazily lowered ----------------------------------------------


class Node:
    """A subschema in scope (``op == "schema"``: ``schema`` and ``resolver``), or an
    operation on nodes: ``allOf``, ``anyOf``, ``not``, or ``const`` (``value``). Nodes
    are equal when their ``key`` s are; not to be changed once made (a plain class with
    slots, not a frozen dataclass: the converter makes thousands)."""

    __slots__ = ("h", "key", "op", "parts", "ptr", "resolver", "schema")

    def __init__(
        self,
        op: str,
        parts: tuple[Node, ...] = (),
        schema: Any = None,
        resolver: Any = None,
        ptr: str = "#",
        key: tuple[Any, ...] = (),
    ) -> None:
        self.op = op
        self.parts = parts
        self.schema = schema
        self.resolver = resolver
        self.ptr = ptr
        self.key = key
        #: hash(key), computed once (keys nest: hashing one walks the whole tuple)
        self.h = hash(key)

    def __hash__(self) -> int:
        return self.h

    def __repr__(self) -> str:
        return f"Node({self.op}, {self.ptr})"

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, Node) and self.h == other.h and self.key == other.key)


def op_node(op: str, parts: tuple[Node, ...]) -> Node:
    flat: list[Node] = []
    for p in parts:
        if p.op == op and op in ("allOf", "anyOf"):
            flat.extend(p.parts)
        else:
            flat.append(p)
    uniq = tuple(dict.fromkeys(flat))
    if op in ("allOf", "anyOf") and len(uniq) == 1:
        return uniq[0]
    # a node the converter makes (a property's value in a merged object, a complement's
    # parts) reports at its first part's pointer: "#" would name the document's root
    ptr = next((q.ptr for q in uniq if q.ptr != "#"), "#")
    return Node(op, uniq, ptr=ptr, key=(op, uniq))  # the parts themselves: their hashes are kept


TRUE = Node("true", key=("true",))
FALSE = Node("false", key=("false",))


def all_of(*parts: Node | None) -> Node:
    if len(parts) == 1 and parts[0] is not None and parts[0].op != "allOf":
        # one part (a property's value, most often): the part itself, as below
        key = parts[0].key
        return TRUE if key == ("true",) else FALSE if key == ("false",) else parts[0]
    ps = tuple(p for p in parts if p is not None and p is not TRUE and p.key != ("true",))
    if any(p.key == ("false",) for p in ps):
        return FALSE
    if not ps:
        return TRUE
    return op_node("allOf", ps)


def any_of(*parts: Node) -> Node:
    ps = tuple(p for p in parts if p.key != ("false",))
    if any(p.key == ("true",) for p in ps):
        return TRUE
    if not ps:
        return FALSE
    return op_node("anyOf", ps)


def not_node(p: Node) -> Node:
    if p.key == ("true",):
        return FALSE
    if p.key == ("false",):
        return TRUE
    if p.op == "not":
        return p.parts[0]
    return Node("not", (p,), key=("not", p))


def const_node(value: Any) -> Node:
    return Node("const", schema=value, key=("const", canon(value)))


# --- atoms ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Null:
    type = "null"


@dataclass(frozen=True)
class Bool:
    values: frozenset[bool] = frozenset({True, False})
    type = "boolean"


@dataclass(frozen=True)
class Num:
    spec: NumberSpec = field(default_factory=NumberSpec)
    non_integer: bool = False
    excluded: tuple[Fraction, ...] = ()
    type = "number"


@dataclass(frozen=True)
class Str:
    min_len: int = 0
    max_len: int | None = None
    patterns: tuple[str, ...] = ()
    not_patterns: tuple[str, ...] = ()
    formats: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    #: (min, max) length ranges the length must avoid (from complements)
    not_lengths: tuple[tuple[int, int | None], ...] = ()
    type = "string"


@dataclass(frozen=True)
class Arr:
    prefix: tuple[Node, ...] = ()
    items: Node = TRUE
    min_items: int = 0
    max_items: int | None = None
    contains: tuple[tuple[Node, int, int | None], ...] = ()
    unique: bool = False
    #: unevaluatedItems in scope: (evaluated prefix length, contains nodes, schema)
    uneval: tuple[tuple[int, tuple[Node, ...], Node], ...] = ()
    ev_prefix: int = 0
    ev_all: bool = False
    ev_contains: tuple[Node, ...] = ()
    type = "array"


@dataclass(frozen=True)
class Obj:
    props: tuple[tuple[str, Node], ...] = ()
    patterns: tuple[tuple[str, Node], ...] = ()
    #: additionalProperties: (the names and patterns it does not apply to, schema)
    additional: tuple[tuple[frozenset[str], tuple[str, ...], Node], ...] = ()
    required: frozenset[str] = frozenset()
    forbidden: frozenset[str] = frozenset()
    min_props: int = 0
    max_props: int | None = None
    names: tuple[Node, ...] = ()
    uneval: tuple[tuple[frozenset[str], tuple[str, ...], Node], ...] = ()
    ev_names: frozenset[str] = frozenset()
    ev_patterns: tuple[str, ...] = ()
    ev_all: bool = False
    #: key -> the nodes of props under that key (built on first use)
    _by_key: Any = field(default=None, compare=False, repr=False)
    type = "object"

    def declared(self, key: str) -> list[Node]:
        """The ``props`` entries of ``key`` (one per merged schema that declares it)."""
        index = self._by_key
        if index is None:
            index = {}
            for k, n in self.props:
                index.setdefault(k, []).append(n)
            object.__setattr__(self, "_by_key", index)
        return list(index.get(key, ()))

    def prop(self, name: str) -> Node:
        return all_of(*(n for k, n in self.props if k == name))


@dataclass(frozen=True)
class Const:
    """One of a finite set of JSON values (canonical JSON texts)."""

    values: tuple[Any, ...]
    #: each value's canonical text (:func:`canon`), and their set: computed once
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)
    keyset: frozenset[str] = field(default=frozenset(), compare=False, repr=False)
    #: JSON type -> the constant of the values of that type (built on first use)
    _by_type: Any = field(default=None, compare=False, repr=False)
    type = "const"

    def __post_init__(self) -> None:
        keys = tuple(canon(v) for v in self.values)
        object.__setattr__(self, "keys", keys)
        object.__setattr__(self, "keyset", frozenset(keys))

    def of_type(self, t: str) -> Const | None:
        """The values of JSON type ``t`` (None: there are none): the meet with every
        value of the type, one object per type however often it is asked for."""
        index = self._by_type
        if index is None:
            groups: dict[str, list[Any]] = {}
            for v in self.values:
                groups.setdefault(json_type(v), []).append(v)
            index = {k: Const(tuple(vs)) for k, vs in groups.items()}
            object.__setattr__(self, "_by_type", index)
        found: Const | None = index.get(t)
        return found


Atom = Null | Bool | Num | Str | Arr | Obj | Const
ANY: tuple[Atom, ...] = (Null(), Bool(), Num(), Str(), Arr(), Obj())
TYPE_ATOM = {a.type: a for a in ANY}
#: the atoms of every value but objects
_NON_OBJECT: tuple[Atom, ...] = tuple(a for a in ANY if a.type != "object")


def canon(value: Any) -> str:
    """A JSON value's canonical text: numbers by their exact decimal (``1`` and ``1.0``
    are one), object keys sorted."""
    if isinstance(value, str | bool | int) or value is None:
        return _canon_scalar(type(value).__name__, value)
    return _canon(value)


@functools.lru_cache(maxsize=8192)
def _canon_scalar(kind: str, value: Any) -> str:  # kind: True and 1 are different keys
    return _canon(value)


def _canon(value: Any) -> str:
    import json

    def norm(v: Any) -> Any:
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return v
        if isinstance(v, int | float):
            f = decimal(v) if not isinstance(v, float) or math.isfinite(v) else v
            return ["#num", str(f)]
        if isinstance(v, list):
            return [norm(x) for x in v]
        if isinstance(v, dict):
            return {k: norm(x) for k, x in v.items()}
        return v

    return json.dumps(norm(value), sort_keys=True)


def decimal(v: int | float) -> Fraction:
    """A JSON number's exact value as written: ``1.1`` is 11/10, not the binary double
    nearest to it (bounds, constants and the grammar's digits all mean the decimal)."""
    return Fraction(str(v)) if isinstance(v, float) else Fraction(v)


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


# --- the lowering ---------------------------------------------------------------------

_DRAFT_KEYWORDS = {
    "draft4": {"const": False, "contains": False, "propertyNames": False, "if": False, "2019": False},
    "draft6": {"const": True, "contains": True, "propertyNames": True, "if": False, "2019": False},
    "draft7": {"const": True, "contains": True, "propertyNames": True, "if": True, "2019": False},
    "draft2019-09": {"const": True, "contains": True, "propertyNames": True, "if": True, "2019": True},
    "draft2020-12": {"const": True, "contains": True, "propertyNames": True, "if": True, "2019": True},
}
_SPEC_DRAFT = {
    "draft-04": "draft4",
    "draft-03": "draft4",
    "draft-06": "draft6",
    "draft-07": "draft7",
    "draft2019-09": "draft2019-09",
    "draft2020-12": "draft2020-12",
}


class Lowering:
    """Lowers nodes of one document (and its registry) to atom lists, memoised."""

    def __init__(self, warn: Warn, formats: bool, budget: Budget = LEVELS[0]) -> None:
        self.warn = warn
        self.formats = formats
        self.max_atoms = budget.max_atoms
        self.one_of_work = budget.one_of_work
        self.max_pairs = budget.max_pairs
        self.max_union = budget.max_union
        self._memo: dict[tuple[Node, bool], tuple[Atom, ...]] = {}
        self._busy: set[tuple[Node, bool]] = set()
        #: (base URI, $ref) -> what the reference resolves to (see :meth:`_ref`)
        self._lookups: dict[tuple[str, str], Any] = {}
        #: (base URI, $ref) -> why the reference does not resolve in its scope
        self._unresolved: dict[tuple[str, str], str] = {}
        #: the registry once a lookup has crawled it (see :meth:`_with_crawled`)
        self._crawled: Any = None
        #: a schema value's shape: equal shapes for equal JSON values (see :meth:`shape`)
        self._shapes: dict[Any, int] = {}
        #: id(dict or list) -> (the value, kept alive so that its id stays its own; its shape)
        self._shape_of: dict[int, tuple[Any, int]] = {}
        self._value_shape_of: dict[int, tuple[Any, int]] = {}
        #: whether the atoms being lowered will be complemented (an odd number of
        #: complements above): relaxations then accept less (see :meth:`lower`)
        self.neg = False
        #: the pointers of the nodes being lowered (where a relaxation is reported)
        self._where: list[str] = []
        #: atom pairs met so far, and the count at which the innermost oneOf gives up
        self._pairs = 0
        self._limit: int | None = None
        #: (constant's keys, atom, neg) -> their meet (see :meth:`meet`)
        self._const_meets: dict[tuple[Any, ...], Const | None] = {}

    # nodes ------------------------------------------------------------------------

    def node(self, schema: Any, resolver: Any, ptr: str, enter: bool = True) -> Node:
        """The node of ``schema`` in ``resolver``'s scope (entering its ``$id`` if any,
        unless ``enter`` is false: a resolver from a reference lookup is already there)."""
        if schema is True:
            return TRUE
        if schema is False:
            return FALSE
        if not isinstance(schema, dict):
            raise SchemaError(
                f"JSON schema error at {ptr}: a schema must be an object or a boolean, not {schema!r:.60}"
            )
        try:
            # (every draft's identifier is "$id" or "id": a schema without either has none)
            if not enter or ("$id" not in schema and "id" not in schema) or self.specification.id_of(schema) is None:
                sub = resolver  # what in_subresource gives a schema without an identifier
            else:
                sub = resolver.in_subresource(self.specification.create_resource(schema))
        except Exception as e:
            # an identifier referencing cannot read (draft 4's id given an object: a property
            # written where a keyword goes): the schema stays in its parent's scope
            self.warn("$id", ptr, f"ignored: the identifier is not one ({type(e).__name__}: {e})")
            sub = resolver
        scope = tuple(dict.fromkeys(u for u, _ in sub.dynamic_scope())) if self.dynamic else ()
        # (the document itself is a node of its own: its shape would walk all of it, the
        # definitions no reference reaches included)
        key = ("schema", -1 if schema is self.root_doc else self.shape(schema), sub._base_uri, scope)
        return Node("schema", schema=schema, resolver=sub, ptr=ptr, key=key)

    def shape(self, v: Any) -> Any:
        """A hashable stand-in for the subschema ``v``: equal for subschemas that differ
        only in annotations (``description``, ``title``, ``default``, ``examples``, ``x-``
        extensions: :data:`_NOT_READ`), so that the copies of one definition written out
        inline (as in Kubernetes' schemas) are one node, lowered and written once. Keys
        count in their order (``properties`` order is the default key order)."""
        if not isinstance(v, dict):
            return self._value_shape(v)
        hit = self._shape_of.get(id(v))
        if hit is not None:
            return hit[1]
        parts: list[Any] = [0]
        kinds = _KEY_KINDS
        for k, x in v.items():
            kind = kinds.get(k, 0) if type(k) is str else 4
            if kind == 1 or (kind == 0 and k.startswith("x-")):
                continue
            if kind == 2:
                parts.append((k, self.shape(x) if not isinstance(x, list) else (1, *map(self.shape, x))))
            elif kind == 3 and isinstance(x, dict):
                parts.append((k, (2, *[(name, self.shape(y)) for name, y in x.items()])))
            else:
                parts.append((k, self._value_shape(x)))
        sid = self._shapes.setdefault(tuple(parts), len(self._shapes))
        self._shape_of[id(v)] = (v, sid)
        return sid

    def _value_shape(self, v: Any) -> Any:
        """A hashable stand-in for a JSON value (every key counts), equal for equal values
        of the same types."""
        if isinstance(v, dict | list):
            hit = self._value_shape_of.get(id(v))
            if hit is not None:
                return hit[1]
            sub = self._value_shape
            t = (3, *[(k, sub(x)) for k, x in v.items()]) if isinstance(v, dict) else (4, *map(sub, v))
            sid = self._shapes.setdefault(t, len(self._shapes))
            self._value_shape_of[id(v)] = (v, sid)
            return sid
        if type(v) is str:
            return v  # (every other value is an int or a tuple)
        return (type(v), repr(v) if isinstance(v, float) else v)

    def draft(self) -> str:
        # (a Lowering not yet given its document's specification reads as 2020-12)
        return _SPEC_DRAFT.get(getattr(self.specification, "name", ""), "draft2020-12")

    # lowering ---------------------------------------------------------------------

    def lower(self, n: Node) -> tuple[Atom, ...]:
        """The atoms of node ``n``. Where the converter relaxes (a budget, a construct it
        cannot write), the atoms accept more than ``n`` while :attr:`neg` is false and
        less while it is true: under a complement (``not``, ``oneOf``'s exclusions, the
        ``else`` of an ``if``) the input is lowered with :attr:`neg` flipped, so that the
        complement of what it gives accepts more, never less, than the exact complement."""
        if n.op == "true":
            return ANY
        if n.op == "false":
            return ()
        key = (n, self.neg)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        if key in self._busy:
            # X = allOf [X, Y] (or anyOf, or a $ref chain back to itself) before any
            # property or item: a validator recurses without end; read as no constraint
            # (accepting more, or under a complement nothing)
            self.warn("$ref", n.ptr, "ignored: the schema refers to itself without nesting")
            return () if self.neg else ANY
        self._busy.add(key)
        self._where.append(n.ptr)
        try:
            if n.op == "schema":
                out = self._schema(n)
            elif n.op == "allOf":
                out = ANY
                for p in n.parts:
                    out = self.intersect(out, self.lower(p))
            elif n.op == "anyOf":
                out = self.union(*(self.lower(p) for p in n.parts))
            elif n.op == "not":
                out = self.complement(self.lower_flipped(n.parts[0]), n.parts[0].ptr)
            elif n.op == "const":
                out = (Const((n.schema,)),)
            else:
                raise AssertionError(n.op)
        finally:
            self._busy.discard(key)
            self._where.pop()
        self._memo[key] = out
        return out

    def lower_flipped(self, n: Node) -> tuple[Atom, ...]:
        """:meth:`lower` with :attr:`neg` flipped: what a complement is taken of."""
        return self.lower_as(n, not self.neg)

    def lower_as(self, n: Node, neg: bool) -> tuple[Atom, ...]:
        saved, self.neg = self.neg, neg
        try:
            return self.lower(n)
        finally:
            self.neg = saved

    def loose(self, base: Atom) -> tuple[Atom, ...]:
        """What an unenforceable construct of ``base``'s type becomes: every value of the
        type (accepting more), or under a complement none (so the complement accepts more)."""
        return () if self.neg else (base,)

    def union(self, *lists: tuple[Atom, ...]) -> tuple[Atom, ...]:
        out = _dedupe(a for atoms in lists for a in atoms)
        if 8 < len(out) <= 2 * self.max_atoms:
            out = self.prune(out)
        if len(out) > self.max_union:
            out = self.cap(out, {t: self.max_union for t in _type_counts(tuple(out))})
        return tuple(out)

    def intersect(self, xs: tuple[Atom, ...], ys: tuple[Atom, ...]) -> tuple[Atom, ...]:
        """The atoms of the values both unions accept. A product that grows past its
        inputs and ``max_atoms`` is capped (:meth:`cap`)."""
        if xs is ANY:
            return ys
        if ys is ANY:
            return xs
        self._pairs += len(xs) * len(ys)
        if self._limit is not None and self._pairs > self._limit:
            raise _OverBudget()
        if self.max_pairs is not None and self._pairs > self.max_pairs:
            raise TooLarge(f"over {self.max_pairs} pairs of alternatives met")
        # per type, a product may keep as many atoms as the larger input had (a union met
        # with one constraint stays as it is) or max_atoms; past that it is capped
        cx, cy = _type_counts(xs), _type_counts(ys)
        limits = {t: max(self.max_atoms, cx.get(t, 0), cy.get(t, 0)) for t in {*cx, *cy}}
        most = sum(limits.values())
        seen: dict[Any, Atom] = {}
        for x, y in itertools.product(xs, ys):
            if isinstance(x, Obj) and isinstance(y, Obj) and self._told_by_constants(x, y):
                continue  # a tag's constants apart: the meet is empty (an if chain on a tag)
            z = self.meet(x, y)
            if z is not None:
                seen.setdefault(_atom_key(z), z)
                if len(seen) > 2 * most:
                    seen = {_atom_key(a): a for a in self.cap(list(seen.values()), limits)}
        out = list(seen.values())
        if len(out) > 8:
            out = self.cap(self.prune(out) if len(out) <= 2 * most else out, limits)
        return tuple(out)

    def cap(self, atoms: list[Atom], limits: dict[str, int]) -> list[Atom]:
        """``atoms``, with those of a type that has more than its limit of them merged
        into their :meth:`hull` (warned: the grammar accepts more than the schema)."""
        by_type: dict[str, list[Atom]] = {}
        for a in atoms:
            by_type.setdefault(a.type, []).append(a)
        if all(len(v) <= limits.get(t, self.max_atoms) for t, v in by_type.items()):
            return atoms
        out: list[Atom] = []
        for t, group in by_type.items():
            limit = limits.get(t, self.max_atoms)
            if len(group) <= limit:
                out += group
                continue
            # merged by what they tell an enclosing unevaluatedProperties/Items, where
            # that leaves few enough (else all into one)
            by_notes: dict[tuple[Any, ...], list[Atom]] = {}
            for a in group:
                by_notes.setdefault(_annotations(a), []).append(a)
            parts = list(by_notes.values()) if len(by_notes) <= limit // 2 else [group]
            if self.neg:  # to be complemented: accept less (the first of them)
                merged = group[:limit]
            else:
                merged = [self.hull(p) if len(p) > 1 else p[0] for p in parts]
            self.warn(
                "anyOf" if t != "const" else "enum",
                self._where[-1] if self._where else "#",
                f"relaxed: {len(group)} alternatives of type {t} (the products of allOf, anyOf, oneOf, not, if)"
                f" merged into {len(merged)} that accept what each accepts",
            )
            out += merged
        return out

    def hull(self, atoms: list[Atom]) -> Atom:
        """One atom of the atoms' type (all the same) that accepts every value any of
        them accepts: bounds widened, keys and items united (values any of theirs), what
        they do not all share dropped."""
        a0 = atoms[0]
        if isinstance(a0, Const):
            vals: dict[str, Any] = {}
            for a in atoms:
                for v in a.values:  # type: ignore[union-attr]
                    vals.setdefault(canon(v), v)
            return Const(tuple(vals.values()))
        if isinstance(a0, Null):
            return a0
        if isinstance(a0, Bool):
            return Bool(frozenset().union(*(a.values for a in atoms)))  # type: ignore[union-attr]

        def same(get: Callable[[Any], Any], empty: Any) -> Any:
            first = get(a0)
            return first if all(get(a) == first for a in atoms) else empty

        def low(vals: list[int | None]) -> int:
            return min(v or 0 for v in vals)

        def high(vals: list[int | None]) -> int | None:
            return None if any(v is None for v in vals) else max(v for v in vals if v is not None)

        if isinstance(a0, Num):
            specs = [a.spec for a in atoms]  # type: ignore[union-attr]
            lo = lo_s = hi = hi_s = None
            if all(sp.lo is not None for sp in specs):
                lo = min(sp.lo for sp in specs if sp.lo is not None)
                lo_s = all(sp.lo_strict for sp in specs if sp.lo == lo)
            if all(sp.hi is not None for sp in specs):
                hi = max(sp.hi for sp in specs if sp.hi is not None)
                hi_s = all(sp.hi_strict for sp in specs if sp.hi == hi)
            mult = same(lambda a: a.spec.multiple_of, ())
            spec = NumberSpec(all(sp.integer for sp in specs), lo, bool(lo_s), hi, bool(hi_s), mult)
            excluded = set(a0.excluded).intersection(*(set(a.excluded) for a in atoms))  # type: ignore[union-attr]
            return Num(spec, all(a.non_integer for a in atoms), tuple(sorted(excluded)))  # type: ignore[union-attr]
        if isinstance(a0, Str):
            strs: list[Str] = atoms  # type: ignore[assignment]
            excluded_s = [w for w in a0.excluded if all(w in a.excluded for a in strs)]
            return Str(
                low([a.min_len for a in strs]),
                high([a.max_len for a in strs]),
                same(lambda a: a.patterns, ()),
                same(lambda a: a.not_patterns, ()),
                same(lambda a: a.formats, ()),
                tuple(excluded_s),
                same(lambda a: a.not_lengths, ()),
            )
        if isinstance(a0, Arr):
            arrs: list[Arr] = atoms  # type: ignore[assignment]
            n = max(len(a.prefix) for a in arrs)
            prefix = tuple(any_of(*(a.prefix[i] if i < len(a.prefix) else a.items for a in arrs)) for i in range(n))
            return Arr(
                prefix,
                any_of(*(a.items for a in arrs)),
                low([a.min_items for a in arrs]),
                high([a.max_items for a in arrs]),
                same(lambda a: a.contains, ()),
                all(a.unique for a in arrs),
                same(lambda a: a.uneval, ()),
                max(a.ev_prefix for a in arrs),
                any(a.ev_all for a in arrs),
                tuple(dict.fromkeys(c for a in arrs for c in a.ev_contains)),
            )
        objs: list[Obj] = atoms  # type: ignore[assignment]
        keys = list(dict.fromkeys(k for a in objs for k, _ in a.props))
        props = _values_in_any(objs, keys)
        catch = any_of(*(_undeclared_value(a) for a in objs))
        ev_patterns = tuple(dict.fromkeys(p for a in objs for p in a.ev_patterns))
        return Obj(
            props,
            # the patterns that evaluate keys, with no constraint of their own: they still
            # tell an enclosing unevaluatedProperties which keys are evaluated
            tuple((p, TRUE) for p in ev_patterns),
            ((frozenset(keys), (), catch),) if catch.key != ("true",) else (),
            frozenset.intersection(*(a.required for a in objs)),
            frozenset.intersection(*(a.forbidden for a in objs)),
            low([a.min_props for a in objs]),
            high([a.max_props for a in objs]),
            same(lambda a: a.names, ()),
            (),
            frozenset().union(*(a.ev_names for a in objs)),
            ev_patterns,
            any(a.ev_all for a in objs),
        )

    def prune(self, atoms: list[Atom]) -> list[Atom]:
        """Drop the atoms another atom of the same type contains (x within y:
        meet(x, y) == x). Quadratic in a type's atoms: types with more than 64 are kept as
        they are."""
        keep: list[Atom] = []
        by_type: dict[str, list[int]] = {}
        for i, a in enumerate(atoms):
            by_type.setdefault(a.type, []).append(i)
        quick = [_containment_key(a) if len(by_type[a.type]) <= 64 else None for a in atoms]
        for i, x in enumerate(atoms):
            inside = False
            same = by_type[x.type]
            if isinstance(x, Const) or len(same) > 64:
                keep.append(x)
                continue
            self._pairs += len(same)
            for j in same:
                y = atoms[j]
                if (
                    i != j
                    and _may_contain(quick[j], quick[i])
                    and _annotations(x) == _annotations(y)  # unevaluated* sees these
                    and self.meet(x, y) == x
                ):
                    if x != y or j < i:
                        inside = True
                        break
            if not inside:
                keep.append(x)
        return keep

    def meet(self, x: Atom, y: Atom) -> Atom | None:
        if isinstance(x, Const) or isinstance(y, Const):
            c, other = (x, y) if isinstance(x, Const) else (y, x)
            assert isinstance(c, Const)
            if isinstance(other, Const):
                vals = tuple(v for v, k in zip(c.values, c.keys, strict=True) if k in other.keyset)
                return Const(vals) if vals else None
            if other == TYPE_ATOM[other.type]:
                return c.of_type(other.type)
            # an enum of a tag met again with each alternative it meets (an if chain on
            # the tag): each value's match is asked once per constraint
            memo_key = (c.keys, other, self.neg)
            if memo_key in self._const_meets:
                return self._const_meets[memo_key]
            vals = tuple(v for v in c.values if self.matches(other, v))
            out = self._const_meets[memo_key] = Const(vals) if vals else None
            return out
        if x.type != y.type:
            return None
        if isinstance(x, Null):
            return x
        if isinstance(x, Bool):
            v = x.values & y.values  # type: ignore[union-attr]
            return Bool(v) if v else None
        if isinstance(x, Num):
            assert isinstance(y, Num)
            spec = x.spec.intersect(y.spec)
            if spec.empty() or (spec.integer and (x.non_integer or y.non_integer)):
                return None
            return Num(spec, x.non_integer or y.non_integer, tuple(sorted(set(x.excluded) | set(y.excluded))))
        if isinstance(x, Str):
            assert isinstance(y, Str)
            lo = max(x.min_len, y.min_len)
            hi = x.max_len if y.max_len is None else y.max_len if x.max_len is None else min(x.max_len, y.max_len)
            if hi is not None and hi < lo:
                return None
            return Str(
                lo,
                hi,
                tuple(dict.fromkeys(x.patterns + y.patterns)),
                tuple(dict.fromkeys(x.not_patterns + y.not_patterns)),
                tuple(dict.fromkeys(x.formats + y.formats)),
                tuple(dict.fromkeys(x.excluded + y.excluded)),
                tuple(dict.fromkeys(x.not_lengths + y.not_lengths)),
            )
        if isinstance(x, Arr):
            assert isinstance(y, Arr)
            n = max(len(x.prefix), len(y.prefix))
            prefix = tuple(
                all_of(x.prefix[i] if i < len(x.prefix) else x.items, y.prefix[i] if i < len(y.prefix) else y.items)
                for i in range(n)
            )
            lo = max(x.min_items, y.min_items)
            hi = (
                x.max_items
                if y.max_items is None
                else y.max_items
                if x.max_items is None
                else min(x.max_items, y.max_items)
            )
            if hi is not None and hi < lo:
                return None
            return Arr(
                prefix,
                all_of(x.items, y.items),
                lo,
                hi,
                _merge(x.contains, y.contains),
                x.unique or y.unique,
                _merge(x.uneval, y.uneval),
                max(x.ev_prefix, y.ev_prefix),
                x.ev_all or y.ev_all,
                _merge(x.ev_contains, y.ev_contains),
            )
        if isinstance(x, Obj):
            assert isinstance(y, Obj)
            req = x.required | y.required
            forb = x.forbidden | y.forbidden
            if req & forb:
                return None
            hi = (
                x.max_props
                if y.max_props is None
                else y.max_props
                if x.max_props is None
                else min(x.max_props, y.max_props)
            )
            lo = max(x.min_props, y.min_props, len(req))
            if hi is not None and hi < lo:
                return None
            return Obj(
                _merge(x.props, y.props),
                _merge(x.patterns, y.patterns),
                _merge(x.additional, y.additional),
                req,
                forb,
                lo,
                hi,
                _merge(x.names, y.names),
                _merge(x.uneval, y.uneval),
                x.ev_names | y.ev_names,
                tuple(dict.fromkeys(x.ev_patterns + y.ev_patterns)),
                x.ev_all or y.ev_all,
            )
        raise AssertionError((x, y))

    # complements -----------------------------------------------------------------------

    def complement(self, atoms: tuple[Atom, ...], ptr: str) -> tuple[Atom, ...]:
        out = ANY
        for a in atoms:
            out = self.intersect(out, self.complement_atom(a, ptr))
        return out

    def complement_atom(self, a: Atom, ptr: str) -> tuple[Atom, ...]:
        if isinstance(a, Const):
            out: list[Atom] = []
            by_type: dict[str, list[Any]] = {}
            for v in a.values:
                by_type.setdefault(json_type(v), []).append(v)
            for t, base in TYPE_ATOM.items():
                vals = by_type.get(t)
                if not vals:
                    out.append(base)
                elif t == "null":
                    continue
                elif t == "boolean":
                    rest = frozenset({True, False}) - {bool(v) for v in vals}
                    if rest:
                        out.append(Bool(rest))
                elif t == "number":
                    out.append(Num(excluded=tuple(sorted(decimal(v) for v in vals))))
                elif t == "string":
                    out.append(Str(excluded=tuple(vals)))
                else:
                    self.warn("not", ptr, f"the complement of a constant {t} is not enforced: any {t} is accepted")
                    out += self.loose(base)
            return tuple(out)
        others = tuple(b for b in ANY if b.type != a.type)
        inner = self._complement_within(a, ptr)
        return others + inner

    def _complement_within(self, a: Atom, ptr: str) -> tuple[Atom, ...]:
        base = TYPE_ATOM[a.type]
        if a == base:
            return ()
        if isinstance(a, Bool):
            return (Bool(frozenset({True, False}) - a.values),)
        if isinstance(a, Num):
            s = a.spec
            parts: list[Atom] = []
            if s.lo is not None:
                parts.append(Num(NumberSpec(hi=s.lo, hi_strict=not s.lo_strict)))
            if s.hi is not None:
                parts.append(Num(NumberSpec(lo=s.hi, lo_strict=not s.hi_strict)))
            if s.integer:
                parts.append(Num(non_integer=True))
            if a.non_integer:
                parts.append(Num(NumberSpec(integer=True)))
            for v in a.excluded:
                parts.append(Num(NumberSpec(lo=v, hi=v)))
            if s.multiple_of:
                self.warn("not", ptr, "the complement of multipleOf is not enforced: any number is accepted")
                return self.loose(base)
            return tuple(parts)
        if isinstance(a, Str):
            parts = []
            if a.min_len:
                parts.append(Str(max_len=a.min_len - 1))
            if a.max_len is not None:
                parts.append(Str(min_len=a.max_len + 1))
            for p in a.patterns:
                parts.append(Str(not_patterns=(p,)))
            for p in a.not_patterns:
                parts.append(Str(patterns=(p,)))
            for word in a.excluded:
                parts.append(Const((word,)))
            for lo, hi in a.not_lengths:
                parts.append(Str(min_len=lo, max_len=hi))
            if a.formats:
                self.warn("not", ptr, "the complement of a format is not enforced: any string is accepted")
                return self.loose(base)
            return tuple(parts)
        if isinstance(a, Arr):
            parts = []
            if a.min_items:
                parts.append(Arr(max_items=a.min_items - 1))
            if a.max_items is not None:
                parts.append(Arr(min_items=a.max_items + 1))
            simple = not a.uneval and not a.unique
            if a.items.key != ("true",):
                if a.prefix:
                    simple = False  # "an item after the prefix outside items": no keyword says it
                else:
                    parts.append(Arr(contains=((not_node(a.items), 1, None),)))
            for c, lo, hi in a.contains:
                if lo == 1 and hi is None:
                    parts.append(Arr(items=not_node(c)))
                elif not (lo == 0 and hi is None):
                    simple = False
            for i, item in enumerate(a.prefix):
                # the first position whose item fails its prefix schema
                parts.append(Arr(prefix=(*(TRUE,) * i, not_node(item)), min_items=i + 1))
            if not simple:
                self.warn("not", ptr, "the complement of this array schema is not enforced: any array is accepted")
                return self.loose(base)
            return tuple(parts)
        if isinstance(a, Obj):
            parts = []
            # in a fixed order (a set's order changes with the process's hash seed, and the
            # parts' order decides the order of keys in the products made of them)
            for k in sorted(a.required):
                parts.append(Obj(forbidden=frozenset({k})))
            for k in sorted(a.forbidden):
                parts.append(Obj(required=frozenset({k})))
            if a.min_props > len(a.required):
                parts.append(Obj(max_props=a.min_props - 1))
            if a.max_props is not None:
                parts.append(Obj(min_props=a.max_props + 1))
            for k, n in a.props:
                parts.append(Obj(props=((k, not_node(n)),), required=frozenset({k})))
            if a.patterns or a.additional or a.names or a.uneval:
                self.warn("not", ptr, "the complement of this object schema is not enforced: any object is accepted")
                return self.loose(base)
            return tuple(parts)
        raise AssertionError(a)

    # membership of concrete values (enum/const filtering) -------------------------------

    def matches_node(self, n: Node, value: Any) -> bool:
        return any(self.matches(a, value) for a in self.lower(n))

    def matches(self, a: Atom, v: Any) -> bool:
        t = json_type(v)
        if isinstance(a, Const):
            return canon(v) in a.keyset
        if a.type != t:
            return False
        if isinstance(a, Null):
            return True
        if isinstance(a, Bool):
            return v in a.values
        if isinstance(a, Num):
            if isinstance(v, float) and not math.isfinite(v):
                return False
            x = decimal(v)
            s = a.spec
            if s.integer and x.denominator != 1:
                return False
            if a.non_integer and x.denominator == 1:
                return False
            if s.lo is not None and (x < s.lo or (s.lo_strict and x == s.lo)):
                return False
            if s.hi is not None and (x > s.hi or (s.hi_strict and x == s.hi)):
                return False
            if any((x / m).denominator != 1 for m in s.multiple_of):
                return False
            return x not in a.excluded
        if isinstance(a, Str):
            n = len(v)
            if n < a.min_len or (a.max_len is not None and n > a.max_len):
                return False
            if any(lo <= n and (hi is None or n <= hi) for lo, hi in a.not_lengths):
                return False
            if v in a.excluded:
                return False
            for p in a.patterns:
                if _search(p, v) is False:
                    return False
            for p in a.not_patterns:
                if _search(p, v) is True:
                    return False
            return True
        if isinstance(a, Arr):
            n = len(v)
            if n < a.min_items or (a.max_items is not None and n > a.max_items):
                return False
            for i, item in enumerate(v):
                node = a.prefix[i] if i < len(a.prefix) else a.items
                if not self.matches_node(node, item):
                    return False
            for c, lo, hi in a.contains:
                k = sum(self.matches_node(c, item) for item in v)
                if k < lo or (hi is not None and k > hi):
                    return False
            if a.unique and len({canon(x) for x in v}) != n:
                return False
            return True
        if isinstance(a, Obj):
            keys = set(v)
            if not a.required <= keys or a.forbidden & keys:
                return False
            if len(keys) < a.min_props or (a.max_props is not None and len(keys) > a.max_props):
                return False
            for k, item in v.items():
                if not self.matches_node(value_node(a, k, strict=self.neg), item):
                    return False
                if any(not self.matches_node(n, k) for n in a.names):
                    return False
            return True
        return False

    # schema objects --------------------------------------------------------------------

    def _schema(self, n: Node) -> tuple[Atom, ...]:
        s: dict[str, Any] = n.schema
        r = n.resolver
        ptr = n.ptr
        draft = self.draft()
        kw = _DRAFT_KEYWORDS[draft]

        def sub(key: str, value: Any, suffix: str = "") -> Node:
            return self.node(value, r, f"{ptr}/{key}{suffix}")

        parts: list[tuple[Atom, ...]] = []
        if "$ref" in s:
            target = self._ref(r, s["$ref"], ptr)
            if not kw["2019"]:
                return self.lower(target)  # siblings of $ref are ignored before 2019-09
            parts.append(self.lower(target))
        if "$dynamicRef" in s and draft == "draft2020-12":
            parts.append(self.lower(self._ref(r, s["$dynamicRef"], ptr)))
        if "$recursiveRef" in s and draft == "draft2019-09":
            self.warn("$recursiveRef", ptr, "$recursiveRef is resolved as a plain $ref")
            parts.append(self.lower(self._ref(r, s["$recursiveRef"], ptr)))

        local = self._local(s, sub, ptr, draft)
        if local is not ANY:
            parts.append(local)
        if not _APPLICATORS.isdisjoint(s):
            for i, x in enumerate(s.get("allOf", []) if isinstance(s.get("allOf"), list) else []):
                parts.append(self.lower(sub("allOf", x, f"/{i}")))
            if isinstance(s.get("anyOf"), list):
                parts.append(self.union(*(self.lower(sub("anyOf", x, f"/{i}")) for i, x in enumerate(s["anyOf"]))))
            if isinstance(s.get("oneOf"), list):
                parts.append(self._one_of([sub("oneOf", x, f"/{i}") for i, x in enumerate(s["oneOf"])], ptr))
            if "not" in s:
                parts.append(self.complement(self.lower_flipped(sub("not", s["not"])), f"{ptr}/not"))
            if kw["if"] and "if" in s and self.annotations and "then" not in s and "else" not in s:
                # a lone if constrains nothing, but its annotations count where it matches
                parts.append(self.union(self.lower(sub("if", s["if"])), ANY))
            elif kw["if"] and "if" in s and ("then" in s or "else" in s):
                cond = self.lower(sub("if", s["if"]))
                then = self.lower(sub("then", s["then"])) if "then" in s else ANY
                other = self.lower(sub("else", s["else"])) if "else" in s else ANY
                against = self.complement(self.lower_flipped(sub("if", s["if"])), f"{ptr}/if")
                parts.append(self.union(self.intersect(cond, then), self.intersect(against, other)))
        if not _DEPENDENCY_KEYWORDS.isdisjoint(s):
            parts.extend(self._dependencies(s, sub, ptr, draft))

        out = ANY
        for p in parts:
            out = self.intersect(out, p)
        if kw["2019"] and ("unevaluatedProperties" in s or "unevaluatedItems" in s):
            out = tuple(self._unevaluated(a, s, sub) for a in out)
        return out

    def _ref(self, r: Any, ref: Any, ptr: str) -> Node:
        if not isinstance(ref, str):
            raise SchemaError(f"JSON schema error at {ptr}: $ref must be a string")
        from referencing.exceptions import Unresolvable

        # without dynamic scopes a reference resolves alike from every resolver with the
        # same base URI (nodes are told apart by that base alone): looked up once
        key = (r._base_uri, ref)
        resolved = None if self.dynamic else self._lookups.get(key)
        if resolved is None and not self.dynamic and r._base_uri == self.root_base and ref.startswith("#/"):
            target = self._local_pointer(ref)
            if target is not _MISSING:
                resolved = self._lookups[key] = _Resolved(target, r)
        if resolved is None:
            # a reference that does not resolve in its scope is asked of the registry once:
            # each ask crawls the whole document again (referencing keeps the crawl in a
            # new registry), 217 times and 1.2 s in Github_ultra o91126
            failed = None if self.dynamic else self._unresolved.get(key)
            if failed is None:
                r = self._with_crawled(r)
                try:
                    resolved = r.lookup(ref)
                except Unresolvable as e:
                    failed = str(e)
                    if not self.dynamic:
                        self._unresolved[key] = failed
                    reg = getattr(r, "_registry", None)  # (referencing's; absent: no reuse)
                    if self._crawled is None and reg is not None:
                        try:
                            self._crawled = reg.crawl()
                        except Exception:  # (a document its crawl refuses: each lookup says so)
                            pass
                except Exception as e:
                    raise SchemaError(
                        f"JSON schema error at {ptr}: cannot resolve $ref {ref!r}: {type(e).__name__}: {e}"
                    ) from None
                else:
                    if not self.dynamic:
                        self._lookups[key] = resolved
                    reg = getattr(resolved.resolver, "_registry", None)
                    if reg is not None and reg is not getattr(r, "_registry", None):  # crawled (or retrieved to)
                        self._crawled = reg
            if failed is not None:
                resolved = self._from_root(ref, ptr)  # (warns at each use: not kept)
                if resolved is None:
                    raise SchemaError(f"JSON schema error at {ptr}: cannot resolve $ref {ref!r}: {failed}") from None
        assert resolved is not None  # (looked up, or read from the root)
        return self.node(resolved.contents, resolved.resolver, f"{ptr}/$ref({ref})", enter=False)

    def _with_crawled(self, r: Any) -> Any:
        """``r`` with the registry a lookup has crawled, once one has: ``referencing``
        keeps a crawl in the registry it returns, and every resolver made before (each
        subschema's) would crawl the whole document again at its first lookup of an
        identifier or anchor (217 times, 1.2 s, in Github_ultra o91126)."""
        if self._crawled is None or getattr(r, "_registry", self._crawled) is self._crawled:
            return r
        from attrs import evolve

        return evolve(r, registry=self._crawled)

    def _local_pointer(self, ref: str) -> Any:
        """What the JSON-pointer ``$ref`` ``#/...`` points at in the root document, as
        ``referencing`` resolves it from the root's scope (the pointer percent-decoded,
        split at ``/``, each key's ``~1`` and ``~0`` replaced), looked up here without its
        resolver objects; :data:`_MISSING` where that is not plain: a segment that does not
        resolve, or a subschema with an identifier on the way (the resolver would enter
        it)."""
        doc = self.root_doc
        id_of = self.specification.id_of
        for part in unquote(ref[2:]).split("/"):
            if isinstance(doc, dict):
                if "~" in part:
                    part = part.replace("~1", "/").replace("~0", "~")
                if part not in doc:
                    return _MISSING
                doc = doc[part]
            elif isinstance(doc, list):
                if not part.isdigit() or (len(part) > 1 and part[0] == "0") or int(part) >= len(doc):
                    return _MISSING
                doc = doc[int(part)]
            else:
                return _MISSING
            if isinstance(doc, dict):
                try:
                    if id_of(doc) is not None:
                        return _MISSING
                except Exception:
                    return _MISSING
        return doc

    def _from_root(self, ref: str, ptr: str) -> Any:
        """A JSON-pointer ``$ref`` (``#/definitions/a/definitions/b``) that does not resolve
        in its scope, looked up in the whole document instead (schemas that give
        subschemas an ``id`` yet point from the root, as Heroku's do), with a warning; None
        when that fails too."""
        if self.root is None or not ref.startswith("#/"):
            return None
        try:
            resolved = self.root.lookup(ref)
        except Exception:
            return None
        self.warn("$ref", ptr, f"{ref!r} does not resolve in its scope (an enclosing id): read from the root")
        return resolved

    def _one_of(self, nodes: list[Node], ptr: str) -> tuple[Atom, ...]:
        lowered = [self.lower(x) for x in nodes]
        outer = self._limit
        self._limit = self._pairs + self.one_of_work if outer is None else min(outer, self._pairs + self.one_of_work)
        # what the exclusions warn about counts only if they finish
        said: list[tuple[str, str, str]] = []
        warn, self.warn = self.warn, lambda *w: said.append(w)
        mark = len(self._memo)
        try:
            # alternatives no value meets together need no exclusion (a discriminated
            # union: each with its own constant under a required key)
            n = len(lowered)
            # told apart on what accepts more than each (then the exact ones are apart too)
            wide = [self.lower_as(x, False) for x in nodes] if self.neg else lowered
            apart = [[False] * n for _ in range(n)]
            for i in range(n):
                for j in range(i + 1, n):
                    apart[i][j] = apart[j][i] = self.disjoint(wide[i], wide[j])
            comps: dict[int, tuple[Atom, ...]] = {}
            alts = []
            for i, a in enumerate(lowered):
                cur = a
                for j, b in enumerate(lowered):
                    if i != j and cur:
                        if apart[i][j] or _disjoint_types(cur, b):
                            continue
                        if j not in comps:
                            comps[j] = self.complement(self.lower_flipped(nodes[j]), f"{ptr}/oneOf/{j}")
                        cur = self.intersect(cur, comps[j])
                alts.append(cur)
            self.warn = warn
            for w in said:
                warn(*w)
            return self.union(*alts)
        except _OverBudget:
            self.warn = warn
            for key in list(self._memo)[mark:]:  # lowered meanwhile, their warnings dropped
                del self._memo[key]
            if outer is not None and self._pairs > outer:
                raise  # an enclosing oneOf's budget: it relaxes
            self.warn(
                "oneOf",
                ptr,
                "relaxed: read as anyOf (a value that meets several alternatives is accepted): excluding"
                f" the others from each alternative takes over {self.one_of_work} products of alternatives",
            )
            return () if self.neg else self.union(*lowered)
        finally:
            self.warn = warn
            self._limit = outer

    def disjoint(self, xs: tuple[Atom, ...], ys: tuple[Atom, ...]) -> bool:
        """Whether no value meets both unions (False when unsure)."""
        if _disjoint_types(xs, ys):
            return True
        self._pairs += len(xs) * len(ys)
        if self._limit is not None and self._pairs > self._limit:
            raise _OverBudget()
        return all(self._apart(x, y) for x in xs for y in ys)

    def _apart(self, x: Atom, y: Atom) -> bool:
        if isinstance(x, Obj) and isinstance(y, Obj) and self._told_by_constants(x, y):
            return True
        z = self.meet(x, y)
        if z is None:
            return True
        try:
            if isinstance(z, Obj):
                # a required key whose value no JSON value meets
                return any(_empty(self.lower(value_node(z, k))) for k in sorted(z.required))
            if isinstance(z, Arr):
                return any(_empty(self.lower(z.prefix[i])) for i in range(min(z.min_items, len(z.prefix))))
        except SchemaError:  # a recursive reference met while lowering: unsure
            return False
        return _empty((z,))

    def _told_by_constants(self, x: Obj, y: Obj) -> bool:
        """Whether a key that one of two objects requires has constant values declared on
        both sides with none in common (a discriminated union's tag): then no object meets
        both. Read off the declared schemas' own ``enum`` and ``const`` (the value meets
        these and maybe more, never fewer), without meeting or lowering anything."""
        kw = _DRAFT_KEYWORDS[self.draft()]
        for key in sorted(x.required | y.required):
            xs = _constants_of(x, key, kw["const"])
            if xs is not None:
                ys = _constants_of(y, key, kw["const"])
                if ys is not None and xs.isdisjoint(ys):
                    return True
        return False

    def _dependencies(
        self, s: dict[str, Any], sub: Callable[..., Node], ptr: str, draft: str
    ) -> list[tuple[Atom, ...]]:
        reqs: dict[str, list[str]] = {}
        schemas: dict[str, Any] = {}
        if draft in ("draft2019-09", "draft2020-12"):
            if isinstance(s.get("dependentRequired"), dict):
                reqs.update(s["dependentRequired"])
            if isinstance(s.get("dependentSchemas"), dict):
                schemas.update({k: ("dependentSchemas", v) for k, v in s["dependentSchemas"].items()})
        elif isinstance(s.get("dependencies"), dict):
            for k, v in s["dependencies"].items():
                if isinstance(v, list):
                    reqs[k] = v
                else:
                    schemas[k] = ("dependencies", v)
        out: list[tuple[Atom, ...]] = []
        if not reqs and not schemas:
            return out
        non_obj = _NON_OBJECT
        for k, names in reqs.items():
            out.append((*non_obj, Obj(forbidden=frozenset({k})), Obj(required=frozenset({k, *names}))))
        for k, (kw, v) in schemas.items():
            cond = self.lower(sub(kw, v, f"/{_esc(k)}"))
            present = self.intersect((Obj(required=frozenset({k})),), cond)
            out.append((*non_obj, Obj(forbidden=frozenset({k})), *present))
        return out

    def _local(self, s: dict[str, Any], sub: Callable[..., Node], ptr: str, draft: str) -> tuple[Atom, ...]:
        """The atoms of the keywords that constrain one type each (and type/enum/const)."""
        if _LOCAL_KEYWORDS.isdisjoint(s):
            return ANY  # none of them: every value (what the steps below would find)
        kw = _DRAFT_KEYWORDS[draft]
        atoms = dict(TYPE_ATOM)
        integer_only = False
        if "type" in s:
            ts = s["type"] if isinstance(s["type"], list) else [s["type"]]
            allowed = set()
            for t in ts:
                if t == "integer":
                    allowed.add("number")
                elif t in atoms:
                    allowed.add(t)
                else:
                    raise SchemaError(f"JSON schema error at {ptr}/type: unknown type {t!r}")
            integer_only = "integer" in ts and "number" not in ts
            atoms = {t: a for t, a in atoms.items() if t in allowed}
        if "number" in atoms:
            num = self._number(s, draft, ptr)
            if integer_only:
                num = num.intersect(NumberSpec(integer=True))
            if num.key() != _ANY_NUMBER_KEY:
                atoms["number"] = None if num.empty() else Num(num)  # type: ignore[assignment]
        if "string" in atoms:
            atoms["string"] = self._string(s, ptr)  # type: ignore[assignment]
        if "array" in atoms:
            atoms["array"] = self._array(s, sub, ptr, draft)  # type: ignore[assignment]
        if "object" in atoms:
            atoms["object"] = self._object(s, sub, ptr, draft)  # type: ignore[assignment]
        out = tuple(a for a in atoms.values() if a is not None)
        consts: list[Any] | None = None
        if kw["const"] and "const" in s:
            consts = [s["const"]]
        if "enum" in s:
            if not isinstance(s["enum"], list):
                raise SchemaError(f"JSON schema error at {ptr}/enum: enum must be an array")
            consts = s["enum"] if consts is None else [v for v in consts if canon(v) in {canon(e) for e in s["enum"]}]
        if consts is not None:
            out = self.intersect(out, (Const(tuple(consts)),)) if consts else ()
        if out == ANY:
            return ANY
        return out

    def _number(self, s: dict[str, Any], draft: str, ptr: str) -> NumberSpec:
        if _NUMBER_KEYWORDS.isdisjoint(s):  # no bound nor divisor
            return NumberSpec()

        def num(key: str) -> Fraction | None:
            v = s.get(key)
            if isinstance(v, bool) or not isinstance(v, int | float):
                return None
            if isinstance(v, float) and not math.isfinite(v):
                return None
            return decimal(v)

        spec = NumberSpec()
        lo, hi = num("minimum"), num("maximum")
        if draft == "draft4":
            spec = NumberSpec(
                lo=lo, lo_strict=s.get("exclusiveMinimum") is True, hi=hi, hi_strict=s.get("exclusiveMaximum") is True
            )
        else:
            spec = NumberSpec(lo=lo, hi=hi)
            elo, ehi = num("exclusiveMinimum"), num("exclusiveMaximum")
            if elo is not None:
                spec = spec.intersect(NumberSpec(lo=elo, lo_strict=True))
            if ehi is not None:
                spec = spec.intersect(NumberSpec(hi=ehi, hi_strict=True))
        m = num("multipleOf")
        if m is not None and m > 0:
            spec = spec.intersect(NumberSpec(multiple_of=(m,)))
        return spec

    def _string(self, s: dict[str, Any], ptr: str) -> Str | None:
        lo = _count(s.get("minLength"))
        hi = _count(s.get("maxLength"))
        if hi is not None and lo is not None and hi < lo:
            return None
        patterns: tuple[str, ...] = ()
        if isinstance(s.get("pattern"), str):
            patterns = (s["pattern"],)
        formats: tuple[str, ...] = ()
        if isinstance(s.get("format"), str) and self.formats:
            formats = (s["format"],)
        return Str(lo or 0, hi, patterns, (), formats)

    def _array(self, s: dict[str, Any], sub: Callable[..., Node], ptr: str, draft: str) -> Arr | None:
        kw = _DRAFT_KEYWORDS[draft]
        prefix: tuple[Node, ...] = ()
        items = TRUE
        ev_all = False
        if draft == "draft2020-12":
            if isinstance(s.get("prefixItems"), list):
                prefix = tuple(sub("prefixItems", x, f"/{i}") for i, x in enumerate(s["prefixItems"]))
            if "items" in s and not isinstance(s["items"], list):
                items = sub("items", s["items"])
                ev_all = True
        else:
            if isinstance(s.get("items"), list):
                prefix = tuple(sub("items", x, f"/{i}") for i, x in enumerate(s["items"]))
                if "additionalItems" in s:
                    items = sub("additionalItems", s["additionalItems"])
                    ev_all = True
            elif "items" in s:
                items = sub("items", s["items"])
                ev_all = True
        lo = _count(s.get("minItems")) or 0
        hi = _count(s.get("maxItems"))
        if hi is not None and hi < lo:
            return None
        contains: tuple[tuple[Node, int, int | None], ...] = ()
        if kw["contains"] and "contains" in s:
            c_lo, c_hi = 1, None
            if kw["2019"]:
                if _count(s.get("minContains")) is not None:
                    c_lo = _count(s.get("minContains"))  # type: ignore[assignment]
                c_hi = _count(s.get("maxContains"))
            if c_hi is not None and c_hi < c_lo:
                return None
            contains = ((sub("contains", s["contains"]), c_lo, c_hi),)
        unique = s.get("uniqueItems") is True
        return Arr(prefix, items, lo, hi, contains, unique, (), len(prefix), ev_all, tuple(c for c, _, _ in contains))

    def _object(self, s: dict[str, Any], sub: Callable[..., Node], ptr: str, draft: str) -> Obj | None:
        kw = _DRAFT_KEYWORDS[draft]
        props = (
            tuple((k, sub("properties", v, f"/{_esc(k)}")) for k, v in (s.get("properties") or {}).items())
            if isinstance(s.get("properties"), dict)
            else ()
        )
        patterns = (
            tuple(
                (p, sub("patternProperties", v, f"/{_esc(p)}")) for p, v in (s.get("patternProperties") or {}).items()
            )
            if isinstance(s.get("patternProperties"), dict)
            else ()
        )
        additional: tuple[tuple[frozenset[str], tuple[str, ...], Node], ...] = ()
        if "additionalProperties" in s:
            additional = (
                (
                    frozenset(k for k, _ in props),
                    tuple(p for p, _ in patterns),
                    sub("additionalProperties", s["additionalProperties"]),
                ),
            )
        required = frozenset(s["required"]) if isinstance(s.get("required"), list) else frozenset()
        lo = _count(s.get("minProperties")) or 0
        hi = _count(s.get("maxProperties"))
        names = (sub("propertyNames", s["propertyNames"]),) if kw["propertyNames"] and "propertyNames" in s else ()
        if hi is not None and hi < max(lo, len(required)):
            return None
        return Obj(
            props,
            patterns,
            additional,
            required,
            frozenset(),
            max(lo, len(required)),
            hi,
            names,
            (),
            frozenset(k for k, _ in props),
            tuple(p for p, _ in patterns),
            bool(additional),
        )

    def _unevaluated(self, a: Atom, s: dict[str, Any], sub: Callable[..., Node]) -> Atom:
        if isinstance(a, Obj) and "unevaluatedProperties" in s:
            if a.ev_all:
                return a
            u = sub("unevaluatedProperties", s["unevaluatedProperties"])
            return replace(a, uneval=(*a.uneval, (a.ev_names, a.ev_patterns, u)), ev_all=True)
        if isinstance(a, Arr) and "unevaluatedItems" in s:
            if a.ev_all:
                return a
            u = sub("unevaluatedItems", s["unevaluatedItems"])
            return replace(a, uneval=(*a.uneval, (a.ev_prefix, a.ev_contains, u)), ev_all=True)
        return a

    # set by the converter
    specification: Any = None
    #: the resolver of the document's root (where a lost JSON-pointer $ref is looked up)
    root: Any = None
    #: the root document and its base URI (see :meth:`_local_pointer`)
    root_doc: Any = None
    root_base: str | None = None
    dynamic: bool = False
    #: whether the document has unevaluated* keywords (then annotations of a lone ``if`` count)
    annotations: bool = False


class _Resolved:
    """A ``$ref`` resolved without ``referencing`` (the two fields of its ``Resolved``)."""

    __slots__ = ("contents", "resolver")

    def __init__(self, contents: Any, resolver: Any) -> None:
        self.contents = contents
        self.resolver = resolver


#: what :meth:`Lowering._local_pointer` gives for a pointer it does not resolve itself
_MISSING = object()


def value_node(a: Obj, key: str, strict: bool = False) -> Node:
    """The schema a property ``key``'s value must meet in an object atom. Where whether a
    pattern matches ``key`` is unknown, its schema is left out and ``additionalProperties``
    does not apply: looser, never stricter, than the schema (``strict``: both apply)."""
    parts = a.declared(key)
    for p, n in a.patterns:
        if _search(p, key) is (None if strict else True) or _search(p, key) is True:
            parts.append(n)
    skip = (True,) if strict else (True, None)
    for names, pats, n in a.additional:
        if key not in names and not any(_search(p, key) in skip for p in pats):
            parts.append(n)
    for names, pats, n in a.uneval:
        if key not in names and not any(_search(p, key) in skip for p in pats):
            parts.append(n)
    return all_of(*parts)


def _constants_of(a: Obj, key: str, has_const: bool) -> frozenset[str] | None:
    """The canonical texts that every value of ``key`` in ``a`` is among, as the
    ``enum`` and ``const`` of its declared schemas say (``has_const``: the draft has
    ``const``); None where none of them says. A schema with ``$ref`` is passed over
    (before 2019-09 its siblings do not count)."""
    out: frozenset[str] | None = None
    keys: frozenset[str] | None
    for node in a.declared(key):
        if node.op == "const":
            keys = frozenset((node.key[1],))
        elif node.op == "schema" and isinstance(node.schema, dict) and "$ref" not in node.schema:
            s = node.schema
            keys = None
            try:
                if has_const and "const" in s:
                    keys = frozenset((canon(s["const"]),))
                if isinstance(s.get("enum"), list):
                    enum = frozenset(canon(v) for v in s["enum"])
                    keys = enum if keys is None else keys & enum
            except (TypeError, ValueError):  # not JSON: left to the lowering to say
                continue
            if keys is None:
                continue
        else:
            continue
        out = keys if out is None else out & keys
    return out


@functools.lru_cache(maxsize=4096)
def _search(pattern: str, text: str) -> bool | None:
    """Whether the ECMA ``pattern`` is found in ``text``; None: unknown (no DFA: lookaround,
    backreferences, too many states; Python's ``re`` is not asked, it reads ECMA-262
    patterns otherwise: ``\\p{..}``, ``(?<name>..)``, ``\\d``, ``$``)."""
    d = _pattern_dfa(pattern)
    return None if d is None else d.accepts(text)


def _pattern_dfa(pattern: str) -> Any:
    """The automaton of the strings ``pattern`` is found in (None: none can be built): the
    emitter's, from the one cache of pattern automata (:func:`._dfa.pattern`)."""
    from ._dfa import pattern as pattern_dfa

    try:
        return pattern_dfa(pattern)
    except (ValueError, OverflowError):
        return None


#: keywords the converter never reads (annotations): a subschema's shape leaves them out
_NOT_READ = frozenset(
    {"title", "description", "default", "examples", "example", "$comment", "deprecated", "readOnly", "writeOnly"}
)
#: a key's part in a subschema's shape: 1 left out, 2 a subschema (or a list of them),
#: 3 names to subschemas; any other key's value is a plain value (a key that begins with
#: ``x-`` left out)
_KEY_KINDS = {
    **{k: 1 for k in _NOT_READ},
    **{k: 2 for k in (*SUBSCHEMA_ONE, *SUBSCHEMA_MANY)},
    **{k: 3 for k in SUBSCHEMA_NAMED},
}
#: the keywords :meth:`Lowering._number` reads
_NUMBER_KEYWORDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
#: the keywords of the applicators :meth:`Lowering._schema` reads after ``_local``
_APPLICATORS = frozenset({"allOf", "anyOf", "oneOf", "not", "if"})
#: the keywords :meth:`Lowering._dependencies` reads
_DEPENDENCY_KEYWORDS = frozenset({"dependentRequired", "dependentSchemas", "dependencies"})
#: the key of a number without constraints
_ANY_NUMBER_KEY = NumberSpec().key()
#: every keyword :meth:`Lowering._local` reads, it and the methods it calls: a schema
#: with none of them constrains no type there
_LOCAL_KEYWORDS = _NUMBER_KEYWORDS | {
    "type",
    "const",
    "enum",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "prefixItems",
    "items",
    "additionalItems",
    "minItems",
    "maxItems",
    "contains",
    "minContains",
    "maxContains",
    "uniqueItems",
    "properties",
    "patternProperties",
    "additionalProperties",
    "required",
    "minProperties",
    "maxProperties",
    "propertyNames",
}


def _type_counts(atoms: tuple[Atom, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in atoms:
        out[a.type] = out.get(a.type, 0) + 1
    return out


def _atom_key(a: Atom) -> Any:
    """A hashable key equal for equal atoms (a constant's values may be lists)."""
    return ("const", a.keys) if isinstance(a, Const) else a


def _dedupe(atoms: Iterable[Atom]) -> list[Atom]:
    """The atoms without repeats, in order."""
    seen: dict[Any, Atom] = {}
    for a in atoms:
        seen.setdefault(_atom_key(a), a)
    return list(seen.values())


def _empty(atoms: tuple[Atom, ...]) -> bool:
    """Whether no value meets any of ``atoms`` (False when unsure): none, or strings whose
    patterns and lengths no string meets together (``^Abs$`` and ``^Add$``)."""
    return all(isinstance(a, Str) and _no_string(a.patterns, a.min_len, a.max_len) for a in atoms)


@functools.lru_cache(maxsize=1024)
def _no_string(patterns: tuple[str, ...], lo: int, hi: int | None) -> bool:
    if len(patterns) < 2 and not (patterns and (lo or hi is not None)):
        return False
    from ._dfa import from_regex, length
    from ._regex import anchored, parse

    try:
        d = length(lo, hi, 200) if (lo or hi is not None) else None
        for p in patterns:
            e = from_regex(anchored(parse(p)), 200)
            d = e if d is None else d.intersect(e, 200)
        return d is not None and d.empty()
    except (ValueError, OverflowError):
        return False


def _value_in_any(objs: list[Obj], key: str) -> Node:
    """A node that a value of ``key`` in any of the object atoms meets (their union)."""
    parts = []
    for a in objs:
        v = value_node(a, key)
        if v is TRUE or v.key == ("true",):
            return TRUE
        parts.append(v)
    return any_of(*parts)


def _values_in_any(objs: list[Obj], keys: list[str]) -> tuple[tuple[str, Node], ...]:
    """``(key, _value_in_any(objs, key))`` for each key, asking of each key only the objects
    whose value for it may be other than FALSE: an object closed by
    ``additionalProperties: false`` (no patterns, nothing unevaluated) gives FALSE for a
    key it neither declares nor exempts, and FALSE adds nothing to a union. A hull of 230
    such objects and 340 keys (JsonSchemaStore service-schema) asked 78,000 value nodes."""
    always: list[int] = []
    by_key: dict[str, list[int]] = {}
    for i, a in enumerate(objs):
        names = None
        if not a.patterns and not a.uneval:
            names = next((ns for ns, pats, n in a.additional if not pats and n.key == ("false",)), None)
        if names is None:
            always.append(i)
            continue
        for k in {*names, *(k for k, _ in a.props)}:
            by_key.setdefault(k, []).append(i)
    out = []
    for k in keys:
        some = by_key.get(k)
        idx = always if not some else sorted(always + some) if always else some
        out.append((k, _value_in_any([objs[i] for i in idx], k)))
    return tuple(out)


def _undeclared_value(a: Obj) -> Node:
    """A node that every value of a key ``a`` does not declare meets (its pattern
    properties' values, or where ``a`` limits other keys, any of those limits)."""
    if not a.additional and not a.uneval:
        return TRUE
    rest = all_of(*(n for _, _, n in a.additional + a.uneval))
    return any_of(*(n for _, n in a.patterns), rest)


def _containment_key(a: Atom) -> tuple[Any, ...] | None:
    """What :func:`_may_contain` compares of an object atom (None for other types)."""
    if not isinstance(a, Obj):
        return None
    return (
        frozenset(a.props),
        a.required,
        a.forbidden,
        frozenset(a.patterns),
        frozenset(a.additional),
        frozenset(a.names),
        frozenset(a.uneval),
        a.min_props,
        a.max_props,
    )


def _may_contain(outer: tuple[Any, ...] | None, inner: tuple[Any, ...] | None) -> bool:
    """False when an object atom (``inner``) surely is not within another (``outer``):
    its meet with ``outer`` would add a key, a requirement or a bound. (True for other
    types: the meet decides.)"""
    if outer is None or inner is None:
        return True
    for k in range(7):
        if not outer[k] <= inner[k]:
            return False
    if inner[7] < outer[7]:
        return False
    return outer[8] is None or (inner[8] is not None and inner[8] <= outer[8])


class _OverBudget(Exception):
    """A oneOf's exclusions took more products than its budget (``Budget.one_of_work``)."""


def _annotations(a: Atom) -> tuple[Any, ...]:
    """What an atom tells an enclosing unevaluatedProperties/unevaluatedItems."""
    if isinstance(a, Obj):
        return (a.ev_names, a.ev_patterns, a.ev_all)
    if isinstance(a, Arr):
        return (a.ev_prefix, a.ev_all, a.ev_contains)
    return ()


def _merge(a: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, ...]:
    """The union of two tuples, deduplicated, in order: ``a``'s items, then ``b``'s new
    ones (the order of ``properties`` is the order keys are written in)."""
    if not b or a == b:
        return a
    if not a:
        return b
    seen = set(a)
    return a + tuple(x for x in b if x not in seen)


def _count(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    if isinstance(v, float) and (not math.isfinite(v) or v != int(v)):
        return None
    return max(int(v), 0)


def _esc(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _disjoint_types(xs: tuple[Atom, ...], ys: tuple[Atom, ...]) -> bool:
    tx = {a.type for a in xs if not isinstance(a, Const)}
    ty = {a.type for a in ys if not isinstance(a, Const)}
    if any(isinstance(a, Const) for a in xs + ys):
        return False
    return not (tx & ty)
