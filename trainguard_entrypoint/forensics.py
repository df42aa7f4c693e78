"""What the entrypoint does beside a running command so a hang costs minutes and leaves its culprit named.

It watches for progress wherever the command writes it (`progress.ProgressWatch`: the console
log, torchrun's rank logs, the checkpoint folder) and says so when the console is quiet, so a
supervisor's stall window never ends a healthy job that logs to files. And it takes every rank's
stack (`stacks.capture`) once, while the ranks are alive: when the watch sees a hang coming (most
of the stall window silent, or a peer timeout in any log), when a stop arrives (SIGTERM from a
supervisor's stall or deadline, a pod deleted, `scancel`), or when asked by hand (a `dump-stacks`
file in the attempt's folder, or SIGQUIT to the entrypoint). Then it asks PyTorch's flight
recorder, where one runs (NCCL), to dump through its pipe files.

Settings come from the environment the backend gives the entrypoint: `TRAINGUARD_STALL_SECONDS`,
`TRAINGUARD_STACK_SWEEP_SECONDS` (the sweep's bound, 30 by default; 0 turns the capture off),
`TRAINGUARD_STACK_NATIVE` (1: ask py-spy for native frames too, which needs ptrace) and
`TRAINGUARD_PY_SPY` (where py-spy is, when it is neither beside the interpreter nor on PATH).

Stdlib only.
"""

from __future__ import annotations

import os
import signal
import stat
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainguard_entrypoint import stacks
from trainguard_entrypoint.paths import DUMP_REQUEST, FLIGHT_RECORDER, PROGRESS_RECORD
from trainguard_entrypoint.progress import ProgressWatch



def _seconds(env: Mapping[str, str], name: str, default: float | None) -> float | None:
    try:
        return float(env[name]) if env.get(name) else default
    except ValueError:
        return default


@dataclass
class Forensics:
    """The progress watch and the stack capture of one attempt (see the module docstring)."""

    workspace: Path
    log_file: Path
    folders: list[Path]
    say: Callable[[str], None]
    stall_seconds: float | None = None
    sweep_seconds: float = 30.0
    native: bool = False
    child_pid: Callable[[], int | None] = lambda: None
    taken: str = ""  # why the stacks were taken, once they were
    py_spy: str | None = None  # the py-spy binary (TRAINGUARD_PY_SPY); beside the interpreter or on PATH if None
    _taken_at: float = 0.0  # the watch's last progress when they were taken: a hang after new progress is new
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _watch: ProgressWatch | None = None

    @classmethod
    def for_attempt(cls, workspace: Path, log_file: Path, env: dict[str, str], say: Callable[[str], None]) -> Forensics:
        """Read the settings from the command's environment, and add the faulthandler site to it."""
        stall = _seconds(env, "TRAINGUARD_STALL_SECONDS", None)
        sweep = _seconds(env, "TRAINGUARD_STACK_SWEEP_SECONDS", 30.0) or 0.0
        folders = [Path(p) for p in (env.get("PET_LOG_DIR"), env.get("TRAINGUARD_CHECKPOINT_DIR")) if p]
        if sweep > 0:
            try:
                env.update(stacks.faulthandler_site(workspace, env))
            except OSError as exc:  # the attempt's folder cannot be written: py-spy alone will be asked
                say(f"warning: no faulthandler fallback for the ranks' stacks: {exc.strerror or exc}: {exc.filename}")
        return cls(workspace, log_file, folders, say, stall, sweep, env.get("TRAINGUARD_STACK_NATIVE") == "1",
                   py_spy=env.get("TRAINGUARD_PY_SPY") or None)

    def start(self, child_pid: Callable[[], int | None]) -> None:
        """Start watching the command `child_pid` names once it runs."""
        self.child_pid = child_pid
        heartbeat = min(30.0, max(2.0, (self.stall_seconds or 120.0) / 4))
        self._watch = ProgressWatch(self.log_file, self.folders, self.workspace / PROGRESS_RECORD,
                                    heartbeat_seconds=heartbeat, stall_seconds=self.stall_seconds,
                                    on_hang=self.take, say=_heartbeat)
        self._watch.poll_hook = self._asked_by_hand
        self._watch.start()
        # SIGQUIT asks for the stacks by hand (a JVM's thread dump, the same key): taken beside the run
        signal.signal(signal.SIGQUIT, lambda signum, frame: threading.Thread(
            target=self._by_hand, name="trainguard-stacks", daemon=True).start())

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()

    def before_stop(self, signum: int) -> None:
        """A stop arrived: take the stacks first, within the sweep's bound, then let it through."""
        self.take(f"{signal.Signals(signum).name} received")

    def take(self, why: str) -> None:
        """Take every rank's stack once (later calls return at once), and ask the flight recorder to dump."""
        pid = self.child_pid()
        if self.sweep_seconds <= 0 or pid is None:
            return
        with self._lock:
            moved = self._watch is not None and self._watch.last_progress > self._taken_at
            if self.taken and not moved:
                return  # the same hang: its stacks are on record
            self.taken, self._taken_at = why, self._watch.last_progress if self._watch is not None else 0.0
        self._flight_recorder()
        try:
            index = stacks.capture(pid, self.workspace, budget_seconds=self.sweep_seconds, native=self.native, why=why,
                                   py_spy=self.py_spy)
        except Exception as exc:  # the stacks are evidence; their absence must not change the run
            self.say(f"warning: could not take the ranks' stacks ({why}): {type(exc).__name__}: {exc}")
            return
        had = sum(1 for entry in index["ranks"].values() if entry.get("file"))
        self.say(f"took {had} of {len(index['ranks'])} ranks' stacks in {index['seconds']:.1f}s ({why})")

    def _asked_by_hand(self) -> None:
        request = self.workspace / DUMP_REQUEST
        if os.path.lexists(request):
            try:
                os.unlink(request)
            except OSError:
                pass
            self._by_hand()

    def _by_hand(self) -> None:
        with self._lock:
            self.taken = ""  # by hand, again as often as asked
        self.take("asked for by hand")

    def _flight_recorder(self) -> None:
        """Write to each rank's flight-recorder pipe (PyTorch makes them under NCCL): it dumps its trace."""
        folder = self.workspace / FLIGHT_RECORDER
        try:
            names = os.listdir(folder)
        except OSError:
            return
        for name in names:
            path = folder / name
            try:
                if not name.startswith("pipe_") or not stat.S_ISFIFO(os.lstat(path).st_mode):
                    continue
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                continue  # no reader (a rank already gone): nothing to ask
            try:
                os.write(fd, b"1\n")
            except OSError:
                pass
            finally:
                os.close(fd)


def _heartbeat(line: str) -> None:
    """The watch's heartbeat, as it is (it names the program itself), on the entrypoint's stderr."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass  # a closed stderr must not stop the watch


def flight_recorder_env(workspace: str) -> dict[str, str]:
    """The variables that make PyTorch keep its collectives' flight recorder and dump it on a timeout or
    through a pipe, under each name a PyTorch version reads (the older TORCH_NCCL_* and the newer TORCH_FR_*)."""
    prefix = f"{workspace.rstrip('/')}/{FLIGHT_RECORDER}/"
    return {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{prefix}rank_", "TORCH_FR_DUMP_TEMP_FILE": f"{prefix}rank_",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{prefix}pipe_",
    }
