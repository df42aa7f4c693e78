"""The attempt flow on a real single-node Slurm: retries from checkpoints, fail-fast, limits and cancels.

Every job is a real `sbatch --no-requeue` job running the entrypoint under srun and the tiny
trainer; the flow follows it with squeue and reads its end from scontrol and the crash report.
"""

from __future__ import annotations

import json
import re

from slurm_helpers import (
    Meanwhile, job_states, jobcomp_lines, log_says, run, running_job, sacct_steps, save_slurm_blocks, tiny_spec,
)
from runs import run_logs
from waiting import wait_for

from trainguard.core.evidence.manifest import read_manifest, verify_manifest
from trainguard_entrypoint.notice import read_notice
from trainguard.core.backends.slurm.job import job_name
from trainguard.core.stores.folder import LocalEvidenceStore


def test_an_nccl_timeout_on_slurm_is_retried_from_its_checkpoint_and_succeeds(slurm_blocks, slurm_cluster):
    spec = tiny_spec("slurm-nccl", "--fail-at-step", "35", "--fail-on-attempt", "1", env={"WANDB_PROJECT": "sweeps"})
    state, history = run(spec, slurm_blocks, "slurm-nccl-1")

    assert state.is_completed(), state.message
    assert [(h["state"], h["category"]) for h in history] == [("Failed", "nccl_error"), ("Completed", None)]
    assert history[0]["node"] == slurm_cluster.node
    assert history[1]["resumed_from"].endswith("step-000030.json")
    evidence = slurm_blocks["evidence"] / "runs" / "slurm-nccl-1"
    assert "attempt 2: resumed from step 30" in next((evidence / "attempt-2" / "logs").glob("train-*.log")).read_text()

    store = LocalEvidenceStore(slurm_blocks["evidence"])
    manifest = read_manifest(store, "slurm-nccl-1", 1)
    assert verify_manifest(store, manifest) == []
    names = {item.name for item in manifest.items}
    job_id = json.loads((evidence / "attempt-1" / "slurm" / "slurm-job.json").read_text())["job_id"]
    for expected in (f"slurm/slurm-{job_id}.out", f"slurm/slurm-{job_id}.err", "slurm/scontrol-show-job.txt",
                     "slurm/batch-script.sh", "slurm/jobcomp.txt", "slurm/sacct.txt", "slurm/sacct.json",
                     "crash-report.json", "snapshot/env.json"):
        assert expected in names, expected
    assert not [item for item in manifest.missing if item.name.startswith("slurm/sacct")], manifest.missing
    steps = sacct_steps(evidence / "attempt-1" / "slurm" / "sacct.txt", job_id)
    assert set(steps) == {job_id, f"{job_id}.batch", f"{job_id}.0"}  # the allocation, the batch shell, srun's step
    for step in steps.values():  # MaxRSS too, where sampled: a step this short may end before its first sample
        assert (step["State"], step["ExitCode"], step["NodeList"]) == ("FAILED", "1:0", slurm_cluster.node), step
        assert re.fullmatch(r"\d\d:\d\d:\d\d", step["Elapsed"]) and "MaxRSS" in step, step
        assert step["MaxRSS"] == "" or _bytes(step["MaxRSS"]) > 0, step
    assert f'"job_id": {job_id}' in (evidence / "attempt-1" / "slurm" / "sacct.json").read_text()
    assert "JobState=FAILED" in (evidence / "attempt-1" / "slurm" / "scontrol-show-job.txt").read_text()
    assert "Requeue=0" in (evidence / "attempt-1" / "slurm" / "scontrol-show-job.txt").read_text()  # --no-requeue
    assert "Watchdog caught collective" in (evidence / "attempt-1" / "slurm" / f"slurm-{job_id}.out").read_text()
    assert "srun" in (evidence / "attempt-1" / "slurm" / "batch-script.sh").read_text()
    # the spec's env reaches the job through container_env and sbatch's environment
    assert json.loads((evidence / "attempt-1" / "snapshot" / "env.json").read_text())["variables"]["WANDB_PROJECT"] == "sweeps"


def test_a_type_error_on_slurm_fails_fast_with_one_job(slurm_blocks, slurm_cluster):
    state, history = run(tiny_spec("slurm-typeerror", "--fail-after-steps", "3", "--failure", "type-error"),
                         slurm_blocks, "slurm-typeerror-1")

    assert state.is_failed()
    assert len(history) == 1 and history[0]["category"] == "code_error"
    assert history[0]["exit_code"] == 1 and history[0]["termination_reason"] == "Error"
    assert len(jobcomp_lines(slurm_cluster, job_name("slurm-typeerror-1", 1))) == 1
    assert jobcomp_lines(slurm_cluster, job_name("slurm-typeerror-1", 2)) == []


def test_scancel_by_a_user_is_user_cancelled_and_not_retried(slurm_blocks, slurm_cluster):
    spec = tiny_spec("slurm-scancel", "--steps", "600", "--step-seconds", "0.1")

    def cancel() -> str:
        job_id = running_job(slurm_cluster, "slurm-scancel-1", 1)
        # past 1.5 s of training: jobacct_gather (every 1 s) has sampled the step's memory by then
        wait_for(log_says(slurm_blocks["shared"], "slurm-scancel-1", 1, "step 15/"), what="training to make progress")
        slurm_cluster.run("scancel", job_id)
        return job_id

    beside = Meanwhile(cancel)
    beside.start()
    state, history = run(spec, slurm_blocks, "slurm-scancel-1")
    beside.join_checked()

    assert state.is_failed()
    assert [(h["category"], h["termination_reason"]) for h in history] == [("user_cancelled", "Cancelled")]
    assert "not retryable" in history[0]["decision"]["reason"]
    # scancel's SIGTERM reached the batch shell too: the training was told, as a cancel, not a preemption
    notice = read_notice(slurm_blocks["shared"] / "runs" / "slurm-scancel-1" / "attempt-1" / "notice.json")
    assert notice is not None and notice.reason == "cancelled" and notice.deadline > notice.given_at, notice
    assert jobcomp_lines(slurm_cluster, job_name("slurm-scancel-1", 2)) == []
    job_id = beside.result
    steps = sacct_steps(slurm_blocks["evidence"] / "runs" / "slurm-scancel-1" / "attempt-1" / "slurm" / "sacct.txt", job_id)
    assert steps[job_id]["State"].startswith("CANCELLED by ")  # sacct names who cancelled it
    for step in (f"{job_id}.batch", f"{job_id}.0"):  # each step's own end, as accounting kept it
        assert re.fullmatch(r"\d+:\d+", steps[step]["ExitCode"]), steps[step]
    for step in (f"{job_id}.batch", f"{job_id}.0"):  # the batch shell's and the trainer's peak memory
        assert 0 < _bytes(steps[step]["MaxRSS"]) < 4 * 2**30, steps[step]


def test_a_job_over_its_time_limit_is_a_timeout(prefect_server, slurm_node_up, tmp_path):
    blocks = save_slurm_blocks(slurm_node_up, tmp_path, signal_lead_seconds=0)
    spec = tiny_spec("slurm-timeout", "--steps", "100000", "--step-seconds", "0.5", deadline_seconds=30,
                     retry={"max_total_attempts": 1})
    state, history = run(spec, blocks, "slurm-timeout-1")

    assert state.is_failed()
    assert (history[0]["category"], history[0]["termination_reason"]) == ("timeout", "DeadlineExceeded")
    assert "TIMEOUT" in history[0]["signature"] or history[0]["rule_id"] == "reason.deadline"
    kept = blocks["evidence"] / "runs" / "slurm-timeout-1" / "attempt-1" / "slurm"
    assert "TimeLimit=00:01:00" in (kept / "scontrol-show-job.txt").read_text()
    job_id = json.loads((kept / "slurm-job.json").read_text())["job_id"]
    assert sacct_steps(kept / "sacct.txt", job_id)[job_id]["State"] == "TIMEOUT"  # Slurm's own word, as accounting kept it
    store = LocalEvidenceStore(blocks["evidence"])
    assert verify_manifest(store, read_manifest(store, "slurm-timeout-1", 1)) == []


def _bytes(max_rss: str) -> float:
    """sacct's MaxRSS (`34320K`, `1.50M`, `0`) in bytes."""
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)", max_rss).groups()
    return float(number) * 1024 ** " KMGT".index(unit or " ")


def test_a_job_waiting_in_the_queue_is_reported_with_slurms_reason_while_it_waits(prefect_server, slurm_node_up, tmp_path):
    blocks = save_slurm_blocks(slurm_node_up, tmp_path, extra_sbatch_options=["--begin=now+8"])
    state, history = run(tiny_spec("slurm-queued", "--steps", "3"), blocks, "slurm-queued-1")
    assert state.is_completed(), state.message
    said = wait_for(lambda: [m for m in run_logs(history[0]["flow_run_id"]) if m.startswith("trainguard: waiting")],
                    timeout=20, what="the waiting lines in Prefect")
    # squeue's reason for a job held until its begin time, as `squeue` shows it in NODELIST(REASON)
    assert re.fullmatch(r"trainguard: waiting [5-7]s for Slurm job \d+ to start: PENDING \(BeginTime\)", said[0]), said


def test_a_job_sbatch_refuses_is_judged_by_sbatchs_own_words(prefect_server, slurm_node_up, tmp_path):
    """A partition the cluster does not have: real sbatch refuses at submission, and its message,
    not the bare start failure, says the request must change: a configuration error, no retry."""
    blocks = save_slurm_blocks(slurm_node_up, tmp_path, partition="no-such-partition")
    state, history = run(tiny_spec("slurm-badpart", retry={"max_attempts": 3}), blocks, "slurm-badpart-1")

    assert state.is_failed()
    assert [(h["category"], h["termination_reason"]) for h in history] == [("config_error", "StartError")]
    assert history[0]["rule_id"] == "slurm.submit_impossible", history[0]
    assert job_states(slurm_node_up, job_name("slurm-badpart-1", 1)) == []
