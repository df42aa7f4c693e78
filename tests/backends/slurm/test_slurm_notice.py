"""Slurm's notices on the real test Slurm. The warning before the time limit: `--signal=B:TERM@<notice grace>` reaches
the batch shell, which writes the notice (reason time_limit, the limit as its deadline) into the task's
folder and passes SIGTERM on to the entrypoint, which passes it to torchrun and its ranks. The ranks
(real PyTorch over gloo, examples/ddp/train.py under the training-side helper) agree on a step, rank 0
saves and acknowledges it, and the next attempt resumes there.

The warning comes when Slurm's timer sees it due (up to a minute early),
so how far an attempt gets is not fixed: an attempt warned again resumes the next one the same way,
and the test checks every hand-over, not a count of attempts.

A preemption: a job of the higher-tier `urgent` partition needs the node the training holds, so
Slurm moves the training job's end to now + the default partition's GraceTime and sends SIGTERM
straight to its tasks (not to the batch shell, unless the site sets `preempt_send_user_signal`).
Each task's entrypoint asks Slurm why, writes a notice with reason preemption and the job's new
end as its deadline, and the ranks save the agreed step before it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from services.slurm_cluster import GRACE_SECONDS, URGENT, SlurmCluster
from slurm_helpers import Meanwhile, job_states, run
from waiting import wait_for

from trainguard.core.backends.slurm.job import job_name
from trainguard_entrypoint import acks
from trainguard_entrypoint.notice import read_notice

EXAMPLE = str(Path(__file__).resolve().parents[3] / "examples" / "ddp" / "train.py")
RUN_ID = "slurm-notice-1"
PREEMPTED_RUN = "slurm-preempt-1"


def test_the_warning_before_the_time_limit_saves_the_agreed_step_and_the_next_attempt_resumes_there(
        slurm_blocks: dict[str, Any]) -> None:
    # Two minutes, warned 30 s before: Slurm's timer sends it 30 to 90 s after the start, once the
    # ranks train (more than 90 s of steps, so the first attempt is always warned). Every attempt ends
    # the same way (timeout), each with progress: the signature breaker is not what this is about.
    spec = {"name": "slurm-notice", "processes_per_node": 2, "deadline_seconds": 120, "notice_grace_seconds": 30,
            "retry": {"max_attempts": 3, "delay_seconds": 0, "same_signature_limit": 10},
            "command": [sys.executable, "-m", "torch.distributed.run", EXAMPLE, "--steps", "360",
                        "--checkpoint-every", "100000", "--step-seconds", "0.25"]}  # notice checkpoints only
    state, history = run(spec, slurm_blocks, RUN_ID)
    assert state.is_completed(), history
    assert len(history) >= 2, "the first attempt was not warned before its time limit"
    checkpoints = slurm_blocks["shared"] / "runs" / RUN_ID / "checkpoints"
    saved = acks.read_acks(checkpoints)
    by_attempt = {ack.notice["given_at"]: ack for ack in saved.values() if ack.kind == "notice" and ack.notice}
    assert len(by_attempt) == len(history) - 1, saved  # one notice checkpoint per warned attempt
    for number, (warned, after) in enumerate(zip(history, history[1:]), start=1):
        assert warned["termination_reason"] == "DeadlineExceeded", warned
        folder = slurm_blocks["shared"] / "runs" / RUN_ID / f"attempt-{number}"
        notice = read_notice(folder / "notice.json")
        assert notice is not None and notice.reason == "time_limit", notice
        assert "--signal=B:TERM@30" in notice.source
        ack = by_attempt[notice.given_at]
        assert acks.verify(checkpoints, ack) is None and ack.step >= 1
        assert ack.seconds_from_notice is not None and ack.seconds_from_notice < notice.deadline - notice.given_at
        assert after["resumed_from"] and after["resumed_from"].endswith(ack.checkpoint)
        log = (slurm_blocks["shared"] / "runs" / RUN_ID / f"attempt-{number + 1}" / "logs"
               / f"train-{RUN_ID}-attempt-{number + 1}.log").read_text()
        assert f"at step {ack.step}" in log and f"step {ack.step + 1} loss" in log
    assert history[-1]["state"] == "Completed"


def _preempt_once_it_trains(cluster: SlurmCluster, checkpoints: Path, urgent: list[str]) -> str:
    """Once the first attempt has completed a few steps, submit an urgent job that needs its node; once that
    one runs (the training job has left the node), end it so the next attempt gets the node. The training job's id."""
    wait_for(lambda: (p := acks.read_progress(checkpoints)) is not None and p.attempt == "1" and p.step >= 5,
             timeout=120, what="the first attempt to complete 5 steps", interval=0.2)
    name = job_name(PREEMPTED_RUN, 1)
    training = next(j for j, s in job_states(cluster, name) if s == "RUNNING")
    output = checkpoints.parents[3] / "urgent-%j.out"  # in the test's tmp_path
    urgent.append(cluster.run("sbatch", "--parsable", f"--partition={URGENT}", "--exclusive", "--job-name=urgent",
                              f"--output={output}", "--wrap", "sleep 300").stdout.strip().split(";")[0])
    wait_for(lambda: dict(job_states(cluster, "urgent")).get(urgent[0]) == "RUNNING", timeout=GRACE_SECONDS + 60,
             what=lambda: f"the urgent job to run in place of the training job ({job_states(cluster, name)})",
             interval=0.2)
    cluster.run("scancel", urgent[0])
    return training


def test_a_preemption_gives_notice_the_ranks_save_the_agreed_step_and_the_next_attempt_resumes_there(
        slurm_node_up: SlurmCluster, slurm_blocks: dict[str, Any]) -> None:
    # A limit far off (no warning before it), periodic checkpoints never: only the notice saves.
    spec = {"name": "slurm-preempt", "processes_per_node": 2, "deadline_seconds": 600,
            "retry": {"max_attempts": 2, "delay_seconds": 0},
            "command": [sys.executable, "-m", "torch.distributed.run", EXAMPLE, "--steps", "80",
                        "--checkpoint-every", "100000", "--step-seconds", "0.25"]}
    checkpoints = slurm_blocks["shared"] / "runs" / PREEMPTED_RUN / "checkpoints"
    urgent: list[str] = []
    preempting = Meanwhile(lambda: _preempt_once_it_trains(slurm_node_up, checkpoints, urgent))
    preempting.start()
    try:
        state, history = run(spec, slurm_blocks, PREEMPTED_RUN)
        training = preempting.join_checked(timeout=60)
    finally:
        for job in urgent:
            slurm_node_up.run("scancel", job, check=False)
    assert state.is_completed(), history
    assert len(history) == 2, history
    first, second = history
    notice = read_notice(slurm_blocks["shared"] / "runs" / PREEMPTED_RUN / "attempt-1" / "notice.json")
    assert notice is not None and notice.reason == "preemption", notice
    assert GRACE_SECONDS - 10 <= notice.deadline - notice.given_at <= GRACE_SECONDS + 1, notice  # Slurm's whole seconds
    shown = slurm_node_up.run("sacct", "--noheader", "-X", f"--jobs={training}", "--format=Partition").stdout.split()
    assert shown == ["debug"], shown  # the training job was the preempted one
    saved = [ack for ack in acks.read_acks(checkpoints).values() if ack.kind == "notice"]
    assert len(saved) == 1, saved
    ack = saved[0]
    assert acks.verify(checkpoints, ack) is None and ack.step >= 5
    assert ack.notice is not None and ack.notice["reason"] == "preemption"
    assert ack.seconds_from_notice is not None and ack.seconds_from_notice < notice.deadline - notice.given_at
    assert first["category"] == "preempted" and first["retryable"], first
    assert first["termination_reason"] == "Preempted", first
    assert first["newest_checkpoint_kind"] == "notice" and first["newest_checkpoint_step"] == ack.step, first
    assert first["steps_lost"] == 0, first
    assert second["resumed_from"] and second["resumed_from"].endswith(ack.checkpoint), second
    assert second["resumed_from_kind"] == "notice" and second["resumed_from_step"] == ack.step, second
    log = (slurm_blocks["shared"] / "runs" / PREEMPTED_RUN / "attempt-2" / "logs"
           / f"train-{PREEMPTED_RUN}-attempt-2.log").read_text()
    assert f"at step {ack.step}" in log and f"step {ack.step + 1} loss" in log
    assert second["state"] == "Completed", second
