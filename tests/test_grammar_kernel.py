"""The C mask walk (``llama_cffi._trie_walk``) against the numpy walk it replaced, which
stays as the reference (``kernel="numpy"`` / ``LLAMA_CFFI_GRAMMAR_KERNEL=numpy``): mask
for mask on random grammars over random vocabularies (partial characters included), on
the tiny model's vocabulary, and on the default model's 262,144 tokens with the schemas
whose masks were slowest (bounded strings, patterns with counts, bounded arrays). Bad
arrays given to the C walk raise instead of reading out of bounds."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import llama_cffi
import llama_cffi._trie_walk as trie_walk_mod
import samplers.grammar.compiled as compiled_mod
from samplers.grammar import Grammar, GrammarBudgetError, GrammarError
from samplers.grammar.compiled import _DENSIFY_AT, _RUN_STACKS_MAX, CompiledGrammar
from samplers.grammar.vocab_index import VocabIndex

from .conftest import run_isolated
from .test_gbnf import Node, budget, grammar_text, grammars
from .test_grammar import _PARTIALS, _PIECE_PARTS, _SELF_LOOP_GRAMMARS


@pytest.fixture(autouse=True)
def _plans_on_small_vocabularies(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests' vocabularies are small, where every mask would be a walk from the root
    (``_SMALL_VOCAB``): plans, scans and derivations are what they compare, so they are
    made here as on a large vocabulary (``test_random_vocabularies[small]`` keeps the
    default); so are wider chains, whatever few tokens start with their first run."""
    monkeypatch.setattr(compiled_mod, "_SMALL_VOCAB", 0)
    monkeypatch.setattr(compiled_mod, "_CHAIN_MIN_TOKENS", 0)


@pytest.fixture(scope="module")
def vocab_model(tiny_model_path: Path) -> Iterator[llama_cffi.Model]:
    m = llama_cffi.Model.load(tiny_model_path, vocab_only=True)
    yield m
    m.close()


@pytest.fixture(scope="module")
def big_vocab(default_model_path: Path) -> Iterator[llama_cffi.Model]:
    m = llama_cffi.Model.load(default_model_path, vocab_only=True)
    yield m
    m.close()


def _unpack(c: CompiledGrammar, packed: np.ndarray) -> np.ndarray:
    return np.unpackbits(packed, count=c.n_vocab, bitorder="little").astype(bool)


def compare_walk(c: CompiledGrammar, n: CompiledGrammar, rng: random.Random, steps: int, label: str = "") -> int:
    """Walk random allowed tokens; at every step the two kernels' masks (packed and
    boolean) must be equal. Returns the steps taken."""
    assert c.kernel == "c" and n.kernel == "numpy"
    mc, mn = c.matcher(), n.matcher()
    words = np.empty(c.n_words, dtype=np.uint32)
    for step in range(steps):
        try:
            # fill_words first (with no mask cache: its one-call path takes a state's first
            # mask), then packed (the same state again: its plan)
            want = n.packed(mn.state, mn.partial)
            if c._mask_cache_size == 0:
                c.fill_words(mc.state, mc.partial, words)
                assert np.array_equal(words.view(np.uint8)[: len(want)], want), f"{label} step {step}: fill_words"
            got = c.packed(mc.state, mc.partial)
        except GrammarBudgetError:
            # an ambiguous grammar past the engine's stack budget (the walks visit different
            # states, so one kernel may meet it first): the documented typed error
            event("budget")
            return step
        if not np.array_equal(got, want):
            diff = np.flatnonzero(_unpack(c, got) != _unpack(n, want))
            pieces = [(c.vocab.piece(int(t)), bool(_unpack(n, want)[t])) for t in diff[:6]]
            raise AssertionError(f"{label} step {step}: {len(diff)} tokens differ, e.g. (piece, numpy) {pieces}")
        assert np.array_equal(mc.allowed_tokens(), mn.allowed_tokens())
        allowed = np.flatnonzero(_unpack(n, want) & ~c.vocab.eog)
        if len(allowed) == 0:
            return step
        tok = int(rng.choice(allowed.tolist()))
        ok_c, ok_n = mc.accept_token(tok), mn.accept_token(tok)
        assert ok_c == ok_n
        if not ok_c:
            # llama.cpp's quirk (see tests/test_grammar.walk_and_compare): a token element
            # matched the token's id after some of its characters, no parse takes it whole
            assert c.engine.has_token_elements
            return step
        if c.engine is n.engine:  # (named tokens give each compile its own engine)
            assert (mc.state, mc.partial) == (mn.state, mn.partial)
    return steps


def _assert_derive_picks(c: CompiledGrammar, limit: int = 300) -> int:
    """The C core's choice for a derivation (``Engine._c_derive_pick``) equals its numpy
    reference (``CompiledGrammar._derive_pick``) on every state met so far (at most
    ``limit``), with the thresholds in force; returns how many states had one."""
    eng, found = c.engine, 0
    for s in range(min(eng.n_states, limit)):
        got = eng._c_derive_pick(s, c._root_count, compiled_mod._DERIVE_MIN_ROOT, compiled_mod._DERIVE_SHARE)
        want = c._derive_pick(s)
        assert (got is None) == (want is None), (s, got, want)
        if got is not None and want is not None:
            assert got[0] == want[0] and got[1].tolist() == want[1].tolist(), (s, got, want)
            found += 1
    return found


def _split_events(c: CompiledGrammar) -> None:
    """What the derivations' splits (``TrieGrammar.derive_split``) did: nodes cleared,
    walked, below the root's children (deeper), or none (the other state's mask as is)."""
    roots = set(c._tg._root_nodes.tolist())
    for d in c._derived.values():
        if d is None:
            continue
        deeper = any(int(x) not in roots for x in [*d.clear.tolist(), *d.nodes.tolist()])
        event(f"split: clear {len(d.clear) > 0}, walk {len(d.nodes) > 0}, deeper {deeper}")


def both(grammar: Grammar, vocab: Any) -> tuple[CompiledGrammar, CompiledGrammar]:
    return (
        grammar.compile(vocab, mask_cache_size=0, kernel="c"),
        grammar.compile(vocab, mask_cache_size=0, kernel="numpy"),
    )


@pytest.mark.parametrize("derive", ["default", "always"])
@settings(
    max_examples=budget(80),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(rules=grammars(dag=False, tokens=True), rng=st.randoms(use_true_random=False))
def test_random_grammars_tiny_vocabulary(
    vocab_model: llama_cffi.Model,
    rules: dict[str, tuple[tuple[Node, ...], ...]],
    rng: random.Random,
    derive: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Random grammars (classes, repetitions, recursion, token elements) on the tiny
    model's vocabulary (byte-fallback tokens: partial characters too). ``always``: a
    state's mask is derived from another state's wherever the classes they differ on are
    no more than those they agree on, however few root children the state reaches (on
    the default model's vocabulary: at most an eighth, of thousands), and a state whose
    run holds for 4 characters or more makes its plan at its first mask (on the default
    model's vocabulary: when its run's first two characters start over 16,384 tokens)."""
    if derive == "always":  # (exact whatever the thresholds: they only decide where it pays)
        monkeypatch.setattr(compiled_mod, "_DERIVE_MIN_ROOT", 0)
        monkeypatch.setattr(compiled_mod, "_DERIVE_SHARE", 1)
        monkeypatch.setattr(compiled_mod, "_ROOT_PLAN_TOKENS", 0)  # a plan at the first mask of any long run
    try:
        g = Grammar.from_gbnf(grammar_text(rules))
        c, n = both(g, vocab_model)
    except GrammarError:
        event("refused")
        return
    event(f"steps {compare_walk(c, n, rng, 10)}")
    if derive == "always":
        event(f"derived {sum(d is not None for d in getattr(c, '_derived', {}).values()) > 0}")
        if c.engine.core == "c":
            event(f"derive picks {min(_assert_derive_picks(c), 1)}")
            _split_events(c)


@pytest.mark.parametrize("derive", ["default", "always", "small", "big", "big always"])
@settings(max_examples=budget(80), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_vocabularies(data: st.DataObject, derive: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random vocabularies (pieces that end inside a character, lone lead bytes) with
    grammars of self-loops, chains of optional characters (bounded repetitions) and
    alternatives, every mask along a random walk. ``always``: masks derived from other
    states' wherever the thresholds allow (see test_random_grammars_tiny_vocabulary);
    ``small``: the small-vocabulary mode, every mask a walk from the root (no plan);
    ``big``: every node of 2 or 3 children or more is a big node, its children walked by
    class (Gemma 3's vocabulary has 20, of 64 children or more); ``big always``: both (the
    derivations' splits read big nodes by class too)."""
    if derive.startswith("big"):
        monkeypatch.setattr(trie_walk_mod, "BIG_CHILDREN", data.draw(st.integers(2, 3), label="big"))
    if derive == "small":
        monkeypatch.setattr(compiled_mod, "_SMALL_VOCAB", compiled_mod.__dict__["_INT32_MAX"])
    if derive.endswith("always"):
        monkeypatch.setattr(compiled_mod, "_DERIVE_MIN_ROOT", 0)
        monkeypatch.setattr(compiled_mod, "_DERIVE_SHARE", 1)
        monkeypatch.setattr(compiled_mod, "_ROOT_PLAN_TOKENS", 0)
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    pieces = {b"".join(rng.choice(_PIECE_PARTS) for _ in range(rng.randint(1, 8))) for _ in range(500)}
    pieces |= {p + rng.choice(_PARTIALS) for p in list(pieces)[:40]} | set(_PARTIALS) | set(_PIECE_PARTS)
    vocab = sorted(pieces)
    hi = data.draw(st.integers(0, 12), label="max")
    lo = data.draw(st.integers(0, 4), label="min")
    bounded = [
        f'root ::= "\\"" [^"\\\\]{{0,{hi}}} "\\""\n',
        f'root ::= [a-z0-9 ]{{{lo},{lo + hi}}} ("é" | "!")\n',
        'root ::= "[" ([0-9]{1,3} ("," [0-9]{1,3}){0,4})? "]"\n',
    ]
    text = data.draw(st.sampled_from([*_SELF_LOOP_GRAMMARS, *bounded]), label="grammar")
    c, n = both(Grammar.from_gbnf(text), vocab)
    if derive.startswith("big"):
        big = c.vocab.trie()._big_nodes
        assert len(big) and c._tg._g.big_kids != trie_walk_mod.ffi.NULL
        _assert_big_groups(c)
    compare_walk(c, n, rng, 12, text)
    if derive.endswith("always"):
        event(f"derived {sum(d is not None for d in c._derived.values()) > 0}")
        if c.engine.core == "c":
            event(f"derive picks {min(_assert_derive_picks(c), 1)}")
            _split_events(c)
    # the scans the walks start from: the one that skips whole subtrees equals the plain
    # one (the same tokens, partial tokens and groups), at every length of every run met
    trie, nc = c.vocab.trie(), c.engine.n_classes
    for state in list(c._run_chain)[:6]:
        run = c._run_words[state]
        for k in sorted({0, 1, len(c._run_chain[state]) - 1, trie.max_depth + 1}):
            fast, plain = c._tg.run_scan(run, k), trie.run_scan(c._cls, nc, run, k)
            assert np.array_equal(fast.mask, plain.mask) and np.array_equal(fast.group_start, plain.group_start)
            assert sorted(fast.frontier.tolist()) == sorted(plain.frontier.tolist())
            assert sorted(zip(fast.pt_tokens.tolist(), fast.pt_depth.tolist(), strict=True)) == sorted(
                zip(plain.pt_tokens.tolist(), plain.pt_depth.tolist(), strict=True)
            )
        # shorter lengths derived from a full-length base: from the skipping scan (which
        # reads only the nodes k deep) as from the plain one (which marked every node)
        cap = trie.max_depth + 1
        fast_base, plain_base = c._tg.run_scan(run, cap, keep=True), trie.run_scan(c._cls, nc, run, cap, keep_on=True)
        for k in sorted({1, 2, 3, len(c._run_chain[state]) - 1, trie.max_depth // 2, trie.max_depth} - {cap}):
            fast, plain = c._tg.run_derive(fast_base, k), trie.run_derive(plain_base, c._cls, nc, run, k)
            assert np.array_equal(fast.mask, plain.mask) and np.array_equal(fast.group_start, plain.group_start), k
            assert sorted(fast.frontier.tolist()) == sorted(plain.frontier.tolist()), k
            assert sorted(fast.pt_tokens.tolist()) == sorted(plain.pt_tokens.tolist()), k
            # from the base with its paths made whole (no absorbed pair left): the same
            dense = c._tg.run_derive(c._tg.densified(fast_base), k)
            assert np.array_equal(dense.group_start, plain.group_start), k
            assert sorted(dense.frontier.tolist()) == sorted(plain.frontier.tolist()), k


def _same_scan(a: Any, b: Any, label: str) -> None:
    """Two run scans of one grammar hold the same tokens, partial tokens and groups (the
    nodes within a group in any order)."""
    assert a.k == b.k, label
    assert np.array_equal(a.mask, b.mask), label
    assert np.array_equal(a.group_start, b.group_start), label
    for g in range(len(a.group_start) - 1):
        lo, hi = a.group_start[g], a.group_start[g + 1]
        assert sorted(a.frontier[lo:hi].tolist()) == sorted(b.frontier[lo:hi].tolist()), (label, g)
    assert sorted(zip(a.pt_tokens.tolist(), a.pt_depth.tolist(), strict=True)) == sorted(
        zip(b.pt_tokens.tolist(), b.pt_depth.tolist(), strict=True)
    ), label


def _runs_after_open(index: VocabIndex, text_a: str, text_b: str) -> tuple[CompiledGrammar, CompiledGrammar, list[Any]]:
    """Grammars ``text_a`` and ``text_b`` (each opening with ``<``) compiled on ``index``
    (C kernel, no mask cache), and the run of each after ``<``."""
    a = Grammar.from_gbnf(text_a).compile(index, mask_cache_size=0, kernel="c")
    b = Grammar.from_gbnf(text_b).compile(index, mask_cache_size=0, kernel="c")
    runs = []
    for c in (a, b):
        m = c.matcher()
        assert m.accept_bytes(b"<")
        c._run(m.state)
        runs.append(c._run_words[m.state].copy())
    return a, b, runs


#: character classes for the shared-scan test (none holds "<" or ">", which open and close
#: the run), and classes that split them differently in a second grammar
_RUN_SETS = ["[a-z0-9 ]", '[^"\\\\<>]', "[a-eé日Ж0-9]", "[^<>]", "[ -;=?-~]"]
_SPLITS = ["[b-d]", "[0-1]", "[éa]", "[\\u0400-\\u04FF]", '["\\\\]', "[ -/]", "[z]"]


@settings(max_examples=budget(60), deadline=None)
@given(data=st.data())
def test_shared_scans_serve_grammars_with_other_classes(data: st.DataObject) -> None:
    """A run's scan depends only on which of the vocabulary's code points the run holds:
    grammar A's scan, shared (``TrieGrammar.shared``) and regrouped for grammar B, whose
    classes split the same characters differently (``unshare``), equals B's own scan, at
    full length and at every shorter length derived from it; B compiled after A on the
    same index takes A's scan from the vocabulary (a hit), and its masks equal the numpy
    walk's."""
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    parts = [*_PIECE_PARTS, b"<", b">", b"x", b"<a", b"b>"]
    pieces = {b"".join(rng.choice(parts) for _ in range(rng.randint(1, 8))) for _ in range(400)}
    pieces |= {p + rng.choice(_PARTIALS) for p in list(pieces)[:30]} | set(_PARTIALS) | set(parts)
    index = VocabIndex(sorted(pieces))
    run_set = data.draw(st.sampled_from(_RUN_SETS), label="run")
    splits = data.draw(st.lists(st.sampled_from(_SPLITS), min_size=1, max_size=3, unique=True), label="splits")
    text_a = f'root ::= "<" {run_set}* ">"\n'
    text_b = f'root ::= "<" {run_set}* ">" | ({" | ".join(splits)}) "!"\n'
    a, b, runs = _runs_after_open(index, text_a, text_b)
    key_a, key_b = a._cp_key(runs[0]), b._cp_key(runs[1])
    event(f"B has more classes {b.engine.n_classes > a.engine.n_classes}")
    assert key_a == key_b, (text_a, text_b)
    # the key is each code point's membership through its class, and the partial bit
    for c, run in ((a, runs[0]), (b, runs[1]), (b, ~runs[1])):
        bits = np.unpackbits(run.view(np.uint8), bitorder="little")
        nc = c.engine.n_classes
        want = np.packbits(bits[:nc][c._cls_of_cp].astype(bool), bitorder="little").tobytes() + bytes([int(bits[nc])])
        assert c._cp_key(run) == want
    cap = index.trie().max_depth + 1
    own = b._tg.run_scan(runs[1], cap, keep=True)
    got = b._tg.unshare(a._tg.shared(a._tg.run_scan(runs[0], cap, keep=True)), runs[1])
    _same_scan(got, own, "full length")
    for k in sorted({1, 2, 3, cap // 2, cap - 1} - {0, cap}):
        _same_scan(b._tg.run_derive(got, k), b._tg.run_derive(own, k), f"k={k}")
    # through the vocabulary: A's walk shares its scan, B's takes it
    fresh_index = VocabIndex(sorted(pieces))
    ca, na = both(Grammar.from_gbnf(text_a), fresh_index)
    compare_walk(ca, na, rng, 6, text_a)
    m = ca.matcher()
    assert m.accept_bytes(b"<")
    for _ in range(compiled_mod._PLAN_AT):  # the first masks, then the one that makes the plan
        ca.fill_words(m.state, m.partial, np.zeros(ca.n_words, dtype=np.uint32))
    assert fresh_index._shared_scan(key_a) is not None
    cb, nb = both(Grammar.from_gbnf(text_b), fresh_index)
    cb._tg.run_scan = None  # B must not scan the vocabulary for this run: it is shared
    m, mn = cb.matcher(), nb.matcher()
    assert m.accept_bytes(b"<") and mn.accept_bytes(b"<")
    want = nb.packed(mn.state, mn.partial)
    for _ in range(compiled_mod._PLAN_AT):  # the first masks, then the one that makes the plan (and takes the scan)
        words = np.zeros(cb.n_words, dtype=np.uint32)
        cb.fill_words(m.state, m.partial, words)
        assert np.array_equal(words.view(np.uint8)[: len(want)], want)
    assert m.state in cb._plans


#: nested character classes (each holds the one before it) for the scan-extension test
_NESTED = ["[a-c]", "[a-c0-3]", "[a-c0-3 /]", "[a-z0-9 ./é-]", '[^"\\\\<>]']


@settings(max_examples=budget(60), deadline=None)
@given(data=st.data())
def test_a_runs_scan_extends_the_scan_of_a_subset(data: st.DataObject) -> None:
    """A full-length scan of a run not scanned yet is the shared scan of a subset of its
    code points extended below where that scan stops (``run_scan_extend``): the same
    tokens, frontier (with parent depths) and partial tokens as scanning the run whole,
    and a grammar compiled after the one that made the subset's scan takes it (no scan
    of the whole vocabulary) with masks equal to the numpy walk's."""
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    parts = [*_PIECE_PARTS, b"<", b">", b"/", b"x/", b"a/b", b"<a", b"b>", b"0.", b" /"]
    pieces = {b"".join(rng.choice(parts) for _ in range(rng.randint(1, 8))) for _ in range(400)}
    pieces |= {p + rng.choice(_PARTIALS) for p in list(pieces)[:30]} | set(_PARTIALS) | set(parts)
    lo = data.draw(st.integers(0, len(_NESTED) - 2), label="subset")
    hi = data.draw(st.integers(lo + 1, len(_NESTED) - 1), label="superset")
    text_a, text_b = (f'root ::= "<" {_NESTED[i]}* ">"\n' for i in (lo, hi))
    index = VocabIndex(sorted(pieces))
    cap = index.trie().max_depth + 1
    a, b, runs = _runs_after_open(index, text_a, text_b)
    key_a, key_b = a._cp_key(runs[0]), b._cp_key(runs[1])
    if key_a == key_b or key_a[-1] != key_b[-1]:  # (the same code points in this vocabulary, or not both partial)
        event("not a strict subset here")
        return
    base = a._tg.shared(a._tg.run_scan(runs[0], cap))
    ext = b._tg.run_scan_extend(base, key_a, runs[1])
    own = b._tg.shared(b._tg.run_scan(runs[1], cap))
    # outputs of one entry at first: out of room, then again with the whole trie's
    room = trie_walk_mod._EXTEND_FACTOR, trie_walk_mod._EXTEND_ROOM
    trie_walk_mod._EXTEND_FACTOR, trie_walk_mod._EXTEND_ROOM = 0, 1
    try:
        tight = b._tg.run_scan_extend(base, key_a, runs[1])
    finally:
        trie_walk_mod._EXTEND_FACTOR, trie_walk_mod._EXTEND_ROOM = room
    assert tight.k == ext.k
    for f in ("mask", "nodes", "depths", "pt_tokens", "pt_depth"):
        assert np.array_equal(getattr(tight, f), getattr(ext, f)), f
    assert np.array_equal(ext.mask, own.mask)
    assert sorted(zip(ext.nodes.tolist(), ext.depths.tolist(), strict=True)) == sorted(
        zip(own.nodes.tolist(), own.depths.tolist(), strict=True)
    )
    assert sorted(zip(ext.pt_tokens.tolist(), ext.pt_depth.tolist(), strict=True)) == sorted(
        zip(own.pt_tokens.tolist(), own.pt_depth.tolist(), strict=True)
    )
    # through the vocabulary: A's plan shares its scan, B extends it
    fresh = VocabIndex(sorted(pieces))
    ca = Grammar.from_gbnf(text_a).compile(fresh, mask_cache_size=0, kernel="c")
    m = ca.matcher()
    assert m.accept_bytes(b"<")
    for _ in range(compiled_mod._PLAN_AT):  # the first masks, then the one that makes the plan (and shares the scan)
        ca.fill_words(m.state, m.partial, np.zeros(ca.n_words, dtype=np.uint32))
    assert fresh._shared_scan(key_a) is not None and fresh._shared_scan(key_b) is None
    cb, nb = both(Grammar.from_gbnf(text_b), fresh)
    own_scan = cb._tg.run_scan

    def no_whole_scan_of_the_run(run: np.ndarray, k: int, keep: bool = False) -> object:
        # B must not scan the vocabulary for its run whole: it extends A's scan (a chain's
        # scan, of a run per character, is another matter)
        assert not (np.ndim(run) == 1 and k == cap and np.array_equal(run, runs[1])), "a whole scan"
        return own_scan(run, k, keep)

    cb._tg.run_scan = no_whole_scan_of_the_run
    compare_walk(cb, nb, rng, 8, text_b)
    m = cb.matcher()
    assert m.accept_bytes(b"<")
    for _ in range(compiled_mod._PLAN_AT):
        cb.fill_words(m.state, m.partial, np.zeros(cb.n_words, dtype=np.uint32))
    assert fresh._shared_scan(key_b) is not None


def _assert_binding_is_the_reference(c: CompiledGrammar) -> None:
    """``TrieGrammar.bind`` (one C call) against its reference: the engine's classes of the
    vocabulary's code points, the trie's nodes per class, and ``TrieGrammar(...)``'s ASCII
    table, non-ASCII classes (special or not) and root groups."""
    from llama_cffi._trie_walk import TrieGrammar, special_cps

    v, eng = c.vocab, c.engine
    trie = v.trie()
    cls_of_cp = eng._classes_of_sorted(v.uniq_cps)
    assert np.array_equal(c._cls_of_cp, cls_of_cp)
    assert np.array_equal(c._class_weight, trie.nodes_per_class(cls_of_cp, eng.n_classes))
    w = eng.n_classes // 64 + 1
    na = np.zeros((2, 64 * w), dtype=bool)  # the classes of code points >= 128, not special, then special
    special = np.isin(v.uniq_cps, special_cps())
    na[special[v.n_ascii_cps :].astype(int), cls_of_cp[v.n_ascii_cps :]] = True
    ref = TrieGrammar(
        trie,
        cls_of_cp,
        eng.n_classes,
        np.array(eng._ascii_class, dtype=np.int32),
        np.packbits(na, axis=1, bitorder="little").view("<u8").ravel(),
    )
    for name in ("_asc_table", "_na_classes", "_root_start", "_ascii_cls"):
        assert np.array_equal(getattr(c._tg, name), getattr(ref, name)), name
    n_root = int(trie._n_root_children)
    assert np.array_equal(c._tg._root_nodes[:n_root], ref._root_nodes[:n_root])


@settings(max_examples=budget(60), deadline=None)
@given(rules=grammars(dag=False), seed=st.integers(0, 2**32 - 1))
def test_binding_in_one_c_call_equals_the_reference(rules: dict[str, tuple[tuple[Node, ...], ...]], seed: int) -> None:
    """Random grammars on random vocabularies (ASCII, Latin, CJK and partial characters):
    a compile's binding to the trie, made in one C call (``llama_cffi_trie_bind``), equals
    what the numpy reference makes piece by piece."""
    try:
        g = Grammar.from_gbnf(grammar_text(rules))
    except GrammarError:
        return
    rng = random.Random(seed)
    parts = [*_PIECE_PARTS, "é".encode(), "中".encode(), b"\x7f", b"\x00a"]
    pieces = sorted({b"".join(rng.choice(parts) for _ in range(rng.randint(1, 6))) for _ in range(300)} | set(parts))
    _assert_binding_is_the_reference(g.compile(pieces, mask_cache_size=0, kernel="c"))


#: pieces that start with continuation bytes: they complete a pending character exactly,
#: complete it and go on (ASCII, another character, a lead byte), end inside it, or hold
#: a NUL (decoding stops there) or a byte that is not a continuation byte where one is due
_CONTINUATIONS = [
    b"\xa9",
    b"\x97",
    b"\xa5",
    b"\x80",
    b"\xa8",
    b"\x97\xa5",
    b"\x9f\x98\x80",
    b"\x98\x80",
    b"\x80\xa8",
    b"\xa9a",
    b"\xa9\xc3",
    b"\x97\xa5\xe6\x97",
    b"\xa5\xc3\xa9",
    b"\x97a",
    b"\x97\x00",
    b"\xa9\x00b",
    b"\x80\x80\x80\x80",
]
#: pending characters of the grammars' alphabet (test_gbnf.CHARS): after \xc3 (é), \xe6 and
#: \xe6\x97 (日), \xf0, \xf0\x9f and \xf0\x9f\x98 (😀), \xe2\x80 (\u2028)
_PENDING = [(0x03, 1), (0x06, 2), (0x06 << 6 | 0x17, 1), (0x00, 3), (0x1F, 2), (0x1F << 6 | 0x18, 1), (0x02 << 6, 1)]


@settings(max_examples=budget(60), deadline=None)
@given(rules=grammars(dag=False), seed=st.integers(0, 2**32 - 1), kernel=st.sampled_from(["c", "numpy"]))
def test_partial_character_masks_equal_the_token_by_token_check(
    rules: dict[str, tuple[tuple[Node, ...], ...]], seed: int, kernel: str
) -> None:
    """With a character pending, the mask made from the vocabulary's continuation tokens
    sorted once (``VocabIndex.continuation_kinds``: completions in one engine call, longer
    partial characters in one C call) equals the reference that checks every continuation
    token alone, at every state of a random walk and every pending character of the
    grammars' alphabet (on either engine core)."""
    try:
        g = Grammar.from_gbnf(grammar_text(rules))
    except GrammarError:
        return
    rng = random.Random(seed)
    parts = [*_PIECE_PARTS, *_PARTIALS, *_CONTINUATIONS, "😀".encode(), "\u2028".encode(), b"\xf0\x9f"]
    pieces = sorted({b"".join(rng.choice(parts) for _ in range(rng.randint(1, 4))) for _ in range(300)} | set(parts))
    c = g.compile(pieces, mask_cache_size=0, kernel=kernel)
    assert len(c.vocab.continuation_tokens) >= len(_CONTINUATIONS)
    m = c.matcher()
    states = {m.state}
    try:
        for _ in range(6):
            allowed = np.flatnonzero(c.allowed(m.state, m.partial) & ~c.vocab.eog)
            if not len(allowed) or not m.accept_token(int(allowed[rng.randrange(len(allowed))])):
                break
            states.add(m.state)
        for state in sorted(states):
            for pending in _PENDING:
                want = c._partial_mask_by_token(state, pending)
                assert np.array_equal(c._partial_mask(state, pending), want), (state, pending)
    except GrammarBudgetError:
        # an ambiguous grammar past the engine's stack budget: the documented typed error
        event("budget")


@settings(max_examples=budget(60), deadline=None)
@given(data=st.data())
def test_chain_scans_equal_the_plain_scan_and_brute_force(data: st.DataObject) -> None:
    """A scan of a chain's runs (one class set per character, the last repeating: a state
    whose successors each follow their own run, ``CompiledGrammar._wider_chain``) made by
    the skipping scan equals the plain level-by-level one (mask, groups, frontier, partial
    tokens), and its tokens are, one by one, those of at most ``k`` characters whose
    ``j``-th character is of a class in run ``min(j, n - 1)``."""
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    pieces = {b"".join(rng.choice(_PIECE_PARTS) for _ in range(rng.randint(1, 6))) for _ in range(300)}
    pieces |= {p + rng.choice(_PARTIALS) for p in list(pieces)[:30]} | set(_PARTIALS) | set(_PIECE_PARTS)
    text = (
        'root ::= ([a-e] | [f-z] | [A-Z] | [0-9] | " " | "\\n" | [,.:\\[\\]{}] | "\\"" | [é日] | [\\u0400-\\u04FF])*\n'
    )
    c = Grammar.from_gbnf(text).compile(sorted(pieces), mask_cache_size=0, kernel="c")
    v, eng, trie = c.vocab, c.engine, c.vocab.trie()
    nc = eng.n_classes
    n_runs = data.draw(st.integers(1, 4), label="n_runs")
    sets = [data.draw(st.sets(st.integers(0, nc - 1)), label=f"run {j}") for j in range(n_runs)]
    runs = np.zeros((n_runs, c._W), dtype=np.uint64)
    for j, cs in enumerate(sets):
        for k_ in cs:
            runs[j, k_ // 64] |= np.uint64(1) << np.uint64(k_ % 64)
    k = data.draw(st.sampled_from([0, 1, 2, 3, trie.max_depth + 1]), label="k")
    fast, plain = c._tg.run_scan(runs, k), trie.run_scan(c._cls, nc, runs, k)
    assert np.array_equal(fast.mask, plain.mask) and np.array_equal(fast.group_start, plain.group_start)
    assert sorted(fast.frontier.tolist()) == sorted(plain.frontier.tolist())
    assert sorted(zip(fast.pt_tokens.tolist(), fast.pt_depth.tolist(), strict=True)) == sorted(
        zip(plain.pt_tokens.tolist(), plain.pt_depth.tolist(), strict=True)
    )
    got = np.unpackbits(fast.mask.view(np.uint8), bitorder="little")[: v.n_vocab].astype(bool)
    want = np.zeros(v.n_vocab, dtype=bool)
    want_pt = set()
    for t in np.flatnonzero(v.usable).tolist():
        cls = eng.classes_of(v.token_cps(t)).tolist()
        if len(cls) <= k and all(cl in sets[min(j, n_runs - 1)] for j, cl in enumerate(cls)):
            if v.partial_remain[t]:
                want_pt.add((t, len(cls)))
            elif cls:
                want[t] = True
    assert np.array_equal(got, want)
    assert set(zip(fast.pt_tokens.tolist(), fast.pt_depth.tolist(), strict=True)) == want_pt
    with pytest.raises(ValueError):
        c._tg.run_scan(runs[:1].repeat(2, axis=0), k, keep=True)  # derivations are of one class set


def test_wider_chains_end_in_a_loop_within_the_trie() -> None:
    """A wider chain is taken only when it reaches a state that loops on itself within
    ``_CHAIN_MAX`` states (a literal longer than the vocabulary's longest token does not:
    its chain would be cut where the trie ends, each state scanned with no subtree taken
    whole), nor does a literal that ends (its last state takes nothing: an empty run,
    which the engine pads as a loop); then it is as long as any token, one class set per
    state before the loop. The masks equal the numpy walk's at every step, either way."""
    pieces = [b"a", b"ab", b"abc", b"bcd", b"c", b"cd", b"d", b"e", b"de", b"fgh", b"f", b"g", b"h", b"x", b"zz"]
    cases = (('root ::= "abcdefghabcd"\n', False), ('root ::= "ab" [c-z]*\n', True), ('root ::= "ab"\n', False))
    for text, loops in cases:
        c, n = both(Grammar.from_gbnf(text), pieces)
        assert c.vocab.trie().max_depth == 3
        start = c.engine.start
        wider = c._wider_chain(start, c._run(start))
        if loops:
            assert wider is not None and len(wider[0]) == c._run_cap + 1 and len(wider[1]) == 3
        else:
            assert wider is None
        compare_walk(c, n, random.Random(0), 12, text)


def test_a_bounded_strings_position_takes_its_own_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A position of a bounded string (its run holds for any token, through states that
    do not loop) takes no wider chain, and asks for no run of the positions after it
    (each an engine call at its many stacks, only to find the same classes); a position
    near the bound, whose run ends, may look further. Masks equal the numpy walk's."""
    pieces = [b"a", b"ab", b"abc", b"bcd", b"c", b"cd", b"d", b'"', b'a"', b"x", b"zz"]
    text = 'root ::= "\\"" [a-z]{0,40} "\\""\n'
    c, n = both(Grammar.from_gbnf(text), pieces)
    start = c.engine.step(c.engine.start, c.engine.class_of(ord('"')))
    chain = c._run(start)
    assert len(chain) == c._run_cap + 1 and len(set(chain.tolist())) == len(chain)
    asked: list[int] = []
    run = c._run
    monkeypatch.setattr(c, "_run", lambda s: asked.append(s) or run(s))
    assert c._wider_chain(start, chain) is None and asked == []
    monkeypatch.undo()
    compare_walk(c, n, random.Random(1), 16, text)


def test_a_bounded_strings_later_positions_take_a_plan_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a position of a bounded string has a plan, the positions down its chain take
    theirs at their first mask, without the first mask's C call (which would only answer
    "plan"); their plans share what depends on the scan alone (its buffers and live
    groups), and every mask equals the numpy walk's, through the string's end."""
    monkeypatch.setattr(compiled_mod, "_SMALL_VOCAB", 0)
    monkeypatch.setattr(compiled_mod, "_ROOT_PLAN_MAX", 0)  # (any run "starts many tokens")
    pieces = [b"a", b"ab", b"abc", b"bcd", b"c", b"cd", b"d", b'"', b'a"', b'c"}', b"x", b"}", b"\xc3", b"\xa9"]
    text = 'root ::= "\\"" [a-d\\u00e9]{0,40} "\\"" "}"\n'
    c, n = both(Grammar.from_gbnf(text), pieces)
    firsts: list[int] = []
    orig = c._tg.first_mask_rc
    c._tg.first_mask_rc = lambda s, *a: firsts.append(s) or orig(s, *a)
    m, mn = c.matcher(), n.matcher()
    out = np.zeros(c.n_words, dtype=np.uint32)
    planned_at_once = 0
    for step, piece in enumerate([b'"', *[b"abc", b"d", b"ab", b"c", b"\xc3\xa9"] * 4, b'"']):
        assert m.accept_bytes(piece) and mn.accept_bytes(piece), step
        state = m.state
        was_next = state in c._plan_next
        c.fill_words(state, m.partial, out)
        if was_next:
            planned_at_once += 1
            assert state not in firsts and state in c._plans, step
        expected = np.packbits(n.allowed(mn.state, mn.partial), bitorder="little")
        assert np.array_equal(out.view(np.uint8)[: len(expected)], expected), step
    assert planned_at_once >= 15
    parts = {id(p[1][2]) for p in c._plans.values()}
    scans = {id(p[4]) for p in c._plans.values()}
    assert len(parts) == len(scans) < len(c._plans)  # one part per scan, shared by many plans


def test_a_bounded_strings_position_plan_made_in_c_is_pythons(monkeypatch: pytest.MonkeyPatch) -> None:
    """A position's plan made in one C call from an earlier position's
    (``TrieGrammar.position_mask``) is the plan :meth:`_plan` makes: the engine's run
    (chain, classes, closed run, length), the same scan, the same extra tokens
    (end-of-generation at a position the string may end with, partial characters that
    the next state can complete). Near the bound, where the run is shorter, the C call
    declines and Python plans. Masks equal the numpy walk's throughout, through the
    string's end and past it."""
    monkeypatch.setattr(compiled_mod, "_SMALL_VOCAB", 0)
    monkeypatch.setattr(compiled_mod, "_ROOT_PLAN_MAX", 0)
    pieces = [b"a", b"ab", b"abc", b"bcd", b"c", b"cd", b"d", b'"', b'a"', b"x", b"\xc3", b"\xa9", b"\xc3\xa9a"]
    text = 'root ::= [a-d\\u00e9]{0,24} "\\"" "x"?\n'
    c, n = both(Grammar.from_gbnf(text), pieces)
    outcomes: list[int] = []
    orig = c._tg.position_mask
    c._tg.position_mask = lambda *a: (lambda r: outcomes.append(r[0]) or r)(orig(*a))
    m, mn = c.matcher(), n.matcher()
    out = np.zeros(c.n_words, dtype=np.uint32)
    eng = c.engine
    steps = [b"abc", b"d", b"\xc3\xa9a", b"ab", b"c", b"\xc3", b"\xa9"] * 2 + [b"a", b"c", b"d", b'"', b"x"]
    for step, piece in enumerate(steps):
        state = m.state
        before = len(outcomes)
        c.fill_words(state, m.partial, out)
        expected = np.packbits(n.allowed(mn.state, mn.partial), bitorder="little")
        assert np.array_equal(out.view(np.uint8)[: len(expected)], expected), step
        if len(outcomes) > before and outcomes[-1] == 0:
            got = c._plans[state]
            chain, run, closed = eng._c_run(state, c._class_weight_f, c._run_cap, compiled_mod._RUN_STACKS_MAX)
            assert np.array_equal(got[2], chain) and np.array_equal(c._run_chain[state], chain)
            assert np.array_equal(c._run_words[state], run) and np.array_equal(c._run_closed[state], closed)
            assert c._run_len[state] == len(chain) - 1 and c._run_known[state]
            del c._plans[state]
            mine = c._plan(state)
            assert mine[4] is got[4]  # the same scan
            assert sorted(mine[3].tolist()) == sorted(got[3].tolist()), step
        assert m.accept_bytes(piece) and mn.accept_bytes(piece), step
    assert outcomes.count(0) >= 8 and 1 in outcomes  # made in C, and declined near the bound


def test_a_runs_base_is_densified_only_when_derived_again_and_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The full-length scan that a bounded run's shorter lengths derive from keeps its
    paths as subtrees taken whole (``absorbed``) for its first derivations, and is made
    dense (each later derivation reads one level) at the :data:`_DENSIFY_AT`-th, for
    this grammar and, through the vocabulary, for the next one; every derived scan
    equals the one derived from the dense base, and the masks along the string equal the
    numpy walk's."""
    parts = [b"a", b"b", b"ab", b"ba", b"abab", b"bbb", b"aaaa", b"ab-", b"-", b"x"]
    pieces = sorted({b"".join(random.Random(i).choice(parts) for _ in range(1 + i % 5)) for i in range(300)})
    pieces += [b'"', b'a"', b'"-', b"\xc3"]
    text = 'root ::= "\\"" [ab]{0,12} "\\"" "-"*\n'
    monkeypatch.setattr(compiled_mod, "_SMALL_VOCAB", 0)  # plans, scans and derivations at any size
    index = VocabIndex(pieces)
    c, n = both(Grammar.from_gbnf(text), index)
    m, mn = c.matcher(), n.matcher()
    assert m.accept_bytes(b'"') and mn.accept_bytes(b'"')
    seen: list[tuple[int, bool]] = []  # per derivation: its length, whether the base was dense
    orig = c._tg.run_derive

    def derive(base: Any, k: int) -> Any:
        got = orig(base, k)
        seen.append((k, not len(base.absorbed)))
        dense = orig(c._tg.densified(base), k)
        _same_scan(got, dense, f"k={k}")
        return got

    c._tg.run_derive = derive
    for step in range(12):
        for _ in range(compiled_mod._PLAN_AT):  # first masks, then the plan's
            c.fill_words(m.state, m.partial, np.zeros(c.n_words, dtype=np.uint32))
        assert np.array_equal(c.allowed(m.state, m.partial), n.allowed(mn.state, mn.partial)), step
        char = b"ab"[step % 2 : step % 2 + 1]
        assert m.accept_bytes(char) and mn.accept_bytes(char)
    assert len(seen) >= _DENSIFY_AT + 2, seen
    assert [dense for _k, dense in seen] == [i >= _DENSIFY_AT - 1 for i in range(len(seen))], seen
    assert len({k for k, _dense in seen}) == len(seen)  # each length derived once
    # the vocabulary now holds the dense base: the next grammar's first derivation reads it
    c2 = Grammar.from_gbnf(text).compile(index, mask_cache_size=0, kernel="c")
    firsts: list[bool] = []
    orig2 = c2._tg.run_derive
    c2._tg.run_derive = lambda base, k: firsts.append(not len(base.absorbed)) or orig2(base, k)
    m2 = c2.matcher()
    assert m2.accept_bytes(b'"ab')
    for _ in range(compiled_mod._PLAN_AT):
        c2.fill_words(m2.state, m2.partial, np.zeros(c2.n_words, dtype=np.uint32))
    assert firsts[:1] == [True], firsts


#: a key that must match \w (a word character somewhere: the subset construction's four
#: states minimized to two), and names of a capital and lowercase letters
_CHAIN_SCHEMAS: dict[str, tuple[dict[str, Any], Any]] = {
    "word key": (
        {
            "type": "object",
            "patternProperties": {"\\w": {"type": "object", "properties": {"p": {"type": "string"}}}},
        },
        {"alias one": {"p": ".*"}, "-- x": {"p": "test"}, "日本": {"p": "ja"}},
    ),
    "capitalised names": (
        {
            "type": "object",
            "properties": {"names": {"type": "array", "items": {"type": "string", "pattern": "^[A-Z][a-z]+$"}}},
            "required": ["names"],
        },
        {"names": ["Ada", "Grace", "Hopper"]},
    ),
}


def _masks_along(c: CompiledGrammar, n: CompiledGrammar, tokens: Any) -> Iterator[Any]:
    """Along ``tokens``, each mask of the C walk (twice: the second from its plan) equal to
    the numpy walk's, before each token and after the last; yields the C matcher after
    each token."""
    mc, mn = c.matcher(), n.matcher()
    for tok in [*np.asarray(tokens).tolist(), None]:
        want = n.packed(mn.state, mn.partial)
        assert np.array_equal(c.packed(mc.state, mc.partial), want)
        assert np.array_equal(c.packed(mc.state, mc.partial), want)  # again: from its plan
        if tok is None:
            return
        assert mc.accept_token(tok) and mn.accept_token(tok)
        yield mc


def test_short_bounded_strings_derive_from_the_indexs_scan(
    big_vocab: llama_cffi.Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A string of 2 to 4 of any characters (a country's or a language's code) takes the
    scans of its positions from the vocabulary's prescanned JSON-content scan (a
    derivation, which reads only the trie's nodes that deep), not from a scan of its
    own, which lists every node one character past it (0.6-1.2 ms at 262,144 tokens).
    Every mask along a document and along random walks equals the numpy walk's; without
    the derivation the spy sees short scans and fails."""
    from llama_cffi._trie_walk import TrieGrammar

    short: list[tuple[int, Any]] = []
    derived: list[int] = []
    scan, derive = TrieGrammar.run_scan, TrieGrammar.run_derive

    def scans(self: TrieGrammar, run: Any, k: int, *a: Any, **kw: Any) -> Any:
        if k <= 4:
            short.append((k, np.array(run, copy=True)))
        return scan(self, run, k, *a, **kw)

    def derives(self: TrieGrammar, base: Any, k: int) -> Any:
        derived.append(k)
        return derive(self, base, k)

    monkeypatch.setattr(TrieGrammar, "run_scan", scans)
    monkeypatch.setattr(TrieGrammar, "run_derive", derives)
    schema = {
        "type": "object",
        "properties": {
            "country": {"type": "string", "minLength": 2, "maxLength": 2},
            "language": {"type": "string", "maxLength": 3},
            "state": {"type": "string", "minLength": 1, "maxLength": 4},
        },
        "required": ["country", "language", "state"],
        "additionalProperties": False,
    }
    doc = {"country": "US", "language": "eng", "state": "NY"}
    c, n = both(Grammar.from_json_schema(schema), big_vocab)
    for _ in _masks_along(c, n, big_vocab.tokenize(json.dumps(doc), add_special=False)):
        pass
    for seed in range(3):
        compare_walk(c, n, random.Random(seed), 12, f"short strings walk {seed}")
    # (short scans of other runs, a literal's one character, are made as before)
    of_content = [k for k, run in short if c.vocab._shared_scan(c._cp_key(run), True) is not None]
    assert not of_content, of_content
    assert {1, 2, 3} <= set(derived), derived


@pytest.mark.parametrize("name", list(_CHAIN_SCHEMAS))
def test_wider_chains_and_closed_runs(big_vocab: llama_cffi.Model, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the default vocabulary, grammars whose states' runs are short or narrow for a
    single class set: plans scan a chain whose states each follow their own run
    (``_wider_chain``), walks take whole the subtrees of a state's closed run (every
    string character keeps a key that must match ``\\w`` alive, though a word character
    leads elsewhere than the others); both were used, and every mask equals the numpy
    walk's along the document and random walks."""
    schema, doc = _CHAIN_SCHEMAS[name]
    chains: list[int] = []
    orig = CompiledGrammar._chain_scan

    def counted(self: CompiledGrammar, runs: np.ndarray) -> Any:
        chains.append(len(runs))
        return orig(self, runs)

    monkeypatch.setattr(CompiledGrammar, "_chain_scan", counted)
    c, n = both(Grammar.from_json_schema(schema), big_vocab)
    for _ in _masks_along(c, n, big_vocab.tokenize(json.dumps(doc, ensure_ascii=False), add_special=False)):
        pass
    for seed in range(3):
        compare_walk(c, n, random.Random(seed), 20, f"{name} walk {seed}")
    assert chains and max(chains) >= 2, chains
    if name == "word key":
        known = np.flatnonzero(c._run_known).tolist()
        assert any(c._run_closed[s].any() and not np.array_equal(c._run_closed[s], c._run_words[s]) for s in known)


def test_a_searched_patterns_states_share_one_closed_run(
    big_vocab: llama_cffi.Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the default vocabulary, a pattern searched for inside a string (Github_medium
    o33033's screen positions): every letter that begins or goes on with a match leads to
    another state, so no run is long, yet every string character but the escape keeps all
    of them alive. The closure of the string's state is searched once (``_closed_for``),
    its closed run given to each of its states, and walks take whole the subtrees of its
    classes; every mask equals the numpy walk's along the document and random walks."""
    alts = ["top-left", "top-center", "top-right", "middle-left", "middle-center", "bottom-right"]
    schema = {
        "type": "object",
        "properties": {"location": {"type": "string", "pattern": "(" + "|".join(alts) + ")"}},
        "required": ["location"],
    }
    searches: list[int] = []
    orig = CompiledGrammar._closed_for

    def counted(self: CompiledGrammar, start: int) -> None:
        searches.append(start)
        orig(self, start)

    monkeypatch.setattr(CompiledGrammar, "_closed_for", counted)
    c, n = both(Grammar.from_json_schema(schema), big_vocab)
    doc = {"location": "at the top-center, then bottom-right"}
    inside = 0
    for mc in _masks_along(c, n, big_vocab.tokenize(json.dumps(doc), add_special=False)):
        if c._run_closed[mc.state].any():
            inside += 1
            # its closed run holds its run and more (a letter of a match, which its run leaves)
            run, closed = c._run_words[mc.state], c._run_closed[mc.state]
            assert not (run & ~closed).any() and (closed & ~run).any()
    assert inside >= 5, inside  # the string's states, each with the closure's closed run
    assert len(searches) <= 2, searches  # once: the closure's states are not searched again
    assert int(c._run_closed.any(axis=1).sum()) >= 20
    # their plans walk from the root, the mask starting from the string content's prescan:
    # only the root's children whose subtrees leave it (a quote, an escape) are walked
    premasked = [p for p in c._plans.values() if p[0].premask != trie_walk_mod.ffi.NULL]
    assert premasked, "no plan took the closed run's prescan"
    scan = premasked[0][4]
    assert scan.k == 0 and 0 < len(scan.frontier) < c._tg.trie._n_root_children // 4
    with pytest.raises(ValueError):
        c._tg.plan(0, c._root_scan, np.zeros(1, np.int32), np.zeros(0, np.int32), premask=scan.run)
    with pytest.raises(ValueError):
        c._tg.premask_scan(scan.mask[:-1], scan.run)
    ffi, lib = trie_walk_mod.ffi, trie_walk_mod.lib
    buf, gs = np.zeros(4, np.int32), np.zeros(c.engine.n_classes + 1, np.int32)
    pw = ffi.from_buffer("uint64_t[]", scan.run)
    b, g = ffi.from_buffer("int32_t[]", buf), ffi.from_buffer("int32_t[]", gs)
    assert lib.llama_cffi_trie_premask_roots(ffi.NULL, c._tg._g, pw, b, 4, g) == -1
    assert lib.llama_cffi_trie_premask_roots(c._tg.trie._struct, c._tg._g, ffi.NULL, b, 4, g) == -1
    assert lib.llama_cffi_trie_premask_roots(c._tg.trie._struct, c._tg._g, pw, b, 0, g) == -1  # room for none
    for seed in range(3):
        compare_walk(c, n, random.Random(seed), 12, f"searched pattern walk {seed}")


def test_premask_scans_take_any_number_of_classes() -> None:
    """A premask scan (the root's children left to walk) is made for a grammar of more than
    4,096 classes (more than 64 words of classes), not refused."""
    v = VocabIndex([b"a", b"ab", b"b", chr(0x4E00).encode(), (chr(0x4E02) + "a").encode()])
    text = "root ::= " + " | ".join(f"[{chr(0x4E00 + 2 * i)}]" for i in range(4200))
    c = Grammar.from_gbnf(text).compile(v, mask_cache_size=0, kernel="c")
    assert c._tg.W > 64
    w = np.zeros(c._tg.W, dtype=np.uint64)
    w[0] = 0xFF
    scan = c._tg.premask_scan(np.zeros(c._tg.trie.n_words, dtype=np.uint32), w)
    assert scan.k == 0 and np.array_equal(scan.run, w) and len(scan.group_start) == c.engine.n_classes + 1


def test_binding_in_one_c_call_on_the_default_vocabulary(big_vocab: llama_cffi.Model) -> None:
    """The same on Gemma 3's 262,144 tokens, for JSON schemas and a word list."""
    for name in list(_BIG_SCHEMAS)[:3]:
        _assert_binding_is_the_reference(Grammar.from_json_schema(_BIG_SCHEMAS[name]).compile(big_vocab, kernel="c"))
    words = " | ".join(f'"{chr(0x4E00 + 3 * i)}{chr(0x4E01 + 5 * i)}"' for i in range(400))
    _assert_binding_is_the_reference(Grammar.from_gbnf(f"root ::= ({words})+ [a-z]*").compile(big_vocab, kernel="c"))


def test_binding_refuses_inconsistent_arrays(vocab_model: llama_cffi.Model) -> None:
    """``TrieGrammar.bind`` checks what the C call reads: code points that are not the
    trie's or not increasing, edges not increasing from 0, classes out of range."""
    from llama_cffi._trie_walk import TrieGrammar

    c = Grammar.from_gbnf('root ::= [a-c]+ "é"').compile(vocab_model, mask_cache_size=0, kernel="c")
    v, eng = c.vocab, c.engine
    args = dict(
        trie=v.trie(),
        uniq_cps=v.uniq_cps_i32,
        n_ascii=v.n_ascii_cps,
        edges=eng._edges.astype(np.int32),
        interval_class=eng._interval_class,
        n_classes=eng.n_classes,
        ascii_cls=np.array(eng._ascii_class, dtype=np.int32),
    )
    TrieGrammar.bind(**args)  # type: ignore[arg-type]
    rev = v.uniq_cps_i32[::-1].copy()
    bad_edges = args["edges"].copy()
    bad_edges[1] = bad_edges[0]
    for change in (
        {"uniq_cps": rev},
        {"uniq_cps": v.uniq_cps_i32[:-1].copy()},
        {"n_ascii": v.n_ascii_cps + 1},
        {"edges": bad_edges},
        {"interval_class": np.full_like(eng._interval_class, eng.n_classes)},
        {"ascii_cls": np.full(128, -1, dtype=np.int32)},
    ):
        with pytest.raises(ValueError):
            TrieGrammar.bind(**{**args, **change})  # type: ignore[arg-type]


def _assert_big_groups(c: CompiledGrammar) -> None:
    """Each big node's children, as the grammar groups them: all of them once, each group
    one class, and every position's next the end of its group."""
    trie = c.vocab.trie()
    kids, nxt = c._tg._keep["big_arrays"]
    n_child, first = trie._arrays["n_child"], trie._arrays["first_child"]
    for i, node in enumerate(trie._big_nodes.tolist()):
        a, b = int(trie._big_base[i]), int(trie._big_base[i + 1])
        assert b - a == n_child[node] >= trie_walk_mod.BIG_CHILDREN
        got = kids[a:b]
        assert sorted(got.tolist()) == list(range(first[node], first[node] + n_child[node]))
        cls = c._cls_of_cp[trie._arrays["node_cpi"][got]]
        j = 0
        while j < b - a:
            end = int(nxt[a + j]) - a
            assert j < end <= b - a and (cls[j:end] == cls[j]).all() and (nxt[a + j : a + end] == a + end).all()
            assert cls[j] not in cls[end:].tolist()  # one group per class
            j = end


def test_big_groups_refuse_bad_data(vocab_model: llama_cffi.Model) -> None:
    """``llama_cffi_trie_big_groups`` checks what it reads: classes out of range, a code
    point index past the grammar's, a node list that is not increasing or whose sizes are
    not the nodes' numbers of children; nothing is written past the arrays."""
    from llama_cffi._binding import ffi, lib

    c = Grammar.from_gbnf('root ::= [a-c]+ "é"').compile(vocab_model, mask_cache_size=0, kernel="c")
    trie = c.vocab.trie()
    n_child = trie._arrays["n_child"]
    big = np.flatnonzero(n_child[: trie.n_nodes] >= 2)[:4].astype(np.int32)
    base = np.zeros(len(big) + 1, dtype=np.int32)
    np.cumsum(n_child[big], out=base[1:])
    t = ffi.new("llama_cffi_trie *", trie._struct[0])
    kids = np.full(int(base[-1]) + 1, -7, dtype=np.int32)
    nxt = np.full(int(base[-1]) + 1, -7, dtype=np.int32)
    cls = c._cls_of_cp

    def call(nodes: npt.NDArray[np.int32], starts: npt.NDArray[np.int32], classes: Any, n_cls: int) -> int:
        keep = (ffi.from_buffer("int32_t[]", nodes), ffi.from_buffer("int32_t[]", starts))
        t.n_big, t.big_min, t.big_nodes, t.big_base = len(nodes), 2, keep[0], keep[1]
        rc: int = lib.llama_cffi_trie_big_groups(
            t,
            ffi.from_buffer("int32_t[]", classes),
            len(classes),
            n_cls,
            ffi.from_buffer("int32_t[]", kids),
            ffi.from_buffer("int32_t[]", nxt),
        )
        return rc

    assert call(big, base, cls, c.engine.n_classes) == 0
    assert kids[-1] == nxt[-1] == -7 and sorted(kids[:-1].tolist()) == sorted(
        j
        for node in big.tolist()
        for j in range(trie._arrays["first_child"][node], trie._arrays["first_child"][node] + n_child[node])
    )
    assert call(big, base, cls, int(cls.max())) == -1  # a class out of range
    assert call(big, base, cls[:1], c.engine.n_classes) == -1  # code point indexes past the grammar's
    assert call(big[::-1].copy(), base, cls, c.engine.n_classes) == -1  # not increasing
    bad = base.copy()
    bad[1] += 1
    assert call(big, bad, cls, c.engine.n_classes) == -1  # a size that is not the node's
    assert (
        call(
            np.array([trie.n_nodes], dtype=np.int32),
            np.array([0, n_child[trie.n_nodes]], dtype=np.int32),
            cls,
            c.engine.n_classes,
        )
        == -1
    )  # the root
    assert kids[-1] == nxt[-1] == -7


@settings(max_examples=budget(60), deadline=None)
@given(data=st.data())
def test_below_summaries_by_brute_force(data: st.DataObject) -> None:
    """The trie's per-node summaries that replace a per-grammar array of the classes below
    each node (below_asc, below_flags) equal a brute-force pass over every node's
    ancestors: the ASCII code points strictly below, a code point >= 128 strictly below
    (special or not), a token ending inside a character at or below."""
    from llama_cffi._trie_walk import special_cps

    special = set(special_cps().tolist())
    assert {0xA0, 0x2028, 0x3000} <= special and min(special) >= 128
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    pieces = {b"".join(rng.choice(_PIECE_PARTS) for _ in range(rng.randint(1, 6))) for _ in range(200)}
    pieces |= {p + rng.choice(_PARTIALS) for p in list(pieces)[:30]} | set(_PARTIALS)
    v = VocabIndex(sorted(pieces))
    n = v.n_nodes
    want_asc = [0] * (n + 1)
    want_na = [False] * (n + 1)
    want_sp = [False] * (n + 1)
    want_pt = [False] * (n + 1)
    for t in v.partial_tokens.tolist():
        want_pt[int(v.term[t])] = True
    parent = v.parent.tolist()
    for node in range(n):
        cp = int(v.uniq_cps[v.node_cpi[node]])
        a = parent[node]
        pt = want_pt[node]
        while True:  # every strict ancestor, the root last
            if cp < 128:
                want_asc[a] |= 1 << cp
            elif cp in special:
                want_sp[a] = True
            else:
                want_na[a] = True
            want_pt[a] = want_pt[a] or pt
            if a == n:
                break
            a = parent[a]
    got_asc = [int(lo) | (int(hi) << 64) for lo, hi in zip(v.below_asc[0::2], v.below_asc[1::2], strict=True)]
    assert got_asc == want_asc
    assert [bool(f & 1) for f in v.below_flags.tolist()] == want_na
    assert [bool(f & 2) for f in v.below_flags.tolist()] == want_pt
    assert [bool(f & 4) for f in v.below_flags.tolist()] == want_sp
    assert any(want_sp) and any(want_na)


_BIG_SCHEMAS: dict[str, dict[str, Any]] = {
    "bounded string": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "bio": {"type": "string", "minLength": 3, "maxLength": 256},
        },
        "required": ["name", "bio"],
    },
    "pattern with counts": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{2,4}-[0-9]{3,8}$"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 6},
        },
        "required": ["code", "tags"],
    },
    "free json": {"type": "object"},
}


@pytest.mark.parametrize("name", list(_BIG_SCHEMAS))
def test_default_vocabulary_schemas(big_vocab: llama_cffi.Model, name: str) -> None:
    """The default model's vocabulary (262,144 tokens) with the schemas whose masks were
    slowest: random walks of 40 tokens, every mask equal."""
    g = Grammar.from_json_schema(_BIG_SCHEMAS[name])
    c, n = both(g, big_vocab)
    for seed in range(2):
        compare_walk(c, n, random.Random(seed), 40, f"{name} seed {seed}")


_KEYED_SCHEMAS: dict[str, tuple[dict[str, Any], Any]] = {
    # named keys beside any other key (Snowplow sp_399's shape): every state inside a key
    # that may still become a named one differs from "any other key" on one class
    "named and other keys": (
        {
            "type": "object",
            "additionalProperties": True,
            "properties": {
                "device": {
                    "type": "object",
                    "additionalProperties": True,
                    "properties": {"android_channel": {"type": "string"}, "named_user_id": {"type": "string"}},
                },
                "id": {"type": "string"},
                "occurred": {"type": "string"},
                "offset": {"type": "string"},
            },
        },
        {  # the named keys in order, then others (this converter writes them so)
            "device": {"android_channel": "1f0e", "named_user_id": "u1", "named_usr": [1, "é"]},
            "id": "x",
            "offset": "0",
            "occurrence": {"o": None},
            "idx": 3,
        },
    ),
    "keys by pattern": (
        {
            "type": "object",
            "patternProperties": {"^x-": {"type": "integer"}},
            "properties": {"name": {"type": "string"}},
            "additionalProperties": {"type": "boolean"},
        },
        {"name": "n", "x-a": 1, "nam": True, "x": False},  # the named key first
    ),
}


@pytest.mark.parametrize("name", list(_KEYED_SCHEMAS))
def test_derived_masks_equal_the_walk(big_vocab: llama_cffi.Model, name: str) -> None:
    """Masks derived from another state's (a key that may still become a named one, from
    "any other key": the other mask with the subtrees of the differing classes walked
    again) equal the numpy walk's, along a document and along random walks, first and
    later visits alike; the derivation was used."""
    schema, doc = _KEYED_SCHEMAS[name]
    c, n = both(Grammar.from_json_schema(schema), big_vocab)
    mc, mn = c.matcher(), n.matcher()
    for tok in [*big_vocab.tokenize(json.dumps(doc, ensure_ascii=False), add_special=False).tolist(), None]:
        want = n.packed(mn.state, mn.partial)
        assert np.array_equal(c.packed(mc.state, mc.partial), want)
        assert np.array_equal(c.packed(mc.state, mc.partial), want)  # again: G's mask from its plan
        if tok is None:
            break
        assert mc.accept_token(tok) and mn.accept_token(tok)
    assert mc.can_end()
    derived = [d for d in c._derived.values() if d is not None]
    assert len(derived) >= 3
    # each kept base mask is its state's own (not a derived one written over it)
    assert 1 <= len(c._bases) < len(derived)
    for of, kept in c._bases.items():
        assert np.array_equal(kept, c._mask_words_c(of, derive=False)), of
    # again in a new grammar, through fill_mask into one reused buffer (the user's array:
    # a base kept as that array, not a copy, would be cleared by the next derived mask)
    c2 = Grammar.from_json_schema(schema).compile(big_vocab, mask_cache_size=0, kernel="c")
    m2, mn = c2.matcher(), n.matcher()
    base_walks: list[int] = []
    walk = c2._mask_words_c

    def counted(start: int, out: Any = None, derive: bool = True) -> Any:
        if not derive:  # (a base's mask walked)
            base_walks.append(start)
        return walk(start, out, derive)

    c2._mask_words_c = counted  # type: ignore[method-assign]
    buf = np.zeros(c2.n_words, dtype=np.uint32)
    for tok in [*big_vocab.tokenize(json.dumps(doc, ensure_ascii=False), add_special=False).tolist(), None]:
        m2.fill_mask(buf)
        assert np.array_equal(buf.view(np.uint8)[: len(want := n.packed(mn.state, mn.partial))], want)
        if tok is None:
            break
        assert m2.accept_token(tok) and mn.accept_token(tok)
    n_derived = sum(d is not None for d in c2._derived.values())
    assert len(base_walks) == len(set(base_walks)) < n_derived  # each base walked once
    for seed in range(2):
        compare_walk(c, n, random.Random(seed), 30, f"{name} seed {seed}")
    assert _assert_derive_picks(c) >= 3  # the C core's choices, as numpy's


def test_a_derivations_choice_on_a_tie_is_the_first_classs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Successors that as many root children lead to: the derivation takes the one of the
    first class (in the C core as in numpy), and the classes on which its row differs."""
    monkeypatch.setattr(compiled_mod, "_DERIVE_MIN_ROOT", 0)
    monkeypatch.setattr(compiled_mod, "_DERIVE_SHARE", 1)
    index = VocabIndex(sorted({b"a", b"b", b"c", b"ab", b"ba", b"cb", b"!"}))
    # "a", "b" and "c" each start one root child, and "c" leads where "b" does: b's
    # successor weighs 2, a's 1; then without "c", a tie
    text = 'root ::= "a" [ab]* "!" | [bc] [abc]*\n'
    c = Grammar.from_gbnf(text).compile(index, mask_cache_size=0, kernel="c")
    s0 = c.engine.start
    got, want = c.engine._c_derive_pick(s0, c._root_count, 0, 1), c._derive_pick(s0)
    assert got is not None and want is not None
    row = c.engine.table()[s0]
    cls = c._cls_of_cp
    cps = c.vocab.uniq_cps.tolist()
    a, b, cc = (int(cls[cps.index(ord(x))]) for x in "abc")
    assert got[0] == want[0] == row[b] == row[cc] != row[a]  # b's and c's: two root children
    assert got[1].tolist() == want[1].tolist()
    tie = Grammar.from_gbnf('root ::= "a" [ab]* "!" | "b" [ab]*\n').compile(index, mask_cache_size=0, kernel="c")
    s1 = tie.engine.start
    got, want = tie.engine._c_derive_pick(s1, tie._root_count, 0, 1), tie._derive_pick(s1)
    row = tie.engine.table()[s1]
    assert got is not None and want is not None
    cls = tie._cls_of_cp
    a, b = (int(cls[cps.index(ord(x))]) for x in "ab")
    assert a < b and got[0] == want[0] == row[a] != row[b]  # a tie: the first class's
    assert got[1].tolist() == want[1].tolist()


@pytest.mark.parametrize("share_check", ["c", "python"])
def test_a_document_through_a_bounded_string(
    big_vocab: llama_cffi.Model, share_check: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tokens of a real document (escapes, non-ASCII, a string near its maximum). A
    position of the bounded string reaches thousands of root children, all to the next
    position, which moves on again: no derivation can serve it, and the first mask says
    so in C (``derive_share``) rather than asking Python for one (``python``: the C check
    off, every such position goes through ``_derivation``, which declines)."""
    if share_check == "python":
        from llama_cffi._trie_walk import TrieGrammar

        orig = TrieGrammar.first_mask
        monkeypatch.setattr(TrieGrammar, "first_mask", lambda self, *a: orig(self, *a[:7], 0))
    schema = _BIG_SCHEMAS["bounded string"]
    doc = json.dumps({"name": 'Zoë "the" tester of things, and more!!', "bio": "日本語 text\nwith a newline"})
    c, n = both(Grammar.from_json_schema(schema), big_vocab)
    mc, mn = c.matcher(), n.matcher()
    for tok in [*big_vocab.tokenize(doc, add_special=False).tolist(), None]:
        assert np.array_equal(c.packed(mc.state, mc.partial), n.packed(mn.state, mn.partial))
        if tok is None:
            break
        assert mc.accept_token(tok) and mn.accept_token(tok)
    assert mc.can_end()
    declined = sum(d is None for d in c._derived.values())  # derivations asked for and declined
    if share_check == "c":
        assert declined <= 2
    else:
        assert declined >= 10


def _pending_reasons(c: CompiledGrammar, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the reasons of every pending entry the C walks of ``c`` report."""
    from llama_cffi._trie_walk import TrieGrammar

    seen: list[int] = []
    for name in ("mask", "walk"):
        orig = getattr(TrieGrammar, name)

        def wrapped(self: Any, *a: Any, _orig: Any = orig, **k: Any) -> Any:
            pend, full = _orig(self, *a, **k)
            if self is c._tg:
                seen.extend(pend[:, 2].tolist())
            return pend, full

        monkeypatch.setattr(TrieGrammar, name, wrapped)
    return seen


def test_walk_computes_transitions_in_the_engine(big_vocab: llama_cffi.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the C engine core, a mask's walk computes the transitions and the runs it
    needs in the engine (none is left pending for Python), masks stay equal to the numpy
    walk's, the runs it wrote are the engine's, and the Python copy of the table holds
    what the walk computed. Detached from the engine, the same walk leaves them pending
    (what the first half checks can fail)."""
    from llama_cffi._trie_walk import PEND_RUN, PEND_TRANS, TRANS_UNKNOWN

    g = Grammar.from_json_schema(_BIG_SCHEMAS["bounded string"])
    c, n = both(g, big_vocab)
    assert c.engine.core == "c"
    reasons = _pending_reasons(c, monkeypatch)
    compare_walk(c, n, random.Random(3), 25, "engine walk")
    assert PEND_TRANS not in reasons and PEND_RUN not in reasons, sorted(set(reasons))
    for s in np.flatnonzero(c._run_known[: c.engine.n_states]).tolist():  # the runs the walks wrote
        chain, words, closed = c.engine._c_run(s, c._class_weight_f, c._run_cap, _RUN_STACKS_MAX)
        assert np.array_equal(c._run_words[s], words) and c._run_len[s] == len(chain) - 1, s
        # (a walk leaves a state's closed run out, a plan's run has it: the engine's)
        assert not c._run_closed[s].any() or np.array_equal(c._run_closed[s], closed), s
    t = c.engine.table()
    assert c.engine.n_states == len(c.engine._complete) and (t[: c.engine.n_states] != TRANS_UNKNOWN).any()
    for s in range(c.engine.n_states):  # the copy equals the engine's own answers where known
        for cl in np.flatnonzero(t[s, : c.engine.n_classes] != TRANS_UNKNOWN)[:5].tolist():
            assert c.engine.step(s, cl) == t[s, cl]
    fresh = Grammar.from_json_schema(_BIG_SCHEMAS["bounded string"])  # its own engine, nothing computed
    detached = fresh.compile(big_vocab, mask_cache_size=0, kernel="c")
    assert detached is not c
    detached._tg.detach_engine()
    reasons2 = _pending_reasons(detached, monkeypatch)
    compare_walk(detached, n, random.Random(3), 25, "detached walk")  # (the same walk)
    assert PEND_TRANS in reasons2, sorted(set(reasons2))


def test_first_and_later_masks_of_a_state_agree(big_vocab: llama_cffi.Model) -> None:
    """A state's first masks skip the plan when its run starts few tokens (walks from the
    root through the root groups), ``_PLAN_AT - 1`` of them; the next makes the plan (the
    run's scan and the frontier); the one after, the state settled, reads the tables
    alone, not the engine. All equal the numpy walk's mask, for every state along a
    document, through both calls (``fill_words``, the matcher's, and ``packed``)."""
    schema = _BIG_SCHEMAS["bounded string"]
    doc = json.dumps({"name": "Ada", "bio": "an engineer"})
    c, n = both(Grammar.from_json_schema(schema), big_vocab)
    mc, mn = c.matcher(), n.matcher()
    skipped = 0
    for tok in [*big_vocab.tokenize(doc, add_special=False).tolist(), None]:
        want = n.packed(mn.state, mn.partial)
        words = np.zeros(c.n_words, dtype=np.uint32)
        planned_first = False
        for i in range(compiled_mod._PLAN_AT - 1):
            got = c.packed(mc.state, mc.partial).copy() if i % 2 else c.fill_words(mc.state, mc.partial, words)
            assert np.array_equal(got.view(np.uint8)[: len(want)], want)
            if i == 0:
                planned_first = mc.state in c._plans
            elif not planned_first:
                assert mc.state not in c._plans  # walked from the root again, no plan yet
        skipped += mc.state in c._visited and mc.state not in c._plans
        assert np.array_equal(c.packed(mc.state, mc.partial), want)  # with a plan
        assert mc.state in c._plans and mc.state in c._settled
        assert np.array_equal(c.packed(mc.state, mc.partial), want)  # the third: the tables alone
        if tok is None:
            break
        assert mc.accept_token(tok) and mn.accept_token(tok)
    assert skipped >= 3  # the path was taken (literal keys, punctuation)


@pytest.mark.parametrize("rule", ["on", "off"])
def test_a_letters_loop_makes_its_plan_at_its_first_mask(
    big_vocab: llama_cffi.Model, rule: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state inside ``[a-z]+`` starts few root children (26) but a walk from the root
    would descend every token they start (tens of thousands): its first mask makes the
    plan (``_ROOT_PLAN_TOKENS``), a literal's state does not; masks equal the numpy
    walk's either way. ``off``: the rule disabled, the loop's first mask walks from the
    root (the old path), so the test tells the two apart."""
    if rule == "off":
        monkeypatch.setattr(compiled_mod, "_ROOT_PLAN_TOKENS", -1)
    c, n = both(Grammar.from_json_schema({"type": "string", "pattern": "^[a-z]+$"}), big_vocab)
    mc, mn = c.matcher(), n.matcher()
    planned_at_first: list[bool] = []
    for tok in [*big_vocab.tokenize('"engineering"', add_special=False).tolist(), None]:
        fresh = mc.state not in c._visited
        assert np.array_equal(c.packed(mc.state, mc.partial), n.packed(mn.state, mn.partial))
        if fresh:
            planned_at_first.append(mc.state in c._plans)
        if tok is None:
            break
        assert mc.accept_token(tok) and mn.accept_token(tok)
    assert not planned_at_first[0]  # the opening quote's state: a literal, walked from the root
    assert any(planned_at_first) == (rule == "on")


def test_run_scans_leave_the_root_children_implicit(big_vocab: llama_cffi.Model) -> None:
    """A run scan lists no child of the root in its frontier (those come from the
    grammar's root groups, the same for every run): a scan costs what the run's own
    paths cost, not the vocabulary's tens of thousands of first characters. The root
    groups hold every root child once, under its class."""
    c = Grammar.from_json_schema(_BIG_SCHEMAS["bounded string"]).compile(big_vocab, mask_cache_size=0, kernel="c")
    trie, tg = c.vocab.trie(), c._tg
    lo, hi = int(trie._arrays["level_base"][0]), int(trie._arrays["level_base"][1])
    assert sorted(tg._root_nodes.tolist()) == list(range(lo, hi))
    for cl in range(c.engine.n_classes):
        group = tg._root_nodes[tg._root_start[cl] : tg._root_start[cl + 1]]
        assert (c._cls[group] == cl).all()
    m = c.matcher()
    for _ in range(compiled_mod._PLAN_AT):  # the last of these masks of a state makes its plan and scan
        c.packed(m.state)
    assert c._run_scans
    for scan in c._run_scans.values():
        assert not ((scan.frontier >= lo) & (scan.frontier < hi)).any()


def test_kernel_selection(vocab_model: llama_cffi.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """``kernel=`` or the environment variable picks the walk; compiled grammars are cached
    per kernel; a wrong name is refused."""
    g = Grammar.from_gbnf('root ::= [a-z]+ "!"')
    monkeypatch.delenv("LLAMA_CFFI_GRAMMAR_KERNEL", raising=False)
    assert g.compile(vocab_model).kernel == "c"
    monkeypatch.setenv("LLAMA_CFFI_GRAMMAR_KERNEL", "numpy")
    assert g.compile(vocab_model).kernel == "numpy"
    assert g.compile(vocab_model, kernel="c").kernel == "c"
    assert g.compile(vocab_model, kernel="c") is g.compile(vocab_model, kernel="c")
    monkeypatch.setenv("LLAMA_CFFI_GRAMMAR_KERNEL", "fortran")
    with pytest.raises(ValueError, match="LLAMA_CFFI_GRAMMAR_KERNEL"):
        g.compile(vocab_model)
    with pytest.raises(ValueError, match="kernel"):
        g.compile(vocab_model, kernel="rust")


def test_bad_arrays_raise_not_crash() -> None:
    """Out-of-range values in the arrays the C walk reads (a token, a node, a state, a
    class) raise ValueError; the process survives (checked in a child)."""
    code = """
    import numpy as np
    from llama_cffi._trie_walk import Trie, TrieGrammar
    from samplers.grammar import Grammar
    from samplers.grammar.vocab_index import VocabIndex

    v = VocabIndex([b"a", b"ab", b"b", b"ba", b"abc"])
    c = Grammar.from_gbnf('root ::= [ab]+ "c"?').compile(v, mask_cache_size=0, kernel="c")
    m = c.matcher()
    for piece in (b"a", b"b", b"c"):  # transitions and runs known: the walks below reach every array
        c.packed(m.state)
        m.accept_bytes(piece)
    base = dict(n_vocab=v.n_vocab, max_depth=len(v.level_base) - 1, n_pchars=len(v.pchars),
                level_base=v.level_base, node_cpi=v.node_cpi, parent=v.parent, first_child=v.first_child,
                n_child=v.n_child, row_start=v.row_start, row_end=v.row_end, n_term=v.n_term,
                has_pt=np.zeros(v.n_nodes + 1, np.uint8), order=v.order, pchar_slot=v.pchar_slot,
                root_pt=np.zeros(0, np.int32), uniq_cps=v.uniq_cps)
    ac, na = c._tg._ascii_cls, c._tg._na_classes
    def attempt(label, f):
        try:
            f()
        except (ValueError, TypeError) as e:
            print(label, "raised", type(e).__name__)
        else:
            print(label, "passed")
    for name, value in [("order", np.full(v.n_vocab, 10**6)), ("first_child", np.full(v.n_nodes + 1, 10**6)),
                        ("row_end", np.full(v.n_nodes + 1, 10**6)), ("node_cpi", np.full(v.n_nodes, 10**6))]:
        def go(name=name, value=value):
            t = Trie(**{**base, name: value})
            t.nodes_per_class(c._cls_of_cp, c.engine.n_classes)
            tg = TrieGrammar(t, c._cls_of_cp, c.engine.n_classes, ac, na)
            tg.set_tables(c.engine.table(), c._run_known, c._run_words, c._run_len, c._pchar_known, c._pchar_tab)
            m = np.zeros(t.n_words, np.uint32)
            tg.walk(m, c.engine.start, np.array([t.n_nodes], np.int32))
        attempt(name, go)
    t = Trie(**base)
    tg = TrieGrammar(t, c._cls_of_cp, c.engine.n_classes, ac, na)
    bad = np.full_like(c.engine.table(), 10**6)
    tg.set_tables(bad, c._run_known, c._run_words, c._run_len, c._pchar_known, c._pchar_tab)
    attempt("trans", lambda: tg.walk(np.zeros(t.n_words, np.uint32), c.engine.start, np.array([t.n_nodes], np.int32)))
    attempt("start", lambda: tg.walk(np.zeros(t.n_words, np.uint32), 10**6, np.array([0], np.int32)))
    attempt("node", lambda: tg.walk(np.zeros(t.n_words, np.uint32), 0, np.array([10**6], np.int32)))
    attempt("mask", lambda: tg.walk(np.zeros(1, np.uint32), 0, np.array([0], np.int32)))
    def bad_cls():
        tg2 = TrieGrammar(t, np.full(len(c._cls_of_cp), 10**6, np.int32), c.engine.n_classes, ac, na)
        tg2.set_tables(c.engine.table(), c._run_known, c._run_words, c._run_len, c._pchar_known, c._pchar_tab)
        tg2.walk(np.zeros(t.n_words, np.uint32), c.engine.start, np.array([t.n_nodes], np.int32))
    attempt("cls", bad_cls)
    attempt("bind", lambda: t.nodes_per_class(np.full(len(c._cls_of_cp), 10**6, np.int32), c.engine.n_classes))
    attempt("ascii_cls", lambda: TrieGrammar(t, c._cls_of_cp, c.engine.n_classes, np.full(128, 10**6, np.int32), na))
    # a shared scan regrouped: nodes and depths out of range
    from llama_cffi._trie_walk import SharedScan
    sc = c._tg.run_scan(c._run_words[c.engine.start], 2)
    sh = c._tg.shared(sc)
    for label, nodes, depths in (("shared node", [10**6], [0]), ("shared depth", [0], [99]), ("neg depth", [0], [-1])):
        bad_sh = SharedScan(2, sh.mask, np.array(nodes, np.int32), np.array(depths, np.int32),
                            sh.pt_tokens, sh.pt_depth)
        attempt(label, lambda s_=bad_sh: c._tg.unshare(s_, sc.run))
    attempt("shared mask", lambda: c._tg.unshare(SharedScan(2, np.zeros(9, np.uint32), sh.nodes, sh.depths,
                                                             sh.pt_tokens, sh.pt_depth), sc.run))
    attempt("short cls", lambda: TrieGrammar(t, c._cls_of_cp[:1], c.engine.n_classes, ac, na).walk(
        np.zeros(t.n_words, np.uint32), c.engine.start, np.array([t.n_nodes], np.int32)))
    def bad_densify():
        base = c._tg.run_scan(c._run_words[c.engine.start], 2, keep=True)
        base.absorbed = np.array([10**6, 0], np.int32)
        c._tg.densified(base)
    attempt("densify", bad_densify)
    # a scan extended from a shared one: its frontier, depths and key out of range
    full = c._tg.trie.max_depth + 1
    run0 = c._run_words[c.engine.start]
    sh0, key0 = c._tg.shared(c._tg.run_scan(run0, full)), c._cp_key(run0)
    for label, nodes, depths in (("extend node", [10**6], [0]), ("extend depth", [0], [99])):
        bad_sh = SharedScan(full, sh0.mask, np.array(nodes, np.int32), np.array(depths, np.int32),
                            sh0.pt_tokens, sh0.pt_depth)
        attempt(label, lambda s_=bad_sh: c._tg.run_scan_extend(s_, key0, run0))
    attempt("extend key", lambda: c._tg.run_scan_extend(sh0, key0[:-1], run0))
    attempt("extend pt", lambda: c._tg.run_scan_extend(
        SharedScan(full, sh0.mask, sh0.nodes, sh0.depths, np.array([10**6], np.int32), np.array([0], np.int32)),
        key0, run0))
    # the packed records a cache file gives (the walks read them): out of range too
    from llama_cffi._trie_walk import ffi
    nodes, row_tok = Trie(**base).packed_arrays()
    size = ffi.sizeof("llama_cffi_tnode")
    huge = np.frombuffer(np.int32(10**6).tobytes(), np.uint8)
    for field in ("first_child", "row_end", "cpi"):
        bad_nodes = nodes.copy().reshape(-1, size)
        at = ffi.offsetof("llama_cffi_tnode", field)
        bad_nodes[:, at : at + 4] = huge
        def go(packed=(bad_nodes.ravel(), row_tok)):
            t = Trie(**base, packed=packed)
            tg = TrieGrammar(t, c._cls_of_cp, c.engine.n_classes, ac, na)
            tg.set_tables(c.engine.table(), c._run_known, c._run_words, c._run_len, c._pchar_known, c._pchar_tab)
            tg.walk(np.zeros(t.n_words, np.uint32), c.engine.start, np.array([t.n_nodes], np.int32))
        attempt("packed " + field, go)
    bad_rows = row_tok.copy()
    bad_rows[0::2] = 10**6
    attempt("packed rows", lambda: go((nodes, bad_rows)))
    # a bounded position's plan made from another's whose partial-character tokens are
    # out of range (a token, a depth down the chain)
    from llama_cffi._trie_walk import RunScan
    import samplers.grammar.compiled as cm
    cm._SMALL_VOCAB, cm._ROOT_PLAN_MAX = 0, 0
    cb = Grammar.from_gbnf('root ::= [ab]{0,30} "c"').compile(v, mask_cache_size=0, kernel="c")
    s0 = cb.engine.start
    p0 = cb._plan(s0)
    chain0, sc0 = p0[2], p0[4]
    out_c = ffi.from_buffer("uint32_t[]", np.zeros(cb.n_words, np.uint32))
    for label, pt, ptd in (("position none", [], []), ("position pt", [10**6], [0]),
                           ("position depth", [0], [99]), ("position neg depth", [0], [-1])):
        def go_pos(pt=pt, ptd=ptd):
            bad_sc = RunScan(sc0.k, sc0.mask, sc0.frontier, sc0.group_start, np.array(pt, np.int32),
                             np.array(ptd, np.int32), sc0.run)
            tmpl = cb._tg.plan(s0, bad_sc, chain0, np.zeros(0, np.int32))
            cb._walk_tables()
            with cb.engine._lock:
                rc, _ = cb._tg.position_mask(tmpl, int(chain0[1]), 4, out_c)
            print(label, "rc", rc)
        attempt(label, go_pos)
    print("alive")
    """
    r = run_isolated(code)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.split("\n")
    assert lines[-2] == "alive"
    for label in (
        "order",
        "first_child",
        "row_end",
        "node_cpi",
        "trans",
        "start",
        "node",
        "mask",
        "cls",
        "bind",
        "ascii_cls",
        "shared node",
        "shared depth",
        "neg depth",
        "shared mask",
        "densify",
        "extend node",
        "extend depth",
        "extend key",
        "extend pt",
        "packed first_child",
        "packed row_end",
        "packed cpi",
        "packed rows",
        "position pt",
        "position depth",
        "position neg depth",
    ):
        assert f"{label} raised ValueError" in lines, (label, r.stdout)
    assert "position none rc 0" in lines, r.stdout  # (the same call with no bad array: a mask)


def test_index_of_every_kind_builds_a_trie() -> None:
    """An empty vocabulary, one of only partial characters, and one with a token longer
    than any other: the C trie is built and walked."""
    for pieces in ([b""], [b"\xe6", b"\xe6\x97"], [b"a" * 300, b"a", b"b"]):
        v = VocabIndex(pieces)
        g = Grammar.from_gbnf("root ::= [^x]*")
        c, n = both(g, v)
        assert np.array_equal(c.packed(c.engine.start), n.packed(n.engine.start))


@settings(max_examples=budget(60), deadline=None)
@given(toks=st.lists(st.integers(0, 999), max_size=60), nodes=st.lists(st.integers(0, 10**6), max_size=8))
def test_token_ids_set_and_subtrees_cleared(toks: list[int], nodes: list[int]) -> None:
    """``_set_token_ids`` sets the bits of the tokens given (repeats allowed) and no others;
    ``Trie.clear_below`` clears those of the tokens below the nodes given (each node's
    rows: its subtree) and of the tokens given, and no others. A token or node out of
    range raises."""
    from samplers.grammar.compiled import _set_token_ids

    v = VocabIndex([bytes([97 + i % 26]) * (1 + i // 26) for i in range(1000)])
    c = Grammar.from_gbnf("root ::= [a-z]*").compile(v)
    words = np.zeros(c.n_words, dtype=np.uint32)
    _set_token_ids(words, np.array(toks, dtype=np.int32))
    want = np.zeros(c.n_words * 32, dtype=bool)
    want[toks] = True
    assert np.array_equal(np.unpackbits(words.view(np.uint8), bitorder="little").astype(bool), want)
    with pytest.raises(ValueError, match="past the vocabulary"):
        _set_token_ids(words, np.array([*toks, 32 * c.n_words], dtype=np.int32))
    trie = c._tg.trie
    nodes = [n % v.n_nodes for n in nodes]
    full = np.full(c.n_words, 0xFFFFFFFF, dtype=np.uint32)
    trie.clear_below(full, np.array(nodes, dtype=np.int32), np.array(toks, dtype=np.int32))
    gone = np.zeros(c.n_words * 32, dtype=bool)
    gone[toks] = True
    for n in nodes:  # (the python side of the trie: rows row_start .. row_end hold the subtree)
        gone[v.order[v.row_start[n] : v.row_end[n]]] = True
    assert np.array_equal(~np.unpackbits(full.view(np.uint8), bitorder="little").astype(bool), gone)
    for bad_nodes, bad_toks in (([v.n_nodes], []), ([-1], []), ([], [v.n_vocab])):
        with pytest.raises(ValueError, match="out of range"):
            trie.clear_below(full, np.array(bad_nodes, dtype=np.int32), np.array(bad_toks, dtype=np.int32))


def _tnode_dtype() -> np.dtype[Any]:
    """``llama_cffi_tnode`` as a numpy structured type, at the offsets C gives it."""
    ffi = trie_walk_mod.ffi
    ty = ffi.typeof("llama_cffi_tnode")
    fields = {
        name: (np.dtype("<i4"), ffi.offsetof(ty, name))
        for name in ("first_child", "n_child", "row_start", "row_end", "n_term", "height", "cpi")
    }
    fields["has_pt"] = (np.dtype("u1"), ffi.offsetof(ty, "has_pt"))
    fields["below_flags"] = (np.dtype("u1"), ffi.offsetof(ty, "below_flags"))
    fields["below_asc"] = (np.dtype(("<u8", (2,))), ffi.offsetof(ty, "below_asc"))
    return np.dtype(
        {
            "names": list(fields),
            "formats": [f[0] for f in fields.values()],
            "offsets": [f[1] for f in fields.values()],
            "itemsize": ffi.sizeof(ty),
        }
    )


@settings(max_examples=budget(40), deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_packed_nodes_are_the_node_arrays(seed: int) -> None:
    """The records the walks read (``Trie.packed_arrays``) hold each node's arrays (the
    root's code point index -1), and each row its token and that token's partial-character
    slot; a trie given them (as a cache file does) walks as one that packed its own, and
    arrays of another size are refused."""
    rng = random.Random(seed)
    pieces = {b"".join(rng.choice(_PIECE_PARTS) for _ in range(rng.randint(1, 6))) for _ in range(200)}
    v = VocabIndex(sorted(pieces | set(_PARTIALS)))
    t = v.trie()
    nodes, row_tok = t.packed_arrays()
    rec = nodes.view(_tnode_dtype())
    n = v.n_nodes
    assert len(rec) == n + 1
    for name in ("first_child", "n_child", "row_start", "row_end", "n_term", "height"):
        assert np.array_equal(rec[name], getattr(v, name)), name
    assert np.array_equal(rec["cpi"][:n], v.node_cpi) and rec["cpi"][n] == -1
    assert np.array_equal(rec["below_flags"], v.below_flags)
    assert np.array_equal(rec["below_asc"].ravel(), v.below_asc)
    assert np.array_equal(rec["has_pt"], t._has_pt)
    assert np.array_equal(row_tok[0::2], v.order) and np.array_equal(row_tok[1::2], v.pchar_slot[v.order])
    # a trie made with them walks as this one: the same masks along a document
    again = VocabIndex(sorted(pieces | set(_PARTIALS)))
    again._packed = (nodes.copy(), row_tok.copy())
    assert again.trie().packed_arrays()[0] is again._packed[0]
    g = Grammar.from_gbnf('root ::= [a-z0-9 ]{0,5} ("é" | "!") [^x]*')
    m1 = g.compile(v, mask_cache_size=0, kernel="c").matcher()
    m2 = g.compile(again, mask_cache_size=0, kernel="c").matcher()
    for _ in range(8):
        a1, a2 = m1.allowed_tokens(), m2.allowed_tokens()
        assert np.array_equal(a1, a2)
        ok = np.flatnonzero(a1 & ~v.eog)
        if not len(ok):
            break
        tok = int(ok[rng.randrange(len(ok))])
        assert m1.accept_token(tok) and m2.accept_token(tok)
    # of another size: refused by the trie, packed again by the index
    base = {
        k: getattr(v, k)
        for k in ("level_base", "node_cpi", "parent", "first_child", "n_child", "row_start", "row_end", "n_term")
    }
    with pytest.raises(ValueError, match="packed"):
        trie_walk_mod.Trie(
            n_vocab=v.n_vocab,
            max_depth=len(v.level_base) - 1,
            n_pchars=len(v.pchars),
            has_pt=t._has_pt,
            order=v.order,
            pchar_slot=v.pchar_slot,
            root_pt=np.zeros(0, np.int32),
            uniq_cps=v.uniq_cps,
            packed=(nodes[:-1], row_tok),
            **base,
        )
    short = VocabIndex(sorted(pieces | set(_PARTIALS)))
    short._packed = (nodes[:-48], row_tok)
    assert short.trie().packed_arrays()[0].shape == nodes.shape
    assert np.array_equal(short.trie().packed_arrays()[0], nodes)


def test_fill_masks_of_many_matchers(big_vocab: llama_cffi.Model) -> None:
    """One call for matchers of different grammars and states (and kernels, caches, an
    ended one): row ``i`` is matcher ``i``'s own mask; bad arguments are refused."""
    from samplers.grammar import fill_masks
    from samplers.grammar.masks import shared_rows

    rng = random.Random(7)
    matchers = []
    for name, schema in _BIG_SCHEMAS.items():
        g = Grammar.from_json_schema(schema)
        for kernel, size in (("c", 0), ("numpy", 0), ("c", 16)):
            m = g.compile(big_vocab, mask_cache_size=size, kernel=kernel).matcher()
            for _ in range(rng.randint(0, 12)):
                allowed = np.flatnonzero(m.allowed_tokens() & ~m.compiled.vocab.eog)
                m.accept_token(int(rng.choice(allowed.tolist())))
            matchers.append(m)
            matchers.append(m.clone())  # the same state: computed once, copied
        del name
    ended = Grammar.from_gbnf('root ::= "a"').matcher(big_vocab)
    assert ended.accept_bytes(b"a") and ended.accept_token(big_vocab.vocab.eog_tokens()[0])
    matchers.append(ended)
    got = fill_masks(matchers)
    assert got.shape == (len(matchers), matchers[0].compiled.n_words)
    for i, m in enumerate(matchers):
        assert np.array_equal(got[i], m.fill_mask()), i
    assert not got[-1].any()
    # shared_rows: the same rows, a clone's (same grammar and state) the same array
    rows = shared_rows(matchers)
    assert len(rows) == len(matchers) and all(np.array_equal(r, g) for r, g in zip(rows, got, strict=True))
    assert all(rows[i] is rows[i + 1] for i in range(0, len(matchers) - 1, 2))
    assert len({id(r) for r in rows}) == len({(id(m.compiled), m.state, m.partial) for m in matchers[:-1]}) + 1
    out = np.full((len(matchers), got.shape[1] + 3), 0xFFFFFFFF, dtype=np.uint32)
    assert fill_masks(matchers, out) is out and np.array_equal(out[:, : got.shape[1]], got)
    with pytest.raises(TypeError, match=r"matchers\[1\]"):
        fill_masks([matchers[0], "not a matcher"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="shape"):
        fill_masks(matchers, np.zeros((1, got.shape[1]), dtype=np.uint32))
    tiny = Grammar.from_gbnf("root ::= [a-z]+").matcher(VocabIndex([b"a", b"b"]))
    with pytest.raises(ValueError, match="another size"):
        fill_masks([matchers[0], tiny])
    # the trie's batch call writes rows of the caller's array: a row out of it, or an
    # array that is not one, is refused before any walk
    c, st = matchers[0].compiled, matchers[0].state
    assert c.kernel == "c" and c._mask_cache_size == 0
    c.fill_words(st, (0, 0), np.empty(c.n_words, dtype=np.uint32))
    plan, trie = c._batch_plan(st), c.vocab.trie()
    c._set_tables()
    rcs, pending = trie.masks([c._tg], [plan], out, [2], 1)
    assert rcs == [0] and (pending != [0] or np.array_equal(out[2, : c.n_words], got[0]))
    for bad_row in (-1, len(out), 1.0):
        with pytest.raises(ValueError, match="row"):
            trie.masks([c._tg], [plan], out, [bad_row], 1)  # type: ignore[list-item]
    for bad_out in (out[0], out[:, ::2], out.astype(np.int32), out[:, : c.n_words - 1]):
        with pytest.raises(ValueError, match="2-D"):
            trie.masks([c._tg], [plan], bad_out, [0], 1)
    # fill_masks' call without the Python checks: rows still checked, in C, before any walk
    job = c._tg.batch_job(plan)
    before = out.copy()
    for bad_row in (-1, len(out)):
        with pytest.raises(ValueError, match="row"):
            trie._masks([job, job], out, [0, bad_row], 2)
    assert np.array_equal(out, before)
    assert trie._masks([job], out, [1], 1) == 0 and trie._redo(1) == [False]
    assert np.array_equal(out[1, : c.n_words], got[0])


def test_a_given_mask_is_used_while_the_state_holds(vocab_model: llama_cffi.Model) -> None:
    """``GrammarSampler.use_mask``: ``allows`` and ``apply`` read the given words while the
    matcher stays in the state they were made for, and walk again once it moves."""
    from samplers import Candidates
    from samplers.grammar import GrammarSampler

    g = Grammar.from_gbnf('root ::= [a-c]+ "!"')
    s = GrammarSampler(g, vocab_model)
    n = vocab_model.vocab.n_vocab
    fake = np.zeros(s.compiled.n_words, dtype=np.uint32)
    fake[0] = 1  # only token 0: a mask the grammar would never give, to see it used
    s.use_mask(fake)
    assert s.allows(0) and not any(s.allows(t) for t in range(1, n))
    row = np.zeros(n, dtype=np.float32)
    cands = Candidates()
    cands.reset(row)
    s.apply(cands)
    assert np.flatnonzero(cands.read_logits() > -np.inf).tolist() == [0]
    tok = next(t for t in range(n) if vocab_model.vocab.token_to_piece(t) == b"a")
    assert s.matcher.accept_token(tok)  # moved: the given mask no longer applies
    cands.reset(row)
    s.apply(cands)
    want = s.matcher.allowed_tokens()
    assert np.array_equal(cands.read_logits() > -np.inf, want)
    assert [s.allows(t) for t in range(n)] == want.tolist()
    with pytest.raises(ValueError, match="words"):
        s.use_mask(np.zeros(1, dtype=np.uint32))
    with pytest.raises(TypeError, match="uint32"):
        s.use_mask(np.zeros(s.compiled.n_words, dtype=np.int64))  # type: ignore[arg-type]


@pytest.mark.parametrize("lead", ["top-k", "whole row"])
def test_branch_store_gives_grammars_their_masks_in_one_call(
    tiny_model: llama_cffi.Model, monkeypatch: pytest.MonkeyPatch, lead: str
) -> None:
    """A step of several grammar-constrained branches samples the same tokens as branches
    that walk on their own, with at most one ``fill_masks`` call (``shared_rows``, its rows
    one array per state): for chains that run
    whole rows, every branch's mask; for chains batched with llama.cpp's fast path (a
    top-k after the grammar), only the masks of the branches whose first token the
    grammar rejected."""
    import samplers.chain_batch as chain_batch_mod
    import samplers.grammar.masks as masks_mod
    from samplers import Dist, SamplerChain, Temperature, TopK
    from samplers.branch import BranchStore
    from samplers.grammar import GrammarSampler

    calls: list[int] = []
    real = masks_mod.shared_rows

    def spy(ms: Any) -> Any:
        calls.append(len(ms))
        return real(ms)

    def chain() -> SamplerChain:
        return SamplerChain([TopK(5) if lead == "top-k" else Temperature(0.9), Dist(seed=3)])

    monkeypatch.setattr(masks_mod, "shared_rows", spy)
    again: list[int] = []  # rows that chose again from their masks' best candidates
    real_rows = chain_batch_mod.masked_top_k_rows

    def spy_rows(rows: Any, masks: Any, *args: Any, **kw: Any) -> Any:
        again.append(len(masks))
        return real_rows(rows, masks, *args, **kw)

    monkeypatch.setattr(chain_batch_mod, "masked_top_k_rows", spy_rows)
    gbnfs = ['root ::= [a-z ]+ "."', 'root ::= ("the" | "a" | " ")+', 'root ::= [^x]{1,5} "!"']
    prompt = tiny_model.tokenize("hello", add_special=False)
    rejected = 0
    with tiny_model.context(n_ctx=256, n_seq_max=8) as ctx, tiny_model.context(n_ctx=256, n_seq_max=8) as ctx2:
        store = BranchStore(ctx)
        branches = [store.create(prompt, sampler=chain(), grammar=g) for g in gbnfs]
        alone = BranchStore(ctx2)
        twins = [alone.create(prompt, sampler=chain(), grammar=g) for g in gbnfs]
        for _ in range(4):
            live = [b for b in branches if not b.sampler.samplers[0].matcher.is_complete()]
            if len(live) < 2:
                break
            n_calls, n_again = len(calls), len(again)
            # (grammars holding a mask for their state already are not walked again)
            unmasked = sum(b.sampler.samplers[0]._words() is None for b in live)
            got = store.sample(live)
            assert len(calls) - n_calls <= 1
            assert all(isinstance(b.sampler.samplers[0], GrammarSampler) for b in live)
            if lead == "whole row":  # (a mask still valid for its grammar's state is not made again)
                assert calls[n_calls:] == ([unmasked] if unmasked >= 2 else [])
                assert all(b.sampler.samplers[0]._words() is not None for b in live)
            else:  # masks only for rows that chose again (fewer when a mask was still valid)
                assert sum(calls[n_calls:]) <= sum(again[n_again:]) <= len(live)
                rejected += sum(again[n_again:])
            want = {b: twins[branches.index(b)].sample() for b in live}
            assert [got[b] for b in live] == [want[b] for b in live]
            store.step(got)
            alone.step({twins[branches.index(b)]: t for b, t in got.items()})
    if lead == "top-k":
        assert rejected > 0


@settings(max_examples=budget(60), deadline=None)
@given(
    st.integers(8192, 40000),
    st.integers(1, 30),
    st.floats(0.0, 1.0),
    st.randoms(use_true_random=False),
)
def test_top_k_of_a_masked_row(n: int, k: int, allowed: float, rng: random.Random) -> None:
    """After a grammar mask most logits are -inf: ``Candidates.top`` takes the finite ones
    and then the lowest-positioned -inf ones, as a stable sort would (fewer than ``k``
    allowed included), whatever the share allowed."""
    from samplers import Candidates

    r = np.random.default_rng(rng.randrange(2**32))
    row = r.normal(size=n).astype(np.float32)
    row[r.random(n) >= allowed] = -np.inf
    row[r.integers(0, n, size=5)] = 1.5  # ties among the finite
    cands = Candidates()
    cands.reset(row)
    words = np.zeros((n + 31) // 32, dtype=np.uint32)  # every token allowed: the logits kept
    words[:] = 0xFFFFFFFF
    from llama_cffi._trie_walk import mask_logits

    assert mask_logits(cands.logits, None, words, n) == 0  # a copy: no longer the identity row
    got = cands.top(k)
    want = np.argsort(-row, kind="stable")[:k]
    assert got.tolist() == want.tolist()


@settings(max_examples=budget(60), deadline=None)
@given(st.integers(0, 3000), st.booleans(), st.randoms(use_true_random=False))
def test_mask_logits_equals_numpy(n_vocab: int, identity: bool, rng: random.Random) -> None:
    """The C pass that applies a packed mask to candidates equals the numpy expression it
    replaced; an id outside the vocabulary raises."""
    from llama_cffi._trie_walk import mask_logits
    from llama_cffi.errors import InvalidTokenError

    r = np.random.default_rng(rng.randrange(2**32))
    allowed = r.random(n_vocab) < 0.3
    words = np.zeros((n_vocab + 31) // 32 + 1, dtype=np.uint32)
    words.view(np.uint8)[: (n_vocab + 7) // 8] = np.packbits(allowed, bitorder="little")
    ids = None if identity else r.integers(0, max(n_vocab, 1), size=r.integers(0, 2 * n_vocab + 1)).astype(np.int32)
    if ids is not None and n_vocab == 0:
        ids = ids[:0]
    logits = r.normal(size=n_vocab if ids is None else len(ids)).astype(np.float32)
    want = logits.copy()
    ban = ~(allowed if ids is None else allowed[ids])
    want[ban] = -np.inf
    assert mask_logits(logits, ids, words, n_vocab) == int(ban.sum())
    assert np.array_equal(logits, want)
    if n_vocab:
        with pytest.raises(InvalidTokenError):
            mask_logits(np.zeros(1, np.float32), np.array([n_vocab], np.int32), words, n_vocab)


@pytest.mark.parametrize("n_threads", [1, 2, 4])
def test_fill_masks_in_one_c_call_first_visits_included(big_vocab: llama_cffi.Model, n_threads: int) -> None:
    """Matchers of fresh grammars (their states met for the first time: the batched walk
    leaves them pending and they are finished one by one) and of warm ones, masks from
    one call on 1, 2 and 4 threads equal each matcher's own; a mask cache is filled."""
    from samplers.grammar import fill_masks

    rng = random.Random(n_threads)
    matchers = []
    for schema in _BIG_SCHEMAS.values():
        g = Grammar.from_json_schema(schema)
        fresh = g.compile(big_vocab, mask_cache_size=8, kernel="c")  # a new Grammar: compiled afresh
        for _ in range(6):
            m = fresh.matcher()
            for _ in range(rng.randint(0, 8)):  # the last state reached is new to the grammar
                allowed = np.flatnonzero(m.allowed_tokens() & ~fresh.vocab.eog)
                if not len(allowed) or not m.accept_token(int(rng.choice(allowed.tolist()))):
                    break
            matchers.append(m)
    got = fill_masks(matchers, n_threads=n_threads)
    for i, m in enumerate(matchers):
        assert np.array_equal(got[i], m.fill_mask()), i
    assert any(m.compiled._masks for m in matchers)


@pytest.mark.parametrize("n_threads", [1, 2])
def test_fill_masks_step_after_step(big_vocab: llama_cffi.Model, n_threads: int) -> None:
    """Matchers of grammars without a mask cache, each advanced by a token between calls:
    the states met before are walked in one C call from the jobs kept for them
    (``_ready``), the others first on their own; every call's rows equal each matcher's
    own mask, and each walk is counted once as a miss."""
    from samplers.grammar import fill_masks

    rng = random.Random(100 + n_threads)
    compiled = [Grammar.from_json_schema(s).compile(big_vocab, mask_cache_size=0) for s in _BIG_SCHEMAS.values()]
    matchers = [compiled[i % len(compiled)].matcher() for i in range(3 * len(compiled))]
    batched = 0
    for _ in range(12):
        before = sum(c.stats["mask_misses"] for c in compiled)
        got = fill_masks(matchers, n_threads=n_threads)
        live = {(id(m.compiled), m.state, m.partial) for m in matchers if not m.ended}
        assert sum(c.stats["mask_misses"] for c in compiled) - before == len(live)
        batched += sum(m.state in m.compiled._ready for m in matchers)
        for i, m in enumerate(matchers):
            assert np.array_equal(got[i], m.fill_mask()), i
            allowed = np.flatnonzero(m.allowed_tokens() & ~m.compiled.vocab.eog)
            if len(allowed):
                assert m.accept_token(int(rng.choice(allowed.tolist())))
    assert batched > len(matchers)  # (most steps' states were walked in the batch)


def test_fill_masks_finishes_a_batched_walk_that_waits(big_vocab: llama_cffi.Model) -> None:
    """A state taken for settled whose walk still waits for a transition (its plan made,
    nothing walked from it: the batch's walks leave what they cannot compute pending) is
    finished on its own, on the first call (no job kept for it yet) and on a later one
    (its job kept): its row is its own mask."""
    from samplers.grammar import fill_masks

    for kept in (False, True):
        g = Grammar.from_json_schema(_BIG_SCHEMAS["bounded string"])  # a new Grammar: compiled afresh
        c = g.compile(big_vocab, mask_cache_size=0)
        m = c.matcher()
        warm = c.matcher()
        c.fill_words(warm.state, warm.partial, np.empty(c.n_words, dtype=np.uint32))
        for t in big_vocab.tokenize('{"name": "ab', add_special=False).tolist():
            assert m.accept_token(t)
        assert m.state not in c._settled and m.state not in c._plans
        c._settled.add(m.state)  # (wrongly: its transitions are not computed)
        if kept:
            c._ready[m.state] = c._tg.batch_job(c._batch_plan(m.state))
        got = fill_masks([warm, m])
        want = Grammar.from_json_schema(_BIG_SCHEMAS["bounded string"]).compile(big_vocab).matcher()
        for t in big_vocab.tokenize('{"name": "ab', add_special=False).tolist():
            assert want.accept_token(t)
        assert np.array_equal(got[1], want.fill_mask()), kept
        assert np.array_equal(got[0], warm.fill_mask())


def test_fill_masks_over_two_vocabularies_of_one_size() -> None:
    """Matchers on two vocabularies of the same size (two tries): the first trie's walks
    are batched from their kept jobs, the other's walked in a call of their own; on the
    first call and on later ones (the jobs kept) every row is its matcher's own mask."""
    from samplers.grammar import fill_masks

    pieces = [b"a", b"ab", b"b", b"ba", b"abc", b"c", b"cc", b"{", b"}", b'"']
    other = [b"x", b"ax", b"bb", b"c", b"ca", b"a", b"b", b"{", b'"', b"}"]
    grammars = ['root ::= "{" [a-c]* "}"', 'root ::= [abc] [abc]+ "x"?', 'root ::= ("ab" | "ca")+']
    matchers = []
    rng = random.Random(5)
    for vocab in (VocabIndex(pieces), VocabIndex(other)):
        for text in grammars:
            c = Grammar.from_gbnf(text).compile(vocab, mask_cache_size=0, kernel="c")
            for _ in range(3):
                m = c.matcher()
                for _ in range(rng.randint(0, 3)):
                    allowed = np.flatnonzero(m.allowed_tokens())
                    if len(allowed):
                        m.accept_token(int(rng.choice(allowed.tolist())))
                matchers.append(m)
    for _ in range(3):
        got = fill_masks(matchers)
        for i, m in enumerate(matchers):
            assert np.array_equal(got[i], m.fill_mask()), i
    # (both tries' walks had their jobs kept: the last call took both ways)
    assert len({id(m.compiled._trie) for m in matchers if m.state in m.compiled._ready}) == 2


@settings(max_examples=budget(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_tokens_allowed_in_one_call_equal_token_allowed(data: st.DataObject) -> None:
    """The transition table's answers for many (state, token) pairs in one C call
    (``TrieGrammar.tokens_allowed``: undecided where a transition is not computed yet or
    the token is not whole characters) agree with the mask wherever they decide, and
    ``CompiledGrammar._tokens_allowed`` (the rest from the engine) equals
    ``token_allowed`` for every token: vocabularies with partial characters, states with
    one pending, grammars with token elements."""
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    pieces = {b"".join(rng.choice(_PIECE_PARTS) for _ in range(rng.randint(1, 8))) for _ in range(300)}
    pieces |= {p + rng.choice(_PARTIALS) for p in list(pieces)[:30]} | set(_PARTIALS) | set(_PIECE_PARTS)
    vocab = VocabIndex(sorted(pieces), eog=[0])
    tokens_grammar = 'root ::= ([a-z]+ | <[3]> | !<[5]>)+ "!"\n'
    text = data.draw(st.sampled_from([*_SELF_LOOP_GRAMMARS, tokens_grammar]), label="grammar")
    c = Grammar.from_gbnf(text).compile(vocab, mask_cache_size=0)
    m = c.matcher()
    n = c.n_vocab
    decided = 0
    for _ in range(10):
        words = m.fill_mask()
        toks = list(range(n))
        got = c._tokens_allowed([m.state] * n, [m.partial] * n, toks)
        assert got == [c.token_allowed(m.state, m.partial, t) for t in toks]
        assert got == [bool((int(words[t >> 5]) >> (t & 31)) & 1) for t in toks]
        if m.partial[1] == 0 and c._walks_c:
            with c._lock:
                c._set_tables()
                raw = c._tg.tokens_allowed(np.full(n, m.state, np.int32), np.arange(n, dtype=np.int32))
            sure = raw >= 0
            decided += int(sure.sum())
            assert np.array_equal(raw[sure] == 1, np.array(got)[sure])
        allowed = [t for t in toks if got[t] and t != 0]
        if not allowed or not m.accept_token(rng.choice(allowed)):
            break
    event(f"decided in C: {decided > 0}")


def test_allows_many_equals_allows(vocab_model: llama_cffi.Model) -> None:
    """``GrammarSampler.allows_many``: each answer is the sampler's own ``allows`` (a mask
    given or not, a lazy grammar waiting, two grammars in one call); a token found
    allowed is answered again from what was kept, until the matcher moves."""
    from samplers.grammar import GrammarSampler

    rng = random.Random(3)
    texts = ['root ::= [a-z ]+ "."', 'root ::= ("the" | "a" | " ")+ "!"']
    samplers = []
    for i in range(8):
        s = GrammarSampler(
            Grammar.from_gbnf(texts[i % 2]), vocab_model, lazy=i == 7, trigger_words=["zz"] if i == 7 else ()
        )
        for _ in range(i % 3):
            allowed = np.flatnonzero(s.matcher.allowed_tokens())
            if len(allowed) and not s.awaiting:
                s.accept(int(rng.choice(allowed.tolist())))
        if i % 4 == 1:
            s.use_mask(s.matcher.fill_mask())
        samplers.append(s)
    n = vocab_model.n_vocab
    for _ in range(20):
        tokens = [rng.randrange(n) for _ in samplers]
        want = [s.allows(t) for s, t in zip(samplers, tokens, strict=True)]
        assert GrammarSampler.allows_many(samplers, tokens) == want
    s = samplers[0]
    t = next(t for t in range(n) if s.matcher.allows(t))
    assert GrammarSampler.allows_many([s], [t]) == [True] and s._allowed is not None
    s.accept(t)  # moved: the kept answer is not read for the new state
    assert s.allows(t) == s.matcher.allows(t)
    from llama_cffi.errors import InvalidTokenError

    with pytest.raises(InvalidTokenError):
        GrammarSampler.allows_many([samplers[1]], [n])
    with pytest.raises(ValueError, match="2 samplers and 1 tokens"):
        GrammarSampler.allows_many(samplers[:2], [0])


def _accept_reference(m: Any, t: int) -> tuple[bool, int, tuple[int, int], bool]:
    """llama_grammar_accept_token as the matcher did it before its one-walk path: the check
    first, then the token's characters from the state without its empty stacks."""
    from samplers.grammar.engine import DEAD, NO_PARTIAL, decode_utf8

    c, eng = m.compiled, m.compiled.engine
    if m.ended or not c.token_allowed(m.state, m.partial, t):
        return False, m.state, m.partial, m.ended
    if c.vocab.eog[t]:
        return True, m.state, m.partial, True
    cps, end = decode_utf8(c.vocab.piece(t), m.partial)
    by_id = eng.step_token(m.state, t) if eng.has_token_elements else DEAD
    nxt = eng.union(by_id, eng.walk(eng.char_only(m.state), cps))
    if nxt == DEAD:
        return False, m.state, m.partial, m.ended
    return True, nxt, end if end[1] > 0 else NO_PARTIAL, False


@settings(max_examples=budget(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_accept_token_in_one_walk_is_the_reference(data: st.DataObject) -> None:
    """A token of whole characters accepted from a clean start takes one walk of the engine
    (the check and the advance at once): the answer, the state, the partial character and
    the end equal the check-then-advance reference for every token of a vocabulary with
    partial characters, invalid and empty pieces, at states along a random walk."""
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    pieces = {b"".join(rng.choice(_PIECE_PARTS) for _ in range(rng.randint(1, 6))) for _ in range(200)}
    pieces |= {p + rng.choice(_PARTIALS) for p in list(pieces)[:20]} | set(_PARTIALS) | set(_PIECE_PARTS)
    pieces |= {b"", b"\x00a", b"\xff", b"\x80b"}  # never, never, invalid, invalid
    vocab = VocabIndex(sorted(pieces), eog=[0])
    text = data.draw(st.sampled_from(_SELF_LOOP_GRAMMARS), label="grammar")
    c = Grammar.from_gbnf(text).compile(vocab, mask_cache_size=0)
    m = c.matcher()
    for _ in range(12):
        for t in range(c.n_vocab):
            want = _accept_reference(m, t)
            k = m.clone()
            got = k.accept_token(t)
            assert (got, k.state, k.partial, k.ended) == want, (t, vocab.piece(t))
        allowed = [t for t in range(c.n_vocab) if t != 0 and m.allows(t)]
        if not allowed:
            break
        assert m.accept_token(rng.choice(allowed))
