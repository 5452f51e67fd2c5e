"""The official JSON-Schema-Test-Suite, from the copy in the ``jsonschema`` 4.26.0 sdist on
PyPI (downloaded once into the user cache, sha256-checked), and its scoring of a
schema-to-grammar converter.

:func:`suite_dir` returns the unpacked ``json/`` folder (``tests/<draft>/*.json`` and
``remotes/``); :func:`groups` lists a draft's groups (one schema, several instances
with the expected verdict); :func:`remote_registry` is a ``referencing.Registry`` of the
suite's remote documents under ``http://localhost:1234/``, as the suite's README asks
a harness to serve them.

Scoring (:func:`score_group`): each instance is serialised by ``json.dumps`` twice,
compact (``separators=(",", ":")``) and with the default separators; an instance is
"accepted" when the grammar accepts both texts and "rejected" when it accepts neither
(a mixed verdict is wrong either way). A schema that does not compile counts every
instance of its group wrong.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VERSION = "4.26.0"
SDIST = f"jsonschema-{VERSION}.tar.gz"
URL = (
    "https://files.pythonhosted.org/packages/b3/fc/"
    f"e067678238fa451312d4c62bf6e6cf5ec56375422aee02f9cb5f909b3047/{SDIST}"
)
SHA256 = "0c26707e2efad8aa1bfc5b7ce170f3fccc2e4918ff85989ba9ffa9facb2be326"
REMOTE_BASE = "http://localhost:1234/"
#: draft folder -> its ``$schema`` URI (a suite schema without ``$schema`` is in its folder's draft)
DRAFTS = {
    "draft2020-12": "https://json-schema.org/draft/2020-12/schema",
    "draft2019-09": "https://json-schema.org/draft/2019-09/schema",
    "draft7": "http://json-schema.org/draft-07/schema#",
    "draft6": "http://json-schema.org/draft-06/schema#",
    "draft4": "http://json-schema.org/draft-04/schema#",
}


def cache_root() -> Path:
    """``$LLAMA_CFFI_CACHE_DIR`` or ``~/.cache/llama_cffi`` (the model's cache)."""
    from llama_cffi.default_model import cache_dir

    return cache_dir()


def suite_dir() -> Path:
    """The suite's ``json/`` folder, downloading and unpacking the sdist on first use
    (``urllib``; ``$JSON_SCHEMA_SUITE_SDIST`` may name a local copy of the tarball).
    A tarball whose sha256 differs is an error, never used."""
    target = cache_root() / f"json-schema-test-suite-{VERSION}"
    if (target / "json" / "tests").is_dir():
        return target / "json"
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        tar = Path(tmp) / SDIST
        local = os.environ.get("JSON_SCHEMA_SUITE_SDIST")
        if local:
            shutil.copyfile(local, tar)
        else:
            with urllib.request.urlopen(URL, timeout=60) as r, open(tar, "wb") as fh:
                shutil.copyfileobj(r, fh)
        digest = hashlib.sha256(tar.read_bytes()).hexdigest()
        if digest != SHA256:
            raise RuntimeError(f"{SDIST} has sha256 {digest}, expected {SHA256}")
        out = Path(tmp) / "out"
        with tarfile.open(tar) as tf:
            members = [m for m in tf.getmembers() if m.name.startswith(f"jsonschema-{VERSION}/json/")]
            try:
                tf.extractall(out, members=members, filter="data")
            except TypeError:  # a Python without extraction filters (before 3.10.12): the members are checked above
                tf.extractall(out, members=members)
        (out / f"jsonschema-{VERSION}").rename(Path(tmp) / "suite")
        try:
            (Path(tmp) / "suite").rename(target)
        except OSError:
            if not (target / "json" / "tests").is_dir():  # another process won the race
                raise
    return target / "json"


@dataclass
class Group:
    """One test group: a schema and its instances (``(description, data, valid)``)."""

    draft: str
    file: str
    description: str
    schema: Any
    tests: list[tuple[str, Any, bool]]

    @property
    def name(self) -> str:
        return f"{self.draft}/{self.file}: {self.description}"

    @property
    def remote(self) -> bool:
        """Whether the schema reaches a document of the suite's remotes."""
        return REMOTE_BASE in json.dumps(self.schema)


def groups(draft: str = "draft2020-12") -> list[Group]:
    """Every group of ``tests/<draft>/*.json`` (the main folder: ``optional/`` excluded)."""
    root = suite_dir() / "tests" / draft
    out = []
    for path in sorted(root.glob("*.json")):
        for g in json.loads(path.read_text(encoding="utf-8")):
            tests = [(t["description"], t["data"], bool(t["valid"])) for t in g["tests"]]
            out.append(Group(draft, path.stem, g["description"], g["schema"], tests))
    return out


def remote_documents() -> dict[str, Any]:
    """The suite's remote documents: URI (under ``http://localhost:1234/``) -> JSON."""
    root = suite_dir() / "remotes"
    return {
        REMOTE_BASE + p.relative_to(root).as_posix(): json.loads(p.read_text(encoding="utf-8"))
        for p in sorted(root.rglob("*.json"))
    }


def remote_registry(draft: str) -> Any:
    """A ``referencing.Registry`` of the remotes: those in a draft's folder in that draft,
    the others in ``draft``, unless a document's ``$schema`` says otherwise."""
    from referencing import Registry, Resource
    from referencing.jsonschema import specification_with

    def spec(uri: str) -> Any:
        folder = uri[len(REMOTE_BASE) :].split("/", 1)[0]
        return specification_with(DRAFTS.get(folder, DRAFTS[draft]))

    def ours(uri: str) -> bool:
        folder = uri[len(REMOTE_BASE) :].split("/", 1)[0]
        return folder == draft or not folder.startswith("draft") or "/" not in uri[len(REMOTE_BASE) :]

    def well_formed(resource: Any) -> bool:
        # a document of a later draft (boolean subschemas) is not a resource of draft 4:
        # referencing would fail on it when it crawls the registry for an anchor
        try:
            stack = [resource]
            while stack:
                r = stack.pop()
                r.id()
                stack.extend(r.subresources())
        except (TypeError, AttributeError):
            return False
        return True

    resources = [
        (uri, Resource.from_contents(doc, default_specification=spec(uri)))
        for uri, doc in remote_documents().items()
        if ours(uri)
    ]
    return Registry().with_resources((u, r) for u, r in resources if well_formed(r))


def serialisations(data: Any) -> tuple[str, str]:
    """The two texts an instance is checked as: compact, and ``json.dumps``'s default."""
    return json.dumps(data, separators=(",", ":")), json.dumps(data)


@dataclass
class GroupScore:
    """How a converter did on one group."""

    group: Group
    compiled: bool
    error: str = ""
    #: per instance: "accepted", "rejected" or "mixed"
    verdicts: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    compile_s: float = 0.0

    def right(self) -> list[bool]:
        if not self.compiled:
            return [False] * len(self.group.tests)
        return [
            (v == "accepted") if valid else (v == "rejected")
            for v, (_, _, valid) in zip(self.verdicts, self.group.tests, strict=True)
        ]


def score_group(group: Group, compile_fn: Callable[[Group], Callable[[str], bool]]) -> GroupScore:
    """Compile ``group``'s schema with ``compile_fn`` (returning an ``accepts(text)``
    function; any exception is "did not compile") and judge every instance."""
    import time
    import warnings

    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            accepts = compile_fn(group)
        except Exception as e:
            return GroupScore(group, False, f"{type(e).__name__}: {e}"[:300], compile_s=time.perf_counter() - t0)
    dt = time.perf_counter() - t0
    score = GroupScore(group, True, warnings=[str(w.message) for w in caught], compile_s=dt)
    for _, data, _ in group.tests:
        got = [accepts(text) for text in serialisations(data)]
        score.verdicts.append("accepted" if all(got) else "rejected" if not any(got) else "mixed")
    return score


@dataclass
class Totals:
    """A table row: counts with their denominators."""

    groups: int = 0
    compiled: int = 0
    valid: int = 0
    valid_accepted: int = 0
    invalid: int = 0
    invalid_compiled: int = 0
    invalid_rejected: int = 0
    right: int = 0
    instances: int = 0

    def add(self, s: GroupScore) -> None:
        self.groups += 1
        self.compiled += s.compiled
        for ok, (_, _, valid) in zip(s.right(), s.group.tests, strict=True):
            self.instances += 1
            self.right += ok
            if valid:
                self.valid += 1
                self.valid_accepted += ok
            else:
                self.invalid += 1
                self.invalid_compiled += s.compiled
                self.invalid_rejected += ok

    def row(self) -> dict[str, str]:
        def pc(a: int, b: int) -> str:
            return f"{100 * a / b:.1f}% ({a}/{b})" if b else "-"

        return {
            "groups compiled": pc(self.compiled, self.groups),
            "valid accepted (of all)": pc(self.valid_accepted, self.valid),
            "invalid rejected (of compiled)": pc(self.invalid_rejected, self.invalid_compiled),
            "instances right (of all)": pc(self.right, self.instances),
        }


def iter_scores(
    draft: str, compile_fn: Callable[[Group], Callable[[str], bool]], *, remote: bool = True
) -> Iterator[GroupScore]:
    """Score every group of ``draft`` (``remote=False``: leave out the groups that reach
    the suite's remote documents)."""
    for g in groups(draft):
        if remote or not g.remote:
            yield score_group(g, compile_fn)
