"""Reading files a training job controls, without being led anywhere else by them.

The training job is untrusted code that writes its attempt's folder: symbolic links to host files,
FIFOs that block a reader forever, endless device files, 10 TB sparse files that cost it nothing,
hard links to files elsewhere, names full of terminal escapes. This reads such a folder on those
terms; deciding *what* to collect is the callers'. Self-contained and stdlib-only (Python 3.11+),
it also runs as prepended source or from the entrypoint zipapp, in a pod with only a Python.

The API (kept stable; the collectors of every backend call it). `open_regular(path, root=None, *,
allow_hardlinks=False)` opens ``path`` only if ``lstat`` says it is a regular file, with
``O_NOFOLLOW | O_NONBLOCK | O_NOCTTY`` (blocking again once open), then checks with ``fstat`` that
the open file is that same regular file, linked once (unless ``allow_hardlinks``), and with a
``root`` that its real path lies inside ``root``'s; `read_bytes` reads a small one whole, up to
``limit_bytes``. `walk(folder, root=None, *, hidden=False, max_entries=MAX_ENTRIES, max_depth=64,
allow_hardlinks=False)` yields every entry under ``folder``, sorted, through ``O_NOFOLLOW``
directory descriptors, so no link is followed: regular files as kind ``"file"``, the rest with
their kind and a reason; past ``max_entries`` (5,000) each folder still open gives one ``"limit"``
entry whose ``left_out`` counts what it did not list, and memory stays at that many names however
many a folder holds. Dot-names are left out unless ``hidden``. `copy(source, dest, *,
budget_bytes=None, timeout_seconds=None, keep_holes=False, truncate=False, digest=None)` copies an
open file by at most the size it had when the copy began: the budget counts apparent size
(``st_size``, what a reader or an upload sees; over it the file is refused, or cut with
``truncate``), ``timeout_seconds`` bounds its wall time, ``keep_holes`` copies only the data
extents (``SEEK_DATA``/``SEEK_HOLE``) and leaves holes as holes in a seekable ``dest``, and
``digest`` is fed every byte the copy stands for. `safe_name` spells a file name printably and
reversibly for keys and messages (``%``, the backslash, every character that is not printable:
control characters, bidi overrides and isolates, zero-width characters, and every byte that is not
UTF-8, as ``%XX`` of their UTF-8 bytes); `original_name` gives the name back. `Refused` is an
``OSError`` with ``kind`` (one of `KINDS`) and ``reason`` (one line, its path spelled with `safe_name`).
"""

from __future__ import annotations

import errno
import hashlib
import heapq
import io
import itertools
import os
import stat
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

FILE = "file"
MAX_ENTRIES = 5_000  # entries a walk lists: a million-file folder the job made costs a listing of this many
KINDS = frozenset({FILE, "symlink", "fifo", "device", "socket", "directory", "hardlink", "outside", "missing",
                   "unreadable", "changed", "budget", "limit", "other"})
CHUNK_BYTES = 1024 * 1024
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = _READ_FLAGS | os.O_DIRECTORY
_ZEROS = bytes(CHUNK_BYTES)


class Refused(OSError):
    """A file that is not read, and why: ``kind`` (one of `KINDS`) and ``reason`` (one line)."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind, self.reason = kind, reason


@dataclass(frozen=True)
class Entry:
    """One entry `walk` met: ``name`` relative to the folder walked ("/"-separated, as on disk: spell it with
    `safe_name` to use it), ``path``, ``kind`` (``"file"`` or why not taken), apparent ``size_bytes`` and
    ``mtime`` of a file, a ``reason`` for the rest, and for a ``"limit"`` entry how many were ``left_out``."""

    name: str
    path: str
    kind: str
    size_bytes: int = 0
    mtime: float = 0.0
    reason: str = ""
    left_out: int = 0


@dataclass(frozen=True)
class Copied:
    """What `copy` did: bytes ``dest`` stands for (holes included), the source's apparent size when the
    copy began, whether it was copied whole, and why not."""

    copied_bytes: int
    size_bytes: int
    complete: bool
    reason: str = ""


def safe_name(name: str) -> str:
    """``name`` with ``%``, ``\\``, unprintable characters and non-UTF-8 bytes as ``%XX``; reversible."""
    if name.isprintable() and "%" not in name and "\\" not in name:
        return name
    pieces: list[str] = []
    for char in name:
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, kept by os.fsdecode as a surrogate
            pieces.append(f"%{code - 0xDC00:02X}")
        elif char in "%\\" or not (char.isprintable() or char == " "):
            pieces.append("".join(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass")))
        else:
            pieces.append(char)
    return "".join(pieces)


def original_name(safe: str) -> str:
    """The name `safe_name` spelled as ``safe`` (bytes that were not UTF-8 as surrogate escapes)."""
    return urllib.parse.unquote(safe, encoding="utf-8", errors="surrogateescape")


_KINDS_BY_TEST = ((stat.S_ISREG, FILE), (stat.S_ISLNK, "symlink"), (stat.S_ISDIR, "directory"),
                  (stat.S_ISFIFO, "fifo"), (stat.S_ISCHR, "device"), (stat.S_ISBLK, "device"), (stat.S_ISSOCK, "socket"))


def _kind_of(mode: int) -> str:
    return next((kind for test, kind in _KINDS_BY_TEST if test(mode)), "other")


_WHAT = {"symlink": "a symbolic link, not followed", "directory": "a directory, not a file",
         "fifo": "a FIFO (named pipe), not read: it could block forever", "socket": "a socket, not read",
         "device": "a device file, not read: it could be endless or have effects", "other": "not a regular file"}


def _refusal(kind: str, path: str, what: str | None = None) -> Refused:
    return Refused(kind, f"{safe_name(path)}: {what or _WHAT.get(kind, kind)}")


def _real_path(fd: int, fallback: str) -> str:
    """The real path of the open ``fd`` (what it is, not what it was called); ``fallback``'s without /proc."""
    try:
        link = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(fallback)
    return link.removesuffix(" (deleted)")


def is_inside(real_path: str, root: str | os.PathLike[str]) -> bool:
    """Whether the real path ``real_path`` is ``root``'s real path or lies under it."""
    base = os.path.realpath(root).rstrip("/") or "/"
    return real_path == base or real_path.startswith(base if base == "/" else base + "/")


def _check_open(fd: int, path: str, before: os.stat_result | None, root: str | os.PathLike[str] | None,
                allow_hardlinks: bool, want_dir: bool = False) -> os.stat_result:
    """Refuse the open ``fd`` unless it is what ``lstat`` saw, of the wanted type, linked once, inside ``root``."""
    info = os.fstat(fd)
    kind = _kind_of(info.st_mode)
    if kind != ("directory" if want_dir else FILE):
        raise _refusal(kind, path)
    if before is not None and (before.st_dev, before.st_ino) != (info.st_dev, info.st_ino):
        raise _refusal("changed", path, "replaced while it was being opened; not read")
    if not want_dir and info.st_nlink > 1 and not allow_hardlinks:
        raise _refusal("hardlink", path, _hardlinks(info.st_nlink))
    if root is not None and not is_inside(_real_path(fd, path), root):
        raise _refusal("outside", path, f"lies outside {safe_name(os.fspath(root))} (through a linked folder); not read")
    return info


def open_regular(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None, *,
                 allow_hardlinks: bool = False) -> io.BufferedReader:
    """Open ``path`` for reading if it is a regular file inside ``root``, never following a link.

    Raises:
        Refused: It is missing, a symbolic link, a FIFO, a device, a socket, a directory, a hard
            link, outside ``root``, or it changed between ``lstat`` and ``open``.
    """
    name = os.fspath(path)
    try:
        before = os.lstat(name)
    except FileNotFoundError:
        raise _refusal("missing", name, "no such file") from None
    except OSError as exc:
        raise _refusal("unreadable", name, f"cannot stat: {exc.strerror or exc}") from None
    if (kind := _kind_of(before.st_mode)) != FILE:
        raise _refusal(kind, name)
    try:
        fd = os.open(name, _READ_FLAGS)
    except OSError as exc:
        raise _refusal("unreadable", name, f"cannot open: {exc.strerror or exc}") from None
    try:  # O_NONBLOCK kept a FIFO swapped in since lstat from blocking the open; fstat tells it
        _check_open(fd, name, before, root, allow_hardlinks)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None, *, limit_bytes: int,
               allow_hardlinks: bool = False) -> bytes:
    """The whole of a small regular file, opened as `open_regular` does; `Refused` when over ``limit_bytes``."""
    with open_regular(path, root, allow_hardlinks=allow_hardlinks) as handle:
        data = handle.read(limit_bytes + 1)
    if len(data) > limit_bytes:
        raise _refusal("budget", os.fspath(path), f"larger than {limit_bytes} bytes; not read")
    return data


def walk(folder: str | os.PathLike[str], root: str | os.PathLike[str] | None = None, *, hidden: bool = False,
         max_entries: int = MAX_ENTRIES, max_depth: int = 64, allow_hardlinks: bool = False) -> Iterator[Entry]:
    """Every entry under ``folder``, sorted, through ``O_NOFOLLOW`` directory descriptors; never raises."""
    top = os.fspath(folder)
    try:
        fd = os.open(top, _DIR_FLAGS)
    except OSError as exc:
        yield _unopened(top, "", exc)
        return
    try:
        _check_open(fd, top, None, root, allow_hardlinks, want_dir=True)
        yield from _Walk(hidden, max_entries, max_depth, allow_hardlinks).folder(fd, top, "", 0)
    except OSError as exc:
        yield Entry("", top, getattr(exc, "kind", "unreadable"), reason=str(exc))
    finally:
        os.close(fd)


def _unopened(path: str, name: str, exc: OSError) -> Entry:
    try:
        kind = _kind_of(os.lstat(path).st_mode)
    except OSError:
        kind = "missing" if isinstance(exc, FileNotFoundError) else "unreadable"
    if kind in ("directory", "unreadable", "missing"):
        return Entry(name, path, "missing" if kind == "missing" else "unreadable",
                     reason=f"{safe_name(path)}: cannot open: {exc.strerror or exc}")
    return Entry(name, path, kind, reason=_refusal(kind, path).reason)


class _Walk:
    def __init__(self, hidden: bool, max_entries: int, max_depth: int, allow_hardlinks: bool) -> None:
        self.hidden, self.left, self.max_depth, self.allow_hardlinks = hidden, max_entries, max_depth, allow_hardlinks
        self.max_entries = max_entries

    def folder(self, fd: int, path: str, prefix: str, depth: int) -> Iterator[Entry]:
        try:
            names, total = self.names(fd)
        except OSError as exc:
            yield Entry(prefix.rstrip("/"), path, "unreadable", reason=f"{safe_name(path)}: cannot list: {exc.strerror or exc}")
            return
        for index, name in enumerate(names):
            full, relative = os.path.join(path, name), prefix + name
            if self.left <= 0:
                left_out = total - index
                yield Entry(relative, full, "limit", left_out=left_out,
                            reason=f"{safe_name(path)}: {left_out} entries from {safe_name(name)} on not listed: "
                                   f"the listing stops at {self.max_entries} entries")
                return
            self.left -= 1
            yield from self.entry(fd, name, full, relative, depth)

    def names(self, fd: int) -> tuple[list[str], int]:
        """The folder's first names, sorted (as many as may still be listed, and one), and how many it has."""
        counter = itertools.count()
        with os.scandir(fd) as listing:  # nsmallest reads them all and keeps that many: bounded memory
            first = heapq.nsmallest(max(0, self.left) + 1, (entry.name for entry in listing if (
                self.hidden or not entry.name.startswith(".")) and next(counter) >= 0))
        return first, next(counter)

    def entry(self, fd: int, name: str, full: str, relative: str, depth: int) -> Iterator[Entry]:
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError as exc:
            yield Entry(relative, full, "unreadable", reason=f"{safe_name(full)}: cannot stat: {exc.strerror or exc}")
            return
        kind = _kind_of(info.st_mode)
        if kind == FILE and info.st_nlink > 1 and not self.allow_hardlinks:
            yield Entry(relative, full, "hardlink", reason=f"{safe_name(full)}: {_hardlinks(info.st_nlink)}")
        elif kind == FILE:
            yield Entry(relative, full, FILE, info.st_size, info.st_mtime)
        elif kind != "directory":
            yield Entry(relative, full, kind, mtime=info.st_mtime, reason=_refusal(kind, full).reason)
        elif depth + 1 > self.max_depth:
            yield Entry(relative, full, "limit", reason=f"{safe_name(full)}: deeper than {self.max_depth} folders; not read")
        else:
            yield from self.child(fd, name, full, relative, info, depth)

    def child(self, parent: int, name: str, full: str, relative: str, before: os.stat_result,
              depth: int) -> Iterator[Entry]:
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            yield _unopened(full, relative, exc)
            return
        try:
            if (before.st_dev, before.st_ino) != (os.fstat(fd).st_dev, os.fstat(fd).st_ino):
                yield Entry(relative, full, "changed", reason=f"{safe_name(full)}: replaced while it was being read")
            else:
                yield from self.folder(fd, full, relative + "/", depth + 1)
        finally:
            os.close(fd)


def _hardlinks(count: int) -> str:
    return f"a file with {count} hard links, not read: it may be a file from outside the attempt's folder"


def _fileno(handle: BinaryIO | int) -> int:
    return handle if isinstance(handle, int) else handle.fileno()


def _data_extents(fd: int, start: int, end: int) -> Iterator[tuple[int, int]]:
    """(offset, length) of each data extent of ``fd`` in [start, end); one extent without SEEK_DATA."""
    offset = start
    while offset < end:
        try:
            data = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:  # ENXIO: a hole from here to the end; otherwise the file system cannot say
            if exc.errno != errno.ENXIO:
                yield offset, end - offset
            return
        if data >= end:
            return
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        yield data, hole - data
        offset = hole


def copy(source: BinaryIO | int, dest: BinaryIO | Any, *, budget_bytes: int | None = None,
         timeout_seconds: float | None = None, keep_holes: bool = False, truncate: bool = False,
         digest: Any = None, clock: Callable[[], float] = time.monotonic) -> Copied:
    """Copy ``source`` (from its start) into ``dest`` (at its start); see the module docstring.

    Raises:
        OSError: Reading or writing failed (what was copied so far stays in ``dest``).
    """
    fd = _fileno(source)
    size = os.fstat(fd).st_size
    limit = size
    if budget_bytes is not None and size > budget_bytes:
        over = f"{size} bytes (apparent size), over the budget of {budget_bytes} bytes"
        if not truncate:
            return Copied(0, size, False, over + "; not copied")
        limit = budget_bytes
    deadline = None if timeout_seconds is None else clock() + timeout_seconds
    written = 0
    extents = _data_extents(fd, 0, limit) if keep_holes else iter([(0, limit)])
    for offset, length in extents:
        if offset > written:
            _skip_hole(dest, written, offset, digest)
            written = offset
        done, stop = _copy_range(fd, dest, offset, length, digest, deadline, clock)
        written += done
        if stop:
            _finish(dest, written, keep_holes)
            why = (f"copy stopped after {timeout_seconds:g}s (its time bound)" if stop == "time"
                   else "the file shrank while it was copied")
            return Copied(written, size, False, f"{why}, at {written} of {size} bytes")
    if written < limit:  # a hole up to the end
        _skip_hole(dest, written, limit, digest)
        written = limit
    _finish(dest, written, keep_holes)
    if limit < size:
        return Copied(written, size, False, f"cut at {limit} of {size} bytes (apparent size): over the budget")
    return Copied(written, size, True)


def _copy_range(fd: int, dest: Any, offset: int, length: int, digest: Any, deadline: float | None,
                clock: Callable[[], float]) -> tuple[int, str]:
    """Copy [offset, offset+length); the bytes done and "" or why it stopped early ("time", "shrank")."""
    done = 0
    while done < length:
        if deadline is not None and clock() > deadline:
            return done, "time"
        chunk = os.pread(fd, min(CHUNK_BYTES, length - done), offset + done)
        if not chunk:
            return done, "shrank"
        dest.write(chunk)
        if digest is not None:
            digest.update(chunk)
        done += len(chunk)
    return done, ""


def _skip_hole(dest: Any, start: int, end: int, digest: Any) -> None:
    """Leave [start, end) a hole in ``dest``; feed the digest the zeros it stands for."""
    if digest is not None:
        for position in range(start, end, CHUNK_BYTES):
            digest.update(_ZEROS[: min(CHUNK_BYTES, end - position)])
    dest.seek(end)


def _finish(dest: Any, written: int, keep_holes: bool) -> None:
    if keep_holes:  # a trailing hole: the size is set without writing it
        dest.flush()
        dest.truncate(written)
        dest.seek(written)


def sha256_of(handle: BinaryIO | int) -> str:
    """The hex SHA-256 of an open file from its start, read in chunks by position (its offset is left alone)."""
    digest, fd, offset = hashlib.sha256(), _fileno(handle), 0
    while chunk := os.pread(fd, CHUNK_BYTES, offset):
        digest.update(chunk)
        offset += len(chunk)
    return digest.hexdigest()

