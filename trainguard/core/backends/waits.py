"""When to say what a wait is for: no wait longer than a few seconds is silent.

A backend that waits on something outside it (a pod the scheduler has not placed, an image being
pulled, a Slurm job pending in the queue, the evidence collector's pod) asks a `WaitNotice`, on
each look, whether a line is due; it is after 5 s of waiting, then 10 s, 20 s, 40 s..., the
interval doubling up to a cap, so a long wait costs a line every few minutes and a short one costs
none. What the line says (what is missing, the platform's last word) is the backend's; `span`
writes the wait so far. A wait inside one blocking call (collecting evidence, starting a server) is
said from a thread by `said_while`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

FIRST_SECONDS = 5.0
CAP_SECONDS = 120.0  # the longest interval between two lines about one wait


class WaitNotice:
    """The schedule of lines about one wait: due at 5, 10, 20, 40, 80, 160, 280 s..., over when the wait is.

    Args:
        first_seconds: How long a wait lasts before its first line.
        cap_seconds: The longest interval between two lines.
        clock: Monotonic seconds, injectable for tests.
    """

    def __init__(self, first_seconds: float = FIRST_SECONDS, cap_seconds: float = CAP_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.first, self.cap, self.clock = first_seconds, cap_seconds, clock
        self.started: float | None = None
        self.next = first_seconds

    def due(self, waiting: bool) -> float | None:
        """The wait so far when a line is due now, else None. A look that finds no wait ends it."""
        now = self.clock()
        if not waiting:
            self.started = None
            return None
        if self.started is None:
            self.started, self.next = now, self.first
        elapsed = now - self.started
        if elapsed < self.next:
            return None
        while self.next <= elapsed:  # a late look says one line, not one per missed interval
            self.next = min(self.next * 2, self.next + self.cap)
        return elapsed


@contextlib.contextmanager
def said_while(say: Callable[[str], None], what: Callable[[float], str], *, first_seconds: float = FIRST_SECONDS,
               tick_seconds: float = 0.25, clock: Callable[[], float] = time.monotonic) -> Iterator[None]:
    """Run the block while a thread says ``what(waited so far)`` at `WaitNotice`'s moments (none if it is quick).

    Args:
        say: Shows one line; a sink that raises is not called again.
        what: The line for the wait so far.
        first_seconds: How long the block may take before its first line.
        tick_seconds: How often the thread looks.
        clock: Monotonic seconds.
    """
    notice, done = WaitNotice(first_seconds, clock=clock), threading.Event()

    def tick() -> None:
        notice.due(True)
        while not done.wait(tick_seconds):
            waited = notice.due(True)
            if waited is None or done.is_set():
                continue
            try:
                say(what(waited))
            except Exception:  # a broken sink must not break what is being waited for
                return

    thread = threading.Thread(target=tick, daemon=True, name="trainguard-waiting")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(tick_seconds * 4)


def span(seconds: float) -> str:
    """A wait's length as people read it: "7s", "95s", "4m05s", "1h02m"."""
    total = max(0, int(seconds))
    if total < 120:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m{total % 60:02d}s"
    return f"{total // 3600}h{total % 3600 // 60:02d}m"
