"""The shared avoid list: nodes no attempt should be placed on, each with a reason, an expiry and an author.

The list is kept as plain JSON (a Prefect Variable, which people edit in the UI; the flow layer reads
and writes it): a list of ``{node, reason, expires_at, added_by}``. `parse` reads it back and says in
one line what is wrong with an entry a person mistyped; expired entries are not in force. At launch
`plan` decides what the attempt avoids: every entry in force that names a node the backend could
place it on (an entry naming no such node, a typo or a note, is recorded and not applied), unless
that would leave fewer nodes than the attempt needs, in which case it runs anyway and says so. Nothing here reaches a cluster;
the caller passes the nodes the backend could place the attempt on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

VARIABLE = "trainguard-avoid-nodes"
MAX_VALUE_BYTES = 5000  # what a Prefect Variable holds, as compact JSON
REASON_CHARS = 160  # of a reason trainguard writes; a person's stays as typed
EXAMPLE = '[{"node": "gpu-17", "reason": "3 gpu_fault in 40 attempts", "expires_at": "2026-12-31T00:00:00Z", ' \
          '"added_by": "alice"}]'


@dataclass(frozen=True)
class Entry:
    """One node to avoid until ``expires_at`` (ISO-8601; UTC when it names no zone)."""

    node: str
    reason: str
    expires_at: str
    added_by: str

    def expiry(self) -> datetime:
        moment = datetime.fromisoformat(self.expires_at.replace("Z", "+00:00"))
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Plan:
    """What one launch does with the list.

    Attributes:
        in_force: The entries not yet expired (the verdict records them, applied or not).
        avoid: The nodes the attempt is kept off.
        note: Why the list was not applied (too few nodes would be left), or "".
    """

    in_force: tuple[Entry, ...]
    avoid: tuple[str, ...]
    note: str = ""


class AvoidListError(ValueError):
    """The list's value cannot be read; the message names the entry and field, and the fix."""


def parse(value: Any) -> list[Entry]:
    """The entries of the list's stored value (None: an empty list); raises `AvoidListError`."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise AvoidListError(f"{VARIABLE}: the value is a {type(value).__name__}, not a list; write e.g. {EXAMPLE}")
    return [_entry(n, item) for n, item in enumerate(value)]


def _entry(n: int, item: Any) -> Entry:
    where = f"{VARIABLE}[{n}]"
    if not isinstance(item, dict):
        raise AvoidListError(f"{where}: not an object; write e.g. {EXAMPLE}")
    for name in ("node", "expires_at"):
        if not isinstance(item.get(name), str) or not item[name].strip():
            raise AvoidListError(f"{where}.{name}: missing or not text; write e.g. {EXAMPLE}")
    entry = Entry(item["node"].strip(), str(item.get("reason") or ""), item["expires_at"].strip(),
                  str(item.get("added_by") or ""))
    try:
        entry.expiry()
    except ValueError:
        raise AvoidListError(f"{where}.expires_at: {entry.expires_at[:40]!r} is not a date; write ISO-8601 "
                             "such as 2026-12-31T00:00:00Z") from None
    return entry


def in_force(entries: Iterable[Entry], now: datetime) -> list[Entry]:
    """The entries that have not expired at ``now``."""
    return [entry for entry in entries if entry.expiry() > now]


def plan(entries: Iterable[Entry], now: datetime, known_nodes: Sequence[str] | None, needed: int) -> Plan:
    """What a launch avoids: the nodes of the entries in force, if enough nodes are left without them.

    Args:
        entries: The list as read.
        now: The launch's time (expired entries are ignored).
        known_nodes: The nodes the backend could place the attempt on; None when it cannot say
            (then the list is applied, and the platform says if nothing is left).
        needed: The nodes the attempt needs.
    """
    active = tuple(in_force(entries, now))
    nodes = tuple(sorted({entry.node for entry in active}))
    if not nodes or known_nodes is None:
        return Plan(active, nodes)
    listed = set(known_nodes)
    unknown = sorted(set(nodes) - listed)
    nodes = tuple(node for node in nodes if node in listed)
    note = (f"the shared avoid list names {len(unknown)} node(s) the attempt could not be placed on, not "
            f"applied: {', '.join(repr(n[:60]) for n in unknown[:5])}{' ...' if len(unknown) > 5 else ''}"
            if unknown else "")
    left = listed - set(nodes)
    if len(left) >= needed:
        return Plan(active, nodes, note)
    avoided = sorted(set(known_nodes) & set(nodes))
    note = (f"the shared avoid list was not applied: avoiding {', '.join(avoided)} would leave {len(left)} of "
            f"{len(set(known_nodes))} nodes, and the attempt needs {needed}; it ran anyway")
    return Plan(active, (), note)


def add(entries: Sequence[Entry], nodes: Iterable[tuple[str, str]], now: datetime, days: float,
        added_by: str) -> list[Entry]:
    """The list with ``(node, reason)`` pairs added, each for ``days``; a node listed already gets the
    later expiry and the new reason. Expired entries are dropped: they avoid nothing, and the list
    must fit in its Variable (`MAX_VALUE_BYTES`).

    Raises:
        AvoidListError: The entries in force do not fit, even so; the message says how many and what to do.
    """
    expires = (now + timedelta(days=days)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    kept = {entry.node: entry for entry in entries if entry.expiry() > now}
    for node, reason in nodes:
        old = kept.get(node)
        if old is None or old.expiry() < now + timedelta(days=days):
            kept[node] = Entry(node, " ".join(reason.split())[:REASON_CHARS], expires, added_by)
    result = list(kept.values())
    if (size := stored_size(result)) > MAX_VALUE_BYTES:
        raise AvoidListError(f"{VARIABLE}: its {len(result)} entries in force would take {size:,} characters, over "
                             f"the {MAX_VALUE_BYTES:,} a Prefect Variable holds; remove the entries no longer "
                             "needed (or shorten their reasons)")
    return result


def stored_size(entries: Sequence[Entry]) -> int:
    """The list's size as its Variable stores it (compact JSON, UTF-8)."""
    return len(json.dumps([e.to_dict() for e in entries], separators=(",", ":"), ensure_ascii=False).encode())


def changes(before: Sequence[Entry], after: Sequence[Entry], ignore: Iterable[str] = ()) -> list[str]:
    """What someone changed from ``before`` to ``after``, one phrase per node (added, changed, removed),
    leaving out the nodes in ``ignore`` (the ones the caller is writing itself)."""
    old, new, skip = {e.node: e for e in before}, {e.node: e for e in after}, set(ignore)
    said = []
    for node, entry in new.items():
        by = f" by {entry.added_by}" if entry.added_by else ""
        if node in skip or old.get(node) == entry:
            continue
        said.append(f"{node} {'added' if node not in old else 'changed'}{by} (until {entry.expires_at})")
    said += [f"{node} removed" for node in old if node not in new and node not in skip]
    return [" ".join(phrase.split()) for phrase in said]  # one line whatever a person typed

