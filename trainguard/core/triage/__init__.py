"""Failure triage: which taxonomy category a failed training attempt belongs to, and why.

The public interface is ``Signals`` in, ``Diagnosis`` out, through ``classify`` (the root-cause
rank, the ranks passed over as victims and why); torchelastic's error files are read with
``parse_error_file`` into ``Signals.error_files``; ``root_cause`` finds the culprit across
several parts (pods, nodes) of one attempt. The rules that decide are data (``rules.yaml``,
layered with a user's file by ``load_rules``). Pure Python, no Prefect: the flow's task and the
``trainguard classify`` command both call this.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache

from trainguard.core.triage.decide import decide
from trainguard.core.triage.rules import (
    RuleFileError,
    RuleSet,
    build,
    layer,
    parse_rule_file,
    read_user_file,
    shipped_rules_text,
)
from trainguard.core.triage.engines import hyperscan_available
from trainguard.core.triage.errorfile import ErrorFile, local_rank_of, parse_error_file
from trainguard.core.triage.explain import Evidence, Explanation
from trainguard.core.triage.explain import explain as _explain
from trainguard.core.triage.parts import Part, PartVictim, RootCause, Verdict
from trainguard.core.triage.parts import root_cause as _root_cause
from trainguard.core.triage.signals import Diagnosis, Signals, Victim

__all__ = [
    "Diagnosis", "ErrorFile", "Evidence", "Explanation", "Part", "PartVictim", "RootCause",
    "RuleFileError", "RuleSet", "Signals", "Verdict", "Victim", "classify", "explain",
    "hyperscan_available", "load_rules", "local_rank_of", "parse_error_file", "root_cause",
]


@lru_cache(maxsize=1)
def _shipped() -> RuleSet:
    rules, warning = parse_rule_file(shipped_rules_text(), "trainguard/core/triage/rules.yaml",
                                     check_patterns=False)
    return build(rules, warning or r"(?!)", ("shipped",))


def load_rules(path: str | os.PathLike[str] | None = None) -> RuleSet:
    """The shipped rules, with a user's rule file (if given) layered on top.

    User rules override shipped rules with the same id and otherwise go first.

    Raises:
        RuleFileError: the file is unreadable or invalid; the message names the file, the line
            and the field.
    """
    shipped = _shipped()
    if path is None:
        return shipped
    source = os.fspath(path)
    user, warning = parse_rule_file(read_user_file(path), source)
    merged = layer(list(shipped.rules), user)
    return build(merged, warning or shipped.warning_line.pattern, shipped.sources + (source,))


def classify(signals: Signals, *, rules: RuleSet | None = None,
             previous: Sequence[Diagnosis] = (), engine: str = "auto",
             nearest_vote: bool = False) -> Diagnosis | None:
    """Classify one failed attempt.

    Args:
        signals: What is known of how the attempt ended.
        rules: The rule set to use; the shipped rules when None.
        previous: Earlier attempts' diagnoses: a repeated native crash or unknown failure is
            not retried again.
        engine: "auto" (Hyperscan when importable), "hyperscan" or "re".
        nearest_vote: When no rule decides, let the nearest labelled public failures' weak vote
            decide instead of ``unknown`` (a guess, marked weak). Off by default: on the blind
            set of fresh public reports it did not help. The neighbours are named either way.

    Returns:
        The diagnosis, or None when the attempt is not a failure (exit code 0 and nothing that
        says otherwise).
    """
    return decide(signals, rules or load_rules(), previous, engine, nearest_vote)


def explain(signals: Signals, *, rules: RuleSet | None = None,
            previous: Sequence[Diagnosis] = (), engine: str = "auto",
            nearest_vote: bool = False) -> Explanation:
    """Classify one attempt and say which rules matched, with strength and line, and why the
    winner won (``trainguard classify --explain``)."""
    return _explain(signals, rules or load_rules(), previous, engine, nearest_vote)


def root_cause(parts: Sequence[Part], *, rules: RuleSet | None = None,
               previous: Sequence[Diagnosis] = (), engine: str = "auto") -> Verdict | None:
    """Find the root cause across several parts of one attempt's evidence (pods, nodes, ranks).

    Each part is classified on its own; platform verdicts come first, then the strongest
    failure of a part's own (a part whose failures only report a lost peer is a victim), the
    earliest among equals.

    Args:
        parts: The parts, each with its signals and who it is (index, node, ranks, and when its
            first error happened if known).
        rules: The rule set to use; the shipped rules when None.
        previous: Earlier attempts' diagnoses (see ``classify``).
        engine: "auto", "hyperscan" or "re".

    Returns:
        The root cause ``{index, rank, rule_id, first_error_at, margin_seconds}``, the victims
        passed over (part, rank, why) and the combined diagnosis; None when no part failed.
    """
    return _root_cause(parts, rules or load_rules(), previous, engine)
