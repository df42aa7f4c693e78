"""State hooks that carry out the attempt flow's retry decision by scheduling the next attempt.

The decision itself is made in the flow (it lands in the Failed state's data); the hook only
executes it. For a Crashed attempt (SIGTERM, the process killed) there is no data, so the hook asks
the same policy with the attempt recorded as preempted. Scheduling goes through `run_deployment`
with an idempotency key derived from the failed run, so calling the hook twice (or an automation
racing it) schedules one run. Parameter names must be exactly `flow, flow_run, state`: the runner
calls hooks by keyword.
"""

from __future__ import annotations

import inspect
from datetime import datetime, timedelta, timezone
from typing import Any

from prefect.deployments import run_deployment
from prefect.logging import get_logger

from blocks import load_backend, resolve_policy
from trainguard.core import policy
from trainguard.core.attempt import (
    AttemptFailed,
    AttemptSummary,
    history_records,
    lineage_tags,
    new_run_id,
    next_parameters,
)
from trainguard.core.spec import parse_spec
from trainguard.core.taxonomy import INFO, Category

logger = get_logger("trainguard.hooks")


def idempotency_key(flow_run_id: object) -> str:
    """The key that makes scheduling the attempt after `flow_run_id` happen at most once."""
    return f"next-attempt-of-{flow_run_id}"


def bound_parameters(flow: Any, passed: dict[str, Any]) -> dict[str, Any]:
    """The flow run's parameters with the flow's defaults filled in (hooks only see passed ones)."""
    defaults = {
        name: p.default
        for name, p in inspect.signature(flow.fn).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    return {**defaults, **passed}


def plan_after(
    params: dict[str, Any], flow_run: Any, state: Any
) -> tuple[AttemptSummary, policy.RetryDecision] | None:
    """What the finished attempt was and what should follow it; None when nothing can be said.

    `params` are the run's parameters with the flow's defaults filled in (`bound_parameters`).
    """
    if state.is_failed():
        data = state.result(raise_on_failure=False)
        if not isinstance(data, AttemptFailed):
            return None  # failed before an attempt existed (bad parameters, blocks): nothing to retry
        summary = data.summary
        return summary, policy.RetryDecision.from_dict(summary.decision)
    if state.is_crashed():
        return _plan_after_crash(params, flow_run, state)
    return None


def _plan_after_crash(params: dict[str, Any], flow_run: Any, state: Any) -> tuple[AttemptSummary, policy.RetryDecision]:
    spec = parse_spec(params["spec"])
    run_id = params.get("run_id") or new_run_id(spec.name, flow_run.id)
    retry_policy = resolve_policy(spec, params.get("retry_policy_block"))
    checkpoints = load_backend(params.get("backend_block")).checkpoints(run_id)
    category = Category.PREEMPTED  # the process was terminated from outside (SIGTERM, kill)
    summary = AttemptSummary(
        run_id=run_id,
        attempt=int(params.get("attempt", 1)),
        max_attempts=retry_policy.max_attempts,
        state="Crashed",
        flow_run_id=str(flow_run.id),
        flow_run_name=flow_run.name,
        category=category.value,
        retryable=INFO[category].retryable,
        rule_id="flow.crashed",
        signature=(state.message or "flow run crashed")[:300],
        remediation=INFO[category].remediation,
        fingerprint="crashed:terminated",
        resumed_from=params.get("resume_from"),
        newest_checkpoint=checkpoints[0] if checkpoints else None,
    )
    history = [*history_records(params.get("history") or []), summary.record()]
    decision = policy.decide(retry_policy, history, checkpoints)
    return summary.with_decision(decision), decision


def schedule_next_attempt(flow: Any, flow_run: Any, state: Any) -> None:
    """on_failure / on_crashed hook: schedule the next attempt as a new run of the same deployment."""
    if flow_run.deployment_id is None:
        return  # a direct call or subflow: its caller (the training-run flow) loops attempts
    params = bound_parameters(flow, dict(flow_run.parameters))
    plan = plan_after(params, flow_run, state)
    if plan is None:
        logger.info("flow run %s failed before an attempt was made; nothing to retry", flow_run.id)
        return
    summary, decision = plan
    if not decision.retry:
        logger.info("no further attempt for %s: %s", summary.run_id, decision.reason)
        return
    params = next_parameters(params, summary, decision, str(flow_run.id))
    params["spec"] = parse_spec(params["spec"]).model_dump(mode="json")
    when = datetime.now(timezone.utc) + timedelta(seconds=decision.delay_seconds)
    next_run = run_deployment(
        flow_run.deployment_id,
        parameters=params,
        scheduled_time=when,
        timeout=0,
        as_subflow=False,
        tags=lineage_tags(summary.run_id, summary.attempt + 1, str(flow_run.id)),
        idempotency_key=idempotency_key(flow_run.id),
    )
    logger.info("scheduled attempt %s of %s as flow run %s at %s: %s",
                summary.attempt + 1, summary.run_id, next_run.id, when.isoformat(), decision.reason)


__all__ = ["idempotency_key", "plan_after", "schedule_next_attempt"]
