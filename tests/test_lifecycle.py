"""Lifetimes: close, use after close, GC, and models outliving contexts."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import numpy as np
import pytest

import llama_cffi
from llama_cffi import ClosedError, Context, Model
from tests.conftest import run_isolated


def test_close_is_idempotent(tiny_model_path: Path) -> None:
    """close() may be called any number of times."""
    m = Model.load(tiny_model_path)
    m.close()
    m.close()
    assert m.closed
    assert "closed" in repr(m)


@pytest.mark.parametrize(
    "use",
    [
        lambda m: m.n_embd,
        lambda m: m.desc,
        lambda m: m.metadata,
        lambda m: m.tokenize("a"),
        lambda m: m.detokenize([5]),
        lambda m: m.token_to_piece(5),
        lambda m: m.vocab.bos,
        lambda m: m.vocab.is_eog(2),
        lambda m: m.chat_template(),
        lambda m: m.context(),
        lambda m: m.underlying,
    ],
)
def test_every_method_after_close_raises(tiny_model_path: Path, use: object) -> None:
    """Using a closed model raises ClosedError (a ValueError), never touches freed memory."""
    m = Model.load(tiny_model_path)
    m.close()
    with pytest.raises(ClosedError):
        use(m)  # type: ignore[operator]


def test_with_block_closes(tiny_model_path: Path) -> None:
    """Leaving a with-block closes the model."""
    with Model.load(tiny_model_path) as m:
        assert not m.closed
    assert m.closed


def test_model_is_garbage_collected(tiny_model_path: Path) -> None:
    """An unreferenced model is collected (and freed by its finalizer)."""
    m = Model.load(tiny_model_path)
    ref = weakref.ref(m)
    del m
    gc.collect()
    assert ref() is None


def test_context_keeps_model_alive(tiny_model_path: Path) -> None:
    """Closing a model while a context uses it defers the free: the context keeps working."""
    m = Model.load(tiny_model_path)
    ctx = m.context(n_ctx=64)
    expected = ctx.decode(m.tokenize("hello world")).copy()
    m.close()
    assert m.closed
    with pytest.raises(ClosedError):
        m.tokenize("x")
    ctx.memory.clear()
    # the context still decodes with the (not yet freed) weights
    toks = np.array([1, 5, 6], dtype=np.int32)
    out = ctx.decode(toks)
    assert out.shape == (m.n_vocab,) and np.isfinite(out).all()
    assert m._handle is not None and m._handle.ptr is not None and m._handle._children == 1
    assert expected.shape == out.shape
    ctx.close()
    assert m._handle._children == 1  # the live logits view pins the context, which pins the model
    del out
    gc.collect()
    assert m._handle._children == 0 and m._handle.ptr == llama_cffi.ffi.NULL


def test_dropping_model_reference_with_live_context(tiny_model_path: Path) -> None:
    """Dropping the last user reference to a model while a context lives is safe."""
    ctx = Model.load(tiny_model_path).context(n_ctx=64)
    gc.collect()
    assert np.isfinite(ctx.decode([1, 5, 6])).all()
    ref = weakref.ref(ctx.model)
    del ctx
    gc.collect()
    assert ref() is None


def test_context_close_and_reuse(tiny_model_path: Path) -> None:
    """A closed context raises ClosedError; double close is fine."""
    with Model.load(tiny_model_path) as m:
        ctx = Context(m, n_ctx=64)
        ctx.close()
        ctx.close()
        with pytest.raises(ClosedError):
            ctx.decode([1])
        with pytest.raises(ClosedError):
            ctx.logits()


#: Members of a closed Model/Vocab that need no native object: cached values, pure checks,
#: aliases of close, and objects that fail on first use (checked below).
CLOSED_OK = {
    "Model.free",
    "Model.n_vocab",
    "Vocab.check_token",
    "Vocab.check_tokens",
    "Vocab.streaming_detokenizer",
}


def test_every_member_of_a_closed_model_and_vocab_raises(tiny_model_path: Path) -> None:
    """Every public member of a closed Model and of its Vocab (found by introspection, so
    a new member is covered without a new case) raises ClosedError, in a fresh process."""
    r = run_isolated(
        f"""
        import inspect, llama_cffi
        m = llama_cffi.Model.load({str(tiny_model_path)!r})
        v = m.vocab
        m.close()
        ARGS = {{"text": "hi", "tokens": [1], "token": 1, "key": "general.name", "path": {str(tiny_model_path)!r}}}
        for obj, name in [(m, "Model"), (v, "Vocab")]:
            for attr in sorted(dir(type(obj))):
                if attr.startswith("_") or attr in ("close", "closed", "load", "load_splits", "path"):
                    continue
                static = inspect.getattr_static(type(obj), attr)
                try:
                    val = getattr(obj, attr)
                    if callable(val) and not isinstance(static, property):
                        ps = inspect.signature(val).parameters.values()
                        args = [ARGS.get(p.name, 1) for p in ps
                                if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
                        val(*args)
                    print(name + "." + attr, "NO-ERROR")
                except llama_cffi.ClosedError:
                    print(name + "." + attr, "ClosedError")
                except Exception as e:
                    print(name + "." + attr, type(e).__name__)
        try:
            v.streaming_detokenizer().push(5)
            print("push NO-ERROR")
        except llama_cffi.ClosedError:
            print("push ClosedError")
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    results = dict(line.split() for line in r.stdout.splitlines())
    assert len(results) > 50, results
    wrong = {k: v for k, v in results.items() if v != "ClosedError" and k not in CLOSED_OK}
    assert not wrong, wrong
    assert results["push"] == "ClosedError"


def test_view_alive_at_interpreter_exit_is_released_quietly(tmp_path: Path) -> None:
    """A raw logits array still alive when the interpreter exits is finalized after the
    module globals are gone (hypothesis' import makes the order so): its unpin must not
    print ``Exception ignored ... 'NoneType' object ...``."""
    code = f"""
import numpy as np, llama_cffi as lc
from llama_cffi.testing import write_tiny_model
tiny = lc.Model.load(write_tiny_model({str(tmp_path / "t.gguf")!r}))
with tiny.context(n_ctx=64) as ctx:
    row = np.asarray(ctx.decode(tiny.tokenize("hello world")))
from hypothesis import given, strategies as st
@given(st.integers())
def f(x): pass
f(); tiny.close()
"""
    r = run_isolated(code, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Exception ignored" not in r.stderr and "NoneType" not in r.stderr, r.stderr[-2000:]
