"""Many prompts at once (samplers.many): continuous batching over a BranchStore, prompts
packed into the moves' decodes, prefixes copied instead of decoded, results equal to
one-at-a-time generation, and the store left empty whatever happens."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import samplers as S
from llama_cffi import Model
from llama_cffi.errors import ParamError, ParamTypeError
from samplers.bias import LogitBias
from samplers.branch import BranchError, BranchStore, CapacityError, NewBranch
from samplers.many import SHARE_WAIT_MIN, ManyStats, Request, agenerate_many, generate_many, iter_many
from samplers.search import complete


@pytest.fixture(scope="module")
def exact_model(default_model_path: Path) -> Iterator[Model]:
    """The default model without weight repacking: one row of a decode equals the same
    row decoded alone when a decode holds at most 7 rows (docs/guide/branches.md)."""
    m = Model.load(default_model_path, use_extra_bufts=False)
    yield m
    m.close()


def no_eog(model: Model) -> LogitBias:
    """A bias that bans every end-of-generation token: lengths are then the budgets'."""
    eog = [t for t in range(model.n_vocab) if model.vocab.is_eog(t)]
    return LogitBias(model.n_vocab, {t: float("-inf") for t in eog})


def test_results_equal_one_at_a_time_generation(exact_model: Model) -> None:
    """Under the exactness conditions (no repacking, one thread, decodes of at most 7 rows:
    two sequences and prompts of at most 3 tokens) each result is complete()'s, token for
    token, with the same log-probability, for greedy and for seeded sampling."""
    vocab = exact_model.vocab
    prompts = [vocab.tokenize(t)[:3] for t in ("The capital", "Once upon", "def fib", "1, 2,", "Roses are")]
    seeded = S.SamplerChain([S.TopK(40), S.TopP(0.95), S.Temperature(0.8), S.Dist(0)])
    with exact_model.context(n_ctx=512, n_seq_max=3, kv_unified=True, n_threads=1) as ctx:
        store = BranchStore(ctx)
        for sampler, seed in ((None, None), (seeded, 11)):
            many = generate_many(store, prompts, max_tokens=12, sampler=sampler, seed=seed, n_parallel=2)
            assert len(store) == 0
            for p, r in zip(prompts, many, strict=True):
                one = complete(store, p, max_tokens=12, sampler=seeded.clone() if sampler else None, seed=seed)
                assert r.tokens == one.tokens
                assert r.text == one.text
                assert r.stop_reason == one.stop_reason
                assert r.prompt_tokens == one.prompt_tokens == len(p)
                assert r.logprob == pytest.approx(one.logprob, rel=1e-12, abs=1e-12)


def test_slots_are_refilled_at_once(default_model: Model) -> None:
    """Continuous batching: a sequence that ends gives its slot to the next prompt in the
    same step, so the run takes the steps the schedule says; every result comes once, the
    iterator in completion order, generate_many in input order."""
    ban = no_eog(default_model)
    reqs = [
        Request("Count: 1, 2,", max_tokens=1),
        Request("Once upon a time", max_tokens=8),
        Request("Hi", max_tokens=8),
    ]
    with default_model.context(n_ctx=1024, n_seq_max=4, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        run = iter_many(store, reqs, sampler=S.SamplerChain([ban, S.Greedy()]), n_parallel=2)
        order = [i for i, _ in run]
        # step 1: prompts 0 and 1; 2: both move; 3: 0 ends, 2 is admitted with 1's move;
        # 1 ends after its 8th token (step 9), 2 after its 8th (step 11)
        assert order == [0, 1, 2]
        assert run.stats.steps == 11
        assert run.stats.max_live == 2
        assert len(store) == 0
        stats = ManyStats()
        results = generate_many(store, reqs, sampler=S.SamplerChain([ban, S.Greedy()]), n_parallel=2, stats=stats)
        assert [len(r.tokens) for r in results] == [1, 8, 8]
        assert all(r.stop_reason == "max_tokens" for r in results)
        assert stats.generated_tokens == 17
        assert stats.prompt_tokens == stats.prefill_tokens + stats.shared_tokens
        assert stats.prompt_tokens == sum(r.prompt_tokens for r in results)


def test_a_shared_header_is_decoded_once(exact_model: Model) -> None:
    """Prompts that begin with the same header copy its KV cells (seq_cp) instead of
    decoding it: the prefill decodes the header once plus every suffix, whether the
    sharer is live (same wave) or a finished prompt kept for the prompts still waiting.
    The results are those of decoding every prompt in full: bit for bit under the
    exactness conditions (no repacking, one thread, micro-batches of at most 7 rows:
    ``n_ubatch=4`` here, so the header's cells are computed as in any other decode)."""
    vocab = exact_model.vocab
    header = list(vocab.tokenize("You are a terse assistant. Answer in one word. " * 2))
    words = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta")
    suffixes = [list(vocab.tokenize(f" {w.capitalize()} is the answer:", add_special=False)) for w in words]
    prompts = [header + s for s in suffixes]
    assert len(header) >= SHARE_WAIT_MIN and len({s[0] for s in suffixes}) == len(
        suffixes
    )  # they part right after the header
    ban = no_eog(exact_model)
    params = {"n_ctx": 1024, "n_batch": 8, "n_ubatch": 4, "n_seq_max": 7, "kv_unified": True, "n_threads": 1}
    with exact_model.context(**params) as ctx:
        store = BranchStore(ctx)
        chain = S.SamplerChain([ban, S.Greedy()])
        waves = ManyStats()  # three at a time: the second wave copies from kept prompts
        generate_many(store, prompts, max_tokens=4, sampler=chain, n_parallel=3, stats=waves)
        assert waves.prefill_tokens == len(header) + sum(len(s) for s in suffixes)
        assert waves.shared_tokens == len(header) * (len(prompts) - 1)
        # all at once, shared or not: every sequence's cells then lie in position order
        # (a prompt decoded into cells freed by earlier ones would sum its attention in
        # another order: rounding, docs/guide/branches.md)
        shared, plain = ManyStats(), ManyStats()
        a = generate_many(store, prompts, max_tokens=4, sampler=chain, stats=shared)
        b = generate_many(store, prompts, max_tokens=4, sampler=chain, share_prefixes=False, stats=plain)
        assert len(store) == 0
    assert shared.shared_tokens == len(header) * (len(prompts) - 1)
    assert plain.prefill_tokens == sum(len(p) for p in prompts) and plain.shared_tokens == 0
    assert [r.tokens for r in a] == [r.tokens for r in b]
    assert [r.logprob for r in a] == [r.logprob for r in b]


def test_one_sequence_id_and_kept_prompts_do_not_deadlock(default_model: Model) -> None:
    """With a single sequence id the kept prompt holds the only id: the next prompt frees
    it (decoding its prompt in full) rather than waiting for it forever."""
    header = "You are a terse assistant. Answer every question in one word. " * 2
    prompts = [header + q for q in ("Q: sky colour?", "Q: two plus two?", "Q: capital of France?")]
    with default_model.context(n_ctx=512, n_seq_max=1) as ctx:
        store = BranchStore(ctx)
        stats = ManyStats()
        rs = generate_many(store, prompts, max_tokens=3, stats=stats)
        assert len(rs) == 3 and len(store) == 0 and store.available == 1
        assert stats.prefill_tokens == stats.prompt_tokens  # nothing could be shared


def test_requests_carry_their_own_settings(default_model: Model) -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    reqs = [
        Request("Write a JSON object with a number:", json_schema=schema, max_tokens=40),
        Request(
            "List three colours:",
            grammar='root ::= ("red" | "green" | "blue") (", " ("red" | "green" | "blue"))*',
            max_tokens=12,
        ),
        Request("Say hello.", max_tokens=3),
        Request("Count: 1, 2, 3,", stop=[","], max_tokens=20),
    ]
    with default_model.context(n_ctx=1024, n_seq_max=4, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        rs = generate_many(store, reqs)
    obj = json.loads(rs[0].text)
    assert set(obj) == {"n"} and isinstance(obj["n"], int)
    *done, last = re.split(r", ?", rs[1].text)  # the budget may end inside a word
    assert all(w in ("red", "green", "blue") for w in done)
    assert any(c.startswith(last) for c in ("red", "green", "blue")), rs[1].text
    assert len(rs[2].tokens) <= 3
    assert rs[3].stop_reason == "stop" and "," not in rs[3].text


def test_bad_input_is_refused_before_anything_is_decoded(default_model: Model) -> None:
    with default_model.context(n_ctx=256, n_seq_max=2, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        with pytest.raises(ParamError, match=r"prompts\[1\]: the prompt has"):
            generate_many(store, ["ok", list(range(1, 300))])
        with pytest.raises(ParamError, match="n_parallel"):
            generate_many(store, ["ok"], n_parallel=3)
        with pytest.raises(ParamTypeError):
            generate_many(store, "one string is not a list of prompts")
        with pytest.raises(ParamTypeError):
            generate_many(ctx, ["ok"])  # type: ignore[arg-type]
        with pytest.raises(ParamError, match="max_tokens"):
            generate_many(store, [Request("ok", max_tokens=-1)])
        with pytest.raises(ParamError, match="not both"):
            generate_many(store, ["ok"], grammar='root ::= "a"', json_schema={"type": "string"})
        assert len(store) == 0 and store.available == 2


class FailsAfter(S.Sampler):
    """Greedy until its ``n``-th token, then a sampling error (as a dead-end grammar gives)."""

    def __init__(self, n: int) -> None:
        self.n, self.seen = n, 0

    def apply(self, cands: S.Candidates) -> None:
        if self.seen >= self.n:
            raise ParamError("no token is allowed here")
        S.Greedy().apply(cands)

    def accept(self, token: int) -> None:
        self.seen += 1

    def clone(self) -> FailsAfter:
        return FailsAfter(self.n)


def test_on_error_drops_the_failing_request_alone(default_model: Model) -> None:
    """With ``on_error`` a request whose sampling fails mid-run is reported and pruned, and
    the others finish with the tokens they would have had; without it the error ends the
    run (and prunes everything)."""
    ban = no_eog(default_model)
    prompts = ["Once upon a time", "The capital of France", "def fib(n):"]
    reqs = [Request(p) for p in prompts]
    reqs[1] = Request(prompts[1], sampler=S.SamplerChain([FailsAfter(2)]))
    with default_model.context(n_ctx=1024, n_seq_max=3, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        errors: list[tuple[int, str]] = []
        got = dict(iter_many(store, reqs, max_tokens=5, sampler=S.SamplerChain([ban, S.Greedy()]),
                             on_error=lambda i, e: errors.append((i, str(e)))))  # fmt: skip
        assert errors == [(1, "no token is allowed here")] and sorted(got) == [0, 2]
        alone = generate_many(store, [prompts[0], prompts[2]], max_tokens=5, sampler=S.SamplerChain([ban, S.Greedy()]))
        assert [got[0].tokens, got[2].tokens] == [r.tokens for r in alone]
        with pytest.raises(ParamError, match="no token is allowed"):
            generate_many(store, reqs, max_tokens=5)
        assert len(store) == 0 and store.available == 3
        with pytest.raises(ParamTypeError, match="on_error"):
            iter_many(store, prompts, on_error="print")  # type: ignore[arg-type]


def test_leaving_early_or_failing_prunes_everything(default_model: Model) -> None:
    with default_model.context(n_ctx=1024, n_seq_max=3, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        run = iter_many(store, ["a b c", "d e f", "g h i", "j k l"], max_tokens=5, n_parallel=2)
        next(run)
        assert len(store) > 0
        run.close()
        assert len(store) == 0 and store.available == 3
        assert ctx.memory.seq_pos_max(0) == -1 and ctx.memory.seq_pos_max(1) == -1

        calls = {"n": 0}

        class Boom(S.Greedy):
            def apply(self, cands):  # type: ignore[no-untyped-def]
                calls["n"] += 1
                if calls["n"] == 5:
                    raise RuntimeError("boom")
                return super().apply(cands)

            def clone(self):  # type: ignore[no-untyped-def]
                return self

        with pytest.raises(RuntimeError, match="boom"):
            generate_many(
                store, ["a b c", "d e f", "g h i"], max_tokens=8, sampler=S.SamplerChain([Boom()]), n_parallel=2
            )
        assert len(store) == 0 and store.available == 3


def test_async_forms_equal_the_sync_ones(default_model: Model) -> None:
    prompts = ["The capital of France is", "Once upon a time", "def fib(n):"]
    with default_model.context(n_ctx=1024, n_seq_max=3, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        sync = generate_many(store, prompts, max_tokens=6)
        asy = asyncio.run(agenerate_many(store, prompts, max_tokens=6))
        assert len(store) == 0
    assert [r.tokens for r in asy] == [r.tokens for r in sync]


def test_store_step_makes_new_branches_with_the_moves(default_model: Model) -> None:
    """BranchStore.step(moves, new=...): the prompts ride in the moves' decode and the new
    branches sample as created ones do; a refused prefix or too many branches change
    nothing."""
    vocab = default_model.vocab
    with default_model.context(n_ctx=1024, n_seq_max=4, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        a = store.create(vocab.tokenize("The capital of France is"))
        tok = a.sample()
        p = [int(t) for t in vocab.tokenize("The capital of Spain is")]
        (b,) = store.step({a: tok}, new=[NewBranch(p, prefix_from=a, prefix_len=4)])
        assert (
            b.tokens == p and b.position == len(p) and a.position == len(vocab.tokenize("The capital of France is")) + 1
        )
        fresh = store.create(p)
        assert b.sample() == fresh.sample()
        before = (store.available, a.position)
        with pytest.raises(BranchError, match="are not those"):
            store.step({}, new=[NewBranch(vocab.tokenize("Another prompt here"), prefix_from=a, prefix_len=3)])
        with pytest.raises(CapacityError):
            store.create_many([NewBranch(p), NewBranch(p)])
        assert (store.available, a.position) == before
        store.drain()


def test_score_many_equals_score_of_each_pair(exact_model: Model) -> None:
    """score_many decodes each distinct prompt once (its cells shared by its
    continuations' sequences) and packs the continuations; under the exactness conditions
    (no repacking, one thread, micro-batches of at most 7 rows) every value is score()'s of
    the pair alone, bit for bit, and so is the greedy flag; results come in input order."""
    from samplers.logprobs import score, score_many

    vocab = exact_model.vocab
    contexts = ["The capital of France is", "Two plus two equals", "The sky is"]
    endings = [" Paris.", " blue", " four", " green and wide", " a city"]
    pairs = [(c, e) for c in contexts for e in endings]
    pairs.insert(3, (contexts[0], endings[0]))  # a repeated pair
    params = {"n_ctx": 512, "n_batch": 16, "n_ubatch": 4, "n_seq_max": 4, "kv_unified": True, "n_threads": 1}
    with exact_model.context(**params) as ctx:
        store = BranchStore(ctx)
        keep = store.create(vocab.tokenize("A branch that stays"))
        before = keep.position
        many = score_many(store, pairs)  # 3 free ids: the five endings of a prompt go in two groups
        assert keep.alive and keep.position == before and store.available == 3
        ones = [score(ctx, p, c, seq_id=1) for p, c in pairs]
        ctx.memory.seq_rm(1)
        prompt = [int(t) for t in vocab.tokenize("A branch that stays")]
        g = score_many(store, [(prompt, [keep.sample()]), (prompt, [keep.sample() + 1])])
    for m, o in zip(many, ones, strict=True):
        assert m.tokens == o.tokens and m.prompt_tokens == o.prompt_tokens
        assert [t.logprob for t in m.logprobs] == [t.logprob for t in o.logprobs]
        assert m.greedy == o.greedy
    assert g[0].greedy and not g[1].greedy  # the branch's greedy token after the same prompt, and another


def test_score_many_refuses_bad_pairs(default_model: Model) -> None:
    from samplers.logprobs import score_many

    with default_model.context(n_ctx=64, n_seq_max=2, kv_unified=True) as ctx:
        store = BranchStore(ctx)
        with pytest.raises(ParamError, match="has no tokens"):
            score_many(store, [("a", "")])
        with pytest.raises(ParamTypeError):
            score_many(store, [("only one",)])  # type: ignore[list-item]
        with pytest.raises(ParamError, match="n_ctx_seq"):
            score_many(store, [("word " * (ctx.n_ctx_seq + 8), " end")])
        long = score_many(store, [("word " * 150, " end")])  # several decodes with no row to read
        assert len(long[0].tokens) == 1 and long[0].prompt_tokens > ctx.n_batch
        with pytest.raises(ParamTypeError):
            score_many(ctx, [("a", "b")])  # type: ignore[arg-type]
        assert score_many(store, []) == []
        assert store.available == 2
