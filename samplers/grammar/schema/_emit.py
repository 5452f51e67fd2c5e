"""Atoms to GBNF: one rule per node, objects and arrays as small automata.

Objects: with ``property_order="any"`` the keys come in any order, each at most once;
the automaton's state is the set of keys seen (the required ones, and every declared
one while there are at most ``Budget.tracked`` of them) and, under
``minProperties``/``maxProperties``, the count. With ``"schema"`` the declared keys come
in the schema's order (optional ones may be left out) and other keys after them.
Undeclared keys are split into classes by the ``patternProperties`` they match (key
languages from :mod:`.dfa`), each with its value schema.

Arrays: positions of ``prefixItems`` one by one, then the tail; ``contains`` counts
(with ``minContains``/``maxContains``) are part of the state.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from . import _dfa as dfa_mod
from ._budget import LEVELS, Budget
from ._lower import (
    ANY,
    FALSE,
    Arr,
    Atom,
    Bool,
    Const,
    Lowering,
    Node,
    Null,
    Num,
    Obj,
    Str,
    all_of,
    any_of,
    canon,
    const_node,
    decimal,
    json_type,
    not_node,
    value_node,
)
from ._numbers import GENERATION_DIGITS, NumberSpec, cap_digits
from ._regex import CharSet, RegexSyntaxError, RegexUnsupported, Repeat, anchored, parse
from ._rules import RuleSet, automaton, literal, repeat, triple_label
from ._strings import ANY_CHAR, format_rule, json_char, regex_body, string_literal

__all__ = ["SPACE", "Emitter"]

SPACE = '| " " | "\\n"{1,2} [ \\t]{0,20}'
NEVER = "[^\\x00-\\U0010FFFF]"
_NAME_ONLY = re.compile(r"[a-zA-Z0-9-]+")
#: the most distinct values uniqueItems is enforced over
MAX_UNIQUE_VALUES = 10
#: :meth:`Emitter.node`'s mark of a node without a rule yet
_UNKNOWN = "?"


class Emitter:
    def __init__(
        self,
        low: Lowering,
        rs: RuleSet,
        warn: Callable[[str, str, str], None],
        property_order: str,
        additional_properties: str,
        budget: Budget = LEVELS[0],
    ) -> None:
        self.budget = budget
        self.low = low
        self.rs = rs
        self.warn = warn
        self.order = property_order
        self.extra = additional_properties
        self.rules: dict[Node, str | None] = {}
        self.dfa_rules: dict[Any, str] = {}
        #: whether numbers may have any number of digits: a validator's view; off for
        #: generation, where a model could write digits without end (each part then has at
        #: most 16 digits where the schema sets no bound, as in llama.cpp's converter)
        self.free_digits = False
        #: whether an integer may be written with a zero fraction (``1.0``): a validator's
        #: view from draft 6 on (draft 4's integer has no fraction part)
        self.integer_fraction = False
        rs.fixed("ws", SPACE)
        #: node rules being written, and those of them referred to meanwhile (recursion)
        self._open: set[str] = set()
        self._recursive: set[str] = set()
        self._numbers: dict[tuple[Any, ...], str] = {}
        self._strings: dict[Str, str] = {}

    # nodes -----------------------------------------------------------------------------

    def node(self, n: Node) -> str | None:
        """The rule of a JSON value of node ``n``; None when no value can meet it. A node
        whose body another rule already has (and that does not refer to itself) takes
        that rule's name: subschemas that lower alike share one rule."""
        known = self.rules.get(n, _UNKNOWN)
        if known is not _UNKNOWN:
            if known is not None and known in self._open:
                self._recursive.add(known)
            return known
        atoms = self.low.lower(n)
        if not atoms:
            self.rules[n] = None
            return None
        name = self.rs.reserve("value" if n.op == "true" else _hint(n))
        self.rules[n] = name
        self._open.add(name)
        try:
            body = self.atoms(atoms, n.ptr)
        finally:
            self._open.discard(name)
        if not body:
            self.rs.define(name, NEVER)
            self.rules[n] = None
            return None
        if name not in self._recursive:
            same = self.rs.by_body.get(body) or (body if _NAME_ONLY.fullmatch(body) else None)
            if same is not None:
                self.rules[n] = same
                return same
        self.rs.define(name, body)
        return name

    def atoms(self, atoms: tuple[Atom, ...], ptr: str) -> str:
        if atoms == ANY:
            return self.any_value()
        alts = [b for a in atoms if (b := self.atom(a, ptr))]
        return " | ".join(dict.fromkeys(alts))

    def any_value(self) -> str:
        rs = self.rs
        if "json-value" not in rs.bodies:
            rs.fixed("json-value", "")
            ch = json_char(rs, ANY_CHAR)
            rs.fixed("json-string", f'"\\"" {ch}* "\\""')
            rs.fixed("json-number", '"-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [+-]? [0-9]+)?')
            rs.fixed(
                "json-object",
                '"{" ws (json-string ws ":" ws json-value ws ("," ws json-string ws ":" ws json-value ws)*)? "}"',
            )
            rs.fixed("json-array", '"[" ws (json-value ws ("," ws json-value ws)*)? "]"')
            rs.bodies["json-value"] = 'json-object | json-array | json-string | json-number | "true" | "false" | "null"'
        return "json-value"

    def atom(self, a: Atom, ptr: str) -> str:
        if isinstance(a, Null):
            return '"null"'
        if isinstance(a, Bool):
            return " | ".join('"true"' if v else '"false"' for v in sorted(a.values, reverse=True))
        if isinstance(a, Num):
            return self.number(a, ptr)
        if isinstance(a, Str):
            return self.string(a, ptr)
        if isinstance(a, Const):
            return " | ".join(dict.fromkeys(b for v in a.values if (b := self.const(v, ptr))))
        if isinstance(a, Arr):
            return self.array(a, ptr)
        if isinstance(a, Obj):
            return self.object(a, ptr)
        raise AssertionError(a)

    # scalars ---------------------------------------------------------------------------

    def number(self, a: Num, ptr: str) -> str:
        key = (a.spec.key(), a.non_integer, a.excluded)
        hit = self._numbers.get(key)
        if hit is None:
            hit = self._numbers[key] = self._number(a, ptr)
        return hit

    def _number(self, a: Num, ptr: str) -> str:
        def warn(keyword: str, msg: str) -> None:
            self.warn(keyword, ptr, msg)

        specs = [a.spec]
        for v in sorted(set(a.excluded)):
            nxt = []
            for s in specs:
                nxt += [s.intersect(NumberSpec(hi=v, hi_strict=True)), s.intersect(NumberSpec(lo=v, lo_strict=True))]
            specs = [s for s in nxt if not s.empty()]
        bodies = []
        for s in specs:
            body = s.body(
                self.rs,
                warn,
                non_integer=a.non_integer,
                zero_fraction=self.integer_fraction,
                multiple_fraction=self.free_digits,
            )
            if not self.free_digits:  # generation: no endless digits
                body = cap_digits(body, GENERATION_DIGITS, self.rs)
            if body:
                bodies.append(body)
        return " | ".join(f"({b})" if "|" in b else b for b in bodies)

    def string(self, a: Str, ptr: str) -> str:
        hit = self._strings.get(a)
        if hit is None:
            hit = self._strings[a] = self._string(a, ptr)
        return hit

    def _string(self, a: Str, ptr: str) -> str:
        rs = self.rs
        complex_ = bool(a.not_patterns or a.excluded or a.not_lengths or len(a.patterns) > 1)
        complex_ = complex_ or bool(a.patterns and (a.min_len or a.max_len is not None))
        fmt_rule = None
        for f in a.formats:
            r = format_rule(rs, f)
            if r is None:
                self.warn("format", ptr, f"unknown format {f!r} is not enforced")
            elif fmt_rule is None:
                fmt_rule = r
        if fmt_rule is not None:
            if a.patterns or a.min_len or a.max_len is not None or complex_:
                self.warn("format", ptr, "a format together with other string keywords: only the format is enforced")
            return fmt_rule
        simple = self._class_run(a)
        if simple is not None:
            return simple
        if complex_:
            try:
                d = dfa_mod.length(a.min_len, a.max_len) if (a.min_len or a.max_len is not None) else None
                for p in a.patterns:
                    d = _and(d, dfa_mod.pattern(p))
                for p in a.not_patterns:
                    d = _and(d, dfa_mod.pattern(p).complement())
                if a.excluded:
                    d = _and(d, dfa_mod.literals(list(a.excluded)).complement())
                for lo, hi in a.not_lengths:
                    d = _and(d, dfa_mod.length(lo, hi).complement())
                assert d is not None
                if d.empty():
                    return ""
                return '"\\"" ' + self._dfa_rule(d, "str")
            except (OverflowError, RegexUnsupported, RegexSyntaxError) as e:
                self.warn(
                    "pattern",
                    ptr,
                    f"string constraints not enforced together ({e}): the first pattern or the length is",
                )
        if a.patterns:
            try:
                body = regex_body(rs, anchored(parse(a.patterns[0])))
                return f'"\\"" {body} "\\""'
            except (RegexUnsupported, OverflowError) as e:
                self.warn("pattern", ptr, f"pattern {a.patterns[0]!r} is not enforced: {e}")
            except RegexSyntaxError as e:
                from ..errors import SchemaError

                raise SchemaError(f"JSON schema error at {ptr}/pattern: {e}") from None
        ch = json_char(rs, ANY_CHAR)
        try:
            body = repeat(rs, ch, a.min_len, a.max_len)
        except OverflowError as e:
            self.warn("maxLength", ptr, f"string lengths are not enforced: {e}")
            body = f"{ch}*"
        return '"\\"" ' + body + ' "\\""'

    def _class_run(self, a: Str) -> str | None:
        """A single pattern ``^[class]{m,n}$`` (or ``*``, ``+``) with lengths: one bounded
        run of the class, the bounds intersected (what pydantic's ``constr`` writes)."""
        if len(a.patterns) != 1 or a.not_patterns or a.excluded or a.not_lengths:
            return None
        try:
            node = anchored(parse(a.patterns[0]))
        except (RegexUnsupported, RegexSyntaxError):
            return None
        if not (isinstance(node, Repeat) and isinstance(node.item, CharSet)):
            return None
        lo = max(node.min, a.min_len)
        his = [h for h in (node.max, a.max_len) if h is not None]
        hi = min(his) if his else None
        if hi is not None and hi < lo:
            return ""
        try:
            body = repeat(self.rs, json_char(self.rs, node.item.ivs), lo, hi)
        except OverflowError:
            return None
        return '"\\"" ' + body + ' "\\""'

    def const(self, v: Any, ptr: str) -> str:
        t = json_type(v)
        if t == "null":
            return '"null"'
        if t == "boolean":
            return '"true"' if v else '"false"'
        if t == "string":
            return string_literal(self.rs, v)
        if t == "number":
            x = decimal(v)
            return self.number(Num(NumberSpec(lo=x, hi=x)), ptr)
        if t == "array":
            return self.array(
                Arr(prefix=tuple(const_node(x) for x in v), items=FALSE, min_items=len(v), max_items=len(v)), ptr
            )
        obj = Obj(
            props=tuple((k, const_node(x)) for k, x in v.items()),
            required=frozenset(v),
            min_props=len(v),
            max_props=len(v),
        )
        return self.object(obj, ptr, closed=True)

    # arrays ------------------------------------------------------------------------------

    def array(self, a: Arr, ptr: str) -> str:
        if a.unique and (a.max_items is None or a.max_items > 1):
            body = self._unique_finite(a, ptr)
            if body is not None:
                return body
            self.warn("uniqueItems", ptr, "uniqueItems is not enforced (items of more than a few values)")
        n = len(a.prefix)
        contains = list(a.contains)
        if len(contains) > 3:
            self.warn("contains", ptr, "more than 3 contains keywords together: only the first 3 are enforced")
            contains = contains[:3]

        def elem(i: int, subset: tuple[int, ...]) -> str | None:
            node = a.prefix[i] if i < n else a.items
            parts = [node]
            for p0, cs, u in a.uneval:
                if i >= p0:
                    parts.append(any_of(u, *cs))
            for j, (c, _lo, hi) in enumerate(contains):
                if j in subset:
                    parts.append(c)
                elif hi is not None:
                    parts.append(not_node(c))
            return self.node(all_of(*parts))

        if not contains:
            return self._array_simple(a, n, elem)
        caps = [max(lo, hi + 1 if hi is not None else 0) for _, lo, hi in contains]
        last = max(n, a.min_items) if a.max_items is None else a.max_items
        n_states = (last + 1) * max(1, _prod(c + 1 for c in caps))
        if n_states > self.budget.max_states:
            self.warn("contains", ptr, f"relaxed: contains is not enforced ({n_states} states for these counts)")
            del contains[:]  # the items without any contains constraint
            return self._array_simple(a, n, elem)

        def step(st: tuple[int, tuple[int, ...], bool]) -> list[tuple[str, Any]]:
            pos, counts, first = st
            alts: list[tuple[str, Any]] = []
            if pos >= a.min_items and all(k >= lo for k, (_, lo, _) in zip(counts, contains, strict=True)):
                alts.append(('"]"', None))
            if a.max_items is None or pos < a.max_items:
                npos = min(pos + 1, last) if a.max_items is None else pos + 1
                sep = "" if first else '"," ws '
                for subset in _subsets(len(contains)):
                    nc = list(counts)
                    bad = False
                    for j in subset:
                        nc[j] += 1
                        hi = contains[j][2]
                        if hi is not None and nc[j] > hi:
                            bad = True
                        nc[j] = min(nc[j], caps[j])
                    if bad:
                        continue
                    rule = elem(pos, subset)
                    if rule is not None:
                        alts.append((f"{sep}{rule} ws", (npos, tuple(nc), False)))
            return alts

        head = automaton(self.rs, "arr", (0, tuple(0 for _ in caps), True), step)
        return "" if head is None else f'"[" ws {head}'

    def _unique_finite(self, a: Arr, ptr: str) -> str | None:
        """uniqueItems where every position holds one of a few values (enums, booleans,
        null; at most :data:`MAX_UNIQUE_VALUES`): an automaton whose state is the set of
        values used (the array's length so far is its size). None when that does not apply."""
        if a.contains or a.uneval:
            return None
        doms: list[list[Any]] = []
        for node in (*a.prefix, a.items):
            vals: list[Any] = []
            for atom in self.low.lower(node):
                if isinstance(atom, Const):
                    vals += list(atom.values)
                elif isinstance(atom, Bool):
                    vals += sorted(atom.values)
                elif isinstance(atom, Null):
                    vals.append(None)
                else:
                    return None
            doms.append(list({canon(v): v for v in vals}.values()))
        universe = list({canon(v): v for d in doms for v in d}.values())
        if len(universe) > MAX_UNIQUE_VALUES:
            return None
        keys = [canon(v) for v in universe]
        n = len(a.prefix)
        lits = [self.const(v, ptr) for v in universe]
        dom_sets = [{canon(v) for v in d} for d in doms]

        def step(st: tuple[int, bool]) -> list[tuple[str, Any]]:
            used, first = st
            pos = bin(used).count("1")
            alts: list[tuple[str, Any]] = []
            if pos >= a.min_items:
                alts.append(('"]"', None))
            if a.max_items is None or pos < a.max_items:
                dom = dom_sets[min(pos, n)]
                sep = "" if first else '"," ws '
                for i, k in enumerate(keys):
                    if k in dom and not used >> i & 1:
                        alts.append((f"{sep}({lits[i]}) ws", (used | 1 << i, False)))
            return alts

        head = automaton(self.rs, "uniq", (0, True), step)
        return "" if head is None else f'"[" ws {head}'

    def _array_simple(self, a: Arr, n: int, elem: Callable[[int, tuple[int, ...]], str | None]) -> str:
        lo, hi = a.min_items, a.max_items
        if hi is not None:
            n = min(n, hi)

        def sep(i: int) -> str:
            return "" if i == 0 else '"," ws '

        def step(i: int) -> list[tuple[str, Any]]:
            if i < n:
                alts: list[tuple[str, Any]] = [('"]"', None)] if i >= lo else []
                r = elem(i, ())
                if r:
                    alts.append((f"{sep(i)}{r} ws", i + 1))
                return alts
            t_lo = max(lo - n, 0)
            t_hi = None if hi is None else hi - n
            r = elem(n, ()) if (t_hi is None or t_hi > 0) else None
            alts = [('"]"', None)] if t_lo == 0 else []
            if r:
                rest_hi = None if t_hi is None else t_hi - 1
                rest = ""
                if rest_hi != 0:
                    try:
                        rest = repeat(self.rs, f'("," ws {r} ws)', max(t_lo - 1, 0), rest_hi) + " "
                    except OverflowError as e:
                        self.warn("maxItems", "#", f"array lengths are not enforced: {e}")
                        rest = f'("," ws {r} ws)* '
                alts.append((f'{sep(n)}{r} ws {rest}"]"', None))
            return alts

        head = automaton(self.rs, "arr", 0, step, label=str)
        return "" if head is None else f'"[" ws {head}'

    # objects -----------------------------------------------------------------------------

    def object(self, a: Obj, ptr: str, closed: bool = False) -> str:
        low = self.low
        rs = self.rs
        listed = list(dict.fromkeys(k for k, _ in a.props))
        # required keys without a properties entry: after the listed ones
        unlisted = sorted(a.required - set(listed))
        if self.order == "required-first":
            # llama.cpp's order: the required keys (in the order of properties), then the
            # optional ones (the same order); required keys without a properties entry between
            declared = [k for k in listed if k in a.required] + unlisted + [k for k in listed if k not in a.required]
        else:
            declared = listed + unlisted
        pairs: dict[str, str] = {}
        for k in declared:
            if k in a.forbidden:
                continue
            if a.names and not all(low.matches_node(nn, k) for nn in a.names):
                continue
            rule = self.node(value_node(a, k))
            if rule is None:
                continue
            pairs[k] = rs.add("kv", f'{string_literal(rs, k)} ws ":" ws {rule} ws')
        if not a.required <= set(pairs):
            return ""
        # undeclared keys
        others: list[str] = []
        explicit = bool(a.additional or a.patterns or a.uneval) or not a.props
        if not closed and (self.extra == "schema" or explicit):
            others = self._other_pairs(a, frozenset(declared) | a.forbidden, ptr)
        if self.order == "any":
            return self._any_order(a, pairs, others, ptr)
        return self._schema_order(a, declared, pairs, others, ptr)

    def _other_pairs(self, a: Obj, known: frozenset[str], ptr: str) -> list[str]:
        """The (key, value) rules of keys outside ``known``: one per class of keys that
        the patterns of ``patternProperties`` tell apart, each with its value schema."""
        memo_key = ("other", known, a.patterns, a.additional, a.uneval, a.names)
        hit = self.rs.memo.get(memo_key)
        if hit is not None:
            return list(hit)
        pats = list(dict.fromkeys([p for p, _ in a.patterns]))
        if not pats and self._class_value(a, [], []) is FALSE:
            # no undeclared key may appear (additionalProperties false): no automaton of
            # the keys they could be
            self.rs.memo[memo_key] = ()
            return []
        exact: list[tuple[str, dfa_mod.DFA]] = []
        loose: list[str] = []
        for p in pats:
            if len(exact) >= self.budget.pattern_classes:
                loose.append(p)
                continue
            try:
                exact.append((p, dfa_mod.pattern(p)))
            except RegexSyntaxError as e:
                from ..errors import SchemaError

                raise SchemaError(f"JSON schema error at {ptr}/patternProperties: {e}") from None
            except (OverflowError, RegexUnsupported):
                loose.append(p)
        base = dfa_mod.literals(sorted(known)).complement() if known else None
        if base is not None and len(base.edges) > self.budget.max_key_states:
            self.warn(
                "properties",
                ptr,
                f"relaxed: undeclared keys are not told apart from the {len(known)} declared ones (an automaton"
                f" of {len(base.edges)} states): a declared key may also take an undeclared key's value",
            )
            base = None
        try:
            names_dfa = self._names_dfa(a, ptr)
        except (OverflowError, RegexUnsupported, RegexSyntaxError):
            names_dfa = None
            self.warn("propertyNames", ptr, "relaxed: undeclared keys are not checked against propertyNames")
        if names_dfa is not None:
            try:
                base = names_dfa if base is None else base.intersect(names_dfa)
            except OverflowError:
                self.warn("propertyNames", ptr, "relaxed: undeclared keys are not checked against propertyNames")
        while True:
            try:
                out = self._pattern_classes(a, base, exact, loose)
                break
            except OverflowError:
                if not exact:
                    raise
                loose.insert(0, exact.pop()[0])  # the products grew too large: one pattern fewer
        if loose:
            self.warn(
                "patternProperties",
                ptr,
                f"relaxed: keys are not checked against {', '.join(map(repr, loose))}: an undeclared key may"
                " take the value of a key that matches it, or of one that does not",
            )
        self.rs.memo[memo_key] = tuple(out)
        return out

    def _pattern_classes(
        self, a: Obj, base: dfa_mod.DFA | None, exact: list[tuple[str, dfa_mod.DFA]], loose: list[str]
    ) -> list[str]:
        out = []
        for matched, d in _classes(base, [pd for _, pd in exact]):
            hit = [p for (p, _), m in zip(exact, matched, strict=True) if m]
            parts: list[Node] = [n for q, n in a.patterns if q in hit]
            # keys of the class may match a loose pattern or not: the value meets the
            # schema of either case (matching two is within matching one of them)
            cases = [self._class_value(a, parts, hit)]
            cases += [self._class_value(a, [*parts, *(n for q, n in a.patterns if q == p)], [*hit, p]) for p in loose]
            rule = self.node(any_of(*cases))
            if rule is None:
                continue
            out.append(self.rs.add("kv", f'{self._key_rule(d)} ws ":" ws {rule} ws'))
        return out

    @staticmethod
    def _class_value(a: Obj, parts: list[Node], hit: list[str]) -> Node:
        extra = [n for _names, ps, n in a.additional + a.uneval if not any(p in ps for p in hit)]
        return all_of(*parts, *extra)

    def _names_dfa(self, a: Obj, ptr: str) -> dfa_mod.DFA | None:
        d = None
        for n in a.names:
            atoms = [x for x in self.low.lower(n) if isinstance(x, Str | Const)]
            union: dfa_mod.DFA | None = None
            for x in atoms:
                xd: dfa_mod.DFA | None
                if isinstance(x, Const):
                    xd = dfa_mod.literals([v for v in x.values if isinstance(v, str)])
                else:
                    xd = _str_dfa(x)
                    if xd is None:
                        self.warn("propertyNames", ptr, "propertyNames with a format is not enforced")
                        return None
                union = xd if union is None else union.complement().intersect(xd.complement()).complement()
            if union is None:
                union = dfa_mod.DFA([[]], set())
            d = union if d is None else d.intersect(union)
        return d

    def _key_rule(self, d: dfa_mod.DFA | None) -> str:
        if d is None:
            return f'"\\"" {json_char(self.rs, ANY_CHAR)}* "\\""'
        return '"\\"" ' + self._dfa_rule(d, "key")

    def _dfa_rule(self, d: dfa_mod.DFA, hint: str) -> str:
        """The start rule of an automaton's rules (one set per distinct automaton)."""
        sig = (tuple(tuple(row) for row in d.edges), frozenset(d.accepting))
        hit = self.dfa_rules.get(sig)
        if hit is None:
            hit = self.dfa_rules[sig] = dfa_mod.to_gbnf(d, self.rs, hint, json_char)
        return hit

    def _counts(self, a: Obj, n_states: int, ptr: str) -> tuple[bool, int]:
        """Whether the automaton counts keys (min/maxProperties beyond what required
        implies), and the count it saturates at; relaxed past ``Budget.max_states``."""
        counted = a.max_props is not None or a.min_props > len(a.required)
        cap = (a.max_props if a.max_props is not None else a.min_props) if counted else 0
        if counted and n_states * (cap + 1) > self.budget.max_states:
            self.warn(
                "maxProperties" if a.max_props is not None else "minProperties",
                ptr,
                f"relaxed: the number of properties is not enforced ({n_states * (cap + 1)} states)",
            )
            return False, 0
        return counted, cap

    def _any_order(self, a: Obj, pairs: dict[str, str], others: list[str], ptr: str) -> str:
        keys = list(pairs)
        required = [k for k in keys if k in a.required]
        # the state is the set of tracked keys seen: every key while there are few (each
        # at most once), else the required ones only (the others may repeat)
        tracked = keys if len(keys) <= self.budget.tracked else required
        most = self.budget.tracked_required
        if len(required) > most:
            tracked = required[:most]
            rest = required[most:]
            self.warn(
                "required",
                ptr,
                f"relaxed: {len(required)} required keys in any order: {', '.join(map(repr, rest))} may be missing"
                f" (an exact grammar needs 2^{len(required)} states; property_order='schema' enforces them all)",
            )
        counted, cap = self._counts(a, 2 ** len(tracked), ptr)
        index = {k: i for i, k in enumerate(tracked)}
        must = sum(1 << index[k] for k in tracked if k in a.required)
        untracked = [pairs[k] for k in keys if k not in index] + others
        free = self.rs.add("pair", " | ".join(untracked)) if untracked else ""

        def step(st: tuple[int, int, bool]) -> list[tuple[str, Any]]:
            mask, count, first = st
            alts: list[tuple[str, Any]] = []
            if mask & must == must and (not counted or count >= a.min_props):
                alts.append(('"}"', None))
            if counted and a.max_props is not None and count >= a.max_props:
                return alts
            nc = min(count + 1, cap) if counted else 0
            sep = "" if first else '"," ws '
            for k, i in index.items():
                if not mask >> i & 1:
                    alts.append((f"{sep}{pairs[k]}", (mask | 1 << i, nc, False)))
            if free:
                alts.append((f"{sep}{free}", (mask, nc, False)))
            return alts

        head = automaton(self.rs, "obj", (0, 0, True), step, label=triple_label)
        return "" if head is None else f'"{{" ws {head}'

    def _schema_order(self, a: Obj, keys: list[str], pairs: dict[str, str], others: list[str], ptr: str) -> str:
        keys = [k for k in keys if k in pairs]
        n = len(keys)
        counted, cap = self._counts(a, n + 2, ptr)
        free = self.rs.add("pair", " | ".join(others)) if others else ""
        # (past half the rule budget, the automaton's own count decides when it is too large)
        if not counted and 2 * n + 2 <= self.rs.max_rules // 2:
            return self._schema_order_rules(a, keys, pairs, free)
        return self._schema_order_automaton(a, keys, pairs, free, counted, cap)

    def _schema_order_automaton(
        self, a: Obj, keys: list[str], pairs: dict[str, str], free: str, counted: bool, cap: int
    ) -> str:
        """The object's rules in schema order, as an automaton (:func:`automaton`)."""
        n = len(keys)

        # state (i, count, first): key i comes next or, if optional, is skipped (an empty
        # step: one derivation per text, and O(n) alternatives in all); undeclared keys
        # and the closing brace come after the last declared key
        def step(st: tuple[int, int, bool]) -> list[tuple[str, Any]]:
            i, count, first = st
            alts: list[tuple[str, Any]] = []
            full = counted and a.max_props is not None and count >= a.max_props
            nc = min(count + 1, cap) if counted else 0
            sep = "" if first else '"," ws '
            if i < n:
                if not full:
                    alts.append((f"{sep}{pairs[keys[i]]}", (i + 1, nc, False)))
                if keys[i] not in a.required:
                    alts.append(("", (i + 1, count, first)))
            else:
                if not counted or count >= a.min_props:
                    alts.append(('"}"', None))
                if free and not full:
                    alts.append((f"{sep}{free}", (n, nc, False)))
            return alts

        head = automaton(self.rs, "obj", (0, 0, True), step, label=triple_label)
        return "" if head is None else f'"{{" ws {head}'

    def _schema_order_rules(self, a: Obj, keys: list[str], pairs: dict[str, str], free: str) -> str:
        """The rules :meth:`_schema_order_automaton` makes when it counts no keys,
        written at once (the same rules, names and alternatives in the same order; every
        state can end, and only the states reached get a rule): ``obj-<i>-0-f`` before any
        key, ``obj-<i>-0-n`` after one, key ``i`` next."""
        rs = self.rs
        n = len(keys)
        required = a.required
        # the states before any key: 0, and each after an optional key (skipped)
        lead = 1
        while lead <= n and keys[lead - 1] not in required:
            lead += 1
        first = [rs.fresh(f"obj-{i}-0-f") for i in range(lead)]
        later = [""] + [rs.fresh(f"obj-{i}-0-n") for i in range(1, n + 1)]
        if n == 0 and free:
            later[0] = rs.fresh("obj-0-0-n")
        define = rs.define
        for i in range(n + 1):
            for name, sep in ((first[i] if i < lead else "", ""), (later[i], '"," ws ')):
                if not name:
                    continue
                if i < n:
                    body = f"{sep}{pairs[keys[i]]} {later[i + 1]}"
                    if keys[i] not in required:
                        body += f" | {first[i + 1] if sep == '' else later[i + 1]}"
                else:
                    body = f'"}}" | {sep}{free} {later[n]}' if free else '"}"'
                define(name, body)
        return f'"{{" ws {first[0]}'


def _classes(
    base: dfa_mod.DFA | None, dfas: list[dfa_mod.DFA]
) -> Iterator[tuple[tuple[bool, ...], dfa_mod.DFA | None]]:
    """The classes of keys ``dfas`` tell apart, within ``base``: for each choice of
    matching or not each automaton (in ``itertools.product((True, False), ...)`` order),
    the product of ``base`` with each automaton or its complement, unless empty. Built
    depth first: each prefix's product is met once for all the choices that extend it,
    each complement made once, and an empty prefix ends every choice below it (n
    patterns took n * 2^n products, now at most 2^(n+1))."""
    comps: list[dfa_mod.DFA | None] = [None] * len(dfas)

    def down(i: int, d: dfa_mod.DFA | None, matched: tuple[bool, ...]) -> Iterator[Any]:
        if i == len(dfas):
            yield matched, d
            return
        for m in (True, False):
            if m:
                e = dfas[i]
            else:
                c = comps[i]
                e = comps[i] = dfas[i].complement() if c is None else c
            nd = _and(d, e)
            if not nd.empty():
                yield from down(i + 1, nd, (*matched, m))

    if base is not None and base.empty():
        return iter(())
    return down(0, base, ())


def _and(d: dfa_mod.DFA | None, e: dfa_mod.DFA) -> dfa_mod.DFA:
    return e if d is None else d.intersect(e)


def _str_dfa(a: Str) -> dfa_mod.DFA | None:
    if a.formats:
        return None
    d = dfa_mod.length(a.min_len, a.max_len) if (a.min_len or a.max_len is not None) else dfa_mod.length(0, None)
    for p in a.patterns:
        d = d.intersect(dfa_mod.pattern(p))
    for p in a.not_patterns:
        d = d.intersect(dfa_mod.pattern(p).complement())
    if a.excluded:
        d = d.intersect(dfa_mod.literals(list(a.excluded)).complement())
    for lo, hi in a.not_lengths:
        d = d.intersect(dfa_mod.length(lo, hi).complement())
    return d


def _subsets(k: int) -> list[tuple[int, ...]]:
    return [tuple(j for j in range(k) if m >> j & 1) for m in range(2**k)]


def _prod(xs: Any) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def _hint(n: Node) -> str:
    tail = n.ptr.rsplit("/", 1)[-1] if n.ptr else "value"
    return tail if tail and not tail.startswith("#") else "value"


del literal
