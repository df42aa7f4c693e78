"""The live view of a running attempt's output: each line masked, stripped, clipped and rate-limited.

Every backend hands its output lines to one `LiveLog` (the `on_line` sink of `Backend.run`), which
passes them on to wherever the flow shows them (the flow run's logger). The text is untrusted:
secrets are masked, terminal sequences dropped and long lines clipped before anything is shown, and
a chatty command cannot flood the log's destination: beyond a burst, lines pass at a steady rate and
the ones left out are counted and said once the view catches up. The attempt's own log file keeps
every line; this is only the view. Where the lines go is the caller's concern.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from trainguard.core import masking

MAX_LINE_CHARS = 2000
LINES_PER_SECOND = 20.0
BURST_LINES = 200


class LiveLog:
    """A thread-safe line sink (`Backend.run`'s `on_line`) over `emit`.

    Args:
        emit: Shows one line (e.g. the run logger's `info`); called under a lock, one line at a time.
        lines_per_second: The steady rate at which lines pass once the burst is spent.
        burst: Lines that may pass at once (the start of a run, a traceback).
        max_chars: Longer lines are clipped, saying how much was left out.
        masker: Masks secrets; the process's current masker when None (resolved per line, so
            secrets registered after the sink was made are masked too).
        clock: Monotonic seconds, injectable for tests.
    """

    def __init__(
        self, emit: Callable[[str], None], *, lines_per_second: float = LINES_PER_SECOND, burst: int = BURST_LINES,
        max_chars: int = MAX_LINE_CHARS, masker: masking.Masker | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._emit, self._rate, self._burst, self._max = emit, lines_per_second, float(burst), max_chars
        self._masker, self._clock = masker, clock
        self._lock = threading.Lock()
        self._tokens, self._last = float(burst), clock()
        self.shown = 0
        self.left_out = 0  # lines not shown since the last line that was
        self.left_out_total = 0

    def __call__(self, line: str) -> None:
        with self._lock:
            now = self._clock()
            self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
            self._last = now
            if self._tokens < 1.0:  # dropped before any masking: a flood costs next to nothing
                self.left_out += 1
                self.left_out_total += 1
                return
            self._tokens -= 1.0
            if self.left_out:
                self._emit(f"trainguard: {self.left_out} lines not shown live (the attempt's log keeps them)")
                self.left_out = 0
            self._emit(self._clean(line))
            self.shown += 1

    def close(self) -> None:
        """Say how many of the last lines were not shown (call once the attempt ended)."""
        with self._lock:
            if self.left_out:
                self._emit(f"trainguard: {self.left_out} lines not shown live (the attempt's log keeps them)")
                self.left_out = 0

    def _clean(self, line: str) -> str:
        # masked before clipping, so a secret cut in two by the clip is never half shown
        text = (self._masker or masking.current()).for_people(line)
        if len(text) > self._max:
            text = f"{text[:self._max]}… ({len(text) - self._max} more characters)"
        return text
