"""Continuing a deployed training-run whose flow process died, so a scheduled retraining is not lost.

A `training-run` deployment run (`nightly-retrain`) loops its attempts as subflows inside one flow
process. When that process dies (SIGKILL, the OOM killer, a lost node) no hook runs, and the subflow
attempt it was running is left `Running` with its training unsupervised; the next cron run is a day
away. The retry controller, run for the Crashed training-run, settles that attempt the way the crash
hook settles a train-attempt run (its leftover process stopped, its evidence collected, judged
`preempted` unless it kept a verdict, the verdict kept and reported), marks it Crashed, and, when the
policy retries, schedules one new run of the same deployment that resumes the lineage through
`training_run`'s `resume`: the next attempt number, the newest checkpoint, the history so far, the
nodes to avoid and the memory factor. The idempotency key is derived from the dead run, so however
many controllers run for it, it is continued once. A run that died before its first attempt is
not started again (it would crash the same way every time); the next scheduled run stands.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from prefect import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterParentFlowRunId
from prefect.client.schemas.objects import FlowRun
from prefect.states import Crashed

from flows.attempt import train_attempt
from flows.hooks import bound_parameters, plan_after
from flows.recovery import AttemptRun
from flows.run import training_run
from flows.scheduling import schedule_run
from trainguard.core.attempt import lineage_tags, next_parameters

RUN_FLOW = "training-run"
ATTEMPT_FLOW = "train-attempt"
RESUMED = ("attempt", "resume_from", "history", "avoid_nodes", "memory_factor", "parent_flow_run_id")


def continuation_key(flow_run_id: object) -> str:
    """The key that makes continuing the training-run `flow_run_id` happen at most once."""
    return f"continuation-of-{flow_run_id}"


def last_attempt(flow_run_id: Any) -> FlowRun | None:
    """The newest train-attempt subflow run of the training-run `flow_run_id`, if it made one."""
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[ATTEMPT_FLOW])),
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])))
    return max(runs, key=lambda r: int(r.parameters.get("attempt", 1)), default=None)


def continue_run(dead: FlowRun) -> tuple[FlowRun | None, str]:
    """Settle the dead training-run's last attempt and schedule the run's continuation once.

    Returns the continuation's flow run (None when there is nothing to continue) and why.
    """
    attempt_run = last_attempt(dead.id)
    if attempt_run is None:
        return None, f"{dead.name} died before its first attempt; nothing to continue"
    run = AttemptRun(bound_parameters(train_attempt, dict(attempt_run.parameters)), attempt_run.id)
    params = run.params
    state = attempt_run.state
    if state is not None and state.is_completed():
        return None, f"attempt {params.get('attempt')} of {dead.name} succeeded before the run died: nothing to do"
    if state is None or not state.is_final():  # it died with the process that ran it
        state = Crashed(message=f"its training-run flow run {dead.name} died while it ran: {dead.state_name}")
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(attempt_run.id, state, force=True)
    plan = plan_after(run, attempt_run, state)
    if plan is None:
        return None, f"attempt {params.get('attempt')} of {dead.name} left no verdict; nothing to continue"
    summary, decision = plan
    if summary.succeeded or not decision.retry:
        return None, f"{summary.run_id} needs no further attempt: {decision.reason}"
    nxt = next_parameters(params, summary, decision, str(attempt_run.id))
    run_params = bound_parameters(training_run, dict(dead.parameters))
    run_params.update(run_id=summary.run_id, resume={key: nxt[key] for key in RESUMED if key in nxt})
    continuation = schedule_run(
        dead.deployment_id, parameters=run_params, idempotency_key=continuation_key(dead.id),
        scheduled_time=datetime.now(timezone.utc) + timedelta(seconds=decision.delay_seconds),
        tags=lineage_tags(summary.run_id, summary.attempt + 1, str(dead.id)),
        job_variables=dict(dead.job_variables or {}) or None,
    )
    why = f"{summary.run_id} continues as flow run {continuation.id} from attempt {summary.attempt + 1}"
    return continuation, f"{why}: {decision.reason}"
