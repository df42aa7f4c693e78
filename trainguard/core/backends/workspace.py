"""The on-disk layout of one training attempt: where its logs, snapshots, core dumps and report live.

Everything that names a path inside ``{work_root}/runs/{run_id}/...`` belongs here, so the
entrypoint's arguments, the local runner and evidence collection agree on one layout. Running or
collecting anything does not belong here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# A run id becomes a directory name and part of a log file name, so it must be one safe segment.
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class WorkspaceError(ValueError):
    """A workspace cannot be laid out from the values given (bad run id or attempt number)."""


def validate_run_id(run_id: str) -> str:
    """Return ``run_id`` unchanged, or raise a one-line `WorkspaceError` saying what to fix.

    Args:
        run_id: The identifier shared by every attempt of one training run.
    """
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id) or ".." in run_id:
        raise WorkspaceError(
            f"run_id {run_id!r} is not a safe path segment: use 1-128 letters, digits, '.', '_' "
            "or '-', starting with a letter or digit (e.g. 'llama-ft-2024-06-01')"
        )
    return run_id


def validate_attempt(attempt: int) -> int:
    """Return ``attempt`` unchanged, or raise a one-line `WorkspaceError` saying what to fix."""
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise WorkspaceError(f"attempt {attempt!r} is invalid: attempts are numbered 1, 2, 3, ...")
    return attempt


def run_checkpoint_dir(work_root: Path, run_id: str) -> Path:
    """``{work_root}/runs/{run_id}/checkpoints``: the folder every attempt of a run shares."""
    return Path(work_root) / "runs" / validate_run_id(run_id) / "checkpoints"


@dataclass(frozen=True)
class AttemptWorkspace:
    """The folders of one attempt, and the checkpoint folder shared by every attempt of its run."""

    root: Path
    run_id: str
    attempt: int
    checkpoint_dir: Path

    @property
    def logs_dir(self) -> Path:
        """Where the entrypoint tees the command's output."""
        return self.root / "logs"

    @property
    def coredumps_dir(self) -> Path:
        """Where the entrypoint moves core files after a crash."""
        return self.root / "coredumps"

    @property
    def snapshot_dir(self) -> Path:
        """Environment, host and GPU snapshots taken before and after the command."""
        return self.root / "snapshot"

    @property
    def log_path(self) -> Path:
        """The attempt's training log (stdout and stderr of the command, as bytes)."""
        return self.logs_dir / f"train-{self.run_id}-attempt-{self.attempt}.log"

    @property
    def crash_report_path(self) -> Path:
        """The entrypoint's JSON report on how the command ended."""
        return self.root / "crash-report.json"

    @property
    def process_path(self) -> Path:
        """Which process runs the attempt (pid, process group, start time), written when it starts.

        Whoever finds the attempt's supervisor dead reads it to stop the command left behind.
        """
        return self.root / "process.json"

    @property
    def runner_report_path(self) -> Path:
        """The local runner's own view of the attempt (written even if the entrypoint was killed)."""
        return self.root / "runner.json"

    @classmethod
    def create(cls, work_root: Path, run_id: str, attempt: int) -> AttemptWorkspace:
        """Lay out (and create) ``{work_root}/runs/{run_id}/attempt-{attempt}``.

        Args:
            work_root: The base folder holding every run.
            run_id: A safe path segment naming the run.
            attempt: The attempt number, from 1.

        Raises:
            WorkspaceError: ``run_id`` or ``attempt`` is invalid, or the folders cannot be made.
        """
        validate_run_id(run_id)
        validate_attempt(attempt)
        checkpoint_dir = run_checkpoint_dir(work_root, run_id)
        workspace = cls(
            root=checkpoint_dir.parent / f"attempt-{attempt}",
            run_id=run_id,
            attempt=attempt,
            checkpoint_dir=checkpoint_dir,
        )
        folders = (workspace.logs_dir, workspace.coredumps_dir, workspace.snapshot_dir)
        try:
            for folder in (*folders, workspace.checkpoint_dir):
                folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WorkspaceError(
                f"work_root {str(work_root)!r}: cannot create the attempt folders ({exc.strerror or exc}); "
                "point work_root at a writable directory"
            ) from exc
        return workspace
