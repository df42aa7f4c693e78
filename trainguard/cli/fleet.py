"""`trainguard fleet`: the verdicts of many runs together, by node and by root cause, and the nodes to avoid.

Reads the store's verdict index (never the bundles), tallies it (``trainguard.core.fleet``) and
prints rich tables; ``--json`` for machines, ``--markdown`` publishes the ``trainguard-fleet``
artifact, ``--apply`` adds the suspects to the shared avoid list. Prefect is imported only for
those two.
"""

from __future__ import annotations

import getpass
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import typer
from rich.table import Table

from trainguard.cli.evidence import open_store
from trainguard.cli.output import console, errors, fail, plain, say
from trainguard.cli.typer_app import app
from trainguard.core.home import data_path
from trainguard.core.evidence import index
from trainguard.core.fleet import render
from trainguard.core.fleet.analysis import FleetView, Tally
from trainguard.core.fleet.avoid import VARIABLE, AvoidListError, Entry

_SINCE = re.compile(r"(\d{1,4})([hdw])")
_UNIT_HOURS = {"h": 1, "d": 24, "w": 24 * 7}
MAX_SINCE = timedelta(days=366)


def parse_since(text: str) -> timedelta:
    """``36h``, ``7d`` or ``2w`` as a duration; a one-line error for anything else."""
    found = _SINCE.fullmatch(text.strip())
    if not found or int(found.group(1)) == 0:
        fail(f"--since: {text[:40]!r} is not a duration; write a whole number and h, d or w (e.g. 36h, 7d, 2w)")
    window = timedelta(hours=int(found.group(1)) * _UNIT_HOURS[found.group(2)])
    if window > MAX_SINCE:
        fail(f"--since: {text!r} is more than a year; the index is read day by day, ask for at most 366d")
    return window


@app.command("fleet")
def fleet(
    since: str = typer.Option("7d", help="How far back: 36h, 7d, 2w."),
    root: Path = typer.Option(Path("trainguard-data/evidence"), callback=data_path, help="Evidence folder (used without --block)."),
    block: str | None = typer.Option(None, help="A saved evidence block ('block-type-slug/name') instead of --root."),
    as_json: bool = typer.Option(False, "--json", help="Print the whole view as JSON."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown and publish it as the Prefect "
                                  "artifact 'trainguard-fleet'."),
    apply: bool = typer.Option(False, "--apply", help="Add the suggested nodes to the shared avoid list "
                               "(the Prefect Variable 'trainguard-avoid-nodes')."),
    avoid_days: float = typer.Option(7.0, help="How long an entry --apply adds stays in force, in days."),
) -> None:
    """Per node and per failure fingerprint over a time window, and the nodes to avoid, from the verdict index."""
    window = parse_since(since)
    if not 0 < avoid_days <= 90:
        fail(f"--avoid-days: {avoid_days:g} is out of range; give a number of days above 0 and at most 90")
    store = open_store(root, block)
    seen = _read_list() if apply else []  # checked before a month of the index is read
    now = datetime.now(UTC)
    reader = index.IndexReader(store, now=now)
    view = Tally().add_all(reader.records(now - window, now)).view()
    _report_reading(reader, store.describe(index.PREFIX))
    title = f"trainguard fleet: {since} to {now:%Y-%m-%d %H:%M} UTC, {store.describe()}"
    if as_json:
        data = render.to_json(view, {"since": (now - window).isoformat(), "until": now.isoformat()})
        typer.echo(json.dumps(data, indent=2))
    elif markdown:
        _publish(window, root, block)
    else:
        _tables(view, title)
    if apply:
        _apply(view, avoid_days, seen)


def _report_reading(reader: index.IndexReader, where: str) -> None:
    """Say plainly what could not be read; stop only when nothing could be."""
    for problem in reader.problems:
        errors.print(plain(f"warning: {problem}", "yellow"), highlight=False, soft_wrap=True)
    if reader.problems and reader.objects == 0:
        fail(f"the verdict index at {where} could not be read ({len(reader.problems)} problems, the first: "
             f"{reader.problems[0]}); check --root/--block and the store's access")
    if reader.skipped:
        errors.print(plain(f"warning: {reader.skipped} index records were not records and were left out", "yellow"))


def _tables(view: FleetView, title: str) -> None:
    say(plain(title, "bold"))
    say(f"{view.attempts} attempts, {view.failures} failed ({view.hardware_failures} on hardware), "
        f"{view.gpu_hours_wasted:,.1f} GPU-hours of failed attempts that no checkpoint kept")
    suggested = Table(title="suggested actions")
    for column in ("avoid node", "evidence", "latest failures"):
        suggested.add_column(column, overflow="fold")
    for suspect in view.suspects:
        latest = "\n".join(f"{e['ended_at']} {e['run']} a{e['attempt']} {e['category']}: {e['signature']}"[:200]
                           for e in suspect.examples)
        suggested.add_row(plain(suspect.node, "bold red"), plain(render.evidence_line(suspect)), plain(latest))
    console.print(suggested if view.suspects else plain("no node fails on hardware well above the fleet"))
    nodes = Table(title="nodes")
    for column in ("node", "attempts", *render.NODE_COLUMNS, "GPU-h wasted", "last failure"):
        nodes.add_column(column, overflow="fold")
    for row in view.nodes:
        hardware, rate, others = render.node_cells(row)
        nodes.add_row(plain(row.node), str(row.attempts), plain(hardware), rate, plain(others),
                      f"{row.gpu_hours_wasted:,.1f}", plain(row.last_failure or "-"))
    console.print(nodes)
    prints = Table(title="the same failure across runs")
    for column in ("fingerprint", "category", "rule", "first seen", "last seen", "runs", "nodes", "example"):
        prints.add_column(column, overflow="fold")
    for fp in view.fingerprints:
        prints.add_row(plain(fp.fingerprint[:16]), plain(fp.category), plain(fp.rule), plain(fp.first_seen),
                       plain(fp.last_seen), str(fp.runs), plain(", ".join(fp.nodes)[:200]), plain(fp.example))
    console.print(prints)


def _publish(since: timedelta, root: Path, block: str | None) -> None:
    from flows.fleet import fleet_report  # Prefect only when publishing
    from tasks.fleet import ARTIFACT_KEY

    try:
        done = fleet_report(since_hours=since.total_seconds() / 3600, evidence_block=block,
                            root=None if block else str(root), emit_events=False)
    except Exception as exc:
        fail(f"--markdown: the artifact {ARTIFACT_KEY!r} could not be published: {type(exc).__name__}: {exc}; "
             "check PREFECT_API_URL")
    typer.echo(done["markdown"])
    say(f"published the Prefect artifact {ARTIFACT_KEY!r}")


def _read_list() -> list[Entry]:
    from tasks.fleet import read_list  # Prefect only when the list is changed

    try:
        return read_list()
    except AvoidListError as exc:
        fail(f"--apply: {exc}; fix the Variable in the UI, then try again")
    except Exception as exc:
        fail(f"--apply: the Variable {VARIABLE!r} could not be read: {type(exc).__name__}: {exc}; "
             "check PREFECT_API_URL")


def _apply(view: FleetView, days: float, seen: list[Entry]) -> None:
    from tasks.fleet import add_to_list

    if not view.suspects:
        say("--apply: no node to add to the shared avoid list")
        return
    pairs = [(s.node, render.evidence_line(s)) for s in view.suspects]
    try:
        entries, merged = add_to_list(seen, pairs, days, f"trainguard fleet --apply ({getpass.getuser()})")
    except AvoidListError as exc:
        fail(f"--apply: {exc}; fix the Variable in the UI, then try again")
    except Exception as exc:
        fail(f"--apply: the Variable {VARIABLE!r} could not be updated: {type(exc).__name__}: {exc}; "
             "check PREFECT_API_URL")
    if merged:
        say(f"--apply: kept {len(merged)} edits others made to {VARIABLE} while this ran: ", "; ".join(merged))
    say(f"--apply: {VARIABLE} now holds {len(entries)} entries; added or extended for {days:g} days: ",
        ", ".join(node for node, _ in pairs))
