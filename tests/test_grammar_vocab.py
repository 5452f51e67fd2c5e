"""The grammar's vocabulary index: read in one C call, cached on disk (and checked when
loaded), the same arrays either way; the no-mask-cache mode computes every mask."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import llama_cffi
from samplers.grammar import Grammar
from samplers.grammar.vocab_index import (
    _MAGIC,
    _PRESCAN_FIELDS,
    _PRESCANNED,
    _SAVED,
    VocabIndex,
    _cache_path,
    _load,
    _save,
)


@pytest.fixture(scope="module")
def vocab_model(tiny_model_path: Path) -> llama_cffi.Model:
    return llama_cffi.Model.load(tiny_model_path, vocab_only=True)


def test_pieces_blob_equals_token_to_piece(vocab_model: llama_cffi.Model) -> None:
    v = vocab_model.vocab
    for special in (True, False):
        blob, offsets, eog = v.pieces_blob(special=special)
        assert offsets.shape == (v.n_vocab + 1,) and offsets[0] == 0 and offsets[-1] == len(blob)
        for t in range(v.n_vocab):
            assert blob[offsets[t] : offsets[t + 1]] == v.token_to_piece(t, special=special), t
        assert np.flatnonzero(eog).tolist() == v.eog_tokens()


@pytest.mark.parametrize("pieces", ["model", "mixed"])
def test_first_code_point_counts(vocab_model: llama_cffi.Model, pieces: str) -> None:
    """``first_cp_tokens`` (read from the trie's first level) counts, per code point, the
    usable tokens whose first code point it is: the same as counting token by token."""
    if pieces == "model":
        v = VocabIndex.of(vocab_model.vocab)
    else:
        v = VocabIndex([b"a", b"ab", b"\xc3", b"\xc3\xa9x", b"", b"\x00a", b"\xa9", "日本".encode(), b"b", b"ba"])
    want = np.zeros(len(v.uniq_cps))
    for t in np.flatnonzero(v.usable).tolist():
        cps = v.token_cps(t)
        if len(cps):
            want[int(np.searchsorted(v.uniq_cps, cps[0]))] += 1
    assert np.array_equal(v.first_cp_tokens, want)


def _index(model: llama_cffi.Model) -> VocabIndex:
    blob, offsets, eog = model.vocab.pieces_blob(special=True)
    return VocabIndex._load_or_build(blob, offsets, eog, disk_cache=True)


def test_disk_cache_round_trip(vocab_model: llama_cffi.Model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first index is built and saved; the next is loaded, with equal arrays and masks."""
    monkeypatch.setenv("LLAMA_CFFI_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("LLAMA_CFFI_GRAMMAR_CACHE", raising=False)
    built = _index(vocab_model)
    assert not built.from_cache
    files = list((tmp_path / "grammar-vocab").glob("*.vocab"))
    assert len(files) == 1
    loaded = _index(vocab_model)
    assert loaded.from_cache
    for name, dt in _SAVED.items():
        a, b = getattr(built, name), getattr(loaded, name)
        assert a.dtype == b.dtype == np.dtype(dt), name
        assert not b.flags.writeable, name  # a view of the memory-mapped file
        np.testing.assert_array_equal(a, b, err_msg=name)
    # the trie's packed records too: the file's pages, not packed again
    for a, b in zip(built.trie().packed_arrays(), loaded.trie().packed_arrays(), strict=True):
        assert a.flags.writeable and not b.flags.writeable
        np.testing.assert_array_equal(a, b)
    gbnf = 'root ::= "{" [a-z "\\\\]* "}" | [^x]+'
    g = Grammar.from_gbnf(gbnf)
    m1, m2 = g.compile(built, 0).matcher(), g.compile(loaded, 0).matcher()
    for text in ("", "{ab", "{a\\", "hello"):
        assert m1.accept_bytes(text) == m2.accept_bytes(text)
        np.testing.assert_array_equal(m1.allowed_tokens(), m2.allowed_tokens())


def test_prescanned_string_scans(
    vocab_model: llama_cffi.Model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index is built with the scans of JSON string content (our converter's and
    llama.cpp's character class) and keeps them in its cache file: loaded, they are the
    file's read-only pages, equal to the built ones; regrouped for a grammar they equal
    that grammar's own scan; a JSON schema's string takes one (no scan of the vocabulary)
    and its masks equal the numpy walk's; a cache file whose prescans do not fit the trie
    has them made again."""
    monkeypatch.setenv("LLAMA_CFFI_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("LLAMA_CFFI_GRAMMAR_CACHE", raising=False)
    built = _index(vocab_model)
    loaded = _index(vocab_model)
    assert not built.from_cache and loaded.from_cache
    assert len(built._prescans) == len(loaded._prescans) == len(_PRESCANNED)
    assert built._prescans.keys() == loaded._prescans.keys()
    for key, a in built._prescans.items():
        b = loaded._prescans[key]
        for f in _PRESCAN_FIELDS:
            if f == "key":
                continue
            x, y = getattr(a, f), getattr(b, f)
            assert not y.flags.writeable, f
            np.testing.assert_array_equal(x, y, err_msg=f)
    # each prescan against a fresh scan, for a grammar whose classes split the characters
    cap = loaded.trie().max_depth + 1
    for char_class in _PRESCANNED:
        text = f'root ::= "\\"" {char_class}* "\\"" | [a-c0-3] "!" | [\\u0400-\\u04FF]'
        c = Grammar.from_gbnf(text).compile(loaded, mask_cache_size=0, kernel="c")
        m = c.matcher()
        assert m.accept_bytes(b'"')
        c._run(m.state)
        run = c._run_words[m.state]
        sh = loaded._shared_scan(c._cp_key(run), True)
        assert sh is not None and sh.keeps_paths, char_class
        own = c._tg.run_scan(run, cap, keep=True)
        got = c._tg.unshare(sh, run)
        assert np.array_equal(got.mask, own.mask) and np.array_equal(got.group_start, own.group_start)
        assert sorted(got.frontier.tolist()) == sorted(own.frontier.tolist())
        assert sorted(zip(got.pt_tokens.tolist(), got.pt_depth.tolist(), strict=True)) == sorted(
            zip(own.pt_tokens.tolist(), own.pt_depth.tolist(), strict=True)
        )
        for k in (1, 3, cap // 2):
            d1, d2 = c._tg.run_derive(got, k), c._tg.run_derive(own, k)
            assert np.array_equal(d1.mask, d2.mask) and np.array_equal(d1.group_start, d2.group_start), k
            assert sorted(d1.frontier.tolist()) == sorted(d2.frontier.tolist()), k
    # a schema's strings (bounded and not, and after a pattern's "." or "\\S"): no scan of
    # the vocabulary, masks as the numpy walk's
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string"},
            "b": {"type": "string", "maxLength": 6},
            "c": {"type": "string", "pattern": "^x.*$"},
            "d": {"type": "string", "pattern": "^\\S+$"},
            "e": {"type": "string", "pattern": "^[^\\s]+$"},
        },
    }
    g = Grammar.from_json_schema(schema)
    c, n = g.compile(loaded, mask_cache_size=0, kernel="c"), g.compile(loaded, mask_cache_size=0, kernel="numpy")
    own_scan = c._tg.run_scan

    def short_scans_only(run: np.ndarray, k: int, keep: bool = False) -> object:
        assert k < cap, "a full-length scan of the vocabulary: the prescan was not taken"
        return own_scan(run, k, keep)

    def no_extension(*_args: object, **_kwargs: object) -> object:
        raise AssertionError("a scan extended from a smaller prescan: this run's prescan was not taken")

    for doc in ('{"a": "hello wo', '{"c": "xab', '{"d": "ab', '{"e": "ab'):
        m = c.matcher()
        assert m.accept_bytes(doc)
        c._run(m.state)  # the string's run: its code points are a prescan's
        assert loaded._shared_scan(c._cp_key(c._run_words[m.state]), True) is not None, doc
    c._tg.run_scan = short_scans_only
    c._tg.run_scan_extend = no_extension
    for doc in ('{"a": "hello wo', '{"a": "x", "b": "ab', '{"c": "xab', '{"d": "ab', '{"e": "ab'):
        mc, mn = c.matcher(), n.matcher()
        assert mc.accept_bytes(doc) and mn.accept_bytes(doc)
        for _ in range(2):
            np.testing.assert_array_equal(mc.allowed_tokens(), mn.allowed_tokens())
    # prescans that do not fit the trie: made again when the file is loaded
    bad = {k: v for k, v in _load(_cache_path(*vocab_model.vocab.pieces_blob(special=True))).items()}
    bad["prescan0_on"] = bad["prescan0_on"][:-1]
    again = VocabIndex(
        (vocab_model.vocab.pieces_blob(special=True)[0], vocab_model.vocab.pieces_blob(special=True)[1]),
        vocab_model.vocab.pieces_blob(special=True)[2],
        arrays=bad,
    )
    assert again.from_cache and again._prescans.keys() == built._prescans.keys()
    assert all(sh.on.flags.writeable for sh in again._prescans.values())  # made, not the file's


def test_bad_cache_files_are_rebuilt(
    vocab_model: llama_cffi.Model, tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A truncated file, or one holding another vocabulary's arrays, is not used: the
    index is rebuilt (and the file rewritten)."""
    monkeypatch.setenv("LLAMA_CFFI_CACHE_DIR", str(tmp_path))
    blob, offsets, eog = vocab_model.vocab.pieces_blob(special=True)
    path = _cache_path(blob, offsets, eog)
    _index(vocab_model)
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 2])
    again = _index(vocab_model)
    assert not again.from_cache
    assert path.read_bytes() == good  # rewritten whole
    # another vocabulary's arrays under this one's name
    other = VocabIndex([b"a", b"bb", "é".encode(), b"\xc3"])
    _save(path, other.arrays())
    assert not _index(vocab_model).from_cache
    assert _index(vocab_model).from_cache
    # a header that promises more than the file holds; one naming a dtype never saved; junk
    good = path.read_bytes()
    n = int.from_bytes(good[len(_MAGIC) : len(_MAGIC) + 8], "little")
    header = json.loads(good[len(_MAGIC) + 8 : len(_MAGIC) + 8 + n])
    start = -(-(len(_MAGIC) + 8 + n) // 64) * 64
    data = good[start:]
    for bad in ({**header, "order": [header["order"][0], 10**9, 0]}, {**header, "order": ["|O", 4, 0]}):
        raw = json.dumps(bad).encode()
        pad = -(-(len(_MAGIC) + 8 + len(raw)) // 64) * 64 - (len(_MAGIC) + 8 + len(raw))
        path.write_bytes(_MAGIC + len(raw).to_bytes(8, "little") + raw + b"\0" * pad + data)
        assert _load(path) is None
        assert not _index(vocab_model).from_cache
    assert _load(path) is not None  # rewritten good
    path.write_bytes(b"junk" * 100)
    assert _load(path) is None and not _index(vocab_model).from_cache
    assert _index(vocab_model).from_cache


def test_disk_cache_can_be_turned_off(
    vocab_model: llama_cffi.Model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMA_CFFI_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LLAMA_CFFI_GRAMMAR_CACHE", "0")
    assert not _index(vocab_model).from_cache
    assert not (tmp_path / "grammar-vocab").exists()


def test_no_mask_cache_computes_every_mask(vocab_model: llama_cffi.Model) -> None:
    """``mask_cache_size=0``: nothing is reused, not even the last mask; fill_mask works;
    the compiled grammar is cached per cache size."""
    g = Grammar.from_gbnf('root ::= [a-z]+ "." [a-z]*')
    normal = g.compile(vocab_model)
    none = g.compile(vocab_model, mask_cache_size=0)
    assert none is not normal and g.compile(vocab_model) is normal and g.compile(vocab_model, 0) is none
    m = none.matcher()
    words = np.zeros((vocab_model.vocab.n_vocab + 31) // 32, dtype=np.uint32)
    for _ in range(3):
        m.fill_mask(words)
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")[: vocab_model.vocab.n_vocab].astype(bool)
        np.testing.assert_array_equal(bits, m.allowed_tokens())
    assert none.stats["mask_hits"] == 0 and none.stats["mask_misses"] == 6
    n = normal.matcher()
    n.allowed_tokens()
    n.fill_mask(words)
    assert normal.stats["mask_hits"] >= 1


@pytest.mark.parametrize("kernel", ["c", "numpy"])
def test_no_garbage_collection_inside_a_mask(
    vocab_model: llama_cffi.Model, monkeypatch: pytest.MonkeyPatch, kernel: str
) -> None:
    """The collector is paused while a mask is computed and restored after (left off when
    the program had turned it off), with either walk."""
    import gc

    seen: list[bool] = []
    g = Grammar.from_gbnf('root ::= [a-z]+ "!"')
    c = g.compile(vocab_model, mask_cache_size=0, kernel=kernel)
    name = "_mask_words_c" if kernel == "c" else "_compute_mask"
    real = getattr(c, name)

    def spy(*args: object) -> np.ndarray:
        seen.append(gc.isenabled())
        return real(*args)  # type: ignore[no-any-return]

    monkeypatch.setattr(c, name, spy)
    assert gc.isenabled()
    c.matcher().allowed_tokens()
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        c.matcher().allowed_tokens()
        assert seen == [False, False] and not gc.isenabled()
    finally:
        gc.enable()
