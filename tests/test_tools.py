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


# --- other call formats: XML arguments, tagged arguments, a name in tags, bare JSON -------

#: real templates (tests/data/README.md): family -> file
TEMPLATES = {
    "qwen3_coder": "Qwen3-Coder.jinja",
    "qwen3_5": "Qwen3.5-4B.jinja",
    "nemotron_nano3": "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja",
    "glm4_6": "GLM-4.6.jinja",
    "functionary3_1": "meetkai-functionary-medium-v3.1.jinja",
    "devstral": "unsloth-mistral-Devstral-Small-2507.jinja",
    "llama3_1": "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "llama3_2": "meta-llama-Llama-3.2-3B-Instruct.jinja",
    "mistral_nemo": "mistralai-Mistral-Nemo-Instruct-2407.jinja",
}


def _template(family: str) -> str:
    return (DATA / TEMPLATES[family]).read_text()


def _xml(name: str, args: list[tuple[str, str]]) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args)
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def _glm(name: str, args: list[tuple[str, str]]) -> str:
    params = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in args)
    return f"<tool_call>{name}\n{params}</tool_call>"


def _functionary(name: str, args: dict[str, Any]) -> str:
    return f"<function={name}>{json.dumps(args)}</function>"


def _devstral(name: str, args: dict[str, Any]) -> str:
    return f"[TOOL_CALLS]{name}[ARGS]{json.dumps(args)}"


def _llama(name: str, args: dict[str, Any]) -> str:
    return json.dumps({"name": name, "parameters": args})


def _nemo(*calls: tuple[str, dict[str, Any], str]) -> str:
    return "[TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a, "id": i} for n, a, i in calls])


PARIS = [("city", "Paris")]
XML_REPLIES = [
    _xml("get_weather", PARIS),
    "Hello there",
    "Let me check.\n" + _xml("get_weather", [*PARIS, ("days", "2")]),
    _xml("get_weather", PARIS) + "\n" + _xml("get_time", []),
    # a string parameter stays a string ("42"), an object parameter is JSON
    _xml("get_weather", [("city", "42"), ("opts", '{"unit": "C", "n": [1, 2]}')]),
    _xml("get_weather", [("city", "New\nYork <b>")]),  # raw text, a line break and a tag in it
]
XML_MALFORMED = [
    _xml("get_weather", [*PARIS, ("days", "two")]),  # an integer that is no JSON
    _xml("get_weather", [("town", "Paris")]),  # an undeclared parameter (and city missing)
    _xml("get_wether", PARIS),  # an undeclared tool
    "<tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n</function>\n</tool_call>",
]
GLM_REPLIES = [
    _glm("get_weather", PARIS),
    "Hello there",
    "Let me check.\n" + _glm("get_weather", [*PARIS, ("days", "2")]),
    _glm("get_weather", PARIS) + "\n" + _glm("get_time", []),
    _glm("get_weather", [("city", "42"), ("opts", '{"unit": "C"}')]),
]
FUNCTIONARY_REPLIES = [
    _functionary("get_weather", {"city": "Paris"}),
    "Hello there",
    "Let me check. " + _functionary("get_weather", {"city": "Paris", "days": 2}),
    _functionary("get_weather", {"city": "Paris"}) + _functionary("get_time", {}),
]
DEVSTRAL_REPLIES = [
    _devstral("get_weather", {"city": "Paris"}),
    "Hello there",
    "Let me check. " + _devstral("get_weather", {"city": "Paris", "days": 2}),
    _devstral("get_weather", {"city": "Paris"}) + _devstral("get_time", {}),
]
LLAMA_REPLIES = [
    _llama("get_weather", {"city": "Paris"}),
    "Hello there",
    "Let me check. " + _llama("get_weather", {"city": "Paris", "days": 2}),
    "<|python_tag|>" + _llama("get_time", {}),  # llama.cpp keeps the tag as content
    '<|python_tag|>brave_search.call(query="x")',  # a builtin tool's Python call: content
]
NEMO_REPLIES = [
    _nemo(("get_weather", {"city": "Paris"}, "abc123def")),
    "Hello there",
    "Let me check. " + _nemo(("get_weather", {"city": "Paris", "days": 2}, "abc123def")),
    _nemo(("get_weather", {"city": "Paris"}, "abc123def"), ("get_time", {}, "xyz987uvw")),
]

# family -> (style, trigger words, replies llama.cpp parses, malformed replies it parses to no call)
NEW_FAMILIES: dict[str, tuple[str, list[str], list[str], list[str]]] = {
    "qwen3_coder": (
        "xml",
        ["<tool_call>\n", "<function=get_weather>", "<function=get_time>"],
        XML_REPLIES,
        XML_MALFORMED,
    ),
    "qwen3_5": ("xml", ["<tool_call>\n"], XML_REPLIES, XML_MALFORMED),
    "nemotron_nano3": ("xml", ["<tool_call>\n"], XML_REPLIES, XML_MALFORMED),
    "glm4_6": ("tagged", ["<tool_call>"], GLM_REPLIES, []),
    "functionary3_1": ("tag_json", ["<function="], FUNCTIONARY_REPLIES, []),
    "devstral": ("tag_json", ["[TOOL_CALLS]"], DEVSTRAL_REPLIES, []),
    "llama3_1": ("json", [], LLAMA_REPLIES, []),
    "llama3_2": ("json", [], LLAMA_REPLIES, []),
    "mistral_nemo": ("json", ["[TOOL_CALLS]"], NEMO_REPLIES, []),
}

# with an object parameter, for the XML and tagged replies above
TOOLS_OPTS = [
    {
        "type": "function",
        "function": {
            **TOOLS[0]["function"],
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer", "minimum": 1},
                    "opts": {"type": "object"},
                },
                "required": ["city"],
            },
        },
    },
    TOOLS[1],
]

#: templates whose generation prompt opens a reasoning block: llama.cpp parses the
#: generation prompt + the reply, and the oracle asks for no reasoning extraction, so its
#: content starts with that "<think>\n" (ChatSession splits reasoning off before parsing)
THINKING = {"qwen3_5", "nemotron_nano3"}


def _oracle_content(family: str, content: str) -> str:
    if family in THINKING:
        assert content.startswith("<think>\n"), content
        return content[len("<think>\n") :]
    return content


@pytest.mark.parametrize("upto", [2, 4, 6])
@pytest.mark.parametrize("family", sorted(TEMPLATES))
def test_more_prompts_with_tools_equal_llama_cpp(
    tiny_model_path: Path, tiny_model: Model, family: str, upto: int
) -> None:
    """The prompt with tools, a call (arguments as an object) and its result renders as
    llama.cpp renders it for each family's real template. Llama 3.1's dates differ (llama.cpp
    gives the template today's date through ``strftime_now``, ours renders the template's
    default): the line is compared without it. Mistral Nemo's template wants nine-character
    alphanumeric call ids."""
    import re

    template = _template(family)
    call = {"id": "abc123def", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    msgs = [dict(m, tool_calls=[call]) if m.get("tool_calls") else m for m in CONVERSATION[:upto]]
    msgs = [dict(m, tool_call_id="abc123def") if m.get("tool_call_id") else m for m in msgs]
    ref = chat_oracle(tiny_model_path, {"template": template, "messages": msgs, "tools": TOOLS})
    ours = tiny_model.format_chat(msgs, template=template, tools=TOOLS)
    assert ours.tools_rendered and ref["caps"]["supports_tools"]

    def undated(s: str) -> str:
        return re.sub(r"Today Date: \d\d \w\w\w \d{4}", "Today Date: D", s)

    assert undated(ours.prompt) == undated(ref["prompt"])
    assert "get_weather" in ours.prompt and (upto < 4 or "Sunny, 21 C" in ours.prompt)


@pytest.mark.parametrize("family", sorted(NEW_FAMILIES))
def test_more_formats_are_found(tiny_model_path: Path, family: str) -> None:
    """The probe finds each family's style and markers; the lazy grammar's trigger words
    are llama.cpp's (Qwen3-Coder's also the bare ``<function=NAME>`` openers, as the model
    may leave out its first ``<tool_call>``; none for Llama 3.x, whose calls have no marker:
    llama.cpp then applies no lazy grammar)."""
    template = _template(family)
    style, triggers, _, _ = NEW_FAMILIES[family]
    fmt = tool_call_format(template)
    assert fmt is not None and fmt.style == style
    _, ours = tool_call_grammar(fmt, TOOLS)
    assert ours == triggers
    ref = chat_oracle(tiny_model_path, {"template": template, "messages": CONVERSATION[:2], "tools": TOOLS})
    assert [t["value"].strip() for t in ref["grammar_triggers"]] == [t.strip() for t in triggers]
    assert ref["grammar_lazy"] == bool(triggers)
    if style == "xml":
        assert (fmt.start, fmt.name_prefix, fmt.name_suffix, fmt.end) == (
            "<tool_call>\n",
            "<function=",
            ">\n",
            "</function>\n</tool_call>",
        )
        assert (fmt.arg_prefix, fmt.arg_infix, fmt.arg_suffix) == ("<parameter=", ">\n", "\n</parameter>\n")
        assert fmt.start_optional == (family == "qwen3_coder")
    if family == "mistral_nemo":
        assert (fmt.start, fmt.in_list, fmt.id_key) == ("[TOOL_CALLS]", True, "id")


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("family", sorted(NEW_FAMILIES))
def test_more_parsed_calls_equal_llama_cpp(tiny_model_path: Path, family: str, parallel: bool) -> None:
    """Content and calls (names, arguments, ids) parsed out of each family's replies are
    llama.cpp's: one call, two, content before a call, none; for XML string, number and
    object arguments read by their schema type. Malformed calls (a non-JSON integer, an
    undeclared parameter or tool, a value without its line breaks) are no call in both;
    llama.cpp's lenient parse then drops the text from the call on, this keeps it as
    content. With parallel calls off llama.cpp keeps only the first of two calls; this
    returns both, so those replies are checked with parallel calls on only."""
    template = _template(family)
    _, _, replies, malformed = NEW_FAMILIES[family]
    fmt = tool_call_format(template)
    assert fmt is not None
    if not parallel:
        replies = [r for r in replies if len(parse_tool_calls(r, fmt, TOOLS_OPTS)[1]) < 2]
    request = {"template": template, "messages": CONVERSATION[:2], "tools": TOOLS_OPTS, "parallel_tool_calls": parallel}
    ref = chat_oracle(tiny_model_path, {**request, "outputs": replies + malformed})
    n_calls = []
    for text, want in zip(replies, ref["parsed"], strict=False):
        content, calls = parse_tool_calls(text, fmt, TOOLS_OPTS)
        assert content == _oracle_content(family, want["content"]), text
        assert [(c.name, c.args, c.id) for c in calls] == [
            (w["name"], json.loads(w["arguments"]), w["id"]) for w in want["tool_calls"]
        ], text
        n_calls.append(len(calls))
    assert max(n_calls) == (2 if parallel and not family.startswith("llama") else 1) and min(n_calls) == 0
    for text, want in zip(malformed, ref["parsed"][len(replies) :], strict=True):
        assert want["tool_calls"] == [] and parse_tool_calls(text, fmt, TOOLS_OPTS) == (text, [])
        assert text.startswith(_oracle_content(family, want["content"]))


@pytest.mark.parametrize("reply", ["Use {braces} here", LLAMA_REPLIES[0] + "\n" + _llama("get_time", {})])
def test_llama3_replies_llama_cpp_refuses(tiny_model_path: Path, reply: str) -> None:
    """Llama 3.x's calls have no marker: llama.cpp reads a call from the first ``{`` and
    refuses (throws for) a reply whose brace starts no call, or that writes two calls; this
    keeps the first as content and returns both calls of the second."""
    template = _template("llama3_2")
    request = {"template": template, "messages": CONVERSATION[:2], "tools": TOOLS, "parallel_tool_calls": True}
    with pytest.raises(AssertionError, match="does not match the expected peg-native format"):
        chat_oracle(tiny_model_path, {**request, "outputs": [reply]})
    fmt = tool_call_format(template)
    assert fmt is not None
    content, calls = parse_tool_calls(reply, fmt, TOOLS)
    assert (content, len(calls)) == ((reply, 0) if reply.startswith("Use") else ("", 2))


def test_xml_values_without_tools() -> None:
    """Without the tools, an XML value that reads as JSON other than a string is that
    value (with them, a string parameter's "42" stays a string); calls to any name parse."""
    fmt = tool_call_format(_template("qwen3_coder"))
    assert fmt is not None
    text = _xml("anything", [("city", "42"), ("opts", '{"a": 1}'), ("name", "Paris")])
    _, calls = parse_tool_calls(text, fmt)
    assert [(c.name, c.args) for c in calls] == [("anything", {"city": 42, "opts": {"a": 1}, "name": "Paris"})]
    _, calls = parse_tool_calls(text, fmt, TOOLS_OPTS)
    assert calls == []  # an undeclared tool
    # Qwen3-Coder may leave out the first <tool_call> (llama.cpp's parser allows it, for declared tools)
    bare = _xml("get_weather", PARIS).removeprefix("<tool_call>\n")
    assert [c.name for c in parse_tool_calls("Hi " + bare, fmt, TOOLS)[1]] == ["get_weather"]
    assert parse_tool_calls("Hi " + bare, fmt) == ("Hi " + bare, [])
    with pytest.raises(TypeError, match="tools"):
        parse_tool_calls(text, fmt, "get_weather")  # type: ignore[arg-type]


@pytest.mark.parametrize("family", sorted(NEW_FAMILIES))
def test_more_call_grammars(family: str) -> None:
    """Each family's call grammar accepts the (whole-reply) calls llama.cpp parses, and
    refuses a call to an unknown tool, one without a required argument and one whose
    argument its schema refuses."""
    fmt = tool_call_format(_template(family))
    assert fmt is not None
    gbnf, _ = tool_call_grammar(fmt, TOOLS_OPTS, parallel=True)
    grammar = Grammar.from_gbnf(gbnf)
    _, _, replies, malformed = NEW_FAMILIES[family]
    ok = [r for r in replies if parse_tool_calls(r, fmt, TOOLS_OPTS)[0] == "" and r.strip()]
    assert ok
    for text in ok:
        assert grammar.accepts(text), text
    for text in malformed:
        assert not grammar.accepts(text), text
    bad = {
        "xml": [
            _xml("get_wether", PARIS),
            _xml("get_weather", [("days", "2")]),
            _xml("get_weather", [*PARIS, ("days", "0")]),
        ],
        "tagged": [
            _glm("get_wether", PARIS),
            _glm("get_weather", [("days", "2")]),
            _glm("get_weather", [*PARIS, ("days", "0")]),
        ],
        "tag_json": [],
        "json": [],
    }[fmt.style]
    if family == "functionary3_1":
        bad = [_functionary("get_wether", {"city": "P"}), _functionary("get_weather", {"days": 2})]
        bad.append(_functionary("get_weather", {"city": "P", "days": 0}))
    elif family == "devstral":
        bad = [_devstral("get_wether", {"city": "P"}), _devstral("get_weather", {"days": 2})]
        bad.append(_devstral("get_weather", {"city": "P", "days": 0}))
    elif family.startswith("llama"):
        bad = [_llama("get_wether", {"city": "P"}), _llama("get_weather", {"days": 2})]
        bad.append(_llama("get_weather", {"city": "P", "days": 0}))
    elif family == "mistral_nemo":
        bad = [_nemo(("get_wether", {"city": "P"}, "abc123def")), _nemo(("get_weather", {"days": 2}, "abc123def"))]
        bad.append(_nemo(("get_weather", {"city": "P", "days": 0}, "abc123def")))
    assert len(bad) == 3
    for text in bad:
        assert not grammar.accepts(text), text
    one, _ = tool_call_grammar(fmt, TOOLS_OPTS)
    two = [r for r in ok if len(parse_tool_calls(r, fmt, TOOLS_OPTS)[1]) == 2]
    if family.startswith("llama"):  # llama.cpp parses no two Llama calls, its grammar allows them
        two = [LLAMA_REPLIES[0] + "\n" + _llama("get_time", {})]
    assert two and all(grammar.accepts(r) for r in two)
    assert not any(Grammar.from_gbnf(one).accepts(r) for r in two)  # parallel calls off


@pytest.mark.parametrize("family", ["qwen3_coder", "glm4_6", "devstral", "llama3_2"])
def test_tool_choice_in_more_formats(tiny_model: Model, family: str) -> None:
    """tool_choice="required" and a named function make the tiny model's reply a call
    (the call grammar applied from the first token) that parses into a call to a declared
    tool, for XML, tagged, name-in-tags and bare-JSON formats; "auto" with a reply forced
    to start a call (XML, tagged, name-in-tags) goes on under the lazy grammar."""
    tpl = _template(family)
    fmt = tool_call_format(tpl)
    assert fmt is not None
    with tiny_model.context(n_ctx=8192, n_seq_max=2, kv_unified=True) as ctx:  # Devstral's system prompt is long
        s = ChatSession(ctx, template=tpl, max_tokens=200)
        r = s.send(
            "Weather in Paris?", tools=TWO, tool_choice="required", sampler=S.SamplerChain([S.TopK(40), S.Dist(3)])
        )
        assert len(r.tool_calls) == 1 and r.tool_calls[0].name in ("get_weather", "get_time"), r.result.text
        assert isinstance(r.tool_calls[0].args["city"], str) and len(r.tool_calls[0].args["city"]) <= 6
        s.reset()
        named = {"type": "function", "function": {"name": "get_time"}}
        r = s.send("Time in Oslo?", tools=TWO, tool_choice=named, sampler=S.SamplerChain([S.TopK(40), S.Dist(4)]))
        assert [c.name for c in r.tool_calls] == ["get_time"], r.result.text
        s.reset()
        if fmt.triggers:
            trigger = [int(t) for t in tiny_model.tokenize(fmt.triggers[0], add_special=False)]
            chain = S.SamplerChain([_ForcePrefix(tiny_model.n_vocab, trigger), S.TopK(40), S.Dist(7)])
            r = s.send("Weather?", tools=SHORT, sampler=chain)
            assert [c.name for c in r.tool_calls] == ["get_weather"], r.result.text


def test_a_tiny_model_carrying_a_template_with_tools(tmp_path: Path) -> None:
    """A tiny model written with Qwen3-Coder's template in its GGUF: the model's own
    template is it, and a ChatSession with no template= finds its XML call format (a forced
    call parses into ChatReply.tool_calls)."""
    from llama_cffi.testing import write_tiny_model

    tpl = _template("qwen3_coder")
    path = write_tiny_model(tmp_path / "tiny-qwen3-coder.gguf", chat_template=tpl)
    model = Model.load(path)
    try:
        assert model.chat_template() == tpl
        with model.context(n_ctx=4096) as ctx:
            s = ChatSession(ctx, max_tokens=200)
            r = s.send("Weather?", tools=SHORT, tool_choice="required", sampler=S.SamplerChain([S.TopK(40), S.Dist(5)]))
            assert r.result.text.startswith("<tool_call>\n<function=get_weather>\n"), r.result.text
            assert [c.name for c in r.tool_calls] == ["get_weather"] and len(r.tool_calls[0].args["city"]) <= 6
    finally:
        model.close()


def test_a_format_of_an_unknown_style_is_refused() -> None:
    """A hand-made ToolCallFormat must name a known style with its markers."""
    from samplers.tools import ToolCallFormat

    for fmt, message in [
        (ToolCallFormat("<a>", "</a>", "", "", style="yaml"), "style must be one of"),
        (ToolCallFormat("<a>", "</a>", "", "", style="xml"), "needs arg_prefix"),
        (ToolCallFormat("", "", "", "", style="tag_json"), "needs a start marker"),
    ]:
        with pytest.raises(ParamError, match=message):
            parse_tool_calls("x", fmt)
        with pytest.raises(ParamError, match=message):
            tool_call_grammar(fmt, TOOLS)


# --- no HTML escaping; tool-call arguments as llama.cpp hands them to a template ----------


@pytest.mark.parametrize("upto", [2, 4])
def test_functionary_prompt_with_tools_equals_llama_cpp(tiny_model_path: Path, tiny_model: Model, upto: int) -> None:
    """Functionary 3.1 writes each tool as ``"..."|safe + description + ... + tool|tojson``:
    llama.cpp's engine has no Markup, so nothing added to ``safe`` text is HTML-escaped
    (Jinja2's Markup wrote the description's ``<&'`` and the JSON's quotes as entities)."""
    template = _template("functionary3_1")
    msgs = [dict(m, tool_calls=[CALL]) if m.get("tool_calls") else m for m in CONVERSATION[:upto]]
    ref = chat_oracle(tiny_model_path, {"template": template, "messages": msgs, "tools": TOOLS})
    ours = tiny_model.format_chat(msgs, template=template, tools=TOOLS)
    assert ours.prompt == ref["prompt"]
    assert "The weather <now> in a city & its 'region' (é)" in ours.prompt and "&#34;" not in ours.prompt
    assert json.dumps(TOOLS[0]["function"], ensure_ascii=False) in ours.prompt


@pytest.mark.parametrize("upto", [4, 6])
def test_nemo_arguments_as_json_text_equal_llama_cpp(tiny_model_path: Path, tiny_model: Model, upto: int) -> None:
    """Arguments given as JSON text (OpenAI's form) reach Mistral Nemo's template as an
    object, as llama.cpp passes them to a template that reads objects
    (``supports_object_arguments``, which its probe finds with nine-character call ids,
    the only ones this template accepts): ``"arguments": {...}`` in the prompt, not a
    JSON string."""
    template = _template("mistral_nemo")
    call = {
        "id": "abc123def",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    msgs = [dict(m, tool_calls=[call]) if m.get("tool_calls") else m for m in CONVERSATION[:upto]]
    msgs = [dict(m, tool_call_id="abc123def") if m.get("tool_call_id") else m for m in msgs]
    ref = chat_oracle(tiny_model_path, {"template": template, "messages": msgs, "tools": TOOLS})
    assert ref["caps"]["supports_object_arguments"]
    ours = tiny_model.format_chat(msgs, template=template, tools=TOOLS)
    assert ours.prompt == ref["prompt"]
    assert '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123def"}]' in ours.prompt


#: templates that read a call's arguments: as text (printed whole), or as an object
#: (``|string`` reads all of it, as ``tojson`` does; a test of a key reads that key: the
#: probe's call has one argument, ``arg``)
ARGS_TEMPLATES = {
    "text": "{{ c.function.arguments }}",
    "string": "{{ c.function.arguments|string }}",
    "key": "{% if c.function.arguments.arg or c.function.arguments.city %}city{% endif %}",
}


@pytest.mark.parametrize("args", ['{"city": "Paris", "n": [1, 2.5]}', {"city": "Pé", "n": [1, 2.5]}, "[1, 2]"])
@pytest.mark.parametrize("reads", sorted(ARGS_TEMPLATES))
def test_call_arguments_as_llama_cpp_passes_them(
    tiny_model_path: Path, tiny_model: Model, reads: str, args: Any
) -> None:
    """llama.cpp keeps a call's arguments as JSON text (an object written compactly) and
    parses the text when its probe finds that the template reads the arguments' values;
    a template that only prints them whole gets the text."""
    template = (
        "{% for t in tools %}T {{ t.function.name }}\n{% endfor %}{% for m in messages %}{% if m.tool_calls %}"
        "{% for c in m.tool_calls %}CALL {{ c.function.name }} " + ARGS_TEMPLATES[reads] + "{% endfor %}"
        "{% else %}{{ m.role }}: {{ m.content }}{% endif %}\n{% endfor %}"
    )
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": args}}
    msgs = [dict(m, tool_calls=[call]) if m.get("tool_calls") else m for m in CONVERSATION[:4]]
    ref = chat_oracle(tiny_model_path, {"template": template, "messages": msgs, "tools": TOOLS})
    assert ref["caps"]["supports_object_arguments"] == (reads != "text")
    assert tiny_model.format_chat(msgs, template=template, tools=TOOLS).prompt == ref["prompt"]


def test_call_arguments_that_are_not_json_are_refused(tiny_model_path: Path, tiny_model: Model) -> None:
    """Arguments text that is not JSON, for a template that reads objects, is refused, as
    llama.cpp refuses it; a template that reads text gets it as it is."""
    from llama_cffi import ChatTemplateError

    call = {"id": "abc123def", "type": "function", "function": {"name": "get_weather", "arguments": "not json"}}
    msgs = [dict(m, tool_calls=[call]) if m.get("tool_calls") else m for m in CONVERSATION[:3]]
    template = _template("mistral_nemo")
    with pytest.raises(AssertionError, match="Failed to parse tool call arguments as JSON"):
        chat_oracle(tiny_model_path, {"template": template, "messages": msgs, "tools": TOOLS})
    with pytest.raises(ChatTemplateError, match=r"messages\[2\]\.tool_calls\[0\]\.function\.arguments must be JSON"):
        tiny_model.format_chat(msgs, template=template, tools=TOOLS)
    text = (
        "{% for m in messages %}{{ m.content }}{% for c in m.tool_calls or [] %}{{ c.function.arguments }}{% endfor %}|"
    )
    text += "{% endfor %}{{ tools|length }}"
    ref = chat_oracle(tiny_model_path, {"template": text, "messages": msgs, "tools": TOOLS})
    ours = tiny_model.format_chat(msgs, template=text, tools=TOOLS).prompt
    assert ours == ref["prompt"] and "|not json|" in ours
