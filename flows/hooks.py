"""State hooks that carry out the attempt flow's retry decision by scheduling the next attempt.

The decision itself is made in the flow (it lands in the Failed state's data and in the verdict kept
with the evidence); the hook only executes it. For a Crashed attempt (SIGTERM, the process killed)
there is no verdict, so what the attempt left is recovered first (its leftover process stopped, its
evidence collected: `recovery`) and the same policy is asked with the attempt recorded as
preempted. `carry_on` is the one scheduling function: the hooks and the retry controller
(`flows.controller`) all call it, and it schedules through `run_deployment` with an idempotency key
derived from the finished run, so however many of them fire, one next attempt exists. Hook
parameter names must be exactly `flow, flow_run, state`: the runner calls hooks by keyword.
"""

from __future__ import annotations

import inspect
from datetime import datetime, timedelta, timezone
from typing import Any

from prefect import get_client
from prefect.logging import get_logger
from prefect.states import Crashed

from blocks import backend_reference, load_backend, resolve_policy
from flows import events, recovery
from flows.scheduling import schedule_run
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
    params: dict[str, Any], flow_run: Any, state: Any, known: AttemptSummary | None = None
) -> tuple[AttemptSummary, policy.RetryDecision] | None:
    """What the finished attempt was and what should follow it; None when nothing can be said.

    Args:
        params: the run's parameters with the flow's defaults filled in (`bound_parameters`).
        flow_run: the attempt's flow run.
        state: its final state.
        known: the attempt's own verdict, when it reached one (the Failed state's data, or the
            verdict kept with its evidence); otherwise a Crashed attempt is judged here.
    """
    if known is None and state.is_crashed():
        run_id = _run_id(params, flow_run)
        with recovery.attempt_lock(run_id, int(params.get("attempt", 1))):  # a hook and the controller at once
            # it may have judged itself before the process died, or another recovery just did
            known = recovery.kept_verdict(params, run_id)
            if known is None:
                return _plan_after_crash(params, flow_run, state)
    if known is not None:
        return known, policy.RetryDecision.from_dict(known.decision)
    return None  # failed before an attempt existed (bad parameters, blocks): nothing to retry


def _run_id(params: dict[str, Any], flow_run: Any) -> str:
    return str(params.get("run_id") or new_run_id(parse_spec(params["spec"]).name, flow_run.id))


def _plan_after_crash(params: dict[str, Any], flow_run: Any, state: Any) -> tuple[AttemptSummary, policy.RetryDecision]:
    spec = parse_spec(params["spec"])
    run_id = _run_id(params, flow_run)
    why = (state.message or "flow run crashed")[:300]
    found = recovery.recover_attempt(params, run_id, why)
    retry_policy = resolve_policy(spec, params.get("retry_policy_block"))
    checkpoints = load_backend(backend_reference(params.get("backend_block"), spec)).checkpoints(run_id)
    category = Category.PREEMPTED  # the process was terminated from outside (SIGTERM, kill)
    summary = AttemptSummary(
        run_id=run_id, attempt=int(params.get("attempt", 1)), max_attempts=retry_policy.max_attempts,
        state="Crashed", flow_run_id=str(flow_run.id), flow_run_name=flow_run.name,
        category=category.value, retryable=INFO[category].retryable, rule_id="flow.crashed",
        signature=why, remediation=INFO[category].remediation, fingerprint="crashed:terminated",
        duration_seconds=_run_seconds(flow_run), gpus=spec.total_gpus,
        resumed_from=params.get("resume_from"), newest_checkpoint=checkpoints[0] if checkpoints else None,
        evidence=found.get("location"), evidence_items=found.get("items", 0), evidence_missing=found.get("missing", 0),
        progress=found.get("progress", ()),
    )
    history = [*history_records(params.get("history") or []), summary.record()]
    summary = summary.with_decision(policy.decide_retry(retry_policy, history, checkpoints))
    recovery.keep_verdict(params, summary)
    recovery.publish_report([*(AttemptSummary.from_dict(h) for h in params.get("history") or []), summary])
    events.report_attempt(summary)
    return summary, policy.RetryDecision.from_dict(summary.decision)


def _run_seconds(flow_run: Any) -> float:
    """How long the dead attempt held its resources, as far as the API knows."""
    start = getattr(flow_run, "start_time", None)
    if start is None:
        return 0.0
    end = getattr(flow_run, "end_time", None) or datetime.now(timezone.utc)
    return max(0.0, float((end - start).total_seconds()))


RESCHEDULED = ("its flow process was stopped and Prefect started the same flow run again "
               "(PREFECT_FLOW_RUN_EXECUTE_SIGTERM_BEHAVIOR=reschedule, e.g. an evicted flow pod)")


def settle_lost_attempt(flow: Any, flow_run_id: Any) -> tuple[AttemptSummary, policy.RetryDecision]:
    """Judge the attempt that a rescheduled flow run lost; the run then ends with that verdict.

    Prefect's Kubernetes worker reschedules the *same* flow run when its pod gets SIGTERM (eviction,
    preemption), and the run starts again with the parameters it was created with. Running the
    attempt again under its old number, from its old checkpoint, into its own evidence would be
    wrong; continuing the run as the next attempt would race the failure hook and the retry
    controller, which schedule that attempt as a run of its own. So the started-again run only
    settles the lost attempt, the way the crash hook judges a killed one (its kept verdict, else
    preempted, with its evidence and leftovers seen to), and ends with it. Its failure hook then
    schedules the next attempt with the one idempotency key every scheduler of it uses
    (`idempotency_key`), so however the engine, the hook and the controller interleave, one exists.
    """
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(flow_run_id)
    params = bound_parameters(flow, dict(flow_run.parameters))
    plan = plan_after(params, flow_run, Crashed(message=RESCHEDULED))
    assert plan is not None  # a Crashed state is always judged
    lost, decision = plan
    logger.warning("%s attempt %s was lost: %s; %s", lost.run_id, lost.attempt, RESCHEDULED, decision.reason)
    return lost, decision


def schedule_next_attempt(flow: Any, flow_run: Any, state: Any) -> None:
    """on_failure / on_crashed hook: schedule the next attempt as a new run of the same deployment."""
    if flow_run.deployment_id is None:
        return  # a direct call or subflow: its caller (the training-run flow) loops attempts
    params = bound_parameters(flow, dict(flow_run.parameters))
    data = state.result(raise_on_failure=False) if state.is_failed() else None
    carry_on(params, flow_run, state, data.summary if isinstance(data, AttemptFailed) else None)


def carry_on(params: dict[str, Any], flow_run: Any, state: Any, known: AttemptSummary | None) -> Any | None:
    """Decide what follows a finished attempt and schedule it, at most once whoever calls.

    The crash hook, the failure hook and the retry controller all end here. The next attempt is a
    new run of the same deployment, created with the idempotency key of the finished run, so however
    many of them get here, one next attempt exists. Returns that flow run, or None.
    """
    plan = plan_after(params, flow_run, state, known)
    if plan is None:
        logger.info("flow run %s failed before an attempt was made; nothing to retry", flow_run.id)
        return None
    summary, decision = plan
    if not decision.retry:
        logger.info("no further attempt for %s: %s", summary.run_id, decision.reason)
        return None
    params = next_parameters(params, summary, decision, str(flow_run.id))
    params["spec"] = parse_spec(params["spec"]).model_dump(mode="json")
    when = datetime.now(timezone.utc) + timedelta(seconds=decision.delay_seconds)
    next_run = schedule_run(
        flow_run.deployment_id,
        parameters=params,
        scheduled_time=when,
        tags=lineage_tags(summary.run_id, summary.attempt + 1, str(flow_run.id)),
        idempotency_key=idempotency_key(flow_run.id),
        # What the run was started with on its work pool (image, env, resources of the flow pod)
        # holds for every attempt, not only the first.
        job_variables=dict(getattr(flow_run, "job_variables", None) or {}) or None,
    )
    logger.info("attempt %s of %s is flow run %s, at %s: %s",
                summary.attempt + 1, summary.run_id, next_run.id, when.isoformat(), decision.reason)
    return next_run


__all__ = ["bound_parameters", "carry_on", "idempotency_key", "plan_after", "schedule_next_attempt", "settle_lost_attempt"]
