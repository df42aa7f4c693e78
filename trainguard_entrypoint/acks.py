"""Acknowledgements: what the training-side helper vouches for after it saved a checkpoint.

A checkpoint's acknowledgement is ``<checkpoint dir>/.trainguard-acks/<entry name>.json``, written
atomically after the checkpoint itself was renamed into place::

    {"version": 1, "checkpoint": "<top-level entry name>", "step": <optimizer steps completed>,
     "kind": "periodic|notice|just_in_time",
     "files": [{"name": "<path relative to the checkpoint dir>", "size_bytes": int, "sha256": "<hex>"}],
     "saved_by_rank": int, "world_size": int, "written_at": <unix float>,
     "notice": <the notice JSON or null>, "seconds_from_notice": <float or null>,
     "failure": "<why a just-in-time save happened, or null>", "seconds_from_failure": <float or null>}

The helper also keeps ``.trainguard-acks/progress.json`` (`Progress`): the last optimizer step
completed, so "steps lost" is that step minus the step the next attempt resumes from.

The checkpoint folder is the training job's, so everything here reads it as hostile: `read_ack`
returns None for an ack that is absent, a link, a FIFO, huge or not the shape above, and `verify`
says why the files do not match (a name outside the entry, a file replaced by a link, a size or a
digest that differs), never raising; `check` does the same with its hashing held to a deadline.
`AckBrief` is an ack less its file list: what a listing made where the checkpoint lies sends back. Stdlib-only: the helper in the training process writes with
the same code the core reads with.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from trainguard_entrypoint import safefiles
from trainguard_entrypoint.files import write_bytes_atomic

ACK_FORMAT = 1
ACKS_FOLDER = ".trainguard-acks"
PROGRESS_FILE = "progress.json"
KINDS = ("periodic", "notice", "just_in_time")
ACK_LIMIT_BYTES = 4 * 1024 * 1024  # 20,000 listed files fit; a bigger "ack" is not one the helper wrote
MAX_FILES = 20_000
_TEXT_CHARS = 4_000
_REASON_CHARS = 64
# Checkpoints this process compared in full, by the identity of every file (device, inode, size, times)
# and the digests vouched for: looked at again unchanged, they are not read again (`check`).
_MATCHED: dict[tuple[object, ...], None] = {}
_MATCHED_KEPT = 64
# A file changed less than this before it was hashed is not remembered: the kernel's file times tick
# in jiffies, so a rewrite of the same size within one tick would keep every time it had.
_RACY_NS = 2_000_000_000


@dataclass(frozen=True)
class AckFile:
    """One file an acknowledgement vouches for: its name relative to the checkpoint dir, size, SHA-256."""

    name: str
    size_bytes: int
    sha256: str


@dataclass(frozen=True)
class Ack:
    """A parsed acknowledgement (see the module docstring); ``notice`` is the notice as it was given."""

    checkpoint: str
    step: int
    kind: str
    files: tuple[AckFile, ...]
    saved_by_rank: int
    world_size: int
    written_at: float
    notice: dict[str, Any] | None = None
    seconds_from_notice: float | None = None
    failure: str | None = None
    seconds_from_failure: float | None = None
    version: int = ACK_FORMAT

    def to_json(self) -> dict[str, Any]:
        payload = asdict(self)
        payload["files"] = [asdict(f) for f in self.files]
        return {"version": self.version, **{k: v for k, v in payload.items() if k != "version"}}


@dataclass(frozen=True)
class Progress:
    """The last optimizer step the training completed, when, and in which attempt."""

    step: int
    at: float
    attempt: str
    version: int = ACK_FORMAT


@dataclass(frozen=True)
class AckBrief:
    """An acknowledgement less the file list it vouches for (their count and total size instead): what a
    listing made where the checkpoint lies (a pod, on Kubernetes) sends back once it checked the files
    there. Small whatever the checkpoint: a sharded save lists thousands of files."""

    checkpoint: str
    step: int
    kind: str
    files: int
    size_bytes: int
    written_at: float
    seconds_from_notice: float | None = None
    notice_reason: str | None = None
    failure: str | None = None
    seconds_from_failure: float | None = None
    version: int = ACK_FORMAT

    @classmethod
    def of(cls, ack: Ack) -> AckBrief:
        reason = (ack.notice or {}).get("reason")
        return cls(ack.checkpoint, ack.step, ack.kind, len(ack.files), sum(f.size_bytes for f in ack.files),
                   ack.written_at, ack.seconds_from_notice, reason[:_REASON_CHARS] if isinstance(reason, str) else None,
                   ack.failure, ack.seconds_from_failure)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def parse(cls, payload: object, name: str | None = None) -> AckBrief | None:
        """The `AckBrief` in a decoded JSON value, or None when it is not one (of entry ``name``, if given)."""
        if not isinstance(payload, dict) or payload.get("version") != ACK_FORMAT:
            return None
        entry, step, kind = payload.get("checkpoint"), _count(payload.get("step")), payload.get("kind")
        files, size, written = _count(payload.get("files")), _count(payload.get("size_bytes")), _number(
            payload.get("written_at"))
        if (not valid_entry_name(entry) or (name is not None and entry != name) or step is None or kind not in KINDS
                or files is None or size is None or written is None):
            return None
        reason = _text(payload.get("notice_reason"))
        return cls(str(entry), step, str(kind), files, size, written, _number(payload.get("seconds_from_notice")),
                   reason[:_REASON_CHARS] if reason is not None else None, _text(payload.get("failure")),
                   _number(payload.get("seconds_from_failure")))


def acks_folder(checkpoint_dir: Path) -> Path:
    return Path(checkpoint_dir) / ACKS_FOLDER


def ack_path(checkpoint_dir: Path, name: str) -> Path:
    return acks_folder(checkpoint_dir) / f"{name}.json"


def valid_entry_name(name: object) -> bool:
    """Whether ``name`` can be a checkpoint entry: one path component, not a dot-name, printable."""
    return (isinstance(name, str) and 0 < len(name) <= 255 and "/" not in name and "\0" not in name
            and not name.startswith(".") and name.isprintable())


def _confined(name: object, entry: str) -> bool:
    """Whether a listed file name is ``entry`` itself or lies under it, with no `..` or absolute part."""
    if not isinstance(name, str) or not name or "\0" in name or "\\" in name:
        return False
    parts = PurePosixPath(name).parts
    return (not PurePosixPath(name).is_absolute() and parts[0] == entry and ".." not in parts
            and "." not in parts and "/".join(parts) == name)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _text(value: object) -> str | None:
    return value[:_TEXT_CHARS] if isinstance(value, str) else None


def _file(raw: object, entry: str) -> AckFile | None:
    if not isinstance(raw, dict):
        return None
    name, size, digest = raw.get("name"), _count(raw.get("size_bytes")), raw.get("sha256")
    if not _confined(name, entry) or size is None or not isinstance(digest, str) or len(digest) != 64:
        return None
    try:
        int(digest, 16)
    except ValueError:
        return None
    return AckFile(str(name), size, digest.lower())


def parse_ack(payload: object, name: str | None = None) -> Ack | None:
    """The `Ack` in a decoded JSON value, or None when it is not one (of entry ``name``, if given)."""
    if not isinstance(payload, dict) or payload.get("version") != ACK_FORMAT:
        return None
    entry, step, kind = payload.get("checkpoint"), _count(payload.get("step")), payload.get("kind")
    if not valid_entry_name(entry) or (name is not None and entry != name) or step is None or kind not in KINDS:
        return None
    assert isinstance(entry, str)
    raw_files = payload.get("files")
    if not isinstance(raw_files, list) or not 0 < len(raw_files) <= MAX_FILES:
        return None
    files = [_file(raw, entry) for raw in raw_files]
    rank, world, written = _count(payload.get("saved_by_rank")), _count(payload.get("world_size")), _number(
        payload.get("written_at"))
    if any(f is None for f in files) or rank is None or world is None or written is None:
        return None
    notice = payload.get("notice")
    return Ack(
        checkpoint=entry, step=step, kind=str(kind), files=tuple(f for f in files if f is not None),
        saved_by_rank=rank, world_size=world, written_at=written,
        notice=notice if isinstance(notice, dict) else None,
        seconds_from_notice=_number(payload.get("seconds_from_notice")),
        failure=_text(payload.get("failure")), seconds_from_failure=_number(payload.get("seconds_from_failure")),
    )


def _read_json(path: Path, root: Path) -> object:
    try:
        data = safefiles.read_bytes(path, root, limit_bytes=ACK_LIMIT_BYTES)
        return json.loads(data.decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


def read_ack(checkpoint_dir: Path, name: str) -> Ack | None:
    """The acknowledgement of checkpoint entry ``name``; None when absent, unreadable or malformed."""
    if not valid_entry_name(name):
        return None
    return parse_ack(_read_json(ack_path(checkpoint_dir, name), Path(checkpoint_dir)), name)


def read_acks(checkpoint_dir: Path) -> dict[str, Ack]:
    """Every well-formed acknowledgement in the folder, by checkpoint entry name."""
    found: dict[str, Ack] = {}
    for entry in safefiles.walk(acks_folder(checkpoint_dir), Path(checkpoint_dir), max_entries=MAX_FILES, max_depth=0):
        stem = entry.name.removesuffix(".json")
        if entry.kind == safefiles.FILE and entry.name.endswith(".json") and entry.name != PROGRESS_FILE:
            if (ack := read_ack(checkpoint_dir, stem)) is not None:
                found[stem] = ack
    return found


def _digest(path: Path, root: Path) -> tuple[int, str]:
    with safefiles.open_regular(path, root) as handle:
        return os.fstat(handle.fileno()).st_size, safefiles.sha256_of(handle)


@dataclass(frozen=True)
class Checked:
    """What `check` found of a checkpoint against its acknowledgement.

    ``mismatch`` says why its files do not match (None: they match as far as they were checked);
    ``unhashed`` says which digests were not compared and why (the time bound ran out), None when
    every one was; ``hashed_bytes`` is how much was read for the digests.
    """

    mismatch: str | None
    hashed_bytes: int = 0
    unhashed: str | None = None


def verify(checkpoint_dir: Path, ack: Ack) -> str | None:
    """Why the checkpoint's files do not match ``ack`` (one line), or None when every listed file is
    a regular file of that size and SHA-256 and an entry that is a folder holds no file the ack
    does not list. Never raises; compares every byte (see `check`: bounded, and once per process)."""
    return check(checkpoint_dir, ack).mismatch


def check(checkpoint_dir: Path, ack: Ack, *, deadline: float | None = None,
          clock: Callable[[], float] = time.monotonic) -> Checked:
    """`verify`, with the digests held to ``deadline`` (a ``clock`` time). Never raises.

    What it costs: the names and sizes are checked first, for every file (a stat each: a cut-short
    or missing file, a link put in a file's place, is found at once, whatever the checkpoint's
    size); then each file is read once, 1 MiB at a time, into a streaming SHA-256. That is the
    checkpoint's whole size read from its disk: a 10 GB checkpoint takes about 10 s on a local SSD
    and a minute on a network volume at 150 MB/s, so a listing that must answer in time passes a
    ``deadline``; the digests not compared by then are named in ``unhashed``, never counted as a
    mismatch. A checkpoint this process compared in full is not read again while none of its files
    was written, replaced or moved since (same device, inode, size and times, all older than two
    seconds when it was hashed, so a rewrite within one tick of the file clock is never missed).
    """
    root = Path(checkpoint_dir)
    try:
        if (why := _unlisted(root, ack)) is not None:
            return Checked(why)
        seen, started_ns = [], time.time_ns()
        for item in ack.files:  # sizes first: cheap, and what a cut-short save gets wrong
            try:
                with safefiles.open_regular(root / item.name, root) as handle:
                    found = os.fstat(handle.fileno())
            except OSError as exc:
                return Checked(_unreadable(item.name, exc))
            if found.st_size != item.size_bytes:
                return Checked(f"{safefiles.safe_name(item.name)}: {found.st_size} bytes, the acknowledgement says "
                               f"{item.size_bytes}")
            seen.append((item.name, item.sha256, found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns,
                         found.st_ctime_ns))
        signature = (os.path.abspath(root), tuple(seen))
        if signature in _MATCHED:  # every byte compared before, and no file written, replaced or moved since
            return Checked(None)
        checked = _digests(root, ack, deadline, clock)
        settled = all(max(mtime, ctime) < started_ns - _RACY_NS for *_, mtime, ctime in seen)
        if checked.mismatch is None and checked.unhashed is None and settled:
            _remember(signature)
        return checked
    except Exception as exc:  # a folder changing under us is a mismatch, not a crash of the reader
        return Checked(f"{safefiles.safe_name(ack.checkpoint)}: cannot be checked ({type(exc).__name__}: {exc})")


def _remember(signature: tuple[object, ...]) -> None:
    _MATCHED[signature] = None
    try:
        while len(_MATCHED) > _MATCHED_KEPT:
            _MATCHED.pop(next(iter(_MATCHED)), None)
    except RuntimeError:  # another thread's check changed it meanwhile: the next call keeps the bound
        pass


def _digests(root: Path, ack: Ack, deadline: float | None, clock: Callable[[], float]) -> Checked:
    """`check`'s second part: each listed file's SHA-256 against the acknowledgement's, until ``deadline``."""
    hashed = 0
    for index, item in enumerate(ack.files):
        if deadline is not None and clock() >= deadline:
            return Checked(None, hashed, _unhashed(ack, index))
        try:
            with safefiles.open_regular(root / item.name, root) as handle:
                digest, read = _sha256_until(handle, deadline, clock)
        except OSError as exc:
            return Checked(_unreadable(item.name, exc), hashed)
        hashed += read
        if digest is None:
            return Checked(None, hashed, _unhashed(ack, index))
        if read != item.size_bytes:
            return Checked(f"{safefiles.safe_name(item.name)}: changed while it was checked", hashed)
        if digest != item.sha256:
            return Checked(f"{safefiles.safe_name(item.name)}: SHA-256 differs from the acknowledgement's", hashed)
    return Checked(None, hashed)


def _unlisted(root: Path, ack: Ack) -> str | None:
    """Why an entry that is a folder holds more than ``ack`` lists, or None."""
    listed = {f.name for f in ack.files}
    entry = root / ack.checkpoint
    if os.path.isdir(entry) and not os.path.islink(entry):
        for found in safefiles.walk(entry, root, hidden=True):
            relative = f"{ack.checkpoint}/{found.name}"
            if found.kind == "limit":
                return f"{safefiles.safe_name(ack.checkpoint)} holds more files than can be checked"
            if relative not in listed:
                return (f"{safefiles.safe_name(relative)} is in the checkpoint but not in its "
                        f"acknowledgement ({found.kind})")
    return None


def _unreadable(name: str, exc: OSError) -> str:
    return f"{safefiles.safe_name(name)}: {getattr(exc, 'reason', None) or exc.strerror or exc}"


def _unhashed(ack: Ack, index: int) -> str:
    left = ack.files[index:]
    return (f"SHA-256 of {len(left)} of {len(ack.files)} files ({sum(f.size_bytes for f in left)} bytes) not "
            f"compared: the time bound ran out; their sizes match")


def _sha256_until(handle: BinaryIO, deadline: float | None, clock: Callable[[], float]) -> tuple[str | None, int]:
    """The open file's SHA-256 from its start, streamed; (None, bytes read) once ``deadline`` passed."""
    digest, fd, offset = hashlib.sha256(), handle.fileno(), 0
    while chunk := os.pread(fd, safefiles.CHUNK_BYTES, offset):
        digest.update(chunk)
        offset += len(chunk)
        if deadline is not None and clock() >= deadline:
            return None, offset
    return digest.hexdigest(), offset


def describe_files(checkpoint_dir: Path, name: str) -> tuple[AckFile, ...]:
    """The files of checkpoint entry ``name`` (a file or a folder), with sizes and SHA-256, for an ack.

    Raises:
        OSError: It is missing, holds something other than regular files, or cannot be read.
    """
    root = Path(checkpoint_dir)
    entry = root / name
    if os.path.isfile(entry) and not os.path.islink(entry):
        size, digest = _digest(entry, root)
        return (AckFile(name, size, digest),)
    files = []
    for found in safefiles.walk(entry, root, hidden=True):
        if found.kind != safefiles.FILE:
            raise safefiles.Refused(found.kind, found.reason or f"{found.name}: not a regular file")
        size, digest = _digest(Path(found.path), root)
        files.append(AckFile(f"{name}/{found.name}", size, digest))
    if not files:
        raise safefiles.Refused("missing", f"{safefiles.safe_name(name)}: holds no file")
    return tuple(files)


def write_ack(checkpoint_dir: Path, ack: Ack) -> Path:
    """Write ``ack`` atomically (after the checkpoint itself is in place); its path."""
    path = ack_path(checkpoint_dir, ack.checkpoint)
    write_bytes_atomic(path, (json.dumps(ack.to_json(), indent=1) + "\n").encode("utf-8"))
    return path


def write_progress(checkpoint_dir: Path, step: int, attempt: str, at: float | None = None) -> None:
    """Record the last completed optimizer step, atomically (a rename) but without fsync: it is
    rewritten every second from inside the training loop, where a flush to disk would cost a step's
    worth of time, and a machine that crashes loses at most that second of a figure that only counts."""
    payload = {"version": ACK_FORMAT, "step": step, "at": time.time() if at is None else at, "attempt": attempt}
    folder = acks_folder(checkpoint_dir)
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f".{PROGRESS_FILE}.{os.getpid()}.tmp"
    temporary.write_bytes((json.dumps(payload) + "\n").encode())
    os.replace(temporary, folder / PROGRESS_FILE)


def read_progress(checkpoint_dir: Path) -> Progress | None:
    """The progress record, or None when absent or malformed."""
    return parse_progress(_read_json(acks_folder(checkpoint_dir) / PROGRESS_FILE, Path(checkpoint_dir)))


def parse_progress(payload: object) -> Progress | None:
    """The `Progress` in a decoded JSON value, or None when it is not one."""
    if not isinstance(payload, dict) or payload.get("version") != ACK_FORMAT:
        return None
    step, at, attempt = _count(payload.get("step")), _number(payload.get("at")), _text(payload.get("attempt"))
    if step is None or at is None or attempt is None:
        return None
    return Progress(step, at, attempt)
