"""A one-line text progress bar for the command line (model loading, perplexity, benchmarks).

Drawn on ``stream`` (stderr by default) only when it is a terminal, so logs, pipes and
CI output never fill with carriage returns; ``force=True`` draws anyway. Thread-safe
enough for llama.cpp's progress callback, which is called on the loading thread.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from ._args import expect_bool, expect_int, expect_number, expect_str, type_error

__all__ = ["ProgressBar"]


class ProgressBar:
    """``bar = ProgressBar("loading"); bar.update(0.5); bar.close()``; also a context
    manager. ``update(fraction)`` takes a fraction in ``[0, 1]`` (clamped) and an
    optional ``note`` shown after the percentage; redraws at most every ``interval``
    seconds (and always at 100%)."""

    def __init__(
        self, label: str, stream: TextIO | None = None, width: int = 30, interval: float = 0.1, force: bool = False
    ) -> None:
        self.label = expect_str("label", label)
        if stream is not None and not callable(getattr(stream, "write", None)):
            raise type_error("stream", "a text stream (with write()), or None", stream)
        self.stream = stream if stream is not None else sys.stderr
        self.width = expect_int("width", width)
        self.interval = expect_number("interval", interval, "a number of seconds")
        force = expect_bool("force", force)
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = force or bool(isatty and isatty())
        self._last = 0.0
        self._drawn = False
        self.fraction = 0.0

    def update(self, fraction: float, note: str = "") -> None:
        f = min(max(expect_number("fraction", fraction), 0.0), 1.0)
        expect_str("note", note)
        self.fraction = f
        if not self.enabled:
            return
        now = time.monotonic()
        if f < 1.0 and now - self._last < self.interval:
            return
        self._last = now
        filled = round(f * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(f"\r{self.label} [{bar}] {f * 100:5.1f}%{(' ' + note) if note else ''}\x1b[K")
        self.stream.flush()
        self._drawn = True

    def callback(self, fraction: float) -> bool:
        """For ``Model.load(..., progress_callback=bar.callback)``: draws, never cancels."""
        self.update(expect_number("fraction", fraction))
        return True

    def close(self) -> None:
        """Erase the bar (the line is left empty for what is printed next)."""
        if self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
