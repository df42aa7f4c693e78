"""The automations that make dead attempts impossible to miss, built with Prefect's client API.

Three automations, on flow runs of a deployment (matched through the flow and the deployment as
related resources: an attempt that runs as a subflow of a training-run has no deployment, and its
training-run judges and retries it itself):

- a `train-attempt` or `training-run` run that ends **Crashed** runs the retry-controller deployment
  for it (for a training-run, the controller settles the attempt it was running and continues the
  run from its checkpoint: `flows.continuation`);
- a `train-attempt` run that ends **Failed** runs it too: its hook normally schedules the successor
  first and the controller then finds it (the idempotency key makes the second call a no-op), but
  when the hook's process died the controller is the one that schedules it. A training-run that
  ends Failed gave up by its own policy: nothing to do;
- a run of either whose **heartbeats stop** (a zombie: the node or the process is gone and nothing
  reported it) is marked Crashed, the automation Prefect documents for zombie flows, which then
  fires the first.

The controller's parameter is templated from the triggering run: `{{ flow_run.id | string }}`.
Automations are identified by name, so creating them again replaces them (`trainguard setup`).
"""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

from prefect.automations import AutomationCore, EventTrigger, Posture, ResourceSpecification
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState, RunDeployment

ATTEMPT_FLOW = "train-attempt"
RUN_FLOW = "training-run"
CRASHED = "trainguard: recover crashed attempts"
FAILED = "trainguard: make sure failed attempts have their successor"
ZOMBIE = "trainguard: mark attempts without heartbeats crashed"


def _deployed_runs(*flows: str) -> dict[str, object]:
    """Flow runs of these flows that a deployment made (every related resource spec must match)."""
    return {
        "match": ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
        "match_related": [
            ResourceSpecification({"prefect.resource.role": "flow", "prefect.resource.name": list(flows)}),
            ResourceSpecification({"prefect.resource.role": "deployment"}),
        ],
    }


def _run_controller(controller_id: UUID) -> RunDeployment:
    return RunDeployment(source="selected", deployment_id=controller_id,
                         parameters={"flow_run_id": "{{ flow_run.id | string }}"})


def automations(controller_id: UUID, heartbeat_seconds: int) -> list[AutomationCore]:
    """The three automations, for the controller deployment `controller_id`.

    Args:
        controller_id: The retry-controller deployment's id.
        heartbeat_seconds: The flows' heartbeat period (PREFECT_FLOWS_HEARTBEAT_FREQUENCY); a run is
            a zombie after three missed heartbeats.
    """
    silence = timedelta(seconds=3 * heartbeat_seconds)
    return [
        AutomationCore(
            name=CRASHED, description="Runs the retry controller for a deployed train-attempt or training-run "
            "run that ended Crashed.",
            trigger=EventTrigger(expect={"prefect.flow-run.Crashed"}, posture=Posture.Reactive, threshold=1,
                                 **_deployed_runs(ATTEMPT_FLOW, RUN_FLOW)),
            actions=[_run_controller(controller_id)],
        ),
        AutomationCore(
            name=FAILED, description="Runs the retry controller for a train-attempt run that ended Failed; "
            "it schedules the next attempt only if the run's own hook did not.",
            trigger=EventTrigger(expect={"prefect.flow-run.Failed"}, posture=Posture.Reactive, threshold=1,
                                 **_deployed_runs(ATTEMPT_FLOW)),
            actions=[_run_controller(controller_id)],
        ),
        AutomationCore(
            name=ZOMBIE,
            description=f"Marks a train-attempt or training-run run Crashed after {silence.total_seconds():g} s "
            "without a heartbeat, so the crash automation recovers it.",
            trigger=EventTrigger(
                # any event of the run counts as a sign of life, as in Prefect's documented automation: a
                # final state under a custom name (Completed(name=...)) must not be taken for silence
                after={"prefect.flow-run.heartbeat"}, expect={"prefect.flow-run.*"},
                for_each={"prefect.resource.id"}, posture=Posture.Proactive, threshold=1, within=silence,
                **_deployed_runs(ATTEMPT_FLOW, RUN_FLOW),
            ),
            actions=[ChangeFlowRunState(state=StateType.CRASHED, name="Crashed",
                                        message=f"no heartbeat for {silence.total_seconds():g} s: the flow process is gone")],
        ),
    ]


def ensure_automations(client: SyncPrefectClient, wanted: list[AutomationCore]) -> list[tuple[str, UUID, str]]:
    """Create each automation, or replace the one of the same name; (name, id, 'created'|'updated')."""
    done = []
    for automation in wanted:
        existing = client.read_automations_by_name(automation.name)
        if existing:
            client.update_automation(existing[0].id, automation)
            for extra in existing[1:]:  # duplicates someone made by hand would fire the controller twice
                client.delete_automation(extra.id)
            done.append((automation.name, existing[0].id, "updated"))
        else:
            done.append((automation.name, client.create_automation(automation), "created"))
    return done
