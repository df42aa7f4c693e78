"""`trainguard evidence show RUN_ID`: what was kept of each attempt, verified against its manifest."""

from __future__ import annotations

import json
import re
from pathlib import Path

import typer
from rich.table import Table

from trainguard.cli.app import app
from trainguard.cli.output import console, fail
from trainguard.core import manifest as manifests
from trainguard.core.stores import EvidenceNotFound, EvidenceStore, LocalEvidenceStore

evidence_app = typer.Typer(help="Inspect the evidence kept for training runs.", no_args_is_help=True)
app.add_typer(evidence_app, name="evidence")

_ATTEMPT = re.compile(r"^runs/[^/]+/attempt-(\d+)/manifest\.json$")


@evidence_app.command("show")
def show(
    run_id: str = typer.Argument(..., help="The run id printed by `trainguard run` / `demo`."),
    root: Path = typer.Option(Path("trainguard-data/evidence"), help="Evidence folder (used without --block)."),
    block: str | None = typer.Option(None, help="Name of a saved evidence block to read instead of --root."),
) -> None:
    """List each attempt's evidence items, verify their sha256, and say why anything is missing."""
    store = _store(root, block)
    attempts = sorted(
        int(m.group(1)) for key in store.list_keys(f"runs/{run_id}/") if (m := _ATTEMPT.match(key))
    )
    if not attempts:
        fail(f"no evidence for run {run_id!r} in {store.describe()}; check the run id and --root/--block")
    bad = 0
    for attempt in attempts:
        bad += _show_attempt(store, run_id, attempt)
    if bad:
        fail(f"{bad} evidence item(s) failed verification", code=1)


def _store(root: Path, block: str | None) -> EvidenceStore:
    if block:
        from blocks import load_evidence  # Prefect only when a saved block is asked for

        return load_evidence(block).store()
    if not root.is_dir():
        fail(f"--root: no evidence folder at {root}; pass the folder your runs wrote to")
    return LocalEvidenceStore(root.resolve())


def _show_attempt(store: EvidenceStore, run_id: str, attempt: int) -> int:
    found = manifests.read_manifest(store, run_id, attempt)
    problems = manifests.verify_manifest(store, found)
    table = Table(title=f"{run_id} attempt {attempt}: {store.describe(manifests.attempt_prefix(run_id, attempt))}")
    for column in ("item", "size", "sha256", "source", "status"):
        table.add_column(column, overflow="fold")
    broken = {p.split(":", 1)[0] for p in problems}
    for item in found.items:
        status = "[red]FAILED[/]" if item.key in broken or item.name in broken else "[green]ok[/]"
        table.add_row(item.name, f"{item.size_bytes:,}", item.sha256[:12], item.source, status)
    for missing in found.missing:
        table.add_row(missing.name, "-", "-", missing.source, f"[yellow]absent[/]: {missing.reason}")
    console.print(table)
    _print_crash_summary(store, run_id, attempt)
    for problem in problems:
        console.print(f"[red]verification:[/] {problem}")
    return len(problems)


def _print_crash_summary(store: EvidenceStore, run_id: str, attempt: int) -> None:
    prefix = manifests.attempt_prefix(run_id, attempt)
    report, verdict = _json(store, f"{prefix}/crash-report.json"), _json(store, f"{prefix}/verdict.json")
    if report:
        signal = f", signal {report.get('signal_name')}" if report.get("signal") else ""
        console.print(f"  exit code {report.get('exit_code')}{signal}, {report.get('duration_seconds', 0):.1f}s")
    if verdict and verdict.get("category"):
        console.print(f"  {verdict['category']} ({verdict.get('rule_id')}): {verdict.get('signature')}", highlight=False)
    if verdict and verdict.get("decision"):
        console.print(f"  next: {verdict['decision'].get('reason')}", highlight=False)


def _json(store: EvidenceStore, key: str) -> dict | None:
    try:
        data = json.loads(store.get_bytes(key))
    except (EvidenceNotFound, ValueError):
        return None
    return data if isinstance(data, dict) else None
