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

LogSource = bytes | str | os.PathLike[str] | BinaryIO | None


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
    """

    exit_code: int | None = None
    reason: str | None = None
    conditions: tuple[Mapping[str, Any], ...] = ()
    events: tuple[Mapping[str, Any], ...] | str = ()
    log: LogSource = None


@dataclass(frozen=True)
class Diagnosis:
    """The verdict on one failed attempt and the evidence that decided it."""

    category: Category
    retryable: bool
    rule_id: str
    signature: str
    line_number: int | None
    rank: int | None
    remediation: str
    fingerprint: str
    strength: str = "cause"

    @property
    def weak(self) -> bool:
        """Whether only hint-strength evidence, a guess or nothing decided: a weak call to check
        by hand."""
        return self.strength in ("hint", "guess", "none")

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
        }
