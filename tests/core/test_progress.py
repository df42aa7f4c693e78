"""The log's progress points (`trainguard.core.progress`): the shapes frameworks print, bounded on hostile logs."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest
from hostile import within

from trainguard.core import progress


@pytest.mark.parametrize(("line", "point"), [
    ("step 120/400 loss 0.5312", (120, 0.5312)),
    ("{'loss': 0.53, 'step': 120}", (120, 0.53)),
    ("Epoch 3 | step 120 | loss=0.53", (120, 0.53)),
    ('{"global_step": 7, "train_loss": 1.5e-3}', (7, 0.0015)),
    ("iteration: 42", (42, None)),
    ("step 9 loss nan", (9, None)),      # a diverged loss is a gap in the chart, never NaN in JSON
    ("step 9 loss -inf", (9, None)),
])
def test_the_shapes_frameworks_print_give_a_step_and_their_loss(line: str, point: tuple[int, float | None]) -> None:
    assert progress.parse_line(line) == point


@pytest.mark.parametrize("line", ["loss 0.5 without a step", "stepping out", "steps: many", ""])
def test_a_line_without_a_step_gives_no_point(line: str) -> None:
    assert progress.parse_line(line) is None


def test_a_long_run_is_thinned_evenly_to_the_limit_and_keeps_where_it_got_to(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("".join(f"step {n} loss {1 / (n + 1):.4f}\n" for n in range(10_007)))

    points = progress.read_points(log, limit=48)

    steps = [step for step, _ in points]
    assert len(points) == 48 and steps == sorted(steps)
    assert steps[0] == 0 and steps[-1] == 10_006  # the last point is the attempt's last step, always shown
    gaps = {b - a for a, b in zip(steps, steps[1:-1])}
    assert max(gaps) <= 2 * min(gaps), gaps


def test_text_and_a_file_read_the_same(tmp_path: Path) -> None:
    text = "boot\nstep 1 loss 2.0\nnoise step\nstep 2 loss 1.5\n"
    (tmp_path / "train.log").write_text(text)
    assert progress.read_points(text) == progress.read_points(tmp_path / "train.log") == [(1, 2.0), (2, 1.5)]


def test_an_overlong_line_and_undecodable_bytes_cost_neither_the_points_nor_the_memory(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    with log.open("wb") as out:
        out.write(b"step 1 loss 0.9\n")
        out.write(b"step 2 \xff\xfe loss 0.8\n")
        out.write(b"x" * (32 * 1024 * 1024) + b" step 999999 loss 0.0\n")  # 32 MB on one line: its tail is not read
        out.write(b"step 3 loss 0.7\n")

    tracemalloc.start()
    try:
        points = progress.read_points(log)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert points == [(1, 0.9), (2, 0.8), (3, 0.7)]
    assert peak < 2 * 1024 * 1024, f"{peak} bytes held to read a log with a 32 MB line"


def test_a_fifo_or_a_missing_log_gives_no_points_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "train.log"
    os.mkfifo(fifo)  # nobody writes it: opening it to read would wait for ever

    assert within(10, lambda: progress.read_points(fifo), "reading a FIFO left as the log") == []
    assert progress.read_points(tmp_path / "gone.log") == []
    assert progress.read_points(None) == []
