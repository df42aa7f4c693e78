"""`trainguard dump RUN` on the local backend: the stacks of a running attempt, taken without stopping it.

A real entrypoint runs a real command through the local runner; the command line is run as a
person would, in a process of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from trainguard.core.backends.local.runner import LocalProcessRunner, ProcessOutcome
from trainguard.core.backends.workspace import PROCESS_RECORD, AttemptWorkspace
from waiting import wait_for

ROOT = Path(__file__).resolve().parents[3]
WAITER = ("import os, time\n"
          "def wait_for_the_go(path):\n"
          "    while not os.path.exists(path):\n"
          "        time.sleep(0.1)\n"
          "wait_for_the_go(os.environ['GO'])\n")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "trainguard.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def test_dump_takes_a_running_attempts_stacks_and_leaves_it_running_then_says_when_it_no_longer_runs(
        tmp_path: Path) -> None:
    work = tmp_path / "work"
    workspace = AttemptWorkspace.create(work, "run-1", 1)
    go = tmp_path / "go"
    result: list[ProcessOutcome] = []
    runner = LocalProcessRunner(grace_seconds=2.0, on_line=lambda line: None)
    attempt = threading.Thread(target=lambda: result.append(runner.run(
        [sys.executable, "-c", WAITER], workspace=workspace, env={"GO": str(go)}, deadline_seconds=300)))
    attempt.start()
    try:
        wait_for(lambda: (workspace.root / PROCESS_RECORD).exists(), 60, "the entrypoint to start")
        done = _cli("dump", "run-1", "--work", str(work), "--wait", "120")
        assert done.returncode == 0, done.stderr + done.stdout
        assert "SIGQUIT" in done.stdout and "1 of 1 ranks' stacks" in done.stdout
        index = json.loads((workspace.root / "stacks" / "index.json").read_text())
        assert index["why"] == "asked for by hand"
        assert "wait_for_the_go" in (workspace.root / "stacks" / index["ranks"]["0"]["file"]).read_text()
        assert attempt.is_alive()  # asked, not stopped
    finally:
        go.touch()
        attempt.join(timeout=120)
    assert result[0].reason == "Completed"

    ended = _cli("dump", "run-1", "--work", str(work))
    assert ended.returncode == 1 and "is not running" in ended.stderr and len(ended.stderr.strip().splitlines()) == 1
    unknown = _cli("dump", "run-2", "--work", str(work))
    assert unknown.returncode == 2 and "has no attempt" in unknown.stderr, unknown.stderr


def test_dump_of_a_command_wrapped_in_a_shell_takes_its_pythons_stack_and_leaves_the_shell_running(
        tmp_path: Path) -> None:
    """py-spy cannot read a shell: the faulthandler fallback must ask the shell's Python child, not the shell."""
    work = tmp_path / "work"
    workspace = AttemptWorkspace.create(work, "run-1", 1)
    go = tmp_path / "go"
    result: list[ProcessOutcome] = []
    runner = LocalProcessRunner(grace_seconds=2.0, on_line=lambda line: None)
    wrapped = ["bash", "-c", f"{sys.executable} -c \"$WAITER\"; echo the shell carried on"]
    attempt = threading.Thread(target=lambda: result.append(runner.run(
        wrapped, workspace=workspace, env={"GO": str(go), "WAITER": WAITER}, deadline_seconds=300)))
    attempt.start()
    try:
        wait_for(lambda: (workspace.root / "stacks" / "faulthandler.txt").exists(), 60, "the Python child to start")
        done = _cli("dump", "run-1", "--work", str(work), "--wait", "120")
        assert done.returncode == 0, done.stderr + done.stdout
        index = json.loads((workspace.root / "stacks" / "index.json").read_text())
        assert index["ranks"]["0"]["source"] == "faulthandler", index["ranks"]["0"]
        assert "wait_for_the_go" in (workspace.root / "stacks" / index["ranks"]["0"]["file"]).read_text()
    finally:
        go.touch()
        attempt.join(timeout=120)
    assert result[0].reason == "Completed", result[0]
    assert "the shell carried on" in workspace.log_path.read_text()
