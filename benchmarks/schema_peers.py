"""Peer grammar engines as JSON-schema validators, for :mod:`benchmarks.schema_suite`.

:func:`compile_fn` gives, for one peer engine, the function ``score_group`` calls: it
compiles a suite group's schema with the engine's own JSON-schema compiler and returns
``accepts(text)``, whether the engine's grammar accepts ``text`` as a whole document.
Every schema is handed over as ``json.dumps(group.schema)`` (a boolean schema too); the
group's draft is not passed on (none of the engines takes one). Each engine compiles with
the options closest to a validator's reading of the schema:

* ``xgrammar`` 0.2.8 (imported without torch/transformers/triton, through the stub
  modules of ``bench_grammar_peers._import_xgrammar``):
  ``Grammar.from_json_schema(schema, any_whitespace=True, strict_mode=False)`` (any JSON
  whitespace between tokens; properties and items the schema does not forbid are
  allowed, where the default strict mode forbids them; ``any_order`` left at its default
  False, so properties follow the schema's order, the only mode that checks required
  keys), compiled by ``GrammarCompiler(TokenizerInfo([]), cache_enabled=False)``; a text is
  checked as ``xgrammar.testing._is_grammar_accept_string`` does: a
  ``GrammarMatcher(compiled, terminate_without_stop_token=True)`` (reset before each
  text) accepts it with ``accept_string`` and must then be ``is_terminated()``.
* ``llguidance`` 1.9.1: ``LLMatcher.grammar_from_json_schema(schema,
  defaults={"whitespace_flexible": True})`` (its default: ``[\\x20\\x0A\\x0D\\x09]+``
  allowed around every token; ``lenient`` left False, so a schema with a keyword it does
  not implement is refused, which counts as not compiled), then
  ``LLMatcher(tokenizer, grammar, log_level=0)``; a matcher in error after construction
  (``is_error()``) is raised as an exception. The tokenizer is a byte-level one built here:
  token ``b`` is the single byte ``b`` for ``b`` < 255, then two special tokens (a byte
  0xFF, which UTF-8 never uses, and the EOS), no slices. A text is accepted when a copy
  (``deep_copy``) of the fresh matcher consumes all of its UTF-8 bytes, one token each
  (``consume_tokens``), without error and is then ``is_accepting()`` (EOS allowed).
* ``outlines-core`` 0.2.14: ``json_schema.build_regex_from_schema(schema,
  whitespace_pattern=r"[ \\t\\n\\r]*", max_recursion_depth=3)`` (any JSON whitespace,
  where its default ``[ ]?`` allows at most one space; the default recursion depth);
  the regex is compiled by Python's ``re`` (or the ``regex`` package, when installed, if
  ``re`` cannot compile it; an error from both is "did not compile") and a text is
  accepted when it ``fullmatch``-es.

Time: compiling one schema (everything up to a usable ``accepts``) is stopped after
``timeout_s`` seconds (default 10) with a ``TimeoutError``; checking one text after
``accept_timeout_s`` (default 10), the text then counted as not accepted (``score_group``
would stop on an exception) and its group's name added to :data:`ACCEPT_TIMEOUTS`. In the
main thread the bound is a ``SIGALRM`` timer: Python code and ``re`` see it at once, an
engine's native code when it returns (so a compile that returns late is still reported as
a ``TimeoutError``); elsewhere the work runs in a daemon thread that is left behind when
it overruns.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")

#: engine -> (the distribution it comes from, the version this module was written for)
PEERS: dict[str, tuple[str, str]] = {
    "xgrammar": ("xgrammar", "0.2.8"),
    "llguidance": ("llguidance", "1.9.1"),
    "outlines-core": ("outlines-core", "0.2.14"),
}
#: the whitespace outlines-core's regex allows between JSON tokens (any JSON whitespace)
OUTLINES_WHITESPACE = r"[ \t\n\r]*"
#: names of the groups (``group.name``) where checking a text ran out of time
ACCEPT_TIMEOUTS: list[str] = []


# ---------------------------------------------------------------------- time bounds
def _bounded(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    """``fn()``, or ``TimeoutError`` when it runs for more than ``timeout_s`` seconds."""
    message = f"{what} took more than {timeout_s:g} s"
    if threading.current_thread() is not threading.main_thread():
        return _bounded_in_thread(fn, timeout_s, message)

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(message)

    old = signal.signal(signal.SIGALRM, on_alarm)
    t0 = time.perf_counter()
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            result = fn()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, old if old is not None else signal.SIG_DFL)
    if time.perf_counter() - t0 > timeout_s:  # native code that returned late
        raise TimeoutError(message)
    return result


def _bounded_in_thread(fn: Callable[[], T], timeout_s: float, message: str) -> T:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # handed to the caller
            box["error"] = e

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise TimeoutError(message)
    if "error" in box:
        raise box["error"]
    return box["result"]  # type: ignore[no-any-return]


def _bounded_accepts(check: Callable[[str], bool], name: str, accept_timeout_s: float) -> Callable[[str], bool]:
    def accepts(text: str) -> bool:
        try:
            return _bounded(lambda: check(text), accept_timeout_s, "checking a text")
        except TimeoutError:
            ACCEPT_TIMEOUTS.append(name)
            return False

    return accepts


# ---------------------------------------------------------------------- the engines
def _schema_text(group: Any) -> str:
    return json.dumps(group.schema)


def _xgrammar() -> Any:
    from benchmarks.bench_grammar_peers import _import_xgrammar

    return _import_xgrammar()


def _xgrammar_compile(group: Any) -> Callable[[str], bool]:
    xgr = _xgrammar()
    grammar = xgr.Grammar.from_json_schema(_schema_text(group), any_whitespace=True, strict_mode=False)
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)
    matcher = xgr.GrammarMatcher(compiler.compile_grammar(grammar), terminate_without_stop_token=True)

    def check(text: str) -> bool:
        matcher.reset()
        return bool(matcher.accept_string(text)) and bool(matcher.is_terminated())

    return check


_LLG_TOKENIZER: Any = None


def _llguidance_tokenizer() -> Any:
    """A byte-level ``LLTokenizer``: tokens 0..254 are those bytes, 255 a special token
    standing for byte 0xFF (never in UTF-8), 256 the EOS."""
    global _LLG_TOKENIZER
    if _LLG_TOKENIZER is None:
        import llguidance

        class _Bytes:
            # what llguidance.TokenizerWrapper reads; a leading 0xFF marks a special token
            def __init__(self) -> None:
                self.tokens = [bytes([b]) for b in range(255)] + [b"\xff[0xff]", b"\xff<eos>"]
                self.eos_token_id = 256
                self.bos_token_id = None
                self.special_token_ids = [255, 256]

            def __call__(self, s: bytes | str) -> list[int]:
                return list(s if isinstance(s, bytes) else s.encode())

        _LLG_TOKENIZER = llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(_Bytes()), n_vocab=257, eos_token=256, slices=[]
        )
    return _LLG_TOKENIZER


def _llguidance_compile(group: Any) -> Callable[[str], bool]:
    import llguidance

    grammar = llguidance.LLMatcher.grammar_from_json_schema(_schema_text(group), defaults={"whitespace_flexible": True})
    fresh = llguidance.LLMatcher(_llguidance_tokenizer(), grammar, log_level=0)
    if fresh.is_error():
        raise ValueError(f"llguidance: {fresh.get_error()}")

    def check(text: str) -> bool:
        matcher = fresh.deep_copy()  # an error state is never left: a copy per text
        ok = matcher.consume_tokens(list(text.encode()))
        return bool(ok) and not matcher.is_error() and bool(matcher.is_accepting())

    return check


def _outlines_compile(group: Any) -> Callable[[str], bool]:
    from outlines_core.json_schema import build_regex_from_schema  # type: ignore[import-untyped,unused-ignore]

    pattern = build_regex_from_schema(
        _schema_text(group), whitespace_pattern=OUTLINES_WHITESPACE, max_recursion_depth=3
    )
    compiled: Any
    try:
        compiled = re.compile(pattern)
    except re.error as e:
        try:
            import regex  # type: ignore[import-not-found,import-untyped,unused-ignore]
        except ImportError:
            raise ValueError(f"Python's re cannot compile outlines-core's regex: {e}") from e
        compiled = regex.compile(pattern)

    def check(text: str) -> bool:
        return compiled.fullmatch(text) is not None

    return check


_COMPILERS: dict[str, Callable[[Any], Callable[[str], bool]]] = {
    "xgrammar": _xgrammar_compile,
    "llguidance": _llguidance_compile,
    "outlines-core": _outlines_compile,
}


def _import(engine: str) -> None:
    if engine == "xgrammar":
        _xgrammar()
    elif engine == "llguidance":
        _llguidance_tokenizer()
    else:
        import outlines_core.json_schema  # type: ignore[import-untyped,unused-ignore]  # noqa: F401


# ---------------------------------------------------------------------- the API
def peer_skip_reason(engine: str) -> str | None:
    """None when ``engine`` imports at its pinned version, else why it cannot run."""
    if engine not in PEERS:
        return f"unknown engine {engine!r} (known: {', '.join(PEERS)})"
    dist, want = PEERS[engine]
    try:
        have = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return f"{dist} is not installed (pip install {dist}=={want})"
    if have != want:
        return f"{dist} {have} is installed, not the pinned {want} (pip install {dist}=={want})"
    try:
        _import(engine)
    except Exception as e:  # reported as the reason
        return f"{dist} {want} does not import: {type(e).__name__}: {e}"[:300]
    return None


def compile_fn(
    engine: str, *, timeout_s: float = 10.0, accept_timeout_s: float = 10.0
) -> Callable[[Any], Callable[[str], bool]]:
    """For ``score_group``: a function that compiles a ``schema_suite.Group``'s schema with
    ``engine`` (``TimeoutError`` past ``timeout_s`` seconds) and returns ``accepts(text)``."""
    if engine not in _COMPILERS:
        raise ValueError(f"unknown engine {engine!r} (known: {', '.join(PEERS)})")
    compile_one = _COMPILERS[engine]

    def compile_group(group: Any) -> Callable[[str], bool]:
        check = _bounded(lambda: compile_one(group), timeout_s, f"{engine}: compiling the schema")
        return _bounded_accepts(check, str(getattr(group, "name", "?")), accept_timeout_s)

    return compile_group
