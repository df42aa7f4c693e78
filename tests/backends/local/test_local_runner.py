"""The local runner over real processes: outcomes, deadlines, stalls, start errors, cancellation.

Every test runs the real entrypoint as a child process group; "no orphans" is checked by pid.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from processes import alive

from trainguard.core.backends import stopreason
from trainguard.core.backends.local.runner import LocalProcessRunner, ProcessOutcome
from trainguard.core.backends.workspace import CRASH_REPORT, RUNNER_REPORT, SNAPSHOT, AttemptWorkspace
from waiting import wait_for


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _gone(pid: int, timeout: float = 5.0) -> bool:
    """Wait until ``pid`` is dead (SIGKILL is delivered asynchronously); fail after ``timeout``."""
    return wait_for(lambda: not alive(pid), timeout, f"process {pid} to end")


def _wait_for_file(path: Path, timeout: float = 30) -> str:
    return wait_for(lambda: path.exists() and (text := path.read_text()).endswith("\n") and text, timeout, f"{path}")


@pytest.fixture
def workspace(tmp_path: Path) -> AttemptWorkspace:
    return AttemptWorkspace.create(tmp_path / "work", "run-1", 1)


@pytest.fixture
def lines() -> list[str]:
    return []


@pytest.fixture
def runner(lines: list[str]) -> LocalProcessRunner:
    return LocalProcessRunner(grace_seconds=2.0, poll_interval_seconds=0.05, on_line=lines.append)


def _runner_json(workspace: AttemptWorkspace) -> dict[str, object]:
    return json.loads((workspace.root / RUNNER_REPORT).read_text())


def test_a_command_that_succeeds_is_completed_and_its_output_is_logged(runner, workspace, lines) -> None:
    outcome = runner.run(_py("print('epoch 1 done')"), workspace=workspace)

    assert (outcome.reason, outcome.exit_code, outcome.signal) == ("Completed", 0, None)
    assert "epoch 1 done" in lines
    assert workspace.log_path.read_bytes() == b"epoch 1 done\n"
    assert outcome.log_path == workspace.log_path
    assert outcome.finished_at >= outcome.started_at
    assert _runner_json(workspace)["reason"] == "Completed"


def test_a_failing_command_is_an_error_with_its_exit_code(runner, workspace) -> None:
    outcome = runner.run(_py("raise SystemExit(3)"), workspace=workspace)

    assert (outcome.reason, outcome.exit_code, outcome.message) == ("Error", 3, "exited with code 3")


def test_a_segfault_is_an_error_with_signal_11_and_exit_139(runner, workspace) -> None:
    outcome = runner.run(_py("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"), workspace=workspace)

    assert (outcome.reason, outcome.exit_code, outcome.signal) == ("Error", 139, 11)
    assert outcome.message == "killed by SIGSEGV (exit code 139)"


def test_the_deadline_stops_a_sleeping_command(runner, workspace, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(f'{{os.getpid()}}\\n'); time.sleep(60)"
    started = time.monotonic()
    # long enough for the entrypoint and the command to start even on a loaded machine
    outcome = runner.run(_py(code), workspace=workspace, deadline_seconds=3.0)

    assert outcome.reason == "DeadlineExceeded"
    assert outcome.message == "still running after the 3s deadline; stopped"
    assert outcome.exit_code == 143  # SIGTERM forwarded by the entrypoint, which then reported it
    assert time.monotonic() - started < 15
    assert _gone(int(pid_file.read_text()))
    assert json.loads((workspace.root / CRASH_REPORT).read_text())["signal_name"] == "SIGTERM"


def test_a_command_that_prints_once_then_hangs_is_stalled(runner, workspace, lines) -> None:
    outcome = runner.run(_py("import time; print('loading data'); time.sleep(60)"), workspace=workspace,
                         stall_seconds=1.0, deadline_seconds=30)

    assert outcome.reason == "Stalled"
    assert outcome.message == "no new log output for 1s (stall window); stopped"
    assert "loading data" in lines
    assert outcome.duration_seconds < 15


def test_a_command_that_keeps_printing_is_not_stalled(runner, workspace) -> None:
    code = "import time\nfor i in range(14):\n    print(i)\n    time.sleep(0.25)\n"
    outcome = runner.run(_py(code), workspace=workspace, stall_seconds=2.0)

    assert outcome.reason == "Completed"


def test_a_command_that_does_not_exist_is_a_start_error_with_127(runner, workspace) -> None:
    outcome = runner.run(["no-such-trainer-xyz"], workspace=workspace)

    assert (outcome.reason, outcome.exit_code) == ("StartError", 127)
    assert outcome.message.startswith("command not found: no-such-trainer-xyz (searched PATH=")


def test_a_missing_python_is_a_start_error_with_127(workspace) -> None:
    outcome = LocalProcessRunner(python="/nonexistent/python3").run(["true"], workspace=workspace)

    assert (outcome.reason, outcome.exit_code) == ("StartError", 127)
    assert "/nonexistent/python3" in outcome.message
    assert _runner_json(workspace)["reason"] == "StartError"


def test_on_line_receives_lines_while_the_command_runs(workspace) -> None:
    seen: list[tuple[str, float]] = []
    runner = LocalProcessRunner(on_line=lambda line: seen.append((line, time.monotonic())))
    runner.run(_py("import time; print('first'); time.sleep(1.5); print('second')"), workspace=workspace)

    times = dict(seen)
    assert times["second"] - times["first"] >= 1.0, "the first line arrived only when the command ended"


def test_non_utf8_output_reaches_on_line_with_replacement_characters(runner, workspace, lines) -> None:
    runner.run(_py(r"import sys; sys.stdout.buffer.write(b'loss \xff\n')"), workspace=workspace)

    assert "loss \ufffd" in lines


def test_an_on_line_that_raises_does_not_stall_the_attempt(workspace) -> None:
    def broken(line: str) -> None:
        raise RuntimeError("display gone")

    outcome = LocalProcessRunner(on_line=broken).run(
        _py("for i in range(20000): print('x' * 100)"), workspace=workspace, stall_seconds=5
    )

    assert outcome.reason == "Completed"
    assert "on_line failed" in outcome.message


def test_the_command_does_not_see_trainguards_pythonpath(runner, workspace, lines, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/opt/mine")
    runner.run(_py("import os; print('PP=' + os.environ.get('PYTHONPATH', '<unset>'))"), workspace=workspace)

    # the user's own path, behind only the entrypoint's faulthandler site (stacks/site in the attempt's folder),
    # and last the training-side helper's zip (trainguard_train and the formats it writes, never trainguard)
    shown = next(line for line in lines if line.startswith("PP="))
    assert shown == f"PP={workspace.root / 'stacks' / 'site'}:/opt/mine:{workspace.root / 'site' / 'trainguard-train.zip'}"


class Terminated(BaseException):
    """Stands for the exception Prefect raises in the flow's main thread when it gets SIGTERM."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


@pytest.mark.parametrize(("signum", "expected"), [(signal.SIGUSR1, Terminated), (signal.SIGINT, KeyboardInterrupt)])
def test_an_interrupted_wait_stops_the_whole_group_and_reraises(
    workspace, tmp_path: Path, signum: int, expected: type[BaseException]
) -> None:
    pid_file = tmp_path / "pids"
    code = (
        "import os, subprocess, sys, time\n"
        "grandchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(f'{{os.getpid()}} {{grandchild.pid}}\\n')\n"
        "time.sleep(60)\n"
    )
    previous = signal.signal(signal.SIGUSR1, _raise_terminated)
    interrupter = threading.Thread(target=lambda: (_wait_for_file(pid_file), os.kill(os.getpid(), signum)))
    try:
        interrupter.start()
        with pytest.raises(expected):
            LocalProcessRunner(grace_seconds=2.0).run(_py(code), workspace=workspace)
    finally:
        interrupter.join()
        signal.signal(signal.SIGUSR1, previous)

    pids = [int(p) for p in pid_file.read_text().split()]
    assert all(_gone(pid) for pid in pids), "a process of the attempt outlived the cancellation"
    runner_view = _runner_json(workspace)
    assert runner_view["reason"] == "Cancelled"
    assert expected.__name__ in str(runner_view["message"])


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace_period(workspace, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = (
        "import os, signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"open({str(pid_file)!r}, 'w').write(f'{{os.getpid()}}\\n')\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    outcome: ProcessOutcome = LocalProcessRunner(grace_seconds=1.0).run(
        _py(code), workspace=workspace, deadline_seconds=3.0
    )

    assert outcome.reason == "DeadlineExceeded"
    assert (outcome.exit_code, outcome.signal) == (137, 9)  # the entrypoint itself was SIGKILLed
    assert time.monotonic() - started < 15
    assert _gone(int(pid_file.read_text()))
    # the entrypoint died before its crash report: the runner's own account is what remains
    assert not (workspace.root / CRASH_REPORT).exists()
    assert _runner_json(workspace)["reason"] == "DeadlineExceeded"


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"command": []}, "command"),
        ({"command": "python train.py"}, "command"),
        ({"command": ["true"], "deadline_seconds": -1}, "deadline_seconds"),
        ({"command": ["true"], "stall_seconds": 0}, "stall_seconds"),
        ({"command": ["true"], "env": {"N": 1}}, "env['N']"),
    ],
)
def test_malformed_arguments_are_refused_with_one_line_naming_them(workspace, kwargs, named: str) -> None:
    command = kwargs.pop("command")
    with pytest.raises(ValueError, match=named.replace("[", r"\[")):
        LocalProcessRunner().run(command, workspace=workspace, **kwargs)


def test_a_slow_post_mortem_after_the_command_ended_is_not_a_stall(workspace, tmp_path: Path, monkeypatch) -> None:
    # A stand-in nvidia-smi (no GPU here) that hangs only after the command has ended, as a wedged
    # driver would after a GPU fault.
    marker, bin_dir = tmp_path / "crashed", tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\n[ -e {marker} ] && exec sleep 30\necho ok\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    code = f"open({str(marker)!r}, 'w').close(); raise SystemExit(4)"

    outcome = LocalProcessRunner(grace_seconds=1.0).run(
        _py(code), workspace=workspace, env={"TRAINGUARD_GPU_TIMEOUT_SECONDS": "2.5"}, stall_seconds=1.5
    )

    assert (outcome.reason, outcome.exit_code) == ("Error", 4)
    index = json.loads((workspace.root / SNAPSHOT / "gpu-after" / "index.json").read_text())
    assert "timed out after 2.5s" in index["absent"][0]["reason"]


# A stdlib training stand-in: on SIGTERM it records the notice file it finds and the signal, then exits.
RECORDS_NOTICE = (
    "import json, os, signal, sys, time\n"
    "def stop(signum, frame):\n"
    "    path = os.environ['TRAINGUARD_NOTICE_FILE']\n"
    "    notice = json.load(open(path)) if os.path.exists(path) else None\n"
    "    with open(sys.argv[1], 'w') as out:\n"
    "        out.write(json.dumps({'signal': signum, 'notice': notice, 'at': time.time()}) + '\\n')\n"
    "    sys.exit(143)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def test_the_deadline_gives_notice_before_the_stop_with_the_grace_to_save(workspace, tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    runner = LocalProcessRunner(grace_seconds=4.0, poll_interval_seconds=0.05, sweep_seconds=1.0)
    outcome = runner.run([sys.executable, "-c", RECORDS_NOTICE, str(record)], workspace=workspace,
                         deadline_seconds=3.0)

    assert outcome.reason == "DeadlineExceeded" and outcome.exit_code == 143
    got = json.loads(_wait_for_file(record))
    assert got["signal"] == signal.SIGTERM
    notice = got["notice"]  # written before the SIGTERM reached the command, by the one who stopped it
    assert (notice["version"], notice["reason"]) == (1, "deadline")
    assert abs(notice["deadline"] - notice["given_at"] - 5.0) < 1e-3  # the sweep and the grace: no SIGKILL before
    assert notice["given_at"] <= got["at"] < notice["deadline"]
    assert "the attempt's 3s deadline" in notice["source"]


def _cancel_resolver(exc: BaseException) -> str | None:
    return "cancelled" if isinstance(exc, Terminated) else None  # as the shell answers for a Cancelling flow run


def _broken_resolver(exc: BaseException) -> str | None:
    raise RuntimeError("the Prefect API is gone")


@pytest.mark.parametrize(("signum", "resolver", "reason"), [
    (signal.SIGUSR1, _cancel_resolver, "cancelled"),     # a person's cancel: the shell knows it
    (signal.SIGINT, _cancel_resolver, "interrupted"),    # Ctrl-C
    (signal.SIGUSR1, _broken_resolver, "terminated"),    # no answer: the entrypoint gives its own notice
])
def test_a_stopped_supervisor_tells_the_training_why_in_its_notice(
    workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: int, resolver, reason: str
) -> None:
    monkeypatch.setattr(stopreason, "_resolvers", [])
    stopreason.learn(resolver)
    record = tmp_path / "record.json"
    previous = signal.signal(signal.SIGUSR1, _raise_terminated)
    interrupter = threading.Thread(target=lambda: (
        wait_for(lambda: workspace.log_path.exists() and "ready" in workspace.log_path.read_text(errors="replace"), 60,
                 "the stand-in to install its SIGTERM handler"), os.kill(os.getpid(), signum)))
    try:
        interrupter.start()
        with pytest.raises((Terminated, KeyboardInterrupt)):
            LocalProcessRunner(grace_seconds=4.0, poll_interval_seconds=0.05).run(
                [sys.executable, "-c", RECORDS_NOTICE, str(record)], workspace=workspace)
    finally:
        interrupter.join()
        signal.signal(signal.SIGUSR1, previous)
    got = json.loads(_wait_for_file(record))
    assert got["signal"] == signal.SIGTERM and got["notice"]["reason"] == reason, got
