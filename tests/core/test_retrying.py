"""Repeating a repeatable call after transient errors, and only after those; waiting on a call at most so long."""

from __future__ import annotations

import threading

import pytest
from waiting import wait_for

from trainguard.core import retrying
from trainguard.core.retrying import call_with_retries


class Flaky:
    """Raises the given errors in turn, then returns 'done'."""

    def __init__(self, *errors: Exception) -> None:
        self.errors, self.calls = list(errors), 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def transient(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionError)


def test_transient_errors_are_retried_with_doubling_capped_delays_until_the_call_succeeds():
    slept: list[float] = []
    call = Flaky(*(ConnectionError("reset") for _ in range(4)))
    assert call_with_retries(call, transient, first_delay_seconds=1, max_delay_seconds=5, sleep=slept.append) == "done"
    assert call.calls == 5 and slept == [1, 2, 4, 5]


def test_a_non_transient_error_is_raised_at_once_without_waiting():
    slept: list[float] = []
    call = Flaky(PermissionError("403 forbidden"))
    with pytest.raises(PermissionError):
        call_with_retries(call, transient, sleep=slept.append)
    assert call.calls == 1 and slept == []


def test_the_last_transient_error_is_raised_when_the_attempts_are_spent_and_each_retry_is_reported():
    seen: list[tuple[int, str, float]] = []
    call = Flaky(ConnectionError("first"), ConnectionError("second"), ConnectionError("third"))
    with pytest.raises(ConnectionError, match="third"):
        call_with_retries(call, transient, attempts=3, sleep=lambda s: None,
                          on_retry=lambda n, exc, delay: seen.append((n, str(exc), delay)))
    assert call.calls == 3 and seen == [(1, "first", 1.0), (2, "second", 2.0)]


def test_fewer_than_one_attempt_is_refused():
    with pytest.raises(ValueError, match="attempts must be at least 1"):
        call_with_retries(Flaky(), transient, attempts=0)


def test_call_within_returns_the_answer_or_raises_what_the_call_raised() -> None:
    assert retrying.call_within(lambda: 42, timeout_seconds=5) == 42
    with pytest.raises(KeyError, match="gone"):
        retrying.call_within(lambda: {}["gone"], timeout_seconds=5)


def test_call_within_stops_waiting_on_a_call_that_does_not_answer_and_leaves_it_running() -> None:
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def hangs() -> None:
        started.set()
        release.wait(30)
        finished.set()

    with pytest.raises(retrying.CallTimedOut):
        retrying.call_within(hangs, timeout_seconds=0.05)

    assert started.is_set() and not finished.is_set()  # given up on, not stopped
    release.set()
    wait_for(finished.is_set, what="the abandoned call to end once let go")
