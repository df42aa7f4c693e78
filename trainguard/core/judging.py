"""Judging one attempt from what its backend hands triage: one node's signals, or the culprit across nodes.

A single-node attempt is classified from its signals (`triage.classify`). An attempt of two or
more nodes, on a backend that hands each node's signals (`SeesNodes`), is judged across them
(`triage.root_cause`): the node whose ranks failed on their own, not the ones that only lost a
peer, with the victims it took down. The attempt flow and `trainguard run --resume` both judge
through here; the verdict's fields are `AttemptSummary.with_judgement`'s.
"""

from __future__ import annotations

from dataclasses import replace

from trainguard.core import triage
from trainguard.core.attempt import Judgement
from trainguard.core.backends.base import AttemptOutcome, AttemptRef, Backend
from trainguard.core.backends.capabilities import NodeEvidence, SeesNodes
from trainguard.core.triage import hangs


def judge(backend: Backend, ref: AttemptRef, outcome: AttemptOutcome, rules: triage.RuleSet | None = None) -> Judgement:
    """Triage's verdict on the attempt (see the module docstring); an empty judgement for a success.

    Where the ranks' stacks were taken before the attempt ended, they are compared across every
    node's ranks: a hang that the logs cannot place is named on the rank that was elsewhere.
    """
    nodes = backend.node_signals(ref, outcome) if isinstance(backend, SeesNodes) else []
    if len(nodes) > 1:
        parts = [triage.Part(n.signals, n.index, n.node, n.ranks, n.first_error_at) for n in nodes]
        verdict = triage.root_cause(parts, rules=rules)
        if verdict is not None:
            where = {n.index: (n.instance, n.node) for n in nodes}
            stacks = tuple(s for n in nodes for s in n.signals.stacks)
            return _with_stacks(Judgement(verdict.diagnosis, verdict, where), stacks, nodes)
    signals = backend.signals(ref, outcome)
    judged = Judgement(triage.classify(signals, rules=rules))
    return _with_stacks(judged, signals.stacks, []) if signals.stacks else judged


def _with_stacks(judged: Judgement, stacks: tuple[hangs.RankStacks, ...], nodes: list[NodeEvidence]) -> Judgement:
    """The judgement with the stacks' verdict, and the hang named on its culprit where they name one."""
    if not stacks:
        return judged
    verdict = hangs.odd_ones_out(stacks)
    refined = hangs.refine(judged.diagnosis, verdict)
    if refined is judged.diagnosis or refined is None or judged.across is None:
        return replace(judged, diagnosis=refined, hang=verdict)
    index = next((n.index for n in nodes if n.ranks is not None and refined.rank in n.ranks), None)
    root = triage.RootCause(index, refined.rank, refined.rule_id, None, None)
    return replace(judged, diagnosis=refined, across=replace(judged.across, root_cause=root, diagnosis=refined),
                   hang=verdict)
