"""Why a diagnosis came out as it did: every rule that matched, and why the winner won.

``decide`` picks; this module only describes the same choice for a person (``trainguard classify
--explain``). It reuses ``decide.gather`` and ``decide.choice_of``, so the explanation cannot
drift from the verdict: the culprit rank, the ranks passed over as victims and why, and what
broke a tie.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainguard.core.triage.culprit import Candidate, Choice
from trainguard.core.triage.decide import choice_of, conclude, gather
from trainguard.core.triage.lines import trim
from trainguard.core.triage.rules import STRENGTHS, RuleSet, strength_name
from trainguard.core.triage.signals import Diagnosis, Signals


@dataclass(frozen=True)
class Evidence:
    """One rule that matched, and where (``origin``: None for the log, else an error file)."""

    rule_id: str
    category: str
    strength: str
    line_number: int | None
    rank: int | None
    text: str
    mechanism: str
    victim: bool = False
    origin: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"rule_id": self.rule_id, "category": self.category, "strength": self.strength,
                "line_number": self.line_number, "rank": self.rank, "text": self.text,
                "mechanism": self.mechanism, "victim": self.victim, "origin": self.origin}


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
            engine: str = "auto", nearest_vote: bool = False) -> Explanation:
    """Classify one attempt and say which rules matched and why the winner won."""
    # The log is read once: a stream (stdin) cannot be read twice.
    gathered = gather(signals, rules, engine)
    diagnosis = conclude(signals, rules, previous, gathered, nearest_vote)
    candidates = gathered.candidates
    order = sorted(candidates, key=lambda c: (-c.strength, c.line_number is None,
                                              c.origin is not None, c.line_number or 0, c.rule))
    choice = choice_of(signals, gathered, rules)
    passed = {v.rank for v in choice.victims} if choice is not None else set()
    evidence = tuple(_evidence(rules, c, c.rank in passed and c.rank is not None
                               or rules.rules[c.rule].victim) for c in order)
    if choice is not None and signals.exit_code == 0:
        candidates = [c for c in candidates if c.strength >= STRENGTHS["verdict"]]
    strengths = {c.strength for c in candidates}
    return Explanation(diagnosis, evidence, _reason(rules, choice, diagnosis, strengths))


def _evidence(rules: RuleSet, c: Candidate, victim: bool) -> Evidence:
    rule = rules.rules[c.rule]
    return Evidence(rule.id, rule.category.value, strength_name(c.strength), c.line_number,
                    c.rank, trim(c.signature), rule.description, victim, c.origin)


def _reason(rules: RuleSet, choice: Choice | None, diagnosis: Diagnosis | None,
            strengths: set[int]) -> str:
    if diagnosis is None:
        return "exit code 0 and no verdict-strength evidence says otherwise: not a failure"
    if choice is None:
        return ("no rule matched: unknown, with the exit code and the last log line as the "
                "signature")
    winner = choice.winner
    name = rules.rules[winner.rule].id
    where = f" on rank {winner.rank}" if winner.rank is not None and not choice.undetermined else ""
    parts = [f"{name}{where} is the strongest evidence ({strength_name(winner.strength)})"]
    weaker = sorted({strength_name(s) for s in strengths if s < winner.strength},
                    key=lambda n: -STRENGTHS.get(n, 0))
    if weaker:
        parts.append(f"it outranks {', '.join(weaker)} evidence")
    if choice.victims:
        parts.append("passed over as victims: " + ", ".join(
            ("unranked lines" if v.rank is None else f"rank {v.rank}") + f" ({v.rule_id})"
            for v in choice.victims))
    if choice.undetermined:
        parts.append("only victims' evidence is there, so the culprit is undetermined")
    if choice.tied > 1:
        parts.append(_tie(choice))
    if winner.strength < STRENGTHS["hint"]:
        parts.append("only a guess from where a cut-off traceback was: a weak call")
    elif winner.strength == STRENGTHS["hint"]:
        parts.append("only hint-strength evidence: a weak call")
    return "; ".join(parts)


def _tie(choice: Choice) -> str:
    n = choice.tied
    if choice.decided_by == "timestamp":
        return f"of {n} equally strong candidates it has the earliest timestamp"
    if choice.decided_by == "rule order":
        return (f"of {n} equally strong candidates of different categories it comes first in "
                "rule order: a weak call")
    if choice.decided_by == "line":
        return f"of {n} equally strong candidates it is on the earliest log line"
    if choice.decided_by == "victim reading":
        return f"of {n} equally strong readings of its line, the lost peer's is taken"
    return f"its {n - 1} equally strong rivals say the same"
