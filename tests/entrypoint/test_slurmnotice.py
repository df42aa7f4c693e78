"""Slurm's warning turned into a notice by the batch shell: the reason, the deadline, every task's folder."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from trainguard_entrypoint.notice import give_notice, read_notice
from trainguard_entrypoint.slurmnotice import TIMES_ENV, JobFacts, classify, give, parse_job, task_notice


def test_the_limits_own_warning_is_a_time_limit_with_the_limit_as_its_deadline() -> None:
    started, now = 1000.0, 1000.0 + 3600 - 100  # 100 s left of an hour, warned with a 120 s lead (Slurm: early)
    reason, deadline, source = classify(now, started, 3600, 120)
    assert (reason, deadline) == ("time_limit", 4600.0)
    assert "--signal=B:TERM@120" in source


def test_a_sigterm_once_slurm_chose_the_job_for_preemption_has_the_moved_end_as_deadline() -> None:
    # Slurm sets a preempted job's PreemptTime, and its end to then plus the GraceTime
    reason, deadline, source = classify(2000.0, 1000.0, 3600, 120,
                                        JobFacts(state="RUNNING", end=2300.0, preempted_at=1999.0))
    assert (reason, deadline) == ("preemption", 2300.0)
    assert "GraceTime" in source
    # a job without a time limit shows no end: the partition's GraceTime from the PreemptTime
    assert classify(2000.0, 1000.0, 0, 0, JobFacts("RUNNING", None, 1999.0, 45.0))[:2] == ("preemption", 2044.0)


def test_an_end_before_the_shells_start_plus_the_limit_is_no_preemption_without_a_preempt_time() -> None:
    # the batch shell starts (and reads the clock) seconds after Slurm started the job, so Slurm's
    # end (its start + the limit) is earlier than the shell's: that alone says nothing
    reason, _, _ = classify(2000.0, 1005.0, 3600, 120, JobFacts(state="RUNNING", end=1000.0 + 3600))
    assert reason == "terminated"


def test_scontrols_one_line_gives_the_state_end_and_preempt_time() -> None:
    shown = ("JobId=7 JobName=tg-r-a1 JobState=RUNNING Reason=None RunTime=00:00:05 TimeLimit=00:10:00 "
             "StartTime=2026-12-03T22:00:00 EndTime=2026-12-03T22:00:50 PreemptEligibleTime=2026-12-03T22:00:00 "
             "PreemptTime=2026-12-03T22:00:05 Partition=debug Command=/x/PreemptTime=None")
    facts = parse_job(shown)
    assert facts.state == "RUNNING" and facts.preempted_at is not None and facts.end == facts.preempted_at + 45
    assert parse_job("JobId=7 JobState=RUNNING EndTime=Unknown PreemptTime=None") == JobFacts("RUNNING")
    assert parse_job("") == JobFacts()


def test_a_scancel_is_a_cancel_with_slurms_kill_wait() -> None:
    reason, deadline, _ = classify(2000.0, 1000.0, 3600, 120, JobFacts(state="CANCELLED", end=2000.0))
    assert (reason, deadline) == ("cancelled", 2030.0)


def test_a_sigterm_squeue_says_nothing_of_is_a_termination_within_the_kill_wait() -> None:
    reason, deadline, _ = classify(2000.0, 1000.0, 3600, 120)
    assert (reason, deadline) == ("terminated", 2030.0)


def test_every_task_folder_gets_the_notice_and_an_entrypoints_bare_one_is_refined(tmp_path: Path) -> None:
    (tmp_path / "tasks" / "2").mkdir(parents=True)
    now = time.time()
    # task 2's entrypoint had the SIGTERM first and knew only that, with a shorter grace
    own = give_notice(tmp_path / "tasks" / "2" / "notice.json", "terminated", 10, "SIGTERM to the entrypoint",
                      now=now - 0.5)
    written = give(tmp_path, 3, "cancelled", now + 30, "Slurm scancel", now, started=now - 10)
    assert written == [tmp_path / "notice.json", tmp_path / "tasks" / "1" / "notice.json",
                       tmp_path / "tasks" / "2" / "notice.json"]
    for path in written[:2]:
        notice = read_notice(path)
        assert notice is not None and notice.reason == "cancelled" and abs(notice.deadline - (now + 30)) < 1e-3
    refined = read_notice(tmp_path / "tasks" / "2" / "notice.json")
    assert refined is not None and refined.reason == "cancelled"
    assert (refined.given_at, refined.deadline) == (own.given_at, own.deadline)  # never later than first said
    assert "SIGTERM to the entrypoint" in refined.source


def test_a_notice_with_its_reason_is_left_as_it_is(tmp_path: Path) -> None:
    now = time.time()
    first = give_notice(tmp_path / "notice.json", "time_limit", 60, "Slurm --signal", now=now - 20)
    assert give(tmp_path, 1, "cancelled", now + 30, "Slurm scancel", now, started=now - 100) == []
    assert read_notice(tmp_path / "notice.json") == first


def test_a_notice_from_before_the_job_started_is_replaced(tmp_path: Path) -> None:
    give_notice(tmp_path / "notice.json", "terminated", 30, "an earlier stop", now=100.0)
    now = time.time()
    assert give(tmp_path, 1, "time_limit", now + 60, "Slurm", now, started=now - 10) == [tmp_path / "notice.json"]


def test_the_command_the_batch_shell_runs_writes_the_notice_and_says_so(tmp_path: Path) -> None:
    started = int(time.time()) - 30
    done = subprocess.run([sys.executable, "-m", "trainguard_entrypoint.slurmnotice", str(started), "60", "45", "2",
                           str(tmp_path)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "time_limit" in done.stderr and "2 task folder(s)" in done.stderr
    payload = json.loads((tmp_path / "tasks" / "1" / "notice.json").read_text())
    assert payload["reason"] == "time_limit" and payload["deadline"] == started + 60


def test_bad_arguments_are_one_line_and_write_nothing(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "trainguard_entrypoint.slurmnotice", "x"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "usage" in done.stderr


def test_a_tasks_sigterm_outside_a_trainguard_batch_job_or_not_a_preemption_leaves_the_entrypoints_own_notice() -> None:
    now = time.time()
    assert task_notice({}, now) is None  # not under Slurm
    assert task_notice({"SLURM_JOB_ID": "7", TIMES_ENV: "not numbers"}, now) is None
    # a job Slurm has no word on (squeue finds no controller here): nothing shows a preemption
    assert task_notice({"SLURM_JOB_ID": "7", TIMES_ENV: f"{now - 30:.0f} 600 30"}, now, timeout=5) is None
