"""The random numbers llama.cpp's samplers draw, reproduced draw for draw.

llama.cpp seeds a ``std::mt19937`` with the sampler's seed and draws through
libstdc++'s ``generate_canonical`` (``uniform_real_distribution``) and
``discrete_distribution``. numpy's ``MT19937`` bit generator is the same engine; set to
the state ``std::mt19937(seed)`` starts from, its raw 32-bit outputs are the same
sequence, so with the conversions below a seeded sampler here draws the same tokens as
the native one given the same candidates.
"""

from __future__ import annotations

import os
from typing import cast

import numpy as np
import numpy.typing as npt

_N = 624
_TWO32 = 4294967296.0
_TWO64 = _TWO32 * _TWO32
_ONE_BELOW = float(np.nextafter(1.0, 0.0))
_ONE_BELOW_F = np.nextafter(np.float32(1.0), np.float32(0.0))

#: llama.cpp's LLAMA_DEFAULT_SEED: "draw a random seed".
DEFAULT_SEED = 0xFFFFFFFF


def _std_key(seed: int) -> npt.NDArray[np.uint32]:
    """The 624-word state of ``std::mt19937(seed)`` (Knuth's initialisation)."""
    key = np.empty(_N, dtype=np.uint32)
    x = seed & 0xFFFFFFFF
    key[0] = x
    for i in range(1, _N):
        x = (1812433253 * (x ^ (x >> 30)) + i) & 0xFFFFFFFF
        key[i] = x
    return key


def resolve_seed(seed: int | None) -> int:
    """The seed a sampler actually uses: ``None`` or :data:`DEFAULT_SEED` draw one from the OS."""
    if seed is None or seed == DEFAULT_SEED:
        return int.from_bytes(os.urandom(4), "little")
    return int(seed)


class StdMT19937:
    """``std::mt19937`` with libstdc++'s real-number and discrete distributions.

    ``generator`` is a :class:`numpy.random.Generator` over the same bit generator, for
    samplers that want numpy's own distributions. Copy with :meth:`copy` (the state is
    copied, the copies then draw independently).
    """

    __slots__ = ("_bitgen", "_buf", "_gen", "_i", "seed")

    _BLOCK = 256  # words drawn from the engine at a time (kept in order in _buf)

    def __init__(self, seed: int | None = None) -> None:
        self._bitgen = np.random.MT19937()
        self._gen: np.random.Generator | None = None
        self._buf: list[int] = []
        self._i = 0
        self.seed = 0
        self.reseed(seed)

    def reseed(self, seed: int | None = None) -> None:
        """Restart from ``std::mt19937(seed)`` (a random seed for ``None``/DEFAULT_SEED)."""
        self.seed = resolve_seed(seed)
        self._bitgen.state = {"bit_generator": "MT19937", "state": {"key": _std_key(self.seed), "pos": _N}}
        self._buf = []
        self._i = 0

    def copy(self) -> StdMT19937:
        out = StdMT19937.__new__(StdMT19937)
        out._bitgen = np.random.MT19937()
        out._bitgen.state = self._bitgen.state
        out._gen = None
        out._buf = self._buf  # never mutated in place: refills replace the list
        out._i = self._i
        out.seed = self.seed
        return out

    @property
    def generator(self) -> np.random.Generator:
        """A numpy Generator over this engine, for numpy's own distributions. Its draws
        advance the engine (after the words already buffered for :meth:`canonical`), so
        mixing them in departs from llama.cpp's sequence."""
        if self._gen is None:
            self._gen = np.random.Generator(self._bitgen)
        return self._gen

    def next_u32(self) -> int:
        i = self._i
        if i >= len(self._buf):
            self._buf = self._bitgen.random_raw(self._BLOCK).tolist()
            i = 0
        self._i = i + 1
        return self._buf[i]

    def canonical(self) -> float:
        """``std::uniform_real_distribution<double>(0, 1)``: two words, low one first."""
        lo = self.next_u32()
        hi = self.next_u32()
        r = (lo + hi * _TWO32) / _TWO64
        return _ONE_BELOW if r >= 1.0 else r

    def canonical_float(self) -> np.float32:
        """``std::uniform_real_distribution<float>(0, 1)``: one word, float arithmetic."""
        r = cast(np.float32, np.float32(self.next_u32()) / np.float32(_TWO32))
        return cast(np.float32, _ONE_BELOW_F) if r >= 1.0 else r

    def discrete(self, p: npt.NDArray[np.float32]) -> int:
        """``std::discrete_distribution<int>(p.begin(), p.end())(rng)`` (libstdc++): weights
        normalised and summed in double, the last cumulative forced to 1, ``lower_bound``.
        Fewer than two weights: index 0 and no draw."""
        n = len(p)
        if n < 2:
            return 0
        w = p.astype(np.float64)
        total = float(np.cumsum(w)[-1])  # std::accumulate: sequential
        cp = np.cumsum(w / total)  # std::partial_sum: sequential
        cp[-1] = 1.0
        u = self.canonical()
        return int(np.searchsorted(cp, u, side="left"))
