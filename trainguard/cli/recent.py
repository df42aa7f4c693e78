"""`trainguard runs`: the recent runs in an evidence store and the work folder, with their last state.

A run shows up once any of its attempts left evidence or a work folder; its last state is the
newest attempt's verdict, "running" while the process that supervises it is alive (its pid and
start time in ``process.json``), or "lost" when that attempt was never judged and nothing runs it
(a killed process), with the command that continues it. Running anything belongs to
``trainguard run``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import typer
from rich.table import Table

from trainguard.cli.typer_app import app
from trainguard.cli.output import console, fail, plain
from trainguard.core import recovery
from trainguard.core.backends.local import orphans
from trainguard.core.evidence import manifest
from trainguard.core.stores.base import EvidenceNotFound, EvidenceStore, LocalEvidenceStore

_RUN = re.compile(r"^runs/([^/]+)/attempt-(\d+)/")


@app.command("runs")
def runs(
    root: Path = typer.Option(Path("trainguard-data/evidence"), help="Evidence folder (used without --block)."),
    work: Path = typer.Option(Path("trainguard-data/work"), help="Work folder of the local backend."),
    block: str | None = typer.Option(None, help="Name of a saved evidence block to read instead of --root."),
    limit: int = typer.Option(20, min=1, help="Show at most this many runs, newest first."),
) -> None:
    """List recent runs: attempts, last state and category, and how to continue a lost one."""
    store = _store(root, block)
    found = _runs(store, work)
    if not found:
        fail(f"no runs in {store.describe() if store else root} or {work}; run `trainguard run SPEC` first", code=1)
    table = Table(title="trainguard runs")
    for column in ("run", "attempts", "last state", "category", "last change", "next"):
        table.add_column(column, overflow="fold")
    for run_id, (attempts, changed) in sorted(found.items(), key=lambda item: item[1][1], reverse=True)[:limit]:
        last = recovery.verdict(store, run_id, attempts[-1]) if store else None
        pid = orphans.live_supervisor(work / "runs" / run_id / f"attempt-{attempts[-1]}" / "process.json")
        state = "running" if pid else last.state if last else "lost"
        category = (last.category or "-") if last else "-"
        nxt = (f"attempt {attempts[-1]} runs under pid {pid}" if pid else str(last.decision.get("reason", "-"))
               if last else f"trainguard run SPEC --resume {run_id}")
        table.add_row(plain(run_id), str(len(attempts)), plain(state), plain(category),
                      _when(changed), plain(nxt))
    console.print(table)


def _store(root: Path, block: str | None) -> EvidenceStore | None:
    if block:
        from blocks import load_evidence  # Prefect only when a saved block is asked for

        return load_evidence(block)
    return LocalEvidenceStore(root.resolve()) if root.is_dir() else None


def _runs(store: EvidenceStore | None, work: Path) -> dict[str, tuple[list[int], float]]:
    """run id -> (attempt numbers, newest modification time) from both places."""
    attempts: dict[str, set[int]] = {}
    for key in store.list_keys("runs/") if store else []:
        if match := _RUN.match(key):
            attempts.setdefault(match.group(1), set()).add(int(match.group(2)))
    runs_dir = work / "runs"
    for folder in runs_dir.glob("*/attempt-*") if runs_dir.is_dir() else []:
        if folder.name.removeprefix("attempt-").isdigit():
            attempts.setdefault(folder.parent.name, set()).add(int(folder.name.removeprefix("attempt-")))
    return {run_id: (sorted(numbers), _changed(run_id, store, work, max(numbers)))
            for run_id, numbers in attempts.items()}


def _changed(run_id: str, store: EvidenceStore | None, work: Path, newest_attempt: int) -> float:
    """The run's last change: folder times where it lies in folders, else its newest manifest's date."""
    folders = [work / "runs" / run_id]
    if isinstance(store, LocalEvidenceStore):
        folders.append(store.root / "runs" / run_id)
    times = []
    for folder in folders:
        if folder.exists():
            times.append(folder.stat().st_mtime)
            times.extend(p.stat().st_mtime for p in folder.glob("attempt-*"))
    if store is not None and not isinstance(store, LocalEvidenceStore):  # an object store: no folders to stat
        times.append(_created(store, run_id, newest_attempt))
    return max(times, default=0.0)


def _created(store: EvidenceStore, run_id: str, attempt: int) -> float:
    try:
        stamp = datetime.fromisoformat(manifest.read_manifest(store, run_id, attempt).created_at)
    except (EvidenceNotFound, ValueError):  # no manifest yet (a lost attempt), or an unreadable date
        return 0.0
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()


def _when(timestamp: float) -> str:
    if not timestamp:
        return "-"
    return datetime.fromtimestamp(timestamp).astimezone().strftime("%Y-%m-%d %H:%M:%S")
