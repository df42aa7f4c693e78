"""When a backend says what it waits for: the growing intervals of `WaitNotice`, and how a wait reads."""

from __future__ import annotations

import pytest

from trainguard.core.backends.waits import WaitNotice, said_while, span
from waiting import wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_wait_is_reported_after_5_then_10_20_40_seconds_and_then_at_most_every_2_minutes() -> None:
    clock = Clock()
    notice = WaitNotice(clock=clock)
    said = []
    for _ in range(4001):  # a look every 0.25 s for 1000 s, waiting all along
        found = notice.due(True)
        if found is not None:
            said.append(round(found))
        clock.now += 0.25
    assert said == [5, 10, 20, 40, 80, 160, 280, 400, 520, 640, 760, 880, 1000]


def test_a_wait_that_ended_starts_over_and_a_short_one_is_never_reported() -> None:
    clock = Clock()
    notice = WaitNotice(clock=clock)
    assert notice.due(True) is None
    clock.now += 4.9
    assert notice.due(True) is None  # 4.9 s: not yet
    assert notice.due(False) is None  # it ended: nothing to say
    clock.now += 1
    assert notice.due(True) is None  # a new wait, from zero
    clock.now += 5
    assert notice.due(True) == 5


def test_a_late_look_says_one_line_for_the_intervals_it_missed() -> None:
    clock = Clock()
    notice = WaitNotice(clock=clock)
    notice.due(True)
    clock.now += 50  # the caller was busy past 5, 10, 20 and 40 s
    assert notice.due(True) == 50
    clock.now += 29
    assert notice.due(True) is None  # the next is at 80 s
    clock.now += 1
    assert notice.due(True) == 80


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (7.9, "7s"), (95, "95s"), (245, "4m05s"), (600, "10m00s"), (3720, "1h02m"), (-3, "0s")])
def test_a_wait_reads_in_seconds_then_minutes_then_hours(seconds: float, text: str) -> None:
    assert span(seconds) == text


def test_a_blocking_wait_is_said_from_a_thread_until_it_ends() -> None:
    said: list[str] = []
    with said_while(said.append, lambda waited: f"waiting {span(waited)} for the collector", first_seconds=0.1,
                    tick_seconds=0.02):
        wait_for(lambda: len(said) >= 2, timeout=10, what="two lines while the block runs")
    assert said[:2] == ["waiting 0s for the collector"] * 2  # after 0.1 s and 0.2 s


def test_a_quick_blocking_call_says_nothing_and_a_broken_sink_breaks_nothing() -> None:
    said: list[str] = []
    with said_while(said.append, lambda waited: "never", first_seconds=60):
        pass
    assert said == []

    def broken(line: str) -> None:
        raise OSError("the log's disk is full")

    calls: list[float] = []
    with said_while(broken, lambda waited: calls.append(waited) or "line", first_seconds=0.05, tick_seconds=0.01):
        wait_for(lambda: calls, timeout=10, what="the sink tried once")
    assert len(calls) == 1  # not asked again after it failed
