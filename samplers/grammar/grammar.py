"""A GBNF grammar: vocabulary-free, compiled per vocabulary on demand."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Sequence
from typing import Any

from llama_cffi._args import expect, expect_int, expect_str, type_error
from llama_cffi.gbnf import GrammarError, ParsedGrammar, check_grammar, parse_gbnf, resolve_tokens

from .compiled import CompiledGrammar
from .engine import MAX_CELLS, MAX_STACKS, Engine, default_core
from .matcher import GrammarMatcher
from .vocab_index import VocabIndex

_NO_TOKEN = 2**31 - 1  # stands for named tokens when there is no vocabulary: matches nothing


def _check_json_schema(schema: object, name: str = "json_schema") -> None:
    """``schema`` is something :meth:`Grammar.from_json_schema` reads (what
    :func:`samplers.grammar.schema.schema_of` takes), else the
    :class:`~llama_cffi.errors.ParamTypeError` naming ``name`` (the caller's parameter)."""
    if schema is None or isinstance(schema, (str, dict, bool, list, int, float)):
        return
    if callable(getattr(schema, "model_json_schema", None)) or callable(getattr(schema, "json_schema", None)):
        return
    raise type_error(name, "a JSON schema (a dict, a bool, JSON text or a pydantic model)", schema)


class Grammar:
    """A parsed, checked grammar with a start rule.

    Make one with :meth:`from_gbnf` (or :meth:`from_json_schema`); test whole strings
    with :meth:`accepts`; :meth:`compile` it for a model's vocabulary to get token masks
    and matchers. Immutable and shareable; compiled forms are cached per vocabulary.

    ``max_stacks`` bounds the work of every step and mask: a parser state of more stacks
    than that (an ambiguous grammar multiplies its stacks with every character) raises
    :class:`~samplers.grammar.errors.GrammarBudgetError` instead of taking unbounded time
    and memory. ``max_cells`` bounds the engine's memory: the distinct stacks and states it
    keeps in all, and its transition table at 16 entries (states x character classes) per
    cell; past it, :class:`~samplers.grammar.errors.GrammarBudgetError` too. The default
    (4,194,304) holds a word list of about 10,000 words of distinct CJK characters.
    """

    def __init__(
        self, parsed: ParsedGrammar, root: str = "root", max_stacks: int = MAX_STACKS, max_cells: int = MAX_CELLS
    ) -> None:
        expect("parsed", parsed, ParsedGrammar, "a ParsedGrammar (use Grammar.from_gbnf)")
        expect_str("root", root)
        check_grammar(parsed, root)
        self.parsed = parsed
        self.root = root
        self.max_stacks = max_stacks
        self.max_cells = max_cells
        self._engines: dict[str, Engine] = {}  # per engine core
        self._engine = self._engine_for(default_core())
        #: per llama_cffi vocabulary, per mask cache size
        self._compiled: weakref.WeakKeyDictionary[Any, dict[tuple[int, str], CompiledGrammar]] = (
            weakref.WeakKeyDictionary()
        )

    @classmethod
    def from_gbnf(
        cls, text: str, root: str = "root", max_stacks: int = MAX_STACKS, max_cells: int = MAX_CELLS
    ) -> Grammar:
        """Parse GBNF text (llama.cpp's dialect; :class:`GrammarSyntaxError` on bad text).
        ``max_stacks``, ``max_cells``: the engine's budgets (see the class docstring)."""
        return cls(parse_gbnf(text), root, max_stacks, max_cells)

    @classmethod
    def from_json_schema(cls, schema: Any, **options: Any) -> Grammar:
        """The grammar of a JSON schema: a dict, a bool, JSON text, or a pydantic model
        class or ``TypeAdapter``. The complete converter by default (options:
        :func:`samplers.grammar.schema.schema_to_gbnf`), llama.cpp's with
        ``compat="llama.cpp"`` (see :func:`samplers.grammar.json_schema.json_schema_to_gbnf`).
        ``max_stacks=`` and ``max_cells=`` among the options are the engine's budgets (see
        the class docstring)."""
        from .json_schema import json_schema_to_gbnf

        max_stacks = options.pop("max_stacks", MAX_STACKS)
        max_cells = options.pop("max_cells", MAX_CELLS)
        # no garbage collection while compiling: the converter and the parser make many
        # small objects and few cycles, and in a large program a full collection that falls
        # due meanwhile (milliseconds over every object alive) would cost more than the
        # compile; the collection that falls due runs after it, at the next allocation,
        # over what the compile left alive
        paused = gc.isenabled()
        if paused:
            gc.disable()
        try:
            return cls.from_gbnf(json_schema_to_gbnf(schema, **options), max_stacks=max_stacks, max_cells=max_cells)
        finally:
            if paused:
                gc.enable()

    @property
    def gbnf(self) -> str:
        """The grammar as GBNF text (re-parses to the same rules)."""
        from .gbnf import format_gbnf

        return format_gbnf(self.parsed)

    def __str__(self) -> str:
        return self.gbnf

    def __repr__(self) -> str:
        return f"<Grammar root={self.root!r} rules={len(self.parsed.rules)}>"

    def accepts(self, text: str | bytes) -> bool:
        """Whether ``text`` (all of it) is a sentence of the grammar. Bytes are decoded
        as llama.cpp decodes token pieces (stopping at a NUL byte)."""
        if not isinstance(text, (str, bytes)):
            raise type_error("text", "a str or bytes", text)
        eng = self._engine
        if isinstance(text, bytes):
            from .engine import decode_utf8

            cps, partial = decode_utf8(text)
            if partial[1] != 0:
                return False
        else:
            cps = [ord(c) for c in text]
        return eng.is_complete(eng.walk(eng.start, cps))

    def compile(self, vocab: Any, mask_cache_size: int = 4096, kernel: str | None = None) -> CompiledGrammar:
        """The grammar for a vocabulary (a :class:`llama_cffi.Model` or ``Vocab``, or a
        :class:`VocabIndex`): the vocabulary's code-point trie with this grammar's classes,
        plus a mask cache of ``mask_cache_size`` masks (0: every mask computed; the
        walk still keeps up to 8 masks of states that other states' masks start from,
        ``n_vocab / 8`` bytes each). Cached
        per llama_cffi vocabulary, cache size and kernel. The vocabulary's index is built
        once per vocabulary (about half a second at 262,144 tokens, then memory-mapped from
        the disk cache in ~15-30 ms); a compile on it takes 1-2 ms. ``kernel``: the mask walk
        and the engine core, ``"c"`` (both in C) or ``"numpy"`` (the references: the numpy
        walk over the Python engine; default: ``"c"`` unless the environment variable
        ``LLAMA_CFFI_GRAMMAR_KERNEL`` says ``numpy``)."""
        from .compiled import default_kernel

        _check_vocab(vocab)
        mask_cache_size = expect_int("mask_cache_size", mask_cache_size)
        if kernel is not None and not isinstance(kernel, str):
            raise type_error("kernel", "'c', 'numpy' or None", kernel)
        kernel = default_kernel() if kernel is None else kernel
        index = VocabIndex.of(vocab)
        # cached per llama_cffi Vocab (a weak key: the compiled grammar holds only the
        # index); a VocabIndex or a list of pieces is compiled afresh each call
        key: Any = getattr(vocab, "vocab", vocab)
        cacheable = hasattr(key, "tokenize")
        hit = self._compiled.get(key, {}).get((mask_cache_size, kernel)) if cacheable else None
        if hit is not None:
            return hit
        if self.parsed.token_names:
            tokenize = getattr(key, "tokenize", None)
            if tokenize is None:
                raise GrammarError(f"named tokens {list(self.parsed.token_names)} need a llama_cffi vocabulary")

            def token_id(name: str) -> int:
                ids = tokenize(name, add_special=False, parse_special=True)
                if len(ids) != 1:
                    raise GrammarError(f"invalid token {name!r}: it is {len(ids)} tokens, not one")
                return int(ids[0])

            engine = Engine(
                resolve_tokens(self.parsed, token_id), self.root, max_stacks=self.max_stacks, max_cells=self.max_cells
            )
        else:
            engine = self._engine_for("python" if kernel == "numpy" else default_core())
        compiled = CompiledGrammar(engine, index, mask_cache_size, kernel)
        if cacheable:
            self._compiled.setdefault(key, {})[(mask_cache_size, kernel)] = compiled
        return compiled

    def _engine_for(self, core: str) -> Engine:
        """The vocabulary-free engine with this core (made once)."""
        eng = self._engines.get(core)
        if eng is None:
            eng = self._engines[core] = Engine(
                resolve_tokens(self.parsed, lambda _name: _NO_TOKEN),
                self.root,
                core=core,
                max_stacks=self.max_stacks,
                max_cells=self.max_cells,
            )
        return eng

    def matcher(self, vocab: Any) -> GrammarMatcher:
        """A fresh matcher for ``vocab`` (compiling on first use)."""
        return self.compile(_check_vocab(vocab)).matcher()


def _check_vocab(vocab: Any) -> Any:
    from llama_cffi import Model, Vocab

    if isinstance(vocab, (Model, Vocab, VocabIndex)):
        return vocab
    if isinstance(vocab, Sequence) and not isinstance(vocab, (str, bytes)):
        return vocab  # byte pieces, checked by VocabIndex
    raise type_error("vocab", "a llama_cffi Model or Vocab, a VocabIndex, or a sequence of byte pieces", vocab)
