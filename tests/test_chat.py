"""Chat templates: native llama.cpp rendering, Jinja fallback, errors."""

from __future__ import annotations

import pytest

import llama_cffi
from llama_cffi import ChatTemplateError, Model

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def test_builtin_template_names() -> None:
    """llama.cpp's builtin templates include the common families."""
    names = llama_cffi.builtin_templates()
    assert {"chatml", "llama3", "gemma", "mistral-v7"} <= set(names)


def test_model_template_is_chatml(tiny_model: Model) -> None:
    """The tiny model's embedded ChatML template renders to ChatML."""
    out = tiny_model.apply_chat_template(MESSAGES)
    assert out == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert not tiny_model.apply_chat_template(MESSAGES, add_generation_prompt=False).endswith("assistant\n")


def test_named_builtin_template(tiny_model: Model) -> None:
    """A builtin name renders that family (gemma merges the system prompt into the user turn)."""
    out = tiny_model.apply_chat_template(MESSAGES, template="gemma")
    assert out == "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"


def test_jinja_fallback_for_custom_templates(tiny_model: Model) -> None:
    """A template llama.cpp cannot render natively is rendered by Jinja in auto mode."""
    tmpl = (
        "{% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[ASSISTANT]{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="natively"):
        tiny_model.apply_chat_template(MESSAGES, template=tmpl, engine="native")
    out = tiny_model.apply_chat_template(MESSAGES, template=tmpl)
    assert out == "[SYSTEM] Be brief.\n[USER] Hi\n[ASSISTANT]"


def test_native_and_jinja_agree_on_chatml(tiny_model: Model) -> None:
    """llama.cpp's native ChatML equals Jinja rendering of the model's template text."""
    tmpl = tiny_model.chat_template()
    assert tmpl is not None
    native = tiny_model.apply_chat_template(MESSAGES, engine="native")
    jinja = tiny_model.apply_chat_template(MESSAGES, template=tmpl, engine="jinja")
    assert native == jinja


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user"}],
        [{"content": "x"}],
        ["hello"],
        [{"role": "user", "content": 3}],
        [{"role": "user", "content": "a\0b"}],
    ],
)
def test_bad_messages(tiny_model: Model, messages: list[object]) -> None:
    """Malformed messages raise ChatTemplateError (a ValueError) naming the message."""
    with pytest.raises(ChatTemplateError, match=r"messages\[0\]"):
        tiny_model.apply_chat_template(messages)  # type: ignore[arg-type]


def test_jinja_template_errors_are_typed(tiny_model: Model) -> None:
    """A template that raises or fails to parse gives ChatTemplateError."""
    with pytest.raises(ChatTemplateError, match="nope"):
        tiny_model.apply_chat_template(MESSAGES, template="{{ raise_exception('nope') }}")
    with pytest.raises(ChatTemplateError):
        tiny_model.apply_chat_template(MESSAGES, template="{% for %}")
