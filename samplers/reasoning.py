"""Reasoning models: a reply's reasoning (``<think>...</think>``, or the markers its template
uses: :func:`llama_cffi.chat.reasoning_format`) split from its content, and a budget on it.

* :func:`split_reasoning`: ``(reasoning, content)`` of a reply's text, as llama.cpp's chat
  parser gives ``reasoning_content`` and ``content`` (both trimmed of surrounding
  whitespace). A reply whose prompt opened the block (Qwen3's and DeepSeek-R1's
  generation prompts end with ``<think>``) starts inside it. A block that never closes is
  all reasoning, as llama.cpp's parser reads an unfinished one.
* :class:`ReasoningBudget`: llama.cpp's reasoning-budget sampler
  (``common/reasoning-budget.cpp``), state for state: after the start sequence it counts
  the tokens inside the block; at the budget (once the last token completes its UTF-8
  character) it forces the forced sequence (an optional message, then the end marker)
  token by token, every other logit ``-inf``; a natural end sequence stops the count;
  a new start sequence re-arms it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from llama_cffi._args import expect_bool, expect_int, expect_iterable, type_error
from llama_cffi.chat import ReasoningFormat
from llama_cffi.errors import ParamError

from .base import Sampler
from .candidates import Candidates, check_candidates

if TYPE_CHECKING:
    from llama_cffi import Model

__all__ = ["ReasoningBudget", "reasoning_budget_for", "split_reasoning"]

#: The budget sampler's states (``common_reasoning_budget_state``).
IDLE, COUNTING, FORCING, WAITING_UTF8, DONE = "idle", "counting", "forcing", "waiting_utf8", "done"


def split_reasoning(text: str, fmt: ReasoningFormat | None, opened: bool = False) -> tuple[str, str]:
    """``(reasoning, content)`` of a reply's ``text`` under the markers ``fmt`` (None: no
    reasoning); ``opened``: the prompt opened the block, so the text starts inside it."""
    if not isinstance(text, str):
        raise type_error("text", "a str", text)
    opened = expect_bool("opened", opened)
    if fmt is None:
        return "", text
    if not isinstance(fmt, ReasoningFormat):
        raise type_error("fmt", "a llama_cffi.chat.ReasoningFormat or None", fmt)
    body = text
    if not opened:
        lead = text.lstrip()
        if not lead.startswith(fmt.start):
            return "", text
        body = lead[len(fmt.start) :]
    end = body.find(fmt.end)
    if end < 0:
        return body.strip(), ""
    return body[:end].strip(), body[end + len(fmt.end) :].strip()


class _Matcher:
    """Token sequences found as they end (llama.cpp's Aho-Corasick ``token_matcher``: the
    longest sequence ending at the token, matching restarts after a match)."""

    __slots__ = ("longest", "seqs", "window")

    def __init__(self, seqs: Sequence[Sequence[int]]) -> None:
        uniq: list[tuple[int, ...]] = []
        for s in seqs:
            t = tuple(int(x) for x in s)
            if t and t not in uniq:
                uniq.append(t)
        self.seqs = uniq
        self.longest = max((len(s) for s in uniq), default=0)
        self.window: list[int] = []

    def advance(self, token: int) -> int:
        """The index of the longest sequence ending at ``token`` (since the last match or
        reset), or -1."""
        if not self.seqs:
            return -1
        w = self.window
        w.append(token)
        if len(w) > self.longest:
            del w[0]
        best, best_len = -1, 0
        for i, s in enumerate(self.seqs):
            n = len(s)
            if best_len < n <= len(w) and tuple(w[-n:]) == s:
                best, best_len = i, n
        if best >= 0:
            w.clear()
        return best

    def reset(self) -> None:
        self.window.clear()


class ReasoningBudget(Sampler):
    """Limit the tokens of a reasoning block to ``budget`` (see the module docstring).

    ``start_seqs`` / ``end_seqs``: token sequences that open / close the block (the
    markers tokenized); ``forced``: what is forced at the budget (a message and the first
    end sequence); ``is_partial(token)``: whether a token leaves a UTF-8 character
    incomplete (the vocabulary's, with :func:`reasoning_budget_for`; None: never);
    ``state``: ``"idle"`` (waiting for a start sequence) or ``"counting"`` (the prompt
    opened the block). Put it first in a chain: it forces a token by making every other
    logit ``-inf``."""

    name = "reasoning-budget"

    def __init__(
        self,
        start_seqs: Sequence[Sequence[int]],
        end_seqs: Sequence[Sequence[int]],
        forced: Sequence[int],
        budget: int,
        *,
        is_partial: Any = None,
        state: str = IDLE,
    ) -> None:
        for name, seqs in (("start_seqs", start_seqs), ("end_seqs", end_seqs)):
            expect_iterable(name, seqs, "a sequence of token sequences")
            for s in seqs:
                expect_iterable(name, s, "a sequence of token sequences")
        expect_iterable("forced", forced, "a sequence of token ids")
        self.budget = expect_int("budget", budget)
        if is_partial is not None and not callable(is_partial):
            raise type_error("is_partial", "a callable or None", is_partial)
        if state not in (IDLE, COUNTING):
            raise ParamError(f"state must be {IDLE!r} or {COUNTING!r}, not {state!r}")
        self.start = _Matcher(start_seqs)
        self.end = _Matcher(end_seqs)
        self.forced = [expect_int("forced", t) for t in forced]
        self.is_partial = is_partial
        self.initial = state
        self.state = state
        self.remaining = self.budget
        self.force_pos = 0
        if state == COUNTING and self.remaining <= 0:
            self.state = FORCING

    def _params(self) -> dict[str, Any]:
        return {"budget": self.budget, "state": self.state}

    def accept(self, token: int) -> None:
        token = expect_int("token", token)
        st = self.state
        if st == IDLE:
            if self.start.advance(token) >= 0:
                self._arm()
        elif st in (COUNTING, WAITING_UTF8):
            if self.end.advance(token) >= 0:
                self.state = DONE
                return
            complete = self.is_partial is None or not self.is_partial(token)
            if st == WAITING_UTF8:
                if complete:
                    self._force()
            else:
                self.remaining -= 1
                if self.remaining <= 0:
                    if complete:
                        self._force()
                    else:
                        self.state = WAITING_UTF8
                        self.end.reset()
        elif st == FORCING:
            self.end.advance(token)
            self.force_pos += 1
            if self.force_pos >= len(self.forced):
                self.state = DONE
        elif self.start.advance(token) >= 0:  # DONE: a new block re-arms the budget
            self.end.reset()
            self._arm()

    def _arm(self) -> None:
        self.state = COUNTING
        self.remaining = self.budget
        if self.remaining <= 0:
            self.state = FORCING
            self.force_pos = 0

    def _force(self) -> None:
        self.state = FORCING
        self.force_pos = 0
        self.end.reset()

    def apply(self, cands: Candidates) -> None:
        check_candidates(cands)
        if self.state != FORCING or self.force_pos >= len(self.forced):
            return
        forced = self.forced[self.force_pos]
        ids = cands.read_ids()
        lg = cands.logits
        keep = ids == forced
        lg[~keep] = -np.inf
        cands.sorted = False

    def reset(self) -> None:
        self.state = IDLE
        self.remaining = self.budget
        self.start.reset()
        self.end.reset()
        self.force_pos = 0


def reasoning_budget_for(
    model: Model, fmt: ReasoningFormat, budget: int, *, message: str = "", opened: bool = False
) -> ReasoningBudget:
    """The budget sampler for ``model`` and the markers ``fmt``, as llama-server sets it up
    (``tools/server``: the start marker and the end marker tokenized with special tokens
    parsed; the forced sequence is ``message`` then the end marker); ``opened``: the
    prompt opened the block (counting from the first token)."""
    from llama_cffi import Model

    if not isinstance(model, Model):
        raise type_error("model", "a llama_cffi.Model", model)
    if not isinstance(fmt, ReasoningFormat):
        raise type_error("fmt", "a llama_cffi.chat.ReasoningFormat", fmt)
    if not isinstance(message, str):
        raise type_error("message", "a str", message)
    opened = expect_bool("opened", opened)
    vocab = model.vocab

    def toks(text: str) -> list[int]:
        return [int(t) for t in vocab.tokenize(text, add_special=False, parse_special=True)]

    end = toks(fmt.end)
    forced = (toks(message) if message else []) + end

    def is_partial(token: int) -> bool:
        piece = vocab.token_to_piece(token)
        try:
            piece.decode("utf-8")
        except UnicodeDecodeError as e:
            return e.reason == "unexpected end of data"
        return False

    return ReasoningBudget(
        [toks(fmt.start)], [end], forced, budget, is_partial=is_partial, state=COUNTING if opened else IDLE
    )
