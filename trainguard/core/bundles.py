"""What a store holds: its attempts with their verdicts, and verifying a bundle against its manifest.

Verifying is cheap by default: each object's size and the store's own stored SHA-256 checksum are
compared with the manifest without downloading anything (a folder keeps no checksum, so there the
file is hashed; it is local anyway). ``deep`` downloads and hashes every object. Writing bundles is
``evidence``'s and ``manifest``'s job.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from trainguard.core.manifest import Manifest, ManifestItem, read_manifest
from trainguard.core.spool import b64_of_hex
from trainguard.core.stores import EvidenceNotFound, EvidenceStore

_MANIFEST = re.compile(r"^runs/([^/]+)/attempt-(\d+)/manifest\.json$")


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt's bundle in a store, with what its verdict says (None when it has none yet)."""

    run_id: str
    attempt: int
    created_at: str
    state: str | None  # "Completed" / "Failed" from verdict.json
    category: str | None

    @property
    def failed(self) -> bool:
        return self.state != "Completed"


def attempts(store: EvidenceStore, run_id: str | None = None) -> list[tuple[str, int]]:
    """(run id, attempt) of every bundle with a manifest, in order."""
    found = {(m.group(1), int(m.group(2))) for key in store.list_keys(f"runs/{run_id}/" if run_id else "runs/")
             if (m := _MANIFEST.match(key))}
    return sorted(found)


def read_json(store: EvidenceStore, key: str) -> dict[str, Any] | None:
    """A small JSON object from the store, or None when absent or not a JSON object."""
    try:
        data = json.loads(store.get_bytes(key))
    except (EvidenceNotFound, ValueError):
        return None
    return data if isinstance(data, dict) else None


def record(store: EvidenceStore, run_id: str, attempt: int) -> AttemptRecord:
    """The attempt's manifest date and its verdict."""
    manifest = read_manifest(store, run_id, attempt)
    verdict = read_json(store, f"runs/{run_id}/attempt-{attempt}/verdict.json") or {}
    state, category = verdict.get("state"), verdict.get("category")
    return AttemptRecord(run_id, attempt, manifest.created_at,
                         str(state) if state else None, str(category) if category else None)


def records(store: EvidenceStore) -> Iterator[AttemptRecord]:
    """Every attempt in the store; one whose manifest cannot be read is skipped."""
    for run_id, attempt in attempts(store):
        try:
            yield record(store, run_id, attempt)
        except (EvidenceNotFound, ValueError):
            continue


def verify(store: EvidenceStore, manifest: Manifest, deep: bool = False,
           progress: Callable[[ManifestItem], None] | None = None) -> dict[str, str]:
    """Check each listed object; return {item name: problem} ({} when all is well).

    Args:
        store: Where the bundle is.
        manifest: What it should hold.
        deep: Download and hash every object instead of trusting the store's stored checksums.
        progress: Called with each item before it is checked.
    """
    problems: dict[str, str] = {}
    for item in manifest.items:
        if progress:
            progress(item)
        try:
            problem = _check(store, item, deep)
        except EvidenceNotFound:
            problem = "missing from the store"
        except Exception as exc:  # one unreadable object must not hide the state of the others
            problem = f"cannot be read ({type(exc).__name__}: {exc})"
        if problem:
            problems[item.name] = problem
    return problems


def _check(store: EvidenceStore, item: ManifestItem, deep: bool) -> str:
    info = store.head(item.key)
    if info.size_bytes != item.size_bytes:
        return f"size is {info.size_bytes} bytes, the manifest says {item.size_bytes}"
    expected = item.checksum_sha256 or b64_of_hex(item.sha256)
    if not deep and info.checksum_sha256:
        stored, wanted = info.checksum_sha256.split("-", 1)[0], expected.split("-", 1)[0]
        if stored != wanted:
            return f"stored checksum is {info.checksum_sha256}, the manifest says {expected}"
        return ""
    digest = hashlib.sha256()
    for chunk in store.read_chunks(item.key):
        digest.update(chunk)
    if digest.hexdigest() != item.sha256:
        return f"sha256 is {digest.hexdigest()}, the manifest says {item.sha256}"
    return ""
