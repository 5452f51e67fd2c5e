"""The masks of many matchers in one call: one step of many branches, each under its own
grammar and state.

:func:`fill_masks` writes one row of ``uint32`` words per matcher (bit ``t % 32`` of word
``t // 32``, the layout of :meth:`GrammarMatcher.fill_mask`, xgrammar and llguidance).
Rows are computed by each grammar's C walk (:mod:`llama_cffi.trie_walk`) straight into
the output, or copied from a grammar's mask cache; matchers at the same parser state of
the same compiled grammar share one computation (branches forked from one another are
often in the same state). :class:`samplers.BranchStore` uses it to give the grammar of
every branch its mask for a step at once (see :meth:`GrammarSampler.use_mask`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from .matcher import GrammarMatcher

__all__ = ["fill_masks"]


def fill_masks(matchers: Sequence[GrammarMatcher], out: npt.NDArray[np.uint32] | None = None) -> npt.NDArray[np.uint32]:
    """Row ``i`` of the result is ``matchers[i].fill_mask()`` (all zeros for a matcher
    whose grammar has ended). Every matcher must be for the same vocabulary size.
    ``out``: a C-contiguous ``uint32`` array of shape ``(len(matchers), n_words)`` or more
    columns (written and returned); made when None."""
    ms = list(matchers)
    for i, m in enumerate(ms):
        if not isinstance(m, GrammarMatcher):
            raise TypeError(f"matchers[{i}] must be a GrammarMatcher, not {type(m).__name__}")
    if not ms:
        return np.zeros((0, 0), dtype=np.uint32) if out is None else out
    n_words = ms[0].compiled.n_words
    for i, m in enumerate(ms):
        if m.compiled.n_words != n_words:
            raise ValueError(f"matchers[{i}] is for a vocabulary of another size")
    if out is None:
        out = np.empty((len(ms), n_words), dtype=np.uint32)
    elif (
        not isinstance(out, np.ndarray)
        or out.dtype != np.uint32
        or out.ndim != 2
        or out.shape[0] < len(ms)
        or out.shape[1] < n_words
        or not out.flags.c_contiguous
        or not out.flags.writeable
    ):
        raise ValueError(f"out must be a writeable C-contiguous uint32 array of shape ({len(ms)}, >= {n_words})")
    done: dict[tuple[int, int, tuple[int, int]], int] = {}
    for i, m in enumerate(ms):
        row = out[i]
        if m.ended:
            row[:n_words] = 0
            continue
        key = (id(m.compiled), m.state, m.partial)
        j = done.get(key)
        if j is not None:
            row[:n_words] = out[j, :n_words]
            continue
        m.compiled.fill_words(m.state, m.partial, row)
        done[key] = i
    return out
