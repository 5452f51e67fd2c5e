"""Tool calls: how a chat template writes them, parsing them out of a reply, and a lazy
grammar that keeps a call well-formed once the model starts one.

:func:`tool_call_format` finds a template's format the way llama.cpp's differential
analysis does (``common/chat-diff-analyzer.cpp``), by rendering a probe conversation with
one tool call: the text before the call's JSON object (``<tool_call>\n`` for Hermes and
Qwen 2.5), the keys of its name and arguments, and the text after it. It handles
templates that write a call as a JSON object (or a JSON list of them) between markers.
Two families are checked against llama.cpp in the tests (prompts, parsed calls and the
lazy grammar's trigger): Qwen 2.5's (one JSON object per ``<tool_call>``) and Llama 3.3
Nemotron's (a JSON list between ``<TOOLCALL>`` and ``</TOOLCALL>``). Others of that shape
(Mistral's ``[TOOL_CALLS]`` list) go through the same probe but are not checked: llama.cpp
at the pinned commit cannot read Mistral Small 3.1's template. Templates that write calls
another way (XML arguments, Python syntax) get ``None``: no tool calls are parsed, the
reply is content. Templates that do not declare tools (the tiny model's ChatML, Gemma
3's) render no tools and parse none, as in llama.cpp.

:func:`parse_tool_calls` splits a reply into its content and :class:`ToolCall` objects;
``tests/test_tools.py`` compares it with llama.cpp's ``common_chat_parse``. One difference:
with parallel calls off, llama.cpp's parser for Nemotron's format refuses a reply that
lists two calls (an error), where this returns both.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llama_cffi._args import expect, expect_bool, expect_iterable, expect_str
from llama_cffi.chat import apply_template, turn_end
from llama_cffi.errors import ParamError

__all__ = ["ToolCall", "ToolCallFormat", "parse_tool_calls", "tool_call_format", "tool_call_grammar"]

_PROBE_NAME = "llama_cffi_probe_tool"
_PROBE_ARG = "llama_cffi_probe_value"


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for: the function's ``name``, its ``arguments`` as JSON
    text (as OpenAI's API and llama.cpp give them) and an ``id`` (empty when the model
    gave none)."""

    name: str
    arguments: str
    id: str = ""

    @property
    def args(self) -> Any:
        """``arguments`` parsed."""
        return json.loads(self.arguments)

    def message(self) -> dict[str, Any]:
        """The OpenAI-style ``tool_calls`` entry for the assistant message."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolCallFormat:
    """How a template writes one tool call: ``start`` + a JSON object with the name under
    ``name_key`` and the arguments under ``args_key`` + ``end``. ``in_list``: the objects
    sit in a JSON list (``[TOOL_CALLS][{...}, {...}]``)."""

    start: str
    end: str
    name_key: str
    args_key: str
    in_list: bool = False
    #: arguments written as JSON text inside the JSON (a string) rather than an object
    args_as_text: bool = False


def _find_call(text: str) -> tuple[int, int, Any] | None:
    """The first (so outermost) JSON value in ``text`` that contains the probe call:
    (start, end, value)."""
    decoder = json.JSONDecoder()
    for m in re.finditer(r"[\[{]", text):
        try:
            value, end = decoder.raw_decode(text, m.start())
        except ValueError:
            continue
        if _PROBE_NAME in json.dumps(value):
            return m.start(), end, value
    return None


def _keys(obj: Any) -> tuple[str, str, bool] | None:
    """(name key, arguments key, arguments as text) of a call object, searched one level
    down too (``{"function": {...}}``)."""
    if not isinstance(obj, dict):
        return None
    name = next((k for k, v in obj.items() if v == _PROBE_NAME), None)
    if name is not None:
        for k, v in obj.items():
            if isinstance(v, dict) and v.get("arg") == _PROBE_ARG:
                return name, k, False
            if isinstance(v, str) and _PROBE_ARG in v:
                return name, k, True
    return None


@functools.lru_cache(maxsize=64)
def _format(template: str, engine: str) -> ToolCallFormat | None:
    tool = {
        "type": "function",
        "function": {
            "name": _PROBE_NAME,
            "description": "probe",
            "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}, "required": ["arg"]},
        },
    }
    call = {"id": "call0", "type": "function", "function": {"name": _PROBE_NAME, "arguments": {"arg": _PROBE_ARG}}}
    user = {"role": "user", "content": "llama_cffi probe"}
    ctx: dict[str, Any] = {"tools": [tool], "bos_token": "", "eos_token": ""}
    try:
        asked = apply_template(template, [user], True, engine, **ctx)
        answered = apply_template(
            template, [user, {"role": "assistant", "content": "", "tool_calls": [call]}], False, engine, **ctx
        )
    except Exception:  # a template that cannot render the probe has no usable format
        return None
    at = answered.find(_PROBE_NAME, len(asked) - 1 if answered.startswith(asked) else 0)
    body = answered[len(asked) :] if answered.startswith(asked) else answered[answered.rfind("\n", 0, at) + 1 :]
    found = _find_call(body)
    if found is None:
        return None
    start, end, value = found
    in_list = isinstance(value, list)
    obj = value[0] if in_list and value else value
    keys = _keys(obj)
    if keys is None:
        return None
    end_text = body[end:]
    try:
        stop = turn_end(template, engine, **ctx)
    except Exception:
        stop = ""
    if stop and stop in end_text:
        end_text = end_text[: end_text.find(stop)]
    return ToolCallFormat(body[:start], end_text.rstrip(), keys[0], keys[1], in_list, keys[2])


def tool_call_format(template: str, engine: str = "jinja") -> ToolCallFormat | None:
    """How ``template`` writes a tool call (found once per template and cached), or None
    when it declares no tools or writes calls in a form this module does not parse."""
    expect_str("template", template, "a str (chat template text)")
    expect_str("engine", engine, "'jinja', 'native' or 'auto'")
    if not re.search(r"\btools\b", template):
        return None
    return _format(template, engine)


def parse_tool_calls(text: str, fmt: ToolCallFormat | None) -> tuple[str, list[ToolCall]]:
    """``(content, calls)`` of a reply: the text before the first call, and each call
    written in ``fmt`` (with nothing but whitespace between calls). A call that does not
    parse ends the calls; the rest stays content."""
    expect_str("text", text)
    if fmt is not None:
        expect("fmt", fmt, ToolCallFormat, "a ToolCallFormat (from tool_call_format) or None")
    if fmt is None:
        return text, []
    marker = fmt.start  # as the template writes it, whitespace included (as llama.cpp matches it)
    at = text.find(marker) if marker.strip() else -1
    if at < 0:
        return text, []
    content, rest = text[:at], text[at:]
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    pos = 0
    while True:
        if not rest.startswith(marker, pos):
            break
        i = pos + len(marker)
        while i < len(rest) and rest[i].isspace():
            i += 1
        try:
            value, j = decoder.raw_decode(rest, i)
        except ValueError:
            break
        objs = value if fmt.in_list and isinstance(value, list) else [value]
        parsed = [_call(o, fmt) for o in objs]
        if any(p is None for p in parsed):
            break
        calls += [p for p in parsed if p is not None]
        end = fmt.end.strip()
        k = j
        while k < len(rest) and rest[k].isspace():
            k += 1
        if end:
            if fmt.in_list and end.startswith("]"):
                end = end[1:].strip()
            if end and rest.startswith(end, k):
                k += len(end)
        while k < len(rest) and rest[k].isspace():
            k += 1
        pos = k
    if not calls:
        return text, []
    return content + rest[pos:], calls


def _call(obj: Any, fmt: ToolCallFormat) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get(fmt.name_key), str):
        return None
    args = obj.get(fmt.args_key, {})
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ToolCall(obj[fmt.name_key], text, str(obj.get("id", "")))


def _gbnf_literal(s: str) -> str:
    return json.dumps(s, ensure_ascii=False).replace("\\u00", "\\x")


def tool_call_grammar(
    fmt: ToolCallFormat, tools: Sequence[Mapping[str, Any]], parallel: bool = False
) -> tuple[str, list[str]]:
    """``(gbnf, trigger_words)``: a grammar for one call (or several with ``parallel``) in
    ``fmt`` to one of ``tools`` with arguments that satisfy its JSON schema, to be applied
    lazily from the first trigger (the start marker), as llama.cpp applies its tool-call
    grammars. Use it as ``GrammarSampler(Grammar.from_gbnf(gbnf), model, lazy=True,
    trigger_words=trigger_words)``."""
    expect("fmt", fmt, ToolCallFormat, "a ToolCallFormat (from tool_call_format)")
    expect_iterable("tools", tools, "a sequence of tool specs (dicts)")
    parallel = expect_bool("parallel", parallel)
    from .grammar.json_schema import llama_cpp_json_schema_to_gbnf

    variants = []
    for t in tools:
        fn = t.get("function", t)
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise ParamError(f"a tool must be {{'type': 'function', 'function': {{'name': ...}}}}, not {t!r}")
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        args = {"type": "string"} if fmt.args_as_text else params
        variants.append(
            {
                "type": "object",
                "properties": {fmt.name_key: {"const": fn["name"]}, fmt.args_key: args},
                "required": [fmt.name_key, fmt.args_key],
                "additionalProperties": False,
            }
        )
    if not variants:
        raise ParamError("no tools to call")
    schema: dict[str, Any] = variants[0] if len(variants) == 1 else {"anyOf": variants}
    if fmt.in_list:
        schema = {"type": "array", "items": schema, "minItems": 1, **({} if parallel else {"maxItems": 1})}
    body = llama_cpp_json_schema_to_gbnf(schema)
    body = re.sub(r"^root ::=", "tool-call-json ::=", body, flags=re.M)
    start, end = _gbnf_literal(fmt.start), _gbnf_literal(fmt.end.strip())
    call = f"tool-call ::= {start} tool-call-ws tool-call-json tool-call-ws" + (f" {end}" if fmt.end.strip() else "")
    root = "root ::= tool-call" + (" (tool-call-ws tool-call)*" if parallel and not fmt.in_list else "")
    ws = 'tool-call-ws ::= | " " | "\\n"{1,2} [ \\t]{0,20}'  # bounded, as llama.cpp's space rule
    gbnf = "\n".join([root, call, ws, body])
    return gbnf, [fmt.start]
