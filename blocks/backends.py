"""Backend blocks: where a training attempt runs. Configuration only; the work is in the core.

Every backend block has a `backend()` factory that builds the core adapter behind the
`trainguard.core.backends.base.Backend` seam, the way `EvidenceFolder.store()` builds a store. Flows load
a backend block by its reference (`slug/name`) whatever its type and only ever call the factory.
"""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field

from blocks import jobfields
from blocks.factories import local_backend
from trainguard.core.backends.base import Backend
from trainguard.core.backends.forensics import StackCapture
from trainguard.core.backends.jobfiles import Budget


class LocalProcessBackend(Block):
    """Runs training as a local child process under trainguard's container entrypoint."""

    _block_type_name = "trainguard Local Process Backend"
    _block_type_slug = "trainguard-local-process-backend"
    _description = "Run training attempts as local processes, with a shared checkpoint folder per run."

    work_root: str = Field(
        default="trainguard-data/work",
        title="Work folder",
        description="Folder for attempt workspaces and checkpoints; trainguard-data/... lies under TRAINGUARD_HOME "
        "when it is set, another relative path under the flow's working directory.",
    )
    grace_seconds: float = Field(
        default=10.0, ge=0, title="Grace period (s)",
        description="How long a stopped command gets between SIGTERM and SIGKILL.",
    )
    python: str | None = Field(
        default=None, title="Python",
        description="Interpreter that runs the container entrypoint; defaults to the flow's own.",
    )
    evidence_budget_bytes: int = jobfields.evidence_budget(
        "logs, reports, snapshots, the newest checkpoint, core dumps", "in the work folder")
    core_dump_budget_bytes: int = jobfields.core_dump_budget("in the work folder")
    log_budget_bytes: int = jobfields.log_budget("in the work folder")

    stack_sweep_seconds: float = jobfields.stack_sweep(
        "a hung or stopped attempt is ended (added to the grace period)")
    native_stacks: bool = jobfields.native_stacks()
    checkpoint_verify_seconds: float = jobfields.checkpoint_verify("trainguard")

    def backend(self) -> Backend:
        """The local-process adapter this block describes."""
        return local_backend(self.work_root, self.grace_seconds, self.python,
                             budget=Budget(total_bytes=self.evidence_budget_bytes,
                                           core_dump_bytes=self.core_dump_budget_bytes,
                                           log_bytes=self.log_budget_bytes),
                             capture=StackCapture(self.stack_sweep_seconds, self.native_stacks),
                             checkpoint_verify_seconds=self.checkpoint_verify_seconds)
