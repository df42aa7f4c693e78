"""Following one attempt's Slurm job to its end, and saying how it ended.

`Supervisor.follow` asks `squeue` for the job's own id with backoff while it streams the
entrypoint's log to `on_line`; it ends when squeue no longer lists the job or calls it terminal. It
cancels the job itself when nothing new was logged (and no entrypoint saw progress) for the
launch's `stall_seconds`, after taking the ranks' stacks. A controller that stays silent past
`controller_timeout_seconds`, or answers oddly `odd_answers_limit` times in a row, ends the
following with `ControllerLost`: the job itself may run on, for the next attempt to continue.
While the job waits (pending, or the controller silent) it says so at growing intervals.

`Supervisor.outcome` reads the end from `scontrol show job` (kept in the attempt's folder before
Slurm forgets the job) and the entrypoint's crash report, and writes the supervisor's own account
(`runner.json`). Submitting and adopting the job is ``backend``'s; the job's words are ``job``'s.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from trainguard_entrypoint.files import read_json_object
from trainguard_entrypoint.notice import parse_notice

from trainguard.core.backends import forensics, workspace
from trainguard.core.backends.base import AttemptOutcome, Launch, LineSink
from trainguard.core.backends.slurm import continuation, job, nodes
from trainguard.core.backends.slurm import evidence as slurm_evidence
from trainguard.core.backends.slurm.client import TERMINAL_STATES, JobInfo, SlurmClient, SlurmError, SlurmUnavailable, iso_time
from trainguard.core.backends.slurm.tail import LogTail, last_bytes
from trainguard.core.backends.waits import WaitNotice
from trainguard.core.backends.workspace import CRASH_REPORT, AttemptWorkspace


class ControllerLost(Exception):
    """The controller stayed silent (or odd) past its bound; the message says what to do."""


@dataclass(frozen=True)
class Limits:
    """How the supervisor asks squeue, and how long it bears a silent or odd controller.

    Attributes:
        poll_min_seconds, poll_max_seconds: The `squeue` backoff range while a job is queued or running.
        controller_timeout_seconds: How long the controller may go unanswered while a job is followed
            before the attempt ends as `ControllerUnreachable` (the job itself may run on).
        odd_answers_limit: How many unexpected squeue failures in a row (neither "unreachable" nor
            "no such job") are asked again before the attempt ends as `ControllerUnreachable`.
    """

    poll_min_seconds: float = 0.25
    poll_max_seconds: float = 2.0
    controller_timeout_seconds: float = 300.0
    odd_answers_limit: int = 5


@dataclass
class _Watch:
    """When squeue last answered, and how many odd answers came in a row since."""

    answered: float
    odd: int = 0
    reason: str = ""  # squeue's reason for the job's state (why it is pending)


@dataclass(frozen=True)
class Supervisor:
    """Follows the jobs of one backend's attempts through its Slurm client, clock and sleep."""

    client: SlurmClient
    limits: Limits
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    capture: forensics.StackCapture  # a stall's cancel waits for the ranks' stacks

    def follow(self, ws: AttemptWorkspace, job_id: str, launch: Launch, on_line: LineSink) -> str | None:
        """Follow the job until it is terminal; return why trainguard stopped it, if it did.

        Raises:
            ControllerLost: The controller stayed silent or odd past its bound (the job may run on).
        """
        jw = continuation.job_workspace(ws)
        tail = LogTail(jw.log_path, on_line, self.clock, jw.root)
        delay, running_since, stopped_for = self.limits.poll_min_seconds, None, None
        watch, notice = _Watch(self.clock()), WaitNotice(clock=self.clock)
        while True:
            tail.poll()
            try:
                state = self._state(job_id, watch)
            except ControllerLost:
                tail.poll(final=True)
                raise
            if (elapsed := notice.due(state == "UNKNOWN" or state in job.WAITING_STATES)) is not None:
                on_line(job.waiting_line(job_id, state, watch.reason, elapsed, self.limits.controller_timeout_seconds))
            if state is None or state in TERMINAL_STATES:
                tail.poll(final=True)
                return stopped_for
            if state == "RUNNING":
                running_since = running_since if running_since is not None else self.clock()
                silent_since = max(running_since, tail.last_output, nodes.last_progress(jw.root, self.clock))
                if (stopped_for is None and launch.stall_seconds is not None
                        and self.clock() - silent_since >= launch.stall_seconds):
                    stopped_for = job.STALLED
                    nodes.take_stacks(jw.root, self.capture, self.clock, self.sleep)
                    self.cancel_quietly(job_id)
                    delay = self.limits.poll_min_seconds
            self.sleep(delay)
            delay = (min(delay * 1.5, self.limits.poll_max_seconds) if state != "COMPLETING"
                     else self.limits.poll_min_seconds)

    def _state(self, job_id: str, watch: _Watch) -> str | None:
        """squeue's word on the job; "UNKNOWN" while the controller is silent or odd, within bounds."""
        try:
            found = self.client.status(job_id)
        except SlurmUnavailable as exc:  # busy or restarting: ask again, later, within bounds
            silent = self.clock() - watch.answered
            if silent >= self.limits.controller_timeout_seconds:
                raise ControllerLost(job.lost_message(job_id, silent, self.controller(), str(exc))) from exc
            return "UNKNOWN"
        except SlurmError as exc:  # an answer squeue should not give (a plugin or RPC hiccup): never a reason to cancel
            watch.odd += 1
            if watch.odd >= self.limits.odd_answers_limit:
                raise ControllerLost(job.odd_answers_message(job_id, watch.odd, str(exc))) from exc
            return "UNKNOWN"
        watch.answered, watch.odd = self.clock(), 0
        state, watch.reason = found if found is not None else (None, "")
        return state

    def controller(self) -> str:
        """Which controller the configuration names and what `scontrol ping` says of it (one line)."""
        conf = (self.client.env or os.environ).get("SLURM_CONF", "the system's slurm.conf")
        return f"{self.client.ping() or 'scontrol ping gave no answer'}; configured in {conf}"

    def cancel_quietly(self, job_id: str) -> None:
        try:
            self.client.cancel(job_id)
        except SlurmError:
            pass  # the job may be gone already; the outcome says what Slurm last knew

    def unreachable(self, ws: AttemptWorkspace, job_id: str | None, message: str, started: datetime) -> AttemptOutcome:
        """The attempt as far as it is known when the controller stopped answering (the job may run on)."""
        continuation.write_runner_report(ws, job_id, None, job.UNREACHABLE, message)
        event = {"type": "Warning", "reason": job.UNREACHABLE, "message": message,
                 "involvedObject": {"kind": "SlurmJob", "name": job_id or job.job_name(ws.run_id, ws.attempt)}}
        jw = continuation.job_workspace(ws)  # the job may have ended and reported before the controller went
        crash = read_json_object(jw.root / CRASH_REPORT, jw.root)
        exit_code, sig = job.exit_status(crash, None)
        return AttemptOutcome(exit_code=exit_code, signal=sig, reason=job.UNREACHABLE, message=message,
                              started_at=started.isoformat(), finished_at=datetime.now(UTC).isoformat(),
                              events=(event,), log_path=str(ws.log_path))

    def outcome(self, ws: AttemptWorkspace, job_id: str, stopped_for: str | None, started: datetime) -> AttemptOutcome:
        """How the job ended, from Slurm's last word, the crash report and the job's stderr."""
        info = self.final_info(ws, job_id)
        jw = continuation.job_workspace(ws)
        crash = read_json_object(jw.root / CRASH_REPORT, jw.root)
        exit_code, sig = job.exit_status(crash, info)
        state = info.state if info is not None else "UNKNOWN"
        signalled = os.path.lexists(jw.root / workspace.SLURM_SIGNAL_MARKER)
        stderr = last_bytes(jw.root / workspace.slurm_output(job_id, "err"), jw.root)
        notice = parse_notice(read_json_object(jw.root / workspace.NOTICE_FILE, jw.root))
        notice_reason = notice.reason if notice is not None else None
        reason = job.termination(state, exit_code, signalled=signalled, stopped_for=stopped_for,
                                 memory_exceeded=job.memory_killed(stderr), notice_reason=notice_reason)
        hosts = self.hostnames(info.node_list) if info is not None and info.node_list else []
        node = nodes.failed_node(self.client, ws, hosts) if reason == "NodeLost" else (hosts[0] if hosts else None)
        message = job.ended_message(job_id, info, exit_code, sig, stopped_for, signalled, notice_reason)
        continuation.write_runner_report(ws, job_id, exit_code, reason, message, sig)
        event = {"type": "Warning" if reason != "Completed" else "Normal", "reason": state, "message": message,
                 "involvedObject": {"kind": "SlurmJob", "name": job_id}}
        return AttemptOutcome(
            exit_code=exit_code, signal=sig, reason=reason, message=message,
            started_at=iso_time(info.start_time) if info else started.isoformat(),
            finished_at=iso_time(info.end_time) if info else datetime.now(UTC).isoformat(),
            duration_seconds=info.run_seconds if info else 0.0, node=node, events=(event,),
            log_path=str(ws.log_path),
        )

    def final_info(self, ws: AttemptWorkspace, job_id: str) -> JobInfo | None:
        """`scontrol show job` right at the end, kept in the folder before the record ages out."""
        try:
            info = self.client.show_job(job_id)
            slurm_evidence.keep(ws, workspace.SLURM_JOB_SHOWN, self.client.show_job_text(job_id))
            return info
        except (SlurmError, OSError):
            return None

    def hostnames(self, node_list: str) -> list[str]:
        """The hosts of a Slurm node list; the list itself when Slurm cannot expand it."""
        try:
            return self.client.hostnames(node_list)
        except SlurmError:
            return [node_list]


def never_started(ws: AttemptWorkspace, message: str) -> AttemptOutcome:
    """The outcome of an attempt whose job could not be submitted, recorded as the supervisor's account."""
    continuation.write_runner_report(ws, None, None, "StartError", message)
    return AttemptOutcome(exit_code=None, signal=None, reason="StartError", message=message, log_path=str(ws.log_path))
