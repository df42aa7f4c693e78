"""Uploading a file straight from where it lies: its parts sent in parallel, each hashed just before it goes.

The S3 store's way when S3 answers. The file's size at the start fixes the parts; each of
``concurrency`` threads takes the next part, hashes that range of the file, then streams it to S3
(from the page cache) with the SHA-256, which S3 checks against what it receives. Meanwhile the
calling thread hashes the whole file for the manifest. Nothing is copied and memory does not grow
with the part size. Hashing reads 256 KiB at a time into one buffer per thread: small reads would
hand the GIL back and forth thousands of times per part, and the sending threads would wait on it.
A file that changed meanwhile (size, modification time or inode; a server more lenient than S3
would not notice) is `SourceChanged`: the caller spools it as it is now. When a part cannot be
sent, the parts in flight finish, no more are started, and the caller spools the file with the
upload's id, so `flush` sends only what S3 lacks. Retrying and time budgets are the caller's
(``retrying``); spooling is ``store``'s job.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from trainguard.core.stores.s3.bucket import S3Bucket, S3Error
from trainguard.core.stores.s3.spool import MAX_PARTS, RangeReader
from trainguard.core.stores.base import EvidenceStoreError, checksum_of_hex

T = TypeVar("T")
_HASH_READ_BYTES = 256 * 1024


class SourceChanged(S3Error):
    """The source file changed while it was uploaded: what was sent is not what was hashed."""


@dataclass(frozen=True)
class SentParts:
    """What `send_parts` read and sent: digests of the whole and of each part, and the parts S3 took."""

    sha256: str
    size_bytes: int
    part_sha256: tuple[str, ...]
    etags: dict[int, str]
    error: EvidenceStoreError | None = None


def send_parts(bucket: S3Bucket, key: str, upload_id: str, source: Path, handle: BinaryIO, part_bytes: int,
               concurrency: int, retrying: Callable[[Callable[[], str]], str]) -> SentParts:
    """Send ``handle`` (open on ``source``) as the parts of upload ``upload_id`` while hashing it whole.

    Never raises for an S3 error or a changed source: ``error`` holds the first one. A source that
    cannot be read raises `EvidenceStoreError`.
    """
    before = os.fstat(handle.fileno())
    size = before.st_size
    layout = {n: (offset, min(part_bytes, size - offset)) for n, offset in enumerate(range(0, size, part_bytes), 1)}
    if len(layout) > MAX_PARTS:
        raise EvidenceStoreError(f"{source}: {size} bytes make more than {MAX_PARTS} parts of {part_bytes} bytes")
    digests: dict[int, str] = {}

    def part(number: int) -> Callable[[], str]:
        offset, length = layout[number]
        return lambda: _send_part(bucket, key, upload_id, number, source, offset, length, digests, retrying)

    whole: list[str] = []
    try:
        etags = in_parallel({n: part(n) for n in layout}, concurrency, lambda: whole.append(_sha256(handle, size, source)))
        _check_unchanged(source, before, os.fstat(handle.fileno()))
    except EvidenceStoreError as exc:
        return SentParts("", size, (), {}, exc)
    return SentParts(whole[0], size, tuple(digests[n] for n in sorted(digests)), etags)


def _send_part(bucket: S3Bucket, key: str, upload_id: str, number: int, source: Path, offset: int, length: int,
               digests: dict[int, str], retrying: Callable[[Callable[[], str]], str]) -> str:
    digest = digests[number] = _range_sha256(source, offset, length)
    checksum = checksum_of_hex(digest)

    def send() -> str:
        with RangeReader(source, offset, length, hashing=False) as body:
            return bucket.upload_part(key, upload_id, number, body, checksum)

    return retrying(send)


def _sha256(handle: BinaryIO, size: int, source: Path) -> str:
    """SHA-256 (hex) of the first ``size`` bytes of ``handle``."""
    try:
        return _digest(handle, 0, size, source)
    except OSError as exc:
        raise EvidenceStoreError(f"cannot read {source}: {exc.strerror or exc}") from exc


def _range_sha256(source: Path, offset: int, length: int) -> str:
    try:
        with source.open("rb", buffering=0) as raw:
            return _digest(raw, offset, length, source)
    except OSError as exc:
        raise SourceChanged(f"cannot read {source} again: {exc.strerror or exc}") from exc


def _digest(handle: Any, offset: int, length: int, source: Path) -> str:  # any binary file with readinto
    digest, done = hashlib.sha256(), 0
    view = memoryview(bytearray(_HASH_READ_BYTES))
    handle.seek(offset)
    while done < length and (read := handle.readinto(view[:min(_HASH_READ_BYTES, length - done)])):
        digest.update(view[:read])
        done += read
    if done != length:
        raise SourceChanged(f"{source} shrank while it was uploaded")
    return digest.hexdigest()


def _check_unchanged(source: Path, before: os.stat_result, after: os.stat_result) -> None:
    try:
        now = os.stat(source)
    except OSError as exc:
        raise SourceChanged(f"{source} went away while it was uploaded: {exc.strerror or exc}") from exc
    if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns) or now.st_ino != before.st_ino:
        raise SourceChanged(f"{source} changed while it was uploaded; it is spooled as it is now")


def in_parallel(calls: dict[int, Callable[[], T]], concurrency: int,
                meanwhile: Callable[[], object] = lambda: None) -> dict[int, T]:
    """Run ``calls`` on ``concurrency`` threads and ``meanwhile`` on this one; after a failure start no more calls.

    Raises the first failure (of ``meanwhile`` first) once the calls already running have ended.
    """
    failed = threading.Event()

    def run(call: Callable[[], T]) -> T:
        if failed.is_set():
            raise _NotStarted()
        try:
            return call()
        except BaseException:
            failed.set()
            raise

    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(calls))), thread_name_prefix="s3-part") as pool:
        futures = {number: pool.submit(run, call) for number, call in calls.items()}
        try:
            meanwhile()
        except BaseException:
            failed.set()
            raise
    failures = [f.exception() for f in futures.values() if not isinstance(f.exception(), _NotStarted | None)]
    if failures:
        raise failures[0]  # type: ignore[misc]
    return {number: future.result() for number, future in futures.items()}


class _NotStarted(Exception):
    """A call skipped because an earlier one failed."""


@dataclass
class Started:
    """A multipart upload's id, handed from the thread that uploads to the one that may give up waiting on it."""

    upload_id: str = ""
    given_up: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, upload_id: str) -> bool:
        """Keep the id; False when the waiting side already gave up (and spooled the file without it)."""
        with self.lock:
            if not self.given_up:
                self.upload_id = upload_id
            return not self.given_up

    def give_up(self) -> str:
        """Stop waiting; the id the spool entry should resume, if S3 gave one by now."""
        with self.lock:
            self.given_up = True
            return self.upload_id


@contextlib.contextmanager
def reopened(path: Path, handle: BinaryIO) -> Iterator[BinaryIO]:
    """Another open file description of what ``handle`` reads, with its own offset."""
    try:
        fresh = path.open("rb")
    except OSError:  # renamed or removed meanwhile: the same inode through the process's descriptor
        fresh = open(f"/proc/self/fd/{handle.fileno()}", "rb")  # noqa: SIM115  (closed below)
    with fresh:
        yield fresh
