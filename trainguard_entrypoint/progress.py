"""Watching a running command for progress wherever it writes it, and for the first sign of a hang.

A healthy job can be silent on the console: torchrun with `--redirects`, a script that logs to a
file. Its progress is then in its rank logs (torchrun's log dir) and its checkpoint folder. The
watch polls those (bounded: a few thousand files, once a second) beside the console log the tee
writes; when the console has been quiet for a heartbeat period but the files moved, it prints one
line (`HEARTBEAT` and what moved) on the entrypoint's stderr, which every supervisor reads as
output (the local runner's pipe, the pod's log) but keeps out of the training log and the live
log shown to people, and it stamps `progress.json` in the attempt's folder for a supervisor that
reads the folder (Slurm, on the shared filesystem).

It also says when the ranks' stacks should be taken while they are alive (`on_hang`, once per
hang: again only after something moved): when nothing at all has moved for most of the stall
window (the supervisor ends the attempt at the whole window), or at the first line in any log that
says a rank's peer timed out or vanished.

Stdlib only; the clock and the poll are injected for tests.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

HEARTBEAT = "trainguard-entrypoint: progress:"
MAX_FILES = 4096  # files of the watched folders looked at per poll; the newest count, the rest are skipped
_TAIL_BYTES = 64 * 1024  # new bytes of a log read per poll for the signs of a hang
# A rank waited for its peers past a timeout: gloo's and NCCL's own words, the hang's first sign.
# (A peer that vanished is not one: its own error says why, and its survivors end within seconds.)
PEER_TIMEOUT = re.compile(
    rb"Timed out waiting \d+ms for (?:recv|send)|Watchdog caught collective operation timeout|"
    rb"monitoredBarrier timed out|Socket Timeout"
)


@dataclass
class _Seen:
    size: int = 0
    mtime_ns: int = 0


@dataclass
class ProgressWatch:
    """Polls the console log, the rank logs and the checkpoint folder of one running command.

    Attributes:
        console_log: The log the tee writes the command's console output to.
        folders: Where else progress shows (torchrun's log dir, the checkpoint folder).
        record: The attempt's `progress.json`.
        heartbeat_seconds: Console silence after which moved files are announced.
        stall_seconds: The attempt's stall window, if it has one.
        on_hang: Called once, with why, when the stacks should be taken.
        say: Where the heartbeat line goes (the entrypoint's stderr).
    """

    console_log: Path
    folders: Sequence[Path]
    record: Path
    heartbeat_seconds: float = 30.0
    stall_seconds: float | None = None
    on_hang: Callable[[str], None] | None = None
    say: Callable[[str], None] = lambda line: None
    clock: Callable[[], float] = time.monotonic
    hang_fraction: float = 0.8  # of the stall window: the stacks come before the supervisor's stop
    poll_hook: Callable[[], None] | None = None  # called at every poll (a request made by hand)
    _seen: dict[Path, _Seen] = field(default_factory=dict)
    _last_console: float = 0.0
    _last_progress: float = 0.0
    _last_heartbeat: float = 0.0
    _hang_called: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def last_progress(self) -> float:
        """When (on the watch's clock) anything last moved."""
        return self._last_progress

    def start(self, interval: float = 1.0) -> None:
        """Poll in a daemon thread until `stop`."""
        now = self.clock()
        self._last_console = self._last_progress = self._last_heartbeat = now
        self._thread = threading.Thread(target=self._loop, args=(interval,), name="trainguard-progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.poll()
            except Exception:  # a watch must never take the run down with it
                continue

    def poll(self) -> None:
        """One look: what moved since the last, and what to say or do about it."""
        if self.poll_hook is not None:
            self.poll_hook()
        now = self.clock()
        console_moved, console_sign = self._moved([self.console_log])
        files_moved, files_sign = self._moved(self._files())
        sign = console_sign or files_sign
        if sign and self._hang_called:
            # a peer's timeout once the stacks were taken is that hang ending, not progress: another
            # sweep now would find the waiting ranks already unwinding, and replace their stacks
            return
        if console_moved:
            self._last_console = self._last_progress = now
        if files_moved:
            self._last_progress = now
        if console_moved or files_moved:
            self._hang_called = False  # it moved again: a later hang is another one, whose stacks are new
            self._stamp(files_moved[0])
            quiet = now - self._last_console >= self.heartbeat_seconds
            if quiet and now - self._last_heartbeat >= self.heartbeat_seconds:
                self._last_heartbeat = now
                self.say(f"{HEARTBEAT} {files_moved[0]} moved while the console was quiet")
        if sign:
            self._hang(f"a rank's log says its peer is gone or timed out: {sign}")
        elif self.stall_seconds and now - self._last_progress >= self.hang_fraction * self.stall_seconds:
            self._hang(f"nothing moved for {now - self._last_progress:.0f}s of a {self.stall_seconds:g}s stall window")

    def _hang(self, why: str) -> None:
        if self._hang_called or self.on_hang is None:
            return
        self._hang_called = True
        self.on_hang(why)

    def _files(self) -> list[Path]:
        found: list[Path] = []
        for folder in self.folders:
            for current, dirs, files in os.walk(folder):  # never into a linked folder
                dirs.sort()
                found += [Path(current) / name for name in sorted(files) if not name.startswith(".")]
                if len(found) >= MAX_FILES:
                    return found[:MAX_FILES]
        return found

    def _moved(self, paths: Sequence[Path]) -> tuple[list[str], str]:
        """(names of the paths that grew or changed, the first sign of a hang in what they added)."""
        moved, sign = [], ""
        for path in paths:
            try:
                stat = os.lstat(path)
            except OSError:
                continue
            seen = self._seen.setdefault(path, _Seen())
            if (stat.st_size, stat.st_mtime_ns) == (seen.size, seen.mtime_ns):
                continue
            if not sign and stat.st_size > seen.size and path.suffix in (".log", ""):
                sign = self._sign(path, seen.size, stat.st_size)
            seen.size, seen.mtime_ns = stat.st_size, stat.st_mtime_ns
            moved.append(path.name if path == self.console_log else str(path))
        return moved, sign

    @staticmethod
    def _sign(path: Path, start: int, end: int) -> str:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return ""
        try:
            os.lseek(fd, max(start, end - _TAIL_BYTES), os.SEEK_SET)
            data = os.read(fd, _TAIL_BYTES)
        except OSError:
            return ""
        finally:
            os.close(fd)
        match = PEER_TIMEOUT.search(data)
        return match.group(0).decode(errors="replace") if match else ""

    def _stamp(self, what: str) -> None:
        try:
            tmp = self.record.with_name(f".{self.record.name}.tmp")
            tmp.write_text(json.dumps({"at": time.time(), "what": what}), encoding="utf-8")
            os.replace(tmp, self.record)
        except OSError:
            pass  # the heartbeat line still says it
