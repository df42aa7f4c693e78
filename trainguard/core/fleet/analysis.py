"""Tallying verdict index records into the fleet view: per node, per fingerprint, and the suspects.

`Tally.add` takes one record at a time (as ``index.IndexReader.records`` yields them), so a month of
verdicts is never held in memory at once; `Tally.view` turns the counts into rows. Records come
from a store anyone with write access could have edited: every field is checked for its type here,
and text is left for the renderers to escape.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainguard.core.fleet import suspects as rule_of
from trainguard.core.fleet.suspects import HARDWARE, NodeTest, SuspectRule

EXAMPLES = 3  # failures kept per suspect as its evidence


@dataclass
class _Node:
    """A node's failures (made at its first failure; its attempts are counted in a plain dict)."""

    failures: dict[str, int] = field(default_factory=dict)
    hardware: int = 0
    wasted_seconds: float = 0.0
    last_failure: tuple[str, str] | None = None  # (ended_at, category)
    examples: list[dict[str, Any]] = field(default_factory=list)  # the newest hardware failures
    hardware_runs: set[str] = field(default_factory=set)  # the runs with a hardware failure placed on it


@dataclass
class _Fingerprint:
    category: str
    rule: str
    first_seen: str
    last_seen: str
    example: str
    runs: set[str] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)
    attempts: int = 0


@dataclass(frozen=True)
class NodeRow:
    node: str
    attempts: int
    failures: Mapping[str, int]  # category -> failures placed on the node
    failure_rate: float  # every failure, the code's and the config's included
    gpu_hours_wasted: float
    last_failure: str | None  # "<ended_at> <category>"
    hardware_failures: int = 0  # of a hardware category (suspects.HARDWARE): what says something of the node
    hardware_rate: float = 0.0

    @property
    def other_failures(self) -> Mapping[str, int]:
        """Failures of the code, config, data...: the run's, which say nothing about the node."""
        return {category: n for category, n in self.failures.items() if category not in HARDWARE}


@dataclass(frozen=True)
class FingerprintRow:
    fingerprint: str
    category: str
    rule: str
    first_seen: str
    last_seen: str
    runs: int
    attempts: int
    nodes: tuple[str, ...]
    example: str


@dataclass(frozen=True)
class Suspect:
    node: str
    test: NodeTest
    by_category: Mapping[str, int]  # hardware failures by category
    examples: tuple[Mapping[str, Any], ...]  # {run, attempt, ended_at, category, fingerprint, signature}


@dataclass(frozen=True)
class FleetView:
    """What `trainguard fleet` shows: totals, the node and fingerprint tables, and the suspects."""

    attempts: int
    failures: int
    hardware_failures: int
    gpu_hours_wasted: float
    nodes: tuple[NodeRow, ...]
    fingerprints: tuple[FingerprintRow, ...]
    suspects: tuple[Suspect, ...]
    rule: SuspectRule


class Tally:
    """Counts records per node and per fingerprint, one record at a time.

    A successful attempt on one node, nearly every record, costs a few lookups and one count in a
    plain dict; only failures build anything.
    """

    def __init__(self) -> None:
        self.attempts_on: dict[str, int] = {}  # node -> attempts that ran on it
        self.nodes: dict[str, _Node] = {}  # node -> its failures, for nodes with one
        self.fingerprints: dict[str, _Fingerprint] = {}
        self.attempts = self.failures = 0

    def add_all(self, records: Iterable[Mapping[str, Any]]) -> Tally:
        add = self.add
        for record in records:
            add(record)
        return self

    def add(self, record: Mapping[str, Any]) -> None:
        """Count one index record (see ``index.entry`` for its fields)."""
        culprit, nodes = record.get("node"), record.get("nodes")
        self.attempts += 1
        if type(culprit) is str and culprit and type(nodes) is list and len(nodes) == 1 and nodes[0] == culprit:
            placed: Iterable[str] = nodes  # one node: the common case, counted without a set
            self.attempts_on[culprit] = self.attempts_on.get(culprit, 0) + 1
        else:
            culprit = _text(culprit)
            placed = _placed(culprit, nodes)
            for name in placed:
                self.attempts_on[name] = self.attempts_on.get(name, 0) + 1
        if record.get("state") != "Completed":
            self._failed(record, culprit, placed)

    def _failed(self, record: Mapping[str, Any], culprit: str, placed: Iterable[str]) -> None:
        self.failures += 1
        category = _text(record.get("category")) or "unknown"
        if culprit:
            node = self.nodes.get(culprit)
            if node is None:
                node = self.nodes[culprit] = _Node()
            self._fail(node, record, category)
        fingerprint = _text(record.get("fingerprint"))
        if fingerprint:
            self._recur(fingerprint, record, category, placed)

    def _fail(self, node: _Node, record: Mapping[str, Any], category: str) -> None:
        node.failures[category] = node.failures.get(category, 0) + 1
        node.wasted_seconds += _wasted(record)
        ended = str(record["ended_at"])
        if node.last_failure is None or ended >= node.last_failure[0]:
            node.last_failure = (ended, category)
        if category in HARDWARE:
            node.hardware += 1
            node.hardware_runs.add(str(record["run"]))
            node.examples = sorted([*node.examples, _example(record, category)],
                                   key=lambda e: str(e["ended_at"]))[-EXAMPLES:]

    def _recur(self, fingerprint: str, record: Mapping[str, Any], category: str, placed: Iterable[str]) -> None:
        ended = str(record["ended_at"])
        found = self.fingerprints.get(fingerprint)
        if found is None:
            found = self.fingerprints[fingerprint] = _Fingerprint(
                category, _text(record.get("rule")), ended, ended, _text(record.get("signature")))
        found.first_seen = min(found.first_seen, ended)
        if ended >= found.last_seen:  # the newest example line and names stand for the row
            found.last_seen, found.example = ended, _text(record.get("signature")) or found.example
        found.runs.add(str(record["run"]))
        found.nodes.update(placed)
        found.attempts += 1

    def view(self, rule: SuspectRule | None = None) -> FleetView:
        """The counts as rows, worst first, with the nodes `suspects` picks."""
        rule = rule or SuspectRule()
        hardware = sum(node.hardware for node in self.nodes.values())
        node_attempts = sum(self.attempts_on.values())
        rows = sorted((_node_row(name, attempts, self.nodes.get(name)) for name, attempts in self.attempts_on.items()),
                      key=lambda r: (-r.hardware_failures, -sum(r.failures.values()), -r.failure_rate, r.node))
        found = []
        failing_runs = sum(len(node.hardware_runs) for node in self.nodes.values())
        for name, node in self.nodes.items():
            runs = len(node.hardware_runs)  # one run failing there again and again is one failure (`suspects`)
            if runs < rule.min_failures:  # the rule's first condition: no test can make it a suspect
                continue
            attempts = self.attempts_on[name]
            tested = rule_of.judge(runs, attempts, failing_runs - runs, node_attempts - attempts,
                                   len(self.attempts_on), rule)
            if tested.suspect:
                by_category = {c: n for c, n in node.failures.items() if c in HARDWARE}
                found.append(Suspect(name, tested, by_category, tuple(reversed(node.examples))))
        found.sort(key=lambda s: (s.test.p_value, s.node))
        wasted = sum(node.wasted_seconds for node in self.nodes.values()) / 3600
        prints = sorted((_fingerprint_row(key, fp) for key, fp in self.fingerprints.items()),
                        key=lambda r: (-r.runs, -r.attempts, r.fingerprint))
        return FleetView(self.attempts, self.failures, hardware, wasted, tuple(rows), tuple(prints),
                         tuple(found), rule)


def _placed(culprit: str, nodes: object) -> set[str]:
    """The nodes an attempt ran on: every node text it names, and the culprit's."""
    placed = {n for n in nodes if isinstance(n, str) and n} if isinstance(nodes, list) else set()
    if culprit:
        placed.add(culprit)
    return placed


def _node_row(name: str, attempts: int, node: _Node | None) -> NodeRow:
    if node is None:
        return NodeRow(name, attempts, {}, 0.0, 0.0, None)
    last = f"{node.last_failure[0]} {node.last_failure[1]}" if node.last_failure else None
    failures = dict(sorted(node.failures.items(), key=lambda kv: kv[1], reverse=True))  # most first, ties as met
    return NodeRow(name, attempts, failures, sum(failures.values()) / attempts, node.wasted_seconds / 3600, last,
                   node.hardware, node.hardware / attempts)


def _fingerprint_row(key: str, found: _Fingerprint) -> FingerprintRow:
    return FingerprintRow(key, found.category, found.rule, found.first_seen, found.last_seen, len(found.runs),
                          found.attempts, tuple(sorted(found.nodes)), found.example)


def _example(record: Mapping[str, Any], category: str) -> dict[str, Any]:
    return {"run": str(record["run"]), "attempt": record["attempt"], "ended_at": str(record["ended_at"]),
            "category": category, "fingerprint": _text(record.get("fingerprint")),
            "signature": _text(record.get("signature"))}


def _text(value: object) -> str:
    """A record's text field, or "" when it is missing or not text."""
    return value if isinstance(value, str) else ""


def _wasted(record: Mapping[str, Any]) -> float:
    """The failed attempt's GPU-seconds no checkpoint kept (`AttemptSummary.wasted_gpu_seconds`); a record
    written before the index kept that figure counts its whole GPU-seconds, as it was counted then."""
    for key in ("wasted_gpu_seconds", "gpu_seconds"):
        value = record.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
            return float(value)
    return 0.0
