"""The retry controller: the safety net for runs whose flow process died where no hook ran.

Prefect runs no state hook when an engine is OOM-killed, when a node is lost under the Kubernetes
worker, or when a plain process gets SIGKILL. The automations `trainguard setup` creates run this
flow's deployment for every deployed train-attempt run that ends Crashed or Failed and every
deployed training-run that ends Crashed; the zombie automation first marks a run Crashed when its
heartbeats stop.

For a train-attempt run, the controller reads the dead run (its parameters and state, and the
verdict the attempt kept beside its evidence: the machine-readable form of what its report artifact
shows, so the artifact itself is not parsed), stops what it left running, collects its evidence
through the backend's own collector, and calls the hooks' own scheduling function with the same
idempotency key: hook and controller together schedule at most one next attempt. For a training-run,
it settles the attempt that run was running and continues the run from its checkpoint
(`flows.continuation`).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from prefect import flow, get_client, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import FlowRun
from prefect.exceptions import ObjectNotFound
from prefect.client.schemas.objects import State
from prefect.states import Completed, Failed

from flows.attempt import train_attempt
from flows.continuation import RUN_FLOW, continue_run
from flows.hooks import bound_parameters, carry_on
from flows.recovery import AttemptRun

ATTEMPT_FLOW = "train-attempt"


def read_attempt_run(flow_run_id: str) -> tuple[FlowRun, str] | None:
    """The flow run and its flow's name, or None when there is no such run (or no run id)."""
    with get_client(sync_client=True) as client:
        try:
            run = client.read_flow_run(UUID(flow_run_id))
        except (ObjectNotFound, ValueError):
            return None
        return run, client.read_flow(run.flow_id).name


@task(name="carry_on_after_attempt", cache_policy=NO_CACHE)
def carry_on_after(flow_run_id: str) -> str | None:
    """Recover the dead attempt and schedule its successor once; the successor's flow run id."""
    with get_client(sync_client=True) as client:  # a FlowRun cannot be a task argument: read it here
        run = client.read_flow_run(UUID(flow_run_id))
    dead = AttemptRun(bound_parameters(train_attempt, dict(run.parameters)), run.id)
    next_run = carry_on(dead, run, run.state, None)
    if next_run is not None:
        get_run_logger().info("%s attempt %s: the next attempt is flow run %s (%s)", dead.run_id, dead.attempt,
                              next_run.id, next_run.name)
    return str(next_run.id) if next_run is not None else None


@task(name="continue_training_run", cache_policy=NO_CACHE)
def continue_after(flow_run_id: str) -> str | None:
    """Settle the dead training-run's attempt and schedule its continuation once; its flow run id."""
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(UUID(flow_run_id))
    continuation, why = continue_run(run)
    get_run_logger().info("%s", why)
    return str(continuation.id) if continuation is not None else None


@flow(name="retry-controller", flow_run_name="after-{flow_run_id}")
def retry_controller(flow_run_id: str) -> dict[str, Any] | State:
    """See the module docstring: recover a dead run and schedule what follows it once.

    Args:
        flow_run_id: the id of the train-attempt run that ended Crashed or Failed, or of the
            training-run that ended Crashed.
    """
    logger = get_run_logger()
    found = read_attempt_run(flow_run_id)
    if found is None:
        return Failed(message=f"flow_run_id {flow_run_id}: no such flow run; pass a train-attempt run's id")
    run, flow_name = found
    state = run.state
    if flow_name not in (ATTEMPT_FLOW, RUN_FLOW) or run.deployment_id is None:
        return Completed(message=f"{run.name} is not a deployed {ATTEMPT_FLOW} or {RUN_FLOW} run; "
                                 "the flow run that called it retries it")
    if state is None or not (state.is_crashed() or state.is_failed()):
        return Completed(message=f"{run.name} is {state.name if state else 'without a state'}; nothing to recover")
    if flow_name == RUN_FLOW and not state.is_crashed():
        return Completed(message=f"{run.name} ended {state.name} by its own retry policy; nothing to recover")
    logger.info("%s ended %s: %s", run.name, state.name, state.message)
    successor = carry_on_after(flow_run_id) if flow_name == ATTEMPT_FLOW else continue_after(flow_run_id)
    what = "next attempt is" if flow_name == ATTEMPT_FLOW else "the run continues as"
    verdict = f"{what} flow run {successor}" if successor else "no next attempt"
    return {"flow_run_id": flow_run_id, "state": state.name, "next_flow_run_id": successor, "verdict": verdict}
