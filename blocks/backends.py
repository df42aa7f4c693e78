"""Backend blocks: where a training attempt runs. Configuration only; the work is in the core.

`LocalProcessBackend` runs the command as a child process of the flow, through the container
entrypoint, on this machine. The Kubernetes backend lives beside it once it exists. The factory
methods (`workspace`, `runner`, `checkpoints`) are the one seam tests go through.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prefect.blocks.core import Block
from pydantic import Field

from trainguard.core import evidence
from trainguard.core.local import LocalProcessRunner
from trainguard.core.workspace import AttemptWorkspace, run_checkpoint_dir


class LocalProcessBackend(Block):
    """Runs training as a local child process under trainguard's container entrypoint."""

    _block_type_name = "trainguard Local Process Backend"
    _block_type_slug = "trainguard-local-process-backend"
    _description = "Run training attempts as local processes, with a shared checkpoint folder per run."

    work_root: str = Field(
        default="trainguard-data/work",
        description="Folder for attempt workspaces and checkpoints (relative to the flow's working directory).",
    )
    grace_seconds: float = Field(
        default=10.0, ge=0, description="How long a stopped command gets between SIGTERM and SIGKILL."
    )
    python: str | None = Field(
        default=None, description="Interpreter that runs the container entrypoint; defaults to the flow's own."
    )

    def root(self) -> Path:
        return Path(self.work_root).expanduser().resolve()

    def workspace(self, run_id: str, attempt: int) -> AttemptWorkspace:
        """Lay out (and create) the attempt's workspace."""
        return AttemptWorkspace.create(self.root(), run_id, attempt)

    def runner(self, on_line: Callable[[str], None] | None = None) -> LocalProcessRunner:
        """The process runner configured by this block."""
        import sys

        return LocalProcessRunner(python=self.python or sys.executable, grace_seconds=self.grace_seconds, on_line=on_line)

    def checkpoints(self, run_id: str) -> list[str]:
        """The run's checkpoints, newest first, as paths."""
        folder = run_checkpoint_dir(self.root(), run_id)
        return [str(path) for path in evidence.newest_checkpoints(folder)] if folder.is_dir() else []
