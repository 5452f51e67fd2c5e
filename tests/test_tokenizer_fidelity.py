"""Tokenizer fidelity against llama.cpp's own vocabulary test data.

The pinned sdist ships vocab-only models ``models/ggml-vocab-*.gguf``; most come with
``.gguf.inp`` (test strings joined by ``"\\n__ggml_vocab_test__\\n"``) and ``.gguf.out``
(one line of space-separated expected ids per string), which llama.cpp's
``tests/test-tokenizer-0.cpp`` checks with ``common_tokenize(ctx, s, add_special=false,
parse_special=false)`` from several threads at once. That program only prints the
detokenized text and asserts no round trip; the round trip llama.cpp does assert is
``tests/test-tokenizer-1-spm.cpp`` (registered for llama-spm only; the ``-1-bpe``
registrations are commented out "due to slowness"), mirrored here exactly.
"""

from __future__ import annotations

import os
import re
import tarfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from llama_cffi import Model, VocabType
from tests.conftest import load_build_ffi

ROOT = Path(__file__).resolve().parent.parent
SEP = b"\n__ggml_vocab_test__\n"  # the separator test-tokenizer-0.cpp splits .inp files on
#: What tests/CMakeLists.txt registers test-tokenizer-1-spm for (checked below).
SPM_ROUND_TRIP_VOCABS = ("ggml-vocab-llama-spm.gguf",)
#: Short string for the vocabularies that ship without .inp/.out files.
SMOKE_TEXT = "Hello world, this is 🦙.cpp!"


def _llama_cpp_prefix() -> str:
    return str(load_build_ffi().SDIST["prefix"]) + "/vendor/llama.cpp/"


def _discover() -> tuple[list[str], list[str], str | None]:
    """(vocabs with .inp and .out, vocabs without, error) from the pinned sdist's member list."""
    try:
        prefix = _llama_cpp_prefix() + "models/"
        with tarfile.open(load_build_ffi().fetch_sdist()) as tf:
            names = {m.name[len(prefix) :] for m in tf if m.isfile() and m.name.startswith(prefix + "ggml-vocab-")}
    except Exception as exc:  # reported by the tests (as failures), not at collection
        return [], [], f"cannot list the pinned sdist's vocabularies: {type(exc).__name__}: {exc}"
    ggufs = sorted(n for n in names if n.endswith(".gguf") and "/" not in n)
    with_data = [g for g in ggufs if f"{g}.inp" in names and f"{g}.out" in names]
    without = [g for g in ggufs if g not in with_data]
    if not with_data:
        return [], without, f"the pinned sdist has no ggml-vocab-*.gguf with .inp/.out under {prefix}"
    return with_data, without, None


VOCABS_WITH_DATA, VOCABS_WITHOUT_DATA, DISCOVERY_ERROR = _discover()
_UNAVAILABLE = "<sdist unavailable>"


def _params(names: list[str]) -> list[str]:
    # An empty list would make pytest skip; an unavailable sdist must fail instead.
    return names or [_UNAVAILABLE]


def _id(name: str) -> str:
    return name.removeprefix("ggml-vocab-").removesuffix(".gguf")


@pytest.fixture(scope="session")
def llama_cpp_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist's ``models/ggml-vocab-*`` files and ``tests/CMakeLists.txt``, extracted flat."""
    if DISCOVERY_ERROR:
        pytest.fail(DISCOVERY_ERROR)
    dest = tmp_path_factory.mktemp("llama_cpp_vocabs")
    prefix = _llama_cpp_prefix()
    wanted = {prefix + "tests/CMakeLists.txt"}
    with tarfile.open(load_build_ffi().fetch_sdist()) as tf:
        for m in tf:
            base = m.name.rsplit("/", 1)[-1]
            if m.isfile() and (m.name in wanted or (m.name.startswith(prefix + "models/ggml-vocab-"))):
                src = tf.extractfile(m)
                assert src is not None
                (dest / base).write_bytes(src.read())
    return dest


@pytest.fixture(scope="module")
def load_vocab(llama_cpp_files: Path) -> Iterator[Callable[[str], Model]]:
    """Load (once per module) a vocab-only model by file name."""
    cache: dict[str, Model] = {}

    def load(name: str) -> Model:
        assert name != _UNAVAILABLE, DISCOVERY_ERROR or "no such vocabulary in the pinned sdist"
        if name not in cache:
            cache[name] = Model.load(llama_cpp_files / name, vocab_only=True)
        return cache[name]

    yield load
    for m in cache.values():
        m.close()


def read_tests(inp: Path, out: Path) -> dict[bytes, tuple[int, list[int]]]:
    """Port of test-tokenizer-0.cpp's ``read_tests``: input bytes -> (case index, expected ids)."""
    raw = inp.read_bytes()
    sinp: list[bytes] = []
    pos = 0
    while pos < len(raw):  # a trailing separator ends the list (no empty last case)
        nxt = raw.find(SEP, pos)
        if nxt < 0:
            sinp.append(raw[pos:])
            break
        sinp.append(raw[pos:nxt])
        pos = nxt + len(SEP)
    sout = out.read_bytes().split(b"\n")  # std::getline: a final newline ends the last line
    if sout[-1] == b"":
        sout.pop()
    assert len(sinp) == len(sout), f"{inp.name}: {len(sinp)} inputs but {len(sout)} output lines"
    tests: dict[bytes, tuple[int, list[int]]] = {}
    for i, (s, o) in enumerate(zip(sinp, sout, strict=True)):
        o = o.strip()  # string_strip
        tests[s] = (i, [int(t) for t in o.split(b" ")] if o else [])  # std::map: a later duplicate wins
    assert tests, f"{inp.name}: no tests found"
    return tests


def _cases(files: Path, name: str) -> dict[bytes, tuple[int, list[int]]]:
    return read_tests(files / f"{name}.inp", files / f"{name}.out")


def _mismatch(name: str, index: int, text: bytes, expected: list[int], got: list[int]) -> str:
    return f"{_id(name)} case {index} {text!r}:\n    expected {expected}\n    got      {got}"


def test_vocab_data_matches_llama_cpp_registrations(llama_cpp_files: Path) -> None:
    """The vocabularies checked here are exactly those llama.cpp's CMakeLists runs its tokenizer tests on."""
    cmake = (llama_cpp_files / "CMakeLists.txt").read_text()
    registered: dict[str, set[str]] = {}
    for line in cmake.splitlines():
        m = re.match(r"\s*llama_test\((test-tokenizer-[\w-]+)\s.*/models/(ggml-vocab-[\w.-]+?\.gguf)\b", line)
        if m:  # a commented-out line does not match (it starts with '#')
            registered.setdefault(m.group(1), set()).add(m.group(2))
    assert registered.get("test-tokenizer-0") == set(VOCABS_WITH_DATA)
    assert registered.get("test-tokenizer-1-spm") == set(SPM_ROUND_TRIP_VOCABS)
    assert set(registered) == {"test-tokenizer-0", "test-tokenizer-1-spm"}, "a new tokenizer test to mirror"


@pytest.mark.parametrize("name", _params(VOCABS_WITH_DATA), ids=_id)
def test_tokenize_matches_llama_cpp(name: str, llama_cpp_files: Path, load_vocab: Callable[[str], Model]) -> None:
    """Every .inp string tokenizes (add_special=False, parse_special=False) to exactly the .out ids."""
    model = load_vocab(name)
    tests = _cases(llama_cpp_files, name)
    bad = []
    for text, (index, expected) in tests.items():
        got = model.tokenize(text, add_special=False, parse_special=False)
        assert got.dtype == np.int32
        if got.tolist() != expected:
            bad.append(_mismatch(name, index, text, expected, got.tolist()))
    assert not bad, f"{len(bad)} of {len(tests)} cases differ:\n" + "\n".join(bad)


@pytest.mark.parametrize("name", _params(VOCABS_WITH_DATA), ids=_id)
def test_tokenize_concurrently(name: str, llama_cpp_files: Path, load_vocab: Callable[[str], Model]) -> None:
    """Tokenizing all cases from several threads at once, as test-tokenizer-0.cpp does, gives the .out ids."""
    model = load_vocab(name)
    tests = _cases(llama_cpp_files, name)
    n_threads = min(8, max(2, os.cpu_count() or 2))
    start = threading.Barrier(n_threads)
    results: list[list[list[int]] | BaseException] = [[] for _ in range(n_threads)]

    def work(k: int) -> None:
        try:
            start.wait()
            results[k] = [model.tokenize(t, False, False).tolist() for t in tests]
        except BaseException as exc:
            results[k] = exc

    threads = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bad = []
    for k, res in enumerate(results):
        if isinstance(res, BaseException):
            raise AssertionError(f"thread {k} raised") from res
        for (text, (index, expected)), got in zip(tests.items(), res, strict=True):
            if got != expected:
                bad.append(f"thread {k}: " + _mismatch(name, index, text, expected, got))
    assert not bad, f"{len(bad)} results differ:\n" + "\n".join(bad)


@pytest.mark.parametrize("name", SPM_ROUND_TRIP_VOCABS, ids=_id)
def test_spm_token_round_trip(name: str, load_vocab: Callable[[str], Model]) -> None:
    """Each token's text re-tokenizes (parse_special) to ids that detokenize to that text (test-tokenizer-1-spm)."""
    vocab = load_vocab(name).vocab
    assert vocab.type == VocabType.SPM
    bad = []
    for i in range(vocab.n_vocab):
        text = vocab.detokenize_bytes([i], remove_special=False, unparse_special=True)
        toks = vocab.tokenize(text, add_special=False, parse_special=True)
        check = vocab.detokenize_bytes(toks, remove_special=False, unparse_special=True)
        if check != text:
            bad.append(f"token {i}: {text!r} -> {toks.tolist()} -> {check!r}")
    assert not bad, f"{len(bad)} tokens do not round-trip:\n" + "\n".join(bad[:20])


@pytest.mark.parametrize("name", SPM_ROUND_TRIP_VOCABS, ids=_id)
def test_spm_codepoint_round_trip(name: str, load_vocab: Callable[[str], Model]) -> None:
    """Every defined code point except U+2581 round-trips through tokenize/detokenize (test-tokenizer-1-spm)."""
    vocab = load_vocab(name).vocab
    bad = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF or 0x40000 <= cp <= 0xE0000:  # surrogates, unassigned planes (as in the C++)
            continue
        text = chr(cp).encode()
        toks = vocab.tokenize(text, add_special=False, parse_special=True)
        check = vocab.detokenize_bytes(toks, remove_special=False, unparse_special=True)
        if cp != 0x2581 and check != text:
            bad.append(f"U+{cp:04X}: {text!r} -> {toks.tolist()} -> {check!r}")
    assert not bad, f"{len(bad)} code points do not round-trip:\n" + "\n".join(bad[:20])


@pytest.mark.parametrize("name", _params(VOCABS_WITHOUT_DATA), ids=_id)
def test_vocab_without_data_loads_and_tokenizes(name: str, load_vocab: Callable[[str], Model]) -> None:
    """A shipped vocab-only model without .inp/.out loads and tokenizes a short string into in-range ids."""
    model = load_vocab(name)
    toks = model.tokenize(SMOKE_TEXT)
    assert toks.dtype == np.int32 and len(toks) > 0
    assert 0 <= int(toks.min()) and int(toks.max()) < model.n_vocab
