"""The root cause across several parts of one attempt's evidence: pods, nodes or ranks.

A multi-node attempt leaves one set of signals per pod (or per node, or per rank's log). Each
part is classified on its own; then the same rule as inside one log decides across them: a
part whose only failures are a peer's loss is a victim, never the root cause while another
part failed on its own. Platform verdicts (an eviction, OOMKilled, DisruptionTarget) come
first, then the strongest failure of its own, the earliest among equals. Pure: the caller
reads pods, logs and error files and says who each part is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from trainguard.core.triage.decide import decide
from trainguard.core.triage.rules import STRENGTHS, RuleSet
from trainguard.core.triage.signals import Diagnosis, Signals, Victim

_NO_EVIDENCE = "none"


@dataclass(frozen=True)
class Part:
    """One part of an attempt's evidence, and who it is.

    Attributes:
        signals: The part's own signals (its pod's exit code, reason, conditions, events, log,
            error files).
        index: Its index among the attempt's parts (the pod or node index, the node rank).
        node: The node it ran on, if known.
        ranks: The global ranks its processes held, if known.
        first_error_at: When its first error happened, in seconds since the epoch, if the caller
            knows better than its evidence (a container's finish time, an error file's time).
    """

    signals: Signals
    index: int
    node: str | None = None
    ranks: range | None = None
    first_error_at: float | None = None


@dataclass(frozen=True)
class RootCause:
    """Where the root cause is: which part and rank, by which rule, when, and by how much it led.

    ``index`` and ``rank`` are None when the culprit is undetermined (every failing part only
    lost a peer). ``margin_seconds`` is how long before the next other part's first error it
    failed (negative: the clocks or the order disagree), None when the times are not known.
    """

    index: int | None
    rank: int | None
    rule_id: str
    first_error_at: float | None
    margin_seconds: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "rank": self.rank, "rule_id": self.rule_id,
                "first_error_at": self.first_error_at, "margin_seconds": self.margin_seconds}


@dataclass(frozen=True)
class PartVictim:
    """A part, or a rank in one, passed over as the root cause, and why."""

    index: int
    rank: int | None
    reason: str
    rule_id: str

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "rank": self.rank, "reason": self.reason,
                "rule_id": self.rule_id}


@dataclass(frozen=True)
class Verdict:
    """The root cause across parts, the victims passed over, and the combined diagnosis."""

    root_cause: RootCause
    victims: tuple[PartVictim, ...]
    diagnosis: Diagnosis
    parts: tuple[Diagnosis | None, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"root_cause": self.root_cause.to_dict(),
                "victims": [v.to_dict() for v in self.victims],
                "diagnosis": self.diagnosis.to_dict(),
                "parts": [p.to_dict() if p else None for p in self.parts]}


@dataclass(frozen=True)
class _Judged:
    part: Part
    diagnosis: Diagnosis
    rank: int | None
    at: float | None

    @property
    def kind(self) -> int:
        """0: a platform verdict, 1: a failure of its own, 2: only victims, 3: no evidence."""
        d = self.diagnosis
        if d.strength == "verdict":
            return 0
        if d.strength == _NO_EVIDENCE:
            return 3
        return 2 if d.culprit_undetermined else 1


def combine(parts: Sequence[Part], diagnoses: Sequence[Diagnosis | None]) -> Verdict | None:
    """The root cause across already classified parts (``triage.root_cause`` classifies them)."""
    judged = [_Judged(p, d, _rank(p, d), p.first_error_at or d.failed_at)
              for p, d in zip(parts, diagnoses, strict=True) if d is not None]
    if not judged:
        return None
    best = min(j.kind for j in judged)
    group = [j for j in judged if j.kind == best]
    top = max(STRENGTHS.get(j.diagnosis.strength, 0) for j in group)
    group = [j for j in group if STRENGTHS.get(j.diagnosis.strength, 0) == top]
    timed = all(j.at is not None for j in group)
    group.sort(key=lambda j: ((j.at or 0.0) if timed else 0.0, j.part.index))
    winner = group[0]
    undetermined = best >= 2
    others = [j.at for j in judged if j is not winner and j.at is not None]
    margin = (min(others) - winner.at) if others and winner.at is not None else None
    root = RootCause(None if undetermined else winner.part.index,
                     None if undetermined else winner.rank, winner.diagnosis.rule_id,
                     winner.at, None if undetermined else margin)
    victims = tuple(v for j in judged for v in _victims_of(j, winner, undetermined))
    decided_by = _decided_by(group, winner, timed)
    combined = replace(
        winner.diagnosis, rank=root.rank, culprit_undetermined=undetermined,
        failed_at=root.first_error_at, decided_by=decided_by,
        victims=tuple(Victim(v.rank, f"part {v.index}: {v.reason}", v.rule_id) for v in victims))
    return Verdict(root, victims, combined, tuple(diagnoses))


def _rank(part: Part, d: Diagnosis) -> int | None:
    if d.rank is not None:
        return d.rank
    if part.ranks is not None and len(part.ranks) == 1 and not d.culprit_undetermined:
        return part.ranks[0]
    return None


def _victims_of(j: _Judged, winner: _Judged, undetermined: bool) -> list[PartVictim]:
    index = j.part.index
    out = [PartVictim(index, v.rank, v.reason, v.rule_id) for v in j.diagnosis.victims]
    if j is winner and not undetermined:
        return out
    if j.kind >= 2 and not out:
        where = f" on {j.part.node}" if j.part.node else ""
        out.append(PartVictim(index, _rank(j.part, j.diagnosis),
                              f"its evidence{where} only reports a lost peer: "
                              f"{j.diagnosis.signature}", j.diagnosis.rule_id))
    elif j.kind < 2 and j is not winner:
        out.append(PartVictim(index, j.rank, f"failed on its own too, but after or weaker than "
                                             f"the root cause: {j.diagnosis.signature}",
                              j.diagnosis.rule_id))
    return out


def _decided_by(group: Sequence[_Judged], winner: _Judged, timed: bool) -> str:
    rivals = [j for j in group if j is not winner
              and j.diagnosis.category is not winner.diagnosis.category]
    if not rivals:
        return winner.diagnosis.decided_by
    if timed and any(j.at != winner.at for j in rivals):
        return "timestamp"
    return "part order"


def root_cause(parts: Sequence[Part], rules: RuleSet, previous: Sequence[Diagnosis] = (),
               engine: str = "auto") -> Verdict | None:
    """Classify every part and find the root cause across them (see the module docstring).

    Returns:
        The verdict, or None when no part failed.
    """
    return combine(parts, [decide(p.signals, rules, previous, engine) for p in parts])
