"""`trainguard runs`: the recent runs in an evidence store and a backend's folders, with their last state.

A run shows up once any of its attempts left evidence or an attempt folder (the local backend's
work folder by default, or a saved backend's, through `Supervises`); its last state is the newest
attempt's verdict, "running" while the process that supervises it is alive (the backend's record
of its pid and start time), or "lost" when that attempt was never judged and nothing runs it (a
killed process), with the command that continues it. Running anything belongs to ``trainguard run``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import typer
from rich.table import Table

from blocks.factories import evidence_folder, local_backend
from trainguard.cli.typer_app import app
from trainguard.core.home import data_path
from trainguard.cli.output import console, fail, plain
from trainguard.core import ids
from trainguard.core.backends.base import Backend
from trainguard.core.backends.capabilities import Supervises
from trainguard.core.evidence import manifest, verdicts
from trainguard.core.stores.base import EvidenceNotFound, EvidenceStore


@app.command("runs")
def runs(
    root: Path = typer.Option(Path("trainguard-data/evidence"), callback=data_path, help="Evidence folder (used without --block)."),
    work: Path = typer.Option(Path("trainguard-data/work"), callback=data_path, help="Work folder of the local backend (without --backend)."),
    block: str | None = typer.Option(None, help="Name of a saved evidence block to read instead of --root."),
    backend_block: str | None = typer.Option(
        None, "--backend", help="A saved backend block ('block-type-slug/name') whose attempt folders to read "
        "instead of --work (a Slurm backend's shared folder)."),
    limit: int = typer.Option(20, min=1, help="Show at most this many runs, newest first."),
) -> None:
    """List recent runs: attempts, last state and category, and how to continue a lost one."""
    store = _store(root, block)
    backend = backend_for(work, backend_block)
    found = _runs(store, backend)
    if not found:
        fail(f"no runs in {store.describe() if store else root} or {work}; run `trainguard run SPEC` first", code=1)
    table = Table(title="trainguard runs")
    for column in ("run", "attempts", "last state", "category", "last change", "next"):
        table.add_column(column, overflow="fold")
    for run_id, (attempts, changed) in sorted(found.items(), key=lambda item: item[1][1], reverse=True)[:limit]:
        last = verdicts.read(store, run_id, attempts[-1]) if store else None
        pid = backend.supervisor_pid(run_id, attempts[-1]) if isinstance(backend, Supervises) else None
        state = "running" if pid else last.state if last else "lost"
        category = (last.category or "-") if last else "-"
        decided = last.decision.reason if last and last.decision else "-"
        nxt = (f"attempt {attempts[-1]} runs under pid {pid}" if pid else decided
               if last else f"trainguard run SPEC --resume {run_id}")
        table.add_row(plain(run_id), str(len(attempts)), plain(state), plain(category),
                      _when(changed), plain(nxt))
    console.print(table)


def _store(root: Path, block: str | None) -> EvidenceStore | None:
    if block:
        from blocks import load_evidence  # Prefect only when a saved block is asked for

        return load_evidence(block)
    return evidence_folder(root) if root.is_dir() else None


def backend_for(work: Path, reference: str | None) -> Backend:
    """The saved backend block `reference` names (`--backend`), else the local backend over `work`."""
    if reference:
        from blocks import BlockReferenceError, load_backend  # Prefect only when a saved block is asked for

        try:
            return load_backend(reference)
        except BlockReferenceError as exc:
            fail(f"--backend: {exc}")
    return local_backend(work)


def _runs(store: EvidenceStore | None, backend: Backend) -> dict[str, tuple[list[int], float]]:
    """run id -> (attempt numbers, when it last changed) from the store and the backend's own places."""
    attempts: dict[str, set[int]] = {}
    changed: dict[str, float] = {}
    for key in store.list_keys(ids.RUNS + "/") if store else []:
        if found := ids.parse_attempt_path(key):
            attempts.setdefault(found[0], set()).add(found[1])
    if isinstance(backend, Supervises):
        changed = backend.runs()
        for run_id in changed:
            attempts.setdefault(run_id, set()).update(backend.attempts(run_id))
    return {run_id: (sorted(numbers), max(changed.get(run_id, 0.0), _created(store, run_id, max(numbers))))
            for run_id, numbers in attempts.items()}


def _created(store: EvidenceStore | None, run_id: str, attempt: int) -> float:
    """When the attempt's evidence was kept, from its manifest; 0 without one."""
    if store is None:
        return 0.0
    try:
        stamp = datetime.fromisoformat(manifest.read_manifest(store, run_id, attempt).created_at)
    except (EvidenceNotFound, ValueError):  # no manifest yet (a lost attempt), or an unreadable date
        return 0.0
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()


def _when(timestamp: float) -> str:
    if not timestamp:
        return "-"
    return datetime.fromtimestamp(timestamp).astimezone().strftime("%Y-%m-%d %H:%M:%S")
