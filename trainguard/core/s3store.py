"""The S3 store: the evidence-store protocol over a bucket, with a local spool for what S3 did not take.

While S3 answers, a write goes straight up: a small one as one PUT, a file as a multipart upload
whose parts are sent in parallel while the file is read (``s3direct``), each with its SHA-256 for
S3 to check, encrypted server-side; nothing is copied. Transient failures are retried with backoff;
a permanent one (403, no such bucket) stops at once. A write S3 did not take is spooled on local
disk (``spool``) with its multipart upload's id, and so is every later write of this store, in
order: an attempt's manifest, written last, reaches the bucket last, so a bundle with a manifest is
complete. The write succeeds either way: `pending` says what waits, `last_error` why, and `flush`
uploads it later, part by part. A time budget bounds how long one store object spends on S3.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

from trainguard.core import s3direct
from trainguard.core.s3 import NoSuchUpload, S3Bucket, S3Error, S3Permanent, S3Transient
from trainguard.core.spool import TAG, Spool, SpoolEntry, b64_of_hex, part_bytes_for, s3_checksum, same_checksum
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
    concurrency: int = 10


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
        """Upload ``data`` for ``key``, or spool it when S3 cannot take it; never fails because S3 does."""
        full, data = self._full(key), bytes(data)
        if len(data) > self.policy.part_bytes:  # a multipart upload from memory: through the spool
            entry = self.spool.add_bytes(full, data)
            self._drain()
            return self._stored(key, entry)
        return self._put_small(key, data) if self._uploading() else self._stored(key, self.spool.add_bytes(full, data))

    def _put_small(self, key: str, data: bytes) -> StoredItem:
        full, digest = self._full(key), hashlib.sha256(data).hexdigest()
        try:
            self._put_object(full, data, digest, {})
        except EvidenceStoreError as exc:
            return self._spooled_after(exc, key, self.spool.add_bytes(full, data))
        return StoredItem(key, digest, len(data), b64_of_hex(digest))

    def put_file(self, key: str, path: Path) -> StoredItem:
        """Upload the file (hashing it on the way), or spool a copy of what S3 did not take."""
        full, path = self._full(key), Path(path)
        try:
            handle = path.open("rb")
        except OSError as exc:
            raise EvidenceStoreError(f"cannot read {path} for {key!r}: {exc.strerror or exc}") from exc
        with handle:
            if not self._uploading():
                return self._stored(key, self.spool.add_open_file(full, handle))
            size, most = os.fstat(handle.fileno()).st_size, self.policy.part_bytes
            if size <= most and len(data := handle.read(most + 1)) <= most:  # it may have grown since
                return self._put_small(key, data)
            return self._put_parts(key, path, handle, part_bytes_for(size, self.policy.part_bytes))

    def _put_parts(self, key: str, path: Path, handle: BinaryIO, part_bytes: int) -> StoredItem:
        """A multipart upload sent while the file is read; on failure the file is spooled with the upload's id."""
        full = self._full(key)
        try:
            upload_id = self._retrying(lambda: self.bucket.create_multipart_upload(full, {}))
        except EvidenceStoreError as exc:
            return self._spooled_after(exc, key, self.spool.add_open_file(full, handle))
        handle.seek(0)
        sent = s3direct.send_parts(self.bucket, full, upload_id, path, handle, part_bytes, self.policy.concurrency,
                                   self._retrying)
        checksum = s3_checksum(sent.part_sha256, True)
        try:
            if sent.error:
                raise sent.error
            parts = [(n, sent.etags[n], b64_of_hex(digest)) for n, digest in enumerate(sent.part_sha256, 1)]
            stored = self._retrying(lambda: self.bucket.complete_multipart_upload(full, upload_id, parts))
            if stored and not same_checksum(stored, checksum):
                raise S3Permanent(f"{self.describe(key)}: S3 stored checksum {stored}, expected {checksum}")
        except EvidenceStoreError as exc:
            if isinstance(exc, (s3direct.SourceChanged, S3Permanent)):  # its parts are of no use to a resume
                self._abort_quietly(full, upload_id)
                upload_id = ""
            return self._spooled_after(exc, key, self.spool.add_open_file(full, handle, upload_id=upload_id))
        return StoredItem(key, sent.sha256, sent.size_bytes, checksum)

    def _abort_quietly(self, full: str, upload_id: str) -> None:
        with contextlib.suppress(EvidenceStoreError):  # else the lifecycle rule aborts it after 7 days
            self.bucket.abort_multipart_upload(full, upload_id)

    def _spooled_after(self, exc: EvidenceStoreError, key: str, entry: SpoolEntry) -> StoredItem:
        self._stopped, self.last_error = True, str(exc)
        return self._stored(key, entry)

    def _uploading(self) -> bool:
        """Whether a write may go straight up (once what waits in the spool went first); else it is spooled."""
        self._drain()
        try:
            self._check_budget()
        except S3Transient as exc:
            self._stopped, self.last_error = True, self.last_error or str(exc)
        return not self._stopped

    def _stored(self, key: str, entry: SpoolEntry) -> StoredItem:
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
        spooled = [entry.key for entry in self.spool.pending() if entry.key.startswith(full) and entry.op != TAG]
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
        """What (under ``prefix``) still waits in the spool, oldest first: keys, and taggings as ``PREFIX(tags K=V)``."""
        full = self.prefix + prefix
        return [self._short(entry.key) + (_tag_label(entry.tags) if entry.op == TAG else "")
                for entry in self.spool.pending() if entry.key.startswith(full)]

    def tag_prefix(self, prefix: str, tags: Mapping[str, str]) -> int:
        """Tag every object under ``prefix``; return how many were tagged or will be. Never fails because S3 does.

        Spooled writes are tagged in the spool, so they carry the tags up; the objects already in
        the bucket are tagged now, or, when S3 cannot be reached, by a tagging spooled after the
        writes, which `flush` applies in its turn.
        """
        full = self.prefix + prefix
        spooled = [entry for entry in self.spool.pending() if entry.key.startswith(full) and entry.op != TAG]
        for entry in spooled:
            self.spool.update(entry, tags=dict(tags))  # type: ignore[arg-type]
        if self._uploading():
            try:
                return len(spooled) + self._tag_stored(full, tags, {entry.key for entry in spooled})
            except EvidenceStoreError as exc:
                self._stopped, self.last_error = True, str(exc)
        self.spool.add_tags(full, tags)
        return len(spooled)

    def _tag_stored(self, full_prefix: str, tags: Mapping[str, str], skip: set[str]) -> int:
        stored = [key for key in self._retrying(lambda: self.bucket.list_keys(full_prefix)) if key not in skip]
        for key in stored:
            self._retrying(lambda: self.bucket.put_tags(key, tags))
        return len(stored)

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
        if entry.op == TAG:
            self._tag_stored(entry.key, entry.tags, set())
        elif not entry.multipart:
            body = self.spool.read(entry)
            _check_part(entry, 1, body)
            self._put_object(entry.key, body, entry.sha256, entry.tags)
        else:
            stored = self._upload_parts(entry)
            if stored and not same_checksum(stored, entry.checksum_sha256):
                raise S3Permanent(f"{self.describe(self._short(entry.key))}: S3 stored checksum {stored}, "
                                  f"expected {entry.checksum_sha256}; the upload was not accepted")

    def _put_object(self, full: str, body: bytes, digest: str, tags: Mapping[str, str]) -> None:
        expected = b64_of_hex(digest)
        stored = self._retrying(lambda: self.bucket.put_object(full, body, expected, tags))
        if stored and not same_checksum(stored, expected):
            raise S3Permanent(f"{self.describe(self._short(full))}: S3 stored checksum {stored}, expected "
                              f"{expected}; the upload was not accepted")

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
        """Upload parts ``todo`` from the spool, ``concurrency`` at a time, each read just as it goes."""
        return s3direct.in_parallel({n: functools.partial(self._send_part, entry, n) for n in todo},
                                    self.policy.concurrency)

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


def _tag_label(tags: Mapping[str, str]) -> str:
    return "(tags " + ", ".join(f"{k}={v}" for k, v in tags.items()) + ")"


def _check_part(entry: SpoolEntry, number: int, body: bytes) -> None:
    if hashlib.sha256(body).hexdigest() != entry.part_sha256[number - 1]:
        raise _damaged(entry, number)


def _damaged(entry: SpoolEntry, number: int) -> S3Error:
    return S3Error(f"spooled data for {entry.key!r} (part {number}) changed on disk since it was spooled; "
                   f"the spool entry {entry.seq} is damaged")
