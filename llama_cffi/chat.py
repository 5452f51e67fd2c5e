"""Chat templates: llama.cpp's native ``llama_chat_apply_template``, Jinja as a fallback.

llama.cpp recognises a fixed set of template *families* (by name or by the shape of
the template text) and renders them natively; it does not run arbitrary Jinja. For
other templates, the optional ``jinja`` extra renders the template text itself in a
sandbox, the way Hugging Face tokenizers do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ._binding import ffi, lib
from .errors import ChatTemplateError
from .template_sandbox import (
    TemplateLimitError,
    TemplateLimits,
    get_template_limits,
    render_template,
    set_template_limits,
)

__all__ = [
    "ChatTemplateError",
    "TemplateLimitError",
    "TemplateLimits",
    "apply_template",
    "builtin_templates",
    "get_template_limits",
    "set_template_limits",
]


def builtin_templates() -> list[str]:
    """Names llama.cpp can render natively (``"chatml"``, ``"llama3"``, ``"gemma"``, ...)."""
    n = lib.llama_chat_builtin_templates(ffi.NULL, 0)
    arr = ffi.new("const char *[]", max(n, 1))
    n = lib.llama_chat_builtin_templates(arr, n)
    return [ffi.string(arr[i]).decode() for i in range(n)]


def _messages(messages: Iterable[Mapping[str, str]]) -> list[tuple[str, str]]:
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ChatTemplateError(
                f"messages[{i}] must be a mapping with 'role' and 'content', not {type(m).__name__}"
            )
        try:
            role, content = m["role"], m["content"]
        except KeyError as exc:
            raise ChatTemplateError(f"messages[{i}] has no {exc.args[0]!r}") from None
        if not isinstance(role, str) or not isinstance(content, str):
            raise ChatTemplateError(f"messages[{i}]: role and content must be str")
        if "\0" in role or "\0" in content:
            raise ChatTemplateError(f"messages[{i}] contains a NUL character")
        out.append((role, content))
    return out


def apply_native(template: str, messages: Iterable[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
    """Render with llama.cpp; :class:`ChatTemplateError` if it does not know the template."""
    msgs = _messages(messages)
    keep = [(ffi.new("char[]", r.encode()), ffi.new("char[]", c.encode())) for r, c in msgs]
    chat = ffi.new("llama_chat_message[]", max(len(keep), 1))
    for i, (r, c) in enumerate(keep):
        chat[i].role = r
        chat[i].content = c
    tmpl = template.encode()
    if b"\0" in tmpl:
        raise ChatTemplateError("template contains a NUL character")
    cap = 256 + 2 * sum(len(r) + len(c) for r, c in msgs)
    for _ in range(2):
        buf = ffi.new("char[]", cap)
        n = lib.llama_chat_apply_template(tmpl, chat, len(msgs), add_generation_prompt, buf, cap)
        if n < 0:
            raise ChatTemplateError(
                "llama.cpp cannot apply this chat template natively "
                "(install the 'jinja' extra and use engine='jinja' or 'auto')"
            )
        if n <= cap:
            return ffi.unpack(buf, n).decode("utf-8", "replace")  # type: ignore[no-any-return]
        cap = n
    raise ChatTemplateError("llama_chat_apply_template did not converge on a buffer size")  # pragma: no cover


def apply_jinja(
    template: str,
    messages: Iterable[Mapping[str, str]],
    add_generation_prompt: bool = True,
    limits: TemplateLimits | None = None,
    **context: Any,
) -> str:
    """Render template text with Jinja2 (the optional ``jinja`` extra) in a sandbox that
    bounds output, time, loops, recursion and memory (:mod:`llama_cffi.template_sandbox`;
    ``limits``: None for the process-wide defaults, see :func:`set_template_limits`).
    Every failure is a :class:`ChatTemplateError` (:class:`TemplateLimitError` for a limit)."""
    ctx = dict(context)
    ctx["messages"] = [{"role": r, "content": c} for r, c in _messages(messages)]
    ctx["add_generation_prompt"] = add_generation_prompt
    return render_template(template, ctx, limits)


def apply_template(
    template: str,
    messages: Iterable[Mapping[str, str]],
    add_generation_prompt: bool = True,
    engine: str = "auto",
    limits: TemplateLimits | None = None,
    **context: Any,
) -> str:
    """Render with ``engine`` ``"native"``, ``"jinja"`` or ``"auto"`` (native first);
    ``limits`` bound the Jinja path (see ``apply_jinja``)."""
    if engine not in ("auto", "native", "jinja"):
        raise ValueError(f"engine={engine!r}; use 'auto', 'native' or 'jinja'")
    msgs = list(messages)
    if engine == "jinja":
        return apply_jinja(template, msgs, add_generation_prompt, limits, **context)
    try:
        return apply_native(template, msgs, add_generation_prompt)
    except ChatTemplateError:
        if engine == "native" or template in builtin_templates():
            raise
        return apply_jinja(template, msgs, add_generation_prompt, limits, **context)
