"""Run every public operation on one kind of tiny model; print one JSON line per cell.

``python tests/model_kinds_child.py KIND MODEL_PATH LORA_PATH`` (run by
``tests/test_model_kinds.py`` in a spawned child per kind, so a crash ends one kind's
run and is reported as that cell's crash). Each operation gets a fresh context, runs,
is checked for a *correct* result (compared with a fresh computation where one exists),
and the context is then used again (cleared and decoded) to prove it survived. Before an
operation starts, ``START <name>`` is printed and flushed, so the parent can name the
cell a crash happened in.

Outcomes: ``ok``; ``declined`` (the operation returned False, which its API allows);
``refused: <Error>`` (a typed llama_cffi error, with its message); and failures the test
rejects: ``wrong: ...`` (no error, but the result is not the right one), ``bug: <Error>``
(an exception that is not a LlamaError), ``unusable: ...`` (the context did not survive).
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

import llama_cffi
from llama_cffi import Batch, LlamaError
from samplers.branch import BranchStore
from samplers.search import beam_search, best_of_n, generate

#: Results from differently shaped computations (a fresh decode of a prefix against a
#: rewound, copied or restored sequence) differ by float32 rounding of differently
#: batched sums; the sliding-window model's state round trip by up to 7.6e-4 (llama.cpp
#: reuses the cell of a position that left the window). Quantized models differ more.
TOL = {"llama-q8_0": 3e-3, "llama-q4_0": 3e-3}
DEFAULT_TOL = 1e-3

#: Context parameters per kind (several sequences in one unified cache for branches;
#: the sliding-window kinds get a cache larger than their 256-cell window cache).
BASE = {"n_ctx": 512, "n_batch": 64, "n_ubatch": 64, "n_seq_max": 4, "kv_unified": True}
EXTRA: dict[str, dict[str, Any]] = {
    "swa": {"swa_full": False},
    "swa-full": {"swa_full": True},
    "bert": {"embeddings": True},
    "bert-rank": {"embeddings": True},
    "hybrid (n_rs_seq=4)": {"n_rs_seq": 4},
}


class Wrong(Exception):
    """The operation gave no error but a result that is not the right one."""


class Env:
    def __init__(self, kind: str, path: str, lora: str) -> None:
        self.kind = kind
        self.model = llama_cffi.Model.load(path)
        self.lora = lora
        self.tol = TOL.get(kind, DEFAULT_TOL)
        self.prompt = [int(t) for t in self.model.tokenize("hello world the cat")]
        self.enc_dec = self.model.has_encoder and self.model.has_decoder
        self.encoder_only = kind.startswith("bert")
        self.start = self.model.decoder_start_token
        # an encoder-decoder's decoder holds its start token at position 0 before the prompt
        self.off = 1 if self.enc_dec else 0

    def ctx(self, **kw: Any) -> llama_cffi.Context:
        return self.model.context(**{**BASE, **EXTRA.get(self.kind, {}), **kw})

    def prep(self, ctx: llama_cffi.Context, seq: int = 0) -> np.ndarray:
        """The kind's normal first step into ``seq``: the prompt decoded (an encoder-decoder:
        encoded, then the start token and the prompt decoded); returns the row the next
        token comes from (for an encoder-only model: the pooled embedding)."""
        if self.enc_dec:
            ctx.start_decoder(self.prompt, seq_id=seq)
            return np.array(ctx.decode(self.prompt, seq_id=seq))
        if self.encoder_only:
            ctx.decode(self.prompt, seq_id=seq, logits="none")
            return ctx.embeddings_seq(seq)
        return np.array(ctx.decode(self.prompt, seq_id=seq))

    def next_out(self, ctx: llama_cffi.Context, seq: int = 0) -> np.ndarray:
        """The next output of ``seq``: logits after one more token (an encoder-only model:
        the pooled embedding of the prompt decoded again)."""
        if self.encoder_only:
            ctx.decode(self.prompt, seq_id=seq, logits="none")
            return ctx.embeddings_seq(seq)
        return np.array(ctx.decode_single(self.prompt[1], seq_id=seq))

    def fresh(self, tokens: list[int]) -> np.ndarray:
        """Logits after ``tokens`` (of the prompt; after the encoded prompt and the start token
        for an encoder-decoder), computed in a new context in one decode."""
        ctx = self.ctx()
        try:
            if self.enc_dec:
                ctx.encode(self.prompt, seq_id=-1)
                return np.array(ctx.decode([self.start, *tokens]))
            return np.array(ctx.decode(tokens))
        finally:
            ctx.close()

    def close_enough(self, a: Any, b: Any, what: str) -> None:
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a.shape != b.shape or not np.isfinite(a).all():
            raise Wrong(f"{what}: shape {a.shape} vs {b.shape} or not finite")
        d = float(np.abs(a - b).max())
        if d > self.tol:
            raise Wrong(f"{what}: differs by {d:.3g} (tolerance {self.tol})")


def finite(x: Any, what: str) -> None:
    if not np.isfinite(np.asarray(x)).all():
        raise Wrong(f"{what} is not finite")


# ------------------------------------------------------------------------------- operations
def op_decode(e: Env, ctx: Any) -> None:
    finite(e.prep(ctx), "the first output")


def op_decode_single(e: Env, ctx: Any) -> None:
    e.prep(ctx)
    finite(np.array(ctx.decode_single(e.prompt[0])), "decode_single's logits")


def op_decode_batch(e: Env, ctx: Any) -> None:
    toks = [e.start] if e.enc_dec else e.prompt
    if e.enc_dec:
        ctx.encode(e.prompt, seq_id=-1)
    b = Batch(2 * len(toks), 2)
    for s in (0, 1):
        for i, t in enumerate(toks):
            b.add(t, i, (s,), output=i == len(toks) - 1)
    ctx.decode_batch(b)
    if e.encoder_only:
        e.close_enough(ctx.embeddings_seq(0), ctx.embeddings_seq(1), "the two sequences' embeddings")
    else:
        last = len(toks) - 1  # batch index of each sequence's last token
        e.close_enough(ctx.logits(last), ctx.logits(2 * last + 1), "the two sequences' logits")


def op_eval(e: Env, ctx: Any) -> None:
    e.prep(ctx)
    got = np.array(ctx.eval(e.prompt[3:5], 3 + e.off))
    e.close_enough(got, e.fresh(e.prompt[:5]), "eval after rewinding")


def op_encode(e: Env, ctx: Any) -> None:
    ctx.encode(e.prompt)


def op_logits(e: Env, ctx: Any) -> None:
    e.prep(ctx)
    finite(np.asarray(ctx.logits()), "logits()")


def op_logits_all(e: Env, ctx: Any) -> None:
    if e.enc_dec:
        ctx.encode(e.prompt, seq_id=-1)
    rows = ctx.decode([e.start, *e.prompt[:2]] if e.enc_dec else e.prompt, logits="all")
    finite(np.asarray(rows), "every row of logits")


def op_embeddings(e: Env, ctx: Any) -> None:
    c = e.ctx(embeddings=True, pooling_type="none")
    try:
        e.prep(c) if not e.encoder_only else c.decode(e.prompt, logits="last")
        finite(c.embeddings(-1), "the last token's embedding")
    finally:
        c.close()


def op_embeddings_seq(e: Env, ctx: Any) -> None:
    c = e.ctx(embeddings=True, pooling_type="mean")
    try:
        if e.enc_dec:
            c.encode(e.prompt, seq_id=-1)
            c.decode([e.start])
        else:
            c.decode(e.prompt, logits="none")
        finite(c.embeddings_seq(0), "the pooled embedding")
    finally:
        c.close()


def op_embed(e: Env, ctx: Any) -> None:
    c = e.ctx(embeddings=True, **({} if e.encoder_only else {"pooling_type": "mean"}))
    try:
        texts = ["hello world", "the cat", "a dog", "hello", "the end of it"]
        many = c.embed(texts)
        one = np.stack([c.embed([t])[0] for t in texts])
        e.close_enough(many, one, "embeddings of texts packed together vs one at a time")
    finally:
        c.close()


def op_rerank(e: Env, ctx: Any) -> None:
    scores = ctx.rerank("what is a cat", ["the cat is an animal", "hello world"])
    finite(scores, "rerank scores")


def op_clear(e: Env, ctx: Any) -> None:
    e.prep(ctx)
    ctx.memory.clear()
    finite(e.prep(ctx), "the output after clearing")


def op_seq_rm_tail(e: Env, ctx: Any) -> None:
    e.prep(ctx)
    n = len(e.prompt)
    if not ctx.memory.seq_rm(0, n - 2 + e.off, -1):
        raise Declined
    got = np.array(ctx.decode_single(e.prompt[n - 2], seq_id=0))
    e.close_enough(got, e.fresh(e.prompt[: n - 1]), "decoding after removing a tail")


def op_seq_rm_middle(e: Env, ctx: Any) -> None:
    e.prep(ctx)
    if not ctx.memory.seq_rm(0, 2, 4):
        raise Declined
    if ctx.memory.seq_pos_max(0) < 4:
        raise Wrong("removing [2, 4) removed later positions too")
    finite(np.array(ctx.decode_single(e.prompt[0])), "decoding after removing [2, 4)")


def op_seq_cp(e: Env, ctx: Any) -> None:
    e.prep(ctx)
    ctx.memory.seq_cp(0, 1)
    if ctx.memory.seq_pos_max(1) != ctx.memory.seq_pos_max(0):
        raise Wrong("the copy does not hold the same positions")
    e.close_enough(e.next_out(ctx, 1), e.next_out(ctx, 0), "the copy's next output")


def op_seq_cp_part(e: Env, ctx: Any) -> None:
    e.prep(ctx)
    ctx.memory.seq_cp(0, 1, 0, 3 + e.off)
    if ctx.memory.seq_pos_max(1) != 2 + e.off:
        raise Wrong(f"a copy of [0, {3 + e.off}) holds positions up to {ctx.memory.seq_pos_max(1)}")
    got = np.array(ctx.decode_single(e.prompt[3], seq_id=1))
    e.close_enough(got, e.fresh(e.prompt[:4]), "decoding after a partial copy")


def op_seq_keep(e: Env, ctx: Any) -> None:
    e.prep(ctx)
    ctx.memory.seq_cp(0, 1)
    ctx.memory.seq_keep(1)
    if ctx.memory.seq_pos_max(0) != -1 or ctx.memory.seq_pos_max(1) < 0:
        raise Wrong("seq_keep(1) left sequence 0 or dropped sequence 1")


def op_seq_add(e: Env, ctx: Any) -> None:
    e.prep(ctx)
    hi = ctx.memory.seq_pos_max(0)
    ctx.memory.seq_add(0, 0, -1, 2)
    if ctx.memory.seq_pos_max(0) != hi + 2:
        raise Wrong("seq_add did not move the positions")
    finite(np.array(ctx.decode_single(e.prompt[0])), "decoding after a shift")


def op_seq_div(e: Env, ctx: Any) -> None:
    e.prep(ctx)
    ctx.memory.seq_div(0, 0, -1, 2)
    finite(np.array(ctx.decode_single(e.prompt[0], pos=ctx.memory.seq_pos_max(0) + 1)), "decoding after a div")


def op_state(e: Env, ctx: Any) -> None:
    e.prep(ctx)
    data = ctx.save_state()
    ref = e.next_out(ctx)
    ctx.memory.clear()
    ctx.load_state(data)
    e.close_enough(e.next_out(ctx), ref, "decoding after a state round trip")


def op_seq_state(e: Env, ctx: Any) -> None:
    e.prep(ctx)
    data = ctx.save_seq_state(0)
    ctx.load_seq_state(data, 1)
    e.close_enough(e.next_out(ctx, 1), e.next_out(ctx, 0), "the restored sequence's next logits")


def op_state_file(e: Env, ctx: Any, tmp: str = "/tmp") -> None:
    import os
    import tempfile

    e.prep(ctx)
    fd, path = tempfile.mkstemp(suffix=".state")
    os.close(fd)
    try:
        ctx.save_state_file(path, e.prompt)
        ref = e.next_out(ctx)
        ctx.memory.clear()
        ctx.load_state_file(path)
        e.close_enough(e.next_out(ctx), ref, "decoding after a state file round trip")
    finally:
        os.unlink(path)


def op_switches(e: Env, ctx: Any) -> None:
    ctx.set_embeddings(True)
    ctx.set_causal_attn(ctx.causal_attn)
    ctx.warmup()
    ctx.set_embeddings(e.encoder_only)
    finite(e.prep(ctx), "the output after set_embeddings/set_causal_attn/warmup")


def op_lora(e: Env, ctx: Any) -> None:
    adapter = e.model.load_lora(e.lora)
    try:
        ctx.set_lora_adapters({adapter: 0.5})
        finite(e.prep(ctx), "the output with a LoRA adapter")
    finally:
        ctx.set_lora_adapters(None)
        adapter.close()


def op_generate(e: Env, ctx: Any) -> None:
    text = ctx.generate("hello world", max_tokens=4)
    if not isinstance(text, str):
        raise Wrong("generate returned no text")


def op_stream(e: Env, ctx: Any) -> None:
    pieces = list(ctx.stream("hello world", max_tokens=4))
    if any(not isinstance(p, str) for p in pieces):
        raise Wrong("stream yielded something other than text")


def branch(e: Env, store: BranchStore) -> Any:
    """A root branch holding the prompt (an encoder-decoder: encoded, then decoded after the
    start token, like :meth:`Env.prep`)."""
    b = store.create(e.prompt)
    if e.enc_dec:
        store.prefill({b: e.prompt})
    return b


def op_branch_create(e: Env, ctx: Any) -> None:
    b = branch(e, BranchStore(ctx))
    e.close_enough(b.logits, e.fresh(e.prompt), "the branch's logits")


def op_branch_fork(e: Env, ctx: Any) -> None:
    store = BranchStore(ctx)
    root = branch(e, store)
    kid = root.fork()
    store.step({root: 5, kid: 5})
    e.close_enough(root.logits, kid.logits, "a fork stepped like its parent")


def op_branch_fork_at(e: Env, ctx: Any) -> None:
    store = BranchStore(ctx)
    root = branch(e, store)
    kid = root.fork(at=4 + e.off)
    e.close_enough(kid.logits, e.fresh(e.prompt[:4]), "a fork at a position")


def op_branch_step(e: Env, ctx: Any) -> None:
    store = BranchStore(ctx)
    a = branch(e, store)
    b = a.fork()
    for _ in range(3):
        store.step({a: a.sample(), b: b.sample()})
    if a.tokens != b.tokens:
        raise Wrong("two greedy branches of one prompt diverged")


def op_branch_prefill(e: Env, ctx: Any) -> None:
    store = BranchStore(ctx)
    a = store.create(e.prompt if e.enc_dec else e.prompt[:2])
    store.prefill({a: e.prompt if e.enc_dec else e.prompt[2:]})
    e.close_enough(a.logits, e.fresh(e.prompt), "a prefilled branch")


def op_branch_prune(e: Env, ctx: Any) -> None:
    store = BranchStore(ctx)
    a = branch(e, store)
    kid = a.fork()
    kid.prune()
    if len(store) != 1 or ctx.memory.seq_pos_max(kid.seq_id) != -1:
        raise Wrong("pruning left the branch or its cells")


def op_branch_retain_only(e: Env, ctx: Any) -> None:
    store = BranchStore(ctx)
    a = branch(e, store)
    kid = a.fork()
    store.retain_only(kid)
    if len(store) != 1 or ctx.memory.seq_pos_max(a.seq_id) != -1:
        raise Wrong("retain_only left another branch's cells")


def op_branch_clear_and_reseed(e: Env, ctx: Any) -> None:
    store = BranchStore(ctx)
    a = branch(e, store)
    for _ in range(3):
        a.commit(a.sample())
    a.clear_and_reseed(sinks=1, tail=2)
    if a.position != 3 or ctx.memory.seq_pos_max(a.seq_id) != 2:
        raise Wrong(f"clear_and_reseed left the branch at {a.position}, not 3")


def op_branch_shift(e: Env, ctx: Any) -> None:
    store = BranchStore(ctx)
    a = branch(e, store)
    before = a.position
    a.shift_context(2, sinks=1)
    if a.position != before - 2:
        raise Wrong("shift_context did not drop two positions")


def op_search_generate(e: Env, ctx: Any) -> None:
    out = generate(BranchStore(ctx), "hello world", max_tokens=4)
    ref = e.ctx()
    try:
        if out != ref.generate("hello world", max_tokens=4):
            raise Wrong("samplers.search.generate differs from Context.generate (greedy)")
    finally:
        ref.close()


def op_search_best_of_n(e: Env, ctx: Any) -> None:
    best_of_n(BranchStore(ctx), "hello world", 3, max_tokens=4)


def op_search_beam(e: Env, ctx: Any) -> None:
    beam_search(BranchStore(ctx), "hello world", 2, max_tokens=4)


def op_rewind_far(e: Env, ctx: Any) -> None:
    """300 positions (past the 256-cell window cache of the SWA kind, which then holds
    44..299), then back to 20: before the window cache's oldest position."""
    if e.enc_dec:
        ctx.encode(e.prompt, seq_id=-1)
        ctx.decode([e.start] * 300, logits="none")
    else:
        ctx.decode((e.prompt * 50)[:300], logits="none")
    if not ctx.memory.seq_rm(0, 20, -1):
        raise Declined
    if ctx.memory.seq_pos_max(0) != 19:
        raise Wrong(f"after removing from 20 the sequence ends at {ctx.memory.seq_pos_max(0)}")
    finite(np.array(ctx.decode_single(e.prompt[0])), "decoding at 20")


def op_generate_many(e: Env, ctx: Any) -> None:
    """Three prompts, two at a time (continuous batching, a shared prefix): each result is
    generate()'s of its prompt alone (greedy) in a fresh context."""
    from samplers.many import generate_many

    prompts = ["hello world", "hello world the", "the cat"]
    out = generate_many(BranchStore(ctx), prompts, max_tokens=4, n_parallel=2)
    for p, r in zip(prompts, out, strict=True):
        ref = e.ctx()
        try:
            if r.text != generate(BranchStore(ref), p, max_tokens=4):
                raise Wrong(f"generate_many({p!r}) differs from generate() of the prompt alone")
        finally:
            ref.close()


def op_score_many(e: Env, ctx: Any) -> None:
    """Two prompts, three continuations: score_many's values are score()'s of each pair."""
    from samplers.logprobs import score, score_many

    pairs = [("hello world", " the cat"), ("hello world", " the"), ("the cat", " hello")]
    many = score_many(BranchStore(ctx), pairs)
    for (p, c), m in zip(pairs, many, strict=True):
        ref = e.ctx()
        try:
            one = score(ref, p, c)
        finally:
            ref.close()
        e.close_enough([t.logprob for t in m.logprobs], [t.logprob for t in one.logprobs], f"score_many{(p, c)}")


def op_prompt_cache(e: Env, ctx: Any) -> None:
    """complete() twice with a PromptCache: the second prompt extends the first's entry
    (its prompt and reply), copies it where the memory can (a recurrent state with rollback
    cannot: decoded in full), and generates what generate() of it alone does."""
    from samplers.prompt_cache import PromptCache
    from samplers.search import complete

    store = BranchStore(ctx)
    cache = PromptCache(store)
    first = complete(store, "hello world", max_tokens=4, cache=cache)
    vocab = e.model.vocab
    prompt = [*vocab.tokenize("hello world"), *first.tokens, *vocab.tokenize(" the cat", add_special=False)]
    second = complete(store, prompt, max_tokens=4, cache=cache)
    rollback = (e.model.is_recurrent or e.model.is_hybrid) and ctx.n_rs_seq > 0
    if (second.cached_tokens == 0) != rollback:
        raise Wrong(f"the second prompt copied {second.cached_tokens} tokens from the cache")
    cache.close()
    if len(store) != 0:
        raise Wrong("closing the cache left branches in the store")
    ref = e.ctx()
    try:
        if second.text != generate(BranchStore(ref), prompt, max_tokens=4):
            raise Wrong("complete() with a cache differs from generate() of the prompt alone")
    finally:
        ref.close()


def op_projector(e: Env, ctx: Any) -> None:
    """libmtmd over this text model: a tiny gemma3 projector written for its embedding
    width, a prompt with an image, the image's embeddings (finite, of the model's width,
    the same twice), and the prompt decoded (Projector.eval: the image non-causally)."""
    import tempfile

    from llama_cffi.media import Image
    from llama_cffi.mtmd import Projector
    from llama_cffi.testing import write_tiny_gemma3_mmproj

    with tempfile.TemporaryDirectory() as folder:
        path = write_tiny_gemma3_mmproj(f"{folder}/g3.gguf", e.model.n_embd_inp)
        pixels = np.random.default_rng(0).integers(0, 256, (32, 48, 3), dtype=np.uint8)
        with Projector(e.model, path, n_threads=1) as p, p.tokenize(f"see {p.media_marker}", [Image(pixels)]) as ch:
            kinds = [c.kind for c in ch]
            if kinds.count("image") != 1:
                raise Wrong(f"chunks {kinds}")
            image = ch[kinds.index("image")]
            emb = p.encode(image)
            if emb.shape != (image.n_tokens, e.model.n_embd_inp):
                raise Wrong(f"embeddings of shape {emb.shape}")
            finite(emb, "the image's embeddings")
            if not np.array_equal(p.encode(image), emb):
                raise Wrong("encoding the image twice differs")
            start = max(ctx.memory.seq_pos_max(0), -1) + 1
            if p.eval(ctx, ch) != start + ch.n_pos:
                raise Wrong("eval returned another next position")
            finite(np.array(ctx.logits()), "the logits after the prompt")


class Declined(Exception):
    """The operation returned False (allowed by its API)."""


OPERATIONS: dict[str, Callable[[Env, Any], None]] = {
    "decode": op_decode,
    "decode_single": op_decode_single,
    "decode_batch (2 sequences)": op_decode_batch,
    "eval (rewind)": op_eval,
    "encode": op_encode,
    "logits": op_logits,
    "logits (all rows)": op_logits_all,
    "embeddings (per token)": op_embeddings,
    "embeddings_seq (pooled)": op_embeddings_seq,
    "embed (many texts)": op_embed,
    "rerank": op_rerank,
    "memory.clear": op_clear,
    "memory.seq_rm (tail)": op_seq_rm_tail,
    "memory.seq_rm (middle)": op_seq_rm_middle,
    "memory.seq_rm (300 -> 20)": op_rewind_far,
    "memory.seq_cp": op_seq_cp,
    "memory.seq_cp (part)": op_seq_cp_part,
    "memory.seq_keep": op_seq_keep,
    "memory.seq_add": op_seq_add,
    "memory.seq_div": op_seq_div,
    "state save/load": op_state,
    "sequence state save/load": op_seq_state,
    "state file": op_state_file,
    "set_embeddings, set_causal_attn, warmup": op_switches,
    "LoRA adapter": op_lora,
    "Context.generate": op_generate,
    "Context.stream": op_stream,
    "BranchStore.create": op_branch_create,
    "Branch.fork": op_branch_fork,
    "Branch.fork(at=)": op_branch_fork_at,
    "BranchStore.step": op_branch_step,
    "BranchStore.prefill": op_branch_prefill,
    "Branch.prune": op_branch_prune,
    "BranchStore.retain_only": op_branch_retain_only,
    "Branch.clear_and_reseed": op_branch_clear_and_reseed,
    "Branch.shift_context": op_branch_shift,
    "search.generate": op_search_generate,
    "search.best_of_n": op_search_best_of_n,
    "search.beam_search": op_search_beam,
    "many.generate_many": op_generate_many,
    "logprobs.score_many": op_score_many,
    "prompt_cache.PromptCache": op_prompt_cache,
    "mtmd.Projector (tokenize, encode, eval)": op_projector,
}


def run(kind: str, path: str, lora: str, only: list[str]) -> None:
    e = Env(kind, path, lora)
    for name, fn in OPERATIONS.items():
        if only and name not in only:
            continue
        print("START", name, flush=True)
        ctx = e.ctx()
        try:
            fn(e, ctx)
            outcome = "ok"
        except Declined:
            outcome = "declined"
        except Wrong as w:
            outcome = f"wrong: {w}"
        except LlamaError as err:
            outcome = f"refused: {type(err).__name__}: {err}"
        except Exception as err:
            outcome = f"bug: {type(err).__name__}: {err} | {traceback.format_exc(limit=3)!r}"
        try:  # the context must survive whatever happened
            ctx.memory.clear()
            finite(e.prep(ctx), "the context's output afterwards")
        except Exception as err:
            outcome = f"unusable: {type(err).__name__}: {err} (after {outcome})"
        ctx.close()
        print("CELL", json.dumps({"op": name, "outcome": outcome}), flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
