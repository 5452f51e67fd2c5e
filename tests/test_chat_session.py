"""Chat prompts and sessions: Model.format_chat against llama.cpp's own chat machinery
(common_chat_templates_apply, through a C++ oracle), the template's end-of-turn stops,
validate_chat_template, and ChatSession: KV reuse across turns (only new tokens decoded,
the cache equal to a fresh decode of the conversation), trimming and StreamingLLM shifting
past n_ctx, grammar/JSON schema per turn, streaming, asyncio, every memory kind."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llama_cffi import ChatTemplateError, KvCacheFullError, Model
from samplers.branch import BranchStore
from samplers.chat import ChatSession
from samplers.search import complete
from tests.conftest import chat_oracle

GEMMA3 = (Path(__file__).parent / "data" / "gemma3_chat_template.jinja").read_text()

CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hello"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": " Hello! "},
        {"role": "user", "content": "What is 2+2?"},
    ],
    [{"role": "user", "content": "A"}, {"role": "assistant", "content": "B"}, {"role": "user", "content": "C"}],
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


@pytest.mark.parametrize("gen", [True, False])
@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("which", ["tiny-chatml", "gemma3"])
def test_format_chat_equals_llama_cpp(
    tiny_model_path: Path, default_model_path: Path, which: str, conv: int, gen: bool
) -> None:
    """The prompt is llama.cpp's, text part joining, trimming and BOS handling included,
    for the tiny model's ChatML template and Gemma 3's; tools given to templates that do
    not declare them are not rendered (as in llama.cpp)."""
    path, template = (tiny_model_path, None) if which == "tiny-chatml" else (default_model_path, GEMMA3)
    msgs = CONVERSATIONS[conv]
    if not gen and msgs[-1]["role"] == "user" and which == "gemma3":
        msgs = [*msgs, {"role": "assistant", "content": "Four."}]
    model = Model.load(path, vocab_only=True)
    try:
        ref = chat_oracle(
            path, {"messages": msgs, "template": template or "", "add_generation_prompt": gen, "tools": TOOLS}
        )
        ours = model.format_chat(msgs, gen, template=template, tools=TOOLS)
        assert ours.prompt == ref["prompt"]
        assert not ours.tools_rendered and ref["caps"]["supports_tools"] is False
    finally:
        model.close()


def test_turn_ends_and_stop_tokens(tiny_model: Model, default_model: Model) -> None:
    tiny = tiny_model.format_chat(CONVERSATIONS[0])
    assert tiny.stop == ("<|im_end|>",)
    gemma = default_model.format_chat(CONVERSATIONS[0])  # no template in the file: Gemma's builtin
    assert gemma.template == "gemma" and gemma.stop == ("<end_of_turn>",)
    end = default_model.tokenize("<end_of_turn>", add_special=False, parse_special=True)
    assert len(end) == 1 and int(end[0]) in gemma.stop_tokens
    assert set(default_model.vocab.eog_tokens()) <= set(gemma.stop_tokens)
    assert gemma.prompt.endswith("<start_of_turn>model\n")
    assert default_model.format_chat(CONVERSATIONS[0], template=GEMMA3).prompt == gemma.prompt


def test_validate_chat_template(tiny_model: Model, default_model: Model) -> None:
    r = tiny_model.validate_chat_template()
    assert (r.supports_system, r.supports_tools, r.turn_end) == (True, False, "<|im_end|>")
    assert r.generation_prompt == "<|im_start|>assistant\n"
    g = default_model.validate_chat_template(GEMMA3)
    assert g.engine == "jinja" or g.engine == "native"
    assert g.turn_end == "<end_of_turn>" and g.generation_prompt == "<start_of_turn>model\n"
    with pytest.raises(ChatTemplateError, match="drops"):
        tiny_model.validate_chat_template("{% for m in messages %}[{{ m['role'] }}]{% endfor %}")
    with pytest.raises(ChatTemplateError):
        tiny_model.validate_chat_template("{% for m in messages %}{{ m['content'] }")
    with pytest.raises(ChatTemplateError, match="a part must be text"):
        tiny_model.format_chat([{"role": "user", "content": [{"type": "video", "video": {"url": "x"}}]}])


# ---------------------------------------------------------------------- sessions
def test_session_reuses_the_cache(tiny_model: Model) -> None:
    """Each turn decodes only what the cache lacks; the cache then holds exactly the
    tokens of the rendered conversation, and the logits before the reply equal a fresh
    one-batch decode of it (within 2e-3: the turns were decoded in other batch shapes, whose
    F32 kernels sum in another order, over an f16 KV cache)."""
    with tiny_model.context(n_ctx=512, n_seq_max=2, kv_unified=True) as ctx:
        s = ChatSession(ctx, system="You are terse.", max_tokens=12)
        for i, q in enumerate(["What is the capital of France?", "And of Italy?", "Thanks!"]):
            prompt = tiny_model.format_chat([*s.window(), {"role": "user", "content": q}])
            full = [int(t) for t in tiny_model.tokenize(prompt.prompt, parse_special=True)]
            stream = s.stream(q)
            assert s.tokens == full  # the cache holds the conversation, nothing else
            before = s._branch.logits.copy() if s._branch is not None else None
            reply = "".join(stream)
            r = stream.reply
            assert r.text == reply and s.messages[-1] == {"role": "assistant", "content": reply}
            assert r.reused_tokens + r.decoded_tokens == len(full)
            if i:
                assert r.reused_tokens > len(full) // 2, "most of the conversation came from the cache"
            with tiny_model.context(n_ctx=512) as fresh:
                row = np.array(fresh.decode(full), copy=True)
            assert before is not None
            np.testing.assert_allclose(before, row, rtol=0, atol=2e-3)
            ref = complete(BranchStore(fresh2 := tiny_model.context(n_ctx=512)), full, max_tokens=12)
            fresh2.close()
            assert r.result.tokens == ref.tokens  # greedy: the same reply as a fresh context


def test_default_model_session(default_model: Model) -> None:
    """Gemma's template (the model file has none): the reply ends at <end_of_turn>, an
    end-of-generation token, or the budget; the second turn reuses the first's tokens."""
    with default_model.context(n_ctx=1024, n_seq_max=2, kv_unified=True) as ctx:
        s = ChatSession(ctx, system="Answer in one word.", max_tokens=16)
        a = s.send("What colour is the sky?")
        b = s.send("And grass?")
        assert a.result.stop_reason in ("eog", "max_tokens") and a.text
        assert b.reused_tokens > a.reused_tokens + a.decoded_tokens - 2
        full = default_model.format_chat(s.window()[:-1])
        assert (
            s.tokens[: b.reused_tokens]
            == [int(t) for t in default_model.tokenize(full.prompt, parse_special=True)][: b.reused_tokens]
        )
        assert "<end_of_turn>" not in b.text


@pytest.mark.parametrize("overflow", ["trim", "shift"])
def test_long_conversations_fit(tiny_model: Model, overflow: str) -> None:
    """Twelve turns in a 256-token context: trimming keeps the newest turns in the window
    (the conversation stays in messages); shifting keeps every message, drops old KV cells
    after the system prompt's tokens and decodes only the new text."""
    with tiny_model.context(n_ctx=256, n_seq_max=2, kv_unified=True) as ctx:
        s = ChatSession(ctx, system="You are terse.", max_tokens=30, overflow=overflow)  # type: ignore[arg-type]
        sink = [
            int(t) for t in tiny_model.tokenize(tiny_model.format_chat(s.messages, False).prompt, parse_special=True)
        ]
        for i in range(12):
            r = s.send(f"Tell me fact number {i} about the sea.")
            assert s.position <= ctx.n_ctx_seq
            assert r.result.stop_reason in ("eog", "max_tokens", "context")
        assert len(s.messages) == 25
        if overflow == "trim":
            assert len(s.window()) < 25 and s.window()[0]["role"] == "system"
        else:
            assert s._shifted and len(s.window()) == 25
            new = "Tell me fact number 11 about the sea."
            delta = f"<|im_end|>\n<|im_start|>user\n{new}<|im_end|>\n<|im_start|>assistant\n"  # the new text only
            assert r.decoded_tokens == len(tiny_model.tokenize(delta, add_special=False, parse_special=True))
            assert s.tokens[: len(sink)] == sink  # the attention sinks stayed
            assert ctx.memory.seq_pos_min(s._branch.seq_id) == 0  # type: ignore[union-attr]


def test_overflow_error_leaves_the_session_as_it_was(tiny_model: Model) -> None:
    with tiny_model.context(n_ctx=256, n_seq_max=2, kv_unified=True) as ctx:
        s = ChatSession(ctx, max_tokens=16, overflow="error")
        s.send("Hi")
        n, tokens = len(s.messages), s.tokens
        with pytest.raises(KvCacheFullError, match="do not fit"):
            s.send("word " * 300)
        assert len(s.messages) == n and s.tokens == tokens
        assert s.send("Hi again").text is not None


def test_grammar_and_schema_per_turn(tiny_model: Model) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}
    with tiny_model.context(n_ctx=512, n_seq_max=2, kv_unified=True) as ctx:
        s = ChatSession(ctx, max_tokens=60)
        r = s.send("Where is the Eiffel tower? Answer as JSON.", json_schema=schema)
        assert r.result.stop_reason == "grammar"
        assert set(json.loads(r.text)) == {"city"}
        r = s.send("Yes or no?", grammar='root ::= "yes" | "no"')
        assert r.text in ("yes", "no")
        s.send("And now anything.", max_tokens=5)  # no constraint left over


def test_async_session(tiny_model: Model) -> None:
    """asend equals send; a cancelled astream adds no reply and the session goes on."""
    with tiny_model.context(n_ctx=512, n_seq_max=2, kv_unified=True) as ctx:
        a = ChatSession(ctx, system="Hi.", max_tokens=10)
        want = [a.send("One"), a.send("Two")]
        a.close()

        async def main() -> list[str]:
            s = ChatSession(ctx, system="Hi.", max_tokens=10)
            got = [(await s.asend("One")).text, (await s.asend("Two")).text]
            pieces: list[str] = []

            async def consume() -> None:
                async for p in s.astream("Three", max_tokens=200):
                    pieces.append(p)
                    await asyncio.sleep(0)

            task = asyncio.ensure_future(consume())
            while not pieces:
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert s.messages[-1]["role"] == "user"  # no reply was added
            s.messages.pop()
            got.append((await s.asend("Four")).text)
            s.close()
            return got

        got = asyncio.run(main())
        assert got[:2] == [w.text for w in want] and got[2] is not None


@pytest.mark.parametrize("kind", ["mamba", "hybrid", "swa"])
def test_every_memory_kind(tiny_model_of: Callable[[str], Path], kind: str) -> None:
    """Recurrent and hybrid memories cannot drop tokens: the session starts the sequence
    over when the conversation diverges from its cache; sliding-window attention reuses."""
    with Model.load(tiny_model_of(kind)) as model, model.context(n_ctx=512, n_seq_max=2, kv_unified=True) as ctx:
        s = ChatSession(ctx, template="chatml", max_tokens=8)
        for q in ("one", "two", "three"):
            r = s.send(q)
            full = model.format_chat(s.window()[:-1], template="chatml")
            assert s.tokens[: len(s.tokens) - len(r.result.tokens)] == [
                int(t) for t in model.tokenize(full.prompt, parse_special=True)
            ]


def test_strftime_now_as_llama_cpp(tiny_model_path: Path, tiny_model: Model) -> None:
    """Templates that write today's date (Llama 3.2's, Mistral's) call ``strftime_now``: the
    prompt is llama.cpp's (both read the clock: a run that crosses a minute is retried); a
    format whose result does not fit llama.cpp's 100 bytes is refused, as there."""
    tpl = (
        "{{ bos_token }}[{{ strftime_now('%d %b %Y %H:%M') }}]"
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    )
    msgs = [{"role": "user", "content": "What day is it?"}]
    for _ in range(3):
        ref = chat_oracle(tiny_model_path, {"messages": msgs, "template": tpl, "add_generation_prompt": True})
        ours = tiny_model.format_chat(msgs, template=tpl).prompt
        if ours == ref["prompt"]:
            break
    assert ours == ref["prompt"]
    assert time.strftime("%d %b %Y") in ours
    with pytest.raises(ChatTemplateError, match="strftime_now"):
        tiny_model.format_chat(msgs, template="{{ strftime_now('%Y' * 40) }}")
