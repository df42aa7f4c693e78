"""The fleet tasks: the shared avoid list (a Prefect Variable) read at launch and added to, and the fleet artifact.

The list is the Variable ``trainguard-avoid-nodes`` (people edit it in the UI's Variables page): a
JSON list of ``{node, reason, expires_at, added_by}``. Reading it never stops an attempt: a list
that cannot be read or parsed is said in the attempt's report and the attempt runs without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.variables import Variable

from trainguard.core.backends.base import Backend
from trainguard.core.backends.capabilities import PlacesOnNodes
from trainguard.core.fleet import avoid

ARTIFACT_KEY = "trainguard-fleet"
ROUNDS = 3  # writes of the avoid list before giving up on others writing over it


def read_list() -> list[avoid.Entry]:
    """The avoid list as it stands; raises `avoid.AvoidListError` for a value a person mistyped."""
    return avoid.parse(Variable.get(avoid.VARIABLE, default=None))


def add_to_list(seen: Sequence[avoid.Entry], nodes: Sequence[tuple[str, str]], days: float,
                added_by: str) -> tuple[list[avoid.Entry], list[str]]:
    """Add ``(node, reason)`` pairs to the list for ``days``, keeping what others changed meanwhile.

    A Variable has no compare-and-set, so the list is re-read right before writing and the pairs
    are added to it as it is then: an edit made since the caller read ``seen`` (a person in the UI)
    is kept, not overwritten. After writing, the list is read back; if someone wrote over it from
    an older copy, the pairs are added again on top of theirs (at most `ROUNDS` times). What is
    left unguarded is a write landing between the re-read and the write, one request apart.

    Returns:
        The list as written, and one phrase per edit of someone else's that was merged.
    """
    ours = [node for node, _ in nodes]
    merged: list[str] = []
    current = read_list()
    for _ in range(ROUNDS):
        merged += avoid.changes(seen, current, ignore=ours)
        entries = avoid.add(current, nodes, datetime.now(UTC), days, added_by)
        Variable.set(avoid.VARIABLE, [entry.to_dict() for entry in entries], overwrite=True)
        seen, current = entries, read_list()
        if current == entries:
            return entries, merged
    raise AvoidListBusy(f"{avoid.VARIABLE} changed under every one of {ROUNDS} writes; try again")


class AvoidListBusy(RuntimeError):
    """Others kept writing the list while it was being added to."""


@task(name="read_avoid_list", cache_policy=NO_CACHE)
def read_avoid_list(backend: Backend, needed: int) -> avoid.Plan:
    """The shared avoid list's plan for this launch: the entries in force, the nodes to avoid, and a note
    when it was not applied (it would leave too few nodes, or it could not be read)."""
    try:
        entries = read_list()
    except Exception as exc:  # a broken list must not stop training: say so, run without it
        note = f"the shared avoid list was not read ({type(exc).__name__}: {exc}); the attempt ran without it"
        get_run_logger().warning("%s", note)
        return avoid.Plan((), (), note)
    plan = avoid.plan(entries, datetime.now(UTC), _placeable(backend), needed)
    if plan.note:
        get_run_logger().warning("%s", plan.note)
    if plan.avoid:
        get_run_logger().info("the shared avoid list keeps this attempt off %s", ", ".join(plan.avoid))
    return plan


def _placeable(backend: Backend) -> list[str] | None:
    if not isinstance(backend, PlacesOnNodes):
        return None
    try:
        return backend.placeable_nodes()
    except Exception as exc:  # without the inventory the list is applied as it is
        get_run_logger().warning("could not list the nodes to place the attempt on: %s: %s", type(exc).__name__, exc)
        return None


@task(name="publish_fleet_report", cache_policy=NO_CACHE)
def publish_fleet_report(markdown: str, description: str) -> None:
    """The fleet view as the Markdown artifact ``trainguard-fleet`` (a new version each time)."""
    create_markdown_artifact(key=ARTIFACT_KEY, markdown=markdown, description=description)
