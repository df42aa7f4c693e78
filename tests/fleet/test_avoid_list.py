"""The shared avoid list's plan for one launch: what it avoids, and what it records without applying."""

from __future__ import annotations

from datetime import UTC, datetime

from trainguard.core.fleet import avoid

NOW = datetime(2026, 6, 1, tzinfo=UTC)
LATER = "2099-01-01T00:00:00Z"


def entry(node: str, expires_at: str = LATER) -> avoid.Entry:
    return avoid.Entry(node, "3 gpu_fault in 12 attempts", expires_at, "alice")


def test_an_entry_naming_no_placeable_node_is_recorded_not_applied_and_the_note_says_which() -> None:
    entries = [entry("gpu-b (ECC, RMA 4411)"), entry("gpu-node-1")]

    plan = avoid.plan(entries, NOW, ["gpu-node-1", "gpu-node-2"], needed=1)

    assert plan.avoid == ("gpu-node-1",)
    assert [e.node for e in plan.in_force] == ["gpu-b (ECC, RMA 4411)", "gpu-node-1"]
    assert plan.note == ("the shared avoid list names 1 node(s) the attempt could not be placed on, not applied: "
                         "'gpu-b (ECC, RMA 4411)'")


def test_an_entry_alone_that_names_no_node_avoids_nothing() -> None:
    plan = avoid.plan([entry("gpu-b (ECC, RMA 4411)")], NOW, ["gpu-node-1"], needed=1)

    assert plan.avoid == () and "not applied" in plan.note

