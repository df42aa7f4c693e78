"""Settling an attempt whose flow did not finish it: the one recovery path every caller takes.

The crash hook and the retry controller call `recover` for an attempt whose flow process died;
`trainguard run` calls it after SIGTERM or Ctrl-C (the stop itself is the category) and, with
``--resume``, for the attempt a killed run left behind (triage decides). Whatever the caller, what
the attempt left running is stopped (before its evidence is collected, or after where the stop
removes the evidence: `StopsOrphans.evidence_first`), its evidence is collected if it was not, it is
judged and its retry decided, and its verdict is kept beside its evidence (`verdicts.keep`). Each
step is best effort and says what went wrong; none of them raises for the platform or the store.
Running attempts belongs to the flows; no Prefect here.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from trainguard_entrypoint.files import read_json_object

from trainguard.core import checkpoints, judging, triage
from trainguard.core.attempt import AttemptSummary, Judgement
from trainguard.core.backends import workspace
from trainguard.core.backends.base import AttemptOutcome, AttemptRef, Backend, CollectedEvidence
from trainguard.core.backends.capabilities import StopsOrphans, Supervises
from trainguard.core.backends.waits import said_while, span
from trainguard.core.evidence import verdicts
from trainguard.core.evidence.manifest import ManifestError, attempt_prefix, attempts_in_store, read_manifest
from trainguard.core.policy import RetryDecision
from trainguard.core.stores.base import EvidenceNotFound, EvidenceStore
from trainguard.core.taxonomy import INFO, Category

Decide = Callable[[AttemptSummary, list[str]], RetryDecision]
Judge = Callable[[AttemptRef, AttemptOutcome], Judgement]


def triage_judge(backend: Backend, rules: triage.RuleSet | None = None) -> Judge:
    """Judging by triage, from every signal the backend has (`judging.judge`)."""
    return lambda ref, outcome: judging.judge(backend, ref, outcome, rules)


def attempts_of(backend: Backend, store: EvidenceStore, run_id: str) -> list[int]:
    """Every attempt of the run found in the backend's own places (`Supervises`) or in the evidence store."""
    found = set(attempts_in_store(store, run_id))
    if isinstance(backend, Supervises):
        found |= set(backend.attempts(run_id))
    return sorted(found)


@dataclass(frozen=True)
class Stop:
    """A verdict the caller knows without triage: what stopped the attempt (a signal, its flow process dying)."""

    category: Category
    rule_id: str
    signature: str
    remediation: str
    fingerprint: str = ""

    def judge(self, ref: AttemptRef, outcome: AttemptOutcome) -> Judgement:
        """The stop's own verdict, whatever the attempt left (a `Judge`)."""
        return Judgement(triage.Diagnosis(
            category=self.category, retryable=INFO[self.category].retryable, rule_id=self.rule_id,
            signature=self.signature, line_number=None, rank=None, remediation=self.remediation,
            fingerprint=self.fingerprint or self.rule_id, strength="verdict"))


@dataclass(frozen=True)
class Recovered:
    """What recovering an attempt did: its verdict as kept, what was stopped, and what went wrong on the way."""

    kept: verdicts.Kept
    stopped: str | None
    warnings: tuple[str, ...] = ()

    @property
    def summary(self) -> AttemptSummary:
        """The verdict as kept."""
        return self.kept.summary


def recover(backend: Backend, store: EvidenceStore, begun: AttemptSummary, *, judge: Judge, decide: Decide,
            source: str, say: Callable[[str], None] | None = None) -> Recovered:
    """Stop, collect (if need be), judge, decide and keep the verdict of one attempt the flows did not finish.

    Args:
        backend, store: Where the attempt ran and where its evidence goes.
        begun: The attempt's summary as the caller knows it (run, attempt, budget, state, GPUs, lineage).
        judge: How it is judged: by triage (`triage_judge`), or by what stopped it (`Stop.judge`).
        decide: The retry decision, given the judged summary and the run's checkpoints.
        source: Who recovers it ("retry-controller", "cli"), as the manifest lists the verdict.
        say: Shows a line while a step that may take long (collecting, stopping, listing) goes on.
    """
    warnings: list[str] = []
    said = partial(_said, say, f"the {backend.kind} backend to", f"attempt {begun.attempt} of {begun.run_id}")
    ref = backend.provision(begun.run_id, begun.attempt)  # finds the attempt's place again; creates nothing new
    evidence_first = isinstance(backend, StopsOrphans) and backend.evidence_first
    with said("stop what {} left running"):
        stopped = None if evidence_first else _stop_orphan(backend, ref, warnings)
    outcome = backend.lost_outcome(ref)
    with said("collect the evidence of {}"):
        collected = _evidence(backend, ref, store, outcome)
    points = checkpoints.logged_points(backend, ref, outcome)  # from the log the evidence kept, before any stop
    if evidence_first:
        with said("stop what {} left running"):
            stopped = _stop_orphan(backend, ref, warnings)
    resumed_from = begun.resumed_from or _resumed_from(ref)
    with said("list the run's checkpoints for {}"):
        found = checkpoints.read(backend, begun.run_id, begun.attempt, resumed_from, points)
    judgement = judge(ref, outcome)
    summary = found.into(outcome.into(replace(begun, resumed_from=resumed_from), begun.state))
    # the longer of what the platform and the caller saw: the seconds the attempt held its resources
    summary = replace(summary, duration_seconds=max(summary.duration_seconds, begun.duration_seconds))
    summary = collected.into(summary).with_judgement(judgement)
    kept = verdicts.keep(store, summary.with_decision(decide(summary, list(found.listing))), source,
                         manifest=collected.manifest)
    return Recovered(kept, stopped, (*warnings, *kept.warnings))


def _said(say: Callable[[str], None] | None, who: str, attempt: str, what: str) -> AbstractContextManager[None]:
    """Lines while a recovery step lasts more than a few seconds (none without ``say``): no wait is silent."""
    if say is None:
        return nullcontext()
    doing = what.format(attempt)
    return said_while(say, lambda waited: f"trainguard: waiting {span(waited)} for {who} {doing}")


def retry_not_made(store: EvidenceStore, summary: AttemptSummary, why: str) -> AttemptSummary:
    """Record on a judged attempt that the retry its decision planned was never made.

    The attempt keeps its own verdict (category, signature, budget): a stop that lands during the
    backoff ended no training, so it must not be taken for how this attempt ended. Only the decision
    changes: no retry, ``why`` as its reason, and the planned one kept as ``planned``.

    Args:
        store: Where the attempt's verdict is kept.
        summary: The attempt's recorded verdict, whose decision was to retry.
        why: What stopped the retry and how to continue the run.
    """
    planned = summary.decision or RetryDecision(retry=False, reason="")
    decision = replace(planned, retry=False, reason=why, planned=planned.reason or None)
    return verdicts.keep(store, replace(summary, decision=decision), "cli").summary


def _evidence(backend: Backend, ref: AttemptRef, store: EvidenceStore, outcome: AttemptOutcome) -> CollectedEvidence:
    """The evidence its flow kept, or, when it kept none, what the backend's collector keeps now."""
    try:
        return CollectedEvidence(read_manifest(store, ref.run_id, ref.attempt),
                                 store.describe(attempt_prefix(ref.run_id, ref.attempt)))
    except (EvidenceNotFound, ManifestError, ValueError):
        return backend.collect_evidence(ref, store, outcome)


def _stop_orphan(backend: Backend, ref: AttemptRef, warnings: list[str]) -> str | None:
    """Stop what the attempt left running, where the backend can; what was stopped, or None."""
    if not isinstance(backend, StopsOrphans):
        return None
    try:
        return backend.stop_orphan(ref)
    except Exception as exc:  # stopping is best effort; the evidence and the retry still matter
        warnings.append(f"could not stop what {ref.run_id} attempt {ref.attempt} left running: "
                        f"{type(exc).__name__}: {exc}")
        return None


def _resumed_from(ref: AttemptRef) -> str | None:
    """The checkpoint the attempt was started from, as its environment snapshot recorded it."""
    env = (read_json_object(Path(ref.workspace) / workspace.SNAPSHOT / workspace.ENV_SNAPSHOT) or {}) if ref.workspace else {}
    variables = env.get("variables") if isinstance(env.get("variables"), dict) else env
    value = variables.get("TRAINGUARD_RESUME_FROM") if isinstance(variables, dict) else None
    return str(value) if value else None
