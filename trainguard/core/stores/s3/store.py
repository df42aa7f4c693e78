"""The S3 store: the evidence-store protocol over a bucket, with a local spool for what S3 did not take.

While S3 answers, a write goes straight up: a small one as one PUT, a file as a multipart upload
whose parts are sent in parallel while the file is read (``direct``), each with its SHA-256 for
S3 to check, encrypted server-side; nothing is copied. Transient failures are retried with backoff;
a permanent one (403, no such bucket) stops at once. A write S3 did not take is spooled on local
disk (``spool``) with its multipart upload's id, and so is every later write of this store, in
order: an attempt's manifest, written last, reaches the bucket last, so a bundle with a manifest is
complete. The write succeeds either way: `pending` says what waits, `last_error` why, and `flush`
uploads it later, part by part.

An attempt holds its store's uploads while it collects (`hold`): every write is spooled, which
also freezes what the platform is about to delete, and the attempt judges itself from that local
copy. Only after its verdict does `upload_held` send the run's spooled writes up, so neither the
classification nor the retry decision ever waits on S3.

A time budget bounds how long one store object waits on S3, strictly: each upload runs in its own
thread, and a request S3 has not answered when the budget is spent is left behind (its result
dropped) while the write is spooled. Before a write goes up, the spooled writes of the same run
(``runs/{run id}/``) go first, and only those: another run's backlog waits for `flush` or for
that run's next write, so one attempt never spends its budget on another's evidence.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from trainguard.core import retrying
from trainguard.core.stores.s3 import direct
from trainguard.core.stores.s3.bucket import S3Bucket, S3Permanent, S3Transient
from trainguard.core.stores.s3.resume import SpoolUploader
from trainguard.core.stores.s3.spool import TAG, Spool, SpoolEntry, part_bytes_for, s3_checksum, same_checksum
from trainguard.core.stores.base import (
    EvidenceNotFound, EvidenceStoreError, FlushResult, ObjectInfo, StoredItem, checksum_of_hex, validate_key,
)

T = TypeVar("T")


@dataclass(frozen=True)
class UploadPolicy:
    """How hard and how long to try.

    Attributes:
        attempts: Tries per S3 request before a transient error stops the upload.
        base_delay_seconds: The first backoff; it doubles per retry up to ``max_delay_seconds``.
        max_delay_seconds: The longest backoff.
        budget_seconds: Longest time one store object waits on S3, from its first upload; None = no limit.
        part_bytes: Multipart part size (at least 5 MiB; grown for objects over 10,000 parts).
        concurrency: Parts in flight at once; memory is about ``concurrency x part_bytes``.
    """

    attempts: int = 5
    base_delay_seconds: float = 0.5
    max_delay_seconds: float = 8.0
    budget_seconds: float | None = 300.0
    part_bytes: int = 8 * 1024 * 1024
    concurrency: int = 10


class BudgetSpent(S3Transient):
    """The upload time budget ran out, possibly with a request S3 had not answered yet."""


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
        self._held = False  # spool every write without sending it (`hold`)
        self._uploader = SpoolUploader(bucket, spool, policy.concurrency, self._retrying, self._check_budget,
                                       lambda full: self.describe(self._short(full)))

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
            if not self._held:
                self._drain(self._scope(full))
            return self._stored(key, entry)
        return self._put_small(key, data) if self._uploading(full) else self._stored(key, self.spool.add_bytes(full, data))

    def _put_small(self, key: str, data: bytes) -> StoredItem:
        full, digest = self._full(key), hashlib.sha256(data).hexdigest()
        try:
            self._bounded(lambda: self._uploader.put_object(full, data, digest, {}))
        except EvidenceStoreError as exc:
            return self._spooled_after(exc, key, self.spool.add_bytes(full, data))
        return StoredItem(key, digest, len(data), checksum_of_hex(digest))

    def put_file(self, key: str, path: Path) -> StoredItem:
        """Upload the file (hashing it on the way), or spool a copy of what S3 did not take."""
        full, path = self._full(key), Path(path)
        try:
            handle = path.open("rb")
        except OSError as exc:
            raise EvidenceStoreError(f"cannot read {path} for {key!r}: {exc.strerror or exc}") from exc
        with handle:
            if not self._uploading(full):
                try:
                    return self._stored(key, self.spool.add_open_file(full, handle))
                except EvidenceStoreError:
                    if not self._held or self._stopped:
                        raise
                    # held, and no room in the spool for it (a core dump larger than the local disk):
                    # straight to S3 then, within the budget, rather than not at all
                    self._start_budget()
                    handle.seek(0)
            size, most = os.fstat(handle.fileno()).st_size, self.policy.part_bytes
            if size <= most and len(data := handle.read(most + 1)) <= most:  # it may have grown since
                return self._put_small(key, data)
            return self._put_parts(key, path, handle, part_bytes_for(size, self.policy.part_bytes))

    def _put_parts(self, key: str, path: Path, handle: BinaryIO, part_bytes: int) -> StoredItem:
        """A multipart upload sent while the file is read; on failure the file is spooled with the upload's id."""
        full, started = self._full(key), direct.Started()
        try:
            sent, checksum = self._bounded(lambda: self._send_file(full, path, handle, part_bytes, started))
        except EvidenceStoreError as exc:
            upload_id = started.give_up() if isinstance(exc, BudgetSpent) else started.upload_id
            if isinstance(exc, BudgetSpent):  # the upload may still be reading `handle`: spool from another
                with direct.reopened(path, handle) as fresh:
                    return self._spooled_after(exc, key, self.spool.add_open_file(full, fresh, upload_id=upload_id))
            if upload_id and isinstance(exc, (direct.SourceChanged, S3Permanent)):  # no use to a resume
                self._abort_quietly(full, upload_id)
                upload_id = ""
            return self._spooled_after(exc, key, self.spool.add_open_file(full, handle, upload_id=upload_id))
        return StoredItem(key, sent.sha256, sent.size_bytes, checksum)

    def _send_file(self, full: str, path: Path, handle: BinaryIO, part_bytes: int,
                   started: direct.Started) -> tuple[direct.SentParts, str]:
        upload_id = self._retrying(lambda: self.bucket.create_multipart_upload(full, {}))
        if not started.record(upload_id):  # given up on meanwhile, and spooled without this id: nobody's upload
            self._abort_quietly(full, upload_id)
            raise self._spent()
        handle.seek(0)
        sent = direct.send_parts(self.bucket, full, upload_id, path, handle, part_bytes, self.policy.concurrency,
                                   self._retrying)
        checksum = s3_checksum(sent.part_sha256, True)
        if sent.error:
            raise sent.error
        parts = [(n, sent.etags[n], checksum_of_hex(digest)) for n, digest in enumerate(sent.part_sha256, 1)]
        stored = self._retrying(lambda: self.bucket.complete_multipart_upload(full, upload_id, parts))
        if stored and not same_checksum(stored, checksum):
            raise S3Permanent(f"{self.describe(self._short(full))}: S3 stored checksum {stored}, expected {checksum}")
        return sent, checksum

    def _abort_quietly(self, full: str, upload_id: str) -> None:
        with contextlib.suppress(EvidenceStoreError):  # else the lifecycle rule aborts it after 7 days
            self.bucket.abort_multipart_upload(full, upload_id)

    def _spooled_after(self, exc: EvidenceStoreError, key: str, entry: SpoolEntry) -> StoredItem:
        self._stopped, self.last_error = True, str(exc)
        return self._stored(key, entry)

    def _uploading(self, full: str) -> bool:
        """Whether a write of ``full`` may go straight up (once its run's spooled writes went first)."""
        if self._held:
            return False
        self._drain(self._scope(full))
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
        if self._uploading(full):
            try:
                skip = {entry.key for entry in spooled}
                return len(spooled) + self._bounded(lambda: self._uploader.tag_stored(full, tags, skip))
            except EvidenceStoreError as exc:
                self._stopped, self.last_error = True, str(exc)
        self.spool.add_tags(full, tags)
        return len(spooled)

    def spool_location(self) -> str:
        """The spool's folder on this machine."""
        return str(self.spool.root)

    def get_lifecycle(self) -> list[dict[str, Any]]:
        """The bucket's lifecycle rules (this prefix's and any others)."""
        return self.bucket.get_lifecycle()

    def put_lifecycle(self, rules: list[dict[str, Any]]) -> None:
        """Replace the bucket's lifecycle rules."""
        self.bucket.put_lifecycle(rules)

    def hold(self) -> None:
        """Spool every write from now on without sending it, until `upload_held`."""
        self._held = True

    def upload_held(self, prefix: str, wait_seconds: float = 0.0) -> FlushResult:
        """Stop holding and send what waits under ``prefix`` (a run's ``runs/{run id}/``), within the budget.

        ``wait_seconds`` is how long to wait for another upload of the same spool (an earlier
        attempt's, still going) to finish first, instead of leaving these writes to `flush`.
        """
        self._held = False
        self._start_budget()
        wait = wait_seconds if self._deadline is None else min(wait_seconds, self._deadline - self._clock())
        return self._drain(self.prefix + prefix, max(0.0, wait))

    def flush(self) -> FlushResult:
        """Upload everything spooled, oldest first, however long ago it was spooled."""
        self._stopped, self.last_error = False, ""
        return self._drain("")

    # -- uploading -------------------------------------------------------------------------------

    def _drain(self, scope: str, wait_seconds: float = 0.0) -> FlushResult:
        """Upload what waits in the spool under the full key prefix ``scope``, oldest first."""
        uploaded: list[str] = []
        self._start_budget()
        if not self._stopped:
            with self.spool.uploading(wait_seconds) as ours:
                if ours:
                    uploaded = self._upload_pending(scope)
                elif any(entry.key.startswith(scope) for entry in self.spool.pending()):
                    # ours wait behind another uploader: later writes queue after them, in order
                    self._stopped = True
                    self.last_error = ("another upload of this spool is under way; these writes go up with "
                                       "the run's next write or `trainguard evidence flush`")
        return FlushResult(tuple(uploaded), tuple(self.pending()), self.last_error)

    def _upload_pending(self, scope: str) -> list[str]:
        pending = [entry for entry in self.spool.pending() if entry.key.startswith(scope)]
        newest = {entry.key: entry.seq for entry in pending}
        uploaded: list[str] = []
        for entry in pending:
            if newest[entry.key] != entry.seq:  # rewritten later: only the newest write goes up
                self.spool.done(entry)
                continue
            try:
                self._bounded(lambda: self._uploader.upload(entry))  # noqa: B023  (called before the next turn)
            except EvidenceStoreError as exc:
                self._stopped, self.last_error = True, str(exc)
                break
            self.spool.done(entry)
            uploaded.append(self._short(entry.key))
        return uploaded

    def _scope(self, full: str) -> str:
        """The spooled writes that must reach S3 before ``full``: its run's (``runs/{run id}/``), else its own."""
        parts = self._short(full).split("/", 2)
        return f"{self.prefix}runs/{parts[1]}/" if len(parts) == 3 and parts[0] == "runs" else full

    def _bounded(self, call: Callable[[], T]) -> T:
        """``call``, waited on until the budget is spent and then left behind (`BudgetSpent`)."""
        if self._deadline is None:
            return call()
        try:
            return retrying.call_within(call, self._deadline - self._clock())
        except retrying.CallTimedOut:
            raise self._spent() from None

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

    def _start_budget(self) -> None:
        """The budget runs from this store's first upload."""
        if self._deadline is None and self.policy.budget_seconds is not None:
            self._deadline = self._clock() + self.policy.budget_seconds

    def _check_budget(self) -> None:
        if self._deadline is not None and self._clock() >= self._deadline:
            raise self._spent()

    def _spent(self) -> BudgetSpent:
        return BudgetSpent(f"{self.describe()}: the upload time budget ({self.policy.budget_seconds:g} s) is spent; "
                           "the rest stays spooled for `trainguard evidence flush` or the run's next attempt")


def _tag_label(tags: Mapping[str, str]) -> str:
    return "(tags " + ", ".join(f"{k}={v}" for k, v in tags.items()) + ")"
