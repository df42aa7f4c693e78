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
import threading
from pathlib import Path

import pytest

from processes import alive

from trainguard.core.backends.local import orphans
from trainguard.core.backends.local.runner import LocalProcessRunner
from trainguard.core.backends.workspace import PROCESS_RECORD, AttemptWorkspace
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
def leftovers(tmp_path):
    """Starts processes in sessions of their own, as the runner starts an entrypoint (its command line naming
    the attempt's folder, tmp_path, where the record lies), or `as_other=True` not one; kills what remains."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str, as_other: bool = False) -> tuple[subprocess.Popen[str], str]:
        entrypoint = [] if as_other else ["-m", "trainguard_entrypoint", "--workspace", str(tmp_path)]
        proc = subprocess.Popen([sys.executable, "-c", *args, *entrypoint], stdout=subprocess.PIPE, text=True,
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
        wait_for(lambda: marker.exists() and marker.read_text() == "term", 10, "the leftover to receive SIGTERM")
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


# The attempt's command rewrites its process.json, as any job can (the attempt's folder is its to
# write), to name another process group of the user's, then waits to be stopped.
REWRITER = """
import json, os, sys, time
path = os.path.join(os.environ["TRAINGUARD_WORKSPACE"], "process.json")
record = json.load(open(path))
victim, how = int(sys.argv[1]), sys.argv[2]
if how == "group":
    record["process_group"] = victim
else:
    stat = open(f"/proc/{victim}/stat").read()
    record.update(entrypoint_pid=victim, process_group=victim, start_ticks=int(stat[stat.rfind(")") + 2:].split()[19]))
json.dump(record, open(path + ".new", "w"))
os.replace(path + ".new", path)
print("rewritten", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("how", ["group", "pid"])
def test_a_process_record_rewritten_by_the_job_to_name_another_group_never_gets_it_signalled(tmp_path, leftovers, how):
    victim, _ = leftovers(POLITE, as_other=True)  # any process of the user's, leading its own group
    workspace = AttemptWorkspace.create(tmp_path / "work", "run-1", 1)
    lines: list[str] = []
    runner = LocalProcessRunner(grace_seconds=1.0, on_line=lines.append)
    attempt = threading.Thread(target=runner.run, args=([sys.executable, "-c", REWRITER, str(victim.pid), how],),
                               kwargs={"workspace": workspace}, daemon=True)
    attempt.start()
    wait_for(lambda: "rewritten" in lines, 30, "the job to rewrite its process record")

    result = orphans.stop_leftover(workspace.root / PROCESS_RECORD, grace_seconds=1)

    assert not result.stopped and "not stopped" in result.message and "rewritten" in result.message
    assert victim.poll() is None and alive(victim.pid)
    entrypoint = next(int(p) for p in os.listdir("/proc") if p.isdigit() and _is_entrypoint_of(int(p), workspace.root))
    os.killpg(entrypoint, 9)  # the attempt still runs: end it the way its own runner would
    attempt.join(30)
    assert not attempt.is_alive()


def _is_entrypoint_of(pid: int, root: Path) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"trainguard_entrypoint" in argv and str(root).encode() in argv
