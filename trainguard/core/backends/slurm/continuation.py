"""An attempt that continues the Slurm job an earlier attempt of its run lost track of.

When Slurm's controller stops answering (or answers nonsense), the attempt following a job ends as
`ControllerUnreachable` while the job itself may run on. The next attempt must not cancel that job
and start over from an older checkpoint: it continues it. The job keeps writing into the earlier
attempt's folder (its environment says so), so the new attempt's folder gets relative links to
those files (log, crash report, snapshots, core dumps, the other tasks' folders, the job's stdout
and stderr, the batch script and Slurm's warning marker): supervision, triage and evidence read
them through the links as if the job were the attempt's own. Submitting and supervising is
``backend``'s; the job's name and comment are ``job``'s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainguard_entrypoint.files import read_json_object, write_json_atomic

from trainguard.core import ids
from trainguard.core.backends import processes, workspace
from trainguard.core.backends.slurm import job
from trainguard.core.backends.slurm.client import SlurmClient
from trainguard.core.backends.workspace import RUNNER_REPORT, AttemptWorkspace

JOB_RECORD = workspace.SLURM_JOB_RECORD  # kept under this name for the job record's readers


@dataclass(frozen=True)
class LostJob:
    """A job still queued or running that an earlier attempt stopped following.

    Attributes:
        job_id: Slurm's id of the job.
        job_attempt: The attempt the job was submitted for (its name, comment and folder are that attempt's).
        lost_by: The attempt that lost track of it.
    """

    job_id: str
    job_attempt: int
    lost_by: int


def job_attempt(record: dict[str, Any] | None, attempt: int) -> int:
    """The attempt whose job a folder's `slurm-job.json` names (its own, unless it continued another's)."""
    value = (record or {}).get("job_attempt")
    return value if isinstance(value, int) and 1 <= value <= attempt else attempt


@dataclass(frozen=True)
class RunJobs:
    """A run's jobs still queued or running, by the attempt each was submitted for, from one `squeue`.

    A job is the run's when both its name and its comment are those trainguard gave an attempt of
    the run from this shared folder: a namesake of another installation is not.
    """

    by_attempt: dict[int, tuple[str, ...]]

    def of(self, attempt: int) -> tuple[str, ...]:
        """The ids of the jobs submitted for ``attempt`` that are still queued or running."""
        return self.by_attempt.get(attempt, ())


def run_jobs(client: SlurmClient, shared_folder: Path, run_id: str, attempt: int) -> RunJobs:
    """The jobs of attempts 1 to ``attempt`` of the run still queued or running.

    Raises:
        SlurmError: squeue could not be asked (the caller decides what that means).
    """
    ours = {(job.job_name(run_id, n), job.job_comment(run_id, n, str(shared_folder))): n for n in range(1, attempt + 1)}
    found: dict[int, tuple[str, ...]] = {}
    for queued in client.queued():
        if (n := ours.get((queued.name, queued.comment))) is not None:
            found[n] = (*found.get(n, ()), queued.job_id)
    return RunJobs(found)


def find_lost_job(jobs: RunJobs, shared_folder: Path, run_id: str, attempt: int) -> LostJob | None:
    """The newest earlier attempt's job left queued or running when that attempt lost the controller."""
    for earlier in range(attempt - 1, 0, -1):
        root = AttemptWorkspace.at(Path(shared_folder), run_id, earlier).root
        runner = read_json_object(root / workspace.RUNNER_REPORT)
        if runner is None or runner.get("reason") != job.UNREACHABLE:
            continue
        origin = job_attempt(read_json_object(root / JOB_RECORD), earlier)
        found = jobs.of(origin)
        if found:
            known = runner.get("job_id")
            return LostJob(known if known in found else found[0], origin, earlier)
    return None


def link_job_files(ws: AttemptWorkspace, origin: AttemptWorkspace, job_id: str) -> None:
    """Point `ws`'s files at the ones the job writes in `origin`'s folder (relative links; empty folders replaced)."""
    pairs = [(ws.log_path, origin.log_path)]
    names = (workspace.CRASH_REPORT, workspace.SNAPSHOT, workspace.COREDUMPS, workspace.NODE_FOLDERS,
             workspace.SLURM_SIGNAL_MARKER, workspace.slurm_output(job_id, "out"), workspace.slurm_output(job_id, "err"),
             workspace.SLURM_BATCH_SCRIPT)
    pairs += [(ws.root / name, origin.root / name) for name in names]
    for target, source in pairs:
        if target.is_symlink():
            target.unlink()
        elif target.is_dir() and not any(target.iterdir()):
            target.rmdir()
        if not target.exists():
            target.symlink_to(os.path.relpath(source, target.parent))


def cancel_earlier_jobs(client: SlurmClient, jobs: RunJobs, attempt: int) -> None:
    """Cancel the run's earlier attempts' jobs still queued or running that no attempt continues.

    Called only when `find_lost_job` found none to continue, just before a new job is submitted, so
    no two jobs train on the run's checkpoint folder at once.
    """
    for earlier in range(1, attempt):
        for job_id in jobs.of(earlier):
            client.cancel(job_id)


def job_workspace(ws: AttemptWorkspace) -> AttemptWorkspace:
    """The folder the attempt's job writes: the attempt's own, or that of the attempt whose job it continues.

    Whoever reads the job's files (supervision, triage, evidence) reads them there, not through the
    links `link_job_files` made: the job can write its folders, so nothing of them is followed.
    """
    origin = job_attempt(read_json_object(ws.root / JOB_RECORD, ws.root), ws.attempt)
    if origin == ws.attempt:
        return ws
    return AttemptWorkspace(root=ws.root.parent / ids.attempt_name(origin), run_id=ws.run_id, attempt=origin,
                            checkpoint_dir=ws.checkpoint_dir)


def recorded_job_id(ws: AttemptWorkspace) -> str | None:
    """The job id this attempt's folder records, if a job was submitted for it."""
    job_id = (read_json_object(ws.root / JOB_RECORD) or {}).get("job_id")
    return job_id if isinstance(job_id, str) and job_id.isdigit() else None


def write_job_record(ws: AttemptWorkspace, job_id: str, *, adopted: bool, options: list[str] | None = None,
                     origin_attempt: int | None = None) -> None:
    """Record in the attempt's folder which job it follows, who follows it now, and how it came to.

    A continued job keeps the name of the attempt it was submitted for (``origin_attempt``), whose
    files are linked here; an adopted one gains an ``adopted_at`` stamp, a submitted one its options.
    """
    path = ws.root / JOB_RECORD
    loaded = read_json_object(path) or {}
    previous: dict[str, Any] = loaded if loaded.get("job_id") == job_id else {}
    origin = origin_attempt or job_attempt(previous, ws.attempt)
    record = {**previous, "job_id": job_id, "job_name": job.job_name(ws.run_id, origin),
              **processes.supervisor_record()}  # who follows the job now
    if origin != ws.attempt:
        record["job_attempt"] = origin  # continued from the attempt that lost it; its files are linked here
    stamp = datetime.now(UTC).isoformat()
    if adopted:
        record["adopted_at"] = [*previous.get("adopted_at", []), stamp]
    else:
        record.update(submitted_at=stamp, sbatch_options=options or [])
    write_json_atomic(path, record)


def write_runner_report(ws: AttemptWorkspace, job_id: str | None, exit_code: int | None, reason: str, message: str,
                        sig: int | None = None) -> None:
    """The supervisor's own account of how the attempt's job ended (`runner.json`), as the local runner keeps one."""
    payload = {"format": 1, "backend": "slurm", "run_id": ws.run_id, "attempt": ws.attempt, "job_id": job_id,
               "reason": reason, "message": message, "exit_code": exit_code, "signal": sig,
               "entrypoint_pid": None, "finished_at": datetime.now(UTC).isoformat(),
               "log_path": str(ws.log_path)}
    try:
        write_json_atomic(ws.root / RUNNER_REPORT, payload)
    except OSError:
        pass  # shows up as missing evidence; the outcome is still returned
