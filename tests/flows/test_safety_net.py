"""The safety net for attempts whose flow process died where no hook could see it.

Real parts throughout: the session's Prefect server with its automation services, the deployments
served by `python -m deployments.serve` in a subprocess (a real runner), `trainguard setup`'s own
automations running the retry-controller deployment, real training processes and real signals.
"""

from __future__ import annotations

import os
import re
import signal
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from uuid import UUID

import pytest
from processes import alive
from flow_helpers import attempt_dir, attempt_runs, parent_pid, read_run, tiny_spec
from prefect import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterKey,
    DeploymentFilter,
    DeploymentFilterName,
    FlowRunFilter,
    FlowRunFilterTags,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.deployments import run_deployment
from prefect.states import Crashed, Running
from typer.testing import CliRunner
from waiting import wait_for

from deployments import automations
from deployments.setup import run_setup
from flows.attempt import train_attempt
from flows.controller import retry_controller
from flows.hooks import schedule_next_attempt
from trainguard.cli import app


@pytest.fixture(scope="module")
def safety_net(serve_session):
    """`trainguard setup`'s work against the test server, with the deployments served.

    The automations are removed afterwards, so other modules' tests see only their own flows' doing.
    """
    yield run_setup()
    with get_client(sync_client=True) as client:
        for name in (automations.CRASHED, automations.FAILED, automations.ZOMBIE):
            for automation in client.read_automations_by_name(name):
                client.delete_automation(automation.id)


@pytest.fixture(autouse=True)
def _still_served(served):
    """Every test here needs the serving process alive: one that died says so, with its log."""


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


def _setup(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["setup", *args])
    return result.exit_code, result.output


def test_trainguard_setup_is_idempotent_and_its_zombie_automation_has_the_shape_prefect_documents(safety_net):
    code, out = _setup("--heartbeat-seconds", "30")
    assert code == 0, out
    assert out.count("automation updated:") == 3 and "automation created" not in out  # the fixture made them
    assert f"retry controller: deployment retry-controller/local ({safety_net.controller_id})" in out
    assert "trainguard-local-process-backend" in out
    with get_client(sync_client=True) as client:
        for name in (automations.CRASHED, automations.FAILED, automations.ZOMBIE):
            assert len(client.read_automations_by_name(name)) == 1
        crashed = client.read_automations_by_name(automations.CRASHED)[0]
        zombie = client.read_automations_by_name(automations.ZOMBIE)[0]
    assert crashed.actions[0].deployment_id == safety_net.controller_id
    assert crashed.actions[0].parameters == {"flow_run_id": "{{ flow_run.id | string }}"}
    trigger = zombie.trigger
    # https://docs.prefect.io/v3/advanced/detect-zombie-flows: after each heartbeat of a flow run, any
    # event of that run within 90 s (3 heartbeats of 30 s), else the run is marked Crashed
    assert trigger.after == {"prefect.flow-run.heartbeat"} and trigger.expect == {"prefect.flow-run.*"}
    assert trigger.for_each == {"prefect.resource.id"} and trigger.posture == "Proactive"
    assert trigger.threshold == 1 and trigger.within == timedelta(seconds=90)
    assert trigger.match.model_dump() == {"prefect.resource.id": "prefect.flow-run.*"}
    # deployed attempts and training-runs only: an attempt inside a training-run is retried by that run
    assert [spec.model_dump() for spec in trigger.match_related] == [
        {"prefect.resource.role": "flow", "prefect.resource.name": ["train-attempt", "training-run"]},
        {"prefect.resource.role": "deployment"}]
    assert zombie.actions[0].type == "change-flow-run-state" and zombie.actions[0].state == "CRASHED"


def test_trainguard_setup_runs_the_controller_deployment_it_is_given_and_refuses_bad_options(safety_net):
    other = retry_controller.to_deployment(name="elsewhere").apply()
    try:
        code, out = _setup("--controller-deployment", "retry-controller/elsewhere")
        assert code == 0, out
        with get_client(sync_client=True) as client:
            for name in (automations.CRASHED, automations.FAILED):
                assert client.read_automations_by_name(name)[0].actions[0].deployment_id == other
        code, out = _setup("--controller-deployment", "retry-controller/nowhere")
        assert code != 0 and "--controller-deployment 'retry-controller/nowhere': no such deployment" in out
        assert len(out.strip().splitlines()) == 1 and "Traceback" not in out
        code, out = _setup("--heartbeat-seconds", "10")
        assert code != 0 and "--heartbeat-seconds 10" in out and len(out.strip().splitlines()) == 1
    finally:
        # the other tests' automations run retry-controller/local again, with Prefect's default heartbeat
        assert _setup()[0] == 0
        with get_client(sync_client=True) as client:
            client.delete_deployment(other)
            assert client.read_automations_by_name(automations.ZOMBIE)[0].trigger.within == timedelta(seconds=540)


def test_a_sigkilled_attempt_gets_one_successor_its_evidence_and_no_orphaned_training(safety_net, blocks):
    run, trainer, entrypoint, flow_process = _hanging_attempt(blocks, "kill9")
    os.kill(flow_process, signal.SIGKILL)  # no finally, no hook in that process: nothing of it runs again

    wait_for(lambda: read_run(run.id).state.is_crashed(), 60, "the runner to mark the attempt Crashed")
    wait_for(lambda: finished_controller(run.id), 120, "the automation's retry controller to finish")
    assert len(successors("kill9-1")) == 1, "hook and controller must schedule one next attempt together"
    nxt = successors("kill9-1")[0]
    assert nxt.state.is_scheduled() and nxt.parameters["parent_flow_run_id"] == str(run.id)
    assert nxt.parameters["resume_from"].endswith("step-000010.json")
    # Stopped by whichever comes first: the entrypoint's own watch (its supervisor died) or the crash
    # hook through the process record. The frozen-process test below is where only the latter can act.
    assert wait_for(lambda: not alive(trainer) and not alive(entrypoint), 30, "the orphaned training to stop")

    evidence = attempt_dir(blocks["evidence"], "kill9-1", 1)
    assert (evidence / "manifest.json").exists()
    assert b"injecting failure 'hang'" in next((evidence / "logs").glob("*.log")).read_bytes()
    assert finished_controller(run.id)[0].state.is_completed()


def test_a_frozen_flow_process_marked_crashed_is_recovered_by_the_controller_alone(safety_net, blocks):
    """A flow process that hangs (SIGSTOP here; a stuck NFS read or a frozen cgroup in life) sends no
    heartbeat, and the zombie automation marks its run Crashed. No hook can run: the process never
    exits. Its training still runs, and the entrypoint's own watch cannot help, because its supervisor
    is still there: only the retry controller can stop it, through the process record.
    """
    run, trainer, entrypoint, flow_process = _hanging_attempt(blocks, "frozen")
    os.kill(flow_process, signal.SIGSTOP)
    try:
        with get_client(sync_client=True) as client:  # what the zombie automation does after 3 silent periods
            client.set_flow_run_state(run.id, Crashed(message="no heartbeat for 540 s"), force=True)
        assert parent_pid(entrypoint) == flow_process and alive(trainer)  # the watch sees its supervisor
        controller = wait_for(lambda: finished_controller(run.id), 120, "the automation's retry controller")[0]
        wait_for(lambda: not alive(trainer) and not alive(entrypoint), 60, "the controller to stop the training")
        assert len(successors("frozen-1")) == 1
        nxt = successors("frozen-1")[0]
        assert read_run(run.id).state.is_crashed(), "the frozen process reported nothing"
        assert logged(controller.id, f"entrypoint pid {entrypoint}", f"the next attempt is flow run {nxt.id}")
        assert (attempt_dir(blocks["evidence"], "frozen-1", 1) / "manifest.json").exists()
    finally:
        os.kill(flow_process, signal.SIGKILL)


def test_a_run_forced_crashed_with_the_hook_and_controllers_firing_at_once_gets_one_successor_verdict_and_report(
    safety_net, blocks,
):
    # Scheduled an hour ahead so no runner picks it up: no process, so no hook runs but the one started here.
    run = run_deployment("train-attempt/local", timeout=0, tags=["trainguard-run:race-1"],
                         scheduled_time=datetime.now(timezone.utc) + timedelta(hours=1), parameters={
                             "spec": _spec_that_hangs("race"), "run_id": "race-1", **_blocks(blocks)})
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run.id, Running(), force=True)
        client.set_flow_run_state(run.id, Crashed(message="the node was lost"), force=True)
    dead = read_run(run.id)
    start, answers = threading.Barrier(2), {}

    def hook() -> None:
        start.wait()
        schedule_next_attempt(train_attempt, dead, dead.state)

    def controller() -> None:
        start.wait()
        answers["controller"] = retry_controller(str(run.id))

    racers = [threading.Thread(target=hook), threading.Thread(target=controller)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(120)
    wait_for(lambda: finished_controller(run.id), 120, "the automation's retry controller, a third party")

    assert [r.id for r in successors("race-1")] == [UUID(answers["controller"]["next_flow_run_id"])]
    with get_client(sync_client=True) as client:
        reports = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["race-1-report", "race-1-attempt-1", "race-1-attempts"])))
    # what its own flow would have published: the run's timeline, the attempt's report, the table of attempts
    keys = sorted(r.key for r in reports)
    assert keys == ["race-1-attempt-1", "race-1-attempts", "race-1-report"], "judged, kept and reported once"
    assert {r.flow_run_id for r in reports} == {run.id}, "the reports show on the dead attempt's own flow run"
    assert "preempted" in next(r for r in reports if r.key == "race-1-attempt-1").data
    assert (attempt_dir(blocks["evidence"], "race-1", 1) / "manifest.json").exists()
    verdict = (attempt_dir(blocks["evidence"], "race-1", 1) / "verdict.json").read_text()
    assert '"state": "Crashed"' in verdict and "the node was lost" in verdict
    automation_controller = finished_controller(run.id)[0]
    assert automation_controller.state.is_completed()
    assert logged(automation_controller.id, f"the next attempt is flow run {successors('race-1')[0].id}")


def test_a_sigkilled_scheduled_training_run_is_continued_from_its_checkpoint_by_the_controller(safety_net, blocks):
    """`nightly-retrain` style: attempts run as subflows of one training-run flow process, which is
    killed. Nothing of it reports; the controller settles the attempt it ran and continues the run."""
    run, trainer, entrypoint, flow_process = _hanging_attempt(blocks, "nightly", deployment="training-run/local")
    os.kill(flow_process, signal.SIGKILL)
    wait_for(lambda: read_run(run.id).state.is_crashed(), 60, "the runner to mark the training-run Crashed")
    wait_for(lambda: finished_controller(run.id), 120, "the automation's retry controller to finish")

    attempt = attempt_runs("nightly-1")[0]
    assert attempt.state.is_crashed() and "died while it ran" in attempt.state.message
    with get_client(sync_client=True) as client:
        continued = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            tags=FlowRunFilterTags(all_=["trainguard-run:nightly-1", f"parent:{run.id}"])))
    assert len(continued) == 1 and continued[0].deployment_id == run.deployment_id
    resume = continued[0].parameters["resume"]
    assert resume["attempt"] == 2 and resume["resume_from"].endswith("step-000010.json")
    assert [h["state"] for h in resume["history"]] == ["Crashed"] and continued[0].parameters["run_id"] == "nightly-1"
    assert wait_for(lambda: not alive(trainer) and not alive(entrypoint), 30, "the orphaned training to stop")
    assert (attempt_dir(blocks["evidence"], "nightly-1", 1) / "verdict.json").exists()
    assert logged(finished_controller(run.id)[0].id, f"continues as flow run {continued[0].id}")


def logs_of(flow_run_id) -> str:
    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return "\n".join(log.message for log in logs)


def logged(flow_run_id, *texts: str) -> bool:
    """Whether the flow run's logs hold every text; its logs are shipped in batches, after its state."""
    return bool(wait_for(lambda: all(text in logs_of(flow_run_id) for text in texts), 120, f"{texts} in the logs"))


def _hanging_attempt(blocks: dict, name: str, deployment: str = "train-attempt/local") -> tuple:
    """Attempt 1 of run `<name>-1`, served, once its training hangs: (run, trainer, entrypoint, flow process)."""
    run_id = f"{name}-1"
    run = run_deployment(deployment, timeout=0, tags=[f"trainguard-run:{run_id}"], parameters={
        "spec": _spec_that_hangs(name), "run_id": run_id, **_blocks(blocks)})
    log = blocks["work"] / "runs" / run_id / "attempt-1" / "logs" / f"train-{run_id}-attempt-1.log"
    wait_for(lambda: log.exists() and b"injecting failure 'hang'" in log.read_bytes(), 90, "training to hang")
    trainer = int(re.search(rb"pid (\d+)", log.read_bytes()).group(1))
    entrypoint = parent_pid(trainer)
    flow_process = parent_pid(entrypoint)
    assert b"prefect" in Path(f"/proc/{flow_process}/cmdline").read_bytes()
    return run, trainer, entrypoint, flow_process


def _blocks(blocks: dict) -> dict:
    return {"backend_block": blocks["backend_block"], "evidence_block": blocks["evidence_block"]}
