"""Valid values for the every-parameter wrong-type audit of ``llama_cffi`` (see
``tests/wrong_types_child.py``: :data:`FIRST`, :data:`REST_PARAMS`, :data:`ANY_VALUE`).

``FIRST``: a valid first argument where the annotation does not give one (an
``_first_value`` guess such as ``"Hello"`` would fail before the audited parameter is
read). ``REST_PARAMS``: the other arguments where ``REST`` (made for the first-parameter
audit) does not suit. Importing this module makes nothing: every value is made by its
lambda, from the child's ``Env``, when a case runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.wrong_types_child import Env


def _np() -> Any:
    import numpy as np

    return np


def _lib() -> Any:
    from llama_cffi._binding import lib

    return lib


def _ffi() -> Any:
    from llama_cffi._binding import ffi

    return ffi


def _pooling_type() -> Any:
    from llama_cffi.enums import PoolingType

    return PoolingType


def _threadpool() -> Any:
    from llama_cffi.threadpool import Threadpool

    return Threadpool(1)


def _prompt(e: Env) -> list[int]:
    return e.prompt()


def _messages(e: Env) -> list[dict[str, str]]:
    return [{"role": "user", "content": "Hello"}]


def _grammar(e: Env) -> Any:
    from llama_cffi.gbnf import parse_gbnf

    return parse_gbnf('root ::= "a"')


def _model_ptr(e: Env) -> Any:
    """A fresh ``llama_model *`` (vocabulary only) for ``Model(ptr, path)``."""
    from llama_cffi.model_params import ModelParams

    mp = ModelParams(vocab_only=True)  # alive through the call: it owns the struct
    return _lib().llama_model_load_from_file(e.path.encode(), mp.c)


def _projector(e: Env) -> Any:
    from tests.wrong_types_child import FACTORIES

    return FACTORIES["llama_cffi.mtmd.Projector"](e)


def _chunks(e: Env) -> Any:
    return _projector(e).tokenize("Hello")


def _mmproj_path(e: Env) -> str:
    from llama_cffi.testing import write_tiny_gemma3_mmproj

    return str(e.once("mmproj", lambda: write_tiny_gemma3_mmproj(f"{e.folder}/mmproj.gguf", e.model.n_embd_inp)))


def _data_object(e: Env) -> Any:
    """hypothesis's ``st.data()`` object, over an empty choice sequence (nothing is drawn
    before the audited parameter is checked)."""
    from hypothesis import strategies as st
    from hypothesis.internal.conjecture.data import ConjectureData

    return st.DataObject(ConjectureData.for_choices(()))


def _lora_ptr(e: Env) -> Any:
    return _lib().llama_adapter_lora_init(e.model._ptr(), e.lora_path().encode())


#: A valid first argument, per callable.
FIRST: dict[str, Callable[[Env], Any]] = {
    "llama_cffi.backends.os_refuses": lambda e: ("AVX2",),
    "llama_cffi.chat.apply_template": lambda e: "chatml",
    "llama_cffi.chat.media_sources": _messages,
    "llama_cffi.chat.turn_end": lambda e: "chatml",
    "llama_cffi.chat.validate_template": lambda e: "chatml",
    "llama_cffi.chat.with_media_markers": _messages,
    "llama_cffi.context.Context.arun": lambda e: lambda: None,
    "llama_cffi.context.Context.attach_threadpool": lambda e: _threadpool(),
    "llama_cffi.context.Context.decode": _prompt,
    "llama_cffi.context.Context.decode_embeddings": lambda e: _np().zeros((1, e.model.n_embd_inp), _np().float32),
    "llama_cffi.context.Context.encode": _prompt,
    "llama_cffi.context.Context.eval": _prompt,
    "llama_cffi.context.Context.load_seq_state": lambda e: e.context().save_seq_state(),
    "llama_cffi.context.Context.set_abort_callback": lambda e: lambda: False,
    "llama_cffi.context.Context.start_decoder": _prompt,
    "llama_cffi.enums.coerce": lambda e: _pooling_type(),
    "llama_cffi.gbnf.ParsedGrammar": lambda e: _grammar(e).rules,
    "llama_cffi.gbnf.check_grammar": _grammar,
    "llama_cffi.gbnf.resolve_tokens": _grammar,
    "llama_cffi.kernels.RowMeasures.compute": lambda e: _np().zeros((1, e.n_vocab), _np().float32),
    "llama_cffi.kernels.RowMeasures.read_device": lambda e: e.context()._ptr(),
    # n_vocab 2: the base rows REST gives have kl_row_values(2) == 6 columns
    "llama_cffi.kernels.kl_base_rows": lambda e: _np().zeros((1, 2), _np().float32),
    "llama_cffi.kernels.kl_divergence_rows": lambda e: _np().zeros((1, 2), _np().float32),
    "llama_cffi.kernels.rows_log_sum": lambda e: _np().zeros((1, 4), _np().float32),
    "llama_cffi.kernels.top_p_rows": lambda e: _np().zeros((1, 4), _np().float32),
    "llama_cffi.kernels.dist_rows": lambda e: _np().ones((1, 4), _np().float32),
    "llama_cffi.kernels.masked_top_k": lambda e: _np().zeros(1, _np().float32),
    "llama_cffi.kernels.masked_top_k_rows": lambda e: [_np().zeros(1, _np().float32)],
    "llama_cffi.kernels.softmax_dot": lambda e: _np().zeros(4, _np().float32),
    "llama_cffi.kernels.softmax_sum": lambda e: _np().zeros(4, _np().float32),
    "llama_cffi.lora.normalise_adapters": lambda e: {},
    "llama_cffi.media.Image": lambda e: _np().zeros((4, 4, 3), _np().uint8),
    "llama_cffi.media_file.check_media": lambda e: b"",
    "llama_cffi.mmproj_file.check_mmproj": _mmproj_path,
    "llama_cffi.model.Model": _model_ptr,
    "llama_cffi.model.Model.apply_chat_template": _messages,
    "llama_cffi.model.Model.detokenize": _prompt,
    "llama_cffi.model.Model.format_chat": _messages,
    "llama_cffi.model.Model.validate_chat_template": lambda e: None,  # the model's own template
    "llama_cffi.mtmd.Chunk": _chunks,
    "llama_cffi.mtmd.Chunks": _projector,
    "llama_cffi.mtmd.Projector.tokenize_chat": _messages,
    "llama_cffi.outputs.OutputBuffer": lambda e: _ffi().new("float[]", 4),
    "llama_cffi.outputs.OutputView": lambda e: e.view()._buf,
    "llama_cffi.rpc.add_servers": lambda e: ["127.0.0.1:1"],
    "llama_cffi.rpc.check_server": lambda e: "127.0.0.1:1",
    "llama_cffi.rpc.serve": lambda e: "127.0.0.1",
    "llama_cffi.rpc.wait_for_server": lambda e: "127.0.0.1:1",
    # the first parameter is the name the messages give the value: the audited one's
    "llama_cffi.sampling.check_float": lambda e: "value",
    "llama_cffi.sampling.check_int": lambda e: "value",
    "llama_cffi.sampling.LlamaSampler": lambda e: _lib().llama_sampler_init_greedy(),
    "llama_cffi.sampling.TokenDataArray.fill": lambda e: _np().zeros(1, _np().int32),
    "llama_cffi.testing._checks.expect_raises": lambda e: ValueError,
    "llama_cffi.testing._kv_machine.KvCacheMachine.held": _data_object,
    "llama_cffi.testing.write_tiny": lambda e: "llama",
    "llama_cffi.vocab.Vocab.check_tokens": _prompt,
    "llama_cffi.vocab.Vocab.detokenize": _prompt,
    "llama_cffi.vocab.Vocab.detokenize_bytes": _prompt,
}

#: (positional arguments after the first, keyword arguments), where REST's do not suit.
REST_PARAMS: dict[str, Callable[[Env], tuple[tuple[Any, ...], dict[str, Any]]]] = {
    # the last parameter names the value in the messages: "value", the audited one's name
    "llama_cffi.enums.coerce": lambda e: ((0, "value"), {}),
    # a real adapter pointer: REST's NULL is refused before the path is read
    "llama_cffi.lora.LoraAdapter": lambda e: ((_lora_ptr(e), e.lora_path()), {}),
    "llama_cffi.mtmd.Projector.eval": lambda e: ((_chunks(e),), {}),
}

#: "callable:param" -> why any value is right for that parameter.
ANY_VALUE: dict[str, str] = {}
