"""Infill (``llama_sampler_init_infill``): for fill-in-the-middle, merge candidates that are
prefixes of one another and prefer ending the infill when text tokens are unlikely.

The merge compares every pair of candidates (quadratic, as in llama.cpp): run it after a
truncation such as :class:`~samplers.truncation.TopK`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from llama_cffi.sampling import LlamaSampler

from .base import Sampler, check_model
from .candidates import Candidates, check_candidates

if TYPE_CHECKING:
    from llama_cffi import Model

_F32 = np.float32


class Infill(Sampler):
    """See the module docstring. Needs the model for end-of-generation tokens and pieces."""

    name = "infill"

    def __init__(self, model: Model) -> None:
        self.model = check_model(model)
        vocab = model.vocab
        self._eog = np.array([vocab.is_eog(t) for t in range(model.n_vocab)], dtype=bool)
        eot = vocab.special_tokens().get("eot", -1)
        eos = vocab.special_tokens().get("eos", -1)
        self._end = eot if eot is not None and eot >= 0 else eos
        self._pieces: dict[int, bytes] = {}

    def clone(self) -> Infill:
        out = Infill.__new__(Infill)
        out.__dict__.update(self.__dict__)
        return out

    def native(self) -> LlamaSampler:
        return LlamaSampler.infill(self.model)

    def _piece(self, tok: int) -> bytes:
        got = self._pieces.get(tok)
        if got is None:
            got = self._pieces[tok] = self.model.vocab.token_to_piece(tok, special=False)
        return got

    def apply(self, cands: Candidates) -> None:
        check_candidates(cands)
        if cands.size == 0:
            return
        cands.softmax(sort=True)
        ids = cands.ids
        lg = cands.logits
        p = cands.p
        eog = self._eog[ids]
        p_eog = np.cumsum(np.where(eog, p, _F32(0)))[-1]
        p_txt = np.cumsum(np.where(eog, _F32(0), p))[-1]
        n = cands.size
        if _F32(3) * p_eog * _F32(n) > p_txt:
            keep = np.flatnonzero(eog)
            total = np.cumsum(p[keep])[-1] if len(keep) else _F32(0)
            cands.keep(keep, None)
            if len(keep):
                np.divide(cands.p, total, out=cands.p)
            return
        pieces = [self._piece(int(t)) for t in ids]
        for i0 in range(n):
            for i1 in range(n):
                if lg[i0] == -np.inf:
                    break
                if i0 == i1 or lg[i1] == -np.inf:
                    continue
                a, b = pieces[i0], pieces[i1]
                if a and len(a) <= len(b) and b.startswith(a):
                    dst, src = (i1, i0) if p[i1] > p[i0] else (i0, i1)
                    p[dst] += p[src]
                    lg[src] = -np.inf
                    p[src] = 0.0
        keep_mask = (p >= _F32(0.2)) | eog
        n_non_eog = int(np.count_nonzero(keep_mask & ~eog))
        keep = np.flatnonzero(keep_mask)
        if n_non_eog == 0:
            # only end-of-generation left: reduce to the single EOT (or EOS) token
            if len(keep):
                cands.keep(keep, None)
            cands.truncate(1)
            cands.ids[0] = self._end
            cands.logits[0] = 1.0
            return
        total = np.cumsum(p[keep])[-1]
        cands.keep(keep, None)
        q = cands.p
        np.divide(q, total, out=q)
        thold = _F32(1.0 / (n_non_eog + 1))
        eog2 = self._eog[cands.read_ids()]
        keep2 = np.flatnonzero((q >= thold) | eog2)
        total2 = np.cumsum(q[keep2])[-1]
        cands.keep(keep2, None)
        q = cands.p
        np.divide(q, total2, out=q)
