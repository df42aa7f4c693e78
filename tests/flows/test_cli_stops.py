"""`trainguard run` stopped from outside: SIGTERM, Ctrl-C, and kill -9 then `trainguard runs` and `--resume`.

Real processes and real signals against the session's Prefect server (and, for kill -9, the
temporary server the CLI starts itself, which must not outlive it).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from flow_helpers import tiny_spec
from waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def start(tmp_path: Path, *args: str, api_url: str | None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "COLUMNS": "200",
           "PYTHONUNBUFFERED": "1"}
    env.pop("PREFECT_API_URL", None)
    if api_url:
        env["PREFECT_API_URL"] = api_url
    else:  # a temporary server of its own, in a home of its own
        env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    return subprocess.Popen([sys.executable, "-m", "trainguard.cli", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def slow_spec(tmp_path: Path, name: str) -> None:
    spec = tiny_spec(name, "--fail-at-step", "0")
    spec["command"] = [*spec["command"][:3], "400", "--step-seconds", "0.05"]  # 20 s of steps
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec))


def checkpoint_written(tmp_path: Path) -> Path | None:
    return next(iter(sorted((tmp_path / "trainguard-data/work/runs").glob("*/checkpoints/step-*.json"))), None)


# Ctrl-C runs on a temporary server of the CLI's own, which must end with it
@pytest.mark.parametrize(("signum", "category", "code", "own_server"), [(signal.SIGTERM, "preempted", 143, False),
                                                                         (signal.SIGINT, "user_cancelled", 130, True)])
def test_a_stopped_run_records_the_attempt_prints_the_table_and_says_how_to_resume(
    prefect_server, tmp_path, signum, category, code, own_server
):
    slow_spec(tmp_path, "stopped")
    cli = start(tmp_path, "run", "run.yaml", api_url=None if own_server else prefect_server)
    wait_for(lambda: checkpoint_written(tmp_path), 240, "the first checkpoint")
    servers = [p for p in _children(cli.pid) if "uvicorn" in _cmdline(p) or "prefect" in _cmdline(p)]
    assert bool(servers) == own_server, [_cmdline(p) for p in _children(cli.pid)]
    cli.send_signal(signum)
    out, err = cli.communicate(timeout=120)
    for server in servers:
        wait_for(lambda: not _alive(server), 30, "the temporary server to stop with the CLI")

    assert cli.returncode == code, out[-3000:] + err[-3000:]
    table = out[out.index("trainguard run stopped-"):]
    assert category in table and "resume with: trainguard run run.yaml --resume stopped-" in out
    run_id = table.split()[2]
    verdict = json.loads((tmp_path / "trainguard-data/evidence/runs" / run_id / "attempt-1/verdict.json").read_text())
    assert verdict["category"] == category and verdict["decision"]["retry"] is False
    assert not list((tmp_path / "trainguard-data/evidence/runs" / run_id).glob("attempt-2"))  # not retried here


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> str:
    try:
        return (Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")).decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in "ZX"


def test_kill_9_of_the_cli_leaves_nothing_running_and_resume_continues_the_run(tmp_path):
    slow_spec(tmp_path, "killed")
    cli = start(tmp_path, "run", "run.yaml", api_url=None)
    wait_for(lambda: checkpoint_written(tmp_path), 240, "the first checkpoint")
    children = _children(cli.pid)
    server = next(p for p in children if "uvicorn" in _cmdline(p) or "prefect" in _cmdline(p))
    entrypoint = next(p for p in children if "trainguard_entrypoint" in _cmdline(p))
    os.kill(cli.pid, signal.SIGKILL)
    cli.communicate(timeout=30)

    wait_for(lambda: not _alive(server), 30, "the temporary server to stop with the CLI")
    wait_for(lambda: not _alive(entrypoint), 30, "the entrypoint to stop the command and exit")
    run_dir = next((tmp_path / "trainguard-data/work/runs").iterdir())
    report = json.loads((run_dir / "attempt-1/crash-report.json").read_text())
    assert report["supervisor_lost"] is True

    listed = subprocess.run([sys.executable, "-m", "trainguard.cli", "runs"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    assert listed.returncode == 0, listed.stderr
    assert run_dir.name in listed.stdout and "lost" in listed.stdout
    assert f"--resume {run_dir.name}" in listed.stdout

    spec = yaml.safe_load((tmp_path / "run.yaml").read_text())
    spec["command"] = spec["command"][:-4] + ["--step-seconds", "0"]  # the rest of the run goes fast
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec))
    resumed = start(tmp_path, "run", "run.yaml", "--resume", run_dir.name, api_url=None)
    out, err = resumed.communicate(timeout=240)

    assert resumed.returncode == 0, out[-3000:] + err[-3000:]
    assert f"resuming run {run_dir.name} at attempt 2, from" in out
    assert "marked 2 flow run(s) the lost process left running as Crashed" in out  # the attempt and its parent
    with sqlite3.connect(tmp_path / "prefect-home" / "prefect.db") as db:  # the temporary server's own database
        states = db.execute("SELECT name, state_type FROM flow_run").fetchall()
    assert not [name for name, state in states if state in ("RUNNING", "PENDING")], states
    table = out[out.index(f"trainguard run {run_dir.name}"):]
    assert "Crashed" in table and "Completed" in table and "2/" in table
    assert (tmp_path / "trainguard-data/evidence/runs" / run_dir.name / "attempt-1/verdict.json").is_file()
    listed = subprocess.run([sys.executable, "-m", "trainguard.cli", "runs"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    assert run_dir.name in listed.stdout and "Completed" in listed.stdout and "lost" not in listed.stdout
