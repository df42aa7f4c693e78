"""Small file helpers the entrypoint shares: atomic JSON writes and reads, UTC timestamps, a log tail.

Nothing here knows about snapshots or reports; it only makes writing them safe, and reading them:
the files read here lie in folders the training job can write, so they are opened through
`safefiles` (regular files only, no link followed, no FIFO waited on) and read within a bound.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainguard_entrypoint import safefiles

JSON_LIMIT_BYTES = 16 * 1024 * 1024  # far above any report trainguard writes


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


def read_json_object(path: Path, root: Path | None = None) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when it is absent, unreadable, not an object, nested too
    deeply to parse, over `JSON_LIMIT_BYTES`, or not a regular file (inside ``root``, if given)."""
    try:
        payload = json.loads(safefiles.read_bytes(path, root, limit_bytes=JSON_LIMIT_BYTES).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return payload if isinstance(payload, dict) else None


def read_tail_lines(path: Path, max_lines: int, max_bytes: int = 256 * 1024, root: Path | None = None) -> list[str]:
    """Return the last ``max_lines`` lines of ``path``, decoded with ``errors="replace"``.

    Only the last ``max_bytes`` are read, so a multi-gigabyte log costs one seek.

    Raises:
        OSError: It cannot be read, or is not a regular file (`safefiles.Refused`).
    """
    with safefiles.open_regular(path, root) as handle:
        size = os.fstat(handle.fileno()).st_size
        start = max(0, size - max_bytes)
        data = os.pread(handle.fileno(), size - start, start)
    lines = data.split(b"\n")
    if start > 0 and len(lines) > 1:
        lines = lines[1:]  # the first piece is probably the end of a cut line
    if lines and lines[-1] == b"":
        lines = lines[:-1]
    return [line.rstrip(b"\r").decode("utf-8", errors="replace") for line in lines[-max_lines:]]
