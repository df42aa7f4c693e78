"""The report tasks: publish an attempt's report, the run's report and its attempts table.

Each artifact is created through the API on the attempt's own flow run, so the retry controller
and the CLI, which publish a recovered attempt's report outside any flow or task run, publish it
the way the attempt flow does, and it shows on the dead attempt's run in the UI. (Prefect's
``create_*_artifact`` outside a run is deprecated, and would leave the artifact on no run.)
"""

from __future__ import annotations

import json
import uuid

from prefect import get_client, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.actions import ArtifactCreate
from prefect.utilities.context import get_task_and_flow_run_ids

from trainguard.core.reports import attempt as attempt_report, run as run_report
from trainguard.core.attempt import AttemptSummary


def artifact_key(run_id: str) -> str:
    """The run's artifact key prefix (artifact keys are lowercase letters, digits and dashes)."""
    return run_id.lower().replace("_", "-").replace(".", "-")


def publish_run_report(summaries: list[AttemptSummary], on: str | None = None) -> None:
    """The run's report (timeline and progress chart), one Markdown artifact keyed by run, on flow run ``on``
    (by default the newest attempt's)."""
    last = summaries[-1]
    _publish(on or last.flow_run_id, "markdown", f"{artifact_key(last.run_id)}-report",
             run_report.render_run(summaries), f"trainguard run {last.run_id}: timeline of attempts")


def publish_attempt(summary: AttemptSummary, earlier: list[AttemptSummary]) -> None:
    """The run's report, one Markdown artifact per attempt and one table of all attempts, keyed by run, on the
    attempt's own flow run: what the attempt flow publishes, and the recovery of an attempt whose flow died."""
    key, on = artifact_key(summary.run_id), summary.flow_run_id
    publish_run_report([*earlier, summary])
    _publish(on, "markdown", f"{key}-attempt-{summary.attempt}", attempt_report.render_attempt(summary, earlier),
             f"trainguard attempt {summary.attempt} of {summary.run_id}")
    table = [attempt_report.table_row(s) for s in [*earlier, summary]]
    _publish(on, "table", f"{key}-attempts", json.dumps(table), f"All attempts of trainguard run {summary.run_id}")


@task(name="publish_report", cache_policy=NO_CACHE)
def publish_report(summary: AttemptSummary, earlier: list[AttemptSummary]) -> None:
    """`publish_attempt` as the attempt flow's step."""
    publish_attempt(summary, earlier)


def _publish(flow_run_id: str | None, kind: str, key: str, data: str, description: str) -> None:
    """One artifact on that flow run (and on the task run publishing it, inside one)."""
    task_run_id, _ = get_task_and_flow_run_ids()
    with get_client(sync_client=True) as client:
        client.create_artifact(ArtifactCreate(type=kind, key=key, data=data, description=description,
                                              flow_run_id=_uuid(flow_run_id), task_run_id=task_run_id))


def _uuid(value: str | None) -> uuid.UUID | None:
    try:
        return uuid.UUID(value) if value else None
    except ValueError:
        return None
