"""Tasks that judge a failed attempt: classify it, then decide whether to retry."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from trainguard.core import policy, triage
from trainguard.core.backends.base import AttemptOutcome, AttemptRef, Backend


@task(name="classify_failure", cache_policy=NO_CACHE)
def classify_failure(
    backend: Backend, ref: AttemptRef, outcome: AttemptOutcome, rules_file: str | None = None
) -> triage.Diagnosis | None:
    """Classify the attempt from every signal the backend has (exit code, reason, conditions, events, log)."""
    signals = backend.signals(ref, outcome)
    return triage.classify(signals, rules=triage.load_rules(rules_file) if rules_file else None)


@task(name="decide_retry", cache_policy=NO_CACHE)
def decide_retry(
    retry_policy: policy.RetryPolicy, history: list[policy.AttemptRecord], checkpoints: list[str]
) -> policy.RetryDecision:
    """Apply the retry policy to the run's attempts so far."""
    return policy.decide_retry(retry_policy, history, checkpoints)
