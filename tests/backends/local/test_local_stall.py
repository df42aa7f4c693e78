"""The local runner's stall window over real processes: what counts as progress and what does not.

A job may write its progress only to files (torchrun's rank logs, a checkpoint folder): the
entrypoint's heartbeat says so and the window counts it, but nobody sees it. The entrypoint's own
notes (the stacks it took, a warning) are no progress: a hung command's entrypoint writes them too.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from trainguard.core.backends.local.runner import LocalProcessRunner
from trainguard.core.backends.workspace import AttemptWorkspace
from trainguard_entrypoint.progress import HEARTBEAT
from waiting import wait_for


@pytest.fixture
def workspace(tmp_path: Path) -> AttemptWorkspace:
    return AttemptWorkspace.create(tmp_path / "work", "run-1", 1)


def test_a_job_that_writes_only_to_its_rank_logs_is_not_stalled_and_the_heartbeat_is_not_shown(workspace) -> None:
    ranks = workspace.root / "ranks"
    code = ("import os, sys, time\n"
            "path = os.path.join(os.environ['PET_LOG_DIR'], 'rank-0.log')\n"
            "os.makedirs(os.path.dirname(path), exist_ok=True)\n"
            "for step in range(24):\n"
            "    with open(path, 'a') as fh: fh.write(f'step {step}\\n')\n"
            "    time.sleep(0.5)\n")
    lines: list[str] = []
    runner = LocalProcessRunner(grace_seconds=2.0, poll_interval_seconds=0.05, on_line=lines.append)
    outcome = runner.run([sys.executable, "-c", code], workspace=workspace, stall_seconds=5.0, deadline_seconds=120,
                         env={"PET_LOG_DIR": str(ranks), "TRAINGUARD_STALL_SECONDS": "5"})
    assert (outcome.reason, outcome.exit_code) == ("Completed", 0), outcome.message
    assert outcome.duration_seconds > 10  # the window came and went twice over while the console was silent
    assert (ranks / "rank-0.log").read_text().count("step") == 24
    assert not any(HEARTBEAT in line for line in lines) and not any(HEARTBEAT in line for line in outcome.output_tail)
    assert "rank-0.log" in (workspace.root / "progress.json").read_text()  # what said it moved


def test_the_entrypoints_own_notes_do_not_keep_a_hung_command_alive(workspace) -> None:
    """While the command hangs silently, the stacks are asked for by hand again and again: each time the
    entrypoint says it took them. Were its notes progress, the attempt would run into its deadline."""
    lines: list[str] = []
    runner = LocalProcessRunner(grace_seconds=2.0, poll_interval_seconds=0.05, on_line=lines.append, sweep_seconds=10)
    stop = threading.Event()

    def ask() -> None:
        wait_for(lambda: (workspace.root / "process.json").exists(), 60, "the entrypoint to start")
        while not stop.wait(0.5):
            (workspace.root / "dump-stacks").touch()

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    try:
        outcome = runner.run([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(600)"],
                             workspace=workspace, stall_seconds=6.0, deadline_seconds=40)
    finally:
        stop.set()
        asker.join()
    notes = [line for line in lines if "ranks' stacks in" in line]
    assert len(notes) >= 2, lines  # the notes came, more than once, inside the window
    assert outcome.reason == "Stalled", outcome.message
    assert (workspace.root / "stacks" / "index.json").is_file()
