"""prefect.yaml as users deploy it, and a run created the way the UI creates one, through a real worker.

`prefect deploy --all` runs as a subprocess against the session's Prefect server; a real
`prefect worker start --type process` runs the custom run and is stopped by the test.
"""

from __future__ import annotations

import os
import signal
import subprocess

from flow_helpers import PREFECT, ROOT, attempt_dir, read_run, subprocess_env, tiny_spec
from prefect import get_client
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
    env = {**subprocess_env(prefect_server), "TRAINGUARD_PROJECT_DIR": str(ROOT)}
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen([*PREFECT, "worker", "start", "--pool", "trainguard-local", "--type", "process",
                               "--name", "test-worker"], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        final = wait_for(lambda: (r := read_run(run.id)).state.is_final() and r, 240, "the custom run to finish")
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)
        log.close()
    assert final.state.is_completed(), (final.state, (tmp_path / "worker.log").read_text()[-3000:])
    assert final.parameters["spec"]["command"][-3:] == ["0", "--steps", "20"]
    assert (attempt_dir(blocks["evidence"], "ui-run-1", 1) / "manifest.json").exists()
