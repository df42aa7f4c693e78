"""The retry controller: the safety net for attempts whose flow process died where no hook ran.

Prefect runs no state hook when an engine is OOM-killed, when a node is lost under the Kubernetes
worker, or when a plain process gets SIGKILL. The automations `trainguard setup` creates run this
flow's deployment for every train-attempt run that ends Crashed or Failed, and the zombie
automation first marks a run Crashed when its heartbeats stop. The controller reads the dead run
(parameters, state, the verdict and evidence it kept), stops what it left running, collects its
evidence through the backend's own collector, and calls the hooks' own scheduling function with the
same idempotency key: hook and controller together schedule at most one next attempt.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from prefect import flow, get_client, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import FlowRun
from prefect.exceptions import ObjectNotFound
from prefect.states import Completed, Failed, State

from flows.attempt import train_attempt
from flows.hooks import bound_parameters, carry_on
from flows.recovery import kept_verdict
from trainguard.core.attempt import new_run_id
from trainguard.core.spec import parse_spec

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
    params = bound_parameters(train_attempt, dict(run.parameters))
    run_id = params.get("run_id") or new_run_id(parse_spec(params["spec"]).name, run.id)
    known = kept_verdict(params, str(run_id))
    next_run = carry_on(params, run, run.state, known)
    return str(next_run.id) if next_run is not None else None


@flow(name="retry-controller", flow_run_name="after-{flow_run_id}")
def retry_controller(flow_run_id: str) -> dict[str, Any] | State:
    """See the module docstring: recover a dead train-attempt run and schedule what follows it once.

    Args:
        flow_run_id: the id of the train-attempt flow run that ended Crashed or Failed.
    """
    logger = get_run_logger()
    found = read_attempt_run(flow_run_id)
    if found is None:
        return Failed(message=f"flow_run_id {flow_run_id}: no such flow run; pass a train-attempt run's id")
    run, flow_name = found
    state = run.state
    if flow_name != ATTEMPT_FLOW or run.deployment_id is None:
        return Completed(message=f"{run.name} is not a deployed {ATTEMPT_FLOW} run; its caller retries it")
    if state is None or not (state.is_crashed() or state.is_failed()):
        return Completed(message=f"{run.name} is {state.name if state else 'without a state'}; nothing to recover")
    logger.info("%s ended %s: %s", run.name, state.name, state.message)
    successor = carry_on_after(flow_run_id)
    verdict = f"next attempt is flow run {successor}" if successor else "no next attempt"
    return {"flow_run_id": flow_run_id, "state": state.name, "next_flow_run_id": successor, "verdict": verdict}
