"""A prompt cache: the KV of earlier prompts kept in a :class:`~samplers.branch.BranchStore`
across calls, so that a later prompt that starts the same way (a system prompt, a
few-shot header, the conversation so far) copies those cells instead of decoding them.

::

    store = BranchStore(ctx)                  # ctx: n_seq_max=N, kv_unified=True
    cache = PromptCache(store, max_tokens=4096, max_entries=4)
    cache.warm(system_prompt)                 # optional: decode a header once, now
    for question in questions:                # each call decodes only what is new
        complete(store, system_prompt + question, cache=cache)
    generate_many(store, more_prompts, cache=cache)
    ChatSession(ctx, store=store, cache=cache)

:func:`samplers.search.complete`, :func:`samplers.many.generate_many` (and its
iterator and async forms) and :class:`samplers.chat.ChatSession` take ``cache=``. Each
new sequence starts from the entry sharing its longest prefix (``seq_cp``: in a unified
KV cache the cells are tagged with the new sequence, no data is copied) and decodes the
rest; when it ends, its tokens (prompt and generation) become an entry, the least
recently used entries going first when the cache holds more than ``max_entries``
sequences or ``max_tokens`` tokens. An entry that another one extends is dropped (the
longer one serves both), and one that extends nothing new is not added.

**What an entry holds.** Each entry is a branch of the store (listed among its branches,
never sampled again) holding one sequence id and the KV cells of its tokens; entries
that share a prefix share its cells in a unified cache, so ``max_tokens`` (the sum of
the entries' lengths) bounds the cells they hold from above. A caller that needs a
sequence id or KV cells the cache holds gets them: the calls above evict the least
recently used entries when the store has no free id, or when a decode would not find
room (then retried once per eviction).

**Which prefixes can be copied** is :meth:`BranchStore.share_refusal`'s rule: a proper
prefix of an entry needs a unified KV cache (``kv_unified=True``) and a memory that
keeps positions (not a recurrent state, which serves only prompts that extend a whole
entry, as a chat's next turn does); a sliding-window cache needs the window before the
prefix (llama-server's rule). The copied rows are those a fresh decode of the prompt
gives up to the rounding of the batch shapes (``docs/guide/branches.md``, "Tolerances").
An encoder-decoder or encoder-only model has no decoder prompt to share: refused with
:class:`~llama_cffi.errors.UnsupportedError`.

Lifetime: entries live until evicted, :meth:`PromptCache.clear` or :meth:`PromptCache.close` (also on leaving a
``with`` block); pruning an entry's branch through the store drops it from the cache
too. One thread at a time, like the store.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from llama_cffi._args import expect, expect_bool, expect_int, type_error
from llama_cffi.errors import KvCacheFullError, ParamError, UnsupportedError

from .base import Sampler
from .branch import Branch, BranchStore, NewBranch
from .params import SamplingParams

__all__ = ["CacheStats", "PromptCache"]

_T = TypeVar("_T")


@dataclass
class CacheStats:
    """What a :class:`PromptCache` did since it was made: ``lookups`` (new sequences that
    asked it for a prefix), ``hits`` (those that got one), ``reused_tokens`` (prompt
    tokens copied rather than decoded), ``added`` (entries made), ``evicted`` (entries
    dropped to make room: ids, cells, or the bounds)."""

    lookups: int = 0
    hits: int = 0
    reused_tokens: int = 0
    added: int = 0
    evicted: int = 0


def _common(a: npt.NDArray[np.int32], b: npt.NDArray[np.int32]) -> int:
    """The number of leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = a[:n] != b[:n]
    i = int(diff.argmax())
    return i if diff[i] else n


def _kept(keep: Branch | Collection[Branch] | None) -> Collection[Branch]:
    """``keep`` as a collection of branches (checked)."""
    if keep is None:
        return ()
    if isinstance(keep, Branch):
        return (keep,)
    if isinstance(keep, (set, frozenset, list, tuple)) and all(isinstance(b, Branch) for b in keep):
        return keep
    raise type_error("keep", "a Branch, a set/list/tuple of Branches, or None", keep)


class PromptCache:
    """Prompts' KV kept in ``store`` for later prompts that start the same way (see the
    module docstring). ``max_tokens``: the most tokens the entries hold together (an
    upper bound on their KV cells); ``max_entries``: the most entries (each holds one of
    the store's sequence ids)."""

    #: what the cache has done (counts)
    stats: CacheStats

    def __init__(self, store: BranchStore, max_tokens: int = 4096, max_entries: int = 4) -> None:
        expect("store", store, BranchStore, "a samplers.branch.BranchStore")
        max_tokens = expect_int("max_tokens", max_tokens)
        max_entries = expect_int("max_entries", max_entries)
        if max_tokens < 1:
            raise ParamError(f"max_tokens must be >= 1, not {max_tokens}")
        if max_entries < 1:
            raise ParamError(f"max_entries must be >= 1, not {max_entries}")
        model = store.ctx.model
        if model.has_encoder:
            raise UnsupportedError(
                "a prompt cache needs a decoder-only model: an encoder's input is encoded whole for each "
                "sequence, there is no decoder prompt prefix to share"
            )
        self.store = store
        self.max_tokens = max_tokens
        self.max_entries = max_entries
        self.stats = CacheStats()
        # entries, least recently used first: the branch and the tokens its KV holds
        self._entries: dict[Branch, npt.NDArray[np.int32]] = {}

    # ------------------------------------------------------------------ inspection
    def __len__(self) -> int:
        self._forget_dead()
        return len(self._entries)

    @property
    def tokens(self) -> int:
        """Tokens the entries hold together (shared prefixes counted once per entry)."""
        self._forget_dead()
        return int(sum(len(t) for t in self._entries.values()))

    @property
    def entries(self) -> list[list[int]]:
        """Each entry's tokens (copies), least recently used first."""
        self._forget_dead()
        return [t.tolist() for t in self._entries.values()]

    def __contains__(self, branch: object) -> bool:
        return branch in self._entries

    def __repr__(self) -> str:
        return (
            f"PromptCache({len(self)} entries, {self.tokens} tokens; max_entries={self.max_entries}, "
            f"max_tokens={self.max_tokens})"
        )

    def _forget_dead(self) -> None:
        dead = [b for b in self._entries if not b.alive]
        for b in dead:
            del self._entries[b]

    def _check_store(self, store: BranchStore) -> None:
        if store is not self.store:
            raise ParamError("cache belongs to another BranchStore: make one PromptCache per store")

    # ------------------------------------------------------------------ lookups
    def match(self, prompt: Sequence[int] | npt.NDArray[np.integer[Any]]) -> tuple[Branch | None, int]:
        """The entry that shares the longest prefix with ``prompt`` and how many tokens it
        can give (at most ``len(prompt) - 1``: the last token is decoded for its logits),
        under :meth:`BranchStore.share_refusal`'s rule; ``(None, 0)`` when none can. The
        entry found counts as used (least recently used goes first)."""
        return self._match(np.asarray(self.store.ctx.model.vocab.check_tokens(prompt, "prompt"), dtype=np.int32))

    def _match(self, toks: npt.NDArray[np.int32]) -> tuple[Branch | None, int]:
        """:meth:`match` of tokens already checked."""
        self._forget_dead()
        best: tuple[Branch | None, int] = (None, 0)
        limit = len(toks) - 1
        listed: list[int] | None = None
        for b, held in reversed(self._entries.items()):  # most recent first: ties go to it
            n = min(_common(toks, held), limit)
            if n > best[1]:
                if listed is None:
                    listed = toks.tolist()
                if self.store.share_refusal(b, listed, n) is None:
                    best = (b, n)
        if best[0] is not None:
            self._touch(best[0])
        return best

    def _touch(self, b: Branch) -> None:
        self._entries[b] = self._entries.pop(b)

    def _count(self, n: int) -> None:
        self.stats.lookups += 1
        if n:
            self.stats.hits += 1
            self.stats.reused_tokens += n

    # ------------------------------------------------------------------ room
    def evict(self, keep: Branch | Collection[Branch] | None = None) -> bool:
        """Drop the least recently used entry other than ``keep`` (a branch or several:
        entries a caller is copying from); its id and cells are freed. False when there
        is none."""
        self._forget_dead()
        kept = _kept(keep)
        for b in self._entries:
            if b not in kept:
                del self._entries[b]
                b.prune()
                self.stats.evicted += 1
                return True
        return False

    def free_id(self, keep: Branch | Collection[Branch] | None = None) -> bool:
        """Make sure the store has a free sequence id, evicting an entry (not ``keep``)
        when it has none. False when no id could be freed."""
        _kept(keep)
        return self.store.available > 0 or self.evict(keep)

    def retry(self, make: Callable[[], _T], keep: Branch | Collection[Branch] | None = None) -> _T:
        """``make()``, evicting the least recently used entry (not ``keep``) and trying
        again each time it fails with :class:`~llama_cffi.errors.KvCacheFullError`
        (the calls that take ``cache=`` guarantee a failed decode changed nothing)."""
        if not callable(make):
            raise type_error("make", "a callable taking no arguments", make)
        _kept(keep)
        while True:
            try:
                return make()
            except KvCacheFullError:
                if not self.evict(keep):
                    raise

    def clear(self) -> None:
        """Drop every entry (their ids and cells are freed)."""
        self._forget_dead()
        for b in list(self._entries):
            del self._entries[b]
            b.prune()

    def close(self) -> None:
        """:meth:`clear` (the store and its context stay open)."""
        self.clear()

    def __enter__(self) -> PromptCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ entries
    def add(self, branch: Branch, n: int | None = None) -> bool:
        """Make ``branch`` (a branch of the store with no live children, not used after
        this call) an entry holding its first ``n`` tokens (default: all it holds; a
        recurrent state is kept whole). The cache owns it from then on: True when it was
        kept, False when it was pruned instead (nothing new to hold: another entry
        already extends it; or it cannot be one: its positions were shifted, or it has
        children)."""
        expect("branch", branch, Branch, "a samplers.branch.Branch")
        if n is not None:
            n = expect_int("n", n, "an int or None")
        self._check_store(branch.store)
        if branch in self._entries:
            raise ParamError(f"{branch!r} is already an entry of this cache")
        if not branch.alive:
            raise ParamError(f"{branch!r} was pruned")
        kv = branch._kv_len
        if n is None:
            n = kv
        n = expect_int("n", n)
        if not 1 <= n <= kv:
            raise ParamError(f"n={n} must be in [1, {kv}] (the positions {branch!r} holds)")
        whole_only = self.store.ctx.model.is_recurrent or self.store.ctx.model.is_hybrid
        if branch.children or kv != len(branch._tokens) or (whole_only and n != kv):
            branch.prune_subtree()
            return False
        n = min(n, self.max_tokens) if not whole_only else n
        if n > self.max_tokens:
            branch.prune()
            return False
        self._forget_dead()
        toks = np.asarray(branch._tokens[:n], dtype=np.int32)
        # a longer entry serves every prefix of itself, but for a recurrent state (whole
        # sequences only) or a sliding-window cache (which may have dropped early positions)
        covers = not whole_only and not self.store.ctx._swa_window
        for b, held in list(self._entries.items()):
            common = _common(toks, held)
            if common == len(toks) and (len(held) == len(toks) or covers):
                branch.prune()  # an entry already holds all of it
                self._touch(b)
                return False
            if common == len(held) and covers:  # the new entry extends this one
                del self._entries[b]
                b.prune()
        branch._keep_prefix(n)
        self._entries[branch] = toks
        self.stats.added += 1
        self._shrink(keep=branch)
        return True

    def _shrink(self, keep: Branch | None) -> None:
        total = sum(len(t) for t in self._entries.values())
        while len(self._entries) > self.max_entries or total > self.max_tokens:
            b = next(b for b in self._entries if b is not keep) if len(self._entries) > 1 else None
            if b is None:
                break
            total -= len(self._entries.pop(b))
            b.prune()
            self.stats.evicted += 1

    def create(
        self,
        prompt: Sequence[int] | npt.NDArray[np.integer[Any]],
        sampler: Sampler | SamplingParams | None = None,
        grammar: Any = None,
        seed: int | None = None,
        track: bool = True,
    ) -> Branch:
        """A new branch for ``prompt`` (:meth:`BranchStore.create`'s arguments) that starts
        from the entry sharing its longest prefix and decodes the rest; an entry is
        evicted when the store has no free id or the decode finds no room. The branch
        is the caller's (give it back with :meth:`add`)."""
        return self._create(prompt, sampler, grammar, seed, track)[0]

    def _create(
        self,
        prompt: Sequence[int] | npt.NDArray[np.integer[Any]],
        sampler: Sampler | SamplingParams | None,
        grammar: Any,
        seed: int | None,
        track: bool,
    ) -> tuple[Branch, int]:
        """:meth:`create`, and how many of the prompt's tokens were copied."""
        track = expect_bool("track", track)
        toks = self.store.ctx.model.vocab.check_tokens(prompt, "prompt")
        if len(toks) == 0:
            raise ParamError("a branch needs a prompt of at least one token")
        src, n = self._match(np.asarray(toks, dtype=np.int32))
        if not self.free_id(keep=src):
            if src is None or not self.evict(None):
                raise ParamError("no free sequence id: every id of the store is held by a live branch")
            src, n = None, 0  # the only id to free held this prompt's prefix: decode it in full
        spec = NewBranch(toks, sampler=sampler, grammar=grammar, seed=seed, track=track, prefix_from=src, prefix_len=n)
        try:
            b = self.retry(lambda: self.store.create_many([spec])[0], keep=src)
        except KvCacheFullError:
            if src is None:
                raise
            self.evict()  # the source too (the last entry): the prompt is then decoded in full
            src, n = None, 0
            spec = NewBranch(toks, sampler=sampler, grammar=grammar, seed=seed, track=track)
            b = self.store.create_many([spec])[0]
        self._count(n)
        return b, n

    def warm(self, prompt: Sequence[int] | npt.NDArray[np.integer[Any]] | str) -> int:
        """Decode ``prompt`` (token ids, or text tokenized with the model's special tokens)
        into an entry now, starting from what the cache already holds; returns the tokens
        decoded (0 when an entry already holds it all)."""
        vocab = self.store.ctx.model.vocab
        toks = vocab.tokenize(prompt) if isinstance(prompt, str) else vocab.check_tokens(prompt, "prompt")
        if len(toks) == 0:
            raise ParamError("a prompt needs at least one token")
        arr = np.asarray(toks, dtype=np.int32)
        whole_only = self.store.ctx.model.is_recurrent or self.store.ctx.model.is_hybrid
        self._forget_dead()
        covers = not whole_only and not self.store.ctx._swa_window
        for b, held in self._entries.items():
            if _common(arr, held) == len(arr) and (len(held) == len(arr) or covers):
                self._touch(b)
                return 0
        b, n = self._create(arr, None, None, None, False)
        self.add(b)
        return len(arr) - n
