"""Hypothesis strategies for property tests of code built on :mod:`samplers`.

* :func:`sampler_chains`: :class:`~samplers.SamplerChain` objects with valid, varied
  parameters (degenerate no-op values included), ending in a selecting sampler.
* :func:`grammars_with_examples`: GBNF grammars with strings they accept and near misses
  they reject (:class:`GrammarExample`), from a small generative grammar model.
* :func:`json_schemas`: JSON schemas with instances they accept (:class:`SchemaExample`).
* :class:`BranchMachine`: a hypothesis state machine of a
  :class:`~samplers.branch.BranchStore` (tree, ids, KV cells, logits against fresh
  decodes) to run against your model or extend with your own rules.

Rows of logits, token sequences and the tiny test model are in :mod:`llama_cffi.testing`
(``llama_cffi`` never imports ``samplers``). hypothesis is imported when a strategy is
asked for, so this module imports without it. A property test::

    from hypothesis import given
    from llama_cffi.testing import logits_rows
    from samplers import Candidates
    from samplers.testing import sampler_chains

    @given(logits_rows(), sampler_chains())
    def test_a_chain_selects_a_token(row, chain):
        cands = Candidates.from_logits(row)
        chain.apply(cands)
        assert 0 <= cands.token < len(row)
"""

from __future__ import annotations

import json
import random
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

from llama_cffi.testing import floats32

from .adaptive import AdaptiveP
from .base import Sampler
from .bias import LogitBias
from .chain import SamplerChain
from .mirostat import Mirostat, MirostatV2
from .penalties import Penalties
from .selection import Dist, Greedy
from .temperature import Temperature, TempExt
from .truncation import XTC, MinP, TopK, TopNSigma, TopP, Typical

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from ._branch_machine import BranchMachine as BranchMachine
    from ._branch_machine import Node as Node

__all__ = [
    "FILTERS",
    "SELECTORS",
    "BranchMachine",
    "GrammarExample",
    "GrammarExampleMismatch",
    "Node",
    "SchemaExample",
    "grammars_with_examples",
    "json_schemas",
    "sampler_chains",
]


def _require_hypothesis() -> None:
    """Import hypothesis, or raise an ImportError that says how to get it."""
    try:
        import hypothesis  # noqa: F401
    except ImportError as e:
        raise ImportError(
            "samplers.testing's strategies need hypothesis: pip install hypothesis  "
            "(or: pip install 'llama-cffi[test]')"
        ) from e


# --------------------------------------------------------------------------- sampler chains
#: Samplers :func:`sampler_chains` may put before the selector, by llama.cpp name.
#: ``logit-bias`` needs ``n_vocab``. DRY and infill need a model and are not drawn.
FILTERS: tuple[str, ...] = (
    "top-k", "top-p", "min-p", "typical", "top-n-sigma", "xtc", "temp", "temp-ext", "penalties", "logit-bias",
)  # fmt: skip
#: Selecting samplers :func:`sampler_chains` may end a chain with. ``mirostat`` needs ``n_vocab``.
SELECTORS: tuple[str, ...] = ("greedy", "dist", "mirostat", "mirostat-v2", "adaptive-p")
_NEED_N_VOCAB = frozenset({"logit-bias", "mirostat"})
_MAX_SEED = 2**32 - 2  # 2**32 - 1 is LLAMA_DEFAULT_SEED: a random seed, not reproducible


def _names(given: Collection[str] | None, known: tuple[str, ...], what: str, n_vocab: int | None) -> list[str]:
    if given is None:
        return [n for n in known if n_vocab is not None or n not in _NEED_N_VOCAB]
    names = list(given)
    for n in names:
        if n not in known:
            raise ValueError(f"unknown {what} {n!r}: choose from {', '.join(known)}")
        if n in _NEED_N_VOCAB and n_vocab is None:
            raise ValueError(f"{what} {n!r} needs n_vocab")
    return names


def sampler_chains(
    n_vocab: int | None = None,
    *,
    min_filters: int = 0,
    max_filters: int = 4,
    filters: Collection[str] | None = None,
    selectors: Collection[str] | None = None,
) -> SearchStrategy[SamplerChain]:
    """Fresh :class:`~samplers.SamplerChain` objects (owned by the test): ``min_filters``
    to ``max_filters`` samplers named in ``filters`` (default: all of :data:`FILTERS`
    that can be built), in any order, repeats allowed, then one selecting sampler named
    in ``selectors`` (default: all usable :data:`SELECTORS`).

    ``n_vocab`` is the vocabulary size the chain will sample from (rows of that length);
    without it, samplers that need it (``logit-bias``, ``mirostat``) are left out. Every
    parameter is valid and reproducible: seeds in ``[0, 2**32 - 2]``, probabilities in
    ``[0, 1]``, temperatures ``0`` (greedy), ``1`` (no-op) or in ``[0.125, 4]``, the
    documented no-op values (``k <= 0``, ``p >= 1``, ``last_n`` 0) included; logit biases
    are finite (in ``[-10, 10]``); a ``penalties`` sampler comes with up to 8 accepted
    history tokens. On a row of :func:`llama_cffi.testing.logits_rows` a drawn chain
    selects a token without raising (``chain.apply(Candidates.from_logits(row))``).
    That token can be a masked (``-inf``) one exactly where llama.cpp's would be too:
    ``XTC(t=0)`` keeps only the least likely candidate, and selectors then see only
    ``-inf`` logits (numpy may warn about them: ``np.errstate(invalid="ignore")``).
    """
    _require_hypothesis()
    from hypothesis import strategies as st

    if n_vocab is not None and (isinstance(n_vocab, bool) or not isinstance(n_vocab, int) or n_vocab < 1):
        raise ValueError(f"n_vocab must be None or an int >= 1, not {n_vocab!r}")
    if not 0 <= min_filters <= max_filters:
        raise ValueError(f"need 0 <= min_filters <= max_filters, not {min_filters}, {max_filters}")
    filter_names = _names(filters, FILTERS, "filter", n_vocab)
    selector_names = _names(selectors, SELECTORS, "selector", n_vocab)
    if not selector_names:
        raise ValueError("selectors must name at least one selecting sampler")
    if not filter_names and min_filters > 0:
        raise ValueError("filters is empty but min_filters > 0")

    prob = floats32(0.0, 1.0)
    min_keep = st.integers(0, 4)
    seed = st.integers(0, _MAX_SEED)
    vocab_hi = (n_vocab or 64) - 1

    def one(name: str) -> SearchStrategy[Sampler]:
        if name == "top-k":
            return st.builds(TopK, st.integers(-1, 64))
        if name == "top-p":
            return st.builds(TopP, prob, min_keep)
        if name == "min-p":
            return st.builds(MinP, prob, min_keep)
        if name == "typical":
            return st.builds(Typical, prob, min_keep)
        if name == "top-n-sigma":
            return st.builds(TopNSigma, floats32(-1.0, 4.0))
        if name == "xtc":
            return st.builds(XTC, prob, floats32(0.0, 0.625), min_keep, seed)
        if name == "temp":
            return st.builds(Temperature, st.sampled_from((1.0, 0.0)) | floats32(0.125, 4.0))
        if name == "temp-ext":
            return st.builds(TempExt, floats32(0.0, 3.0), floats32(-1.0, 2.0), floats32(0.125, 3.0))
        if name == "penalties":
            return st.builds(
                _penalties,
                st.integers(-1, 16),
                floats32(0.5, 2.0),
                floats32(-1.0, 1.0),
                floats32(-1.0, 1.0),
                st.just(n_vocab or 1),
                st.lists(st.integers(0, vocab_hi), max_size=8),
            )
        if name == "logit-bias":
            assert n_vocab is not None
            return st.builds(
                LogitBias,
                st.just(n_vocab),
                st.dictionaries(st.integers(0, n_vocab - 1), floats32(-10.0, 10.0), max_size=8),
            )
        if name == "greedy":
            return st.just(None).map(lambda _: Greedy())
        if name == "dist":
            return st.builds(Dist, seed)
        tau, eta = floats32(1.0, 8.0), floats32(0.015625, 1.0)
        if name == "mirostat":
            assert n_vocab is not None
            return st.builds(Mirostat, st.just(n_vocab), seed, tau, eta, st.integers(1, 100))
        if name == "mirostat-v2":
            return st.builds(MirostatV2, seed, tau, eta)
        assert name == "adaptive-p"
        return st.builds(AdaptiveP, floats32(-0.5, 1.0), floats32(0.0, 0.99), seed)

    selector = st.one_of([one(n) for n in selector_names])
    if filter_names:
        body = st.lists(st.one_of([one(n) for n in filter_names]), min_size=min_filters, max_size=max_filters)
    else:
        body = st.just([])
    return st.builds(lambda fs, s: SamplerChain([*fs, s]), body, selector)


def _penalties(
    last_n: int, repeat: float, freq: float, present: float, n_vocab: int, history: Iterable[int]
) -> Penalties:
    p = Penalties(last_n, repeat, freq, present, n_vocab)
    for t in history:
        p.accept(t)
    return p


# --------------------------------------------------------------------------- grammar model
# A grammar is a tree of the nodes below (no rule refers back to itself except a
# _Nest, whose recursion always follows a non-empty literal: never left-recursive).
# From one tree come the GBNF text, random sentences, and an independent recognizer
# that labels the near misses. Identity equality: nodes are keys of memo tables.


@dataclass(frozen=True, eq=False)
class _Lit:
    text: str  # non-empty


@dataclass(frozen=True, eq=False)
class _Class:
    negated: bool
    ranges: tuple[tuple[str, str], ...]  # inclusive character ranges, lo <= hi

    def matches(self, c: str) -> bool:
        return any(lo <= c <= hi for lo, hi in self.ranges) != self.negated


@dataclass(frozen=True, eq=False)
class _Seq:
    items: tuple[_Node, ...]


@dataclass(frozen=True, eq=False)
class _Alt:
    options: tuple[_Node, ...]


@dataclass(frozen=True, eq=False)
class _Repeat:
    node: _Node  # never derives the empty string
    lo: int
    hi: int | None  # None: unbounded


@dataclass(frozen=True, eq=False)
class _Rule:
    name: str
    node: _Node


@dataclass(frozen=True, eq=False)
class _Nest:
    """``name ::= open (inner | name)* close``: balanced brackets."""

    name: str
    open: str
    inner: _Node  # never derives the empty string
    close: str


_Node: TypeAlias = _Lit | _Class | _Seq | _Alt | _Repeat | _Rule | _Nest

#: Characters of literals (quote, backslash and newline need escapes in GBNF).
_LIT_CHARS = 'abxyz01 -."\\\né日'
#: Class ranges (sub-ranges are drawn) and single class members (``]``, ``-``, ``^``,
#: ``[`` and backslash need escapes inside a class).
_CLASS_RANGES = (("a", "f"), ("0", "9"), ("A", "Z"), ("\u03b1", "\u03c9"))
_CLASS_SINGLES = 'xyz -_"\\[]^.é日\n'
#: Characters no literal or class names: what negated classes and near misses can use.
_OUTSIDERS = "~!€"
_NESTS = (("(", ")"), ("[", "]"), ("{", "}"), ("<", ">"), ("begin ", " end"))


def _ascii(chars: str) -> str:
    return "".join(c for c in chars if ord(c) < 0x80)


def _nullable(node: _Node) -> bool:
    """Whether ``node`` derives the empty string."""
    if isinstance(node, (_Lit, _Class, _Nest)):
        return False
    if isinstance(node, _Seq):
        return all(_nullable(i) for i in node.items)
    if isinstance(node, _Alt):
        return any(_nullable(o) for o in node.options)
    if isinstance(node, _Repeat):
        return node.lo == 0 or _nullable(node.node)
    return _nullable(node.node)


def _esc(c: str, in_class: bool) -> str:
    """One character in GBNF (llama.cpp's ``parse_char`` escapes)."""
    special = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    if c in special:
        return special[c]
    if (in_class and c in "[]-^") or ord(c) < 0x20 or ord(c) == 0x7F:
        return f"\\x{ord(c):02X}"
    if not in_class and c == '"':
        return '\\"'
    return c


def _render(node: _Node) -> str:
    """``node`` as a GBNF item that can stand anywhere in a sequence."""
    if isinstance(node, _Lit):
        return '"' + "".join(_esc(c, False) for c in node.text) + '"'
    if isinstance(node, _Class):
        items = "".join(_esc(lo, True) + ("" if lo == hi else "-" + _esc(hi, True)) for lo, hi in node.ranges)
        return "[" + ("^" if node.negated else "") + items + "]"
    if isinstance(node, _Seq):
        return "(" + " ".join(_render(i) for i in node.items) + ")"
    if isinstance(node, _Alt):
        return "(" + " | ".join(_render(o) for o in node.options) + ")"
    if isinstance(node, _Repeat):
        inner = _render(node.node)
        if isinstance(node.node, _Repeat):
            inner = f"({inner})"
        lo, hi = node.lo, node.hi
        op = {(0, None): "*", (1, None): "+", (0, 1): "?"}.get((lo, hi))
        if op is None:
            op = f"{{{lo},}}" if hi is None else f"{{{lo}}}" if hi == lo else f"{{{lo},{hi}}}"
        return inner + op
    return node.name


def _definitions(root: _Node) -> list[tuple[str, str]]:
    """``(name, body)`` for ``root`` and every named rule under it, in first-seen order."""
    out = [("root", _render(root))]
    seen: set[str] = set()
    todo: list[_Node] = [root]
    while todo:
        node = todo.pop(0)
        if isinstance(node, (_Rule, _Nest)) and node.name not in seen:
            seen.add(node.name)
            if isinstance(node, _Rule):
                out.append((node.name, _render(node.node)))
            else:
                body = f"{_render(_Lit(node.open))} ({_render(node.inner)} | {node.name})* {_render(_Lit(node.close))}"
                out.append((node.name, body))
        if isinstance(node, _Seq):
            todo.extend(node.items)
        elif isinstance(node, _Alt):
            todo.extend(node.options)
        elif isinstance(node, (_Repeat, _Rule)):
            todo.append(node.node)
        elif isinstance(node, _Nest):
            todo.append(node.inner)
    return out


def _gbnf(root: _Node) -> str:
    return "".join(f"{name} ::= {body}\n" for name, body in _definitions(root))


class _Recognizer:
    """Whether a tree derives a string: for each node and start position, the set of end
    positions (memoised; a _Nest recurses only after its non-empty opening literal, so
    every recursive call starts further right)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.memo: dict[tuple[int, int], frozenset[int]] = {}
        self.bodies: dict[int, _Repeat] = {}

    def accepts(self, root: _Node) -> bool:
        return len(self.text) in self.ends(root, 0)

    def ends(self, node: _Node, i: int) -> frozenset[int]:
        key = (id(node), i)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = frozenset(self._ends(node, i))
        return hit

    def _ends(self, node: _Node, i: int) -> set[int]:
        text = self.text
        if isinstance(node, _Lit):
            return {i + len(node.text)} if text.startswith(node.text, i) else set()
        if isinstance(node, _Class):
            return {i + 1} if i < len(text) and node.matches(text[i]) else set()
        if isinstance(node, _Seq):
            pos = {i}
            for item in node.items:
                pos = {e for p in pos for e in self.ends(item, p)}
            return pos
        if isinstance(node, _Alt):
            return {e for o in node.options for e in self.ends(o, i)}
        if isinstance(node, _Repeat):
            out = {i} if node.lo == 0 else set()
            cur, k, seen = {i}, 0, set[int]()
            while cur and (node.hi is None or k < node.hi):
                cur = {e for p in cur for e in self.ends(node.node, p)}
                k += 1
                if k >= node.lo:
                    if node.hi is None:  # past the minimum, a position seen before adds nothing
                        cur -= seen
                        seen |= cur
                    out |= cur
            return out
        if isinstance(node, _Rule):
            return set(self.ends(node.node, i))
        if not text.startswith(node.open, i):
            return set()
        body = self.bodies.get(id(node))
        if body is None:
            body = self.bodies[id(node)] = _Repeat(_Alt((node.inner, node)), 0, None)
        close = _Lit(node.close)
        return {e for p in self.ends(body, i + len(node.open)) for e in self._ends(close, p)}


def _sentence(node: _Node, rng: random.Random, universe: str, depth: int = 0) -> str:
    """A random string ``node`` derives (repetitions and nesting kept short)."""
    if isinstance(node, _Lit):
        return node.text
    if isinstance(node, _Class):
        if node.negated:
            return rng.choice([c for c in universe if node.matches(c)])
        lo, hi = rng.choice(node.ranges)
        return chr(rng.randint(ord(lo), ord(hi)))
    if isinstance(node, _Seq):
        return "".join(_sentence(i, rng, universe, depth) for i in node.items)
    if isinstance(node, _Alt):
        return _sentence(rng.choice(node.options), rng, universe, depth)
    if isinstance(node, _Repeat):
        n = rng.randint(node.lo, node.hi if node.hi is not None else node.lo + 2)
        return "".join(_sentence(node.node, rng, universe, depth) for _ in range(n))
    if isinstance(node, _Rule):
        return _sentence(node.node, rng, universe, depth)
    parts = [node.open]
    for _ in range(rng.randint(0, 2)):
        nest = depth < 3 and rng.random() < 0.3
        parts.append(_sentence(node if nest else node.inner, rng, universe, depth + 1))
    parts.append(node.close)
    return "".join(parts)


def _near_misses(root: _Node, accepted: list[str], rng: random.Random, chars: str, limit: int) -> list[str]:
    """Up to ``limit`` one-edit mutations of accepted strings that ``root`` does not derive."""
    out: list[str] = []
    seen = set(accepted)
    for _ in range(limit * 12):
        if len(out) >= limit or not accepted:
            break
        s = rng.choice(accepted)
        c = rng.choice(chars)
        i = rng.randint(0, len(s))
        op = rng.choice(("insert", "delete", "replace", "duplicate", "swap", "truncate", "append"))
        if op == "insert" or not s:
            m = s[:i] + c + s[i:]
        elif op == "append":
            m = s + c
        elif op == "truncate":
            m = s[: rng.randint(0, len(s) - 1)]
        else:
            j = min(i, len(s) - 1)
            if op == "delete":
                m = s[:j] + s[j + 1 :]
            elif op == "replace":
                m = s[:j] + c + s[j + 1 :]
            elif op == "duplicate":
                m = s[: j + 1] + s[j:]
            else:
                m = s[:j] + s[j + 1 : j + 2] + s[j] + s[j + 2 :]
        if m in seen:
            continue
        seen.add(m)
        if not _Recognizer(m).accepts(root):
            out.append(m)
    return out


class GrammarExample(NamedTuple):
    """A grammar and labelled strings (unpacks as ``gbnf, accepted, rejected``)."""

    #: GBNF text (llama.cpp's dialect) with a ``root`` rule; parses with both
    #: :meth:`samplers.grammar.Grammar.from_gbnf` and ``llama_sampler_init_grammar``.
    gbnf: str
    #: Distinct sentences of the grammar (at least one; may include ``""``).
    accepted: tuple[str, ...]
    #: Distinct near misses: one-edit mutations of accepted strings (insert, delete,
    #: replace, duplicate or swap a character, truncate, append) that the grammar
    #: rejects. Can be empty when no mutation leaves the language (``[^a]*``).
    rejected: tuple[str, ...]


class GrammarExampleMismatch(AssertionError):
    """:class:`samplers.grammar.Grammar` disagrees with the grammar model about a string
    (a bug in one of them)."""


def grammars_with_examples(
    *,
    max_depth: int = 3,
    max_accepted: int = 4,
    max_rejected: int = 4,
    recursive: bool = True,
    ascii_only: bool = False,
    confirm: bool = True,
) -> SearchStrategy[GrammarExample]:
    """GBNF grammars with strings they accept and near misses they reject.

    Each grammar comes from a random tree of literals, character classes (ranges,
    negation), sequences, alternations, repetitions (``* + ? {m} {m,} {m,n}``), named
    rules (some referred to twice) and, with ``recursive``, balanced-bracket rules
    (``n1 ::= "(" (x | n1)* ")"``: context-free, never left-recursive), nested at most
    ``max_depth`` deep. Literals and classes use quotes, backslashes, newlines, ``]``,
    ``-``, ``^`` and, unless ``ascii_only``, 2- and 3-byte UTF-8 characters, so the
    GBNF exercises every escape.

    Up to ``max_accepted`` sentences are generated from the tree itself and up to
    ``max_rejected`` near misses are kept only when the tree's own recognizer (which
    shares no code with :mod:`samplers.grammar`) rejects them. With ``confirm`` (the
    default) every label is then checked with ``Grammar.from_gbnf(gbnf).accepts``, and a
    disagreement raises :class:`GrammarExampleMismatch` instead of a mislabelled example.
    Strings are ``str`` (code points; llama.cpp sees their UTF-8 bytes), at most a few
    dozen characters.
    """
    _require_hypothesis()
    from hypothesis import strategies as st

    if max_depth < 0 or max_accepted < 1 or max_rejected < 0:
        raise ValueError("need max_depth >= 0, max_accepted >= 1 and max_rejected >= 0")
    lit_chars = _ascii(_LIT_CHARS) if ascii_only else _LIT_CHARS
    singles = _ascii(_CLASS_SINGLES) if ascii_only else _CLASS_SINGLES
    ranges = tuple(r for r in _CLASS_RANGES if not ascii_only or ord(r[1]) < 0x80)
    outsiders = _ascii(_OUTSIDERS) if ascii_only else _OUTSIDERS
    universe = "".join(sorted(set(lit_chars + singles + "".join(lo + hi for lo, hi in ranges) + outsiders)))

    @st.composite
    def examples(draw: st.DrawFn) -> GrammarExample:
        names: list[_Rule | _Nest] = []

        def char_range() -> tuple[str, str]:
            if draw(st.booleans()):
                c = draw(st.sampled_from(singles))
                return c, c
            lo, hi = draw(st.sampled_from(ranges))
            a = draw(st.integers(ord(lo), ord(hi)))
            return chr(a), chr(draw(st.integers(a, ord(hi))))

        def node(depth: int) -> _Node:
            kinds = ["lit", "class"]
            if depth > 0:
                kinds += ["seq", "alt", "repeat", "repeat", "rule"] + (["nest"] if recursive else [])
                if names:
                    kinds.append("again")
            kind = draw(st.sampled_from(kinds))
            if kind == "lit":
                return _Lit(draw(st.text(st.sampled_from(lit_chars), min_size=1, max_size=3)))
            if kind == "class":
                negated = draw(st.booleans())
                return _Class(negated, tuple(char_range() for _ in range(draw(st.integers(1, 3)))))
            if kind == "seq":
                return _Seq(tuple(node(depth - 1) for _ in range(draw(st.integers(2, 3)))))
            if kind == "alt":
                return _Alt(tuple(node(depth - 1) for _ in range(draw(st.integers(2, 3)))))
            if kind == "repeat":
                inner = solid(depth - 1)
                lo, hi = draw(
                    st.sampled_from([(0, None), (1, None), (0, 1)])
                    | st.tuples(st.integers(0, 2), st.sampled_from([None, 0, 1, 2])).map(
                        lambda t: (t[0], None if t[1] is None else t[0] + t[1])
                    )
                )
                if hi == 0:
                    hi = 1
                return _Repeat(inner, lo, hi)
            if kind == "again":
                return draw(st.sampled_from(names))
            if kind == "rule":
                body = node(depth - 1)  # first: it may name rules of its own
                rule = _Rule(f"r{len(names) + 1}", body)
                names.append(rule)
                return rule
            o, c = draw(st.sampled_from(_NESTS))
            inner = solid(depth - 1)
            nest = _Nest(f"n{len(names) + 1}", o, inner, c)
            names.append(nest)
            return nest

        def solid(depth: int) -> _Node:
            """A node that never derives the empty string (what a repetition may repeat)."""
            n = node(depth)
            return n if not _nullable(n) else _Lit(draw(st.sampled_from(lit_chars)))

        root = node(max_depth)
        gbnf = _gbnf(root)
        rng = draw(st.randoms(use_true_random=False))
        accepted = list(dict.fromkeys(_sentence(root, rng, universe) for _ in range(max_accepted)))
        rejected = _near_misses(root, accepted, rng, lit_chars + singles + outsiders, max_rejected)
        if confirm:
            _confirm(gbnf, accepted, rejected)
        return GrammarExample(gbnf, tuple(accepted), tuple(rejected))

    return examples()


def _confirm(gbnf: str, accepted: list[str], rejected: list[str]) -> None:
    from .grammar import Grammar

    g = Grammar.from_gbnf(gbnf)
    for s in accepted:
        if not g.accepts(s):
            raise GrammarExampleMismatch(f"Grammar.accepts rejects {s!r}, a sentence of the grammar model:\n{gbnf}")
    for s in rejected:
        if g.accepts(s):
            raise GrammarExampleMismatch(f"Grammar.accepts accepts {s!r}, which the grammar model rejects:\n{gbnf}")


# --------------------------------------------------------------------------- JSON schemas
class SchemaExample(NamedTuple):
    """A JSON schema and JSON values that satisfy it (unpacks as ``schema, instances``)."""

    #: a JSON schema in the subset llama.cpp's converter turns into a grammar
    schema: dict[str, Any]
    #: distinct values that satisfy ``schema`` (at least one)
    instances: tuple[Any, ...]


def json_schemas(*, max_depth: int = 3, max_instances: int = 4) -> SearchStrategy[SchemaExample]:
    """JSON schemas with values that satisfy them, for testing structured output.

    Schemas are drawn from what llama.cpp's JSON-schema converter supports and
    :func:`samplers.grammar.Grammar.from_json_schema` reproduces: ``null``, ``boolean``,
    ``integer`` (with ``minimum``/``maximum``, exclusive or not), ``number``, ``string``
    (with ``minLength``/``maxLength``, or an ``enum``/``const``), ``array`` (``items``,
    ``minItems``/``maxItems``), ``object`` (``properties``, some ``required``,
    ``additionalProperties: false``) and ``anyOf``, nested at most ``max_depth`` deep.
    Each example comes with ``max_instances`` or fewer distinct instances drawn from the
    schema itself (every required property present, optional ones sometimes, array
    lengths and numbers within their bounds), so ``json.dumps(instance)`` (any spacing
    llama.cpp's grammar allows) is in the schema's language. Object keys come in the
    order llama.cpp's grammar fixes: the required properties, then the optional ones,
    each in ``properties`` order::

        @given(samplers.testing.json_schemas())
        def test_my_parser(example):
            grammar = Grammar.from_json_schema(example.schema)
            for value in example.instances:
                assert grammar.accepts(json.dumps(value))
    """
    _require_hypothesis()
    from hypothesis import strategies as st

    words = st.text(alphabet=st.sampled_from("abcxyz _-"), min_size=1, max_size=6)

    def leaf() -> SearchStrategy[tuple[dict[str, Any], SearchStrategy[Any]]]:
        @st.composite
        def integer(draw: Any) -> tuple[dict[str, Any], SearchStrategy[Any]]:
            lo = draw(st.none() | st.integers(-1000, 1000))
            hi = draw(st.none() | st.integers(lo if lo is not None else -1000, 1000 if lo is None else lo + 2000))
            schema: dict[str, Any] = {"type": "integer"}
            if lo is not None:
                schema["minimum"] = lo
            if hi is not None:
                schema["maximum"] = hi
            return schema, st.integers(lo if lo is not None else -(10**6), hi if hi is not None else 10**6)

        @st.composite
        def string(draw: Any) -> tuple[dict[str, Any], SearchStrategy[Any]]:
            kind = draw(st.sampled_from(["plain", "bounded", "enum", "const"]))
            if kind == "enum":
                values = draw(st.lists(words, min_size=1, max_size=4, unique=True))
                return {"type": "string", "enum": values}, st.sampled_from(values)
            if kind == "const":
                value = draw(words)
                return {"const": value}, st.just(value)
            text = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
            if kind == "plain":
                return {"type": "string"}, text
            lo = draw(st.integers(0, 4))
            hi = draw(st.integers(lo, lo + 6))
            bounded = st.text(alphabet=st.sampled_from('ab"\\é\n'), min_size=lo, max_size=hi)
            return {"type": "string", "minLength": lo, "maxLength": hi}, bounded

        return st.one_of(
            st.just(({"type": "null"}, st.none())),
            st.just(({"type": "boolean"}, st.booleans())),
            integer(),
            # thousandths: json.dumps writes them without an exponent (llama.cpp's number
            # grammar takes no leading zero in one, and Python writes 1e-06)
            st.just(({"type": "number"}, st.integers(-(10**9), 10**9).map(lambda i: i / 1000))),
            string(),
        )

    def compound(
        children: SearchStrategy[tuple[dict[str, Any], SearchStrategy[Any]]],
    ) -> SearchStrategy[tuple[dict[str, Any], SearchStrategy[Any]]]:
        @st.composite
        def array(draw: Any) -> tuple[dict[str, Any], SearchStrategy[Any]]:
            item, values = draw(children)
            lo = draw(st.integers(0, 2))
            hi = draw(st.integers(lo, lo + 3))
            return {"type": "array", "items": item, "minItems": lo, "maxItems": hi}, st.lists(
                values, min_size=lo, max_size=hi
            )

        @st.composite
        def obj(draw: Any) -> tuple[dict[str, Any], SearchStrategy[Any]]:
            names = draw(
                st.lists(st.text(alphabet="abcdefgh", min_size=1, max_size=5), min_size=1, max_size=4, unique=True)
            )
            props = [draw(children) for _ in names]
            required = [n for n in names if draw(st.booleans())]
            schema = {
                "type": "object",
                "properties": {n: p[0] for n, p in zip(names, props, strict=True)},
                "required": required,
                "additionalProperties": False,
            }

            @st.composite
            def instance(d2: Any) -> dict[str, Any]:
                # keys in the order llama.cpp's grammar takes them: required, then optional
                out: dict[str, Any] = {}
                for n, (_, values) in zip(names, props, strict=True):
                    if n in required:
                        out[n] = d2(values)
                for n, (_, values) in zip(names, props, strict=True):
                    if n not in required and d2(st.booleans()):
                        out[n] = d2(values)
                return out

            return schema, instance()

        @st.composite
        def any_of(draw: Any) -> tuple[dict[str, Any], SearchStrategy[Any]]:
            options = draw(st.lists(children, min_size=2, max_size=3))
            return {"anyOf": [o[0] for o in options]}, st.one_of([o[1] for o in options])

        return st.one_of(array(), obj(), any_of())

    tree = st.recursive(leaf(), compound, max_leaves=max(1, 2**max_depth))

    @st.composite
    def example(draw: Any) -> SchemaExample:
        schema, values = draw(tree)
        instances = draw(st.lists(values, min_size=1, max_size=max_instances, unique_by=lambda v: json.dumps(v)))
        return SchemaExample(schema, tuple(instances))

    return example()


def __getattr__(name: str) -> Any:
    # The state machine subclasses hypothesis's RuleBasedStateMachine: imported when asked
    # for, so that this module imports without hypothesis.
    if name in ("BranchMachine", "Node"):
        _require_hypothesis()
        from . import _branch_machine

        return getattr(_branch_machine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *("BranchMachine", "Node")})
