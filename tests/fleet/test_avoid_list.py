"""The shared avoid list's plan for one launch: what it avoids, and what it records without applying."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

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


def test_adding_drops_the_expired_entries_so_the_list_stays_what_is_in_force() -> None:
    expired = [entry(f"gpu-{n:02d}", "2026-01-01T00:00:00Z") for n in range(60)]
    assert avoid.stored_size(expired) > avoid.MAX_VALUE_BYTES  # the value a Variable refuses

    entries = avoid.add(expired, [("gpu-new", "2 hardware failures")], NOW, 3, "trainguard fleet --apply")

    assert [e.node for e in entries] == ["gpu-new"]
    assert avoid.stored_size(entries) <= avoid.MAX_VALUE_BYTES


def test_entries_in_force_that_cannot_fit_are_refused_in_one_line_naming_the_limit() -> None:
    listed = [entry(f"gpu-{n:02d}") for n in range(60)]

    with pytest.raises(avoid.AvoidListError) as raised:
        avoid.add(listed, [("gpu-new", "x" * 10_000)], NOW, 3, "fleet")

    message = str(raised.value)
    assert "61 entries in force" in message and "over the 5,000 a Prefect Variable holds" in message
    assert "\n" not in message


def test_a_reason_trainguard_writes_is_one_line_and_bounded() -> None:
    (added,) = avoid.add([], [("gpu-1", "a\nb " + "y" * 1000)], NOW, 3, "fleet")

    assert added.reason.startswith("a b y") and len(added.reason) == avoid.REASON_CHARS
