"""Sphinx extension: resolve our docstrings' short cross-references, skip re-exports.

Docstrings in ``llama_cffi`` and ``samplers`` are reStructuredText and refer to objects the
way their module sees them (``:class:`ParamError``` in a module that imported it,
``:meth:`Branch.sample``` from a sibling module, ``llama_cffi.Model`` for what the package
re-exports). Sphinx only finds targets by their documented dotted name, so this resolves
a missing ``py`` reference by importing what the name means from the referring module and
finding where that same Python object is documented; failing that, by a unique documented
object with that last name. A reference that resolves neither way stays missing, and with
``nitpicky`` and ``-W`` the build fails: a renamed function breaks the docs build.

Leaf modules document their ``__all__``; a name re-exported from another *public* module is
skipped there (it is documented once, where it is defined), so no object is described twice.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from typing import Any

from docutils import nodes
from sphinx.addnodes import pending_xref
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util.nodes import make_refnode

PACKAGES = ("llama_cffi", "samplers")

_current_module: list[str] = [""]


def _public_module(name: str) -> bool:
    parts = name.split(".")
    return parts[0] in PACKAGES and not any(p.startswith("_") for p in parts)


def _lookup(path: str) -> Any:
    """The object a dotted path names (importing its longest module prefix), or None."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        modname = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(modname)
        except Exception:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except (AttributeError, ImportError):  # a lazy attribute whose optional import is missing
            return None
        return obj
    return None


def _identity(obj: Any) -> int | None:
    obj = getattr(obj, "__func__", obj)  # bound and class methods: the function itself
    if inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isroutine(obj):
        return id(obj)
    if isinstance(obj, (property, classmethod, staticmethod)):
        return id(obj)
    return None


def _documented_by_identity(env: BuildEnvironment) -> dict[int, str]:
    cache: dict[int, str] | None = getattr(env, "_llama_cffi_by_id", None)
    if cache is not None:
        return cache
    cache = {}
    domain = env.get_domain("py")
    for name, _dispname, _typ, _doc, _anchor, _prio in sorted(domain.get_objects(), key=lambda o: len(o[0])):
        obj = _lookup(name)
        if obj is None and "." in name:  # attributes and properties: look them up on the class
            owner = _lookup(name.rsplit(".", 1)[0])
            obj = inspect.getattr_static(owner, name.rsplit(".", 1)[1], None) if owner is not None else None
        key = _identity(obj)
        if key is not None:
            cache.setdefault(key, name)
    env._llama_cffi_by_id = cache  # type: ignore[attr-defined]
    return cache


def _candidates(target: str, node: pending_xref) -> list[str]:
    module = node.get("py:module") or ""
    cls = node.get("py:class") or ""
    out = []
    if module and cls:
        out.append(f"{module}.{cls}.{target}")
    if module:
        out.append(f"{module}.{target}")
        # a sibling module's name (``Branch.sample`` from samplers.search)
        pkg = module.rsplit(".", 1)[0]
        out.append(f"{pkg}.{target}")
    out.append(target)
    return out


def missing_reference(app: Sphinx, env: BuildEnvironment, node: pending_xref, contnode: nodes.Element):
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip("~.")
    domain = env.get_domain("py")
    objects = domain.objects  # type: ignore[attr-defined]
    by_id = _documented_by_identity(env)
    for candidate in _candidates(target, node):
        obj = _lookup(candidate)
        if obj is None and "." in candidate:
            owner = _lookup(candidate.rsplit(".", 1)[0])
            if owner is not None and inspect.isclass(owner):
                obj = inspect.getattr_static(owner, candidate.rsplit(".", 1)[1], None)
        key = _identity(obj)
        if key is not None and key in by_id:
            return _refnode(app, env, node, contnode, by_id[key], objects)
        if candidate in objects:
            return _refnode(app, env, node, contnode, candidate, objects)
    # a unique documented object with that last name (module constants, attributes)
    suffix = "." + target
    matches = [n for n in objects if n.endswith(suffix) and _public_module(n.split(".")[0])]
    if len(matches) == 1:
        return _refnode(app, env, node, contnode, matches[0], objects)
    return None


def _refnode(app: Sphinx, env: BuildEnvironment, node: pending_xref, contnode: nodes.Element, name: str, objects: Any):
    entry = objects[name]
    return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, name)


_GOOGLE_SECTION = re.compile(r"^\s*(Args|Arguments|Returns|Raises|Yields):\s*$")


def process_docstring(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    # the few Google-style docstrings (``Args:`` sections: the tiny-model writers) go through
    # napoleon; the others are plain reST, which napoleon would misread (a property's
    # "text (nats): more" as a type)
    if any(_GOOGLE_SECTION.match(line) for line in lines):
        from sphinx.ext.napoleon import Config
        from sphinx.ext.napoleon.docstring import GoogleDocstring

        config = Config(napoleon_use_param=True, napoleon_use_rtype=True)
        lines[:] = str(GoogleDocstring(lines, config, app, what, name, obj, options)).splitlines()
    if what == "module":
        _current_module[0] = name
    # a constant's value is a str or an int: its "docstring" is the builtin type's, not ours
    builtin_doc = type(obj).__doc__ if type(obj).__module__ == "builtins" else None
    first = next((line.strip() for line in lines if line.strip()), "")
    if what in ("data", "attribute") and builtin_doc and first and first == builtin_doc.strip().splitlines()[0].strip():
        lines.clear()


def skip_member(app: Sphinx, what: str, name: str, obj: Any, skip: bool, options: Any) -> bool | None:
    """Skip a re-export of another public module in a leaf module's page."""
    current = _current_module[0]
    if what != "module" or not current:
        return None
    home = getattr(obj, "__module__", None)
    if isinstance(home, str) and home != current and _public_module(home):
        return True
    return None


def setup(app: Sphinx) -> dict[str, Any]:
    # GBNF has no Pygments lexer: its blocks are shown as text (tests parse them as grammars)
    from pygments.lexers.special import TextLexer

    app.add_lexer("gbnf", TextLexer)
    app.connect("missing-reference", missing_reference)
    app.connect("autodoc-process-docstring", process_docstring)
    app.connect("autodoc-skip-member", skip_member)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 3000))
    return {"parallel_read_safe": False, "parallel_write_safe": True}
