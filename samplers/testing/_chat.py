"""Hypothesis strategies for chat conversations and tool calls (OpenAI's message shapes,
as :class:`~samplers.chat.ChatSession`, :meth:`llama_cffi.Model.format_chat` and
:mod:`samplers.tools` take them)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from llama_cffi._args import expect_bool, expect_int, type_error
from llama_cffi.testing import texts

from ..tools import ToolCall
from ._hypothesis import _require_hypothesis

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = ["chat_messages", "tool_calls", "tool_specs"]

_NAME = "abcdefghijklmnopqrstuvwxyz_"
#: JSON-schema types of the arguments :func:`tool_specs` draws, with the values that fit them.
_ARG_TYPES = ("string", "integer", "number", "boolean")


def _check_range(name_lo: str, lo: int, name_hi: str, hi: int) -> tuple[int, int]:
    lo, hi = expect_int(name_lo, lo), expect_int(name_hi, hi)
    if lo < 0 or hi < lo:
        raise ValueError(f"need 0 <= {name_lo} <= {name_hi}, not {lo} and {hi}")
    return lo, hi


def _check_specs(name: str, specs: object) -> None:
    """``specs`` is a non-empty list of function specs with names (a TypeError naming
    ``name`` otherwise)."""
    ok = isinstance(specs, list) and all(
        isinstance(s, dict) and isinstance(s.get("function"), dict) and isinstance(s["function"].get("name"), str)
        for s in specs
    )
    if not ok:
        raise type_error(name, "a list of OpenAI-style function specs ({'function': {'name': ...}})", specs)
    if not specs:
        raise ValueError(f"{name} needs at least one spec")


def tool_specs(*, min_tools: int = 1, max_tools: int = 3, max_params: int = 3) -> SearchStrategy[list[dict[str, Any]]]:
    """Lists of OpenAI-style function specs (``{"type": "function", "function": {"name",
    "description", "parameters"}}``) with distinct names; each takes an object of up to
    ``max_params`` properties of simple types (string, integer, number, boolean), all
    required."""
    _require_hypothesis()
    from hypothesis import strategies as st

    lo, hi = _check_range("min_tools", min_tools, "max_tools", max_tools)
    n_params = expect_int("max_params", max_params)
    if n_params < 0:
        raise ValueError(f"max_params must be >= 0, not {n_params}")
    names = st.text(_NAME, min_size=1, max_size=12).filter(lambda s: s[0] != "_")

    @st.composite
    def spec(draw: Any, name: str) -> dict[str, Any]:
        props = draw(st.dictionaries(names, st.sampled_from(_ARG_TYPES), max_size=n_params))
        return {
            "type": "function",
            "function": {
                "name": name,
                "description": draw(texts(max_pieces=6)),
                "parameters": {
                    "type": "object",
                    "properties": {k: {"type": t} for k, t in props.items()},
                    "required": sorted(props),
                },
            },
        }

    @st.composite
    def specs(draw: Any) -> list[dict[str, Any]]:
        chosen = draw(st.lists(names, min_size=lo, max_size=hi, unique=True))
        return [draw(spec(n)) for n in chosen]

    return specs()


def _value(draw: Any, kind: str) -> Any:
    from hypothesis import strategies as st

    if kind == "string":
        return draw(texts(max_pieces=6))
    if kind == "integer":
        return draw(st.integers(-(2**31), 2**31 - 1))
    if kind == "number":
        # at most 6 decimals: llama.cpp's JSON grammar takes at most 16 after the point
        return round(draw(st.floats(-1e6, 1e6, allow_nan=False)), 6)
    return draw(st.booleans())


def tool_calls(
    specs: list[dict[str, Any]] | None = None, *, min_calls: int = 1, max_calls: int = 2
) -> SearchStrategy[list[ToolCall]]:
    """Lists of :class:`~samplers.tools.ToolCall` whose names are those of ``specs`` (drawn
    with :func:`tool_specs` when None) and whose arguments (JSON text) satisfy the spec's
    parameters; ids ``call_0``, ``call_1``..."""
    _require_hypothesis()
    from hypothesis import strategies as st

    if specs is not None:
        _check_specs("specs", specs)
    lo, hi = _check_range("min_calls", min_calls, "max_calls", max_calls)

    @st.composite
    def calls(draw: Any) -> list[ToolCall]:
        fns = specs if specs is not None else draw(tool_specs())
        if not fns:
            raise ValueError("tool_calls needs at least one spec")
        out = []
        for i in range(draw(st.integers(lo, hi))):
            fn = draw(st.sampled_from(fns))["function"]
            props = fn.get("parameters", {}).get("properties", {})
            args = {k: _value(draw, p.get("type", "string")) for k, p in props.items()}
            out.append(ToolCall(fn["name"], json.dumps(args, ensure_ascii=False), f"call_{i}"))
        return out

    return calls()


def chat_messages(
    *,
    min_turns: int = 1,
    max_turns: int = 4,
    system: bool | None = None,
    parts: bool = True,
    tools: list[dict[str, Any]] | None = None,
) -> SearchStrategy[list[dict[str, Any]]]:
    """Conversations of OpenAI-style message dicts that end with a user message (ready for
    a generation prompt): an optional system message (``system``: always, never, or
    None: either), then ``min_turns`` to ``max_turns`` turns of a user message and, but
    for the last, the assistant's reply. Contents are texts that stress tokenizers and
    templates (:func:`llama_cffi.testing.texts`), and with ``parts`` sometimes lists of
    text parts. With ``tools`` (specs), an assistant reply may be tool calls
    (:func:`tool_calls` of them, its ``tool_calls`` entries) followed by one ``tool``
    message per call (``tool_call_id``, ``name``) before the next user message."""
    _require_hypothesis()
    from hypothesis import strategies as st

    lo, hi = _check_range("min_turns", min_turns, "max_turns", max_turns)
    if system is not None:
        system = expect_bool("system", system)
    parts = expect_bool("parts", parts)
    if tools is not None:
        _check_specs("tools", tools)
    if lo < 1:
        raise ValueError("a conversation needs at least one turn (min_turns >= 1)")
    text = texts(max_pieces=10)
    content: SearchStrategy[Any] = text
    if parts:
        part = text.map(lambda t: {"type": "text", "text": t})
        content = st.one_of(text, st.lists(part, min_size=1, max_size=3))

    @st.composite
    def conversation(draw: Any) -> list[dict[str, Any]]:
        msgs: list[dict[str, Any]] = []
        if system if system is not None else draw(st.booleans()):
            msgs.append({"role": "system", "content": draw(text)})
        n = draw(st.integers(lo, hi))
        for turn in range(n):
            msgs.append({"role": "user", "content": draw(content)})
            if turn == n - 1:
                break
            if tools and draw(st.booleans()):
                calls = draw(tool_calls(tools))
                msgs.append({"role": "assistant", "content": "", "tool_calls": [c.message() for c in calls]})
                for c in calls:
                    msgs.append({"role": "tool", "tool_call_id": c.id, "name": c.name, "content": draw(text)})
            else:
                msgs.append({"role": "assistant", "content": draw(text)})
        return msgs

    return conversation()
