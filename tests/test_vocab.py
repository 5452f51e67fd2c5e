"""Vocabulary: tokenize/detokenize properties, streaming, special tokens, id checks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llama_cffi import InvalidTokenError, Model, TokenAttr, VocabType
from tests import tiny_model as tm

text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=200)
fixture_ok = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


@fixture_ok
@given(s=text)
def test_round_trip_tiny(tiny_model: Model, s: str) -> None:
    """detokenize(tokenize(s)) == s for any text (byte-fallback SPM vocabulary)."""
    toks = tiny_model.tokenize(s, add_special=True)
    assert toks.dtype == np.int32 and toks[0] == tm.BOS_ID
    assert tiny_model.detokenize(toks, remove_special=True) == s
    assert tiny_model.detokenize(toks[1:]) == s


@pytest.mark.default_model
@fixture_ok
@given(s=text)
def test_round_trip_default_model(default_model: Model, s: str) -> None:
    """The Gemma tokenizer round-trips any text without special-token syntax."""
    toks = default_model.tokenize(s, add_special=False)
    assert default_model.detokenize(toks) == s


@fixture_ok
@given(tokens=st.lists(st.integers(0, tm.N_VOCAB - 1), max_size=60), remove=st.booleans(), unparse=st.booleans())
def test_streaming_equals_whole_tiny(tiny_model: Model, tokens: list[int], remove: bool, unparse: bool) -> None:
    """Concatenated streaming output equals detokenize of the whole sequence, for any ids."""
    stream = tiny_model.vocab.streaming_detokenizer(remove, unparse)
    pieces = [stream.push(t) for t in tokens] + [stream.flush()]
    assert "".join(pieces) == tiny_model.detokenize(tokens, remove, unparse)
    assert not any(p.endswith("\ufffd") for p in pieces[:-1] if p) or "\ufffd" in tiny_model.detokenize(
        tokens, remove, unparse
    )


@pytest.mark.default_model
@fixture_ok
@given(tokens=st.lists(st.integers(0, 262_143), max_size=40))
def test_streaming_equals_whole_default_model(default_model: Model, tokens: list[int]) -> None:
    """Same property on the 262,144-token Gemma vocabulary."""
    stream = default_model.vocab.streaming_detokenizer()
    out = "".join(stream.push(t) for t in tokens) + stream.flush()
    assert out == default_model.detokenize(tokens)


def test_streaming_never_splits_a_character(tiny_model: Model) -> None:
    """Byte tokens of one multi-byte character produce nothing until the character is whole."""
    emoji = "🙂".encode()
    ids = [tm.BYTE_TOKEN_OFFSET + b for b in emoji]
    stream = tiny_model.vocab.streaming_detokenizer()
    outs = [stream.push(t) for t in ids]
    assert outs == ["", "", "", "🙂"]
    assert stream.flush() == ""


def test_token_to_piece_of_byte_tokens(tiny_model: Model) -> None:
    """A byte token's piece is that single byte."""
    for b in (0x41, 0xC3, 0xFF):
        assert tiny_model.token_to_piece(tm.BYTE_TOKEN_OFFSET + b) == bytes([b])


def test_token_to_piece_special_and_lstrip(tiny_model: Model) -> None:
    """Control tokens render only with special=True; lstrip drops leading spaces."""
    assert tiny_model.token_to_piece(tm.IM_START_ID) == b""
    assert tiny_model.token_to_piece(tm.IM_START_ID, special=True) == b"<|im_start|>"
    the = tm.TOKENS.index("\u2581the")
    assert tiny_model.token_to_piece(the) == b" the"
    assert tiny_model.token_to_piece(the, lstrip=1) == b"the"


def test_parse_special(tiny_model: Model) -> None:
    """parse_special turns special-token text into its single id."""
    assert tiny_model.tokenize("<|im_start|>", add_special=False, parse_special=True).tolist() == [tm.IM_START_ID]
    assert len(tiny_model.tokenize("<|im_start|>", add_special=False, parse_special=False)) > 1


def test_long_text_uses_two_pass_sizing(tiny_model: Model) -> None:
    """Text needing more tokens than bytes (many single spaces+words) tokenizes fully."""
    s = " a" * 5000 + "🙂" * 1000
    toks = tiny_model.tokenize(s, add_special=False)
    assert tiny_model.detokenize(toks) == s


def test_special_tokens_and_attributes(tiny_model: Model) -> None:
    """Special ids, add_bos/eos flags, EOG set and token attributes match the generator."""
    v = tiny_model.vocab
    assert v.type == VocabType.SPM
    assert (v.bos, v.eos, v.eot) == (tm.BOS_ID, tm.EOS_ID, tm.EOT_ID)
    assert v.add_bos and not v.add_eos
    assert v.is_eog(tm.EOS_ID) and v.is_eog(tm.EOT_ID) and not v.is_eog(tm.BOS_ID + 100)
    assert set(v.eog_tokens()) >= {tm.EOS_ID, tm.EOT_ID}
    assert v.is_control(tm.IM_START_ID)
    assert TokenAttr.BYTE in v.token_attr(tm.BYTE_TOKEN_OFFSET)
    assert TokenAttr.CONTROL in v.token_attr(tm.BOS_ID)
    assert v.token_text(tm.TOKENS.index("\u2581the")) == "\u2581the"
    assert v.token_score(5) == pytest.approx(tm.SCORES[5])
    assert v.special_tokens()["bos"] == tm.BOS_ID
    assert v.fim_pre is None


@pytest.mark.parametrize("bad", [-1, tm.N_VOCAB, 2**31 - 1, -(2**31), 2**40])
def test_out_of_range_ids_never_reach_c(tiny_model: Model, bad: int) -> None:
    """Token ids outside [0, n_vocab) raise InvalidTokenError (a ValueError) everywhere."""
    for call in (
        lambda: tiny_model.token_to_piece(bad),
        lambda: tiny_model.detokenize([5, bad]),
        lambda: tiny_model.detokenize(np.array([5, bad], dtype=np.int64)),
        lambda: tiny_model.vocab.is_eog(bad),
        lambda: tiny_model.vocab.token_text(bad),
        lambda: tiny_model.vocab.streaming_detokenizer().push(bad),
    ):
        with pytest.raises(InvalidTokenError, match=str(bad)):
            call()


@pytest.mark.parametrize("bad", [[1.5], ["a"], [True], np.zeros((2, 2), dtype=np.int32), np.array([1.0])])
def test_non_integer_ids_are_rejected(tiny_model: Model, bad: object) -> None:
    """Floats, strings, bools and 2-D arrays are not token sequences."""
    with pytest.raises(InvalidTokenError):
        tiny_model.detokenize(bad)  # type: ignore[arg-type]


def test_bytes_input_and_empty(tiny_model: Model) -> None:
    """tokenize accepts bytes; empty input gives BOS only (or nothing)."""
    assert (
        tiny_model.tokenize(b"hello", add_special=False).tolist()
        == tiny_model.tokenize("hello", add_special=False).tolist()
    )
    assert tiny_model.tokenize("", add_special=True).tolist() == [tm.BOS_ID]
    assert tiny_model.tokenize("", add_special=False).tolist() == []
    assert tiny_model.detokenize([]) == ""


@pytest.mark.parametrize("bad", [5, 10**10, 1.5, None, [1, 2]])
def test_tokenize_refuses_what_is_not_text(tiny_model: Model, bad: object) -> None:
    """An int is not text: ``bytes(5)`` would tokenize five NUL bytes, ``bytes(10**10)``
    would allocate ten gigabytes. Only str and bytes-like objects are tokenized."""
    with pytest.raises(TypeError, match="str or bytes"):
        tiny_model.tokenize(bad)  # type: ignore[arg-type]
    assert list(tiny_model.tokenize(bytearray(b"hello"), add_special=False)) == list(
        tiny_model.tokenize("hello", add_special=False)
    )
