"""The values triage works on: the evidence of one failed attempt in, one diagnosis out.

Only plain frozen dataclasses live here; how a log is read belongs in ``scan``, how rules decide
belongs in ``decide``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

from trainguard.core.taxonomy import Category
from trainguard.core.triage.errorfile import ErrorFile
from trainguard.core.triage.hangs import RankStacks
from trainguard.core.triage.nearest import Neighbour

LogSource = bytes | str | os.PathLike[str] | BinaryIO | None
# Categories that say who stopped an attempt on purpose: a person, or the platform taking its
# node back. The backend's own record of the stop (a termination reason, a pod condition or event,
# the scheduler's state, the local supervisor's record) says so with authority; a log line alone
# ("Received SIGTERM", a bare cancellation) can be any of them, or a crash's teardown.
STOPS = frozenset({Category.USER_CANCELLED, Category.PREEMPTED})


@dataclass(frozen=True)
class Signals:
    """Everything known about how one training attempt ended.

    Attributes:
        exit_code: The main container's exit code; negative means killed by that signal
            (torchrun style) and 128+N also means signal N.
        reason: The container termination reason (``OOMKilled``, ``Error``, ``DeadlineExceeded``,
            ``Evicted``, ...); the local backend also reports ``Stalled`` and ``Cancelled``.
        conditions: Pod conditions in Kubernetes wire form.
        events: Kubernetes Event objects in wire form, or ``kubectl get events`` text.
        log: The attempt's log as bytes or text, or a path or binary stream read in bounded memory.
        error_files: torchelastic error files of the attempt's ranks (``errorfile``): each is
            evidence of the rank it names, at the time it records.
        stacks: Every rank's stack, taken while the ranks were alive (``hangs``), where a hang was
            seen coming: judging (`trainguard.core.judging`) names a hang's culprit from them.
    """

    exit_code: int | None = None
    reason: str | None = None
    conditions: tuple[Mapping[str, Any], ...] = ()
    events: tuple[Mapping[str, Any], ...] | str = ()
    log: LogSource = None
    error_files: tuple[ErrorFile, ...] = ()
    stacks: tuple[RankStacks, ...] = ()


@dataclass(frozen=True)
class Victim:
    """A rank passed over as the root cause, and why: its own failure was a peer's loss.

    Attributes:
        rank: The rank (None: lines that name no rank).
        reason: Why it was passed over, for a person.
        rule_id: The rule whose evidence made it a victim (``torchrun.closing_signal`` when its
            agent killed it).
    """

    rank: int | None
    reason: str
    rule_id: str

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "reason": self.reason, "rule_id": self.rule_id}


@dataclass(frozen=True)
class Diagnosis:
    """The verdict on one failed attempt and the evidence that decided it.

    ``rank`` is the root cause's rank; ``victims`` are the ranks passed over because their own
    failure was a peer's loss. ``culprit_undetermined`` says only such losses were in the
    evidence (a hang or desync whose origin the evidence does not show): the category is then
    the communication failure's and ``rank`` is None. ``decided_by`` says what chose the winner
    among the strongest evidence of different answers (``strength`` when nothing else was as
    strong, ``timestamp``, ``line``, ``rule order``; ``victim reading`` when, with only victims,
    a line's reading as a lost peer beat an equal one; across parts also ``part order``).
    ``failed_at`` is when the failure it names happened, in seconds since the epoch, when the
    evidence says (an error file, torchrun's failure report). ``provenance`` says where the
    deciding evidence came from: ``platform`` (the backend's own record: exit code, termination
    reason, conditions, events), ``log`` or ``error file``; None when nothing decided.
    ``nearest`` names, when no rule decided, the labelled public failures most like this one
    (``nearest``): a lead for a person, and (only when asked for) a weak vote.
    """

    category: Category
    retryable: bool
    rule_id: str
    signature: str
    line_number: int | None
    rank: int | None
    remediation: str
    fingerprint: str
    strength: str = "cause"
    victims: tuple[Victim, ...] = ()
    culprit_undetermined: bool = False
    decided_by: str = "strength"
    failed_at: float | None = None
    provenance: str | None = None
    nearest: tuple[Neighbour, ...] = ()

    @property
    def weak(self) -> bool:
        """Whether only hint-strength evidence, a guess or nothing decided, or rule order broke a
        tie between categories, or who stopped the attempt (a person, the platform) was read from
        the log alone, without the backend's own record: a weak call to check by hand."""
        return (self.strength in ("hint", "guess", "none")
                or self.decided_by in ("rule order", "part order")
                or (self.category in STOPS and self.provenance == "log"))

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict; the category is its taxonomy id."""
        return {
            "category": self.category.value,
            "retryable": self.retryable,
            "rule_id": self.rule_id,
            "signature": self.signature,
            "line_number": self.line_number,
            "rank": self.rank,
            "remediation": self.remediation,
            "fingerprint": self.fingerprint,
            "strength": self.strength,
            "weak": self.weak,
            "victims": [v.to_dict() for v in self.victims],
            "culprit_undetermined": self.culprit_undetermined,
            "decided_by": self.decided_by,
            "failed_at": self.failed_at,
            "provenance": self.provenance,
            "nearest": [n.to_dict() for n in self.nearest],
        }
