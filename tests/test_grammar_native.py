"""Our grammar masks equal llama.cpp's grammar sampler's, token for token, over whole vocabularies."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llama_cffi
from benchmarks.native_tools import llama_cpp_source_dir
from llama_cffi.sampling import LlamaSampler, SamplingError, TokenDataArray
from samplers.grammar import Grammar, GrammarMatcher

from .conftest import EXPECT, run_isolated

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def tiny_vocab_model(tiny_model_path: Path) -> Iterator[llama_cffi.Model]:
    m = llama_cffi.Model.load(tiny_model_path, vocab_only=True)
    yield m
    m.close()


def native_mask(nat: LlamaSampler, n_vocab: int, tda: TokenDataArray) -> np.ndarray:
    tda.fill_logits(np.zeros(n_vocab, np.float32))
    nat.apply(tda)
    return tda.logits > -np.inf


def assert_same_masks(model: llama_cffi.Model, gbnf: str, tokens: list[int], tda: TokenDataArray) -> int:
    """Walk ``tokens`` through our matcher and the native sampler, comparing the full
    masks before each token and after the last; returns how many tokens were accepted."""
    n = model.vocab.n_vocab
    nat = LlamaSampler.grammar(model, gbnf, guard=Grammar.from_gbnf(gbnf).matcher(model))
    ours = Grammar.from_gbnf(gbnf).matcher(model)
    accepted = 0
    for step, tok in enumerate([*tokens, None]):
        want = native_mask(nat, n, tda)
        got = ours.allowed_tokens()
        diff = np.flatnonzero(want != got)
        assert len(diff) == 0, f"step {step}: {len(diff)} tokens differ, e.g. " + ", ".join(
            f"{t} {model.vocab.token_to_piece(int(t), special=True)!r} native={want[t]}" for t in diff[:5]
        )
        if tok is None or not want[tok]:
            break
        assert ours.allows(tok)
        assert ours.accept_token(tok)
        nat.accept(tok)
        accepted += 1
    return accepted


GRAMMARS = {
    "json": None,  # llama.cpp's grammars/json.gbnf
    "arith": 'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= [0-9]+ | "(" expr ")"\n',
    "unicode": 'root ::= ("é" | "日本" | [\\u0400-\\u04FF]+ | [^a-z\\n]) root?\n',
    "classes": 'root ::= [a-c]{2,4} " "? ([^x-z] | .)*\n',
    "tokens": 'root ::= <[5]> [a-z]* !<[6]> "!"\n',
}


def grammar_text(name: str) -> str:
    text = GRAMMARS[name]
    if text is None:
        return (llama_cpp_source_dir() / "grammars" / f"{name}.gbnf").read_text()
    return text


@pytest.mark.parametrize("name", sorted(GRAMMARS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_tiny_vocab_masks_equal_native(tiny_vocab_model: llama_cffi.Model, name: str, data: st.DataObject) -> None:
    """Random token walks (biased to allowed tokens) give the native mask at every step."""
    model = tiny_vocab_model
    gbnf = grammar_text(name)
    n = model.vocab.n_vocab
    tda = TokenDataArray(n)
    nat = LlamaSampler.grammar(model, gbnf, guard=Grammar.from_gbnf(gbnf).matcher(model))
    ours = Grammar.from_gbnf(gbnf).matcher(model)
    for step in range(12):
        want = native_mask(nat, n, tda)
        got = ours.allowed_tokens()
        diff = np.flatnonzero(want != got)
        assert len(diff) == 0, f"{name} step {step}: tokens {diff[:8]} differ (native {want[diff[:8]]})"
        allowed = np.flatnonzero(want & ~model_eog(model))
        if len(allowed) == 0:
            break
        tok = int(data.draw(st.sampled_from(allowed.tolist()), label=f"token {step}"))
        assert ours.accept_token(tok)
        nat.accept(tok)


def model_eog(model: llama_cffi.Model) -> np.ndarray:
    eog = np.zeros(model.vocab.n_vocab, dtype=bool)
    eog[model.vocab.eog_tokens()] = True
    return eog


def test_partial_utf8_across_tokens(tiny_vocab_model: llama_cffi.Model) -> None:
    """Byte tokens that split a character: masks equal native while inside the character."""
    model = tiny_vocab_model
    tda = TokenDataArray(model.vocab.n_vocab)
    gbnf = grammar_text("unicode")
    text = "é日本Жx".encode()
    byte_tokens = [int(model.vocab.tokenize(f"<0x{b:02X}>", add_special=False, parse_special=True)[0]) for b in text]
    assert assert_same_masks(model, gbnf, byte_tokens, tda) == len(byte_tokens)


def test_default_model_json_masks_equal_native(default_model_path: Path) -> None:
    """llama.cpp's json.gbnf on the default model's 262,144-token vocabulary."""
    model = llama_cffi.Model.load(default_model_path, vocab_only=True)
    doc = '{"name": "Adé 日本", "tags": ["x", {"y\\n": [[1], {}]}], "n": -1.5e3, "ok": true, "z": null}'
    tokens = [int(t) for t in model.vocab.tokenize(doc, add_special=False)]
    tda = TokenDataArray(model.vocab.n_vocab)
    assert assert_same_masks(model, grammar_text("json"), tokens, tda) == len(tokens)
    m = Grammar.from_gbnf(grammar_text("json")).matcher(model)
    assert m.accept_tokens(tokens) == len(tokens)
    assert m.can_end()
    eos = model.vocab.eos
    assert eos is not None and m.allows(eos)


def test_default_model_schema_masks_equal_native(default_model_path: Path) -> None:
    """A JSON-schema grammar (pattern, enum, bounded array, nested object, escapes,
    non-ASCII) on the 262,144-token vocabulary: the masks of the self-loop paths (the
    undecided-token walk inside strings, the subtree-absorbing trie walk elsewhere)
    equal llama.cpp's at every step."""
    model = llama_cffi.Model.load(default_model_path, vocab_only=True)
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Z][a-z]+$"},
            "age": {"type": "integer", "minimum": 0},
            "kind": {"enum": ["a", "bb", "ccc"]},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
            "address": {
                "type": "object",
                "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
                "required": ["street", "city"],
            },
        },
        "required": ["name", "age", "kind", "tags", "address"],
    }
    doc = (
        '{"name": "Alice", "age": 31, "kind": "bb", "tags": ["x y", "café au lait", "\\"q\\""], '
        '"address": {"street": "12 Rue de l\'Église", "city": "Paris"}}'
    )
    gbnf = Grammar.from_json_schema(schema).gbnf
    tokens = [int(t) for t in model.vocab.tokenize(doc, add_special=False)]
    tda = TokenDataArray(model.vocab.n_vocab)
    assert assert_same_masks(model, gbnf, tokens, tda) == len(tokens)


def test_matcher_refuses_what_native_would_abort_on(tiny_vocab_model: llama_cffi.Model) -> None:
    """A disallowed token or a premature EOG: False and no change (native: SamplingError)."""
    model = tiny_vocab_model
    g = Grammar.from_gbnf('root ::= "ab"')
    m = g.matcher(model)
    b = int(model.vocab.tokenize("b", add_special=False)[0])
    eos = model.vocab.eos
    assert eos is not None
    before = (m.state, m.partial)
    assert not m.accept_token(b)
    assert not m.accept_token(eos)
    assert (m.state, m.partial) == before
    nat = LlamaSampler.grammar(model, 'root ::= "ab"')
    with pytest.raises(SamplingError):
        nat.accept(b)
    with pytest.raises(SamplingError):
        nat.accept(eos)


def test_rollback_fork_reset(tiny_vocab_model: llama_cffi.Model) -> None:
    """rollback(n) restores the state n tokens back; forks are independent."""
    model = tiny_vocab_model
    m: GrammarMatcher = Grammar.from_gbnf(grammar_text("arith")).matcher(model)
    toks = [int(t) for t in model.vocab.tokenize("(1+2)-3", add_special=False)]
    states = [m.state]
    for t in toks:
        assert m.accept_token(t)
        states.append(m.state)
    assert m.can_end()
    f = m.fork()
    m.rollback(3)
    assert m.state == states[-4] and m.n_accepted == len(toks) - 3
    assert f.state == states[-1] and f.can_end()
    m.reset()
    assert m.state == states[0] and m.n_accepted == 0
    with pytest.raises(ValueError):
        m.rollback(1)


def test_accepts_whole_strings() -> None:
    g = Grammar.from_gbnf(grammar_text("arith"))
    assert g.accepts("1+(2-3)")
    assert not g.accepts("1+")
    assert not g.accepts("(1")
    j = Grammar.from_gbnf(grammar_text("json"))
    assert j.accepts('{"a": [1, 2.5, "x"]}')
    assert not j.accepts('{"a": [1, 2.5, "x"}')


def test_chain_fast_path_generates_what_native_does(default_model: llama_cffi.Model) -> None:
    """Greedy generation under json.gbnf: our chain (fast path: check the greedy choice,
    mask only on rejection) and llama.cpp's chain [grammar, greedy] write the same tokens,
    and the text is a JSON document prefix the grammar accepts."""
    import samplers as S
    from samplers.grammar import GrammarSampler

    m = default_model
    gbnf = grammar_text("json")
    g = Grammar.from_gbnf(gbnf)
    prompt = m.tokenize("A JSON object about a cat:\n")
    outs: list[list[int]] = []
    rejections = 0
    for mode in ("ours", "native"):
        with m.context(n_ctx=128, n_threads=2) as ctx:
            ctx.decode(prompt)
            if mode == "ours":
                gs = GrammarSampler(g, m)
                chain: object = S.SamplerChain([gs, S.Greedy()])
            else:
                chain = LlamaSampler.chain([LlamaSampler.grammar(m, gbnf), LlamaSampler.greedy()])
            toks: list[int] = []
            for _ in range(40):
                if mode == "ours":
                    logits = np.asarray(ctx.logits())
                    rejections += int(not gs.allows(int(logits.argmax())))
                tok = chain.sample(ctx)  # type: ignore[attr-defined]
                toks.append(tok)
                if m.vocab.is_eog(tok):
                    break
                ctx.decode_single(tok)
            outs.append(toks)
    assert outs[0] == outs[1]
    assert rejections > 0  # the slow path ran too
    text = m.vocab.detokenize([t for t in outs[0] if not m.vocab.is_eog(t)])
    assert text.lstrip().startswith("{")


def test_lazy_grammar_triggers_on_pattern(tiny_vocab_model: llama_cffi.Model) -> None:
    """A lazy grammar leaves everything allowed until its trigger pattern appears, then
    constrains from the trigger's capture group on (replaying the triggering text)."""
    from samplers.grammar import GrammarSampler

    model = tiny_vocab_model
    gs = GrammarSampler(
        Grammar.from_gbnf('root ::= "<call>" [a-z]+ "</call>"'),
        model,
        lazy=True,
        trigger_patterns=[r"[\s\S]*?(<call>)"],
    )
    toks = [int(t) for t in model.vocab.tokenize("hello <call>ab", add_special=False)]
    x = int(model.vocab.tokenize("!", add_special=False)[0])
    assert gs.allows(x)
    for t in toks:
        gs.accept(t)
    assert not gs.awaiting
    assert not gs.allows(x)
    close = [int(t) for t in model.vocab.tokenize("</call>", add_special=False)]
    for t in close:
        assert gs.allows(t)
        gs.accept(t)
    assert gs.matcher.can_end()
    gs.reset()
    assert gs.awaiting and gs.allows(x)


GRAMMAR_CRASHERS = (
    r"""
import resource, sys
# an address-space cap: a grammar that makes llama.cpp build rules without end fails fast
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
import numpy as np, llama_cffi
from llama_cffi.errors import InvalidTokenError, ParamError
from llama_cffi.sampling import LlamaSampler, SamplingError, TokenDataArray
m = llama_cffi.Model.load(sys.argv[1] if len(sys.argv) > 1 else PATH, vocab_only=True)
"""
    + EXPECT
    + r"""
g = LlamaSampler.grammar(m, 'root ::= "ab"')
b = int(m.vocab.tokenize("b", add_special=False)[0])
expect(SamplingError, lambda: g.accept(b))                    # llama.cpp: uncaught C++ exception
expect(SamplingError, lambda: g.accept(m.vocab.eos))          # llama.cpp: GGML_ABORT
expect(InvalidTokenError, lambda: g.accept(m.vocab.n_vocab))  # out of the vocabulary
t = TokenDataArray(4)
expect(InvalidTokenError, lambda: g.apply(t.fill([0, 10**6], [0.0, 0.0])))  # std::out_of_range in C++
expect(InvalidTokenError, lambda: LlamaSampler.infill(m).apply(t.fill([-3, 1], [0.0, 0.0])))
expect(ParamError, lambda: LlamaSampler.grammar(m, 'root ::= "a'))
expect(ParamError, lambda: LlamaSampler.grammar(m, 'root ::= a', root="nothere"))
expect(ParamError, lambda: LlamaSampler.grammar(m, 'root ::= root "a"'))   # left recursion
try:  # n < m: llama.cpp builds rules until memory runs out (here: the cap, after ~30 s)
    LlamaSampler.grammar(m, 'root ::= "a"{3,2}')
    out.append("NO-ERROR")
except ParamError as e:
    out.append("ParamError" if "below its minimum" in str(e) else "llama.cpp-ran-out-of-memory")
expect(ParamError, lambda: LlamaSampler.grammar(m, 'root ::= "a" ( [b]{ 9 , 1 } )'))
expect(ParamError, lambda: LlamaSampler.grammar(m, 'root ::= "{3,2}" [{]{2,3} # {3,2}'))  # NO ERROR
# accepted by llama.cpp's parser and checks, then fatal: hidden left recursion grows the
# parse stacks until memory runs out (here: the cap); 20,000 nested groups and a chain of
# 100,000 leading references overflow the 8 MiB stack (SIGSEGV); refused first instead
def refused_first(text):
    try:
        LlamaSampler.grammar(m, text)
        out.append("NO-ERROR")
    except ParamError as e:
        out.append("refused" if "before it reaches llama.cpp" in str(e) else "llama.cpp-refused")
refused_first('root ::= e root "x" | "y"\ne ::= f\nf ::= "" | "z"')
refused_first('root ::= (e root)* "x"\ne ::= "q"?')
refused_first("root ::= " + "(" * 20000 + '"a"' + ")" * 20000)
refused_first("root ::= r0\n" + "".join(f"r{i} ::= r{i+1}\n" for i in range(100000)) + 'r100000 ::= "a"')
# their safe neighbours still reach llama.cpp and work
ok = [LlamaSampler.grammar(m, 'root ::= e root | "y"\ne ::= f\nf ::= "" | "z"'),
      LlamaSampler.grammar(m, "root ::= " + "(" * 2000 + '"a"' + ")" * 2000)]
out.append("safe-ok")
# apply allows tokens "xy..." for a grammar "x" !<[5]> (the token element matches their id
# after the "x"), but no parse takes the whole token: llama.cpp's accept would throw
pieces = [m.vocab.token_to_piece(t, special=True) for t in range(m.vocab.n_vocab)]
ab = next(t for t, p in enumerate(pieces) if len(p) > 1 and p.isascii() and p[:1] != b"<" and t != 5)
gb = 'root ::= "\\x%02X" !<[5]>' % pieces[ab][0]
expect(SamplingError, lambda: LlamaSampler.grammar(m, gb).accept(ab))
from samplers.grammar import Grammar
guarded = LlamaSampler.grammar(m, gb, guard=Grammar.from_gbnf(gb).matcher(m))
expect(SamplingError, lambda: guarded.accept(ab))
print(" ".join(out))
"""
)


def test_native_grammar_never_crashes(tiny_model_path: Path) -> None:
    """In a fresh process: inputs that would abort llama.cpp's grammar sampler raise instead."""
    r = run_isolated(GRAMMAR_CRASHERS.replace("PATH", repr(str(tiny_model_path))))
    assert r.returncode == 0, r.stderr[-2000:]
    words = r.stdout.split()
    assert words == [
        "SamplingError",
        "SamplingError",
        "InvalidTokenError",
        "InvalidTokenError",
        "InvalidTokenError",
        "ParamError",
        "ParamError",
        "ParamError",
        "ParamError",
        "ParamError",
        "NO",  # "NO ERROR", split
        "ERROR",
        "refused",
        "refused",
        "refused",
        "refused",
        "safe-ok",
        "SamplingError",
        "SamplingError",
    ], r.stdout


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        "kind": {"enum": ["cat", "dog"]},
    },
    "required": ["name", "age", "kind"],
    "additionalProperties": False,
}


def valid_instance(doc: object) -> bool:
    if not isinstance(doc, dict) or not {"name", "age", "kind"} <= doc.keys() <= set(SCHEMA["properties"]):  # type: ignore[call-overload]
        return False
    name, age, kind, tags = doc["name"], doc["age"], doc["kind"], doc.get("tags", [])
    return (
        isinstance(name, str)
        and 1 <= len(name) <= 12
        and isinstance(age, int)
        and 0 <= age <= 120
        and kind in ("cat", "dog")
        and isinstance(tags, list)
        and len(tags) <= 3
        and all(isinstance(t, str) and len(t) <= 8 for t in tags)
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_schema_constrained_generation_is_valid_json(default_model: llama_cffi.Model, seed: int) -> None:
    """Sampling (top-k 40, temperature 1.2) under a JSON schema on the default model always
    ends with a document that json.loads parses and that satisfies the schema."""
    import json

    import samplers as S
    from samplers.grammar import GrammarSampler

    m = default_model
    g = Grammar.from_json_schema(SCHEMA)
    chain = S.SamplerChain([GrammarSampler(g, m), S.TopK(40), S.Temperature(1.2), S.Dist(seed)])
    out: list[int] = []
    with m.context(n_ctx=384, n_threads=2) as ctx:
        ctx.decode(m.tokenize("Describe a pet as JSON:\n"))
        for _ in range(300):
            tok = chain.sample(ctx)
            if m.vocab.is_eog(tok):
                break
            out.append(tok)
            ctx.decode_single(tok)
        else:
            pytest.fail("the grammar did not end within 300 tokens")
    text = m.vocab.detokenize(out)
    assert valid_instance(json.loads(text)), text


def test_lazy_grammar_triggers_on_word_and_token(tiny_vocab_model: llama_cffi.Model) -> None:
    """Trigger words start the grammar at the word; a trigger token starts it with that token."""
    from samplers.grammar import GrammarSampler

    model = tiny_vocab_model
    g = Grammar.from_gbnf('root ::= "go" [0-9]+')
    gs = GrammarSampler(g, model, lazy=True, trigger_words=["go"])
    for t in model.vocab.tokenize("let us go1", add_special=False):
        gs.accept(int(t))
    assert not gs.awaiting and gs.matcher.can_end()
    bad = int(model.vocab.tokenize("x", add_special=False)[0])
    assert not gs.allows(bad)
    bos = int(model.vocab.tokenize("<s>", add_special=False, parse_special=True)[0])
    gt = GrammarSampler(Grammar.from_gbnf("root ::= <s> [a-z]*"), model, lazy=True, trigger_tokens=[bos])
    gt.accept(bad)
    assert gt.awaiting
    gt.accept(bos)
    assert not gt.awaiting and gt.matcher.can_end()
    with pytest.raises(SamplingError):
        gt.accept(int(model.vocab.tokenize("7", add_special=False)[0]))


def test_a_word_list_masks_equal_llama_cpp(default_model: llama_cffi.Model) -> None:
    """A word list (the grammar kind with a class per literal character): CJK words of
    characters Gemma 3's vocabulary spells in single tokens and in pieces, some ASCII
    words, a set and a negation. Every mask along a walk through three words equals
    llama.cpp's sampler's. Such a grammar is built without a ``rows x classes`` matrix
    (tests/test_grammar_engine_core.py measures its memory)."""
    import random

    m = default_model
    rng = random.Random(3)
    chars = list(
        "的是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去"
        "之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行"
        "方又如前所本见经头面公同三已老从动两长"
    )
    words = sorted({"".join(rng.choice(chars) for _ in range(rng.randint(1, 3))) for _ in range(120)})
    words += ["hello", "world"]
    gbnf = "root ::= (" + " | ".join(f'"{w}"' for w in words) + ') ([0-9]+ | [^\\x00-\\x7f] | " " root)?\n'
    assert Grammar.from_gbnf(gbnf)._engine.n_classes >= len(set("".join(words)))  # a class per literal character
    tda = TokenDataArray(m.vocab.n_vocab)
    path = m.vocab.tokenize(f"{words[5]} {words[40]} {words[-1]}7", add_special=False).tolist()
    assert assert_same_masks(m, gbnf, path, tda) == len(path)
