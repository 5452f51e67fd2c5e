"""The grammar matcher on random grammars: whole strings against the reference recognizer,
token masks against llama.cpp's grammar sampler."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import llama_cffi
from llama_cffi.errors import InvalidTokenError
from llama_cffi.sampling import LlamaSampler, SamplingError, TokenDataArray
from samplers import Candidates
from samplers.grammar import Grammar, GrammarBudgetError, GrammarError, GrammarSyntaxError
from samplers.grammar.gbnf import parse_gbnf

from .grammar_reference import generate, reference_accepts
from .test_gbnf import GRAMMAR_SAMPLES, Node, budget, grammar_dir, grammar_text, grammars, strings_for


@pytest.fixture(scope="module")
def vocab_model(tiny_model_path: Path) -> Iterator[llama_cffi.Model]:
    m = llama_cffi.Model.load(tiny_model_path, vocab_only=True)
    yield m
    m.close()


def usable(rules: dict[str, tuple[tuple[Node, ...], ...]]) -> Grammar | None:
    try:
        return Grammar.from_gbnf(grammar_text(rules))
    except GrammarError:
        event("refused (left recursion)")
        return None


@settings(max_examples=budget(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grammars(dag=False), st.randoms(use_true_random=False))
def test_accepts_equals_reference(rules: dict[str, tuple[tuple[Node, ...], ...]], rng: random.Random) -> None:
    """Generated strings, their one-character mutations and random strings: our matcher
    accepts exactly what the backtracking reference recognizer accepts."""
    g = usable(rules)
    if g is None:
        return
    for s in strings_for(rules, parse_gbnf(grammar_text(rules)), rng):
        try:
            got = g.accepts(s)
        except GrammarBudgetError:  # an ambiguous grammar past the stack budget: the typed error
            event("budget")
            continue
        assert got == reference_accepts(g.parsed, s), (grammar_text(rules), s)


def walk_and_compare(model: llama_cffi.Model, gbnf: str, draws: st.DataObject, steps: int = 8) -> None:
    n = model.vocab.n_vocab
    tda = TokenDataArray(n)
    nat = LlamaSampler.grammar(model, gbnf, guard=Grammar.from_gbnf(gbnf).matcher(model))
    ours = Grammar.from_gbnf(gbnf).matcher(model)
    eog = np.zeros(n, dtype=bool)
    eog[model.vocab.eog_tokens()] = True
    for step in range(steps):
        try:
            got = ours.allowed_tokens()
        except GrammarBudgetError:  # an ambiguous grammar past the stack budget: the typed error
            event("budget")
            return
        tda.fill_logits(np.zeros(n, np.float32))
        nat.apply(tda)
        want = tda.logits > -np.inf
        diff = np.flatnonzero(want != got)
        assert len(diff) == 0, f"step {step}: tokens {diff[:8]} differ (native allows {want[diff[:8]]})\n{gbnf}"
        allowed = np.flatnonzero(want & ~eog)
        if len(allowed) == 0:
            return
        tok = int(draws.draw(st.sampled_from(allowed.tolist()), label=f"token {step}"))
        try:
            took = ours.accept_token(tok)
        except GrammarBudgetError:  # (as above)
            event("budget")
            return
        if not took:
            # llama.cpp's quirk: its apply allowed the token because a token element
            # matched its id after some of its characters, but no parse consumes the
            # whole token, so its accept would throw; the guarded native refuses too
            assert ours.allows(tok) and ours.compiled.engine.has_token_elements
            with pytest.raises(SamplingError):
                nat.accept(tok)
            event("apply/accept mismatch (token element mid-token)")
            return
        nat.accept(tok)


@settings(
    max_examples=budget(60),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(grammars(dag=False, tokens=True), st.data())
def test_random_grammar_masks_equal_native(
    vocab_model: llama_cffi.Model, rules: dict[str, tuple[tuple[Node, ...], ...]], data: st.DataObject
) -> None:
    """Random grammars (tokens, classes, repetitions, recursion) on the tiny vocabulary
    (with byte-fallback tokens, so partial UTF-8 too): every mask along a random walk
    equals the native one."""
    text = grammar_text(rules)
    try:
        Grammar.from_gbnf(text).compile(vocab_model)
    except GrammarError:
        event("refused")
        with pytest.raises(llama_cffi.errors.ParamError):
            LlamaSampler.grammar(vocab_model, text)
        return
    walk_and_compare(vocab_model, text, data)


@pytest.mark.parametrize(
    "gbnf",
    [
        'root ::= [\\U00000000-\\UFFFFFFFF] "b" | "\\UFFFFFFFF"',
        "root ::= [^\\UFFFFFFFF\\U7FFFFFFF] [a-z]*",
        'root ::= ("\\U80000000" | [\\U000000e9-\\UFFFFFFF0]) "a"?',
    ],
)
def test_character_values_past_int32(gbnf: str, vocab_model: llama_cffi.Model) -> None:
    """Characters up to ``\\UFFFFFFFF`` (GBNF allows them; no code point reaches them) are
    compiled, not an OverflowError, and every mask along a walk equals llama.cpp's."""
    g = Grammar.from_gbnf(gbnf)
    n = vocab_model.vocab.n_vocab
    tda = TokenDataArray(n)
    nat = LlamaSampler.grammar(vocab_model, gbnf)
    ours = g.matcher(vocab_model)
    for _ in range(3):
        tda.fill_logits(np.zeros(n, np.float32))
        nat.apply(tda)
        want = tda.logits > -np.inf
        assert np.array_equal(want, ours.allowed_tokens()), gbnf
        eog = set(vocab_model.vocab.eog_tokens())
        allowed = [t for t in np.flatnonzero(want).tolist() if t not in eog]
        if not allowed:
            break
        assert ours.accept_token(allowed[0])
        nat.accept(allowed[0])


def test_apply_masks_candidates(vocab_model: llama_cffi.Model) -> None:
    """apply() sets exactly the disallowed candidates to -inf (any subset, any order)."""
    m = Grammar.from_gbnf('root ::= [a-c]+ "."').matcher(vocab_model)
    mask = m.allowed_tokens()
    ids = np.array([5, int(np.flatnonzero(mask)[0]), 3, int(np.flatnonzero(mask)[-1])], dtype=np.int32)
    c = Candidates.from_arrays(ids, np.zeros(len(ids), np.float32))
    m.apply(c)
    assert np.array_equal(c.read_logits() > -np.inf, mask[ids])
    with pytest.raises(InvalidTokenError):
        m.apply(Candidates.from_arrays(np.array([0, 10**6], np.int32), np.zeros(2, np.float32)))


def test_fill_mask_layout(vocab_model: llama_cffi.Model) -> None:
    """Bit t % 32 of word t // 32 is set iff token t is allowed."""
    m = Grammar.from_gbnf('root ::= "a" | [0-9]+').matcher(vocab_model)
    words = m.fill_mask()
    n = vocab_model.vocab.n_vocab
    bits = (words[np.arange(n) // 32] >> (np.arange(n) % 32).astype(np.uint32)) & 1
    assert np.array_equal(bits.astype(bool), m.allowed_tokens())
    out = np.full(len(words) + 2, 0xFFFFFFFF, dtype=np.uint32)
    assert m.fill_mask(out) is out and np.array_equal(out[: len(words)], words)
    with pytest.raises(ValueError):
        m.fill_mask(np.zeros(1, dtype=np.uint32))


def test_accept_bytes_and_partial_characters(vocab_model: llama_cffi.Model) -> None:
    """Raw bytes may stop inside a character; a prefix no class could complete is refused."""
    m = Grammar.from_gbnf('root ::= "é" [0-9]').matcher(vocab_model)
    e = "é".encode()
    assert m.accept_bytes(e[:1])
    assert m.partial != (0, 0)
    assert m.accept_bytes(e[1:]) and m.partial == (0, 0)
    assert not m.accept_bytes(b"x")
    assert m.accept_bytes("7") and m.can_end() and m.is_complete()
    m.rollback(3)
    assert not m.accept_bytes("日".encode()[:1])  # no class starts with U+65xx


def test_errors_are_typed() -> None:
    with pytest.raises(GrammarSyntaxError) as ei:
        Grammar.from_gbnf('root ::= "a\n')
    assert ei.value.line >= 1
    with pytest.raises(GrammarError, match="nothere"):
        Grammar.from_gbnf('root ::= "a"', root="nothere")
    with pytest.raises(GrammarError):
        Grammar.from_gbnf("root ::= root")
    g = Grammar.from_gbnf("root ::= <|im_end|>")
    with pytest.raises(GrammarError):
        g.compile([b"a", b"b"])  # named tokens need a tokenizer


@pytest.mark.parametrize("name", sorted(GRAMMAR_SAMPLES))
def test_grammar_files(name: str, vocab_model: llama_cffi.Model) -> None:
    """Each of llama.cpp's grammars/: our verdict on the hand-worked samples and on generated
    strings is the reference recognizer's; along each good sample's tokens (tiny vocabulary,
    byte fallback for non-ASCII) every mask equals the native one and the end is allowed."""
    text = (grammar_dir() / name).read_text(encoding="utf-8")
    g = Grammar.from_gbnf(text)
    good, bad = GRAMMAR_SAMPLES[name]
    for s in good:
        assert g.accepts(s), s
    for s in bad:
        assert not g.accepts(s), s
    rng = random.Random(name)
    for _ in range(5):
        s = generate(g.parsed, rng)
        assert g.accepts(s) and reference_accepts(g.parsed, s), s
    n = vocab_model.vocab.n_vocab
    tda = TokenDataArray(n)
    eos = vocab_model.vocab.eos
    assert eos is not None
    for s in good:
        tokens = [int(t) for t in vocab_model.vocab.tokenize(s, add_special=False)]
        nat = LlamaSampler.grammar(vocab_model, text)
        ours = g.matcher(vocab_model)
        for tok in tokens:
            tda.fill_logits(np.zeros(n, np.float32))
            nat.apply(tda)
            assert np.array_equal(tda.logits > -np.inf, ours.allowed_tokens()), (name, s, tok)
            assert ours.accept_token(tok), (name, s, tok)
            nat.accept(tok)
        assert ours.can_end() and ours.allows(eos), (name, s)


def test_threads_share_a_compiled_grammar(vocab_model: llama_cffi.Model) -> None:
    """Four threads walking matchers of one fresh compiled grammar (so states, transitions
    and masks are created concurrently) get the masks a single thread gets."""
    import threading

    text = (grammar_dir() / "json.gbnf").read_text()
    docs = ['{"a": [1, {"b": "x"}], "c": true}', '{"k": -2.5, "l": [[], {}]}', '{"z": null}', '{"é": "日本"}']
    seqs = [[int(t) for t in vocab_model.vocab.tokenize(d, add_special=False)] for d in docs]

    def masks(compiled: object, seq: list[int]) -> list[bytes]:
        m = compiled.matcher()  # type: ignore[attr-defined]
        out = []
        for t in seq:
            out.append(np.packbits(m.allowed_tokens()).tobytes())
            assert m.accept_token(t)
        return out

    want = [masks(Grammar.from_gbnf(text).compile(vocab_model), s) for s in seqs]
    shared = Grammar.from_gbnf(text).compile(vocab_model)
    got: list[list[bytes] | BaseException] = [[] for _ in seqs]

    def run(i: int) -> None:
        try:
            for _ in range(3):
                got[i] = masks(shared, seqs[i])
        except BaseException as e:  # surfaced below
            got[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(seqs))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert got == want


def test_compile_is_cached_per_vocabulary(vocab_model: llama_cffi.Model) -> None:
    """Once per llama_cffi vocabulary (model or vocab alike); a list of pieces is not cached
    (it has no identity to key on), and the cache does not keep the vocabulary alive."""
    import gc
    import weakref

    g = Grammar.from_gbnf('root ::= "a"+')
    c = g.compile(vocab_model)
    assert g.compile(vocab_model.vocab) is c
    assert g.compile([b"a", b"aa"]) is not g.compile([b"a", b"aa"])
    assert len(g._compiled) == 1
    m2 = llama_cffi.Model.load(vocab_model.path, vocab_only=True)
    g.compile(m2)
    ref = weakref.ref(m2.vocab)
    m2.close()
    del m2
    gc.collect()
    assert ref() is None and len(g._compiled) == 1


_PIECE_PARTS = [
    b"a",
    b"b",
    b"z",
    b"Q",
    b'"',
    b"\\",
    b"n",
    b"u",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b" ",
    b"0",
    b"1",
    b"9",
    b"-",
    b".",
    b"e",
    b"t",
    b"r",
    b"\n",
    "é".encode(),
    "日".encode(),
    "Ж".encode(),
    "\u00a0".encode(),  # special code points (llama_cffi._trie_walk.special_cps): a no-break space,
    "\u3000".encode(),  # an ideographic space
]
_PARTIALS = [b"\xc3", b"\xe6\x97", b"\xd0"]  # lead bytes: a token that ends inside a character
_SELF_LOOP_GRAMMARS = [
    'root ::= "{" ws "\\"k\\":" ws string ws "}"\n'
    'string ::= "\\"" ([^"\\\\\\x7F\\x00-\\x1F] | "\\\\" ["\\\\nt])* "\\""\n'
    "ws ::= [ \\n]*\n",
    'root ::= ([a-z]+ " "?)+ ("é" | [\\u0400-\\u04FF]*)\n',
    'root ::= "[" ([0-9]+ ("," [0-9]+)*)? "]" | "-"? [0-9]+ ("." [0-9]+)?\n',
    'root ::= [A-Z] [a-z]* ("\\n" [^\\n]*)*\n',
    # words apart (\S+ \s+): runs of every code point >= 128 but the special ones, then
    # a class of code points >= 128 that holds special ones and others
    'root ::= [^ \\n\\u00a0\\u3000]+ ([ \\u00a0\\u3000]+ [^ \\n\\u00a0\\u3000]+)* ([^\\u3000]* "\\u3000")?\n',
]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_self_loop_walks_equal_the_plain_walk(data: st.DataObject) -> None:
    """The mask walks that skip work (a cached mask for tokens made of the state's
    self-loop classes, an undecided-token walk, subtree absorption in the trie) give the
    plain level-by-level walk's mask in every state a random token walk reaches, on a
    vocabulary of random pieces including tokens that end inside a character."""
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    pieces = {b"".join(rng.choice(_PIECE_PARTS) for _ in range(rng.randint(1, 6))) for _ in range(400)}
    pieces |= {p + rng.choice(_PARTIALS) for p in list(pieces)[:40]} | set(_PARTIALS) | set(_PIECE_PARTS)
    vocab = sorted(pieces)
    text = data.draw(st.sampled_from(_SELF_LOOP_GRAMMARS), label="grammar")
    grammar = Grammar.from_gbnf(text)
    compiled = grammar.compile(vocab, mask_cache_size=0, kernel="numpy")
    plain = grammar.compile(vocab, mask_cache_size=0, kernel="numpy")  # a list of pieces: compiled afresh, same engine
    assert plain is not compiled and plain.engine is compiled.engine
    plain._absorb = False
    m = compiled.matcher()
    for step in range(10):
        got = compiled._compute_mask(m.state, m.partial)
        want = plain._compute_mask(m.state, m.partial)
        diff = np.flatnonzero(got != want)
        assert len(diff) == 0, f"step {step}: {[(vocab[t], bool(want[t])) for t in diff[:6]]}"
        allowed = np.flatnonzero(got)
        if len(allowed) == 0:
            break
        assert m.accept_token(int(rng.choice(allowed.tolist())))


_PARTIAL_GRAMMAR = 'root ::= [^a-c\\u00e0-\\u00ff] | . | [\\u4e00-\\u9fff]+ "\\u0416"\n'


@pytest.mark.parametrize("text", [*_SELF_LOOP_GRAMMARS, _PARTIAL_GRAMMAR])
def test_partial_checks_per_position_equal_per_stack(text: str) -> None:
    """The vectorised check of partial characters against one stack top
    (``Engine.partial_ok_at``, used for every partial character of a vocabulary at once)
    answers as ``llama_grammar_match_partial_char`` over that stack (``Engine.partial_ok``),
    for every character position of the grammar and every kind of partial sequence:
    lead bytes of 2-, 3- and 4-byte characters, sequences one byte short, overlong leads
    (value 0, or 1 needing one byte) and values past U+10FFFF."""
    from samplers.grammar.engine import _ANY, _CHAR, _CHAR_NOT  # the positions of character elements

    eng = Grammar.from_gbnf(text)._engine
    partials = [(v, r) for r in (1, 2, 3) for v in range(0, 64) if (v << (6 * r)) < (1 << 22)]
    partials += [(0x3A0 >> 6, 1), (0x4E2D >> 6, 1), (0x4E2D >> 12, 2), (0xE6 & 0x0F, 2), (0xF0 & 0x07, 3)]
    values = np.array([v for v, _ in partials], dtype=np.int64)
    remains = np.array([r for _, r in partials], dtype=np.int64)
    positions = [p for p, t in enumerate(eng.types) if t in (_CHAR, _CHAR_NOT, _ANY) and eng._char_pos[p] >= 0]
    assert positions
    for pos in positions:
        state = eng.intern([(pos,)])
        got = eng.partial_ok_at(pos, values, remains)
        want = [eng.partial_ok(state, p) for p in partials]
        assert got.tolist() == want, pos
