"""The Slurm backend's loop against scripted command answers: a silent controller, earlier jobs, sacct records.

The commands' answers are scripted through `SlurmClient`'s injected runner and the clock is a
counter moved by the injected sleep, so minutes of silence take no time. The real cluster's side
of the same behaviour is tested against a real Slurm beside this file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import json
import re

import pytest

from trainguard.core import triage
from trainguard.core.backends.base import Launch
from trainguard.core.backends.slurm.client import CommandResult, SlurmClient, SlurmUnavailable, accounting_rows, accounting_settled
from trainguard.core.backends.slurm.backend import SlurmBackend
from trainguard.core.backends.slurm.job import UNREACHABLE, job_comment, job_name

UNREACHABLE_TEXT = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
PING_DOWN = "Slurmctld(primary) at ctl1 is DOWN\n*****************************************\n** RESTORE SLURMCTLD DAEMON TO SERVICE **\n"
FINISHED = "JobId=42 JobName=tg-r-a2 JobState=COMPLETED Reason=None ExitCode=0:0 NodeList=n1 RunTime=00:00:01\n"


class Script:
    """Answers Slurm's commands from a table and counts time through the backend's sleep."""

    def __init__(self, shared: str, down_after_submit: bool = False) -> None:
        self.now, self.calls, self.shared = 0.0, [], shared
        self.controller_up, self.down_after_submit = True, down_after_submit
        self.nodes = ["n1"]
        self.sbatch_times_out = False
        self.odd_answers = 0  # squeue for a job id fails this many times with an error of no known kind
        self.earlier_running = True  # attempt 1's job 7 is still queued or running
        self.pending = 0  # squeue says the job is pending (Resources) this many times before it ran and ended

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def __call__(self, command: Sequence[str], env: Mapping[str, str] | None, timeout: float) -> CommandResult:
        argv = list(command)
        self.calls.append(argv)
        listing = argv[0] == "squeue" and "--me" in argv  # the run's jobs, else one job by its id
        if argv[0] == "sbatch" and self.controller_up:
            if self.sbatch_times_out:
                raise SlurmUnavailable("sbatch: no answer within 30s")  # what run_command raises on its timeout
            self.controller_up = not self.down_after_submit
            return CommandResult(0, "42\n", "")
        if argv[:2] == ["scontrol", "ping"]:
            return CommandResult(0 if self.controller_up else 1, "Slurmctld(primary) at ctl1 is UP\n" if self.controller_up else PING_DOWN, "")
        if not self.controller_up:
            self.now += 18  # what squeue takes to give up on a stopped slurmctld
            return CommandResult(1, "", UNREACHABLE_TEXT)
        if listing:
            earlier = f"7|RUNNING|{job_name('r', 1)}|{job_comment('r', 1, self.shared)}\n"
            return CommandResult(0, earlier if self.earlier_running else "", "")
        if argv[0] == "squeue" and self.odd_answers > 0:
            self.odd_answers -= 1
            return CommandResult(1, "", "squeue: error: Unexpected message received")
        if argv[0] == "squeue" and self.pending > 0:
            self.pending -= 1
            return CommandResult(0, "PENDING|Resources\n", "")
        if argv[0] == "squeue":
            return CommandResult(0, "COMPLETED|None\n", "")
        if argv[0] == "scontrol" and "job" in argv:
            return CommandResult(0, FINISHED, "")
        if argv[0] == "sinfo":
            return CommandResult(0, "".join(f"{node}|idle\n" for node in self.nodes), "")
        if argv[:3] == ["scontrol", "show", "hostnames"]:
            return CommandResult(0, "n1\n", "")
        return CommandResult(0, "", "")


def _backend(tmp_path, script: Script) -> SlurmBackend:
    return SlurmBackend(tmp_path, client=SlurmClient(runner=script), clock=lambda: script.now, sleep=script.sleep,
                        controller_timeout_seconds=60)


def test_a_silent_controller_ends_the_attempt_within_its_bound_with_a_line_saying_what_to_do(tmp_path):
    script = Script(str(tmp_path), down_after_submit=True)  # sbatch gets through, then slurmctld goes away
    backend = _backend(tmp_path, script)

    outcome = backend.run(backend.provision("r", 2), Launch("r", 2, ("python", "-c", "pass")), on_line=lambda line: None)

    assert outcome.reason == UNREACHABLE
    assert 60 <= script.now < 60 + 18 + 2 * 2  # one more squeue and poll past the bound, no more
    assert "\n" not in outcome.message and "ctl1 is DOWN" in outcome.message and "scancel 42" in outcome.message
    assert "RESTORE" not in outcome.message  # scontrol ping's banner is not the message


def test_a_new_attempt_cancels_the_runs_earlier_job_still_running_before_it_submits(tmp_path):
    script = Script(str(tmp_path))
    backend = _backend(tmp_path, script)

    outcome = backend.run(backend.provision("r", 2), Launch("r", 2, ("python", "-c", "pass")), on_line=lambda line: None)

    assert outcome.reason == "Completed"
    commands = [call[0] if call[0] != "scancel" else " ".join(call) for call in script.calls]
    assert "scancel 7" in commands and commands.index("scancel 7") < commands.index("sbatch")
    assert len([call for call in script.calls if call[0] == "squeue" and "--me" in call]) == 1  # the run's jobs, once


def test_the_accounting_record_is_final_once_the_job_and_every_step_ended():
    header = "JobID|State|ExitCode|NodeList|Elapsed|MaxRSS|JobName\n"
    running = header + "9|RUNNING|0:0|n1|00:00:03||tg-r-a1\n9.batch|RUNNING|0:0|n1|00:00:03||batch\n"
    ended = header + "9|CANCELLED by 0|0:15|n1|00:00:04||tg-r-a1\n9.batch|CANCELLED|0:15|n1|00:00:04|2048K|batch\n"
    assert not accounting_settled(accounting_rows(running), "9")
    assert accounting_settled(accounting_rows(ended), "9")
    assert accounting_rows(ended)[1] == {"JobID": "9.batch", "State": "CANCELLED", "ExitCode": "0:15", "NodeList": "n1",
                                         "Elapsed": "00:00:04", "MaxRSS": "2048K", "JobName": "batch"}
    assert not accounting_settled([], "9")


def test_a_retry_after_a_node_failure_excludes_the_node_where_the_partition_has_another_else_waits_for_it(tmp_path):
    launch = Launch("r", 2, ("python", "-c", "pass"), avoid_nodes=("n1",))
    submitted = {}
    for nodes in (["n1", "n2"], ["n1"]):
        script = Script(str(tmp_path))
        script.nodes = nodes
        backend = _backend(tmp_path / str(len(nodes)), script)
        backend.run(backend.provision("r", 2), launch, on_line=lambda line: None)
        submitted[len(nodes)] = next(call for call in script.calls if call[0] == "sbatch")
    assert "--exclude=n1" in submitted[2]
    assert not any(option.startswith("--exclude") for option in submitted[1])  # the job waits for n1 instead


def _attempt(backend: SlurmBackend, attempt: int = 2):
    return backend.run(backend.provision("r", attempt), Launch("r", attempt, ("python", "-c", "pass")),
                       on_line=lambda line: None)


@pytest.mark.parametrize("where", ["controller down", "sbatch timed out"])
def test_a_controller_that_does_not_answer_at_submission_is_a_retryable_infrastructure_failure(tmp_path, where):
    script = Script(str(tmp_path))
    script.controller_up, script.sbatch_times_out = where != "controller down", where == "sbatch timed out"
    backend = _backend(tmp_path, script)

    outcome = _attempt(backend)

    assert outcome.reason == UNREACHABLE and outcome.exit_code is None
    assert "did not answer when trainguard went to submit attempt 2 as job tg-r-a2" in outcome.message
    assert "\n" not in outcome.message and ("ctl1 is DOWN" in outcome.message) == (where == "controller down")
    diagnosis = triage.classify(backend.signals(backend.provision("r", 2), outcome))
    assert (diagnosis.category.value, diagnosis.retryable) == ("transient_io", True)
    runner = json.loads((tmp_path / "runs" / "r" / "attempt-2" / "runner.json").read_text())
    assert (runner["reason"], runner["job_id"]) == (UNREACHABLE, None)


def _lost_by_attempt_1(tmp_path) -> None:
    """Attempt 1 followed job 7 until the controller went silent; its job wrote a log line and runs on."""
    first = tmp_path / "runs" / "r" / "attempt-1"
    (first / "logs").mkdir(parents=True)
    (first / "logs" / "train-r-attempt-1.log").write_text("step 35/40 loss 0.1\n")
    (first / "runner.json").write_text(json.dumps({"reason": UNREACHABLE, "job_id": "7"}))


def test_the_attempt_after_a_lost_controller_continues_the_earlier_job_instead_of_cancelling_it(tmp_path):
    _lost_by_attempt_1(tmp_path)
    script = Script(str(tmp_path))
    backend = _backend(tmp_path, script)
    lines = []

    outcome = backend.run(backend.provision("r", 2), Launch("r", 2, ("python", "-c", "pass")), on_line=lines.append)

    assert outcome.reason == "Completed"
    assert [call[0] for call in script.calls if call[0] in ("sbatch", "scancel")] == []
    record = json.loads((tmp_path / "runs" / "r" / "attempt-2" / "slurm-job.json").read_text())
    assert (record["job_id"], record["job_attempt"], record["job_name"]) == ("7", 1, job_name("r", 1))
    assert lines == ["step 35/40 loss 0.1"]  # the job's log, read through the link in attempt 2's folder
    assert backend.signals(backend.provision("r", 2), outcome).log.read_text() == "step 35/40 loss 0.1\n"

    script.calls.clear()  # the same attempt run again (its flow died) adopts the continued job by its record
    assert _attempt(backend).reason == "Completed"
    assert [call[0] for call in script.calls if call[0] in ("sbatch", "scancel")] == []


def test_the_attempt_after_a_lost_controller_submits_anew_when_the_earlier_job_is_gone(tmp_path):
    _lost_by_attempt_1(tmp_path)
    script = Script(str(tmp_path))
    script.earlier_running = False
    backend = _backend(tmp_path, script)

    assert _attempt(backend).reason == "Completed"
    assert [call[0] for call in script.calls if call[0] in ("sbatch", "scancel")] == ["sbatch"]
    assert not (tmp_path / "runs" / "r" / "attempt-2" / "logs" / "train-r-attempt-2.log").is_symlink()


def test_a_few_odd_squeue_answers_are_asked_again_and_never_cancel_the_job(tmp_path):
    script = Script(str(tmp_path))
    script.earlier_running, script.odd_answers = False, 4  # one fewer than the backend's bound
    backend = _backend(tmp_path, script)

    assert _attempt(backend).reason == "Completed"
    assert not [call for call in script.calls if call[0] == "scancel"]


def test_odd_squeue_answers_past_the_bound_end_the_attempt_leaving_the_job_to_the_next_one(tmp_path):
    script = Script(str(tmp_path))
    script.earlier_running, script.odd_answers = False, 100
    backend = _backend(tmp_path, script)

    outcome = _attempt(backend)

    assert outcome.reason == UNREACHABLE
    assert "squeue answered 5 times in a row with an error" in outcome.message and "scancel 42" in outcome.message
    assert len([call for call in script.calls if call[:2] == ["squeue", "--noheader"] and "--jobs=42" in call]) == 5
    assert not [call for call in script.calls if call[0] == "scancel"]


def test_stop_orphan_cancels_the_job_found_by_name_and_comment_and_keeps_its_end(tmp_path):
    states = {"7": "RUNNING"}
    calls = []

    def slurm(argv, env, timeout):
        argv = list(argv)
        calls.append(argv)
        if argv[0] == "squeue" and "--me" in argv:  # no record: found by name and comment
            return CommandResult(0, f"7|RUNNING|{job_name('r', 1)}|{job_comment('r', 1, str(tmp_path))}\n", "")
        if argv[0] == "squeue":
            return CommandResult(0, states["7"] + "\n", "")
        if argv[0] == "scancel":
            states["7"] = "CANCELLED"
            return CommandResult(0, "", "")
        if argv[0] == "scontrol" and "job" in argv:
            return CommandResult(0, FINISHED.replace("COMPLETED", "CANCELLED"), "")
        return CommandResult(0, "", "")

    backend = SlurmBackend(tmp_path, client=SlurmClient(runner=slurm), sleep=lambda seconds: None)
    ref = backend.provision("r", 1)

    said = backend.stop_orphan(ref)

    assert said is not None and "cancelled Slurm job 7, left RUNNING" in said and "ended CANCELLED" in said
    assert ["scancel", "7"] in calls
    assert "JobState=CANCELLED" in (tmp_path / "runs" / "r" / "attempt-1" / "slurm" / "scontrol-show-job.txt").read_text()
    calls.clear()
    assert backend.stop_orphan(ref) is None  # nothing runs any more: nothing is stopped
    assert not [call for call in calls if call[0] == "scancel"]


def test_a_queued_job_and_a_silent_controller_are_reported_while_they_last(tmp_path):
    script = Script(str(tmp_path))
    script.earlier_running, script.pending = False, 40  # about a minute in the queue at the longest poll interval
    lines = []
    backend = _backend(tmp_path, script)

    assert backend.run(backend.provision("r", 2), Launch("r", 2, ("python", "-c", "pass")),
                       on_line=lines.append).reason == "Completed"
    waited = [re.fullmatch(r"trainguard: waiting (\d+)s for Slurm job 42 to start: PENDING \(Resources\)", line)
              for line in lines]
    seconds = [int(m[1]) for m in waited if m]
    # growing intervals, each said at the first squeue poll (2 s apart at most) past its moment
    assert all(waited) and len(seconds) == 4 and all(t <= s <= t + 2 for s, t in zip(seconds, (5, 10, 20, 40)))

    script = Script(str(tmp_path / "silent"), down_after_submit=True)
    lines = []
    backend = _backend(tmp_path / "silent", script)
    assert backend.run(backend.provision("r", 2), Launch("r", 2, ("python", "-c", "pass")),
                       on_line=lines.append).reason == UNREACHABLE
    assert lines and all(re.fullmatch(r"trainguard: waiting \d+s \(of 60s\) for the Slurm controller to answer "
                                      r"squeue about job 42", line) for line in lines)

