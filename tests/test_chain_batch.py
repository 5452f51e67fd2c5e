"""samplers.chain_batch: one chain configuration run over many rows of candidates equals
each chain run on its own row (SamplerChain.choose), token and sampling surprisal, bit for
bit; and only the chains it can run are given a signature."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import samplers as S
from samplers import chain_batch
from samplers.candidates import Candidates


@st.composite
def configs(draw: st.DrawFn) -> list[tuple[str, tuple[float, ...]]]:
    """A chain of the kinds chain_batch runs: top-k first, a few middle samplers, a selector."""
    k = draw(st.integers(1, 60))
    middle = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("top_p"), st.tuples(st.sampled_from([0.0, 0.3, 0.9, 0.95, 1.0]), st.integers(0, 4))),
                st.tuples(st.just("min_p"), st.tuples(st.sampled_from([0.0, 0.01, 0.2, 0.9]), st.integers(0, 4))),
                st.tuples(st.just("temp"), st.tuples(st.sampled_from([-1.0, 0.0, 0.1, 0.7, 1.0, 1.5]))),
                st.tuples(st.just("top_k"), st.tuples(st.integers(0, 70))),
            ),
            max_size=4,
        )
    )
    last = draw(st.sampled_from(["dist", "greedy"]))
    return [("top_k", (k,)), *middle, (last, ())]


def build(config: list[tuple[str, tuple[float, ...]]], seed: int) -> S.SamplerChain:
    make = {
        "top_k": lambda a: S.TopK(int(a[0])),
        "top_p": lambda a: S.TopP(a[0], int(a[1])),
        "min_p": lambda a: S.MinP(a[0], int(a[1])),
        "temp": lambda a: S.Temperature(a[0]),
        "dist": lambda a: S.Dist(seed),
        "greedy": lambda a: S.Greedy(),
    }
    return S.SamplerChain([make[kind](args) for kind, args in config])


@given(
    configs(),
    st.integers(1, 7),
    st.integers(0, 2**32 - 1),
    st.sampled_from([3, 40, 100000]),
    st.booleans(),
    st.integers(0, 3),
)
def test_rows_equal_one_by_one(
    config: list[tuple[str, tuple[float, ...]]], g: int, seed: int, distinct: int, ninf: bool, draws: int
) -> None:
    k = int(config[0][1][0])
    rng = np.random.default_rng(seed)
    values = (rng.integers(0, distinct, size=(g, k)) / 9 - 3).astype(np.float32)
    if ninf and k > 1:
        values[:, rng.integers(1, k, size=max(k // 3, 1))] = -math.inf
    order = np.argsort(-values, axis=1, kind="stable")
    logits = np.take_along_axis(values, order, axis=1)
    ids = (order + 1000 * np.arange(g)[:, None]).astype(np.int32)
    one = [build(config, (seed + r) % 2**32) for r in range(g)]
    many = [c.clone() for c in one]
    for c, d in zip(one, many, strict=True):  # engines part-way through their sequences
        for _ in range(draws):
            c.samplers[-1].rng.canonical() if hasattr(c.samplers[-1], "rng") else None
            d.samplers[-1].rng.canonical() if hasattr(d.samplers[-1], "rng") else None
    sig = chain_batch.signature(many[0])
    assert sig is not None
    tokens, surprisal, pos = chain_batch.choose(sig, many, ids, logits.copy(), True)
    np.testing.assert_array_equal(ids[np.arange(g), pos], tokens)
    assert surprisal is not None
    cands = Candidates(k)
    for r in range(g):
        cands.assign(ids[r], logits[r], sorted=True)
        tok, samp = one[r].choose(cands, None, True)
        assert int(tokens[r]) == tok
        assert samp is not None
        assert surprisal[r] == samp or (math.isnan(samp) and math.isnan(surprisal[r]))
    for c, d in zip(one, many, strict=True):  # the engines drew alike
        if hasattr(c.samplers[-1], "rng"):
            assert c.samplers[-1].rng.canonical() == d.samplers[-1].rng.canonical()


@pytest.mark.parametrize(
    "chain, ok",
    [
        (S.SamplerChain([S.TopK(40), S.TopP(0.9), S.Temperature(0.8), S.Dist(1)]), True),
        (S.SamplerChain([S.TopK(4), S.Greedy()]), True),
        (S.SamplerChain([S.TopK(40)]), False),  # no selector
        (S.SamplerChain([S.TopK(0), S.Dist(1)]), False),  # top-k off: the whole row
        (S.SamplerChain([S.Temperature(0.8), S.TopK(40), S.Dist(1)]), False),
        (S.SamplerChain([S.TopK(40), S.Typical(0.9), S.Dist(1)]), False),
        (S.SamplerChain([S.TopK(40), S.Dist(1), S.Greedy()]), False),
        (S.SamplerChain([S.TopK(40), S.XTC(0.5, 0.1), S.Dist(1)]), False),
    ],
)
def test_signature(chain: S.SamplerChain, ok: bool) -> None:
    assert (chain_batch.signature(chain) is not None) is ok
    # the store's one call: the plain signature, not a grammar's (no grammar here)
    assert chain_batch.group_signature(chain) == (chain_batch.signature(chain), False)


def test_group_signature_of_grammar_chains() -> None:
    """``group_signature``: a chain that begins with an active grammar gets the samplers'
    signature after it, flagged; an ended grammar, a lone grammar or one before samplers
    the batch cannot run, none; anything but a SamplerChain, none."""
    from samplers.grammar import Grammar, GrammarSampler
    from samplers.grammar.vocab_index import VocabIndex

    vocab = VocabIndex(_PIECES)
    compiled = Grammar.from_gbnf('root ::= "a" "b"').compile(vocab)
    tail = [S.TopK(5), S.TopP(0.9), S.Dist(1)]
    chain = S.SamplerChain([GrammarSampler(compiled), *tail])
    sig = chain_batch.signature(S.SamplerChain(tail))
    assert sig is not None and chain_batch.group_signature(chain) == (sig, True)
    assert chain_batch.grammar_signature(chain) == sig and chain_batch.signature(chain) is None
    assert chain_batch.group_signature(S.SamplerChain([GrammarSampler(compiled), S.TopK(5)])) == (None, False)
    odd = S.SamplerChain([GrammarSampler(compiled), S.Temperature(0.5), S.TopK(5), S.Dist(1)])
    assert chain_batch.group_signature(odd) == (None, True)  # (a grammar chain the batch cannot run)
    ended = GrammarSampler(compiled)
    ended.accept(_PIECES.index(b"ab"))
    ended.matcher.ended = True
    assert chain_batch.group_signature(S.SamplerChain([ended, *tail])) == (None, False)
    assert chain_batch.group_signature(S.TopK(5)) == (None, False)


def test_a_chain_subclass_goes_alone() -> None:
    class Mine(S.SamplerChain):
        pass

    assert chain_batch.signature(Mine([S.TopK(40), S.Dist(1)])) is None


def test_equal_configurations_share_a_signature() -> None:
    a = S.SamplerChain([S.TopK(40), S.TopP(0.9), S.Dist(1)])
    b = S.SamplerChain([S.TopK(40), S.TopP(0.9), S.Dist(99)])
    c = S.SamplerChain([S.TopK(40), S.TopP(0.8), S.Dist(1)])
    assert chain_batch.signature(a) == chain_batch.signature(b) != chain_batch.signature(c)


_PIECES = [bytes([c]) for c in b"abcdefgh.,! "]
_PIECES += [b"ab", b"ba", b"abc", b"he", b"the", b" a", b"..", b"a.", b"!!", b"cab"]
_GRAMMARS = ['root ::= [a-c]+ "."', 'root ::= ("ab" | "c" | " ")+ "!"', 'root ::= [^.]{3,} "."', "root ::= [a-h ]+"]


@given(
    configs(),
    st.integers(1, 6),
    st.integers(0, 2**32 - 1),
    st.sampled_from([3, 40, 100000]),
    st.integers(0, 4),
    st.booleans(),
)
def test_constrained_rows_equal_one_by_one(
    config: list[tuple[str, tuple[float, ...]]], g: int, seed: int, distinct: int, steps: int, given_masks: bool
) -> None:
    """Chains that begin with a grammar (llama.cpp's fast path: the first choice from the
    row's best candidates, the rejected rows again from the best their masks allow) equal
    SamplerChain.choose on each whole row: token, sampling surprisal and the engines'
    draws; with or without masks given to the grammars beforehand."""
    from samplers.grammar import Grammar, GrammarSampler
    from samplers.grammar.vocab_index import VocabIndex

    vocab = VocabIndex(_PIECES)
    n = len(_PIECES)
    rng = np.random.default_rng(seed)
    k = min(int(config[0][1][0]), n)
    config = [("top_k", (k,)), *config[1:]]
    one, many, rows = [], [], []
    for r in range(g):
        gs = GrammarSampler(Grammar.from_gbnf(_GRAMMARS[r % len(_GRAMMARS)]).compile(vocab))
        for _ in range(int(rng.integers(0, steps + 1))):  # the grammar somewhere along its text
            allowed = np.flatnonzero(gs.matcher.allowed_tokens())
            if len(allowed) and not gs.matcher.is_complete():
                gs.accept(int(rng.choice(allowed)))
        chain = build(config, (seed + r) % 2**32)
        chain.samplers.insert(0, gs)
        one.append(chain)
        many.append(chain.clone())
        row = (rng.integers(0, distinct, size=n) / 9 - 3).astype(np.float32)
        rows.append(row)
    sig = chain_batch.grammar_signature(many[0])
    if any(c.samplers[0].matcher.ended or not c.samplers[0].matcher.allowed_tokens().any() for c in many):
        return  # (a grammar with nothing left to allow: both raise, tested elsewhere)
    assert sig is not None and sig == chain_batch.signature(S.SamplerChain(many[0].samplers[1:]))
    if given_masks:
        for c in many:
            c.samplers[0].use_mask(c.samplers[0].matcher.fill_mask())
    order = np.argsort(-np.stack(rows), axis=1, kind="stable")[:, :k]
    ids = order.astype(np.int32)
    logits = np.take_along_axis(np.stack(rows), order, axis=1)
    tokens, surprisal, raw = chain_batch.choose_constrained(sig, many, ids, logits, lambda r: rows[r], True)
    assert surprisal is not None
    cands = Candidates(n)
    for r in range(g):
        cands.reset(rows[r])
        tok, samp = one[r].choose(cands, rows[r], True)
        cands.release()
        assert int(tokens[r]) == tok
        assert raw[r] == rows[r][tok]
        assert samp is not None
        assert surprisal[r] == samp or (math.isnan(samp) and math.isnan(surprisal[r]))
    for c, d in zip(one, many, strict=True):  # the engines drew alike (twice where rejected)
        if hasattr(c.samplers[-1], "rng"):
            assert c.samplers[-1].rng.canonical() == d.samplers[-1].rng.canonical()


def test_constrained_refuses_chains_without_a_grammar_and_ended_grammars() -> None:
    from llama_cffi.sampling import SamplingError
    from samplers.grammar import Grammar, GrammarSampler
    from samplers.grammar.vocab_index import VocabIndex

    vocab = VocabIndex(_PIECES)
    n = len(_PIECES)
    ids = np.arange(2, dtype=np.int32)[None, :]
    plain = S.SamplerChain([S.TopK(2), S.Greedy()])
    sig = chain_batch.signature(plain)
    assert sig is not None and chain_batch.grammar_signature(plain) is None
    with pytest.raises(ValueError, match="GrammarSampler"):
        chain_batch.choose_constrained(sig, [plain], ids, np.zeros((1, 2), np.float32), lambda r: None, False)
    gs = GrammarSampler(Grammar.from_gbnf('root ::= "a"').compile(vocab))
    gs.accept(_PIECES.index(b"a"))  # complete: only end-of-generation left, and this vocabulary has none
    chain = S.SamplerChain([gs, S.TopK(2), S.Greedy()])
    assert chain_batch.grammar_signature(chain) == sig
    row = np.zeros(n, dtype=np.float32)
    with pytest.raises(SamplingError, match="no token is allowed"):
        chain_batch.choose_constrained(sig, [chain], ids, np.zeros((1, 2), np.float32), lambda r: row, False)


@pytest.mark.parametrize("bad", [-1, len(_PIECES), len(_PIECES) + 40])
def test_constrained_refuses_candidate_ids_out_of_the_vocabulary(bad: int) -> None:
    """A first choice outside the grammar's vocabulary raises InvalidTokenError, as one by
    one, whether or not every grammar holds its mask (the masks' bits are read only for
    ids in the vocabulary)."""
    from llama_cffi import InvalidTokenError
    from samplers.grammar import Grammar, GrammarSampler
    from samplers.grammar.vocab_index import VocabIndex

    vocab = VocabIndex(_PIECES)
    row = np.zeros(len(_PIECES), dtype=np.float32)
    for with_masks in (False, True):
        chains = []
        for _ in range(2):
            gs = GrammarSampler(Grammar.from_gbnf(_GRAMMARS[0]).compile(vocab))
            if with_masks:
                gs.use_mask(gs.matcher.fill_mask())
            chains.append(S.SamplerChain([gs, S.TopK(2), S.Greedy()]))
        sig = chain_batch.grammar_signature(chains[0])
        assert sig is not None
        ids = np.array([[bad, 0], [1, 0]], dtype=np.int32)
        logits = np.array([[2.0, 1.0], [2.0, 1.0]], dtype=np.float32)
        with pytest.raises(InvalidTokenError, match="out of range"):
            chain_batch.choose_constrained(sig, chains, ids, logits, lambda r: row, False)


@given(
    configs(),
    st.integers(1, 9),
    st.integers(0, 2**32 - 1),
    st.sampled_from([2, 40, 100000]),
    st.sampled_from([0.0, 0.5, 3.0]),
    st.booleans(),
)
def test_c_steps_equal_numpy_steps(
    config: list[tuple[str, tuple[float, ...]]], g: int, seed: int, distinct: int, spread: float, ninf: bool
) -> None:
    """``choose``'s top-p and dist steps in C (the default) equal its numpy steps (the
    reference, ``kernel="numpy"``) bit for bit: tokens, positions, surprisals, the rows
    left, and the engines' next draws; over ties, ``-inf`` candidates and wide and narrow
    spreads of logits."""
    k = int(config[0][1][0])
    rng = np.random.default_rng(seed)
    values = (rng.integers(0, distinct, size=(g, k)) * (spread / max(distinct, 1)) - 1).astype(np.float32)
    if ninf and k > 1:
        values[:, rng.integers(1, k, size=max(k // 3, 1))] = -math.inf
    logits = -np.sort(-values, axis=1)
    ids = np.tile(np.arange(k, dtype=np.int32), (g, 1))
    a = [build(config, (seed + r) % 2**32) for r in range(g)]
    b = [c.clone() for c in a]
    sig = chain_batch.signature(a[0])
    assert sig is not None
    la, lb = logits.copy(), logits.copy()
    ta, sa, pa = chain_batch.choose(sig, a, ids, la, True)
    tb, sb, pb = chain_batch.choose(sig, b, ids, lb, True, kernel="numpy")
    assert ta.tolist() == tb.tolist() and pa.tolist() == pb.tolist()
    assert sa is not None and sb is not None
    np.testing.assert_array_equal(sa, sb)
    np.testing.assert_array_equal(la, lb)  # (the candidates each step left, as -inf past them)
    for c, d in zip(a, b, strict=True):
        if hasattr(c.samplers[-1], "rng"):
            assert c.samplers[-1].rng.canonical() == d.samplers[-1].rng.canonical()


def test_choose_kernel_argument() -> None:
    chain = S.SamplerChain([S.TopK(2), S.TopP(0.5), S.Dist(1)])
    sig = chain_batch.signature(chain)
    assert sig is not None
    lg = np.array([[1.0, 0.5]], dtype=np.float32)
    ids = np.array([[3, 4]], dtype=np.int32)
    with pytest.raises(ValueError, match="kernel must be"):
        chain_batch.choose(sig, [chain], ids, lg.copy(), False, kernel="cuda")
    # rows the C steps cannot take (float64, not C-contiguous) go through numpy
    for odd in (lg.astype(np.float64), np.asfortranarray(np.repeat(lg, 2, axis=0))[:1]):
        assert not (odd.dtype == np.float32 and odd.flags.c_contiguous)
        got = chain_batch.choose(sig, [chain.clone()], ids, odd, False)
        want = chain_batch.choose(sig, [chain.clone()], ids, lg.copy(), False, kernel="numpy")
        assert got[0].tolist() == want[0].tolist() and got[2].tolist() == want[2].tolist()
