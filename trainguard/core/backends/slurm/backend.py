"""The Slurm backend: a training attempt as one batch job on an HPC cluster, behind the `Backend` seam.

The attempt's folder and the run's checkpoints live on the cluster's shared filesystem, which the
flow's machine also mounts. `run` submits the attempt's job (or adopts the one a previous flow
process already submitted, found by its recorded id or, in one `squeue` for the run's jobs, by name
and comment), then hands it to ``supervise``, which follows it to its end and says how it ended.
Evidence is ``evidence``'s; the job's shape is ``job``'s; the commands are ``client``'s; earlier
attempts' jobs ``continuation``'s.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

from trainguard_entrypoint.files import read_json_object

from trainguard.core import masking
from trainguard.core.backends import entrypoint_archive, forensics, jobfiles, workspace_evidence
from trainguard.core.backends.jobfiles import Budget
from trainguard.core.backends.slurm import continuation, job, nodes, supervise
from trainguard.core.backends.slurm import evidence as slurm_evidence
from trainguard.core.backends.base import (
    CANCELLED, AttemptOutcome, AttemptRef, CollectedEvidence, Launch, LineSink, container_env,
)
from trainguard.core.backends.capabilities import NodeEvidence
from trainguard.core.backends.slurm.client import TERMINAL_STATES, JobNotFound, SlurmClient, SlurmError, SlurmUnavailable
from trainguard.core.backends.slurm.continuation import JOB_RECORD
from trainguard.core.evidence.manifest import attempt_prefix
from trainguard.core.stores.base import EvidenceStore
from trainguard.core.triage.signals import LogSource, Signals
from trainguard.core.backends import processes, rankstacks, torchrun, workspace
from trainguard.core.backends.workspace import AttemptWorkspace, run_checkpoint_dir

KIND = "slurm"
_UNPLACEABLE = ("down", "drain", "fail")  # sinfo states (with their suffixes stripped) no job lands on
_PASSED_THROUGH = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR", "SLURM_CONF")


def _print_line(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


@dataclass(frozen=True)
class SlurmBackend:
    """Runs attempts as Slurm batch jobs; workspaces and checkpoints under `shared_folder`.

    Attributes:
        shared_folder: A folder on the cluster's shared filesystem, mounted at the same path here.
        settings: The job's site settings (partition, account, resources, extra options).
        python: The interpreter on the compute nodes that runs the entrypoint.
        client: The Slurm command adapter.
        clock, sleep: Injected for the supervision loop.
        poll_min_seconds, poll_max_seconds: The `squeue` backoff range while a job is queued or running.
        controller_timeout_seconds: How long the controller may go unanswered while a job is followed
            before the attempt ends as `ControllerUnreachable` (the job itself may run on).
        odd_answers_limit: How many unexpected squeue failures in a row (neither "unreachable" nor
            "no such job") are asked again before the attempt ends as `ControllerUnreachable`.
        orphan_grace_seconds: How long `stop_orphan` waits for a cancelled job to end.
        budget: How much of what the job left its evidence takes (by apparent size).
        checkpoint_verify_seconds: How long choosing a checkpoint to resume from may hash the newest
            checkpoints' files against their acknowledgements (sizes are always compared).
    """

    shared_folder: Path
    settings: job.JobSettings = field(default_factory=job.JobSettings)
    python: str = sys.executable
    client: SlurmClient = field(default_factory=SlurmClient)
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    poll_min_seconds: float = 0.25
    poll_max_seconds: float = 2.0
    controller_timeout_seconds: float = 300.0
    odd_answers_limit: int = 5
    orphan_grace_seconds: float = 60.0
    budget: Budget = Budget()
    capture: forensics.StackCapture = forensics.StackCapture()  # a stall's cancel waits for the ranks' stacks
    checkpoint_verify_seconds: float = workspace_evidence.VERIFY_SECONDS
    kind: str = KIND
    evidence_first: ClassVar[bool] = False  # scancel lets the job write its crash report: collect after the stop

    def workspace(self, ref: AttemptRef) -> AttemptWorkspace:
        """The attempt's folders on the shared filesystem, recreated if need be."""
        return AttemptWorkspace.create(self.shared_folder, ref.run_id, ref.attempt)

    def provision(self, run_id: str, attempt: int) -> AttemptRef:
        ws = AttemptWorkspace.create(self.shared_folder, run_id, attempt)
        return AttemptRef(KIND, run_id, attempt, name=job.job_name(run_id, attempt), workspace=str(ws.root),
                          checkpoint_dir=str(ws.checkpoint_dir))

    def run(self, ref: AttemptRef, launch: Launch, on_line: LineSink | None = None) -> AttemptOutcome:
        ws = self.workspace(ref)
        masking.register_environment(launch.env)  # every task's output is masked with them, in evidence too
        started_at = datetime.now(UTC)
        supervisor = self.supervisor()
        try:
            job_id = self._submit_or_adopt(ws, launch)
        except SlurmUnavailable as exc:  # a busy or stopped controller is the cluster's trouble, not the run's
            said = job.unanswered_submit_message(launch.attempt, job.job_name(launch.run_id, launch.attempt),
                                                 supervisor.controller(), str(exc))
            return supervisor.unreachable(ws, None, said, started_at)
        except (SlurmError, OSError) as exc:
            return supervise.never_started(ws, f"sbatch failed: {exc}")
        stopped_for: str | None = None
        try:
            stopped_for = supervisor.follow(ws, job_id, launch, on_line or _print_line)
        except supervise.ControllerLost as lost:
            return supervisor.unreachable(ws, job_id, str(lost), started_at)
        except BaseException as exc:  # the flow is being stopped: the job must not outlive it
            supervisor.cancel_quietly(job_id)
            continuation.write_runner_report(ws, job_id, None, CANCELLED, f"the flow was interrupted ({type(exc).__name__}); "
                               f"Slurm job {job_id} was cancelled")
            raise
        return supervisor.outcome(ws, job_id, stopped_for, started_at)

    def supervisor(self) -> supervise.Supervisor:
        """What follows this backend's jobs to their end, with its client, clock, sleep and limits."""
        limits = supervise.Limits(self.poll_min_seconds, self.poll_max_seconds, self.controller_timeout_seconds,
                                  self.odd_answers_limit)
        return supervise.Supervisor(self.client, limits, self.clock, self.sleep, self.capture)

    def collect_evidence(
        self, ref: AttemptRef, store: EvidenceStore, outcome: AttemptOutcome | None,
        extra: Mapping[str, bytes] | None = None,
    ) -> CollectedEvidence:
        ws = self.workspace(ref)
        lost = outcome is not None and outcome.reason == job.UNREACHABLE
        reach = slurm_evidence.Reach(controller=not lost, settle_seconds=0.0 if lost else 10.0,
                                     clock=self.clock, sleep=self.sleep)
        manifest = slurm_evidence.collect(ws, self.client, store, job_id=continuation.recorded_job_id(ws),
                                          node_failed=bool(outcome and outcome.reason == "NodeLost"), extra=extra,
                                          reach=reach, budget=self.budget)
        return CollectedEvidence(manifest, store.describe(attempt_prefix(ref.run_id, ref.attempt)))

    def signals(self, ref: AttemptRef, outcome: AttemptOutcome) -> Signals:
        return Signals(
            exit_code=outcome.exit_code, reason=outcome.reason, conditions=outcome.conditions,
            events=outcome.events, log=self.log(ref, outcome),
            error_files=torchrun.nodes_error_files(nodes.node_folders(self.workspace(ref).root)),
            stacks=rankstacks.read_stacks(self.workspace(ref).root, outcome.node),
        )

    def log(self, ref: AttemptRef, outcome: AttemptOutcome) -> LogSource:
        jw = continuation.job_workspace(self.workspace(ref))
        log = jobfiles.readable_log(jw.log_path, jw.root)
        if log is None and not outcome.log_tail and outcome.reason == "StartError" and outcome.message:
            # sbatch refused the job: its own words say whether waiting can help (a submit limit)
            # or the request must change (an invalid partition, a node shape no node has).
            return outcome.message
        return log if log is not None else (outcome.log_tail or None)

    def node_signals(self, ref: AttemptRef, outcome: AttemptOutcome) -> list[NodeEvidence]:
        """Each node's signals, for an attempt of one task per node (the spec's `nodes`); [] otherwise."""
        ws = self.workspace(ref)
        record = read_json_object(ws.root / continuation.JOB_RECORD) or {}
        if "--ntasks-per-node=1" not in record.get("sbatch_options", []):
            return []
        return nodes.node_evidence(ws, outcome.reason, lambda: self.supervisor().hostnames(nodes.node_list(ws.root)))

    def checkpoints(self, run_id: str) -> list[str]:
        return workspace_evidence.resumable_checkpoints(run_checkpoint_dir(self.shared_folder, run_id),
                                                        self.checkpoint_verify_seconds)

    def checkpoint_folder(self, run_id: str) -> Path:
        return run_checkpoint_dir(self.shared_folder, run_id)

    def lost_outcome(self, ref: AttemptRef) -> AttemptOutcome:
        """From the runner's report, else the entrypoint's crash report, in the attempt's folder on the shared
        filesystem (the job's own folder, which this machine mounts)."""
        return workspace_evidence.lost_outcome(self.workspace(ref).root)

    def stop_orphan(self, ref: AttemptRef) -> str | None:
        """Cancel the job a dead flow process left queued or running, once Slurm's account of it is kept.

        The job is found by its record, or by name and comment when the flow died before writing
        one. After `scancel` (SIGTERM to the steps, so the entrypoint writes its crash report) the
        job's `scontrol show job` is kept as it ends, for the evidence collected next.
        """
        ws = self.workspace(ref)
        job_id = continuation.recorded_job_id(ws)
        if job_id is None:
            job_id = next(iter(continuation.run_jobs(self.client, self.shared_folder, ref.run_id, ref.attempt)
                               .of(ref.attempt)), None)
        state = self.client.state(job_id) if job_id is not None else None
        if job_id is None or state is None or state in TERMINAL_STATES:
            return None
        if state == "RUNNING":  # scancel's SIGTERM reaches every rank at once: their stacks first
            nodes.take_stacks(continuation.job_workspace(ws).root, self.capture, self.clock, self.sleep)
        self.client.cancel(job_id)
        deadline = self.clock() + self.orphan_grace_seconds
        while (now := self.client.state(job_id)) is not None and now not in TERMINAL_STATES and self.clock() < deadline:
            self.sleep(self.poll_min_seconds)
        info = self.supervisor().final_info(ws, job_id)
        return (f"cancelled Slurm job {job_id}, left {state} without its supervisor; it ended "
                f"{info.state if info is not None else now or 'out of Slurm memory'}")

    def dump_stacks(self, run_id: str, attempt: int) -> str:
        """The `dump-stacks` file in every task's folder of the attempt's running job (its entrypoints poll)."""
        return nodes.ask_for_stacks(self.client, AttemptWorkspace.at(self.shared_folder, run_id, attempt))

    def runs(self) -> dict[str, float]:
        return {run_id: workspace.last_change(self.shared_folder, run_id)
                for run_id in workspace.runs_in(self.shared_folder)}

    def attempts(self, run_id: str) -> list[int]:
        return workspace.attempts_in(self.shared_folder, run_id)

    def supervisor_pid(self, run_id: str, attempt: int) -> int | None:
        """The flow process following the attempt's job, as its job record names it, if it still lives here."""
        record = read_json_object(AttemptWorkspace.at(self.shared_folder, run_id, attempt).root / JOB_RECORD)
        return processes.live_supervisor(record)

    def attempt_folder(self, run_id: str, attempt: int) -> Path:
        return AttemptWorkspace.at(self.shared_folder, run_id, attempt).root

    def release(self, ref: AttemptRef) -> None:
        """Nothing to delete: Slurm ages the job's record out itself; the folder stays for resumes."""

    # --- submission and adoption -------------------------------------------------------------

    def _recorded(self, ws: AttemptWorkspace, launch: Launch) -> str | None:
        """The job the attempt's record names, if Slurm still knows it under the name it was given."""
        record = read_json_object(ws.root / JOB_RECORD)
        origin = continuation.job_attempt(record, launch.attempt)  # a continued job keeps its first name
        recorded = continuation.recorded_job_id(ws)
        if recorded is not None:
            try:
                if self.client.show_job(recorded).fields.get("JobName") == job.job_name(launch.run_id, origin):
                    return recorded
            except JobNotFound:
                pass  # aged out of Slurm's memory: look for a namesake still queued or running
        return None

    def _submit_or_adopt(self, ws: AttemptWorkspace, launch: Launch) -> str:
        jobs = continuation.RunJobs({})
        adopted = self._recorded(ws, launch)
        if adopted is None:  # the run's jobs, asked of squeue once for all that follows
            jobs = continuation.run_jobs(self.client, self.shared_folder, launch.run_id, launch.attempt)
            adopted = next(iter(jobs.of(launch.attempt)), None)
        if adopted is not None:
            continuation.write_job_record(ws, adopted, adopted=True)
            return adopted
        lost = continuation.find_lost_job(jobs, self.shared_folder, launch.run_id, launch.attempt)
        if lost is not None:  # the job an attempt lost with the controller trains on: follow it, don't restart
            origin = AttemptWorkspace.create(self.shared_folder, launch.run_id, lost.job_attempt)
            continuation.link_job_files(ws, origin, lost.job_id)
            continuation.write_job_record(ws, lost.job_id, adopted=True, origin_attempt=lost.job_attempt)
            return lost.job_id
        continuation.cancel_earlier_jobs(self.client, jobs, launch.attempt)
        script = ws.root / workspace.SLURM_BATCH_SCRIPT
        entry = entrypoint_archive.write_into(self.shared_folder / ".trainguard")
        script.write_text(job.batch_script(
            python=self.python, entrypoint=str(entry), command=launch.command, workspace=str(ws.root),
            run_id=launch.run_id, attempt=launch.attempt,
            limit_seconds=60 * (job.time_limit_minutes(launch.deadline_seconds) or 0),
            lead_seconds=job.signal_lead(self.settings, launch),
        ), encoding="utf-8")
        options = job.sbatch_options(self.settings, launch, workspace=str(ws.root),
                                           shared_folder=str(self.shared_folder), exclude=self._exclusions(launch))
        env = container_env(launch, workspace=str(ws.root), checkpoint_dir=str(ws.checkpoint_dir),
                            base=self._base_env(), capture=self.capture)
        job_id = self.client.submit(str(script), options, env)
        continuation.write_job_record(ws, job_id, adopted=False, options=options)
        return job_id

    def _base_env(self) -> dict[str, str]:
        client_env = self.client.env if self.client.env is not None else os.environ
        return {name: client_env[name] for name in _PASSED_THROUGH if name in client_env}

    def placeable_nodes(self) -> list[str]:
        """The partition's nodes that can take a job now or soon (not down, drained or failed)."""
        listed = self.client.nodes(self.settings.partition)
        return sorted(node for node, state in listed if not state.rstrip("*~#!%$@^-+").startswith(_UNPLACEABLE))

    def _exclusions(self, launch: Launch) -> list[str]:
        """Nodes to keep off: those earlier attempts failed on, if the partition has others left."""
        if not launch.avoid_nodes:
            return []
        try:
            nodes = {node for node, _ in self.client.nodes(self.settings.partition)}
        except SlurmError:
            return []
        avoid = [node for node in launch.avoid_nodes if node in nodes]
        return avoid if nodes - set(avoid) else []  # else the job waits for the node to come back
