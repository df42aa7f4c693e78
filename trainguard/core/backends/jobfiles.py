"""Putting files a training job left into an evidence bundle: masked or byte for byte, within budget, safely named.

Every file under an attempt's folder or its run's checkpoint folder is the job's, and the job is
untrusted: each is opened through `trainguard_entrypoint.safefiles` (a regular file of its own,
inside the folder, no link followed, no FIFO waited on), counted against a budget by its apparent
size, stored under a printable name (`safefiles.safe_name` per path segment, the original kept in
the manifest) and, unless it is a core dump or a checkpoint, masked on the way through the one
masker, in bounded memory. What is refused becomes a missing item with the reason. Deciding which
files make up the evidence is the collectors' (``workspace_evidence``, each backend's).
"""

from __future__ import annotations

import codecs
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

from trainguard_entrypoint import safefiles

from trainguard.core import masking

GIB = 1024 ** 3
DEFAULT_EVIDENCE_BUDGET_BYTES = 8 * GIB
DEFAULT_CORE_DUMP_BUDGET_BYTES = 4 * GIB
DEFAULT_LOG_BUDGET_BYTES = 1 * GIB
DEFAULT_CHECKPOINT_COPY_LIMIT_BYTES = 256 * 1024 * 1024
SMALL_FILE_LIMIT_BYTES = 64 * 1024 * 1024  # a report or snapshot file; trainguard's own are a few KiB
DEFAULT_COPY_TIMEOUT_SECONDS = 600.0
_PIECE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Budget:
    """How much of what a job left an attempt's evidence takes, counted by apparent size (``st_size``).

    Attributes:
        total_bytes: Everything copied from the job's folders together (logs, reports, snapshots,
            the newest checkpoint, core dumps). A log over what is left is cut there.
        core_dump_bytes: The core dumps together, within the total; a core over it stays where it is.
        log_bytes: Each log the job writes (the console log, each rank's log, a task's log), within
            the total; a longer one is stored up to there (its tail is in ``crash-tail.txt``).
        checkpoint_bytes: The newest checkpoint (a file, or a folder in all); over it, it stays.
        copy_timeout_seconds: How long one masked copy may take before it is cut.
    """

    total_bytes: int = DEFAULT_EVIDENCE_BUDGET_BYTES
    core_dump_bytes: int = DEFAULT_CORE_DUMP_BUDGET_BYTES
    checkpoint_bytes: int = DEFAULT_CHECKPOINT_COPY_LIMIT_BYTES
    copy_timeout_seconds: float = DEFAULT_COPY_TIMEOUT_SECONDS
    log_bytes: int = DEFAULT_LOG_BUDGET_BYTES

    def __post_init__(self) -> None:
        for name in ("total_bytes", "core_dump_bytes", "checkpoint_bytes", "copy_timeout_seconds", "log_bytes"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"evidence budget {name} must be 0 or more, got {getattr(self, name)!r}")


@dataclass
class Spent:
    """What one attempt's collection has copied so far, by apparent size, overall and per kind."""

    budget: Budget
    total: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)

    def left(self, kind: str, kind_limit: int | None) -> int:
        left = self.budget.total_bytes - self.total
        if kind_limit is not None:
            left = min(left, kind_limit - self.by_kind.get(kind, 0))
        return max(0, left)

    def limit(self, kind_limit: int | None) -> int:
        return self.budget.total_bytes if kind_limit is None else min(kind_limit, self.budget.total_bytes)

    def take(self, kind: str, size: int) -> None:
        self.total += size
        self.by_kind[kind] = self.by_kind.get(kind, 0) + size


class Writer(Protocol):
    """What of a bundle writer (``workspace_evidence.BundleWriter``) a job file is put through."""

    spent: Spent

    def put_file(self, name: str, path: Path, source: str, original: str = "") -> None: ...

    def absent(self, name: str, source: str, reason: str, original: str = "") -> None: ...


def evidence_name(prefix: str, relative: str) -> tuple[str, str]:
    """(printable evidence name, the original name or "" when it is the same) for a job file's relative path."""
    original = f"{prefix}/{relative}" if prefix else relative
    safe = "/".join(safefiles.safe_name(segment) for segment in original.split("/"))
    return safe, ("" if safe == original else original)


def shown(path: Path | str) -> str:
    """A path as messages show it: printable, reversibly."""
    return safefiles.safe_name(os.fspath(path))


@dataclass(frozen=True)
class JobFile:
    """One file to put: where it lies, under which root it must be, and how it is copied.

    Attributes:
        kind: Budget kind ("log", "report", "core", "checkpoint").
        limit_bytes: That kind's own limit (None: only the total).
        masker: Masks it on the way (None: byte for byte, holes kept).
        cut: Over budget it is cut at the budget (a log) instead of left out.
        each_bytes: This one file at most (a log: the budget's ``log_bytes``), whatever its kind has left.
    """

    path: Path
    root: Path
    kind: str
    limit_bytes: int | None = None
    masker: masking.Masker | None = None
    cut: bool = False
    each_bytes: int | None = None


def put(c: Writer, prefix: str, relative: str, source: str, job_file: JobFile) -> None:
    """Put one job file under ``prefix/relative`` (named printably); a refusal becomes a missing item."""
    name, original = evidence_name(prefix, relative)
    try:
        handle = safefiles.open_regular(job_file.path, job_file.root)
    except safefiles.Refused as refused:
        c.absent(name, source, refused.reason, original)
        return
    with handle:
        _put_open(c, name, original, source, job_file, handle)


def _put_open(c: Writer, name: str, original: str, source: str, job_file: JobFile, handle: BinaryIO) -> None:
    size = os.fstat(handle.fileno()).st_size
    left = c.spent.left(job_file.kind, job_file.limit_bytes)
    if job_file.each_bytes is not None and job_file.each_bytes < left:
        left, budget = job_file.each_bytes, f"{job_file.kind} budget of {job_file.each_bytes} bytes a file"
    else:
        budget = f"{job_file.kind} budget ({left} bytes left)"
    where = f"it stays at {shown(job_file.path)}"
    if size > left and not (job_file.cut and job_file.masker is not None):
        c.absent(name, source, f"{size} bytes (apparent size), over the {job_file.kind} budget ({left} bytes left "
                               f"of {c.spent.limit(job_file.limit_bytes)}); {where}", original)
        return
    if job_file.masker is None:
        c.spent.take(job_file.kind, size)
        with _frozen(handle) as path:
            c.put_file(name, path, source, original)
        return
    taken = min(size, left)
    c.spent.take(job_file.kind, taken)
    deadline = time.monotonic() + c.spent.budget.copy_timeout_seconds
    with masked_copy(handle, taken, job_file.masker, deadline) as (path, copied):
        c.put_file(name, path, source, original)
    if copied < size:
        why = "the copy's time bound" if taken == size else f"the {budget}"
        c.absent(f"{name} (cut)", source, f"stored up to byte {copied} of {size} (apparent size): cut at {why}; "
                                         f"the whole file {where}", original)


@contextmanager
def _frozen(handle: BinaryIO) -> Iterator[Path]:
    """A path that opens exactly the file already open (and checked) in ``handle``."""
    proc = Path(f"/proc/self/fd/{handle.fileno()}")
    if proc.exists():
        yield proc
        return
    with tempfile.NamedTemporaryFile(prefix="trainguard-job-file-") as out:  # no /proc: a copy, holes kept
        safefiles.copy(handle, out, keep_holes=True)
        out.flush()
        yield Path(out.name)


@contextmanager
def masked_copy(handle: BinaryIO, size: int, masker: masking.Masker, deadline: float,
                clock: Callable[[], float] = time.monotonic) -> Iterator[tuple[Path, int]]:
    """The first ``size`` bytes of ``handle`` masked into a temporary file, a piece at a time.

    Yields the file's path and how many source bytes it holds (fewer than ``size`` when the
    deadline passed first). Memory stays at a piece and the masker's windows, however long a line.
    """
    decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
    stream, fd, offset = masker.stream(), handle.fileno(), 0
    with tempfile.NamedTemporaryFile(prefix="trainguard-masked-") as out:
        while offset < size and clock() < deadline:
            piece = os.pread(fd, min(_PIECE_BYTES, size - offset), offset)
            if not piece:
                break
            offset += len(piece)
            out.write(stream.feed(decoder.decode(piece)).encode("utf-8", "surrogateescape"))
        rest = stream.feed(decoder.decode(b"", final=True)) + stream.close()
        out.write(rest.encode("utf-8", "surrogateescape"))
        out.flush()
        yield Path(out.name), offset


def log_file(path: Path, root: Path, c: Writer, masker: masking.Masker) -> JobFile:
    """How a log the job writes is put: masked, and cut at the budget's ``log_bytes`` or at what is left."""
    return JobFile(path, root, "log", masker=masker, cut=True, each_bytes=c.spent.budget.log_bytes)


def readable_log(path: Path, root: Path) -> Path | None:
    """``path`` if it is a regular file of the job's inside ``root`` that triage may read; else None."""
    try:
        with safefiles.open_regular(path, root):
            return path
    except OSError:
        return None


def read_small(folder: Path, relative: str, limit_bytes: int) -> bytes | None:
    """At most ``limit_bytes`` + 1 bytes of the job's file at ``relative`` ("/"-separated) under ``folder``:
    a regular file linked once, reached through no link at all (no linked folder on the way either), never
    waited on; None when it is anything else or cannot be read. One byte over says the file is larger."""
    parts = relative.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return None
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
        inner = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=fd)
        os.close(fd)
        fd = inner
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            return None
        return os.read(fd, limit_bytes + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def folders(folder: Path, limit: int) -> list[str]:
    """The names of the folders in ``folder`` that are folders, not links to one, sorted; at most ``limit``
    entries read, so a million entries cost a listing of that many."""
    names: list[str] = []
    try:
        with os.scandir(folder) as entries:
            for seen, entry in enumerate(entries):
                if seen >= limit:
                    break
                try:
                    if entry.is_dir(follow_symlinks=False):
                        names.append(entry.name)
                except OSError:
                    continue
    except OSError:
        return []
    return sorted(names)
