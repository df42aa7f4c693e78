"""The judging step: classify a failed attempt, read its progress and the run's checkpoints, then decide whether
to retry."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from trainguard.core import checkpoints, judging, policy, triage
from trainguard.core.attempt import Judgement
from trainguard.core.backends.base import AttemptOutcome, AttemptRef, Backend
from trainguard.core.backends.waits import said_while, span


def read_checkpoints(backend: Backend, ref: AttemptRef | None, outcome: AttemptOutcome, run_id: str, attempt: int,
                     resumed_from: str | None) -> checkpoints.CheckpointReading:
    """The attempt's progress (its log's (step, loss) points) and the run's checkpoints after it, newest first,
    with the facts its verdict records (`checkpoints.read`); listing them may take a pod of its own
    (Kubernetes): said if slow."""
    logged = checkpoints.logged_points(backend, ref, outcome) if ref is not None else []
    with said_while(get_run_logger().info, lambda waited: f"trainguard: waiting {span(waited)} for the {backend.kind} "
                    "backend to list the run's checkpoints"):
        return checkpoints.read(backend, run_id, attempt, resumed_from, logged)


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
