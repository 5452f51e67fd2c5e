"""The grammar engine's C core (``llama_cffi/_native/grammar_engine.c``) against the
Python core it replaced, which stays as the reference (``Engine(..., core="python")``):
state for state on random grammars and random strings (the same stacks, completeness,
rows of transitions, groups), the same budget errors at the same steps, bad arguments to
the C functions refused, and the ambiguous grammars whose stacks multiply with every
character ended by the budget instead of running without bound."""

from __future__ import annotations

import itertools
import random
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from llama_cffi.gbnf import check_grammar, parse_gbnf, resolve_tokens
from samplers.grammar import Grammar, GrammarError
from samplers.grammar.engine import DEAD, Engine
from samplers.grammar.errors import GrammarBudgetError

from .conftest import run_isolated
from .test_gbnf import CHARS, Node, budget, grammar_text, grammars

#: stacks multiply with every "a": after n of them, every sequence of n pending letters
#: of b, c, d, e (4^n stacks); llama.cpp's matcher has no bound on this
AMBIGUOUS = 'root ::= x\nx ::= "a" x "b" | "a" x "c" | "a" x "d" | "a" x "e" | ""\n'
#: found by hypothesis in a long run of the kernel tests (stacks past the budget)
FOUND = 'root ::= "0" | [^a] [^a] (root* root "0")\n'


def engines(text: str, max_stacks: int = 16384, check: bool = True) -> tuple[Engine, Engine]:
    parsed = resolve_tokens(parse_gbnf(text), lambda _n: 2**31 - 1)
    if check:
        check_grammar(parsed, "root")
    return Engine(parsed, core="c", max_stacks=max_stacks), Engine(parsed, core="python", max_stacks=max_stacks)


def same_state(c: Engine, p: Engine, sc: int, sp: int, where: str) -> None:
    assert (sc == DEAD) == (sp == DEAD), where
    assert c.stacks(sc) == p.stacks(sp), where
    assert c.n_stacks(sc) == p.n_stacks(sp) == len(p.stacks(sp)), where
    assert c.is_complete(sc) == p.is_complete(sp), where
    assert c.char_tops(sc) == p.char_tops(sp) or set(c.char_tops(sc)) == set(p.char_tops(sp)), where


#: partial characters (value << 2 | bytes still needed): lead bytes of 2-, 3- and 4-byte
#: characters, sequences one byte short, overlong leads and values past U+10FFFF
PCHARS = sorted(
    {(v << 2) | r for r in (1, 2, 3) for v in range(0, 64) if (v << (6 * r)) < (1 << 22)}
    | {((0x3A0 >> 6) << 2) | 1, ((0x4E2D >> 6) << 2) | 1, ((0x4E2D >> 12) << 2) | 2, (0x06 << 2) | 2, (0x0 << 2) | 3}
)


def check_pchars_and_run(c: Engine, p: Engine, sc: int, sp: int, where: str) -> None:
    """The C core's per-state answers for partial characters equal the Python core's
    ``partial_ok``; its run is a valid one: every class of the run leads each state of the
    chain to the next (a chain padded with one state is a self-loop)."""
    got = c._c_pchar_ok(sc, np.array(PCHARS, dtype=np.int64)).tolist()
    want = [p.partial_ok(sp, (v >> 2, v & 3)) for v in PCHARS]
    assert got == want, where
    try:
        chain, words, closed = c._c_run(sc, np.arange(1, c.n_classes + 1, dtype=np.float64), 6, 256)
    except GrammarBudgetError:
        return
    classes = [k for k in range(c.n_classes) if (int(words[k // 64]) >> (k % 64)) & 1]
    assert chain[0] == sc and 1 <= len(chain) <= 7, where
    for a, b in zip(chain.tolist(), chain[1:].tolist(), strict=False):
        for k in classes:
            assert c.step(a, k) == b, f"{where}: run class {k} from {a}"
    if not classes:
        assert chain.tolist() == [sc] * 7, where
    # the closed run: every state its classes lead to (from sc, by any string of them)
    # stays alive on each of them (checked by a search over those states)
    shut = [k for k in range(c.n_classes) if (int(closed[k // 64]) >> (k % 64)) & 1]
    seen, todo = {sc}, [sc]
    while todo:
        a = todo.pop()
        for k in shut:
            b = c.step(a, k)
            assert b >= 0, f"{where}: closed class {k} kills state {a}"
            if b not in seen:
                seen.add(b)
                todo.append(b)
    assert len(seen) <= 8, where


def step_both(c: Engine, p: Engine, sc: int, sp: int, cp: int, where: str) -> tuple[int, int] | None:
    """One code point in both cores: their successors, or None when both ran past the budget."""
    errs = []
    out = []
    for eng, s in ((c, sc), (p, sp)):
        try:
            out.append(eng.step(s, eng.class_of(cp)))
            errs.append(False)
        except GrammarBudgetError:
            out.append(DEAD)
            errs.append(True)
    assert errs[0] == errs[1], f"{where}: budget error in one core only (c, python) = {errs}"
    if errs[0]:
        return None
    return out[0], out[1]


@settings(max_examples=budget(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grammars(dag=False), st.randoms(use_true_random=False), st.sampled_from([3, 16, 256]))
def test_cores_agree_state_for_state(
    rules: dict[str, tuple[tuple[Node, ...], ...]], rng: random.Random, max_stacks: int
) -> None:
    """Random grammars (recursion, classes, repetitions), random strings over their
    characters: after every code point the C core's state has the Python core's stacks,
    completeness and stack tops; whole rows (``fill_row``) and a class group's step
    (``group_step``) lead to the same stack sets; a budget error comes at the same step in
    both, with small budgets too."""
    text = grammar_text(rules)
    try:
        c, p = engines(text, max_stacks)
    except GrammarBudgetError:
        with pytest.raises(GrammarBudgetError):
            Engine(resolve_tokens(parse_gbnf(text), lambda _n: 0), core="python", max_stacks=max_stacks)
        event("start over budget")
        return
    except GrammarError:  # refused by check_grammar (left recursion, undefined rules, ...)
        event("refused")
        return
    assert c.core == "c" and p.core == "python"
    assert c.n_classes == p.n_classes
    same_state(c, p, c.start, p.start, "start")
    alphabet = sorted(set(CHARS) | {"z"})
    for trial in range(4):
        sc, sp = c.start, p.start
        for i in range(rng.randint(1, 12)):
            where = f"trial {trial} char {i}"
            if sc != DEAD and rng.random() < 0.3:
                rows = []
                for eng, s in ((c, sc), (p, sp)):
                    try:
                        eng.fill_row(s)
                        rows.append(eng.table()[s, : eng.n_classes].copy())
                    except GrammarBudgetError:
                        rows.append(None)
                assert (rows[0] is None) == (rows[1] is None), where
                if rows[0] is not None:
                    for k in range(c.n_classes):
                        same_state(c, p, int(rows[0][k]), int(rows[1][k]), f"{where} row class {k}")
            if sc != DEAD and rng.random() < 0.3:
                classes = np.array(sorted(rng.sample(range(c.n_classes), min(c.n_classes, rng.randint(1, 3)))))
                gc_ = gp = None
                errs = []
                for k, (eng, s) in enumerate(((c, sc), (p, sp))):
                    try:
                        r = eng.group_step(s, classes)
                        errs.append(False)
                    except GrammarBudgetError:
                        r = None
                        errs.append(True)
                    if k == 0:
                        gc_ = r
                    else:
                        gp = r
                assert errs[0] == errs[1], where
                assert (gc_ is None) == (gp is None), where
                if gc_ is not None and gp is not None:
                    same_state(c, p, gc_, gp, f"{where} group {classes.tolist()}")
            cp = ord(rng.choice(alphabet))
            got = step_both(c, p, sc, sp, cp, where)
            if got is None:
                event("budget")
                break
            sc, sp = got
            same_state(c, p, sc, sp, where)
            if sc == DEAD:
                break
        if sc != DEAD:
            check_pchars_and_run(c, p, sc, sp, f"trial {trial}")
        # unions and the character-only part (what a token's walk continues from)
        if sc != DEAD:
            same_state(c, p, c.union(sc, c.start), p.union(sp, p.start), f"trial {trial} union")
            same_state(c, p, c.char_only(sc), p.char_only(sp), f"trial {trial} char_only")


def test_cores_agree_on_json() -> None:
    """llama.cpp's json.gbnf, a document walked character by character: the same states."""
    from samplers.grammar.builtin import JSON as JSON_GBNF

    c, p = engines(JSON_GBNF)
    sc, sp = c.start, p.start
    doc = '{"a": [1, -2.5e3, true, null, "x\\u00e9y"], "b": {"c": "日本"}}'
    for i, ch in enumerate(doc):
        got = step_both(c, p, sc, sp, ord(ch), f"char {i}")
        assert got is not None
        sc, sp = got
        same_state(c, p, sc, sp, f"char {i} {ch!r}")
    assert c.is_complete(sc) and p.is_complete(sp)


def test_many_states_made_by_one_call_keep_their_completeness() -> None:
    """One C call (a row) makes more new states than the sync's buffer holds (64): their
    completeness comes back by the longer path, state for state as in the Python core."""
    alts = [f'"{chr(0x100 + i)}" "z"' + ("?" if i % 2 else "") for i in range(150)]
    c, p = engines("root ::= " + " | ".join(alts) + "\n")
    before = c.n_states
    c.fill_row(c.start)
    assert c.n_states - before > 64
    for i in range(150):
        got = step_both(c, p, c.start, p.start, 0x100 + i, f"alternative {i}")
        assert got is not None
        same_state(c, p, *got, f"alternative {i}")
        assert c.is_complete(got[0]) == bool(i % 2)


@pytest.mark.parametrize("core", ["c", "python"])
def test_ambiguous_grammar_ends_in_budget_error(core: str) -> None:
    """The stacks of AMBIGUOUS multiply by 4 with every "a": the step that would make a
    state past the budget raises GrammarBudgetError naming it; the engine is left as it was
    (the same step raises again, the states before it still answer), and a bigger budget
    goes further."""
    parsed = resolve_tokens(parse_gbnf(AMBIGUOUS), lambda _n: 0)
    eng = Engine(parsed, core=core, max_stacks=1000)
    cls = eng.class_of(ord("a"))
    s = eng.start
    sizes = []
    with pytest.raises(GrammarBudgetError, match="more than 1000 stacks"):
        for _ in range(50):
            s = eng.step(s, cls)
            sizes.append(eng.n_stacks(s))
    assert 2 <= len(sizes) < 50 and sizes[-1] <= 1000
    assert all(b >= 3 * a for a, b in itertools.pairwise(sizes)), sizes
    with pytest.raises(GrammarBudgetError):
        eng.step(s, cls)
    assert eng.n_stacks(s) == sizes[-1]
    assert eng.step(s, eng.class_of(ord("b"))) != DEAD
    big = Engine(parsed, core=core, max_stacks=4 * sizes[-1] + 1000)
    t = big.start
    for _ in range(len(sizes) + 1):
        t = big.step(t, cls)
    assert big.n_stacks(t) > 1000


def test_ambiguous_grammar_masks_end_in_budget_error() -> None:
    """A mask over a vocabulary with long runs of "a" (each token's walk multiplies the
    stacks by 4 per character): the default budget ends it in a GrammarBudgetError, in a
    child process that must finish (a hang fails the test), never a crash."""
    code = f"""
from samplers.grammar import Grammar
from samplers.grammar.errors import GrammarBudgetError
vocab = [b"a" * n for n in range(1, 40)] + [b"b", b"c", b"ab", b"</s>"]
g = Grammar.from_gbnf({AMBIGUOUS!r})
c = g.compile(vocab, mask_cache_size=0)
m = c.matcher()
try:
    m.allowed_tokens()
    print("computed")
except GrammarBudgetError as e:
    print("budget", str(e)[:60])
small = Grammar.from_gbnf({AMBIGUOUS!r}, max_stacks=64).compile(vocab, mask_cache_size=0).matcher()
try:
    small.allowed_tokens()
    print("computed")
except GrammarBudgetError:
    print("budget small")
"""
    out = run_isolated(code, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("budget"), out
    assert lines[1] == "budget small", out


def test_found_grammar_walk_ends_in_budget_error(tiny_model_path: Path) -> None:
    """FOUND (from a long hypothesis run of the kernel tests) doubles its stacks with
    about every token of the tiny model's vocabulary: a random walk (seed 37) reaches the
    budget at its tenth mask. In a child that must finish: the typed error, not a hang or
    all the memory (what the Python engine did before the budget)."""
    code = f"""
import random
import threading
import time
import numpy as np
import llama_cffi
from samplers.grammar import Grammar
from samplers.grammar.errors import GrammarBudgetError
m = llama_cffi.Model.load({str(tiny_model_path)!r}, vocab_only=True)
c = Grammar.from_gbnf({FOUND!r}).compile(m, mask_cache_size=0)
rng = random.Random(37)
mt = c.matcher()
sizes = []
try:
    for step in range(30):
        allowed = np.flatnonzero(mt.allowed_tokens() & ~c.vocab.eog)
        mt.accept_token(int(rng.choice(allowed.tolist())))
        sizes.append(c.engine.n_stacks(mt.state))
    print("no budget error", sizes)
except GrammarBudgetError as e:
    print("budget", step, max(sizes))
"""
    out = run_isolated(code, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    words = out.stdout.split()
    assert words[0] == "budget", out.stdout
    assert int(words[2]) > 1000, out.stdout  # the stacks grew that far before the budget


def test_c_core_refuses_bad_arguments() -> None:
    """Out-of-range states and classes given to the C functions raise, never read out of
    bounds."""
    from llama_cffi._binding import ffi, lib

    c, _ = engines('root ::= "a" [b-d]* "e"\n')
    h = c._c
    assert lib.llama_cffi_gengine_step(h, 10**6, 0) == -4
    assert lib.llama_cffi_gengine_step(h, c.start, 10**6) == -4
    assert lib.llama_cffi_gengine_step(h, -5, 0) == -4
    assert lib.llama_cffi_gengine_n_stacks(h, 10**6) == -4
    assert lib.llama_cffi_gengine_fill_row(h, 10**6) == -4
    assert lib.llama_cffi_gengine_complete(h, -1) == -4
    out = np.zeros(4, dtype=np.uint8)
    u8 = ffi.from_buffer("uint8_t[]", out)
    n = lib.llama_cffi_gengine_n_states(h)
    assert lib.llama_cffi_gengine_completes(h, -1, 1, u8) == -4
    assert lib.llama_cffi_gengine_completes(h, 0, n + 1, u8) == -4
    assert lib.llama_cffi_gengine_completes(h, 0, 1, ffi.NULL) == -4
    assert lib.llama_cffi_gengine_completes(h, 0, min(n, 4), u8) == 0
    table = np.zeros((n, c.n_classes), dtype=np.int32)
    tp = ffi.from_buffer("int32_t[]", table)
    assert lib.llama_cffi_gengine_sync_known(h, ffi.NULL, n, n, ffi.NULL, 0) == -4
    assert lib.llama_cffi_gengine_sync_known(h, tp, -1, n, ffi.NULL, 0) == -4
    one = np.zeros(1, dtype=np.uint8)
    u1 = ffi.from_buffer("uint8_t[]", one)
    assert lib.llama_cffi_gengine_sync_known(h, tp, n, n, ffi.NULL, 1) == -4  # room for answers, and no buffer
    assert lib.llama_cffi_gengine_sync_known(h, tp, n, n, u1, -1) == -4
    # states the caller does not know: their number back, nothing copied, and their
    # completeness when the buffer holds it (here: the last state's, then none)
    new_states = lib.LLAMA_CFFI_GENGINE_NEW_STATES
    one[0] = 7
    assert lib.llama_cffi_gengine_sync_known(h, tp, n, n - 1, u1, 1) == new_states - n
    assert one[0] == int(lib.llama_cffi_gengine_complete(h, n - 1) > 0)
    one[0] = 7
    if n >= 3:
        assert lib.llama_cffi_gengine_sync_known(h, tp, n, n - 2, u1, 1) == new_states - n
        assert one[0] == 7  # two new states, room for one: left alone
    assert lib.llama_cffi_gengine_sync_known(h, tp, n - 1, n, ffi.NULL, 0) == -5  # a table too short for it
    assert lib.llama_cffi_gengine_sync_known(h, tp, n, n, ffi.NULL, 0) >= 0
    assert out[: min(n, 4)].tolist() == [int(lib.llama_cffi_gengine_complete(h, s) > 0) for s in range(min(n, 4))]
    lens = np.array([1], dtype=np.int32)
    flat = np.array([10**6], dtype=np.int32)
    i32 = lambda a: ffi.cast("int32_t *", a.ctypes.data)  # noqa: E731
    assert lib.llama_cffi_gengine_intern(h, 1, i32(lens), i32(flat)) == -4
    lens[0] = -1
    assert lib.llama_cffi_gengine_intern(h, 1, i32(lens), i32(flat)) == -4
    st_ = np.array([5], dtype=np.int32)
    cl = np.array([0], dtype=np.int32)
    assert lib.llama_cffi_gengine_fill(h, 1, i32(st_), i32(cl)) == -4
    st_[0] = c.start
    cl[0] = c.n_classes
    assert lib.llama_cffi_gengine_fill(h, 1, i32(st_), i32(cl)) == -4
    assert lib.llama_cffi_gengine_group_step(h, c.start, i32(cl), 1) == -4
    # a table with fewer rows than states is refused
    table = np.full((1, c.n_classes), -2, dtype=np.int32)
    c.fill_row(c.start)
    if c.n_states > 1:
        assert lib.llama_cffi_gengine_sync_known(h, i32(table), 1, c.n_states, ffi.NULL, 0) == -5
    weights = np.ones(c.n_classes, dtype=np.float64)
    chain = np.zeros(4, dtype=np.int32)
    words = np.zeros(1, dtype=np.uint64)
    assert (
        lib.llama_cffi_gengine_run(
            h,
            c.start,
            ffi.cast("double *", weights.ctypes.data),
            3,
            8,
            i32(chain),
            ffi.cast("uint64_t *", words.ctypes.data),
            ffi.NULL,
            7,
        )
        == -4
    )
    # a closure search and its test: a bad state, word count, bound or missing buffer is refused
    wp = ffi.cast("double *", weights.ctypes.data)
    cw = np.zeros(c.n_classes // 64 + 1, dtype=np.uint64)
    cwp = ffi.cast("uint64_t *", cw.ctypes.data)
    sts = np.zeros(256, dtype=np.int32)
    n_st = ffi.new("int32_t *")
    W = len(cw)
    assert lib.llama_cffi_gengine_closed(h, 10**6, wp, 8, 16, cwp, W, i32(sts), n_st) == -4
    assert lib.llama_cffi_gengine_closed(h, c.start, wp, 8, 16, cwp, W + 1, i32(sts), n_st) == -4
    assert lib.llama_cffi_gengine_closed(h, c.start, wp, 8, 257, cwp, W, i32(sts), n_st) == -4
    assert lib.llama_cffi_gengine_closed(h, c.start, wp, 8, 16, cwp, W, ffi.NULL, n_st) == -4
    assert lib.llama_cffi_gengine_closed(h, c.start, wp, 8, 16, cwp, W, i32(sts), n_st) == 0
    assert 0 <= n_st[0] <= 16
    assert lib.llama_cffi_gengine_closure_pays(h, 10**6, cwp, W, wp, 1.0) == -4
    assert lib.llama_cffi_gengine_closure_pays(h, c.start, cwp, W + 1, wp, 1.0) == -4
    assert lib.llama_cffi_gengine_closure_pays(h, c.start, ffi.NULL, W, wp, 1.0) == -4
    assert lib.llama_cffi_gengine_closure_pays(h, c.start, cwp, W, wp, 1.0) in (0, 1)
    pch = np.zeros(1, dtype=np.int64)
    out = np.zeros(1, dtype=np.uint8)
    assert (
        lib.llama_cffi_gengine_pchar_ok(
            h, 10**6, ffi.cast("int64_t *", pch.ctypes.data), 1, ffi.cast("uint8_t *", out.ctypes.data)
        )
        == -4
    )
    # a partial character's mask: a bad state, class, word index or missing buffer is
    # refused before anything is written (out untouched)
    cls = np.zeros(2, dtype=np.int32)
    w = np.zeros(2, dtype=np.int32)
    bits = np.ones(2, dtype=np.uint32)
    pch2 = np.array([(0xC3 << 2) | 1], dtype=np.int64)
    mask = np.zeros(2, dtype=np.uint32)
    live = np.zeros(2, dtype=np.uint8)

    def pmask(state: int, classes: np.ndarray, n_ex: int, n_long: int, words: np.ndarray, n_words: int) -> int:
        rc: int = lib.llama_cffi_gengine_partial_mask(
            h,
            state,
            i32(classes),
            n_ex,
            n_long,
            i32(words),
            ffi.cast("uint32_t *", bits.ctypes.data),
            ffi.cast("int64_t *", pch2.ctypes.data),
            1,
            i32(words),
            ffi.cast("uint32_t *", bits.ctypes.data),
            ffi.cast("uint32_t *", mask.ctypes.data),
            n_words,
            ffi.cast("uint8_t *", live.ctypes.data),
        )
        return rc

    assert pmask(c.start, cls, 1, 1, w, 2) == 0  # (the good call)
    mask[:] = 0
    assert pmask(10**6, cls, 1, 1, w, 2) == -4  # no such state
    assert pmask(c.start, np.array([0, c.n_classes], dtype=np.int32), 1, 1, w, 2) == -4  # no such class
    assert pmask(c.start, cls, 2, 0, np.array([0, 2], dtype=np.int32), 2) == -4  # a word past the mask
    assert pmask(c.start, cls, -1, 0, w, 2) == -4
    assert pmask(c.start, cls, 1, 1, w, -1) == -4
    assert not mask.any()
    assert (
        lib.llama_cffi_gengine_partial_mask(
            h, c.start, ffi.NULL, 1, 0, ffi.NULL, ffi.NULL, ffi.NULL, 0, ffi.NULL, ffi.NULL, ffi.NULL, 2, ffi.NULL
        )
        == -4
    )
    types = np.array([3, 0], dtype=np.int32)  # CHAR then END, with a bad row
    values = np.array([97, 0], dtype=np.int32)
    rs = np.array([0], dtype=np.int32)
    bad_row = np.array([7, -1], dtype=np.int32)
    after = np.array([1, -1], dtype=np.int32)
    member = np.ones((1, 1), dtype=np.uint8)

    def p(a: np.ndarray, t: str = "int32_t *") -> object:
        return ffi.cast(t, a.ctypes.data)

    assert (
        lib.llama_cffi_gengine_new(
            2, p(types), p(values), 1, p(rs), p(bad_row), p(after), 1, 1, 1, p(member, "uint8_t *"), ffi.NULL, 8, 64
        )
        == ffi.NULL
    )
    ok_row = np.array([0, -1], dtype=np.int32)
    e = lib.llama_cffi_gengine_new(
        2, p(types), p(values), 1, p(rs), p(ok_row), p(after), 1, 1, 1, p(member, "uint8_t *"), ffi.NULL, 8, 64
    )
    assert e != ffi.NULL
    lib.llama_cffi_gengine_free(e)


def test_grammar_max_stacks_option() -> None:
    """``Grammar(..., max_stacks=)`` reaches the engine; ``accepts`` raises the budget error."""
    g = Grammar.from_gbnf(AMBIGUOUS, max_stacks=100)  # 5, 20, 80, 320, ... stacks after each "a"
    assert g._engine.max_stacks == 100
    assert g.accepts("aabc") and not g.accepts("aab")  # short inputs stay within the budget
    with pytest.raises(GrammarBudgetError):
        g.accepts("a" * 10 + "b" * 10)
    assert Grammar.from_gbnf(AMBIGUOUS).accepts("aaabcd")
    with pytest.raises(ValueError):
        Grammar.from_gbnf(AMBIGUOUS, max_stacks=0)


@pytest.mark.parametrize("core", ["c", "python"])
def test_unchecked_left_recursion_ends_in_budget_error(core: str) -> None:
    """A left-recursive grammar given to the engine without ``check_grammar`` (which
    refuses it) would expand its first stack forever: the advance's budget ends it."""
    parsed = resolve_tokens(parse_gbnf('root ::= root "a" | "b"\n'), lambda _n: 0)
    with pytest.raises(GrammarError, match=r"left recursion|left-recursive"):
        check_grammar(parsed, "root")
    with pytest.raises(GrammarBudgetError, match=r"advancing a stack|the start state"):
        Engine(parsed, core=core, max_stacks=1000)


def test_compiling_a_grammar_does_not_import_numpy_ma() -> None:
    """A process's first ``np.unique`` imports ``numpy.ma`` (~12 ms): the engine's set-up
    (character classes) avoids it, so a fresh process's first grammar does not pay it."""
    out = run_isolated(
        """
import sys
from samplers.grammar import Grammar
from samplers.grammar.builtin import JSON
assert "numpy.ma" not in sys.modules
g = Grammar.from_json_schema({"type": "object", "properties": {"a": {"type": "string", "maxLength": 5}}})
assert g.accepts('{"a": "xy"}') and Grammar.from_gbnf(JSON).accepts('{"b": [1, 2]}')
print("numpy.ma" in sys.modules)
"""
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_c_core_shared_by_threads() -> None:
    """Four threads walk documents through one C-core engine at once (its C calls release
    the GIL and grow its arrays), reading stacks and stack counts as they go: every thread
    ends where the Python core ends on the same document."""
    import threading

    from samplers.grammar.builtin import JSON_VALUE

    c, p = engines(JSON_VALUE)
    docs = [f'{{"k{i}": [{i}, "s\\u00e9{i}", {{"n": null, "t": true}}], "x": -{i}.5e{i % 9}}}' for i in range(40)]
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            out = []
            for d in docs[t::4]:
                s = c.start
                for ch in d:
                    s = c.step(s, c.class_of(ord(ch)))
                    c.n_stacks(s)
                    c.stacks(s)
                out.append(s)
            results[t] = out
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for t in range(4):
        for d, s in zip(docs[t::4], results[t], strict=True):
            assert c.stacks(s) == p.stacks(p.walk(p.start, [ord(ch) for ch in d])), d
            assert c.is_complete(s)


def test_c_core_cell_budget() -> None:
    """The C core's bound on the stacks it keeps in all (``max_cells``): a walk that needs
    more raises GrammarBudgetError, and the states made before it still answer."""
    from samplers.grammar.builtin import JSON

    parsed = resolve_tokens(parse_gbnf(JSON), lambda _n: 0)
    eng = Engine(parsed, core="c", max_cells=400)
    s = eng.start
    with pytest.raises(GrammarBudgetError, match="max_cells=400"):
        for ch in '{"a": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}':
            s = eng.step(s, eng.class_of(ord(ch)))
    assert eng.n_stacks(s) >= 1 and eng.stacks(s)
    with pytest.raises(ValueError):
        Engine(parsed, core="c", max_cells=1)


@settings(max_examples=budget(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grammars(dag=False))
def test_classes_partition_code_points_exactly(rules: dict[str, tuple[tuple[Node, ...], ...]]) -> None:
    """The character classes (``Engine._build_classes``: literal characters as single rows,
    sets, ranges and negations as multi rows) against the elements read one by one
    (``llama_grammar_match_char``'s walk, ``Engine._class_items``): two code points share a
    class iff every char element matches both or neither, classes are numbered in the
    order of their first code point, and each row's answer for a class (``_row_matches``,
    the C core's ``row_matches``) is its element's answer for the class's code points.
    Checked at every item bound and its neighbours, for the class build in C (the C core's)
    and in Python (the reference), which also agree array for array."""
    try:
        c, p = engines(grammar_text(rules))  # checked; the C core's classes from C, the Python core's from Python
    except GrammarError:
        return
    # the two builds: the same intervals and classes, and each element's row answers alike
    assert c.n_classes == p.n_classes and np.array_equal(c._edges, p._edges)
    assert np.array_equal(c._interval_class, p._interval_class)
    assert c._char_pos == p._char_pos and c._after == p._after and c.n_mrows == p.n_mrows
    assert np.array_equal(c._member, p._member) and np.array_equal(c._single_class, p._single_class)
    _check_partition(c)
    _check_partition(p)


def _check_partition(eng: Engine) -> None:
    from samplers.grammar.engine import _ANY, _CHAR, _CHAR_NOT, _MAX_CP

    positions = [p for p, t in enumerate(eng.types) if t in (_CHAR, _CHAR_NOT, _ANY) and eng._char_pos[p] >= 0]
    elements = [eng._class_items(p)[:2] for p in positions]
    points = {0, 1, 127, 128, _MAX_CP - 1}
    for _positive, items in elements:
        for lo, hi in items:
            points.update(v for v in (lo - 1, lo, lo + 1, hi - 1, hi, hi + 1) if 0 <= v < _MAX_CP)
    cps = np.array(sorted(points), dtype=np.int64)
    match = np.zeros((len(elements), len(cps)), dtype=bool)  # element x code point
    for i, (positive, items) in enumerate(elements):
        inside = np.zeros(len(cps), dtype=bool)
        for lo, hi in items:
            inside |= (cps >= lo) & (cps <= hi)
        match[i] = inside == positive
    cls = eng.classes_of(cps).tolist()
    by_class: dict[int, bytes] = {}
    first_cp: dict[int, int] = {}
    for j, c in enumerate(cls):
        col = match[:, j].tobytes()
        assert by_class.setdefault(c, col) == col, "a class holds code points that some element tells apart"
        first_cp.setdefault(c, j)
    assert len(set(by_class.values())) == len(by_class), "two classes that no element tells apart"
    firsts = list(first_cp)
    assert firsts == sorted(firsts) and firsts[0] == 0, "classes numbered by their first code point"
    rows = {eng._char_pos[p]: i for i, p in enumerate(positions)}
    for row, i in rows.items():
        for c in by_class:
            assert eng._row_matches(row, c) == bool(match[i, first_cp[c]])


def test_a_word_list_builds_in_linear_memory_and_walks_like_python() -> None:
    """A word list of thousands of distinct literal characters (CJK words) with a few sets:
    every literal character is its own class, yet the engine keeps no ``rows x classes``
    matrix. Before 2026-11-28 the class build made one (``rows x intervals`` int32 and
    int64 running sums): 4 s and 1.1 GB for 6,000 words; measured here with tracemalloc
    (numpy reports its allocations to it) on 4,000 distinct characters, whose matrix alone
    took over 128 MB. The C core walks the words as the Python reference does."""
    import tracemalloc

    rng = random.Random(7)
    chars = [chr(0x4E00 + 2 * i) for i in range(4000)]
    words = sorted({"".join(rng.choice(chars) for _ in range(rng.randint(2, 4))) for _ in range(3000)})
    words += [chars[i] + chars[i + 1] for i in range(0, len(chars) - 1, 2)]  # every character in some word
    text = "root ::= (" + " | ".join(f'"{w}"' for w in words) + ') ([0-9a-f]+ | [^\\x00-\\x7f] | "，" root)?\n'
    parsed = parse_gbnf(text)
    tracemalloc.start()
    try:
        c = Engine(parsed, core="c")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 48 << 20, f"the class build took {peak >> 20} MiB"
    lit = c.classes_of([ord(ch) for ch in chars]).tolist()
    assert len(set(lit)) == len(chars)  # each literal its own class
    assert c.n_classes < len(chars) + 16
    p = Engine(parsed, core="python")
    for w in [*words[:20], *words[-5:], words[3] + "，" + words[9] + "f0", words[0] + "é", words[1] + "x"]:
        sc, sp = c.start, p.start
        for ch in w:
            k = c.class_of(ord(ch))
            assert k == p.class_of(ord(ch))
            sc, sp = c.step(sc, k), p.step(sp, k)
            assert (sc == DEAD) == (sp == DEAD), w
            if sc == DEAD:
                break
            same_state(c, p, sc, sp, w)
        assert (sc != DEAD and c.is_complete(sc)) == (w[-1] != "x"), w


@pytest.mark.parametrize("mode", ["from 1 MB", "from the first growth", "forked"])
def test_transition_table_grows_with_its_rows(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """The C core's transition table (the Python side's copy of the engine's rows, which
    the C walks read) doubles as states are made; from 1 MB (or, here, from its first
    growth, its thread starting late) the next table is made ready by a thread of its own
    once the table has filled three quarters (``Engine._trans_prepare``), and the growth
    waits for it and copies the rows into it. ``forked``: the process forks after each thread starts, and the
    thread never runs (as in the child of a fork: it has no such thread); the growth
    must not wait for it, and writes the table itself. After thousands of states and
    several growths, every row known leads where the Python core's transitions lead,
    and the rows of no state yet read "not computed" (a prepared row left unwritten, or a
    row lost in a copy, fails)."""
    import samplers.grammar.engine as engine_mod

    if mode != "from 1 MB":
        monkeypatch.setattr(engine_mod, "_PREPARE_FROM", 0)
    grown: list[tuple[int, bool | None, int]] = []  # (rows, the next table made ready?, its length)
    grow, prepare = Engine._trans_grow, Engine._trans_prepare

    def spy(self: Engine, n: int) -> None:
        nxt, filler, rows = self._trans_next, self._trans_filler, len(self._trans)
        grow(self, n)
        # (after the growth: its thread done, as the growth waited for it)
        grown.append((rows, None if filler is None else bool(filler[1]), 0 if nxt is None else len(nxt)))

    def slow(f: Any, args: tuple[()]) -> None:  # a thread that starts late: the growth must wait
        threading.Thread(target=lambda: (time.sleep(0.05), f())).start()

    def forked_after(self: Engine, n: int) -> None:
        prepare(self, n)
        engine_mod._forked()  # what os.register_at_fork calls in a child

    monkeypatch.setattr(Engine, "_trans_grow", spy)
    if mode == "forked":
        monkeypatch.setattr(engine_mod, "_start_thread", lambda f, args: None)  # (no thread in the child)
        monkeypatch.setattr(Engine, "_trans_prepare", forked_after)
    if mode == "from the first growth":
        monkeypatch.setattr(engine_mod, "_start_thread", slow)
    rng = random.Random(11)
    letters = "abcdefghijklmnopqrstuvwxyz0123456789"
    words = sorted({"".join(rng.choice(letters) for _ in range(rng.randint(3, 7))) for _ in range(2500)})
    c, p = engines("root ::= (" + " | ".join(f'"{w}"' for w in words) + ') ("," root)?\n')
    pairs = {c.start: p.start}
    for w in words:
        sc, sp = c.start, p.start
        for ch in w + ",":
            got = step_both(c, p, sc, sp, ord(ch), w)
            assert got is not None
            sc, sp = got
            same_state(c, p, sc, sp, w)
            pairs[sc] = sp
    for sc in list(pairs)[::15]:
        c.fill_row(sc)  # every class of the row
    table, n = c.table(), c.n_states
    assert n > 4096 and len(grown) >= 6, (n, grown)
    prepared = [g for g in grown if g[2] == 2 * g[0]]
    assert prepared and all(ready is (mode != "forked") for _, ready, _ in prepared), grown  # made ready
    assert len(prepared) == (
        len(grown) if mode != "from 1 MB" else sum(2 * r * c.n_classes * 4 >= 1 << 20 for r, _, _ in grown)
    )
    assert (table[n:] == engine_mod._UNKNOWN).all()
    known = 0
    for sc, sp in pairs.items():
        for k in np.flatnonzero(table[sc] != engine_mod._UNKNOWN).tolist():
            nxt, want = int(table[sc, k]), p.step(sp, k)
            assert (nxt == DEAD) == (want == DEAD), (sc, k)
            if nxt != DEAD:
                assert c.stacks(nxt) == p.stacks(want), (sc, k)
            known += 1
    assert known > n


def test_a_forked_child_grows_the_table_its_parents_thread_was_making_ready() -> None:
    """A real fork (in a spawned interpreter: the test process has threads) right after
    the next transition table's thread starts: the child, which has no such thread, grows
    the table without waiting for it (no hang) and its rows are right (every word's walk
    as the Python core's, the rows of no state yet "not computed"); the parent too. Both
    grow the table at least once after the fork."""
    code = """
    import os, random, signal
    import samplers.grammar.engine as E
    from samplers.grammar.engine import DEAD, Engine
    from llama_cffi.gbnf import parse_gbnf

    E._PREPARE_FROM = 0  # a thread for every growth
    rng = random.Random(5)
    words = sorted({"".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 7)))
                    for _ in range(3000)})
    text = "root ::= (" + " | ".join(f'"{w}"' for w in words) + ') ("," root)?\\n'
    eng, ref = Engine(parse_gbnf(text), core="c"), Engine(parse_gbnf(text), core="python")
    prepare, grow = Engine._trans_prepare, Engine._trans_grow
    state = {"pid": None, "grown_after": 0}

    def forking(self, n):
        prepare(self, n)
        if self._trans_filler is not None and state["pid"] is None:
            state["pid"] = os.fork()
            if state["pid"] == 0:
                signal.alarm(60)  # (a child that waits for the thread it lacks: gone, not left hanging)

    def counted(self, n):
        grow(self, n)
        if state["pid"] is not None:
            state["grown_after"] += 1

    Engine._trans_prepare, Engine._trans_grow = forking, counted
    ok = True
    for w in words:
        a, b = eng.start, ref.start
        for ch in w + ",":
            a, b = eng.step(a, eng.class_of(ord(ch))), ref.step(b, ref.class_of(ord(ch)))
            ok = ok and (a == DEAD) == (b == DEAD) and (a == DEAD or eng.stacks(a) == ref.stacks(b))
    t = eng.table()
    ok = ok and bool((t[eng.n_states:] == E._UNKNOWN).all()) and state["grown_after"] > 0
    if state["pid"] == 0:
        os._exit(0 if ok else 3)
    _, status = os.waitpid(state["pid"], 0)
    print("parent", ok, "child", os.waitstatus_to_exitcode(status), "states", eng.n_states)
    """
    out = run_isolated(code, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "parent True child 0" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("core", ["c", "python"])
def test_transition_table_bound(core: str) -> None:
    """The transition table (states x classes) is bounded by ``16 x max_cells`` entries in
    both cores: a word list with many classes that would need more ends in
    GrammarBudgetError naming the table, not in gigabytes of rows."""
    chars = [chr(0x4E00 + i) for i in range(600)]
    text = "root ::= (" + " | ".join(f'"{a}{b}"' for a, b in itertools.pairwise(chars)) + ")+\n"
    eng = Engine(parse_gbnf(text), core=core, max_cells=2000)  # 32,000 entries: ~50 rows of 600 classes
    with pytest.raises(GrammarBudgetError, match="transition table"):
        s = eng.start
        for a in chars:
            s = eng.step(eng.start, eng.class_of(ord(a)))
            assert s != DEAD


def test_class_build_refuses_bad_arrays() -> None:
    """``llama_cffi_gclasses_build`` checks what it reads: a type out of range, a char
    element with no END after it, a set running off the end, no elements; and a budget of
    multi rows x intervals too small is -7 (GrammarBudgetError in the engine)."""
    from llama_cffi._binding import ffi, lib

    rc = ffi.new("int32_t *")

    def build(types: list[int], values: list[int], cells: int = 1 << 20) -> int:
        t = np.array(types, dtype=np.int32)
        v = np.array(values, dtype=np.int64)
        raw = lib.llama_cffi_gclasses_build(
            len(t),
            ffi.from_buffer("int32_t[]", t) if len(t) else ffi.NULL,
            ffi.from_buffer("int64_t[]", v) if len(v) else ffi.NULL,
            cells,
            rc,
        )
        if raw != ffi.NULL:
            n_classes = raw.n_classes
            lib.llama_cffi_gclasses_free(raw)
            return n_classes
        return int(rc[0])

    assert build([3, 0], [97, 0]) == 2  # "a": its own class, and every other code point
    assert build([12, 0], [97, 0]) == -4  # no such type
    assert build([3], [97]) == -4  # a char element with no END after it
    assert build([4, 6], [97, 98]) == -4  # [^ab] running off the end
    assert build([], []) == -4
    assert build([4, 6, 0, 4, 5, 0], [97, 98, 0, 99, 120, 0], cells=1) == -7  # two sets, a 1-cell budget
