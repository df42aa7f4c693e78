"""Settling an attempt whose flow did not finish it: stopped by a signal, or lost with its process.

`trainguard run` calls `settle` after SIGTERM or Ctrl-C (the stop itself is the category), and
`trainguard run --resume` calls it for the attempt a killed run left behind (triage decides). Either
way the attempt's evidence is collected if it was not, its verdict is written beside it, and the
run's attempts so far come back as summaries for the table and the next attempt. Running attempts
and deciding retries belong to the flows; no Prefect here.
"""

from __future__ import annotations

import json
from dataclasses import replace
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from trainguard_entrypoint.files import read_json_object

from trainguard.core import judging, triage
from trainguard.core.attempt import AttemptSummary, Judgement
from trainguard.core.backends import workspace
from trainguard.core.backends.base import ERROR, AttemptOutcome, AttemptRef, Backend
from trainguard.core.backends.capabilities import Supervises
from trainguard.core.evidence import index
from trainguard.core.evidence.manifest import (
    VERDICT, attempt_prefix, attempts_in_store, read_manifest, write_verdict, release_space, storage_failures,
)
from trainguard.core.stores.base import EvidenceNotFound, EvidenceStore
from trainguard.core.taxonomy import INFO, Category

LOST = "Lost"


def attempts_of(backend: Backend, store: EvidenceStore, run_id: str) -> list[int]:
    """Every attempt of the run found in the backend's own places (`Supervises`) or in the evidence store."""
    found = set(attempts_in_store(store, run_id))
    if isinstance(backend, Supervises):
        found |= set(backend.attempts(run_id))
    return sorted(found)


def live_supervisor(backend: Backend, run_id: str, attempt: int) -> int | None:
    """The pid of the `trainguard run` (or worker) still supervising the attempt on this host, if any.

    None for a backend that keeps no supervisor record here (`Supervises`): its platform's own
    records say whether its attempts live.
    """
    return backend.supervisor_pid(run_id, attempt) if isinstance(backend, Supervises) else None


def verdict(store: EvidenceStore, run_id: str, attempt: int) -> AttemptSummary | None:
    """The attempt's recorded verdict, or None if it was never judged."""
    try:
        data = json.loads(store.get_bytes(f"{attempt_prefix(run_id, attempt)}/{VERDICT}"))
    except (EvidenceNotFound, ValueError, RecursionError):
        return None
    return AttemptSummary.from_dict(data) if isinstance(data, dict) else None


def lost_outcome(ref: AttemptRef) -> AttemptOutcome:
    """How the attempt ended, from what it left in its folder (runner.json, else the crash report)."""
    root = Path(ref.workspace) if ref.workspace else None
    runner = (read_json_object(root / workspace.RUNNER_REPORT) or {}) if root else {}
    crash = (read_json_object(root / workspace.CRASH_REPORT) or {}) if root else {}
    source = runner or crash
    if not source:
        return AttemptOutcome(None, None, LOST, "the attempt left no account of how it ended; its supervisor was lost")
    lost = crash.get("supervisor_lost") and not runner
    return AttemptOutcome(
        exit_code=source.get("exit_code"), signal=source.get("signal"),
        reason=LOST if lost else str(source.get("reason") or ERROR),
        message=str(source.get("message") or ("its supervisor was lost; the entrypoint stopped the command"
                                              if lost else "ended without a report from the runner")),
        started_at=source.get("started_at"), finished_at=source.get("finished_at"),
        duration_seconds=float(source.get("duration_seconds") or 0.0), log_path=source.get("log_path"),
    )


def _resumed_from(ref: AttemptRef) -> str | None:
    env = (read_json_object(Path(ref.workspace) / workspace.SNAPSHOT / workspace.ENV_SNAPSHOT) or {}) if ref.workspace else {}
    variables = env.get("variables") if isinstance(env.get("variables"), dict) else env
    value = variables.get("TRAINGUARD_RESUME_FROM") if isinstance(variables, dict) else None
    return str(value) if value else None


def _judgement(
    backend: Backend, ref: AttemptRef, outcome: AttemptOutcome, stopped: Mapping[str, str] | None,
    rules: triage.RuleSet | None,
) -> Judgement:
    """Triage's verdict on the attempt, or the stop's own when a stop signal ended it."""
    if stopped is None:
        return judging.judge(backend, ref, outcome, rules)
    category = Category(stopped["category"])
    return Judgement(triage.Diagnosis(category=category, retryable=INFO[category].retryable, rule_id=stopped["rule_id"],
                            signature=stopped["signature"], line_number=None, rank=None,
                            remediation=stopped["remediation"], fingerprint=stopped["rule_id"], strength="verdict"))


def settle(
    backend: Backend, store: EvidenceStore, run_id: str, attempt: int, *, max_attempts: int, gpus: int,
    next_step: str, stopped: Mapping[str, str] | None = None, rules: triage.RuleSet | None = None,
) -> AttemptSummary:
    """Collect (if need be), judge and record one attempt the flows did not finish.

    Args:
        backend, store: Where the attempt ran and where its evidence goes.
        run_id, attempt: The attempt.
        max_attempts: The run's retry.max_attempts (attempts in a row without checkpoint progress), kept in
            the summary; whether the budget is spent is the policy's to say (`policy.budget_spent`).
        gpus: GPUs the attempt held, for GPU-seconds.
        next_step: What the person should do next (how to resume), recorded as the decision.
        stopped: When a stop signal ended it: category, rule_id, signature and remediation to record
            instead of triage's verdict.
        rules: A user's triage rules.
    """
    ref = backend.provision(run_id, attempt)
    outcome = lost_outcome(ref)
    try:
        manifest = read_manifest(store, run_id, attempt)
    except EvidenceNotFound:
        manifest = backend.collect_evidence(ref, store, outcome).manifest
    checkpoints = backend.checkpoints(run_id)
    summary = AttemptSummary(
        run_id=run_id, attempt=attempt, max_attempts=max_attempts,
        state="Cancelled" if stopped is not None else "Crashed", gpus=gpus, resumed_from=_resumed_from(ref),
        newest_checkpoint=checkpoints[0] if checkpoints else None, decision={"retry": False, "reason": next_step},
        **outcome.summary_fields(),
    ).with_evidence({"location": store.describe(attempt_prefix(run_id, attempt)), "items": len(manifest.items),
                     "missing": len(manifest.absent)}).with_judgement(_judgement(backend, ref, outcome, stopped, rules))
    data = json.dumps(summary.to_dict(), indent=2).encode("utf-8")
    problem = write_verdict(store, run_id, attempt, data, "cli", datetime.now(UTC).isoformat())
    release_space(store, run_id, attempt)  # set aside by the process that was lost
    return summary.with_storage_problems(*storage_failures(manifest), problem, index.keep(store, summary)[1])


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
    planned = summary.decision.get("reason")
    decision = {**summary.decision, "retry": False, "reason": why, "planned": planned}
    changed = replace(summary, decision=decision)
    data = json.dumps(changed.to_dict(), indent=2).encode("utf-8")
    problem = write_verdict(store, summary.run_id, summary.attempt, data, "cli", datetime.now(UTC).isoformat())
    return changed.with_storage_problems(problem, index.keep(store, changed)[1])
