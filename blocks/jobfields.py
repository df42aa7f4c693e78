"""The fields every block of a backend whose job leaves files in a folder trainguard reads shares:
the evidence budgets, the stack capture and the checkpoint check. Each says where what does not fit stays."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from trainguard.core.backends.forensics import DEFAULT_SWEEP_SECONDS
from trainguard.core.backends.jobfiles import (
    DEFAULT_CORE_DUMP_BUDGET_BYTES, DEFAULT_EVIDENCE_BUDGET_BYTES, DEFAULT_LOG_BUDGET_BYTES,
)
from trainguard.core.backends.workspace_evidence import VERIFY_SECONDS


def evidence_budget(left: str, folder: str) -> Any:
    """The evidence budget: `left` is what the job leaves, `folder` where what does not fit stays."""
    return Field(
        default=DEFAULT_EVIDENCE_BUDGET_BYTES, ge=0, title="Evidence budget (bytes)",
        description=f"At most this much of what the job left ({left}) is copied into the evidence per attempt, "
                    "counted by apparent size, so a sparse 10 TB file costs what it claims. What does not fit "
                    f"stays {folder} and is listed as missing with its size; a log over it is cut there.",
    )


def core_dump_budget(folder: str) -> Any:
    return Field(
        default=DEFAULT_CORE_DUMP_BUDGET_BYTES, ge=0, title="Core dump budget (bytes)",
        description=f"Core dumps together, within the evidence budget; a core over it stays {folder} (listed as "
                    "missing with its size). Cores are copied whole, holes kept, or not at all.",
    )


def log_budget(folder: str) -> Any:
    return Field(
        default=DEFAULT_LOG_BUDGET_BYTES, ge=0, title="Log budget (bytes)",
        description="Each log the job writes (the console log, each rank's and each task's log), within the "
                    "evidence budget: a longer log is stored masked up to there, said to be cut, and kept whole "
                    f"{folder}; its last lines are in crash-tail.txt.",
    )


def stack_sweep(before: str) -> Any:
    """The stack capture's bound: `before` says what it comes before and what waits for it."""
    return Field(
        default=DEFAULT_SWEEP_SECONDS, ge=0, title="Stack capture bound (s)",
        description=f"Before {before}, every rank's stack is taken (py-spy, else Python's faulthandler) within "
                    "this many seconds. 0 = no capture.",
    )


def native_stacks() -> Any:
    return Field(
        default=True, title="Native frames in the stacks",
        description="Ask py-spy for native (C/C++) frames too (py-spy dump --native); where ptrace does not "
                    "allow it the Python stack is kept.",
    )


def checkpoint_verify(where: str) -> Any:
    """How long choosing a checkpoint to resume from may hash the newest ones; ``where`` reads them."""
    return Field(
        default=VERIFY_SECONDS, ge=0, le=86400, title="Time to check the newest checkpoints (s)",
        description=f"How long {where} may hash the newest checkpoints' files against their acknowledgements "
        "before choosing one to resume from (their sizes are always compared): about 120 GB at 1 GB/s in 120 s, "
        "18 GB from a network volume at 150 MB/s. A checkpoint not hashed in full in time is kept, and the "
        "flow's log says so; 0 checks sizes only.",
    )
