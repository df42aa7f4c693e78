"""The S3 evidence store: the evidence-store protocol over a bucket, through a local spool.

Every write is spooled on local disk first (``spool``), then uploaded in the order it was written,
so an attempt's manifest, written last, reaches the bucket last: a bundle with a manifest is
complete. Objects go up in bounded memory (one PUT up to the part size, else a multipart upload
whose parts are read from the spool as they are sent), each with its SHA-256 for S3 to check, and
server-side encryption. Transient failures are retried with backoff; a permanent one (403, no such
bucket) stops uploading at once. Either way the write itself succeeds: what could not be uploaded
stays spooled, `pending` says what, `last_error` says why, and `flush` uploads it later. A time
budget bounds how long one store object spends uploading, so an attempt never waits long on S3.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from trainguard.core.s3 import NoSuchUpload, S3Bucket, S3Error, S3Permanent, S3Transient
from trainguard.core.spool import Spool, SpoolEntry, b64_of_hex
from trainguard.core.stores import EvidenceNotFound, EvidenceStoreError, ObjectInfo, StoredItem, validate_key

T = TypeVar("T")


@dataclass(frozen=True)
class UploadPolicy:
    """How hard and how long to try.

    Attributes:
        attempts: Tries per S3 request before a transient error stops the upload.
        base_delay_seconds: The first backoff; it doubles per retry up to ``max_delay_seconds``.
        max_delay_seconds: The longest backoff.
        budget_seconds: Total time one store object may spend on S3 calls; None = no limit.
        part_bytes: Multipart part size (at least 5 MiB; grown for objects over 10,000 parts).
        concurrency: Parts in flight at once; memory is about ``concurrency x part_bytes``.
    """

    attempts: int = 5
    base_delay_seconds: float = 0.5
    max_delay_seconds: float = 8.0
    budget_seconds: float | None = 900.0
    part_bytes: int = 8 * 1024 * 1024
    concurrency: int = 4


@dataclass(frozen=True)
class FlushResult:
    """What one pass over the spool did: keys uploaded, keys still spooled, and why they are."""

    uploaded: tuple[str, ...]
    pending: tuple[str, ...]
    error: str = ""


class S3Store:
    """Evidence in ``s3://bucket/prefix``, spooled locally until S3 has it."""

    def __init__(
        self,
        bucket: S3Bucket,
        prefix: str,
        spool: Spool,
        policy: UploadPolicy = UploadPolicy(),
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        link_expiry_seconds: int = 7 * 24 * 3600,
    ) -> None:
        self.bucket, self.spool, self.policy = bucket, spool, policy
        self.prefix = validate_key(prefix.strip("/")) + "/" if prefix.strip("/") else ""
        self.last_error = ""
        self.link_expiry_seconds = link_expiry_seconds
        self._clock, self._sleep = clock, sleep
        self._deadline: float | None = None  # the budget starts with the first upload, not at construction
        self._stopped = False

    def _full(self, key: str) -> str:
        return self.prefix + validate_key(key)

    def _short(self, full_key: str) -> str:
        return full_key[len(self.prefix):]

    # -- the evidence-store protocol ------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes) -> StoredItem:
        """Spool ``data`` for ``key`` and upload what the spool holds; never fails because S3 does."""
        return self._stored(key, self.spool.add_bytes(self._full(key), bytes(data)))

    def put_file(self, key: str, path: Path) -> StoredItem:
        """Spool the file (hashing it on the way) and upload what the spool holds."""
        return self._stored(key, self.spool.add_file(self._full(key), Path(path)))

    def _stored(self, key: str, entry: SpoolEntry) -> StoredItem:
        self._drain()
        return StoredItem(key, entry.sha256, entry.size_bytes, entry.checksum_sha256)

    def get_bytes(self, key: str) -> bytes:
        """The newest write of ``key``: from the spool while it waits there, else from S3."""
        entry = self.spool.newest(self._full(key))
        if entry is not None:
            return self.spool.read(entry)
        return self._retrying(lambda: self.bucket.get_bytes(self._full(key)))

    def exists(self, key: str) -> bool:
        """Whether ``key`` is spooled or in the bucket."""
        try:
            self.head(key)
        except EvidenceNotFound:
            return False
        return True

    def list_keys(self, prefix: str) -> list[str]:
        """Sorted keys starting with ``prefix``, in the bucket or still spooled."""
        full = self.prefix + prefix
        stored = self._retrying(lambda: self.bucket.list_keys(full))
        spooled = [entry.key for entry in self.spool.pending() if entry.key.startswith(full)]
        return sorted({self._short(key) for key in [*stored, *spooled]})

    def describe(self, key: str = "") -> str:
        """``s3://bucket/prefix/key``."""
        return f"s3://{self.bucket.bucket}/{self.prefix}{key}"

    def head(self, key: str) -> ObjectInfo:
        """Size and S3's stored checksum, without downloading (a spooled write answers from the spool)."""
        entry = self.spool.newest(self._full(key))
        if entry is not None:
            return ObjectInfo(key, entry.size_bytes, entry.checksum_sha256, spooled=True)
        found = self._retrying(lambda: self.bucket.head(self._full(key)))
        return ObjectInfo(key, found.size_bytes, found.checksum_sha256)

    def read_chunks(self, key: str) -> Iterator[bytes]:
        """The object's bytes in 1 MiB chunks, from the spool or streamed from S3."""
        entry = self.spool.newest(self._full(key))
        if entry is not None:
            return self.spool.chunks(entry)
        return self.bucket.read_chunks(self._full(key))

    def delete(self, key: str) -> None:
        """Delete ``key`` from the bucket and drop any spooled write of it."""
        full = self._full(key)
        for entry in self.spool.pending():
            if entry.key == full:
                self.spool.done(entry)
        self._retrying(lambda: self.bucket.delete(full))

    def link(self, key: str, expires_seconds: int) -> str:
        """A presigned GET URL that expires after ``expires_seconds``."""
        return self.bucket.presign(self._full(key), expires_seconds)

    # -- beyond the protocol ---------------------------------------------------------------------

    def pending(self, prefix: str = "") -> list[str]:
        """Keys (under ``prefix``) still waiting in the spool, oldest first."""
        full = self.prefix + prefix
        return [self._short(entry.key) for entry in self.spool.pending() if entry.key.startswith(full)]

    def tag_prefix(self, prefix: str, tags: Mapping[str, str]) -> int:
        """Tag every object under ``prefix``; return how many.

        Spooled writes are tagged first, in the spool, so they carry the tags up even if S3 is down
        now; then the objects already in the bucket (which needs S3, and may raise).
        """
        full = self.prefix + prefix
        spooled = {entry.key: entry for entry in self.spool.pending() if entry.key.startswith(full)}
        for entry in spooled.values():
            self.spool.update(entry, tags=dict(tags))  # type: ignore[arg-type]
        stored = [key for key in self._retrying(lambda: self.bucket.list_keys(full)) if key not in spooled]
        for key in stored:
            self._retrying(lambda: self.bucket.put_tags(key, tags))
        return len(spooled) + len(stored)

    def flush(self) -> FlushResult:
        """Upload everything spooled, oldest first, however long ago it was spooled."""
        self._stopped, self.last_error = False, ""
        return self._drain()

    # -- uploading -------------------------------------------------------------------------------

    def _drain(self) -> FlushResult:
        uploaded: list[str] = []
        if self._deadline is None and self.policy.budget_seconds is not None:
            self._deadline = self._clock() + self.policy.budget_seconds
        if not self._stopped:
            with self.spool.uploading() as ours:
                if ours:
                    uploaded = self._upload_pending()
                else:
                    self.last_error = "another process is uploading this spool; it will take these writes"
        return FlushResult(tuple(uploaded), tuple(self.pending()), self.last_error)

    def _upload_pending(self) -> list[str]:
        pending = self.spool.pending()
        newest = {entry.key: entry.seq for entry in pending}
        uploaded: list[str] = []
        for entry in pending:
            if newest[entry.key] != entry.seq:  # rewritten later: only the newest write goes up
                self.spool.done(entry)
                continue
            try:
                self._upload(entry)
            except EvidenceStoreError as exc:
                self._stopped, self.last_error = True, str(exc)
                break
            self.spool.done(entry)
            uploaded.append(self._short(entry.key))
        return uploaded

    def _upload(self, entry: SpoolEntry) -> None:
        if not entry.multipart:
            body = self.spool.read(entry)
            _check_part(entry, 1, body)
            sent = b64_of_hex(entry.sha256)
            stored = self._retrying(lambda: self.bucket.put_object(entry.key, body, sent, entry.tags))
        else:
            stored = self._upload_parts(entry)
        if stored and not same_checksum(stored, entry.checksum_sha256):
            raise S3Permanent(f"{self.describe(self._short(entry.key))}: S3 stored checksum {stored}, "
                              f"expected {entry.checksum_sha256}; the upload was not accepted")

    def _upload_parts(self, entry: SpoolEntry) -> str:
        done: dict[int, tuple[str, str]] = {}
        if entry.upload_id:
            try:
                listed = self._retrying(lambda: self.bucket.list_parts(entry.key, entry.upload_id))
            except NoSuchUpload:
                if self._already_stored(entry):
                    return entry.checksum_sha256  # completed before the spool could forget it
                entry = self.spool.update(entry, upload_id="")
                listed = {}
            done = {n: (etag, b64_of_hex(entry.part_sha256[n - 1])) for n, (etag, checksum) in listed.items()
                    if n <= len(entry.part_sha256) and self._part_matches(entry, n, etag, checksum)}
        if not entry.upload_id:
            upload_id = self._retrying(lambda: self.bucket.create_multipart_upload(entry.key, entry.tags))
            entry = self.spool.update(entry, upload_id=upload_id)
        todo = [n for n in range(1, len(entry.part_sha256) + 1) if n not in done]
        done.update(self._send_parts(entry, todo))
        parts = [(n, etag, checksum) for n, (etag, checksum) in sorted(done.items())]
        return self._retrying(lambda: self.bucket.complete_multipart_upload(entry.key, entry.upload_id, parts))

    def _part_matches(self, entry: SpoolEntry, number: int, etag: str, checksum: str) -> bool:
        """Whether an uploaded part is ours: by its SHA-256, or by its MD5 ETag where S3 lists no checksum."""
        if checksum:
            return checksum == b64_of_hex(entry.part_sha256[number - 1])
        offset = (number - 1) * entry.part_bytes
        body = self.spool.read(entry, offset, min(entry.part_bytes, entry.size_bytes - offset))
        return etag.strip('"') == hashlib.md5(body, usedforsecurity=False).hexdigest()

    def _already_stored(self, entry: SpoolEntry) -> bool:
        try:
            found = self._retrying(lambda: self.bucket.head(entry.key))
        except EvidenceNotFound:
            return False
        return found.size_bytes == entry.size_bytes and same_checksum(found.checksum_sha256, entry.checksum_sha256)

    def _send_parts(self, entry: SpoolEntry, todo: list[int]) -> dict[int, tuple[str, str]]:
        """Upload parts ``todo`` from the spool, ``concurrency`` at a time, each read just before it goes."""
        results: dict[int, tuple[str, str]] = {}
        errors: list[BaseException] = []
        numbers, lock = iter(todo), threading.Lock()

        def worker() -> None:
            while not errors:
                with lock:
                    number = next(numbers, None)
                if number is None:
                    return
                try:
                    results[number] = self._send_part(entry, number)
                except BaseException as exc:  # handed to the caller's thread below
                    errors.append(exc)

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(self.policy.concurrency, len(todo)))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return results

    def _send_part(self, entry: SpoolEntry, number: int) -> tuple[str, str]:
        """One part, streamed from the spool file (memory stays small whatever the part size)."""
        offset = (number - 1) * entry.part_bytes
        length = min(entry.part_bytes, entry.size_bytes - offset)
        checksum = b64_of_hex(entry.part_sha256[number - 1])

        def send() -> str:
            with self.spool.open_range(entry, offset, length) as body:
                etag = self.bucket.upload_part(entry.key, entry.upload_id, number, body, checksum)
                sent = body.read_sha256 or self.spool.range_sha256(entry, offset, length)
            if sent != entry.part_sha256[number - 1]:  # S3 refuses such a part; a lenient server might not
                raise _damaged(entry, number)
            return etag

        return self._retrying(send), checksum

    def _retrying(self, call: Callable[[], T]) -> T:
        """``call`` with exponential backoff on transient errors, within the time budget."""
        for attempt in range(1, self.policy.attempts + 1):
            self._check_budget()
            try:
                return call()
            except S3Transient as exc:
                if attempt == self.policy.attempts:
                    raise S3Transient(f"{exc} (gave up after {attempt} tries)") from exc
                delay = min(self.policy.max_delay_seconds, self.policy.base_delay_seconds * 2 ** (attempt - 1))
                if self._deadline is not None and self._clock() + delay > self._deadline:
                    raise S3Transient(f"{exc} (no time left to retry within the upload budget)") from exc
                self._sleep(delay)
        raise AssertionError("unreachable: the loop returns or raises")

    def _check_budget(self) -> None:
        if self._deadline is not None and self._clock() >= self._deadline:
            raise S3Transient(f"{self.describe()}: the upload time budget ({self.policy.budget_seconds:g} s) is "
                              "spent; the rest stays spooled for `trainguard evidence flush`")


def same_checksum(stored: str, expected: str) -> bool:
    """Whether S3's stored checksum is the expected one.

    S3 spells a multipart object's composite checksum ``base64-N`` in HeadObject but plain
    ``base64`` in GetObjectAttributes (and some S3-compatible stores always do): compare the digests.
    """
    return stored.split("-", 1)[0] == expected.split("-", 1)[0]


def _check_part(entry: SpoolEntry, number: int, body: bytes) -> None:
    if hashlib.sha256(body).hexdigest() != entry.part_sha256[number - 1]:
        raise _damaged(entry, number)


def _damaged(entry: SpoolEntry, number: int) -> S3Error:
    return S3Error(f"spooled data for {entry.key!r} (part {number}) changed on disk since it was spooled; "
                   f"the spool entry {entry.seq} is damaged")
