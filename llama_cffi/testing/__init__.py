"""Helpers for property-based tests of code built on llama_cffi.

Usable without a real model installed:

* A tiny LoRA (or aLoRA) adapter for the tiny model (:func:`write_tiny_lora`).
* Tiny random-weight multimodal projectors for libmtmd (:func:`write_tiny_gemma3_mmproj`,
  an image one; :func:`write_tiny_ultravox_mmproj`, an audio one), paired with any text
  model of the embedding width they are written for; and a tiny Qwen2-VL pair
  (:func:`write_tiny_qwen2vl_model`, :func:`write_tiny_qwen2vl_mmproj`) whose text model
  places images with M-RoPE positions.
* A tiny, deterministic, random-weight GGUF model (:func:`write_tiny_model`, a few
  hundred kilobytes, written in milliseconds) with a real SentencePiece-style vocabulary
  of ``N_VOCAB`` tokens: byte fallback (any UTF-8 text round-trips), a few dozen
  English words, BOS/EOS and the ChatML markers. ``TOKENS``, ``SCORES``,
  ``TOKEN_TYPES`` and the ``*_ID`` constants describe that vocabulary. The same in
  every kind of model llama.cpp has (:data:`TINY_KINDS`, :func:`write_tiny`): quantized,
  sliding-window, encoder-only with pooling or a reranking head, encoder-decoder,
  recurrent and hybrid. Writing a file needs the ``gguf`` package (``pip install gguf``),
  imported only when called.
* `hypothesis <https://hypothesis.readthedocs.io>`_ strategies for the inputs such code
  takes: :func:`logits_rows` (float32 logits rows with ties and ``-inf``),
  :func:`token_sequences` (valid token ids of a model) and :func:`texts` (text that
  stresses tokenizers). hypothesis is imported when a strategy is first asked for, so
  this module imports without it; the strategy functions raise an ImportError saying
  ``pip install hypothesis`` when it is missing.
* :class:`KvCacheMachine`, a hypothesis state machine of one context's KV memory against
  :class:`KvCells` (a pure-Python model of llama.cpp's unified KV cells), and
  :func:`decode_equivalence`: logits against a fresh one-token-at-a-time decode.

This is a subpackage; its parts (the writers, the strategies, the state machine) are
private modules, and everything is imported from ``llama_cffi.testing`` itself.

The pytest plugin :mod:`llama_cffi.pytest_plugin` (registered automatically) provides
``tiny_model_path``, ``tiny_model``, ``tiny_context``, ``tiny_model_of`` (a tiny model of
any kind), ``default_model_path`` and ``default_model`` fixtures. Strategies for sampler chains and GBNF grammars are in
:mod:`samplers.testing` (``llama_cffi`` never imports ``samplers``). A property test over
the tiny model::

    from hypothesis import given, strategies as st
    from llama_cffi.testing import token_sequences

    @given(data=st.data())
    def test_decode_is_finite(tiny_model, data):
        tokens = data.draw(token_sequences(tiny_model, min_size=1, max_size=16))
        with tiny_model.context(n_ctx=64) as ctx:
            assert np.isfinite(ctx.decode(tokens)).all()
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._args import type_error
from ._checks import decode_equivalence, expect_raises
from ._kv_cells import KvCells
from ._strategies import (
    ELEMENTWISE_MAX as ELEMENTWISE_MAX,
)
from ._strategies import (
    TEXT_PIECES as TEXT_PIECES,
)
from ._strategies import (
    _require_hypothesis,
    floats32,
    logits_rows,
    texts,
    token_ids,
    token_sequences,
)
from ._tiny_encoders import write_tiny_bert, write_tiny_t5
from ._tiny_lora import write_tiny_lora
from ._tiny_mmproj import write_tiny_gemma3_mmproj, write_tiny_ultravox_mmproj
from ._tiny_model import (
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
from ._tiny_qwen2vl import write_tiny_qwen2vl_mmproj, write_tiny_qwen2vl_model
from ._tiny_recurrent import write_tiny_hybrid, write_tiny_mamba
from ._tiny_variants import write_tiny_quantized, write_tiny_swa

if TYPE_CHECKING:
    from ._kv_machine import KvCacheMachine as KvCacheMachine

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
    "TINY_KINDS",
    "TOKENS",
    "TOKEN_TYPES",
    "UNK_ID",
    "KvCacheMachine",
    "KvCells",
    "decode_equivalence",
    "expect_raises",
    "floats32",
    "logits_rows",
    "texts",
    "token_ids",
    "token_sequences",
    "write_tiny",
    "write_tiny_bert",
    "write_tiny_gemma3_mmproj",
    "write_tiny_hybrid",
    "write_tiny_lora",
    "write_tiny_mamba",
    "write_tiny_model",
    "write_tiny_quantized",
    "write_tiny_qwen2vl_mmproj",
    "write_tiny_qwen2vl_model",
    "write_tiny_swa",
    "write_tiny_t5",
    "write_tiny_ultravox_mmproj",
]

#: Every kind of tiny model, by name: the writer and its arguments. One of each memory and
#: graph kind llama.cpp has: a decoder (``llama``), its Q8_0 and Q4_0 copies (quantized
#: kernels; Q4_0 goes through the CPU weight repacking), sliding-window attention
#: (``swa``: gemma3 with an 8-token window), encoder-only models with MEAN/CLS/LAST pooling
#: and a reranker (``bert*``), an encoder-decoder (``t5``), a recurrent model (``mamba``)
#: and a hybrid of attention and recurrent layers (``hybrid``: lfm2). All share the tiny
#: SentencePiece vocabulary (``TOKENS``), are a few hundred KB, and are byte-identical
#: for the same name.
TINY_KINDS: dict[str, tuple[Callable[..., Path], dict[str, object]]] = {
    "llama": (write_tiny_model, {}),
    "llama-q8_0": (write_tiny_quantized, {"qtype": "q8_0"}),
    "llama-q4_0": (write_tiny_quantized, {"qtype": "q4_0"}),
    "swa": (write_tiny_swa, {}),
    "bert": (write_tiny_bert, {"pooling": "mean"}),
    "bert-cls": (write_tiny_bert, {"pooling": "cls"}),
    "bert-last": (write_tiny_bert, {"pooling": "last"}),
    "bert-rank": (write_tiny_bert, {"pooling": "cls", "rank": True}),
    "t5": (write_tiny_t5, {}),
    "mamba": (write_tiny_mamba, {}),
    "hybrid": (write_tiny_hybrid, {}),
}


def write_tiny(kind: str, path: str | os.PathLike[str], **kwargs: object) -> Path:
    """Write the tiny model of ``kind`` (a key of :data:`TINY_KINDS`) to ``path``;
    ``kwargs`` override the kind's arguments (``seed=``, sizes, ``extra_metadata=``)."""
    if not isinstance(kind, str):
        raise type_error("kind", f"a str, one of {sorted(TINY_KINDS)}", kind)
    try:
        writer, defaults = TINY_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown tiny model kind {kind!r}; choose from {sorted(TINY_KINDS)}") from None
    return writer(path, **{**defaults, **kwargs})


def __getattr__(name: str) -> Any:
    # The state machine subclasses hypothesis's RuleBasedStateMachine: imported when asked
    # for, so that this package imports without hypothesis.
    if name == "KvCacheMachine":
        _require_hypothesis()
        from ._kv_machine import KvCacheMachine

        return KvCacheMachine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "KvCacheMachine"})
