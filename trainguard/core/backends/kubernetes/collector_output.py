"""Reading the collector pod's output back: its records and the tar it sent, checked whole.

The collector (``collector_program``) prints bounded records and the tar as base64 lines on its
log; this follows that log into a spool file in bounded memory, gathers the records into the
listing they describe (each kind bounded), and refuses output that is not whole: a log cut short
or rotated away must never pass for the attempt's folder. Lines that are not the collector's (its
stderr) are kept, the last few, to say what went wrong. Running the pod is ``collector``'s.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections import deque
from collections.abc import Iterator
from typing import Any, BinaryIO

from trainguard.core.backends.kubernetes.collector_program import MAGIC, RECORD_KINDS
from trainguard.core.backends.kubernetes.describe import safe

_MAX_LINE_BYTES = 64 * 1024
MAX_RECORDS = 100_000  # of each kind a collector prints; more are counted, not kept


def _lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The output's lines; one longer than `_MAX_LINE_BYTES` is not the collector's and is dropped whole."""
    pending, dropping = b"", False
    for chunk in chunks:
        *complete, rest = (pending + chunk).split(b"\n")
        for line in complete:
            if not dropping:
                yield line
            dropping = False
        pending = rest
        if len(pending) > _MAX_LINE_BYTES:
            pending, dropping = b"", True
    if pending and not dropping:
        yield pending


class _Listing:
    """The collector's records gathered into the META it describes, each list bounded."""

    def __init__(self, head: dict[str, Any]) -> None:
        self.meta: dict[str, Any] = {**head, "files": [], "skipped": [], "problems": [], "checkpoints": None}
        self.dropped = 0

    def add(self, kind: str, payload: dict[str, Any]) -> None:
        if kind == "CHECKPOINTS":
            self.meta["checkpoints"] = {**payload, "files": [], "skipped": []}
            return
        checkpoints = self.meta["checkpoints"] or {}
        target = {"FILE": self.meta["files"], "SKIPPED": self.meta["skipped"], "PROBLEM": self.meta["problems"],
                  "CHECKPOINT": checkpoints.get("files"), "CHECKPOINT-SKIPPED": checkpoints.get("skipped")}.get(kind)
        if target is None:
            return
        if len(target) >= MAX_RECORDS:
            self.dropped += 1
            self.meta["records_dropped"] = self.dropped
            return
        target.append(payload.get("name") if kind == "FILE" else payload)


def decode(chunks: Iterator[bytes], spool: BinaryIO) -> dict[str, Any]:
    """Write the tar from the collector's output into ``spool``; return its META plus what was seen.

    The listing arrives as one bounded record per file, skipped entry and checkpoint (a folder of
    many thousand files would not fit on one line: a log line over 64 KiB is dropped), at most
    `MAX_RECORDS` of each kind; past that they are counted in ``records_dropped``.

    Raises:
        ValueError: The output is not the collector's, or ended before its END marker, or the
            length or SHA-256 differs from what the pod printed (a rotated or cut log).
    """
    listing: _Listing | None = None
    digest, size = hashlib.sha256(), 0
    noise: deque[str] = deque(maxlen=5)
    for raw in _lines(chunks):
        line = raw.strip().decode("ascii", errors="replace")
        kind, payload = _record(line)
        if kind is None:
            data = _base64(line) if listing is not None else None
            if data is None:
                if line:
                    noise.append(line)  # stderr (a warning, a traceback): END's digest decides
                continue
            spool.write(data)
            digest.update(data)
            size += len(data)
        elif kind == "META":
            listing = _Listing(payload)
        elif listing is None:
            noise.append(line)
        elif kind == "END":
            if payload.get("size") != size or payload.get("sha256") != digest.hexdigest():
                raise ValueError(f"the tar read back has {size} bytes, the collector sent {payload.get('size')}: "
                                 f"its log was cut or rotated before it could be read{_seen(list(noise))}")
            return listing.meta
        else:
            listing.add(kind, payload)
    if listing is None:
        raise ValueError(f"the collector printed nothing trainguard can read (no META line){_seen(list(noise))}")
    raise ValueError(f"the collector's output ended after {size} bytes without its END marker{_seen(list(noise))}")


def _record(line: str) -> tuple[str | None, dict[str, Any]]:
    """(kind, payload) of one of the collector's records; (None, {}) for any other line."""
    if not line.startswith(MAGIC + " "):
        return None, {}
    kind, _, rest = line[len(MAGIC) + 1:].partition(" ")
    try:
        payload = json.loads(rest)
    except ValueError:
        return None, {}
    return (kind, payload) if kind in RECORD_KINDS and isinstance(payload, dict) else (None, {})


def _base64(line: str) -> bytes | None:
    try:
        return base64.b64decode(line, validate=True)
    except (binascii.Error, ValueError):
        return None


def _seen(noise: list[str]) -> str:
    """The collector's own words (its stderr), shortened, for an error message."""
    if not noise:
        return ""
    text = " / ".join(line[:200] for line in noise[-5:])
    return f"; it also printed: {safe(text)}"
