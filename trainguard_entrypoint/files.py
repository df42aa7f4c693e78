"""Small file helpers the entrypoint shares: atomic JSON writes and reads, UTC timestamps, a log tail.

Nothing here knows about snapshots or reports; it only makes writing them safe.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def utc_now_iso() -> str:
    """The current time as ISO-8601 UTC with a ``Z``-free ``+00:00`` offset."""
    return datetime.now(UTC).isoformat()


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one, never a part.

    The temporary file lives in the same folder so ``os.replace`` is a rename on one filesystem.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except OSError:
            pass
        raise


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write ``payload`` as indented UTF-8 JSON to ``path`` atomically."""
    text = json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n"
    write_bytes_atomic(path, text.encode("utf-8"))


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when it is absent, unreadable or not an object."""
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def read_tail_lines(path: Path, max_lines: int, max_bytes: int = 256 * 1024) -> list[str]:
    """Return the last ``max_lines`` lines of ``path``, decoded with ``errors="replace"``.

    Only the last ``max_bytes`` are read, so a multi-gigabyte log costs one seek.
    """
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        start = max(0, size - max_bytes)
        handle.seek(start)
        data = handle.read()
    lines = data.split(b"\n")
    if start > 0 and len(lines) > 1:
        lines = lines[1:]  # the first piece is probably the end of a cut line
    if lines and lines[-1] == b"":
        lines = lines[:-1]
    return [line.rstrip(b"\r").decode("utf-8", errors="replace") for line in lines[-max_lines:]]
