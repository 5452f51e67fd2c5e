"""Chat templates: llama.cpp's native ``llama_chat_apply_template``, Jinja as a fallback.

llama.cpp recognises a fixed set of template *families* (by name or by the shape of
the template text) and renders them natively; it does not run arbitrary Jinja. For
other templates, the optional ``jinja`` extra renders the template text itself in a
sandbox, the way Hugging Face tokenizers do.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ._args import expect, expect_bool, expect_iterable, expect_path, expect_str, expect_strs
from ._binding import ffi, lib
from .errors import ChatTemplateError, InvalidMediaError
from .template_sandbox import (
    TemplateLimitError,
    TemplateLimits,
    get_template_limits,
    render_template,
    set_template_limits,
)

__all__ = [
    "MEDIA_MARKER",
    "MEDIA_PART_TYPES",
    "ChatPrompt",
    "ChatTemplateError",
    "ReasoningFormat",
    "TemplateLimitError",
    "TemplateLimits",
    "TemplateReport",
    "apply_template",
    "builtin_templates",
    "declares_tools",
    "get_template_limits",
    "is_template_name",
    "media_sources",
    "reasoning_format",
    "reasoning_opens",
    "set_template_limits",
    "turn_end",
    "unknown_template_name",
    "validate_template",
    "with_media_markers",
]


def builtin_templates() -> list[str]:
    """Names llama.cpp can render natively (``"chatml"``, ``"llama3"``, ``"gemma"``, ...)."""
    return list(_builtin_names())


@functools.cache
def _builtin_names() -> tuple[str, ...]:
    n = lib.llama_chat_builtin_templates(ffi.NULL, 0)
    arr = ffi.new("const char *[]", max(n, 1))
    n = lib.llama_chat_builtin_templates(arr, n)
    return tuple(ffi.string(arr[i]).decode() for i in range(n))


#: What a template *name* looks like (llama.cpp's are ``chatml``, ``llama2-sys-bos``,
#: ``seed_oss``, ``granite-4.0``): one word of letters, digits, ``.``, ``_`` and ``-``.
#: Template text has markup or spaces; a word is never meant as a template (Jinja would
#: print the word itself, whatever the messages).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _check_template(template: object) -> str:
    return expect_str("template", template, "a str (a template name or template text)")


def _check_engine(engine: object, limits: object) -> None:
    """The TypeError naming ``engine`` (a str) or ``limits`` (a TemplateLimits or None)."""
    expect_str("engine", engine, "'auto', 'native' or 'jinja'")
    if limits is not None:
        expect("limits", limits, TemplateLimits, "a llama_cffi.chat.TemplateLimits or None")


def is_template_name(template: str) -> bool:
    """Whether ``template`` is a name (one word such as ``"chatml"``) rather than template
    text. A name must be one of :func:`builtin_templates` (or, for a model's methods, a
    template the model ships): an unknown one is refused, never rendered as text."""
    return _NAME.fullmatch(_check_template(template)) is not None


def unknown_template_name(name: str, shipped: Iterable[str] = ()) -> ChatTemplateError:
    """The error for a template name that is no known template: it lists the names that
    are (llama.cpp's builtin ones, and ``shipped``: those a model's file carries)."""
    expect_str("name", name)
    shipped = expect_strs("shipped", shipped, "an iterable of template names (str)")
    known = f"llama.cpp's builtin templates: {', '.join(_builtin_names())}"
    if shipped := sorted(shipped):
        known += f"; the model's own: {', '.join(shipped)}"
    return ChatTemplateError(
        f"unknown chat template name {name!r}: a name must be one of {known} (or pass the template's text)"
    )


#: What an image or sound part of a message renders as: libmtmd's default media marker
#: (``mtmd_default_marker()``), which a :class:`~llama_cffi.mtmd.Projector` made without
#: ``media_marker=`` finds in the text.
MEDIA_MARKER = "<__media__>"
#: OpenAI-style content part types that carry an image or a sound.
MEDIA_PART_TYPES = ("image_url", "input_audio")


def _content(i: int, content: object) -> str:
    """A message's content as text: a str, or a list of content parts joined as llama.cpp
    joins them (``common/chat.cpp``): text parts with a newline between them, but none
    before or after a media part. An image or sound part (``image_url``,
    ``input_audio``) renders as :data:`MEDIA_MARKER`; llama.cpp's own ``media_marker``
    parts (``{"type": "media_marker", "text": ...}``) as their text. Other part types are
    refused: dropping input silently would change the conversation."""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        text = ""
        last_was_media = False
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            if kind == "text" and isinstance(part, Mapping) and isinstance(part.get("text"), str):
                if not last_was_media and text:
                    text += "\n"
                text += part["text"]
                last_was_media = False
            elif kind in MEDIA_PART_TYPES or (
                kind == "media_marker" and isinstance(part, Mapping) and isinstance(part.get("text"), str)
            ):
                assert isinstance(part, Mapping)
                text += part["text"] if kind == "media_marker" else MEDIA_MARKER
                last_was_media = True
            else:
                raise ChatTemplateError(
                    f"messages[{i}].content[{j}]: a part must be text ({{'type': 'text', 'text': ...}}), an image "
                    f"({{'type': 'image_url', ...}}) or a sound ({{'type': 'input_audio', ...}}), not {kind!r}"
                )
        return text
    if content is None:
        return ""
    raise ChatTemplateError(
        f"messages[{i}]: content must be a str or a list of content parts, not {type(content).__name__}"
    )


def _has_media(content: object) -> bool:
    return isinstance(content, (list, tuple)) and any(
        isinstance(p, Mapping) and p.get("type") in (*MEDIA_PART_TYPES, "media_marker") for p in content
    )


def media_sources(
    messages: Iterable[Mapping[str, Any]], media_path: str | os.PathLike[str] | None = None
) -> list[bytes | str]:
    """The images and sounds of ``messages``' content parts, in the order their markers
    appear in the rendering: each a file's bytes or a path, for
    :meth:`Projector.open_media <llama_cffi.mtmd.Projector.open_media>`. A part is
    ``{"type": "image_url", "image_url": {"url": URL}}`` or ``{"type": "input_audio",
    "input_audio": {"data": URL, "format": "wav"}}`` (OpenAI's shapes, as llama-server
    takes them), where URL is a ``data:image/...;base64,`` or ``data:audio/...;base64,``
    URI, plain base64, or a ``file://`` URL. As in llama-server, a ``file://`` URL is read
    only when ``media_path`` names a directory, and only under it; ``http(s)://`` URLs are
    not fetched (download the file and pass its bytes as a data URI).

    Raises :class:`~llama_cffi.errors.ChatTemplateError` for a malformed part and
    :class:`~llama_cffi.errors.InvalidMediaError` for data that is not base64 or a path
    that is not allowed."""
    root = None if media_path is None else os.path.realpath(expect_path("media_path", media_path))
    out: list[bytes | str] = []
    for i, m in enumerate(expect_messages(messages)):
        content = m.get("content") if isinstance(m, Mapping) else None
        if not isinstance(content, (list, tuple)):
            continue
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") not in MEDIA_PART_TYPES:
                continue
            where = f"messages[{i}].content[{j}]"
            inner = part.get(part["type"])
            if part["type"] == "image_url" and isinstance(inner, str):
                inner = {"url": inner}
            if not isinstance(inner, Mapping):
                raise ChatTemplateError(f"{where}: {part['type']!r} must be an object with the media's URL or data")
            url = inner.get("url") if part["type"] == "image_url" else inner.get("data", inner.get("url"))
            if not isinstance(url, str) or not url:
                key = "url" if part["type"] == "image_url" else "data"
                raise ChatTemplateError(f"{where}: {part['type']}.{key} must be a non-empty string")
            out.append(_media_source(where, url, root))
    return out


def _media_source(where: str, url: str, root: str | None) -> bytes | str:
    import base64
    import binascii

    if url.startswith(("http://", "https://")):
        raise InvalidMediaError(f"{where}: {url[:60]!r} is not fetched: download it and pass its bytes as a data: URI")
    if url.startswith("file://"):
        if root is None:
            raise InvalidMediaError(f"{where}: file:// URLs are read only with media_path= (a directory to read under)")
        path = os.path.realpath(os.path.join(root, url[len("file://") :].lstrip("/")))
        if os.path.commonpath([root, path]) != root:
            raise InvalidMediaError(f"{where}: {url!r} is outside media_path")
        return path
    data = url
    if url.startswith("data:"):
        head, comma, data = url.partition(",")
        if not comma:
            raise InvalidMediaError(f"{where}: a data: URI needs a comma before its data")
        if not head.startswith(("data:image/", "data:audio/")):
            raise InvalidMediaError(f"{where}: {head!r} is not an image or audio data: URI")
        if not head.endswith(";base64"):
            raise InvalidMediaError(f"{where}: a data: URI must be base64 encoded")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidMediaError(f"{where}: not a data: URI, a file:// URL or base64 data") from None
    if not raw:
        raise InvalidMediaError(f"{where}: the media's data is empty")
    return raw


def with_media_markers(messages: Iterable[Mapping[str, Any]], marker: str) -> list[Mapping[str, Any]]:
    """``messages`` with each image or sound part replaced by a ``media_marker`` part of
    ``marker`` (llama-server's rewrite), for a projector whose marker is not
    :data:`MEDIA_MARKER`. Other messages are passed through as they are."""
    expect_str("marker", marker)
    out: list[Mapping[str, Any]] = []
    for m in expect_messages(messages):
        content = m.get("content") if isinstance(m, Mapping) else None
        if isinstance(content, (list, tuple)) and _has_media(content):
            parts = [
                {"type": "media_marker", "text": marker}
                if isinstance(p, Mapping) and p.get("type") in MEDIA_PART_TYPES
                else p
                for p in content
            ]
            out.append({**m, "content": parts})
        else:
            out.append(m)
    return out


def expect_messages(messages: object) -> Iterable[Mapping[str, Any]]:
    """``messages`` when it can be iterated (each message is checked as it is read): a
    wrong type is a :class:`~llama_cffi.errors.ParamTypeError` naming ``messages``."""
    return expect_iterable("messages", messages, "a sequence of messages (dicts with role and content)")


def _messages(messages: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in _normalized(messages)]


def _normalized(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each message as a new dict with ``role`` (str) and ``content`` (str, parts joined);
    its other keys (``tool_calls``, ``name``, ``tool_call_id``...) are kept for Jinja."""
    out = []
    for i, m in enumerate(expect_messages(messages)):
        if not isinstance(m, Mapping):
            raise ChatTemplateError(
                f"messages[{i}] must be a mapping with 'role' and 'content', not {type(m).__name__}"
            )
        if "role" not in m:
            raise ChatTemplateError(f"messages[{i}] has no 'role'")
        if "content" not in m and not m.get("tool_calls"):
            raise ChatTemplateError(f"messages[{i}] has no 'content'")
        role = m["role"]
        if not isinstance(role, str):
            raise ChatTemplateError(f"messages[{i}]: role must be str")
        content = _content(i, m.get("content"))
        if "\0" in role or "\0" in content:
            raise ChatTemplateError(f"messages[{i}] contains a NUL character")
        out.append({**m, "role": role, "content": content})
    return out


def apply_native(template: str, messages: Iterable[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
    """Render with llama.cpp; :class:`ChatTemplateError` if it does not know the template."""
    _check_template(template)
    add_generation_prompt = expect_bool("add_generation_prompt", add_generation_prompt)
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
            if is_template_name(template):
                raise unknown_template_name(template)
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
    messages: Iterable[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    limits: TemplateLimits | None = None,
    **context: Any,
) -> str:
    """Render template text with Jinja2 (the optional ``jinja`` extra) in a sandbox that
    bounds output, time, loops, recursion and memory (:mod:`llama_cffi.template_sandbox`;
    ``limits``: None for the process-wide defaults, see :func:`set_template_limits`).
    Every failure is a :class:`ChatTemplateError` (:class:`TemplateLimitError` for a limit)."""
    ctx = dict(context)
    msgs = list(messages)
    normalized = _normalized(msgs)
    if any(isinstance(m.get("content"), (list, tuple)) for m in msgs):  # probe only when parts are given
        strings, typed = _content_kinds(template)
        for m, n in zip(msgs, normalized, strict=True):
            raw = m.get("content")
            if isinstance(raw, (list, tuple)) and typed and not _has_media(raw):
                # the template reads parts: give it the parts (with media, llama.cpp gives
                # the joined text, markers in place)
                n["content"] = [dict(part) for part in raw]
            elif isinstance(raw, str) and typed and not strings:
                n["content"] = [{"type": "text", "text": raw}]
    if any(_call_arguments(m) for m in normalized):
        objects = _object_arguments(template)
        for i, n in enumerate(normalized):
            if _call_arguments(n):
                n["tool_calls"] = [_arguments_as_read(c, objects, i, j) for j, c in enumerate(n["tool_calls"])]
    ctx["messages"] = normalized
    ctx["add_generation_prompt"] = add_generation_prompt
    return render_template(template, ctx, limits)


def _call_arguments(message: Mapping[str, Any]) -> bool:
    """Whether ``message`` has tool calls with ``arguments``."""
    calls = message.get("tool_calls")
    if not isinstance(calls, (list, tuple)):
        return False
    return any(isinstance(c, Mapping) and "arguments" in _call_function(c) for c in calls)


def _call_function(call: Mapping[str, Any]) -> Mapping[str, Any]:
    """The mapping holding a call's ``name`` and ``arguments``: its ``function`` (OpenAI's
    shape), or the call itself (a flat ``{"name": ..., "arguments": ...}``)."""
    fn = call.get("function")
    return fn if isinstance(fn, Mapping) else call


def _arguments_as_read(call: Any, objects: bool, i: int, j: int) -> Any:
    """``call`` with its arguments as llama.cpp hands them to a template
    (``common/chat.cpp``): ``common_chat_msgs_parse_oaicompat`` keeps arguments as JSON
    text (an object is written as compact JSON: ``{"city":"Paris"}``), and when the
    template reads arguments as an object (``supports_object_arguments``, see
    :func:`_object_arguments`) ``workaround::func_args_not_string`` parses that text back:
    any JSON value, and text that is not JSON is refused (:class:`ChatTemplateError`, as
    llama.cpp refuses it). So a template that reads objects gets objects, one that reads
    text gets text, whichever form the caller used."""
    if not isinstance(call, Mapping):
        return call
    inner = _call_function(call)
    if "arguments" not in inner:
        return call
    args = inner["arguments"]
    if objects and isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError as e:
            where = f"messages[{i}].tool_calls[{j}]" + (".function" if inner is not call else "")
            raise ChatTemplateError(
                f"{where}.arguments must be JSON text (this template reads arguments as an object, and llama.cpp "
                f"refuses arguments it cannot parse): {e}"
            ) from None
    elif not objects and not isinstance(args, str):
        try:
            args = json.dumps(args, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError):
            return call  # not JSON data: the template gets it as it is
    else:
        return call
    if inner is call:
        return {**call, "arguments": args}
    return {**call, "function": {**inner, "arguments": args}}


class _ArgumentsProbe(dict):  # type: ignore[type-arg]
    """The probe call's arguments, ``{"arg": "value"}``, recording whether the template
    reads the value (llama.cpp marks a value used when a template looks it up, iterates
    its parent's items or writes its parent with ``tojson``; not when it prints the
    whole object): by key, ``get``, ``items()`` (which ``tojson``'s ``json.dumps`` calls
    too) or ``values()``."""

    __slots__ = ("read",)

    def __init__(self) -> None:
        super().__init__(arg="value")
        self.read = False

    def __getitem__(self, key: Any) -> Any:
        self.read = self.read or key == "arg"
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self.read = self.read or key == "arg"
        return super().get(key, default)

    def items(self) -> Any:
        self.read = True
        return super().items()

    def values(self) -> Any:
        self.read = True
        return super().values()


@functools.lru_cache(maxsize=64)
def _object_arguments(template: str) -> bool:
    """Whether the template reads a tool call's arguments as an object: llama.cpp's
    ``supports_object_arguments`` (``common/jinja/caps.cpp``), found with its probe (the
    same conversation, call ids of nine characters, tool and context): the render
    succeeds and reads the arguments' ``arg``."""
    args = _ArgumentsProbe()
    call = {"id": "call00001", "type": "function", "function": {"name": "tool1", "arguments": args}}
    msgs = [
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "The tool response was 'tool response'"},
        {"role": "user", "content": "User message"},
    ]
    params = {
        "type": "object",
        "properties": {"arg": {"type": "string", "description": "Arg description"}},
        "required": ["arg"],
    }
    tool = {"name": "tool1", "description": "Tool description", "parameters": params}
    tools = [{"name": "tool", "type": "function", "function": tool}]
    context = {"messages": msgs, "tools": tools, "bos_token": "", "eos_token": "", "add_generation_prompt": True}
    try:
        render_template(template, context)
    except ChatTemplateError:
        return False
    return args.read


_PROBE_TYPED = "llama_cffi probe: typed content"


@functools.lru_cache(maxsize=64)
def _content_kinds(template: str) -> tuple[bool, bool]:
    """``(strings, typed)``: whether the template renders string content, and whether it
    renders a list of text parts (probed once per template, as llama.cpp probes its
    capabilities, and only for conversations with content parts). Messages are passed as
    the template takes them: parts joined with newlines for a template of strings only,
    strings wrapped as one part for a template of parts only, as given otherwise."""

    def renders(content: Any) -> bool:
        probe = {"messages": [{"role": "user", "content": content}], "add_generation_prompt": False}
        try:
            out = render_template(template, {**probe, "bos_token": "", "eos_token": ""})
        except ChatTemplateError:
            return False
        return _PROBE_TYPED in out and "'type'" not in out and '"type"' not in out

    strings = renders(_PROBE_TYPED)
    typed = renders([{"type": "text", "text": _PROBE_TYPED}])
    return strings or not typed, typed


def apply_template(
    template: str,
    messages: Iterable[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    engine: str = "auto",
    limits: TemplateLimits | None = None,
    **context: Any,
) -> str:
    """Render with ``engine`` ``"native"``, ``"jinja"`` or ``"auto"`` (native first);
    ``limits`` bound the Jinja path (see ``apply_jinja``). ``template`` is template text
    or the name of a builtin template (:func:`builtin_templates`); a name that is none of
    them is refused (:func:`is_template_name`), and a name is rendered by llama.cpp, not
    by Jinja."""
    _check_template(template)
    add_generation_prompt = expect_bool("add_generation_prompt", add_generation_prompt)
    _check_engine(engine, limits)
    if engine not in ("auto", "native", "jinja"):
        raise ValueError(f"engine={engine!r}; use 'auto', 'native' or 'jinja'")
    msgs = list(expect_messages(messages))
    if is_template_name(template):
        if engine == "jinja":
            if template in _builtin_names():
                raise ChatTemplateError(
                    f"{template!r} is the name of a llama.cpp template: render it with engine='native' or 'auto'"
                )
            raise unknown_template_name(template)
        return apply_native(template, msgs, add_generation_prompt)  # llama.cpp's names, or the error naming them
    if engine == "jinja":
        return apply_jinja(template, msgs, add_generation_prompt, limits, **context)
    try:
        return apply_native(template, msgs, add_generation_prompt)
    except ChatTemplateError:
        if engine == "native" or template in builtin_templates():
            raise
        return apply_jinja(template, msgs, add_generation_prompt, limits, **context)


# ---------------------------------------------------------------------- prompts with their stops
_PROBE_USER = "llama_cffi probe: the user's words"
_PROBE_ASSISTANT = "llama_cffi probe: the assistant's words"
_PROBE_NEXT = "llama_cffi probe: the next words"


@dataclass(frozen=True)
class ChatPrompt:
    """A rendered conversation and how its reply ends (what lloyal's ``formatChat``
    returns): the prompt text, the template's end-of-turn text (``stop``: e.g.
    ``"<|im_end|>"``, ``"<end_of_turn>"``), the token ids that end a turn (``stop_tokens``:
    the end-of-turn text when it is one token, and the model's end-of-generation tokens),
    and ``add_special``: whether tokenizing the prompt should add the model's BOS (False
    when the rendered text starts with it already)."""

    prompt: str
    stop: tuple[str, ...]
    stop_tokens: tuple[int, ...]
    add_special: bool
    #: the template used: its text, or a builtin name (``"chatml"``, ``"gemma"``...)
    template: str
    #: whether ``tools`` were rendered (only templates that declare tools render them, as
    #: in llama.cpp)
    tools_rendered: bool = False
    #: the template's reasoning markers (:func:`reasoning_format`), None when it has none
    reasoning: ReasoningFormat | None = None
    #: the prompt ends inside a reasoning block (its generation prompt opens one): the
    #: reply starts with reasoning, without the start marker
    reasoning_open: bool = False


@dataclass(frozen=True)
class ReasoningFormat:
    """How a template marks a reply's reasoning: ``start`` and ``end`` markers
    (``"<think>"``, ``"</think>"``), found by :func:`reasoning_format`."""

    start: str
    end: str


_PROBE_THINKING = "llama_cffi probe: the assistant's thoughts"
#: What a reasoning marker looks like (llama.cpp's marker segments): ``<think>``,
#: ``</think>``, ``[THINK]``, ``<|channel|>``...
_MARKER = r"(?:<\|[^|<>\s]{1,32}\|>|</?[A-Za-z_][\w:-]{0,31}>|\[/?[A-Z_]{2,32}\]|◁/?[a-z]{1,16}▷)"


def reasoning_format(
    template: str, engine: str = "auto", limits: TemplateLimits | None = None, **context: Any
) -> ReasoningFormat | None:
    """The reasoning markers of a template, found as llama.cpp's differential analysis
    finds them (``common/chat-diff-analyzer.cpp``, ``compare_reasoning_presence``): render
    an assistant message without and with ``reasoning_content``, and take the markers
    around the reasoning in the second. A template that does not render
    ``reasoning_content`` but whose text holds ``<think>`` and ``</think>`` gets those.
    None when neither finds markers (or the template fails to render the probe).
    ``engine="auto"`` renders template text with Jinja when it is installed (as
    :meth:`Model.format_chat <llama_cffi.Model.format_chat>` does): llama.cpp's native
    renderer takes a template it recognises for its family's builtin one, which renders
    no reasoning."""
    if engine == "auto" and not is_template_name(template) and jinja_available():
        engine = "jinja"
    user = {"role": "user", "content": _PROBE_USER}
    plain = {"role": "assistant", "content": _PROBE_ASSISTANT}
    thinking = {**plain, "reasoning_content": _PROBE_THINKING}
    ctx = {"enable_thinking": True, **context}
    try:
        a = apply_template(template, [user, plain], False, engine, limits, **ctx)
        b = apply_template(template, [user, thinking], False, engine, limits, **ctx)
    except ChatTemplateError:
        return None
    at = b.find(_PROBE_THINKING)
    if a != b and at >= 0:
        before = re.search(_MARKER + r"\s*$", b[:at])
        after = re.match(r"\s*(" + _MARKER + r")", b[at + len(_PROBE_THINKING) :])
        if before is not None and after is not None:
            return ReasoningFormat(before.group(0).strip(), after.group(1))
    if not is_template_name(template) and "<think>" in template and "</think>" in template:
        return ReasoningFormat("<think>", "</think>")
    return None


@functools.lru_cache(maxsize=64)
def _reasoning_format_cached(template: str, engine: str) -> ReasoningFormat | None:
    if is_template_name(template) or ("reasoning_content" not in template and "think>" not in template):
        return None  # neither renders reasoning nor names the usual markers
    return reasoning_format(template, engine)


def reasoning_opens(prompt: str, fmt: ReasoningFormat | None) -> bool:
    """Whether a rendered generation prompt ends inside a reasoning block (its last
    marker opens one, as Qwen3's and DeepSeek-R1's templates do): the reply then starts
    with reasoning."""
    expect_str("prompt", prompt)
    if fmt is None:
        return False
    expect("fmt", fmt, ReasoningFormat, "a ReasoningFormat (from reasoning_format) or None")
    tail = prompt.rstrip()
    return tail.endswith(fmt.start)


def jinja_available() -> bool:
    """Whether Jinja2 (the ``jinja`` extra) can be imported."""
    try:
        import jinja2  # noqa: F401
    except ImportError:
        return False
    return True


def declares_tools(template: str) -> bool:
    """Whether template text uses a ``tools`` variable (names never do)."""
    return not is_template_name(template) and re.search(r"\btools\b", template) is not None


def turn_end(template: str, engine: str = "auto", limits: TemplateLimits | None = None, **context: Any) -> str:
    """The text a template puts after an assistant message (stripped): ``"<|im_end|>"`` for
    ChatML, ``"<end_of_turn>"`` for Gemma. Found by rendering a probe conversation; when a
    template puts nothing after the assistant's words, the start of the next user turn
    (Llama 2's ``"[INST]"``). Empty when neither is there."""
    _check_template(template)
    _check_engine(engine, limits)
    msgs = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_ASSISTANT}]
    text = apply_template(template, msgs, False, engine, limits, **context)
    at = text.rfind(_PROBE_ASSISTANT)
    if at < 0:
        raise ChatTemplateError("the chat template does not render the assistant's message")
    after = text[at + len(_PROBE_ASSISTANT) :].strip()
    if after:
        return after
    more = apply_template(template, [*msgs, {"role": "user", "content": _PROBE_NEXT}], False, engine, limits, **context)
    at = more.rfind(_PROBE_ASSISTANT)
    nxt = more.find(_PROBE_NEXT, at)
    return more[at + len(_PROBE_ASSISTANT) : nxt].strip() if at >= 0 and nxt > at else ""


@dataclass(frozen=True)
class TemplateReport:
    """What :func:`validate_template` found about a chat template."""

    #: ``"native"`` (llama.cpp renders it) or ``"jinja"``
    engine: str
    #: a system message appears in the rendering
    supports_system: bool
    #: the template declares tools
    supports_tools: bool
    #: the end-of-turn text (see :func:`turn_end`)
    turn_end: str
    #: the text the generation prompt adds after the last message
    generation_prompt: str


def validate_template(
    template: str, engine: str = "auto", limits: TemplateLimits | None = None, **context: Any
) -> TemplateReport:
    """Render probe conversations (system, user, assistant, a second user turn) with
    ``template`` and report what it supports. Raises :class:`ChatTemplateError` when it
    cannot render them or drops the user's or assistant's words (a template that would
    silently lose the conversation)."""
    _check_template(template)
    _check_engine(engine, limits)
    system = "llama_cffi probe: the system's words"
    msgs = [
        {"role": "system", "content": system},
        {"role": "user", "content": _PROBE_USER},
        {"role": "assistant", "content": _PROBE_ASSISTANT},
        {"role": "user", "content": _PROBE_NEXT},
    ]
    try:
        apply_native(template, msgs[1:2])
        used = "native" if engine != "jinja" else "jinja"
    except ChatTemplateError:
        if engine == "native":
            raise
        used = "jinja"
    try:
        text = apply_template(template, msgs, True, used, limits, **context)
    except ChatTemplateError as e:
        if "system" not in str(e).lower():
            raise
        text = apply_template(template, msgs[1:], True, used, limits, **context)
    for words in (_PROBE_USER, _PROBE_ASSISTANT, _PROBE_NEXT):
        if words not in text:
            raise ChatTemplateError(f"the chat template drops a message's content ({words!r} is not in its output)")
    without = apply_template(template, msgs, False, used, limits, **context) if system in text else None
    if without is None:
        without = apply_template(template, msgs[1:], False, used, limits, **context)
    gen = text[len(without) :] if text.startswith(without) else ""
    return TemplateReport(
        used, system in text, declares_tools(template), turn_end(template, used, limits, **context), gen
    )
