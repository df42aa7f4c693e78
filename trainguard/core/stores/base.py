"""The evidence-store seam: the protocol durable evidence goes through, and every optional capability.

A store holds immutable-once-written objects under "/"-separated keys, like an object store.
Writes are atomic: a reader sees no object or the whole object, never a part. Beside the
`EvidenceStore` protocol every store implements, a store may offer capabilities, each a small
protocol here that callers test with ``isinstance``, so no caller names a store class: reserving
space on a disk that can fill (`ReservingStore`), spooling what its remote side did not take
(`SpoolingStore`), holding its uploads until an attempt's verdict is kept (`HoldingStore`),
tagging objects (`TaggingStore`), expiring them by rules (`LifecycleStore`) and expiring links
(`ExpiringLinks`). The stores themselves live in ``folder`` and ``s3``; what goes into a store
and under which names is ``trainguard.core.evidence``'s business.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

MAX_KEY_LENGTH = 1024


class EvidenceStoreError(Exception):
    """A store operation failed; the message names the key and what to do."""


class EvidenceNotFound(EvidenceStoreError):
    """No object exists under the key."""


@dataclass(frozen=True)
class StoredItem:
    """An object as written: its key, SHA-256 (hex) and size.

    ``checksum_sha256`` is the store's own checksum of the object as it keeps it (S3's
    ``ChecksumSHA256``: base64, ``-N`` for an N-part upload); "" for a store that keeps none.
    """

    key: str
    sha256: str
    size_bytes: int
    checksum_sha256: str = ""


@dataclass(frozen=True)
class ObjectInfo:
    """What a store says about an object without reading it."""

    key: str
    size_bytes: int
    checksum_sha256: str  # as `StoredItem.checksum_sha256`; "" when the store keeps none
    spooled: bool = False  # still waiting in a local spool for the store to take it


@runtime_checkable
class EvidenceStore(Protocol):
    """Where evidence outlives the machine it was collected on."""

    def put_bytes(self, key: str, data: bytes) -> StoredItem:
        """Store ``data`` under ``key`` atomically."""
        ...

    def put_file(self, key: str, path: Path) -> StoredItem:
        """Stream the file at ``path`` to ``key`` atomically."""
        ...

    def get_bytes(self, key: str) -> bytes:
        """The object under ``key``; raises `EvidenceNotFound`."""
        ...

    def exists(self, key: str) -> bool:
        """Whether an object exists under ``key``."""
        ...

    def list_keys(self, prefix: str) -> list[str]:
        """Sorted keys starting with ``prefix`` (a string prefix, as object stores do)."""
        ...

    def describe(self, key: str = "") -> str:
        """A location a person can open: a path here, ``s3://bucket/key`` for an object store."""
        ...

    def head(self, key: str) -> ObjectInfo:
        """Size and stored checksum of the object under ``key``, without reading it."""
        ...

    def read_chunks(self, key: str) -> Iterator[bytes]:
        """The object under ``key`` as a stream of chunks, in bounded memory."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object under ``key``; removing an absent object is not an error."""
        ...

    def link(self, key: str, expires_seconds: int) -> str:
        """A URL a person can open to fetch the object (presigned, expiring, for object stores)."""
        ...


@runtime_checkable
class ReservingStore(Protocol):
    """A store on a disk that can fill up: it sets space aside for the writes that must not fail."""

    def reserve(self, key: str, size_bytes: int) -> None:
        """Set ``size_bytes`` aside for later writes of ``key``; raises `EvidenceStoreError`."""
        ...

    def release(self, key: str) -> None:
        """Give back what is left of ``key``'s reserve; releasing none is not an error."""
        ...


@dataclass(frozen=True)
class FlushResult:
    """What one pass over a spool did: keys uploaded, keys still spooled, and why they are."""

    uploaded: tuple[str, ...]
    pending: tuple[str, ...]
    error: str = ""


@runtime_checkable
class SpoolingStore(Protocol):
    """A store that spools writes on local disk until its remote side takes them (the S3 store)."""

    @property
    def last_error(self) -> str:
        """Why writes wait in the spool; "" when none does."""
        ...

    def pending(self, prefix: str = "") -> list[str]:
        """What (under ``prefix``) still waits in the spool, oldest first."""
        ...

    def flush(self) -> FlushResult:
        """Upload everything spooled, oldest first."""
        ...

    def spool_location(self) -> str:
        """Where the spool lies on this machine, for a person to keep or inspect."""
        ...


@runtime_checkable
class HoldingStore(Protocol):
    """A store that can spool its writes now and send them later (the S3 store)."""

    def hold(self) -> None:
        """Spool every write from now on without sending it, until `upload_held`."""
        ...

    def upload_held(self, prefix: str, wait_seconds: float = 0.0) -> FlushResult:
        """Stop holding and send what waits under ``prefix``."""
        ...


@runtime_checkable
class TaggingStore(Protocol):
    """A store that can tag objects (S3); others keep an attempt's outcome only in its verdict."""

    def tag_prefix(self, prefix: str, tags: Mapping[str, str]) -> int:
        """Tag every object under ``prefix``; return how many were tagged or will be."""
        ...


@runtime_checkable
class LifecycleStore(Protocol):
    """A store whose objects expire by rules kept with it (an S3 bucket's lifecycle configuration).

    Rules are in S3's wire form (``ID``, ``Status``, ``Filter``, ``Expiration``, ...), which
    S3-compatible stores share; ``prefix`` is where this store's keys start among the rules' keys.
    """

    @property
    def prefix(self) -> str:
        """Where this store's keys start among the rules' keys ("" or ending in "/")."""
        ...

    def get_lifecycle(self) -> list[dict[str, Any]]:
        """Every lifecycle rule the store holds, this store's and others'."""
        ...

    def put_lifecycle(self, rules: list[dict[str, Any]]) -> None:
        """Replace the store's lifecycle rules with ``rules``."""
        ...


@runtime_checkable
class ExpiringLinks(Protocol):
    """A store whose links (`EvidenceStore.link`) expire: reports say for how long they work."""

    @property
    def link_expiry_seconds(self) -> int:
        """How long a link works, in seconds."""
        ...


def checksum_of_hex(digest: str) -> str:
    """A hex SHA-256 digest as `StoredItem.checksum_sha256` spells it (base64, as S3 does)."""
    return base64.b64encode(bytes.fromhex(digest)).decode()


def validate_key(key: str) -> str:
    """Return ``key`` unchanged or raise a one-line `EvidenceStoreError` saying how to fix it.

    Keys are "/"-separated relative names; no segment may be empty, ``.``/``..`` or start with
    ``.`` (dot-names are reserved for in-flight temporary files), and no backslash or NUL.
    """
    example = "use a relative key like 'runs/r1/attempt-1/crash-report.json'"
    if not isinstance(key, str) or not key:
        raise EvidenceStoreError(f"invalid evidence key {key!r}: it is empty; {example}")
    if len(key) > MAX_KEY_LENGTH:
        raise EvidenceStoreError(f"invalid evidence key {key[:60]!r}...: longer than {MAX_KEY_LENGTH} characters")
    if key.startswith("/"):
        raise EvidenceStoreError(f"invalid evidence key {key!r}: it is absolute; {example}")
    if "\\" in key or "\0" in key:
        raise EvidenceStoreError(f"invalid evidence key {key!r}: backslashes and NUL are not allowed; {example}")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise EvidenceStoreError(f"invalid evidence key {key!r}: segment {segment!r} is not allowed; {example}")
        if segment.startswith("."):
            raise EvidenceStoreError(
                f"invalid evidence key {key!r}: segment {segment!r} starts with '.', reserved for temporary files"
            )
    return key
