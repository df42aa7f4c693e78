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
DEFAULT_HASH_BUDGET_BYTES = 256 * 1024 * 1024
MAX_ENTRIES = 10_000


def sha256_file(path: Path, chunk_bytes: int = 1024 * 1024) -> str:
    """The hex SHA-256 of a file, read in chunks so large files don't fill memory."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def _stat_entry(path: Path, name: str) -> tuple[dict[str, Any], float]:
    stat = path.stat()
    entry: dict[str, Any] = {
        "name": name,
        "size_bytes": stat.st_size,
        "mtime": datetime.fromtimestamp(stat.st_mtime, UTC).isoformat(),
        "sha256": None,
    }
    return entry, stat.st_mtime


def _add_digests(entries: list[tuple[dict[str, Any], float, Path]], limit_bytes: int, budget_bytes: int) -> None:
    """Hash the newest files first, each up to ``limit_bytes``, all together up to ``budget_bytes``.

    A run keeps many old checkpoints; hashing all of them would delay the crash report by minutes.
    """
    spent = 0
    for entry, _, path in sorted(entries, key=lambda item: item[1], reverse=True):
        size = int(entry["size_bytes"])
        if size > limit_bytes:
            entry["sha256_skipped"] = f"larger than {limit_bytes} bytes"
        elif spent + size > budget_bytes:
            entry["sha256_skipped"] = f"hashing budget of {budget_bytes} bytes spent on newer files"
        else:
            try:
                entry["sha256"] = sha256_file(path)
                spent += size
            except OSError as exc:
                entry["error"] = f"{exc.strerror or exc}"


def list_checkpoints(
    checkpoint_dir: Path,
    *,
    hash_limit_bytes: int = DEFAULT_HASH_LIMIT_BYTES,
    hash_budget_bytes: int = DEFAULT_HASH_BUDGET_BYTES,
) -> dict[str, Any]:
    """Every file under ``checkpoint_dir`` (names relative to it, "/"-separated), sorted by name.

    Returns ``{"dir", "files": [{name, size_bytes, mtime, sha256}], "absent": reason or None}``.
    Digests cover the newest files within the size limit and the total budget; the others say
    why they have none. A file that vanishes mid-listing gets an ``error`` instead of failing the rest.
    """
    listing: dict[str, Any] = {"dir": str(checkpoint_dir), "files": [], "absent": None}
    if not checkpoint_dir.is_dir():
        listing["absent"] = f"no such directory: {checkpoint_dir}"
        return listing
    entries: list[tuple[dict[str, Any], float, Path]] = []
    failed: list[dict[str, Any]] = []
    for folder, dirnames, filenames in os.walk(checkpoint_dir):
        dirnames.sort()
        for filename in sorted(filenames):
            path = Path(folder) / filename
            name = path.relative_to(checkpoint_dir).as_posix()
            try:
                entries.append((*_stat_entry(path, name), path))
            except OSError as exc:
                failed.append({"name": name, "error": f"{exc.strerror or exc}"})
            if len(entries) + len(failed) >= MAX_ENTRIES:
                listing["truncated"] = f"listing stopped at {MAX_ENTRIES} files"
                break
        if "truncated" in listing:
            break
    _add_digests(entries, hash_limit_bytes, hash_budget_bytes)
    listing["files"] = sorted([e for e, _, _ in entries] + failed, key=lambda item: str(item["name"]))
    return listing
