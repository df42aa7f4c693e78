"""Telling whether a process that was recorded still runs: a pid is trusted only with its start time.

Backends record who supervises an attempt (the flow process that launched and follows it) and,
for the local backend, which entrypoint runs it. Whoever finds such a record later (the crash
hook, the retry controller, `trainguard runs`) asks here whether that very process still lives on
this host: a reused pid starts later, so a pid together with its start time names one process for
good. Stopping processes is each backend's own business.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def process_start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (field 22 of /proc/PID/stat); None if it ended."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    if not fields or fields[0] in ("Z", "X"):
        return None  # ended, only waiting to be reaped
    return int(fields[19])


def host() -> str:
    """This machine's name, as records name the host a process runs on."""
    return os.uname().nodename


def supervisor_record() -> dict[str, Any]:
    """This process as the supervisor of an attempt: its pid, start time and host, for a record."""
    return {"supervisor_pid": os.getpid(), "supervisor_start_ticks": process_start_ticks(os.getpid()),
            "host": host()}


def live_supervisor(record: Mapping[str, Any] | None) -> int | None:
    """The supervisor pid a record names if that process still runs on this host; else None.

    A record of another host, or without a start time, never makes a run look alive here.
    """
    if not record or record.get("host") not in (None, host()):
        return None
    pid, ticks = record.get("supervisor_pid"), record.get("supervisor_start_ticks")
    if not isinstance(pid, int) or not isinstance(ticks, int):
        return None
    return pid if process_start_ticks(pid) == ticks else None


def descendants(pid: int, limit: int = 4096) -> list[int]:
    """Every live process below `pid` (children first), however many sessions it started: torchrun puts
    each rank in a session of its own, which a kill of the process group does not reach."""
    found: list[int] = []
    queue = [pid]
    while queue and len(found) < limit:
        parent = queue.pop(0)
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                children = [int(c) for c in Path(f"/proc/{parent}/task/{task}/children").read_text().split()]
            except (OSError, ValueError):
                continue
            found += children
            queue += children
    return found[:limit]
