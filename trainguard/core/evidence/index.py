"""The verdict index: one compact record per judged attempt, so the fleet's month is read in seconds.

Written at verdict time under ``index/verdicts/<YYYY-MM-DD>/`` (the UTC day the verdict was
reached), one small object per attempt (``<run id>.a<n>.json``): a store has no append, and one
object per writer needs no lock, on a folder or in S3. Rewriting an attempt's verdict rewrites its
object. Once a day is closed (an hour past its end), a reader compacts it: every record of the
day into one JSON-lines object (``compacted-<digest>.jsonl``), written before the objects it
replaces are deleted, so every record is always in some object, whoever compacts at the same time
(two compactors leave two parts, which the next compaction merges; readers keep one record per
attempt, the newest). What the fleet view makes of the records is ``trainguard.core.fleet``'s.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

from trainguard.core import masking
from trainguard.core.attempt import AttemptSummary
from trainguard.core.stores.base import EvidenceNotFound, EvidenceStore

PREFIX = "index/verdicts/"
VERSION = 1
SIGNATURE_LIMIT = 300  # characters of the deciding line kept in the index (the verdict keeps it whole)
NODE_LIMIT = 253  # a DNS name's length: longer is not a node name
AVOID_LIMIT = 64  # avoid-list entries recorded per attempt
CLOSED_AFTER = timedelta(hours=1)  # a day is compacted this long after it ended (late writers, clock skew)
_PART = "compacted-"


def entry(summary: AttemptSummary, recorded_at: datetime) -> dict[str, Any]:
    """The compact record of one attempt's verdict (masked, bounded).

    ``node`` is where the failure is placed: the culprit's node on several nodes, else the
    attempt's; ``nodes`` every node the verdict names.
    """
    root = summary.root_cause or {}
    named = [summary.node, root.get("node"), *(v.get("node") for v in summary.victims)]
    culprit = root.get("node") or summary.node
    return {
        "v": VERSION, "run": summary.run_id, "attempt": summary.attempt,
        "ended_at": _stamp(recorded_at), "state": summary.state, "category": summary.category,
        "rule": summary.rule_id, "fingerprint": summary.fingerprint,
        "signature": _bounded(summary.signature or "", SIGNATURE_LIMIT),
        "node": _bounded(culprit, NODE_LIMIT) if culprit else None,
        "nodes": sorted({_bounded(n, NODE_LIMIT) for n in named if isinstance(n, str) and n}),
        "gpu_seconds": round(summary.gpu_seconds, 1),
        "retried": bool(summary.decision.get("retry")),
        "avoid": [masking.mask_tree(dict(e)) for e in summary.avoid_list[:AVOID_LIMIT]],
    }


def entry_key(run_id: str, attempt: int, recorded_at: datetime) -> str:
    """Where an attempt's record is written."""
    return f"{PREFIX}{recorded_at.astimezone(UTC).date().isoformat()}/{run_id}.a{attempt}.json"


def keep(store: EvidenceStore, summary: AttemptSummary, now: datetime | None = None) -> tuple[str, str | None]:
    """Write the attempt's record into the index; never raises.

    Returns:
        The record's key, and None or one line saying why the index could not take it (the
        attempt's verdict is kept all the same; only the fleet view misses it).
    """
    now = now or datetime.now(UTC)
    key = entry_key(summary.run_id, summary.attempt, now)
    try:
        store.put_bytes(key, json.dumps(entry(summary, now), separators=(",", ":")).encode("utf-8"))
    except Exception as exc:  # the index is a view over verdicts; it must never cost the attempt
        return key, f"verdict index {key} could not be written: {type(exc).__name__}: {exc}"
    return key, None


def days(since: datetime, until: datetime) -> list[str]:
    """The UTC days from ``since`` to ``until``, oldest first."""
    first, last = since.astimezone(UTC).date(), until.astimezone(UTC).date()
    return [(first + timedelta(days=n)).isoformat() for n in range((last - first).days + 1)]


class IndexReader:
    """Reads the index's records of a time window day by day, compacting closed days on the way.

    Attributes:
        problems: One line per thing that could not be read or compacted (the rest is still read).
        objects: Objects read.
        skipped: Records that were not records (a tampered or foreign object), left out.
    """

    def __init__(self, store: EvidenceStore, compact: bool = True, now: datetime | None = None) -> None:
        self.store, self.compact, self.now = store, compact, now or datetime.now(UTC)
        self.problems: list[str] = []
        self.objects = 0
        self.skipped = 0

    def records(self, since: datetime, until: datetime | None = None) -> Iterator[dict[str, Any]]:
        """Every record from ``since`` to ``until`` (default now), one per attempt, day by day."""
        low, high = _stamp(since), _stamp(until or self.now)
        for day in days(since, until or self.now):
            for record in self.day(day):
                if low <= record["ended_at"] <= high:
                    yield record

    def day(self, day: str) -> list[dict[str, Any]]:
        """One day's records, one per attempt (the newest); compacted first if the day is closed."""
        try:
            keys = self.store.list_keys(f"{PREFIX}{day}/")
        except Exception as exc:
            self.problems.append(f"the index of {day} could not be listed: {type(exc).__name__}: {exc}")
            return []
        newest: dict[tuple[str, int], dict[str, Any]] = {}
        for key in keys:
            for record in self._read(key):
                ident = (record["run"], record["attempt"])
                found = newest.get(ident)
                if found is None or record["ended_at"] >= found["ended_at"]:
                    newest[ident] = record
        records = list(newest.values())
        if self.compact and self._closed(day) and (len(keys) > 1 or any(not k.endswith(".jsonl") for k in keys)):
            self._compact(day, keys, sorted(records, key=lambda r: (r["ended_at"], r["run"], r["attempt"])))
        return records

    def _read(self, key: str) -> list[dict[str, Any]]:
        try:
            data = self.store.get_bytes(key)
        except EvidenceNotFound:  # compacted away by another reader meanwhile: its part holds the records
            return []
        except Exception as exc:
            self.problems.append(f"{key} could not be read: {type(exc).__name__}: {exc}")
            return []
        self.objects += 1
        kept = []
        for line in data.splitlines() if key.endswith(".jsonl") else [data]:
            record = _record(line)
            if record is None:
                self.skipped += 1
            else:
                kept.append(record)
        return kept

    def _closed(self, day: str) -> bool:
        return self.now >= datetime.combine(date.fromisoformat(day), datetime.min.time(), UTC) + \
            timedelta(days=1) + CLOSED_AFTER

    def _compact(self, day: str, keys: list[str], records: list[dict[str, Any]]) -> None:
        """One JSON-lines part for the day, written before the objects it replaces are deleted."""
        body = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode("utf-8")
        part = f"{PREFIX}{day}/{_PART}{hashlib.sha256(body).hexdigest()[:16]}.jsonl"
        try:
            self.store.put_bytes(part, body)
            for key in keys:
                if key != part:
                    self.store.delete(key)
        except Exception as exc:  # a reader without write access still reads; the next one compacts
            self.problems.append(f"the index of {day} could not be compacted: {type(exc).__name__}: {exc}")


def _record(line: bytes) -> dict[str, Any] | None:
    """A record as written, or None for anything else (checked just enough to be used safely)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if type(record) is not dict or type(record.get("run")) is not str \
            or type(record.get("attempt")) is not int or type(record.get("ended_at")) is not str:
        return None
    return record


def _stamp(moment: datetime) -> str:
    """ISO-8601 UTC to the second, so records compare as strings."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _bounded(text: str, limit: int) -> str:
    """``text`` masked, without control sequences, on one line, at most ``limit`` characters."""
    flat = " ".join(masking.for_people(text).splitlines())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
