"""A flow process that dies under a running Slurm job: the attempt run again adopts the job; the retry
controller cancels a job nobody adopts.

The processes that die are real and die by SIGKILL, so nothing of theirs runs again. The job runs
the tiny trainer long enough to still be RUNNING when it is adopted or stopped; the test ends it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from prefect import get_client
from prefect.deployments import run_deployment
from prefect.states import Crashed, Running
from slurm_helpers import Meanwhile, job_states, jobcomp_lines, log_says, running_job, tiny_spec
from waiting import wait_for

from flows.attempt import train_attempt
from flows.controller import retry_controller
from trainguard.core.evidence.manifest import read_manifest, verify_manifest
from trainguard.core.backends.slurm.job import job_name
from trainguard.core.spec import parse_spec
from trainguard.core.stores.folder import LocalEvidenceStore

ROOT = Path(__file__).resolve().parents[3]
_FLOW = """
import json, sys
from flows.attempt import train_attempt
from trainguard.core.spec import parse_spec
args = json.loads(sys.argv[1])
train_attempt(parse_spec(args.pop("spec")), **args)
"""
# The backend alone (no Prefect to import: it starts in a fraction of the flow's time), as the flow runs it.
_SUPERVISOR = """
import json, sys
from pathlib import Path
from trainguard.core.backends.base import Launch
from trainguard.core.backends.slurm.client import SlurmClient
from trainguard.core.backends.slurm.backend import SlurmBackend
a = json.loads(sys.argv[1])
backend = SlurmBackend(Path(a["shared"]), client=SlurmClient(env=a["env"]))
backend.run(backend.provision(a["run_id"], 1), Launch(a["run_id"], 1, tuple(a["command"])), on_line=lambda line: None)
"""


def _start(code: str, argument: dict[str, Any], prefect_server: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", code, json.dumps(argument)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _kill(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGKILL)  # dies without a word; its job runs on
    process.wait()


def _record(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _supervisor(blocks: dict[str, Any], cluster: Any, run_id: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"shared": str(blocks["shared"]), "run_id": run_id, "command": spec["command"],
            "env": {**os.environ, "SLURM_CONF": str(cluster.conf)}}


def test_a_flow_killed_and_run_again_adopts_its_running_job_by_record_or_by_name_and_comment(
    prefect_server, slurm_blocks, slurm_cluster
):
    run_id = "slurm-adopt-1"
    spec = tiny_spec("slurm-adopt", "--steps", "3000", "--step-seconds", "0.1", retry={"max_total_attempts": 1})
    args = {"spec": spec, "attempt": 1, "run_id": run_id, "backend_block": slurm_blocks["backend_block"],
            "evidence_block": slurm_blocks["evidence_block"]}
    record_path = slurm_blocks["shared"] / "runs" / run_id / "attempt-1" / "slurm-job.json"
    first = _start(_FLOW, args, prefect_server)
    try:
        job_id = running_job(slurm_cluster, run_id, 1, timeout=120)
        wait_for(log_says(slurm_blocks["shared"], run_id, 1, "step 10/"), what="training to make progress")
    finally:
        _kill(first)

    record_path.unlink()  # as if the process had died between sbatch and writing the record
    second = _start(_SUPERVISOR, _supervisor(slurm_blocks, slurm_cluster, run_id, spec), prefect_server)
    try:
        adopted = wait_for(lambda: _record(record_path).get("adopted_at") and _record(record_path), timeout=60,
                           what="the job adopted by name and comment")
        assert job_states(slurm_cluster, job_name(run_id, 1)) == [(job_id, "RUNNING")]
    finally:
        _kill(second)
    assert adopted["job_id"] == job_id and "submitted_at" not in adopted  # found, not submitted

    def warn_once_adopted_by_record() -> list[tuple[str, str]]:
        wait_for(lambda: len(_record(record_path).get("adopted_at", [])) == 2, timeout=60,
                 what="the job adopted by its record")
        running = job_states(slurm_cluster, job_name(run_id, 1))
        # What Slurm sends the batch shell as the time limit nears (--signal=B:TERM@lead), sent now.
        slurm_cluster.run("scancel", "--signal=TERM", "--batch", job_id)
        return running

    beside = Meanwhile(warn_once_adopted_by_record)
    beside.start()
    state = train_attempt(parse_spec(args.pop("spec")), **args, return_state=True)
    assert beside.join_checked() == [(job_id, "RUNNING")]

    assert state.is_failed()
    assert [jid for jid, _ in job_states(slurm_cluster, job_name(run_id, 1))] == [job_id]  # no second sbatch
    assert len(jobcomp_lines(slurm_cluster, job_name(run_id, 1))) == 1
    # The batch shell noted Slurm's warning and passed it on: the command stopped on SIGTERM, a timeout.
    evidence = slurm_blocks["evidence"] / "runs" / run_id / "attempt-1"
    verdict = json.loads((evidence / "verdict.json").read_text())
    assert (verdict["category"], verdict["termination_reason"]) == ("timeout", "DeadlineExceeded"), verdict
    assert json.loads((evidence / "crash-report.json").read_text())["signal"] == 15
    assert (evidence / "slurm" / "slurm-signal.txt").read_text().strip()
    assert "Slurm warned of its time limit" in json.loads((evidence / "runner.json").read_text())["message"]


def _dead_deployed_attempt(run_id: str, spec: dict[str, Any], blocks: dict[str, Any]) -> Any:
    """A train-attempt run of a deployment, marked Running: its process is the one the test kills."""
    train_attempt.to_deployment(name="slurm").apply()
    # Scheduled an hour ahead: no runner serves the deployment anyway, and no hook of it runs.
    run = run_deployment("train-attempt/slurm", timeout=0, tags=[f"trainguard-run:{run_id}"],
                         scheduled_time=datetime.now(timezone.utc) + timedelta(hours=1),
                         parameters={"spec": spec, "run_id": run_id, "backend_block": blocks["backend_block"],
                                     "evidence_block": blocks["evidence_block"]})
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run.id, Running(), force=True)
    return run


def test_the_retry_controller_cancels_the_job_a_killed_flow_process_left_running(
    prefect_server, slurm_blocks, slurm_cluster
):
    run_id = "slurm-orphan-1"
    spec = tiny_spec("slurm-orphan", "--steps", "3000", "--step-seconds", "0.1", retry={"delay_seconds": 600})
    run = _dead_deployed_attempt(run_id, spec, slurm_blocks)
    supervisor = _start(_SUPERVISOR, _supervisor(slurm_blocks, slurm_cluster, run_id, spec), prefect_server)
    try:
        job_id = running_job(slurm_cluster, run_id, 1, timeout=60)
        wait_for(log_says(slurm_blocks["shared"], run_id, 1, "step 10/"), what="training to make progress")
    finally:
        _kill(supervisor)
    assert job_states(slurm_cluster, job_name(run_id, 1)) == [(job_id, "RUNNING")]
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run.id, Crashed(message="the flow process was killed"), force=True)

    result = retry_controller(str(run.id))

    assert job_states(slurm_cluster, job_name(run_id, 1)) == [(job_id, "CANCELLED")]  # stopped, not left to --time
    assert result["next_flow_run_id"]  # the retry goes on as a new attempt, with no job of the old one under it
    store = LocalEvidenceStore(slurm_blocks["evidence"])
    manifest = read_manifest(store, run_id, 1)
    assert verify_manifest(store, manifest) == []
    kept = slurm_blocks["evidence"] / "runs" / run_id / "attempt-1"
    assert "JobState=CANCELLED" in (kept / "slurm" / "scontrol-show-job.txt").read_text()  # kept as it ended
    assert json.loads((kept / "crash-report.json").read_text())["signal"] == 15  # scancel's SIGTERM, reported
    assert "step 10/" in next((kept / "logs").glob("train-*.log")).read_text()
