"""The fleet report flow: the verdict index of a window, published as the `trainguard-fleet` artifact,
and one `trainguard.fleet.suspect-node` event per suspect node, with the evidence in its payload.

`prefect.yaml` runs it daily (`fleet-report/daily`); `trainguard fleet --markdown` runs it once. An
automation can match the event's `trainguard.node` label (notify someone, or run a cordon flow).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.events import emit_event

from blocks import load_evidence
from blocks.factories import evidence_folder
from tasks.fleet import publish_fleet_report
from trainguard.core.evidence import index
from trainguard.core.fleet import render
from trainguard.core.fleet.analysis import FleetView, Suspect, Tally

SUSPECT_NODE = "trainguard.fleet.suspect-node"


@task(name="read_fleet", cache_policy=NO_CACHE)
def read_fleet(evidence_block: str | None, root: str | None, since_hours: float) -> FleetView:
    """The fleet view of the window from the store's verdict index (closed days are compacted on the way)."""
    store = evidence_folder(root) if root and not evidence_block else load_evidence(evidence_block)
    now = datetime.now(UTC)
    reader = index.IndexReader(store, now=now)
    view = Tally().add_all(reader.records(now - timedelta(hours=since_hours), now)).view()
    for problem in reader.problems:
        get_run_logger().warning("%s", problem)
    return view


def suspect_event(suspect: Suspect, window: str) -> None:
    """One event for a suspect node; its evidence is the payload (masked as the JSON view is)."""
    payload = render.to_json_suspect(suspect)
    emit_event(event=SUSPECT_NODE, payload={**payload, "window": window},
               resource={"prefect.resource.id": f"trainguard.node.{payload['node']}",
                         "prefect.resource.name": payload["node"], "trainguard.node": payload["node"]})


@flow(name="fleet-report")
def fleet_report(since_hours: float = 24 * 7, evidence_block: str | None = None, root: str | None = None,
                 emit_events: bool = True) -> dict[str, Any]:
    """Publish the fleet view of the last ``since_hours`` and emit an event per suspect node.

    Args:
        since_hours: The window, in hours back from now.
        evidence_block: The saved evidence block whose index is read (None: the evidence folder).
        root: An evidence folder to read instead of a block (the CLI's ``--root``).
        emit_events: Whether to emit `trainguard.fleet.suspect-node` events.
    """
    view = read_fleet(evidence_block, root, since_hours)
    title = f"trainguard fleet: the last {since_hours:g} hours to {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    markdown = render.markdown(view, title)
    publish_fleet_report(markdown, title)
    if emit_events:
        for suspect in view.suspects:
            suspect_event(suspect, f"{since_hours:g}h")
    return {"markdown": markdown, "suspects": [s.node for s in view.suspects]}
