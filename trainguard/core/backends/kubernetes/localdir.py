"""The folder on the flow's machine where a Kubernetes attempt's triage facts and nodes' files are kept.

The pods and their logs go with the Job, so collection keeps what triage reads (`triage.json`, the
attempt's log, each node's folder and `attempt.json`) on this machine, and triage reads it back.
Whoever can write that folder chooses the verdict, and what is kept there can hold a job's
secrets, so it is private: by default `trainguard-kube-<uid>` in the temporary folder, created
mode 0700; the Kubernetes block's `local_root` may name another. A root that is a link, not a
folder, not this user's, or that others may write (or read, for the default) is refused with one
line that says how to fix it. Below it, folders are made 0700 and files written 0600, never
through a link.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_CHUNK = 1024 * 1024


class UnsafeFolder(OSError):
    """The folder for triage facts may not be used; the message says why and how to fix it (one line)."""


def default_root() -> Path:
    """This user's own folder in the temporary folder (`TMPDIR`)."""
    return Path(tempfile.gettempdir()) / f"trainguard-kube-{os.getuid()}"


def private_root(configured: str | None) -> Path:
    """The root folder, made if absent (0700) and checked as the module says.

    Raises:
        UnsafeFolder: It is a link, not a folder, another user's, or open to others.
    """
    root = Path(configured) if configured else default_root()
    if configured:
        root.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(root)
    fix = ("set the Kubernetes block's local_root to a folder of your own" if not configured
           else "give local_root a folder of your own that only you may write")
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UnsafeFolder(f"{root} is not a folder but a {'symbolic link' if stat.S_ISLNK(info.st_mode) else 'file'}:"
                           f" triage facts are not kept through it; {fix}")
    if info.st_uid != os.getuid():
        raise UnsafeFolder(f"{root} belongs to uid {info.st_uid}, not to this user (uid {os.getuid()}): "
                           f"its triage facts could be anyone's; {fix}")
    open_to = 0o022 if configured else 0o077
    if info.st_mode & open_to:
        raise UnsafeFolder(f"{root} is open to others (mode {stat.S_IMODE(info.st_mode):o}): its triage facts could "
                           f"be changed or read; chmod 700 {root}, or {fix}")
    return root


def make_dirs(folder: Path, root: Path) -> None:
    """Make ``folder`` and its parents below ``root`` (0700), refusing any that is a link or not a folder."""
    path = root
    for part in folder.relative_to(root).parts:
        if part in ("..", "."):
            raise UnsafeFolder(f"{folder} leaves {root}: nothing is kept there")
        path = path / part
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                raise UnsafeFolder(f"{path} is not a folder but a link or a file: nothing is kept through it") from None


def ensure_private(folder: Path) -> None:
    """Make ``folder`` if absent (0700) and check that it is a folder of this user's that no one else may write.

    Raises:
        UnsafeFolder: It is not.
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise UnsafeFolder(f"{folder} is not a folder of this user's that only this user may write: "
                           "nothing is kept in it")


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (0600), never through a link."""
    fd = os.open(path, _WRITE, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def copy_private(source: str | Path, path: Path) -> None:
    """Copy ``source`` (a file trainguard wrote) to ``path`` (0600), never through a link at ``path``."""
    fd = os.open(path, _WRITE, 0o600)
    with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
        while chunk := src.read(_CHUNK):
            out.write(chunk)
