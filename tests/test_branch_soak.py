"""Soak: 10,000 fork/prune cycles on one BranchStore leave memory and the KV cache flat.

Every cycle forks children off one root and prunes them again; every tenth also steps
the children (new cells) and prunes the subtree, and every tenth (others) steps a child
and detaches it (its cells stay until the id is reused). A cycle that leaked anything
would show in one of three places:

* **Python objects**: every branch made is in a ``WeakSet``; once pruned and out of scope
  it must be collected (the store, its parent's children and the tracker keep nothing);
* **KV cells**: ``store.kv()`` and ``seq_pos_max`` of every free id are checked every 500
  cycles, and the stepping cycles take 3 cells each: a leak of one cell per cycle would
  fill the 256-cell cache within 100 cycles (``KvCacheFullError``);
* **RSS** (``VmRSS`` of ``/proc/self/status``): compared after a warm-up of 500 cycles
  with the end, within :data:`RSS_SLACK_KIB`.
"""

from __future__ import annotations

import gc
import time
import weakref
from pathlib import Path

import numpy as np
import pytest

import samplers as S
from llama_cffi import Model
from samplers.branch import Branch, BranchStore
from tests.conftest import rss_kib

N_CYCLES = 10_000
WARMUP = 500
N_SEQ = 4
# RSS is not a byte counter: glibc's malloc and Python's allocator keep freed memory in
# their arenas (and hand it back, or not, in 128 KiB-1 MiB pieces), numpy caches small
# buffers, ggml grows its compute buffers the first time a bigger graph runs, and the
# kernel counts pages when first touched. After the warm-up these settle; 8 MB covers
# their jitter. A leak that matters is much bigger: a branch alone carries a 1.9 KB
# logits snapshot (474 float32) plus its sampler chain and tracker, so one leaked branch
# per cycle over 9,500 cycles is more than 18 MB, and the WeakSet check catches even one.
RSS_SLACK_KIB = 8 * 1024
# One thread: on a busy two-core machine a two-thread decode waits for a time slice.
THREADS = {"n_threads": 1, "n_threads_batch": 1}

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")


class Soak:
    """One root and the cycles run on it."""

    def __init__(self, store: BranchStore, root: Branch) -> None:
        self.store = store
        self.root = root
        self.made: weakref.WeakSet[Branch] = weakref.WeakSet()
        self.decodes = 0

    def _fork(self, parent: Branch, seed: int) -> Branch:
        b = parent.fork(seed=seed)
        self.made.add(b)
        return b

    def cycle(self, i: int) -> None:
        root, store = self.root, self.store
        if i % 10 == 9:  # fork, step, fork, step, prune the subtree: 3 new cells, freed again
            a = self._fork(root, i)
            b = self._fork(a, i + 1)
            store.step({a: a.sample(), b: b.sample()})
            c = self._fork(b, i + 2)
            c.commit(c.sample())
            self.decodes += 2
            a.prune_subtree()
        elif i % 10 == 4:  # a stepped child detached: its cells stay until its id is reused
            a = self._fork(root, i)
            a.commit(a.sample())
            self.decodes += 1
            a.detach()
        else:  # 1 to 3 children, pruned in some order
            kids = [self._fork(root, i + k) for k in range(1 + i % (N_SEQ - 1))]
            order = kids if i % 2 else kids[::-1]
            for k in order:
                k.prune()


def _check_flat(soak: Soak, kv0: dict[str, int], root_state: tuple[list[int], int]) -> None:
    store, root = soak.store, soak.root
    mem = store.ctx.memory
    assert len(store) == 1 and store.available == N_SEQ - 1
    assert store.kv() == kv0
    assert (root.tokens, root.position) == root_state and root.is_leaf
    # free ids hold nothing: the detached one of the last cycle of that kind was reused
    # (and emptied) by the next cycle's first fork
    assert [mem.seq_pos_max(s) for s in range(1, N_SEQ)] == [-1] * (N_SEQ - 1)


@pytest.mark.slow
def test_fork_prune_cycles_leave_rss_and_kv_flat(tiny_model: Model) -> None:
    t0 = time.perf_counter()
    with tiny_model.context(n_ctx=256, n_batch=64, n_seq_max=N_SEQ, kv_unified=True, **THREADS) as ctx:
        store = BranchStore(ctx)
        prompt = [int(t) for t in np.random.default_rng(0).integers(3, 400, 32)]
        root = store.create(prompt, sampler=S.SamplerChain([S.TopK(20), S.Dist(1)]))
        soak = Soak(store, root)
        kv0 = store.kv()
        assert kv0["positions"] == 32
        root_state = (root.tokens, root.position)

        for i in range(WARMUP):
            soak.cycle(i)
        gc.collect()
        rss0 = rss_kib()
        for i in range(WARMUP, N_CYCLES):
            soak.cycle(i)
            if i % 500 == 499:
                _check_flat(soak, kv0, root_state)
        gc.collect()
        rss1 = rss_kib()

        _check_flat(soak, kv0, root_state)
        assert len(soak.made) == 0, f"{len(soak.made)} pruned branches were never freed"
        assert soak.decodes == (N_CYCLES // 10) * 3
        store.drain()
        assert ctx.memory.seq_pos_max(0) == -1 and store.available == N_SEQ
    grew = rss1 - rss0
    elapsed = time.perf_counter() - t0
    print(f"soak: {N_CYCLES} fork/prune cycles, RSS {grew:+d} KiB after {WARMUP} warm-up cycles ({elapsed:.1f} s)")
    assert grew < RSS_SLACK_KIB, f"RSS grew by {grew} KiB over {N_CYCLES - WARMUP} cycles ({elapsed:.1f} s)"
