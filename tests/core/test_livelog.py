"""The live view of an attempt's output: masked, stripped, clipped, and unable to flood its destination."""

from __future__ import annotations

from trainguard.core.reports.livelog import LiveLog
from trainguard.core.masking import Masker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_line_is_shown_masked_without_terminal_sequences_and_clipped() -> None:
    shown: list[str] = []
    live = LiveLog(shown.append, masker=Masker({"hunter2secret"}), max_chars=40)
    live("\x1b[31mloss 0.5\x1b[0m\x1b]0;owned\x07 password hunter2secret")
    live("x" * 100)
    assert shown[0] == "loss 0.5 password ***"
    assert shown[1] == "x" * 40 + "… (60 more characters)"


def test_a_flood_passes_at_the_steady_rate_and_says_how_many_lines_it_left_out() -> None:
    shown: list[str] = []
    clock = Clock()
    live = LiveLog(shown.append, lines_per_second=10, burst=5, masker=Masker(()), clock=clock)
    for n in range(1000):  # all at one instant: only the burst passes
        live(f"step {n}")
    assert shown == [f"step {n}" for n in range(5)] and live.left_out == 995
    clock.now = 0.1  # one line's worth of rate later
    live("step 1000")
    assert shown[5:] == ["trainguard: 995 lines not shown live (the attempt's log keeps them)", "step 1000"]
    for n in range(3):
        live(f"late {n}")
    live.close()
    assert shown[-1] == "trainguard: 3 lines not shown live (the attempt's log keeps them)"
    assert live.left_out_total == 998 and live.shown == 6
