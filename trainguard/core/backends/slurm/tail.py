"""Following a log file that another machine writes (over a shared filesystem), line by line.

The Slurm backend cannot read the training command's pipe: the entrypoint tees the output into a
file on the shared folder, and this reads what was appended since the last look, hands out whole
lines, and notes when output last arrived (for the stall window). Bounded: at most a few MiB per
look, and a line that never ends is handed out in pieces.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

_MAX_LINE_BYTES = 64 * 1024
_MAX_READ_BYTES = 4 * 1024 * 1024


class LogTail:
    """Reads what was appended to `path` since the last `poll`, and passes each line to `on_line`."""

    def __init__(self, path: Path, on_line: Callable[[str], None] | None, clock: Callable[[], float]) -> None:
        self._path = path
        self._on_line = on_line
        self._clock = clock
        self._offset = 0
        self._pending = b""
        self.last_output = clock()
        self.problem: str | None = None

    def poll(self, *, final: bool = False) -> None:
        """Read the new bytes; with `final`, also hand out an unfinished last line."""
        try:
            with self._path.open("rb") as handle:
                handle.seek(self._offset)
                while data := handle.read(min(_MAX_READ_BYTES, 1024 * 1024)):
                    self._offset += len(data)
                    self.last_output = self._clock()
                    self._feed(data)
                    if not final:
                        break  # the rest on the next look: one look never takes long
        except FileNotFoundError:
            pass  # not started yet
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


def tail_bytes(path: Path, limit: int = 256 * 1024) -> bytes:
    """The last ``limit`` bytes of a file (b"" when it cannot be read)."""
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - limit))
            return handle.read()
    except OSError:
        return b""
