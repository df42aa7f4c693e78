"""Judging one attempt from what its backend hands triage: one node's signals, or the culprit across nodes.

A single-node attempt is classified from its signals (`triage.classify`). An attempt of two or
more nodes, on a backend that hands each node's signals (`SeesNodes`), is judged across them
(`triage.root_cause`): the node whose ranks failed on their own, not the ones that only lost a
peer, with the victims it took down. Either way, where the ranks' stacks were taken while they
were alive, they are compared once (`hangs.odd_ones_out`), here and nowhere else, and a failure
that looks like a hang from the logs is named on the rank the stacks set apart (`_refine`). The
attempt flow and `trainguard run --resume` both judge through here; the verdict's fields are
`AttemptSummary.with_judgement`'s.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace

from trainguard.core import triage
from trainguard.core.attempt import Judgement
from trainguard.core.backends.base import AttemptOutcome, AttemptRef, Backend
from trainguard.core.backends.capabilities import NodeEvidence, SeesNodes
from trainguard.core.taxonomy import INFO, Category
from trainguard.core.triage import hangs

# What a hang looks like in the logs alone: ranks that only lost a peer (a timeout), or the
# attempt stopped from outside for silence or at its deadline.
_HANG_LIKE = frozenset({Category.NCCL_ERROR, Category.TIMEOUT, Category.UNKNOWN})


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
    return _with_stacks(judged, signals.stacks, [])


def _with_stacks(judged: Judgement, stacks: tuple[hangs.RankStacks, ...], nodes: list[NodeEvidence]) -> Judgement:
    """The judgement with the stacks' verdict, and the hang named on its culprit where they name one."""
    if not stacks:
        return judged
    verdict = hangs.odd_ones_out(stacks)
    refined = _refine(judged.diagnosis, verdict)
    if refined is judged.diagnosis or refined is None or judged.across is None:
        return replace(judged, diagnosis=refined, hang=verdict)
    index = next((n.index for n in nodes if n.ranks is not None and refined.rank in n.ranks), None)
    root = triage.RootCause(index, refined.rank, refined.rule_id, None, None)
    return replace(judged, diagnosis=refined, across=replace(judged.across, root_cause=root, diagnosis=refined),
                   hang=verdict)


def _refine(diagnosis: triage.Diagnosis | None, verdict: hangs.HangVerdict) -> triage.Diagnosis | None:
    """The diagnosis once the stacks are read: a hang (or desync) named on its odd ones out.

    Only a failure that looks like a hang from the logs (a communication timeout with the culprit
    undetermined, a stall, a deadline) becomes one; a rank's own error stays what it is.
    """
    if diagnosis is None or verdict.kind not in ("hang", "desync") or not verdict.culprits:
        return diagnosis
    if not (diagnosis.culprit_undetermined or diagnosis.category in _HANG_LIKE):
        return diagnosis
    category = Category.HANG if verdict.kind == "hang" else Category.DESYNC
    frame = re.sub(r":\d+\)$", ")", verdict.frame)  # the fingerprint keeps the place, not the line
    return replace(
        diagnosis, category=category, retryable=INFO[category].retryable, rule_id=f"stacks.{verdict.kind}",
        signature=f"rank {verdict.culprits[0]} at {verdict.frame}", line_number=None, rank=verdict.culprits[0],
        remediation=INFO[category].remediation, strength="cause", culprit_undetermined=False,
        decided_by="stacks", fingerprint=hashlib.sha256(f"{category.value}|{frame}".encode()).hexdigest()[:16],
    )
