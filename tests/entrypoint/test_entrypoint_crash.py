"""Crashes and signals: 128+N exit codes, core files kept, SIGTERM forwarded, a report every time."""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest
from entrypoint_harness import entrypoint_argv, entrypoint_env, py
from waiting import wait_for

from trainguard_entrypoint.coredumps import core_process

SEGFAULT = py("import os, signal; print('about to crash', flush=True); os.kill(os.getpid(), signal.SIGSEGV)")


def _machine_keeps_cores_in_cwd() -> str | None:
    """None when this machine lets a child dump core into its cwd, else why not."""
    if resource.getrlimit(resource.RLIMIT_CORE)[1] == 0:
        return "the RLIMIT_CORE hard limit is 0 here"
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    if pattern.startswith("|") or pattern.startswith("/"):
        return f"core_pattern {pattern!r} does not write into the cwd"
    return None


def test_a_segfault_exits_139_and_the_report_names_the_signal(run_entrypoint) -> None:
    run = run_entrypoint(SEGFAULT)

    assert run.returncode == 139
    report = run.report
    assert (report["exit_code"], report["signal"], report["signal_name"]) == (139, 11, "SIGSEGV")
    assert report["log_tail"] == ["about to crash"]
    assert report["core_files"] or report["core_absent_reason"]
    # every step ran: the post-mortem GPU snapshot follows the report
    assert (run.workspace / "snapshot" / "gpu-after" / "index.json").is_file()
    why_not = _machine_keeps_cores_in_cwd()
    if why_not is not None:
        assert report["core_absent_reason"]
        pytest.skip(f"core file part only: {why_not}; the report says {report['core_absent_reason']!r}")
    assert report["core_dumped"] is True
    assert report["core_absent_reason"] is None
    kept = [run.workspace / "coredumps" / name for name in report["core_files"]]
    assert kept and all(p.is_file() and p.stat().st_size > 0 for p in kept)
    assert not list((run.workspace.parent / "cwd").glob("core*")), "the core was moved, not copied"


LAUNCHER = py("import subprocess, sys; "
              "rank = subprocess.run([sys.executable, '-c', 'import os; os.abort()']); "
              "print('rank ended with', rank.returncode, flush=True); sys.exit(1)")


def test_a_rank_that_aborts_under_a_launcher_that_exits_1_leaves_its_core_with_the_attempt(run_entrypoint) -> None:
    """torchrun's case: the rank dumps core, the launcher only exits with a code."""
    run = run_entrypoint(LAUNCHER)

    assert run.returncode == 1 and run.report["log_tail"] == ["rank ended with -6"]
    why_not = _machine_keeps_cores_in_cwd()
    if why_not is not None:
        assert run.report["core_absent_reason"]
        pytest.skip(f"core file part only: {why_not}; the report says {run.report['core_absent_reason']!r}")
    assert run.report["core_absent_reason"] is None
    [name] = run.report["core_files"]
    kept = core_process(run.workspace / "coredumps" / name)
    assert kept is not None and kept.ppid == run.report["pid"] and name.endswith(f".{kept.pid}")
    assert not list((run.workspace.parent / "cwd").glob("core*")), "the core was moved, not left in the cwd"


def test_a_segfault_with_core_dumps_forbidden_says_why_no_core_is_kept(tmp_path: Path) -> None:
    def forbid_cores() -> None:  # like "ulimit -Hc 0" in the container runtime: cannot be raised again
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    proc = subprocess.run(entrypoint_argv(tmp_path / "ws", SEGFAULT), cwd=tmp_path, env=entrypoint_env(),
                          capture_output=True, timeout=60, preexec_fn=forbid_cores)

    assert proc.returncode == 139
    report = json.loads((tmp_path / "ws" / "crash-report.json").read_text())
    assert report["core_files"] == []
    assert "RLIMIT_CORE hard limit is 0" in report["core_absent_reason"]
    assert not list((tmp_path / "ws" / "coredumps").iterdir())


def test_an_exit_by_sigterm_is_143_and_says_sigterm_dumps_no_core(run_entrypoint) -> None:
    run = run_entrypoint(py("import os, signal; os.kill(os.getpid(), signal.SIGTERM)"))

    assert run.returncode == 143
    assert run.report["signal_name"] == "SIGTERM"
    assert run.report["core_files"] == []
    assert run.report["core_absent_reason"] == "SIGTERM does not produce a core dump"


def test_a_clean_exit_explains_that_no_core_is_expected(run_entrypoint) -> None:
    run = run_entrypoint(py("raise SystemExit(1)"))

    assert "exited with code 1" in run.report["core_absent_reason"]


def _start_and_wait_for(tmp_path: Path, code: str, ready: bytes) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(entrypoint_argv(tmp_path / "ws", py(code)), cwd=tmp_path, env=entrypoint_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == ready
    return proc


def test_sigterm_to_the_entrypoint_is_forwarded_and_the_child_exits_143(tmp_path: Path) -> None:
    proc = _start_and_wait_for(tmp_path, "import time; print('ready', flush=True); time.sleep(60)", b"ready\n")
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)

    assert proc.wait(timeout=30) == 143
    assert time.monotonic() - started < 20
    report = json.loads((tmp_path / "ws" / "crash-report.json").read_text())
    assert (report["exit_code"], report["signal_name"]) == (143, "SIGTERM")
    assert report["received_signals"] == ["SIGTERM"]


def test_a_child_that_handles_sigterm_exits_with_its_own_code(tmp_path: Path) -> None:
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('saving checkpoint', flush=True), sys.exit(7)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = _start_and_wait_for(tmp_path, code, b"ready\n")
    proc.send_signal(signal.SIGTERM)

    assert proc.wait(timeout=30) == 7
    assert proc.stdout is not None and b"saving checkpoint" in proc.stdout.read()
    report = json.loads((tmp_path / "ws" / "crash-report.json").read_text())
    assert report["exit_code"] == 7
    assert report["log_tail"] == ["ready", "saving checkpoint"]


def test_a_core_dumped_in_the_workdir_is_kept(run_entrypoint, tmp_path: Path) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    run = run_entrypoint(SEGFAULT, "--workdir", str(workdir))

    assert run.returncode == 139
    why_not = _machine_keeps_cores_in_cwd()
    if why_not is not None:
        pytest.skip(f"core file part only: {why_not}; the report says {run.report['core_absent_reason']!r}")
    assert run.report["core_files"], run.report["core_absent_reason"]
    assert not list(workdir.glob("core*"))


def test_sigterm_during_the_snapshots_means_the_command_is_never_started(tmp_path: Path) -> None:
    # the stand-in nvidia-smi (there is no GPU here) marks that the snapshot phase is under way
    marker, bin_dir = tmp_path / "snapshotting", tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\ntouch {marker}\nexec sleep 5\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    ran = tmp_path / "ran"
    env = entrypoint_env({"TRAINGUARD_GPU_TIMEOUT_SECONDS": "1"}, path=f"{bin_dir}:/usr/bin:/bin")
    proc = subprocess.Popen(entrypoint_argv(tmp_path / "ws", py(f"open({str(ran)!r}, 'w')")), cwd=tmp_path,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(marker.exists, 30, "the stand-in nvidia-smi to start")
    proc.send_signal(signal.SIGTERM)

    assert proc.wait(timeout=60) == 143
    assert not ran.exists()
    report = json.loads((tmp_path / "ws" / "crash-report.json").read_text())
    assert report["start_error"] == "received SIGTERM before the command started; not started"


def test_sigquit_during_the_snapshots_is_said_and_the_command_still_runs(tmp_path: Path) -> None:
    """`trainguard dump` before the watch took SIGQUIT over: its default action would end the entrypoint."""
    # the stand-in nvidia-smi (there is no GPU here) marks that the snapshot phase is under way
    marker, bin_dir = tmp_path / "snapshotting", tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\ntouch {marker}\nexec sleep 5\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    ran = tmp_path / "ran"
    env = entrypoint_env({"TRAINGUARD_GPU_TIMEOUT_SECONDS": "1"}, path=f"{bin_dir}:/usr/bin:/bin")
    proc = subprocess.Popen(entrypoint_argv(tmp_path / "ws", py(f"open({str(ran)!r}, 'w')")), cwd=tmp_path,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(marker.exists, 30, "the stand-in nvidia-smi to start")
    proc.send_signal(signal.SIGQUIT)

    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert ran.exists()
    assert "asked for before the command started" in err
