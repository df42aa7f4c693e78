"""Choosing the checkpoints a run can resume from: ranked newest first, the newest checked against
their acknowledgements. The same code wherever the folder can be read: on trainguard's machine
(local, Slurm), and in the Kubernetes lister pod, which runs this module's `main` from the
entrypoint's zipapp with the training image's Python.

Ranking: names carrying a step number (``step-000120.pt``) by it, then the others by modification
time. Temporary and partial files (``*.tmp``, ``*.partial``, dot-names) are not checkpoints: a crash
mid-save leaves exactly those behind. Nor are empty or unreadable ones, which a full disk leaves:
resuming from them would fail the next attempt too. Nor is anything that is not a regular file or a
folder of the run's own (a link, a FIFO, a device): the training job wrote the folder, and reading
such a thing could hang or lead outside it.

Checking (`select`): the training-side helper acknowledges what it saved (`acks`): a checkpoint
whose files no longer match (cut short, corrupted, replaced) is no place to resume from, and the
next older one is taken. Checking stops at the first checkpoint kept (acknowledged and verified, or
one the training saved itself without an acknowledgement): only the newest are resumed from, and
hashing every old checkpoint would cost minutes. A time bound (``seconds``) holds the hashing to
what a listing may take (see `acks.check`): a checkpoint whose sizes match but whose digests were
not all compared in time is kept, and said so in ``unchecked``.

Stdlib-only (it runs in the user's image); everything it reads is the job's, through `safefiles`.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard_entrypoint import acks, safefiles

LISTING_FORMAT = 1
# a run's checkpoints ranked to choose one to resume from (the evidence lists and copies fewer:
# `safefiles.MAX_ENTRIES`); ranking needs every name, and a run keeps far fewer than this
MAX_RANKED_CHECKPOINTS = 100_000
MAX_LISTED = 1_000  # names a lister pod sends back, newest first: what a resume or a report can use
MAX_BRIEFS = 64  # acknowledgements it sends back (briefly), newest first
IGNORED_SUFFIXES = (".tmp", ".partial")
# how long choosing a checkpoint may hash the newest checkpoints' files (sizes are always compared):
# about 120 GB at 1 GB/s, 18 GB from a network volume at 150 MB/s; each backend's block can change it
VERIFY_SECONDS = 120.0
# "step-000120.pt", "epoch=3-step=1200.ckpt", "checkpoint-500", "iter_0004000"
_STEP = re.compile(r"(?:step|iter|checkpoint|ckpt)[-_=]?(\d+)", re.IGNORECASE)
_NUMBER = re.compile(r"(\d+)")


def step_number(name: str) -> int | None:
    """The step a checkpoint's name carries, if any."""
    if match := _STEP.search(name):
        return int(match.group(1))
    numbers = _NUMBER.findall(name)
    return int(numbers[-1]) if numbers else None


def ranked(checkpoint_dir: Path) -> list[tuple[Path, float]]:
    """Every checkpoint in ``checkpoint_dir`` a run could resume from, with its mtime, newest first, unchecked."""
    found: list[tuple[tuple[bool, int, float], Path, float]] = []
    for entry in safefiles.walk(checkpoint_dir, checkpoint_dir, max_depth=0, max_entries=MAX_RANKED_CHECKPOINTS):
        if entry.name.endswith(IGNORED_SUFFIXES) or entry.kind not in (safefiles.FILE, "limit") or entry.left_out:
            continue  # a link, a FIFO, a device; the folder itself missing; or what is past the limit
        path = Path(entry.path)
        if not _usable(path, checkpoint_dir):
            continue
        try:
            mtime = path.lstat().st_mtime
        except OSError:
            continue  # vanished
        step = step_number(entry.name)
        found.append(((step is not None, step if step is not None else -1, mtime), path, mtime))
    found.sort(key=lambda item: item[0], reverse=True)
    return [(path, mtime) for _, path, mtime in found]


def newest_checkpoints(checkpoint_dir: Path, verify_seconds: float | None = VERIFY_SECONDS) -> list[Path]:
    """Checkpoints (files or folders) in ``checkpoint_dir`` a run can resume from, newest first, without
    the newest whose acknowledgement does not verify (see the module docstring); hashing held to
    ``verify_seconds`` (None: every byte is read; 0: sizes only)."""
    return choose(checkpoint_dir, verify_seconds).kept


def choose(checkpoint_dir: Path, verify_seconds: float | None = VERIFY_SECONDS,
           clock: Callable[[], float] = time.monotonic) -> Selection:
    """`select` over every checkpoint in ``checkpoint_dir``, hashing held to ``verify_seconds`` from now
    (None: no bound)."""
    deadline = None if verify_seconds is None else clock() + verify_seconds
    return select([path for path, _ in ranked(checkpoint_dir)], checkpoint_dir, deadline=deadline, clock=clock)


@dataclass
class Selection:
    """What `select` kept (newest first), left out and could not check in time, with why, and the acks it read."""

    kept: list[Path] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)
    unchecked: list[tuple[str, str]] = field(default_factory=list)
    acks: dict[str, acks.Ack] = field(default_factory=dict)


def select(ranked_paths: Sequence[Path], checkpoint_dir: Path, *, deadline: float | None = None,
           clock: Callable[[], float] = time.monotonic) -> Selection:
    """``ranked_paths`` (newest first) without the newest checkpoints whose acknowledgement does not verify.

    Hashing is held to ``deadline`` (a ``clock`` time; None: every byte is read): past it, the
    sizes are still checked, and a checkpoint whose sizes match is kept, named in ``unchecked``.
    """
    chosen = Selection()
    for index, path in enumerate(ranked_paths):
        ack = acks.read_ack(checkpoint_dir, path.name)
        if ack is None:
            chosen.kept = list(ranked_paths[index:])
            return chosen
        chosen.acks[path.name] = ack
        checked = acks.check(checkpoint_dir, ack, deadline=deadline, clock=clock)
        if checked.mismatch is None:
            if checked.unhashed:
                chosen.unchecked.append((path.name, checked.unhashed))
            chosen.kept = list(ranked_paths[index:])
            return chosen
        chosen.left_out.append((path.name, checked.mismatch))
    return chosen


def verified(ranked_paths: Sequence[Path], checkpoint_dir: Path) -> tuple[list[Path], list[tuple[str, str]]]:
    """``ranked_paths`` (newest first) without the newest checkpoints whose acknowledgement does not
    verify, and those left out with why; every digest compared (`select` without a time bound)."""
    chosen = select(ranked_paths, checkpoint_dir)
    return chosen.kept, chosen.left_out


def _usable(entry: Path, root: Path) -> bool:
    """Whether a checkpoint has content that can be read: a non-empty regular file, or a real folder holding one."""
    try:
        if stat.S_ISDIR(entry.lstat().st_mode):
            return any(found.kind == safefiles.FILE and _usable(Path(found.path), root)
                       for found in safefiles.walk(entry, root))
        with safefiles.open_regular(entry, root) as handle:
            return bool(handle.read(1))
    except OSError:
        return False


def listing(checkpoint_dir: Path, mount: Path, seconds: float,
            clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """The lister pod's answer (see `main`): what a run can resume from in ``checkpoint_dir``, which must
    lie inside ``mount`` without a link on the way, with hashing held to ``seconds``."""
    deadline = clock() + seconds
    answer: dict[str, Any] = {"version": LISTING_FORMAT, "dir": str(checkpoint_dir), "absent": None,
                              "checkpoints": [], "left_out": [], "unchecked": [], "acks": {}, "progress": None,
                              "notes": []}
    if (why := _outside(checkpoint_dir, mount)) is not None:
        answer["absent"] = why
        return answer
    found = ranked(checkpoint_dir)
    mtimes = {path.name: mtime for path, mtime in found}
    chosen = select([path for path, _ in found], checkpoint_dir, deadline=deadline, clock=clock)
    answer["checkpoints"] = [[path.name, mtimes[path.name]] for path in chosen.kept[:MAX_LISTED]]
    if len(chosen.kept) > MAX_LISTED:
        answer["notes"].append(f"{len(chosen.kept) - MAX_LISTED} older checkpoints not listed: "
                               f"a listing sends the newest {MAX_LISTED}")
    answer["left_out"] = [{"name": name, "reason": why} for name, why in chosen.left_out[:MAX_LISTED]]
    answer["unchecked"] = [{"name": name, "reason": why} for name, why in chosen.unchecked]
    briefs: dict[str, Any] = {}
    for name in [name for name, _ in chosen.left_out] + [path.name for path in chosen.kept]:
        if len(briefs) >= MAX_BRIEFS:
            answer["notes"].append(f"acknowledgements of checkpoints older than the newest {MAX_BRIEFS} not sent")
            break
        ack = chosen.acks.get(name) or acks.read_ack(checkpoint_dir, name)
        if ack is not None:
            briefs[name] = acks.AckBrief.of(ack).to_json()
    answer["acks"] = briefs
    progress = acks.read_progress(checkpoint_dir)
    answer["progress"] = None if progress is None else {
        "version": progress.version, "step": progress.step, "at": progress.at, "attempt": progress.attempt}
    return answer


def _outside(checkpoint_dir: Path, mount: Path) -> str | None:
    """Why ``checkpoint_dir`` may not be listed (absent, a link, outside ``mount``), or None."""
    try:
        info = os.lstat(checkpoint_dir)
    except FileNotFoundError:
        return f"no such directory: {safefiles.safe_name(str(checkpoint_dir))} (no checkpoint saved yet)"
    except OSError as exc:
        return f"{safefiles.safe_name(str(checkpoint_dir))}: cannot stat: {exc.strerror or exc}"
    if not stat.S_ISDIR(info.st_mode):
        return f"{safefiles.safe_name(str(checkpoint_dir))}: not a directory; not read"
    if not safefiles.is_inside(os.path.realpath(checkpoint_dir), mount):
        return f"{safefiles.safe_name(str(checkpoint_dir))}: lies outside {safefiles.safe_name(str(mount))}; not read"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """``CHECKPOINT_DIR MOUNT SECONDS``: print `listing` as one JSON line (the last), ASCII only.

    Never fails on what the folder holds; an error of its own is printed as ``{"error": ...}``.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        folder, mount, seconds = Path(args[0]), Path(args[1]), float(args[2])
        answer = listing(folder, mount, seconds)
    except Exception as exc:
        answer = {"version": LISTING_FORMAT, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    sys.stdout.write(json.dumps(answer, ensure_ascii=True, allow_nan=False) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
