"""One chain configuration run over many branches' candidates at once.

A :class:`~samplers.branch.BranchStore` step samples N branches. When their chains are of
one configuration made of samplers with a row-wise form here (``TopK`` first, then any of
``TopP``, ``MinP``, ``Temperature``, ``TopK``, ending in ``Dist`` or ``Greedy``), the
chains run as numpy operations over an ``(N, k)`` matrix of the rows' best candidates
instead of N Python loops: each sampler applied to every row in one call, each branch's
random engine drawing its own number.

The arithmetic is each sampler's own, element for element (float32 shifts, exponentials
and divisions, float32 running sums, the draw's float64 running sum), and a row's
dropped candidates are ``-inf`` at the end of it, which adds exact zeros to every running
sum: so every row gets the token, and the sampling surprisal, that its chain gives on its
own (:meth:`SamplerChain.choose` on the same candidates), bit for bit. The tests run both
on random rows and chains.

A chain that begins with a grammar (:func:`grammar_signature`) runs with llama.cpp's
fast path, as :meth:`SamplerChain.choose` does (:func:`choose_constrained`): the samplers
after the grammar choose from the row's best candidates; a row whose token the grammar
rejects chooses again (a second draw) from the best candidates its mask allows, found by
one C call over the masks (:func:`llama_cffi.kernels.masked_top_k_rows`: each distinct mask
scanned once for its nonzero words, then each row's values read only there), not a pass
over the row and a copy of it; only those rows need their masks.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from llama_cffi._args import expect, expect_bool, expect_int, type_error
from llama_cffi.kernels import dist_rows, masked_top_k_rows, rows_log_sum, top_p_rows
from llama_cffi.sampling import SamplingError

from .base import Sampler
from .chain import SamplerChain
from .selection import Dist, Greedy
from .temperature import Temperature
from .truncation import MinP, TopK, TopP

#: A chain's configuration: one entry per sampler, its kind and parameters (not its state).
Signature = tuple[tuple[object, ...], ...]

_F32 = np.float32


def signature(chain: SamplerChain) -> Signature | None:
    """The configuration of ``chain`` when :func:`choose` can run it (a plain
    :class:`SamplerChain` of a plain ``TopK(k > 0)`` first, then ``TopP``/``MinP``/
    ``Temperature``/``TopK``, a ``Dist`` or ``Greedy`` last), else None. Chains with equal
    signatures differ only in their random engines' states."""
    expect("chain", chain, Sampler, "a samplers.Sampler (a SamplerChain)")
    if type(chain) is not SamplerChain:  # a subclass may choose otherwise
        return None
    return _signature(chain.samplers)


def _signature(samplers: list[Sampler], start: int = 0) -> Signature | None:
    """:func:`signature` of a chain of ``samplers[start:]``."""
    if len(samplers) < start + 2 or type(samplers[start]) is not TopK or samplers[start].k <= 0:  # type: ignore[attr-defined]
        return None
    sig: list[tuple[object, ...]] = []
    for i in range(start, len(samplers) - 1):
        s = samplers[i]
        t = type(s)
        if t is TopK:
            sig.append(("top_k", s.k))  # type: ignore[attr-defined]
        elif t is TopP:
            sig.append(("top_p", s.p, s.min_keep))  # type: ignore[attr-defined]
        elif t is MinP:
            sig.append(("min_p", s.p, s.min_keep))  # type: ignore[attr-defined]
        elif t is Temperature:
            sig.append(("temp", s.t))  # type: ignore[attr-defined]
        else:
            return None
    last = type(samplers[-1])
    if last is Dist:
        sig.append(("dist",))
    elif last is Greedy:
        sig.append(("greedy",))
    else:
        return None
    return tuple(sig)


def grammar_signature(chain: SamplerChain) -> Signature | None:
    """The configuration of ``chain`` when :func:`choose_constrained` can run it: a plain
    :class:`SamplerChain` of a :class:`~samplers.grammar.GrammarSampler` (active: not
    waiting for a trigger, its grammar not ended), then samplers :func:`signature` takes
    (the signature returned is theirs), else None."""
    sig, grammar = group_signature(chain)
    return sig if grammar else None


def group_signature(chain: Sampler) -> tuple[Signature | None, bool]:
    """How :meth:`samplers.branch.BranchStore.sample` groups a chain, in one call (it asks
    this of every branch at every step): ``(signature(chain), False)`` for a chain that
    begins with ``TopK``; ``(grammar_signature(chain), True)`` for one that begins with an
    active grammar (the signature None when the samplers after it are not ones
    :func:`choose` runs); ``(None, False)`` for anything else."""
    if type(chain) is not SamplerChain:  # (a subclass may choose otherwise; not a chain: neither)
        expect("chain", chain, Sampler, "a samplers.Sampler (a SamplerChain)")
        return None, False
    samplers = chain.samplers
    if samplers and type(samplers[0]) is TopK:
        return _signature(samplers), False
    # (no chain holds a GrammarSampler before its module is imported: nothing to import here)
    mod = sys.modules.get("samplers.grammar.sampler")
    if mod is None or len(samplers) < 3 or type(samplers[0]) is not mod.GrammarSampler:
        return None, False
    g: Any = samplers[0]
    if g.awaiting or g.matcher.ended:
        return None, False
    return _signature(samplers, 1), True


def choose_constrained(
    sig: Signature,
    chains: Sequence[SamplerChain],
    ids: npt.NDArray[np.int32],
    logits: npt.NDArray[np.float32],
    row: Callable[[int], npt.NDArray[np.float32]],
    surprisal: bool,
    n_threads: int = 1,
    rows_at: tuple[npt.NDArray[np.float32], npt.NDArray[np.intp]] | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64] | None, npt.NDArray[np.float32]]:
    """Run chains that begin with a grammar (all of :func:`grammar_signature` ``sig``) on
    their rows, as :meth:`SamplerChain.choose` does (llama.cpp's ``common_sampler_sample``):
    the samplers after the grammar choose first from each row's ``k`` best candidates
    (``ids``/``logits`` as :func:`choose` takes them; ``logits`` is overwritten); a token
    the grammar allows stands (one token checked: no mask); the other rows choose again, a
    second draw from their engines, from the ``k`` best candidates their grammar masks
    allow (the masks given to the grammars with ``use_mask``, else computed for those rows
    in one :func:`~samplers.grammar.masks.shared_rows` call, one array per grammar state; the
    candidates by :func:`llama_cffi.kernels.masked_top_k_rows` over ``row(r)``, row ``r``'s
    logits, read only for those rows). Returns each row's token, its sampling surprisal when asked for
    (under the final candidates, as :func:`choose`) and the model's logit of the token.
    Raises :class:`~llama_cffi.sampling.SamplingError` when a row's mask allows no
    candidate (a grammar that has ended), as the chain would. ``n_threads``: threads for
    the rejected rows' candidates (at most: the kernel wakes them only for enough work).
    ``rows_at``: the rows as ``(matrix, index)``, row ``r`` being ``matrix[index[r]]`` (a
    decode's outputs, checked once: ``row`` is then not called)."""
    if not isinstance(sig, tuple) or not all(isinstance(step, tuple) and step for step in sig):
        raise type_error("sig", "a chain signature (from grammar_signature())", sig)
    if not isinstance(ids, np.ndarray):
        raise type_error("ids", "a 2-D int32 array of candidate ids", ids)
    if not isinstance(logits, np.ndarray) or logits.ndim != 2:
        raise type_error("logits", "a 2-D float32 array of candidate logits", logits)
    if surprisal is not True and surprisal is not False:
        surprisal = expect_bool("surprisal", surprisal)
    if type(n_threads) is not int:
        n_threads = expect_int("n_threads", n_threads)
    if not callable(row):
        raise type_error("row", "a callable giving row r's logits", row)
    if type(chains) is not list and not isinstance(chains, Sequence):
        raise type_error("chains", "a sequence of SamplerChain (one per row)", chains)
    if rows_at is not None and (
        type(rows_at) is not tuple or len(rows_at) != 2 or not all(isinstance(a, np.ndarray) for a in rows_at)
    ):
        raise type_error("rows_at", "None or a (matrix, index) pair of ndarrays", rows_at)
    mod = sys.modules.get("samplers.grammar.sampler")
    grammars: list[Any] = [c.samplers[0] if type(c) is SamplerChain and c.samplers else None for c in chains]
    if chains and (mod is None or any(type(gr) is not mod.GrammarSampler for gr in grammars)):
        raise ValueError("every chain must begin with a GrammarSampler (see grammar_signature)")
    g, k = logits.shape
    model = logits.copy()  # the model's logits of the candidates (choose overwrites logits)
    tokens, out, pos = choose(sig, chains, ids, logits, surprisal)
    raw = model[np.arange(g), pos]
    if not g:
        return tokens, out, raw
    assert mod is not None  # (checked above: every chain begins with one of its GrammarSamplers)
    ok, given = mod.GrammarSampler._allows_given(grammars, tokens.tolist())  # (a given mask: its bit)
    rejected = [r for r in range(g) if not ok[r]]
    if not rejected:
        return tokens, out, raw
    words = [given[r] for r in rejected]
    need = [i for i, w in enumerate(words) if w is None]
    if need:
        from .grammar.masks import shared_rows

        for i, w in zip(need, shared_rows([grammars[rejected[i]].matcher for i in need]), strict=True):
            grammars[rejected[i]].use_mask(w)
            words[i] = w
    ids2 = np.empty((len(rejected), k), dtype=np.int32)
    lg2 = np.empty((len(rejected), k), dtype=np.float32)
    if rows_at is not None:
        n_fin = masked_top_k_rows(rows_at[0], words, k, ids2, lg2, n_threads, row_index=rows_at[1][rejected])
    else:
        n_fin = masked_top_k_rows([row(r) for r in rejected], words, k, ids2, lg2, n_threads)
    if (n_fin == 0).any():
        r = rejected[int(np.argmax(n_fin == 0))]
        raise SamplingError(
            f"no token is allowed: a constraint of {chains[r]!r} rejects every candidate "
            "(a grammar that has ended, e.g. after an end-of-generation token)"
        )
    model2 = lg2.copy()
    t2, out2, pos2 = choose(sig, [chains[r] for r in rejected], ids2, lg2, surprisal)
    tokens[rejected] = t2
    raw[rejected] = model2[np.arange(len(rejected)), pos2]
    if out is not None and out2 is not None:
        out[rejected] = out2
    return tokens, out, raw


def choose(
    sig: Signature,
    chains: Sequence[SamplerChain],
    ids: npt.NDArray[np.int32],
    logits: npt.NDArray[np.float32],
    surprisal: bool,
    *,
    kernel: str = "c",
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64] | None, npt.NDArray[np.intp]]:
    """Run the chains (all of signature ``sig``) on their rows of candidates: row ``r`` of
    ``ids``/``logits`` holds chain ``r``'s ``k`` best candidates sorted by descending logit
    (ties by lower id), ``k`` the first sampler's. Returns each row's token, with
    ``surprisal`` its sampling-level surprisal (nats, under the final candidates), as
    :meth:`SamplerChain.choose` would, and its position among the row's candidates (the
    samplers here keep a prefix, in order). Draws one number from each ``Dist`` chain's
    engine. ``logits`` is overwritten; every row's first logit must be finite.

    ``kernel``: ``"c"`` (the default) runs the top-p and dist steps of C-contiguous float32
    rows in C (:func:`llama_cffi.kernels.top_p_rows`, :func:`~llama_cffi.kernels.dist_rows`:
    one call per step instead of a dozen numpy calls); ``"numpy"`` runs every step in numpy,
    the reference the tests hold the C steps to, bit for bit."""
    if kernel != "c" and kernel != "numpy":
        if not isinstance(kernel, str):
            raise type_error("kernel", "'c' or 'numpy'", kernel)
        raise ValueError(f"kernel must be 'c' or 'numpy', not {kernel!r}")
    if not isinstance(sig, tuple) or not all(isinstance(step, tuple) and step for step in sig):
        raise type_error("sig", "a chain signature (from signature())", sig)
    if type(chains) is not list and not isinstance(chains, Sequence):
        raise type_error("chains", "a sequence of SamplerChain (one per row)", chains)
    if not isinstance(ids, np.ndarray):
        raise type_error("ids", "a 2-D int32 array of candidate ids", ids)
    if not isinstance(logits, np.ndarray):
        raise type_error("logits", "a 2-D float32 array of candidate logits", logits)
    if surprisal is not True and surprisal is not False:
        surprisal = expect_bool("surprisal", surprisal)
    g, k = logits.shape
    c_steps = kernel == "c" and logits.dtype == _F32 and logits.flags.c_contiguous and k > 0
    rows = np.arange(g)
    n: npt.NDArray[np.integer[Any]] = np.full(g, k, dtype=np.int64)  # candidates left in each row
    lg = logits
    cols = np.arange(k)
    for step in sig:
        kind = step[0]
        if kind == "top_k":
            kk = int(step[1])  # type: ignore[call-overload]
            if 0 < kk < k:  # (k or more: every row keeps its k candidates)
                n = np.minimum(n, kk)
                lg[cols[None, :] >= n[:, None]] = -np.inf
        elif kind == "top_p":
            p, min_keep = float(step[1]), int(step[2])  # type: ignore[arg-type, call-overload]
            if p >= 1.0:
                continue
            pr = np.subtract(lg, lg[:, :1])
            np.exp(pr, out=pr)
            if c_steps:  # the steps below in one C pass per row (the same arithmetic)
                n = n32 = n.astype(np.int32, copy=False)
                top_p_rows(lg, pr, n32, _F32(p), min_keep)
                continue
            total = np.cumsum(pr, axis=1, dtype=np.float32)[rows, n - 1]
            pr /= total[:, None]
            ok = np.cumsum(pr, axis=1, dtype=np.float32) >= _F32(p)
            ok &= cols[None, :] < n[:, None]
            if min_keep > 1:
                ok[:, : min_keep - 1] = False
            hit = ok.argmax(axis=1)
            n = np.where(ok[rows, hit], hit + 1, n)
            lg[cols[None, :] >= n[:, None]] = -np.inf
        elif kind == "min_p":
            p, min_keep = float(step[1]), int(step[2])  # type: ignore[arg-type, call-overload]
            if p <= 0.0:
                continue
            floor = lg[:, 0] + _F32(math.log(p))
            count = np.count_nonzero(lg >= floor[:, None], axis=1)
            n = np.minimum(np.maximum(np.maximum(count, min_keep), 1), n)
            lg[cols[None, :] >= n[:, None]] = -np.inf
        elif kind == "temp":
            t = float(step[1])  # type: ignore[arg-type]
            if t == 1.0:
                continue
            if t <= 0.0:
                lg[:, 1:] = -np.inf  # sorted: the first is the (first) highest
            else:
                with np.errstate(over="ignore"):
                    np.divide(lg, _F32(t), out=lg)
        elif kind == "dist":
            pr = np.subtract(lg, lg[:, :1])
            np.exp(pr, out=pr)
            u = np.fromiter((c.samplers[-1].rng.canonical() for c in chains), dtype=np.float64, count=g)  # type: ignore[attr-defined]
            if c_steps:
                n = n32 = n.astype(np.int32, copy=False)
                sel = dist_rows(pr, n32, u)
                continue
            cum = np.cumsum(pr, axis=1, dtype=np.float64)
            mass = cum[rows, n - 1]
            sel = np.count_nonzero(cum < (mass * u)[:, None], axis=1)
            sel = np.minimum(sel, n - 1)
        else:  # greedy
            sel = lg.argmax(axis=1)
    tokens = ids[rows, sel].astype(np.int64)
    if not surprisal:
        return tokens, None, sel
    top = lg[:, 0].copy()  # sorted: the final candidates' max
    lt = lg[rows, sel]
    out = (top.astype(np.float64) - lt.astype(np.float64)) + rows_log_sum(lg, n.astype(np.int32), top)
    out[(top == -np.inf) | (lt == -np.inf)] = math.inf
    return tokens, out, sel
