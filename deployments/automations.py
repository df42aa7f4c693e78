"""The automations that make dead attempts impossible to miss, built with Prefect's client API.

Three automations, all on `train-attempt` flow runs (matched through the flow as a related resource):

- a run that ends **Crashed** runs the retry-controller deployment for it;
- a run that ends **Failed** runs it too: its hook normally schedules the successor first and the
  controller then finds it (the idempotency key makes the second call a no-op), but when the hook's
  process died the controller is the one that schedules it;
- a run whose **heartbeats stop** (a zombie: the node or the process is gone and nothing reported
  it) is marked Crashed, the automation Prefect documents for zombie flows, which then fires the first.

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
CRASHED = "trainguard: recover crashed attempts"
FAILED = "trainguard: make sure failed attempts have their successor"
ZOMBIE = "trainguard: mark attempts without heartbeats crashed"
FINAL_EVENTS = {f"prefect.flow-run.{name}" for name in ("Completed", "Failed", "Cancelled", "Crashed")}


def _attempt_runs() -> dict[str, object]:
    return {
        "match": ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
        "match_related": ResourceSpecification({"prefect.resource.role": "flow", "prefect.resource.name": ATTEMPT_FLOW}),
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
            name=CRASHED, description="Runs the retry controller for a train-attempt run that ended Crashed.",
            trigger=EventTrigger(expect={"prefect.flow-run.Crashed"}, posture=Posture.Reactive, threshold=1,
                                 **_attempt_runs()),
            actions=[_run_controller(controller_id)],
        ),
        AutomationCore(
            name=FAILED, description="Runs the retry controller for a train-attempt run that ended Failed; "
            "it schedules the next attempt only if the run's own hook did not.",
            trigger=EventTrigger(expect={"prefect.flow-run.Failed"}, posture=Posture.Reactive, threshold=1,
                                 **_attempt_runs()),
            actions=[_run_controller(controller_id)],
        ),
        AutomationCore(
            name=ZOMBIE, description=f"Marks a train-attempt run Crashed after {silence.total_seconds():g} s "
            "without a heartbeat, so the crash automation recovers it.",
            trigger=EventTrigger(
                after={"prefect.flow-run.heartbeat"}, expect={"prefect.flow-run.heartbeat", *FINAL_EVENTS},
                for_each={"prefect.resource.id"}, posture=Posture.Proactive, threshold=1, within=silence,
                **_attempt_runs(),
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
