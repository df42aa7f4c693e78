"""The crash report: one small JSON file saying how the command ended and where to look next.

It is written atomically as soon as the command has ended (before the slow post-mortem GPU
snapshot), so a SIGKILL during post-mortem still leaves it behind. Running the command and taking
snapshots belong elsewhere.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard_entrypoint import REPORT_FORMAT
from trainguard_entrypoint.coredumps import signal_name
from trainguard_entrypoint.files import read_tail_lines, write_json_atomic
from trainguard_entrypoint.redact import Masker, redact_argv
from trainguard_entrypoint.tee import ChildResult

LOG_TAIL_LINES = 80


@dataclass(frozen=True)
class AttemptFacts:
    """What the entrypoint knows of the attempt besides how the command ended."""

    run_id: str
    attempt: int
    command: tuple[str, ...]
    started_at: str
    finished_at: str
    duration_seconds: float
    log_path: Path


def _log_tail(log_path: Path, problems: list[str], masker: Masker) -> list[str]:
    try:
        # for people and for copies outside the attempt's volume: no secrets, no terminal sequences
        return [masker.for_people(line) for line in read_tail_lines(log_path, LOG_TAIL_LINES)]
    except OSError as exc:
        problems.append(f"log tail: cannot read {log_path}: {exc.strerror or exc}")
        return []


def _hostname() -> str | None:
    try:
        return socket.gethostname()
    except OSError:
        return None


def build_crash_report(
    facts: AttemptFacts,
    result: ChildResult,
    *,
    core_files: Sequence[str],
    core_absent_reason: str | None,
    checkpoints: dict[str, Any] | None,
    received_signals: Sequence[int],
    problems: Sequence[str],
    descendants_ended: Sequence[Mapping[str, object]] = (),
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The crash report payload (see the module docstring for when it is written).

    Args:
        facts: Identity, command and timing of the attempt.
        result: How the command ended.
        core_files: Names of core files kept in ``coredumps/``.
        core_absent_reason: Why there is no core file, when there is none.
        checkpoints: The checkpoint listing, or None when no checkpoint folder was given.
        received_signals: Signals the entrypoint received (and forwarded) while running.
        problems: Snapshot steps that failed, one line each.
        descendants_ended: Processes that outlived the command and were ended (pid, command).
        environ: The command's environment: the values of its secret variables are masked.
    """
    masker = Masker.from_environ(environ or {})
    all_problems = [*problems, *result.output_problems]
    if result.supervisor_lost:
        all_problems.append(result.supervisor_lost)
    return {
        "format": REPORT_FORMAT,
        "run_id": facts.run_id,
        "attempt": facts.attempt,
        # secrets passed as arguments are redacted like the environment's
        "command": [masker.mask(arg) for arg in redact_argv(facts.command)],
        "started_at": facts.started_at,
        "finished_at": facts.finished_at,
        "duration_seconds": round(facts.duration_seconds, 3),
        "pid": result.pid,
        "entrypoint_pid": os.getpid(),
        "exit_code": result.exit_code,
        "signal": result.signal,
        "signal_name": signal_name(result.signal),
        "core_dumped": result.core_dumped,
        "start_error": result.start_error,
        "core_files": list(core_files),
        "core_absent_reason": None if core_files else core_absent_reason,
        "received_signals": [signal_name(s) for s in received_signals],
        "supervisor_lost": result.supervisor_lost is not None,
        "descendants_ended": [{**d, "command": masker.mask(str(d.get("command")))} for d in descendants_ended],
        "log_path": str(facts.log_path),
        "log_tail": _log_tail(facts.log_path, all_problems, masker),
        "checkpoints": checkpoints,
        "hostname": _hostname(),
        "problems": [masker.for_people(p) for p in all_problems],
    }


def write_crash_report(path: Path, report: dict[str, Any]) -> None:
    """Write the report atomically (temp file + ``os.replace``)."""
    write_json_atomic(path, report)
