"""Following a log file that another machine writes (over a shared filesystem), line by line.

The Slurm backend cannot read the training command's pipe: the entrypoint tees the output into a
file on the shared folder, and this reads what was appended since the last look, hands out whole
lines, and notes when output last arrived (for the stall window). Bounded: at most a few MiB per
look, and a line that never ends is handed out in pieces. The job can replace the file: only a
regular file inside the attempt's folder is read (through `safefiles`), never a FIFO or a link.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from trainguard_entrypoint import safefiles

_MAX_LINE_BYTES = 64 * 1024
_MAX_READ_BYTES = 4 * 1024 * 1024


def last_bytes(path: Path, root: Path, limit: int = 256 * 1024) -> bytes:
    """The last ``limit`` bytes of a regular file of the job's (never a FIFO or a link); b"" otherwise."""
    try:
        with safefiles.open_regular(path, root) as handle:
            size = os.fstat(handle.fileno()).st_size
            return os.pread(handle.fileno(), min(size, limit), max(0, size - limit))
    except OSError:
        return b""


class LogTail:
    """Reads what was appended to `path` since the last `poll`, and passes each line to `on_line`."""

    def __init__(self, path: Path, on_line: Callable[[str], None] | None, clock: Callable[[], float],
                 root: Path | None = None) -> None:
        self._path, self._root = path, root
        self._on_line = on_line
        self._clock = clock
        self._offset = 0
        self._pending = b""
        self.last_output = clock()
        self.problem: str | None = None

    def poll(self, *, final: bool = False) -> None:
        """Read the new bytes; with `final`, also hand out an unfinished last line."""
        try:
            with safefiles.open_regular(self._path, self._root) as handle:
                handle.seek(self._offset)
                while data := handle.read(min(_MAX_READ_BYTES, 1024 * 1024)):
                    self._offset += len(data)
                    self.last_output = self._clock()
                    self._feed(data)
                    if not final:
                        break  # the rest on the next look: one look never takes long
        except safefiles.Refused as refused:
            if refused.kind != "missing":  # missing: not started yet
                self.problem = f"cannot follow the log: {refused.reason}"
        except OSError as exc:
            self.problem = f"cannot read {self._path}: {exc.strerror or exc}"
        if final and self._pending:
            self._emit(self._pending)
            self._pending = b""

    def _feed(self, data: bytes) -> None:
        pending = self._pending + data
        *lines, pending = pending.split(b"\n")
        if len(pending) > _MAX_LINE_BYTES:
            lines.append(pending)
            pending = b""
        self._pending = pending
        for line in lines:
            self._emit(line)

    def _emit(self, raw: bytes) -> None:
        if self._on_line is None:
            return
        try:
            self._on_line(raw.rstrip(b"\r").decode("utf-8", errors="replace"))
        except Exception as exc:  # a broken display must not stop the supervision
            self.problem = f"on_line failed, live output stopped: {type(exc).__name__}: {exc}"
            self._on_line = None
