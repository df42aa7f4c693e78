"""The local spool: evidence waits here, on disk, until the object store has taken it.

Every write to a remote store lands in the spool first, in order: a data file and, written after
it, a JSON record (key, SHA-256, size, part layout, S3 checksum, tags, a multipart upload id once
one is started). A record's presence means its data is whole; a data file without a record is
the remains of a crash and is swept. Entries leave the spool only once uploaded, in the order they
came (so an attempt's manifest, written last, is uploaded last). Besides object writes, an entry
can be a tagging to apply to every object under a prefix (an attempt's outcome tags, decided while
S3 was away). The spool folder may be writable by a training job (it runs as the flow's user): a
spool file is only ever read, and a lock only opened, if it is a regular file of the spool's own
(through `safefiles`), so a link or a FIFO planted there is refused, never uploaded or waited on.
Uploading is ``store``'s job.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import io
import json
import os
import stat
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, BinaryIO, Protocol

from trainguard_entrypoint import safefiles

from trainguard.core.stores.base import EvidenceStoreError, checksum_of_hex

MIN_PART_BYTES = 5 * 1024 * 1024  # S3's smallest part but the last
MAX_PARTS = 10_000  # S3's most parts per upload
_COPY_BYTES = 1024 * 1024
_SEND_READ_BYTES = 64 * 1024
_SEND_BUFFER_BYTES = 256 * 1024
_MAX_RECORD_BYTES = 16 * 1024 * 1024  # a record lists at most 10,000 part digests
_LOCK_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
PUT, TAG = "put", "tag"


@dataclass(frozen=True)
class SpoolEntry:
    """One spooled write: what to upload, and enough to check it byte for byte."""

    seq: int
    key: str
    sha256: str
    size_bytes: int
    part_bytes: int  # the object is one PUT when size_bytes <= part_bytes, else parts of this size
    part_sha256: tuple[str, ...]  # hex digest of each part (one entry for a single PUT)
    tags: Mapping[str, str] = field(default_factory=dict)
    upload_id: str = ""
    spooled_at: str = ""
    op: str = PUT  # PUT: upload the data to ``key``; TAG: set ``tags`` on every object under the prefix ``key``

    @property
    def multipart(self) -> bool:
        return self.size_bytes > self.part_bytes

    @property
    def checksum_sha256(self) -> str:
        """The checksum S3 will report: base64 SHA-256, or base64 SHA-256 of the part digests + ``-N``."""
        return s3_checksum(self.part_sha256, self.multipart)


def s3_checksum(part_sha256: tuple[str, ...], multipart: bool) -> str:
    """S3's ``ChecksumSHA256`` for an object with these part digests (composite when multipart)."""
    if not multipart:
        return base64.b64encode(bytes.fromhex(part_sha256[0])).decode()
    joined = b"".join(bytes.fromhex(digest) for digest in part_sha256)
    return f"{base64.b64encode(hashlib.sha256(joined).digest()).decode()}-{len(part_sha256)}"


def same_checksum(stored: str, expected: str) -> bool:
    """Whether S3's stored checksum is the expected one.

    S3 spells a multipart object's composite checksum ``base64-N`` in HeadObject but plain
    ``base64`` in GetObjectAttributes (and some S3-compatible stores always do): compare the digests.
    """
    return stored.split("-", 1)[0] == expected.split("-", 1)[0]


def part_bytes_for(size_bytes: int, preferred_bytes: int) -> int:
    """The part size for an object: ``preferred_bytes`` (at least 5 MiB), doubled until ≤ 10,000 parts."""
    part = max(MIN_PART_BYTES, preferred_bytes)
    while size_bytes > part * MAX_PARTS:
        part *= 2
    return part


class Spool:
    """A folder of pending uploads for one bucket."""

    def __init__(self, root: Path, preferred_part_bytes: int = 8 * 1024 * 1024) -> None:
        self.root = Path(root).absolute()
        self.preferred_part_bytes = preferred_part_bytes

    def _folder(self) -> Path:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise EvidenceStoreError(f"cannot create the spool folder {self.root}: {exc.strerror or exc}") from exc
        return self.root

    def add_open_file(self, key: str, handle: BinaryIO, tags: Mapping[str, str] | None = None,
                      upload_id: str = "") -> SpoolEntry:
        """Copy an open file from its start; ``upload_id`` names a multipart upload of it already under way."""
        handle.seek(0)
        return self._add(key, handle, os.fstat(handle.fileno()).st_size, tags or {}, upload_id=upload_id)

    def add_bytes(self, key: str, data: bytes, tags: Mapping[str, str] | None = None) -> SpoolEntry:
        """Queue ``data`` for ``key``."""
        return self._add(key, io.BytesIO(data), len(data), tags or {})

    def add_tags(self, prefix: str, tags: Mapping[str, str]) -> SpoolEntry:
        """Queue setting ``tags`` on every object under ``prefix`` (in order with the writes around it)."""
        return self._add(prefix, io.BytesIO(b""), 0, tags, op=TAG)

    def _add(self, key: str, source: BinaryIO, expected_size: int, tags: Mapping[str, str], upload_id: str = "",
             op: str = PUT) -> SpoolEntry:
        folder = self._folder()
        part = part_bytes_for(expected_size, self.preferred_part_bytes)
        try:
            fd, tmp = tempfile.mkstemp(prefix=".incoming-", dir=folder)
        except OSError as exc:
            raise EvidenceStoreError(f"cannot write to the spool {folder}: {exc.strerror or exc}") from exc
        try:
            with os.fdopen(fd, "wb") as out:
                whole, parts, size = _copy_hashing(source, out, part)
                out.flush()
                os.fsync(out.fileno())
            if size > part * MAX_PARTS:  # the source grew while we copied it
                part = part_bytes_for(size, self.preferred_part_bytes)
                parts = _part_digests(Path(tmp), part)
            with self._lock():
                seq = self._next_seq()
                os.replace(tmp, folder / f"{seq:012d}.data")
                entry = SpoolEntry(seq, key, whole, size, part, parts, dict(tags), upload_id,
                                   spooled_at=datetime.now(UTC).isoformat(), op=op)
                self._write_record(entry)
        except OSError as exc:
            _unlink(tmp)
            raise EvidenceStoreError(f"cannot spool {key!r} in {folder}: {exc.strerror or exc}") from exc
        except BaseException:
            _unlink(tmp)
            raise
        return entry

    def _next_seq(self) -> int:
        seqs = [int(p.name.split(".")[0]) for p in self.root.glob("*.data") if p.name.split(".")[0].isdigit()]
        return max(seqs, default=0) + 1

    def _write_record(self, entry: SpoolEntry) -> None:
        payload = json.dumps({**asdict(entry), "part_sha256": list(entry.part_sha256)}, indent=1)
        fd, tmp = tempfile.mkstemp(prefix=".record-", dir=self.root)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.root / f"{entry.seq:012d}.json")

    def update(self, entry: SpoolEntry, **changes: str) -> SpoolEntry:
        """Record a change to a pending entry (e.g. the upload id of its multipart upload)."""
        updated = replace(entry, **changes)  # type: ignore[arg-type]
        self._write_record(updated)
        return updated

    def pending(self) -> list[SpoolEntry]:
        """Whole entries still to upload, oldest first."""
        if not self.root.is_dir():
            return []
        entries = []
        for record in sorted(self.root.glob("*.json")):
            try:
                data = json.loads(safefiles.read_bytes(record, self.root, limit_bytes=_MAX_RECORD_BYTES))
                data["part_sha256"] = tuple(data["part_sha256"])
                entries.append(SpoolEntry(**data))
            except (OSError, ValueError, TypeError, KeyError, RecursionError):
                continue  # a record another process is finishing right now, or a foreign file
        return entries

    def newest(self, key: str) -> SpoolEntry | None:
        """The latest pending write of ``key``, if any."""
        found = [entry for entry in self.pending() if entry.key == key and entry.op == PUT]
        return found[-1] if found else None

    def data_path(self, entry: SpoolEntry) -> Path:
        return self.root / f"{entry.seq:012d}.data"

    def read(self, entry: SpoolEntry, offset: int = 0, length: int | None = None) -> bytes:
        """``length`` bytes of an entry's data from ``offset`` (all of it by default)."""
        with open_spooled(self.data_path(entry), self.root) as handle:
            handle.seek(offset)
            return handle.read(entry.size_bytes - offset if length is None else length)

    def open_range(self, entry: SpoolEntry, offset: int, length: int) -> RangeReader:
        """A file-like view of ``length`` bytes of an entry's data from ``offset``, read as it is sent."""
        return RangeReader(self.data_path(entry), offset, length, root=self.root)

    def range_sha256(self, entry: SpoolEntry, offset: int, length: int) -> str:
        """SHA-256 (hex) of a range of an entry's data, read in 1 MiB chunks."""
        digest = hashlib.sha256()
        with self.open_range(entry, offset, length) as reader:
            while chunk := reader.read(_COPY_BYTES):
                digest.update(chunk)
        return digest.hexdigest()

    def chunks(self, entry: SpoolEntry) -> Iterator[bytes]:
        with open_spooled(self.data_path(entry), self.root) as handle:
            while chunk := handle.read(_COPY_BYTES):
                yield chunk

    def done(self, entry: SpoolEntry) -> None:
        """Forget an uploaded entry: its record first, so a crash never leaves a record without data."""
        _unlink(str(self.root / f"{entry.seq:012d}.json"))
        _unlink(str(self.data_path(entry)))

    def sweep(self) -> None:
        """Remove data files whose record was never written (a crash mid-spool)."""
        recorded = {p.name.split(".")[0] for p in self.root.glob("*.json")}
        for data in self.root.glob("*.data"):
            if data.name.split(".")[0] not in recorded:
                _unlink(str(data))

    @contextmanager
    def _lock(self) -> Iterator[None]:
        with _lock_file(self._folder() / "lock") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @contextmanager
    def uploading(self, wait_seconds: float = 0.0) -> Iterator[bool]:
        """Hold the right to upload (one uploader per spool at a time, in this process or another).

        Yields False when another uploader still holds it after ``wait_seconds``.
        """
        with _lock_file(self._folder() / "upload.lock") as handle:
            if not _lock_within(handle, wait_seconds):
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def open_spooled(path: Path, root: Path, buffering: int = io.DEFAULT_BUFFER_SIZE) -> io.BufferedReader:
    """A spool file opened for reading, only if it is a regular file of the spool's own (never a link or a FIFO)."""
    try:
        handle = safefiles.open_regular(path, root)
    except safefiles.Refused as exc:
        raise EvidenceStoreError(f"spooled data is not read: {exc.reason}") from exc
    return io.BufferedReader(handle.detach(), buffering)


def _lock_file(path: Path) -> IO[bytes]:
    """A lock file opened without following a link or waiting on a FIFO (refused unless a regular file)."""
    try:
        fd = os.open(path, _LOCK_FLAGS, 0o600)
    except OSError as exc:
        raise EvidenceStoreError(f"cannot open the spool's lock {safefiles.safe_name(str(path))}: "
                                 f"{exc.strerror or exc} (a link or a FIFO in its place is not used)") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise EvidenceStoreError(f"the spool's lock {safefiles.safe_name(str(path))} is not a regular file; remove it")
    return os.fdopen(fd, "ab")


def _lock_within(handle: IO[bytes], wait_seconds: float) -> bool:
    """Take an exclusive flock on ``handle``, trying for up to ``wait_seconds``; whether it was taken."""
    deadline, delay = time.monotonic() + wait_seconds, 0.01
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() + delay > deadline:
                return False
            time.sleep(delay)  # flock has no timed wait; back off up to a quarter second
            delay = min(0.25, delay * 2)


class RangeReader(io.RawIOBase):
    """A seekable, sized, read-only window onto part of a file, so a part streams from disk."""

    def __init__(self, path: Path, offset: int, length: int, hashing: bool = True, root: Path | None = None) -> None:
        super().__init__()
        # a 256 KiB buffer answers the sender's 16 KiB reads without a system call each: every call
        # hands the GIL to another sending thread and waits to get it back
        self._file = (path.open("rb", buffering=_SEND_BUFFER_BYTES) if root is None  # a file of trainguard's own
                      else open_spooled(path, root, _SEND_BUFFER_BYTES))
        self._start, self._length, self._pos = offset, length, 0
        self._file.seek(offset)
        self._digest, self._hashed, self._hashing = hashlib.sha256(), 0, hashing
        self.read_sha256 = ""  # SHA-256 (hex) of the window, once it has been read from start to end

    def _hash(self, data: bytes) -> None:
        """Hash what is read in one straight pass, so checking costs no extra read."""
        if self._hashing and self._pos == self._hashed:
            self._digest.update(data)
            self._hashed += len(data)
            if self._hashed == self._length and not self.read_sha256:
                self.read_sha256 = self._digest.hexdigest()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def __len__(self) -> int:
        return self._length

    def read(self, size: int | None = -1) -> bytes:
        remaining = self._length - self._pos
        # Short reads of at most 64 KiB: buffers this small are reused by the allocator, where
        # 1 MiB ones (botocore asks for that much) left each sending thread's heap holding its own
        wanted = remaining if size is None or size < 0 else min(size, remaining, _SEND_READ_BYTES)
        data = self._file.read(wanted) if wanted > 0 else b""
        self._hash(data)
        self._pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, min(self._length, base + offset))
        self._file.seek(self._start + self._pos)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        self._file.close()
        super().close()


def _copy_hashing(source: BinaryIO, out: _Sink, part_bytes: int) -> tuple[str, tuple[str, ...], int]:
    """Copy, returning the whole SHA-256, each part's SHA-256 and the size."""
    whole, part, parts = hashlib.sha256(), hashlib.sha256(), []
    size = in_part = 0
    while chunk := source.read(min(_COPY_BYTES, part_bytes - in_part)):
        out.write(chunk)
        whole.update(chunk)
        part.update(chunk)
        size += len(chunk)
        in_part += len(chunk)
        if in_part == part_bytes:
            parts.append(part.hexdigest())
            part, in_part = hashlib.sha256(), 0
    if in_part or not parts:
        parts.append(part.hexdigest())
    return whole.hexdigest(), tuple(parts), size


def _part_digests(path: Path, part_bytes: int) -> tuple[str, ...]:
    with path.open("rb") as handle:
        return _copy_hashing(handle, _Discard(), part_bytes)[1]


class _Sink(Protocol):
    def write(self, data: bytes, /) -> int: ...


class _Discard:
    def write(self, data: bytes, /) -> int:
        return len(data)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
