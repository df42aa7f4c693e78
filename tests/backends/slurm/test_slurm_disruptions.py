"""Slurm disruptions through the attempt flow: a node set DOWN, memory exhausted, the controller stopped mid-job."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from slurm_helpers import (
    Meanwhile, job_states, log_says, run, running_job, sacct_steps, save_slurm_blocks, tiny_spec,
)
from waiting import wait_for

from flows.attempt import train_attempt
from trainguard.core.evidence.manifest import read_manifest, verify_manifest
from trainguard.core.backends.slurm.job import job_name
from trainguard.core.spec import parse_spec
from trainguard.core.stores.folder import LocalEvidenceStore


def test_a_node_set_down_mid_job_is_a_node_failure_and_the_retry_waits_for_the_only_node(slurm_blocks, slurm_cluster):
    run_id = "slurm-nodedown-1"
    spec = tiny_spec("slurm-nodedown", "--steps", "60", "--step-seconds", "0.1")

    def disrupt() -> str:
        running_job(slurm_cluster, run_id, 1)
        wait_for(log_says(slurm_blocks["shared"], run_id, 1, "saved checkpoint step-000010"), what="a checkpoint")
        slurm_cluster.set_node("down", "trainguard test: node lost")
        # The only node is the one to avoid: the retry's job waits in the queue instead of being refused.
        wait_for(lambda: [s for _, s in job_states(slurm_cluster, job_name(run_id, 2)) if s == "PENDING"],
                 timeout=60, what="the retry's job to wait for a node")
        slurm_cluster.set_node("resume")
        return slurm_cluster.node_state()

    beside = Meanwhile(disrupt)
    beside.start()
    state, history = run(spec, slurm_blocks, run_id)
    beside.join_checked()

    assert state.is_completed(), state.message
    assert [(h["category"], h["termination_reason"]) for h in history[:1]] == [("node_failure", "NodeLost")]
    assert history[0]["node"] == slurm_cluster.node
    assert history[0]["decision"]["avoid_nodes"] == [slurm_cluster.node]
    # The newest checkpoint the lost node left: at least the last one its log says was saved (a save
    # may land just before the kill, its line not yet printed), and never an older one.
    log = next((slurm_blocks["evidence"] / "runs" / run_id / "attempt-1" / "logs").glob("train-*.log")).read_text()
    saved = [int(step) for step in re.findall(r"saved checkpoint step-(\d+)\.json", log)]
    resumed = int(re.search(r"step-(\d+)\.json$", history[1]["resumed_from"]).group(1))
    assert 10 <= max(saved) <= resumed, (saved, history[1]["resumed_from"])
    second = json.loads((slurm_blocks["shared"] / "runs" / run_id / "attempt-2" / "slurm-job.json").read_text())
    assert not any(option.startswith("--exclude") for option in second["sbatch_options"])
    node_file = slurm_blocks["evidence"] / "runs" / run_id / "attempt-1" / "slurm" / f"scontrol-show-node-{slurm_cluster.node}.txt"
    assert "trainguard test: node lost" in node_file.read_text()


_GREEDY = """
import time
held = []
for i in range(40):
    held.append(bytearray(50 * 2**20))
    print(f"step {i} holding {50 * (i + 1)} MiB", flush=True)
    time.sleep(0.2)
# Then hold it for up to two minutes: a loaded machine may poll the job's memory late, and a job that
# ended first would succeed. Only a limit that is never enforced lets it end.
for _ in range(600):
    time.sleep(0.2)
"""


def test_a_job_over_its_memory_limit_is_a_host_oom(prefect_server, slurm_node_up, tmp_path):
    # Where root may make memory cgroups (v1), the cluster confines jobs with task/cgroup: the kernel's
    # OOM killer ends the step and Slurm records it OUT_OF_MEMORY. Elsewhere jobacct_gather's
    # OverMemoryKill kills the step and says so in the job's stderr; the step just ends FAILED.
    blocks = save_slurm_blocks(slurm_node_up, tmp_path, memory_mb=300)
    spec = {"name": "slurm-oom", "command": [sys.executable, "-c", _GREEDY], "retry": {"max_total_attempts": 1}}
    state, history = run(spec, blocks, "slurm-oom-1")

    assert state.is_failed()
    assert (history[0]["category"], history[0]["termination_reason"]) == ("host_oom", "OOMKilled")
    kept = blocks["evidence"] / "runs" / "slurm-oom-1" / "attempt-1" / "slurm"
    err = next(kept.glob("slurm-*.err"))
    job_id = err.stem.removeprefix("slurm-")
    step = sacct_steps(kept / "sacct.txt", job_id)[f"{job_id}.0"]
    if slurm_node_up.memory_cgroups:
        assert "oom-kill event" in err.read_text() and step["State"] == "OUT_OF_MEMORY", step
    else:
        assert "exceeded memory limit" in err.read_text() and step["MaxRSS"], step


def test_a_controller_that_stops_answering_ends_attempts_saying_so_and_the_next_one_continues_the_job(
    prefect_server, slurm_node_up, tmp_path
):
    cluster, run_id = slurm_node_up, "slurm-ctldlost-1"
    blocks = save_slurm_blocks(cluster, tmp_path, command_timeout_seconds=5, controller_timeout_seconds=2)
    spec = tiny_spec("slurm-ctldlost", "--steps", "3000", "--step-seconds", "0.1", retry={"max_total_attempts": 2})

    def stop_controller() -> str:
        job_id = running_job(cluster, run_id, 1)
        wait_for(log_says(blocks["shared"], run_id, 1, "step 5/"), what="training to make progress")
        cluster.stop_controller()  # slurmd and the job run on; squeue, scontrol and sbatch get no answer
        return job_id

    beside = Meanwhile(stop_controller)
    beside.start()
    try:
        state, history = run(spec, blocks, run_id)  # attempt 2 finds the controller still silent at submission
        job_id = beside.join_checked()
    finally:
        beside.join(60)
        cluster.restart_controller()

    assert state.is_failed()
    assert [(h["termination_reason"], h["category"]) for h in history] == [("ControllerUnreachable", "transient_io")] * 2
    attempt = blocks["evidence"] / "runs" / run_id / "attempt-1"
    said = json.loads((attempt / "runner.json").read_text())["message"]
    assert f"at {cluster.node} is DOWN" in said and f"scancel {job_id}" in said and "\n" not in said
    second = json.loads((blocks["evidence"] / "runs" / run_id / "attempt-2" / "runner.json").read_text())
    assert "did not answer when trainguard went to submit attempt 2" in second["message"] and second["job_id"] is None
    store = LocalEvidenceStore(blocks["evidence"])
    manifest = read_manifest(store, run_id, 1)
    assert verify_manifest(store, manifest) == []
    names = {item.name for item in manifest.items}
    assert {f"slurm/slurm-{job_id}.out", "slurm/sacct.txt", "slurm/batch-script.sh", "snapshot/env.json"} <= names
    assert "did not answer" in {m.name: m.reason for m in manifest.missing}["slurm/scontrol-show-job.txt"]
    # slurmdbd still answers; the job's start may still sit in slurmctld's queue for it when slurmctld stops
    assert sacct_steps(attempt / "slurm" / "sacct.txt", job_id)[job_id]["State"] in ("PENDING", "RUNNING")
    assert "not final" in {m.name: m.reason for m in manifest.missing}["slurm/sacct-final"]
    _the_next_attempt_continues(cluster, blocks, run_id, spec, job_id)


def _the_next_attempt_continues(cluster: Any, blocks: dict[str, Any], run_id: str, spec: dict[str, Any],
                                job_id: str) -> None:
    """With slurmctld back, attempt 3 follows the job attempt 1 lost (it still trains), and submits none."""
    record = blocks["shared"] / "runs" / run_id / "attempt-3" / "slurm-job.json"

    def warn_once_continued() -> list[tuple[str, str]]:
        wait_for(record.is_file, timeout=60, what="attempt 3 to take the job over")
        running = job_states(cluster, job_name(run_id, 1))
        cluster.run("scancel", "--signal=TERM", "--batch", job_id)  # the job ends, as at its time limit
        return running

    beside = Meanwhile(warn_once_continued)
    beside.start()
    state = train_attempt(parse_spec(spec), attempt=3, run_id=run_id, backend_block=blocks["backend_block"],
                          evidence_block=blocks["evidence_block"], return_state=True)
    assert beside.join_checked() == [(job_id, "RUNNING")]

    assert state.is_failed()
    assert job_states(cluster, job_name(run_id, 3)) == []  # no job of its own
    assert json.loads(record.read_text())["job_attempt"] == 1
    kept = blocks["evidence"] / "runs" / run_id / "attempt-3"
    verdict = json.loads((kept / "verdict.json").read_text())
    assert (verdict["category"], verdict["termination_reason"]) == ("timeout", "DeadlineExceeded"), verdict
    assert "step 5/" in (kept / "logs" / f"train-{run_id}-attempt-3.log").read_text()  # the job's log, as its own
    assert json.loads((kept / "crash-report.json").read_text())["signal"] == 15
    store = LocalEvidenceStore(blocks["evidence"])
    assert verify_manifest(store, read_manifest(store, run_id, 3)) == []
    assert sacct_steps(kept / "slurm" / "sacct.txt", job_id)[job_id]["State"] == "FAILED"
