"""The local-process adapter: run one attempt as a child ``python -m trainguard_entrypoint`` process.

It owns what only the launcher can know: live progress lines, the wall-clock deadline, the stall
window, stopping a hung or cancelled attempt (SIGTERM to the entrypoint, which forwards it to the
command as a kubelet does to PID 1; then SIGKILL to the whole process group after a grace period),
and ``runner.json``, its own account, which survives even when the entrypoint was killed before
writing its crash report. Snapshots and the crash report are the entrypoint's; evidence
collection is ``evidence``'s.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import trainguard_entrypoint
from trainguard_entrypoint import ORIGINAL_PYTHONPATH
from trainguard_entrypoint.coredumps import signal_name
from trainguard_entrypoint.files import read_json_object, write_json_atomic
from trainguard_entrypoint.notice import give_notice
from trainguard_entrypoint.paths import NOTICE_FILE
from trainguard_entrypoint.progress import HEARTBEAT
from trainguard_entrypoint.redact import redact_argv

from trainguard.core import masking
from trainguard.core.backends import processes, stopreason
from trainguard.core.backends.workspace import CRASH_REPORT, PROCESS_RECORD, RUNNER_REPORT, AttemptWorkspace

COMPLETED = "Completed"
ERROR = "Error"
DEADLINE_EXCEEDED = "DeadlineExceeded"
STALLED = "Stalled"
CANCELLED = "Cancelled"
START_ERROR = "StartError"

_STOPPED_BY = {"cancelled": "a person cancelled the run", "interrupted": "Ctrl-C to the supervising process"}
_MAX_LINE_BYTES = 64 * 1024  # a progress bar that never prints "\n" is still shown, in pieces
TAIL_LINES = 200  # the output tail kept in memory, for triage when the log file is incomplete
_TAIL_LINE_CHARS = 4096
_WARNING = "trainguard-entrypoint: warning: "
_LOG_FAILED = _WARNING + "log file write failed"
_OS_ERROR = re.compile(r"\[Errno \d+\]")  # a warning about a file the entrypoint could not write
_OWN = b"trainguard-entrypoint: "  # the entrypoint's own lines (the command's output has no such prefix)
_HEARTBEAT = HEARTBEAT.encode()


@dataclass(frozen=True)
class ProcessOutcome:
    """How a local attempt ended, from the launcher's side."""

    exit_code: int | None  # shell style (128+N for signal N); None only if it never started
    signal: int | None
    reason: str  # Completed, Error, DeadlineExceeded, Stalled, Cancelled, StartError
    started_at: datetime
    finished_at: datetime
    duration_seconds: float
    log_path: Path
    message: str
    output_tail: tuple[str, ...] = ()  # the last lines seen on the pipe, masked
    log_incomplete: bool = False  # the entrypoint could not write the whole log (a full disk)
    storage_problems: tuple[str, ...] = ()  # files of the attempt that could not be written, and why


def _print_line(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class _OutputWatcher(threading.Thread):
    """Reads the entrypoint's output, hands out lines, and notes when output last arrived."""

    def __init__(
        self, stream: IO[bytes], on_line: Callable[[str], None] | None, clock: Callable[[], float],
        masker: masking.Masker,
    ) -> None:
        super().__init__(name="trainguard-output", daemon=True)
        self._fd = stream.fileno()
        self._on_line = on_line
        self._masker = masker
        self._clock = clock
        self.last_output = clock()
        self.problem: str | None = None
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.log_failure: str | None = None
        self.storage_problems: list[str] = []

    def run(self) -> None:
        pending = b""
        while data := os.read(self._fd, 65536):
            pending += data
            *lines, pending = pending.split(b"\n")
            if len(pending) > _MAX_LINE_BYTES:
                lines.append(pending)
                pending = b""
            if any(map(_moves, lines)) or (pending and _moves(pending)):
                self.last_output = self._clock()
            for line in lines:
                if not line.startswith(_HEARTBEAT):  # progress in files, said for the stall window only
                    self._emit(line)
        if pending:
            self._emit(pending)

    def _emit(self, raw: bytes) -> None:
        line = self._masker.mask(raw.rstrip(b"\r").decode("utf-8", errors="replace"))
        self.tail.append(line[:_TAIL_LINE_CHARS])
        if line.startswith(_LOG_FAILED) and self.log_failure is None:
            self.log_failure = line.removeprefix(_WARNING)
        if line.startswith(_WARNING) and _OS_ERROR.search(line) and len(self.storage_problems) < 20:
            self.storage_problems.append(masking.strip_control(line.removeprefix(_WARNING))[:_TAIL_LINE_CHARS])
        if self._on_line is None:
            return
        try:
            # shown live: secrets masked; colours kept (the tails made for reading later strip them)
            self._on_line(line)
        except Exception as exc:  # a broken display must not stall the pipe and fake a Stalled attempt
            self.problem = f"on_line failed, live output stopped: {type(exc).__name__}: {exc}"
            self._on_line = None


def _moves(raw: bytes) -> bool:
    """Whether a line of the entrypoint's output is progress: the command's output, or the entrypoint's
    heartbeat (its rank logs or checkpoints moved while the console was quiet); not the entrypoint's
    own notes (the stacks it took, a warning), which a hung command's entrypoint writes too."""
    return raw.startswith(_HEARTBEAT) or not _OWN.startswith(raw[:len(_OWN)]) or not raw


def _check_limit(name: str, value: float | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
        raise ValueError(f"{name} must be a positive number of seconds or None, got {value!r}")


class LocalProcessRunner:
    """Runs attempts as local child processes through the container entrypoint."""

    def __init__(
        self,
        *,
        python: str = sys.executable,
        grace_seconds: float = 10.0,
        poll_interval_seconds: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        on_line: Callable[[str], None] | None = None,
        sweep_seconds: float = 0.0,
    ) -> None:
        self._python = python
        self._grace = grace_seconds
        self._sweep = sweep_seconds  # the entrypoint takes the ranks' stacks before it passes a stop on
        self._poll = poll_interval_seconds
        self._clock = clock
        self._on_line = on_line if on_line is not None else _print_line

    def run(
        self,
        command: Sequence[str],
        *,
        workspace: AttemptWorkspace,
        env: Mapping[str, str] | None = None,
        deadline_seconds: float | None = None,
        stall_seconds: float | None = None,
    ) -> ProcessOutcome:
        """Run ``command`` for ``workspace``'s attempt and say how it ended.

        Args:
            command: The training command's argv.
            workspace: The attempt's folders (from `AttemptWorkspace.create`).
            env: Variables added to this process's environment for the command.
            deadline_seconds: Wall time after which the attempt is stopped (DeadlineExceeded).
            stall_seconds: Silence after which the attempt is stopped (Stalled).

        Raises:
            ValueError: ``command``, ``env`` or a limit is malformed (one line naming it).
            BaseException: Whatever interrupted the wait (KeyboardInterrupt, a flow's termination
                signal), re-raised after the process group was stopped and ``runner.json`` written.
        """
        argv = self._argv(command, workspace)
        full_env = self._environment(env)
        masking.register_environment(env or {})  # evidence and reports of this attempt mask them too
        _check_limit("deadline_seconds", deadline_seconds)
        _check_limit("stall_seconds", stall_seconds)
        started_at, start = datetime.now(UTC), self._clock()
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
        except OSError as exc:
            code = 127 if isinstance(exc, FileNotFoundError) else 126 if isinstance(exc, PermissionError) else None
            message = f"cannot start the entrypoint with python {self._python!r}: {exc.strerror or exc}"
            return self._finish(workspace, command, None, code, None, START_ERROR, message, started_at, start)
        assert proc.stdout is not None
        _write_process_record(workspace, proc.pid, started_at)
        watcher = _OutputWatcher(proc.stdout, self._on_line, self._clock, masking.current())
        watcher.start()
        try:
            ended = self._wait(proc, watcher, workspace, start, deadline_seconds, stall_seconds)
        except BaseException as exc:
            if why := stopreason.reason(exc):  # a person's cancel or Ctrl-C, said to the training as such
                self._give_notice(workspace, why, _STOPPED_BY.get(why, why))
            self._stop(proc)
            self._close(proc, watcher)
            exit_code, sig = self._exit_status(proc, workspace)
            message = f"the runner was interrupted ({type(exc).__name__}); the attempt was stopped"
            self._finish(workspace, command, proc.pid, exit_code, sig, CANCELLED, message, started_at, start)
            raise
        self._close(proc, watcher)
        exit_code, sig = self._exit_status(proc, workspace)
        reason, message = ended if ended is not None else self._judge(exit_code, sig, workspace, proc.pid)
        for problem in (watcher.log_failure, watcher.problem):
            if problem:  # a storage failure belongs in the outcome a person reads, not only in a log line
                message = f"{message}; {problem}"
        outcome = self._finish(workspace, command, proc.pid, exit_code, sig, reason, message, started_at, start,
                               watcher.storage_problems)
        return replace(outcome, output_tail=tuple(watcher.tail), log_incomplete=watcher.log_failure is not None)

    def _argv(self, command: Sequence[str], workspace: AttemptWorkspace) -> list[str]:
        if isinstance(command, str) or not command or not all(isinstance(a, str) and a for a in command):
            raise ValueError(
                f"command must be a non-empty list of non-empty strings, e.g. ['python', 'train.py'], got {command!r}"
            )
        return [
            self._python, "-m", "trainguard_entrypoint", "--workspace", str(workspace.root),
            "--run-id", workspace.run_id, "--attempt", str(workspace.attempt),
            "--checkpoint-dir", str(workspace.checkpoint_dir), "--log-file", str(workspace.log_path),
            "--grace-seconds", f"{self._grace:g}", "--", *command,
        ]

    @staticmethod
    def _environment(env: Mapping[str, str] | None) -> dict[str, str]:
        full = dict(os.environ)
        for name, value in (env or {}).items():
            if not isinstance(name, str) or not name or "=" in name or not isinstance(value, str):
                raise ValueError(f"env[{name!r}] must map a variable name to a string value, got {value!r}")
            full[name] = value
        # The entrypoint must import from this source tree even when trainguard is not installed;
        # it restores the command's own PYTHONPATH from ORIGINAL_PYTHONPATH.
        source_root = str(Path(trainguard_entrypoint.__file__).resolve().parent.parent)
        original = full.get("PYTHONPATH", "")
        full[ORIGINAL_PYTHONPATH] = original
        full["PYTHONPATH"] = os.pathsep.join(p for p in (source_root, original) if p)
        return full

    def _wait(
        self, proc: subprocess.Popen[bytes], watcher: _OutputWatcher, workspace: AttemptWorkspace, start: float,
        deadline_seconds: float | None, stall_seconds: float | None,
    ) -> tuple[str, str] | None:
        """Wait for the entrypoint; stop it and return (reason, message) if a limit is hit first."""
        while True:
            try:
                proc.wait(timeout=self._poll)
                return None
            except subprocess.TimeoutExpired:
                pass
            now = self._clock()
            past_deadline = deadline_seconds is not None and now - start >= deadline_seconds
            stalled = stall_seconds is not None and now - watcher.last_output >= stall_seconds
            if not (past_deadline or stalled):
                continue
            if _crash_report(workspace, proc.pid) is not None:
                # The command has ended and only the post-mortem (a slow nvidia-smi) runs: the
                # attempt's outcome is the command's, not a stall or a missed deadline.
                if past_deadline:
                    self._stop(proc)
                    return None
                continue
            if past_deadline:  # the attempt's own limit gives warning: the training may save before the SIGKILL
                self._give_notice(workspace, "deadline", f"the attempt's {deadline_seconds:g}s deadline")
            self._stop(proc)
            if past_deadline:
                return DEADLINE_EXCEEDED, f"still running after the {deadline_seconds:g}s deadline; stopped"
            return STALLED, f"no new log output for {stall_seconds:g}s (stall window); stopped"

    def _give_notice(self, workspace: AttemptWorkspace, reason: str, source: str) -> None:
        """Write the attempt's notice before stopping it: the SIGKILL comes after the sweep and the grace.

        The entrypoint then passes the SIGTERM on with this notice, not one of its own.
        """
        grace = self._sweep + self._grace
        try:
            give_notice(workspace.root / NOTICE_FILE, reason, grace, f"{source}, grace {grace:g}s")
        except OSError as exc:  # the stop still comes; the entrypoint gives its own notice then
            self._on_line(f"trainguard: could not write the notice ({reason}) in {workspace.root}: {exc}")

    def _stop(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM to the entrypoint (it takes the ranks' stacks, then forwards), then SIGKILL to the whole
        group and every process below the entrypoint after the sweep and the grace period."""
        try:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=self._sweep + self._grace)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            below = processes.descendants(proc.pid) if proc.poll() is None else []
            _kill_group(proc.pid)
            for pid in below:  # a rank in a session of its own (torchrun's) that ignored the stop
                _kill(pid)
            proc.wait()

    def _close(self, proc: subprocess.Popen[bytes], watcher: _OutputWatcher) -> None:
        # Descendants left behind by the command would hold the pipe open and outlive the attempt.
        _kill_group(proc.pid)
        watcher.join(timeout=max(self._grace, 1.0))
        # A process outside the group (one that called setsid) may still hold the pipe; closing the
        # fd under the blocked reader could hand its number to an unrelated file, so leave it.
        if proc.stdout is not None and not watcher.is_alive():
            proc.stdout.close()

    @staticmethod
    def _exit_status(proc: subprocess.Popen[bytes], workspace: AttemptWorkspace) -> tuple[int | None, int | None]:
        report = _crash_report(workspace, proc.pid)
        if report is not None and isinstance(report.get("exit_code"), int):
            # the command's status, even if the entrypoint was killed later, during its post-mortem
            sig = report.get("signal")
            return report["exit_code"], sig if isinstance(sig, int) else None
        code = proc.returncode
        if code is not None and code < 0:  # the entrypoint itself was killed before reporting
            return 128 - code, -code
        return code, None

    @staticmethod
    def _judge(exit_code: int | None, sig: int | None, workspace: AttemptWorkspace, pid: int) -> tuple[str, str]:
        report = _crash_report(workspace, pid) or {}
        start_error = report.get("start_error")
        if isinstance(start_error, str):
            # 126/127 as a shell reports them; a SIGTERM before the start (143) is a stop, not a start error
            return (START_ERROR if exit_code in (126, 127) else ERROR), start_error
        if exit_code == 0:
            return COMPLETED, "exited with code 0"
        if sig is not None:
            return ERROR, f"killed by {signal_name(sig)} (exit code {exit_code})"
        return ERROR, f"exited with code {exit_code}"

    def _finish(
        self, workspace: AttemptWorkspace, command: Sequence[str], pid: int | None, exit_code: int | None,
        sig: int | None, reason: str, message: str, started_at: datetime, start: float,
        storage_problems: Sequence[str] = (),
    ) -> ProcessOutcome:
        outcome = ProcessOutcome(exit_code, sig, reason, started_at, datetime.now(UTC),
                                 max(0.0, self._clock() - start), workspace.log_path, message)
        problems = [*storage_problems]
        if (lost := _write_runner_report(workspace, outcome, command, pid)) is not None:
            problems.append(lost)
        return replace(outcome, storage_problems=tuple(problems))


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nobody left in the group


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # gone already


def _write_process_record(workspace: AttemptWorkspace, pid: int, started_at: datetime) -> None:
    payload = {"format": 1, "entrypoint_pid": pid, "process_group": pid,
               "start_ticks": processes.process_start_ticks(pid), **processes.supervisor_record(),
               "started_at": started_at.isoformat()}
    try:
        write_json_atomic(workspace.root / PROCESS_RECORD, payload)
    except OSError:
        pass  # without it a dead supervisor's command is only stopped by the entrypoint's own watch


def _crash_report(workspace: AttemptWorkspace, entrypoint_pid: int) -> dict[str, Any] | None:
    """The entrypoint's crash report, if this very entrypoint process wrote it."""
    payload = read_json_object(workspace.root / CRASH_REPORT)
    if payload is None or payload.get("entrypoint_pid") != entrypoint_pid:
        return None  # absent, or left over from an earlier launch into the same folder
    return payload


def _write_runner_report(
    workspace: AttemptWorkspace, outcome: ProcessOutcome, command: Sequence[str], pid: int | None
) -> str | None:
    payload = {
        "format": 1,
        "run_id": workspace.run_id,
        "attempt": workspace.attempt,
        "reason": outcome.reason,
        "exit_code": outcome.exit_code,
        "signal": outcome.signal,
        "signal_name": signal_name(outcome.signal),
        "started_at": outcome.started_at.isoformat(),
        "finished_at": outcome.finished_at.isoformat(),
        "duration_seconds": round(outcome.duration_seconds, 3),
        "entrypoint_pid": pid,
        "command": [masking.current().mask(arg) for arg in redact_argv(command)],
        "message": masking.for_people(outcome.message),
        "log_path": str(outcome.log_path),
    }
    try:
        write_json_atomic(workspace.root / RUNNER_REPORT, payload)
    except OSError as exc:  # the outcome is still returned; the manifest lists runner.json as missing
        return f"runner.json could not be written: {exc}"
    return None
