"""Reasoning models (issue 44, item 4): the template's reasoning markers found by probing
it (as llama.cpp's differential analysis does), a reply's reasoning split from its
content, history kept the way the template renders it, and llama.cpp's reasoning budget,
on the tiny model with Qwen3-like templates."""

from __future__ import annotations

import numpy as np
import pytest

import llama_cffi
from llama_cffi.chat import ReasoningFormat, reasoning_format
from samplers.candidates import Candidates
from samplers.chat import ChatSession
from samplers.reasoning import ReasoningBudget, reasoning_budget_for, split_reasoning

pytest.importorskip("jinja2")

#: Qwen3's shape: reasoning shown only for the assistant turns after the last user message;
#: ``enable_thinking=False`` closes an empty block in the generation prompt.
QWEN3_LIKE = (
    "{%- set ns = namespace(last=-1) -%}"
    "{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "<|im_start|>assistant\n"
    "{%- if m.reasoning_content and loop.index0 > ns.last %}<think>\n{{ m.reasoning_content }}\n</think>\n\n"
    "{%- endif %}{{ m.content }}<|im_end|>\n"
    "{%- else -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif -%}"
    "{%- endif -%}"
)
#: DeepSeek-R1's shape: the generation prompt opens the block.
R1_LIKE = QWEN3_LIKE.replace(
    "{%- if add_generation_prompt %}<|im_start|>assistant\n",
    "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n",
)
THINK = ReasoningFormat("<think>", "</think>")


def test_the_markers_come_from_the_template(tiny_model: llama_cffi.Model) -> None:
    assert reasoning_format(QWEN3_LIKE) == THINK
    assert reasoning_format(R1_LIKE) == THINK
    bracket = QWEN3_LIKE.replace("<think>", "[THINK]").replace("</think>", "[/THINK]")
    assert reasoning_format(bracket) == ReasoningFormat("[THINK]", "[/THINK]")
    assert reasoning_format("chatml") is None
    assert reasoning_format(tiny_model.chat_template() or "") is None
    msgs = [{"role": "user", "content": "hi"}]
    p = tiny_model.format_chat(msgs, template=QWEN3_LIKE)
    assert p.reasoning == THINK and not p.reasoning_open
    assert tiny_model.format_chat(msgs, template=R1_LIKE).reasoning_open
    closed = tiny_model.format_chat(msgs, template=QWEN3_LIKE, enable_thinking=False)
    assert closed.prompt.endswith("</think>\n\n") and not closed.reasoning_open
    assert tiny_model.format_chat(msgs).reasoning is None


def test_split_reasoning() -> None:
    assert split_reasoning("<think>\nhm, 2+2\n</think>\n\nIt is 4.", THINK) == ("hm, 2+2", "It is 4.")
    assert split_reasoning("  <think>a</think>b", THINK) == ("a", "b")
    assert split_reasoning("a</think>b", THINK, opened=True) == ("a", "b")
    assert split_reasoning("still thinking", THINK, opened=True) == ("still thinking", "")
    assert split_reasoning("<think>unfinished", THINK) == ("unfinished", "")
    assert split_reasoning("no block <think>x</think>", THINK) == ("", "no block <think>x</think>")
    assert split_reasoning("<think>x</think>y", None) == ("", "<think>x</think>y")


def test_a_session_splits_reasoning_and_keeps_history_as_the_template_does(tiny_model: llama_cffi.Model) -> None:
    """A reply made (by a grammar) to hold a reasoning block: the reply's text is the
    content, its reasoning is kept as the message's reasoning_content; the next turn's
    rendering drops it (the template shows reasoning only after the last user message),
    so the cache is re-decoded from where the renderings part."""
    grammar = 'root ::= "<think>" [a-z ]{2,12} "</think>" [a-z]{1,8}'
    with tiny_model.context(n_ctx=512) as ctx:
        s = ChatSession(ctx, template=QWEN3_LIKE, max_tokens=60)
        r = s.send("Think first.", grammar=grammar)
        assert r.result.text.startswith("<think>") and "</think>" in r.result.text
        body, after = r.result.text[len("<think>") :].split("</think>")
        assert r.reasoning == body.strip() and r.text == after.strip() and r.reasoning
        assert s.messages[-1] == {"role": "assistant", "content": r.text, "reasoning_content": r.reasoning}
        shown = tiny_model.format_chat(s.window(), template=QWEN3_LIKE, add_generation_prompt=False).prompt
        assert f"<think>\n{r.reasoning}\n</think>" in shown  # the last assistant turn shows it
        r2 = s.send("And now?", grammar="root ::= [a-z]{1,4}")
        nxt = tiny_model.format_chat(s.window()[:-1], template=QWEN3_LIKE).prompt
        assert f"<think>\n{r.reasoning}" not in nxt  # the template dropped the earlier reasoning
        assert r2.reasoning == "" and r2.decoded_tokens > 0


def test_the_budget_forces_the_end_marker(tiny_model: llama_cffi.Model) -> None:
    """reasoning_budget=N: after N tokens inside the block the end marker is forced (the
    grammar allows reasoning of any length); without a budget the block runs longer. The
    R1-like template opens the block in the prompt, so counting starts at the first token
    (the tiny vocabulary spells ``<think>`` in bytes, several ways: the budget, as
    llama.cpp's, matches the marker's own tokenization, which a real model's single
    special token always is)."""
    grammar = 'root ::= [a-z]* "</think>" "ok"'
    with tiny_model.context(n_ctx=512) as ctx:
        long = ChatSession(ctx, template=R1_LIKE, max_tokens=30).send("Go.", grammar=grammar)
        assert long.result.stop_reason == "max_tokens" or len(long.result.tokens) > 12
    with tiny_model.context(n_ctx=512) as ctx:
        s = ChatSession(ctx, template=R1_LIKE, max_tokens=30, reasoning_budget=3)
        r = s.send("Go.", grammar=grammar)
        end = [int(t) for t in tiny_model.tokenize("</think>", add_special=False, parse_special=True)]
        toks = list(r.result.tokens)
        assert toks[3 : 3 + len(end)] == end  # forced right after 3 tokens
        assert r.text == "ok" and r.reasoning == tiny_model.detokenize(toks[:3]).strip()
        with pytest.raises(llama_cffi.ParamError, match="reasoning_budget"):
            ChatSession(ctx, reasoning_budget=-1)


def _forced(b: ReasoningBudget, n_vocab: int = 16) -> int | None:
    cands = Candidates.from_logits(np.zeros(n_vocab, np.float32))
    b.apply(cands)
    finite = np.flatnonzero(np.isfinite(cands.logits))
    return int(cands.read_ids()[finite[0]]) if len(finite) == 1 else None


def test_the_budget_state_machine() -> None:
    """common/reasoning-budget.cpp's states: idle until the start sequence, counting,
    waiting for a UTF-8 character to complete, forcing token by token, done (a natural
    end stops it; a new start re-arms it)."""
    b = ReasoningBudget([[1, 2]], [[3]], [9, 3], 2)
    for t in (1, 5, 1, 2):  # the start sequence, found as it ends
        assert _forced(b) is None
        b.accept(t)
    assert b.state == "counting"
    b.accept(7)
    b.accept(7)  # the budget is spent: force 9 then 3
    assert b.state == "forcing" and _forced(b) == 9
    b.accept(9)
    assert _forced(b) == 3
    b.accept(3)
    assert b.state == "done" and _forced(b) is None
    b.accept(1)
    b.accept(2)  # a new block re-arms it
    assert b.state == "counting"
    b.accept(3)  # a natural end
    assert b.state == "done"

    partial = ReasoningBudget([[1]], [[3]], [3], 1, is_partial=lambda t: t == 8, state="counting")
    partial.accept(8)  # the budget ends inside a UTF-8 character: wait for it
    assert partial.state == "waiting_utf8" and _forced(partial) is None
    partial.accept(6)
    assert partial.state == "forcing" and _forced(partial) == 3
    assert ReasoningBudget([[1]], [[3]], [3], 0, state="counting").state == "forcing"
    with pytest.raises(TypeError, match="budget"):
        ReasoningBudget([[1]], [[3]], [3], "2")  # type: ignore[arg-type]


def test_reasoning_budget_for_tokenizes_the_markers(tiny_model: llama_cffi.Model) -> None:
    b = reasoning_budget_for(tiny_model, THINK, 5, message=" ok.", opened=True)
    end = [int(t) for t in tiny_model.tokenize("</think>", add_special=False, parse_special=True)]
    msg = [int(t) for t in tiny_model.tokenize(" ok.", add_special=False, parse_special=True)]
    assert b.forced == msg + end and b.state == "counting" and b.remaining == 5
