"""Bounded rendering of untrusted Jinja chat templates.

A model file's chat template is code written by whoever made the file. Jinja's
``ImmutableSandboxedEnvironment`` already refuses attribute escapes (``__class__``,
``__globals__``) and changes to lists and dicts; it does not bound what a template may
*cost*: ``{{ 'a' * 10**10 }}`` builds a 10 GB string, nested loops run for hours. This
module renders in a sandbox that also bounds resources, and turns every failure of a
template into a :class:`~llama_cffi.errors.ChatTemplateError`:

* **size before building**: the operators and calls that multiply sizes are checked
  against the limits *before* they run (``*`` and ``+`` on strings and lists, ``**`` and
  ``*`` on integers, ``%`` and ``str.format`` widths, ``join``, ``replace``, ``center``
  and the other padding methods, ``expandtabs``, the ``center``/``indent``/``format``/
  ``join``/``replace``/``sum``/``tojson``/``wordwrap`` filters);
* **memory**: the sizes of the values those operations build are added up per render
  (``max_memory``), so a loop that keeps building large values stops too;
* **output**: the rendered text is produced in chunks and counted (``max_output``);
* **loops**: ``range`` counts the items it yields across the render (``max_iterations``);
* **recursion**: macro calls nest at most ``max_depth`` deep (and Python's own
  ``RecursionError`` is caught);
* **time**: a watchdog thread (one per process, started on first use, idle otherwise)
  raises an exception *in the rendering thread* when ``max_seconds`` have passed
  (``PyThreadState_SetAsyncExc``): the render stops at its next Python bytecode, on the
  calling thread, and the pending exception is cleared before the call returns, so it
  never escapes into the caller's code. Long single C-level operations cannot be
  interrupted this way; that is what the size checks are for.

Every limit that is hit raises :class:`TemplateLimitError` (a ``ChatTemplateError``)
whose ``limit`` attribute names it. Compiled templates are cached by their text (an LRU
of 64), so rendering the same template again costs only the render.
"""

from __future__ import annotations

import ctypes
import dataclasses
import heapq
import itertools
import json
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from functools import lru_cache
from typing import Any

from ._args import expect, expect_int, expect_mapping, type_error
from .errors import ChatTemplateError, ParamTypeError

__all__ = [
    "TemplateLimitError",
    "TemplateLimits",
    "get_template_limits",
    "render_template",
    "set_template_limits",
]


@dataclasses.dataclass(frozen=True)
class TemplateLimits:
    """Resource limits for rendering one chat template (see the module docstring).

    ``max_output``: characters of output, or None for ``output_headroom`` plus four times
    the size of the messages and context (a template may repeat a message).
    ``max_seconds``: wall-clock seconds for compiling and rendering. ``max_iterations``:
    items yielded by ``range`` over the whole render. ``max_depth``: nesting of macro
    calls. ``max_memory``: bytes built by size-multiplying operations over the whole
    render (strings counted one byte per character, lists eight bytes per item), or None
    for 64 MiB plus sixteen times the size of the messages. ``max_int_bits``: the largest
    integer an arithmetic operation may build. ``max_template``: characters of template
    text."""

    max_output: int | None = None
    output_headroom: int = 1 << 20
    max_seconds: float = 2.0
    max_iterations: int = 1_000_000
    max_depth: int = 64
    max_memory: int | None = None
    max_int_bits: int = 1 << 16
    max_template: int = 1 << 20

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise type_error(f.name, "a positive number or None", v)
            if v <= 0:
                raise ValueError(f"TemplateLimits.{f.name} must be a positive number, not {v!r}")

    def resolved(self, input_size: int) -> TemplateLimits:
        """These limits with the size-dependent defaults filled in for ``input_size``
        characters of messages and context."""
        input_size = expect_int("input_size", input_size)
        return dataclasses.replace(
            self,
            max_output=self.max_output if self.max_output is not None else self.output_headroom + 4 * input_size,
            max_memory=self.max_memory if self.max_memory is not None else (64 << 20) + 16 * input_size,
        )


class TemplateLimitError(ChatTemplateError):
    """A chat template hit a resource limit; ``limit`` names it (``"output"``,
    ``"seconds"``, ``"iterations"``, ``"depth"``, ``"memory"``, ``"size"``,
    ``"int_bits"``, ``"template"``)."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(f"{message} [TemplateLimits: {_FIELD_OF.get(limit, limit)}]")
        self.limit = limit


#: the TemplateLimits field behind each limit name
_FIELD_OF = {
    "output": "max_output",
    "seconds": "max_seconds",
    "iterations": "max_iterations",
    "depth": "max_depth",
    "memory": "max_memory",
    "size": "max_output",
    "int_bits": "max_int_bits",
    "template": "max_template",
}


_limits_lock = threading.Lock()
_default_limits = TemplateLimits()


def get_template_limits() -> TemplateLimits:
    """The process-wide default limits (used when a call passes none)."""
    return _default_limits


def set_template_limits(limits: TemplateLimits | None = None, **changes: Any) -> TemplateLimits:
    """Set the process-wide default limits: a whole :class:`TemplateLimits`, or some
    fields changed (``set_template_limits(max_seconds=5)``). Returns the previous ones."""
    global _default_limits
    if limits is not None:
        expect("limits", limits, TemplateLimits, "a TemplateLimits or None")
    with _limits_lock:
        previous = _default_limits
        new = limits if limits is not None else previous
        _default_limits = dataclasses.replace(new, **changes) if changes else new
        return previous


# ---------------------------------------------------------------------- the watchdog
class _Timeout(BaseException):
    """Raised asynchronously in a rendering thread whose time is up (a BaseException, so
    that ``except Exception`` inside Jinja or a template's filters does not swallow it)."""


_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
_set_async_exc.restype = ctypes.c_int


# the same C function with a pointer argument, to pass NULL (``pythonapi[name]`` is a new
# function object; ``pythonapi.name`` is cached and has the py_object signature above)
_clear_async = ctypes.pythonapi["PyThreadState_SetAsyncExc"]
_clear_async.argtypes = (ctypes.c_ulong, ctypes.c_void_p)
_clear_async.restype = ctypes.c_int


def _clear_async_exc(thread_id: int) -> None:
    """Drop an asynchronous exception still pending for ``thread_id`` (NULL exception)."""
    _clear_async(thread_id, None)


class _Alarm:
    __slots__ = ("active", "deadline", "fired", "thread_id")

    def __init__(self, deadline: float, thread_id: int) -> None:
        self.deadline = deadline
        self.thread_id = thread_id
        self.active = True
        self.fired = False


class _Watchdog:
    """One daemon thread that raises :class:`_Timeout` in threads whose alarm is due."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Alarm]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float) -> _Alarm:
        alarm = _Alarm(time.monotonic() + seconds, threading.get_ident())
        with self._cond:
            heapq.heappush(self._heap, (alarm.deadline, next(self._seq), alarm))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="llama_cffi-template-watchdog", daemon=True)
                self._thread.start()
            self._cond.notify()
        return alarm

    def disarm(self, alarm: _Alarm) -> bool:
        """Stop ``alarm``; True if it fired (any exception it left pending is cleared)."""
        with self._cond:
            alarm.active = False
            fired = alarm.fired
        if fired:
            _clear_async_exc(alarm.thread_id)
        return fired

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and not self._heap[0][2].active:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                _, _, alarm = heapq.heappop(self._heap)
                if alarm.active:
                    alarm.fired = True
                    _set_async_exc(alarm.thread_id, _Timeout)


_watchdog = _Watchdog()


# ---------------------------------------------------------------------- the sandbox
class _Render(threading.local):
    """Per-thread state of the render in progress."""

    limits: TemplateLimits | None = None
    memory: int = 0
    iterations: int = 0
    depth: int = 0


_FORMAT_NUMBER = re.compile(r"\d+")
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_BRACE_SPEC = re.compile(r"\{[^{}]*\}")
_PADDERS = frozenset({"center", "ljust", "rjust", "zfill"})


def _make_environment() -> Any:
    from jinja2.runtime import Macro
    from jinja2.sandbox import MAX_RANGE, ImmutableSandboxedEnvironment

    state = _Render()

    def limits() -> TemplateLimits:
        lim = state.limits
        assert lim is not None  # set by render_template
        return lim

    def build(size: int, what: str, per_item: int = 1) -> None:
        """Account for a value of ``size`` items about to be built."""
        lim = limits()
        cap = lim.max_output
        assert cap is not None and lim.max_memory is not None
        if size > cap:
            raise TemplateLimitError(
                "size", f"the chat template builds a value of {size:,} items with {what} (limit {cap:,})"
            )
        state.memory += size * per_item
        if state.memory > lim.max_memory:
            raise TemplateLimitError(
                "memory",
                f"the chat template built {state.memory:,} bytes with {what} (limit {lim.max_memory:,})",
            )

    def sized(x: object) -> int | None:
        return len(x) if isinstance(x, (str, bytes, list, tuple)) else None

    def per_item(x: object) -> int:
        return 8 if isinstance(x, (list, tuple)) else 1

    def check_int_bits(bits: int, what: str) -> None:
        cap = limits().max_int_bits
        if bits > cap:
            raise TemplateLimitError(
                "int_bits", f"the chat template builds an integer of about {bits:,} bits with {what} (limit {cap:,})"
            )

    def check_width(n: object, what: str) -> None:
        if isinstance(n, int) and not isinstance(n, bool):
            build(max(n, 0), what)

    def check_percent_format(fmt: str, args: object) -> None:
        for m in _PERCENT_SPEC.finditer(fmt):
            for g in m.groups():
                if g and g != "*":
                    check_width(int(g), "a %-format width")
        if "*" in fmt:
            for a in args if isinstance(args, tuple) else (args,):
                check_width(a, "a %-format width")

    def check_brace_format(fmt: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        for field in _BRACE_SPEC.findall(fmt):
            spec = field.partition(":")[2]
            for num in _FORMAT_NUMBER.findall(spec):
                check_width(int(num), "a format width")
        if "{" in fmt.replace("{{", ""):
            for a in (*args, *kwargs.values()):
                if isinstance(a, int) and not isinstance(a, bool) and a > 1000:
                    check_width(a, "a format width")

    def check_mul(left: object, right: object) -> None:
        for a, b in ((left, right), (right, left)):
            n = sized(a)
            if n is not None and isinstance(b, int):
                build(n * max(b, 0), "*", per_item(a))
                return
        if isinstance(left, int) and isinstance(right, int):
            check_int_bits(left.bit_length() + right.bit_length(), "*")

    def check_pow(base: object, exp: object) -> None:
        if isinstance(base, int) and isinstance(exp, int) and exp > 0 and abs(base) > 1:
            check_int_bits(exp * base.bit_length(), "**")

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+", "%"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "*":
                check_mul(left, right)
            elif operator == "**":
                check_pow(left, right)
            elif operator == "+":
                a, b = sized(left), sized(right)
                if a is not None and b is not None:
                    build(a + b, "+", per_item(left))
                elif isinstance(left, int) and isinstance(right, int):
                    check_int_bits(max(left.bit_length(), right.bit_length()) + 1, "+")
            elif operator == "%" and isinstance(left, str):
                check_percent_format(left, right)
            return self.binop_table[operator](left, right)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            owner = getattr(__obj, "__self__", None)
            name = getattr(__obj, "__name__", "")
            if isinstance(owner, str):
                if name in _PADDERS and args:
                    check_width(args[0], f"str.{name}")
                elif name == "expandtabs":
                    tab = args[0] if args else kwargs.get("tabsize", 8)
                    if isinstance(tab, int):
                        build(len(owner) * max(tab, 1), "str.expandtabs")
                elif name == "replace" and len(args) >= 2:
                    old, new = args[0], args[1]
                    if isinstance(old, str) and isinstance(new, str):
                        count = (len(owner) + 1) if old == "" else owner.count(old)
                        if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0:
                            count = min(count, args[2])
                        build(len(owner) + count * max(len(new) - len(old), 0), "str.replace")
                elif name == "join" and args:
                    items = list(args[0]) if not isinstance(args[0], (list, tuple)) else args[0]
                    total = len(owner) * max(len(items) - 1, 0)
                    total += sum(len(x) for x in items if isinstance(x, str))
                    build(total, "str.join")
                    args = (items, *args[1:])
            wrapped = getattr(__obj, "__wrapped__", None)  # str.format / format_map (sandbox wrappers)
            fmt = getattr(wrapped, "__self__", None)
            if isinstance(fmt, str) and name in ("format", "format_map"):
                fmt_kwargs = kwargs if name == "format" else (args[0] if args and isinstance(args[0], Mapping) else {})
                check_brace_format(fmt, args if name == "format" else (), fmt_kwargs)
            if isinstance(__obj, Macro):
                lim = limits()
                if state.depth >= lim.max_depth:
                    raise TemplateLimitError(
                        "depth", f"the chat template nests macro calls deeper than {lim.max_depth}"
                    )
                state.depth += 1
                try:
                    return super().call(__context, __obj, *args, **kwargs)
                finally:
                    state.depth -= 1
            return super().call(__context, __obj, *args, **kwargs)

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True)

    class CountedRange:
        """``range`` that counts the items it yields against ``max_iterations``."""

        __slots__ = ("_r",)

        def __init__(self, r: range) -> None:
            self._r = r

        def __iter__(self) -> Iterator[int]:
            lim = limits().max_iterations
            for i in self._r:
                state.iterations += 1
                if state.iterations > lim:
                    raise TemplateLimitError(
                        "iterations", f"the chat template's loops ran more than {lim:,} range items"
                    )
                yield i

        def __reversed__(self) -> Iterator[int]:
            return iter(CountedRange(self._r[::-1]))

        def __len__(self) -> int:
            return len(self._r)

        def __getitem__(self, i: Any) -> Any:
            got = self._r[i]
            return CountedRange(got) if isinstance(got, range) else got

        def __contains__(self, x: object) -> bool:
            return x in self._r

        def __repr__(self) -> str:
            return repr(self._r)

    def bounded_range(*args: int) -> CountedRange:
        r = range(*args)
        cap = min(MAX_RANGE, limits().max_iterations)
        if len(r) > cap:
            raise TemplateLimitError(
                "iterations", f"the chat template asks for a range of {len(r):,} items (limit {cap:,})"
            )
        return CountedRange(r)

    env.globals["range"] = bounded_range

    def raise_exception(message: str) -> None:
        raise ChatTemplateError(f"the chat template raised: {message}")

    env.globals["raise_exception"] = raise_exception

    def strftime_now(fmt: str) -> str:
        # The local time now, as llama.cpp's engine (common/jinja/value.cpp) and transformers
        # give templates (Llama 3.2's and Mistral's write today's date). llama.cpp formats
        # into 100 bytes and raises when the result does not fit or is empty: so do we.
        if not isinstance(fmt, str) or len(fmt) > 1000:
            raise ChatTemplateError("strftime_now: the format must be a string of at most 1000 characters")
        out = time.strftime(fmt)
        if not out or len(out.encode()) >= 100:
            raise ChatTemplateError(f"strftime_now: failed to format time with {fmt[:40]!r}")
        return out

    env.globals["strftime_now"] = strftime_now

    filters = env.filters

    def wrap(name: str, check: Callable[..., None]) -> None:
        inner = filters[name]

        def f(*args: Any, **kwargs: Any) -> Any:
            check(*args, **kwargs)
            return inner(*args, **kwargs)

        for attr in ("jinja_pass_arg",):  # keep the context/environment passing flags
            if hasattr(inner, attr):
                setattr(f, attr, getattr(inner, attr))
        filters[name] = f

    def _center(value: Any, width: Any = 80) -> None:
        check_width(width, "the center filter")

    def _indent(value: Any, width: Any = 4, *a: Any, **k: Any) -> None:
        if isinstance(width, int) and not isinstance(width, bool):
            lines = str(value).count("\n") + 1
            build(len(str(value)) + lines * max(width, 0), "the indent filter")
        elif isinstance(width, str):
            lines = str(value).count("\n") + 1
            build(len(str(value)) + lines * len(width), "the indent filter")

    def _format(value: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(value, str):
            check_percent_format(value, args or kwargs)

    def _join(*args: Any, **kwargs: Any) -> None:
        # (eval_ctx, value, d="", attribute=None)
        value = args[1] if len(args) > 1 else kwargs.get("value")
        sep = args[2] if len(args) > 2 else kwargs.get("d", "")
        if isinstance(value, (list, tuple, CountedRange, range)):
            n = len(value)
            total = len(sep) * max(n - 1, 0) if isinstance(sep, str) else 0
            total += sum(len(x) for x in value if isinstance(x, str))
            build(total, "the join filter")

    def _replace(*args: Any, **kwargs: Any) -> None:
        # (eval_ctx, s, old, new, count=None)
        if len(args) >= 4 and all(isinstance(x, str) for x in args[1:4]):
            s, old, new = args[1], args[2], args[3]
            count = (len(s) + 1) if old == "" else s.count(old)
            build(len(s) + count * max(len(new) - len(old), 0), "the replace filter")

    def _sum(*args: Any, **kwargs: Any) -> None:
        # (environment, iterable, attribute=None, start=0)
        start = args[3] if len(args) > 3 else kwargs.get("start", 0)
        it = args[1] if len(args) > 1 else kwargs.get("iterable")
        if sized(start) is not None and isinstance(it, (list, tuple)):
            build(sized(start) + sum(sized(x) or 0 for x in it), "the sum filter", per_item(start))  # type: ignore[operator]

    def _tojson(*args: Any, **kwargs: Any) -> None:
        indent = args[2] if len(args) > 2 else kwargs.get("indent")
        if isinstance(indent, int):
            check_width(indent * 64, "the tojson filter's indent")
        elif isinstance(indent, str):
            check_width(len(indent) * 64, "the tojson filter's indent")

    def _wordwrap(*args: Any, **kwargs: Any) -> None:
        # (environment, s, width=79, break_long_words=True, wrapstring=None, ...)
        s = args[1] if len(args) > 1 else ""
        wrapstring = args[4] if len(args) > 4 else kwargs.get("wrapstring")
        if isinstance(wrapstring, str) and isinstance(s, str):
            build(len(s) * (1 + len(wrapstring)), "the wordwrap filter")

    from jinja2 import pass_eval_context

    @pass_eval_context
    def tojson(
        eval_ctx: Any, value: Any, indent: Any = None, separators: Any = None, sort_keys: bool = False,
        ensure_ascii: bool = False,
    ) -> str:  # fmt: skip
        # as Hugging Face's and llama.cpp's template engines write JSON: keys in their order,
        # no HTML escaping, non-ASCII kept (Jinja2's own filter sorts keys and escapes <>&')
        return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii)

    filters["tojson"] = tojson

    # No HTML escaping, as in llama.cpp's engine (common/jinja/value.cpp), which has no
    # Markup type and no autoescaping: its ``safe`` returns a string as it is (other values
    # as their text). Jinja2's ``safe`` returns markupsafe's Markup instead, and Markup
    # escapes whatever is added to it: ``"... "|safe + description + tojson`` wrote the
    # description's ``<&'`` and the JSON's quotes as HTML entities (Functionary v3.1's tool
    # list). So no filter hands a template a Markup: ``safe`` gives plain text, and
    # ``escape``/``e``/``forceescape`` (which llama.cpp does not have) the escaped text as
    # plain text, so that it does not escape what is added to it either.
    from markupsafe import escape as _html_escape

    def safe(value: Any) -> str:
        return str(value)  # a plain str (str() of a str subclass such as Markup is one too)

    def escape(value: Any) -> str:
        return str(_html_escape(value))

    filters["safe"] = safe
    filters["escape"] = filters["e"] = filters["forceescape"] = escape

    to_string = filters["string"]

    def string(value: Any) -> Any:
        # Reads a container's items through items() (as tojson's json.dumps does) before
        # writing it: llama.cpp counts every value inside as read by the template (its
        # capability probe, common/jinja/caps.cpp; the chat module's probe records reads
        # this way), while str() of a dict reads them without calling anything
        todo, seen = [value], set()
        while todo:
            v = todo.pop()
            if isinstance(v, (Mapping, list, tuple)):
                if id(v) in seen:
                    continue  # a container that holds itself
                seen.add(id(v))
            if isinstance(v, Mapping):
                todo.extend(x for kv in v.items() for x in kv)
            elif isinstance(v, (list, tuple)):
                todo.extend(v)
        return to_string(value)

    filters["string"] = string

    for name, check in (
        ("center", _center),
        ("indent", _indent),
        ("format", _format),
        ("join", _join),
        ("replace", _replace),
        ("sum", _sum),
        ("tojson", _tojson),
        ("wordwrap", _wordwrap),
    ):
        wrap(name, check)
    return env, state


_env_lock = threading.Lock()
_env: Any = None
_state: _Render | None = None


def _environment() -> tuple[Any, _Render]:
    global _env, _state
    with _env_lock:
        if _env is None:
            _env, _state = _make_environment()
        assert _state is not None
        return _env, _state


@lru_cache(maxsize=64)
def _compile(text: str) -> Any:
    env, _ = _environment()
    return env.from_string(text)


def _size_of(value: object) -> int:
    """Characters in the strings of ``value`` (messages and context), roughly."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        # dict.items for dicts: counting must not run a dict subclass's own items() (the
        # chat module's probes record which values a template reads)
        items = dict.items(value) if isinstance(value, dict) else value.items()
        return sum(_size_of(k) + _size_of(v) for k, v in items)
    if isinstance(value, (list, tuple)):
        return sum(_size_of(v) for v in value)
    return 8


def render_template(template: str, context: Mapping[str, Any], limits: TemplateLimits | None = None) -> str:
    """Render Jinja ``template`` with ``context`` in the bounded sandbox.

    Raises :class:`TemplateLimitError` when a limit is hit and :class:`ChatTemplateError`
    for any other failure of the template (syntax, sandbox refusals, undefined names,
    errors in the template's own operations); arguments of the wrong type are a
    :class:`~llama_cffi.errors.ParamTypeError`."""
    try:
        from jinja2 import TemplateError  # noqa: F401 - is Jinja2 there?
    except ImportError:
        raise ChatTemplateError("this chat template needs Jinja2: pip install 'llama-cffi[jinja]'") from None
    if not isinstance(template, str):
        raise ParamTypeError(f"template (the chat template) must be a str, not {type(template).__name__}")
    expect_mapping("context", context, "a mapping of template variables")
    if limits is not None:
        expect("limits", limits, TemplateLimits, "a TemplateLimits or None")
    lim = (limits if limits is not None else _default_limits).resolved(_size_of(context))
    if len(template) > lim.max_template:
        raise TemplateLimitError(
            "template", f"the chat template is {len(template):,} characters long (limit {lim.max_template:,})"
        )
    _, state = _environment()
    try:
        return _render_bounded(template, context, lim, state)
    except _Timeout:
        raise TemplateLimitError("seconds", f"the chat template ran longer than {lim.max_seconds:g} s") from None


def _render_bounded(template: str, context: Mapping[str, Any], lim: TemplateLimits, state: _Render) -> str:
    state.limits, state.memory, state.iterations, state.depth = lim, 0, 0, 0
    cap = lim.max_output
    assert cap is not None
    alarm = _watchdog.arm(lim.max_seconds)
    try:
        try:
            compiled = _compile(template)
            parts: list[str] = []
            total = 0
            for chunk in compiled.generate(**context):
                total += len(chunk)
                if total > cap:
                    raise TemplateLimitError("output", f"the chat template's output passed {cap:,} characters")
                parts.append(chunk)
            return "".join(parts)
        finally:
            state.limits = None
            _watchdog.disarm(alarm)
    except _Timeout:
        raise
    except ChatTemplateError:
        if alarm.fired:
            raise _Timeout from None
        raise
    except MemoryError:
        raise TemplateLimitError("memory", "the chat template ran out of memory") from None
    except RecursionError:
        raise TemplateLimitError("depth", "the chat template recursed too deeply (Python's recursion limit)") from None
    except Exception as exc:
        if alarm.fired:
            raise _Timeout from None
        raise ChatTemplateError(f"the chat template failed to render: {type(exc).__name__}: {exc}") from exc
