"""From signals to one diagnosis: which rules hold, which evidence is the root cause.

Rules whose platform matchers (exit code, reason, conditions, events) fail are left out of the
log scan; every surviving piece of evidence, in the log and in torchelastic's error files, becomes
a candidate with its rule's strength, given the rank and time torchrun's failure report says it
belongs to. A rank that only lost a peer (a ``victim`` rule's evidence, or its agent's closing
signal) is passed over while a failure of another rank is in the evidence (``culprit``); among
the rest the strongest class wins, inside it the earliest failing rank when every candidate
carries a timestamp, otherwise the earliest log line (before error files, before platform
signals), then the rule order.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from trainguard.core.taxonomy import INFO, Category
from trainguard.core.triage import nearest
from trainguard.core.triage.culprit import (
    Candidate, Choice, attribute, choose, failure_times, stamp,
)
from trainguard.core.triage.errorfile import ErrorFile, local_rank_of
from trainguard.core.triage.fingerprint import fingerprint
from trainguard.core.triage.lines import signature_of, trim
from trainguard.core.triage.rules import STRENGTHS, Rule, RuleSet, mapping_get, strength_name
from trainguard.core.triage.scan import Scanner, ScanResult
from trainguard.core.triage.signals import Diagnosis, Signals
from trainguard.core.triage.torchrun import AgentReport, read_report

__all__ = ["Candidate", "Gathered", "choice_of", "conclude", "decide", "describe_exit", "gather",
           "rank_of"]

# Categories whose default says "retry once": a repeat of the same root cause is not retried.
RETRY_ONCE = frozenset({Category.NATIVE_CRASH, Category.UNKNOWN, Category.HANG})
@dataclass(frozen=True)
class Gathered:
    """Every candidate, the scan of the log, and what torchrun's report says of the ranks."""

    candidates: list[Candidate]
    last: ScanResult | None
    report: AgentReport = field(default_factory=AgentReport)
    times: Mapping[int, float] = field(default_factory=dict)


@lru_cache(maxsize=16)
def scanner_for(rules: RuleSet, engine: str = "auto") -> Scanner:
    """One compiled scanner per rule set and engine, built on first use."""
    return Scanner(rules, engine)


def decide(signals: Signals, rules: RuleSet, previous: Sequence[Diagnosis],
           engine: str = "auto", nearest_vote: bool = False) -> Diagnosis | None:
    """Classify one attempt; None when it succeeded (exit code 0, nothing saying otherwise)."""
    return conclude(signals, rules, previous, gather(signals, rules, engine), nearest_vote)


def conclude(signals: Signals, rules: RuleSet, previous: Sequence[Diagnosis],
             gathered: Gathered, nearest_vote: bool = False) -> Diagnosis | None:
    """The diagnosis from already gathered evidence (see ``decide``). When no rule decides, the
    diagnosis names the nearest labelled public failures; with ``nearest_vote`` their weak vote
    decides instead of ``unknown``."""
    choice = choice_of(signals, gathered, rules)
    if choice is None:
        if signals.exit_code == 0:
            return None
        fallback = _fallback(signals, gathered.last, previous)
        return _with_neighbours(fallback, gathered.last, previous, nearest_vote)
    return _diagnosis(rules.rules[choice.winner.rule], choice, previous)


def choice_of(signals: Signals, gathered: Gathered, rules: RuleSet) -> Choice | None:
    """The root cause among the gathered candidates; None when there is none to choose."""
    candidates = gathered.candidates
    if signals.exit_code == 0:
        candidates = [c for c in candidates if c.strength >= STRENGTHS["verdict"]]
    if not candidates:
        return None
    return choose(candidates, rules, gathered.report, gathered.times)


def gather(signals: Signals, rules: RuleSet, engine: str = "auto") -> Gathered:
    """Every piece of evidence some rule accepts, with ranks and times as the report says."""
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
    report = AgentReport()
    if signals.log is not None:
        last = scanner_for(rules, engine).scan(signals.log, active)
        candidates.extend(
            Candidate(h.rule, rules.rules[h.rule].strength, h.line.text, h.line_number,
                      h.line.rank, h.line.timestamp) for h in last.hits
        )
        report = read_report(last.tail, last.tail_start, _closing(rules))
    error_times: dict[int, float] = {}
    for number, error in enumerate(signals.error_files):
        rank = rank_of(error, report)
        if rank is not None and error.timestamp is not None:
            error_times.setdefault(rank, error.timestamp)
        candidates.extend(_from_error_file(error, rank, number, rules, active, engine))
    times = failure_times(report, error_times)
    return Gathered(attribute(candidates, report, times), last, report, times)


def rank_of(error: ErrorFile, report: AgentReport) -> int | None:
    """The global rank an error file belongs to: as given, as the report names its path, the
    report's root cause for the agent's copy, or by its log-dir path's local rank."""
    if error.rank is not None:
        return error.rank
    if error.source:
        named = [f.rank for f in report.failures if f.error_file == error.source]
        if named:
            return named[0]
    if error.agent_copy:
        roots = [f.rank for f in report.failures if f.root_cause]
        if len(roots) == 1:
            return roots[0]
    local = local_rank_of(error.source) if error.source else None
    matches = [f.rank for f in report.failures if local is not None and f.local_rank == local]
    return matches[0] if len(matches) == 1 else None


def _from_error_file(error: ErrorFile, rank: int | None, number: int, rules: RuleSet,
                     active: set[int], engine: str) -> list[Candidate]:
    origin = error.source or f"error file {number + 1}"
    when = stamp(error.timestamp) if error.timestamp is not None else None
    result = scanner_for(rules, engine).scan(error.text.encode("utf-8", "replace"), active)
    return [Candidate(h.rule, rules.rules[h.rule].strength, h.line.text, h.line_number,
                      rank if rank is not None else h.line.rank, when, origin)
            for h in result.hits]


@lru_cache(maxsize=16)
def _closing(rules: RuleSet) -> tuple[tuple[re.Pattern[str], int], ...]:
    """The patterns of victim rules that name the process whose loss they report, each with
    the group that names it."""
    return tuple((p, r.pid_group) for r in rules.rules
                 if r.victim and r.pid_group is not None for p in r.log_res)


def _diagnosis(rule: Rule, choice: Choice, previous: Sequence[Diagnosis]) -> Diagnosis:
    c = choice.winner
    signature = signature_of(c.signature)
    fp = fingerprint(rule.category, rule.id, signature)
    retryable = INFO[rule.category].retryable if rule.retryable is None else rule.retryable
    remediation = INFO[rule.category].remediation
    if rule.strength <= STRENGTHS["hint"]:
        why = f" ({rule.description.rstrip('.')})" if rule.description else ""
        remediation = (f"Weak call: only hint-strength evidence or weaker names this{why}; "
                       f"check the evidence line. {remediation}")
    elif choice.decided_by == "rule order":
        remediation = ("Weak call: evidence of another category was as strong and only the "
                       f"rules' order chose; check the evidence. {remediation}")
    if choice.undetermined:
        remediation = ("Culprit undetermined: every failing rank in the evidence only lost a "
                       "peer (a hang, a desync or a failure outside these logs); look for the "
                       f"rank that stopped first. {remediation}")
    return Diagnosis(
        category=rule.category, retryable=retryable and not _repeat(rule.category, fp, previous),
        rule_id=rule.id, signature=signature,
        line_number=c.line_number if c.origin is None else None,
        rank=None if choice.undetermined else c.rank,
        remediation=remediation, fingerprint=fp, strength=strength_name(rule.strength),
        victims=choice.victims, culprit_undetermined=choice.undetermined,
        decided_by=choice.decided_by, failed_at=choice.failed_at,
        provenance=("platform" if c.line_number is None and c.origin is None
                    else "log" if c.origin is None else "error file"),
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


def _with_neighbours(fallback: Diagnosis, scanned: ScanResult | None,
                     previous: Sequence[Diagnosis], use_vote: bool) -> Diagnosis:
    """The fallback with the labelled failures nearest to the log's last lines; with
    ``use_vote``, decided by their weak vote when they agree."""
    if scanned is None or not scanned.tail:
        return fallback
    text = b"\n".join(scanned.tail).decode("utf-8", "replace")
    neighbours = nearest.nearest(text)
    if not neighbours:
        return fallback
    winner = nearest.vote(neighbours) if use_vote else None
    if winner is None:
        return replace(fallback, nearest=neighbours)
    category = winner.category
    signature = trim(f"like {winner.source} ({winner.similarity:.2f})")
    fp = fingerprint(category, "nearest.vote", winner.source)
    return replace(
        fallback, category=category, rule_id="nearest.vote", signature=signature,
        retryable=INFO[category].retryable and not _repeat(category, fp, previous),
        remediation=(f"Weak call: no rule decided; the nearest labelled public failure "
                     f"({winner.source}, similarity {winner.similarity:.2f}) is {category.value}. "
                     f"{INFO[category].remediation}"),
        fingerprint=fp, strength="guess", nearest=neighbours)


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
