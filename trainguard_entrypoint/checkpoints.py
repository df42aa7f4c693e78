"""Listing a checkpoint folder: what a retry could resume from, with sizes and digests.

The entrypoint lists it after the command ends and the core's evidence collection lists it again
for ``checkpoints.json``; choosing *which* checkpoint to resume from does not belong here.
"""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

DEFAULT_HASH_LIMIT_BYTES = 64 * 1024 * 1024
MAX_ENTRIES = 10_000


def sha256_file(path: Path, chunk_bytes: int = 1024 * 1024) -> str:
    """The hex SHA-256 of a file, read in chunks so large files don't fill memory."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def _entry(path: Path, name: str, hash_limit_bytes: int) -> dict[str, Any]:
    stat = path.stat()
    entry: dict[str, Any] = {
        "name": name,
        "size_bytes": stat.st_size,
        "mtime": datetime.fromtimestamp(stat.st_mtime, UTC).isoformat(),
        "sha256": None,
    }
    if stat.st_size <= hash_limit_bytes:
        entry["sha256"] = sha256_file(path)
    else:
        entry["sha256_skipped"] = f"larger than {hash_limit_bytes} bytes"
    return entry


def list_checkpoints(checkpoint_dir: Path, *, hash_limit_bytes: int = DEFAULT_HASH_LIMIT_BYTES) -> dict[str, Any]:
    """Every file under ``checkpoint_dir`` (names relative to it, "/"-separated), sorted by name.

    Returns ``{"dir", "files": [{name, size_bytes, mtime, sha256}], "absent": reason or None}``;
    a file that vanishes or cannot be read mid-listing gets an ``error`` instead of failing the rest.
    """
    listing: dict[str, Any] = {"dir": str(checkpoint_dir), "files": [], "absent": None}
    if not checkpoint_dir.is_dir():
        listing["absent"] = f"no such directory: {checkpoint_dir}"
        return listing
    files: list[dict[str, Any]] = []
    for folder, dirnames, filenames in os.walk(checkpoint_dir):
        dirnames.sort()
        for filename in sorted(filenames):
            path = Path(folder) / filename
            name = path.relative_to(checkpoint_dir).as_posix()
            try:
                files.append(_entry(path, name, hash_limit_bytes))
            except OSError as exc:
                files.append({"name": name, "error": f"{exc.strerror or exc}"})
            if len(files) >= MAX_ENTRIES:
                listing["truncated"] = f"listing stopped at {MAX_ENTRIES} files"
                listing["files"] = files
                return listing
    listing["files"] = sorted(files, key=lambda item: str(item["name"]))
    return listing
