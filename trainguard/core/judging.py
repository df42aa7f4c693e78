"""Judging one attempt from what its backend hands triage: one node's signals, or the culprit across nodes.

A single-node attempt is classified from its signals (`triage.classify`). An attempt of two or
more nodes, on a backend that hands each node's signals (`SeesNodes`), is judged across them
(`triage.root_cause`): the node whose ranks failed on their own, not the ones that only lost a
peer, with the victims it took down. The attempt flow and `trainguard run --resume` both judge
through here; the verdict's fields are `AttemptSummary.with_judgement`'s.
"""

from __future__ import annotations

from trainguard.core import triage
from trainguard.core.attempt import Judgement
from trainguard.core.backends.base import AttemptOutcome, AttemptRef, Backend, SeesNodes


def judge(backend: Backend, ref: AttemptRef, outcome: AttemptOutcome, rules: triage.RuleSet | None = None) -> Judgement:
    """Triage's verdict on the attempt (see the module docstring); an empty judgement for a success."""
    nodes = backend.node_signals(ref, outcome) if isinstance(backend, SeesNodes) else []
    if len(nodes) > 1:
        parts = [triage.Part(n.signals, n.index, n.node, n.ranks, n.first_error_at) for n in nodes]
        verdict = triage.root_cause(parts, rules=rules)
        if verdict is not None:
            return Judgement(verdict.diagnosis, verdict, {n.index: (n.instance, n.node) for n in nodes})
    return Judgement(triage.classify(backend.signals(ref, outcome), rules=rules))
