"""Listing a checkpoint folder: what a retry could resume from, with sizes and digests.

The entrypoint lists it after the command ends and the core's evidence collection lists it again
for ``checkpoints.json``; choosing *which* checkpoint to resume from does not belong here. The
folder is the training job's: only its regular files are listed and hashed (through `safefiles`),
and what else it holds (links, FIFOs, devices) is listed as skipped with why, never read.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainguard_entrypoint import safefiles

DEFAULT_HASH_LIMIT_BYTES = 64 * 1024 * 1024
DEFAULT_HASH_BUDGET_BYTES = 256 * 1024 * 1024
MAX_ENTRIES = safefiles.MAX_ENTRIES


def sha256_file(path: Path, root: Path | None = None) -> str:
    """The hex SHA-256 of a regular file (inside ``root``), read in chunks; `safefiles.Refused` otherwise."""
    with safefiles.open_regular(path, root) as handle:
        return safefiles.sha256_of(handle)


def _add_digests(entries: list[tuple[dict[str, Any], float, Path]], root: Path, limit_bytes: int,
                 budget_bytes: int, known: Mapping[str, str]) -> None:
    """Hash the newest files first, each up to ``limit_bytes``, all together up to ``budget_bytes``; a file
    in ``known`` counts the same, its digest taken from there instead of read again.

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
                name = str(entry["name"])
                entry["sha256"] = known[name] if name in known else sha256_file(path, root)
                spent += size
            except OSError as exc:
                entry["error"] = f"{exc.strerror or exc}"


def list_checkpoints(
    checkpoint_dir: Path,
    *,
    hash_limit_bytes: int = DEFAULT_HASH_LIMIT_BYTES,
    hash_budget_bytes: int = DEFAULT_HASH_BUDGET_BYTES,
    known: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Every regular file under ``checkpoint_dir`` (names relative to it, "/"-separated), sorted by name.

    Returns ``{"dir", "files": [{name, size_bytes, mtime, sha256}], "absent": reason or None}``,
    plus ``"skipped": [{name, kind, reason}]`` for what is not a regular file of the folder's own
    (a symbolic link, a FIFO, a device, a hard link, an unreadable entry), and past `MAX_ENTRIES`
    ``"truncated"`` (why) and ``"left_out"`` (how many entries were not listed: a folder counts once).
    Digests cover the newest files within the size limit and the total budget; the others say
    why they have none; a file that cannot be hashed gets an ``error`` instead of failing the rest.
    ``known`` (name -> hex SHA-256) are digests the caller already took of files here, as it read
    them whole (evidence collection, copying the newest checkpoint): they are not hashed again.
    """
    listing: dict[str, Any] = {"dir": str(checkpoint_dir), "files": [], "absent": None}
    entries: list[tuple[dict[str, Any], float, Path]] = []
    skipped: list[dict[str, Any]] = []
    for found in safefiles.walk(checkpoint_dir, checkpoint_dir, max_entries=MAX_ENTRIES):
        if found.kind == safefiles.FILE:
            entry = {"name": found.name, "size_bytes": found.size_bytes,
                     "mtime": datetime.fromtimestamp(found.mtime, UTC).isoformat(), "sha256": None}
            entries.append((entry, found.mtime, Path(found.path)))
        elif found.name == "":  # the folder itself
            listing["absent"] = (f"no such directory: {checkpoint_dir}" if found.kind == "missing" else found.reason)
        elif found.kind == "limit" and found.left_out:
            listing["left_out"] = listing.get("left_out", 0) + found.left_out
            listing["truncated"] = f"{listing['left_out']} entries not listed: the listing stops at {MAX_ENTRIES} entries"
        else:
            skipped.append({"name": found.name, "kind": found.kind, "reason": found.reason})
    _add_digests(entries, checkpoint_dir, hash_limit_bytes, hash_budget_bytes, known or {})
    listing["files"] = sorted((e for e, _, _ in entries), key=lambda item: str(item["name"]))
    if skipped:
        listing["skipped"] = skipped
    return listing
