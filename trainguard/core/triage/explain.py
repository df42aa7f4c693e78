"""Why a diagnosis came out as it did: every rule that matched, and why the winner won.

``decide`` picks; this module only describes the same choice for a person (``trainguard classify
--explain``). It reuses ``decide.gather`` and ``decide.pick``, so the explanation cannot drift
from the verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainguard.core.triage.decide import Candidate, conclude, gather, pick
from trainguard.core.triage.lines import trim
from trainguard.core.triage.rules import STRENGTHS, RuleSet, strength_name
from trainguard.core.triage.signals import Diagnosis, Signals


@dataclass(frozen=True)
class Evidence:
    """One rule that matched, and where."""

    rule_id: str
    category: str
    strength: str
    line_number: int | None
    rank: int | None
    text: str
    mechanism: str

    def to_dict(self) -> dict[str, Any]:
        return {"rule_id": self.rule_id, "category": self.category, "strength": self.strength,
                "line_number": self.line_number, "rank": self.rank, "text": self.text,
                "mechanism": self.mechanism}


@dataclass(frozen=True)
class Explanation:
    """The verdict, the evidence behind it (strongest first) and why the winner won."""

    diagnosis: Diagnosis | None
    evidence: tuple[Evidence, ...]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"diagnosis": self.diagnosis.to_dict() if self.diagnosis else None,
                "evidence": [e.to_dict() for e in self.evidence], "reason": self.reason}


def explain(signals: Signals, rules: RuleSet, previous: Sequence[Diagnosis] = (),
            engine: str = "auto") -> Explanation:
    """Classify one attempt and say which rules matched and why the winner won."""
    # The log is read once: a stream (stdin) cannot be read twice.
    candidates, last = gather(signals, rules, engine)
    diagnosis = conclude(signals, rules, previous, candidates, last)
    order = sorted(candidates, key=lambda c: (-c.strength, c.line_number is None,
                                              c.line_number or 0, c.rule))
    evidence = tuple(_evidence(rules, c) for c in order)
    return Explanation(diagnosis, evidence, _reason(rules, signals, candidates, diagnosis))


def _evidence(rules: RuleSet, c: Candidate) -> Evidence:
    rule = rules.rules[c.rule]
    return Evidence(rule.id, rule.category.value, strength_name(c.strength), c.line_number,
                    c.rank, trim(c.signature), rule.description)


def _reason(rules: RuleSet, signals: Signals, candidates: Sequence[Candidate],
            diagnosis: Diagnosis | None) -> str:
    if diagnosis is None:
        return "exit code 0 and no verdict-strength evidence says otherwise: not a failure"
    if signals.exit_code == 0:
        candidates = [c for c in candidates if c.strength >= STRENGTHS["verdict"]]
    if not candidates:
        return ("no rule matched: unknown, with the exit code and the last log line as the "
                "signature")
    winner = pick(candidates)
    top = [c for c in candidates if c.strength == winner.strength]
    weaker = sorted({strength_name(c.strength) for c in candidates if c.strength < winner.strength},
                    key=lambda name: -STRENGTHS.get(name, 0))
    name = rules.rules[winner.rule].id
    parts = [f"{name} is the strongest evidence ({strength_name(winner.strength)})"]
    if weaker:
        parts.append(f"it outranks {', '.join(weaker)} evidence")
    if len(top) > 1:
        parts.append(_tie(top, winner))
    if winner.strength < STRENGTHS["hint"]:
        parts.append("only a guess from where a cut-off traceback was: a weak call")
    elif winner.strength == STRENGTHS["hint"]:
        parts.append("only hint-strength evidence: a weak call")
    return "; ".join(parts)


def _tie(top: Sequence[Candidate], winner: Candidate) -> str:
    if all(c.timestamp is not None for c in top):
        return f"of {len(top)} equally strong candidates it has the earliest timestamp"
    if winner.line_number is not None:
        return f"of {len(top)} equally strong candidates it is on the earliest log line"
    return f"of {len(top)} equally strong candidates it comes first in rule order"
