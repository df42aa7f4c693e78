"""The evidence manifest: what was kept of one attempt (with digests) and what is missing, and why.

The manifest is written last, so its presence means collection finished; verifying it against
the store catches objects that vanished or changed afterwards. Collecting the evidence is
``evidence``'s job; storing bytes is the store's.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import MISSING, asdict, dataclass
from typing import Any

from trainguard.core.stores.base import EvidenceNotFound, EvidenceStore, EvidenceStoreError, ReservingStore, StoredItem
from trainguard.core import ids

MANIFEST_FORMAT = 1
VERDICT = "verdict.json"
# Space set aside before an attempt runs, so a disk the attempt fills still takes the manifest (a
# few KiB per hundred items) and the verdict: generous, and given back once they are written.
RESERVED_BYTES = {"manifest.json": 256 * 1024, VERDICT: 64 * 1024}


class ManifestError(ValueError):
    """A manifest document is malformed; the message names the field."""


@dataclass(frozen=True)
class ManifestItem:
    """One stored piece of evidence."""

    name: str  # relative to the attempt prefix, e.g. "snapshot/env.json"
    key: str
    sha256: str
    size_bytes: int
    source: str  # who produced it: "entrypoint", "runner", "local-workspace", "flow"
    collected_at: str  # ISO-8601 UTC
    checksum_sha256: str = ""  # the store's own stored checksum (S3 ChecksumSHA256), "" if it keeps none
    # The name as the job wrote it, when ``name`` had to spell it printably (safefiles.safe_name:
    # control characters, bidi overrides, bytes that are not UTF-8 as %XX); "" when they are the same.
    original_name: str = ""


@dataclass(frozen=True)
class MissingItem:
    """A piece of evidence that is not there, and why.

    ``applicable`` is False for an item that could not exist on this attempt (GPU snapshots on a host
    without an NVIDIA driver, core dumps of a process that did not die of a core-dumping signal):
    it is listed with its reason, but the attempt's evidence is not partial for it.
    """

    name: str
    source: str
    reason: str
    original_name: str = ""  # as `ManifestItem.original_name`
    applicable: bool = True


@dataclass(frozen=True)
class Manifest:
    """Everything kept of one attempt."""

    run_id: str
    attempt: int
    created_at: str
    items: tuple[ManifestItem, ...]
    missing: tuple[MissingItem, ...]

    @property
    def absent(self) -> tuple[MissingItem, ...]:
        """The missing items that could have been there: what makes the evidence partial."""
        return tuple(item for item in self.missing if item.applicable)

    def to_json(self) -> str:
        """The manifest as indented JSON (``original_name`` only where it differs from ``name``)."""
        payload = {"format": MANIFEST_FORMAT, **asdict(self)}
        for entries in (payload["items"], payload["missing"]):
            for entry in entries:
                if not entry["original_name"]:
                    del entry["original_name"]
                if entry.get("applicable") is True:
                    del entry["applicable"]
        return json.dumps(payload, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parse `to_json`'s output; raises `ManifestError` naming the bad field."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ManifestError(f"manifest is not JSON: {exc}") from exc
        except RecursionError as exc:
            raise ManifestError("manifest is not a manifest: nested too deeply to read") from exc
        if not isinstance(data, dict):
            raise ManifestError("manifest must be a JSON object")
        try:
            return cls(
                run_id=_field(data, "run_id", str),
                attempt=_field(data, "attempt", int),
                created_at=_field(data, "created_at", str),
                items=tuple(ManifestItem(**_entry(e, "items", ManifestItem)) for e in _field(data, "items", list)),
                missing=tuple(MissingItem(**_entry(e, "missing", MissingItem)) for e in _field(data, "missing", list)),
            )
        except TypeError as exc:
            raise ManifestError(f"manifest entry is malformed: {exc}") from exc


def _field(data: dict[str, Any], name: str, kind: type) -> Any:
    value = data.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ManifestError(f"manifest field {name!r} must be a {kind.__name__}, got {value!r}")
    return value


def _entry(entry: Any, field: str, kind: type) -> dict[str, Any]:
    fields = kind.__dataclass_fields__  # type: ignore[attr-defined]
    names = set(fields)
    required = {name for name, f in fields.items() if f.default is MISSING}
    if not isinstance(entry, dict) or not required <= set(entry) <= names:
        raise ManifestError(f"manifest field {field!r}: each entry needs exactly {sorted(names)}, got {entry!r}")
    for name, value in entry.items():
        kind = fields[name].type
        wanted = int if kind in (int, "int") else bool if kind in (bool, "bool") else str
        if not isinstance(value, wanted) or (isinstance(value, bool) and wanted is not bool):
            said = {int: "a whole number", bool: "true or false"}.get(wanted, "text")
            raise ManifestError(f"manifest field {field!r}: an entry's {name!r} must be {said}, got {value!r:.80}")
    return entry


def attempt_prefix(run_id: str, attempt: int) -> str:
    """``runs/{run_id}/attempt-{n}``: where one attempt's evidence lives in a store."""
    return ids.attempt_path(run_id, attempt)


def manifest_key(run_id: str, attempt: int) -> str:
    """The manifest's key for an attempt."""
    return f"{attempt_prefix(run_id, attempt)}/manifest.json"


def write_manifest(store: EvidenceStore, manifest: Manifest) -> StoredItem:
    """Store the manifest; call it after every item, so its presence means collection finished."""
    return store.put_bytes(manifest_key(manifest.run_id, manifest.attempt), manifest.to_json().encode("utf-8"))


def store_manifest(store: EvidenceStore, manifest: Manifest, source: str) -> Manifest:
    """Write ``manifest`` last, as every collector does; never raise.

    If the manifest cannot be stored, the returned manifest lists ``manifest.json`` as missing
    (from ``source``) with why, so the caller still reports what it collected.
    """
    try:
        write_manifest(store, manifest)
    except Exception as exc:
        reason = f"could not store the manifest: {type(exc).__name__}: {exc}"
        return Manifest(manifest.run_id, manifest.attempt, manifest.created_at, manifest.items,
                        (*manifest.missing, MissingItem("manifest.json", source, reason)))
    return manifest


def reserve_space(store: EvidenceStore, run_id: str, attempt: int) -> str | None:
    """Set space aside for the attempt's manifest and verdict, where the store can; None, or why not.

    Called before the attempt runs: its output may fill the disk the evidence goes to.
    """
    if not isinstance(store, ReservingStore):
        return None
    try:
        for name, size in RESERVED_BYTES.items():
            store.reserve(f"{attempt_prefix(run_id, attempt)}/{name}", size)
    except EvidenceStoreError as exc:
        return f"no space could be set aside for the manifest: {exc}"
    return None


def release_space(store: EvidenceStore, run_id: str, attempt: int) -> None:
    """Give back what `reserve_space` set aside, once the manifest and verdict are written."""
    if isinstance(store, ReservingStore):
        for name in RESERVED_BYTES:
            try:
                store.release(f"{attempt_prefix(run_id, attempt)}/{name}")
            except EvidenceStoreError:
                pass  # a reserve left behind is a hidden file, not lost evidence


def storage_failures(manifest: Manifest) -> list[str]:
    """The missing items the store failed to take (not those the attempt never produced), one line each."""
    failed = [item for item in manifest.missing
              if item.name == "manifest.json" or "EvidenceStoreError" in item.reason]
    return [f"evidence {item.name}: {item.reason.removeprefix('could not collect: ')}" for item in failed]


def read_manifest(store: EvidenceStore, run_id: str, attempt: int) -> Manifest:
    """Load an attempt's manifest; raises `EvidenceNotFound` or `ManifestError`."""
    return Manifest.from_json(store.get_bytes(manifest_key(run_id, attempt)).decode("utf-8", errors="replace"))


def verify_manifest(store: EvidenceStore, manifest: Manifest) -> list[str]:
    """Check each listed object exists with its size and SHA-256; return the problems ([] if none)."""
    problems: list[str] = []
    for item in manifest.items:
        try:
            data = store.get_bytes(item.key)
        except EvidenceNotFound:
            problems.append(f"{item.key}: missing from the store")
            continue
        except Exception as exc:  # one unreadable object must not hide the state of the others
            problems.append(f"{item.key}: cannot be read ({type(exc).__name__}: {exc})")
            continue
        if len(data) != item.size_bytes:
            problems.append(f"{item.key}: size is {len(data)} bytes, the manifest says {item.size_bytes}")
        digest = hashlib.sha256(data).hexdigest()
        if digest != item.sha256:
            problems.append(f"{item.key}: sha256 is {digest}, the manifest says {item.sha256}")
    return problems


def attempts_in_store(store: EvidenceStore, run_id: str) -> list[int]:
    """Every attempt of ``run_id`` that left anything in ``store``, with or without a manifest."""
    keys = store.list_keys(ids.run_path(run_id) + "/")
    return sorted({found[1] for key in keys if (found := ids.parse_attempt_path(key)) and found[0] == run_id})


def unlisted_keys(store: EvidenceStore, manifest: Manifest) -> list[str]:
    """Keys under the attempt's prefix that its manifest does not list (added or left there later)."""
    listed = {item.key for item in manifest.items} | {manifest_key(manifest.run_id, manifest.attempt)}
    prefix = attempt_prefix(manifest.run_id, manifest.attempt) + "/"
    return [key for key in store.list_keys(prefix) if key not in listed]


def add_items(
    store: EvidenceStore, run_id: str, attempt: int, items: dict[str, bytes], source: str, collected_at: str,
    current: Manifest | None = None,
) -> Manifest:
    """Store `items` beside an attempt's evidence and list them in its manifest (rewritten last).

    Used for what is only known after collection, such as the attempt's verdict; an item of the
    same name replaces the listed one. `current` is the manifest as its writer has it; without
    it the manifest is read back from the store.
    """
    current = current or read_manifest(store, run_id, attempt)
    prefix = attempt_prefix(run_id, attempt)
    added = []
    for name, data in items.items():
        stored = store.put_bytes(f"{prefix}/{name}", data)
        added.append(ManifestItem(name, stored.key, stored.sha256, stored.size_bytes, source, collected_at,
                                  stored.checksum_sha256))
    kept = tuple(item for item in current.items if item.name not in items)
    updated = Manifest(current.run_id, current.attempt, current.created_at, kept + tuple(added), current.missing)
    write_manifest(store, updated)
    return updated
