"""Training processes whose supervisor died: find them by their process record and stop them.

When the flow process that supervises a local attempt is killed (SIGKILL, the OOM killer), its
training command keeps running unsupervised next to the next attempt, on the same checkpoint
folder. The runner writes `process.json` when it starts the entrypoint; whoever finds the attempt
dead (the crash hook, the retry controller) stops what that record names, the way the runner would:
SIGTERM to the entrypoint, which forwards it and writes its crash report, then SIGKILL to the
whole process group after the grace period. A pid is only trusted together with its start time, so
a reused pid is never signalled. The record lies in the attempt's folder, which the training job
can write, so it is not trusted either: the process it names must still be this attempt's
entrypoint (its command line says so) and lead its own process group, the one recorded, as the
runner starts it; otherwise nothing is signalled and the stop says why. Starting processes does
not belong here (`local`).
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
from trainguard.core.backends.forensics import NotRunning
from trainguard.core.backends.processes import process_start_ticks


@dataclass(frozen=True)
class LeftoverStop:
    """What stopping an attempt's leftover process did; `stopped` is False when nothing ran."""

    stopped: bool
    message: str
    pid: int | None = None


def read_record(path: Path) -> dict[str, Any] | None:
    """The attempt's `process.json` as the runner wrote it; None when absent or not one."""
    data = read_json_object(path)
    return data if data is not None and isinstance(data.get("entrypoint_pid"), int) else None


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
    record = read_record(process_record)
    if record is None:
        return LeftoverStop(False, f"no process record at {process_record}: the command never started here")
    pid, ticks = int(record["entrypoint_pid"]), record.get("start_ticks")
    if record.get("host") not in (None, processes.host()):
        return LeftoverStop(False, f"the attempt ran on host {record.get('host')!r}, not here; stop it there", pid)
    if ticks is None or process_start_ticks(pid) != ticks:
        return LeftoverStop(False, f"the attempt's entrypoint (pid {pid}) is no longer running", pid)
    if (refused := _not_the_entrypoint(pid, record.get("process_group"), process_record.parent)) is not None:
        return LeftoverStop(False, f"not stopped: {refused}; the attempt's process.json may have been rewritten "
                                   f"by its job, so pid {pid} is left alone", pid)
    _signal(lambda: os.kill(pid, signal.SIGTERM))
    deadline = clock() + grace_seconds
    while clock() < deadline and process_start_ticks(pid) == ticks:
        sleep(0.05)
    escalated = process_start_ticks(pid) == ticks
    _signal(lambda: os.killpg(pid, signal.SIGKILL))  # its own group, checked above to be the one recorded
    how = "SIGKILL after the grace period" if escalated else "SIGTERM"
    return LeftoverStop(True, f"stopped the attempt's command left running without its supervisor "
                              f"(entrypoint pid {pid}, {how})", pid)


def ask_for_stacks(process_record: Path) -> str:
    """Send SIGQUIT to the attempt's entrypoint, which takes every rank's stack at once (beside the run).

    The record is the job's to rewrite, so the process it names must be this attempt's entrypoint,
    leading its recorded group and started when recorded, as for a stop.

    Raises:
        NotRunning: Nothing of the attempt runs here, or the process is not its entrypoint.
    """
    record = read_record(process_record)
    if record is None:
        raise NotRunning(f"no process record at {process_record}: the attempt never started here")
    pid, ticks = int(record["entrypoint_pid"]), record.get("start_ticks")
    if record.get("host") not in (None, processes.host()):
        raise NotRunning(f"the attempt runs on host {record.get('host')!r}, not here; ask there")
    if ticks is None or process_start_ticks(pid) != ticks:
        raise NotRunning(f"the attempt is not running: its entrypoint (pid {pid}) has ended")
    if (refused := _not_the_entrypoint(pid, record.get("process_group"), process_record.parent)) is not None:
        raise NotRunning(f"not asked: {refused}; the attempt's process.json may have been rewritten by its job")
    try:
        os.kill(pid, signal.SIGQUIT)
    except OSError as exc:
        raise NotRunning(f"could not signal the entrypoint (pid {pid}): {exc.strerror or exc}") from exc
    return f"asked the attempt's entrypoint (pid {pid}) for every rank's stack (SIGQUIT)"


def _not_the_entrypoint(pid: int, group: object, attempt_folder: Path) -> str | None:
    """Why ``pid`` is not this attempt's entrypoint leading the recorded process group; None when it is."""
    try:
        live_group = os.getpgid(pid)
    except OSError:
        return f"process {pid} has no process group to read"
    if group != pid or live_group != pid:
        return (f"process {pid} does not lead the process group recorded ({group!r}; it is in group {live_group}), "
                "as the runner starts the entrypoint")
    argv = _command_line(pid)
    expected = os.path.realpath(attempt_folder)
    named = any(a == "--workspace" and os.path.realpath(b) == expected for a, b in zip(argv, argv[1:]))
    if not named or not any("trainguard_entrypoint" in a or "trainguard-entrypoint" in a for a in argv):
        return f"process {pid} is not the entrypoint of the attempt in {attempt_folder}"
    return None


def _command_line(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [os.fsdecode(part) for part in raw.split(b"\0") if part]


def _signal(send: Callable[[], None]) -> None:
    try:
        send()
    except (ProcessLookupError, PermissionError):
        pass  # already gone, or not ours to stop
