"""Who watches the entrypoint, and what it leaves behind: the supervisor and the command's descendants.

Two Linux process facilities keep an attempt from leaking processes:

- A *child subreaper* (``PR_SET_CHILD_SUBREAPER``) adopts every orphaned descendant of the
  command, even one that called ``setsid``, so at the end of the attempt the entrypoint can find
  and end them all (``end_descendants``) instead of leaving them running under PID 1.
- The *supervisor* is the process that started the entrypoint (the local runner, or nobody when
  the entrypoint is PID 1 of a container). If it dies, nobody is left to enforce the deadline or
  collect evidence, so ``SupervisorWatch`` notices and the command is stopped like at a deadline.

Running the command and teeing its output belong to ``tee``; this module only answers "who is
still there" and ends processes.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def become_subreaper() -> str | None:
    """Make this process the reaper of its orphaned descendants; return why not, or None on success."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError) as exc:
        return f"prctl is not available here ({exc}); descendants that outlive the command may escape"
    if prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        return f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(err)}; descendants may escape"
    return None


@dataclass
class SupervisorWatch:
    """Notices that the process which started the entrypoint has gone.

    The parent pid is read at start; when it changes, the parent died and we were re-parented
    (to init or a subreaper). When the entrypoint started without a supervisor (PID 1 of a
    container, parent pid 0 or 1), there is nobody to lose.
    """

    parent_pid: int
    getppid: Callable[[], int] = os.getppid

    @classmethod
    def start(cls) -> SupervisorWatch:
        return cls(os.getppid())

    @property
    def supervised(self) -> bool:
        return self.parent_pid > 1

    def lost(self) -> bool:
        """Whether the supervisor has died since `start`."""
        return self.supervised and self.getppid() != self.parent_pid


@dataclass(frozen=True)
class Descendant:
    """A process below the entrypoint: its pid and what it runs."""

    pid: int
    command: str


def _stat(pid: str) -> tuple[int, str] | None:
    """(parent pid, state) of a /proc entry, or None if it is gone or unreadable."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
    fields = raw[raw.rfind(b")") + 2 :].split()
    if len(fields) < 2:
        return None
    return int(fields[1]), fields[0].decode("ascii", "replace")


def _command_line(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")[:200] or "?"


def live_descendants(root_pid: int | None = None) -> list[Descendant]:
    """Every living (not zombie) process whose parent chain leads to ``root_pid`` (default: us)."""
    root = os.getpid() if root_pid is None else root_pid
    children: dict[int, list[int]] = {}
    states: dict[int, str] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if entry.isdigit() and (found := _stat(entry)) is not None:
            children.setdefault(found[0], []).append(int(entry))
            states[int(entry)] = found[1]
    result: list[Descendant] = []
    pending = list(children.get(root, []))
    while pending:
        pid = pending.pop()
        pending.extend(children.get(pid, []))
        if states.get(pid) not in ("Z", "X"):
            result.append(Descendant(pid, _command_line(pid)))
    return sorted(result, key=lambda d: d.pid)


def reap_any() -> None:
    """Collect every exited child (adopted orphans included) without blocking."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def end_descendants(grace_seconds: float, poll_seconds: float = 0.05) -> list[Descendant]:
    """SIGTERM every remaining descendant, SIGKILL those still there after the grace; return who was ended.

    As a subreaper we are the parent of the orphans, so we reap them too; a process that is not
    our child (its own parent is still alive below us) is reaped by that parent.
    """
    found = live_descendants()
    if not found:
        return []
    _signal_all(found, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline:
        reap_any()
        if not live_descendants():
            return found
        time.sleep(poll_seconds)
    _signal_all(live_descendants(), signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while live_descendants() and time.monotonic() < deadline:
        reap_any()
        time.sleep(poll_seconds)
    reap_any()
    return found


def _signal_all(processes: list[Descendant], signum: int) -> None:
    for process in processes:
        try:
            os.kill(process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass
