"""The entrypoint's progress watch: progress wherever the command writes it, and a hang's first signs.

Real files in a temporary folder; the clock is the test's, so each poll is one observed moment.
"""

from __future__ import annotations

import json
from pathlib import Path

CORPUS = Path(__file__).parents[1] / "triage" / "corpus" / "pytorch.jsonl"

from trainguard_entrypoint.progress import HEARTBEAT, ProgressWatch


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _watch(tmp_path: Path, clock: Clock, **fields: object) -> tuple[ProgressWatch, list[str], list[str]]:
    said: list[str] = []
    hangs: list[str] = []
    (tmp_path / "logs").mkdir()
    (tmp_path / "ranks").mkdir()
    watch = ProgressWatch(console_log=tmp_path / "logs" / "train.log", folders=[tmp_path / "ranks"],
                          record=tmp_path / "progress.json", heartbeat_seconds=10, say=said.append,
                          on_hang=hangs.append, clock=clock, **fields)  # type: ignore[arg-type]
    watch._last_console = watch._last_progress = watch._last_heartbeat = clock.now
    return watch, said, hangs


def test_rank_logs_that_grow_while_the_console_is_quiet_are_announced_once_per_period(tmp_path: Path) -> None:
    clock = Clock()
    watch, said, _ = _watch(tmp_path, clock)
    rank_log = tmp_path / "ranks" / "run_0" / "attempt_0" / "1" / "stdout.log"
    rank_log.parent.mkdir(parents=True)
    for second in range(1, 31):
        clock.now += 1
        with rank_log.open("a") as handle:
            handle.write(f"step {second}\n")
        watch.poll()
    assert len(said) == 3 and all(line.startswith(HEARTBEAT) and "stdout.log" in line for line in said)
    assert json.loads((tmp_path / "progress.json").read_text())["what"].endswith("stdout.log")


def test_a_console_that_speaks_needs_no_heartbeat(tmp_path: Path) -> None:
    clock = Clock()
    watch, said, _ = _watch(tmp_path, clock)
    (tmp_path / "ranks" / "f.log").write_text("")
    for second in range(30):
        clock.now += 1
        with (tmp_path / "logs" / "train.log").open("a") as handle:
            handle.write(f"step {second}\n")
        (tmp_path / "ranks" / "f.log").write_text("x" * second)
        watch.poll()
    assert said == []  # the moment it would have been said came and went: thirty polls with files moving


def test_silence_everywhere_asks_for_the_stacks_before_the_stall_window_ends_and_only_once(tmp_path: Path) -> None:
    clock = Clock()
    watch, _, hangs = _watch(tmp_path, clock, stall_seconds=100)
    clock.now += 79
    watch.poll()
    assert hangs == []  # not yet: 79 s of a 100 s window
    clock.now += 1
    watch.poll()
    clock.now += 10
    watch.poll()
    assert len(hangs) == 1 and "nothing moved for 80s of a 100s stall window" in hangs[0]


def test_a_peer_timeout_in_any_rank_log_asks_for_the_stacks_at_once(tmp_path: Path) -> None:
    clock = Clock()
    watch, _, hangs = _watch(tmp_path, clock, stall_seconds=3600)
    rank_log = tmp_path / "ranks" / "stderr.log"
    rank_log.write_bytes(b"step 1\n")
    watch.poll()
    assert hangs == []
    logs = (json.loads(line).get("log") or "" for line in CORPUS.read_text().splitlines())
    hang = next(log for log in logs if "Timed out waiting" in log)  # a real run's output, kept by the triage tests
    with rank_log.open("ab") as handle:
        handle.write(hang.encode())
    clock.now += 1
    watch.poll()
    assert len(hangs) == 1 and "Timed out waiting 4000ms for" in hangs[0]


def test_a_hang_after_the_job_moved_again_asks_for_the_stacks_again(tmp_path: Path) -> None:
    clock = Clock()
    watch, _, hangs = _watch(tmp_path, clock, stall_seconds=10)
    clock.now += 9
    watch.poll()
    assert len(hangs) == 1  # a slow start looked like a hang
    (tmp_path / "ranks" / "rank-0.log").write_text("step 1\n")
    clock.now += 1
    watch.poll()
    clock.now += 5
    watch.poll()
    assert len(hangs) == 1  # moving again, and not yet quiet for most of the window
    clock.now += 4
    watch.poll()
    assert len(hangs) == 2 and watch.last_progress == clock.now - 9


def test_the_peer_timeout_that_ends_a_hang_whose_stacks_were_taken_is_not_progress(tmp_path: Path) -> None:
    """Silence took the stacks while the ranks waited; the timeout the waiting ranks then raise is that
    hang ending: asking again would sweep ranks already unwinding and replace the stacks on record."""
    clock = Clock()
    watch, _, hangs = _watch(tmp_path, clock, stall_seconds=22)
    clock.now += 18
    watch.poll()
    assert len(hangs) == 1 and "nothing moved" in hangs[0]
    logs = (json.loads(line).get("log") or "" for line in CORPUS.read_text().splitlines())
    timeout = next(log for log in logs if "Timed out waiting" in log)
    (tmp_path / "logs" / "train.log").write_text(timeout)
    clock.now += 2
    watch.poll()
    assert len(hangs) == 1 and watch.last_progress == clock.now - 20  # still when the silence began
