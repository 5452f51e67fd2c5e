"""Grammar engines side by side: samplers.grammar against llguidance, xgrammar and outlines-core.

Every engine works on the same vocabulary, the default model's (Gemma 3 270M, 262,144
tokens): each peer's tokenizer is built from our byte pieces
(``vocab.token_to_piece(t, special=True)`` for every token, the end-of-generation ids
from ``vocab.eog_tokens()``), and each engine constrains the same token sequences.

Grammars: JSON schemas of increasing size (a flat object; nested arrays of objects; 18
optional properties; ``anyOf``; a person record with patterns, an enum, an integer
range, a date and a bounded array), each compiled by the engine's own JSON-schema
compiler (ours: ``Grammar.from_json_schema``, llama.cpp's converter; llguidance:
``LLMatcher.grammar_from_json_schema``; xgrammar: ``GrammarCompiler.compile_json_schema``;
outlines-core: ``build_regex_from_schema`` + ``Index``), and generic JSON, llama.cpp's
``grammars/json.gbnf`` (ours: ``Grammar.from_gbnf``; llguidance: ``grammar_from("gbnf",
...)``, its GBNF-to-Lark converter; xgrammar: ``Grammar.from_ebnf``; outlines-core has
no grammars, so it runs the ``{"type": "object"}`` schema instead, a regular
approximation of JSON nested three levels deep).

For each grammar a JSON document written by hand (valid for the schema, 60 tokens or
more, with nesting, escapes and non-ASCII characters) is tokenized with
``m.tokenize(text, add_special=False)``; each engine accepts those tokens one by one
and computes, before each token and after the last, a packed bitmask over the whole
vocabulary (bit ``t % 32`` of 32-bit word ``t // 32``): ours ``matcher.fill_mask``,
llguidance ``LLMatcher.unsafe_compute_mask_ptr``, xgrammar
``GrammarMatcher.fill_next_token_bitmask`` (a numpy array through DLPack), outlines-core
``Guide.write_mask_into``. An engine that refuses a token stops there (the step is
reported).

Each (engine, grammar) runs in a fresh child process (this script with ``--child``),
rounds interleaved across engines, medians across rounds. Measured: the vocabulary
set-up from the pieces (ours: the vocabulary index ``g.compile(model)`` loads from its
disk cache, or builds and saves once per vocabulary; the pieces themselves, read through llama.cpp for every
engine, are not counted), the compile time of the grammar (schema or text to a
matcher), and the time of each mask: the first separately, then median, p90, p99 and
max of the others, and the total (set-up, compile, every mask and every accepted token).
Ours runs in two modes: ``ours`` (``g.compile``: masks cached by parser state) and
``ours-nocache`` (``g.compile(..., mask_cache_size=0)``: every mask computed). The
masks of the first round are compared with ours step by step ("agreement"); a
difference is reported (tokens, example pieces, grouped by kind), never an error. Each
engine compiles a schema with its own defaults (whitespace: llguidance and xgrammar any
JSON whitespace, outlines-core at most one space, llama.cpp nothing, one space, or one
or two newlines and up to 20 indents; xgrammar and outlines-core also take the ``\\/``
escape), so on schemas the allowed sets differ by design; on json.gbnf ours,
llguidance and xgrammar run the same grammar.

A peer that is not installed or cannot run is reported as ``skipped: <reason>``;
outlines-core's compile (and any engine's) is stopped after ``--compile-timeout``
seconds and reported as a timeout.

Install the peers: ``pip install -e ".[grammar-bench]"`` (the pinned versions; pip then
also installs xgrammar's requirements torch, transformers and triton, gigabytes), or,
lighter, what this script needs::

    pip install "llguidance==1.9.1" "outlines-core==0.2.14"
    # xgrammar without torch/transformers/triton: CPU masks need none of them (the child
    # process gives xgrammar stub modules for the names it reads at import time)
    pip install --no-deps "xgrammar==0.2.8"
    pip install pydantic "apache-tvm-ffi>=0.1.11" "typing-extensions>=4.9"

Run::

    python benchmarks/bench_grammar_peers.py [--rounds 3] [--quick] [--engines ours,xgrammar]
        [--grammars flat,json] [--compile-timeout 60] [--model PATH] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import command_line, run_child, self_peak_rss_kib, wait_quiet, write_json  # noqa: E402

Mask = npt.NDArray[np.uint32]

#: ``ours-nocache-pycore``: ``ours-nocache`` with the grammar engine's Python core (the
#: reference), to compare the C core with in the same run
ENGINES = ("ours", "ours-nocache", "ours-nocache-pycore", "llguidance", "xgrammar", "outlines")
#: the distribution each peer engine comes from, and the version this script was written for
PEERS = {
    "llguidance": ("llguidance", "1.9.1"),
    "xgrammar": ("xgrammar", "0.2.8"),
    "outlines": ("outlines-core", "0.2.14"),
}
QUICK_GRAMMARS = ("flat", "person", "json")


# ---------------------------------------------------------------------- the grammars
def _obj(props: dict[str, Any], required: Sequence[str] | None = None) -> dict[str, Any]:
    """An object schema that allows no other property, ``required`` (default: all) first."""
    req = list(props) if required is None else list(required)
    return {"type": "object", "properties": props, "required": req, "additionalProperties": False}


_S: dict[str, Any] = {"type": "string"}
_I: dict[str, Any] = {"type": "integer"}
_N: dict[str, Any] = {"type": "number"}
_B: dict[str, Any] = {"type": "boolean"}


def _strings() -> dict[str, Any]:
    return {"type": "array", "items": _S}


@dataclass(frozen=True)
class Case:
    """One grammar: a JSON schema (``schema``) or llama.cpp's json.gbnf (``schema`` None),
    and a document all engines should accept."""

    name: str
    what: str
    schema: dict[str, Any] | None
    doc: str


CASES: dict[str, Case] = {
    c.name: c
    for c in [
        Case(
            "flat",
            "flat object, 6 properties",
            _obj({"name": _S, "age": _I, "email": _S, "active": _B, "score": _N, "city": _S}),
            '{"name": "Zoë \\"Zed\\" Müller-Lüdenscheidt", "age": 42, "email": "zoe.mueller@example.com", '
            '"active": true, "score": 98.25, "city": "Zürich, the city by the lake\\nand a \\\\ backslash, '
            'with Straße and Bäckerei"}',
        ),
        Case(
            "nested",
            "nested arrays of objects",
            _obj(
                {
                    "order_id": _I,
                    "customer": _obj(
                        {
                            "name": _S,
                            "addresses": {"type": "array", "items": _obj({"street": _S, "city": _S, "zip": _S})},
                        }
                    ),
                    "lines": {
                        "type": "array",
                        "items": _obj({"sku": _S, "qty": _I, "price": _N, "tags": _strings()}),
                    },
                }
            ),
            '{"order_id": 98231, "customer": {"name": "Ana Núñez", "addresses": [{"street": "Calle Mayor 5", '
            '"city": "Málaga", "zip": "29001"}, {"street": "12 \\"Old\\" Road", "city": "Cork", "zip": "T12"}]}, '
            '"lines": [{"sku": "A-100", "qty": 2, "price": 19.99, "tags": ["new", "gift\\twrap"]}, '
            '{"sku": "B-7", "qty": 1, "price": 5, "tags": []}, {"sku": "C-42", "qty": 12, "price": 0.5, '
            '"tags": ["bulk", "café"]}]}',
        ),
        Case(
            "optional",
            "18 optional properties (1 required)",
            _obj(
                {
                    "id": _I,
                    "title": _S,
                    "subtitle": _S,
                    "author": _S,
                    "year": _I,
                    "pages": _I,
                    "isbn": _S,
                    "language": _S,
                    "publisher": _S,
                    "edition": _I,
                    "price": _N,
                    "in_stock": _B,
                    "rating": _N,
                    "tags": _strings(),
                    "series": _S,
                    "translator": _S,
                    "illustrated": _B,
                    "summary": _S,
                    "notes": _S,
                },
                required=["id"],
            ),
            '{"id": 7, "title": "Der Zauberberg", "author": "Thomas Mann", "year": 1924, "language": "de", '
            '"publisher": "S. Fischer", "price": 24.5, "in_stock": true, "tags": ["novel", "klassiker"], '
            '"translator": "John E. Woods", "summary": "Hans Castorp visits his cousin in Davos, Graubünden, '
            '\\"for three weeks\\" and stays seven years.\\nA novel of ideas, in a sanatorium high in the Alps."}',
        ),
        Case(
            "anyof",
            "anyOf: events of three kinds, a nullable union",
            _obj(
                {
                    "session": _S,
                    "events": {
                        "type": "array",
                        "items": {
                            "anyOf": [
                                _obj({"kind": {"const": "click"}, "x": _I, "y": _I}),
                                _obj({"kind": {"const": "key"}, "key": _S, "shift": _B}),
                                _obj({"kind": {"const": "scroll"}, "dy": _N}),
                            ]
                        },
                    },
                    "note": {"anyOf": [_S, {"type": "null"}, _I]},
                }
            ),
            '{"session": "s-2024-11-03", "events": [{"kind": "click", "x": 120, "y": -4}, {"kind": "key", '
            '"key": "é", "shift": false}, {"kind": "scroll", "dy": -2.5}, {"kind": "key", "key": "\\"", '
            '"shift": true}, {"kind": "click", "x": 0, "y": 33}], "note": "user typed \\"é\\" then '
            'scrolled \\\\ clicked, naïvely"}',
        ),
        Case(
            "person",
            "person: patterns, enum, integer range, date, bounded array",
            _obj(
                {
                    "name": {"type": "string", "pattern": "^[A-Z][a-z]+( [A-Z][a-z]+)*$"},
                    "age": {"type": "integer", "minimum": 0, "maximum": 150},
                    "role": {"enum": ["admin", "editor", "viewer"]},
                    "phone": {"type": "string", "pattern": "^\\+[0-9]{1,3}-[0-9]{3}-[0-9]{4}$"},
                    "birthday": {"type": "string", "format": "date"},
                    "hobbies": {"type": "array", "items": _S, "minItems": 1, "maxItems": 4},
                    "address": _obj(
                        {"street": _S, "city": _S, "country": {"enum": ["DE", "FR", "JP", "US"]}},
                    ),
                    "bio": _S,
                }
            ),
            '{"name": "Grace Brewster Hopper", "age": 85, "role": "admin", "phone": "+1-555-0199", '
            '"birthday": "1906-12-09", "hobbies": ["COBOL", "sailing", "teaching \\"nanoseconds\\""], '
            '"address": {"street": "Arlington Cemetery", "city": "Arlington", "country": "US"}, '
            '"bio": "Rear admiral; \\"It\'s easier to ask forgiveness\\" — a motto.\\nMark I, Z3 et Zürich."}',
        ),
        Case(
            "json",
            "generic JSON: llama.cpp grammars/json.gbnf",
            None,
            '{"id": 1234, "title": "Crème brûlée \\"deluxe\\"", "tags": ["dessert", "french", "日本"], '
            '"price": 7.5, "available": true, "notes": null, "nutrition": {"kcal": 430, "sugar_g": 32.25, '
            '"allergens": ["milk", "egg"], "source": {"db": "USDA", "verified": false, "id": -17}}, '
            '"path": "C:\\\\recipes\\\\brulee.txt", "rating": -1.5e+3, "comment": "smooth\\tand rich 🍮"}',
        ),
        Case(
            "bounded",
            "bounded strings (maxLength 24/40/256, minLength), patterns with counts, bounded arrays",
            _obj(
                {
                    "username": {
                        "type": "string",
                        "minLength": 3,
                        "maxLength": 24,
                        "pattern": "^[a-z][a-z0-9_]{2,23}$",
                    },
                    "display": {"type": "string", "maxLength": 40},
                    "about": {"type": "string", "minLength": 10, "maxLength": 256},
                    "sku": {"type": "string", "pattern": "^[A-Z]{2,4}-[0-9]{3,6}$"},
                    "scores": {
                        "type": "array",
                        "items": {"type": "integer", "minimum": 0, "maximum": 100},
                        "minItems": 2,
                        "maxItems": 8,
                    },
                    "labels": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 5},
                }
            ),
            '{"username": "grace_h1906", "display": "Grace \\"Amazing\\" Hopper", "about": "Computer scientist '
            'and US Navy rear admiral; she wrote the first compiler (A-0) and made \\"debugging\\" famous: a moth '
            'in the Mark II, 1947. Zürich, Tōkyō, naïve.", "sku": "NAVY-1906", "scores": [100, 97, 88, 0], '
            '"labels": ["cobol", "navy", "compilers"]}',
        ),
        Case(
            "catalog",
            "catalog: $defs and $ref, oneOf, formats (uuid, uri, date-time, email), enums, number ranges",
            {
                "$defs": {
                    "money": _obj(
                        {"amount": {"type": "number", "minimum": 0}, "currency": {"enum": ["EUR", "USD", "JPY"]}}
                    ),
                    "variant": _obj(
                        {
                            "sku": {"type": "string", "pattern": "^[A-Z0-9-]{4,12}$"},
                            "price": {"$ref": "#/$defs/money"},
                            "stock": {"type": "integer", "minimum": 0},
                        }
                    ),
                },
                **_obj(
                    {
                        "id": {"type": "string", "format": "uuid"},
                        "name": {"type": "string", "maxLength": 80},
                        "url": {"type": "string", "format": "uri"},
                        "updated": {"type": "string", "format": "date-time"},
                        "contact": {"type": "string", "format": "email"},
                        "category": {"enum": ["books", "music", "garden", "tools"]},
                        "variants": {
                            "type": "array",
                            "items": {"$ref": "#/$defs/variant"},
                            "minItems": 1,
                            "maxItems": 10,
                        },
                        "shipping": {
                            "oneOf": [
                                _obj({"kind": {"const": "pickup"}, "store": _S}),
                                _obj(
                                    {
                                        "kind": {"const": "post"},
                                        "days": {"type": "integer", "minimum": 1, "maximum": 30},
                                    }
                                ),
                            ]
                        },
                        "rating": {"type": "number", "minimum": 0, "maximum": 5},
                    }
                ),
            },
            '{"id": "3f2b8c1e-9a4d-4e7b-b1c2-5d6e7f8a9b0c", "name": "Gärtnerei-Schere \\"Profi\\" 20 cm", '
            '"url": "https://example.com/shop/garden/scissors?id=42", "updated": "2026-11-27T10:43:00Z", '
            '"contact": "sales@example.com", "category": "garden", "variants": [{"sku": "GS-20-RED", "price": '
            '{"amount": 24.9, "currency": "EUR"}, "stock": 12}, {"sku": "GS-20-BLU", "price": {"amount": 27.5, '
            '"currency": "USD"}, "stock": 0}], "shipping": {"kind": "post", "days": 3}, "rating": 4.5}',
        ),
        Case(
            "config",
            "config: patternProperties, free-form maps, multipleOf, deep nesting",
            _obj(
                {
                    "version": {"type": "integer", "minimum": 1, "maximum": 3},
                    "services": {
                        "type": "object",
                        "patternProperties": {
                            "^[a-z][a-z0-9-]{0,30}$": {
                                **_obj(
                                    {
                                        "image": {"type": "string", "pattern": "^[a-z0-9./-]+:[a-z0-9.-]+$"},
                                        "replicas": {"type": "integer", "minimum": 1, "maximum": 64},
                                        "cpu": {"type": "number", "multipleOf": 0.25, "minimum": 0.25, "maximum": 16},
                                        "env": {
                                            "type": "object",
                                            "additionalProperties": {"type": "string", "maxLength": 64},
                                        },
                                        "ports": {
                                            "type": "array",
                                            "items": {"type": "integer", "minimum": 1, "maximum": 65535},
                                            "maxItems": 4,
                                        },
                                    },
                                    required=["image", "replicas"],
                                ),
                            }
                        },
                        "additionalProperties": False,
                        "minProperties": 1,
                    },
                    "debug": _B,
                },
                required=["version", "services"],
            ),
            '{"version": 2, "services": {"web": {"image": "nginx:1.27", "replicas": 3, "cpu": 0.75, "env": '
            '{"MODE": "prod", "GREETING": "Grüß Gott \\"world\\""}, "ports": [80, 443]}, "db-main": {"image": '
            '"postgres:17.2", "replicas": 1, "cpu": 2.5, "ports": [5432]}}, "debug": false}',
        ),
    ]
}

#: outlines-core has no grammars: for json.gbnf it runs this schema (generic JSON object)
OUTLINES_GENERIC_SCHEMA: dict[str, Any] = {"type": "object"}


def json_gbnf_path() -> Path:
    from benchmarks.native_tools import llama_cpp_source_dir

    return llama_cpp_source_dir() / "grammars" / "json.gbnf"


# ---------------------------------------------------------------------- the child
@dataclass
class Vocabulary:
    pieces: list[bytes]
    eog: list[int]
    bos: int | None
    tokenize: Callable[[bytes], list[int]]

    @property
    def n_vocab(self) -> int:
        return len(self.pieces)


class Skip(Exception):
    """The engine cannot run here (not installed, wrong version, ...)."""


class Runner:
    """One engine: ``load`` (import), ``setup`` (vocabulary), ``compile`` (one grammar), then
    ``mask`` into a uint32 buffer and ``accept`` a token, alternately."""

    notes: list[str]

    def __init__(self) -> None:
        self.notes = []

    def load(self) -> None:
        raise NotImplementedError

    def setup(self, vocab: Vocabulary) -> None:
        raise NotImplementedError

    def compile(self, case: Case, gbnf: str) -> None:
        raise NotImplementedError

    def mask(self, buf: Mask) -> None:
        raise NotImplementedError

    def accept(self, token: int) -> bool:
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        return {}


class Ours(Runner):
    def __init__(self, cache: bool) -> None:
        super().__init__()
        self.cache = cache

    def load(self) -> None:
        # the JSON-schema converter and the metaschema checker (jsonschema) are imported on
        # first use in the package; here at load, as each peer imports its engine whole, so
        # that compile times compare the work of compiling
        import jsonschema

        import samplers.grammar
        import samplers.grammar.schema

        self.sg = samplers.grammar
        del jsonschema

    def setup(self, vocab: Vocabulary) -> None:
        # what g.compile(model) does once per vocabulary (VocabIndex.of), from the same
        # pieces: load the index from the disk cache (keyed by the pieces), or build and
        # save it (the first child of a run on a new machine)
        from samplers.grammar.vocab_index import VocabIndex

        offsets = np.zeros(len(vocab.pieces) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in vocab.pieces], out=offsets[1:])
        eog = np.zeros(len(vocab.pieces), dtype=bool)
        eog[list(vocab.eog)] = True
        self.index = VocabIndex._load_or_build(b"".join(vocab.pieces), offsets, eog, disk_cache=True)
        self.notes.append(f"vocabulary index {'loaded from the disk cache' if self.index.from_cache else 'built'}")

    def compile(self, case: Case, gbnf: str) -> None:
        Grammar = self.sg.Grammar
        g = Grammar.from_gbnf(gbnf) if case.schema is None else Grammar.from_json_schema(case.schema)
        self.compiled = g.compile(self.index) if self.cache else g.compile(self.index, mask_cache_size=0)
        self.matcher = self.compiled.matcher()
        self.fill: Callable[[Mask], None] = self._fill_mask

    def _fill_mask(self, buf: Mask) -> None:
        self.matcher.fill_mask(buf)

    def _fill_from_allowed(self, buf: Mask) -> None:
        packed = np.packbits(self.matcher.allowed_tokens(), bitorder="little")
        raw = buf.view(np.uint8)
        raw[:] = 0
        raw[: len(packed)] = packed

    def mask(self, buf: Mask) -> None:
        try:
            self.fill(buf)
        except Exception as e:
            if self.fill != self._fill_mask:
                raise
            # reported, and measured through the other public call (no cached mask reused on purpose)
            self.notes.append(
                f"matcher.fill_mask raised {type(e).__name__}: {e} (mask_cache_size="
                f"{self.compiled._mask_cache_size}); masks taken with allowed_tokens() + np.packbits instead"
            )
            self.fill = self._fill_from_allowed
            self.fill(buf)

    def accept(self, token: int) -> bool:
        return self.matcher.accept_token(token)

    def stats(self) -> dict[str, Any]:
        return {
            "mask_cache_size": self.compiled._mask_cache_size,
            "mask_hits": self.compiled.stats["mask_hits"],
            "mask_misses": self.compiled.stats["mask_misses"],
            "mask_call": "fill_mask" if self.fill == self._fill_mask else "allowed_tokens+packbits",
            "trie_nodes": self.compiled.n_nodes,
        }


def _check_version(engine: str, notes: list[str]) -> str:
    dist, want = PEERS[engine]
    try:
        have = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        raise Skip(f"{dist} is not installed (pip install {dist}=={want})") from None
    if have != want:
        notes.append(f"{dist} {have} installed; this benchmark was written for {want}")
    return have


class LLGuidance(Runner):
    def load(self) -> None:
        import llguidance

        self.llg = llguidance

    def setup(self, vocab: Vocabulary) -> None:
        llguidance = self.llg
        eog = set(vocab.eog)

        class _Tok:
            # what llguidance.TokenizerWrapper reads: the tokens as bytes, EOS/BOS, a tokenize function
            def __init__(self) -> None:
                self.eos_token_id = vocab.eog[0] if vocab.eog else None
                self.bos_token_id = vocab.bos
                # an EOG token is special (llguidance's mark: a leading 0xFF byte), as in llama.cpp's
                # grammar: allowed where the grammar can end, never matched as text
                self.tokens = [b"\xff" + p if t in eog else p for t, p in enumerate(vocab.pieces)]
                self.special_token_ids: list[int] = []

            def __call__(self, s: bytes | str) -> list[int]:
                return vocab.tokenize(s if isinstance(s, bytes) else s.encode())

        self.tok = llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(_Tok()), n_vocab=vocab.n_vocab, eos_token=vocab.eog
        )

    def compile(self, case: Case, gbnf: str) -> None:
        llg = self.llg
        if case.schema is None:
            grammar = llg.grammar_from("gbnf", gbnf)
        else:
            grammar = llg.LLMatcher.grammar_from_json_schema(case.schema)
        self.matcher = llg.LLMatcher(self.tok, grammar, log_level=0)
        if self.matcher.is_error():
            raise RuntimeError(f"llguidance: {self.matcher.get_error()}")

    def mask(self, buf: Mask) -> None:
        self.matcher.unsafe_compute_mask_ptr(buf.ctypes.data, buf.nbytes)

    def accept(self, token: int) -> bool:
        return bool(self.matcher.consume_token(token)) and not self.matcher.is_error()


def _import_xgrammar() -> Any:
    """xgrammar imports torch and transformers at module level but computes CPU masks into
    any DLPack array: give it stubs of the few names its modules read at import time.
    tvm_ffi (its binding layer) must not see the stub torch: it is imported first with
    torch hidden, so it takes the no-torch path."""
    import importlib.util

    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        sys.modules["torch"] = None  # type: ignore[assignment]  # import torch -> ImportError
        try:
            import tvm_ffi  # noqa: F401
        finally:
            del sys.modules["torch"]
        torch = types.ModuleType("torch")
        torch.__doc__ = "stub for xgrammar's imports (bench_grammar_peers.py): no tensors"

        class Tensor:
            pass

        torch.Tensor = torch.LongTensor = torch.FloatTensor = Tensor  # type: ignore[attr-defined]
        torch.int32 = "int32"  # type: ignore[attr-defined]
        torch.tensor = lambda *a, **k: None  # type: ignore[attr-defined]
        sys.modules["torch"] = torch
    if "transformers" not in sys.modules and importlib.util.find_spec("transformers") is None:
        tr = types.ModuleType("transformers")
        for name in ("PreTrainedTokenizerBase", "PreTrainedTokenizerFast", "LogitsProcessor"):
            setattr(tr, name, type(name, (), {}))
        sys.modules["transformers"] = tr
    import xgrammar

    return xgrammar


class XGrammar(Runner):
    def load(self) -> None:
        self.xgr = _import_xgrammar()

    def setup(self, vocab: Vocabulary) -> None:
        xgr = self.xgr
        info = xgr.TokenizerInfo(
            encoded_vocab=vocab.pieces,
            vocab_type=xgr.VocabType.RAW,
            vocab_size=vocab.n_vocab,
            stop_token_ids=vocab.eog,
            add_prefix_space=False,
        )
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=False)

    def compile(self, case: Case, gbnf: str) -> None:
        xgr = self.xgr
        if case.schema is None:
            # xgrammar's EBNF parser wants an element before the first "|": json.gbnf's
            # `ws ::= | " " | ...` becomes `ws ::= "" | " " | ...` (the same language)
            text, n = re.subn(r"::=(\s*)\|", r'::=\1"" |', gbnf)
            if n:
                self.notes.append(f'json.gbnf: {n} empty first alternative(s) written as "" for its EBNF parser')
            cg = self.compiler.compile_grammar(xgr.Grammar.from_ebnf(text, root_rule_name="root"))
        else:
            cg = self.compiler.compile_json_schema(json.dumps(case.schema))
        self.matcher = xgr.GrammarMatcher(cg)

    def mask(self, buf: Mask) -> None:
        self.matcher.fill_next_token_bitmask(buf.view(np.int32).reshape(1, -1))

    def accept(self, token: int) -> bool:
        return bool(self.matcher.accept_token(token))


class Outlines(Runner):
    def load(self) -> None:
        import outlines_core

        self.oc = outlines_core

    def setup(self, vocab: Vocabulary) -> None:
        eos = vocab.eog[0]
        others = set(vocab.eog[1:])
        if others:
            self.notes.append(f"one EOS only: the other EOG tokens {sorted(others)} are left out of its vocabulary")
        by_piece: dict[bytes, list[int]] = {}
        for t, p in enumerate(vocab.pieces):
            if t != eos and t not in others and p:
                by_piece.setdefault(p, []).append(t)
        self.vocabulary = self.oc.Vocabulary(eos, by_piece)

    def compile(self, case: Case, gbnf: str) -> None:
        oc = self.oc
        schema = OUTLINES_GENERIC_SCHEMA if case.schema is None else case.schema
        if case.schema is None:
            self.notes.append('no grammars: ran the {"type": "object"} schema (JSON nested 3 levels deep)')
        regex = oc.json_schema.build_regex_from_schema(json.dumps(schema))
        self.index = oc.Index(regex, self.vocabulary)
        self.guide = oc.Guide(self.index)

    def mask(self, buf: Mask) -> None:
        self.guide.write_mask_into(buf.ctypes.data, buf.size, 4)

    def accept(self, token: int) -> bool:
        try:
            self.guide.advance(token, return_tokens=False)
        except Exception:
            return False
        return True


def make_runner(engine: str) -> Runner:
    if engine in ("ours", "ours-nocache"):
        return Ours(cache=engine == "ours")
    if engine == "ours-nocache-pycore":
        # the C walk over the engine's Python core (the reference the C core replaced)
        os.environ["LLAMA_CFFI_GRAMMAR_CORE"] = "python"
        return Ours(cache=False)
    cls = {"llguidance": LLGuidance, "xgrammar": XGrammar, "outlines": Outlines}.get(engine)
    if cls is None:
        raise SystemExit(f"unknown engine {engine!r} (known: {', '.join(ENGINES)})")
    return cls()


def load_vocabulary(model_path: Path) -> tuple[Any, Vocabulary]:
    import llama_cffi

    m = llama_cffi.Model.load(model_path, vocab_only=True)
    v = m.vocab
    pieces = [v.token_to_piece(t, special=True) for t in range(v.n_vocab)]

    def tokenize(b: bytes) -> list[int]:
        return [int(t) for t in m.tokenize(b, add_special=False)]

    return m, Vocabulary(pieces, v.eog_tokens(), v.bos, tokenize)


#: ``--warm-compile``: the grammar each child compiles (untimed) before the measured one, so
#: that the compile measured is a new grammar's in a process that has compiled one before
#: (first-use costs apart: imports done, code paths and caches warm, as in a server). A
#: small schema unlike the benchmark's own: an object with a string format, an enum, a
#: pattern, a bounded integer and an array.
WARM_CASE = Case(
    "warm-up",
    "the --warm-compile grammar",
    _obj(
        {
            "when": {"type": "string", "format": "date-time"},
            "level": {"enum": ["low", "mid", "high"]},
            "code": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"},
            "count": {"type": "integer", "minimum": 1, "maximum": 9},
            "tags": {"type": "array", "items": {"type": "string"}},
        }
    ),
    '{"when": "2024-01-02T03:04:05Z", "level": "mid", "code": "ABC12", "count": 3, "tags": []}',
)


def run_engine(
    engine: str, case: Case, model_path: Path, compile_timeout: float, masks_out: Path | None, warm: bool = False
) -> dict[str, Any]:
    """The measurement itself (in the child process)."""
    import faulthandler

    res: dict[str, Any] = {"engine": engine, "grammar": case.name}
    t0 = time.perf_counter()
    _m, vocab = load_vocabulary(model_path)
    res["pieces_s"] = time.perf_counter() - t0
    tokens = vocab.tokenize(case.doc.encode())
    res["n_tokens"] = len(tokens)
    res["n_vocab"] = vocab.n_vocab
    gbnf = json_gbnf_path().read_text() if case.schema is None else ""
    runner = make_runner(engine)
    if engine in PEERS:
        res["version"] = _check_version(engine, runner.notes)
    t0 = time.perf_counter()
    try:
        runner.load()
    except ImportError as e:
        raise Skip(f"import failed: {type(e).__name__}: {e}") from e
    res["import_s"] = time.perf_counter() - t0
    gc.collect()
    t0 = time.perf_counter()
    runner.setup(vocab)
    res["setup_s"] = time.perf_counter() - t0
    if warm:
        t0 = time.perf_counter()
        runner.compile(WARM_CASE, "")
        res["warmup_s"] = time.perf_counter() - t0
    gc.collect()
    faulthandler.dump_traceback_later(compile_timeout, exit=True)  # a C thread: stops Rust/C++ too
    t0 = time.perf_counter()
    try:
        runner.compile(case, gbnf)
    finally:
        faulthandler.cancel_dump_traceback_later()
    res["compile_s"] = time.perf_counter() - t0
    n_words = (vocab.n_vocab + 31) // 32
    buf = np.zeros(n_words, dtype=np.uint32)
    masks = np.zeros((len(tokens) + 1, n_words), dtype=np.uint32)
    mask_s: list[float] = []
    accept_s: list[float] = []
    refused_at: int | None = None
    gc.collect()  # GC stays enabled
    for step in range(len(tokens) + 1):
        buf[:] = 0xFFFFFFFF  # every engine must write all of it
        t = time.perf_counter()
        runner.mask(buf)
        mask_s.append(time.perf_counter() - t)
        masks[step] = buf
        if step == len(tokens):
            break
        t = time.perf_counter()
        ok = runner.accept(tokens[step])
        accept_s.append(time.perf_counter() - t)
        if not ok:
            refused_at = step
            break
    res.update(
        mask_s=mask_s,
        accept_s=accept_s,
        steps=len(mask_s),
        refused_at=refused_at,
        refused_piece=None if refused_at is None else repr(vocab.pieces[tokens[refused_at]]),
        notes=runner.notes,
        engine_stats=runner.stats(),
    )
    if masks_out is not None:
        np.save(masks_out, masks[: len(mask_s)])
    return res


def jsb_cases(archive: Path, sample: int, seed: int) -> dict[str, Case]:
    """``sample`` JSON schemas drawn from JSONSchemaBench (the maskbench archive or its
    folder; see ``bench_schema_realworld.py``), each with its first valid test document
    that our converter's default grammar accepts and that is at least 20 characters long
    (schemas where none is are passed over), drawn with ``seed`` across the paper's
    subsets in turn. Named ``jsb:<file>``."""
    import random

    from benchmarks.bench_schema_realworld import PAPER_SUBSETS as SUBSETS
    from benchmarks.bench_schema_realworld import data_dir
    from samplers.grammar import Grammar

    folder = data_dir(archive)
    rng = random.Random(seed)
    pools = {s: sorted(folder.glob(f"{s}---*.json")) for s in SUBSETS}
    for files in pools.values():
        rng.shuffle(files)
    out: dict[str, Case] = {}
    while len(out) < sample and any(pools.values()):
        for s in SUBSETS:
            if not pools[s] or len(out) >= sample:
                continue
            f = pools[s].pop()
            d = json.loads(f.read_text(encoding="utf-8"))
            docs = [json.dumps(t["data"], ensure_ascii=False) for t in d.get("tests", []) if t.get("valid")]
            docs = [x for x in docs if len(x) >= 20]
            if not docs:
                continue
            try:
                g = Grammar.from_json_schema(d["schema"])
                doc = next((x for x in docs if g.accepts(x)), None)
            except Exception:
                continue
            if doc is not None:
                out[f"jsb:{f.name}"] = Case(f"jsb:{f.name}", f"JSONSchemaBench {s}", d["schema"], doc)
    return out


def child_main(args: argparse.Namespace) -> int:
    engine, name = args.child
    if args.cases_file is not None:
        for k, v in json.loads(args.cases_file.read_text(encoding="utf-8")).items():
            CASES.setdefault(k, Case(k, v["what"], v["schema"], v["doc"]))
    case = CASES[name]
    try:
        res = run_engine(engine, case, args.model, args.compile_timeout, args.masks_out, args.warm_compile)
    except Skip as e:
        res = {"engine": engine, "grammar": name, "skipped": str(e)}
    except Exception as e:
        res = {"engine": engine, "grammar": name, "failed": f"{type(e).__name__}: {e}"}
    print("RESULT " + json.dumps(res), flush=True)
    return 0


# ---------------------------------------------------------------------- the parent
def pct(xs: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if len(xs) else math.nan


def summarize(res: dict[str, Any]) -> dict[str, float]:
    """One child's numbers, in milliseconds (mask statistics over the steps after the first)."""
    ms = [x * 1e3 for x in res["mask_s"]]
    rest = ms[1:] or ms
    return {
        "import_ms": res["import_s"] * 1e3,
        "setup_ms": res["setup_s"] * 1e3,
        "compile_ms": res["compile_s"] * 1e3,
        "first_ms": ms[0],
        "median_ms": statistics.median(rest),
        "p90_ms": pct(rest, 90),
        "p99_ms": pct(rest, 99),
        "max_ms": max(rest),
        "masks_ms": sum(ms),
        "accept_ms": sum(res["accept_s"]) * 1e3,
        "total_ms": (res["setup_s"] + res["compile_s"] + sum(res["mask_s"]) + sum(res["accept_s"])) * 1e3,
    }


def classify(piece: bytes, eog: bool) -> str:
    """Why a token's piece might be treated differently by two JSON grammars."""
    if eog:
        return "EOG"
    if piece and all(b in b" \t\n\r" for b in piece):
        return "whitespace only"
    if len(piece) == 1 and piece[0] >= 0xF5:
        return "byte 0xF5-0xFF"
    try:
        text = piece.decode("utf-8")
    except UnicodeDecodeError:
        return "not UTF-8 (byte / partial character)"
    if "\\/" in text:
        return "escape \\/"
    if any(0x7F <= ord(c) <= 0x9F for c in text):
        return "U+007F-U+009F"
    return "other"


def one_line(text: str, limit: int = 200) -> str:
    """A table cell: one line, no pipe, at most ``limit`` characters."""
    s = " ".join(text.split()).replace("|", "/")
    return s if len(s) <= limit else s[: limit - 1] + "…"


def compare(
    ours: npt.NDArray[np.uint32], peer: npt.NDArray[np.uint32], pieces: list[bytes], eog: set[int], n_vocab: int
) -> dict[str, Any]:
    """Step-by-step agreement of two mask sequences (compared where both exist)."""
    n = min(len(ours), len(peer))
    a = np.unpackbits(ours[:n].view(np.uint8), axis=1, bitorder="little")[:, :n_vocab].astype(bool)
    b = np.unpackbits(peer[:n].view(np.uint8), axis=1, bitorder="little")[:, :n_vocab].astype(bool)
    only_ours = a & ~b
    only_peer = b & ~a
    differ = (only_ours | only_peer).any(axis=1)
    out: dict[str, Any] = {
        "steps_compared": n,
        "steps_equal": int(n - differ.sum()),
        "first_difference": int(np.flatnonzero(differ)[0]) if differ.any() else None,
        "allowed_ours_median": float(np.median(a.sum(axis=1))) if n else math.nan,
        "allowed_peer_median": float(np.median(b.sum(axis=1))) if n else math.nan,
    }
    for side, m in (("only_ours", only_ours), ("only_peer", only_peer)):
        toks = np.flatnonzero(m.any(axis=0))
        steps = m.sum(axis=0)
        kinds: dict[str, int] = {}
        examples: dict[str, list[str]] = {}
        for t in toks[np.argsort(-steps[toks], kind="stable")].tolist():  # most steps first
            k = classify(pieces[t], t in eog)
            kinds[k] = kinds.get(k, 0) + 1
            if kinds[k] <= 4:
                examples.setdefault(k, []).append(f"{t}:{pieces[t]!r} ({int(steps[t])} steps)")
        out[side] = {
            "tokens": len(toks),
            "token_steps": int(m.sum()),
            "steps": int(m.any(axis=1).sum()),
            "kinds": kinds,
            "examples": examples,
        }
    return out


def agreement_text(cmp: dict[str, Any] | None) -> str:
    if cmp is None:
        return "n/a"
    n, eq = cmp["steps_compared"], cmp["steps_equal"]
    if n == eq:
        return f"exact ({eq}/{n})"
    return f"{eq}/{n} steps; -{cmp['only_ours']['tokens']}/+{cmp['only_peer']['tokens']} tok"


def fmt(x: float) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def run_children(args: argparse.Namespace, engines: list[str], grammars: list[str], tmp: Path) -> dict[str, Any]:
    """Every (engine, grammar) once per round, in a fresh child; the order rotates per round."""
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {(e, g): [] for e in engines for g in grammars}
    todo = list(engines)
    if "ours" not in todo:
        todo.append("ours")  # the reference masks (first round only, not reported)
    script = Path(__file__).resolve()
    for r in range(args.rounds):
        for gi, g in enumerate(grammars):
            k = (r + gi) % len(todo)
            order = todo[k:] + todo[:k]
            for e in order:
                if e not in engines and r > 0:
                    continue
                if r > 0 and any(not x.get("mask_s") for x in runs[(e, g)]):
                    continue  # skipped, failed or timed out once: not again
                cmd = [sys.executable, str(script), "--child", e, g, "--model", str(args.model)]
                cmd += ["--compile-timeout", str(args.compile_timeout)]
                if args.warm_compile:
                    cmd.append("--warm-compile")
                if args.cases_file is not None:
                    cmd += ["--cases-file", str(args.cases_file)]
                if r == 0:
                    cmd += ["--masks-out", str(tmp / f"{e}-{g}.npy")]
                if args.quiet_wait > 0:
                    wait_quiet(0.5, args.quiet_wait)  # another benchmark running: wait a little for a lull
                child = run_child(cmd, cwd=ROOT, timeout=args.compile_timeout + args.child_timeout)
                res = parse_child(child, e, g, args.compile_timeout)
                res["peak_rss_kib"] = child.peak_rss_kib
                res["wall_s"] = child.wall_s
                res["foreign_cores"] = child.foreign_cores
                runs.setdefault((e, g), []).append(res)
                status = res.get("skipped") or res.get("failed") or res.get("timeout")
                if status is None:
                    status = f"compile {res['compile_s'] * 1e3:.1f} ms, {res['steps']} masks"
                    if res.get("refused_at") is not None:
                        status += f", refused token {res['refused_at']}"
                print(f"  round {r + 1}/{args.rounds} {g:9s} {e:13s} {status}", flush=True)
    return {"runs": runs}


def parse_child(child: Any, engine: str, grammar: str, compile_timeout: float) -> dict[str, Any]:
    for line in reversed(child.stdout.splitlines()):
        if line.startswith("RESULT "):
            res: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return res
    if "Timeout (" in child.stderr or child.timed_out:
        return {"engine": engine, "grammar": grammar, "timeout": f"timeout: compile > {compile_timeout:g} s"}
    tail = (child.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"engine": engine, "grammar": grammar, "failed": f"child exited with {child.returncode}: {tail}"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--engines",
        default=",".join(e for e in ENGINES if e != "ours-nocache-pycore"),
        help=f"comma-separated, of {', '.join(ENGINES)} (default: all but ours-nocache-pycore)",
    )
    ap.add_argument("--grammars", default=None, help=f"comma-separated, of {', '.join(CASES)} (default: all)")
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK_GRAMMARS)}")
    ap.add_argument("--compile-timeout", type=float, default=60.0, help="seconds per grammar compile (default 60)")
    ap.add_argument("--child-timeout", type=float, default=120.0, help=argparse.SUPPRESS)
    ap.add_argument(
        "--quiet-wait", type=float, default=2.0, help="seconds to wait for other load to stop before each child"
    )
    ap.add_argument(
        "--model", type=Path, default=None, help="GGUF whose vocabulary to use (default: the default model)"
    )
    ap.add_argument("--json", type=Path, help="also write the results here, as JSON")
    ap.add_argument(
        "--warm-compile",
        action="store_true",
        help="each child compiles another grammar first (untimed): compile times of a new grammar in a warm process",
    )
    ap.add_argument("--child", nargs=2, metavar=("ENGINE", "GRAMMAR"), help=argparse.SUPPRESS)
    ap.add_argument("--masks-out", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cases-file", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument(
        "--jsb",
        type=Path,
        default=None,
        help="JSONSchemaBench's maskbench archive (or folder): add --jsb-sample schemas drawn from it",
    )
    ap.add_argument("--jsb-sample", type=int, default=10, help="schemas drawn from --jsb (default 10)")
    ap.add_argument("--jsb-seed", type=int, default=0, help="seed of the --jsb draw (default 0)")
    args = ap.parse_args(argv)
    if args.model is None:
        import llama_cffi

        args.model = llama_cffi.default_model_path()
    if args.child:
        return child_main(args)

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    for e in engines:
        if e not in ENGINES:
            ap.error(f"unknown engine {e!r} (known: {', '.join(ENGINES)})")
    if args.grammars:
        grammars = [g.strip() for g in args.grammars.split(",") if g.strip()]
    else:
        grammars = list(QUICK_GRAMMARS if args.quick else CASES)
    if args.jsb is not None:
        extra = jsb_cases(args.jsb, args.jsb_sample, args.jsb_seed)
        CASES.update(extra)
        grammars += list(extra)
        cases_dir = Path(tempfile.mkdtemp(prefix="bench_grammar_peers-cases-"))
        args.cases_file = cases_dir / "cases.json"
        args.cases_file.write_text(
            json.dumps({k: {"what": c.what, "schema": c.schema, "doc": c.doc} for k, c in extra.items()}),
            encoding="utf-8",
        )
    for g in grammars:
        if g not in CASES:
            ap.error(f"unknown grammar {g!r} (known: {', '.join(CASES)})")

    m, vocab = load_vocabulary(args.model)
    eog = set(vocab.eog)
    print(f"vocabulary: {args.model.name}, {vocab.n_vocab} tokens, EOG {sorted(eog)}")
    n_tokens = {g: len(vocab.tokenize(CASES[g].doc.encode())) for g in grammars}
    for g in grammars:
        print(f"  {g:9s} {CASES[g].what}: document of {n_tokens[g]} tokens")
    import llama_cffi

    versions: dict[str, str | None] = {}
    for e in engines:
        if e not in PEERS:
            versions[e] = f"llama_cffi {llama_cffi.__version__}"
        else:
            try:
                versions[e] = importlib.metadata.version(PEERS[e][0])
            except importlib.metadata.PackageNotFoundError:
                versions[e] = None
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_grammar_peers-") as tmpdir:
        tmp = Path(tmpdir)
        runs = run_children(args, engines, grammars, tmp)["runs"]
        agreement: dict[tuple[str, str], dict[str, Any] | None] = {}
        for e in engines:
            for g in grammars:
                a, b = tmp / f"ours-{g}.npy", tmp / f"{e}-{g}.npy"
                agreement[(e, g)] = (
                    compare(np.load(a), np.load(b), vocab.pieces, eog, vocab.n_vocab)
                    if a.exists() and b.exists() and e != "ours"
                    else None
                )
    elapsed = time.perf_counter() - t_start

    results: list[dict[str, Any]] = []
    for g in grammars:
        for e in engines:
            rs = runs[(e, g)]
            row: dict[str, Any] = {"engine": e, "grammar": g, "rounds": rs}
            bad = next((r for r in rs if not r.get("mask_s")), None)
            if bad is not None:
                if bad.get("skipped"):
                    row["status"] = f"skipped: {bad['skipped']}"
                else:
                    row["status"] = bad.get("timeout") or f"failed: {bad.get('failed')}"
            else:
                sums = [summarize(r) for r in rs]
                row["status"] = "ok"
                row["median"] = {k: statistics.median(s[k] for s in sums) for k in sums[0]}
                row["steps"] = rs[0]["steps"]
                row["refused_at"] = rs[0].get("refused_at")
                row["refused_piece"] = rs[0].get("refused_piece")
                row["notes"] = sorted({n for r in rs for n in r.get("notes", [])})
                row["engine_stats"] = rs[0].get("engine_stats")
            row["agreement"] = agreement[(e, g)]
            results.append(row)

    print_report(results, engines, grammars, n_tokens, vocab, args, elapsed, versions)
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "bench_grammar_peers",
                "command": command_line(sys.argv[1:] if argv is None else argv),
                "config": {
                    "rounds": args.rounds,
                    "engines": engines,
                    "grammars": grammars,
                    "compile_timeout_s": args.compile_timeout,
                    "model": str(args.model),
                },
                "n_vocab": vocab.n_vocab,
                "eog": sorted(eog),
                "peer_versions": versions,
                "cases": {
                    g: {"what": CASES[g].what, "schema": CASES[g].schema, "doc": CASES[g].doc, "tokens": n_tokens[g]}
                    for g in grammars
                },
                "results": results,
                "elapsed_s": elapsed,
                "peak_rss_kib": self_peak_rss_kib(),
            },
        )
    del m
    return 0


#: issue 41's goals, per measure: (key, label, the goal in words, test of ours against the peer)
GOALS: list[tuple[str, str, str, Callable[[float, float], bool]]] = [
    ("median_ms", "mask median", "≤ llguidance's or ≤ 0.01 ms", lambda o, p: o <= p or o <= 0.01),
    ("p99_ms", "mask p99", "≤ llguidance's or ≤ 0.5 ms", lambda o, p: o <= p or o <= 0.5),
    ("max_ms", "mask max", "≤ 2 ms", lambda o, p: o <= 2.0),
    ("first_ms", "first mask", "≤ 0.3 ms", lambda o, p: o <= 0.3),
    ("compile_ms", "compile", "≤ 5 ms", lambda o, p: o <= 5.0),
]


def goal_summary(results: list[dict[str, Any]], grammars: list[str], ours: str = "ours-nocache") -> None:
    """Ours (every mask computed) against llguidance over the grammars both ran: per
    measure, the ratio's median and range, ours' median and how many grammars meet the goal."""
    by = {(r["engine"], r["grammar"]): r.get("median") for r in results if r.get("status") == "ok"}
    pairs = [
        (by[(ours, g)], by[("llguidance", g)]) for g in grammars if by.get((ours, g)) and by.get(("llguidance", g))
    ]
    if not pairs:
        return
    print(
        f"Summary over the {len(pairs)} grammars both ran: {ours} / llguidance in the same run, and issue 41's goals."
    )
    print()
    print("| measure | ratio median (range) | ours median over grammars | goal | meeting it |")
    print("| --- | --- | ---: | --- | ---: |")
    for key, label, goal, ok in GOALS:
        ratios = [o[key] / p[key] for o, p in pairs if p[key] > 0]
        meet = sum(ok(o[key], p[key]) for o, p in pairs)
        rng = f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})" if ratios else "–"
        mid = fmt(statistics.median(o[key] for o, _ in pairs))
        print(f"| {label} | {rng} | {mid} ms | {goal} | {meet}/{len(pairs)} |")
    print()


def print_report(
    results: list[dict[str, Any]],
    engines: list[str],
    grammars: list[str],
    n_tokens: dict[str, int],
    vocab: Vocabulary,
    args: argparse.Namespace,
    elapsed: float,
    versions: dict[str, str | None],
) -> None:
    print()
    print(
        f"## Grammar engines, {vocab.n_vocab:,}-token vocabulary: medians of {args.rounds} round(s), "
        f"each engine and grammar in a fresh process ({elapsed:.0f} s)"
    )
    print()
    loads = [
        x["foreign_cores"] for r in results for x in r["rounds"] if math.isfinite(x.get("foreign_cores", math.nan))
    ]
    if loads:
        print(
            f"Other processes used {statistics.median(loads):.2f} cores (median; max {max(loads):.2f}) "
            f"while the children ran, on {os.cpu_count()} cores."
        )
        print()
    if args.warm_compile:
        print(
            "Compile times are a new grammar's in a warm process: each child compiled another grammar "
            "first (`--warm-compile`, untimed)."
        )
        print()
    goal_summary(results, grammars)
    print("Vocabulary set-up from the byte pieces (once per vocabulary), medians over every child; import apart:")
    print()
    print("| engine | version | import ms | set-up ms |")
    print("| --- | --- | ---: | ---: |")
    for e in engines:
        ok = [r["median"] for r in results if r["engine"] == e and r.get("median")]
        version = versions.get(e) or "–"
        if ok:
            imp = statistics.median(x["import_ms"] for x in ok)
            setup = statistics.median(x["setup_ms"] for x in ok)
            print(f"| {e} | {version} | {fmt(imp)} | {fmt(setup)} |")
        else:
            status = next((r["status"] for r in results if r["engine"] == e), "not run")
            print(f"| {e} | {version} | {one_line(str(status))} |  |")
    print()
    print(
        "Per grammar: compile (schema or text to a matcher), the first mask, then the other masks "
        "(full vocabulary, packed bits), total = set-up + compile + masks + accepts; agreement: "
        "steps whose allowed-token set equals ours (-N: tokens only ours allows, +N: only the peer)."
    )
    print()
    print(
        "| grammar | engine | compile ms | first mask ms | mask median ms | p90 | p99 | max | total ms | steps |"
        " agreement with ours |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in results:
        g, e = r["grammar"], r["engine"]
        label = f"{g} ({n_tokens[g]} tok)"
        if r["status"] != "ok":
            print(f"| {label} | {e} | {one_line(r['status'])} |  |  |  |  |  |  |  |  |")
            continue
        md = r["median"]
        steps = f"{r['steps']}"
        if r.get("refused_at") is not None:
            steps += f" (refused token {r['refused_at']})"
        agree = "(reference)" if e == "ours" else agreement_text(r["agreement"])
        print(
            f"| {label} | {e} | {fmt(md['compile_ms'])} | {fmt(md['first_ms'])} | {fmt(md['median_ms'])} | "
            f"{fmt(md['p90_ms'])} | {fmt(md['p99_ms'])} | {fmt(md['max_ms'])} | {fmt(md['total_ms'])} | "
            f"{steps} | {agree} |"
        )
    print()
    notes: list[str] = []
    for r in results:
        tag = f"{r['engine']} / {r['grammar']}"
        if r.get("refused_at") is not None:
            notes.append(f"{tag}: refused token {r['refused_at']} ({r['refused_piece']}); stopped there")
        for n in r.get("notes") or []:
            notes.append(f"{tag}: {n}")
        st = r.get("engine_stats") or {}
        if st.get("mask_cache_size") == 0 and st.get("mask_hits"):
            notes.append(
                f"{tag}: mask_cache_size=0 but {st['mask_hits']} of {st['mask_hits'] + st['mask_misses']} "
                "masks were reused (CompiledGrammar.stats['mask_hits'])"
            )
        c = r.get("agreement")
        if c and c["steps_equal"] != c["steps_compared"]:
            for side, who in (("only_ours", "only ours allows"), ("only_peer", f"only {r['engine']} allows")):
                d = c[side]
                if d["tokens"]:
                    kinds = "; ".join(
                        f"{k}: {v}, e.g. {', '.join(d['examples'][k][:3])}" for k, v in sorted(d["kinds"].items())
                    )
                    notes.append(f"{tag}: {who} {d['tokens']} tokens at {d['steps']} steps. {kinds}")
    if notes:
        print("Notes:")
        for n in notes:
            print(f"- {n}")
        print()


if __name__ == "__main__":
    raise SystemExit(main())
