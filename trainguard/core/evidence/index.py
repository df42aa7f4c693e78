"""The verdict index: one compact record per judged attempt, so the fleet's month is read in seconds.

Written at verdict time under ``index/verdicts/<YYYY-MM-DD>/`` (the UTC day the verdict was
reached), one small object per attempt (``<run id>.a<n>.json``): a store has no append, and one
object per writer needs no lock, on a folder or in S3. Rewriting an attempt's verdict rewrites its
object; rewriting it on a later day (after midnight) leaves a record on each day. Once a day is
closed (an hour past its end), a reader compacts it: every record of the day into one JSON-lines
object (``compacted-<digest>.jsonl``), written before the objects it replaces are deleted, so every
record is always in some object, whoever compacts at the same time (two compactors leave two
parts, which the next compaction merges). Readers keep one record per attempt over the whole
window, the newest. What the fleet view makes of the records is ``trainguard.core.fleet``'s.
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
        "wasted_gpu_seconds": round(summary.wasted_gpu_seconds, 1),
        "retried": summary.retried,
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
    """Reads the index's records of a time window, newest day first, compacting closed days on the way.

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
        """Every record from ``since`` to ``until`` (default now), one per attempt: its newest in the window.

        A verdict rewritten on a later day (a retry controller settling an attempt after midnight)
        leaves a record on each day; days are read newest first, so the first record of an attempt
        met is its newest and the others are passed over. Only the attempts' ids are held, never
        the window's records.
        """
        low, high = _stamp(since), _stamp(until or self.now)
        seen: set[tuple[str, int]] = set()
        for day in reversed(days(since, until or self.now)):
            for record in self.day(day):
                if low <= record["ended_at"] <= high:
                    ident = (record["run"], record["attempt"])
                    if ident not in seen:
                        seen.add(ident)
                        yield record

    def day(self, day: str) -> Iterator[dict[str, Any]]:
        """One day's records, one per attempt (the newest), newest first; compacted first if the day is closed.

        A compacted day (one part, written one record per attempt, oldest first) is parsed line by
        line from its end as it is consumed: no record outlives its turn.
        """
        try:
            keys = self.store.list_keys(f"{PREFIX}{day}/")
        except Exception as exc:
            self.problems.append(f"the index of {day} could not be listed: {type(exc).__name__}: {exc}")
            return
        if len(keys) == 1 and keys[0].endswith(".jsonl"):
            yield from self._parsed(keys[0], newest_first=True)
            return
        newest: dict[tuple[str, int], dict[str, Any]] = {}
        for key in keys:
            for record in self._parsed(key):
                ident = (record["run"], record["attempt"])
                found = newest.get(ident)
                if found is None or record["ended_at"] >= found["ended_at"]:
                    newest[ident] = record
        records = sorted(newest.values(), key=lambda r: (r["ended_at"], r["run"], r["attempt"]))
        if self.compact and keys and self._closed(day):
            self._compact(day, keys, records)
        yield from reversed(records)

    def _parsed(self, key: str, newest_first: bool = False) -> Iterator[dict[str, Any]]:
        """The records of one object (JSON lines, or one JSON value), each checked just enough to be used
        safely: an object with ``run`` text, ``attempt`` a whole number and ``ended_at`` text (the other
        fields are checked where they are used). Anything else is counted in ``skipped``."""
        try:
            data = self.store.get_bytes(key)
        except EvidenceNotFound:  # compacted away by another reader meanwhile: its part holds the records
            return
        except Exception as exc:
            self.problems.append(f"{key} could not be read: {type(exc).__name__}: {exc}")
            return
        self.objects += 1
        texts = _texts(data, key.endswith(".jsonl"))
        kept = 0
        for text in reversed(texts) if newest_first else texts:
            try:
                record, end = _scan(text)  # one C scan of the line as it stands
            except ValueError:
                record, end = None, -1
            if end != len(text):  # surrounding whitespace, as json.loads takes it, or not JSON at all
                record = _lenient(text)
            if type(record) is dict and type(record.get("run")) is str and type(record.get("attempt")) is int \
                    and type(record.get("ended_at")) is str:
                kept += 1
                yield record
        self.skipped += len(texts) - kept

    def _closed(self, day: str) -> bool:
        return self.now >= datetime.combine(date.fromisoformat(day), datetime.min.time(), UTC) + \
            timedelta(days=1) + CLOSED_AFTER

    def _compact(self, day: str, keys: list[str], records: list[dict[str, Any]]) -> None:
        """One JSON-lines part for the day (oldest first), written before the objects it replaces are deleted."""
        body = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode("utf-8")
        part = f"{PREFIX}{day}/{_PART}{hashlib.sha256(body).hexdigest()[:16]}.jsonl"
        try:
            self.store.put_bytes(part, body)
            for key in keys:
                if key != part:
                    self.store.delete(key)
        except Exception as exc:  # a reader without write access still reads; the next one compacts
            self.problems.append(f"the index of {day} could not be compacted: {type(exc).__name__}: {exc}")


_scan = json.JSONDecoder().raw_decode  # json.loads without its per-call detour (encoding, whitespace)


def _texts(data: bytes, lines: bool) -> list[str]:
    """The object's lines as text (blank ones left out); a line that is not UTF-8 becomes one that is
    not JSON."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:  # a damaged line must not cost the rest of the day
        text = "\n".join(_decoded(line) for line in data.split(b"\n"))
    if not lines:
        return [text]
    texts = text.split("\n")
    if texts[-1] == "":  # the final newline
        texts.pop()
    return texts if "" not in texts else [t for t in texts if t]


def _decoded(line: bytes) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd"  # not JSON: skipped and counted


def _lenient(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _stamp(moment: datetime) -> str:
    """ISO-8601 UTC to the second, so records compare as strings."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _bounded(text: str, limit: int) -> str:
    """``text`` masked, without control sequences, on one line, at most ``limit`` characters."""
    flat = " ".join(masking.for_people(text).splitlines())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
