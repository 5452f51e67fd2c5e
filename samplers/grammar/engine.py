"""The pushdown matcher of llama.cpp's grammars, as a lazily built automaton over stack sets.

llama.cpp (``src/llama-grammar.cpp``) keeps a *set of stacks*; each stack is a list of
element positions, its top always at a terminal (a character class or a token
element). Accepting a code point maps every stack to the stacks it can continue as
(``llama_grammar_accept_chr`` then ``llama_grammar_advance_stack``). This module runs
the same algorithm with two changes that do not change the result:

* A stack set is interned once and named by an integer **state**; the successor of a
  state on a code point is computed once and remembered in a dense transition table
  (numpy), so the walk over a token is table lookups after the first time.
* Code points are first mapped to **character classes**: two code points that every
  character element of the grammar treats the same (``[a-z]``, ``[^"\\\\]``, ``"t"``, ...)
  have the same successor everywhere, so transitions are per class (a JSON grammar has
  a few dozen classes instead of 1.1 million code points).

The engine is vocabulary-free; :mod:`samplers.grammar.compiled` builds token masks on it.
States and transitions are added while matching, under a lock (several threads may
share an engine; reads of known transitions take no lock).

Two cores do the stack work: ``"c"`` (``llama_cffi/_native/grammar_engine.c``: stacks
interned as cells, states as sorted cell sets, rows computed per group of classes; the
default) and ``"python"`` (the code in this module, the reference the C core is tested
against state for state). Grammars with token elements always take the Python core.
Both keep a **budget**: a state of more than ``max_stacks`` stacks raises
:class:`~samplers.grammar.errors.GrammarBudgetError` (an ambiguous grammar can multiply
its stacks with every character; llama.cpp's matcher, which has no such bound, then
takes unbounded time and memory), leaving the engine as it was.
"""

from __future__ import annotations

import _thread
import functools
import itertools
import os
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from llama_cffi._args import expect, expect_array, expect_int, expect_iterable, expect_str, type_error
from llama_cffi.errors import ParamTypeError
from llama_cffi.gbnf import GrammarError, GreType, ParsedGrammar, _element_arrays

from .errors import GrammarBudgetError

Stack = tuple[int, ...]
#: A partial UTF-8 sequence carried between tokens: ``(value so far, bytes still needed)``;
#: ``n_remain == -1`` marks an invalid sequence (llama.cpp's ``llama_partial_utf8``).
Partial = tuple[int, int]
NO_PARTIAL: Partial = (0, 0)

DEAD = -1  # the empty stack set: nothing can follow
_UNKNOWN = -2  # a transition not computed yet
_NEW_STATES = -16  # (LLAMA_CFFI_GENGINE_NEW_STATES: llama_cffi_gengine_sync_known found new states)

_END, _ALT, _RULE_REF = int(GreType.END), int(GreType.ALT), int(GreType.RULE_REF)
_CHAR, _CHAR_NOT, _RNG, _CHAR_ALT, _ANY = (
    int(GreType.CHAR),
    int(GreType.CHAR_NOT),
    int(GreType.CHAR_RNG_UPPER),
    int(GreType.CHAR_ALT),
    int(GreType.CHAR_ANY),
)
_TOKEN, _TOKEN_NOT = int(GreType.TOKEN), int(GreType.TOKEN_NOT)
_MAX_CP = 1 << 22  # llama.cpp's decoder can produce values up to 0x3FFFFF
_ROW_MIN = 4  # a state needing this many unknown classes at once gets its whole row computed

#: the engine cores: ``"c"`` (``llama_cffi/_native/grammar_engine.c``) and ``"python"``
#: (this module's code, the reference)
CORES = ("c", "python")
#: default budget: the most stacks one parser state may have (one advance of a stack may
#: visit at most ``max_stacks +`` the grammar's element count stacks)
MAX_STACKS = 65536
#: default budget: the most distinct stacks (C cells), and states, an engine keeps in all
#: (C core; its memory bound), and a sixteenth of the most transition-table entries (states
#: x classes; both cores)
MAX_CELLS = 1 << 22
#: the most cells of the table of character sets x classes (:meth:`Engine._build_classes`):
#: 64 MiB; literal characters take no cells
MAX_CLASS_CELLS = 1 << 26


def default_core() -> str:
    """The environment variable ``LLAMA_CFFI_GRAMMAR_CORE`` when set (``c`` or ``python``),
    else ``"python"`` when ``LLAMA_CFFI_GRAMMAR_KERNEL`` says ``numpy`` (the reference walk
    takes the reference engine), else ``"c"``."""
    core = os.environ.get("LLAMA_CFFI_GRAMMAR_CORE", "").strip().lower()
    if core:
        if core not in CORES:
            raise ValueError(f"LLAMA_CFFI_GRAMMAR_CORE must be one of {CORES}, not {core!r}")
        return core
    want = os.environ.get("LLAMA_CFFI_GRAMMAR_KERNEL", "c").strip().lower() or "c"
    return "python" if want == "numpy" else "c"


def _budget_error(what: str, max_stacks: int) -> GrammarBudgetError:
    return GrammarBudgetError(
        f"{what}: a parser state of more than {max_stacks} stacks (an ambiguous grammar whose stacks multiply "
        "with every character); make the grammar less ambiguous or raise max_stacks"
    )


def _bad_partial(partial: object) -> ParamTypeError:
    """The TypeError for a ``partial`` that is no ``(value, remaining)`` pair."""
    return type_error("partial", "a (value, remaining) tuple of two ints (a partial UTF-8 character)", partial)


def decode_utf8(data: bytes, partial: Partial = NO_PARTIAL) -> tuple[list[int], Partial]:
    """llama.cpp's ``decode_utf8(std::string, llama_partial_utf8)`` exactly, quirks included:
    decoding stops at the first NUL byte; continuation bytes inside a sequence are not
    validated; an invalid lead byte (or a non-continuation byte where ``partial`` needed
    one) yields ``([], (0, -1))``. Returns the complete code points and the partial
    sequence left at the end."""
    if not isinstance(data, (bytes, bytearray)):
        raise type_error("data", "bytes", data)
    if type(partial) is not tuple or len(partial) != 2:
        raise _bad_partial(partial)
    nul = data.find(0)
    if nul >= 0:
        data = data[:nul]
    value, n_remain = partial
    pos = 0
    n = len(data)
    cps: list[int] = []
    while pos < n and n_remain > 0:
        b = data[pos]
        if b >> 6 != 2:
            return [], (0, -1)
        value = (value << 6) + (b & 0x3F)
        pos += 1
        n_remain -= 1
    if partial[1] > 0 and n_remain == 0:
        cps.append(value)
    if pos == 0 and partial[1] <= 0:
        try:  # fast path: well-formed UTF-8 decodes the same either way
            return cps + [ord(c) for c in data.decode("utf-8")], NO_PARTIAL
        except UnicodeDecodeError:
            pass
    while pos < n:
        b = data[pos]
        hb = b >> 4
        n_remain = (0, 0, 0, 0, 0, 0, 0, 0, -1, -1, -1, -1, 1, 1, 2, 3)[hb]
        if n_remain < 0:
            return [], (0, -1)
        value = b & ((1 << (7 - n_remain)) - 1)
        pos += 1
        while pos < n and n_remain > 0:
            value = (value << 6) + (data[pos] & 0x3F)
            pos += 1
            n_remain -= 1
        if n_remain == 0:
            cps.append(value)
    return cps, (value, n_remain) if n_remain > 0 else NO_PARTIAL


#: transition tables of at least this many bytes are made ready ahead of their use (see
#: Engine._trans_prepare); smaller ones grow at once (cheap)
_PREPARE_FROM = 1 << 20

#: how many times this process's line has forked (a thread that makes a table ready, see
#: Engine._trans_prepare, is not in a child: the child does not wait for it)
_forks = [0]
_start_thread = _thread.start_new_thread  # (tests replace it)


def _forked() -> None:
    """In a child process after a fork (``os.register_at_fork``)."""
    _forks[0] += 1


os.register_at_fork(after_in_child=_forked)


class Engine:
    """States, classes and transitions for one grammar and start rule (see the module
    docstring). Made by :class:`samplers.grammar.Grammar`; shared by its matchers."""

    def __init__(
        self,
        grammar: ParsedGrammar,
        root: str = "root",
        core: str | None = None,
        max_stacks: int = MAX_STACKS,
        max_cells: int = MAX_CELLS,
    ) -> None:
        expect("grammar", grammar, ParsedGrammar, "a llama_cffi.gbnf.ParsedGrammar")
        expect_str("root", root, "a str (the start rule's name)")
        if core is not None and not isinstance(core, str):
            raise type_error("core", f"one of {CORES} or None", core)
        core = default_core() if core is None else core
        if core not in CORES:
            raise ValueError(f"core must be one of {CORES}, not {core!r}")
        max_stacks = expect_int("max_stacks", max_stacks)
        max_cells = expect_int("max_cells", max_cells)
        if max_stacks < 1:
            raise ValueError(f"max_stacks must be at least 1, not {max_stacks}")
        if not 2 <= max_cells < 2**31 - 1:
            raise ValueError(f"max_cells must be in [2, 2**31 - 1), not {max_cells}")
        self.max_stacks = max_stacks
        self.max_cells = max_cells
        if root not in grammar.symbol_ids:
            raise GrammarError(f"grammar does not contain a {root!r} symbol")
        if grammar.token_names:
            raise GrammarError(
                f"named token references {list(grammar.token_names)} need a vocabulary: compile the grammar first"
            )
        self.grammar = grammar
        self.root = root
        # flatten: element position -> (type, value); rule id -> first position
        parsed = grammar._parsed  # (the C parser's has the rules' first positions and lengths)
        if isinstance(parsed, tuple):
            self.rule_start = parsed[5]
            rule_lens = parsed[6]
        else:
            self.rule_start = (
                list(itertools.accumulate((len(r) for r in grammar.rules[:-1]), initial=0)) if grammar.rules else []
            )
            rule_lens = None
        # the element types and values as arrays (a checked grammar's types are 0..9)
        t_arr, v_arr = _element_arrays(grammar)
        self._types_a, self._values_a = t_arr, v_arr
        n_rules = len(self.rule_start)
        refs = v_arr[t_arr == _RULE_REF]
        if len(refs) and (int(refs.min()) < 0 or int(refs.max()) >= n_rules):
            bad = int(refs[(refs < 0) | (refs >= n_rules)][0])
            raise GrammarError(f"a rule refers to undefined rule {bad}")
        used = np.flatnonzero(np.bincount(refs, minlength=n_rules))
        if rule_lens is not None:
            empty = used[rule_lens[used] == 0]
            if len(empty):
                raise GrammarError(f"a rule refers to undefined rule {int(empty[0])}")
        else:
            for v in used.tolist():
                if not grammar.rules[v]:
                    raise GrammarError(f"a rule refers to undefined rule {v}")
        if core == "c":
            self._build_classes_c()
        else:
            self._build_classes()
        present = set(np.flatnonzero(np.bincount(t_arr, minlength=1)).tolist())
        self.has_token_elements = _TOKEN in present or _TOKEN_NOT in present
        # states
        self._lock = threading.RLock()
        self._stacks: list[tuple[Stack, ...]] = []
        self._state_ids: dict[tuple[Stack, ...], int] = {}
        self._advance_cache: dict[Stack, tuple[Stack, ...]] = {}
        self._groups: dict[tuple[int, ...], list[tuple[list[int], npt.NDArray[np.int64]]]] = {}
        self._group_of: dict[tuple[int, ...], npt.NDArray[np.int32]] = {}  # per tops: class -> group
        self._trans = np.full((64, self.n_classes), _UNKNOWN, dtype=np.int32)
        #: the C core's next transition table while it is being made ready (:meth:`_trans_prepare`):
        #: a lock the thread writing it holds until it is done, a list it appends to then, and
        #: the process that started it (its count of forks)
        self._trans_next: npt.NDArray[np.int32] | None = None
        self._trans_filler: tuple[Any, list[bool], int] | None = None
        self._trans_prepare_at = 3 * 64 // 4 + 1  # (the states at which _c_sync calls it next)
        #: per state: the token elements on top of its stacks (the Python core's states
        #: only: the C core's grammars have none) / is some stack empty (1) or not (0)
        self._token_tops: list[tuple[tuple[int, int], ...]] = []
        self._complete = bytearray()
        self.core = "python" if self.has_token_elements else core
        self._c: Any = None
        self._weight_c: Any = None  # (_c_run's class weights: the array, a contiguous copy, its buffer)
        self._root_count_c: Any = None  # (_c_derive_pick's root children per class, as _weight_c)
        self._differ_buf: Any = None  # (_c_derive_pick's output: an array, its buffer, the count)
        self._pchars_c: Any = None  # (_c_pchar_ok's partial characters, likewise)
        self._stack_cache: dict[int, tuple[Stack, ...]] = {}
        if self.core == "c":
            self._c_init()
            self.start = self._c_call(
                "the start state", _lib().llama_cffi_gengine_start(self._c, grammar.symbol_ids[root])
            )
            return
        start: dict[Stack, None] = {}
        for alt in self._alternatives(self.rule_start[grammar.symbol_ids[root]]):
            self._advance(() if self._is_end(alt) else (alt,), start)
        self._check_size(start, "the start state")
        self.start = self.intern(tuple(start))

    # the element arrays as lists, for the Python core's loops and the few Python steps of
    # the C core's (made on first use: a schema's grammar has ~10,000 elements, and a C
    # core engine may never read them)
    @functools.cached_property
    def types(self) -> list[int]:
        """Per element position: its type (``llama_gretype``)."""
        out: list[int] = self._types_a.tolist()
        return out

    @functools.cached_property
    def values(self) -> list[int]:
        """Per element position: its value (a code point, a rule id, a token id)."""
        out: list[int] = self._values_a.tolist()
        return out

    @functools.cached_property
    def _char_pos(self) -> list[int]:
        """Per position: the row of the char element starting there (-1: none)."""
        out: list[int] = self._char_row_a.tolist()
        return out

    @functools.cached_property
    def _after(self) -> list[int]:
        """Per position: the position after the char element starting there (-1: none)."""
        out: list[int] = self._after_a.tolist()
        return out

    # ------------------------------------------------------------------ the C core
    def _c_init(self) -> None:
        """Make the C engine (``llama_cffi_gengine_new``) from the flattened grammar."""
        from llama_cffi._binding import ffi

        lib = _lib()
        n = len(self._types_a)
        types = self._types_a.astype(np.int32)
        # a character value past every code point (up to 0xFFFFFFFF in GBNF) compares like
        # _MAX_CP with any code point or partial character; a token id past int32 is no token
        is_char = (self._types_a >= _CHAR) & (self._types_a <= _ANY)
        values = np.where(is_char, np.minimum(self._values_a, _MAX_CP), np.minimum(self._values_a, 2**31 - 1)).astype(
            np.int32
        )
        rule_start = np.ascontiguousarray(self.rule_start, dtype=np.int32)
        char_row = self._char_row_a.astype(np.int32)
        after = self._after_a.astype(np.int32)
        member = np.ascontiguousarray(self._member, dtype=np.uint8)
        single_class = np.ascontiguousarray(self._single_class, dtype=np.int32)
        n_rows = self.n_mrows + len(single_class)

        def ptr(a: npt.NDArray[Any], t: str) -> Any:  # t: "int32_t[]", ...
            return ffi.from_buffer(t, a) if a.size else ffi.NULL

        raw = lib.llama_cffi_gengine_new(
            n,
            ptr(types, "int32_t[]"),
            ptr(values, "int32_t[]"),
            len(rule_start),
            ptr(rule_start, "int32_t[]"),
            ptr(char_row, "int32_t[]"),
            ptr(after, "int32_t[]"),
            n_rows,
            self.n_classes,
            self.n_mrows,
            ptr(member, "uint8_t[]"),
            ptr(single_class, "int32_t[]"),
            self.max_stacks,
            self.max_cells,
        )
        if raw == ffi.NULL:  # pragma: no cover - the arrays come from a checked grammar
            raise MemoryError("the grammar engine could not be made (out of memory)")
        self._c = ffi.gc(raw, lib.llama_cffi_gengine_free)
        self._ffi = ffi
        self._trans_ptr = ffi.from_buffer("int32_t[]", self._trans)
        self._complete_buf = np.zeros(64, dtype=np.uint8)  # (_c_sync: the new states' completeness)
        self._complete_ptr = ffi.from_buffer("uint8_t[]", self._complete_buf)
        self._complete_mv = self._complete_buf.data  # (a memoryview: bytes appended without a copy to numpy)

    def _c_call(self, what: str, rc: int) -> int:
        """A C engine result, checked; new states (if any) get their Python side."""
        if rc < -1:
            if rc == -3:
                raise _budget_error(what, self.max_stacks)
            if rc == -6:
                raise GrammarBudgetError(self._cells_message(what))
            if rc == -2:
                raise MemoryError(f"{what}: out of memory in the grammar engine")
            raise GrammarError(f"{what}: the grammar engine refused its arguments (code {rc})")
        self._c_sync()
        return rc

    def _cells_message(self, what: str) -> str:
        return (
            f"{what}: the grammar engine keeps more than max_cells={self.max_cells} distinct stacks or states, or "
            f"a transition table of more than 16 x max_cells entries ({self.n_classes} classes per state); make "
            "the grammar less ambiguous, use fewer distinct characters, or raise max_cells"
        )

    def _c_sync(self) -> None:
        """The Python side of the C engine's news: the rows of transitions it computed
        since the last sync copied into ``_trans`` (grown first), and the completeness of
        the states it made."""
        lib = _LIB if _LIB is not None else _lib()
        have = len(self._complete)
        # most syncs: no new state, a few rows computed (one call copies them); with new
        # states, that call hands back their completeness instead (when they fit the buffer)
        rc = lib.llama_cffi_gengine_sync_known(
            self._c, self._trans_ptr, len(self._trans), have, self._complete_ptr, len(self._complete_buf)
        )
        if rc >= 0:
            return
        if rc > _NEW_STATES:  # pragma: no cover - the arguments are the engine's own
            raise GrammarError(f"internal error: the grammar engine's sync failed (code {rc})")
        n = _NEW_STATES - rc
        if n - have > len(self._complete_buf):  # more new states than the buffer holds: again, into a larger one
            self._complete_buf = np.zeros(max(2 * len(self._complete_buf), n - have), dtype=np.uint8)
            self._complete_ptr = self._ffi.from_buffer("uint8_t[]", self._complete_buf)
            self._complete_mv = self._complete_buf.data  # (a memoryview: bytes appended without a copy to numpy)
            rc = lib.llama_cffi_gengine_completes(self._c, have, n - have, self._complete_ptr)
            if rc < 0:  # pragma: no cover - the states exist
                raise GrammarError(f"internal error: the grammar engine's completeness failed (code {rc})")
        if n > len(self._trans):
            self._trans_grow(n)
        elif n >= self._trans_prepare_at:
            self._trans_prepare(n)
        # the new states' Python side first: another thread may read a row of the table
        # without the lock (step's fast path) and go on to a state the rows name
        self._complete += self._complete_mv[: n - have]
        rc = lib.llama_cffi_gengine_sync_known(self._c, self._trans_ptr, len(self._trans), n, self._ffi.NULL, 0)
        if rc < 0:  # pragma: no cover - the table was grown above
            raise GrammarError(f"internal error: the grammar engine's sync failed (code {rc})")

    def _trans_prepare(self, n: int) -> None:
        """The next (twice as long) transition table made ready once the table has filled
        three quarters (``n`` states now): every row written with :data:`_UNKNOWN` by a
        thread of its own (numpy's fill releases the GIL), so that its pages are the
        process's before the table is replaced, and their first writes (page faults: numpy
        gives an array of 4 MB or more 2 MB pages, each zeroed and, where the machine's
        memory is fragmented, compacted at its first write) cost no mask. Filled in the
        masks that make states instead, 8 rows a state, one mask that met a fresh 2 MB page
        took 4.4-5.4 ms in a process holding 70 MB of other arrays (the benchmark's masks);
        filled in the mask whose state fills the table, the growth at 16,384 states of 75
        classes (a 9.8 MB table, Github_ultra o12652) took 2-21 ms. Tables of under 1 MB
        grow at once (cheap)."""
        cap = len(self._trans)
        self._trans_prepare_at = cap + 1  # (not again before the growth)
        if self._trans_next is not None or 2 * cap * self.n_classes * 4 < _PREPARE_FROM:
            return
        nxt = self._trans_next = np.empty((2 * cap, self.n_classes), dtype=np.int32)
        done: list[bool] = []
        lock = _thread.allocate_lock()  # held until the thread is done
        lock.acquire()

        def fill() -> None:
            try:
                nxt.fill(_UNKNOWN)
                done.append(True)
            finally:
                lock.release()

        try:  # (a bare thread: threading.Thread's start waits for it to run, 0.12-0.33 ms here)
            _start_thread(fill, ())
        except RuntimeError:  # pragma: no cover - no thread to be had (shutting down): the growth fills it
            return
        self._trans_filler = (lock, done, _forks[0])

    def _trans_grow(self, n: int) -> None:
        """The transition table replaced by one of at least ``n`` rows (doubled until it
        holds them; the one :meth:`_trans_prepare` made ready when it is long enough, its
        thread waited for), the rows known copied. The old array is left to its readers
        (never resized in place)."""
        cap = len(self._trans)
        new_cap = cap
        while new_cap < n:
            new_cap *= 2
        nxt, filler = self._trans_next, self._trans_filler
        self._trans_next = self._trans_filler = None
        if filler is not None and filler[2] == _forks[0]:  # (in a process forked since, no thread)
            filler[0].acquire()  # its thread done
        if nxt is not None and len(nxt) == new_cap:
            if filler is None or not filler[1]:  # not made ready (as it was when the process forked)
                nxt[cap:] = _UNKNOWN
        else:
            nxt = np.empty((new_cap, self.n_classes), dtype=np.int32)
            nxt[cap:] = _UNKNOWN
        nxt[:cap] = self._trans
        self._trans_prepare_at = 3 * new_cap // 4 + 1
        self._trans = nxt
        self._trans_ptr = self._ffi.from_buffer("int32_t[]", nxt)

    def _c_run(
        self, state: int, class_weight: npt.NDArray[np.float64], cap: int, max_run_stacks: int
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
        """The run of ``state`` by the C core (``llama_cffi_gengine_run``): its chain of
        states (``cap + 1`` at most), its classes and its closed run's (each as
        ``n_classes // 64 + 1`` words). For
        :meth:`samplers.grammar.compiled.CompiledGrammar._run`; C core only."""
        ffi = self._ffi
        w = self.n_classes // 64 + 1
        chain = np.empty(cap + 1, dtype=np.int32)
        words = np.zeros(w, dtype=np.uint64)
        closed = np.zeros(w, dtype=np.uint64)
        weights = self._weight_buf(class_weight)
        with self._lock:
            n = self._c_call(
                "a run",
                _lib().llama_cffi_gengine_run(
                    self._c,
                    state,
                    weights,
                    cap,
                    max_run_stacks,
                    ffi.from_buffer("int32_t[]", chain),
                    ffi.from_buffer("uint64_t[]", words),
                    ffi.from_buffer("uint64_t[]", closed),
                    w,
                ),
            )
        return chain[:n], words, closed

    def _weight_buf(self, class_weight: npt.NDArray[np.float64]) -> Any:
        """A C buffer over ``class_weight`` (a value per class), made once per array: the
        runs' and the closures' calls pass the same weights each time."""
        given = self._weight_c
        if given is None or given[0] is not class_weight:
            cw = np.ascontiguousarray(class_weight, dtype=np.float64)
            if len(cw) < self.n_classes:
                raise ValueError("class_weight needs a value per class")
            given = self._weight_c = (class_weight, cw, self._ffi.from_buffer("double[]", cw))
        return given[2]

    def _c_derive_pick(
        self, state: int, root_count: npt.NDArray[np.int32], min_root: int, share: int
    ) -> tuple[int, npt.NDArray[np.int32]] | None:
        """``llama_cffi_gengine_derive_pick`` (C core only): for a derivation of ``state``'s
        mask (see :meth:`samplers.grammar.compiled.CompiledGrammar._derivation`, whose
        numpy version is the reference), the successor ``G`` the most root children
        (``root_count``, per class) lead to and the classes on which the rows of ``state``
        and ``G`` differ (both rows filled); None when the live classes hold under
        ``min_root`` root children, ``G`` is ``state``, or the differing classes hold over
        ``1/share`` of them."""
        ffi = self._ffi
        given = self._root_count_c
        if given is None or given[0] is not root_count:
            rc_ = np.ascontiguousarray(root_count, dtype=np.int32)
            given = self._root_count_c = (root_count, rc_, ffi.from_buffer("int32_t[]", rc_))
        buf = self._differ_buf
        if buf is None:
            arr = np.empty(max(self.n_classes, 1), dtype=np.int32)
            buf = self._differ_buf = (arr, ffi.from_buffer("int32_t[]", arr), ffi.new("int32_t *"))
        with self._lock:
            g = self._c_call(
                "a derivation's rows",
                _lib().llama_cffi_gengine_derive_pick(
                    self._c, state, given[2], len(given[1]), min_root, share, buf[1], buf[2]
                ),
            )
        if g < 0:
            return None
        return g, buf[0][: buf[2][0]].copy()

    def _c_closure_pays(
        self, state: int, run_words: npt.NDArray[np.uint64], class_weight: npt.NDArray[np.float64], min_off: float
    ) -> bool:
        """``llama_cffi_gengine_closure_pays``: whether ``state`` (its run's classes
        ``run_words``, from :meth:`_c_run`) is worth a closure search (C core only)."""
        ffi = self._ffi
        rw = np.ascontiguousarray(run_words, dtype=np.uint64)
        rc = _lib().llama_cffi_gengine_closure_pays(
            self._c, state, ffi.from_buffer("uint64_t[]", rw), len(rw), self._weight_buf(class_weight), min_off
        )
        if rc < 0:
            raise GrammarError(f"a closure's test: the grammar engine refused its arguments (code {rc})")
        return bool(rc)

    def _c_closed(
        self, state: int, class_weight: npt.NDArray[np.float64], max_run_stacks: int, max_states: int
    ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int32]]:
        """A closed run of ``state`` searched over at most ``max_states`` states (1 to 256;
        ``llama_cffi_gengine_closed``): its classes (``n_classes // 64 + 1`` words, all zero
        when none is found) and the states of its closure, each of which has the same closed
        run. For :meth:`samplers.grammar.compiled.CompiledGrammar._plan`; C core only."""
        ffi = self._ffi
        w = self.n_classes // 64 + 1
        words = np.zeros(w, dtype=np.uint64)
        states = np.empty(max_states, dtype=np.int32)
        n = ffi.new("int32_t *")
        weights = self._weight_buf(class_weight)
        with self._lock:
            self._c_call(
                "a closed run",
                _lib().llama_cffi_gengine_closed(
                    self._c,
                    state,
                    weights,
                    max_run_stacks,
                    max_states,
                    ffi.from_buffer("uint64_t[]", words),
                    w,
                    ffi.from_buffer("int32_t[]", states),
                    n,
                ),
            )
        return words, states[: n[0]]

    def _c_pchar_ok(self, state: int, pchars: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Per partial character (``value << 2 | bytes still needed``): can ``state`` take
        a completion of it (C core; :meth:`partial_ok` for each)."""
        ffi = self._ffi
        given = self._pchars_c  # (the same partial characters each call: their buffer made once)
        if given is None or given[0] is not pchars:
            pc = np.ascontiguousarray(pchars, dtype=np.int64)
            given = self._pchars_c = (pchars, pc, ffi.from_buffer("int64_t[]", pc))
        n = len(given[1])
        out = np.empty(max(n, 1), dtype=np.uint8)  # (each entry written: 0 or 1)
        with self._lock:
            self._c_call(
                "partial characters",
                _lib().llama_cffi_gengine_pchar_ok(self._c, state, given[2], n, ffi.from_buffer("uint8_t[]", out)),
            )
        return out[:n].view(np.bool_)

    def _c_partial_mask(self, state: int, args: tuple[Any, ...], out_c: Any, n_words: int) -> None:
        """``llama_cffi_gengine_partial_mask`` (C core): ``args`` as
        :meth:`samplers.grammar.compiled.CompiledGrammar._partial_kinds_into` makes them
        (cffi buffers and counts), ``out_c`` a buffer over ``n_words`` mask words (ORed
        into); the longer tokens' flags land in ``args``' own buffer."""
        with self._lock:
            self._c_call(
                "a partial character's mask",
                _lib().llama_cffi_gengine_partial_mask(self._c, state, *args[:-1], out_c, n_words, args[-1]),
            )

    def _c_stacks(self, state: int) -> tuple[Stack, ...]:
        """A state's stacks from the C engine (cached)."""
        got = self._stack_cache.get(state)
        if got is None:
            lib, ffi = _lib(), self._ffi
            with self._lock:  # (another thread's C call may be growing the engine's arrays)
                k = int(lib.llama_cffi_gengine_n_stacks(self._c, state))
                lens = np.empty(max(k, 1), dtype=np.int32)
                lp = ffi.from_buffer("int32_t[]", lens)
                total = int(lib.llama_cffi_gengine_stacks(self._c, state, lp, ffi.NULL, 0))
                flat = np.empty(max(total, 1), dtype=np.int32)
                lib.llama_cffi_gengine_stacks(self._c, state, lp, ffi.from_buffer("int32_t[]", flat), total)
            out: list[Stack] = []
            at = 0
            fl = flat.tolist()
            for ln in lens[:k].tolist():
                out.append(tuple(fl[at : at + ln]))
                at += ln
            got = tuple(sorted(out))
            if len(self._stack_cache) > 4096:
                self._stack_cache.clear()
            self._stack_cache[state] = got
        return got

    def n_stacks(self, state: int) -> int:
        """How many stacks ``state`` has (0 for ``DEAD``)."""
        if type(state) is not int:
            state = expect_int("state", state)
        if state == DEAD:
            return 0
        if self._c is not None:
            if not 0 <= state < len(self._complete):
                raise IndexError(f"state {state} out of range")
            with self._lock:  # (another thread's C call may be growing the engine's arrays)
                return int(_lib().llama_cffi_gengine_n_stacks(self._c, state))
        return len(self._stacks[state])

    def _check_size(self, out: dict[Stack, None] | tuple[Stack, ...], what: str) -> None:
        if len(out) > self.max_stacks:
            raise _budget_error(what, self.max_stacks)

    # ------------------------------------------------------------------ elements
    def _is_end(self, pos: int) -> bool:
        return self.types[pos] in (_END, _ALT)

    def _alternatives(self, pos: int) -> Iterable[int]:
        """First positions of the alternatives of the rule starting at ``pos``."""
        types = self.types
        while True:
            yield pos
            while types[pos] not in (_END, _ALT):
                pos += 1
            if types[pos] == _END:
                return
            pos += 1

    def _class_items(self, pos: int) -> tuple[bool, list[tuple[int, int]], int]:
        """``(positive, [(lo, hi), ...], position after)`` of the char element at ``pos``
        (``llama_grammar_match_char``'s walk; ``.`` is the range of every value)."""
        types, values = self.types, self.values
        positive = types[pos] in (_CHAR, _ANY)
        items: list[tuple[int, int]] = []
        while True:
            if types[pos + 1] == _RNG:
                items.append((values[pos], values[pos + 1]))
                pos += 2
            elif types[pos] == _ANY:
                items.append((0, _MAX_CP - 1))
                pos += 1
            else:
                items.append((values[pos], values[pos]))
                pos += 1
            if types[pos] != _CHAR_ALT:
                return positive, items, pos

    def _build_classes(self) -> None:
        """Partition code points into classes no char element distinguishes, in time and
        memory near-linear in the grammar's character elements.

        A char element starts at each CHAR, CHAR_NOT or ANY and runs over the
        CHAR_RNG_UPPER and CHAR_ALT after it (found with array operations over the element
        types). Most are one character (a literal's): those share a *single row* per
        value, which matches exactly one class, that of the interval ``[v, v + 1)``. The
        others (sets, ranges, negations: *multi rows*, one per distinct run of elements,
        read by :meth:`_class_items`) are few; only they get a row of ``_member`` (their
        membership per class). Classes are the distinct (single value, multi-row
        membership) pairs of the intervals between item bounds, numbered in the order of
        their first interval. A word list of thousands of distinct characters has
        thousands of single rows and classes but no ``rows x classes`` matrix: such a
        matrix (before 2026-11-28) took 4 s and 1.1 GB for 6,000 CJK words.
        :data:`MAX_CLASS_CELLS` bounds ``multi rows x classes`` (a
        :class:`~samplers.grammar.errors.GrammarBudgetError` past it).

        Sets ``_char_pos`` (per position: the row of the char element starting there, -1
        elsewhere; rows ``< n_mrows`` are multi rows, the others single rows),
        ``_member`` (``n_mrows x n_classes``), ``_single_class`` (per single row: its
        class, -1 for a value past every code point), ``_after``, ``_edges``,
        ``_interval_class`` and ``n_classes``."""
        t_arr, v_arr = self._types_a, self._values_a
        n_pos = len(t_arr)
        is_start = (t_arr == _CHAR) | (t_arr == _CHAR_NOT) | (t_arr == _ANY)
        starts = np.flatnonzero(is_start)
        stops = np.flatnonzero((t_arr != _RNG) & (t_arr != _CHAR_ALT))  # END never continues an element
        after_of = stops[np.searchsorted(stops, starts, side="right")] if len(starts) else starts
        single = (t_arr[starts] == _CHAR) & (after_of == starts + 1)
        # the multi rows, one per distinct run of elements (a JSON grammar repeats its string
        # and number sets), then one per distinct (positive, items)
        t_raw, v_raw = t_arr.tobytes(), v_arr.tobytes()
        by_raw: dict[tuple[bytes, bytes], int] = {}
        rows: dict[tuple[bool, tuple[tuple[int, int], ...]], int] = {}
        multi = starts[~single]
        multi_row = np.empty(len(multi), dtype=np.int64)
        for i, (pos, end) in enumerate(zip(multi.tolist(), after_of[~single].tolist(), strict=True)):
            raw = (t_raw[8 * pos : 8 * end], v_raw[8 * pos : 8 * end])
            row = by_raw.get(raw)
            if row is None:
                positive, items_list, _after = self._class_items(pos)
                row = rows.setdefault((positive, tuple(items_list)), len(rows))
                by_raw[raw] = row
            multi_row[i] = row
        n_m = len(rows)
        # the single rows: one per distinct value, in increasing order (sorted by hand: a
        # process's first np.unique imports numpy.ma, ~12 ms)
        s_vals = v_arr[starts[single]]
        order = np.argsort(s_vals, kind="stable")
        srt = s_vals[order]
        first = np.concatenate(([True], srt[1:] != srt[:-1])) if len(srt) else np.zeros(0, dtype=bool)
        single_row = np.empty(len(s_vals), dtype=np.int64)
        single_row[order] = np.cumsum(first) - 1 + n_m
        sv = srt[first]  # the single rows' values
        char_row = np.full(n_pos, -1, dtype=np.int64)
        char_row[starts[single]] = single_row
        char_row[multi] = multi_row
        after = np.full(n_pos, -1, dtype=np.int64)
        after[starts] = after_of
        self._char_row_a, self._after_a = char_row, after

        def sorted_set(a: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
            a = np.sort(a)
            return a[np.concatenate(([True], a[1:] != a[:-1]))]

        # the multi rows' membership over the intervals between their own item bounds
        # ("coarse" intervals: every item's lo and hi + 1, capped at _MAX_CP, and 0, _MAX_CP)
        flat = [iv for _, items in rows for iv in items if iv[0] <= iv[1]]
        bound = np.array([0, _MAX_CP], dtype=np.int64)
        if flat:
            ivs = np.minimum(np.array(flat, dtype=np.int64), _MAX_CP)
            ivs[:, 1] = np.minimum(ivs[:, 1] + 1, _MAX_CP)
            cedges = sorted_set(np.concatenate([ivs.ravel(), bound]))
        else:
            cedges = bound
        n_c = len(cedges) - 1  # coarse interval i = [cedges[i], cedges[i+1])
        if n_m * n_c > MAX_CLASS_CELLS:
            raise GrammarBudgetError(self._class_budget_message(n_m, n_c))
        cmember = np.zeros((n_m, n_c), dtype=bool)
        if flat:
            # each item covers intervals [a, b): +1 at a, -1 at b, per row, then a running sum
            owner = np.array([r for r, (_, items) in enumerate(rows) for iv in items if iv[0] <= iv[1]], dtype=np.int64)
            start = np.searchsorted(cedges, ivs[:, 0], side="right") - 1
            stop = np.searchsorted(cedges, ivs[:, 1], side="left")
            delta = np.zeros((n_m, n_c + 1), dtype=np.int32)
            np.add.at(delta, (owner, start), 1)
            np.add.at(delta, (owner, stop), -1)
            cmember = np.cumsum(delta[:, :n_c], axis=1) > 0
        negative = np.array([not positive for positive, _ in rows], dtype=bool)
        if negative.any():
            cmember[negative] = ~cmember[negative]
        # coarse intervals with the same membership column share a key
        ckey = np.empty(n_c, dtype=np.int64)
        if n_m:
            cols = np.ascontiguousarray(cmember.T)
            key_of: dict[bytes, int] = {}
            for i, col in enumerate(cols):
                ckey[i] = key_of.setdefault(col.tobytes(), len(key_of))
            n_ckeys = len(key_of)
        else:
            ckey[:] = 0
            n_ckeys = 1
        # the final intervals: the coarse bounds and each single value's [v, v + 1)
        live_sv = sv[sv < _MAX_CP]
        edges = sorted_set(np.concatenate([cedges, live_sv, live_sv + 1])) if len(live_sv) else cedges
        n_int = len(edges) - 1
        coarse_of = np.searchsorted(cedges, edges[:-1], side="right") - 1
        rank_sv = np.searchsorted(live_sv, edges[:-1])  # the single value starting the interval, if any
        is_single = rank_sv < len(live_sv)
        is_single[is_single] = live_sv[rank_sv[is_single]] == edges[:-1][is_single]
        key = np.where(is_single, n_ckeys + rank_sv, ckey[coarse_of])
        # classes: the distinct keys, numbered in the order of their first interval
        korder = np.argsort(key, kind="stable")
        ks = key[korder]
        new_group = np.concatenate(([True], ks[1:] != ks[:-1]))
        group_of_sorted = np.cumsum(new_group) - 1
        first_interval = korder[new_group]  # per group (in key order): its first interval
        by_first = np.argsort(first_interval, kind="stable")
        class_of_group = np.empty(len(by_first), dtype=np.int64)
        class_of_group[by_first] = np.arange(len(by_first))
        interval_class = np.empty(n_int, dtype=np.int32)
        interval_class[korder] = class_of_group[group_of_sorted]
        first_interval = first_interval[by_first]  # per class
        n_classes = len(first_interval)
        if n_m * n_classes > MAX_CLASS_CELLS:
            raise GrammarBudgetError(self._class_budget_message(n_m, n_classes))
        self._edges = edges
        self._interval_class = interval_class
        self.n_classes = n_classes
        #: ``member[row, class]``: whether the char element of multi row ``row`` matches the class
        self._member = np.ascontiguousarray(cmember[:, coarse_of[first_interval]])
        #: per single row (``row - n_mrows``): the class of its value (-1: past every code point)
        single_class = np.full(len(sv), -1, dtype=np.int32)
        single_class[: len(live_sv)] = interval_class[np.searchsorted(edges, live_sv)]
        self._single_class = single_class
        self.n_mrows = n_m
        self._ascii_class = self._classes_of_cps(np.arange(128, dtype=np.int64)).tolist()

    def _build_classes_c(self) -> None:
        """:meth:`_build_classes` in one C call (``llama_cffi_gclasses_build``, the C core's
        compile; :meth:`_build_classes` is its reference, compared by
        ``tests/test_grammar_engine_core.py``): the same attributes, the same classes."""
        from llama_cffi._binding import ffi

        lib = _lib()
        n = len(self._types_a)
        types = self._types_a.astype(np.int32)
        values = np.ascontiguousarray(self._values_a, dtype=np.int64)
        rc = ffi.new("int32_t *")
        raw = lib.llama_cffi_gclasses_build(
            n, ffi.from_buffer("int32_t[]", types), ffi.from_buffer("int64_t[]", values), MAX_CLASS_CELLS, rc
        )
        if raw == ffi.NULL:
            if rc[0] == -7:
                raise GrammarBudgetError(self._class_budget_message(-1, -1))
            if rc[0] == -2:  # pragma: no cover
                raise MemoryError("the grammar's character classes: out of memory")
            raise GrammarError(f"the grammar's character elements are inconsistent (code {rc[0]})")
        try:

            def take(ptr: Any, count: int, dtype: Any) -> npt.NDArray[Any]:
                size = np.dtype(dtype).itemsize * count
                return np.frombuffer(ffi.buffer(ptr, size), dtype=dtype).copy() if count else np.zeros(0, dtype)

            n_m, nc, n_int = raw.n_mrows, raw.n_classes, raw.n_int
            char_row = take(raw.char_row, n, np.int32).astype(np.int64)
            after = take(raw.after, n, np.int32).astype(np.int64)
            self._edges = take(raw.edges, n_int + 1, np.int32).astype(np.int64)
            self._interval_class = take(raw.interval_class, n_int, np.int32)
            self._single_class = take(raw.single_class, raw.n_rows - n_m, np.int32)
            self._member = take(raw.member, n_m * nc, np.uint8).astype(bool).reshape(n_m, nc)
        finally:
            lib.llama_cffi_gclasses_free(raw)
        self._char_row_a, self._after_a = char_row, after
        self.n_classes = nc
        self.n_mrows = n_m
        self._ascii_class = self._classes_of_cps(np.arange(128, dtype=np.int64)).tolist()

    def _class_budget_message(self, n_rows: int, n_cols: int) -> str:
        what = "distinct character sets" if n_rows < 0 else f"{n_rows} distinct character sets"
        over = "" if n_cols < 0 else f" over {n_cols} intervals of code points"
        return (
            f"the grammar's {what} (classes, ranges, negations){over} need a table of more than "
            f"MAX_CLASS_CELLS={MAX_CLASS_CELLS} cells; use fewer distinct sets (literal characters are not counted)"
        )

    def _row_matches(self, row: int, cls: int) -> bool:
        """Whether the char element of ``row`` (``_char_pos``) matches class ``cls``."""
        if row < self.n_mrows:
            return bool(self._member[row, cls])
        return int(self._single_class[row - self.n_mrows]) == cls

    def classes_of(self, cps: npt.ArrayLike) -> npt.NDArray[np.int32]:
        """Class of each code point (vectorised)."""
        a = expect_array("cps", cps, "code points (ints)", "iu").astype(np.int64, copy=False)
        idx = np.searchsorted(self._edges, np.clip(a, 0, _MAX_CP - 1), side="right") - 1
        return self._interval_class[idx]

    def _classes_of_cps(self, cps: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]:
        """:meth:`classes_of` for non-negative int64 code points (unchecked; a value past the
        last code point has the last one's class)."""
        idx = np.searchsorted(self._edges, np.minimum(cps, _MAX_CP - 1), side="right") - 1
        out: npt.NDArray[np.int32] = self._interval_class[idx]  # (int32)
        return out

    def _classes_of_sorted(self, cps: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]:
        """:meth:`classes_of` for distinct code points in increasing order (a vocabulary's
        ``uniq_cps``): each interval's class repeated over the code points in it, one
        search per interval rather than one per code point."""
        bounds = np.searchsorted(cps, self._edges[1:-1], side="left")
        counts = np.diff(np.concatenate(([0], bounds, [len(cps)])))
        return np.repeat(self._interval_class, counts)

    def class_of(self, cp: int) -> int:
        if type(cp) is not int:
            cp = expect_int("cp", cp)
        if 0 <= cp < 128:
            return int(self._ascii_class[cp])
        return int(self.classes_of([cp])[0])

    # ------------------------------------------------------------------ stacks
    def _advance(self, stack: Stack, out: dict[Stack, None]) -> None:
        """``llama_grammar_advance_stack``: expand rule references on top of ``stack`` until
        every resulting stack is empty or has a terminal on top; add new ones to ``out`` (an
        ordered set: an ambiguous grammar can have thousands of stacks, and a list's
        membership test made each step quadratic in them)."""
        res = self._advance_cache.get(stack)
        if res is None:
            acc: dict[Stack, None] = {}
            todo = [stack]
            seen: set[Stack] = set()
            types, values, is_end = self.types, self.values, self._is_end
            max_visit = self.max_stacks + len(types)
            while todo:
                cur = todo.pop()
                if cur in seen:
                    continue
                seen.add(cur)
                if len(seen) > max_visit:  # a nullable rule before a recursive reference: no end
                    raise _budget_error("advancing a stack", self.max_stacks)
                if not cur:
                    acc[cur] = None
                    continue
                pos = cur[-1]
                t = types[pos]
                if t == _RULE_REF:
                    base = cur[:-1]
                    if not is_end(pos + 1):
                        base = (*base, pos + 1)
                    for sub in self._alternatives(self.rule_start[values[pos]]):
                        todo.append(base if is_end(sub) else (*base, sub))
                elif t in (_CHAR, _CHAR_NOT, _ANY, _TOKEN, _TOKEN_NOT):
                    acc[cur] = None
                else:  # pragma: no cover - a parsed grammar never leaves a stack here
                    raise GrammarError(f"internal error: stack top on element type {t}")
            self._check_size(acc, "advancing a stack")
            res = self._advance_cache[stack] = tuple(acc)
        for s in res:
            out[s] = None

    def intern(self, stacks: Sequence[Stack]) -> int:
        """The state of a stack set (``DEAD`` if empty)."""
        expect_iterable("stacks", stacks, "a sequence of stacks (tuples of ints)")
        if not stacks:
            return DEAD
        if self._c is not None:
            flat = [p for st in stacks for p in st]
            lens = np.array([len(st) for st in stacks], dtype=np.int32)
            fa = np.array(flat if flat else [0], dtype=np.int32)
            with self._lock:
                return self._c_call(
                    "interning a state",
                    _lib().llama_cffi_gengine_intern(
                        self._c,
                        len(lens),
                        self._ffi.from_buffer("int32_t[]", lens),
                        self._ffi.from_buffer("int32_t[]", fa),
                    ),
                )
        key = tuple(sorted(set(stacks)))
        sid = self._state_ids.get(key)
        if sid is not None:
            return sid
        with self._lock:
            sid = self._state_ids.get(key)
            if sid is not None:
                return sid
            sid = len(self._stacks)
            if (sid + 1) * self.n_classes > 16 * self.max_cells:  # the C core's table bound
                raise GrammarBudgetError(self._cells_message("interning a state"))
            self._stacks.append(key)
            types, values = self.types, self.values
            self._token_tops.append(
                tuple((types[s[-1]], values[s[-1]]) for s in key if s and types[s[-1]] in (_TOKEN, _TOKEN_NOT))
            )
            self._complete.append(any(not s for s in key))
            if sid >= len(self._trans):
                grown = np.full((2 * len(self._trans), self.n_classes), _UNKNOWN, dtype=np.int32)
                grown[: len(self._trans)] = self._trans
                self._trans = grown
            self._state_ids[key] = sid  # published last: a reader sees a complete state
        return sid

    @property
    def n_states(self) -> int:
        return len(self._complete)

    def stacks(self, state: int) -> tuple[Stack, ...]:
        """The stacks of ``state`` (positions into the flattened rules), sorted."""
        if type(state) is not int:
            state = expect_int("state", state)
        if state == DEAD:
            return ()
        if self._c is not None:
            if not 0 <= state < len(self._complete):
                raise IndexError(f"state {state} out of range")
            return self._c_stacks(state)
        return self._stacks[state]

    def is_complete(self, state: int) -> bool:
        """Whether some stack is empty: the input so far is a complete sentence (EOG allowed)."""
        if type(state) is not int:
            state = expect_int("state", state)
        return state != DEAD and self._complete[state] == 1

    def token_tops(self, state: int) -> tuple[tuple[int, int], ...]:
        """``(type, token id)`` of the token elements on top of the state's stacks."""
        if type(state) is not int:
            state = expect_int("state", state)
        return () if state == DEAD or self._c is not None else self._token_tops[state]

    # ------------------------------------------------------------------ transitions
    def step(self, state: int, cls: int) -> int:
        """Successor of ``state`` on a code point of class ``cls`` (``DEAD`` if none)."""
        if type(state) is not int:
            state = expect_int("state", state)
        if type(cls) is not int:
            cls = expect_int("cls", cls)
        if state == DEAD:
            return DEAD
        nxt = int(self._trans[state, cls])
        if nxt == _UNKNOWN:
            nxt = self._compute(state, cls)
        return nxt

    def _compute(self, state: int, cls: int) -> int:
        with self._lock:
            if self._trans[state, cls] == _UNKNOWN:
                self._compute_one_locked(state, cls)
            return int(self._trans[state, cls])

    def _compute_one_locked(self, state: int, cls: int) -> None:
        """One transition (``llama_grammar_accept_chr`` then advance, over the stacks)."""
        if self._c is not None:
            self._c_call("a transition", _lib().llama_cffi_gengine_step(self._c, state, cls))
            return
        out: dict[Stack, None] = {}
        types, member, char_pos, after = self.types, self._member, self._char_pos, self._after
        n_m, single = self.n_mrows, self._single_class
        for stack in self._stacks[state]:
            if not stack:
                continue
            pos = stack[-1]
            if types[pos] in (_TOKEN, _TOKEN_NOT):
                continue  # llama_grammar_accept_chr ignores token elements
            row = char_pos[pos]
            if member[row, cls] if row < n_m else single[row - n_m] == cls:
                nxt = after[pos]
                self._advance(stack[:-1] if self._is_end(nxt) else (*stack[:-1], nxt), out)
        self._check_size(out, "a transition")
        sid = self.intern(tuple(out))  # may grow the table: index it afresh
        self._trans[state, cls] = sid

    def fill_row(self, state: int) -> None:
        """Compute every transition of ``state`` (see :meth:`_fill_row_locked`)."""
        if type(state) is not int:
            state = expect_int("state", state)
        if state != DEAD and (self._trans[state] == _UNKNOWN).any():
            with self._lock:
                self._fill_row_locked(state)

    def _fill_row_locked(self, state: int) -> None:
        """Every transition of ``state``. Classes that the same stacks of the state accept
        (``llama_grammar_accept_chr``: a stack continues when its top character element
        matches) lead to the same successor, so the successors are computed once per
        distinct set of matching stacks: a handful per state, whatever the class count."""
        if self._c is not None:
            self._c_call("a row of transitions", _lib().llama_cffi_gengine_fill_row(self._c, state))
            return
        types, after = self.types, self._after
        live = [s for s in self._stacks[state] if s and types[s[-1]] not in (_TOKEN, _TOKEN_NOT)]
        if not live:  # token elements are not matched by characters; empty stacks match nothing
            self._trans[state, :] = DEAD
            return
        tops = tuple(s[-1] for s in live)
        groups = self._groups.get(tops)
        if groups is None:
            groups = self._groups[tops] = self._class_groups(tops)
        for hits, classes in groups:
            out: dict[Stack, None] = {}
            for k in hits:
                stack = live[k]
                nxt = after[stack[-1]]
                self._advance(stack[:-1] if self._is_end(nxt) else (*stack[:-1], nxt), out)
            self._check_size(out, "a row of transitions")
            sid = self.intern(tuple(out))  # may grow the table: index it afresh
            self._trans[state, classes] = sid

    def group_step(self, state: int, classes: npt.NDArray[np.int64]) -> int | None:
        """The successor of ``state`` on every class of ``classes`` when they all have the
        same one (``DEAD`` when none of them is taken), else None. Cheaper than a whole
        row: only the group of classes that ``classes[0]`` belongs to is advanced (classes
        the same stacks accept share a successor, see :meth:`_fill_row_locked`); its
        transitions are kept."""
        if type(state) is not int:
            state = expect_int("state", state)
        if not isinstance(classes, np.ndarray):
            classes = expect_array("classes", classes, "an array of code-point classes", "iu")
        if state == DEAD or not len(classes):
            return None
        t = self._trans
        known = t[state, classes]
        if (known != _UNKNOWN).all():
            return int(known[0]) if (known == known[0]).all() else None
        with self._lock:
            if self._c is not None:
                cl = np.ascontiguousarray(classes, dtype=np.int32)
                rc = _lib().llama_cffi_gengine_group_step(
                    self._c, state, self._ffi.from_buffer("int32_t[]", cl), len(cl)
                )
                if rc == -5:
                    self._c_sync()
                    return None
                return self._c_call("a group of transitions", rc)
            types, after = self.types, self._after
            live = [st for st in self._stacks[state] if st and types[st[-1]] not in (_TOKEN, _TOKEN_NOT)]
            if not live:
                self._trans[state, :] = DEAD
                return DEAD
            tops = tuple(st[-1] for st in live)
            groups = self._groups.get(tops)
            if groups is None:
                groups = self._groups[tops] = self._class_groups(tops)
            gidx = self._group_of.get(tops)
            if gidx is None:
                gidx = np.empty(self.n_classes, dtype=np.int32)
                for i, (_hits, cls) in enumerate(groups):
                    gidx[cls] = i
                self._group_of[tops] = gidx
            g = gidx[classes]
            if (g != g[0]).any():
                return None
            hits, members = groups[int(g[0])]
            out: dict[Stack, None] = {}
            for k in hits:
                stack = live[k]
                nxt = after[stack[-1]]
                self._advance(stack[:-1] if self._is_end(nxt) else (*stack[:-1], nxt), out)
            self._check_size(out, "a group of transitions")
            sid = self.intern(tuple(out))  # may grow the table: index it afresh
            self._trans[state, members] = sid
            return sid

    def _class_groups(self, tops: tuple[int, ...]) -> list[tuple[list[int], npt.NDArray[np.int64]]]:
        """The classes grouped by which of the character elements ``tops`` match them:
        ``[(indices into tops that match, classes), ...]`` (depends only on the tops, so
        states that differ below their tops share it). A multi row's classes come from its
        line of ``_member``, a single row's from ``_single_class`` (no ``tops x classes``
        matrix: a word list's root state has thousands of single-character tops)."""
        n_m, nc = self.n_mrows, self.n_classes
        rows_of = [self._char_pos[p] for p in tops]
        multi_k = [k for k, r in enumerate(rows_of) if r < n_m]
        singles: dict[int, list[int]] = {}  # class -> the single tops matching it
        for k, r in enumerate(rows_of):
            if r >= n_m:
                c = int(self._single_class[r - n_m])
                if c >= 0:
                    singles.setdefault(c, []).append(k)
        mrows = self._member[[rows_of[k] for k in multi_k]]  # (multi tops, classes)
        sigs = np.ascontiguousarray(np.packbits(mrows, axis=0).T)  # per class: which multi tops match
        raw, w = sigs.tobytes(), sigs.shape[1]
        groups: dict[tuple[bytes, int], list[int]] = {}
        for c in range(nc):
            groups.setdefault((raw[c * w : (c + 1) * w], c if c in singles else -1), []).append(c)
        out = []
        for classes in groups.values():
            c0 = classes[0]
            hits = [multi_k[j] for j in np.flatnonzero(mrows[:, c0]).tolist()] + singles.get(c0, [])
            out.append((sorted(hits), np.array(classes, dtype=np.int64)))
        return out

    def table(self) -> npt.NDArray[np.int32]:
        """The transition table ``[state, class] -> state`` (``-2``: not computed yet).
        The array is replaced when it grows: fetch it again after computing."""
        return self._trans

    def fill(self, states: npt.NDArray[np.int32], classes: npt.NDArray[np.int32]) -> None:
        """Compute every unknown transition among the pairs ``(states[i], classes[i])``
        (pairs with a negative state are skipped)."""
        if self._c is not None:  # the C core skips known and DEAD pairs itself
            sa = expect_array("states", states, "state ids (ints)", "iu")
            ca = expect_array("classes", classes, "class ids (ints)", "iu")
            for name, a in (("states", sa), ("classes", ca)):
                if a.size and (int(a.max()) >= 2**31 or int(a.min()) < -(2**31)):
                    raise ValueError(f"{name} out of range: {int(a.min())} .. {int(a.max())}")
            su = np.ascontiguousarray(sa, dtype=np.int32)
            cu = np.ascontiguousarray(ca, dtype=np.int32)
            if su.ndim != 1 or su.shape != cu.shape:
                raise ValueError(f"states and classes must be 1-D of one length, not {su.shape} and {cu.shape}")
            ffi = self._ffi
            with self._lock:
                self._c_call(
                    "transitions",
                    _lib().llama_cffi_gengine_fill(
                        self._c, len(su), ffi.from_buffer("int32_t[]", su), ffi.from_buffer("int32_t[]", cu)
                    ),
                )
            return
        states = expect_array("states", states, "state ids (ints)", "iu")
        classes = expect_array("classes", classes, "class ids (ints)", "iu")
        t = self._trans
        live = states >= 0
        s, c = states[live], classes[live]
        unknown = t[s, c] == _UNKNOWN
        if unknown.any():
            need: dict[int, set[int]] = {}
            for st, cl in zip(s[unknown].tolist(), c[unknown].tolist(), strict=True):
                need.setdefault(st, set()).add(cl)
            with self._lock:
                for st, cls in sorted(need.items()):
                    if len(cls) >= _ROW_MIN:
                        self._fill_row_locked(st)  # one pass for every class
                    else:
                        for cl in sorted(cls):
                            if self._trans[st, cl] == _UNKNOWN:
                                self._compute_one_locked(st, cl)

    def walk(self, state: int, cps: Iterable[int]) -> int:
        """The state after the code points ``cps`` (``DEAD`` once nothing matches)."""
        if type(state) is not int:
            state = expect_int("state", state)
        if not isinstance(cps, (list, tuple)):
            expect_iterable("cps", cps, "an iterable of code points (ints)")
        for cp in cps:
            state = self.step(state, self.class_of(cp))
            if state == DEAD:
                return DEAD
        return state

    def step_token(self, state: int, token: int) -> int:
        """The stacks after a token element: those with ``<[token]>`` (or a ``!<[t]>`` with
        ``t != token``) on top, advanced (``llama_grammar_accept_token``'s token branch)."""
        if type(state) is not int:
            state = expect_int("state", state)
        if type(token) is not int:
            token = expect_int("token", token)
        if state == DEAD or self._c is not None or not self._token_tops[state]:
            return DEAD
        out: dict[Stack, None] = {}
        types, values = self.types, self.values
        for stack in self._stacks[state]:
            if stack and types[stack[-1]] in (_TOKEN, _TOKEN_NOT):
                pos = stack[-1]
                if (types[pos] == _TOKEN) == (values[pos] == token):
                    self._advance(stack[:-1] if self._is_end(pos + 1) else (*stack[:-1], pos + 1), out)
        return self.intern(tuple(out))

    def union(self, a: int, b: int) -> int:
        """The state whose stacks are those of ``a`` and ``b``."""
        if type(a) is not int:
            a = expect_int("a", a)
        if type(b) is not int:
            b = expect_int("b", b)
        if a == DEAD:
            return b
        if b == DEAD:
            return a
        return self.intern(self.stacks(a) + self.stacks(b))

    def char_only(self, state: int) -> int:
        """``state`` without its empty and token-topped stacks: what consuming a token's
        characters continues (``llama_grammar_accept_token`` drops empty stacks even for
        a token that decodes to no complete character)."""
        if type(state) is not int:
            state = expect_int("state", state)
        if state == DEAD or not ((self._c is None and self._token_tops[state]) or self._complete[state]):
            return state
        types = self.types
        return self.intern([s for s in self.stacks(state) if s and types[s[-1]] not in (_TOKEN, _TOKEN_NOT)])

    def char_tops(self, state: int) -> tuple[int, ...]:
        """Positions of the character elements on top of the state's stacks (the stacks
        that code points continue)."""
        if type(state) is not int:
            state = expect_int("state", state)
        if state == DEAD:
            return ()
        types = self.types
        return tuple({s[-1] for s in self.stacks(state) if s and types[s[-1]] not in (_TOKEN, _TOKEN_NOT)})

    def partial_ok_at(
        self, pos: int, values: npt.NDArray[np.int64], remains: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.bool_]:
        """:meth:`partial_ok` for one stack whose top is the character element at ``pos``,
        vectorised over partial sequences ``(values[i], remains[i])`` (each with at least
        one byte still needed)."""
        if type(pos) is not int:
            pos = expect_int("pos", pos)
        if not isinstance(values, np.ndarray):
            values = expect_array("values", values, "an array of ints")
        if not isinstance(remains, np.ndarray):
            remains = expect_array("remains", remains, "an array of ints")
        values = np.asarray(values, dtype=np.int64)
        remains = np.asarray(remains, dtype=np.int64)
        valid = (remains > 0) & ~((remains == 1) & (values < 2))
        shift = np.maximum(remains, 0) * 6
        low = values << shift
        high = low | ((np.int64(1) << shift) - 1)
        low = np.where((low == 0) & (remains == 2), 1 << 11, np.where((low == 0) & (remains == 3), 1 << 16, low))
        types, vals = self.types, self.values
        positive = types[pos] in (_CHAR, _ANY)
        overlap = np.zeros(len(values), dtype=bool)
        while True:  # llama_grammar_match_partial_char: the first item that overlaps decides
            if types[pos + 1] == _RNG:
                overlap |= (vals[pos] <= high) & (low <= vals[pos + 1])
                pos += 2
            elif types[pos] == _ANY:
                out: npt.NDArray[np.bool_] = valid.copy()
                return out
            else:
                overlap |= (low <= vals[pos]) & (vals[pos] <= high)
                pos += 1
            if types[pos] != _CHAR_ALT:
                break
        res: npt.NDArray[np.bool_] = valid & (overlap if positive else ~overlap)
        return res

    def partial_ok(self, state: int, partial: Partial) -> bool:
        """``llama_grammar_match_partial_char`` over the state's stacks: could some stack
        accept a code point that the partial UTF-8 sequence ``partial`` completes to?"""
        if type(state) is not int:
            state = expect_int("state", state)
        if type(partial) is not tuple or len(partial) != 2:
            raise _bad_partial(partial)
        value, n_remain = partial
        if state == DEAD or n_remain < 0 or (n_remain == 1 and value < 2):
            return False
        low = value << (n_remain * 6)
        high = low | ((1 << (n_remain * 6)) - 1)
        if low == 0:
            if n_remain == 2:
                low = 1 << 11
            elif n_remain == 3:
                low = 1 << 16
        types, values = self.types, self.values
        for stack in self.stacks(state):
            if not stack or types[stack[-1]] in (_TOKEN, _TOKEN_NOT):
                continue
            pos = stack[-1]
            positive = types[pos] in (_CHAR, _ANY)
            hit = None
            while True:
                if types[pos + 1] == _RNG:
                    if values[pos] <= high and low <= values[pos + 1]:
                        hit = positive
                        break
                    pos += 2
                elif types[pos] == _ANY:
                    hit = True
                    break
                else:
                    if low <= values[pos] <= high:
                        hit = positive
                        break
                    pos += 1
                if types[pos] != _CHAR_ALT:
                    break
            if hit is None:
                hit = not positive
            if hit:
                return True
        return False


_LIB: Any = None


def _lib() -> Any:
    """``llama_cffi._binding.lib`` (imported on first use: the Python core needs no extension)."""
    global _LIB
    if _LIB is None:
        from llama_cffi._binding import lib

        _LIB = lib
    return _LIB
