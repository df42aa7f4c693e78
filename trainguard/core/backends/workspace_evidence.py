"""Collecting a local attempt's evidence into a store, and finding the checkpoints to resume from.

Everything the attempt left in its workspace is copied under ``runs/{run_id}/attempt-{n}/`` with
stable names, and the manifest is written last. Collection runs in the flow's ``finally``, so it
must never mask the original failure: every piece that is not there, or cannot be copied, becomes
a `MissingItem` with the reason, never an exception. Deciding *what* failed is ``triage``'s job.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from trainguard_entrypoint.checkpoints import list_checkpoints
from trainguard_entrypoint.files import read_json_object, read_tail_lines

from trainguard.core import masking
from trainguard.core.evidence.manifest import Manifest, ManifestItem, MissingItem, attempt_prefix, store_manifest
from trainguard.core.stores.base import EvidenceStore, StoredItem
from trainguard.core.backends.workspace import AttemptWorkspace

CRASH_TAIL_LINES = 200
_MASK_BLOCK_BYTES = 1024 * 1024
ENTRYPOINT, RUNNER, WORKSPACE, FLOW = "entrypoint", "runner", "local-workspace", "flow"

_IGNORED_SUFFIXES = (".tmp", ".partial")
EXPECTED_SNAPSHOTS = (
    "snapshot/env.json", "snapshot/host.json", "snapshot/gpu-before/index.json", "snapshot/gpu-after/index.json",
)
# "step-000120.pt", "epoch=3-step=1200.ckpt", "checkpoint-500", "iter_0004000"
_STEP = re.compile(r"(?:step|iter|checkpoint|ckpt)[-_=]?(\d+)", re.IGNORECASE)
_NUMBER = re.compile(r"(\d+)")


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _step_number(name: str) -> int | None:
    if match := _STEP.search(name):
        return int(match.group(1))
    numbers = _NUMBER.findall(name)
    return int(numbers[-1]) if numbers else None


def rank_checkpoints(entries: Iterable[tuple[str, float]]) -> list[str]:
    """Checkpoint names, newest first, from (name, mtime) pairs listed somewhere else (e.g. in a pod).

    The same rules as `newest_checkpoints`: step numbers first, then modification time; temporary,
    partial and dot-names are not checkpoints.
    """
    ranked = [((step is not None, step if step is not None else -1, mtime), name)
              for name, mtime in entries
              if not name.startswith(".") and not name.endswith(_IGNORED_SUFFIXES)
              for step in (_step_number(name),)]
    ranked.sort(key=lambda pair: pair[0], reverse=True)
    return [name for _, name in ranked]


def newest_checkpoints(checkpoint_dir: Path) -> list[Path]:
    """Checkpoints (files or folders) in ``checkpoint_dir`` a run can resume from, newest first.

    Names carrying a step number (``step-000120.pt``) are ordered by it, then the others by
    modification time. Temporary and partial files (``*.tmp``, ``*.partial``, dot-names) are not
    checkpoints: a crash mid-save leaves exactly those behind. Nor are empty or unreadable ones,
    which a full disk leaves: resuming from them would fail the next attempt too.
    """
    try:
        entries = list(Path(checkpoint_dir).iterdir())
    except OSError:
        return []
    ranked: list[tuple[tuple[int, int, float], Path]] = []
    for entry in entries:
        if entry.name.startswith(".") or entry.name.endswith(_IGNORED_SUFFIXES) or not _usable(entry):
            continue
        try:
            mtime = entry.stat().st_mtime
        except OSError:
            continue  # vanished, or a dangling link
        step = _step_number(entry.name)
        ranked.append(((step is not None, step if step is not None else -1, mtime), entry))
    ranked.sort(key=lambda pair: pair[0], reverse=True)
    return [entry for _, entry in ranked]


def _usable(entry: Path) -> bool:
    """Whether a checkpoint has content that can be read: a non-empty file, or a folder holding one."""
    try:
        if entry.is_dir():
            return any(_usable(child) for child in entry.iterdir() if not child.name.startswith("."))
        with entry.open("rb") as handle:
            return bool(handle.read(1))
    except OSError:
        return False


class BundleWriter:
    """Copies items under one attempt prefix and keeps the manifest's two lists."""

    def __init__(self, store: EvidenceStore, prefix: str, now: Callable[[], datetime]) -> None:
        self.store, self.prefix, self.now = store, prefix, now
        self.items: list[ManifestItem] = []
        self.missing: list[MissingItem] = []

    def _record(self, name: str, source: str, stored: StoredItem) -> None:
        stamp = self.now().isoformat()
        self.items.append(ManifestItem(name, stored.key, stored.sha256, stored.size_bytes, source, stamp,
                                       stored.checksum_sha256))

    def put_file(self, name: str, path: Path, source: str) -> None:
        self._record(name, source, self.store.put_file(f"{self.prefix}/{name}", path))

    def put_bytes(self, name: str, data: bytes, source: str) -> None:
        self._record(name, source, self.store.put_bytes(f"{self.prefix}/{name}", data))

    def absent(self, name: str, source: str, reason: str) -> None:
        self.missing.append(MissingItem(name, source, reason))

    def guarded(self, name: str, source: str, step: Callable[[], object]) -> None:
        """Run one collection step; whatever it raises becomes a MissingItem, and collection goes on."""
        try:
            step()
        except Exception as exc:
            self.absent(name, source, f"could not collect: {type(exc).__name__}: {exc}")


def _files(folder: Path) -> Iterator[tuple[str, Path]]:
    """(relative "/"-name, path) of every file under ``folder``, in a stable order."""
    for current, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for filename in sorted(filenames):
            if not filename.startswith("."):  # in-flight temp files of an atomic write
                path = Path(current) / filename
                yield path.relative_to(folder).as_posix(), path


def _no_crash_report_reason(runner: dict[str, Any] | None, write_failures: Sequence[str] = ()) -> str:
    if failed := _failure_of("crash report", write_failures):
        return f"the entrypoint could not write it: {failed}"
    if runner is None:
        return "no crash report and no runner.json: the attempt may never have run here"
    if runner.get("reason") == "StartError" and runner.get("entrypoint_pid") is None:
        return f"the entrypoint never started: {runner.get('message')}"
    runner_says = f"{runner.get('reason')}: {runner.get('message')}"
    if runner.get("exit_code") == 137:
        return f"the entrypoint was killed (SIGKILL) before writing its crash report; runner: {runner_says}"
    return f"the entrypoint wrote no crash report; runner: {runner_says}"


def _put_masked_copy(c: BundleWriter, name: str, path: Path, masker: masking.Masker) -> None:
    """Store ``path`` with every secret masked (the raw log stays on the attempt's volume).

    Whole lines are masked about 1 MiB at a time: the masker's rules never reach across a line
    end, so this gives the per-line result at a fraction of the per-call cost.
    """
    with tempfile.NamedTemporaryFile(prefix="trainguard-log-", suffix=".log") as masked, path.open("rb") as raw:
        while lines := raw.readlines(_MASK_BLOCK_BYTES):
            text = b"".join(lines).decode("utf-8", errors="surrogateescape")
            masked.write(masker.mask(text).encode("utf-8", errors="surrogateescape"))
        masked.flush()
        c.put_file(name, Path(masked.name), ENTRYPOINT)


def _collect_log(c: BundleWriter, ws: AttemptWorkspace, why_absent: str, masker: masking.Masker) -> None:
    name = f"logs/{ws.log_path.name}"
    if not ws.log_path.is_file():
        c.absent(name, ENTRYPOINT, f"no log file at {ws.log_path}: {why_absent}")
        c.absent("crash-tail.txt", WORKSPACE, "no log to take the tail of")
        return
    c.guarded(name, ENTRYPOINT, lambda: _put_masked_copy(c, name, ws.log_path, masker))

    def tail() -> None:
        lines = [masker.for_people(line) for line in read_tail_lines(ws.log_path, CRASH_TAIL_LINES, max_bytes=1024 * 1024)]
        c.put_bytes("crash-tail.txt", ("\n".join(lines) + "\n" if lines else "").encode("utf-8"), WORKSPACE)

    c.guarded("crash-tail.txt", WORKSPACE, tail)


def _collect_snapshots(c: BundleWriter, ws: AttemptWorkspace, why_absent: str) -> None:
    found: set[str] = set()
    if ws.snapshot_dir.is_dir():
        for relative, path in _files(ws.snapshot_dir):
            name = f"snapshot/{relative}"
            found.add(name)
            c.guarded(name, ENTRYPOINT, partial(c.put_file, name, path, ENTRYPOINT))
    for expected in EXPECTED_SNAPSHOTS:
        if expected not in found:
            c.absent(expected, ENTRYPOINT, f"not written: {why_absent}")
    for phase in ("gpu-before", "gpu-after"):
        index = read_json_object(ws.snapshot_dir / phase / "index.json") or {}
        for absent in index.get("absent", []):
            if isinstance(absent, dict):
                c.absent(f"snapshot/{phase}/{absent.get('name')}", ENTRYPOINT, str(absent.get("reason")))


def _failure_of(what: str, write_failures: Sequence[str]) -> str | None:
    """The write failure the runner reported for ``what`` ("crash report", "runner.json"), if any."""
    return next((line for line in write_failures if line.startswith(what)), None)


def _collect_reports(
    c: BundleWriter, ws: AttemptWorkspace, runner: dict[str, Any] | None, write_failures: Sequence[str]
) -> None:
    if ws.crash_report_path.is_file():
        copy = partial(c.put_file, "crash-report.json", ws.crash_report_path, ENTRYPOINT)
        c.guarded("crash-report.json", ENTRYPOINT, copy)
    else:
        c.absent("crash-report.json", ENTRYPOINT, _no_crash_report_reason(runner, write_failures))
    if ws.runner_report_path.is_file():
        c.guarded("runner.json", RUNNER, lambda: c.put_file("runner.json", ws.runner_report_path, RUNNER))
    elif failed := _failure_of("runner.json", write_failures):
        c.absent("runner.json", RUNNER, failed)
    else:
        why = f"no such file: {ws.runner_report_path} (not run by the local runner, or it was killed)"
        c.absent("runner.json", RUNNER, why)


def _collect_coredumps(c: BundleWriter, ws: AttemptWorkspace, crash: dict[str, Any] | None) -> None:
    cores = list(_files(ws.coredumps_dir)) if ws.coredumps_dir.is_dir() else []
    for relative, path in cores:
        name = f"coredumps/{relative}"
        c.guarded(name, ENTRYPOINT, partial(c.put_file, name, path, ENTRYPOINT))
    if cores:
        return
    if crash is None:
        c.absent("coredumps", ENTRYPOINT, "no core file, and no crash report to say why")
    else:
        c.absent("coredumps", ENTRYPOINT, str(crash.get("core_absent_reason") or "no core file was kept"))


def _tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for _, p in _files(path))


def _collect_checkpoints(c: BundleWriter, ws: AttemptWorkspace, limit_bytes: int) -> None:
    def listing() -> None:
        payload = list_checkpoints(ws.checkpoint_dir)
        c.put_bytes("checkpoints.json", (json.dumps(payload, indent=2) + "\n").encode("utf-8"), WORKSPACE)

    c.guarded("checkpoints.json", WORKSPACE, listing)
    newest = newest_checkpoints(ws.checkpoint_dir)
    if not newest:
        c.absent("checkpoint", WORKSPACE, f"no checkpoint in {ws.checkpoint_dir}")
        return
    chosen = newest[0]
    name = f"checkpoint/{chosen.name}"

    def copy() -> None:
        size = _tree_size(chosen)
        if size > limit_bytes:
            c.absent(name, WORKSPACE, f"{size} bytes, over the {limit_bytes}-byte copy limit; it stays at {chosen}")
        elif chosen.is_file():
            c.put_file(name, chosen, WORKSPACE)
        else:
            for relative, path in _files(chosen):
                c.guarded(f"{name}/{relative}", WORKSPACE, partial(c.put_file, f"{name}/{relative}", path, WORKSPACE))

    c.guarded(name, WORKSPACE, copy)


def _collect_extra(c: BundleWriter, extra: Mapping[str, bytes] | None) -> None:
    for name, data in (extra or {}).items():
        c.guarded(str(name), FLOW, partial(_put_extra, c, name, data))


def _put_extra(c: BundleWriter, name: str, data: bytes) -> None:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"extra[{name!r}] must be bytes, got {type(data).__name__}")
    c.put_bytes(name, bytes(data), FLOW)


def collect_local_evidence(
    workspace: AttemptWorkspace,
    store: EvidenceStore,
    *,
    extra: Mapping[str, bytes] | None = None,
    checkpoint_copy_limit_bytes: int = 256 * 1024 * 1024,
    now: Callable[[], datetime] = _utc_now,
    masker: masking.Masker | None = None,
    write_failures: Sequence[str] = (),
) -> Manifest:
    """Copy everything the attempt produced into ``store``; write and return the manifest.

    Never raises for missing or uncopyable evidence: each such piece is a `MissingItem` with the
    reason. If the manifest itself cannot be stored, the returned manifest lists
    ``manifest.json`` as missing, with why.

    Args:
        workspace: The attempt's folders.
        store: Where the evidence goes, under ``runs/{run_id}/attempt-{n}/``.
        extra: More items by name (e.g. the flow's ``classification.json``).
        checkpoint_copy_limit_bytes: The newest checkpoint is copied only if at most this big.
        now: The clock for ``collected_at`` stamps.
        masker: Masks secrets in the stored log and tail; default: every secret this process knows.
        write_failures: What the runner could not write in the workspace (a full disk), one line
            each, so the manifest says why those files are absent.
    """
    masker = masker or masking.current()
    c = BundleWriter(store, attempt_prefix(workspace.run_id, workspace.attempt), now)
    crash = read_json_object(workspace.crash_report_path)
    runner = read_json_object(workspace.runner_report_path)
    why_absent = (
        _no_crash_report_reason(runner, write_failures) if crash is None
        else "the entrypoint could not write it (see the crash report's problems)"
    )
    steps: list[tuple[str, Callable[[], None]]] = [
        ("logs", lambda: _collect_log(c, workspace, why_absent, masker)),
        ("crash-report.json", lambda: _collect_reports(c, workspace, runner, write_failures)),
        ("snapshot", lambda: _collect_snapshots(c, workspace, why_absent)),
        ("checkpoint", lambda: _collect_checkpoints(c, workspace, checkpoint_copy_limit_bytes)),
        ("coredumps", lambda: _collect_coredumps(c, workspace, crash)),
        ("extra", lambda: _collect_extra(c, extra)),
    ]
    for name, step in steps:
        c.guarded(name, WORKSPACE, step)
    manifest = Manifest(workspace.run_id, workspace.attempt, now().isoformat(), tuple(c.items), tuple(c.missing))
    return store_manifest(store, manifest, WORKSPACE)
