"""Tool calls against llama.cpp's chat machinery (common_chat_templates_apply and
common_chat_parse through the C++ oracle): the prompt with tools, tool calls and tool
results; the parsed calls and content of replies; the call grammar; a tool-calling
conversation in a ChatSession."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import samplers as S
from llama_cffi import Model, ParamError
from samplers.branch import BranchStore
from samplers.chat import ChatSession
from samplers.grammar import Grammar
from samplers.search import complete
from samplers.tools import ToolCall, parse_tool_calls, tool_call_format, tool_call_grammar
from tests.conftest import chat_oracle

DATA = Path(__file__).parent / "data"
QWEN = (DATA / "qwen2_5_chat_template.jinja").read_text()
GEMMA3 = (DATA / "gemma3_chat_template.jinja").read_text()
NEMOTRON = (DATA / "llama3_3_nemotron_chat_template.jinja").read_text()  # Llama 3.3: <TOOLCALL>[...]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather <now> in a city & its 'region' (é)",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "The time", "parameters": {"type": "object", "properties": {}}},
    },
]

# for generating with the tiny random-weight model: short arguments, so a call ends
SHORT = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 6}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]

CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "Sunny, 21 C"},
    {"role": "assistant", "content": "It is sunny."},
    {"role": "user", "content": "And the time?"},
]

OUTPUTS = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "Hello there",
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
    '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
]

# Llama 3.3 Nemotron's replies: a JSON list of calls between markers
NEMOTRON_OUTPUTS = [
    '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</TOOLCALL>',
    "Hello",
    'Sure. <TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, '
    '{"name": "get_time", "arguments": {}}]</TOOLCALL>',
    '<TOOLCALL>[{"name": "get_time", "arguments": {}}]</TOOLCALL>',
]


@pytest.mark.parametrize("args", ["text", "object"])
@pytest.mark.parametrize("family", ["qwen", "nemotron"])
@pytest.mark.parametrize("upto", [2, 4, 6])
def test_prompt_with_tools_equals_llama_cpp(
    tiny_model_path: Path, tiny_model: Model, upto: int, family: str, args: str
) -> None:
    """Tools, an assistant tool call and a tool result render as llama.cpp renders them
    (tojson without sorting or HTML escaping), for Qwen 2.5's template (one JSON object per
    call) and Llama 3.3 Nemotron's (a JSON list between markers). The call's arguments are
    JSON text (passed as an object, as llama.cpp passes them to a template that reads
    objects) or an object."""
    template = QWEN if family == "qwen" else NEMOTRON
    call = CALL if args == "text" else {**CALL, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    msgs = [dict(m, tool_calls=[call]) if m.get("tool_calls") else m for m in CONVERSATION[:upto]]
    ref = chat_oracle(tiny_model_path, {"template": template, "messages": msgs, "tools": TOOLS})
    ours = tiny_model.format_chat(msgs, template=template, tools=TOOLS)
    assert ours.tools_rendered and ref["caps"]["supports_tools"]
    assert ours.prompt == ref["prompt"]


def test_templates_without_tools(tiny_model: Model) -> None:
    """ChatML (the tiny model's) and Gemma 3 declare no tools: no format, nothing parsed
    (llama.cpp's caps say the same, test_chat_session checks its prompts)."""
    assert tool_call_format(tiny_model.chat_template() or "") is None
    assert tool_call_format(GEMMA3) is None
    assert parse_tool_calls(OUTPUTS[0], None) == (OUTPUTS[0], [])


# (template, the format the probe finds: start, end, calls in a JSON list, replies)
FAMILIES = {
    "qwen": (QWEN, ("<tool_call>\n", "\n</tool_call>", False), OUTPUTS),
    "nemotron": (NEMOTRON, ("<TOOLCALL>", "</TOOLCALL>", True), NEMOTRON_OUTPUTS),
}


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_parsed_calls_equal_llama_cpp(tiny_model_path: Path, family: str, parallel: bool) -> None:
    """The format the probe finds, and the content and calls parsed out of replies (one
    call or several, content before them, none), are llama.cpp's; so is the lazy
    grammar's trigger."""
    template, want_fmt, outputs = FAMILIES[family]
    request = {"template": template, "messages": CONVERSATION[:2], "tools": TOOLS, "parallel_tool_calls": parallel}
    if family == "nemotron" and not parallel:
        # llama.cpp's parser for this format refuses a list of two calls when parallel calls
        # are off; we return both calls (nothing is lost). Match the exception llama.cpp
        # throws, not its "unparsed ... output" warning: that goes through its asynchronous
        # logger, which may not flush before the oracle exits (it did not in CI)
        two = [o for o in outputs if o.count('"name"') == 2]
        with pytest.raises(AssertionError, match="does not match the expected peg-native format"):
            chat_oracle(tiny_model_path, {**request, "outputs": two})
        assert len(parse_tool_calls(two[0], tool_call_format(template))[1]) == 2
        outputs = [o for o in outputs if o not in two]
    fmt = tool_call_format(template)
    assert fmt is not None and (fmt.start, fmt.end, fmt.in_list, fmt.name_key, fmt.args_key) == (
        *want_fmt,
        "name",
        "arguments",
    )
    ref = chat_oracle(tiny_model_path, {**request, "outputs": outputs})
    assert ref["grammar_lazy"] and ref["grammar_triggers"][0]["value"].strip() == fmt.start.strip()
    for text, want in zip(outputs, ref["parsed"], strict=True):
        content, calls = parse_tool_calls(text, fmt)
        assert content == want["content"], text
        assert [(c.name, c.args) for c in calls] == [
            (w["name"], json.loads(w["arguments"])) for w in want["tool_calls"]
        ]
    assert max(len(p["tool_calls"]) for p in ref["parsed"]) == (1 if family == "nemotron" and not parallel else 2)


def test_call_grammar(tiny_model: Model) -> None:
    """The grammar accepts the calls llama.cpp parses and no call to an unknown tool or
    with arguments its schema refuses; generating with it gives a call that parses."""
    fmt = tool_call_format(QWEN)
    assert fmt is not None
    gbnf, triggers = tool_call_grammar(fmt, TOOLS)
    assert triggers == ["<tool_call>\n"]
    grammar = Grammar.from_gbnf(gbnf)
    ok = ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>']
    bad = [
        '<tool_call>\n{"name": "get_wether", "arguments": {"city": "Paris"}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"days": 2}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 0}}\n</tool_call>',
    ]
    for text in ok:
        assert grammar.accepts(text), text
    for text in bad:
        assert not grammar.accepts(text), text
    short, _ = tool_call_grammar(fmt, SHORT)
    with tiny_model.context(n_ctx=512) as ctx:
        r = complete(BranchStore(ctx), "Call a tool:", max_tokens=300, grammar=short)
    _, calls = parse_tool_calls(r.text, fmt)
    assert r.stop_reason == "grammar" and len(calls) == 1 and calls[0].name == "get_weather"
    assert isinstance(calls[0].args["city"], str) and len(calls[0].args["city"]) <= 6


def test_a_tool_calling_conversation(tiny_model_path: Path, tiny_model: Model) -> None:
    """A ChatSession with tools: a call (the turn's grammar makes the tiny model write one),
    its result, and the next turn, whose cache holds exactly llama.cpp's prompt for the
    conversation."""
    fmt = tool_call_format(QWEN)
    assert fmt is not None
    gbnf, _ = tool_call_grammar(fmt, SHORT)
    with tiny_model.context(n_ctx=2048, n_seq_max=2, kv_unified=True) as ctx:
        s = ChatSession(ctx, system="Use tools.", template=QWEN, max_tokens=300)
        r = s.send("Weather in Paris?", tools=TOOLS, grammar=gbnf)
        assert len(r.tool_calls) == 1 and isinstance(r.tool_calls[0], ToolCall)
        call = r.tool_calls[0]
        assert call.name == "get_weather" and call.id == "call_1_0"
        assert s.messages[-1]["tool_calls"] == [call.message()]
        s.add_tool_result(call, "Sunny, 21 C")
        s.send(None, tools=TOOLS, max_tokens=4)
        msgs = s.messages[:-1]
        ref = chat_oracle(tiny_model_path, {"template": QWEN, "messages": msgs, "tools": TOOLS})
        want = [int(t) for t in tiny_model.tokenize(ref["prompt"], parse_special=True)]
        assert s.tokens[: len(want)] == want


class _ForcePrefix(S.Sampler):
    """Biases the first ``len(tokens)`` steps towards ``tokens``, one each (a model that
    starts a call by itself; the tiny random model would not)."""

    def __init__(self, n_vocab: int, tokens: list[int]) -> None:
        self.n_vocab, self.tokens, self.i = n_vocab, tokens, 0

    def apply(self, cands: S.Candidates) -> None:
        if self.i < len(self.tokens):
            S.LogitBias(self.n_vocab, {self.tokens[self.i]: 1e4}).apply(cands)

    def accept(self, token: int) -> None:
        self.i += 1


@pytest.mark.parametrize("template", ["qwen", "nemotron"])
@pytest.mark.parametrize("constrain", [True, False])
def test_lazy_tool_grammar_in_a_session(tiny_model: Model, constrain: bool, template: str) -> None:
    """With tools and no grammar of its own, a turn samples freely until the reply writes
    the format's trigger; from there the lazy grammar keeps the call well-formed, so it
    parses into a call of a declared tool whose arguments its schema accepts. Without the
    grammar (``constrain_tools=False``) the same start goes on as random text: no call."""
    tpl = QWEN if template == "qwen" else NEMOTRON
    fmt = tool_call_format(tpl)
    assert fmt is not None
    trigger = [int(t) for t in tiny_model.tokenize(fmt.start, add_special=False)]
    n_vocab = tiny_model.n_vocab
    with tiny_model.context(n_ctx=2048, n_seq_max=2, kv_unified=True) as ctx:
        s = ChatSession(ctx, template=tpl, max_tokens=300)
        chain = S.SamplerChain([_ForcePrefix(n_vocab, trigger), S.TopK(40), S.Dist(7)])
        r = s.send("Weather in Paris?", tools=SHORT, sampler=chain, constrain_tools=constrain)
    assert r.text.startswith(fmt.start) or r.tool_calls, r.text
    if constrain:
        assert len(r.tool_calls) == 1, r.text
        call = r.tool_calls[0]
        assert call.name == "get_weather" and isinstance(call.args["city"], str) and len(call.args["city"]) <= 6
    else:
        assert not r.tool_calls, r.text


TWO = [
    *SHORT,
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The time in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 6}},
                "required": ["city"],
            },
        },
    },
]


@pytest.mark.parametrize("template", ["qwen", "nemotron"])
def test_tool_choice(tiny_model: Model, template: str) -> None:
    """tool_choice (OpenAI's): "required" makes the reply a call from its first token (the
    call grammar applied at once, no trigger needed), a named function makes it a call to
    that one, "none" parses none; wrong choices are refused before anything changes."""
    tpl = QWEN if template == "qwen" else NEMOTRON
    with tiny_model.context(n_ctx=2048, n_seq_max=2, kv_unified=True) as ctx:
        s = ChatSession(ctx, template=tpl, max_tokens=200)
        r = s.send(
            "Weather in Paris?", tools=TWO, tool_choice="required", sampler=S.SamplerChain([S.TopK(40), S.Dist(3)])
        )
        assert len(r.tool_calls) == 1 and r.tool_calls[0].name in ("get_weather", "get_time"), r.result.text
        assert isinstance(r.tool_calls[0].args["city"], str)
        s.reset()
        named = {"type": "function", "function": {"name": "get_time"}}
        r = s.send("Time in Oslo?", tools=TWO, tool_choice=named, sampler=S.SamplerChain([S.TopK(40), S.Dist(4)]))
        assert [c.name for c in r.tool_calls] == ["get_time"], r.result.text
        s.reset()
        trigger = [int(t) for t in tiny_model.tokenize(tool_call_format(tpl).start, add_special=False)]
        chain = S.SamplerChain([_ForcePrefix(tiny_model.n_vocab, trigger), S.TopK(40), S.Dist(7)])
        r = s.send("Weather?", tools=TWO, tool_choice="none", sampler=chain)
        assert not r.tool_calls and r.text  # written like a call's start, but content
        before = list(s.messages)
        for choice, error, message in [
            ("sometimes", ParamError, "tool_choice must be"),
            ({"type": "function", "function": {"name": "nope"}}, ParamError, "not among the tools"),
            ({"type": "function"}, TypeError, "tool_choice"),
        ]:
            with pytest.raises(error, match=message):
                s.send("x", tools=TWO, tool_choice=choice)
        with pytest.raises(ParamError, match="no grammar or json_schema"):
            s.send("x", tools=TWO, tool_choice="required", grammar='root ::= "a"')
        assert s.messages == before
    with tiny_model.context(n_ctx=512) as ctx:  # ChatML renders no tools: no call can be forced
        s = ChatSession(ctx, max_tokens=16)
        with pytest.raises(ParamError, match="renders no tools"):
            s.send("x", tools=TWO, tool_choice="required")
        assert s.messages == []
