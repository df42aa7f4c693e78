"""`trainguard evidence show RUN_ID`: what was kept of each attempt, verified against its manifest."""

from __future__ import annotations

import json
from typing import Any
from pathlib import Path

import typer
from rich.table import Table
from rich.text import Text
from trainguard_entrypoint import safefiles

from trainguard.cli.typer_app import app
from trainguard.core.home import data_path
from trainguard.cli.output import console, escaped, fail, plain, say
from trainguard.core.evidence import bundles
from trainguard.core.evidence import manifest as manifests
from blocks.factories import evidence_folder, local_backend
from trainguard.core.backends.capabilities import Supervises
from trainguard.core.stores.base import EvidenceNotFound, EvidenceStore, EvidenceStoreError, SpoolingStore
from trainguard.core.ids import InvalidId

evidence_app = typer.Typer(help="Inspect the evidence kept for training runs.", no_args_is_help=True)
app.add_typer(evidence_app, name="evidence")

@evidence_app.command("show")
def show(
    run_id: str = typer.Argument(..., help="The run id printed by `trainguard run` / `demo`."),
    root: Path = typer.Option(Path("trainguard-data/evidence"), callback=data_path, help="Evidence folder (used without --block)."),
    block: str | None = typer.Option(None, help="A saved evidence block ('block-type-slug/name') instead of --root."),
    deep: bool = typer.Option(False, "--deep", help="Download and hash every item instead of trusting stored checksums."),
    work: Path = typer.Option(Path("trainguard-data/work"), callback=data_path, help="Work folder of the local backend, for a run "
                              "whose evidence could not be stored."),
) -> None:
    """List each attempt's evidence items, verify them against the manifest, and say why anything is missing.

    Verification compares each object's size and the store's stored SHA-256 checksum with the
    manifest, without downloading; `--deep` downloads and hashes every object. An attempt without
    a manifest, and objects the manifest does not list, are reported too (exit code 1).
    """
    # a disk that was full from the start may not even hold the evidence folder: the work folder still speaks
    store = evidence_folder(root) if block is None and not root.is_dir() and work.is_dir() \
        else open_store(root, block)
    try:
        attempts = manifests.attempts_in_store(store, run_id)
    except InvalidId as exc:
        fail(f"RUN_ID: {exc}")
    if not attempts:
        _show_unstored(store, run_id, work)
    bad = 0
    for attempt in attempts:
        bad += _show_attempt(store, run_id, attempt, deep)
    if bad:
        fail(f"{bad} evidence problem(s): see above", code=1)


def _show_unstored(store: EvidenceStore, run_id: str, work: Path) -> None:
    """A run with nothing in the store: say what its work folder still holds, or that it is unknown."""
    backend = local_backend(work)
    assert isinstance(backend, Supervises)
    folders = [backend.attempt_folder(run_id, attempt) for attempt in backend.attempts(run_id)]
    if not folders:
        fail(f"no evidence for run {run_id!r} in {store.describe()}; check the run id and --root/--block")
    for folder in folders:
        files = [entry.name for entry in safefiles.walk(folder, folder) if entry.kind == safefiles.FILE]
        say(plain(f"{run_id} {folder.name}:", "bold"), " ", plain("nothing was stored (no manifest): the evidence "
            "store could not take it (a full disk?); what the attempt left is still in its work folder", "red"))
        say("  ", str(folder))
        for name in files:
            say("  not stored: ", escaped(name))
    fail(f"the evidence of run {run_id!r} is missing from {store.describe()}; free space there and keep the "
         f"work folder above, which holds what the attempts left", code=1)


def open_store(root: Path, block: str | None, no_time_limit: bool = False) -> EvidenceStore:
    """The store `--block` names (a saved block reference), else the folder `--root`."""
    if block:
        from blocks import BlockReferenceError, load_evidence  # Prefect only when a saved block is asked for

        try:
            return load_evidence(block, no_time_limit=no_time_limit)  # a command may wait on S3 as long as it takes
        except BlockReferenceError as exc:
            fail(f"--block: {exc}")
    if not root.is_dir():
        fail(f"--root: no evidence folder at {root}; pass the folder your runs wrote to")
    return evidence_folder(root)


def _show_attempt(store: EvidenceStore, run_id: str, attempt: int, deep: bool) -> int:
    try:
        found = manifests.read_manifest(store, run_id, attempt)
    except (EvidenceStoreError, manifests.ManifestError) as exc:  # EvidenceNotFound, or not a file to read
        return _show_without_manifest(store, run_id, attempt, exc)
    checked = bundles.verify(store, found, deep=deep)
    problems = [f"{name}: {problem}" for name, problem in checked.items()]
    problems += [f"{key}: not in the manifest (added after collection?)" for key in manifests.unlisted_keys(store, found)]
    spooled = set(store.pending(manifests.attempt_prefix(run_id, attempt) + "/")) if isinstance(
        store, SpoolingStore) else set()
    partial = f" (partial: {len(found.absent)} absent)" if found.absent else ""
    where = store.describe(manifests.attempt_prefix(run_id, attempt))
    table = Table(title=plain(f"{run_id} attempt {attempt}{partial}: {where}"))
    for column in ("item", "size", "sha256", "source", "status"):
        table.add_column(column, overflow="fold")
    for item in found.items:
        status = plain("FAILED", "red") if item.name in checked else plain("ok", "green")
        if item.key in spooled:
            status.append(" (spooled, not uploaded yet)", style="yellow")
        table.add_row(_names(item.name, item.original_name), f"{item.size_bytes:,}", plain(item.sha256[:12]),
                      plain(item.source), status)
    for missing in found.missing:
        reason = Text.assemble(plain("absent", "yellow"), ": ", plain(missing.reason)) if missing.applicable \
            else Text.assemble(plain("not applicable", "dim"), ": ", plain(missing.reason, "dim"))
        table.add_row(_names(missing.name, missing.original_name), "-", "-", plain(missing.source), reason)
    console.print(table)
    _print_crash_summary(store, run_id, attempt)
    for problem in problems:
        say(plain("verification:", "red"), " ", problem)
    return len(problems)


def _names(name: str, original: str) -> Text:
    """An item's printable name and, when the job named the file otherwise, that name with its escapes shown."""
    shown = plain(escaped(name))
    if original and original != name:
        shown.append_text(plain(f"\n(named {escaped(original)})", "dim"))
    return shown


def _show_without_manifest(store: EvidenceStore, run_id: str, attempt: int, exc: Exception) -> int:
    """An attempt whose manifest is gone or unreadable: nothing of it can be verified."""
    why = "is missing (deleted, or collection never finished)" if isinstance(exc, EvidenceNotFound) else f"is unreadable: {exc}"
    keys = store.list_keys(manifests.attempt_prefix(run_id, attempt) + "/")
    say(plain(f"{run_id} attempt {attempt}:", "bold"), " ", plain("manifest.json " + why, "red"))
    for key in keys:
        say("  unverified: ", key)
    return 1


def _print_crash_summary(store: EvidenceStore, run_id: str, attempt: int) -> None:
    prefix = manifests.attempt_prefix(run_id, attempt)
    report, verdict = _json(store, f"{prefix}/crash-report.json"), _json(store, f"{prefix}/verdict.json")
    if report:
        signal = f", signal {report.get('signal_name')}" if report.get("signal") else ""
        say(f"  exit code {report.get('exit_code')}{signal}, {_seconds(report.get('duration_seconds'))}")
    if verdict and verdict.get("category"):
        say(f"  {verdict['category']} ({verdict.get('rule_id')}): {verdict.get('signature')}")
    if verdict and isinstance(verdict.get("decision"), dict):
        say(f"  next: {verdict['decision'].get('reason')}")


def _seconds(value: object) -> str:
    return f"{value:.1f}s" if isinstance(value, int | float) and not isinstance(value, bool) else "?s"


def _json(store: EvidenceStore, key: str) -> dict[str, Any] | None:
    try:
        data = json.loads(store.get_bytes(key))
    except (EvidenceNotFound, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None
