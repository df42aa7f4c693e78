"""What a store holds: its attempts with their verdicts, and verifying a bundle against its manifest.

Verifying is cheap by default: each object's size and the store's own stored SHA-256 checksum are
compared with the manifest without downloading anything (a folder keeps no checksum, so there the
file is hashed; it is local anyway). ``deep`` downloads and hashes every object. Writing bundles is
``evidence``'s and ``manifest``'s job.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from trainguard.core import ids
from trainguard.core.attempt import UploadStatus
from trainguard.core.evidence.manifest import VERDICT, Manifest, ManifestItem, attempt_prefix, manifest_key, read_manifest
from trainguard.core.stores.base import EvidenceNotFound, EvidenceStore, ExpiringLinks, SpoolingStore, checksum_of_hex



@dataclass(frozen=True)
class BundleRecord:
    """One attempt's bundle in a store, with what its verdict says (None when it has none yet)."""

    run_id: str
    attempt: int
    created_at: str
    state: str | None  # "Completed" / "Failed" from verdict.json
    category: str | None

    @property
    def failed(self) -> bool:
        """Not known to have succeeded: a failure, or an attempt never judged (kept as long as a failure)."""
        return self.state != "Completed"

    @property
    def judged(self) -> bool:
        """Whether its verdict is recorded."""
        return self.state is not None


def attempts(store: EvidenceStore, run_id: str | None = None) -> list[tuple[str, int]]:
    """(run id, attempt) of every bundle with a manifest, in order."""
    keys = store.list_keys(ids.run_path(run_id) + "/" if run_id else ids.RUNS + "/")
    found = {parsed for key in keys if (parsed := ids.parse_attempt_path(key)) and key == manifest_key(*parsed)}
    return sorted(found)


def read_json(store: EvidenceStore, key: str) -> dict[str, Any] | None:
    """A small JSON object from the store, or None when absent or not a JSON object."""
    try:
        data = json.loads(store.get_bytes(key))
    except (EvidenceNotFound, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def record(store: EvidenceStore, run_id: str, attempt: int) -> BundleRecord:
    """The attempt's manifest date and its verdict."""
    manifest = read_manifest(store, run_id, attempt)
    verdict = read_json(store, f"{attempt_prefix(run_id, attempt)}/{VERDICT}") or {}
    state, category = verdict.get("state"), verdict.get("category")
    return BundleRecord(run_id, attempt, manifest.created_at,
                         str(state) if state else None, str(category) if category else None)


def records(store: EvidenceStore) -> Iterator[BundleRecord]:
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
    expected = item.checksum_sha256 or checksum_of_hex(item.sha256)
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


DEFAULT_LINK_SECONDS = 7 * 24 * 3600  # the longest a SigV4 presigned URL may live
MAX_LINKS = 50


def upload_status(store: EvidenceStore, manifest: Manifest, uploading: bool = False,
                  now: datetime | None = None) -> UploadStatus:
    """What a report says about a bundle beyond its counts: what is still spooled, and links to the items
    (at most 50, presigned where the store is remote). ``uploading``: the spooled items go up after the verdict."""
    prefix = attempt_prefix(manifest.run_id, manifest.attempt) + "/"
    spooled: list[str] = []
    error = ""
    if isinstance(store, SpoolingStore):
        spooled = [key[len(prefix):] for key in store.pending(prefix)]
        error = store.last_error if spooled else ""
    seconds = store.link_expiry_seconds if isinstance(store, ExpiringLinks) else DEFAULT_LINK_SECONDS
    links: dict[str, str] = {}
    for item in manifest.items[:MAX_LINKS]:
        try:
            links[item.name] = store.link(item.key, seconds)
        except Exception:  # a link is a convenience; the report goes out without it
            continue
    expires = (now or datetime.now(UTC)) + timedelta(seconds=seconds)
    return UploadStatus(tuple(spooled), error, uploading, links,
                        expires.isoformat(timespec="seconds") if isinstance(store, SpoolingStore) else "")
