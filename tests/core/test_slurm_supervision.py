"""The Slurm backend's loop against scripted command answers: a silent controller, earlier jobs, sacct records.

The commands' answers are scripted through `SlurmClient`'s injected runner and the clock is a
counter moved by the injected sleep, so minutes of silence take no time. The real cluster's side
of the same behaviour is tested in tests/slurm.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from trainguard.core.backend import Launch
from trainguard.core.slurm import CommandResult, SlurmClient, accounting_rows, accounting_settled
from trainguard.core.slurm_backend import SlurmBackend
from trainguard.core.slurm_job import UNREACHABLE, job_comment, job_name

UNREACHABLE_TEXT = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
PING_DOWN = "Slurmctld(primary) at ctl1 is DOWN\n*****************************************\n** RESTORE SLURMCTLD DAEMON TO SERVICE **\n"
FINISHED = "JobId=42 JobName=tg-r-a2 JobState=COMPLETED Reason=None ExitCode=0:0 NodeList=n1 RunTime=00:00:01\n"


class Script:
    """Answers Slurm's commands from a table and counts time through the backend's sleep."""

    def __init__(self, shared: str, down_after_submit: bool = False) -> None:
        self.now, self.calls, self.shared = 0.0, [], shared
        self.controller_up, self.down_after_submit = True, down_after_submit
        self.nodes = ["n1"]

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def __call__(self, command: Sequence[str], env: Mapping[str, str] | None, timeout: float) -> CommandResult:
        argv = list(command)
        self.calls.append(argv)
        name = next((a.split("=", 1)[1] for a in argv if a.startswith("--name=")), None)
        if argv[0] == "sbatch":
            self.controller_up = not self.down_after_submit
            return CommandResult(0, "42\n", "")
        if argv[:2] == ["scontrol", "ping"]:
            return CommandResult(0 if self.controller_up else 1, "Slurmctld(primary) at ctl1 is UP\n" if self.controller_up else PING_DOWN, "")
        if not self.controller_up:
            self.now += 18  # what squeue takes to give up on a stopped slurmctld
            return CommandResult(1, "", UNREACHABLE_TEXT)
        if name == job_name("r", 1):
            return CommandResult(0, f"7|RUNNING|{job_comment('r', 1, self.shared)}\n", "")
        if argv[0] == "squeue" and name is None:
            return CommandResult(0, "COMPLETED\n", "")
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
