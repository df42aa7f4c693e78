"""What every backend tells the entrypoint about a hang, and how a stop leaves it time to act.

The entrypoint (`trainguard_entrypoint.forensics`) takes every rank's stack before a hung attempt
is ended. It reads its settings from the environment the backend builds (`container_env`):
`TRAINGUARD_STALL_SECONDS` (the spec's stall window: the watch takes the stacks at most of it),
`TRAINGUARD_STACK_SWEEP_SECONDS` (the sweep's bound; 0 turns the capture off),
`TRAINGUARD_STACK_NATIVE` (ask py-spy for native frames too) and PyTorch's flight-recorder
variables, which point its dumps and pipes into the attempt's folder. A supervisor that stops an
attempt waits the sweep on top of its grace period (`stop_grace`), so the stacks are on record
before anything is killed.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from trainguard_entrypoint.files import read_json_object
from trainguard_entrypoint.forensics import flight_recorder_env

from trainguard.core.backends.workspace import DUMP_REQUEST, INDEX, PROGRESS_RECORD, STACKS

__all__ = ["DumpsStacks", "NotRunning", "StackCapture", "capture_env", "flight_recorder_env", "last_progress",
           "request_stacks", "stacks_taken"]

DEFAULT_SWEEP_SECONDS = 30.0


@dataclass(frozen=True)
class StackCapture:
    """A backend's stack-capture settings (from its block).

    Attributes:
        sweep_seconds: The whole sweep's time bound, every rank at once; 0 turns the capture off.
        native: Ask py-spy for native frames too (needs ptrace: SYS_PTRACE in a container).
    """

    sweep_seconds: float = DEFAULT_SWEEP_SECONDS
    native: bool = True

    def __post_init__(self) -> None:
        if not (isinstance(self.sweep_seconds, int | float) and 0 <= self.sweep_seconds < math.inf):
            raise ValueError(f"stack_sweep_seconds {self.sweep_seconds!r}: give a number of seconds from 0 "
                             f"(0 turns the stack capture off), e.g. {DEFAULT_SWEEP_SECONDS:g}")

    def stop_grace(self, grace_seconds: float) -> float:
        """How long a stopped attempt gets before SIGKILL: the stacks' sweep first, then the command's grace."""
        return grace_seconds + self.sweep_seconds


class NotRunning(Exception):
    """The attempt asked for its stacks is not running (or not here, or not ours); one line says which."""


@runtime_checkable
class DumpsStacks(Protocol):
    """A backend that can ask a running attempt's entrypoint for every rank's stack now (`trainguard dump`)."""

    def dump_stacks(self, run_id: str, attempt: int) -> str:
        """Ask for them; return one line on how. The entrypoint writes them into the attempt's `stacks/`.

        Raises:
            NotRunning: The attempt does not run (here); the message says so and why.
        """
        ...


def capture_env(stall_seconds: float | None, capture: StackCapture) -> dict[str, str]:
    """The entrypoint's hang settings: the stall window it watches, the sweep's bound, native frames or not.

    PyTorch's flight-recorder variables (`flight_recorder_env`, for the attempt's folder) go beside them.
    """
    env = {"TRAINGUARD_STACK_SWEEP_SECONDS": f"{capture.sweep_seconds:g}",
           "TRAINGUARD_STACK_NATIVE": "1" if capture.native else "0"}
    if stall_seconds:
        env["TRAINGUARD_STALL_SECONDS"] = f"{stall_seconds:g}"
    return env


def last_progress(folders: Sequence[Path]) -> float | None:
    """When the entrypoints last saw progress in rank logs or checkpoints (epoch seconds, from each
    folder's `progress.json`); None when none says so. The files are the job's: read bounded, no link."""
    times = []
    for folder in folders:
        record = read_json_object(folder / PROGRESS_RECORD, folder)
        if (at := _epoch(record.get("at") if record else None)) is not None:
            times.append(at)
    return max(times, default=None)


def stacks_taken(folder: Path) -> float | None:
    """When the entrypoint last wrote the ranks' stacks in this attempt folder (epoch seconds), if it did."""
    record = read_json_object(folder / STACKS / INDEX, folder)
    return _epoch(record.get("started_at") if record else None)


def _epoch(value: object) -> float | None:
    """A time the job's file gives, in epoch seconds: a finite number, else None (a 400-digit integer
    is no time, and `float` would raise on it)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def request_stacks(folders: Sequence[Path]) -> list[str]:
    """Ask the entrypoint of each attempt folder for the ranks' stacks: it polls for a `dump-stacks`
    file there (once a second) and takes them at once. Returns what could not be asked, one line each."""
    problems = []
    for folder in folders:
        try:
            fd = os.open(folder / DUMP_REQUEST, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
            os.close(fd)
        except OSError as exc:
            problems.append(f"cannot write {folder / DUMP_REQUEST}: {exc.strerror or exc}")
    return problems


def wait_for_stacks(folder: Path, since: float, timeout: float, *, clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> bool:
    """Wait (at most `timeout`) until the folder's stacks were taken at or after `since` (epoch seconds)."""
    deadline = clock() + timeout
    while (taken := stacks_taken(folder)) is None or taken < since:
        if clock() >= deadline:
            return False
        sleep(0.25)
    return True
