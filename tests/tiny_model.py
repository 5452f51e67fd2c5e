"""The tiny test model, now shipped in the library (:mod:`llama_cffi.testing`); this
module re-exports it so the tests' ``from tests import tiny_model as tm`` keeps working."""

from __future__ import annotations

from llama_cffi.testing import (
    BOS_ID,
    BYTE_TOKEN_OFFSET,
    CHATML_TEMPLATE,
    EOS_ID,
    EOT_ID,
    IM_END_ID,
    IM_START_ID,
    N_VOCAB,
    PAD_ID,
    SCORES,
    TOKEN_TYPES,
    TOKENS,
    UNK_ID,
    write_tiny_model,
)

__all__ = [
    "BOS_ID",
    "BYTE_TOKEN_OFFSET",
    "CHATML_TEMPLATE",
    "EOS_ID",
    "EOT_ID",
    "IM_END_ID",
    "IM_START_ID",
    "N_VOCAB",
    "PAD_ID",
    "SCORES",
    "TOKENS",
    "TOKEN_TYPES",
    "UNK_ID",
    "write_tiny_model",
]
