"""Nothing outlives an attempt: a lost supervisor stops the command, leftover descendants are ended.

Real processes and real signals: a supervisor process starts the entrypoint and is killed with
SIGKILL, as happens when the flow process dies; a command leaves a grandchild behind that calls
``setsid`` to escape its process group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from processes import alive
from pathlib import Path

from entrypoint_harness import entrypoint_argv, entrypoint_env, py
from waiting import wait_for


def _report(workspace: Path) -> dict | None:
    try:
        return json.loads((workspace / "crash-report.json").read_text())
    except (OSError, ValueError):
        return None


def _supervise(tmp_path: Path, command: list[str], *options: str) -> subprocess.Popen[bytes]:
    """A supervisor process that starts the entrypoint and then only waits, as the local runner does."""
    argv = entrypoint_argv(tmp_path / "ws", command, *options)
    code = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen({argv!r}, stdout=open({str(tmp_path / 'console')!r}, 'wb'), stderr=subprocess.STDOUT)\n"
        f"open({str(tmp_path / 'entrypoint.pid')!r}, 'w').write(str(p.pid))\n"
        "p.wait()\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], env=entrypoint_env(), start_new_session=True)


def _command_that_records_sigterm(tmp_path: Path, ignore_term: bool) -> list[str]:
    on_term = "pass" if ignore_term else "sys.exit(143)"
    return py(
        "import os, signal, sys, time\n"
        f"def stop(*_):\n    open({str(tmp_path / 'term')!r}, 'w').write('got SIGTERM')\n    {on_term}\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        f"open({str(tmp_path / 'command.pid')!r}, 'w').write(str(os.getpid()))\n"
        "print('training', flush=True)\n"
        "while True: time.sleep(0.05)\n"
    )


def _kill_supervisor_once_training(tmp_path: Path, supervisor: subprocess.Popen[bytes]) -> int:
    command_pid = int(wait_for(lambda: _read(tmp_path / "command.pid"), 60, "the command to start"))
    os.kill(supervisor.pid, signal.SIGKILL)
    supervisor.wait()
    return command_pid


def _read(path: Path) -> str | None:
    try:
        return path.read_text() or None
    except OSError:
        return None


def test_a_killed_supervisor_gets_the_command_stopped_with_sigterm_and_a_crash_report_saying_so(tmp_path: Path) -> None:
    supervisor = _supervise(tmp_path, _command_that_records_sigterm(tmp_path, ignore_term=False), "--grace-seconds", "5")
    command_pid = _kill_supervisor_once_training(tmp_path, supervisor)
    try:
        report = wait_for(lambda: _report(tmp_path / "ws"), 30, "the crash report after the supervisor died")
    finally:
        if alive(command_pid):
            os.kill(command_pid, signal.SIGKILL)

    assert _read(tmp_path / "term") == "got SIGTERM"
    assert report["supervisor_lost"] is True and report["exit_code"] == 143
    assert any("supervisor" in p and "was lost" in p for p in report["problems"]), report["problems"]
    assert not alive(command_pid)


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace_period_once_the_supervisor_is_gone(
    tmp_path: Path,
) -> None:
    supervisor = _supervise(tmp_path, _command_that_records_sigterm(tmp_path, ignore_term=True), "--grace-seconds", "1")
    command_pid = _kill_supervisor_once_training(tmp_path, supervisor)
    try:
        report = wait_for(lambda: _report(tmp_path / "ws"), 30, "the crash report after SIGKILL")
    finally:
        if alive(command_pid):
            os.kill(command_pid, signal.SIGKILL)

    assert _read(tmp_path / "term") == "got SIGTERM"  # asked first
    assert report["signal_name"] == "SIGKILL" and report["supervisor_lost"] is True


def test_a_silent_grandchild_that_called_setsid_is_ended_when_the_attempt_completes(run_entrypoint, tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    escapee = (
        "import os, time\n"
        "os.setsid()\n"
        f"open({str(pid_file)!r} + '.tmp', 'w').write(str(os.getpid()))\n"  # closed before it is renamed:
        f"os.replace({str(pid_file)!r} + '.tmp', {str(pid_file)!r})\n"  # never seen empty
        "time.sleep(600)\n"
    )
    command = py(
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {escapee!r}], stdin=subprocess.DEVNULL,"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        f"while not __import__('os').path.exists({str(pid_file)!r}): time.sleep(0.02)\n"
        "print('done')\n"
    )
    run = run_entrypoint(command, "--grace-seconds", "2")
    grandchild = int(pid_file.read_text())
    try:
        assert run.returncode == 0
        assert not alive(grandchild), "the setsid grandchild outlived the completed attempt"
        ended = run.report["descendants_ended"]
        assert [d["pid"] for d in ended] == [grandchild] and "os.setsid()" in ended[0]["command"]
        assert any("outlived the command and were ended" in p for p in run.report["problems"])
    finally:
        if alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_an_attempt_that_leaves_nothing_behind_reports_no_ended_descendants(run_entrypoint) -> None:
    run = run_entrypoint(py("print('clean')"))

    assert run.report["descendants_ended"] == [] and run.report["supervisor_lost"] is False
    assert not any("outlived" in p for p in run.report["problems"])
