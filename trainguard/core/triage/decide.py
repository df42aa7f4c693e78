"""From signals to one diagnosis: which rules hold, which evidence is the root cause.

Rules whose platform matchers (exit code, reason, conditions, events) fail are left out of the
log scan; every surviving piece of evidence becomes a candidate with its rule's strength. The
strongest class wins; inside it the earliest failing rank wins when every candidate carries a
timestamp, otherwise the earliest log line (before platform signals), then the rule order.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from trainguard.core.taxonomy import INFO, Category
from trainguard.core.triage.fingerprint import fingerprint
from trainguard.core.triage.lines import trim
from trainguard.core.triage.rules import STRENGTHS, Rule, RuleSet, mapping_get, strength_name
from trainguard.core.triage.scan import Scanner, ScanResult
from trainguard.core.triage.signals import Diagnosis, Signals

# Categories whose default says "retry once": a repeat of the same root cause is not retried.
RETRY_ONCE = frozenset({Category.NATIVE_CRASH, Category.UNKNOWN})


@dataclass(frozen=True)
class Candidate:
    rule: int
    strength: int
    signature: str
    line_number: int | None
    rank: int | None
    timestamp: tuple[int, int, float] | None


@lru_cache(maxsize=16)
def scanner_for(rules: RuleSet, engine: str = "auto") -> Scanner:
    """One compiled scanner per rule set and engine, built on first use."""
    return Scanner(rules, engine)


def decide(signals: Signals, rules: RuleSet, previous: Sequence[Diagnosis],
           engine: str = "auto") -> Diagnosis | None:
    """Classify one attempt; None when it succeeded (exit code 0, nothing saying otherwise)."""
    candidates, last = gather(signals, rules, engine)
    return conclude(signals, rules, previous, candidates, last)


def conclude(signals: Signals, rules: RuleSet, previous: Sequence[Diagnosis],
             candidates: list[Candidate], last: ScanResult | None) -> Diagnosis | None:
    """The diagnosis from already gathered evidence (see ``decide``)."""
    if signals.exit_code == 0:
        candidates = [c for c in candidates if c.strength >= STRENGTHS["verdict"]]
        if not candidates:
            return None
    if not candidates:
        return _fallback(signals, last, previous)
    winner = pick(candidates)
    rule = rules.rules[winner.rule]
    return _diagnosis(rule, winner, previous)


def gather(signals: Signals, rules: RuleSet,
           engine: str = "auto") -> tuple[list[Candidate], ScanResult | None]:
    """Every piece of evidence some rule accepts, and the scan of the log (None without one)."""
    candidates: list[Candidate] = []
    active: set[int] = set()
    for index, rule in enumerate(rules.rules):
        evidence = platform_evidence(rule, signals)
        if evidence is None:
            continue
        if rule.log:
            active.add(index)
        else:
            candidates.append(Candidate(index, rule.strength, evidence, None, None, None))
    last = None
    if signals.log is not None:
        result = scanner_for(rules, engine).scan(signals.log, active)
        candidates.extend(
            Candidate(h.rule, rules.rules[h.rule].strength, h.line.text, h.line_number,
                      h.line.rank, h.line.timestamp) for h in result.hits
        )
        last = result
    return candidates, last


def pick(candidates: Sequence[Candidate]) -> Candidate:
    """The root cause among the candidates (see the module docstring for the order)."""
    top = max(c.strength for c in candidates)
    group = [c for c in candidates if c.strength == top]
    if len(group) > 1 and all(c.timestamp is not None for c in group):
        return min(group, key=lambda c: (c.timestamp, c.line_number or 0, c.rule))
    # A log line says more than an exit code of the same strength, so it is preferred.
    return min(group, key=lambda c: (c.line_number is None, c.line_number or 0, c.rule))


def _diagnosis(rule: Rule, c: Candidate, previous: Sequence[Diagnosis]) -> Diagnosis:
    signature = trim(c.signature)
    fp = fingerprint(rule.category, rule.id, signature)
    retryable = INFO[rule.category].retryable if rule.retryable is None else rule.retryable
    remediation = INFO[rule.category].remediation
    if rule.strength <= STRENGTHS["hint"]:
        why = f" ({rule.description.rstrip('.')})" if rule.description else ""
        remediation = (f"Weak call: only hint-strength evidence or weaker names this{why}; "
                       f"check the evidence line. {remediation}")
    return Diagnosis(
        category=rule.category, retryable=retryable and not _repeat(rule.category, fp, previous),
        rule_id=rule.id, signature=signature, line_number=c.line_number, rank=c.rank,
        remediation=remediation, fingerprint=fp, strength=strength_name(rule.strength),
    )


def _repeat(category: Category, fp: str, previous: Sequence[Diagnosis]) -> bool:
    if category not in RETRY_ONCE:
        return False
    if category is Category.UNKNOWN:
        return any(p.category is Category.UNKNOWN for p in previous)
    return any(p.category is category and p.fingerprint == fp for p in previous)


def _fallback(signals: Signals, scanned: ScanResult | None,
              previous: Sequence[Diagnosis]) -> Diagnosis:
    parts = []
    if signals.exit_code is not None:
        parts.append(describe_exit(signals.exit_code))
    if signals.reason:
        parts.append(f"reason {signals.reason}")
    if scanned is not None and scanned.last_line is not None:
        parts.append(scanned.last_line.text)
    signature = trim("; ".join(parts) or "no evidence")
    last = scanned.last_line if scanned is not None else None
    line = scanned.last_line_number if scanned is not None and last is not None else None
    fp = fingerprint(Category.UNKNOWN, "fallback.unknown", signature)
    return Diagnosis(
        category=Category.UNKNOWN, retryable=not _repeat(Category.UNKNOWN, fp, previous),
        rule_id="fallback.unknown", signature=signature, line_number=line,
        rank=last.rank if last is not None and line else None,
        remediation=INFO[Category.UNKNOWN].remediation, fingerprint=fp, strength="none",
    )


def describe_exit(code: int) -> str:
    """``exit code 139 (SIGSEGV)``: the code with the signal it stands for, if any."""
    number = -code if code < 0 else code - 128 if 128 < code < 160 else 0
    try:
        return f"exit code {code} ({signal.Signals(number).name})" if number else f"exit code {code}"
    except ValueError:
        return f"exit code {code}"


def platform_evidence(rule: Rule, s: Signals) -> str | None:
    """Describe why the rule's non-log matchers hold, or None when one of them fails."""
    found: list[str] = []
    if rule.exit_codes:
        if s.exit_code is None or s.exit_code not in rule.exit_codes:
            return None
        found.append(describe_exit(s.exit_code))
    if rule.reasons:
        if not s.reason or s.reason.lower() not in rule.reasons:
            return None
        found.append(f"reason {s.reason}")
    if rule.conditions:
        hit = _condition(rule, s.conditions)
        if hit is None:
            return None
        found.append(hit)
    if rule.events:
        hit = _event(rule, s.events)
        if hit is None:
            return None
        found.append(hit)
    return "; ".join(found)


def _condition(rule: Rule, conditions: Sequence[Mapping[str, Any]]) -> str | None:
    for cond in conditions:
        ctype = mapping_get(cond, "type")
        reason = mapping_get(cond, "reason")
        status = mapping_get(cond, "status")
        for m in rule.conditions:
            if ctype == m.type and m.reason in (None, reason) and m.status in (None, status):
                message = mapping_get(cond, "message") or ""
                return f"condition {ctype}={status} {reason or ''} {message}".strip()
    return None


def _event(rule: Rule, events: Sequence[Mapping[str, Any]] | str) -> str | None:
    if isinstance(events, str):
        for line in events.splitlines():
            for m in rule.events:
                if (m.reason is None or _word(m.reason).search(line)) and (
                        m.message is None or m.message.search(line)):
                    return f"event {line.strip()}"
        return None
    for event in events:
        reason = str(mapping_get(event, "reason") or "")
        message = str(mapping_get(event, "message", "note") or "")
        for m in rule.events:
            if (m.reason is None or m.reason.fullmatch(reason)) and (
                    m.message is None or m.message.search(message)):
                return f"event {reason}: {message}".strip()
    return None


@lru_cache(maxsize=256)
def _word(pattern: re.Pattern[str]) -> re.Pattern[str]:
    # In `kubectl get events` text a reason is one column among others: match it as a word.
    return re.compile(rf"(?<![\w-])(?:{pattern.pattern})(?![\w-])")
