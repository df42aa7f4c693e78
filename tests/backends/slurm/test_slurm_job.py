"""The Slurm job's shape and Slurm's answers, as pure functions: options, script, states, parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.core import triage
from trainguard.core.backends.base import Launch
from trainguard.core.backends.slurm import continuation
from trainguard.core.backends.slurm.client import CommandResult, JobNotFound, SlurmClient, SlurmRejected, SlurmUnavailable, job_info
from trainguard.core.backends.slurm.job import (
    JobSettings, batch_script, job_comment, job_name, memory_killed, sbatch_options, termination,
)
from trainguard.core.triage.signals import Signals

LAUNCH = Launch("run-1", 2, ("python", "train.py", "--lr", "1e-3; rm -rf /"), deadline_seconds=3600, gpus=8)


def test_options_carry_the_attempts_identity_no_requeue_the_time_limit_and_its_warning():
    options = sbatch_options(JobSettings(partition="gpu", account="ml", qos="high", nodes=2, memory_mb=1000),
                             LAUNCH, workspace="/shared/ws", shared_folder="/shared", exclude=["gpu07"])
    assert f"--job-name={job_name('run-1', 2)}" in options
    assert f"--comment={job_comment('run-1', 2, '/shared')}" in options
    for expected in ("--no-requeue", "--time=60", "--signal=B:TERM@120", "--partition=gpu", "--account=ml",
                     "--qos=high", "--nodes=2", "--gpus=8", "--mem=1000M", "--exclude=gpu07"):
        assert expected in options


@pytest.mark.parametrize(("settings", "expected"), [
    (JobSettings(gpu_option="gres", nodes=2), "--gres=gpu:4"),
    (JobSettings(gpu_option="gres", gpu_type="a100", gpus_per_node=8), "--gres=gpu:a100:8"),
    (JobSettings(gpu_type="h100"), "--gpus=h100:8"),
])
def test_gpus_are_asked_for_as_the_site_prefers(settings, expected):
    assert expected in sbatch_options(settings, LAUNCH, workspace="/w", shared_folder="/s")


def test_a_short_deadline_gets_no_warning_signal_longer_than_itself():
    options = sbatch_options(JobSettings(), Launch("r", 1, ("x",), deadline_seconds=30), workspace="/w", shared_folder="/s")
    assert "--time=1" in options and not any(o.startswith("--signal") for o in options)


@pytest.mark.parametrize("option", ["--job-name=x", "--requeue", "-o", "constraint=a100", "--x\n--y"])
def test_extra_options_that_would_break_the_job_are_refused_naming_the_field(option):
    with pytest.raises(ValueError, match="extra_sbatch_options"):
        sbatch_options(JobSettings(extra_options=(option,)), LAUNCH, workspace="/w", shared_folder="/s")


def test_the_batch_script_quotes_the_command_and_wraps_it_in_srun_with_the_entrypoint():
    script = batch_script(python="/usr/bin/python3", entrypoint="/s/ep.pyz", command=LAUNCH.command,
                          workspace="/s/ws dir", run_id="run-1", attempt=2)
    assert "srun --kill-on-bad-exit=1" in script
    assert "'1e-3; rm -rf /'" in script and "/s/ep.pyz" in script
    assert "marker='/s/ws dir/slurm-signal.txt'" in script
    assert 'scancel --signal=TERM "$SLURM_JOB_ID"' in script  # the warning goes on to the tasks, not to srun
    # ... once every task's folder holds the notice, written by the entrypoint's own writer
    assert script.index("-m trainguard_entrypoint.slurmnotice") < script.index("scancel --signal=TERM")


@pytest.mark.parametrize(("state", "code", "signalled", "stopped_for", "notice", "category"), [
    ("NODE_FAIL", 143, False, None, None, "node_failure"),
    ("PREEMPTED", 143, False, None, None, "preempted"),
    ("TIMEOUT", 143, False, None, None, "timeout"),
    ("FAILED", 143, True, None, "time_limit", "timeout"),
    ("OUT_OF_MEMORY", 137, False, None, None, "host_oom"),
    ("CANCELLED", 143, False, None, None, "user_cancelled"),
    ("CANCELLED", 143, False, "Stalled", None, "timeout"),
    # stopped on a preemption's notice within the GraceTime: Slurm records only the exit status
    ("FAILED", 143, False, None, "preemption", "preempted"),
    ("FAILED", 143, True, None, "preemption", "preempted"),  # the site sends --signal on preemption too
])
def test_slurm_job_states_become_reasons_the_triage_rules_know(state, code, signalled, stopped_for, notice, category):
    reason = termination(state, code, signalled=signalled, stopped_for=stopped_for, notice_reason=notice)
    diagnosis = triage.classify(Signals(exit_code=code, reason=reason, log=b"step 10/40 loss 0.5\n"))
    assert diagnosis is not None and diagnosis.category.value == category


def test_a_completed_job_with_exit_zero_is_completed_even_after_the_warning():
    assert termination("COMPLETED", 0, signalled=True, stopped_for=None) == "Completed"
    assert termination("COMPLETED", 0, signalled=False, stopped_for=None, notice_reason="preemption") == "Completed"


def test_scontrol_one_line_records_parse_with_spaces_in_values():
    info = job_info("JobId=42 JobName=tg-r-a1 UserId=root(0) JobState=NODE_FAIL Reason=NodeDown ExitCode=0:15 "
                    "RunTime=01:02:03 StartTime=2026-01-01T00:00:00 EndTime=Unknown NodeList=gpu[01-02] "
                    "Comment=trained by the night shift WorkDir=/w")
    assert (info.job_id, info.state, info.reason, info.exit_code, info.signal) == ("42", "NODE_FAIL", "NodeDown", 0, 15)
    assert info.run_seconds == 3723 and info.end_time is None and info.node_list == "gpu[01-02]"
    assert info.fields["Comment"] == "trained by the night shift" and info.terminal


@pytest.mark.parametrize(("stderr", "error"), [
    ("squeue: error: Unable to contact slurm controller (connect failure)", SlurmUnavailable),
    ("slurm_load_jobs error: Invalid job id specified", JobNotFound),
    ("sbatch: error: invalid partition specified: nope", SlurmRejected),
])
def test_command_failures_are_translated_once_into_the_error_tree(stderr, error):
    client = SlurmClient(runner=lambda argv, env, timeout: CommandResult(1, "", stderr))
    with pytest.raises(error):
        if error is SlurmRejected:
            client.submit("/s/job.sh", [], {})
        else:
            client.show_job("1")


def test_adoption_asks_squeue_once_for_the_runs_jobs_and_keeps_only_those_whose_name_and_comment_match():
    ours, theirs = job_comment("r", 1, "/shared"), job_comment("r", 1, "/other-installation")
    jobs = [("7", "tg-r-a1", "RUNNING", ours), ("8", "tg-r-a1", "PENDING", theirs), ("9", "tg-r-a2", "RUNNING",
            job_comment("r", 2, "/shared")), ("10", "tg-r-a2", "RUNNING", ours), ("11", "mine", "RUNNING", "a|b"),
            ("12", "tg-q-a1", "RUNNING", job_comment("q", 1, "/shared"))]
    asked = []

    def squeue(argv, env, timeout):  # answers as squeue would: every job of this user, not ended
        asked.append(list(argv))
        assert argv[0] == "squeue" and "--me" in argv and "--format=%i|%T|%j|%k" in argv
        return CommandResult(0, "".join(f"{i}|{s}|{n}|{c}\n" for i, n, s, c in jobs), "")

    found = continuation.run_jobs(SlurmClient(runner=squeue), Path("/shared"), "r", 3)
    assert (found.of(1), found.of(2), found.of(3)) == (("7",), ("9",), ()) and len(asked) == 1


def test_slurmstepds_memory_kill_in_the_job_stderr_is_a_host_oom():
    err = b"slurmstepd-gpu01: error: StepId=9.0 exceeded memory limit (318976000 > 314572800), being killed\n"
    assert memory_killed(err) and not memory_killed(b"step 3 loss 0.1\nexceeded memory limit in my own print\n")
    assert termination("FAILED", 137, signalled=False, stopped_for=None, memory_exceeded=True) == "OOMKilled"


def test_the_specs_notice_grace_is_the_warnings_lead_before_the_time_limit():
    launch = Launch(run_id="r", attempt=1, command=("t",), deadline_seconds=3600, notice_grace_seconds=300)
    options = sbatch_options(JobSettings(signal_lead_seconds=120), launch, workspace="/w", shared_folder="/s")
    assert "--signal=B:TERM@300" in options
