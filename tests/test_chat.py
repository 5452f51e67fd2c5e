"""Chat templates: native llama.cpp rendering, Jinja fallback, errors."""

from __future__ import annotations

from pathlib import Path

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


@pytest.mark.parametrize("engine", ["auto", "native", "jinja"])
def test_unknown_template_name_is_refused(tiny_model: Model, engine: str) -> None:
    """A name that is no known template (a typo of "chatml") is refused with the known
    names, never rendered as template text (Jinja would print the word itself)."""
    calls = {
        "apply_template": lambda: llama_cffi.chat.apply_template("chatmll", MESSAGES, engine=engine),
        "apply_chat_template": lambda: tiny_model.apply_chat_template(MESSAGES, template="chatmll", engine=engine),
        "format_chat": lambda: tiny_model.format_chat(MESSAGES, template="chatmll", engine=engine),
        "validate_chat_template": lambda: tiny_model.validate_chat_template("chatmll", engine=engine),
        "turn_end": lambda: llama_cffi.chat.turn_end("chatmll", engine=engine),
    }
    for where, call in calls.items():
        with pytest.raises(ChatTemplateError, match=r"unknown chat template name 'chatmll'") as info:
            call()
        message = str(info.value)
        assert all(name in message for name in ("chatml", "gemma", "llama3", "mistral-v7")), (where, message)


def test_template_names_and_text_are_told_apart(tiny_model: Model, tmp_path: Path) -> None:
    """Builtin names render natively; template text (even one line without markup, such as
    a literal prompt with spaces) renders as text; a name the model ships
    (``tokenizer.chat_template.NAME``) is found by the model's methods and listed when a
    name is unknown."""
    from llama_cffi.testing import write_tiny_model

    assert llama_cffi.chat.apply_template("chatml", MESSAGES).startswith("<|im_start|>system")
    assert llama_cffi.chat.apply_template("Just this text.", MESSAGES) == "Just this text."
    shipped = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    path = write_tiny_model(tmp_path / "named.gguf", extra_metadata={"tokenizer.chat_template.tool_use": shipped})
    with Model.load(path) as model:
        assert model.chat_template("tool_use") == shipped
        assert model.apply_chat_template(MESSAGES, template="tool_use") == "<system>Be brief.<user>Hi"
        assert model.format_chat(MESSAGES, template="tool_use").prompt == "<system>Be brief.<user>Hi"
        with pytest.raises(ChatTemplateError, match=r"unknown chat template name 'tool_uses'.*tool_use"):
            model.apply_chat_template(MESSAGES, template="tool_uses")


def test_jinja_has_no_html_escaping() -> None:
    """As in llama.cpp's Jinja engine, which has no Markup: ``safe`` gives text as it is
    (other values as their text) and nothing added to it is HTML-escaped; ``escape``
    escapes only its own input; ``tojson`` writes quotes and ``<&'`` as they are."""
    from llama_cffi.template_sandbox import render_template

    ctx = {"d": {"q": "<'&\">"}, "s": "<b>"}
    assert render_template('{{ "x"|safe + s + d|tojson }}', ctx) == 'x<b>{"q": "<\'&\\">"}'
    assert render_template("{{ s|safe }} {{ 1|safe }} {{ none|safe }}", ctx) == "<b> 1 None"
    assert render_template('{{ s|e + s }} {{ "<"|forceescape }}', ctx) == "&lt;b&gt;<b> &lt;"
