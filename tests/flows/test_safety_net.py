"""The safety net for attempts whose flow process died where no hook could see it.

Real parts throughout: the session's Prefect server with its automation services, the deployments
served by `python -m deployments.serve` in a subprocess (a real runner), `trainguard setup`'s own
automations running the retry-controller deployment, real training processes and real signals.
"""

from __future__ import annotations

import os
import re
import signal
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from flow_helpers import alive, attempt_dir, attempt_runs, deployment_exists, parent_pid, read_run, tiny_spec
from prefect import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName, FlowRunFilter
from prefect.deployments import run_deployment
from prefect.states import Crashed, Running
from waiting import wait_for

from deployments import automations
from deployments.setup import run_setup
from flows.attempt import train_attempt
from flows.controller import retry_controller
from flows.hooks import schedule_next_attempt


@pytest.fixture(scope="module")
def safety_net(served):
    """`trainguard setup`'s work against the test server, with the deployments served.

    The automations are removed afterwards, so other modules' tests see only their own flows' doing.
    """
    result = run_setup()
    for name in ("train-attempt/local", "retry-controller/local"):
        wait_for(lambda: deployment_exists(name), 60, f"the served deployment {name}")
    yield result
    with get_client(sync_client=True) as client:
        for name in (automations.CRASHED, automations.FAILED, automations.ZOMBIE):
            for automation in client.read_automations_by_name(name):
                client.delete_automation(automation.id)


def successors(run_id: str) -> list:
    return [r for r in attempt_runs(run_id) if r.parameters.get("attempt") == 2]


def controller_runs(dead_id) -> list:
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(
            name=DeploymentFilterName(any_=["local"])), flow_run_filter=FlowRunFilter())
    return [r for r in runs if r.parameters.get("flow_run_id") == str(dead_id)]


def finished_controller(dead_id):
    """The retry-controller run the automation started for `dead_id`, once it is final."""
    return [r for r in controller_runs(dead_id) if r.state and r.state.is_final()]


def _spec_that_hangs(name: str) -> dict:
    return tiny_spec(name, "--fail-after-steps", "12", "--failure", "hang", retry={"delay_seconds": 600})


def test_setup_is_idempotent_and_creates_the_three_automations(safety_net):
    again = run_setup()
    assert again.controller_id == safety_net.controller_id
    assert sorted(what for _, _, what in again.automations) == ["updated"] * 3
    with get_client(sync_client=True) as client:
        for name in (automations.CRASHED, automations.FAILED, automations.ZOMBIE):
            assert len(client.read_automations_by_name(name)) == 1
        crashed = client.read_automations_by_name(automations.CRASHED)[0]
    assert crashed.actions[0].deployment_id == safety_net.controller_id
    assert crashed.actions[0].parameters == {"flow_run_id": "{{ flow_run.id | string }}"}
    assert "trainguard-local-process-backend" in again.block_types


def test_a_sigkilled_attempt_gets_one_successor_its_evidence_and_no_orphaned_training(safety_net, blocks):
    run = run_deployment("train-attempt/local", timeout=0, tags=["trainguard-run:kill9-1"], parameters={
        "spec": _spec_that_hangs("kill9"), "run_id": "kill9-1", **_blocks(blocks)})
    log = blocks["work"] / "runs" / "kill9-1" / "attempt-1" / "logs" / "train-kill9-1-attempt-1.log"
    wait_for(lambda: log.exists() and b"injecting failure 'hang'" in log.read_bytes(), 90, "training to hang")
    trainer = int(re.search(rb"pid (\d+)", log.read_bytes()).group(1))
    entrypoint = parent_pid(trainer)
    flow_process = parent_pid(entrypoint)
    assert b"prefect" in Path(f"/proc/{flow_process}/cmdline").read_bytes()
    os.kill(flow_process, signal.SIGKILL)  # no finally, no hook in that process: nothing of it runs again

    wait_for(lambda: read_run(run.id).state.is_crashed(), 60, "the runner to mark the attempt Crashed")
    wait_for(lambda: finished_controller(run.id), 120, "the automation's retry controller to finish")
    assert len(successors("kill9-1")) == 1, "hook and controller must schedule one next attempt together"
    nxt = successors("kill9-1")[0]
    assert nxt.state.is_scheduled() and nxt.parameters["parent_flow_run_id"] == str(run.id)
    assert nxt.parameters["resume_from"].endswith("step-000010.json")
    assert wait_for(lambda: not alive(trainer) and not alive(entrypoint), 30, "the orphaned training to stop")

    evidence = attempt_dir(blocks["evidence"], "kill9-1", 1)
    assert (evidence / "manifest.json").exists()
    assert b"injecting failure 'hang'" in next((evidence / "logs").glob("*.log")).read_bytes()
    assert finished_controller(run.id)[0].state.is_completed()


def test_an_attempt_forced_into_crashed_through_the_api_gets_exactly_one_successor(safety_net, blocks):
    # Scheduled an hour ahead so no runner picks it up: no process, so no hook can ever run for it.
    run = run_deployment("train-attempt/local", timeout=0, tags=["trainguard-run:forced-1"],
                         scheduled_time=datetime.now(timezone.utc) + timedelta(hours=1), parameters={
                             "spec": _spec_that_hangs("forced"), "run_id": "forced-1", **_blocks(blocks)})
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run.id, Running(), force=True)
        client.set_flow_run_state(run.id, Crashed(message="the node was lost"), force=True)

    wait_for(lambda: finished_controller(run.id), 120, "the automation's retry controller to finish")
    assert len(successors("forced-1")) == 1
    assert (attempt_dir(blocks["evidence"], "forced-1", 1) / "manifest.json").exists()
    verdict = (attempt_dir(blocks["evidence"], "forced-1", 1) / "verdict.json").read_text()
    assert '"state": "Crashed"' in verdict and "the node was lost" in verdict

    # The hook and the controller again, as if both fired late: still one next attempt.
    dead = read_run(run.id)
    schedule_next_attempt(train_attempt, dead, dead.state)
    assert retry_controller(str(run.id))["next_flow_run_id"] == str(successors("forced-1")[0].id)
    assert len(successors("forced-1")) == 1


def _blocks(blocks: dict) -> dict:
    return {"backend_block": blocks["backend_block"], "evidence_block": blocks["evidence_block"]}
