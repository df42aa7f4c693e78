"""Deployment mode: attempts chained by the state hooks through real deployment runs.

One test serves the deployments from a subprocess (a real runner) and lets the chain run; one
executes an attempt in its own process, SIGTERMs it mid-training, and checks that the evidence was
kept, the run is Crashed and the next attempt is scheduled once, however often the hook runs.
"""

from __future__ import annotations

import os
import re
import signal
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from prefect.artifacts import Artifact
from s3fixtures import CREDENTIALS
from flow_helpers import attempt_dir, attempt_runs, parent_pid, read_run, tiny_spec
from waiting import wait_for
from prefect.deployments import run_deployment

from flows.attempt import train_attempt
from blocks.evidence import S3EvidenceStore
from flows.hooks import schedule_next_attempt
from trainguard.core.spec import parse_spec


def test_a_served_deployment_chains_a_failed_attempt_into_a_scheduled_retry_that_succeeds(served, blocks, s3):
    # evidence in S3, which answers nothing while the attempts run: the failure hook schedules the retry
    # without waiting on it, and each attempt's process sends its evidence up before it ends
    bucket, evidence_block = _hanging_s3_evidence(s3)
    spec = tiny_spec("served", "--fail-at-step", "25", "--fail-on-attempt", "1", retry={"delay_seconds": 2})
    params = {"spec": spec, "run_id": "served-1",
              "backend_block": blocks["backend_block"], "evidence_block": evidence_block}
    first = run_deployment("train-attempt/local", parameters=params, timeout=0, tags=["trainguard-run:served-1"])

    second = wait_for(lambda: next((r for r in attempt_runs("served-1") if r.id != first.id), None), 150,
                      "the second attempt to be scheduled")
    assert s3.proxy.holding >= 1 and s3.objects(bucket) == {}  # while S3 had answered nothing
    assert second.parameters["attempt"] == 2 and second.parameters["parent_flow_run_id"] == str(first.id)
    assert second.parameters["resume_from"].endswith("step-000020.json")
    assert {"attempt:2", f"parent:{first.id}"} <= set(second.tags)
    s3.proxy.reset()  # S3 answers again
    wait_for(lambda: read_run(second.id).state.is_completed(), 150, "the second attempt to complete")
    assert (second.expected_start_time - read_run(first.id).end_time).total_seconds() >= 1.5  # scheduled in the future
    assert read_run(first.id).state.is_failed() and "nccl_error" in read_run(first.id).state.message
    logs = [key for key in s3.objects(bucket) if "/attempt-2/logs/" in key]
    assert b"attempt 2: resumed from step 20" in s3.objects(bucket)[logs[0]]
    for attempt in (1, 2):  # each attempt's process waited for its upload and said so in its report
        assert f"evidence/runs/served-1/attempt-{attempt}/manifest.json" in s3.objects(bucket)
        report = str(Artifact.get(f"served-1-attempt-{attempt}").data)
        assert "uploading" not in report and "[verdict.json](<" in report


def _hanging_s3_evidence(s3) -> tuple[str, str]:
    """An S3 evidence block (keys in it: the served process has no AWS environment) and S3 holding every request."""
    block = S3EvidenceStore(bucket=s3.new_bucket(), prefix="evidence", region="us-east-1", endpoint_url=s3.proxy.url,
                            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                            spool_dir=str(Path(tempfile.mkdtemp(prefix="served-spool-"))), upload_budget_seconds=600)
    block.save("served-s3", overwrite=True)
    s3.proxy.hold(lambda method, path: True, every=True)
    return block.bucket, "trainguard-s3-evidence-store/served-s3"


def test_sigterm_mid_training_keeps_evidence_crashes_and_schedules_the_next_attempt_once(served, blocks):
    spec = tiny_spec("sigterm", "--fail-after-steps", "12", "--failure", "hang", retry={"delay_seconds": 600})
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
