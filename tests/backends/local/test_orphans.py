"""Stopping a training process whose supervisor died, by its process record, over real processes.

A pid is trusted only with its start time: a pid now held by another process is never signalled.
A leftover that still runs gets SIGTERM, then SIGKILL to its whole process group after the grace
period, exactly as the local runner would have stopped it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from processes import alive

from trainguard.core.backends.local import orphans
from waiting import wait_for

# Ignores SIGTERM (noting that it came), starts a grandchild in its own process group, says ready.
STUBBORN = """
import os, signal, subprocess, sys, time
marker = sys.argv[1]
signal.signal(signal.SIGTERM, lambda *_: open(marker, "w").write("term"))
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
while True:
    time.sleep(0.05)
"""
POLITE = "import sys, time; print('ready', flush=True); time.sleep(600)"


@pytest.fixture
def leftovers():
    """Starts processes in sessions of their own, as the runner starts an entrypoint; kills what remains."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> tuple[subprocess.Popen[str], str]:
        proc = subprocess.Popen([sys.executable, "-c", *args], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
        started.append(proc)
        assert proc.stdout is not None
        return proc, proc.stdout.readline().strip()

    yield start
    for proc in started:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        proc.wait()


def _record(tmp_path: Path, pid: int, **changes: object) -> Path:
    payload = {"format": 1, "entrypoint_pid": pid, "process_group": pid, "host": os.uname().nodename,
               "start_ticks": orphans.process_start_ticks(pid), **changes}
    path = tmp_path / "process.json"
    path.write_text(json.dumps(payload))
    return path


def test_a_live_leftover_that_takes_sigterm_is_stopped_without_sigkill(tmp_path, leftovers):
    proc, _ = leftovers(POLITE)
    result = orphans.stop_leftover(_record(tmp_path, proc.pid), grace_seconds=30)
    assert result.stopped and result.pid == proc.pid
    assert "SIGTERM" in result.message and "SIGKILL" not in result.message
    assert proc.wait(10) == -15


def test_a_leftover_ignoring_sigterm_gets_sigkill_to_its_whole_group_after_the_grace_period(tmp_path, leftovers):
    marker = tmp_path / "got-sigterm"
    proc, grandchild = leftovers(STUBBORN, str(marker))
    grandchild_pid = int(grandchild)
    now = [0.0]

    def sleep(_: float) -> None:  # the grace period passes once the SIGTERM was seen and ignored
        wait_for(marker.exists, 10, "the leftover to receive SIGTERM")
        now[0] += 60

    result = orphans.stop_leftover(_record(tmp_path, proc.pid), grace_seconds=30, sleep=sleep, clock=lambda: now[0])
    assert result.stopped and "SIGKILL after the grace period" in result.message
    assert marker.read_text() == "term", "SIGTERM comes first, SIGKILL only after the grace period"
    assert proc.wait(10) == -9
    wait_for(lambda: not alive(grandchild_pid), 10, "the leftover's own child to be killed with its group")


def test_a_reused_pid_is_left_alone(tmp_path, leftovers):
    proc, _ = leftovers(POLITE)
    ticks = orphans.process_start_ticks(proc.pid)
    assert ticks is not None
    # the record names this pid, but a process that started earlier: the one it named has ended
    result = orphans.stop_leftover(_record(tmp_path, proc.pid, start_ticks=ticks - 1), grace_seconds=0)
    assert not result.stopped and "no longer running" in result.message
    assert proc.poll() is None and alive(proc.pid)


def test_a_record_without_a_start_time_is_not_trusted(tmp_path, leftovers):
    proc, _ = leftovers(POLITE)
    result = orphans.stop_leftover(_record(tmp_path, proc.pid, start_ticks=None), grace_seconds=0)
    assert not result.stopped and proc.poll() is None


def test_a_leftover_on_another_host_is_not_signalled_here(tmp_path, leftovers):
    proc, _ = leftovers(POLITE)
    result = orphans.stop_leftover(_record(tmp_path, proc.pid, host="gpu-node-7"), grace_seconds=0)
    assert not result.stopped and "gpu-node-7" in result.message and "stop it there" in result.message
    assert proc.poll() is None


@pytest.mark.parametrize("content", [None, "", "{not json", '{"entrypoint_pid": "12"}', "[1, 2]"])
def test_a_missing_or_unreadable_record_stops_nothing_and_never_raises(tmp_path, content):
    path = tmp_path / "process.json"
    if content is not None:
        path.write_text(content)
    result = orphans.stop_leftover(path, grace_seconds=0)
    assert not result.stopped and "no process record" in result.message


def test_a_process_that_ended_has_no_start_time():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert orphans.process_start_ticks(proc.pid) is None
    assert orphans.process_start_ticks(os.getpid()) is not None
