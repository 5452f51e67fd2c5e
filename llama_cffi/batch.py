"""``Batch``: a reusable ``llama_batch`` whose arrays are numpy arrays (no copies).

The batch's memory is owned by numpy, not by llama.cpp: ``token``, ``pos``,
``n_seq_id``, ``logits`` and ``seq_id`` (``capacity x n_seq_max``) are ordinary numpy
arrays, and the ``struct llama_batch`` handed to ``llama_decode`` points into them.
Filling a batch from numpy writes straight into the memory llama.cpp reads; nothing
is allocated per token, and no view can ever dangle.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ._args import expect_int, expect_iterable, type_error
from ._binding import ffi
from .errors import ParamError


class Batch:
    """Tokens (with positions, sequence ids and output flags) for one ``llama_decode``.

    With ``n_embd > 0`` it carries input embeddings instead of token ids: ``embd`` is a
    ``(capacity, n_embd)`` float32 array, row ``i`` the input of entry ``i`` (``n_embd``
    must be the model's ``n_embd_inp``; :meth:`llama_cffi.Context.decode_batch` checks),
    and ``token`` is not read.

    ``n_pos``: positions per entry, 1, or 4 for embeddings into a model with M-RoPE
    positions (Qwen2-VL and others: ``Model.n_pos_per_embd``), which llama.cpp reads
    section-major: ``pos[j * n_tokens + i]`` is section ``j`` (t, y, x, z) of entry ``i``
    (:meth:`set_mrope_positions` writes them)."""

    def __init__(self, capacity: int, n_seq_max: int = 1, n_embd: int = 0, n_pos: int = 1) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ParamError(f"capacity must be an int >= 1, not {capacity!r}")
        if isinstance(n_seq_max, bool) or not isinstance(n_seq_max, int) or n_seq_max < 1:
            raise ParamError(f"n_seq_max must be an int >= 1, not {n_seq_max!r}")
        if isinstance(n_embd, bool) or not isinstance(n_embd, int) or n_embd < 0:
            raise ParamError(f"n_embd must be an int >= 0, not {n_embd!r}")
        if n_pos not in (1, 4) or isinstance(n_pos, bool):
            raise ParamError(f"n_pos must be 1 or 4 (M-RoPE embeddings), not {n_pos!r}")
        if n_pos == 4 and not n_embd:
            raise ParamError("n_pos=4 is for embeddings (n_embd > 0): llama.cpp reads one position per token")
        self.capacity = capacity
        self.n_seq_max = n_seq_max
        self.n_embd = n_embd
        self.n_pos = n_pos
        self.embd = np.zeros((capacity if n_embd else 0, n_embd), dtype=np.float32)
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity * n_pos, dtype=np.int32)
        self.n_seq_id = np.zeros(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        self.seq_id = np.zeros((capacity, n_seq_max), dtype=np.int32)
        rows = ffi.cast("llama_seq_id *", ffi.from_buffer(self.seq_id))
        self._seq_ptrs = ffi.new("llama_seq_id *[]", [rows + i * n_seq_max for i in range(capacity)])
        b = ffi.new("struct llama_batch *")
        if n_embd:  # llama.cpp reads the embeddings when the token pointer is NULL
            b.token = ffi.NULL
            b.embd = ffi.cast("float *", ffi.from_buffer(self.embd))
        else:
            b.token = ffi.cast("llama_token *", ffi.from_buffer(self.token))
            b.embd = ffi.NULL
        b.pos = ffi.cast("llama_pos *", ffi.from_buffer(self.pos))
        b.n_seq_id = ffi.cast("int32_t *", ffi.from_buffer(self.n_seq_id))
        b.seq_id = self._seq_ptrs
        b.logits = ffi.cast("int8_t *", ffi.from_buffer(self.logits))
        self._c = b
        self.n_tokens = 0

    @property
    def c(self) -> Any:
        """The ``struct llama_batch`` with ``n_tokens`` set (pass to ``llama_decode``)."""
        b = self._c
        b.n_tokens = self.n_tokens
        return b[0]

    def clear(self) -> None:
        self.n_tokens = 0

    def set_mrope_positions(self, positions: npt.NDArray[np.integer[Any]]) -> None:
        """Write the M-RoPE positions of the first ``n_tokens`` entries from an
        ``(n_tokens, 4)`` array (t, y, x, z per entry), section-major as llama.cpp reads
        them. Set ``n_tokens`` first."""
        n = self.n_tokens
        if not isinstance(positions, np.ndarray) or positions.dtype.kind not in "iu":
            raise type_error("positions", f"an integer numpy array of shape ({n}, 4)", positions)
        if self.n_pos != 4:
            raise ParamError("set_mrope_positions needs a batch made with n_pos=4")
        arr = positions
        if arr.shape != (n, 4):
            raise ParamError(f"positions must have shape ({n}, 4), not {arr.shape}")
        self.pos[: 4 * n] = arr.T.reshape(-1)

    def set_sequence(
        self,
        tokens: npt.NDArray[np.int32],
        start_pos: int,
        seq_id: int = 0,
        output_last: bool = True,
    ) -> None:
        """Fill with ``tokens`` at positions ``start_pos...`` of one sequence (vectorised)."""
        expect_iterable("tokens", tokens, "a sequence or array of token ids")
        start_pos = expect_int("start_pos", start_pos)
        seq_id = expect_int("seq_id", seq_id)
        if not isinstance(output_last, (bool, int, np.bool_, np.integer)):
            raise type_error("output_last", "a bool", output_last)
        n = len(tokens)
        if n > self.capacity:
            raise ParamError(f"{n} tokens do not fit a batch of capacity {self.capacity}")
        self.token[:n] = tokens
        self.pos[:n] = np.arange(start_pos, start_pos + n, dtype=np.int32)
        self.n_seq_id[:n] = 1
        self.seq_id[:n, 0] = seq_id
        self.logits[:n] = 0
        if output_last and n:
            self.logits[n - 1] = 1
        self.n_tokens = n

    def add(self, token: int, pos: int, seq_ids: tuple[int, ...] | list[int] = (0,), output: bool = False) -> None:
        """Append one token (at position ``pos``, in ``seq_ids``)."""
        token, pos = expect_int("token", token), expect_int("pos", pos)
        if not isinstance(seq_ids, (tuple, list, np.ndarray)):
            raise type_error("seq_ids", "a tuple or list of sequence ids", seq_ids)
        if not isinstance(output, (bool, int, np.bool_, np.integer)):
            raise type_error("output", "a bool", output)
        i = self.n_tokens
        if i >= self.capacity:
            raise ParamError(f"batch is full ({self.capacity} tokens)")
        if not 1 <= len(seq_ids) <= self.n_seq_max:
            raise ParamError(f"a token belongs to 1..{self.n_seq_max} sequences, got {len(seq_ids)}")
        self.token[i] = token
        self.pos[i] = pos
        self.n_seq_id[i] = len(seq_ids)
        self.seq_id[i, : len(seq_ids)] = seq_ids
        self.logits[i] = 1 if output else 0
        self.n_tokens = i + 1

    def seq_ids(self, i: int) -> list[int]:
        """The sequences of the ``i``-th token."""
        i = expect_int("i", i)
        return [int(x) for x in self.seq_id[i, : int(self.n_seq_id[i])]]
