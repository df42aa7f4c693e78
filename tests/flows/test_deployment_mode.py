"""Deployment mode: attempts chained by the state hooks through real deployment runs.

One test serves the deployments from a subprocess (a real runner) and lets the chain run; one
executes an attempt in its own process, SIGTERMs it mid-training, and checks that the evidence was
kept, the run is Crashed and the next attempt is scheduled once, however often the hook runs.
"""

from __future__ import annotations

import os
import re
import signal
from datetime import datetime, timezone
from pathlib import Path

from flow_helpers import attempt_dir, attempt_runs, deployment_exists, parent_pid, read_run, tiny_spec
from waiting import wait_for
from prefect.deployments import run_deployment

from flows.attempt import train_attempt
from flows.hooks import schedule_next_attempt
from trainguard.core.spec import parse_spec


def test_a_served_deployment_chains_a_failed_attempt_into_a_scheduled_retry_that_succeeds(served, blocks):
    spec = tiny_spec("served", "--fail-at-step", "25", "--fail-on-attempt", "1", retry={"delay_seconds": 2})
    params = {"spec": spec, "run_id": "served-1",
              "backend_block": blocks["backend_block"], "evidence_block": blocks["evidence_block"]}
    wait_for(lambda: deployment_exists("train-attempt/local"), 60, "the served deployment")
    first = run_deployment("train-attempt/local", parameters=params, timeout=0, tags=["trainguard-run:served-1"])

    runs = wait_for(lambda: [r for r in attempt_runs("served-1") if len(attempt_runs("served-1")) == 2
                             and r.state.is_completed()], 150, "the second attempt to complete")
    second = runs[0]
    assert second.parameters["attempt"] == 2 and second.parameters["parent_flow_run_id"] == str(first.id)
    assert second.parameters["resume_from"].endswith("step-000020.json")
    assert {"attempt:2", f"parent:{first.id}"} <= set(second.tags)
    assert (second.expected_start_time - read_run(first.id).end_time).total_seconds() >= 1.5  # scheduled in the future
    assert read_run(first.id).state.is_failed() and "nccl_error" in read_run(first.id).state.message
    log = next((attempt_dir(blocks["evidence"], "served-1", 2) / "logs").glob("*.log")).read_text()
    assert "attempt 2: resumed from step 20" in log


def test_sigterm_mid_training_keeps_evidence_crashes_and_schedules_the_next_attempt_once(served, blocks):
    spec = tiny_spec("sigterm", "--fail-after-steps", "12", "--failure", "hang", retry={"delay_seconds": 600})
    wait_for(lambda: deployment_exists("train-attempt/local"), 60, "the served deployment")
    run = run_deployment("train-attempt/local", timeout=0, tags=["trainguard-run:sigterm-1"], parameters={
        "spec": spec, "run_id": "sigterm-1", "backend_block": blocks["backend_block"],
        "evidence_block": blocks["evidence_block"]})
    log = blocks["work"] / "runs" / "sigterm-1" / "attempt-1" / "logs" / "train-sigterm-1-attempt-1.log"
    wait_for(lambda: log.exists() and b"injecting failure 'hang'" in log.read_bytes(), 90, "training to hang")
    trainer = int(re.search(rb"pid (\d+)", log.read_bytes()).group(1))
    flow_process = parent_pid(parent_pid(trainer))  # trainer <- container entrypoint <- the flow run's engine
    assert b"prefect" in Path(f"/proc/{flow_process}/cmdline").read_bytes()
    os.kill(flow_process, signal.SIGTERM)
    wait_for(lambda: read_run(run.id).state.is_final(), 60, "the attempt to end")

    crashed = read_run(run.id)
    assert crashed.state.is_crashed(), crashed.state
    evidence = attempt_dir(blocks["evidence"], "sigterm-1", 1)
    assert (evidence / "manifest.json").exists()
    assert b"injecting failure 'hang'" in next((evidence / "logs").glob("*.log")).read_bytes()

    # Hooks run after the Crashed state is committed, so the next attempt may appear a moment later.
    scheduled = wait_for(lambda: [r for r in attempt_runs("sigterm-1") if r.parameters.get("attempt") == 2],
                         60, "the next attempt to be scheduled")
    assert len(scheduled) == 1 and scheduled[0].state.is_scheduled()
    assert scheduled[0].expected_start_time > datetime.now(timezone.utc)
    assert scheduled[0].parameters["resume_from"].endswith("step-000010.json")

    schedule_next_attempt(train_attempt, crashed, crashed.state)  # the hook again, e.g. from an automation
    assert len([r for r in attempt_runs("sigterm-1") if r.parameters.get("attempt") == 2]) == 1
    parse_spec(scheduled[0].parameters["spec"])  # the next attempt's spec is a valid spec
