"""Training processes whose supervisor died: find them by their process record and stop them.

When the flow process that supervises a local attempt is killed (SIGKILL, the OOM killer), its
training command keeps running unsupervised next to the next attempt, on the same checkpoint
folder. The runner writes `process.json` when it starts the entrypoint; whoever finds the attempt
dead (the crash hook, the retry controller) stops what that record names, the way the runner would:
SIGTERM to the entrypoint, which forwards it and writes its crash report, then SIGKILL to the
whole process group after the grace period. A pid is only trusted together with its start time, so
a reused pid is never signalled. Starting processes does not belong here (`local`).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard_entrypoint.files import read_json_object

from trainguard.core.backends import processes
from trainguard.core.backends.processes import process_start_ticks


@dataclass(frozen=True)
class LeftoverStop:
    """What stopping an attempt's leftover process did; `stopped` is False when nothing ran."""

    stopped: bool
    message: str
    pid: int | None = None


def _record(path: Path) -> dict[str, Any] | None:
    data = read_json_object(path)
    return data if data is not None and isinstance(data.get("entrypoint_pid"), int) else None


def live_supervisor(process_record: Path) -> int | None:
    """The pid of the process that supervises the attempt, if it still runs on this host; else None."""
    return processes.live_supervisor(_record(process_record))


def stop_leftover(
    process_record: Path, grace_seconds: float, *, sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> LeftoverStop:
    """Stop the process `process_record` names if it still runs; never raises.

    Args:
        process_record: The attempt's `process.json` (written by the local runner at launch).
        grace_seconds: Time between SIGTERM to the entrypoint and SIGKILL to its process group.
        sleep, clock: Injected for tests.
    """
    record = _record(process_record)
    if record is None:
        return LeftoverStop(False, f"no process record at {process_record}: the command never started here")
    pid, ticks = int(record["entrypoint_pid"]), record.get("start_ticks")
    if record.get("host") not in (None, processes.host()):
        return LeftoverStop(False, f"the attempt ran on host {record.get('host')!r}, not here; stop it there", pid)
    if ticks is None or process_start_ticks(pid) != ticks:
        return LeftoverStop(False, f"the attempt's entrypoint (pid {pid}) is no longer running", pid)
    _signal(lambda: os.kill(pid, signal.SIGTERM))
    deadline = clock() + grace_seconds
    while clock() < deadline and process_start_ticks(pid) == ticks:
        sleep(0.05)
    escalated = process_start_ticks(pid) == ticks
    _signal(lambda: os.killpg(int(record.get("process_group") or pid), signal.SIGKILL))
    how = "SIGKILL after the grace period" if escalated else "SIGTERM"
    return LeftoverStop(True, f"stopped the attempt's command left running without its supervisor "
                              f"(entrypoint pid {pid}, {how})", pid)


def _signal(send: Callable[[], None]) -> None:
    try:
        send()
    except (ProcessLookupError, PermissionError):
        pass  # already gone, or not ours to stop
