"""prefect.yaml as users deploy it, and a run created the way the UI creates one, through a real worker.

`prefect deploy --all` runs as a subprocess against the session's Prefect server; a real
`prefect worker start --type process` runs the custom run and is stopped by the test.
"""

from __future__ import annotations

import json
import subprocess
from contextlib import AbstractContextManager
from pathlib import Path

from flow_helpers import PREFECT, ROOT, attempt_dir, read_run, subprocess_env, tiny_spec
from prefect import get_client
from prefect.states import Cancelling
from runs import attempt_runs
from services.prefect_server import managed_process
from waiting import wait_for


def test_prefect_deploy_all_creates_every_deployment_with_its_pool_schedule_and_concurrency_limit(deployed):
    assert deployed["train-attempt/local-pool"].work_pool_name == "trainguard-local"
    kube = deployed["train-attempt/kubernetes"]
    assert kube.work_pool_name == "trainguard-kubernetes"
    assert kube.parameters["backend_block"] == "trainguard-kubernetes-job-backend/cluster"
    nightly = deployed["training-run/nightly-retrain"]
    assert [(s.schedule.cron, s.schedule.timezone, s.active) for s in nightly.schedules] == [("0 2 * * *", "UTC", True)]
    assert nightly.global_concurrency_limit.limit == 1
    assert nightly.concurrency_options.collision_strategy == "ENQUEUE"
    assert deployed["retry-controller/safety-net"].work_pool_name == "trainguard-local"
    fleet = deployed["fleet-report/daily"]
    assert [(s.schedule.cron, s.schedule.timezone, s.active) for s in fleet.schedules] == [("30 6 * * *", "UTC", True)]
    assert fleet.parameters["since_hours"] == 168
    assert all(d.pull_steps for d in deployed.values())


def test_a_ui_style_custom_run_with_edited_parameters_completes_through_a_process_worker(
    prefect_server, deployed, blocks, tmp_path
):
    deployment = deployed["train-attempt/local-pool"]
    edited = {"spec": tiny_spec("ui-run", "--steps", "20"), "run_id": "ui-run-1",
              "backend_block": blocks["backend_block"], "evidence_block": blocks["evidence_block"]}
    with get_client(sync_client=True) as client:  # what the UI's "Custom run" form posts
        run = client.create_flow_run_from_deployment(deployment.id, parameters=edited, tags=["trainguard-run:ui-run-1"])
    with _local_pool_worker(prefect_server, tmp_path, "test-worker"):
        final = wait_for(lambda: (r := read_run(run.id)).state.is_final() and r, 240, "the custom run to finish")
    assert final.state.is_completed(), (final.state, (tmp_path / "worker.log").read_text()[-3000:])
    assert final.parameters["spec"]["command"][-3:] == ["0", "--steps", "20"]
    assert (attempt_dir(blocks["evidence"], "ui-run-1", 1) / "manifest.json").exists()


def test_a_person_cancelling_a_running_attempt_from_the_ui_keeps_its_verdict_and_starts_no_next_attempt(
    prefect_server, deployed, blocks, tmp_path
):
    deployment = deployed["train-attempt/local-pool"]
    params = {"spec": tiny_spec("ui-cancel", "--steps", "3000", "--step-seconds", "0.05"), "run_id": "ui-cancel-1",
              "backend_block": blocks["backend_block"], "evidence_block": blocks["evidence_block"]}
    with get_client(sync_client=True) as client:
        run = client.create_flow_run_from_deployment(deployment.id, parameters=params, tags=["trainguard-run:ui-cancel-1"])
    logs = blocks["work"] / "runs" / "ui-cancel-1" / "attempt-1" / "logs"
    folder = attempt_dir(blocks["evidence"], "ui-cancel-1", 1)
    with _local_pool_worker(prefect_server, tmp_path, "cancel-worker"):
        wait_for(lambda: any("step 20/" in p.read_text(errors="replace") for p in logs.glob("*.log")), 120,
                 "the attempt to train")
        with get_client(sync_client=True) as client:  # what the UI's Cancel button posts
            client.set_flow_run_state(run.id, Cancelling(message="cancelled from the UI"), force=True)
        final = wait_for(lambda: (r := read_run(run.id)).state.is_final() and r, 120, "the cancelled run to end")
        # the hook that keeps the verdict is the one that would have scheduled a next attempt
        wait_for(lambda: (folder / "verdict.json").exists(), 60, "the cancelled attempt's verdict")
    worker_log = (tmp_path / "worker.log").read_text()
    assert final.state.is_cancelled(), (final.state, worker_log[-3000:])
    verdict = json.loads((folder / "verdict.json").read_text())
    assert (verdict["category"], verdict["rule_id"], verdict["decision"]["retry"]) == (
        "user_cancelled", "flow.cancelled", False), verdict
    assert verdict["state"] == "Cancelled" and (folder / "manifest.json").exists()
    notice = json.loads((blocks["work"] / "runs" / "ui-cancel-1" / "attempt-1" / "notice.json").read_text())
    assert (notice["reason"], notice["source"].split(",")[0]) == ("cancelled", "a person cancelled the run"), notice
    assert "was cancelled" in worker_log and "not retried" in worker_log, worker_log[-3000:]
    assert [r.name for r in attempt_runs("ui-cancel-1")] == ["ui-cancel-a1"]
    assert not list(blocks["work"].glob("runs/ui-cancel-1/attempt-2")), "a cancelled attempt was retried"


def _local_pool_worker(prefect_server: str, folder: Path, name: str) -> AbstractContextManager[subprocess.Popen]:
    """A real `prefect worker start --type process` on the trainguard-local pool, its output in
    ``folder``/worker.log, its process group ended on exit."""
    env = {**subprocess_env(prefect_server), "TRAINGUARD_PROJECT_DIR": str(ROOT)}
    return managed_process([*PREFECT, "worker", "start", "--pool", "trainguard-local", "--type", "process",
                            "--name", name], folder / "worker.log", env, cwd=folder)
