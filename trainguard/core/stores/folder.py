"""The evidence folder: the evidence-store seam over a local (or mounted) folder, one file per key.

The default store, and the one a full disk threatens: it sets space aside (`reserve`) for the few
small objects that must not be lost. It is also a folder the training job's user can write: an
object is only ever read from a regular file of its own inside the folder (through `safefiles`),
so a link, a FIFO or a hard link put in an object's place is refused, never followed or waited on.
What a key may be, and the seam itself, are ``base``'s.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from trainguard_entrypoint import safefiles

from trainguard.core.stores.base import EvidenceNotFound, EvidenceStoreError, ObjectInfo, StoredItem, validate_key

_CHUNK_BYTES = 1024 * 1024
_PAGE_BYTES = 4096
_OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT)
_MAX_LISTED = 100_000_000  # a listing is bounded by what the folder holds, not by a limit of ours


class LocalEvidenceStore:
    """Evidence in a local (or mounted) folder: one file per key.

    A full disk must not cost the few small objects that say what happened (the manifest, the
    verdict): `reserve` allocates space for a key up front in a hidden file beside it, and a
    write of that key that fails for lack of space shrinks the reserve by what it needs and
    tries once more. What is left is released when the key's last write is done.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*validate_key(key).split("/"))

    def put_bytes(self, key: str, data: bytes) -> StoredItem:
        """Store ``data`` under ``key``: temp file in the same folder, fsync, then ``os.replace``."""
        data = bytes(data)

        def write(out: BinaryIO) -> tuple[str, int]:
            out.write(data)
            return hashlib.sha256(data).hexdigest(), len(data)

        return self._write(key, write, len(data))

    def put_file(self, key: str, path: Path) -> StoredItem:
        """Copy the file at ``path`` to ``key``, atomically: as big as it was when opened, holes kept."""
        try:
            handle = Path(path).open("rb")
            size = os.fstat(handle.fileno()).st_size
        except OSError as exc:
            raise EvidenceStoreError(f"cannot read {path} for {key!r}: {exc.strerror or exc}") from exc

        def write(out: BinaryIO) -> tuple[str, int]:
            digest = hashlib.sha256()
            copied = safefiles.copy(handle, out, keep_holes=True, digest=digest)
            return digest.hexdigest(), copied.copied_bytes

        with handle:
            return self._write(key, write, size)

    def reserve(self, key: str, size_bytes: int) -> None:
        """Allocate ``size_bytes`` for later writes of ``key`` (a hidden file beside it)."""
        path = self._reserve_path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("wb") as handle:
                try:
                    os.posix_fallocate(handle.fileno(), 0, size_bytes)
                except OSError as exc:
                    if exc.errno in _OUT_OF_SPACE:
                        raise
                    handle.write(bytes(size_bytes))  # a file system without fallocate: blocks of zeros
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            _unlink_quietly(str(path))
            raise EvidenceStoreError(f"cannot reserve {size_bytes} bytes for {key!r} under {self.root}: "
                                     f"{exc.strerror or exc}") from exc

    def release(self, key: str) -> None:
        """Delete what is left of ``key``'s reserve."""
        _unlink_quietly(str(self._reserve_path(key)))

    def _reserve_path(self, key: str) -> Path:
        target = self._path(key)
        return target.with_name(f".{target.name}.reserve")

    def _write(self, key: str, write: Callable[[BinaryIO], tuple[str, int]], size_bytes: int) -> StoredItem:
        try:
            return self._write_once(key, write)
        except EvidenceStoreError as exc:
            out_of_space = isinstance(exc.__cause__, OSError) and exc.__cause__.errno in _OUT_OF_SPACE
            if not (out_of_space and self._draw_on_reserve(key, size_bytes)):
                raise
            return self._write_once(key, write)

    def _draw_on_reserve(self, key: str, size_bytes: int) -> bool:
        """Shrink ``key``'s reserve by ``size_bytes`` and a page of slack; whether there was one."""
        path = self._reserve_path(key)
        try:
            left = path.stat().st_size
            os.truncate(path, max(0, left - size_bytes - _PAGE_BYTES))
        except OSError:
            return False
        return True

    def _write_once(self, key: str, write: Callable[[BinaryIO], tuple[str, int]]) -> StoredItem:
        target = self._path(key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        except OSError as exc:
            raise EvidenceStoreError(f"cannot write {key!r} under {self.root}: {exc.strerror or exc}") from exc
        try:
            with os.fdopen(fd, "wb") as out:
                sha256, size = write(out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp_name, target)
        except BaseException as exc:
            _unlink_quietly(tmp_name)
            if isinstance(exc, OSError):
                raise EvidenceStoreError(f"cannot write {key!r} under {self.root}: {exc.strerror or exc}") from exc
            raise
        return StoredItem(key, sha256, size)

    def _open(self, key: str) -> io.BufferedReader:
        """The object under ``key``, opened only if it is a regular file of the store's own."""
        path = self._path(key)
        try:
            return safefiles.open_regular(path, self.root)
        except safefiles.Refused as exc:
            if exc.kind == "missing" or not os.path.lexists(path) or exc.kind == "directory":
                raise EvidenceNotFound(f"no evidence under {key!r} in {self.root}") from exc
            raise EvidenceStoreError(f"{key!r} in {self.root} is not read: {exc.reason}") from exc

    def get_bytes(self, key: str) -> bytes:
        """The object under ``key``; raises `EvidenceNotFound` when there is none."""
        try:
            with self._open(key) as handle:
                return handle.read()
        except OSError as exc:
            raise EvidenceStoreError(f"cannot read {key!r} in {self.root}: {exc.strerror or exc}") from exc

    def exists(self, key: str) -> bool:
        """Whether an object (a regular file, not a folder or a link) exists under ``key``."""
        try:
            return stat.S_ISREG(os.lstat(self._path(key)).st_mode)
        except OSError:
            return False

    def list_keys(self, prefix: str) -> list[str]:
        """Sorted keys starting with ``prefix``: regular files only; in-flight temporary files never listed."""
        start = self.root
        folder_part = prefix.rpartition("/")[0]
        if folder_part:
            start = self.root.joinpath(*validate_key(folder_part).split("/"))
        keys: list[str] = []
        for entry in safefiles.walk(start, self.root, max_entries=_MAX_LISTED):
            if entry.kind == safefiles.FILE:
                key = (Path(entry.path)).relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def describe(self, key: str = "") -> str:
        """The folder or file path for ``key`` (the store's root for "")."""
        key = key.rstrip("/")  # a prefix such as "runs/r1/" names a folder here
        return str(self._path(key)) if key else str(self.root)

    def head(self, key: str) -> ObjectInfo:
        """The file's size; a folder keeps no checksum, so verifying means reading."""
        with self._open(key) as handle:
            return ObjectInfo(key, os.fstat(handle.fileno()).st_size, "")

    def read_chunks(self, key: str) -> Iterator[bytes]:
        """The file in 1 MiB chunks."""
        with self._open(key) as handle:
            yield from _chunks(handle)

    def delete(self, key: str) -> None:
        """Remove the file and the folders it leaves empty (up to the root)."""
        path = self._path(key)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise EvidenceStoreError(f"cannot delete {key!r} in {self.root}: {exc.strerror or exc}") from exc
        for folder in path.parents:
            if folder == self.root or not folder.is_relative_to(self.root):
                break
            try:
                folder.rmdir()
            except OSError:
                break  # not empty

    def link(self, key: str, expires_seconds: int) -> str:
        """A ``file://`` URL: a folder needs no expiry."""
        return self._path(key).as_uri()


def _chunks(handle: BinaryIO) -> Iterator[bytes]:
    while chunk := handle.read(_CHUNK_BYTES):
        yield chunk


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
