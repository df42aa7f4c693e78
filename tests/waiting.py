"""The one way tests wait: poll an observable state until it holds, or fail saying what never came.

Tests never sleep a fixed time and then assert; they wait for the state they need. A test that
asserts something did *not* happen first waits for the moment it would have happened.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], timeout: float = 20.0, what: str | Callable[[], str] = "",
             interval: float = 0.05) -> T:
    """Call `probe` until it returns something truthy and return that; fail after `timeout` seconds.

    Args:
        probe: Reads the state; returns a truthy value once the state holds.
        timeout: Seconds before the wait fails.
        what: Words naming the awaited state, for the failure message (or a callable giving them then,
            to say what the state was instead).
        interval: Seconds between probes (kept small: a probe is cheap, a slow test is not).
    """
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() >= deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g}s waiting for {said or probe}")
        time.sleep(interval)
