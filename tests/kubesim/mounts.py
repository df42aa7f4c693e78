"""Private mount namespaces for containers, and the host mount targets they need.

What belongs here: whether `unshare --mount` works here, creating a missing mount target on
the host (an empty folder or file; the bind itself exists only inside the container's
namespace), and removing those targets again without pulling them from under another
kubesim server: removing a path that is a mountpoint in another namespace detaches that
mount, so every server records in a small registry which targets it created and which it
uses, and a target goes only when no live server uses it.

What does not: spawning processes (runtime.py) or deciding the mounts (workload.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger("kubesim.mounts")

UNSHARE = ("unshare", "--mount", "--propagation", "private")
REGISTRY = Path("/tmp/kubesim-mount-targets")
_available: bool | None = None
_created: set[Path] = set()
_used: set[Path] = set()


def available() -> bool:
    """Whether containers can get a private mount namespace here (root and unshare(2))."""
    global _available
    if _available is None:
        try:
            done = subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=10)
            _available = done.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            _available = False
        if not _available:
            log.warning("kubesim: no mount namespaces (unshare --mount failed); volumes are "
                        "exposed through KUBESIM_MOUNT_* and path rewriting instead")
        else:
            remove_targets(only_dead=True)  # what a killed server left behind
    return _available


def claim(mounts: Iterable[tuple[str, str]]) -> None:
    """Make sure each (source, target) has a target on the host to bind onto."""
    for source, target in mounts:
        path = Path(target)
        chain = [path, *path.parents][:-1]  # never "/"
        _created.update(p for p in chain if not p.exists())
        _used.update(chain)
        if Path(source).is_dir():
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(exist_ok=True)
    _save()


def _save() -> None:
    with contextlib.suppress(OSError):
        REGISTRY.mkdir(exist_ok=True)
        (REGISTRY / f"{os.getpid()}.json").write_text(json.dumps(
            {"created": sorted(map(str, _created)), "used": sorted(map(str, _used))}))


def other_server_alive(pid: int) -> bool:
    """Whether ``pid`` is another kubesim server that still runs (state files name their owner's pid)."""
    return pid != os.getpid() and Path(f"/proc/{pid}").exists()


def remove_targets(*, only_dead: bool = False) -> None:
    """Remove empty targets created by this server (unless only_dead) or by dead servers,
    keeping every path a live server uses."""
    candidates: set[Path] = set() if only_dead else set(_created)
    protected: set[Path] = set()
    finished: list[Path] = [] if only_dead else [REGISTRY / f"{os.getpid()}.json"]
    for entry in REGISTRY.glob("*.json") if REGISTRY.exists() else ():
        if not entry.stem.isdigit() or int(entry.stem) == os.getpid():
            continue
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(entry.read_text())
            if other_server_alive(int(entry.stem)):
                protected.update(Path(p) for p in record["used"])
            else:
                candidates.update(Path(p) for p in record["created"])
                finished.append(entry)
    orphans = REGISTRY / "orphans.json"  # created by a server now gone, in use by another then
    with contextlib.suppress(OSError, ValueError):
        candidates.update(Path(p) for p in json.loads(orphans.read_text()))
    for path in sorted(candidates - protected, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            if path.is_dir():
                path.rmdir()  # only when empty
            elif path.stat().st_size == 0:
                path.unlink()
    with contextlib.suppress(OSError):
        REGISTRY.mkdir(exist_ok=True)
        orphans.write_text(json.dumps(sorted(str(p) for p in candidates & protected if p.exists())))
    for entry in finished:
        with contextlib.suppress(OSError):
            entry.unlink()
    if not only_dead:
        _created.clear()
        _used.clear()
