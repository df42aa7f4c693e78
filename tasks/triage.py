"""Tasks that judge a failed attempt: classify it, then decide whether to retry."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from trainguard.core import judging, policy, triage
from trainguard.core.attempt import Judgement
from trainguard.core.backends.base import AttemptOutcome, AttemptRef, Backend


@task(name="classify_failure", cache_policy=NO_CACHE)
def classify_failure(
    backend: Backend, ref: AttemptRef, outcome: AttemptOutcome, rules_file: str | None = None
) -> Judgement:
    """Classify the attempt from every signal the backend has (exit code, reason, conditions, events,
    log, error files), across its nodes when it ran on several."""
    return judging.judge(backend, ref, outcome, triage.load_rules(rules_file) if rules_file else None)


@task(name="decide_retry", cache_policy=NO_CACHE)
def decide_retry(
    retry_policy: policy.RetryPolicy, history: list[policy.AttemptRecord], checkpoints: list[str]
) -> policy.RetryDecision:
    """Apply the retry policy to the run's attempts so far."""
    return policy.decide_retry(retry_policy, history, checkpoints)
