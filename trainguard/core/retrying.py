"""Retrying a call that is safe to repeat, when it fails in a way that may pass; waiting on one at most so long.

Only for calls whose repetition cannot do a thing twice (an idempotency key, a read, a
create-or-get): the caller says which errors are transient; anything else is raised at once, so a
configuration problem (403, 404, a bad parameter) is never hidden behind retries.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class CallTimedOut(TimeoutError):
    """`call_within` stopped waiting; the call goes on in its own thread and its result is dropped."""


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


def call_within(call: Callable[[], T], timeout_seconds: float) -> T:
    """Return `call()`, or raise `CallTimedOut` once `timeout_seconds` passed without an answer.

    The call runs in a daemon thread, so a request that hangs past the timeout neither holds
    the caller nor keeps the process alive at exit. What the call raises is raised here. The
    caller must give it nothing that the caller changes afterwards: it may still be running.
    """
    if timeout_seconds <= 0:
        raise CallTimedOut("no time left")
    answer: list[tuple[bool, object]] = []
    finished = threading.Event()

    def run() -> None:
        try:
            answer.append((True, call()))
        except BaseException as exc:  # handed to the caller, who decides
            answer.append((False, exc))
        finally:
            finished.set()

    threading.Thread(target=run, name="trainguard-call-within", daemon=True).start()
    if not finished.wait(timeout_seconds):
        raise CallTimedOut(f"no answer within {timeout_seconds:g} s")
    ok, value = answer[0]
    if not ok:
        assert isinstance(value, BaseException)
        raise value
    return value  # type: ignore[return-value]


__all__ = ["CallTimedOut", "call_with_retries", "call_within"]
