"""Backend blocks: where a training attempt runs. Configuration only; the work is in the core.

Every backend block has a `backend()` factory that builds the core adapter behind the
`trainguard.core.backends.base.Backend` seam, the way `EvidenceFolder.store()` builds a store. Flows load
a backend block by its reference (`slug/name`) whatever its type and only ever call the factory.
"""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field

from blocks.factories import local_backend
from trainguard.core.backends.base import Backend
from trainguard.core.backends.forensics import DEFAULT_SWEEP_SECONDS, StackCapture
from trainguard.core.backends.jobfiles import (
    DEFAULT_CORE_DUMP_BUDGET_BYTES, DEFAULT_EVIDENCE_BUDGET_BYTES, DEFAULT_LOG_BUDGET_BYTES, Budget,
)


class LocalProcessBackend(Block):
    """Runs training as a local child process under trainguard's container entrypoint."""

    _block_type_name = "trainguard Local Process Backend"
    _block_type_slug = "trainguard-local-process-backend"
    _description = "Run training attempts as local processes, with a shared checkpoint folder per run."

    work_root: str = Field(
        default="trainguard-data/work",
        title="Work folder",
        description="Folder for attempt workspaces and checkpoints (relative to the flow's working directory).",
    )
    grace_seconds: float = Field(
        default=10.0, ge=0, title="Grace period (s)",
        description="How long a stopped command gets between SIGTERM and SIGKILL.",
    )
    python: str | None = Field(
        default=None, title="Python",
        description="Interpreter that runs the container entrypoint; defaults to the flow's own.",
    )
    evidence_budget_bytes: int = Field(
        default=DEFAULT_EVIDENCE_BUDGET_BYTES, ge=0, title="Evidence budget (bytes)",
        description="At most this much of what the training job left (logs, reports, snapshots, the newest "
                    "checkpoint, core dumps) is copied into the evidence per attempt, counted by apparent size, "
                    "so a sparse 10 TB file costs what it claims. What does not fit stays in the work folder "
                    "and is listed as missing with its size; a log over it is cut there.",
    )
    core_dump_budget_bytes: int = Field(
        default=DEFAULT_CORE_DUMP_BUDGET_BYTES, ge=0, title="Core dump budget (bytes)",
        description="Core dumps together, within the evidence budget; a core over it stays in the work folder "
                    "(listed as missing with its size). Cores are copied whole, holes kept, or not at all.",
    )
    log_budget_bytes: int = Field(
        default=DEFAULT_LOG_BUDGET_BYTES, ge=0, title="Log budget (bytes)",
        description="Each log the job writes (the console log, each rank's and each task's log), within the "
                    "evidence budget: a longer log is stored masked up to there, said to be cut, and kept whole "
                    "in the work folder; its last lines are in crash-tail.txt.",
    )

    stack_sweep_seconds: float = Field(
        default=DEFAULT_SWEEP_SECONDS, ge=0, title="Stack capture bound (s)",
        description="Before a hung or stopped attempt is ended, every rank's stack is taken (py-spy, else "
                    "Python's faulthandler) within this many seconds, added to the grace period. 0 = no capture.",
    )
    native_stacks: bool = Field(
        default=True, title="Native frames in the stacks",
        description="Ask py-spy for native (C/C++) frames too (py-spy dump --native); where ptrace does not "
                    "allow it the Python stack is kept.",
    )

    def backend(self) -> Backend:
        """The local-process adapter this block describes."""
        return local_backend(self.work_root, self.grace_seconds, self.python,
                             budget=Budget(total_bytes=self.evidence_budget_bytes,
                                           core_dump_bytes=self.core_dump_budget_bytes,
                                           log_bytes=self.log_budget_bytes),
                             capture=StackCapture(self.stack_sweep_seconds, self.native_stacks))
