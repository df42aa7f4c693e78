"""The folder one attempt fills, on every backend: where its logs, snapshots, core dumps and reports live.

The entrypoint fills it inside the training container (a local process, a pod, a Slurm task), the
runners write beside it, and evidence collection reads it. The names inside it are the
entrypoint's (`trainguard_entrypoint.paths`, stdlib-only so both sides of the container line share
them), re-exported here for the core; this module owns the rest: finding a run's attempt folders
under a work root and laying one out. Where the folder lies under that root
(``runs/{run id}/attempt-{n}``) is ``trainguard.core.ids``'s. Running or collecting anything does
not belong here.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path

from trainguard_entrypoint import paths
from trainguard_entrypoint.paths import (
    COREDUMPS, CRASH_REPORT, DUMP_REQUEST, ENV_SNAPSHOT, EXPECTED_SNAPSHOTS, FLIGHT_RECORDER, GPU_AFTER, GPU_BEFORE,
    HELPER_ARCHIVE, HOST_SNAPSHOT, INDEX, KEPT_LOG, KEPT_NODE_MAP, KEPT_PODS, KEPT_VOLUME, LOGS, NODE_FOLDERS, NOTICE_FILE, PROCESS_RECORD,
    PROGRESS_RECORD, RANKS, RUNNER_REPORT, SLURM_BATCH_SCRIPT, SLURM_JOB_RECORD, SLURM_JOB_SHOWN, SLURM_KEPT, SLURM_SIGNAL_MARKER,
    SNAPSHOT,
    STACKS, STACKS_SITE, TORCHELASTIC, TORCHELASTIC_ERROR, TRIAGE_FACTS, AttemptPaths, node_prefix, slurm_output,
    torchrun_env,
)

from trainguard.core import ids

__all__ = [  # the entrypoint's names, re-exported: the core keeps no copy of its own
    "COREDUMPS", "CRASH_REPORT", "DUMP_REQUEST", "ENV_SNAPSHOT", "EXPECTED_SNAPSHOTS", "FLIGHT_RECORDER", "GPU_AFTER",
    "GPU_BEFORE", "HELPER_ARCHIVE", "HOST_SNAPSHOT", "INDEX", "KEPT_LOG", "KEPT_NODE_MAP", "KEPT_PODS", "KEPT_VOLUME", "LOGS", "NODE_FOLDERS",
    "NOTICE_FILE", "PROCESS_RECORD", "PROGRESS_RECORD", "RANKS", "RUNNER_REPORT", "SLURM_BATCH_SCRIPT",
    "SLURM_JOB_RECORD", "SLURM_JOB_SHOWN", "SLURM_KEPT", "SLURM_SIGNAL_MARKER", "SNAPSHOT", "STACKS", "STACKS_SITE", "TORCHELASTIC",
    "TORCHELASTIC_ERROR", "TRIAGE_FACTS", "AttemptPaths", "node_prefix", "slurm_output", "torchrun_env",
    "AttemptWorkspace", "WorkspaceError", "attempt_dir", "attempts_in", "last_change", "log_name",
    "run_checkpoint_dir", "runs_in",
]


class WorkspaceError(ValueError):
    """An attempt's folders cannot be made where they were asked for; the message says what to fix."""


def log_name(run_id: str, attempt: int) -> str:
    """The training log's file name, ``train-{run id}-attempt-{n}.log`` (in ``logs/``)."""
    return paths.log_name(ids.validate_run_id(run_id), ids.validate_attempt(attempt))


def attempt_dir(root: str, run_id: str, attempt: int) -> str:
    """The attempt's folder under a work root as a POSIX path, for a machine this one does not see (a pod)."""
    return posixpath.join(root, ids.attempt_path(run_id, attempt))


def run_checkpoint_dir(work_root: Path, run_id: str) -> Path:
    """``{work_root}/runs/{run_id}/checkpoints``: the folder every attempt of a run shares."""
    return Path(work_root) / ids.checkpoints_path(run_id)


def attempts_in(work_root: Path, run_id: str) -> list[int]:
    """The attempts of a run that have a folder under ``work_root``, in order."""
    run_dir = Path(work_root) / ids.run_path(run_id)
    try:
        names = [entry.name for entry in run_dir.iterdir() if entry.is_dir()]
    except OSError:
        return []
    return sorted(n for name in names if (n := ids.attempt_number(name)) is not None)


def runs_in(work_root: Path) -> dict[str, list[int]]:
    """run id -> its attempts, for every run with an attempt folder under ``work_root``."""
    try:
        runs = [entry.name for entry in (Path(work_root) / ids.RUNS).iterdir() if entry.is_dir()]
    except OSError:
        return {}
    found = {run_id: attempts_in(work_root, run_id) for run_id in runs if _valid(run_id)}
    return {run_id: attempts for run_id, attempts in found.items() if attempts}


def last_change(work_root: Path, run_id: str) -> float:
    """When the run's folder or one of its attempt folders last changed (epoch seconds); 0 if none is there."""
    run_dir = Path(work_root) / ids.run_path(run_id)
    folders = [run_dir, *(run_dir / ids.attempt_name(n) for n in attempts_in(work_root, run_id))]
    times = []
    for folder in folders:
        try:
            times.append(folder.stat().st_mtime)
        except OSError:
            continue
    return max(times, default=0.0)


def _valid(run_id: str) -> bool:
    try:
        ids.validate_run_id(run_id)
    except ids.InvalidId:
        return False
    return True


@dataclass(frozen=True)
class AttemptWorkspace:
    """The folder of one attempt, and the checkpoint folder shared by every attempt of its run.

    The names inside ``root`` are the entrypoint's, re-exported above (``ws.root / CRASH_REPORT``):
    this class adds only the training log, whose name carries the run and the attempt.
    """

    root: Path
    run_id: str
    attempt: int
    checkpoint_dir: Path

    @property
    def log_path(self) -> Path:
        """The attempt's training log (stdout and stderr of the command, as bytes), in `LOGS`."""
        return self.root / LOGS / log_name(self.run_id, self.attempt)

    @classmethod
    def at(cls, work_root: Path, run_id: str, attempt: int) -> AttemptWorkspace:
        """The attempt's folders under ``work_root``, as paths only: nothing is created or checked on disk.

        Raises:
            ids.InvalidId: ``run_id`` or ``attempt`` is invalid.
        """
        return cls(root=Path(work_root) / ids.attempt_path(run_id, attempt), run_id=run_id, attempt=attempt,
                   checkpoint_dir=run_checkpoint_dir(work_root, run_id))

    @classmethod
    def create(cls, work_root: Path, run_id: str, attempt: int) -> AttemptWorkspace:
        """Lay out (and create) ``{work_root}/runs/{run_id}/attempt-{attempt}``.

        Args:
            work_root: The base folder holding every run.
            run_id: A safe path segment naming the run.
            attempt: The attempt number, from 1.

        Raises:
            ids.InvalidId: ``run_id`` or ``attempt`` is invalid.
            WorkspaceError: The folders cannot be made.
        """
        workspace = cls.at(work_root, run_id, attempt)
        folders = [workspace.root / name for name in (LOGS, COREDUMPS, SNAPSHOT)]
        try:
            for folder in (*folders, workspace.checkpoint_dir):
                folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WorkspaceError(
                f"work_root {str(work_root)!r}: cannot create the attempt folders ({exc.strerror or exc}); "
                "point work_root at a writable directory"
            ) from exc
        return workspace
