"""Collecting a local attempt's evidence into a store, and finding the checkpoints to resume from
(`trainguard_entrypoint.resumable`, re-exported).

Everything the attempt left in its workspace is copied under ``runs/{run_id}/attempt-{n}/`` with
stable names, and the manifest is written last. Collection runs in the flow's ``finally``, so it
must never mask the original failure: every piece that is not there, or cannot be copied, becomes
a `MissingItem` with the reason, never an exception. The workspace is the training job's, so every
file of it goes through ``jobfiles`` (no link followed, no FIFO or device read, a budget by
apparent size, printable names, masked unless it is a core dump or a checkpoint). Deciding *what*
failed is ``triage``'s job.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from trainguard_entrypoint import safefiles
from trainguard_entrypoint.checkpoints import list_checkpoints
from trainguard_entrypoint.coredumps import CORE_SIGNALS
# choosing the checkpoints to resume from is the entrypoint's (the Kubernetes lister pod runs it too)
from trainguard_entrypoint.resumable import VERIFY_SECONDS as VERIFY_SECONDS
from trainguard_entrypoint.resumable import choose
from trainguard_entrypoint.resumable import newest_checkpoints as newest_checkpoints
from trainguard_entrypoint.resumable import verified as verified
from trainguard_entrypoint.files import read_json_object, read_tail_lines

from trainguard.core import masking
from trainguard.core.backends import jobfiles
from trainguard.core.backends.jobfiles import Budget, JobFile
from trainguard.core.evidence.manifest import Manifest, ManifestItem, MissingItem, attempt_prefix, store_manifest
from trainguard.core.stores.base import EvidenceStore, StoredItem
from trainguard.core.backends.base import ERROR, LOST, AttemptOutcome
from trainguard.core.backends.workspace import (
    COREDUMPS, CRASH_REPORT, EXPECTED_SNAPSHOTS, FLIGHT_RECORDER, GPU_AFTER, GPU_BEFORE, INDEX, LOGS, RANKS,
    RUNNER_REPORT, SNAPSHOT, STACKS, STACKS_SITE, TORCHELASTIC, AttemptWorkspace,
)

CRASH_TAIL_LINES = 200
JOB_FOLDERS = (RANKS, TORCHELASTIC, STACKS, FLIGHT_RECORDER)  # kept whole when the attempt made them
ENTRYPOINT, RUNNER, WORKSPACE, FLOW = "entrypoint", "runner", "local-workspace", "flow"


def _utc_now() -> datetime:
    return datetime.now(UTC)


class BundleWriter:
    """Copies items under one attempt prefix and keeps the manifest's two lists (and what job files cost)."""

    def __init__(self, store: EvidenceStore, prefix: str, now: Callable[[], datetime], budget: Budget | None = None) -> None:
        self.store, self.prefix, self.now = store, prefix, now
        self.items: list[ManifestItem] = []
        self.missing: list[MissingItem] = []
        self.spent = jobfiles.Spent(budget or Budget())

    def _record(self, name: str, source: str, stored: StoredItem, original: str = "") -> None:
        stamp = self.now().isoformat()
        self.items.append(ManifestItem(name, stored.key, stored.sha256, stored.size_bytes, source, stamp,
                                       stored.checksum_sha256, original))

    def put_file(self, name: str, path: Path, source: str, original: str = "") -> None:
        self._record(name, source, self.store.put_file(f"{self.prefix}/{name}", path), original)

    def put_bytes(self, name: str, data: bytes, source: str) -> None:
        self._record(name, source, self.store.put_bytes(f"{self.prefix}/{name}", data))

    def absent(self, name: str, source: str, reason: str, original: str = "", applicable: bool = True) -> None:
        self.missing.append(MissingItem(name, source, reason, original, applicable))

    def guarded(self, name: str, source: str, step: Callable[[], object]) -> None:
        """Run one collection step; whatever it raises becomes a MissingItem, and collection goes on."""
        try:
            step()
        except Exception as exc:
            self.absent(name, source, f"could not collect: {type(exc).__name__}: {exc}")


def put_folder(c: BundleWriter, prefix: str, folder: Path, root: Path, source: str,
               job_file: Callable[[Path], JobFile], skip: Callable[[str], bool] = lambda name: False) -> list[str]:
    """Put every regular file under ``folder`` as ``prefix/<relative>``; list the rest as missing, with why.

    ``skip`` says, of ``prefix/<relative>``, what is not evidence (trainguard's helpers, PyTorch's pipes).
    Returns the evidence names of the files found (whether or not they could be stored).
    """
    found: list[str] = []
    for entry in safefiles.walk(folder, root):
        if entry.kind == "missing" and entry.name == "":
            break  # no such folder: the caller says why
        relative = entry.name or ""
        if relative and skip(f"{prefix}/{relative}"):
            continue
        name, original = jobfiles.evidence_name(prefix, relative) if relative else (prefix, "")
        if entry.kind != safefiles.FILE:
            c.absent(name, source, entry.reason, original)
            continue
        found.append(name)
        c.guarded(name, source, partial(jobfiles.put, c, prefix, entry.name, source, job_file(Path(entry.path))))
    return found


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


def _collect_log(c: BundleWriter, ws: AttemptWorkspace, why_absent: str, masker: masking.Masker,
                 log_name: str | None = None) -> None:
    log_name = log_name or ws.log_path.name
    name = f"{LOGS}/{log_name}"
    try:
        os.lstat(ws.log_path)
    except OSError:
        c.absent(name, ENTRYPOINT, f"no log file at {jobfiles.shown(ws.log_path)}: {why_absent}")
        c.absent("crash-tail.txt", WORKSPACE, "no log to take the tail of")
        return
    log = jobfiles.log_file(ws.log_path, ws.root, c, masker)
    c.guarded(name, ENTRYPOINT, lambda: jobfiles.put(c, LOGS, log_name, ENTRYPOINT, log))

    def tail() -> None:
        lines = [masker.for_people(line)
                 for line in read_tail_lines(ws.log_path, CRASH_TAIL_LINES, max_bytes=1024 * 1024, root=ws.root)]
        c.put_bytes("crash-tail.txt", ("\n".join(lines) + "\n" if lines else "").encode("utf-8"), WORKSPACE)

    c.guarded("crash-tail.txt", WORKSPACE, tail)


def _report_file(ws: AttemptWorkspace, masker: masking.Masker) -> Callable[[Path], JobFile]:
    return lambda path: JobFile(path, ws.root, "report", jobfiles.SMALL_FILE_LIMIT_BYTES, masker)


def _collect_snapshots(c: BundleWriter, ws: AttemptWorkspace, why_absent: str, masker: masking.Masker) -> None:
    found = set(put_folder(c, SNAPSHOT, ws.root / SNAPSHOT, ws.root, ENTRYPOINT, _report_file(ws, masker)))
    for expected in EXPECTED_SNAPSHOTS:
        if expected not in found:
            c.absent(expected, ENTRYPOINT, f"not written: {why_absent}")
    for phase in (GPU_BEFORE, GPU_AFTER):
        index = read_json_object(ws.root / SNAPSHOT / phase / INDEX, ws.root) or {}
        absent_list = [a for a in index.get("absent", []) if isinstance(a, dict)] \
            if isinstance(index.get("absent"), list) else []
        # no NVIDIA driver on the host: no GPU to take a snapshot of, so nothing is lost
        applicable = not any(a.get("name") == "driver-version.txt" for a in absent_list)
        for absent in absent_list:
            name, original = jobfiles.evidence_name(f"{SNAPSHOT}/{phase}", str(absent.get("name")))
            c.absent(name, ENTRYPOINT, masker.for_people(str(absent.get("reason"))), original, applicable)


def _failure_of(what: str, write_failures: Sequence[str]) -> str | None:
    """The write failure the runner reported for ``what`` ("crash report", "runner.json"), if any."""
    return next((line for line in write_failures if line.startswith(what)), None)


def _collect_reports(
    c: BundleWriter, ws: AttemptWorkspace, own: AttemptWorkspace, runner: dict[str, Any] | None,
    write_failures: Sequence[str], masker: masking.Masker,
) -> None:
    """The entrypoint's crash report (from where the job wrote) and the runner's own (the attempt's)."""
    if os.path.lexists(ws.root / CRASH_REPORT):
        report = _report_file(ws, masker)
        c.guarded(CRASH_REPORT, ENTRYPOINT,
                  lambda: jobfiles.put(c, "", CRASH_REPORT, ENTRYPOINT, report(ws.root / CRASH_REPORT)))
    else:
        c.absent(CRASH_REPORT, ENTRYPOINT, _no_crash_report_reason(runner, write_failures))
    if os.path.lexists(own.root / RUNNER_REPORT):
        runner_file = _report_file(own, masker)(own.root / RUNNER_REPORT)
        c.guarded(RUNNER_REPORT, RUNNER, lambda: jobfiles.put(c, "", RUNNER_REPORT, RUNNER, runner_file))
    elif failed := _failure_of(RUNNER_REPORT, write_failures):
        c.absent(RUNNER_REPORT, RUNNER, failed)
    else:
        why = f"no such file: {jobfiles.shown(own.root / RUNNER_REPORT)} (not run by the local runner, or it was killed)"
        c.absent(RUNNER_REPORT, RUNNER, why)


def _collect_coredumps(c: BundleWriter, ws: AttemptWorkspace, crash: dict[str, Any] | None,
                       masker: masking.Masker) -> None:
    limit = c.spent.budget.core_dump_bytes
    cores = put_folder(c, COREDUMPS, ws.root / COREDUMPS, ws.root, ENTRYPOINT,
                       lambda path: JobFile(path, ws.root, "core dump", limit))  # byte for byte, holes kept
    if cores or any(item.name.startswith(f"{COREDUMPS}/") for item in c.missing):
        return
    if crash is None:
        c.absent(COREDUMPS, ENTRYPOINT, "no core file, and no crash report to say why")
    else:
        # a process that exited, or died of a signal that dumps no core, could not have left one
        dumps = crash.get("signal") in CORE_SIGNALS
        c.absent(COREDUMPS, ENTRYPOINT, masker.for_people(str(crash.get("core_absent_reason") or "no core file was kept")),
                 applicable=dumps)


def resumable_checkpoints(folder: Path, verify_seconds: float = VERIFY_SECONDS) -> list[str]:
    """A backend's `checkpoints` for a run folder it reads itself (local, Slurm): newest first, the
    newest whose files do not match their acknowledgement passed over, hashing held to
    ``verify_seconds``; what was passed over, or kept without every digest compared, is said."""
    if not folder.is_dir():
        return []
    chosen = choose(folder, verify_seconds)
    for name, why in chosen.left_out:
        print(f"trainguard: not resuming from {jobfiles.shown(folder / name)}: its files do not match its "
              f"acknowledgement: {why}", flush=True)
    for name, why in chosen.unchecked:
        print(f"trainguard: {jobfiles.shown(folder / name)}: {why}", flush=True)
    return [str(path) for path in chosen.kept]


def _collect_checkpoints(c: BundleWriter, ws: AttemptWorkspace) -> None:
    """The newest checkpoint (copied, within its budget), then ``checkpoints.json``: the listing takes the
    digests of the files copied from the copy itself, so none of them is hashed twice."""
    copied: dict[str, str] = {}
    c.guarded("checkpoint", WORKSPACE, lambda: copied.update(_copy_newest_checkpoint(c, ws)))

    def listing() -> None:
        payload = list_checkpoints(ws.checkpoint_dir, known=copied)
        c.put_bytes("checkpoints.json", (json.dumps(payload, indent=2) + "\n").encode("utf-8"), WORKSPACE)

    c.guarded("checkpoints.json", WORKSPACE, listing)


def _copy_newest_checkpoint(c: BundleWriter, ws: AttemptWorkspace) -> dict[str, str]:
    """Copy the newest checkpoint a run could resume from; the digest of each file copied, by its name in
    the checkpoint folder."""
    newest = newest_checkpoints(ws.checkpoint_dir)
    if not newest:
        c.absent("checkpoint", WORKSPACE, f"no checkpoint in {jobfiles.shown(ws.checkpoint_dir)}")
        return {}
    chosen, limit = newest[0], c.spent.budget.checkpoint_bytes
    name, original = jobfiles.evidence_name("checkpoint", chosen.name)

    def copy() -> None:
        as_file = JobFile(chosen, ws.checkpoint_dir, "checkpoint", limit)
        if not stat.S_ISDIR(chosen.lstat().st_mode):
            jobfiles.put(c, "checkpoint", chosen.name, WORKSPACE, as_file)
            return
        size = sum(entry.size_bytes for entry in safefiles.walk(chosen, ws.checkpoint_dir))
        if size > (left := c.spent.left("checkpoint", limit)):
            c.absent(name, WORKSPACE, f"{size} bytes (apparent size) in all, over the checkpoint budget ({left} bytes "
                                      f"left of {c.spent.limit(limit)}); it stays at {jobfiles.shown(chosen)}", original)
            return
        put_folder(c, f"checkpoint/{chosen.name}", chosen, ws.checkpoint_dir, WORKSPACE,
                   lambda path: JobFile(path, ws.checkpoint_dir, "checkpoint", limit))

    before = len(c.items)
    c.guarded(name, WORKSPACE, copy)
    return {(item.original_name or item.name).removeprefix("checkpoint/"): item.sha256 for item in c.items[before:]}


def not_evidence(name: str) -> bool:
    """The entrypoint's faulthandler site (``stacks/site/...``) and PyTorch's flight-recorder trigger pipes,
    wherever they lie (a Slurm task's folder too)."""
    parts = name.split("/")
    site = any(a == STACKS and b == STACKS_SITE for a, b in zip(parts, parts[1:]))
    return site or (len(parts) > 1 and parts[-2] == FLIGHT_RECORDER and parts[-1].startswith("pipe_"))


def _collect_job_folders(c: BundleWriter, ws: AttemptWorkspace, masker: masking.Masker) -> None:
    """torchrun's rank logs and error files, the ranks' stacks and the flight recorder's dumps, each file
    masked (a rank's log cut at the log budget); a folder the attempt never made is simply not there."""
    for folder in JOB_FOLDERS:
        if not os.path.lexists(ws.root / folder):
            continue
        kind = (lambda path: jobfiles.log_file(path, ws.root, c, masker)) if folder == RANKS \
            else _report_file(ws, masker)
        c.guarded(folder, ENTRYPOINT, partial(put_folder, c, folder, ws.root / folder, ws.root, ENTRYPOINT, kind,
                                              not_evidence))


def put_extra(c: BundleWriter, extra: Mapping[str, bytes] | None) -> None:
    """Store the flow's own items by name (e.g. ``classification.json``); a bad one is a missing item."""
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
    budget: Budget | None = None,
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
        budget: How much of the job's files is copied, by apparent size (the newest checkpoint
            only up to its own limit, core dumps up to theirs).
        now: The clock for ``collected_at`` stamps.
        masker: Masks secrets in every stored file of the job's but core dumps and checkpoints;
            default: every secret this process knows.
        write_failures: What the runner could not write in the workspace (a full disk), one line
            each, so the manifest says why those files are absent.
    """
    c = BundleWriter(store, attempt_prefix(workspace.run_id, workspace.attempt), now, budget)
    collect_workspace(c, workspace, masker=masker or masking.current(), write_failures=write_failures)
    c.guarded("extra", WORKSPACE, lambda: put_extra(c, extra))
    manifest = Manifest(workspace.run_id, workspace.attempt, now().isoformat(), tuple(c.items), tuple(c.missing))
    return store_manifest(store, manifest, WORKSPACE)


def collect_workspace(c: BundleWriter, workspace: AttemptWorkspace, *, masker: masking.Masker,
                      files: AttemptWorkspace | None = None, write_failures: Sequence[str] = ()) -> None:
    """Put what the entrypoint and the job left (reports, log, snapshots, checkpoint, cores) through ``c``.

    ``files`` is where they lie when that is not ``workspace``'s own folder (a Slurm attempt that
    continues an earlier attempt's job); they are named as ``workspace``'s. Never raises.
    """
    ws = files or workspace
    crash = read_json_object(ws.root / CRASH_REPORT, ws.root)
    runner = read_json_object(workspace.root / RUNNER_REPORT, workspace.root)
    why_absent = (
        _no_crash_report_reason(runner, write_failures) if crash is None
        else "the entrypoint could not write it (see the crash report's problems)"
    )
    steps: list[tuple[str, Callable[[], None]]] = [
        (CRASH_REPORT, lambda: _collect_reports(c, ws, workspace, runner, write_failures, masker)),
        (LOGS, lambda: _collect_log(c, ws, why_absent, masker, workspace.log_path.name)),
        (SNAPSHOT, lambda: _collect_snapshots(c, ws, why_absent, masker)),
        ("checkpoint", lambda: _collect_checkpoints(c, ws)),
        (COREDUMPS, lambda: _collect_coredumps(c, ws, crash, masker)),
        (RANKS, lambda: _collect_job_folders(c, ws, masker)),
    ]
    for name, step in steps:
        c.guarded(name, WORKSPACE, step)


def lost_outcome(root: Path | None) -> AttemptOutcome:
    """How an attempt ended, from what it left in its folder (the runner's report, else the entrypoint's
    crash report); for the backends whose attempt folder this machine reads."""
    runner = (read_json_object(root / RUNNER_REPORT) or {}) if root else {}
    crash = (read_json_object(root / CRASH_REPORT) or {}) if root else {}
    source = runner or crash
    if not source:
        return AttemptOutcome(None, None, LOST, "the attempt left no account of how it ended; its supervisor was lost")
    lost = crash.get("supervisor_lost") and not runner
    exit_code, signal = source.get("exit_code"), source.get("signal")
    return AttemptOutcome(
        exit_code=exit_code if isinstance(exit_code, int) else None, signal=signal if isinstance(signal, int) else None,
        reason=LOST if lost else str(source.get("reason") or ERROR),
        message=str(source.get("message") or ("its supervisor was lost; the entrypoint stopped the command"
                                              if lost else "ended without a report from the runner")),
        started_at=_text(source.get("started_at")), finished_at=_text(source.get("finished_at")),
        duration_seconds=_seconds(source.get("duration_seconds")), log_path=_text(source.get("log_path")),
    )


def _text(value: Any) -> str | None:
    return str(value) if isinstance(value, str) and value else None


def _seconds(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 else 0.0
