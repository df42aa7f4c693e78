"""Running the command: start it, tee its output to the console and the log, forward signals, wait.

The command's stdout and stderr share one pipe so the log keeps their real order (a traceback
right after the progress line it interrupted). Output is handled as bytes: a training script may
print anything. Snapshots and the report are someone else's concern (``snapshot``, ``report``).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import BinaryIO

from trainguard_entrypoint.supervision import SupervisorWatch

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# Requests to stop; SIGUSR1/2 are only passed on (schedulers use them as "time is nearly up" notices).
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
LOG_WRITE_FAILED = "trainguard-entrypoint: warning: "
"""Prefix of the console line saying the log file stopped taking output (a launcher watches for it)."""
_DRAIN_IDLE_SECONDS = 1.0  # after the command exits, stop reading once its descendants go quiet
_DRAIN_MAX_SECONDS = 5.0


@dataclass(frozen=True)
class ChildResult:
    """How the command ended."""

    pid: int | None
    exit_code: int  # shell style: 128+N when killed by signal N, 127 not found, 126 not executable
    signal: int | None
    core_dumped: bool
    start_error: str | None
    output_problems: tuple[str, ...] = ()
    supervisor_lost: str | None = None  # why the command was stopped because its supervisor died


@dataclass
class SignalForwarder:
    """Forwards termination signals the entrypoint receives to the command, once each."""

    child_pid: int | None = None
    received: list[int] = field(default_factory=list)
    give_notice: Callable[[int, float], None] | None = None  # runs once, then: writes the notice file
    before_stop: Callable[[int], None] | None = None  # runs once, before the first stop is passed on
    _previous: dict[int, object] = field(default_factory=dict)

    def install(self) -> None:
        """Install the handlers; a signal received before the command starts is remembered."""
        for signum in FORWARDED_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        """Put back the handlers that were there before `install`."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if self.child_pid is None:
            return
        received_at = time.time()
        if signum in STOP_SIGNALS and self.before_stop is not None:
            hook, self.before_stop = self.before_stop, None
            try:
                hook(signum)  # bounded by its own budget; the stop is passed on whatever it does
            except Exception:
                pass
        if signum in STOP_SIGNALS and self.give_notice is not None:
            notice, self.give_notice = self.give_notice, None
            try:  # after the stacks: the grace the command gets runs from when it hears of the stop
                notice(signum, received_at)
            except Exception:
                pass
        if self._terminal_already_sent(signum):
            return
        try:
            os.kill(self.child_pid, signum)
        except ProcessLookupError:
            pass

    @staticmethod
    def _terminal_already_sent(signum: int) -> bool:
        # Ctrl-C in a terminal reaches the whole foreground process group, the command included;
        # forwarding it again would make a script's "press Ctrl-C twice to force quit" fire.
        if signum != signal.SIGINT:
            return False
        try:
            return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
        except (OSError, ValueError, AttributeError):
            return False


class _Sink:
    """The console and the log file; a failing one is dropped (and noted), the other goes on."""

    def __init__(self, log: BinaryIO | None, console_fd: int | None) -> None:
        self.log = log
        self.console_fd = console_fd
        self.problems: list[str] = []

    def write(self, data: bytes) -> None:
        if self.log is not None:
            try:
                self.log.write(data)
            except OSError as exc:
                problem = f"log file write failed, output after this point is not in the log: {exc}"
                self.problems.append(problem)
                self.log = None
                # said at once, on the console: the launcher keeps the tail of the output for triage
                data = f"{LOG_WRITE_FAILED}{problem}\n".encode() + data
        if self.console_fd is not None:
            try:
                _write_all(self.console_fd, data)
            except OSError as exc:
                self.problems.append(f"console write failed, output no longer shown: {exc}")
                self.console_fd = None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def run_command(
    command: Sequence[str], *, env: Mapping[str, str], log_path: Path, forwarder: SignalForwarder,
    console_fd: int | None = 1, cwd: Path | None = None, supervisor: SupervisorWatch | None = None,
    grace_seconds: float = 10.0, reap_orphans: bool = False,
) -> ChildResult:
    """Run ``command`` to completion, teeing its output; never raises for the command's failures.

    Args:
        command: The argv to run.
        env: The command's complete environment.
        log_path: The log file; output is appended as raw bytes.
        forwarder: Installed handlers that learn the child's pid here.
        console_fd: Where the console copy goes (the entrypoint's stdout), or None.
        cwd: The command's working directory; None for the entrypoint's own.
        supervisor: Watches whoever started us; if it dies, the command is stopped as at a
            deadline (SIGTERM, then SIGKILL after ``grace_seconds``).
        grace_seconds: Time between SIGTERM and SIGKILL when the supervisor is lost.
        reap_orphans: Reap any exited child while waiting (we are PID 1 or a subreaper).
    """
    log, problem = _open_log(log_path)
    read_fd, write_fd = os.pipe()
    try:
        if cwd is not None and not cwd.is_dir():
            raise NotADirectoryError(f"working directory does not exist: {cwd}")
        proc = subprocess.Popen(
            list(command), stdout=write_fd, stderr=write_fd, env=dict(env), close_fds=True, cwd=cwd
        )
    except OSError as exc:
        os.close(read_fd)
        failure = _start_failure(command, exc, env.get("PATH", os.defpath))
        # like a shell's "command not found", so the log alone tells what happened
        _Sink(log, console_fd).write(f"trainguard-entrypoint: {failure.start_error}\n".encode())
        if log is not None:
            log.close()
        return failure
    finally:
        os.close(write_fd)
    forwarder.child_pid = proc.pid
    sink = _Sink(log, console_fd)
    if problem:
        sink.problems.append(problem)
    stopper = _Stopper(proc.pid, supervisor, grace_seconds)
    try:
        status = _pump(read_fd, proc.pid, sink, stopper, reap_orphans or os.getpid() == 1)
    finally:
        forwarder.child_pid = None  # reaped: its pid may soon belong to someone else
        os.close(read_fd)
        if log is not None:
            log.close()
    proc.returncode = os.waitstatus_to_exitcode(status)  # we reaped it; keep Popen consistent
    result = _child_result(proc.pid, status, tuple(sink.problems))
    if stopper.reason is None:
        return result
    return ChildResult(result.pid, result.exit_code, result.signal, result.core_dumped, None,
                       result.output_problems, stopper.reason)


class _Stopper:
    """Stops the command when its supervisor is gone: SIGTERM, then SIGKILL after the grace period."""

    def __init__(self, pid: int, supervisor: SupervisorWatch | None, grace_seconds: float) -> None:
        self.pid, self.supervisor, self.grace = pid, supervisor, grace_seconds
        self.reason: str | None = None
        self._kill_at: float | None = None

    def check(self) -> None:
        if self.reason is None:
            if self.supervisor is None or not self.supervisor.lost():
                return
            self.reason = (f"the supervisor (pid {self.supervisor.parent_pid}) was lost; the command was stopped "
                           f"as at a deadline (SIGTERM, SIGKILL after {self.grace:g}s)")
            self._kill_at = time.monotonic() + self.grace
            self._send(signal.SIGTERM)
        elif self._kill_at is not None and time.monotonic() >= self._kill_at:
            self._kill_at = None
            self._send(signal.SIGKILL)

    def _send(self, signum: int) -> None:
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            pass


def _open_log(log_path: Path) -> tuple[BinaryIO | None, str | None]:
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        return log_path.open("ab", buffering=0), None
    except OSError as exc:
        return None, f"cannot open the log file {log_path} ({exc.strerror or exc}); output went to the console only"


def _start_failure(command: Sequence[str], exc: OSError, path: str) -> ChildResult:
    if isinstance(exc, NotADirectoryError):
        return ChildResult(None, 126, None, False, str(exc))
    if isinstance(exc, FileNotFoundError) and "/" in command[0]:
        return ChildResult(None, 127, None, False, f"command not found: {command[0]} (no such file)")
    if isinstance(exc, FileNotFoundError):
        # a bare name is looked up on the command's own PATH, which is not always the caller's:
        # the worker's environment, the image's, or the checkout's venv through ./dev
        hint = f"; {command[0]} comes with PyTorch: install torch there" if command[0] == "torchrun" else ""
        return ChildResult(None, 127, None, False, f"command not found: {command[0]} (searched PATH={path}){hint}")
    if isinstance(exc, PermissionError):
        return ChildResult(None, 126, None, False, f"command not executable (permission denied): {command[0]}")
    return ChildResult(None, 126, None, False, f"cannot start {command[0]}: {exc.strerror or exc}")


def _child_result(pid: int, status: int, problems: tuple[str, ...]) -> ChildResult:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        return ChildResult(pid, 128 + number, number, os.WCOREDUMP(status), None, problems)
    return ChildResult(pid, os.WEXITSTATUS(status), None, False, None, problems)


def _reap(pid: int, reap_orphans: bool) -> int | None:
    """The command's wait status once it has exited, else None.

    As PID 1 of a container, or as a subreaper, we are also the parent of every orphan
    (dataloader workers whose parent died), and nobody else will reap them: collect those
    zombies while we wait.
    """
    if not reap_orphans:
        done, raw = os.waitpid(pid, os.WNOHANG)
        return raw if done else None
    while True:
        try:
            done, raw = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return None
        if done == 0:
            return None
        if done == pid:
            return raw


def _pump(read_fd: int, pid: int, sink: _Sink, stopper: _Stopper, reap_orphans: bool) -> int:
    """Copy output to the sink until the command exits; return its raw wait status."""
    poller = select.poll()
    poller.register(read_fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    status: int | None = None
    exited_at: float | None = None
    last_data = time.monotonic()
    while True:
        if poller.poll(200):
            data = os.read(read_fd, 65536)
            if not data:
                break  # every writer closed the pipe
            sink.write(data)
            last_data = time.monotonic()
        if status is None and (raw := _reap(pid, reap_orphans)) is not None:
            status, exited_at = raw, time.monotonic()
        if status is None:
            stopper.check()
        if exited_at is not None:
            # A descendant that outlives the command may keep the pipe open forever.
            now = time.monotonic()
            if now - last_data >= _DRAIN_IDLE_SECONDS or now - exited_at >= _DRAIN_MAX_SECONDS:
                break
    if status is None:
        _, status = os.waitpid(pid, 0)  # output closed but the command still runs: wait for it
    return status
