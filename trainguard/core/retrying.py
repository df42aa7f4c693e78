"""Retrying a call that is safe to repeat, when it fails in a way that may pass.

Only for calls whose repetition cannot do a thing twice (an idempotency key, a read, a
create-or-get): the caller says which errors are transient; anything else is raised at once, so a
configuration problem (403, 404, a bad parameter) is never hidden behind retries.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def call_with_retries(
    call: Callable[[], T],
    is_transient: Callable[[BaseException], bool],
    *,
    attempts: int = 6,
    first_delay_seconds: float = 1.0,
    max_delay_seconds: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
) -> T:
    """Return `call()`, calling it again after a transient error, at most `attempts` times in all.

    The delay doubles from `first_delay_seconds` up to `max_delay_seconds`. The last transient
    error is raised when the attempts are spent.

    Args:
        call: The repeatable call.
        is_transient: Says whether an error may pass if the call is made again.
        attempts: Calls in all, the first included.
        first_delay_seconds: Wait before the second call.
        max_delay_seconds: Longest wait between two calls.
        sleep: How to wait (injected for tests).
        on_retry: Told (call number, error, delay) before each wait, e.g. to log it.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    delay = first_delay_seconds
    for number in range(1, attempts + 1):
        try:
            return call()
        except Exception as exc:
            if number == attempts or not is_transient(exc):
                raise
            if on_retry is not None:
                on_retry(number, exc, delay)
            sleep(delay)
            delay = min(delay * 2, max_delay_seconds)
    raise AssertionError("unreachable: the loop returns or raises")


__all__ = ["call_with_retries"]
