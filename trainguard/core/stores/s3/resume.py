"""Uploading one spooled write: a small object as one PUT, a large one as a multipart upload resumed part by part.

The S3 store's way for what waits in the spool (``spool``): each part is streamed from the spool
file with its SHA-256, and an interrupted multipart upload is resumed by its id, sending only the
parts S3 lacks or holds with other bytes. Which entries go up, when, and within what time is
``store``'s business; so are retries (``retrying``) and the time budget (``check``).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

from trainguard.core.stores.s3 import direct
from trainguard.core.stores.s3.bucket import NoSuchUpload, S3Bucket, S3Error, S3Permanent
from trainguard.core.stores.s3.spool import TAG, Spool, SpoolEntry, same_checksum
from trainguard.core.stores.base import EvidenceNotFound, checksum_of_hex

T = TypeVar("T")


class Retrying(Protocol):
    """Calls S3 with retries on transient errors."""

    def __call__(self, call: Callable[[], T], /) -> T: ...


class SpoolUploader:
    """Sends spooled entries to ``bucket``; ``retrying`` wraps every S3 call, ``check`` precedes spool updates."""

    def __init__(self, bucket: S3Bucket, spool: Spool, concurrency: int, retrying: Retrying,
                 check: Callable[[], None], describe: Callable[[str], str]) -> None:
        self.bucket, self.spool, self.concurrency = bucket, spool, concurrency
        self._retrying, self._check, self._describe = retrying, check, describe

    def upload(self, entry: SpoolEntry) -> None:
        """Send ``entry`` (a write or a tagging); raises `EvidenceStoreError` when S3 did not take it."""
        if entry.op == TAG:
            self.tag_stored(entry.key, entry.tags, set())
        elif not entry.multipart:
            body = self.spool.read(entry)
            _check_part(entry, 1, body)
            self.put_object(entry.key, body, entry.sha256, entry.tags)
        else:
            stored = self._upload_parts(entry)
            if stored and not same_checksum(stored, entry.checksum_sha256):
                raise S3Permanent(f"{self._describe(entry.key)}: S3 stored checksum {stored}, "
                                  f"expected {entry.checksum_sha256}; the upload was not accepted")

    def put_object(self, full: str, body: bytes, digest: str, tags: Mapping[str, str]) -> None:
        """One PUT with the body's SHA-256 for S3 to check."""
        expected = checksum_of_hex(digest)
        stored = self._retrying(lambda: self.bucket.put_object(full, body, expected, tags))
        if stored and not same_checksum(stored, expected):
            raise S3Permanent(f"{self._describe(full)}: S3 stored checksum {stored}, expected "
                              f"{expected}; the upload was not accepted")

    def tag_stored(self, full_prefix: str, tags: Mapping[str, str], skip: set[str]) -> int:
        """Tag every object in the bucket under ``full_prefix`` except ``skip``; return how many."""
        stored = [key for key in self._retrying(lambda: self.bucket.list_keys(full_prefix)) if key not in skip]
        for key in stored:
            self._retrying(lambda: self.bucket.put_tags(key, tags))
        return len(stored)

    def _upload_parts(self, entry: SpoolEntry) -> str:
        done: dict[int, tuple[str, str]] = {}
        if entry.upload_id:
            try:
                listed = self._retrying(lambda: self.bucket.list_parts(entry.key, entry.upload_id))
            except NoSuchUpload:
                if self._already_stored(entry):
                    return entry.checksum_sha256  # completed before the spool could forget it
                self._check()
                entry = self.spool.update(entry, upload_id="")
                listed = {}
            done = {n: (etag, checksum_of_hex(entry.part_sha256[n - 1])) for n, (etag, checksum) in listed.items()
                    if n <= len(entry.part_sha256) and self._part_matches(entry, n, etag, checksum)}
        if not entry.upload_id:
            upload_id = self._retrying(lambda: self.bucket.create_multipart_upload(entry.key, entry.tags))
            self._check()  # a call left behind by its budget must not rewrite the spool after the store moved on
            entry = self.spool.update(entry, upload_id=upload_id)
        todo = [n for n in range(1, len(entry.part_sha256) + 1) if n not in done]
        done.update(direct.in_parallel({n: functools.partial(self._send_part, entry, n) for n in todo},
                                         self.concurrency))
        parts = [(n, etag, checksum) for n, (etag, checksum) in sorted(done.items())]
        return self._retrying(lambda: self.bucket.complete_multipart_upload(entry.key, entry.upload_id, parts))

    def _part_matches(self, entry: SpoolEntry, number: int, etag: str, checksum: str) -> bool:
        """Whether an uploaded part is ours: by its SHA-256, or by its MD5 ETag where S3 lists no checksum."""
        if checksum:
            return checksum == checksum_of_hex(entry.part_sha256[number - 1])
        offset = (number - 1) * entry.part_bytes
        body = self.spool.read(entry, offset, min(entry.part_bytes, entry.size_bytes - offset))
        return etag.strip('"') == hashlib.md5(body, usedforsecurity=False).hexdigest()

    def _already_stored(self, entry: SpoolEntry) -> bool:
        try:
            found = self._retrying(lambda: self.bucket.head(entry.key))
        except EvidenceNotFound:
            return False
        return found.size_bytes == entry.size_bytes and same_checksum(found.checksum_sha256, entry.checksum_sha256)

    def _send_part(self, entry: SpoolEntry, number: int) -> tuple[str, str]:
        """One part, streamed from the spool file (memory stays small whatever the part size)."""
        offset = (number - 1) * entry.part_bytes
        length = min(entry.part_bytes, entry.size_bytes - offset)
        checksum = checksum_of_hex(entry.part_sha256[number - 1])

        def send() -> str:
            with self.spool.open_range(entry, offset, length) as body:
                etag = self.bucket.upload_part(entry.key, entry.upload_id, number, body, checksum)
                sent = body.read_sha256 or self.spool.range_sha256(entry, offset, length)
            if sent != entry.part_sha256[number - 1]:  # S3 refuses such a part; a lenient server might not
                raise _damaged(entry, number)
            return etag

        return self._retrying(send), checksum


def _check_part(entry: SpoolEntry, number: int, body: bytes) -> None:
    if hashlib.sha256(body).hexdigest() != entry.part_sha256[number - 1]:
        raise _damaged(entry, number)


def _damaged(entry: SpoolEntry, number: int) -> S3Error:
    return S3Error(f"spooled data for {entry.key!r} (part {number}) changed on disk since it was spooled; "
                   f"the spool entry {entry.seq} is damaged")
