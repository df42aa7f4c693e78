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

from flows import recovery
from flows.scheduling import schedule_run
from trainguard.core import policy
from trainguard.core.attempt import AttemptFailed, AttemptSummary, lineage_tags, next_parameters

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
    run: recovery.AttemptRun, flow_run: Any, state: Any, known: AttemptSummary | None = None
) -> tuple[AttemptSummary, policy.RetryDecision] | None:
    """What the finished attempt was and what should follow it; None when nothing can be said.

    Args:
        run: the attempt's flow run parameters, read once (`recovery.AttemptRun`).
        flow_run: the attempt's flow run.
        state: its final state.
        known: the attempt's own verdict when the caller has it at hand (the Failed state's data);
            otherwise it is found as every caller finds it (`recovery.verdict_of`).
    """
    known = known or recovery.verdict_of(run, flow_run, state)
    if known is not None:
        return known, known.decision or policy.RetryDecision(retry=False, reason="")
    return None  # failed before an attempt existed (bad parameters, blocks): nothing to retry


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
    run = recovery.AttemptRun(bound_parameters(flow, dict(flow_run.parameters)), flow_run.id)
    plan = plan_after(run, flow_run, Crashed(message=RESCHEDULED))
    assert plan is not None  # a Crashed state is always judged
    lost, decision = plan
    logger.warning("%s attempt %s was lost: %s; %s", lost.run_id, lost.attempt, RESCHEDULED, decision.reason)
    return lost, decision


def schedule_next_attempt(flow: Any, flow_run: Any, state: Any) -> None:
    """on_failure / on_crashed hook: schedule the next attempt as a new run of the same deployment."""
    if flow_run.deployment_id is None:
        return  # a direct call or subflow: its caller (the training-run flow) loops attempts
    run = recovery.AttemptRun(bound_parameters(flow, dict(flow_run.parameters)), flow_run.id)
    data = state.result(raise_on_failure=False) if state.is_failed() else None
    carry_on(run, flow_run, state, data.summary if isinstance(data, AttemptFailed) else None)


def keep_cancelled_verdict(flow: Any, flow_run: Any, state: Any) -> None:
    """on_cancellation hook: a person cancelled the attempt (the UI's Cancel, `prefect flow-run cancel`).

    Its flow was stopped mid-attempt (its evidence collected in the flow's `finally` when training had
    begun), so no verdict was kept: it is kept here as `user_cancelled`, which is never retried, and
    what the attempt left running is stopped. Nothing is scheduled: a cancel is a person's decision.
    """
    run = recovery.AttemptRun(bound_parameters(flow, dict(flow_run.parameters)), flow_run.id)
    # the worker's hook and the flow's may both get here: the second finds the first one's verdict
    summary = recovery.recover_cancelled(run, flow_run, (state.message or "flow run cancelled")[:300])
    logger.info("%s attempt %s was cancelled; its verdict: %s (%s); not retried",
                run.run_id, run.attempt, summary.category, summary.signature)


def carry_on(run: recovery.AttemptRun, flow_run: Any, state: Any, known: AttemptSummary | None) -> Any | None:
    """Decide what follows a finished attempt and schedule it, at most once whoever calls.

    The crash hook, the failure hook and the retry controller all end here. The next attempt is a
    new run of the same deployment, created with the idempotency key of the finished run, so however
    many of them get here, one next attempt exists. Returns that flow run, or None.
    """
    plan = plan_after(run, flow_run, state, known)
    if plan is None:
        logger.info("flow run %s failed before an attempt was made; nothing to retry", flow_run.id)
        return None
    summary, decision = plan
    if not decision.retry:
        logger.info("no further attempt for %s: %s", summary.run_id, decision.reason)
        return None
    params = next_parameters(run.params, summary, decision, str(flow_run.id))
    params["spec"] = run.spec.model_dump(mode="json")
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
