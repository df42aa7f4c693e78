"""The entrypoint runs the command: output teed live, exit status passed through, bad options refused."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from entrypoint_harness import entrypoint_argv, entrypoint_env, py


def test_stdout_and_stderr_reach_both_the_console_and_the_log_file(run_entrypoint) -> None:
    run = run_entrypoint(py("import sys; print('to stdout'); print('to stderr', file=sys.stderr)"))

    assert run.returncode == 0
    for line in (b"to stdout\n", b"to stderr\n"):
        assert line in run.stdout
        assert line in run.log


def test_non_utf8_output_is_kept_byte_for_byte_and_the_tail_is_decoded_with_replacement(run_entrypoint) -> None:
    run = run_entrypoint(py(r"import sys; sys.stdout.buffer.write(b'bad \xff\xfe bytes\n')"))

    assert b"bad \xff\xfe bytes\n" in run.log
    assert b"bad \xff\xfe bytes\n" in run.stdout
    assert run.report["log_tail"] == ["bad \ufffd\ufffd bytes"]


@pytest.mark.parametrize("code", [0, 1, 3])
def test_the_commands_exit_code_is_the_entrypoints_exit_code(run_entrypoint, code: int) -> None:
    run = run_entrypoint(py(f"raise SystemExit({code})"))

    assert run.returncode == code
    assert run.report["exit_code"] == code
    assert run.report["signal"] is None


def test_the_command_sees_where_its_attempt_lives_and_runs_unbuffered(run_entrypoint, tmp_path: Path) -> None:
    names = ["TRAINGUARD_RUN_ID", "TRAINGUARD_ATTEMPT", "TRAINGUARD_CHECKPOINT_DIR", "TRAINGUARD_WORKSPACE", "PYTHONUNBUFFERED", "KEEP_ME"]
    code = f"import os, json; print(json.dumps({{n: os.environ.get(n) for n in {names!r}}}))"
    run = run_entrypoint(py(code), "--checkpoint-dir", str(tmp_path / "ck"), env={"KEEP_ME": "yes"})

    seen = json.loads(run.stdout.splitlines()[0])
    assert seen == {
        "TRAINGUARD_RUN_ID": "r1", "TRAINGUARD_ATTEMPT": "1", "TRAINGUARD_CHECKPOINT_DIR": str(tmp_path / "ck"),
        "TRAINGUARD_WORKSPACE": str(tmp_path / "ws"), "PYTHONUNBUFFERED": "1", "KEEP_ME": "yes",
    }


def test_options_can_come_from_trainguard_environment_variables(tmp_path: Path) -> None:
    env = entrypoint_env({"TRAINGUARD_WORKSPACE": str(tmp_path / "ws"), "TRAINGUARD_RUN_ID": "envrun",
                          "TRAINGUARD_ATTEMPT": "4"})
    proc = subprocess.run([sys.executable, "-m", "trainguard_entrypoint", "--", *py("print('ok')")],
                          cwd=tmp_path, env=env, capture_output=True, timeout=60)

    assert proc.returncode == 0
    assert (tmp_path / "ws" / "logs" / "train-envrun-attempt-4.log").read_bytes() == b"ok\n"


def test_a_command_that_does_not_exist_exits_127_with_the_reason_in_report_and_log(run_entrypoint) -> None:
    run = run_entrypoint(["no-such-trainer-xyz", "--epochs", "3"], path="/nowhere/bin:/usr/bin")

    assert run.returncode == 127
    expected = "command not found: no-such-trainer-xyz (searched PATH=/nowhere/bin:/usr/bin)"
    assert run.report["start_error"] == expected
    assert run.report["pid"] is None
    assert expected.encode() in run.log


def test_a_missing_torchrun_names_the_path_searched_and_pytorch(run_entrypoint, tmp_path) -> None:
    run = run_entrypoint(["torchrun", "train.py"], path=str(tmp_path / "empty"))

    assert run.returncode == 127
    assert run.report["start_error"] == (f"command not found: torchrun (searched PATH={tmp_path / 'empty'}); "
                                         "torchrun comes with PyTorch: install torch there")


def test_a_missing_command_given_as_a_path_is_no_such_file(run_entrypoint) -> None:
    run = run_entrypoint(["./no-such-script.sh"])

    assert (run.returncode, run.report["start_error"]) == (127, "command not found: ./no-such-script.sh (no such file)")


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--workspace", "ws", "--attempt", "1"], "--run-id"),
        (["--workspace", "ws", "--run-id", "../escape", "--attempt", "1"], "--run-id"),
        (["--workspace", "ws", "--run-id", "r", "--attempt", "zero"], "--attempt"),
        (["--run-id", "r", "--attempt", "1"], "--workspace"),
        (["--workspace", "ws", "--run-id", "r", "--attempt", "1", "--gpu-timeout-seconds", "soon"], "--gpu-timeout-seconds"),
        (["--workspace", "ws", "--run-id", "r", "--attempt", "1", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_a_bad_option_is_refused_with_one_line_naming_it(tmp_path: Path, options: list[str], named: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "trainguard_entrypoint", *options, "--", "true"],
                          cwd=tmp_path, env=entrypoint_env(), capture_output=True, text=True, timeout=60)

    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
    assert named in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_missing_command_is_refused_with_the_fix(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "trainguard_entrypoint", "--workspace", "ws", "--run-id", "r", "--attempt", "1"],
                          cwd=tmp_path, env=entrypoint_env(), capture_output=True, text=True, timeout=60)

    assert proc.returncode == 2
    assert "put the training command after '--'" in proc.stderr


def test_output_reaches_the_console_while_the_command_still_runs(tmp_path: Path) -> None:
    command = py("import time; print('step 1', flush=False); time.sleep(30)")
    proc = subprocess.Popen(entrypoint_argv(tmp_path / "ws", command), cwd=tmp_path, env=entrypoint_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        started = time.monotonic()
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"step 1\n"
        assert time.monotonic() - started < 20
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_report_lists_checkpoints_with_size_and_sha256(run_entrypoint, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    (ck / "step-000010").mkdir(parents=True)
    (ck / "step-000010" / "model.pt").write_bytes(b"weights")
    (ck / "step-000005.pt").write_bytes(b"older")
    run = run_entrypoint(py("pass"), "--checkpoint-dir", str(ck))

    files = {f["name"]: f for f in run.report["checkpoints"]["files"]}
    assert set(files) == {"step-000005.pt", "step-000010/model.pt"}
    assert files["step-000010/model.pt"]["size_bytes"] == 7
    assert files["step-000010/model.pt"]["sha256"] == hashlib.sha256(b"weights").hexdigest()


def test_the_log_tail_holds_the_last_80_lines(run_entrypoint) -> None:
    run = run_entrypoint(py("for i in range(200): print(f'line {i}')"))

    assert run.report["log_tail"] == [f"line {i}" for i in range(120, 200)]


def test_a_workspace_that_cannot_be_written_does_not_change_the_exit_status(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    proc = subprocess.run(entrypoint_argv(blocker / "ws", py("print('trained'); raise SystemExit(5)")),
                          cwd=tmp_path, env=entrypoint_env(), capture_output=True, timeout=60)

    assert proc.returncode == 5
    assert b"trained\n" in proc.stdout
    assert b"Traceback" not in proc.stderr


def test_the_command_runs_in_the_workdir_given_by_trainguard_workdir(run_entrypoint, tmp_path: Path) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    run = run_entrypoint(py("import os; print(os.getcwd())"), env={"TRAINGUARD_WORKDIR": str(workdir)})

    assert run.stdout.splitlines()[0] == str(workdir).encode()


def test_a_missing_workdir_is_a_start_error_naming_it(run_entrypoint, tmp_path: Path) -> None:
    run = run_entrypoint(py("pass"), "--workdir", str(tmp_path / "nowhere"))

    assert run.returncode == 126
    assert run.report["start_error"] == f"working directory does not exist: {tmp_path / 'nowhere'}"


def test_a_descendant_that_keeps_the_output_open_does_not_keep_the_entrypoint_waiting(run_entrypoint, tmp_path: Path) -> None:
    code = (
        "import subprocess, sys\n"
        "straggler = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'], start_new_session=True)\n"
        "print(straggler.pid, flush=True)\n"
    )
    started = time.monotonic()
    run = run_entrypoint(py(code))
    straggler = int(run.stdout.split()[0])
    try:
        assert run.returncode == 0
        assert time.monotonic() - started < 15
    finally:
        with contextlib.suppress(ProcessLookupError):  # the entrypoint, a subreaper, may have ended it
            os.kill(straggler, signal.SIGKILL)
