"""Tool calls: how a chat template writes them, parsing them out of a reply, and a lazy
grammar that keeps a call well-formed once the model starts one.

:func:`tool_call_format` finds a template's format the way llama.cpp's differential
analysis does (``common/chat-diff-analyzer.cpp``), by rendering a probe conversation with
one tool call (and one with a call without arguments) and reading the markers around the
probe's name, argument name and value. Four styles (:attr:`ToolCallFormat.style`):

- ``"json"``: the call is a JSON object (or a JSON list of them) between markers: Hermes
  and Qwen 2.5 (``<tool_call>\\n{...}\\n</tool_call>``), Llama 3.3 Nemotron
  (``<TOOLCALL>[...]</TOOLCALL>``), Mistral Nemo (``[TOOL_CALLS][{..., "id": ...}]``) and
  Llama 3.1/3.2/3.3, which write ``{"name": ..., "parameters": {...}}`` with no marker at
  all (llama.cpp then reads a call from the first ``{`` on, ``<|python_tag|>`` included in
  the content before it, and applies no lazy grammar: there is no trigger);
- ``"xml"``: Qwen3-Coder's XML arguments (also Qwen 3.5's and Nemotron Nano 3's):
  ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``,
  string parameters written raw, others as JSON (llama.cpp's ``parsers/qwen3-coder.cpp``:
  Qwen3-Coder itself may omit the first ``<tool_call>``);
- ``"tagged"``: llama.cpp's autoparser ``TAG_WITH_TAGGED``, tagged argument names and
  values: GLM 4.5/4.6 (``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n</tool_call>``);
- ``"tag_json"``: the autoparser's ``TAG_WITH_JSON``, the name in markers and JSON
  arguments: Functionary 3.1 (``<function=NAME>{...}</function>``), Devstral and Ministral 3
  (``[TOOL_CALLS]NAME[ARGS]{...}``). A partial JSON object there (a reply cut short) is no
  call here; llama.cpp gives a call with the partial arguments text.

All of them are checked against llama.cpp at the pinned commit in ``tests/test_tools.py``
(the prompt with tools, the parsed calls of several replies, the lazy grammar's trigger),
each on a real template from ``tests/data``: Qwen 2.5, Llama 3.3 Nemotron, Llama 3.1 and
3.2, Mistral Nemo, Qwen3-Coder, Qwen 3.5, Nemotron Nano 3, GLM 4.6, Functionary 3.1,
Devstral Small (Functionary's prompt excepted: this package's Jinja engine HTML-escapes its
``|safe`` + ``tojson`` tool list, llama.cpp's does not; Llama 3.1's date line, which
llama.cpp fills with today's date). Templates llama.cpp cannot read at the pinned commit
are not checked (Mistral Small 3.1's lexer failure; Mistral Small 3.2's ``[CALL_ID]``
calls, which its parser refuses: ``None`` for that template). Ministral 3 writes Devstral's
``[TOOL_CALLS]NAME[ARGS]{...}`` (checked by hand against llama.cpp, not in the tests).
Templates that write calls another way (Python syntax, channels) get ``None``: no tool
calls are parsed, the reply is content. Templates that do not declare tools (the tiny
model's ChatML, Gemma 3's) render no tools and parse none, as in llama.cpp.

:func:`parse_tool_calls` splits a reply into its content and :class:`ToolCall` objects;
given the ``tools`` it reads, as llama.cpp does, XML argument values by their schema's
type (a string parameter's ``42`` stays the string ``"42"``) and refuses calls to
undeclared tools or with undeclared or missing arguments; without them a value that reads
as JSON (a number, an object) is that value. Differences from llama.cpp's
``common_chat_parse``: with parallel calls off, llama.cpp keeps only the first of several
calls (or, for Nemotron's list, refuses the reply), where this returns them all; a call
that does not parse ends the calls and stays content, with any text after the calls, where
llama.cpp's lenient parse drops it; whitespace between calls and arguments is read
leniently.

:func:`tool_call_grammar` gives llama.cpp's kind of grammar for a call: one of the tools,
with its parameters (XML and tagged: the required ones in any order, then any optional
ones; a string value is raw text up to the value's closing marker, bounded by
``maxLength`` or one of an ``enum`` where the schema says so; other values JSON that their
schema accepts), and the words that trigger it lazily.
"""

from __future__ import annotations

import functools
import itertools
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
_PROBE_KEY = "llama_cffi_probe_key"
_PROBE_ARG = "llama_cffi_probe_value"
_PROBE_ID = "probe0001"  # nine alphanumerics: Mistral's templates refuse other ids
_STYLES = ("json", "xml", "tagged", "tag_json")


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
    """How a template writes one tool call.

    ``style="json"``: ``start`` + a JSON object with the name under ``name_key`` and the
    arguments under ``args_key`` + ``end``; ``in_list``: the objects sit in a JSON list
    (``[TOOL_CALLS][{...}, {...}]``). An empty ``start``: the call is the JSON object
    itself (Llama 3.x).

    The other styles write ``start`` + ``name_prefix`` + NAME + ``name_suffix`` + the
    arguments + ``end``: ``"tag_json"`` a JSON object; ``"xml"`` and ``"tagged"`` each
    argument as ``arg_prefix`` + KEY + ``arg_infix`` + VALUE + ``arg_suffix`` (a string
    raw, other values JSON). ``start_optional``: the first call may leave ``start`` out
    (Qwen3-Coder). ``name_key`` and ``args_key`` are empty for them."""

    start: str
    end: str
    name_key: str
    args_key: str
    in_list: bool = False
    #: arguments written as JSON text inside the JSON (a string) rather than an object
    args_as_text: bool = False
    #: "json", "xml", "tagged" or "tag_json" (see the class docstring)
    style: str = "json"
    name_prefix: str = ""
    name_suffix: str = ""
    arg_prefix: str = ""
    arg_infix: str = ""
    arg_suffix: str = ""
    start_optional: bool = False
    #: the key of a call's id in a JSON call object ("id" for Mistral Nemo), or empty
    id_key: str = ""

    @property
    def triggers(self) -> list[str]:
        """The words that start a call (what a lazy grammar waits for); none when calls
        have no marker (Llama 3.x's bare JSON)."""
        first = self.start if self.start.strip() else self.name_prefix
        return [first] if first.strip() else []


# --- finding the format ---------------------------------------------------------------


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
            if isinstance(v, dict) and v.get(_PROBE_KEY) == _PROBE_ARG:
                return name, k, False
            if isinstance(v, str) and _PROBE_ARG in v:
                return name, k, True
    return None


_SPECIAL_TAIL = re.compile(r"(?:<\|[^|<>\s]*\|>|</s>|<eos>)\s*$")
_REASONING_HEAD = re.compile(r"\s*(?:<think>)?.*?</think>\s*", re.S)


def _tail(text: str, stop: str) -> str:
    """``text`` up to the end of the turn: cut at ``stop``, special tokens and whitespace
    at its end removed."""
    if stop and stop in text:
        text = text[: text.find(stop)]
    text = text.rstrip()
    while m := _SPECIAL_TAIL.search(text):
        text = text[: m.start()].rstrip()
    return text


def _body(asked: str, answered: str) -> str:
    """The assistant's part of ``answered`` (its generation prompt and any reasoning
    block before the call left out)."""
    if answered.startswith(asked):
        body = answered[len(asked) :]
    else:
        body = answered[len(_tag_prefix(asked, answered)) :]
    at = body.find(_PROBE_NAME)
    m = _REASONING_HEAD.match(body)
    if m and 0 <= m.end() <= at:
        body = body[m.end() :]
    return body


def _tag_prefix(a: str, b: str) -> str:
    """The common prefix of ``a`` and ``b``, cut back before a tag it ends inside."""
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    p = a[:k]
    lt = max(p.rfind("<"), p.rfind("["))
    if lt > max(p.rfind(">"), p.rfind("]")):
        p = p[:lt]
    return p


def _qwen3_coder(template: str) -> bool:
    """llama.cpp's test for its Qwen3-Coder parser (``common_chat_try_specialized_template``)."""
    return (
        "<tool_call>" in template
        and "<function=" in template
        and "<parameter=" in template
        and "'<tool_call><function=' ~ tool_call.name ~ '>'" not in template
    )


@functools.lru_cache(maxsize=64)
def _format(template: str, engine: str) -> ToolCallFormat | None:
    tool = {
        "type": "function",
        "function": {
            "name": _PROBE_NAME,
            "description": "probe",
            "parameters": {"type": "object", "properties": {_PROBE_KEY: {"type": "string"}}, "required": [_PROBE_KEY]},
        },
    }

    def call(args: dict[str, Any]) -> dict[str, Any]:
        return {"id": _PROBE_ID, "type": "function", "function": {"name": _PROBE_NAME, "arguments": args}}

    user = {"role": "user", "content": "llama_cffi probe"}
    ctx: dict[str, Any] = {"tools": [tool], "bos_token": "", "eos_token": ""}

    def render(args: dict[str, Any]) -> str:
        msgs: list[dict[str, Any]] = [user, {"role": "assistant", "content": "", "tool_calls": [call(args)]}]
        return apply_template(template, msgs, False, engine, **ctx)

    try:
        asked = apply_template(template, [user], True, engine, **ctx)
        answered = render({_PROBE_KEY: _PROBE_ARG})
    except Exception:  # a template that cannot render the probe has no usable format
        return None
    try:
        stop = turn_end(template, engine, **ctx)
    except Exception:
        stop = ""
    body = _body(asked, answered)
    found = _find_call(body)
    if found is not None:
        start, end, value = found
        in_list = isinstance(value, list)
        obj = value[0] if in_list and value else value
        keys = _keys(obj)
        if keys is None:
            return None
        end_text = body[end:]
        if stop and stop in end_text:
            end_text = end_text[: end_text.find(stop)]
        id_key = next((k for k, v in obj.items() if v == _PROBE_ID), "")
        return ToolCallFormat(body[:start], end_text.rstrip(), keys[0], keys[1], in_list, keys[2], id_key=id_key)
    return _tag_format(template, engine, body, asked, stop, render)


def _tag_format(template: str, engine: str, body: str, asked: str, stop: str, render: Any) -> ToolCallFormat | None:
    """The format of a template that writes the name in markers (see ToolCallFormat)."""
    n = body.find(_PROBE_NAME)
    prefix = body[:n].lstrip() if n >= 0 else ""
    if not prefix.strip():
        return None
    nl = prefix.find("\n")
    start, name_prefix = (prefix[: nl + 1], prefix[nl + 1 :]) if 0 < nl < len(prefix) - 1 else (prefix, "")
    after = body[n + len(_PROBE_NAME) :]
    brace = after.find("{")
    if brace >= 0:
        try:
            value, j = json.JSONDecoder().raw_decode(after, brace)
        except ValueError:
            value = None
        if value == {_PROBE_KEY: _PROBE_ARG} and _PROBE_ID not in after[:brace]:
            end = _tail(after[j:], stop)
            return ToolCallFormat(
                start, end, "", "", style="tag_json", name_prefix=name_prefix, name_suffix=after[:brace]
            )
    k = after.find(_PROBE_KEY)
    v = after.find(_PROBE_ARG, k + 1)
    if k < 0 or v < 0:
        return None
    try:
        bare = _body(asked, render({}))
    except Exception:
        return None
    at = bare.find(_PROBE_NAME)
    if at < 0:
        return None
    after0 = _tail(bare[at + len(_PROBE_NAME) :], stop)
    name_suffix = _tag_prefix(after0, after[:k])
    end = after0[len(name_suffix) :].strip(" \n") if after0.startswith(name_suffix) else ""
    rest = _tail(after[v + len(_PROBE_ARG) :], stop)
    if not end or not rest.endswith(end):
        return None
    arg_suffix = rest[: len(rest) - len(end)]
    arg_prefix, arg_infix = after[len(name_suffix) : k], after[k + len(_PROBE_KEY) : v]
    if _PROBE_ID in name_suffix + arg_prefix:  # a call id written between name and arguments
        return None
    if not arg_prefix.strip() or not arg_infix.strip() or not arg_suffix.strip():
        return None
    xml = _qwen3_coder(template)
    return ToolCallFormat(
        start,
        end,
        "",
        "",
        style="xml" if xml else "tagged",
        name_prefix=name_prefix,
        name_suffix=name_suffix,
        arg_prefix=arg_prefix,
        arg_infix=arg_infix,
        arg_suffix=arg_suffix,
        start_optional=xml and "<think>" not in template,
    )


def tool_call_format(template: str, engine: str = "jinja") -> ToolCallFormat | None:
    """How ``template`` writes a tool call (found once per template and cached), or None
    when it declares no tools or writes calls in a form this module does not parse."""
    expect_str("template", template, "a str (chat template text)")
    expect_str("engine", engine, "'jinja', 'native' or 'auto'")
    if not re.search(r"\btools\b", template):
        return None
    return _format(template, engine)


# --- parsing ----------------------------------------------------------------------------


def _check_format(fmt: ToolCallFormat) -> None:
    if fmt.style not in _STYLES:
        raise ParamError(f"fmt.style must be one of {', '.join(map(repr, _STYLES))}, not {fmt.style!r}")
    if fmt.style in ("xml", "tagged") and not (fmt.arg_prefix and fmt.arg_infix and fmt.arg_suffix.strip()):
        raise ParamError(f"a {fmt.style!r} format needs arg_prefix, arg_infix and arg_suffix")
    if fmt.style != "json" and not (fmt.start.strip() or fmt.name_prefix.strip()):
        raise ParamError(f"a {fmt.style!r} format needs a start marker")


def _tool_specs(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, dict[str, Any]] | None:
    """name -> parameters schema of each tool (None without tools)."""
    if tools is None:
        return None
    if isinstance(tools, (str, bytes, Mapping)):
        raise TypeError(f"tools must be a sequence of tool specs (dicts) or None, not {type(tools).__name__}")
    expect_iterable("tools", tools, "a sequence of tool specs (dicts) or None")
    specs: dict[str, dict[str, Any]] = {}
    for t in tools:
        fn = t.get("function", t) if isinstance(t, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise ParamError(f"a tool must be {{'type': 'function', 'function': {{'name': ...}}}}, not {t!r}")
        params = fn.get("parameters")
        specs[fn["name"]] = dict(params) if isinstance(params, Mapping) else {"type": "object", "properties": {}}
    return specs


def parse_tool_calls(
    text: str, fmt: ToolCallFormat | None, tools: Sequence[Mapping[str, Any]] | None = None
) -> tuple[str, list[ToolCall]]:
    """``(content, calls)`` of a reply: the text before the first call, and each call
    written in ``fmt`` (with nothing but whitespace between calls). A call that does not
    parse ends the calls; the rest stays content. ``tools`` (the specs the reply was
    asked with): calls must name one of them, and XML or tagged argument values are read
    by their parameter's schema type, as llama.cpp reads them."""
    expect_str("text", text)
    if fmt is not None:
        expect("fmt", fmt, ToolCallFormat, "a ToolCallFormat (from tool_call_format) or None")
        _check_format(fmt)
    specs = _tool_specs(tools)
    if fmt is None:
        return text, []
    if fmt.style != "json":
        return _parse_tagged(text, fmt, specs)
    marker = fmt.start  # as the template writes it, whitespace included (as llama.cpp matches it)
    if marker.strip():
        at = text.find(marker)
    else:  # no marker (Llama 3.x): a call is a JSON object from the first brace on
        at = text.find("[" if fmt.in_list else "{")
        marker = ""
    if at < 0:
        return text, []
    content, rest = text[:at], text[at:]
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    pos = 0
    while True:
        if not rest.startswith(marker, pos) or (not marker and pos >= len(rest)):
            break
        i = pos + len(marker)
        while i < len(rest) and rest[i].isspace():
            i += 1
        try:
            value, j = decoder.raw_decode(rest, i)
        except ValueError:
            break
        objs = value if fmt.in_list and isinstance(value, list) else [value]
        parsed = [_call(o, fmt, specs) for o in objs]
        if not objs or any(p is None for p in parsed):
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


def _call(obj: Any, fmt: ToolCallFormat, specs: dict[str, dict[str, Any]] | None) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get(fmt.name_key), str):
        return None
    if specs is not None and obj[fmt.name_key] not in specs:
        return None
    args = obj.get(fmt.args_key, {})
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ToolCall(obj[fmt.name_key], text, str(obj.get(fmt.id_key or "id", "")))


_NAME = re.compile(r"[^\s<>\[\]{}()\"'=,;]+")


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _parse_tagged(
    text: str, fmt: ToolCallFormat, specs: dict[str, dict[str, Any]] | None
) -> tuple[str, list[ToolCall]]:
    starts = [text.find(fmt.start)] if fmt.start.strip() else []
    if fmt.start_optional and specs:  # Qwen3-Coder may leave out the first <tool_call>
        starts += [text.find(fmt.name_prefix + name + fmt.name_suffix.rstrip()) for name in specs]
    found = [s for s in starts if s >= 0]
    if not fmt.start.strip():
        found = [s for s in [text.find(fmt.name_prefix)] if s >= 0]
    if not found:
        return text, []
    at = min(found)
    calls: list[ToolCall] = []
    pos = at
    while True:
        one = _tagged_call(text, pos, fmt, specs, bare=fmt.start_optional and not calls)
        if one is None:
            break
        calls.append(one[0])
        pos = _skip_ws(text, one[1])
    if not calls:
        return text, []
    return text[:at] + text[pos:], calls


def _tagged_call(
    text: str, i: int, fmt: ToolCallFormat, specs: dict[str, dict[str, Any]] | None, bare: bool
) -> tuple[ToolCall, int] | None:
    if text.startswith(fmt.start, i):
        i += len(fmt.start)
    elif not bare:
        return None
    if not text.startswith(fmt.name_prefix, i):
        return None
    i += len(fmt.name_prefix)
    m = _NAME.match(text, i)
    if m is None or (specs is not None and m.group() not in specs):
        return None
    name, i = m.group(), m.end()
    if fmt.name_suffix.strip():
        if not text.startswith(fmt.name_suffix.strip(), i):
            return None
        i += len(fmt.name_suffix.strip())
    i = _skip_ws(text, i)
    schema = specs.get(name) if specs is not None else None
    if fmt.style == "tag_json":
        try:
            args, i = json.JSONDecoder().raw_decode(text, i)
        except ValueError:
            return None
        if not isinstance(args, dict):
            return None
        arguments = json.dumps(args, ensure_ascii=False)
    else:
        props = schema.get("properties", {}) if isinstance(schema, dict) else {}
        values: dict[str, Any] = {}
        close = fmt.arg_suffix.rstrip()
        while text.startswith(fmt.arg_prefix, i):
            j = i + len(fmt.arg_prefix)
            key_end = text.find(fmt.arg_infix, j)
            key = text[j:key_end] if key_end >= 0 else ""
            if not key or _NAME.fullmatch(key) is None:
                return None
            if schema is not None and key not in props:
                return None
            vstart = key_end + len(fmt.arg_infix)
            vend = text.find(close, vstart)
            if vend < 0:
                return None
            ok, value = _typed(text[vstart:vend], props.get(key) if schema is not None else None, fmt.style)
            if not ok:
                return None
            values[key] = value
            i = _skip_ws(text, vend + len(close))
        if schema is not None and any(r not in values for r in schema.get("required", [])):
            return None
        arguments = json.dumps(values, ensure_ascii=False)
    i = _skip_ws(text, i)
    end = fmt.end.strip()
    if end:
        if not text.startswith(end, i):
            return None
        i += len(end)
    return ToolCall(name, arguments), i


def _types(schema: Any) -> set[str] | None:
    """The JSON types a schema allows, None for any."""
    if not isinstance(schema, Mapping):
        return None
    t = schema.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list) and all(isinstance(x, str) for x in t):
        return set(t)
    for key in ("enum", "const"):
        if key in schema:
            vals = schema[key] if key == "enum" and isinstance(schema[key], list) else [schema[key]]
            return {_json_type(v) for v in vals}
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            subs = [_types(s) for s in schema[key]]
            if any(s is None for s in subs):
                return None
            return set().union(*[s for s in subs if s is not None])
    return None


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def _typed(raw: str, schema: Any, style: str) -> tuple[bool, Any]:
    """(parsed, value) of an XML or tagged argument's text, by its schema's type as
    llama.cpp reads it (``schema`` None: no tools given, a value that reads as JSON other
    than a string is that value)."""

    def as_json() -> tuple[bool, Any]:
        try:
            return True, json.loads(raw)
        except ValueError:
            return False, None

    if schema is None:
        ok, value = as_json()
        return (True, value) if ok and not isinstance(value, str) else (True, raw)
    types = _types(schema)
    if types is not None and "string" not in types:
        return as_json()
    if style == "tagged" or types == {"string"}:
        return True, raw
    ok, value = as_json()  # a string or something else: JSON first (Qwen3-Coder's parser)
    if ok and not isinstance(value, str):
        kind = _json_type(value)
        allowed = types is None or kind in types or (kind == "integer" and "number" in types)
        if allowed:
            return True, value
    return True, raw


# --- grammar ----------------------------------------------------------------------------


def _gbnf_literal(s: str) -> str:
    return json.dumps(s, ensure_ascii=False).replace("\\u00", "\\x")


_GBNF_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|[A-Za-z0-9-]+|\s+|.', re.S)


def _rename(gbnf: str, prefix: str) -> tuple[str, str]:
    """``gbnf`` with every rule name prefixed (so that several converted schemas share a
    grammar), and the name its ``root`` rule got."""
    names = set(re.findall(r"^([A-Za-z0-9-]+) ::=", gbnf, re.M))
    out = [prefix + t if t in names else t for t in (m.group() for m in _GBNF_TOKEN.finditer(gbnf))]
    return "".join(out).strip(), prefix + "root"


def _json_rule(schema: Mapping[str, Any], prefix: str) -> tuple[str, str]:
    from .grammar.json_schema import llama_cpp_json_schema_to_gbnf

    return _rename(llama_cpp_json_schema_to_gbnf(dict(schema)), prefix)


def _class_char(c: str) -> str:
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\", "]": "\\]", "^": "\\^", "-": "\\-"}.get(c, c)


def _until(name: str, stop: str) -> list[str]:
    """Rules ``name`` for any text that, followed by ``stop``, holds ``stop`` only there
    (llama.cpp's ``until``), by the states of a string-matching automaton."""
    n = len(stop)
    fail = [0] * (n + 1)
    for q in range(1, n):
        k = fail[q]
        while k and stop[k] != stop[q]:
            k = fail[k]
        fail[q + 1] = k + 1 if stop[k] == stop[q] and q > 0 else 0

    def step(k: int, c: str) -> int:
        while k and stop[k] != c:
            k = fail[k]
        return k + 1 if stop[k] == c else 0

    def can_end(k: int) -> bool:
        m = k
        while m > 0:
            if stop[m:] == stop[: n - m]:
                return False
            m = fail[m]
        return True

    alphabet = sorted(set(stop))
    rules = [f"{name} ::= {name}-0"]
    for k in range(n):
        alts = [""] if can_end(k) else []
        alts.append(f"[^{''.join(_class_char(c) for c in alphabet)}] {name}-0")
        for c in alphabet:
            t = step(k, c)
            if t < n:
                alts.append(f"{_gbnf_literal(c)} {name}-{t}")
        rules.append(f"{name}-{k} ::= " + " | ".join(alts))
    return rules


def _string_value(schema: Any, stop: str, name: str, rules: list[str], until: str) -> str:
    """A raw string value up to ``stop``: one of an ``enum``, at most ``maxLength``
    characters (none of them the first of ``stop``), or anything (the ``until`` rule)."""
    s = schema if isinstance(schema, Mapping) else {}
    values = s.get("enum") if isinstance(s.get("enum"), list) else ([s["const"]] if "const" in s else None)
    if values is not None:
        strs = [v for v in values if isinstance(v, str) and stop not in v + stop[:-1]]
        if strs:
            return "(" + " | ".join(_gbnf_literal(v) for v in strs) + ")"
    hi = s.get("maxLength")
    if isinstance(hi, int) and not isinstance(hi, bool) and hi >= 0:
        lo = s.get("minLength", 0)
        lo = lo if isinstance(lo, int) and not isinstance(lo, bool) and 0 <= lo <= hi else 0
        first = stop.strip()[:1] or stop[:1]
        rules.append(f"{name} ::= [^{_class_char(first)}]{{{lo},{hi}}}")
        return name
    return until


def tool_call_grammar(
    fmt: ToolCallFormat, tools: Sequence[Mapping[str, Any]], parallel: bool = False
) -> tuple[str, list[str]]:
    """``(gbnf, trigger_words)``: a grammar for one call (or several with ``parallel``) in
    ``fmt`` to one of ``tools`` with arguments that satisfy its JSON schema, to be applied
    lazily from the first trigger (the start marker), as llama.cpp applies its tool-call
    grammars. Use it as ``GrammarSampler(Grammar.from_gbnf(gbnf), model, lazy=True,
    trigger_words=trigger_words)``. No trigger words (Llama 3.x's calls have no marker):
    llama.cpp applies no lazy grammar then, only a forced one (``tool_choice``)."""
    expect("fmt", fmt, ToolCallFormat, "a ToolCallFormat (from tool_call_format)")
    _check_format(fmt)
    expect_iterable("tools", tools, "a sequence of tool specs (dicts)")
    parallel = expect_bool("parallel", parallel)
    specs = _tool_specs(tools)
    assert specs is not None
    if not specs:
        raise ParamError("no tools to call")
    if fmt.style != "json":
        return _tagged_grammar(fmt, specs, parallel)
    from .grammar.json_schema import llama_cpp_json_schema_to_gbnf

    variants = []
    for name, params in specs.items():
        args = {"type": "string"} if fmt.args_as_text else params
        ids = {fmt.id_key: {"type": "string"}} if fmt.id_key else {}
        variants.append(
            {
                "type": "object",
                "properties": {fmt.name_key: {"const": name}, fmt.args_key: args, **ids},
                "required": [fmt.name_key, fmt.args_key],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = variants[0] if len(variants) == 1 else {"anyOf": variants}
    if fmt.in_list:
        schema = {"type": "array", "items": schema, "minItems": 1, **({} if parallel else {"maxItems": 1})}
    body = llama_cpp_json_schema_to_gbnf(schema)
    body = re.sub(r"^root ::=", "tool-call-json ::=", body, flags=re.M)
    start, end = _gbnf_literal(fmt.start), _gbnf_literal(fmt.end.strip())
    head = f"{start} tool-call-ws " if fmt.start else ""
    call = f"tool-call ::= {head}tool-call-json tool-call-ws" + (f" {end}" if fmt.end.strip() else "")
    root = "root ::= tool-call" + (" (tool-call-ws tool-call)*" if parallel and not fmt.in_list else "")
    gbnf = "\n".join([root, call, _WS, body])
    return gbnf, fmt.triggers


_WS = 'tool-call-ws ::= | " " | "\\n"{1,2} [ \\t]{0,20}'  # bounded, as llama.cpp's space rule


def _tagged_grammar(fmt: ToolCallFormat, specs: dict[str, dict[str, Any]], parallel: bool) -> tuple[str, list[str]]:
    rules: list[str] = []
    close = fmt.arg_suffix.rstrip()
    until = "tool-arg-text"
    used_until = False
    choices = []
    for t, (name, params) in enumerate(specs.items()):
        tool = f"tool-{t}"
        choices.append(tool)
        if fmt.style == "tag_json":
            rule_text, root = _json_rule(params, f"{tool}-")
            rules.append(rule_text)
            args = root
        else:
            props = params.get("properties") or {}
            required = [k for k in params.get("required", []) if k in props]
            arg_rules = {}
            for a, (key, schema) in enumerate(props.items()):
                rule = f"{tool}-arg-{a}"
                types = _types(schema)
                if types is None or "string" in types:
                    value = _string_value(schema, close, f"{rule}-text", rules, until)
                    used_until |= value == until
                else:
                    rule_text, value = _json_rule(schema, f"{rule}-")
                    rules.append(rule_text)
                opener = _gbnf_literal(fmt.arg_prefix + key + fmt.arg_infix)
                rules.append(f"{rule} ::= {opener} {value} {_gbnf_literal(fmt.arg_suffix)}")
                arg_rules[key] = rule
            if len(required) <= 4:  # any order, as llama.cpp's permute (Qwen does not keep to it)
                orders = [" ".join(arg_rules[k] for k in p) for p in itertools.permutations(required)]
            else:
                orders = [" ".join(arg_rules[k] for k in required)]
            seq = "(" + " | ".join(o or '""' for o in orders) + ")"
            optional = [arg_rules[k] for k in props if k not in required]
            if optional:
                seq += " (" + " | ".join(optional) + ")*"
            rules.append(f"{tool}-args ::= {seq}")
            args = f"{tool}-args"
        rules.append(f"{tool} ::= {_gbnf_literal(name + fmt.name_suffix)} {args}")
    if used_until:
        rules += _until(until, close)
    end = fmt.end.strip()
    ws = " tool-call-ws " if fmt.style == "tag_json" else " "
    body = f"{_gbnf_literal(fmt.name_prefix)} ({' | '.join(choices)}){ws}{_gbnf_literal(end)}"
    start = _gbnf_literal(fmt.start)
    opening = f"({start})?" if fmt.start_optional else start
    head = [
        "root ::= tool-call-first" + (" (tool-call-ws tool-call)*" if parallel else ""),
        f"tool-call-first ::= {opening} tool-call-body",
        f"tool-call ::= {start} tool-call-body",
        f"tool-call-body ::= {body}",
        _WS,
    ]
    triggers = fmt.triggers
    if fmt.start_optional:
        triggers += [fmt.name_prefix + name + fmt.name_suffix.rstrip() for name in specs]
    return "\n".join(head + rules), triggers
