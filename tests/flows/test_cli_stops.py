"""`trainguard run` stopped from outside: SIGTERM, Ctrl-C, and kill -9 then `trainguard runs` and `--resume`.

Real processes and real signals against the session's Prefect server (and, for kill -9, the
temporary server the CLI starts itself, which must not outlive it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import kubernetes
import pytest
from simfixtures import sim_fixture

from processes import alive
import yaml
from flow_helpers import tiny_spec
from waiting import wait_for
from services.ports import rendezvous_port

from trainguard.core.attempt import AttemptSummary
from trainguard.core.policy import RetryDecision

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
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_as_from_a_terminal)


def _as_from_a_terminal() -> None:
    # A command typed at a terminal starts with Ctrl-C at its default; one started in the background
    # by a non-interactive shell (as a test runner may be) inherits SIGINT ignored, and Python keeps
    # an ignored SIGINT ignored, so the stop under test would never arrive.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def slow_spec(tmp_path: Path, name: str) -> None:
    spec = tiny_spec(name, "--fail-at-step", "0")
    # 200 s of steps: it must outlast what the tests check while it runs, on a loaded machine too;
    # every test stops it long before
    spec["command"] = [*spec["command"][:3], "4000", "--step-seconds", "0.05"]
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
    entrypoint = next(p for p in _children(cli.pid) if "trainguard_entrypoint" in _cmdline(p))
    training = wait_for(lambda: _children(entrypoint), 30, "the training command under the entrypoint")
    if not own_server:  # while it runs, it is listed as running and cannot be resumed beside itself
        run_id = next((tmp_path / "trainguard-data/work/runs").iterdir()).name
        listed = cli_once(tmp_path, "runs")
        assert re.search(rf"{run_id}\s+│\s+1\s+│\s+running\s", listed.stdout), listed.stdout
        twin = cli_once(tmp_path, "run", "run.yaml", "--resume", run_id)
        assert twin.returncode == 2 and f"--resume: run {run_id} is still running" in twin.stderr, twin.stderr
        assert f"pid {cli.pid}" in twin.stderr and len(twin.stderr.strip().splitlines()) == 1
    if signum == signal.SIGINT:
        os.killpg(cli.pid, signum)  # Ctrl-C: the terminal signals the whole foreground process group
    else:
        cli.send_signal(signum)
    out, err = cli.communicate(timeout=120)
    for pid in [*servers, entrypoint, *training]:
        wait_for(lambda: not alive(pid), 30, f"{_cmdline(pid) or pid} to end with the CLI")

    assert cli.returncode == code, out[-3000:] + err[-3000:]
    table = out[out.index("trainguard run stopped-"):]
    assert category in table and "resume with: trainguard run run.yaml --resume stopped-" in out
    run_id = table.split()[2]
    verdict = json.loads((tmp_path / "trainguard-data/evidence/runs" / run_id / "attempt-1/verdict.json").read_text())
    assert verdict["category"] == category and verdict["decision"]["retry"] is False
    assert not list((tmp_path / "trainguard-data/evidence/runs" / run_id).glob("attempt-2"))  # not retried here
    # the training was told why: Ctrl-C by the supervisor's notice, a SIGTERM by the entrypoint's own
    notice = json.loads((tmp_path / "trainguard-data/work/runs" / run_id / "attempt-1/notice.json").read_text())
    assert notice["reason"] == ("interrupted" if signum == signal.SIGINT else "terminated"), notice


def test_sigterm_to_the_whole_process_group_still_records_the_stop_through_the_temporary_server(tmp_path):
    # a wrapper's trap or `kill -- -PGID` signals every process of the group: the temporary server
    # must outlive the CLI's recording of the stop, then end with it
    slow_spec(tmp_path, "grouped")
    cli = start(tmp_path, "run", "run.yaml", api_url=None)
    wait_for(lambda: checkpoint_written(tmp_path), 240, "the first checkpoint")
    server = next(p for p in _children(cli.pid) if "uvicorn" in _cmdline(p))
    entrypoint = next(p for p in _children(cli.pid) if "trainguard_entrypoint" in _cmdline(p))

    os.killpg(cli.pid, signal.SIGTERM)
    out, err = cli.communicate(timeout=90)

    assert cli.returncode == 143, out[-3000:] + err[-3000:]
    assert "Stopped: trainguard run received SIGTERM; attempt 1 recorded as preempted." in out
    assert "resume with: trainguard run run.yaml --resume grouped-" in out
    assert "Traceback" not in err, err[-3000:]
    for pid in (server, entrypoint):
        wait_for(lambda: not alive(pid), 30, f"{pid} to end with the CLI")


def test_a_temporary_server_that_dies_ends_the_run_at_once_with_one_line_saying_so(tmp_path):
    slow_spec(tmp_path, "orphaned")
    cli = start(tmp_path, "run", "run.yaml", api_url=None)
    wait_for(lambda: checkpoint_written(tmp_path), 240, "the first checkpoint")
    server = next(p for p in _children(cli.pid) if "uvicorn" in _cmdline(p))
    entrypoint = next(p for p in _children(cli.pid) if "trainguard_entrypoint" in _cmdline(p))

    os.kill(server, signal.SIGKILL)
    # bounded: Prefect's client alone would retry the dead server for minutes
    out, err = cli.communicate(timeout=60)

    said = [line for line in out.splitlines()
            if "temporary Prefect server" in line and not line.startswith("trainguard: waiting")]
    assert said and said[0].startswith(f"the temporary Prefect server (pid {server}) died; stopping the run"), out
    assert cli.returncode == 143, out[-3000:] + err[-3000:]
    run_id = out[out.index("trainguard run orphaned-"):].split()[2]
    assert f"resume with: trainguard run run.yaml --resume {run_id}" in out
    wait_for(lambda: not alive(entrypoint), 30, "the attempt's entrypoint to be stopped")
    verdict = json.loads((tmp_path / "trainguard-data/evidence/runs" / run_id / "attempt-1/verdict.json").read_text())
    assert verdict["state"] == "Cancelled" and "temporary Prefect server" in verdict["signature"]
    assert (tmp_path / "trainguard-data/evidence/runs" / run_id / "attempt-1/manifest.json").is_file()


sim = sim_fixture()


def test_sigterm_on_the_kubernetes_backend_stops_the_job_records_the_attempt_and_says_how_to_resume(
    prefect_server, sim, tmp_path
):
    slow_spec(tmp_path, "kube-stopped")
    spec = yaml.safe_load((tmp_path / "run.yaml").read_text())
    spec["command"][0] = "python"  # the image's Python
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec))
    port = rendezvous_port()  # kubesim's pods share this host's ports: a rendezvous port of this run's own
    cli = start(tmp_path, "run", "run.yaml", "--kubeconfig", str(sim.kubeconfig), "--image", "python:3.11",
                "--master-port", str(port), api_url=prefect_server)
    api = kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(str(sim.kubeconfig)))

    def running_pod() -> str | None:
        pods = api.list_namespaced_pod("default", label_selector="trainguard.io/run-id").items
        return next((p.metadata.name for p in pods if p.status.phase == "Running"
                     and "kube-stopped" in str(p.metadata.labels)), None)

    pod = wait_for(running_pod, 240, "the attempt's pod to run")
    env = {e.name: e.value for e in api.read_namespaced_pod(pod, "default").spec.containers[0].env or ()}
    assert env["MASTER_PORT"] == str(port)
    cli.send_signal(signal.SIGTERM)
    out, err = cli.communicate(timeout=120)

    assert cli.returncode == 143, out[-3000:] + err[-3000:]
    assert "attempt 1 recorded as preempted" in out and "resume with: trainguard run run.yaml --resume" in out
    wait_for(lambda: not any(p.metadata.name == pod for p in api.list_namespaced_pod("default").items), 60,
             f"the attempt's pod {pod} to be gone")


def test_a_stop_during_the_backoff_keeps_the_finished_attempts_verdict_and_says_how_to_resume(
    prefect_server, tmp_path
):
    spec = tiny_spec("backoff", "--fail-at-step", "2", retry={"delay_seconds": 600})  # nccl_error: retried
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec))
    cli = start(tmp_path, "run", "run.yaml", api_url=prefect_server)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(cli.stderr), daemon=True)
    reader.start()
    wait_for(lambda: any("retrying as attempt 2 in 600s" in line for line in lines) or cli.poll() is not None, 240,
             "the backoff's log line")
    assert cli.poll() is None, "the run ended before its backoff:\n" + "".join(lines)[-3000:]
    cli.send_signal(signal.SIGTERM)
    out = cli.stdout.read()
    cli.wait(timeout=60)
    reader.join(timeout=30)

    assert cli.returncode == 143, out[-3000:] + "".join(lines)[-3000:]
    run_id = out[out.index("trainguard run backoff-"):].split()[2]
    verdict = json.loads((tmp_path / "trainguard-data/evidence/runs" / run_id / "attempt-1/verdict.json").read_text())
    assert verdict["category"] == "nccl_error" and verdict["state"] == "Failed"  # its own ending, not the stop's
    assert verdict["decision"]["retry"] is False and "in 600s" in verdict["decision"]["planned"]
    assert verdict["decision"]["reason"].startswith("attempt 2 was not started: trainguard run received SIGTERM")
    assert "attempt 1 keeps its verdict (nccl_error); attempt 2 was not started" in out
    assert f"resume with: trainguard run run.yaml --resume {run_id}" in out
    assert not (tmp_path / "trainguard-data/work/runs" / run_id / "attempt-2").exists()


def test_a_master_port_without_a_cluster_is_refused_in_one_line(tmp_path):
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(tiny_spec("port")))
    refused = cli_once(tmp_path, "run", "run.yaml", "--master-port", "29600")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "error: --master-port goes with --kubeconfig; for a saved Kubernetes backend block, set its master_port"]


def test_resume_refuses_a_run_whose_attempts_are_spent_and_says_how_to_allow_more(tmp_path):
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(tiny_spec("spent", retry={"max_attempts": 2})))
    for attempt in (1, 2):
        folder = tmp_path / "trainguard-data/evidence/runs/spent-0000aaaa" / f"attempt-{attempt}"
        folder.mkdir(parents=True)
        verdict = AttemptSummary(run_id="spent-0000aaaa", attempt=attempt, max_attempts=2, state="Failed",
                                 category="nccl_error", retryable=True,
                                 decision=RetryDecision(retry=attempt < 2, reason="-"))
        (folder / "verdict.json").write_text(json.dumps(verdict.to_dict()))

    refused = cli_once(tmp_path, "run", "run.yaml", "--resume", "spent-0000aaaa")  # refused before any server starts
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert ("run spent-0000aaaa has spent its 2 of 2 attempts in a row without checkpoint progress (nccl_error); "
            "allow more with --max-attempts 3") in refused.stderr
    assert "or start a new run" in refused.stderr


def test_resume_weighs_the_budget_as_the_policy_does_progress_refills_it_and_a_total_bound_stops_it(
        tmp_path, monkeypatch):
    import typer

    from trainguard.cli import settle
    from trainguard.core.spec import parse_spec

    monkeypatch.chdir(tmp_path)  # the default local backend and evidence folder live under it
    run_id = "moving-0000aaaa"
    for attempt in (1, 2):  # each attempt saved a newer checkpoint than the one it resumed from
        folder = tmp_path / "trainguard-data/evidence/runs" / run_id / f"attempt-{attempt}"
        folder.mkdir(parents=True)
        verdict = AttemptSummary(run_id=run_id, attempt=attempt, max_attempts=2, state="Failed", category="gpu_fault",
                                 retryable=True, resumed_from=f"ckpt/step-{attempt - 1}0.json" if attempt > 1 else None,
                                 newest_checkpoint=f"ckpt/step-{attempt}0.json",
                                 decision=RetryDecision(retry=attempt < 2, reason="-"))
        (folder / "verdict.json").write_text(json.dumps(verdict.to_dict()))

    moving = parse_spec(tiny_spec("moving", retry={"max_attempts": 2}))
    assert settle.check_resume(moving, run_id, {}) == [1, 2]  # two attempts of two, but neither stuck

    bounded = parse_spec(tiny_spec("moving", retry={"max_attempts": 2, "max_total_attempts": 2}))
    with pytest.raises(typer.Exit) as refused:
        settle.check_resume(bounded, run_id, {})
    assert refused.value.exit_code == 2


def cli_once(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainguard.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})


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


def test_kill_9_of_the_cli_leaves_nothing_running_and_resume_continues_the_run(tmp_path):
    slow_spec(tmp_path, "killed")
    cli = start(tmp_path, "run", "run.yaml", api_url=None)
    wait_for(lambda: checkpoint_written(tmp_path), 240, "the first checkpoint")
    children = _children(cli.pid)
    server = next(p for p in children if "uvicorn" in _cmdline(p) or "prefect" in _cmdline(p))
    entrypoint = next(p for p in children if "trainguard_entrypoint" in _cmdline(p))
    os.kill(cli.pid, signal.SIGKILL)
    cli.communicate(timeout=30)

    wait_for(lambda: not alive(server), 30, "the temporary server to stop with the CLI")
    wait_for(lambda: not alive(entrypoint), 30, "the entrypoint to stop the command and exit")
    run_dir = next((tmp_path / "trainguard-data/work/runs").iterdir())
    report = json.loads((run_dir / "attempt-1/crash-report.json").read_text())
    assert report["supervisor_lost"] is True
    left = max((run_dir / "checkpoints").glob("step-*.json"))  # the newest checkpoint attempt 1 left

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
    lost = json.loads((tmp_path / "trainguard-data/evidence/runs" / run_dir.name / "attempt-1/verdict.json").read_text())
    assert (lost["attempt"], lost["state"], lost["termination_reason"]) == (1, "Crashed", "Lost"), lost
    assert lost["decision"]["retry"] is False and lost["decision"]["reason"].startswith("continued by `trainguard run")
    second = json.loads((tmp_path / "trainguard-data/evidence/runs" / run_dir.name / "attempt-2/verdict.json").read_text())
    assert (second["attempt"], second["state"]) == (2, "Completed")
    assert Path(tmp_path, second["resumed_from"]).resolve() == left.resolve()
    assert f"resuming run {run_dir.name} at attempt 2, from {second['resumed_from']}" in out
    assert "marked 2 flow run(s) the lost process left running as Crashed" in out  # the attempt and its parent
    with sqlite3.connect(tmp_path / "prefect-home" / "prefect.db") as db:  # the temporary server's own database
        states = db.execute("SELECT name, state_type FROM flow_run").fetchall()
    assert not [name for name, state in states if state in ("RUNNING", "PENDING")], states
    table = out[out.index(f"trainguard run {run_dir.name}"):]
    assert "Crashed" in table and "Completed" in table and re.search(r"│ 2\s+│", table)  # attempt 2's row
    listed = cli_once(tmp_path, "runs")
    assert run_dir.name in listed.stdout and "Completed" in listed.stdout and "lost" not in listed.stdout
    again = cli_once(tmp_path, "run", "run.yaml", "--resume", run_dir.name)
    assert again.returncode == 2 and f"run {run_dir.name} already completed on attempt 2" in again.stderr
