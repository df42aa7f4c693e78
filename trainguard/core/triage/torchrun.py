"""What torchrun's agent says about its workers: its failure report and the signals it sent.

When a worker fails, torchrun's agent stops the others (``Sending process <pid> closing signal
SIGTERM``) and ends with ``ChildFailedError`` and a report of every worker that failed on its
node, one entry each (``rank``, ``exitcode`` with the pid, ``error_file``, ``traceback``), the
``Root Cause (first observed failure)`` first observed *on that node*. Reading that report gives
each failure its global rank and time, and the closing signals say which workers died as victims
of the agent's own kill. Only the text's structure belongs here; which lines are evidence of what
is for the rules, and the choice of a root cause is ``decide``'s.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from trainguard.core.triage.lines import read_line

_ENTRY = re.compile(r"^\[(\d+)\]:$")
_FIELD = re.compile(r"^(time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")
_RANK = re.compile(r"^(\d+)(?: \(local_rank: (\d+)\))?")
_EXIT = re.compile(r"^(-?\d+)(?: \(pid: (\d+)\))?(?:\s+\((SIG\w+)\))?")
# torch writes the failure's time as "2024-09-09_09:36:56" (local time, no zone).
_TIME = re.compile(r"^(\d{4})-(\d\d)-(\d\d)[_T ](\d\d):(\d\d):(\d\d)")
_RULE = re.compile(r"^(?:-{10,}|={10,})$")
_NOT_AVAILABLE = "<N/A>"


@dataclass(frozen=True)
class WorkerFailure:
    """One entry of torchrun's failure report.

    Attributes:
        rank: The worker's global rank.
        local_rank: Its rank on its node.
        exitcode: Its exit code; negative: killed by that signal.
        pid: Its process id, which the agent's closing-signal lines name.
        at: When it failed, in seconds since the epoch (the report's time, read as UTC), if given.
        error_file: The torchelastic error file the worker wrote, if any.
        message: The report's traceback field: the worker's last error line(s), or the signal.
        root_cause: Whether the agent named it the first observed failure on its node.
        first_line: The log line where the entry starts (1-based).
        last_line: The log line where it ends.
    """

    rank: int
    local_rank: int | None
    exitcode: int | None
    pid: int | None
    at: float | None
    error_file: str | None
    message: str
    root_cause: bool
    first_line: int
    last_line: int

    @property
    def signalled(self) -> bool:
        """Whether the worker died of a signal rather than exiting."""
        return self.exitcode is not None and self.exitcode < 0


@dataclass(frozen=True)
class AgentReport:
    """What the agent(s) in one log said: every failure entry, and the pids they signalled."""

    failures: tuple[WorkerFailure, ...] = ()
    closed: dict[int, str] = field(default_factory=dict)  # pid -> the signal the agent sent

    def by_pid(self) -> dict[int, WorkerFailure]:
        return {f.pid: f for f in self.failures if f.pid is not None}

    def closed_by_agent(self, failure: WorkerFailure) -> str | None:
        """The closing signal the agent sent the worker, if it died of one the agent sent."""
        if failure.pid is None or not failure.signalled:
            return None
        return self.closed.get(failure.pid)


@dataclass
class _Entry:
    root_cause: bool
    first_line: int
    last_line: int
    fields: dict[str, str] = field(default_factory=dict)
    more: list[str] = field(default_factory=list)


def read_report(lines: Sequence[str | bytes], first_line: int,
                closing: Iterable[tuple[re.Pattern[str], int]] = ()) -> AgentReport:
    """Read torchrun's failure reports and closing signals out of the lines of a log's tail.

    Args:
        lines: Raw log lines (prefixes are stripped here), in order.
        first_line: The line number of ``lines[0]`` in the whole log.
        closing: Patterns of the agent's closing-signal line, each with the number of its
            group that names the process.
    """
    texts = [read_line(raw).text for raw in lines]
    entries = _entries(texts, first_line)
    failures = tuple(w for w in (_failure(e) for e in entries) if w is not None)
    return AgentReport(failures, _closed(texts, list(closing)))


def _closed(texts: Sequence[str], closing: list[tuple[re.Pattern[str], int]]) -> dict[int, str]:
    """The pids the agent sent a closing signal, and the signal."""
    closed: dict[int, str] = {}
    for text in texts:
        for pattern, group in closing:
            m = pattern.search(text)
            if m and m.group(group) and m.group(group).isdigit():
                signal = re.search(r"SIG[A-Z]+", text[m.start():])
                closed[int(m.group(group))] = signal.group(0) if signal else "a signal"
    return closed


def _entries(texts: Sequence[str], first_line: int) -> list[_Entry]:
    """The report's entries, each with its fields and the lines it spans."""
    entries: list[_Entry] = []
    section: bool | None = None  # True: root cause, False: other failures, None: outside
    entry: _Entry | None = None
    in_traceback = False
    for offset, text in enumerate(texts):
        if text.startswith(("Root Cause", "Failures:")):
            section, entry = text.startswith("Root Cause"), None
        elif section is None:
            continue
        elif _RULE.match(text) or text.startswith("<NO_OTHER_FAILURES>"):
            entry, in_traceback = None, False
            if text.startswith("="):  # the report's closing border
                section = None
        elif _ENTRY.match(text):
            entry, in_traceback = _Entry(section, first_line + offset, first_line + offset), False
            entries.append(entry)
        elif entry is not None:
            entry.last_line = first_line + offset
            f = _FIELD.match(text)
            if f and not in_traceback:
                entry.fields[f.group(1)] = f.group(2).strip()
                in_traceback = f.group(1) == "traceback"
            elif in_traceback and text:
                entry.more.append(text)
    return entries


def _failure(entry: _Entry) -> WorkerFailure | None:
    rank = _RANK.match(entry.fields.get("rank", ""))
    if rank is None:
        return None
    exit_ = _EXIT.match(entry.fields.get("exitcode", ""))
    error_file = entry.fields.get("error_file")
    message = "\n".join([entry.fields.get("traceback", "")] + entry.more).strip()
    return WorkerFailure(
        rank=int(rank.group(1)),
        local_rank=int(rank.group(2)) if rank.group(2) else None,
        exitcode=int(exit_.group(1)) if exit_ else None,
        pid=int(exit_.group(2)) if exit_ and exit_.group(2) else None,
        at=_epoch(entry.fields.get("time", "")),
        error_file=None if not error_file or error_file == _NOT_AVAILABLE else error_file,
        message=message, root_cause=entry.root_cause,
        first_line=entry.first_line, last_line=entry.last_line,
    )


def _epoch(text: str) -> float | None:
    m = _TIME.match(text)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.groups())
    return float(calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)))
