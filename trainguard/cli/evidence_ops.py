"""`trainguard evidence get | list | flush | retention apply | prune`: working with stored evidence.

Every command works on the evidence folder (`--root`) or on a saved evidence block (`--block`,
e.g. `trainguard-s3-evidence-store/prod`); `flush` and `retention apply` need an S3 block.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn, TimeRemainingColumn
from rich.table import Table

from trainguard.cli.evidence import evidence_app, open_store
from trainguard.cli.output import console, fail, plain, say
from trainguard.core.evidence import bundles, retention
from trainguard.core.home import data_path
from trainguard.core.evidence.manifest import ManifestError, ManifestItem, read_manifest
from trainguard.core.stores.base import EvidenceNotFound, EvidenceStore, EvidenceStoreError, LifecycleStore, SpoolingStore

PROGRESS_FROM_BYTES = 8 * 1024 * 1024
ROOT_OPTION = typer.Option(Path("trainguard-data/evidence"), callback=data_path, help="Evidence folder (used without --block).")
BLOCK_OPTION = typer.Option(None, help="A saved evidence block, 'block-type-slug/name' (e.g. an S3 store).")

retention_app = typer.Typer(help="How long evidence is kept.", no_args_is_help=True)
evidence_app.add_typer(retention_app, name="retention")


@evidence_app.command("get")
def get(
    run_id: str = typer.Argument(..., help="The run id."),
    attempt: int = typer.Argument(..., help="The attempt number, from 1."),
    item: str = typer.Argument(..., help="The item's name in the manifest, e.g. crash-tail.txt or logs/train-RUN-attempt-N.log."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Where to write it ('-' for stdout)."),
    root: Path = ROOT_OPTION,
    block: str | None = BLOCK_OPTION,
) -> None:
    """Download one evidence item, checking its SHA-256 against the manifest on the way."""
    store = open_store(root, block)
    found = _item(store, run_id, attempt, item)
    target = output or Path(Path(found.name).name)  # the printable name, never the job's own
    digest = _to_stdout(store, found) if str(target) == "-" else _download(store, found, target)
    if digest != found.sha256:
        fail(f"{found.name}: the downloaded bytes hash to {digest}, the manifest says {found.sha256}; "
             "nothing was kept", code=1)
    if str(target) != "-":
        say(f"{found.name}: {found.size_bytes:,} bytes, sha256 verified, written to {target}")


def _item(store: Any, run_id: str, attempt: int, name: str) -> ManifestItem:
    try:
        manifest = read_manifest(store, run_id, attempt)
    except EvidenceNotFound:
        fail(f"no manifest for run {run_id!r} attempt {attempt} in {store.describe()}; "
             "`trainguard evidence show RUN_ID` lists the attempts")
    except (ManifestError, EvidenceStoreError) as exc:
        fail(f"cannot read the manifest of {run_id!r} attempt {attempt}: {exc}", code=1)
    for candidate in manifest.items:  # its printable name, its key, or the name the job gave the file
        if name in (candidate.name, candidate.key) or (candidate.original_name and name == candidate.original_name):
            return candidate
    names = ", ".join(i.name for i in manifest.items[:12])
    fail(f"ITEM {name!r} is not in the manifest of {run_id!r} attempt {attempt}; it lists: {names}")


def _to_stdout(store: Any, item: ManifestItem) -> str:
    """Fetch into an unnamed temporary file, and write to stdout only bytes whose SHA-256 is the manifest's."""
    with tempfile.TemporaryFile(prefix="trainguard-get-") as held:
        digest = _copy(store, item, held, show_progress=False)
        if digest == item.sha256:
            held.seek(0)
            shutil.copyfileobj(held, sys.stdout.buffer, 1024 * 1024)
            sys.stdout.buffer.flush()
    return digest


def _download(store: Any, item: ManifestItem, target: Path) -> str:
    """Stream into a temporary file beside ``target`` and rename it only once it is whole."""
    folder = target.parent if str(target.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=folder)
    except OSError as exc:
        fail(f"-o {target}: cannot write there ({exc.strerror or exc}); pass a writable path")
    try:
        with os.fdopen(fd, "wb") as out:
            digest = _copy(store, item, out, show_progress=item.size_bytes >= PROGRESS_FROM_BYTES)
        if digest == item.sha256:
            os.replace(tmp, target)
        return digest
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _copy(store: Any, item: ManifestItem, out: BinaryIO, show_progress: bool) -> str:
    digest = hashlib.sha256()
    columns = (BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    try:
        with Progress(*columns, console=console, disable=not show_progress, transient=True) as progress:
            task = progress.add_task("download", total=item.size_bytes)
            for chunk in store.read_chunks(item.key):
                out.write(chunk)
                digest.update(chunk)
                progress.advance(task, len(chunk))
    except EvidenceStoreError as exc:
        fail(f"{item.name}: {exc}", code=1)
    return digest.hexdigest()


@evidence_app.command("list")
def list_runs(
    limit: int = typer.Option(20, min=1, help="How many runs, newest first."),
    root: Path = ROOT_OPTION,
    block: str | None = BLOCK_OPTION,
) -> None:
    """Recent runs, each with its attempts and the verdict of its last attempt."""
    store = open_store(root, block)
    try:
        runs: dict[str, list[bundles.BundleRecord]] = {}
        for found in bundles.records(store):
            runs.setdefault(found.run_id, []).append(found)
    except EvidenceStoreError as exc:
        fail(f"cannot list {store.describe()}: {exc}", code=1)
    if not runs:
        fail(f"no evidence in {store.describe()}; check --root/--block", code=1)
    table = Table(title=plain(f"runs in {store.describe()}"))
    for column in ("run", "attempts", "last verdict", "category", "last attempt at"):
        table.add_column(column, overflow="fold")
    newest = sorted(runs.values(), key=lambda attempts: max(a.created_at for a in attempts), reverse=True)
    for attempts in newest[:limit]:
        last = max(attempts, key=lambda a: a.attempt)
        verdict = {"Completed": "[green]succeeded[/]", None: "[yellow]no verdict[/]"}.get(last.state, "[red]failed[/]")
        table.add_row(plain(last.run_id), str(len(attempts)), verdict, plain(last.category or "-"), plain(last.created_at))
    console.print(table)


def _block_store(block: str | None, command: str, able: str) -> EvidenceStore:
    """The store a saved block names, for a command only some stores can serve (``able`` says what)."""
    if not block:
        fail(f"--block: `trainguard evidence {command}` needs a saved S3 evidence block "
             f"(trainguard-s3-evidence-store/NAME); a folder {able}")
    return open_store(Path("."), block, no_time_limit=True)


def _spooling_store(block: str | None) -> SpoolingStore:
    store = _block_store(block, "flush", "has nothing to upload")
    if not isinstance(store, SpoolingStore):
        fail(f"--block {block}: its store spools nothing; name a trainguard-s3-evidence-store block")
    return store


def _lifecycle_store(block: str | None) -> LifecycleStore:
    store = _block_store(block, "retention apply", "has no lifecycle rules")
    if not isinstance(store, LifecycleStore):
        fail(f"--block {block}: its store has no lifecycle rules; name a trainguard-s3-evidence-store block")
    return store


@evidence_app.command("flush")
def flush(block: str | None = BLOCK_OPTION) -> None:
    """Upload what waits in the local spool (evidence S3 could not take in time), manifests last."""
    store = _spooling_store(block)
    where = store.describe() if isinstance(store, EvidenceStore) else str(block)
    waiting = store.pending()
    if not waiting:
        say(f"nothing spooled for {where}")
        return
    say(f"uploading {len(waiting)} spooled item(s) to {where}")
    result = store.flush()
    console.print(f"uploaded {len(result.uploaded)}, still spooled {len(result.pending)}", highlight=False)
    if result.pending:
        fail(f"{result.error or 'upload incomplete'}; the spool at {store.spool_location()} is kept", code=1)


@retention_app.command("apply")
def retention_apply(
    block: str | None = BLOCK_OPTION,
    failed_days: int = typer.Option(30, help="Days to keep failed attempts (at least 7)."),
    succeeded_days: int = typer.Option(7, help="Days to keep successful attempts (at least 7)."),
) -> None:
    """Put lifecycle rules on the block's prefix: failed and successful attempts expire after their days."""
    keep = _retention(failed_days, succeeded_days)
    store = _lifecycle_store(block)
    try:
        rules = retention.apply_lifecycle(store, keep)
    except EvidenceStoreError as exc:
        fail(str(exc), code=1)
    for rule in rules:
        action = rule.get("Expiration") or rule.get("AbortIncompleteMultipartUpload")
        say(f"{rule['ID']}: {action}")


def _retention(failed_days: int, succeeded_days: int) -> retention.Retention:
    try:
        return retention.Retention(failed_days=failed_days, succeeded_days=succeeded_days)
    except retention.RetentionError as exc:
        fail(f"--{str(exc).replace('_', '-')}")


@evidence_app.command("prune")
def prune(
    failed_days: int = typer.Option(30, help="Delete failed attempts older than this (at least 7)."),
    succeeded_days: int = typer.Option(7, help="Delete successful attempts older than this (at least 7)."),
    dry_run: bool = typer.Option(False, help="Only say what would be deleted."),
    root: Path = ROOT_OPTION,
    block: str | None = BLOCK_OPTION,
) -> None:
    """Delete attempts past their retention; a run's newest failure is always kept."""
    keep = _retention(failed_days, succeeded_days)
    store = open_store(root, block)

    def report(decision: retention.PruneDecision) -> None:
        verb = ("would delete" if dry_run else "deleted") if decision.delete else "kept"
        say(f"{decision.attempt.run_id} attempt {decision.attempt.attempt}: {verb} ({decision.reason})")

    try:
        decisions = retention.prune(store, keep, dry_run=dry_run, on_decision=report)
    except EvidenceStoreError as exc:
        fail(f"prune stopped: {exc}", code=1)
    console.print(f"{sum(d.delete for d in decisions)} of {len(decisions)} attempt(s) "
                  f"{'would be ' if dry_run else ''}deleted", highlight=False)
