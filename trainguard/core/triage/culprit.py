"""Whose failure is the root cause: evidence given to ranks, victims passed over, ties broken.

A failed distributed attempt holds the culprit's error and its victims' errors: the peers that
lost it (a closed connection, a collective timeout) and the workers their launcher killed once it
failed. Every candidate is first given the rank and time torchrun's failure report and the error
files say it belongs to (``attribute``). Then (``choose``) a rank is a victim when its strongest
own evidence comes from a ``victim`` rule (or shares its line with one), or when its agent's
closing signal killed it before it had failed on its own; the root cause is the strongest
evidence of the others, the earliest failing rank among equals. With only victims, the culprit
is undetermined and the strongest victim evidence names the category. Rules and scanning are
elsewhere; this only chooses.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from trainguard.core.triage.lines import signature_of
from trainguard.core.triage.rules import STRENGTHS, Rule, RuleSet
from trainguard.core.triage.signals import STOPS, Victim
from trainguard.core.triage.torchrun import AgentReport, WorkerFailure

Stamp = tuple[int, int, float]  # (month, day, seconds): comparable across glog and ISO stamps
_PID = re.compile(r"\(pid: (\d+)\)|\bPID (\d+)\b")
CLOSED_BY_AGENT = "torchrun.closing_signal"


@dataclass(frozen=True)
class Candidate:
    """One piece of evidence some rule accepts.

    ``origin`` is None for the log (and platform signals, which have no line), else the error
    file it was read from; ``line_number`` counts lines of its origin.
    """

    rule: int
    strength: int
    signature: str
    line_number: int | None
    rank: int | None
    timestamp: Stamp | None
    origin: str | None = None


@dataclass(frozen=True)
class Choice:
    """The root cause among the candidates, and how it was chosen."""

    winner: Candidate
    victims: tuple[Victim, ...]
    undetermined: bool
    decided_by: str
    tied: int  # how many candidates were as strong as the winner, among those it was chosen from
    failed_at: float | None


def stamp(epoch: float) -> Stamp:
    """The sortable stamp of a time in seconds since the epoch (UTC, as the logs' clocks)."""
    t = time.gmtime(epoch)
    return (t.tm_mon, t.tm_mday, t.tm_hour * 3600 + t.tm_min * 60 + t.tm_sec + epoch % 1)


def attribute(candidates: Sequence[Candidate], report: AgentReport,
              times: Mapping[int, float]) -> list[Candidate]:
    """Give each candidate the rank and time the launcher's report and error files say.

    A line inside a report entry is that entry's rank's; a line naming a worker's pid (the
    agent's ``failed (exitcode: -9) local_rank: 1 (pid: 12236)``, whose ``local_rank`` is not
    the global rank) is that worker's; a ranked candidate without a time of its own takes its
    rank's failure time (``times``: from error files, then the report).
    """
    if not report.failures and not times:
        return list(candidates)
    by_pid = report.by_pid()
    out = []
    for c in candidates:
        rank, ts = c.rank, c.timestamp
        if c.origin is None and c.line_number is not None:
            entry = _entry_at(report.failures, c.line_number)
            if entry is None:
                entry = _named_pid(c.signature, by_pid)
            if entry is not None:
                rank = entry.rank
        if rank is not None and ts is None and rank in times:
            ts = stamp(times[rank])
        same = (rank, ts) == (c.rank, c.timestamp)
        out.append(c if same else replace(c, rank=rank, timestamp=ts))
    return out


def failure_times(report: AgentReport, error_times: Mapping[int, float]) -> dict[int, float]:
    """When each rank failed: its error file's time, else the report's."""
    times = {f.rank: f.at for f in report.failures if f.at is not None}
    times.update(error_times)
    return times


def choose(candidates: Sequence[Candidate], rules: RuleSet, report: AgentReport,
           times: Mapping[int, float]) -> Choice:
    """The root cause: the strongest non-victim evidence, the earliest among equals."""
    # A log that names no rank is one process's: its lines and its exit are one rank's evidence.
    alone = not report.failures and all(c.rank is None for c in candidates)
    victims = _victims(candidates, rules, report, alone)
    passed = {v.rank for v in victims}
    on_victim_line = _victim_lines(candidates, rules)

    def is_victim(c: Candidate) -> bool:
        if c.rank in passed and (c.rank is not None or alone):
            return True
        return rules.rules[c.rule].victim or _on_line(c, on_victim_line)

    # An abort that names no rank, beside victims' errors, is most likely a victim's teardown
    # (the watchdog takes its process down), not a failure of its own; a ranked one is its rank's,
    # unless aborting is all its rank did (torchrun reporting only the SIGABRT that ended it) while
    # the victims report a collective that failed.
    # So is what else its line says no more strongly than the victims do: "terminate called after
    # throwing an instance of 'c10::DistBackendError'" names a class whose message, on the next
    # line, is the victim's; "... 'std::bad_alloc'" says more.
    worst = max((c.strength for c in candidates if is_victim(c)), default=None)
    wrapped = {(c.origin, c.line_number) for c in candidates
               if c.rank is None and c.line_number is not None and rules.rules[c.rule].wrapper}
    unwrapped = {c.rank for c in candidates if not rules.rules[c.rule].wrapper}  # ranks with more than an abort

    def is_teardown(c: Candidate) -> bool:
        if worst is None:
            return False
        if c.rank is not None:  # torchrun's closing signal alone says no collective failed
            return worst > c.strength and c.rank not in unwrapped
        return rules.rules[c.rule].wrapper or (
            (c.origin, c.line_number) in wrapped and c.strength <= worst)

    own = [c for c in candidates if not is_victim(c) and not is_teardown(c)]
    undetermined = not own
    # With only victims, a reading of their lines as the lost peer's outranks an equal one as
    # an error of their own ("Gloo ... failed" is also an uncaught RuntimeError).
    winner, decided_by, tied = order(own or candidates, rules, prefer_victim_rules=undetermined)
    failed_at = None if winner.rank is None else times.get(winner.rank)
    return Choice(winner, victims, undetermined, decided_by, tied, failed_at)


def order(candidates: Sequence[Candidate], rules: RuleSet,
          prefer_victim_rules: bool = False) -> tuple[Candidate, str, int]:
    """The strongest candidate; among equals the earliest failing rank when each carries a time,
    else the earliest line (a log line before an error file before a platform signal), then
    (``prefer_victim_rules``) a victim rule's reading of a line, then the earlier rule. Also what
    decided between it and the first equal that gives another answer (another category or
    rank), and how many equals there were."""
    top = max(c.strength for c in candidates)
    group = [c for c in candidates if c.strength == top]
    timed = len(group) > 1 and all(c.timestamp is not None for c in group)
    # Who stopped the attempt is the backend's to say: its own record of a stop outranks a log
    # line of equal strength.
    record = top >= STRENGTHS["verdict"]
    ranked = sorted(group, key=lambda c: (
        record and not _stop_record(c, rules),
        c.timestamp if timed else (0, 0, 0.0), _place(c),
        prefer_victim_rules and not rules.rules[c.rule].victim, c.rule))
    winner = ranked[0]
    if len(ranked) == 1:
        return winner, "strength", 1
    category = rules.rules[winner.rule].category
    rival = next((c for c in ranked[1:] if c.rank != winner.rank
                  or rules.rules[c.rule].category is not category), ranked[1])
    if record and _stop_record(winner, rules) and not _stop_record(rival, rules):
        return winner, "platform record", len(group)
    if timed and rival.timestamp != winner.timestamp:
        return winner, "timestamp", len(group)
    if _place(rival) != _place(winner):
        return winner, "line", len(group)
    lost_peer = rules.rules[winner.rule].victim and not rules.rules[rival.rule].victim
    if prefer_victim_rules and lost_peer:
        return winner, "victim reading", len(group)
    if rules.rules[rival.rule].category is not category:
        return winner, "rule order", len(group)
    return winner, "strength", len(group)  # the same answer whichever of them is taken


def _stop_record(c: Candidate, rules: RuleSet) -> bool:
    """Whether the candidate is the backend's own record (no log line, no error file) of who
    stopped the attempt."""
    return (c.line_number is None and c.origin is None
            and rules.rules[c.rule].category in STOPS)


def _place(c: Candidate) -> tuple[bool, bool, int]:
    # A log line says more than an error file's copy of it, and both more than an exit code.
    return (c.line_number is None, c.origin is not None, c.line_number or 0)


def _entry_at(failures: Sequence[WorkerFailure], line: int) -> WorkerFailure | None:
    return next((f for f in failures if f.first_line <= line <= f.last_line), None)


def _named_pid(text: str, by_pid: Mapping[int, WorkerFailure]) -> WorkerFailure | None:
    m = _PID.search(text)
    if m is None:
        return None
    return by_pid.get(int(m.group(1) or m.group(2)))


Line = tuple[str | None, int]  # (origin, line number)


def _victim_lines(candidates: Sequence[Candidate], rules: RuleSet) -> dict[Line, int]:
    """For each line a victim rule matched, the strength of that rule's evidence there."""
    lines: dict[Line, int] = {}
    for c in candidates:
        if rules.rules[c.rule].victim and c.line_number is not None:
            key = (c.origin, c.line_number)
            lines[key] = max(lines.get(key, 0), c.strength)
    return lines


def _on_line(c: Candidate, lines: Mapping[Line, int]) -> bool:
    # A weaker reading of a victim's line ("RuntimeError: ... Connection closed by peer" is also
    # an uncaught RuntimeError) is the same loss; a stronger one (a CUDA OOM quoted in an NCCL
    # error) is not.
    if c.line_number is None:
        return False
    strength = lines.get((c.origin, c.line_number))
    return strength is not None and c.strength <= strength


def _victims(candidates: Sequence[Candidate], rules: RuleSet, report: AgentReport,
             alone: bool) -> tuple[Victim, ...]:
    """Ranks killed by their agent's closing signal (unless they had failed on their own first), and ranks
    whose strongest own evidence is a victim rule's (``alone``: the whole log is one unnamed rank's)."""
    found: dict[int | None, Victim] = {}
    lines = _victim_lines(candidates, rules)
    for failure in report.failures:
        signal = report.closed_by_agent(failure)
        if signal is not None and not _failed_first(failure.rank, candidates, rules, lines):
            found[failure.rank] = Victim(
                failure.rank, f"its torchrun agent killed it with a closing signal ({signal}) "
                              "once a failure had happened", CLOSED_BY_AGENT)
    by_rank: dict[int | None, list[Candidate]] = {}
    for c in candidates:
        if c.rank is not None or alone:
            by_rank.setdefault(c.rank, []).append(c)
    for rank, own in sorted(by_rank.items(), key=lambda item: -1 if item[0] is None else item[0]):
        if rank in found:
            continue
        best, _, _ = order(own, rules)
        rule = rules.rules[best.rule]
        if rule.victim or _on_line(best, lines):
            victim_rule = rule if rule.victim else _victim_rule_on(best, candidates, rules)
            found[rank] = Victim(rank, f"its own error only reports a lost peer: "
                                       f"{signature_of(best.signature)}", victim_rule.id)
    return tuple(found[r] for r in sorted(found, key=lambda r: -1 if r is None else r))


def _failed_first(rank: int | None, candidates: Sequence[Candidate], rules: RuleSet,
                  lines: Mapping[Line, int]) -> bool:
    """Whether a rank its agent's closing signal ended had failed on its own before the signal came.

    Its traceback (in its error file, which `@record` writes as the exception leaves the worker)
    holds an error of its own: not a lost peer, not a stop, and more than a hint. The worker was
    still tearing down (its process group's destructors) when a victim's exit made the agent
    close the rest; the signal ended a process that had already failed.
    """
    if rank is None:
        return False
    return any(c.rank == rank and c.strength >= STRENGTHS["error"] and not rules.rules[c.rule].victim
               and not _on_line(c, lines) and rules.rules[c.rule].category not in STOPS for c in candidates)


def _victim_rule_on(c: Candidate, candidates: Sequence[Candidate], rules: RuleSet) -> Rule:
    here = (c.origin, c.line_number)
    return next(rules.rules[o.rule] for o in candidates
                if rules.rules[o.rule].victim and (o.origin, o.line_number) == here)
